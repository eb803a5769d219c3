#include "worker/testing/attach_test_util.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>

#include "absl/strings/str_cat.h"

namespace shardcoord {
namespace attach_testing {

absl::StatusOr<v1::AttachBufferResponse> FakeAttachRpc::AttachBuffer(
    const v1::AttachBufferRequest& request) {
  absl::MutexLock lock(&mu_);
  attaches_.push_back(request);
  if (!refuse_.ok()) return refuse_;
  v1::AttachBufferResponse response;
  response.set_readable(true);
  return response;
}

absl::Status FakeAttachRpc::DetachBuffer(const v1::DetachBufferRequest& request) {
  absl::MutexLock lock(&mu_);
  detaches_.push_back(request);
  return absl::OkStatus();
}

absl::StatusOr<v1::AttachBuffersResponse> FakeAttachRpc::AttachBuffers(
    const v1::AttachBuffersRequest& request) {
  absl::MutexLock lock(&mu_);
  bulk_attaches_.push_back(request);
  if (request.validate_only() && !refuse_validation_.ok()) return refuse_validation_;
  if (!request.validate_only() && !refuse_.ok()) return refuse_;
  v1::AttachBuffersResponse response;
  for (int i = 0; i < request.buffers_size(); ++i) {
    const v1::LentBuffer& b = request.buffers(i);
    v1::AttachedBuffer* out = response.add_buffers();
    auto known = known_.find(b.tensor());
    if (b.has_chunks()) {
      *out->mutable_chunks() = b.chunks();
      out->set_version(b.version());
    } else if (known != known_.end()) {
      *out->mutable_chunks() = known->second.second;
      out->set_version(known->second.first);
    } else {
      return absl::NotFoundError(
          absl::StrCat("buffers[", i, "] '", b.tensor(), "': unknown tensor '", b.tensor(), "'"));
    }
    if (b.version() == 0 && known != known_.end()) out->set_version(known->second.first);
    out->mutable_chunks()->set_rank(request.rank());
    out->set_readable(!request.validate_only());
  }
  return response;
}

void FakeAttachRpc::Know(const std::string& tensor, int64_t version, const v1::RankChunks& chunks) {
  absl::MutexLock lock(&mu_);
  known_[tensor] = {version, chunks};
}

void FakeAttachRpc::RefuseValidation(absl::Status s) {
  absl::MutexLock lock(&mu_);
  refuse_validation_ = std::move(s);
}

std::vector<v1::AttachBuffersRequest> FakeAttachRpc::bulk_attaches() const {
  absl::MutexLock lock(&mu_);
  return bulk_attaches_;
}

absl::Status FakeAttachRpc::ReportChunks(const v1::ReportChunksRequest& request) {
  absl::MutexLock lock(&mu_);
  if (request.final()) finals_.push_back(request);
  return absl::OkStatus();
}

void FakeAttachRpc::Refuse(absl::Status s) {
  absl::MutexLock lock(&mu_);
  refuse_ = std::move(s);
}

std::vector<v1::AttachBufferRequest> FakeAttachRpc::attaches() const {
  absl::MutexLock lock(&mu_);
  return attaches_;
}

std::vector<v1::DetachBufferRequest> FakeAttachRpc::detaches() const {
  absl::MutexLock lock(&mu_);
  return detaches_;
}

std::vector<v1::ReportChunksRequest> FakeAttachRpc::WaitFinals(size_t n) const {
  absl::MutexLock lock(&mu_);
  auto enough = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return finals_.size() >= n; };
  mu_.Await(absl::Condition(&enough));
  return finals_;
}

std::vector<v1::DetachBufferRequest> FakeAttachRpc::WaitDetaches(size_t n) const {
  absl::MutexLock lock(&mu_);
  auto enough = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return detaches_.size() >= n; };
  mu_.Await(absl::Condition(&enough));
  return detaches_;
}

Memfd::Memfd(int64_t bytes, bool sealable) : bytes(bytes) {
  fd = memfd_create("attach-test", MFD_CLOEXEC | (sealable ? MFD_ALLOW_SEALING : 0));
  if (fd < 0 || ftruncate(fd, bytes) != 0) {
    std::perror("memfd");
    std::abort();
  }
  data = static_cast<char*>(mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0));
  if (data == MAP_FAILED) {
    std::perror("mmap");
    std::abort();
  }
}

Memfd::~Memfd() {
  munmap(data, bytes);
  close(fd);
}

int Memfd::Give() const { return dup(fd); }

}  // namespace attach_testing
}  // namespace shardcoord
