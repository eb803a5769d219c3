#ifndef SHARDCOORD_WORKER_COMM_NCCL_FAKE_NCCL_API_H_
#define SHARDCOORD_WORKER_COMM_NCCL_FAKE_NCCL_API_H_

#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "worker/comm/nccl/nccl_api.h"

namespace shardcoord {
namespace nccl {

// An NcclApi that moves no data: it records the NCCL calls made through it, as text, and
// plays a script of results so tests drive the non-blocking protocol, the watchdog and the
// abort path without a GPU. Thread-safe. Handles are fake addresses, never dereferenced.
class FakeNcclApi : public NcclApi {
 public:
  // --- Script (set before the calls it affects) ---
  struct Script {
    NcclResult unique_id = NcclResult::kSuccess;  // GetUniqueId's result.
    NcclResult init = NcclResult::kSuccess;       // CommInitRank's result.
    NcclResult finalize = NcclResult::kSuccess;   // CommFinalize's result.
    // How many CommGetAsyncError polls report ncclInProgress after a call that started
    // non-blocking work (init, an ungrouped call, ncclGroupEnd, finalize); -1 = forever.
    // When positive, those calls return kInProgress as non-blocking NCCL does.
    int in_progress_polls = 0;
    // How many EventQuery calls report "not done" after each EventRecord; -1 = forever.
    int event_pending_polls = 0;
    // From the async_error_after-th CommGetAsyncError on (0 = the first), the async state is
    // `async_error`; -1 = never.
    int async_error_after = -1;
    NcclResult async_error = NcclResult::kRemoteError;
    // The first call named `fail_call` ("ncclGroupEnd", "ncclSend", ...) returns fail_result.
    std::string fail_call;
    NcclResult fail_result = NcclResult::kInvalidUsage;
    absl::Status set_device;   // SetDevice's status.
    absl::Status event_query;  // EventQuery's status when not OK.
    std::string last_error;    // LastError().
    // Called after every EventQuery, outside the fake's lock (tests use it to act while an
    // op is waiting).
    std::function<void()> on_event_poll;
  };
  void SetScript(const Script& script);

  // Names a buffer in the call log: a pointer into [base, base+bytes) prints "name+offset".
  void Label(const void* base, size_t bytes, const std::string& name);

  // --- Observations ---
  // Every call but the polls (CommGetAsyncError, EventQuery), in order, as text:
  // "ncclGroupStart", "ncclAllGather(send=in+0, recv=out+0, count=8, u8)", ...
  std::vector<std::string> calls() const;
  // calls() without the lifecycle entries (init, event record, stream/event create/destroy,
  // SetDevice): just what an op issued.
  std::vector<std::string> op_calls() const;
  void ClearCalls();
  int async_polls() const;
  int event_polls() const;
  int live_streams() const;
  int live_events() const;
  int aborted_comms() const;
  int destroyed_comms() const;
  // Calls that used a communicator after it was aborted or destroyed, or a handle it never
  // made; empty when the code under test behaved.
  std::vector<std::string> misuse() const;

  // --- NcclApi ---
  NcclResult GetUniqueId(std::string* id) override;
  NcclResult CommInitRank(NcclComm* comm, int nranks, const std::string& id, int rank) override;
  NcclResult CommGetAsyncError(NcclComm comm, NcclResult* async_error) override;
  NcclResult CommFinalize(NcclComm comm) override;
  NcclResult CommDestroy(NcclComm comm) override;
  NcclResult CommAbort(NcclComm comm) override;
  NcclResult GroupStart() override;
  NcclResult GroupEnd() override;
  NcclResult Issue(const NcclCall& call, NcclComm comm, GpuStream stream) override;
  std::string ErrorString(NcclResult result) override;
  std::string LastError(NcclComm comm) override;
  absl::Status SetDevice(int device) override;
  absl::Status StreamCreate(GpuStream* stream) override;
  absl::Status StreamDestroy(GpuStream stream) override;
  absl::Status EventCreate(GpuEvent* event) override;
  absl::Status EventDestroy(GpuEvent event) override;
  absl::Status EventRecord(GpuEvent event, GpuStream stream) override;
  absl::StatusOr<bool> EventQuery(GpuEvent event) override;

 private:
  enum class CommState { kLive, kAborted, kDestroyed };

  void Log(std::string entry, bool lifecycle) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  bool Fails(const std::string& name) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void CheckLive(NcclComm comm, const std::string& what) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Starts non-blocking work on `comm`: kInProgress when the script says so.
  NcclResult StartWork(NcclComm comm) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  std::string Ptr(const void* p) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The cudaStreamCreate / cudaEventCreate `call`: a new handle at `base` plus a fresh offset,
  // kept in `live`.
  void* NewHandle(const char* call, uintptr_t base, std::set<void*>* live)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The cudaStreamDestroy / cudaEventDestroy `call` of `handle`: gone from `live`, a misuse
  // naming `what` ("stream") when it was not there.
  void DropHandle(const char* call, void* handle, std::set<void*>* live, const char* what)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  mutable absl::Mutex mu_;
  Script script_ ABSL_GUARDED_BY(mu_);
  bool failed_once_ ABSL_GUARDED_BY(mu_) = false;
  struct Range {
    size_t bytes;
    std::string name;
  };
  std::map<const char*, Range> labels_ ABSL_GUARDED_BY(mu_);
  std::vector<std::pair<std::string, bool>> calls_ ABSL_GUARDED_BY(mu_);
  std::vector<std::string> misuse_ ABSL_GUARDED_BY(mu_);
  std::map<NcclComm, CommState> comms_ ABSL_GUARDED_BY(mu_);
  std::map<NcclComm, int> in_progress_ ABSL_GUARDED_BY(mu_);
  std::map<GpuEvent, int> event_pending_ ABSL_GUARDED_BY(mu_);
  std::set<GpuStream> streams_ ABSL_GUARDED_BY(mu_);
  std::set<GpuEvent> events_ ABSL_GUARDED_BY(mu_);
  int group_depth_ ABSL_GUARDED_BY(mu_) = 0;
  std::set<NcclComm> group_comms_ ABSL_GUARDED_BY(mu_);  // Issued on inside the open group.
  int next_handle_ ABSL_GUARDED_BY(mu_) = 1;
  int next_id_ ABSL_GUARDED_BY(mu_) = 1;
  int async_polls_ ABSL_GUARDED_BY(mu_) = 0;
  int event_polls_ ABSL_GUARDED_BY(mu_) = 0;
  int aborted_ ABSL_GUARDED_BY(mu_) = 0;
  int destroyed_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace nccl
}  // namespace shardcoord

#endif  // SHARDCOORD_WORKER_COMM_NCCL_FAKE_NCCL_API_H_
