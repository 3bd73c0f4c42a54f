// `beluga render --model DIR --request FILE [--api chat|responses|messages] [--chat-format NAME]`:
// an API request JSON -> the prompt the model would see, as {"prompt": text, "ids": [...]}.
// An invalid request prints the API's error body (what the server would answer) and fails.
#include <cstdio>
#include <iostream>

#include <nlohmann/json.hpp>

#include "cli/args.h"
#include "cli/commands.h"
#include "recipe/chat_format.h"
#include "recipe/encode_request.h"
#include "recipe/request.h"
#include "tokenizer/tokenizer.h"
#include "util/error.h"
#include "util/file.h"

namespace beluga::cli {

int cmd_render(int argc, char** argv) {
  Args args = Args::for_command(argc, argv, "render");
  const std::string model = args.require("model");
  const std::string request_path = args.require("request");
  const std::string api_name = args.get_or("api", "chat");
  const auto format_name = args.get("chat-format");
  args.check_all_used();

  recipe::Api api;
  if (api_name == "chat")
    api = recipe::Api::kChat;
  else if (api_name == "responses")
    api = recipe::Api::kResponses;
  else if (api_name == "messages")
    api = recipe::Api::kMessages;
  else
    fail("--api must be chat, responses or messages, got '", api_name, "'");

  std::optional<recipe::ChatFormat> format;
  if (format_name) {
    format = recipe::parse_chat_format(*format_name);
    BELUGA_CHECK(format, "unknown --chat-format '", *format_name,
                 "' (deepseek-v3, deepseek-r1, deepseek-v3.1, deepseek-v4, deepseek-v4.1, template)");
  }
  const recipe::ChatEncoder encoder = recipe::ChatEncoder::from_model_dir(model, format);
  const tok::Tokenizer tokenizer = tok::Tokenizer::from_file(model + "/tokenizer.json");

  recipe::Prompt prompt;
  try {
    recipe::ParsedRequest req = recipe::parse_request(api, read_file(request_path));
    prompt = recipe::encode_request(encoder, req);
  } catch (const recipe::ApiError& e) {
    std::fprintf(stderr, "%s\n", e.body().dump().c_str());
    fail("invalid request (HTTP ", e.status(), "): ", e.what());
  }
  nlohmann::ordered_json out;
  out["prompt"] = prompt.str();
  out["ids"] = prompt.ids(tokenizer);
  std::cout << out.dump(-1, ' ', false, nlohmann::ordered_json::error_handler_t::replace) << "\n";
  return 0;
}

}  // namespace beluga::cli
