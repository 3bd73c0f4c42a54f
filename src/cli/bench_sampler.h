// `beluga bench sampler [--vocab 8192,131072] [--iters N] [--out FILE.json]`
// The CPU sampler's cost per token (one sample() call on one row of logits) for each vocabulary size
// and a set of sampling parameters, on two kinds of rows: "peaked" (a trained model's: a few strong
// candidates over a long tail) and "flat" (random weights: the nucleus spans most of the vocabulary).
// Prints mean and p50/p99 microseconds of the thread's CPU time per token (not wall time: on a busy
// machine preemptions would dominate) and writes them as JSON to --out.
#pragma once

namespace beluga::cli {

int bench_sampler(int argc, char** argv);

}  // namespace beluga::cli
