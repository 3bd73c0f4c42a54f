// `beluga bench pd`: prefill/decode disaggregation against colocated serving (docs/performance.md).
// 1. The KV transfer's rate against the link's own, measured in the same run: the same bytes over one
//    loopback TCP connection with nothing but recv() on the other end, then through TcpKvTransfer into
//    a KvReceiver's host tier in the model's blocks (checksums and all).
// 2. One trace (Poisson arrivals of long prompts) through a colocated `beluga serve` on --cores, and
//    through `beluga router --prefill P --decode D` with P pinned to the first core and D to the rest:
//    TTFT, TPOT and per-token ITL percentiles side by side. Prints a table; --out FILE writes JSON.
#pragma once

namespace beluga::cli {

int bench_pd(int argc, char** argv);

}  // namespace beluga::cli
