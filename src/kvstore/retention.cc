#include "kvstore/retention.h"

#include <cctype>
#include <limits>

#include "util/error.h"

namespace beluga::kv {

Retention::Retention() {
  seconds["chat"] = 7 * 86400;
  seconds["agent"] = 3 * 86400;
}

int64_t Retention::of(const std::string& cls) const {
  auto it = seconds.find(cls);
  return it == seconds.end() ? std::numeric_limits<int64_t>::max() : it->second;
}

std::vector<std::string> Retention::classes() const {
  std::vector<std::string> v;
  for (const auto& [k, s] : seconds) v.push_back(k);
  return v;
}

Retention parse_retention(const std::string& spec) {
  Retention r;
  size_t pos = 0;
  while (pos < spec.size()) {
    size_t end = spec.find(',', pos);
    if (end == std::string::npos) end = spec.size();
    const std::string item = spec.substr(pos, end - pos);
    pos = end + 1;
    const size_t eq = item.find('=');
    BELUGA_CHECK(eq != std::string::npos && eq > 0, "--kv-retention: expected class=DURATION, got '", item,
                 "'");
    const std::string name = item.substr(0, eq), dur = item.substr(eq + 1);
    for (char c : name)
      BELUGA_CHECK(std::isalnum(static_cast<unsigned char>(c)) || c == '-' || c == '_',
                   "--kv-retention: a class name is letters, digits, '-' and '_', got '", name, "'");
    BELUGA_CHECK(name.size() < 32, "--kv-retention: class name '", name, "' is longer than 31 characters");
    BELUGA_CHECK(dur.size() >= 2, "--kv-retention: '", item, "' needs a number and a unit (s, m, h, d)");
    const char unit = dur.back();
    const int64_t mult = unit == 's' ? 1 : unit == 'm' ? 60 : unit == 'h' ? 3600 : unit == 'd' ? 86400 : 0;
    BELUGA_CHECK(mult > 0, "--kv-retention: unknown unit '", std::string(1, unit), "' in '", item,
                 "' (s, m, h, d)");
    const std::string num = dur.substr(0, dur.size() - 1);
    for (char c : num)
      BELUGA_CHECK(c >= '0' && c <= '9', "--kv-retention: '", num, "' is not a whole number in '", item, "'");
    BELUGA_CHECK(num.size() <= 9, "--kv-retention: '", item, "' is too long a retention");
    r.seconds[name] = std::stoll(num) * mult;
  }
  return r;
}

std::string format_duration(int64_t s) {
  if (s == std::numeric_limits<int64_t>::max()) return "forever";
  if (s % 86400 == 0) return std::to_string(s / 86400) + "d";
  if (s % 3600 == 0) return std::to_string(s / 3600) + "h";
  if (s % 60 == 0) return std::to_string(s / 60) + "m";
  return std::to_string(s) + "s";
}

}  // namespace beluga::kv
