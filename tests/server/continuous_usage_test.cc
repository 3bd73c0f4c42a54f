// Per-chunk token counts in OpenAI streams (vLLM's stream_options.continuous_usage_stats), and
// `beluga bench serve`, which relies on them to time each token: a chunk that carries several tokens
// (a multi-byte character split over byte-level tokens is sent only once it is complete) counts as
// several.
#include <array>
#include <cstdio>
#include <fstream>

#include "fake_server.h"

namespace beluga::server::testing {
namespace {

using namespace std::chrono_literals;

// A whale is several byte-level tokens in the demo tokenizer: no text until its last byte.
const std::string kText = "ab \xF0\x9F\x90\xB3 cd \xF0\x9F\x90\xB3\xF0\x9F\x90\xB3 e";

struct Chunk {
  std::string text;
  Json usage;
  bool finish = false;
};

std::vector<Chunk> stream_chunks(const std::string& body) {
  std::vector<Chunk> out;
  size_t p = 0;
  while ((p = body.find("data: ", p)) != std::string::npos) {
    const size_t e = body.find("\n\n", p);
    const std::string data = body.substr(p + 6, e - p - 6);
    p = e;
    if (data == "[DONE]") break;
    Json j = Json::parse(data);
    if (j["choices"].empty()) continue;  // the final usage chunk
    Chunk c;
    const Json& ch = j["choices"][0];
    if (ch.contains("text")) c.text = ch["text"].get<std::string>();
    if (ch.contains("delta") && ch["delta"].contains("content"))
      c.text = ch["delta"]["content"].get<std::string>();
    c.finish = !ch["finish_reason"].is_null();
    c.usage = j.contains("usage") ? j["usage"] : Json();
    out.push_back(std::move(c));
  }
  return out;
}

class ContinuousUsageTest : public FakeServerTest {
 protected:
  // `beluga bench serve ARGS` against the fake server: its exit status (-1 if it did not start), and
  // its stdout and stderr in *log.
  int bench_serve(const std::string& args, std::string* log) {
    const std::string cmd = std::string(BELUGA_BINARY) +
                            " bench serve --url http://127.0.0.1:" + std::to_string(port_) + " " + args +
                            " 2>&1";
    FILE* p = popen(cmd.c_str(), "r");
    if (!p) return -1;
    std::array<char, 4096> buf;
    size_t got;
    while ((got = fread(buf.data(), 1, buf.size(), p)) > 0) log->append(buf.data(), got);
    return pclose(p);
  }
};

TEST_F(ContinuousUsageTest, EveryChunkCountsTheTokensSoFar) {
  const size_t n = tokenizer_->encode(kText, false).size();
  ASSERT_GT(tokenizer_->encode("\xF0\x9F\x90\xB3", false).size(), 1u) << "the whale must span several tokens";
  start({}, 128, kText);
  for (const char* api : {"/v1/completions", "/v1/chat/completions"}) {
    Json body{{"model", "demo"}, {"max_tokens", 100}, {"stream", true}};
    if (std::string(api) == "/v1/completions")
      body["prompt"] = "hi";
    else
      body["messages"] = Json::array({Json{{"role", "user"}, {"content", "hi"}}});
    body["stream_options"] = {{"include_usage", true}, {"continuous_usage_stats", true}};
    HttpReply r = http_post(port_, api, body);
    ASSERT_EQ(r.status, 200) << r.body;
    std::string text;
    int64_t last = 0;
    int multi = 0;  // chunks that brought more than one token
    for (const Chunk& c : stream_chunks(r.body)) {
      text += c.text;
      if (c.text.empty() && !c.finish) continue;  // chat's opening role chunk: nothing generated yet
      ASSERT_TRUE(c.usage.is_object()) << api << ": a chunk without usage";
      const int64_t k = c.usage["completion_tokens"].get<int64_t>();
      EXPECT_GE(k, last) << api;
      multi += k - last > 1;
      EXPECT_EQ(c.usage["total_tokens"].get<int64_t>(), c.usage["prompt_tokens"].get<int64_t>() + k) << api;
      last = k;
    }
    EXPECT_EQ(text, kText) << api;
    EXPECT_EQ(last, int64_t(n)) << api;  // the last chunk has them all
    EXPECT_GT(multi, 0) << api;
    // Without continuous_usage_stats, text chunks keep usage null (only the final chunk has it).
    body["stream_options"] = {{"include_usage", true}};
    r = http_post(port_, api, body);
    ASSERT_EQ(r.status, 200);
    for (const Chunk& c : stream_chunks(r.body)) EXPECT_TRUE(c.usage.is_null()) << api;
  }
}

// bench serve: per-token ITL has one gap per generated token after the first of each request, more
// than the events; per-event ITL is still reported, and the report says the server counted them.
TEST_F(ContinuousUsageTest, BenchServeCountsEveryTokenOfAChunk) {
  const size_t n = tokenizer_->encode(kText, false).size();
  start({}, 128, kText, 10ms);
  const std::string out = ::testing::TempDir() + "/bench_serve_itl.json";
  std::remove(out.c_str());
  std::string log;
  ASSERT_EQ(
      bench_serve("--num-prompts 3 --max-concurrency 1 --input-len 8 --output-len 100 --out " + out, &log), 0)
      << log;
  std::ifstream f(out);
  const Json j = Json::parse(f);
  EXPECT_EQ(j["completed"], 3) << log;
  EXPECT_EQ(j["total_output_tokens"].get<size_t>(), 3 * n);
  EXPECT_EQ(j["itl_token_source"], "server usage");
  EXPECT_EQ(j["itl"]["n"].get<size_t>(), 3 * (n - 1));  // one per token after each first
  EXPECT_LT(j["itl_event"]["n"].get<size_t>(), j["itl"]["n"].get<size_t>());
  EXPECT_LT(j["itl"]["mean_ms"].get<double>(), j["itl_event"]["mean_ms"].get<double>());
  EXPECT_GT(j["tpot"]["mean_ms"].get<double>(), 0.0);
  EXPECT_NE(log.find("ITL/token"), std::string::npos) << log;
  std::remove(out.c_str());
}

// bench serve --random-range-ratio: each request's prompt length is drawn from [len (1 - r), len (1 + r)]
// (here 4..12 tokens for --input-len 8 at 0.5), so the requests differ; without it every prompt is 8.
TEST_F(ContinuousUsageTest, BenchServeRangeRatioVariesTheLengths) {
  start({}, 128, "ab", 1ms);
  const std::string out = ::testing::TempDir() + "/bench_serve_range.json";
  for (const char* ratio : {"0", "0.5"}) {
    std::remove(out.c_str());
    std::string log;
    ASSERT_EQ(bench_serve(std::string("--num-prompts 24 --max-concurrency 4 --input-len 8 --output-len 2 "
                                      "--random-range-ratio ") +
                              ratio + " --out " + out,
                          &log),
              0)
        << log;
    std::ifstream f(out);
    const Json j = Json::parse(f);
    ASSERT_EQ(j["completed"], 24) << log;
    const int64_t in = j["total_input_tokens"].get<int64_t>();
    if (std::string(ratio) == "0") {
      EXPECT_EQ(in, 24 * 8);
    } else {
      EXPECT_NE(in, 24 * 8) << "every prompt 8 tokens";
      EXPECT_GE(in, 24 * 4);
      EXPECT_LE(in, 24 * 12);
      EXPECT_EQ(j["random_range_ratio"].get<double>(), 0.5);
    }
  }
  std::string log;
  EXPECT_NE(bench_serve("--num-prompts 1 --random-range-ratio 1", &log), 0);
  EXPECT_NE(log.find("--random-range-ratio must be in [0, 1)"), std::string::npos) << log;
  std::remove(out.c_str());
}

// bench serve: a request the server refuses is reported with the server's own message (Boost 1.74's
// parser took `body_limit(boost::none)` for a limit of nothing, so every error read "body limit
// exceeded").
TEST_F(ContinuousUsageTest, BenchServeReportsTheServersErrorMessage) {
  start({}, 128, kText, 0ms);
  std::string log;
  ASSERT_NE(bench_serve("--num-prompts 1 --input-len 8 --output-len 4 --request-extra '{\"temperature\":-3}'",
                        &log),
            -1);
  EXPECT_NE(log.find("first error: HTTP 400"), std::string::npos) << log;
  EXPECT_NE(log.find("must be between 0.0 and 2.0"), std::string::npos) << log;
  EXPECT_NE(log.find("Failed requests:                         1"), std::string::npos) << log;
}

// bench serve: when the model list cannot be read (here: no API key), the error says why, with the
// server's status and message.
TEST_F(ContinuousUsageTest, BenchServeSaysWhyTheModelListIsUnreadable) {
  ServerConfig cfg;
  cfg.api_key = "k1";
  start(cfg, 128, kText, 0ms);
  std::string log;
  EXPECT_NE(bench_serve("--num-prompts 1", &log), 0) << log;
  EXPECT_NE(log.find("/v1/models: HTTP 401"), std::string::npos) << log;
  EXPECT_NE(log.find("invalid or missing API key"), std::string::npos) << log;
}

}  // namespace
}  // namespace beluga::server::testing
