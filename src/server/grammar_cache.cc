#include "server/grammar_cache.h"

#include "grammar/refused.h"

namespace beluga::server {

GrammarCache::GrammarCache(std::shared_ptr<const grammar::TokenVocab> vocab, GrammarCacheOptions options)
    : vocab_(std::move(vocab)), options_(options) {}

std::shared_ptr<const grammar::CompiledGrammar> GrammarCache::get(const std::string& key,
                                                                  const Compile& compile) {
  std::unique_lock<std::mutex> lk(mu_);
  if (auto it = map_.find(key);
      it != map_.end() && it->second->ready && std::chrono::steady_clock::now() >= it->second->expires) {
    lru_.erase(it->second->lru);  // a time-limit refusal past its memory: compile again
    map_.erase(it);
  }
  if (auto it = map_.find(key); it != map_.end()) {
    std::shared_ptr<Entry> e = it->second;
    stats_.hits++;
    if (e->ready) {
      lru_.splice(lru_.begin(), lru_, e->lru);
    } else {
      ready_cv_.wait(lk, [&] { return e->ready; });  // another request is compiling it
    }
    if (e->error) std::rethrow_exception(e->error);
    return e->grammar;
  }
  stats_.misses++;
  auto e = std::make_shared<Entry>();
  map_.emplace(key, e);
  lk.unlock();

  std::shared_ptr<const grammar::CompiledGrammar> g;
  std::exception_ptr error;
  bool keep = true;  // a deterministic outcome: remembered
  bool out_of_time = false;
  const auto t0 = std::chrono::steady_clock::now();
  try {
    g = compile(t0 + options_.timeout);
  } catch (const grammar::Refused& r) {
    error = std::current_exception();
    out_of_time = r.keyword() == "compile-time";
    keep = !out_of_time || options_.timeout_memory.count() > 0;
  } catch (const Error&) {
    error = std::current_exception();  // not a valid schema
  } catch (...) {
    error = std::current_exception();  // out of memory and the like: try again next time
    keep = false;
  }
  const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();

  lk.lock();
  e->grammar = g;
  e->error = error;
  e->ready = true;
  if (out_of_time) e->expires = std::chrono::steady_clock::now() + options_.timeout_memory;
  if (error) stats_.refused++;
  if (g) stats_.compile_ms += ms;
  if (keep && options_.capacity > 0) {
    lru_.push_front(key);
    e->lru = lru_.begin();
    evict_locked();
  } else {
    map_.erase(key);
  }
  lk.unlock();
  ready_cv_.notify_all();
  if (error) std::rethrow_exception(error);
  return g;
}

void GrammarCache::evict_locked() {
  while (lru_.size() > options_.capacity) {
    map_.erase(lru_.back());
    lru_.pop_back();
  }
}

GrammarCache::Stats GrammarCache::stats() const {
  std::lock_guard<std::mutex> lk(mu_);
  Stats s = stats_;
  s.entries = lru_.size();
  return s;
}

}  // namespace beluga::server
