#include "worker/buffers/checkpoint_io.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>

#include <algorithm>
#include <atomic>
#include <climits>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/cleanup/cleanup.h"
#include "absl/container/flat_hash_set.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "proto/convert.h"
#include "sharding/block_quant.h"
#include "sharding/checkpoint_index.h"
#include "sharding/checkpoint_plan.h"
#include "sharding/field_status.h"
#include "sharding/safetensors.h"
#include "worker/buffers/checksum.h"
#include "worker/plans/fragment.h"

namespace shardcoord {
namespace {

// Largest single write(2)/pread(2) Linux performs.
constexpr int64_t kMaxIoBytes = int64_t{1} << 30;
// index.json larger than this is refused (a 4096-rank checkpoint of a large model is a few MiB).
constexpr int64_t kMaxIndexBytes = int64_t{256} << 20;

std::string Errno(int e) { return std::strerror(e); }

// The error of a failed system call on `path`, with the code that fits the errno.
absl::Status IoError(int e, absl::string_view what, absl::string_view path) {
  const std::string msg = absl::StrCat(what, " ", path, ": ", Errno(e));
  switch (e) {
    case ENOENT:
      return absl::NotFoundError(msg);
    case EEXIST:
    case ENOTEMPTY:
      return absl::AlreadyExistsError(msg);
    case ENOSPC:
    case EDQUOT:
    case ENOMEM:
      return absl::ResourceExhaustedError(msg);
    case EACCES:
    case EPERM:
    case EROFS:
      return absl::PermissionDeniedError(msg);
    case ENOTDIR:
    case EISDIR:
    case ENAMETOOLONG:
      return absl::InvalidArgumentError(msg);
    default:
      return absl::UnavailableError(msg);
  }
}

absl::Status CheckAbsolute(absl::string_view field, absl::string_view path) {
  if (path.empty() || path[0] != '/' || absl::StrContains(path, '\0')) {
    return absl::InvalidArgumentError(
        absl::StrCat(field, ": '", path, "' is not an absolute path"));
  }
  return absl::OkStatus();
}

std::string Join(absl::string_view dir, absl::string_view name) {
  return absl::StrCat(dir, absl::EndsWith(dir, "/") ? "" : "/", name);
}

class Fd {
 public:
  Fd() = default;
  explicit Fd(int fd) : fd_(fd) {}
  Fd(Fd&& o) noexcept : fd_(o.fd_) { o.fd_ = -1; }
  Fd& operator=(Fd&& o) noexcept {
    std::swap(fd_, o.fd_);
    return *this;
  }
  ~Fd() {
    if (fd_ >= 0) close(fd_);
  }
  int get() const { return fd_; }
  bool ok() const { return fd_ >= 0; }

 private:
  int fd_ = -1;
};

absl::Status WriteAll(int fd, const char* p, int64_t n, absl::string_view path) {
  while (n > 0) {
    const ssize_t w = write(fd, p, static_cast<size_t>(std::min(n, kMaxIoBytes)));
    if (w < 0) {
      if (errno == EINTR) continue;
      return IoError(errno, "writing", path);
    }
    p += w;
    n -= w;
  }
  return absl::OkStatus();
}

// Reads up to n bytes at `offset`; returns how many it got (fewer only at the end of the file).
absl::StatusOr<int64_t> PreadFull(int fd, char* p, int64_t n, int64_t offset,
                                  absl::string_view path) {
  int64_t got = 0;
  while (got < n) {
    const ssize_t r =
        pread(fd, p + got, static_cast<size_t>(std::min(n - got, kMaxIoBytes)), offset + got);
    if (r < 0) {
      if (errno == EINTR) continue;
      return IoError(errno, "reading", path);
    }
    if (r == 0) break;
    got += r;
  }
  return got;
}

// A checkpoint file opened for reading. Runs whose destination is host memory at an address
// congruent to their file offset modulo kDirectIoAlignment (the load plan places large runs
// so) are read with O_DIRECT between their first and last aligned byte: the device writes
// straight into the buffer, without the page cache's copy, allocation and readahead, which
// cost a load more CPU than the disk's time. The edges, other runs, and file systems that
// refuse O_DIRECT (tmpfs) go through the page cache.
class CheckpointFileReader {
 public:
  static absl::StatusOr<std::unique_ptr<CheckpointFileReader>> Open(const std::string& path) {
    Fd fd(open(path.c_str(), O_RDONLY | O_CLOEXEC));
    if (!fd.ok()) return IoError(errno, "opening", path);
    posix_fadvise(fd.get(), 0, 0, POSIX_FADV_SEQUENTIAL);
    return std::unique_ptr<CheckpointFileReader>(new CheckpointFileReader(path, std::move(fd)));
  }

  // Bytes [offset, offset + n) into host memory at `dst`; how many it got (fewer only at the
  // end of the file).
  absl::StatusOr<int64_t> Read(char* dst, int64_t n, int64_t offset) {
    constexpr int64_t kAlign = kDirectIoAlignment;
    const int64_t a = (offset + kAlign - 1) / kAlign * kAlign;
    const int64_t e = (offset + n) / kAlign * kAlign;
    if (e - a < 2 * kAlign ||
        (reinterpret_cast<uintptr_t>(dst) - static_cast<uintptr_t>(offset)) % kAlign != 0 ||
        !UseDirect()) {
      return PreadFull(fd_.get(), dst, n, offset, path_);
    }
    absl::StatusOr<int64_t> head = PreadFull(fd_.get(), dst, a - offset, offset, path_);
    if (!head.ok() || *head < a - offset) return head;
    absl::StatusOr<int64_t> middle = ReadDirect(dst + (a - offset), e - a, a);
    if (!middle.ok()) return middle.status();
    if (*middle < e - a) return (a - offset) + *middle;
    absl::StatusOr<int64_t> tail =
        PreadFull(fd_.get(), dst + (e - offset), offset + n - e, e, path_);
    if (!tail.ok()) return tail.status();
    return (e - offset) + *tail;
  }

  // Bytes [offset, offset + n) into host memory at `dst` with one O_DIRECT read of the whole
  // pages that hold them, for a destination congruent to `offset` modulo kDirectIoAlignment
  // whose partial first and last pages are free to overwrite (no other data of the buffer
  // there): no edges through the page cache, one request instead of three. How many bytes of
  // the run it got (fewer only at the end of the file), or nullopt when it cannot (misaligned,
  // too small, no O_DIRECT here): then Read.
  absl::StatusOr<std::optional<int64_t>> ReadPages(char* dst, int64_t n, int64_t offset) {
    constexpr int64_t kAlign = kDirectIoAlignment;
    const int64_t head = offset % kAlign;
    if (n < 2 * kAlign ||
        (reinterpret_cast<uintptr_t>(dst) - static_cast<uintptr_t>(offset)) % kAlign != 0 ||
        !UseDirect()) {
      return std::nullopt;
    }
    const int64_t pages = (head + n + kAlign - 1) / kAlign * kAlign;
    const int64_t direct_before = direct_bytes_;
    absl::StatusOr<int64_t> got = ReadDirect(dst - head, pages, offset - head);
    if (!got.ok()) return got.status();
    // Count the run's bytes only (ReadDirect counted the pages it read with O_DIRECT, a prefix).
    direct_bytes_ = direct_before + std::clamp<int64_t>(direct_bytes_ - direct_before - head, 0, n);
    return std::clamp<int64_t>(*got - head, 0, n);
  }

  // Bytes Read and ReadPages got with O_DIRECT (of the runs, not the pages around them).
  int64_t direct_bytes() const { return direct_bytes_; }

 private:
  CheckpointFileReader(std::string path, Fd fd) : path_(std::move(path)), fd_(std::move(fd)) {}

  bool UseDirect() {
    if (direct_.ok()) return true;
    if (!try_direct_) return false;
    try_direct_ = false;
    direct_ = Fd(open(path_.c_str(), O_RDONLY | O_CLOEXEC | O_DIRECT));
    if (!direct_.ok()) return false;
    // The page cache now serves only the edges of runs and small runs: no readahead of bytes
    // that O_DIRECT reads.
    posix_fadvise(fd_.get(), 0, 0, POSIX_FADV_RANDOM);
    return true;
  }

  // Aligned bytes with O_DIRECT; through the page cache if the file system refuses.
  absl::StatusOr<int64_t> ReadDirect(char* dst, int64_t n, int64_t offset) {
    int64_t got = 0;
    while (got < n) {
      const ssize_t r =
          pread(direct_.get(), dst + got, static_cast<size_t>(std::min(n - got, kMaxDirectBytes)),
                offset + got);
      if (r < 0) {
        if (errno == EINTR) continue;
        if (errno != EINVAL) return IoError(errno, "reading", path_);
        direct_ = Fd();
        posix_fadvise(fd_.get(), 0, 0, POSIX_FADV_SEQUENTIAL);
        absl::StatusOr<int64_t> rest =
            PreadFull(fd_.get(), dst + got, n - got, offset + got, path_);
        if (!rest.ok()) return rest.status();
        return got + *rest;
      }
      if (r == 0) break;
      got += r;
      direct_bytes_ += r;
      if (r % kDirectIoAlignment != 0) {  // The end of the file, inside a block.
        break;
      }
    }
    return got;
  }

  // Largest O_DIRECT read: a multiple of the alignment.
  static constexpr int64_t kMaxDirectBytes = int64_t{1} << 29;

  const std::string path_;
  Fd fd_;
  Fd direct_;
  bool try_direct_ = true;
  int64_t direct_bytes_ = 0;
};

absl::Status SyncDir(const std::string& dir) {
  Fd fd(open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (!fd.ok()) return IoError(errno, "opening directory", dir);
  if (fsync(fd.get()) != 0) return IoError(errno, "fsync of directory", dir);
  return absl::OkStatus();
}

std::string ParentOf(const std::string& path) {
  std::string p = path;
  while (p.size() > 1 && p.back() == '/') p.pop_back();
  const size_t slash = p.rfind('/');
  return slash == 0 ? "/" : p.substr(0, slash);
}

// XXH64 of each consecutive block of `block_bytes` (the last one may be shorter) of bytes fed
// in order in pieces of any size. A block that arrives whole is hashed in one call.
class BlockHasher {
 public:
  explicit BlockHasher(int64_t block_bytes)
      : block_bytes_(std::max<int64_t>(1, block_bytes)), state_(XXH64_createState()) {}
  ~BlockHasher() { XXH64_freeState(state_); }
  BlockHasher(const BlockHasher&) = delete;
  BlockHasher& operator=(const BlockHasher&) = delete;

  void Update(const char* p, int64_t n) {
    while (n > 0) {
      if (in_block_ == 0 && n >= block_bytes_) {
        blocks_.push_back(XXH64(p, static_cast<size_t>(block_bytes_), 0));
        p += block_bytes_;
        n -= block_bytes_;
        continue;
      }
      if (in_block_ == 0) XXH64_reset(state_, 0);
      const int64_t take = std::min(n, block_bytes_ - in_block_);
      XXH64_update(state_, p, static_cast<size_t>(take));
      in_block_ += take;
      p += take;
      n -= take;
      if (in_block_ == block_bytes_) EndBlock();
    }
  }
  // After the last Update.
  void Finish() {
    if (in_block_ > 0) EndBlock();
  }
  const std::vector<uint64_t>& blocks() const { return blocks_; }

 private:
  void EndBlock() {
    blocks_.push_back(XXH64_digest(state_));
    in_block_ = 0;
  }

  const int64_t block_bytes_;
  XXH64_state_t* state_;
  int64_t in_block_ = 0;
  std::vector<uint64_t> blocks_;
};

// XXH64 of an entry's bytes and of each block of `block_bytes`, fed in order in pieces of
// any size.
class EntryHasher {
 public:
  explicit EntryHasher(int64_t block_bytes) : whole_(XXH64_createState()), blocks_(block_bytes) {
    XXH64_reset(whole_, 0);
  }
  ~EntryHasher() { XXH64_freeState(whole_); }
  EntryHasher(const EntryHasher&) = delete;
  EntryHasher& operator=(const EntryHasher&) = delete;

  void Update(const char* p, int64_t n) {
    XXH64_update(whole_, p, static_cast<size_t>(n));
    blocks_.Update(p, n);
  }
  // After the last Update.
  void Finish() { blocks_.Finish(); }
  uint64_t whole() const { return XXH64_digest(whole_); }
  const std::vector<uint64_t>& blocks() const { return blocks_.blocks(); }

 private:
  XXH64_state_t* whole_;
  BlockHasher blocks_;
};

// Element offset of `box` in a chunk stored row-major over `chunk`, when the box's elements
// are one contiguous run there; -1 otherwise.
int64_t ContiguousOffset(const Box& chunk, const Box& box) {
  const int nd = chunk.ndim();
  int k = 0;  // Dims before k are 1 in the box; dims after k are whole.
  while (k < nd && box.shape(k) == 1) ++k;
  for (int d = k + 1; d < nd; ++d) {
    if (box.shape(d) != chunk.shape(d)) return -1;
  }
  const Shape strides = RowMajorStrides(chunk.shape());
  int64_t off = 0;
  for (int d = 0; d < nd; ++d) off += (box.offset(d) - chunk.offset(d)) * strides[d];
  return off;
}

// Host memory reused for every piece of a call, grown as needed and never initialised (each
// piece overwrites it before it is read).
class StagingBuffer {
 public:
  char* Get(int64_t n) {
    if (n > capacity_) {
      data_.reset(new char[static_cast<size_t>(n)]);
      capacity_ = n;
    }
    return data_.get();
  }

 private:
  std::unique_ptr<char[]> data_;
  int64_t capacity_ = 0;
};

struct PlannedEntry {
  std::shared_ptr<HostBuffer> buffer;
  int chunk = 0;
  Box box;
  int64_t bytes = 0;
  int64_t block_bytes = 0;
  int64_t rows_per_block = 0;
};

// One reader's open files, staging buffer and count of bytes read.
struct RunReader {
  std::map<std::string, std::unique_ptr<CheckpointFileReader>> files;
  StagingBuffer staging;  // Host bytes on their way to another space.
  int64_t bytes_read = 0;
};

// For each chunk of `b`, whether the pages its bytes touch (kDirectIoAlignment, from the
// buffer's start) hold no byte of another chunk and lie inside the buffer, so that a read of
// those whole pages overwrites nothing else. The load plan places large runs so.
std::vector<bool> ChunksWithPagesToThemselves(const HostBuffer& b) {
  constexpr int64_t kAlign = kDirectIoAlignment;
  const std::vector<Chunk>& chunks = b.chunks().chunks;
  std::vector<std::pair<int64_t, int64_t>> spans;  // Bytes [begin, end) of each chunk.
  for (size_t i = 0; i < chunks.size(); ++i) {
    const int64_t begin = chunks[i].local_offset * b.element_size();
    spans.push_back({begin, begin + b.chunk_bytes(i)});
  }
  std::vector<size_t> order;  // The non-empty chunks by offset.
  for (size_t i = 0; i < chunks.size(); ++i) {
    if (spans[i].first < spans[i].second) order.push_back(i);
  }
  std::sort(order.begin(), order.end(), [&](size_t x, size_t y) { return spans[x] < spans[y]; });
  std::vector<bool> out(chunks.size(), false);
  int64_t ends_before = 0;  // The furthest end of the chunks before.
  for (size_t k = 0; k < order.size(); ++k) {
    const auto [begin, end] = spans[order[k]];
    const int64_t first = begin / kAlign * kAlign;
    const int64_t last = (end + kAlign - 1) / kAlign * kAlign;
    const int64_t next = k + 1 < order.size() ? spans[order[k + 1]].first : b.bytes();
    out[order[k]] = ends_before <= first && last <= next && last <= b.bytes();
    ends_before = std::max(ends_before, end);
  }
  return out;
}

// Reads one run into its chunk of `b` and checks it; for host memory also sets *chunk_sum.
// `whole_pages`: the chunk's partial first and last pages are free to overwrite.
absl::Status ReadOneRun(const std::string& dir, const v1::CheckpointReadRun& run, HostBuffer& b,
                        size_t chunk, bool whole_pages, RunReader& reader, uint64_t* chunk_sum) {
  MemorySpace& space = b.space();
  std::map<std::string, std::unique_ptr<CheckpointFileReader>>& files = reader.files;
  StagingBuffer& staging = reader.staging;
  int64_t& bytes_read = reader.bytes_read;
  const std::string path = Join(dir, run.file());
  std::unique_ptr<CheckpointFileReader>& file = files[run.file()];
  if (file == nullptr) {
    absl::StatusOr<std::unique_ptr<CheckpointFileReader>> opened = CheckpointFileReader::Open(path);
    if (!opened.ok()) return opened.status();
    file = *std::move(opened);
  }
  const std::string where = absl::StrCat(run.file(), ": entry \"", run.entry(), "\"");
  // Every byte is hashed once, as it arrives: in blocks to check against the index (or
  // whole, for an entry with only its xxh64), and on the host also in the chunk checksum's
  // blocks; when the index's blocks are the chunk checksum's (1 MiB), their hashes are the
  // chunk's too and the bytes are hashed only once.
  const bool by_blocks = run.blocks_size() > 0;
  const bool check_whole = !by_blocks && run.has_xxh64();
  const int64_t block_bytes = by_blocks ? run.block_bytes() : run.bytes();
  const bool blocks_are_chunk_blocks =
      space.is_host() && by_blocks && block_bytes == kChecksumBlockBytes;
  std::optional<BlockHasher> hasher;
  if (by_blocks || check_whole) hasher.emplace(block_bytes);
  char* dst = b.chunk_data(chunk);
  std::optional<ChunkChecksumBuilder> sum;
  if (space.is_host() && !blocks_are_chunk_blocks) sum.emplace(dst, run.bytes());
  // Pieces of whole blocks when blocks fit, so that each is hashed in one call.
  constexpr int64_t kPiece = CheckpointIo::kStagingBytes;
  const int64_t piece =
      by_blocks && block_bytes <= kPiece ? kPiece / block_bytes * block_bytes : kPiece;
  // A run with its pages to itself is read whole at once; then hashed piece by piece below.
  std::optional<int64_t> read_whole;
  if (whole_pages && space.is_host()) {
    absl::StatusOr<std::optional<int64_t>> got = file->ReadPages(dst, run.bytes(), run.offset());
    if (!got.ok()) return got.status();
    read_whole = *got;
  }
  for (int64_t done = 0; done < run.bytes();) {
    const int64_t n = std::min(piece, run.bytes() - done);
    char* into = dst + done;
    if (!space.is_host()) {
      into = staging.Get(n);
    }
    absl::StatusOr<int64_t> got = read_whole.has_value()
                                      ? std::clamp<int64_t>(*read_whole - done, 0, n)
                                      : file->Read(into, n, run.offset() + done);
    if (!got.ok()) return got.status();
    bytes_read += *got;
    if (*got < n) {
      return absl::DataLossError(absl::StrCat(
          where, ": the file ends at byte ", run.offset() + done + *got, ", inside bytes [",
          run.offset(), ", ", run.offset() + run.bytes(), ") of the entry's rows (truncated)"));
    }
    if (hasher.has_value()) hasher->Update(into, n);
    if (!space.is_host()) {
      if (absl::Status s = space.CopyFromHost(dst + done, into, n); !s.ok()) return s;
    } else if (sum.has_value()) {
      sum->Final(done, done + n);
    }
    done += n;
  }
  if (hasher.has_value()) hasher->Finish();
  if (space.is_host()) {
    *chunk_sum = blocks_are_chunk_blocks ? ChunkChecksumOfBlocks(hasher->blocks()) : sum->Finish();
  }
  if (by_blocks) {
    for (int k = 0; k < run.blocks_size(); ++k) {
      if (hasher->blocks()[k] != run.blocks(k)) {
        const int64_t a = run.offset() + k * run.block_bytes();
        return absl::DataLossError(absl::StrFormat(
            "%s: bytes [%d, %d) of the file have xxh64 %016x but the index says %016x "
            "(corrupted)",
            where, a, std::min(a + run.block_bytes(), run.offset() + run.bytes()),
            hasher->blocks()[k], run.blocks(k)));
      }
    }
  } else if (check_whole) {
    const uint64_t whole = hasher->blocks().empty() ? XXH64(nullptr, 0, 0) : hasher->blocks()[0];
    if (whole != run.xxh64()) {
      return absl::DataLossError(
          absl::StrFormat("%s: the entry has xxh64 %016x but the index says %016x (corrupted)",
                          where, whole, run.xxh64()));
    }
  }
  return absl::OkStatus();
}

}  // namespace

CheckpointIo::CheckpointIo(BufferStore* buffers, MemorySpace* space, std::string root)
    : buffers_(buffers),
      space_(space != nullptr ? space : &HostMemorySpace::Global()),
      root_(std::move(root)) {}

namespace {

// `path` (absolute) as the kernel resolves it: its longest existing prefix through realpath
// (every symbolic link, "." and ".." resolved in order, so "link/.." is the link target's
// parent), then the rest, which does not exist yet, appended. nullopt when that rest holds "."
// or "..", which only the file system could resolve.
std::optional<std::string> ResolvePath(const std::string& path) {
  std::string head = path;
  std::vector<std::string> tail;  // Innermost last.
  while (true) {
    char resolved[PATH_MAX];
    if (realpath(head.c_str(), resolved) != nullptr) {
      std::string out = resolved;
      for (auto it = tail.rbegin(); it != tail.rend(); ++it) {
        if (*it == "." || *it == "..") return std::nullopt;
        out = absl::StrCat(out == "/" ? "" : out, "/", *it);
      }
      return out;
    }
    while (head.size() > 1 && head.back() == '/') head.pop_back();
    if (head == "/") return std::nullopt;  // Unreachable: "/" exists.
    const size_t slash = head.rfind('/');
    if (slash + 1 < head.size()) tail.push_back(head.substr(slash + 1));
    head = slash == 0 ? "/" : head.substr(0, slash);
  }
}

bool IsUnder(const std::string& path, const std::string& root) {
  return root == "/" || path == root || absl::StartsWith(path, absl::StrCat(root, "/"));
}

}  // namespace

absl::StatusOr<std::string> CheckpointIo::CanonicalRoot(const std::string& root) {
  if (root.empty()) return root;
  if (absl::Status s = CheckAbsolute("--checkpoint-root", root); !s.ok()) return s;
  char resolved[PATH_MAX];
  struct stat st;
  if (realpath(root.c_str(), resolved) == nullptr || stat(resolved, &st) != 0 ||
      !S_ISDIR(st.st_mode)) {
    return absl::InvalidArgumentError(
        absl::StrCat("--checkpoint-root: '", root, "' is not an existing directory"));
  }
  return std::string(resolved);
}

absl::Status CheckpointIo::CheckPath(absl::string_view field, const std::string& path) const {
  if (absl::Status s = CheckAbsolute(field, path); !s.ok()) return s;
  if (root_.empty()) return absl::OkStatus();
  const std::optional<std::string> resolved = ResolvePath(path);
  if (!resolved.has_value() || !IsUnder(*resolved, root_)) {
    return absl::PermissionDeniedError(absl::StrCat(
        field, ": '", path, "' is outside the worker's --checkpoint-root '", root_, "'"));
  }
  return absl::OkStatus();
}

absl::StatusOr<v1::WriteCheckpointResponse> CheckpointIo::Write(
    const v1::WriteCheckpointRequest& request) {
  const absl::Time start = absl::Now();
  if (absl::Status s = CheckPath("dir", request.dir()); !s.ok()) return s;
  if (absl::Status s = CheckCheckpointFileName("file", request.file()); !s.ok()) return s;
  std::vector<SafetensorsEntrySpec> specs;
  std::vector<PlannedEntry> planned;
  for (int i = 0; i < request.entries_size(); ++i) {
    const v1::CheckpointWriteEntry& e = request.entries(i);
    const std::string field = absl::StrCat("entries[", i, "]");
    absl::StatusOr<std::shared_ptr<HostBuffer>> buffer = buffers_->Get(e.tensor(), e.version());
    if (!buffer.ok()) {
      return absl::Status(buffer.status().code(),
                          absl::StrCat(field, ": ", buffer.status().message()));
    }
    absl::StatusOr<Box> box = BoxFromProto(e.box(), absl::StrCat(field, ".box"));
    if (!box.ok()) return box.status();
    PlannedEntry p;
    p.buffer = *std::move(buffer);
    p.chunk = FindContainingChunk(p.buffer->chunks(), *box, false, 0);
    if (p.chunk < 0) {
      return absl::InvalidArgumentError(absl::StrCat(field, ".box: ", box->ToString(),
                                                     " lies in no chunk of tensor '", e.tensor(),
                                                     "' version ", e.version(), " here"));
    }
    p.box = *std::move(box);
    p.bytes = p.box.Volume() * p.buffer->element_size();
    const int64_t row_bytes = BoxRowElements(p.box) * p.buffer->element_size();
    p.rows_per_block = RowsPerBlock(row_bytes);
    p.block_bytes = std::max<int64_t>(1, p.rows_per_block * row_bytes);
    specs.push_back({e.entry(), p.buffer->dtype(), p.box.shape()});
    planned.push_back(std::move(p));
  }
  absl::StatusOr<std::string> header = BuildSafetensorsHeader(specs, {{"format", "pt"}});
  if (!header.ok()) return header.status();

  const std::string path = Join(request.dir(), request.file());
  Fd fd(open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644));
  if (!fd.ok()) return IoError(errno, "creating", path);
  bool keep = false;
  absl::Cleanup unlink_on_error = [&] {
    if (!keep) unlink(path.c_str());
  };
  if (absl::Status s =
          WriteAll(fd.get(), header->data(), static_cast<int64_t>(header->size()), path);
      !s.ok()) {
    return s;
  }
  v1::WriteCheckpointResponse response;
  StagingBuffer staging;
  for (size_t i = 0; i < planned.size(); ++i) {
    PlannedEntry& p = planned[i];
    HostBuffer& b = *p.buffer;
    const int64_t esize = b.element_size();
    const Chunk& chunk = b.chunks().chunks[p.chunk];
    EntryHasher hasher(p.block_bytes);
    const int64_t off = ContiguousOffset(chunk.box, p.box);
    MemorySpace& space = b.space();
    if (space.is_host() && off >= 0) {
      // The common case: straight from the buffer to the file.
      const char* src = b.chunk_data(p.chunk) + off * esize;
      hasher.Update(src, p.bytes);
      if (absl::Status s = WriteAll(fd.get(), src, p.bytes, path); !s.ok()) return s;
    } else {
      // Packed (a box that is not one run) or staged (a device) in pieces of whole rows.
      const int64_t row_bytes = BoxRowElements(p.box) * esize;
      const int64_t rows = BoxRows(p.box);
      const int64_t rows_per_piece =
          std::max<int64_t>(1, kStagingBytes / std::max<int64_t>(1, row_bytes));
      for (int64_t r = 0; r < rows; r += rows_per_piece) {
        const int64_t n = std::min(rows_per_piece, rows - r);
        Box piece = p.box;
        if (piece.ndim() > 0) {
          Shape o = piece.offset(), s = piece.shape();
          o[0] += r;
          s[0] = n;
          piece = Box(std::move(o), std::move(s));
        }
        const int64_t bytes = piece.Volume() * esize;
        char* const host = staging.Get(bytes);
        if (space.is_host()) {
          if (absl::Status s = space.PackBox(piece, b.chunk_data(p.chunk), chunk.box, host, esize);
              !s.ok()) {
            return s;
          }
        } else {
          const int64_t poff = ContiguousOffset(chunk.box, piece);
          if (poff >= 0) {
            if (absl::Status s =
                    space.CopyToHost(host, b.chunk_data(p.chunk) + poff * esize, bytes);
                !s.ok()) {
              return s;
            }
          } else {
            absl::StatusOr<Allocation> a = space.Allocate(bytes);
            if (!a.ok()) return a.status();
            absl::Cleanup free_a = [&] { space.Free(*a); };
            if (absl::Status s =
                    space.PackBox(piece, b.chunk_data(p.chunk), chunk.box, a->data, esize);
                !s.ok()) {
              return s;
            }
            if (absl::Status s = space.CopyToHost(host, a->data, bytes); !s.ok()) return s;
          }
        }
        hasher.Update(host, bytes);
        if (absl::Status s = WriteAll(fd.get(), host, bytes, path); !s.ok()) return s;
      }
    }
    hasher.Finish();
    v1::CheckpointEntrySums* out = response.add_entries();
    out->set_entry(request.entries(static_cast<int>(i)).entry());
    out->set_xxh64(hasher.whole());
    out->set_rows_per_block(p.rows_per_block);
    for (uint64_t h : hasher.blocks()) out->add_blocks(h);
    out->set_bytes(p.bytes);
  }
  if (fsync(fd.get()) != 0) return IoError(errno, "fsync of", path);
  struct stat st;
  if (fstat(fd.get(), &st) != 0) return IoError(errno, "stat of", path);
  keep = true;
  response.set_file_bytes(st.st_size);
  response.set_seconds(absl::ToDoubleSeconds(absl::Now() - start));
  return response;
}

namespace {

// A dequantizing buffer of a read (issue 28): its f8_e4m3 values and f32 scales are read into
// host buffers, then dequantized into the buffer stored.
struct Dequantizing {
  size_t buffer = 0;  // Index into the request's buffers.
  BlockSize block;
  DType dtype = DType::kBF16;  // Of the buffer stored.
  RankChunks chunks;
  std::shared_ptr<HostBuffer> values;  // f8_e4m3, `chunks`.
  std::shared_ptr<HostBuffer> scales;  // f32, chunk i holds the scales of the values' chunk i,
  std::vector<int64_t> scale_offsets;  // from this element on.
};

// Checks a buffer's dequantize field against its chunks: every chunk starts on a block
// boundary of the last two dims (so its blocks are the tensor's), and its scale box holds the
// f32 scales of its blocks as a contiguous range (the box's full extent in all dims but the
// first: a reader may read more scale rows, whole checksum blocks). Creates the scales' host
// buffer (`values` is left empty).
absl::StatusOr<Dequantizing> CheckDequantize(const v1::CheckpointReadBuffer& rb, DType dtype,
                                             const RankChunks& chunks, const std::string& bf) {
  const v1::CheckpointDequantize& dq = rb.dequantize();
  const std::string field = absl::StrCat(bf, ".dequantize");
  Dequantizing out;
  absl::StatusOr<BlockSize> block =
      ParseBlockQuantization(dq.block().empty() ? "block:128x128" : dq.block());
  if (!block.ok()) return field_status::Prefixed(absl::StrCat(field, ".block: "), block.status());
  out.block = *block;
  out.dtype = dtype;
  out.chunks = chunks;
  if (!IsFloat(dtype) || dtype == DType::kF8E8M0) {
    return absl::InvalidArgumentError(
        absl::StrCat(bf, ".dtype: ", DTypeName(dtype), " is not a dtype to dequantize into"));
  }
  const int n = static_cast<int>(chunks.chunks.size());
  if (dq.scale_boxes_size() != n || dq.scale_runs_size() != n) {
    return absl::InvalidArgumentError(absl::StrCat(field, ": ", dq.scale_boxes_size(),
                                                   " scale boxes and ", dq.scale_runs_size(),
                                                   " scale runs for ", n, " chunks"));
  }
  RankChunks scales;
  scales.rank = chunks.rank;
  for (int i = 0; i < n; ++i) {
    const Box& box = chunks.chunks[static_cast<size_t>(i)].box;
    const std::string where = absl::StrCat(field, ".scale_boxes[", i, "]");
    absl::StatusOr<Box> scale_box = BlockScaleBox(box, out.block);
    if (!scale_box.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat(bf, ".chunks[", i, "]: ", scale_box.status().message()));
    }
    const Box& want = *scale_box;
    absl::StatusOr<Box> got = BoxFromProto(dq.scale_boxes(i), where);
    if (!got.ok()) return got.status();
    bool rows = got->Contains(want);
    for (size_t d = 1; rows && d < want.ndim(); ++d) {
      rows = want.offset(d) == got->offset(d) && want.shape(d) == got->shape(d);
    }
    if (!rows) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, ": ", got->ToString(), " does not hold chunk ", box.ToString(),
                       "'s block scales ", want.ToString(), " as whole rows"));
    }
    out.scale_offsets.push_back((want.offset(0) - got->offset(0)) * BoxRowElements(*got));
    const v1::CheckpointReadRun& run = dq.scale_runs(i);
    const std::string rf = absl::StrCat(field, ".scale_runs[", i, "]");
    if (absl::Status s = CheckCheckpointFileName(absl::StrCat(rf, ".file"), run.file()); !s.ok()) {
      return s;
    }
    const int64_t bytes = got->Volume() * int64_t{4};
    if (run.bytes() != bytes || run.offset() < 0) {
      return absl::InvalidArgumentError(absl::StrCat(rf, ": ", run.bytes(), " bytes at offset ",
                                                     run.offset(), " for ", bytes,
                                                     " bytes of scales"));
    }
    if (run.blocks_size() > 0 &&
        (run.block_bytes() <= 0 ||
         run.blocks_size() != (run.bytes() + run.block_bytes() - 1) / run.block_bytes())) {
      return absl::InvalidArgumentError(absl::StrCat(rf, ": ", run.blocks_size(),
                                                     " block checksums for ", run.bytes(),
                                                     " bytes in blocks of ", run.block_bytes()));
    }
    const int64_t at = scales.local_elements;
    scales.local_elements += got->Volume();
    scales.chunks.push_back(Chunk{*std::move(got), at, 0});
  }
  absl::StatusOr<std::shared_ptr<HostBuffer>> buffer =
      HostBuffer::Create(DType::kF32, std::move(scales), nullptr);
  if (!buffer.ok()) return buffer.status();
  out.scales = *std::move(buffer);
  return out;
}

// The stored buffer of a dequantizing one: every chunk dequantized (sharding/block_quant.h)
// into `space` (through host memory when it is a device's).
absl::StatusOr<std::shared_ptr<HostBuffer>> Dequantize(const Dequantizing& dq,
                                                       const std::string& tensor,
                                                       MemorySpace* space) {
  absl::StatusOr<std::shared_ptr<HostBuffer>> out = HostBuffer::Create(dq.dtype, dq.chunks, space);
  if (!out.ok()) return out.status();
  HostBuffer& b = **out;
  std::vector<char> host;
  for (size_t i = 0; i < dq.chunks.chunks.size(); ++i) {
    const Box& box = dq.chunks.chunks[i].box;
    if (box.Volume() == 0) continue;
    char* dst = b.chunk_data(i);
    if (!b.space().is_host()) {
      host.resize(static_cast<size_t>(b.chunk_bytes(i)));
      dst = host.data();
    }
    if (absl::Status s = DequantizeBlocks(
            dq.values->chunk_data(i),
            reinterpret_cast<const float*>(dq.scales->chunk_data(i)) + dq.scale_offsets[i],
            box.shape(), dq.block, dst, dq.dtype);
        !s.ok()) {
      return field_status::Prefixed(
          absl::StrCat("dequantizing tensor '", tensor, "' chunk ", box.ToString(), ": "), s);
    }
    if (!b.space().is_host()) {
      if (absl::Status s = b.space().CopyFromHost(b.chunk_data(i), host.data(), b.chunk_bytes(i));
          !s.ok()) {
        return s;
      }
    }
  }
  return out;
}

}  // namespace

absl::StatusOr<v1::ReadCheckpointResponse> CheckpointIo::Read(
    const v1::ReadCheckpointRequest& request) {
  const absl::Time start = absl::Now();
  if (absl::Status s = CheckPath("dir", request.dir()); !s.ok()) return s;
  struct Run {
    HostBuffer* buffer;
    size_t chunk;
    const v1::CheckpointReadRun* run;
    bool whole_pages;  // Its partial first and last pages hold no other chunk's bytes.
  };
  std::vector<std::shared_ptr<HostBuffer>> buffers;
  std::vector<Run> runs;
  std::vector<Dequantizing> dequantizing;
  absl::flat_hash_set<std::pair<std::string, int64_t>> names;
  for (int j = 0; j < request.buffers_size(); ++j) {
    const v1::CheckpointReadBuffer& rb = request.buffers(j);
    const std::string bf = absl::StrCat("buffers[", j, "]");
    if (rb.tensor().empty()) return absl::InvalidArgumentError(absl::StrCat(bf, ".tensor: empty"));
    if (!names.insert({rb.tensor(), rb.version()}).second ||
        buffers_->Find(rb.tensor(), rb.version()) != nullptr) {
      return absl::AlreadyExistsError(absl::StrCat(bf, ": tensor '", rb.tensor(), "' version ",
                                                   rb.version(), " exists already"));
    }
    absl::StatusOr<DType> dtype = DTypeFromProto(rb.dtype(), absl::StrCat(bf, ".dtype"));
    if (!dtype.ok()) return dtype.status();
    absl::StatusOr<RankChunks> chunks =
        RankChunksFromProto(rb.chunks(), absl::StrCat(bf, ".chunks"));
    if (!chunks.ok()) return chunks.status();
    if (rb.runs_size() != static_cast<int>(chunks->chunks.size())) {
      return absl::InvalidArgumentError(absl::StrCat(bf, ".runs: ", rb.runs_size(), " runs for ",
                                                     chunks->chunks.size(), " chunks"));
    }
    // A dequantizing buffer's runs hold f8_e4m3 values (read into host memory with its
    // scales, then dequantized into a buffer of `dtype`).
    std::optional<Dequantizing> dq;
    if (rb.has_dequantize()) {
      absl::StatusOr<Dequantizing> made = CheckDequantize(rb, *dtype, *chunks, bf);
      if (!made.ok()) return made.status();
      dq = *std::move(made);
    }
    const int64_t esize = dq.has_value() ? ElementSize(DType::kF8E4M3) : ElementSize(*dtype);
    for (int i = 0; i < rb.runs_size(); ++i) {
      const v1::CheckpointReadRun& run = rb.runs(i);
      const std::string field = absl::StrCat(bf, ".runs[", i, "]");
      if (absl::Status s = CheckCheckpointFileName(absl::StrCat(field, ".file"), run.file());
          !s.ok()) {
        return s;
      }
      if (run.bytes() != chunks->chunks[i].box.Volume() * esize || run.offset() < 0) {
        return absl::InvalidArgumentError(
            absl::StrCat(field, ": ", run.bytes(), " bytes at offset ", run.offset(),
                         " for a chunk of ", chunks->chunks[i].box.Volume() * esize, " bytes"));
      }
      if (run.blocks_size() > 0 &&
          (run.block_bytes() <= 0 ||
           run.blocks_size() != (run.bytes() + run.block_bytes() - 1) / run.block_bytes())) {
        return absl::InvalidArgumentError(absl::StrCat(field, ": ", run.blocks_size(),
                                                       " block checksums for ", run.bytes(),
                                                       " bytes in blocks of ", run.block_bytes()));
      }
    }
    absl::StatusOr<std::shared_ptr<HostBuffer>> buffer =
        dq.has_value() ? HostBuffer::Create(DType::kF8E4M3, *chunks, nullptr)
                       : HostBuffer::Create(*dtype, *std::move(chunks), space_);
    if (!buffer.ok()) return buffer.status();
    const std::vector<bool> whole_pages = ChunksWithPagesToThemselves(**buffer);
    for (int i = 0; i < rb.runs_size(); ++i) {
      runs.push_back(Run{buffer->get(), static_cast<size_t>(i), &rb.runs(i), whole_pages[i]});
    }
    if (dq.has_value()) {
      dq->buffer = static_cast<size_t>(j);
      dq->values = *buffer;
      const std::vector<bool> scale_pages = ChunksWithPagesToThemselves(*dq->scales);
      for (int i = 0; i < rb.dequantize().scale_runs_size(); ++i) {
        runs.push_back(Run{dq->scales.get(), static_cast<size_t>(i), &rb.dequantize().scale_runs(i),
                           scale_pages[i]});
      }
      dequantizing.push_back(*std::move(dq));
    }
    buffers.push_back(*std::move(buffer));
  }
  // The files may be links: where they lead must be under the root too.
  if (!root_.empty()) {
    absl::flat_hash_set<std::string> files;
    for (const Run& r : runs) files.insert(r.run->file());
    for (const std::string& file : files) {
      if (absl::Status s = CheckPath("file", Join(request.dir(), file)); !s.ok()) return s;
    }
  }
  // In file order, so each file is read front to back.
  std::sort(runs.begin(), runs.end(), [](const Run& a, const Run& b) {
    if (a.run->file() != b.run->file()) return a.run->file() < b.run->file();
    return a.run->offset() < b.run->offset();
  });
  // Runs are read by up to kReadThreads threads at once (each run on one thread, its bytes
  // in order): a reader's runs are many and often small, and each O_DIRECT read waits for the
  // device, so several in flight keep it busy. Device memory: one thread (its copies are
  // queued in order).
  bool all_host = true;
  for (const std::shared_ptr<HostBuffer>& b : buffers) all_host = all_host && b->space().is_host();
  const size_t threads =
      all_host ? std::min(kReadThreads, runs.size()) : std::min<size_t>(1, runs.size());
  std::vector<absl::Status> results(runs.size());
  std::vector<uint64_t> sums(runs.size(), 0);
  std::vector<RunReader> readers(threads);
  std::atomic<size_t> next{0};
  std::atomic<bool> failed{false};
  auto work = [&](size_t t) {
    for (size_t i = next++; i < runs.size() && !failed.load(); i = next++) {
      const Run& r = runs[i];
      results[i] = ReadOneRun(request.dir(), *r.run, *r.buffer, r.chunk, r.whole_pages, readers[t],
                              &sums[i]);
      if (!results[i].ok()) failed.store(true);
    }
  };
  {
    std::vector<std::thread> pool;
    for (size_t t = 1; t < threads; ++t) pool.emplace_back(work, t);
    if (threads > 0) work(0);
    for (std::thread& t : pool) t.join();
  }
  // The first failure in file order (runs not read after a failure stay OK and unused).
  for (const absl::Status& s : results) {
    if (!s.ok()) return s;
  }
  int64_t bytes_read = 0, bytes_direct = 0;
  for (const RunReader& reader : readers) {
    bytes_read += reader.bytes_read;
    for (const auto& [name, file] : reader.files) bytes_direct += file->direct_bytes();
  }
  // Dequantizing buffers: the values and scales read (and checked), each chunk dequantized
  // into the stored buffer of the asked dtype (its checksums are computed below).
  for (Dequantizing& dq : dequantizing) {
    absl::StatusOr<std::shared_ptr<HostBuffer>> out =
        Dequantize(dq, request.buffers(static_cast<int>(dq.buffer)).tensor(), space_);
    if (!out.ok()) return out.status();
    buffers[dq.buffer] = *std::move(out);
  }
  // Host buffers: each chunk's checksum was built as its bytes arrived (while they were in
  // cache), instead of in a pass over every buffer at the end.
  std::map<const HostBuffer*, std::vector<uint64_t>> chunk_sums;
  for (size_t i = 0; i < runs.size(); ++i) {
    const Run& r = runs[i];
    if (!r.buffer->space().is_host()) continue;
    std::vector<uint64_t>& v = chunk_sums[r.buffer];
    v.resize(r.buffer->chunks().chunks.size());
    v[r.chunk] = sums[i];
  }
  v1::ReadCheckpointResponse response;
  for (const std::shared_ptr<HostBuffer>& b : buffers) {
    auto built = chunk_sums.find(b.get());
    if (built != chunk_sums.end()) {
      *response.add_chunks() = RankChunksToProto(b->chunks(), built->second);
      continue;
    }
    absl::StatusOr<std::vector<uint64_t>> sums = b->Checksums();
    if (!sums.ok()) return sums.status();
    *response.add_chunks() = RankChunksToProto(b->chunks(), *sums);
  }
  // Stored only once everything was read and checked.
  for (int j = 0; j < request.buffers_size(); ++j) {
    const v1::CheckpointReadBuffer& rb = request.buffers(j);
    if (absl::Status s = buffers_->Insert(rb.tensor(), rb.version(), buffers[j]); !s.ok()) {
      for (int k = 0; k < j; ++k) {
        buffers_->Drop(request.buffers(k).tensor(), request.buffers(k).version());
      }
      return s;
    }
  }
  response.set_bytes_read(bytes_read);
  response.set_bytes_read_direct(bytes_direct);
  response.set_seconds(absl::ToDoubleSeconds(absl::Now() - start));
  return response;
}

namespace {

// The JSON header of a safetensors file, and the file's size.
absl::Status ReadHeader(const std::string& path, v1::CheckpointFileHeader* out) {
  Fd fd(open(path.c_str(), O_RDONLY | O_CLOEXEC));
  if (!fd.ok()) return IoError(errno, "opening", path);
  struct stat st;
  if (fstat(fd.get(), &st) != 0) return IoError(errno, "stat of", path);
  out->set_file_bytes(st.st_size);
  char first8[8];
  absl::StatusOr<int64_t> got = PreadFull(fd.get(), first8, 8, 0, path);
  if (!got.ok()) return got.status();
  absl::StatusOr<int64_t> n = ParseSafetensorsPrefix(absl::string_view(first8, *got));
  if (!n.ok()) return absl::DataLossError(absl::StrCat(path, ": ", n.status().message()));
  if (*n > st.st_size - 8) {
    return absl::DataLossError(absl::StrCat(path, ": header length ", *n, " but the file has ",
                                            st.st_size, " bytes (truncated)"));
  }
  std::string json(static_cast<size_t>(*n), '\0');
  got = PreadFull(fd.get(), json.data(), *n, 8, path);
  if (!got.ok()) return got.status();
  if (*got != *n) return absl::DataLossError(absl::StrCat(path, ": truncated header"));
  out->set_json(std::move(json));
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<v1::ReadCheckpointIndexResponse> CheckpointIo::ReadIndex(
    const v1::ReadCheckpointIndexRequest& request) {
  if (absl::Status s = CheckPath("dir", request.path()); !s.ok()) return s;
  struct stat st;
  if (stat(request.path().c_str(), &st) != 0) return IoError(errno, "stat of", request.path());
  v1::ReadCheckpointIndexResponse response;
  if (S_ISREG(st.st_mode)) {
    std::string path = request.path();
    const std::string dir = ParentOf(path);
    const std::string name = path.substr(path.rfind('/') + 1);
    if (absl::Status s = CheckCheckpointFileName("dir", name); !s.ok()) return s;
    response.set_dir(dir);
    v1::CheckpointFileHeader* h = response.add_files();
    h->set_file(name);
    if (absl::Status s = ReadHeader(path, h); !s.ok()) return s;
    return response;
  }
  if (!S_ISDIR(st.st_mode)) {
    return absl::InvalidArgumentError(
        absl::StrCat("dir: ", request.path(), " is neither a directory nor a file"));
  }
  response.set_dir(request.path());
  const std::string index_path = Join(request.path(), kCheckpointIndexFile);
  // A file of the directory may be a link (a Hugging Face cache's are): where it leads must
  // be under the root too.
  if (absl::Status s = CheckPath("dir", index_path); !s.ok()) return s;
  Fd index(open(index_path.c_str(), O_RDONLY | O_CLOEXEC));
  if (index.ok()) {
    struct stat ist;
    if (fstat(index.get(), &ist) != 0) return IoError(errno, "stat of", index_path);
    if (ist.st_size > kMaxIndexBytes) {
      return absl::InvalidArgumentError(absl::StrCat(
          index_path, ": ", ist.st_size, " bytes, more than the limit of ", kMaxIndexBytes));
    }
    std::string text(static_cast<size_t>(ist.st_size), '\0');
    absl::StatusOr<int64_t> got = PreadFull(index.get(), text.data(), ist.st_size, 0, index_path);
    if (!got.ok()) return got.status();
    text.resize(static_cast<size_t>(*got));
    response.set_index_json(std::move(text));
  } else if (errno != ENOENT) {
    return IoError(errno, "opening", index_path);
  }
  std::vector<std::string> names;
  std::unique_ptr<DIR, int (*)(DIR*)> d(opendir(request.path().c_str()), &closedir);
  if (d == nullptr) return IoError(errno, "listing", request.path());
  while (struct dirent* e = readdir(d.get())) {
    const std::string name = e->d_name;
    if (CheckCheckpointFileName("", name).ok()) names.push_back(name);
  }
  std::sort(names.begin(), names.end());
  for (const std::string& name : names) {
    v1::CheckpointFileHeader* h = response.add_files();
    h->set_file(name);
    const std::string path = Join(request.path(), name);
    if (absl::Status s = CheckPath("dir", path); !s.ok()) return s;
    if (absl::Status s = ReadHeader(path, h); !s.ok()) return s;
  }
  if (response.index_json().empty() && names.empty()) {
    return absl::NotFoundError(
        absl::StrCat("dir: ", request.path(), " holds neither index.json nor .safetensors files"));
  }
  return response;
}

absl::Status CheckpointIo::Dir(const v1::CheckpointDirRequest& request) {
  if (absl::Status s = CheckPath("dir", request.dir()); !s.ok()) return s;
  if (absl::Status s = CheckPath("tmp", request.tmp()); !s.ok()) return s;
  if (ParentOf(request.tmp()) != ParentOf(request.dir())) {
    return absl::InvalidArgumentError("tmp: must be next to dir");
  }
  const std::string& dir = request.dir();
  const std::string& tmp = request.tmp();
  auto exists = [](const std::string& p) {
    struct stat st;
    return lstat(p.c_str(), &st) == 0;
  };
  switch (request.action()) {
    case v1::CHECKPOINT_DIR_PREPARE: {
      if (exists(dir) && !request.overwrite()) {
        return absl::AlreadyExistsError(absl::StrCat(
            "dir: ", dir, " exists (overwrite replaces it once the new one is complete)"));
      }
      struct stat st;
      const std::string parent = ParentOf(dir);
      if (stat(parent.c_str(), &st) != 0 || !S_ISDIR(st.st_mode)) {
        return absl::FailedPreconditionError(
            absl::StrCat("dir: the parent directory ", parent, " does not exist"));
      }
      if (mkdir(tmp.c_str(), 0755) != 0) return IoError(errno, "creating", tmp);
      return absl::OkStatus();
    }
    case v1::CHECKPOINT_DIR_COMMIT: {
      const std::string index = Join(tmp, kCheckpointIndexFile);
      {
        Fd fd(open(index.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644));
        if (!fd.ok()) return IoError(errno, "creating", index);
        if (absl::Status s = WriteAll(fd.get(), request.index_json().data(),
                                      static_cast<int64_t>(request.index_json().size()), index);
            !s.ok()) {
          return s;
        }
        if (fsync(fd.get()) != 0) return IoError(errno, "fsync of", index);
      }
      // The files' own fsyncs made their data durable; this makes their names durable.
      if (absl::Status s = SyncDir(tmp); !s.ok()) return s;
      if (rename(tmp.c_str(), dir.c_str()) != 0) {
        if (errno != EEXIST && errno != ENOTEMPTY && errno != EISDIR && errno != ENOTDIR) {
          return IoError(errno, "renaming to", dir);
        }
        if (!request.overwrite()) {
          return absl::AlreadyExistsError(absl::StrCat("dir: ", dir, " exists"));
        }
        // Swap the complete new checkpoint with the old one in one step, then remove the old.
        if (renameat2(AT_FDCWD, tmp.c_str(), AT_FDCWD, dir.c_str(), RENAME_EXCHANGE) != 0) {
          if (errno != EINVAL && errno != ENOSYS) return IoError(errno, "swapping with", dir);
          // No RENAME_EXCHANGE here (some network file systems): move the old one aside first.
          const std::string old = absl::StrCat(tmp, ".old");
          if (rename(dir.c_str(), old.c_str()) != 0) return IoError(errno, "moving aside", dir);
          if (rename(tmp.c_str(), dir.c_str()) != 0) {
            const int e = errno;
            rename(old.c_str(), dir.c_str());
            return IoError(e, "renaming to", dir);
          }
          std::error_code ec;
          std::filesystem::remove_all(old, ec);
        } else {
          std::error_code ec;
          std::filesystem::remove_all(tmp, ec);  // Now the old checkpoint.
        }
      }
      return SyncDir(ParentOf(dir));
    }
    case v1::CHECKPOINT_DIR_ABORT: {
      std::error_code ec;
      std::filesystem::remove_all(tmp, ec);
      if (ec) return absl::UnavailableError(absl::StrCat("removing ", tmp, ": ", ec.message()));
      return absl::OkStatus();
    }
    default:
      return absl::InvalidArgumentError(absl::StrCat("action: unknown value ", request.action()));
  }
}

}  // namespace shardcoord
