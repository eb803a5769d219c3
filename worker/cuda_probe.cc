#include "worker/cuda_probe.h"

#include <dlfcn.h>

#include "absl/strings/str_cat.h"

namespace shardcoord {

int CountVisibleCudaDevices(std::string* why) {
  void* lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
  if (lib == nullptr) {
    if (why != nullptr) *why = "no CUDA driver (libcuda.so.1 not found)";
    return 0;
  }
  using InitFn = int (*)(unsigned int);
  using CountFn = int (*)(int*);
  auto init = reinterpret_cast<InitFn>(dlsym(lib, "cuInit"));
  auto count = reinterpret_cast<CountFn>(dlsym(lib, "cuDeviceGetCount"));
  int devices = 0;
  if (init == nullptr || count == nullptr) {
    if (why != nullptr) *why = "libcuda.so.1 lacks cuInit/cuDeviceGetCount";
  } else if (int rc = init(0); rc != 0) {
    if (why != nullptr) *why = absl::StrCat("cuInit failed with CUDA error ", rc);
  } else if (int rc2 = count(&devices); rc2 != 0) {
    devices = 0;
    if (why != nullptr) *why = absl::StrCat("cuDeviceGetCount failed with CUDA error ", rc2);
  } else if (why != nullptr) {
    *why = absl::StrCat(devices, " CUDA device(s) visible");
  }
  // The driver stays loaded: unloading it under a live CUDA context is not safe.
  return devices;
}

}  // namespace shardcoord
