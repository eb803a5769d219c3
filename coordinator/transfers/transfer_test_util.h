#ifndef SHARDCOORD_COORDINATOR_TRANSFERS_TRANSFER_TEST_UTIL_H_
#define SHARDCOORD_COORDINATOR_TRANSFERS_TRANSFER_TEST_UTIL_H_

// The coordinator's managers as the composition root wires them for prepared transfers,
// without sockets: fake workers (coordinator/testing/fake_worker_client.h), a fake clock and
// timer, a state store of the test's choice. Six workers: mesh M (2x2) on ranks 0-3 holds
// the sources, mesh D (2) on ranks 4-5 the dsts.

#include <deque>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/clock.h"
#include "common/metrics.h"
#include "common/timer.h"
#include "coordinator/cluster/mesh_manager.h"
#include "coordinator/cluster/worker_manager.h"
#include "coordinator/plans/admission.h"
#include "coordinator/plans/coordinator_metrics.h"
#include "coordinator/state/tensor_manager.h"
#include "coordinator/store/state_store.h"
#include "coordinator/testing/fake_worker_client.h"
#include "coordinator/transfers/transfer_manager.h"
#include "gtest/gtest.h"

namespace shardcoord {

// One coordinator's managers over `store` (the workers' state lives in the shared client).
struct TransferBoot {
  TransferBoot(FakeClock* clock, FakeTimer* timer, WorkerClient* client, StateStore* store,
               CoordinatorMetrics* metrics, TransferManagerOptions options);
  // A new TransferManager with `options` (the old one goes).
  void Rebuild(TransferManagerOptions options);

  // Tells whichever TransferManager is current, as the root's one listener does.
  struct Forward : WorkerListener {
    std::unique_ptr<TransferManager>* to = nullptr;
    void OnWorkerLost(const WorkerRecord& w, const std::string& reason) override {
      (*to)->OnWorkerLost(w, reason);
    }
  };

  FakeClock* const clock;
  FakeTimer* const timer;
  WorkerClient* const client;  // Usually the test's FakeWorkerClient.
  StateStore* const store;
  CoordinatorMetrics* const metrics;
  WorkerManager workers;
  MeshManager meshes;
  TensorManager tensors;
  ClusterMemoryView memory;
  AdmissionController admission;
  std::unique_ptr<TransferManager> transfers;
  Forward forward;
};

// What Run's callbacks said.
struct RunResult {
  absl::Status started = absl::UnknownError("not started");
  std::optional<absl::Status> ended;
  v1::RunTransferResponse response;

  bool Committed() const {
    return started.ok() && ended.has_value() && ended->ok() && response.state() == v1::COMMITTED;
  }
  std::string Error() const {
    return absl::StrCat(started.ToString(), " / ", ended.has_value() ? ended->ToString() : "-");
  }
};

// Runs transfer `name` on `transfers`, its callbacks filling `*r` (which must outlive them).
void StartRun(TransferManager* transfers, const std::string& name, RunResult* r);

class TransferTest : public ::testing::Test {
 public:
  static TransferManagerOptions DefaultOptions();
  // The six workers registered (again, for tests of a restarted coordinator).
  static void RegisterWorkers(WorkerManager* workers);

 protected:
  TransferTest();

  void Rebuild() { boot_->Rebuild(options_); }
  // a.i: S(0),R on M, b.i: R on D, shape {8, 4} f32, for i < n.
  void CreateMembers(int n);
  void CreateTensorOn(const std::string& name, const std::string& mesh,
                      const std::string& placements, Shape shape);
  static std::vector<TransferCopy> Copies(int n);

  absl::StatusOr<v1::TransferInfo> Create(const std::string& name,
                                          std::vector<TransferCopy> copies);
  // Starts a run; with inline fakes it has ended when this returns unless runs are held.
  RunResult& RunNow(const std::string& name);
  // Everyone but `rank` heartbeats past the timeout; the health check declares it dead.
  void Kill(int64_t rank);

  FakeClock clock_;
  FakeTimer timer_{&clock_};
  Registry registry_;
  CoordinatorMetrics metrics_{&registry_};
  MemoryStateStore store_;
  FakeWorkerClient client_;
  TransferManagerOptions options_ = DefaultOptions();
  std::unique_ptr<TransferBoot> boot_;
  WorkerManager& workers_;
  MeshManager& meshes_;
  TensorManager& tensors_;
  std::unique_ptr<TransferManager>& transfers_;
  std::deque<RunResult> runs_;  // Stable addresses: callbacks fill them later.
};

}  // namespace shardcoord

#endif  // SHARDCOORD_COORDINATOR_TRANSFERS_TRANSFER_TEST_UTIL_H_
