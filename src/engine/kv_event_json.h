// The wire form of a KvEventPage (engine/kv_events.h), what `GET /v1/kv/events` answers and the
// router parses:
//   {"epoch":"<16 hex>","seq":N,"snapshot":false,"more":false,
//    "events":[{"seq":N,"type":"stored"|"removed","tier":"device"|"host"|"disk","block":"<32 hex>"}]}
// The epoch and block hashes are hex strings (64- and 128-bit values do not fit a JSON number in
// every client); a block is hi then lo.
#pragma once

#include <optional>
#include <string>
#include <string_view>

#include "engine/kv_events.h"

namespace beluga {

std::string kv_event_page_json(const KvEventPage& page);
// nullopt when the text is not such a page.
std::optional<KvEventPage> parse_kv_event_page(std::string_view text);

std::string block_hash_hex(const BlockHash& h);
std::optional<BlockHash> parse_block_hash_hex(std::string_view hex);

}  // namespace beluga
