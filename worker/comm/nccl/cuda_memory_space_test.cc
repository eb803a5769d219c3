#include "worker/comm/nccl/cuda_memory_space.h"

#include <limits>
#include <vector>

#include "gtest/gtest.h"
#include "sharding/box.h"
#include "worker/buffers/checksum.h"
#include "worker/comm/nccl/gpu_probe.h"
#include "worker/memory/memory_space.h"

namespace shardcoord {
namespace nccl {
namespace {

TEST(CudaMemorySpaceTest, WithoutAGpuCreationFailsCleanly) {
  if (VisibleCudaDevices().ok()) GTEST_SKIP() << "a CUDA device is visible";
  absl::StatusOr<std::unique_ptr<CudaMemorySpace>> space = CudaMemorySpace::Create(0);
  ASSERT_FALSE(space.ok());
  EXPECT_EQ(space.status().code(), absl::StatusCode::kFailedPrecondition) << space.status();
  EXPECT_EQ(space.status().message().rfind("creating the stream of cuda:0: ", 0), 0u)
      << space.status();
}

// The same sequence of operations in device and host memory gives the same bytes and
// checksums.
TEST(CudaMemorySpaceTest, MatchesTheHostSpace) {
  absl::StatusOr<int> devices = VisibleCudaDevices();
  if (!devices.ok()) GTEST_SKIP() << devices.status().message();
  absl::StatusOr<std::unique_ptr<CudaMemorySpace>> cuda = CudaMemorySpace::Create(0);
  ASSERT_TRUE(cuda.ok()) << cuda.status();
  EXPECT_EQ((*cuda)->name(), "cuda:0");
  MemorySpace& host = HostMemorySpace::Global();
  const Box box({0, 0}, {40, 50}), region({1, 2}, {30, 33});
  std::vector<float> init(2000);
  for (int i = 0; i < 2000; ++i) init[i] = static_cast<float>(i * 3 - 7);
  std::vector<float> results[2];
  uint64_t sums[2];
  int k = 0;
  for (MemorySpace* space : {static_cast<MemorySpace*>(cuda->get()), &host}) {
    Allocation a = *space->Allocate(8000), b = *space->Allocate(8000);
    Allocation packed = *space->Allocate(30 * 33 * 4);
    ASSERT_TRUE(space->CopyFromHost(a.data, init.data(), 8000).ok());
    ASSERT_TRUE(space->FillIdentity(b.data, 2000, DType::kF32, ReduceOp::kMax).ok());
    ASSERT_TRUE(space->PackBox(region, a.data, box, packed.data, 4).ok());
    ASSERT_TRUE(
        space->ReduceIntoBox(region, packed.data, region, b.data, box, DType::kF32, ReduceOp::kMax)
            .ok());
    ASSERT_TRUE(space->CopyBox(Box({0, 0}, {1, 50}), a.data, box, b.data, box, 4).ok());
    ASSERT_TRUE(space->DivideBox(b.data, 2000, DType::kF32, 2).ok());
    ASSERT_TRUE(space->Synchronize().ok());
    sums[k] = *space->ChunkChecksum(b.data, 8000);
    results[k].resize(2000);
    ASSERT_TRUE(space->CopyToHost(results[k].data(), b.data, 8000).ok());
    space->Free(a);
    space->Free(b);
    space->Free(packed);
    ++k;
  }
  EXPECT_EQ(results[0], results[1]);
  EXPECT_EQ(sums[0], sums[1]);
  EXPECT_EQ(sums[0], ChunkChecksum(results[0].data(), 8000));
  EXPECT_EQ(results[0][51], -std::numeric_limits<float>::infinity());
}

}  // namespace
}  // namespace nccl
}  // namespace shardcoord
