#include "router/config_file.h"

#include <fstream>
#include <sstream>

#include <nlohmann/json.hpp>

#include "util/error.h"

namespace beluga::router {

RouterConfigFile parse_router_config(const std::string& text, const std::set<std::string>& known,
                                     const std::string& origin) {
  const nlohmann::json j = nlohmann::json::parse(text, nullptr, false);
  BELUGA_CHECK(!j.is_discarded(), origin, ": not valid JSON");
  BELUGA_CHECK(j.is_object(), origin, ": expected a JSON object of options");
  RouterConfigFile cfg;
  for (const auto& [key, v] : j.items()) {
    if (key == "replicas" || key == "prefill" || key == "decode") {
      auto& list = key == "replicas" ? cfg.replicas : key == "prefill" ? cfg.prefill : cfg.decode;
      BELUGA_CHECK(v.is_array(), origin, ": \"", key, "\" must be a list of URLs");
      for (const auto& u : v) {
        BELUGA_CHECK(u.is_string(), origin, ": \"", key, "\" must be a list of URLs");
        list.push_back(u.get<std::string>());
      }
      continue;
    }
    BELUGA_CHECK(known.count(key), origin, ": unknown key \"", key,
                 "\" (the keys are `beluga router`'s options without the dashes, and \"replicas\", "
                 "\"prefill\", \"decode\")");
    if (v.is_string())
      cfg.options[key] = v.get<std::string>();
    else if (v.is_number_integer())
      cfg.options[key] = std::to_string(v.get<long long>());
    else if (v.is_number())
      cfg.options[key] = v.dump();
    else
      fail(origin, ": \"", key, "\" must be a string or a number");
  }
  return cfg;
}

RouterConfigFile load_router_config(const std::string& path, const std::set<std::string>& known) {
  std::ifstream f(path);
  BELUGA_CHECK(f.good(), "--config: cannot read ", path);
  std::stringstream ss;
  ss << f.rdbuf();
  return parse_router_config(ss.str(), known, path);
}

}  // namespace beluga::router
