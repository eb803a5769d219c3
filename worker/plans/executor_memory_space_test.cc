// The executor with its buffers in a device memory space: real fragments over in-process
// Gloo communicators (standing in for NCCL, which reads device pointers too), with every
// rank's buffers in its own FakeDeviceMemorySpace. The fake checks every pointer the
// executor hands it, runs its work only when synchronised (as a CUDA stream would), and
// counts host<->device copies, so these tests catch host code touching device memory, a
// missing Synchronize before a communicator call, and hidden round trips through the host.
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "proto/convert.h"
#include "sharding/fill.h"
#include "sharding/layout.h"
#include "sharding/mesh.h"
#include "sharding/placement.h"
#include "sharding/planner.h"
#include "worker/buffers/buffer_store.h"
#include "worker/buffers/checksum.h"
#include "worker/comm/gloo/gloo_communicator.h"
#include "worker/control/kv_client.h"
#include "worker/memory/memory_space.h"
#include "worker/plans/executor.h"
#include "worker/plans/fragment.h"
#include "worker/testing/executor_test_util.h"
#include "worker/testing/fake_device_memory_space.h"

namespace shardcoord {
namespace {

using executor_testing::Fragments;
using executor_testing::MakeLayout;
using executor_testing::MakeSource;

constexpr int kRanks = 4;

struct Cluster : executor_testing::GlooCluster {
  explicit Cluster(bool nccl_like = false) : GlooCluster(kRanks, nccl_like) {}
};

// One fake GPU per rank.
struct Devices : executor_testing::FakeDevices {
  Devices() : FakeDevices(kRanks) {}
};

struct RunOutput {
  std::vector<absl::StatusOr<ExecuteResult>> results;
  std::vector<std::shared_ptr<HostBuffer>> targets;
  std::vector<std::string> bytes;  // Every target buffer, read back to the host.
  std::set<StepOp> methods;
};

// Runs the plan's fragments on threads, buffers in `devices` (null: host memory).
RunOutput RunPlan(Cluster& cluster, const Plan& plan, const std::string& id,
                  ExecutorOptions options, Devices* devices) {
  RunOutput out;
  out.targets.resize(kRanks);
  out.bytes.resize(kRanks);
  std::vector<Fragment> fragments(kRanks);
  std::vector<std::shared_ptr<HostBuffer>> sources(kRanks);
  std::vector<FakeDeviceMemorySpace::Stats> before(kRanks);
  const std::vector<v1::PlanFragment> protos = Fragments(plan, id, kRanks);
  for (int r = 0; r < kRanks; ++r) {
    MemorySpace* space = devices != nullptr ? devices->at(r) : nullptr;
    fragments[r] = *ParseFragment(protos[r]);
    sources[r] = MakeSource(plan.source, r, plan.dtype, space);
    out.targets[r] = *HostBuffer::Create(fragments[r].shapes[0].target_dtype(),
                                         fragments[r].shapes[0].target, space);
    if (devices != nullptr) before[r] = devices->spaces[r]->stats();
  }
  out.results =
      executor_testing::ExecuteOnThreads(cluster, fragments, sources, out.targets, options);
  out.methods = executor_testing::MethodsOf(out.results);
  for (int r = 0; r < kRanks; ++r) {
    if (!out.results[r].ok()) continue;
    HostBuffer& target = *out.targets[r];
    out.bytes[r].resize(static_cast<size_t>(target.bytes()));
    if (devices == nullptr) {
      std::memcpy(out.bytes[r].data(), target.data(), out.bytes[r].size());
      continue;
    }
    const FakeDeviceMemorySpace::Stats after = devices->spaces[r]->stats();
    // Everything ran in device memory: no round trip through the host (but for the
    // conversions of a plan that casts, which a space without a kernel stages on the host).
    if (!plan.cast_to.has_value()) {
      EXPECT_EQ(after.copies_to_device, before[r].copies_to_device) << "rank " << r;
      EXPECT_EQ(after.copies_to_host, before[r].copies_to_host) << "rank " << r;
    }
    EXPECT_EQ(after.checksums - before[r].checksums,
              static_cast<int64_t>(fragments[r].shapes[0].target.chunks.size()))
        << "rank " << r;
    EXPECT_TRUE(
        devices->at(r)->CopyToHost(out.bytes[r].data(), target.data(), target.bytes()).ok());
  }
  return out;
}

// Every element of every target chunk, from the bytes read back, and the checksums.
void CheckTarget(const Plan& plan, const RunOutput& out) {
  const int64_t esize = ElementSize(plan.dtype);
  executor_testing::CheckTargets(
      plan.source, plan.target, plan.dtype, out.results, [&](int r, size_t k) {
        const Chunk& c = plan.target.Find(r)->chunks[k];
        return absl::string_view(out.bytes[r].data() + c.local_offset * esize,
                                 c.box.Volume() * esize);
      });
}

struct Case {
  std::string name;
  Shape mesh_from, mesh_to;
  std::string from, to;
  Shape shape;
  DType dtype = DType::kF32;
  std::vector<int64_t> ranks_from = {};  // Empty: 0..n-1.
};

enum class Mode { kDefault, kCopyCollectives, kPointToPoint };

// Runs `c` in host memory and in fake device memory, checks both and that the checksums
// agree; returns the methods the device run used.
std::set<StepOp> RunBoth(Cluster& cluster, const Case& c, Mode mode, int serial) {
  SCOPED_TRACE(absl::StrCat(c.name, mode == Mode::kPointToPoint      ? " (point-to-point)"
                                    : mode == Mode::kCopyCollectives ? " (copy collectives)"
                                                                     : ""));
  Layout a = MakeLayout(c.mesh_from, c.ranks_from, c.from, c.shape);
  Layout b = MakeLayout(c.mesh_to, {}, c.to, c.shape);
  absl::StatusOr<Plan> plan = Redistribute(a, b, c.dtype);
  EXPECT_TRUE(plan.ok()) << plan.status();
  if (!plan.ok()) return {};
  ExecutorOptions options;
  options.force_point_to_point = mode == Mode::kPointToPoint;
  options.force_copy_collectives = mode == Mode::kCopyCollectives;
  RunOutput host = RunPlan(cluster, *plan, absl::StrCat("h", serial), options, nullptr);
  CheckTarget(*plan, host);
  Devices devices;
  RunOutput device;
  {
    device = RunPlan(cluster, *plan, absl::StrCat("d", serial), options, &devices);
    CheckTarget(*plan, device);
    for (int r = 0; r < kRanks; ++r) {
      if (!host.results[r].ok() || !device.results[r].ok()) continue;
      EXPECT_EQ(device.results[r]->checksums, host.results[r]->checksums) << "rank " << r;
      EXPECT_EQ(device.bytes[r].size(), host.bytes[r].size());
    }
    device.targets.clear();  // Freed before the spaces go.
  }
  return device.methods;
}

const std::vector<Case>& Cases() {
  static const std::vector<Case>* cases = new std::vector<Case>{
      {"1d S(0)->S(1)", {4}, {4}, "S(0)", "S(1)", {16, 12}},
      {"1d S(0)->R", {4}, {4}, "S(0)", "R", {10, 6}},
      {"1d R->S(1) bf16", {4}, {4}, "R", "S(1)", {4, 8}, DType::kBF16},
      {"1d P(sum)->R", {4}, {4}, "P(sum)", "R", {6, 5}},
      {"1d P(sum)->R large", {4}, {4}, "P(sum)", "R", {256, 512}},
      {"1d P(sum)->S(0) i32", {4}, {4}, "P(sum)", "S(0)", {8, 3}, DType::kI32},
      {"1d P(max)->S(1)", {4}, {4}, "P(max)", "S(1)", {5, 8}},
      {"1d P(min)->R i64", {4}, {4}, "P(min)", "R", {3, 3}, DType::kI64},
      {"1d P(avg)->R f64", {4}, {4}, "P(avg)", "R", {4, 5}, DType::kF64},
      {"1d S(0)->P(sum)", {4}, {4}, "S(0)", "P(sum)", {8, 2}},
      {"2x2 S(0),R->R,S(1)", {2, 2}, {2, 2}, "S(0),R", "R,S(1)", {12, 10}},
      {"2x2 P(sum),P(sum)->R,S(0)", {2, 2}, {2, 2}, "P(sum),P(sum)", "R,S(0)", {6, 4}},
      {"uneven S(0)->S(1)", {4}, {4}, "S(0,[1,6,0,2])", "S(1)", {9, 7}},
      {"flat->S(1) 3d u8",
       {4},
       {4},
       "flat 0:10;10:50;50:100;100:120",
       "S(1)",
       {4, 5, 6},
       DType::kU8},
      {"cross-mesh 1 rank R -> 4 ranks R", {1}, {4}, "R", "R", {7, 9}, DType::kF32, {2}},
  };
  return *cases;
}

TEST(ExecutorMemorySpaceTest, FragmentsInDeviceMemoryMatchHostMemory) {
  Cluster cluster;
  std::set<StepOp> used;
  int serial = 0;
  for (const Case& c : Cases()) {
    for (Mode mode : {Mode::kDefault, Mode::kCopyCollectives, Mode::kPointToPoint}) {
      std::set<StepOp> m = RunBoth(cluster, c, mode, serial++);
      used.insert(m.begin(), m.end());
    }
  }
  for (StepOp m : {StepOp::kAllToAll, StepOp::kAllGather, StepOp::kAllReduce,
                   StepOp::kReduceScatter, StepOp::kBroadcast, StepOp::kPointToPoint}) {
    EXPECT_TRUE(used.count(m)) << StepOpName(m) << " never ran on device buffers";
  }
}

// Plans that cast: the default MemorySpace::CastBox (staged through host memory, as a device
// without a conversion kernel does) gives the host's bytes and checksums in every method.
TEST(ExecutorMemorySpaceTest, CastsInDeviceMemoryMatchHostMemory) {
  struct CastCase {
    Shape mesh_from, mesh_to;
    std::string from, to;
    DType src, dst;
  };
  const CastCase cases[] = {
      {{4}, {4}, "S(0)", "S(1)", DType::kF32, DType::kBF16},
      {{2, 2}, {2, 2}, "S(0),R", "R,S(1)", DType::kF32, DType::kF8E4M3},
      {{4}, {2, 2}, "R", "S(1),S(0)", DType::kBF16, DType::kF32},
      {{4}, {4}, "S(1)", "R", DType::kI32, DType::kI64},
  };
  Cluster cluster;
  int serial = 0;
  for (const CastCase& c : cases) {
    for (Mode mode : {Mode::kDefault, Mode::kCopyCollectives, Mode::kPointToPoint}) {
      SCOPED_TRACE(absl::StrCat(DTypeName(c.src), " -> ", DTypeName(c.dst), " ", c.from, " -> ",
                                c.to, " mode ", static_cast<int>(mode)));
      Layout a = MakeLayout(c.mesh_from, {}, c.from, {12, 10});
      Layout b = MakeLayout(c.mesh_to, {}, c.to, {12, 10});
      absl::StatusOr<Plan> plan = Redistribute(a, b, c.src, c.dst, {});
      ASSERT_TRUE(plan.ok()) << plan.status();
      ExecutorOptions options;
      options.force_point_to_point = mode == Mode::kPointToPoint;
      options.force_copy_collectives = mode == Mode::kCopyCollectives;
      RunOutput host = RunPlan(cluster, *plan, absl::StrCat("ch", serial), options, nullptr);
      Devices devices;
      RunOutput device = RunPlan(cluster, *plan, absl::StrCat("cd", serial), options, &devices);
      ++serial;
      for (int r = 0; r < kRanks; ++r) {
        ASSERT_TRUE(host.results[r].ok()) << host.results[r].status();
        ASSERT_TRUE(device.results[r].ok()) << device.results[r].status();
        EXPECT_EQ(device.results[r]->checksums, host.results[r]->checksums) << "rank " << r;
        EXPECT_TRUE(device.bytes[r] == host.bytes[r]) << "rank " << r;
        if (b.Find(r) != nullptr) EXPECT_EQ(host.targets[r]->dtype(), c.dst);
      }
      device.targets.clear();  // Freed before the spaces go.
    }
  }
}

// NCCL runs copies as collectives and leaves the hooks to SendRecvWithHooks: the
// synchronisation must hold on that path too.
TEST(ExecutorMemorySpaceTest, BackendThatDoesNotRunHooks) {
  Cluster cluster(/*nccl_like=*/true);
  int serial = 0;
  for (const Case& c : Cases()) {
    for (Mode mode : {Mode::kDefault, Mode::kPointToPoint}) RunBoth(cluster, c, mode, serial++);
  }
}

TEST(ExecutorMemorySpaceTest, GatherToOneRank) {
  Cluster cluster;
  Layout a = MakeLayout({2, 2}, {}, "S(0),S(1)", {6, 6});
  absl::StatusOr<Plan> plan = Gather(a, {2}, DType::kF32);
  ASSERT_TRUE(plan.ok()) << plan.status();
  RunOutput host = RunPlan(cluster, *plan, "gather-h", {}, nullptr);
  CheckTarget(*plan, host);
  Devices devices;
  RunOutput device = RunPlan(cluster, *plan, "gather-d", {}, &devices);
  CheckTarget(*plan, device);
  ASSERT_TRUE(device.results[2].ok());
  EXPECT_EQ(device.results[2]->checksums, host.results[2]->checksums);
  EXPECT_TRUE(devices.spaces[2]->Owns(device.targets[2]->data(), device.targets[2]->bytes()));
  device.targets.clear();
}

TEST(ExecutorMemorySpaceTest, SourceInAnotherSpaceIsFailedPrecondition) {
  Layout a = MakeLayout({4}, {}, "S(0)", {8, 4});
  Layout b = MakeLayout({4}, {}, "S(1)", {8, 4});
  Plan plan = *Redistribute(a, b, DType::kF32);
  Fragment f = *ParseFragment(Fragments(plan, "spaces")[1]);
  FakeDeviceMemorySpace space("fake-cuda:1");
  auto source = MakeSource(a, 1, DType::kF32, nullptr);  // Host memory.
  auto target = *HostBuffer::Create(f.shapes[0].dtype, f.shapes[0].target, &space);
  Cluster cluster;
  ExecuteInput in;
  in.fragment = &f;
  in.source = source.get();
  in.target = target.get();
  in.communicators = cluster.caches[1].get();
  absl::StatusOr<ExecuteResult> r = ExecuteFragment(in);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kFailedPrecondition) << r.status();
  EXPECT_NE(r.status().message().find("in host but its target buffer is in fake-cuda:1"),
            std::string::npos)
      << r.status();
}

TEST(ExecutorMemorySpaceTest, StagingOutOfDeviceMemoryIsResourceExhausted) {
  Layout a = MakeLayout({4}, {}, "P(sum)", {64, 64});
  Layout b = MakeLayout({4}, {}, "R", {64, 64});
  Plan plan = *Redistribute(a, b, DType::kF32);
  Devices devices;
  std::vector<std::shared_ptr<HostBuffer>> sources, targets;
  std::vector<Fragment> fragments;
  for (int r = 0; r < kRanks; ++r) {
    fragments.push_back(*ParseFragment(Fragments(plan, "oom")[r]));
    sources.push_back(MakeSource(a, r, DType::kF32, devices.at(r)));
    targets.push_back(
        *HostBuffer::Create(DType::kF32, fragments[r].shapes[0].target, devices.at(r)));
    devices.spaces[r]->set_capacity(devices.spaces[r]->stats().live_bytes);  // Full.
  }
  Cluster cluster;
  const std::vector<absl::StatusOr<ExecuteResult>> results =
      executor_testing::ExecuteOnThreads(cluster, fragments, sources, targets, ExecutorOptions());
  for (int r = 0; r < kRanks; ++r) {
    EXPECT_EQ(results[r].status().code(), absl::StatusCode::kResourceExhausted)
        << results[r].status();
    EXPECT_NE(results[r].status().message().find("bytes of staging memory"), std::string::npos)
        << results[r].status();
  }
  sources.clear();
  targets.clear();
}

}  // namespace
}  // namespace shardcoord
