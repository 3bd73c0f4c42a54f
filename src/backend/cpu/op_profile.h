// Per-op wall-time totals for the CPU backend, enabled with BELUGA_PROFILE=1 and printed to stderr
// when the backend is destroyed: where a step's time goes, without an external profiler.
#pragma once

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <string>

namespace beluga::cpu {

class OpProfile {
 public:
  OpProfile() : enabled_(std::getenv("BELUGA_PROFILE") != nullptr) {}
  ~OpProfile() {
    if (!enabled_ || totals_.empty()) return;
    double all = 0;
    for (const auto& [name, e] : totals_) all += e.seconds;
    std::fprintf(stderr, "%-24s %10s %10s %7s\n", "op", "calls", "ms", "share");
    for (const auto& [name, e] : totals_)
      std::fprintf(stderr, "%-24s %10ld %10.1f %6.1f%%\n", name.c_str(), e.calls, e.seconds * 1e3,
                   100 * e.seconds / all);
  }
  bool enabled() const { return enabled_; }
  void add(const char* name, double s) {
    auto& e = totals_[name];
    e.seconds += s;
    e.calls++;
  }

  class Scope {
   public:
    Scope(OpProfile& p, const char* name) : p_(p.enabled_ ? &p : nullptr), name_(name) {
      if (p_) t0_ = std::chrono::steady_clock::now();
    }
    ~Scope() {
      if (p_) p_->add(name_, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0_).count());
    }

   private:
    OpProfile* p_;
    const char* name_;
    std::chrono::steady_clock::time_point t0_;
  };

 private:
  struct Entry {
    double seconds = 0;
    long calls = 0;
  };
  bool enabled_;
  std::map<std::string, Entry> totals_;
};

}  // namespace beluga::cpu
