#ifndef SHARDCOORD_COORDINATOR_STATE_TENSOR_BANDS_H_
#define SHARDCOORD_COORDINATOR_STATE_TENSOR_BANDS_H_

// The pure math of streamed uploads and downloads: a tensor is cut into row-major bands
// along dim 0 (a band is a range of dim-0 indices), and each band is moved on its own, so
// the coordinator holds a few bands instead of the whole tensor.
//
// A band holds at most `band_bytes` bytes and at least one dim-0 index, so it is larger than
// `band_bytes` only when one index alone is (a [2, 2^34] tensor has two bands of 64 GiB
// each); a 1-d tensor is cut by elements (its dim-0 indices), a scalar is one band, a tensor
// with no elements has no band. Bands along the outermost dim are contiguous in the
// row-major tensor, so a client streams them in order, and every chunk's part in a band is
// one contiguous range of the chunk (and of a local buffer holding it).

#include <cstdint>
#include <functional>
#include <vector>

#include "sharding/box.h"
#include "sharding/layout.h"

namespace shardcoord {

// Default band size of the coordinator (--io-band-bytes).
inline constexpr int64_t kDefaultBandBytes = int64_t{64} << 20;

class BandPlan {
 public:
  // `element_size` > 0; `band_bytes` <= 0 is taken as 1 (one index per band).
  BandPlan(Shape shape, int64_t element_size, int64_t band_bytes);

  int64_t num_bands() const { return num_bands_; }
  // Dim-0 indices per band (the last band may have fewer); 1 for a scalar.
  int64_t rows_per_band() const { return rows_per_band_; }
  // Band `i` as a box of the tensor: [r0:r1, whole other dims]; the scalar's 0-d box.
  Box band(int64_t i) const;
  int64_t band_bytes(int64_t i) const { return band(i).Volume() * element_size_; }
  const Shape& shape() const { return shape_; }

 private:
  Shape shape_;
  int64_t element_size_;
  int64_t rows_per_band_ = 1;
  int64_t num_bands_ = 0;
};

// One chunk of a tensor and the rank chosen to read it from.
struct BandSource {
  Box box;
  int64_t partial_index = 0;
  int64_t rank = 0;

  friend bool operator==(const BandSource& a, const BandSource& b) {
    return a.box == b.box && a.partial_index == b.partial_index && a.rank == b.rank;
  }
};

// One live replica per (box, partial index) of `layout`, spreading the elements read over
// the holders (the least-loaded holder so far wins), ordered by partial index (contribution
// 0 first, which a partial download copies before reducing the others in), then layout
// order. Empty chunks are skipped. `live(rank)` says which ranks may be read.
std::vector<BandSource> ChooseSources(const Layout& layout,
                                      const std::function<bool(int64_t rank)>& live);

// What to read for one band: every source's intersection with `band`, in `sources` order,
// empty intersections left out.
std::vector<BandSource> BandReads(const std::vector<BandSource>& sources, const Box& band);

// Where a band's elements go in one rank's local buffer: `box` (a part of the band) lands
// row-major at element `local_offset`; with `zeros` it is written as zeros (a Partial(sum)
// contribution other than 0 holds zeros, as ChunkUnsharded splits one).
struct LocalWrite {
  int64_t local_offset = 0;
  Box box;
  bool zeros = false;

  friend bool operator==(const LocalWrite& a, const LocalWrite& b) {
    return a.local_offset == b.local_offset && a.box == b.box && a.zeros == b.zeros;
  }
};

// The writes of `band` into rank `rc`'s local buffer, by local offset. `zero_partials`: the
// layout is Partial(sum), whose contributions other than 0 are zeros.
std::vector<LocalWrite> BandWrites(const RankChunks& rc, const Box& band, bool zero_partials);

// True when, for every rank, the writes of band 0, then band 1, ... land at increasing local
// offsets, so each local buffer can be streamed to its worker front to back as the bands
// arrive. Layouts built from placements (one chunk per rank) and flat specs are; a rank whose
// chunks sit in its buffer in another order than along dim 0 is not.
bool WritesInOrder(const Layout& layout, const BandPlan& plan);

}  // namespace shardcoord

#endif  // SHARDCOORD_COORDINATOR_STATE_TENSOR_BANDS_H_
