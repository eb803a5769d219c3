// The per-thread code of kernels.cu's cast, block quantize and block dequantize kernels,
// run here on the host in the kernels' order (element offsets of an element-unit box
// geometry, the block index math of block_quant_geometry.h, sharding/cast_bits.h's element
// steps) and compared bitwise with sharding/cast.h and sharding/block_quant.h. With the
// shared element code this is what makes the kernels equal the host; tests/gpu/
// cast_kernels_test runs the kernels themselves where there is a GPU.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "sharding/block_quant.h"
#include "sharding/box.h"
#include "sharding/cast.h"
#include "sharding/cast_bits.h"
#include "sharding/dtype.h"
#include "worker/comm/nccl/block_quant_geometry.h"
#include "worker/comm/nccl/box_geometry.h"
#include "worker/comm/nccl/box_geometry_builder.h"
#include "worker/testing/cast_test_data.h"
#include "worker/testing/random_bytes.h"

namespace shardcoord {
namespace nccl {
namespace {

using Bytes = std::vector<unsigned char>;
using testing_util::QuantSource;
using testing_util::RandomBox;
using testing_util::RandomBytes;
using testing_util::RandomSubBox;

// CastKernel's loop, one iteration per element.
void EmulateCastKernel(const BoxCopyGeometry& g, DType from, DType to, const unsigned char* src,
                       unsigned char* dst) {
  const int f = static_cast<int>(from), t = static_cast<int>(to);
  const int is = cast_bits::ElementBytes(f), os = cast_bits::ElementBytes(t);
  for (int64_t e = 0; e < ElementCount(g); ++e) {
    int64_t s, d;
    ElementOffsets(g, e, &s, &d);
    cast_bits::StoreElement(dst + d * os, os,
                            cast_bits::CastElement(cast_bits::LoadElement(src + s * is, is), f, t));
  }
}

TEST(CastKernelMathTest, CastOverStridedBoxesMatchesCastBox) {
  std::vector<std::pair<DType, DType>> pairs;
  for (DType from : AllDTypes()) {
    for (DType to : AllDTypes()) {
      if (from != to && CastAllowed(from, to)) pairs.push_back({from, to});
    }
  }
  std::mt19937 rng(11);
  for (int iter = 0; iter < 4 * static_cast<int>(pairs.size()); ++iter) {
    const auto [from, to] = pairs[iter % pairs.size()];
    const int ndim = 1 + static_cast<int>(rng() % 4);
    const Box src_box = RandomBox(ndim, rng, 9);
    const Box region = RandomSubBox(src_box, rng);
    Shape off(ndim), shape(ndim);
    for (int d = 0; d < ndim; ++d) {
      const int64_t before = std::min<int64_t>(rng() % 3, region.offset(d));
      off[d] = region.offset(d) - before;
      shape[d] = region.shape(d) + before + static_cast<int64_t>(rng() % 3);
    }
    const Box dst_box(off, shape);
    SCOPED_TRACE(absl::StrCat(DTypeName(from), " -> ", DTypeName(to), " region ", region.ToString(),
                              " of ", src_box.ToString(), " into ", dst_box.ToString()));
    const Bytes src = RandomBytes(static_cast<size_t>(src_box.Volume() * ElementSize(from)), rng);
    Bytes want = RandomBytes(static_cast<size_t>(dst_box.Volume() * ElementSize(to)), rng);
    Bytes got = want;
    ASSERT_TRUE(CastBox(region, src.data(), src_box, from, want.data(), dst_box, to).ok());
    absl::StatusOr<BoxCopyGeometry> g = MakeBoxCopyGeometry(region, src_box, dst_box, 1);
    ASSERT_TRUE(g.ok()) << g.status();
    EmulateCastKernel(*g, from, to, src.data(), got.data());
    EXPECT_TRUE(want == got);
  }
}

// QuantizeKernel: per scale block, the amax over its elements, then its elements; and
// DequantizeKernel: per element, its block's scale.
void EmulateQuantizeKernel(const BlockQuantGeometry& g, DType from, const unsigned char* src,
                           unsigned char* dst, float* scales) {
  const int f = static_cast<int>(from), es = cast_bits::ElementBytes(f);
  for (int64_t b = 0; b < ScaleBlockCount(g); ++b) {
    const QuantBlock qb = QuantBlockAt(g, b);
    uint32_t amax = 0;
    for (int64_t i = 0; i < qb.count; ++i) {
      const int64_t e = QuantBlockElement(g, qb, i);
      amax =
          cast_bits::AmaxWith(amax, cast_bits::ToF32(cast_bits::LoadElement(src + e * es, es), f));
    }
    const float s = cast_bits::BlockScale(amax);
    scales[b] = s;
    for (int64_t i = 0; i < qb.count; ++i) {
      const int64_t e = QuantBlockElement(g, qb, i);
      dst[e] =
          cast_bits::QuantizeE4M3(cast_bits::ToF32(cast_bits::LoadElement(src + e * es, es), f), s);
    }
  }
}

void EmulateDequantizeKernel(const BlockQuantGeometry& g, const unsigned char* src,
                             const float* scales, DType to, unsigned char* dst) {
  const int t = static_cast<int>(to), es = cast_bits::ElementBytes(t);
  for (int64_t e = 0; e < g.outer * g.m * g.n; ++e) {
    const float y = cast_bits::DequantizeE4M3(src[e], scales[ScaleIndexOf(g, e)]);
    cast_bits::StoreElement(dst + e * es, es,
                            cast_bits::CastElement(cast_bits::F32Bits(y), cast_bits::kF32, t));
  }
}

TEST(CastKernelMathTest, BlockQuantizationMatchesTheHost) {
  struct Case {
    Shape shape;
    BlockSize block;
  };
  const Case cases[] = {
      {{1, 1}, {128, 128}},        {{3, 5}, {2, 2}},     {{5, 7}, {3, 4}},
      {{2, 130, 257}, {128, 128}}, {{4, 300}, {1, 128}}, {{2, 3, 33, 17}, {16, 8}},
  };
  const DType floats[] = {DType::kF32, DType::kBF16,   DType::kF16,
                          DType::kF64, DType::kF8E5M2, DType::kF8E4M3};
  std::mt19937 rng(448);
  for (const Case& c : cases) {
    for (DType from : floats) {
      SCOPED_TRACE(absl::StrCat(DTypeName(from), " ", BlockQuantizationText(c.block)));
      const Bytes src = QuantSource(from, c.shape, c.block, rng);
      const int64_t n = static_cast<int64_t>(src.size()) / ElementSize(from);
      absl::StatusOr<BlockQuantGeometry> g = MakeBlockQuantGeometry(from, c.shape, c.block, "src");
      ASSERT_TRUE(g.ok()) << g.status();
      const int64_t blocks = ScaleBlockCount(*g);
      Bytes want_q(static_cast<size_t>(n)), got_q(want_q.size());
      std::vector<float> want_s(static_cast<size_t>(blocks)), got_s(want_s.size());
      ASSERT_TRUE(
          QuantizeBlocks(src.data(), from, c.shape, c.block, want_q.data(), want_s.data()).ok());
      EmulateQuantizeKernel(*g, from, src.data(), got_q.data(), got_s.data());
      EXPECT_EQ(0, std::memcmp(want_s.data(), got_s.data(), want_s.size() * 4));
      EXPECT_TRUE(want_q == got_q);
      for (DType to : floats) {
        SCOPED_TRACE(absl::StrCat("to ", DTypeName(to)));
        Bytes want_y(static_cast<size_t>(n * ElementSize(to))), got_y(want_y.size());
        ASSERT_TRUE(
            DequantizeBlocks(want_q.data(), want_s.data(), c.shape, c.block, want_y.data(), to)
                .ok());
        EmulateDequantizeKernel(*g, want_q.data(), want_s.data(), to, got_y.data());
        EXPECT_TRUE(want_y == got_y);
      }
    }
  }
}

TEST(CastKernelMathTest, BlockQuantGeometryChecks) {
  EXPECT_FALSE(MakeBlockQuantGeometry(DType::kI32, {2, 2}, {}, "src").ok());
  EXPECT_FALSE(MakeBlockQuantGeometry(DType::kF8E8M0, {2, 2}, {}, "dst").ok());
  EXPECT_FALSE(MakeBlockQuantGeometry(DType::kF32, {4}, {}, "src").ok());
  EXPECT_FALSE(MakeBlockQuantGeometry(DType::kF32, {4, 4}, {0, 1}, "src").ok());
  absl::StatusOr<BlockQuantGeometry> g =
      MakeBlockQuantGeometry(DType::kBF16, {2, 3, 130, 257}, {128, 128}, "src");
  ASSERT_TRUE(g.ok());
  EXPECT_EQ(g->outer, 6);
  EXPECT_EQ(g->row_blocks, 2);
  EXPECT_EQ(g->col_blocks, 3);
  EXPECT_EQ(ScaleBlockCount(*g), 36);
}

}  // namespace
}  // namespace nccl
}  // namespace shardcoord
