#include "coordinator/transfers/transfer_test_util.h"

#include <utility>

#include "coordinator/testing/cluster_fixture.h"

namespace shardcoord {

TransferBoot::TransferBoot(FakeClock* clock, FakeTimer* timer, WorkerClient* client,
                           StateStore* store, CoordinatorMetrics* metrics,
                           TransferManagerOptions options)
    : clock(clock),
      timer(timer),
      client(client),
      store(store),
      metrics(metrics),
      workers(clock, absl::Seconds(5), store),
      meshes(&workers, store),
      tensors(&meshes, store),
      memory(&workers, &tensors),
      admission(clock, timer, &memory) {
  memory.set_controller(&admission);
  forward.to = &transfers;
  workers.AddListener(&forward);
  Rebuild(std::move(options));
}

void TransferBoot::Rebuild(TransferManagerOptions options) {
  options.admission = &admission;
  options.metrics = metrics;
  transfers.reset();
  transfers = std::make_unique<TransferManager>(clock, timer, &workers, &tensors, client, store,
                                                std::move(options));
}

TransferTest::TransferTest()
    : boot_(
          std::make_unique<TransferBoot>(&clock_, &timer_, &client_, &store_, &metrics_, options_)),
      workers_(boot_->workers),
      meshes_(boot_->meshes),
      tensors_(boot_->tensors),
      transfers_(boot_->transfers) {
  RegisterWorkers(&workers_);
  EXPECT_TRUE(meshes_.Create("M", {2, 2}, {}, {"w0", "w1", "w2", "w3"}).ok());
  EXPECT_TRUE(meshes_.Create("D", {2}, {}, {"w4", "w5"}).ok());
}

TransferManagerOptions TransferTest::DefaultOptions() {
  TransferManagerOptions o;
  o.run_timeout = absl::Minutes(1);
  return o;
}

void TransferTest::RegisterWorkers(WorkerManager* workers) {
  for (int i = 0; i < 6; ++i) {
    const std::string name = absl::StrCat("w", i);
    EXPECT_TRUE(
        workers->Register(WorkerSpec{name, absl::StrCat("h", i / 2), "cpu", name + ":1", "gloo"})
            .ok());
  }
}

void TransferTest::CreateTensorOn(const std::string& name, const std::string& mesh,
                                  const std::string& placements, Shape shape) {
  CreateTestTensor(workers_, meshes_, &tensors_, name, placements, mesh, std::move(shape));
}

void TransferTest::CreateMembers(int n) {
  for (int i = 0; i < n; ++i) {
    CreateTensorOn(absl::StrCat("a.", i), "M", "S(0),R", {8, 4});
    CreateTensorOn(absl::StrCat("b.", i), "D", "R", {8, 4});
  }
}

std::vector<TransferCopy> TransferTest::Copies(int n) {
  std::vector<TransferCopy> out;
  for (int i = 0; i < n; ++i) out.push_back({absl::StrCat("a.", i), absl::StrCat("b.", i)});
  return out;
}

absl::StatusOr<v1::TransferInfo> TransferTest::Create(const std::string& name,
                                                      std::vector<TransferCopy> copies) {
  std::optional<absl::StatusOr<v1::TransferInfo>> out;
  transfers_->Create(name, std::move(copies),
                     [&out](absl::StatusOr<v1::TransferInfo> info) { out = std::move(info); });
  // Inline fakes, no preparation threads: it has answered.
  EXPECT_TRUE(out.has_value());
  if (!out.has_value()) return absl::InternalError("Create did not answer");
  return *std::move(out);
}

void StartRun(TransferManager* transfers, const std::string& name, RunResult* r) {
  transfers->Run(
      name,
      [r](const absl::Status& s, const v1::RunTransferResponse& resp) {
        r->started = s;
        r->response = resp;
      },
      [r](const absl::Status& s, const v1::RunTransferResponse& resp) {
        r->ended = s;
        r->response = resp;
      });
}

RunResult& TransferTest::RunNow(const std::string& name) {
  RunResult& r = runs_.emplace_back();
  StartRun(transfers_.get(), name, &r);
  return r;
}

void TransferTest::Kill(int64_t rank) {
  clock_.Advance(absl::Seconds(6));
  for (int64_t r = 0; r < 6; ++r) {
    if (r == rank) continue;
    const WorkerRecord w = *workers_.GetByRank(r);
    if (w.alive) {
      ASSERT_TRUE(workers_.Heartbeat(w.spec.name, w.incarnation).ok());
    }
  }
  workers_.CheckHealth(clock_.Now());
  ASSERT_FALSE(workers_.GetByRank(rank)->alive);
}

}  // namespace shardcoord
