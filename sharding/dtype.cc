#include "sharding/dtype.h"

#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace shardcoord {
namespace {

constexpr DType kAll[] = {
    DType::kF32, DType::kF64,    DType::kF16,    DType::kBF16,   DType::kI8,  DType::kU8,
    DType::kI32, DType::kI64,    DType::kBool,   DType::kI16,    DType::kU16, DType::kU32,
    DType::kU64, DType::kF8E4M3, DType::kF8E5M2, DType::kF8E8M0,
};

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

std::string DTypeName(DType dtype) {
  switch (dtype) {
    case DType::kF32:
      return "f32";
    case DType::kF64:
      return "f64";
    case DType::kF16:
      return "f16";
    case DType::kBF16:
      return "bf16";
    case DType::kI8:
      return "i8";
    case DType::kU8:
      return "u8";
    case DType::kI32:
      return "i32";
    case DType::kI64:
      return "i64";
    case DType::kBool:
      return "bool";
    case DType::kI16:
      return "i16";
    case DType::kU16:
      return "u16";
    case DType::kU32:
      return "u32";
    case DType::kU64:
      return "u64";
    case DType::kF8E4M3:
      return "f8_e4m3";
    case DType::kF8E5M2:
      return "f8_e5m2";
    case DType::kF8E8M0:
      return "f8_e8m0";
  }
  return "unknown";
}

std::string DTypeNameList() {
  return absl::StrJoin(kAll, ", ", [](std::string* out, DType d) { out->append(DTypeName(d)); });
}

absl::StatusOr<DType> ParseDType(absl::string_view name) {
  const std::string n = absl::AsciiStrToLower(name);
  for (DType d : kAll) {
    if (n == DTypeName(d)) return d;
  }
  struct Alias {
    const char* name;
    DType dtype;
  };
  static constexpr Alias kAliases[] = {
      {"float32", DType::kF32},        {"float", DType::kF32},
      {"float64", DType::kF64},        {"double", DType::kF64},
      {"float16", DType::kF16},        {"half", DType::kF16},
      {"bfloat16", DType::kBF16},      {"int8", DType::kI8},
      {"uint8", DType::kU8},           {"int32", DType::kI32},
      {"int64", DType::kI64},          {"int16", DType::kI16},
      {"uint16", DType::kU16},         {"uint32", DType::kU32},
      {"uint64", DType::kU64},         {"bool_", DType::kBool},
      {"f8_e4m3fn", DType::kF8E4M3},   {"float8_e4m3fn", DType::kF8E4M3},
      {"float8_e4m3", DType::kF8E4M3}, {"e4m3", DType::kF8E4M3},
      {"float8_e5m2", DType::kF8E5M2}, {"e5m2", DType::kF8E5M2},
      {"f8_e8m0fnu", DType::kF8E8M0},  {"float8_e8m0fnu", DType::kF8E8M0},
      {"float8_e8m0", DType::kF8E8M0}, {"e8m0", DType::kF8E8M0},
  };
  for (const Alias& a : kAliases) {
    if (n == a.name) return a.dtype;
  }
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
