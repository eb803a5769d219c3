#include "worker/control/transfer_runner.h"

#include <algorithm>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "proto/convert.h"
#include "sharding/transfer_table.h"
#include "worker/plans/fragment.h"

namespace shardcoord {

uint64_t TransferDigest(const Fragment& fragment,
                        const std::vector<std::vector<uint64_t>>& checksums) {
  StableHash h;
  bool any = false;
  for (size_t i = 0; i < fragment.members.size() && i < checksums.size(); ++i) {
    if (fragment.shape_of(i).target.chunks.empty()) continue;
    any = true;
    h.Add(static_cast<uint64_t>(fragment.members[i].index));
    for (uint64_t c : checksums[i]) h.Add(c);
  }
  return any ? h.value() : 0;
}

// A table being paged in.
struct TransferRunner::Pending {
  TransferTable table;
  int32_t next_page = 1;
  // Page 0's.
  std::vector<int64_t> ranks;
  std::vector<int64_t> incarnations;
  int64_t step_timeout_ms = 0;
};

// One prepared transfer's part on this rank. Its fragment serves every run and is never
// copied (10^4-10^5 members): Begin sets the run's fields and versions in it for the one run
// that holds it, and that run holds it until both its part ended and its FinishPlan came (or
// the transfer is forgotten). Nothing else writes it, so the run's thread and FinishPlan
// read it without this lock.
class TransferRunner::Resident {
 public:
  Resident(std::string id, RankTransfer part)
      : id_(std::move(id)),
        bytes_sent_(part.bytes_sent),
        bytes_received_(part.bytes_received),
        fragment_(std::make_shared<Fragment>(std::move(part.fragment))),
        prepared_timeout_ms_(fragment_->step_timeout_ms) {
    attached_.reserve(fragment_->members.size());
    versions_.reserve(fragment_->members.size());
    for (const FragmentMember& m : fragment_->members) {
      attached_.push_back(m.attached_target_version > 0);
      versions_.push_back(m.target_version);  // The dst's version when prepared.
    }
  }

  const std::string& id() const { return id_; }
  int64_t rank() const { return fragment_->rank; }  // Never changed by a run.
  int64_t bytes_sent() const { return bytes_sent_; }
  int64_t bytes_received() const { return bytes_received_; }
  std::shared_ptr<const Fragment> fragment() const { return fragment_; }
  // The fused exchange's schedule, kept across runs: Begin changes no member's transfers.
  GroupScheduleCache* schedule_cache() { return &schedule_cache_; }

  // Holds the fragment for `request`'s run and makes it that run's: plan id, bucket, prefix,
  // step timeout, and every member's target version (attached dsts read in place at their
  // current version). ABORTED while another run holds it.
  absl::Status Begin(const v1::RunTransferWorkerRequest& request) {
    absl::MutexLock lock(&mu_);
    if (!run_id_.empty()) {
      return absl::AbortedError(
          absl::StrCat("transfer ", id_, " is held by its run ", run_id_,
                       ended_ ? ", which ended and awaits its FinishPlan" : ", which still runs",
                       " (one run at a time)"));
    }
    if (request.rank() != rank()) {
      return absl::FailedPreconditionError(
          absl::StrCat("rank: ", request.rank(), " but transfer ", id_,
                       " was prepared on this worker as rank ", rank()));
    }
    Fragment& f = *fragment_;
    const int64_t version = request.version();
    for (size_t i = 0; i < f.members.size(); ++i) {
      if (versions_[i] == version) {
        return absl::InvalidArgumentError(absl::StrCat(
            "version: ", version, " is already the version of member ", f.members[i].index,
            "'s dst '", f.members[i].target_tensor, "' (a run writes a new one)"));
      }
    }
    f.plan_id = request.run_id();
    f.bucket_bytes = request.bucket_bytes();
    f.communicator_prefix = request.communicator_prefix();
    f.step_timeout_ms =
        request.step_timeout_ms() > 0 ? request.step_timeout_ms() : prepared_timeout_ms_;
    for (size_t i = 0; i < f.members.size(); ++i) {
      FragmentMember& m = f.members[i];
      m.target_version = version;
      m.attached_target_version = attached_[i] ? versions_[i] : 0;
    }
    run_id_ = request.run_id();
    run_version_ = version;
    ended_ = false;
    finished_ = false;
    return absl::OkStatus();
  }

  // The run's part ended (its thread no longer reads the fragment).
  void Ended(const std::string& run_id) {
    absl::MutexLock lock(&mu_);
    if (run_id != run_id_) return;
    ended_ = true;
    if (finished_) run_id_.clear();
  }

  // A commit of `run_id`: every member moves to the run's version. Returns the members whose
  // previous version is to be dropped, with that version (the caller drops them before
  // Finished: the run still holds the fragment).
  std::vector<std::pair<size_t, int64_t>> Commit(const std::string& run_id) {
    std::vector<std::pair<size_t, int64_t>> old;
    absl::MutexLock lock(&mu_);
    if (run_id != run_id_ || finished_) return old;
    old.reserve(versions_.size());
    for (size_t i = 0; i < versions_.size(); ++i) {
      if (versions_[i] != run_version_) old.emplace_back(i, versions_[i]);
      versions_[i] = run_version_;
    }
    return old;
  }

  // FinishPlan(run_id) ended the run.
  void Finished(const std::string& run_id) {
    absl::MutexLock lock(&mu_);
    if (run_id != run_id_) return;
    finished_ = true;
    if (ended_) run_id_.clear();
  }

  // WorkerCore refused to start the run: nothing holds the fragment.
  void Release(const std::string& run_id) {
    absl::MutexLock lock(&mu_);
    if (run_id == run_id_) run_id_.clear();
  }

 private:
  const std::string id_;
  const int64_t bytes_sent_;
  const int64_t bytes_received_;
  const std::shared_ptr<Fragment> fragment_;
  const int64_t prepared_timeout_ms_;
  std::vector<bool> attached_;  // Per member: its dst's lent buffer is written in place.
  GroupScheduleCache schedule_cache_;

  absl::Mutex mu_;
  // Per member: its dst's version on this rank (the table's, then each committed run's).
  std::vector<int64_t> versions_ ABSL_GUARDED_BY(mu_);
  std::string run_id_ ABSL_GUARDED_BY(mu_);  // The run holding the fragment; empty: none.
  int64_t run_version_ ABSL_GUARDED_BY(mu_) = 0;
  bool ended_ ABSL_GUARDED_BY(mu_) = false;
  bool finished_ ABSL_GUARDED_BY(mu_) = false;
};

TransferRunner::TransferRunner(WorkerCore* core, BufferStore* buffers,
                               std::function<WorkerIdentity()> identity,
                               std::function<void(absl::string_view)> log)
    : core_(core), buffers_(buffers), identity_(std::move(identity)), log_(std::move(log)) {}

TransferRunner::~TransferRunner() = default;

absl::StatusOr<v1::PrepareTransferResponse> TransferRunner::Prepare(
    const v1::PrepareTransferRequest& page) {
  if (absl::Status s = core_->CheckAccepting(); !s.ok()) return s;
  const std::string& id = page.transfer_id();
  if (id.empty()) return absl::InvalidArgumentError("transfer_id: empty");
  const int32_t number = page.page();
  if (number < 0) return absl::InvalidArgumentError(absl::StrCat("page: ", number));
  std::unique_ptr<Pending> pending;
  if (number == 0) {
    if (page.ranks_size() != page.incarnations_size()) {
      return absl::InvalidArgumentError(absl::StrCat("incarnations: ", page.incarnations_size(),
                                                     " for ", page.ranks_size(), " ranks"));
    }
    pending = std::make_unique<Pending>();
    pending->ranks.assign(page.ranks().begin(), page.ranks().end());
    pending->incarnations.assign(page.incarnations().begin(), page.incarnations().end());
    pending->step_timeout_ms = page.step_timeout_ms();
    std::unique_ptr<Pending> restarted;  // Page 0 starts the table again.
    absl::MutexLock lock(&mu_);
    if (auto it = pending_.find(id); it != pending_.end()) {
      restarted = std::move(it->second);
      pending_.erase(it);
    }
  } else {
    // Out of the map while the page is parsed; out for good when the page is refused.
    absl::MutexLock lock(&mu_);
    auto it = pending_.find(id);
    if (it == pending_.end()) {
      return absl::InvalidArgumentError(absl::StrCat("page: ", number, " of transfer ", id,
                                                     " follows no page ", number - 1,
                                                     " here (send page 0 first)"));
    }
    const int32_t expected = it->second->next_page;
    if (expected != number) {
      pending_.erase(it);
      return absl::InvalidArgumentError(absl::StrCat("page: ", number, " of transfer ", id,
                                                     " but page ", expected,
                                                     " comes next (send page 0 again)"));
    }
    pending = std::move(it->second);
    pending_.erase(it);
  }
  if (absl::Status s = AppendTransferPage(page, &pending->table); !s.ok()) return s;
  if (!page.last()) {
    pending->next_page = number + 1;
    absl::MutexLock lock(&mu_);
    // A page 0 that came meanwhile started the table again: it wins.
    pending_.try_emplace(id, std::move(pending));
    return v1::PrepareTransferResponse();
  }
  return Expand(id, *pending);
}

absl::StatusOr<v1::PrepareTransferResponse> TransferRunner::Expand(const std::string& id,
                                                                   const Pending& pending) {
  const WorkerIdentity me = identity_();
  ExpandOptions options;
  options.transfer_id = id;
  options.step_timeout_ms = pending.step_timeout_ms;
  options.incarnations.reserve(pending.ranks.size());
  for (size_t i = 0; i < pending.ranks.size(); ++i) {
    options.incarnations[pending.ranks[i]] = pending.incarnations[i];
  }
  auto listed = options.incarnations.find(me.rank);
  if (listed == options.incarnations.end()) {
    return absl::FailedPreconditionError(
        absl::StrCat("ranks: rank ", me.rank, " (worker ", me.name,
                     ") is not among the participants of transfer ", id));
  }
  if (listed->second != me.incarnation) {
    return absl::FailedPreconditionError(absl::StrCat(
        "incarnations: transfer ", id, " was prepared for incarnation ", listed->second,
        " of rank ", me.rank, ", but worker ", me.name, " is incarnation ", me.incarnation,
        " (it registered again: prepare the transfer again)"));
  }
  const absl::Time start = absl::Now();
  absl::StatusOr<RankTransfer> part = ExpandTransfer(pending.table, me.rank, options);
  if (!part.ok()) return part.status();  // The table's errors first (ValidateTransferTable).
  // A layout no member uses would make its holders exchange ranks with nothing to run (and
  // nothing to run it on): refused.
  std::vector<bool> used(pending.table.layouts.size(), false);
  for (const TransferMemberSpec& m : pending.table.members) {
    used[m.src_layout] = true;  // In range: validated.
    used[m.dst_layout] = true;
  }
  if (auto unused = std::find(used.begin(), used.end(), false); unused != used.end()) {
    return absl::InvalidArgumentError(absl::StrCat("layouts[", unused - used.begin(),
                                                   "]: no member of transfer ", id, " uses it"));
  }
  if (absl::Status s = ValidateFragment(part->fragment); !s.ok()) return s;
  if (absl::Status s = CheckSources(id, part->fragment); !s.ok()) return s;

  const Fragment& f = part->fragment;
  v1::PrepareTransferResponse out;
  out.set_members(static_cast<int64_t>(f.members.size()));
  out.set_shapes(static_cast<int64_t>(f.shapes.size()));
  out.set_bytes_sent(part->bytes_sent);
  out.set_bytes_received(part->bytes_received);
  out.set_target_bytes(part->target_bytes);
  out.set_replica_key(part->replica_key);
  out.set_templates(part->templates_planned);
  out.set_total_bytes_moved(part->owned_bytes_moved);
  out.set_total_lower_bound_bytes(part->owned_lower_bound_bytes);
  out.set_exchange_ranks(static_cast<int64_t>(f.exchange_ranks.size()));
  auto resident = std::make_shared<Resident>(id, *std::move(part));
  std::shared_ptr<Resident> replaced;  // Freed outside the lock.
  {
    absl::MutexLock lock(&mu_);
    std::shared_ptr<Resident>& slot = resident_[id];
    replaced = std::move(slot);
    slot = resident;
  }
  if (log_) {
    log_(absl::StrCat("transfer ", id, ": prepared on rank ", me.rank, " in ",
                      absl::FormatDuration(absl::Now() - start), ": ", out.members(), " members (",
                      out.shapes(), " shapes, ", out.templates(),
                      " templates planned), a run sends ", out.bytes_sent(), " B and receives ",
                      out.bytes_received(), " B over ", out.exchange_ranks(),
                      " exchange ranks and allocates ", out.target_bytes(), " B of targets",
                      replaced != nullptr ? " (replaced the resident one)" : ""));
  }
  return out;
}

absl::Status TransferRunner::CheckSources(const std::string& id, const Fragment& f) const {
  for (size_t i = 0; i < f.members.size(); ++i) {
    const FragmentMember& m = f.members[i];
    const FragmentShape& shape = f.shape_of(i);
    if (shape.source.chunks.empty()) continue;
    std::shared_ptr<HostBuffer> source = buffers_->Find(m.tensor, m.source_version);
    if (source == nullptr) {
      return absl::FailedPreconditionError(absl::StrCat(
          "members[", m.index, "]: rank ", f.rank, " holds no buffer of tensor '", m.tensor,
          "' version ", m.source_version, ", which transfer ", id, " reads"));
    }
    if (source->dtype() != shape.dtype || source->chunks().chunks != shape.source.chunks) {
      return absl::FailedPreconditionError(absl::StrCat(
          "members[", m.index, "]: tensor '", m.tensor, "' version ", m.source_version, " on rank ",
          f.rank, " is held as other chunks or another dtype than transfer ", id, " reads (",
          DTypeName(source->dtype()), " here, ", DTypeName(shape.dtype), " expected)"));
    }
  }
  return absl::OkStatus();
}

void TransferRunner::Run(const v1::RunTransferWorkerRequest& request, RunDone done) {
  const std::string& id = request.transfer_id();
  if (id.empty()) return done(absl::InvalidArgumentError("transfer_id: empty"));
  if (request.run_id().empty()) return done(absl::InvalidArgumentError("run_id: empty"));
  if (request.version() <= 0) {
    return done(absl::InvalidArgumentError(
        absl::StrCat("version: ", request.version(), " (must be positive)")));
  }
  if (request.bucket_bytes() < 0) {
    return done(absl::InvalidArgumentError(
        absl::StrCat("bucket_bytes: ", request.bucket_bytes(), " (must not be negative)")));
  }
  if (absl::Status s = core_->CheckAccepting(); !s.ok()) return done(s);
  std::shared_ptr<Resident> resident;
  {
    absl::MutexLock lock(&mu_);
    auto it = resident_.find(id);
    if (it != resident_.end()) resident = it->second;
  }
  if (resident == nullptr) {
    const WorkerIdentity me = identity_();
    return done(
        absl::NotFoundError(absl::StrCat("transfer ", id, " is not prepared on worker ", me.name,
                                         " (rank ", me.rank, "): prepare it again")));
  }
  if (absl::Status s = resident->Begin(request); !s.ok()) return done(s);

  const std::string run_id = request.run_id();
  const std::shared_ptr<const Fragment> fragment = resident->fragment();
  WorkerCore::RunHooks hooks;
  hooks.on_end = [this, resident, fragment, run_id, done](WorkerCore::RunResult r) {
    absl::StatusOr<v1::RunTransferWorkerResponse> answer = v1::RunTransferWorkerResponse();
    if (!r.status.ok()) {
      answer = r.status;
    } else {
      v1::RunTransferWorkerResponse out;
      out.set_bytes_sent(r.bytes_sent);
      out.set_bytes_received(r.bytes_received);
      out.set_digest(TransferDigest(*fragment, r.checksums));
      v1::RankTrace* t = out.mutable_timing();
      t->set_rank(fragment->rank);
      t->set_worker(identity_().name);
      t->set_start_unix_us(absl::ToUnixMicros(r.start));
      t->set_end_unix_us(absl::ToUnixMicros(r.end));
      t->set_memory_peak_bytes(r.memory_peak_bytes);
      t->mutable_steps()->Reserve(static_cast<int>(r.steps.size()));
      for (v1::StepTiming& s : r.steps) *t->add_steps() = std::move(s);
      answer = std::move(out);
    }
    // Before the answer: the coordinator's FinishPlan, and its next run, may follow it at once.
    resident->Ended(run_id);
    done(std::move(answer));
  };
  hooks.schedule_cache = resident->schedule_cache();
  hooks.on_finish = [this, resident, fragment, run_id](bool commit) {
    if (commit) {
      // The previous versions go (never the run's own: Begin refused a version in use).
      for (const auto& [member, version] : resident->Commit(run_id)) {
        buffers_->Drop(fragment->members[member].target_tensor, version);
      }
    }
    resident->Finished(run_id);
  };
  if (log_) {
    log_(absl::StrCat("transfer ", id, ": run ", run_id, " on rank ", fragment->rank,
                      " writes version ", request.version(), ": ", fragment->members.size(),
                      " members (", fragment->shapes.size(), " shapes), sends ",
                      resident->bytes_sent(), " B and receives ", resident->bytes_received(),
                      " B over ", fragment->exchange_ranks.size(), " exchange ranks"));
  }
  if (absl::Status s = core_->StartRun(fragment, std::move(hooks)); !s.ok()) {
    resident->Release(run_id);
    if (log_) log_(absl::StrCat("transfer ", id, ": run ", run_id, " refused: ", s.ToString()));
    done(std::move(s));
  }
}

int TransferRunner::Drop(const v1::DropTransferRequest& request) {
  std::vector<std::shared_ptr<Resident>> gone;  // Freed outside the lock.
  {
    absl::MutexLock lock(&mu_);
    for (const std::string& id : request.transfer_ids()) {
      pending_.erase(id);
      auto it = resident_.find(id);
      if (it == resident_.end()) continue;
      gone.push_back(std::move(it->second));
      resident_.erase(it);
    }
    const std::string& prefix = request.prefix();
    if (!prefix.empty()) {
      for (auto it = pending_.begin(); it != pending_.end();) {
        if (absl::StartsWith(it->first, prefix)) {
          pending_.erase(it++);
        } else {
          ++it;
        }
      }
      for (auto it = resident_.begin(); it != resident_.end();) {
        if (absl::StartsWith(it->first, prefix)) {
          gone.push_back(std::move(it->second));
          resident_.erase(it++);
        } else {
          ++it;
        }
      }
    }
  }
  if (log_ && !gone.empty()) {
    std::string ids;
    for (const std::shared_ptr<Resident>& r : gone) {
      absl::StrAppend(&ids, ids.empty() ? "" : ", ", r->id());
    }
    log_(absl::StrCat("transfers dropped: ", ids));
  }
  return static_cast<int>(gone.size());
}

int TransferRunner::ForgetAll() {
  // Freed outside the lock.
  absl::flat_hash_map<std::string, std::unique_ptr<Pending>> paged;
  absl::flat_hash_map<std::string, std::shared_ptr<Resident>> gone;
  {
    absl::MutexLock lock(&mu_);
    paged.swap(pending_);
    gone.swap(resident_);
  }
  if (log_ && !gone.empty()) log_(absl::StrCat("forgot ", gone.size(), " prepared transfers"));
  return static_cast<int>(gone.size());
}

int TransferRunner::resident() const {
  absl::MutexLock lock(&mu_);
  return static_cast<int>(resident_.size());
}

}  // namespace shardcoord
