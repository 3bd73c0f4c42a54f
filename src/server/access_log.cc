#include "server/access_log.h"

#include <cstdio>

namespace beluga::server {

namespace {

// Printable ASCII only: a path is client-controlled and must not forge log lines or escape codes.
void append_clean(std::string& out, std::string_view s) {
  if (s.empty()) return out.push_back('-');
  for (unsigned char c : s) {
    if (c >= 0x21 && c < 0x7f && c != '"' && c != '\\') {
      out.push_back(char(c));
    } else {
      char buf[8];
      std::snprintf(buf, sizeof(buf), "\\x%02x", c);
      out += buf;
    }
  }
}

}  // namespace

std::string format_access_line(const AccessRecord& r) {
  std::string s = "access: ";
  append_clean(s, r.client);
  s += " \"";
  append_clean(s, r.method);
  s += ' ';
  append_clean(s, r.path);
  s += "\" " + std::to_string(r.status);
  if (r.prompt_tokens >= 0) s += " prompt_tokens=" + std::to_string(r.prompt_tokens);
  if (r.completion_tokens >= 0) s += " completion_tokens=" + std::to_string(r.completion_tokens);
  char buf[64];
  if (r.ttft_s) {
    std::snprintf(buf, sizeof(buf), " ttft=%.3fs", *r.ttft_s);
    s += buf;
  }
  std::snprintf(buf, sizeof(buf), " time=%.3fs\n", r.duration_s);
  s += buf;
  return s;
}

void write_access_line(const AccessRecord& r) {
  const std::string line = format_access_line(r);
  std::fwrite(line.data(), 1, line.size(), stderr);
}

}  // namespace beluga::server
