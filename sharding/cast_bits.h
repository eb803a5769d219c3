#ifndef SHARDCOORD_SHARDING_CAST_BITS_H_
#define SHARDCOORD_SHARDING_CAST_BITS_H_

// The element conversions of sharding/cast.h and the per-element steps of
// sharding/block_quant.h as inline functions on bit patterns, shared by the host code
// (cast.cc, block_quant.cc, float16.cc) and the CUDA kernels (worker/comm/nccl/kernels.cu):
// nvcc compiles them for both sides, so the kernels are bitwise equal to the host by
// construction, and cast_test's exhaustive checks of the host cover the device's code too.
// Plain C++ with no CUDA or Abseil includes; dtypes are passed as their DType values (Code).

#include <cstdint>
#include <cstring>

#if defined(__CUDACC__)
#define SC_CAST_HD __host__ __device__
#else
#define SC_CAST_HD
#endif

namespace shardcoord {
namespace cast_bits {

// shardcoord::DType's values (static_asserts in cast.cc).
enum Code : int {
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

SC_CAST_HD inline int ElementBytes(int code) {
  switch (code) {
    case kF64:
    case kI64:
    case kU64:
      return 8;
    case kF32:
    case kI32:
    case kU32:
      return 4;
    case kF16:
    case kBF16:
    case kI16:
    case kU16:
      return 2;
    case kI8:
    case kU8:
    case kBool:
    case kF8E4M3:
    case kF8E5M2:
    case kF8E8M0:
      return 1;
    default:
      return 0;
  }
}

SC_CAST_HD inline bool IsFloatCode(int code) {
  return code == kF32 || code == kF64 || code == kF16 || code == kBF16 || code == kF8E4M3 ||
         code == kF8E5M2 || code == kF8E8M0;
}

SC_CAST_HD inline bool IsSignedCode(int code) {
  return code == kI8 || code == kI16 || code == kI32 || code == kI64;
}

// ---------------------------------------------------------------------------------------
// Float formats, and exact conversion through the bits of a double (which holds every value
// of every other format exactly). Bit manipulation only: no floating-point arithmetic, so the
// result depends on neither the FPU's rounding mode nor its NaN handling, host or device.

enum Kind : int {
  kIeee = 0,  // Infinities and NaNs at the all-ones exponent.
  kFn = 1,    // e4m3fn: no infinities; S.1111.111 is the only NaN.
  kE8M0 = 2,  // Exponent only, unsigned; 0xFF is NaN.
};

struct Format {
  int exp_bits;
  int man_bits;
  int bias;
  int kind;
  bool saturate;  // Finite overflow gives the largest finite value, not infinity.
};

// The format of float dtype `code`; exp_bits 0 for any other dtype. By value (no tables), so
// device code can call it.
SC_CAST_HD inline Format FormatOf(int code) {
  switch (code) {
    case kF64:
      return Format{11, 52, 1023, kIeee, false};
    case kF32:
      return Format{8, 23, 127, kIeee, false};
    case kF16:
      return Format{5, 10, 15, kIeee, false};
    case kBF16:
      return Format{8, 7, 127, kIeee, false};
    case kF8E4M3:
      return Format{4, 3, 7, kFn, true};
    case kF8E5M2:
      return Format{5, 2, 15, kIeee, true};
    case kF8E8M0:
      return Format{8, 0, 127, kE8M0, false};
    default:
      return Format{0, 0, 0, kIeee, false};
  }
}

// Leading zeros of a nonzero x.
SC_CAST_HD inline int Clz64(uint64_t x) {
#if defined(__CUDA_ARCH__)
  return __clzll(static_cast<long long>(x));  // NOLINT(runtime/int): CUDA's signature.
#else
  return __builtin_clzll(x);
#endif
}

constexpr uint64_t kDoubleExpMask = uint64_t{0x7FF} << 52;
constexpr uint64_t kDoubleManMask = (uint64_t{1} << 52) - 1;
constexpr uint64_t kDoubleQuietNaN = kDoubleExpMask | (uint64_t{1} << 51);

// The bits of the double equal to `bits` of format `f`.
SC_CAST_HD inline uint64_t DecodeToDouble(uint64_t bits, const Format& f) {
  if (f.man_bits == 52) return bits;  // f64: its subnormals have no normal form to take.
  if (f.kind == kE8M0) {
    const uint64_t e = bits & 0xFF;
    if (e == 0xFF) return kDoubleQuietNaN;
    return (e - 127 + 1023) << 52;  // 2^(e-127): always a normal double.
  }
  const int m = f.man_bits;
  const uint64_t exp_all = (uint64_t{1} << f.exp_bits) - 1;
  const uint64_t sign = (bits >> (f.exp_bits + m)) & 1;
  const uint64_t exp = (bits >> m) & exp_all;
  const uint64_t man = bits & ((uint64_t{1} << m) - 1);
  const uint64_t s = sign << 63;
  const bool nan = f.kind == kIeee ? exp == exp_all && man != 0
                                   : exp == exp_all && man == (uint64_t{1} << m) - 1;
  if (nan) return s | kDoubleExpMask | (man << (52 - m));
  if (f.kind == kIeee && exp == exp_all) return s | kDoubleExpMask;  // Infinity.
  if (exp == 0) {
    if (man == 0) return s;
    // man * 2^(1 - bias - m): normalise so that the leading 1 becomes the implicit bit.
    const int lead = 63 - Clz64(man);  // Position of the leading 1.
    const int64_t e = static_cast<int64_t>(lead) + 1 - f.bias - m;
    const uint64_t frac = (man << (52 - lead)) & kDoubleManMask;
    return s | (static_cast<uint64_t>(e + 1023) << 52) | frac;
  }
  return s | ((exp - f.bias + 1023) << 52) | (man << (52 - m));
}

// `d` (the bits of a double) rounded to format `f` (not e8m0) by the rules of cast.h.
SC_CAST_HD inline uint64_t EncodeFromDouble(uint64_t d, const Format& f) {
  const int m = f.man_bits;
  const uint64_t exp_all = (uint64_t{1} << f.exp_bits) - 1;
  const uint64_t sign = (d >> 63) << (f.exp_bits + m);
  const uint64_t a = d & ~(uint64_t{1} << 63);
  const uint64_t man_all = (uint64_t{1} << m) - 1;
  const uint64_t inf_bits = exp_all << m;
  const uint64_t max_bits =
      f.kind == kFn ? (exp_all << m) | (man_all - 1) : ((exp_all - 1) << m) | man_all;
  if (a > kDoubleExpMask) {  // NaN.
    if (f.kind == kFn) return sign | inf_bits | man_all;
    const uint64_t payload = (a & kDoubleManMask) >> (52 - m);
    return sign | inf_bits | (uint64_t{1} << (m - 1)) | payload;
  }
  if (a == kDoubleExpMask) return sign | (f.kind == kFn ? max_bits : inf_bits);
  if (a == 0) return sign;
  const uint64_t de = a >> 52;
  const uint64_t sig =
      de == 0 ? (a & kDoubleManMask) : ((a & kDoubleManMask) | (uint64_t{1} << 52));
  const int64_t e2 = de == 0 ? -1074 : static_cast<int64_t>(de) - 1075;  // value = sig * 2^e2
  const int64_t ev = (63 - Clz64(sig)) + e2;                             // floor(log2(value))
  const int64_t emin = 1 - f.bias;
  const int64_t qexp = (ev > emin ? ev : emin) - m;  // The result's unit in the last place.
  const int64_t shift = qexp - e2;
  uint64_t q;
  if (shift <= 0) {
    q = sig << -shift;  // Exact (only a target as wide as a double gets here, with shift 0).
  } else if (shift >= 64) {
    q = 0;  // Below half the smallest subnormal.
  } else {
    q = sig >> shift;
    const uint64_t rem = sig & ((uint64_t{1} << shift) - 1);
    const uint64_t half = uint64_t{1} << (shift - 1);
    if (rem > half || (rem == half && (q & 1))) ++q;  // A carry may bump the exponent.
  }
  // Normal: q in [2^m, 2^(m+1)] includes the implicit bit, so adding it to (exponent - 1)
  // gives the encoding, a carry included; subnormal: q itself (2^m: the smallest normal).
  const uint64_t bits = ev >= emin ? (static_cast<uint64_t>(ev + f.bias - 1) << m) + q : q;
  if (bits > max_bits) return sign | (f.saturate || f.kind == kFn ? max_bits : inf_bits);
  return sign | bits;
}

// One float of format `from` as format `to` (not e8m0), exact by cast.h's rules.
SC_CAST_HD inline uint64_t ConvertFloat(uint64_t bits, const Format& from, const Format& to) {
  return EncodeFromDouble(DecodeToDouble(bits, from), to);
}

// f32 -> f16 and f32 -> bf16 directly on the 32-bit pattern: the same results as
// ConvertFloat (cast_test checks every class of input), several times faster on the host.
SC_CAST_HD inline uint16_t F32ToF16(uint32_t x) {
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

SC_CAST_HD inline uint16_t F32ToBF16(uint32_t x) {
  if ((x & 0x7FFFFFFF) > 0x7F800000) return static_cast<uint16_t>((x >> 16) | 0x40);  // NaN.
  // Round to nearest even: add just under half an ulp, plus one if the kept part is odd.
  const uint32_t rounded = x + 0x7FFF + ((x >> 16) & 1);
  return static_cast<uint16_t>(rounded >> 16);
}

// One element of an allowed cast from dtype `from` to dtype `to` (cast.h's CastAllowed; not
// checked here): `bits` holds the source element in its low bytes, the result is the target's.
SC_CAST_HD inline uint64_t CastElement(uint64_t bits, int from, int to) {
  if (from == to) return bits;
  if (from == kBool) return (bits & 0xFF) != 0 ? 1 : 0;
  if (!IsFloatCode(from)) {
    const int in = ElementBytes(from);
    // Two's complement: the target keeps the low bytes of the sign- or zero-extended value.
    if (IsSignedCode(from) && in < 8 && ((bits >> (8 * in - 1)) & 1) != 0) {
      bits |= ~uint64_t{0} << (8 * in);
    }
    const int out = ElementBytes(to);
    return out < 8 ? bits & ((uint64_t{1} << (8 * out)) - 1) : bits;
  }
  if (from == kF32 && to == kBF16) return F32ToBF16(static_cast<uint32_t>(bits));
  if (from == kF32 && to == kF16) return F32ToF16(static_cast<uint32_t>(bits));
  return ConvertFloat(bits, FormatOf(from), FormatOf(to));
}

// Little-endian element access at any alignment (host and device are both little-endian).
SC_CAST_HD inline uint64_t LoadElement(const unsigned char* p, int bytes) {
  uint64_t v = 0;
  memcpy(&v, p, static_cast<size_t>(bytes));
  return v;
}

SC_CAST_HD inline void StoreElement(unsigned char* p, int bytes, uint64_t v) {
  memcpy(p, &v, static_cast<size_t>(bytes));
}

// ---------------------------------------------------------------------------------------
// Block quantization's per-element steps (block_quant.h's rules). The f32 arithmetic is one
// correctly rounded IEEE operation each; on the device the _rn intrinsics pin that down (no
// contraction into an FMA, no approximate division, whatever the compiler flags).

constexpr float kE4M3Max = 448.0f;

SC_CAST_HD inline uint32_t F32Bits(float f) {
  uint32_t x;
  memcpy(&x, &f, 4);
  return x;
}

SC_CAST_HD inline float BitsF32(uint32_t x) {
  float f;
  memcpy(&f, &x, 4);
  return f;
}

SC_CAST_HD inline float DivF32(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fdiv_rn(a, b);
#else
  return a / b;
#endif
}

SC_CAST_HD inline float MulF32(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fmul_rn(a, b);
#else
  return a * b;
#endif
}

// The source element `bits` of float dtype `from` as an f32 (cast.h's cast).
SC_CAST_HD inline float ToF32(uint64_t bits, int from) {
  return BitsF32(static_cast<uint32_t>(CastElement(bits, from, kF32)));
}

// The running amax of a block, kept as the bits of a non-negative f32 (their integer order is
// the values' order): `amax` with the f32 `x` taken in, unless x is NaN or infinite.
SC_CAST_HD inline uint32_t AmaxWith(uint32_t amax, float x) {
  const uint32_t a = F32Bits(x) & 0x7FFFFFFF;
  return a < 0x7F800000 && a > amax ? a : amax;
}

// s = amax / 448, or 1 where that is 0.
SC_CAST_HD inline float BlockScale(uint32_t amax_bits) {
  const float s = DivF32(BitsF32(amax_bits), kE4M3Max);
  return s > 0.0f ? s : 1.0f;
}

// q = e4m3(x / s).
SC_CAST_HD inline uint8_t QuantizeE4M3(float x, float s) {
  return static_cast<uint8_t>(CastElement(F32Bits(DivF32(x, s)), kF32, kF8E4M3));
}

// y = f32(q) * s, in f32 (the caller casts it to the target dtype).
SC_CAST_HD inline float DequantizeE4M3(uint8_t q, float s) { return MulF32(ToF32(q, kF8E4M3), s); }

}  // namespace cast_bits
}  // namespace shardcoord

#endif  // SHARDCOORD_SHARDING_CAST_BITS_H_
