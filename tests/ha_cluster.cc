#include "tests/ha_cluster.h"

#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "tests/cluster.h"

namespace shardcoord {

absl::StatusOr<std::unique_ptr<HaCluster>> HaCluster::Start(HaClusterOptions options) {
  std::unique_ptr<HaCluster> c(new HaCluster());
  c->options_ = std::move(options);
  const HaClusterOptions& o = c->options_;
  absl::StatusOr<std::string> coordinator = RunfilePath("coordinator/coordinator");
  if (!coordinator.ok()) return coordinator.status();
  absl::StatusOr<std::string> worker = RunfilePath("worker/worker");
  if (!worker.ok()) return worker.status();
  c->coordinator_bin_ = *coordinator;
  absl::StatusOr<std::unique_ptr<EtcdProcess>> etcd =
      EtcdProcess::Start(absl::StrCat(o.tmp_dir, "/", o.name, "-etcd"),
                         absl::StrCat(o.log_dir, "/", o.name, "-etcd.log"), o.start_timeout);
  if (!etcd.ok()) return etcd.status();
  c->etcd_ = *std::move(etcd);
  for (int i = 0; i < 2; ++i) {
    absl::StatusOr<int> port = PickFreePort();
    if (!port.ok()) return port.status();
    c->addresses_.push_back(absl::StrCat("127.0.0.1:", *port));
  }
  // c0 first, so that it leads; then c1, which stands by.
  if (absl::Status s = c->StartCoordinator(0, kListeningLine); !s.ok()) return s;
  if (absl::Status s = c->StartCoordinator(1, kStandbyLine); !s.ok()) return s;
  for (int i = 0; i < o.num_workers; ++i) {
    const std::string wname = Cluster::WorkerName(i);
    ProcessOptions po;
    po.name = wname;
    po.echo_stdout = false;
    po.stderr_path = absl::StrCat(o.log_dir, "/", o.name, "-", wname, ".log");
    absl::StatusOr<std::unique_ptr<Process>> w =
        Process::Start({*worker, absl::StrCat("--coordinator=", c->all()), "--listen=127.0.0.1:0",
                        absl::StrCat("--name=", wname), "--backend=gloo", "--local-socket=off"},
                       po);
    if (!w.ok()) return w.status();
    c->workers_.push_back(*std::move(w));
  }
  for (int i = 0; i < o.num_workers; ++i) {
    absl::StatusOr<std::string> line = c->workers_[i]->WaitForLine(
        absl::StrCat("worker ", Cluster::WorkerName(i), " listening on "), o.start_timeout);
    if (!line.ok()) return line.status();
  }
  CoordinatorClientOptions co;
  co.retry_for = o.client_retry_for;
  c->client_ = std::make_unique<CoordinatorClient>(c->all(), co);
  return c;
}

HaCluster::~HaCluster() {
  for (auto& w : workers_) w.reset();  // SIGTERM: they leave, then the coordinators go.
  client_.reset();
  for (auto& p : coordinators_) p.reset();
}

std::string HaCluster::all() const { return absl::StrJoin(addresses_, ","); }

absl::Status HaCluster::StartCoordinator(int i, const std::string& line) {
  ProcessOptions po;
  po.name = absl::StrCat("c", i);
  po.echo_stdout = false;
  po.stderr_path =
      absl::StrCat(options_.log_dir, "/", options_.name, "-c", i, ".", starts_++, ".log");
  std::vector<std::string> argv = {coordinator_bin_, absl::StrCat("--listen=", addresses_[i]),
                                   "--http-listen=off", absl::StrCat("--state=", etcd_->url()),
                                   absl::StrCat("--etcd-prefix=/", options_.name)};
  argv.insert(argv.end(), options_.coordinator_flags.begin(), options_.coordinator_flags.end());
  absl::StatusOr<std::unique_ptr<Process>> p = Process::Start(argv, po);
  if (!p.ok()) return p.status();
  if (coordinators_.size() <= static_cast<size_t>(i)) coordinators_.resize(i + 1);
  coordinators_[i] = *std::move(p);
  return coordinators_[i]->WaitForLine(line, options_.start_timeout).status();
}

absl::Status HaCluster::KillCoordinator(int i) {
  absl::Status s = coordinators_[i]->Kill();
  coordinators_[i].reset();
  return s;
}

absl::Status HaCluster::WaitForWorkersAlive(absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  std::string last;
  while (absl::Now() < deadline) {
    absl::StatusOr<std::vector<v1::WorkerInfo>> workers = client_->ListWorkers();
    if (workers.ok()) {
      int alive = 0;
      for (const v1::WorkerInfo& w : *workers) alive += w.state() == v1::ALIVE;
      if (alive == options_.num_workers) return absl::OkStatus();
      last = absl::StrCat(alive, " of ", options_.num_workers, " alive");
    } else {
      last = workers.status().ToString();
    }
    absl::SleepFor(absl::Milliseconds(20));
  }
  return absl::DeadlineExceededError(absl::StrCat("workers not alive: ", last));
}

absl::StatusOr<std::map<std::string, int64_t>> HaCluster::Ranks() {
  absl::StatusOr<std::vector<v1::WorkerInfo>> workers = client_->ListWorkers();
  if (!workers.ok()) return workers.status();
  std::map<std::string, int64_t> ranks;
  for (const v1::WorkerInfo& w : *workers) ranks[w.name()] = w.rank();
  return ranks;
}

bool PrintedLine(Process* p, const std::string& needle) {
  for (const std::string& l : p->Lines()) {
    if (absl::StrContains(l, needle)) return true;
  }
  return false;
}

}  // namespace shardcoord
