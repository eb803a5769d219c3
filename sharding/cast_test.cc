// The cast rules of sharding/cast.h, checked against a reference written here from the rules
// with floating-point arithmetic (ldexp, ilogb, nearbyint: round to nearest even), not with
// the implementation's bit manipulation: every bit pattern of every 8- and 16-bit source,
// and for f32 and f64 sources every class of input (ties, subnormals, saturation, NaN,
// infinities, signed zeros) plus large fixed-seed samples.

#include "sharding/cast.h"

#include <algorithm>
#include <cfenv>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <map>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "sharding/box_copy.h"
#include "sharding/cast_bits.h"
#include "sharding/float16.h"

namespace shardcoord {
namespace {

// ---- The reference ------------------------------------------------------------------------

struct Ref {
  int e = 0, m = 0, bias = 0;
  bool fn = false;        // e4m3fn: no infinities, one NaN.
  bool e8m0 = false;      // Exponent only.
  bool saturate = false;  // Finite overflow saturates.
};

Ref RefOf(DType d) {
  switch (d) {
    case DType::kF64:
      return {11, 52, 1023};
    case DType::kF32:
      return {8, 23, 127};
    case DType::kF16:
      return {5, 10, 15};
    case DType::kBF16:
      return {8, 7, 127};
    case DType::kF8E4M3:
      return {4, 3, 7, true, false, true};
    case DType::kF8E5M2:
      return {5, 2, 15, false, false, true};
    case DType::kF8E8M0:
      return {8, 0, 127, false, true, false};
    default:
      return {};
  }
}

const DType kFloats[] = {DType::kF64,    DType::kF32,    DType::kBF16,  DType::kF16,
                         DType::kF8E4M3, DType::kF8E5M2, DType::kF8E8M0};

bool RefIsNaN(uint64_t bits, const Ref& f) {
  if (f.e8m0) return bits == 0xFF;
  const uint64_t all = (uint64_t{1} << f.e) - 1;
  const uint64_t exp = (bits >> f.m) & all, man = bits & ((uint64_t{1} << f.m) - 1);
  if (f.fn) return exp == all && man == (uint64_t{1} << f.m) - 1;
  return exp == all && man != 0;
}

double RefDecode(uint64_t bits, const Ref& f) {
  if (f.e8m0) {
    return bits == 0xFF ? std::numeric_limits<double>::quiet_NaN()
                        : std::ldexp(1.0, static_cast<int>(bits) - 127);
  }
  if (RefIsNaN(bits, f)) return std::numeric_limits<double>::quiet_NaN();
  const uint64_t all = (uint64_t{1} << f.e) - 1;
  const bool neg = (bits >> (f.e + f.m)) & 1;
  const int64_t exp = static_cast<int64_t>((bits >> f.m) & all);
  const double man = static_cast<double>(bits & ((uint64_t{1} << f.m) - 1));
  double v;
  if (!f.fn && exp == static_cast<int64_t>(all)) {
    v = std::numeric_limits<double>::infinity();
  } else if (exp == 0) {
    v = std::ldexp(man, static_cast<int>(1 - f.bias - f.m));
  } else {
    v = std::ldexp(std::ldexp(1.0, f.m) + man, static_cast<int>(exp - f.bias - f.m));
  }
  return neg ? -v : v;
}

double MaxFinite(const Ref& f) {
  const uint64_t all = (uint64_t{1} << f.e) - 1;
  const uint64_t man_all = (uint64_t{1} << f.m) - 1;
  return RefDecode(f.fn ? (all << f.m) | (man_all - 1) : ((all - 1) << f.m) | man_all, f);
}

// The bits of a NaN of format `to` for a NaN whose sign is `neg` and whose payload, aligned
// at the top of a 52-bit field, is `payload52`: the rule, spelled out.
uint64_t RefNaN(bool neg, uint64_t payload52, const Ref& to) {
  const uint64_t sign = uint64_t{neg} << (to.e + to.m);
  const uint64_t all = (uint64_t{1} << to.e) - 1;
  if (to.fn) return sign | (all << to.m) | ((uint64_t{1} << to.m) - 1);
  return sign | (all << to.m) | (uint64_t{1} << (to.m - 1)) | (payload52 >> (52 - to.m));
}

// Value -> bits of every non-NaN pattern of an 8- or 16-bit format.
std::map<double, uint64_t> EncodeTable(DType d) {
  const Ref f = RefOf(d);
  std::map<double, uint64_t> out;
  for (uint64_t b = 0; b < (uint64_t{1} << (8 * ElementSize(d))); ++b) {
    if (RefIsNaN(b, f)) continue;
    const double v = RefDecode(b, f);
    if (v == 0 && std::signbit(v)) continue;  // -0 is handled by sign.
    out[v] = b;
  }
  return out;
}

// The expected bits of value `x` (not NaN) cast to `to`.
uint64_t RefEncode(double x, DType to) {
  if (to == DType::kF64) {
    uint64_t b;
    std::memcpy(&b, &x, 8);
    return b;
  }
  if (to == DType::kF32) {  // The hardware's conversion: round to nearest even, overflow inf.
    const float y = static_cast<float>(x);
    uint32_t b;
    std::memcpy(&b, &y, 4);
    return b;
  }
  static std::map<DType, std::map<double, uint64_t>>* tables =
      new std::map<DType, std::map<double, uint64_t>>();
  auto it = tables->find(to);
  if (it == tables->end()) it = tables->emplace(to, EncodeTable(to)).first;
  const Ref f = RefOf(to);
  const uint64_t sign_bit = uint64_t{1} << (f.e + f.m);
  const bool neg = std::signbit(x);
  const double a = std::fabs(x);
  double r;
  if (std::isinf(a)) {
    r = f.fn ? MaxFinite(f) : a;
  } else if (a == 0) {
    r = 0;
  } else {
    const int emin = 1 - f.bias;
    const int e = std::max(std::ilogb(a), emin);
    const double q = std::nearbyint(std::ldexp(a, f.m - e));  // Round to nearest even.
    r = std::ldexp(q, e - f.m);
    if (r > MaxFinite(f)) {
      r = f.saturate ? MaxFinite(f) : std::numeric_limits<double>::infinity();
    }
  }
  if (r == 0) return neg ? sign_bit : 0;
  return it->second.at(r) | (neg ? sign_bit : 0);
}

// The expected bits of source pattern `bits` of `from` cast to `to` (both floats).
uint64_t Expected(uint64_t bits, DType from, DType to) {
  const Ref ff = RefOf(from), tf = RefOf(to);
  if (RefIsNaN(bits, ff)) {
    if (ff.e8m0) return RefNaN(false, uint64_t{1} << 51, tf);
    const bool neg = (bits >> (ff.e + ff.m)) & 1;
    const uint64_t man = bits & ((uint64_t{1} << ff.m) - 1);
    return RefNaN(neg, man << (52 - ff.m), tf);
  }
  return RefEncode(RefDecode(bits, ff), to);
}

uint64_t CastOne(uint64_t bits, DType from, DType to) {
  uint64_t out = 0;
  const absl::Status s = Cast(&bits, from, &out, to, 1);
  EXPECT_TRUE(s.ok()) << s;
  return out;
}

std::string Hex(uint64_t v) { return absl::StrCat("0x", absl::Hex(v)); }

// ---- The table -----------------------------------------------------------------------------

TEST(CastTest, AllowedTableIsExactlyTheDocumentedOne) {
  std::set<std::pair<DType, DType>> allowed;
  const DType floats[] = {DType::kF64, DType::kF32,    DType::kBF16,
                          DType::kF16, DType::kF8E4M3, DType::kF8E5M2};
  for (DType a : floats) {
    for (DType b : floats) allowed.insert({a, b});
  }
  for (DType b : {DType::kF64, DType::kF32, DType::kBF16}) allowed.insert({DType::kF8E8M0, b});
  const DType chain_s[] = {DType::kI8, DType::kI16, DType::kI32, DType::kI64};
  const DType chain_u[] = {DType::kU8, DType::kU16, DType::kU32, DType::kU64};
  for (int i = 0; i < 4; ++i) {
    for (int j = i + 1; j < 4; ++j) {
      allowed.insert({chain_s[i], chain_s[j]});
      allowed.insert({chain_u[i], chain_u[j]});
      allowed.insert({chain_u[i], chain_s[j]});
    }
  }
  for (DType b : chain_s) allowed.insert({DType::kBool, b});
  for (DType b : chain_u) allowed.insert({DType::kBool, b});
  for (DType d : AllDTypes()) allowed.insert({d, d});
  for (DType a : AllDTypes()) {
    for (DType b : AllDTypes()) {
      const bool want = allowed.count({a, b}) > 0;
      EXPECT_EQ(CastAllowed(a, b), want) << DTypeName(a) << " -> " << DTypeName(b);
      const absl::Status s = CheckCast(a, b);
      EXPECT_EQ(s.ok(), want);
      if (!want) {
        EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
        EXPECT_NE(s.message().find(
                      absl::StrCat("cannot cast ", DTypeName(a), " to ", DTypeName(b), " (")),
                  std::string::npos)
            << s;
        // Nothing is written for a refused cast.
        unsigned char in[8] = {1, 2, 3, 4, 5, 6, 7, 8}, out[8] = {0};
        EXPECT_EQ(Cast(in, a, out, b, 1).code(), absl::StatusCode::kInvalidArgument);
        for (unsigned char c : out) EXPECT_EQ(c, 0);
      }
    }
  }
  EXPECT_FALSE(CastAllowed(static_cast<DType>(99), DType::kF32));
  EXPECT_EQ(CheckCast(DType::kF32, DType::kI8).message(),
            "cannot cast f32 to i8 (float to integer is not a cast copies make)");
}

TEST(CastTest, WireDTypeIsTheNarrowerAndSaysWhoConverts) {
  EXPECT_EQ(WireDType(DType::kBF16, DType::kF8E4M3), DType::kF8E4M3);
  EXPECT_EQ(CastSideOf(DType::kBF16, DType::kF8E4M3), CastSide::kSender);
  EXPECT_EQ(WireDType(DType::kF8E4M3, DType::kF32), DType::kF8E4M3);
  EXPECT_EQ(CastSideOf(DType::kF8E4M3, DType::kF32), CastSide::kReceiver);
  EXPECT_EQ(WireDType(DType::kF16, DType::kBF16), DType::kBF16);  // Same size: the target's.
  EXPECT_EQ(CastSideOf(DType::kF16, DType::kBF16), CastSide::kSender);
  EXPECT_EQ(WireDType(DType::kF32, DType::kF32), DType::kF32);
  EXPECT_EQ(CastSideOf(DType::kF32, DType::kF32), CastSide::kNone);
  EXPECT_EQ(CastSideName(CastSide::kSender), "sender");
  EXPECT_EQ(CastSideName(CastSide::kReceiver), "receiver");
  EXPECT_EQ(CastSideName(CastSide::kNone), "none");
}

// ---- Floats: exhaustive for small sources ---------------------------------------------------

TEST(CastTest, EveryPatternOfEverySmallFloatSourceToEveryTarget) {
  for (DType from : kFloats) {
    if (ElementSize(from) > 2) continue;
    for (DType to : kFloats) {
      if (!CastAllowed(from, to) || from == to) continue;
      const uint64_t count = uint64_t{1} << (8 * ElementSize(from));
      std::vector<unsigned char> in(count * ElementSize(from)), out(count * ElementSize(to));
      for (uint64_t b = 0; b < count; ++b) {
        std::memcpy(&in[b * ElementSize(from)], &b, ElementSize(from));
      }
      ASSERT_TRUE(Cast(in.data(), from, out.data(), to, static_cast<int64_t>(count)).ok());
      int failures = 0;
      for (uint64_t b = 0; b < count && failures < 5; ++b) {
        uint64_t got = 0;
        std::memcpy(&got, &out[b * ElementSize(to)], ElementSize(to));
        const uint64_t want = Expected(b, from, to);
        if (got != want) {
          ++failures;
          ADD_FAILURE() << DTypeName(from) << " " << Hex(b) << " -> " << DTypeName(to) << ": got "
                        << Hex(got) << ", want " << Hex(want);
        }
      }
    }
  }
}

// ---- f32 and f64 sources: every class of input ---------------------------------------------

// f32 patterns around every value of `to` and every midpoint between neighbours (the ties),
// one f32 ulp either side, across zero, subnormals, the largest finite and beyond.
std::vector<uint32_t> F32Probes(DType to) {
  std::vector<uint32_t> out;
  auto add = [&](float f) {
    uint32_t b;
    std::memcpy(&b, &f, 4);
    for (int64_t d = -2; d <= 2; ++d) {
      const uint32_t x = static_cast<uint32_t>(static_cast<int64_t>(b) + d);
      out.push_back(x);
      out.push_back(x ^ 0x80000000u);  // And the negative.
    }
  };
  std::vector<double> values;
  const Ref f = RefOf(to);
  const uint64_t n = ElementSize(to) <= 2 ? (uint64_t{1} << (8 * ElementSize(to))) : 0;
  for (uint64_t b = 0; b < n; ++b) {
    if (RefIsNaN(b, f) || (b >> (f.e + f.m)) != 0) continue;
    const double v = RefDecode(b, f);
    if (std::isinf(v)) continue;
    values.push_back(v);
  }
  std::sort(values.begin(), values.end());
  for (size_t i = 0; i < values.size(); ++i) {
    add(static_cast<float>(values[i]));
    if (i + 1 < values.size()) add(static_cast<float>((values[i] + values[i + 1]) / 2));
  }
  if (!values.empty()) {  // Past the largest finite: its half ulp, twice it, far beyond.
    const double top = values.back(), ulp = top - values[values.size() - 2];
    for (double v : {top + ulp / 2, top + ulp, top * 2, 1e30}) add(static_cast<float>(v));
  }
  for (float v :
       {0.0f, std::numeric_limits<float>::denorm_min(), std::numeric_limits<float>::min(),
        std::numeric_limits<float>::max(), std::numeric_limits<float>::infinity(), 1.0f, 0.5f}) {
    add(v);
  }
  for (uint32_t nan : {0x7FC00000u, 0x7F800001u, 0x7FFFFFFFu, 0x7FA5A5A5u, 0x7F80F000u}) {
    out.push_back(nan);
    out.push_back(nan | 0x80000000u);
  }
  std::mt19937 rng(28);  // Fixed seed.
  for (int i = 0; i < 200000; ++i) out.push_back(static_cast<uint32_t>(rng()));
  for (uint64_t b = 0; b < (uint64_t{1} << 32); b += 65521) out.push_back(static_cast<uint32_t>(b));
  return out;
}

TEST(CastTest, F32ToEveryFloatEveryClass) {
  for (DType to : kFloats) {
    if (to == DType::kF32 || !CastAllowed(DType::kF32, to)) continue;
    const std::vector<uint32_t> probes = F32Probes(to);
    std::vector<unsigned char> out(probes.size() * ElementSize(to));
    ASSERT_TRUE(
        Cast(probes.data(), DType::kF32, out.data(), to, static_cast<int64_t>(probes.size())).ok());
    int failures = 0;
    for (size_t i = 0; i < probes.size() && failures < 5; ++i) {
      uint64_t got = 0;
      std::memcpy(&got, &out[i * ElementSize(to)], ElementSize(to));
      const uint64_t want = Expected(probes[i], DType::kF32, to);
      if (got != want) {
        ++failures;
        ADD_FAILURE() << "f32 " << Hex(probes[i]) << " -> " << DTypeName(to) << ": got " << Hex(got)
                      << ", want " << Hex(want);
      }
    }
  }
}

TEST(CastTest, F64ToEveryFloatEveryClass) {
  std::vector<uint64_t> probes;
  auto add = [&](double v) {
    uint64_t b;
    std::memcpy(&b, &v, 8);
    for (int64_t d = -1; d <= 1; ++d) {
      probes.push_back(static_cast<uint64_t>(static_cast<int64_t>(b) + d));
      probes.push_back(static_cast<uint64_t>(static_cast<int64_t>(b) + d) ^ (uint64_t{1} << 63));
    }
  };
  for (DType to : {DType::kF16, DType::kBF16, DType::kF8E4M3, DType::kF8E5M2}) {
    const Ref f = RefOf(to);
    std::vector<double> values;
    for (uint64_t b = 0; b < (uint64_t{1} << (8 * ElementSize(to))); ++b) {
      if (RefIsNaN(b, f) || (b >> (f.e + f.m)) != 0) continue;
      const double v = RefDecode(b, f);
      if (!std::isinf(v)) values.push_back(v);
    }
    std::sort(values.begin(), values.end());
    for (size_t i = 0; i + 1 < values.size(); ++i) {
      add(values[i]);
      add((values[i] + values[i + 1]) / 2);  // Exact in f64: the tie.
    }
    add(values.back() * 1.0625);
  }
  // f32's ties and a value f32 would round twice (f64 -> f32 -> f16 differs from f64 -> f16).
  add(1.0 + std::ldexp(1.0, -24));
  add(1.0 + std::ldexp(1.0, -11) + std::ldexp(1.0, -40));
  for (double v : {0.0, std::numeric_limits<double>::denorm_min(), 1e-300, 1e300,
                   std::numeric_limits<double>::infinity(), std::numeric_limits<double>::max()}) {
    add(v);
  }
  for (uint64_t nan :
       {uint64_t{0x7FF8000000000000}, uint64_t{0x7FF0000000000001}, uint64_t{0x7FFABCDEF0123456}}) {
    probes.push_back(nan);
    probes.push_back(nan | (uint64_t{1} << 63));
  }
  std::mt19937_64 rng(28);
  for (int i = 0; i < 100000; ++i) probes.push_back(rng());
  for (DType to : kFloats) {
    if (to == DType::kF64 || !CastAllowed(DType::kF64, to)) continue;
    int failures = 0;
    for (size_t i = 0; i < probes.size() && failures < 5; ++i) {
      const uint64_t got = CastOne(probes[i], DType::kF64, to);
      const uint64_t want = Expected(probes[i], DType::kF64, to);
      if (got != want) {
        ++failures;
        ADD_FAILURE() << "f64 " << Hex(probes[i]) << " -> " << DTypeName(to) << ": got " << Hex(got)
                      << ", want " << Hex(want);
      }
    }
  }
}

// ---- The rules as the issue states them ----------------------------------------------------

uint64_t FromF32(float f, DType to) {
  uint32_t b;
  std::memcpy(&b, &f, 4);
  return CastOne(b, DType::kF32, to);
}

TEST(CastTest, DocumentedValues) {
  const float inf = std::numeric_limits<float>::infinity();
  // e4m3fn: largest 448, saturation, no infinity, one NaN, signed zero, subnormals and ties.
  EXPECT_EQ(FromF32(448, DType::kF8E4M3), 0x7Eu);
  EXPECT_EQ(FromF32(464, DType::kF8E4M3), 0x7Eu);  // The tie with 480 goes to even 448.
  EXPECT_EQ(FromF32(480, DType::kF8E4M3), 0x7Eu);  // Would be S.1111.111 (NaN): saturates.
  EXPECT_EQ(FromF32(1e9f, DType::kF8E4M3), 0x7Eu);
  EXPECT_EQ(FromF32(-1e9f, DType::kF8E4M3), 0xFEu);
  EXPECT_EQ(FromF32(inf, DType::kF8E4M3), 0x7Eu);
  EXPECT_EQ(FromF32(-inf, DType::kF8E4M3), 0xFEu);
  EXPECT_EQ(FromF32(std::nanf(""), DType::kF8E4M3), 0x7Fu);
  EXPECT_EQ(FromF32(-std::nanf(""), DType::kF8E4M3), 0xFFu);
  EXPECT_EQ(FromF32(-0.0f, DType::kF8E4M3), 0x80u);
  EXPECT_EQ(FromF32(std::ldexp(1.0f, -9), DType::kF8E4M3), 0x01u);   // Smallest subnormal.
  EXPECT_EQ(FromF32(std::ldexp(1.0f, -10), DType::kF8E4M3), 0x00u);  // Tie: to even 0.
  EXPECT_EQ(FromF32(std::ldexp(3.0f, -10), DType::kF8E4M3), 0x02u);  // Tie: to even 2^-8.
  EXPECT_EQ(FromF32(std::ldexp(1.0f, -6), DType::kF8E4M3), 0x08u);   // Smallest normal.
  EXPECT_EQ(FromF32(1.0f, DType::kF8E4M3), 0x38u);
  EXPECT_EQ(FromF32(1.0625f, DType::kF8E4M3), 0x38u);  // Tie between 1 and 1.125: even.
  EXPECT_EQ(FromF32(1.1875f, DType::kF8E4M3), 0x3Au);  // Tie between 1.125 and 1.25: even.
  // e5m2: largest 57344, saturation, infinities kept.
  EXPECT_EQ(FromF32(57344, DType::kF8E5M2), 0x7Bu);
  EXPECT_EQ(FromF32(61440, DType::kF8E5M2), 0x7Bu);
  EXPECT_EQ(FromF32(-1e9f, DType::kF8E5M2), 0xFBu);
  EXPECT_EQ(FromF32(inf, DType::kF8E5M2), 0x7Cu);
  EXPECT_EQ(FromF32(-inf, DType::kF8E5M2), 0xFCu);
  EXPECT_EQ(FromF32(std::nanf(""), DType::kF8E5M2), 0x7Eu);
  EXPECT_EQ(FromF32(std::ldexp(1.0f, -16), DType::kF8E5M2), 0x01u);
  // f16 and bf16: IEEE, overflow to infinity.
  EXPECT_EQ(FromF32(65520, DType::kF16), 0x7C00u);
  EXPECT_EQ(FromF32(65519, DType::kF16), 0x7BFFu);
  EXPECT_EQ(FromF32(3.4e38f, DType::kBF16), 0x7F80u);
  EXPECT_EQ(FromF32(-0.0f, DType::kBF16), 0x8000u);
  // e8m0: exact powers of two, NaN.
  EXPECT_EQ(CastOne(0x7F, DType::kF8E8M0, DType::kF32), 0x3F800000u);
  EXPECT_EQ(CastOne(0x00, DType::kF8E8M0, DType::kF32), 0x00400000u);  // 2^-127, subnormal.
  EXPECT_EQ(CastOne(0xFF, DType::kF8E8M0, DType::kF32), 0x7FC00000u);
  EXPECT_EQ(CastOne(0xFE, DType::kF8E8M0, DType::kBF16), 0x7F00u);
}

TEST(CastTest, F32ToSixteenBitsIsFloat16h) {
  std::mt19937 rng(7);
  for (int i = 0; i < 1000000; ++i) {
    const uint32_t b = i < 65536 ? (static_cast<uint32_t>(i) << 16) | (rng() & 0xFFFF) : rng();
    float f;
    std::memcpy(&f, &b, 4);
    uint64_t d;
    const double v = f;
    std::memcpy(&d, &v, 8);
    // Through f64 (the generic path) and from f32 (float16.h) agree.
    ASSERT_EQ(CastOne(d, DType::kF64, DType::kBF16), FloatToBFloat16(f)) << Hex(b);
    ASSERT_EQ(CastOne(d, DType::kF64, DType::kF16), FloatToHalf(f)) << Hex(b);
  }
}

TEST(CastTest, RoundTripsThroughWiderFormatsAreExact) {
  struct Pair {
    DType narrow, wide;
  };
  const Pair pairs[] = {{DType::kF8E4M3, DType::kF32}, {DType::kF8E4M3, DType::kBF16},
                        {DType::kF8E4M3, DType::kF16}, {DType::kF8E5M2, DType::kF16},
                        {DType::kF8E5M2, DType::kF64}, {DType::kBF16, DType::kF32},
                        {DType::kF16, DType::kF64},    {DType::kF16, DType::kF32}};
  for (const Pair& p : pairs) {
    const Ref f = RefOf(p.narrow);
    for (uint64_t b = 0; b < (uint64_t{1} << (8 * ElementSize(p.narrow))); ++b) {
      const uint64_t back = CastOne(CastOne(b, p.narrow, p.wide), p.wide, p.narrow);
      if (RefIsNaN(b, f)) {
        EXPECT_TRUE(RefIsNaN(back, f)) << DTypeName(p.narrow) << " " << Hex(b);
        EXPECT_EQ(back >> (f.e + f.m), b >> (f.e + f.m)) << "sign of NaN " << Hex(b);
      } else {
        ASSERT_EQ(back, b) << DTypeName(p.narrow) << " via " << DTypeName(p.wide);
      }
    }
  }
  // f32 -> f64 -> f32 over a sample.
  std::mt19937 rng(3);
  for (int i = 0; i < 100000; ++i) {
    const uint32_t b = rng();
    float f;
    std::memcpy(&f, &b, 4);
    if (std::isnan(f)) continue;
    ASSERT_EQ(CastOne(CastOne(b, DType::kF32, DType::kF64), DType::kF64, DType::kF32), b);
  }
}

TEST(CastTest, CastDoesNotDependOnTheRoundingMode) {
  const int saved = std::fegetround();
  std::fesetround(FE_UPWARD);
  const uint64_t got = CastOne(0x3F880000u, DType::kF32, DType::kF8E4M3);  // 1.0625: a tie.
  std::fesetround(saved);
  EXPECT_EQ(got, 0x38u);
}

// ---- The fast paths (fast_cast.h) against cast_bits' generic conversion ---------------------

// cast_bits' exact per-element path (DecodeToDouble + EncodeFromDouble), which the fast loops
// of Cast must equal bit for bit.
uint64_t Generic(uint64_t bits, DType from, DType to) {
  return cast_bits::ConvertFloat(bits, cast_bits::FormatOf(static_cast<int>(from)),
                                 cast_bits::FormatOf(static_cast<int>(to)));
}

const DType kFastF32Targets[] = {DType::kF8E4M3, DType::kF8E5M2, DType::kF16, DType::kBF16};

// Cast of `in` (f32 patterns) to `to`, each result widened to 64 bits.
std::vector<uint64_t> CastAll(const std::vector<uint32_t>& in, DType to) {
  std::vector<unsigned char> out(in.size() * ElementSize(to));
  EXPECT_TRUE(Cast(in.data(), DType::kF32, out.data(), to, static_cast<int64_t>(in.size())).ok());
  std::vector<uint64_t> got(in.size(), 0);
  for (size_t i = 0; i < in.size(); ++i) {
    std::memcpy(&got[i], &out[i * ElementSize(to)], ElementSize(to));
  }
  return got;
}

// Every rounding boundary of every f32 exponent: for each position k of the rounding point
// (0..23 kept mantissa bits, which covers every target and every subnormal shift), kept bits
// (all of them for k <= 4, else a spread) followed by dropped bits of 0, 1, just under half,
// half (the tie), just over half and all ones; both signs. Plus zeros, the extremes,
// infinities and NaNs with assorted payloads.
std::vector<uint32_t> RoundingBoundaries() {
  std::vector<uint32_t> out;
  std::mt19937 rng(32);
  for (uint32_t exp = 0; exp < 256; ++exp) {
    for (int k = 0; k <= 23; ++k) {
      const int drop = 23 - k;
      std::vector<uint32_t> kept;
      if (k <= 4) {
        for (uint32_t h = 0; h < (1u << k); ++h) kept.push_back(h);
      } else {
        const uint32_t all = (1u << k) - 1;
        kept = {0, 1, 2, all - 1, all, all >> 1, (all >> 1) + 1};
        for (int i = 0; i < 6; ++i) kept.push_back(rng() & all);
      }
      std::vector<uint32_t> low = {0};
      if (drop > 0) {
        const uint32_t half = 1u << (drop - 1);
        low = {0, 1, half - 1, half, half + 1, (half << 1) - 1};
      }
      for (uint32_t h : kept) {
        for (uint32_t l : low) {
          const uint32_t x = (exp << 23) | (h << drop) | (l & ((1u << drop) - 1));
          out.push_back(x);
          out.push_back(x | 0x80000000u);
        }
      }
    }
  }
  return out;
}

TEST(CastTest, FastF32PathsEqualTheGenericPathAtEveryRoundingBoundary) {
  const std::vector<uint32_t> probes = RoundingBoundaries();
  for (DType to : kFastF32Targets) {
    const std::vector<uint64_t> got = CastAll(probes, to);
    int failures = 0;
    for (size_t i = 0; i < probes.size() && failures < 5; ++i) {
      const uint64_t want = Generic(probes[i], DType::kF32, to);
      if (got[i] != want) {
        ++failures;
        ADD_FAILURE() << "f32 " << Hex(probes[i]) << " -> " << DTypeName(to) << ": got "
                      << Hex(got[i]) << ", want " << Hex(want);
      }
    }
  }
}

TEST(CastTest, FastF32PathsSpecialCases) {
  const float inf = std::numeric_limits<float>::infinity();
  const float tiny = std::numeric_limits<float>::denorm_min();
  // e4m3: saturation (448, the tie 464, 480, f32 max, inf), ties in the normal and subnormal
  // range, the subnormal that rounds up to the smallest normal, f32 subnormals, -0, NaN.
  EXPECT_EQ(FromF32(std::nextafter(464.0f, 0.0f), DType::kF8E4M3), 0x7Eu);
  EXPECT_EQ(FromF32(std::nextafter(464.0f, inf), DType::kF8E4M3), 0x7Eu);
  EXPECT_EQ(FromF32(std::numeric_limits<float>::max(), DType::kF8E4M3), 0x7Eu);
  EXPECT_EQ(FromF32(-std::numeric_limits<float>::max(), DType::kF8E4M3), 0xFEu);
  EXPECT_EQ(FromF32(std::ldexp(15.0f, -10), DType::kF8E4M3), 0x08u);  // 7.5 units: to 8.
  EXPECT_EQ(FromF32(std::ldexp(13.0f, -10), DType::kF8E4M3), 0x06u);  // 6.5 units: to even 6.
  EXPECT_EQ(FromF32(std::nextafter(std::ldexp(1.0f, -10), inf), DType::kF8E4M3), 0x01u);
  EXPECT_EQ(FromF32(tiny, DType::kF8E4M3), 0x00u);
  EXPECT_EQ(FromF32(-tiny, DType::kF8E4M3), 0x80u);
  EXPECT_EQ(FromF32(std::numeric_limits<float>::min(), DType::kF8E4M3), 0x00u);
  EXPECT_EQ(CastOne(0x7F800001u, DType::kF32, DType::kF8E4M3), 0x7Fu);  // Signalling NaN.
  EXPECT_EQ(CastOne(0xFFFFFFFFu, DType::kF32, DType::kF8E4M3), 0xFFu);
  // e5m2: the tie past the largest saturates, infinities stay, NaN payloads.
  EXPECT_EQ(FromF32(61440, DType::kF8E5M2), 0x7Bu);
  EXPECT_EQ(FromF32(std::numeric_limits<float>::max(), DType::kF8E5M2), 0x7Bu);
  EXPECT_EQ(FromF32(-0.0f, DType::kF8E5M2), 0x80u);
  EXPECT_EQ(CastOne(0x7FA00000u, DType::kF32, DType::kF8E5M2), 0x7Fu);  // Payload 01 -> 11.
  EXPECT_EQ(CastOne(0xFF800001u, DType::kF32, DType::kF8E5M2), 0xFEu);
  EXPECT_EQ(FromF32(std::ldexp(1.0f, -17), DType::kF8E5M2), 0x00u);  // Tie: to even 0.
  EXPECT_EQ(FromF32(std::ldexp(3.0f, -17), DType::kF8E5M2), 0x02u);  // Tie: to even 2.
  // f16: overflow to infinity, the subnormal ties, NaN payload.
  EXPECT_EQ(FromF32(std::nextafter(65520.0f, 0.0f), DType::kF16), 0x7BFFu);
  EXPECT_EQ(FromF32(-inf, DType::kF16), 0xFC00u);
  EXPECT_EQ(FromF32(std::ldexp(1.0f, -25), DType::kF16), 0x0000u);
  EXPECT_EQ(FromF32(std::ldexp(3.0f, -25), DType::kF16), 0x0002u);
  EXPECT_EQ(FromF32(std::nextafter(std::ldexp(1.0f, -25), inf), DType::kF16), 0x0001u);
  EXPECT_EQ(CastOne(0x7F802000u, DType::kF32, DType::kF16), 0x7E01u);
  // bf16: ties both ways, overflow to infinity, NaN quieted with its payload.
  EXPECT_EQ(CastOne(0x3F808000u, DType::kF32, DType::kBF16), 0x3F80u);
  EXPECT_EQ(CastOne(0x3F818000u, DType::kF32, DType::kBF16), 0x3F82u);
  EXPECT_EQ(CastOne(0x7F7FFFFFu, DType::kF32, DType::kBF16), 0x7F80u);
  EXPECT_EQ(CastOne(0xFF810000u, DType::kF32, DType::kBF16), 0xFFC1u);
  // bf16 -> f32 quiets a signalling NaN and keeps its payload, like the generic path.
  EXPECT_EQ(CastOne(0x7F81u, DType::kBF16, DType::kF32), 0x7FC10000u);
  EXPECT_EQ(CastOne(0x8001u, DType::kBF16, DType::kF32), 0x80010000u);
  for (uint32_t x : {0x7F800001u, 0x00000000u, 0x80000000u, 0x43E80000u, 0x3A800000u}) {
    for (DType to : kFastF32Targets) {
      EXPECT_EQ(CastOne(x, DType::kF32, to), Generic(x, DType::kF32, to))
          << Hex(x) << " -> " << DTypeName(to);
    }
  }
}

// Every f32 pattern through Cast's fast loops against the generic path. The generic path is
// too slow to run 2^32 times (~30 ns each), but it is monotone in the magnitude: for every
// non-negative code c of the target, binary search finds the smallest f32 magnitude that the
// generic path takes to c, and the sweep expects the code whose interval holds the magnitude
// (with the sign bit for the negative pattern). NaNs are compared with the generic path
// directly. Optimized builds sweep every 7th pattern for f8_e4m3 (the block quantizer's
// target) and every 29th for the others (a few seconds); unoptimized builds, whose loops are
// many times slower, every 61st and 127th (the rounding boundaries above cover every exponent
// either way). SHARDCOORD_CAST_SWEEP_STRIDE=1 sweeps every one of the 2^32 patterns for every
// target (minutes): bazel test -c opt //sharding:cast_test
// --test_env=SHARDCOORD_CAST_SWEEP_STRIDE=1 --test_filter='*DenseSweep*' (passed, 2^32 each).
#if defined(__OPTIMIZE__)
constexpr uint32_t kE4M3Stride = 7, kOtherStride = 29;
#else
constexpr uint32_t kE4M3Stride = 61, kOtherStride = 127;
#endif

uint32_t SweepStride(uint32_t default_stride) {
  const char* env = std::getenv("SHARDCOORD_CAST_SWEEP_STRIDE");
  const int v = env == nullptr ? 0 : std::atoi(env);
  return v > 0 ? static_cast<uint32_t>(v) : default_stride;
}

template <typename Out>
void SweepF32(DType to, uint32_t stride) {
  SCOPED_TRACE(DTypeName(to));
  const Out sign_bit = static_cast<Out>(uint64_t{1} << (8 * sizeof(Out) - 1));
  const uint64_t top = Generic(0x7F800000u, DType::kF32, to);  // +inf's code.
  std::vector<uint32_t> lo(static_cast<size_t>(top) + 2, 0xFFFFFFFFu);
  for (uint64_t c = 1; c <= top; ++c) {
    uint32_t a = 0, b = 0x7F800000u;  // generic(b) >= c > generic(a).
    while (b - a > 1) {
      const uint32_t mid = a + (b - a) / 2;
      (Generic(mid, DType::kF32, to) >= c ? b : a) = mid;
    }
    lo[c] = b;
    ASSERT_EQ(Generic(b, DType::kF32, to), c) << "the generic path skips code " << Hex(c);
  }
  constexpr uint32_t kChunk = 1 << 16;
  std::vector<uint32_t> pos(kChunk), neg(kChunk);
  std::vector<Out> got_pos(kChunk), got_neg(kChunk);
  uint64_t code = 0;
  int failures = 0;
  for (uint64_t start = 0; start <= 0x7F800000u && failures < 5;
       start += uint64_t{kChunk} * stride) {
    const uint64_t left = (0x7F800000u - start) / stride + 1;
    const uint32_t n = static_cast<uint32_t>(std::min<uint64_t>(kChunk, left));
    for (uint32_t i = 0; i < n; ++i) {
      pos[i] = static_cast<uint32_t>(start) + i * stride;
      neg[i] = pos[i] | 0x80000000u;
    }
    ASSERT_TRUE(Cast(pos.data(), DType::kF32, got_pos.data(), to, n).ok());
    ASSERT_TRUE(Cast(neg.data(), DType::kF32, got_neg.data(), to, n).ok());
    for (uint32_t i = 0; i < n; ++i) {
      while (code < top && pos[i] >= lo[code + 1]) ++code;
      if (got_pos[i] != code || got_neg[i] != (code | sign_bit)) {
        if (++failures > 5) break;
        ADD_FAILURE() << "f32 " << Hex(pos[i]) << ": got " << Hex(got_pos[i]) << " / "
                      << Hex(got_neg[i]) << " (negative), want " << Hex(code) << " / "
                      << Hex(code | sign_bit);
      }
    }
  }
  for (uint32_t x : {0x7F800000u, 0xFF800000u}) {  // The infinities, whatever the stride.
    Out got;
    ASSERT_TRUE(Cast(&x, DType::kF32, &got, to, 1).ok());
    EXPECT_EQ(got, x == 0x7F800000u ? top : (top | sign_bit)) << Hex(x);
  }
  for (uint64_t a = 0x7F800001u; a <= 0x7FFFFFFFu && failures < 5; a += stride) {
    for (uint32_t x : {static_cast<uint32_t>(a), static_cast<uint32_t>(a) | 0x80000000u}) {
      Out got;
      ASSERT_TRUE(Cast(&x, DType::kF32, &got, to, 1).ok());
      const uint64_t want = Generic(x, DType::kF32, to);
      if (got != want) {
        ++failures;
        ADD_FAILURE() << "f32 NaN " << Hex(x) << ": got " << Hex(got) << ", want " << Hex(want);
      }
    }
  }
}

TEST(CastTest, FastF32ToE4M3EqualsTheGenericPathOnADenseSweep) {
  SweepF32<uint8_t>(DType::kF8E4M3, SweepStride(kE4M3Stride));
}

TEST(CastTest, FastF32ToOtherFloatsEqualsTheGenericPathOnADenseSweep) {
  const uint32_t stride = SweepStride(kOtherStride);
  SweepF32<uint8_t>(DType::kF8E5M2, stride);
  SweepF32<uint16_t>(DType::kF16, stride);
  SweepF32<uint16_t>(DType::kBF16, stride);
}

// ---- Integers -------------------------------------------------------------------------------

template <typename From, typename To>
void CheckWiden(DType from, DType to) {
  const From values[] = {std::numeric_limits<From>::lowest(),
                         std::numeric_limits<From>::max(),
                         static_cast<From>(0),
                         static_cast<From>(1),
                         static_cast<From>(-1),
                         static_cast<From>(100)};
  To out[6];
  ASSERT_TRUE(Cast(values, from, out, to, 6).ok()) << DTypeName(from) << " " << DTypeName(to);
  for (int i = 0; i < 6; ++i) {
    EXPECT_EQ(out[i], static_cast<To>(values[i])) << DTypeName(from) << " -> " << DTypeName(to);
  }
}

TEST(CastTest, IntegerWideningKeepsEveryValue) {
  CheckWiden<int8_t, int16_t>(DType::kI8, DType::kI16);
  CheckWiden<int8_t, int32_t>(DType::kI8, DType::kI32);
  CheckWiden<int8_t, int64_t>(DType::kI8, DType::kI64);
  CheckWiden<int16_t, int32_t>(DType::kI16, DType::kI32);
  CheckWiden<int16_t, int64_t>(DType::kI16, DType::kI64);
  CheckWiden<int32_t, int64_t>(DType::kI32, DType::kI64);
  CheckWiden<uint8_t, uint16_t>(DType::kU8, DType::kU16);
  CheckWiden<uint8_t, uint32_t>(DType::kU8, DType::kU32);
  CheckWiden<uint8_t, uint64_t>(DType::kU8, DType::kU64);
  CheckWiden<uint16_t, uint32_t>(DType::kU16, DType::kU32);
  CheckWiden<uint16_t, uint64_t>(DType::kU16, DType::kU64);
  CheckWiden<uint32_t, uint64_t>(DType::kU32, DType::kU64);
  CheckWiden<uint8_t, int16_t>(DType::kU8, DType::kI16);
  CheckWiden<uint8_t, int32_t>(DType::kU8, DType::kI32);
  CheckWiden<uint8_t, int64_t>(DType::kU8, DType::kI64);
  CheckWiden<uint16_t, int32_t>(DType::kU16, DType::kI32);
  CheckWiden<uint16_t, int64_t>(DType::kU16, DType::kI64);
  CheckWiden<uint32_t, int64_t>(DType::kU32, DType::kI64);
  const unsigned char bools[] = {0, 1, 2, 255};
  int64_t i64[4];
  uint16_t u16[4];
  ASSERT_TRUE(Cast(bools, DType::kBool, i64, DType::kI64, 4).ok());
  ASSERT_TRUE(Cast(bools, DType::kBool, u16, DType::kU16, 4).ok());
  EXPECT_EQ(std::vector<int64_t>(i64, i64 + 4), (std::vector<int64_t>{0, 1, 1, 1}));
  EXPECT_EQ(std::vector<uint16_t>(u16, u16 + 4), (std::vector<uint16_t>{0, 1, 1, 1}));
}

TEST(CastTest, IdentityCopiesBytesAndNegativeCountsAreRefused) {
  const uint32_t nan = 0x7F800001u;  // A signalling NaN stays exactly itself.
  uint32_t out = 0;
  ASSERT_TRUE(Cast(&nan, DType::kF32, &out, DType::kF32, 1).ok());
  EXPECT_EQ(out, nan);
  EXPECT_EQ(Cast(&nan, DType::kF32, &out, DType::kF16, -1).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(Cast(nullptr, DType::kF32, nullptr, DType::kF16, 0).ok());
}

// ---- Boxes ----------------------------------------------------------------------------------

TEST(CastTest, CastBoxConvertsAStridedRegionAsCopyThenCast) {
  const Box src_box({2, 0, 1}, {5, 6, 7});
  const Box dst_box({3, 1, 0}, {4, 5, 9});
  const Box region({3, 2, 2}, {3, 3, 4});
  std::vector<float> src(src_box.Volume());
  std::mt19937 rng(5);
  for (float& v : src) v = std::ldexp(static_cast<float>(rng() % 1000) - 500.0f, -3);
  std::vector<uint8_t> got(dst_box.Volume(), 0xAA), want(dst_box.Volume(), 0xAA);
  ASSERT_TRUE(
      CastBox(region, src.data(), src_box, DType::kF32, got.data(), dst_box, DType::kF8E4M3).ok());
  // The same elements, copied to a dense f32 buffer for the region, cast, then placed.
  std::vector<float> packed(region.Volume());
  ASSERT_TRUE(CopyBox(region, src.data(), src_box, packed.data(), region, 4).ok());
  std::vector<uint8_t> cast(region.Volume());
  ASSERT_TRUE(Cast(packed.data(), DType::kF32, cast.data(), DType::kF8E4M3, region.Volume()).ok());
  ASSERT_TRUE(CopyBox(region, cast.data(), region, want.data(), dst_box, 1).ok());
  EXPECT_EQ(got, want);
  // Elements outside the region are untouched; a region outside a box is refused.
  EXPECT_EQ(got[0], 0xAA);
  EXPECT_EQ(CastBox(Box({0, 0, 0}, {1, 1, 1}), src.data(), src_box, DType::kF32, got.data(),
                    dst_box, DType::kF8E4M3)
                .code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(
      CastBox(region, src.data(), src_box, DType::kF32, got.data(), dst_box, DType::kI8).code(),
      absl::StatusCode::kInvalidArgument);
}

TEST(CastTest, CheckCopyPairNamesBothTensorsForShapesAndRefusedCasts) {
  EXPECT_TRUE(CheckCopyPair("a", {2, 3}, DType::kF32, "b", {2, 3}, DType::kBF16).ok());
  EXPECT_TRUE(CheckCopyPair("a", {2, 3}, DType::kI32, "b", {2, 3}, DType::kI32).ok());
  const absl::Status shape = CheckCopyPair("a", {2, 3}, DType::kF32, "b", {3, 2}, DType::kF32);
  EXPECT_EQ(shape.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(shape.message(), "tensor 'b' has shape [3, 2] but src 'a' has shape [2, 3]");
  const absl::Status cast = CheckCopyPair("a", {4}, DType::kF32, "b", {4}, DType::kI32);
  EXPECT_EQ(cast.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(cast.message(), absl::StrCat("tensor 'b' dtype i32 cannot be cast from src 'a' dtype "
                                         "f32: ",
                                         CheckCast(DType::kF32, DType::kI32).message()));
}

}  // namespace
}  // namespace shardcoord
