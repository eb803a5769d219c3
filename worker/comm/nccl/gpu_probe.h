#ifndef SHARDCOORD_WORKER_COMM_NCCL_GPU_PROBE_H_
#define SHARDCOORD_WORKER_COMM_NCCL_GPU_PROBE_H_

#include <functional>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace shardcoord {

// The number of CUDA devices this process sees (after CUDA_VISIBLE_DEVICES), at least 1;
// FAILED_PRECONDITION "no CUDA device visible: <why>" when there are none (no driver, no GPU:
// why is CudaStatus's message for cudaGetDeviceCount; or a binary built without the CUDA
// toolkit).
absl::StatusOr<int> VisibleCudaDevices();

enum class Backend { kGloo, kNccl };

struct BackendChoice {
  Backend backend = Backend::kGloo;
  // The worker's first log line, e.g.
  //   "backend auto: no CUDA device visible, using gloo (cudaGetDeviceCount:
  //    cudaErrorNoDevice: no CUDA-capable device is detected)"
  //   "backend auto: 2 CUDA device(s) visible, using nccl"
  std::string log_line;
  int visible_devices = 0;  // 0 for gloo chosen without probing.
};

using CudaDeviceProbe = std::function<absl::StatusOr<int>()>;

// Resolves --backend: "gloo" (never probes), "nccl" (the probe must find a device; else its
// FAILED_PRECONDITION, whose message is the one line to print before exiting), "auto" (nccl
// when a device is visible, else gloo). Anything else is INVALID_ARGUMENT.
absl::StatusOr<BackendChoice> ChooseBackend(absl::string_view flag,
                                            const CudaDeviceProbe& probe = VisibleCudaDevices);

// The GPU a worker owns: --device when given (device_flag >= 0), else 0, the first device
// CUDA_VISIBLE_DEVICES leaves visible. INVALID_ARGUMENT when it is not below `visible`.
absl::StatusOr<int> ResolveDevice(int device_flag, int visible);

// The worker's --device flag: "" (default: the first visible GPU when the backend is nccl),
// "N" or "cuda:N" (GPU N, counted after CUDA_VISIBLE_DEVICES), or "cpu" (host buffers and
// the gloo backend, without probing for a GPU).
struct DeviceFlag {
  bool cpu = false;
  int index = -1;  // -1: the default. For ResolveDevice.
};
// INVALID_ARGUMENT "--device '<flag>' is not cpu, N or cuda:N" otherwise.
absl::StatusOr<DeviceFlag> ParseDeviceFlag(absl::string_view flag);

}  // namespace shardcoord

#endif  // SHARDCOORD_WORKER_COMM_NCCL_GPU_PROBE_H_
