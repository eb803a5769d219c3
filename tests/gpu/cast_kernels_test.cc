// The cast, block quantize and block dequantize kernels against the host code, bit for bit:
// every bit pattern of every 8/16-bit float source, random f32/f64 with special values and
// rounding ties, integer widening, strided boxes, the CUDA memory space's CastBox, and block
// quantization over uneven shapes with special values and all-zero blocks. Skips without a GPU.
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "gtest/gtest.h"
#include "sharding/block_quant.h"
#include "sharding/box.h"
#include "sharding/cast.h"
#include "sharding/dtype.h"
#include "tests/gpu/gpu_test_util.h"
#include "worker/comm/nccl/cuda_memory_space.h"
#include "worker/comm/nccl/device_buffer.h"
#include "worker/comm/nccl/device_ops.h"
#include "worker/testing/cast_test_data.h"

namespace shardcoord {
namespace nccl {
namespace {

using Bytes = std::vector<unsigned char>;
using testing_util::QuantSource;
using testing_util::RandomBox;
using testing_util::RandomSubBox;

// Holds one allocation of at least one byte (DeviceBuffer gives no memory for 0 bytes).
DeviceBuffer Upload(const Bytes& host) {
  absl::StatusOr<DeviceBuffer> b =
      DeviceBuffer::Allocate(std::max<int64_t>(1, static_cast<int64_t>(host.size())), 0);
  EXPECT_TRUE(b.ok()) << b.status();
  if (!host.empty()) {
    EXPECT_TRUE(b->CopyFromHost(host.data(), static_cast<int64_t>(host.size())).ok());
  }
  return std::move(*b);
}

Bytes Download(const DeviceBuffer& b, int64_t bytes) {
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  Bytes host(static_cast<size_t>(bytes));
  if (bytes > 0) {
    EXPECT_TRUE(b.CopyToHost(host.data(), bytes).ok());
  }
  return host;
}

template <typename T>
Bytes AsBytes(const std::vector<T>& v) {
  Bytes b(v.size() * sizeof(T));
  std::memcpy(b.data(), v.data(), b.size());
  return b;
}

// The first differing element, for a readable failure (a whole-buffer EXPECT_EQ prints MiBs).
std::string FirstDifference(const Bytes& src, int64_t src_size, const Bytes& want, const Bytes& got,
                            int64_t out_size) {
  for (size_t i = 0; i < want.size(); i += static_cast<size_t>(out_size)) {
    if (std::memcmp(&want[i], &got[i], static_cast<size_t>(out_size)) != 0) {
      uint64_t s = 0, w = 0, g = 0;
      const size_t e = i / static_cast<size_t>(out_size);
      if (!src.empty()) std::memcpy(&s, &src[e * src_size], static_cast<size_t>(src_size));
      std::memcpy(&w, &want[i], static_cast<size_t>(out_size));
      std::memcpy(&g, &got[i], static_cast<size_t>(out_size));
      return absl::StrCat("element ", e, ": source bits 0x", absl::Hex(s), " host 0x", absl::Hex(w),
                          " device 0x", absl::Hex(g));
    }
  }
  return "";
}

class CastKernelsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    SHARDCOORD_SKIP_WITHOUT_GPU();
    ASSERT_EQ(cudaSetDevice(0), cudaSuccess);
    ASSERT_EQ(cudaStreamCreate(&stream_), cudaSuccess);
  }
  void TearDown() override {
    if (stream_ != nullptr) cudaStreamDestroy(stream_);
  }

  // Casts the `src` elements of `from` to every dtype they may be cast to, on the host and on
  // the device (a contiguous 1-D box), and compares the bytes.
  void CheckAllTargets(const Bytes& src, DType from) {
    const int64_t is = ElementSize(from);
    const int64_t n = static_cast<int64_t>(src.size()) / is;
    const Box box({0}, {n});
    DeviceBuffer d_src = Upload(src);
    for (DType to : AllDTypes()) {
      if (to == from || !CastAllowed(from, to)) continue;
      SCOPED_TRACE(absl::StrCat(DTypeName(from), " -> ", DTypeName(to)));
      const int64_t os = ElementSize(to);
      Bytes want(static_cast<size_t>(n * os));
      ASSERT_TRUE(Cast(src.data(), from, want.data(), to, n).ok());
      DeviceBuffer d_dst = Upload(Bytes(want.size(), 0xA5));
      ASSERT_TRUE(DeviceCastBox(box, d_src.data(), box, from, d_dst.data(), box, to, stream_).ok());
      const Bytes got = Download(d_dst, n * os);
      EXPECT_TRUE(want == got) << FirstDifference(src, is, want, got, os);
    }
  }

  cudaStream_t stream_ = nullptr;
};

TEST_F(CastKernelsTest, EveryBitPatternOfNarrowFloats) {
  for (DType from : {DType::kF16, DType::kBF16, DType::kF8E4M3, DType::kF8E5M2, DType::kF8E8M0}) {
    const int64_t size = ElementSize(from);
    const uint64_t count = uint64_t{1} << (8 * size);
    Bytes src(static_cast<size_t>(count * size));
    for (uint64_t i = 0; i < count; ++i) std::memcpy(&src[i * size], &i, static_cast<size_t>(size));
    CheckAllTargets(src, from);
  }
}

// Random bit patterns of a `bits`-wide float with `man` mantissa bits: uniform patterns (mostly
// huge or tiny magnitudes), patterns with exponents near 1 (where f8 targets are finite),
// rounding ties for every narrower target, subnormals, and the special values.
template <typename U>
std::vector<U> WideFloatPatterns(int man, int bias, std::mt19937_64& rng) {
  const int exp_bits = static_cast<int>(8 * sizeof(U)) - 1 - man;
  const U exp_all = (U{1} << exp_bits) - 1;
  const U man_mask = (U{1} << man) - 1;
  const U sign = U{1} << (8 * sizeof(U) - 1);
  std::vector<U> v;
  for (int i = 0; i < 200000; ++i) v.push_back(static_cast<U>(rng()));
  for (int i = 0; i < 200000; ++i) {
    const U e = static_cast<U>(bias - 30 + static_cast<int>(rng() % 50));
    v.push_back((static_cast<U>(rng()) & (sign | man_mask)) | (e << man));
  }
  // Ties: the dropped bits exactly half an ulp of a target with t mantissa bits (f32, f16,
  // bf16, e4m3, e5m2), at exponents the target holds as normals or subnormals.
  for (int t : {23, 10, 7, 3, 2}) {
    if (t >= man) continue;
    const int dropped = man - t;
    for (int i = 0; i < 20000; ++i) {
      const U e = static_cast<U>(bias - 25 + static_cast<int>(rng() % 45));
      U x = (static_cast<U>(rng()) & (sign | man_mask)) | (e << man);
      x = (x & ~((U{1} << dropped) - 1)) | (U{1} << (dropped - 1));
      v.push_back(x);
    }
  }
  for (int i = 0; i < 20000; ++i) v.push_back(static_cast<U>(rng()) & (sign | man_mask));
  const U inf = exp_all << man;
  for (U s : {U{0}, sign}) {
    v.push_back(s);                                      // Zero.
    v.push_back(s | 1);                                  // Smallest subnormal.
    v.push_back(s | man_mask);                           // Largest subnormal.
    v.push_back(s | inf);                                // Infinity.
    v.push_back(s | inf | 1);                            // Signalling NaN, payload 1.
    v.push_back(s | inf | (U{1} << (man - 1)));          // Quiet NaN.
    v.push_back(s | inf | man_mask);                     // NaN, full payload.
    v.push_back(s | (inf - 1));                          // Largest finite.
    v.push_back(s | (static_cast<U>(bias + 8) << man));  // 448 (2^8 * 1.75 is below).
  }
  return v;
}

TEST_F(CastKernelsTest, RandomF32AndF64WithSpecialsAndTies) {
  std::mt19937_64 rng(2028);
  CheckAllTargets(AsBytes(WideFloatPatterns<uint32_t>(23, 127, rng)), DType::kF32);
  CheckAllTargets(AsBytes(WideFloatPatterns<uint64_t>(52, 1023, rng)), DType::kF64);
}

TEST_F(CastKernelsTest, IntegerWidening) {
  std::mt19937_64 rng(5);
  for (DType from : AllDTypes()) {
    if (IsFloat(from)) continue;
    Bytes src(static_cast<size_t>(4096 * ElementSize(from)));
    for (auto& b : src) b = static_cast<unsigned char>(rng());
    CheckAllTargets(src, from);
  }
}

// CastBox between strided boxes: a region of one chunk into another; the destination's other
// elements must stay as they were.
TEST_F(CastKernelsTest, StridedBoxesMatchCastBox) {
  struct Pair {
    DType from, to;
  };
  const Pair pairs[] = {{DType::kF32, DType::kBF16},   {DType::kBF16, DType::kF32},
                        {DType::kF64, DType::kF8E4M3}, {DType::kF8E5M2, DType::kF16},
                        {DType::kI8, DType::kI64},     {DType::kF8E8M0, DType::kF64}};
  std::mt19937 rng(77);
  for (int iter = 0; iter < 120; ++iter) {
    const Pair& p = pairs[iter % 6];
    const int ndim = 1 + static_cast<int>(rng() % 4);
    const Box src_box = RandomBox(ndim, rng, 9);
    const Box region = RandomSubBox(src_box, rng);
    // The destination chunk holds the region with some margin around it.
    Shape off(ndim), shape(ndim);
    for (int d = 0; d < ndim; ++d) {
      const int64_t before = std::min<int64_t>(rng() % 3, region.offset(d));
      off[d] = region.offset(d) - before;
      shape[d] = region.shape(d) + before + static_cast<int64_t>(rng() % 3);
    }
    const Box dst_box(off, shape);
    SCOPED_TRACE(absl::StrCat(DTypeName(p.from), " -> ", DTypeName(p.to), " region ",
                              region.ToString(), " of ", src_box.ToString(), " into ",
                              dst_box.ToString()));
    Bytes src(static_cast<size_t>(src_box.Volume() * ElementSize(p.from)));
    for (auto& b : src) b = static_cast<unsigned char>(rng());
    Bytes want(static_cast<size_t>(dst_box.Volume() * ElementSize(p.to)));
    for (auto& b : want) b = static_cast<unsigned char>(rng());
    DeviceBuffer d_src = Upload(src), d_dst = Upload(want);
    ASSERT_TRUE(CastBox(region, src.data(), src_box, p.from, want.data(), dst_box, p.to).ok());
    ASSERT_TRUE(
        DeviceCastBox(region, d_src.data(), src_box, p.from, d_dst.data(), dst_box, p.to, stream_)
            .ok());
    const Bytes got = Download(d_dst, static_cast<int64_t>(want.size()));
    EXPECT_TRUE(want == got) << FirstDifference({}, 0, want, got, ElementSize(p.to));
  }
}

TEST_F(CastKernelsTest, RefusedCastsAreRefused) {
  const Box box({0}, {4});
  DeviceBuffer a = Upload(Bytes(32, 0)), b = Upload(Bytes(32, 0));
  absl::Status s =
      DeviceCastBox(box, a.data(), box, DType::kF32, b.data(), box, DType::kI32, stream_);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
}

// The device memory space converts with the kernel, with the bytes of the host space.
TEST_F(CastKernelsTest, CudaMemorySpaceCastBox) {
  absl::StatusOr<std::unique_ptr<CudaMemorySpace>> space = CudaMemorySpace::Create(0);
  ASSERT_TRUE(space.ok()) << space.status();
  std::mt19937_64 rng(3);
  const std::vector<uint32_t> values = WideFloatPatterns<uint32_t>(23, 127, rng);
  const Bytes src = AsBytes(std::vector<uint32_t>(values.begin(), values.begin() + 60 * 70));
  const Box chunk({0, 0}, {60, 70}), region({5, 3}, {50, 61});
  Bytes want(static_cast<size_t>(region.Volume() * 2));
  ASSERT_TRUE(
      CastBox(region, src.data(), chunk, DType::kF32, want.data(), region, DType::kBF16).ok());
  Allocation in = *(*space)->Allocate(static_cast<int64_t>(src.size()));
  Allocation out = *(*space)->Allocate(static_cast<int64_t>(want.size()));
  ASSERT_TRUE((*space)->CopyFromHost(in.data, src.data(), static_cast<int64_t>(src.size())).ok());
  ASSERT_TRUE(
      (*space)->CastBox(region, in.data, chunk, DType::kF32, out.data, region, DType::kBF16).ok());
  Bytes got(want.size());
  ASSERT_TRUE((*space)->CopyToHost(got.data(), out.data, static_cast<int64_t>(got.size())).ok());
  EXPECT_TRUE(want == got) << FirstDifference({}, 0, want, got, 2);
  (*space)->Free(in);
  (*space)->Free(out);
}

TEST_F(CastKernelsTest, BlockQuantizeAndDequantizeMatchTheHost) {
  struct Case {
    Shape shape;
    BlockSize block;
  };
  const Case cases[] = {
      {{1, 1}, {128, 128}},        {{3, 5}, {2, 2}},     {{5, 7}, {3, 4}},
      {{2, 130, 257}, {128, 128}}, {{4, 300}, {1, 128}}, {{2, 3, 33, 17}, {16, 8}},
      {{256, 384}, {128, 128}},
  };
  std::mt19937 rng(448);
  for (const Case& c : cases) {
    for (DType from :
         {DType::kF32, DType::kBF16, DType::kF16, DType::kF64, DType::kF8E5M2, DType::kF8E4M3}) {
      SCOPED_TRACE(absl::StrCat(DTypeName(from), " [", absl::StrJoin(c.shape, ", "), "] ",
                                BlockQuantizationText(c.block)));
      const Bytes src = QuantSource(from, c.shape, c.block, rng);
      const int64_t n = static_cast<int64_t>(src.size()) / ElementSize(from);
      const Shape scale_shape = *BlockScaleShape(c.shape, c.block);
      int64_t blocks = 1;
      for (int64_t d : scale_shape) blocks *= d;
      Bytes want_q(static_cast<size_t>(n));
      std::vector<float> want_s(static_cast<size_t>(blocks));
      ASSERT_TRUE(
          QuantizeBlocks(src.data(), from, c.shape, c.block, want_q.data(), want_s.data()).ok());
      DeviceBuffer d_src = Upload(src), d_q = Upload(Bytes(want_q.size(), 0xA5)),
                   d_s = Upload(Bytes(want_s.size() * 4, 0xA5));
      ASSERT_TRUE(DeviceQuantizeBlocks(d_src.data(), from, c.shape, c.block, d_q.data(),
                                       static_cast<float*>(d_s.data()), stream_)
                      .ok());
      const Bytes got_q = Download(d_q, n), got_s = Download(d_s, blocks * 4);
      EXPECT_TRUE(AsBytes(want_s) == got_s) << FirstDifference({}, 0, AsBytes(want_s), got_s, 4);
      EXPECT_TRUE(want_q == got_q) << FirstDifference(src, ElementSize(from), want_q, got_q, 1);

      for (DType to :
           {DType::kF32, DType::kBF16, DType::kF16, DType::kF64, DType::kF8E5M2, DType::kF8E4M3}) {
        SCOPED_TRACE(absl::StrCat("dequantize to ", DTypeName(to)));
        Bytes want_y(static_cast<size_t>(n * ElementSize(to)));
        ASSERT_TRUE(
            DequantizeBlocks(want_q.data(), want_s.data(), c.shape, c.block, want_y.data(), to)
                .ok());
        DeviceBuffer d_y = Upload(Bytes(want_y.size(), 0xA5));
        ASSERT_TRUE(DeviceDequantizeBlocks(d_q.data(), static_cast<const float*>(d_s.data()),
                                           c.shape, c.block, d_y.data(), to, stream_)
                        .ok());
        const Bytes got_y = Download(d_y, static_cast<int64_t>(want_y.size()));
        EXPECT_TRUE(want_y == got_y) << FirstDifference(want_q, 1, want_y, got_y, ElementSize(to));
      }
    }
  }
}

TEST_F(CastKernelsTest, BlockQuantizationRefusals) {
  DeviceBuffer a = Upload(Bytes(64, 0)), b = Upload(Bytes(64, 0)), s = Upload(Bytes(64, 0));
  EXPECT_EQ(DeviceQuantizeBlocks(a.data(), DType::kI32, {2, 2}, {}, b.data(),
                                 static_cast<float*>(s.data()), stream_)
                .code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(DeviceQuantizeBlocks(a.data(), DType::kF32, {4}, {}, b.data(),
                                 static_cast<float*>(s.data()), stream_)
                .code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(DeviceDequantizeBlocks(a.data(), static_cast<const float*>(s.data()), {2, 2}, {},
                                   b.data(), DType::kF8E8M0, stream_)
                .code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace nccl
}  // namespace shardcoord
