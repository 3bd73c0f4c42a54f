// Prefill/decode disaggregation with real processes: `beluga router --prefill P --decode D` in front
// of a `beluga serve --role prefill` and a `beluga serve --role decode` (the demo model, one CPU
// thread each), against one colocated `beluga serve` given the same requests in the same order:
//  - greedy output and usage (prompt, cached and completion tokens) are identical for chat,
//    completions, responses and messages, and the prompt's KV really went P -> D (transfer metrics,
//    the decode engine's host-tier hits);
//  - with MTP speculation on every engine, the same (the blocks carry the MTP layer's KV);
//  - a killed prefill engine: requests still succeed, identical, computed by the decode engine;
//  - a dead decode engine: the KV transfer to it fails, the request is served by the other one,
//    identical, and the prefill engine holds no KV block afterwards;
//  - clients that disconnect at random points (during the prefill leg, mid-stream) leave no KV
//    block in use and no request in flight on either engine, and the next request is served.
#include <gtest/gtest.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <functional>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "../common/http_client.h"
#include "processes.h"

namespace beluga::router::testing {
namespace {

using Json = nlohmann::json;
using beluga::server::testing::http_get;
using beluga::server::testing::http_request;
using beluga::server::testing::metric_value;
using beluga::server::testing::Verb;

double metric(int port, const std::string& name) {
  return metric_value(http_get(port, "/metrics").body, name);
}

// The sample `name{labels}` (labels exactly as rendered after the model label), or -1.
double labelled(int port, const std::string& name, const std::string& labels) {
  const std::string page = http_get(port, "/metrics").body;
  const std::string key = name + "{model_name=\"beluga-demo-coder-mtp\"" + labels + "} ";
  const size_t at = page.find(key);
  return at == std::string::npos ? -1 : std::stod(page.substr(at + key.size()));
}

// Long enough for several 64-token blocks, with a shared head so later requests hit the cache.
const std::string kSystem =
    "You are a careful senior engineer. Review the code the user sends, point out bugs, race conditions, "
    "missing error handling and unclear names, then propose a corrected version with comments. Keep the "
    "answer short and concrete; never invent APIs that do not exist in the standard library.";

struct Call {
  std::string path;
  Json body;
};

std::vector<Call> calls_for(const std::string& question) {
  const Json msgs =
      Json::array({{{"role", "system"}, {"content", kSystem}}, {{"role", "user"}, {"content", question}}});
  return {
      {"/v1/chat/completions",
       {{"model", "beluga-demo-coder-mtp"}, {"messages", msgs}, {"max_tokens", 24}, {"temperature", 0}}},
      {"/v1/completions",
       {{"model", "beluga-demo-coder-mtp"},
        {"prompt", kSystem + "\n" + question},
        {"max_tokens", 24},
        {"temperature", 0}}},
      {"/v1/responses",
       {{"model", "beluga-demo-coder-mtp"},
        {"instructions", kSystem},
        {"input", question},
        {"max_output_tokens", 24},
        {"temperature", 0}}},
      {"/v1/messages",
       {{"model", "beluga-demo-coder-mtp"},
        {"system", kSystem},
        {"messages", Json::array({{{"role", "user"}, {"content", question}}})},
        {"max_tokens", 24},
        {"temperature", 0}}},
  };
}

// What must agree between the two deployments: the generated text and the token counts.
struct Outcome {
  std::string text;
  Json usage;
};

Outcome outcome(const std::string& path, const Json& j) {
  Outcome o;
  if (path == "/v1/chat/completions") {
    o.text = j["choices"][0]["message"]["content"].get<std::string>();
    o.usage = {j["usage"]["prompt_tokens"], j["usage"]["completion_tokens"],
               j["usage"]["prompt_tokens_details"]["cached_tokens"]};
  } else if (path == "/v1/completions") {
    o.text = j["choices"][0]["text"].get<std::string>();
    o.usage = {j["usage"]["prompt_tokens"], j["usage"]["completion_tokens"],
               j["usage"]["prompt_tokens_details"]["cached_tokens"]};
  } else if (path == "/v1/responses") {
    for (const auto& item : j["output"])
      if (item["type"] == "message") o.text += item["content"][0]["text"].get<std::string>();
    o.usage = {j["usage"]["input_tokens"], j["usage"]["output_tokens"],
               j["usage"]["input_tokens_details"]["cached_tokens"]};
  } else {
    o.text = j["content"][0]["text"].get<std::string>();
    o.usage = {j["usage"]["input_tokens"], j["usage"]["output_tokens"],
               j["usage"]["cache_read_input_tokens"]};
  }
  return o;
}

beluga::server::testing::HttpReply post(int port, const Call& c) {
  return http_request(port, Verb::post, c.path, c.body.dump(), {}, std::chrono::seconds(120));
}

// P, D (or two), the router and a colocated replica.
struct Fleet {
  std::unique_ptr<ChildProcess> prefill, colocated, router;
  std::vector<std::unique_ptr<ChildProcess>> decode;
  // `replica_extra`: flags for every engine (P, D and the colocated one); `decode_extra`: for D too.
  explicit Fleet(int decoders = 1, std::vector<std::string> router_extra = {},
                 const std::vector<std::string>& replica_extra = {},
                 const std::vector<std::string>& decode_extra = {}) {
    auto with = [&](std::vector<std::string> v, const std::vector<std::string>& more = {}) {
      v.insert(v.end(), replica_extra.begin(), replica_extra.end());
      v.insert(v.end(), more.begin(), more.end());
      return v;
    };
    prefill = start_replica(0, with({"--role", "prefill", "--kv-host-gb", "0.25"}));
    for (int i = 0; i < decoders; ++i)
      decode.push_back(start_replica(0, with({"--role", "decode", "--kv-host-gb", "0.25"}, decode_extra)));
    colocated = start_replica(0, with({}));
    std::vector<std::string> args = {"--prefill", prefill->url(), "--health-interval-ms", "200"};
    for (auto& d : decode) {
      args.push_back("--decode");
      args.push_back(d->url());
    }
    args.insert(args.end(), router_extra.begin(), router_extra.end());
    router = start_router({}, args);
  }
  bool up() const {
    if (prefill->port() == 0 || colocated->port() == 0 || router->port() == 0) return false;
    for (auto& d : decode)
      if (d->port() == 0) return false;
    // The router has learned every decode engine's KV address.
    return wait_for(
        [&] {
          const auto h = http_get(router->port(), "/health");
          return h.status == 200 && h.json().value("decode_kv_known", 0) == int(decode.size());
        },
        20);
  }
};

// `with_cached`: whether the caches of the two deployments saw the same requests before.
void expect_same(Fleet& f, const std::vector<Call>& calls, bool with_cached = true) {
  for (const auto& c : calls) {
    const auto a = post(f.router->port(), c);
    const auto b = post(f.colocated->port(), c);
    ASSERT_EQ(a.status, 200) << c.path << ": " << a.body;
    ASSERT_EQ(b.status, 200) << c.path << ": " << b.body;
    Outcome oa = outcome(c.path, a.json()), ob = outcome(c.path, b.json());
    EXPECT_EQ(oa.text, ob.text) << c.path;
    if (!with_cached) oa.usage[2] = ob.usage[2];
    EXPECT_EQ(oa.usage, ob.usage) << c.path << "\ndisaggregated: " << a.body << "\ncolocated: " << b.body;
    EXPECT_FALSE(oa.text.empty()) << c.path;
  }
}

TEST(Disaggregation, GreedyOutputAndUsageMatchOneColocatedEngineForEveryApi) {
  Fleet f;
  ASSERT_TRUE(f.up()) << f.router->log();
  expect_same(f, calls_for("def add(a, b): return a - b"));
  // Again with a shared system prompt: the prefill side's cache hits are the ones reported.
  expect_same(f, calls_for("for i in range(10): print(i"));
  const int p = f.prefill->port(), d = f.decode[0]->port();
  EXPECT_EQ(labelled(p, "beluga_kv_transfers_total", ",direction=\"sent\",result=\"failed\""), 0);
  EXPECT_GE(labelled(p, "beluga_kv_transfers_total", ",direction=\"sent\",result=\"ok\""), 8);
  EXPECT_GT(labelled(d, "beluga_kv_transfer_bytes_total", ",direction=\"received\""), 0);
  EXPECT_EQ(labelled(d, "beluga_kv_transfer_bytes_total", ",direction=\"received\""),
            labelled(p, "beluga_kv_transfer_bytes_total", ",direction=\"sent\""));
  // The decode engine found the prompts' blocks in its host tier (it computed only their tails).
  EXPECT_GT(metric_value(http_get(d, "/metrics").body,
                         "beluga_kv_hit_tokens_total{model_name=\"beluga-demo-coder-mtp\",tier=\"host\","
                         "traffic_class=\"chat\"}"),
            0);
  EXPECT_GE(metric_value(http_get(f.router->port(), "/metrics").body,
                         "beluga_router_prefills_total{result=\"ok\"}"),
            8);
  EXPECT_EQ(metric_value(http_get(f.router->port(), "/metrics").body,
                         "beluga_router_prefills_total{result=\"failed\"}"),
            0);
  EXPECT_EQ(metric(p, "beluga_kv_blocks_used"), 0);
  EXPECT_EQ(metric(d, "beluga_kv_blocks_used"), 0);
}

// MTP speculation on every engine (DeepSeek's decode instances draft with MTP): the prompt's KV
// blocks, their MTP layer included, go P -> D, and the decode engine's drafts give the colocated
// engine's greedy output.
TEST(Disaggregation, SpeculativeDecodeEngineMatchesAColocatedOne) {
  Fleet f(1, {}, {"--speculative-config", R"({"method":"mtp","num_speculative_tokens":2,"gating":"fixed"})"});
  ASSERT_TRUE(f.up()) << f.router->log();
  expect_same(f, calls_for("def add(a, b): return a - b"));
  const int p = f.prefill->port(), d = f.decode[0]->port();
  EXPECT_EQ(labelled(p, "beluga_kv_transfers_total", ",direction=\"sent\",result=\"failed\""), 0);
  EXPECT_GE(labelled(p, "beluga_kv_transfers_total", ",direction=\"sent\",result=\"ok\""), 4);
  EXPECT_GT(metric_value(http_get(d, "/metrics").body,
                         "beluga_kv_hit_tokens_total{model_name=\"beluga-demo-coder-mtp\",tier=\"host\","
                         "traffic_class=\"chat\"}"),
            0);
  EXPECT_GT(metric(d, "beluga_spec_decode_num_draft_tokens_total"), 0);
  EXPECT_GT(metric(d, "beluga_spec_decode_num_accepted_tokens_total"), 0);
  EXPECT_EQ(metric(p, "beluga_kv_blocks_used"), 0);
  EXPECT_EQ(metric(d, "beluga_kv_blocks_used"), 0);
}

// Only the decode engine speculates: its blocks carry the MTP layer, the prefill engine's do not,
// so their fingerprints differ and every transfer is refused; the decode engine computes each prompt
// itself and the output is still the colocated engine's.
TEST(Disaggregation, MismatchedSpeculationRefusesTransfersAndLosesNothing) {
  Fleet f(1, {}, {},
          {"--speculative-config", R"({"method":"mtp","num_speculative_tokens":2,"gating":"fixed"})"});
  ASSERT_TRUE(f.up()) << f.router->log();
  expect_same(f, calls_for("def add(a, b): return a - b"), false);
  const int p = f.prefill->port(), d = f.decode[0]->port();
  EXPECT_EQ(labelled(p, "beluga_kv_transfers_total", ",direction=\"sent\",result=\"ok\""), 0);
  EXPECT_GE(labelled(p, "beluga_kv_transfers_total", ",direction=\"sent\",result=\"failed\""), 4)
      << http_get(p, "/metrics").body;
  EXPECT_GT(metric(d, "beluga_spec_decode_num_draft_tokens_total"), 0);
  EXPECT_EQ(metric(p, "beluga_kv_blocks_used"), 0);
  EXPECT_EQ(metric(d, "beluga_kv_blocks_used"), 0);
}

TEST(Disaggregation, AKilledPrefillEngineLeavesTheDecodeEngineToComputeThePrompt) {
  Fleet f;
  ASSERT_TRUE(f.up()) << f.router->log();
  f.prefill->kill_now();
  expect_same(f, calls_for("while True: pass"));
  const std::string m = http_get(f.router->port(), "/metrics").body;
  EXPECT_GE(metric_value(m, "beluga_router_prefills_total{result=\"failed\"}") +
                metric_value(m, "beluga_router_prefills_total{result=\"skipped\"}"),
            4)
      << m;
  EXPECT_EQ(metric(f.decode[0]->port(), "beluga_kv_blocks_used"), 0);
}

TEST(Disaggregation, ADeadDecodeEngineFailsItsTransferAndTheOtherServes) {
  Fleet f(2, {"--eject-after", "100"});  // not ejected by health checks within the test: the KV send fails
  ASSERT_TRUE(f.up()) << f.router->log();
  f.decode[0]->kill_now();
  for (int round = 0; round < 2; ++round) expect_same(f, calls_for("x = [1, 2, 3]; print(x[3])"));
  EXPECT_EQ(metric(f.prefill->port(), "beluga_kv_blocks_used"), 0);
  EXPECT_EQ(metric(f.decode[1]->port(), "beluga_kv_blocks_used"), 0);
  EXPECT_EQ(metric(f.prefill->port(), "beluga_requests_in_flight"), 0);
}

// The decode balancer weighs each decode engine's KV usage (its /health): with no request of the
// router's in flight on either, the one whose KV is nearly full (its own clients' streams) is
// avoided, the other takes every request.
TEST(Disaggregation, ADecodeEngineWithItsKvNearlyFullIsAvoided) {
  auto prefill = start_replica(0, {"--role", "prefill", "--kv-host-gb", "0.25"});
  auto full = start_replica(0, {"--role", "decode", "--kv-host-gb", "0.25", "--num-kv-blocks", "32"});
  auto roomy = start_replica(0, {"--role", "decode", "--kv-host-gb", "0.25"});
  auto router = start_router({}, {"--prefill", prefill->url(), "--decode", full->url(), "--decode",
                                  roomy->url(), "--health-interval-ms", "100"});
  ASSERT_TRUE(wait_for(
      [&] {
        const auto h = http_get(router->port(), "/health");
        return h.status == 200 && h.json().value("decode_kv_known", 0) == 2;
      },
      20))
      << router->log() << full->log() << roomy->log();
  // Long streams straight to `full` (not through the router, so not in flight there) fill its KV.
  const std::string body = Json{{"model", "beluga-demo-coder-mtp"},
                                {"stream", true},
                                {"max_tokens", 1000},
                                {"ignore_eos", true},
                                {"messages", Json::array({{{"role", "user"}, {"content", "Count on."}}})}}
                               .dump();
  std::vector<int> streams;
  for (int i = 0; i < 4; ++i) streams.push_back(post_raw(full->port(), "/v1/chat/completions", body, 60000));
  const auto usage_seen = [&] {
    return replica_sample(router->port(), "beluga_router_replica_kv_usage", full->url());
  };
  ASSERT_TRUE(wait_for([&] { return usage_seen() >= 0.75; }, 60)) << usage_seen();
  const double full_before =
      replica_sample(router->port(), "beluga_router_replica_requests_total", full->url());
  const double roomy_before =
      replica_sample(router->port(), "beluga_router_replica_requests_total", roomy->url());
  for (int i = 0; i < 4; ++i) {
    const Call c{
        "/v1/chat/completions",
        Json{{"model", "beluga-demo-coder-mtp"},
             {"max_tokens", 4},
             {"messages", Json::array({{{"role", "user"}, {"content", "hi " + std::to_string(i)}}})}}};
    const auto r = post(router->port(), c);
    ASSERT_EQ(r.status, 200) << r.body;
  }
  // Its KV was still that full when the last request was routed (else this proved nothing).
  EXPECT_GE(usage_seen(), 0.75);
  EXPECT_EQ(replica_sample(router->port(), "beluga_router_replica_requests_total", full->url()), full_before);
  EXPECT_EQ(replica_sample(router->port(), "beluga_router_replica_requests_total", roomy->url()),
            roomy_before + 4);
  for (int fd : streams) close(fd);
  EXPECT_TRUE(wait_for([&] { return metric(full->port(), "beluga_kv_blocks_used") == 0; }, 30));
}

// A streamed chat request written on a raw socket, then the socket closed after `wait_ms` (or once
// `bytes` of the response arrived).
void leave_early(int port, int wait_ms, size_t bytes, int max_tokens) {
  const std::string body =
      Json{{"model", "beluga-demo-coder-mtp"},
           {"stream", true},
           {"max_tokens", max_tokens},
           {"ignore_eos", true},
           {"messages", Json::array({{{"role", "system"}, {"content", kSystem}},
                                     {{"role", "user"}, {"content", "Explain mutexes."}}})}}
          .dump();
  const int fd = post_raw(port, "/v1/chat/completions", body, std::max(1, wait_ms));
  ASSERT_GE(fd, 0);
  size_t got = 0;
  char buf[4096];
  while (got < bytes) {
    const ssize_t n = recv(fd, buf, sizeof(buf), 0);
    if (n <= 0) break;  // the wait is over (or the response ended)
    got += size_t(n);
  }
  close(fd);
}

TEST(Disaggregation, ClientsLeavingAtRandomPointsLeakNoBlocksOnEitherEngine) {
  Fleet f;
  ASSERT_TRUE(f.up()) << f.router->log();
  std::mt19937 rng(7);
  for (int i = 0; i < 16; ++i) {
    const int wait_ms = int(rng() % 400);  // before, during or after the prefill leg
    const size_t bytes = (rng() % 2) ? size_t(1) << 30 : size_t(200 + rng() % 3000);
    leave_early(f.router->port(), wait_ms, bytes, 400);
  }
  const int p = f.prefill->port(), d = f.decode[0]->port();
  EXPECT_TRUE(wait_for(
      [&] {
        return metric(p, "beluga_kv_blocks_used") == 0 && metric(d, "beluga_kv_blocks_used") == 0 &&
               metric(p, "beluga_requests_in_flight") == 0 && metric(d, "beluga_requests_in_flight") == 0;
      },
      30))
      << http_get(p, "/metrics").body << http_get(d, "/metrics").body;
  // Nothing hung: the next request is served, identically (the cached counts differ: only the
  // disaggregated side saw the requests that left).
  expect_same(f, {calls_for("int main() { return 0 }")[0]}, false);
}

}  // namespace
}  // namespace beluga::router::testing
