// not, if/then/else, uniqueItems, oneOf with overlapping branches and dependent schemas (the last two
// through complements and rewrites) and multipleOf with a 0 bound (which if/else needs), each on
// hand-written valid and invalid instances (compact JSON, as the grammar writes it), including the
// tricky ones: numbers equal by value (1 and 1.0), "not integer" against numbers, a missing then or
// else; and the cases that are refused because their complement or domain cannot be built.
#include <gtest/gtest.h>

#include "grammar/json_schema.h"
#include "grammar/refused.h"
#include "grammar_test_support.h"

namespace beluga::grammar {
namespace {

using testing::full;

using testing::refused;
using testing::schema;

void expect(const char* text, std::initializer_list<const char*> ok, std::initializer_list<const char*> bad) {
  auto g = schema(text);
  for (const char* s : ok) EXPECT_TRUE(full(g, s)) << text << " should accept " << s;
  for (const char* s : bad) EXPECT_FALSE(full(g, s)) << text << " should reject " << s;
}

TEST(JsonSchemaNot, TypesBecomeTheOtherTypes) {
  // 2020-12: 1.0 is an integer, so "not integer" is the non-integral numbers (no exponent).
  expect(R"({"not":{"type":"integer"}})", {R"("foo")", "1.5", "-0.25", "0.001", "null", "[1]", "{}", "true"},
         {"1", "-3", "0", "1.0", "-2.000", "1.5e1"});
  // Draft 4: an integer is a spelling without fraction or exponent, so 1.0 and 1e5 are not integers.
  expect(R"({"$schema":"http://json-schema.org/draft-04/schema#","not":{"type":"integer"}})",
         {"1.0", "1e5", "1.5", "-2.5E-3", R"("x")"}, {"1", "-2", "0"});
  expect(R"({"not":{"type":["integer","boolean"]}})", {R"("x")", "2.5", "null"}, {"true", "false", "1"});
  expect(R"({"not":{"type":"number"}})", {R"("a")", "[]"}, {"1", "1.5", "-0.5"});
  expect(R"({"type":"number","not":{"type":"integer"}})", {"0.5", "-7.25"}, {"2", "2.0", R"("a")"});
  expect(R"({"type":"integer","not":{"type":"number"}})", {}, {"1", "1.5", "null"});
  // With bounds: the non-integral numbers in range.
  expect(R"({"type":"number","minimum":1,"maximum":3,"not":{"type":"integer"}})", {"1.5", "2.99"},
         {"1", "2.0", "3", "0.5", "3.5"});
}

TEST(JsonSchemaNot, BooleanAndEmptySchemas) {
  expect(R"({"not":{}})", {}, {"null", "1", R"("a")", "{}"});
  expect(R"({"not":true})", {}, {"null", "[]"});
  expect(R"({"not":false})", {"1", "{}", R"("a")"}, {});
  expect(R"({"properties":{"foo":{"not":{}}}})", {R"({"bar":1,"baz":2})", "{}"}, {R"({"foo":1,"bar":2})"});
  expect(R"({"not":{"not":{"type":"string"}}})", {R"("a")"}, {"1", "null"});
}

TEST(JsonSchemaNot, ObjectKeywordsAndCombinations) {
  expect(R"({"not":{"type":"object","properties":{"foo":{"type":"string"}}}})",
         {"1", R"({"foo":1})", R"({"foo":null,"x":"y"})"}, {R"({"foo":"bar"})", "{}", R"({"x":1})"});
  // required holds for every non-object, so its complement is objects missing a key.
  expect(R"({"not":{"required":["a"]}})", {"{}", R"({"b":1})"}, {R"({"a":1})", "3", R"("a")"});
  expect(R"({"not":{"anyOf":[{"type":"string"},{"type":"null"}]}})", {"1", "[]"}, {"null", R"("a")"});
  expect(R"({"not":{"allOf":[{"type":"integer"},{"minimum":5}]}})", {"4", "1.5", R"("a")"}, {"5", "17"});
  expect(R"({"not":{"type":"array","items":{"type":"string"}}})", {R"([1,"a"])", "[null]", "2"},
         {"[]", R"(["a","b"])"});
  expect(R"({"type":"array","not":{"contains":{"type":"string"}}})", {"[]", "[1,2]"},
         {R"(["a"])", R"([1,"b"])"});
  expect(R"({"type":"string","not":{"minLength":3}})", {R"("")", R"("ab")"}, {R"("abc")"});
}

TEST(JsonSchemaNot, BoundsAreTheNumbersBeyond) {
  expect(R"({"type":"integer","not":{"minimum":5}})", {"4", "-1"}, {"5", "6", "5.0"});
  expect(R"({"not":{"maximum":3}})", {"4", "3.5"}, {"3", "2", R"("x")", "null"});
  expect(R"({"not":{"exclusiveMinimum":0}})", {"0", "-1", "-0.5"}, {"1", "0.5", "[]"});
  expect(
      R"({"$schema":"http://json-schema.org/draft-04/schema#","not":{"minimum":0,"exclusiveMinimum":true}})",
      {"0", "-2"}, {"1", "{}"});
}

TEST(JsonSchemaNot, ConstAndEnumOverScalars) {
  expect(R"({"type":"string","not":{"enum":["a","b"]}})", {R"("c")", R"("ab")", R"("")", R"("\n")"},
         {R"("a")", R"("b")", "1"});
  expect(R"({"type":"integer","not":{"const":3}})", {"2", "4", "-3", "30", "2.0"}, {"3", "3.0", "3.00"});
  // Numbers equal by value: 1, 1.0 and 1.00 are all the excluded 1.
  expect(R"({"type":"number","not":{"const":1}})", {"1.5", "0.99", "2", "-1"}, {"1", "1.0", "1.00"});
  expect(R"({"enum":[1,2,3],"not":{"const":2}})", {"1", "3"}, {"2", "2.0", "4"});
  expect(R"({"type":"boolean","not":{"const":true}})", {"false"}, {"true"});
  expect(R"({"not":{"enum":[null,1,"x"]}})", {R"("y")", "true", "2", "[]", "{}"}, {"1", "null", R"("x")"});
  expect(R"({"type":"null","not":{"const":null}})", {}, {"null"});
  expect(R"({"type":"integer","not":{"enum":[1.5,2]}})", {"1", "3"}, {"2", "1.5"});
  EXPECT_EQ(refused(R"({"type":"string","minLength":2,"not":{"const":"ab"}})"), "not");
  EXPECT_EQ(refused(R"({"type":"number","not":{"const":1.5}})"), "not");
  EXPECT_EQ(refused(R"({"not":{"const":[1]}})"), "not");
  EXPECT_EQ(refused(R"({"type":"integer","multipleOf":2,"not":{"const":4}})"), "not");
}

TEST(JsonSchemaNot, RefusedComplements) {
  EXPECT_EQ(refused(R"({"not":{"pattern":"a"}})"), "not");
  EXPECT_EQ(refused(R"({"not":{"multipleOf":2}})"), "not");
  EXPECT_EQ(refused(R"({"not":{"oneOf":[{"type":"string"},{"type":"null"}]}})"), "not");
  EXPECT_EQ(refused(R"({"not":{"uniqueItems":true}})"), "not");
  EXPECT_EQ(refused(R"({"not":{"properties":{"a":{}},"additionalProperties":false}})"), "not");
  EXPECT_EQ(refused(R"({"$beluga:notIn":[1]})"), "$beluga:notIn");  // reserved for the compiler
  // A recursive reference has no finite complement (and branching recursion must not take forever).
  EXPECT_EQ(refused(R"({"$defs":{"t":{"properties":{"a":{"$ref":"#/$defs/t"},"b":{"$ref":"#/$defs/t"}}}},)"
                    R"("not":{"$ref":"#/$defs/t"}})"),
            "not");
}

TEST(JsonSchemaIfThenElse, NumericConditions) {
  const char* both = R"({"if":{"exclusiveMaximum":0},"then":{"minimum":-10},"else":{"multipleOf":2}})";
  expect(both, {"-1", "-10", "4", "0", R"("x")", "null"}, {"-100", "-10.5", "3", "4.5"});
  // No else: a value failing `if` is valid whatever it is.
  expect(R"({"if":{"exclusiveMaximum":0},"then":{"minimum":-10}})", {"-1", "3", "3.5", "-10"},
         {"-100", "-10.5"});
  // No then: a value passing `if` is valid whatever it is.
  expect(R"({"if":{"exclusiveMaximum":0},"else":{"multipleOf":2}})", {"-100", "-3", "4", "0"}, {"3", "1.5"});
}

TEST(JsonSchemaIfThenElse, TypeAndConstConditions) {
  expect(R"({"if":{"type":"string"},"then":{"maxLength":2},"else":{"type":"integer"}})",
         {R"("ab")", R"("")", "5", "5.0"}, {R"("abc")", "1.5", "null", "[]"});
  expect(R"({"type":"object","if":{"properties":{"kind":{"const":"a"}},"required":["kind"]},)"
         R"("then":{"required":["x"]}})",
         {R"({"kind":"a","x":1})", R"({"x":1,"kind":"a"})", R"({"kind":"b"})", "{}"},
         {R"({"kind":"a"})", "3"});
  expect(R"({"if":{"const":0},"then":{"type":"integer"},"else":{"type":"string"}})", {"0", "0.0", R"("a")"},
         {"1", "null"});
}

TEST(JsonSchemaIfThenElse, LoneKeywordsAndCombinedSchemas) {
  expect(R"({"if":{"const":0}})", {"1", "0"}, {});
  expect(R"({"then":{"const":0}})", {"1"}, {});
  expect(R"({"else":{"const":0}})", {"1"}, {});
  // One part's if never meets another part's then/else.
  expect(R"({"allOf":[{"if":{"exclusiveMaximum":0}},{"then":{"minimum":-10}},{"else":{"multipleOf":2}}]})",
         {"-100", "3"}, {});
  EXPECT_EQ(refused(R"({"$schema":"http://json-schema.org/draft-06/schema#","if":{},"then":{}})"), "if");
  EXPECT_EQ(refused(R"({"if":{"pattern":"a"},"then":{"minLength":2}})"), "if");
}

TEST(JsonSchemaUniqueItems, EnumItemsAreASubsetAutomaton) {
  expect(R"({"type":"array","items":{"enum":[1,2,3]},"uniqueItems":true})",
         {"[]", "[1]", "[1,2,3]", "[3,1]", "[2.0,1]"}, {"[1,1]", "[1,1.0]", "[2,3,2]", "[1,2,3,1]", "[4]"});
  // 1 and 1.0 are one value of the domain.
  expect(R"({"items":{"enum":[1,1.0,2]},"uniqueItems":true})", {"[1.0,2]", "[2,1]"}, {"[1,1.0]", "[1.00,1]"});
  expect(R"({"items":{"type":"boolean"},"uniqueItems":true})", {"[true,false]", "[false]"},
         {"[true,true]", "[false,true,false]"});
  expect(R"({"items":{"type":["null","boolean"]},"uniqueItems":true})", {"[null,true,false]"},
         {"[null,null]"});
  expect(R"({"items":{"enum":["x","y","z"]},"uniqueItems":true,"minItems":2,"maxItems":2})",
         {R"(["x","y"])", R"(["z","x"])"}, {R"(["x"])", R"(["x","x"])", R"(["x","y","z"])"});
  expect(R"({"items":{"enum":[1,2,3]},"uniqueItems":true,"minItems":4})", {}, {"[1,2,3]", "[1,2,3,1]"});
  expect(R"({"items":{"enum":[1]},"uniqueItems":true})", {R"("s")", "[1]"}, {"[1,1]"});  // only arrays
}

TEST(JsonSchemaUniqueItems, ArraysOfBoundedEnumsAndPrefixes) {
  expect(R"({"items":{"type":"array","items":{"enum":["a","b"]},"maxItems":2},"uniqueItems":true})",
         {R"([[],["a"],["a","b"]])", R"([["a","b"],["b","a"]])"},
         {R"([["a"],["a"]])", R"([["a","b"],["a","b"]])", R"([[],[]])", R"([["a","a","a"]])"});
  expect(R"({"prefixItems":[{"enum":[1,2]},{"enum":[2,3]}],"items":false,"uniqueItems":true})",
         {"[1,2]", "[2,3]", "[1]", "[1,3]"}, {"[2,2]", "[3]", "[1,2,3]"});
  expect(R"({"prefixItems":[{"const":"a"}],"items":{"enum":["a","b"]},"uniqueItems":true})",
         {R"(["a","b"])", R"(["a"])"}, {R"(["a","a"])", R"(["b"])", R"(["a","b","b"])"});
}

TEST(JsonSchemaUniqueItems, NoOpsAndRefusals) {
  expect(R"({"uniqueItems":false})", {"[1,1]", "1"}, {});
  expect(R"({"uniqueItems":true,"maxItems":1})", {R"([{"a":1}])", "[]"}, {"[1,2]"});
  EXPECT_EQ(refused(R"({"uniqueItems":true})"), "uniqueItems");
  EXPECT_EQ(refused(R"({"items":{"type":"integer"},"uniqueItems":true})"), "uniqueItems");
  EXPECT_EQ(refused(R"({"items":{"enum":[0,1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16]},"uniqueItems":true})"),
            "uniqueItems");
  EXPECT_EQ(refused(R"({"items":{"enum":[1,2]},"uniqueItems":true,"contains":{"const":1}})"), "uniqueItems");
}

TEST(JsonSchemaOneOf, OverlappingBranchesTakeTheOthersComplements) {
  expect(R"({"oneOf":[{"type":"integer"},{"minimum":2}]})", {"1", "-1", "2.5", R"("x")"},
         {"3", "2", "2.0", "1.5"});
  expect(R"({"type":"string","oneOf":[{"minLength":2},{"maxLength":4}]})", {R"("a")", R"("abcde")"},
         {R"("abc")", R"("ab")", "1"});
  expect(R"({"oneOf":[true,true]})", {}, {"1", "null", "{}"});
  expect(R"({"oneOf":[true,false,false]})", {"1", "null"}, {});
  EXPECT_EQ(refused(R"({"oneOf":[{"pattern":"a"},{"pattern":"b"}]})"), "oneOf");
}

TEST(JsonSchemaDependentSchemas, KeyAbsentOrSchemaHolds) {
  expect(R"({"dependencies":{"bar":{"properties":{"foo":{"type":"integer"},"bar":{"type":"integer"}}}}})",
         {R"({"foo":1,"bar":2})", R"({"foo":"quux"})", R"({"bar":2})", R"("x")", "{}"},
         {R"({"foo":"quux","bar":2})", R"({"foo":2,"bar":"quux"})", R"({"bar":2,"foo":"q"})"});
  expect(R"({"dependentSchemas":{"a":{"required":["b"]}}})", {R"({"a":1,"b":2})", R"({"b":1})", "{}"},
         {R"({"a":1})"});
}

TEST(JsonSchemaMultipleOf, AnInclusiveZeroBoundIsTheSign) {
  expect(R"({"type":"integer","multipleOf":2,"minimum":0})", {"0", "4", "4.0"}, {"-2", "3", "-0.5"});
  expect(R"({"type":"number","multipleOf":0.5,"maximum":0})", {"-4", "0", "0.0", "-1.5"},
         {"2", "0.5", "-0.25"});
  EXPECT_EQ(refused(R"({"multipleOf":2,"minimum":1})"), "multipleOf");
  EXPECT_EQ(refused(R"({"multipleOf":2,"exclusiveMinimum":0})"), "multipleOf");
}

}  // namespace
}  // namespace beluga::grammar
