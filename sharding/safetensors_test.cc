#include "sharding/safetensors.h"

#include <string>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace shardcoord {
namespace {

using ::testing::HasSubstr;

// A header as the reference implementation writes it for {"a": f32[2, 3], "b": bf16[4]}.
std::string Prefix(const std::string& json) {
  std::string out(8, '\0');
  for (int i = 0; i < 8; ++i) out[i] = static_cast<char>((json.size() >> (8 * i)) & 0xFF);
  return out + json;
}

TEST(SafetensorsTest, BuildThenParse) {
  SafetensorsHeader laid;
  absl::StatusOr<std::string> bytes = BuildSafetensorsHeader(
      {{"a", DType::kF32, {2, 3}}, {"b", DType::kBF16, {4}}, {"s", DType::kI64, {}}},
      {{"format", "pt"}}, &laid);
  ASSERT_TRUE(bytes.ok()) << bytes.status();
  EXPECT_EQ(bytes->size() % 8, 0u);  // The data starts 8-byte aligned.
  absl::StatusOr<int64_t> n = ParseSafetensorsPrefix(bytes->substr(0, 8));
  ASSERT_TRUE(n.ok());
  EXPECT_EQ(*n + 8, static_cast<int64_t>(bytes->size()));
  absl::StatusOr<SafetensorsHeader> h =
      ParseSafetensorsHeader(bytes->substr(8), static_cast<int64_t>(bytes->size()) + 24 + 8 + 8);
  ASSERT_TRUE(h.ok()) << h.status();
  ASSERT_EQ(h->entries.size(), 3u);
  EXPECT_EQ(h->entries[0].name, "a");
  EXPECT_EQ(h->entries[0].dtype, DType::kF32);
  EXPECT_EQ(h->entries[0].shape, (Shape{2, 3}));
  EXPECT_EQ(h->entries[1].begin, 24);
  EXPECT_EQ(h->entries[1].end, 32);
  EXPECT_EQ(h->entries[2].shape, Shape{});
  EXPECT_EQ(h->entries[2].bytes(), 8);
  EXPECT_EQ(h->data_bytes, 40);
  EXPECT_EQ(h->metadata.size(), 1u);
  EXPECT_EQ(h->data_start(), laid.data_start());
  EXPECT_EQ(h->Find("b")->dtype_name, "BF16");
}

TEST(SafetensorsTest, ReadsEveryDtypeAndKeyOrder) {
  // Keys in any order, entries listed out of data order.
  const std::string json = R"({"z":{"dtype":"BOOL","shape":[3],"data_offsets":[8,11]},)"
                           R"("y":{"dtype":"I64","shape":[1],"data_offsets":[0,8]}})";
  absl::StatusOr<SafetensorsHeader> h = ParseSafetensorsHeader(json, 8 + json.size() + 11);
  ASSERT_TRUE(h.ok()) << h.status();
  EXPECT_EQ(h->entries[0].name, "y");
  EXPECT_EQ(h->entries[1].dtype, DType::kBool);
  EXPECT_EQ(h->entries[1].element_size, 1);
}

TEST(SafetensorsTest, EveryDTypeHasItsSafetensorsName) {
  const std::pair<DType, const char*> names[] = {
      {DType::kF32, "F32"},        {DType::kF64, "F64"},        {DType::kF16, "F16"},
      {DType::kBF16, "BF16"},      {DType::kI8, "I8"},          {DType::kU8, "U8"},
      {DType::kI32, "I32"},        {DType::kI64, "I64"},        {DType::kBool, "BOOL"},
      {DType::kI16, "I16"},        {DType::kU16, "U16"},        {DType::kU32, "U32"},
      {DType::kU64, "U64"},        {DType::kF8E4M3, "F8_E4M3"}, {DType::kF8E5M2, "F8_E5M2"},
      {DType::kF8E8M0, "F8_E8M0"},
  };
  ASSERT_EQ(sizeof(names) / sizeof(names[0]), AllDTypes().size());
  for (const auto& [dtype, name] : names) {
    EXPECT_EQ(SafetensorsDTypeName(dtype), name);
    EXPECT_EQ(*DTypeFromSafetensors(name), dtype);
    const std::string json =
        absl::StrCat(R"({"t":{"dtype":")", name, R"(","shape":[2],"data_offsets":[0,)",
                     2 * ElementSize(dtype), "]}}");
    absl::StatusOr<SafetensorsHeader> h =
        ParseSafetensorsHeader(json, 8 + json.size() + 2 * ElementSize(dtype));
    ASSERT_TRUE(h.ok()) << name << ": " << h.status();
    EXPECT_EQ(h->entries[0].dtype, dtype);
  }
  EXPECT_EQ(DTypeFromSafetensors("F4").status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(SafetensorsTest, RefusesBrokenHeaders) {
  struct Case {
    std::string json;
    std::string error;
  };
  const Case cases[] = {
      {R"([1])", "expected an object"},
      {R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,4]}})", "needs 8"},
      {R"({"a":{"dtype":"F33","shape":[1],"data_offsets":[0,4]}})", "unknown dtype"},
      {R"({"a":{"dtype":"F32","shape":[-1],"data_offsets":[0,4]}})", "negative"},
      {R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})", "tile"},
      {R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},"b":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}})",
       "tile"},
      {R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0]}})", "data_offsets"},
      {R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4],"x":1}})", "unknown field"},
      {R"({"__metadata__":{"k":1}})", "not a string"},
      {R"({"a":{"dtype":"F32","shape":[4611686018427387904,4],"data_offsets":[0,4]}})",
       "too many bytes"},
  };
  for (const Case& c : cases) {
    absl::StatusOr<SafetensorsHeader> h = ParseSafetensorsHeader(c.json);
    ASSERT_FALSE(h.ok()) << c.json;
    EXPECT_THAT(h.status().message(), HasSubstr(c.error)) << c.json;
  }
}

TEST(SafetensorsTest, ChecksTheFileSize) {
  const std::string json = R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})";
  const int64_t whole = 8 + static_cast<int64_t>(json.size()) + 8;
  EXPECT_TRUE(ParseSafetensorsHeader(json, whole).ok());
  absl::StatusOr<SafetensorsHeader> cut = ParseSafetensorsHeader(json, whole - 1);
  ASSERT_FALSE(cut.ok());
  EXPECT_THAT(cut.status().message(), HasSubstr("truncated"));
  EXPECT_THAT(ParseSafetensorsHeader(json, whole + 3).status().message(),
              HasSubstr("trailing data"));
}

TEST(SafetensorsTest, PrefixBounds) {
  EXPECT_FALSE(ParseSafetensorsPrefix("1234567").ok());
  EXPECT_FALSE(ParseSafetensorsPrefix(std::string(8, '\0')).ok());
  EXPECT_FALSE(ParseSafetensorsPrefix(std::string(8, '\xff')).ok());
  EXPECT_EQ(*ParseSafetensorsPrefix(Prefix("{}")), 2);
}

TEST(SafetensorsTest, BuildRefusesDuplicateAndReservedNames) {
  EXPECT_FALSE(BuildSafetensorsHeader({{"a", DType::kF32, {1}}, {"a", DType::kF32, {1}}}).ok());
  EXPECT_FALSE(BuildSafetensorsHeader({{"__metadata__", DType::kF32, {1}}}).ok());
}

}  // namespace
}  // namespace shardcoord
