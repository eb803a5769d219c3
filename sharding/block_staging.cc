#include "sharding/block_staging.h"

#include <algorithm>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"

namespace shardcoord {
namespace {

// The block extent per dim: 1 for leading dims, rows and cols for the last two.
Shape BlockExtents(int ndim, const BlockSize& block) {
  Shape b(static_cast<size_t>(ndim), 1);
  b[ndim - 2] = block.rows;
  b[ndim - 1] = block.cols;
  return b;
}

int64_t CeilDiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

// Calls fn(flat index, multi-index) for every cell of `box` in a grid of `grid`, row-major.
template <typename Fn>
void ForEachCell(const Shape& grid, const Shape& lo, const Shape& hi, Fn fn) {
  const int n = static_cast<int>(grid.size());
  for (int d = 0; d < n; ++d) {
    if (lo[d] >= hi[d]) return;
  }
  Shape idx = lo;
  while (true) {
    int64_t flat = 0;
    for (int d = 0; d < n; ++d) flat = flat * grid[d] + idx[d];
    fn(flat, idx);
    int d = n - 1;
    while (d >= 0 && ++idx[d] == hi[d]) {
      idx[d] = lo[d];
      --d;
    }
    if (d < 0) return;
  }
}

// The elements of grid box [lo, hi) in a tensor of `shape`.
Box ElementBox(const Shape& shape, const Shape& bs, const Shape& lo, const Shape& hi) {
  Shape off(shape.size()), ext(shape.size());
  for (size_t d = 0; d < shape.size(); ++d) {
    off[d] = lo[d] * bs[d];
    ext[d] = std::min(hi[d] * bs[d], shape[d]) - off[d];
  }
  return Box(std::move(off), std::move(ext));
}

}  // namespace

Box BlockBoxOf(const Box& box, const BlockSize& block) {
  const Shape bs = BlockExtents(box.ndim(), block);
  Shape off(bs.size()), ext(bs.size());
  for (size_t d = 0; d < bs.size(); ++d) {
    off[d] = box.offset(d) / bs[d];
    ext[d] = CeilDiv(box.end(d), bs[d]) - off[d];
  }
  return Box(std::move(off), std::move(ext));
}

bool IsBlockAligned(const Layout& layout, const BlockSize& block) {
  const Shape& shape = layout.global_shape();
  const int n = layout.ndim();
  if (n < 2) return false;
  const Shape bs = BlockExtents(n, block);
  for (const RankChunks& rc : layout.ranks()) {
    for (const Chunk& c : rc.chunks) {
      for (int d = n - 2; d < n; ++d) {
        if (c.box.offset(d) % bs[d] != 0) return false;
        if (c.box.end(d) % bs[d] != 0 && c.box.end(d) != shape[d]) return false;
      }
    }
  }
  return true;
}

namespace {

absl::Status CheckChunks(const Shape& shape, const RankChunks& chunks, const BlockSize& block,
                         const RankChunks& scale_chunks) {
  const int n = static_cast<int>(shape.size());
  if (n < 2) {
    return absl::InvalidArgumentError(absl::StrCat(
        "block quantization needs at least two dims; the shape is ", ShapeToString(shape)));
  }
  if (chunks.chunks.size() != scale_chunks.chunks.size()) {
    return absl::InvalidArgumentError(absl::StrCat("scale_chunks: ", scale_chunks.chunks.size(),
                                                   " chunks for ", chunks.chunks.size(),
                                                   " chunks of the tensor"));
  }
  const Shape bs = BlockExtents(n, block);
  for (size_t i = 0; i < chunks.chunks.size(); ++i) {
    const Box& box = chunks.chunks[i].box;
    if (box.ndim() != n || !box.InBounds(shape)) {
      return absl::InvalidArgumentError(absl::StrCat("chunks[", i, "]: box ", box.ToString(),
                                                     " is outside shape ", ShapeToString(shape)));
    }
    for (int d = n - 2; d < n; ++d) {
      if (box.offset(d) % bs[d] != 0 || (box.end(d) % bs[d] != 0 && box.end(d) != shape[d])) {
        return absl::InvalidArgumentError(
            absl::StrCat("chunks[", i, "]: box ", box.ToString(), " is not aligned to blocks of ",
                         block.rows, "x", block.cols, " in shape ", ShapeToString(shape)));
      }
    }
    const Box want = BlockBoxOf(box, block);
    if (scale_chunks.chunks[i].box != want) {
      return absl::InvalidArgumentError(
          absl::StrCat("scale_chunks[", i, "]: box ", scale_chunks.chunks[i].box.ToString(),
                       ", want ", want.ToString(), " (the blocks of ", box.ToString(), ")"));
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status QuantizeChunks(const void* src, DType src_dtype, const Shape& shape,
                            const RankChunks& chunks, const BlockSize& block,
                            const RankChunks& scale_chunks, void* dst, float* scales) {
  if (absl::Status s = CheckChunks(shape, chunks, block, scale_chunks); !s.ok()) return s;
  const int64_t es = ElementSize(src_dtype);
  for (size_t i = 0; i < chunks.chunks.size(); ++i) {
    const Chunk& c = chunks.chunks[i];
    if (c.box.Empty()) continue;
    absl::Status s =
        QuantizeBlocks(static_cast<const unsigned char*>(src) + c.local_offset * es, src_dtype,
                       c.box.shape(), block, static_cast<unsigned char*>(dst) + c.local_offset,
                       scales + scale_chunks.chunks[i].local_offset);
    if (!s.ok()) return s;
  }
  return absl::OkStatus();
}

absl::Status DequantizeChunks(const void* src, const float* scales, const Shape& shape,
                              const RankChunks& chunks, const BlockSize& block,
                              const RankChunks& scale_chunks, void* dst, DType dst_dtype) {
  if (absl::Status s = CheckChunks(shape, chunks, block, scale_chunks); !s.ok()) return s;
  const int64_t es = ElementSize(dst_dtype);
  for (size_t i = 0; i < chunks.chunks.size(); ++i) {
    const Chunk& c = chunks.chunks[i];
    if (c.box.Empty()) continue;
    absl::Status s =
        DequantizeBlocks(static_cast<const unsigned char*>(src) + c.local_offset,
                         scales + scale_chunks.chunks[i].local_offset, c.box.shape(), block,
                         static_cast<unsigned char*>(dst) + c.local_offset * es, dst_dtype);
    if (!s.ok()) return s;
  }
  return absl::OkStatus();
}

absl::StatusOr<BlockStagingPlan> PlanBlockStaging(const Layout& source, const BlockSize& block) {
  const Shape& shape = source.global_shape();
  const int n = source.ndim();
  if (n < 2) {
    return absl::InvalidArgumentError(absl::StrCat(
        "block quantization needs at least two dims; the shape is ", ShapeToString(shape)));
  }
  if (block.rows < 1 || block.cols < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("block ", block.rows, "x", block.cols, ": both sides must be positive"));
  }
  const Shape bs = BlockExtents(n, block);
  Shape grid(static_cast<size_t>(n));
  int64_t cells = 1;
  for (int d = 0; d < n; ++d) {
    grid[d] = CeilDiv(shape[d], bs[d]);
    cells *= grid[d];
  }

  // Per block: the rank index (into source.ranks()) that stages it and whether it was whole.
  const auto& ranks = source.ranks();
  std::vector<int> owner(static_cast<size_t>(cells), -1);
  std::vector<int64_t> best(static_cast<size_t>(cells), 0);
  std::vector<bool> whole(static_cast<size_t>(cells), false);
  const Shape zero(static_cast<size_t>(n), 0);
  for (size_t r = 0; r < ranks.size(); ++r) {
    absl::flat_hash_map<int64_t, int64_t> held;  // Block -> elements this rank holds of it.
    for (const Chunk& c : ranks[r].chunks) {
      if (c.partial_index != 0 || c.box.Empty()) continue;
      Shape lo(static_cast<size_t>(n)), hi(static_cast<size_t>(n));
      for (int d = 0; d < n; ++d) {
        lo[d] = c.box.offset(d) / bs[d];
        hi[d] = CeilDiv(c.box.end(d), bs[d]);
      }
      ForEachCell(grid, lo, hi, [&](int64_t flat, const Shape& idx) {
        Shape up = idx;
        for (int d = 0; d < n; ++d) ++up[d];
        const Box cell = ElementBox(shape, bs, idx, up);
        const Box part = c.box.Intersect(cell);
        if (!source.is_partial() && part == cell && !whole[flat]) {
          whole[flat] = true;
          owner[flat] = static_cast<int>(r);
        }
        held[flat] += part.Volume();
      });
    }
    for (const auto& [flat, volume] : held) {
      if (!whole[flat] && volume > best[flat]) {
        best[flat] = volume;
        owner[flat] = static_cast<int>(r);
      }
    }
  }

  BlockStagingPlan plan;
  plan.blocks = cells;
  plan.cut_blocks = std::count(whole.begin(), whole.end(), false);
  std::vector<RankChunks> staging(ranks.size()), scales(ranks.size());
  for (size_t r = 0; r < ranks.size(); ++r) {
    staging[r].rank = scales[r].rank = ranks[r].rank;
    staging[r].coord = scales[r].coord = ranks[r].coord;
  }
  // Greedy merge: from each unassigned block in row-major order, a run along the last dim,
  // then grown one slab at a time over the earlier dims while the slab is the same rank's.
  std::vector<bool> assigned(static_cast<size_t>(cells), false);
  auto same = [&](int rank, const Shape& lo, const Shape& hi) {
    bool ok = true;
    ForEachCell(grid, lo, hi, [&](int64_t flat, const Shape&) {
      ok = ok && !assigned[flat] && owner[flat] == rank;
    });
    return ok;
  };
  ForEachCell(grid, zero, grid, [&](int64_t flat, const Shape& idx) {
    if (assigned[flat]) return;
    const int rank = owner[flat];
    if (rank < 0) return;  // Unreachable for a valid layout: every block is held by someone.
    Shape hi = idx;
    for (int d = 0; d < n; ++d) ++hi[d];
    for (int d = n - 1; d >= 0; --d) {
      while (hi[d] < grid[d]) {
        Shape slab_lo = idx, slab_hi = hi;
        slab_lo[d] = hi[d];
        slab_hi[d] = hi[d] + 1;
        if (!same(rank, slab_lo, slab_hi)) break;
        ++hi[d];
      }
    }
    ForEachCell(grid, idx, hi, [&](int64_t f, const Shape&) { assigned[f] = true; });
    Chunk chunk;
    chunk.box = ElementBox(shape, bs, idx, hi);
    chunk.local_offset = staging[rank].local_elements;
    staging[rank].local_elements += chunk.box.Volume();
    staging[rank].chunks.push_back(std::move(chunk));
    Chunk scale;
    scale.box = Box(idx, [&] {
      Shape ext(static_cast<size_t>(n));
      for (int d = 0; d < n; ++d) ext[d] = hi[d] - idx[d];
      return ext;
    }());
    scale.local_offset = scales[rank].local_elements;
    scales[rank].local_elements += scale.box.Volume();
    scales[rank].chunks.push_back(std::move(scale));
  });
  absl::StatusOr<Layout> staged = Layout::FromChunks(shape, std::move(staging));
  if (!staged.ok()) return staged.status();
  absl::StatusOr<Layout> scaled = Layout::FromChunks(grid, std::move(scales));
  if (!scaled.ok()) return scaled.status();
  plan.staging = *std::move(staged);
  plan.scales = *std::move(scaled);
  return plan;
}

}  // namespace shardcoord
