#ifndef SHARDCOORD_COORDINATOR_TRANSFERS_TRANSFER_MANAGER_INTERNAL_H_
#define SHARDCOORD_COORDINATOR_TRANSFERS_TRANSFER_MANAGER_INTERNAL_H_

// What the parts of TransferManager share (transfer_manager.cc, transfer_prepare.cc,
// transfer_run.cc). Not for other rooms.

#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "common/start_end_join.h"
#include "coordinator/transfers/transfer_manager.h"

namespace shardcoord {

// One run: from the moment it holds its transfer (maybe preparing it first) to its end.
struct TransferManager::RunRecord {
  std::string id;
  std::string transfer;
  std::shared_ptr<const Prepared> prepared;
  int64_t version = 0;
  int preparations = 0;  // Made by this run.
  double prepare_seconds = 0;
  bool started = false;  // Holds the members (TensorManager::StartTransferRun).
  bool sent = false;     // RunTransfer went to every participant.
  bool closing = false;  // Validated, committing: no longer abortable.
  bool over = false;
  PlanState state = PlanState::kPending;
  std::string error;
  std::string failing;  // The first worker error, while in the failure grace.
  absl::Time start;
  absl::Time transferred = absl::InfinitePast();
  absl::Time end = absl::InfiniteFuture();
  std::string comm_prefix;
  std::vector<std::optional<v1::RunTransferWorkerResponse>> answers;  // By participant.
  size_t answered = 0;
  int64_t bytes_done = 0;
  Timer::Id timer = 0;
  Timer::Id grace_timer = 0;
  int64_t ticket = 0;
  int64_t bucket_bytes = 0;
  std::string waiting_for_memory;
  std::map<int64_t, WatchFn> watchers;
  int64_t seq = 0;
  RunCallback started_fn;
  // The end waits until the caller heard the start (admission may admit, and a run end, on
  // another thread before Request returned).
  std::shared_ptr<StartEndJoin<std::pair<absl::Status, v1::RunTransferResponse>>> join;

  bool open() const { return started && !closing && !over; }
};

// What a started run's end hands on once mu_ is released (TransferManager::EndRunLocked).
struct TransferManager::RunEnd {
  std::vector<Timer::Id> timers;
  int64_t ticket = 0;
  WatchCalls calls;
  PlanProgress progress;  // The final one.
  v1::RunTransferResponse response;
  std::shared_ptr<StartEndJoin<std::pair<absl::Status, v1::RunTransferResponse>>> join;
};

namespace internal_transfers {

// Store kinds: the header (a v1::TransferInfo with name, members, runs, replans, version),
// rewritten by every run, and the pages of copies (v1::CreateTransferRequest, "NAME#000000").
inline constexpr char kTransferKind[] = "transfer";
inline constexpr char kCopiesKind[] = "transfer_copies";
std::string PageName(const std::string& transfer, int64_t page);

// "t-3" or "t-<ns>.3"; transfer ids "NAME@3" or "NAME@<ns>.3".
std::string RunId(const std::string& ns, int64_t n);
std::string TransferId(const std::string& name, const std::string& ns, int64_t n);

}  // namespace internal_transfers
}  // namespace shardcoord

#endif  // SHARDCOORD_COORDINATOR_TRANSFERS_TRANSFER_MANAGER_INTERNAL_H_
