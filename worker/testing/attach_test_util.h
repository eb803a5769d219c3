#ifndef SHARDCOORD_WORKER_TESTING_ATTACH_TEST_UTIL_H_
#define SHARDCOORD_WORKER_TESTING_ATTACH_TEST_UTIL_H_

// What the tests of lent buffers share: a coordinator stand-in for the worker's attach,
// detach and plan reports, and a memfd mapped in the test.

#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "proto/shardcoord.pb.h"
#include "worker/control/coordinator_rpc.h"

namespace shardcoord {
namespace attach_testing {

// Records every call; AttachBuffer answers readable (or Refuse's status). AttachBuffers
// answers the chunks of the tensors it was told of (Know) for a buffer that gives none, and
// echoes the given ones; NOT_FOUND "buffers[i] 'T': ..." for an unknown tensor without
// chunks. Refuse's status refuses AttachBuffers too, RefuseValidation's only its
// validate_only calls.
class FakeAttachRpc : public AttachRpc, public ChunkReporter {
 public:
  absl::StatusOr<v1::AttachBufferResponse> AttachBuffer(
      const v1::AttachBufferRequest& request) override;
  absl::Status DetachBuffer(const v1::DetachBufferRequest& request) override;
  absl::StatusOr<v1::AttachBuffersResponse> AttachBuffers(
      const v1::AttachBuffersRequest& request) override;
  absl::Status ReportChunks(const v1::ReportChunksRequest& request) override;

  // Tensor `tensor` is committed at `version` with `chunks` as every rank's chunks.
  void Know(const std::string& tensor, int64_t version, const v1::RankChunks& chunks);
  void Refuse(absl::Status s);
  void RefuseValidation(absl::Status s);
  std::vector<v1::AttachBuffersRequest> bulk_attaches() const;
  std::vector<v1::AttachBufferRequest> attaches() const;
  std::vector<v1::DetachBufferRequest> detaches() const;
  // Blocks until at least `n` final reports (or detaches) came; returns them all.
  std::vector<v1::ReportChunksRequest> WaitFinals(size_t n) const;
  std::vector<v1::DetachBufferRequest> WaitDetaches(size_t n) const;

 private:
  mutable absl::Mutex mu_;
  absl::Status refuse_ ABSL_GUARDED_BY(mu_);
  absl::Status refuse_validation_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, std::pair<int64_t, v1::RankChunks>> known_ ABSL_GUARDED_BY(mu_);
  std::vector<v1::AttachBuffersRequest> bulk_attaches_ ABSL_GUARDED_BY(mu_);
  std::vector<v1::AttachBufferRequest> attaches_ ABSL_GUARDED_BY(mu_);
  std::vector<v1::DetachBufferRequest> detaches_ ABSL_GUARDED_BY(mu_);
  std::vector<v1::ReportChunksRequest> finals_ ABSL_GUARDED_BY(mu_);
};

// A memfd of `bytes`, sealable (MFD_ALLOW_SEALING) unless `sealable` is false, mapped here.
struct Memfd {
  explicit Memfd(int64_t bytes, bool sealable = true);
  ~Memfd();
  Memfd(const Memfd&) = delete;
  Memfd& operator=(const Memfd&) = delete;
  // A new descriptor of it (for the registry, which takes ownership).
  int Give() const;
  float* floats() const { return reinterpret_cast<float*>(data); }

  int64_t bytes;
  int fd;
  char* data;
};

}  // namespace attach_testing
}  // namespace shardcoord

#endif  // SHARDCOORD_WORKER_TESTING_ATTACH_TEST_UTIL_H_
