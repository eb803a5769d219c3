#include "coordinator/cluster/worker_registration.h"

#include <string>
#include <vector>

#include "coordinator/store/state_store.h"
#include "coordinator/testing/flaky_store.h"
#include "gtest/gtest.h"

namespace shardcoord {
namespace {

class Listener : public WorkerListener {
 public:
  void OnWorkerLost(const WorkerRecord& w, const std::string& reason) override {
    lost.push_back(reason);
  }
  std::vector<std::string> lost;
};

TEST(WorkerRegistrationTest, RegistersAndReconciles) {
  FakeClock clock;
  WorkerManager workers(&clock, absl::Seconds(5));
  MeshManager meshes(&workers);
  TensorManager tensors(&meshes);
  WorkerRegistration registration(&workers, &tensors);
  HeldBuffer stale;
  stale.tensor = "gone";
  stale.version = 3;
  absl::StatusOr<WorkerRegistration::Registered> r =
      registration.Register(WorkerSpec{"w0", "h", "cpu", "w0:1", "gloo"}, {stale});
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->worker.rank, 0);
  EXPECT_TRUE(r->worker.alive);
  // A tensor that does not exist: the worker drops its buffer.
  ASSERT_EQ(r->drop.size(), 1u);
  EXPECT_EQ(r->drop[0].first, "gone");
  EXPECT_EQ(r->drop[0].second, 3);
}

TEST(WorkerRegistrationTest, AFailedReconcileRollsTheIncarnationBack) {
  FakeClock clock;
  FlakyStore store;
  WorkerManager workers(&clock, absl::Seconds(5));  // Ranks in memory: only tensors fail.
  MeshManager meshes(&workers);
  TensorManager tensors(&meshes, &store);
  Listener listener;
  workers.AddListener(&listener);
  WorkerRegistration registration(&workers, &tensors);
  store.down = true;
  HeldBuffer held;
  held.tensor = "gone";
  absl::StatusOr<WorkerRegistration::Registered> r =
      registration.Register(WorkerSpec{"w0", "h", "cpu", "w0:1", "gloo"}, {held});
  EXPECT_EQ(r.status().code(), absl::StatusCode::kUnavailable) << r.status();
  absl::StatusOr<WorkerRecord> w = workers.Get("w0");
  ASSERT_TRUE(w.ok());
  EXPECT_FALSE(w->alive);  // Nothing may use the incarnation the worker never learned.
  ASSERT_EQ(listener.lost.size(), 1u);
  EXPECT_NE(listener.lost[0].find("registration failed: "), std::string::npos);
  // The worker's retry registers afresh, under the same rank.
  store.down = false;
  r = registration.Register(WorkerSpec{"w0", "h", "cpu", "w0:1", "gloo"}, {held});
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->worker.rank, 0);
  EXPECT_GT(r->worker.incarnation, w->incarnation);
  EXPECT_TRUE(r->worker.alive);
}

}  // namespace
}  // namespace shardcoord
