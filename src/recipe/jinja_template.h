// Jinja template (the subset Hugging Face chat templates use, with transformers' trim_blocks and
// lstrip_blocks): parse once, render many times. Errors name the template line. raise_exception()
// in a template throws beluga::Error with the template's message.
#pragma once

#include <memory>
#include <string_view>

#include "recipe/jinja_value.h"

namespace beluga::recipe::jinja {

struct Node;

class Template {
 public:
  explicit Template(std::string_view source);
  // Renders with `context` as the global variables; the result keeps data ranges (jinja_value.h).
  Value render(const Dict& context) const;

 private:
  std::shared_ptr<const std::vector<Node>> root_;
};

}  // namespace beluga::recipe::jinja
