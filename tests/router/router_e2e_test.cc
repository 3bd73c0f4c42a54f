// `beluga router` in front of real `beluga serve` replicas (the built-in demo model, one CPU thread
// each, free ports; in the multi-replica tests each replica is a host of its own in a network
// namespace where the machine allows it, netns.h, else all are on loopback):
//  - on a multi-tenant shared-prefix workload across 4 replicas, the cache-aware policy's prefix hit
//    rate (the replicas' own usage.cached_tokens) is at least 1.5x round-robin's (both printed);
//  - a replica killed mid-run loses no request that had not started streaming (every non-streamed
//    request gets its 200), a stream it was serving ends with the API's error event or completes,
//    and the router ejects it;
//  - a replica that was down when the router started, and the killed one restarted, receive traffic
//    once their health checks pass;
//  - a client that leaves mid-stream makes the replica abort its request (its in-flight count and
//    the router's go back to 0; the replica counts a client disconnect);
//  - the router's own /health, /metrics and a 503 when no replica is available.
#include <gtest/gtest.h>

#include <atomic>
#include <cstdio>
#include <functional>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include <nlohmann/json.hpp>

#include "../common/http_client.h"
#include "netns.h"
#include "processes.h"

namespace beluga::router::testing {
namespace {

using Json = nlohmann::json;
using beluga::server::testing::http_get;
using beluga::server::testing::http_request;
using beluga::server::testing::Verb;

beluga::server::testing::HttpReply chat(int port, const std::string& key, const Json& messages,
                                        int max_tokens, bool stream = false) {
  Json body{{"model", "beluga-demo-coder-mtp"},
            {"messages", messages},
            {"max_tokens", max_tokens},
            {"temperature", 0}};
  if (stream) body["stream"] = true;
  return http_request(port, Verb::post, "/v1/chat/completions", body.dump(),
                      {{"Authorization", "Bearer " + key}}, std::chrono::seconds(60));
}

// A system prompt of about `blocks` 64-token blocks, different for every tenant.
std::string tenant_prompt(int tenant, int blocks) {
  std::string s = "You are the coding assistant of team " + std::to_string(tenant) + ". House rules:\n";
  for (int i = 0; s.size() < size_t(blocks) * 64 * 3; ++i)
    s += "rule " + std::to_string(i) + ": name things t" + std::to_string(tenant) + "_" + std::to_string(i) +
         ".\n";
  return s;
}

struct HitRate {
  long prompt = 0, cached = 0;
  int ok = 0;
  double rate() const { return prompt ? double(cached) / double(prompt) : 0; }
};

// `tenants` tenants (API keys, which salt the replicas' prefix caches), each with its own system
// prompt, send `rounds` different questions each, round by round, from two client threads.
HitRate run_workload(int router_port, const std::string& tag, int tenants, int rounds) {
  std::vector<std::pair<int, int>> work;  // (tenant, round), interleaved
  for (int r = 0; r < rounds; ++r)
    for (int t = 0; t < tenants; ++t) work.push_back({t, r});
  std::atomic<size_t> next{0};
  std::mutex mu;
  HitRate h;
  auto worker = [&] {
    for (size_t i; (i = next++) < work.size();) {
      const auto [t, r] = work[i];
      Json messages =
          Json::array({{{"role", "system"}, {"content", tenant_prompt(t, 4)}},
                       {{"role", "user"},
                        {"content", "Question " + std::to_string(r) + ": write a function number " +
                                        std::to_string(r * 7 + t) + "."}}});
      auto rep = chat(router_port, tag + "-tenant-" + std::to_string(t), messages, 1);
      const Json j = rep.json();
      std::lock_guard lock(mu);
      if (rep.status != 200 || !j.contains("usage")) {
        ADD_FAILURE() << "request " << i << " got " << rep.status << ": " << rep.body;
        continue;
      }
      ++h.ok;
      h.prompt += j["usage"]["prompt_tokens"].get<long>();
      h.cached += j["usage"]["prompt_tokens_details"]["cached_tokens"].get<long>();
    }
  };
  std::thread a(worker), b(worker);
  a.join();
  b.join();
  return h;
}

TEST(RouterE2E, CacheAwareHitRateAtLeastOneAndAHalfTimesRoundRobin) {
  const ReplicaHosts hosts(4);  // before the replicas: they end first
  RecordProperty("replica_hosts", hosts.mode());
  std::vector<std::unique_ptr<ChildProcess>> replicas;
  std::vector<std::string> urls;
  for (int i = 0; i < 4; ++i) {
    replicas.push_back(hosts.start_replica(i));
    ASSERT_GT(replicas.back()->port(), 0) << replicas.back()->log();
    EXPECT_EQ(hosts.not_its_own_host(*replicas.back(), i), "");
    urls.push_back(replicas.back()->url());
  }
  // Both routers front the same replicas; their tenants' keys differ, so neither run reuses the
  // other's cached blocks.
  auto cache_aware = start_router(urls, {"--policy", "cache-aware"});
  auto round_robin = start_router(urls, {"--policy", "round-robin"});
  ASSERT_GT(cache_aware->port(), 0) << cache_aware->log();
  ASSERT_GT(round_robin->port(), 0) << round_robin->log();

  // 7 tenants (prime to 4 replicas, so round-robin does not land a tenant on one replica by luck).
  const int tenants = 7, rounds = 5;
  const HitRate rr = run_workload(round_robin->port(), "rr", tenants, rounds);
  const HitRate ca = run_workload(cache_aware->port(), "ca", tenants, rounds);
  std::printf(
      "[figures] prefix hit rate over %d requests on 4 replicas (%s): cache-aware %.3f (%ld/%ld tokens), "
      "round-robin %.3f (%ld/%ld tokens), ratio %.2f\n",
      tenants * rounds, hosts.in_namespaces() ? "network namespaces" : "loopback", ca.rate(), ca.cached,
      ca.prompt, rr.rate(), rr.cached, rr.prompt, rr.rate() > 0 ? ca.rate() / rr.rate() : 0.0);
  EXPECT_EQ(ca.ok, tenants * rounds);
  EXPECT_EQ(rr.ok, tenants * rounds);
  EXPECT_GT(ca.rate(), 0.0);
  EXPECT_GE(ca.rate(), 1.5 * rr.rate());

  // The router's own view: affinity decisions, and estimated hits that track the replicas' numbers.
  const std::string m = http_get(cache_aware->port(), "/metrics").body;
  EXPECT_GT(sample(m, "beluga_router_decisions_total{policy=\"cache-aware\",decision=\"affinity\"}"), 0) << m;
  double est = 0;
  for (const auto& u : urls)
    est += sample(m, "beluga_router_replica_routed_hit_tokens_total{replica=\"" + u + "\"}");
  EXPECT_GT(est, 0.5 * double(ca.cached)) << m;
  const std::string rm = http_get(round_robin->port(), "/metrics").body;
  EXPECT_GT(sample(rm, "beluga_router_decisions_total{policy=\"round-robin\",decision=\"round_robin\"}"), 0);
  // Every replica took part of the round-robin run.
  for (const auto& u : urls)
    EXPECT_GE(sample(rm, "beluga_router_replica_requests_total{replica=\"" + u + "\"}"), 1) << u;
}

// Two replicas with attention data parallelism (two ranks each, a KV cache per rank) behind the
// cache-aware router: every request is answered, the tenants' system prompts are found again in the
// ranks that cached them, and the router's index (built from the replicas' block events, one event a
// key however many of a replica's ranks hold it) routes by them.
TEST(RouterE2E, DataParallelReplicasServeCacheAwareTraffic) {
  std::vector<std::unique_ptr<ChildProcess>> replicas;
  std::vector<std::string> urls;
  for (int i = 0; i < 2; ++i) {
    replicas.push_back(start_replica(0, {"--data-parallel-size", "2"}));
    ASSERT_GT(replicas.back()->port(), 0) << replicas.back()->log();
    urls.push_back(replicas.back()->url());
  }
  auto router = start_router(urls, {"--policy", "cache-aware"});
  ASSERT_GT(router->port(), 0) << router->log();
  const int tenants = 3, rounds = 4;
  const HitRate h = run_workload(router->port(), "dp", tenants, rounds);
  EXPECT_EQ(h.ok, tenants * rounds);
  // Each tenant's first request computes its ~4-block system prompt; the later rounds find it.
  EXPECT_GE(h.cached, long(tenants) * (rounds - 1) * 3 * 64) << h.cached << " of " << h.prompt;
  const std::string m = http_get(router->port(), "/metrics").body;
  EXPECT_GT(sample(m, "beluga_router_decisions_total{policy=\"cache-aware\",decision=\"affinity\"}"), 0) << m;
  for (const auto& r : replicas) {
    const std::string page = http_get(r->port(), "/metrics").body;
    EXPECT_NE(page.find("beluga_kv_blocks_used_by_rank{"), std::string::npos) << page;
    EXPECT_EQ(sample(page, "beluga_expert_parallel_ranks{model_name=\"beluga-demo-coder-mtp\"}"), 2) << page;
  }
}

// Requests served by a replica, from its own /metrics.
double served_by(const ChildProcess& replica) {
  const std::string page = http_get(replica.host(), replica.port(), "/metrics").body;
  return sample(page, "beluga_requests_total{api=\"chat\",status=\"200\"}");
}

TEST(RouterE2E, KilledReplicaLosesNoUnstartedRequestAndReplicasRejoin) {
  const ReplicaHosts hosts(3);  // A, B and the late one; before the replicas: they end first
  RecordProperty("replica_hosts", hosts.mode());
  auto a = hosts.start_replica(0);
  auto b = hosts.start_replica(1);
  ASSERT_GT(a->port(), 0) << a->log();
  ASSERT_GT(b->port(), 0) << b->log();
  EXPECT_EQ(hosts.not_its_own_host(*a, 0), "");
  EXPECT_EQ(hosts.not_its_own_host(*b, 1), "");
  const int a_port = a->port();
  const int late_port = free_port();  // a replica that starts after the router
  const std::string late_url = hosts.url(2, late_port);
  auto router = start_router({a->url(), b->url(), late_url},
                             {"--policy", "least-load", "--health-interval-ms", "200", "--eject-after", "2"});
  ASSERT_GT(router->port(), 0) << router->log();
  const int rp = router->port();
  EXPECT_EQ(http_get(rp, "/health").status, 200);
  // The absent replica is ejected by its failing health checks.
  EXPECT_TRUE(
      wait_for([&] { return replica_sample(rp, "beluga_router_replica_breaker_state", late_url) == 1; }, 10))
      << http_get(rp, "/metrics").body;

  // Non-streamed requests (nothing reaches the client before the whole answer) and streams, from
  // four threads; replica A is killed once a few have finished.
  const int total = 32, streams = 8;
  std::atomic<int> next{0}, done{0}, ok{0}, streams_ok{0}, streams_error_event{0};
  std::mutex mu;
  std::vector<std::string> failures;
  auto worker = [&] {
    for (int i; (i = next++) < total + streams;) {
      const bool stream = i >= total;
      Json messages = Json::array(
          {{{"role", "user"},
            {"content", "Write a Python function number " + std::to_string(i) + " that sorts a list."}}});
      auto rep = chat(rp, "fault-tenant", messages, 24, stream);
      ++done;
      if (!stream) {
        if (rep.status == 200 && rep.json().contains("choices")) {
          ++ok;
        } else {
          std::lock_guard lock(mu);
          failures.push_back(std::to_string(rep.status) + " " + rep.body);
        }
        continue;
      }
      // A stream either completes or, if its replica died mid-way, ends with the error event.
      if (rep.status == 200 && rep.body.find("data: {\"error\"") != std::string::npos)
        ++streams_error_event;
      else if (rep.status == 200 && rep.body.find("data: [DONE]") != std::string::npos)
        ++streams_ok;
      else {
        std::lock_guard lock(mu);
        failures.push_back("stream: " + std::to_string(rep.status) + " " + rep.body.substr(0, 400));
      }
    }
  };
  std::vector<std::thread> ts;
  for (int i = 0; i < 4; ++i) ts.emplace_back(worker);
  // Killed while it serves: requests in flight on it at that moment must be retried elsewhere.
  ASSERT_TRUE(wait_for(
      [&] { return done >= 4 && replica_sample(rp, "beluga_router_replica_in_flight", a->url()) > 0; }, 60));
  a->kill_now();
  for (auto& t : ts) t.join();
  EXPECT_EQ(ok, total) << (failures.empty() ? "" : failures[0]);
  EXPECT_EQ(streams_ok + streams_error_event, streams) << (failures.empty() ? "" : failures[0]);
  EXPECT_TRUE(failures.empty()) << failures.size()
                                << " failures, first: " << (failures.empty() ? "" : failures[0]);
  std::printf(
      "[figures] killed replica: %d/%d plain requests ok, %d streams complete, %d ended with an error "
      "event, router retries %.0f\n",
      ok.load(), total, streams_ok.load(), streams_error_event.load(),
      sample(http_get(rp, "/metrics").body, "beluga_router_retries_total"));
  EXPECT_GE(sample(http_get(rp, "/metrics").body, "beluga_router_retries_total"), 1);
  EXPECT_TRUE(
      wait_for([&] { return replica_sample(rp, "beluga_router_replica_breaker_state", a->url()) == 1; }, 10));
  EXPECT_GE(replica_sample(rp, "beluga_router_replica_failures_total", a->url()), 1);

  // The late replica starts, A comes back on its port: both receive traffic once probed healthy.
  auto late = hosts.start_replica(2, late_port);
  ASSERT_EQ(late->port(), late_port) << late->log();
  EXPECT_EQ(late->url(), late_url);
  EXPECT_EQ(hosts.not_its_own_host(*late, 2), "");
  auto a2 = hosts.start_replica(0, a_port);
  ASSERT_EQ(a2->port(), a_port) << a2->log();
  EXPECT_EQ(a2->url(), a->url());
  EXPECT_TRUE(wait_for(
      [&] {
        return replica_sample(rp, "beluga_router_replica_breaker_state", late_url) != 1 &&
               replica_sample(rp, "beluga_router_replica_breaker_state", a2->url()) != 1;
      },
      15))
      << http_get(rp, "/metrics").body;
  for (int i = 0; i < 12; ++i) {
    Json messages = Json::array({{{"role", "user"}, {"content", "print " + std::to_string(i)}}});
    EXPECT_EQ(chat(rp, "fault-tenant", messages, 2).status, 200);
  }
  EXPECT_GE(served_by(*late), 1) << "the replica that started late got no request";
  EXPECT_GE(served_by(*a2), 1) << "the restarted replica got no request";

  // A stream whose replica dies after it began: the client gets what was streamed, then the error
  // event and [DONE], in a well-formed chunked response.
  {
    std::vector<std::pair<std::string, ChildProcess*>> live = {
        {b->url(), b.get()}, {late_url, late.get()}, {a2->url(), a2.get()}};
    beluga::server::testing::HttpReply streamed;
    std::thread client([&] {
      Json body{{"model", "beluga-demo-coder-mtp"},
                {"stream", true},
                {"max_tokens", 1500},
                {"ignore_eos", true},
                {"messages", Json::array({{{"role", "user"}, {"content", "Write a long Python module."}}})}};
      streamed =
          http_request(rp, Verb::post, "/v1/chat/completions", body.dump(), {}, std::chrono::seconds(60));
    });
    ChildProcess* serving = nullptr;
    wait_for(
        [&] {
          for (auto& [u, p] : live)
            if (replica_sample(rp, "beluga_router_replica_in_flight", u) > 0) serving = p;
          return serving != nullptr;
        },
        20);
    ASSERT_NE(serving, nullptr);
    std::this_thread::sleep_for(std::chrono::milliseconds(500));  // some tokens have gone out
    serving->kill_now();
    client.join();
    EXPECT_EQ(streamed.status, 200);
    EXPECT_NE(streamed.body.find("\"delta\":{\"content\""), std::string::npos)
        << streamed.body.substr(0, 300);
    const size_t err = streamed.body.find("data: {\"error\"");
    EXPECT_NE(err, std::string::npos)
        << streamed.body.substr(streamed.body.size() > 400 ? streamed.body.size() - 400 : 0);
    EXPECT_NE(streamed.body.find("data: [DONE]", err == std::string::npos ? 0 : err), std::string::npos);
  }

  // Every replica down: the router answers 503 in the API's shape, and its /health says so.
  b->kill_now();
  late->kill_now();
  a2->kill_now();
  EXPECT_TRUE(wait_for([&] { return http_get(rp, "/health").status == 503; }, 10));
  auto rep = chat(rp, "fault-tenant", Json::array({{{"role", "user"}, {"content", "hi"}}}), 2);
  EXPECT_EQ(rep.status, 503) << rep.body;
  EXPECT_TRUE(rep.json().contains("error")) << rep.body;
  EXPECT_EQ(router->terminate(), 0) << router->log();
}

// Replica A runs two expert-parallel ranks and its rank 1 fails from its 6th step
// (BELUGA_TEST_FAIL_RANK): the request that meets the failure gets A's 503, the router retries it on B,
// and every request answers 200 while A restarts itself over one rank and rejoins.
TEST(RouterE2E, AFailedExpertParallelRankLosesNoRequest) {
  auto o = child_options("beluga serve: serving ");
  o.env.push_back("BELUGA_TEST_FAIL_RANK=1:6");
  auto a = std::make_unique<ChildProcess>(replica_args(0, {"--expert-parallel-size", "2"}), o);
  auto b = start_replica();
  ASSERT_GT(a->port(), 0) << a->log();
  ASSERT_GT(b->port(), 0) << b->log();
  auto router =
      start_router({a->url(), b->url()}, {"--policy", "round-robin", "--health-interval-ms", "200"});
  ASSERT_GT(router->port(), 0) << router->log();
  const int rp = router->port();
  int ok = 0;
  for (int i = 0; i < 8; ++i) {
    const Json messages =
        Json::array({{{"role", "user"}, {"content", "Sort a list, take " + std::to_string(i)}}});
    const auto rep = chat(rp, "ep-tenant", messages, 12);
    if (rep.status == 200 && rep.json().contains("choices"))
      ++ok;
    else
      ADD_FAILURE() << "request " << i << ": " << rep.status << " " << rep.body;
  }
  EXPECT_EQ(ok, 8);
  const std::string router_page = http_get(rp, "/metrics").body;
  EXPECT_GE(sample(router_page, "beluga_router_retries_total"), 1) << router_page;
  EXPECT_TRUE(wait_for([&] { return http_get(a->port(), "/health").status == 200; }, 30)) << a->log();
  const std::string a_page = http_get(a->port(), "/metrics").body;
  EXPECT_NE(a_page.find("beluga_engine_restarts_total{model_name=\"beluga-demo-coder-mtp\"} 1"),
            std::string::npos)
      << a_page;
  EXPECT_NE(a->log().find("restarting over 1 rank"), std::string::npos) << a->log();
}

TEST(RouterE2E, ClientLeavingMidStreamAbortsTheReplicasRequest) {
  auto replica = start_replica();
  ASSERT_GT(replica->port(), 0) << replica->log();
  auto router = start_router({replica->url()});
  ASSERT_GT(router->port(), 0) << router->log();
  const std::string body =
      Json{{"model", "beluga-demo-coder-mtp"},
           {"stream", true},
           {"max_tokens", 1500},
           {"ignore_eos", true},
           {"messages", Json::array({{{"role", "user"}, {"content", "Write a long module."}}})}}
          .dump();
  const int fd = post_raw(router->port(), "/v1/chat/completions", body, 30000);
  ASSERT_GE(fd, 0);
  std::string got;
  char buf[4096];
  while (got.find("\"content\":\"") == std::string::npos) {  // a token has been streamed
    const ssize_t n = recv(fd, buf, sizeof(buf), 0);
    ASSERT_GT(n, 0) << got;
    got.append(buf, size_t(n));
  }
  EXPECT_EQ(beluga::server::testing::metric_value(http_get(replica->port(), "/metrics").body,
                                                  "beluga_requests_in_flight"),
            1);
  close(fd);
  EXPECT_TRUE(wait_for(
      [&] {
        const std::string m = http_get(replica->port(), "/metrics").body;
        return beluga::server::testing::metric_value(m, "beluga_requests_in_flight") == 0 &&
               beluga::server::testing::metric_value(m, "beluga_client_disconnects_total") >= 1;
      },
      10))
      << http_get(replica->port(), "/metrics").body;
  // The router counts the request out when its upstream connection ends, which may come a moment
  // after the replica's own count (a fresh-clone run read 1 right after the replica read 0).
  EXPECT_TRUE(wait_for(
      [&] { return replica_sample(router->port(), "beluga_router_replica_in_flight", replica->url()) == 0; },
      10))
      << http_get(router->port(), "/metrics").body;
}

}  // namespace
}  // namespace beluga::router::testing
