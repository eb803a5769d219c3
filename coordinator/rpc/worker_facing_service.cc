#include "coordinator/rpc/worker_facing_service.h"

#include <algorithm>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/tls_options.h"
#include "coordinator/rpc/grpc_auth.h"
#include "proto/convert.h"
#include "proto/grpc_credentials.h"
#include "proto/grpc_status.h"
#include "sharding/limits.h"
#include "sharding/names.h"
#include "spdlog/spdlog.h"

namespace shardcoord {
namespace {

// Longest rendezvous wait a worker may ask for: a reactor waiting on a cancelled call lives
// this long at most.
constexpr absl::Duration kMaxWait = absl::Hours(1);

grpc::ServerUnaryReactor* Done(grpc::CallbackServerContext* ctx, const absl::Status& s) {
  grpc::ServerUnaryReactor* r = ctx->DefaultReactor();
  r->Finish(ToGrpcStatus(s));
  return r;
}

}  // namespace

grpc::ServerUnaryReactor* WorkerFacingService::RegisterWorker(grpc::CallbackServerContext* ctx,
                                                              const v1::RegisterWorkerRequest* req,
                                                              v1::RegisterWorkerResponse* resp) {
  if (absl::Status a = Authorize(ctx, "RegisterWorker"); !a.ok()) return Done(ctx, a);
  if (absl::Status n = CheckWorkerName(ctx, req->name()); !n.ok()) return Done(ctx, n);
  if (req->bucket_bytes() < 0) {
    return Done(ctx, absl::InvalidArgumentError(
                         absl::StrCat("bucket_bytes = ", req->bucket_bytes(), " must be >= 0")));
  }
  std::vector<HeldBuffer> held;
  held.reserve(req->held_size());
  for (int i = 0; i < req->held_size(); ++i) {
    const v1::HeldBuffer& h = req->held(i);
    HeldBuffer b;
    b.tensor = h.tensor();
    b.version = h.version();
    absl::StatusOr<RankChunks> chunks =
        RankChunksFromProto(h.chunks(), absl::StrCat("held[", i, "].chunks"), &b.checksums);
    if (!chunks.ok()) return Done(ctx, chunks.status());
    if (b.tensor.empty()) {
      return Done(ctx, absl::InvalidArgumentError(absl::StrCat("held[", i, "].tensor: empty")));
    }
    b.chunks = *std::move(chunks);
    held.push_back(std::move(b));
  }
  for (const auto& [field, value] :
       {std::make_pair("memory_budget_bytes", req->memory_budget_bytes()),
        std::make_pair("memory_used_bytes", req->memory_used_bytes()),
        std::make_pair("memory_peak_bytes", req->memory_peak_bytes()),
        std::make_pair("bucket_bytes", req->bucket_bytes())}) {
    if (value < 0) {
      return Done(ctx, absl::InvalidArgumentError(absl::StrCat(field, ": ", value, " < 0")));
    }
  }
  WorkerSpec spec{req->name(),    req->host(),    req->device(),
                  req->address(), req->backend(), req->local_socket()};
  spec.memory =
      WorkerMemory{req->memory_budget_bytes(), req->memory_used_bytes(), req->memory_peak_bytes()};
  spec.bucket_bytes = req->bucket_bytes();
  absl::StatusOr<WorkerRegistration::Registered> r = registration_->Register(spec, held);
  if (!r.ok()) return Done(ctx, r.status());
  resp->set_rank(r->worker.rank);
  resp->set_incarnation(r->worker.incarnation);
  resp->set_heartbeat_interval_ms(absl::ToInt64Milliseconds(heartbeat_interval_));
  for (const auto& [tensor, version] : r->drop) {
    v1::HeldBuffer* d = resp->add_drop();
    d->set_tensor(tensor);
    d->set_version(version);
  }
  return Done(ctx, absl::OkStatus());
}

grpc::ServerUnaryReactor* WorkerFacingService::Heartbeat(grpc::CallbackServerContext* ctx,
                                                         const v1::HeartbeatRequest* req,
                                                         v1::HeartbeatResponse*) {
  if (absl::Status a = Authorize(ctx, "Heartbeat"); !a.ok()) return Done(ctx, a);
  if (absl::Status n = CheckWorkerName(ctx, req->name()); !n.ok()) return Done(ctx, n);
  if (req->memory_budget_bytes() > 0) {
    // Reported memory (a worker of before issue 10 sends none).
    const WorkerMemory memory{req->memory_budget_bytes(),
                              std::max<int64_t>(0, req->memory_used_bytes()),
                              std::max<int64_t>(0, req->memory_peak_bytes())};
    return Done(ctx, workers_->Heartbeat(req->name(), req->incarnation(), &memory));
  }
  return Done(ctx, workers_->Heartbeat(req->name(), req->incarnation()));
}

grpc::ServerUnaryReactor* WorkerFacingService::KvSet(grpc::CallbackServerContext* ctx,
                                                     const v1::KvSetRequest* req,
                                                     v1::KvSetResponse*) {
  if (absl::Status a = Authorize(ctx, "KvSet"); !a.ok()) return Done(ctx, a);
  return Done(ctx, kv_->Set(req->key(), req->value()));
}

grpc::ServerUnaryReactor* WorkerFacingService::KvGet(grpc::CallbackServerContext* ctx,
                                                     const v1::KvGetRequest* req,
                                                     v1::KvGetResponse* resp) {
  if (absl::Status a = Authorize(ctx, "KvGet"); !a.ok()) return Done(ctx, a);
  if (req->timeout_ms() < 0) {
    return Done(ctx, absl::InvalidArgumentError(
                         absl::StrCat("timeout_ms = ", req->timeout_ms(), " must be >= 0")));
  }
  if (req->timeout_ms() == 0) {
    absl::StatusOr<std::string> v = kv_->Get(req->key());
    if (v.ok()) resp->set_value(*std::move(v));
    return Done(ctx, v.status());
  }
  grpc::ServerUnaryReactor* reactor = ctx->DefaultReactor();
  const absl::Time deadline =
      clock_->Now() + std::min(absl::Milliseconds(req->timeout_ms()), kMaxWait);
  kv_->GetAsync(req->key(), deadline, [reactor, resp](absl::StatusOr<std::string> v) {
    if (v.ok()) resp->set_value(*std::move(v));
    reactor->Finish(ToGrpcStatus(v.status()));
  });
  return reactor;
}

grpc::ServerUnaryReactor* WorkerFacingService::Barrier(grpc::CallbackServerContext* ctx,
                                                       const v1::BarrierRequest* req,
                                                       v1::BarrierResponse*) {
  if (absl::Status a = Authorize(ctx, "Barrier"); !a.ok()) return Done(ctx, a);
  if (req->timeout_ms() <= 0) {
    return Done(ctx, absl::InvalidArgumentError(
                         absl::StrCat("timeout_ms = ", req->timeout_ms(), " must be > 0")));
  }
  grpc::ServerUnaryReactor* reactor = ctx->DefaultReactor();
  const absl::Time deadline =
      clock_->Now() + std::min(absl::Milliseconds(req->timeout_ms()), kMaxWait);
  kv_->Barrier(req->key(), req->participants(), req->member(), deadline,
               [reactor](absl::Status s) { reactor->Finish(ToGrpcStatus(s)); });
  return reactor;
}

grpc::ServerUnaryReactor* WorkerFacingService::ReportChunks(grpc::CallbackServerContext* ctx,
                                                            const v1::ReportChunksRequest* req,
                                                            v1::ReportChunksResponse*) {
  if (absl::Status a = Authorize(ctx, "ReportChunks"); !a.ok()) return Done(ctx, a);
  if (absl::Status n = CheckWorkerName(ctx, req->worker()); !n.ok()) return Done(ctx, n);
  WorkerReport report;
  report.plan_id = req->plan_id();
  report.worker = req->worker();
  report.incarnation = req->incarnation();
  report.rank = req->rank();
  report.error = req->error();
  report.bytes_done = req->bytes_done();
  report.final = req->final();
  if (report.final) {
    report.timing.set_memory_peak_bytes(req->memory_peak_bytes());
    if (req->memory_peak_bytes() > 0) {
      // The budget it peaked against, for the trace.
      if (absl::StatusOr<WorkerRecord> w = workers_->Get(req->worker()); w.ok()) {
        report.timing.set_memory_budget_bytes(w->spec.memory.budget_bytes);
      }
    }
    report.timing.set_start_unix_us(req->start_unix_us());
    report.timing.set_end_unix_us(req->end_unix_us());
    *report.timing.mutable_steps() = req->steps();
  }
  if (report.final && report.error.empty()) {
    absl::StatusOr<RankChunks> chunks =
        RankChunksFromProto(req->chunks(), "chunks", &report.checksums);
    if (!chunks.ok()) return Done(ctx, chunks.status());
    report.chunks = *std::move(chunks);
    for (int i = 0; i < req->shapes_size(); ++i) {
      absl::StatusOr<RankChunks> shape =
          RankChunksFromProto(req->shapes(i), absl::StrCat("shapes[", i, "]"));
      if (!shape.ok()) return Done(ctx, shape.status());
      report.shapes.push_back(*std::move(shape));
    }
    report.members.reserve(req->members_size());
    for (const v1::MemberChunks& in : req->members()) {
      WorkerReport::Member& m = report.members.emplace_back();
      m.index = in.index();
      m.shape = in.shape();
      m.checksums.assign(in.checksums().begin(), in.checksums().end());
    }
  }
  return Done(ctx, plans_->Report(report));
}

grpc::ServerUnaryReactor* WorkerFacingService::AttachBuffer(grpc::CallbackServerContext* ctx,
                                                            const v1::AttachBufferRequest* req,
                                                            v1::AttachBufferResponse* resp) {
  if (absl::Status a = Authorize(ctx, "AttachBuffer"); !a.ok()) return Done(ctx, a);
  if (absl::Status n = CheckWorkerName(ctx, req->worker()); !n.ok()) return Done(ctx, n);
  AttachArgs args;
  args.worker = req->worker();
  args.incarnation = req->incarnation();
  args.tensor = req->tensor();
  args.version = req->version();
  args.rank = req->rank();
  args.memory = req->memory();
  args.pid = req->pid();
  absl::StatusOr<DType> dtype = DTypeFromProto(req->dtype(), "dtype");
  if (!dtype.ok()) return Done(ctx, dtype.status());
  args.dtype = *dtype;
  absl::StatusOr<RankChunks> chunks = RankChunksFromProto(req->chunks(), "chunks");
  if (!chunks.ok()) return Done(ctx, chunks.status());
  args.chunks = *std::move(chunks);
  absl::StatusOr<bool> readable = attach_->Attach(args);
  if (readable.ok()) {
    resp->set_readable(*readable);
    spdlog::info("{} attached rank {} of '{}' v{} ({} memory of process {})", args.worker,
                 args.rank, args.tensor, args.version, args.memory, args.pid);
  }
  return Done(ctx, readable.status());
}

grpc::ServerUnaryReactor* WorkerFacingService::DetachBuffer(grpc::CallbackServerContext* ctx,
                                                            const v1::DetachBufferRequest* req,
                                                            v1::DetachBufferResponse*) {
  if (absl::Status a = Authorize(ctx, "DetachBuffer"); !a.ok()) return Done(ctx, a);
  if (absl::Status n = CheckWorkerName(ctx, req->worker()); !n.ok()) return Done(ctx, n);
  absl::Status s =
      attach_->Detach(req->worker(), req->incarnation(), req->tensor(), req->rank(), req->reason());
  if (s.ok()) {
    spdlog::info("{} detached rank {} of '{}': {}", req->worker(), req->rank(), req->tensor(),
                 req->reason());
  }
  return Done(ctx, s);
}

grpc::ServerUnaryReactor* WorkerFacingService::AttachBuffers(grpc::CallbackServerContext* ctx,
                                                             const v1::AttachBuffersRequest* req,
                                                             v1::AttachBuffersResponse* resp) {
  if (absl::Status a = Authorize(ctx, "AttachBuffers"); !a.ok()) return Done(ctx, a);
  if (absl::Status n = CheckWorkerName(ctx, req->worker()); !n.ok()) return Done(ctx, n);
  if (req->buffers_size() > kMaxAttachmentsPerRequest) {
    return Done(ctx, absl::InvalidArgumentError(
                         absl::StrCat("buffers: ", req->buffers_size(), " given; at most ",
                                      kMaxAttachmentsPerRequest, " in one request")));
  }
  AttachManyArgs args;
  args.worker = req->worker();
  args.incarnation = req->incarnation();
  args.rank = req->rank();
  args.pid = req->pid();
  args.validate_only = req->validate_only();
  args.buffers.reserve(req->buffers_size());
  for (int i = 0; i < req->buffers_size(); ++i) {
    const v1::LentBuffer& in = req->buffers(i);
    TensorManager::AttachItem& item = args.buffers.emplace_back();
    item.name = in.tensor();
    item.version = in.version();
    item.bytes = in.bytes();
    absl::StatusOr<DType> dtype =
        DTypeFromProto(in.dtype(), absl::StrCat("buffers[", i, "].dtype"));
    if (!dtype.ok()) return Done(ctx, dtype.status());
    item.dtype = *dtype;
    if (in.has_chunks()) {
      absl::StatusOr<RankChunks> chunks =
          RankChunksFromProto(in.chunks(), absl::StrCat("buffers[", i, "].chunks"));
      if (!chunks.ok()) return Done(ctx, chunks.status());
      item.chunks = *std::move(chunks);
    }
  }
  absl::StatusOr<std::vector<TensorManager::Attached>> attached = attach_->AttachMany(args);
  if (!attached.ok()) return Done(ctx, attached.status());
  resp->mutable_buffers()->Reserve(static_cast<int>(attached->size()));
  int64_t readable = 0;
  for (const TensorManager::Attached& a : *attached) {
    v1::AttachedBuffer* out = resp->add_buffers();
    out->set_version(a.version);
    *out->mutable_chunks() = RankChunksToProto(a.chunks);
    out->set_readable(a.readable);
    readable += a.readable ? 1 : 0;
  }
  if (!args.validate_only) {
    spdlog::info("{} attached rank {} of {} tensors ({} readable now) for process {}", args.worker,
                 args.rank, attached->size(), readable, args.pid);
  }
  return Done(ctx, absl::OkStatus());
}

grpc::ServerUnaryReactor* WorkerFacingService::LeaveWorker(grpc::CallbackServerContext* ctx,
                                                           const v1::LeaveWorkerRequest* req,
                                                           v1::LeaveWorkerResponse* resp) {
  if (absl::Status a = Authorize(ctx, "LeaveWorker"); !a.ok()) return Done(ctx, a);
  if (absl::Status n = CheckWorkerName(ctx, req->name()); !n.ok()) return Done(ctx, n);
  if (drain_ == nullptr) {
    return Done(ctx, absl::UnimplementedError("this coordinator does not drain workers"));
  }
  if (req->drain_timeout_ms() < 0 || absl::Milliseconds(req->drain_timeout_ms()) > kMaxWait) {
    return Done(ctx, absl::InvalidArgumentError(absl::StrCat(
                         "drain_timeout_ms = ", req->drain_timeout_ms(), " must be in [0, ",
                         absl::ToInt64Milliseconds(kMaxWait), "]")));
  }
  spdlog::info("worker {} (incarnation {}) is leaving; drain timeout {} ms", req->name(),
               req->incarnation(), req->drain_timeout_ms());
  grpc::ServerUnaryReactor* reactor = ctx->DefaultReactor();
  drain_->Leave(req->name(), req->incarnation(), absl::Milliseconds(req->drain_timeout_ms()),
                [reactor, resp, name = req->name()](absl::StatusOr<LeaveOutcome> out) {
                  if (out.ok()) {
                    for (const std::string& id : out->aborted_plans) resp->add_aborted_plans(id);
                    for (const std::string& t : out->repaired_tensors) {
                      resp->add_repaired_tensors(t);
                    }
                    for (const std::string& l : out->lost) resp->add_lost(l);
                    spdlog::info(
                        "worker {} left: {} plans aborted, {} tensors repaired, {} "
                        "tensors lost chunks",
                        name, out->aborted_plans.size(), out->repaired_tensors.size(),
                        out->lost.size());
                  }
                  reactor->Finish(ToGrpcStatus(out.status()));
                });
  return reactor;
}

absl::Status WorkerFacingService::Authorize(grpc::CallbackServerContext* ctx,
                                            absl::string_view rpc) const {
  return AuthorizeCall(auth_, ctx,
                       FullMethodName(v1::CoordinatorWorkers::service_full_name(), rpc));
}

absl::Status WorkerFacingService::CheckWorkerName(grpc::CallbackServerContext* ctx,
                                                  absl::string_view name) const {
  if (absl::Status s = ValidateWorkerName(name); !s.ok()) return s;
  if (!check_certificate_names_) return absl::OkStatus();
  absl::Status s = CheckPeerName(name, PeerCertificateNames(*ctx));
  if (!s.ok()) spdlog::warn("refused worker from {}: {}", ctx->peer(), std::string(s.message()));
  return s;
}

}  // namespace shardcoord
