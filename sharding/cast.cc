#include "sharding/cast.h"

#include <cstring>
#include <memory>
#include <vector>

#include "absl/base/call_once.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "sharding/box_copy.h"
#include "sharding/cast_bits.h"
#include "sharding/enum_names.h"
#include "sharding/fast_cast.h"

namespace shardcoord {
namespace {

// The float formats and their exact conversion are cast_bits.h's, shared with the CUDA
// kernels so that a cast on a GPU gives these bytes.
using cast_bits::Format;

static_assert(cast_bits::kF32 == static_cast<int>(DType::kF32) &&
              cast_bits::kF64 == static_cast<int>(DType::kF64) &&
              cast_bits::kF16 == static_cast<int>(DType::kF16) &&
              cast_bits::kBF16 == static_cast<int>(DType::kBF16) &&
              cast_bits::kI8 == static_cast<int>(DType::kI8) &&
              cast_bits::kU8 == static_cast<int>(DType::kU8) &&
              cast_bits::kI32 == static_cast<int>(DType::kI32) &&
              cast_bits::kI64 == static_cast<int>(DType::kI64) &&
              cast_bits::kBool == static_cast<int>(DType::kBool) &&
              cast_bits::kI16 == static_cast<int>(DType::kI16) &&
              cast_bits::kU16 == static_cast<int>(DType::kU16) &&
              cast_bits::kU32 == static_cast<int>(DType::kU32) &&
              cast_bits::kU64 == static_cast<int>(DType::kU64) &&
              cast_bits::kF8E4M3 == static_cast<int>(DType::kF8E4M3) &&
              cast_bits::kF8E5M2 == static_cast<int>(DType::kF8E5M2) &&
              cast_bits::kF8E8M0 == static_cast<int>(DType::kF8E8M0));

Format FormatOf(DType dtype) { return cast_bits::FormatOf(static_cast<int>(dtype)); }

// ---------------------------------------------------------------------------------------
// Element access.

uint64_t LoadBits(const unsigned char* p, int64_t size) {
  uint64_t v = 0;
  std::memcpy(&v, p, static_cast<size_t>(size));  // Little-endian host.
  return v;
}

void StoreBits(unsigned char* p, int64_t size, uint64_t v) {
  std::memcpy(p, &v, static_cast<size_t>(size));
}

bool IsSigned(DType d) {
  return d == DType::kI8 || d == DType::kI16 || d == DType::kI32 || d == DType::kI64;
}
bool IsUnsigned(DType d) {
  return d == DType::kU8 || d == DType::kU16 || d == DType::kU32 || d == DType::kU64;
}

// Why a cast is refused, for CheckCast.
std::string RefusalReason(DType from, DType to) {
  const bool fi = IsSigned(from) || IsUnsigned(from) || from == DType::kBool;
  const bool ti = IsSigned(to) || IsUnsigned(to) || to == DType::kBool;
  if (to == DType::kF8E8M0) {
    return "nothing casts to f8_e8m0: choosing a power-of-two scale is block quantization's "
           "policy, not a cast";
  }
  if (from == DType::kF8E8M0) return "f8_e8m0 casts only to f64, f32 and bf16";
  if (IsFloat(from) && ti) return "float to integer is not a cast copies make";
  if (fi && IsFloat(to)) return "integer to float is not a cast copies make";
  if (to == DType::kBool) return "nothing casts to bool but bool";
  if (IsSigned(from) && IsUnsigned(to)) return "signed to unsigned loses negative values";
  return "narrowing loses values; integers only widen";
}

// ---------------------------------------------------------------------------------------
// Lookup tables for float sources of one and two bytes: the conversion of every bit pattern,
// computed once (EncodeFromDouble per element costs a few ns; a table load less than one),
// stored as unsigned integers of the target's width so that the loops below load and store
// whole elements.

constexpr int kNumDTypes = 17;  // Enum values 1..16.

struct Table {
  absl::once_flag once;
  std::vector<uint8_t> u8;  // The one of these of the target's width.
  std::vector<uint16_t> u16;
  std::vector<uint32_t> u32;
  std::vector<uint64_t> u64;
};

Table& TableFor(DType from, DType to) {
  static Table* tables = new Table[kNumDTypes * kNumDTypes];
  return tables[static_cast<int>(from) * kNumDTypes + static_cast<int>(to)];
}

template <typename T>
void FillTable(DType from, DType to, std::vector<T>* out) {
  const uint64_t count = uint64_t{1} << (8 * ElementSize(from));
  out->resize(static_cast<size_t>(count));
  const int f = static_cast<int>(from), t = static_cast<int>(to);
  for (uint64_t i = 0; i < count; ++i) (*out)[i] = static_cast<T>(cast_bits::CastElement(i, f, t));
}

const Table& TableData(DType from, DType to) {
  Table& t = TableFor(from, to);
  absl::call_once(t.once, [&] {
    switch (ElementSize(to)) {
      case 1:
        FillTable(from, to, &t.u8);
        break;
      case 2:
        FillTable(from, to, &t.u16);
        break;
      case 4:
        FillTable(from, to, &t.u32);
        break;
      default:
        FillTable(from, to, &t.u64);
        break;
    }
  });
  return t;
}

// out[i] = table[in[i]] for sources of `In` (uint8_t or uint16_t) and targets of `Out`, at any
// alignment (fixed-size memcpy compiles to plain loads and stores).
template <typename In, typename Out>
void TableLoop(const unsigned char* in, unsigned char* out, const Out* table, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    In x;
    std::memcpy(&x, in + i * sizeof(In), sizeof(In));
    std::memcpy(out + i * sizeof(Out), &table[x], sizeof(Out));
  }
}

template <typename In>
void CastByTable(const unsigned char* in, DType from, unsigned char* out, DType to, int64_t n) {
  const Table& t = TableData(from, to);
  switch (ElementSize(to)) {
    case 1:
      return TableLoop<In>(in, out, t.u8.data(), n);
    case 2:
      return TableLoop<In>(in, out, t.u16.data(), n);
    case 4:
      return TableLoop<In>(in, out, t.u32.data(), n);
    default:
      return TableLoop<In>(in, out, t.u64.data(), n);
  }
}

// Elementwise loops over whole 16- and 32-bit elements with a fast_cast.h conversion: simple
// enough for the compiler to vectorise where the conversion allows.
template <typename Out, Out (*kFn)(uint32_t)>
void FromF32Loop(const unsigned char* in, unsigned char* out, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    const Out y = kFn(fast_cast::LoadU32(in + i * 4));
    std::memcpy(out + i * sizeof(Out), &y, sizeof(Out));
  }
}

void BF16ToF32Loop(const unsigned char* in, unsigned char* out, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    uint16_t b;
    std::memcpy(&b, in + i * 2, 2);
    const uint32_t y = fast_cast::BF16ToF32(b);
    std::memcpy(out + i * 4, &y, 4);
  }
}

// The specialised loops of the hot float pairs; false for a pair that has none.
bool FastFloatCast(const unsigned char* in, DType from, unsigned char* out, DType to, int64_t n) {
  if (from == DType::kBF16 && to == DType::kF32) {
    BF16ToF32Loop(in, out, n);
    return true;
  }
  if (ElementSize(from) == 1) {
    CastByTable<uint8_t>(in, from, out, to, n);
    return true;
  }
  if (ElementSize(from) == 2) {
    CastByTable<uint16_t>(in, from, out, to, n);
    return true;
  }
  if (from != DType::kF32) return false;
  switch (to) {
    case DType::kBF16:
      FromF32Loop<uint16_t, fast_cast::F32ToBF16>(in, out, n);
      return true;
    case DType::kF16:
      FromF32Loop<uint16_t, fast_cast::F32ToF16>(in, out, n);
      return true;
    case DType::kF8E4M3:
      FromF32Loop<uint8_t, fast_cast::F32ToE4M3>(in, out, n);
      return true;
    case DType::kF8E5M2:
      FromF32Loop<uint8_t, fast_cast::F32ToE5M2>(in, out, n);
      return true;
    default:
      return false;
  }
}

// bool and integer widening: cast_bits' element rule (sign- or zero-extension).
void CastInts(const unsigned char* src, DType from, unsigned char* dst, DType to, int64_t n) {
  const int in = static_cast<int>(ElementSize(from)), out = static_cast<int>(ElementSize(to));
  const int f = static_cast<int>(from), t = static_cast<int>(to);
  for (int64_t i = 0; i < n; ++i) {
    StoreBits(dst + i * out, out, cast_bits::CastElement(LoadBits(src + i * in, in), f, t));
  }
}

}  // namespace

bool CastAllowed(DType from, DType to) {
  if (ElementSize(from) == 0 || ElementSize(to) == 0) return false;
  if (from == to) return true;
  auto castable_float = [](DType d) { return IsFloat(d) && d != DType::kF8E8M0; };
  if (castable_float(from) && castable_float(to)) return true;
  if (from == DType::kF8E8M0) {
    return to == DType::kF64 || to == DType::kF32 || to == DType::kBF16;
  }
  const int64_t fs = ElementSize(from), ts = ElementSize(to);
  if (from == DType::kBool) return IsSigned(to) || IsUnsigned(to);
  if (IsSigned(from)) return IsSigned(to) && ts > fs;
  if (IsUnsigned(from)) return (IsUnsigned(to) || IsSigned(to)) && ts > fs;
  return false;
}

absl::Status CheckCast(DType from, DType to) {
  if (CastAllowed(from, to)) return absl::OkStatus();
  if (ElementSize(from) == 0 || ElementSize(to) == 0) {
    return absl::InvalidArgumentError(absl::StrCat("cannot cast dtype ", static_cast<int>(from),
                                                   " to dtype ", static_cast<int>(to),
                                                   " (unknown dtype)"));
  }
  return absl::InvalidArgumentError(absl::StrCat(
      "cannot cast ", DTypeName(from), " to ", DTypeName(to), " (", RefusalReason(from, to), ")"));
}

absl::Status CheckCopyPair(absl::string_view src, const Shape& src_shape, DType src_dtype,
                           absl::string_view dst, const Shape& dst_shape, DType dst_dtype) {
  if (src_shape != dst_shape) {
    return absl::InvalidArgumentError(
        absl::StrCat("tensor '", dst, "' has shape [", absl::StrJoin(dst_shape, ", "),
                     "] but src '", src, "' has shape [", absl::StrJoin(src_shape, ", "), "]"));
  }
  if (src_dtype != dst_dtype && !CastAllowed(src_dtype, dst_dtype)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "tensor '", dst, "' dtype ", DTypeName(dst_dtype), " cannot be cast from src '", src,
        "' dtype ", DTypeName(src_dtype), ": ", CheckCast(src_dtype, dst_dtype).message()));
  }
  return absl::OkStatus();
}

DType WireDType(DType from, DType to) { return ElementSize(from) < ElementSize(to) ? from : to; }

CastSide CastSideOf(DType from, DType to) {
  if (from == to) return CastSide::kNone;
  return WireDType(from, to) == to ? CastSide::kSender : CastSide::kReceiver;
}

std::string CastSideName(CastSide side) {
  static constexpr EnumName<CastSide> kNames[] = {
      {CastSide::kNone, "none"}, {CastSide::kSender, "sender"}, {CastSide::kReceiver, "receiver"}};
  return NameOf(kNames, side);
}

const uint32_t* F32BitsTable(DType one_byte_float) {
  return TableData(one_byte_float, DType::kF32).u32.data();
}

absl::Status Cast(const void* src, DType src_dtype, void* dst, DType dst_dtype, int64_t n) {
  if (absl::Status s = CheckCast(src_dtype, dst_dtype); !s.ok()) return s;
  if (n < 0) return absl::InvalidArgumentError(absl::StrCat("cast of ", n, " elements"));
  if (n == 0) return absl::OkStatus();
  const auto* in = static_cast<const unsigned char*>(src);
  auto* out = static_cast<unsigned char*>(dst);
  if (src_dtype == dst_dtype) {
    std::memcpy(out, in, static_cast<size_t>(n * ElementSize(src_dtype)));
    return absl::OkStatus();
  }
  if (!IsFloat(src_dtype)) {
    CastInts(in, src_dtype, out, dst_dtype, n);
    return absl::OkStatus();
  }
  if (FastFloatCast(in, src_dtype, out, dst_dtype, n)) return absl::OkStatus();
  // f64 sources and f32 -> f64: cast_bits' exact conversion element by element.
  const int64_t is = ElementSize(src_dtype), os = ElementSize(dst_dtype);
  const Format ff = FormatOf(src_dtype);
  const Format tf = FormatOf(dst_dtype);
  for (int64_t i = 0; i < n; ++i) {
    StoreBits(out + i * os, os, cast_bits::ConvertFloat(LoadBits(in + i * is, is), ff, tf));
  }
  return absl::OkStatus();
}

absl::Status CastBox(const Box& region, const void* src, const Box& src_box, DType src_dtype,
                     void* dst, const Box& dst_box, DType dst_dtype) {
  if (src_dtype == dst_dtype) {
    return CopyBox(region, src, src_box, dst, dst_box, ElementSize(src_dtype));
  }
  if (absl::Status s = CheckCast(src_dtype, dst_dtype); !s.ok()) return s;
  // The geometry in elements; each dtype scales it by its own size.
  absl::StatusOr<BoxCopyRuns> runs = PlanBoxCopy(region, src_box, dst_box, 1);
  if (!runs.ok()) return runs.status();
  if (runs->empty) return absl::OkStatus();
  const int64_t is = ElementSize(src_dtype), os = ElementSize(dst_dtype);
  const auto* in = static_cast<const unsigned char*>(src);
  auto* out = static_cast<unsigned char*>(dst);
  const size_t nd = runs->count.size();
  std::vector<int64_t> idx(nd, 0);
  int64_t s = runs->src_start, d = runs->dst_start;
  while (true) {
    if (absl::Status st = Cast(in + s * is, src_dtype, out + d * os, dst_dtype, runs->run_elems);
        !st.ok()) {
      return st;
    }
    size_t k = nd;
    while (k > 0) {
      --k;
      s += runs->src_stride[k];
      d += runs->dst_stride[k];
      if (++idx[k] < runs->count[k]) break;
      s -= runs->count[k] * runs->src_stride[k];
      d -= runs->count[k] * runs->dst_stride[k];
      idx[k] = 0;
      if (k == 0) return absl::OkStatus();
    }
    if (nd == 0) return absl::OkStatus();
  }
}

uint64_t DoubleToFloatBits(double value, DType dtype) {
  const Format f = FormatOf(dtype);
  if (f.exp_bits == 0 || f.kind == cast_bits::kE8M0) return 0;
  uint64_t d;
  std::memcpy(&d, &value, 8);
  return cast_bits::EncodeFromDouble(d, f);
}

double FloatBitsToDouble(uint64_t bits, DType dtype) {
  const Format f = FormatOf(dtype);
  if (f.exp_bits == 0) return 0;
  const uint64_t d = cast_bits::DecodeToDouble(bits, f);
  double v;
  std::memcpy(&v, &d, 8);
  return v;
}

}  // namespace shardcoord
