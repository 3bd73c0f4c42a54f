// `beluga serve` for the KV tier tests (tests/common/serve_process.h: the demo model, CPU, one
// thread, a free port, SIGKILL when the test has not ended it) and the few HTTP calls they make.
#pragma once

#include <sys/resource.h>

#include <sstream>
#include <string>
#include <vector>

#include "../common/http_client.h"
#include "../common/serve_process.h"

namespace beluga::kv::testing {

// `beluga serve` on the demo model (16 MB of KV cache) with `extra` flags; `fsize_limit` > 0: the
// child's RLIMIT_FSIZE (a file system that refuses large files).
inline beluga::testing::ChildProcess serve(const std::vector<std::string>& extra, rlim_t fsize_limit = 0) {
  beluga::testing::ChildOptions options;
  options.fsize_limit = fsize_limit;
  return beluga::testing::beluga_serve(beluga::testing::serve_flags(beluga::testing::demo_model(), 16, extra),
                                       options);
}

// A greedy legacy completion of token ids; the reply's JSON (null on a transport failure).
inline nlohmann::json complete(int port, const std::vector<int>& prompt, int max_tokens,
                               const std::string& traffic_class = "") {
  nlohmann::json body = {{"prompt", prompt}, {"max_tokens", max_tokens}, {"temperature", 0}};
  if (!traffic_class.empty()) body["traffic_class"] = traffic_class;
  const auto r = server::testing::http_post(port, "/v1/completions", body);
  if (r.status != 200) return nlohmann::json(nullptr);
  return r.json();
}

// The value of the sample of `name` whose labels contain every one of `labels` (e.g.
// "tier=\"disk\""), or -1 when there is none.
inline double sample(const std::string& page, const std::string& name,
                     const std::vector<std::string>& labels) {
  std::istringstream in(page);
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind(name, 0) != 0 ||
        (line.size() > name.size() && line[name.size()] != '{' && line[name.size()] != ' '))
      continue;
    bool all = true;
    for (const auto& l : labels) all = all && line.find(l) != std::string::npos;
    if (all) return std::stod(line.substr(line.rfind(' ') + 1));
  }
  return -1;
}

}  // namespace beluga::kv::testing
