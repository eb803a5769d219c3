#ifndef SHARDCOORD_COORDINATOR_TESTING_CLUSTER_FIXTURE_H_
#define SHARDCOORD_COORDINATOR_TESTING_CLUSTER_FIXTURE_H_

#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <set>
#include <string>

#include "absl/status/status.h"
#include "common/clock.h"
#include "common/timer.h"
#include "coordinator/cluster/mesh_manager.h"
#include "coordinator/cluster/worker_manager.h"
#include "coordinator/plans/plan_manager.h"
#include "coordinator/state/tensor_manager.h"
#include "coordinator/testing/fake_reports.h"
#include "coordinator/testing/fake_worker_client.h"
#include "gtest/gtest.h"
#include "proto/shardcoord.pb.h"

namespace shardcoord {

// Registers w<i> for i < n (host "h", cpu, gloo, address "w<i>:1"), each spec passed to
// `edit` first where given (a budget, a bucket size).
void RegisterTestWorkers(WorkerManager* workers, int n,
                         const std::function<void(WorkerSpec&)>& edit = nullptr);

// Reserves and finishes a ready f32-by-default tensor `placements` on `mesh`, each rank
// holding its chunks with checksum 1000 + the first chunk's row offset (replicas agree).
void CreateTestTensor(const WorkerManager& workers, const MeshManager& meshes,
                      TensorManager* tensors, const std::string& name,
                      const std::string& placements, const std::string& mesh, Shape shape,
                      DType dtype = DType::kF32);

// A target spec: `placements` on `mesh` ("": the tensor's own mesh).
Spec TestSpec(const std::string& placements, const std::string& mesh = "");

// How a plan ended, as its DoneCallback said.
struct PlanOutcome {
  absl::Status status;
  PlanProgress progress;
};

// The cluster state that the coordinator's unit tests build on, as the composition root
// wires it but without a store: a fake clock and timer, the worker, mesh and tensor managers
// (heartbeat timeout 5 s), and fake workers behind `client_`. A test's fixture derives from
// it and declares the managers it tests, which are built after these.
class ClusterFixture : public ::testing::Test {
 protected:
  ClusterFixture();

  void RegisterWorkers(int n, const std::function<void(WorkerSpec&)>& edit = nullptr) {
    RegisterTestWorkers(&workers_, n, edit);
  }
  int64_t Incarnation(int64_t rank) { return workers_.GetByRank(rank)->incarnation; }

  // A plan's DoneCallback that keeps how it ended in `*out`.
  static PlanManager::DoneCallback Record(std::optional<PlanOutcome>* out) {
    return [out](const absl::Status& s, const PlanProgress& p) { *out = PlanOutcome{s, p}; };
  }

  // The fragments sent for `plan_id`, by rank.
  std::map<int64_t, v1::PlanFragment> Fragments(const std::string& plan_id);
  // What the worker at `f`'s rank reports once it has run `f` correctly (fake_reports.h).
  WorkerReport FinalReport(const v1::PlanFragment& f,
                           const FakeChecksumFn& checksum = DefaultFakeChecksum);
  // From now on every fragment sent is run correctly at once: its rank reports to `plans` what
  // FinalReport (or, for a fused group's fragment, FakeFusedFinalReport) says.
  void AnswerEveryFragment(PlanManager* plans);
  // Every rank of `plan_id` but those in `skip` reports FinalReport to `plans`.
  void ReportAll(PlanManager* plans, const std::string& plan_id,
                 const FakeChecksumFn& checksum = DefaultFakeChecksum,
                 const std::set<int64_t>& skip = {});

  // Creates tensor `name` (`placements` on `mesh`) with real buffers on the fake workers:
  // each rank's chunks filled with arange through client_.Fill, finished with the checksums
  // the fills answered (unlike CreateTestTensor's made-up ones).
  void CreateFilled(const std::string& name, const std::string& placements, const std::string& mesh,
                    Shape shape, DType dtype = DType::kF32);

  // Everyone but `rank` heartbeats past the timeout; then the health check runs.
  void Kill(int64_t rank);

  FakeClock clock_;
  FakeTimer timer_;
  WorkerManager workers_;
  MeshManager meshes_;
  TensorManager tensors_;
  FakeWorkerClient client_;
};

}  // namespace shardcoord

#endif  // SHARDCOORD_COORDINATOR_TESTING_CLUSTER_FIXTURE_H_
