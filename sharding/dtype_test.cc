#include "sharding/dtype.h"

#include <set>
#include <string>

#include "gtest/gtest.h"

namespace shardcoord {
namespace {

TEST(DTypeTest, NamesSizesAndParseOfEveryDType) {
  struct Want {
    DType dtype;
    const char* name;
    int64_t size;
    const char* alias;
  };
  const Want want[] = {
      {DType::kF32, "f32", 4, "float32"},
      {DType::kF64, "f64", 8, "double"},
      {DType::kF16, "f16", 2, "half"},
      {DType::kBF16, "bf16", 2, "bfloat16"},
      {DType::kI8, "i8", 1, "int8"},
      {DType::kU8, "u8", 1, "uint8"},
      {DType::kI32, "i32", 4, "int32"},
      {DType::kI64, "i64", 8, "int64"},
      {DType::kBool, "bool", 1, "BOOL"},
      {DType::kI16, "i16", 2, "int16"},
      {DType::kU16, "u16", 2, "uint16"},
      {DType::kU32, "u32", 4, "uint32"},
      {DType::kU64, "u64", 8, "uint64"},
      {DType::kF8E4M3, "f8_e4m3", 1, "float8_e4m3fn"},
      {DType::kF8E5M2, "f8_e5m2", 1, "F8_E5M2"},
      {DType::kF8E8M0, "f8_e8m0", 1, "float8_e8m0fnu"},
  };
  ASSERT_EQ(AllDTypes().size(), sizeof(want) / sizeof(want[0]));
  std::set<std::string> names;
  for (size_t i = 0; i < AllDTypes().size(); ++i) {
    const Want& w = want[i];
    EXPECT_EQ(AllDTypes()[i], w.dtype);
    EXPECT_EQ(DTypeName(w.dtype), w.name);
    EXPECT_EQ(ElementSize(w.dtype), w.size) << w.name;
    EXPECT_EQ(*ParseDType(w.name), w.dtype);
    EXPECT_EQ(*ParseDType(w.alias), w.dtype) << w.alias;
    EXPECT_NE(DTypeNameList().find(w.name), std::string::npos) << w.name;
    names.insert(w.name);
  }
  EXPECT_EQ(names.size(), AllDTypes().size());
  EXPECT_EQ(*ParseDType("F8_E4M3"), DType::kF8E4M3);  // The safetensors spelling.
  EXPECT_EQ(ElementSize(static_cast<DType>(99)), 0);
  EXPECT_EQ(DTypeName(static_cast<DType>(99)), "unknown");
}

TEST(DTypeTest, ParseRefusesUnknownNamesListingEveryDType) {
  absl::StatusOr<DType> d = ParseDType("f8");
  ASSERT_EQ(d.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(d.status().message().find("'f8'"), std::string::npos);
  EXPECT_NE(d.status().message().find("f8_e8m0"), std::string::npos);
  EXPECT_NE(d.status().message().find("bool"), std::string::npos);
}

TEST(DTypeTest, FloatsAndPartial) {
  const std::set<DType> floats = {DType::kF32,    DType::kF64,    DType::kF16,   DType::kBF16,
                                  DType::kF8E4M3, DType::kF8E5M2, DType::kF8E8M0};
  const std::set<DType> partial = {DType::kF32, DType::kF64, DType::kF16, DType::kBF16,
                                   DType::kI8,  DType::kU8,  DType::kI32, DType::kU32,
                                   DType::kI64, DType::kU64};
  for (DType d : AllDTypes()) {
    EXPECT_EQ(IsFloat(d), floats.count(d) > 0) << DTypeName(d);
    EXPECT_EQ(PartialAllowed(d), partial.count(d) > 0) << DTypeName(d);
    EXPECT_TRUE(CheckPartialDType(d, false, "S(0)", "spec").ok());
    absl::Status s = CheckPartialDType(d, true, "P(sum)", "spec");
    EXPECT_EQ(s.ok(), partial.count(d) > 0) << DTypeName(d);
    if (!s.ok()) {
      EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
      EXPECT_NE(s.message().find("spec: dtype " + DTypeName(d)), std::string::npos) << s;
      EXPECT_NE(s.message().find("P(sum)"), std::string::npos) << s;
    }
  }
}

}  // namespace
}  // namespace shardcoord
