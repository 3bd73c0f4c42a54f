// `beluga bench fleet`: routing policies side by side on real processes. For each policy it starts
// N `beluga serve` replicas (fresh, so every policy starts from empty caches) and a `beluga router`
// in front of them, drives `beluga bench serve`'s multi-turn, multi-tenant trace through the router,
// and prints one table: prefix hit rate (the replicas' usage.cached_tokens), TTFT p50/p99,
// throughput and goodput per policy; JSON with --out.
#pragma once

namespace beluga::cli {

int bench_fleet(int argc, char** argv);

}  // namespace beluga::cli
