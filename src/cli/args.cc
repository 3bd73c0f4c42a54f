#include "cli/args.h"

#include <cstdlib>

#include "util/error.h"

namespace beluga::cli {

Args::Args(int argc, char** argv, const std::set<std::string>& flags) {
  for (int i = 0; i < argc; ++i) {
    std::string a = argv[i];
    if (a.rfind("--", 0) == 0) {
      std::string key = a.substr(2);
      auto eq = key.find('=');
      if (eq != std::string::npos) {
        values_[key.substr(0, eq)] = key.substr(eq + 1);
      } else if (flags.count(key)) {
        values_[key] = "true";
      } else {
        BELUGA_CHECK(i + 1 < argc, "option --", key, " needs a value");
        values_[key] = argv[++i];
      }
    } else {
      positional_.push_back(a);
    }
  }
}

std::optional<std::string> Args::get(const std::string& key) const {
  used_.insert(key);
  auto it = values_.find(key);
  if (it == values_.end()) return std::nullopt;
  return it->second;
}

std::string Args::get_or(const std::string& key, const std::string& def) const {
  auto v = get(key);
  return v ? *v : def;
}

std::string Args::require(const std::string& key) const {
  auto v = get(key);
  BELUGA_CHECK(v.has_value(), "missing required option --", key);
  return *v;
}

long Args::get_int(const std::string& key, long def) const {
  auto v = get(key);
  if (!v) return def;
  char* end = nullptr;
  long x = std::strtol(v->c_str(), &end, 10);
  BELUGA_CHECK(end && *end == '\0' && !v->empty(), "option --", key, " expects an integer, got '", *v, "'");
  return x;
}

double Args::get_double(const std::string& key, double def) const {
  auto v = get(key);
  if (!v) return def;
  char* end = nullptr;
  double x = std::strtod(v->c_str(), &end);
  BELUGA_CHECK(end && *end == '\0' && !v->empty(), "option --", key, " expects a number, got '", *v, "'");
  return x;
}

bool Args::has(const std::string& key) const {
  used_.insert(key);
  return values_.count(key) > 0;
}

void Args::check_all_used() const {
  for (const auto& [k, v] : values_) BELUGA_CHECK(used_.count(k), "unknown option --", k);
}

std::vector<int> parse_int_list(const std::string& s) {
  std::vector<int> out;
  size_t i = 0;
  while (i < s.size()) {
    size_t j = s.find(',', i);
    if (j == std::string::npos) j = s.size();
    std::string item = s.substr(i, j - i);
    char* end = nullptr;
    long v = std::strtol(item.c_str(), &end, 10);
    BELUGA_CHECK(!item.empty() && end && *end == '\0', "not an integer list: '", s, "'");
    out.push_back(static_cast<int>(v));
    i = j + 1;
  }
  return out;
}

}  // namespace beluga::cli
