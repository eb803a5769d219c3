// The CUDA kernels against the host code they mirror: box pack/unpack/copy against
// sharding/box_copy.h, reductions bitwise against ReduceIntoBox, the device checksum
// against worker/buffers/checksum.h. Skips without a GPU.
#include <cuda_runtime_api.h>

#include <cstring>
#include <random>
#include <vector>

#include "gtest/gtest.h"
#include "sharding/box.h"
#include "sharding/box_copy.h"
#include "sharding/dtype.h"
#include "sharding/placement.h"
#include "tests/gpu/gpu_test_util.h"
#include "worker/buffers/checksum.h"
#include "worker/comm/nccl/device_buffer.h"
#include "worker/comm/nccl/device_ops.h"
#include "worker/comm/nccl/reduce_ops.h"
#include "worker/testing/cast_test_data.h"
#include "worker/testing/random_bytes.h"

namespace shardcoord {
namespace nccl {
namespace {

using testing_util::RandomBox;
using testing_util::RandomBytes;
using testing_util::RandomSubBox;

DeviceBuffer Upload(const std::vector<unsigned char>& host) {
  absl::StatusOr<DeviceBuffer> b = DeviceBuffer::Allocate(static_cast<int64_t>(host.size()), 0);
  EXPECT_TRUE(b.ok()) << b.status();
  EXPECT_TRUE(b->CopyFromHost(host.data(), static_cast<int64_t>(host.size())).ok());
  return std::move(*b);
}

std::vector<unsigned char> Download(const DeviceBuffer& b) {
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  std::vector<unsigned char> host(static_cast<size_t>(b.bytes()));
  EXPECT_TRUE(b.CopyToHost(host.data(), b.bytes()).ok());
  return host;
}

class KernelsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    SHARDCOORD_SKIP_WITHOUT_GPU();
    ASSERT_EQ(cudaSetDevice(0), cudaSuccess);
    ASSERT_EQ(cudaStreamCreate(&stream_), cudaSuccess);
  }
  void TearDown() override {
    if (stream_ != nullptr) cudaStreamDestroy(stream_);
  }
  cudaStream_t stream_ = nullptr;
};

TEST_F(KernelsTest, PackAndUnpackMatchTheHost) {
  std::mt19937 rng(99);
  for (int iter = 0; iter < 300; ++iter) {
    const int ndim = 1 + static_cast<int>(rng() % 5);
    const int64_t esize = std::vector<int64_t>{1, 2, 4, 8, 16, 3}[rng() % 6];
    const Box chunk_box = RandomBox(ndim, rng, ndim <= 2 ? 40 : 9);
    const Box region = RandomSubBox(chunk_box, rng);
    const std::vector<unsigned char> chunk = RandomBytes(chunk_box.Volume() * esize, rng);
    std::vector<unsigned char> want(region.Volume() * esize);
    ASSERT_TRUE(PackBox(region, chunk.data(), chunk_box, want.data(), esize).ok());

    DeviceBuffer d_chunk = Upload(chunk);
    DeviceBuffer d_packed = Upload(std::vector<unsigned char>(want.size(), 0xEE));
    ASSERT_TRUE(
        DevicePackBox(region, d_chunk.data(), chunk_box, d_packed.data(), esize, stream_).ok());
    ASSERT_EQ(Download(d_packed), want)
        << "pack " << region.ToString() << " of " << chunk_box.ToString() << " esize " << esize;

    const std::vector<unsigned char> fresh = RandomBytes(want.size(), rng);
    std::vector<unsigned char> want_chunk = chunk;
    ASSERT_TRUE(UnpackBox(region, fresh.data(), want_chunk.data(), chunk_box, esize).ok());
    DeviceBuffer d_fresh = Upload(fresh);
    ASSERT_TRUE(
        DeviceUnpackBox(region, d_fresh.data(), d_chunk.data(), chunk_box, esize, stream_).ok());
    ASSERT_EQ(Download(d_chunk), want_chunk) << "unpack " << region.ToString();
  }
}

TEST_F(KernelsTest, ChunkToChunkCopiesMatchTheHost) {
  std::mt19937 rng(5);
  int checked = 0;
  for (int iter = 0; iter < 300; ++iter) {
    const int ndim = 1 + static_cast<int>(rng() % 4);
    const Box a = RandomBox(ndim, rng, 12);
    const Box b = RandomBox(ndim, rng, 12);
    if (a.Intersect(b).Empty()) continue;
    const Box region = RandomSubBox(a.Intersect(b), rng);
    const std::vector<unsigned char> src = RandomBytes(a.Volume() * 2, rng);
    std::vector<unsigned char> want = RandomBytes(b.Volume() * 2, rng);
    DeviceBuffer d_src = Upload(src);
    DeviceBuffer d_dst = Upload(want);
    ASSERT_TRUE(CopyBox(region, src.data(), a, want.data(), b, 2).ok());
    ASSERT_TRUE(DeviceCopyBox(region, d_src.data(), a, d_dst.data(), b, 2, stream_).ok());
    ASSERT_EQ(Download(d_dst), want) << region.ToString();
    ++checked;
  }
  EXPECT_GT(checked, 50);
}

TEST_F(KernelsTest, ReductionsAreBitwiseEqualToTheHost) {
  std::mt19937 rng(17);
  for (DType dtype : {DType::kF32, DType::kF64, DType::kF16, DType::kBF16, DType::kI8, DType::kU8,
                      DType::kI32, DType::kI64}) {
    const int64_t esize = ElementSize(dtype);
    for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kMin, ReduceOp::kMax}) {
      for (int iter = 0; iter < 20; ++iter) {
        const Box src_box = RandomBox(3, rng, 10);
        const Box dst_box = RandomBox(3, rng, 10);
        if (src_box.Intersect(dst_box).Empty()) continue;
        const Box region = src_box.Intersect(dst_box);
        const std::vector<unsigned char> src = RandomBytes(src_box.Volume() * esize, rng);
        std::vector<unsigned char> want = RandomBytes(dst_box.Volume() * esize, rng);
        DeviceBuffer d_src = Upload(src);
        DeviceBuffer d_dst = Upload(want);
        ASSERT_TRUE(
            ReduceIntoBox(region, src.data(), src_box, want.data(), dst_box, dtype, op).ok());
        ASSERT_TRUE(DeviceReduceIntoBox(region, d_src.data(), src_box, d_dst.data(), dst_box, dtype,
                                        op, stream_)
                        .ok());
        const std::vector<unsigned char> got = Download(d_dst);
        for (size_t i = 0; i < got.size(); i += esize) {
          // A NaN made by a float sum has no specified payload (GPUs return the canonical
          // NaN); every other result, min/max NaNs included, is bitwise the host's.
          const int d = static_cast<int>(dtype);
          if (op == ReduceOp::kSum && DevIsNaNElement(d, &got[i]) && DevIsNaNElement(d, &want[i])) {
            continue;
          }
          ASSERT_EQ(std::memcmp(&got[i], &want[i], esize), 0)
              << DTypeName(dtype) << " " << ReduceOpName(op) << " element " << i / esize;
        }
      }
    }
  }
}

TEST_F(KernelsTest, DeviceChecksumEqualsHostChecksum) {
  std::mt19937 rng(3);
  const int64_t mib = kChecksumBlockBytes;
  const std::vector<unsigned char> data = RandomBytes(static_cast<size_t>(9 * mib + 64), rng);
  DeviceBuffer d = Upload(data);
  // Offsets: aligned, odd (the byte-wise loop) and 8-aligned; sizes around the kernel's
  // 256-byte load groups, the 32-byte stripes and the 1 MiB blocks.
  for (int64_t offset : {int64_t{0}, int64_t{1}, int64_t{8}, int64_t{24}}) {
    for (int64_t n : {int64_t{0}, int64_t{1}, int64_t{31}, int64_t{32}, int64_t{255}, int64_t{256},
                      int64_t{257}, int64_t{1000}, int64_t{4133}, mib - 1, mib, mib + 1, mib + 256,
                      5 * mib + 3, 9 * mib}) {
      absl::StatusOr<uint64_t> got =
          DeviceChunkChecksum(static_cast<const char*>(d.data()) + offset, n, stream_);
      ASSERT_TRUE(got.ok()) << got.status();
      EXPECT_EQ(*got, ChunkChecksum(data.data() + offset, n)) << "offset " << offset << " n " << n;
    }
  }
}

TEST_F(KernelsTest, ChecksumsOfManyRegionsInOneLaunch) {
  std::mt19937 rng(4);
  const int64_t mib = kChecksumBlockBytes;
  const std::vector<unsigned char> data = RandomBytes(static_cast<size_t>(6 * mib + 64), rng);
  DeviceBuffer d = Upload(data);
  const char* base = static_cast<const char*>(d.data());
  // Empty regions first, between and last; odd and aligned offsets; overlapping regions;
  // regions of one and of several blocks.
  const std::vector<std::pair<int64_t, int64_t>> spans = {
      {0, 0},     {0, 1000}, {3, mib + 5},      {5, 0},          {8, 2 * mib}, {64, 3 * mib},
      {mib, 256}, {1, 31},   {0, 6 * mib + 64}, {2 * mib + 7, 0}};
  std::vector<ChecksumRegion> regions;
  for (const auto& [offset, n] : spans) regions.push_back({base + offset, n});
  absl::StatusOr<std::vector<uint64_t>> got = DeviceChunkChecksums(regions, stream_);
  ASSERT_TRUE(got.ok()) << got.status();
  ASSERT_EQ(got->size(), spans.size());
  for (size_t i = 0; i < spans.size(); ++i) {
    EXPECT_EQ((*got)[i], ChunkChecksum(data.data() + spans[i].first, spans[i].second))
        << "region " << i;
  }
  EXPECT_TRUE(DeviceChunkChecksums({}, stream_)->empty());
  const std::vector<ChecksumRegion> bad = {{base, 8}, {base, -8}};
  EXPECT_EQ(DeviceChunkChecksums(bad, stream_).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST_F(KernelsTest, InvalidArgumentsAreCheckedBeforeLaunching) {
  absl::Status s = DevicePackBox(Box({0}, {5}), nullptr, Box({0}, {4}), nullptr, 4, stream_);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  s = DeviceReduceIntoBox(Box({0}, {4}), nullptr, Box({0}, {4}), nullptr, Box({0}, {4}),
                          DType::kF32, ReduceOp::kAvg, stream_);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace nccl
}  // namespace shardcoord
