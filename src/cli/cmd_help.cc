// `beluga help COMMAND`: the command's usage (as `beluga COMMAND --help`); `beluga help --markdown`:
// every command's options as docs/configuration.md, from the same tables.
#include <cstdio>
#include <string>

#include "cli/args.h"
#include "cli/commands.h"
#include "cli/flag_table.h"
#include "util/error.h"

namespace beluga::cli {

int cmd_help(int argc, char** argv) {
  Args args = Args::for_command(argc, argv, "help");
  const bool markdown = args.has("markdown");
  std::string command;
  for (const auto& p : args.positional()) command += (command.empty() ? "" : " ") + p;
  args.check_all_used();
  if (markdown) {
    BELUGA_CHECK(command.empty(), "--markdown prints every command; give no command with it");
    std::fputs(configuration_markdown().c_str(), stdout);
    return 0;
  }
  BELUGA_CHECK(!command.empty(), "usage: beluga help COMMAND | beluga help --markdown");
  const CommandUsage* u = find_usage(command);
  BELUGA_CHECK(u, "no usage for `beluga ", command, "` (`beluga --help` lists the commands)");
  std::fputs(usage_text(*u).c_str(), stdout);
  return 0;
}

}  // namespace beluga::cli
