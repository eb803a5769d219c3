#ifndef SHARDCOORD_SHARDING_DTYPE_H_
#define SHARDCOORD_SHARDING_DTYPE_H_

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace shardcoord {

// Element types a tensor can have. Values match shardcoord.v1.DType on the wire.
enum class DType : int {
  kF32 = 1,
  kF64 = 2,
  kF16 = 3,
  kBF16 = 4,
  kI8 = 5,
  kU8 = 6,
  kI32 = 7,
  kI64 = 8,
};

// Size of one element in bytes.
int64_t ElementSize(DType dtype);

// "f32", "bf16", ...
std::string DTypeName(DType dtype);

// Accepts the names DTypeName prints plus common aliases ("float32", "float", "int64", ...).
absl::StatusOr<DType> ParseDType(absl::string_view name);

}  // namespace shardcoord

#endif  // SHARDCOORD_SHARDING_DTYPE_H_
