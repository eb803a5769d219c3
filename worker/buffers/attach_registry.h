#ifndef SHARDCOORD_WORKER_BUFFERS_ATTACH_REGISTRY_H_
#define SHARDCOORD_WORKER_BUFFERS_ATTACH_REGISTRY_H_

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "proto/shardcoord.pb.h"
#include "worker/buffers/buffer_store.h"
#include "worker/control/coordinator_rpc.h"
#include "worker/control/worker_core.h"
#include "worker/memory/memory_space.h"

namespace shardcoord {

// Who is on the other end of a local connection (SO_PEERCRED).
struct PeerCredentials {
  int64_t pid = 0;  // 0: not visible in the worker's PID namespace.
  int64_t uid = -1;
  int64_t gid = -1;
};

// The buffers user processes on this host lend the worker as ranks' local buffers of
// attached tensors (LocalAttachRequest). A lent buffer becomes the (tensor, version) buffer
// of the BufferStore, so plans read it, and a Copy into it writes it, like any other:
//
//  - shared memory (a memfd the process passed): mapped here, in the worker's host space,
//    used in place. It must be sealed against shrinking (F_SEAL_SHRINK): a file that shrinks
//    under a mapping kills its reader with SIGBUS.
//  - plain memory (the caller's own address, its pid from SO_PEERCRED): a ProcessMemorySpace
//    buffer, copied in and out with process_vm_readv/writev by the plans that use it.
//  - a CUDA IPC handle and offset: opened by the worker's space (MemorySpace::OpenShared),
//    used in place on its GPU.
//
// The coordinator counts a buffer only once the worker registered it (AttachRpc), and the
// worker forgets it when the coordinator refuses: after an error nothing stays registered.
// A session is one connection: closing it (the process detached, exited or died) detaches
// everything attached through it; a detached buffer is marked so no plan stores it again,
// leaves the store, and the coordinator hears of it (its rank's chunks are lost, the plans
// using them abort). Lent buffers that leave the store otherwise (the tensor was
// redistributed into worker-owned buffers, or deleted) just end. Thread-safe; no lock is
// held while calling the coordinator.
class AttachRegistry {
 public:
  // `space`: the worker's buffers' space (CUDA IPC handles are opened there). `identity`:
  // the worker's current registration.
  AttachRegistry(BufferStore* buffers, MemorySpace* space, AttachRpc* rpc,
                 std::function<WorkerIdentity()> identity,
                 std::function<void(absl::string_view)> log = nullptr);
  ~AttachRegistry();

  AttachRegistry(const AttachRegistry&) = delete;
  AttachRegistry& operator=(const AttachRegistry&) = delete;

  int64_t OpenSession(const PeerCredentials& peer);
  // `fd` (owned, -1 for none) is the descriptor that came with the request. Errors as
  // LocalResponse documents (shardcoord.proto): INVALID_ARGUMENT a bad request, size,
  // dtype or memory; PERMISSION_DENIED memory the worker may not read; FAILED_PRECONDITION
  // the rank is not this worker's, or is attached already; the coordinator's refusal.
  absl::StatusOr<v1::LocalAttachResponse> Attach(int64_t session,
                                                 const v1::LocalAttachRequest& request, int fd);
  // A LocalAttachManyRequest: every attachment as Attach, all or nothing. `fds` (owned) are
  // the descriptors that came with the request, in order (SharedMemoryRegion.fd_index).
  // Attachments without a version or chunks take the tensor's from the coordinator first
  // (AttachBuffers, validate_only); every buffer is then held at its layout, and the
  // coordinator counts them all in one AttachBuffers (so it counts only buffers the worker
  // holds). Errors as Attach's, the first failing attachment's message starting with
  // "attachments[i] 'TENSOR': "; INVALID_ARGUMENT no attachments or more than
  // kMaxAttachmentsPerRequest, a tensor twice, an fd_index with no descriptor.
  absl::StatusOr<v1::LocalAttachManyResponse> AttachMany(int64_t session,
                                                         const v1::LocalAttachManyRequest& request,
                                                         std::vector<int> fds);
  // NOT_FOUND when the session attached no such rank of that tensor.
  absl::Status Detach(int64_t session, const v1::LocalDetachRequest& request);
  // The connection ended: detaches whatever it attached, `reason` telling the coordinator.
  void CloseSession(int64_t session, const std::string& reason);
  // From now on detaches are not reported (the worker is stopping: its death tells the
  // coordinator) and attaches are refused with UNAVAILABLE.
  void Shutdown();

  // Attachments in force (their buffers still held).
  int attachments() const;

 private:
  struct Attachment {
    std::string tensor;
    int64_t rank = 0;
    std::weak_ptr<HostBuffer> buffer;
  };
  struct Session {
    PeerCredentials peer;
    std::vector<Attachment> attachments;
  };

  // What Attach and AttachMany check of one request before opening its memory: the buffer's
  // dtype and its element size, and its chunks (checked against `bytes`) when given.
  struct Checked {
    DType dtype = DType::kF32;
    int64_t element_size = 0;
    std::optional<RankChunks> chunks;
  };
  // INVALID_ARGUMENT a bad field (or no chunks, unless `chunks_optional`);
  // FAILED_PRECONDITION a rank other than `id`'s.
  static absl::StatusOr<Checked> Check(const v1::LocalAttachRequest& request,
                                       const WorkerIdentity& id, bool chunks_optional);
  // The session's peer; UNAVAILABLE once shut down.
  absl::StatusOr<PeerCredentials> Peer(int64_t session) const;
  // The lent memory the request names, as (where it starts in `space`, its owner, the space).
  struct Opened {
    char* data = nullptr;
    std::shared_ptr<LentMemory> lent;
    MemorySpace* space = nullptr;
    std::string kind;  // "shared", "process", "cuda_ipc".
  };
  absl::StatusOr<Opened> Open(const v1::LocalAttachRequest& request, int64_t bytes,
                              int64_t element_size, const PeerCredentials& peer, int fd);
  // Marks the buffer detached, drops it from the store and tells the coordinator.
  void End(const Attachment& attachment, const std::string& reason);
  void Log(absl::string_view line) const {
    if (log_) log_(line);
  }
  // Where lent host memory lives: the worker's own space when that is host memory (so plans
  // see one space, budgeted or not: worker/memory/memory_budget.h), else plain host memory.
  MemorySpace* HostSpace() const { return space_->is_host() ? space_ : &HostMemorySpace::Global(); }

  BufferStore* const buffers_;
  MemorySpace* const space_;
  AttachRpc* const rpc_;
  const std::function<WorkerIdentity()> identity_;
  const std::function<void(absl::string_view)> log_;

  mutable absl::Mutex mu_;
  std::map<int64_t, Session> sessions_ ABSL_GUARDED_BY(mu_);
  int64_t next_session_ ABSL_GUARDED_BY(mu_) = 1;
  bool shut_down_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace shardcoord

#endif  // SHARDCOORD_WORKER_BUFFERS_ATTACH_REGISTRY_H_
