// JSON text the way Python's json.dumps(value, ensure_ascii=False) writes it: ", " and ": " separators,
// key order kept. DeepSeek's reference encoders serialize tool schemas and arguments this way, so the
// prompt must too, byte for byte.
#pragma once

#include <nlohmann/json.hpp>
#include <string>

namespace beluga::recipe {

std::string py_json_dumps(const nlohmann::ordered_json& value);

// Appends `s` as a JSON string literal body (no quotes); non-ASCII UTF-8 is kept as is.
void json_escape_append(std::string& out, std::string_view s);

}  // namespace beluga::recipe
