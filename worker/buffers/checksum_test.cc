#include "worker/buffers/checksum.h"

#include <xxhash.h>

#include <algorithm>
#include <cstring>
#include <random>
#include <vector>

#include "gtest/gtest.h"
#include "worker/testing/random_bytes.h"

namespace shardcoord {
namespace {

using testing_util::RandomBytes;

uint64_t HashOfHashes(const std::vector<uint64_t>& hashes) {
  std::vector<unsigned char> le;
  for (uint64_t h : hashes) {
    for (int b = 0; b < 8; ++b) le.push_back(static_cast<unsigned char>(h >> (8 * b)));
  }
  return XXH64(le.data(), le.size(), 0);
}

TEST(ChunkChecksumTest, EmptyIsHashOfEmptyArray) {
  EXPECT_EQ(ChunkChecksum(nullptr, 0), XXH64(nullptr, 0, 0));
  EXPECT_EQ(ChunkChecksum(nullptr, 0), 0xEF46DB3751D8E999ull);
}

TEST(ChunkChecksumTest, SingleBlockIsHashOfOneHash) {
  auto data = RandomBytes(1000, 1);
  EXPECT_EQ(ChunkChecksum(data.data(), 1000), HashOfHashes({XXH64(data.data(), 1000, 0)}));
  // Differs from plain XXH64: the definition always hashes the block hashes.
  EXPECT_NE(ChunkChecksum(data.data(), 1000), XXH64(data.data(), 1000, 0));
}

TEST(ChunkChecksumTest, BlockBoundaries) {
  const int64_t b = kChecksumBlockBytes;
  auto data = RandomBytes(2 * b + 17, 2);
  for (int64_t n : {b - 1, b, b + 1, 2 * b, 2 * b + 17}) {
    std::vector<uint64_t> hashes;
    for (int64_t off = 0; off < n; off += b) {
      hashes.push_back(XXH64(data.data() + off, std::min(b, n - off), 0));
    }
    EXPECT_EQ(ChunkChecksum(data.data(), n), HashOfHashes(hashes)) << "n=" << n;
  }
  EXPECT_EQ(HashOfHashes({XXH64(data.data(), b, 0)}), ChunkChecksum(data.data(), b));
}

TEST(ChunkChecksumTest, OfBlocksMatchesChunkChecksum) {
  const int64_t b = kChecksumBlockBytes;
  auto data = RandomBytes(2 * b + 17, 6);
  for (int64_t n : {int64_t{0}, int64_t{5}, b, 2 * b + 17}) {
    std::vector<uint64_t> hashes;
    for (int64_t off = 0; off < n; off += b) {
      hashes.push_back(XXH64(data.data() + off, std::min(b, n - off), 0));
    }
    EXPECT_EQ(ChunkChecksumOfBlocks(hashes), ChunkChecksum(data.data(), n)) << "n=" << n;
  }
}

TEST(ChunkChecksumTest, EqualDataEqualChecksum) {
  auto a = RandomBytes(3 * kChecksumBlockBytes + 5, 3);
  auto b = a;  // A different buffer with the same bytes.
  EXPECT_EQ(ChunkChecksum(a.data(), a.size()), ChunkChecksum(b.data(), b.size()));
}

TEST(ChunkChecksumTest, OneFlippedByteChangesIt) {
  auto data = RandomBytes(3 * kChecksumBlockBytes + 5, 4);
  const uint64_t base = ChunkChecksum(data.data(), data.size());
  for (int64_t pos : {int64_t{0}, kChecksumBlockBytes - 1, kChecksumBlockBytes,
                      2 * kChecksumBlockBytes + 3, static_cast<int64_t>(data.size()) - 1}) {
    data[pos] ^= 0x01;
    EXPECT_NE(ChunkChecksum(data.data(), data.size()), base) << "pos=" << pos;
    data[pos] ^= 0x01;
  }
  EXPECT_EQ(ChunkChecksum(data.data(), data.size()), base);
}

TEST(ChunkChecksumTest, SwappedBlocksChangeIt) {
  // Block order matters: swapping two equal-size blocks changes the value.
  const int64_t b = kChecksumBlockBytes;
  auto data = RandomBytes(2 * b, 5);
  const uint64_t base = ChunkChecksum(data.data(), data.size());
  std::vector<unsigned char> swapped(2 * b);
  std::memcpy(swapped.data(), data.data() + b, b);
  std::memcpy(swapped.data() + b, data.data(), b);
  EXPECT_NE(ChunkChecksum(swapped.data(), swapped.size()), base);
}

TEST(ChunkChecksumTest, LengthMatters) {
  std::vector<unsigned char> zeros(kChecksumBlockBytes + 1, 0);
  EXPECT_NE(ChunkChecksum(zeros.data(), kChecksumBlockBytes),
            ChunkChecksum(zeros.data(), kChecksumBlockBytes + 1));
}

constexpr int64_t kB = kChecksumBlockBytes;

TEST(ChunkChecksumBuilderTest, FinalPiecesInAnyOrderHashEarly) {
  const int64_t n = 5 * kB + 123;
  std::vector<unsigned char> data(n, 0);
  const std::vector<unsigned char> want = RandomBytes(n, 3);
  ChunkChecksumBuilder builder(data.data(), n);
  // Pieces cut off block boundaries, written and reported back to front.
  const std::vector<int64_t> cuts = {0, kB / 3, 2 * kB + 7, 3 * kB, 4 * kB + 999, n};
  for (size_t i = cuts.size() - 1; i > 0; --i) {
    std::memcpy(data.data() + cuts[i - 1], want.data() + cuts[i - 1], cuts[i] - cuts[i - 1]);
    builder.Final(cuts[i - 1], cuts[i]);
  }
  EXPECT_EQ(builder.Finish(), ChunkChecksum(want.data(), n));
  EXPECT_EQ(builder.early_blocks(), 6);
}

TEST(ChunkChecksumBuilderTest, WritesAfterAnEarlyHashAreCaught) {
  const int64_t n = 3 * kB;
  std::vector<unsigned char> data = RandomBytes(n, 4);
  {
    ChunkChecksumBuilder builder(data.data(), n);
    builder.Final(0, n);
    data[kB + 5] ^= 1;
    builder.Final(kB, kB + 10);  // Overlapping final write: block 1 is re-hashed.
    EXPECT_EQ(builder.Finish(), ChunkChecksum(data.data(), n));
    EXPECT_EQ(builder.early_blocks(), 2);
  }
  {
    ChunkChecksumBuilder builder(data.data(), n);
    builder.Final(0, n);
    data[2 * kB] ^= 1;
    builder.Dirty(2 * kB, 2 * kB + 1);  // A reduction into block 2.
    EXPECT_EQ(builder.Finish(), ChunkChecksum(data.data(), n));
    EXPECT_EQ(builder.early_blocks(), 2);
  }
  {
    // Partly covered blocks, and untouched ones, are hashed at the end.
    ChunkChecksumBuilder builder(data.data(), n);
    builder.Final(0, kB / 2);
    EXPECT_EQ(builder.Finish(), ChunkChecksum(data.data(), n));
    EXPECT_EQ(builder.early_blocks(), 0);
  }
}

TEST(ChunkChecksumBuilderTest, RandomPartitionsMatchChunkChecksum) {
  std::mt19937 rng(11);
  for (int trial = 0; trial < 40; ++trial) {
    const int64_t n = 1 + static_cast<int64_t>(rng() % (4 * kB));
    const std::vector<unsigned char> want = RandomBytes(n, 100 + trial);
    std::vector<unsigned char> data(n, 0);
    std::vector<int64_t> cuts = {0, n};
    for (int c = 0; c < 6; ++c) cuts.push_back(static_cast<int64_t>(rng() % n));
    std::sort(cuts.begin(), cuts.end());
    std::vector<size_t> order(cuts.size() - 1);
    for (size_t i = 0; i < order.size(); ++i) order[i] = i;
    std::shuffle(order.begin(), order.end(), rng);
    ChunkChecksumBuilder builder(data.data(), n);
    for (size_t i : order) {
      std::memcpy(data.data() + cuts[i], want.data() + cuts[i], cuts[i + 1] - cuts[i]);
      if (rng() % 5 == 0) {
        builder.Dirty(cuts[i], cuts[i + 1]);
      } else {
        builder.Final(cuts[i], cuts[i + 1]);
      }
    }
    EXPECT_EQ(builder.Finish(), ChunkChecksum(want.data(), n)) << "trial " << trial;
  }
}

}  // namespace
}  // namespace shardcoord
