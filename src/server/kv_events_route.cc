#include "server/kv_events_route.h"

#include <algorithm>
#include <charconv>
#include <optional>
#include <string>

#include "engine/kv_event_json.h"

namespace beluga::server {

namespace {

// The value of `name` in the query string of `target` (no percent-decoding: the values are hex and
// digits).
std::optional<std::string_view> query_param(std::string_view target, std::string_view name) {
  const size_t q = target.find('?');
  if (q == std::string_view::npos) return std::nullopt;
  std::string_view rest = target.substr(q + 1);
  while (!rest.empty()) {
    const size_t amp = rest.find('&');
    const std::string_view pair = rest.substr(0, amp);
    const size_t eq = pair.find('=');
    if (pair.substr(0, eq) == name)
      return eq == std::string_view::npos ? std::string_view() : pair.substr(eq + 1);
    if (amp == std::string_view::npos) break;
    rest = rest.substr(amp + 1);
  }
  return std::nullopt;
}

std::optional<uint64_t> parse_u64(std::string_view s, int base) {
  uint64_t v = 0;
  auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), v, base);
  if (s.empty() || ec != std::errc() || p != s.data() + s.size()) return std::nullopt;
  return v;
}

UtilityReply error(int status, const std::string& message) {
  return {status, "application/json",
          R"({"error":{"message":")" + message + R"(","type":"invalid_request_error","code":)" +
              std::to_string(status) + "}}"};
}

}  // namespace

UtilityReply handle_kv_events_route(std::string_view target, std::string_view method, const KvEventLog* log,
                                    bool ready) {
  if (method != "GET") return error(405, "use GET for /v1/kv/events");
  if (!ready) return error(503, "the model is loading");
  if (!log) return error(404, "this replica publishes no KV block events (--kv-events-ring 0)");
  uint64_t epoch = 0, after = 0, max = 4096;
  if (auto v = query_param(target, "epoch"); v && !v->empty()) {
    auto e = parse_u64(*v, 16);
    if (!e) return error(400, "epoch must be hex digits");
    epoch = *e;
  }
  if (auto v = query_param(target, "after")) {
    auto a = parse_u64(*v, 10);
    if (!a) return error(400, "after must be a non-negative integer");
    after = *a;
  }
  if (auto v = query_param(target, "max")) {
    auto m = parse_u64(*v, 10);
    if (!m || *m == 0) return error(400, "max must be a positive integer");
    max = std::min<uint64_t>(*m, 65536);
  }
  return {200, "application/json", kv_event_page_json(log->read(epoch, after, size_t(max)))};
}

}  // namespace beluga::server
