// `beluga bench ep [--ranks 2,4] [--rows 64,1024,8192] [--hidden N] [--iters N] [--moe-tokens N]
//                  [--experts N] [--top-k N] [--moe-inter N] [--eplb-redundant 0,2] [--eplb-skew S]
//                  [--eplb-steps N] [--out FILE.json]`
// Expert parallelism on the CPU (thread ranks, LocalCommunicator):
//  1. all_to_all_v: every rank sends `rows` rows of `hidden` floats spread evenly over all ranks;
//     the group's bytes per second next to memcpy of the same bytes, one thread and one thread per
//     rank at once (the limit: the exchange is a pull memcpy between two waits), in the same run.
//  2. One MoE layer (random F32 weights, the tokens split over the ranks): ExpertParallelMoe on N
//     ranks of one OpenMP thread each against Ops::moe with N threads on all tokens, and the
//     bytes the dispatch and combine moved.
//  3. Live EPLB (parallel/live_placement.h): the same layer with a Zipf-like router bias, served with
//     replicated tokens for --eplb-steps steps, rebalanced at the step boundary from their window,
//     then as many fresh steps: max/mean over the ranks of the rows their experts computed, before
//     and after, EPLB's own estimate, the slots moved and what the rebalance cost.
// Times are wall-clock medians over --iters runs; the machine's other load shows in them.
#pragma once

namespace beluga::cli {

int bench_ep(int argc, char** argv);

}  // namespace beluga::cli
