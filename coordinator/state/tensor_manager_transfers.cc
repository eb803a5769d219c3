// TensorManager's side of prepared transfers (issue 27): the binding that lets a run hold,
// and commit, every member at once, at a cost that does not grow with the member count.

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "coordinator/state/tensor_manager.h"
#include "coordinator/state/tensor_manager_internal.h"

namespace shardcoord {
namespace {

std::string Field(size_t i, bool src) {
  return absl::StrCat("copies[", i, "].", src ? "src" : "dst");
}

absl::Status NotBound(const std::string& transfer) {
  return absl::NotFoundError(absl::StrCat("transfer '", transfer, "' is not bound"));
}

template <typename Binding>
void EraseBinding(std::vector<Binding*>* v, const Binding* b) {
  v->erase(std::remove(v->begin(), v->end(), b), v->end());
}

}  // namespace

void TensorManager::FoldLocked(TensorRecord& t) const {
  if (members_.empty()) return;
  auto m = members_.find(t.name);
  if (m == members_.end()) return;
  for (const Binding* b : m->second.dst_of) {
    if (b->version <= t.version) continue;
    t.version = b->version;
    // The run's checksums stay with the workers (they would be members x ranks per run).
    for (ChunkChecksums& c : t.checksums) std::fill(c.begin(), c.end(), 0);
  }
}

void TensorManager::TouchLocked(absl::string_view name, absl::string_view why) {
  if (why.empty() || members_.empty()) return;
  auto m = members_.find(name);
  if (m == members_.end()) return;
  for (const std::vector<Binding*>* of : {&m->second.src_of, &m->second.dst_of}) {
    for (Binding* b : *of) {
      ++b->generation;
      b->reason = absl::StrCat("tensor '", name, "' ", why);
    }
  }
}

void TensorManager::HeldLocked(absl::string_view name, bool busy) {
  if (members_.empty()) return;
  auto m = members_.find(name);
  if (m == members_.end()) return;
  for (const std::vector<Binding*>* of : {&m->second.src_of, &m->second.dst_of}) {
    for (Binding* b : *of) {
      if (busy) {
        b->held.insert(std::string(name));
      } else {
        b->held.erase(std::string(name));
      }
    }
  }
}

std::string TensorManager::BusyWithLocked(const TensorRecord& t) const {
  if (!t.busy_plan.empty()) return t.busy_plan;
  if (members_.empty()) return "";
  auto m = members_.find(t.name);
  if (m == members_.end()) return "";
  for (const std::vector<Binding*>* of : {&m->second.src_of, &m->second.dst_of}) {
    for (const Binding* b : *of) {
      if (!b->running.empty()) {
        return absl::StrCat("transfer '", b->name, "' (run ", b->running, ")");
      }
    }
  }
  return "";
}

absl::Status TensorManager::BindTransfer(const std::string& transfer, TransferCopies copies,
                                         int64_t version) {
  absl::MutexLock lock(&mu_);
  if (bindings_.count(transfer) > 0) {
    return absl::AlreadyExistsError(absl::StrCat("transfer '", transfer, "' is bound already"));
  }
  auto owned = std::make_unique<Binding>();
  Binding* b = owned.get();
  b->name = transfer;
  b->copies = std::move(copies);
  b->version = version;
  for (const TransferCopy& c : *b->copies) {
    for (const bool src : {true, false}) {
      const std::string& name = src ? c.src : c.dst;
      Membership& m = members_[name];
      // Transfers sharing a tensor exclude each other's runs; one writing it invalidates the
      // other's preparation.
      for (const bool other_src : {true, false}) {
        for (Binding* other : other_src ? m.src_of : m.dst_of) {
          if (other == b) continue;
          b->overlaps.insert(other->name);
          other->overlaps.insert(b->name);
          if (!src) b->writes_into.insert(other->name);
          if (!other_src) other->writes_into.insert(b->name);
        }
      }
      (src ? m.src_of : m.dst_of).push_back(b);
      auto t = tensors_.find(name);
      if (t != tensors_.end() && !t->second.busy_plan.empty()) b->held.insert(name);
    }
  }
  bindings_.emplace(transfer, std::move(owned));
  return absl::OkStatus();
}

absl::Status TensorManager::UnbindTransfer(const std::string& transfer, StateBatch batch) {
  absl::MutexLock lock(&mu_);
  auto it = bindings_.find(transfer);
  if (it == bindings_.end()) return NotBound(transfer);
  Binding* b = it->second.get();
  if (!b->running.empty()) {
    return absl::AbortedError(
        absl::StrCat("transfer '", transfer, "' is running (run ", b->running, ")"));
  }
  // Each dst at a version only the binding knows keeps it in its own (stored) record.
  std::vector<TensorRecord> folded;
  for (const TransferCopy& c : *b->copies) {
    auto t = tensors_.find(c.dst);
    if (t == tensors_.end() || !t->second.ready || !t->second.owner.empty()) continue;
    TensorRecord next = t->second;
    FoldLocked(next);
    if (next.version == t->second.version) continue;
    batch.Put(internal_tensor_manager::kTensorKind, next.name,
              internal_tensor_manager::SerializeTensor(next));
    folded.push_back(std::move(next));
  }
  if (store_ != nullptr && !batch.empty()) {
    if (absl::Status s = store_->Apply(batch); !s.ok()) return s;
  }
  // In place: the layout and holders stay, so held_ does not change.
  for (TensorRecord& t : folded) {
    TensorRecord& stored = tensors_.find(t.name)->second;
    stored.version = t.version;
    stored.checksums = std::move(t.checksums);
  }
  for (const TransferCopy& c : *b->copies) {
    for (const std::string* name : {&c.src, &c.dst}) {
      auto m = members_.find(*name);
      if (m == members_.end()) continue;
      EraseBinding(&m->second.src_of, b);
      EraseBinding(&m->second.dst_of, b);
      if (m->second.src_of.empty() && m->second.dst_of.empty()) members_.erase(m);
    }
  }
  for (const std::string& other : b->overlaps) {
    auto o = bindings_.find(other);
    if (o == bindings_.end()) continue;
    o->second->overlaps.erase(transfer);
    o->second->writes_into.erase(transfer);
  }
  bindings_.erase(it);
  return absl::OkStatus();
}

absl::StatusOr<TransferSnapshot> TensorManager::SnapshotTransfer(
    const std::string& transfer, const std::vector<int64_t>& live) const {
  absl::MutexLock lock(&mu_);
  auto it = bindings_.find(transfer);
  if (it == bindings_.end()) return NotBound(transfer);
  const Binding& b = *it->second;
  TransferSnapshot out;
  out.generation = b.generation;
  out.src.reserve(b.copies->size());
  out.dst.reserve(b.copies->size());
  for (size_t i = 0; i < b.copies->size(); ++i) {
    const TransferCopy& c = (*b.copies)[i];
    for (const bool src : {true, false}) {
      const std::string& name = src ? c.src : c.dst;
      auto t = tensors_.find(name);
      if (t == tensors_.end() || !t->second.owner.empty()) {
        return absl::NotFoundError(absl::StrCat(Field(i, src), ": unknown tensor '", name, "'"));
      }
      const TensorRecord& r = t->second;
      if (!r.ready) {
        return absl::AbortedError(
            absl::StrCat(Field(i, src), ": tensor '", name, "' is busy being created"));
      }
      if (r.recovering) {
        return absl::UnavailableError(
            absl::StrCat(Field(i, src), ": ", RecoveringError(r).message()));
      }
      if (std::string busy = BusyWithLocked(r); !busy.empty()) {
        return absl::AbortedError(
            absl::StrCat(Field(i, src), ": tensor '", name, "' is busy with ", busy));
      }
      TransferSide& s = (src ? out.src : out.dst).emplace_back();
      s.version = r.version;
      if (!src) {
        for (const Binding* d : members_.at(name).dst_of)
          s.version = std::max(s.version, d->version);
      }
      s.dtype = r.dtype;
      s.shape = r.shape;
      s.mesh = r.mesh;
      s.spec = r.spec;
      s.attached = r.attached;
      // As LiveLayout: a rank counts while its holder is the live incarnation.
      for (const RankChunks& rc : r.layout.ranks()) {
        auto inc = r.incarnations.find(rc.rank);
        const bool unattached = r.unattached.count(rc.rank) > 0;
        const bool alive = inc != r.incarnations.end() && !unattached && rc.rank >= 0 &&
                           rc.rank < static_cast<int64_t>(live.size()) &&
                           live[rc.rank] == inc->second;
        if (alive) continue;
        s.dropped.push_back(rc.rank);
        if (unattached) s.unattached.push_back(rc.rank);
      }
    }
  }
  return out;
}

absl::StatusOr<TransferBindingState> TensorManager::TransferState(
    const std::string& transfer) const {
  absl::MutexLock lock(&mu_);
  auto it = bindings_.find(transfer);
  if (it == bindings_.end()) return NotBound(transfer);
  const Binding& b = *it->second;
  return TransferBindingState{b.generation, b.reason, b.version, b.running};
}

absl::Status TensorManager::StartTransferRun(const std::string& transfer, const std::string& run_id,
                                             int64_t generation, std::string* stale) {
  stale->clear();
  absl::MutexLock lock(&mu_);
  auto it = bindings_.find(transfer);
  if (it == bindings_.end()) return NotBound(transfer);
  Binding& b = *it->second;
  if (!b.running.empty()) {
    return absl::AbortedError(
        absl::StrCat("transfer '", transfer, "' is already running (run ", b.running, ")"));
  }
  // O(1) in the members: the held set and the other transfers, never the members.
  if (!b.held.empty()) {
    const std::string& name = *b.held.begin();
    auto t = tensors_.find(name);
    return absl::AbortedError(
        absl::StrCat("tensor '", name, "' (a member of transfer '", transfer, "') is busy with ",
                     t == tensors_.end() ? std::string("another operation") : t->second.busy_plan));
  }
  for (const std::string& other : b.overlaps) {
    auto o = bindings_.find(other);
    if (o != bindings_.end() && !o->second->running.empty()) {
      return absl::AbortedError(absl::StrCat("transfer '", transfer,
                                             "' shares tensors with transfer '", other,
                                             "', which is running (run ", o->second->running, ")"));
    }
  }
  if (b.generation != generation) {
    *stale = b.reason.empty() ? "its members changed" : b.reason;
    return absl::OkStatus();
  }
  b.running = run_id;
  return absl::OkStatus();
}

absl::Status TensorManager::CommitTransferRun(const std::string& transfer,
                                              const TransferCommit& commit) {
  absl::MutexLock lock(&mu_);
  auto it = bindings_.find(transfer);
  if (it == bindings_.end() || it->second->running != commit.run_id) {
    return absl::FailedPreconditionError(
        absl::StrCat("transfer '", transfer, "' is not held by run ", commit.run_id));
  }
  Binding& b = *it->second;
  // The repaired dsts at the run's version, held by its participants.
  std::vector<TensorRecord> repaired;
  for (const std::string& name : commit.repaired) {
    auto t = tensors_.find(name);
    if (t == tensors_.end()) continue;
    TensorRecord next = t->second;
    next.version = commit.version;
    for (ChunkChecksums& c : next.checksums) std::fill(c.begin(), c.end(), 0);
    for (const RankChunks& rc : next.layout.ranks()) {
      if (auto inc = commit.incarnations.find(rc.rank); inc != commit.incarnations.end()) {
        next.incarnations[rc.rank] = inc->second;
      }
    }
    repaired.push_back(std::move(next));
  }
  // The run's one durable write (with the repaired dsts, when there are); under the lock, so
  // no reader sees the dsts' new version before it is stored.
  if (store_ != nullptr) {
    StateBatch batch;
    batch.Put(commit.record.kind, commit.record.name, commit.record.value);
    for (const TensorRecord& t : repaired) {
      batch.Put(internal_tensor_manager::kTensorKind, t.name,
                internal_tensor_manager::SerializeTensor(t));
    }
    if (absl::Status s = store_->Apply(batch); !s.ok()) return s;
  }
  for (TensorRecord& t : repaired) {
    // In place, not PutLocked: the run's own write does not invalidate its transfer.
    TensorRecord& stored = tensors_.find(t.name)->second;
    CountLocked(stored, -1);
    stored = std::move(t);
    CountLocked(stored, +1);
  }
  b.version = commit.version;
  b.running.clear();
  for (const std::string& other : b.writes_into) {
    auto o = bindings_.find(other);
    if (o == bindings_.end()) continue;
    ++o->second->generation;
    o->second->reason =
        absl::StrCat("transfer '", transfer, "' (run ", commit.run_id, ") wrote tensors it shares");
  }
  return absl::OkStatus();
}

void TensorManager::EndTransferRun(const std::string& transfer, const std::string& run_id) {
  absl::MutexLock lock(&mu_);
  auto it = bindings_.find(transfer);
  if (it != bindings_.end() && it->second->running == run_id) it->second->running.clear();
}

}  // namespace shardcoord
