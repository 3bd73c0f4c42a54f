// Running commands from tests: a shell command's exit status and output, the `beluga` binary under
// test (BELUGA_BINARY), and Node scripts of tests/tools with the reason to skip when node or the npm
// packages they need are missing.
#pragma once

#include <sys/wait.h>

#include <array>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <vector>

namespace beluga::testing {

struct CmdResult {
  int code = -1;    // the exit status; -1: it did not exit normally (or could not start)
  std::string out;  // what it printed (stderr too, unless asked otherwise)
};

// Runs `cmd` through the shell; `cmd` redirects stderr itself if it wants it.
inline CmdResult run_command(const std::string& cmd) {
  CmdResult r;
  FILE* p = popen(cmd.c_str(), "r");
  if (!p) return r;
  std::array<char, 4096> buf;
  size_t n;
  while ((n = fread(buf.data(), 1, buf.size(), p)) > 0) r.out.append(buf.data(), n);
  const int status = pclose(p);
  r.code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return r;
}

// `beluga ARGS`, with stderr merged into the output unless `stdout_only` (then it is dropped).
inline CmdResult run_beluga(const std::string& args, bool stdout_only = false) {
  return run_command(std::string(BELUGA_BINARY) + " " + args + (stdout_only ? " 2>/dev/null" : " 2>&1"));
}

// Why a Node test under tests/tools cannot run here (empty: it can): node missing, or one of
// `packages` (names under tests/tools/node_modules) not installed; `install` says how to get them.
inline std::string node_skip_reason(const std::vector<std::string>& packages, const std::string& install) {
  if (std::system("node --version > /dev/null 2>&1") != 0) return "node is not installed";
  const std::string modules = std::string(BELUGA_SOURCE_DIR) + "/tests/tools/node_modules/";
  for (const auto& p : packages)
    if (!std::filesystem::exists(modules + p)) return "npm packages missing: " + install;
  return {};
}

// `node tests/tools/SCRIPT BELUGA_BINARY` (its output goes to the test's own); its exit status, or -1.
inline int run_node_script(const std::string& script) {
  const std::string cmd =
      "node " + std::string(BELUGA_SOURCE_DIR) + "/tests/tools/" + script + " " + std::string(BELUGA_BINARY);
  const int rc = std::system(cmd.c_str());
  return WIFEXITED(rc) ? WEXITSTATUS(rc) : -1;
}

}  // namespace beluga::testing
