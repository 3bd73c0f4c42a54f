// `beluga serve [MODEL_DIR] [--host H] [--port P] ...`: the OpenAI / Anthropic compatible HTTP
// server. Listens first (so /health answers 503 while the model loads), loads the model, its
// tokenizer and chat format, starts the engine, then serves until SIGINT/SIGTERM.
#include <cstdio>
#include <memory>
#include <optional>

#include <nlohmann/json.hpp>

#include "cli/args.h"
#include "cli/commands.h"
#include "cli/model_args.h"
#include "engine/engine.h"
#include "recipe/chat_format.h"
#include "server/server.h"
#include "tokenizer/tokenizer.h"
#include "util/error.h"
#include "util/file.h"

namespace beluga::cli {

namespace {

constexpr const char* kUsage =
    "usage: beluga serve [MODEL_DIR | --model DIR] [--host 127.0.0.1] [--port 8000] [--served-model-name "
    "NAME]\n"
    "                    [--api-key KEY] [--max-num-seqs 64] [--max-num-batched-tokens 2048]\n"
    "                    [--max-model-len N] [--max-queue-len 256] [--max-body-bytes 16777216]\n"
    "                    [--max-stored-responses 1024]\n"
    "                    [--kv-cache-mb 1024] [--num-kv-blocks N] [--no-enable-prefix-caching]\n"
    "                    [--tokenizer DIR] [--chat-format NAME] [--io-threads 2] [--threads N] [--dtype "
    "float32|bfloat16]\n"
    "                    [--load-format auto|dummy] [--device cpu|cuda] [--enforce-eager]\n"
    "                    [--no-access-log]\n";

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

}  // namespace

int cmd_serve(int argc, char** argv) {
  Args args(argc, argv, {"no-enable-prefix-caching", "enforce-eager", "no-access-log", "help"});
  if (args.has("help")) {
    std::fputs(kUsage, stdout);
    return 0;
  }
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
  scfg.access_log = !args.has("no-access-log");

  EngineConfig ecfg;
  ecfg.max_num_seqs = int(args.get_int("max-num-seqs", ecfg.max_num_seqs));
  ecfg.max_num_batched_tokens = int(args.get_int("max-num-batched-tokens", ecfg.max_num_batched_tokens));
  ecfg.max_queue_len = int(args.get_int("max-queue-len", ecfg.max_queue_len));
  ecfg.max_model_len = int(args.get_int("max-model-len", 0));
  ecfg.num_kv_blocks = int(args.get_int("num-kv-blocks", 0));
  ecfg.kv_cache_bytes = size_t(args.get_int("kv-cache-mb", long(ecfg.kv_cache_bytes >> 20))) << 20;
  ecfg.enable_prefix_caching = !args.has("no-enable-prefix-caching");
  BELUGA_CHECK(ecfg.max_num_seqs > 0 && ecfg.max_num_batched_tokens > 0 && ecfg.max_queue_len >= 0,
               "--max-num-seqs and --max-num-batched-tokens must be positive, --max-queue-len non-negative");
  const ModelArgs model_args = parse_model_args(args);
  // --tokenizer DIR: tokenizer.json and tokenizer_config.json from elsewhere (as vLLM's flag), e.g. for
  // a dummy-weight benchmark of a config that ships no tokenizer.
  const auto tokenizer_dir = args.get("tokenizer");
  const auto served_name = args.get("served-model-name");
  const auto format_name = args.get("chat-format");
  std::optional<recipe::ChatFormat> format;
  if (format_name) {
    format = recipe::parse_chat_format(*format_name);
    BELUGA_CHECK(format, "unknown --chat-format '", *format_name,
                 "' (deepseek-v3, deepseek-r1, deepseek-v3.1, deepseek-v4, deepseek-v4.1, template)");
  }
  args.check_all_used();  // before listening or loading: a bad command line fails at once

  server::Server server(scfg);
  server.listen();
  server.start();
  std::fprintf(stderr, "beluga serve: listening on http://%s:%d (loading the model)\n", scfg.host.c_str(),
               server.port());

  LoadedModel m = load_model_dir(model_args);
  const std::string tok_dir = tokenizer_dir ? *tokenizer_dir : m.dir;
  const tok::Tokenizer tokenizer = tok::Tokenizer::from_file(tok_dir + "/tokenizer.json");
  BELUGA_CHECK(int(tokenizer.vocab_size()) <= m.cfg.vocab_size, "the tokenizer in ", tok_dir, " has ",
               tokenizer.vocab_size(), " tokens, more than the model's vocabulary of ", m.cfg.vocab_size);
  const recipe::ChatEncoder encoder = recipe::ChatEncoder::from_model_dir(tok_dir, format);

  auto engine = std::make_unique<Engine>(*m.model, ecfg);
  auto handle = server::wrap_engine(*engine);
  server::ModelInfo info;
  info.served_name = served_name ? *served_name : basename_of(m.dir);
  info.tokenizer = &tokenizer;
  info.encoder = &encoder;
  info.max_model_len = engine->max_model_len();
  info.bos_token_id = m.cfg.bos_token_id;
  generation_defaults(m.dir, info);
  server.set_engine(handle.get(), info);
  std::fprintf(
      stderr,
      "beluga serve: serving %s (%s, chat format %s, max model len %d) on http://%s:%d — loaded in %.2f s\n",
      info.served_name.c_str(), m.dir.c_str(), recipe::chat_format_name(encoder.format()), info.max_model_len,
      scfg.host.c_str(), server.port(), m.load_seconds);

  server.wait_for_signal();
  std::fprintf(stderr, "beluga serve: shutting down\n");
  server.stop();
  handle.reset();
  engine.reset();  // pending requests finish with kAbort; their outputs go nowhere
  return 0;
}

}  // namespace beluga::cli
