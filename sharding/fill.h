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

// The splitmix64 finalizer: a well-mixed 64-bit hash of `x` (FillValue's random values, and
// the reference executor's test values).
uint64_t SplitMix64(uint64_t x);

// The value of element `flat_index` as a double: 0; the index; uniform in [0, 1) from
// splitmix64(seed, index) with 24 random bits (exact in f32, f16 rounds it).
double FillValue(FillKind kind, uint64_t seed, int64_t flat_index);

// Writes the values of `box` of a tensor of `global_shape` row-major into `out`
// (box.Volume() elements of `dtype`), each converted with StoreFromDouble.
absl::Status FillBox(FillKind kind, uint64_t seed, const Shape& global_shape, const Box& box,
                     DType dtype, void* out);

// Reads element `i` of a buffer of `dtype` as a double (for checks and reductions): floats
// exactly (NaN for NaNs), bool as 0 or 1, integers as static_cast does.
double LoadAsDouble(const void* data, DType dtype, int64_t i);
// Writes `v` converted to `dtype` into element `i`. How each dtype takes a fill value:
// - f32 as static_cast<float> (to nearest even); f64 as is;
// - f16, bf16, f8_e4m3 and f8_e5m2 by the cast rules of sharding/cast.h (to nearest even,
//   rounded once from the double; f8_e4m3 saturates at +-448, f8_e5m2 at +-57344: arange
//   past them gives the largest finite value);
// - f8_e8m0 (powers of two, no zero): the power of two nearest v (ties up), clamped to
//   [2^-127, 2^127]; 0 and negative values give 2^-127 (byte 0x00), so zeros fill 0x00 bytes,
//   arange 0, 1, 2, 3, 4, 5, 6 gives 2^-127, 1, 2, 4, 4, 4, 8, and random values (in [0, 1))
//   powers of two up to 1; NaN gives 0xFF;
// - bool: v != 0 (arange: false then true; random: true but where the value is 0);
// - integers wrap as the C++ conversion of the int64 value does (arange past 127 in i8).
void StoreFromDouble(void* data, DType dtype, int64_t i, double v);

// The f8_e8m0 byte StoreFromDouble writes for `v`.
uint8_t E8M0FromDouble(double v);

}  // namespace shardcoord

#endif  // SHARDCOORD_SHARDING_FILL_H_
