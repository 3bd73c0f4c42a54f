#include "cli/args.h"

#include <cstdlib>

#include "util/error.h"

namespace beluga::cli {

namespace {

bool is_option(const std::string& a) {
  return a.size() > 2 && a.rfind("--", 0) == 0;
}

}  // namespace

Args::Args(int argc, char** argv, const std::set<std::string>& flags) {
  for (int i = 0; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "-h") a = "--help";
    if (is_option(a)) {
      std::string key = a.substr(2);
      auto eq = key.find('=');
      if (eq != std::string::npos) {
        BELUGA_CHECK(eq > 0, "malformed option '", a, "'");
        values_[key.substr(0, eq)] = key.substr(eq + 1);
      } else if (flags.count(key) || key == "help") {
        values_[key] = "true";
      } else {
        if (i + 1 < argc && !is_option(argv[i + 1]))
          values_[key] = argv[++i];
        else
          missing_value_.insert(key);  // an error when read, or as an unknown option if never read
      }
    } else {
      BELUGA_CHECK(a.empty() || a[0] != '-' || a.size() == 1 || (a[1] >= '0' && a[1] <= '9') || a[1] == '.',
                   "unknown option '", a, "' (options are spelled --name)");
      positional_.push_back(a);
    }
  }
}

Args Args::for_command(int argc, char** argv, std::string_view command) {
  const CommandUsage& usage = usage_of(command);
  Args a(argc, argv, usage.switches());
  if (usage.has_table()) a.table_ = usage.options();
  a.command_ = std::string(command);
  return a;
}

void Args::check_declared(const std::string& key) const {
  BELUGA_CHECK(!table_ || key == "help" || table_->count(key), "internal error: the command reads --", key,
               ", which its option table (src/cli/usage.cc) lacks");
}

void Args::taken(const std::string& key) const {
  check_declared(key);
  used_.insert(key);
}

void Args::not_with(std::initializer_list<const char*> keys, std::string_view why) const {
  for (const char* k : keys) BELUGA_CHECK(!has(k), "--", k, " does not apply ", why);
}

const std::vector<std::string>& Args::positional() const {
  positional_used_ = true;
  return positional_;
}

std::optional<std::string> Args::get(const std::string& key) const {
  check_declared(key);
  used_.insert(key);
  BELUGA_CHECK(!missing_value_.count(key), "option --", key, " needs a value");
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
  check_declared(key);
  used_.insert(key);
  return values_.count(key) > 0 || missing_value_.count(key) > 0;
}

std::string Args::unknown(const std::string& key) const {
  std::string msg = "unknown option --" + key;
  if (table_) {
    const std::string near = nearest_option(*table_, key);
    if (!near.empty()) msg += " (did you mean --" + near + "?)";
    msg += "; `beluga " + command_ + " --help` lists the options";
  }
  return msg;
}

void Args::check_all_used() const {
  if (table_)
    for (const auto& o : *table_)
      BELUGA_CHECK(used_.count(o), "internal error: `beluga ", command_, "` never reads --", o,
                   ", which its option table (src/cli/usage.cc) lists");
  for (const auto& [k, v] : values_) BELUGA_CHECK(used_.count(k), unknown(k));
  for (const auto& k : missing_value_) {
    BELUGA_CHECK(used_.count(k), unknown(k));
    fail("option --", k, " needs a value");  // has() asked, but the value is missing
  }
  BELUGA_CHECK(positional_used_ || positional_.empty(), "unexpected argument '", positional_.front(), "'");
}

bool wants_help(int argc, char** argv) {
  for (int i = 0; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--help" || a == "-h") return true;
  }
  return false;
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
