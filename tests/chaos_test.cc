// Issue 12, acceptance 1: the coordinator is killed with SIGKILL 20 times at random moments of
// a workload of 4 concurrent clients creating, redistributing, copying, uploading and
// deleting tensors, and restarted each time on its state directory. Afterwards every
// acknowledged tensor version downloads with the values it was given, no acknowledged delete
// has come back, and ranks never changed. The clients retry UNAVAILABLE with one request_id
// per change (CoordinatorClient), so a retried change takes effect once.
//
// The moments are random but driven by progress, not by sleeps: the killer waits (on a
// condition) until the clients have finished a random number of operations since the last
// restart, then kills whatever is in flight.

#include <cstdint>
#include <cstdlib>
#include <iostream>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/time.h"
#include "client/coordinator_client.h"
#include "gtest/gtest.h"
#include "tests/cluster.h"
#include "tests/workload.h"

namespace shardcoord {
namespace {

constexpr int kClients = 4;
constexpr int kKills = 20;
constexpr uint64_t kSeed = 20261124;
// Generous: a client retries UNAVAILABLE for this long while the coordinator restarts.
constexpr absl::Duration kRetryFor = absl::Seconds(60);

TEST(ChaosTest, TwentyKillsLoseNothingAcknowledged) {
  ClusterOptions options;
  options.state_dir = absl::StrCat(std::getenv("TEST_TMPDIR"), "/chaos-state");
  options.coordinator_flags = {"--heartbeat-timeout=3s", "--heartbeat-interval=200ms",
                               "--recovery-timeout=60s"};
  options.echo_stdout = false;
  options.log_dir = std::getenv("TEST_UNDECLARED_OUTPUTS_DIR") != nullptr
                        ? std::getenv("TEST_UNDECLARED_OUTPUTS_DIR")
                        : std::getenv("TEST_TMPDIR");
  options.client_options.retry_for = kRetryFor;
  absl::StatusOr<std::unique_ptr<Cluster>> started = Cluster::Start(options);
  ASSERT_TRUE(started.ok()) << started.status();
  Cluster& cluster = **started;
  ASSERT_TRUE(MakeWorkloadMeshes(cluster.client()).ok());
  std::map<std::string, int64_t> ranks;
  absl::StatusOr<std::vector<v1::WorkerInfo>> workers = cluster.client().ListWorkers();
  ASSERT_TRUE(workers.ok()) << workers.status();
  for (const v1::WorkerInfo& w : *workers) ranks[w.name()] = w.rank();

  WorkloadRunner runner(kClients, cluster.coordinator_address(), kSeed, kRetryFor);
  Progress& progress = runner.progress();
  std::mt19937_64 rng(kSeed);
  int64_t seen = 0;
  std::vector<int64_t> kill_points;
  for (int k = 0; k < kKills; ++k) {
    // 1 to 12 operations after the previous restart: sometimes while the tensors are still
    // recovering, sometimes mid-plan or mid-upload.
    seen = progress.WaitPast(seen, std::uniform_int_distribution<int64_t>(1, 12)(rng));
    if (seen < 0) break;  // A client failed: its error is reported below.
    kill_points.push_back(seen);
    ASSERT_TRUE(cluster.KillCoordinator().ok()) << "kill " << k;
    absl::Status restarted = cluster.RestartCoordinator(absl::Seconds(60));
    ASSERT_TRUE(restarted.ok()) << "restart " << k << ": " << restarted;
  }
  // A last stretch without kills, then stop.
  if (seen >= 0) progress.WaitPast(seen, 8);
  runner.Stop();

  CoordinatorClient& client = cluster.client();
  const WorkloadTotals totals = ExpectAcknowledgedState(client, runner);
  std::map<std::string, int64_t> after;
  workers = client.ListWorkers();
  ASSERT_TRUE(workers.ok()) << workers.status();
  for (const v1::WorkerInfo& w : *workers) after[w.name()] = w.rank();
  EXPECT_EQ(after, ranks);
  EXPECT_GT(totals.acknowledged, kKills);
  std::cerr << "chaos: " << kKills << " kills after operations " << absl::StrJoin(kill_points, ",")
            << "; " << totals.acknowledged << " operations acknowledged, " << totals.refused
            << " aborted by a kill, " << totals.checked << " tensors checked value by value\n";
}

}  // namespace
}  // namespace shardcoord
