#include "server/grammar_metrics.h"

#include <cstdio>

namespace beluga::server {

std::string render_grammar_metrics(const GrammarCache& cache, const std::string& model) {
  const GrammarCache::Stats s = cache.stats();
  const std::string label = "{model_name=\"" + model + "\"}";
  std::string out;
  auto metric = [&](const char* name, const char* type, const char* help, double v) {
    char num[64];
    std::snprintf(num, sizeof num, "%.17g", v);
    out += std::string("# HELP ") + name + " " + help + "\n# TYPE " + name + " " + type + "\n" + name +
           label + " " + num + "\n";
  };
  metric("beluga_grammar_cache_hits_total", "counter",
         "Structured-output requests whose grammar was cached (or being compiled by another request).",
         double(s.hits));
  metric("beluga_grammar_cache_misses_total", "counter",
         "Structured-output requests that compiled their grammar.", double(s.misses));
  metric("beluga_grammar_compile_refused_total", "counter",
         "Compiles refused (unenforceable keyword, invalid schema, size or time limit).", double(s.refused));
  metric("beluga_grammar_compile_seconds_total", "counter", "Time spent compiling grammars that compiled.",
         s.compile_ms / 1000.0);
  metric("beluga_grammar_cache_entries", "gauge", "Compiled grammars (and remembered refusals) held.",
         double(s.entries));
  return out;
}

}  // namespace beluga::server
