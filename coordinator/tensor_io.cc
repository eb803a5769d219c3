#include "coordinator/tensor_io.h"

#include <algorithm>
#include <map>
#include <memory>
#include <utility>

#include "absl/strings/str_cat.h"
#include "sharding/box_copy.h"
#include "sharding/tensor_split.h"

namespace shardcoord {
namespace {

std::string Describe(const WorkerEndpoint& w) {
  return absl::StrCat("worker ", w.name, " (rank ", w.rank, ")");
}

absl::flat_hash_map<int64_t, int64_t> Incarnations(const std::vector<WorkerEndpoint>& eps) {
  absl::flat_hash_map<int64_t, int64_t> out;
  for (const WorkerEndpoint& e : eps) out[e.rank] = e.incarnation;
  return out;
}

}  // namespace

std::string TensorIo::NewOp(const char* kind) {
  absl::MutexLock lock(&mu_);
  return absl::StrCat(kind, "-", next_op_++);
}

absl::StatusOr<std::vector<WorkerEndpoint>> TensorIo::Endpoints(const Layout& layout) const {
  std::vector<WorkerEndpoint> out;
  for (const RankChunks& rc : layout.ranks()) {
    absl::StatusOr<WorkerRecord> w = workers_->GetByRank(rc.rank);
    if (!w.ok()) return w.status();
    if (!w->alive) {
      return absl::FailedPreconditionError(
          absl::StrCat(w->Describe(), " is dead (", w->death_reason, ")"));
    }
    out.push_back(WorkerEndpoint{w->spec.name, w->rank, w->spec.address, w->incarnation});
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

void TensorIo::ForEachRank(const Layout& layout, const std::vector<WorkerEndpoint>& endpoints,
                           const RankCall& call,
                           std::function<void(absl::StatusOr<LayoutChecksums>)> done) {
  struct State {
    Layout layout;
    std::vector<WorkerEndpoint> endpoints;
    std::function<void(absl::StatusOr<LayoutChecksums>)> done;
    absl::Mutex mu;
    size_t remaining ABSL_GUARDED_BY(mu) = 0;
    LayoutChecksums sums ABSL_GUARDED_BY(mu);
    absl::Status error ABSL_GUARDED_BY(mu);
  };
  auto state = std::make_shared<State>();
  state->layout = layout;
  state->endpoints = endpoints;
  state->done = std::move(done);
  const size_t n = layout.ranks().size();
  if (n == 0) return state->done(LayoutChecksums{});
  {
    absl::MutexLock lock(&state->mu);
    state->remaining = n;
    state->sums.resize(n);
  }
  for (size_t i = 0; i < n; ++i) {
    const RankChunks& rc = state->layout.ranks()[i];
    call(state->endpoints[i], rc, [state, i](absl::StatusOr<v1::RankChunks> r) {
      const WorkerEndpoint& ep = state->endpoints[i];
      const RankChunks& want = state->layout.ranks()[i];
      absl::Status s;
      ChunkChecksums sums;
      if (!r.ok()) {
        s = absl::UnavailableError(absl::StrCat(Describe(ep), ": ", r.status().ToString()));
      } else {
        absl::StatusOr<RankChunks> got = RankChunksFromProto(*r, "chunks", &sums);
        if (!got.ok()) {
          s = absl::InternalError(absl::StrCat(Describe(ep), " answered with bad chunks: ",
                                               got.status().message()));
        } else if (got->chunks != want.chunks) {
          s = absl::InternalError(
              absl::StrCat(Describe(ep), " answered with other chunks than it was given"));
        }
      }
      bool last = false;
      {
        absl::MutexLock lock(&state->mu);
        if (!s.ok() && state->error.ok()) state->error = s;
        if (s.ok()) state->sums[i] = std::move(sums);
        last = --state->remaining == 0;
      }
      if (!last) return;
      absl::Status error;
      LayoutChecksums all;
      {
        absl::MutexLock lock(&state->mu);
        error = state->error;
        all = std::move(state->sums);
      }
      if (!error.ok()) return state->done(error);
      absl::Status replicas = CheckReplicaChecksums(state->layout, all, [&](int64_t rank) {
        for (const WorkerEndpoint& e : state->endpoints) {
          if (e.rank == rank) return Describe(e);
        }
        return absl::StrCat("rank ", rank);
      });
      if (!replicas.ok()) return state->done(replicas);
      state->done(std::move(all));
    });
  }
}

// ---- Create ------------------------------------------------------------------------------

void TensorIo::Create(const CreateTensorArgs& args, TensorCallback done) {
  if (args.name.empty()) return done(absl::InvalidArgumentError("name: empty"));
  if (args.spec.mesh.empty()) {
    return done(absl::InvalidArgumentError("spec.mesh: empty (name the mesh)"));
  }
  absl::StatusOr<MeshRecord> mesh = meshes_->Get(args.spec.mesh);
  if (!mesh.ok()) return done(mesh.status());
  absl::StatusOr<Layout> layout = LayoutForSpec(args.spec, mesh->mesh, args.shape, "spec");
  if (!layout.ok()) return done(layout.status());
  absl::StatusOr<std::vector<WorkerEndpoint>> endpoints = Endpoints(*layout);
  if (!endpoints.ok()) return done(endpoints.status());

  const std::string op = NewOp("create");
  TensorRecord record;
  record.name = args.name;
  record.shape = args.shape;
  record.dtype = args.dtype;
  record.mesh = args.spec.mesh;
  record.spec = args.spec.ToString();
  record.layout = *layout;
  record.version = tensors_->NewVersion();
  const int64_t version = record.version;
  if (absl::Status s = tensors_->Reserve(std::move(record), op); !s.ok()) return done(s);

  v1::FillRequest base;
  base.set_tensor(args.name);
  base.set_version(version);
  base.set_dtype(DTypeToProto(args.dtype));
  ShapeToProto(args.shape, base.mutable_global_shape());
  base.set_init(args.init == v1::INIT_KIND_UNSPECIFIED ? v1::ZEROS : args.init);
  base.set_seed(args.seed);
  if (layout->is_partial()) base.set_partial_op(ReduceOpToProto(layout->partial_op()));
  const std::string name = args.name;
  // A Partial(sum) tensor holds its value in contribution 0 and zeros in the others (as
  // ChunkUnsharded splits one); avg, min and max hold the value in every contribution.
  const bool zero_other_partials =
      layout->is_partial() && layout->partial_op() == ReduceOp::kSum;
  ForEachRank(
      *layout, *endpoints,
      [this, base, zero_other_partials](const WorkerEndpoint& ep, const RankChunks& rc,
                                        WorkerClient::Callback<v1::RankChunks> cb) {
        v1::FillRequest req = base;
        *req.mutable_chunks() = RankChunksToProto(rc);
        if (zero_other_partials && !rc.chunks.empty() &&
            std::all_of(rc.chunks.begin(), rc.chunks.end(),
                        [](const Chunk& c) { return c.partial_index != 0; })) {
          req.set_init(v1::ZEROS);
        }
        client_->Fill(ep, req, [cb](absl::StatusOr<v1::FillResponse> r) {
          if (!r.ok()) return cb(r.status());
          cb(r->chunks());
        });
      },
      [this, name, op, version, eps = *endpoints,
       done](absl::StatusOr<LayoutChecksums> sums) {
        if (!sums.ok()) {
          Drop(eps, name, version);
          tensors_->CancelCreate(name, op);
          return done(absl::Status(sums.status().code(),
                                   absl::StrCat("creating '", name, "': ", sums.status().message())));
        }
        if (absl::Status s = tensors_->FinishCreate(name, op, *std::move(sums), Incarnations(eps));
            !s.ok()) {
          Drop(eps, name, version);
          return done(s);
        }
        done(tensors_->Get(name));
      });
}

// ---- Upload ------------------------------------------------------------------------------

void TensorIo::Upload(const UploadArgs& args, std::string data, TensorCallback done) {
  if (args.name.empty()) return done(absl::InvalidArgumentError("header.name: empty"));
  if (args.rank.has_value()) return UploadRank(args, std::move(data), std::move(done));
  const int64_t es = ElementSize(args.dtype);
  absl::StatusOr<int64_t> bytes = CheckedBytes(args.shape, es);
  if (!bytes.ok()) return done(bytes.status());
  if (static_cast<int64_t>(data.size()) != *bytes) {
    return done(absl::InvalidArgumentError(absl::StrCat(
        "data: ", data.size(), " bytes for a ", ShapeToString(args.shape), " ",
        DTypeName(args.dtype), " tensor of ", *bytes, " bytes")));
  }

  absl::StatusOr<TensorRecord> existing = tensors_->Get(args.name);
  if (!existing.ok() && existing.status().code() != absl::StatusCode::kNotFound) {
    return done(existing.status());
  }
  const bool replace = existing.ok();
  if (replace && (existing->shape != args.shape || existing->dtype != args.dtype)) {
    return done(absl::AlreadyExistsError(absl::StrCat(
        "tensor '", args.name, "' exists as ", ShapeToString(existing->shape), " ",
        DTypeName(existing->dtype), ", not ", ShapeToString(args.shape), " ",
        DTypeName(args.dtype))));
  }
  std::string mesh_name, spec_text;
  Layout layout;
  if (args.spec.has_value()) {
    mesh_name = !args.spec->mesh.empty() ? args.spec->mesh : (replace ? existing->mesh : "");
    if (mesh_name.empty()) {
      return done(absl::InvalidArgumentError("header.spec.mesh: empty (name the mesh)"));
    }
    absl::StatusOr<MeshRecord> mesh = meshes_->Get(mesh_name);
    if (!mesh.ok()) return done(mesh.status());
    absl::StatusOr<Layout> l = LayoutForSpec(*args.spec, mesh->mesh, args.shape, "header.spec");
    if (!l.ok()) return done(l.status());
    layout = *std::move(l);
    spec_text = args.spec->ToString();
  } else if (replace) {
    mesh_name = existing->mesh;
    spec_text = existing->spec;
    layout = existing->layout;
  } else {
    return done(absl::InvalidArgumentError(
        absl::StrCat("header.spec: required to upload new tensor '", args.name, "'")));
  }
  absl::StatusOr<std::vector<WorkerEndpoint>> endpoints = Endpoints(layout);
  if (!endpoints.ok()) return done(endpoints.status());
  absl::StatusOr<std::vector<std::vector<char>>> split = ChunkUnsharded(layout, data.data(), es);
  if (!split.ok()) return done(split.status());
  data.clear();
  data.shrink_to_fit();

  const std::string op = NewOp("upload");
  const int64_t version = tensors_->NewVersion();
  std::vector<WorkerEndpoint> old_holders;
  int64_t old_version = 0;
  if (replace) {
    absl::StatusOr<TensorRecord> held = tensors_->Acquire(args.name, op, mesh_name);
    if (!held.ok()) return done(held.status());
    old_version = held->version;
    for (const RankChunks& rc : held->layout.ranks()) {
      absl::StatusOr<WorkerRecord> w = workers_->GetByRank(rc.rank);
      if (w.ok()) {
        old_holders.push_back(WorkerEndpoint{w->spec.name, w->rank, w->spec.address, w->incarnation});
      }
    }
  } else {
    TensorRecord record;
    record.name = args.name;
    record.shape = args.shape;
    record.dtype = args.dtype;
    record.mesh = mesh_name;
    record.spec = spec_text;
    record.layout = layout;
    record.version = version;
    if (absl::Status s = tensors_->Reserve(std::move(record), op); !s.ok()) return done(s);
  }

  auto buffers = std::make_shared<std::vector<std::vector<char>>>(*std::move(split));
  auto index = std::make_shared<absl::flat_hash_map<int64_t, size_t>>();
  for (size_t i = 0; i < layout.ranks().size(); ++i) (*index)[layout.ranks()[i].rank] = i;
  const std::string name = args.name;
  const DType dtype = args.dtype;
  ForEachRank(
      layout, *endpoints,
      [this, buffers, index, name, version, dtype, es](const WorkerEndpoint& ep,
                                                        const RankChunks& rc,
                                                        WorkerClient::Callback<v1::RankChunks> cb) {
        std::vector<char>& buf = (*buffers)[index->at(rc.rank)];
        v1::ChunkData header;
        header.set_tensor(name);
        header.set_version(version);
        header.set_dtype(DTypeToProto(dtype));
        *header.mutable_chunks() = RankChunksToProto(rc);
        header.set_total_bytes(rc.local_elements * es);
        std::string bytes(buf.begin(), buf.end());
        std::vector<char>().swap(buf);
        client_->WriteChunk(ep, header, std::move(bytes),
                            [cb](absl::StatusOr<v1::WriteChunkResponse> r) {
                              if (!r.ok()) return cb(r.status());
                              cb(r->chunks());
                            });
      },
      [this, name, op, version, replace, mesh_name, spec_text, layout, old_version, old_holders,
       eps = *endpoints, done](absl::StatusOr<LayoutChecksums> sums) {
        auto fail = [&](const absl::Status& s) {
          Drop(eps, name, version);
          if (replace) {
            tensors_->Release(name, op, mesh_name);
          } else {
            tensors_->CancelCreate(name, op);
          }
          done(absl::Status(s.code(), absl::StrCat("uploading '", name, "': ", s.message())));
        };
        if (!sums.ok()) return fail(sums.status());
        if (!replace) {
          if (absl::Status s = tensors_->FinishCreate(name, op, *std::move(sums),
                                                      Incarnations(eps));
              !s.ok()) {
            return fail(s);
          }
          return done(tensors_->Get(name));
        }
        TensorManager::NewState state;
        state.mesh = mesh_name;
        state.spec = spec_text;
        state.layout = layout;
        state.checksums = *std::move(sums);
        state.version = version;
        state.incarnations = Incarnations(eps);
        if (absl::Status s = tensors_->Commit(name, op, std::move(state)); !s.ok()) return fail(s);
        Drop(old_holders, name, old_version);
        done(tensors_->Get(name));
      });
}

void TensorIo::UploadRank(const UploadArgs& args, std::string data, TensorCallback done) {
  absl::StatusOr<TensorRecord> t = tensors_->Get(args.name);
  if (!t.ok()) return done(t.status());
  if (t->shape != args.shape || t->dtype != args.dtype) {
    return done(absl::InvalidArgumentError(absl::StrCat(
        "header: ", ShapeToString(args.shape), " ", DTypeName(args.dtype), " does not match tensor '",
        args.name, "' (", ShapeToString(t->shape), " ", DTypeName(t->dtype), ")")));
  }
  const int64_t rank = *args.rank;
  const RankChunks* rc = t->layout.Find(rank);
  if (rc == nullptr) {
    return done(absl::InvalidArgumentError(
        absl::StrCat("header.rank: rank ", rank, " holds nothing of '", args.name, "'")));
  }
  const int64_t es = ElementSize(t->dtype);
  if (static_cast<int64_t>(data.size()) != rc->local_elements * es) {
    return done(absl::InvalidArgumentError(
        absl::StrCat("data: ", data.size(), " bytes but rank ", rank, "'s local buffer of '",
                     args.name, "' holds ", rc->local_elements * es)));
  }
  absl::StatusOr<WorkerRecord> w = workers_->GetByRank(rank);
  if (!w.ok()) return done(w.status());
  if (!w->alive) {
    return done(absl::FailedPreconditionError(
        absl::StrCat(w->Describe(), " is dead (", w->death_reason, ")")));
  }
  const WorkerEndpoint ep{w->spec.name, w->rank, w->spec.address, w->incarnation};
  const std::string op = NewOp("upload");
  absl::StatusOr<TensorRecord> held = tensors_->Acquire(args.name, op);
  if (!held.ok()) return done(held.status());

  v1::ChunkData header;
  header.set_tensor(args.name);
  header.set_version(held->version);
  header.set_dtype(DTypeToProto(held->dtype));
  *header.mutable_chunks() = RankChunksToProto(*rc);
  header.set_total_bytes(static_cast<int64_t>(data.size()));
  const std::string name = args.name;
  const std::vector<Chunk> want = rc->chunks;
  client_->WriteChunk(ep, header, std::move(data),
                      [this, name, op, ep, want, done](absl::StatusOr<v1::WriteChunkResponse> r) {
                        absl::Status s;
                        ChunkChecksums sums;
                        if (!r.ok()) {
                          s = absl::UnavailableError(
                              absl::StrCat(Describe(ep), ": ", r.status().ToString()));
                        } else {
                          absl::StatusOr<RankChunks> got =
                              RankChunksFromProto(r->chunks(), "chunks", &sums);
                          if (!got.ok() || got->chunks != want) {
                            s = absl::InternalError(absl::StrCat(
                                Describe(ep), " answered with other chunks than it was given"));
                          }
                        }
                        if (s.ok()) s = tensors_->UpdateRank(name, op, ep.rank, sums, ep.incarnation);
                        tensors_->Release(name, op);
                        if (!s.ok()) {
                          return done(absl::Status(
                              s.code(), absl::StrCat("uploading rank ", ep.rank, " of '", name,
                                                     "': ", s.message())));
                        }
                        done(tensors_->Get(name));
                      });
}

// ---- Download ----------------------------------------------------------------------------

void TensorIo::Download(const std::string& name, DownloadCallback done) {
  absl::StatusOr<TensorRecord> t = tensors_->Get(name);
  if (!t.ok()) return done(t.status());
  LivenessFn live = [this](int64_t r, int64_t inc) { return workers_->IsLive(r, inc); };
  absl::StatusOr<Layout> live_layout = LiveLayout(*t, live);
  if (!live_layout.ok()) return done(live_layout.status());
  const int64_t es = ElementSize(t->dtype);

  // One live replica per chunk, spreading bytes over the holders.
  struct Piece {
    Box box;
    int64_t partial_index = 0;
    WorkerEndpoint from;
    std::string data;
  };
  std::map<std::pair<Box, int64_t>, size_t> index;
  std::vector<Piece> pieces;
  std::map<int64_t, int64_t> load;
  for (const RankChunks& rc : live_layout->ranks()) {
    for (const Chunk& c : rc.chunks) {
      if (c.box.Empty()) continue;
      auto [it, inserted] = index.try_emplace({c.box, c.partial_index}, pieces.size());
      absl::StatusOr<WorkerRecord> w = workers_->GetByRank(rc.rank);
      if (!w.ok()) return done(w.status());
      const WorkerEndpoint ep{w->spec.name, w->rank, w->spec.address, w->incarnation};
      if (inserted) {
        pieces.push_back(Piece{c.box, c.partial_index, ep, {}});
        load[rc.rank] += c.box.Volume();
      } else if (load[rc.rank] + c.box.Volume() < load[pieces[it->second].from.rank]) {
        load[pieces[it->second].from.rank] -= c.box.Volume();
        load[rc.rank] += c.box.Volume();
        pieces[it->second].from = ep;
      }
    }
  }

  struct State {
    TensorRecord tensor;
    std::vector<Piece> pieces;
    DownloadCallback done;
    absl::Mutex mu;
    size_t remaining ABSL_GUARDED_BY(mu) = 0;
    absl::Status error ABSL_GUARDED_BY(mu);
  };
  auto state = std::make_shared<State>();
  state->tensor = *std::move(t);
  state->pieces = std::move(pieces);
  state->done = std::move(done);

  auto assemble = [state, es]() {
    const TensorRecord& t = state->tensor;
    DownloadedTensor out;
    out.data.assign(static_cast<size_t>(t.bytes()), '\0');
    const Box whole = Box::Whole(t.shape);
    // Contribution 0 first: it covers the whole tensor, the others reduce into it.
    std::stable_sort(state->pieces.begin(), state->pieces.end(),
                     [](const Piece& a, const Piece& b) { return a.partial_index < b.partial_index; });
    const ReduceOp op = t.layout.partial_op() == ReduceOp::kAvg ? ReduceOp::kSum
                                                                : t.layout.partial_op();
    for (const Piece& p : state->pieces) {
      absl::Status s = p.partial_index == 0
                           ? CopyBox(p.box, p.data.data(), p.box, out.data.data(), whole, es)
                           : ReduceIntoBox(p.box, p.data.data(), p.box, out.data.data(), whole,
                                           t.dtype, op);
      if (!s.ok()) return state->done(absl::InternalError(s.message()));
    }
    if (t.layout.is_partial() && t.layout.partial_op() == ReduceOp::kAvg) {
      absl::Status s = DivideBox(out.data.data(), whole.Volume(), t.dtype, t.layout.num_partials());
      if (!s.ok()) return state->done(absl::InternalError(s.message()));
    }
    out.tensor = t;
    state->done(std::move(out));
  };

  if (state->pieces.empty()) return assemble();
  {
    absl::MutexLock lock(&state->mu);
    state->remaining = state->pieces.size();
  }
  for (size_t i = 0; i < state->pieces.size(); ++i) {
    const Piece& p = state->pieces[i];
    v1::ReadChunkRequest req;
    req.set_tensor(state->tensor.name);
    req.set_version(state->tensor.version);
    *req.mutable_box() = BoxToProto(p.box);
    client_->ReadChunk(p.from, req, [state, i, es, assemble](absl::StatusOr<std::string> r) {
      Piece& p = state->pieces[i];
      absl::Status s;
      if (!r.ok()) {
        s = absl::UnavailableError(absl::StrCat("reading ", p.box.ToString(), " from ",
                                                Describe(p.from), ": ", r.status().ToString()));
      } else if (static_cast<int64_t>(r->size()) != p.box.Volume() * es) {
        s = absl::UnavailableError(absl::StrCat("reading ", p.box.ToString(), " from ",
                                                Describe(p.from), ": got ", r->size(),
                                                " bytes, want ", p.box.Volume() * es));
      } else {
        p.data = *std::move(r);
      }
      bool last = false;
      absl::Status error;
      {
        absl::MutexLock lock(&state->mu);
        if (!s.ok() && state->error.ok()) state->error = s;
        last = --state->remaining == 0;
        error = state->error;
      }
      if (!last) return;
      if (!error.ok()) return state->done(error);
      assemble();
    });
  }
}

absl::Status TensorIo::Delete(const std::string& name) {
  absl::StatusOr<TensorRecord> t = tensors_->Remove(name);
  if (!t.ok()) return t.status();
  std::vector<WorkerEndpoint> holders;
  for (const RankChunks& rc : t->layout.ranks()) {
    absl::StatusOr<WorkerRecord> w = workers_->GetByRank(rc.rank);
    if (w.ok()) holders.push_back(WorkerEndpoint{w->spec.name, w->rank, w->spec.address, w->incarnation});
  }
  Drop(holders, name, -1);
  return absl::OkStatus();
}

}  // namespace shardcoord
