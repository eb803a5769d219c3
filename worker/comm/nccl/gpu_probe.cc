#include "worker/comm/nccl/gpu_probe.h"

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"

#ifdef SHARDCOORD_HAVE_CUDA
#include <cuda_runtime_api.h>

#include "worker/comm/nccl/cuda_status.h"
#endif

namespace shardcoord {
namespace {

constexpr absl::string_view kNoDevice = "no CUDA device visible: ";

}  // namespace

absl::StatusOr<int> VisibleCudaDevices() {
#ifdef SHARDCOORD_HAVE_CUDA
  int count = 0;
  // Any failure here means no usable device, whatever code CudaStatus gives it.
  if (absl::Status s = nccl::CudaStatus(cudaGetDeviceCount(&count), "cudaGetDeviceCount");
      !s.ok()) {
    return absl::FailedPreconditionError(absl::StrCat(kNoDevice, s.message()));
  }
  if (count <= 0) {
    return absl::FailedPreconditionError(
        absl::StrCat(kNoDevice, "cudaGetDeviceCount reports 0 devices"));
  }
  return count;
#else
  return absl::FailedPreconditionError(
      absl::StrCat(kNoDevice, "this binary was built without the CUDA toolkit"));
#endif
}

absl::StatusOr<BackendChoice> ChooseBackend(absl::string_view flag, const CudaDeviceProbe& probe) {
  BackendChoice choice;
  if (flag == "gloo") {
    choice.log_line = "backend gloo: selected by --backend";
    return choice;
  }
  if (flag != "nccl" && flag != "auto") {
    return absl::InvalidArgumentError(
        absl::StrCat("--backend '", flag, "' is not one of gloo, nccl, auto"));
  }
  absl::StatusOr<int> visible = probe();
  if (!visible.ok() || *visible <= 0) {
    std::string reason =
        visible.ok() ? "the probe found 0 devices" : std::string(visible.status().message());
    if (absl::StartsWith(reason, kNoDevice)) reason = reason.substr(kNoDevice.size());
    if (flag == "nccl") {
      return absl::FailedPreconditionError(absl::StrCat(kNoDevice, reason));
    }
    choice.log_line =
        absl::StrCat("backend auto: no CUDA device visible, using gloo (", reason, ")");
    return choice;
  }
  choice.backend = Backend::kNccl;
  choice.visible_devices = *visible;
  choice.log_line =
      flag == "auto"
          ? absl::StrCat("backend auto: ", *visible, " CUDA device(s) visible, using nccl")
          : absl::StrCat("backend nccl: ", *visible, " CUDA device(s) visible");
  return choice;
}

absl::StatusOr<int> ResolveDevice(int device_flag, int visible) {
  const int device = device_flag >= 0 ? device_flag : 0;
  if (device >= visible) {
    return absl::InvalidArgumentError(
        absl::StrCat("--device ", device, " but only ", visible, " CUDA device(s) are visible"));
  }
  return device;
}

absl::StatusOr<DeviceFlag> ParseDeviceFlag(absl::string_view flag) {
  DeviceFlag out;
  if (flag.empty()) return out;
  if (flag == "cpu") {
    out.cpu = true;
    return out;
  }
  absl::string_view number = flag;
  absl::ConsumePrefix(&number, "cuda:");
  int index = -1;
  if (number.empty() || number.size() > 6 || !absl::SimpleAtoi(number, &index) || index < 0 ||
      number.find_first_not_of("0123456789") != absl::string_view::npos) {
    return absl::InvalidArgumentError(
        absl::StrCat("--device '", flag, "' is not cpu, N or cuda:N"));
  }
  out.index = index;
  return out;
}

}  // namespace shardcoord
