#include "sharding/cast.h"

#include <cstring>
#include <memory>
#include <vector>

#include "absl/base/call_once.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "sharding/box_copy.h"
#include "sharding/enum_names.h"
#include "sharding/float16.h"

namespace shardcoord {
namespace {

// ---------------------------------------------------------------------------------------
// Float formats, and exact conversion through the bits of a double (which holds every value
// of every other format exactly). Bit manipulation only: no floating-point arithmetic, so the
// result does not depend on the FPU's rounding mode or its NaN handling.

enum class Kind {
  kIeee,  // Infinities and NaNs at the all-ones exponent.
  kFn,    // e4m3fn: no infinities; S.1111.111 is the only NaN.
  kE8M0,  // Exponent only, unsigned; 0xFF is NaN.
};

struct Format {
  int exp_bits = 0;
  int man_bits = 0;
  int bias = 0;
  Kind kind = Kind::kIeee;
  bool saturate = false;  // Finite overflow gives the largest finite value, not infinity.
};

constexpr Format kF64Format{11, 52, 1023, Kind::kIeee, false};
constexpr Format kF32Format{8, 23, 127, Kind::kIeee, false};
constexpr Format kF16Format{5, 10, 15, Kind::kIeee, false};
constexpr Format kBF16Format{8, 7, 127, Kind::kIeee, false};
constexpr Format kE4M3Format{4, 3, 7, Kind::kFn, true};
constexpr Format kE5M2Format{5, 2, 15, Kind::kIeee, true};
constexpr Format kE8M0Format{8, 0, 127, Kind::kE8M0, false};

const Format* FormatOf(DType dtype) {
  switch (dtype) {
    case DType::kF64:
      return &kF64Format;
    case DType::kF32:
      return &kF32Format;
    case DType::kF16:
      return &kF16Format;
    case DType::kBF16:
      return &kBF16Format;
    case DType::kF8E4M3:
      return &kE4M3Format;
    case DType::kF8E5M2:
      return &kE5M2Format;
    case DType::kF8E8M0:
      return &kE8M0Format;
    default:
      return nullptr;
  }
}

constexpr uint64_t kDoubleExpMask = uint64_t{0x7FF} << 52;
constexpr uint64_t kDoubleManMask = (uint64_t{1} << 52) - 1;
constexpr uint64_t kDoubleQuietNaN = kDoubleExpMask | (uint64_t{1} << 51);

// The bits of the double equal to `bits` of format `f`.
uint64_t DecodeToDouble(uint64_t bits, const Format& f) {
  if (&f == &kF64Format) return bits;  // Its subnormals have no normal form to take.
  if (f.kind == Kind::kE8M0) {
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
  const bool nan = f.kind == Kind::kIeee ? exp == exp_all && man != 0
                                         : exp == exp_all && man == (uint64_t{1} << m) - 1;
  if (nan) return s | kDoubleExpMask | (man << (52 - m));
  if (f.kind == Kind::kIeee && exp == exp_all) return s | kDoubleExpMask;  // Infinity.
  if (exp == 0) {
    if (man == 0) return s;
    // man * 2^(1 - bias - m): normalise so that the leading 1 becomes the implicit bit.
    const int lead = 63 - __builtin_clzll(man);  // Position of the leading 1.
    const int64_t e = static_cast<int64_t>(lead) + 1 - f.bias - m;
    const uint64_t frac = (man << (52 - lead)) & kDoubleManMask;
    return s | (static_cast<uint64_t>(e + 1023) << 52) | frac;
  }
  return s | ((exp - f.bias + 1023) << 52) | (man << (52 - m));
}

// `d` (the bits of a double) rounded to format `f` (not e8m0) by the rules of cast.h.
uint64_t EncodeFromDouble(uint64_t d, const Format& f) {
  const int m = f.man_bits;
  const uint64_t exp_all = (uint64_t{1} << f.exp_bits) - 1;
  const uint64_t sign = (d >> 63) << (f.exp_bits + m);
  const uint64_t a = d & ~(uint64_t{1} << 63);
  const uint64_t man_all = (uint64_t{1} << m) - 1;
  const uint64_t inf_bits = exp_all << m;
  const uint64_t max_bits =
      f.kind == Kind::kFn ? (exp_all << m) | (man_all - 1) : ((exp_all - 1) << m) | man_all;
  if (a > kDoubleExpMask) {  // NaN.
    if (f.kind == Kind::kFn) return sign | inf_bits | man_all;
    const uint64_t payload = (a & kDoubleManMask) >> (52 - m);
    return sign | inf_bits | (uint64_t{1} << (m - 1)) | payload;
  }
  if (a == kDoubleExpMask) return sign | (f.kind == Kind::kFn ? max_bits : inf_bits);
  if (a == 0) return sign;
  const uint64_t de = a >> 52;
  const uint64_t sig =
      de == 0 ? (a & kDoubleManMask) : ((a & kDoubleManMask) | (uint64_t{1} << 52));
  const int64_t e2 = de == 0 ? -1074 : static_cast<int64_t>(de) - 1075;  // value = sig * 2^e2
  const int64_t ev = (63 - __builtin_clzll(sig)) + e2;                   // floor(log2(value))
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
  if (bits > max_bits) return sign | (f.saturate || f.kind == Kind::kFn ? max_bits : inf_bits);
  return sign | bits;
}

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
// computed once (EncodeFromDouble per element costs a few ns; a table load less than one).

constexpr int kNumDTypes = 17;  // Enum values 1..16.

struct Table {
  absl::once_flag once;
  std::vector<unsigned char> bytes;  // Entry i at i * ElementSize(to).
};

Table& TableFor(DType from, DType to) {
  static Table* tables = new Table[kNumDTypes * kNumDTypes];
  return tables[static_cast<int>(from) * kNumDTypes + static_cast<int>(to)];
}

uint64_t ConvertOne(uint64_t bits, const Format& from, const Format& to) {
  return EncodeFromDouble(DecodeToDouble(bits, from), to);
}

const unsigned char* TableData(DType from, DType to) {
  Table& t = TableFor(from, to);
  absl::call_once(t.once, [&] {
    const int64_t in = ElementSize(from), out = ElementSize(to);
    const uint64_t count = uint64_t{1} << (8 * in);
    t.bytes.resize(static_cast<size_t>(count * out));
    const Format& ff = *FormatOf(from);
    const Format& tf = *FormatOf(to);
    for (uint64_t i = 0; i < count; ++i) StoreBits(&t.bytes[i * out], out, ConvertOne(i, ff, tf));
  });
  return t.bytes.data();
}

template <typename From, typename To>
void WidenInts(const unsigned char* src, unsigned char* dst, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    From v;
    std::memcpy(&v, src + i * sizeof(From), sizeof(From));
    const To w = static_cast<To>(v);
    std::memcpy(dst + i * sizeof(To), &w, sizeof(To));
  }
}

void CastInts(const unsigned char* src, DType from, unsigned char* dst, DType to, int64_t n) {
  const int64_t out = ElementSize(to);
  if (from == DType::kBool) {
    for (int64_t i = 0; i < n; ++i) StoreBits(dst + i * out, out, src[i] != 0 ? 1 : 0);
    return;
  }
  const int64_t in = ElementSize(from);
  for (int64_t i = 0; i < n; ++i) {
    uint64_t v = LoadBits(src + i * in, in);
    if (IsSigned(from) && in < 8 && (v >> (8 * in - 1)) != 0) v |= ~uint64_t{0} << (8 * in);
    StoreBits(dst + i * out, out, v);  // Two's complement: the low bytes of the widened value.
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
  const int64_t is = ElementSize(src_dtype), os = ElementSize(dst_dtype);
  if (is <= 2) {
    const unsigned char* table = TableData(src_dtype, dst_dtype);
    for (int64_t i = 0; i < n; ++i) {
      std::memcpy(out + i * os, table + LoadBits(in + i * is, is) * os, static_cast<size_t>(os));
    }
    return absl::OkStatus();
  }
  if (src_dtype == DType::kF32 && (dst_dtype == DType::kBF16 || dst_dtype == DType::kF16)) {
    // float16.h's conversions are these rules (cast_test checks every class of input).
    const bool bf16 = dst_dtype == DType::kBF16;
    for (int64_t i = 0; i < n; ++i) {
      float f;
      std::memcpy(&f, in + i * 4, 4);
      const uint16_t h = bf16 ? FloatToBFloat16(f) : FloatToHalf(f);
      std::memcpy(out + i * 2, &h, 2);
    }
    return absl::OkStatus();
  }
  const Format& ff = *FormatOf(src_dtype);
  const Format& tf = *FormatOf(dst_dtype);
  for (int64_t i = 0; i < n; ++i) {
    StoreBits(out + i * os, os, ConvertOne(LoadBits(in + i * is, is), ff, tf));
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
  const Format* f = FormatOf(dtype);
  if (f == nullptr || f->kind == Kind::kE8M0) return 0;
  uint64_t d;
  std::memcpy(&d, &value, 8);
  return EncodeFromDouble(d, *f);
}

double FloatBitsToDouble(uint64_t bits, DType dtype) {
  const Format* f = FormatOf(dtype);
  if (f == nullptr) return 0;
  const uint64_t d = DecodeToDouble(bits, *f);
  double v;
  std::memcpy(&v, &d, 8);
  return v;
}

}  // namespace shardcoord
