#include "engine/kv_event_json.h"

#include <charconv>
#include <cstdio>

#include <nlohmann/json.hpp>

namespace beluga {

namespace {

std::string hex64(uint64_t v) {
  char buf[17];
  std::snprintf(buf, sizeof(buf), "%016llx", static_cast<unsigned long long>(v));
  return buf;
}

std::optional<uint64_t> parse_hex64(std::string_view s) {
  if (s.empty() || s.size() > 16) return std::nullopt;
  uint64_t v = 0;
  auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), v, 16);
  if (ec != std::errc() || p != s.data() + s.size()) return std::nullopt;
  return v;
}

std::optional<KvEventTier> parse_tier(std::string_view s) {
  for (int t = 0; t < kNumKvEventTiers; ++t)
    if (s == kv_event_tier_name(KvEventTier(t))) return KvEventTier(t);
  return std::nullopt;
}

}  // namespace

std::string block_hash_hex(const BlockHash& h) {
  return hex64(h.hi) + hex64(h.lo);
}

std::optional<BlockHash> parse_block_hash_hex(std::string_view hex) {
  if (hex.size() != 32) return std::nullopt;
  auto hi = parse_hex64(hex.substr(0, 16)), lo = parse_hex64(hex.substr(16));
  if (!hi || !lo) return std::nullopt;
  return BlockHash{*lo, *hi};
}

std::string kv_event_page_json(const KvEventPage& page) {
  // Written by hand: a page may hold a snapshot of 10^5 blocks, and this is its hot path.
  std::string out;
  out.reserve(96 + page.events.size() * 80);
  out += R"({"epoch":")" + hex64(page.epoch) + R"(","seq":)" + std::to_string(page.seq) + R"(,"snapshot":)" +
         (page.snapshot ? "true" : "false") + R"(,"more":)" + (page.more ? "true" : "false") +
         R"(,"events":[)";
  for (size_t i = 0; i < page.events.size(); ++i) {
    const KvEvent& e = page.events[i];
    if (i) out += ',';
    out += R"({"seq":)" + std::to_string(e.seq) + R"(,"type":")" + (e.stored ? "stored" : "removed") +
           R"(","tier":")" + kv_event_tier_name(e.tier) + R"(","block":")" + block_hash_hex(e.block) + "\"}";
  }
  out += "]}";
  return out;
}

std::optional<KvEventPage> parse_kv_event_page(std::string_view text) {
  const nlohmann::json j = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (!j.is_object()) return std::nullopt;
  KvEventPage page;
  try {
    auto epoch = parse_hex64(j.at("epoch").get<std::string>());
    if (!epoch) return std::nullopt;
    page.epoch = *epoch;
    page.seq = j.at("seq").get<uint64_t>();
    page.snapshot = j.at("snapshot").get<bool>();
    page.more = j.value("more", false);
    for (const auto& e : j.at("events")) {
      KvEvent ev;
      ev.seq = e.at("seq").get<uint64_t>();
      const std::string type = e.at("type").get<std::string>();
      if (type != "stored" && type != "removed") return std::nullopt;
      ev.stored = type == "stored";
      auto tier = parse_tier(e.at("tier").get<std::string>());
      auto block = parse_block_hash_hex(e.at("block").get<std::string>());
      if (!tier || !block) return std::nullopt;
      ev.tier = *tier;
      ev.block = *block;
      page.events.push_back(ev);
    }
  } catch (const nlohmann::json::exception&) {
    return std::nullopt;
  }
  return page;
}

}  // namespace beluga
