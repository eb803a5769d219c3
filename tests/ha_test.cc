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
constexpr char kListening[] = "coordinator listening on ";
constexpr char kStandby[] = "coordinator standby on ";

std::string LogDir() {
  const char* out = std::getenv("TEST_UNDECLARED_OUTPUTS_DIR");
  return out != nullptr ? out : std::getenv("TEST_TMPDIR");
}

// etcd, two coordinators c0 and c1 on fixed ports (a restarted one comes back on its own),
// and four workers w0..w3 that know both.
class HaCluster {
 public:
  static absl::StatusOr<std::unique_ptr<HaCluster>> Start(const std::string& name,
                                                          std::vector<std::string> flags) {
    std::unique_ptr<HaCluster> c(new HaCluster());
    c->name_ = name;
    c->flags_ = std::move(flags);
    absl::StatusOr<std::string> coordinator = RunfilePath("coordinator/coordinator");
    if (!coordinator.ok()) return coordinator.status();
    absl::StatusOr<std::string> worker = RunfilePath("worker/worker");
    if (!worker.ok()) return worker.status();
    c->coordinator_bin_ = *coordinator;
    absl::StatusOr<std::unique_ptr<EtcdProcess>> etcd =
        EtcdProcess::Start(absl::StrCat(std::getenv("TEST_TMPDIR"), "/", name, "-etcd"),
                           absl::StrCat(LogDir(), "/", name, "-etcd.log"));
    if (!etcd.ok()) return etcd.status();
    c->etcd_ = *std::move(etcd);
    for (int i = 0; i < 2; ++i) {
      absl::StatusOr<int> port = PickFreePort();
      if (!port.ok()) return port.status();
      c->addresses_.push_back(absl::StrCat("127.0.0.1:", *port));
    }
    // c0 first, so that it leads; then c1, which stands by.
    if (absl::Status s = c->StartCoordinator(0, kListening); !s.ok()) return s;
    if (absl::Status s = c->StartCoordinator(1, kStandby); !s.ok()) return s;
    for (int i = 0; i < kWorkers; ++i) {
      const std::string wname = Cluster::WorkerName(i);
      ProcessOptions po;
      po.name = wname;
      po.echo_stdout = false;
      po.stderr_path = absl::StrCat(LogDir(), "/", name, "-", wname, ".log");
      absl::StatusOr<std::unique_ptr<Process>> w =
          Process::Start({*worker, absl::StrCat("--coordinator=", c->all()), "--listen=127.0.0.1:0",
                          absl::StrCat("--name=", wname), "--backend=gloo", "--local-socket=off"},
                         po);
      if (!w.ok()) return w.status();
      c->workers_.push_back(*std::move(w));
    }
    for (int i = 0; i < kWorkers; ++i) {
      absl::StatusOr<std::string> line = c->workers_[i]->WaitForLine(
          absl::StrCat("worker ", Cluster::WorkerName(i), " listening on "), kStartTimeout);
      if (!line.ok()) return line.status();
    }
    CoordinatorClientOptions o;
    o.retry_for = kRetryFor;
    c->client_ = std::make_unique<CoordinatorClient>(c->all(), o);
    return c;
  }

  ~HaCluster() {
    for (auto& w : workers_) w.reset();  // SIGTERM: they leave, then the coordinators go.
    client_.reset();
    for (auto& p : coordinators_) p.reset();
  }

  // "c0,c1": what workers and clients are given.
  std::string all() const { return absl::StrJoin(addresses_, ","); }
  const std::string& address(int i) const { return addresses_[i]; }
  CoordinatorClient& client() { return *client_; }
  EtcdProcess& etcd() { return *etcd_; }
  Process* coordinator(int i) { return coordinators_[i].get(); }

  // Starts c<i> and waits for `line` (kListening: it leads; kStandby: it stands by).
  absl::Status StartCoordinator(int i, const std::string& line) {
    ProcessOptions po;
    po.name = absl::StrCat("c", i);
    po.echo_stdout = false;
    po.stderr_path = absl::StrCat(LogDir(), "/", name_, "-c", i, ".", starts_++, ".log");
    std::vector<std::string> argv = {coordinator_bin_, absl::StrCat("--listen=", addresses_[i]),
                                     "--http-listen=off", absl::StrCat("--state=", etcd_->url()),
                                     absl::StrCat("--etcd-prefix=/", name_)};
    argv.insert(argv.end(), flags_.begin(), flags_.end());
    absl::StatusOr<std::unique_ptr<Process>> p = Process::Start(argv, po);
    if (!p.ok()) return p.status();
    if (coordinators_.size() <= static_cast<size_t>(i)) coordinators_.resize(i + 1);
    coordinators_[i] = *std::move(p);
    return coordinators_[i]->WaitForLine(line, kStartTimeout).status();
  }

  absl::Status KillCoordinator(int i) {
    absl::Status s = coordinators_[i]->Kill();
    coordinators_[i].reset();
    return s;
  }

  // Every worker ALIVE in the leader's view (registration has no push notification for
  // clients: the condition is polled).
  absl::Status WaitForWorkersAlive(absl::Duration timeout) {
    const absl::Time deadline = absl::Now() + timeout;
    std::string last;
    while (absl::Now() < deadline) {
      absl::StatusOr<std::vector<v1::WorkerInfo>> workers = client_->ListWorkers();
      int alive = 0;
      if (workers.ok()) {
        for (const v1::WorkerInfo& w : *workers) alive += w.state() == v1::ALIVE;
        if (alive == kWorkers) return absl::OkStatus();
        last = absl::StrCat(alive, " of ", kWorkers, " alive");
      } else {
        last = workers.status().ToString();
      }
      absl::SleepFor(absl::Milliseconds(20));
    }
    return absl::DeadlineExceededError(absl::StrCat("workers not alive: ", last));
  }

  std::map<std::string, int64_t> Ranks() {
    std::map<std::string, int64_t> ranks;
    absl::StatusOr<std::vector<v1::WorkerInfo>> workers = client_->ListWorkers();
    EXPECT_TRUE(workers.ok()) << workers.status();
    if (workers.ok()) {
      for (const v1::WorkerInfo& w : *workers) ranks[w.name()] = w.rank();
    }
    return ranks;
  }

 private:
  HaCluster() = default;

  std::string name_;
  std::vector<std::string> flags_;
  std::string coordinator_bin_;
  int starts_ = 0;
  std::unique_ptr<EtcdProcess> etcd_;
  std::vector<std::string> addresses_;
  std::vector<std::unique_ptr<Process>> coordinators_;
  std::vector<std::unique_ptr<Process>> workers_;
  std::unique_ptr<CoordinatorClient> client_;
};

bool PrintedLine(Process* p, const std::string& needle) {
  for (const std::string& l : p->Lines()) {
    if (absl::StrContains(l, needle)) return true;
  }
  return false;
}

class HaTest : public ::testing::Test {
 protected:
  void SetUp() override {
    absl::StatusOr<std::string> etcd = EtcdProcess::FindBinary();
    if (!etcd.ok()) GTEST_SKIP() << etcd.status().message();
  }
};

TEST_F(HaTest, LeaderKilledMidWorkload) {
  constexpr int kKills = 5;
  absl::StatusOr<std::unique_ptr<HaCluster>> started =
      HaCluster::Start("kill", {"--leader-ttl=5s", "--heartbeat-timeout=3s",
                                "--heartbeat-interval=200ms", "--recovery-timeout=60s"});
  ASSERT_TRUE(started.ok()) << started.status();
  HaCluster& cluster = **started;
  ASSERT_TRUE(cluster.WaitForWorkersAlive(kStartTimeout).ok());
  ASSERT_TRUE(MakeWorkloadMeshes(cluster.client()).ok());
  const std::map<std::string, int64_t> ranks = cluster.Ranks();
  ASSERT_EQ(ranks.size(), static_cast<size_t>(kWorkers));

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
        cluster.coordinator(standby)->WaitForLine(kListening, kStartTimeout);
    ASSERT_TRUE(took_over.ok()) << "kill " << k << ": c" << standby
                                << " did not take over: " << took_over.status();
    log.push_back(absl::StrCat("c", leader, " killed after ", seen, " ops, c", standby, " leads"));
    // The killed one comes back, as its supervisor would start it, and stands by.
    absl::Status back = cluster.StartCoordinator(leader, kStandby);
    ASSERT_TRUE(back.ok()) << "restart of c" << leader << ": " << back;
    leader = standby;
  }
  if (seen >= 0) progress.WaitPast(seen, 8);
  runner.Stop();

  // No coordinator lost its lease on its own (a loss exits with status 75), and one leads.
  for (int i = 0; i < 2; ++i) {
    EXPECT_FALSE(PrintedLine(cluster.coordinator(i), "lost leadership")) << "c" << i;
  }
  EXPECT_TRUE(PrintedLine(cluster.coordinator(leader), kListening));
  EXPECT_FALSE(PrintedLine(cluster.coordinator(1 - leader), kListening));
  const WorkloadTotals totals = ExpectAcknowledgedState(cluster.client(), runner);
  EXPECT_EQ(cluster.Ranks(), ranks);
  EXPECT_GT(totals.acknowledged, kKills);
  std::cerr << "ha: " << absl::StrJoin(log, "; ") << "; " << totals.acknowledged
            << " operations acknowledged, " << totals.refused << " aborted by a kill, "
            << totals.checked << " tensors checked value by value\n";
}

TEST_F(HaTest, EtcdRestartedMidWorkload) {
  constexpr int kRestarts = 5;
  // The TTL bounds how long etcd may be away before the leader must stop acting (5/6 of it):
  // a restart of etcd takes about a second.
  absl::StatusOr<std::unique_ptr<HaCluster>> started =
      HaCluster::Start("etcd", {"--leader-ttl=20s", "--heartbeat-timeout=3s",
                                "--heartbeat-interval=200ms", "--recovery-timeout=60s"});
  ASSERT_TRUE(started.ok()) << started.status();
  HaCluster& cluster = **started;
  ASSERT_TRUE(cluster.WaitForWorkersAlive(kStartTimeout).ok());
  ASSERT_TRUE(MakeWorkloadMeshes(cluster.client()).ok());
  const std::map<std::string, int64_t> ranks = cluster.Ranks();

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
  EXPECT_FALSE(PrintedLine(cluster.coordinator(1), kListening));
  absl::StatusOr<int> exited = cluster.coordinator(0)->Wait(absl::ZeroDuration());
  EXPECT_EQ(exited.status().code(), absl::StatusCode::kDeadlineExceeded)
      << "c0 exited: " << Process::DescribeWaitStatus(exited.value_or(0));
  const WorkloadTotals totals = ExpectAcknowledgedState(cluster.client(), runner);
  EXPECT_EQ(cluster.Ranks(), ranks);
  std::cerr << "ha: etcd restarted after operations " << absl::StrJoin(points, ",") << "; "
            << totals.acknowledged << " operations acknowledged, " << totals.refused << " aborted, "
            << totals.checked << " tensors checked value by value\n";
}

}  // namespace
}  // namespace shardcoord
