// What the Jinja interpreter tests share: rendering a template text on its own.
#pragma once

#include <string>

#include "recipe/jinja_template.h"

namespace beluga::recipe::test {

// `tmpl` rendered with the variables `ctx` (none by default); throws what the interpreter throws.
inline std::string render(const std::string& tmpl, jinja::Dict ctx = {}) {
  return jinja::Template(tmpl).render(ctx).s;
}

}  // namespace beluga::recipe::test
