// A Server on a free port in front of a FakeEngine, with the demo model's tokenizer and chat
// encoder, for tests of the server's behaviour (routes, APIs, limits, health, drain).
#pragma once

#include <gtest/gtest.h>

#include <sys/socket.h>
#include <sys/time.h>

#include <cerrno>
#include <chrono>
#include <memory>
#include <mutex>
#include <string>

#include "../common/http_client.h"
#include "fake_engine.h"
#include "recipe/chat_format.h"
#include "server/server.h"
#include "tokenizer/tokenizer.h"

namespace beluga::server::testing {

using Json = nlohmann::json;

inline const std::string kModelDir = std::string(BELUGA_SOURCE_DIR) + "/models/beluga-demo-coder-mtp";

class FakeServerTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    tokenizer_ = new tok::Tokenizer(tok::Tokenizer::from_file(kModelDir + "/tokenizer.json"));
    encoder_ = new recipe::ChatEncoder(recipe::ChatEncoder::from_model_dir(kModelDir));
  }
  static void TearDownTestSuite() {
    delete tokenizer_;
    delete encoder_;
  }
  // How the server is launched (launch()).
  struct Launch {
    int max_seqs_per_request = 128;
    int max_model_len = 512;
    std::chrono::milliseconds step{1};  // the fake engine's time per token
    bool ready = true;  // false: no engine is set, as while the model loads (call make_ready())
  };
  // `text`: what every sequence generates (one token per `step`).
  void start(ServerConfig cfg = {}, int max_seqs_per_request = 128, std::string text = "Hello world.",
             std::chrono::milliseconds step = std::chrono::milliseconds(1)) {
    set_text(std::move(text));
    launch(cfg, Launch{max_seqs_per_request, 512, step, true});
  }
  void launch(ServerConfig cfg, Launch l) {
    engine_ = std::make_unique<FakeEngine>(
        [this](const EngineRequest&) {
          std::lock_guard lock(text_mu_);
          return tokenizer_->encode(text_, /*allow_special=*/true);
        },
        l.step);
    cfg.port = 0;
    server_ = std::make_unique<Server>(cfg);
    server_->listen();
    server_->start();
    info_ = ModelInfo{};
    info_.served_name = "demo";
    info_.tokenizer = tokenizer_;
    info_.encoder = encoder_;
    info_.max_model_len = l.max_model_len;
    info_.bos_token_id = 0;
    info_.max_seqs_per_request = l.max_seqs_per_request;
    if (l.ready) make_ready();
    port_ = server_->port();
  }
  void make_ready() { server_->set_engine(engine_.get(), info_); }
  // What every sequence generates from now on (control tokens' spellings are those tokens).
  void set_text(std::string t) {
    std::lock_guard lock(text_mu_);
    text_ = std::move(t);
  }
  void TearDown() override {
    if (server_) server_->stop();
    engine_.reset();
    server_.reset();
  }
  Json chat(Json extra = Json::object()) {
    Json b{{"model", "demo"}, {"messages", Json::array({Json{{"role", "user"}, {"content", "hi"}}})}};
    for (auto& [k, v] : extra.items()) b[k] = v;
    return b;
  }
  // A raw connection to the server (throws when connecting fails).
  RawConnection connect_raw() { return RawConnection::connect(port_); }
  // Reads until the server closes the connection or `limit` passes; true when it closed.
  static bool closed_by_server_within(RawConnection& s, std::chrono::seconds limit,
                                      std::string* got = nullptr) {
    timeval tv{static_cast<time_t>(limit.count()), 0};
    setsockopt(s.fd(), SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
    char buf[4096];
    const auto deadline = std::chrono::steady_clock::now() + limit;
    while (std::chrono::steady_clock::now() < deadline) {
      ssize_t n = ::recv(s.fd(), buf, sizeof(buf), 0);
      if (n == 0) return true;
      if (n < 0) return errno == ECONNRESET;
      if (got) got->append(buf, size_t(n));
    }
    return false;
  }

  inline static tok::Tokenizer* tokenizer_ = nullptr;
  inline static recipe::ChatEncoder* encoder_ = nullptr;
  std::mutex text_mu_;
  std::string text_;
  ModelInfo info_;
  std::unique_ptr<FakeEngine> engine_;
  std::unique_ptr<Server> server_;
  int port_ = 0;
};

}  // namespace beluga::server::testing
