#include "recipe/prompt.h"

namespace beluga::recipe {

void Prompt::text(std::string_view s) {
  if (s.empty()) return;
  if (!segments_.empty() && !segments_.back().control) {
    segments_.back().text += s;
  } else {
    segments_.push_back({false, std::string(s)});
  }
}

void Prompt::control(std::string_view token) {
  segments_.push_back({true, std::string(token), false});
}

void Prompt::optional_control(std::string_view token) {
  segments_.push_back({true, std::string(token), true});
}

std::string Prompt::str() const {
  std::string out;
  for (const auto& s : segments_) out += s.text;
  return out;
}

}  // namespace beluga::recipe
