// The strategies of PlanManager::Send: how a transaction's data moves (each member's own
// fragments, one fused fragment per worker, or the coordinator's relay).

#include <utility>

#include "absl/strings/str_cat.h"
#include "coordinator/plans/plan_manager.h"
#include "proto/convert.h"
#include "sharding/fused_stream.h"
#include "sharding/plan_fragment.h"

namespace shardcoord {
namespace {

// What a transaction's fragments are made from, gathered under the lock and made outside.
struct FragmentInputs {
  std::vector<std::shared_ptr<const Plan>> plans;  // The members', in order.
  std::vector<FragmentMemberOptions> members;      // Each member's, in order.
  FragmentOptions options;                         // The transaction's.
  std::vector<WorkerEndpoint> workers;             // Who gets one, by rank.
};

// The one place fragments are made (sharding/plan_fragment.h) and put on the wire: every
// participant's fragment of the one plan, or every worker's fused fragment of all of them.
std::vector<std::pair<WorkerEndpoint, v1::PlanFragment>> BuildFragments(const FragmentInputs& in) {
  std::vector<const Plan*> plans;
  plans.reserve(in.plans.size());
  for (const auto& p : in.plans) plans.push_back(p.get());
  std::map<int64_t, Fragment> fragments = MakeFragments(plans, in.members, in.options);
  std::vector<std::pair<WorkerEndpoint, v1::PlanFragment>> out;
  out.reserve(in.workers.size());
  for (const WorkerEndpoint& w : in.workers) {
    out.emplace_back(w, FragmentToProto(fragments[w.rank]));
  }
  return out;
}

}  // namespace

void PlanManager::Send(const std::string& txn, int64_t admitted) {
  Strategy strategy = Strategy::kCollective;
  std::vector<std::shared_ptr<const Plan>> plans;
  int64_t default_bucket = 0;
  {
    absl::MutexLock lock(&mu_);
    auto it = transactions_.find(txn);
    if (it == transactions_.end() || it->second.failed) return;  // Aborted meanwhile.
    const Transaction& t = it->second;
    strategy = t.strategy;
    default_bucket = t.default_bucket_bytes;
    for (const std::string& id : t.members) plans.push_back(plans_.at(id).plan);
  }
  if (strategy == Strategy::kRelay) return Relay(txn);  // Its one member's id.
  // Both ends of every pair cut a fused exchange's streams alike: one bucket size for every
  // worker, the admitted one, or without admission the smallest of the workers'.
  int64_t bucket = admitted;
  FusedExchangeStats stats;
  if (strategy == Strategy::kFused) {
    std::vector<const Plan*> raw;
    raw.reserve(plans.size());
    for (const auto& p : plans) raw.push_back(p.get());
    const StreamLimits limits = StreamLimitsFor(admitted > 0 ? admitted : default_bucket);
    stats = FusedExchange(raw, limits);
    bucket = limits.bucket_bytes;
  }
  FragmentInputs in;
  const bool fused = strategy == Strategy::kFused;
  in.plans = std::move(plans);
  {
    absl::MutexLock lock(&mu_);
    auto it = transactions_.find(txn);
    if (it == transactions_.end()) return;
    Transaction& t = it->second;
    t.bucket_bytes = bucket;
    if (fused) t.buckets = stats.messages;
    if (t.failed) return;
    if (fused) {
      // The group's workers: every member's participants, expecting what they all receive.
      t.records.reserve(t.members.size());
      for (size_t i = 0; i < t.members.size(); ++i) {
        PlanRecord& e = plans_.at(t.members[i]);
        for (const auto& [r, p] : e.participants) {
          Participant& tp = t.participants[r];
          tp.endpoint = p.endpoint;
          tp.bytes_expected += p.bytes_expected;
        }
        // Members' records stay put (and are not retired) until they end, with the group.
        t.records.push_back(&e);
      }
    }
    in.members.reserve(t.records.size());
    for (size_t i = 0; i < t.records.size(); ++i) {
      const PlanRecord& e = *t.records[i];
      FragmentMemberOptions& m = in.members.emplace_back();
      m.index = static_cast<int32_t>(i);
      m.plan_id = e.id;
      m.tensor = e.tensor;
      m.target_tensor = e.target_tensor;
      m.source_version = e.source_version;
      m.target_version = e.target_version;
      m.attached_target_version = e.target_attached ? e.old_target_version : 0;
    }
    FragmentOptions& fo = in.options;
    fo.plan_id = t.id;
    fo.fused = fused;
    fo.step_timeout_ms = absl::ToInt64Milliseconds(options_.step_timeout);
    // A single plan's fragments carry the admitted bucket only; a fused one always its own.
    fo.bucket_bytes = fused ? t.bucket_bytes : admitted;
    fo.communicator_prefix = fused ? t.communicator_prefix : t.records.front()->communicator_prefix;
    fo.incarnations.reserve(t.participants.size());
    in.workers.reserve(t.participants.size());
    for (const auto& [r, p] : t.participants) {
      fo.incarnations.emplace(r, p.endpoint.incarnation);
      in.workers.push_back(p.endpoint);
    }
    if (fused) {
      t.sent = true;
      ScheduleTimeoutLocked(t);
    }
  }
  for (auto& [endpoint, fragment] : BuildFragments(in)) {
    const int64_t rank = endpoint.rank;
    client_->Execute(endpoint, std::move(fragment),
                     [this, txn, rank](absl::Status s) { OnExecuteDone(txn, rank, s); });
  }
}

void PlanManager::ScheduleTimeoutLocked(Transaction& t) {
  const std::string id = t.id;
  const bool group = t.fused();
  t.timer = timer_->Schedule(t.start + options_.plan_timeout, [this, id, group] {
    std::string reason;
    {
      absl::MutexLock lock(&mu_);
      auto it = transactions_.find(id);
      if (it == transactions_.end()) return;
      const Transaction& pt = it->second;
      reason = absl::StrCat(group ? absl::StrCat("group ", id, " ") : "", "timed out after ",
                            absl::FormatDuration(options_.plan_timeout), " in state ",
                            PlanStateName(pt.state), "; waiting for ", pt.Waiting());
    }
    AbortTransaction(id, reason);
  });
}

void PlanManager::Relay(const std::string& id) {
  RelayRequest q;
  {
    absl::MutexLock lock(&mu_);
    auto it = plans_.find(id);
    if (it == plans_.end() || it->second.ended()) return;
    const PlanRecord& e = it->second;
    q.plan_id = id;
    q.tensor = e.tensor;
    q.source_version = e.source_version;
    q.target_tensor = e.target_tensor;
    q.target_version = e.target_version;
    q.dtype = e.plan->dtype;
    q.source = e.plan->source;
    q.target = e.plan->target;
    for (const auto& [r, p] : e.participants) q.workers[r] = p.endpoint;
  }
  // A holder the relay reads from may have no part in the plan's own transfers.
  for (const RankChunks& rc : q.source.ranks()) {
    if (q.workers.count(rc.rank) > 0) continue;
    absl::StatusOr<WorkerRecord> w = workers_->GetByRank(rc.rank);
    if (!w.ok()) return Abort(id, std::string(w.status().message()));
    if (!w->alive) return Abort(id, std::string(w->DeadError("holds a source chunk").message()));
    q.workers[rc.rank] = w->Endpoint();
  }
  std::map<int64_t, WorkerEndpoint> workers = q.workers;
  RunRelay(client_, std::move(q),
           [this, id, workers](RelayResult r) { OnRelayDone(id, workers, std::move(r)); });
}

void PlanManager::OnRelayDone(const std::string& id,
                              const std::map<int64_t, WorkerEndpoint>& workers,
                              RelayResult result) {
  std::string abort_reason;
  bool drop = false, validate = false;
  std::string target_tensor;
  int64_t target_version = 0;
  WatchCalls calls;
  {
    absl::MutexLock lock(&mu_);
    auto it = plans_.find(id);
    auto tt = transactions_.find(id);
    if (it == plans_.end() || tt == transactions_.end()) return;
    PlanRecord& e = it->second;
    Transaction& t = tt->second;
    target_tensor = e.target_tensor;
    target_version = e.target_version;
    if (e.ended() || e.closing) {
      drop = true;  // Aborted meanwhile (a timeout, a death): what was written goes.
    } else if (!result.status.ok()) {
      drop = true;
      abort_reason = absl::StrCat("relay failed: ", result.status.message());
    } else {
      // The workers' answers are their reports: every participant ran and reported.
      for (auto& [r, p] : e.participants) {
        Participant& tp = t.participants.at(r);
        tp.executed = true;
        tp.reported = true;
        tp.bytes_done = tp.bytes_expected;
        p.bytes_done = p.bytes_expected;
        tp.timing.set_rank(r);
        tp.timing.set_worker(p.endpoint.name);
        auto w = result.written.find(r);
        if (w == result.written.end()) {
          // Only read from: no buffer of the new version.
          p.chunks = RankChunks{};
          p.chunks.rank = r;
          p.checksums.clear();
          tp.timing.set_start_unix_us(absl::ToUnixMicros(result.reads_done));
          tp.timing.set_end_unix_us(absl::ToUnixMicros(result.reads_done));
          continue;
        }
        p.chunks = w->second.chunks;
        p.checksums = w->second.checksums;
        tp.timing.set_start_unix_us(absl::ToUnixMicros(w->second.start));
        tp.timing.set_end_unix_us(absl::ToUnixMicros(w->second.end));
        v1::StepTiming* s = tp.timing.add_steps();
        s->set_op("relay_write");
        s->set_start_unix_us(absl::ToUnixMicros(w->second.start));
        s->set_duration_us(absl::ToInt64Microseconds(w->second.end - w->second.start));
        s->set_bytes_received(w->second.bytes);
      }
      t.executed = t.reported = static_cast<int64_t>(t.participants.size());
      t.state = PlanState::kTransferred;
      t.transferred = clock_->Now();
      MembersToLocked(t, PlanState::kTransferred, &calls);
      validate = true;
      calls = ChangedLocked(e);
    }
  }
  if (drop) {
    // The new version is this plan's alone: dropping it never touches another's.
    v1::DropTensorRequest req;
    req.set_tensor(target_tensor);
    req.set_version(target_version);
    for (int64_t r : result.attempted) {
      auto w = workers.find(r);
      if (w != workers.end()) client_->DropTensor(w->second, req, [](absl::Status) {});
    }
  }
  if (!abort_reason.empty()) return Abort(id, abort_reason);
  Tell(calls);
  if (validate) Validate(id);
}

}  // namespace shardcoord
