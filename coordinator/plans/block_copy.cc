#include "coordinator/plans/block_copy.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/fan_in.h"
#include "common/start_end_join.h"
#include "proto/convert.h"

namespace shardcoord {
namespace {

bool BlockQuantizable(DType dtype) { return IsFloat(dtype) && dtype != DType::kF8E8M0; }

}  // namespace

absl::Status CheckBlockCopy(const BlockCopyArgs& args, const TensorRecord& src,
                            const TensorRecord& dst, const TensorRecord& scale) {
  if (args.src == args.dst) {
    return absl::InvalidArgumentError(
        absl::StrCat("dst: '", args.dst, "' is also src; a tensor cannot be copied onto itself"));
  }
  if (args.scale == args.src || args.scale == args.dst) {
    return absl::InvalidArgumentError(absl::StrCat("scale: '", args.scale, "' is also ",
                                                   args.scale == args.src ? "src" : "dst",
                                                   "; the scale tensor must be a third tensor"));
  }
  const char* mode = args.dequantize ? "dequantize" : "quantize";
  if (!args.dequantize) {
    if (!BlockQuantizable(src.dtype)) {
      return absl::InvalidArgumentError(
          absl::StrCat("src: '", src.name, "' is ", DTypeName(src.dtype),
                       "; quantize needs a float dtype other than f8_e8m0"));
    }
    if (dst.dtype != DType::kF8E4M3) {
      return absl::InvalidArgumentError(absl::StrCat(
          "dst: '", dst.name, "' is ", DTypeName(dst.dtype), "; quantize writes f8_e4m3"));
    }
  } else {
    if (src.dtype != DType::kF8E4M3) {
      return absl::InvalidArgumentError(absl::StrCat(
          "src: '", src.name, "' is ", DTypeName(src.dtype), "; dequantize reads f8_e4m3"));
    }
    if (!BlockQuantizable(dst.dtype)) {
      return absl::InvalidArgumentError(
          absl::StrCat("dst: '", dst.name, "' is ", DTypeName(dst.dtype),
                       "; dequantize writes a float dtype other than f8_e8m0"));
    }
  }
  if (src.shape != dst.shape) {
    return absl::InvalidArgumentError(absl::StrCat("dst: '", dst.name, "' has shape ",
                                                   ShapeToString(dst.shape), ", src '", src.name,
                                                   "' has ", ShapeToString(src.shape)));
  }
  absl::StatusOr<Shape> want = BlockScaleShape(src.shape, args.block);
  if (!want.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("src: '", src.name, "' of shape ",
                                                   ShapeToString(src.shape), ": ",
                                                   want.status().message()));
  }
  if (scale.dtype != DType::kF32 || scale.shape != *want) {
    return absl::InvalidArgumentError(absl::StrCat(
        "scale: '", scale.name, "' is ", DTypeName(scale.dtype), " ", ShapeToString(scale.shape),
        "; ", mode, " with ", BlockQuantizationText(args.block), " of ", ShapeToString(src.shape),
        " needs f32 ", ShapeToString(*want)));
  }
  return absl::OkStatus();
}

struct BlockCopy::Op {
  BlockCopyArgs args;
  Done done;
  std::string owner;  // Holder and owner of the hidden tensors.
  Shape shape;
  DType src_dtype = DType::kF32;
  DType out_dtype = DType::kF32;
  BlockStagingPlan staging;
  // Hidden tensors: the staged src (and src scale), the computed values (and scales).
  std::string stage, stage_scale, out, out_scale;
  int64_t out_version = 0, out_scale_version = 0;
  std::vector<std::string> hidden;  // Reserved so far, dropped at the end.
  // Step 2: one call per staging rank that holds chunks.
  std::vector<int64_t> ranks;  // Index into staging.staging.ranks().
  std::vector<WorkerEndpoint> endpoints;
  std::vector<v1::BlockQuantizeResponse> responses;
  BlockCopyResult result;
};

absl::StatusOr<WorkerEndpoint> BlockCopy::Endpoint(int64_t rank) const {
  absl::StatusOr<WorkerRecord> w = workers_->GetByRank(rank);
  if (!w.ok()) return w.status();
  if (!w->alive) return w->DeadError("is dead");
  return w->Endpoint();
}

absl::Status BlockCopy::AddHidden(const std::shared_ptr<Op>& op, const std::string& name,
                                  DType dtype, const Layout& layout, int64_t version,
                                  LayoutChecksums checksums) {
  TensorRecord rec;
  rec.name = name;
  rec.shape = layout.global_shape();
  rec.dtype = dtype;
  rec.spec = "block staging layout";
  rec.layout = layout;
  rec.version = version;
  rec.owner = op->owner;
  absl::flat_hash_map<int64_t, int64_t> holders;
  for (const RankChunks& rc : layout.ranks()) {
    absl::StatusOr<WorkerEndpoint> e = Endpoint(rc.rank);
    if (!e.ok()) return e.status();
    holders[rc.rank] = e->incarnation;
  }
  if (checksums.empty()) {
    for (const RankChunks& rc : layout.ranks()) checksums.emplace_back(rc.chunks.size(), 0);
  }
  if (absl::Status s = tensors_->Reserve(std::move(rec), op->owner); !s.ok()) return s;
  op->hidden.push_back(name);
  return tensors_->FinishCreate(name, op->owner, std::move(checksums), std::move(holders));
}

absl::Status BlockCopy::Start(const BlockCopyArgs& args, Done done) {
  absl::StatusOr<TensorRecord> src = tensors_->Get(args.src);
  if (!src.ok()) return src.status();
  absl::StatusOr<TensorRecord> dst = tensors_->Get(args.dst);
  if (!dst.ok()) return dst.status();
  absl::StatusOr<TensorRecord> scale = tensors_->Get(args.scale);
  if (!scale.ok()) return scale.status();
  if (absl::Status s = CheckBlockCopy(args, *src, *dst, *scale); !s.ok()) return s;
  absl::StatusOr<BlockStagingPlan> staging = PlanBlockStaging(src->layout, args.block);
  if (!staging.ok()) return staging.status();

  auto op = std::make_shared<Op>();
  op->args = args;
  op->done = std::move(done);
  // The counter and a version no buffer has used (also before a restart): buffers a worker
  // kept from an earlier incarnation's block copy never share a name with this one's.
  const int64_t unique = tensors_->NewVersion();
  int64_t n = 0;
  {
    absl::MutexLock lock(&mu_);
    n = ++next_id_;
  }
  op->owner = absl::StrCat("blockcopy-", n, ".", unique);
  op->shape = src->shape;
  op->src_dtype = src->dtype;
  op->out_dtype = args.dequantize ? dst->dtype : DType::kF8E4M3;
  op->staging = *std::move(staging);
  op->stage = absl::StrCat("~", op->owner, "/stage");
  op->stage_scale = absl::StrCat("~", op->owner, "/stage-scale");
  op->out = absl::StrCat("~", op->owner, "/out");
  op->out_scale = absl::StrCat("~", op->owner, "/out-scale");
  op->result.blocks = op->staging.blocks;
  op->result.cut_blocks = op->staging.cut_blocks;
  for (size_t j = 0; j < op->staging.staging.ranks().size(); ++j) {
    const RankChunks& rc = op->staging.staging.ranks()[j];
    if (rc.chunks.empty()) continue;
    op->result.staging.push_back(absl::StrCat("rank ", rc.rank, ": ",
                                              op->staging.scales.ranks()[j].local_elements,
                                              " blocks in ", rc.chunks.size(), " boxes"));
  }

  // Step 1: the staging tensors (empty first versions) and the group that fills them.
  std::vector<LoadMember> members;
  absl::Status s =
      AddHidden(op, op->stage, src->dtype, op->staging.staging, tensors_->NewVersion(), {});
  LoadMember m;
  m.staging = args.src;
  m.into = op->stage;
  m.keep_hidden = true;
  members.push_back(m);
  if (s.ok() && args.dequantize) {
    s = AddHidden(op, op->stage_scale, DType::kF32, op->staging.scales, tensors_->NewVersion(), {});
    m.staging = args.scale;
    m.into = op->stage_scale;
    members.push_back(m);
  }
  if (!s.ok()) {
    op->done = nullptr;  // Refused: the caller hears it from the return value.
    Finish(op, s);
    return s;
  }
  auto join = std::make_shared<StartEndJoin<absl::Status>>([this, op](absl::Status end) {
    if (!end.ok()) return Finish(op, end);
    Staged(op);
  });
  absl::StatusOr<StartedGroup> group =
      plans_->LoadGroup(op->owner, members,
                        [join](const absl::Status& st, const GroupProgress&) { join->Ended(st); });
  if (!group.ok()) {
    op->done = nullptr;
    Finish(op, group.status());
    return group.status();
  }
  op->result.stage_group = group->id;
  op->result.staged_bytes = group->bytes_moved;
  op->result.bytes_moved = group->bytes_moved;
  join->Started();
  return absl::OkStatus();
}

void BlockCopy::Staged(const std::shared_ptr<Op>& op) {
  // Step 2: every staging rank with chunks computes its part into new buffers.
  absl::StatusOr<TensorRecord> stage = tensors_->Get(op->stage, op->owner);
  if (!stage.ok()) return Finish(op, stage.status());
  int64_t scale_version = 0;
  if (op->args.dequantize) {
    absl::StatusOr<TensorRecord> st = tensors_->Get(op->stage_scale, op->owner);
    if (!st.ok()) return Finish(op, st.status());
    scale_version = st->version;
  }
  op->out_version = tensors_->NewVersion();
  if (!op->args.dequantize) op->out_scale_version = tensors_->NewVersion();
  const Layout& layout = op->staging.staging;
  for (size_t j = 0; j < layout.ranks().size(); ++j) {
    if (layout.ranks()[j].chunks.empty()) continue;
    absl::StatusOr<WorkerEndpoint> e = Endpoint(layout.ranks()[j].rank);
    if (!e.ok()) return Finish(op, e.status());
    op->ranks.push_back(static_cast<int64_t>(j));
    op->endpoints.push_back(*e);
  }
  op->responses.resize(op->ranks.size());
  auto fan = FanIn::Start(op->ranks.size(), [this, op](absl::Status s) {
    if (!s.ok()) return Finish(op, s);
    Computed(op);
  });
  for (size_t k = 0; k < op->ranks.size(); ++k) {
    const size_t j = static_cast<size_t>(op->ranks[k]);
    v1::BlockQuantizeRequest req;
    req.set_tensor(op->stage);
    req.set_version(stage->version);
    for (int64_t d : op->shape) req.add_global_shape(d);
    req.set_block(BlockQuantizationText(op->args.block));
    req.set_dequantize(op->args.dequantize);
    req.set_scales_tensor(op->args.dequantize ? op->stage_scale : op->out_scale);
    req.set_scales_version(op->args.dequantize ? scale_version : op->out_scale_version);
    *req.mutable_scale_chunks() = RankChunksToProto(op->staging.scales.ranks()[j]);
    req.set_out_tensor(op->out);
    req.set_out_version(op->out_version);
    req.set_out_dtype(DTypeToProto(op->out_dtype));
    client_->BlockQuantize(
        op->endpoints[k], req, [fan, op, k](absl::StatusOr<v1::BlockQuantizeResponse> r) {
          if (r.ok()) op->responses[k] = *std::move(r);
          fan->Report(r.ok() ? absl::OkStatus()
                             : absl::Status(r.status().code(),
                                            absl::StrCat("BlockQuantize on ", op->endpoints[k].name,
                                                         " (rank ", op->endpoints[k].rank,
                                                         "): ", r.status().message())));
        });
  }
}

void BlockCopy::Computed(const std::shared_ptr<Op>& op) {
  // The computed buffers as hidden tensors, with the checksums the workers reported.
  const Layout& layout = op->staging.staging;
  LayoutChecksums sums(layout.ranks().size()), scale_sums(layout.ranks().size());
  for (size_t j = 0; j < layout.ranks().size(); ++j) {
    sums[j].assign(layout.ranks()[j].chunks.size(), 0);
    scale_sums[j].assign(op->staging.scales.ranks()[j].chunks.size(), 0);
  }
  for (size_t k = 0; k < op->ranks.size(); ++k) {
    const size_t j = static_cast<size_t>(op->ranks[k]);
    ChunkChecksums got;
    absl::StatusOr<RankChunks> chunks =
        RankChunksFromProto(op->responses[k].chunks(), "chunks", &got);
    if (!chunks.ok() || chunks->chunks != layout.ranks()[j].chunks) {
      return Finish(op, absl::InternalError(absl::StrCat(
                            "rank ", op->endpoints[k].rank,
                            " answered BlockQuantize with other chunks than it was given")));
    }
    sums[j] = got;
    if (!op->args.dequantize) {
      ChunkChecksums got_scales;
      absl::StatusOr<RankChunks> sc =
          RankChunksFromProto(op->responses[k].scale_chunks(), "scale_chunks", &got_scales);
      if (!sc.ok() || sc->chunks != op->staging.scales.ranks()[j].chunks) {
        return Finish(op, absl::InternalError(
                              absl::StrCat("rank ", op->endpoints[k].rank,
                                           " answered BlockQuantize with other scale chunks")));
      }
      scale_sums[j] = got_scales;
    }
  }
  absl::Status s = AddHidden(op, op->out, op->out_dtype, layout, op->out_version, std::move(sums));
  if (s.ok() && !op->args.dequantize) {
    s = AddHidden(op, op->out_scale, DType::kF32, op->staging.scales, op->out_scale_version,
                  std::move(scale_sums));
  }
  if (!s.ok()) return Finish(op, s);

  // Step 3: DST (and DST_SCALE) get their new versions together.
  std::vector<LoadMember> members;
  LoadMember m;
  m.staging = op->out;
  m.into = op->args.dst;
  members.push_back(m);
  if (!op->args.dequantize) {
    m.staging = op->out_scale;
    m.into = op->args.scale;
    members.push_back(m);
  }
  auto join = std::make_shared<StartEndJoin<absl::Status>>(
      [this, op](absl::Status end) { Finish(op, end); });
  absl::StatusOr<StartedGroup> group =
      plans_->LoadGroup(op->owner, members,
                        [join](const absl::Status& st, const GroupProgress&) { join->Ended(st); });
  if (!group.ok()) return Finish(op, group.status());
  op->result.commit_group = group->id;
  op->result.bytes_moved += group->bytes_moved;
  op->result.dst_version = group->members[0].target_version;
  if (!op->args.dequantize) op->result.scale_version = group->members[1].target_version;
  join->Started();
}

void BlockCopy::Finish(const std::shared_ptr<Op>& op, absl::Status s) {
  // Every hidden tensor goes, with every version of its buffers on its ranks.
  for (const std::string& name : op->hidden) {
    tensors_->CancelCreate(name, op->owner);
    absl::StatusOr<TensorRecord> rec = tensors_->Remove(name, op->owner);
    if (!rec.ok()) continue;
    for (const RankChunks& rc : rec->layout.ranks()) {
      absl::StatusOr<WorkerEndpoint> e = Endpoint(rc.rank);
      if (!e.ok()) continue;
      v1::DropTensorRequest drop;
      drop.set_tensor(name);
      drop.set_version(-1);
      client_->DropTensor(*e, drop, [](absl::Status) {});
    }
  }
  // Buffers computed by step 2 before its hidden tensors were registered.
  if (std::find(op->hidden.begin(), op->hidden.end(), op->out) == op->hidden.end()) {
    for (const WorkerEndpoint& e : op->endpoints) {
      v1::DropTensorRequest drop;
      drop.add_tensors(op->out);
      drop.add_tensors(op->out_scale);
      drop.set_version(-1);
      client_->DropTensor(e, drop, [](absl::Status) {});
    }
  }
  if (op->done == nullptr) return;
  if (!s.ok()) return op->done(s);
  op->done(op->result);
}

}  // namespace shardcoord
