// Server-sent events framing and small helpers shared by the API formatters: JSON dumping that
// never throws on bad UTF-8, request/item ids, wall-clock seconds.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

namespace beluga::server {

// JSON text; invalid UTF-8 (which should never reach here) is replaced rather than thrown on.
std::string dump_json(const nlohmann::ordered_json& j);

// `data: {json}\n\n` (Chat Completions / Completions frames have no event line).
std::string sse_data(const nlohmann::ordered_json& j);
// `event: {type}\ndata: {json}\n\n` (Responses and Anthropic Messages).
std::string sse_event(std::string_view type, const nlohmann::ordered_json& j);
inline constexpr std::string_view kSseDone = "data: [DONE]\n\n";

// `prefix` + 24 random alphanumerics (e.g. "chatcmpl-…", "call_…", "toolu_…").
std::string random_id(std::string_view prefix, size_t len = 24);
int64_t unix_seconds();

// HTTP/1.1 chunked transfer-coding of one chunk (empty data: the last chunk).
std::string http_chunk(std::string_view data);

}  // namespace beluga::server
