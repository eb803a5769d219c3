#include "sharding/block_quant.h"

#include <algorithm>
#include <utility>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "sharding/cast.h"
#include "sharding/cast_bits.h"

namespace shardcoord {
namespace {

constexpr int64_t kMaxBlock = 65536;

absl::Status CheckQuantizable(DType dtype, const Shape& shape, const char* what) {
  if (!IsFloat(dtype) || dtype == DType::kF8E8M0) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, " dtype ", DTypeName(dtype),
                     " cannot be block-quantized (a float dtype other than f8_e8m0 is needed)"));
  }
  if (shape.size() < 2) {
    return absl::InvalidArgumentError(
        absl::StrCat("block quantization needs at least two dims; the shape has ", shape.size()));
  }
  return absl::OkStatus();
}

// Block geometry of a C-order buffer: `outer` matrices of m x n, cut into blocks.
struct Geometry {
  int64_t outer = 1, m = 0, n = 0;
  int64_t block_rows = 0, block_cols = 0;  // Blocks per matrix, each way.

  explicit Geometry(const Shape& shape, const BlockSize& b) {
    for (size_t d = 0; d + 2 < shape.size(); ++d) outer *= shape[d];
    m = shape[shape.size() - 2];
    n = shape[shape.size() - 1];
    block_rows = (m + b.rows - 1) / b.rows;
    block_cols = (n + b.cols - 1) / b.cols;
  }
};

}  // namespace

absl::StatusOr<BlockSize> ParseBlockQuantization(absl::string_view text) {
  const absl::string_view whole = text;
  auto bad = [&]() {
    return absl::InvalidArgumentError(
        absl::StrCat("quantization '", whole,
                     "': want block:ROWSxCOLS (e.g. block:128x128), each 1..", kMaxBlock));
  };
  if (!absl::ConsumePrefix(&text, "block:")) return bad();
  std::vector<absl::string_view> parts = absl::StrSplit(text, 'x');
  BlockSize out;
  if (parts.size() != 2 || !absl::SimpleAtoi(parts[0], &out.rows) ||
      !absl::SimpleAtoi(parts[1], &out.cols) || out.rows < 1 || out.cols < 1 ||
      out.rows > kMaxBlock || out.cols > kMaxBlock) {
    return bad();
  }
  return out;
}

std::string BlockQuantizationText(const BlockSize& block) {
  return absl::StrCat("block:", block.rows, "x", block.cols);
}

absl::StatusOr<Shape> BlockScaleShape(const Shape& shape, const BlockSize& block) {
  if (shape.size() < 2) {
    return absl::InvalidArgumentError(
        absl::StrCat("block quantization needs at least two dims; the shape has ", shape.size()));
  }
  Shape out = shape;
  out[out.size() - 2] = (shape[shape.size() - 2] + block.rows - 1) / block.rows;
  out[out.size() - 1] = (shape[shape.size() - 1] + block.cols - 1) / block.cols;
  return out;
}

absl::StatusOr<Box> BlockScaleBox(const Box& box, const BlockSize& block) {
  if (box.ndim() < 2) {
    return absl::InvalidArgumentError(
        absl::StrCat(box.ToString(), " has fewer than two dims (blocks need two)"));
  }
  const size_t r = box.ndim() - 2, c = box.ndim() - 1;
  if (box.offset(r) % block.rows != 0 || box.offset(c) % block.cols != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        box.ToString(), " does not start on a ", BlockQuantizationText(block), " block boundary"));
  }
  Shape offset = box.offset(), shape = box.shape();
  offset[r] /= block.rows;
  offset[c] /= block.cols;
  shape[r] = (shape[r] + block.rows - 1) / block.rows;
  shape[c] = (shape[c] + block.cols - 1) / block.cols;
  return Box(std::move(offset), std::move(shape));
}

absl::Status QuantizeBlocks(const void* src, DType src_dtype, const Shape& shape,
                            const BlockSize& block, void* dst, float* scales) {
  if (absl::Status s = CheckQuantizable(src_dtype, shape, "src"); !s.ok()) return s;
  const Geometry g(shape, block);
  const int64_t es = ElementSize(src_dtype);
  const auto* in = static_cast<const unsigned char*>(src);
  auto* out = static_cast<unsigned char*>(dst);
  // One block row band at a time in f32: the whole band's values, then per block its amax.
  std::vector<float> band(static_cast<size_t>(std::min(block.rows, g.m) * g.n));
  std::vector<uint32_t> amax(static_cast<size_t>(g.block_cols));  // f32 bits
  for (int64_t o = 0; o < g.outer; ++o) {
    for (int64_t br = 0; br < g.block_rows; ++br) {
      const int64_t r0 = br * block.rows;
      const int64_t rows = std::min(block.rows, g.m - r0);
      const int64_t first = (o * g.m + r0) * g.n;  // Element index of the band's start.
      if (absl::Status s = Cast(in + first * es, src_dtype, band.data(), DType::kF32, rows * g.n);
          !s.ok()) {
        return s;
      }
      // The per-element steps are cast_bits.h's, which the GPU kernels run too.
      std::fill(amax.begin(), amax.end(), 0u);
      for (int64_t r = 0; r < rows; ++r) {
        const float* row = band.data() + r * g.n;
        for (int64_t c = 0; c < g.n; ++c) {
          amax[c / block.cols] = cast_bits::AmaxWith(amax[c / block.cols], row[c]);
        }
      }
      float* scale_row = scales + (o * g.block_rows + br) * g.block_cols;
      for (int64_t bc = 0; bc < g.block_cols; ++bc) scale_row[bc] = cast_bits::BlockScale(amax[bc]);
      for (int64_t r = 0; r < rows; ++r) {
        const float* row = band.data() + r * g.n;
        unsigned char* q = out + first + r * g.n;
        for (int64_t c = 0; c < g.n; ++c) {
          q[c] = cast_bits::QuantizeE4M3(row[c], scale_row[c / block.cols]);
        }
      }
    }
  }
  return absl::OkStatus();
}

absl::Status DequantizeBlocks(const void* src, const float* scales, const Shape& shape,
                              const BlockSize& block, void* dst, DType dst_dtype) {
  if (absl::Status s = CheckQuantizable(dst_dtype, shape, "dst"); !s.ok()) return s;
  const Geometry g(shape, block);
  const int64_t es = ElementSize(dst_dtype);
  const auto* in = static_cast<const unsigned char*>(src);
  auto* out = static_cast<unsigned char*>(dst);
  std::vector<float> row(static_cast<size_t>(g.n));
  for (int64_t o = 0; o < g.outer; ++o) {
    for (int64_t r = 0; r < g.m; ++r) {
      const int64_t first = (o * g.m + r) * g.n;
      if (absl::Status s = Cast(in + first, DType::kF8E4M3, row.data(), DType::kF32, g.n);
          !s.ok()) {
        return s;
      }
      const float* scale_row = scales + (o * g.block_rows + r / block.rows) * g.block_cols;
      for (int64_t c = 0; c < g.n; ++c) {
        row[c] = cast_bits::MulF32(row[c], scale_row[c / block.cols]);  // DequantizeE4M3's step
      }
      if (absl::Status s = Cast(row.data(), DType::kF32, out + first * es, dst_dtype, g.n);
          !s.ok()) {
        return s;
      }
    }
  }
  return absl::OkStatus();
}

}  // namespace shardcoord
