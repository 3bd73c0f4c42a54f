// Helpers shared by the recipe tests: repo paths, the node reference renderer, event folding.
#pragma once

#include <unistd.h>

#include <cstdio>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "recipe/output_parser.h"
#include "recipe/request.h"
#include "util/error.h"
#include "util/file.h"

namespace beluga::recipe::test {

inline std::string source_path(const std::string& rel) {
  return std::string(BELUGA_SOURCE_DIR) + "/" + rel;
}

// The demo model's directory (its tokenizer, chat template and reference ids).
inline const std::string kDemoModel = source_path("models/beluga-demo-coder-mtp");

// Runs tests/tools/render_chat_template.mjs (@huggingface/jinja): one rendering per case.
// Each result is {"text": ...} or {"error": ...}.
inline nlohmann::json reference_render(const std::string& tmpl, const nlohmann::ordered_json& context,
                                       const nlohmann::ordered_json& cases) {
  const std::string script = source_path("tests/tools/render_chat_template.mjs");
  BELUGA_CHECK(file_exists(source_path("tests/tools/node_modules/@huggingface/jinja/package.json")),
               "@huggingface/jinja is not installed: run scripts/setup-test-tools.sh");
  char name[] = "/tmp/beluga-jinja-XXXXXX";
  int fd = mkstemp(name);
  BELUGA_CHECK(fd >= 0, "mkstemp failed");
  ::close(fd);
  write_file(name, nlohmann::ordered_json{{"template", tmpl}, {"context", context}, {"cases", cases}}.dump());
  std::string cmd = "node '" + script + "' < " + name;
  FILE* p = popen(cmd.c_str(), "r");
  BELUGA_CHECK(p, "cannot run node");
  std::string out;
  char buf[65536];
  size_t n;
  while ((n = fread(buf, 1, sizeof buf, p)) > 0) out.append(buf, n);
  int rc = pclose(p);
  std::remove(name);
  BELUGA_CHECK(rc == 0, "node reference renderer failed (rc ", rc, "): ", out);
  return nlohmann::json::parse(out);
}

inline std::string chat_template_of(const std::string& tokenizer_config_path) {
  auto j = nlohmann::json::parse(read_file(tokenizer_config_path));
  return j.at("chat_template").get<std::string>();
}

// Parser events with adjacent deltas of one kind (and tool index) joined: the split-independent form.
inline std::vector<ParserEvent> fold(const std::vector<ParserEvent>& events) {
  std::vector<ParserEvent> out;
  for (const auto& e : events) {
    bool is_delta = e.kind == ParserEvent::Kind::kReasoning || e.kind == ParserEvent::Kind::kContent ||
                    e.kind == ParserEvent::Kind::kToolCallArgs;
    if (is_delta && !out.empty() && out.back().kind == e.kind && out.back().tool_index == e.tool_index) {
      out.back().text += e.text;
    } else {
      out.push_back(e);
    }
  }
  return out;
}

}  // namespace beluga::recipe::test
