// The router's parts on their own: the cost function of each policy, the prefix index (matching,
// LRU bound, forgetting a replica), the circuit breaker's transitions, replica URLs, Responses ids,
// and that the router's prompt tokens (hence its block hashes) are the server's for every API.
#include <gtest/gtest.h>

#include <set>

#include <nlohmann/json.hpp>

#include "engine/block_manager.h"
#include "recipe/chat_format.h"
#include "router/circuit_breaker.h"
#include "router/error_reply.h"
#include "router/policy.h"
#include "router/prefix_index.h"
#include "router/prompt_tokens.h"
#include "router/replica.h"
#include "router/response_affinity.h"
#include "server/request_builder.h"
#include "tokenizer/tokenizer.h"
#include "util/error.h"

namespace beluga::router {
namespace {

const std::string kDemo = std::string(BELUGA_SOURCE_DIR) + "/models/beluga-demo-coder-mtp";

TEST(RouterPolicy, RoundRobinRotates) {
  std::vector<Candidate> c = {{0, 5, 0}, {1, 0, 3}, {2, 1, 0}};
  for (uint64_t t = 0; t < 6; ++t) {
    const Choice ch = choose(Policy::kRoundRobin, c, 256, {}, t);
    EXPECT_EQ(ch.index, size_t(t % 3));
    EXPECT_EQ(ch.decision, Decision::kRoundRobin);
  }
}

TEST(RouterPolicy, LeastLoadTakesFewestInFlightAndRotatesTies) {
  std::vector<Candidate> c = {{0, 2, 9}, {1, 1, 0}, {2, 1, 0}, {3, 4, 0}};
  std::set<size_t> picked;
  for (uint64_t t = 0; t < 8; ++t) {
    const Choice ch = choose(Policy::kLeastLoad, c, 256, {}, t);
    EXPECT_TRUE(ch.index == 1 || ch.index == 2) << ch.index;
    EXPECT_EQ(ch.decision, Decision::kLeastLoad);
    picked.insert(ch.index);
  }
  EXPECT_EQ(picked.size(), 2u);  // ties are spread, not always the first
}

TEST(RouterPolicy, CacheAwareKeepsAffinityWithinTheWindowThenSpills) {
  CostKnobs k;
  k.balance_window = 2;
  k.load_cost_tokens = 16;
  k.block_size = 64;
  // Replica 1 holds 4 of the prompt's 5 blocks; it is 2 above the least loaded: inside the window.
  std::vector<Candidate> c = {{0, 0, 0}, {1, 2, 4}, {2, 1, 1}};
  Choice ch = choose(Policy::kCacheAware, c, 320, k, 0);
  EXPECT_EQ(ch.index, 1u);
  EXPECT_EQ(ch.decision, Decision::kAffinity);
  EXPECT_DOUBLE_EQ(ch.cost, 320 - 4 * 64 + 16 * 2);
  // 3 above: outside the window; replica 2 (1 block, load 1) costs 256+16, replica 0 costs 320.
  c[1].in_flight = 3;
  ch = choose(Policy::kCacheAware, c, 320, k, 0);
  EXPECT_EQ(ch.index, 2u);
  EXPECT_EQ(ch.decision, Decision::kSpill);
  // Nobody holds anything: least load.
  std::vector<Candidate> none = {{0, 3, 0}, {1, 1, 0}, {2, 2, 0}};
  ch = choose(Policy::kCacheAware, none, 320, k, 7);
  EXPECT_EQ(ch.index, 1u);
  EXPECT_EQ(ch.decision, Decision::kLeastLoad);
  // The load cost can outweigh a short match inside the window.
  k.load_cost_tokens = 100;
  std::vector<Candidate> shortm = {{0, 0, 0}, {1, 2, 1}};
  ch = choose(Policy::kCacheAware, shortm, 320, k, 0);
  EXPECT_EQ(ch.index, 0u);
  EXPECT_EQ(ch.decision, Decision::kSpill);
}

TEST(RouterPolicy, Names) {
  for (Policy p : {Policy::kCacheAware, Policy::kRoundRobin, Policy::kLeastLoad})
    EXPECT_EQ(parse_policy(policy_name(p)), p);
  EXPECT_FALSE(parse_policy("random"));
}

std::vector<BlockHash> chain(const std::vector<int>& tokens, const std::string& salt) {
  return block_hashes(tokens, salt, tokens.size() / 64);
}

TEST(RouterPrefixIndex, MatchesLeadingBlocksPerReplica) {
  PrefixIndex idx(1000);
  std::vector<int> a(64 * 4), b(64 * 4);
  for (size_t i = 0; i < a.size(); ++i) a[i] = b[i] = int(i % 97);
  for (size_t i = 128; i < b.size(); ++i) b[i] = 5;  // b shares a's first two blocks
  idx.record(chain(a, "t"), 0);
  idx.record(chain(b, "t"), 2);
  std::vector<int> m;
  idx.match(chain(a, "t"), 3, m);
  EXPECT_EQ(m, (std::vector<int>{4, 0, 2}));
  idx.match(chain(b, "t"), 3, m);
  EXPECT_EQ(m, (std::vector<int>{2, 0, 4}));
  idx.match(chain(a, "other tenant"), 3, m);  // another salt names other blocks
  EXPECT_EQ(m, (std::vector<int>{0, 0, 0}));
  idx.forget(0);
  idx.match(chain(a, "t"), 3, m);
  EXPECT_EQ(m, (std::vector<int>{0, 0, 2}));
}

// match(since) counts only blocks routed at or after `since`: a prompt routed at t=1000 whose second
// half was routed again (to the same or another replica) at t=5000 matches 2 of 4 blocks from t=2000.
TEST(RouterPrefixIndex, SinceCountsOnlyRecentlyRoutedLeadingBlocks) {
  PrefixIndex idx(1000);
  std::vector<int> a(64 * 4);
  for (size_t i = 0; i < a.size(); ++i) a[i] = int(i % 89);
  const auto h = chain(a, "t");
  idx.record(h, 0, 1000);
  std::vector<int> m;
  idx.match(h, 2, m, 1000);
  EXPECT_EQ(m, (std::vector<int>{4, 0}));
  idx.match(h, 2, m, 1001);
  EXPECT_EQ(m, (std::vector<int>{0, 0})) << "routed before `since`";
  idx.record({h[0], h[1]}, 1, 5000);  // the leading two blocks again, to replica 1
  idx.match(h, 2, m, 2000);
  EXPECT_EQ(m, (std::vector<int>{2, 2})) << "recent leading blocks only; the stamp is per block";
  idx.match(h, 2, m);
  EXPECT_EQ(m, (std::vector<int>{4, 2})) << "no bound: everything routed";
}

TEST(RouterPrefixIndex, BoundedLeastRecentlyUsedFirst) {
  PrefixIndex idx(8);
  std::vector<std::vector<int>> prompts;
  for (int p = 0; p < 4; ++p) prompts.push_back(std::vector<int>(64 * 4, p + 1));
  for (int p = 0; p < 4; ++p) idx.record(chain(prompts[size_t(p)], ""), 1);
  EXPECT_EQ(idx.size(), 8u);
  std::vector<int> m;
  idx.match(chain(prompts[0], ""), 2, m);
  EXPECT_EQ(m[1], 0);  // the oldest prompts were dropped
  idx.match(chain(prompts[3], ""), 2, m);
  EXPECT_EQ(m[1], 4);
}

TEST(RouterBreaker, EjectsAfterNFailuresAndRejoinsThroughHalfOpen) {
  CircuitBreaker b(3);
  EXPECT_TRUE(b.allows_traffic());
  EXPECT_FALSE(b.on_failure());
  EXPECT_FALSE(b.on_failure());
  b.on_success();  // the count is of consecutive failures
  EXPECT_FALSE(b.on_failure());
  EXPECT_FALSE(b.on_failure());
  EXPECT_TRUE(b.on_failure());
  EXPECT_EQ(b.state(), BreakerState::kOpen);
  EXPECT_FALSE(b.allows_traffic());
  EXPECT_FALSE(b.on_failure());  // already open
  EXPECT_TRUE(b.on_success());   // a probe passed
  EXPECT_EQ(b.state(), BreakerState::kHalfOpen);
  EXPECT_TRUE(b.allows_traffic());
  EXPECT_TRUE(b.on_failure());  // one failure while half-open opens it again
  EXPECT_EQ(b.ejections(), 2u);
  b.on_success();
  b.on_success();
  EXPECT_EQ(b.state(), BreakerState::kClosed);
}

TEST(RouterReplica, Urls) {
  EXPECT_EQ(parse_replica_url("http://10.0.0.2:8000").url, "http://10.0.0.2:8000");
  EXPECT_EQ(parse_replica_url("localhost:9/v1").port, "9");
  EXPECT_THROW(parse_replica_url("https://x:1"), Error);
  EXPECT_THROW(parse_replica_url("http://x"), Error);
  EXPECT_THROW(parse_replica_url("http://x:99999"), Error);
}

TEST(RouterResponses, IdsAreFoundAndRemembered) {
  EXPECT_EQ(find_response_id(R"({"id":"resp_abc123","object":"response"})"), "resp_abc123");
  EXPECT_EQ(
      find_response_id("event: response.created\ndata: {\"type\":\"response.created\",\"response\":{\"id\":"
                       "\"resp_X9\",\"object\""),
      "resp_X9");
  EXPECT_EQ(find_response_id(R"({"id":"resp_cut)"), "");  // may continue in the next piece
  ResponseAffinity a(2);
  a.put("resp_1", 0);
  a.put("resp_2", 1);
  a.put("resp_3", 2);
  EXPECT_FALSE(a.get("resp_1"));
  EXPECT_EQ(a.get("resp_3"), 2);
}

TEST(RouterErrors, ShapesFollowTheApi) {
  auto chat = nlohmann::json::parse(error_body("/v1/chat/completions", 503, "x"));
  EXPECT_EQ(chat["error"]["message"], "x");
  auto msg = nlohmann::json::parse(error_body("/v1/messages", 502, "y"));
  EXPECT_EQ(msg["type"], "error");
  EXPECT_NE(stream_error_events("/v1/chat/completions", "z").find("data: [DONE]"), std::string::npos);
  EXPECT_EQ(stream_error_events("/v1/messages", "z").rfind("event: error\n", 0), 0u);
  EXPECT_EQ(stream_error_events("/v1/responses", "z").rfind("event: error\n", 0), 0u);
}

// The router hashes what the replica will cache only if it tokenizes exactly as the server does.
TEST(RouterPromptTokens, EqualTheServersForEveryApi) {
  const PromptModel pm = PromptModel::from_dir(kDemo);
  const tok::Tokenizer tokenizer = tok::Tokenizer::from_file(kDemo + "/tokenizer.json");
  const recipe::ChatEncoder encoder = recipe::ChatEncoder::from_model_dir(kDemo);
  server::ModelInfo info;
  info.served_name = "beluga-demo-coder-mtp";
  info.tokenizer = &tokenizer;
  info.encoder = &encoder;
  info.bos_token_id = 0;
  struct Case {
    GenerationRoute route;
    server::ServerApi api;
    std::string body;
  } cases[] = {
      {GenerationRoute::kChat, server::ServerApi::kChat,
       R"({"model":"beluga-demo-coder-mtp","n":2,"traffic_class":"agent","messages":[{"role":"system","content":"You write Python."},{"role":"user","content":"def add(a, b):"}]})"},
      {GenerationRoute::kCompletions, server::ServerApi::kCompletions,
       R"({"model":"beluga-demo-coder-mtp","prompt":"import os\nimport sys\n"})"},
      {GenerationRoute::kCompletions, server::ServerApi::kCompletions,
       R"({"model":"beluga-demo-coder-mtp","prompt":[5,6,7,8]})"},
      {GenerationRoute::kResponses, server::ServerApi::kResponses,
       R"({"model":"beluga-demo-coder-mtp","instructions":"Be brief.","input":"Sort a list in Python."})"},
      {GenerationRoute::kMessages, server::ServerApi::kMessages,
       R"({"model":"beluga-demo-coder-mtp","max_tokens":8,"system":"S","messages":[{"role":"user","content":[{"type":"text","text":"hi"}]}]})"},
  };
  for (const auto& c : cases) {
    const auto key = pm.key(c.route, c.body);
    const auto built = server::build_request(c.api, c.body, info);
    ASSERT_FALSE(built.prompts.empty());
    EXPECT_EQ(key.tokens, built.prompts[0]) << c.body;
    EXPECT_FALSE(key.tokens.empty());
  }
  EXPECT_TRUE(pm.key(GenerationRoute::kChat, "{not json").tokens.empty());
  EXPECT_EQ(pm.key(GenerationRoute::kResponses, R"({"input":"x","previous_response_id":"resp_7"})")
                .previous_response_id,
            "resp_7");
  EXPECT_EQ(generation_route("/v1/messages"), GenerationRoute::kMessages);
  EXPECT_FALSE(generation_route("/v1/models"));
}

}  // namespace
}  // namespace beluga::router
