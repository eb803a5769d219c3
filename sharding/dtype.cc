#include "sharding/dtype.h"

#include <array>
#include <iterator>
#include <optional>

#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "sharding/enum_names.h"

namespace shardcoord {
namespace {

// Every dtype and its name, in the order AllDTypes and the list in errors give them.
constexpr EnumName<DType> kNames[] = {
    {DType::kF32, "f32"},        {DType::kF64, "f64"},        {DType::kF16, "f16"},
    {DType::kBF16, "bf16"},      {DType::kI8, "i8"},          {DType::kU8, "u8"},
    {DType::kI32, "i32"},        {DType::kI64, "i64"},        {DType::kBool, "bool"},
    {DType::kI16, "i16"},        {DType::kU16, "u16"},        {DType::kU32, "u32"},
    {DType::kU64, "u64"},        {DType::kF8E4M3, "f8_e4m3"}, {DType::kF8E5M2, "f8_e5m2"},
    {DType::kF8E8M0, "f8_e8m0"},
};

constexpr std::array<DType, std::size(kNames)> kAll = [] {
  std::array<DType, std::size(kNames)> all{};
  for (size_t i = 0; i < all.size(); ++i) all[i] = kNames[i].value;
  return all;
}();

}  // namespace

absl::Span<const DType> AllDTypes() { return kAll; }

int64_t ElementSize(DType dtype) {
  switch (dtype) {
    case DType::kF64:
    case DType::kI64:
    case DType::kU64:
      return 8;
    case DType::kF32:
    case DType::kI32:
    case DType::kU32:
      return 4;
    case DType::kF16:
    case DType::kBF16:
    case DType::kI16:
    case DType::kU16:
      return 2;
    case DType::kI8:
    case DType::kU8:
    case DType::kBool:
    case DType::kF8E4M3:
    case DType::kF8E5M2:
    case DType::kF8E8M0:
      return 1;
  }
  return 0;
}

std::string DTypeName(DType dtype) { return NameOf(kNames, dtype); }

std::string DTypeNameList() {
  return absl::StrJoin(kAll, ", ", [](std::string* out, DType d) { out->append(DTypeName(d)); });
}

absl::StatusOr<DType> ParseDType(absl::string_view name) {
  const std::string n = absl::AsciiStrToLower(name);
  if (std::optional<DType> d = ValueOf(kNames, n)) return *d;
  static constexpr EnumName<DType> kAliases[] = {
      {DType::kF32, "float32"},        {DType::kF32, "float"},
      {DType::kF64, "float64"},        {DType::kF64, "double"},
      {DType::kF16, "float16"},        {DType::kF16, "half"},
      {DType::kBF16, "bfloat16"},      {DType::kI8, "int8"},
      {DType::kU8, "uint8"},           {DType::kI32, "int32"},
      {DType::kI64, "int64"},          {DType::kI16, "int16"},
      {DType::kU16, "uint16"},         {DType::kU32, "uint32"},
      {DType::kU64, "uint64"},         {DType::kBool, "bool_"},
      {DType::kF8E4M3, "f8_e4m3fn"},   {DType::kF8E4M3, "float8_e4m3fn"},
      {DType::kF8E4M3, "float8_e4m3"}, {DType::kF8E4M3, "e4m3"},
      {DType::kF8E5M2, "float8_e5m2"}, {DType::kF8E5M2, "e5m2"},
      {DType::kF8E8M0, "f8_e8m0fnu"},  {DType::kF8E8M0, "float8_e8m0fnu"},
      {DType::kF8E8M0, "float8_e8m0"}, {DType::kF8E8M0, "e8m0"},
  };
  if (std::optional<DType> d = ValueOf(kAliases, n)) return *d;
  return absl::InvalidArgumentError(
      absl::StrCat("unknown dtype '", name, "' (want one of ", DTypeNameList(), ")"));
}

bool IsFloat(DType dtype) {
  switch (dtype) {
    case DType::kF32:
    case DType::kF64:
    case DType::kF16:
    case DType::kBF16:
    case DType::kF8E4M3:
    case DType::kF8E5M2:
    case DType::kF8E8M0:
      return true;
    default:
      return false;
  }
}

bool PartialAllowed(DType dtype) {
  switch (dtype) {
    case DType::kF32:
    case DType::kF64:
    case DType::kF16:
    case DType::kBF16:
    case DType::kI8:
    case DType::kU8:
    case DType::kI32:
    case DType::kU32:
    case DType::kI64:
    case DType::kU64:
      return true;
    default:
      return false;
  }
}

absl::Status CheckPartialDType(DType dtype, bool partial, absl::string_view placement,
                               absl::string_view field) {
  if (!partial || PartialAllowed(dtype)) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(
      field, ": dtype ", DTypeName(dtype), " cannot be Partial (placement ", placement,
      "): its contributions would need a reduction, which only f32, f64, f16, bf16, i8, u8, "
      "i32, u32, i64 and u64 have"));
}

}  // namespace shardcoord
