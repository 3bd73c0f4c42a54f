#include "cli/usage.h"

#include "cli/flag_table.h"

namespace beluga::cli {

namespace {

// The options every command that loads a model takes (model_args.h reads them).
FlagGroup model_options() {
  return {
      "model options",
      {{"model", "DIR",
        "model directory (or its config.json); default: the built-in models/beluga-demo-coder-mtp", true},
       {"load-format", "auto|safetensors|dummy", "dummy: random weights from config.json"},
       {"threads", "N", "CPU threads (default: all cores)"},
       {"dtype", "float32|bfloat16", "activation rounding for BF16 GEMMs (default float32)"},
       {"max-model-len", "N", "context length (default: the model's)"},
       {"device", "cpu|cuda",
        "default cpu, also in a CUDA build (the serve log names it); cuda needs a build with the CUDA "
        "backend"},
       {"enforce-eager", "", "no CUDA graphs for decode steps"},
       {"deterministic", "",
        "batch-invariant results: a request gives the same token ids and logprobs alone or in any "
        "batch, with prefix hits and chunked prefill; unseeded requests use seed 0; CPU, and CUDA for "
        "DeepSeek V2/V3 and Llama/Qwen; with --speculative-config too (docs/deterministic.md)"},
       {"expert-parallel-size", "N",
        "routed experts split over N thread ranks, each stepping every batch (CPU; CUDA: rank r on GPU r, "
        "eager steps; DeepSeek V2/V3; a failed rank restarts the instance over the ranks left; default 1)"},
       {"data-parallel-size", "N",
        "attention data parallelism: N thread ranks, each with a KV cache of its own (--num-kv-blocks / "
        "--kv-cache-mb per rank) stepping only its own sequences, the routed experts split over the same "
        "ranks (--expert-parallel-size N implied); a request goes to the rank holding the longest cached "
        "prefix for it, else the freest; host sampling; KV tiers and MTP steps on each block's and "
        "sequence's rank; DeepSeek V2/V3; default 1"},
       {"tensor-parallel-size", "N",
        "attention heads and MLP split over N thread ranks (Megatron: q/k/v and gate/up by rows, o and down "
        "by columns, their outputs summed), each stepping every batch; Llama/Qwen: each rank caches its own "
        "KV heads (--num-kv-blocks / --kv-cache-mb per rank); DeepSeek V2/V3: the query heads and dense "
        "layers split, the latent cache on every rank, the routed experts over the same ranks; N must divide "
        "the heads (and KV heads) and the intermediate size; CPU, CUDA: rank r on GPU r, eager steps; a "
        "failed rank restarts the instance over the ranks left; default 1"},
       {"eplb", "",
        "live expert-parallel load balancing with --expert-parallel-size: each MoE layer's routed tokens "
        "are counted per expert and DeepSeek's EPLB moves and replicates experts between steps (one info "
        "line per rebalance; on CUDA from a checkpoint, not dummy weights); implied by the --eplb-* options "
        "below; off: the contiguous layout, "
        "fixed"},
       {"eplb-redundant-experts", "R",
        "with --eplb: extra expert slots per rank for replicas of hot experts "
        "(default 0)"},
       {"eplb-interval", "N", "with --eplb: rebalance every N steps (default 1000; 0: never)"},
       {"eplb-window", "W", "with --eplb: the routing statistics cover the last W steps (default 1000)"}}};
}

// The server's and the router's log level (util/log.h).
Flag log_level_flag() {
  return {"log-level", "error|warn|info|debug",
          "stderr lines at this level and above (default: BELUGA_LOG_LEVEL, else info); the access log "
          "has its own switch"};
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
              {"no-access-log", "", "no access log line per request on stderr"},
              log_level_flag()}},
            {"engine",
             {{"max-num-seqs", "N", "sequences decoding at once (default 64)"},
              {"max-num-batched-tokens", "N",
               "tokens per engine step, prefill chunks and decodes (default 2048)"},
              {"itl-target-ms", "MS",
               "decode inter-token latency target: decodes go first and each step's prefill is what "
               "the fitted step cost (a + b x tokens) leaves under MS, capped by "
               "--max-num-batched-tokens (default 0: off, the whole cap)"},
              {"min-prefill-tokens", "N",
               "prefill tokens a step always carries under --itl-target-ms while prompts wait: no "
               "starvation (default 64)"},
              {"ttft-slo-ms", "MS",
               "admission: waiting prompts shortest first, those waiting MS or more ahead of them in "
               "arrival order (default 0: off, arrival order)"},
              {"max-queue-len", "N", "sequences waiting for the engine; past it, 429 (default 256)"},
              {"max-seqs-per-request", "N",
               "prompts x n one request may ask for; more is a 400 (default: "
               "--max-num-seqs)"},
              {"kv-cache-mb", "MB", "device KV cache size (default 1024)"},
              {"num-kv-blocks", "N", "KV cache blocks of 64 tokens (default: from --kv-cache-mb)"},
              {"no-enable-prefix-caching", "", "no prefix cache"},
              {"speculative-config", "JSON",
               "speculative decoding, as vLLM spells it: "
               "{\"method\":\"mtp\"|\"ngram\",\"num_speculative_tokens\":K} "
               "(\"gating\":\"confidence\" (default)|\"cost\"|\"fixed\", \"prompt_lookup_max\":N for ngram; "
               "docs/speculative-decoding.md); "
               "off unless given"},
              {"no-async-scheduling", "",
               "run each step serially (schedule, launch, wait, apply); the reference for the overlapped "
               "loop"},
              {"no-device-sampling", "",
               "sample every step on the engine thread (by default rows are sampled with the forward: on "
               "the GPU with CUDA, on the model runner's thread on the CPU; penalties, logit bias, grammar "
               "masks and up to 20 top logprobs included; a row with top logprobs and penalties or bias "
               "goes to the engine thread)"}}},
            {"structured outputs (docs/structured-outputs.md)",
             {{"grammar-compile-timeout-ms", "MS",
               "a schema or grammar that takes longer to compile is a 400 (default 10000)"},
              {"grammar-cache-size", "N",
               "compiled grammars kept, least recently used first out (default 256)"},
              {"grammar-threads", "N",
               "threads beside the engine's that fill a step's token masks in parallel (default: none "
               "below 8 cores, else min(7, cores/2 - 1); 0: the engine thread alone)"}}},
            {"KV tiers (docs/kv-cache.md)",
             {{"kv-host-gb", "G", "a host-memory tier of G GiB (fractions allowed; pinned memory on CUDA)"},
              {"kv-disk-dir", "DIR", "a file tier in DIR"},
              {"kv-disk-gb", "G",
               "the file tier's capacity (default: its size plus the free space at start)"},
              {"kv-retention", "CLASS=AGE,...",
               "how long each traffic class's blocks are kept after their last use "
               "(AGE: N[s|m|h|d]); merged over chat=7d,agent=3d"},
              {"kv-disk-io", "auto|io_uring|threads",
               "the file tier's I/O: auto takes io_uring when the kernel allows it, else threads (the "
               "log says which; default auto)"},
              {"kv-disk-sync", "none|data|full",
               "sync each block file before its rename: data (fdatasync: blocks survive a power loss), "
               "full (fsync and its directory); none relies on the checksums, a torn file being a miss "
               "(default none)"},
              {"kv-events-ring", "N",
               "KV block events kept for GET /v1/kv/events, a router's cache index (docs/router.md); "
               "0: off (default 65536)"}}},
            {"prefill/decode disaggregation (docs/disaggregation.md)",
             {{"role", "both|prefill|decode",
               "prefill: compute prompts and send their KV to the decode engine the router names; decode: "
               "receive KV and generate (both take a host tier, 2 GiB unless --kv-host-gb); default both"},
              {"kv-listen", "HOST:PORT",
               "--role decode: where KV transfers arrive (default 127.0.0.1:0, any free port; /health "
               "reports it)"}}},
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
       .synopsis = "--replica URL [--replica URL ...] [MODEL_DIR | --model DIR] [options]",
       .summary = "Load balancer in front of `beluga serve` replicas: proxies every route they serve (SSE "
                  "streamed through), retries a request that has not started on another replica, ejects "
                  "failing replicas. Formula and knobs: docs/router.md.",
       .groups = {{"",
                   {{"replica", "URL", "a replica, http://HOST:PORT (repeat for each; at most 64)"},
                    {"prefill", "URL",
                     "disaggregated serving instead of --replica: an engine started with --role prefill "
                     "(repeat for each; docs/disaggregation.md)"},
                    {"decode", "URL",
                     "with --prefill: an engine started with --role decode, which generates from the KV the "
                     "prefill engine sends it (repeat for each)"},
                    {"config", "FILE",
                     "JSON: {\"replicas\": [URL, ...], \"policy\": ..., \"balance-window\": 8, ...}: any "
                     "option here but --config and --replica, without its dashes; the command line "
                     "overrides it (--replica, --prefill, --decode replace the file's lists)"},
                    {"model", "DIR",
                     "tokenizer and chat format of the served model (no weights are read); default: the "
                     "built-in models/beluga-demo-coder-mtp",
                     true},
                    {"host", "H", "default 127.0.0.1"},
                    {"port", "P", "default 8080 (0: any free port)"},
                    log_level_flag()}},
                  {"routing",
                   {{"policy", "cache-aware|round-robin|least-load", "default cache-aware"},
                    {"balance-window", "N",
                     "cache-aware: in-flight requests above the least-loaded replica that prefix affinity "
                     "tolerates (default 8)"},
                    {"load-cost-tokens", "T",
                     "cache-aware: one request in flight costs T uncached prompt tokens (default 128)"},
                    {"host-block-cost", "F",
                     "cache-aware: loading a cached block from a replica's host-memory tier costs F of "
                     "recomputing it (default 0.1; from its block events)"},
                    {"disk-block-cost", "F", "... from its file tier (default 0.4)"},
                    {"index-blocks", "N",
                     "approximate prefix index capacity in blocks, for replicas without block events "
                     "(default 1048576)"},
                    {"kv-events-interval-ms", "N",
                     "read each replica's GET /v1/kv/events this often (default 100)"},
                    {"replica-api-key", "KEY", "the replicas' --api-key, for reading their block events"},
                    {"bucket", "NAME:MAX=URL,URL",
                     "prefill-length bucket: prompts of up to MAX tokens (16K, 65536, inf) go to these "
                     "replicas; the smallest MAX that holds a prompt wins (repeat for each; its URLs need no "
                     "--replica; not in --config)"}}},
                  {"replicas and limits",
                   {{"max-retries", "N", "other replicas tried before a request fails (default 2)"},
                    {"connect-timeout-ms", "N", "default 2000"},
                    {"upstream-timeout-s", "N",
                     "for a replica's response to begin and between reads (default 600)"},
                    {"health-interval-ms", "N", "GET /health on every replica this often (default 1000)"},
                    {"health-timeout-ms", "N", "default 1000"},
                    {"eject-after", "N", "consecutive failures that eject a replica (default 3)"},
                    {"max-body-bytes", "N", "default 16777216"},
                    {"io-threads", "N", "default 2"},
                    {"tokenize-threads", "N", "threads that render and tokenize prompts (default 1)"}}}}},
      {.command = "bench",
       .text =
           "usage: beluga bench model|tokenizer|serve|router|fleet|pd|sampler|kv|grammar|ep|eplb [options]\n"
           "  model       prefill and decode throughput of one model on this machine\n"
           "  tokenizer   tokenizer throughput next to Hugging Face tokenizers\n"
           "  serve       load test of a running server (TTFT, TPOT, throughput, goodput)\n"
           "  router      the router's added latency and SSE relay rate against a synthetic upstream\n"
           "  fleet       routing policies side by side: replicas and a router per policy, a multi-tenant "
           "trace\n"
           "  pd          prefill/decode disaggregation against colocated serving, and the KV transfer rate\n"
           "  sampler     the CPU sampler's cost per token\n"
           "  kv          the KV tiers' bandwidth and TTFT from each tier; --agent-trace: agent sessions\n"
           "  grammar     structured outputs: grammar compile time and per-token mask time\n"
           "  ep          expert parallelism on CPU thread ranks: all-to-all rate against memcpy, MoE layer\n"
           "  eplb        expert-parallel load balancing: max/mean expert load per GPU before and after "
           "EPLB\n"
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
                    {"sample", "gpu|host|device|host-sampled", "default gpu (docs/performance.md)"}}},
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
       .groups =
           {{"",
             {{"url", "URL", "default http://127.0.0.1:8000"},
              {"model", "NAME", "the served model name (default: the server's first)"},
              {"api-key", "KEY", ""},
              {"dataset", "random|shared-prefix|multi-turn", "default random"},
              {"num-prompts", "N", "default 100"},
              {"request-rate", "R|inf", "requests per second (default inf)"},
              {"max-concurrency", "N", "default: unlimited"},
              {"input-len", "N", "default 128"},
              {"output-len", "N", "default 64"},
              {"random-range-ratio", "R",
               "each request's input and output lengths uniform in [len (1 - R), len (1 + R)], R in [0, 1) "
               "(random, shared-prefix; default 0: equal lengths, which keep a closed loop in lockstep)"},
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
              {"request-extra", "JSON", "fields merged into every request body (default {})"},
              {"out", "FILE", "also write the results as JSON"}}}}},
      {.command = "bench sampler",
       .synopsis = "[options]",
       .summary = "The CPU sampler's cost per token for each vocabulary size and a set of sampling "
                  "parameters.",
       .groups = {{"",
                   {{"vocab", "LIST", "vocabulary sizes (default 8192,131072)"},
                    {"iters", "N", "timed calls per point (default 200)"},
                    {"out", "FILE", "also write the results as JSON"}}}}},
      {.command = "bench ep",
       .synopsis = "[options]",
       .summary =
           "Expert parallelism on CPU thread ranks: LocalCommunicator's all_to_all_v against memcpy of the "
           "same bytes, one MoE layer expert parallel against one rank's Ops::moe, and live EPLB on a skewed "
           "router: max/mean routed rows per rank before and after a rebalance.",
       .groups = {{"",
                   {{"ranks", "LIST", "group sizes (default 2,4)"},
                    {"rows", "LIST", "rows each rank sends per all_to_all_v (default 64,1024,8192)"},
                    {"hidden", "N", "floats per row (default 2048)"},
                    {"iters", "N", "timed runs per point, median kept (default 20)"},
                    {"moe-tokens", "N", "tokens of the MoE layer, split over the ranks (default 256)"},
                    {"experts", "N", "routed experts (default 16)"},
                    {"top-k", "N", "experts per token (default 4)"},
                    {"moe-inter", "N", "expert intermediate size (default 256)"},
                    {"eplb-redundant", "LIST", "live EPLB: redundant expert slots per rank (default 0,2)"},
                    {"eplb-skew", "S", "live EPLB: router bias -S ln(E - e) on expert e of E (default 10)"},
                    {"eplb-steps", "N",
                     "live EPLB: steps before and after the rebalance (default 16; 0: skip)"},
                    {"out", "FILE", "also write the results as JSON"}}}}},
      {.command = "bench router",
       .synopsis = "[options]",
       .summary = "The router's added latency per request and its SSE relay rate, against a synthetic "
                  "upstream in this process (no model runs), for the round-robin and cache-aware "
                  "policies.",
       .groups = {{"",
                   {{"requests", "N", "sequential non-streamed requests timed per path (default 2000)"},
                    {"streams", "N", "concurrent streaming clients (default 16)"},
                    {"rounds", "N", "streams each client runs (default 4)"},
                    {"events", "N", "SSE events per stream (default 2000)"},
                    {"io-threads", "N", "the router's I/O threads (default 2)"},
                    {"model", "DIR", "tokenizer for the cache-aware policy (default: the built-in model)"},
                    {"out", "FILE", "also write the results as JSON"}}}}},
      {.command = "bench pd",
       .synopsis = "[--model DIR] [--cores 0,1] [options]",
       .summary =
           "Prefill/decode disaggregation against colocated serving: the KV transfer's rate against "
           "loopback TCP's measured in the same run (the model's blocks, host tier to host tier), then "
           "one Poisson trace of long prompts through a colocated `beluga serve` on --cores and "
           "through `beluga router` with a prefill engine on the first core and a decode engine on "
           "the rest: TTFT, TPOT and per-token ITL percentiles (docs/performance.md).",
       .groups = {{"",
                   {{"model", "DIR", "default: the built-in models/beluga-demo-coder-mtp"},
                    {"cores", "LIST", "the cores to pin to (default 0,1)"},
                    {"transfer-mb", "N", "bytes of the transfer measurement (default 256)"},
                    {"repeat", "N", "transfer measurements, the best and worst reported (default 3)"},
                    {"connections", "N",
                     "the striped transfer's connections, and the loopback peer's (default 4; one connection "
                     "is measured too)"},
                    {"transfer-only", "", "stop after the transfer measurement"},
                    {"block-bytes", "N",
                     "the transfer's block size (default: the model's, its weights loaded on the CPU)"},
                    {"serve-args", "\"ARGS\"",
                     "each engine's own options, e.g. \"--device cuda --load-format dummy --tokenizer DIR\""},
                    {"router-model", "DIR", "the router's tokenizer and chat format (default --model)"},
                    {"kv-cache-mb", "N", "each engine's KV cache (default 256)"},
                    {"num-prompts", "N", "default 48"},
                    {"input-len", "N", "prompt tokens (default 768)"},
                    {"output-len", "N", "default 96"},
                    {"request-rate", "R", "Poisson arrivals per second (default 2)"},
                    {"max-concurrency", "N", "default 16"},
                    {"seed", "N", "default 0"},
                    {"out", "FILE", "also write the results as JSON"}}}}},
      {.command = "bench fleet",
       .synopsis = "[options]",
       .summary = "Routing policies side by side on real processes: for each policy, N fresh `beluga "
                  "serve` replicas and a `beluga router`, `bench serve`'s multi-turn multi-tenant trace "
                  "through the router; one table of prefix hit rate (usage cached tokens), TTFT p50/p99, "
                  "throughput and goodput per policy.",
       .groups = {{"",
                   {{"replicas", "N", "default 4"},
                    {"policies", "LIST", "default cache-aware,round-robin,least-load"},
                    {"model", "DIR", "default: the built-in models/beluga-demo-coder-mtp"},
                    {"replica-threads", "N", "each replica's --threads (default 1)"},
                    {"kv-cache-mb", "N", "each replica's --kv-cache-mb (default 64)"},
                    {"kv-disk-dir", "DIR",
                     "the replicas of each policy share a file tier in DIR/POLICY (new)"},
                    {"out", "FILE", "also write the results as JSON"}}},
                  {"the trace (bench serve's multi-turn dataset)",
                   {{"num-prompts", "N", "requests (default 64)"},
                    {"num-turns", "N", "turns per conversation (default 4)"},
                    {"tenants", "N", "default 4"},
                    {"system-len", "N", "words of each tenant's system prompt (default 200)"},
                    {"input-len", "N", "words per user turn (default 24)"},
                    {"output-len", "N", "tokens per answer (default 16)"},
                    {"max-concurrency", "N", "conversations in flight (default 4)"},
                    {"request-rate", "R|inf", "conversations started per second (default inf)"},
                    {"seed", "N", "default 0"},
                    {"slo", "ttft_ms=N,tpot_ms=N,e2el_ms=N",
                     "goodput's SLO (default ttft_ms=1000,tpot_ms=100)"}}}}},
      {.command = "bench kv",
       .synopsis = "[MODEL_DIR] [--kv-disk-dir DIR] [options] | --agent-trace [options]",
       .summary = "The KV tiers against the machine's own limits measured in the same run, and the time "
                  "to first token of a request whose prefix sits in each tier against recomputing it. "
                  "--agent-trace instead runs multi-turn agent sessions whose contexts outgrow the device "
                  "pool, with the tiers off, a host tier and (with --kv-disk-dir) a file tier, and checks "
                  "every mode generated the same tokens.",
       .groups = {{"",
                   {{"kv-disk-dir", "DIR", "also measure a file tier in DIR (default: host tier only)"},
                    {"json", "", "print the results as JSON"}}},
                  {"tiers and TTFT (without --agent-trace)",
                   {{"lengths", "LIST", "prompt lengths in tokens (default 2048,16384)"},
                    {"prefix-frac", "F", "the share of each prompt in a tier, in (0, 1) (default 0.9)"},
                    {"blocks", "N", "blocks per bandwidth measurement (default 256)"},
                    {"kv-disk-io", "auto|io_uring|threads", "the file tier's I/O path (default auto)"},
                    {"kv-disk-sync", "none|data|full", "the sync of each block file (default none)"},
                    {"io-block-bytes", "N",
                     "block file size of the file-tier rate table (default: the model's block)"},
                    {"repeat", "N", "each file-tier measurement's repeats, the best kept (default 3)"},
                    {"bandwidth-only", "", "stop after the bandwidth tables"}}},
                  {"agent trace",
                   {{"agent-trace", "", "run the agent-session trace"},
                    {"sessions", "N", "default 16"},
                    {"turns", "N", "turns per session (default 6)"},
                    {"concurrency", "N", "sessions at once (default 4)"},
                    {"system-tokens", "N", "the shared system prompt (default 512)"},
                    {"turn-tokens", "N", "each turn's user/tool message (default 256)"},
                    {"answer-tokens", "N", "each answer (default 16)"},
                    {"device-blocks", "N",
                     "device pool (default: what the concurrent sessions need at their longest, plus 8)"},
                    {"kv-host-gb", "G", "host tier (default: room for the whole trace)"},
                    {"json-out", "FILE", "also write the results as JSON"}}},
                  model_options()}},
      {.command = "bench grammar",
       .synopsis = "--tokenizer DIR|FILE (--schemas DIR | --grammars DIR) [options]",
       .summary = "Compiles every DIR/NAME.json schema (--schemas) and DIR/NAME.regex, .gbnf, .lark grammar "
                  "(--grammars), then walks each instance of DIR/NAME.instances.jsonl token by token, "
                  "timing the mask over the whole vocabulary at every step; prints compile-time and "
                  "per-token mask-time percentiles.",
       .groups = {{"",
                   {{"tokenizer", "DIR|FILE", "tokenizer.json, or the directory holding it (required)"},
                    {"schemas", "DIR", "JSON Schemas and their instances"},
                    {"grammars", "DIR", "regex, GBNF and Lark grammars and their instances"},
                    {"repeat", "N", "compiles of each (default 3)"},
                    {"max-whitespace", "N",
                     "schemas: whitespace bytes allowed wherever JSON allows them (default 0)"},
                    {"batch", "B",
                     "also time a decode step's masks at batch B: B sequences walk the instances in "
                     "lockstep, their masks filled together (default 0: off)"},
                    {"batch-threads", "LIST",
                     "--batch: the mask worker counts to compare, beside the calling thread (default 0,1)"},
                    {"out", "FILE", "also write the results as JSON"}}}}},
      {.command = "bench eplb",
       .synopsis = "[--experts 256 --groups 8 --top-k 8 --layers 58 --gpus 8,16,32,64] [options]",
       .summary = "DeepSeek's expert-parallel load balancer (EPLB) on a seeded Zipf routing distribution, no "
                  "model or GPU needed: max/mean routed tokens per GPU on held-out tokens before (no "
                  "redundancy, contiguous placement) and after (hierarchical and global policies, with and "
                  "without replica spreading), the rebalance's CPU time and the slots a rebalance rewrites "
                  "(docs/performance.md).",
       .groups = {{"",
                   {{"experts", "N", "routed experts per MoE layer (default 256)"},
                    {"groups", "N", "expert groups (default 8)"},
                    {"top-k", "N", "experts per token (default 8)"},
                    {"layers", "N", "MoE layers (default 58, DeepSeek-V3's)"},
                    {"gpus", "LIST", "expert-parallel sizes (default 8,16,32,64)"},
                    {"nodes", "LIST", "nodes per --gpus entry, or one for all (default: 8 GPUs a node)"},
                    {"redundant-per-gpu", "LIST", "redundant expert slots per GPU (default 1,4)"},
                    {"zipf", "S", "skew of each layer's expert popularity (default 1.0; 0: uniform)"},
                    {"tokens", "N", "tokens per statistics window, and as many held out (default 8192)"},
                    {"step-tokens", "N", "tokens per step as the load window records them (default 256)"},
                    {"seed", "N", "default 0"},
                    {"repeat", "N", "timed rebalances per row, the median reported (default 5)"},
                    {"out", "FILE", "also write the results as JSON"}}}}},
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
      {.command = "grammar",
       .text = "usage: beluga grammar check [options]\n"
               "  check       a JSON Schema, regex or grammar against candidate outputs\n"
               "`beluga grammar check --help` lists its options.\n"},
      {.command = "grammar check",
       .synopsis = "--tokenizer DIR|FILE (--schema FILE | --regex RE | --gbnf FILE) --instances FILE.jsonl "
                   "[options]",
       .summary = "Reads one JSON string per line (a candidate output text), feeds its tokens through the "
                  "matcher and prints {\"accepted\": bool, \"complete\": bool} per line. Exit 0 when the "
                  "grammar compiled, 2 when it is refused (the reason on stderr), 1 on other errors.",
       .groups = {{"",
                   {{"tokenizer", "DIR|FILE", "tokenizer.json, or the directory holding it (required)"},
                    {"schema", "FILE", "a JSON Schema (drafts 4, 6, 7, 2020-12)"},
                    {"regex", "RE", "an ECMAScript regex the whole output must match"},
                    {"gbnf", "FILE",
                     "a grammar in llama.cpp's GBNF (root ::= ...) or the Lark subset (start: ...)"},
                    {"instances", "FILE", "candidate outputs, one JSON string per line (required)"},
                    {"draft", "4|6|7|2020-12", "the schema's draft (default: from $schema, else 2020-12)"},
                    {"max-whitespace", "N",
                     "whitespace bytes allowed wherever JSON allows them, 0..16 (default 0)"},
                    {"compile-timeout-ms", "MS", "default 10000"},
                    {"dump-masks", "FILE",
                     "also write every step's full-vocabulary mask as a JSON line (instance, step, allowed, "
                     "accepting, mask in hex), to compare masks with another implementation"}}}}},
      {.command = "kv",
       .text = "usage: beluga kv stats|gc --kv-disk-dir DIR [options]\n"
               "  stats       what a KV file tier's directory holds: blocks, bytes, by class, oldest use\n"
               "  gc          remove the blocks past their class's retention, and abandoned partial files\n"
               "`beluga kv <name> --help` lists each one's options.\n"},
      {.command = "kv stats",
       .synopsis = "--kv-disk-dir DIR [--json]",
       .summary = "What a KV directory holds: blocks, bytes, by class, the oldest last use.",
       .groups = {{"",
                   {{"kv-disk-dir", "DIR", "the file tier's directory (required)"},
                    {"json", "", "print JSON"}}}}},
      {.command = "kv gc",
       .synopsis = "--kv-disk-dir DIR [--kv-retention chat=7d,agent=3d] [--now UNIX_SECONDS] [--json]",
       .summary = "Removes the blocks past their class's retention as of --now, and the temporary files of "
                  "writers that are gone (judged by the real clock and the writer's pid, never by --now). "
                  "Counts are blocks.",
       .groups = {{"",
                   {{"kv-disk-dir", "DIR", "the file tier's directory (required)"},
                    {"kv-retention", "CLASS=AGE,...", "as `serve` takes it, same defaults"},
                    {"now", "UNIX_SECONDS", "the time retention is judged at (default: now)"},
                    {"json", "", "print JSON"}}}}},
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
