#include "worker/comm/nccl/nccl_communicator.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "worker/comm/nccl/nccl_lowering.h"

namespace shardcoord {
namespace nccl {
namespace {

bool Started(NcclResult r) { return r == NcclResult::kSuccess || r == NcclResult::kInProgress; }

// Adds context to a status, keeping its code.
absl::Status WithContext(const absl::Status& s, absl::string_view context) {
  return absl::Status(s.code(), absl::StrCat(context, ": ", s.message()));
}

}  // namespace

std::string NcclIdKey(const CommunicatorSpec& spec) {
  return absl::StrCat(spec.key_prefix, "/nccl_id/", absl::StrJoin(spec.ranks, ","), "/",
                      absl::StrJoin(spec.incarnations, ","));
}

std::string DescribeGroup(const CommunicatorSpec& spec) {
  return absl::StrCat("group [", absl::StrJoin(spec.ranks, ","), "] (prefix '", spec.key_prefix,
                      "')");
}

NcclCommunicator::NcclCommunicator(std::shared_ptr<NcclApi> api, std::shared_ptr<Clock> clock,
                                   NcclComm comm, GpuStream stream, GpuEvent event, int rank,
                                   int size, std::string group, absl::Duration default_timeout,
                                   NcclFactoryOptions options)
    : api_(std::move(api)),
      clock_(std::move(clock)),
      stream_(stream),
      event_(event),
      rank_(rank),
      size_(size),
      group_(std::move(group)),
      default_timeout_(default_timeout),
      options_(options),
      watchdog_(api_.get(), clock_.get(), options.watchdog),
      comm_(comm) {}

NcclCommunicator::~NcclCommunicator() {
  absl::MutexLock lock(&mu_);
  (void)api_->SetDevice(options_.device);
  if (comm_ != nullptr) {
    // ncclCommDestroy without a finalize may wait on peers; a non-blocking finalize polled
    // by the watchdog cannot hang, and falls back to an abort.
    OpLabel label{"finalize", false, 0, group_, options_.finalize_timeout};
    const NcclResult r = api_->CommFinalize(comm_);
    if (!Started(r)) {
      (void)watchdog_.AbortAfterCall(comm_, r, "ncclCommFinalize", label);
    } else if (watchdog_.Await(comm_, nullptr, clock_->Now() + options_.finalize_timeout, label)
                   .ok()) {
      (void)api_->CommDestroy(comm_);
    }
    comm_ = nullptr;
  }
  (void)api_->EventDestroy(event_);
  (void)api_->StreamDestroy(stream_);
}

absl::Status NcclCommunicator::Fail(absl::Status status) {
  comm_ = nullptr;  // The watchdog aborted it.
  if (!broken_.load()) first_error_ = status;
  broken_.store(true);
  return status;
}

void NcclCommunicator::Abort(absl::string_view reason) {
  cancel_.store(true);
  // An op in flight sees cancel_ within one poll, aborts and releases mu_.
  absl::MutexLock lock(&mu_);
  if (comm_ == nullptr) return;
  OpLabel label{"communicator", false, 0, group_, default_timeout_};
  (void)Fail(watchdog_.Abort(comm_, absl::StatusCode::kAborted, label,
                             absl::StrCat("was aborted: ", reason)));
}

absl::Status NcclCommunicator::Run(const char* op, const CommOptions& options,
                                   absl::StatusOr<NcclLaunch> launch) {
  if (!launch.ok()) return launch.status();
  const absl::Duration timeout =
      options.timeout > absl::ZeroDuration() ? options.timeout : default_timeout_;
  const OpLabel label{op, true, options.tag, group_, timeout};
  absl::MutexLock lock(&mu_);
  if (broken_.load()) {
    return absl::FailedPreconditionError(
        absl::StrCat(DescribeOp(label), ": the communicator is broken: ", first_error_.message()));
  }
  if (cancel_.load()) {
    return Fail(watchdog_.Abort(comm_, absl::StatusCode::kAborted, label,
                                "was cancelled by an abort request"));
  }
  if (launch->calls.empty()) return absl::OkStatus();
  const absl::Time deadline = clock_->Now() + timeout;

  if (absl::Status s = api_->SetDevice(options_.device); !s.ok()) {
    return Fail(watchdog_.Abort(comm_, absl::StatusCode::kAborted, label,
                                absl::StrCat("failed: ", s.message())));
  }
  if (launch->grouped) {
    const NcclResult r = api_->GroupStart();
    if (r != NcclResult::kSuccess) {
      return Fail(watchdog_.AbortAfterCall(comm_, r, "ncclGroupStart", label));
    }
  }
  for (const NcclCall& call : launch->calls) {
    const NcclResult r = api_->Issue(call, comm_, stream_);
    if (!Started(r)) {
      // Close the group first: ncclGroupStart's nesting depth is per thread, and a thread
      // left inside a group would hold back every later NCCL call it makes.
      if (launch->grouped) (void)api_->GroupEnd();
      const std::string name = NcclCallName(call.kind);
      return Fail(watchdog_.AbortAfterCall(comm_, r, name.c_str(), label));
    }
  }
  if (launch->grouped) {
    const NcclResult r = api_->GroupEnd();
    if (!Started(r)) return Fail(watchdog_.AbortAfterCall(comm_, r, "ncclGroupEnd", label));
  }
  // Non-blocking: the calls may still be in ncclInProgress; the stream holds the work only
  // once the async state is ncclSuccess, so the event is recorded after that.
  if (absl::Status s = watchdog_.Await(comm_, nullptr, deadline, label, &cancel_); !s.ok()) {
    return Fail(s);
  }
  if (absl::Status s = api_->EventRecord(event_, stream_); !s.ok()) {
    return Fail(watchdog_.Abort(comm_, absl::StatusCode::kAborted, label,
                                absl::StrCat("failed: ", s.message())));
  }
  if (absl::Status s = watchdog_.Await(comm_, event_, deadline, label, &cancel_); !s.ok()) {
    return Fail(s);
  }
  return absl::OkStatus();
}

absl::Status NcclCommunicator::AllGatherV(const void* send, int64_t send_bytes, void* recv,
                                          absl::Span<const int64_t> recv_bytes,
                                          const CommOptions& options) {
  return Run("AllGatherV", options,
             LowerAllGatherV(rank_, size_, send, send_bytes, recv, recv_bytes));
}

absl::Status NcclCommunicator::AllToAllV(const void* send, absl::Span<const int64_t> send_bytes,
                                         void* recv, absl::Span<const int64_t> recv_bytes,
                                         const CommOptions& options) {
  return Run("AllToAllV", options,
             LowerAllToAllV(rank_, size_, send, send_bytes, recv, recv_bytes));
}

absl::Status NcclCommunicator::ReduceScatterV(const void* send, void* recv,
                                              absl::Span<const int64_t> recv_elements, DType dtype,
                                              ReduceOp op, const CommOptions& options) {
  return Run("ReduceScatterV", options,
             LowerReduceScatterV(rank_, size_, send, recv, recv_elements, dtype, op));
}

absl::Status NcclCommunicator::AllReduce(const void* send, void* recv, int64_t elements,
                                         DType dtype, ReduceOp op, const CommOptions& options) {
  return Run("AllReduce", options, LowerAllReduce(send, recv, elements, dtype, op));
}

absl::Status NcclCommunicator::Broadcast(void* data, int64_t bytes, int root,
                                         const CommOptions& options) {
  return Run("Broadcast", options, LowerBroadcast(rank_, size_, data, bytes, root));
}

absl::Status NcclCommunicator::SendRecv(absl::Span<const SendOp> sends,
                                        absl::Span<const RecvOp> recvs,
                                        const CommOptions& options) {
  return Run("SendRecv", options, LowerSendRecv(rank_, size_, sends, recvs));
}

NcclCommunicatorFactory::NcclCommunicatorFactory(std::shared_ptr<KvClient> kv,
                                                 std::shared_ptr<NcclApi> api,
                                                 std::shared_ptr<Clock> clock,
                                                 NcclFactoryOptions options)
    : kv_(std::move(kv)), api_(std::move(api)), clock_(std::move(clock)), options_(options) {}

absl::StatusOr<std::shared_ptr<Communicator>> NcclCommunicatorFactory::Create(
    const CommunicatorSpec& spec) {
  if (absl::Status s = ValidateCommunicatorSpec(spec); !s.ok()) return s;
  const int group_rank = GroupRankOf(spec);
  const int size = static_cast<int>(spec.ranks.size());
  const std::string group = DescribeGroup(spec);
  const std::string key = NcclIdKey(spec);
  const absl::Time deadline = clock_->Now() + spec.timeout;

  std::string id;
  if (group_rank == 0) {
    const NcclResult r = api_->GetUniqueId(&id);
    if (r != NcclResult::kSuccess) {
      return absl::UnavailableError(absl::StrCat("ncclGetUniqueId for ", group, " failed: ",
                                                 NcclResultName(r), ": ", api_->ErrorString(r)));
    }
    if (size > 1) {
      if (absl::Status s = kv_->Set(key, id); !s.ok()) {
        return WithContext(
            s, absl::StrCat("publishing the NCCL id of ", group, " under key '", key, "'"));
      }
    }
  } else {
    const absl::Duration left = deadline - clock_->Now();
    absl::StatusOr<std::string> got =
        kv_->Get(key, left > absl::ZeroDuration() ? left : absl::ZeroDuration());
    if (!got.ok()) {
      return WithContext(got.status(), absl::StrCat("waiting for the NCCL id of ", group,
                                                    " under key '", key, "'"));
    }
    id = *std::move(got);
  }
  if (id.size() != static_cast<size_t>(kNcclUniqueIdBytes)) {
    return absl::InternalError(absl::StrCat("the NCCL id of ", group, " under key '", key, "' has ",
                                            id.size(), " bytes, not ", kNcclUniqueIdBytes));
  }

  if (absl::Status s = api_->SetDevice(options_.device); !s.ok()) {
    return WithContext(s, absl::StrCat("creating the NCCL communicator of ", group));
  }
  GpuStream stream = nullptr;
  GpuEvent event = nullptr;
  if (absl::Status s = api_->StreamCreate(&stream); !s.ok()) {
    return WithContext(s, absl::StrCat("creating the NCCL communicator of ", group));
  }
  if (absl::Status s = api_->EventCreate(&event); !s.ok()) {
    (void)api_->StreamDestroy(stream);
    return WithContext(s, absl::StrCat("creating the NCCL communicator of ", group));
  }
  auto release = [&] {
    (void)api_->EventDestroy(event);
    (void)api_->StreamDestroy(stream);
  };

  NcclWatchdog watchdog(api_.get(), clock_.get(), options_.watchdog);
  const OpLabel label{absl::StrCat("init of rank ", group_rank, "/", size), false, 0, group,
                      spec.timeout};
  NcclComm comm = nullptr;
  const NcclResult r = api_->CommInitRank(&comm, size, id, group_rank);
  if (!Started(r)) {
    absl::Status s =
        comm != nullptr
            ? watchdog.AbortAfterCall(comm, r, "ncclCommInitRankConfig", label)
            : absl::AbortedError(absl::StrCat(
                  DescribeOp(label), " failed: ncclCommInitRankConfig returned ", NcclResultName(r),
                  ": ", api_->ErrorString(r), " ", api_->LastError(nullptr)));
    release();
    return s;
  }
  if (absl::Status s = watchdog.Await(comm, nullptr, deadline, label); !s.ok()) {
    release();
    return s;
  }
  return std::shared_ptr<Communicator>(std::make_shared<NcclCommunicator>(
      api_, clock_, comm, stream, event, group_rank, size, group, spec.timeout, options_));
}

}  // namespace nccl
}  // namespace shardcoord
