#include "sharding/float16.h"

#include <cstring>

#include "sharding/cast_bits.h"

namespace shardcoord {
namespace {

uint32_t FloatBits(float f) {
  uint32_t x;
  std::memcpy(&x, &f, 4);
  return x;
}

float BitsFloat(uint32_t x) {
  float f;
  std::memcpy(&f, &x, 4);
  return f;
}

}  // namespace

float HalfToFloat(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000) << 16;
  const uint32_t exp = (h >> 10) & 0x1F;
  uint32_t mant = h & 0x3FF;
  if (exp == 0x1F) return BitsFloat(sign | 0x7F800000 | (mant << 13));  // Inf or NaN.
  if (exp == 0) {
    if (mant == 0) return BitsFloat(sign);
    // Subnormal: normalise mant * 2^-24 into float's exponent range.
    uint32_t e = 113;  // Float bias 127 - half's subnormal exponent 14.
    while ((mant & 0x400) == 0) {
      mant <<= 1;
      --e;
    }
    return BitsFloat(sign | (e << 23) | ((mant & 0x3FF) << 13));
  }
  return BitsFloat(sign | ((exp + 112) << 23) | (mant << 13));
}

// The conversions to 16 bits are cast_bits.h's, the ones casts and the GPU kernels use.
uint16_t FloatToHalf(float f) { return cast_bits::F32ToF16(FloatBits(f)); }

float BFloat16ToFloat(uint16_t b) { return BitsFloat(static_cast<uint32_t>(b) << 16); }

uint16_t FloatToBFloat16(float f) { return cast_bits::F32ToBF16(FloatBits(f)); }

}  // namespace shardcoord
