#include "coordinator/fake_worker_client.h"

#include "absl/strings/str_cat.h"
#include "proto/convert.h"
#include "sharding/box_copy.h"
#include "sharding/fill.h"

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

void FakeWorkerClient::FinishPlan(const WorkerEndpoint& worker,
                                  const v1::FinishPlanRequest& request, StatusCallback done) {
  absl::Status status;
  {
    absl::MutexLock lock(&mu_);
    ++calls_["FinishPlan"];
    finishes_.emplace_back(worker.rank, request);
    status = Injected("FinishPlan", worker.rank);
    if (status.ok()) buffers_.erase(Key{worker.rank, request.tensor(), request.drop_version()});
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

void FakeWorkerClient::DropTensor(const WorkerEndpoint& worker,
                                  const v1::DropTensorRequest& request, StatusCallback done) {
  {
    absl::MutexLock lock(&mu_);
    ++calls_["DropTensor"];
    drops_.emplace_back(worker.rank, request);
    for (auto it = buffers_.begin(); it != buffers_.end();) {
      const auto& [rank, tensor, version] = it->first;
      if (rank == worker.rank && tensor == request.tensor() &&
          (request.version() == -1 || version == request.version())) {
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
  return buffers_.count(Key{rank, std::string(tensor), version}) > 0;
}

std::string FakeWorkerClient::Buffer(int64_t rank, absl::string_view tensor,
                                     int64_t version) const {
  absl::MutexLock lock(&mu_);
  auto it = buffers_.find(Key{rank, std::string(tensor), version});
  return it == buffers_.end() ? std::string() : it->second.bytes;
}

}  // namespace shardcoord
