#include "server/disaggregation.h"

#include <charconv>

#include "engine/block_manager.h"

#include "kvstore/kv_transfer.h"
#include "kvstore/tiered_store.h"
#include "model/batch.h"

namespace beluga::server {

const char* serve_role_name(ServeRole r) {
  switch (r) {
    case ServeRole::kBoth:
      return "both";
    case ServeRole::kPrefill:
      return "prefill";
    case ServeRole::kDecode:
      return "decode";
  }
  return "both";
}

std::optional<ServeRole> parse_serve_role(std::string_view s) {
  if (s == "both") return ServeRole::kBoth;
  if (s == "prefill") return ServeRole::kPrefill;
  if (s == "decode") return ServeRole::kDecode;
  return std::nullopt;
}

PdRequest pd_request(const Disaggregation& d, std::string_view prefill_to, std::string_view cached,
                     std::string* error) {
  PdRequest r;
  if (!prefill_to.empty()) {
    if (d.role == ServeRole::kDecode || !d.transfer || !d.store) {
      *error = std::string("this server (role ") + serve_role_name(d.role) +
               ") does not prefill for other engines; start it with --role prefill";
      return r;
    }
    r.prefill_to = std::string(prefill_to);
  }
  if (d.role == ServeRole::kDecode && !cached.empty() && !parse_prefill_cached(cached, &r.cached))
    r.cached.clear();
  return r;
}

std::string format_prefill_cached(const std::vector<PdRequest::Cached>& c) {
  std::string s;
  for (const auto& x : c) {
    if (!s.empty()) s += ',';
    s += std::to_string(x.tokens) + "/" + std::to_string(x.host) + "/" + std::to_string(x.disk);
  }
  return s;
}

bool parse_prefill_cached(std::string_view s, std::vector<PdRequest::Cached>* out) {
  out->clear();
  while (!s.empty()) {
    const size_t comma = s.find(',');
    std::string_view item = s.substr(0, comma);
    int v[3];
    for (int k = 0; k < 3; ++k) {
      const size_t slash = k < 2 ? item.find('/') : item.size();
      if (slash == std::string_view::npos) return false;
      const std::string_view num = item.substr(0, slash);
      auto [p, ec] = std::from_chars(num.data(), num.data() + num.size(), v[k]);
      if (ec != std::errc() || p != num.data() + num.size() || v[k] < 0) return false;
      item = k < 2 ? item.substr(slash + 1) : std::string_view();
    }
    if (v[1] + v[2] > v[0] || out->size() >= 4096) return false;
    out->push_back({v[0], v[1], v[2]});
    if (comma == std::string_view::npos) return true;
    s = s.substr(comma + 1);
  }
  return false;  // empty, or a trailing comma
}

nlohmann::ordered_json prefill_report_json(const PrefillReport& r) {
  nlohmann::ordered_json prompts = nlohmann::ordered_json::array();
  for (const auto& p : r.prompts)
    prompts.push_back({{"prompt_tokens", p.tokens},
                       {"cached_tokens", p.cached.tokens},
                       {"cached_tokens_host", p.cached.host},
                       {"cached_tokens_disk", p.cached.disk},
                       {"blocks", p.blocks},
                       {"blocks_sent", p.sent},
                       {"blocks_accepted", p.accepted}});
  nlohmann::ordered_json j{{"object", "beluga.prefill"},
                           {"ok", r.ok},
                           {"prompts", prompts},
                           {"bytes", r.bytes},
                           {"seconds", r.seconds}};
  if (!r.ok) j["error"] = r.error;
  return j;
}

void send_prompt_blocks(const Disaggregation& d, const std::string& dest, const std::string& salt,
                        const std::string& cls, const std::vector<std::vector<int>>& prompts,
                        PrefillReport* r) {
  r->ok = true;
  for (size_t i = 0; i < prompts.size(); ++i) {
    const auto& p = prompts[i];
    PrefillReport::Prompt& rp = r->prompts[i];
    const size_t usable = p.empty() ? 0 : (p.size() - 1) / kKvBlockSize;
    const auto keys = block_hashes(p, salt, usable);
    rp.blocks = int(keys.size());
    // Pinned until sent: the engine may evict them from the host tier meanwhile, not reuse them.
    auto pinned = d.store->pin_host_blocks(keys.data(), int(keys.size()));
    std::vector<kv::OutgoingBlock> out;
    out.reserve(size_t(pinned.size()));
    for (int k = 0; k < pinned.size(); ++k) out.push_back({keys[size_t(k)], pinned.data(k)});
    rp.sent = int(out.size());
    if (out.empty()) continue;
    const kv::TransferResult t = d.transfer->send(dest, cls, out);
    rp.accepted = t.accepted;
    r->bytes += t.bytes;
    r->seconds += t.seconds;
    if (!t.ok) {
      r->ok = false;
      r->error = "sending the KV blocks to " + dest + ": " + t.error;
      return;
    }
  }
}

}  // namespace beluga::server
