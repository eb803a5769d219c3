#include "worker/comm/nccl/cuda_status.h"

#include <string>

#include "gtest/gtest.h"

namespace shardcoord {
namespace nccl {
namespace {

TEST(CudaStatusTest, SuccessIsOk) { EXPECT_TRUE(CudaStatus(cudaSuccess, "cudaMalloc").ok()); }

TEST(CudaStatusTest, MessageNamesTheCallAndCudasError) {
  absl::Status s = CudaStatus(cudaErrorInvalidValue, "cudaMemcpy to host");
  EXPECT_EQ(s.code(), absl::StatusCode::kInternal);
  EXPECT_EQ(s.message(), std::string("cudaMemcpy to host: cudaErrorInvalidValue: ") +
                             cudaGetErrorString(cudaErrorInvalidValue));
}

TEST(CudaStatusTest, CodesByCause) {
  EXPECT_EQ(CudaStatus(cudaErrorMemoryAllocation, "x").code(),
            absl::StatusCode::kResourceExhausted);
  for (cudaError_t err : {cudaErrorNoDevice, cudaErrorInsufficientDriver, cudaErrorInvalidDevice,
                          cudaErrorDevicesUnavailable, cudaErrorInitializationError}) {
    EXPECT_EQ(CudaStatus(err, "x").code(), absl::StatusCode::kFailedPrecondition)
        << cudaGetErrorName(err);
  }
  EXPECT_EQ(CudaStatus(cudaErrorLaunchFailure, "x").code(), absl::StatusCode::kInternal);
}

}  // namespace
}  // namespace nccl
}  // namespace shardcoord
