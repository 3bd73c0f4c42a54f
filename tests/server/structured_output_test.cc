// Structured outputs through the request builder (server/request_builder.h, structured_output.h,
// grammar_cache.h): each API's spelling of a constraint yields a processor that enforces it (a valid
// instance's tokens pass the mask to an accepting end, an invalid one is stopped), unenforceable or
// malformed constraints are 400s naming the field and the refused keyword, compiles are cached by
// schema (once per schema, concurrently too), and the compile time limit is a 400, not a hang.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <thread>

#include "grammar/choice.h"
#include "grammar/compiled.h"
#include "recipe/chat_format.h"
#include "server/grammar_metrics.h"
#include "server/request_builder.h"
#include "tokenizer/tokenizer.h"

namespace beluga::server {
namespace {

using OJson = nlohmann::ordered_json;

const std::string kModelDir = std::string(BELUGA_SOURCE_DIR) + "/models/beluga-demo-coder-mtp";

class StructuredOutput : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    tok_ = new tok::Tokenizer(tok::Tokenizer::from_file(kModelDir + "/tokenizer.json"));
    enc_ = new recipe::ChatEncoder(recipe::ChatEncoder::from_model_dir(kModelDir));
    vocab_ = new std::shared_ptr<const grammar::TokenVocab>(
        std::make_shared<grammar::TokenVocab>(*tok_, std::vector<int>{1}));
  }
  static void TearDownTestSuite() {
    delete vocab_;
    delete enc_;
    delete tok_;
  }
  void SetUp() override { info_ = make_info(GrammarCacheOptions{}); }
  ModelInfo make_info(GrammarCacheOptions opt, const recipe::ChatEncoder* enc = nullptr) {
    ModelInfo info;
    info.served_name = "demo";
    info.tokenizer = tok_;
    info.encoder = enc ? enc : enc_;
    info.max_model_len = 512;
    info.bos_token_id = 0;
    info.grammars = std::make_shared<GrammarCache>(*vocab_, opt);
    return info;
  }
  BuiltRequest build(ServerApi api, const OJson& body) { return build_request(api, body.dump(), info_); }
  // The ApiError a body gets (fails the test when it builds).
  recipe::ApiError error_of(ServerApi api, const OJson& body, const ModelInfo* info = nullptr) {
    try {
      build_request(api, body.dump(), info ? *info : info_);
    } catch (const recipe::ApiError& e) {
      return e;
    }
    ADD_FAILURE() << "built without error: " << body.dump();
    return recipe::ApiError(recipe::Api::kChat, 0, "");
  }
  // Feeds `text`'s tokens through a fresh processor of `b`: whether every token passed the mask,
  // and whether the processor accepts at the end.
  static std::pair<bool, bool> run(const BuiltRequest& b, const std::string& text, bool special = false) {
    EXPECT_TRUE(b.logits_processor);
    if (!b.logits_processor) return {false, false};
    auto p = b.logits_processor();
    const int vocab = int(tok_->vocab_size()) + 40;  // padded logit rows, as a real model has
    std::vector<uint32_t> mask((size_t(vocab) + 31) / 32);
    for (int id : tok_->encode(text, special)) {
      p->fill_mask(mask.data(), vocab);
      if (!((mask[size_t(id) >> 5] >> (id & 31)) & 1)) return {false, false};
      p->accept(id);
    }
    p->fill_mask(mask.data(), vocab);
    for (int id = int(tok_->vocab_size()); id < vocab; ++id)
      EXPECT_FALSE((mask[size_t(id) >> 5] >> (id & 31)) & 1) << "padding id " << id << " allowed";
    return {true, p->is_accepting()};
  }
  static OJson chat(OJson extra) {
    OJson b = {{"model", "demo"}, {"messages", OJson::array({OJson{{"role", "user"}, {"content", "hi"}}})}};
    for (auto& [k, v] : extra.items()) b[k] = v;
    return b;
  }
  static OJson person_schema() {
    return OJson::parse(R"({"type":"object","properties":{"name":{"type":"string"},
      "age":{"type":"integer","minimum":0},"role":{"enum":["admin","user"]}},
      "required":["name","age"],"additionalProperties":false})");
  }

  static tok::Tokenizer* tok_;
  static recipe::ChatEncoder* enc_;
  static std::shared_ptr<const grammar::TokenVocab>* vocab_;
  ModelInfo info_;
};
tok::Tokenizer* StructuredOutput::tok_ = nullptr;
recipe::ChatEncoder* StructuredOutput::enc_ = nullptr;
std::shared_ptr<const grammar::TokenVocab>* StructuredOutput::vocab_ = nullptr;

TEST_F(StructuredOutput, ChatJsonSchemaIsEnforced) {
  BuiltRequest b =
      build(ServerApi::kChat,
            chat({{"response_format",
                   {{"type", "json_schema"},
                    {"json_schema", {{"name", "p"}, {"schema", person_schema()}, {"strict", true}}}}}}));
  EXPECT_EQ(run(b, R"({"name":"Ann","age":31,"role":"admin"})"), std::make_pair(true, true));
  EXPECT_EQ(run(b, R"({"age":31,"name":"Ann"})"), std::make_pair(true, true));
  EXPECT_EQ(run(b, R"({"name":"Ann"})").second, false);          // required "age" missing
  EXPECT_EQ(run(b, R"({"name":"Ann","age":-1})").first, false);  // below minimum
  EXPECT_EQ(run(b, R"({"name":"Ann","age":1,"x":1})").first, false);
  EXPECT_EQ(run(b, R"({"name":"Ann","age":1,"role":"root"})").first, false);
  EXPECT_EQ(run(b, "Sure! {").first, false);
}

TEST_F(StructuredOutput, TextFormatIsUnconstrained) {
  EXPECT_FALSE(build(ServerApi::kChat, chat({{"response_format", {{"type", "text"}}}})).logits_processor);
  EXPECT_FALSE(build(ServerApi::kChat, chat({})).logits_processor);
}

TEST_F(StructuredOutput, JsonObjectMeansAnyObject) {
  BuiltRequest b = build(ServerApi::kChat, chat({{"response_format", {{"type", "json_object"}}}}));
  EXPECT_EQ(run(b, R"({"a":[1,{"b":null}],"c":"d"})"), std::make_pair(true, true));
  EXPECT_EQ(run(b, "{}"), std::make_pair(true, true));
  EXPECT_FALSE(run(b, "[1]").first);
  EXPECT_FALSE(run(b, "\"s\"").first);
}

TEST_F(StructuredOutput, VllmChoiceIsOneOfTheStrings) {
  BuiltRequest b = build(ServerApi::kChat,
                         chat({{"structured_outputs", {{"choice", {"positive", "negative", "neutral"}}}}}));
  EXPECT_EQ(run(b, "negative"), std::make_pair(true, true));
  EXPECT_EQ(run(b, "neu"), std::make_pair(true, false));  // a prefix: allowed so far, not complete
  EXPECT_FALSE(run(b, "positively").first);
  EXPECT_FALSE(run(b, "maybe").first);
}

// vLLM's structured_outputs.regex (the whole reply matches) and .grammar (GBNF, or the Lark subset),
// through the regex and GBNF front ends, on chat and completions.
TEST_F(StructuredOutput, VllmRegexAndGrammarAreEnforced) {
  BuiltRequest r =
      build(ServerApi::kChat, chat({{"structured_outputs", {{"regex", "(cat|dog)s? [0-9]{1,3}"}}}}));
  EXPECT_EQ(run(r, "dogs 42"), std::make_pair(true, true));
  EXPECT_EQ(run(r, "cat 7"), std::make_pair(true, true));
  EXPECT_EQ(run(r, "cat "), std::make_pair(true, false));  // a prefix: allowed so far, not complete
  EXPECT_FALSE(run(r, "cow 1").first);
  EXPECT_FALSE(run(r, "cat 1234").first);
  const char* gbnf = "root ::= item (\",\" item)*\nitem ::= [a-c]+";
  OJson body = {{"model", "demo"}, {"prompt", "x"}, {"structured_outputs", {{"grammar", gbnf}}}};
  BuiltRequest g = build(ServerApi::kCompletions, body);
  EXPECT_EQ(run(g, "ab,c,abc"), std::make_pair(true, true));
  EXPECT_EQ(run(g, "ab,"), std::make_pair(true, false));
  EXPECT_FALSE(run(g, "ab,d").first);
  BuiltRequest lark =
      build(ServerApi::kChat, chat({{"structured_outputs", {{"grammar", "start: \"yes\" | \"no\""}}}}));
  EXPECT_EQ(run(lark, "no"), std::make_pair(true, true));
  EXPECT_FALSE(run(lark, "maybe").first);
}

TEST_F(StructuredOutput, VllmJsonAcceptsSchemaTextToo) {
  BuiltRequest b =
      build(ServerApi::kChat, chat({{"structured_outputs", {{"json", person_schema().dump()}}}}));
  EXPECT_EQ(run(b, R"({"name":"A","age":0})"), std::make_pair(true, true));
  EXPECT_FALSE(run(b, R"({"name":1})").first);
}

TEST_F(StructuredOutput, ResponsesTextFormat) {
  OJson body = {
      {"model", "demo"},
      {"input", "hi"},
      {"text", {{"format", {{"type", "json_schema"}, {"name", "p"}, {"schema", person_schema()}}}}}};
  BuiltRequest b = build(ServerApi::kResponses, body);
  EXPECT_EQ(run(b, R"({"name":"A","age":2})"), std::make_pair(true, true));
  EXPECT_FALSE(run(b, R"([])").first);
  body["text"]["format"] = {{"type", "json_object"}};
  EXPECT_EQ(run(build(ServerApi::kResponses, body), R"({"k":true})"), std::make_pair(true, true));
}

TEST_F(StructuredOutput, MessagesOutputConfigAndBetaOutputFormat) {
  OJson body = {{"model", "demo"},
                {"max_tokens", 64},
                {"messages", OJson::array({OJson{{"role", "user"}, {"content", "hi"}}})},
                {"output_config", {{"format", {{"type", "json_schema"}, {"schema", person_schema()}}}}}};
  EXPECT_EQ(run(build(ServerApi::kMessages, body), R"({"name":"A","age":2})"), std::make_pair(true, true));
  body.erase("output_config");
  body["output_format"] = {{"type", "json_schema"}, {"schema", person_schema()}};
  BuiltRequest b = build(ServerApi::kMessages, body);
  EXPECT_EQ(run(b, R"({"name":"A","age":2})"), std::make_pair(true, true));
  EXPECT_FALSE(run(b, R"({"name":"A","age":"2"})").first);
}

TEST_F(StructuredOutput, CompletionsTakeResponseFormatAndStructuredOutputs) {
  OJson body = {{"model", "demo"}, {"prompt", "x"}, {"structured_outputs", {{"choice", {"yes", "no"}}}}};
  EXPECT_EQ(run(build(ServerApi::kCompletions, body), "no"), std::make_pair(true, true));
  body.erase("structured_outputs");
  body["response_format"] = {{"type", "json_object"}};
  EXPECT_EQ(run(build(ServerApi::kCompletions, body), R"({"a":1})"), std::make_pair(true, true));
}

TEST_F(StructuredOutput, EverySequenceGetsItsOwnMatcher) {
  BuiltRequest b =
      build(ServerApi::kChat, chat({{"n", 2}, {"structured_outputs", {{"choice", {"ab", "cd"}}}}}));
  ASSERT_EQ(b.sampling.n, 2);
  auto p1 = b.logits_processor(), p2 = b.logits_processor();
  const int vocab = int(tok_->vocab_size());
  std::vector<uint32_t> mask((size_t(vocab) + 31) / 32);
  const std::vector<int> ab = tok_->encode("ab", false);
  for (int id : ab) p1->accept(id);
  EXPECT_TRUE(p1->is_accepting());
  EXPECT_FALSE(p2->is_accepting());  // untouched by p1's tokens
  const std::vector<int> cd = tok_->encode("cd", false);
  p2->fill_mask(mask.data(), vocab);
  EXPECT_TRUE((mask[size_t(cd[0]) >> 5] >> (cd[0] & 31)) & 1);
}

TEST_F(StructuredOutput, RefusedKeywordIsA400NamingIt) {
  OJson schema =
      OJson::parse(R"({"type":"object","properties":{"zip":{"type":"string","not":{"pattern":"^9"}}}})");
  recipe::ApiError e =
      error_of(ServerApi::kChat,
               chat({{"response_format",
                      {{"type", "json_schema"}, {"json_schema", {{"name", "z"}, {"schema", schema}}}}}}));
  EXPECT_EQ(e.status(), 400);
  EXPECT_EQ(e.body()["error"]["param"], "response_format.json_schema.schema");
  EXPECT_NE(e.body()["error"]["message"].get<std::string>().find("'not'"), std::string::npos)
      << e.body().dump();
  EXPECT_EQ(e.body()["error"]["code"], "unsupported_schema");

  OJson body = {
      {"model", "demo"},
      {"input", "hi"},
      {"text",
       {{"format", {{"type", "json_schema"}, {"name", "p"}, {"schema", {{"not", {{"multipleOf", 2}}}}}}}}}};
  e = error_of(ServerApi::kResponses, body);
  EXPECT_EQ(e.body()["error"]["param"], "text.format.schema");
  EXPECT_NE(e.body()["error"]["message"].get<std::string>().find("'not'"), std::string::npos);

  OJson msg = {
      {"model", "demo"},
      {"max_tokens", 8},
      {"messages", OJson::array({OJson{{"role", "user"}, {"content", "hi"}}})},
      {"output_config",
       {{"format", {{"type", "json_schema"}, {"schema", {{"type", "array"}, {"uniqueItems", true}}}}}}}};
  e = error_of(ServerApi::kMessages, msg);
  EXPECT_EQ(e.body()["type"], "error");
  const std::string m = e.body()["error"]["message"].get<std::string>();
  EXPECT_NE(m.find("output_config.format.schema"), std::string::npos) << m;
  EXPECT_NE(m.find("'uniqueItems'"), std::string::npos) << m;
}

TEST_F(StructuredOutput, MalformedConstraintsAre400s) {
  auto param = [&](ServerApi api, const OJson& body) {
    recipe::ApiError e = error_of(api, body);
    EXPECT_EQ(e.status(), 400) << body.dump();
    return e.body()["error"]["param"].get<std::string>();
  };
  EXPECT_EQ(param(ServerApi::kChat, chat({{"response_format", {{"type", "json_schema"}}}})),
            "response_format.json_schema");
  EXPECT_EQ(param(ServerApi::kChat, chat({{"response_format", {{"type", "yaml"}}}})), "response_format.type");
  EXPECT_EQ(param(ServerApi::kChat,
                  chat({{"response_format",
                         {{"type", "json_schema"}, {"json_schema", {{"name", "x"}, {"schema", 3}}}}}})),
            "response_format.json_schema.schema");
  EXPECT_EQ(param(ServerApi::kChat, chat({{"structured_outputs", {{"structural_tag", "{}"}}}})),
            "structured_outputs.structural_tag");
  EXPECT_EQ(param(ServerApi::kChat, chat({{"structured_outputs", {{"regex", "(ab"}}}})),
            "structured_outputs.regex");  // unbalanced group
  EXPECT_EQ(param(ServerApi::kChat, chat({{"structured_outputs", {{"regex", "(a)\\1"}}}})),
            "structured_outputs.regex");  // a backreference cannot be enforced
  EXPECT_EQ(param(ServerApi::kChat, chat({{"structured_outputs", {{"regex", ""}}}})),
            "structured_outputs.regex");
  EXPECT_EQ(param(ServerApi::kChat, chat({{"structured_outputs", {{"grammar", "root ::= \"a"}}}})),
            "structured_outputs.grammar");  // unterminated literal
  EXPECT_EQ(param(ServerApi::kChat,
                  chat({{"structured_outputs", {{"regex", "a"}, {"grammar", "root ::= \"a\""}}}})),
            "structured_outputs");  // two at once
  EXPECT_EQ(param(ServerApi::kChat, chat({{"structured_outputs", {{"choice", OJson::array()}}}})),
            "structured_outputs.choice");
  EXPECT_EQ(param(ServerApi::kChat, chat({{"structured_outputs", {{"choice", {"a", 1}}}}})),
            "structured_outputs.choice[1]");
  EXPECT_EQ(param(ServerApi::kChat, chat({{"structured_outputs", {{"json", "{not json"}}}})),
            "structured_outputs.json");
  EXPECT_EQ(param(ServerApi::kChat,
                  chat({{"structured_outputs", {{"json", {{"type", "object"}}}, {"choice", {"a"}}}}})),
            "structured_outputs");
  EXPECT_EQ(param(ServerApi::kChat, chat({{
                                              "response_format",
                                              {{"type", "json_object"}},
                                          },
                                          {"structured_outputs", {{"choice", {"a"}}}}})),
            "structured_outputs.choice");  // two constraints at once
  // Not a valid schema (a type name JSON Schema does not have).
  EXPECT_EQ(param(ServerApi::kChat, chat({{"structured_outputs", {{"json", {{"type", "strin"}}}}}})),
            "structured_outputs.json");
  // Combinations the grammar would break.
  EXPECT_EQ(
      param(ServerApi::kChat, chat({{"ignore_eos", true}, {"structured_outputs", {{"choice", {"a"}}}}})),
      "structured_outputs.choice");
  EXPECT_EQ(
      param(ServerApi::kChat, chat({{"min_tokens", 4}, {"response_format", {{"type", "json_object"}}}})),
      "response_format");
}

TEST_F(StructuredOutput, ThinkingAndMissingGrammarSupportAre400s) {
  const recipe::ChatEncoder v31 =
      recipe::ChatEncoder::from_model_dir(kModelDir, recipe::ChatFormat::kDeepSeekV31);
  ModelInfo info = make_info({}, &v31);
  recipe::ApiError e = error_of(
      ServerApi::kChat,
      chat({{"thinking", {{"type", "enabled"}}}, {"response_format", {{"type", "json_object"}}}}), &info);
  EXPECT_NE(e.body()["error"]["message"].get<std::string>().find("thinking"), std::string::npos);
  // Thinking off: the same format is fine.
  EXPECT_TRUE(
      build_request(ServerApi::kChat, chat({{"response_format", {{"type", "json_object"}}}}).dump(), info)
          .logits_processor);
  info.grammars.reset();
  e = error_of(ServerApi::kChat, chat({{"response_format", {{"type", "json_object"}}}}), &info);
  EXPECT_NE(e.body()["error"]["message"].get<std::string>().find("not available"), std::string::npos);
}

TEST_F(StructuredOutput, SchemaCompilesOncePerCanonicalText) {
  auto body = [&](OJson schema) {
    return chat({{"response_format",
                  {{"type", "json_schema"}, {"json_schema", {{"name", "s"}, {"schema", schema}}}}}});
  };
  build(ServerApi::kChat, body(person_schema()));
  build(ServerApi::kChat, body(person_schema()));
  build(ServerApi::kChat,
        chat({{"structured_outputs", {{"json", person_schema()}}}}));  // same schema, other field
  GrammarCache::Stats s = info_.grammars->stats();
  EXPECT_EQ(s.misses, 1u);
  EXPECT_EQ(s.hits, 2u);
  build(ServerApi::kChat, body(OJson{{"type", "array"}}));
  s = info_.grammars->stats();
  EXPECT_EQ(s.misses, 2u);
  EXPECT_EQ(s.entries, 2u);
  // A refusal is remembered too (a client retrying a bad schema costs no compile).
  OJson bad = {{"type", "string"}, {"not", {{"pattern", "^a"}}}};
  error_of(ServerApi::kChat, body(bad));
  error_of(ServerApi::kChat, body(bad));
  s = info_.grammars->stats();
  EXPECT_EQ(s.misses, 3u);
  EXPECT_EQ(s.refused, 1u);
}

TEST_F(StructuredOutput, CacheCountersReachMetrics) {
  build(ServerApi::kChat, chat({{"structured_outputs", {{"choice", {"a"}}}}}));
  build(ServerApi::kChat, chat({{"structured_outputs", {{"choice", {"a"}}}}}));
  const std::string m = render_grammar_metrics(*info_.grammars, "demo");
  EXPECT_NE(m.find("beluga_grammar_cache_misses_total{model_name=\"demo\"} 1\n"), std::string::npos) << m;
  EXPECT_NE(m.find("beluga_grammar_cache_hits_total{model_name=\"demo\"} 1\n"), std::string::npos) << m;
  EXPECT_NE(m.find("beluga_grammar_cache_entries{model_name=\"demo\"} 1\n"), std::string::npos) << m;
}

TEST_F(StructuredOutput, LeastRecentlyUsedGrammarIsEvicted) {
  info_ = make_info(GrammarCacheOptions{1, std::chrono::milliseconds(10'000)});
  auto choice = [&](const char* a) {
    build(ServerApi::kChat, chat({{"structured_outputs", {{"choice", {a}}}}}));
  };
  choice("a");
  choice("b");  // evicts "a"
  choice("b");
  choice("a");
  GrammarCache::Stats s = info_.grammars->stats();
  EXPECT_EQ(s.misses, 3u);
  EXPECT_EQ(s.hits, 1u);
  EXPECT_EQ(s.entries, 1u);
}

TEST_F(StructuredOutput, ConcurrentRequestsForOneSchemaShareOneCompile) {
  GrammarCache cache(*vocab_, {});
  std::atomic<int> compiles{0};
  auto compile = [&](GrammarCache::Deadline deadline) {
    compiles++;
    std::this_thread::sleep_for(std::chrono::milliseconds(100));  // hold the others in the wait
    return grammar::compile_until(grammar::choice_grammar({"x"}), *vocab_, deadline, {});
  };
  std::vector<std::thread> threads;
  std::vector<std::shared_ptr<const grammar::CompiledGrammar>> got(4);
  for (int i = 0; i < 4; ++i) threads.emplace_back([&, i] { got[size_t(i)] = cache.get("k", compile); });
  for (auto& t : threads) t.join();
  EXPECT_EQ(compiles.load(), 1);
  for (const auto& g : got) EXPECT_EQ(g, got[0]);
  EXPECT_EQ(cache.stats().misses, 1u);
}

TEST_F(StructuredOutput, CompileOverTheTimeLimitIsA400RememberedOnlyForAWhile) {
  // A schema whose compile takes far longer than 1 ms on this vocabulary: many enum-valued fields.
  OJson props = OJson::object();
  for (int i = 0; i < 60; ++i) {
    OJson e = OJson::array();
    for (int k = 0; k < 30; ++k) e.push_back("value_" + std::to_string(i) + "_" + std::to_string(k));
    props["field_" + std::to_string(i)] = {{"enum", e}};
  }
  OJson schema = {{"type", "object"}, {"properties", props}};
  OJson body = chat({{"structured_outputs", {{"json", schema}}}});
  // Remembered (an hour): the same schema again fails at once, without a second compile.
  info_ = make_info(GrammarCacheOptions{16, std::chrono::milliseconds(1), std::chrono::hours(1)});
  const auto t0 = std::chrono::steady_clock::now();
  recipe::ApiError e = error_of(ServerApi::kChat, body);
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_EQ(e.status(), 400);
  EXPECT_EQ(e.body()["error"]["code"], "grammar_compile_timeout") << e.body().dump();
  EXPECT_LT(s, 5.0) << "the time limit did not stop the compile";
  EXPECT_EQ(error_of(ServerApi::kChat, body).body()["error"]["code"], "grammar_compile_timeout");
  EXPECT_EQ(info_.grammars->stats().misses, 1u);
  // Not remembered (memory 0): a timeout depends on the load, so the next request compiles again.
  info_ = make_info(GrammarCacheOptions{16, std::chrono::milliseconds(1), std::chrono::milliseconds(0)});
  error_of(ServerApi::kChat, body);
  EXPECT_EQ(error_of(ServerApi::kChat, body).body()["error"]["code"], "grammar_compile_timeout");
  EXPECT_EQ(info_.grammars->stats().misses, 2u);
}

// The demo model writes DeepSeek V3 tool-call markup; a forced tool call is held to it.
TEST_F(StructuredOutput, ForcedToolCallFollowsTheMarkupAndTheSchema) {
  OJson tools = OJson::array();
  tools.push_back({{"type", "function"},
                   {"function",
                    {{"name", "get_weather"},
                     {"parameters", OJson::parse(R"({"type":"object","properties":{"city":{"type":"string"}},
                        "required":["city"],"additionalProperties":false})")}}}});
  tools.push_back({{"type", "function"}, {"function", {{"name", "now"}}}});  // no parameters: any object
  auto call = [](const std::string& name, const std::string& args) {
    return "<｜tool▁call▁begin｜>function<｜tool▁sep｜>" + name + "\n```json\n" + args +
           "\n```<｜tool▁call▁end｜>";
  };
  const std::string begin = "<｜tool▁calls▁begin｜>", end = "<｜tool▁calls▁end｜>";
  BuiltRequest req = build(ServerApi::kChat, chat({{"tools", tools}, {"tool_choice", "required"}}));
  EXPECT_EQ(run(req, begin + call("get_weather", R"({"city":"Paris"})") + end, true),
            std::make_pair(true, true));
  EXPECT_EQ(
      run(req, begin + call("now", "{}") + "\n" + call("get_weather", R"({"city":"Oslo"})") + end, true),
      std::make_pair(true, true));
  EXPECT_FALSE(run(req, begin + call("get_weather", R"({"town":"Paris"})") + end, true).first);
  EXPECT_FALSE(run(req, begin + call("get_time", "{}") + end, true).first);
  EXPECT_FALSE(run(req, "Sure, " + begin, true).first);  // no text before the calls
  // The markup spelled as ordinary text (special tokens off) is not a tool call.
  EXPECT_FALSE(run(req, begin, false).first);

  BuiltRequest named = build(
      ServerApi::kChat,
      chat({{"tools", tools}, {"tool_choice", {{"type", "function"}, {"function", {{"name", "now"}}}}}}));
  EXPECT_EQ(run(named, begin + call("now", R"({"tz":"UTC"})") + end, true), std::make_pair(true, true));
  EXPECT_FALSE(run(named, begin + call("get_weather", R"({"city":"Paris"})") + end, true).first);
  EXPECT_FALSE(
      run(named, begin + call("now", "{}") + call("now", "{}") + end, true).first);  // exactly one call

  // auto / none: not forced, not constrained.
  EXPECT_FALSE(build(ServerApi::kChat, chat({{"tools", tools}, {"tool_choice", "auto"}})).logits_processor);
  // Anthropic's "any" is "required".
  OJson msg = {{"model", "demo"},
               {"max_tokens", 64},
               {"messages", OJson::array({OJson{{"role", "user"}, {"content", "hi"}}})},
               {"tools", OJson::array({OJson{{"name", "now"}, {"input_schema", {{"type", "object"}}}}})},
               {"tool_choice", {{"type", "any"}}}};
  EXPECT_EQ(run(build(ServerApi::kMessages, msg), begin + call("now", "{}") + end, true),
            std::make_pair(true, true));

  // A tool schema that cannot be enforced: a 400 naming the keyword and the tool.
  tools[0]["function"]["parameters"]["properties"]["city"]["not"] = {{"pattern", "^x"}};
  recipe::ApiError e = error_of(ServerApi::kChat, chat({{"tools", tools}, {"tool_choice", "required"}}));
  EXPECT_EQ(e.body()["error"]["param"], "tools");
  const std::string m = e.body()["error"]["message"].get<std::string>();
  EXPECT_NE(m.find("'not'"), std::string::npos) << m;
  EXPECT_NE(m.find("get_weather"), std::string::npos) << m;
  // A second constraint besides the forced call.
  tools[0]["function"]["parameters"]["properties"]["city"].erase("not");
  e = error_of(
      ServerApi::kChat,
      chat({{"tools", tools}, {"tool_choice", "required"}, {"response_format", {{"type", "json_object"}}}}));
  EXPECT_EQ(e.body()["error"]["param"], "response_format");
}

}  // namespace
}  // namespace beluga::server
