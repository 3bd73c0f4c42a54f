#include "cli/bench_grammar.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "cli/args.h"
#include "cli/bench_grammar_batch.h"
#include "grammar/check.h"
#include "grammar/matcher.h"
#include "grammar/refused.h"
#include "tokenizer/tokenizer.h"
#include "util/error.h"
#include "util/file.h"

namespace beluga::cli {

namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

double pct(std::vector<double> v, double p) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  size_t i = size_t(p / 100.0 * double(v.size() - 1) + 0.5);
  return v[std::min(i, v.size() - 1)];
}

nlohmann::json summary(const std::vector<double>& v) {
  return {{"n", v.size()},
          {"p50", pct(v, 50)},
          {"p99", pct(v, 99)},
          {"p99_9", pct(v, 99.9)},
          {"max", pct(v, 100)}};
}

}  // namespace

int bench_grammar(int argc, char** argv) {
  Args args = Args::for_command(argc, argv, "bench grammar");
  std::string tpath = args.require("tokenizer");
  if (fs::is_directory(tpath)) tpath += "/tokenizer.json";
  auto schema_dir = args.get("schemas");
  auto grammar_dir = args.get("grammars");
  auto out_path = args.get("out");
  int repeat = int(args.get_int("repeat", 3));
  grammar::JsonSchemaOptions opt;
  opt.max_whitespace = int(args.get_int("max-whitespace", 0));
  const int batch = int(args.get_int("batch", 0));
  const std::vector<int> threads = parse_int_list(args.get_or("batch-threads", "0,1"));
  args.check_all_used();
  BELUGA_CHECK(batch >= 0 && batch <= 1024, "--batch must be 0-1024");
  BELUGA_CHECK(!threads.empty() &&
                   std::all_of(threads.begin(), threads.end(), [](int t) { return t >= 0 && t <= 256; }),
               "--batch-threads must be a list of 0-256");
  BELUGA_CHECK(repeat >= 1, "--repeat must be at least 1");
  BELUGA_CHECK(schema_dir || grammar_dir, "give --schemas DIR and/or --grammars DIR");

  auto tokenizer = tok::Tokenizer::from_file(tpath);
  auto vocab = std::make_shared<grammar::TokenVocab>(tokenizer, std::vector<int>{});
  // Schemas (*.json) and grammar texts (*.regex: the pattern, *.gbnf, *.lark), each with its instances.
  std::vector<fs::path> files;
  auto scan = [&](const std::string& dir, std::vector<std::string> exts) {
    size_t before = files.size();
    for (const auto& e : fs::directory_iterator(dir))
      if (e.is_regular_file() && std::count(exts.begin(), exts.end(), e.path().extension().string()))
        files.push_back(e.path());
    BELUGA_CHECK(files.size() > before, "nothing to benchmark in ", dir);
    std::sort(files.begin() + long(before), files.end());
  };
  if (schema_dir) scan(*schema_dir, {".json"});
  if (grammar_dir) scan(*grammar_dir, {".regex", ".gbnf", ".lark"});

  std::vector<double> compile_ms, mask_us;
  std::vector<std::vector<double>> batch_us(threads.size());  // per worker count, one per step
  nlohmann::json per_schema = nlohmann::json::array();
  std::vector<uint32_t> mask(vocab->mask_words());
  int refused = 0, incomplete = 0;
  for (const auto& f : files) {
    const std::string ext = f.extension().string();
    const bool is_schema = ext == ".json";
    std::string text = read_file(f.string());
    if (ext == ".regex")
      while (!text.empty() && (text.back() == '\n' || text.back() == '\r')) text.pop_back();
    nlohmann::ordered_json schema;
    if (is_schema) schema = nlohmann::ordered_json::parse(text);
    std::shared_ptr<const grammar::CompiledGrammar> g;
    std::vector<double> times;
    const auto limit = std::chrono::milliseconds(60'000);
    try {
      for (int r = 0; r < repeat; ++r) {
        auto t0 = Clock::now();
        if (is_schema)
          g = grammar::compile_json_schema(schema, vocab, opt, limit);
        else if (ext == ".regex")
          g = grammar::compile_regex(text, vocab, limit);
        else
          g = grammar::compile_gbnf(text, vocab, limit);
        times.push_back(std::chrono::duration<double, std::milli>(Clock::now() - t0).count());
      }
    } catch (const grammar::Refused& e) {
      std::printf("%-28s refused: %s\n", f.filename().c_str(), e.what());
      ++refused;
      continue;
    }
    double c = pct(times, 50);
    compile_ms.push_back(c);
    std::vector<double> local;
    fs::path inst = f;
    inst.replace_extension(".instances.jsonl");
    std::ifstream in(inst);
    std::string line;
    int n_inst = 0;
    std::vector<std::vector<int>> accepted;  // the complete instances' tokens, for --batch
    while (std::getline(in, line)) {
      if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
      ++n_inst;
      // A schema's instance is a JSON value (written compactly); a grammar's is the output text.
      auto value = nlohmann::ordered_json::parse(line);
      std::string output = is_schema ? value.dump() : value.get<std::string>();
      grammar::Matcher m(g);
      std::vector<int> ids = tokenizer.encode(output, false);
      bool ok = true;
      for (size_t i = 0; i <= ids.size(); ++i) {
        auto t0 = Clock::now();
        m.fill_mask(mask.data());
        local.push_back(std::chrono::duration<double, std::micro>(Clock::now() - t0).count());
        if (i == ids.size()) break;
        if (!((mask[ids[i] >> 5] >> (ids[i] & 31)) & 1) || !m.accept_token(ids[i])) {
          ok = false;
          break;
        }
      }
      if (!ok || !m.is_accepting())
        ++incomplete;
      else
        accepted.push_back(std::move(ids));
    }
    const size_t batch_from = batch_us[0].size();
    time_batch_masks(g, accepted, batch, threads, batch_us);
    mask_us.insert(mask_us.end(), local.begin(), local.end());
    std::printf("%-28s compile %8.2f ms  nodes %6zu  instances %d  mask p50 %7.1f us  max %8.1f us\n",
                f.filename().c_str(), c, g->automaton.nodes.size(), n_inst, pct(local, 50), pct(local, 100));
    per_schema.push_back({{is_schema ? "schema" : "grammar", f.filename().string()},
                          {"compile_ms", c},
                          {"automaton_nodes", g->automaton.nodes.size()},
                          {"mask_us", summary(local)}});
    if (batch > 0 && batch_us[0].size() > batch_from) {
      std::printf("%-28s batch %d, a step's masks p50:", "", batch);
      nlohmann::json b = nlohmann::json::array();
      for (size_t i = 0; i < threads.size(); ++i) {
        std::vector<double> mine(batch_us[i].begin() + long(batch_from), batch_us[i].end());
        std::printf("  %d workers %.1f us", threads[i], pct(mine, 50));
        b.push_back({{"workers", threads[i]}, {"step_us", summary(mine)}});
      }
      std::printf("\n");
      per_schema.back()["batch_masks"] = b;
    }
  }
  std::printf("\ntokenizer %s: %zu ids\n", tpath.c_str(), vocab->size());
  std::printf(
      "compile (ms, per schema, median of %d): p50 %.2f  p99 %.2f  p99.9 %.2f  max %.2f  (%zu schemas, %d "
      "refused)\n",
      repeat, pct(compile_ms, 50), pct(compile_ms, 99), pct(compile_ms, 99.9), pct(compile_ms, 100),
      compile_ms.size(), refused);
  std::printf(
      "mask (us, per token, full vocabulary): p50 %.2f  p99 %.2f  p99.9 %.2f  max %.2f  (%zu masks)\n",
      pct(mask_us, 50), pct(mask_us, 99), pct(mask_us, 99.9), pct(mask_us, 100), mask_us.size());
  nlohmann::json batch_json = nlohmann::json::array();
  if (batch > 0) {
    for (size_t i = 0; i < threads.size(); ++i) {
      const auto& v = batch_us[i];
      std::printf(
          "masks of a batch-%d step (us, %d workers + the caller): p50 %.1f  p99 %.1f  max %.1f  (%zu "
          "steps)\n",
          batch, threads[i], pct(v, 50), pct(v, 99), pct(v, 100), v.size());
      batch_json.push_back({{"workers", threads[i]}, {"step_us", summary(v)}});
    }
  }
  if (incomplete) std::printf("WARNING: %d instances were not accepted as complete\n", incomplete);
  if (out_path) {
    nlohmann::json j = {{"tokenizer", tpath},
                        {"vocab_size", vocab->size()},
                        {"schemas", per_schema},
                        {"refused", refused},
                        {"incomplete_instances", incomplete},
                        {"compile_ms", summary(compile_ms)},
                        {"mask_us", summary(mask_us)}};
    if (batch > 0) j["batch"] = {{"size", batch}, {"steps", batch_json}};
    std::ofstream(*out_path) << j.dump(2) << "\n";
  }
  return incomplete ? 1 : 0;
}

}  // namespace beluga::cli
