#include "coordinator/io/tensor_io.h"

#include <algorithm>
#include <limits>
#include <map>
#include <memory>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/fan_in.h"
#include "sharding/box_copy.h"
#include "sharding/tensor_split.h"

namespace shardcoord {

struct TensorIo::LossWatch {
  LossWatch(std::vector<WorkerEndpoint> eps, std::vector<std::shared_ptr<ChunkWriteStream>> ss)
      : endpoints(std::move(eps)), streams(std::move(ss)) {}

  // OK until a worker it uses died: then that death, as the operation's error.
  absl::Status Lost() {
    absl::MutexLock lock(&mu);
    return lost;
  }
  // `s`, or the death that caused it.
  absl::Status Or(absl::Status s) {
    absl::Status l = Lost();
    return l.ok() ? s : l;
  }

  const std::vector<WorkerEndpoint> endpoints;
  const std::vector<std::shared_ptr<ChunkWriteStream>> streams;  // Cancelled on a death.
  absl::Mutex mu;
  absl::Status lost ABSL_GUARDED_BY(mu);
};

std::shared_ptr<TensorIo::LossWatch> TensorIo::Watch(
    std::vector<WorkerEndpoint> endpoints, std::vector<std::shared_ptr<ChunkWriteStream>> streams) {
  auto watch = std::make_shared<LossWatch>(std::move(endpoints), std::move(streams));
  absl::MutexLock lock(&mu_);
  watches_.erase(std::remove_if(watches_.begin(), watches_.end(),
                                [](const std::weak_ptr<LossWatch>& w) { return w.expired(); }),
                 watches_.end());
  watches_.push_back(watch);
  return watch;
}

void TensorIo::OnWorkerLost(const WorkerRecord& worker, const std::string& reason) {
  std::vector<std::shared_ptr<LossWatch>> hit;
  {
    absl::MutexLock lock(&mu_);
    for (const std::weak_ptr<LossWatch>& weak : watches_) {
      std::shared_ptr<LossWatch> w = weak.lock();
      if (w == nullptr) continue;
      for (const WorkerEndpoint& e : w->endpoints) {
        if (e.rank == worker.rank && e.incarnation == worker.incarnation) {
          hit.push_back(std::move(w));
          break;
        }
      }
    }
  }
  const absl::Status lost = absl::UnavailableError(absl::StrCat(worker.Describe(), " ", reason));
  for (const std::shared_ptr<LossWatch>& w : hit) {
    {
      absl::MutexLock lock(&w->mu);
      if (!w->lost.ok()) continue;
      w->lost = lost;
    }
    // Outside the lock: cancelled streams run their pending callbacks, which read `lost`.
    for (const std::shared_ptr<ChunkWriteStream>& s : w->streams) s->Cancel();
  }
}

std::string TensorIo::NewOp(const char* kind) {
  absl::MutexLock lock(&mu_);
  return absl::StrCat(kind, "-", next_op_++);
}

absl::StatusOr<std::vector<WorkerEndpoint>> TensorIo::Endpoints(const Layout& layout) const {
  std::vector<WorkerEndpoint> out;
  for (const RankChunks& rc : layout.ranks()) {
    absl::StatusOr<WorkerRecord> w = workers_->GetByRank(rc.rank);
    if (!w.ok()) return w.status();
    if (!w->alive) return w->DeadError("is dead");
    out.push_back(w->Endpoint());
  }
  return out;
}

std::vector<WorkerEndpoint> TensorIo::Holders(const Layout& layout) const {
  std::vector<WorkerEndpoint> out;
  for (const RankChunks& rc : layout.ranks()) {
    absl::StatusOr<WorkerRecord> w = workers_->GetByRank(rc.rank);
    if (w.ok()) out.push_back(w->Endpoint());
  }
  return out;
}

void TensorIo::Drop(const std::vector<WorkerEndpoint>& endpoints, const std::string& tensor,
                    int64_t version) {
  v1::DropTensorRequest req;
  req.set_tensor(tensor);
  req.set_version(version);
  for (const WorkerEndpoint& e : endpoints) {
    if (workers_->IsLive(e.rank, e.incarnation)) client_->DropTensor(e, req, [](absl::Status) {});
  }
}

absl::Status TensorIo::CheckRankAnswer(const WorkerEndpoint& ep, const RankChunks& want,
                                       const absl::StatusOr<v1::RankChunks>& r,
                                       ChunkChecksums* sums) {
  if (!r.ok()) {
    return absl::UnavailableError(absl::StrCat(Describe(ep), ": ", r.status().ToString()));
  }
  absl::StatusOr<RankChunks> got = RankChunksFromProto(*r, "chunks", sums);
  if (!got.ok()) {
    return absl::InternalError(
        absl::StrCat(Describe(ep), " answered with bad chunks: ", got.status().message()));
  }
  if (got->chunks != want.chunks) {
    return absl::InternalError(
        absl::StrCat(Describe(ep), " answered with other chunks than it was given"));
  }
  return absl::OkStatus();
}

absl::Status TensorIo::CheckReplicas(const Layout& layout, const LayoutChecksums& sums,
                                     const std::vector<WorkerEndpoint>& endpoints) {
  return CheckReplicaChecksums(layout, sums, [&](int64_t rank) {
    for (const WorkerEndpoint& e : endpoints) {
      if (e.rank == rank) return Describe(e);
    }
    return absl::StrCat("rank ", rank);
  });
}

void TensorIo::ForEachRank(const Layout& layout, const std::vector<WorkerEndpoint>& endpoints,
                           const RankCall& call,
                           std::function<void(absl::StatusOr<LayoutChecksums>)> done) {
  struct State {
    Layout layout;
    std::vector<WorkerEndpoint> endpoints;
    LayoutChecksums sums;  // Slot i: written by rank i's callback only, read once all answered.
  };
  auto state = std::make_shared<State>();
  state->layout = layout;
  state->endpoints = endpoints;
  const size_t n = layout.ranks().size();
  state->sums.resize(n);
  std::shared_ptr<FanIn> fan = FanIn::Start(n, [state, done = std::move(done)](absl::Status error) {
    if (!error.ok()) return done(error);
    absl::Status replicas = CheckReplicas(state->layout, state->sums, state->endpoints);
    if (!replicas.ok()) return done(replicas);
    done(std::move(state->sums));
  });
  for (size_t i = 0; i < n; ++i) {
    const RankChunks& rc = state->layout.ranks()[i];
    call(state->endpoints[i], rc, [state, fan, i](absl::StatusOr<v1::RankChunks> r) {
      ChunkChecksums sums;
      absl::Status s = CheckRankAnswer(state->endpoints[i], state->layout.ranks()[i], r, &sums);
      if (s.ok()) state->sums[i] = std::move(sums);
      fan->Report(s);
    });
  }
}

// ---- Create ------------------------------------------------------------------------------

absl::Status TensorIo::CheckTensorBytes(absl::string_view field, const Shape& shape, DType dtype,
                                        int64_t bytes) const {
  if (bytes <= max_tensor_bytes_) return absl::OkStatus();
  return absl::ResourceExhaustedError(
      absl::StrCat(field, ": ", ShapeToString(shape), " of ", DTypeName(dtype), " is ", bytes,
                   " bytes, more than the limit of ", max_tensor_bytes_, " (--max-tensor-bytes)"));
}

absl::StatusOr<TensorIo::PreparedCreate> TensorIo::PrepareCreate(
    const CreateTensorArgs& args) const {
  if (args.name.empty()) return absl::InvalidArgumentError("name: empty");
  absl::StatusOr<int64_t> bytes = CheckedBytes(args.shape, ElementSize(args.dtype));
  if (!bytes.ok()) return bytes.status();
  if (absl::Status s = CheckTensorBytes("shape", args.shape, args.dtype, *bytes); !s.ok()) {
    return s;
  }
  if (args.spec.mesh.empty()) {
    return absl::InvalidArgumentError("spec.mesh: empty (name the mesh)");
  }
  absl::StatusOr<MeshRecord> mesh = meshes_->Get(args.spec.mesh);
  if (!mesh.ok()) return mesh.status();
  absl::StatusOr<Layout> layout = LayoutForSpec(args.spec, mesh->mesh, args.shape, "spec");
  if (!layout.ok()) return layout.status();
  if (absl::Status s =
          CheckPartialDType(args.dtype, layout->is_partial(), layout->SpecString(), "spec");
      !s.ok()) {
    return s;
  }
  absl::StatusOr<std::vector<WorkerEndpoint>> endpoints = Endpoints(*layout);
  if (!endpoints.ok()) return endpoints.status();

  PreparedCreate p;
  p.endpoints = *std::move(endpoints);
  TensorRecord& record = p.record;
  record.name = args.name;
  record.shape = args.shape;
  record.dtype = args.dtype;
  record.mesh = args.spec.mesh;
  record.spec = args.spec.ToString();
  record.layout = *std::move(layout);
  record.version = tensors_->NewVersion();
  if (args.init == v1::ATTACHED) {
    // No worker allocates anything: every rank waits for a user process to lend its buffer.
    record.attached = true;
    for (const RankChunks& rc : record.layout.ranks()) record.unattached.insert(rc.rank);
    return p;
  }
  v1::FillRequest& base = p.fill;
  base.set_tensor(args.name);
  base.set_version(record.version);
  base.set_dtype(DTypeToProto(args.dtype));
  ShapeToProto(args.shape, base.mutable_global_shape());
  base.set_init(args.init == v1::INIT_KIND_UNSPECIFIED ? v1::ZEROS : args.init);
  base.set_seed(args.seed);
  if (record.layout.is_partial()) base.set_partial_op(ReduceOpToProto(record.layout.partial_op()));
  return p;
}

v1::FillRequest TensorIo::PreparedCreate::FillFor(const RankChunks& rc) const {
  v1::FillRequest req = fill;
  *req.mutable_chunks() = RankChunksToProto(rc);
  // A Partial(sum) tensor holds its value in contribution 0 and zeros in the others (as
  // ChunkUnsharded splits one); avg, min and max hold the value in every contribution.
  const Layout& layout = record.layout;
  if (layout.is_partial() && layout.partial_op() == ReduceOp::kSum && !rc.chunks.empty() &&
      std::all_of(rc.chunks.begin(), rc.chunks.end(),
                  [](const Chunk& c) { return c.partial_index != 0; })) {
    req.set_init(v1::ZEROS);
  }
  return req;
}

LayoutChecksums TensorIo::PreparedCreate::NoChecksums() const {
  LayoutChecksums none;
  for (const RankChunks& rc : record.layout.ranks()) none.emplace_back(rc.chunks.size(), 0);
  return none;
}

void TensorIo::Create(const CreateTensorArgs& args, TensorCallback done) {
  absl::StatusOr<PreparedCreate> prepared = PrepareCreate(args);
  if (!prepared.ok()) return done(prepared.status());
  const std::string op = NewOp("create");
  const std::string name = args.name;
  const int64_t version = prepared->record.version;
  if (prepared->record.attached) {
    LayoutChecksums none = prepared->NoChecksums();
    if (absl::Status s = tensors_->Reserve(prepared->record, op); !s.ok()) return done(s);
    if (absl::Status s = tensors_->FinishCreate(name, op, std::move(none), {}); !s.ok()) {
      tensors_->CancelCreate(name, op);
      return done(s);
    }
    return done(tensors_->Get(name));
  }
  // Every rank's buffer must fit its worker's budget now; held until the create ends.
  absl::StatusOr<std::shared_ptr<AdmissionHold>> memory =
      AdmitNow(admission_, absl::StrCat("creating '", name, "'"),
               LayoutBytesByRank(prepared->record.layout, args.dtype));
  if (!memory.ok()) return done(memory.status());
  if (absl::Status s = tensors_->Reserve(prepared->record, op); !s.ok()) return done(s);

  auto shared = std::make_shared<const PreparedCreate>(*std::move(prepared));
  ForEachRank(
      shared->record.layout, shared->endpoints,
      [this, shared](const WorkerEndpoint& ep, const RankChunks& rc,
                     WorkerClient::Callback<v1::RankChunks> cb) {
        client_->Fill(ep, shared->FillFor(rc), [cb](absl::StatusOr<v1::FillResponse> r) {
          if (!r.ok()) return cb(r.status());
          cb(r->chunks());
        });
      },
      [this, name, op, version, eps = shared->endpoints, done,
       memory = *std::move(memory)](absl::StatusOr<LayoutChecksums> sums) {
        // Committed (counted from the layout now) or dropped: the reservation goes after.
        auto release = [&memory] {
          if (memory) memory->Release();
        };
        if (!sums.ok()) {
          Drop(eps, name, version);
          tensors_->CancelCreate(name, op);
          release();
          return done(absl::Status(sums.status().code(), absl::StrCat("creating '", name, "': ",
                                                                      sums.status().message())));
        }
        if (absl::Status s = tensors_->FinishCreate(name, op, *std::move(sums), Incarnations(eps));
            !s.ok()) {
          // Not stored (etcd away): nothing was created, and a retry may create it.
          Drop(eps, name, version);
          tensors_->CancelCreate(name, op);
          release();
          return done(s);
        }
        release();
        done(tensors_->Get(name));
      });
}

// ---- Upload ------------------------------------------------------------------------------

absl::StatusOr<std::shared_ptr<TensorIo::UploadStream>> TensorIo::StartUpload(
    const UploadArgs& args) {
  if (args.name.empty()) return absl::InvalidArgumentError("header.name: empty");
  const int64_t es = ElementSize(args.dtype);
  absl::StatusOr<int64_t> bytes = CheckedBytes(args.shape, es);
  if (!bytes.ok()) return bytes.status();
  if (absl::Status s = CheckTensorBytes("header.shape", args.shape, args.dtype, *bytes); !s.ok()) {
    return s;
  }

  absl::StatusOr<TensorRecord> existing = tensors_->Get(args.name);
  if (!existing.ok() && existing.status().code() != absl::StatusCode::kNotFound) {
    return existing.status();
  }
  std::shared_ptr<UploadStream> up(new UploadStream(this));
  up->args_ = args;
  up->replace_ = existing.ok();
  if (up->replace_ && (existing->shape != args.shape || existing->dtype != args.dtype)) {
    return absl::AlreadyExistsError(
        absl::StrCat("tensor '", args.name, "' exists as ", ShapeToString(existing->shape), " ",
                     DTypeName(existing->dtype), ", not ", ShapeToString(args.shape), " ",
                     DTypeName(args.dtype)));
  }
  if (args.spec.has_value()) {
    up->mesh_name_ =
        !args.spec->mesh.empty() ? args.spec->mesh : (up->replace_ ? existing->mesh : "");
    if (up->mesh_name_.empty()) {
      return absl::InvalidArgumentError("header.spec.mesh: empty (name the mesh)");
    }
    absl::StatusOr<MeshRecord> mesh = meshes_->Get(up->mesh_name_);
    if (!mesh.ok()) return mesh.status();
    absl::StatusOr<Layout> l = LayoutForSpec(*args.spec, mesh->mesh, args.shape, "header.spec");
    if (!l.ok()) return l.status();
    if (absl::Status s =
            CheckPartialDType(args.dtype, l->is_partial(), l->SpecString(), "header.spec");
        !s.ok()) {
      return s;
    }
    up->layout_ = *std::move(l);
    up->spec_text_ = args.spec->ToString();
  } else if (up->replace_) {
    up->mesh_name_ = existing->mesh;
    up->spec_text_ = existing->spec;
    up->layout_ = existing->layout;
  } else {
    // Nothing to replace and nothing to create it from: the tensor named is not there.
    return absl::NotFoundError(
        absl::StrCat("tensor '", args.name, "' not found (header.spec creates it by upload)"));
  }
  absl::StatusOr<std::vector<WorkerEndpoint>> endpoints = Endpoints(up->layout_);
  if (!endpoints.ok()) return endpoints.status();
  up->endpoints_ = *std::move(endpoints);
  up->plan_ = BandPlan(args.shape, es, band_bytes_);
  if (!WritesInOrder(up->layout_, up->plan_)) {
    up->plan_ = BandPlan(args.shape, es, std::numeric_limits<int64_t>::max());
  }
  up->zero_partials_ = up->layout_.is_partial() && up->layout_.partial_op() == ReduceOp::kSum;
  // Every rank's new buffer must fit its worker's budget now (before anything is held).
  absl::StatusOr<std::shared_ptr<AdmissionHold>> memory =
      AdmitNow(admission_, absl::StrCat("uploading '", args.name, "'"),
               LayoutBytesByRank(up->layout_, args.dtype));
  if (!memory.ok()) return memory.status();
  up->memory_ = *std::move(memory);

  up->op_ = NewOp("upload");
  up->version_ = tensors_->NewVersion();
  if (up->replace_) {
    absl::StatusOr<TensorRecord> held = tensors_->Acquire(args.name, up->op_, up->mesh_name_);
    if (!held.ok()) return held.status();
    up->old_version_ = held->version;
    up->old_holders_ = Holders(held->layout);
  } else {
    TensorRecord record;
    record.name = args.name;
    record.shape = args.shape;
    record.dtype = args.dtype;
    record.mesh = up->mesh_name_;
    record.spec = up->spec_text_;
    record.layout = up->layout_;
    record.version = up->version_;
    if (absl::Status s = tensors_->Reserve(std::move(record), up->op_); !s.ok()) return s;
  }

  // Every rank's stream opens now: a worker that cannot take its buffer fails the first band.
  for (size_t i = 0; i < up->layout_.ranks().size(); ++i) {
    const RankChunks& rc = up->layout_.ranks()[i];
    v1::ChunkData header;
    header.set_tensor(args.name);
    header.set_version(up->version_);
    header.set_dtype(DTypeToProto(args.dtype));
    *header.mutable_chunks() = RankChunksToProto(rc);
    header.set_total_bytes(rc.local_elements * es);
    up->streams_.push_back(client_->OpenWriteChunk(up->endpoints_[i], header));
    up->written_.push_back(0);
  }
  up->loss_ = Watch(up->endpoints_, up->streams_);
  up->started_ = true;
  return up;
}

TensorIo::UploadStream::~UploadStream() { Abort(); }

void TensorIo::UploadStream::WriteBand(int64_t i, std::string data, StatusCallback done) {
  const int64_t es = ElementSize(args_.dtype);
  if (i != next_band_ || i >= plan_.num_bands()) {
    return done(absl::InternalError(absl::StrCat("band ", i, " written out of order (expected ",
                                                 next_band_, " of ", plan_.num_bands(), ")")));
  }
  if (static_cast<int64_t>(data.size()) != plan_.band_bytes(i)) {
    return done(absl::InternalError(
        absl::StrCat("band ", i, " has ", data.size(), " bytes, not ", plan_.band_bytes(i))));
  }
  if (absl::Status lost = loss_->Lost(); !lost.ok()) return done(lost);
  ++next_band_;
  const Box band = plan_.band(i);
  // Each rank's part of the band, front to back in its local buffer (gaps are zeros).
  std::vector<std::string> parts(layout_.ranks().size());
  for (size_t r = 0; r < layout_.ranks().size(); ++r) {
    std::string& out = parts[r];
    for (const LocalWrite& w : BandWrites(layout_.ranks()[r], band, zero_partials_)) {
      const size_t gap = static_cast<size_t>((w.local_offset - written_[r]) * es);
      const size_t at = out.size() + gap;
      out.resize(at + static_cast<size_t>(w.box.Volume() * es), '\0');
      if (!w.zeros) {
        if (absl::Status s = PackBox(w.box, data.data(), band, out.data() + at, es); !s.ok()) {
          return done(absl::InternalError(s.message()));
        }
      }
      written_[r] = w.local_offset + w.box.Volume();
    }
  }
  std::string().swap(data);

  std::vector<size_t> targets;
  for (size_t r = 0; r < parts.size(); ++r) {
    if (!parts[r].empty()) targets.push_back(r);
  }
  std::shared_ptr<FanIn> fan = FanIn::Start(targets.size(), std::move(done));
  for (size_t r : targets) {
    const WorkerEndpoint ep = endpoints_[r];
    streams_[r]->Write(std::move(parts[r]), [fan, ep, loss = loss_](absl::Status s) {
      if (!s.ok()) {
        s = loss->Or(absl::UnavailableError(absl::StrCat(Describe(ep), ": ", s.ToString())));
      }
      fan->Report(s);
    });
  }
}

void TensorIo::FailUpload(const std::string& name, const std::string& op, int64_t version,
                          bool replace, const std::string& mesh_name,
                          const std::vector<WorkerEndpoint>& endpoints, const absl::Status& s,
                          const TensorCallback& done) {
  Drop(endpoints, name, version);
  if (replace) {
    tensors_->Release(name, op, mesh_name);
  } else {
    tensors_->CancelCreate(name, op);
  }
  if (done) done(absl::Status(s.code(), absl::StrCat("uploading '", name, "': ", s.message())));
}

void TensorIo::UploadStream::Abort() {
  if (!started_) return;  // Refused by StartUpload: it holds nothing.
  {
    absl::MutexLock lock(&mu_);
    if (ended_) return;
    ended_ = true;
  }
  for (const std::shared_ptr<ChunkWriteStream>& s : streams_) s->Cancel();
  Fail(absl::CancelledError("aborted"), nullptr);
}

void TensorIo::UploadStream::Finish(TensorCallback done) {
  {
    absl::MutexLock lock(&mu_);
    if (ended_) return done(absl::FailedPreconditionError("upload already ended"));
    ended_ = true;
  }
  if (next_band_ != plan_.num_bands()) {
    for (const std::shared_ptr<ChunkWriteStream>& s : streams_) s->Cancel();
    return Fail(absl::InternalError(absl::StrCat("finished after ", next_band_, " of ",
                                                 plan_.num_bands(), " bands")),
                done);
  }
  const int64_t es = ElementSize(args_.dtype);
  auto index = std::make_shared<absl::flat_hash_map<int64_t, size_t>>();
  for (size_t i = 0; i < layout_.ranks().size(); ++i) (*index)[layout_.ranks()[i].rank] = i;
  // The callbacks hold what they need (streams, copies of the state), not this object.
  auto streams = std::make_shared<std::vector<std::shared_ptr<ChunkWriteStream>>>(streams_);
  auto trailing = std::make_shared<std::vector<int64_t>>();
  for (size_t i = 0; i < layout_.ranks().size(); ++i) {
    trailing->push_back((layout_.ranks()[i].local_elements - written_[i]) * es);
  }
  io_->ForEachRank(
      layout_, endpoints_,
      [streams, trailing, index](const WorkerEndpoint&, const RankChunks& rc,
                                 WorkerClient::Callback<v1::RankChunks> cb) {
        const size_t i = index->at(rc.rank);
        std::shared_ptr<ChunkWriteStream> stream = (*streams)[i];
        auto finish = [stream, cb]() {
          stream->Finish([cb](absl::StatusOr<v1::WriteChunkResponse> r) {
            if (!r.ok()) return cb(r.status());
            cb(r->chunks());
          });
        };
        // Padding after the last chunk (a local buffer may be larger than its chunks).
        if ((*trailing)[i] == 0) return finish();
        stream->Write(std::string(static_cast<size_t>((*trailing)[i]), '\0'),
                      [cb, finish](absl::Status s) {
                        if (!s.ok()) return cb(s);
                        finish();
                      });
      },
      [io = io_, name = args_.name, op = op_, version = version_, replace = replace_,
       mesh_name = mesh_name_, spec_text = spec_text_, layout = layout_, old_version = old_version_,
       old_holders = old_holders_, eps = endpoints_, streams, memory = memory_, loss = loss_,
       done](absl::StatusOr<LayoutChecksums> sums) {
        // After the commit (or the drop), the admitted memory goes.
        auto release = [&memory] {
          if (memory) memory->Release();
        };
        auto fail = [&](const absl::Status& s) {
          io->FailUpload(name, op, version, replace, mesh_name, eps, s, nullptr);
          release();
          done(absl::Status(s.code(), absl::StrCat("uploading '", name, "': ", s.message())));
        };
        if (!sums.ok()) return fail(loss->Or(sums.status()));
        if (!replace) {
          if (absl::Status s =
                  io->tensors_->FinishCreate(name, op, *std::move(sums), Incarnations(eps));
              !s.ok()) {
            return fail(s);
          }
          release();
          return done(io->tensors_->Get(name));
        }
        TensorManager::NewState state;
        state.mesh = mesh_name;
        state.spec = spec_text;
        state.layout = layout;
        state.checksums = *std::move(sums);
        state.version = version;
        state.incarnations = Incarnations(eps);
        if (absl::Status s = io->tensors_->Commit(name, op, std::move(state)); !s.ok()) {
          return fail(s);
        }
        io->Drop(old_holders, name, old_version);
        release();
        done(io->tensors_->Get(name));
      });
}

void TensorIo::Upload(const UploadArgs& args, std::string data, TensorCallback done) {
  if (args.name.empty()) return done(absl::InvalidArgumentError("header.name: empty"));
  if (args.rank.has_value()) return UploadRank(args, std::move(data), std::move(done));
  const int64_t es = ElementSize(args.dtype);
  absl::StatusOr<int64_t> bytes = CheckedBytes(args.shape, es);
  if (!bytes.ok()) return done(bytes.status());
  if (static_cast<int64_t>(data.size()) != *bytes) {
    return done(absl::InvalidArgumentError(
        absl::StrCat("data: ", data.size(), " bytes for a ", ShapeToString(args.shape), " ",
                     DTypeName(args.dtype), " tensor of ", *bytes, " bytes")));
  }
  absl::StatusOr<std::shared_ptr<UploadStream>> up = StartUpload(args);
  if (!up.ok()) return done(up.status());
  // Band after band from `data`, each once the previous one was handed to the workers.
  struct Feed {
    std::shared_ptr<UploadStream> up;
    std::string data;
    TensorCallback done;
    int64_t offset = 0;
  };
  auto feed = std::make_shared<Feed>();
  feed->up = *std::move(up);
  feed->data = std::move(data);
  feed->done = std::move(done);
  auto next = std::make_shared<std::function<void(int64_t)>>();
  *next = [feed, weak = std::weak_ptr<std::function<void(int64_t)>>(next)](int64_t band) {
    if (band == feed->up->num_bands()) {
      std::string().swap(feed->data);
      return feed->up->Finish(feed->done);
    }
    const int64_t n = feed->up->band_bytes(band);
    std::string bytes =
        feed->data.substr(static_cast<size_t>(feed->offset), static_cast<size_t>(n));
    feed->offset += n;
    std::shared_ptr<std::function<void(int64_t)>> again = weak.lock();
    feed->up->WriteBand(band, std::move(bytes), [feed, again, band](absl::Status s) {
      if (!s.ok()) {
        feed->up->Abort();
        return feed->done(absl::Status(
            s.code(), absl::StrCat("uploading '", feed->up->args_.name, "': ", s.message())));
      }
      (*again)(band + 1);
    });
  };
  (*next)(0);
}

absl::StatusOr<TensorRecord> TensorIo::RankUploadTarget(const UploadArgs& args) const {
  absl::StatusOr<TensorRecord> t = tensors_->Get(args.name);
  if (!t.ok()) return t.status();
  if (t->shape != args.shape || t->dtype != args.dtype) {
    return absl::InvalidArgumentError(
        absl::StrCat("header: ", ShapeToString(args.shape), " ", DTypeName(args.dtype),
                     " does not match tensor '", args.name, "' (", ShapeToString(t->shape), " ",
                     DTypeName(t->dtype), ")"));
  }
  const int64_t rank = args.rank.value_or(-1);
  if (t->attached) {
    return absl::FailedPreconditionError(
        absl::StrCat("header.rank: tensor '", args.name, "' is attached: rank ", rank,
                     "'s buffer is its user process's memory; write it there"));
  }
  if (t->layout.Find(rank) == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat("header.rank: rank ", rank, " holds nothing of '", args.name, "'"));
  }
  return t;
}

absl::StatusOr<int64_t> TensorIo::RankUploadBytes(const UploadArgs& args) const {
  absl::StatusOr<TensorRecord> t = RankUploadTarget(args);
  if (!t.ok()) return t.status();
  return t->layout.Find(*args.rank)->local_elements * ElementSize(t->dtype);
}

void TensorIo::UploadRank(const UploadArgs& args, std::string data, TensorCallback done) {
  absl::StatusOr<TensorRecord> t = RankUploadTarget(args);
  if (!t.ok()) return done(t.status());
  const int64_t rank = *args.rank;
  const RankChunks* rc = t->layout.Find(rank);
  const int64_t es = ElementSize(t->dtype);
  if (static_cast<int64_t>(data.size()) != rc->local_elements * es) {
    return done(absl::InvalidArgumentError(absl::StrCat("data: ", data.size(), " bytes but rank ",
                                                        rank, "'s local buffer of '", args.name,
                                                        "' holds ", rc->local_elements * es)));
  }
  absl::StatusOr<WorkerRecord> w = workers_->GetByRank(rank);
  if (!w.ok()) return done(w.status());
  if (!w->alive) return done(w->DeadError("is dead"));
  const WorkerEndpoint ep = w->Endpoint();
  const std::string op = NewOp("upload");
  {
    absl::MutexLock lock(&mu_);
    auto it = downloads_.find(args.name);
    if (it != downloads_.end() && it->second > 0) {
      return done(absl::AbortedError(absl::StrCat(
          "tensor '", args.name, "' is being downloaded (", it->second,
          " downloads); a rank upload rewrites the version they read: retry after them")));
    }
    ++rank_uploads_[args.name];
  }
  // The new buffer replaces the old one only once written: both fit, or nothing starts.
  absl::StatusOr<std::shared_ptr<AdmissionHold>> memory =
      AdmitNow(admission_, absl::StrCat("uploading rank ", rank, " of '", args.name, "'"),
               {{rank, rc->local_elements * es}});
  if (!memory.ok()) {
    EndRankUpload(args.name);
    return done(memory.status());
  }
  absl::StatusOr<TensorRecord> held = tensors_->Acquire(args.name, op);
  if (!held.ok()) {
    EndRankUpload(args.name);
    return done(held.status());
  }

  v1::ChunkData header;
  header.set_tensor(args.name);
  header.set_version(held->version);
  header.set_dtype(DTypeToProto(held->dtype));
  *header.mutable_chunks() = RankChunksToProto(*rc);
  header.set_total_bytes(static_cast<int64_t>(data.size()));
  const std::string name = args.name;
  const std::vector<Chunk> want = rc->chunks;
  client_->WriteChunk(
      ep, header, std::move(data),
      [this, name, op, ep, want, done,
       memory = *std::move(memory)](absl::StatusOr<v1::WriteChunkResponse> r) {
        absl::Status s;
        ChunkChecksums sums;
        if (!r.ok()) {
          s = absl::UnavailableError(absl::StrCat(Describe(ep), ": ", r.status().ToString()));
        } else {
          absl::StatusOr<RankChunks> got = RankChunksFromProto(r->chunks(), "chunks", &sums);
          if (!got.ok() || got->chunks != want) {
            s = absl::InternalError(
                absl::StrCat(Describe(ep), " answered with other chunks than it was given"));
          }
        }
        if (s.ok()) s = tensors_->UpdateRank(name, op, ep.rank, sums, ep.incarnation);
        tensors_->Release(name, op);
        EndRankUpload(name);
        if (memory) memory->Release();
        if (!s.ok()) {
          return done(absl::Status(s.code(), absl::StrCat("uploading rank ", ep.rank, " of '", name,
                                                          "': ", s.message())));
        }
        done(tensors_->Get(name));
      });
}

void TensorIo::EndRankUpload(const std::string& name) {
  absl::MutexLock lock(&mu_);
  auto it = rank_uploads_.find(name);
  if (it != rank_uploads_.end() && --it->second <= 0) rank_uploads_.erase(it);
}

// ---- Download ----------------------------------------------------------------------------

void TensorIo::EndDownload(const std::string& name) {
  absl::MutexLock lock(&mu_);
  auto it = downloads_.find(name);
  if (it != downloads_.end() && --it->second <= 0) downloads_.erase(it);
}

absl::StatusOr<std::shared_ptr<TensorIo::DownloadStream>> TensorIo::OpenDownload(
    const std::string& name) {
  absl::StatusOr<TensorRecord> t = tensors_->Get(name);
  if (!t.ok()) return t.status();
  LivenessFn live = [this](int64_t r, int64_t inc) { return workers_->IsLive(r, inc); };
  absl::StatusOr<Layout> live_layout = LiveLayout(*t, live);
  if (!live_layout.ok()) return live_layout.status();
  std::shared_ptr<DownloadStream> d(new DownloadStream(this));
  // One live replica per chunk, spreading bytes over the holders.
  d->sources_ = ChooseSources(*live_layout, [](int64_t) { return true; });
  for (const BandSource& src : d->sources_) {
    if (d->endpoints_.contains(src.rank)) continue;
    absl::StatusOr<WorkerRecord> w = workers_->GetByRank(src.rank);
    if (!w.ok()) return w.status();
    d->endpoints_[src.rank] = w->Endpoint();
  }
  d->plan_ = BandPlan(t->shape, ElementSize(t->dtype), band_bytes_);
  d->tensor_ = *std::move(t);
  std::vector<WorkerEndpoint> sources;
  for (const auto& [rank, e] : d->endpoints_) sources.push_back(e);
  d->loss_ = Watch(std::move(sources), {});
  {
    absl::MutexLock lock(&mu_);
    if (rank_uploads_.contains(name)) {
      return absl::AbortedError(
          absl::StrCat("tensor '", name, "' is busy with a rank upload: retry after it"));
    }
    ++downloads_[name];
  }
  return d;
}

TensorIo::DownloadStream::~DownloadStream() { io_->EndDownload(tensor_.name); }

absl::Status TensorIo::DownloadStream::ReadFailed(absl::Status s) const {
  // A read of this version fails once a newer one was committed (or the tensor deleted) and
  // the old buffers dropped: that is not a worker failure, and nothing newer may be mixed in.
  absl::StatusOr<TensorRecord> now = io_->tensors_->Get(tensor_.name);
  if (!now.ok()) {
    return absl::AbortedError(absl::StrCat("tensor '", tensor_.name,
                                           "' was deleted during the download (",
                                           now.status().message(), ")"));
  }
  if (now->version != tensor_.version) {
    return absl::AbortedError(absl::StrCat("tensor '", tensor_.name, "' changed from version ",
                                           tensor_.version, " to ", now->version,
                                           " during the download: retry"));
  }
  return s;
}

void TensorIo::DownloadStream::FetchBand(int64_t i, BandCallback done) const {
  if (i < 0 || i >= plan_.num_bands()) {
    return done(absl::OutOfRangeError(
        absl::StrCat("band ", i, " of a tensor with ", plan_.num_bands(), " bands")));
  }
  if (absl::Status lost = loss_->Lost(); !lost.ok()) return done(ReadFailed(lost));
  struct Read {
    BandSource piece;
    WorkerEndpoint from;
    std::string data;
  };
  struct State {
    std::shared_ptr<const DownloadStream> stream;
    Box band;
    std::vector<Read> reads;
    std::string out;  // The band, when pieces are copied in as they arrive.
    BandCallback done;
  };
  auto state = std::make_shared<State>();
  state->stream = shared_from_this();
  state->band = plan_.band(i);
  state->done = std::move(done);
  for (BandSource& piece : BandReads(sources_, state->band)) {
    const WorkerEndpoint from = endpoints_.at(piece.rank);
    state->reads.push_back(Read{std::move(piece), from, {}});
  }
  std::shared_ptr<LossWatch> loss = loss_;
  const DType dtype = tensor_.dtype;
  const Layout& layout = tensor_.layout;
  const bool avg = layout.is_partial() && layout.partial_op() == ReduceOp::kAvg;
  const ReduceOp op = avg ? ReduceOp::kSum : layout.partial_op();
  const int64_t divisor = layout.num_partials();

  const int64_t es = ElementSize(dtype);
  // Without partials the pieces are disjoint: each is copied into the band as it arrives
  // (concurrent copies touch disjoint bytes) and freed, and a band that lies inside one chunk
  // is that chunk's piece as is. With partials, contribution 0 (sources are ordered so) is
  // copied first, the others are reduced in once all arrived, avg divides at the end.
  const bool disjoint = !layout.is_partial();
  const bool whole_piece =
      disjoint && state->reads.size() == 1 && state->reads[0].piece.box == state->band;
  if (disjoint && !whole_piece) {
    state->out.assign(static_cast<size_t>(state->band.Volume() * es), '\0');
  }
  auto assemble = [state, dtype, op, avg, divisor, es, disjoint]() {
    if (disjoint) return state->done(std::move(state->out));
    const Box& band = state->band;
    std::string out(static_cast<size_t>(band.Volume() * es), '\0');
    for (Read& r : state->reads) {
      const Box& box = r.piece.box;
      absl::Status s = r.piece.partial_index == 0
                           ? CopyBox(box, r.data.data(), box, out.data(), band, es)
                           : ReduceIntoBox(box, r.data.data(), box, out.data(), band, dtype, op);
      if (!s.ok()) return state->done(absl::InternalError(s.message()));
      std::string().swap(r.data);
    }
    if (avg) {
      absl::Status s = DivideBox(out.data(), band.Volume(), dtype, divisor);
      if (!s.ok()) return state->done(absl::InternalError(s.message()));
    }
    state->done(std::move(out));
  };

  if (state->reads.empty()) return assemble();
  // Each read writes its own piece (reads[k].data, or its disjoint bytes of out).
  std::shared_ptr<FanIn> fan =
      FanIn::Start(state->reads.size(), [state, loss, assemble](absl::Status error) {
        if (!error.ok()) return state->done(state->stream->ReadFailed(loss->Or(error)));
        assemble();
      });
  for (size_t k = 0; k < state->reads.size(); ++k) {
    const Read& r = state->reads[k];
    v1::ReadChunkRequest req;
    req.set_tensor(tensor_.name);
    req.set_version(tensor_.version);
    *req.mutable_box() = BoxToProto(r.piece.box);
    io_->client_->ReadChunk(
        r.from, req, [state, fan, k, es, disjoint, whole_piece](absl::StatusOr<std::string> got) {
          Read& r = state->reads[k];
          absl::Status s;
          if (!got.ok()) {
            s = absl::UnavailableError(absl::StrCat("reading ", r.piece.box.ToString(), " from ",
                                                    Describe(r.from), ": ",
                                                    got.status().ToString()));
          } else if (static_cast<int64_t>(got->size()) != r.piece.box.Volume() * es) {
            s = absl::UnavailableError(absl::StrCat("reading ", r.piece.box.ToString(), " from ",
                                                    Describe(r.from), ": got ", got->size(),
                                                    " bytes, want ", r.piece.box.Volume() * es));
          } else if (whole_piece) {
            state->out = *std::move(got);
          } else if (disjoint) {
            s = CopyBox(r.piece.box, got->data(), r.piece.box, state->out.data(), state->band, es);
            if (!s.ok()) s = absl::InternalError(s.message());
          } else {
            r.data = *std::move(got);
          }
          fan->Report(s);
        });
  }
}

void TensorIo::Download(const std::string& name, DownloadCallback done) {
  absl::StatusOr<std::shared_ptr<DownloadStream>> d = OpenDownload(name);
  if (!d.ok()) return done(d.status());
  struct Collect {
    std::shared_ptr<DownloadStream> stream;
    DownloadedTensor out;
    DownloadCallback done;
  };
  auto c = std::make_shared<Collect>();
  c->stream = *std::move(d);
  c->out.tensor = c->stream->tensor();
  c->out.data.reserve(static_cast<size_t>(c->out.tensor.bytes()));
  c->done = std::move(done);
  auto next = std::make_shared<std::function<void(int64_t)>>();
  *next = [c, weak = std::weak_ptr<std::function<void(int64_t)>>(next)](int64_t band) {
    if (band == c->stream->num_bands()) {
      DownloadedTensor out = std::move(c->out);
      DownloadCallback done = std::move(c->done);
      c->stream.reset();
      return done(std::move(out));
    }
    std::shared_ptr<std::function<void(int64_t)>> again = weak.lock();
    c->stream->FetchBand(band, [c, again, band](absl::StatusOr<std::string> r) {
      if (!r.ok()) {
        c->stream.reset();
        return c->done(r.status());
      }
      c->out.data.append(*r);
      (*again)(band + 1);
    });
  };
  (*next)(0);
}

absl::Status TensorIo::Delete(const std::string& name) {
  absl::StatusOr<TensorRecord> t = tensors_->Remove(name);
  if (!t.ok()) return t.status();
  Drop(Holders(t->layout), name, -1);
  // Its buffers no longer count: waiting plans may fit (the workers' next reports confirm).
  if (admission_ != nullptr) admission_->Recheck();
  return absl::OkStatus();
}

}  // namespace shardcoord
