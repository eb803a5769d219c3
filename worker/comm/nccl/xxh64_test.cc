// The device XXH64 (compiled here for the host from the same __host__ __device__ source)
// against libxxhash, and the block-wise split the checksum kernel uses against
// worker/buffers/checksum.h.
#include "worker/comm/nccl/xxh64.h"

#include <xxhash.h>

#include <cstdint>
#include <random>
#include <vector>

#include "gtest/gtest.h"
#include "worker/buffers/checksum.h"
#include "worker/testing/random_bytes.h"

namespace shardcoord {
namespace nccl {
namespace {

using testing_util::RandomBytes;

// What the device computes: block hashes, then XXH64 of them as little-endian words.
uint64_t BlockwiseChecksum(const void* data, int64_t bytes) {
  const int64_t k = ChecksumBlockCount(bytes);
  std::vector<unsigned char> words(static_cast<size_t>(k) * 8);
  for (int64_t i = 0; i < k; ++i) {
    const uint64_t h = ChecksumBlockHash(data, bytes, i);
    for (int b = 0; b < 8; ++b) words[i * 8 + b] = static_cast<unsigned char>(h >> (8 * b));
  }
  return Xxh64(words.data(), words.size(), 0);
}

TEST(Xxh64Test, EmptyInputIsTheKnownConstant) {
  EXPECT_EQ(Xxh64(nullptr, 0, 0), 0xEF46DB3751D8E999ULL);
  EXPECT_EQ(Xxh64(nullptr, 0, 0), XXH64(nullptr, 0, 0));
}

TEST(Xxh64Test, EveryLengthUpTo300MatchesLibxxhash) {
  // Covers every tail shape (8-byte words, a 4-byte word, single bytes) with and without
  // the 32-byte stripe loop.
  const std::vector<unsigned char> data = RandomBytes(300, 1);
  for (uint64_t seed : {uint64_t{0}, uint64_t{1}, uint64_t{0x9E3779B97F4A7C15ULL}}) {
    for (size_t len = 0; len <= data.size(); ++len) {
      ASSERT_EQ(Xxh64(data.data(), len, seed), XXH64(data.data(), len, seed))
          << "len " << len << " seed " << seed;
    }
  }
}

TEST(Xxh64Test, UnalignedStartsMatch) {
  const std::vector<unsigned char> data = RandomBytes(4096 + 16, 2);
  for (size_t start = 0; start < 16; ++start) {
    for (size_t len : {size_t{31}, size_t{32}, size_t{33}, size_t{100}, size_t{4096}}) {
      ASSERT_EQ(Xxh64(data.data() + start, len, 0), XXH64(data.data() + start, len, 0))
          << "start " << start << " len " << len;
    }
  }
}

TEST(Xxh64Test, LargeRandomBufferMatches) {
  const std::vector<unsigned char> data = RandomBytes((3 << 20) + 12345, 3);
  EXPECT_EQ(Xxh64(data.data(), data.size(), 0), XXH64(data.data(), data.size(), 0));
}

TEST(Xxh64Test, BlockConstantMatchesTheChecksumDefinition) {
  EXPECT_EQ(kDeviceChecksumBlockBytes, kChecksumBlockBytes);
}

TEST(Xxh64Test, BlockCount) {
  EXPECT_EQ(ChecksumBlockCount(0), 0);
  EXPECT_EQ(ChecksumBlockCount(1), 1);
  EXPECT_EQ(ChecksumBlockCount(kChecksumBlockBytes), 1);
  EXPECT_EQ(ChecksumBlockCount(kChecksumBlockBytes + 1), 2);
  EXPECT_EQ(ChecksumBlockCount(5 * kChecksumBlockBytes), 5);
}

TEST(Xxh64Test, BlockwiseSplitEqualsHostChunkChecksum) {
  const int64_t mib = kChecksumBlockBytes;
  const std::vector<unsigned char> data = RandomBytes(static_cast<size_t>(3 * mib + mib / 2), 4);
  for (int64_t n : {int64_t{0}, int64_t{1}, int64_t{7}, int64_t{1000}, mib - 1, mib, mib + 1,
                    2 * mib, 3 * mib + mib / 2}) {
    EXPECT_EQ(BlockwiseChecksum(data.data(), n), ChunkChecksum(data.data(), n)) << "n " << n;
  }
}

TEST(Xxh64Test, BlockwiseChecksumSeesEveryBlock) {
  // A flipped byte in the last, partial block changes the result.
  std::vector<unsigned char> data = RandomBytes(static_cast<size_t>(kChecksumBlockBytes + 10), 5);
  const uint64_t before = BlockwiseChecksum(data.data(), static_cast<int64_t>(data.size()));
  data.back() ^= 1;
  EXPECT_NE(BlockwiseChecksum(data.data(), static_cast<int64_t>(data.size())), before);
}

}  // namespace
}  // namespace nccl
}  // namespace shardcoord
