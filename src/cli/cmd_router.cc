// `beluga router --replica URL [--replica URL ...] [--config FILE] [--model DIR] [--policy ...]`: the
// load balancer in front of `beluga serve` replicas (src/router). Reads the model directory's
// tokenizer and chat format only (no weights), listens, probes the replicas and proxies until
// SIGINT/SIGTERM. A --config file gives the same options as JSON; the command line overrides it.
#include <cstring>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "cli/args.h"
#include "cli/commands.h"
#include "cli/flag_table.h"
#include "cli/model_args.h"
#include "model/batch.h"
#include "router/config_file.h"
#include "router/router.h"
#include "server/server.h"
#include "util/error.h"
#include "util/log.h"

namespace beluga::cli {

namespace {

// The options a --config file may set: every one in the router's table but --config and the replica
// lists (which cmd_router takes out of the command line itself).
std::set<std::string> file_options() {
  std::set<std::string> out = usage_of("router").options();
  out.erase("config");
  out.erase("replica");
  out.erase("prefill");  // lists: the file spells them "prefill": [URL, ...] (config_file.h)
  out.erase("decode");
  out.erase("bucket");  // command line only
  return out;
}

}  // namespace

int cmd_router(int argc, char** argv) {
  // --replica repeats; Args keeps one value per option, so the replicas are taken out first, and
  // --config, whose options go in before the command line's (Args keeps the last value of each).
  std::vector<std::string> replicas, prefill, decode;
  std::vector<router::BucketSpec> buckets;
  std::vector<char*> rest;
  std::string config_path;
  for (int i = 0; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--config") {
      BELUGA_CHECK(i + 1 < argc && std::strncmp(argv[i + 1], "--", 2) != 0, "option --config needs a value");
      config_path = argv[++i];
    } else if (a.rfind("--config=", 0) == 0) {
      config_path = a.substr(9);
    } else if (a == "--replica" || a == "--prefill" || a == "--decode") {
      BELUGA_CHECK(i + 1 < argc && std::strncmp(argv[i + 1], "--", 2) != 0, "option ", a, " needs a value");
      (a == "--replica" ? replicas : a == "--prefill" ? prefill : decode).emplace_back(argv[++i]);
    } else if (a.rfind("--replica=", 0) == 0) {
      replicas.push_back(a.substr(10));
    } else if (a.rfind("--prefill=", 0) == 0) {
      prefill.push_back(a.substr(10));
    } else if (a.rfind("--decode=", 0) == 0) {
      decode.push_back(a.substr(9));
    } else if (a == "--bucket") {  // repeats too
      BELUGA_CHECK(i + 1 < argc && std::strncmp(argv[i + 1], "--", 2) != 0, "option --bucket needs a value");
      buckets.push_back(router::parse_bucket(argv[++i]));
    } else if (a.rfind("--bucket=", 0) == 0) {
      buckets.push_back(router::parse_bucket(a.substr(9)));
    } else {
      rest.push_back(argv[i]);
    }
  }
  std::vector<std::string> from_file;  // "--key=value" of the config file, before the command line
  std::string file_model;              // the file's "model": used when the command line names none
  if (!config_path.empty()) {
    router::RouterConfigFile file = router::load_router_config(config_path, file_options());
    if (replicas.empty()) replicas = file.replicas;
    if (prefill.empty()) prefill = file.prefill;
    if (decode.empty()) decode = file.decode;
    if (auto it = file.options.find("model"); it != file.options.end()) {
      file_model = it->second;
      file.options.erase(it);
    }
    for (const auto& [k, v] : file.options) from_file.push_back("--" + k + "=" + v);
  }
  std::vector<char*> merged;
  for (auto& f : from_file) merged.push_back(f.data());
  merged.insert(merged.end(), rest.begin(), rest.end());
  Args args = Args::for_command(int(merged.size()), merged.data(), "router");
  args.taken("replica");  // these four read above
  args.taken("prefill");
  args.taken("decode");
  args.taken("config");
  args.taken("bucket");
  log::set_level(log::level_from(args.get("log-level")));
  router::RouterConfig cfg;
  cfg.replicas = replicas;
  cfg.prefill = prefill;
  cfg.decode = decode;
  cfg.host = args.get_or("host", "127.0.0.1");
  cfg.port = int(args.get_int("port", 8080));
  BELUGA_CHECK(cfg.port >= 0 && cfg.port < 65536, "--port must be 0..65535");
  const std::string policy = args.get_or("policy", "cache-aware");
  const auto p = router::parse_policy(policy);
  BELUGA_CHECK(p, "unknown --policy '", policy, "' (cache-aware, round-robin, least-load)");
  cfg.policy = *p;
  cfg.knobs.balance_window = int(args.get_int("balance-window", cfg.knobs.balance_window));
  cfg.knobs.load_cost_tokens = args.get_double("load-cost-tokens", cfg.knobs.load_cost_tokens);
  BELUGA_CHECK(cfg.knobs.balance_window >= 0 && cfg.knobs.load_cost_tokens >= 0,
               "--balance-window and --load-cost-tokens must be >= 0");
  cfg.knobs.block_size = kKvBlockSize;
  cfg.knobs.host_block_cost = args.get_double("host-block-cost", cfg.knobs.host_block_cost);
  cfg.knobs.disk_block_cost = args.get_double("disk-block-cost", cfg.knobs.disk_block_cost);
  BELUGA_CHECK(cfg.knobs.host_block_cost >= 0 && cfg.knobs.disk_block_cost >= 0,
               "--host-block-cost and --disk-block-cost must be >= 0");
  cfg.kv_events_interval_ms = int(args.get_int("kv-events-interval-ms", cfg.kv_events_interval_ms));
  BELUGA_CHECK(cfg.kv_events_interval_ms > 0, "--kv-events-interval-ms must be positive");
  cfg.replica_api_key = args.get_or("replica-api-key", "");
  cfg.buckets = buckets;
  const long index_blocks = args.get_int("index-blocks", long(cfg.index_blocks));
  BELUGA_CHECK(index_blocks > 0, "--index-blocks must be positive");
  cfg.index_blocks = size_t(index_blocks);
  cfg.io_threads = int(args.get_int("io-threads", cfg.io_threads));
  cfg.tokenize_threads = int(args.get_int("tokenize-threads", cfg.tokenize_threads));
  cfg.max_retries = int(args.get_int("max-retries", cfg.max_retries));
  cfg.connect_timeout_ms = int(args.get_int("connect-timeout-ms", cfg.connect_timeout_ms));
  cfg.upstream_timeout_s = int(args.get_int("upstream-timeout-s", cfg.upstream_timeout_s));
  cfg.health_interval_ms = int(args.get_int("health-interval-ms", cfg.health_interval_ms));
  cfg.health_timeout_ms = int(args.get_int("health-timeout-ms", cfg.health_timeout_ms));
  cfg.eject_after = int(args.get_int("eject-after", cfg.eject_after));
  cfg.max_body_bytes = size_t(args.get_int("max-body-bytes", long(cfg.max_body_bytes)));
  BELUGA_CHECK(cfg.io_threads > 0 && cfg.tokenize_threads > 0 && cfg.max_retries >= 0 &&
                   cfg.connect_timeout_ms > 0 && cfg.upstream_timeout_s > 0 && cfg.health_interval_ms > 0 &&
                   cfg.health_timeout_ms > 0 && cfg.eject_after > 0 && cfg.max_body_bytes > 0,
               "--io-threads, --tokenize-threads, the timeouts, --health-interval-ms, --eject-after and "
               "--max-body-bytes must be positive, --max-retries >= 0");
  std::string model_dir = args.get_or("model", "");
  const auto& pos = args.positional();
  BELUGA_CHECK(pos.size() <= 1, "one model directory expected, got '", pos.size() > 1 ? pos[1] : "", "' too");
  if (!pos.empty()) {
    BELUGA_CHECK(model_dir.empty() || model_dir == pos[0], "the model is given twice: ", pos[0],
                 " and --model ", model_dir);
    model_dir = pos[0];
  }
  if (model_dir.empty()) model_dir = file_model;
  args.check_all_used();  // before anything is read: a bad command line fails at once
  BELUGA_CHECK(
      !cfg.replicas.empty() || !cfg.buckets.empty() || !cfg.prefill.empty() || !cfg.decode.empty(),
      "at least one --replica URL is needed (or \"replicas\" in --config, or a --bucket), or --prefill "
      "and --decode URLs");
  if (model_dir.empty()) model_dir = default_model_dir();
  if (model_dir.size() > 12 && model_dir.ends_with("/config.json")) model_dir.resize(model_dir.size() - 12);

  server::Server::block_signals();
  auto model = std::make_unique<router::PromptModel>(router::PromptModel::from_dir(model_dir));
  router::Router r(cfg, std::move(model));
  r.listen();
  r.start();
  log::info("router", "routing to ", r.num_replicas(), " replica(s)",
            cfg.prefill.empty() ? std::string()
                                : ", " + std::to_string(cfg.prefill.size()) + " prefill + " +
                                      std::to_string(cfg.decode.size()) + " decode",
            " (policy ", router::policy_name(cfg.policy), ", tokenizer ", model_dir, ") on http://", cfg.host,
            ":", r.port());
  r.wait_for_signal();
  log::info("router", "shutting down");
  r.stop();
  return 0;
}

}  // namespace beluga::cli
