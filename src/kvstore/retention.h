// Retention classes: how long a block is kept below the device pool after its last use, per traffic
// class. `--kv-retention chat=7d,agent=3d` (any class names; units s, m, h, d; the given classes
// merge over the defaults, which are DeepSeek's: chat 7 days, agent 3 days).
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace beluga::kv {

struct Retention {
  std::map<std::string, int64_t> seconds;  // class -> retention after last use
  Retention();                             // the defaults
  bool has(const std::string& cls) const { return seconds.count(cls) > 0; }
  // A class it does not know keeps its blocks for ever (gc never removes what it cannot judge).
  int64_t of(const std::string& cls) const;
  std::vector<std::string> classes() const;
};

inline constexpr const char* kDefaultTrafficClass = "chat";

// Parses "name=N[s|m|h|d],..." over the defaults; throws on a malformed spec.
Retention parse_retention(const std::string& spec);
std::string format_duration(int64_t seconds);  // "7d", "90m", "45s"

}  // namespace beluga::kv
