// Chat formats and the model-directory encoder: picks the prompt format of a model (from
// tokenizer_config.json's chat_template and config.json, or a --chat-format override) and encodes
// Conversations with it. The output parser's format follows from the same choice.
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <string_view>

#include "recipe/chat_template.h"
#include "recipe/conversation.h"
#include "recipe/output_syntax.h"
#include "recipe/prompt.h"

namespace beluga::recipe {

enum class ChatFormat { kDeepSeekV3, kDeepSeekR1, kDeepSeekV31, kDeepSeekV4, kDeepSeekV41, kTemplate };

// Names: deepseek-v3, deepseek-r1, deepseek-v3.1, deepseek-v4, deepseek-v4.1, template.
std::optional<ChatFormat> parse_chat_format(std::string_view name);
const char* chat_format_name(ChatFormat f);
// The DeepSeek format a chat template is (or kTemplate when it is none of them).
ChatFormat detect_chat_format(std::string_view chat_template, std::string_view model_type,
                              bool has_system_token);

class ChatEncoder {
 public:
  // Reads DIR/tokenizer_config.json (chat_template, bos/eos), DIR/config.json (model_type) and
  // DIR/tokenizer.json (added tokens). `format` overrides the detection. `model_type`, when not
  // empty, is the served model's (its tokenizer may come from another directory) and replaces DIR's.
  static ChatEncoder from_model_dir(const std::string& dir, std::optional<ChatFormat> format = std::nullopt,
                                    const std::string& model_type = {});
  // A DeepSeek format, or a template (format kTemplate) with its tokens.
  explicit ChatEncoder(ChatFormat format, std::shared_ptr<const ChatTemplate> tmpl = nullptr);

  ChatFormat format() const { return format_; }
  // For kTemplate: the markup the template declares (tool calls, `<think>`); default for the
  // DeepSeek formats, whose markup follows from the format itself.
  const OutputSyntax& output_syntax() const { return syntax_; }
  Prompt encode(const Conversation& conv) const;

 private:
  ChatFormat format_;
  std::shared_ptr<const ChatTemplate> template_;
  OutputSyntax syntax_;
};

}  // namespace beluga::recipe
