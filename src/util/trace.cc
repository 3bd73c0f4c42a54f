#include "util/trace.h"

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>

#include "util/error.h"

namespace beluga {

namespace {

// A JSON string body for a lane name (names are ours, but quotes and control bytes must not break
// the file).
std::string json_escape(const std::string& s) {
  std::string o;
  for (char c : s) {
    if (c == '"' || c == '\\') {
      o += '\\';
      o += c;
    } else if (static_cast<unsigned char>(c) < 0x20) {
      o += ' ';
    } else {
      o += c;
    }
  }
  return o;
}

}  // namespace

Tracer::Tracer(const std::string& path, size_t max_events)
    : file_(std::fopen(path.c_str(), "w")), max_events_(max_events), origin_ns_(now_ns()) {
  BELUGA_CHECK(file_, "cannot open the trace file ", path, ": ", std::strerror(errno));
}

int64_t Tracer::now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

int Tracer::add_lane(std::string name) {
  lanes_.push_back(Lane{std::move(name), {}, 0});
  lanes_.back().events.reserve(std::min<size_t>(max_events_, size_t(1) << 14));
  return int(lanes_.size()) - 1;
}

void Tracer::record(int lane, const char* name, int64_t begin_ns, int64_t end_ns, int64_t step, int32_t tokens,
                    int32_t graph) {
  Lane& l = lanes_[size_t(lane)];
  if (l.events.size() >= max_events_) {
    l.dropped++;
    return;
  }
  l.events.push_back(Event{name, begin_ns, end_ns, step, tokens, graph});
}

Tracer::~Tracer() {
  std::FILE* f = file_;
  std::fputs("{\"displayTimeUnit\":\"ms\",\"traceEvents\":[\n", f);
  bool first = true;
  auto sep = [&] {
    if (!first) std::fputs(",\n", f);
    first = false;
  };
  int64_t dropped = 0;
  for (size_t i = 0; i < lanes_.size(); ++i) {
    const Lane& l = lanes_[i];
    dropped += l.dropped;
    sep();
    std::fprintf(f,
                 "{\"name\":\"thread_name\",\"ph\":\"M\",\"pid\":1,\"tid\":%zu,\"args\":{\"name\":\"%s\"}}",
                 i, json_escape(l.name).c_str());
    for (const Event& e : l.events) {
      sep();
      // Microseconds with nanosecond digits: Chrome's unit, without losing short spans.
      std::fprintf(f, "{\"name\":\"%s\",\"ph\":\"X\",\"pid\":1,\"tid\":%zu,\"ts\":%.3f,\"dur\":%.3f", e.name,
                   i, double(e.begin_ns - origin_ns_) / 1e3, double(e.end_ns - e.begin_ns) / 1e3);
      if (e.step >= 0) {
        std::fprintf(f, ",\"args\":{\"step\":%lld", static_cast<long long>(e.step));
        if (e.tokens >= 0) std::fprintf(f, ",\"tokens\":%d", e.tokens);
        if (e.graph >= 0) std::fprintf(f, ",\"graph\":%d", e.graph);
        std::fputs("}}", f);
      } else {
        std::fputs("}", f);
      }
    }
  }
  std::fprintf(f, "\n],\"otherData\":{\"dropped_events\":%lld}}\n", static_cast<long long>(dropped));
  if (std::fclose(f) != 0)
    std::fprintf(stderr, "beluga: writing the trace file failed: %s\n", std::strerror(errno));
}

}  // namespace beluga
