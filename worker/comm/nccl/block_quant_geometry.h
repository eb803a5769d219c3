#ifndef SHARDCOORD_WORKER_COMM_NCCL_BLOCK_QUANT_GEOMETRY_H_
#define SHARDCOORD_WORKER_COMM_NCCL_BLOCK_QUANT_GEOMETRY_H_

// The index math of the block quantize and dequantize kernels, shared with the host test that
// runs it against sharding/block_quant.cc. Plain C++ only: this header is included by .cu files;
// box_geometry_builder.h builds a geometry from a shape with block_quant.h's checks.

#include <cstdint>

#include "worker/comm/nccl/hd.h"

namespace shardcoord {
namespace nccl {

// A dense C-order buffer as `outer` matrices of m x n cut into blocks of rows x cols,
// row_blocks x col_blocks of them per matrix (the scale tensor's last two dims).
struct BlockQuantGeometry {
  int64_t outer = 0;
  int64_t m = 0;
  int64_t n = 0;
  int64_t rows = 0;
  int64_t cols = 0;
  int64_t row_blocks = 0;
  int64_t col_blocks = 0;
};

SC_HD inline int64_t ScaleBlockCount(const BlockQuantGeometry& g) {
  return g.outer * g.row_blocks * g.col_blocks;
}

// Scale block b (its index in the scale tensor): where its elements lie in the buffer.
struct QuantBlock {
  int64_t first;  // Element index of the block's top-left element.
  int64_t width;  // Columns of this block (edge blocks are narrower).
  int64_t count;  // Elements of this block.
};

SC_HD inline QuantBlock QuantBlockAt(const BlockQuantGeometry& g, int64_t b) {
  const int64_t bc = b % g.col_blocks;
  const int64_t br = (b / g.col_blocks) % g.row_blocks;
  const int64_t o = b / (g.col_blocks * g.row_blocks);
  const int64_t r0 = br * g.rows, c0 = bc * g.cols;
  const int64_t h = g.m - r0 < g.rows ? g.m - r0 : g.rows;
  const int64_t w = g.n - c0 < g.cols ? g.n - c0 : g.cols;
  return QuantBlock{(o * g.m + r0) * g.n + c0, w, h * w};
}

// Buffer element index of element i (row-major within the block) of block `qb`.
SC_HD inline int64_t QuantBlockElement(const BlockQuantGeometry& g, const QuantBlock& qb,
                                       int64_t i) {
  return qb.first + (i / qb.width) * g.n + i % qb.width;
}

// The scale block of buffer element e.
SC_HD inline int64_t ScaleIndexOf(const BlockQuantGeometry& g, int64_t e) {
  const int64_t c = e % g.n;
  const int64_t r = (e / g.n) % g.m;
  const int64_t o = e / (g.n * g.m);
  return (o * g.row_blocks + r / g.rows) * g.col_blocks + c / g.cols;
}

}  // namespace nccl
}  // namespace shardcoord

#endif  // SHARDCOORD_WORKER_COMM_NCCL_BLOCK_QUANT_GEOMETRY_H_
