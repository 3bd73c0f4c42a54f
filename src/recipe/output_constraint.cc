#include "recipe/output_constraint.h"

namespace beluga::recipe {

using Json = nlohmann::ordered_json;

namespace {

// A schema: a JSON object (or a boolean schema, which JSON Schema allows).
Json schema_value(const Fields& f, const Json& v, const std::string& path) {
  if (!v.is_object() && !v.is_boolean()) f.fail(path, "expected a JSON Schema object");
  return v;
}

OutputConstraint schema_constraint(Json schema, std::string param, std::string schema_param) {
  OutputConstraint c;
  c.kind = OutputConstraint::Kind::kJsonSchema;
  c.schema = std::move(schema);
  c.param = std::move(param);
  c.schema_param = std::move(schema_param);
  return c;
}

OutputConstraint simple(OutputConstraint::Kind kind, std::string param) {
  OutputConstraint c;
  c.kind = kind;
  c.param = std::move(param);
  return c;
}

// `strict: false` asks for best effort; Beluga enforces every schema it accepts, so both are fine.
void check_strict(const Fields& f, const Json& obj, const std::string& path) {
  if (Fields::has(obj, "strict")) f.boolean(obj["strict"], path_join(path, "strict"));
}

}  // namespace

OutputConstraint openai_response_format(const Fields& f, const Json& rf, const std::string& path) {
  f.object(rf, path);
  const std::string type = f.string(f.required(rf, "type", path), path_join(path, "type"));
  if (type == "text") return {};
  if (type == "json_object") return simple(OutputConstraint::Kind::kJsonObject, path);
  if (type != "json_schema")
    f.fail(path_join(path, "type"),
           "'" + type + "' is not supported (use 'text', 'json_object' or 'json_schema')");
  const std::string js_path = path_join(path, "json_schema");
  const Json& js = f.object(f.required(rf, "json_schema", path), js_path);
  f.string(f.required(js, "name", js_path), path_join(js_path, "name"));
  check_strict(f, js, js_path);
  // OpenAI's schema is optional (absent: any JSON); vLLM's too.
  if (!Fields::has(js, "schema")) return simple(OutputConstraint::Kind::kJsonObject, path);
  return schema_constraint(schema_value(f, js["schema"], path_join(js_path, "schema")), path,
                           path_join(js_path, "schema"));
}

OutputConstraint responses_text_format(const Fields& f, const Json& fmt, const std::string& path) {
  f.object(fmt, path);
  const std::string type = f.string(f.required(fmt, "type", path), path_join(path, "type"));
  if (type == "text") return {};
  if (type == "json_object") return simple(OutputConstraint::Kind::kJsonObject, path);
  if (type != "json_schema")
    f.fail(path_join(path, "type"),
           "'" + type + "' is not supported (use 'text', 'json_object' or 'json_schema')");
  f.string(f.required(fmt, "name", path), path_join(path, "name"));
  check_strict(f, fmt, path);
  return schema_constraint(schema_value(f, f.required(fmt, "schema", path), path_join(path, "schema")), path,
                           path_join(path, "schema"));
}

OutputConstraint anthropic_output_format(const Fields& f, const Json& fmt, const std::string& path) {
  f.object(fmt, path);
  const std::string type = f.string(f.required(fmt, "type", path), path_join(path, "type"));
  if (type != "json_schema")
    f.fail(path_join(path, "type"), "'" + type + "' is not supported (use 'json_schema')");
  return schema_constraint(schema_value(f, f.required(fmt, "schema", path), path_join(path, "schema")), path,
                           path_join(path, "schema"));
}

OutputConstraint vllm_structured_outputs(const Fields& f, const Json& so, const std::string& path) {
  f.object(so, path);
  for (const char* key : {"structural_tag", "whitespace_pattern"})
    if (Fields::has(so, key))
      f.fail(path_join(path, key),
             "is not supported yet (use 'json', 'json_object', 'choice', 'regex' or 'grammar')");
  if (Fields::has(so, "disable_additional_properties") &&
      f.boolean(so["disable_additional_properties"], path_join(path, "disable_additional_properties")))
    f.fail(path_join(path, "disable_additional_properties"),
           "is not supported (set additionalProperties: false)");
  // Options that change nothing here: the output is compact JSON already and nothing falls back.
  for (const char* key : {"disable_any_whitespace", "disable_fallback"})
    if (Fields::has(so, key)) f.boolean(so[key], path_join(path, key));
  OutputConstraint c;
  int given = 0;
  if (Fields::has(so, "json")) {
    ++given;
    const std::string p = path_join(path, "json");
    Json schema = so["json"];
    if (schema.is_string()) {
      try {
        schema = Json::parse(schema.get<std::string>());
      } catch (const std::exception&) {
        f.fail(p, "is not valid JSON");
      }
    }
    c = schema_constraint(schema_value(f, schema, p), p, p);
  }
  if (Fields::has(so, "json_object") && f.boolean(so["json_object"], path_join(path, "json_object"))) {
    ++given;
    c = simple(OutputConstraint::Kind::kJsonObject, path_join(path, "json_object"));
  }
  if (Fields::has(so, "choice")) {
    ++given;
    const std::string p = path_join(path, "choice");
    const Json& a = f.array(so["choice"], p);
    if (a.empty()) f.fail(p, "must list at least one choice");
    c = simple(OutputConstraint::Kind::kChoice, p);
    for (size_t i = 0; i < a.size(); ++i) c.choices.push_back(f.string(a[i], path_index(p, i)));
  }
  for (const auto& [key, kind] : {std::pair{"regex", OutputConstraint::Kind::kRegex},
                                  std::pair{"grammar", OutputConstraint::Kind::kGrammar}}) {
    if (!Fields::has(so, key)) continue;
    ++given;
    const std::string p = path_join(path, key);
    c = simple(kind, p);
    c.text = f.string(so[key], p);
    if (c.text.empty()) f.fail(p, "must not be empty");
  }
  if (given > 1) f.fail(path, "give only one of 'json', 'json_object', 'choice', 'regex' and 'grammar'");
  return c;
}

void merge_constraint(const Fields& f, OutputConstraint& into, OutputConstraint other) {
  if (!other.active()) return;
  if (into.active())
    f.fail(other.param,
           "conflicts with '" + into.param + "': a request takes one structured-output constraint");
  into = std::move(other);
}

}  // namespace beluga::recipe
