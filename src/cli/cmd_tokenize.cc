// `beluga tokenize` and `beluga detokenize`: the tokenizer on the command line, for scripts and for
// checking ids against other implementations.
#include <cstdio>
#include <iostream>
#include <iterator>
#include <string>

#include <nlohmann/json.hpp>

#include "cli/args.h"
#include "cli/commands.h"
#include "tokenizer/tokenizer.h"
#include "util/error.h"

namespace beluga::cli {

namespace {

std::string read_stdin() {
  return std::string(std::istreambuf_iterator<char>(std::cin), std::istreambuf_iterator<char>());
}

void append_ids(std::string& out, const std::vector<int>& ids) {
  out += '[';
  for (size_t i = 0; i < ids.size(); ++i) {
    if (i) out += ',';
    out += std::to_string(ids[i]);
  }
  out += ']';
}

}  // namespace

int cmd_tokenize(int argc, char** argv) {
  Args args = Args::for_command(argc, argv, "tokenize");
  const std::string tok_path = args.require("tokenizer");
  bool allow_special = args.has("allow-special");
  bool jsonl = args.has("jsonl");
  args.check_all_used();
  auto tok = tok::Tokenizer::from_file(tok_path);
  std::ios::sync_with_stdio(false);
  std::string out;
  std::vector<int> ids;
  if (!jsonl) {
    ids = tok.encode(read_stdin(), allow_special);
    append_ids(out, ids);
    out += '\n';
    std::fwrite(out.data(), 1, out.size(), stdout);
    return 0;
  }
  // One JSON string per line in, one JSON array per line out (blank lines are skipped).
  std::string line;
  size_t lineno = 0;
  while (std::getline(std::cin, line)) {
    ++lineno;
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    nlohmann::json j;
    try {
      j = nlohmann::json::parse(line);
    } catch (const nlohmann::json::exception& e) {
      fail("stdin line ", lineno, ": not JSON: ", e.what());
    }
    BELUGA_CHECK(j.is_string(), "stdin line ", lineno, ": expected a JSON string");
    ids.clear();
    tok.encode_into(j.get_ref<const std::string&>(), allow_special, ids);
    out.clear();
    append_ids(out, ids);
    out += '\n';
    std::fwrite(out.data(), 1, out.size(), stdout);
  }
  return 0;
}

int cmd_detokenize(int argc, char** argv) {
  Args args = Args::for_command(argc, argv, "detokenize");
  const std::string tok_path = args.require("tokenizer");
  bool skip_special = args.has("skip-special");
  args.check_all_used();
  auto tok = tok::Tokenizer::from_file(tok_path);
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(read_stdin());
  } catch (const nlohmann::json::exception& e) {
    fail("stdin: not JSON: ", e.what());
  }
  BELUGA_CHECK(j.is_array(), "stdin: expected a JSON array of token ids");
  std::vector<int> ids;
  for (const auto& v : j) {
    BELUGA_CHECK(v.is_number_integer(), "stdin: expected integer token ids, got ", v.dump());
    ids.push_back(v.get<int>());
  }
  std::string text = tok.decode(ids, skip_special);
  std::fwrite(text.data(), 1, text.size(), stdout);
  return 0;
}

}  // namespace beluga::cli
