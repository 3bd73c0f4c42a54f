#include "cli/bench_fleet.h"

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include <utility>  // before Asio: Boost 1.74's awaitable.hpp uses std::exchange

#include <boost/asio.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <nlohmann/json.hpp>

#include "cli/args.h"
#include "cli/bench_processes.h"
#include "cli/bench_serve.h"
#include "cli/model_args.h"
#include "util/error.h"

namespace beluga::cli {

namespace {

using Json = nlohmann::ordered_json;

std::vector<std::string> split_list(const std::string& s) {
  std::vector<std::string> out;
  for (size_t p = 0; p <= s.size();) {
    const size_t c = s.find(',', p);
    const std::string item = s.substr(p, c == std::string::npos ? std::string::npos : c - p);
    if (!item.empty()) out.push_back(item);
    if (c == std::string::npos) break;
    p = c + 1;
  }
  return out;
}

// The router's /metrics page ("" when unreachable).
std::string metrics_page(int port) {
  namespace net = boost::asio;
  namespace http = boost::beast::http;
  try {
    net::io_context ioc;
    net::ip::tcp::resolver resolver(ioc);
    boost::beast::tcp_stream stream(ioc);
    stream.connect(resolver.resolve("127.0.0.1", std::to_string(port)));
    http::request<http::empty_body> req(http::verb::get, "/metrics", 11);
    req.set(http::field::host, "127.0.0.1");
    http::write(stream, req);
    boost::beast::flat_buffer buf;
    http::response<http::string_body> res;
    http::read(stream, buf, res);
    return res.body();
  } catch (const std::exception&) {
    return "";
  }
}

// Waits (up to 10 s) until the router has read every replica's block events once, so that the
// trace is routed on a live index from its first request rather than racing the first poll.
void wait_for_kv_index(int port, int replicas) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (std::chrono::steady_clock::now() < deadline) {
    const std::string page = metrics_page(port);
    int synced = 0;
    for (size_t p = page.find("beluga_router_replica_kv_epochs_total{"); p != std::string::npos;
         p = page.find("beluga_router_replica_kv_epochs_total{", p + 1)) {
      const size_t e = page.find('\n', p);
      if (std::atof(page.c_str() + page.rfind(' ', e) + 1) >= 1) ++synced;
    }
    if (synced >= replicas) return;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  std::fprintf(stderr, "bench fleet: the router has not read every replica's block events after 10 s\n");
}

// The router's routing decisions and retries, from its /metrics page ({} when unreachable).
Json router_counters(int port) {
  const std::string page = metrics_page(port);
  if (page.empty()) return Json::object();
  Json decisions = Json::object(), out = Json::object();
  for (size_t p = 0; p < page.size();) {
    size_t e = page.find('\n', p);
    if (e == std::string::npos) e = page.size();
    const std::string line = page.substr(p, e - p);
    p = e + 1;
    const size_t sp = line.rfind(' ');
    if (line.empty() || line[0] == '#' || sp == std::string::npos) continue;
    const double v = std::atof(line.c_str() + sp + 1);
    if (line.rfind("beluga_router_decisions_total{", 0) == 0) {
      const size_t d = line.find("decision=\"");
      if (d != std::string::npos) decisions[line.substr(d + 10, line.find('"', d + 10) - d - 10)] = v;
    } else if (line.rfind("beluga_router_retries_total ", 0) == 0) {
      out["retries"] = v;
    }
  }
  out["decisions"] = decisions;
  return out;
}

// One policy's run: replicas and router up, the trace through the router, everything stopped.
Json run_policy(const std::string& policy, int replicas, const std::string& model_dir,
                const std::vector<std::string>& serve_extra, const std::vector<std::string>& trace_args) {
  std::vector<std::unique_ptr<BenchProcess>> fleet;
  std::vector<std::string> router_args = {"router", "--model", model_dir, "--port", "0", "--policy", policy};
  for (int i = 0; i < replicas; ++i) {
    std::vector<std::string> a = {"serve", "--model", model_dir, "--port", "0", "--no-access-log"};
    a.insert(a.end(), serve_extra.begin(), serve_extra.end());
    fleet.push_back(std::make_unique<BenchProcess>(a, "beluga serve: serving "));
    router_args.push_back("--replica");
    router_args.push_back(fleet.back()->url());
  }
  BenchProcess router(router_args, "beluga router: routing to ");
  wait_for_kv_index(router.port(), replicas);

  std::vector<std::string> a = {"--dataset", "multi-turn"};
  a.insert(a.end(), trace_args.begin(), trace_args.end());
  std::fprintf(stderr, "bench fleet: policy %s, %d replicas, router %s\n", policy.c_str(), replicas,
               router.url().c_str());
  Json j = bench_serve_report(router.url(), a);
  j["router"] = router_counters(router.port());
  router.stop();
  for (auto& p : fleet) p->stop();
  return j;
}

}  // namespace

int bench_fleet(int argc, char** argv) {
  Args args = Args::for_command(argc, argv, "bench fleet");
  const int replicas = int(args.get_int("replicas", 4));
  const auto policies = split_list(args.get_or("policies", "cache-aware,round-robin,least-load"));
  std::string model_dir = args.get_or("model", "");
  const std::string threads = std::to_string(args.get_int("replica-threads", 1));
  const std::string kv_mb = std::to_string(args.get_int("kv-cache-mb", 64));
  // A shared file tier: the replicas of one policy share DIR/<policy> (created empty; an existing one
  // is an error, so no run starts with another's blocks).
  const std::string disk_dir = args.get_or("kv-disk-dir", "");
  const std::string slo = args.get_or("slo", "ttft_ms=1000,tpot_ms=100");
  // The trace: bench serve's multi-turn dataset, multi-tenant.
  std::vector<std::string> trace = {"--slo", slo};
  const std::pair<const char*, const char*> trace_opts[] = {
      {"num-prompts", "64"}, {"num-turns", "4"},      {"tenants", "4"},
      {"system-len", "200"}, {"input-len", "24"},     {"output-len", "16"},
      {"seed", "0"},         {"request-rate", "inf"}, {"max-concurrency", "4"}};
  Json trace_json = Json::object();
  for (const auto& [k, def] : trace_opts) {
    const std::string v = args.get_or(k, def);
    trace.push_back(std::string("--") + k);
    trace.push_back(v);
    trace_json[k] = v;
  }
  const auto out_path = args.get("out");
  args.check_all_used();
  BELUGA_CHECK(replicas >= 1 && replicas <= 64, "--replicas must be 1..64");
  BELUGA_CHECK(!policies.empty(), "--policies needs at least one policy");
  for (const auto& p : policies)
    BELUGA_CHECK(p == "cache-aware" || p == "round-robin" || p == "least-load", "unknown policy '", p,
                 "' in --policies (cache-aware, round-robin, least-load)");
  if (model_dir.empty()) model_dir = default_model_dir();
  const std::vector<std::string> serve_extra = {"--threads", threads, "--kv-cache-mb", kv_mb};

  Json runs = Json::array();
  for (const auto& p : policies) {
    // A line per policy on stderr (each one's requests have bench serve's own progress).
    std::fprintf(stderr, "bench fleet: policy %zu of %zu: %s (%d replicas)\n", size_t(runs.size() + 1),
                 policies.size(), p.c_str(), replicas);
    std::vector<std::string> extra = serve_extra;
    if (!disk_dir.empty()) {
      const std::filesystem::path d = std::filesystem::path(disk_dir) / p;
      std::error_code ec;
      BELUGA_CHECK(!std::filesystem::exists(d, ec), "--kv-disk-dir: ", d.string(),
                   " exists; give a directory without earlier runs' blocks");
      std::filesystem::create_directories(d, ec);
      BELUGA_CHECK(!ec, "--kv-disk-dir: cannot create ", d.string(), ": ", ec.message());
      extra.insert(extra.end(), {"--kv-disk-dir", d.string()});
    }
    Json r = run_policy(p, replicas, model_dir, extra, trace);
    r["policy"] = p;
    runs.push_back(std::move(r));
  }

  std::printf("\n=== bench fleet: %d replicas of %s, multi-turn x %s tenants, %s requests, SLO %s ===\n",
              replicas, model_dir.c_str(), trace_json["tenants"].get<std::string>().c_str(),
              trace_json["num-prompts"].get<std::string>().c_str(), slo.c_str());
  std::printf("%-12s %9s %10s %10s %8s %9s %9s %6s  %s\n", "policy", "hit rate", "TTFT p50", "TTFT p99",
              "req/s", "out tok/s", "goodput", "failed", "router decisions");
  for (const auto& r : runs) {
    const double good = r["goodput"].is_number() ? r["goodput"].get<double>() : 0.0;
    std::string decisions;  // "affinity 150, spill 10, ..." (the nonzero ones)
    if (r["router"].contains("decisions"))
      for (const auto& [k, v] : r["router"]["decisions"].items())
        if (v.get<double>() > 0)
          decisions += (decisions.empty() ? "" : ", ") + k + " " + std::to_string(int64_t(v.get<double>()));
    std::printf("%-12s %8.1f%% %8.1fms %8.1fms %8.2f %9.1f %9.2f %6d  %s\n",
                r["policy"].get<std::string>().c_str(), 100.0 * r["prefix_cache_hit_rate"].get<double>(),
                r["ttft"]["p50_ms"].get<double>(), r["ttft"]["p99_ms"].get<double>(),
                r["request_throughput"].get<double>(), r["output_throughput"].get<double>(), good,
                r["failed"].get<int>(), decisions.c_str());
  }
  if (out_path) {
    Json j{{"replicas", replicas},    {"model", model_dir},  {"slo", slo},
           {"kv_disk_dir", disk_dir}, {"trace", trace_json}, {"runs", runs}};
    std::ofstream f(*out_path);
    BELUGA_CHECK(f.good(), "cannot write ", *out_path);
    f << j.dump(2) << "\n";
  }
  return 0;
}

}  // namespace beluga::cli
