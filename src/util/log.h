// The server's and router's log lines on stderr ("beluga serve: warning: ..."), filtered by a level:
// error < warn < info < debug (--log-level, BELUGA_LOG_LEVEL; default info). The access log is not
// routed here (server/access_log.h): it has its own switch, --no-access-log.
//
// Global state, and why: the sink (stderr) is process-wide already, and log lines come from every
// thread (I/O threads, the engine, health probes) of whichever server or router runs in the process,
// so the level lives next to the sink rather than being threaded through every config. It is the only
// mutable state: one atomic level and one atomic FILE* (tests point it elsewhere), both set at startup.
// Each line is one fwrite, so lines from different threads never interleave.
#pragma once

#include <cstdio>
#include <optional>
#include <string>
#include <string_view>

#include "util/error.h"

namespace beluga::log {

enum class Level { kError = 0, kWarn = 1, kInfo = 2, kDebug = 3 };

// "error", "warn" (or "warning"), "info", "debug"; nothing for anything else.
std::optional<Level> parse_level(std::string_view name);
const char* level_name(Level l);
// The level from --log-level when given, else BELUGA_LOG_LEVEL when set, else info; throws on a name
// parse_level refuses (naming where it came from).
Level level_from(const std::optional<std::string>& flag);

void set_level(Level l);
Level level();
inline bool enabled(Level l) {
  return int(l) <= int(level());
}

// Where lines go (default stderr; not owned). Returns the previous sink.
std::FILE* set_sink(std::FILE* out);

// "beluga COMPONENT: message", with "error: ", "warning: " or "debug: " before the message for those
// levels (info lines carry none, as they always have).
std::string format_line(Level l, std::string_view component, std::string_view message);
// Writes the line when `l` is enabled.
void write(Level l, std::string_view component, std::string_view message);

template <typename... A>
void error(std::string_view component, A&&... a) {
  if (enabled(Level::kError)) write(Level::kError, component, str(std::forward<A>(a)...));
}
template <typename... A>
void warn(std::string_view component, A&&... a) {
  if (enabled(Level::kWarn)) write(Level::kWarn, component, str(std::forward<A>(a)...));
}
template <typename... A>
void info(std::string_view component, A&&... a) {
  if (enabled(Level::kInfo)) write(Level::kInfo, component, str(std::forward<A>(a)...));
}
template <typename... A>
void debug(std::string_view component, A&&... a) {
  if (enabled(Level::kDebug)) write(Level::kDebug, component, str(std::forward<A>(a)...));
}

}  // namespace beluga::log
