#ifndef SHARDCOORD_SHARDING_SPEC_H_
#define SHARDCOORD_SHARDING_SPEC_H_

// A sharding spec as the user gives it (placements or a flat spec), and the layout it
// describes. Errors are INVALID_ARGUMENT prefixed with the caller's field path, so services
// can return them as is; proto/convert.h parses the wire form.

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "sharding/box.h"
#include "sharding/layout.h"
#include "sharding/mesh.h"
#include "sharding/placement.h"

namespace shardcoord {

// A parsed ShardingSpec: placements (one per mesh dim) or a flat spec (one entry per mesh
// position), and the mesh name it refers to (empty = the caller's default mesh).
struct Spec {
  std::string mesh;
  bool is_flat = false;
  std::vector<Placement> placements;  // When !is_flat.
  FlatSpec flat;                      // When is_flat.

  // "S(0),R" or "flat 0:4;4:8": what TensorInfo.spec shows.
  std::string ToString() const;
};

// Checks placements against a tensor and a mesh before Layout::FromPlacements, so the error
// names the item: one placement per mesh dim, shard dims inside the tensor's rank, explicit
// sizes one per mesh position and non-negative, one reduce op for all Partial dims.
absl::Status CheckPlacements(absl::Span<const Placement> placements, const Shape& tensor_shape,
                             const DeviceMesh& mesh, absl::string_view field);

// The layout of a tensor of `shape` on `mesh` under `spec` (spec.mesh is not looked at).
// Errors are INVALID_ARGUMENT prefixed with `field`.
absl::StatusOr<Layout> LayoutForSpec(const Spec& spec, const DeviceMesh& mesh, const Shape& shape,
                                     absl::string_view field = "spec");

// Sharding types carry no checksums; they travel next to them, index for index.
using ChunkChecksums = std::vector<uint64_t>;         // One per chunk of a RankChunks.
using LayoutChecksums = std::vector<ChunkChecksums>;  // One per rank, in Layout::ranks() order.

}  // namespace shardcoord

#endif  // SHARDCOORD_SHARDING_SPEC_H_
