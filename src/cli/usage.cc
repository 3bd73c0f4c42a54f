#include "cli/usage.h"

#include "cli/flag_table.h"

namespace beluga::cli {

namespace {

// The options every command that loads a model takes (model_args.h reads them).
FlagGroup model_options() {
  return {"model options",
          {{"model", "DIR",
            "model directory (or its config.json); default: the built-in models/beluga-demo-coder-mtp", true},
           {"load-format", "auto|safetensors|dummy", "dummy: random weights from config.json"},
           {"threads", "N", "CPU threads (default: all cores)"},
           {"dtype", "float32|bfloat16", "activation rounding for BF16 GEMMs (default float32)"},
           {"max-model-len", "N", "context length (default: the model's)"},
           {"device", "cpu|cuda", "cuda in builds with the CUDA backend"},
           {"enforce-eager", "", "no CUDA graphs for decode steps"}}};
}

}  // namespace

// One entry per command: its synopsis, summary and option table (flag_table.h), or, until it has a
// table, its usage text. Add a command as an entry here; keep one entry per command.
const std::vector<CommandUsage>& command_usages() {
  static const std::vector<CommandUsage> usages = {
      {.command = "serve",
       .synopsis = "[MODEL_DIR | --model DIR] [options]",
       .summary = "OpenAI / Anthropic compatible HTTP server (docs/api.md); SIGTERM or SIGINT drains it. "
                  "BELUGA_TRACE=FILE writes a Chrome-trace JSON of the engine's host spans per step and the "
                  "model's forwards (chrome://tracing, ui.perfetto.dev) when the server stops.",
       .groups =
           {{"",
             {{"host", "H", "address to listen on (default 127.0.0.1)"},
              {"port", "P", "port (default 8000; 0: any free port)"},
              {"served-model-name", "NAME",
               "the model id clients send and /v1/models lists (default: the "
               "model directory's name)"},
              {"api-key", "KEY", "require `Authorization: Bearer KEY` or `x-api-key: KEY` (default: none)"},
              {"tokenizer", "DIR",
               "tokenizer.json and tokenizer_config.json from DIR (default: the model's)"},
              {"chat-format", "NAME",
               "deepseek-v3, deepseek-r1, deepseek-v3.1, deepseek-v4, deepseek-v4.1, "
               "template (default: from the model)"},
              {"no-access-log", "", "no access log line per request on stderr"}}},
            {"engine",
             {{"max-num-seqs", "N", "sequences decoding at once (default 64)"},
              {"max-num-batched-tokens", "N",
               "tokens per engine step, prefill chunks and decodes (default 2048)"},
              {"max-queue-len", "N", "sequences waiting for the engine; past it, 429 (default 256)"},
              {"max-seqs-per-request", "N",
               "prompts x n one request may ask for; more is a 400 (default: "
               "--max-num-seqs)"},
              {"kv-cache-mb", "MB", "device KV cache size (default 1024)"},
              {"num-kv-blocks", "N", "KV cache blocks of 64 tokens (default: from --kv-cache-mb)"},
              {"no-enable-prefix-caching", "", "no prefix cache"},
              {"speculative-config", "JSON",
               "speculative decoding, as vLLM spells it: {\"method\":\"mtp\",\"num_speculative_tokens\":K} "
               "(\"gating\":\"cost\"|\"fixed\"; docs/speculative-decoding.md); off unless given"},
              {"no-async-scheduling", "",
               "run each step serially (schedule, launch, wait, apply); the reference for the overlapped "
               "loop"}}},
            {"structured outputs (docs/structured-outputs.md)",
             {{"grammar-compile-timeout-ms", "MS",
               "a schema or grammar that takes longer to compile is a 400 (default 10000)"},
              {"grammar-cache-size", "N",
               "compiled grammars kept, least recently used first out (default 256)"}}},
            {"KV tiers (docs/kv-cache.md)",
             {{"kv-host-gb", "G", "a host-memory tier of G GiB (fractions allowed; pinned memory on CUDA)"},
              {"kv-disk-dir", "DIR", "a file tier in DIR"},
              {"kv-disk-gb", "G",
               "the file tier's capacity (default: its size plus the free space at start)"},
              {"kv-retention", "CLASS=AGE,...",
               "how long each traffic class's blocks are kept after their last use "
               "(AGE: N[s|m|h|d]); merged over chat=7d,agent=3d"}}},
            {"limits (docs/reliability.md)",
             {{"max-body-bytes", "N", "larger request bodies get 413 (default 16777216)"},
              {"max-stored-responses", "N",
               "responses kept for previous_response_id; 0: none (default 1024)"},
              {"max-connections", "N", "open connections; one more is answered 503 (default 1024)"},
              {"header-timeout-s", "S", "a request's headers must arrive within S seconds (default 15)"},
              {"body-timeout-s", "S", "its body within S seconds after them (default 60)"},
              {"io-threads", "N", "HTTP I/O threads (default 2)"},
              {"build-threads", "N", "threads that parse, template and tokenize request bodies (default 2)"},
              {"build-queue", "N", "requests waiting for a build thread; past it, 503 (default 64)"},
              {"shutdown-grace-s", "S", "on SIGTERM, how long requests in flight may finish (default 30)"}}},
            model_options()}},
      {.command = "generate",
       .synopsis = "[MODEL_DIR] --prompt-ids 1,2,3 [options]",
       .summary = "Greedy or sampled generation from token ids; prints the output ids.",
       .groups = {{"",
                   {{"prompt-ids", "IDS", "comma-separated prompt token ids (required)"},
                    {"max-tokens", "N", "tokens to generate (default 16)"},
                    {"temperature", "T", "0 = greedy (default 0)"},
                    {"seed", "N", "sampling seed (default 0)"},
                    {"stop-ids", "IDS", "comma-separated ids that end generation"},
                    {"prefill-chunk", "N", "prefill in chunks of N tokens (default: whole prompt)"},
                    {"mla-mode", "auto|expanded|absorbed", ""},
                    {"format", "json|text", "output format (default json)"}}},
                  model_options()}},
      {.command = "logits",
       .synopsis = "[MODEL_DIR] --prompt-ids 1,2,3 --out FILE [options]",
       .summary =
           "Writes the prefill logits of every prompt position to a safetensors file (tensor \"logits\").",
       .groups = {{"",
                   {{"prompt-ids", "IDS", "comma-separated prompt token ids (required)"},
                    {"out", "FILE", "output .safetensors file (required)"},
                    {"mla-mode", "auto|expanded|absorbed", ""}}},
                  model_options()}},
      {.command = "inspect",
       .synopsis = "[MODEL_DIR] [options]",
       .summary = "Prints a model's architecture, parameter count, dtypes and KV bytes per token as JSON.",
       .groups = {model_options()}},
      {.command = "router",
       .text =
           "usage: beluga router --replica URL [--replica URL ...] [MODEL_DIR | --model DIR] [options]\n"
           "Load balancer in front of `beluga serve` replicas: proxies every route they serve (SSE streamed\n"
           "through), retries a request that has not started on another replica, ejects failing replicas.\n"
           "Formula and knobs: docs/router.md.\n\n"
           "  --replica URL             a replica, http://HOST:PORT (repeat for each; at most 64)\n"
           "  --config FILE             JSON: {\"replicas\": [URL, ...], \"policy\": ..., "
           "\"balance-window\": 8, "
           "...}:\n"
           "                            any option below without its dashes; the command line overrides it\n"
           "                            (--replica replaces the file's list)\n"
           "  --model DIR               tokenizer and chat format of the served model (no weights are "
           "read);\n"
           "                            default: the built-in models/beluga-demo-coder-mtp\n"
           "  --host H                  default 127.0.0.1\n"
           "  --port P                  default 8080 (0: any free port)\n"
           "  --policy cache-aware|round-robin|least-load   default cache-aware\n"
           "  --balance-window N        cache-aware: in-flight requests above the least-loaded replica that\n"
           "                            prefix affinity tolerates (default 8)\n"
           "  --load-cost-tokens T      cache-aware: one request in flight costs T uncached prompt tokens\n"
           "                            (default 128)\n"
           "  --index-blocks N          prefix index capacity in blocks (default 1048576)\n"
           "  --max-retries N           other replicas tried before a request fails (default 2)\n"
           "  --connect-timeout-ms N    default 2000\n"
           "  --upstream-timeout-s N    for a replica's response to begin and between reads (default 600)\n"
           "  --health-interval-ms N    GET /health on every replica this often (default 1000)\n"
           "  --health-timeout-ms N     default 1000\n"
           "  --eject-after N           consecutive failures that eject a replica (default 3)\n"
           "  --max-body-bytes N        default 16777216\n"
           "  --io-threads N            default 2\n"
           "  --tokenize-threads N      threads that render and tokenize prompts (default 1)\n"},
      {.command = "bench",
       .text =
           "usage: beluga bench model|tokenizer|serve|router|fleet|sampler [options]\n"
           "  model       prefill and decode throughput of one model on this machine\n"
           "  tokenizer   tokenizer throughput next to Hugging Face tokenizers\n"
           "  serve       load test of a running server (TTFT, TPOT, throughput, goodput)\n"
           "  router      the router's added latency and SSE relay rate against a synthetic upstream\n"
           "  fleet       routing policies side by side: replicas and a router per policy, a multi-tenant "
           "trace\n"
           "  sampler     the CPU sampler's cost per token\n"
           "`beluga bench <name> --help` lists each one's options.\n"},
      {.command = "bench model",
       .synopsis = "[MODEL_DIR] [options]",
       .summary =
           "Prefill and decode throughput next to the machine's measured floor; --device cuda runs a sweep.",
       .groups = {{"",
                   {{"batch", "N", "sequences (default 1)"},
                    {"prompt-len", "N", "prompt tokens (default 512)"},
                    {"gen-len", "N", "decode steps (default 32)"},
                    {"out", "FILE", "also write the results as JSON"}}},
                  {"cuda only",
                   {{"decode-batches", "LIST", "default 1,16,64,256"},
                    {"decode-contexts", "LIST", "default 1024,4096"},
                    {"prefill-lens", "LIST", "default 512,2048,8192"},
                    {"steps", "N", "timed steps per point (default 8)"},
                    {"sample", "gpu|host", "where decode steps sample (default gpu)"}}},
                  model_options()}},
      {.command = "bench tokenizer",
       .synopsis = "--tokenizer tokenizer.json --input FILE [options]",
       .summary = "",
       .groups = {{"",
                   {{"tokenizer", "FILE", "tokenizer.json (required)"},
                    {"input", "FILE", "text to encode (required)"},
                    {"chunk", "N", "bytes per encode call (default 16384)"},
                    {"repeat", "N", "runs, best kept (default 3)"},
                    {"no-hf", "", "skip the Hugging Face tokenizers comparison"},
                    {"hf-script", "FILE", "the comparison script (Node, tests/tools/hf-bench.js)"},
                    {"out", "FILE", "also write the results as JSON"}}}}},
      {.command = "bench serve",
       .synopsis = "[options]",
       .summary = "Load test of a running OpenAI-compatible server. ITL is per token: streams ask for "
                  "stream_options.continuous_usage_stats and a chunk that brings k tokens after a gap g "
                  "counts k gaps of g/k (per-event ITL is reported too).",
       .groups = {{"",
                   {{"url", "URL", "default http://127.0.0.1:8000"},
                    {"model", "NAME", "the served model name (default: the server's first)"},
                    {"api-key", "KEY", ""},
                    {"dataset", "random|shared-prefix|multi-turn", "default random"},
                    {"num-prompts", "N", "default 100"},
                    {"request-rate", "R|inf", "requests per second (default inf)"},
                    {"max-concurrency", "N", "default: unlimited"},
                    {"input-len", "N", "default 128"},
                    {"output-len", "N", "default 64"},
                    {"prefix-len", "N", "shared-prefix: default 256"},
                    {"num-prefixes", "N", "shared-prefix: default 4"},
                    {"num-turns", "N", "multi-turn: default 4"},
                    {"tenants", "N",
                     "multi-turn: N tenants, each with its own system prompt and API key (bench-tenant-I; "
                     "with --api-key, that key for all); default 0: none"},
                    {"system-len", "N", "words of each tenant's system prompt (default 320)"},
                    {"vocab-size", "N", "random ids are drawn from [100, N) (default 4000)"},
                    {"seed", "N", "default 0"},
                    {"slo", "ttft_ms=N,tpot_ms=N,e2el_ms=N", "goodput: requests per second meeting these"},
                    {"out", "FILE", "also write the results as JSON"}}}}},
      {.command = "bench sampler",
       .text =
           "usage: beluga bench sampler [options]\n"
           "The CPU sampler's cost per token for each vocabulary size and a set of sampling parameters.\n\n"
           "  --vocab LIST              vocabulary sizes (default 8192,131072)\n"
           "  --iters N                 timed calls per point (default 200)\n"
           "  --out FILE                also write the results as JSON\n"},
      {.command = "bench router",
       .text =
           "usage: beluga bench router [options]\n"
           "The router's added latency per request and its SSE relay rate, against a synthetic upstream in\n"
           "this process (no model runs), for the round-robin and cache-aware policies.\n\n"
           "  --requests N              sequential non-streamed requests timed per path (default 2000)\n"
           "  --streams N               concurrent streaming clients (default 16)\n"
           "  --rounds N                streams each client runs (default 4)\n"
           "  --events N                SSE events per stream (default 2000)\n"
           "  --io-threads N            the router's I/O threads (default 2)\n"
           "  --model DIR               tokenizer for the cache-aware policy (default: the built-in model)\n"
           "  --out FILE                also write the results as JSON\n"},
      {.command = "bench fleet",
       .text =
           "usage: beluga bench fleet [options]\n"
           "Routing policies side by side on real processes: for each policy, N fresh `beluga serve` "
           "replicas\n"
           "and a `beluga router`, `bench serve`'s multi-turn multi-tenant trace through the router; one "
           "table\n"
           "of prefix hit rate (usage cached tokens), TTFT p50/p99, throughput and goodput per policy.\n\n"
           "  --replicas N              default 4\n"
           "  --policies LIST           default cache-aware,round-robin,least-load\n"
           "  --model DIR               default: the built-in models/beluga-demo-coder-mtp\n"
           "  --replica-threads N       each replica's --threads (default 1)\n"
           "  --kv-cache-mb N           each replica's --kv-cache-mb (default 64)\n"
           "  --kv-disk-dir DIR         the replicas of each policy share a file tier in DIR/POLICY (new)\n"
           "  --num-prompts N           requests (default 64)\n"
           "  --num-turns N             turns per conversation (default 4)\n"
           "  --tenants N               default 4\n"
           "  --system-len N            words of each tenant's system prompt (default 200)\n"
           "  --input-len N             words per user turn (default 24)\n"
           "  --output-len N            tokens per answer (default 16)\n"
           "  --max-concurrency N       conversations in flight (default 4)\n"
           "  --request-rate R|inf      conversations started per second (default inf)\n"
           "  --seed N                  default 0\n"
           "  --slo ttft_ms=N,tpot_ms=N,e2el_ms=N   goodput's SLO (default ttft_ms=1000,tpot_ms=100)\n"
           "  --out FILE                also write the results as JSON\n"},
      {.command = "tokenize",
       .synopsis = "--tokenizer tokenizer.json [--allow-special] [--jsonl] < text",
       .summary = "",
       .groups = {{"",
                   {{"tokenizer", "FILE", "tokenizer.json (required)"},
                    {"allow-special", "", "match added/special tokens in the text (default: plain text)"},
                    {"jsonl", "", "one JSON string per input line -> one id list per line"}}}}},
      {.command = "detokenize",
       .synopsis = "--tokenizer tokenizer.json [--skip-special] < ids",
       .summary = "",
       .groups = {{"",
                   {{"tokenizer", "FILE", "tokenizer.json (required)"},
                    {"skip-special", "", "leave special tokens out of the text"}}}}},
      {.command = "render",
       .synopsis = "--model DIR --request FILE [--api chat|responses|messages] [--chat-format NAME]",
       .summary = "Prints the prompt an API request becomes, as {\"prompt\": text, \"ids\": [...]}.",
       .groups = {{"",
                   {{"model", "DIR", "model directory (tokenizer and chat template)"},
                    {"request", "FILE", "the request body (JSON)"},
                    {"api", "chat|responses|messages", "default chat"},
                    {"chat-format", "NAME",
                     "deepseek-v3, deepseek-r1, deepseek-v3.1, deepseek-v4, deepseek-v4.1, template"}}}}},
      {.command = "help",
       .synopsis = "COMMAND | --markdown",
       .summary = "A command's usage, or every command's options as Markdown (docs/configuration.md).",
       .groups = {{"", {{"markdown", "", "print every command's options as Markdown"}}}}},
  };
  return usages;
}

std::optional<std::string> command_usage(std::string_view command) {
  const CommandUsage* u = find_usage(command);
  if (!u) return std::nullopt;
  return usage_text(*u);
}

}  // namespace beluga::cli
