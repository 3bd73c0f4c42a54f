// Hostile chat templates (a template comes with a downloaded model): nesting past
// kMaxTemplateNesting, operator chains, endless macro recursion and deep data are clear errors
// (beluga::Error naming the limit), never a stack overflow. Each 100,000-level case used to crash.
#include <gtest/gtest.h>

#include "recipe/jinja_ast.h"
#include "recipe/jinja_template.h"
#include "util/error.h"

namespace beluga::recipe {
namespace {

std::string repeat(const std::string& s, int n) {
  std::string out;
  for (int i = 0; i < n; ++i) out += s;
  return out;
}

std::string render(const std::string& tmpl) {
  jinja::Dict ctx;
  return jinja::Template(tmpl).render(ctx).s;
}

void expect_error(const std::string& tmpl, const std::string& needle) {
  try {
    render(tmpl);
    ADD_FAILURE() << "rendered: " << tmpl.substr(0, 60);
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
  }
}

TEST(JinjaLimits, DeepExpressionsAreRefusedWhenParsed) {
  const int n = 100000;
  expect_error("{{ " + repeat("(", n) + "1" + repeat(")", n) + " }}", "nested deeper than 100 levels");
  expect_error("{{ " + repeat("[", n) + repeat("]", n) + " }}", "nested deeper than 100 levels");
  expect_error("{{ " + repeat("not ", n) + "1 }}", "nested deeper than 100 levels");
  expect_error("{{ " + repeat("-", n) + "1 }}", "nested deeper than 100 levels");
  expect_error("{{ 1" + repeat(" + 1", n) + " }}", "nested deeper than 100 levels");
  expect_error("{{ x" + repeat(".a", n) + " }}", "nested deeper than 100 levels");
  expect_error("{{ x" + repeat("|string", n) + " }}", "nested deeper than 100 levels");
  expect_error("{{ f" + repeat("()", n) + " }}", "nested deeper than 100 levels");
  expect_error(repeat("{% if true %}", n) + repeat("{% endif %}", n), "nested deeper than 100 levels");
  expect_error(repeat("{% for x in [1] %}", n) + repeat("{% endfor %}", n), "nested deeper than 100 levels");
}

TEST(JinjaLimits, NestingWithinTheLimitStillWorks) {
  EXPECT_EQ(render("{{ " + repeat("(", 40) + "7" + repeat(")", 40) + " }}"), "7");
  EXPECT_EQ(render("{{ 1" + repeat(" + 1", 60) + " }}"), "61");
  EXPECT_EQ(render(repeat("{% if true %}", 60) + "y" + repeat("{% endif %}", 60)), "y");
  EXPECT_EQ(render("{{ " + repeat("[", 30) + repeat("]", 30) + " | length }}"), "1");
}

TEST(JinjaLimits, EndlessMacroRecursionFailsCleanly) {
  expect_error("{% macro f(x) %}{{ f(x) }}{% endmacro %}{{ f(1) }}", "recursion deeper than 1000 levels");
  // Bounded recursion is fine.
  EXPECT_EQ(render("{% macro f(n) %}{% if n > 0 %}{{ n }}{{ f(n - 1) }}{% endif %}{% endmacro %}{{ f(5) }}"),
            "54321");
}

}  // namespace
}  // namespace beluga::recipe
