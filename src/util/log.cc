#include "util/log.h"

#include <atomic>
#include <cstdlib>

namespace beluga::log {

namespace {

// The sink (log.h says why this one piece of state is process-wide).
struct Sink {
  std::atomic<int> level{int(Level::kInfo)};
  std::atomic<std::FILE*> out{stderr};
};

Sink& sink() {
  static Sink s;
  return s;
}

}  // namespace

std::optional<Level> parse_level(std::string_view name) {
  if (name == "error") return Level::kError;
  if (name == "warn" || name == "warning") return Level::kWarn;
  if (name == "info") return Level::kInfo;
  if (name == "debug") return Level::kDebug;
  return std::nullopt;
}

const char* level_name(Level l) {
  switch (l) {
    case Level::kError:
      return "error";
    case Level::kWarn:
      return "warn";
    case Level::kInfo:
      return "info";
    case Level::kDebug:
      return "debug";
  }
  return "info";
}

Level level_from(const std::optional<std::string>& flag) {
  if (flag) {
    auto l = parse_level(*flag);
    BELUGA_CHECK(l, "--log-level must be error, warn, info or debug (got '", *flag, "')");
    return *l;
  }
  const char* env = std::getenv("BELUGA_LOG_LEVEL");
  if (!env || !*env) return Level::kInfo;
  auto l = parse_level(env);
  BELUGA_CHECK(l, "BELUGA_LOG_LEVEL must be error, warn, info or debug (got '", env, "')");
  return *l;
}

void set_level(Level l) {
  sink().level.store(int(l), std::memory_order_relaxed);
}

Level level() {
  return Level(sink().level.load(std::memory_order_relaxed));
}

std::FILE* set_sink(std::FILE* out) {
  return sink().out.exchange(out);
}

std::string format_line(Level l, std::string_view component, std::string_view message) {
  std::string line = "beluga ";
  line += component;
  line += ": ";
  if (l == Level::kError) line += "error: ";
  if (l == Level::kWarn) line += "warning: ";
  if (l == Level::kDebug) line += "debug: ";
  line += message;
  line += '\n';
  return line;
}

void write(Level l, std::string_view component, std::string_view message) {
  if (!enabled(l)) return;
  const std::string line = format_line(l, component, message);
  std::FILE* out = sink().out.load();
  std::fwrite(line.data(), 1, line.size(), out);  // one call: stdio locks the stream for it
  std::fflush(out);
}

}  // namespace beluga::log
