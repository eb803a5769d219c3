#ifndef SHARDCOORD_SHARDING_LAYOUT_H_
#define SHARDCOORD_SHARDING_LAYOUT_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "sharding/box.h"
#include "sharding/mesh.h"
#include "sharding/placement.h"

namespace shardcoord {

// One piece of the tensor held by a rank. Its elements are stored row-major (over `box`)
// and contiguously in the rank's local buffer, starting at element `local_offset`.
struct Chunk {
  Box box;
  int64_t local_offset = 0;
  // Which partial contribution this is (row-major index over the Partial mesh dims); 0 when
  // the layout holds no partial values. Chunks with equal boxes and equal partial_index are
  // replicas; equal boxes with different partial_index reduce into the value.
  int64_t partial_index = 0;

  friend bool operator==(const Chunk& a, const Chunk& b) {
    return a.box == b.box && a.local_offset == b.local_offset && a.partial_index == b.partial_index;
  }
};

// Everything one rank holds.
struct RankChunks {
  int64_t rank = 0;
  Shape coord;  // Mesh coordinate; empty when the layout has no mesh.
  std::vector<Chunk> chunks;
  int64_t local_elements = 0;  // Size of the local buffer in elements.
};

// Every rank's chunks of one tensor: what all sharding specs compile down to. Immutable
// once built; every constructor validates (see ValidateLayout).
class Layout {
 public:
  Layout() = default;

  // DTensor semantics: placements apply in mesh-dim order, each Shard(d) splitting what the
  // previous ones left of dim d as torch.chunk does (pieces of ceil(n/k); trailing pieces may
  // be smaller or empty, an empty piece sits at the end of the extent it was cut from), or by
  // explicit sizes that must sum to that extent. One chunk per rank at local offset 0.
  static absl::StatusOr<Layout> FromPlacements(const DeviceMesh& mesh, const Shape& global_shape,
                                               absl::Span<const Placement> placements);

  // OLMo-core ShardingSpec: spec[i] are the flat ranges held by the mesh's i-th rank (row-major
  // order of positions), concatenated in the given order in its local buffer. Each range
  // becomes at most 2*ndim-1 boxes.
  static absl::StatusOr<Layout> FromFlat(const DeviceMesh& mesh, const Shape& global_shape,
                                         const FlatSpec& spec);

  // Arbitrary chunk metadata (e.g. reported by workers). `num_partials` > 1 means chunk
  // partial_index values in [0, num_partials) reduce with `partial_op`.
  static absl::StatusOr<Layout> FromChunks(const Shape& global_shape, std::vector<RankChunks> ranks,
                                           int64_t num_partials = 1,
                                           ReduceOp partial_op = ReduceOp::kSum);

  const Shape& global_shape() const { return rep_->global_shape_; }
  int ndim() const { return static_cast<int>(rep_->global_shape_.size()); }
  int64_t num_elements() const { return Box::Whole(rep_->global_shape_).Volume(); }
  // Ranks in mesh order (or the order given to FromChunks).
  const std::vector<RankChunks>& ranks() const { return rep_->ranks_; }
  // nullptr if `rank` holds nothing of this tensor.
  const RankChunks* Find(int64_t rank) const;
  std::vector<int64_t> RankIds() const;

  const std::optional<DeviceMesh>& mesh() const { return rep_->mesh_; }
  // The placements this was built from (empty for flat or chunk layouts).
  const std::vector<Placement>& placements() const { return rep_->placements_; }
  const std::optional<FlatSpec>& flat_spec() const { return rep_->flat_spec_; }

  bool is_partial() const { return rep_->num_partials_ > 1; }
  int64_t num_partials() const { return rep_->num_partials_; }
  ReduceOp partial_op() const { return rep_->partial_op_; }

  // Human description of the spec: "S(0),R on mesh 2x2" or "flat 0:4;4:8 on 2 ranks".
  std::string SpecString() const;
  // A deterministic string that identifies the layout exactly (for plan caches).
  std::string Fingerprint() const;

  friend bool operator==(const Layout& a, const Layout& b);

 private:
  // Layouts are immutable once built and large at scale (4096 ranks: thousands of small
  // allocations), so copies share one representation: plans and caches copy them freely.
  struct Rep {
    Shape global_shape_;
    std::vector<RankChunks> ranks_;
    absl::flat_hash_map<int64_t, int64_t> index_of_rank_;
    std::optional<DeviceMesh> mesh_;
    std::vector<Placement> placements_;
    std::optional<FlatSpec> flat_spec_;
    int64_t num_partials_ = 1;
    ReduceOp partial_op_ = ReduceOp::kSum;
  };
  static const std::shared_ptr<const Rep>& EmptyRep();
  // Builds the rep of an already validated chunk list.
  static std::shared_ptr<Rep> ChunkRep(const Shape& global_shape, std::vector<RankChunks> ranks,
                                       int64_t num_partials, ReduceOp partial_op);

  std::shared_ptr<const Rep> rep_ = EmptyRep();
};

// Chunk-metadata validation, as Megatron's validate_uneven_dtensor and stricter: every chunk
// in bounds of the tensor and of its rank's local buffer, local ranges of one rank disjoint,
// no overlap between different chunks except identical replicas, and, for each partial
// contribution, the whole tensor covered. Errors name the rank and the box.
absl::Status ValidateLayout(const Shape& global_shape, absl::Span<const RankChunks> ranks,
                            int64_t num_partials = 1);

// The torch.chunk split of an extent of `n` into `k` pieces: {offset, size} of piece `j`,
// offsets relative to the extent's start.
std::pair<int64_t, int64_t> ChunkPiece(int64_t n, int64_t k, int64_t j);

// Splits the flat range [start, end) of a tensor of `shape` into row-major-contiguous boxes
// (at most 2*ndim-1), in flat order.
std::vector<Box> FlatRangeToBoxes(const Shape& shape, int64_t start, int64_t end);

}  // namespace shardcoord

#endif  // SHARDCOORD_SHARDING_LAYOUT_H_
