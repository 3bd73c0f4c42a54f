// `beluga router --config FILE`: the JSON file's keys are the router's options (without dashes) and
// "replicas"; the command line overrides them; bad files fail naming the file and the key. And
// `beluga bench fleet` end to end on a tiny trace: every request answered, through every policy.
#include <gtest/gtest.h>

#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <cstdio>
#include <fstream>
#include <string>

#include <nlohmann/json.hpp>

#include "../common/http_client.h"
#include "processes.h"
#include "router/config_file.h"
#include "util/error.h"

namespace beluga::router::testing {
namespace {

using Json = nlohmann::json;
using beluga::server::testing::Verb;

const std::set<std::string> kKnown = {"policy", "port", "balance-window", "load-cost-tokens"};

TEST(RouterConfigFile, KeysBecomeOptionsAndReplicasAList) {
  const RouterConfigFile c = parse_router_config(
      R"({"replicas": ["http://10.0.0.1:8001", "10.0.0.2:8001"], "policy": "least-load", "port": 0,
          "balance-window": 12, "load-cost-tokens": 64.5})",
      kKnown, "f.json");
  EXPECT_EQ(c.replicas, (std::vector<std::string>{"http://10.0.0.1:8001", "10.0.0.2:8001"}));
  EXPECT_EQ(c.options.at("policy"), "least-load");
  EXPECT_EQ(c.options.at("port"), "0");
  EXPECT_EQ(c.options.at("balance-window"), "12");  // integers without a fraction: --balance-window parses it
  EXPECT_DOUBLE_EQ(std::stod(c.options.at("load-cost-tokens")), 64.5);
  EXPECT_EQ(c.options.size(), 4u);
}

TEST(RouterConfigFile, BadFilesFailNamingFileAndKey) {
  struct Case {
    const char* text;
    const char* needle;
  } cases[] = {
      {R"({"polcy": "round-robin"})", "f.json: unknown key \"polcy\""},
      {R"({"port": true})", "\"port\" must be a string or a number"},
      {R"({"port": [1]})", "\"port\" must be a string or a number"},
      {R"({"replicas": "http://a:1"})", "\"replicas\" must be a list of URLs"},
      {R"({"replicas": [1]})", "\"replicas\" must be a list of URLs"},
      {R"(["policy"])", "f.json: expected a JSON object"},
      {R"({"policy": )", "f.json: not valid JSON"},
  };
  for (const auto& c : cases) {
    try {
      parse_router_config(c.text, kKnown, "f.json");
      ADD_FAILURE() << "accepted: " << c.text;
    } catch (const beluga::Error& e) {
      EXPECT_NE(std::string(e.what()).find(c.needle), std::string::npos) << c.text << " -> " << e.what();
    }
  }
}

std::string write_temp(const std::string& text) {
  char tmpl[] = "/tmp/beluga_router_config_XXXXXX";
  const int fd = mkstemp(tmpl);
  close(fd);
  std::ofstream(tmpl) << text;
  return tmpl;
}

std::string run_cli(const std::string& args, int* code) {
  const std::string cmd = std::string(BELUGA_BINARY) + " " + args + " 2>&1";
  FILE* p = popen(cmd.c_str(), "r");
  std::string out;
  std::array<char, 4096> buf;
  size_t n;
  while ((n = fread(buf.data(), 1, buf.size(), p)) > 0) out.append(buf.data(), n);
  const int status = pclose(p);
  *code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return out;
}

TEST(RouterConfigFile, CommandLineRejectsBadConfigBeforeStarting) {
  const std::string bad = write_temp(R"({"replicas": ["http://127.0.0.1:1"], "eject-after": 0})");
  const std::string unknown = write_temp(R"({"replicas": ["http://127.0.0.1:1"], "bogus": 1})");
  const std::string none = write_temp(R"({"policy": "round-robin"})");
  struct Case {
    std::string args, needle;
  } cases[] = {
      {"router --config " + bad, "must be positive"},
      {"router --config " + unknown, unknown + ": unknown key \"bogus\""},
      {"router --config " + none, "at least one --replica URL is needed"},
      {"router --config /nonexistent/router.json", "--config: cannot read /nonexistent/router.json"},
      {"router --config", "option --config needs a value"},
  };
  for (const auto& c : cases) {
    int code = 0;
    const std::string out = run_cli(c.args, &code);
    EXPECT_NE(code, 0) << c.args;
    EXPECT_NE(out.find(c.needle), std::string::npos) << c.args << " -> " << out;
  }
  for (const auto& f : {bad, unknown, none}) unlink(f.c_str());
}

// The file's replicas, port and policy are used; a command-line --policy overrides the file's.
TEST(RouterConfigFile, RouterRunsFromTheFileWithCommandLineOverrides) {
  auto replica = start_replica();
  ASSERT_GT(replica->port(), 0) << replica->log();
  const std::string path = write_temp(Json{
      {"replicas", {replica->url()}},
      {"port", 0},
      {"policy", "round-robin"},
      {"health-interval-ms", 200},
      {"model", demo_model()}}.dump());
  ChildProcess router(beluga::testing::beluga_args("router", {"--config", path, "--policy", "least-load"}),
                      child_options("beluga router: routing to "));
  ASSERT_GT(router.port(), 0) << router.log();
  EXPECT_NE(router.log().find("routing to 1 replica(s) (policy least-load"), std::string::npos)
      << router.log();
  const Json body{{"model", "beluga-demo-coder-mtp"},
                  {"messages", {{{"role", "user"}, {"content", "def add(a, b):"}}}},
                  {"max_tokens", 4}};
  const auto r =
      beluga::server::testing::http_request(router.port(), Verb::post, "/v1/chat/completions", body.dump());
  EXPECT_EQ(r.status, 200) << r.body;
  const std::string metrics = beluga::server::testing::http_get(router.port(), "/metrics").body;
  EXPECT_NE(metrics.find("policy=\"least-load\""), std::string::npos) << metrics;
  EXPECT_NE(metrics.find("replica=\"" + replica->url() + "\""), std::string::npos) << metrics;
  unlink(path.c_str());
}

// bench fleet on 2 replicas and a 12-request, 3-turn, 2-tenant trace: each policy answers every
// request, later turns of a conversation hit the cache (so usage is read), and the JSON has a run
// per policy in order.
TEST(BenchFleet, RunsEveryPolicyOnRealProcesses) {
  char tmpl[] = "/tmp/beluga_bench_fleet_test_XXXXXX";
  const int fd = mkstemp(tmpl);
  close(fd);
  int code = 0;
  const std::string out = run_cli(std::string("bench fleet --replicas 2 --policies cache-aware,round-robin") +
                                      " --num-prompts 12 --num-turns 3 --tenants 2 --system-len 60" +
                                      " --input-len 8 --output-len 4 --max-concurrency 2 --out " + tmpl,
                                  &code);
  ASSERT_EQ(code, 0) << out;
  std::ifstream f(tmpl);
  const Json j = Json::parse(f, nullptr, false);
  unlink(tmpl);
  ASSERT_FALSE(j.is_discarded()) << out;
  ASSERT_EQ(j["runs"].size(), 2u);
  EXPECT_EQ(j["runs"][0]["policy"], "cache-aware");
  EXPECT_EQ(j["runs"][1]["policy"], "round-robin");
  for (const auto& r : j["runs"]) {
    EXPECT_EQ(r["completed"], 12) << r.dump();
    EXPECT_EQ(r["failed"], 0) << r.dump();
    EXPECT_EQ(r["tenants"], 2);
    EXPECT_GT(r["prefix_cache_hit_rate"].get<double>(), 0.0) << r.dump();
    EXPECT_GT(r["ttft"]["p50_ms"].get<double>(), 0.0);
    EXPECT_TRUE(r["goodput"].is_number());
  }
  // The router's own counters: later turns follow their prefix under cache-aware; round-robin rotates.
  EXPECT_GT(j["runs"][0]["router"]["decisions"].value("affinity", 0.0), 0.0) << j["runs"][0]["router"].dump();
  EXPECT_GT(j["runs"][1]["router"]["decisions"].value("round_robin", 0.0), 0.0)
      << j["runs"][1]["router"].dump();
  EXPECT_EQ(j["runs"][1]["router"]["decisions"].value("affinity", 0.0), 0.0);
  EXPECT_NE(out.find("policy        hit rate"), std::string::npos) << out;
}

TEST(BenchFleet, BadOptionsFail) {
  int code = 0;
  std::string out = run_cli("bench fleet --policies cache-aware,random", &code);
  EXPECT_NE(code, 0);
  EXPECT_NE(out.find("unknown policy 'random'"), std::string::npos) << out;
  // A file tier left by an earlier run would hand this one its blocks: refused before anything starts.
  char dir[] = "/tmp/beluga_bench_fleet_kv_XXXXXX";
  ASSERT_NE(mkdtemp(dir), nullptr);
  const std::string old_run = std::string(dir) + "/round-robin";
  ASSERT_EQ(mkdir(old_run.c_str(), 0755), 0);
  out = run_cli(std::string("bench fleet --policies round-robin --kv-disk-dir ") + dir, &code);
  EXPECT_NE(code, 0);
  EXPECT_NE(out.find(old_run + " exists"), std::string::npos) << out;
  rmdir(old_run.c_str());
  rmdir(dir);
  out = run_cli("bench serve --tenants 2 --dataset random --url http://127.0.0.1:1", &code);
  EXPECT_NE(code, 0);
  EXPECT_NE(out.find("--tenants needs --dataset multi-turn"), std::string::npos) << out;
}

}  // namespace
}  // namespace beluga::router::testing
