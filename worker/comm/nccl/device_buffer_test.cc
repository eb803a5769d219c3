#include "worker/comm/nccl/device_buffer.h"

#include <cstring>
#include <vector>

#include "gtest/gtest.h"
#include "worker/comm/nccl/gpu_probe.h"

namespace shardcoord {
namespace nccl {
namespace {

TEST(DeviceBufferTest, WithoutAGpuAllocationFailsCleanly) {
  if (VisibleCudaDevices().ok()) GTEST_SKIP() << "a CUDA device is visible";
  absl::StatusOr<DeviceBuffer> b = DeviceBuffer::Allocate(1 << 20, 0);
  ASSERT_FALSE(b.ok());
  EXPECT_EQ(b.status().code(), absl::StatusCode::kFailedPrecondition) << b.status();
  EXPECT_EQ(b.status().message().rfind("cudaMalloc of 1048576 bytes on device 0: ", 0), 0u)
      << b.status();
}

TEST(DeviceBufferTest, EmptyBufferNeedsNoDevice) {
  absl::StatusOr<DeviceBuffer> b = DeviceBuffer::Allocate(0, 0);
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_EQ(b->data(), nullptr);
  EXPECT_EQ(b->bytes(), 0);
  EXPECT_TRUE(b->Fill(7).ok());
  EXPECT_EQ(DeviceBuffer::Allocate(-1, 0).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(DeviceBufferTest, RoundTripsThroughDeviceMemory) {
  absl::StatusOr<int> devices = VisibleCudaDevices();
  if (!devices.ok()) GTEST_SKIP() << devices.status().message();
  absl::StatusOr<DeviceBuffer> b = DeviceBuffer::Allocate(4096, 0);
  ASSERT_TRUE(b.ok()) << b.status();
  std::vector<unsigned char> in(4096), out(4096, 0);
  for (size_t i = 0; i < in.size(); ++i) in[i] = static_cast<unsigned char>(i * 7 + 1);
  ASSERT_TRUE(b->CopyFromHost(in.data(), 4096).ok());
  ASSERT_TRUE(b->CopyToHost(out.data(), 4096).ok());
  EXPECT_EQ(in, out);
  ASSERT_TRUE(b->Fill(0x5A).ok());
  ASSERT_TRUE(b->CopyToHost(out.data(), 100, 3000).ok());
  EXPECT_EQ(out[0], 0x5A);
  EXPECT_EQ(out[99], 0x5A);
  EXPECT_EQ(b->CopyToHost(out.data(), 100, 4000).code(), absl::StatusCode::kInvalidArgument);

  DeviceBuffer moved = std::move(*b);
  EXPECT_EQ(b->data(), nullptr);  // NOLINT: checking the moved-from state on purpose.
  EXPECT_EQ(moved.bytes(), 4096);
}

}  // namespace
}  // namespace nccl
}  // namespace shardcoord
