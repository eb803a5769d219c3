#include "sharding/json.h"

#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace shardcoord {
namespace {

using ::testing::HasSubstr;

TEST(JsonTest, ParsesEveryKind) {
  absl::StatusOr<JsonValue> v = ParseJson(
      R"( {"a": [1, -2, 3.5, 1e3], "b": {"c": "x\u00e9\n\"\ud83d\ude00"}, "t": true, "f": false, "n": null} )");
  ASSERT_TRUE(v.ok()) << v.status();
  ASSERT_TRUE(v->is_object());
  ASSERT_EQ(v->members().size(), 5u);
  EXPECT_EQ(v->members()[0].first, "a");  // File order kept.
  const JsonValue& a = *v->Find("a");
  ASSERT_EQ(a.items().size(), 4u);
  EXPECT_EQ(*a.items()[0].AsInt64("a[0]"), 1);
  EXPECT_EQ(*a.items()[1].AsInt64("a[1]"), -2);
  EXPECT_FALSE(a.items()[2].is_integer());
  EXPECT_FALSE(a.items()[3].AsInt64("a[3]").ok());
  EXPECT_EQ(v->Find("b")->Find("c")->text(), "x\xc3\xa9\n\"\xf0\x9f\x98\x80");
  EXPECT_TRUE(v->Find("t")->bool_value());
  EXPECT_EQ(v->Find("n")->kind(), JsonValue::Kind::kNull);
  EXPECT_EQ(v->Find("missing"), nullptr);
}

TEST(JsonTest, IntegersAreExactTo64Bits) {
  absl::StatusOr<JsonValue> v = ParseJson("[9223372036854775807, 18446744073709551615]");
  ASSERT_TRUE(v.ok());
  EXPECT_EQ(*v->items()[0].AsInt64("x"), INT64_MAX);
  EXPECT_FALSE(v->items()[1].AsInt64("x").ok());
  EXPECT_EQ(*v->items()[1].AsUint64("x"), UINT64_MAX);
  EXPECT_FALSE(ParseJson("-1")->AsUint64("x").ok());
}

TEST(JsonTest, RefusesWhatLenientParsersAccept) {
  const char* bad[] = {
      R"({"a": 1, "a": 2})",  // Duplicate key.
      "{\"a\": \"\x01\"}",    // Raw control character.
      "\"\xff\"",             // Invalid UTF-8.
      "\"\xc0\xaf\"",         // Overlong encoding.
      "\"\xed\xa0\x80\"",     // Encoded surrogate.
      R"("\ud800")",          // Lone surrogate escape.
      "[1, 2] x",             // Trailing data.
      "[1, 2,]",              // Trailing comma.
      "01",                   // Leading zero.
      "1.",                   // Missing fraction digits.
      "{'a': 1}",             // Single quotes.
      "",                     // Nothing.
      "nul",                  // Truncated literal.
      R"("\x")",              // Bad escape.
  };
  for (const char* text : bad) {
    absl::StatusOr<JsonValue> v = ParseJson(text);
    EXPECT_FALSE(v.ok()) << text;
    if (!v.ok()) {
      EXPECT_THAT(v.status().message(), HasSubstr("JSON byte "));
    }
  }
}

TEST(JsonTest, NamesTheDuplicateKey) {
  absl::StatusOr<JsonValue> v = ParseJson(R"({"w": 1, "w": 2})");
  ASSERT_FALSE(v.ok());
  EXPECT_THAT(v.status().message(), HasSubstr("duplicate key \"w\""));
}

TEST(JsonTest, BoundsNesting) {
  std::string deep(kMaxJsonDepth + 1, '[');
  deep += std::string(kMaxJsonDepth + 1, ']');
  EXPECT_FALSE(ParseJson(deep).ok());
  std::string ok(kMaxJsonDepth - 1, '[');
  ok += std::string(kMaxJsonDepth - 1, ']');
  EXPECT_TRUE(ParseJson(ok).ok());
}

TEST(JsonTest, QuoteRoundTrips) {
  const std::string s = "a\"b\\c\n\x01\xc3\xa9";
  absl::StatusOr<JsonValue> v = ParseJson(QuoteJson(s));
  ASSERT_TRUE(v.ok()) << v.status();
  EXPECT_EQ(v->text(), s);
}

}  // namespace
}  // namespace shardcoord
