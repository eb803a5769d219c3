#include "sharding/fill.h"

#include <cmath>
#include <cstring>

#include "absl/strings/str_cat.h"

namespace shardcoord {
namespace {

uint64_t SplitMix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

template <typename T>
T Load(const void* data, int64_t i) {
  T v;
  std::memcpy(&v, static_cast<const char*>(data) + i * sizeof(T), sizeof(T));
  return v;
}

template <typename T>
void Store(void* data, int64_t i, T v) {
  std::memcpy(static_cast<char*>(data) + i * sizeof(T), &v, sizeof(T));
}

}  // namespace

double FillValue(FillKind kind, uint64_t seed, int64_t flat_index) {
  switch (kind) {
    case FillKind::kZeros:
      return 0.0;
    case FillKind::kArange:
      return static_cast<double>(flat_index);
    case FillKind::kRandom:
      return static_cast<double>(SplitMix64(seed ^ SplitMix64(static_cast<uint64_t>(flat_index))) >> 40) /
             static_cast<double>(1 << 24);
  }
  return 0.0;
}

uint16_t FloatToHalf(float f) {
  uint32_t x;
  std::memcpy(&x, &f, 4);
  const uint32_t sign = (x >> 16) & 0x8000;
  const int32_t exp = static_cast<int32_t>((x >> 23) & 0xff) - 127 + 15;
  uint32_t mant = x & 0x7fffff;
  if (((x >> 23) & 0xff) == 0xff) return static_cast<uint16_t>(sign | 0x7c00 | (mant ? 0x200 : 0));
  if (exp >= 0x1f) return static_cast<uint16_t>(sign | 0x7c00);  // Overflow to inf.
  if (exp <= 0) {
    if (exp < -10) return static_cast<uint16_t>(sign);
    mant |= 0x800000;
    const int shift = 14 - exp;
    uint32_t half = mant >> shift;
    const uint32_t rem = mant & ((1u << shift) - 1), mid = 1u << (shift - 1);
    if (rem > mid || (rem == mid && (half & 1))) ++half;
    return static_cast<uint16_t>(sign | half);
  }
  uint32_t half = sign | (static_cast<uint32_t>(exp) << 10) | (mant >> 13);
  const uint32_t rem = mant & 0x1fff;
  if (rem > 0x1000 || (rem == 0x1000 && (half & 1))) ++half;  // May carry into the exponent.
  return static_cast<uint16_t>(half);
}

float HalfToFloat(uint16_t h) {
  const uint32_t sign = (h & 0x8000u) << 16;
  uint32_t exp = (h >> 10) & 0x1f, mant = h & 0x3ff, x;
  if (exp == 0) {
    if (mant == 0) {
      x = sign;
    } else {  // Subnormal: normalise.
      exp = 127 - 15 + 1;
      while (!(mant & 0x400)) {
        mant <<= 1;
        --exp;
      }
      x = sign | (exp << 23) | ((mant & 0x3ff) << 13);
    }
  } else if (exp == 0x1f) {
    x = sign | 0x7f800000 | (mant << 13);
  } else {
    x = sign | ((exp - 15 + 127) << 23) | (mant << 13);
  }
  float f;
  std::memcpy(&f, &x, 4);
  return f;
}

uint16_t FloatToBFloat16(float f) {
  uint32_t x;
  std::memcpy(&x, &f, 4);
  if ((x & 0x7fffffff) > 0x7f800000) return static_cast<uint16_t>((x >> 16) | 0x40);  // NaN.
  x += 0x7fff + ((x >> 16) & 1);
  return static_cast<uint16_t>(x >> 16);
}

float BFloat16ToFloat(uint16_t b) {
  const uint32_t x = static_cast<uint32_t>(b) << 16;
  float f;
  std::memcpy(&f, &x, 4);
  return f;
}

double LoadAsDouble(const void* data, DType dtype, int64_t i) {
  switch (dtype) {
    case DType::kF32: return Load<float>(data, i);
    case DType::kF64: return Load<double>(data, i);
    case DType::kF16: return HalfToFloat(Load<uint16_t>(data, i));
    case DType::kBF16: return BFloat16ToFloat(Load<uint16_t>(data, i));
    case DType::kI8: return Load<int8_t>(data, i);
    case DType::kU8: return Load<uint8_t>(data, i);
    case DType::kI32: return Load<int32_t>(data, i);
    case DType::kI64: return static_cast<double>(Load<int64_t>(data, i));
  }
  return 0;
}

void StoreFromDouble(void* data, DType dtype, int64_t i, double v) {
  switch (dtype) {
    case DType::kF32: return Store<float>(data, i, static_cast<float>(v));
    case DType::kF64: return Store<double>(data, i, v);
    case DType::kF16: return Store<uint16_t>(data, i, FloatToHalf(static_cast<float>(v)));
    case DType::kBF16: return Store<uint16_t>(data, i, FloatToBFloat16(static_cast<float>(v)));
    // Integer types wrap as the C++ conversion of the int64 value does (arange past 127 in i8).
    case DType::kI8: return Store<int8_t>(data, i, static_cast<int8_t>(static_cast<int64_t>(v)));
    case DType::kU8: return Store<uint8_t>(data, i, static_cast<uint8_t>(static_cast<int64_t>(v)));
    case DType::kI32: return Store<int32_t>(data, i, static_cast<int32_t>(static_cast<int64_t>(v)));
    case DType::kI64: return Store<int64_t>(data, i, static_cast<int64_t>(v));
  }
}

absl::Status FillBox(FillKind kind, uint64_t seed, const Shape& global_shape, const Box& box,
                     DType dtype, void* out) {
  if (box.ndim() != static_cast<int>(global_shape.size()) || !box.InBounds(global_shape)) {
    return absl::InvalidArgumentError(absl::StrCat("fill box ", box.ToString(),
                                                   " is outside tensor ",
                                                   ShapeToString(global_shape)));
  }
  const int64_t n = box.Volume();
  if (n == 0) return absl::OkStatus();
  if (kind == FillKind::kZeros) {
    std::memset(out, 0, n * ElementSize(dtype));
    return absl::OkStatus();
  }
  const int nd = box.ndim();
  const Shape strides = RowMajorStrides(global_shape);
  Shape idx(nd, 0);  // Odometer over the box.
  for (int64_t i = 0; i < n; ++i) {
    int64_t flat = 0;
    for (int d = 0; d < nd; ++d) flat += (box.offset(d) + idx[d]) * strides[d];
    StoreFromDouble(out, dtype, i, FillValue(kind, seed, flat));
    for (int d = nd - 1; d >= 0; --d) {
      if (++idx[d] < box.shape(d)) break;
      idx[d] = 0;
    }
  }
  return absl::OkStatus();
}

}  // namespace shardcoord
