#ifndef SHARDCOORD_SHARDING_FAST_CAST_H_
#define SHARDCOORD_SHARDING_FAST_CAST_H_

// Host-only fast forms of cast_bits.h's element conversions for the hot pairs of Cast
// (cast.cc) and block quantization (block_quant.cc). cast_bits.h stays the definition of the
// rules (and what the CUDA kernels compile); everything here must give exactly its results
// for every input, which cast_test checks: every pattern of every 8- and 16-bit source, and
// for f32 -> f8_e4m3, f8_e5m2, f16 and bf16 every rounding boundary of every exponent plus a
// dense sweep of the 2^32 patterns (all of them with SHARDCOORD_CAST_SWEEP_STRIDE=1).
//
// - 8-bit sources: 256-entry tables filled once from cast_bits::CastElement.
// - f32 -> bf16: cast_bits::F32ToBF16 (integer round to nearest even, NaN quieted).
// - f32 -> f8_e4m3, f8_e5m2, f16: F32ToNarrow below, branch-free integer code (no
//   floating-point arithmetic, so no dependence on the rounding mode or FTZ/DAZ).

#include <cstdint>
#include <cstring>

#include "sharding/cast_bits.h"

namespace shardcoord {
namespace fast_cast {

// f32 bits -> a binary float of kExp exponent and kMan mantissa bits (bias 2^(kExp-1) - 1),
// kExp + kMan + 1 <= 16, as cast_bits::ConvertFloat from f32 does: round to nearest, ties to
// even, subnormals included; kFn: e4m3fn (no infinities, one NaN S.1..1, infinities and
// overflow saturate); kSaturate: finite overflow gives the largest finite (infinities stay);
// otherwise overflow gives infinity. NaN: sign kept, quiet, the top payload bits.
template <int kExp, int kMan, bool kFn, bool kSaturate>
inline uint32_t F32ToNarrow(uint32_t x) {
  constexpr int kBias = (1 << (kExp - 1)) - 1;
  constexpr uint32_t kExpAll = (1u << kExp) - 1;
  constexpr uint32_t kManAll = (1u << kMan) - 1;
  constexpr uint32_t kInf = kExpAll << kMan;
  constexpr uint32_t kMax =
      kFn ? (kExpAll << kMan) | (kManAll - 1) : ((kExpAll - 1) << kMan) | kManAll;
  constexpr uint32_t kLimit = kFn || kSaturate ? kMax : kInf;
  constexpr uint32_t kNaN = kFn ? kInf | kManAll : kInf | (1u << (kMan - 1));
  constexpr int kShift = 23 - kMan;  // Mantissa bits dropped from a normal f32.
  constexpr uint32_t kRebias = static_cast<uint32_t>(127 - kBias) << 23;
  constexpr uint32_t kMinNormal = static_cast<uint32_t>(127 - kBias + 1) << 23;  // 2^(1-bias)
  static_assert(kExp + kMan + 1 <= 16 && kMan >= 1, "a narrower float");

  const uint32_t sign = (x & 0x80000000u) >> (31 - kExp - kMan);
  const uint32_t a = x & 0x7FFFFFFF;

  // Normal target: rebias the exponent in place and round the mantissa at bit kShift (to
  // nearest even: add just under half, plus one if the kept part is odd); a carry bumps the
  // exponent, and anything past the largest finite (infinity included) is clamped.
  uint32_t t = a - kRebias;
  t += ((1u << (kShift - 1)) - 1) + ((t >> kShift) & 1);
  uint32_t normal = t >> kShift;
  normal = normal < kLimit ? normal : kLimit;

  // Subnormal target (a < 2^(1-bias)): the value m * 2^(e-150) in units of the smallest
  // subnormal 2^(1-bias-kMan) is m >> (151 - bias - kMan - e), rounded to nearest even (a
  // carry may give the smallest normal, whose encoding is the next integer). Shifts past 31
  // round to zero as 31 does (m < 2^24); f32 subnormals (e = 0) all round to zero.
  const int32_t e = static_cast<int32_t>(a >> 23);
  int32_t sh = 151 - kBias - kMan - e;
  sh = sh < 1 ? 1 : (sh > 31 ? 31 : sh);  // Only a >= 2^(1-bias) gets below 1: not used.
  const uint32_t m = (a & 0x7FFFFF) | 0x800000;
  const uint32_t r = m >> sh;
  const uint32_t rem = m & ((1u << sh) - 1);
  const uint32_t half = 1u << (sh - 1);
  const uint32_t sub = r + ((rem > half) | ((rem == half) & r & 1));

  uint32_t mag = a < kMinNormal ? sub : normal;
  if (!kFn) mag = a == 0x7F800000 ? kInf : mag;
  const uint32_t nan = kFn ? kNaN : kNaN | ((a >> kShift) & kManAll);
  mag = a > 0x7F800000 ? nan : mag;
  return sign | mag;
}

inline uint8_t F32ToE4M3(uint32_t x) {
  return static_cast<uint8_t>(F32ToNarrow<4, 3, /*kFn=*/true, /*kSaturate=*/true>(x));
}
inline uint8_t F32ToE5M2(uint32_t x) {
  return static_cast<uint8_t>(F32ToNarrow<5, 2, /*kFn=*/false, /*kSaturate=*/true>(x));
}
inline uint16_t F32ToF16(uint32_t x) {
  return static_cast<uint16_t>(F32ToNarrow<5, 10, /*kFn=*/false, /*kSaturate=*/false>(x));
}
inline uint16_t F32ToBF16(uint32_t x) { return cast_bits::F32ToBF16(x); }

// bf16 -> f32: the top half of the f32; a NaN is quieted (cast.h's rule) and keeps its payload.
inline uint32_t BF16ToF32(uint16_t b) {
  const uint32_t x = static_cast<uint32_t>(b) << 16;
  return (x & 0x7FFFFFFF) > 0x7F800000 ? x | 0x400000 : x;
}

inline uint32_t LoadU32(const unsigned char* p) {
  uint32_t v;
  std::memcpy(&v, p, 4);
  return v;
}

}  // namespace fast_cast
}  // namespace shardcoord

#endif  // SHARDCOORD_SHARDING_FAST_CAST_H_
