#ifndef SHARDCOORD_SHARDING_FILL_H_
#define SHARDCOORD_SHARDING_FILL_H_

#include <cstdint>

#include "absl/status/status.h"
#include "sharding/box.h"
#include "sharding/dtype.h"
#include "sharding/float16.h"

namespace shardcoord {

// How a new tensor is initialised. Every value is a function of the element's flat index in
// the whole tensor, so any rank can fill its chunks without communication and any client can
// check a downloaded tensor without holding a copy.
enum class FillKind : int { kZeros = 1, kArange = 2, kRandom = 3 };

// The value of element `flat_index` as a double: 0; the index; uniform in [0, 1) from
// splitmix64(seed, index) with 24 random bits (exact in f32, f16 rounds it).
double FillValue(FillKind kind, uint64_t seed, int64_t flat_index);

// Writes the values of `box` of a tensor of `global_shape` row-major into `out`
// (box.Volume() elements of `dtype`). Values are converted as static_cast does (f16 and
// bf16 round to nearest even).
absl::Status FillBox(FillKind kind, uint64_t seed, const Shape& global_shape, const Box& box,
                     DType dtype, void* out);

// Reads element `i` of a buffer of `dtype` as a double (for checks and reductions).
double LoadAsDouble(const void* data, DType dtype, int64_t i);
// Writes `v` converted to `dtype` into element `i`.
void StoreFromDouble(void* data, DType dtype, int64_t i, double v);

}  // namespace shardcoord

#endif  // SHARDCOORD_SHARDING_FILL_H_
