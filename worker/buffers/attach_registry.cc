#include "worker/buffers/attach_registry.h"

#include <fcntl.h>
#include <linux/magic.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/vfs.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <iterator>
#include <map>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "proto/convert.h"
#include "sharding/limits.h"
#include "worker/comm/gloo/same_host.h"
#include "worker/memory/process_memory_space.h"

namespace shardcoord {
namespace {

// Tries of a detach report while the coordinator is unavailable.
constexpr int kDetachReportAttempts = 3;

// Closes a descriptor on every path.
class UniqueFd {
 public:
  explicit UniqueFd(int fd) : fd_(fd) {}
  ~UniqueFd() {
    if (fd_ >= 0) close(fd_);
  }
  UniqueFd(const UniqueFd&) = delete;
  UniqueFd& operator=(const UniqueFd&) = delete;
  int get() const { return fd_; }

 private:
  int fd_;
};

std::string Bytes(int64_t bytes) {
  if (bytes < (1 << 10)) return absl::StrCat(bytes, " B");
  if (bytes < (1 << 20)) return absl::StrFormat("%.1f KiB", bytes / 1024.0);
  return absl::StrFormat("%.1f MiB", bytes / 1048576.0);
}

// A memfd (or other sealed file) mapped shared: unmapped when the last buffer goes.
class SharedMapping final : public LentMemory {
 public:
  SharedMapping(void* base, size_t length, int64_t pid) : base_(base), length_(length), pid_(pid) {}
  ~SharedMapping() override { munmap(base_, length_); }
  std::string Describe() const override { return absl::StrCat("shared memory of process ", pid_); }

 private:
  void* const base_;
  const size_t length_;
  const int64_t pid_;
};

// Plain memory of a process, reached through its ProcessMemorySpace.
class ProcessMemory final : public LentMemory {
 public:
  explicit ProcessMemory(int64_t pid) : space_(pid) {}
  ProcessMemorySpace* space() { return &space_; }
  std::string Describe() const override { return absl::StrCat("memory of process ", space_.pid()); }

 private:
  ProcessMemorySpace space_;
};

// An allocation of a space held for a process: one it shared through the worker's space (a
// CUDA IPC handle), closed with CloseShared; or, for a buffer of no bytes (a rank whose chunks
// are empty), a 0-byte allocation of the space, freed, that stands for it so no operation
// meets a pointer the space does not know.
class SpaceAllocation final : public LentMemory {
 public:
  enum class Kind { kShared, kEmpty };

  SpaceAllocation(Kind kind, MemorySpace* space, Allocation allocation, int64_t pid)
      : kind_(kind), space_(space), allocation_(allocation), pid_(pid) {}
  ~SpaceAllocation() override {
    if (kind_ == Kind::kShared) {
      space_->CloseShared(allocation_);
    } else {
      space_->Free(allocation_);
    }
  }
  std::string Describe() const override {
    if (kind_ == Kind::kShared) return absl::StrCat(space_->name(), " memory of process ", pid_);
    return absl::StrCat("0 bytes of process ", pid_);
  }

 private:
  const Kind kind_;
  MemorySpace* const space_;
  const Allocation allocation_;
  const int64_t pid_;
};

// Closes descriptors on every path.
struct FdCloser {
  explicit FdCloser(std::vector<int> owned) : fds(std::move(owned)) {}
  ~FdCloser() {
    for (int fd : fds) {
      if (fd >= 0) close(fd);
    }
  }
  FdCloser(const FdCloser&) = delete;
  FdCloser& operator=(const FdCloser&) = delete;
  const std::vector<int> fds;
};

// The coordinator names a refused member "buffers[i]"; the process sent it as attachments[i].
absl::Status AsAttachments(const absl::Status& s) {
  constexpr absl::string_view kTheirs = "buffers[";
  if (!absl::StartsWith(s.message(), kTheirs)) return s;
  return absl::Status(s.code(), absl::StrCat("attachments[", s.message().substr(kTheirs.size())));
}

// "GPU-1A2B..." and "1a2b-..." name the same device: hex digits only, lower case.
std::string NormalizedUuid(absl::string_view uuid) {
  if (absl::StartsWith(uuid, "GPU-")) uuid.remove_prefix(4);
  std::string out;
  for (char ch : uuid) {
    if (absl::ascii_isxdigit(static_cast<unsigned char>(ch))) {
      out.push_back(absl::ascii_tolower(static_cast<unsigned char>(ch)));
    }
  }
  return out;
}

}  // namespace

AttachRegistry::AttachRegistry(BufferStore* buffers, MemorySpace* space, AttachRpc* rpc,
                               std::function<WorkerIdentity()> identity,
                               std::function<void(absl::string_view)> log)
    : buffers_(buffers),
      space_(space != nullptr ? space : &HostMemorySpace::Global()),
      rpc_(rpc),
      identity_(std::move(identity)),
      log_(std::move(log)) {}

AttachRegistry::~AttachRegistry() = default;

int64_t AttachRegistry::OpenSession(const PeerCredentials& peer) {
  absl::MutexLock lock(&mu_);
  const int64_t id = next_session_++;
  sessions_[id].peer = peer;
  return id;
}

absl::StatusOr<AttachRegistry::Opened> AttachRegistry::Open(const v1::LocalAttachRequest& request,
                                                            int64_t bytes, int64_t element_size,
                                                            const PeerCredentials& peer, int fd) {
  Opened out;
  switch (request.memory_case()) {
    case v1::LocalAttachRequest::kShared: {
      out.kind = "shared";
      const int64_t offset = request.shared().offset();
      if (fd < 0) {
        return absl::InvalidArgumentError(
            "shared: no file descriptor came with the request (SCM_RIGHTS)");
      }
      if (offset < 0 || offset % element_size != 0) {
        return absl::InvalidArgumentError(
            absl::StrCat("shared.offset: ", offset,
                         " must be >= 0 and a multiple of the element size ", element_size));
      }
      struct stat st;
      if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        return absl::InvalidArgumentError(
            "shared: the descriptor is not a memory file (memfd_create or /dev/shm)");
      }
      if (st.st_size < offset + bytes) {
        return absl::InvalidArgumentError(absl::StrCat("shared: the memory file has ", st.st_size,
                                                       " bytes, fewer than offset ", offset, " + ",
                                                       bytes, " bytes of the buffer"));
      }
      // A file that shrinks under a mapping kills the process reading past its end (SIGBUS):
      // only files that cannot shrink are mapped.
      int seals = fcntl(fd, F_GET_SEALS);
      if (seals < 0 || !(seals & F_SEAL_SHRINK)) {
        if (fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK) != 0) {
          return absl::InvalidArgumentError(
              "shared: the memory file can shrink; create it with memfd_create(..., "
              "MFD_ALLOW_SEALING) so it can be sealed with F_SEAL_SHRINK");
        }
      }
      if (bytes == 0) break;
      // A hugetlbfs file (memfd_create with MFD_HUGETLB, where the host reserved huge pages)
      // maps only in whole huge pages: its st_blksize.
      int64_t page = sysconf(_SC_PAGESIZE);
      struct statfs fs;
      const bool hugetlb = fstatfs(fd, &fs) == 0 && fs.f_type == HUGETLBFS_MAGIC;
      if (hugetlb && st.st_blksize > page) page = st.st_blksize;
      const int64_t start = offset / page * page;
      int64_t end = offset + bytes;
      if (hugetlb) end = std::min<int64_t>((end + page - 1) / page * page, st.st_size);
      const size_t length = static_cast<size_t>(end - start);
      // Populated now, so the first plan pays no page faults; huge pages where the host
      // allows them for shared memory (shmem_enabled advise): process_vm_writev into 4 KiB
      // shmem pages ran at a third of the speed into huge pages on the project's machine
      // (hugetlbfs files have them already; the advice is then refused, harmlessly).
      void* base =
          mmap(nullptr, length, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, fd, start);
      if (base == MAP_FAILED) {
        return absl::InvalidArgumentError(
            absl::StrCat("shared: cannot map ", bytes, " bytes: ", std::strerror(errno)));
      }
      madvise(base, length, MADV_HUGEPAGE);
      out.data = static_cast<char*>(base) + (offset - start);
      out.lent = std::make_shared<SharedMapping>(base, length, peer.pid);
      out.space = HostSpace();
      return out;
    }
    case v1::LocalAttachRequest::kProcess: {
      out.kind = "process";
      if (peer.pid <= 0) {
        return absl::InvalidArgumentError(
            "process: the caller's pid is not visible to the worker (another PID namespace); "
            "attach shared memory instead");
      }
      const uint64_t address = request.process().address();
      if (address % static_cast<uint64_t>(element_size) != 0) {
        return absl::InvalidArgumentError(absl::StrCat("process.address: 0x", absl::Hex(address),
                                                       " is not aligned to the element size ",
                                                       element_size));
      }
      if (bytes == 0) break;
      // The first and the last byte: an unmapped range or a process the worker may not read
      // fails here, not in the first plan.
      char probe = 0;
      for (uint64_t at : {address, address + static_cast<uint64_t>(bytes) - 1}) {
        absl::Status s = ReadPeerMemory(peer.pid, at, &probe, 1);
        if (s.code() == absl::StatusCode::kPermissionDenied) return s;
        if (!s.ok()) {
          return absl::InvalidArgumentError(absl::StrCat(
              "process.address: 0x", absl::Hex(address), " + ", bytes,
              " bytes is not readable memory of process ", peer.pid, ": ", s.message()));
        }
      }
      auto memory = std::make_shared<ProcessMemory>(peer.pid);
      out.data = reinterpret_cast<char*>(address);
      out.space = memory->space();
      out.lent = std::move(memory);
      return out;
    }
    case v1::LocalAttachRequest::kCudaIpc: {
      out.kind = "cuda_ipc";
      const v1::CudaIpcRegion& ipc = request.cuda_ipc();
      if (space_->is_host()) {
        return absl::InvalidArgumentError(
            absl::StrCat("cuda_ipc: worker ", identity_().name,
                         " keeps its buffers in host memory (gloo backend); attach a CPU buffer"));
      }
      const std::string uuid = space_->device_uuid();
      if (!ipc.device_uuid().empty() && !uuid.empty() &&
          NormalizedUuid(ipc.device_uuid()) != NormalizedUuid(uuid)) {
        return absl::InvalidArgumentError(absl::StrCat(
            "cuda_ipc.device_uuid: the buffer is on ", ipc.device_uuid(), " but worker ",
            identity_().name, " owns ", space_->name(), " (", uuid, ")"));
      }
      if (bytes == 0) break;
      absl::StatusOr<Allocation> opened = space_->OpenShared(ipc.handle(), ipc.offset(), bytes);
      if (!opened.ok()) {
        return absl::Status(opened.status().code() == absl::StatusCode::kUnimplemented
                                ? absl::StatusCode::kInvalidArgument
                                : opened.status().code(),
                            absl::StrCat("cuda_ipc: ", opened.status().message()));
      }
      out.data = opened->data;
      out.space = space_;
      out.lent = std::make_shared<SpaceAllocation>(SpaceAllocation::Kind::kShared, space_, *opened,
                                                   peer.pid);
      return out;
    }
    case v1::LocalAttachRequest::MEMORY_NOT_SET:
      return absl::InvalidArgumentError("memory: none given (shared, process or cuda_ipc)");
  }
  // No bytes: nothing to map or open.
  MemorySpace* space = out.kind == "shared" ? HostSpace() : space_;
  absl::StatusOr<Allocation> none = space->Allocate(0);
  if (!none.ok()) return none.status();
  out.data = none->data;
  out.space = space;
  out.lent =
      std::make_shared<SpaceAllocation>(SpaceAllocation::Kind::kEmpty, space, *none, peer.pid);
  return out;
}

absl::StatusOr<PeerCredentials> AttachRegistry::Peer(int64_t session) const {
  absl::MutexLock lock(&mu_);
  if (shut_down_) return absl::UnavailableError("the worker is shutting down");
  auto it = sessions_.find(session);
  if (it == sessions_.end()) return absl::InternalError("unknown local session");
  return it->second.peer;
}

absl::StatusOr<AttachRegistry::Checked> AttachRegistry::Check(const v1::LocalAttachRequest& request,
                                                              const WorkerIdentity& id,
                                                              bool chunks_optional) {
  if (request.tensor().empty()) return absl::InvalidArgumentError("tensor: empty");
  Checked out;
  absl::StatusOr<DType> dtype = DTypeFromProto(request.dtype(), "dtype");
  if (!dtype.ok()) return dtype.status();
  out.dtype = *dtype;
  out.element_size = ElementSize(*dtype);
  if (request.rank() != id.rank) {
    return absl::FailedPreconditionError(
        absl::StrCat("rank: worker ", id.name, " holds rank ", id.rank, ", not rank ",
                     request.rank(), "; attach through the socket of rank ", request.rank(),
                     "'s worker (WorkerInfo.local_socket)"));
  }
  if (request.bytes() < 0) {
    return absl::InvalidArgumentError(absl::StrCat("bytes: ", request.bytes(), " < 0"));
  }
  if (chunks_optional && !request.has_chunks()) return out;
  absl::StatusOr<RankChunks> chunks = RankChunksFromProto(request.chunks(), "chunks");
  if (!chunks.ok()) return chunks.status();
  chunks->rank = request.rank();
  absl::StatusOr<int64_t> want = CheckedMul(chunks->local_elements, out.element_size);
  if (!want.ok()) return want.status();
  if (request.bytes() != *want) {
    return absl::InvalidArgumentError(
        absl::StrCat("bytes: the buffer has ", request.bytes(), " bytes but rank ", request.rank(),
                     "'s chunks of '", request.tensor(), "' take ", *want, " (",
                     chunks->local_elements, " ", DTypeName(*dtype), " elements)"));
  }
  out.chunks = *std::move(chunks);
  return out;
}

absl::StatusOr<v1::LocalAttachResponse> AttachRegistry::Attach(
    int64_t session, const v1::LocalAttachRequest& request, int fd) {
  UniqueFd owned(fd);  // Mapped (or refused) before this returns; never kept.
  absl::StatusOr<PeerCredentials> peer = Peer(session);
  if (!peer.ok()) return peer.status();
  const WorkerIdentity id = identity_();
  absl::StatusOr<Checked> checked = Check(request, id, /*chunks_optional=*/false);
  if (!checked.ok()) return checked.status();
  const int64_t want = request.bytes();
  absl::StatusOr<Opened> opened = Open(request, want, checked->element_size, *peer, owned.get());
  if (!opened.ok()) return opened.status();
  LentMemory* lent = opened->lent.get();
  absl::StatusOr<std::shared_ptr<HostBuffer>> buffer = HostBuffer::Wrap(
      checked->dtype, *checked->chunks, opened->space, opened->data, std::move(opened->lent));
  if (!buffer.ok()) return buffer.status();
  if (absl::Status s = buffers_->Insert(request.tensor(), request.version(), *buffer); !s.ok()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "rank ", request.rank(), " of '", request.tensor(), "' version ", request.version(),
        " is held on worker ", id.name, " already (attached through another connection?)"));
  }
  v1::AttachBufferRequest report;
  report.set_worker(id.name);
  report.set_incarnation(id.incarnation);
  report.set_tensor(request.tensor());
  report.set_version(request.version());
  report.set_rank(request.rank());
  report.set_dtype(request.dtype());
  *report.mutable_chunks() = request.chunks();
  report.mutable_chunks()->set_rank(request.rank());
  report.set_memory(opened->kind);
  report.set_pid(peer->pid);
  absl::StatusOr<v1::AttachBufferResponse> answer = rpc_->AttachBuffer(report);
  if (!answer.ok()) {
    buffers_->DropLent(lent);  // Nothing stays registered.
    return answer.status();
  }
  {
    absl::MutexLock lock(&mu_);
    auto it = sessions_.find(session);
    if (it != sessions_.end()) {
      it->second.attachments.push_back(Attachment{request.tensor(), request.rank(), *buffer});
    }
  }
  Log(absl::StrCat("attached rank ", request.rank(), " of '", request.tensor(), "' v",
                   request.version(), ": ", Bytes(want), " of ", lent->Describe(), " (",
                   opened->kind, ")", answer->readable() ? "; the tensor is readable" : ""));
  v1::LocalAttachResponse response;
  response.set_worker(id.name);
  response.set_memory(opened->kind);
  response.set_readable(answer->readable());
  return response;
}

absl::StatusOr<v1::LocalAttachManyResponse> AttachRegistry::AttachMany(
    int64_t session, const v1::LocalAttachManyRequest& request, std::vector<int> fds) {
  const FdCloser owned(std::move(fds));  // Mapped (or refused) before this returns.
  absl::StatusOr<PeerCredentials> peer = Peer(session);
  if (!peer.ok()) return peer.status();
  const int n = request.attachments_size();
  if (n == 0) return absl::InvalidArgumentError("attachments: none given");
  if (n > kMaxAttachmentsPerRequest) {
    return absl::InvalidArgumentError(absl::StrCat("attachments: ", n, " given; at most ",
                                                   kMaxAttachmentsPerRequest, " in one request"));
  }
  const WorkerIdentity id = identity_();
  auto member = [&request](int i, const absl::Status& s) {
    return absl::Status(s.code(),
                        absl::StrCat("attachments[", i, "] '", request.attachments(i).tensor(),
                                     "': ", s.message()));
  };
  // Each attachment checked and its memory opened (mapped, probed) before anything is held.
  struct Pending {
    Checked checked;
    Opened opened;
    int64_t version = 0;
  };
  std::vector<Pending> pending(n);
  absl::flat_hash_map<absl::string_view, int> seen;
  seen.reserve(n);
  bool need_layouts = false;
  for (int i = 0; i < n; ++i) {
    const v1::LocalAttachRequest& a = request.attachments(i);
    if (a.tensor().empty()) {
      return absl::InvalidArgumentError(absl::StrCat("attachments[", i, "]: tensor: empty"));
    }
    if (auto [at, fresh] = seen.emplace(a.tensor(), i); !fresh) {
      return member(i, absl::InvalidArgumentError(
                           absl::StrCat("tensor: also attachments[", at->second, "]")));
    }
    absl::StatusOr<Checked> checked = Check(a, id, /*chunks_optional=*/true);
    if (!checked.ok()) return member(i, checked.status());
    pending[i].checked = *std::move(checked);
    pending[i].version = a.version();
    need_layouts |= !pending[i].checked.chunks.has_value() || a.version() == 0;
    int fd = -1;
    if (a.has_shared()) {
      const int index = a.shared().fd_index();
      if (index < 0 || index >= static_cast<int>(owned.fds.size())) {
        return member(i, absl::InvalidArgumentError(
                             absl::StrCat("shared.fd_index: ", index, " but the request came with ",
                                          owned.fds.size(), " file descriptors (SCM_RIGHTS)")));
      }
      fd = owned.fds[index];
    }
    absl::StatusOr<Opened> opened = Open(a, a.bytes(), pending[i].checked.element_size, *peer, fd);
    if (!opened.ok()) return member(i, opened.status());
    pending[i].opened = *std::move(opened);
  }
  auto report = [&](bool validate_only) {
    v1::AttachBuffersRequest r;
    r.set_worker(id.name);
    r.set_incarnation(id.incarnation);
    r.set_rank(id.rank);
    r.set_pid(peer->pid);
    r.set_validate_only(validate_only);
    r.mutable_buffers()->Reserve(n);
    for (int i = 0; i < n; ++i) {
      const v1::LocalAttachRequest& a = request.attachments(i);
      v1::LentBuffer* b = r.add_buffers();
      b->set_tensor(a.tensor());
      b->set_version(pending[i].version);
      b->set_dtype(a.dtype());
      b->set_bytes(a.bytes());
      b->set_memory(pending[i].opened.kind);
      if (pending[i].checked.chunks.has_value()) {
        *b->mutable_chunks() = RankChunksToProto(*pending[i].checked.chunks);
      }
    }
    return r;
  };
  // The layouts the process did not give (it looked no tensor up), from the coordinator.
  if (need_layouts) {
    absl::StatusOr<v1::AttachBuffersResponse> layouts =
        rpc_->AttachBuffers(report(/*validate_only=*/true));
    if (!layouts.ok()) return AsAttachments(layouts.status());
    if (layouts->buffers_size() != n) {
      return absl::InternalError(
          absl::StrCat("the coordinator answered ", layouts->buffers_size(), " buffers for ", n));
    }
    for (int i = 0; i < n; ++i) {
      const v1::AttachedBuffer& got = layouts->buffers(i);
      absl::StatusOr<RankChunks> chunks = RankChunksFromProto(got.chunks(), "chunks");
      if (!chunks.ok()) return member(i, absl::InternalError(chunks.status().message()));
      chunks->rank = id.rank;
      if (chunks->local_elements * pending[i].checked.element_size !=
          request.attachments(i).bytes()) {
        return member(i, absl::InternalError("the coordinator answered chunks of another size"));
      }
      pending[i].checked.chunks = *std::move(chunks);
      pending[i].version = got.version();
    }
  }
  // Held at their layouts, then counted; after an error nothing stays held.
  std::vector<LentMemory*> held;
  held.reserve(n);
  auto drop_held = [&] {
    for (LentMemory* lent : held) buffers_->DropLent(lent);
  };
  std::vector<Attachment> attachments;
  attachments.reserve(n);
  for (int i = 0; i < n; ++i) {
    const v1::LocalAttachRequest& a = request.attachments(i);
    Opened& opened = pending[i].opened;
    LentMemory* lent = opened.lent.get();
    absl::StatusOr<std::shared_ptr<HostBuffer>> buffer =
        HostBuffer::Wrap(pending[i].checked.dtype, *pending[i].checked.chunks, opened.space,
                         opened.data, std::move(opened.lent));
    if (!buffer.ok()) {
      drop_held();
      return member(i, buffer.status());
    }
    if (!buffers_->Insert(a.tensor(), pending[i].version, *buffer).ok()) {
      drop_held();
      return member(i, absl::FailedPreconditionError(
                           absl::StrCat("rank ", id.rank, " of '", a.tensor(), "' version ",
                                        pending[i].version, " is held on worker ", id.name,
                                        " already (attached through another connection?)")));
    }
    held.push_back(lent);
    attachments.push_back(Attachment{a.tensor(), id.rank, *buffer});
  }
  absl::StatusOr<v1::AttachBuffersResponse> answer =
      rpc_->AttachBuffers(report(/*validate_only=*/false));
  if (!answer.ok() || answer->buffers_size() != n) {
    drop_held();
    if (!answer.ok()) return AsAttachments(answer.status());
    return absl::InternalError(
        absl::StrCat("the coordinator answered ", answer->buffers_size(), " buffers for ", n));
  }
  {
    absl::MutexLock lock(&mu_);
    auto it = sessions_.find(session);
    if (it != sessions_.end()) {
      std::vector<Attachment>& list = it->second.attachments;
      list.insert(list.end(), std::make_move_iterator(attachments.begin()),
                  std::make_move_iterator(attachments.end()));
    }
  }
  v1::LocalAttachManyResponse response;
  response.mutable_attachments()->Reserve(n);
  int64_t bytes = 0;
  int readable = 0;
  std::map<std::string, int> kinds;
  for (int i = 0; i < n; ++i) {
    v1::LocalAttachResponse* out = response.add_attachments();
    out->set_worker(id.name);
    out->set_memory(pending[i].opened.kind);
    out->set_readable(answer->buffers(i).readable());
    bytes += request.attachments(i).bytes();
    readable += answer->buffers(i).readable() ? 1 : 0;
    ++kinds[pending[i].opened.kind];
  }
  std::string memory;
  for (const auto& [kind, count] : kinds) {
    absl::StrAppend(&memory, memory.empty() ? "" : ", ", count, " ", kind);
  }
  Log(absl::StrCat("attached ", n, " buffers of rank ", id.rank, " for process ", peer->pid,
                   " in one request: ", Bytes(bytes), " (", memory, "); ", readable,
                   " tensors readable now"));
  return response;
}

absl::Status AttachRegistry::Detach(int64_t session, const v1::LocalDetachRequest& request) {
  Attachment found;
  bool have = false;
  int64_t pid = 0;
  {
    absl::MutexLock lock(&mu_);
    auto it = sessions_.find(session);
    if (it == sessions_.end()) return absl::InternalError("unknown local session");
    pid = it->second.peer.pid;
    std::vector<Attachment>& list = it->second.attachments;
    for (auto a = list.begin(); a != list.end(); ++a) {
      if (a->tensor == request.tensor() && a->rank == request.rank()) {
        found = std::move(*a);
        list.erase(a);
        have = true;
        break;
      }
    }
  }
  if (!have) {
    return absl::NotFoundError(absl::StrCat("rank ", request.rank(), " of '", request.tensor(),
                                            "' is not attached through this connection"));
  }
  End(found, absl::StrCat("process ", pid, " detached it"));
  return absl::OkStatus();
}

void AttachRegistry::CloseSession(int64_t session, const std::string& reason) {
  Session ended;
  {
    absl::MutexLock lock(&mu_);
    auto it = sessions_.find(session);
    if (it == sessions_.end()) return;
    ended = std::move(it->second);
    sessions_.erase(it);
  }
  for (const Attachment& a : ended.attachments) End(a, reason);
}

void AttachRegistry::End(const Attachment& attachment, const std::string& reason) {
  std::shared_ptr<HostBuffer> buffer = attachment.buffer.lock();
  if (buffer == nullptr) return;  // The tensor moved into worker-owned buffers, or was deleted.
  // Marked first: a plan storing it from now on is refused (BufferStore::Store).
  buffer->lent()->MarkDetached();
  const int dropped = buffers_->DropLent(buffer->lent());
  const std::string what = buffer->lent()->Describe();
  buffer.reset();
  Log(absl::StrCat("detached rank ", attachment.rank, " of '", attachment.tensor, "' (", what,
                   "): ", reason));
  {
    absl::MutexLock lock(&mu_);
    if (shut_down_) return;
  }
  if (dropped == 0) return;  // No version of it was held: nothing the coordinator counts.
  const WorkerIdentity id = identity_();
  v1::DetachBufferRequest report;
  report.set_worker(id.name);
  report.set_incarnation(id.incarnation);
  report.set_tensor(attachment.tensor);
  report.set_rank(attachment.rank);
  report.set_reason(reason);
  for (int i = 0; i < kDetachReportAttempts; ++i) {
    absl::Status s = rpc_->DetachBuffer(report);
    if (s.code() != absl::StatusCode::kUnavailable) {
      if (!s.ok()) Log(absl::StrCat("reporting the detach failed: ", s.ToString()));
      return;
    }
  }
}

void AttachRegistry::Shutdown() {
  absl::MutexLock lock(&mu_);
  shut_down_ = true;
}

int AttachRegistry::attachments() const {
  absl::MutexLock lock(&mu_);
  int n = 0;
  for (const auto& [id, s] : sessions_) {
    for (const Attachment& a : s.attachments) n += a.buffer.expired() ? 0 : 1;
  }
  return n;
}

}  // namespace shardcoord
