#ifndef SHARDCOORD_TESTS_GPU_GPU_TEST_UTIL_H_
#define SHARDCOORD_TESTS_GPU_GPU_TEST_UTIL_H_

#include "absl/status/statusor.h"
#include "gtest/gtest.h"
#include "worker/comm/nccl/gpu_probe.h"

// Ends the test as SKIPPED, saying why, when this process sees no CUDA device: GPU tests
// run in every `bazel test //...` and pass trivially on machines without a GPU.
#define SHARDCOORD_SKIP_WITHOUT_GPU()                                        \
  do {                                                                       \
    absl::StatusOr<int> gpu_count_ = ::shardcoord::VisibleCudaDevices();     \
    if (!gpu_count_.ok()) {                                                  \
      GTEST_SKIP() << "GPU test skipped: " << gpu_count_.status().message(); \
    }                                                                        \
  } while (0)

// As above, and also skips unless at least `n` devices are visible (NCCL needs one GPU per
// rank of a communicator).
#define SHARDCOORD_SKIP_WITHOUT_GPUS(n)                                                     \
  do {                                                                                      \
    absl::StatusOr<int> gpu_count_ = ::shardcoord::VisibleCudaDevices();                    \
    if (!gpu_count_.ok()) {                                                                 \
      GTEST_SKIP() << "GPU test skipped: " << gpu_count_.status().message();                \
    }                                                                                       \
    if (*gpu_count_ < (n)) {                                                                \
      GTEST_SKIP() << "GPU test skipped: needs " << (n) << " CUDA devices, " << *gpu_count_ \
                   << " visible";                                                           \
    }                                                                                       \
  } while (0)

#endif  // SHARDCOORD_TESTS_GPU_GPU_TEST_UTIL_H_
