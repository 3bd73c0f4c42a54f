// Tracer: timed spans of named phases on named lanes (threads), written as Chrome trace JSON
// ({"traceEvents": [...]}, complete "X" events in microseconds; chrome://tracing and Perfetto read
// it) to a file when the Tracer is destroyed.
//
// Cost model: code that may trace holds a `Tracer*` that is null when tracing is off, and TraceSpan
// on a null Tracer is one branch: no clock read, no allocation, no lock. On, a span is two clock reads
// and an append to its lane's buffer (reserved up front; past max_events per lane spans are counted
// as dropped, not stored, so memory stays bounded).
//
// Threads: lanes are added before the threads that record on them start; each lane is written by one
// thread only, and the file is written by the destructor once those threads are done.
#pragma once

#include <cstdint>
#include <cstdio>
#include <deque>
#include <string>
#include <vector>

namespace beluga {

class Tracer {
 public:
  // Opens `path` for writing at once (a path that cannot be written fails here, not at the end).
  explicit Tracer(const std::string& path, size_t max_events = size_t(1) << 21);
  ~Tracer();  // writes the file
  Tracer(const Tracer&) = delete;
  Tracer& operator=(const Tracer&) = delete;

  int add_lane(std::string name);  // returns the lane's id (its Chrome "tid")
  // `name` must outlive the Tracer (a string literal); `step` < 0: none. A model step's span may carry
  // its batch's `tokens` and whether it replayed a CUDA `graph` (< 0: not given).
  void record(int lane, const char* name, int64_t begin_ns, int64_t end_ns, int64_t step = -1,
              int32_t tokens = -1, int32_t graph = -1);
  static int64_t now_ns();  // steady clock

 private:
  struct Event {
    const char* name;
    int64_t begin_ns, end_ns, step;
    int32_t tokens, graph;
  };
  struct Lane {
    std::string name;
    std::vector<Event> events;
    int64_t dropped = 0;
  };
  std::FILE* file_;
  size_t max_events_;
  int64_t origin_ns_;
  std::deque<Lane> lanes_;  // stable addresses: a lane never moves once added
};

// A span from construction to end() (or destruction) on `lane`; nothing at all when `t` is null.
class TraceSpan {
 public:
  TraceSpan(Tracer* t, int lane, const char* name, int64_t step = -1)
      : t_(t), lane_(lane), name_(name), step_(step), begin_(t ? Tracer::now_ns() : 0) {}
  ~TraceSpan() { end(); }
  TraceSpan(const TraceSpan&) = delete;
  TraceSpan& operator=(const TraceSpan&) = delete;
  void end() {
    if (t_) t_->record(lane_, name_, begin_, Tracer::now_ns(), step_, tokens_, graph_);
    t_ = nullptr;
  }
  // A model step's batch tokens and whether it replayed a graph (Tracer::record).
  void set_step_args(int32_t tokens, int32_t graph) {
    tokens_ = tokens;
    graph_ = graph;
  }

 private:
  Tracer* t_;
  int lane_;
  const char* name_;
  int64_t step_;
  int64_t begin_;
  int32_t tokens_ = -1, graph_ = -1;
};

}  // namespace beluga
