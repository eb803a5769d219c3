#ifndef SHARDCOORD_WORKER_COMM_NCCL_DEVICE_BUFFER_H_
#define SHARDCOORD_WORKER_COMM_NCCL_DEVICE_BUFFER_H_

#include <cstdint>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace shardcoord {
namespace nccl {

// A chunk buffer in device memory (cudaMalloc: never managed memory, so NCCL and the
// kernels see plain device pointers), freed on destruction. Move-only.
class DeviceBuffer {
 public:
  // `bytes` on `device`, which stays the calling thread's current device (a worker owns one
  // GPU); 0 bytes gives an empty buffer with a null data() and touches no device. Errors:
  // RESOURCE_EXHAUSTED when the device is out of memory, FAILED_PRECONDITION when there is no
  // usable device, INTERNAL otherwise; all name the size, the device and CUDA's error.
  static absl::StatusOr<DeviceBuffer> Allocate(int64_t bytes, int device);

  DeviceBuffer() = default;
  ~DeviceBuffer();
  DeviceBuffer(DeviceBuffer&& other) noexcept;
  DeviceBuffer& operator=(DeviceBuffer&& other) noexcept;
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;

  void* data() const { return data_; }
  int64_t bytes() const { return bytes_; }
  int device() const { return device_; }

  // Synchronous copies of `bytes` at byte `offset` of this buffer; INVALID_ARGUMENT when the
  // range is outside it.
  absl::Status CopyFromHost(const void* src, int64_t bytes, int64_t offset = 0);
  absl::Status CopyToHost(void* dst, int64_t bytes, int64_t offset = 0) const;
  // Every byte set to `value` (synchronous).
  absl::Status Fill(unsigned char value);

 private:
  void Free();
  absl::Status CheckRange(int64_t bytes, int64_t offset) const;

  void* data_ = nullptr;
  int64_t bytes_ = 0;
  int device_ = 0;
};

}  // namespace nccl
}  // namespace shardcoord

#endif  // SHARDCOORD_WORKER_COMM_NCCL_DEVICE_BUFFER_H_
