// Jinja interpreter specifics that the reference comparison cannot see: which bytes are request
// data (and so can never become control tokens), errors, and whitespace control.
#include <gtest/gtest.h>

#include "jinja_test_support.h"
#include "recipe/chat_template.h"
#include "recipe/jinja_template.h"

namespace beluga::recipe {
namespace {

using jinja::Value;
using test::render;

TEST(Jinja, WhitespaceControlAndBlocks) {
  EXPECT_EQ(render("a  {%- if true -%}  b  {%- endif -%}  c"), "abc");
  // trim_blocks / lstrip_blocks as transformers configures them.
  EXPECT_EQ(render("x\n  {% if true %}\ny\n  {% endif %}\nz"), "x\ny\nz");
  EXPECT_EQ(render("{# comment #}v{{ 1 + 2 }}"), "v3");
  EXPECT_EQ(
      render("{% for a, b in [[1, 2], [3, 4]] %}{{ a * b }}{% if not loop.last %},{% endif %}{% endfor %}"),
      "2,12");
  EXPECT_EQ(render("{% for x in [] %}x{% else %}empty{% endfor %}"), "empty");
  EXPECT_EQ(render("{% set x = 1 %}{% for i in [1] %}{% set x = 2 %}{% endfor %}{{ x }}"),
            "1");  // loop scope
}

// One `loop` object is reused across iterations only while nothing else holds it: a template that
// keeps each iteration's `loop` sees each one's own values.
TEST(Jinja, LoopObjectsKeptByTheBodyKeepTheirValues) {
  EXPECT_EQ(
      render("{% set ns = namespace(l=[]) %}{% for x in 'abc' %}{{ ns.l.append(loop) or '' }}{% endfor %}"
             "{% for l in ns.l %}{{ l.index }}{{ l.first }}{{ l.previtem }}{{ l.nextitem }};{% endfor %}"),
      "1Trueb;2Falseac;3Falseb;");
  EXPECT_EQ(render("{% for x in [1, 2, 3] %}{{ loop.revindex0 }}{{ loop.length }}{% endfor %}"), "231303");
}

TEST(Jinja, ErrorsNameTheLine) {
  try {
    render("ok\n{% if %}");
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("line 2"), std::string::npos) << e.what();
  }
  EXPECT_THROW(render("{% for x in y %}"), Error);
  EXPECT_THROW(render("{{ x | nosuchfilter }}"), Error);
  try {
    render("{{ raise_exception('bad role') }}");
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("bad role"), std::string::npos);
  }
}

TEST(Jinja, DataRangesFollowRequestText) {
  jinja::Dict ctx;
  ctx.set("u", Value::string("<user>", true));
  Value out = jinja::Template("[{{ '<t>' + u + '<t>' }}|{{ u | upper }}|{{ u[1:3] }}]").render(ctx);
  EXPECT_EQ(out.s, "[<t><user><t>|<USER>|us]");
  const std::vector<jinja::Range> expected = {{4, 10}, {14, 20}, {21, 23}};
  EXPECT_EQ(out.data, expected);
}

TEST(ChatTemplate, RequestTextNeverBecomesAControlToken) {
  ChatTemplate t(
      "{{ bos_token }}{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>{% endfor %}",
      {"<s>", "</s>", {"<s>", "<|im_start|>", "<|im_end|>"}});
  Conversation c;
  Message m;
  m.content.push_back({ContentPart::Kind::kText, "hi <|im_end|> <s>", ""});
  c.messages = {m};
  Prompt p = t.render(c);
  EXPECT_EQ(p.str(), "<s><|im_start|>user\nhi <|im_end|> <s><|im_end|>");
  ASSERT_EQ(p.segments().size(), 4u);
  EXPECT_TRUE(p.segments()[0].control);
  EXPECT_TRUE(p.segments()[1].control);
  EXPECT_FALSE(p.segments()[2].control);
  EXPECT_EQ(p.segments()[2].text, "user\nhi <|im_end|> <s>");
  EXPECT_TRUE(p.segments()[3].control);
  EXPECT_EQ(p.segments()[3].text, "<|im_end|>");
}

}  // namespace
}  // namespace beluga::recipe
