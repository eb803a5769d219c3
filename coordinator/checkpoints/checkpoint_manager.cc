#include "coordinator/checkpoints/checkpoint_manager.h"

#include <algorithm>
#include <memory>
#include <set>
#include <utility>

#include "absl/random/random.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "common/fan_in.h"
#include "common/start_end_join.h"
#include "sharding/block_quant.h"
#include "sharding/cast.h"
#include "sharding/checkpoint_plan.h"
#include "sharding/names.h"

namespace shardcoord {
namespace {

// Ended operations kept for Progress.
constexpr size_t kKeepEnded = 64;

std::string RandomHex() {
  static absl::Mutex mu(absl::kConstInit);
  static absl::BitGen* gen = new absl::BitGen();
  absl::MutexLock lock(&mu);
  return absl::StrFormat("%016x", absl::Uniform<uint64_t>(*gen));
}

absl::StatusOr<std::string> CleanDir(const std::string& dir) {
  std::string d = dir;
  while (d.size() > 1 && d.back() == '/') d.pop_back();
  if (d.empty() || d[0] != '/' || d == "/") {
    return absl::InvalidArgumentError(
        absl::StrCat("dir: '", dir, "' is not an absolute path below /"));
  }
  return d;
}

absl::Status Prefixed(absl::string_view prefix, const absl::Status& s) {
  return absl::Status(s.code(), absl::StrCat(prefix, s.message()));
}

constexpr absl::string_view kScaleSuffix = "_scale_inv";

// With dequantize: whether `name` is the scale of an f8_e4m3 tensor of the index (consumed,
// never loaded).
bool ConsumedScale(const CheckpointIndex& index, const std::string& name) {
  if (!absl::EndsWith(name, kScaleSuffix)) return false;
  const CheckpointTensor* base = index.Find(name.substr(0, name.size() - kScaleSuffix.size()));
  return base != nullptr && base->dtype == DType::kF8E4M3;
}

// A dtype block-scaled FP8 dequantizes into (sharding/block_quant.h).
bool DequantizesInto(DType dtype) { return IsFloat(dtype) && dtype != DType::kF8E8M0; }

// Checks that f8_e4m3 `t` can be dequantized: its scale tensor (t + "_scale_inv", f32 of
// BlockScaleShape) is in the index (INVALID_ARGUMENT naming what was expected and found) and
// every piece of t starts on a block boundary (FAILED_PRECONDITION naming it).
absl::Status CheckDequantizable(const CheckpointTensor& t, const CheckpointIndex& index,
                                const BlockSize& block, const CheckpointTensor** scale) {
  const std::string name = absl::StrCat(t.name, kScaleSuffix);
  absl::StatusOr<Shape> want = BlockScaleShape(t.shape, block);
  if (!want.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("f8_e4m3 '", t.name, "' of shape ", ShapeToString(t.shape),
                     " cannot be dequantized: ", want.status().message()));
  }
  const CheckpointTensor* s = index.Find(name);
  if (s == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat(
        "f8_e4m3 '", t.name, "' has no scale tensor '", name, "' in the checkpoint (expected f32 ",
        ShapeToString(*want), " for blocks ", BlockQuantizationText(block), ")"));
  }
  if (s->dtype != DType::kF32 || s->shape != *want) {
    return absl::InvalidArgumentError(
        absl::StrCat("the scale '", name, "' of f8_e4m3 '", t.name, "' ", ShapeToString(t.shape),
                     " is ", DTypeName(s->dtype), " ", ShapeToString(s->shape), " but blocks ",
                     BlockQuantizationText(block), " need f32 ", ShapeToString(*want)));
  }
  for (const CheckpointPiece& piece : t.pieces) {
    if (piece.box.Empty()) continue;
    if (absl::StatusOr<Box> b = BlockScaleBox(piece.box, block); !b.ok()) {
      return absl::FailedPreconditionError(
          absl::StrCat("f8_e4m3 '", t.name, "': its piece '", piece.entry, "' ",
                       b.status().message(), " (a dequantizing load reads whole blocks)"));
    }
  }
  *scale = s;
  return absl::OkStatus();
}

// A run reading rows [row_begin, row_end) of `piece`, checked by the index's checksums where
// it covers them whole.
void AddReadRun(const CheckpointFiles& files, const CheckpointPiece& piece, int64_t row_begin,
                int64_t row_end, int64_t esize, v1::CheckpointReadRun* out) {
  const SafetensorsHeader& h = files.headers.at(piece.file);
  const SafetensorsEntry* e = h.Find(piece.entry);
  const int64_t row_bytes = BoxRowElements(piece.box) * esize;
  out->set_file(piece.file);
  out->set_entry(piece.entry);
  out->set_offset(h.data_start() + e->begin + row_begin * row_bytes);
  out->set_bytes((row_end - row_begin) * row_bytes);
  const int64_t rows = BoxRows(piece.box);
  const int64_t per = piece.rows_per_block;
  if (per > 0 && row_begin % per == 0 && (row_end % per == 0 || row_end == rows)) {
    out->set_block_bytes(per * row_bytes);
    for (int64_t k = row_begin / per; k < (row_end + per - 1) / per; ++k) {
      out->add_blocks(piece.blocks[static_cast<size_t>(k)]);
    }
  } else if (piece.has_xxh64 && row_begin == 0 && row_end == rows) {
    out->set_has_xxh64(true);
    out->set_xxh64(piece.xxh64);
  }
}

// The scale rows a reader of `run` (rows of a dequantized tensor) reads: the f32 scales of its
// blocks, which must be one contiguous row range of one piece of the scale tensor.
struct ScaleRead {
  Box box;  // In the scale tensor: rows [row_begin, row_end) of the piece.
  size_t piece = 0;
  int64_t row_begin = 0;
  int64_t row_end = 0;
};
absl::StatusOr<ScaleRead> ScaleReadOf(const CheckpointTensor& tensor, const CheckpointTensor& scale,
                                      const Box& run, const BlockSize& block) {
  absl::StatusOr<Box> box = BlockScaleBox(run, block);
  if (!box.ok()) {
    return absl::FailedPreconditionError(
        absl::StrCat("tensor '", tensor.name, "': ", box.status().message()));
  }
  for (size_t p = 0; p < scale.pieces.size(); ++p) {
    const Box& pb = scale.pieces[p].box;
    if (!pb.Contains(*box)) continue;
    bool rows = true;
    for (size_t d = 1; d < pb.ndim(); ++d) {
      rows = rows && box->offset(d) == pb.offset(d) && box->shape(d) == pb.shape(d);
    }
    if (!rows) break;
    ScaleRead out;
    out.piece = p;
    out.row_begin = box->offset(0) - pb.offset(0);
    out.row_end = out.row_begin + box->shape(0);
    // Whole checksum blocks of the piece (or the whole piece, checked by its xxh64), so that
    // the reader checks its scales as every run: a few more scale rows, which are small.
    const CheckpointPiece& piece = scale.pieces[p];
    const int64_t piece_rows = BoxRows(pb);
    if (piece.rows_per_block > 0) {
      out.row_begin = out.row_begin / piece.rows_per_block * piece.rows_per_block;
      out.row_end = std::min(piece_rows, (out.row_end + piece.rows_per_block - 1) /
                                             piece.rows_per_block * piece.rows_per_block);
    } else if (piece.has_xxh64) {
      out.row_begin = 0;
      out.row_end = piece_rows;
    }
    Shape offset = pb.offset(), shape = pb.shape();
    offset[0] += out.row_begin;
    shape[0] = out.row_end - out.row_begin;
    out.box = Box(std::move(offset), std::move(shape));
    return out;
  }
  return absl::FailedPreconditionError(
      absl::StrCat("tensor '", tensor.name, "': the scales ", box->ToString(), " of rows ",
                   run.ToString(), " are not whole rows of one piece of '", scale.name,
                   "' (a dequantizing load reads each reader's scales in one run)"));
}

}  // namespace

// ---- Reading a checkpoint's index ----------------------------------------------------------

absl::StatusOr<CheckpointFiles> ParseCheckpointFiles(const v1::ReadCheckpointIndexResponse& read) {
  CheckpointFiles out;
  out.dir = read.dir();
  std::map<std::string, const v1::CheckpointFileHeader*> listed;
  for (const v1::CheckpointFileHeader& f : read.files()) listed[f.file()] = &f;
  // Only the files the checkpoint uses are parsed and checked (others in the directory are
  // ignored).
  std::set<std::string> used;
  if (!read.index_json().empty()) {
    absl::StatusOr<CheckpointIndex> index = ParseCheckpointIndex(read.index_json());
    if (!index.ok()) return Prefixed("index.json: ", index.status());
    out.index = *std::move(index);
    for (const CheckpointFile& f : out.index.files) {
      if (listed.count(f.file) == 0) {
        return absl::DataLossError(
            absl::StrCat(f.file, ": listed in index.json but missing from ", out.dir));
      }
      used.insert(f.file);
    }
  } else {
    out.plain = true;
    for (const auto& [file, f] : listed) used.insert(file);
  }
  for (const std::string& file : used) {
    absl::StatusOr<SafetensorsHeader> h = ParseSafetensorsHeader(listed.at(file)->json());
    if (!h.ok()) return Prefixed(absl::StrCat(file, ": "), h.status());
    out.headers[file] = *std::move(h);
    out.file_bytes[file] = listed.at(file)->file_bytes();
  }
  for (const std::string& file : used) {
    const SafetensorsHeader& h = out.headers.at(file);
    const int64_t size = out.file_bytes.at(file);
    for (const SafetensorsEntry& e : h.entries) {
      if (h.data_start() + e.end > size) {
        return absl::DataLossError(absl::StrCat(file, ": entry \"", e.name, "\" ends at byte ",
                                                h.data_start() + e.end, " but the file has ", size,
                                                " bytes (truncated)"));
      }
    }
    if (size != h.file_bytes()) {
      return absl::DataLossError(absl::StrCat(file, ": ", size, " bytes but its header describes ",
                                              h.file_bytes(), " (trailing data)"));
    }
  }
  if (out.plain) {
    std::vector<std::pair<std::string, SafetensorsHeader>> files(out.headers.begin(),
                                                                 out.headers.end());
    absl::StatusOr<CheckpointIndex> index = IndexFromSafetensors(files);
    if (!index.ok()) return index.status();
    out.index = *std::move(index);
    return out;
  }
  for (const CheckpointFile& f : out.index.files) {
    if (f.bytes != out.file_bytes.at(f.file)) {
      return absl::DataLossError(absl::StrCat(f.file, ": ", out.file_bytes.at(f.file),
                                              " bytes but index.json says ", f.bytes,
                                              " (the file changed)"));
    }
    if (absl::Status s = CheckPiecesAgainstHeader(out.index, f.file, out.headers.at(f.file));
        !s.ok()) {
      return absl::DataLossError(s.message());
    }
  }
  return out;
}

// ---- Common ----------------------------------------------------------------------------------

CheckpointManager::CheckpointManager(const Clock* clock, WorkerManager* workers,
                                     MeshManager* meshes, TensorManager* tensors,
                                     PlanManager* plans, WorkerClient* client,
                                     CheckpointManagerOptions options)
    : clock_(clock),
      workers_(workers),
      meshes_(meshes),
      tensors_(tensors),
      plans_(plans),
      client_(client),
      options_(options) {}

std::string CheckpointManager::NewOp(const char* kind) {
  absl::MutexLock lock(&mu_);
  return absl::StrCat(kind, "-", next_op_++, "-", RandomHex().substr(0, 8));
}

template <typename State, typename Args, typename Callback>
std::shared_ptr<State> CheckpointManager::NewState(const char* kind, Args args, Callback done) {
  auto st = std::make_shared<State>();
  st->args = std::move(args);
  st->done = std::move(done);
  st->op = NewOp(kind);
  st->start = clock_->Now();
  if (st->args.id.empty()) st->args.id = st->op;
  return st;
}

absl::StatusOr<WorkerEndpoint> CheckpointManager::Endpoint(int64_t rank) const {
  absl::StatusOr<WorkerRecord> w = workers_->GetByRank(rank);
  if (!w.ok()) return w.status();
  if (!w->alive) return w->DeadError("is dead");
  return w->Endpoint();
}

absl::StatusOr<WorkerEndpoint> CheckpointManager::AnyLiveWorker(
    const std::vector<int64_t>& prefer) const {
  for (int64_t r : prefer) {
    absl::StatusOr<WorkerEndpoint> e = Endpoint(r);
    if (e.ok()) return e;
  }
  for (const WorkerRecord& w : workers_->List()) {
    if (w.alive) return w.Endpoint();
  }
  return absl::FailedPreconditionError("no live worker to reach the checkpoint's storage");
}

absl::Status CheckpointManager::WorkerError(const WorkerEndpoint& w, const absl::Status& s) const {
  absl::StatusCode code = s.code();
  if (!workers_->IsLive(w.rank, w.incarnation) || code == absl::StatusCode::kDeadlineExceeded ||
      code == absl::StatusCode::kCancelled) {
    code = absl::StatusCode::kUnavailable;
  }
  // The file system's refusal is the worker's state, not the caller's role.
  if (code == absl::StatusCode::kPermissionDenied) code = absl::StatusCode::kFailedPrecondition;
  return absl::Status(code, absl::StrCat(Describe(w), ": ", s.message()));
}

void CheckpointManager::StartProgress(const std::string& id, const std::string& op, int64_t total,
                                      LossFn on_lost) {
  absl::MutexLock lock(&mu_);
  running_[id] = std::move(on_lost);
  v1::CheckpointProgress& p = progress_[id];
  p = v1::CheckpointProgress();
  p.set_request_id(id);
  p.set_op(op);
  p.set_phase("starting");
  p.set_bytes_total(total);
}

void CheckpointManager::UpdateProgress(const std::string& id, const std::string& phase,
                                       int64_t add_done) {
  absl::MutexLock lock(&mu_);
  auto it = progress_.find(id);
  if (it == progress_.end()) return;
  if (!phase.empty()) it->second.set_phase(phase);
  it->second.set_bytes_done(it->second.bytes_done() + add_done);
}

void CheckpointManager::OnWorkerLost(const WorkerRecord& worker, const std::string& reason) {
  std::vector<LossFn> running;
  {
    absl::MutexLock lock(&mu_);
    for (const auto& [id, fn] : running_) running.push_back(fn);
  }
  const absl::Status lost = absl::UnavailableError(absl::StrCat(worker.Describe(), " ", reason));
  for (const LossFn& fn : running) fn(worker, lost);
}

void CheckpointManager::EndProgress(const std::string& id, const absl::Status& s) {
  absl::MutexLock lock(&mu_);
  running_.erase(id);
  auto it = progress_.find(id);
  if (it == progress_.end() || it->second.ended()) return;
  if (CoordinatorMetrics* m = options_.metrics; m != nullptr) {
    m->checkpoints->WithLabels({it->second.op(), s.ok() ? "ok" : "failed"})->Increment();
    if (s.ok()) {
      m->checkpoint_bytes->WithLabels({it->second.op()})
          ->Increment(static_cast<double>(it->second.bytes_total()));
    }
  }
  it->second.set_ended(true);
  it->second.set_phase(s.ok() ? "done" : "failed");
  if (s.ok()) it->second.set_bytes_done(it->second.bytes_total());
  if (!s.ok()) it->second.set_error(std::string(s.message()));
  ended_.push_back(id);
  while (ended_.size() > kKeepEnded) {
    progress_.erase(ended_.front());
    ended_.pop_front();
  }
}

absl::StatusOr<v1::CheckpointProgress> CheckpointManager::Progress(const std::string& id) const {
  absl::MutexLock lock(&mu_);
  auto it = progress_.find(id);
  if (it == progress_.end()) {
    return absl::NotFoundError(absl::StrCat("no checkpoint operation '", id, "'"));
  }
  return it->second;
}

// ---- Save ------------------------------------------------------------------------------------

struct CheckpointManager::SaveState {
  SaveCheckpointArgs args;
  SaveCallback done;
  std::string op;
  std::string tmp;
  absl::Time start;
  std::vector<TensorRecord> tensors;  // Held busy by `op`.
  SavePlan plan;
  std::vector<WorkerEndpoint> writers;  // Per plan.files.
  WorkerEndpoint director;              // Creates, commits or removes the directory.
  absl::Mutex mu;
  std::vector<WorkerEndpoint> uses ABSL_GUARDED_BY(mu);  // The writers and the director.
  absl::Status error ABSL_GUARDED_BY(mu);
  std::vector<v1::WriteCheckpointResponse> written ABSL_GUARDED_BY(mu);
};

namespace {

bool Uses(const std::vector<WorkerEndpoint>& uses, const WorkerRecord& w) {
  for (const WorkerEndpoint& e : uses) {
    if (e.rank == w.rank && e.incarnation == w.incarnation) return true;
  }
  return false;
}

// OnWorkerLost's reaction for an operation whose state `St` has mu, error and uses: the
// death becomes its error unless it failed already.
template <typename St>
std::function<void(const WorkerRecord&, const absl::Status&)> FailOnLoss(
    const std::shared_ptr<St>& st) {
  return [weak = std::weak_ptr<St>(st)](const WorkerRecord& w, const absl::Status& lost) {
    std::shared_ptr<St> st = weak.lock();
    if (st == nullptr) return;
    absl::MutexLock lock(&st->mu);
    if (st->error.ok() && Uses(st->uses, w)) st->error = lost;
  };
}

// `s`, or the death (OnWorkerLost) that failed the operation first.
template <typename St>
absl::Status ErrorOrLoss(St& st, absl::Status s) {
  absl::MutexLock lock(&st.mu);
  return st.error.ok() ? s : st.error;
}

}  // namespace

void CheckpointManager::Save(SaveCheckpointArgs args, SaveCallback done) {
  absl::StatusOr<std::string> dir = CleanDir(args.dir);
  if (!dir.ok()) return done(dir.status());
  args.dir = *dir;
  std::vector<std::string> names = args.tensors;
  if (args.all) {
    if (!names.empty()) {
      return done(absl::InvalidArgumentError("tensors: name tensors or pass all, not both"));
    }
    for (const TensorRecord& t : tensors_->List()) names.push_back(t.name);
    if (names.empty()) return done(absl::InvalidArgumentError("all: there are no tensors"));
  }
  if (names.empty()) return done(absl::InvalidArgumentError("tensors: empty (or pass all)"));
  {
    std::set<std::string> seen;
    for (size_t i = 0; i < names.size(); ++i) {
      if (names[i].empty()) {
        return done(absl::InvalidArgumentError(absl::StrCat("tensors[", i, "]: empty")));
      }
      if (!seen.insert(names[i]).second) {
        return done(absl::InvalidArgumentError(
            absl::StrCat("tensors[", i, "]: '", names[i], "' is named twice")));
      }
    }
  }
  std::shared_ptr<SaveState> st = NewState<SaveState>("save", std::move(args), std::move(done));
  auto release = [this, st] {
    for (const TensorRecord& t : st->tensors) tensors_->Release(t.name, st->op);
  };
  // Held busy from here until the save ends, so no plan changes them meanwhile.
  std::vector<SaveTensor> save;
  const LivenessFn live = [w = workers_](int64_t rank, int64_t inc) {
    return w->IsLive(rank, inc);
  };
  for (const std::string& name : names) {
    absl::StatusOr<TensorRecord> rec = tensors_->Acquire(name, st->op);
    if (!rec.ok()) {
      release();
      return st->done(rec.status());
    }
    st->tensors.push_back(*rec);
    absl::StatusOr<Layout> layout = LiveLayout(*rec, live);
    if (!layout.ok()) {
      release();
      return st->done(layout.status());
    }
    save.push_back(SaveTensor{name, rec->dtype, *std::move(layout)});
  }
  absl::StatusOr<SavePlan> plan = PlanSave(save, SavePlanOptions{options_.min_part_bytes});
  if (!plan.ok()) {
    release();
    return st->done(plan.status());
  }
  st->plan = *std::move(plan);
  std::vector<int64_t> writer_ranks;
  for (const SaveFile& f : st->plan.files) {
    absl::StatusOr<WorkerEndpoint> e = Endpoint(f.rank);
    if (!e.ok()) {
      release();
      return st->done(e.status());
    }
    st->writers.push_back(*e);
    writer_ranks.push_back(f.rank);
  }
  absl::StatusOr<WorkerEndpoint> director = AnyLiveWorker(writer_ranks);
  if (!director.ok()) {
    release();
    return st->done(director.status());
  }
  st->director = *director;
  st->tmp = absl::StrCat(st->args.dir, ".tmp-", RandomHex());
  {
    absl::MutexLock lock(&st->mu);
    st->uses = st->writers;
    st->uses.push_back(st->director);
  }
  StartProgress(st->args.id, "save", st->plan.total_bytes, FailOnLoss(st));

  v1::CheckpointDirRequest prepare;
  prepare.set_action(v1::CHECKPOINT_DIR_PREPARE);
  prepare.set_dir(st->args.dir);
  prepare.set_tmp(st->tmp);
  prepare.set_overwrite(st->args.overwrite);
  client_->CheckpointDir(st->director, prepare, [this, st, release](absl::Status s) {
    if (!s.ok()) {
      // Nothing was created (the worker refuses before mkdir, and mkdir is the last step).
      release();
      const absl::Status e = ErrorOrLoss(*st, WorkerError(st->director, s));
      EndProgress(st->args.id, e);
      return st->done(e);
    }
    // A worker it uses died meanwhile (OnWorkerLost): no write starts.
    if (absl::Status lost = ErrorOrLoss(*st, absl::OkStatus()); !lost.ok()) {
      return SaveFailed(st, lost);
    }
    UpdateProgress(st->args.id, "writing", 0);
    {
      absl::MutexLock lock(&st->mu);
      st->written.resize(st->plan.files.size());
    }
    // Every write has ended, failed or not, before the directory is touched again (the
    // first failure, or a death, is the save's error already).
    std::shared_ptr<FanIn> fan =
        FanIn::Start(st->plan.files.size(), [this, st](absl::Status) { SaveWritten(st); });
    for (size_t i = 0; i < st->plan.files.size(); ++i) {
      const SaveFile& f = st->plan.files[i];
      v1::WriteCheckpointRequest req;
      req.set_dir(st->tmp);
      req.set_file(f.file);
      for (const SaveEntry& e : f.entries) {
        v1::CheckpointWriteEntry* out = req.add_entries();
        out->set_entry(e.entry);
        out->set_tensor(st->tensors[e.tensor].name);
        out->set_version(st->tensors[e.tensor].version);
        *out->mutable_box() = BoxToProto(e.box);
      }
      client_->WriteCheckpoint(st->writers[i], req,
                               [this, st, fan, i](absl::StatusOr<v1::WriteCheckpointResponse> r) {
                                 const absl::Status s = r.status();
                                 {
                                   absl::MutexLock lock(&st->mu);
                                   if (!r.ok() && st->error.ok())
                                     st->error = WorkerError(st->writers[i], r.status());
                                   if (r.ok()) st->written[i] = *std::move(r);
                                 }
                                 UpdateProgress(st->args.id, "", st->plan.files[i].bytes);
                                 fan->Report(s);
                               });
    }
  });
}

void CheckpointManager::SaveWritten(const std::shared_ptr<SaveState>& st) {
  absl::Status error;
  std::vector<v1::WriteCheckpointResponse> written;
  {
    absl::MutexLock lock(&st->mu);
    error = st->error;
    written = st->written;
  }
  if (!error.ok()) return SaveFailed(st, error);
  CheckpointIndex index;
  std::map<size_t, CheckpointTensor> by_tensor;
  for (size_t t = 0; t < st->tensors.size(); ++t) {
    CheckpointTensor& ct = by_tensor[t];
    ct.name = st->tensors[t].name;
    ct.shape = st->tensors[t].shape;
    ct.dtype = st->tensors[t].dtype;
  }
  for (size_t i = 0; i < st->plan.files.size(); ++i) {
    const SaveFile& f = st->plan.files[i];
    const v1::WriteCheckpointResponse& r = written[i];
    if (r.entries_size() != static_cast<int>(f.entries.size())) {
      return SaveFailed(st, absl::InternalError(absl::StrCat(Describe(st->writers[i]), " answered ",
                                                             r.entries_size(), " entries for ",
                                                             f.entries.size())));
    }
    index.files.push_back(CheckpointFile{f.file, f.rank, st->writers[i].name, r.file_bytes()});
    for (size_t j = 0; j < f.entries.size(); ++j) {
      const SaveEntry& e = f.entries[j];
      const v1::CheckpointEntrySums& sums = r.entries(static_cast<int>(j));
      CheckpointPiece p;
      p.box = e.box;
      p.file = f.file;
      p.entry = e.entry;
      p.has_xxh64 = true;
      p.xxh64 = sums.xxh64();
      p.rows_per_block = sums.rows_per_block();
      p.blocks.assign(sums.blocks().begin(), sums.blocks().end());
      by_tensor[e.tensor].pieces.push_back(std::move(p));
    }
  }
  for (auto& [t, ct] : by_tensor) {
    std::sort(ct.pieces.begin(), ct.pieces.end(),
              [](const CheckpointPiece& a, const CheckpointPiece& b) { return a.box < b.box; });
    index.tensors.push_back(std::move(ct));
  }
  std::sort(index.tensors.begin(), index.tensors.end(),
            [](const CheckpointTensor& a, const CheckpointTensor& b) { return a.name < b.name; });
  if (absl::Status s = ValidateCheckpointIndex(index); !s.ok()) {
    return SaveFailed(st, absl::InternalError(absl::StrCat("the index is invalid: ", s.message())));
  }
  UpdateProgress(st->args.id, "committing", 0);
  v1::CheckpointDirRequest commit;
  commit.set_action(v1::CHECKPOINT_DIR_COMMIT);
  commit.set_dir(st->args.dir);
  commit.set_tmp(st->tmp);
  commit.set_overwrite(st->args.overwrite);
  commit.set_index_json(SerializeCheckpointIndex(index));
  client_->CheckpointDir(st->director, commit, [this, st](absl::Status s) {
    if (!s.ok()) return SaveFailed(st, ErrorOrLoss(*st, WorkerError(st->director, s)));
    SaveCommitted(st);
  });
}

void CheckpointManager::SaveFailed(const std::shared_ptr<SaveState>& st, absl::Status s) {
  // Remove the temporary directory (best effort: a dead director leaves it to a live worker).
  std::vector<int64_t> prefer = {st->director.rank};
  for (const WorkerEndpoint& w : st->writers) prefer.push_back(w.rank);
  absl::StatusOr<WorkerEndpoint> cleaner = AnyLiveWorker(prefer);
  auto finish = [this, st, s] {
    for (const TensorRecord& t : st->tensors) tensors_->Release(t.name, st->op);
    EndProgress(st->args.id, s);
    st->done(s);
  };
  if (!cleaner.ok()) return finish();
  v1::CheckpointDirRequest abort;
  abort.set_action(v1::CHECKPOINT_DIR_ABORT);
  abort.set_dir(st->args.dir);
  abort.set_tmp(st->tmp);
  client_->CheckpointDir(*cleaner, abort, [finish](absl::Status) { finish(); });
}

void CheckpointManager::SaveCommitted(const std::shared_ptr<SaveState>& st) {
  std::vector<v1::WriteCheckpointResponse> written;
  {
    absl::MutexLock lock(&st->mu);
    written = st->written;
  }
  for (const TensorRecord& t : st->tensors) tensors_->Release(t.name, st->op);
  v1::SaveCheckpointResponse resp;
  resp.set_dir(st->args.dir);
  resp.set_tensors(static_cast<int64_t>(st->tensors.size()));
  resp.set_bytes(st->plan.total_bytes);
  for (size_t i = 0; i < st->plan.files.size(); ++i) {
    const SaveFile& f = st->plan.files[i];
    v1::CheckpointFileInfo* out = resp.add_files();
    out->set_file(f.file);
    out->set_worker(st->writers[i].name);
    out->set_rank(f.rank);
    out->set_bytes(f.bytes);
    out->set_entries(static_cast<int64_t>(f.entries.size()));
    out->set_seconds(written[i].seconds());
  }
  resp.set_ideal_writer_bytes(st->plan.ideal_writer_bytes);
  resp.set_max_writer_bytes(st->plan.max_writer_bytes);
  resp.set_seconds(absl::ToDoubleSeconds(clock_->Now() - st->start));
  EndProgress(st->args.id, absl::OkStatus());
  st->done(std::move(resp));
}

// ---- Load ------------------------------------------------------------------------------------

struct CheckpointManager::LoadState {
  LoadCheckpointArgs args;
  LoadCallback done;
  std::string op;
  absl::Time start;
  CheckpointFiles files;
  struct Item {
    const CheckpointTensor* tensor = nullptr;
    std::string name;     // The tensor created or copied into.
    std::string staging;  // Hidden; `name` itself unless into.
    Layout target;
    std::optional<Spec> spec;
    int64_t version = 0;  // The staging tensor's (the read buffers').
    bool reserved = false;
    // The staging tensor's dtype: the checkpoint's, or (dequantized) the one it becomes.
    DType dtype = DType::kF32;
    const CheckpointTensor* scale = nullptr;  // Dequantized with these scales.
    std::vector<ScaleRead> scale_reads;       // Per run of its TensorRead.
    int64_t scale_bytes = 0;
    DType result_dtype = DType::kF32;  // What the loaded tensor holds.
  };
  std::vector<Item> items;
  LoadPlan plan;
  // One ReadCheckpoint per reading rank and batch: buffers[k] of it is items[item_of[k]].
  struct Reader {
    WorkerEndpoint endpoint;
    v1::ReadCheckpointRequest request;
    std::vector<size_t> item_of;
    v1::ReadCheckpointResponse response;
    bool ok = false;
  };
  // Batches are read one after another; each one's exchange (its own group) starts when its
  // reads are done, while the next batch is read.
  struct Batch {
    std::vector<size_t> items;
    std::vector<Reader> readers;
    StartedGroup group;
  };
  std::vector<Batch> batches;
  absl::Mutex mu;
  // Batches started and not ended (their reads, then their group).
  int in_flight ABSL_GUARDED_BY(mu) = 0;
  size_t exchanged ABSL_GUARDED_BY(mu) = 0;  // Batches whose group committed.
  absl::Status error ABSL_GUARDED_BY(mu);
  absl::Time read_end ABSL_GUARDED_BY(mu);
  absl::Time exchange_start ABSL_GUARDED_BY(mu);
  absl::Time exchange_end ABSL_GUARDED_BY(mu);
  std::vector<WorkerEndpoint> uses ABSL_GUARDED_BY(mu);  // The index's reader, then readers.
};

void CheckpointManager::Load(LoadCheckpointArgs args, LoadCallback done) {
  absl::StatusOr<std::string> dir = CleanDir(args.dir);
  if (!dir.ok()) return done(dir.status());
  args.dir = *dir;
  if (args.all && !args.targets.empty()) {
    return done(absl::InvalidArgumentError("targets: name tensors or pass all, not both"));
  }
  if (!args.all && args.targets.empty()) {
    return done(absl::InvalidArgumentError("targets: empty (or pass all)"));
  }
  std::shared_ptr<LoadState> st = NewState<LoadState>("load", std::move(args), std::move(done));
  absl::StatusOr<WorkerEndpoint> reader = AnyLiveWorker();
  if (!reader.ok()) return st->done(reader.status());
  {
    absl::MutexLock lock(&st->mu);
    st->uses.push_back(*reader);
  }
  StartProgress(st->args.id, "load", 0, FailOnLoss(st));
  UpdateProgress(st->args.id, "reading index", 0);
  v1::ReadCheckpointIndexRequest req;
  req.set_path(st->args.dir);
  const WorkerEndpoint w = *reader;
  client_->ReadCheckpointIndex(
      w, req, [this, st, w](absl::StatusOr<v1::ReadCheckpointIndexResponse> r) {
        if (!r.ok()) return LoadFailed(st, ErrorOrLoss(*st, WorkerError(w, r.status())));
        LoadIndexRead(st, std::move(r));
      });
}

void CheckpointManager::LoadIndexRead(const std::shared_ptr<LoadState>& st,
                                      absl::StatusOr<v1::ReadCheckpointIndexResponse> read) {
  absl::StatusOr<CheckpointFiles> files = ParseCheckpointFiles(*read);
  if (!files.ok()) return LoadFailed(st, files.status());
  st->files = *std::move(files);
  const CheckpointIndex& index = st->files.index;
  const LoadCheckpointArgs& args = st->args;
  std::vector<LoadTargetArgs> targets = args.targets;
  if (args.all) {
    for (const CheckpointTensor& t : index.tensors) {
      if (args.dequantize && ConsumedScale(index, t.name)) continue;
      targets.push_back(LoadTargetArgs{t.name, "", args.spec});
    }
  }
  std::set<std::string> names;
  std::vector<LoadTensor> load;
  for (size_t i = 0; i < targets.size(); ++i) {
    const LoadTargetArgs& t = targets[i];
    const std::string where = absl::StrCat("targets[", i, "]");
    LoadState::Item item;
    item.tensor = index.Find(t.tensor);
    if (item.tensor == nullptr) {
      return LoadFailed(st, absl::NotFoundError(absl::StrCat(where, ".tensor: '", t.tensor,
                                                             "' is not in the checkpoint")));
    }
    item.name = t.name.empty() ? absl::StrCat(args.prefix, t.tensor) : t.name;
    if (absl::Status s = ValidateName(item.name, absl::StrCat(where, ".name")); !s.ok()) {
      return LoadFailed(st, s);
    }
    if (!names.insert(item.name).second) {
      return LoadFailed(st, absl::InvalidArgumentError(
                                absl::StrCat(where, ".name: '", item.name, "' is loaded twice")));
    }
    const CheckpointTensor& ct = *item.tensor;
    item.dtype = ct.dtype;
    if (args.dequantize && ConsumedScale(index, ct.name)) {
      return LoadFailed(st, absl::InvalidArgumentError(absl::StrCat(
                                where, ".tensor: '", ct.name, "' is the scale of f8_e4m3 '",
                                ct.name.substr(0, ct.name.size() - kScaleSuffix.size()),
                                "', which a load with dequantize consumes (load that tensor)")));
    }
    const bool dequantized = args.dequantize && ct.dtype == DType::kF8E4M3;
    if (dequantized) {
      if (absl::Status s = CheckDequantizable(ct, index, args.block, &item.scale); !s.ok()) {
        return LoadFailed(st, Prefixed(absl::StrCat(where, ".tensor: "), s));
      }
      item.dtype = args.dtype.value_or(DType::kBF16);
      if (!DequantizesInto(item.dtype)) {
        return LoadFailed(st, absl::InvalidArgumentError(absl::StrCat(
                                  "dtype: ", DTypeName(item.dtype), ": f8_e4m3 '", ct.name,
                                  "' dequantizes only into a float dtype other than f8_e8m0")));
      }
    }
    // The dtype the tensor ends with: the existing one's (into), the asked one, or the file's.
    if (!dequantized && args.dtype.has_value() && !CastAllowed(ct.dtype, *args.dtype)) {
      return LoadFailed(st, absl::InvalidArgumentError(absl::StrCat(
                                "dtype: the checkpoint's '", ct.name, "' is ", DTypeName(ct.dtype),
                                ", which cannot be cast to ", DTypeName(*args.dtype), ": ",
                                CheckCast(ct.dtype, *args.dtype).message())));
    }
    if (args.into) {
      absl::StatusOr<TensorRecord> rec = tensors_->Get(item.name);
      if (!rec.ok()) return LoadFailed(st, Prefixed(absl::StrCat(where, ".name: "), rec.status()));
      if (dequantized && rec->shape == ct.shape && !DequantizesInto(rec->dtype)) {
        return LoadFailed(st, absl::InvalidArgumentError(absl::StrCat(
                                  where, ".name: tensor '", item.name, "' is ",
                                  DTypeName(rec->dtype), ", which f8_e4m3 '", ct.name,
                                  "' cannot dequantize into (a float dtype other than f8_e8m0)")));
      }
      if (rec->shape != ct.shape || (!dequantized && !CastAllowed(ct.dtype, rec->dtype))) {
        return LoadFailed(
            st, absl::InvalidArgumentError(absl::StrCat(
                    where, ".name: tensor '", item.name, "' is ", ShapeToString(rec->shape), " ",
                    DTypeName(rec->dtype), " but the checkpoint's '", ct.name, "' is ",
                    ShapeToString(ct.shape), " ", DTypeName(ct.dtype),
                    rec->shape != ct.shape
                        ? ""
                        : absl::StrCat(" (", CheckCast(ct.dtype, rec->dtype).message(), ")"))));
      }
      if (args.dtype.has_value() && *args.dtype != rec->dtype) {
        return LoadFailed(st, absl::InvalidArgumentError(absl::StrCat(
                                  "dtype: ", DTypeName(*args.dtype), " but ", where,
                                  ".name: tensor '", item.name, "' is ", DTypeName(rec->dtype),
                                  " (a load into existing tensors casts to their dtype)")));
      }
      item.target = rec->layout;
      item.staging = absl::StrCat("~", st->op, "/", item.name);
      if (dequantized) item.dtype = rec->dtype;
      item.result_dtype = rec->dtype;
    } else {
      if (!t.spec.has_value() || t.spec->mesh.empty()) {
        return LoadFailed(st, absl::InvalidArgumentError(
                                  absl::StrCat(where, ".target: name the mesh and the layout")));
      }
      absl::StatusOr<MeshRecord> mesh = meshes_->Get(t.spec->mesh);
      if (!mesh.ok()) return LoadFailed(st, mesh.status());
      absl::StatusOr<Layout> layout =
          LayoutForSpec(*t.spec, mesh->mesh, ct.shape, absl::StrCat(where, ".target"));
      if (!layout.ok()) return LoadFailed(st, layout.status());
      if (tensors_->Get(item.name).ok()) {
        return LoadFailed(st, absl::AlreadyExistsError(absl::StrCat(
                                  where, ".name: tensor '", item.name,
                                  "' exists (load into it with into, or choose another name)")));
      }
      item.target = *std::move(layout);
      item.spec = t.spec;
      item.staging = item.name;
      item.result_dtype = args.dtype.value_or(item.dtype);
    }
    for (const RankChunks& rc : item.target.ranks()) {
      absl::StatusOr<WorkerEndpoint> e = Endpoint(rc.rank);
      if (!e.ok()) return LoadFailed(st, Prefixed(absl::StrCat(where, ": "), e.status()));
    }
    LoadTensor lt{item.tensor, item.target};
    // Readers of a dequantized tensor hold whole blocks: of rows for a matrix (a tensor of
    // more dims is cut along its first, outside the blocks).
    if (dequantized && ct.shape.size() == 2) lt.row_align = args.block.rows;
    // Where each piece starts in its file, so that large runs can be read with O_DIRECT.
    for (const CheckpointPiece& piece : ct.pieces) {
      const SafetensorsHeader& h = st->files.headers.at(piece.file);
      const SafetensorsEntry* e = h.Find(piece.entry);
      if (e == nullptr) {
        lt.piece_file_offsets.clear();
        break;
      }
      lt.piece_file_offsets.push_back(h.data_start() + e->begin);
    }
    load.push_back(std::move(lt));
    st->items.push_back(std::move(item));
  }
  if (st->items.empty()) {
    return LoadFailed(st, absl::InvalidArgumentError("the checkpoint holds no tensors"));
  }
  // The items in batches of about load_batch_bytes (one batch with into: each group commits
  // its copies, so only one group keeps the load all or nothing), each batch's reading
  // balanced over its readers (a batch ends with its slowest reader).
  std::vector<int64_t> item_bytes;
  for (const LoadState::Item& item : st->items) {
    item_bytes.push_back(Box::Whole(item.tensor->shape).Volume() * ElementSize(item.tensor->dtype));
  }
  for (std::vector<size_t>& items :
       CutLoadBatches(item_bytes, st->args.into ? 0 : options_.load_batch_bytes,
                      options_.load_first_batch_bytes)) {
    for (size_t i : items) load[i].group = static_cast<int64_t>(st->batches.size());
    LoadState::Batch batch;
    batch.items = std::move(items);
    st->batches.push_back(std::move(batch));
  }
  absl::StatusOr<LoadPlan> plan = PlanLoad(load, LoadPlanOptions{kDirectIoAlignment});
  if (!plan.ok()) return LoadFailed(st, plan.status());
  st->plan = *std::move(plan);
  // Each reader of a dequantized tensor reads its blocks' scales too.
  int64_t scale_bytes = 0;
  for (size_t i = 0; i < st->items.size(); ++i) {
    LoadState::Item& item = st->items[i];
    if (item.scale == nullptr) continue;
    for (const ReadRun& run : st->plan.tensors[i].runs) {
      absl::StatusOr<ScaleRead> sr = ScaleReadOf(*item.tensor, *item.scale, run.box, args.block);
      if (!sr.ok()) return LoadFailed(st, sr.status());
      item.scale_bytes += sr->box.Volume() * ElementSize(DType::kF32);
      item.scale_reads.push_back(*std::move(sr));
    }
    scale_bytes += item.scale_bytes;
  }

  // Hidden staging tensors, one per item, laid out as the readers will hold them.
  for (size_t i = 0; i < st->items.size(); ++i) {
    LoadState::Item& item = st->items[i];
    TensorRecord rec;
    rec.name = item.staging;
    rec.shape = item.tensor->shape;
    rec.dtype = item.dtype;
    rec.spec = "checkpoint read layout";
    rec.layout = st->plan.tensors[i].read_layout;
    rec.version = tensors_->NewVersion();
    rec.owner = st->op;
    item.version = rec.version;
    if (absl::Status s = tensors_->Reserve(std::move(rec), st->op); !s.ok()) {
      return LoadFailed(st, s);
    }
    item.reserved = true;
  }
  // One read per reading rank and batch, all its buffers at once (the worker reads in file
  // order).
  for (LoadState::Batch& batch : st->batches) {
    std::map<int64_t, size_t> reader_of;
    for (size_t i : batch.items) {
      const LoadState::Item& item = st->items[i];
      const CheckpointTensor& ct = *item.tensor;
      const TensorRead& tr = st->plan.tensors[i];
      const int64_t esize = ElementSize(ct.dtype);
      std::map<int64_t, v1::CheckpointReadBuffer*> buffer_of;
      for (const RankChunks& rc : tr.read_layout.ranks()) {
        auto [it, inserted] = reader_of.emplace(rc.rank, batch.readers.size());
        if (inserted) {
          LoadState::Reader r;
          absl::StatusOr<WorkerEndpoint> e = Endpoint(rc.rank);
          if (!e.ok()) return LoadFailed(st, e.status());
          r.endpoint = *e;
          r.request.set_dir(st->files.dir);
          batch.readers.push_back(std::move(r));
        }
        LoadState::Reader& r = batch.readers[it->second];
        v1::CheckpointReadBuffer* b = r.request.add_buffers();
        b->set_tensor(item.staging);
        b->set_version(item.version);
        b->set_dtype(DTypeToProto(item.dtype));
        *b->mutable_chunks() = RankChunksToProto(rc);
        if (item.scale != nullptr) {
          b->mutable_dequantize()->set_block(BlockQuantizationText(st->args.block));
        }
        r.item_of.push_back(i);
        buffer_of[rc.rank] = b;
      }
      for (size_t k = 0; k < tr.runs.size(); ++k) {
        const ReadRun& run = tr.runs[k];
        v1::CheckpointReadBuffer* b = buffer_of.at(run.rank);
        AddReadRun(st->files, ct.pieces[run.piece], run.row_begin, run.row_end, esize,
                   b->add_runs());
        if (item.scale != nullptr) {
          const ScaleRead& sr = item.scale_reads[k];
          *b->mutable_dequantize()->add_scale_boxes() = BoxToProto(sr.box);
          AddReadRun(st->files, item.scale->pieces[sr.piece], sr.row_begin, sr.row_end,
                     ElementSize(DType::kF32), b->mutable_dequantize()->add_scale_runs());
        }
      }
    }
  }
  {
    absl::MutexLock lock(&mu_);
    auto it = progress_.find(st->args.id);
    if (it != progress_.end()) it->second.set_bytes_total(st->plan.total_bytes + scale_bytes);
  }
  UpdateProgress(st->args.id, "reading", 0);
  {
    absl::MutexLock lock(&st->mu);
    for (const LoadState::Batch& batch : st->batches) {
      for (const LoadState::Reader& r : batch.readers) st->uses.push_back(r.endpoint);
    }
  }
  ReadBatch(st, 0);
}

void CheckpointManager::ReadBatch(const std::shared_ptr<LoadState>& st, size_t b) {
  LoadState::Batch& batch = st->batches[b];
  {
    absl::MutexLock lock(&st->mu);
    if (!st->error.ok()) return;  // A batch in flight fails the load when it ends.
    ++st->in_flight;
  }
  // The first failure (or a death) is the load's error already.
  std::shared_ptr<FanIn> fan =
      FanIn::Start(batch.readers.size(), [this, st, b](absl::Status) { BatchRead(st, b); });
  for (size_t k = 0; k < batch.readers.size(); ++k) {
    client_->ReadCheckpoint(batch.readers[k].endpoint, batch.readers[k].request,
                            [this, st, fan, b, k](absl::StatusOr<v1::ReadCheckpointResponse> r) {
                              const absl::Status s = r.status();
                              int64_t got = 0;
                              {
                                absl::MutexLock lock(&st->mu);
                                LoadState::Reader& reader = st->batches[b].readers[k];
                                if (r.ok()) {
                                  reader.response = *std::move(r);
                                  reader.ok = true;
                                  got = reader.response.bytes_read();
                                } else if (st->error.ok()) {
                                  st->error = WorkerError(reader.endpoint, r.status());
                                }
                              }
                              UpdateProgress(st->args.id, "", got);
                              fan->Report(s);
                            });
  }
}

void CheckpointManager::BatchRead(const std::shared_ptr<LoadState>& st, size_t b) {
  bool failed;
  {
    absl::MutexLock lock(&st->mu);
    failed = !st->error.ok();
    st->read_end = clock_->Now();
  }
  if (failed) return BatchEnded(st, b, absl::OkStatus());
  // The disk goes on with the next batch while this one is exchanged.
  if (b + 1 < st->batches.size()) ReadBatch(st, b + 1);
  {
    absl::MutexLock lock(&st->mu);
    failed = !st->error.ok();  // A worker it uses died meanwhile (OnWorkerLost).
  }
  if (failed) return BatchEnded(st, b, absl::OkStatus());
  LoadState::Batch& batch = st->batches[b];
  // Every reader's chunks, checked against the read layout, as each staging tensor's.
  std::map<size_t, LayoutChecksums> sums;
  std::map<size_t, absl::flat_hash_map<int64_t, int64_t>> holders;
  for (size_t i : batch.items) sums[i].resize(st->plan.tensors[i].read_layout.ranks().size());
  for (const LoadState::Reader& r : batch.readers) {
    if (r.response.chunks_size() != static_cast<int>(r.item_of.size())) {
      return BatchEnded(st, b,
                        absl::InternalError(absl::StrCat(Describe(r.endpoint), " answered ",
                                                         r.response.chunks_size(), " buffers for ",
                                                         r.item_of.size())));
    }
    for (size_t k = 0; k < r.item_of.size(); ++k) {
      const size_t i = r.item_of[k];
      const Layout& layout = st->plan.tensors[i].read_layout;
      ChunkChecksums got_sums;
      absl::StatusOr<RankChunks> got =
          RankChunksFromProto(r.response.chunks(static_cast<int>(k)), "chunks", &got_sums);
      const RankChunks* want = layout.Find(r.endpoint.rank);
      if (!got.ok() || want == nullptr || got->chunks != want->chunks) {
        return BatchEnded(
            st, b,
            absl::InternalError(absl::StrCat(
                Describe(r.endpoint), " answered with other chunks than it was asked to read")));
      }
      for (size_t j = 0; j < layout.ranks().size(); ++j) {
        if (layout.ranks()[j].rank == r.endpoint.rank) sums[i][j] = got_sums;
      }
      holders[i][r.endpoint.rank] = r.endpoint.incarnation;
    }
  }
  std::vector<LoadMember> members;
  for (size_t i : batch.items) {
    LoadState::Item& item = st->items[i];
    if (absl::Status s =
            tensors_->FinishCreate(item.staging, st->op, std::move(sums[i]), std::move(holders[i]));
        !s.ok()) {
      return BatchEnded(st, b, s);
    }
    LoadMember m;
    m.staging = item.staging;
    if (st->args.into) {
      m.into = item.name;
    } else {
      m.target = *item.spec;
      if (st->args.dtype.has_value() && *st->args.dtype != item.dtype) {
        m.dtype = st->args.dtype;
      }
      // Published with every other batch's tensors once all committed.
      m.keep_hidden = true;
    }
    members.push_back(std::move(m));
  }
  UpdateProgress(st->args.id, "exchanging", 0);
  {
    absl::MutexLock lock(&st->mu);
    if (st->exchange_start == absl::Time()) st->exchange_start = clock_->Now();
  }
  // The group may end before LoadGroup returns (callbacks may run inline): its end waits
  // until the group is recorded in the batch.
  auto join = std::make_shared<StartEndJoin<absl::Status>>(
      [this, st, b](absl::Status s) { BatchEnded(st, b, s, /*exchanged=*/true); });
  absl::StatusOr<StartedGroup> group = plans_->LoadGroup(
      st->op, members, [join](const absl::Status& s, const GroupProgress&) { join->Ended(s); });
  if (!group.ok()) return BatchEnded(st, b, group.status());
  batch.group = *std::move(group);
  join->Started();
}

void CheckpointManager::BatchEnded(const std::shared_ptr<LoadState>& st, size_t b,
                                   const absl::Status& s, bool exchanged) {
  absl::Status error;
  bool done = false;
  {
    absl::MutexLock lock(&st->mu);
    if (!s.ok() && st->error.ok()) st->error = Prefixed(absl::StrCat("batch ", b, ": "), s);
    if (exchanged) st->exchange_end = clock_->Now();
    if (exchanged && s.ok()) ++st->exchanged;
    done = --st->in_flight == 0 && (!st->error.ok() || st->exchanged == st->batches.size());
    error = st->error;
  }
  if (!done) return;
  if (!error.ok()) return LoadFailed(st, error);
  LoadExchanged(st);
}

void CheckpointManager::LoadExchanged(const std::shared_ptr<LoadState>& st) {
  if (st->args.into) {
    // The copies committed; the staging tensors and their buffers go.
    for (const LoadState::Item& item : st->items) {
      tensors_->Remove(item.staging, st->op).IgnoreError();
    }
    for (const LoadState::Batch& batch : st->batches) {
      for (const LoadState::Reader& r : batch.readers) {
        for (size_t i : r.item_of) {
          v1::DropTensorRequest drop;
          drop.set_tensor(st->items[i].staging);
          drop.set_version(st->items[i].version);
          client_->DropTensor(r.endpoint, drop, [](absl::Status) {});
        }
      }
    }
  } else {
    // Every batch committed its tensors hidden: they appear together, or (the store refused)
    // none does and the load fails.
    std::vector<std::string> names;
    for (const LoadState::Item& item : st->items) names.push_back(item.name);
    if (absl::Status s = tensors_->PublishAll(names, st->op); !s.ok()) return LoadFailed(st, s);
  }
  v1::LoadCheckpointResponse resp;
  int64_t bytes = 0, read = 0;
  std::map<size_t, int64_t> target_version;
  for (const LoadState::Batch& batch : st->batches) {
    for (size_t k = 0; k < batch.items.size() && k < batch.group.members.size(); ++k) {
      target_version[batch.items[k]] = batch.group.members[k].target_version;
    }
  }
  for (size_t i = 0; i < st->items.size(); ++i) {
    const LoadState::Item& item = st->items[i];
    v1::LoadedTensor* t = resp.add_tensors();
    t->set_tensor(item.tensor->name);
    t->set_name(item.name);
    t->set_version(target_version.count(i) ? target_version.at(i) : 0);
    const int64_t b = Box::Whole(item.tensor->shape).Volume() * ElementSize(item.tensor->dtype) +
                      item.scale_bytes;
    t->set_bytes(b);
    if (item.scale != nullptr) t->set_scale_tensor(item.scale->name);
    t->set_dtype(DTypeToProto(item.result_dtype));
    bytes += b;
  }
  // Per reading rank, over every batch.
  std::map<int64_t, v1::CheckpointFileInfo> readers;
  int64_t moved = 0, lower_bound = 0, direct = 0;
  for (const LoadState::Batch& batch : st->batches) {
    for (const LoadState::Reader& r : batch.readers) {
      v1::CheckpointFileInfo& out = readers[r.endpoint.rank];
      out.set_worker(r.endpoint.name);
      out.set_rank(r.endpoint.rank);
      out.set_bytes(out.bytes() + r.response.bytes_read());
      int64_t runs = 0;
      for (const v1::CheckpointReadBuffer& b : r.request.buffers()) runs += b.runs_size();
      out.set_entries(out.entries() + runs);
      out.set_seconds(out.seconds() + r.response.seconds());
      read += r.response.bytes_read();
      direct += r.response.bytes_read_direct();
    }
    moved += batch.group.bytes_moved;
    lower_bound += batch.group.lower_bound_bytes;
    resp.add_group_ids(batch.group.id);
  }
  for (auto& [rank, info] : readers) *resp.add_readers() = std::move(info);
  resp.set_bytes(bytes);
  resp.set_bytes_read(read);
  resp.set_bytes_read_direct(direct);
  resp.set_exchange_bytes_moved(moved);
  resp.set_exchange_lower_bound_bytes(lower_bound);
  {
    absl::MutexLock lock(&st->mu);
    resp.set_read_seconds(absl::ToDoubleSeconds(st->read_end - st->start));
    resp.set_exchange_seconds(absl::ToDoubleSeconds(st->exchange_end - st->exchange_start));
  }
  resp.set_seconds(absl::ToDoubleSeconds(clock_->Now() - st->start));
  if (!st->batches.empty()) resp.set_group_id(st->batches.front().group.id);
  EndProgress(st->args.id, absl::OkStatus());
  st->done(std::move(resp));
}

void CheckpointManager::LoadFailed(const std::shared_ptr<LoadState>& st, absl::Status s) {
  // Nothing may stay: hidden tensors (reserved, made ready, or committed hidden at their target
  // by a batch's group) and every buffer read or moved.
  for (const LoadState::Item& item : st->items) {
    if (!item.reserved) continue;
    tensors_->CancelCreate(item.staging, st->op);
    absl::StatusOr<TensorRecord> rec = tensors_->Remove(item.staging, st->op);
    if (!rec.ok() || rec->version == item.version) continue;
    // Its batch's group committed it: its target buffers go too.
    for (const RankChunks& rc : rec->layout.ranks()) {
      absl::StatusOr<WorkerEndpoint> e = Endpoint(rc.rank);
      if (!e.ok()) continue;
      v1::DropTensorRequest drop;
      drop.set_tensor(rec->name);
      drop.set_version(rec->version);
      client_->DropTensor(*e, drop, [](absl::Status) {});
    }
  }
  for (const LoadState::Batch& batch : st->batches) {
    for (const LoadState::Reader& r : batch.readers) {
      if (!r.ok) continue;
      for (size_t i : r.item_of) {
        v1::DropTensorRequest drop;
        drop.set_tensor(st->items[i].staging);
        drop.set_version(st->items[i].version);
        client_->DropTensor(r.endpoint, drop, [](absl::Status) {});
      }
    }
  }
  EndProgress(st->args.id, s);
  st->done(s);
}
// ---- Inspect ---------------------------------------------------------------------------------

void CheckpointManager::Inspect(const std::string& dir_arg, InspectCallback done) {
  absl::StatusOr<std::string> dir = CleanDir(dir_arg);
  if (!dir.ok()) return done(dir.status());
  absl::StatusOr<WorkerEndpoint> reader = AnyLiveWorker();
  if (!reader.ok()) return done(reader.status());
  v1::ReadCheckpointIndexRequest req;
  req.set_path(*dir);
  const WorkerEndpoint w = *reader;
  client_->ReadCheckpointIndex(
      w, req, [this, w, done = std::move(done)](absl::StatusOr<v1::ReadCheckpointIndexResponse> r) {
        if (!r.ok()) return done(WorkerError(w, r.status()));
        absl::StatusOr<CheckpointFiles> files = ParseCheckpointFiles(*r);
        if (!files.ok()) return done(files.status());
        v1::InspectCheckpointResponse resp;
        resp.set_dir(files->dir);
        resp.set_plain(files->plain);
        int64_t total = 0;
        for (const CheckpointTensor& t : files->index.tensors) {
          v1::CheckpointTensorInfo* out = resp.add_tensors();
          out->set_name(t.name);
          ShapeToProto(t.shape, out->mutable_shape());
          out->set_dtype(DTypeToProto(t.dtype));
          const int64_t esize = ElementSize(t.dtype);
          out->set_bytes(Box::Whole(t.shape).Volume() * esize);
          total += out->bytes();
          for (const CheckpointPiece& p : t.pieces) {
            v1::CheckpointPieceInfo* pi = out->add_pieces();
            *pi->mutable_box() = BoxToProto(p.box);
            pi->set_file(p.file);
            pi->set_entry(p.entry);
            if (p.has_xxh64) pi->set_xxh64(absl::StrFormat("%016x", p.xxh64));
            pi->set_bytes(p.box.Volume() * esize);
          }
        }
        for (const CheckpointFile& f : files->index.files) {
          v1::CheckpointFileInfo* out = resp.add_files();
          out->set_file(f.file);
          out->set_worker(f.writer);
          out->set_rank(f.rank);
          out->set_bytes(files->file_bytes.count(f.file) ? files->file_bytes.at(f.file) : f.bytes);
          int64_t entries = 0;
          for (const CheckpointTensor& t : files->index.tensors) {
            for (const CheckpointPiece& p : t.pieces) entries += p.file == f.file;
          }
          out->set_entries(entries);
        }
        resp.set_bytes(total);
        done(std::move(resp));
      });
}

}  // namespace shardcoord
