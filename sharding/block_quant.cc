#include "sharding/block_quant.h"

#include <algorithm>
#include <cstring>
#include <utility>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "sharding/cast.h"
#include "sharding/cast_bits.h"
#include "sharding/fast_cast.h"

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
  // One block row band at a time in f32: the whole band's values (Cast's fast paths), then per
  // block its amax, then each element divided by its block's scale and rounded to e4m3. The
  // per-element steps are cast_bits.h's (which the GPU kernels run too); the f32 -> e4m3
  // rounding is fast_cast.h's form of it, equal for every f32.
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
      std::fill(amax.begin(), amax.end(), 0u);
      for (int64_t r = 0; r < rows; ++r) {
        const float* row = band.data() + r * g.n;
        for (int64_t bc = 0; bc < g.block_cols; ++bc) {
          const int64_t c1 = std::min(g.n, (bc + 1) * block.cols);
          uint32_t a = amax[bc];
          for (int64_t c = bc * block.cols; c < c1; ++c) a = cast_bits::AmaxWith(a, row[c]);
          amax[bc] = a;
        }
      }
      float* scale_row = scales + (o * g.block_rows + br) * g.block_cols;
      for (int64_t bc = 0; bc < g.block_cols; ++bc) scale_row[bc] = cast_bits::BlockScale(amax[bc]);
      for (int64_t r = 0; r < rows; ++r) {
        const float* row = band.data() + r * g.n;
        unsigned char* q = out + first + r * g.n;
        for (int64_t bc = 0; bc < g.block_cols; ++bc) {
          const float s = scale_row[bc];
          const int64_t c1 = std::min(g.n, (bc + 1) * block.cols);
          for (int64_t c = bc * block.cols; c < c1; ++c) {
            // cast_bits::QuantizeE4M3: e4m3(x / s), the division in f32.
            q[c] = fast_cast::F32ToE4M3(cast_bits::F32Bits(cast_bits::DivF32(row[c], s)));
          }
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
  // cast_bits::DequantizeE4M3 per element: f32(q) (a table of cast_bits' values) times the
  // block's scale in f32; then to the target, fused for bf16 and f32 (fast_cast.h's f32 ->
  // bf16), through a row of f32 and Cast for the other dtypes.
  const uint32_t* table = F32BitsTable(DType::kF8E4M3);
  std::vector<float> row(dst_dtype == DType::kBF16 ? 0 : static_cast<size_t>(g.n));
  for (int64_t o = 0; o < g.outer; ++o) {
    for (int64_t r = 0; r < g.m; ++r) {
      const int64_t first = (o * g.m + r) * g.n;
      const unsigned char* q = in + first;
      const float* scale_row = scales + (o * g.block_rows + r / block.rows) * g.block_cols;
      unsigned char* y = out + first * es;
      for (int64_t bc = 0; bc < g.block_cols; ++bc) {
        const float s = scale_row[bc];
        const int64_t c0 = bc * block.cols, c1 = std::min(g.n, (bc + 1) * block.cols);
        if (dst_dtype == DType::kBF16) {
          for (int64_t c = c0; c < c1; ++c) {
            const float v = cast_bits::MulF32(cast_bits::BitsF32(table[q[c]]), s);
            const uint16_t b = fast_cast::F32ToBF16(cast_bits::F32Bits(v));
            std::memcpy(y + c * 2, &b, 2);
          }
        } else {
          for (int64_t c = c0; c < c1; ++c) {
            row[c] = cast_bits::MulF32(cast_bits::BitsF32(table[q[c]]), s);
          }
        }
      }
      if (dst_dtype == DType::kF32) {
        std::memcpy(y, row.data(), static_cast<size_t>(g.n) * 4);
      } else if (dst_dtype != DType::kBF16) {
        if (absl::Status s = Cast(row.data(), DType::kF32, y, dst_dtype, g.n); !s.ok()) return s;
      }
    }
  }
  return absl::OkStatus();
}

}  // namespace shardcoord
