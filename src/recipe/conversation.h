// Conversation: the API-neutral form of a chat request that every prompt encoder consumes.
// Adapters (chat/responses/messages) build it; encoders (DeepSeek formats, Jinja templates) read it.
// Content is plain UTF-8 text; images are typed parts so that text-only formats can reject them.
#pragma once

#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

namespace beluga::recipe {

enum class Role { kSystem, kUser, kAssistant, kTool };

const char* role_name(Role r);

// One piece of message content. Images keep their source (URL or data: URI) for a future vision path.
struct ContentPart {
  enum class Kind { kText, kImage };
  Kind kind = Kind::kText;
  std::string text;       // kText
  std::string image_url;  // kImage
};

struct ToolCall {
  std::string id;
  std::string name;
  std::string arguments;  // JSON text exactly as the client sent it (may be invalid; encoders cope)
};

struct Message {
  Role role = Role::kUser;
  std::vector<ContentPart> content;
  std::string reasoning;             // assistant reasoning_content (thinking)
  std::vector<ToolCall> tool_calls;  // assistant
  std::string tool_call_id;          // tool result: the call it answers
  std::string name;                  // tool result: the tool's name when the API gives it
  bool prefix = false;               // last assistant message to be continued (chat prefix completion)

  // Concatenated text parts; throws if the message holds an image (for text-only encoders).
  std::string text() const;
  bool has_image() const;
};

struct Tool {
  std::string name;
  std::string description;
  nlohmann::ordered_json parameters = nlohmann::ordered_json::object();  // JSON Schema, key order kept
};

struct ToolChoice {
  enum class Mode { kAuto, kNone, kRequired, kFunction };
  Mode mode = Mode::kAuto;
  std::string function;  // kFunction
};

enum class Effort { kLow, kHigh, kMax };

struct Conversation {
  std::vector<Message> messages;
  std::vector<Tool> tools;
  ToolChoice tool_choice;
  bool thinking = false;
  std::optional<Effort> effort;  // unset: the format's default
  bool json_mode = false;        // response_format json_object

  // Tools the model is told about (tool_choice none hides them).
  bool tools_enabled() const { return !tools.empty() && tool_choice.mode != ToolChoice::Mode::kNone; }
};

}  // namespace beluga::recipe
