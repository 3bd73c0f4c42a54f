// `beluga bench eplb [--experts 256 --groups 8 --top-k 8 --layers 58 --gpus 8,16,32,64 ...]`
// EPLB's effect on a skewed routing distribution, with no model and no GPU: each layer's expert
// popularity is Zipf(--zipf) over a seeded random order of its experts; --tokens tokens per layer are
// routed to top-k distinct experts by it. One sample fills the statistics window (ExpertLoadWindow),
// a second, independent one is the held-out traffic the placement is judged on: every held-out token
// goes through ExpertPlacement::choose and the routed tokens each GPU receives give max / mean per
// layer. Rows: before (no redundancy,
// contiguous placement) and after, for the hierarchical and global policies, with replica spreading
// (Beluga's default) and without (the published code); the limit is 1.00. Also the rebalance's own CPU
// time (the thread's, median of --repeat) and the slots a rebalance rewrites between two windows, as
// planned and after ExpertPlacement::aligned_to the previous placement.
#pragma once

namespace beluga::cli {

int bench_eplb(int argc, char** argv);

}  // namespace beluga::cli
