#include "recipe/chat_format.h"

#include <nlohmann/json.hpp>

#include "recipe/deepseek_encoders.h"
#include "util/error.h"
#include "util/file.h"

namespace beluga::recipe {

namespace {

struct Named {
  const char* name;
  ChatFormat format;
};
constexpr Named kNames[] = {
    {"deepseek-v3", ChatFormat::kDeepSeekV3},    {"deepseek-r1", ChatFormat::kDeepSeekR1},
    {"deepseek-v3.1", ChatFormat::kDeepSeekV31}, {"deepseek-v4", ChatFormat::kDeepSeekV4},
    {"deepseek-v4.1", ChatFormat::kDeepSeekV41}, {"template", ChatFormat::kTemplate},
};

// tokenizer_config.json writes special tokens as strings or as {"content": ...} objects.
std::string token_text(const nlohmann::json& j) {
  if (j.is_string()) return j.get<std::string>();
  if (j.is_object() && j.contains("content") && j["content"].is_string())
    return j["content"].get<std::string>();
  return "";
}

bool contains(std::string_view hay, std::string_view needle) {
  return hay.find(needle) != std::string_view::npos;
}

}  // namespace

std::optional<ChatFormat> parse_chat_format(std::string_view name) {
  for (const auto& n : kNames)
    if (name == n.name) return n.format;
  return std::nullopt;
}

const char* chat_format_name(ChatFormat f) {
  for (const auto& n : kNames)
    if (n.format == f) return n.name;
  return "?";
}

ChatFormat detect_chat_format(std::string_view tmpl, std::string_view model_type, bool has_system_token) {
  const bool v4_model = model_type.starts_with("deepseek_v4");
  if (v4_model || contains(tmpl, "｜DSML｜"))
    return has_system_token ? ChatFormat::kDeepSeekV41 : ChatFormat::kDeepSeekV4;
  if (!contains(tmpl, "<｜User｜>") || !contains(tmpl, "<｜Assistant｜>")) return ChatFormat::kTemplate;
  // V3.1 opens the reply with `</think>` in non-thinking mode; R1 opens it with `<think>\n`.
  if (contains(tmpl, "<｜Assistant｜></think>")) return ChatFormat::kDeepSeekV31;
  if (contains(tmpl, "<think>\\n") || contains(tmpl, "<think>\n")) return ChatFormat::kDeepSeekR1;
  if (contains(tmpl, "<｜tool▁calls▁begin｜>") || contains(tmpl, "<｜User｜>"))
    return ChatFormat::kDeepSeekV3;
  return ChatFormat::kTemplate;
}

ChatEncoder::ChatEncoder(ChatFormat format, std::shared_ptr<const ChatTemplate> tmpl)
    : format_(format), template_(std::move(tmpl)) {
  BELUGA_CHECK(format_ != ChatFormat::kTemplate || template_, "chat format 'template' needs a chat_template");
  if (format_ == ChatFormat::kTemplate) syntax_ = template_output_syntax(*template_);
}

ChatEncoder ChatEncoder::from_model_dir(const std::string& dir, std::optional<ChatFormat> format,
                                        const std::string& model_type) {
  nlohmann::json tcfg = nlohmann::json::object(), cfg = nlohmann::json::object();
  if (file_exists(dir + "/tokenizer_config.json"))
    tcfg = nlohmann::json::parse(read_file(dir + "/tokenizer_config.json"));
  if (file_exists(dir + "/config.json")) cfg = nlohmann::json::parse(read_file(dir + "/config.json"));
  std::string tmpl;
  if (tcfg.contains("chat_template")) {
    const auto& t = tcfg["chat_template"];
    if (t.is_string()) {
      tmpl = t.get<std::string>();
    } else if (t.is_array()) {  // named templates: take "default"
      for (const auto& e : t)
        if (e.value("name", "") == "default") tmpl = e.value("template", "");
    }
  }
  if (tmpl.empty() && file_exists(dir + "/chat_template.jinja"))
    tmpl = read_file(dir + "/chat_template.jinja");

  ChatTemplateTokens tokens{token_text(tcfg.value("bos_token", nlohmann::json())),
                            token_text(tcfg.value("eos_token", nlohmann::json())),
                            {}};
  if (file_exists(dir + "/tokenizer.json")) {
    auto tj = nlohmann::json::parse(read_file(dir + "/tokenizer.json"));
    for (const auto& a : tj.value("added_tokens", nlohmann::json::array()))
      tokens.added.push_back(a.value("content", ""));
  }
  if (tcfg.contains("added_tokens_decoder")) {
    for (const auto& [id, a] : tcfg["added_tokens_decoder"].items()) tokens.added.push_back(token_text(a));
  }
  bool has_system = std::find(tokens.added.begin(), tokens.added.end(), "<｜System｜>") != tokens.added.end();
  ChatFormat f = format
                     ? *format
                     : detect_chat_format(tmpl, model_type.empty() ? cfg.value("model_type", "") : model_type,
                                          has_system);
  std::shared_ptr<const ChatTemplate> ct;
  if (f == ChatFormat::kTemplate) {
    BELUGA_CHECK(!tmpl.empty(), "model ", dir, " has no chat_template; pass --chat-format");
    ct = std::make_shared<const ChatTemplate>(tmpl, std::move(tokens));
  }
  return ChatEncoder(f, std::move(ct));
}

Prompt ChatEncoder::encode(const Conversation& conv) const {
  switch (format_) {
    case ChatFormat::kDeepSeekV3:
      return encode_deepseek_v3(conv, false);
    case ChatFormat::kDeepSeekR1:
      return encode_deepseek_v3(conv, true);
    case ChatFormat::kDeepSeekV31:
      return encode_deepseek_v31(conv);
    case ChatFormat::kDeepSeekV4:
      return encode_deepseek_v4(conv, false);
    case ChatFormat::kDeepSeekV41:
      return encode_deepseek_v4(conv, true);
    case ChatFormat::kTemplate:
      return template_->render(conv);
  }
  fail("unknown chat format");
}

}  // namespace beluga::recipe
