// The server's part in prefill/decode disaggregation (`beluga serve --role`, docs/disaggregation.md).
//
// A prefill engine (role prefill, or both) takes a generation request carrying
// `x-beluga-prefill-to: HOST:PORT` (set by `beluga router`) as "compute this prompt for the decode
// engine listening there": it runs the prompt (one token, no stream, nothing stored), sends the
// prompt's KV blocks from its host tier to that address (kvstore/kv_transfer.h), and answers with a
// small JSON report (PrefillReport) instead of the API's response. The router then sends the
// original request to the decode engine, with `x-beluga-prefill-cached` carrying the prefill side's
// cache hits so that usage reads as if one engine had served it; the decode engine finds the blocks
// in its host tier like any cached prefix and computes only the prompt's last partial block.
//
// Only a decode engine believes `x-beluga-prefill-cached` (it sits behind the router, which drops
// every client-sent `x-beluga-*` header); other roles ignore it.
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

namespace beluga::kv {
class TieredStore;
class KvTransfer;
}  // namespace beluga::kv

namespace beluga::server {

enum class ServeRole { kBoth, kPrefill, kDecode };
const char* serve_role_name(ServeRole r);  // "both", "prefill", "decode"
std::optional<ServeRole> parse_serve_role(std::string_view s);

inline constexpr const char* kPrefillToHeader = "x-beluga-prefill-to";
inline constexpr const char* kPrefillCachedHeader = "x-beluga-prefill-cached";

struct Disaggregation {
  ServeRole role = ServeRole::kBoth;
  kv::TieredStore* store = nullptr;    // prefill: the host tier the prompt's blocks are read from
  kv::KvTransfer* transfer = nullptr;  // prefill: how they leave (null: prefill requests are a 400)
  std::string kv_address;              // decode: where blocks arrive ("host:port", in /health)
};

// What a request asks of this engine's part (from its headers).
struct PdRequest {
  std::string prefill_to;  // not empty: prefill for the decode engine at this address
  // From x-beluga-prefill-cached: the prefill side's cache hits per prompt (decode role only).
  struct Cached {
    int tokens = 0, host = 0, disk = 0;
  };
  std::vector<Cached> cached;
};

// The headers' values checked against the role: a prefill request to a decode engine, or to one
// without a transfer, is refused (`error` set); a malformed x-beluga-prefill-cached is ignored.
PdRequest pd_request(const Disaggregation& d, std::string_view prefill_to, std::string_view cached,
                     std::string* error);

// "T/H/D,T/H/D,..." (one per prompt) and back.
std::string format_prefill_cached(const std::vector<PdRequest::Cached>& c);
bool parse_prefill_cached(std::string_view s, std::vector<PdRequest::Cached>* out);

// What a prefill engine answers: per prompt its length, cache hits and the blocks the decode
// engine accepted; the transfer's bytes and time; ok = every block was sent and stored.
struct PrefillReport {
  struct Prompt {
    int tokens = 0;
    PdRequest::Cached cached;
    int blocks = 0;    // full blocks the decode engine can use (the prompt's, less its last token)
    int sent = 0;      // of those, found in the host tier and sent
    int accepted = 0;  // of those, stored by the receiver
  };
  std::vector<Prompt> prompts;
  int64_t bytes = 0;
  double seconds = 0;
  bool ok = true;
  std::string error;
};
nlohmann::ordered_json prefill_report_json(const PrefillReport& r);

// The prefill side, once the prompts ran: sends each prompt's full blocks that a decode engine's
// prefix lookup can use (the prompt less its last token, which is always computed there), keyed with
// `salt` (the tenant's key) as the engine keyed them, from the host tier to `dest`, with retention
// class `cls`. Fills r->prompts[i].blocks/sent/accepted (r->prompts sized by the caller), bytes,
// seconds, ok and error. Blocks the calling thread for the transfer (not an I/O thread).
void send_prompt_blocks(const Disaggregation& d, const std::string& dest, const std::string& salt,
                        const std::string& cls, const std::vector<std::vector<int>>& prompts,
                        PrefillReport* r);

}  // namespace beluga::server
