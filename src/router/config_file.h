// `beluga router --config FILE`: a JSON object whose keys are the router's command-line options
// without the dashes ("policy", "balance-window", ...; "replicas", "prefill" and "decode" are lists of
// URLs), for fleets too large for a command line. Options given on the command line override the
// file's (a --replica, --prefill or --decode replaces that list). An unknown key, a value of the wrong type
// or bad JSON is an error naming the file and the key.
#pragma once

#include <map>
#include <set>
#include <string>
#include <vector>

namespace beluga::router {

struct RouterConfigFile {
  std::vector<std::string> replicas, prefill, decode;
  std::map<std::string, std::string> options;  // option name -> value, as the command line spells it
};

// `known` is the set of option names the caller reads (without the three lists). A value is a string, or a
// number (an integer is written without a fraction).
RouterConfigFile parse_router_config(const std::string& text, const std::set<std::string>& known,
                                     const std::string& origin);
RouterConfigFile load_router_config(const std::string& path, const std::set<std::string>& known);

}  // namespace beluga::router
