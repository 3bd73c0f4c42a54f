// `beluga serve [MODEL_DIR] [--host H] [--port P] ...`: the OpenAI / Anthropic compatible HTTP
// server. Listens first (so /health answers 503 while the model loads), loads the model, its
// tokenizer and chat format, starts the engine, then serves until SIGINT/SIGTERM.
#include <sys/resource.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>

#include <nlohmann/json.hpp>

#include "cli/args.h"
#include "cli/commands.h"
#include "cli/flag_table.h"
#include "cli/kv_args.h"
#include "cli/model_args.h"
#include "cli/serving_engine.h"
#include "engine/engine.h"
#include "engine/kv_events.h"
#include "engine/spec_config.h"
#include "grammar/vocab.h"
#include "kvstore/kv_receiver.h"
#include "kvstore/metrics_text.h"
#include "kvstore/tcp_kv_transfer.h"
#include "kvstore/transfer_metrics.h"
#include "recipe/chat_format.h"
#include "server/grammar_cache.h"
#include "server/grammar_metrics.h"
#include "server/server.h"
#include "tokenizer/tokenizer.h"
#include "util/error.h"
#include "util/file.h"
#include "util/log.h"

namespace beluga::cli {

namespace {

std::string basename_of(std::string dir) {
  while (dir.size() > 1 && dir.back() == '/') dir.pop_back();
  size_t p = dir.rfind('/');
  return p == std::string::npos ? dir : dir.substr(p + 1);
}

// Sampling defaults from generation_config.json (as vLLM applies them), when present.
void generation_defaults(const std::string& dir, server::ModelInfo& info) {
  const std::string path = dir + "/generation_config.json";
  if (!file_exists(path)) return;
  auto j = nlohmann::json::parse(read_file(path), nullptr, false);
  if (!j.is_object()) return;
  if (j.contains("temperature") && j["temperature"].is_number())
    info.default_temperature = j["temperature"].get<float>();
  if (j.contains("top_p") && j["top_p"].is_number()) info.default_top_p = j["top_p"].get<float>();
  if (j.contains("top_k") && j["top_k"].is_number_integer()) info.default_top_k = j["top_k"].get<int>();
}

// Each connection holds a descriptor: lift the soft limit (often 1024) toward the hard one so that
// --max-connections is reached before accept() runs out of descriptors.
void raise_fd_limit(int max_connections) {
  rlimit lim{};
  if (getrlimit(RLIMIT_NOFILE, &lim) != 0) return;
  const rlim_t want = rlim_t(max_connections) + 256;  // model files, engine, stdio
  if (lim.rlim_cur < want) {
    lim.rlim_cur = lim.rlim_max == RLIM_INFINITY ? want : std::min(want, lim.rlim_max);
    setrlimit(RLIMIT_NOFILE, &lim);
  }
  if (getrlimit(RLIMIT_NOFILE, &lim) == 0 && lim.rlim_cur < want)
    log::warn("serve", "the descriptor limit (", lim.rlim_cur, ") is below --max-connections + 256");
}

// For the server's fault tests (tests/server/fault_test.cc): BELUGA_TEST_FAIL_STEPS=FROM:COUNT makes
// engine steps FROM .. FROM+COUNT-1 throw, as a failing forward would. Not a user option.
void inject_step_failures(EngineConfig& ecfg) {
  const char* v = std::getenv("BELUGA_TEST_FAIL_STEPS");
  if (!v || !*v) return;
  long long from = 0, count = 0;
  BELUGA_CHECK(std::sscanf(v, "%lld:%lld", &from, &count) == 2 && from >= 0 && count >= 0,
               "BELUGA_TEST_FAIL_STEPS must be FROM:COUNT");
  log::warn("serve", "test mode: engine steps ", from, "..", from + count - 1, " fail");
  ecfg.step_hook = [from, count](int64_t step) {
    if (step >= from && step < from + count)
      throw std::runtime_error("injected step failure (BELUGA_TEST_FAIL_STEPS) at step " +
                               std::to_string(step));
  };
}

// Tests of failure handling: BELUGA_TEST_FAIL_RANK=R:STEP makes expert-parallel thread rank R fail
// from its STEP-th step on (the instance restarts over the ranks left).
void inject_rank_failure(ModelArgs& ma) {
  const char* v = std::getenv("BELUGA_TEST_FAIL_RANK");
  if (!v || !*v) return;
  int rank = 0;
  unsigned long long at = 0;
  BELUGA_CHECK(std::sscanf(v, "%d:%llu", &rank, &at) == 2 && rank >= 1 && rank < group_ranks(ma),
               "BELUGA_TEST_FAIL_RANK must be RANK:STEP with 1 <= RANK < --expert-parallel-size");
  log::warn("serve", "test mode: thread rank ", rank, " fails from its step ", at, " on");
  ma.ep_fault = {rank, at};
}

}  // namespace

int cmd_serve(int argc, char** argv) {
  Args args = Args::for_command(argc, argv, "serve");
  if (args.has("help")) {
    std::fputs(usage_text(usage_of("serve")).c_str(), stdout);
    return 0;
  }
  // Before the other options: the warnings they may log obey it.
  log::set_level(log::level_from(args.get("log-level")));
  server::Server::block_signals();

  server::ServerConfig scfg;
  scfg.host = args.get_or("host", "127.0.0.1");
  scfg.port = int(args.get_int("port", 8000));
  BELUGA_CHECK(scfg.port >= 0 && scfg.port < 65536, "--port must be 0..65535");
  scfg.api_key = args.get_or("api-key", "");
  scfg.max_body_bytes = size_t(args.get_int("max-body-bytes", long(scfg.max_body_bytes)));
  const long stored = args.get_int("max-stored-responses", long(scfg.max_stored_responses));
  BELUGA_CHECK(stored >= 0, "--max-stored-responses must be >= 0");
  scfg.max_stored_responses = size_t(stored);
  scfg.io_threads = int(args.get_int("io-threads", 2));
  scfg.max_connections = int(args.get_int("max-connections", scfg.max_connections));
  scfg.header_timeout_s = int(args.get_int("header-timeout-s", scfg.header_timeout_s));
  scfg.body_timeout_s = int(args.get_int("body-timeout-s", scfg.body_timeout_s));
  BELUGA_CHECK(scfg.max_connections > 0 && scfg.header_timeout_s > 0 && scfg.body_timeout_s > 0,
               "--max-connections, --header-timeout-s and --body-timeout-s must be positive");
  raise_fd_limit(scfg.max_connections);
  scfg.build_threads = int(args.get_int("build-threads", scfg.build_threads));
  const long build_queue = args.get_int("build-queue", long(scfg.build_queue));
  BELUGA_CHECK(scfg.build_threads > 0 && build_queue > 0,
               "--build-threads and --build-queue must be positive");
  scfg.build_queue = size_t(build_queue);
  const int grace_s = int(args.get_int("shutdown-grace-s", 30));
  BELUGA_CHECK(grace_s >= 0, "--shutdown-grace-s must be >= 0");
  scfg.access_log = !args.has("no-access-log");

  EngineConfig ecfg;
  ecfg.max_num_seqs = int(args.get_int("max-num-seqs", ecfg.max_num_seqs));
  ecfg.max_num_batched_tokens = int(args.get_int("max-num-batched-tokens", ecfg.max_num_batched_tokens));
  ecfg.max_queue_len = int(args.get_int("max-queue-len", ecfg.max_queue_len));
  ecfg.latency.itl_target_ms = args.get_double("itl-target-ms", 0);
  ecfg.latency.ttft_slo_ms = args.get_double("ttft-slo-ms", 0);
  ecfg.latency.min_prefill_tokens = int(args.get_int("min-prefill-tokens", ecfg.latency.min_prefill_tokens));
  BELUGA_CHECK(ecfg.latency.itl_target_ms >= 0 && ecfg.latency.ttft_slo_ms >= 0,
               "--itl-target-ms and --ttft-slo-ms must be >= 0 (0: off)");
  BELUGA_CHECK(ecfg.latency.min_prefill_tokens > 0, "--min-prefill-tokens must be positive");
  ecfg.max_model_len = int(args.get_int("max-model-len", 0));
  ecfg.num_kv_blocks = int(args.get_int("num-kv-blocks", 0));
  ecfg.kv_cache_bytes = size_t(args.get_int("kv-cache-mb", long(ecfg.kv_cache_bytes >> 20))) << 20;
  ecfg.enable_prefix_caching = !args.has("no-enable-prefix-caching");
  ecfg.async_scheduling = !args.has("no-async-scheduling");  // the serial reference loop
  ecfg.device_sampling = !args.has("no-device-sampling");    // the host sampler for every step
  ecfg.deterministic = args.has("deterministic");            // with the backends' kernels (model_args)
  if (const char* trace = std::getenv("BELUGA_TRACE"); trace && *trace) ecfg.trace_path = trace;
  if (args.has("speculative-config"))
    ecfg.speculative = parse_spec_config(args.get_or("speculative-config", ""));
  BELUGA_CHECK(ecfg.max_num_seqs > 0 && ecfg.max_num_batched_tokens > 0 && ecfg.max_queue_len >= 0,
               "--max-num-seqs and --max-num-batched-tokens must be positive, --max-queue-len non-negative");
  // One request's fan-out (prompts x n), in sequences: by default one full batch.
  const int max_seqs_per_request = int(args.get_int("max-seqs-per-request", ecfg.max_num_seqs));
  BELUGA_CHECK(max_seqs_per_request > 0, "--max-seqs-per-request must be positive");
  inject_step_failures(ecfg);
  // Structured outputs: each compile's time limit (a 400 past it) and how many compiled grammars stay.
  server::GrammarCacheOptions gopt;
  const long compile_ms = args.get_int("grammar-compile-timeout-ms", long(gopt.timeout.count()));
  const long cache_size = args.get_int("grammar-cache-size", long(gopt.capacity));
  BELUGA_CHECK(compile_ms > 0 && cache_size >= 0,
               "--grammar-compile-timeout-ms must be positive, --grammar-cache-size non-negative");
  if (args.has("grammar-threads")) {
    ecfg.mask_threads = int(args.get_int("grammar-threads", 0));
    BELUGA_CHECK(ecfg.mask_threads >= 0 && ecfg.mask_threads <= 256, "--grammar-threads must be 0-256");
  }
  gopt.timeout = std::chrono::milliseconds(compile_ms);
  gopt.capacity = size_t(cache_size);
  ModelArgs model_args = parse_model_args(args);
  model_args.progress_lines = log::enabled(log::Level::kInfo);  // serve's stderr is its log
  inject_rank_failure(model_args);
  // --tokenizer DIR: tokenizer.json and tokenizer_config.json from elsewhere (as vLLM's flag), e.g. for
  // a dummy-weight benchmark of a config that ships no tokenizer.
  const auto tokenizer_dir = args.get("tokenizer");
  KvFlags kv_flags = parse_kv_flags(args);
  // Disaggregated serving: a prefill engine sends each prompt's KV from its host tier, a decode engine
  // receives it into its own; both need one (2 GiB unless --kv-host-gb says otherwise).
  const std::string role_name = args.get_or("role", "both");
  const auto role = server::parse_serve_role(role_name);
  BELUGA_CHECK(role, "--role must be both, prefill or decode (not '", role_name, "')");
  BELUGA_CHECK(!args.has("kv-listen") || *role == server::ServeRole::kDecode,
               "--kv-listen is for --role decode (the engine that receives KV)");
  std::string kv_listen_host = "127.0.0.1";
  int kv_listen_port = 0;
  if (args.has("kv-listen")) {
    std::string port;
    const std::string v = args.get_or("kv-listen", "");
    BELUGA_CHECK(kv::split_host_port(v, &kv_listen_host, &port), "--kv-listen must be HOST:PORT (not '", v,
                 "')");
    kv_listen_port = std::stoi(port);
  }
  if (*role != server::ServeRole::kBoth && kv_flags.host_gb <= 0) kv_flags.host_gb = 2;
  const auto served_name = args.get("served-model-name");
  const auto format_name = args.get("chat-format");
  std::optional<recipe::ChatFormat> format;
  if (format_name) {
    format = recipe::parse_chat_format(*format_name);
    BELUGA_CHECK(format, "unknown --chat-format '", *format_name,
                 "' (deepseek-v3, deepseek-r1, deepseek-v3.1, deepseek-v4, deepseek-v4.1, template)");
  }
  // KV block events for a router's cache index (GET /v1/kv/events): the ring's capacity; 0: off.
  const long kv_events_ring = args.get_int("kv-events-ring", 65536);
  BELUGA_CHECK(kv_events_ring >= 0, "--kv-events-ring must be >= 0");
  args.check_all_used();  // before listening or loading: a bad command line fails at once

  server::Server server(scfg);
  server.listen();
  server.start();
  log::info("serve", "listening on http://", scfg.host, ":", server.port(), " (loading the model)");

  LoadedModel m = load_model_dir(model_args);
  BELUGA_CHECK(
      ecfg.speculative.method != SpecConfig::Method::kMtp || m.model->has_mtp(),
      "--speculative-config: method \"mtp\" needs a model with an MTP module (num_nextn_predict_layers > 0 ",
      "and its weights); ", m.dir, " has none (method \"ngram\", prompt lookup, needs none)");
  const std::string tok_dir = tokenizer_dir ? *tokenizer_dir : m.dir;
  // Before the store and the engine, which report to it.
  const auto kv_events = kv_events_ring > 0 ? std::make_unique<KvEventLog>(size_t(kv_events_ring)) : nullptr;
  const KvOptions kv =
      open_kv_tiers(kv_flags, m, ecfg.speculative, kv_events.get());  // its store outlives the engine
  ecfg.kv_connector = kv.store.get();
  ecfg.kv_events = kv_events.get();
  const tok::Tokenizer tokenizer = tok::Tokenizer::from_file(tok_dir + "/tokenizer.json");
  BELUGA_CHECK(int(tokenizer.vocab_size()) <= m.cfg.vocab_size, "the tokenizer in ", tok_dir, " has ",
               tokenizer.vocab_size(), " tokens, more than the model's vocabulary of ", m.cfg.vocab_size);
  // The chat format follows the served model's config (a DeepSeek-V4 checkpoint gets the V4 format
  // even with --tokenizer from elsewhere).
  const recipe::ChatEncoder encoder = recipe::ChatEncoder::from_model_dir(tok_dir, format, m.cfg.model_type);

  auto engine = std::make_unique<ServingEngine>(m, model_args, ecfg);
  server::ModelInfo info;
  info.served_name = served_name ? *served_name : basename_of(m.dir);
  info.tokenizer = &tokenizer;
  info.encoder = &encoder;
  info.max_model_len = engine->max_model_len();
  info.bos_token_id = m.cfg.bos_token_id;
  info.max_seqs_per_request = max_seqs_per_request;
  // The grammar's end-of-sequence ids are the engine's stop ids (the model's EOS).
  info.grammars = std::make_shared<server::GrammarCache>(
      std::make_shared<const grammar::TokenVocab>(tokenizer, m.cfg.eos_token_ids, size_t(m.cfg.vocab_size)),
      gopt);
  generation_defaults(m.dir, info);
  info.traffic_classes = kv.retention.classes();
  info.kv_events = kv_events.get();
  std::unique_ptr<kv::TcpKvTransfer> transfer;
  std::unique_ptr<kv::KvReceiver> receiver;
  info.pd.role = *role;
  if (*role == server::ServeRole::kPrefill) {
    kv::TcpTransferConfig tc;
    tc.fingerprint = kv.store->fingerprint();
    tc.block_bytes = kv.store->block_bytes();
    transfer = std::make_unique<kv::TcpKvTransfer>(tc);
    info.pd.store = kv.store.get();
    info.pd.transfer = transfer.get();
  } else if (*role == server::ServeRole::kDecode) {
    kv::ReceiverConfig rc;
    rc.host = kv_listen_host;
    rc.port = kv_listen_port;
    rc.fingerprint = kv.store->fingerprint();
    rc.block_bytes = kv.store->block_bytes();
    receiver = std::make_unique<kv::KvReceiver>(rc, *kv.store);
    info.pd.kv_address = receiver->address();
  }
  info.extra_metrics = [&kv, &engine, &transfer, &receiver, grammars = info.grammars,
                        name = info.served_name] {
    std::string out =
        kv.store ? kv::render_metrics(*kv.store, engine->handle().stats(), name) : std::string();
    if (transfer || receiver)
      out += kv::render_transfer_metrics(transfer ? &transfer->counters() : nullptr,
                                         receiver ? &receiver->counters() : nullptr, name);
    return out + server::render_grammar_metrics(*grammars, name) + engine->metrics(name);
  };
  server.set_engine(&engine->handle(), info);
  if (*role != server::ServeRole::kBoth)
    log::info("serve", "role ", server::serve_role_name(*role), receiver ? ", receiving KV on " : "",
              receiver ? receiver->address() : std::string());
  char load_s[32];
  std::snprintf(load_s, sizeof(load_s), "%.2f", m.load_seconds);
  // The device first: a CUDA build still defaults to the CPU (`--device cuda` picks the GPU).
  log::info("serve", "serving ", info.served_name, " on ", model_args.device, " (", m.dir, ", chat format ",
            recipe::chat_format_name(encoder.format()), ", max model len ", info.max_model_len,
            ") on http://", scfg.host, ":", server.port(), " — loaded in ", load_s, " s");

  server.wait_for_signal();
  log::info("serve", "draining (up to ", grace_s, " s for the requests in flight)");
  const bool clean = server.drain(std::chrono::seconds(grace_s));
  log::info("serve", "shutting down (",
            clean ? "every request finished" : "the grace period ended; the rest were cut short", ")");
  server.stop();
  const bool gave_up = engine->gave_up();
  engine.reset();    // pending requests finish with kAbort; their outputs go nowhere
  receiver.reset();  // before the store it writes into
  return gave_up ? 1 : 0;
}

}  // namespace beluga::cli
