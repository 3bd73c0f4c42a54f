// `beluga bench kv`: the KV tiers against the machine's own limits measured in the same run, and
// the time to first token of a request whose prefix sits in each tier against recomputing it.
#pragma once

namespace beluga::cli {

int bench_kv(int argc, char** argv);

}  // namespace beluga::cli
