// `beluga serve --speculative-config`: chat completions (greedy, n > 1, stop strings, a repeated
// prompt that hits the prefix cache) give the same text as a server without speculation, /metrics
// counts drafts, and a bad configuration or a model without MTP layers stops the server with a clear
// message.
#include <gtest/gtest.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <fstream>
#include <sstream>
#include <thread>

#include "http_client.h"

namespace beluga::server::testing {
namespace {

const std::string kDemo = std::string(BELUGA_SOURCE_DIR) + "/models/beluga-demo-coder-mtp";

// A `beluga serve` child on a free port (parsed from its log); killed when the test ends.
class Serve {
 public:
  explicit Serve(std::vector<std::string> extra, const std::string& model = kDemo) {
    char tmpl[] = "/tmp/beluga_spec_XXXXXX";
    const int fd = mkstemp(tmpl);
    log_ = tmpl;
    std::vector<std::string> args = {BELUGA_BINARY, "serve",     "--model", model,           "--port",
                                     "0",           "--threads", "1",       "--kv-cache-mb", "64"};
    args.insert(args.end(), extra.begin(), extra.end());
    pid_ = fork();
    if (pid_ == 0) {
      dup2(fd, 1);
      dup2(fd, 2);
      std::vector<char*> argv;
      for (auto& a : args) argv.push_back(a.data());
      argv.push_back(nullptr);
      execv(argv[0], argv.data());
      _exit(127);
    }
    close(fd);
    const auto t0 = std::chrono::steady_clock::now();
    while (std::chrono::steady_clock::now() - t0 < std::chrono::seconds(60) && port_ == 0 && alive()) {
      const std::string l = log();
      const size_t at = l.find("beluga serve: serving ");
      const size_t p = at == std::string::npos ? at : l.find("http://127.0.0.1:", at);
      if (p != std::string::npos)
        port_ = std::atoi(l.c_str() + p + 17);
      else
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
  }
  ~Serve() {
    if (alive()) {
      kill(pid_, SIGKILL);
      waitpid(pid_, nullptr, 0);
    }
    unlink(log_.c_str());
  }
  int port() const { return port_; }
  std::string log() const {
    std::ifstream f(log_);
    std::stringstream ss;
    ss << f.rdbuf();
    return ss.str();
  }
  bool alive() {
    if (exited_) return false;
    if (waitpid(pid_, &status_, WNOHANG) == pid_) exited_ = true;
    return !exited_;
  }
  int exit_code() {  // waits up to 60 s
    for (int i = 0; i < 3000 && alive(); ++i) std::this_thread::sleep_for(std::chrono::milliseconds(20));
    return exited_ && WIFEXITED(status_) ? WEXITSTATUS(status_) : -1;
  }

 private:
  pid_t pid_ = -1;
  int port_ = 0;
  bool exited_ = false;
  int status_ = 0;
  std::string log_;
};

nlohmann::json chat(int port, const std::string& text, nlohmann::json extra = nlohmann::json::object()) {
  nlohmann::json body = {
      {"messages", {{{"role", "user"}, {"content", text}}}}, {"max_tokens", 60}, {"temperature", 0}};
  body.update(extra);
  const HttpReply r = http_post(port, "/v1/chat/completions", body);
  EXPECT_EQ(r.status, 200) << r.body;
  return r.json();
}

std::vector<std::string> contents(const nlohmann::json& j) {
  std::vector<std::string> v;
  for (const auto& c : j["choices"])
    v.push_back(c["message"]["content"].get<std::string>() + "|" + c["finish_reason"].get<std::string>());
  return v;
}

TEST(SpecServe, ChatCompletionsMatchAServerWithoutSpeculation) {
  // Fixed gating: the draft counts below assume speculating steps (cost gating falls back to plain
  // decode on the CPU, where a verify step costs about 3x a plain one).
  Serve plain({});
  Serve spec({"--speculative-config", R"({"method":"mtp","num_speculative_tokens":2,"gating":"fixed"})"});
  ASSERT_GT(plain.port(), 0) << plain.log();
  ASSERT_GT(spec.port(), 0) << spec.log();
  const std::vector<std::string> asks = {
      "Write a Python function `read_json(path)`: Load a JSON file and return its contents.",
      "Write a Python function `chunks(items, n)`: Split a list into consecutive chunks of size n."};
  for (const auto& q : asks) {
    const auto base = contents(chat(plain.port(), q));
    ASSERT_EQ(base.size(), 1u);
    EXPECT_EQ(contents(chat(spec.port(), q)), base) << q;
    EXPECT_EQ(contents(chat(spec.port(), q)), base) << q << " (again: prefix cache hit)";
    const nlohmann::json n2 = {{"n", 2}};
    EXPECT_EQ(contents(chat(spec.port(), q, n2)), contents(chat(plain.port(), q, n2))) << q;
    // A stop string taken from the middle of the answer.
    const std::string text = base[0].substr(0, base[0].rfind('|'));
    ASSERT_GT(text.size(), 40u);
    const nlohmann::json stop = {{"stop", {text.substr(30, 3)}}};
    const auto want = contents(chat(plain.port(), q, stop));
    EXPECT_EQ(want[0].substr(want[0].rfind('|')), "|stop");
    EXPECT_EQ(contents(chat(spec.port(), q, stop)), want) << q;
  }
  const std::string m = http_get(spec.port(), "/metrics").body;
  EXPECT_GT(metric_value(m, "beluga_spec_decode_num_drafts_total"), 10) << m;
  EXPECT_GT(metric_value(m, "beluga_spec_decode_num_draft_tokens_total"), 10);
  EXPECT_GT(metric_value(m, "beluga_spec_decode_num_accepted_tokens_total"), 5);
  EXPECT_NE(m.find("beluga_spec_decode_accepted_per_position_total{model_name=\"beluga-demo-coder-mtp\","
                   "position=\"1\"}"),
            std::string::npos)
      << m;
  EXPECT_EQ(http_get(plain.port(), "/metrics").body.find("beluga_spec_decode"), std::string::npos);
}

TEST(SpecServe, BadConfigurationsStopTheServerWithAClearError) {
  {
    Serve s({"--speculative-config", R"({"method":"medusa","num_speculative_tokens":2})"});
    EXPECT_NE(s.exit_code(), 0);
    EXPECT_NE(s.log().find("unknown method \"medusa\""), std::string::npos) << s.log();
  }
  {
    Serve s({"--speculative-config", R"({"method":"mtp","num_speculative_tokens":1})"},
            std::string(BELUGA_SOURCE_DIR) + "/tests/fixtures/dsv3-tiny");
    EXPECT_NE(s.exit_code(), 0);
    EXPECT_NE(s.log().find("MTP module"), std::string::npos) << s.log();
  }
}

}  // namespace
}  // namespace beluga::server::testing
