// Whole buffers between spaces: host, a (fake) GPU, another process's plain memory.
#include "worker/buffers/buffer_staging.h"

#include <unistd.h>

#include <cstring>
#include <numeric>
#include <vector>

#include "gtest/gtest.h"
#include "worker/memory/process_memory_space.h"
#include "worker/testing/fake_device_memory_space.h"

namespace shardcoord {
namespace {

class NoRelease : public LentMemory {
 public:
  std::string Describe() const override { return "test memory"; }
};

RankChunks Chunks(int64_t n) {
  RankChunks rc;
  rc.chunks.push_back(Chunk{Box({0}, {n}), 0, 0});
  rc.local_elements = n;
  return rc;
}

TEST(BufferStagingTest, CopiesBetweenHostDeviceAndProcessMemory) {
  const int64_t n = 3 << 20;  // 12 MiB of f32: more than one 8 MiB piece device to device.
  std::vector<float> values(n);
  std::iota(values.begin(), values.end(), 0.0f);
  auto host = *HostBuffer::Create(DType::kF32, Chunks(n));
  std::memcpy(host->data(), values.data(), host->bytes());
  // The same buffer when it is there already.
  EXPECT_EQ(*BufferIn(host, &HostMemorySpace::Global()), host);

  FakeDeviceMemorySpace a("gpu-a"), b("gpu-b");
  {
    std::shared_ptr<HostBuffer> on_a = *BufferIn(host, &a);
    EXPECT_EQ(&on_a->space(), &a);
    EXPECT_EQ(a.stats().copies_to_device, 1);
    std::shared_ptr<HostBuffer> on_b = *BufferIn(on_a, &b);  // Through host memory.
    EXPECT_EQ(b.stats().copies_to_device, 2);
    std::shared_ptr<HostBuffer> back = *BufferIn(on_b, &HostMemorySpace::Global());
    EXPECT_EQ(std::memcmp(back->data(), values.data(), host->bytes()), 0);
  }

  // This very process as "another" process: one process_vm copy each way.
  std::vector<float> theirs(n, -1.0f);
  ProcessMemorySpace process(getpid());
  auto lent =
      *HostBuffer::Wrap(DType::kF32, Chunks(n), &process, reinterpret_cast<char*>(theirs.data()),
                        std::make_shared<NoRelease>());
  ASSERT_TRUE(CopyBufferBytes(*host, *lent).ok());
  EXPECT_EQ(theirs, values);
  std::shared_ptr<HostBuffer> read = *BufferIn(lent, &HostMemorySpace::Global());
  EXPECT_EQ(std::memcmp(read->data(), values.data(), host->bytes()), 0);
  EXPECT_EQ(*process.ChunkChecksum(theirs.data(), 1024),
            *HostMemorySpace::Global().ChunkChecksum(values.data(), 1024));
  // It runs nothing but copies.
  EXPECT_EQ(process.FillZeros(theirs.data(), 4).code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(process.Allocate(4).status().code(), absl::StatusCode::kFailedPrecondition);

  auto small = *HostBuffer::Create(DType::kF32, Chunks(4));
  EXPECT_EQ(CopyBufferBytes(*host, *small).code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace shardcoord
