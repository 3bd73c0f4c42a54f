// Logprobs over HTTP against a scripted engine: Chat Completions' logprobs (non-streamed, and streamed
// alongside their deltas), Completions' logprobs (with echo covering the prompt), vLLM's
// prompt_logprobs, and the validation of every logprobs parameter.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "server/server.h"
#include "server_test.h"

namespace beluga::server {
namespace {

using Json = nlohmann::json;
using testing::http_post;
using testing::parse_sse;
using testing::Reply;
using testing::ServerTest;

// The UTF-8 bytes a logprobs entry's "bytes" array holds.
std::string bytes_of(const Json& entry) {
  std::string s;
  for (const auto& b : entry["bytes"]) s += char(b.get<int>());
  return s;
}

// Checks one Chat Completions logprobs entry against the fake engine's values for position `pos`.
void check_chat_entry(const tok::Tokenizer& tok, const Json& e, int token, size_t pos, int k) {
  const std::string raw(tok.token_bytes(token));
  EXPECT_EQ(bytes_of(e), raw) << e;
  EXPECT_EQ(e["token"], token_text_of_bytes(raw)) << e;
  EXPECT_FLOAT_EQ(e["logprob"].get<float>(), testing::fake_logprob(pos)) << e;
  ASSERT_EQ(e["top_logprobs"].size(), size_t(k)) << e;
  const auto top = testing::fake_top(token, pos, k);
  for (int i = 0; i < k; ++i) {
    const Json& t = e["top_logprobs"][size_t(i)];
    const std::string tb(tok.token_bytes(top[size_t(i)].first));
    EXPECT_EQ(t["token"], token_text_of_bytes(tb)) << t;
    EXPECT_EQ(bytes_of(t), tb) << t;
    EXPECT_FLOAT_EQ(t["logprob"].get<float>(), top[size_t(i)].second) << t;
    EXPECT_EQ(t.size(), 3u) << t;
  }
}

TEST_F(ServerTest, ChatLogprobsNonStreamed) {
  const std::string text = "Hello wörld, 日本語 😀 goodbye.";
  set_text(text);
  start();
  const std::vector<int> ids = tokenizer_->encode(text, true);
  Reply r = http_post(port_, "/v1/chat/completions",
                      chat("hi", {{"max_tokens", 100}, {"logprobs", true}, {"top_logprobs", 3}}));
  ASSERT_EQ(r.status, 200) << r.body;
  EXPECT_EQ(engine_->last_sampling().logprobs, 3);
  const Json c = r.json()["choices"][0];
  EXPECT_EQ(c["message"]["content"], text);
  const Json& lp = c["logprobs"];
  ASSERT_TRUE(lp.is_object()) << c;
  EXPECT_TRUE(lp["refusal"].is_null());
  ASSERT_EQ(lp["content"].size(), ids.size()) << lp;
  std::string joined_bytes;
  for (size_t i = 0; i < ids.size(); ++i) {
    check_chat_entry(*tokenizer_, lp["content"][i], ids[i], i, 3);
    joined_bytes += bytes_of(lp["content"][i]);
  }
  EXPECT_EQ(joined_bytes, text);
  // Some token of the emoji / CJK text holds only part of a character: escaped text, raw bytes.
  bool partial = false;
  for (const auto& e : lp["content"]) partial = partial || e["token"].get<std::string>().find("\\x") == 0;
  EXPECT_TRUE(partial) << lp;

  // logprobs: true alone: the chosen tokens, empty top_logprobs.
  Reply z = http_post(port_, "/v1/chat/completions", chat("hi", {{"max_tokens", 100}, {"logprobs", true}}));
  ASSERT_EQ(z.status, 200) << z.body;
  EXPECT_EQ(engine_->last_sampling().logprobs, 0);
  const Json zc = z.json()["choices"][0]["logprobs"]["content"];
  ASSERT_EQ(zc.size(), ids.size());
  for (size_t i = 0; i < ids.size(); ++i) check_chat_entry(*tokenizer_, zc[i], ids[i], i, 0);

  // Not asked for: null, and the engine computes none.
  Reply n = http_post(port_, "/v1/chat/completions", chat("hi", {{"logprobs", false}}));
  ASSERT_EQ(n.status, 200) << n.body;
  EXPECT_TRUE(n.json()["choices"][0]["logprobs"].is_null());
  EXPECT_EQ(engine_->last_sampling().logprobs, -1);
}

TEST_F(ServerTest, ChatLogprobsStreamedFollowTheirDeltas) {
  set_text("Hello world, goodbye. And more.");
  start();
  const std::vector<int> ids = tokenizer_->encode("Hello world, goodbye.", true);
  Reply r = http_post(port_, "/v1/chat/completions",
                      chat("hi", {{"max_tokens", 100},
                                  {"stream", true},
                                  {"stop", " And"},
                                  {"logprobs", true},
                                  {"top_logprobs", 2}}));
  ASSERT_EQ(r.status, 200) << r.body;
  std::string text;
  std::vector<Json> entries;
  for (const auto& e : parse_sse(r.body)) {
    if (e.data == "[DONE]") continue;
    const Json ch = Json::parse(e.data)["choices"][0];
    const Json& lp = ch["logprobs"];
    if (ch["delta"].contains("role")) {
      EXPECT_TRUE(lp.is_null()) << ch;
      continue;
    }
    if (ch["delta"].contains("content")) {
      // Each content chunk carries exactly the tokens of its delta (no stop string pending here).
      ASSERT_TRUE(lp.is_object()) << ch;
      std::string delta_tokens;
      for (const auto& t : lp["content"]) {
        delta_tokens += t["token"].get<std::string>();
        entries.push_back(t);
      }
      EXPECT_EQ(delta_tokens, ch["delta"]["content"].get<std::string>()) << ch;
      text += ch["delta"]["content"].get<std::string>();
    } else if (lp.is_object()) {
      for (const auto& t : lp["content"]) entries.push_back(t);
    }
  }
  // Held text: the tokens of " And" (the stop string) were generated; their logprobs come with the
  // final chunk, while the text stops before the stop string.
  EXPECT_EQ(text, "Hello world, goodbye.");
  ASSERT_GE(entries.size(), ids.size());
  for (size_t i = 0; i < ids.size(); ++i) check_chat_entry(*tokenizer_, entries[i], ids[i], i, 2);

  // The non-streamed response carries the same entries.
  Reply n =
      http_post(port_, "/v1/chat/completions",
                chat("hi", {{"max_tokens", 100}, {"stop", " And"}, {"logprobs", true}, {"top_logprobs", 2}}));
  ASSERT_EQ(n.status, 200) << n.body;
  EXPECT_EQ(n.json()["choices"][0]["logprobs"]["content"], Json(entries));
}

// The first choice of each streamed completions chunk, in order ([DONE] skipped).
std::vector<Json> stream_choices(const std::string& sse_body) {
  std::vector<Json> out;
  for (const auto& e : parse_sse(sse_body))
    if (e.data != "[DONE]") out.push_back(Json::parse(e.data)["choices"][0]);
  return out;
}

// The legacy completions logprobs of streamed chunks, concatenated array by array.
Json concat_logprobs(const std::vector<Json>& chunks) {
  Json all{{"tokens", Json::array()},
           {"token_logprobs", Json::array()},
           {"top_logprobs", Json::array()},
           {"text_offset", Json::array()}};
  for (const Json& ch : chunks)
    for (auto& [k, v] : ch["logprobs"].items())
      for (const auto& x : v) all[k].push_back(x);
  return all;
}

TEST_F(ServerTest, CompletionsLogprobs) {
  const std::string text = "def f(x):\n    return x";
  set_text(text);
  start();
  const std::vector<int> ids = tokenizer_->encode(text, true);
  auto check = [&](const Json& lp, size_t echo_chars) {
    ASSERT_EQ(lp["tokens"].size(), ids.size()) << lp;
    ASSERT_EQ(lp["token_logprobs"].size(), ids.size());
    ASSERT_EQ(lp["top_logprobs"].size(), ids.size());
    ASSERT_EQ(lp["text_offset"].size(), ids.size());
    size_t offset = echo_chars;
    std::string joined;
    for (size_t i = 0; i < ids.size(); ++i) {
      const std::string tok_text(tokenizer_->token_bytes(ids[i]));
      EXPECT_EQ(lp["tokens"][i], tok_text);
      EXPECT_FLOAT_EQ(lp["token_logprobs"][i].get<float>(), testing::fake_logprob(i));
      EXPECT_EQ(lp["text_offset"][i], offset) << i;
      offset += tok_text.size();  // ASCII text: bytes = code points
      joined += tok_text;
      const Json& top = lp["top_logprobs"][i];
      ASSERT_TRUE(top.is_object());
      ASSERT_EQ(top.size(), 2u) << top;
      for (const auto& [t, l] : testing::fake_top(ids[i], i, 2)) {
        const std::string key(tokenizer_->token_bytes(t));
        ASSERT_TRUE(top.contains(key)) << top;
        EXPECT_FLOAT_EQ(top[key].get<float>(), l);
      }
    }
    EXPECT_EQ(joined, text);
  };
  Json body{{"model", "demo"}, {"prompt", "Say: "}, {"max_tokens", 50}, {"logprobs", 2}};
  Reply r = http_post(port_, "/v1/completions", body);
  ASSERT_EQ(r.status, 200) << r.body;
  EXPECT_EQ(engine_->last_sampling().logprobs, 2);
  EXPECT_EQ(r.json()["choices"][0]["text"], text);
  check(r.json()["choices"][0]["logprobs"], 0);

  // Streamed: the chunks' arrays concatenated equal the non-streamed ones.
  body["stream"] = true;
  Reply s = http_post(port_, "/v1/completions", body);
  ASSERT_EQ(s.status, 200) << s.body;
  const std::vector<Json> chunks = stream_choices(s.body);
  for (const Json& ch : chunks) {
    ASSERT_TRUE(ch["logprobs"].is_object()) << ch;
    std::string chunk_tokens;
    for (const auto& t : ch["logprobs"]["tokens"]) chunk_tokens += t.get<std::string>();
    EXPECT_EQ(chunk_tokens, ch["text"].get<std::string>()) << ch;
  }
  check(concat_logprobs(chunks), 0);

  // Echo: the prompt's tokens lead (CompletionsEchoLogprobsCoverThePrompt); the generated tokens'
  // offsets count from the end of the echoed prompt.
  Reply e = http_post(
      port_, "/v1/completions",
      Json{{"model", "demo"}, {"prompt", "Say: "}, {"echo", true}, {"max_tokens", 50}, {"logprobs", 2}});
  ASSERT_EQ(e.status, 200) << e.body;
  const size_t prompt_len = engine_->prompts().back().size();
  const Json elp = e.json()["choices"][0]["logprobs"];
  Json generated = Json::object();
  for (auto& [k, v] : elp.items()) {
    ASSERT_EQ(v.size(), prompt_len + ids.size()) << k;
    generated[k] = Json(std::vector<Json>(v.begin() + std::ptrdiff_t(prompt_len), v.end()));
  }
  check(generated, 5);

  // Not asked for: null.
  Reply n = http_post(port_, "/v1/completions", Json{{"model", "demo"}, {"prompt", "Say: "}});
  ASSERT_EQ(n.status, 200);
  EXPECT_TRUE(n.json()["choices"][0]["logprobs"].is_null());
  EXPECT_EQ(engine_->last_sampling().logprobs, -1);
}

// Completions with echo and logprobs, as OpenAI answers: the logprobs cover the prompt's tokens (the
// first with null token_logprobs and top_logprobs entries), then the generated ones; streamed, the
// echoed prompt and its logprobs come in the first chunk.
TEST_F(ServerTest, CompletionsEchoLogprobsCoverThePrompt) {
  const std::string text = "Hi there.";
  set_text(text);
  start();
  const std::vector<int> gen = tokenizer_->encode(text, true);
  Json body{{"model", "demo"}, {"prompt", "Say: "}, {"echo", true}, {"max_tokens", 50}, {"logprobs", 2}};
  Reply r = http_post(port_, "/v1/completions", body);
  ASSERT_EQ(r.status, 200) << r.body;
  EXPECT_EQ(engine_->last_sampling().prompt_logprobs, 2);   // the engine computes them for echo
  const std::vector<int> pids = engine_->prompts().back();  // BOS, then "Say: "
  ASSERT_GE(pids.size(), 3u);
  EXPECT_EQ(pids[0], 0);
  auto token_text = [&](int id) { return token_text_of_bytes(tokenizer_->token_bytes(id)); };
  auto check_prompt_part = [&](const Json& lp) {
    ASSERT_GE(lp["tokens"].size(), pids.size()) << lp;
    int64_t offset = 0;
    for (size_t i = 0; i < pids.size(); ++i) {
      EXPECT_EQ(lp["tokens"][i], token_text(pids[i])) << i;
      EXPECT_EQ(lp["text_offset"][i], offset) << i;
      if (i > 0) offset += int64_t(token_text(pids[i]).size());  // ASCII; the BOS adds no text
      if (i == 0) {
        EXPECT_TRUE(lp["token_logprobs"][i].is_null()) << lp;
        EXPECT_TRUE(lp["top_logprobs"][i].is_null()) << lp;
        continue;
      }
      const TokenLogprob want = testing::fake_prompt_logprob(pids, i, 2);
      EXPECT_FLOAT_EQ(lp["token_logprobs"][i].get<float>(), want.logprob) << i;
      const Json& top = lp["top_logprobs"][i];
      ASSERT_EQ(top.size(), 2u) << top;
      for (const auto& [t, l] : want.top) EXPECT_FLOAT_EQ(top[token_text(t)].get<float>(), l) << top;
    }
    EXPECT_EQ(offset, 5);
    // The generated tokens follow, from the end of the echo.
    ASSERT_EQ(lp["tokens"].size(), pids.size() + gen.size()) << lp;
    EXPECT_EQ(lp["text_offset"][pids.size()], 5);
    EXPECT_EQ(lp["tokens"][pids.size()], token_text(gen[0]));
    EXPECT_FLOAT_EQ(lp["token_logprobs"][pids.size()].get<float>(), testing::fake_logprob(0));
  };
  const Json c = r.json()["choices"][0];
  EXPECT_EQ(c["text"], "Say: " + text);
  check_prompt_part(c["logprobs"]);
  EXPECT_FALSE(c.contains("prompt_logprobs")) << c;  // vLLM's field only when asked for

  // Streamed: the first chunk is the echo with the prompt's logprobs; all chunks together equal the
  // non-streamed logprobs.
  body["stream"] = true;
  Reply s = http_post(port_, "/v1/completions", body);
  ASSERT_EQ(s.status, 200) << s.body;
  const std::vector<Json> chunks = stream_choices(s.body);
  ASSERT_FALSE(chunks.empty());
  EXPECT_EQ(chunks[0]["text"], "Say: ") << chunks[0];
  EXPECT_EQ(chunks[0]["logprobs"]["tokens"].size(), pids.size()) << chunks[0];
  const Json all = concat_logprobs(chunks);
  check_prompt_part(all);
  EXPECT_EQ(all, c["logprobs"]);

  // Echo alone, or logprobs alone: no prompt logprobs are computed.
  body.erase("stream");
  body.erase("logprobs");
  ASSERT_EQ(http_post(port_, "/v1/completions", body).status, 200);
  EXPECT_EQ(engine_->last_sampling().prompt_logprobs, -1);
  body.erase("echo");
  body["logprobs"] = 1;
  ASSERT_EQ(http_post(port_, "/v1/completions", body).status, 200);
  EXPECT_EQ(engine_->last_sampling().prompt_logprobs, -1);
}

// Checks vLLM's prompt_logprobs list against the fake engine's values for `prompt` with k alternatives.
void check_vllm_prompt_logprobs(const tok::Tokenizer& tok, const Json& pl, const std::vector<int>& prompt,
                                int k) {
  ASSERT_TRUE(pl.is_array()) << pl;
  ASSERT_EQ(pl.size(), prompt.size()) << pl;
  EXPECT_TRUE(pl[0].is_null()) << pl;
  for (size_t i = 1; i < prompt.size(); ++i) {
    const TokenLogprob want = testing::fake_prompt_logprob(prompt, i, k);
    const Json& d = pl[i];
    ASSERT_EQ(d.size(), size_t(k) + 1) << d;  // the prompt token, then k others
    const Json& self = d[std::to_string(prompt[i])];
    EXPECT_FLOAT_EQ(self["logprob"].get<float>(), want.logprob) << d;
    EXPECT_EQ(self["rank"], want.rank) << d;
    EXPECT_EQ(self["decoded_token"], token_text_of_bytes(tok.token_bytes(prompt[i]))) << d;
    for (int j = 0; j < k; ++j) {
      const auto [t, l] = want.top[size_t(j)];
      const Json& a = d[std::to_string(t)];
      EXPECT_FLOAT_EQ(a["logprob"].get<float>(), l) << d;
      EXPECT_EQ(a["rank"], j + 1) << d;
      EXPECT_EQ(a["decoded_token"], token_text_of_bytes(tok.token_bytes(t))) << d;
    }
  }
}

// vLLM's prompt_logprobs extension: completions carry it in each choice (its prompt's), chat on the
// response; absent unless asked for.
TEST_F(ServerTest, VllmPromptLogprobs) {
  set_text("Hi.");
  start();
  Reply r = http_post(port_, "/v1/completions",
                      Json{{"model", "demo"},
                           {"prompt", Json::array({"Say: ", "Go on"})},
                           {"n", 2},
                           {"max_tokens", 5},
                           {"prompt_logprobs", 1}});
  ASSERT_EQ(r.status, 200) << r.body;
  EXPECT_EQ(engine_->last_sampling().prompt_logprobs, 1);
  const auto prompts = engine_->prompts();
  ASSERT_GE(prompts.size(), 2u);
  const Json cs = r.json()["choices"];
  ASSERT_EQ(cs.size(), 4u);
  for (size_t i = 0; i < 4; ++i) {
    EXPECT_TRUE(cs[i]["logprobs"].is_null()) << cs[i];
    check_vllm_prompt_logprobs(*tokenizer_, cs[i]["prompt_logprobs"], prompts[prompts.size() - 2 + i / 2], 1);
  }

  Reply c = http_post(port_, "/v1/chat/completions", chat("hi", {{"prompt_logprobs", 0}, {"n", 2}}));
  ASSERT_EQ(c.status, 200) << c.body;
  EXPECT_EQ(engine_->last_sampling().prompt_logprobs, 0);
  const Json cj = c.json();
  check_vllm_prompt_logprobs(*tokenizer_, cj["prompt_logprobs"], engine_->prompts().back(), 0);
  for (const auto& ch : cj["choices"]) EXPECT_FALSE(ch.contains("prompt_logprobs")) << ch;
  EXPECT_TRUE(cj["choices"][0]["logprobs"].is_null());

  // Not asked for (or null): no field, nothing computed.
  Reply n = http_post(port_, "/v1/chat/completions", chat("hi", {{"prompt_logprobs", nullptr}}));
  ASSERT_EQ(n.status, 200) << n.body;
  EXPECT_FALSE(n.json().contains("prompt_logprobs")) << n.body;
  EXPECT_EQ(engine_->last_sampling().prompt_logprobs, -1);
  Reply m = http_post(port_, "/v1/completions", Json{{"model", "demo"}, {"prompt", "x"}});
  ASSERT_EQ(m.status, 200) << m.body;
  EXPECT_FALSE(m.json()["choices"][0].contains("prompt_logprobs")) << m.body;
}

TEST_F(ServerTest, LogprobsValidation) {
  start();
  auto status = [&](const std::string& path, const Json& body) {
    Reply r = http_post(port_, path, body);
    if (r.status == 400) {
      EXPECT_TRUE(r.json()["error"]["message"].is_string()) << r.body;
    }
    return r.status;
  };
  EXPECT_EQ(status("/v1/chat/completions", chat("hi", {{"top_logprobs", 2}})), 400);
  EXPECT_EQ(status("/v1/chat/completions", chat("hi", {{"logprobs", false}, {"top_logprobs", 2}})), 400);
  EXPECT_EQ(status("/v1/chat/completions", chat("hi", {{"logprobs", true}, {"top_logprobs", 21}})), 400);
  EXPECT_EQ(status("/v1/chat/completions", chat("hi", {{"logprobs", true}, {"top_logprobs", -1}})), 400);
  EXPECT_EQ(status("/v1/chat/completions", chat("hi", {{"logprobs", 3}})), 400);
  EXPECT_EQ(status("/v1/chat/completions", chat("hi", {{"logprobs", true}, {"top_logprobs", 20}})), 200);
  EXPECT_EQ(engine_->last_sampling().logprobs, 20);
  EXPECT_EQ(status("/v1/chat/completions", chat("hi", {{"logprobs", true}, {"top_logprobs", nullptr}})), 200);
  EXPECT_EQ(engine_->last_sampling().logprobs, 0);
  const Json p{{"model", "demo"}, {"prompt", "x"}};
  auto with = [&](Json v) {
    Json b = p;
    b["logprobs"] = std::move(v);
    return b;
  };
  EXPECT_EQ(status("/v1/completions", with(6)), 400);
  EXPECT_EQ(status("/v1/completions", with(-1)), 400);
  EXPECT_EQ(status("/v1/completions", with(true)), 400);
  EXPECT_EQ(status("/v1/completions", with(5)), 200);
  EXPECT_EQ(engine_->last_sampling().logprobs, 5);
  EXPECT_EQ(status("/v1/completions", with(0)), 200);
  EXPECT_EQ(engine_->last_sampling().logprobs, 0);
  // vLLM's prompt_logprobs: 0..20, not with stream.
  for (const std::string path : {"/v1/completions", "/v1/chat/completions"}) {
    auto plp = [&](Json v, bool stream = false) {
      Json b = path == "/v1/completions" ? p : chat("hi");
      b["prompt_logprobs"] = std::move(v);
      if (stream) b["stream"] = true;
      return b;
    };
    EXPECT_EQ(status(path, plp(-1)), 400) << path;
    EXPECT_EQ(status(path, plp(21)), 400) << path;
    EXPECT_EQ(status(path, plp("2")), 400) << path;
    EXPECT_EQ(status(path, plp(1.5)), 400) << path;
    EXPECT_EQ(status(path, plp(2, true)), 400) << path;
    EXPECT_EQ(status(path, plp(20)), 200) << path;
    EXPECT_EQ(engine_->last_sampling().prompt_logprobs, 20) << path;
  }
}

}  // namespace
}  // namespace beluga::server
