#ifndef SHARDCOORD_BENCH_COORDINATOR_LOGIC_H_
#define SHARDCOORD_BENCH_COORDINATOR_LOGIC_H_

// The coordinator's plan logic in one process, for benches that time its CPU with the workers
// played by fakes: PlanManager, the worker, mesh and tensor managers, admission and metrics,
// composed as coordinator.cc composes them, on a fake clock and timer.

#include <string>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "common/clock.h"
#include "common/metrics.h"
#include "common/timer.h"
#include "coordinator/cluster/mesh_manager.h"
#include "coordinator/cluster/worker_client.h"
#include "coordinator/cluster/worker_manager.h"
#include "coordinator/plans/admission.h"
#include "coordinator/plans/coordinator_metrics.h"
#include "coordinator/plans/plan_manager.h"
#include "coordinator/state/tensor_manager.h"
#include "coordinator/store/state_store.h"

namespace shardcoord {
namespace bench {

// The base of the fake workers: they write Execute and FinishPlan; the other calls of a plan
// that these benches never make (Fill, DropTensor, ReadChunk, WriteChunk) are UNIMPLEMENTED.
class PlanOnlyWorkerClient : public WorkerClient {
 public:
  void Fill(const WorkerEndpoint&, const v1::FillRequest&,
            Callback<v1::FillResponse> done) override {
    done(absl::UnimplementedError("Fill"));
  }
  void DropTensor(const WorkerEndpoint&, const v1::DropTensorRequest&,
                  StatusCallback done) override {
    done(absl::UnimplementedError("DropTensor"));
  }
  void ReadChunk(const WorkerEndpoint&, const v1::ReadChunkRequest&,
                 Callback<std::string> done) override {
    done(absl::UnimplementedError("ReadChunk"));
  }
  void WriteChunk(const WorkerEndpoint&, const v1::ChunkData&, std::string,
                  Callback<v1::WriteChunkResponse> done) override {
    done(absl::UnimplementedError("WriteChunk"));
  }
};

class CoordinatorLogic {
 public:
  // Fragments go to `client` (the fake workers, outliving this); the managers keep their
  // state in `store` (nullptr: none); a plan times out after `plan_timeout` of the fake clock.
  CoordinatorLogic(WorkerClient* client, StateStore* store, absl::Duration plan_timeout);

  WorkerManager& workers() { return workers_; }
  MeshManager& meshes() { return meshes_; }
  TensorManager& tensors() { return tensors_; }
  PlanManager& plans() { return plans_; }

 private:
  PlanManagerOptions Options(absl::Duration plan_timeout);

  FakeClock clock_;
  FakeTimer timer_;
  WorkerManager workers_;
  MeshManager meshes_;
  TensorManager tensors_;
  ClusterMemoryView view_;
  AdmissionController admission_;
  Registry registry_;
  CoordinatorMetrics metrics_{&registry_};
  PlanManager plans_;
};

}  // namespace bench
}  // namespace shardcoord

#endif  // SHARDCOORD_BENCH_COORDINATOR_LOGIC_H_
