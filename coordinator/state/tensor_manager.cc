#include "coordinator/state/tensor_manager.h"

#include <algorithm>
#include <cassert>
#include <map>
#include <set>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/hash/hash.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "coordinator/state/tensor_manager_internal.h"
#include "proto/shardcoord.pb.h"
#include "sharding/limits.h"

namespace shardcoord {
namespace internal_tensor_manager {

std::string SerializeTensor(const TensorRecord& t) {
  v1::StoredTensor out;
  v1::TensorInfo* info = out.mutable_info();
  info->set_name(t.name);
  for (int64_t d : t.shape) info->add_shape(d);
  info->set_dtype(DTypeToProto(t.dtype));
  info->set_mesh(t.mesh);
  info->set_spec(t.spec);
  *info->mutable_layout() = LayoutToProto(t.layout, &t.checksums);
  info->set_version(t.version);
  info->set_bytes(t.bytes());
  info->set_attached(t.attached);
  for (int64_t r : t.unattached) info->add_unattached_ranks(r);
  std::map<int64_t, int64_t> holders(t.incarnations.begin(), t.incarnations.end());
  for (const auto& [rank, incarnation] : holders) {
    out.add_holder_ranks(rank);
    out.add_holder_incarnations(incarnation);
  }
  return out.SerializeAsString();
}

}  // namespace internal_tensor_manager

namespace {

using internal_tensor_manager::kTensorKind;
using internal_tensor_manager::SerializeTensor;

constexpr char kCounterKind[] = "counter";
constexpr char kVersionCounter[] = "tensor_version";
// Versions are stored as used in blocks, so a plan does not cost a store write.
constexpr int64_t kVersionBlock = 1024;

// The layouts of the records a Load parses, interned: a model's 10^5 tensors have a few
// thousand distinct layouts, and each is built and checked once and its representation shared
// (a layout of a 10^3-rank mesh is 10^3 rank entries: built per tensor, a restart would take
// minutes and twice the memory). Keyed by every field of the proto but the checksums (each
// record's own).
class LayoutInterner {
 public:
  // `proto` as a Layout (LayoutFromProto's errors) and its checksums.
  absl::StatusOr<Layout> Intern(const v1::Layout& proto, LayoutChecksums* checksums) {
    key_.clear();
    checksums->clear();
    checksums->reserve(proto.ranks_size());
    Add(proto.global_shape());
    key_.push_back(proto.num_partials());
    key_.push_back(static_cast<int64_t>(proto.partial_op()));
    key_.push_back(proto.ranks_size());
    for (const v1::RankChunks& rc : proto.ranks()) {
      key_.push_back(rc.rank());
      key_.push_back(rc.local_elements());
      Add(rc.coord());
      key_.push_back(rc.chunks_size());
      ChunkChecksums& sums = checksums->emplace_back();
      sums.reserve(rc.chunks_size());
      for (const v1::Chunk& c : rc.chunks()) {
        Add(c.box().offset());
        Add(c.box().shape());
        key_.push_back(c.local_offset());
        key_.push_back(c.partial_index());
        sums.push_back(c.checksum());
      }
    }
    std::vector<std::pair<std::vector<int64_t>, Layout>>& same = by_hash_[absl::HashOf(key_)];
    for (const auto& [key, layout] : same) {
      if (key == key_) return layout;
    }
    absl::StatusOr<Layout> layout = LayoutFromProto(proto, "layout");
    if (!layout.ok()) return layout.status();
    same.emplace_back(key_, *layout);
    return layout;
  }

 private:
  void Add(const google::protobuf::RepeatedField<int64_t>& values) {
    key_.push_back(values.size());
    key_.insert(key_.end(), values.begin(), values.end());
  }

  std::vector<int64_t> key_;  // The last proto's.
  absl::flat_hash_map<size_t, std::vector<std::pair<std::vector<int64_t>, Layout>>> by_hash_;
};

absl::StatusOr<TensorRecord> ParseTensor(const StateRecord& r, LayoutInterner* layouts) {
  v1::StoredTensor in;
  auto bad = [&r](absl::string_view why) {
    return absl::InternalError(
        absl::StrCat("state store: bad tensor record '", r.name, "': ", why));
  };
  if (!in.ParseFromString(r.value) || in.info().name() != r.name) return bad("does not parse");
  if (in.holder_ranks_size() != in.holder_incarnations_size()) return bad("holders");
  TensorRecord t;
  t.name = r.name;
  t.shape.assign(in.info().shape().begin(), in.info().shape().end());
  absl::StatusOr<DType> dtype = DTypeFromProto(in.info().dtype());
  if (!dtype.ok()) return bad(dtype.status().message());
  t.dtype = *dtype;
  t.mesh = in.info().mesh();
  t.spec = in.info().spec();
  absl::StatusOr<Layout> layout = layouts->Intern(in.info().layout(), &t.checksums);
  if (!layout.ok()) return bad(layout.status().message());
  t.layout = *std::move(layout);
  t.version = in.info().version();
  t.attached = in.info().attached();
  t.unattached.insert(in.info().unattached_ranks().begin(), in.info().unattached_ranks().end());
  for (int i = 0; i < in.holder_ranks_size(); ++i) {
    t.incarnations[in.holder_ranks(i)] = in.holder_incarnations(i);
  }
  t.ready = true;
  return t;
}

// How a held buffer matches `rank`'s committed chunks of a tensor.
enum class Match {
  kNo,
  kYes,  // Chunks and checksums (but for an attached tensor, whose bytes its process owns).
  // The chunks, where the record does not know their checksums (a prepared transfer's dst,
  // written by a run whose checksums only the workers keep): the buffer's may be taken.
  kChecksumsUnknown,
};

bool ChecksumsUnknown(const TensorRecord& t, size_t index) {
  if (index >= t.checksums.size()) return true;
  for (uint64_t c : t.checksums[index]) {
    if (c != 0) return false;
  }
  return true;
}

// `*index`: the rank's index in the layout.
Match MatchCommitted(const TensorRecord& t, int64_t rank, const HeldBuffer& held, size_t* index) {
  if (held.version != t.version) return Match::kNo;
  const std::vector<RankChunks>& ranks = t.layout.ranks();
  for (size_t i = 0; i < ranks.size(); ++i) {
    if (ranks[i].rank != rank) continue;
    if (held.chunks.chunks != ranks[i].chunks) return Match::kNo;
    if (t.attached) return Match::kYes;
    if (i < t.checksums.size() && held.checksums == t.checksums[i]) return Match::kYes;
    *index = i;
    return ChecksumsUnknown(t, i) && held.checksums.size() == ranks[i].chunks.size()
               ? Match::kChecksumsUnknown
               : Match::kNo;
  }
  return Match::kNo;
}

// False when a replica of a chunk of layout rank `index` whose checksum `t` knows (non-zero)
// has another one than `checksums` gives it.
bool ReplicasAgree(const TensorRecord& t, size_t index, const ChunkChecksums& checksums) {
  const std::vector<RankChunks>& ranks = t.layout.ranks();
  const std::vector<Chunk>& mine = ranks[index].chunks;
  for (size_t i = 0; i < ranks.size() && i < t.checksums.size(); ++i) {
    if (i == index) continue;
    for (size_t j = 0; j < ranks[i].chunks.size() && j < t.checksums[i].size(); ++j) {
      const uint64_t known = t.checksums[i][j];
      if (known == 0) continue;
      for (size_t k = 0; k < mine.size(); ++k) {
        if (mine[k].box == ranks[i].chunks[j].box &&
            mine[k].partial_index == ranks[i].chunks[j].partial_index && checksums[k] != known) {
          return false;
        }
      }
    }
  }
  return true;
}

}  // namespace

absl::Status TensorManager::Persist(const TensorRecord& t) const {
  if (store_ == nullptr || !t.owner.empty()) return absl::OkStatus();  // Hidden: never stored.
  return store_->Put(kTensorKind, t.name, SerializeTensor(t));
}

absl::Status TensorManager::RecoveringError(const TensorRecord& t) {
  return absl::UnavailableError(absl::StrCat(
      "tensor '", t.name, "' is being recovered after a coordinator restart (waiting for rank",
      t.awaiting.size() > 1 ? "s " : " ", absl::StrJoin(t.awaiting, ", "),
      " to register again); retry shortly"));
}

absl::Status TensorManager::CheckVisible(const TensorRecord* t, absl::string_view name,
                                         const std::string& owner) {
  if (t == nullptr || !t->ready || (!t->owner.empty() && t->owner != owner)) {
    return absl::NotFoundError(absl::StrCat("unknown tensor '", name, "'"));
  }
  if (t->recovering) return RecoveringError(*t);
  return absl::OkStatus();
}

absl::Status TensorManager::Load(const LivenessFn& was_live) {
  if (store_ == nullptr) return absl::OkStatus();
  // The version counter, then the tensors: only this manager's kinds are read.
  absl::StatusOr<std::vector<StateRecord>> records = store_->LoadKinds({kCounterKind, kTensorKind});
  if (!records.ok()) return records.status();
  std::vector<std::pair<std::string, std::string>> users;  // (mesh, tensor)
  LayoutInterner layouts;
  {
    absl::MutexLock lock(&mu_);
    for (const StateRecord& r : *records) {
      if (r.kind == kCounterKind && r.name == kVersionCounter) {
        int64_t v = 0;
        if (!absl::SimpleAtoi(r.value, &v)) {
          return absl::InternalError("state store: bad tensor_version counter");
        }
        last_version_ = std::max(last_version_, v);
        continue;
      }
      if (r.kind != kTensorKind) continue;
      absl::StatusOr<TensorRecord> t = ParseTensor(r, &layouts);
      if (!t.ok()) return t.status();
      last_version_ = std::max(last_version_, t->version);
      for (const RankChunks& rc : t->layout.ranks()) {
        auto inc = t->incarnations.find(rc.rank);
        if (inc != t->incarnations.end() && was_live(rc.rank, inc->second)) {
          t->awaiting.insert(rc.rank);
        }
      }
      t->recovering = !t->awaiting.empty();
      if (!t->mesh.empty()) users.emplace_back(t->mesh, t->name);
      PutLocked(*std::move(t), "");
    }
    reserved_versions_ = last_version_;
    version_floor_ = last_version_;
  }
  for (const auto& [mesh, tensor] : users) {
    if (absl::Status s = meshes_->AddUser(mesh, tensor); !s.ok()) {
      return absl::InternalError(
          absl::StrCat("state store: tensor '", tensor, "' uses mesh '", mesh, "': ", s.message()));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<std::pair<std::string, int64_t>>> TensorManager::Reconcile(
    int64_t rank, int64_t incarnation, const std::vector<HeldBuffer>& held) {
  std::vector<std::pair<std::string, int64_t>> drop;
  absl::MutexLock lock(&mu_);
  std::map<std::string, TensorRecord> changed;
  auto next = [&](const TensorRecord& t) -> TensorRecord& {
    auto it = changed.find(t.name);
    if (it == changed.end()) it = changed.emplace(t.name, t).first;
    return it->second;
  };
  for (const HeldBuffer& h : held) {
    auto it = tensors_.find(h.tensor);
    if (it == tensors_.end()) {
      drop.emplace_back(h.tensor, h.version);
      continue;
    }
    FoldLocked(it->second);  // A transfer's dst at the version its last run gave it.
    const TensorRecord& t = it->second;
    // The buffer is the rank's committed chunks. Where the record does not know their
    // checksums the buffer's become the record's, unless a replica it knows disagrees.
    auto matches = [&]() {
      size_t index = 0;
      switch (MatchCommitted(t, rank, h, &index)) {
        case Match::kNo:
          return false;
        case Match::kYes:
          return true;
        case Match::kChecksumsUnknown:
          break;
      }
      auto seen = changed.find(t.name);
      if (!ReplicasAgree(seen == changed.end() ? t : seen->second, index, h.checksums)) {
        return false;
      }
      TensorRecord& n = next(t);
      if (n.checksums.size() < n.layout.ranks().size()) n.checksums.resize(n.layout.ranks().size());
      n.checksums[index] = h.checksums;
      return true;
    };
    const bool busy = !BusyWithLocked(t).empty();
    if (t.recovering) {
      if (t.awaiting.count(rank) && matches()) {
        next(t).incarnations[rank] = incarnation;
      } else {
        drop.emplace_back(h.tensor, h.version);
      }
    } else if (t.attached && !t.unattached.count(rank) && matches()) {
      // A lent buffer the worker still holds: its process is still attached, whatever
      // happened to the worker's registration.
      next(t).incarnations[rank] = incarnation;
    } else if (h.version == t.version && !busy && matches()) {
      // A worker declared dead (a host cut off) that kept its buffers and registered again:
      // its committed chunks, checksums unchanged, count again. Only while no plan runs on
      // the tensor, whose commit would not drop this worker's copy of the old version.
      auto holder = t.incarnations.find(rank);
      if (holder == t.incarnations.end() || holder->second != incarnation) {
        next(t).incarnations[rank] = incarnation;
      }
    } else if (h.version != t.version && (h.version <= version_floor_ || !busy)) {
      // Never committed before the restart, or left by a plan of the worker's previous
      // incarnation (no operation runs on the tensor, so no other version is in use).
      drop.emplace_back(h.tensor, h.version);
    }
  }
  // The rank has registered: whatever it did not report of a recovering tensor is lost.
  for (const auto& [name, t] : tensors_) {
    if (t.recovering && t.awaiting.count(rank)) next(t).awaiting.erase(rank);
  }
  StateBatch batch;
  for (auto& [name, t] : changed) {
    t.recovering = !t.awaiting.empty();
    if (t.owner.empty()) batch.Put(kTensorKind, name, SerializeTensor(t));
  }
  if (store_ != nullptr) {
    if (absl::Status s = store_->Apply(batch); !s.ok()) return s;
  }
  for (auto& [name, t] : changed) {
    PutLocked(std::move(t), "was reconciled with a registering worker's buffers");
  }
  return drop;
}

void TensorManager::EndRecovery() {
  absl::MutexLock lock(&mu_);
  for (auto& [name, t] : tensors_) {
    if (!t.recovering) continue;
    t.recovering = false;
    t.awaiting.clear();
  }
}

std::vector<std::string> TensorManager::Recovering() const {
  absl::MutexLock lock(&mu_);
  std::vector<std::string> out;
  for (const auto& [name, t] : tensors_) {
    if (t.recovering) out.push_back(name);
  }
  return out;
}

int64_t TensorRecord::bytes() const {
  absl::StatusOr<int64_t> b = CheckedBytes(shape, ElementSize(dtype));
  return b.ok() ? *b : -1;
}

std::string LostChunk::ToString() const {
  std::string s = box.ToString();
  if (partial_index != 0) absl::StrAppend(&s, " (partial ", partial_index, ")");
  absl::StrAppend(&s, " on rank", ranks.size() > 1 ? "s " : " ", absl::StrJoin(ranks, ", "));
  return s;
}

std::vector<LostChunk> LostChunks(const TensorRecord& tensor, const LivenessFn& live) {
  struct Holders {
    bool any_live = false;
    std::vector<int64_t> dead;
    size_t order = 0;
  };
  std::map<std::pair<Box, int64_t>, Holders> chunks;
  for (const RankChunks& rc : tensor.layout.ranks()) {
    auto inc = tensor.incarnations.find(rc.rank);
    const bool alive = inc != tensor.incarnations.end() && !tensor.unattached.count(rc.rank) &&
                       live(rc.rank, inc->second);
    for (const Chunk& c : rc.chunks) {
      if (c.box.Empty()) continue;
      auto [it, inserted] = chunks.try_emplace({c.box, c.partial_index});
      if (inserted) it->second.order = chunks.size();
      if (alive) {
        it->second.any_live = true;
      } else {
        it->second.dead.push_back(rc.rank);
      }
    }
  }
  std::vector<std::pair<size_t, LostChunk>> lost;
  for (auto& [key, h] : chunks) {
    if (h.any_live) continue;
    lost.push_back({h.order, LostChunk{key.first, key.second, std::move(h.dead)}});
  }
  std::sort(lost.begin(), lost.end(),
            [](const auto& a, const auto& b) { return a.first < b.first; });
  std::vector<LostChunk> out;
  for (auto& [order, c] : lost) out.push_back(std::move(c));
  return out;
}

absl::StatusOr<Layout> LiveLayout(const TensorRecord& tensor, const LivenessFn& live) {
  std::vector<RankChunks> ranks;
  bool all_live = true;
  for (const RankChunks& rc : tensor.layout.ranks()) {
    auto inc = tensor.incarnations.find(rc.rank);
    if (inc != tensor.incarnations.end() && !tensor.unattached.count(rc.rank) &&
        live(rc.rank, inc->second)) {
      ranks.push_back(rc);
    } else {
      all_live = false;
    }
  }
  if (all_live) return tensor.layout;
  std::vector<LostChunk> lost = LostChunks(tensor, live);
  if (!lost.empty()) {
    std::vector<std::string> names;
    bool unattached = tensor.attached;
    for (const LostChunk& c : lost) {
      names.push_back(c.ToString());
      for (int64_t r : c.ranks) unattached &= tensor.unattached.count(r) > 0;
    }
    if (unattached) {
      return absl::FailedPreconditionError(absl::StrCat(
          "tensor '", tensor.name, "' misses ", lost.size(), " chunk", lost.size() > 1 ? "s" : "",
          " whose ranks have no buffer attached: ", absl::StrJoin(names, "; "),
          " (attach them first)"));
    }
    return absl::FailedPreconditionError(absl::StrCat(
        "tensor '", tensor.name, "' lost ", lost.size(), " chunk", lost.size() > 1 ? "s" : "",
        " with no live replica: ", absl::StrJoin(names, "; ")));
  }
  absl::StatusOr<Layout> out = Layout::FromChunks(
      tensor.shape, std::move(ranks), tensor.layout.num_partials(), tensor.layout.partial_op());
  if (!out.ok()) {
    return absl::InternalError(absl::StrCat("live replicas of '", tensor.name,
                                            "' do not form a layout: ", out.status().message()));
  }
  return out;
}

absl::Status CheckReplicaChecksums(const Layout& layout, const LayoutChecksums& checksums,
                                   const std::function<std::string(int64_t rank)>& describe) {
  std::map<std::pair<Box, int64_t>, std::pair<uint64_t, int64_t>> first;
  for (size_t i = 0; i < layout.ranks().size() && i < checksums.size(); ++i) {
    const RankChunks& rc = layout.ranks()[i];
    for (size_t j = 0; j < rc.chunks.size() && j < checksums[i].size(); ++j) {
      const Chunk& c = rc.chunks[j];
      if (c.box.Empty()) continue;
      auto [it, inserted] = first.try_emplace({c.box, c.partial_index}, checksums[i][j], rc.rank);
      if (!inserted && it->second.first != checksums[i][j]) {
        return absl::DataLossError(absl::StrFormat(
            "replicas of chunk %s%s disagree: checksum %016x on %s but %016x on %s",
            c.box.ToString(),
            c.partial_index ? absl::StrCat(" (partial ", c.partial_index, ")") : "",
            it->second.first, describe(it->second.second), checksums[i][j], describe(rc.rank)));
      }
    }
  }
  return absl::OkStatus();
}

int64_t TensorManager::NewVersion() {
  absl::MutexLock lock(&mu_);
  ++last_version_;
  if (store_ != nullptr && last_version_ > reserved_versions_) {
    // Best effort: a failed write only risks reusing versions after a restart, which
    // Reconcile's drops and the workers' ALREADY_EXISTS checks then catch.
    if (store_->Put(kCounterKind, kVersionCounter, absl::StrCat(last_version_ + kVersionBlock - 1))
            .ok()) {
      reserved_versions_ = last_version_ + kVersionBlock - 1;
    }
  }
  return last_version_;
}

absl::Status TensorManager::Reserve(TensorRecord record, const std::string& holder) {
  if (!record.mesh.empty()) {
    if (absl::Status s = meshes_->AddUser(record.mesh, record.name); !s.ok()) return s;
  }
  const std::string mesh = record.mesh, name = record.name;
  {
    absl::MutexLock lock(&mu_);
    if (tensors_.find(name) == tensors_.end()) {
      record.ready = false;
      record.busy_plan = holder;
      PutLocked(std::move(record), "is being created");
      return absl::OkStatus();
    }
  }
  if (!mesh.empty()) meshes_->RemoveUser(mesh, name);
  return absl::AlreadyExistsError(absl::StrCat("tensor '", name, "' already exists"));
}

absl::Status TensorManager::FinishCreate(absl::string_view name, const std::string& holder,
                                         LayoutChecksums checksums,
                                         absl::flat_hash_map<int64_t, int64_t> incarnations) {
  absl::MutexLock lock(&mu_);
  auto it = tensors_.find(name);
  if (it == tensors_.end() || it->second.ready || it->second.busy_plan != holder) {
    return absl::FailedPreconditionError(
        absl::StrCat("tensor '", name, "' is not being created by ", holder));
  }
  TensorRecord next = it->second;
  next.ready = true;
  next.busy_plan.clear();
  next.checksums = std::move(checksums);
  next.incarnations = std::move(incarnations);
  if (absl::Status s = Persist(next); !s.ok()) return s;
  PutLocked(std::move(next), "was created");
  return absl::OkStatus();
}

void TensorManager::CancelCreate(absl::string_view name, const std::string& holder) {
  std::string mesh;
  {
    absl::MutexLock lock(&mu_);
    auto it = tensors_.find(name);
    if (it == tensors_.end() || it->second.ready || it->second.busy_plan != holder) return;
    mesh = it->second.mesh;
    EraseLocked(it, "was not created");
  }
  if (!mesh.empty()) meshes_->RemoveUser(mesh, name);
}

absl::StatusOr<TensorRecord> TensorManager::Acquire(absl::string_view name,
                                                    const std::string& holder,
                                                    const std::string& target_mesh,
                                                    const std::string& owner) {
  TensorRecord out;
  {
    absl::MutexLock lock(&mu_);
    auto it = tensors_.find(name);
    if (it != tensors_.end() && !it->second.owner.empty() && it->second.owner != owner) {
      return absl::NotFoundError(absl::StrCat("unknown tensor '", name, "'"));
    }
    if (it == tensors_.end() || !it->second.ready) {
      if (it != tensors_.end()) {
        return absl::AbortedError(absl::StrCat("tensor '", name, "' is busy being created"));
      }
      return absl::NotFoundError(absl::StrCat("unknown tensor '", name, "'"));
    }
    if (it->second.recovering) return RecoveringError(it->second);
    if (std::string busy = BusyWithLocked(it->second); !busy.empty()) {
      return absl::AbortedError(absl::StrCat("tensor '", name, "' is busy with ", busy));
    }
    FoldLocked(it->second);
    it->second.busy_plan = holder;
    HeldLocked(it->first, true);
    out = it->second;
  }
  if (!target_mesh.empty()) {
    if (absl::Status s = meshes_->AddUser(target_mesh, name); !s.ok()) {
      Release(name, holder);
      return s;
    }
  }
  return out;
}

void TensorManager::Release(absl::string_view name, const std::string& holder,
                            const std::string& target_mesh) {
  {
    absl::MutexLock lock(&mu_);
    auto it = tensors_.find(name);
    if (it == tensors_.end() || it->second.busy_plan != holder) return;
    it->second.busy_plan.clear();
    HeldLocked(it->first, false);
  }
  if (!target_mesh.empty()) meshes_->RemoveUser(target_mesh, name);
}

absl::Status TensorManager::Commit(absl::string_view name, const std::string& holder,
                                   NewState state) {
  std::vector<CommitItem> items;
  items.push_back(CommitItem{std::string(name), holder, std::move(state)});
  return CommitAll(std::move(items));
}

absl::Status TensorManager::CommitAll(std::vector<CommitItem> items) {
  std::vector<std::pair<std::string, std::string>> old_meshes;  // (mesh, tensor)
  {
    absl::MutexLock lock(&mu_);
    std::vector<TensorRecord> next;
    next.reserve(items.size());
    for (CommitItem& item : items) {
      auto it = tensors_.find(item.name);
      if (it == tensors_.end() || it->second.busy_plan != item.holder) {
        return absl::FailedPreconditionError(
            absl::StrCat("tensor '", item.name, "' is not held by ", item.holder));
      }
      TensorRecord t = it->second;
      NewState& state = item.state;
      t.mesh = std::move(state.mesh);
      t.spec = std::move(state.spec);
      t.layout = std::move(state.layout);
      t.checksums = std::move(state.checksums);
      t.version = state.version;
      t.incarnations = std::move(state.incarnations);
      t.attached = state.attached;
      if (state.publish) t.owner.clear();
      if (state.dtype.has_value()) t.dtype = *state.dtype;
      if (!t.attached) t.unattached.clear();
      // Still attached: a rank detached while the plan committed stays unattached.
      for (int64_t r : t.unattached) t.incarnations.erase(r);
      t.busy_plan.clear();
      next.push_back(std::move(t));
    }
    // The commit is acknowledged only once stored, every tensor in one batch; otherwise the
    // plans abort and the old versions stay authoritative (the tensors stay held until their
    // plans release them).
    if (store_ != nullptr) {
      StateBatch batch;
      for (const TensorRecord& t : next) {
        if (t.owner.empty()) batch.Put(kTensorKind, t.name, SerializeTensor(t));
      }
      if (absl::Status s = store_->Apply(batch); !s.ok()) return s;
    }
    for (size_t i = 0; i < next.size(); ++i) {
      old_meshes.emplace_back(tensors_.find(next[i].name)->second.mesh, next[i].name);
      PutLocked(std::move(next[i]), absl::StrCat("was committed by ", items[i].holder));
    }
  }
  // Each tensor now uses its target mesh (counted at Acquire) instead of the old one.
  for (const auto& [mesh, name] : old_meshes) {
    if (!mesh.empty()) meshes_->RemoveUser(mesh, name);
  }
  return absl::OkStatus();
}

absl::Status TensorManager::PublishAll(const std::vector<std::string>& names,
                                       const std::string& owner) {
  if (owner.empty()) return absl::InvalidArgumentError("owner: empty");
  absl::MutexLock lock(&mu_);
  std::vector<TensorRecord> next;
  next.reserve(names.size());
  for (const std::string& name : names) {
    auto it = tensors_.find(name);
    if (it == tensors_.end() || !it->second.ready || it->second.owner != owner ||
        !it->second.busy_plan.empty()) {
      return absl::FailedPreconditionError(
          absl::StrCat("tensor '", name, "' is not a ready, idle tensor hidden by ", owner));
    }
    next.push_back(it->second);
    next.back().owner.clear();
  }
  if (store_ != nullptr) {
    StateBatch batch;
    for (const TensorRecord& t : next) batch.Put(kTensorKind, t.name, SerializeTensor(t));
    if (absl::Status s = store_->Apply(batch); !s.ok()) return s;
  }
  for (TensorRecord& t : next) PutLocked(std::move(t), "was published");
  return absl::OkStatus();
}

absl::Status TensorManager::UpdateRank(absl::string_view name, const std::string& holder,
                                       int64_t rank, ChunkChecksums checksums,
                                       int64_t incarnation) {
  absl::MutexLock lock(&mu_);
  auto it = tensors_.find(name);
  if (it == tensors_.end() || it->second.busy_plan != holder) {
    return absl::FailedPreconditionError(
        absl::StrCat("tensor '", name, "' is not held by ", holder));
  }
  FoldLocked(it->second);
  TensorRecord t = it->second;
  if (t.attached) {
    return absl::FailedPreconditionError(absl::StrCat(
        "tensor '", name, "' is attached: write rank ", rank, "'s buffer in its own process"));
  }
  const std::vector<RankChunks>& ranks = t.layout.ranks();
  for (size_t i = 0; i < ranks.size(); ++i) {
    if (ranks[i].rank != rank) continue;
    if (checksums.size() != ranks[i].chunks.size()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "rank ", rank, " holds ", ranks[i].chunks.size(), " chunks, not ", checksums.size()));
    }
    if (t.checksums.size() != ranks.size()) t.checksums.resize(ranks.size());
    t.checksums[i] = std::move(checksums);
    t.incarnations[rank] = incarnation;
    if (absl::Status s = Persist(t); !s.ok()) return s;
    PutLocked(std::move(t), absl::StrCat("was written by ", holder));
    return absl::OkStatus();
  }
  return absl::NotFoundError(absl::StrCat("rank ", rank, " holds nothing of '", name, "'"));
}

absl::StatusOr<size_t> TensorManager::CheckAttachLocked(const TensorRecord& cur, int64_t rank,
                                                        int64_t incarnation,
                                                        std::optional<int64_t> version, DType dtype,
                                                        const RankChunks* chunks,
                                                        std::optional<int64_t> bytes) const {
  const std::string& name = cur.name;
  if (cur.recovering) return RecoveringError(cur);
  if (!cur.attached) {
    return absl::FailedPreconditionError(
        absl::StrCat("tensor '", name,
                     "' is not attached: its buffers are the workers' (create it with init "
                     "ATTACHED to lend buffers)"));
  }
  if (std::string busy = BusyWithLocked(cur); !busy.empty()) {
    return absl::AbortedError(absl::StrCat("tensor '", name, "' is busy with ", busy));
  }
  if (version.has_value() && *version != cur.version) {
    return absl::AbortedError(absl::StrCat("version: tensor '", name, "' is at version ",
                                           cur.version, ", not ", *version, "; look it up again"));
  }
  if (dtype != cur.dtype) {
    return absl::InvalidArgumentError(absl::StrCat("dtype: the buffer holds ", DTypeName(dtype),
                                                   " but tensor '", name, "' is ",
                                                   DTypeName(cur.dtype)));
  }
  const std::vector<RankChunks>& ranks = cur.layout.ranks();
  size_t index = ranks.size();
  for (size_t i = 0; i < ranks.size(); ++i) {
    if (ranks[i].rank == rank) index = i;
  }
  if (index == ranks.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("rank: tensor '", name, "' has no chunks on rank ", rank));
  }
  const RankChunks& want = ranks[index];
  if (chunks != nullptr &&
      (chunks->chunks != want.chunks || chunks->local_elements != want.local_elements)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "chunks: rank ", rank, " of tensor '", name, "' holds ", want.chunks.size(), " chunks in ",
        want.local_elements, " elements, not the ", chunks->chunks.size(), " chunks in ",
        chunks->local_elements, " elements given (look the tensor up again)"));
  }
  if (bytes.has_value() && *bytes != want.local_elements * ElementSize(cur.dtype)) {
    return absl::InvalidArgumentError(
        absl::StrCat("bytes: the buffer has ", *bytes, " bytes but rank ", rank, "'s chunks of '",
                     name, "' take ", want.local_elements * ElementSize(cur.dtype), " (",
                     want.local_elements, " ", DTypeName(cur.dtype), " elements)"));
  }
  // A holder of an older incarnation of the worker is gone (the worker registered again).
  auto holder = cur.incarnations.find(rank);
  if (!cur.unattached.count(rank) && holder != cur.incarnations.end() &&
      holder->second == incarnation) {
    return absl::FailedPreconditionError(absl::StrCat("rank ", rank, " of tensor '", name,
                                                      "' is attached already (detach it first)"));
  }
  return index;
}

TensorRecord TensorManager::WithAttached(const TensorRecord& cur, int64_t rank, int64_t incarnation,
                                         size_t index) {
  TensorRecord next = cur;
  next.unattached.erase(rank);
  next.incarnations[rank] = incarnation;
  const size_t ranks = cur.layout.ranks().size();
  if (next.checksums.size() != ranks) next.checksums.resize(ranks);
  // The user process owns the bytes and changes them at will: no checksum is known.
  next.checksums[index].assign(cur.layout.ranks()[index].chunks.size(), 0);
  return next;
}

absl::StatusOr<TensorRecord> TensorManager::Attach(absl::string_view name, int64_t rank,
                                                   int64_t incarnation, int64_t version,
                                                   DType dtype, const RankChunks& chunks) {
  absl::MutexLock lock(&mu_);
  auto it = tensors_.find(name);
  if (it == tensors_.end() || !it->second.ready) {
    return absl::NotFoundError(absl::StrCat("unknown tensor '", name, "'"));
  }
  FoldLocked(it->second);
  absl::StatusOr<size_t> index =
      CheckAttachLocked(it->second, rank, incarnation, version, dtype, &chunks, std::nullopt);
  if (!index.ok()) return index.status();
  TensorRecord next = WithAttached(it->second, rank, incarnation, *index);
  if (absl::Status s = Persist(next); !s.ok()) return s;
  PutLocked(next, absl::StrCat("had rank ", rank, "'s buffer attached"));
  return next;
}

absl::StatusOr<std::vector<TensorManager::Attached>> TensorManager::AttachMany(
    int64_t rank, int64_t incarnation, const std::vector<AttachItem>& items, bool validate_only,
    const absl::flat_hash_map<int64_t, int64_t>& live) {
  if (items.empty()) return absl::InvalidArgumentError("buffers: none given");
  if (items.size() > static_cast<size_t>(kMaxAttachmentsPerRequest)) {
    return absl::InvalidArgumentError(absl::StrCat("buffers: ", items.size(), " given; at most ",
                                                   kMaxAttachmentsPerRequest, " in one request"));
  }
  auto member = [&items](size_t i, const absl::Status& s) {
    return absl::Status(s.code(),
                        absl::StrCat("buffers[", i, "] '", items[i].name, "': ", s.message()));
  };
  std::vector<Attached> out(items.size());
  absl::MutexLock lock(&mu_);
  // Checked first, all of them: nothing changes before every member passed.
  std::vector<const TensorRecord*> current(items.size());
  std::vector<size_t> indexes(items.size());
  absl::flat_hash_map<absl::string_view, size_t> seen;
  seen.reserve(items.size());
  for (size_t i = 0; i < items.size(); ++i) {
    const AttachItem& item = items[i];
    if (item.name.empty()) {
      return absl::InvalidArgumentError(absl::StrCat("buffers[", i, "]: tensor: empty"));
    }
    if (auto [at, fresh] = seen.emplace(item.name, i); !fresh) {
      return member(
          i, absl::InvalidArgumentError(absl::StrCat("tensor: also buffers[", at->second, "]")));
    }
    auto it = tensors_.find(item.name);
    if (it == tensors_.end() || !it->second.ready || !it->second.owner.empty()) {
      return member(i, absl::NotFoundError(absl::StrCat("unknown tensor '", item.name, "'")));
    }
    FoldLocked(it->second);
    absl::StatusOr<size_t> index = CheckAttachLocked(
        it->second, rank, incarnation,
        item.version == 0 ? std::nullopt : std::optional<int64_t>(item.version), item.dtype,
        item.chunks.has_value() ? &*item.chunks : nullptr, item.bytes);
    if (!index.ok()) return member(i, index.status());
    current[i] = &it->second;
    indexes[i] = *index;
    out[i].version = it->second.version;
    out[i].chunks = it->second.layout.ranks()[*index];
  }
  if (validate_only) return out;
  std::vector<TensorRecord> next;
  next.reserve(items.size());
  StateBatch batch;
  for (size_t i = 0; i < items.size(); ++i) {
    next.push_back(WithAttached(*current[i], rank, incarnation, indexes[i]));
    if (store_ != nullptr) batch.Put(kTensorKind, next.back().name, SerializeTensor(next.back()));
  }
  if (store_ != nullptr) {
    if (absl::Status s = store_->Apply(batch); !s.ok()) return s;
  }
  const LivenessFn alive = [&live](int64_t r, int64_t inc) {
    auto it = live.find(r);
    return it != live.end() && it->second == inc;
  };
  for (size_t i = 0; i < items.size(); ++i) {
    out[i].readable = LostChunks(next[i], alive).empty();
    PutLocked(std::move(next[i]), absl::StrCat("had rank ", rank, "'s buffer attached"));
  }
  return out;
}

absl::StatusOr<bool> TensorManager::Detach(absl::string_view name, int64_t rank,
                                           int64_t incarnation) {
  absl::MutexLock lock(&mu_);
  auto it = tensors_.find(name);
  if (it == tensors_.end() || !it->second.attached || it->second.unattached.count(rank)) {
    return false;
  }
  auto inc = it->second.incarnations.find(rank);
  if (inc == it->second.incarnations.end() || inc->second != incarnation) return false;
  FoldLocked(it->second);
  TensorRecord next = it->second;
  next.unattached.insert(rank);
  next.incarnations.erase(rank);
  if (absl::Status s = Persist(next); !s.ok()) return s;
  PutLocked(std::move(next), absl::StrCat("lost rank ", rank, "'s attached buffer"));
  return true;
}

absl::StatusOr<TensorRecord> TensorManager::Get(absl::string_view name,
                                                const std::string& owner) const {
  absl::MutexLock lock(&mu_);
  auto it = tensors_.find(name);
  if (absl::Status s = CheckVisible(it == tensors_.end() ? nullptr : &it->second, name, owner);
      !s.ok()) {
    return s;
  }
  TensorRecord out = it->second;
  FoldLocked(out);
  return out;
}

namespace {

// Adds `sign` x each of `t`'s committed local buffers to its holder's bytes in `held`, when
// admission counts them (ready, in the workers' own memory); holders at 0 are removed.
void AddHeld(const TensorRecord& t, int64_t sign,
             absl::flat_hash_map<std::pair<int64_t, int64_t>, int64_t>* held) {
  if (!t.ready || t.attached) return;
  const int64_t esize = ElementSize(t.dtype);
  for (const RankChunks& rc : t.layout.ranks()) {
    auto inc = t.incarnations.find(rc.rank);
    const std::pair<int64_t, int64_t> holder{rc.rank,
                                             inc == t.incarnations.end() ? -1 : inc->second};
    int64_t& bytes = (*held)[holder];
    bytes += sign * rc.local_elements * esize;
    if (bytes == 0) held->erase(holder);
  }
}

}  // namespace

void TensorManager::CountLocked(const TensorRecord& t, int64_t sign) { AddHeld(t, sign, &held_); }

void TensorManager::PutLocked(TensorRecord record, absl::string_view why) {
  auto it = tensors_.find(record.name);
  bool was_busy = false;
  if (it == tensors_.end()) {
    it = tensors_.emplace(record.name, TensorRecord{}).first;
  } else {
    was_busy = !it->second.busy_plan.empty();
    CountLocked(it->second, -1);
  }
  it->second = std::move(record);
  CountLocked(it->second, +1);
  if (members_.empty()) return;
  if (const bool busy = !it->second.busy_plan.empty(); busy != was_busy) {
    HeldLocked(it->first, busy);
  }
  TouchLocked(it->first, why);
}

void TensorManager::EraseLocked(std::map<std::string, TensorRecord, std::less<>>::iterator it,
                                absl::string_view why) {
  CountLocked(it->second, -1);
  if (!members_.empty()) {
    if (!it->second.busy_plan.empty()) HeldLocked(it->first, false);
    TouchLocked(it->first, why);
  }
  tensors_.erase(it);
}

absl::flat_hash_map<std::pair<int64_t, int64_t>, int64_t> TensorManager::RecountLocked() const {
  absl::flat_hash_map<std::pair<int64_t, int64_t>, int64_t> held;
  for (const auto& [name, t] : tensors_) AddHeld(t, +1, &held);
  return held;
}

std::vector<TensorManager::HeldBytes> TensorManager::BytesByHolder() const {
  std::vector<HeldBytes> out;
  {
    absl::MutexLock lock(&mu_);
    // Debug builds (the tests') check that every change kept the tally (PutLocked).
    assert(held_ == RecountLocked());
    out.reserve(held_.size());
    for (const auto& [holder, bytes] : held_) {
      out.push_back(HeldBytes{holder.first, holder.second, bytes});
    }
  }
  std::sort(out.begin(), out.end(), [](const HeldBytes& a, const HeldBytes& b) {
    return std::make_pair(a.rank, a.incarnation) < std::make_pair(b.rank, b.incarnation);
  });
  return out;
}

std::vector<TensorRecord> TensorManager::List() const {
  absl::MutexLock lock(&mu_);
  std::vector<TensorRecord> out;
  for (const auto& [name, t] : tensors_) {
    if (!t.ready || !t.owner.empty()) continue;
    out.push_back(t);
    FoldLocked(out.back());
  }
  return out;
}

TensorManager::Page TensorManager::ListPage(absl::string_view prefix, absl::string_view after,
                                            size_t limit) const {
  absl::MutexLock lock(&mu_);
  Page page;
  auto it =
      after.empty() || after < prefix ? tensors_.lower_bound(prefix) : tensors_.upper_bound(after);
  for (; it != tensors_.end() && absl::StartsWith(it->first, prefix); ++it) {
    const TensorRecord& t = it->second;
    if (!t.ready || !t.owner.empty()) continue;
    if (page.tensors.size() == limit) {
      page.more = true;
      break;
    }
    page.tensors.push_back(t);
    FoldLocked(page.tensors.back());
  }
  return page;
}

absl::StatusOr<std::vector<TensorRecord>> TensorManager::RemoveAll(
    const std::vector<std::string>& names, absl::string_view prefix) {
  std::vector<TensorRecord> out;
  {
    absl::MutexLock lock(&mu_);
    std::set<std::string, std::less<>> chosen;
    for (const std::string& name : names) {
      auto it = tensors_.find(name);
      if (it == tensors_.end() || !it->second.ready || !it->second.owner.empty()) {
        return absl::NotFoundError(absl::StrCat("unknown tensor '", name, "'"));
      }
      chosen.insert(name);
    }
    if (!prefix.empty()) {
      for (auto it = tensors_.lower_bound(prefix);
           it != tensors_.end() && absl::StartsWith(it->first, prefix); ++it) {
        if (it->second.ready && it->second.owner.empty()) chosen.insert(it->first);
      }
    }
    if (chosen.empty()) {
      return absl::NotFoundError(absl::StrCat("no tensor's name starts with '", prefix, "'"));
    }
    StateBatch batch;
    for (const std::string& name : chosen) {
      const TensorRecord& t = tensors_.find(name)->second;
      if (t.recovering) return RecoveringError(t);
      if (std::string busy = BusyWithLocked(t); !busy.empty()) {
        return absl::AbortedError(absl::StrCat("tensor '", name, "' is busy with ", busy));
      }
      batch.Delete(kTensorKind, name);
    }
    if (store_ != nullptr) {
      if (absl::Status s = store_->Apply(batch); !s.ok()) return s;
    }
    out.reserve(chosen.size());
    for (const std::string& name : chosen) {
      auto it = tensors_.find(name);
      out.push_back(it->second);  // EraseLocked still counts the record's bytes out.
      FoldLocked(out.back());
      EraseLocked(it, "was deleted");
    }
  }
  for (const TensorRecord& t : out) {
    if (!t.mesh.empty()) meshes_->RemoveUser(t.mesh, t.name);
  }
  return out;
}

absl::StatusOr<TensorRecord> TensorManager::Remove(absl::string_view name,
                                                   const std::string& owner) {
  TensorRecord out;
  {
    absl::MutexLock lock(&mu_);
    auto it = tensors_.find(name);
    if (absl::Status s = CheckVisible(it == tensors_.end() ? nullptr : &it->second, name, owner);
        !s.ok()) {
      return s;
    }
    if (std::string busy = BusyWithLocked(it->second); !busy.empty()) {
      return absl::AbortedError(absl::StrCat("tensor '", name, "' is busy with ", busy));
    }
    if (store_ != nullptr && it->second.owner.empty()) {
      if (absl::Status s = store_->Delete(kTensorKind, it->first); !s.ok()) return s;
    }
    out = it->second;
    FoldLocked(out);
    EraseLocked(it, "was deleted");
  }
  if (!out.mesh.empty()) meshes_->RemoveUser(out.mesh, out.name);
  return out;
}

}  // namespace shardcoord
