// A progress report for long steps (loading a checkpoint, a benchmark's requests): on a terminal, one
// line redrawn in place (`label [#####.....]  45%  1.2 / 2.6 GB`) at most every 100 ms; otherwise
// (a log file, a pipe) a plain line at each quarter, so logs stay short. finish() prints the last
// line with the elapsed time. Not thread-safe: one owner advances it.
#pragma once

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <string>

namespace beluga {

class Progress {
 public:
  enum class Unit { kBytes, kCount };
  // `out` is not owned; `total` 0 reports no fraction. `terminal` defaults to whether `out` is a tty.
  Progress(std::string label, uint64_t total, Unit unit, std::FILE* out, int terminal = -1);
  Progress(const Progress&) = delete;
  Progress& operator=(const Progress&) = delete;
  ~Progress();  // finish() if not yet called

  void advance(uint64_t n);
  void finish();
  uint64_t done() const { return done_; }

 private:
  void draw(bool final);
  std::string amount(uint64_t v) const;

  std::string label_;
  uint64_t total_, done_ = 0;
  Unit unit_;
  std::FILE* out_;
  bool terminal_, finished_ = false;
  int quarters_shown_ = 0;  // plain mode: how many of 25/50/75 % were printed
  std::chrono::steady_clock::time_point start_, last_draw_;
};

}  // namespace beluga
