#ifndef SHARDCOORD_SHARDING_BLOCK_QUANT_H_
#define SHARDCOORD_SHARDING_BLOCK_QUANT_H_

// Block-scaled FP8, the DeepSeek-V3 / Hugging Face convention (issue 28): a tensor's last two
// dims are cut into blocks of `rows` x `cols` (leading dims kept, edge blocks smaller); each
// block has one f32 scale s, and its elements are stored as f8_e4m3 values q with x ~ q * s.
// The scale tensor has the shape of the blocks: [..., ceil(M / rows), ceil(N / cols)].
//
// The rules, exact for every bit pattern (the host code here is the reference the GPU kernels
// must equal bit for bit):
// - x is first taken to f32 by sharding/cast.h (exact from bf16/f16/f8, rounded from f64);
// - amax is the largest |x| over the block's finite elements (NaN and +-inf skipped);
// - s = amax / 448 in f32 (round to nearest even); a block whose s is 0 (all zeros, no finite
//   element, or amax so small that the division underflows) has s = 1;
// - q = e4m3(x / s), the division in f32 and the conversion by cast.h (ties to even,
//   saturating at +-448, +-inf to +-448, NaN stays NaN);
// - dequantizing: y = dtype(f32(q) * s), the product in f32, then cast.h's f32 -> dtype.
// Pure host code, no threads.

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "sharding/box.h"
#include "sharding/dtype.h"

namespace shardcoord {

struct BlockSize {
  int64_t rows = 128;
  int64_t cols = 128;

  friend bool operator==(const BlockSize& a, const BlockSize& b) {
    return a.rows == b.rows && a.cols == b.cols;
  }
};

// "block:128x128" (rows x cols, each 1..65536). INVALID_ARGUMENT naming the text otherwise.
absl::StatusOr<BlockSize> ParseBlockQuantization(absl::string_view text);
std::string BlockQuantizationText(const BlockSize& block);  // "block:128x128"

// The scale tensor's shape for a tensor of `shape`: INVALID_ARGUMENT for fewer than two dims.
absl::StatusOr<Shape> BlockScaleShape(const Shape& shape, const BlockSize& block);

// The scales of the blocks of `box` (a box of a tensor cut into `block`s over its last two
// dims) as a box of the scale tensor. INVALID_ARGUMENT for fewer than two dims or a box that
// does not start on a block boundary.
absl::StatusOr<Box> BlockScaleBox(const Box& box, const BlockSize& block);

// Quantizes a whole C-order buffer of `shape` (blocks aligned at its origin): `src` holds
// `src_dtype` (a float dtype other than f8_e8m0), `dst` gets the f8_e4m3 values (one byte
// each) and `scales` the f32 scales in BlockScaleShape order. INVALID_ARGUMENT for another
// dtype or fewer than two dims.
absl::Status QuantizeBlocks(const void* src, DType src_dtype, const Shape& shape,
                            const BlockSize& block, void* dst, float* scales);

// The inverse: `src` holds f8_e4m3 values of `shape`, `scales` their scales; `dst` gets
// `dst_dtype` (a float dtype other than f8_e8m0). Errors as QuantizeBlocks'.
absl::Status DequantizeBlocks(const void* src, const float* scales, const Shape& shape,
                              const BlockSize& block, void* dst, DType dst_dtype);

}  // namespace shardcoord

#endif  // SHARDCOORD_SHARDING_BLOCK_QUANT_H_
