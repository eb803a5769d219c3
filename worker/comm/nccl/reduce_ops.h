#ifndef SHARDCOORD_WORKER_COMM_NCCL_REDUCE_OPS_H_
#define SHARDCOORD_WORKER_COMM_NCCL_REDUCE_OPS_H_

// Element-wise reductions for the reduce-into kernel, mirroring sharding/box_copy.cc's
// ReduceIntoBox (integer sums wrap, float min/max propagate NaN, f16/bf16 are combined in
// float and rounded back to nearest even) so a reduction on the GPU gives the same bytes as
// one on the host, with one exception: the payload of a NaN that a float *sum* produces.
// IEEE 754 leaves it open; x86 keeps one input's payload, which one depends on the operand
// order the compiler picked (gcc and clang differ), and GPUs return the canonical NaN. Such
// a result is NaN everywhere, just not the same NaN. Plain C++ only: this header is included
// by .cu files; reduce_ops_test checks it against the host code.

#include <cstdint>
#include <cstring>

#include "worker/comm/nccl/hd.h"

namespace shardcoord {
namespace nccl {

// Values of shardcoord::DType and shardcoord::ReduceOp (static_asserts in device_ops.cc).
enum DeviceDType : int {
  kDevF32 = 1,
  kDevF64 = 2,
  kDevF16 = 3,
  kDevBF16 = 4,
  kDevI8 = 5,
  kDevU8 = 6,
  kDevI32 = 7,
  kDevI64 = 8,
  kDevU32 = 12,
  kDevU64 = 13,
};
enum DeviceReduceOp : int { kDevSum = 1, kDevMin = 3, kDevMax = 4 };

SC_HD inline uint32_t DevFloatBits(float f) {
  uint32_t x;
  memcpy(&x, &f, 4);
  return x;
}

SC_HD inline float DevBitsFloat(uint32_t x) {
  float f;
  memcpy(&f, &x, 4);
  return f;
}

SC_HD inline float DevHalfToFloat(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000) << 16;
  const uint32_t exp = (h >> 10) & 0x1F;
  uint32_t mant = h & 0x3FF;
  if (exp == 0x1F) return DevBitsFloat(sign | 0x7F800000 | (mant << 13));
  if (exp == 0) {
    if (mant == 0) return DevBitsFloat(sign);
    uint32_t e = 113;
    while ((mant & 0x400) == 0) {
      mant <<= 1;
      --e;
    }
    return DevBitsFloat(sign | (e << 23) | ((mant & 0x3FF) << 13));
  }
  return DevBitsFloat(sign | ((exp + 112) << 23) | (mant << 13));
}

SC_HD inline uint16_t DevFloatToHalf(float f) {
  const uint32_t x = DevFloatBits(f);
  const uint16_t sign = static_cast<uint16_t>((x >> 16) & 0x8000);
  const uint32_t absx = x & 0x7FFFFFFF;
  if (absx >= 0x7F800000) {
    if (absx == 0x7F800000) return sign | 0x7C00;
    return static_cast<uint16_t>(sign | 0x7E00 | ((absx >> 13) & 0x3FF));
  }
  if (absx >= 0x477FF000) return sign | 0x7C00;
  if (absx < 0x38800000) {
    if (absx <= 0x33000000) return sign;
    const uint32_t e = absx >> 23;
    const uint32_t m = (absx & 0x7FFFFF) | 0x800000;
    const uint32_t shift = 126 - e;
    uint32_t r = m >> shift;
    const uint32_t rem = m & ((1u << shift) - 1);
    const uint32_t half = 1u << (shift - 1);
    if (rem > half || (rem == half && (r & 1))) ++r;
    return static_cast<uint16_t>(sign | r);
  }
  uint32_t r = ((absx >> 23) - 112) << 10 | ((absx >> 13) & 0x3FF);
  const uint32_t rem = absx & 0x1FFF;
  if (rem > 0x1000 || (rem == 0x1000 && (r & 1))) ++r;
  return static_cast<uint16_t>(sign | r);
}

SC_HD inline float DevBFloat16ToFloat(uint16_t b) {
  return DevBitsFloat(static_cast<uint32_t>(b) << 16);
}

SC_HD inline uint16_t DevFloatToBFloat16(float f) {
  const uint32_t x = DevFloatBits(f);
  if ((x & 0x7FFFFFFF) > 0x7F800000) return static_cast<uint16_t>((x >> 16) | 0x40);
  const uint32_t rounded = x + 0x7FFF + ((x >> 16) & 1);
  return static_cast<uint16_t>(rounded >> 16);
}

// a (op) b for integers: sums wrap as two's complement.
template <typename T, typename U>
SC_HD inline T DevCombineInt(int op, T a, T b) {
  switch (op) {
    case kDevSum:
      return static_cast<T>(static_cast<U>(static_cast<U>(a) + static_cast<U>(b)));
    case kDevMin:
      return b < a ? b : a;
    default:
      return a < b ? b : a;
  }
}

// a (op) b for floats: NaN wins min and max (the first NaN when both are).
template <typename T>
SC_HD inline T DevCombineFloat(int op, T a, T b) {
  if (op == kDevSum) return a + b;
  if (a != a) return a;
  if (b != b) return b;
  if (op == kDevMin) return b < a ? b : a;
  return a < b ? b : a;
}

// *dst = *dst (op) *src for one element of `dtype` at possibly unaligned addresses.
SC_HD inline void DevCombineElement(int dtype, int op, unsigned char* dst,
                                    const unsigned char* src) {
  switch (dtype) {
    case kDevF32: {
      float a, b;
      memcpy(&a, dst, 4);
      memcpy(&b, src, 4);
      a = DevCombineFloat<float>(op, a, b);
      memcpy(dst, &a, 4);
      return;
    }
    case kDevF64: {
      double a, b;
      memcpy(&a, dst, 8);
      memcpy(&b, src, 8);
      a = DevCombineFloat<double>(op, a, b);
      memcpy(dst, &a, 8);
      return;
    }
    case kDevF16:
    case kDevBF16: {
      uint16_t a, b;
      memcpy(&a, dst, 2);
      memcpy(&b, src, 2);
      if (dtype == kDevF16) {
        a = DevFloatToHalf(DevCombineFloat<float>(op, DevHalfToFloat(a), DevHalfToFloat(b)));
      } else {
        a = DevFloatToBFloat16(
            DevCombineFloat<float>(op, DevBFloat16ToFloat(a), DevBFloat16ToFloat(b)));
      }
      memcpy(dst, &a, 2);
      return;
    }
    case kDevI8: {
      int8_t a, b;
      memcpy(&a, dst, 1);
      memcpy(&b, src, 1);
      a = DevCombineInt<int8_t, uint8_t>(op, a, b);
      memcpy(dst, &a, 1);
      return;
    }
    case kDevU8: {
      uint8_t a = *dst, b = *src;
      *dst = DevCombineInt<uint8_t, uint8_t>(op, a, b);
      return;
    }
    case kDevI32: {
      int32_t a, b;
      memcpy(&a, dst, 4);
      memcpy(&b, src, 4);
      a = DevCombineInt<int32_t, uint32_t>(op, a, b);
      memcpy(dst, &a, 4);
      return;
    }
    case kDevI64: {
      int64_t a, b;
      memcpy(&a, dst, 8);
      memcpy(&b, src, 8);
      a = DevCombineInt<int64_t, uint64_t>(op, a, b);
      memcpy(dst, &a, 8);
      return;
    }
    case kDevU32: {
      uint32_t a, b;
      memcpy(&a, dst, 4);
      memcpy(&b, src, 4);
      a = DevCombineInt<uint32_t, uint32_t>(op, a, b);
      memcpy(dst, &a, 4);
      return;
    }
    case kDevU64: {
      uint64_t a, b;
      memcpy(&a, dst, 8);
      memcpy(&b, src, 8);
      a = DevCombineInt<uint64_t, uint64_t>(op, a, b);
      memcpy(dst, &a, 8);
      return;
    }
  }
}

// True if the element of `dtype` at `p` is a NaN (never for integer types).
SC_HD inline bool DevIsNaNElement(int dtype, const unsigned char* p) {
  switch (dtype) {
    case kDevF32: {
      uint32_t x;
      memcpy(&x, p, 4);
      return (x & 0x7FFFFFFFu) > 0x7F800000u;
    }
    case kDevF64: {
      uint64_t x;
      memcpy(&x, p, 8);
      return (x & 0x7FFFFFFFFFFFFFFFull) > 0x7FF0000000000000ull;
    }
    case kDevF16: {
      uint16_t x;
      memcpy(&x, p, 2);
      return (x & 0x7FFF) > 0x7C00;
    }
    case kDevBF16: {
      uint16_t x;
      memcpy(&x, p, 2);
      return (x & 0x7FFF) > 0x7F80;
    }
  }
  return false;
}

SC_HD inline int DevElementSize(int dtype) {
  switch (dtype) {
    case kDevF32:
    case kDevI32:
    case kDevU32:
      return 4;
    case kDevF64:
    case kDevI64:
    case kDevU64:
      return 8;
    case kDevF16:
    case kDevBF16:
      return 2;
    case kDevI8:
    case kDevU8:
      return 1;
  }
  return 0;
}

}  // namespace nccl
}  // namespace shardcoord

#endif  // SHARDCOORD_WORKER_COMM_NCCL_REDUCE_OPS_H_
