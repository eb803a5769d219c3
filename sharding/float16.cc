#include "sharding/float16.h"

#include <cstring>

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

uint16_t FloatToHalf(float f) {
  const uint32_t x = FloatBits(f);
  const uint16_t sign = static_cast<uint16_t>((x >> 16) & 0x8000);
  const uint32_t absx = x & 0x7FFFFFFF;
  if (absx >= 0x7F800000) {  // Inf or NaN; NaN keeps its top payload bits and is quieted.
    if (absx == 0x7F800000) return sign | 0x7C00;
    return static_cast<uint16_t>(sign | 0x7E00 | ((absx >> 13) & 0x3FF));
  }
  // 65520 is halfway between the largest half (65504) and 65536; the tie goes to even, which
  // is the infinity encoding.
  if (absx >= 0x477FF000) return sign | 0x7C00;
  if (absx < 0x38800000) {  // Below the smallest normal half, 2^-14.
    // Values up to 2^-25 (half the smallest subnormal) round to zero, the tie included.
    if (absx <= 0x33000000) return sign;
    const uint32_t e = absx >> 23;
    const uint32_t m = (absx & 0x7FFFFF) | 0x800000;
    const uint32_t shift = 126 - e;  // Value in units of 2^-24 is m >> shift.
    uint32_t r = m >> shift;
    const uint32_t rem = m & ((1u << shift) - 1);
    const uint32_t half = 1u << (shift - 1);
    if (rem > half || (rem == half && (r & 1))) ++r;  // May carry into the smallest normal.
    return static_cast<uint16_t>(sign | r);
  }
  uint32_t r = ((absx >> 23) - 112) << 10 | ((absx >> 13) & 0x3FF);
  const uint32_t rem = absx & 0x1FFF;
  if (rem > 0x1000 || (rem == 0x1000 && (r & 1))) ++r;  // A carry bumps the exponent.
  return static_cast<uint16_t>(sign | r);
}

float BFloat16ToFloat(uint16_t b) { return BitsFloat(static_cast<uint32_t>(b) << 16); }

uint16_t FloatToBFloat16(float f) {
  const uint32_t x = FloatBits(f);
  if ((x & 0x7FFFFFFF) > 0x7F800000) return static_cast<uint16_t>((x >> 16) | 0x40);  // NaN.
  // Round to nearest even: add just under half an ulp, plus one if the kept part is odd.
  const uint32_t rounded = x + 0x7FFF + ((x >> 16) & 1);
  return static_cast<uint16_t>(rounded >> 16);
}

}  // namespace shardcoord
