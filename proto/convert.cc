#include "proto/convert.h"

#include <algorithm>
#include <tuple>
#include <utility>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "sharding/field_status.h"

namespace shardcoord {
namespace {

using field_status::Bad;
using field_status::Index;
using field_status::Prefixed;
using field_status::Sub;

absl::Status NonNegative(absl::string_view field, int64_t value) {
  if (value < 0) {
    return absl::InvalidArgumentError(absl::StrCat(field, " = ", value, " must be >= 0"));
  }
  return absl::OkStatus();
}

template <typename T>
std::vector<int64_t> ToVector(const google::protobuf::RepeatedField<T>& r) {
  return std::vector<int64_t>(r.begin(), r.end());
}

}  // namespace

// ---- Scalars ---------------------------------------------------------------------------

absl::StatusOr<DType> DTypeFromProto(v1::DType dtype, absl::string_view field) {
  switch (dtype) {
    case v1::F32:
      return DType::kF32;
    case v1::F64:
      return DType::kF64;
    case v1::F16:
      return DType::kF16;
    case v1::BF16:
      return DType::kBF16;
    case v1::I8:
      return DType::kI8;
    case v1::U8:
      return DType::kU8;
    case v1::I32:
      return DType::kI32;
    case v1::I64:
      return DType::kI64;
    case v1::BOOL:
      return DType::kBool;
    case v1::I16:
      return DType::kI16;
    case v1::U16:
      return DType::kU16;
    case v1::U32:
      return DType::kU32;
    case v1::U64:
      return DType::kU64;
    case v1::F8_E4M3:
      return DType::kF8E4M3;
    case v1::F8_E5M2:
      return DType::kF8E5M2;
    case v1::F8_E8M0:
      return DType::kF8E8M0;
    case v1::DTYPE_UNSPECIFIED:
      return Bad(field, "unspecified");
    default:
      break;
  }
  return Bad(field, "unknown value ", static_cast<int>(dtype));
}

v1::DType DTypeToProto(DType dtype) {
  // The enums share their values by design (sharding/dtype.h).
  return static_cast<v1::DType>(static_cast<int>(dtype));
}

v1::CastSide CastSideToProto(CastSide side) {
  switch (side) {
    case CastSide::kNone:
      return v1::CAST_SIDE_NONE;
    case CastSide::kSender:
      return v1::CAST_BY_SENDER;
    case CastSide::kReceiver:
      return v1::CAST_BY_RECEIVER;
  }
  return v1::CAST_SIDE_NONE;
}

absl::StatusOr<ReduceOp> ReduceOpFromProto(v1::ReduceOp op, absl::string_view field) {
  switch (op) {
    case v1::REDUCE_OP_UNSPECIFIED:
    case v1::SUM:
      return ReduceOp::kSum;
    case v1::AVG:
      return ReduceOp::kAvg;
    case v1::MIN:
      return ReduceOp::kMin;
    case v1::MAX:
      return ReduceOp::kMax;
    default:
      break;
  }
  return Bad(field, "unknown reduce op ", static_cast<int>(op));
}

v1::ReduceOp ReduceOpToProto(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum:
      return v1::SUM;
    case ReduceOp::kAvg:
      return v1::AVG;
    case ReduceOp::kMin:
      return v1::MIN;
    case ReduceOp::kMax:
      return v1::MAX;
  }
  return v1::REDUCE_OP_UNSPECIFIED;
}

absl::StatusOr<StepOp> StepOpFromProto(v1::StepOp op, absl::string_view field) {
  switch (op) {
    case v1::ALL_GATHER:
      return StepOp::kAllGather;
    case v1::REDUCE_SCATTER:
      return StepOp::kReduceScatter;
    case v1::ALL_REDUCE:
      return StepOp::kAllReduce;
    case v1::ALL_TO_ALL:
      return StepOp::kAllToAll;
    case v1::BROADCAST:
      return StepOp::kBroadcast;
    case v1::POINT_TO_POINT:
      return StepOp::kPointToPoint;
    case v1::STEP_OP_UNSPECIFIED:
      return Bad(field, "unspecified");
    default:
      break;
  }
  return Bad(field, "unknown step op ", static_cast<int>(op));
}

v1::StepOp StepOpToProto(StepOp op) {
  switch (op) {
    case StepOp::kAllGather:
      return v1::ALL_GATHER;
    case StepOp::kReduceScatter:
      return v1::REDUCE_SCATTER;
    case StepOp::kAllReduce:
      return v1::ALL_REDUCE;
    case StepOp::kAllToAll:
      return v1::ALL_TO_ALL;
    case StepOp::kBroadcast:
      return v1::BROADCAST;
    case StepOp::kPointToPoint:
      return v1::POINT_TO_POINT;
  }
  return v1::STEP_OP_UNSPECIFIED;
}

absl::StatusOr<Shape> ShapeFromProto(const Int64List& dims, absl::string_view field) {
  if (dims.size() > kMaxDims) {
    return Bad(field, dims.size(), " dims, more than the limit of ", kMaxDims);
  }
  Shape shape = ToVector(dims);
  for (size_t i = 0; i < shape.size(); ++i) {
    if (absl::Status s = NonNegative(Index(field, i), shape[i]); !s.ok()) return s;
  }
  if (absl::Status s = ValidateShape(shape); !s.ok()) return Prefixed(field, s);
  return shape;
}

void ShapeToProto(absl::Span<const int64_t> shape, Int64List* out) {
  out->Clear();
  out->Add(shape.begin(), shape.end());
}

absl::StatusOr<Box> BoxFromProto(const v1::Box& box, absl::string_view field) {
  if (box.offset_size() != box.shape_size()) {
    return Bad(field, "offset has ", box.offset_size(), " dims but shape has ", box.shape_size());
  }
  for (int i = 0; i < box.offset_size(); ++i) {
    if (absl::Status s = NonNegative(Index(Sub(field, "offset"), i), box.offset(i)); !s.ok()) {
      return s;
    }
    if (absl::Status s = NonNegative(Index(Sub(field, "shape"), i), box.shape(i)); !s.ok()) {
      return s;
    }
  }
  absl::StatusOr<Box> b = Box::Create(ToVector(box.offset()), ToVector(box.shape()));
  if (!b.ok()) return Prefixed(field, b.status());
  return b;
}

namespace {

// The Write* functions fill a message in place: fragments are built for every plan sent,
// and a temporary per message (then swapped in) costs as much as the fields.
void WriteBox(const Box& box, v1::Box* out) {
  ShapeToProto(box.offset(), out->mutable_offset());
  ShapeToProto(box.shape(), out->mutable_shape());
}

}  // namespace

v1::Box BoxToProto(const Box& box) {
  v1::Box out;
  WriteBox(box, &out);
  return out;
}

// ---- Placements and specs ----------------------------------------------------------------

absl::StatusOr<Placement> PlacementFromProto(const v1::Placement& p, absl::string_view field) {
  switch (p.kind_case()) {
    case v1::Placement::kShard: {
      std::vector<int64_t> sizes = ToVector(p.shard().sizes());
      for (size_t i = 0; i < sizes.size(); ++i) {
        if (absl::Status s = NonNegative(Index(Sub(field, "shard.sizes"), i), sizes[i]); !s.ok()) {
          return s;
        }
      }
      return Placement::Shard(p.shard().dim(), std::move(sizes));
    }
    case v1::Placement::kReplicate:
      return Placement::Replicate();
    case v1::Placement::kPartial: {
      absl::StatusOr<ReduceOp> op = ReduceOpFromProto(p.partial().op(), Sub(field, "partial.op"));
      if (!op.ok()) return op.status();
      return Placement::Partial(*op);
    }
    case v1::Placement::KIND_NOT_SET:
      break;
  }
  return Bad(field, "no kind set (want shard, replicate or partial)");
}

v1::Placement PlacementToProto(const Placement& p) {
  v1::Placement out;
  switch (p.kind) {
    case Placement::Kind::kShard:
      out.mutable_shard()->set_dim(p.dim);
      out.mutable_shard()->mutable_sizes()->Add(p.sizes.begin(), p.sizes.end());
      break;
    case Placement::Kind::kReplicate:
      out.mutable_replicate();
      break;
    case Placement::Kind::kPartial:
      out.mutable_partial()->set_op(ReduceOpToProto(p.op));
      break;
  }
  return out;
}

absl::StatusOr<FlatSpec> FlatSpecFromProto(
    const google::protobuf::RepeatedPtrField<v1::RankRanges>& ranks, absl::string_view field) {
  FlatSpec spec;
  spec.reserve(ranks.size());
  for (int i = 0; i < ranks.size(); ++i) {
    std::vector<FlatRange>& out = spec.emplace_back();
    for (int j = 0; j < ranks[i].ranges_size(); ++j) {
      const v1::FlatRange& r = ranks[i].ranges(j);
      const std::string item = Index(Sub(Index(field, i), "ranges"), j);
      if (r.start() < 0 || r.end() < r.start()) {
        return Bad(item, r.start(), ":", r.end(), " must have 0 <= start <= end");
      }
      out.push_back(FlatRange{r.start(), r.end()});
    }
  }
  return spec;
}

void FlatSpecToProto(const FlatSpec& spec,
                     google::protobuf::RepeatedPtrField<v1::RankRanges>* out) {
  out->Clear();
  for (const std::vector<FlatRange>& ranges : spec) {
    v1::RankRanges* rr = out->Add();
    for (const FlatRange& r : ranges) {
      v1::FlatRange* fr = rr->add_ranges();
      fr->set_start(r.start);
      fr->set_end(r.end);
    }
  }
}

absl::StatusOr<Spec> SpecFromProto(const v1::ShardingSpec& spec, absl::string_view field) {
  std::vector<std::string> given;
  if (spec.placements_size() > 0) given.push_back("placements");
  if (spec.flat_size() > 0) given.push_back("flat");
  if (!spec.placements_text().empty()) given.push_back("placements_text");
  if (!spec.flat_text().empty()) given.push_back("flat_text");
  if (given.empty()) return Bad(field, "no placements or flat ranges given");
  if (given.size() > 1) {
    return Bad(field, "give exactly one of placements, flat, placements_text, flat_text (got ",
               absl::StrJoin(given, " and "), ")");
  }
  Spec out;
  out.mesh = spec.mesh();
  if (spec.placements_size() > 0) {
    for (int i = 0; i < spec.placements_size(); ++i) {
      absl::StatusOr<Placement> p =
          PlacementFromProto(spec.placements(i), Index(Sub(field, "placements"), i));
      if (!p.ok()) return p.status();
      out.placements.push_back(*std::move(p));
    }
  } else if (spec.flat_size() > 0) {
    absl::StatusOr<FlatSpec> flat = FlatSpecFromProto(spec.flat(), Sub(field, "flat"));
    if (!flat.ok()) return flat.status();
    out.is_flat = true;
    out.flat = *std::move(flat);
  } else if (!spec.placements_text().empty()) {
    absl::StatusOr<std::vector<Placement>> p = ParsePlacements(spec.placements_text());
    if (!p.ok()) return Prefixed(Sub(field, "placements_text"), p.status());
    out.placements = *std::move(p);
  } else {
    absl::StatusOr<FlatSpec> flat = ParseFlatSpec(spec.flat_text());
    if (!flat.ok()) return Prefixed(Sub(field, "flat_text"), flat.status());
    out.is_flat = true;
    out.flat = *std::move(flat);
  }
  if (out.placements.size() > kMaxDims) {
    return Bad(field, out.placements.size(), " placements, more than the limit of ", kMaxDims);
  }
  for (size_t r = 0; r < out.flat.size(); ++r) {
    if (out.flat[r].size() > kMaxFlatRangesPerRank) {
      return Bad(Index(Sub(field, "flat"), r), out.flat[r].size(),
                 " ranges, more than the limit of ", kMaxFlatRangesPerRank, " per rank");
    }
  }
  return out;
}

v1::ShardingSpec SpecToProto(const Spec& spec) {
  v1::ShardingSpec out;
  out.set_mesh(spec.mesh);
  if (spec.is_flat) {
    FlatSpecToProto(spec.flat, out.mutable_flat());
    out.set_flat_text(FlatSpecToString(spec.flat));
  } else {
    for (const Placement& p : spec.placements) *out.add_placements() = PlacementToProto(p);
    out.set_placements_text(PlacementsToString(spec.placements));
  }
  return out;
}

// ---- Chunks and layouts ------------------------------------------------------------------

absl::StatusOr<Chunk> ChunkFromProto(const v1::Chunk& chunk, absl::string_view field,
                                     uint64_t* checksum) {
  absl::StatusOr<Box> box = BoxFromProto(chunk.box(), Sub(field, "box"));
  if (!box.ok()) return box.status();
  if (absl::Status s = NonNegative(Sub(field, "local_offset"), chunk.local_offset()); !s.ok()) {
    return s;
  }
  if (absl::Status s = NonNegative(Sub(field, "partial_index"), chunk.partial_index()); !s.ok()) {
    return s;
  }
  if (checksum != nullptr) *checksum = chunk.checksum();
  return Chunk{*std::move(box), chunk.local_offset(), chunk.partial_index()};
}

namespace {

void WriteChunk(const Chunk& chunk, uint64_t checksum, v1::Chunk* out) {
  WriteBox(chunk.box, out->mutable_box());
  out->set_local_offset(chunk.local_offset);
  out->set_partial_index(chunk.partial_index);
  out->set_checksum(checksum);
}

}  // namespace

v1::Chunk ChunkToProto(const Chunk& chunk, uint64_t checksum) {
  v1::Chunk out;
  WriteChunk(chunk, checksum, &out);
  return out;
}

absl::StatusOr<RankChunks> RankChunksFromProto(const v1::RankChunks& rc, absl::string_view field,
                                               ChunkChecksums* checksums) {
  RankChunks out;
  if (absl::Status s = NonNegative(Sub(field, "rank"), rc.rank()); !s.ok()) return s;
  if (absl::Status s = NonNegative(Sub(field, "local_elements"), rc.local_elements()); !s.ok()) {
    return s;
  }
  for (int i = 0; i < rc.coord_size(); ++i) {
    if (absl::Status s = NonNegative(Index(Sub(field, "coord"), i), rc.coord(i)); !s.ok()) {
      return s;
    }
  }
  out.rank = rc.rank();
  out.coord = ToVector(rc.coord());
  out.local_elements = rc.local_elements();
  if (checksums != nullptr) checksums->clear();
  for (int i = 0; i < rc.chunks_size(); ++i) {
    uint64_t sum = 0;
    absl::StatusOr<Chunk> c = ChunkFromProto(rc.chunks(i), Index(Sub(field, "chunks"), i), &sum);
    if (!c.ok()) return c.status();
    out.chunks.push_back(*std::move(c));
    if (checksums != nullptr) checksums->push_back(sum);
  }
  return out;
}

namespace {

void WriteRankChunks(const RankChunks& rc, absl::Span<const uint64_t> checksums,
                     v1::RankChunks* out) {
  out->set_rank(rc.rank);
  ShapeToProto(rc.coord, out->mutable_coord());
  out->set_local_elements(rc.local_elements);
  out->mutable_chunks()->Reserve(static_cast<int>(rc.chunks.size()));
  for (size_t i = 0; i < rc.chunks.size(); ++i) {
    WriteChunk(rc.chunks[i], i < checksums.size() ? checksums[i] : 0, out->add_chunks());
  }
}

}  // namespace

v1::RankChunks RankChunksToProto(const RankChunks& rc, absl::Span<const uint64_t> checksums) {
  v1::RankChunks out;
  WriteRankChunks(rc, checksums, &out);
  return out;
}

absl::StatusOr<Layout> LayoutFromProto(const v1::Layout& layout, absl::string_view field,
                                       LayoutChecksums* checksums) {
  absl::StatusOr<Shape> shape = ShapeFromProto(layout.global_shape(), Sub(field, "global_shape"));
  if (!shape.ok()) return shape.status();
  const int64_t num_partials = layout.num_partials() == 0 ? 1 : layout.num_partials();
  if (num_partials < 1) return Bad(Sub(field, "num_partials"), num_partials, " < 1");
  absl::StatusOr<ReduceOp> op = ReduceOpFromProto(layout.partial_op(), Sub(field, "partial_op"));
  if (!op.ok()) return op.status();
  std::vector<RankChunks> ranks;
  LayoutChecksums sums;
  for (int i = 0; i < layout.ranks_size(); ++i) {
    absl::StatusOr<RankChunks> rc =
        RankChunksFromProto(layout.ranks(i), Index(Sub(field, "ranks"), i), &sums.emplace_back());
    if (!rc.ok()) return rc.status();
    ranks.push_back(*std::move(rc));
  }
  absl::StatusOr<Layout> out = Layout::FromChunks(*shape, std::move(ranks), num_partials, *op);
  if (!out.ok()) return Prefixed(field, out.status());
  if (checksums != nullptr) *checksums = std::move(sums);
  return out;
}

v1::Layout LayoutToProto(const Layout& layout, const LayoutChecksums* checksums) {
  v1::Layout out;
  ShapeToProto(layout.global_shape(), out.mutable_global_shape());
  for (size_t i = 0; i < layout.ranks().size(); ++i) {
    absl::Span<const uint64_t> sums;
    if (checksums != nullptr && i < checksums->size()) sums = (*checksums)[i];
    WriteRankChunks(layout.ranks()[i], sums, out.add_ranks());
  }
  out.set_num_partials(layout.num_partials());
  out.set_partial_op(ReduceOpToProto(layout.partial_op()));
  return out;
}

// ---- Plans -------------------------------------------------------------------------------

namespace {

void WriteTransfer(const Transfer& t, v1::Transfer* out) {
  out->set_src(t.src);
  out->set_dst(t.dst);
  WriteBox(t.box, out->mutable_box());
  out->set_bytes(t.bytes);
  out->set_reduce(t.reduce);
  out->set_partial_index(t.partial_index);
}

}  // namespace

v1::Transfer TransferToProto(const Transfer& t) {
  v1::Transfer out;
  WriteTransfer(t, &out);
  return out;
}

absl::StatusOr<Transfer> TransferFromProto(const v1::Transfer& t, absl::string_view field) {
  Transfer out;
  if (absl::Status s = NonNegative(Sub(field, "src"), t.src()); !s.ok()) return s;
  if (absl::Status s = NonNegative(Sub(field, "dst"), t.dst()); !s.ok()) return s;
  if (t.src() == t.dst()) return Bad(field, "src = dst = ", t.src(), " (a local copy)");
  absl::StatusOr<Box> box = BoxFromProto(t.box(), Sub(field, "box"));
  if (!box.ok()) return box.status();
  if (absl::Status s = NonNegative(Sub(field, "bytes"), t.bytes()); !s.ok()) return s;
  if (absl::Status s = NonNegative(Sub(field, "partial_index"), t.partial_index()); !s.ok()) {
    return s;
  }
  out.src = t.src();
  out.dst = t.dst();
  out.box = *std::move(box);
  out.bytes = t.bytes();
  out.reduce = t.reduce();
  out.partial_index = t.partial_index();
  return out;
}

namespace {

void WriteLocalCopy(const LocalCopy& c, v1::LocalCopy* out) {
  out->set_rank(c.rank);
  WriteBox(c.box, out->mutable_box());
  out->set_reduce(c.reduce);
  out->set_partial_index(c.partial_index);
}

}  // namespace

v1::LocalCopy LocalCopyToProto(const LocalCopy& c) {
  v1::LocalCopy out;
  WriteLocalCopy(c, &out);
  return out;
}

absl::StatusOr<LocalCopy> LocalCopyFromProto(const v1::LocalCopy& c, absl::string_view field) {
  if (absl::Status s = NonNegative(Sub(field, "rank"), c.rank()); !s.ok()) return s;
  absl::StatusOr<Box> box = BoxFromProto(c.box(), Sub(field, "box"));
  if (!box.ok()) return box.status();
  if (absl::Status s = NonNegative(Sub(field, "partial_index"), c.partial_index()); !s.ok()) {
    return s;
  }
  LocalCopy out;
  out.rank = c.rank();
  out.box = *std::move(box);
  out.reduce = c.reduce();
  out.partial_index = c.partial_index();
  return out;
}

namespace {

void WriteStep(const Step& step, int index, v1::Step* out) {
  out->set_index(index);
  out->set_op(StepOpToProto(step.op));
  out->mutable_ranks()->Add(step.ranks.begin(), step.ranks.end());
  out->set_root(step.root);
  out->set_reduce_op(ReduceOpToProto(step.reduce_op));
  out->mutable_transfers()->Reserve(static_cast<int>(step.transfers.size()));
  for (const Transfer& t : step.transfers) WriteTransfer(t, out->add_transfers());
  out->set_bytes(step.bytes);
  out->set_estimated_seconds(step.estimated_seconds);
}

}  // namespace

v1::Step StepToProto(const Step& step, int index) {
  v1::Step out;
  WriteStep(step, index, &out);
  return out;
}

absl::StatusOr<Step> StepFromProto(const v1::Step& step, absl::string_view field) {
  Step out;
  absl::StatusOr<StepOp> op = StepOpFromProto(step.op(), Sub(field, "op"));
  if (!op.ok()) return op.status();
  out.op = *op;
  absl::flat_hash_set<int64_t> members;
  for (int i = 0; i < step.ranks_size(); ++i) {
    const std::string item = Index(Sub(field, "ranks"), i);
    if (absl::Status s = NonNegative(item, step.ranks(i)); !s.ok()) return s;
    if (!members.insert(step.ranks(i)).second) return Bad(item, "rank ", step.ranks(i), " twice");
    out.ranks.push_back(step.ranks(i));
  }
  if (out.op == StepOp::kBroadcast && !members.contains(step.root())) {
    return Bad(Sub(field, "root"), step.root(), " is not a member of the step");
  }
  out.root = step.root();
  absl::StatusOr<ReduceOp> rop = ReduceOpFromProto(step.reduce_op(), Sub(field, "reduce_op"));
  if (!rop.ok()) return rop.status();
  out.reduce_op = *rop;
  for (int i = 0; i < step.transfers_size(); ++i) {
    const std::string item = Index(Sub(field, "transfers"), i);
    absl::StatusOr<Transfer> t = TransferFromProto(step.transfers(i), item);
    if (!t.ok()) return t.status();
    if (!members.contains(t->src) || !members.contains(t->dst)) {
      return Bad(item, t->src, " -> ", t->dst, " leaves the step's group [",
                 absl::StrJoin(out.ranks, ","), "]");
    }
    out.transfers.push_back(*std::move(t));
  }
  if (absl::Status s = NonNegative(Sub(field, "bytes"), step.bytes()); !s.ok()) return s;
  out.bytes = step.bytes();
  out.estimated_seconds = step.estimated_seconds();
  return out;
}

v1::Plan PlanSummaryToProto(const Plan& plan, absl::string_view id, absl::string_view tensor) {
  v1::Plan out;
  out.set_id(std::string(id));
  out.set_tensor(std::string(tensor));
  out.set_dtype(DTypeToProto(plan.dtype));
  out.set_divide_by(plan.divide_by);
  for (const RankTraffic& t : plan.traffic) {
    v1::RankTraffic* rt = out.add_traffic();
    rt->set_rank(t.rank);
    rt->set_bytes_sent(t.bytes_sent);
    rt->set_bytes_received(t.bytes_received);
  }
  out.set_bytes_moved(plan.bytes_moved);
  out.set_lower_bound_bytes(plan.lower_bound_bytes);
  out.set_estimated_seconds(plan.estimated_seconds);
  out.set_bytes_within_hosts(plan.bytes_within_hosts);
  out.set_bytes_across_hosts(plan.bytes_across_hosts);
  out.set_cross_host_lower_bound_bytes(plan.cross_host_lower_bound_bytes);
  out.set_target_dtype(DTypeToProto(plan.target_dtype()));
  out.set_wire_dtype(DTypeToProto(plan.wire_dtype()));
  out.set_cast_side(CastSideToProto(plan.cast_side()));
  return out;
}

v1::Plan PlanToProto(const Plan& plan, absl::string_view id, absl::string_view tensor) {
  v1::Plan out = PlanSummaryToProto(plan, id, tensor);
  *out.mutable_source() = LayoutToProto(plan.source);
  *out.mutable_target() = LayoutToProto(plan.target);
  for (const LocalCopy& c : plan.local_copies) WriteLocalCopy(c, out.add_local_copies());
  for (size_t i = 0; i < plan.steps.size(); ++i) {
    WriteStep(plan.steps[i], static_cast<int>(i), out.add_steps());
  }
  out.mutable_zero_fill_ranks()->Add(plan.zero_fill_ranks.begin(), plan.zero_fill_ranks.end());
  return out;
}

namespace {

// The fields PlanFragment and FragmentShape share (same names).
template <typename P>
void ShapeFieldsToProto(const FragmentShape& s, P* out) {
  out->set_dtype(DTypeToProto(s.dtype));
  if (s.cast_to.has_value()) out->set_target_dtype(DTypeToProto(*s.cast_to));
  WriteRankChunks(s.source, {}, out->mutable_source());
  out->mutable_source()->set_rank(s.rank);
  WriteRankChunks(s.target, {}, out->mutable_target());
  out->mutable_target()->set_rank(s.rank);
  for (const LocalCopy& c : s.local_copies) WriteLocalCopy(c, out->add_local_copies());
  out->set_zero_fill(s.zero_fill);
  out->set_divide_by(s.divide_by);
  out->set_reduce_op(ReduceOpToProto(s.reduce_op));
  out->set_num_partials(s.num_partials);
}

}  // namespace

v1::PlanFragment FragmentToProto(const Fragment& f) {
  v1::PlanFragment out;
  out.set_plan_id(f.plan_id);
  out.set_rank(f.rank);
  if (!f.fused && !f.shapes.empty() && !f.members.empty()) {
    // One plan: its shape and member in the top-level fields, without `members`.
    const FragmentShape& s = f.shapes[0];
    const FragmentMember& m = f.members[0];
    out.set_tensor(m.tensor);
    if (!m.target_tensor.empty() && m.target_tensor != m.tensor) {
      out.set_target_tensor(m.target_tensor);
    }
    out.set_source_version(m.source_version);
    out.set_target_version(m.target_version);
    out.set_attached_target_version(m.attached_target_version);
    ShapeFieldsToProto(s, &out);
    const size_t n = s.num_steps();
    out.mutable_steps()->Reserve(static_cast<int>(n));
    for (size_t i = 0; i < n; ++i) {
      WriteStep(s.step(i), i < s.step_indices.size() ? s.step_indices[i] : static_cast<int>(i),
                out.add_steps());
    }
  } else if (f.fused) {
    for (const FragmentShape& s : f.shapes) {
      v1::FragmentShape* p = out.add_shapes();
      ShapeFieldsToProto(s, p);
      p->mutable_transfers()->Reserve(static_cast<int>(s.transfers.size()));
      for (const Transfer& t : s.transfers) WriteTransfer(t, p->add_transfers());
    }
    for (const FragmentMember& m : f.members) {
      v1::FragmentMember* p = out.add_members();
      p->set_index(m.index);
      p->set_plan_id(m.plan_id);
      p->set_tensor(m.tensor);
      if (!m.target_tensor.empty() && m.target_tensor != m.tensor) {
        p->set_target_tensor(m.target_tensor);
      }
      p->set_source_version(m.source_version);
      p->set_target_version(m.target_version);
      p->set_attached_target_version(m.attached_target_version);
      p->set_shape(m.shape);
    }
    out.mutable_exchange_ranks()->Add(f.exchange_ranks.begin(), f.exchange_ranks.end());
  }
  std::vector<std::pair<int64_t, int64_t>> incarnations(f.member_incarnations.begin(),
                                                        f.member_incarnations.end());
  std::sort(incarnations.begin(), incarnations.end());
  for (const auto& [rank, incarnation] : incarnations) {
    out.add_member_ranks(rank);
    out.add_member_incarnations(incarnation);
  }
  out.set_step_timeout_ms(f.step_timeout_ms);
  out.set_communicator_prefix(f.communicator_prefix);
  out.set_bucket_bytes(f.bucket_bytes);
  return out;
}

namespace {

// The fields PlanFragment and FragmentShape share (same names), for `rank`; error fields
// start with `prefix` ("" or "shapes[2].").
template <typename P>
absl::Status ParseShapeFields(const P& f, int64_t rank, absl::string_view prefix,
                              FragmentShape* out) {
  auto field = [prefix](absl::string_view name) { return absl::StrCat(prefix, name); };
  absl::StatusOr<DType> dtype = DTypeFromProto(f.dtype(), field("dtype"));
  if (!dtype.ok()) return dtype.status();
  out->dtype = *dtype;
  out->cast_to.reset();
  if (f.target_dtype() != v1::DTYPE_UNSPECIFIED) {
    absl::StatusOr<DType> to = DTypeFromProto(f.target_dtype(), field("target_dtype"));
    if (!to.ok()) return to.status();
    if (absl::Status s = CheckCast(*dtype, *to); !s.ok()) {
      return Bad(field("target_dtype"), s.message());
    }
    if (*to != *dtype) out->cast_to = *to;
  }
  out->rank = rank;
  for (auto [name, rc, dst] : {std::make_tuple("source", &f.source(), &out->source),
                               std::make_tuple("target", &f.target(), &out->target)}) {
    absl::StatusOr<RankChunks> parsed = RankChunksFromProto(*rc, field(name));
    if (!parsed.ok()) return parsed.status();
    if (!parsed->chunks.empty() && parsed->rank != rank) {
      return Bad(field(absl::StrCat(name, ".rank")), parsed->rank, " but the fragment is for rank ",
                 rank);
    }
    parsed->rank = rank;
    *dst = *std::move(parsed);
  }
  for (int i = 0; i < f.local_copies_size(); ++i) {
    const std::string item = Index(field("local_copies"), i);
    absl::StatusOr<LocalCopy> c = LocalCopyFromProto(f.local_copies(i), item);
    if (!c.ok()) return c.status();
    if (c->rank != rank) return Bad(item, "rank ", c->rank, " in a fragment for ", rank);
    out->local_copies.push_back(*std::move(c));
  }
  out->zero_fill = f.zero_fill();
  out->divide_by = f.divide_by() == 0 ? 1 : f.divide_by();
  if (out->divide_by < 0) return Bad(field("divide_by"), out->divide_by, " < 0");
  absl::StatusOr<ReduceOp> op = ReduceOpFromProto(f.reduce_op(), field("reduce_op"));
  if (!op.ok()) return op.status();
  out->reduce_op = *op;
  out->num_partials = f.num_partials() == 0 ? 1 : f.num_partials();
  if (out->num_partials < 1) return Bad(field("num_partials"), out->num_partials, " < 1");
  return absl::OkStatus();
}

// member_ranks/member_incarnations, step_timeout_ms and communicator_prefix: both wire
// shapes alike.
absl::Status ParseSharedFields(const v1::PlanFragment& f, Fragment* out) {
  if (f.member_ranks_size() != f.member_incarnations_size()) {
    return Bad("member_incarnations", f.member_incarnations_size(), " entries for ",
               f.member_ranks_size(), " member_ranks");
  }
  for (int i = 0; i < f.member_ranks_size(); ++i) {
    out->member_incarnations[f.member_ranks(i)] = f.member_incarnations(i);
  }
  if (absl::Status s = NonNegative("step_timeout_ms", f.step_timeout_ms()); !s.ok()) return s;
  out->step_timeout_ms = f.step_timeout_ms();
  out->communicator_prefix = f.communicator_prefix();
  return absl::OkStatus();
}

// A single plan's wire shape: one shape and its member in the top-level fields.
absl::Status ParsePlanFields(const v1::PlanFragment& f, Fragment* out) {
  if (f.tensor().empty()) return Bad("tensor", "empty");
  FragmentMember member;
  member.plan_id = f.plan_id();
  member.tensor = f.tensor();
  member.target_tensor = f.target_tensor().empty() ? f.tensor() : f.target_tensor();
  if (absl::Status s = NonNegative("rank", f.rank()); !s.ok()) return s;
  FragmentShape shape;
  if (absl::Status s = ParseShapeFields(f, f.rank(), "", &shape); !s.ok()) return s;
  member.source_version = f.source_version();
  member.target_version = f.target_version();
  for (int i = 0; i < f.steps_size(); ++i) {
    const std::string item = Index("steps", i);
    absl::StatusOr<Step> s = StepFromProto(f.steps(i), item);
    if (!s.ok()) return s.status();
    if (std::find(s->ranks.begin(), s->ranks.end(), f.rank()) == s->ranks.end()) {
      return Bad(item, "rank ", f.rank(), " is not in the step's group");
    }
    shape.steps.push_back(*std::move(s));
    shape.step_indices.push_back(f.steps(i).index());
  }
  if (absl::Status s = ParseSharedFields(f, out); !s.ok()) return s;
  if (absl::Status s = NonNegative("attached_target_version", f.attached_target_version());
      !s.ok()) {
    return s;
  }
  member.attached_target_version = f.attached_target_version();
  if (absl::Status s = NonNegative("bucket_bytes", f.bucket_bytes()); !s.ok()) return s;
  out->bucket_bytes = f.bucket_bytes();
  out->shapes.push_back(std::move(shape));
  out->members.push_back(std::move(member));
  return absl::OkStatus();
}

// A fused transaction's wire shape: `members` and `shapes`.
absl::Status ParseFusedFields(const v1::PlanFragment& f, Fragment* out) {
  if (absl::Status s = NonNegative("rank", f.rank()); !s.ok()) return s;
  if (absl::Status s = ParseSharedFields(f, out); !s.ok()) return s;
  if (absl::Status s = NonNegative("bucket_bytes", f.bucket_bytes()); !s.ok()) return s;
  out->bucket_bytes = f.bucket_bytes();
  for (int i = 0; i < f.exchange_ranks_size(); ++i) {
    const int64_t r = f.exchange_ranks(i);
    const std::string item = Index("exchange_ranks", i);
    if (absl::Status s = NonNegative(item, r); !s.ok()) return s;
    if (i > 0 && r <= f.exchange_ranks(i - 1)) return Bad(item, r, " is not sorted or repeats");
    if (!out->member_incarnations.contains(r)) {
      return Bad(item, "rank ", r, " has no entry in member_ranks/member_incarnations");
    }
    out->exchange_ranks.push_back(r);
  }
  const std::vector<int64_t>& exchange = out->exchange_ranks;
  const bool in_exchange = std::binary_search(exchange.begin(), exchange.end(), out->rank);
  out->shapes.reserve(f.shapes_size());
  for (int i = 0; i < f.shapes_size(); ++i) {
    const v1::FragmentShape& sp = f.shapes(i);
    const std::string prefix = absl::StrCat(Index("shapes", i), ".");
    FragmentShape shape;
    if (absl::Status s = ParseShapeFields(sp, f.rank(), prefix, &shape); !s.ok()) return s;
    for (int j = 0; j < sp.transfers_size(); ++j) {
      const std::string item = absl::StrCat(prefix, Index("transfers", j));
      absl::StatusOr<Transfer> t = TransferFromProto(sp.transfers(j), item);
      if (!t.ok()) return t.status();
      if (t->src != out->rank && t->dst != out->rank) {
        return Bad(item, t->src, " -> ", t->dst, " does not involve rank ", out->rank);
      }
      const int64_t peer = t->src == out->rank ? t->dst : t->src;
      if (!in_exchange || !std::binary_search(exchange.begin(), exchange.end(), peer)) {
        return Bad(item, t->src, " -> ", t->dst, " leaves exchange_ranks [",
                   absl::StrJoin(exchange, ","), "]");
      }
      shape.transfers.push_back(*std::move(t));
    }
    out->shapes.push_back(std::move(shape));
  }
  absl::flat_hash_set<int32_t> indices;
  out->members.reserve(f.members_size());
  for (int i = 0; i < f.members_size(); ++i) {
    const v1::FragmentMember& m = f.members(i);
    const std::string prefix = absl::StrCat(Index("members", i), ".");
    if (m.index() < 0 || !indices.insert(m.index()).second) {
      return Bad(absl::StrCat(prefix, "index"), m.index(), " is negative or repeats");
    }
    if (m.shape() < 0 || m.shape() >= f.shapes_size()) {
      return Bad(absl::StrCat(prefix, "shape"), m.shape(), " is not one of the ", f.shapes_size(),
                 " shapes");
    }
    if (m.tensor().empty()) return Bad(absl::StrCat(prefix, "tensor"), "empty");
    for (auto [name, v] :
         {std::make_pair("source_version", m.source_version()),
          std::make_pair("target_version", m.target_version()),
          std::make_pair("attached_target_version", m.attached_target_version())}) {
      if (absl::Status s = NonNegative(absl::StrCat(prefix, name), v); !s.ok()) return s;
    }
    FragmentMember member;
    member.index = m.index();
    member.plan_id = m.plan_id().empty() ? f.plan_id() : m.plan_id();
    member.tensor = m.tensor();
    member.target_tensor = m.target_tensor().empty() ? m.tensor() : m.target_tensor();
    member.source_version = m.source_version();
    member.target_version = m.target_version();
    member.attached_target_version = m.attached_target_version();
    member.shape = m.shape();
    out->members.push_back(std::move(member));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<Fragment> FragmentFromProto(const v1::PlanFragment& f) {
  Fragment out;
  if (f.plan_id().empty()) return Bad("plan_id", "empty");
  out.plan_id = f.plan_id();
  out.rank = f.rank();
  out.fused = f.members_size() > 0;
  absl::Status s = out.fused ? ParseFusedFields(f, &out) : ParsePlanFields(f, &out);
  if (!s.ok()) return s;
  return out;
}

// ---- Prepared transfers ------------------------------------------------------------------

v1::Layout TransferLayoutToProto(const Layout& layout, bool keep_empty_ranks) {
  v1::Layout out;
  ShapeToProto(layout.global_shape(), out.mutable_global_shape());
  for (const RankChunks& rc : layout.ranks()) {
    if (rc.chunks.empty() && !keep_empty_ranks) continue;
    WriteRankChunks(rc, {}, out.add_ranks());
  }
  out.set_num_partials(layout.num_partials());
  out.set_partial_op(ReduceOpToProto(layout.partial_op()));
  return out;
}

v1::TransferMember TransferMemberToProto(const TransferMemberSpec& m) {
  v1::TransferMember out;
  out.set_src(m.src);
  out.set_dst(m.dst);
  out.set_src_version(m.src_version);
  out.set_dst_version(m.dst_version);
  out.set_dst_attached(m.dst_attached);
  out.set_src_layout(m.src_layout);
  out.set_dst_layout(m.dst_layout);
  out.set_dtype(DTypeToProto(m.dtype));
  if (m.cast_to.has_value()) out.set_target_dtype(DTypeToProto(*m.cast_to));
  return out;
}

absl::Status AppendTransferPage(const v1::PrepareTransferRequest& page, TransferTable* table) {
  if (page.page() == 0) {
    table->hosts_by_rank.assign(page.hosts_by_rank().begin(), page.hosts_by_rank().end());
  }
  table->layouts.reserve(table->layouts.size() + page.layouts_size());
  for (const v1::Layout& l : page.layouts()) {
    absl::StatusOr<Layout> layout =
        LayoutFromProto(l, absl::StrCat("layouts[", table->layouts.size(), "]"));
    if (!layout.ok()) return layout.status();
    table->layouts.push_back(*std::move(layout));
  }
  table->members.reserve(table->members.size() + page.members_size());
  for (const v1::TransferMember& m : page.members()) {
    const std::string where = absl::StrCat("members[", table->members.size(), "]");
    absl::StatusOr<DType> dtype = DTypeFromProto(m.dtype(), absl::StrCat(where, ".dtype"));
    if (!dtype.ok()) return dtype.status();
    std::optional<DType> cast_to;
    if (m.target_dtype() != v1::DTYPE_UNSPECIFIED) {
      absl::StatusOr<DType> to =
          DTypeFromProto(m.target_dtype(), absl::StrCat(where, ".target_dtype"));
      if (!to.ok()) return to.status();
      if (*to != *dtype) cast_to = *to;
    }
    TransferMemberSpec& out = table->members.emplace_back();
    out.src = m.src();
    out.dst = m.dst();
    out.src_version = m.src_version();
    out.dst_version = m.dst_version();
    out.dst_attached = m.dst_attached();
    out.src_layout = m.src_layout();
    out.dst_layout = m.dst_layout();
    out.dtype = *dtype;
    out.cast_to = cast_to;
  }
  return absl::OkStatus();
}

}  // namespace shardcoord
