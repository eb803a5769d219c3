#include "worker/buffers/buffer_store.h"

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "worker/buffers/checksum.h"

namespace shardcoord {
namespace {

RankChunks TwoChunks() {
  RankChunks rc;
  rc.rank = 3;
  rc.chunks.push_back(Chunk{Box({0, 0}, {2, 3}), 0, 0});
  rc.chunks.push_back(Chunk{Box({4, 0}, {1, 3}), 6, 0});
  rc.local_elements = 9;
  return rc;
}

TEST(HostBufferTest, LayoutAndAlignment) {
  auto buffer = HostBuffer::Create(DType::kF32, TwoChunks());
  ASSERT_TRUE(buffer.ok()) << buffer.status();
  HostBuffer& b = **buffer;
  EXPECT_EQ(b.bytes(), 36);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(b.data()) % 64, 0u);
  EXPECT_EQ(b.chunk_data(1) - b.data(), 24);
  EXPECT_EQ(b.chunk_bytes(0), 24);
  EXPECT_EQ(b.chunk_bytes(1), 12);
  std::memset(b.data(), 7, b.bytes());
  auto sums = *b.Checksums();
  ASSERT_EQ(sums.size(), 2u);
  EXPECT_EQ(sums[0], ChunkChecksum(b.data(), 24));
  EXPECT_EQ(sums[1], ChunkChecksum(b.data() + 24, 12));
  EXPECT_NE(sums[0], sums[1]);
}

TEST(HostBufferTest, RejectsChunkOutsideBuffer) {
  RankChunks rc = TwoChunks();
  rc.chunks[1].local_offset = 7;  // 7 + 3 > 9.
  auto buffer = HostBuffer::Create(DType::kF32, rc);
  EXPECT_EQ(buffer.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(buffer.status().message().find("[4:5, 0:3]"), std::string::npos) << buffer.status();
  rc.chunks[1].local_offset = -1;
  EXPECT_EQ(HostBuffer::Create(DType::kF32, rc).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(HostBufferTest, CreateManySharesOneAllocationAndTheChunks) {
  auto two = std::make_shared<const RankChunks>(TwoChunks());
  RankChunks one;
  one.chunks.push_back(Chunk{Box({0}, {5}), 0, 0});
  one.local_elements = 5;
  auto single = std::make_shared<const RankChunks>(one);
  std::vector<HostBuffer::Spec> specs = {
      {DType::kF32, two}, {DType::kU8, single}, {DType::kF64, two}};
  auto buffers = HostBuffer::CreateMany(specs);
  ASSERT_TRUE(buffers.ok()) << buffers.status();
  ASSERT_EQ(buffers->size(), 3u);
  const int64_t expect_bytes[] = {36, 5, 72};
  for (size_t i = 0; i < 3; ++i) {
    HostBuffer& b = *(*buffers)[i];
    EXPECT_EQ(b.bytes(), expect_bytes[i]) << i;
    EXPECT_EQ(reinterpret_cast<uintptr_t>(b.data()) % 64, 0u) << i;
    EXPECT_EQ(&b.chunks(), specs[i].chunks.get()) << i;  // Shared, not copied.
    EXPECT_EQ(b.dtype(), specs[i].dtype);
  }
  // Consecutive and disjoint within the one allocation (each rounded up to 64 bytes).
  EXPECT_EQ((*buffers)[1]->data() - (*buffers)[0]->data(), 64);
  EXPECT_EQ((*buffers)[2]->data() - (*buffers)[1]->data(), 64);
  // The allocation lives while any of its buffers does.
  std::shared_ptr<HostBuffer> last = (*buffers)[2];
  buffers->clear();
  std::memset(last->data(), 9, last->bytes());
  EXPECT_EQ(last->Checksums()->at(1), ChunkChecksum(last->chunk_data(1), 24));
}

TEST(HostBufferTest, CreateManyNamesTheBadSpec) {
  RankChunks bad = TwoChunks();
  bad.chunks[1].local_offset = 7;
  std::vector<HostBuffer::Spec> specs = {
      {DType::kF32, std::make_shared<const RankChunks>(TwoChunks())},
      {DType::kF32, std::make_shared<const RankChunks>(bad)}};
  auto buffers = HostBuffer::CreateMany(specs);
  EXPECT_EQ(buffers.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(buffers.status().message().find("buffer 1: chunk 1"), std::string::npos)
      << buffers.status();
  specs[1].chunks = nullptr;
  EXPECT_EQ(HostBuffer::CreateMany(specs).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(HostBuffer::CreateMany({})->empty());
}

TEST(HostBufferTest, EmptyBuffer) {
  RankChunks rc;
  auto buffer = HostBuffer::Create(DType::kF64, rc);
  ASSERT_TRUE(buffer.ok());
  EXPECT_EQ((*buffer)->bytes(), 0);
  EXPECT_NE((*buffer)->data(), nullptr);
}

#if defined(__has_feature)
#if __has_feature(address_sanitizer)
#define SHARDCOORD_ASAN 1
#endif
#endif
#if defined(__SANITIZE_ADDRESS__)
#define SHARDCOORD_ASAN 1
#endif

TEST(HostBufferTest, HugeAllocationIsResourceExhausted) {
#ifdef SHARDCOORD_ASAN
  GTEST_SKIP() << "ASan aborts on impossible allocations instead of returning null";
#endif
  RankChunks rc;
  rc.local_elements = int64_t{1} << 58;  // 2^60 bytes of f32.
  EXPECT_EQ(HostBuffer::Create(DType::kF32, rc).status().code(),
            absl::StatusCode::kResourceExhausted);
}

TEST(BufferStoreTest, InsertGetDrop) {
  BufferStore store;
  auto a = *HostBuffer::Create(DType::kF32, TwoChunks());
  auto b = *HostBuffer::Create(DType::kF32, TwoChunks());
  ASSERT_TRUE(store.Insert("t", 1, a).ok());
  EXPECT_EQ(store.Insert("t", 1, b).code(), absl::StatusCode::kAlreadyExists);
  ASSERT_TRUE(store.Insert("t", 2, b).ok());
  EXPECT_EQ(*store.Get("t", 1), a);
  EXPECT_EQ(store.Find("t", 2), b);
  EXPECT_EQ(store.Find("u", 1), nullptr);
  auto missing = store.Get("t", 3);
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kNotFound);
  EXPECT_NE(missing.status().message().find("'t' version 3"), std::string::npos);
  EXPECT_EQ(store.TotalBytes(), 72);
  EXPECT_EQ(store.List().size(), 2u);

  EXPECT_TRUE(store.Drop("t", 1));
  EXPECT_FALSE(store.Drop("t", 1));
  EXPECT_EQ(store.Find("t", 1), nullptr);
  EXPECT_EQ(store.DropTensor("t"), 1);
  EXPECT_EQ(store.DropTensor("t"), 0);
  EXPECT_EQ(store.TotalBytes(), 0);
}

TEST(BufferStoreTest, HandleOutlivesDrop) {
  BufferStore store;
  {
    auto a = *HostBuffer::Create(DType::kI64, TwoChunks());
    ASSERT_TRUE(store.Insert("t", 1, a).ok());
  }
  std::shared_ptr<HostBuffer> held = store.Find("t", 1);
  ASSERT_NE(held, nullptr);
  store.DropTensor("t");
  // The executor's handle still owns the memory.
  std::memset(held->data(), 1, held->bytes());
  EXPECT_EQ(held.use_count(), 1);
}

TEST(BufferStoreTest, PutReplaces) {
  BufferStore store;
  auto a = *HostBuffer::Create(DType::kF32, TwoChunks());
  auto b = *HostBuffer::Create(DType::kF32, TwoChunks());
  store.Put("t", 1, a);
  store.Put("t", 1, b);
  EXPECT_EQ(store.Find("t", 1), b);
}

}  // namespace
}  // namespace shardcoord

namespace shardcoord {
namespace {

TEST(HostMemoryCacheTest, RecyclesLargeBlocks) {
  HostMemoryCache cache;
  int64_t cap1 = 0, cap2 = 0, cap3 = 0;
  void* a = cache.Allocate(3 * HostMemoryCache::kMinBytes - 5, &cap1);
  ASSERT_NE(a, nullptr);
  // Whole 4 KiB pages: 2 MiB ones would waste a third.
  EXPECT_EQ(cap1, 3 * HostMemoryCache::kMinBytes);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(a) % (2 * HostMemoryCache::kMinBytes), 0u);
  cache.Free(a, cap1);
  EXPECT_EQ(cache.cached_bytes(), cap1);
  void* b = cache.Allocate(3 * HostMemoryCache::kMinBytes, &cap2);
  EXPECT_EQ(b, a);  // The same block again.
  EXPECT_EQ(cache.cached_bytes(), 0);
  // A much smaller request does not take a large block.
  cache.Free(b, cap2);
  void* c = cache.Allocate(HostMemoryCache::kMinBytes, &cap3);
  EXPECT_NE(c, b);
  EXPECT_EQ(cap3, HostMemoryCache::kMinBytes);
  cache.Free(c, cap3);
  cache.Clear();
  EXPECT_EQ(cache.cached_bytes(), 0);
}

// The VmFlags of the mapping holding `p` in /proc/self/smaps ("" when not found).
std::string VmFlagsOf(const void* p) {
  std::ifstream smaps("/proc/self/smaps");
  const uintptr_t addr = reinterpret_cast<uintptr_t>(p);
  bool inside = false;
  for (std::string line; std::getline(smaps, line);) {
    unsigned long lo = 0, hi = 0;  // NOLINT(runtime/int): sscanf's %lx.
    if (std::sscanf(line.c_str(), "%lx-%lx ", &lo, &hi) == 2) {  // A mapping's first line.
      inside = lo <= addr && addr < hi;
      continue;
    }
    if (inside && line.rfind("VmFlags:", 0) == 0) return line;
  }
  return "";
}

// Blocks from 1 MiB up are advised to be backed by transparent huge pages from their first
// byte to their last (an O_DIRECT read or a copy into small pages runs at about half the
// speed on this project's VM), so their tails are not left in small pages.
TEST(HostMemoryCacheTest, LargeBlocksAreAdvisedHugeToTheirEnd) {
  std::ifstream enabled("/sys/kernel/mm/transparent_hugepage/enabled");
  std::string mode;
  std::getline(enabled, mode);
  if (mode.empty() || mode.find("[never]") != std::string::npos) {
    GTEST_SKIP() << "transparent huge pages are off or absent here: " << mode;
  }
  HostMemoryCache cache;
  const int64_t mib = HostMemoryCache::kMinBytes;
  // {bytes, capacity}: rounded up to whole 2 MiB pages where that wastes at most an eighth,
  // else to whole 4 KiB pages (a 1 MiB tensor must not hold 2 MiB).
  for (auto [bytes, want] : std::vector<std::pair<int64_t, int64_t>>{{mib, mib},
                                                                     {5 * mib + 17, 5 * mib + 4096},
                                                                     {17 * mib + 17, 18 * mib},
                                                                     {6 * mib, 6 * mib}}) {
    int64_t cap = 0;
    char* a = static_cast<char*>(cache.Allocate(bytes, &cap));
    ASSERT_NE(a, nullptr);
    EXPECT_EQ(cap, want) << bytes;
    EXPECT_EQ(reinterpret_cast<uintptr_t>(a) % (2 * mib), 0u) << bytes;
    for (const char* p : {a, a + bytes - 1, a + cap - 1}) {
      EXPECT_NE(VmFlagsOf(p).find(" hg"), std::string::npos)
          << bytes << " bytes, byte " << (p - a) << ": " << VmFlagsOf(p);
    }
    cache.Free(a, cap);
    cache.Clear();
  }
}

TEST(HostMemoryCacheTest, LimitAndSmallBlocks) {
  HostMemoryCache cache;
  cache.set_limit(0);
  int64_t cap = 0;
  void* a = cache.Allocate(2 * HostMemoryCache::kMinBytes, &cap);
  cache.Free(a, cap);
  EXPECT_EQ(cache.cached_bytes(), 0);
  cache.set_limit(int64_t{1} << 30);
  void* small = cache.Allocate(100, &cap);
  EXPECT_EQ(cap, 128);
  cache.Free(small, cap);
  EXPECT_EQ(cache.cached_bytes(), 0);  // Small blocks go straight back.
}

}  // namespace
}  // namespace shardcoord
