// The ServerTest fixture shared by the HTTP server tests (server_http_test.cc, server_logprobs_test.cc,
// server_responses_test.cc): a Server on a free port (two I/O threads) in front of a FakeEngine whose
// sequences generate a settable text ("Hello world, goodbye." unless set_text changes it; control
// tokens' spellings are those tokens).
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "../common/http_client.h"
#include "fake_server.h"

namespace beluga::server::testing {

// A DeepSeek V3 tool call in the model's own tokens.
inline const std::string kToolText =
    "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>get_weather\n```json\n{\"city\": "
    "\"Paris\"}\n```"
    "<｜tool▁call▁end｜><｜tool▁calls▁end｜>";

using Reply = HttpReply;
using Headers = std::vector<std::pair<std::string, std::string>>;

class ServerTest : public FakeServerTest {
 protected:
  ServerTest() { set_text("Hello world, goodbye."); }
  void start(ServerConfig cfg = {}, int max_model_len = 512) {
    cfg.io_threads = 2;
    launch(cfg, Launch{.max_model_len = max_model_len});
  }
  Json chat(const std::string& content, Json extra = Json::object()) {
    Json b{{"model", "demo"}, {"messages", Json::array({Json{{"role", "user"}, {"content", content}}})}};
    for (auto& [k, v] : extra.items()) b[k] = v;
    return b;
  }
};

}  // namespace beluga::server::testing
