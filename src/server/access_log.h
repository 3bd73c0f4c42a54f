// The access log: one line per answered HTTP request, on stderr (`beluga serve --no-access-log` turns
// it off), e.g.
//   access: 127.0.0.1 "POST /v1/chat/completions" 200 prompt_tokens=26 completion_tokens=48 ttft=0.031s
//   time=0.412s
// Token counts and time to first token appear for generation requests only; status 499 is a client
// that went away mid-generation. The query string is left out (it may carry secrets).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace beluga::server {

struct AccessRecord {
  std::string_view client;  // peer address ("-" when unknown)
  std::string_view method;
  std::string_view path;
  int status = 0;
  int64_t prompt_tokens = -1;  // -1: not a generation
  int64_t completion_tokens = -1;
  std::optional<double> ttft_s;
  double duration_s = 0;
};

std::string format_access_line(const AccessRecord& r);  // with the trailing newline
// Writes the line with one call, so the lines of concurrent requests never interleave.
void write_access_line(const AccessRecord& r);

}  // namespace beluga::server
