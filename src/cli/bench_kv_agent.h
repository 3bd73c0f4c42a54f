// `beluga bench kv --agent-trace`: multi-turn agent sessions against the KV tiers. Each session's
// context grows turn by turn (a system prompt every session shares, then per turn a user/tool
// message and the model's answer, which the next turn's prompt carries), several sessions run at
// once, and together they hold more distinct context than the device pool, so a session's next
// turn finds its prefix evicted from the device pool and has to come from the host or file tier,
// or be recomputed. The same trace runs with the tiers off, with a host tier, and (with
// --kv-disk-dir) with a file tier behind a small host staging pool; it prints the hit rate by tier
// (all turns, and once warm: turns after the first), TTFT with each against the tiers off, wall
// time and goodput, and checks that every mode generated the same tokens. --json prints the JSON,
// --json-out FILE writes it.
//   --sessions 16 --turns 6 --concurrency 4 --system-tokens 512 --turn-tokens 256
//   --answer-tokens 16 --device-blocks N (default: what the concurrent sessions need at their
//   longest, plus 8) --kv-host-gb G (default: room for the whole trace)
#pragma once

#include "cli/args.h"

namespace beluga::cli {

int bench_kv_agent(const Args& args);

}  // namespace beluga::cli
