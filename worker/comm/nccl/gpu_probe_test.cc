#include "worker/comm/nccl/gpu_probe.h"

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"

namespace shardcoord {
namespace {

CudaDeviceProbe NoGpu() {
  return [] {
    return absl::StatusOr<int>(absl::FailedPreconditionError(
        "no CUDA device visible: CUDA driver version is insufficient for CUDA runtime version"));
  };
}

CudaDeviceProbe Gpus(int n) {
  return [n] { return absl::StatusOr<int>(n); };
}

// ChooseBackend(flag, probe) must choose `backend` and log `log_line`. The choice, for further
// checks (a default one when there was none).
BackendChoice ExpectChoice(absl::string_view flag, const CudaDeviceProbe& probe, Backend backend,
                           absl::string_view log_line) {
  absl::StatusOr<BackendChoice> c = ChooseBackend(flag, probe);
  EXPECT_TRUE(c.ok()) << c.status();
  if (!c.ok()) return BackendChoice{};
  EXPECT_EQ(c->backend, backend);
  EXPECT_EQ(c->log_line, log_line);
  return *c;
}

TEST(ChooseBackendTest, AutoWithoutGpuPicksGlooAndSaysWhy) {
  ExpectChoice("auto", NoGpu(), Backend::kGloo,
               "backend auto: no CUDA device visible, using gloo (CUDA driver version is "
               "insufficient for CUDA runtime version)");
}

TEST(ChooseBackendTest, AutoWithGpusPicksNccl) {
  const BackendChoice c = ExpectChoice("auto", Gpus(2), Backend::kNccl,
                                       "backend auto: 2 CUDA device(s) visible, using nccl");
  EXPECT_EQ(c.visible_devices, 2);
}

TEST(ChooseBackendTest, NcclWithoutGpuIsOneClearLine) {
  absl::StatusOr<BackendChoice> c = ChooseBackend("nccl", NoGpu());
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(c.status().message(),
            "no CUDA device visible: CUDA driver version is insufficient for CUDA runtime "
            "version");
}

TEST(ChooseBackendTest, NcclWithGpu) {
  ExpectChoice("nccl", Gpus(1), Backend::kNccl, "backend nccl: 1 CUDA device(s) visible");
}

TEST(ChooseBackendTest, ProbeErrorWithoutPrefixIsQuotedWhole) {
  CudaDeviceProbe probe = [] { return absl::StatusOr<int>(absl::InternalError("driver crashed")); };
  absl::StatusOr<BackendChoice> c = ChooseBackend("auto", probe);
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(c->log_line, "backend auto: no CUDA device visible, using gloo (driver crashed)");
  EXPECT_EQ(ChooseBackend("nccl", probe).status().message(),
            "no CUDA device visible: driver crashed");
}

TEST(ChooseBackendTest, GlooNeverProbes) {
  bool probed = false;
  CudaDeviceProbe probe = [&probed] {
    probed = true;
    return absl::StatusOr<int>(1);
  };
  absl::StatusOr<BackendChoice> c = ChooseBackend("gloo", probe);
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(c->backend, Backend::kGloo);
  EXPECT_FALSE(probed);
}

TEST(ChooseBackendTest, UnknownFlagIsInvalid) {
  absl::StatusOr<BackendChoice> c = ChooseBackend("mpi", Gpus(1));
  EXPECT_EQ(c.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(c.status().message(), "--backend 'mpi' is not one of gloo, nccl, auto");
}

TEST(VisibleCudaDevicesTest, EitherCountsDevicesOrSaysNoneVisible) {
  // Runs on every machine: a GPU machine sees >= 1; elsewhere the one-line error.
  absl::StatusOr<int> n = VisibleCudaDevices();
  if (n.ok()) {
    EXPECT_GE(*n, 1);
  } else {
    EXPECT_EQ(n.status().code(), absl::StatusCode::kFailedPrecondition);
    EXPECT_EQ(n.status().message().rfind("no CUDA device visible: ", 0), 0u) << n.status();
    EXPECT_GT(n.status().message().size(), std::string("no CUDA device visible: ").size());
  }
}

TEST(ResolveDeviceTest, DefaultsToFirstVisibleAndChecksRange) {
  EXPECT_EQ(*ResolveDevice(-1, 4), 0);
  EXPECT_EQ(*ResolveDevice(3, 4), 3);
  absl::StatusOr<int> bad = ResolveDevice(4, 4);
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(bad.status().message(), "--device 4 but only 4 CUDA device(s) are visible");
}

TEST(ParseDeviceFlagTest, AcceptsNCudaNAndCpu) {
  absl::StatusOr<DeviceFlag> d = ParseDeviceFlag("");
  ASSERT_TRUE(d.ok());
  EXPECT_FALSE(d->cpu);
  EXPECT_EQ(d->index, -1);
  d = ParseDeviceFlag("3");
  ASSERT_TRUE(d.ok());
  EXPECT_EQ(d->index, 3);
  d = ParseDeviceFlag("cuda:1");
  ASSERT_TRUE(d.ok());
  EXPECT_FALSE(d->cpu);
  EXPECT_EQ(d->index, 1);
  d = ParseDeviceFlag("cpu");
  ASSERT_TRUE(d.ok());
  EXPECT_TRUE(d->cpu);
  for (const char* bad : {"gpu", "cuda:", "-1", "cuda:-2", "1x", "+1", "cuda:1:2"}) {
    absl::StatusOr<DeviceFlag> b = ParseDeviceFlag(bad);
    EXPECT_EQ(b.status().code(), absl::StatusCode::kInvalidArgument) << bad;
    EXPECT_EQ(b.status().message(), absl::StrCat("--device '", bad, "' is not cpu, N or cuda:N"));
  }
}

}  // namespace
}  // namespace shardcoord
