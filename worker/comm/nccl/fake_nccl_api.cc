#include "worker/comm/nccl/fake_nccl_api.h"

#include <cstdint>
#include <utility>

#include "absl/strings/str_cat.h"

namespace shardcoord {
namespace nccl {

void FakeNcclApi::SetScript(const Script& script) {
  absl::MutexLock lock(&mu_);
  script_ = script;
  failed_once_ = false;
  async_polls_ = 0;
}

void FakeNcclApi::Label(const void* base, size_t bytes, const std::string& name) {
  absl::MutexLock lock(&mu_);
  labels_[static_cast<const char*>(base)] = Range{bytes, name};
}

std::vector<std::string> FakeNcclApi::calls() const {
  absl::MutexLock lock(&mu_);
  std::vector<std::string> out;
  for (const auto& [entry, lifecycle] : calls_) out.push_back(entry);
  return out;
}

std::vector<std::string> FakeNcclApi::op_calls() const {
  absl::MutexLock lock(&mu_);
  std::vector<std::string> out;
  for (const auto& [entry, lifecycle] : calls_) {
    if (!lifecycle) out.push_back(entry);
  }
  return out;
}

void FakeNcclApi::ClearCalls() {
  absl::MutexLock lock(&mu_);
  calls_.clear();
}

int FakeNcclApi::async_polls() const {
  absl::MutexLock lock(&mu_);
  return async_polls_;
}
int FakeNcclApi::event_polls() const {
  absl::MutexLock lock(&mu_);
  return event_polls_;
}
int FakeNcclApi::live_streams() const {
  absl::MutexLock lock(&mu_);
  return static_cast<int>(streams_.size());
}
int FakeNcclApi::live_events() const {
  absl::MutexLock lock(&mu_);
  return static_cast<int>(events_.size());
}
int FakeNcclApi::aborted_comms() const {
  absl::MutexLock lock(&mu_);
  return aborted_;
}
int FakeNcclApi::destroyed_comms() const {
  absl::MutexLock lock(&mu_);
  return destroyed_;
}
std::vector<std::string> FakeNcclApi::misuse() const {
  absl::MutexLock lock(&mu_);
  return misuse_;
}

void FakeNcclApi::Log(std::string entry, bool lifecycle) {
  calls_.emplace_back(std::move(entry), lifecycle);
}

bool FakeNcclApi::Fails(const std::string& name) {
  if (failed_once_ || script_.fail_call != name) return false;
  failed_once_ = true;
  return true;
}

void FakeNcclApi::CheckLive(NcclComm comm, const std::string& what) {
  auto it = comms_.find(comm);
  if (it == comms_.end()) {
    misuse_.push_back(absl::StrCat(what, " on an unknown communicator"));
  } else if (it->second != CommState::kLive) {
    misuse_.push_back(absl::StrCat(what, " on a communicator already ",
                                   it->second == CommState::kAborted ? "aborted" : "destroyed"));
  }
}

NcclResult FakeNcclApi::StartWork(NcclComm comm) {
  if (script_.in_progress_polls == 0) return NcclResult::kSuccess;
  in_progress_[comm] = script_.in_progress_polls;
  return NcclResult::kInProgress;
}

std::string FakeNcclApi::Ptr(const void* p) const {
  if (p == nullptr) return "null";
  const char* c = static_cast<const char*>(p);
  auto it = labels_.upper_bound(c);
  if (it != labels_.begin()) {
    --it;
    if (c <= it->first + it->second.bytes) {  // One past the end too: an empty tail piece.
      return absl::StrCat(it->second.name, "+", c - it->first);
    }
  }
  return absl::StrCat("0x", absl::Hex(reinterpret_cast<uintptr_t>(p)));
}

NcclResult FakeNcclApi::GetUniqueId(std::string* id) {
  absl::MutexLock lock(&mu_);
  Log("ncclGetUniqueId", true);
  if (script_.unique_id != NcclResult::kSuccess) return script_.unique_id;
  *id = absl::StrCat("fake-nccl-id-", next_id_++);
  id->resize(kNcclUniqueIdBytes, '\0');
  return NcclResult::kSuccess;
}

NcclResult FakeNcclApi::CommInitRank(NcclComm* comm, int nranks, const std::string& id, int rank) {
  absl::MutexLock lock(&mu_);
  Log(absl::StrCat("ncclCommInitRankConfig(nranks=", nranks, ", id=", id.c_str(), ", rank=", rank,
                   ", blocking=0)"),
      true);
  *comm = reinterpret_cast<NcclComm>(static_cast<uintptr_t>(0x10000 + 16 * next_handle_++));
  comms_[*comm] = CommState::kLive;
  if (script_.init != NcclResult::kSuccess) return script_.init;
  return StartWork(*comm);
}

NcclResult FakeNcclApi::CommGetAsyncError(NcclComm comm, NcclResult* async_error) {
  absl::MutexLock lock(&mu_);
  CheckLive(comm, "ncclCommGetAsyncError");
  const int poll = async_polls_++;
  if (script_.async_error_after >= 0 && poll >= script_.async_error_after) {
    *async_error = script_.async_error;
    return NcclResult::kSuccess;
  }
  int& pending = in_progress_[comm];
  if (pending != 0) {
    if (pending > 0) --pending;
    *async_error = NcclResult::kInProgress;
  } else {
    *async_error = NcclResult::kSuccess;
  }
  return NcclResult::kSuccess;
}

NcclResult FakeNcclApi::CommFinalize(NcclComm comm) {
  absl::MutexLock lock(&mu_);
  Log("ncclCommFinalize", false);
  CheckLive(comm, "ncclCommFinalize");
  if (script_.finalize != NcclResult::kSuccess) return script_.finalize;
  return StartWork(comm);
}

NcclResult FakeNcclApi::CommDestroy(NcclComm comm) {
  absl::MutexLock lock(&mu_);
  Log("ncclCommDestroy", false);
  CheckLive(comm, "ncclCommDestroy");
  comms_[comm] = CommState::kDestroyed;
  ++destroyed_;
  return NcclResult::kSuccess;
}

NcclResult FakeNcclApi::CommAbort(NcclComm comm) {
  absl::MutexLock lock(&mu_);
  Log("ncclCommAbort", false);
  CheckLive(comm, "ncclCommAbort");
  comms_[comm] = CommState::kAborted;
  ++aborted_;
  return NcclResult::kSuccess;
}

NcclResult FakeNcclApi::GroupStart() {
  absl::MutexLock lock(&mu_);
  Log("ncclGroupStart", false);
  if (Fails("ncclGroupStart")) return script_.fail_result;
  ++group_depth_;
  return NcclResult::kSuccess;
}

NcclResult FakeNcclApi::GroupEnd() {
  absl::MutexLock lock(&mu_);
  Log("ncclGroupEnd", false);
  if (group_depth_ <= 0) misuse_.push_back("ncclGroupEnd without ncclGroupStart");
  --group_depth_;
  std::set<NcclComm> comms;
  comms.swap(group_comms_);
  if (Fails("ncclGroupEnd")) return script_.fail_result;
  NcclResult r = NcclResult::kSuccess;
  for (NcclComm c : comms) r = StartWork(c);
  return r;
}

NcclResult FakeNcclApi::Issue(const NcclCall& call, NcclComm comm, GpuStream stream) {
  absl::MutexLock lock(&mu_);
  const std::string name = NcclCallName(call.kind);
  std::string entry = absl::StrCat(name, "(");
  using Kind = NcclCall::Kind;
  if (call.kind != Kind::kRecv) absl::StrAppend(&entry, "send=", Ptr(call.send), ", ");
  if (call.kind != Kind::kSend) absl::StrAppend(&entry, "recv=", Ptr(call.recv), ", ");
  absl::StrAppend(&entry, "count=", call.count, ", ", NcclDataTypeName(call.dtype));
  if (call.kind == Kind::kReduceScatter || call.kind == Kind::kAllReduce ||
      call.kind == Kind::kReduce) {
    absl::StrAppend(&entry, ", ", NcclRedOpName(call.op));
  }
  if (call.kind == Kind::kBroadcast || call.kind == Kind::kReduce) {
    absl::StrAppend(&entry, ", root=", call.peer);
  }
  if (call.kind == Kind::kSend || call.kind == Kind::kRecv) {
    absl::StrAppend(&entry, ", peer=", call.peer);
  }
  absl::StrAppend(&entry, ")");
  Log(entry, false);
  CheckLive(comm, name);
  if (!streams_.count(stream)) misuse_.push_back(absl::StrCat(name, " on an unknown stream"));
  if (Fails(name)) return script_.fail_result;
  if (group_depth_ > 0) {
    group_comms_.insert(comm);
    return NcclResult::kSuccess;
  }
  return StartWork(comm);
}

std::string FakeNcclApi::ErrorString(NcclResult result) {
  switch (result) {
    case NcclResult::kRemoteError:
      return "remote process exited or there was a network error";
    case NcclResult::kInvalidUsage:
      return "invalid usage (run with NCCL_DEBUG=WARN for details)";
    default:
      return absl::StrCat("fake error string for ", NcclResultName(result));
  }
}

std::string FakeNcclApi::LastError(NcclComm comm) {
  absl::MutexLock lock(&mu_);
  return script_.last_error;
}

absl::Status FakeNcclApi::SetDevice(int device) {
  absl::MutexLock lock(&mu_);
  Log(absl::StrCat("cudaSetDevice(", device, ")"), true);
  return script_.set_device;
}

void* FakeNcclApi::NewHandle(const char* call, uintptr_t base, std::set<void*>* live) {
  Log(call, true);
  void* handle = reinterpret_cast<void*>(base + 16 * next_handle_++);
  live->insert(handle);
  return handle;
}

void FakeNcclApi::DropHandle(const char* call, void* handle, std::set<void*>* live,
                             const char* what) {
  Log(call, true);
  if (live->erase(handle) == 0) misuse_.push_back(absl::StrCat(call, " of an unknown ", what));
}

absl::Status FakeNcclApi::StreamCreate(GpuStream* stream) {
  absl::MutexLock lock(&mu_);
  *stream = NewHandle("cudaStreamCreate", 0x20000, &streams_);
  return absl::OkStatus();
}

absl::Status FakeNcclApi::StreamDestroy(GpuStream stream) {
  absl::MutexLock lock(&mu_);
  DropHandle("cudaStreamDestroy", stream, &streams_, "stream");
  return absl::OkStatus();
}

absl::Status FakeNcclApi::EventCreate(GpuEvent* event) {
  absl::MutexLock lock(&mu_);
  *event = NewHandle("cudaEventCreate", 0x30000, &events_);
  return absl::OkStatus();
}

absl::Status FakeNcclApi::EventDestroy(GpuEvent event) {
  absl::MutexLock lock(&mu_);
  DropHandle("cudaEventDestroy", event, &events_, "event");
  return absl::OkStatus();
}

absl::Status FakeNcclApi::EventRecord(GpuEvent event, GpuStream stream) {
  absl::MutexLock lock(&mu_);
  Log("cudaEventRecord", true);
  if (!events_.count(event)) misuse_.push_back("cudaEventRecord of an unknown event");
  if (!streams_.count(stream)) misuse_.push_back("cudaEventRecord on an unknown stream");
  event_pending_[event] = script_.event_pending_polls;
  return absl::OkStatus();
}

absl::StatusOr<bool> FakeNcclApi::EventQuery(GpuEvent event) {
  absl::StatusOr<bool> result;
  std::function<void()> hook;
  {
    absl::MutexLock lock(&mu_);
    ++event_polls_;
    hook = script_.on_event_poll;
    if (!events_.count(event)) misuse_.push_back("cudaEventQuery of an unknown event");
    if (!script_.event_query.ok()) {
      result = script_.event_query;
    } else {
      int& pending = event_pending_[event];
      result = pending == 0;
      if (pending > 0) --pending;
    }
  }
  if (hook) hook();
  return result;
}

}  // namespace nccl
}  // namespace shardcoord
