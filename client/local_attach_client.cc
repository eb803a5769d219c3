#include "client/local_attach_client.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <string>

#include "absl/strings/str_cat.h"
#include "proto/local_frame.h"

namespace shardcoord {
namespace {

int64_t ElementBytes(v1::DType dtype) {
  switch (dtype) {
    case v1::F64:
    case v1::I64:
      return 8;
    case v1::F32:
    case v1::I32:
      return 4;
    case v1::F16:
    case v1::BF16:
      return 2;
    case v1::I8:
    case v1::U8:
      return 1;
    default:
      return 0;
  }
}

const v1::RankChunks* ChunksOf(const v1::TensorInfo& tensor, int64_t rank) {
  for (const v1::RankChunks& rc : tensor.layout().ranks()) {
    if (rc.rank() == rank) return &rc;
  }
  return nullptr;
}

}  // namespace

absl::StatusOr<std::unique_ptr<SharedMemory>> SharedMemory::Create(int64_t bytes,
                                                                   const std::string& name) {
  if (bytes < 0) return absl::InvalidArgumentError(absl::StrCat("bytes: ", bytes, " < 0"));
  if (std::unique_ptr<SharedMemory> huge = CreateHuge(bytes, name)) return huge;
  const int fd = memfd_create(name.c_str(), MFD_CLOEXEC | MFD_ALLOW_SEALING);
  if (fd < 0) return absl::ResourceExhaustedError(absl::StrCat("memfd_create: ", strerror(errno)));
  const size_t size = static_cast<size_t>(bytes > 0 ? bytes : 1);
  void* data = MAP_FAILED;
  if (ftruncate(fd, static_cast<off_t>(size)) == 0 &&
      fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW) == 0) {
    data = mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (data != MAP_FAILED) madvise(data, size, MADV_HUGEPAGE);  // Where the host allows it.
  }
  if (data == MAP_FAILED) {
    const int err = errno;
    close(fd);
    return absl::ResourceExhaustedError(
        absl::StrCat("shared memory of ", bytes, " bytes: ", strerror(err)));
  }
  return std::unique_ptr<SharedMemory>(
      new SharedMemory(fd, static_cast<char*>(data), bytes, size, /*huge_pages=*/false));
}

std::unique_ptr<SharedMemory> SharedMemory::CreateHuge(int64_t bytes, const std::string& name) {
  const char* env = std::getenv("SHARDCOORD_HUGETLB");
  if (env != nullptr && std::string(env) == "off") return nullptr;
  const int fd = memfd_create(name.c_str(), MFD_CLOEXEC | MFD_ALLOW_SEALING | MFD_HUGETLB);
  if (fd < 0) return nullptr;  // No hugetlbfs.
  struct stat st;
  const int64_t page = fstat(fd, &st) == 0 ? st.st_blksize : 0;
  if (page <= 0 || bytes < page) {  // Smaller than a huge page: not worth one.
    close(fd);
    return nullptr;
  }
  const size_t size = static_cast<size_t>((bytes + page - 1) / page * page);
  // mmap reserves the huge pages (fails when too few are free), so no later fault can fail.
  void* data = MAP_FAILED;
  if (ftruncate(fd, static_cast<off_t>(size)) == 0 &&
      fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW) == 0) {
    data = mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  }
  if (data == MAP_FAILED) {
    close(fd);
    return nullptr;
  }
  return std::unique_ptr<SharedMemory>(
      new SharedMemory(fd, static_cast<char*>(data), bytes, size, /*huge_pages=*/true));
}

SharedMemory::~SharedMemory() {
  munmap(data_, mapped_);
  close(fd_);
}

absl::StatusOr<int64_t> LocalBytes(const v1::TensorInfo& tensor, int64_t rank) {
  const v1::RankChunks* rc = ChunksOf(tensor, rank);
  if (rc == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat("rank: tensor '", tensor.name(), "' has no chunks on rank ", rank));
  }
  return rc->local_elements() * ElementBytes(tensor.dtype());
}

absl::StatusOr<std::unique_ptr<LocalAttachClient>> LocalAttachClient::Connect(
    const std::string& path) {
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  if (path.empty() || path.size() >= sizeof(addr.sun_path)) {
    return absl::InvalidArgumentError(absl::StrCat("local socket path '", path, "'"));
  }
  std::memcpy(addr.sun_path, path.data(), path.size());
  const int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0 || connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    const int err = errno;
    if (fd >= 0) close(fd);
    return absl::UnavailableError(
        absl::StrCat("cannot connect to the local socket ", path, ": ", strerror(err)));
  }
  return std::unique_ptr<LocalAttachClient>(new LocalAttachClient(fd));
}

LocalAttachClient::~LocalAttachClient() { close(fd_); }

absl::StatusOr<v1::LocalAttachRequest> LocalAttachClient::Request(const v1::TensorInfo& tensor,
                                                                  int64_t rank,
                                                                  int64_t bytes) const {
  const v1::RankChunks* rc = ChunksOf(tensor, rank);
  if (rc == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat("rank: tensor '", tensor.name(), "' has no chunks on rank ", rank));
  }
  v1::LocalAttachRequest r;
  r.set_tensor(tensor.name());
  r.set_rank(rank);
  r.set_version(tensor.version());
  r.set_dtype(tensor.dtype());
  *r.mutable_chunks() = *rc;
  r.set_bytes(bytes);
  return r;
}

absl::StatusOr<v1::LocalAttachResponse> LocalAttachClient::AttachShared(
    const v1::TensorInfo& tensor, int64_t rank, const SharedMemory& memory, int64_t offset) {
  absl::StatusOr<int64_t> bytes = LocalBytes(tensor, rank);
  if (!bytes.ok()) return bytes.status();
  if (offset < 0 || offset + *bytes > memory.bytes()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "memory: ", memory.bytes(), " bytes cannot hold ", *bytes, " bytes from offset ", offset));
  }
  absl::StatusOr<v1::LocalAttachRequest> attach = Request(tensor, rank, *bytes);
  if (!attach.ok()) return attach.status();
  attach->mutable_shared()->set_offset(offset);
  v1::LocalRequest request;
  *request.mutable_attach() = *std::move(attach);
  absl::StatusOr<v1::LocalResponse> r = Call(request, memory.fd());
  if (!r.ok()) return r.status();
  return r->attach();
}

absl::StatusOr<v1::LocalAttachResponse> LocalAttachClient::AttachPlain(const v1::TensorInfo& tensor,
                                                                       int64_t rank,
                                                                       const void* data,
                                                                       int64_t bytes) {
  absl::StatusOr<v1::LocalAttachRequest> attach = Request(tensor, rank, bytes);
  if (!attach.ok()) return attach.status();
  attach->mutable_process()->set_address(reinterpret_cast<uint64_t>(data));
  v1::LocalRequest request;
  *request.mutable_attach() = *std::move(attach);
  absl::StatusOr<v1::LocalResponse> r = Call(request, -1);
  if (!r.ok()) return r.status();
  return r->attach();
}

absl::Status LocalAttachClient::Detach(const std::string& tensor, int64_t rank) {
  v1::LocalRequest request;
  request.mutable_detach()->set_tensor(tensor);
  request.mutable_detach()->set_rank(rank);
  return Call(request, -1).status();
}

absl::StatusOr<v1::LocalResponse> LocalAttachClient::Call(const v1::LocalRequest& request, int fd) {
  absl::MutexLock lock(&mu_);
  // A worker that refused this peer has answered and hung up: a failed send still reads it.
  SendLocalFrame(fd_, request.SerializeAsString(), fd).IgnoreError();
  LocalFrameReader reader;
  absl::StatusOr<std::string> frame = ReceiveLocalFrame(fd_, reader);
  if (!frame.ok()) {
    return absl::UnavailableError(
        absl::StrCat("the worker's local socket: ", frame.status().message()));
  }
  v1::LocalResponse response;
  if (!response.ParseFromString(*frame)) {
    return absl::InternalError("the worker sent something other than a LocalResponse");
  }
  if (response.code() != 0) {
    return absl::Status(static_cast<absl::StatusCode>(response.code()), response.message());
  }
  return response;
}

}  // namespace shardcoord
