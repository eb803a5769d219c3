// A run of a prepared transfer: hold (one flag), admit (one ticket), RunTransfer to every
// participant, validate their answers, commit (one durable record), FinishPlan to each.
// O(participants) messages and work; nothing here looks at the members.

#include <algorithm>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "common/fan_in.h"
#include "coordinator/transfers/transfer_manager.h"
#include "coordinator/transfers/transfer_manager_internal.h"

namespace shardcoord {
namespace {

// A run prepares at most this often before it gives up on members that keep changing.
constexpr int kMaxPreparationsPerRun = 2;

// A preparation's error as a run's: a member gone or changed since the transfer was created
// is the transfer's precondition, not the caller's argument.
absl::Status AsRunError(const std::string& name, const absl::Status& s) {
  if (s.code() == absl::StatusCode::kNotFound) {
    return absl::FailedPreconditionError(
        absl::StrCat(s.message(), " (deleted since transfer '", name,
                     "' was created: delete the transfer or create the tensor again)"));
  }
  if (s.code() == absl::StatusCode::kInvalidArgument) {
    return absl::FailedPreconditionError(
        absl::StrCat(s.message(), " (changed since transfer '", name, "' was created)"));
  }
  return s;
}

}  // namespace

void TransferManager::Run(const std::string& name, RunCallback started, RunCallback ended) {
  std::string run_id;
  absl::Status refused;
  {
    absl::MutexLock lock(&mu_);
    auto it = transfers_.find(name);
    if (!closed_.empty()) {
      refused = absl::UnavailableError(closed_);
    } else if (it == transfers_.end() || !it->second.stored) {
      refused = absl::NotFoundError(absl::StrCat("unknown transfer '", name, "'"));
    } else if (!it->second.busy.empty()) {
      refused = absl::AbortedError(
          absl::StrCat("transfer '", name, "' is ",
                       it->second.busy == "deleting"
                           ? std::string("being deleted")
                           : absl::StrCat("already running (run ", it->second.busy, ")")));
    } else {
      run_id = internal_transfers::RunId(options_.id_namespace, next_run_++);
      it->second.busy = run_id;
      auto r = std::make_unique<RunRecord>();
      r->id = run_id;
      r->transfer = name;
      r->start = clock_->Now();
      r->started_fn = std::move(started);
      r->join = std::make_shared<StartEndJoin<std::pair<absl::Status, v1::RunTransferResponse>>>(
          [ended = std::move(ended)](std::pair<absl::Status, v1::RunTransferResponse> end) {
            ended(end.first, end.second);
          });
      runs_.emplace(run_id, std::move(r));
    }
  }
  if (!refused.ok()) return started(refused, v1::RunTransferResponse());
  RunPrepared(run_id);
}

void TransferManager::RunPrepared(const std::string& run_id) {
  std::string name;
  {
    absl::MutexLock lock(&mu_);
    name = runs_.at(run_id)->transfer;
  }
  absl::StatusOr<TransferBindingState> binding = tensors_->TransferState(name);
  if (!binding.ok()) return FailBeforeStart(run_id, binding.status());
  std::string invalid;
  int preparations = 0;
  {
    absl::MutexLock lock(&mu_);
    invalid = InvalidLocked(transfers_.at(name), *binding);
    preparations = runs_.at(run_id)->preparations;
  }
  if (invalid.empty()) return StartRun(run_id);
  if (preparations >= kMaxPreparationsPerRun) {
    return FailBeforeStart(
        run_id, absl::AbortedError(absl::StrCat("transfer '", name,
                                                "' changed again while it was prepared (", invalid,
                                                "); run it again")));
  }
  Prepare(name, [this, run_id](absl::StatusOr<std::shared_ptr<const Prepared>> prepared) {
    OnRunPrepared(run_id, std::move(prepared));
  });
}

void TransferManager::OnRunPrepared(const std::string& run_id,
                                    absl::StatusOr<std::shared_ptr<const Prepared>> prepared) {
  std::string name;
  {
    absl::MutexLock lock(&mu_);
    name = runs_.at(run_id)->transfer;
  }
  if (!prepared.ok()) return FailBeforeStart(run_id, AsRunError(name, prepared.status()));
  std::string retired;
  std::vector<WorkerEndpoint> stale_parts;  // Old participants the new preparation left out.
  std::string stale_id;
  {
    absl::MutexLock lock(&mu_);
    Transfer& t = transfers_.at(name);
    RunRecord& r = *runs_.at(run_id);
    if (t.prepared != nullptr) {
      retired = CommPrefixLocked(t, *t.prepared);
      stale_id = t.prepared->id;
      for (const WorkerEndpoint& w : t.prepared->participants) {
        const auto& now = (*prepared)->participants;
        if (std::none_of(now.begin(), now.end(),
                         [&w](const WorkerEndpoint& p) { return p.rank == w.rank; })) {
          stale_parts.push_back(w);
        }
      }
    }
    t.prepared = *prepared;
    // A participant lost since its answer: StartRun sees it and prepares again.
    t.invalid = std::exchange(t.lost_while_preparing, "");
    t.preparing.clear();
    t.comm_epoch = 0;
    ++t.replans;
    ++r.preparations;
    r.prepare_seconds += (*prepared)->seconds;
  }
  if (options_.metrics != nullptr) options_.metrics->transfer_replans->Increment();
  if (!retired.empty() && options_.on_prefix_retired) options_.on_prefix_retired(retired);
  if (!stale_parts.empty()) {
    v1::DropTransferRequest drop;
    drop.add_transfer_ids(stale_id);
    DropParts(stale_parts, drop);
  }
  StartRun(run_id);
}

void TransferManager::StartRun(const std::string& run_id) {
  std::string name;
  std::shared_ptr<const Prepared> prepared;
  {
    absl::MutexLock lock(&mu_);
    const RunRecord& r = *runs_.at(run_id);
    name = r.transfer;
    prepared = transfers_.at(name).prepared;
  }
  // One flag holds every member; O(1) in their number.
  std::string stale;
  absl::Status held = tensors_->StartTransferRun(name, run_id, prepared->generation, &stale);
  if (!held.ok()) return FailBeforeStart(run_id, held);
  if (!stale.empty()) return RunPrepared(run_id);  // Changed since prepared: prepare again.
  const int64_t version = tensors_->NewVersion();
  MemoryDemand demand;
  std::string invalid;
  v1::RunTransferResponse response;
  {
    absl::MutexLock lock(&mu_);
    Transfer& t = transfers_.at(name);
    RunRecord& r = *runs_.at(run_id);
    invalid = t.invalid;  // A participant lost since it was prepared.
    if (invalid.empty()) {
      r.started = true;
      r.prepared = prepared;
      r.version = version;
      r.comm_prefix = CommPrefixLocked(t, *prepared);
      r.answers.resize(prepared->participants.size());
      demand = prepared->demand;
      response.set_name(name);
      response.set_run_id(run_id);
      response.set_state(v1::PENDING);
      response.set_bytes_moved(prepared->bytes_moved);
      response.set_lower_bound_bytes(prepared->lower_bound_bytes);
      response.set_members(static_cast<int64_t>(t.copies->size()));
      response.set_replanned(r.preparations > 0);
      response.set_version(version);
      response.set_prepare_seconds(r.prepare_seconds);
    }
  }
  if (!invalid.empty()) {
    tensors_->EndTransferRun(name, run_id);
    return RunPrepared(run_id);
  }
  int64_t bucket = 0;
  bool admitted = true;
  if (options_.admission != nullptr) {
    absl::StatusOr<AdmissionController::Grant> grant = options_.admission->Request(
        absl::StrCat("transfer '", name, "' (run ", run_id, ")"), std::move(demand),
        /*may_wait=*/true, [this, run_id](int64_t b) { Dispatch(run_id, b); },
        [this, run_id](const absl::Status& s) {
          AbortRun(run_id, std::string(s.message()), s.code());
        });
    if (!grant.ok()) {
      tensors_->EndTransferRun(name, run_id);
      return FailBeforeStart(run_id, grant.status());
    }
    bool release = false;
    {
      absl::MutexLock lock(&mu_);
      auto it = runs_.find(run_id);
      if (it == runs_.end() || it->second->over) {
        release = true;  // Ended already (refused, a death, a timeout).
      } else {
        RunRecord& r = *it->second;
        r.ticket = grant->ticket;
        if (!grant->admitted && r.bucket_bytes == 0) r.waiting_for_memory = grant->waiting;
        response.set_state(static_cast<v1::PlanState>(static_cast<int>(r.state)));
      }
    }
    if (release) options_.admission->Release(grant->ticket);
    admitted = grant->admitted;
    bucket = grant->bucket_bytes;
  }
  RunCallback started;
  std::shared_ptr<StartEndJoin<std::pair<absl::Status, v1::RunTransferResponse>>> join;
  {
    // The record stays while the run is open and keep_ended_runs others allow after.
    absl::MutexLock lock(&mu_);
    auto it = runs_.find(run_id);
    if (it != runs_.end()) {
      started = std::move(it->second->started_fn);
      join = it->second->join;
    }
  }
  if (started) started(absl::OkStatus(), response);
  if (join != nullptr) join->Started();
  if (admitted) Dispatch(run_id, bucket);
}

void TransferManager::FailBeforeStart(const std::string& run_id, const absl::Status& status) {
  RunCallback started;
  v1::RunTransferResponse response;
  {
    absl::MutexLock lock(&mu_);
    auto it = runs_.find(run_id);
    if (it == runs_.end()) return;
    RunRecord& r = *it->second;
    started = std::move(r.started_fn);
    response.set_name(r.transfer);
    auto t = transfers_.find(r.transfer);
    if (t != transfers_.end() && t->second.busy == run_id) {
      t->second.busy.clear();
      t->second.preparing.clear();
      t->second.lost_while_preparing.clear();
    }
    runs_.erase(it);  // Nobody heard of it.
  }
  if (started) started(status, response);
}

void TransferManager::Dispatch(const std::string& run_id, int64_t bucket_bytes) {
  std::vector<std::pair<WorkerEndpoint, v1::RunTransferWorkerRequest>> requests;
  WatchCalls calls;
  {
    absl::MutexLock lock(&mu_);
    auto it = runs_.find(run_id);
    if (it == runs_.end() || !it->second->open() || it->second->sent) return;
    RunRecord& r = *it->second;
    const Prepared& p = *r.prepared;
    r.sent = true;
    r.bucket_bytes = bucket_bytes > 0 ? bucket_bytes : p.default_bucket_bytes;
    r.waiting_for_memory.clear();
    r.state = PlanState::kPrepared;
    r.timer = timer_->Schedule(clock_->Now() + options_.run_timeout,
                               [this, run_id] { TimedOut(run_id); });
    requests.reserve(p.participants.size());
    for (const WorkerEndpoint& w : p.participants) {
      v1::RunTransferWorkerRequest& q =
          requests.emplace_back(w, v1::RunTransferWorkerRequest()).second;
      q.set_transfer_id(p.id);
      q.set_run_id(run_id);
      q.set_rank(w.rank);
      q.set_version(r.version);
      // One bucket for every participant: both ends of a stream cut it alike.
      q.set_bucket_bytes(r.bucket_bytes);
      q.set_communicator_prefix(r.comm_prefix);
      q.set_step_timeout_ms(absl::ToInt64Milliseconds(options_.step_timeout));
    }
    calls = ChangedLocked(r);
  }
  Tell(calls);
  for (size_t i = 0; i < requests.size(); ++i) {
    client_->RunTransfer(requests[i].first, requests[i].second, options_.run_timeout,
                         [this, run_id, i](absl::StatusOr<v1::RunTransferWorkerResponse> answer) {
                           OnRunAnswer(run_id, i, std::move(answer));
                         });
  }
}

void TransferManager::OnRunAnswer(const std::string& run_id, size_t index,
                                  absl::StatusOr<v1::RunTransferWorkerResponse> answer) {
  std::string abort;
  bool validate = false;
  WatchCalls calls;
  {
    absl::MutexLock lock(&mu_);
    auto it = runs_.find(run_id);
    if (it == runs_.end() || !it->second->open()) return;
    RunRecord& r = *it->second;
    const WorkerEndpoint& w = r.prepared->participants[index];
    if (!answer.ok()) {
      const std::string error = absl::StrCat(Describe(w), ": ", answer.status().message());
      if (!r.failing.empty()) return;
      if (options_.failure_grace <= absl::ZeroDuration()) {
        abort = error;
      } else {
        // Often the echo of a peer's death the heartbeats have not noticed yet: wait for it.
        r.failing = error;
        r.grace_timer = timer_->Schedule(clock_->Now() + options_.failure_grace,
                                         [this, run_id] { StartGrace(run_id); });
      }
    } else if (!r.answers[index].has_value()) {
      r.bytes_done += answer->bytes_received();
      r.answers[index] = *std::move(answer);
      ++r.answered;
      if (r.answered == r.answers.size() && r.failing.empty()) {
        r.state = PlanState::kTransferred;
        r.transferred = clock_->Now();
        validate = true;
      }
      calls = ChangedLocked(r);
    }
  }
  Tell(calls);
  if (!abort.empty()) return AbortRun(run_id, abort);
  if (validate) ValidateRun(run_id);
}

void TransferManager::StartGrace(const std::string& run_id) {
  std::string failing;
  {
    absl::MutexLock lock(&mu_);
    auto it = runs_.find(run_id);
    if (it == runs_.end()) return;
    it->second->grace_timer = 0;
    failing = it->second->failing;
  }
  AbortRun(run_id, failing);
}

void TransferManager::TimedOut(const std::string& run_id) {
  std::string reason;
  {
    absl::MutexLock lock(&mu_);
    auto it = runs_.find(run_id);
    if (it == runs_.end() || !it->second->open()) return;
    RunRecord& r = *it->second;
    r.timer = 0;
    std::vector<std::string> waiting;
    for (size_t i = 0; i < r.answers.size(); ++i) {
      if (!r.answers[i].has_value()) waiting.push_back(Describe(r.prepared->participants[i]));
    }
    reason = absl::StrCat("timed out after ", absl::FormatDuration(options_.run_timeout),
                          waiting.empty() ? "" : " waiting for ", absl::StrJoin(waiting, ", "));
  }
  AbortRun(run_id, reason);
}

void TransferManager::ValidateRun(const std::string& run_id) {
  std::string reason, name;
  TransferCommit commit;
  int64_t version = 0;
  {
    absl::MutexLock lock(&mu_);
    auto it = runs_.find(run_id);
    if (it == runs_.end() || !it->second->open()) return;
    RunRecord& r = *it->second;
    const Prepared& p = *r.prepared;
    // Ranks of one replica class (equal keys: the same target chunks) hold the same values
    // after a run, so their digests must agree.
    absl::flat_hash_map<uint64_t, size_t> first_of_class;
    for (size_t i = 0; i < p.participants.size() && reason.empty(); ++i) {
      const v1::RunTransferWorkerResponse& a = *r.answers[i];
      const Part& part = p.parts[i];
      if (a.bytes_sent() != part.bytes_sent || a.bytes_received() != part.bytes_received) {
        reason = absl::StrCat(Describe(p.participants[i]), " sent ", a.bytes_sent(),
                              " and received ", a.bytes_received(), " bytes, its part ",
                              part.bytes_sent, " and ", part.bytes_received);
        break;
      }
      if (part.replica_key == 0) continue;
      auto [first, added] = first_of_class.try_emplace(part.replica_key, i);
      if (added) continue;
      const uint64_t want = r.answers[first->second]->digest();
      if (a.digest() != want) {
        reason = absl::StrFormat(
            "DATA_LOSS: replicas disagree: %s reports digest %016x but %s %016x",
            Describe(p.participants[first->second]), want, Describe(p.participants[i]), a.digest());
      }
    }
    if (reason.empty()) {
      r.closing = true;
      name = r.transfer;
      version = r.version;
      const Transfer& t = transfers_.at(name);
      commit.run_id = run_id;
      commit.version = version;
      commit.record = HeaderLocked(t, version, t.runs + 1);
      commit.repaired = p.repaired;
      for (const WorkerEndpoint& w : p.participants) commit.incarnations[w.rank] = w.incarnation;
    }
  }
  if (!reason.empty()) return AbortRun(run_id, reason);
  // The run's one durable write; from it on every dst reads `version`.
  if (absl::Status s = tensors_->CommitTransferRun(name, commit); !s.ok()) {
    {
      absl::MutexLock lock(&mu_);
      runs_.at(run_id)->closing = false;
    }
    return AbortRun(run_id, absl::StrCat("its commit could not be stored: ", s.message()),
                    s.code() == absl::StatusCode::kUnavailable ? absl::StatusCode::kUnavailable
                                                               : absl::StatusCode::kAborted);
  }
  std::vector<WorkerEndpoint> participants;
  RunEnd end;
  {
    absl::MutexLock lock(&mu_);
    RunRecord& r = *runs_.at(run_id);
    Transfer& t = transfers_.at(name);
    // Still busy until every participant has the FinishPlan (below).
    end = EndRunLocked(r, t, PlanState::kCommitted, "");
    participants = r.prepared->participants;
    t.version = version;
    ++t.runs;
    end.response.set_seconds(absl::ToDoubleSeconds(r.end - r.start) - r.prepare_seconds);
    end.response.set_bytes_moved(r.prepared->bytes_moved);
    end.response.set_lower_bound_bytes(r.prepared->lower_bound_bytes);
    end.response.set_version(version);
    RetireEndedRunLocked(r, t, v1::COMMITTED, end);  // `r` may be gone after.
  }
  CancelTimers(end.timers);
  if (options_.metrics != nullptr) {
    options_.metrics->transfer_runs->WithLabels({"committed"})->Increment();
    options_.metrics->transfer_run_seconds->Observe(end.response.seconds());
  }
  // A worker holds its part of the run until the FinishPlan: the caller hears of the commit,
  // and the transfer is free for its next run, once every participant has it, so that a next
  // run never finds a worker still holding this one (it would refuse it). One round trip.
  FinishOnWorkers(participants, run_id, /*commit=*/true, end.ticket,
                  [this, name, run_id, final = end.progress, response = end.response,
                   join = end.join, calls = end.calls]() mutable {
                    {
                      absl::MutexLock lock(&mu_);
                      auto t = transfers_.find(name);
                      if (t != transfers_.end() && t->second.busy == run_id) t->second.busy.clear();
                    }
                    if (options_.on_run_end) options_.on_run_end(final);
                    join->Ended({absl::OkStatus(), response});
                    Tell(calls);
                  });
}

void TransferManager::AbortRun(const std::string& run_id, const std::string& reason,
                               absl::StatusCode code) {
  std::string name, retired;
  std::vector<WorkerEndpoint> participants;
  RunEnd end;
  {
    absl::MutexLock lock(&mu_);
    auto it = runs_.find(run_id);
    if (it == runs_.end() || !it->second->open()) return;
    RunRecord& r = *it->second;
    Transfer& t = transfers_.at(r.transfer);
    name = r.transfer;
    r.error = reason;
    end = EndRunLocked(r, t, PlanState::kAborted, reason);
    if (r.sent) {
      // Workers may hold broken communicators and half-run parts: new rendezvous keys, and a
      // new preparation before the next run.
      participants = r.prepared->participants;
      retired = r.comm_prefix;
      ++t.comm_epoch;
      if (t.invalid.empty()) t.invalid = absl::StrCat("its last run (", run_id, ") aborted");
    }
    t.busy.clear();
    RetireEndedRunLocked(r, t, v1::ABORTED, end);  // `r` may be gone after.
  }
  CancelTimers(end.timers);
  // Free before the caller hears of it, so that a retry finds the members idle.
  tensors_->EndTransferRun(name, run_id);
  if (options_.metrics != nullptr) {
    options_.metrics->transfer_runs->WithLabels({"aborted"})->Increment();
  }
  if (options_.on_run_end) options_.on_run_end(end.progress);
  if (!retired.empty() && options_.on_prefix_retired) options_.on_prefix_retired(retired);
  end.join->Ended(
      {absl::Status(code, absl::StrCat("run ", run_id, " of transfer '", name,
                                       "' aborted (every dst keeps its version): ", reason)),
       end.response});
  Tell(end.calls);
  FinishOnWorkers(participants, run_id, /*commit=*/false, end.ticket);
}

TransferManager::RunEnd TransferManager::EndRunLocked(RunRecord& r, Transfer& t, PlanState state,
                                                      const std::string& error) {
  RunEnd end;
  r.state = state;
  r.end = clock_->Now();
  r.over = true;
  end.timers = {std::exchange(r.timer, 0), std::exchange(r.grace_timer, 0)};
  end.ticket = std::exchange(r.ticket, 0);
  t.last_run_id = r.id;
  t.last_run_state = state;
  t.last_run_seconds = absl::ToDoubleSeconds(r.end - r.start);
  t.last_error = error;
  return end;
}

void TransferManager::RetireEndedRunLocked(RunRecord& r, const Transfer& t, v1::PlanState state,
                                           RunEnd& end) {
  end.calls = ChangedLocked(r);
  end.progress = ProgressLocked(r);
  end.response.set_name(r.transfer);
  end.response.set_run_id(r.id);
  end.response.set_state(state);
  end.response.set_members(static_cast<int64_t>(t.copies->size()));
  end.response.set_replanned(r.preparations > 0);
  end.response.set_prepare_seconds(r.prepare_seconds);
  end.join = r.join;
  r.watchers.clear();
  const std::string run_id = r.id;  // Retiring may erase `r`.
  RetireRunLocked(run_id);
}

void TransferManager::CancelTimers(const std::vector<Timer::Id>& timers) {
  for (Timer::Id id : timers) {
    if (id != 0) timer_->Cancel(id);
  }
}

void TransferManager::FinishOnWorkers(const std::vector<WorkerEndpoint>& workers,
                                      const std::string& run_id, bool commit, int64_t ticket,
                                      std::function<void()> then) {
  // The run's memory goes back once the workers dropped what the commit replaced (or the
  // abort's new buffers): a run admitted right after must find their budgets free.
  AdmissionController* admission = options_.admission;
  std::shared_ptr<FanIn> fan =
      FanIn::Start(workers.size(), [admission, ticket, then = std::move(then)](absl::Status) {
        if (admission != nullptr && ticket != 0) admission->Release(ticket);
        if (then) then();
      });
  v1::FinishPlanRequest request;
  request.set_plan_id(run_id);
  request.set_commit(commit);
  for (const WorkerEndpoint& w : workers) {
    client_->FinishPlan(w, request, [fan](absl::Status s) { fan->Report(s); });
  }
}

}  // namespace shardcoord
