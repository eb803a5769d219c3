// Issue 12, acceptance 2: two coordinators on one etcd (Debian's etcd-server, started by the
// test on free ports in TEST_TMPDIR), four Gloo workers given both addresses, and the chaos
// workload of four concurrent clients (tests/workload.h) given both addresses too.
//
// LeaderKilledMidWorkload: the leader is killed with SIGKILL at random points of the workload
// (driven by progress, not time); each time the standby must take over (it prints its
// listening line once elected), and the killed one is started again, as its supervisor
// would, and stands by. Afterwards every acknowledged tensor version downloads with its
// values, no acknowledged delete came back, ranks never changed and nothing took effect
// twice (only the tensors the clients know exist).
//
// EtcdRestartedMidWorkload: etcd itself is killed and restarted on its data at random points
// of the workload. The leader rides it out (it never exits, the standby never leads): writes
// answer UNAVAILABLE while etcd is down (checked directly once the workload stopped) and
// clients retry; afterwards the same checks.
//
// Skips when the etcd binary is missing.

#include <cstdint>
#include <cstdlib>
#include <iostream>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/time.h"
#include "client/coordinator_client.h"
#include "gtest/gtest.h"
#include "tests/cluster.h"
#include "tests/etcd_process.h"
#include "tests/ha_cluster.h"
#include "tests/process.h"
#include "tests/tensor_check.h"
#include "tests/workload.h"

namespace shardcoord {
namespace {

constexpr int kClients = 4;
constexpr int kWorkers = 4;
constexpr uint64_t kSeed = 20261201;
constexpr absl::Duration kRetryFor = absl::Seconds(90);
constexpr absl::Duration kStartTimeout = absl::Seconds(60);

HaClusterOptions Options(const std::string& name, std::vector<std::string> flags) {
  HaClusterOptions o;
  o.name = name;
  o.tmp_dir = std::getenv("TEST_TMPDIR");
  const char* out = std::getenv("TEST_UNDECLARED_OUTPUTS_DIR");
  o.log_dir = out != nullptr ? out : o.tmp_dir;
  o.coordinator_flags = std::move(flags);
  o.num_workers = kWorkers;
  o.start_timeout = kStartTimeout;
  o.client_retry_for = kRetryFor;
  return o;
}

std::map<std::string, int64_t> Ranks(HaCluster& cluster) {
  absl::StatusOr<std::map<std::string, int64_t>> ranks = cluster.Ranks();
  EXPECT_TRUE(ranks.ok()) << ranks.status();
  return ranks.value_or(std::map<std::string, int64_t>{});
}

class HaTest : public ::testing::Test {
 protected:
  void SetUp() override {
    absl::StatusOr<std::string> etcd = EtcdProcess::FindBinary();
    if (!etcd.ok()) GTEST_SKIP() << etcd.status().message();
  }

  // etcd, c0 leading and c1 standing by with `leader_ttl`, every worker alive, the
  // workload's meshes; records the ranks.
  void StartCluster(const std::string& name, const std::string& leader_ttl) {
    absl::StatusOr<std::unique_ptr<HaCluster>> started = HaCluster::Start(
        Options(name, {absl::StrCat("--leader-ttl=", leader_ttl), "--heartbeat-timeout=3s",
                       "--heartbeat-interval=200ms", "--recovery-timeout=60s"}));
    ASSERT_TRUE(started.ok()) << started.status();
    cluster_ = *std::move(started);
    ASSERT_TRUE(cluster_->WaitForWorkersAlive(kStartTimeout).ok());
    ASSERT_TRUE(MakeWorkloadMeshes(cluster_->client()).ok());
    ranks_ = Ranks(*cluster_);
    ASSERT_EQ(ranks_.size(), static_cast<size_t>(kWorkers));
  }

  std::unique_ptr<HaCluster> cluster_;
  std::map<std::string, int64_t> ranks_;
};

TEST_F(HaTest, LeaderKilledMidWorkload) {
  constexpr int kKills = 5;
  ASSERT_NO_FATAL_FAILURE(StartCluster("kill", "5s"));
  HaCluster& cluster = *cluster_;
  const std::map<std::string, int64_t>& ranks = ranks_;

  WorkloadRunner runner(kClients, cluster.all(), kSeed, kRetryFor);
  Progress& progress = runner.progress();
  std::mt19937_64 rng(kSeed);
  int64_t seen = 0;
  int leader = 0;
  std::vector<std::string> log;
  for (int k = 0; k < kKills; ++k) {
    seen = progress.WaitPast(seen, std::uniform_int_distribution<int64_t>(2, 12)(rng));
    if (seen < 0) break;  // A client failed: its error is reported below.
    ASSERT_TRUE(cluster.KillCoordinator(leader).ok()) << "kill " << k;
    // The standby takes over once the dead leader's lease expired: it prints its listening
    // line when elected, after loading the state from etcd.
    const int standby = 1 - leader;
    absl::StatusOr<std::string> took_over =
        cluster.coordinator(standby)->WaitForLine(kListeningLine, kStartTimeout);
    ASSERT_TRUE(took_over.ok()) << "kill " << k << ": c" << standby
                                << " did not take over: " << took_over.status();
    log.push_back(absl::StrCat("c", leader, " killed after ", seen, " ops, c", standby, " leads"));
    // The killed one comes back, as its supervisor would start it, and stands by.
    absl::Status back = cluster.StartCoordinator(leader, kStandbyLine);
    ASSERT_TRUE(back.ok()) << "restart of c" << leader << ": " << back;
    leader = standby;
  }
  if (seen >= 0) progress.WaitPast(seen, 8);
  runner.Stop();

  // No coordinator lost its lease on its own (a loss exits with status 75), and one leads.
  for (int i = 0; i < 2; ++i) {
    EXPECT_FALSE(PrintedLine(cluster.coordinator(i), "lost leadership")) << "c" << i;
  }
  EXPECT_TRUE(PrintedLine(cluster.coordinator(leader), kListeningLine));
  EXPECT_FALSE(PrintedLine(cluster.coordinator(1 - leader), kListeningLine));
  const WorkloadTotals totals = ExpectAcknowledgedState(cluster.client(), runner);
  EXPECT_EQ(Ranks(cluster), ranks);
  EXPECT_GT(totals.acknowledged, kKills);
  std::cerr << "ha: " << absl::StrJoin(log, "; ") << "; " << totals.acknowledged
            << " operations acknowledged, " << totals.refused << " aborted by a kill, "
            << totals.checked << " tensors checked value by value\n";
}

TEST_F(HaTest, EtcdRestartedMidWorkload) {
  constexpr int kRestarts = 5;
  // The TTL bounds how long etcd may be away before the leader must stop acting (5/6 of it):
  // a restart of etcd takes about a second.
  ASSERT_NO_FATAL_FAILURE(StartCluster("etcd", "20s"));
  HaCluster& cluster = *cluster_;
  const std::map<std::string, int64_t>& ranks = ranks_;

  WorkloadRunner runner(kClients, cluster.all(), kSeed + 1, kRetryFor);
  Progress& progress = runner.progress();
  std::mt19937_64 rng(kSeed + 1);
  int64_t seen = 0;
  std::vector<int64_t> points;
  for (int k = 0; k < kRestarts; ++k) {
    seen = progress.WaitPast(seen, std::uniform_int_distribution<int64_t>(2, 12)(rng));
    if (seen < 0) break;
    points.push_back(seen);
    ASSERT_TRUE(cluster.etcd().Kill().ok());
    absl::Status back = cluster.etcd().Restart();
    ASSERT_TRUE(back.ok()) << "etcd restart " << k << ": " << back;
  }
  if (seen >= 0) progress.WaitPast(seen, 8);
  runner.Stop();

  // Nothing in flight now: with etcd down, a change answers UNAVAILABLE at once and reads
  // are still served; after etcd is back the change is not there (nothing half-applied).
  ASSERT_TRUE(cluster.etcd().Kill().ok());
  CoordinatorClientOptions once;
  once.retry_for = absl::ZeroDuration();
  CoordinatorClient probe(cluster.all(), once);
  absl::StatusOr<v1::MeshInfo> refused = MakeMesh(probe, "probe", {4}, {"w0", "w1", "w2", "w3"});
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kUnavailable) << refused.status();
  EXPECT_TRUE(probe.ListWorkers().ok());
  ASSERT_TRUE(cluster.etcd().Restart().ok());
  EXPECT_EQ(cluster.client().GetMesh("probe").status().code(), absl::StatusCode::kNotFound);

  // The leader rode it out: c0 never stopped leading, c1 never led.
  EXPECT_FALSE(PrintedLine(cluster.coordinator(0), "lost leadership"));
  EXPECT_FALSE(PrintedLine(cluster.coordinator(1), kListeningLine));
  absl::StatusOr<int> exited = cluster.coordinator(0)->Wait(absl::ZeroDuration());
  EXPECT_EQ(exited.status().code(), absl::StatusCode::kDeadlineExceeded)
      << "c0 exited: " << Process::DescribeWaitStatus(exited.value_or(0));
  const WorkloadTotals totals = ExpectAcknowledgedState(cluster.client(), runner);
  EXPECT_EQ(Ranks(cluster), ranks);
  std::cerr << "ha: etcd restarted after operations " << absl::StrJoin(points, ",") << "; "
            << totals.acknowledged << " operations acknowledged, " << totals.refused << " aborted, "
            << totals.checked << " tensors checked value by value\n";
}

}  // namespace
}  // namespace shardcoord
