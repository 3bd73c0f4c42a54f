// `beluga serve` on a DeepSeek-V4 checkpoint (tests/fixtures/dsv4-tiny, CPU) with the byte-level test
// tokenizer (tests/fixtures/dsv4-byte-tokenizer): the server picks the DeepSeek-V4 chat format from
// the model's config, a greedy completion over token ids decodes to transformers' greedy tokens, and a
// chat request's prompt is the V4 encoder's (its token count, not V3's).
#include <gtest/gtest.h>

#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "loader/safetensors.h"
#include "recipe/chat_format.h"
#include "tokenizer/tokenizer.h"

namespace beluga {
namespace {

using Json = nlohmann::json;
const std::string kDir = std::string(BELUGA_SOURCE_DIR) + "/tests/fixtures/";

// A `beluga serve` child on a free port (parsed from its log); killed when the test ends.
class Serve {
 public:
  explicit Serve(const std::vector<std::string>& extra) {
    char tmpl[] = "/tmp/beluga_v4_serve_XXXXXX";
    const int fd = mkstemp(tmpl);
    log_ = tmpl;
    std::vector<std::string> args = {BELUGA_BINARY,   "serve", "--port",          "0",   "--threads", "1",
                                     "--kv-cache-mb", "16",    "--max-model-len", "1024"};
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
    while (port_ == 0 && std::chrono::steady_clock::now() - t0 < std::chrono::seconds(60) &&
           waitpid(pid_, nullptr, WNOHANG) == 0) {
      const std::string l = log();
      const size_t at = l.find("beluga serve: serving ");
      const size_t p = at == std::string::npos ? at : l.find("http://127.0.0.1:", at);
      if (p != std::string::npos) port_ = std::atoi(l.c_str() + p + 17);
      if (port_ == 0) std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
  }
  ~Serve() {
    kill(pid_, SIGKILL);
    waitpid(pid_, nullptr, 0);
    unlink(log_.c_str());
  }
  int port() const { return port_; }
  std::string log() const {
    std::ifstream f(log_);
    std::stringstream ss;
    ss << f.rdbuf();
    return ss.str();
  }

 private:
  pid_t pid_ = -1;
  int port_ = 0;
  std::string log_;
};

// POST `body` to `path` on its own connection; {status, body}.
std::pair<int, std::string> post(int port, const std::string& path, const Json& body) {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(uint16_t(port));
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  timeval tv{60, 0};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  if (connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0) {
    close(fd);
    return {0, ""};
  }
  const std::string text = body.dump();
  const std::string req =
      "POST " + path + " HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n" +
      "Connection: close\r\nContent-Length: " + std::to_string(text.size()) + "\r\n\r\n" + text;
  for (size_t off = 0; off < req.size();) {
    const ssize_t n = send(fd, req.data() + off, req.size() - off, MSG_NOSIGNAL);
    if (n <= 0) break;
    off += size_t(n);
  }
  std::string out;
  char buf[8192];
  for (ssize_t n; (n = recv(fd, buf, sizeof(buf), 0)) > 0;) out.append(buf, size_t(n));
  close(fd);
  if (out.rfind("HTTP/1.1 ", 0) != 0) return {0, out};
  const size_t b = out.find("\r\n\r\n");
  return {std::atoi(out.c_str() + 9), b == std::string::npos ? "" : out.substr(b + 4)};
}

std::vector<int> ids(const SafetensorsFile& f, const std::string& name) {
  const TensorInfo& t = f.get(name);
  const auto* p = static_cast<const int64_t*>(t.data);
  return std::vector<int>(p, p + t.nbytes / 8);
}

TEST(DeepseekV4Serve, CompletionsAndChatOnTheHybridCache) {
  const std::string tok_dir = kDir + "dsv4-byte-tokenizer";
  Serve srv({kDir + "dsv4-tiny", "--tokenizer", tok_dir});
  ASSERT_GT(srv.port(), 0) << srv.log();
  EXPECT_NE(srv.log().find("chat format deepseek-v4,"), std::string::npos) << srv.log();
  const tok::Tokenizer tokenizer = tok::Tokenizer::from_file(tok_dir + "/tokenizer.json");

  // Greedy over token ids: the text of transformers' greedy tokens (golden_test says for how many
  // steps each prompt's reference is stable: all 12 for prompt 1, 4 for prompt 3). Prompt 3 (300
  // tokens, through the HCA branch) runs twice; the second run takes its 4 full blocks (256 tokens)
  // from the prefix cache and continues from them to the same tokens.
  SafetensorsFile ref(kDir + "dsv4-tiny/reference.safetensors");
  for (const auto& [name, steps, runs] : {std::tuple{std::string("1"), size_t(12), 1}, {"3", size_t(4), 2}}) {
    const std::vector<int> prompt = ids(ref, "prompt_" + name), all = ids(ref, "greedy_" + name);
    const std::vector<int> greedy(all.begin(), all.begin() + long(steps));
    for (int run = 0; run < runs; ++run) {
      auto [status, body] =
          post(srv.port(), "/v1/completions",
               Json{{"prompt", prompt}, {"max_tokens", steps}, {"temperature", 0}, {"ignore_eos", true}});
      ASSERT_EQ(status, 200) << body;
      const Json j = Json::parse(body);
      EXPECT_EQ(j["choices"][0]["text"].get<std::string>(), tokenizer.decode(greedy))
          << "prompt " << name << " run " << run;
      EXPECT_EQ(j["usage"]["prompt_tokens"].get<size_t>(), prompt.size());
      EXPECT_EQ(j["usage"]["prompt_tokens_details"]["cached_tokens"].get<int>(), run == 0 ? 0 : 256) << body;
    }
  }

  // Chat: the prompt is the DeepSeek-V4 encoding of the conversation (its length differs from V3's).
  recipe::Conversation conv;
  recipe::Message m;
  m.content.push_back({recipe::ContentPart::Kind::kText, "Hello there, V4!", ""});
  conv.messages.push_back(m);
  const size_t v4 = recipe::ChatEncoder(recipe::ChatFormat::kDeepSeekV4).encode(conv).ids(tokenizer).size();
  const size_t v3 = recipe::ChatEncoder(recipe::ChatFormat::kDeepSeekV3).encode(conv).ids(tokenizer).size();
  ASSERT_NE(v4, v3);
  auto [status, body] =
      post(srv.port(), "/v1/chat/completions",
           Json{{"messages", Json::array({Json{{"role", "user"}, {"content", "Hello there, V4!"}}})},
                {"max_tokens", 6},
                {"temperature", 0}});
  ASSERT_EQ(status, 200) << body;
  const Json j = Json::parse(body);
  EXPECT_EQ(j["usage"]["prompt_tokens"].get<size_t>(), v4);
  EXPECT_GE(j["usage"]["completion_tokens"].get<int>(), 1);
  EXPECT_TRUE(j["choices"][0]["message"].contains("content")) << body;
}

}  // namespace
}  // namespace beluga
