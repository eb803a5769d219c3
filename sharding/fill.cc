#include "sharding/fill.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "sharding/cast.h"

namespace shardcoord {

uint64_t SplitMix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

namespace {

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
      return static_cast<double>(SplitMix64(seed ^ SplitMix64(static_cast<uint64_t>(flat_index))) >>
                                 40) /
             static_cast<double>(1 << 24);
  }
  return 0.0;
}

double LoadAsDouble(const void* data, DType dtype, int64_t i) {
  switch (dtype) {
    case DType::kF32:
      return Load<float>(data, i);
    case DType::kF64:
      return Load<double>(data, i);
    case DType::kF16:
    case DType::kBF16:
      return FloatBitsToDouble(Load<uint16_t>(data, i), dtype);
    case DType::kF8E4M3:
    case DType::kF8E5M2:
    case DType::kF8E8M0:
      return FloatBitsToDouble(Load<uint8_t>(data, i), dtype);
    case DType::kBool:
      return Load<uint8_t>(data, i) != 0 ? 1.0 : 0.0;
    case DType::kI8:
      return Load<int8_t>(data, i);
    case DType::kU8:
      return Load<uint8_t>(data, i);
    case DType::kI16:
      return Load<int16_t>(data, i);
    case DType::kU16:
      return Load<uint16_t>(data, i);
    case DType::kI32:
      return Load<int32_t>(data, i);
    case DType::kU32:
      return Load<uint32_t>(data, i);
    case DType::kI64:
      return static_cast<double>(Load<int64_t>(data, i));
    case DType::kU64:
      return static_cast<double>(Load<uint64_t>(data, i));
  }
  return 0;
}

uint8_t E8M0FromDouble(double v) {
  if (std::isnan(v)) return 0xFF;
  if (!(v > 0)) return 0x00;  // Zero and negatives: the smallest value, 2^-127.
  if (std::isinf(v)) return 0xFE;
  int e = 0;
  const double f = std::frexp(v, &e);  // v = f * 2^e, f in [0.5, 1): v = 2f * 2^(e-1).
  int exp = f >= 0.75 ? e : e - 1;     // 2f >= 1.5: the next power of two is nearer (or tied).
  exp = std::max(-127, std::min(127, exp));
  return static_cast<uint8_t>(exp + 127);
}

void StoreFromDouble(void* data, DType dtype, int64_t i, double v) {
  switch (dtype) {
    case DType::kF32:
      return Store<float>(data, i, static_cast<float>(v));
    case DType::kF64:
      return Store<double>(data, i, v);
    case DType::kF16:
    case DType::kBF16:
      return Store<uint16_t>(data, i, static_cast<uint16_t>(DoubleToFloatBits(v, dtype)));
    case DType::kF8E4M3:
    case DType::kF8E5M2:
      return Store<uint8_t>(data, i, static_cast<uint8_t>(DoubleToFloatBits(v, dtype)));
    case DType::kF8E8M0:
      return Store<uint8_t>(data, i, E8M0FromDouble(v));
    case DType::kBool:
      return Store<uint8_t>(data, i, v != 0 ? 1 : 0);  // NaN is true, as in NumPy.
    // Integer types wrap as the C++ conversion of the int64 value does (arange past 127 in i8).
    case DType::kI8:
      return Store<int8_t>(data, i, static_cast<int8_t>(static_cast<int64_t>(v)));
    case DType::kU8:
      return Store<uint8_t>(data, i, static_cast<uint8_t>(static_cast<int64_t>(v)));
    case DType::kI16:
      return Store<int16_t>(data, i, static_cast<int16_t>(static_cast<int64_t>(v)));
    case DType::kU16:
      return Store<uint16_t>(data, i, static_cast<uint16_t>(static_cast<int64_t>(v)));
    case DType::kI32:
      return Store<int32_t>(data, i, static_cast<int32_t>(static_cast<int64_t>(v)));
    case DType::kU32:
      return Store<uint32_t>(data, i, static_cast<uint32_t>(static_cast<int64_t>(v)));
    case DType::kI64:
      return Store<int64_t>(data, i, static_cast<int64_t>(v));
    case DType::kU64:
      return Store<uint64_t>(data, i, static_cast<uint64_t>(static_cast<int64_t>(v)));
  }
}

absl::Status FillBox(FillKind kind, uint64_t seed, const Shape& global_shape, const Box& box,
                     DType dtype, void* out) {
  if (box.ndim() != static_cast<int>(global_shape.size()) || !box.InBounds(global_shape)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "fill box ", box.ToString(), " is outside tensor ", ShapeToString(global_shape)));
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
