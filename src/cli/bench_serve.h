// `beluga bench serve`: a load generator for a running OpenAI-compatible server (streaming chat
// completions), after `vllm bench serve`: request/token throughput, TTFT, TPOT, ITL, E2E latency,
// prefix hit rate and goodput under an SLO; JSON with --out.
#pragma once

namespace beluga::cli {

int bench_serve(int argc, char** argv);

}  // namespace beluga::cli
