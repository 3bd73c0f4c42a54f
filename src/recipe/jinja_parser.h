// Jinja lexer and parser: template source -> syntax tree (internal to the Jinja interpreter).
// Whitespace handling follows transformers: trim_blocks, lstrip_blocks, one trailing newline dropped.
#pragma once

#include <string_view>

#include "recipe/jinja_ast.h"

namespace beluga::recipe::jinja {

Body parse_template(std::string_view source);

}  // namespace beluga::recipe::jinja
