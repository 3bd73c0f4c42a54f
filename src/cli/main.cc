// `beluga` entry point: dispatches to a subcommand and turns errors into a message and exit code 1.
#include <cstdio>
#include <cstring>
#include <exception>
#include <optional>
#include <string>

#include "cli/args.h"
#include "cli/commands.h"
#include "cli/usage.h"
#include "server/version.h"

namespace {

struct Subcommand {
  const char* name;
  int (*run)(int, char**);
  const char* help;
};

constexpr Subcommand kCommands[] = {
    {"serve", beluga::cli::cmd_serve,
     "OpenAI / Anthropic compatible HTTP server (default: the built-in model)"},
    {"router", beluga::cli::cmd_router,
     "load balancer in front of `serve` replicas (cache-aware, least-load, round-robin)"},
    {"generate", beluga::cli::cmd_generate, "greedy/sampled generation from token ids"},
    {"logits", beluga::cli::cmd_logits, "write prefill logits for token ids to a safetensors file"},
    {"inspect", beluga::cli::cmd_inspect, "print a model's architecture, parameters and KV bytes per token"},
    {"bench", beluga::cli::cmd_bench,
     "benchmarks: `bench model`, `bench serve`, `bench router`, `bench fleet`, ... (`bench --help`)"},
    {"tokenize", beluga::cli::cmd_tokenize, "text on stdin -> token ids"},
    {"detokenize", beluga::cli::cmd_detokenize, "token ids on stdin -> text"},
    {"render", beluga::cli::cmd_render, "API request -> prompt text and token ids"},
    {"grammar", beluga::cli::cmd_grammar,
     "structured outputs: `grammar check` a schema against candidate outputs"},
    {"kv", beluga::cli::cmd_kv, "the KV file tier: `kv stats`, `kv gc` (retention by class)"},
    {"help", beluga::cli::cmd_help, "`help COMMAND`: its options; `help --markdown`: docs/configuration.md"},
};

void usage(FILE* to) {
  std::fprintf(to, "usage: beluga <command> [options]\n       beluga --version\n\ncommands:\n");
  for (const auto& c : kCommands) std::fprintf(to, "  %-12s %s\n", c.name, c.help);
  std::fprintf(to, "\n`beluga <command> --help` lists a command's options.\n");
}

// `beluga CMD --help` / `-h`: the command's usage on stdout. `serve` prints its own; a dispatcher
// (`bench`, `kv`, `grammar`) has one per subcommand (`bench model --help`) and its own list.
bool print_help(const std::string& cmd, int argc, char** argv) {
  if (cmd == "serve" || !beluga::cli::wants_help(argc, argv)) return false;
  std::optional<std::string> text;
  if (argc > 0 && argv[0][0] != '-') text = beluga::cli::command_usage(cmd + " " + argv[0]);
  if (!text) text = beluga::cli::command_usage(cmd);
  if (!text) return false;
  std::fputs(text->c_str(), stdout);
  return true;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2 || !std::strcmp(argv[1], "--help") || !std::strcmp(argv[1], "-h")) {
    usage(argc < 2 ? stderr : stdout);
    return argc < 2 ? 2 : 0;
  }
  if (!std::strcmp(argv[1], "--version") || !std::strcmp(argv[1], "-V")) {
    std::printf("beluga %s\n", beluga::kVersion);
    return 0;
  }
  for (const auto& c : kCommands) {
    if (std::strcmp(argv[1], c.name) == 0) {
      try {
        if (print_help(c.name, argc - 2, argv + 2)) return 0;
        return c.run(argc - 2, argv + 2);
      } catch (const std::exception& e) {
        std::fprintf(stderr, "beluga %s: error: %s\n", c.name, e.what());
        return 1;
      }
    }
  }
  std::fprintf(stderr, "beluga: unknown command '%s'\n\n", argv[1]);
  usage(stderr);
  return 2;
}
