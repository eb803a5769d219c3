#include "common/json_writer.h"

#include <cmath>
#include <limits>
#include <string>

#include "gtest/gtest.h"

namespace shardcoord {
namespace {

TEST(JsonWriterTest, NestedObjectsAndArraysUsePythonStyleSeparators) {
  JsonWriter w;
  w.BeginObject();
  w.Key("chunks").BeginArray();
  w.BeginObject().Key("rank").Int(0).Key("shape").IntArray({1, 4}).EndObject();
  w.BeginObject().Key("rank").Int(1).Key("shape").IntArray({}).EndObject();
  w.EndArray();
  w.Key("ok").Bool(true).Key("none").Null().Key("empty").BeginObject().EndObject();
  w.EndObject();
  EXPECT_TRUE(w.complete());
  EXPECT_EQ(w.str(),
            "{\"chunks\": [{\"rank\": 0, \"shape\": [1, 4]}, {\"rank\": 1, \"shape\": []}], "
            "\"ok\": true, \"none\": null, \"empty\": {}}");
}

TEST(JsonWriterTest, TopLevelScalarsAndArrays) {
  JsonWriter a;
  a.Int(-7);
  EXPECT_TRUE(a.complete());
  EXPECT_EQ(a.str(), "-7");

  JsonWriter b;
  b.BeginArray().String("x").Bool(false).Uint(18446744073709551615u).EndArray();
  EXPECT_TRUE(b.complete());
  EXPECT_EQ(b.str(), "[\"x\", false, 18446744073709551615]");
}

TEST(JsonWriterTest, Int64Extremes) {
  JsonWriter w;
  w.IntArray({std::numeric_limits<int64_t>::min(), std::numeric_limits<int64_t>::max()});
  EXPECT_EQ(w.str(), "[-9223372036854775808, 9223372036854775807]");
}

TEST(JsonWriterTest, EscapesStringsAndKeys) {
  EXPECT_EQ(JsonQuote("a\"b\\c"), "\"a\\\"b\\\\c\"");
  EXPECT_EQ(JsonQuote("\n\t\r\b\f"), "\"\\n\\t\\r\\b\\f\"");
  EXPECT_EQ(JsonQuote(std::string("\x01\x1f", 2)), "\"\\u0001\\u001f\"");
  EXPECT_EQ(JsonQuote(std::string("nul\0end", 7)), "\"nul\\u0000end\"");
  EXPECT_EQ(JsonQuote("caf\xc3\xa9 /"), "\"caf\xc3\xa9 /\"");  // UTF-8 and '/' pass through.

  JsonWriter w;
  w.BeginObject().Key("k\"ey").String("v\nal").EndObject();
  EXPECT_EQ(w.str(), "{\"k\\\"ey\": \"v\\nal\"}");
}

TEST(JsonWriterTest, DoublesAreShortestRoundTripAndStayFloats) {
  auto text = [](double v) {
    JsonWriter w;
    w.Double(v);
    return w.str();
  };
  EXPECT_EQ(text(0.1), "0.1");
  EXPECT_EQ(text(1.0 / 3.0), "0.3333333333333333");
  EXPECT_EQ(text(2.0), "2.0");
  EXPECT_EQ(text(-0.5), "-0.5");
  EXPECT_EQ(text(1e300), "1e+300");
  EXPECT_EQ(text(5e-324), "5e-324");
  EXPECT_EQ(text(std::nan("")), "null");
  EXPECT_EQ(text(std::numeric_limits<double>::infinity()), "null");
  for (double v : {0.1, 1.0 / 3.0, 123456.789, 6.02214076e23, -1e-10}) {
    EXPECT_EQ(std::stod(text(v)), v) << text(v);
  }
}

TEST(JsonWriterTest, MisuseIsReportedNotWritten) {
  {
    JsonWriter w;  // Value in an object without a key.
    w.BeginObject().Int(1);
    EXPECT_FALSE(w.ok());
  }
  {
    JsonWriter w;  // Key in an array.
    w.BeginArray().Key("k");
    EXPECT_FALSE(w.ok());
  }
  {
    JsonWriter w;  // Mismatched end.
    w.BeginArray().EndObject();
    EXPECT_FALSE(w.ok());
  }
  {
    JsonWriter w;  // Key without a value before the end.
    w.BeginObject().Key("k").EndObject();
    EXPECT_FALSE(w.ok());
  }
  {
    JsonWriter w;  // Two keys in a row.
    w.BeginObject().Key("a").Key("b");
    EXPECT_FALSE(w.ok());
  }
  {
    JsonWriter w;  // Two top-level values.
    w.Int(1).Int(2);
    EXPECT_FALSE(w.ok());
    EXPECT_EQ(w.str(), "1");
  }
  {
    JsonWriter w;  // Unclosed: fine so far, but not complete.
    w.BeginArray().Int(1);
    EXPECT_TRUE(w.ok());
    EXPECT_FALSE(w.complete());
  }
  {
    JsonWriter w;
    EXPECT_FALSE(w.complete());
    w.EndArray();
    EXPECT_FALSE(w.ok());
  }
}

}  // namespace
}  // namespace shardcoord
