// Block events end to end: `beluga router` in front of two real `beluga serve` replicas (the demo
// model, one CPU thread, a small device pool so that blocks get evicted, loopback, free ports).
// Prompts are sent to the replicas directly, past the router, so only the replicas' block events
// (GET /v1/kv/events) can tell the router where they are cached:
//  - the router sends a prompt to the replica that holds its longest prefix; once that replica has
//    evicted those blocks, or restarted (a new event epoch), it sends the prompt elsewhere;
//  - with a host-memory tier on one replica, the price of a host block decides between a long
//    match in host memory and a shorter one on the device (two routers, one knob apart);
//  - the replica serves its events in the documented shape, with a snapshot for a new reader;
//  - with a small file tier, the files it evicts leave the replica's snapshot and the router's index;
//  - with prefill-length buckets, short and long prompts go to their buckets' replicas.
#include <gtest/gtest.h>

#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <functional>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "../common/http_client.h"
#include "processes.h"

namespace beluga::router::testing {
namespace {

using Json = nlohmann::json;
using beluga::server::testing::http_get;
using beluga::server::testing::http_request;
using beluga::server::testing::Verb;

// Chat requests a replica answered 200, from its own /metrics.
double served_by(int replica_port) {
  const double n =
      sample(http_get(replica_port, "/metrics").body, "beluga_requests_total{api=\"chat\",status=\"200\"}");
  return std::max(0.0, n);  // absent before its first
}

// About `blocks` 64-token blocks of text particular to `tag`.
std::string text(const std::string& tag, int blocks) {
  std::string s;
  for (int i = 0; s.size() < size_t(blocks) * 64 * 3; ++i) s += tag + " rule " + std::to_string(i) + ".\n";
  return s;
}

// A system prompt shared by a tenant's requests, then a question: requests with the same system
// prompt and key share its blocks; a long question adds blocks only its own request has.
int chat(int port, const std::string& key, const std::string& system, const std::string& question) {
  Json body{{"model", "beluga-demo-coder-mtp"},
            {"messages", Json::array({{{"role", "system"}, {"content", system}},
                                      {{"role", "user"}, {"content", question}}})},
            {"max_tokens", 1},
            {"temperature", 0}};
  return http_request(port, Verb::post, "/v1/chat/completions", body.dump(),
                      {{"Authorization", "Bearer " + key}}, std::chrono::seconds(60))
      .status;
}

// Enough other tenants' prompts to push every earlier block out of a 40-block device pool.
void flood(int port, const std::string& tag) {
  for (int i = 0; i < 8; ++i)
    ASSERT_EQ(chat(port, tag + "-flood-" + std::to_string(i), text(tag + "f" + std::to_string(i), 6), "hi"),
              200);
}

// Until the router has read every replica's events: its count of non-empty pages for each has
// stopped growing for a few polls.
bool settled(int router_port, const std::vector<std::string>& urls) {
  std::string last;
  return wait_for(
      [&] {
        std::string now;
        bool read = true;
        for (const auto& u : urls) {
          const double p = replica_sample(router_port, "beluga_router_replica_kv_event_pages_total", u);
          read = read && p > 0;
          now += std::to_string(p) + ",";
        }
        const bool same = now == last;
        last = now;
        std::this_thread::sleep_for(std::chrono::milliseconds(250));
        return read && same;
      },
      15);
}

const std::vector<std::string> kSmallPool = {"--num-kv-blocks", "40", "--max-model-len", "1024"};

// Which replica (0: a, 1: b) served one request sent through the router; -1 if neither.
int routed_to(int router_port, int a_port, int b_port, const std::string& key, const std::string& system,
              const std::string& question) {
  const double a0 = served_by(a_port), b0 = served_by(b_port);
  if (chat(router_port, key, system, question) != 200) return -1;
  const double a1 = served_by(a_port), b1 = served_by(b_port);
  if (a1 == a0 + 1 && b1 == b0) return 0;
  if (b1 == b0 + 1 && a1 == a0) return 1;
  return -1;
}

TEST(RouterKvEventsE2E, ReplicaServesItsEvents) {
  auto a = start_replica(0, kSmallPool);
  ASSERT_GT(a->port(), 0) << a->log();
  auto first = http_get(a->port(), "/v1/kv/events");
  ASSERT_EQ(first.status, 200) << first.body;
  Json j = Json::parse(first.body);
  EXPECT_TRUE(j["snapshot"].get<bool>());
  const std::string epoch = j["epoch"].get<std::string>();
  EXPECT_EQ(epoch.size(), 16u);
  const uint64_t seq = j["seq"].get<uint64_t>();
  ASSERT_EQ(chat(a->port(), "k", text("sys", 3), "question"), 200);
  auto next = http_get(a->port(), "/v1/kv/events?epoch=" + epoch + "&after=" + std::to_string(seq));
  ASSERT_EQ(next.status, 200);
  j = Json::parse(next.body);
  EXPECT_FALSE(j["snapshot"].get<bool>());
  ASSERT_GE(j["events"].size(), 3u) << next.body;  // the prompt's full blocks, on the device
  for (const auto& e : j["events"]) {
    EXPECT_EQ(e["type"], "stored");
    EXPECT_EQ(e["tier"], "device");
    EXPECT_EQ(e["block"].get<std::string>().size(), 32u);
  }
  EXPECT_EQ(http_get(a->port(), "/v1/kv/events?after=x").status, 400);
  EXPECT_EQ(http_request(a->port(), Verb::post, "/v1/kv/events", "{}").status, 405);
  // Off: 404, so a router keeps its approximate index for this replica.
  auto off = start_replica(0, {"--kv-events-ring", "0"});
  ASSERT_GT(off->port(), 0) << off->log();
  EXPECT_EQ(http_get(off->port(), "/v1/kv/events").status, 404);
}

TEST(RouterKvEventsE2E, EvictedOrRestartedReplicaStopsGettingThePrefix) {
  auto a = start_replica(0, kSmallPool);
  auto b = start_replica(0, kSmallPool);
  ASSERT_GT(a->port(), 0) << a->log();
  ASSERT_GT(b->port(), 0) << b->log();
  const int a_port = a->port(), b_port = b->port();
  const std::string a_url = a->url(), b_url = b->url();
  auto router =
      start_router({a_url, b_url}, {"--kv-events-interval-ms", "50", "--health-interval-ms", "200"});
  ASSERT_GT(router->port(), 0) << router->log();
  const int rp = router->port();
  const std::vector<std::string> urls = {a_url, b_url};
  ASSERT_TRUE(settled(rp, urls)) << http_get(rp, "/metrics").body;

  // A holds the system prompt and a long question (about 9 blocks); B the system prompt only (6).
  const std::string sys = text("tenant-one", 6), q1 = text("first question", 3), q2 = "short";
  ASSERT_EQ(chat(a_port, "k1", sys, q1), 200);
  ASSERT_EQ(chat(b_port, "k1", sys, q2), 200);
  ASSERT_TRUE(
      wait_for([&] { return replica_sample(rp, "beluga_router_replica_kv_blocks", a_url) >= 8; }, 10));
  ASSERT_TRUE(settled(rp, urls));
  EXPECT_EQ(routed_to(rp, a_port, b_port, "k1", sys, q1), 0) << http_get(rp, "/metrics").body;

  // A evicts them all: the router follows, to B.
  flood(a_port, "evict");
  ASSERT_TRUE(settled(rp, urls));
  EXPECT_EQ(routed_to(rp, a_port, b_port, "k1", sys, q1), 1) << http_get(rp, "/metrics").body;

  // A takes another long question, then restarts (same port, new epoch, an empty cache).
  const std::string q3 = text("third question", 3);
  ASSERT_EQ(chat(a_port, "k1", sys, q3), 200);
  ASSERT_TRUE(settled(rp, urls));
  const double epochs = replica_sample(rp, "beluga_router_replica_kv_epochs_total", a_url);
  EXPECT_EQ(epochs, 1);
  a->kill_now();
  a = start_replica(a_port, kSmallPool);
  ASSERT_EQ(a->port(), a_port) << a->log();
  ASSERT_TRUE(wait_for(
      [&] { return replica_sample(rp, "beluga_router_replica_kv_epochs_total", a_url) == epochs + 1; }, 20))
      << http_get(rp, "/metrics").body;
  ASSERT_TRUE(
      wait_for([&] { return replica_sample(rp, "beluga_router_replica_breaker_state", a_url) == 0; }, 20));
  EXPECT_EQ(routed_to(rp, a_port, b_port, "k1", sys, q3), 1) << http_get(rp, "/metrics").body;
}

TEST(RouterKvEventsE2E, HostTierPriceDecidesBetweenALongerMatchBelowAndAShorterOneOnTheDevice) {
  std::vector<std::string> with_host = kSmallPool;
  with_host.insert(with_host.end(), {"--kv-host-gb", "0.1"});
  auto a = start_replica(0, with_host);
  auto b = start_replica(0, kSmallPool);
  ASSERT_GT(a->port(), 0) << a->log();
  ASSERT_GT(b->port(), 0) << b->log();
  const int a_port = a->port(), b_port = b->port();
  const std::vector<std::string> urls = {a->url(), b->url()};
  auto cheap = start_router(urls, {"--kv-events-interval-ms", "50", "--host-block-cost", "0"});
  auto dear = start_router(urls, {"--kv-events-interval-ms", "50", "--host-block-cost", "0.9"});
  ASSERT_GT(cheap->port(), 0) << cheap->log();
  ASSERT_GT(dear->port(), 0) << dear->log();

  // Each router gets its own tenant, seeded alike: A holds the system prompt and a long question,
  // then evicts them from its device (they stay in its host tier); B holds the system prompt on
  // its device.
  const std::string q1 = text("long question", 3);
  for (const std::string key : {"cheap", "dear"}) {
    ASSERT_EQ(chat(a_port, key, text(key + "-sys", 6), q1), 200);
    ASSERT_EQ(chat(b_port, key, text(key + "-sys", 6), "short"), 200);
  }
  flood(a_port, "push-down");
  for (int port : {cheap->port(), dear->port()}) ASSERT_TRUE(settled(port, urls));
  // Free loads: A's longer match wins. Dear loads (0.9 of a recompute per block): B's shorter one.
  EXPECT_EQ(routed_to(cheap->port(), a_port, b_port, "cheap", text("cheap-sys", 6), q1), 0)
      << http_get(cheap->port(), "/metrics").body;
  EXPECT_EQ(routed_to(dear->port(), a_port, b_port, "dear", text("dear-sys", 6), q1), 1)
      << http_get(dear->port(), "/metrics").body;
}

// A replica's tier gauge (beluga_kv_tier_blocks, ...) for `tier`, whatever its model label; -1: absent.
double tier_sample(int replica_port, const std::string& family, const std::string& tier) {
  std::istringstream in(http_get(replica_port, "/metrics").body);
  for (std::string line; std::getline(in, line);)
    if (line.rfind(family + "{", 0) == 0 && line.find("tier=\"" + tier + "\"}") != std::string::npos)
      return std::stod(line.substr(line.rfind(' ') + 1));
  return -1;
}

// The replica's snapshot: the distinct blocks it holds in some tier, and those in `tier`.
std::pair<size_t, size_t> snapshot_blocks(int replica_port, const std::string& tier) {
  const Json j = Json::parse(http_get(replica_port, "/v1/kv/events").body);
  std::set<std::string> all;
  size_t in_tier = 0;
  for (const auto& e : j["events"]) {
    all.insert(e["block"].get<std::string>());
    in_tier += e["tier"] == tier;
  }
  return {all.size(), in_tier};
}

TEST(RouterKvEventsE2E, FilesTheFileTierEvictsLeaveTheReplicasEventsAndTheRoutersIndex) {
  namespace fs = std::filesystem;
  const std::string dir =
      fs::temp_directory_path().string() + "/beluga_e2e_kvdisk_" + std::to_string(::getpid());
  fs::remove_all(dir);
  // Room for about ten of the demo model's 120 KiB block files.
  std::vector<std::string> with_disk = kSmallPool;
  with_disk.insert(with_disk.end(), {"--kv-disk-dir", dir, "--kv-disk-gb", "0.0012"});
  auto a = start_replica(0, with_disk);
  ASSERT_GT(a->port(), 0) << a->log();
  const int a_port = a->port();
  auto router = start_router({a->url()}, {"--kv-events-interval-ms", "50"});
  ASSERT_GT(router->port(), 0) << router->log();
  flood(a_port, "files");  // some 50 blocks, each written through to a file
  // The replica's own view: its snapshot lists as many files as its file tier holds, no more.
  ASSERT_TRUE(wait_for(
      [&] {
        const double held = tier_sample(a_port, "beluga_kv_tier_blocks", "disk");
        return held > 0 && double(snapshot_blocks(a_port, "disk").second) == held;
      },
      20))
      << http_get(a_port, "/metrics").body;
  EXPECT_GT(tier_sample(a_port, "beluga_kv_tier_evictions_total", "disk"), 0);
  EXPECT_LE(snapshot_blocks(a_port, "disk").second, 10u);
  // The router's index follows: the blocks it counts are those the snapshot lists.
  ASSERT_TRUE(settled(router->port(), {a->url()}));
  EXPECT_EQ(replica_sample(router->port(), "beluga_router_replica_kv_blocks", a->url()),
            double(snapshot_blocks(a_port, "disk").first))
      << http_get(router->port(), "/metrics").body;
  a->kill_now();
  fs::remove_all(dir);
}

TEST(RouterKvEventsE2E, BucketsRoutePromptsByLength) {
  auto a = start_replica();
  auto b = start_replica();
  ASSERT_GT(a->port(), 0) << a->log();
  ASSERT_GT(b->port(), 0) << b->log();
  // The buckets name the replicas; no --replica.
  auto router = start_router({}, {"--bucket", "short:200=" + a->url(), "--bucket", "long:inf=" + b->url()});
  ASSERT_GT(router->port(), 0) << router->log();
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(routed_to(router->port(), a->port(), b->port(), "t", "Be brief.", "q" + std::to_string(i)), 0);
    EXPECT_EQ(routed_to(router->port(), a->port(), b->port(), "t", text("long" + std::to_string(i), 5), "q"),
              1);
  }
  // Its bucket's replica gone, a prompt is served by the other bucket rather than refused.
  a->kill_now();
  ASSERT_TRUE(wait_for(
      [&] { return replica_sample(router->port(), "beluga_router_replica_breaker_state", a->url()) == 1; },
      20));
  EXPECT_EQ(chat(router->port(), "t", "Be brief.", "q"), 200);
}

}  // namespace
}  // namespace beluga::router::testing
