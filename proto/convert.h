#ifndef SHARDCOORD_PROTO_CONVERT_H_
#define SHARDCOORD_PROTO_CONVERT_H_

// The one place that converts shardcoord.v1 wire messages to sharding/ value types and back.
// Everything that comes from the wire is validated here: a bad value is INVALID_ARGUMENT
// whose message starts with the field path the caller passes in ("spec.placements[1]: S(3)
// on a 2-d tensor", "shape[0] = -1 must be >= 0", "dtype: unspecified"), so services can
// return the status as is.

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "proto/shardcoord.pb.h"
#include "sharding/box.h"
#include "sharding/cast.h"
#include "sharding/dtype.h"
#include "sharding/layout.h"
#include "sharding/limits.h"
#include "sharding/mesh.h"
#include "sharding/placement.h"
#include "sharding/plan.h"
#include "sharding/plan_fragment.h"
#include "sharding/spec.h"
#include "sharding/transfer_table.h"

namespace shardcoord {

using Int64List = google::protobuf::RepeatedField<int64_t>;

// ---- Scalars ---------------------------------------------------------------------------

// Unspecified and out-of-range values are rejected: a tensor always has a concrete dtype.
absl::StatusOr<DType> DTypeFromProto(v1::DType dtype, absl::string_view field = "dtype");
v1::DType DTypeToProto(DType dtype);
v1::CastSide CastSideToProto(CastSide side);

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

// One rank's fragment in one of the two wire shapes: a single plan (not fused) in the
// top-level fields without `members` (its one shape's steps, its one member's tensors and
// versions); a fused transaction as `members` and `shapes` (each shape's transfers) with
// exchange_ranks. member_ranks/member_incarnations are sorted by rank.
v1::PlanFragment FragmentToProto(const Fragment& fragment);

// Either wire shape (`members` given: fused), field by field. A single plan's: every step
// contains the rank, every transfer's ends are members of its step, local copies belong to
// the rank, member lists have equal lengths. A fused transaction's: each shape checked as a
// single plan's fields are ("shapes[2].source: ..."), each member ("members[3].shape: ..."),
// exchange_ranks sorted, distinct, holding this rank when it moves anything, and every
// transfer's peer, each with an incarnation; member indices distinct.
absl::StatusOr<Fragment> FragmentFromProto(const v1::PlanFragment& fragment);

// ---- Prepared transfers ------------------------------------------------------------------

// A layout of a transfer's table (PrepareTransferRequest.layouts): ranks that hold no chunk are
// left out unless `keep_empty_ranks` (an attached dst's layout: its lent buffers follow the
// dst's versions on every rank of it).
v1::Layout TransferLayoutToProto(const Layout& layout, bool keep_empty_ranks);
v1::TransferMember TransferMemberToProto(const TransferMemberSpec& member);
// Appends one page's layouts and members to `table` (and page 0's hosts_by_rank), field by
// field, errors naming the table-wide index ("layouts[12]: ...", "members[4097].dtype: ...").
// Indices between them are checked by ValidateTransferTable once the table is whole.
absl::Status AppendTransferPage(const v1::PrepareTransferRequest& page, TransferTable* table);

}  // namespace shardcoord

#endif  // SHARDCOORD_PROTO_CONVERT_H_
