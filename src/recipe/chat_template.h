// Renders a model's Hugging Face chat_template (Jinja) for a Conversation, the way transformers'
// apply_chat_template does (messages, tools, bos/eos tokens, add_generation_prompt, enable_thinking),
// and splits the result into Prompt segments: template literals that spell a vocabulary's added
// token become control tokens; request data (message text, tool schemas) always stays text.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "recipe/conversation.h"
#include "recipe/jinja_template.h"
#include "recipe/prompt.h"

namespace beluga::recipe {

struct ChatTemplateTokens {
  std::string bos, eos;
  std::vector<std::string> added;  // every added token's spelling (special or not)
};

class ChatTemplate {
 public:
  ChatTemplate(const std::string& source, ChatTemplateTokens tokens);
  Prompt render(const Conversation& conv) const;
  const std::string& source() const { return source_; }
  // The Jinja context apply_chat_template would see (request data marked as data).
  jinja::Dict context(const Conversation& conv) const;

 private:
  std::string source_;
  jinja::Template template_;
  ChatTemplateTokens tokens_;
};

}  // namespace beluga::recipe
