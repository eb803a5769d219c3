#include "coordinator/plans/block_copy.h"

#include <algorithm>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "common/fan_in.h"
#include "common/start_end_join.h"
#include "coordinator/plans/hidden_tensor.h"
#include "proto/convert.h"
#include "sharding/cast.h"

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

struct BlockCopy::Member {
  BlockCopyArgs args;
  std::string where;  // Prefix of its errors: "" (a single Copy) or "copies[i].".
  // Block members only.
  Shape shape;
  DType src_dtype = DType::kF32;
  DType out_dtype = DType::kF32;
  BlockStagingPlan staging;
  // Hidden tensors: the staged src (and src scale), the computed values (and scales).
  std::string stage, stage_scale, out, out_scale;
  int64_t stage_version = 0, stage_scale_version = 0;
  // Whether the source (scale) layout, as checked, is the staging one: then read in place.
  bool src_in_place = false;
  bool scale_in_place = false;
  // Their indices in step 1's group; -1: read in place (stage, stage_scale name the source).
  int stage_index = -1;
  int stage_scale_index = -1;
  int64_t out_version = 0, out_scale_version = 0;
  // Step 2: one call per staging rank that holds chunks.
  std::vector<int64_t> ranks;  // Index into staging.staging.ranks().
  std::vector<WorkerEndpoint> endpoints;
  std::vector<v1::BlockQuantizeResponse> responses;
  // Step 3: the indices of its dst (and scale) in the commit group.
  size_t commit_dst = 0;
  size_t commit_scale = 0;
};

struct BlockCopy::Op {
  GroupDone done;
  std::string owner;  // Holder and owner of the hidden tensors.
  std::vector<Member> members;
  std::vector<std::string> hidden;  // Reserved so far, dropped at the end.
  std::vector<std::string> held;    // Sources read in place, held busy until the end.
  absl::Time started;
  BlockGroupResult result;
};

absl::StatusOr<WorkerEndpoint> BlockCopy::Endpoint(int64_t rank) const {
  return LiveEndpoint(*workers_, rank);
}

absl::Status BlockCopy::AddHidden(Op& op, const std::string& name, DType dtype,
                                  const Layout& layout, int64_t version,
                                  LayoutChecksums checksums) {
  return AddHiddenTensor(tensors_, *workers_, op.owner, name, dtype, layout, version,
                         "block staging layout", std::move(checksums), &op.hidden);
}

absl::Status BlockCopy::Start(const BlockCopyArgs& args, Done done) {
  if (args.plain()) return absl::InvalidArgumentError("scale: empty; a block copy needs it");
  auto op = std::make_shared<Op>();
  Member m;
  m.args = args;
  op->members.push_back(std::move(m));
  op->done = [done = std::move(done)](absl::StatusOr<BlockGroupResult> r) {
    if (!r.ok()) return done(r.status());
    done(std::move(r->members[0]));
  };
  return Begin(op);
}

absl::Status BlockCopy::StartGroup(const std::vector<BlockCopyArgs>& members, GroupDone done) {
  std::vector<CopyMember> names;
  for (const BlockCopyArgs& a : members) names.push_back(CopyMember{a.src, a.dst});
  if (absl::Status s = CheckCopyGroup(names); !s.ok()) return s;
  // CheckCopyGroup saw src and dst; a scale is a third tensor of the group.
  absl::flat_hash_map<std::string, std::string> seen;
  for (size_t i = 0; i < members.size(); ++i) {
    seen.emplace(members[i].src, absl::StrCat("copies[", i, "].src"));
    seen.emplace(members[i].dst, absl::StrCat("copies[", i, "].dst"));
  }
  for (size_t i = 0; i < members.size(); ++i) {
    if (members[i].plain()) continue;
    const std::string where = absl::StrCat("copies[", i, "].scale");
    auto [it, inserted] = seen.emplace(members[i].scale, where);
    if (!inserted) {
      return absl::InvalidArgumentError(absl::StrCat(where, ": tensor '", members[i].scale,
                                                     "' is also ", it->second,
                                                     "; a group names each tensor once"));
    }
  }
  auto op = std::make_shared<Op>();
  for (size_t i = 0; i < members.size(); ++i) {
    Member m;
    m.args = members[i];
    m.where = absl::StrCat("copies[", i, "].");
    op->members.push_back(std::move(m));
  }
  op->done = std::move(done);
  return Begin(op);
}

absl::Status BlockCopy::Begin(const std::shared_ptr<Op>& op) {
  // Every refusal before anything is created.
  auto prefixed = [](const Member& m, const absl::Status& s) {
    return m.where.empty() ? s : absl::Status(s.code(), absl::StrCat(m.where, s.message()));
  };
  auto get = [&](const Member& m, const char* field,
                 const std::string& name) -> absl::StatusOr<TensorRecord> {
    absl::StatusOr<TensorRecord> r = tensors_->Get(name);
    if (!r.ok() && !m.where.empty()) {
      return absl::Status(r.status().code(),
                          absl::StrCat(m.where, field, ": ", r.status().message()));
    }
    return r;
  };
  for (Member& m : op->members) {
    absl::StatusOr<TensorRecord> src = get(m, "src", m.args.src);
    if (!src.ok()) return src.status();
    absl::StatusOr<TensorRecord> dst = get(m, "dst", m.args.dst);
    if (!dst.ok()) return dst.status();
    if (m.args.plain()) {
      absl::Status s =
          CheckCopyPair(src->name, src->shape, src->dtype, dst->name, dst->shape, dst->dtype);
      if (!s.ok()) return absl::Status(s.code(), absl::StrCat(m.where, "dst: ", s.message()));
      continue;
    }
    absl::StatusOr<TensorRecord> scale = get(m, "scale", m.args.scale);
    if (!scale.ok()) return scale.status();
    if (absl::Status s = CheckBlockCopy(m.args, *src, *dst, *scale); !s.ok()) {
      return prefixed(m, s);
    }
    absl::StatusOr<BlockStagingPlan> staging = PlanBlockStaging(src->layout, m.args.block);
    if (!staging.ok()) return prefixed(m, staging.status());
    m.shape = src->shape;
    m.src_dtype = src->dtype;
    m.out_dtype = m.args.dequantize ? dst->dtype : DType::kF8E4M3;
    m.staging = *std::move(staging);
    m.src_in_place = src->layout == m.staging.staging;
    m.scale_in_place = m.args.dequantize && scale->layout == m.staging.scales;
  }

  // The counter and a version no buffer has used (also before a restart): buffers a worker
  // kept from an earlier incarnation's block copy never share a name with this one's.
  const int64_t unique = tensors_->NewVersion();
  int64_t n = 0;
  {
    absl::MutexLock lock(&mu_);
    n = ++next_id_;
  }
  op->owner = absl::StrCat("blockcopy-", n, ".", unique);
  op->started = clock_->Now();
  op->result.members.resize(op->members.size());

  // Step 1: the staging tensors (empty first versions) and the group that fills them.
  std::vector<LoadMember> stage_members;
  absl::Status s;
  for (size_t i = 0; i < op->members.size() && s.ok(); ++i) {
    Member& m = op->members[i];
    if (m.args.plain()) continue;
    const std::string base = absl::StrCat("~", op->owner, "/", i);
    m.stage = base + "/stage";
    m.stage_scale = base + "/stage-scale";
    m.out = base + "/out";
    m.out_scale = base + "/out-scale";
    BlockCopyResult& r = op->result.members[i];
    r.blocks = m.staging.blocks;
    r.cut_blocks = m.staging.cut_blocks;
    for (size_t j = 0; j < m.staging.staging.ranks().size(); ++j) {
      const RankChunks& rc = m.staging.staging.ranks()[j];
      if (rc.chunks.empty()) continue;
      r.staging.push_back(absl::StrCat("rank ", rc.rank, ": ",
                                       m.staging.scales.ranks()[j].local_elements, " blocks in ",
                                       rc.chunks.size(), " boxes"));
    }
    // A source whose layout is the staging layout (its shards hold whole blocks, no
    // replicas) is read in place: held busy until the end instead of copied.
    auto hold = [&](bool candidate, const std::string& name, const Layout& want,
                    std::string* read_as) {
      if (!candidate) return false;
      absl::StatusOr<TensorRecord> held = tensors_->Acquire(name, op->owner);
      if (!held.ok()) {
        s = absl::Status(held.status().code(), absl::StrCat(m.where, held.status().message()));
        return true;  // Refused: nothing else starts.
      }
      if (!(held->layout == want)) {  // Moved since the checks: staged after all.
        tensors_->Release(name, op->owner);
        return false;
      }
      op->held.push_back(name);
      *read_as = name;
      return true;
    };
    LoadMember lm;
    lm.keep_hidden = true;
    if (!hold(m.src_in_place, m.args.src, m.staging.staging, &m.stage)) {
      s = AddHidden(*op, m.stage, m.src_dtype, m.staging.staging, tensors_->NewVersion(), {});
      lm.staging = m.args.src;
      lm.into = m.stage;
      lm.where = m.where + "src";
      m.stage_index = static_cast<int>(stage_members.size());
      stage_members.push_back(lm);
    }
    if (s.ok() && m.args.dequantize &&
        !hold(m.scale_in_place, m.args.scale, m.staging.scales, &m.stage_scale)) {
      s = AddHidden(*op, m.stage_scale, DType::kF32, m.staging.scales, tensors_->NewVersion(), {});
      lm.staging = m.args.scale;
      lm.into = m.stage_scale;
      lm.where = m.where + "scale";
      m.stage_scale_index = static_cast<int>(stage_members.size());
      stage_members.push_back(lm);
    }
  }
  if (!s.ok()) {
    op->done = nullptr;  // Refused: the caller hears it from the return value.
    Finish(op, s);
    return s;
  }
  if (stage_members.empty()) {
    Staged(op);
    return absl::OkStatus();
  }
  auto join = std::make_shared<StartEndJoin<absl::Status>>([this, op](absl::Status end) {
    if (!end.ok()) return Finish(op, end);
    Staged(op);
  });
  absl::StatusOr<StartedGroup> group =
      plans_->LoadGroup(op->owner, stage_members,
                        [join](const absl::Status& st, const GroupProgress&) { join->Ended(st); });
  if (!group.ok()) {
    op->done = nullptr;
    Finish(op, group.status());
    return group.status();
  }
  op->result.stage_group = group->id;
  op->result.staged_bytes = group->bytes_moved;
  op->result.bytes_moved = group->bytes_moved;
  // Per member: its src's (and src scale's) staging plans.
  for (size_t i = 0; i < op->members.size(); ++i) {
    const Member& m = op->members[i];
    BlockCopyResult& r = op->result.members[i];
    for (int k : {m.stage_index, m.stage_scale_index}) {
      if (k < 0) continue;
      r.stage_group = group->id;
      r.staged_bytes += group->members[k].plan->bytes_moved;
    }
    r.bytes_moved = r.staged_bytes;
  }
  join->Started();
  return absl::OkStatus();
}

void BlockCopy::Staged(const std::shared_ptr<Op>& op) {
  // Step 2: every staging rank with chunks computes its part of every member into new buffers.
  size_t calls = 0;
  for (Member& m : op->members) {
    if (m.args.plain()) continue;
    absl::StatusOr<TensorRecord> stage = tensors_->Get(m.stage, op->owner);
    if (!stage.ok()) return Finish(op, stage.status());
    m.stage_version = stage->version;
    if (m.args.dequantize) {
      absl::StatusOr<TensorRecord> st = tensors_->Get(m.stage_scale, op->owner);
      if (!st.ok()) return Finish(op, st.status());
      m.stage_scale_version = st->version;
    }
    m.out_version = tensors_->NewVersion();
    if (!m.args.dequantize) m.out_scale_version = tensors_->NewVersion();
    const Layout& layout = m.staging.staging;
    for (size_t j = 0; j < layout.ranks().size(); ++j) {
      if (layout.ranks()[j].chunks.empty()) continue;
      absl::StatusOr<WorkerEndpoint> e = Endpoint(layout.ranks()[j].rank);
      if (!e.ok()) return Finish(op, e.status());
      m.ranks.push_back(static_cast<int64_t>(j));
      m.endpoints.push_back(*e);
    }
    m.responses.resize(m.ranks.size());
    calls += m.ranks.size();
  }
  auto fan = FanIn::Start(calls, [this, op](absl::Status s) {
    if (!s.ok()) return Finish(op, s);
    Computed(op);
  });
  for (Member& m : op->members) {
    for (size_t k = 0; k < m.ranks.size(); ++k) {
      const size_t j = static_cast<size_t>(m.ranks[k]);
      v1::BlockQuantizeRequest req;
      req.set_tensor(m.stage);
      req.set_version(m.stage_version);
      for (int64_t d : m.shape) req.add_global_shape(d);
      req.set_block(BlockQuantizationText(m.args.block));
      req.set_dequantize(m.args.dequantize);
      req.set_scales_tensor(m.args.dequantize ? m.stage_scale : m.out_scale);
      req.set_scales_version(m.args.dequantize ? m.stage_scale_version : m.out_scale_version);
      *req.mutable_scale_chunks() = RankChunksToProto(m.staging.scales.ranks()[j]);
      req.set_out_tensor(m.out);
      req.set_out_version(m.out_version);
      req.set_out_dtype(DTypeToProto(m.out_dtype));
      Member* member = &m;  // op owns the members and outlives every call.
      client_->BlockQuantize(
          m.endpoints[k], req, [fan, op, member, k](absl::StatusOr<v1::BlockQuantizeResponse> r) {
            if (r.ok()) member->responses[k] = *std::move(r);
            fan->Report(r.ok() ? absl::OkStatus()
                               : absl::Status(r.status().code(),
                                              absl::StrCat(member->where, "BlockQuantize on ",
                                                           member->endpoints[k].name, " (rank ",
                                                           member->endpoints[k].rank,
                                                           "): ", r.status().message())));
          });
    }
  }
}

absl::Status BlockCopy::RegisterComputed(Op& op, Member& m) {
  // The computed buffers as hidden tensors, with the checksums the workers reported.
  const Layout& layout = m.staging.staging;
  LayoutChecksums sums(layout.ranks().size()), scale_sums(layout.ranks().size());
  for (size_t j = 0; j < layout.ranks().size(); ++j) {
    sums[j].assign(layout.ranks()[j].chunks.size(), 0);
    scale_sums[j].assign(m.staging.scales.ranks()[j].chunks.size(), 0);
  }
  for (size_t k = 0; k < m.ranks.size(); ++k) {
    const size_t j = static_cast<size_t>(m.ranks[k]);
    ChunkChecksums got;
    absl::StatusOr<RankChunks> chunks =
        RankChunksFromProto(m.responses[k].chunks(), "chunks", &got);
    if (!chunks.ok() || chunks->chunks != layout.ranks()[j].chunks) {
      return absl::InternalError(
          absl::StrCat(m.where, "rank ", m.endpoints[k].rank,
                       " answered BlockQuantize with other chunks than it was given"));
    }
    sums[j] = got;
    if (!m.args.dequantize) {
      ChunkChecksums got_scales;
      absl::StatusOr<RankChunks> sc =
          RankChunksFromProto(m.responses[k].scale_chunks(), "scale_chunks", &got_scales);
      if (!sc.ok() || sc->chunks != m.staging.scales.ranks()[j].chunks) {
        return absl::InternalError(absl::StrCat(m.where, "rank ", m.endpoints[k].rank,
                                                " answered BlockQuantize with other scale chunks"));
      }
      scale_sums[j] = got_scales;
    }
  }
  absl::Status s = AddHidden(op, m.out, m.out_dtype, layout, m.out_version, std::move(sums));
  if (s.ok() && !m.args.dequantize) {
    s = AddHidden(op, m.out_scale, DType::kF32, m.staging.scales, m.out_scale_version,
                  std::move(scale_sums));
  }
  return s;
}

void BlockCopy::Computed(const std::shared_ptr<Op>& op) {
  for (Member& m : op->members) {
    if (m.args.plain()) continue;
    if (absl::Status s = RegisterComputed(*op, m); !s.ok()) return Finish(op, s);
  }

  // Step 3: every dst (and scale) gets its new version together.
  std::vector<LoadMember> members;
  for (Member& m : op->members) {
    LoadMember lm;
    lm.staging = m.args.plain() ? m.args.src : m.out;
    lm.into = m.args.dst;
    lm.where = m.where.empty()
                   ? "dst"
                   : (m.args.plain() ? m.where.substr(0, m.where.size() - 1) : m.where + "dst");
    m.commit_dst = members.size();
    members.push_back(lm);
    if (!m.args.plain() && !m.args.dequantize) {
      lm.staging = m.out_scale;
      lm.into = m.args.scale;
      lm.where = m.where + "scale";
      m.commit_scale = members.size();
      members.push_back(lm);
    }
  }
  auto join = std::make_shared<StartEndJoin<std::pair<absl::Status, GroupProgress>>>(
      [this, op](std::pair<absl::Status, GroupProgress> end) {
        if (end.first.ok()) {
          for (const Member& m : op->members) {
            op->result.progress.push_back(m.commit_dst < end.second.members.size()
                                              ? end.second.members[m.commit_dst]
                                              : PlanProgress{});
          }
        }
        Finish(op, end.first);
      });
  absl::StatusOr<StartedGroup> group =
      plans_->LoadGroup(op->owner, members, [join](const absl::Status& st, const GroupProgress& p) {
        join->Ended({st, p});
      });
  if (!group.ok()) return Finish(op, group.status());
  op->result.commit_group = group->id;
  op->result.bytes_moved += group->bytes_moved;
  op->result.lower_bound_bytes = group->lower_bound_bytes;
  for (size_t i = 0; i < op->members.size(); ++i) {
    const Member& m = op->members[i];
    BlockCopyResult& r = op->result.members[i];
    const StartedPlan& dst = group->members[m.commit_dst];
    op->result.commits.push_back(dst);
    r.commit_group = group->id;
    r.dst_version = dst.target_version;
    r.bytes_moved += dst.plan->bytes_moved;
    if (!m.args.plain() && !m.args.dequantize) {
      const StartedPlan& scale = group->members[m.commit_scale];
      r.scale_version = scale.target_version;
      r.bytes_moved += scale.plan->bytes_moved;
    }
  }
  join->Started();
}

void BlockCopy::Finish(const std::shared_ptr<Op>& op, absl::Status s) {
  for (const std::string& name : op->held) tensors_->Release(name, op->owner);
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
  // Buffers step 2 computed that were never registered as hidden tensors (it failed, or
  // registering did): dropped by name on the ranks that computed them.
  for (const Member& m : op->members) {
    if (std::find(op->hidden.begin(), op->hidden.end(), m.out) != op->hidden.end()) continue;
    for (const WorkerEndpoint& e : m.endpoints) {
      v1::DropTensorRequest drop;
      drop.add_tensors(m.out);
      drop.add_tensors(m.out_scale);
      drop.set_version(-1);
      client_->DropTensor(e, drop, [](absl::Status) {});
    }
  }
  if (op->done == nullptr) return;
  if (!s.ok()) return op->done(s);
  op->result.seconds = absl::ToDoubleSeconds(clock_->Now() - op->started);
  op->done(std::move(op->result));
}

}  // namespace shardcoord
