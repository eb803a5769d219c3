#include "worker/buffers/buffer_store.h"

#include <algorithm>
#include <iterator>
#include <set>
#include <tuple>

#include "absl/strings/str_cat.h"
#include "sharding/box.h"

namespace shardcoord {

absl::StatusOr<std::shared_ptr<HostBuffer>> HostBuffer::Create(DType dtype, RankChunks chunks,
                                                               MemorySpace* space) {
  if (space == nullptr) space = &HostMemorySpace::Global();
  absl::StatusOr<int64_t> bytes = CheckChunks(dtype, chunks);
  if (!bytes.ok()) return bytes.status();
  absl::StatusOr<Allocation> allocation = space->Allocate(*bytes);
  if (!allocation.ok()) return allocation.status();
  return std::shared_ptr<HostBuffer>(
      new HostBuffer(dtype, std::make_shared<const RankChunks>(std::move(chunks)), *bytes, space,
                     *allocation, nullptr, nullptr));
}

namespace {

// CreateMany's one allocation, freed with the last buffer in it.
struct SharedAllocation {
  SharedAllocation(MemorySpace* space, Allocation allocation)
      : space(space), allocation(allocation) {}
  ~SharedAllocation() { space->Free(allocation); }
  MemorySpace* const space;
  const Allocation allocation;
};

}  // namespace

absl::StatusOr<std::vector<std::shared_ptr<HostBuffer>>> HostBuffer::CreateMany(
    absl::Span<const Spec> specs, MemorySpace* space) {
  if (space == nullptr) space = &HostMemorySpace::Global();
  constexpr int64_t kAlign = 64;  // As the space's own allocations.
  std::vector<int64_t> bytes(specs.size());
  std::vector<int64_t> offsets(specs.size());
  int64_t total = 0;
  for (size_t i = 0; i < specs.size(); ++i) {
    if (specs[i].chunks == nullptr) {
      return absl::InvalidArgumentError(absl::StrCat("buffer ", i, ": no chunks"));
    }
    absl::StatusOr<int64_t> b = CheckChunks(specs[i].dtype, *specs[i].chunks);
    if (!b.ok()) {
      return absl::Status(b.status().code(),
                          absl::StrCat("buffer ", i, ": ", b.status().message()));
    }
    bytes[i] = *b;
    offsets[i] = total;
    absl::StatusOr<int64_t> end = CheckedAdd(total, (*b + kAlign - 1) / kAlign * kAlign);
    if (!end.ok())
      return absl::InvalidArgumentError(absl::StrCat("buffer ", i, ": ", end.status().message()));
    total = *end;
  }
  std::vector<std::shared_ptr<HostBuffer>> out;
  if (specs.empty()) return out;
  absl::StatusOr<Allocation> allocation = space->Allocate(total);
  if (!allocation.ok()) return allocation.status();
  auto shared = std::make_shared<const SharedAllocation>(space, *allocation);
  out.reserve(specs.size());
  for (size_t i = 0; i < specs.size(); ++i) {
    out.push_back(std::shared_ptr<HostBuffer>(
        new HostBuffer(specs[i].dtype, specs[i].chunks, bytes[i], space,
                       Allocation{allocation->data + offsets[i], 0}, nullptr, shared)));
  }
  return out;
}

absl::StatusOr<std::shared_ptr<HostBuffer>> HostBuffer::Wrap(DType dtype, RankChunks chunks,
                                                             MemorySpace* space, char* data,
                                                             std::shared_ptr<LentMemory> lent) {
  if (space == nullptr || data == nullptr || lent == nullptr) {
    return absl::InvalidArgumentError("lent memory: no space, data or owner");
  }
  absl::StatusOr<int64_t> bytes = CheckChunks(dtype, chunks);
  if (!bytes.ok()) return bytes.status();
  return std::shared_ptr<HostBuffer>(
      new HostBuffer(dtype, std::make_shared<const RankChunks>(std::move(chunks)), *bytes, space,
                     Allocation{data, 0}, std::move(lent), nullptr));
}

absl::StatusOr<int64_t> HostBuffer::CheckChunks(DType dtype, const RankChunks& chunks) {
  const int64_t element_size = ElementSize(dtype);
  if (chunks.local_elements < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("local_elements ", chunks.local_elements, " is negative"));
  }
  for (size_t i = 0; i < chunks.chunks.size(); ++i) {
    const Chunk& c = chunks.chunks[i];
    absl::StatusOr<int64_t> volume = CheckedProduct(c.box.shape());
    if (!volume.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat("chunk ", i, " box ", c.box.ToString(), ": ", volume.status().message()));
    }
    if (c.local_offset < 0 || c.local_offset > chunks.local_elements - *volume) {
      return absl::InvalidArgumentError(
          absl::StrCat("chunk ", i, " box ", c.box.ToString(), " at local_offset ", c.local_offset,
                       " does not fit in a local buffer of ", chunks.local_elements, " elements"));
    }
  }
  return CheckedMul(chunks.local_elements, element_size);
}

HostBuffer::HostBuffer(DType dtype, std::shared_ptr<const RankChunks> chunks, int64_t bytes,
                       MemorySpace* space, Allocation allocation, std::shared_ptr<LentMemory> lent,
                       std::shared_ptr<const void> shared)
    : dtype_(dtype),
      element_size_(ElementSize(dtype)),
      chunks_(std::move(chunks)),
      bytes_(bytes),
      space_(space),
      allocation_(lent == nullptr && shared == nullptr ? allocation : Allocation{}),
      lent_(std::move(lent)),
      shared_(std::move(shared)),
      data_(allocation.data) {}

// Lent memory is released by its LentMemory, after the buffer.
HostBuffer::~HostBuffer() { space_->Free(allocation_); }

absl::StatusOr<std::vector<uint64_t>> HostBuffer::Checksums() const {
  return space_->ChunkChecksums(ChecksumRegions());
}

std::vector<ChecksumRegion> HostBuffer::ChecksumRegions() const {
  std::vector<ChecksumRegion> regions;
  regions.reserve(chunks_->chunks.size());
  for (size_t i = 0; i < chunks_->chunks.size(); ++i) {
    regions.push_back(ChecksumRegion{chunk_data(i), chunk_bytes(i)});
  }
  return regions;
}

absl::Status BufferStore::Insert(absl::string_view tensor, int64_t version,
                                 std::shared_ptr<HostBuffer> buffer) {
  absl::MutexLock lock(&mu_);
  auto& versions = buffers_[std::string(tensor)];
  if (!versions.emplace(version, std::move(buffer)).second) {
    return absl::AlreadyExistsError(
        absl::StrCat("tensor '", tensor, "' version ", version, " already has a buffer"));
  }
  return absl::OkStatus();
}

void BufferStore::Put(absl::string_view tensor, int64_t version,
                      std::shared_ptr<HostBuffer> buffer) {
  absl::MutexLock lock(&mu_);
  buffers_[std::string(tensor)][version] = std::move(buffer);
}

std::shared_ptr<HostBuffer> BufferStore::Find(absl::string_view tensor, int64_t version) const {
  absl::MutexLock lock(&mu_);
  auto it = buffers_.find(tensor);
  if (it == buffers_.end()) return nullptr;
  auto v = it->second.find(version);
  return v == it->second.end() ? nullptr : v->second;
}

absl::StatusOr<std::shared_ptr<HostBuffer>> BufferStore::Get(absl::string_view tensor,
                                                             int64_t version) const {
  std::shared_ptr<HostBuffer> buffer = Find(tensor, version);
  if (buffer == nullptr) {
    return absl::NotFoundError(
        absl::StrCat("no buffer for tensor '", tensor, "' version ", version));
  }
  return buffer;
}

absl::Status BufferStore::Store(absl::string_view tensor, int64_t version,
                                std::shared_ptr<HostBuffer> buffer) {
  absl::MutexLock lock(&mu_);
  if (buffer->lent() != nullptr && buffer->lent()->detached()) {
    return absl::AbortedError(absl::StrCat("the buffer of tensor '", tensor, "' version ", version,
                                           " (", buffer->lent()->Describe(), ") was detached"));
  }
  buffers_[std::string(tensor)][version] = std::move(buffer);
  return absl::OkStatus();
}

int BufferStore::DropLent(const LentMemory* lent) {
  std::vector<std::shared_ptr<HostBuffer>> dropped;  // Freed after the lock is released.
  absl::MutexLock lock(&mu_);
  for (auto it = buffers_.begin(); it != buffers_.end();) {
    for (auto v = it->second.begin(); v != it->second.end();) {
      if (v->second->lent() == lent) {
        dropped.push_back(std::move(v->second));
        v = it->second.erase(v);
      } else {
        ++v;
      }
    }
    if (it->second.empty()) {
      buffers_.erase(it++);  // Invalidates only the erased element's iterator.
    } else {
      ++it;
    }
  }
  return static_cast<int>(dropped.size());
}

bool BufferStore::Drop(absl::string_view tensor, int64_t version) {
  std::shared_ptr<HostBuffer> dropped;  // Freed after the lock is released.
  absl::MutexLock lock(&mu_);
  auto it = buffers_.find(tensor);
  if (it == buffers_.end()) return false;
  auto v = it->second.find(version);
  if (v == it->second.end()) return false;
  dropped = std::move(v->second);
  it->second.erase(v);
  if (it->second.empty()) buffers_.erase(it);
  return true;
}

int BufferStore::DropTensor(absl::string_view tensor) {
  std::map<int64_t, std::shared_ptr<HostBuffer>> dropped;
  absl::MutexLock lock(&mu_);
  auto it = buffers_.find(tensor);
  if (it == buffers_.end()) return 0;
  dropped = std::move(it->second);
  buffers_.erase(it);
  return static_cast<int>(dropped.size());
}

std::vector<BufferStore::Entry> BufferStore::List() const {
  absl::MutexLock lock(&mu_);
  std::vector<Entry> out;
  for (const auto& [tensor, versions] : buffers_) {
    for (const auto& [version, buffer] : versions) {
      out.push_back(Entry{tensor, version, buffer->bytes()});
    }
  }
  // By tensor name, then version (the map is unordered).
  std::sort(out.begin(), out.end(), [](const Entry& a, const Entry& b) {
    return std::tie(a.tensor, a.version) < std::tie(b.tensor, b.version);
  });
  return out;
}

int64_t BufferStore::TotalBytes() const {
  absl::MutexLock lock(&mu_);
  int64_t total = 0;
  for (const auto& [tensor, versions] : buffers_) {
    for (const auto& [version, buffer] : versions) {
      if (!buffer->attached()) total += buffer->bytes();
    }
  }
  return total;
}

int64_t BufferStore::LentBytes() const {
  absl::MutexLock lock(&mu_);
  std::set<const LentMemory*> seen;
  int64_t total = 0;
  for (const auto& [tensor, versions] : buffers_) {
    for (const auto& [version, buffer] : versions) {
      if (buffer->attached() && seen.insert(buffer->lent()).second) total += buffer->bytes();
    }
  }
  return total;
}

}  // namespace shardcoord
