// `beluga bench serve`: drives a running server with streaming requests (a Beast HTTP client, one
// thread per request in flight) and reports what `vllm bench serve` does: request and token
// throughput, TTFT, TPOT, ITL and end-to-end latency (mean, p50, p90, p99), prefix-cache hit rate
// (from the usage the server returns) and goodput under --slo.
//
// ITL is per token. One SSE event may carry several tokens (tokens that decode to no text on their
// own, a stop-string hold-back, speculative steps), so the gaps between events are not the gaps
// between tokens. The requests ask for vLLM's stream_options.continuous_usage_stats: each chunk then
// carries the choice's completion_tokens so far, counted by the server, and an event that brings k
// new tokens after a gap g adds k inter-token latencies of g / k (SGLang's bench_serving does the
// same); tokens that come with the first text count as gaps of 0. The gaps are spread, not invented:
// per-token ITL sums to the same stream time as per-event ITL. A server that sends no per-chunk
// usage is counted one token per text event, and the report says so ("itl_token_source": "events").
// Per-event ITL is reported too ("itl_event").
//
// Datasets: random (token-id prompts to /v1/completions, exact lengths), shared-prefix (a few
// long common prefixes + random suffixes), multi-turn (chat conversations to /v1/chat/completions,
// each turn sent after the previous answer, carrying the history; with --tenants N each conversation
// belongs to one of N tenants, each with its own system prompt and API key, the prefix-cache salt).
#include "cli/bench_serve.h"

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstdio>
#include <fstream>
#include <limits>
#include <mutex>
#include <random>
#include <thread>

#include <utility>  // before Asio: Boost 1.74's awaitable.hpp uses std::exchange

#include <boost/asio.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <nlohmann/json.hpp>

#include "cli/args.h"
#include "util/error.h"
#include "util/progress.h"

namespace beluga::cli {

namespace {

namespace net = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using tcp = net::ip::tcp;
using Json = nlohmann::ordered_json;
using Clock = std::chrono::steady_clock;

struct Url {
  std::string host = "127.0.0.1";
  std::string port = "8000";
};

Url parse_url(std::string u) {
  Url r;
  if (u.rfind("http://", 0) == 0) u = u.substr(7);
  BELUGA_CHECK(u.find("https://") != 0, "--url: https is not supported");
  size_t slash = u.find('/');
  if (slash != std::string::npos) u = u.substr(0, slash);
  size_t colon = u.rfind(':');
  if (colon != std::string::npos) {
    r.host = u.substr(0, colon);
    r.port = u.substr(colon + 1);
  } else if (!u.empty()) {
    r.host = u;
    r.port = "80";
  }
  return r;
}

struct Result {
  bool ok = false;
  std::string error;
  double ttft = 0, e2e = 0;
  std::vector<double> itl_event;  // gaps between content chunks
  std::vector<double> itl;        // per token (see the top of the file)
  bool counted = false;           // the server counted the tokens of each chunk
  int prompt_tokens = 0, cached_tokens = 0, output_tokens = 0;
  std::string text;  // the assistant's answer (multi-turn history)
};

// One streaming POST; content chunks are timed as they arrive.
Result send(const Url& url, const std::string& target, const std::string& body, const std::string& api_key) {
  Result r;
  const auto t0 = Clock::now();
  try {
    net::io_context ioc;
    tcp::resolver resolver(ioc);
    beast::tcp_stream stream(ioc);
    stream.connect(resolver.resolve(url.host, url.port));
    stream.socket().set_option(tcp::no_delay(true));
    http::request<http::string_body> req(http::verb::post, target, 11);
    req.set(http::field::host, url.host);
    req.set(http::field::content_type, "application/json");
    if (!api_key.empty()) req.set(http::field::authorization, "Bearer " + api_key);
    req.body() = body;
    req.prepare_payload();
    http::write(stream, req);

    beast::flat_buffer buf;
    http::response_parser<http::buffer_body> p;
    // Not boost::none: Boost 1.74's parser then reports body_limit for any body with a Content-Length.
    p.body_limit(std::numeric_limits<std::uint64_t>::max());
    http::read_header(stream, buf, p);
    const int status = int(p.get().result_int());
    if (status != 200) {  // the error's JSON, whole (a buffer_body parser would need one more step)
      http::response_parser<http::string_body> whole(std::move(p));
      beast::error_code ec;
      http::read(stream, buf, whole, ec);
      r.error = "HTTP " + std::to_string(status) + ": " + whole.get().body().substr(0, 300);
      return r;
    }
    std::string pending;
    char tmp[16384];
    auto last = t0;
    bool first = true;
    // Per-token timing: the server's running count of the choice's tokens, and when it last grew.
    int64_t count = 0, count_at_first = 0;
    auto last_arrival = t0;
    while (!p.is_done()) {
      p.get().body().data = tmp;
      p.get().body().size = sizeof(tmp);
      beast::error_code ec;
      http::read_some(stream, buf, p, ec);
      if (ec == http::error::need_buffer) ec = {};
      if (ec) throw beast::system_error(ec);
      const size_t n = sizeof(tmp) - p.get().body().size;
      pending.append(tmp, n);
      size_t pos;
      while ((pos = pending.find("\n\n")) != std::string::npos) {
        std::string frame = pending.substr(0, pos);
        pending.erase(0, pos + 2);
        if (frame.rfind("data: ", 0) != 0) continue;
        std::string data = frame.substr(6);
        if (data == "[DONE]") continue;
        Json j = Json::parse(data, nullptr, false);
        if (j.is_discarded()) continue;
        if (j.contains("error")) throw Error(j["error"].value("message", "server error"));
        const auto now = Clock::now();
        bool content = false;
        int64_t chunk_count = -1;  // this chunk's completion_tokens so far (continuous usage)
        const bool has_choices = j.contains("choices") && j["choices"].is_array() && !j["choices"].empty();
        if (has_choices && j.contains("usage") && j["usage"].is_object() &&
            j["usage"].contains("completion_tokens") && j["usage"]["completion_tokens"].is_number_integer())
          chunk_count = j["usage"]["completion_tokens"].get<int64_t>();
        if (j.contains("choices"))
          for (const auto& c : j["choices"]) {
            std::string t;
            if (c.contains("text") && c["text"].is_string()) t = c["text"].get<std::string>();
            if (c.contains("delta") && c["delta"].contains("content") && c["delta"]["content"].is_string())
              t = c["delta"]["content"].get<std::string>();
            if (!t.empty()) {
              content = true;
              r.text += t;
            }
          }
        if (chunk_count >= 0) r.counted = true;
        // Tokens the server counted but that made no text yet (a partial UTF-8 sequence, or ids a
        // benchmark's foreign tokenizer has no bytes for) are output too: a request of only those is
        // not "no output", and its first token is its TTFT.
        if (chunk_count > count) content = true;
        if (content) {
          if (first) {
            r.ttft = std::chrono::duration<double>(now - t0).count();
            count_at_first = std::max<int64_t>(1, chunk_count);
            // The tokens that came with the first text beyond the first: no gap to measure.
            for (int64_t k = 1; k < count_at_first; ++k) r.itl.push_back(0.0);
            count = count_at_first;
            last_arrival = now;
          } else {
            r.itl_event.push_back(std::chrono::duration<double>(now - last).count());
            if (chunk_count < 0) {  // no count from the server: one token per text event
              r.itl.push_back(std::chrono::duration<double>(now - last_arrival).count());
              last_arrival = now;
            }
          }
          first = false;
          last = now;
        }
        if (!first && chunk_count > count) {  // k new tokens after a gap g: k gaps of g / k
          const double g = std::chrono::duration<double>(now - last_arrival).count();
          const int64_t k = chunk_count - count;
          for (int64_t i = 0; i < k; ++i) r.itl.push_back(g / double(k));
          count = chunk_count;
          last_arrival = now;
        }
        if (j.contains("usage") && j["usage"].is_object()) {
          const Json& u = j["usage"];
          r.prompt_tokens = u.value("prompt_tokens", 0);
          r.output_tokens = u.value("completion_tokens", 0);
          if (u.contains("prompt_tokens_details") && u["prompt_tokens_details"].is_object())
            r.cached_tokens = u["prompt_tokens_details"].value("cached_tokens", 0);
        }
      }
    }
    beast::error_code ec;
    stream.socket().shutdown(tcp::socket::shutdown_both, ec);
    r.e2e = std::chrono::duration<double>(Clock::now() - t0).count();
    r.ok = !first;
    if (!r.ok) r.error = "no output";
  } catch (const std::exception& e) {
    r.error = e.what();
  }
  return r;
}

struct Stat {
  double mean = 0, p50 = 0, p90 = 0, p99 = 0, p999 = 0, max = 0;  // p99.9 and max: the tail that users see
};
Stat stats(std::vector<double> v) {
  Stat s;
  if (v.empty()) return s;
  std::sort(v.begin(), v.end());
  double sum = 0;
  for (double x : v) sum += x;
  s.mean = sum / double(v.size());
  auto pct = [&](double q) {
    double idx = q * double(v.size() - 1);
    size_t lo = size_t(std::floor(idx)), hi = size_t(std::ceil(idx));
    return v[lo] + (v[hi] - v[lo]) * (idx - double(lo));
  };
  s.p50 = pct(0.5);
  s.p90 = pct(0.9);
  s.p99 = pct(0.99);
  s.p999 = pct(0.999);
  s.max = v.back();
  return s;
}

// Random words for chat text (multi-turn).
std::string words(std::mt19937_64& rng, int n) {
  static const char* kWords[] = {"def",    "return", "value",  "list",  "json",   "path", "file",
                                 "open",   "read",   "write",  "class", "import", "data", "parse",
                                 "config", "number", "string", "loop",  "index",  "key"};
  std::string s;
  for (int i = 0; i < n; ++i) {
    if (i) s += ' ';
    s += kWords[rng() % (sizeof(kWords) / sizeof(kWords[0]))];
  }
  return s;
}

}  // namespace

int bench_serve(int argc, char** argv) {
  Args args = Args::for_command(argc, argv, "bench serve");
  const Url url = parse_url(args.get_or("url", "http://127.0.0.1:8000"));
  const std::string dataset = args.get_or("dataset", "random");
  const int num_prompts = int(args.get_int("num-prompts", 100));
  const std::string rate_s = args.get_or("request-rate", "inf");
  const int max_conc = int(args.get_int("max-concurrency", 0));
  const int input_len = int(args.get_int("input-len", 128));
  const int output_len = int(args.get_int("output-len", 64));
  // Each request's input and output lengths uniform in [len (1 - r), len (1 + r)] (vLLM's
  // --random-range-ratio): with equal outputs a closed loop keeps its requests in lockstep (they end
  // together and their prompts arrive in waves), which favours whichever server stays in step.
  const double range_ratio = std::stod(args.get_or("random-range-ratio", "0"));
  const int prefix_len = int(args.get_int("prefix-len", 256));
  const int num_prefixes = int(args.get_int("num-prefixes", 4));
  const int num_turns = int(args.get_int("num-turns", 4));
  const int tenants = int(args.get_int("tenants", 0));
  const int system_len = int(args.get_int("system-len", 320));  // words of each tenant's system prompt
  const int vocab = int(args.get_int("vocab-size", 4000));      // random ids are drawn from [100, vocab)
  const uint64_t seed = uint64_t(args.get_int("seed", 0));
  const std::string api_key = args.get_or("api-key", "");
  const std::string slo_s = args.get_or("slo", "");
  // Request fields merged into every body (sampling parameters, response_format, ...).
  const Json extra = Json::parse(args.get_or("request-extra", "{}"));
  BELUGA_CHECK(extra.is_object(), "--request-extra must be a JSON object");
  const auto out_path = args.get("out");
  std::string model = args.get_or("model", "");
  args.check_all_used();
  BELUGA_CHECK(dataset == "random" || dataset == "shared-prefix" || dataset == "multi-turn",
               "--dataset must be random, shared-prefix or multi-turn");
  BELUGA_CHECK(num_prompts > 0 && input_len > 0 && output_len > 0,
               "--num-prompts, --input-len, --output-len must be positive");
  BELUGA_CHECK(tenants >= 0 && system_len > 0, "--tenants must be >= 0 and --system-len positive");
  BELUGA_CHECK(range_ratio >= 0 && range_ratio < 1, "--random-range-ratio must be in [0, 1)");
  BELUGA_CHECK(range_ratio == 0 || dataset != "multi-turn",
               "--random-range-ratio: random and shared-prefix only");
  BELUGA_CHECK(tenants == 0 || dataset == "multi-turn", "--tenants needs --dataset multi-turn");
  const double rate = rate_s == "inf" ? INFINITY : std::stod(rate_s);
  BELUGA_CHECK(rate > 0, "--request-rate must be positive or inf");
  double slo_ttft = INFINITY, slo_tpot = INFINITY, slo_e2e = INFINITY;
  for (size_t p = 0; p < slo_s.size();) {
    size_t c = slo_s.find(',', p);
    std::string kv = slo_s.substr(p, c == std::string::npos ? std::string::npos : c - p);
    p = c == std::string::npos ? slo_s.size() : c + 1;
    size_t eq = kv.find('=');
    BELUGA_CHECK(eq != std::string::npos, "--slo expects key=ms pairs (ttft_ms, tpot_ms, e2el_ms)");
    const std::string k = kv.substr(0, eq);
    const double v = std::stod(kv.substr(eq + 1)) / 1000.0;
    if (k == "ttft_ms" || k == "ttft")
      slo_ttft = v;
    else if (k == "tpot_ms" || k == "tpot")
      slo_tpot = v;
    else if (k == "e2el_ms" || k == "e2el")
      slo_e2e = v;
    else
      fail("--slo: unknown key '", k, "'");
  }

  // The served model's id (unless given).
  if (model.empty()) {
    http::response<http::string_body> res;
    try {
      net::io_context ioc;
      tcp::resolver resolver(ioc);
      beast::tcp_stream stream(ioc);
      stream.connect(resolver.resolve(url.host, url.port));
      http::request<http::empty_body> req(http::verb::get, "/v1/models", 11);
      req.set(http::field::host, url.host);
      if (!api_key.empty()) req.set(http::field::authorization, "Bearer " + api_key);
      http::write(stream, req);
      beast::flat_buffer buf;
      http::read(stream, buf, res);
    } catch (const std::exception& e) {
      fail("cannot reach ", url.host, ":", url.port, "/v1/models: ", e.what());
    }
    // A server still loading answers 503, one with another API key 401: say which, with its message.
    if (res.result_int() != 200)
      fail("GET ", url.host, ":", url.port, "/v1/models: HTTP ", res.result_int(), ": ",
           res.body().substr(0, 300));
    Json j = Json::parse(res.body(), nullptr, false);
    if (j.is_discarded() || !j.contains("data") || !j["data"].is_array() || j["data"].empty() ||
        !j["data"][0].contains("id") || !j["data"][0]["id"].is_string())
      fail("GET ", url.host, ":", url.port, "/v1/models: no model id in ", res.body().substr(0, 300));
    model = j["data"][0]["id"].get<std::string>();
  }

  std::mt19937_64 rng(seed);
  auto random_ids = [&](int n) {
    Json ids = Json::array();
    for (int i = 0; i < n; ++i) ids.push_back(100 + int(rng() % uint64_t(std::max(1, vocab - 100))));
    return ids;
  };
  std::vector<Json> prefixes;
  for (int i = 0; i < num_prefixes; ++i) prefixes.push_back(random_ids(prefix_len));
  // A length drawn from [len (1 - r), len (1 + r)], at least 1.
  auto vary = [&](int len) {
    if (range_ratio == 0) return len;
    const int lo = std::max(1, int(std::ceil(len * (1 - range_ratio))));
    const int hi = std::max(lo, int(std::floor(len * (1 + range_ratio))));
    return lo + int(rng() % uint64_t(hi - lo + 1));
  };
  auto completion_body = [&](Json ids, int max_tokens) {
    Json body{{"model", model},
              {"prompt", std::move(ids)},
              {"max_tokens", max_tokens},
              {"temperature", 0},
              {"ignore_eos", true},
              {"stream", true},
              {"stream_options", {{"include_usage", true}, {"continuous_usage_stats", true}}}};
    for (const auto& [k, v] : extra.items()) body[k] = v;
    return body.dump();
  };

  // Work items: single requests, or whole conversations (multi-turn) that run turn by turn.
  struct Work {
    std::vector<std::string> single;  // one prompt body (random / shared-prefix)
    int turns = 0;                    // multi-turn
    uint64_t seed = 0;
    int tenant = -1;  // multi-turn with --tenants
  };
  // Tenant t: a system prompt of its own, and the API key (the prefix-cache salt) "bench-tenant-t";
  // with --api-key (a server that takes one key) every tenant sends that key instead.
  std::vector<std::string> tenant_prompts, tenant_keys;
  for (int t = 0; t < tenants; ++t) {
    std::mt19937_64 r(seed * 7919 + uint64_t(t) + 1);
    tenant_prompts.push_back("You are the assistant of tenant " + std::to_string(t) + ". " +
                             words(r, system_len));
    tenant_keys.push_back(api_key.empty() ? "bench-tenant-" + std::to_string(t) : api_key);
  }

  std::vector<Work> work;
  if (dataset == "multi-turn") {
    for (int left = num_prompts, k = 0; left > 0; ++k) {
      Work w;
      w.turns = std::min(left, num_turns);
      w.seed = seed * 1000003 + uint64_t(k);
      if (tenants > 0) w.tenant = k % tenants;
      left -= w.turns;
      work.push_back(std::move(w));
    }
  } else {
    for (int i = 0; i < num_prompts; ++i) {
      const int in_len = vary(input_len), out_len = vary(output_len);
      Json ids = dataset == "random" ? random_ids(in_len) : prefixes[size_t(i) % prefixes.size()];
      if (dataset == "shared-prefix")
        for (auto& t : random_ids(in_len)) ids.push_back(t);
      Work w;
      w.single.push_back(completion_body(std::move(ids), out_len));
      work.push_back(std::move(w));
    }
  }

  std::mutex mu;
  std::condition_variable cv;
  int in_flight = 0;
  std::vector<Result> results;
  // On stderr (stdout holds the report): a bar on a terminal, quarter lines otherwise. Advanced under
  // `mu`, so by one thread at a time.
  Progress progress(dataset == "multi-turn" ? "bench serve: conversations" : "bench serve: requests",
                    work.size(), Progress::Unit::kCount, stderr);
  auto run_work = [&](const Work& w) {
    std::vector<Result> local;
    if (w.turns == 0) {
      local.push_back(send(url, "/v1/completions", w.single[0], api_key));
    } else {
      std::mt19937_64 r2(w.seed);
      Json messages = Json::array();
      const std::string& key = w.tenant >= 0 ? tenant_keys[size_t(w.tenant)] : api_key;
      if (w.tenant >= 0)
        messages.push_back(Json{{"role", "system"}, {"content", tenant_prompts[size_t(w.tenant)]}});
      for (int t = 0; t < w.turns; ++t) {
        messages.push_back(Json{{"role", "user"}, {"content", words(r2, input_len)}});
        Json body{{"model", model},
                  {"messages", messages},
                  {"max_tokens", output_len},
                  {"temperature", 0},
                  {"ignore_eos", true},
                  {"stream", true},
                  {"stream_options", {{"include_usage", true}, {"continuous_usage_stats", true}}}};
        for (const auto& [k, v] : extra.items()) body[k] = v;
        Result res = send(url, "/v1/chat/completions", body.dump(), key);
        messages.push_back(Json{{"role", "assistant"}, {"content", res.text}});
        const bool ok = res.ok;
        local.push_back(std::move(res));
        if (!ok) break;
      }
    }
    std::lock_guard l(mu);
    for (auto& r : local) results.push_back(std::move(r));
    progress.advance(1);
    --in_flight;
    cv.notify_all();
  };

  std::fprintf(stderr, "bench serve: %s, %d requests to %s:%s (%s), rate %s, max concurrency %s\n",
               dataset.c_str(), num_prompts, url.host.c_str(), url.port.c_str(), model.c_str(),
               rate_s.c_str(), max_conc > 0 ? std::to_string(max_conc).c_str() : "none");
  std::exponential_distribution<double> gap(std::isinf(rate) ? 1.0 : rate);
  std::vector<std::thread> threads;
  const auto t_start = Clock::now();
  auto next = t_start;
  for (const auto& w : work) {
    if (!std::isinf(rate)) {
      next += std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(gap(rng)));
      std::this_thread::sleep_until(next);
    }
    {
      std::unique_lock l(mu);
      cv.wait(l, [&] { return max_conc <= 0 || in_flight < max_conc; });
      ++in_flight;
    }
    threads.emplace_back(run_work, std::cref(w));
  }
  for (auto& t : threads) t.join();
  progress.finish();
  const double duration = std::chrono::duration<double>(Clock::now() - t_start).count();

  // Aggregate.
  int ok = 0, good = 0;
  int64_t in_tok = 0, out_tok = 0, cached = 0;
  std::vector<double> ttft, tpot, itl, itl_event, e2e;
  int counted = 0;  // requests whose tokens the server counted per chunk
  std::string first_error;
  for (const auto& r : results) {
    if (!r.ok) {
      if (first_error.empty()) first_error = r.error;
      continue;
    }
    ++ok;
    in_tok += r.prompt_tokens;
    out_tok += r.output_tokens;
    cached += r.cached_tokens;
    ttft.push_back(r.ttft);
    e2e.push_back(r.e2e);
    for (double x : r.itl) itl.push_back(x);
    for (double x : r.itl_event) itl_event.push_back(x);
    counted += r.counted;
    const double tp = r.output_tokens > 1 ? (r.e2e - r.ttft) / double(r.output_tokens - 1) : 0.0;
    if (r.output_tokens > 1) tpot.push_back(tp);
    if (r.ttft <= slo_ttft && tp <= slo_tpot && r.e2e <= slo_e2e) ++good;
  }
  const Stat s_ttft = stats(ttft), s_tpot = stats(tpot), s_itl = stats(itl), s_itl_event = stats(itl_event),
             s_e2e = stats(e2e);
  const char* itl_source = counted == ok ? "server usage" : counted == 0 ? "events" : "mixed";

  std::printf("============ Serving Benchmark Result ============\n");
  std::printf("%-40s %s\n", "Dataset:", dataset.c_str());
  std::printf("%-40s %d\n", "Successful requests:", ok);
  std::printf("%-40s %d\n", "Failed requests:", int(results.size()) - ok);
  std::printf("%-40s %.2f\n", "Benchmark duration (s):", duration);
  std::printf("%-40s %lld\n", "Total input tokens:", (long long)in_tok);
  std::printf("%-40s %lld\n", "Total generated tokens:", (long long)out_tok);
  std::printf("%-40s %.2f\n", "Request throughput (req/s):", ok / duration);
  std::printf("%-40s %.2f\n", "Output token throughput (tok/s):", double(out_tok) / duration);
  std::printf("%-40s %.2f\n", "Total token throughput (tok/s):", double(in_tok + out_tok) / duration);
  std::printf("%-40s %.2f\n",
              "Prefix cache hit rate (%):", in_tok ? 100.0 * double(cached) / double(in_tok) : 0.0);
  if (!slo_s.empty()) std::printf("%-40s %.2f\n", "Request goodput (req/s):", good / duration);
  auto row = [](const char* name, const Stat& s) {
    std::printf("%-12s mean %9.2f  p50 %9.2f  p90 %9.2f  p99 %9.2f  p99.9 %9.2f  max %9.2f  (ms)\n", name,
                s.mean * 1e3, s.p50 * 1e3, s.p90 * 1e3, s.p99 * 1e3, s.p999 * 1e3, s.max * 1e3);
  };
  row("TTFT", s_ttft);
  row("TPOT", s_tpot);
  row("ITL/token", s_itl);
  row("ITL/event", s_itl_event);
  row("E2E", s_e2e);
  std::printf("%-40s %s (%zu gaps over %zu events)\n", "ITL tokens counted from:", itl_source, itl.size(),
              itl_event.size());
  std::printf("==================================================\n");
  if (!first_error.empty()) std::fprintf(stderr, "bench serve: first error: %s\n", first_error.c_str());

  if (out_path) {
    auto stat_json = [](const Stat& s, size_t n) {
      return Json{{"mean_ms", s.mean * 1e3},
                  {"p50_ms", s.p50 * 1e3},
                  {"p90_ms", s.p90 * 1e3},
                  {"p99_ms", s.p99 * 1e3},
                  {"p99_9_ms", s.p999 * 1e3},
                  {"max_ms", s.max * 1e3},
                  {"n", n}};
    };
    Json j{{"url", url.host + ":" + url.port},
           {"model", model},
           {"dataset", dataset},
           {"num_prompts", num_prompts},
           {"request_rate", rate_s},
           {"max_concurrency", max_conc},
           {"input_len", input_len},
           {"output_len", output_len},
           {"random_range_ratio", range_ratio},
           {"tenants", tenants},
           {"completed", ok},
           {"failed", int(results.size()) - ok},
           {"duration_s", duration},
           {"total_input_tokens", in_tok},
           {"total_output_tokens", out_tok},
           {"request_throughput", ok / duration},
           {"output_throughput", double(out_tok) / duration},
           {"total_token_throughput", double(in_tok + out_tok) / duration},
           {"prefix_cache_hit_rate", in_tok ? double(cached) / double(in_tok) : 0.0},
           {"goodput", slo_s.empty() ? Json(nullptr) : Json(good / duration)},
           {"slo", slo_s},
           {"ttft", stat_json(s_ttft, ttft.size())},
           {"tpot", stat_json(s_tpot, tpot.size())},
           {"itl", stat_json(s_itl, itl.size())},  // per token
           {"itl_event", stat_json(s_itl_event, itl_event.size())},
           {"itl_token_source", itl_source},
           {"e2el", stat_json(s_e2e, e2e.size())}};
    std::ofstream f(*out_path);
    BELUGA_CHECK(f.good(), "cannot write ", *out_path);
    f << j.dump(2) << "\n";
  }
  return ok > 0 ? 0 : 1;
}

nlohmann::json bench_serve_report(const std::string& url, const std::vector<std::string>& args) {
  char tmpl[] = "/tmp/beluga_bench_serve_report_XXXXXX";
  const int fd = mkstemp(tmpl);
  BELUGA_CHECK(fd >= 0, "cannot create a file in /tmp");
  close(fd);
  const std::string out = tmpl;
  std::vector<std::string> a = {"--url", url, "--out", out};
  a.insert(a.end(), args.begin(), args.end());
  std::vector<char*> argv;
  for (auto& s : a) argv.push_back(s.data());
  std::fflush(stdout);
  const int rc = bench_serve(int(argv.size()), argv.data());
  std::ifstream f(out);
  nlohmann::json j = nlohmann::json::parse(f, nullptr, false);
  unlink(out.c_str());
  BELUGA_CHECK(rc == 0 && !j.is_discarded(), "bench serve against ", url, " failed");
  return j;
}

}  // namespace beluga::cli
