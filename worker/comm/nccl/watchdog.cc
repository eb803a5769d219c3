#include "worker/comm/nccl/watchdog.h"

#include "absl/strings/str_cat.h"

namespace shardcoord {
namespace nccl {

std::string DescribeOp(const OpLabel& label) {
  std::string s = absl::StrCat("NCCL ", label.op);
  if (label.has_tag) absl::StrAppend(&s, " (tag ", label.tag, ")");
  absl::StrAppend(&s, " on ", label.group);
  return s;
}

std::string NcclWatchdog::ResultDetail(NcclComm comm, NcclResult result) {
  std::string s = absl::StrCat(NcclResultName(result), ": ", api_->ErrorString(result));
  const std::string last = api_->LastError(comm);
  if (!last.empty()) absl::StrAppend(&s, " (", last, ")");
  return s;
}

absl::Status NcclWatchdog::Abort(NcclComm comm, absl::StatusCode code, const OpLabel& label,
                                 const std::string& detail) {
  std::string message = absl::StrCat(DescribeOp(label), " ", detail);
  const NcclResult r = api_->CommAbort(comm);
  if (r == NcclResult::kSuccess || r == NcclResult::kInProgress) {
    absl::StrAppend(&message, "; communicator aborted");
  } else {
    absl::StrAppend(&message, "; ncclCommAbort returned ", NcclResultName(r));
  }
  return absl::Status(code, message);
}

absl::Status NcclWatchdog::AbortAfterCall(NcclComm comm, NcclResult result, const char* call,
                                          const OpLabel& label) {
  return Abort(comm, absl::StatusCode::kAborted, label,
               absl::StrCat("failed: ", call, " returned ", ResultDetail(comm, result)));
}

absl::Status NcclWatchdog::Await(NcclComm comm, GpuEvent event, absl::Time deadline,
                                 const OpLabel& label, const std::atomic<bool>* cancel) {
  int polls = 0;
  bool enqueued = false;
  while (true) {
    if (cancel != nullptr && cancel->load()) {
      return Abort(comm, absl::StatusCode::kAborted, label, "was cancelled by an abort request");
    }
    NcclResult async = NcclResult::kSuccess;
    const NcclResult r = api_->CommGetAsyncError(comm, &async);
    if (r != NcclResult::kSuccess) {
      return Abort(comm, absl::StatusCode::kAborted, label,
                   absl::StrCat("failed: ncclCommGetAsyncError returned ", ResultDetail(comm, r)));
    }
    if (async != NcclResult::kSuccess && async != NcclResult::kInProgress) {
      return Abort(comm, absl::StatusCode::kAborted, label,
                   absl::StrCat("failed: ", ResultDetail(comm, async)));
    }
    enqueued = async == NcclResult::kSuccess;
    if (enqueued) {
      if (event == nullptr) return absl::OkStatus();
      absl::StatusOr<bool> done = api_->EventQuery(event);
      if (!done.ok()) {
        return Abort(comm, absl::StatusCode::kAborted, label,
                     absl::StrCat("failed: ", done.status().message()));
      }
      if (*done) return absl::OkStatus();
    }
    if (clock_->Now() >= deadline) {
      return Abort(comm, absl::StatusCode::kDeadlineExceeded, label,
                   absl::StrCat("did not complete within ", absl::FormatDuration(label.timeout),
                                enqueued ? " (enqueued, waiting for the GPU)"
                                         : " (still in ncclInProgress)"));
    }
    if (++polls > options_.spin_polls) clock_->SleepFor(options_.poll_interval);
  }
}

}  // namespace nccl
}  // namespace shardcoord
