// The kernels' index math (box_geometry.h), run on the host exactly as the kernels run it,
// against sharding/box_copy.h's host copies.
#include "worker/comm/nccl/box_geometry.h"

#include <cstring>
#include <random>
#include <vector>

#include "gtest/gtest.h"
#include "sharding/box.h"
#include "sharding/box_copy.h"
#include "worker/comm/nccl/box_geometry_builder.h"
#include "worker/testing/cast_test_data.h"
#include "worker/testing/random_bytes.h"

namespace shardcoord {
namespace nccl {
namespace {

// What the copy kernel does: one thread per `unit`-byte unit.
void EmulateCopy(const BoxCopyGeometry& g, int unit, const void* src, void* dst) {
  const int64_t units = TotalBytes(g) / unit;
  for (int64_t u = 0; u < units; ++u) {
    int64_t s, d;
    UnitOffsets(g, unit, u, &s, &d);
    std::memcpy(static_cast<char*>(dst) + d, static_cast<const char*>(src) + s, unit);
  }
}

using testing_util::RandomBox;
using testing_util::RandomBytes;
using testing_util::RandomSubBox;

TEST(BoxGeometryTest, RandomPacksAndUnpacksMatchHostCopies) {
  std::mt19937 rng(20240611);
  for (int iter = 0; iter < 3000; ++iter) {
    const int ndim = 1 + static_cast<int>(rng() % 4);
    const int64_t esize = std::vector<int64_t>{1, 2, 3, 4, 8}[rng() % 5];
    const Box chunk_box = RandomBox(ndim, rng, /*max_extent=*/5, /*max_offset=*/5);
    const Box region = RandomSubBox(chunk_box, rng);
    const size_t chunk_bytes = static_cast<size_t>(chunk_box.Volume() * esize);
    const size_t region_bytes = static_cast<size_t>(region.Volume() * esize);
    // Buffers with odd offsets so the alignment-derived unit varies.
    const size_t skew = rng() % 16;
    std::vector<unsigned char> chunk_store = RandomBytes(chunk_bytes + 32, rng);
    unsigned char* chunk = chunk_store.data() + skew;

    absl::StatusOr<BoxCopyGeometry> pack = MakePackGeometry(region, chunk_box, esize);
    ASSERT_TRUE(pack.ok()) << pack.status();
    EXPECT_EQ(TotalBytes(*pack), static_cast<int64_t>(region_bytes));
    EXPECT_EQ(ElementCount(*pack), region.Volume());

    std::vector<unsigned char> want(region_bytes + 1, 0xAB), got(region_bytes + 16, 0xAB);
    ASSERT_TRUE(PackBox(region, chunk, chunk_box, want.data(), esize).ok());
    const size_t dst_skew = rng() % 8;
    unsigned char* dst = got.data() + dst_skew;
    const int unit =
        CopyUnitBytes(*pack, reinterpret_cast<uintptr_t>(chunk), reinterpret_cast<uintptr_t>(dst));
    ASSERT_EQ(pack->run_bytes % unit, 0);
    ASSERT_EQ(reinterpret_cast<uintptr_t>(chunk) % unit, 0u);
    for (int u : {unit, 1}) {
      std::fill(got.begin(), got.end(), 0xAB);
      EmulateCopy(*pack, u, chunk, dst);
      ASSERT_EQ(std::memcmp(dst, want.data(), region_bytes + 1), 0)
          << "pack " << region.ToString() << " of " << chunk_box.ToString() << " esize " << esize
          << " unit " << u;
    }

    // Unpack fresh values into a copy of the chunk; everything outside region stays.
    absl::StatusOr<BoxCopyGeometry> unpack = MakeUnpackGeometry(region, chunk_box, esize);
    ASSERT_TRUE(unpack.ok()) << unpack.status();
    const std::vector<unsigned char> packed = RandomBytes(region_bytes, rng);
    std::vector<unsigned char> want_chunk(chunk, chunk + chunk_bytes);
    std::vector<unsigned char> got_chunk = want_chunk;
    ASSERT_TRUE(UnpackBox(region, packed.data(), want_chunk.data(), chunk_box, esize).ok());
    EmulateCopy(*unpack, static_cast<int>(esize), packed.data(), got_chunk.data());
    ASSERT_EQ(got_chunk, want_chunk)
        << "unpack " << region.ToString() << " into " << chunk_box.ToString();
  }
}

TEST(BoxGeometryTest, RandomChunkToChunkCopiesMatchCopyBox) {
  std::mt19937 rng(7);
  int checked = 0;
  for (int iter = 0; iter < 3000; ++iter) {
    const int ndim = 1 + static_cast<int>(rng() % 4);
    const Box a = RandomBox(ndim, rng, /*max_extent=*/5, /*max_offset=*/5);
    const Box b = RandomBox(ndim, rng, /*max_extent=*/5, /*max_offset=*/5);
    const Box common = a.Intersect(b);
    if (common.Empty()) continue;
    const Box region = RandomSubBox(common, rng);
    const int64_t esize = 4;
    const std::vector<unsigned char> src = RandomBytes(a.Volume() * esize, rng);
    std::vector<unsigned char> want = RandomBytes(b.Volume() * esize, rng);
    std::vector<unsigned char> got = want;
    ASSERT_TRUE(CopyBox(region, src.data(), a, want.data(), b, esize).ok());
    absl::StatusOr<BoxCopyGeometry> g = MakeBoxCopyGeometry(region, a, b, esize);
    ASSERT_TRUE(g.ok()) << g.status();
    EmulateCopy(*g,
                CopyUnitBytes(*g, reinterpret_cast<uintptr_t>(src.data()),
                              reinterpret_cast<uintptr_t>(got.data())),
                src.data(), got.data());
    ASSERT_EQ(got, want) << region.ToString() << " from " << a.ToString() << " to " << b.ToString();
    ++checked;
  }
  EXPECT_GT(checked, 1000);
}

TEST(BoxGeometryTest, ContiguousRegionIsOneRun) {
  // Rows 1..2 of a [4, 5] chunk: one 40-byte run starting at row 1.
  absl::StatusOr<BoxCopyGeometry> g = MakePackGeometry(Box({1, 0}, {2, 5}), Box({0, 0}, {4, 5}), 4);
  ASSERT_TRUE(g.ok());
  EXPECT_EQ(g->runs, 1);
  EXPECT_EQ(g->ndims, 0);
  EXPECT_EQ(g->run_bytes, 40);
  EXPECT_EQ(g->src_start, 20);
  EXPECT_EQ(g->dst_start, 0);
  EXPECT_EQ(CopyUnitBytes(*g, 0, 0), 4);  // 20-byte start: 4-byte units.
}

TEST(BoxGeometryTest, OuterDimsWithMatchingStridesMerge) {
  // [1:3, 0:3, 0:4] of a [4, 3, 5] chunk: runs of 4 elements; the two outer dims step by 15
  // and 5 in the chunk and by 12 and 4 in the packed buffer, so they fold into one dim of 6.
  absl::StatusOr<BoxCopyGeometry> g =
      MakePackGeometry(Box({1, 0, 0}, {2, 3, 4}), Box({0, 0, 0}, {4, 3, 5}), 1);
  ASSERT_TRUE(g.ok());
  EXPECT_EQ(g->ndims, 1);
  EXPECT_EQ(g->count[0], 6);
  EXPECT_EQ(g->src_stride[0], 5);
  EXPECT_EQ(g->dst_stride[0], 4);
  EXPECT_EQ(g->run_bytes, 4);
  EXPECT_EQ(g->runs, 6);
  EXPECT_EQ(g->src_start, 15);
}

TEST(BoxGeometryTest, ExtentOneDimsDropOut) {
  absl::StatusOr<BoxCopyGeometry> g =
      MakePackGeometry(Box({2, 1, 0}, {1, 3, 2}), Box({0, 0, 0}, {3, 4, 6}), 2);
  ASSERT_TRUE(g.ok());
  EXPECT_EQ(g->ndims, 1);
  EXPECT_EQ(g->count[0], 3);
  EXPECT_EQ(g->run_bytes, 4);
  int64_t s, d;
  RunOffsets(*g, 2, &s, &d);
  EXPECT_EQ(s, ((2 * 4 + 3) * 6) * 2);  // Element [2, 3, 0].
  EXPECT_EQ(d, 2 * 4);
}

TEST(BoxGeometryTest, EmptyRegionHasNoRuns) {
  absl::StatusOr<BoxCopyGeometry> g = MakePackGeometry(Box({1, 0}, {0, 5}), Box({0, 0}, {4, 5}), 4);
  ASSERT_TRUE(g.ok());
  EXPECT_EQ(g->runs, 0);
  EXPECT_EQ(TotalBytes(*g), 0);
}

TEST(BoxGeometryTest, ErrorsNameTheBoxes) {
  absl::StatusOr<BoxCopyGeometry> g = MakePackGeometry(Box({3, 0}, {2, 5}), Box({0, 0}, {4, 5}), 4);
  EXPECT_EQ(g.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(g.status().message(), "region [3:5, 0:5] is not inside source box [0:4, 0:5]");

  g = MakeBoxCopyGeometry(Box({0}, {2}), Box({0, 0}, {4, 5}), Box({0}, {2}), 4);
  EXPECT_EQ(g.status().code(), absl::StatusCode::kInvalidArgument);

  g = MakePackGeometry(Box({0}, {2}), Box({0}, {4}), 0);
  EXPECT_EQ(g.status().message(), "element size 0 <= 0");

  g = MakePackGeometry(Box({0}, {-1}), Box({0}, {4}), 1);
  EXPECT_EQ(g.status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(BoxGeometryTest, TooManyStridedDimsIsRejected) {
  // Nine outer dims that cannot merge (extent 2 inside extent 3 everywhere).
  const Shape chunk(10, 3), region(10, 2), zero(10, 0);
  absl::StatusOr<BoxCopyGeometry> g = MakePackGeometry(Box(zero, region), Box(zero, chunk), 1);
  EXPECT_EQ(g.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(g.status().message().find("needs 9 strided dims"), absl::string_view::npos)
      << g.status();
  // Eight is fine.
  const Shape chunk9(9, 3), region9(9, 2), zero9(9, 0);
  EXPECT_TRUE(MakePackGeometry(Box(zero9, region9), Box(zero9, chunk9), 1).ok());
}

}  // namespace
}  // namespace nccl
}  // namespace shardcoord
