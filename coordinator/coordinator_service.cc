#include "coordinator/coordinator_service.h"

#include <algorithm>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "coordinator/grpc_worker_client.h"
#include "proto/grpc_status.h"
#include "proto/convert.h"
#include "sharding/planner.h"

namespace shardcoord {
namespace {

grpc::ServerUnaryReactor* Done(grpc::CallbackServerContext* ctx, const absl::Status& s) {
  grpc::ServerUnaryReactor* r = ctx->DefaultReactor();
  r->Finish(ToGrpcStatus(s));
  return r;
}

}  // namespace

// ---- Conversions -------------------------------------------------------------------------

v1::WorkerInfo WorkerInfoToProto(const WorkerRecord& w) {
  v1::WorkerInfo out;
  out.set_name(w.spec.name);
  out.set_rank(w.rank);
  out.set_host(w.spec.host);
  out.set_device(w.spec.device);
  out.set_address(w.spec.address);
  out.set_incarnation(w.incarnation);
  out.set_state(w.alive ? v1::ALIVE : v1::DEAD);
  out.set_backend(w.spec.backend);
  out.set_last_heartbeat_unix_ms(absl::ToUnixMillis(w.last_heartbeat));
  return out;
}

v1::MeshInfo MeshInfoToProto(const MeshRecord& m) {
  v1::MeshInfo out;
  out.set_name(m.name);
  ShapeToProto(m.mesh.shape(), out.mutable_shape());
  for (const std::string& d : m.mesh.dim_names()) out.add_dim_names(d);
  ShapeToProto(m.mesh.ranks(), out.mutable_ranks());
  for (const std::string& w : m.workers) out.add_workers(w);
  return out;
}

v1::TensorInfo TensorInfoToProto(const TensorRecord& t, const LivenessFn& live) {
  v1::TensorInfo out;
  out.set_name(t.name);
  ShapeToProto(t.shape, out.mutable_shape());
  out.set_dtype(DTypeToProto(t.dtype));
  out.set_mesh(t.mesh);
  out.set_spec(t.spec);
  *out.mutable_layout() = LayoutToProto(t.layout, &t.checksums);
  out.set_version(t.version);
  out.set_bytes(t.bytes());
  out.set_busy_plan(t.busy_plan);
  for (const LostChunk& c : LostChunks(t, live)) out.add_lost_chunks(c.ToString());
  return out;
}

v1::PlanProgress PlanProgressToProto(const PlanProgress& p) {
  v1::PlanProgress out;
  out.set_plan_id(p.plan_id);
  out.set_tensor(p.tensor);
  out.set_state(static_cast<v1::PlanState>(static_cast<int>(p.state)));
  out.set_bytes_done(p.bytes_done);
  out.set_bytes_total(p.bytes_total);
  out.set_error(p.error);
  out.set_seconds(p.seconds);
  return out;
}

LivenessFn CoordinatorService::Liveness() const {
  return [w = workers_](int64_t rank, int64_t inc) { return w->IsLive(rank, inc); };
}

// ---- Workers and meshes ------------------------------------------------------------------

grpc::ServerUnaryReactor* CoordinatorService::ListWorkers(grpc::CallbackServerContext* ctx,
                                                          const v1::ListWorkersRequest*,
                                                          v1::ListWorkersResponse* resp) {
  for (const WorkerRecord& w : workers_->List()) *resp->add_workers() = WorkerInfoToProto(w);
  return Done(ctx, absl::OkStatus());
}

grpc::ServerUnaryReactor* CoordinatorService::CreateMesh(grpc::CallbackServerContext* ctx,
                                                         const v1::CreateMeshRequest* req,
                                                         v1::MeshInfo* resp) {
  absl::StatusOr<MeshRecord> m = meshes_->Create(
      req->name(), Shape(req->shape().begin(), req->shape().end()),
      std::vector<std::string>(req->dim_names().begin(), req->dim_names().end()),
      std::vector<std::string>(req->workers().begin(), req->workers().end()));
  if (m.ok()) *resp = MeshInfoToProto(*m);
  return Done(ctx, m.status());
}

grpc::ServerUnaryReactor* CoordinatorService::GetMesh(grpc::CallbackServerContext* ctx,
                                                      const v1::GetMeshRequest* req,
                                                      v1::MeshInfo* resp) {
  absl::StatusOr<MeshRecord> m = meshes_->Get(req->name());
  if (m.ok()) *resp = MeshInfoToProto(*m);
  return Done(ctx, m.status());
}

grpc::ServerUnaryReactor* CoordinatorService::ListMeshes(grpc::CallbackServerContext* ctx,
                                                         const v1::ListMeshesRequest*,
                                                         v1::ListMeshesResponse* resp) {
  for (const MeshRecord& m : meshes_->List()) *resp->add_meshes() = MeshInfoToProto(m);
  return Done(ctx, absl::OkStatus());
}

grpc::ServerUnaryReactor* CoordinatorService::DeleteMesh(grpc::CallbackServerContext* ctx,
                                                         const v1::DeleteMeshRequest* req,
                                                         v1::DeleteMeshResponse*) {
  return Done(ctx, meshes_->Delete(req->name()));
}

// ---- Tensors -----------------------------------------------------------------------------

grpc::ServerUnaryReactor* CoordinatorService::CreateTensor(grpc::CallbackServerContext* ctx,
                                                           const v1::CreateTensorRequest* req,
                                                           v1::TensorInfo* resp) {
  CreateTensorArgs args;
  args.name = req->name();
  if (args.name.empty()) return Done(ctx, absl::InvalidArgumentError("name: empty"));
  absl::StatusOr<Shape> shape = ShapeFromProto(req->shape(), "shape");
  if (!shape.ok()) return Done(ctx, shape.status());
  absl::StatusOr<DType> dtype = DTypeFromProto(req->dtype(), "dtype");
  if (!dtype.ok()) return Done(ctx, dtype.status());
  absl::StatusOr<Spec> spec = SpecFromProto(req->spec(), "spec");
  if (!spec.ok()) return Done(ctx, spec.status());
  if (!v1::InitKind_IsValid(req->init())) {
    return Done(ctx, absl::InvalidArgumentError(absl::StrCat("init: unknown value ", req->init())));
  }
  args.shape = *std::move(shape);
  args.dtype = *dtype;
  args.spec = *std::move(spec);
  args.init = req->init();
  args.seed = req->seed();
  grpc::ServerUnaryReactor* reactor = ctx->DefaultReactor();
  io_->Create(args, [this, reactor, resp](absl::StatusOr<TensorRecord> t) {
    if (t.ok()) *resp = TensorInfoToProto(*t, Liveness());
    reactor->Finish(ToGrpcStatus(t.status()));
  });
  return reactor;
}

grpc::ServerUnaryReactor* CoordinatorService::GetTensor(grpc::CallbackServerContext* ctx,
                                                        const v1::GetTensorRequest* req,
                                                        v1::TensorInfo* resp) {
  absl::StatusOr<TensorRecord> t = tensors_->Get(req->name());
  if (t.ok()) *resp = TensorInfoToProto(*t, Liveness());
  return Done(ctx, t.status());
}

grpc::ServerUnaryReactor* CoordinatorService::ListTensors(grpc::CallbackServerContext* ctx,
                                                          const v1::ListTensorsRequest*,
                                                          v1::ListTensorsResponse* resp) {
  const LivenessFn live = Liveness();
  for (const TensorRecord& t : tensors_->List()) *resp->add_tensors() = TensorInfoToProto(t, live);
  return Done(ctx, absl::OkStatus());
}

grpc::ServerUnaryReactor* CoordinatorService::DeleteTensor(grpc::CallbackServerContext* ctx,
                                                           const v1::DeleteTensorRequest* req,
                                                           v1::DeleteTensorResponse*) {
  return Done(ctx, io_->Delete(req->name()));
}

// ---- Plans -------------------------------------------------------------------------------

grpc::ServerUnaryReactor* CoordinatorService::RunPlan(
    grpc::CallbackServerContext* ctx, bool wait, v1::RedistributeResponse* resp,
    const std::function<absl::StatusOr<StartedPlan>(PlanManager::DoneCallback)>& start) {
  grpc::ServerUnaryReactor* reactor = ctx->DefaultReactor();
  if (!wait) {
    absl::StatusOr<StartedPlan> started = start(nullptr);
    if (started.ok()) {
      *resp->mutable_plan() = PlanToProto(*started->plan, started->id, started->tensor);
      *resp->mutable_progress() = PlanProgressToProto(started->progress);
    }
    reactor->Finish(ToGrpcStatus(started.status()));
    return reactor;
  }
  // The plan may end (on another thread, or inline) before start() returns: whichever of
  // the two comes second finishes the reactor.
  struct WaitState {
    absl::Mutex mu;
    bool started = false;
    bool ended = false;
    absl::Status status;
    PlanProgress final;
  };
  auto state = std::make_shared<WaitState>();
  auto done = [state, reactor, resp](const absl::Status& s, const PlanProgress& p) {
    bool finish = false;
    {
      absl::MutexLock lock(&state->mu);
      state->ended = true;
      state->status = s;
      state->final = p;
      finish = state->started;
    }
    if (!finish) return;
    *resp->mutable_progress() = PlanProgressToProto(p);
    reactor->Finish(ToGrpcStatus(s));
  };
  absl::StatusOr<StartedPlan> started = start(done);
  if (!started.ok()) {
    reactor->Finish(ToGrpcStatus(started.status()));
    return reactor;
  }
  *resp->mutable_plan() = PlanToProto(*started->plan, started->id, started->tensor);
  bool finish = false;
  {
    absl::MutexLock lock(&state->mu);
    state->started = true;
    finish = state->ended;
  }
  if (finish) {
    *resp->mutable_progress() = PlanProgressToProto(state->final);
    reactor->Finish(ToGrpcStatus(state->status));
  }
  return reactor;
}

grpc::ServerUnaryReactor* CoordinatorService::Redistribute(grpc::CallbackServerContext* ctx,
                                                           const v1::RedistributeRequest* req,
                                                           v1::RedistributeResponse* resp) {
  if (req->tensor().empty()) return Done(ctx, absl::InvalidArgumentError("tensor: empty"));
  absl::StatusOr<Spec> spec = SpecFromProto(req->target(), "target");
  if (!spec.ok()) return Done(ctx, spec.status());
  return RunPlan(ctx, req->wait(), resp, [&](PlanManager::DoneCallback done) {
    return plans_->Redistribute(req->tensor(), *spec, std::move(done));
  });
}

grpc::ServerUnaryReactor* CoordinatorService::Gather(grpc::CallbackServerContext* ctx,
                                                     const v1::GatherRequest* req,
                                                     v1::RedistributeResponse* resp) {
  if (req->tensor().empty()) return Done(ctx, absl::InvalidArgumentError("tensor: empty"));
  std::optional<int64_t> to_rank;
  if (req->has_to_rank()) {
    if (req->to_rank() < 0) {
      return Done(ctx, absl::InvalidArgumentError(
                           absl::StrCat("to_rank = ", req->to_rank(), " must be >= 0")));
    }
    to_rank = req->to_rank();
  }
  return RunPlan(ctx, req->wait(), resp, [&](PlanManager::DoneCallback done) {
    return plans_->Gather(req->tensor(), req->mesh(), to_rank, std::move(done));
  });
}

grpc::ServerUnaryReactor* CoordinatorService::PlanRedistribute(grpc::CallbackServerContext* ctx,
                                                               const v1::PlanRequest* req,
                                                               v1::Plan* resp) {
  absl::StatusOr<Spec> spec = SpecFromProto(req->target(), "target");
  if (!spec.ok()) return Done(ctx, spec.status());
  absl::StatusOr<StartedPlan> plan = plans_->DryRun(req->tensor(), *spec);
  if (plan.ok()) {
    *resp = PlanToProto(*plan->plan, "", plan->tensor);
    resp->set_explain(ExplainPlan(*plan->plan));
  }
  return Done(ctx, plan.status());
}

// Streams a plan's progress until it ends. Updates come from any thread; the newest (by
// seq) is written, one write at a time. All shared state lives in `Shared`, and the
// reactor is finished only while no write is claimed, so a watcher callback never touches
// a deleted reactor.
class WatchReactor : public grpc::ServerWriteReactor<v1::PlanProgress> {
 public:
  WatchReactor(PlanManager* plans, std::string plan_id)
      : plans_(plans), plan_id_(std::move(plan_id)), shared_(std::make_shared<Shared>()) {
    shared_->reactor = this;
    std::shared_ptr<Shared> shared = shared_;
    absl::StatusOr<int64_t> id = plans_->Watch(plan_id_, [shared](const PlanProgress& p) {
      WatchReactor* reactor = nullptr;
      PlanProgress take;
      {
        absl::MutexLock lock(&shared->mu);
        if (shared->finishing || shared->reactor == nullptr || p.seq <= shared->last_seq) return;
        shared->last_seq = p.seq;
        shared->pending = p;
        if (shared->writing) return;
        shared->writing = true;
        take = *shared->pending;
        shared->pending.reset();
        reactor = shared->reactor;
      }
      reactor->Write(take);
    });
    if (!id.ok()) {
      {
        absl::MutexLock lock(&shared_->mu);
        shared_->finishing = true;
      }
      Finish(ToGrpcStatus(id.status()));
      return;
    }
    absl::MutexLock lock(&shared_->mu);
    watch_id_ = *id;
  }

  void OnWriteDone(bool ok) override {
    PlanProgress take;
    {
      absl::MutexLock lock(&shared_->mu);
      if (!ok || final_written_) {
        shared_->writing = false;
        shared_->finishing = true;
      } else if (shared_->pending.has_value()) {
        take = *shared_->pending;
        shared_->pending.reset();
      } else {
        shared_->writing = false;
        return;
      }
    }
    if (!ok) return Finish(grpc::Status(grpc::StatusCode::CANCELLED, "stream broken"));
    if (final_written_) return Finish(grpc::Status::OK);
    Write(take);
  }

  void OnCancel() override {
    {
      absl::MutexLock lock(&shared_->mu);
      // A write in flight fails and finishes the call from OnWriteDone.
      if (shared_->finishing || shared_->writing) return;
      shared_->finishing = true;
    }
    Finish(grpc::Status::CANCELLED);
  }

  void OnDone() override {
    int64_t watch_id = 0;
    {
      absl::MutexLock lock(&shared_->mu);
      shared_->reactor = nullptr;
      watch_id = watch_id_;
    }
    if (watch_id != 0) plans_->Unwatch(plan_id_, watch_id);
    delete this;
  }

 private:
  struct Shared {
    absl::Mutex mu;
    WatchReactor* reactor = nullptr;
    bool writing = false;    // A write is claimed or in flight.
    bool finishing = false;  // Finish was (or is about to be) called.
    int64_t last_seq = -1;
    std::optional<PlanProgress> pending;
  };

  // Called by the holder of the write claim only.
  void Write(const PlanProgress& p) {
    out_ = PlanProgressToProto(p);
    final_written_ = p.ended();
    StartWrite(&out_);
  }

  PlanManager* const plans_;
  const std::string plan_id_;
  std::shared_ptr<Shared> shared_;
  int64_t watch_id_ = 0;  // Guarded by shared_->mu.
  v1::PlanProgress out_;
  bool final_written_ = false;
};

grpc::ServerWriteReactor<v1::PlanProgress>* CoordinatorService::WatchPlan(
    grpc::CallbackServerContext*, const v1::WatchPlanRequest* req) {
  return new WatchReactor(plans_, req->plan_id());
}

// ---- Data --------------------------------------------------------------------------------

// Receives the header, then the data. A whole upload goes to the workers band by band
// (TensorIo::UploadStream): the reactor collects one band, stops reading while the band is
// handed to the workers' streams, then reads on, so it holds at most a band and one message
// beyond it. A rank upload (one rank's local buffer) is collected whole, then written.
class UploadReactor : public grpc::ServerReadReactor<v1::TensorData> {
 public:
  UploadReactor(TensorIo* io, v1::UploadResponse* resp, LivenessFn live)
      : io_(io), resp_(resp), live_(std::move(live)) {
    StartRead(&message_);
  }

  void OnReadDone(bool ok) override {
    if (!ok) {
      eof_ = true;
      if (!have_header_) return Fail(absl::InvalidArgumentError("header: no message received"));
      if (stream_ == nullptr) return EndOfRankUpload();
      return Pump();
    }
    if (!have_header_) {
      if (!message_.has_header()) {
        return Fail(absl::InvalidArgumentError("header: missing in the first message"));
      }
      if (absl::Status s = ParseHeader(message_.header()); !s.ok()) return Fail(s);
      have_header_ = true;
      if (!args_.rank.has_value()) {
        absl::StatusOr<std::shared_ptr<TensorIo::UploadStream>> up = io_->StartUpload(args_);
        if (!up.ok()) return Fail(up.status());
        stream_ = *std::move(up);
      }
    } else if (message_.has_header()) {
      return Fail(absl::InvalidArgumentError("header: sent again after the first message"));
    }
    received_ += static_cast<int64_t>(message_.data().size());
    if (received_ > limit_) {
      return Fail(absl::InvalidArgumentError(
          absl::StrCat("data: more than the ", limit_, " bytes the header announced")));
    }
    if (stream_ == nullptr) {
      data_.append(message_.data());
      StartRead(&message_);
      return;
    }
    inbox_ = std::move(*message_.mutable_data());
    inbox_pos_ = 0;
    Pump();
  }

  void OnDone() override { delete this; }

 private:
  absl::Status ParseHeader(const v1::TensorHeader& h) {
    args_.name = h.name();
    if (args_.name.empty()) return absl::InvalidArgumentError("header.name: empty");
    absl::StatusOr<Shape> shape = ShapeFromProto(h.shape(), "header.shape");
    if (!shape.ok()) return shape.status();
    absl::StatusOr<DType> dtype = DTypeFromProto(h.dtype(), "header.dtype");
    if (!dtype.ok()) return dtype.status();
    args_.shape = *std::move(shape);
    args_.dtype = *dtype;
    if (h.has_spec() && h.spec().ByteSizeLong() > 0) {
      absl::StatusOr<Spec> spec = SpecFromProto(h.spec(), "header.spec");
      if (!spec.ok()) return spec.status();
      args_.spec = *std::move(spec);
    }
    if (h.has_rank()) {
      if (h.rank() < 0) {
        return absl::InvalidArgumentError(absl::StrCat("header.rank = ", h.rank(), " must be >= 0"));
      }
      args_.rank = h.rank();
    }
    absl::StatusOr<int64_t> whole = CheckedBytes(args_.shape, ElementSize(args_.dtype));
    if (!whole.ok()) return absl::InvalidArgumentError(absl::StrCat("header.shape: ", whole.status().message()));
    if (!args_.rank.has_value()) {
      if (h.total_bytes() != 0 && h.total_bytes() != *whole) {
        return absl::InvalidArgumentError(absl::StrCat("header.total_bytes = ", h.total_bytes(),
                                                       " but a ", ShapeToString(args_.shape), " ",
                                                       DTypeName(args_.dtype), " tensor has ",
                                                       *whole));
      }
      limit_ = *whole;
    } else {
      // A rank's local buffer (TensorIo checks its exact size); never more than the tensor.
      if (h.total_bytes() < 0) {
        return absl::InvalidArgumentError(
            absl::StrCat("header.total_bytes = ", h.total_bytes(), " must be >= 0"));
      }
      limit_ = h.total_bytes() > 0 ? h.total_bytes() : *whole;
      data_.reserve(static_cast<size_t>(limit_));
    }
    return absl::OkStatus();
  }

  // Whole upload, with no band write in flight: fills the current band from the message
  // received, hands a full band to the workers, reads on, or finishes at the end.
  void Pump() {
    while (band_ < stream_->num_bands()) {
      const size_t want = static_cast<size_t>(stream_->band_bytes(band_)) - band_data_.size();
      const size_t take = std::min(want, inbox_.size() - inbox_pos_);
      band_data_.append(inbox_, inbox_pos_, take);
      inbox_pos_ += take;
      if (band_data_.size() < static_cast<size_t>(stream_->band_bytes(band_))) break;
      std::string band;
      band.swap(band_data_);
      const int64_t i = band_++;
      // The reactor reads nothing and finishes nothing until the band is written. A callback
      // on another thread pumps on from there; one that runs inline (before WriteBand
      // returns) leaves it to this loop, so many small bands in one message do not recurse.
      {
        absl::MutexLock lock(&mu_);
        in_write_band_ = true;
        written_inline_ = false;
      }
      stream_->WriteBand(i, std::move(band), [this](absl::Status s) {
        {
          absl::MutexLock lock(&mu_);
          if (in_write_band_) {
            written_inline_ = true;
            inline_status_ = s;
            return;
          }
        }
        BandWritten(s);
      });
      absl::Status s;
      {
        absl::MutexLock lock(&mu_);
        in_write_band_ = false;
        if (!written_inline_) return;
        s = inline_status_;
      }
      if (!s.ok()) return BandWritten(s);
    }
    if (inbox_pos_ < inbox_.size()) {
      return Fail(absl::InvalidArgumentError(
          absl::StrCat("data: more than the ", limit_, " bytes the header announced")));
    }
    std::string().swap(inbox_);
    inbox_pos_ = 0;
    if (!eof_) return StartRead(&message_);
    if (band_ < stream_->num_bands()) {
      return Fail(absl::InvalidArgumentError(absl::StrCat(
          "data: ", received_, " bytes for a ", ShapeToString(args_.shape), " ",
          DTypeName(args_.dtype), " tensor of ", limit_, " bytes")));
    }
    std::shared_ptr<TensorIo::UploadStream> up = std::move(stream_);
    up->Finish([this](absl::StatusOr<TensorRecord> t) {
      if (t.ok()) *resp_->mutable_tensor() = TensorInfoToProto(*t, live_);
      Finish(ToGrpcStatus(t.status()));
    });
  }

  void BandWritten(const absl::Status& s) {
    if (!s.ok()) {
      return Fail(absl::Status(s.code(),
                               absl::StrCat("uploading '", args_.name, "': ", s.message())));
    }
    Pump();
  }

  void EndOfRankUpload() {
    io_->Upload(args_, std::move(data_), [this](absl::StatusOr<TensorRecord> t) {
      if (t.ok()) *resp_->mutable_tensor() = TensorInfoToProto(*t, live_);
      Finish(ToGrpcStatus(t.status()));
    });
  }

  void Fail(const absl::Status& s) {
    if (stream_ != nullptr) {
      stream_->Abort();
      stream_.reset();
    }
    Finish(ToGrpcStatus(s));
  }

  TensorIo* const io_;
  v1::UploadResponse* const resp_;
  const LivenessFn live_;
  v1::TensorData message_;
  bool have_header_ = false;
  bool eof_ = false;
  UploadArgs args_;
  int64_t limit_ = 0;
  int64_t received_ = 0;
  std::string data_;  // Rank uploads.
  // Whole uploads.
  std::shared_ptr<TensorIo::UploadStream> stream_;
  std::string inbox_;  // The last message's data, consumed from inbox_pos_.
  size_t inbox_pos_ = 0;
  std::string band_data_;
  int64_t band_ = 0;
  absl::Mutex mu_;
  bool in_write_band_ ABSL_GUARDED_BY(mu_) = false;
  bool written_inline_ ABSL_GUARDED_BY(mu_) = false;
  absl::Status inline_status_ ABSL_GUARDED_BY(mu_);
};

grpc::ServerReadReactor<v1::TensorData>* CoordinatorService::Upload(
    grpc::CallbackServerContext*, v1::UploadResponse* resp) {
  return new UploadReactor(io_, resp, Liveness());
}

// Streams a header, then the tensor band by band (TensorIo::DownloadStream), each band in
// messages of at most `slice` bytes. At most kWindow bands are held: the one being written
// and the next one, fetched while it is written; the fetch after that starts when a band
// was fully written (OnWriteDone: gRPC flow control paces it). The call finishes only when no write and no
// fetch is in flight, so a fetch callback never meets a deleted reactor.
class DownloadReactor : public grpc::ServerWriteReactor<v1::TensorData> {
 public:
  static constexpr int64_t kWindow = 2;

  DownloadReactor(TensorIo* io, const std::string& name, int64_t slice)
      : slice_(static_cast<size_t>(std::max<int64_t>(1, slice))) {
    absl::StatusOr<std::shared_ptr<TensorIo::DownloadStream>> d = io->OpenDownload(name);
    if (!d.ok()) {
      Finish(ToGrpcStatus(d.status()));
      return;
    }
    stream_ = *std::move(d);
    const TensorRecord& t = stream_->tensor();
    v1::TensorHeader* h = message_.mutable_header();
    h->set_name(t.name);
    ShapeToProto(t.shape, h->mutable_shape());
    h->set_dtype(DTypeToProto(t.dtype));
    h->mutable_spec()->set_mesh(t.mesh);
    h->set_total_bytes(t.bytes());
    std::vector<int64_t> fetch;
    {
      absl::MutexLock lock(&mu_);
      writing_ = true;
      fetch = ClaimFetches();
    }
    StartWrite(&message_);
    Fetch(fetch);
  }

  void OnWriteDone(bool ok) override {
    std::vector<int64_t> fetch;
    bool write = false;
    std::optional<grpc::Status> finish;
    {
      absl::MutexLock lock(&mu_);
      if (!ok && status_.ok()) status_ = absl::CancelledError("stream broken");
      if (status_.ok()) {
        if (offset_ >= current_.size()) {
          // The band (or the header) is out: free it and take the next one.
          std::string().swap(current_);
          offset_ = 0;
          auto it = ready_.find(next_write_);
          if (it != ready_.end()) {
            current_ = std::move(it->second);
            ready_.erase(it);
            ++next_write_;
          }
          fetch = ClaimFetches();
        }
        write = offset_ < current_.size();
      }
      if (!write) {
        writing_ = false;
        finish = MaybeFinish();
      }
    }
    if (write) WriteSlice();
    if (finish.has_value()) return Finish(*finish);
    Fetch(fetch);
  }

  void OnCancel() override {
    std::optional<grpc::Status> finish;
    {
      absl::MutexLock lock(&mu_);
      if (status_.ok()) status_ = absl::CancelledError("download cancelled");
      finish = MaybeFinish();
    }
    if (finish.has_value()) Finish(*finish);
  }

  void OnDone() override { delete this; }

 private:
  // Next bands to fetch: at most kWindow - 1 bands fetched or being fetched ahead of the
  // one being written (band 0 alone at the start, so two fetches never overlap there).
  std::vector<int64_t> ClaimFetches() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    std::vector<int64_t> out;
    if (!status_.ok()) return out;
    while (next_fetch_ < stream_->num_bands() && next_fetch_ - next_write_ < kWindow - 1) {
      out.push_back(next_fetch_++);
      ++fetching_;
    }
    return out;
  }

  void Fetch(const std::vector<int64_t>& bands) {
    for (int64_t i : bands) {
      stream_->FetchBand(i, [this, i](absl::StatusOr<std::string> r) { OnFetched(i, std::move(r)); });
    }
  }

  void OnFetched(int64_t i, absl::StatusOr<std::string> r) {
    bool write = false;
    std::vector<int64_t> fetch;
    std::optional<grpc::Status> finish;
    {
      absl::MutexLock lock(&mu_);
      --fetching_;
      if (!r.ok() && status_.ok()) status_ = r.status();
      if (status_.ok()) {
        ready_[i] = *std::move(r);
        if (!writing_ && i == next_write_) {
          current_ = std::move(ready_[i]);
          ready_.erase(i);
          ++next_write_;
          offset_ = 0;
          writing_ = true;
          write = true;
          fetch = ClaimFetches();
        }
      } else {
        ready_.clear();
      }
      if (!write) finish = MaybeFinish();
    }
    if (write) WriteSlice();
    if (finish.has_value()) Finish(*finish);
    Fetch(fetch);
  }

  // The status to finish with, once: on an error or after the last band, when no write and
  // no fetch is in flight.
  std::optional<grpc::Status> MaybeFinish() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (finished_ || writing_ || fetching_ > 0) return std::nullopt;
    if (status_.ok() && next_write_ < stream_->num_bands()) return std::nullopt;
    finished_ = true;
    return ToGrpcStatus(status_);
  }

  // Called by the holder of the write claim only.
  void WriteSlice() {
    const size_t n = std::min(current_.size() - offset_, slice_);
    message_.Clear();
    message_.set_data(current_.data() + offset_, n);
    offset_ += n;
    StartWrite(&message_);
  }

  const size_t slice_;
  std::shared_ptr<TensorIo::DownloadStream> stream_;
  v1::TensorData message_;
  // The band being written: owned by the write claim holder while `writing_`.
  std::string current_;
  size_t offset_ = 0;
  absl::Mutex mu_;
  bool writing_ ABSL_GUARDED_BY(mu_) = false;
  int64_t fetching_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t next_fetch_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t next_write_ ABSL_GUARDED_BY(mu_) = 0;  // The next band to start writing.
  std::map<int64_t, std::string> ready_ ABSL_GUARDED_BY(mu_);
  absl::Status status_ ABSL_GUARDED_BY(mu_);
  bool finished_ ABSL_GUARDED_BY(mu_) = false;
};

grpc::ServerWriteReactor<v1::TensorData>* CoordinatorService::Download(
    grpc::CallbackServerContext*, const v1::DownloadRequest* req) {
  return new DownloadReactor(io_, req->name(), max_message_bytes_);
}

}  // namespace shardcoord
