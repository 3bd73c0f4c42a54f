// The JSON Schema keywords enforced beyond the basics, each on hand-written valid and invalid
// instances (compact JSON, as the grammar writes it): multipleOf, minProperties/maxProperties,
// dependencies/dependentRequired, propertyNames, patternProperties, contains, and the cases of each
// that are refused because they cannot be made exact.
#include <gtest/gtest.h>

#include "grammar/json_schema.h"
#include "grammar/refused.h"
#include "grammar_test_support.h"

namespace beluga::grammar {
namespace {

using testing::full;

using testing::refused;
using testing::schema;

TEST(JsonSchemaKeywords, MultipleOfIntegerTracksTheRemainder) {
  auto g = schema(R"({"type":"integer","multipleOf":7})");
  for (const char* ok : {"0", "7", "-14", "700", "343", "1001", "7.0", "98000000000000000007"}) {
    // 98000000000000000007 = 7 * 14000000000000000001
    EXPECT_TRUE(full(g, ok)) << ok;
  }
  for (const char* bad : {"1", "8", "-15", "701", "07", "7.5", "3.5", "1000", "-0.5", "98000000000000000008"})
    EXPECT_FALSE(full(g, bad)) << bad;
}

TEST(JsonSchemaKeywords, MultipleOfDecimalOnNumbers) {
  auto g = schema(R"({"type":"number","multipleOf":1.5})");
  for (const char* ok : {"0", "1.5", "3", "4.5", "-4.50", "15", "0.0"}) EXPECT_TRUE(full(g, ok)) << ok;
  for (const char* bad : {"1", "2", "1.51", "4.25", "35", "0.5"}) EXPECT_FALSE(full(g, bad)) << bad;
  auto small = schema(R"({"multipleOf":0.0001})");
  EXPECT_TRUE(full(small, "0.0075"));
  EXPECT_TRUE(full(small, "12"));
  EXPECT_TRUE(full(small, "\"any string\""));  // multipleOf only constrains numbers
  EXPECT_FALSE(full(small, "0.00751"));
  auto draft4 =
      schema(R"({"$schema":"http://json-schema.org/draft-04/schema#","type":"integer","multipleOf":2})");
  EXPECT_TRUE(full(draft4, "4"));
  EXPECT_FALSE(full(draft4, "4.0"));  // draft 4: an integer has no fraction
  EXPECT_EQ(refused(R"({"multipleOf":3,"minimum":1})"), "multipleOf");
  EXPECT_EQ(refused(R"({"multipleOf":123456789})"), "multipleOf");
  EXPECT_EQ(refused(R"({"multipleOf":0.123456789})"), "multipleOf");
}

TEST(JsonSchemaKeywords, MinAndMaxPropertiesCountEveryMember) {
  auto g = schema(R"({"type":"object","properties":{"a":{},"b":{}},"minProperties":1,"maxProperties":2})");
  for (const char* ok :
       {R"({"a":1})", R"({"x":1})", R"({"b":1,"a":2})", R"({"x":1,"a":2})", R"({"x":1,"y":2})"})
    EXPECT_TRUE(full(g, ok)) << ok;
  for (const char* bad : {"{}", R"({"a":1,"b":2,"c":3})", R"({"x":1,"y":2,"z":3})", R"({"a":1,"a":2})"})
    EXPECT_FALSE(full(g, bad)) << bad;
  auto closed =
      schema(R"({"properties":{"a":{},"b":{},"c":{}},"additionalProperties":false,"maxProperties":1})");
  EXPECT_TRUE(full(closed, R"({"c":true})"));
  EXPECT_FALSE(full(closed, R"({"a":1,"c":true})"));
  EXPECT_FALSE(full(schema(R"({"minProperties":2,"maxProperties":1})"), "{}"));
}

TEST(JsonSchemaKeywords, DependenciesRequireTheirKeys) {
  auto g = schema(R"({"dependencies":{"quux":["foo","bar"]}})");
  EXPECT_TRUE(full(g, R"({"foo":1,"bar":2,"quux":3})"));
  EXPECT_TRUE(full(g, R"({"foo":1})"));
  EXPECT_TRUE(full(g, R"({"x":1})"));
  EXPECT_FALSE(full(g, R"({"quux":3,"foo":1})"));
  EXPECT_FALSE(full(g, R"({"quux":3})"));
  auto dr = schema(R"({"properties":{"card":{"type":"string"}},"dependentRequired":{"card":["billing"]}})");
  EXPECT_TRUE(full(dr, R"({"billing":"x","card":"1"})"));
  EXPECT_FALSE(full(dr, R"({"card":"1"})"));
  auto banned = schema(R"({"dependencies":{"foo":true,"bar":false}})");
  EXPECT_TRUE(full(banned, R"({"foo":1})"));
  EXPECT_FALSE(full(banned, R"({"bar":1})"));
  auto dep = schema(R"({"dependencies":{"bar":{"required":["foo"]}}})");  // json_schema_logic_test.cc
  EXPECT_TRUE(full(dep, R"({"bar":1,"foo":2})"));
  EXPECT_FALSE(full(dep, R"({"bar":1})"));
  EXPECT_EQ(
      refused(
          R"({"properties":{"a":{},"b":{},"c":{},"d":{},"e":{},"f":{}},"dependentRequired":{"a":["b"]}})"),
      "dependentRequired");
}

TEST(JsonSchemaKeywords, PropertyNamesConstrainKeys) {
  EXPECT_EQ(refused(R"({"propertyNames":{"maxLength":3,"pattern":"^[a-z]+$"}})"), "pattern");
  auto len = schema(R"({"propertyNames":{"maxLength":3}})");
  EXPECT_TRUE(full(len, R"({"foo":1,"ab":[]})"));
  EXPECT_TRUE(full(len, "{}"));
  EXPECT_FALSE(full(len, R"({"fooo":1})"));
  auto pat =
      schema(R"({"properties":{"id":{"type":"integer"},"Bad":{}},"propertyNames":{"pattern":"^[a-z]+$"},
                        "additionalProperties":false})");
  EXPECT_TRUE(full(pat, R"({"id":1})"));
  EXPECT_FALSE(full(pat, R"({"Bad":1})"));  // a named property whose name is not valid cannot appear
  auto names = schema(R"({"properties":{"a":{"type":"integer"}},"propertyNames":{"enum":["a","b"]}})");
  EXPECT_TRUE(full(names, R"({"b":"x","a":1})"));
  EXPECT_FALSE(full(names, R"({"a":"x"})"));
  EXPECT_FALSE(full(names, R"({"c":1})"));
  EXPECT_FALSE(full(schema(R"({"propertyNames":false})"), R"({"a":1})"));
  EXPECT_TRUE(full(schema(R"({"propertyNames":false})"), "{}"));
  EXPECT_EQ(refused(R"({"properties":{"a":{}},"propertyNames":{"maxLength":3}})"), "propertyNames");
}

TEST(JsonSchemaKeywords, PatternPropertiesWithClosedObjects) {
  auto g = schema(R"({"properties":{"name":{"type":"string"}},"patternProperties":{"^x-":{"type":"integer"}},
                      "additionalProperties":false})");
  EXPECT_TRUE(full(g, R"({"name":"n","x-a":1,"x-b":2})"));
  EXPECT_TRUE(full(g, R"({"x-":3})"));
  EXPECT_FALSE(full(g, R"({"x-a":"s"})"));
  EXPECT_FALSE(full(g, R"({"y":1})"));
  // A named key matching a pattern takes both schemas; the pattern's other keys exclude it.
  auto both = schema(R"({"properties":{"ab":{"type":"integer"}},"patternProperties":{"^a":{"minimum":5}},
                         "additionalProperties":false})");
  EXPECT_TRUE(full(both, R"({"ab":5,"a":"s","abc":7})"));
  EXPECT_FALSE(full(both, R"({"ab":4})"));    // minimum from the pattern
  EXPECT_FALSE(full(both, R"({"ab":"s"})"));  // type from properties
  EXPECT_FALSE(full(both, R"({"abc":4})"));   // an unnamed key matching the pattern
  EXPECT_FALSE(full(both, R"({"b":1})"));     // matches nothing: additionalProperties false
  auto named =
      schema(R"({"properties":{"ab":{"type":"integer"}},"patternProperties":{"^a":true},"required":["ab"]})");
  EXPECT_TRUE(full(named, R"({"ab":1,"zz":"s"})"));
  EXPECT_FALSE(full(named, R"({"ab":"s"})"));
}

TEST(JsonSchemaKeywords, PatternPropertiesSplitKeysByTheirPatterns) {
  // Open additionalProperties: keys matching no pattern take it (the pattern's complement).
  auto open =
      schema(R"({"patternProperties":{"f.*o":{"type":"integer"}},"additionalProperties":{"type":"string"}})");
  EXPECT_TRUE(full(open, R"({"foo":1,"xfooy":2,"bar":"s","of":"t"})"));
  EXPECT_FALSE(full(open, R"({"foo":"s"})"));
  EXPECT_FALSE(full(open, R"({"bar":1})"));
  // Two patterns: a key matching both satisfies both schemas.
  auto two = schema(R"({"patternProperties":{"a*":{"type":"integer"},"aaa*":{"maximum":20}}})");
  EXPECT_TRUE(full(two, R"({"a":21,"aaaa":18})"));
  EXPECT_FALSE(full(two, R"({"aaaa":31})"));
  EXPECT_FALSE(full(two, R"({"aaa":"s"})"));
  EXPECT_FALSE(full(two, R"({"b":"anything"})"));  // unanchored "a*" matches every key
  EXPECT_EQ(
      refused(
          R"({"patternProperties":{"a":{}},"propertyNames":{"maxLength":3},"additionalProperties":false})"),
      "patternProperties");
}

TEST(JsonSchemaKeywords, ContainsWithTypeTests) {
  auto g = schema(R"({"type":"array","contains":{"type":"string"}})");
  for (const char* ok : {R"(["a"])", R"([1,"a",null])", R"(["a","b"])", R"([[],{},"x"])"})
    EXPECT_TRUE(full(g, ok)) << ok;
  for (const char* bad : {"[]", "[1,2]", R"([["a"]])"}) EXPECT_FALSE(full(g, bad)) << bad;
  auto counted = schema(R"({"items":{"type":["integer","null"]},"contains":{"type":"null"},"minContains":2,
                            "maxContains":3})");
  EXPECT_TRUE(full(counted, "[null,1,null]"));
  EXPECT_TRUE(full(counted, "[null,null,null,4]"));
  EXPECT_FALSE(full(counted, "[null,1]"));
  EXPECT_FALSE(full(counted, "[null,null,null,null]"));
  EXPECT_FALSE(full(counted, R"([null,null,"s"])"));  // items still apply
  EXPECT_TRUE(full(schema(R"({"contains":true})"), "[1]"));
  EXPECT_FALSE(full(schema(R"({"contains":true})"), "[]"));
  EXPECT_FALSE(full(schema(R"({"contains":false})"), "[1]"));
  EXPECT_TRUE(full(schema(R"({"contains":false})"), "\"not an array\""));
  auto five = schema(R"({"contains":{"minimum":5}})");
  for (const char* ok : {"[3,4,5]", "[6]", R"(["a"])", "[2,{}]", "[5.5]", "{}"})
    EXPECT_TRUE(full(five, ok)) << ok;
  for (const char* bad : {"[]", "[2,3,4]", "[4.9]", "[-7]"}) EXPECT_FALSE(full(five, bad)) << bad;
  auto exactly = schema(R"({"contains":{"const":5},"maxContains":1})");
  EXPECT_TRUE(full(exactly, "[3,5,\"5\"]"));
  EXPECT_FALSE(full(exactly, "[3,4]"));
  EXPECT_FALSE(full(exactly, "[5,5]"));
  EXPECT_EQ(refused(R"({"contains":{"minimum":5.5}})"), "contains");
  EXPECT_EQ(refused(R"({"contains":{"const":"a"}})"), "contains");
  EXPECT_EQ(refused(R"({"contains":{"type":"integer"}})"), "contains");
}

// Counts past int64_t's range (fuzz_grammar, session 20: converting `"maxItems": 3.2e26` to an
// integer was undefined behavior) are refused naming their keyword, as any bound past
// what the compiler enforces is.
TEST(JsonSchemaKeywords, CountsBeyondAnyIntegerAreRefusedNamingTheirKeyword) {
  EXPECT_EQ(refused(R"({"type":"array","items":{"enum":[5]},"maxItems":3.2e26})"), "maxItems");
  EXPECT_EQ(refused(R"({"type":"array","minItems":1e30})"), "minItems");
  EXPECT_EQ(refused(R"({"type":"object","properties":{"a":{}},"maxProperties":1e300})"), "maxProperties");
  EXPECT_EQ(refused(R"({"type":"array","not":{"minItems":1e30}})"),
            "maxItems");  // not minItems n: maxItems n-1
  EXPECT_EQ(refused(R"({"type":"array","contains":{"type":"null"},"maxContains":1e40})"), "contains");
  EXPECT_EQ(refused(R"({"type":"array","contains":true,"maxContains":1e40})"),
            "maxItems");  // bounds the length
}

TEST(JsonSchemaKeywords, AllOfCombinesCountsAndRefusesPatternsAgainstKeys) {
  auto g = schema(R"({"allOf":[{"minProperties":1},{"maxProperties":1}]})");
  EXPECT_TRUE(full(g, R"({"a":1})"));
  EXPECT_FALSE(full(g, "{}"));
  EXPECT_FALSE(full(g, R"({"a":1,"b":2})"));
  EXPECT_EQ(refused(R"({"allOf":[{"patternProperties":{"^a":{}},"additionalProperties":false},
                                  {"properties":{"ab":{}}}]})"),
            "allOf");
}

}  // namespace
}  // namespace beluga::grammar
