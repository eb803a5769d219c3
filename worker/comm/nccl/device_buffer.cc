#include "worker/comm/nccl/device_buffer.h"

#include <cuda_runtime_api.h>

#include <utility>

#include "absl/strings/str_cat.h"
#include "worker/comm/nccl/cuda_status.h"

namespace shardcoord {
namespace nccl {

absl::StatusOr<DeviceBuffer> DeviceBuffer::Allocate(int64_t bytes, int device) {
  if (bytes < 0) {
    return absl::InvalidArgumentError(absl::StrCat("device buffer of ", bytes, " bytes"));
  }
  DeviceBuffer b;
  b.device_ = device;
  if (bytes == 0) return b;
  const std::string what = absl::StrCat("cudaMalloc of ", bytes, " bytes on device ", device);
  if (absl::Status s = CudaStatus(cudaSetDevice(device), what.c_str()); !s.ok()) return s;
  void* p = nullptr;
  if (absl::Status s = CudaStatus(cudaMalloc(&p, static_cast<size_t>(bytes)), what.c_str());
      !s.ok()) {
    return s;
  }
  b.data_ = p;
  b.bytes_ = bytes;
  return b;
}

DeviceBuffer::~DeviceBuffer() { Free(); }

DeviceBuffer::DeviceBuffer(DeviceBuffer&& other) noexcept
    : data_(std::exchange(other.data_, nullptr)),
      bytes_(std::exchange(other.bytes_, 0)),
      device_(other.device_) {}

DeviceBuffer& DeviceBuffer::operator=(DeviceBuffer&& other) noexcept {
  if (this != &other) {
    Free();
    data_ = std::exchange(other.data_, nullptr);
    bytes_ = std::exchange(other.bytes_, 0);
    device_ = other.device_;
  }
  return *this;
}

void DeviceBuffer::Free() {
  if (data_ == nullptr) return;
  // cudaFree needs the owning device current on this thread.
  int current = 0;
  const bool restore = cudaGetDevice(&current) == cudaSuccess && current != device_;
  (void)cudaSetDevice(device_);
  (void)cudaFree(data_);
  if (restore) (void)cudaSetDevice(current);
  data_ = nullptr;
  bytes_ = 0;
}

absl::Status DeviceBuffer::CheckRange(int64_t bytes, int64_t offset) const {
  if (bytes < 0 || offset < 0 || offset > bytes_ || bytes > bytes_ - offset) {
    return absl::InvalidArgumentError(absl::StrCat("copy of ", bytes, " bytes at offset ", offset,
                                                   " of a ", bytes_, "-byte device buffer"));
  }
  return absl::OkStatus();
}

absl::Status DeviceBuffer::CopyFromHost(const void* src, int64_t bytes, int64_t offset) {
  if (absl::Status s = CheckRange(bytes, offset); !s.ok()) return s;
  if (bytes == 0) return absl::OkStatus();
  if (absl::Status s = CudaStatus(cudaSetDevice(device_), "cudaSetDevice"); !s.ok()) return s;
  return CudaStatus(cudaMemcpy(static_cast<char*>(data_) + offset, src, static_cast<size_t>(bytes),
                               cudaMemcpyHostToDevice),
                    "cudaMemcpy to device");
}

absl::Status DeviceBuffer::CopyToHost(void* dst, int64_t bytes, int64_t offset) const {
  if (absl::Status s = CheckRange(bytes, offset); !s.ok()) return s;
  if (bytes == 0) return absl::OkStatus();
  if (absl::Status s = CudaStatus(cudaSetDevice(device_), "cudaSetDevice"); !s.ok()) return s;
  return CudaStatus(cudaMemcpy(dst, static_cast<const char*>(data_) + offset,
                               static_cast<size_t>(bytes), cudaMemcpyDeviceToHost),
                    "cudaMemcpy to host");
}

absl::Status DeviceBuffer::Fill(unsigned char value) {
  if (bytes_ == 0) return absl::OkStatus();
  if (absl::Status s = CudaStatus(cudaSetDevice(device_), "cudaSetDevice"); !s.ok()) return s;
  return CudaStatus(cudaMemset(data_, value, static_cast<size_t>(bytes_)), "cudaMemset");
}

}  // namespace nccl
}  // namespace shardcoord
