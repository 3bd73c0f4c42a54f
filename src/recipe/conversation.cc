#include "recipe/conversation.h"

#include "util/error.h"

namespace beluga::recipe {

const char* role_name(Role r) {
  switch (r) {
    case Role::kSystem:
      return "system";
    case Role::kUser:
      return "user";
    case Role::kAssistant:
      return "assistant";
    case Role::kTool:
      return "tool";
  }
  return "?";
}

std::string Message::text() const {
  std::string out;
  for (const auto& p : content) {
    BELUGA_CHECK(p.kind == ContentPart::Kind::kText, "this model accepts text only, but a ", role_name(role),
                 " message contains an image");
    out += p.text;
  }
  return out;
}

bool Message::has_image() const {
  for (const auto& p : content)
    if (p.kind == ContentPart::Kind::kImage) return true;
  return false;
}

}  // namespace beluga::recipe
