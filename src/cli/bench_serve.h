// `beluga bench serve`: a load generator for a running OpenAI-compatible server (streaming chat
// completions), after `vllm bench serve`: request/token throughput, TTFT, TPOT, ITL, E2E latency,
// prefix hit rate and goodput under an SLO; JSON with --out.
#pragma once

#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace beluga::cli {

int bench_serve(int argc, char** argv);

// Runs `bench serve --url URL ARGS...` in this process (its table to stdout, as usual) and returns its
// JSON report; throws naming the URL when it fails. The other benches' way to drive a trace.
nlohmann::json bench_serve_report(const std::string& url, const std::vector<std::string>& args);

}  // namespace beluga::cli
