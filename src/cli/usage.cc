#include "cli/usage.h"

namespace beluga::cli {

namespace {

#define MODEL_OPTIONS                                                                         \
  "model options:\n"                                                                          \
  "  MODEL_DIR | --model DIR   model directory (or its config.json); default: the built-in\n" \
  "                            models/beluga-demo-coder\n"                                    \
  "  --load-format auto|safetensors|dummy   dummy: random weights from config.json\n"         \
  "  --threads N               CPU threads (default: all cores)\n"                            \
  "  --dtype float32|bfloat16  activation rounding for BF16 GEMMs (default float32)\n"        \
  "  --max-model-len N         context length (default: the model's)\n"                       \
  "  --device cpu|cuda         cuda in builds with the CUDA backend\n"                        \
  "  --enforce-eager           no CUDA graphs for decode steps\n"

struct Usage {
  std::string_view command;
  const char* text;
};

constexpr Usage kUsages[] = {
    {"generate",
     "usage: beluga generate [MODEL_DIR] --prompt-ids 1,2,3 [options]\n"
     "Greedy or sampled generation from token ids; prints the output ids.\n\n"
     "  --prompt-ids IDS          comma-separated prompt token ids (required)\n"
     "  --max-tokens N            tokens to generate (default 16)\n"
     "  --temperature T           0 = greedy (default 0)\n"
     "  --seed N                  sampling seed (default 0)\n"
     "  --stop-ids IDS            comma-separated ids that end generation\n"
     "  --prefill-chunk N         prefill in chunks of N tokens (default: whole prompt)\n"
     "  --mla-mode auto|expanded|absorbed\n"
     "  --format json|text        output format (default json)\n\n" MODEL_OPTIONS},
    {"logits",
     "usage: beluga logits [MODEL_DIR] --prompt-ids 1,2,3 --out FILE [options]\n"
     "Writes the prefill logits of every prompt position to a safetensors file (tensor \"logits\").\n\n"
     "  --prompt-ids IDS          comma-separated prompt token ids (required)\n"
     "  --out FILE                output .safetensors file (required)\n"
     "  --mla-mode auto|expanded|absorbed\n\n" MODEL_OPTIONS},
    {"inspect",
     "usage: beluga inspect [MODEL_DIR] [options]\n"
     "Prints a model's architecture, parameter count, dtypes and KV bytes per token as "
     "JSON.\n\n" MODEL_OPTIONS},
    {"router",
     "usage: beluga router --replica URL [--replica URL ...] [MODEL_DIR | --model DIR] [options]\n"
     "Load balancer in front of `beluga serve` replicas: proxies every route they serve (SSE streamed\n"
     "through), retries a request that has not started on another replica, ejects failing replicas.\n"
     "Formula and knobs: docs/router.md.\n\n"
     "  --replica URL             a replica, http://HOST:PORT (repeat for each; at most 64)\n"
     "  --config FILE             JSON: {\"replicas\": [URL, ...], \"policy\": ..., \"balance-window\": 8, "
     "...}:\n"
     "                            any option below without its dashes; the command line overrides it\n"
     "                            (--replica replaces the file's list)\n"
     "  --model DIR               tokenizer and chat format of the served model (no weights are read);\n"
     "                            default: the built-in models/beluga-demo-coder\n"
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
    {"bench",
     "usage: beluga bench model|tokenizer|serve|router|fleet [options]\n"
     "  model       prefill and decode throughput of one model on this machine\n"
     "  tokenizer   tokenizer throughput next to Hugging Face tokenizers\n"
     "  serve       load test of a running server (TTFT, TPOT, throughput, goodput)\n"
     "  router      the router's added latency and SSE relay rate against a synthetic upstream\n"
     "  fleet       routing policies side by side: replicas and a router per policy, a multi-tenant trace\n"
     "`beluga bench <name> --help` lists each one's options.\n"},
    {"bench model",
     "usage: beluga bench model [MODEL_DIR] [options]\n"
     "Prefill and decode throughput next to the machine's measured floor; --device cuda runs a sweep.\n\n"
     "  --batch N                 sequences (default 1)\n"
     "  --prompt-len N            prompt tokens (default 512)\n"
     "  --gen-len N               decode steps (default 32)\n"
     "  --out FILE                also write the results as JSON\n"
     "cuda only:\n"
     "  --decode-batches LIST     default 1,16,64,256\n"
     "  --decode-contexts LIST    default 1024,4096\n"
     "  --prefill-lens LIST       default 512,2048,8192\n"
     "  --steps N                 timed steps per point (default 8)\n"
     "  --sample gpu|host         where decode steps sample (default gpu)\n\n" MODEL_OPTIONS},
    {"bench tokenizer",
     "usage: beluga bench tokenizer --tokenizer tokenizer.json --input FILE [options]\n"
     "  --tokenizer FILE          tokenizer.json (required)\n"
     "  --input FILE              text to encode (required)\n"
     "  --chunk N                 bytes per encode call (default 16384)\n"
     "  --repeat N                runs, best kept (default 3)\n"
     "  --no-hf                   skip the Hugging Face tokenizers comparison\n"
     "  --hf-script FILE          the comparison script (Node, tests/tools/hf-bench.js)\n"
     "  --out FILE                also write the results as JSON\n"},
    {"bench serve",
     "usage: beluga bench serve [options]\n"
     "Load test of a running OpenAI-compatible server.\n\n"
     "  --url URL                 default http://127.0.0.1:8000\n"
     "  --model NAME              the served model name (default: the server's first)\n"
     "  --api-key KEY\n"
     "  --dataset random|shared-prefix|multi-turn   default random\n"
     "  --num-prompts N           default 100\n"
     "  --request-rate R|inf      requests per second (default inf)\n"
     "  --max-concurrency N       default: unlimited\n"
     "  --input-len N             default 128\n"
     "  --output-len N            default 64\n"
     "  --prefix-len N            shared-prefix: default 256\n"
     "  --num-prefixes N          shared-prefix: default 4\n"
     "  --num-turns N             multi-turn: default 4\n"
     "  --tenants N               multi-turn: N tenants, each with its own system prompt and API key\n"
     "                            (bench-tenant-I; with --api-key, that key for all); default 0: none\n"
     "  --system-len N            words of each tenant's system prompt (default 320)\n"
     "  --vocab-size N            random ids are drawn from [100, N) (default 4000)\n"
     "  --seed N                  default 0\n"
     "  --slo ttft_ms=N,tpot_ms=N,e2el_ms=N   goodput: requests per second meeting these\n"
     "  --out FILE                also write the results as JSON\n"},
    {"bench router",
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
    {"bench fleet",
     "usage: beluga bench fleet [options]\n"
     "Routing policies side by side on real processes: for each policy, N fresh `beluga serve` replicas\n"
     "and a `beluga router`, `bench serve`'s multi-turn multi-tenant trace through the router; one table\n"
     "of prefix hit rate (usage cached tokens), TTFT p50/p99, throughput and goodput per policy.\n\n"
     "  --replicas N              default 4\n"
     "  --policies LIST           default cache-aware,round-robin,least-load\n"
     "  --model DIR               default: the built-in models/beluga-demo-coder\n"
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
    {"tokenize",
     "usage: beluga tokenize --tokenizer tokenizer.json [--allow-special] [--jsonl] < text\n"
     "  --tokenizer FILE          tokenizer.json (required)\n"
     "  --allow-special           match added/special tokens in the text (default: plain text)\n"
     "  --jsonl                   one JSON string per input line -> one id list per line\n"},
    {"detokenize",
     "usage: beluga detokenize --tokenizer tokenizer.json [--skip-special] < ids\n"
     "  --tokenizer FILE          tokenizer.json (required)\n"
     "  --skip-special            leave special tokens out of the text\n"},
    {"render",
     "usage: beluga render --model DIR --request FILE [--api chat|responses|messages] [--chat-format NAME]\n"
     "Prints the prompt an API request becomes, as {\"prompt\": text, \"ids\": [...]}.\n\n"
     "  --model DIR               model directory (tokenizer and chat template)\n"
     "  --request FILE            the request body (JSON)\n"
     "  --api chat|responses|messages   default chat\n"
     "  --chat-format NAME        deepseek-v3, deepseek-r1, deepseek-v3.1, deepseek-v4, deepseek-v4.1, "
     "template\n"},
};

#undef MODEL_OPTIONS

}  // namespace

const char* command_usage(std::string_view command) {
  for (const auto& u : kUsages)
    if (u.command == command) return u.text;
  return nullptr;
}

}  // namespace beluga::cli
