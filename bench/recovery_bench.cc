// Recovery benchmark (issue 12): how long a restarted coordinator takes until every tensor
// is readable again, against the same restart with no tensors, in one run.
//
//   bazel run -c opt //bench:recovery_bench -- [--json] [--tensors 2500] [--reps 3]
//
// 1. Starts a coordinator (SQLite state in a temporary directory) and four CPU workers on
//    loopback, and a 1-d mesh of the four.
// 2. Baseline, --reps times: SIGKILL the coordinator, start it again on the same directory,
//    and time until every worker is registered again (ListWorkers all ALIVE): the restart
//    itself, with nothing to recover.
// 3. Creates --tensors small f32 tensors (S(0) over the four: 4 chunks each, so the default
//    2500 give 10,000 chunks), then, --reps times: SIGKILL, restart, and time until no tensor
//    is recovering any more (ListTensors; a recovering tensor reports busy_plan "recovering
//    ..."), i.e. until every worker reported its buffers and each was reconciled.
// 4. Checks one tensor's values at the end, so the restarts really kept the data.
// Times are wall seconds at the client, from just before the new coordinator process is
// spawned. Polls every 5 ms.
//
// --etcd adds a takeover run, labelled as such: etcd (Debian's etcd-server) and two
// coordinators on it (--state etcd://, tests/ha_cluster.h), four workers given both. The
// leader is SIGKILLed and the time runs until the standby serves with every worker registered
// again (baseline, no tensors) or with every one of --etcd_tensors tensors readable; the
// killed one is started again as a standby between repetitions. A takeover first waits for
// the dead leader's lease to expire (--leader_ttl), so that part is printed too.

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "bench/bench_common.h"
#include "client/coordinator_client.h"
#include "common/json_writer.h"
#include "tests/cluster.h"
#include "tests/ha_cluster.h"
#include "tests/tensor_check.h"

ABSL_FLAG(bool, json, false, "Print one JSON object with every number instead of text.");
ABSL_FLAG(int, tensors, 2500, "Tensors to recover (4 chunks each).");
ABSL_FLAG(int, reps, 3, "Timed restarts of each kind.");
ABSL_FLAG(std::string, log_dir, "", "Keep the daemons' logs here; default: a temporary directory.");
ABSL_FLAG(bool, etcd, false,
          "Also time takeovers by a standby coordinator on etcd (needs the etcd binary).");
ABSL_FLAG(int, etcd_tensors, 250, "Tensors to recover in the etcd takeover run (4 chunks each).");
ABSL_FLAG(std::string, leader_ttl, "2s", "--leader-ttl of the coordinators of the etcd run.");

namespace shardcoord {
namespace {

constexpr int kWorkers = 4;
constexpr absl::Duration kTimeout = absl::Minutes(5);
constexpr absl::Duration kPoll = absl::Milliseconds(5);
const Shape kShape = {8, 16};

using bench::Die;
using bench::OrDie;
using bench::Stats;

bool AllAlive(CoordinatorClient& client) {
  absl::StatusOr<std::vector<v1::WorkerInfo>> workers = client.ListWorkers();
  if (!workers.ok() || workers->size() != kWorkers) return false;
  for (const v1::WorkerInfo& w : *workers) {
    if (w.state() != v1::ALIVE) return false;
  }
  return true;
}

bool NoneRecovering(CoordinatorClient& client, size_t tensors) {
  absl::StatusOr<std::vector<v1::TensorInfo>> all = client.ListTensors();
  if (!all.ok() || all->size() != tensors) return false;
  for (const v1::TensorInfo& t : *all) {
    if (!t.busy_plan().empty()) return false;
  }
  return true;
}

// Kills and restarts the coordinator; seconds until `ready` holds.
double TimeRestart(Cluster& cluster, const std::function<bool(CoordinatorClient&)>& ready) {
  OrDie(cluster.KillCoordinator(), "kill");
  const absl::Time start = absl::Now();
  OrDie(cluster.RestartCoordinator(kTimeout), "restart");
  CoordinatorClientOptions options;
  options.retry_for = absl::ZeroDuration();  // The poll is the retry.
  CoordinatorClient client(cluster.coordinator_address(), options);
  while (!ready(client)) {
    if (absl::Now() - start > kTimeout) Die("not recovered within 5 minutes");
    absl::SleepFor(kPoll);
  }
  return absl::ToDoubleSeconds(absl::Now() - start);
}

struct Takeover {
  int tensors = 0;
  double ttl_seconds = 0;
  double create_seconds = 0;
  Stats empty, full;
};

// SIGKILLs the leading coordinator; seconds until the standby serves and `ready` holds. Then
// starts the killed one again as a standby. Returns the index of the new leader in *leader.
double TimeTakeover(HaCluster& cluster, int* leader,
                    const std::function<bool(CoordinatorClient&)>& ready) {
  const int standby = 1 - *leader;
  OrDie(cluster.KillCoordinator(*leader), "kill the leader");
  const absl::Time start = absl::Now();
  CoordinatorClientOptions options;
  options.retry_for = absl::ZeroDuration();  // The poll is the retry.
  CoordinatorClient client(cluster.address(standby), options);
  while (!ready(client)) {
    if (absl::Now() - start > kTimeout) Die("no takeover within 5 minutes");
    absl::SleepFor(kPoll);
  }
  const double seconds = absl::ToDoubleSeconds(absl::Now() - start);
  OrDie(cluster.StartCoordinator(*leader, kStandbyLine), "restart as a standby");
  *leader = standby;
  return seconds;
}

Takeover RunTakeovers(const std::string& tmp, const std::string& log_dir, int reps,
                      const std::function<void(const std::string&)>& say) {
  Takeover out;
  out.tensors = std::max(1, absl::GetFlag(FLAGS_etcd_tensors));
  const std::string ttl = absl::GetFlag(FLAGS_leader_ttl);
  absl::Duration ttl_value;
  if (!absl::ParseDuration(ttl, &ttl_value)) Die(absl::StrCat("--leader_ttl: bad '", ttl, "'"));
  out.ttl_seconds = absl::ToDoubleSeconds(ttl_value);
  HaClusterOptions o;
  o.name = "bench";
  o.tmp_dir = tmp;
  o.log_dir = log_dir;
  o.num_workers = kWorkers;
  o.coordinator_flags = {absl::StrCat("--leader-ttl=", ttl), "--heartbeat-interval=200ms",
                         "--recovery-timeout=5m"};
  say(absl::StrCat("etcd: starting etcd, two coordinators and ", kWorkers, " workers"));
  std::unique_ptr<HaCluster> cluster = OrDie(HaCluster::Start(o), "etcd cluster");
  OrDie(cluster->WaitForWorkersAlive(kTimeout), "workers");
  std::vector<std::string> names;
  for (int i = 0; i < kWorkers; ++i) names.push_back(Cluster::WorkerName(i));
  OrDie(MakeMesh(cluster->client(), "line", {kWorkers}, names).status(), "mesh");
  int leader = 0;
  for (int r = 0; r < reps; ++r) {
    out.empty.seconds.push_back(TimeTakeover(*cluster, &leader, AllAlive));
    say(absl::StrCat("etcd takeover with no tensors: ", out.empty.seconds.back(), " s"));
  }
  say(absl::StrCat("etcd: creating ", out.tensors, " tensors"));
  const absl::Time create_start = absl::Now();
  for (int i = 0; i < out.tensors; ++i) {
    OrDie(CreateFilled(cluster->client(), absl::StrCat("t", i), kShape, DType::kF32, "line", "S(0)")
              .status(),
          absl::StrCat("create t", i));
  }
  out.create_seconds = absl::ToDoubleSeconds(absl::Now() - create_start);
  const size_t n = static_cast<size_t>(out.tensors);
  for (int r = 0; r < reps; ++r) {
    out.full.seconds.push_back(TimeTakeover(
        *cluster, &leader, [n](CoordinatorClient& c) { return NoneRecovering(c, n); }));
    say(absl::StrCat("etcd takeover with ", out.tensors, " tensors: ", out.full.seconds.back(),
                     " s"));
  }
  CoordinatorClient leading(cluster->address(leader));  // Downloads are not retried.
  OrDie(DownloadAndCheck(leading, absl::StrCat("t", out.tensors - 1), DType::kF32, kShape,
                         FillKind::kArange),
        "values after the takeovers");
  return out;
}

int Run() {
  const bool json = absl::GetFlag(FLAGS_json);
  const int n = std::max(1, absl::GetFlag(FLAGS_tensors));
  const int reps = std::max(1, absl::GetFlag(FLAGS_reps));
  auto say = [&](const std::string& s) {
    if (!json) std::fprintf(stderr, "%s\n", s.c_str());
  };
  const std::string tmp = bench::ScratchDir("recovery_bench");
  const std::string log_dir = bench::LogDir(absl::GetFlag(FLAGS_log_dir), tmp);

  ClusterOptions options;
  options.num_workers = kWorkers;
  options.echo_stdout = false;
  options.log_dir = log_dir;
  options.state_dir = absl::StrCat(tmp, "/state");
  options.coordinator_flags = {"--heartbeat-interval=200ms", "--recovery-timeout=5m"};
  say(absl::StrCat("starting a coordinator and ", kWorkers, " workers (logs in ", log_dir, ")"));
  std::unique_ptr<Cluster> cluster = OrDie(Cluster::Start(options), "cluster");
  OrDie(MakeMesh(cluster->client(), "line", {kWorkers}, cluster->WorkerNames()).status(), "mesh");

  Stats empty;
  for (int r = 0; r < reps; ++r) {
    empty.seconds.push_back(TimeRestart(*cluster, AllAlive));
    say(absl::StrCat("restart with no tensors: ", empty.seconds.back(), " s"));
  }

  say(absl::StrCat("creating ", n, " tensors"));
  const absl::Time create_start = absl::Now();
  for (int i = 0; i < n; ++i) {
    OrDie(CreateFilled(cluster->client(), absl::StrCat("t", i), kShape, DType::kF32, "line", "S(0)")
              .status(),
          absl::StrCat("create t", i));
  }
  const double create_seconds = absl::ToDoubleSeconds(absl::Now() - create_start);
  const int64_t chunks = int64_t{n} * kWorkers;

  Stats full;
  for (int r = 0; r < reps; ++r) {
    full.seconds.push_back(TimeRestart(
        *cluster, [n](CoordinatorClient& c) { return NoneRecovering(c, static_cast<size_t>(n)); }));
    say(absl::StrCat("restart with ", n, " tensors: ", full.seconds.back(), " s"));
  }
  OrDie(DownloadAndCheck(cluster->client(), absl::StrCat("t", n - 1), DType::kF32, kShape,
                         FillKind::kArange),
        "values after the restarts");

  const double goal = 2.0;  // Seconds for 10,000 chunks (issue 12).
  std::optional<Takeover> takeover;
  if (absl::GetFlag(FLAGS_etcd)) {
    cluster.reset();
    takeover = RunTakeovers(tmp, log_dir, reps, say);
  }
  if (json) {
    JsonWriter w;
    w.BeginObject();
    w.Key("workers").Int(kWorkers).Key("tensors").Int(n).Key("chunks").Int(chunks);
    w.Key("reps").Int(reps).Key("create_seconds").Double(create_seconds);
    w.Key("empty_restart").BeginObject();
    w.Key("best_seconds").Double(empty.Best()).Key("median_seconds").Double(empty.Median());
    w.EndObject();
    w.Key("recovery").BeginObject();
    w.Key("best_seconds").Double(full.Best()).Key("median_seconds").Double(full.Median());
    w.EndObject();
    w.Key("ratio_vs_empty_restart_median").Double(full.Median() / empty.Median());
    w.Key("goal_seconds_for_10000_chunks").Double(goal);
    if (takeover.has_value()) {
      // Two coordinators on etcd, the leader SIGKILLed: until the standby serves.
      w.Key("etcd_takeover").BeginObject();
      w.Key("leader_ttl_seconds").Double(takeover->ttl_seconds);
      w.Key("tensors")
          .Int(takeover->tensors)
          .Key("chunks")
          .Int(int64_t{takeover->tensors} * kWorkers);
      w.Key("create_seconds").Double(takeover->create_seconds);
      w.Key("no_tensors").BeginObject();
      w.Key("best_seconds").Double(takeover->empty.Best());
      w.Key("median_seconds").Double(takeover->empty.Median());
      w.EndObject();
      w.Key("with_tensors").BeginObject();
      w.Key("best_seconds").Double(takeover->full.Best());
      w.Key("median_seconds").Double(takeover->full.Median());
      w.EndObject();
      w.Key("ratio_vs_no_tensors_median")
          .Double(takeover->full.Median() / takeover->empty.Median());
      w.EndObject();
    }
    w.EndObject();
    std::printf("%s\n", w.str().c_str());
    return 0;
  }
  std::printf("%-40s %10s %10s\n", "", "best s", "median s");
  std::printf("%-40s %10.3f %10.3f\n", "restart, nothing to recover", empty.Best(), empty.Median());
  std::printf("%-40s %10.3f %10.3f\n",
              absl::StrCat("restart, ", n, " tensors (", chunks, " chunks)").c_str(), full.Best(),
              full.Median());
  std::printf("\nrecovery / bare restart = %.2f (median); goal: <= %.0f s for 10,000 chunks\n",
              full.Median() / empty.Median(), goal);
  std::printf("(creating the %d tensors took %.1f s)\n", n, create_seconds);
  if (takeover.has_value()) {
    const std::string label = absl::StrCat("etcd takeover, ", takeover->tensors, " tensors");
    std::printf(
        "\netcd: two coordinators, leader SIGKILLed; until the standby serves (it first "
        "waits out the dead leader's %.0f s lease)\n",
        takeover->ttl_seconds);
    std::printf("%-40s %10s %10s\n", "", "best s", "median s");
    std::printf("%-40s %10.3f %10.3f\n", "etcd takeover, nothing to recover",
                takeover->empty.Best(), takeover->empty.Median());
    std::printf("%-40s %10.3f %10.3f\n", label.c_str(), takeover->full.Best(),
                takeover->full.Median());
    std::printf("takeover with tensors / without = %.2f (median); creating them took %.1f s\n",
                takeover->full.Median() / takeover->empty.Median(), takeover->create_seconds);
  }
  return 0;
}

}  // namespace
}  // namespace shardcoord

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  return shardcoord::Run();
}
