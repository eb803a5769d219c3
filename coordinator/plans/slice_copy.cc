#include "coordinator/plans/slice_copy.h"

#include <algorithm>
#include <map>
#include <memory>
#include <set>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/fan_in.h"
#include "common/start_end_join.h"
#include "coordinator/plans/hidden_tensor.h"
#include "coordinator/plans/plan_relay.h"
#include "coordinator/state/tensor_bands.h"
#include "proto/convert.h"
#include "sharding/box_copy.h"
#include "sharding/box_slices.h"
#include "sharding/cast.h"
#include "sharding/field_status.h"

namespace shardcoord {
namespace {

using field_status::Index;
using field_status::Prefixed;
using field_status::Sub;

// One box read from a worker, and where its elements land in a dst rank's new buffer.
struct Read {
  int64_t holder = 0;
  std::string tensor;
  int64_t version = 0;
  DType dtype = DType::kF32;
  Box box;            // In the read tensor's coordinates.
  size_t out = 0;     // Index into SliceOp::outs.
  size_t chunk = 0;   // Index into that out's chunks.
  Box at;             // In dst's coordinates: the same elements, row-major.
  bool base = false;  // The dst rank's own old chunk (its values outside the boxes).
  std::string data;
};

// One dst rank's new local buffer.
struct Out {
  size_t dst = 0;         // Index into SliceOp::dsts.
  size_t rank_index = 0;  // Index into the dst's layout ranks.
  RankChunks rc;
  WorkerEndpoint to;
};

struct Dst {
  TensorRecord rec;
  int64_t version = 0;  // The new one.
  LayoutChecksums checksums;
};

// One running slice copy. Its fields are set before the first call goes out; afterwards
// only `mu` guards what the answers change.
// Every dst at its new version with the checksums its workers answered, held by `holder`.
std::vector<TensorManager::CommitItem> CommitItems(const std::vector<Dst>& dsts,
                                                   const std::string& holder) {
  std::vector<TensorManager::CommitItem> items;
  for (const Dst& d : dsts) {
    TensorManager::CommitItem item;
    item.name = d.rec.name;
    item.holder = holder;
    item.state.mesh = d.rec.mesh;
    item.state.spec = d.rec.spec;
    item.state.layout = d.rec.layout;
    item.state.checksums = d.checksums;
    item.state.version = d.version;
    item.state.incarnations = d.rec.incarnations;
    items.push_back(std::move(item));
  }
  return items;
}

struct SliceOp {
  std::string id;
  absl::Time start;
  WorkerClient* client = nullptr;
  TensorManager* tensors = nullptr;
  std::vector<std::string> acquired;
  std::vector<SliceCopyMember> members;
  std::vector<Dst> dsts;
  std::vector<Read> reads;
  std::vector<Out> outs;
  PlanManager::GroupDoneCallback done;

  absl::Mutex mu;
  size_t pending ABSL_GUARDED_BY(mu) = 0;
  absl::Status status ABSL_GUARDED_BY(mu);
  std::vector<size_t> attempted ABSL_GUARDED_BY(mu);  // Outs a write went to.
};

void Release(TensorManager* tensors, const std::vector<std::string>& names,
             const std::string& holder) {
  for (const std::string& n : names) tensors->Release(n, holder);
}

GroupProgress ProgressOf(const SliceOp& op, PlanState state, const std::string& error) {
  GroupProgress p;
  p.group_id = op.id;
  p.state = state;
  p.error = error;
  p.seconds = absl::ToDoubleSeconds(absl::Now() - op.start);
  for (const SliceCopyMember& m : op.members) {
    PlanProgress mp;
    mp.plan_id = op.id;
    mp.tensor = m.dst;
    mp.state = state;
    mp.error = error;
    mp.seconds = p.seconds;
    p.members.push_back(std::move(mp));
  }
  return p;
}

// Rolls back: drops every new buffer a write went to (each worker drops its own; an answer
// changes nothing), releases every tensor, reports.
void Abort(const std::shared_ptr<SliceOp>& op, const absl::Status& cause) {
  std::vector<size_t> attempted;
  {
    absl::MutexLock lock(&op->mu);
    attempted = op->attempted;
  }
  for (size_t i : attempted) {
    const Out& o = op->outs[i];
    v1::DropTensorRequest drop;
    drop.set_tensor(op->dsts[o.dst].rec.name);
    drop.set_version(op->dsts[o.dst].version);
    op->client->DropTensor(o.to, drop, [](const absl::Status&) {});
  }
  Release(op->tensors, op->acquired, op->id);
  const std::string error = absl::StrCat("slice copy ", op->id, ": ", cause.message());
  op->done(absl::AbortedError(error), ProgressOf(*op, PlanState::kAborted, error));
}

// Every write answered: commits every dst together, then drops their old versions.
void Commit(const std::shared_ptr<SliceOp>& op) {
  std::vector<TensorManager::CommitItem> items = CommitItems(op->dsts, op->id);
  if (absl::Status s = op->tensors->CommitAll(std::move(items)); !s.ok()) return Abort(op, s);
  Release(op->tensors, op->acquired, op->id);  // The srcs; the dsts were ended by the commit.
  for (const Out& o : op->outs) {
    v1::DropTensorRequest drop;
    drop.set_tensor(op->dsts[o.dst].rec.name);
    drop.set_version(op->dsts[o.dst].rec.version);
    op->client->DropTensor(o.to, drop, [](const absl::Status&) {});
  }
  op->done(absl::OkStatus(), ProgressOf(*op, PlanState::kCommitted, ""));
}

void Write(const std::shared_ptr<SliceOp>& op) {
  // Lay out every new buffer: the old chunks first, then the members' pieces over them.
  std::vector<std::string> bufs(op->outs.size());
  for (size_t i = 0; i < op->outs.size(); ++i) {
    const Out& o = op->outs[i];
    const int64_t es = ElementSize(op->dsts[o.dst].rec.dtype);
    bufs[i].assign(static_cast<size_t>(o.rc.local_elements * es), '\0');
  }
  absl::Status error;
  for (bool base : {true, false}) {
    for (Read& r : op->reads) {
      if (r.base != base || !error.ok()) continue;
      const Out& o = op->outs[r.out];
      const Dst& d = op->dsts[o.dst];
      const Chunk& c = o.rc.chunks[r.chunk];
      char* at = bufs[r.out].data() + c.local_offset * ElementSize(d.rec.dtype);
      error = CastBox(r.at, r.data.data(), r.at, r.dtype, at, c.box, d.rec.dtype);
      r.data.clear();
    }
  }
  if (!error.ok()) return Abort(op, absl::InternalError(error.message()));
  {
    absl::MutexLock lock(&op->mu);
    op->pending = op->outs.size();
    for (size_t i = 0; i < op->outs.size(); ++i) op->attempted.push_back(i);
  }
  if (op->outs.empty()) return Commit(op);
  for (size_t i = 0; i < op->outs.size(); ++i) {
    const Out& o = op->outs[i];
    const Dst& d = op->dsts[o.dst];
    v1::ChunkData message;
    message.set_tensor(d.rec.name);
    message.set_version(d.version);
    message.set_dtype(DTypeToProto(d.rec.dtype));
    *message.mutable_chunks() = RankChunksToProto(o.rc);
    message.set_total_bytes(static_cast<int64_t>(bufs[i].size()));
    *message.mutable_data() = std::move(bufs[i]);
    op->client->WriteBuffer(
        o.to, std::move(message), [op, i](absl::StatusOr<v1::WriteChunkResponse> r) {
          const Out& o = op->outs[i];
          absl::Status s;
          ChunkChecksums sums;
          if (!r.ok()) {
            s = absl::UnavailableError(
                absl::StrCat("writing to ", Describe(o.to), ": ", r.status().ToString()));
          } else {
            absl::StatusOr<RankChunks> got = RankChunksFromProto(r->chunks(), "chunks", &sums);
            if (!got.ok() || got->chunks != o.rc.chunks || sums.size() != o.rc.chunks.size()) {
              s = absl::InternalError(
                  absl::StrCat(Describe(o.to), " answered the write with other chunks than given"));
            }
          }
          bool last = false;
          absl::Status failed;
          {
            absl::MutexLock lock(&op->mu);
            if (!s.ok() && op->status.ok()) op->status = s;
            // Each out's slot is written by its own answer only.
            if (s.ok()) op->dsts[o.dst].checksums[o.rank_index] = std::move(sums);
            last = --op->pending == 0;
            failed = op->status;
          }
          if (!last) return;
          if (!failed.ok()) return Abort(op, failed);
          Commit(op);
        });
  }
}

void OnRead(const std::shared_ptr<SliceOp>& op, size_t i,
            absl::StatusOr<v1::ReadBoxesResponse> got) {
  Read& r = op->reads[i];
  absl::Status s;
  const int64_t want = r.box.Volume() * ElementSize(r.dtype);
  if (!got.ok()) {
    s = absl::UnavailableError(absl::StrCat("reading ", r.box.ToString(), " of '", r.tensor,
                                            "' from rank ", r.holder, ": ",
                                            got.status().ToString()));
  } else if (got->data_size() != 1 || static_cast<int64_t>(got->data(0).size()) != want) {
    s = absl::UnavailableError(absl::StrCat("reading ", r.box.ToString(), " of '", r.tensor,
                                            "' from rank ", r.holder, ": a wrong answer"));
  } else {
    r.data = std::move(*got->mutable_data(0));  // Each slot is written by its own answer only.
  }
  absl::Status failed;
  {
    absl::MutexLock lock(&op->mu);
    if (!s.ok() && op->status.ok()) op->status = s;
    if (--op->pending > 0) return;
    failed = op->status;
  }
  if (!failed.ok()) return Abort(op, failed);
  Write(op);
}

// ---- The worker-side path for large slices (see slice_copy.h).

// One member of a composed slice copy.
struct ComposeMember {
  size_t dst = 0;     // Index into ComposeOp::dsts.
  std::string where;  // "copies[i]", for errors.
  SliceBoxes boxes;
  Shape piece;  // The staged piece's shape: the src box's (src's rank).
  std::string src;
  int64_t src_version = 0;
  DType src_dtype = DType::kF32;
  // Hidden tensors: the piece read out of src on src's ranks (empty: src is staged whole), and
  // the piece on dst's ranks in dst's dtype.
  std::string extract, stage;
  Layout extract_layout, stage_layout;
  int64_t extract_version = 0, stage_version = 0;
  std::vector<size_t> extract_ranks;  // Indices into extract_layout.ranks() with chunks.
  std::vector<WorkerEndpoint> extract_to;
  std::vector<v1::ComposeBoxesResponse> extracted;
};

// One dst rank's new buffer, composed on its worker.
struct ComposeOut {
  size_t dst = 0;
  size_t rank_index = 0;
  RankChunks rc;
  WorkerEndpoint to;
  v1::ComposeBoxesRequest request;
  v1::ComposeBoxesResponse response;
};

struct ComposeOp {
  std::string id;  // Holder of every tensor and owner of the hidden ones.
  absl::Time start;
  WorkerClient* client = nullptr;
  TensorManager* tensors = nullptr;
  WorkerManager* workers = nullptr;
  PlanManager* plans = nullptr;
  std::vector<SliceCopyMember> members;
  std::vector<std::string> srcs;  // Held until every extract ran.
  std::vector<std::string> dsts_held;
  std::vector<ComposeMember> cms;
  std::vector<Dst> dsts;
  std::vector<ComposeOut> outs;
  std::vector<std::string> hidden;  // Registered so far, dropped at the end.
  PlanManager::GroupDoneCallback done;
  bool composing = false;  // Set before the dst composes go out: their buffers are dropped.
};

GroupProgress ProgressOfMembers(const std::string& id, absl::Time start,
                                const std::vector<SliceCopyMember>& members, PlanState state,
                                const std::string& error) {
  GroupProgress p;
  p.group_id = id;
  p.state = state;
  p.error = error;
  p.seconds = absl::ToDoubleSeconds(absl::Now() - start);
  for (const SliceCopyMember& m : members) {
    PlanProgress mp;
    mp.plan_id = id;
    mp.tensor = m.dst;
    mp.state = state;
    mp.error = error;
    mp.seconds = p.seconds;
    p.members.push_back(std::move(mp));
  }
  return p;
}

// A hidden tensor of `layout` owned by the op: made ready without buffers (its first version is
// never read) or, with `checksums`, over buffers the workers just made.
absl::Status AddHidden(ComposeOp& op, const std::string& name, DType dtype, const Layout& layout,
                       int64_t version, LayoutChecksums checksums) {
  return AddHiddenTensor(op.tensors, *op.workers, op.id, name, dtype, layout, version,
                         "slice staging layout", std::move(checksums), &op.hidden);
}

// Ends the op: drops every hidden tensor (every version on every rank), extracts never
// registered, and on failure the dsts' new buffers; releases what is still held; reports.
void FinishCompose(const std::shared_ptr<ComposeOp>& op, const absl::Status& s) {
  for (const std::string& name : op->hidden) {
    op->tensors->CancelCreate(name, op->id);
    absl::StatusOr<TensorRecord> rec = op->tensors->Remove(name, op->id);
    if (!rec.ok()) continue;
    for (const RankChunks& rc : rec->layout.ranks()) {
      absl::StatusOr<WorkerEndpoint> e = LiveEndpoint(*op->workers, rc.rank);
      if (!e.ok()) continue;
      v1::DropTensorRequest drop;
      drop.set_tensor(name);
      drop.set_version(-1);
      op->client->DropTensor(*e, drop, [](const absl::Status&) {});
    }
  }
  for (const ComposeMember& m : op->cms) {
    if (m.extract.empty() ||
        std::find(op->hidden.begin(), op->hidden.end(), m.extract) != op->hidden.end()) {
      continue;
    }
    for (const WorkerEndpoint& e : m.extract_to) {
      v1::DropTensorRequest drop;
      drop.set_tensor(m.extract);
      drop.set_version(-1);
      op->client->DropTensor(e, drop, [](const absl::Status&) {});
    }
  }
  if (!s.ok() && op->composing) {
    for (const ComposeOut& o : op->outs) {
      v1::DropTensorRequest drop;
      drop.set_tensor(op->dsts[o.dst].rec.name);
      drop.set_version(op->dsts[o.dst].version);
      op->client->DropTensor(o.to, drop, [](const absl::Status&) {});
    }
  }
  Release(op->tensors, op->srcs, op->id);
  Release(op->tensors, op->dsts_held, op->id);
  if (op->done == nullptr) return;  // Refused in Start: the caller hears it from the return.
  if (!s.ok()) {
    const std::string error = absl::StrCat("slice copy ", op->id, ": ", s.message());
    return op->done(absl::AbortedError(error),
                    ProgressOfMembers(op->id, op->start, op->members, PlanState::kAborted, error));
  }
  op->done(absl::OkStatus(),
           ProgressOfMembers(op->id, op->start, op->members, PlanState::kCommitted, ""));
}

// Step 4: every dst rank composed; all dsts commit together, then their old versions go.
void CommitComposed(const std::shared_ptr<ComposeOp>& op) {
  for (ComposeOut& o : op->outs) {
    ChunkChecksums sums;
    absl::StatusOr<RankChunks> got = RankChunksFromProto(o.response.chunks(), "chunks", &sums);
    if (!got.ok() || got->chunks != o.rc.chunks || sums.size() != o.rc.chunks.size()) {
      return FinishCompose(op, absl::InternalError(absl::StrCat(
                                   Describe(o.to), " answered ComposeBoxes with other chunks")));
    }
    op->dsts[o.dst].checksums[o.rank_index] = std::move(sums);
  }
  std::vector<TensorManager::CommitItem> items = CommitItems(op->dsts, op->id);
  if (absl::Status s = op->tensors->CommitAll(std::move(items)); !s.ok()) {
    return FinishCompose(op, s);
  }
  op->dsts_held.clear();  // Ended by the commit.
  for (const ComposeOut& o : op->outs) {
    v1::DropTensorRequest drop;
    drop.set_tensor(op->dsts[o.dst].rec.name);
    drop.set_version(op->dsts[o.dst].rec.version);
    op->client->DropTensor(o.to, drop, [](const absl::Status&) {});
  }
  FinishCompose(op, absl::OkStatus());
}

// Step 3: the pieces are staged on dst's ranks; every dst rank composes its new buffer from its
// old one (where the members leave parts of it) and the staged pieces at their offsets.
void ComposeDsts(const std::shared_ptr<ComposeOp>& op) {
  for (ComposeMember& m : op->cms) {
    absl::StatusOr<TensorRecord> stage = op->tensors->Get(m.stage, op->id);
    if (!stage.ok()) return FinishCompose(op, stage.status());
    m.stage_version = stage->version;
  }
  for (ComposeOut& o : op->outs) {
    const Dst& d = op->dsts[o.dst];
    v1::ComposeBoxesRequest& req = o.request;
    req.set_out_tensor(d.rec.name);
    req.set_out_version(d.version);
    req.set_out_dtype(DTypeToProto(d.rec.dtype));
    *req.mutable_out_chunks() = RankChunksToProto(o.rc);
    // The old buffer only where the members leave part of a chunk (their boxes never overlap).
    bool base = false;
    for (const Chunk& c : o.rc.chunks) {
      int64_t covered = 0;
      for (const ComposeMember& m : op->cms) {
        if (m.dst == o.dst) covered += c.box.Intersect(m.boxes.dst).Volume();
      }
      base = base || covered < c.box.Volume();
    }
    if (base) {
      v1::ComposeInput* in = req.add_inputs();
      in->set_tensor(d.rec.name);
      in->set_version(d.rec.version);
      for (size_t k = 0; k < d.rec.shape.size(); ++k) in->add_offset(0);
    }
    for (const ComposeMember& m : op->cms) {
      if (m.dst != o.dst || m.stage_layout.ranks()[o.rank_index].chunks.empty()) continue;
      v1::ComposeInput* in = req.add_inputs();
      in->set_tensor(m.stage);
      in->set_version(m.stage_version);
      const Shape& at = m.boxes.dst.offset();
      for (size_t k = at.size(); k < m.piece.size(); ++k) in->add_offset(0);
      for (int64_t x : at) in->add_offset(x);
    }
  }
  op->composing = true;
  auto fan = FanIn::Start(op->outs.size(), [op](absl::Status s) {
    if (!s.ok()) return FinishCompose(op, s);
    CommitComposed(op);
  });
  for (size_t i = 0; i < op->outs.size(); ++i) {
    ComposeOut* o = &op->outs[i];  // op owns the outs and outlives every call.
    op->client->ComposeBoxes(
        o->to, o->request, [fan, o](absl::StatusOr<v1::ComposeBoxesResponse> r) {
          if (r.ok()) o->response = *std::move(r);
          fan->Report(r.ok() ? absl::OkStatus()
                             : absl::Status(r.status().code(),
                                            absl::StrCat("ComposeBoxes on ", Describe(o->to), ": ",
                                                         r.status().message())));
        });
  }
}

// Step 2: every member's piece (src, or its extract) copied into its staging tensor on dst's
// ranks, cast to dst's dtype, as one group.
void StagePieces(const std::shared_ptr<ComposeOp>& op) {
  for (ComposeMember& m : op->cms) {
    if (m.extract.empty()) continue;
    LayoutChecksums sums(m.extract_layout.ranks().size());
    for (size_t j = 0; j < sums.size(); ++j)
      sums[j].assign(m.extract_layout.ranks()[j].chunks.size(), 0);
    for (size_t k = 0; k < m.extract_ranks.size(); ++k) {
      const size_t j = m.extract_ranks[k];
      ChunkChecksums got;
      absl::StatusOr<RankChunks> chunks =
          RankChunksFromProto(m.extracted[k].chunks(), "chunks", &got);
      if (!chunks.ok() || chunks->chunks != m.extract_layout.ranks()[j].chunks) {
        return FinishCompose(
            op, absl::InternalError(absl::StrCat(Describe(m.extract_to[k]),
                                                 " answered ComposeBoxes with other chunks")));
      }
      sums[j] = std::move(got);
    }
    absl::Status s = AddHidden(*op, m.extract, m.src_dtype, m.extract_layout, m.extract_version,
                               std::move(sums));
    if (!s.ok()) return FinishCompose(op, s);
  }
  // The group acquires what it reads: the srcs are no longer held here.
  Release(op->tensors, op->srcs, op->id);
  op->srcs.clear();
  std::vector<LoadMember> members;
  for (size_t i = 0; i < op->cms.size(); ++i) {
    const ComposeMember& m = op->cms[i];
    LoadMember lm;
    lm.staging = m.extract.empty() ? m.src : m.extract;
    lm.into = m.stage;
    lm.keep_hidden = true;
    lm.where = absl::StrCat("copies[", i, "].src");
    members.push_back(std::move(lm));
  }
  auto join = std::make_shared<StartEndJoin<absl::Status>>([op](absl::Status end) {
    if (!end.ok()) return FinishCompose(op, end);
    ComposeDsts(op);
  });
  absl::StatusOr<StartedGroup> group = op->plans->LoadGroup(
      op->id, members, [join](const absl::Status& st, const GroupProgress&) { join->Ended(st); });
  if (!group.ok()) return FinishCompose(op, group.status());
  join->Started();
}

// Step 1: every member that reads a box of src (or shares its src with an earlier member) has
// the box read out on src's ranks into a hidden tensor of its own.
void ExtractPieces(const std::shared_ptr<ComposeOp>& op) {
  size_t calls = 0;
  for (ComposeMember& m : op->cms) calls += m.extract_ranks.size();
  auto fan = FanIn::Start(calls, [op](absl::Status s) {
    if (!s.ok()) return FinishCompose(op, s);
    StagePieces(op);
  });
  for (ComposeMember& m : op->cms) {
    m.extracted.resize(m.extract_ranks.size());
    for (size_t k = 0; k < m.extract_ranks.size(); ++k) {
      v1::ComposeBoxesRequest req;
      req.set_out_tensor(m.extract);
      req.set_out_version(m.extract_version);
      req.set_out_dtype(DTypeToProto(m.src_dtype));
      *req.mutable_out_chunks() = RankChunksToProto(m.extract_layout.ranks()[m.extract_ranks[k]]);
      v1::ComposeInput* in = req.add_inputs();
      in->set_tensor(m.src);
      in->set_version(m.src_version);
      for (int64_t x : m.boxes.src.offset()) in->add_offset(-x);
      ComposeMember* member = &m;  // op owns the members and outlives every call.
      op->client->ComposeBoxes(
          m.extract_to[k], req, [fan, member, k](absl::StatusOr<v1::ComposeBoxesResponse> r) {
            if (r.ok()) member->extracted[k] = *std::move(r);
            fan->Report(r.ok() ? absl::OkStatus()
                               : absl::Status(r.status().code(),
                                              absl::StrCat(member->where, ".src: ComposeBoxes on ",
                                                           Describe(member->extract_to[k]), ": ",
                                                           r.status().message())));
          });
    }
  }
}

}  // namespace

bool AnySliced(const std::vector<SliceCopyMember>& members) {
  for (const SliceCopyMember& m : members) {
    if (m.sliced()) return true;
  }
  return false;
}

absl::StatusOr<StartedGroup> SliceCopier::Start(const std::vector<SliceCopyMember>& members,
                                                const std::string& field,
                                                PlanManager::GroupDoneCallback done) {
  if (members.empty()) return field_status::Bad(field, "empty");
  // Who names each tensor first, for errors; srcs and dsts may repeat, but not cross.
  std::map<std::string, std::string> first_field;
  std::vector<std::string> order;
  std::set<std::string> srcs, dsts;
  for (size_t i = 0; i < members.size(); ++i) {
    const std::string fi = Index(field, static_cast<int64_t>(i));
    const SliceCopyMember& m = members[i];
    if (m.src.empty()) return field_status::Bad(Sub(fi, "src"), "empty");
    if (m.dst.empty()) return field_status::Bad(Sub(fi, "dst"), "empty");
    if (dsts.count(m.src) > 0 || m.src == m.dst) {
      return field_status::Bad(Sub(fi, "src"), "tensor '", m.src, "' is also a dst of this group");
    }
    if (srcs.count(m.dst) > 0) {
      return field_status::Bad(Sub(fi, "dst"), "tensor '", m.dst, "' is also a src of this group");
    }
    srcs.insert(m.src);
    dsts.insert(m.dst);
    for (const auto& [name, f] :
         {std::pair(m.src, Sub(fi, "src")), std::pair(m.dst, Sub(fi, "dst"))}) {
      if (first_field.emplace(name, f).second) order.push_back(name);
    }
  }
  auto op = std::make_shared<SliceOp>();
  {
    absl::MutexLock lock(&mu_);
    if (!closed_.empty()) return absl::UnavailableError(closed_);
    op->id = absl::StrCat("slice-copy-", next_id_++);
  }
  op->start = absl::Now();
  op->client = client_;
  op->tensors = tensors_;
  op->members = members;
  // Counted as running from its first call out (below) until `done` returned.
  op->done = [this, done = std::move(done)](const absl::Status& s, const GroupProgress& p) {
    done(s, p);
    absl::MutexLock lock(&mu_);
    --running_;
  };
  std::map<std::string, TensorRecord> recs;
  for (const std::string& name : order) {
    absl::StatusOr<TensorRecord> rec = tensors_->Acquire(name, op->id);
    if (!rec.ok()) {
      Release(tensors_, op->acquired, op->id);
      return Prefixed(first_field[name], rec.status());
    }
    op->acquired.push_back(name);
    recs[name] = *std::move(rec);
  }
  // From here on every refusal releases what it acquired.
  auto refuse = [&](absl::Status s) {
    Release(tensors_, op->acquired, op->id);
    return s;
  };
  std::vector<SliceMember> slices;
  for (const SliceCopyMember& m : members) {
    SliceMember s;
    s.src = m.src;
    s.dst = m.dst;
    s.src_shape = recs[m.src].shape;
    s.dst_shape = recs[m.dst].shape;
    s.dst_offset = m.dst_offset;
    s.src_offset = m.src_offset;
    s.src_box_shape = m.src_shape;
    slices.push_back(std::move(s));
  }
  absl::StatusOr<std::vector<SliceBoxes>> boxes = ResolveSlices(slices, field);
  if (!boxes.ok()) return refuse(boxes.status());
  const LivenessFn live = [this](int64_t rank, int64_t incarnation) {
    return workers_->IsLive(rank, incarnation);
  };
  // Live src layouts and the replica to read each chunk from.
  std::map<std::string, std::vector<BandSource>> sources;
  std::map<std::string, Layout> live_layouts;
  for (size_t i = 0; i < members.size(); ++i) {
    const std::string fi = Index(field, static_cast<int64_t>(i));
    const TensorRecord& src = recs[members[i].src];
    const TensorRecord& dst = recs[members[i].dst];
    if (absl::Status s = CheckCast(src.dtype, dst.dtype); !s.ok()) {
      return refuse(Prefixed(Sub(fi, "dst"), s));
    }
    for (const TensorRecord* t : {&src, &dst}) {
      if (t->attached || t->layout.is_partial()) {
        return refuse(absl::UnimplementedError(absl::StrCat(
            Sub(fi, t == &src ? "src" : "dst"), ": tensor '", t->name, "' is ",
            t->attached ? "attached" : "Partial", "; slice copies do not take such tensors yet")));
      }
    }
    if (sources.count(src.name) > 0) continue;
    absl::StatusOr<Layout> l = LiveLayout(src, live);
    if (!l.ok()) return refuse(Prefixed(Sub(fi, "src"), l.status()));
    sources[src.name] = ChooseSources(*l, [](int64_t) { return true; });
    live_layouts[src.name] = *std::move(l);
  }
  // Any rank buffer over the relay's bound: the worker-side path (with a plan manager).
  bool large = false;
  for (const auto& [name, rec] : recs) {
    for (const RankChunks& rc : rec.layout.ranks()) {
      large = large || rc.local_elements * ElementSize(rec.dtype) > kMaxRelayMaxBytes;
    }
  }
  large = large && plans_ != nullptr;
  // Every dst, in first-appearance order, with its members.
  std::map<std::string, size_t> dst_index;
  std::vector<std::vector<size_t>> writers;
  for (size_t i = 0; i < members.size(); ++i) {
    auto [it, added] = dst_index.emplace(members[i].dst, op->dsts.size());
    if (added) {
      Dst d;
      d.rec = recs[members[i].dst];
      d.version = tensors_->NewVersion();
      d.checksums.resize(d.rec.layout.ranks().size());
      op->dsts.push_back(std::move(d));
      writers.emplace_back();
    }
    writers[it->second].push_back(i);
  }
  std::map<int64_t, WorkerEndpoint> endpoints;
  auto endpoint = [&](int64_t rank) -> absl::StatusOr<WorkerEndpoint> {
    auto it = endpoints.find(rank);
    if (it != endpoints.end()) return it->second;
    absl::StatusOr<WorkerRecord> w = workers_->GetByRank(rank);
    if (!w.ok()) return w.status();
    return endpoints[rank] = w->Endpoint();
  };
  for (size_t di = 0; di < op->dsts.size(); ++di) {
    const TensorRecord& d = op->dsts[di].rec;
    const std::string fi = Index(field, static_cast<int64_t>(writers[di][0]));
    const int64_t es = ElementSize(d.dtype);
    for (size_t ri = 0; ri < d.layout.ranks().size(); ++ri) {
      const RankChunks& rc = d.layout.ranks()[ri];
      auto inc = d.incarnations.find(rc.rank);
      if (inc == d.incarnations.end() || !live(rc.rank, inc->second)) {
        return refuse(absl::FailedPreconditionError(
            absl::StrCat(Sub(fi, "dst"), ": rank ", rc.rank, " of tensor '", d.name,
                         "' holds no live buffer; repair or recreate it first")));
      }
      if (!large && rc.local_elements * es > kMaxRelayMaxBytes) {
        return refuse(absl::UnimplementedError(
            absl::StrCat(Sub(fi, "dst"), ": rank ", rc.rank, " of tensor '", d.name, "' holds ",
                         rc.local_elements * es, " bytes; slice copies move at most ",
                         kMaxRelayMaxBytes, " bytes per rank buffer yet")));
      }
      absl::StatusOr<WorkerEndpoint> to = endpoint(rc.rank);
      if (!to.ok()) return refuse(Prefixed(Sub(fi, "dst"), to.status()));
      const size_t out = op->outs.size();
      op->outs.push_back(Out{di, ri, rc, *to});
      for (size_t ci = 0; ci < rc.chunks.size(); ++ci) {
        const Chunk& c = rc.chunks[ci];
        int64_t covered = 0;
        for (size_t i : writers[di]) {
          const SliceBoxes& b = (*boxes)[i];
          const Box region = c.box.Intersect(b.dst);
          if (region.Empty()) continue;
          covered += region.Volume();
          const Box want = MapBox(region, b.dst, b.src);
          const TensorRecord& src = recs[members[i].src];
          for (const BandSource& from : sources[src.name]) {
            const Box piece = want.Intersect(from.box);
            if (piece.Empty()) continue;
            // A wider src dtype reads more bytes than the dst buffer holds: a worker answers
            // ReadBoxes of at most kMaxRelayMaxBytes.
            if (!large && piece.Volume() * ElementSize(src.dtype) > kMaxRelayMaxBytes) {
              return refuse(absl::UnimplementedError(absl::StrCat(
                  Sub(Index(field, static_cast<int64_t>(i)), "src"), ": a piece ", piece.ToString(),
                  " of tensor '", src.name, "' holds ", piece.Volume() * ElementSize(src.dtype),
                  " bytes; slice copies move at most ", kMaxRelayMaxBytes,
                  " bytes per piece yet")));
            }
            absl::StatusOr<WorkerEndpoint> holder = endpoint(from.rank);
            if (!holder.ok()) {
              return refuse(
                  Prefixed(Sub(Index(field, static_cast<int64_t>(i)), "src"), holder.status()));
            }
            Read r;
            r.holder = from.rank;
            r.tensor = src.name;
            r.version = src.version;
            r.dtype = src.dtype;
            r.box = piece;
            r.out = out;
            r.chunk = ci;
            r.at = MapBox(piece, b.src, b.dst);
            op->reads.push_back(std::move(r));
          }
        }
        if (covered < c.box.Volume()) {
          Read r;
          r.holder = rc.rank;
          r.tensor = d.name;
          r.version = d.version;
          r.dtype = d.dtype;
          r.box = c.box;
          r.out = out;
          r.chunk = ci;
          r.at = c.box;
          r.base = true;
          op->reads.push_back(std::move(r));
        }
      }
    }
  }
  StartedGroup started;
  started.id = op->id;
  for (const SliceCopyMember& m : members) {
    const Dst& d = op->dsts[dst_index[m.dst]];
    StartedPlan p;
    p.id = op->id;
    p.tensor = m.dst;
    p.target_version = d.version;
    p.progress.plan_id = op->id;
    p.progress.tensor = m.dst;
    started.members.push_back(std::move(p));
  }
  if (large) {
    auto cop = std::make_shared<ComposeOp>();
    cop->id = op->id;
    cop->start = op->start;
    cop->client = client_;
    cop->tensors = tensors_;
    cop->workers = workers_;
    cop->plans = plans_;
    cop->members = members;
    for (const std::string& name : op->acquired) {
      (dsts.count(name) > 0 ? cop->dsts_held : cop->srcs).push_back(name);
    }
    cop->dsts = op->dsts;
    for (const Out& o : op->outs) cop->outs.push_back(ComposeOut{o.dst, o.rank_index, o.rc, o.to});
    // Hidden tensors' names never meet buffers an earlier coordinator left on a worker.
    const std::string prefix = absl::StrCat("~", op->id, ".", tensors_->NewVersion(), "/");
    std::set<std::string> staged_whole;
    absl::Status s;
    for (size_t i = 0; i < members.size() && s.ok(); ++i) {
      const std::string fi = Index(field, static_cast<int64_t>(i));
      ComposeMember m;
      m.dst = dst_index[members[i].dst];
      m.where = fi;
      m.boxes = (*boxes)[i];
      m.piece = m.boxes.src.shape();
      const TensorRecord& src = recs[members[i].src];
      m.src = src.name;
      m.src_version = src.version;
      m.src_dtype = src.dtype;
      m.stage = absl::StrCat(prefix, i, "/stage");
      absl::StatusOr<Layout> stage =
          RestrictLayout(cop->dsts[m.dst].rec.layout, m.boxes.dst, m.piece);
      if (!stage.ok()) {
        s = Prefixed(Sub(fi, "dst"), stage.status());
        break;
      }
      m.stage_layout = *std::move(stage);
      // A box of src, or a src an earlier member stages already (a group reads each tensor
      // once): read out on src's ranks first.
      if (m.boxes.sliced_src || !staged_whole.insert(src.name).second) {
        m.extract = absl::StrCat(prefix, i, "/extract");
        m.extract_version = tensors_->NewVersion();
        absl::StatusOr<Layout> ex = RestrictLayout(live_layouts[src.name], m.boxes.src, m.piece);
        if (!ex.ok()) {
          s = Prefixed(Sub(fi, "src"), ex.status());
          break;
        }
        m.extract_layout = *std::move(ex);
        for (size_t j = 0; j < m.extract_layout.ranks().size() && s.ok(); ++j) {
          if (m.extract_layout.ranks()[j].chunks.empty()) continue;
          absl::StatusOr<WorkerEndpoint> e = endpoint(m.extract_layout.ranks()[j].rank);
          if (!e.ok()) {
            s = Prefixed(Sub(fi, "src"), e.status());
            break;
          }
          m.extract_ranks.push_back(j);
          m.extract_to.push_back(*e);
        }
      }
      cop->cms.push_back(std::move(m));
    }
    for (size_t i = 0; i < cop->cms.size() && s.ok(); ++i) {
      const ComposeMember& m = cop->cms[i];
      s = AddHidden(*cop, m.stage, cop->dsts[m.dst].rec.dtype, m.stage_layout,
                    tensors_->NewVersion(), {});
    }
    if (!s.ok()) {
      FinishCompose(cop, s);  // `done` is not set yet: drops and releases only.
      return s;
    }
    cop->done = std::move(op->done);
    // What the staging moves between ranks: the staged pieces less what a rank already holds
    // of its piece (src's own chunks, or the box read out on that rank), in the dtype the
    // staging plan sends (the narrower of src's and dst's). `started`'s members
    // are as above: the same id and dst versions.
    for (const ComposeMember& m : cop->cms) {
      const Layout& from = m.extract.empty() ? live_layouts[m.src] : m.extract_layout;
      std::map<int64_t, std::vector<Box>> held;
      for (const RankChunks& rc : from.ranks()) {
        for (const Chunk& c : rc.chunks) held[rc.rank].push_back(c.box);
      }
      for (const RankChunks& rc : m.stage_layout.ranks()) {
        for (const Chunk& c : rc.chunks) {
          int64_t moved = c.box.Volume();
          for (const Box& h : held[rc.rank]) moved -= c.box.Intersect(h).Volume();
          started.bytes_moved +=
              moved * ElementSize(WireDType(m.src_dtype, cop->dsts[m.dst].rec.dtype));
        }
      }
    }
    {
      absl::MutexLock lock(&mu_);
      ++running_;
    }
    ExtractPieces(cop);
    return started;
  }
  std::vector<std::pair<WorkerEndpoint, v1::ReadBoxesRequest>> calls;
  for (const Read& r : op->reads) {
    v1::ReadBoxesRequest req;
    req.set_tensor(r.tensor);
    req.set_version(r.version);
    *req.add_boxes() = BoxToProto(r.box);
    calls.emplace_back(endpoints.at(r.holder), std::move(req));
    started.bytes_moved += r.box.Volume() * ElementSize(r.dtype);
  }
  {
    absl::MutexLock lock(&mu_);
    ++running_;
  }
  {
    absl::MutexLock lock(&op->mu);
    op->pending = calls.size();
  }
  if (calls.empty()) {
    Write(op);
    return started;
  }
  for (size_t i = 0; i < calls.size(); ++i) {
    client_->ReadBoxes(
        calls[i].first, calls[i].second,
        [op, i](absl::StatusOr<v1::ReadBoxesResponse> got) { OnRead(op, i, std::move(got)); });
  }
  return started;
}

void SliceCopier::Close(const std::string& reason) {
  absl::MutexLock lock(&mu_);
  closed_ = reason.empty() ? "closed" : reason;
}

bool SliceCopier::AwaitIdle(absl::Time deadline) {
  absl::MutexLock lock(&mu_);
  auto idle = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return running_ == 0; };
  return mu_.AwaitWithDeadline(absl::Condition(&idle), deadline);
}

int64_t SliceCopier::RunningCount() const {
  absl::MutexLock lock(&mu_);
  return running_;
}

}  // namespace shardcoord
