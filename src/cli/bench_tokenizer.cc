#include "cli/bench_tokenizer.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "cli/args.h"
#include "tokenizer/tokenizer.h"
#include "tokenizer/utf8.h"
#include "util/error.h"
#include "util/file.h"

namespace beluga::cli {

namespace {

namespace fs = std::filesystem;

double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// Cuts text after a newline once a chunk has reached `target` bytes (prompt-sized requests).
std::vector<std::string> make_chunks(const std::string& text, size_t target) {
  std::vector<std::string> out;
  size_t start = 0;
  while (start < text.size()) {
    size_t end = start + target;
    if (end >= text.size()) {
      end = text.size();
    } else {
      size_t nl = text.find('\n', end);
      end = nl == std::string::npos ? text.size() : nl + 1;
    }
    out.push_back(text.substr(start, end - start));
    start = end;
  }
  return out;
}

// Order-sensitive checksum of all ids (FNV-1a over 32-bit ids); hf-bench.js computes the same one.
uint32_t ids_checksum(uint32_t h, const std::vector<int>& ids) {
  for (int id : ids) {
    h ^= static_cast<uint32_t>(id);
    h *= 16777619u;
  }
  return h;
}

std::string shell_quote(const std::string& s) {
  std::string q = "'";
  for (char c : s) q += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return q + "'";
}

std::string find_hf_script(const std::optional<std::string>& given) {
  if (given) return *given;
  std::vector<fs::path> candidates = {fs::current_path() / "tests/tools/hf-bench.js"};
  std::error_code ec;
  fs::path exe = fs::read_symlink("/proc/self/exe", ec);
  if (!ec) {
    for (fs::path p = exe.parent_path(); !p.empty() && p != p.root_path(); p = p.parent_path())
      candidates.push_back(p / "tests/tools/hf-bench.js");
  }
  for (const auto& c : candidates)
    if (fs::exists(c)) return c.string();
  fail("cannot find tests/tools/hf-bench.js (run from the repository root or pass --hf-script)");
}

struct Result {
  double seconds = 0;
  size_t tokens = 0;
  uint32_t checksum = 0;
};

nlohmann::json speed_json(const Result& r, size_t bytes) {
  return {{"seconds", r.seconds},
          {"tokens", r.tokens},
          {"mb_per_s", bytes / r.seconds / 1e6},
          {"tokens_per_s", r.tokens / r.seconds}};
}

Result run_hf(const std::string& script, const std::string& tokenizer, const std::vector<std::string>& chunks,
              long repeat) {
  // The chunks travel as JSONL so both sides encode exactly the same strings.
  fs::path tmp = fs::temp_directory_path() / ("beluga-bench-" + std::to_string(::getpid()) + ".jsonl");
  {
    std::string jsonl;
    for (const auto& c : chunks) jsonl += nlohmann::json(c).dump() + "\n";
    write_file(tmp.string(), jsonl);
  }
  std::string cmd = "RAYON_NUM_THREADS=1 TOKENIZERS_PARALLELISM=false node " + shell_quote(script) +
                    " --tokenizer " + shell_quote(tokenizer) + " --input " + shell_quote(tmp.string()) +
                    " --repeat " + std::to_string(repeat);
  FILE* p = ::popen(cmd.c_str(), "r");
  std::string out;
  if (p) {
    char buf[4096];
    size_t n;
    while ((n = std::fread(buf, 1, sizeof(buf), p)) > 0) out.append(buf, n);
  }
  int rc = p ? ::pclose(p) : -1;
  fs::remove(tmp);
  BELUGA_CHECK(rc == 0, "HF tokenizers benchmark failed (", cmd, "); run scripts/setup-test-tools.sh first");
  auto j = nlohmann::json::parse(out);
  return {j.at("seconds").get<double>(), j.at("tokens").get<size_t>(), j.at("checksum").get<uint32_t>()};
}

}  // namespace

int bench_tokenizer(int argc, char** argv) {
  Args args = Args::for_command(argc, argv, "bench tokenizer");
  std::string tok_path = args.require("tokenizer");
  std::string input_path = args.require("input");
  auto out_path = args.get("out");
  long chunk = args.get_int("chunk", 16384);
  long repeat = args.get_int("repeat", 3);
  bool no_hf = args.has("no-hf");
  auto hf_script_opt = args.get("hf-script");
  args.check_all_used();
  BELUGA_CHECK(chunk > 0 && repeat > 0, "--chunk and --repeat must be positive");

  double t0 = now_s();
  auto tok = tok::Tokenizer::from_file(tok_path);
  double load_s = now_s() - t0;
  std::string raw = read_file(input_path);
  // Node reads the file as UTF-8 with replacement; repair here so both sides see the same text.
  std::string text;
  tok::utf8_append_lossy(text, raw);
  auto chunks = make_chunks(text, static_cast<size_t>(chunk));
  const size_t bytes = text.size();

  // Best of `repeat` passes, single thread; the first pass also warms the word cache, as HF's does.
  Result ours;
  std::vector<int> ids;
  for (long r = 0; r < repeat; ++r) {
    Result cur;
    uint32_t h = 2166136261u;
    double s = now_s();
    for (const auto& c : chunks) {
      ids.clear();
      tok.encode_into(c, /*allow_special=*/true, ids);
      cur.tokens += ids.size();
      h = ids_checksum(h, ids);
    }
    cur.seconds = now_s() - s;
    cur.checksum = h;
    if (r == 0 || cur.seconds < ours.seconds) ours = cur;
  }

  nlohmann::json report = {{"tokenizer", tok_path},  {"input", input_path},
                           {"bytes", bytes},         {"chunks", chunks.size()},
                           {"chunk_bytes", chunk},   {"repeat", repeat},
                           {"load_seconds", load_s}, {"beluga", speed_json(ours, bytes)}};
  std::printf("tokenizer %s, input %s: %.2f MB in %zu chunks, %zu tokens (load %.2f s)\n", tok_path.c_str(),
              input_path.c_str(), bytes / 1e6, chunks.size(), ours.tokens, load_s);
  std::printf("beluga        %8.2f MB/s %12.0f tokens/s\n", bytes / ours.seconds / 1e6,
              ours.tokens / ours.seconds);
  if (!no_hf) {
    Result hf = run_hf(find_hf_script(hf_script_opt), tok_path, chunks, repeat);
    bool same = hf.tokens == ours.tokens && hf.checksum == ours.checksum;
    double ratio = hf.seconds / ours.seconds;
    std::printf("hf tokenizers %8.2f MB/s %12.0f tokens/s\n", bytes / hf.seconds / 1e6,
                hf.tokens / hf.seconds);
    std::printf("speedup       %8.2fx  ids identical: %s\n", ratio, same ? "yes" : "NO");
    report["hf"] = speed_json(hf, bytes);
    report["speedup"] = ratio;
    report["ids_identical"] = same;
  }
  if (out_path) write_file(*out_path, report.dump(2) + "\n");
  return 0;
}

}  // namespace beluga::cli
