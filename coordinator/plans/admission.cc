#include "coordinator/plans/admission.h"

#include <algorithm>
#include <limits>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/byte_size.h"

namespace shardcoord {
namespace {

int64_t StagingAt(const std::vector<StagingNeed>& needs, int64_t bucket_bytes) {
  int64_t total = 0;
  for (const StagingNeed& n : needs) total += n.At(bucket_bytes);
  return total;
}

}  // namespace

void MemoryDemand::Add(const MemoryDemand& other) {
  for (const auto& [rank, bytes] : other.buffers) buffers[rank] += bytes;
  for (const auto& [rank, caps] : other.staging) {
    std::vector<StagingNeed>& mine = staging[rank];
    mine.insert(mine.end(), caps.begin(), caps.end());
  }
  for (const auto& [rank, bytes] : other.frees) frees[rank] += bytes;
}

std::set<int64_t> MemoryDemand::Ranks() const {
  std::set<int64_t> ranks;
  for (const auto& [rank, bytes] : buffers) ranks.insert(rank);
  for (const auto& [rank, caps] : staging) ranks.insert(rank);
  return ranks;
}

std::map<int64_t, int64_t> LayoutBytesByRank(const Layout& layout, DType dtype) {
  std::map<int64_t, int64_t> out;
  const int64_t esize = ElementSize(dtype);
  for (const RankChunks& rc : layout.ranks()) out[rc.rank] += rc.local_elements * esize;
  return out;
}

MemoryDemand PlanMemoryDemand(const Plan& plan, bool target_in_place, const Layout* replaced,
                              bool staging, std::optional<DType> replaced_dtype) {
  MemoryDemand d;
  if (!target_in_place) d.buffers = LayoutBytesByRank(plan.target, plan.target_dtype());
  if (staging) {
    for (const auto& [rank, cap] : StagingCaps(plan)) d.staging[rank].push_back(StagingNeed{cap});
  }
  if (replaced != nullptr)
    d.frees = LayoutBytesByRank(*replaced, replaced_dtype.value_or(plan.target_dtype()));
  return d;
}

std::map<int64_t, WorkerMemoryView> ClusterMemoryView::Workers() const {
  std::map<int64_t, WorkerMemoryView> out;
  for (const WorkerRecord& w : workers_->List()) {
    WorkerMemoryView v;
    v.rank = w.rank;
    v.name = w.spec.name;
    v.budget_bytes = w.spec.memory.budget_bytes;
    v.used_bytes = w.spec.memory.used_bytes;
    v.bucket_bytes = w.spec.bucket_bytes;
    out.emplace(w.rank, std::move(v));
  }
  return out;
}

std::map<int64_t, int64_t> ClusterMemoryView::CommittedBytes() const {
  std::map<int64_t, int64_t> out;
  // Liveness outside the tensor manager's lock: a restarted worker holds nothing of before.
  for (const TensorManager::HeldBytes& h : tensors_->BytesByHolder()) {
    if (workers_->IsLive(h.rank, h.incarnation)) out[h.rank] += h.bytes;
  }
  return out;
}

void ClusterMemoryView::OnWorkerMemory(const WorkerRecord&) {
  if (controller_ != nullptr) controller_->Recheck();
}

AdmissionController::AdmissionController(const Clock* clock, Timer* timer, MemoryView* view,
                                         AdmissionOptions options)
    : clock_(clock), timer_(timer), view_(view), options_(std::move(options)) {}

AdmissionController::~AdmissionController() {
  absl::MutexLock lock(&mu_);
  for (const auto& [id, t] : tickets_) {
    if (t.timer != 0) timer_->Cancel(t.timer);
  }
}

AdmissionController::Snapshot AdmissionController::TakeSnapshotLocked() const {
  // Under mu_, so no reservation changes between the view and the count: a plan commits its
  // layout (committed grows) before it releases its reservation, never after.
  Snapshot s;
  s.workers = view_->Workers();
  s.committed = view_->CommittedBytes();
  for (const auto& [id, t] : tickets_) {
    if (!t.admitted) continue;
    for (const auto& [rank, bytes] : Reservation(t)) s.reserved[rank] += bytes;
    for (const auto& [rank, bytes] : t.demand.frees) s.freeing[rank] += bytes;
  }
  return s;
}

std::map<int64_t, int64_t> AdmissionController::Reservation(const Ticket& t) {
  std::map<int64_t, int64_t> out = t.demand.buffers;
  for (const auto& [rank, caps] : t.demand.staging) {
    out[rank] += StagingAt(caps, t.bucket_bytes);
  }
  return out;
}

AdmissionController::Fit AdmissionController::Evaluate(const MemoryDemand& demand,
                                                       const Snapshot& s, bool optimistic,
                                                       bool floor_use) const {
  Fit fit;
  const std::set<int64_t> ranks = demand.Ranks();
  // The workers' bucket sizes: the plan runs with the smallest (every member must agree).
  int64_t top = 0;
  for (int64_t r : ranks) {
    auto w = s.workers.find(r);
    if (w != s.workers.end() && w->second.bucket_bytes > 0) {
      top = top == 0 ? w->second.bucket_bytes : std::min(top, w->second.bucket_bytes);
    }
  }
  if (top == 0) top = options_.default_bucket_bytes;
  const int64_t floor = std::max<int64_t>(1, std::min(options_.min_bucket_bytes, top));
  auto get = [](const std::map<int64_t, int64_t>& m, int64_t r) {
    auto it = m.find(r);
    return it == m.end() ? int64_t{0} : it->second;
  };
  static const std::vector<StagingNeed> kNoCaps;
  // Free bytes per limited rank.
  std::map<int64_t, int64_t> free;
  for (int64_t r : ranks) {
    auto w = s.workers.find(r);
    if (w == s.workers.end() || w->second.budget_bytes <= 0) continue;  // No limit known.
    const WorkerMemoryView& v = w->second;
    const int64_t known = get(s.committed, r) + get(s.reserved, r);
    const int64_t held = optimistic  ? std::max<int64_t>(0, get(s.committed, r) - get(s.freeing, r))
                         : floor_use ? std::max(v.used_bytes, known)
                                     : known;
    free[r] = v.budget_bytes - held;
    auto caps = demand.staging.find(r);
    const int64_t needed = get(demand.buffers, r) +
                           StagingAt(caps == demand.staging.end() ? kNoCaps : caps->second, floor);
    if (needed > free[r]) {
      const int64_t shown = std::max<int64_t>(0, free[r]);
      fit.why = absl::StrCat(
          "worker ", v.name, " (rank ", r, ") needs ", needed, " bytes (", FormatBytes(needed),
          ": new buffers ", get(demand.buffers, r), ", staging with ", floor, "-byte buckets ",
          needed - get(demand.buffers, r), ") but has ", shown, " bytes (", FormatBytes(shown),
          ") free of its ", v.budget_bytes, "-byte budget (", FormatBytes(v.budget_bytes), ")",
          optimistic ? " even once every running plan has ended" : "");
      return fit;
    }
  }
  // The largest bucket in [floor, top] whose staging fits everywhere (staging grows with it).
  auto fits_with = [&](int64_t bucket) {
    for (const auto& [r, f] : free) {
      auto caps = demand.staging.find(r);
      if (caps == demand.staging.end()) continue;
      if (get(demand.buffers, r) + StagingAt(caps->second, bucket) > f) return false;
    }
    return true;
  };
  int64_t lo = floor, hi = top;
  while (lo < hi) {
    const int64_t mid = lo + (hi - lo + 1) / 2;
    if (fits_with(mid)) {
      lo = mid;
    } else {
      hi = mid - 1;
    }
  }
  fit.fits = true;
  fit.bucket_bytes = lo;
  return fit;
}

void AdmissionController::Observe(const char* result, absl::Time since) const {
  if (options_.metrics.wait_seconds == nullptr) return;
  options_.metrics.wait_seconds->WithLabels({result})->Observe(
      absl::ToDoubleSeconds(clock_->Now() - since));
}

absl::StatusOr<AdmissionController::Grant> AdmissionController::Request(const std::string& what,
                                                                        MemoryDemand demand,
                                                                        bool may_wait,
                                                                        AdmitFn admitted,
                                                                        RefuseFn refused) {
  const absl::Time now = clock_->Now();
  Grant grant;
  {
    absl::MutexLock lock(&mu_);
    const Snapshot snapshot = TakeSnapshotLocked();
    if (Fit never = Evaluate(demand, snapshot, /*optimistic=*/true); !never.fits) {
      Observe("refused", now);
      return absl::ResourceExhaustedError(absl::StrCat(what, ": ", never.why));
    }
    // First come, first served: behind an earlier operation that waits for one of its
    // workers, it waits too (creates and uploads, which never wait, only need room now).
    bool behind = false;
    if (may_wait) {
      const std::set<int64_t> ranks = demand.Ranks();
      for (const auto& [id, t] : tickets_) {
        if (t.admitted) continue;
        for (int64_t r : t.demand.Ranks()) behind |= ranks.count(r) > 0;
      }
    }
    Fit fit;
    if (behind) {
      fit.why = "waiting behind earlier plans for the same workers";
    } else {
      fit = Evaluate(demand, snapshot, /*optimistic=*/false, /*floor=*/may_wait);
    }
    if (!fit.fits && (!may_wait || options_.timeout <= absl::ZeroDuration())) {
      Observe("refused", now);
      return absl::ResourceExhaustedError(absl::StrCat(what, ": ", fit.why));
    }
    grant.ticket = next_ticket_++;
    Ticket& t = tickets_[grant.ticket];
    t.what = what;
    t.demand = std::move(demand);
    t.since = now;
    if (fit.fits) {
      t.admitted = true;
      t.bucket_bytes = fit.bucket_bytes;
      grant.admitted = true;
      grant.bucket_bytes = fit.bucket_bytes;
      Observe("admitted", now);
      return grant;
    }
    t.waiting = fit.why;
    t.admitted_fn = std::move(admitted);
    t.refused_fn = std::move(refused);
    ++waiting_;
    grant.waiting = fit.why;
  }
  // Outside the lock: a timer may fire at once.
  const int64_t id = grant.ticket;
  const Timer::Id timer = timer_->Schedule(now + options_.timeout, [this, id] { TimedOut(id); });
  absl::MutexLock lock(&mu_);
  auto it = tickets_.find(id);
  if (it != tickets_.end() && !it->second.admitted) {
    it->second.timer = timer;
  } else {
    timer_->Cancel(timer);  // Released or admitted meanwhile.
  }
  return grant;
}

std::vector<std::function<void()>> AdmissionController::PassLocked() {
  std::vector<std::function<void()>> calls;
  if (waiting_ == 0) return calls;
  Snapshot snapshot = TakeSnapshotLocked();
  std::set<int64_t> blocked;  // Ranks an earlier waiting operation needs.
  for (auto& [id, t] : tickets_) {
    if (t.admitted) continue;
    const std::set<int64_t> ranks = t.demand.Ranks();
    bool behind = false;
    for (int64_t r : ranks) behind |= blocked.count(r) > 0;
    Fit fit;
    if (!behind) fit = Evaluate(t.demand, snapshot, /*optimistic=*/false);
    if (!fit.fits) {
      if (!behind) t.waiting = fit.why;
      blocked.insert(ranks.begin(), ranks.end());
      continue;
    }
    t.admitted = true;
    t.bucket_bytes = fit.bucket_bytes;
    --waiting_;
    for (const auto& [rank, bytes] : Reservation(t)) snapshot.reserved[rank] += bytes;
    for (const auto& [rank, bytes] : t.demand.frees) snapshot.freeing[rank] += bytes;
    Observe("waited", t.since);
    if (t.timer != 0) {
      const Timer::Id timer = t.timer;
      calls.push_back([this, timer] { timer_->Cancel(timer); });
      t.timer = 0;
    }
    calls.push_back([fn = std::move(t.admitted_fn), bucket = t.bucket_bytes] { fn(bucket); });
    t.refused_fn = nullptr;
  }
  return calls;
}

void AdmissionController::Recheck() {
  std::vector<std::function<void()>> calls;
  {
    absl::MutexLock lock(&mu_);
    calls = PassLocked();
  }
  for (auto& call : calls) call();
}

void AdmissionController::Release(int64_t ticket) {
  Timer::Id timer = 0;
  {
    absl::MutexLock lock(&mu_);
    auto it = tickets_.find(ticket);
    if (it == tickets_.end()) return;
    if (!it->second.admitted) --waiting_;
    timer = it->second.timer;
    tickets_.erase(it);
  }
  if (timer != 0) timer_->Cancel(timer);
  Recheck();
}

void AdmissionController::TimedOut(int64_t ticket) {
  RefuseFn refused;
  absl::Status status;
  {
    absl::MutexLock lock(&mu_);
    auto it = tickets_.find(ticket);
    if (it == tickets_.end() || it->second.admitted) return;
    Ticket& t = it->second;
    status = absl::ResourceExhaustedError(
        absl::StrCat(t.what, ": no memory within the admission timeout (",
                     absl::FormatDuration(options_.timeout), "): ", t.waiting));
    refused = std::move(t.refused_fn);
    Observe("timed_out", t.since);
    --waiting_;
    tickets_.erase(it);
  }
  if (refused) refused(status);
  Recheck();  // Operations behind it may fit now.
}

size_t AdmissionController::waiting() const {
  absl::MutexLock lock(&mu_);
  return waiting_;
}

int64_t AdmissionController::reserved_bytes(int64_t rank) const {
  absl::MutexLock lock(&mu_);
  int64_t total = 0;
  for (const auto& [id, t] : tickets_) {
    if (!t.admitted) continue;
    auto reservation = Reservation(t);
    auto it = reservation.find(rank);
    if (it != reservation.end()) total += it->second;
  }
  return total;
}

absl::StatusOr<std::shared_ptr<AdmissionHold>> AdmitNow(AdmissionController* controller,
                                                        const std::string& what,
                                                        std::map<int64_t, int64_t> buffers) {
  if (controller == nullptr) return std::shared_ptr<AdmissionHold>();
  MemoryDemand demand;
  demand.buffers = std::move(buffers);
  absl::StatusOr<AdmissionController::Grant> grant =
      controller->Request(what, std::move(demand), /*may_wait=*/false, nullptr, nullptr);
  if (!grant.ok()) return grant.status();
  return std::make_shared<AdmissionHold>(controller, grant->ticket);
}

}  // namespace shardcoord
