#ifndef SHARDCOORD_SHARDING_DTYPE_H_
#define SHARDCOORD_SHARDING_DTYPE_H_

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"

namespace shardcoord {

// Element types a tensor can have: every dtype of the safetensors format. Values match
// shardcoord.v1.DType on the wire.
//
// - kBool: one byte, 0 (false) or 1 (true).
// - kF8E4M3: float8 e4m3fn (OCP FP8, the weights of DeepSeek-V3 and Kimi-K2): 1 sign, 4
//   exponent (bias 7), 3 mantissa bits; no infinity, NaN is S.1111.111 only; largest 448.
// - kF8E5M2: float8 e5m2, IEEE-like: 1 sign, 5 exponent (bias 15), 2 mantissa bits;
//   infinities and NaNs as in IEEE; largest finite 57344.
// - kF8E8M0: float8 e8m0fnu (the OCP MX block scale): 8 exponent bits (bias 127), no sign and
//   no mantissa: byte e is 2^(e-127), 0xFF is NaN; there is no zero.
enum class DType : int {
  kF32 = 1,
  kF64 = 2,
  kF16 = 3,
  kBF16 = 4,
  kI8 = 5,
  kU8 = 6,
  kI32 = 7,
  kI64 = 8,
  kBool = 9,
  kI16 = 10,
  kU16 = 11,
  kU32 = 12,
  kU64 = 13,
  kF8E4M3 = 14,
  kF8E5M2 = 15,
  kF8E8M0 = 16,
};

// Every dtype, in enum order.
absl::Span<const DType> AllDTypes();

// Size of one element in bytes; 0 for a value outside the enum.
int64_t ElementSize(DType dtype);

// "f32", "bf16", "f8_e4m3", ...; "unknown" for a value outside the enum.
std::string DTypeName(DType dtype);

// Accepts the names DTypeName prints, the safetensors names ("F8_E4M3", "BOOL", ...) and
// common aliases ("float32", "float", "int64", "float8_e4m3fn", ...), in any case.
absl::StatusOr<DType> ParseDType(absl::string_view name);

// Every name DTypeName prints, comma-separated, for help texts and errors.
std::string DTypeNameList();

// Floating-point dtypes (f64 f32 bf16 f16 and the three float8s).
bool IsFloat(DType dtype);

// Whether a tensor of `dtype` may have a Partial placement: its value is a reduction (sum,
// avg, min, max) of its contributions, which every backend must compute, NCCL included.
// True for f32 f64 f16 bf16 i8 u8 i32 u32 i64 u64; false for bool, i16 and u16 (NCCL reduces
// neither) and the float8s (NCCL has no reduction of e4m3, e5m2 or e8m0 we could rely on,
// and sums of 3-bit mantissas are not worth defining).
bool PartialAllowed(DType dtype);

// INVALID_ARGUMENT naming `field`, the dtype and the placement when `partial` and the dtype
// may not be Partial: "spec: dtype f8_e4m3 cannot be Partial (placement P(sum)) ...".
absl::Status CheckPartialDType(DType dtype, bool partial, absl::string_view placement,
                               absl::string_view field);

}  // namespace shardcoord

#endif  // SHARDCOORD_SHARDING_DTYPE_H_
