#ifndef SHARDCOORD_PROTO_CONVERT_H_
#define SHARDCOORD_PROTO_CONVERT_H_

// The one place that converts shardcoord.v1 wire messages to sharding/ value types and back.
// Everything that comes from the wire is validated here: a bad value is INVALID_ARGUMENT
// whose message starts with the field path the caller passes in ("spec.placements[1]: S(3)
// on a 2-d tensor", "shape[0] = -1 must be >= 0", "dtype: unspecified"), so services can
// return the status as is.

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "proto/shardcoord.pb.h"
#include "sharding/box.h"
#include "sharding/dtype.h"
#include "sharding/layout.h"
#include "sharding/mesh.h"
#include "sharding/placement.h"
#include "sharding/plan.h"
#include "sharding/plan_fragment.h"
#include "sharding/plan_participants.h"
#include "sharding/spec.h"

namespace shardcoord {

using Int64List = google::protobuf::RepeatedField<int64_t>;

// ---- Limits (issue 15): bounds on what a client controls ------------------------------

// Tensor and mesh dims, and placements per spec.
inline constexpr int kMaxDims = 16;
// Ranges of one rank in a flat spec.
inline constexpr int kMaxFlatRangesPerRank = 4096;
// Mesh and tensor names.
inline constexpr size_t kMaxNameBytes = 256;

// A mesh or tensor name: 1 to kMaxNameBytes of letters, digits and `_ . - : /` (names end
// up in logs, metrics labels of nothing, file names of checkpoints and shell commands).
// INVALID_ARGUMENT "<field>: ..." naming the limit or the first bad character otherwise.
absl::Status ValidateName(absl::string_view name, absl::string_view field = "name");

// Worker names.
inline constexpr size_t kMaxWorkerNameBytes = 253;

// A worker name: 1 to kMaxWorkerNameBytes of letters, digits and `_ . - :`, starting with a
// letter or digit (a host name, a pod name, or the default "host:pid"; it names the worker's
// certificate and its "{name}" in flags, so no '/'). INVALID_ARGUMENT "<field>: ..." else.
absl::Status ValidateWorkerName(absl::string_view name, absl::string_view field = "name");

// ---- Scalars ---------------------------------------------------------------------------

// Unspecified and out-of-range values are rejected: a tensor always has a concrete dtype.
absl::StatusOr<DType> DTypeFromProto(v1::DType dtype, absl::string_view field = "dtype");
v1::DType DTypeToProto(DType dtype);

// Unspecified means SUM (the proto's documented default).
absl::StatusOr<ReduceOp> ReduceOpFromProto(v1::ReduceOp op, absl::string_view field);
v1::ReduceOp ReduceOpToProto(ReduceOp op);

absl::StatusOr<StepOp> StepOpFromProto(v1::StepOp op, absl::string_view field);
v1::StepOp StepOpToProto(StepOp op);

// A tensor shape: at most kMaxDims dims, every dim >= 0 and the element count fits in int64.
absl::StatusOr<Shape> ShapeFromProto(const Int64List& dims, absl::string_view field = "shape");
void ShapeToProto(absl::Span<const int64_t> shape, Int64List* out);

absl::StatusOr<Box> BoxFromProto(const v1::Box& box, absl::string_view field);
v1::Box BoxToProto(const Box& box);

// ---- Placements and specs ----------------------------------------------------------------

absl::StatusOr<Placement> PlacementFromProto(const v1::Placement& p, absl::string_view field);
v1::Placement PlacementToProto(const Placement& p);

absl::StatusOr<FlatSpec> FlatSpecFromProto(
    const google::protobuf::RepeatedPtrField<v1::RankRanges>& ranks, absl::string_view field);
void FlatSpecToProto(const FlatSpec& spec, google::protobuf::RepeatedPtrField<v1::RankRanges>* out);

// Exactly one of placements, flat, placements_text, flat_text must be given; at most
// kMaxDims placements, at most kMaxFlatRangesPerRank ranges per rank.
absl::StatusOr<Spec> SpecFromProto(const v1::ShardingSpec& spec, absl::string_view field = "spec");
// Fills placements or flat and the matching text field.
v1::ShardingSpec SpecToProto(const Spec& spec);

// ---- Chunks and layouts ------------------------------------------------------------------
// sharding/ types carry no checksums; they travel next to them, index for index.

absl::StatusOr<Chunk> ChunkFromProto(const v1::Chunk& chunk, absl::string_view field,
                                     uint64_t* checksum = nullptr);
v1::Chunk ChunkToProto(const Chunk& chunk, uint64_t checksum = 0);

// Checks each chunk on its own (box, offsets); ValidateLayout checks them together.
absl::StatusOr<RankChunks> RankChunksFromProto(const v1::RankChunks& rc, absl::string_view field,
                                               ChunkChecksums* checksums = nullptr);
// `checksums` empty = all unknown (0); otherwise one per chunk.
v1::RankChunks RankChunksToProto(const RankChunks& rc, absl::Span<const uint64_t> checksums = {});

// Through Layout::FromChunks (so it is validated); the mesh and placements a layout was
// built from do not travel.
absl::StatusOr<Layout> LayoutFromProto(const v1::Layout& layout, absl::string_view field,
                                       LayoutChecksums* checksums = nullptr);
// `checksums` null = all unknown; otherwise shaped as the layout's chunks.
v1::Layout LayoutToProto(const Layout& layout, const LayoutChecksums* checksums = nullptr);

// ---- Plans -------------------------------------------------------------------------------

v1::Transfer TransferToProto(const Transfer& t);
absl::StatusOr<Transfer> TransferFromProto(const v1::Transfer& t, absl::string_view field);
v1::LocalCopy LocalCopyToProto(const LocalCopy& c);
absl::StatusOr<LocalCopy> LocalCopyFromProto(const v1::LocalCopy& c, absl::string_view field);
// `index` is the step's position in its plan (kept in fragments, which hold a subset).
v1::Step StepToProto(const Step& step, int index);
absl::StatusOr<Step> StepFromProto(const v1::Step& step, absl::string_view field);

// Without `explain` (the planner's text, if any, is the caller's to add).
v1::Plan PlanToProto(const Plan& plan, absl::string_view id, absl::string_view tensor);
// Only the plan's totals (id, tensor, dtype, traffic, bytes, bounds, estimate): no layouts,
// local copies or steps. What group responses carry per member, which for a thousand members
// would otherwise be most of the coordinator's work (PlanRedistribute shows a full plan).
v1::Plan PlanSummaryToProto(const Plan& plan, absl::string_view id, absl::string_view tensor);

struct FragmentOptions {
  std::string plan_id;
  std::string tensor;
  std::string target_tensor;  // A Copy's dst; empty = `tensor`.
  int64_t source_version = 0;
  int64_t target_version = 0;
  // Current incarnation of every rank in the plan; missing ranks get 0.
  absl::flat_hash_map<int64_t, int64_t> incarnations;
  int64_t step_timeout_ms = 0;
  std::string communicator_prefix;
  // A Copy into an attached tensor: its committed version, whose buffers are written in
  // place (PlanFragment.attached_target_version, set for the target layout's ranks only);
  // 0 = new buffers.
  int64_t attached_target_version = 0;
};

// What `rank` does in `plan`: its source and target chunks, its local copies, and only the
// steps whose process group contains it (with their plan-wide index).
v1::PlanFragment MakeFragment(const Plan& plan, int64_t rank, const FragmentOptions& options);

// What each participant of `plan` does in it, by rank (every rank of PlanParticipants), as the
// FragmentShape of a fused group's fragments (issue 10): the rank's chunks, local copies and
// only the transfers it sends or receives, in plan order. One pass over the transfers.
std::map<int64_t, v1::FragmentShape> MakeFragmentShapes(const Plan& plan);

// Who a member of a fused group is, besides its plan.
struct FragmentMemberOptions {
  int32_t index = 0;  // Position in the group.
  std::string plan_id;
  std::string tensor;
  std::string target_tensor;  // A Copy's dst; empty = `tensor`.
  int64_t source_version = 0;
  int64_t target_version = 0;
  int64_t attached_target_version = 0;  // As FragmentOptions'.
};

// Every worker's fragment of a fused group of `plans` (members[i] describes plans[i]), by
// rank: the shape of every distinct plan (members whose plans are the same object share it),
// the members in the group's order, exchange_ranks (every rank that sends or receives any
// transfer) with their incarnations for the ranks among them, and the group-wide fields.
struct GroupFragmentOptions {
  std::string plan_id;                                 // The group's id.
  absl::flat_hash_map<int64_t, int64_t> incarnations;  // Missing ranks get 0.
  int64_t step_timeout_ms = 0;
  std::string communicator_prefix;
  int64_t bucket_bytes = 0;
};
std::map<int64_t, v1::PlanFragment> MakeGroupFragments(
    absl::Span<const Plan* const> plans, absl::Span<const FragmentMemberOptions> members,
    const GroupFragmentOptions& options);

// Whether a PlanFragment is a fused group's.
inline bool IsGroupFragment(const v1::PlanFragment& f) { return f.members_size() > 0; }

// Field by field, checking each shape as FragmentFromProto does ("shapes[2].source: ...") and
// each member ("members[3].shape: ..."), and that exchange_ranks is sorted, distinct, holds
// this rank when it moves anything, and every transfer's peer, each with an incarnation;
// member indices are distinct.
absl::StatusOr<GroupFragment> GroupFragmentFromProto(const v1::PlanFragment& fragment);

// Validates that the fragment is self-consistent for its rank: every step contains the rank,
// every transfer's ends are members of its step, local copies
// belong to the rank, member lists have equal lengths.
absl::StatusOr<Fragment> FragmentFromProto(const v1::PlanFragment& fragment);

}  // namespace shardcoord

#endif  // SHARDCOORD_PROTO_CONVERT_H_
