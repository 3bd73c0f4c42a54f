#include "router/bucket.h"

#include <algorithm>
#include <charconv>
#include <limits>

#include "util/error.h"

namespace beluga::router {

namespace {

int64_t parse_tokens(std::string_view s, std::string_view whole) {
  if (s == "inf" || s == "max") return std::numeric_limits<int64_t>::max();
  int64_t scale = 1;
  if (!s.empty() && (s.back() == 'K' || s.back() == 'k')) scale = 1024;
  if (!s.empty() && (s.back() == 'M' || s.back() == 'm')) scale = 1024 * 1024;
  if (scale != 1) s.remove_suffix(1);
  int64_t v = 0;
  auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  BELUGA_CHECK(!s.empty() && ec == std::errc() && p == s.data() + s.size() && v > 0, "--bucket ", whole,
               ": MAX must be a positive token count (16K, 65536, inf)");
  return v * scale;
}

}  // namespace

BucketSpec parse_bucket(std::string_view text) {
  const size_t colon = text.find(':'), eq = text.find('=');
  BELUGA_CHECK(colon != std::string_view::npos && eq != std::string_view::npos && colon > 0 && colon < eq,
               "--bucket ", text, ": expected NAME:MAX=URL,URL (e.g. short:16K=http://h:8001)");
  BucketSpec b;
  b.name = std::string(text.substr(0, colon));
  b.max_tokens = parse_tokens(text.substr(colon + 1, eq - colon - 1), text);
  std::string_view urls = text.substr(eq + 1);
  while (!urls.empty()) {
    const size_t comma = urls.find(',');
    const std::string_view u = urls.substr(0, comma);
    if (!u.empty()) b.urls.emplace_back(u);
    if (comma == std::string_view::npos) break;
    urls = urls.substr(comma + 1);
  }
  BELUGA_CHECK(!b.urls.empty(), "--bucket ", text, ": no replica URL");
  return b;
}

void Buckets::add(std::string name, int64_t max_tokens, uint64_t members) {
  for (const auto& b : buckets_) BELUGA_CHECK(b.name != name, "--bucket ", name, " is declared twice");
  buckets_.push_back({std::move(name), max_tokens, members});
  std::stable_sort(buckets_.begin(), buckets_.end(),
                   [](const Bucket& a, const Bucket& b) { return a.max_tokens < b.max_tokens; });
}

size_t Buckets::find(int64_t tokens) const {
  for (size_t i = 0; i < buckets_.size(); ++i)
    if (tokens <= buckets_[i].max_tokens) return i;
  return buckets_.size() - 1;
}

void keep_bucket(const Buckets& buckets, int64_t tokens, std::vector<Candidate>& candidates) {
  if (buckets.empty()) return;
  const uint64_t members = buckets.members(buckets.find(tokens));
  auto in = [members](const Candidate& c) { return (members >> c.replica & 1) != 0; };
  if (std::none_of(candidates.begin(), candidates.end(), in)) return;
  std::erase_if(candidates, [&](const Candidate& c) { return !in(c); });
}

}  // namespace beluga::router
