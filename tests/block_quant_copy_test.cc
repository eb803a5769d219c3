// Block-scaled FP8 copies (issue 28) through real daemons: `Copy` with quantize writes dst
// (f8_e4m3) and the scale tensor (f32) from a source whose layout cuts blocks between ranks;
// with dequantize it writes them back into bf16 / f32. Every value is compared bit for bit with
// a reference written here from the rules (element by element: the block's amax over finite
// values, s = amax / 448 or 1, e4m3(x / s) by sharding/cast.h), not with sharding/block_quant.
// Refusals answer INVALID_ARGUMENT and change no version; a source that holds whole blocks
// stages nothing.

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "proto/convert.h"
#include "sharding/cast.h"
#include "tests/cluster.h"
#include "tests/cluster_environment.h"
#include "tests/tensor_check.h"

namespace shardcoord {
namespace {

using ::testing::HasSubstr;

float ToF32(const void* x, DType dtype) {
  float out = 0;
  EXPECT_TRUE(Cast(x, dtype, &out, DType::kF32, 1).ok());
  return out;
}

// The reference, written from the rules: per block (rows r0.., cols c0..) its amax over the
// finite values and s; then per element, from its coordinates, its block's s and q.
struct Reference {
  std::vector<uint8_t> q;
  std::vector<float> s;
};
Reference Quantize(const std::vector<float>& x, int64_t m, int64_t n, int64_t br, int64_t bc) {
  const int64_t bm = (m + br - 1) / br, bn = (n + bc - 1) / bc;
  Reference ref;
  ref.q.resize(x.size());
  ref.s.resize(static_cast<size_t>(bm * bn));
  for (int64_t bi = 0; bi < bm; ++bi) {
    for (int64_t bj = 0; bj < bn; ++bj) {
      float amax = 0;
      for (int64_t a = bi * br; a < std::min((bi + 1) * br, m); ++a) {
        for (int64_t b = bj * bc; b < std::min((bj + 1) * bc, n); ++b) {
          const float v = x[a * n + b];
          if (std::isfinite(v)) amax = std::max(amax, std::fabs(v));
        }
      }
      float s = amax / 448.0f;
      if (!(s > 0.0f)) s = 1.0f;
      ref.s[bi * bn + bj] = s;
    }
  }
  for (int64_t i = 0; i < m; ++i) {
    for (int64_t j = 0; j < n; ++j) {
      const float scaled = x[i * n + j] / ref.s[(i / br) * bn + j / bc];
      EXPECT_TRUE(Cast(&scaled, DType::kF32, &ref.q[i * n + j], DType::kF8E4M3, 1).ok());
    }
  }
  return ref;
}

// dtype(f32(q) * s) for every element.
std::string Dequantize(const Reference& ref, int64_t m, int64_t n, int64_t br, int64_t bc,
                       DType dtype) {
  const int64_t bn = (n + bc - 1) / bc, es = ElementSize(dtype);
  std::string out(static_cast<size_t>(m * n * es), '\0');
  for (int64_t i = 0; i < m; ++i) {
    for (int64_t j = 0; j < n; ++j) {
      const float y = ToF32(&ref.q[i * n + j], DType::kF8E4M3) * ref.s[(i / br) * bn + j / bc];
      EXPECT_TRUE(Cast(&y, DType::kF32, &out[(i * n + j) * es], dtype, 1).ok());
    }
  }
  return out;
}

// Normal values of a magnitude that changes by block, then the special values of the rules:
// NaN, +-inf, f32 subnormals, e4m3 ties (in a block whose amax is 448, so s = 1), an
// all-zero block, a block of only subnormals, a block with no finite element.
std::vector<float> Source(int64_t m, int64_t n, int64_t br, int64_t bc) {
  std::mt19937 rng(28);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> x(static_cast<size_t>(m * n));
  for (int64_t i = 0; i < m; ++i) {
    for (int64_t j = 0; j < n; ++j) {
      const float magnitude =
          std::ldexp(1.0f, static_cast<int>((i / br * 7 + j / bc * 3) % 40) - 20);
      x[i * n + j] = normal(rng) * magnitude;
    }
  }
  auto at = [&](int64_t i, int64_t j) -> float& { return x[i * n + j]; };
  const float inf = std::numeric_limits<float>::infinity();
  // Block (0, 0): amax 448 (s = 1) with ties and specials.
  at(0, 0) = 448.0f;
  at(0, 1) = 1.0625f;                // Tie: to even 1.
  at(0, 2) = 1.1875f;                // Tie: to even 1.25.
  at(0, 3) = std::ldexp(1.0f, -10);  // Half the smallest subnormal: a tie, to 0.
  at(0, 4) = std::ldexp(3.0f, -10);  // A tie, to even 2^-8.
  at(1, 0) = std::numeric_limits<float>::quiet_NaN();
  at(1, 1) = inf;  // Saturates to 448.
  at(1, 2) = -inf;
  at(1, 3) = std::ldexp(1.0f, -130);  // An f32 subnormal.
  at(1, 4) = -464.0f * 0.0f;          // -0.
  // The last block row's first block: all zeros (s = 1).
  const int64_t last = ((m - 1) / br) * br;
  for (int64_t i = last; i < m; ++i) {
    for (int64_t j = 0; j < std::min(bc, n); ++j) at(i, j) = 0.0f;
  }
  // Block (0, 1): only f32 subnormals (s underflows towards 0).
  if (n > bc) {
    for (int64_t i = 0; i < std::min(br, m); ++i) {
      for (int64_t j = bc; j < std::min(2 * bc, n); ++j) at(i, j) = std::ldexp(1.0f + i, -140);
    }
  }
  // Block (1, 0): no finite element (s = 1).
  if (m > br) {
    for (int64_t i = br; i < std::min(2 * br, m); ++i) {
      for (int64_t j = 0; j < std::min(bc, n); ++j) {
        at(i, j) = (i + j) % 2 ? inf : -std::numeric_limits<float>::quiet_NaN();
      }
    }
  }
  return x;
}

std::string Bytes(const void* p, size_t n) { return std::string(static_cast<const char*>(p), n); }

class BlockQuantCopyTest : public MeshTest {
 protected:
  // Uploads `x` as `dtype` (converted by sharding/cast.h) and replaces `x` with the values
  // the tensor then holds, in f32 (exact from bf16).
  absl::Status Upload(const std::string& name, std::vector<float>* x, const Shape& shape,
                      const std::string& mesh, const std::string& spec, DType dtype = DType::kF32) {
    v1::TensorHeader header;
    header.set_name(name);
    for (int64_t d : shape) header.add_shape(d);
    header.set_dtype(DTypeToProto(dtype));
    *header.mutable_spec() = SpecFromText(mesh, spec);
    const int64_t es = ElementSize(dtype);
    std::string bytes(x->size() * es, '\0');
    for (size_t i = 0; i < x->size(); ++i) {
      EXPECT_TRUE(Cast(&(*x)[i], DType::kF32, &bytes[i * es], dtype, 1).ok());
      (*x)[i] = ToF32(&bytes[i * es], dtype);
    }
    return client().Upload(header, bytes).status();
  }

  std::string Download(const std::string& name) {
    std::string data;
    absl::StatusOr<v1::TensorHeader> h = client().Download(name, &data);
    EXPECT_TRUE(h.ok()) << h.status();
    return data;
  }

  int64_t Version(const std::string& name) {
    absl::StatusOr<v1::TensorInfo> t = client().GetTensor(name);
    EXPECT_TRUE(t.ok()) << t.status();
    return t.ok() ? t->version() : -1;
  }

  absl::StatusOr<v1::CopyResponse> BlockCopy(const std::string& src, const std::string& dst,
                                             const std::string& scale, const std::string& block,
                                             bool dequantize) {
    v1::CopyRequest request;
    request.set_src(src);
    request.set_dst(dst);
    request.set_scale(scale);
    request.set_quantize(block);
    request.set_dequantize(dequantize);
    request.set_wait(true);
    return client().Copy(request);
  }

  // Quantizes an m x n f32 source on `src_at`, into dst on `dst_at`, scales replicated on
  // "trio"; compares; dequantizes into bf16 and f32 on other layouts and compares.
  void RoundTrip(const std::string& name, int64_t m, int64_t n, int64_t br, int64_t bc,
                 const std::string& src_mesh, const std::string& src_spec,
                 const std::string& dst_mesh, const std::string& dst_spec, bool cut = true,
                 DType src_dtype = DType::kF32) {
    SCOPED_TRACE(
        absl::StrCat(name, ": ", DTypeName(src_dtype), " ", m, "x", n, " blocks ", br, "x", bc));
    std::vector<float> x = Source(m, n, br, bc);
    const Shape shape{m, n};
    const Shape scale_shape{(m + br - 1) / br, (n + bc - 1) / bc};
    const std::string src = name + "_src", dst = name + "_q", scale = name + "_s";
    ASSERT_TRUE(Upload(src, &x, shape, src_mesh, src_spec, src_dtype).ok());
    ASSERT_TRUE(
        CreateFilled(client(), dst, shape, DType::kF8E4M3, dst_mesh, dst_spec, false, v1::ZEROS)
            .ok());
    ASSERT_TRUE(
        CreateFilled(client(), scale, scale_shape, DType::kF32, "trio", "R", false, v1::ZEROS)
            .ok());
    const std::string block = absl::StrCat("block:", br, "x", bc);
    absl::StatusOr<v1::CopyResponse> r = BlockCopy(src, dst, scale, block, false);
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_EQ(Version(dst), r->dst_version());
    EXPECT_EQ(Version(scale), r->block_copy().scale_version());
    EXPECT_EQ(r->block_copy().blocks(), scale_shape[0] * scale_shape[1]);
    EXPECT_EQ(r->block_copy().cut_blocks() > 0, cut);
    EXPECT_EQ(r->block_copy().staged_bytes() > 0, cut);
    EXPECT_FALSE(r->block_copy().staging().empty());

    const Reference ref = Quantize(x, m, n, br, bc);
    const std::string got_q = Download(dst);
    ASSERT_EQ(got_q.size(), ref.q.size());
    int bad = 0;
    for (size_t i = 0; i < ref.q.size() && bad < 5; ++i) {
      if (static_cast<uint8_t>(got_q[i]) != ref.q[i]) {
        ++bad;
        ADD_FAILURE() << "q[" << i / n << ", " << i % n << "] = 0x" << std::hex
                      << int{static_cast<uint8_t>(got_q[i])} << ", want 0x" << int{ref.q[i]}
                      << " (x " << x[i] << ")";
      }
    }
    EXPECT_EQ(Download(scale), Bytes(ref.s.data(), ref.s.size() * 4));

    for (DType to : {DType::kBF16, DType::kF32}) {
      const std::string y = absl::StrCat(name, "_y_", DTypeName(to));
      ASSERT_TRUE(CreateFilled(client(), y, shape, to, "line_rev", "S(1)", false, v1::ZEROS).ok());
      // The block comes from quantize; dequantize alone would mean block:128x128.
      absl::StatusOr<v1::CopyResponse> back =
          BlockCopy(dst, y, scale, br == 128 && bc == 128 ? "" : block, true);
      ASSERT_TRUE(back.ok()) << back.status();
      EXPECT_EQ(Version(y), back->dst_version());
      EXPECT_TRUE(Download(y) == Dequantize(ref, m, n, br, bc, to)) << DTypeName(to);
      EXPECT_TRUE(client().DeleteTensor(y).ok());
    }
    for (const std::string& t : {src, dst, scale}) EXPECT_TRUE(client().DeleteTensor(t).ok());
  }
};

TEST_F(BlockQuantCopyTest, LargeBlocksCutAcrossRanks) {
  // 300 rows on 4 ranks: 75 each, so 128-row blocks are cut.
  RoundTrip("big", 300, 260, 128, 128, "line", "S(0)", "grid", "R,S(1)");
}

TEST_F(BlockQuantCopyTest, SmallBlocksManyOfThem) {
  RoundTrip("small", 38, 45, 4, 8, "grid", "S(0),S(1)", "line", "S(1)");
  // A replicated source holds every block whole: nothing is staged.
  RoundTrip("repl", 21, 19, 4, 8, "pair", "R", "trio", "S(0)", /*cut=*/false);
  // A bf16 source: taken to f32 (exactly) before the block's amax and the division.
  RoundTrip("bf16", 38, 45, 4, 8, "line", "S(0)", "grid", "S(1),R", /*cut=*/true, DType::kBF16);
}

TEST_F(BlockQuantCopyTest, WholeBlocksStageNothingAndMoveOneBytePerElement) {
  // 512 rows on 4 ranks: 128 each, every block whole where it is.
  const Shape shape{512, 256};
  std::vector<float> x = Source(512, 256, 128, 128);
  ASSERT_TRUE(Upload("whole_src", &x, shape, "line", "S(0)").ok());
  ASSERT_TRUE(
      CreateFilled(client(), "whole_q", shape, DType::kF8E4M3, "line", "S(1)", false, v1::ZEROS)
          .ok());
  // The scales of S(0) on "line" are where the blocks are: they do not move either.
  ASSERT_TRUE(
      CreateFilled(client(), "whole_s", {4, 2}, DType::kF32, "line", "S(0)", false, v1::ZEROS)
          .ok());
  absl::StatusOr<v1::CopyResponse> r =
      BlockCopy("whole_src", "whole_q", "whole_s", "block:128x128", false);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->block_copy().cut_blocks(), 0);
  EXPECT_EQ(r->block_copy().staged_bytes(), 0);
  EXPECT_TRUE(r->block_copy().stage_group().empty());  // Read in place: no staging group.
  // The same move of an f8_e4m3 tensor: one byte per element that changes rank.
  ASSERT_TRUE(
      CreateFilled(client(), "whole_e4", shape, DType::kF8E4M3, "line", "S(0)", false, v1::ZEROS)
          .ok());
  v1::CopyRequest plain;
  plain.set_src("whole_e4");
  plain.set_dst("whole_q");
  plain.set_wait(true);
  absl::StatusOr<v1::CopyResponse> p = client().Copy(plain);
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(r->block_copy().bytes_moved(), p->plan().bytes_moved());
  EXPECT_EQ(p->plan().bytes_moved(), 512 * 256 * 3 / 4);  // Each rank keeps a quarter.
  for (const char* t : {"whole_src", "whole_q", "whole_s", "whole_e4"}) {
    EXPECT_TRUE(client().DeleteTensor(t).ok());
  }
}

// A model's weight sync to FP8 as one CopyGroup: two block members (one cut across ranks, one
// whole), a plain member with a cast (a 1-d norm, which has no blocks), all committed together;
// then one group dequantizes both back.
TEST_F(BlockQuantCopyTest, GroupQuantizesWithPlainMembersAndDequantizesBack) {
  std::vector<float> a = Source(300, 260, 128, 128), b = Source(64, 48, 16, 16);
  ASSERT_TRUE(Upload("ga", &a, {300, 260}, "line", "S(0)", DType::kBF16).ok());
  ASSERT_TRUE(Upload("gb", &b, {64, 48}, "line", "S(0)", DType::kBF16).ok());
  std::vector<float> norm(96);
  for (size_t i = 0; i < norm.size(); ++i) norm[i] = 0.5f + 0.125f * static_cast<float>(i);
  ASSERT_TRUE(Upload("gn", &norm, {96}, "line", "S(0)").ok());
  for (const auto& [name, shape, dtype, mesh, spec] :
       std::vector<std::tuple<std::string, Shape, DType, std::string, std::string>>{
           {"ga_q", {300, 260}, DType::kF8E4M3, "grid", "R,S(1)"},
           {"ga_s", {3, 3}, DType::kF32, "trio", "R"},
           {"gb_q", {64, 48}, DType::kF8E4M3, "line", "S(1)"},
           {"gb_s", {4, 3}, DType::kF32, "pair", "S(0)"},
           {"gn_h", {96}, DType::kBF16, "grid", "R,R"},
       }) {
    ASSERT_TRUE(CreateFilled(client(), name, shape, dtype, mesh, spec, false, v1::ZEROS).ok())
        << name;
  }
  v1::CopyGroupRequest group;
  auto add = [&group](const std::string& src, const std::string& dst, const std::string& block,
                      const std::string& scale, bool dequantize) {
    v1::CopyPair* p = group.add_copies();
    p->set_src(src);
    p->set_dst(dst);
    p->set_quantize(block);
    p->set_scale(scale);
    p->set_dequantize(dequantize);
  };
  add("ga", "ga_q", "block:128x128", "ga_s", false);
  add("gn", "gn_h", "", "", false);
  add("gb", "gb_q", "block:16x16", "gb_s", false);
  absl::StatusOr<v1::CopyGroupResponse> r = client().CopyGroup(group);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->state(), v1::COMMITTED);
  ASSERT_EQ(r->members_size(), 3);
  EXPECT_FALSE(r->stage_group().empty());
  EXPECT_GT(r->staged_bytes(), 0);  // ga's 128-row blocks are cut by 75-row shards.
  EXPECT_GE(r->bytes_moved(), r->staged_bytes());
  EXPECT_GT(r->lower_bound_bytes(), 0);  // The final group's.
  EXPECT_LE(r->lower_bound_bytes(), r->bytes_moved() - r->staged_bytes());
  const v1::BlockCopyInfo& ia = r->members(0).block_copy();
  const v1::BlockCopyInfo& ib = r->members(2).block_copy();
  EXPECT_GT(ia.cut_blocks(), 0);
  EXPECT_EQ(ib.cut_blocks(), 0);  // 16-row blocks in 16-row shards: read in place.
  EXPECT_EQ(ib.staged_bytes(), 0);
  EXPECT_TRUE(ib.stage_group().empty());
  EXPECT_EQ(ia.stage_group(), r->stage_group());
  EXPECT_FALSE(r->members(1).has_block_copy());
  EXPECT_EQ(ia.bytes_moved() + ib.bytes_moved() + r->members(1).plan().bytes_moved(),
            r->bytes_moved());
  EXPECT_EQ(Version("ga_q"), r->members(0).dst_version());
  EXPECT_EQ(Version("ga_s"), ia.scale_version());
  EXPECT_EQ(Version("gn_h"), r->members(1).dst_version());
  EXPECT_EQ(Version("gb_q"), r->members(2).dst_version());
  EXPECT_EQ(Version("gb_s"), ib.scale_version());

  const Reference ra = Quantize(a, 300, 260, 128, 128), rb = Quantize(b, 64, 48, 16, 16);
  EXPECT_TRUE(Download("ga_q") == Bytes(ra.q.data(), ra.q.size()));
  EXPECT_EQ(Download("ga_s"), Bytes(ra.s.data(), ra.s.size() * 4));
  EXPECT_TRUE(Download("gb_q") == Bytes(rb.q.data(), rb.q.size()));
  EXPECT_EQ(Download("gb_s"), Bytes(rb.s.data(), rb.s.size() * 4));
  std::string norm_bf16(norm.size() * 2, '\0');
  ASSERT_TRUE(Cast(norm.data(), DType::kF32, norm_bf16.data(), DType::kBF16, norm.size()).ok());
  EXPECT_EQ(Download("gn_h"), norm_bf16);

  // Back to bf16 as one group, on other layouts.
  ASSERT_TRUE(
      CreateFilled(client(), "ga_y", {300, 260}, DType::kBF16, "line_rev", "S(1)", false, v1::ZEROS)
          .ok());
  ASSERT_TRUE(
      CreateFilled(client(), "gb_y", {64, 48}, DType::kBF16, "grid", "S(0),S(1)", false, v1::ZEROS)
          .ok());
  v1::CopyGroupRequest back;
  group.Swap(&back);
  add("ga_q", "ga_y", "", "ga_s", true);
  add("gb_q", "gb_y", "block:16x16", "gb_s", true);
  group.Swap(&back);
  absl::StatusOr<v1::CopyGroupResponse> d = client().CopyGroup(back);
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_EQ(Version("ga_y"), d->members(0).dst_version());
  EXPECT_EQ(Version("gb_y"), d->members(1).dst_version());
  EXPECT_TRUE(Download("ga_y") == Dequantize(ra, 300, 260, 128, 128, DType::kBF16));
  EXPECT_TRUE(Download("gb_y") == Dequantize(rb, 64, 48, 16, 16, DType::kBF16));
  for (const char* t : {"ga", "gb", "gn", "ga_q", "ga_s", "gb_q", "gb_s", "gn_h", "ga_y", "gb_y"}) {
    EXPECT_TRUE(client().DeleteTensor(t).ok()) << t;
  }
}

TEST_F(BlockQuantCopyTest, RefusalsChangeNothing) {
  const Shape shape{20, 24};
  ASSERT_TRUE(CreateFilled(client(), "r_src", shape, DType::kF32, "line", "S(0)").ok());
  ASSERT_TRUE(
      CreateFilled(client(), "r_q", shape, DType::kF8E4M3, "grid", "R,S(1)", false, v1::ZEROS)
          .ok());
  ASSERT_TRUE(CreateFilled(client(), "r_bf", shape, DType::kBF16, "line", "R", false).ok());
  ASSERT_TRUE(
      CreateFilled(client(), "r_s", {5, 3}, DType::kF32, "trio", "R", false, v1::ZEROS).ok());
  ASSERT_TRUE(
      CreateFilled(client(), "r_s_bad", {5, 4}, DType::kF32, "trio", "R", false, v1::ZEROS).ok());
  const int64_t vq = Version("r_q"), vbf = Version("r_bf"), vs = Version("r_s");
  struct Case {
    std::string dst, scale, block;
    bool dequantize;
    std::string message;
  };
  for (const Case& c : std::vector<Case>{
           {"r_bf", "r_s", "block:4x8", false, "dst: 'r_bf' is bf16; quantize writes f8_e4m3"},
           {"r_q", "r_s_bad", "block:4x8", false, "scale: 'r_s_bad' is f32 [5, 4]"},
           {"r_q", "r_s", "block:0x8", false, "quantize: "},
           {"r_q", "r_s", "blocks:4x8", false, "quantize: "},
           {"r_q", "r_s", "block:4x8", true, "src: 'r_src' is f32; dequantize reads f8_e4m3"},
           {"r_q", "", "block:4x8", false, "scale: empty"},
       }) {
    absl::StatusOr<v1::CopyResponse> r = BlockCopy("r_src", c.dst, c.scale, c.block, c.dequantize);
    ASSERT_FALSE(r.ok()) << c.message;
    EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument) << r.status();
    EXPECT_THAT(std::string(r.status().message()), HasSubstr(c.message));
  }
  absl::StatusOr<v1::CopyResponse> missing = BlockCopy("r_src", "r_q", "nope", "block:4x8", false);
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kNotFound) << missing.status();
  // In a group, refusals name the member, and a refused group changes nothing either.
  v1::CopyGroupRequest group;
  v1::CopyPair* plain = group.add_copies();
  plain->set_src("r_bf");
  plain->set_dst("r_plain");
  v1::CopyPair* pair = group.add_copies();
  pair->set_src("r_src");
  pair->set_dst("r_q");
  pair->set_quantize("block:4x8");
  pair->set_scale("r_s_bad");
  ASSERT_TRUE(CreateFilled(client(), "r_plain", shape, DType::kF32, "line", "S(1)").ok());
  const int64_t vplain = Version("r_plain");
  absl::StatusOr<v1::CopyGroupResponse> g = client().CopyGroup(group);
  EXPECT_EQ(g.status().code(), absl::StatusCode::kInvalidArgument) << g.status();
  EXPECT_THAT(std::string(g.status().message()), HasSubstr("copies[1].scale: 'r_s_bad'"));
  pair->set_scale("r_bf");  // Also copies[0]'s src.
  g = client().CopyGroup(group);
  EXPECT_EQ(g.status().code(), absl::StatusCode::kInvalidArgument) << g.status();
  EXPECT_THAT(std::string(g.status().message()),
              HasSubstr("copies[1].scale: tensor 'r_bf' is also copies[0].src"));
  pair->set_scale("r_s");
  pair->add_dst_offset(0);
  pair->add_dst_offset(0);
  g = client().CopyGroup(group);
  EXPECT_EQ(g.status().code(), absl::StatusCode::kInvalidArgument) << g.status();
  EXPECT_THAT(std::string(g.status().message()), HasSubstr("copies[1].dst_offset"));
  pair->clear_dst_offset();
  EXPECT_EQ(Version("r_plain"), vplain);
  // Prepared transfers refuse block members.
  // And so do prepared transfers.
  v1::CreateTransferRequest transfer;
  transfer.set_name("r_transfer");
  *transfer.add_copies() = *pair;
  absl::StatusOr<v1::TransferInfo> t = client().CreateTransfer(transfer);
  EXPECT_EQ(t.status().code(), absl::StatusCode::kInvalidArgument) << t.status();
  EXPECT_THAT(std::string(t.status().message()), HasSubstr("copies[0].quantize"));
  EXPECT_EQ(Version("r_q"), vq);
  EXPECT_EQ(Version("r_bf"), vbf);
  EXPECT_EQ(Version("r_s"), vs);
  for (const char* t : {"r_src", "r_q", "r_bf", "r_s", "r_s_bad", "r_plain"}) {
    EXPECT_TRUE(client().DeleteTensor(t).ok());
  }
}

}  // namespace
}  // namespace shardcoord
