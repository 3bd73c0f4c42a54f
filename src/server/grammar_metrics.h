// The structured-output compile cache's /metrics lines (Prometheus text): lookups that hit and
// missed, compiles refused, time spent compiling, grammars held.
#pragma once

#include <string>

#include "server/grammar_cache.h"

namespace beluga::server {

std::string render_grammar_metrics(const GrammarCache& cache, const std::string& model);

}  // namespace beluga::server
