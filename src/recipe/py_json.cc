#include "recipe/py_json.h"

#include <cstdio>

#include "recipe/json_depth.h"
#include "util/error.h"

namespace beluga::recipe {

void json_escape_append(std::string& out, std::string_view s) {
  for (unsigned char c : s) {
    switch (c) {
      case '"':
        out += "\\\"";
        break;
      case '\\':
        out += "\\\\";
        break;
      case '\n':
        out += "\\n";
        break;
      case '\r':
        out += "\\r";
        break;
      case '\t':
        out += "\\t";
        break;
      case '\b':
        out += "\\b";
        break;
      case '\f':
        out += "\\f";
        break;
      default:
        if (c < 0x20) {
          char buf[8];
          std::snprintf(buf, sizeof buf, "\\u%04x", c);
          out += buf;
        } else {
          out += static_cast<char>(c);
        }
    }
  }
}

namespace {

void dump(std::string& out, const nlohmann::ordered_json& v, int depth) {
  using T = nlohmann::ordered_json::value_t;
  // Request JSON is bounded when parsed (json_depth.h); this keeps the recursion bounded whatever
  // the caller passes.
  if (v.is_structured() && ++depth > kMaxJsonDepth)
    fail("JSON nested deeper than ", kMaxJsonDepth, " levels cannot be serialized");
  switch (v.type()) {
    case T::object: {
      out += '{';
      bool first = true;
      for (auto it = v.begin(); it != v.end(); ++it) {
        if (!first) out += ", ";
        first = false;
        out += '"';
        json_escape_append(out, it.key());
        out += "\": ";
        dump(out, it.value(), depth);
      }
      out += '}';
      break;
    }
    case T::array: {
      out += '[';
      for (size_t i = 0; i < v.size(); ++i) {
        if (i) out += ", ";
        dump(out, v[i], depth);
      }
      out += ']';
      break;
    }
    case T::string:
      out += '"';
      json_escape_append(out, v.get_ref<const std::string&>());
      out += '"';
      break;
    default:
      // Numbers, booleans and null print the same in Python and nlohmann (1.0 stays "1.0").
      out += v.dump();
  }
}

}  // namespace

std::string py_json_dumps(const nlohmann::ordered_json& value) {
  std::string out;
  dump(out, value, 0);
  return out;
}

}  // namespace beluga::recipe
