#ifndef SHARDCOORD_CLIENT_LOCAL_ATTACH_CLIENT_H_
#define SHARDCOORD_CLIENT_LOCAL_ATTACH_CLIENT_H_

// The C++ side of the local attach protocol (shardcoord.proto, "Local attach protocol"): a
// process lends its own memory to the worker beside it as a rank's local buffer of an
// ATTACHED tensor. The Python package (client/python/shardcoord) is the other client.
//
//   absl::StatusOr<v1::TensorInfo> t = coordinator.GetTensor("w");
//   auto memory = SharedMemory::Create(LocalBytes(*t, rank).value());
//   auto local = LocalAttachClient::Connect(worker_info.local_socket());
//   (*local)->AttachShared(*t, rank, **memory);   // the worker maps the same pages
//
// The connection owns the attachments: destroying the client detaches them.

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "proto/shardcoord.pb.h"

namespace shardcoord {

// A memfd of `bytes` sealed against shrinking and growing, mapped read-write here: memory a
// worker maps too, so it is lent without a copy. Zeroed.
//
// Huge pages: when the host has reserved huge pages (vm.nr_hugepages) and enough are free,
// a buffer of at least one huge page is a hugetlbfs memfd (MFD_HUGETLB, its size rounded up
// to whole huge pages): the workers' process_vm_writev into it then runs as fast as into
// their own huge-page memory, where 4 KiB shared pages took about 2.5x as long (bench/README).
// Otherwise, or with $SHARDCOORD_HUGETLB=off, an ordinary memfd.
class SharedMemory {
 public:
  static absl::StatusOr<std::unique_ptr<SharedMemory>> Create(
      int64_t bytes, const std::string& name = "shardcoord");
  ~SharedMemory();
  SharedMemory(const SharedMemory&) = delete;
  SharedMemory& operator=(const SharedMemory&) = delete;

  char* data() const { return data_; }
  int64_t bytes() const { return bytes_; }
  int fd() const { return fd_; }
  bool huge_pages() const { return huge_pages_; }  // A hugetlbfs memfd.

 private:
  // A hugetlbfs memfd of at least `bytes`, or null when the host has none to give.
  static std::unique_ptr<SharedMemory> CreateHuge(int64_t bytes, const std::string& name);
  SharedMemory(int fd, char* data, int64_t bytes, size_t mapped, bool huge_pages)
      : fd_(fd), data_(data), bytes_(bytes), mapped_(mapped), huge_pages_(huge_pages) {}
  const int fd_;
  char* const data_;
  const int64_t bytes_;
  const size_t mapped_;  // Bytes mapped (whole huge pages for a hugetlbfs memfd).
  const bool huge_pages_;
};

// Bytes of `rank`'s local buffer of `tensor` (its chunks as the layout places them);
// INVALID_ARGUMENT when the rank holds nothing of it.
absl::StatusOr<int64_t> LocalBytes(const v1::TensorInfo& tensor, int64_t rank);

// One connection to a worker's local socket (WorkerInfo.local_socket). Thread-safe: one
// request at a time.
class LocalAttachClient {
 public:
  // UNAVAILABLE when nobody serves `path`.
  static absl::StatusOr<std::unique_ptr<LocalAttachClient>> Connect(const std::string& path);
  ~LocalAttachClient();
  LocalAttachClient(const LocalAttachClient&) = delete;
  LocalAttachClient& operator=(const LocalAttachClient&) = delete;

  // Lends `memory` from `offset` as `rank`'s local buffer of `tensor` (as GetTensor returned
  // it: its version, dtype and the rank's chunks). The worker's and the coordinator's errors
  // come back with their codes (shardcoord.proto, LocalResponse).
  absl::StatusOr<v1::LocalAttachResponse> AttachShared(const v1::TensorInfo& tensor, int64_t rank,
                                                       const SharedMemory& memory,
                                                       int64_t offset = 0);
  // Lends plain memory of this process (`bytes` at `data`): the worker reads and writes it
  // with process_vm_readv/writev, one copy per plan.
  absl::StatusOr<v1::LocalAttachResponse> AttachPlain(const v1::TensorInfo& tensor, int64_t rank,
                                                      const void* data, int64_t bytes);
  // NOT_FOUND when this connection did not attach it.
  absl::Status Detach(const std::string& tensor, int64_t rank);

 private:
  explicit LocalAttachClient(int fd) : fd_(fd) {}
  absl::StatusOr<v1::LocalAttachRequest> Request(const v1::TensorInfo& tensor, int64_t rank,
                                                 int64_t bytes) const;
  absl::StatusOr<v1::LocalResponse> Call(const v1::LocalRequest& request, int fd);

  const int fd_;
  absl::Mutex mu_;
};

}  // namespace shardcoord

#endif  // SHARDCOORD_CLIENT_LOCAL_ATTACH_CLIENT_H_
