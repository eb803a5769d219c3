#include "coordinator/testing/fake_worker_client.h"

#include <xxhash.h>

#include <algorithm>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "proto/convert.h"
#include "sharding/box_copy.h"
#include "sharding/checkpoint_index.h"
#include "sharding/fill.h"
#include "sharding/safetensors.h"

namespace shardcoord {

uint64_t FakeWorkerClient::Checksum(absl::string_view bytes) {
  uint64_t h = 1469598103934665603ull;  // FNV-1a
  for (unsigned char c : bytes) {
    h ^= c;
    h *= 1099511628211ull;
  }
  return h;
}

absl::Status FakeWorkerClient::Injected(const std::string& method, int64_t rank) const {
  auto it = failures_.find({method, rank});
  return it == failures_.end() ? absl::OkStatus() : it->second;
}

void FakeWorkerClient::Fail(const std::string& method, int64_t rank, absl::Status status) {
  absl::MutexLock lock(&mu_);
  failures_[{method, rank}] = std::move(status);
}

void FakeWorkerClient::HoldExecutes(bool hold) {
  absl::MutexLock lock(&mu_);
  hold_ = hold;
}

void FakeWorkerClient::ReleaseExecutes() {
  std::vector<StatusCallback> held;
  {
    absl::MutexLock lock(&mu_);
    held.swap(held_);
  }
  for (StatusCallback& cb : held) cb(absl::OkStatus());
}

void FakeWorkerClient::HoldFinishes(bool hold) {
  absl::MutexLock lock(&mu_);
  hold_finishes_ = hold;
}

void FakeWorkerClient::ReleaseFinishes() {
  std::vector<std::pair<Key, StatusCallback>> held;
  {
    absl::MutexLock lock(&mu_);
    held.swap(held_finishes_);
    for (const auto& [key, cb] : held) buffers_.erase(key);
  }
  for (auto& [key, cb] : held) cb(absl::OkStatus());
}

v1::RankChunks FakeWorkerClient::WithChecksums(const v1::RankChunks& chunks,
                                               const std::string& bytes, int64_t element_size) {
  v1::RankChunks out = chunks;
  for (v1::Chunk& c : *out.mutable_chunks()) {
    int64_t n = 1;
    for (int64_t d : c.box().shape()) n *= d;
    const size_t start = static_cast<size_t>(c.local_offset() * element_size);
    const size_t len = static_cast<size_t>(n * element_size);
    c.set_checksum(
        start + len <= bytes.size() ? Checksum(absl::string_view(bytes).substr(start, len)) : 0);
  }
  return out;
}

void FakeWorkerClient::Execute(const WorkerEndpoint& worker, v1::PlanFragment fragment,
                               StatusCallback done) {
  absl::Status status;
  std::function<void(const WorkerEndpoint&, const v1::PlanFragment&)> hook;
  {
    absl::MutexLock lock(&mu_);
    ++calls_["Execute"];
    fragments_.push_back(fragment);
    status = Injected("Execute", worker.rank);
    if (status.ok() && hold_) {
      held_.push_back(std::move(done));
      return;
    }
    hook = hook_;
  }
  done(status);
  if (status.ok() && hook) hook(worker, fragment);
}

void FakeWorkerClient::SetExecuteHook(
    std::function<void(const WorkerEndpoint&, const v1::PlanFragment&)> hook) {
  absl::MutexLock lock(&mu_);
  hook_ = std::move(hook);
}

void FakeWorkerClient::FinishPlan(const WorkerEndpoint& worker, v1::FinishPlanRequest request,
                                  StatusCallback done) {
  absl::Status status;
  {
    absl::MutexLock lock(&mu_);
    ++calls_["FinishPlan"];
    finishes_.emplace_back(worker.rank, request);
    status = Injected("FinishPlan", worker.rank);
    const Key key{worker.rank, request.tensor(), request.drop_version()};
    if (status.ok() && hold_finishes_) {
      held_finishes_.emplace_back(key, std::move(done));
      return;
    }
    if (status.ok()) buffers_.erase(key);
  }
  done(status);
}

void FakeWorkerClient::Fill(const WorkerEndpoint& worker, const v1::FillRequest& request,
                            Callback<v1::FillResponse> done) {
  absl::Status status;
  v1::FillResponse response;
  {
    absl::MutexLock lock(&mu_);
    ++calls_["Fill"];
    status = Injected("Fill", worker.rank);
    if (status.ok()) {
      const DType dtype = static_cast<DType>(request.dtype());
      const int64_t es = ElementSize(dtype);
      Buf buf;
      buf.chunks = request.chunks();
      buf.dtype = request.dtype();
      buf.bytes.assign(static_cast<size_t>(request.chunks().local_elements() * es), '\0');
      const Shape global(request.global_shape().begin(), request.global_shape().end());
      const FillKind kind = request.init() == v1::ARANGE   ? FillKind::kArange
                            : request.init() == v1::RANDOM ? FillKind::kRandom
                                                           : FillKind::kZeros;
      for (const v1::Chunk& c : request.chunks().chunks()) {
        absl::StatusOr<Box> box = BoxFromProto(c.box(), "box");
        if (!box.ok()) {
          status = box.status();
          break;
        }
        status = FillBox(kind, request.seed(), global, *box, dtype,
                         buf.bytes.data() + c.local_offset() * es);
        if (!status.ok()) break;
      }
      if (status.ok()) {
        *response.mutable_chunks() = WithChecksums(buf.chunks, buf.bytes, es);
        buffers_[Key{worker.rank, request.tensor(), request.version()}] = std::move(buf);
      }
    }
  }
  if (!status.ok()) return done(status);
  done(std::move(response));
}

void FakeWorkerClient::FillMany(const WorkerEndpoint& worker, const v1::FillManyRequest& request,
                                Callback<v1::FillManyResponse> done) {
  {
    absl::MutexLock lock(&mu_);
    ++calls_["FillMany"];
    if (absl::Status s = Injected("FillMany", worker.rank); !s.ok()) return done(s);
  }
  // Fill answers inline: each fill as the worker's own loop runs it.
  v1::FillManyResponse response;
  absl::Status status;
  for (int i = 0; i < request.fills_size() && status.ok(); ++i) {
    Fill(worker, request.fills(i), [&](absl::StatusOr<v1::FillResponse> r) {
      if (!r.ok()) {
        status =
            absl::Status(r.status().code(), absl::StrCat("fills[", i, "]: ", r.status().message()));
        return;
      }
      *response.add_chunks() = std::move(*r->mutable_chunks());
    });
  }
  if (!status.ok()) return done(status);
  done(std::move(response));
}

void FakeWorkerClient::DropTensor(const WorkerEndpoint& worker,
                                  const v1::DropTensorRequest& request, StatusCallback done) {
  {
    absl::MutexLock lock(&mu_);
    ++calls_["DropTensor"];
    drops_.emplace_back(worker.rank, request);
    for (auto it = buffers_.begin(); it != buffers_.end();) {
      const auto& [rank, tensor, version] = it->first;
      const bool listed = std::find(request.tensors().begin(), request.tensors().end(), tensor) !=
                          request.tensors().end();
      if (rank == worker.rank && ((tensor == request.tensor() &&
                                   (request.version() == -1 || version == request.version())) ||
                                  listed)) {
        it = buffers_.erase(it);
      } else {
        ++it;
      }
    }
  }
  done(absl::OkStatus());
}

void FakeWorkerClient::ReadChunk(const WorkerEndpoint& worker, const v1::ReadChunkRequest& request,
                                 Callback<std::string> done) {
  absl::Status status;
  std::string out;
  {
    absl::MutexLock lock(&mu_);
    ++calls_["ReadChunk"];
    status = Injected("ReadChunk", worker.rank);
    auto it = buffers_.find(Key{worker.rank, request.tensor(), request.version()});
    if (status.ok() && it == buffers_.end()) {
      status = absl::NotFoundError(absl::StrCat("no buffer ", request.tensor(), " v",
                                                request.version(), " on rank ", worker.rank));
    }
    absl::StatusOr<Box> want = BoxFromProto(request.box(), "box");
    if (status.ok() && !want.ok()) status = want.status();
    if (status.ok()) {
      const Buf& buf = it->second;
      const int64_t es = ElementSize(static_cast<DType>(buf.dtype));
      status = absl::InvalidArgumentError("box is in no chunk");
      for (const v1::Chunk& c : buf.chunks.chunks()) {
        Box cb = *BoxFromProto(c.box(), "box");
        if (!cb.Contains(*want)) continue;
        out.assign(static_cast<size_t>(want->Volume() * es), '\0');
        status = PackBox(*want, buf.bytes.data() + c.local_offset() * es, cb, out.data(), es);
        break;
      }
    }
  }
  if (!status.ok()) return done(status);
  done(std::move(out));
}

void FakeWorkerClient::WriteChunk(const WorkerEndpoint& worker, const v1::ChunkData& header,
                                  std::string data, Callback<v1::WriteChunkResponse> done) {
  absl::Status status;
  v1::WriteChunkResponse response;
  {
    absl::MutexLock lock(&mu_);
    ++calls_["WriteChunk"];
    status = Injected("WriteChunk", worker.rank);
    const int64_t es = ElementSize(static_cast<DType>(header.dtype()));
    if (status.ok() && (header.total_bytes() != static_cast<int64_t>(data.size()) ||
                        header.chunks().local_elements() * es != header.total_bytes())) {
      status = absl::InvalidArgumentError("byte count");
    }
    if (status.ok()) {
      Buf buf;
      buf.chunks = header.chunks();
      buf.dtype = header.dtype();
      buf.bytes = std::move(data);
      *response.mutable_chunks() = WithChecksums(buf.chunks, buf.bytes, es);
      buffers_[Key{worker.rank, header.tensor(), header.version()}] = std::move(buf);
    }
  }
  if (!status.ok()) return done(status);
  done(std::move(response));
}

std::vector<v1::PlanFragment> FakeWorkerClient::fragments() const {
  absl::MutexLock lock(&mu_);
  return fragments_;
}

std::vector<std::pair<int64_t, v1::FinishPlanRequest>> FakeWorkerClient::finishes() const {
  absl::MutexLock lock(&mu_);
  return finishes_;
}

std::vector<std::pair<int64_t, v1::DropTensorRequest>> FakeWorkerClient::drops() const {
  absl::MutexLock lock(&mu_);
  return drops_;
}

int FakeWorkerClient::calls(const std::string& method) const {
  absl::MutexLock lock(&mu_);
  auto it = calls_.find(method);
  return it == calls_.end() ? 0 : it->second;
}

bool FakeWorkerClient::HasBuffer(int64_t rank, absl::string_view tensor, int64_t version) const {
  absl::MutexLock lock(&mu_);
  if (version == -1) {
    for (const auto& [key, buf] : buffers_) {
      if (std::get<0>(key) == rank && std::get<1>(key) == tensor) return true;
    }
    return false;
  }
  return buffers_.count(Key{rank, std::string(tensor), version}) > 0;
}

std::string FakeWorkerClient::Buffer(int64_t rank, absl::string_view tensor,
                                     int64_t version) const {
  absl::MutexLock lock(&mu_);
  auto it = buffers_.find(Key{rank, std::string(tensor), version});
  return it == buffers_.end() ? std::string() : it->second.bytes;
}

// ---- Checkpoints on the simulated file system ------------------------------------------------

namespace {

std::string Parent(const std::string& path) { return path.substr(0, path.rfind('/')); }

// Files directly inside `dir`.
std::vector<std::string> FilesIn(const std::map<std::string, std::string>& files,
                                 const std::string& dir) {
  std::vector<std::string> out;
  for (const auto& [path, bytes] : files) {
    if (Parent(path) == dir) out.push_back(path);
  }
  return out;
}

}  // namespace

void FakeWorkerClient::WriteCheckpoint(const WorkerEndpoint& worker,
                                       const v1::WriteCheckpointRequest& request,
                                       Callback<v1::WriteCheckpointResponse> done) {
  absl::Status status;
  v1::WriteCheckpointResponse response;
  {
    absl::MutexLock lock(&mu_);
    ++calls_["WriteCheckpoint"];
    status = Injected("WriteCheckpoint", worker.rank);
    const std::string path = absl::StrCat(request.dir(), "/", request.file());
    if (status.ok() && dirs_.count(request.dir()) == 0) {
      status = absl::NotFoundError(absl::StrCat("no directory ", request.dir()));
    }
    if (status.ok() && files_.count(path) > 0) {
      status = absl::AlreadyExistsError(absl::StrCat(path, " exists"));
    }
    std::vector<SafetensorsEntrySpec> specs;
    std::string data;
    for (int i = 0; status.ok() && i < request.entries_size(); ++i) {
      const v1::CheckpointWriteEntry& e = request.entries(i);
      auto it = buffers_.find(Key{worker.rank, e.tensor(), e.version()});
      if (it == buffers_.end()) {
        status = absl::NotFoundError(absl::StrCat("no buffer ", e.tensor(), " v", e.version()));
        break;
      }
      const Buf& buf = it->second;
      const DType dtype = static_cast<DType>(buf.dtype);
      const int64_t es = ElementSize(dtype);
      const Box want = *BoxFromProto(e.box(), "box");
      std::string bytes;
      status = absl::InvalidArgumentError("box is in no chunk");
      for (const v1::Chunk& c : buf.chunks.chunks()) {
        const Box cb = *BoxFromProto(c.box(), "box");
        if (!cb.Contains(want)) continue;
        bytes.assign(static_cast<size_t>(want.Volume() * es), '\0');
        status = PackBox(want, buf.bytes.data() + c.local_offset() * es, cb, bytes.data(), es);
        break;
      }
      if (!status.ok()) break;
      specs.push_back({e.entry(), dtype, want.shape()});
      v1::CheckpointEntrySums* sums = response.add_entries();
      sums->set_entry(e.entry());
      sums->set_xxh64(XXH64(bytes.data(), bytes.size(), 0));
      const int64_t row_bytes = BoxRowElements(want) * es;
      const int64_t rows = RowsPerBlock(row_bytes);
      sums->set_rows_per_block(rows);
      const int64_t block = std::max<int64_t>(1, rows * row_bytes);
      for (int64_t at = 0; at < static_cast<int64_t>(bytes.size()); at += block) {
        const size_t n = static_cast<size_t>(std::min<int64_t>(block, bytes.size() - at));
        sums->add_blocks(XXH64(bytes.data() + at, n, 0));
      }
      sums->set_bytes(static_cast<int64_t>(bytes.size()));
      data += bytes;
    }
    if (status.ok()) {
      absl::StatusOr<std::string> header = BuildSafetensorsHeader(specs, {{"format", "pt"}});
      status = header.status();
      if (status.ok()) {
        files_[path] = *header + data;
        response.set_file_bytes(static_cast<int64_t>(files_[path].size()));
      }
    }
  }
  if (!status.ok()) return done(status);
  done(std::move(response));
}

void FakeWorkerClient::ReadCheckpoint(const WorkerEndpoint& worker,
                                      const v1::ReadCheckpointRequest& request,
                                      Callback<v1::ReadCheckpointResponse> done) {
  absl::Status status;
  v1::ReadCheckpointResponse response;
  {
    absl::MutexLock lock(&mu_);
    ++calls_["ReadCheckpoint"];
    status = Injected("ReadCheckpoint", worker.rank);
    std::vector<std::pair<Key, Buf>> made;
    int64_t read = 0;
    for (int j = 0; status.ok() && j < request.buffers_size(); ++j) {
      const v1::CheckpointReadBuffer& rb = request.buffers(j);
      const int64_t es = ElementSize(static_cast<DType>(rb.dtype()));
      Buf buf;
      buf.chunks = rb.chunks();
      buf.dtype = rb.dtype();
      buf.bytes.assign(static_cast<size_t>(rb.chunks().local_elements() * es), '\0');
      for (int i = 0; status.ok() && i < rb.runs_size(); ++i) {
        const v1::CheckpointReadRun& run = rb.runs(i);
        const std::string where = absl::StrCat(run.file(), ": entry \"", run.entry(), "\"");
        auto f = files_.find(absl::StrCat(request.dir(), "/", run.file()));
        if (f == files_.end()) {
          status = absl::NotFoundError(absl::StrCat("no file ", run.file()));
          break;
        }
        if (run.offset() + run.bytes() > static_cast<int64_t>(f->second.size())) {
          status = absl::DataLossError(
              absl::StrCat(where, ": the file ends at byte ", f->second.size(), " (truncated)"));
          break;
        }
        const std::string bytes = f->second.substr(run.offset(), run.bytes());
        read += run.bytes();
        for (int k = 0; k < run.blocks_size(); ++k) {
          const int64_t at = k * run.block_bytes();
          const size_t n =
              static_cast<size_t>(std::min<int64_t>(run.block_bytes(), run.bytes() - at));
          if (XXH64(bytes.data() + at, n, 0) != run.blocks(k)) {
            status = absl::DataLossError(absl::StrCat(where, ": block ", k, " (corrupted)"));
            break;
          }
        }
        if (status.ok() && run.has_xxh64() && XXH64(bytes.data(), bytes.size(), 0) != run.xxh64()) {
          status = absl::DataLossError(absl::StrCat(where, ": xxh64 (corrupted)"));
        }
        const int64_t offset = rb.chunks().chunks(i).local_offset() * es;
        std::copy(bytes.begin(), bytes.end(), buf.bytes.begin() + offset);
      }
      if (!status.ok()) break;
      *response.add_chunks() = WithChecksums(buf.chunks, buf.bytes, es);
      made.emplace_back(Key{worker.rank, rb.tensor(), rb.version()}, std::move(buf));
    }
    if (status.ok()) {
      for (auto& [key, buf] : made) buffers_[key] = std::move(buf);
      response.set_bytes_read(read);
    }
  }
  if (!status.ok()) return done(status);
  done(std::move(response));
}

void FakeWorkerClient::ReadCheckpointIndex(const WorkerEndpoint& worker,
                                           const v1::ReadCheckpointIndexRequest& request,
                                           Callback<v1::ReadCheckpointIndexResponse> done) {
  absl::Status status;
  v1::ReadCheckpointIndexResponse response;
  {
    absl::MutexLock lock(&mu_);
    ++calls_["ReadCheckpointIndex"];
    status = Injected("ReadCheckpointIndex", worker.rank);
    std::vector<std::string> paths;
    if (status.ok() && files_.count(request.path()) > 0) {
      response.set_dir(Parent(request.path()));
      paths.push_back(request.path());
    } else if (status.ok() && dirs_.count(request.path()) > 0) {
      response.set_dir(request.path());
      auto index = files_.find(absl::StrCat(request.path(), "/", kCheckpointIndexFile));
      if (index != files_.end()) response.set_index_json(index->second);
      for (const std::string& p : FilesIn(files_, request.path())) {
        if (absl::EndsWith(p, ".safetensors")) paths.push_back(p);
      }
    } else if (status.ok()) {
      status = absl::NotFoundError(absl::StrCat("no such file or directory ", request.path()));
    }
    for (const std::string& p : paths) {
      const std::string& bytes = files_.at(p);
      v1::CheckpointFileHeader* h = response.add_files();
      h->set_file(p.substr(p.rfind('/') + 1));
      h->set_file_bytes(static_cast<int64_t>(bytes.size()));
      absl::StatusOr<int64_t> n = ParseSafetensorsPrefix(absl::string_view(bytes).substr(0, 8));
      if (!n.ok() || *n + 8 > static_cast<int64_t>(bytes.size())) {
        status = absl::DataLossError(absl::StrCat(p, ": truncated header"));
        break;
      }
      h->set_json(bytes.substr(8, static_cast<size_t>(*n)));
    }
  }
  if (!status.ok()) return done(status);
  done(std::move(response));
}

void FakeWorkerClient::CheckpointDir(const WorkerEndpoint& worker,
                                     const v1::CheckpointDirRequest& request, StatusCallback done) {
  absl::Status status;
  {
    absl::MutexLock lock(&mu_);
    ++calls_["CheckpointDir"];
    status = Injected("CheckpointDir", worker.rank);
    const std::string& dir = request.dir();
    const std::string& tmp = request.tmp();
    if (status.ok()) {
      switch (request.action()) {
        case v1::CHECKPOINT_DIR_PREPARE:
          if (dirs_.count(dir) > 0 && !request.overwrite()) {
            status = absl::AlreadyExistsError(absl::StrCat("dir: ", dir, " exists"));
          } else {
            dirs_.insert(tmp);
          }
          break;
        case v1::CHECKPOINT_DIR_COMMIT:
          if (dirs_.count(tmp) == 0) {
            status = absl::NotFoundError(absl::StrCat("no directory ", tmp));
          } else if (dirs_.count(dir) > 0 && !request.overwrite()) {
            status = absl::AlreadyExistsError(absl::StrCat("dir: ", dir, " exists"));
          } else {
            files_[absl::StrCat(tmp, "/", kCheckpointIndexFile)] = request.index_json();
            for (const std::string& p : FilesIn(files_, dir)) files_.erase(p);
            for (const std::string& p : FilesIn(files_, tmp)) {
              files_[absl::StrCat(dir, p.substr(tmp.size()))] = files_[p];
              files_.erase(p);
            }
            dirs_.erase(tmp);
            dirs_.insert(dir);
          }
          break;
        case v1::CHECKPOINT_DIR_ABORT:
          for (const std::string& p : FilesIn(files_, tmp)) files_.erase(p);
          dirs_.erase(tmp);
          break;
        default:
          status = absl::InvalidArgumentError("action");
      }
    }
  }
  done(status);
}

int FakeWorkerClient::BufferCount(absl::string_view tensor) const {
  absl::MutexLock lock(&mu_);
  int n = 0;
  for (const auto& [key, buf] : buffers_) n += std::get<1>(key) == tensor;
  return n;
}

std::string FakeWorkerClient::File(const std::string& path) const {
  absl::MutexLock lock(&mu_);
  auto it = files_.find(path);
  return it == files_.end() ? std::string() : it->second;
}

void FakeWorkerClient::SetFile(const std::string& path, std::string bytes) {
  absl::MutexLock lock(&mu_);
  files_[path] = std::move(bytes);
}

void FakeWorkerClient::AddDir(const std::string& path) {
  absl::MutexLock lock(&mu_);
  dirs_.insert(path);
}

bool FakeWorkerClient::HasDir(const std::string& path) const {
  absl::MutexLock lock(&mu_);
  return dirs_.count(path) > 0;
}

std::vector<std::string> FakeWorkerClient::Paths() const {
  absl::MutexLock lock(&mu_);
  std::vector<std::string> out(dirs_.begin(), dirs_.end());
  for (const auto& [path, bytes] : files_) out.push_back(path);
  std::sort(out.begin(), out.end());
  return out;
}

}  // namespace shardcoord
