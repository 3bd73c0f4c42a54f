#include "kvstore/metrics_text.h"

#include <cctype>
#include <cstdio>
#include <vector>

#include "model/batch.h"

namespace beluga::kv {

namespace {

struct Line {
  const char* name;
  const char* type;
  const char* help;
};

std::string num(double v) {
  char buf[64];
  std::snprintf(buf, sizeof(buf), "%.17g", v);
  return buf;
}

}  // namespace

std::string render_metrics(TieredStore& store, const EngineStats& engine, const std::string& model) {
  const StoreStats st = store.stats();
  std::vector<std::pair<std::string, const TierStats*>> tiers = {{"host", &st.host}};
  if (st.disk) tiers.push_back({"disk", &*st.disk});
  TierStats device;
  device.hits = (engine.prefix_cache_hits - engine.prefix_cache_hits_below) / kKvBlockSize;
  device.blocks = engine.kv_blocks_total;
  const std::string m = "model_name=\"" + model + "\"";
  std::string out;
  auto metric = [&](const char* name, const char* type, const char* help, bool with_device, auto field) {
    out += std::string("# HELP ") + name + " " + help + "\n# TYPE " + name + " " + type + "\n";
    if (with_device) out += std::string(name) + "{" + m + ",tier=\"device\"} " + num(field(device)) + "\n";
    for (const auto& [tier, t] : tiers)
      out += std::string(name) + "{" + m + ",tier=\"" + tier + "\"} " + num(field(*t)) + "\n";
  };
  metric("beluga_kv_tier_hits_total", "counter", "KV blocks served from the tier.", true,
         [](const TierStats& t) { return double(t.hits); });
  metric("beluga_kv_tier_misses_total", "counter", "Lookups whose next block was not in the tier.", false,
         [](const TierStats& t) { return double(t.misses); });
  metric("beluga_kv_tier_read_bytes_total", "counter", "Bytes loaded from the tier.", false,
         [](const TierStats& t) { return double(t.bytes_read); });
  metric("beluga_kv_tier_written_bytes_total", "counter", "Bytes saved into the tier.", false,
         [](const TierStats& t) { return double(t.bytes_written); });
  metric("beluga_kv_tier_load_seconds_total", "counter", "Time spent loading blocks from the tier.", false,
         [](const TierStats& t) { return t.load_seconds; });
  metric("beluga_kv_tier_evictions_total", "counter", "Blocks evicted for capacity.", false,
         [](const TierStats& t) { return double(t.evictions); });
  metric("beluga_kv_tier_expirations_total", "counter", "Blocks removed when their class's retention passed.",
         false, [](const TierStats& t) { return double(t.expirations); });
  metric("beluga_kv_tier_errors_total", "counter", "Failed reads or writes (each a miss or a dropped save).",
         false, [](const TierStats& t) { return double(t.errors); });
  metric("beluga_kv_tier_write_errors_total", "counter", "Failed writes into the tier (each a dropped save).",
         false, [](const TierStats& t) { return double(t.write_errors); });
  metric("beluga_kv_tier_no_space_total", "counter", "Writes the file system refused for lack of space.",
         false, [](const TierStats& t) { return double(t.no_space); });
  metric("beluga_kv_tier_partial_files_removed_total", "counter",
         "Temporary files of writers killed mid-write, removed.", false,
         [](const TierStats& t) { return double(t.partial_removed); });
  metric("beluga_kv_tier_blocks", "gauge", "KV blocks the tier holds.", true,
         [](const TierStats& t) { return double(t.blocks); });
  metric("beluga_kv_tier_bytes", "gauge", "Bytes the tier holds.", false,
         [](const TierStats& t) { return double(t.bytes); });
  metric("beluga_kv_tier_capacity_bytes", "gauge", "The tier's capacity.", false,
         [](const TierStats& t) { return double(t.capacity_bytes); });
  // Class names come from --kv-retention (letters, digits, '-', '_'): label values need no escaping;
  // anything else is left out rather than risk a malformed exposition.
  auto label_safe = [](const std::string& v) {
    for (char c : v)
      if (!std::isalnum(static_cast<unsigned char>(c)) && c != '-' && c != '_') return false;
    return !v.empty();
  };
  out +=
      "# HELP beluga_kv_hit_tokens_total Prompt tokens served from each tier, by traffic class.\n"
      "# TYPE beluga_kv_hit_tokens_total counter\n";
  for (const auto& [cls, h] : st.hit_tokens) {
    if (!label_safe(cls)) continue;
    const std::pair<const char*, int64_t> rows[] = {{"device", h.device}, {"host", h.host}, {"disk", h.disk}};
    for (const auto& [tier, v] : rows)
      out += "beluga_kv_hit_tokens_total{" + m + ",tier=\"" + tier + "\",traffic_class=\"" + cls + "\"} " +
             num(double(v)) + "\n";
  }
  out +=
      "# HELP beluga_kv_tier_class_blocks KV blocks the tier holds, by retention class.\n"
      "# TYPE beluga_kv_tier_class_blocks gauge\n";
  for (const auto& [cls, n] : st.host_class_blocks)
    if (label_safe(cls))
      out += "beluga_kv_tier_class_blocks{" + m + ",tier=\"host\",class=\"" + cls + "\"} " + num(double(n)) +
             "\n";
  if (store.disk()) {
    auto by_class = store.disk()->by_class();
    std::erase_if(by_class, [&](const auto& kv) { return !label_safe(kv.first); });
    for (const auto& [cls, u] : by_class)
      out += "beluga_kv_tier_class_blocks{" + m + ",tier=\"disk\",class=\"" + cls + "\"} " +
             num(double(u.blocks)) + "\n";
    out +=
        "# HELP beluga_kv_tier_class_bytes Bytes the tier holds, by retention class.\n"
        "# TYPE beluga_kv_tier_class_bytes gauge\n";
    for (const auto& [cls, u] : by_class)
      out += "beluga_kv_tier_class_bytes{" + m + ",tier=\"disk\",class=\"" + cls + "\"} " +
             num(double(u.bytes)) + "\n";
  }
  return out;
}

}  // namespace beluga::kv
