#include "sharding/fused_stream.h"

#include <cstdint>
#include <map>
#include <random>
#include <vector>

#include "gtest/gtest.h"
#include "sharding/box.h"
#include "sharding/layout.h"
#include "sharding/mesh.h"
#include "sharding/placement.h"
#include "sharding/planner.h"

namespace shardcoord {
namespace {

// Flat indices (in a tensor of `shape`) of `box`'s elements, row-major within the box.
std::vector<int64_t> FlatIndices(const Shape& shape, const Box& box) {
  std::vector<int64_t> out;
  if (box.Empty()) return out;
  Shape idx = box.offset();
  while (true) {
    int64_t flat = 0;
    for (int d = 0; d < box.ndim(); ++d) flat = flat * shape[d] + idx[d];
    out.push_back(flat);
    int d = box.ndim() - 1;
    while (d >= 0 && ++idx[d] == box.end(d)) {
      idx[d] = box.offset(d);
      --d;
    }
    if (d < 0) return out;
  }
}

TEST(StreamLimitsTest, ClampsAndDerivesFromTheBucketSize) {
  StreamLimits d = StreamLimitsFor(0);
  EXPECT_EQ(d.bucket_bytes, kDefaultBucketBytes);
  EXPECT_EQ(d.message_bytes, kMaxStreamMessageBytes);
  EXPECT_EQ(d.pack_below, kPackBelowBytes);
  EXPECT_EQ(d.window_bytes, kDefaultBucketBytes * kBucketsInFlight / 2);
  StreamLimits tiny = StreamLimitsFor(24);
  EXPECT_EQ(tiny.bucket_bytes, 24);
  EXPECT_EQ(tiny.message_bytes, 24);
  EXPECT_EQ(tiny.pack_below, 24);
  EXPECT_EQ(tiny.window_bytes, 24 * kBucketsInFlight / 2);
  EXPECT_EQ(StreamLimitsFor(3).bucket_bytes, kMinStreamBucketBytes);
  // Staging of a worker in one exchange: a window to send and one to receive.
  EXPECT_EQ(2 * StreamLimitsFor(1 << 20).window_bytes, kBucketsInFlight * (1 << 20));
}

TEST(FusedStagingCapsTest, LargestStreamSentPlusLargestReceivedPerRank) {
  auto transfer = [](int64_t src, int64_t dst, int64_t n) {
    Transfer t;
    t.src = src;
    t.dst = dst;
    t.box = Box({0}, {n});
    t.bytes = 4 * n;
    return t;
  };
  Plan a, b;
  a.dtype = b.dtype = DType::kF32;
  a.steps.resize(1);
  a.steps[0].transfers = {transfer(0, 1, 10), transfer(0, 2, 5), transfer(1, 1, 99)};
  b.steps.resize(2);
  b.steps[0].transfers = {transfer(0, 1, 10)};  // The same pair's stream grows.
  b.steps[1].transfers = {transfer(2, 0, 3)};
  const std::vector<const Plan*> plans = {&a, &b};
  const std::map<int64_t, int64_t> caps = FusedStagingCaps(plans);
  // Rank 0 sends 80 to 1 and 20 to 2, receives 12 from 2; rank 1 receives 80 (its copy to
  // itself moves nothing); rank 2 sends 12 and receives 20.
  EXPECT_EQ(caps, (std::map<int64_t, int64_t>{{0, 80 + 12}, {1, 80}, {2, 12 + 20}}));
}

TEST(SplitIntoPiecesTest, PiecesAreRowMajorRunsOfAtMostTheLimit) {
  const Shape shape = {9, 7, 5};
  const Box box({1, 2, 0}, {6, 4, 5});
  std::mt19937_64 rng(7);
  for (int64_t max_bytes :
       {int64_t{1}, int64_t{4}, int64_t{12}, int64_t{20}, int64_t{79}, int64_t{80}, int64_t{81},
        int64_t{400}, int64_t{479}, int64_t{480}, int64_t{100000}}) {
    std::vector<Box> pieces = SplitIntoPieces(box, 4, max_bytes);
    std::vector<int64_t> joined;
    for (const Box& p : pieces) {
      EXPECT_TRUE(box.Contains(p)) << p.ToString();
      EXPECT_LE(p.Volume() * 4, std::max<int64_t>(max_bytes, 4)) << p.ToString();
      EXPECT_FALSE(p.Empty());
      std::vector<int64_t> flat = FlatIndices(shape, p);
      joined.insert(joined.end(), flat.begin(), flat.end());
    }
    EXPECT_EQ(joined, FlatIndices(shape, box)) << max_bytes;
    if (max_bytes >= box.Volume() * 4) {
      EXPECT_EQ(pieces.size(), 1u);
    }
  }
  // 12 bytes of 4-byte elements: rows of 5 are cut into runs of 3 and 2.
  std::vector<Box> runs = SplitIntoPieces(Box({0, 0}, {2, 5}), 4, 12);
  ASSERT_EQ(runs.size(), 4u);
  EXPECT_EQ(runs[0], Box({0, 0}, {1, 3}));
  EXPECT_EQ(runs[1], Box({0, 3}, {1, 2}));
  EXPECT_EQ(runs[3], Box({1, 3}, {1, 2}));
}

TEST(CutStreamTest, PacksSmallItemsAndSplitsLargeOnes) {
  const StreamLimits limits = StreamLimitsFor(24);
  // f32 items of 8, 12, 40 (large), 0 (skipped), 16, 4 bytes; then a bf16 item of 6 bytes.
  std::vector<StreamItem> items = {
      {Box({0, 0}, {1, 2}), 4}, {Box({1, 0}, {1, 3}), 4}, {Box({2, 0}, {2, 5}), 4},
      {Box({4, 0}, {0, 5}), 4}, {Box({5, 0}, {1, 4}), 4}, {Box({6, 0}, {1, 1}), 4},
      {Box({0, 0}, {1, 3}), 2},
  };
  std::vector<StreamMessage> messages = CutStream(items, limits);
  // The 40-byte item goes at once as two rows of 20; the open bucket [8, 12] follows when
  // 16 does not fit; [16, 4] is full at 20, and 6 more would be 26: the bf16 item alone.
  ASSERT_EQ(messages.size(), 5u);
  EXPECT_EQ(messages[0].pieces.size(), 1u);
  EXPECT_EQ(messages[0].pieces[0].item, 2);
  EXPECT_EQ(messages[0].pieces[0].box, Box({2, 0}, {1, 5}));
  EXPECT_EQ(messages[1].pieces[0].box, Box({3, 0}, {1, 5}));
  ASSERT_EQ(messages[2].pieces.size(), 2u);
  EXPECT_EQ(messages[2].bytes, 20);
  EXPECT_EQ(messages[2].pieces[0].item, 0);
  EXPECT_EQ(messages[2].pieces[1].item, 1);
  EXPECT_EQ(messages[2].pieces[1].offset, 8);
  ASSERT_EQ(messages[3].pieces.size(), 2u);
  EXPECT_EQ(messages[3].pieces[0].item, 4);
  EXPECT_EQ(messages[3].pieces[1].item, 5);
  EXPECT_EQ(messages[3].pieces[1].offset, 16);
  ASSERT_EQ(messages[4].pieces.size(), 1u);
  EXPECT_EQ(messages[4].pieces[0].item, 6);
  EXPECT_EQ(messages[4].bytes, 6);
  for (const StreamMessage& m : messages) {
    EXPECT_LE(m.bytes, limits.message_bytes);
    int64_t at = 0;
    for (const StreamPiece& p : m.pieces) {
      EXPECT_EQ(p.offset, at);
      EXPECT_EQ(p.bytes, p.box.Volume() * items[p.item].element_size);
      at += p.bytes;
    }
    EXPECT_EQ(at, m.bytes);
  }
}

TEST(CutStreamTest, ManySmallItemsGoAsFewMessages) {
  std::vector<StreamItem> items;
  for (int i = 0; i < 300; ++i) items.push_back({Box({i, 0}, {1, 64}), 4});  // 256 B each.
  EXPECT_EQ(CutStream(items, StreamLimitsFor(0)).size(), 1u);
  // 1 KiB buckets hold four.
  EXPECT_EQ(CutStream(items, StreamLimitsFor(1024)).size(), 75u);
}

TEST(StreamCounterTest, CountsWhatCutStreamCuts) {
  std::mt19937_64 rng(11);
  for (int trial = 0; trial < 300; ++trial) {
    const int64_t bucket = std::uniform_int_distribution<int64_t>(1, 600)(rng);
    const StreamLimits limits = StreamLimitsFor(bucket);
    std::vector<StreamItem> items;
    StreamCounter counter(limits);
    const int n = std::uniform_int_distribution<int>(0, 12)(rng);
    for (int i = 0; i < n; ++i) {
      const int64_t esize = int64_t{1} << std::uniform_int_distribution<int>(0, 3)(rng);
      Shape shape;
      for (int d = 0; d < 3; ++d)
        shape.push_back(std::uniform_int_distribution<int64_t>(0, 7)(rng));
      Box box(Shape(3, 0), shape);
      items.push_back({box, esize});
      counter.Add(box, esize);
      EXPECT_EQ(CountPieces(box, esize, limits.message_bytes),
                box.Empty() ? 1
                            : static_cast<int64_t>(
                                  SplitIntoPieces(box, esize, limits.message_bytes).size()))
          << box.ToString() << " " << esize << " " << limits.message_bytes;
    }
    EXPECT_EQ(counter.messages(), static_cast<int64_t>(CutStream(items, limits).size()))
        << "trial " << trial << ", bucket " << bucket;
  }
}

TEST(CutWindowsTest, WindowsHoldAtMostTheirBytesAndAtLeastOneMessage) {
  StreamLimits limits = StreamLimitsFor(24);
  limits.window_bytes = 48;
  std::vector<StreamMessage> messages(6);
  const int64_t sizes[] = {24, 24, 4, 30, 40, 8};
  for (int i = 0; i < 6; ++i) messages[i].bytes = sizes[i];
  std::vector<size_t> starts = CutWindows(messages, limits);
  EXPECT_EQ(starts, (std::vector<size_t>{0, 2, 4}));
  EXPECT_TRUE(CutWindows({}, limits).empty());
  // A message larger than a window still forms one.
  messages.assign(2, StreamMessage());
  messages[0].bytes = 100;
  messages[1].bytes = 100;
  EXPECT_EQ(CutWindows(messages, limits), (std::vector<size_t>{0, 1}));
}

TEST(FusedExchangeTest, CountsRanksPairsAndMessagesOverPlans) {
  const DeviceMesh mesh = *DeviceMesh::Create({4}, {}, {});
  const Shape shape = {8, 8};
  PlanOptions options;
  options.use_collectives = false;
  Plan a = *Redistribute(*Layout::FromPlacements(mesh, shape, *ParsePlacements("S(0)")),
                         *Layout::FromPlacements(mesh, shape, *ParsePlacements("S(1)")),
                         DType::kF32, options);
  Plan b = *Redistribute(*Layout::FromPlacements(mesh, shape, *ParsePlacements("S(0)")),
                         *Layout::FromPlacements(mesh, shape, *ParsePlacements("S(1)")),
                         DType::kF32, options);
  const Plan* plans[] = {&a, &b};
  FusedExchangeStats stats = FusedExchange(plans, StreamLimitsFor(0));
  EXPECT_EQ(stats.ranks, (std::vector<int64_t>{0, 1, 2, 3}));
  EXPECT_EQ(stats.pairs, 12);
  // Each pair moves a 2x2 block of each plan: 16 + 16 bytes, packed into one bucket.
  EXPECT_EQ(stats.messages, 12);
  // With 16-byte buckets every block is its own message.
  EXPECT_EQ(FusedExchange(plans, StreamLimitsFor(16)).messages, 24);
}

}  // namespace
}  // namespace shardcoord
