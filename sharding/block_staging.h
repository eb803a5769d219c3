#ifndef SHARDCOORD_SHARDING_BLOCK_STAGING_H_
#define SHARDCOORD_SHARDING_BLOCK_STAGING_H_

// Where block-scaled quantization (sharding/block_quant.h) is computed when a tensor's layout
// cuts blocks between ranks (issue 28). A block's scale needs all of the block's elements, so
// the block must be whole on one rank before it is quantized. BlockStaging picks, on the
// source's own ranks, a staging layout in which every block is held whole by exactly one rank:
// - a block that one chunk of the source already holds whole stays on that chunk's rank (the
//   first such rank in layout order), so nothing moves for it;
// - any other block ("cut") goes to the rank that holds most of its elements (ties: the first
//   in layout order); for a partial source every block counts as cut (it must be reduced).
// Each rank's blocks are merged greedily into block-aligned boxes (runs along the last dim,
// then grown over the earlier dims), so a source that already holds whole blocks, e.g. S(0)
// with shard rows a multiple of the block rows, stages onto exactly its own boxes.
// Blocks span the last two dims (rows x cols); each leading-dim index is its own block.
// Pure host code, no threads.

#include <cstdint>

#include "absl/status/statusor.h"
#include "sharding/block_quant.h"
#include "sharding/box.h"
#include "sharding/dtype.h"
#include "sharding/layout.h"

namespace shardcoord {

struct BlockStagingPlan {
  // The tensor's staging layout: every chunk box starts on block boundaries and holds whole
  // blocks (edge blocks are clipped by the tensor's shape); chunks are disjoint, no replicas.
  Layout staging;
  // The scale tensor's layout (shape BlockScaleShape): the same ranks and, chunk for chunk,
  // the blocks of the staging chunk at the same index.
  Layout scales;
  int64_t blocks = 0;      // Blocks in the tensor.
  int64_t cut_blocks = 0;  // Blocks no single source chunk holds whole.
};

// INVALID_ARGUMENT for fewer than two dims or a layout of another shape.
absl::StatusOr<BlockStagingPlan> PlanBlockStaging(const Layout& source, const BlockSize& block);

// True if every chunk of `layout` starts on block boundaries of its last two dims and ends on
// one or at the tensor's edge: each chunk then holds whole blocks only.
bool IsBlockAligned(const Layout& layout, const BlockSize& block);

// The blocks of `box` (block-aligned in a tensor of `shape`) as a box of the scale tensor.
Box BlockBoxOf(const Box& box, const BlockSize& block);

// What a worker does with its part of a staged tensor: every chunk of `chunks` (of a tensor
// of `shape`; each chunk's elements row-major at its local offset, as a worker's local
// buffer holds them) is quantized on its own with QuantizeBlocks, which is exact because a
// block-aligned chunk's blocks start at its origin. `dst` (one byte per element) gets the
// f8_e4m3 values at the same offsets, `scales` the f32 scales of chunk i at
// scale_chunks.chunks[i].local_offset. INVALID_ARGUMENT naming the chunk when a chunk is not
// block-aligned or scale_chunks.chunks[i].box is not BlockBoxOf(its box); QuantizeBlocks'.
absl::Status QuantizeChunks(const void* src, DType src_dtype, const Shape& shape,
                            const RankChunks& chunks, const BlockSize& block,
                            const RankChunks& scale_chunks, void* dst, float* scales);
// The inverse: `src` holds f8_e4m3 values in `chunks`, `scales` theirs in `scale_chunks`;
// `dst` gets `dst_dtype` at the same offsets. Errors as QuantizeChunks'.
absl::Status DequantizeChunks(const void* src, const float* scales, const Shape& shape,
                              const RankChunks& chunks, const BlockSize& block,
                              const RankChunks& scale_chunks, void* dst, DType dst_dtype);

}  // namespace shardcoord

#endif  // SHARDCOORD_SHARDING_BLOCK_STAGING_H_
