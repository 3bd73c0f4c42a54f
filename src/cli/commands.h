// The `beluga` subcommands. Each takes the arguments after its name and returns the exit code.
// Errors are thrown as beluga::Error and printed by main.
#pragma once

namespace beluga::cli {

int cmd_generate(int argc, char** argv);
int cmd_logits(int argc, char** argv);
int cmd_inspect(int argc, char** argv);
int cmd_bench(int argc, char** argv);  // dispatches `bench model`, `bench tokenizer`, ...
int cmd_tokenize(int argc, char** argv);
int cmd_detokenize(int argc, char** argv);
int cmd_render(int argc, char** argv);
int cmd_serve(int argc, char** argv);
int cmd_router(int argc, char** argv);   // `beluga router`: the load balancer in front of replicas
int cmd_grammar(int argc, char** argv);  // `grammar check`
int cmd_kv(int argc, char** argv);       // `kv stats`, `kv gc`: the KV file tier's directory
int cmd_help(int argc, char** argv);     // `help COMMAND`, `help --markdown` (docs/configuration.md)

}  // namespace beluga::cli
