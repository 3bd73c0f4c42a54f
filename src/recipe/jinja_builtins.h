// Jinja builtins: filters, tests, methods of str/list/dict, and global functions (range, namespace,
// raise_exception, strftime_now). Internal to the Jinja interpreter. Strings derived from request
// data stay data (jinja_value.h).
#pragma once

#include <string>

#include "recipe/jinja_value.h"

namespace beluga::recipe::jinja {

// Calls a test or a filter that needs to call back into tests (select, reject).
bool apply_test(const std::string& name, const Value& v, const std::vector<Value>& args);
Value apply_filter(const std::string& name, const Value& v, Args& args);
// `obj.name` for a str, list or dict method; undefined when there is none.
Value method(const Value& obj, const std::string& name);
// A global function by name (range, namespace, raise_exception, strftime_now, dict); undefined if none.
Value global_function(const std::string& name);

// `a[b]` and slicing with Python semantics.
Value get_item(const Value& obj, const Value& key);
Value slice(const Value& obj, const Value& start, const Value& stop, const Value& step);
// Python-style JSON (tojson filter); indent < 0 for one line.
std::string to_json(const Value& v, int indent, int depth = 0);
// Iteration: a list's items, a dict's keys, a string's characters.
List iterate(const Value& v);

}  // namespace beluga::recipe::jinja
