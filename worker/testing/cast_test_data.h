#ifndef SHARDCOORD_WORKER_TESTING_CAST_TEST_DATA_H_
#define SHARDCOORD_WORKER_TESTING_CAST_TEST_DATA_H_

// Generated inputs shared by the box-copy, cast and block-quant kernel tests (host emulation
// and GPU): random boxes and sub-boxes, and block-quantization sources full of special values.

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "sharding/block_quant.h"
#include "sharding/box.h"
#include "sharding/cast.h"
#include "sharding/dtype.h"

namespace shardcoord {
namespace testing_util {

// A box of `ndim` dims, each offset in [0, max_offset) and extent in [1, max_extent].
inline Box RandomBox(int ndim, std::mt19937& rng, int64_t max_extent, int64_t max_offset = 4) {
  Shape off(ndim), shape(ndim);
  for (int d = 0; d < ndim; ++d) {
    off[d] = static_cast<int64_t>(rng() % max_offset);
    shape[d] = 1 + static_cast<int64_t>(rng() % max_extent);
  }
  return Box(off, shape);
}

// A random sub-box of `box` (sometimes all of a dim from its start, sometimes one element).
inline Box RandomSubBox(const Box& box, std::mt19937& rng) {
  Shape off(box.ndim()), shape(box.ndim());
  for (int d = 0; d < box.ndim(); ++d) {
    const int64_t n = box.shape(d);
    const int64_t begin = static_cast<int64_t>(rng() % n);
    off[d] = box.offset(d) + begin;
    shape[d] = (rng() % 3 == 0) ? n - begin : 1 + static_cast<int64_t>(rng() % (n - begin));
  }
  return Box(off, shape);
}

// Values of `dtype` for block quantization, C-order over `shape`: magnitudes spread over many
// binades (a per-row scale), with NaNs, infinities, signed zeros, subnormals and huge values
// sprinkled in, the first block all zeros and the second (where there is one) with no finite
// value.
inline std::vector<unsigned char> QuantSource(DType dtype, const Shape& shape,
                                              const BlockSize& block, std::mt19937& rng) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  const int64_t cols = shape.back(), rows = shape[shape.size() - 2];
  std::normal_distribution<double> normal(0.0, 1.0);
  std::vector<double> v(static_cast<size_t>(n));
  const double specials[] = {std::nan(""), -std::nan(""), HUGE_VAL, -HUGE_VAL, -0.0,  0.0,
                             1e-40,        -3e-45,        1e30,     -7e38,     448.0, 1e-310};
  for (int64_t i = 0; i < n; ++i) {
    const int64_t r = (i / cols) % rows;
    v[static_cast<size_t>(i)] = normal(rng) * std::ldexp(1.0, static_cast<int>(r % 40) - 20);
    if (rng() % 50 == 0) v[static_cast<size_t>(i)] = specials[rng() % 12];
  }
  for (int64_t r = 0; r < std::min(block.rows, rows); ++r) {
    for (int64_t c = 0; c < std::min(block.cols, cols); ++c) {
      v[static_cast<size_t>(r * cols + c)] = 0;
    }
    for (int64_t c = block.cols; c < std::min(2 * block.cols, cols); ++c) {
      v[static_cast<size_t>(r * cols + c)] = (r + c) % 2 == 0 ? -HUGE_VAL : std::nan("");
    }
  }
  const int64_t es = ElementSize(dtype);
  std::vector<unsigned char> out(static_cast<size_t>(n * es));
  for (int64_t i = 0; i < n; ++i) {
    const uint64_t bits = DoubleToFloatBits(v[static_cast<size_t>(i)], dtype);
    std::memcpy(&out[static_cast<size_t>(i * es)], &bits, static_cast<size_t>(es));
  }
  return out;
}

}  // namespace testing_util
}  // namespace shardcoord

#endif  // SHARDCOORD_WORKER_TESTING_CAST_TEST_DATA_H_
