// Compiled grammars of one model's vocabulary, kept by key (the constraint's kind plus its canonical
// text: a schema's JSON as sent, key order included, since that order shapes the grammar) in an LRU
// of `capacity` entries, so a schema sent again compiles once. Compiles run on the caller's thread (a
// build-pool thread, never the engine's) under a time limit; concurrent requests for one key wait for
// a single compile. Refusals (an unenforceable keyword) are remembered like grammars; running out of
// time depends on the load of the moment, so it is remembered only for `timeout_memory`: long enough
// that a burst of requests with one too-hard schema fails at once instead of each wave of them holding
// build threads for another full time limit (measured: 256 such requests took minutes), short enough
// that a quieter machine tries again.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <list>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>

#include "grammar/compiled.h"
#include "grammar/vocab.h"

namespace beluga::server {

struct GrammarCacheOptions {
  size_t capacity = 256;                      // compiled grammars kept (0: none, every request compiles)
  std::chrono::milliseconds timeout{10'000};  // per compile (front end and masks together)
  std::chrono::milliseconds timeout_memory{30'000};  // how long a compile that ran out of time is remembered
};

class GrammarCache {
 public:
  using Deadline = std::chrono::steady_clock::time_point;
  using Compile = std::function<std::shared_ptr<const grammar::CompiledGrammar>(Deadline)>;

  GrammarCache(std::shared_ptr<const grammar::TokenVocab> vocab, GrammarCacheOptions options);

  // The grammar under `key`, compiled by `compile` (given the deadline) when absent. Throws what
  // `compile` throws (grammar::Refused, beluga::Error), to every caller waiting for that compile.
  std::shared_ptr<const grammar::CompiledGrammar> get(const std::string& key, const Compile& compile);

  struct Stats {
    uint64_t hits = 0, misses = 0, refused = 0;
    double compile_ms = 0;  // total over the misses that compiled
    size_t entries = 0;
  };
  Stats stats() const;
  const std::shared_ptr<const grammar::TokenVocab>& vocab() const { return vocab_; }
  const GrammarCacheOptions& options() const { return options_; }

 private:
  struct Entry {
    std::shared_ptr<const grammar::CompiledGrammar> grammar;
    std::exception_ptr error;  // a remembered refusal
    bool ready = false;
    std::chrono::steady_clock::time_point expires = std::chrono::steady_clock::time_point::max();
    std::list<std::string>::iterator lru;
  };
  void evict_locked();

  const std::shared_ptr<const grammar::TokenVocab> vocab_;
  const GrammarCacheOptions options_;
  mutable std::mutex mu_;
  std::condition_variable ready_cv_;
  std::unordered_map<std::string, std::shared_ptr<Entry>> map_;
  std::list<std::string> lru_;  // most recent first; only ready entries are listed
  Stats stats_;
};

}  // namespace beluga::server
