// Hostile chat templates (a template comes with a downloaded model): nesting past
// kMaxTemplateNesting, operator chains, endless macro recursion and deep data are clear errors
// (beluga::Error naming the limit), never a stack overflow. Each 100,000-level case used to crash.
#include <gtest/gtest.h>

#include "jinja_test_support.h"
#include "recipe/jinja_ast.h"
#include "recipe/jinja_template.h"
#include "util/error.h"

namespace beluga::recipe {
namespace {

using test::render;

std::string repeat(const std::string& s, int n) {
  std::string out;
  for (int i = 0; i < n; ++i) out += s;
  return out;
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

// fuzz_jinja found it (bench/NOTES.md run 220): `x[]` parsed to an item lookup with no index, and
// evaluating it dereferenced the missing expression (UBSan: reference binding to null pointer).
TEST(JinjaLimits, EmptySubscriptIsAParseError) {
  expect_error("{%if m[]%}{%endif%}", "empty subscript");
  expect_error("{{ [1, 2][] }}", "empty subscript");
  EXPECT_EQ(render("{{ [1, 2, 3][:] | length }}"), "3");  // slices with no bounds stay valid
}

// Values are reference-counted, so a list or namespace that contains itself (Python allows it) is
// never freed unless the render breaks the cycle when it ends (jinja::MutationLog): libFuzzer's leak
// checker found `{% set ns.x = ns %}` leaking every render (session 19). Here the cycle runs through
// a list of the context, whose use count shows whether the template's namespace still holds it; the
// sanitizer build's leak checker covers the cycles made of template values alone.
TEST(JinjaLimits, CyclesATemplateMakesAreFreedWhenTheRenderEnds) {
  for (const std::string tmpl :
       {"{% set ns = namespace(l=items) %}{{ items.append(ns) }}",
        "{% set ns = namespace(l=items) %}{% set ns.me = ns %}{{ items.append(items) }}",
        "{% set f = items.append %}{{ f(f) }}"}) {
    jinja::Dict ctx;
    jinja::Value items = jinja::Value::new_list({jinja::Value::integer(1)});
    ctx.set("items", items);
    EXPECT_EQ(render(tmpl, ctx), "None") << tmpl;
    ctx.items.clear();
    EXPECT_EQ(items.list.use_count(), 1) << tmpl;  // nothing of the render holds the list any more
  }
  // Template-only cycles render as in Python (printing a cycle meets the nesting limit).
  EXPECT_EQ(render("{% set x = [] %}{{ x.append(x) }}{{ x | length }}"), "None1");
  EXPECT_EQ(
      render("{% set ns = namespace(x=0) %}{% for i in range(6) %}{% set ns.x = ns, 1 %}{% endfor %}ok"),
      "ok");
  expect_error("{% set ns = namespace(x=0) %}{% set ns.x = ns, 1 %}{{ ns.x }}",
               "nested deeper than 512 levels");
  // Sharing without a cycle is untouched: the same list twice, one list in two namespaces.
  EXPECT_EQ(
      render("{% set x = [] %}{% set y = [1] %}{{ x.append(y) }}{{ x.append(y) }}{{ y.append(2) }}{{ x }}"),
      "NoneNoneNone[[1, 2], [1, 2]]");
  EXPECT_EQ(render("{% set a = namespace(l=[]) %}{% set b = namespace(l=a.l) %}{{ b.l.append(3) }}{{ a.l }}"),
            "None[3]");
}

// libFuzzer (session 19): `{{ f1 * 'x' * 666666666666600001000 }}` ran for minutes. The undefined
// `f1` times 'x' is the empty string, whose repetition passed the size check (0 bytes) and then looped
// once per count.
TEST(JinjaLimits, RepeatingAnEmptyStringIsImmediate) {
  EXPECT_EQ(render("{{ '' * 9000000000000000000 }}|{{ f1 * 'x' * 666666666666600001000 }}|"), "||");
  EXPECT_EQ(render("{{ 'ab' * 3 }}{{ 'c' * 0 }}{{ 'd' * -2 }}"), "ababab");
}

TEST(JinjaLimits, NestingWithinTheLimitStillWorks) {
  EXPECT_EQ(render("{{ " + repeat("(", 40) + "7" + repeat(")", 40) + " }}"), "7");
  EXPECT_EQ(render("{{ 1" + repeat(" + 1", 60) + " }}"), "61");
  EXPECT_EQ(render(repeat("{% if true %}", 60) + "y" + repeat("{% endif %}", 60)), "y");
  EXPECT_EQ(render("{{ " + repeat("[", 30) + repeat("]", 30) + " | length }}"), "1");
}

TEST(JinjaLimits, EndlessMacroRecursionFailsCleanly) {
  expect_error("{% macro f(x) %}{{ f(x) }}{% endmacro %}{{ f(1) }}", "recursion deeper than 200 levels");
  // Bounded recursion is fine.
  EXPECT_EQ(render("{% macro f(n) %}{% if n > 0 %}{{ n }}{{ f(n - 1) }}{% endif %}{% endmacro %}{{ f(5) }}"),
            "54321");
}

TEST(JinjaLimits, IntegerOverflowIsAnError) {
  expect_error("{{ 9223372036854775807 + 1 }}", "integer overflow");
  expect_error("{{ -9223372036854775807 - 2 }}", "integer overflow");
  expect_error("{{ 4294967296 * 4294967296 }}", "integer overflow");
  expect_error("{{ (-9223372036854775807 - 1) // -1 }}", "integer overflow");
  expect_error("{{ -(-9223372036854775807 - 1) }}", "integer overflow");
  expect_error("{{ 10 ** 30 }}", "integer overflow");
  expect_error("{{ 'abc'[10.0 ** 300:] }}", "out of the integer range");
  EXPECT_EQ(render("{{ 9223372036854775806 + 1 }}"), "9223372036854775807");
  EXPECT_EQ(render("{{ 'abcdef'[1:9223372036854775807:9223372036854775807] }}"), "b");
  EXPECT_EQ(render("{{ range(9223372036854775806, 9223372036854775807, 9223372036854775807) | list }}"),
            "[9223372036854775806]");
}

TEST(JinjaLimits, MemoryAndTimeBudgets) {
  expect_error("{{ range(1000000000000) | length }}", "range() of more than 100000 items");
  expect_error("{{ 'x' * 1000000000000 }}", "a string longer than 64 MiB");
  expect_error(
      "{% set ns = namespace(s='xx') %}{% for i in range(64) %}{% set ns.s = ns.s ~ ns.s %}{% endfor %}",
      "a string longer than 64 MiB");
  expect_error(
      "{% set ns = namespace(l=[1]) %}{% for i in range(64) %}{% set ns.l = ns.l + ns.l %}{% endfor %}",
      "a list of more than 100000 items");
  expect_error("{% for a in range(100000) %}{% for b in range(100000) %}{% endfor %}{% endfor %}",
               "rendering takes more than 5000000 steps");
  EXPECT_EQ(render("{{ range(100000) | length }}"), "100000");
}

// Values a loop nests deeper than the template text: printing, comparing and serializing them is an
// error past kMaxValueDepth, and freeing them (100,000 levels) does not recurse.
TEST(JinjaLimits, DeepValuesBuiltInALoop) {
  const std::string build =
      "{% set ns = namespace(x=[]) %}{% for i in range(100000) %}{% set ns.x = [ns.x] %}{% endfor %}";
  EXPECT_EQ(render(build + "{{ ns.x | length }}"), "1");
  expect_error(build + "{{ ns.x }}", "a value nested deeper than 512 levels");
  expect_error(build + "{{ ns.x | tojson }}", "a value nested deeper than 512 levels");
  expect_error(build + "{{ ns.x == ns.x }}", "a value nested deeper than 512 levels");
  // The same through dicts and appends.
  EXPECT_EQ(render("{% set ns = namespace(d={}) %}{% for i in range(100000) %}{% set ns.d = {'a': ns.d} %}{% "
                   "endfor %}ok"),
            "ok");
  EXPECT_EQ(render("{% set ns = namespace(cur=[]) %}{% set root = ns.cur %}{% for i in range(100000) %}{% "
                   "set n = [] %}"
                   "{{ ns.cur.append(n) or '' }}{% set ns.cur = n %}{% endfor %}{{ root | length }}"),
            "1");
  EXPECT_EQ(render("{{ [[1, [2]], {'a': [3]}] }}"), "[[1, [2]], {'a': [3]}]");
}

}  // namespace
}  // namespace beluga::recipe
