// PlanManager::Transaction: the lifecycle record of a single plan or a group, and the
// transitions it owns (PlanManager does, outside its lock, what they call for).

#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "coordinator/plans/plan_manager.h"

namespace shardcoord {

absl::Status PlanManager::Transaction::EndedError() const {
  if (open()) return absl::OkStatus();
  // A group says it is committing; a single plan names its state.
  return absl::AbortedError(absl::StrCat("plan ", id, " already ended (",
                                         closing && fused() ? "committing" : PlanStateName(state),
                                         ")"));
}

std::string PlanManager::Transaction::Qualify(size_t member, const std::string& message) const {
  if (!fused()) return message;
  return absl::StrCat(member < labels.size() ? labels[member] : absl::StrCat("member ", member),
                      ": ", message);
}

std::string PlanManager::Transaction::MemberReason(const std::string& reason) const {
  if (!fused()) return reason;
  return absl::StrCat("group ", id, ": ", reason);
}

absl::StatusOr<PlanManager::Participant*> PlanManager::Transaction::Reporter(
    const WorkerReport& report) {
  auto pit = participants.find(report.rank);
  if (pit == participants.end()) {
    return absl::InvalidArgumentError(
        absl::StrCat("rank ", report.rank, " takes no part in plan ", id));
  }
  Participant& p = pit->second;
  if (p.endpoint.name != report.worker || p.endpoint.incarnation != report.incarnation) {
    return absl::AbortedError(
        absl::StrCat("report for rank ", report.rank, " from worker ", report.worker,
                     " incarnation ", report.incarnation, " is stale: plan ", id, " runs with ",
                     Describe(p.endpoint), " incarnation ", p.endpoint.incarnation));
  }
  if (report.final) {
    p.timing = report.timing;
    p.timing.set_rank(report.rank);
    p.timing.set_worker(report.worker);
    p.timing.set_error(report.error);
  }
  return &p;
}

bool PlanManager::Transaction::MarkExecuted(int64_t rank) {
  Participant& p = participants.at(rank);
  if (p.executed) return false;
  p.executed = true;
  ++executed;
  if (executed == static_cast<int64_t>(participants.size()) && state == PlanState::kPending) {
    state = PlanState::kPrepared;
  }
  return true;
}

void PlanManager::Transaction::MarkReported(Participant& p) {
  p.reported = true;
  ++reported;
  p.bytes_done = p.bytes_expected;
}

bool PlanManager::Transaction::MaybeTransferred(absl::Time now) {
  const int64_t n = static_cast<int64_t>(participants.size());
  if (executed != n || reported != n || !failing.empty()) return false;
  state = PlanState::kTransferred;
  transferred = now;
  return true;
}

bool PlanManager::Transaction::MarkAborted(const std::string& reason, absl::StatusCode code,
                                           absl::Time now) {
  if (failed) return false;
  failed = true;
  error = reason;
  error_code = code;
  state = PlanState::kAborted;
  end = now;
  return true;
}

std::vector<Timer::Id> PlanManager::Transaction::TakeTimers() {
  std::vector<Timer::Id> timers;
  for (Timer::Id* t : {&timer, &grace_timer}) {
    if (*t != 0) timers.push_back(std::exchange(*t, 0));
  }
  return timers;
}

std::string PlanManager::Transaction::Waiting() const {
  std::vector<std::string> waiting;
  for (const auto& [r, p] : participants) {
    if (!p.executed) {
      waiting.push_back(absl::StrCat(Describe(p.endpoint), " (no answer to Execute)"));
    } else if (!p.reported) {
      waiting.push_back(absl::StrCat(Describe(p.endpoint), " (no final report)"));
    }
  }
  return waiting.empty() ? "validation" : absl::StrJoin(waiting, ", ");
}

}  // namespace shardcoord
