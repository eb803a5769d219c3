#ifndef SHARDCOORD_WORKER_TESTING_WORKER_CORE_TEST_UTIL_H_
#define SHARDCOORD_WORKER_TESTING_WORKER_CORE_TEST_UTIL_H_

// What the WorkerCore tests send and a reporter that keeps what the workers report.

#include <cstdint>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/types/span.h"
#include "proto/shardcoord.pb.h"
#include "sharding/box.h"
#include "sharding/layout.h"
#include "worker/control/coordinator_rpc.h"
#include "worker/control/worker_core.h"

namespace shardcoord {
namespace worker_testing {

// Keeps every report it gets.
class RecordingReporter : public ChunkReporter {
 public:
  absl::Status ReportChunks(const v1::ReportChunksRequest& request) override {
    absl::MutexLock lock(&mu_);
    reports_.push_back(request);
    return absl::OkStatus();
  }
  // Waits for `n` final reports of `plan_id` and returns them. Per plan: a peer of an
  // aborted plan may still report its own failure (its step broke when another rank's
  // communicator went), and that report must not count for the next plan.
  std::vector<v1::ReportChunksRequest> WaitFinals(int n, absl::string_view plan_id) {
    absl::MutexLock lock(&mu_);
    auto enough = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      return FinalsLocked(plan_id).size() >= static_cast<size_t>(n);
    };
    mu_.Await(absl::Condition(&enough));
    return FinalsLocked(plan_id);
  }
  std::vector<v1::ReportChunksRequest> Reports() {
    absl::MutexLock lock(&mu_);
    return reports_;
  }

 private:
  std::vector<v1::ReportChunksRequest> FinalsLocked(absl::string_view plan_id) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    std::vector<v1::ReportChunksRequest> out;
    for (const auto& r : reports_) {
      if (r.final() && r.plan_id() == plan_id) out.push_back(r);
    }
    return out;
  }

  absl::Mutex mu_;
  std::vector<v1::ReportChunksRequest> reports_ ABSL_GUARDED_BY(mu_);
};

// A Fill of `tensor` at `version`: `chunks` of a tensor of `global_shape`.
v1::FillRequest FillRequestFor(const std::string& tensor, const RankChunks& chunks,
                               absl::Span<const int64_t> global_shape, v1::InitKind init,
                               v1::DType dtype = v1::F32, int64_t version = 1);

// The bytes of `box` of (tensor, version) on `core`, read in messages of at most `max_bytes`;
// each message's size goes to `message_bytes` when given. The test fails when opening or a
// message fails (reading stops there) or the bytes are not the reader's total.
std::string ReadAllBytes(WorkerCore& core, const std::string& tensor, int64_t version,
                         const Box& box, int64_t max_bytes,
                         std::vector<int64_t>* message_bytes = nullptr);

}  // namespace worker_testing
}  // namespace shardcoord

#endif  // SHARDCOORD_WORKER_TESTING_WORKER_CORE_TEST_UTIL_H_
