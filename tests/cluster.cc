#include "tests/cluster.h"

#include <csignal>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_replace.h"

namespace shardcoord {
namespace {

constexpr char kCoordinatorBinary[] = "coordinator/coordinator";
constexpr char kWorkerBinary[] = "worker/worker";
constexpr absl::Duration kRegistrationPoll = absl::Milliseconds(20);

std::string StateName(v1::WorkerState state) { return v1::WorkerState_Name(state); }

}  // namespace

absl::StatusOr<std::string> AddressAfter(const std::string& line, const std::string& marker) {
  const size_t at = line.find(marker);
  if (at == std::string::npos) {
    return absl::InvalidArgumentError(
        absl::StrCat("line '", line, "' does not contain '", marker, "'"));
  }
  size_t begin = at + marker.size();
  while (begin < line.size() && line[begin] == ' ') ++begin;
  size_t end = begin;
  while (end < line.size() && line[end] != ' ' && line[end] != '\t' && line[end] != '\r') ++end;
  if (end == begin) {
    return absl::InvalidArgumentError(
        absl::StrCat("no address after '", marker, "' in '", line, "'"));
  }
  return line.substr(begin, end - begin);
}

std::string Cluster::WorkerName(int index) { return absl::StrCat("w", index); }

std::vector<std::string> Cluster::WorkerNames() const {
  std::vector<std::string> names;
  for (int i = 0; i < num_workers(); ++i) names.push_back(WorkerName(i));
  return names;
}

int Cluster::WorkerIndexOfRank(int64_t rank) const {
  for (int i = 0; i < static_cast<int>(infos_.size()); ++i) {
    if (infos_[i].rank() == rank) return i;
  }
  return -1;
}

int Cluster::WorkerIndexOfName(const std::string& name) const {
  for (int i = 0; i < num_workers(); ++i) {
    if (WorkerName(i) == name) return i;
  }
  return -1;
}

absl::StatusOr<std::unique_ptr<Cluster>> Cluster::Start(ClusterOptions options) {
  absl::StatusOr<std::string> coordinator_bin = RunfilePath(kCoordinatorBinary);
  if (!coordinator_bin.ok()) return coordinator_bin.status();
  absl::StatusOr<std::string> worker_bin = RunfilePath(kWorkerBinary);
  if (!worker_bin.ok()) return worker_bin.status();

  std::unique_ptr<Cluster> cluster(new Cluster());
  cluster->options_ = options;
  cluster->coordinator_bin_ = *coordinator_bin;
  auto process_options = [&](const std::string& name) {
    ProcessOptions po;
    po.name = name;
    po.echo_stdout = options.echo_stdout;
    if (!options.log_dir.empty()) po.stderr_path = absl::StrCat(options.log_dir, "/", name, ".log");
    return po;
  };

  if (absl::Status s = cluster->StartCoordinator("127.0.0.1:0"); !s.ok()) return s;

  // All workers start at once; each one's line is awaited afterwards.
  for (int i = 0; i < options.num_workers; ++i) {
    const std::string name = WorkerName(i);
    std::vector<std::string> wargv = {
        *worker_bin, absl::StrCat("--coordinator=", cluster->coordinator_address_),
        "--listen=127.0.0.1:0", absl::StrCat("--name=", name), "--backend=gloo"};
    bool local_socket = false;
    for (const std::string& flag : options.worker_flags) {
      wargv.push_back(absl::StrReplaceAll(flag, {{"{name}", name}}));
      local_socket |= absl::StartsWith(flag, "--local-socket");
    }
    // Tests run in parallel with the same worker names: none serves the default socket path.
    if (!local_socket) wargv.push_back("--local-socket=off");
    absl::StatusOr<std::unique_ptr<Process>> worker = Process::Start(wargv, process_options(name));
    if (!worker.ok()) return worker.status();
    cluster->workers_.push_back(*std::move(worker));
  }
  for (int i = 0; i < options.num_workers; ++i) {
    absl::StatusOr<std::string> wline = cluster->workers_[i]->WaitForLine(
        absl::StrCat("worker ", WorkerName(i), " listening on "), options.start_timeout);
    if (!wline.ok()) return wline.status();
    // With --http-listen among worker_flags, each worker prints its metrics line first.
    std::string metrics;
    const std::string marker = absl::StrCat("worker ", WorkerName(i), " metrics on http://");
    for (const std::string& l : cluster->workers_[i]->Lines()) {
      if (l.find(marker) == std::string::npos) continue;
      absl::StatusOr<std::string> url = AddressAfter(l, marker);
      if (!url.ok()) return url.status();
      metrics = url->substr(0, url->find('/'));
    }
    cluster->worker_metrics_addresses_.push_back(metrics);
  }

  const std::vector<std::string> names = cluster->WorkerNames();
  if (absl::Status s = cluster->WaitForWorkers(names, v1::ALIVE, options.start_timeout); !s.ok()) {
    return s;
  }
  absl::StatusOr<std::vector<v1::WorkerInfo>> workers = cluster->client_->ListWorkers();
  if (!workers.ok()) return workers.status();
  absl::flat_hash_map<std::string, v1::WorkerInfo> by_name;
  for (const v1::WorkerInfo& w : *workers) by_name[w.name()] = w;
  for (const std::string& name : names) cluster->infos_.push_back(by_name.at(name));
  return cluster;
}

absl::Status Cluster::WaitForWorkers(const std::vector<std::string>& names, v1::WorkerState state,
                                     absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  std::string last = "no answer";
  while (true) {
    absl::StatusOr<std::vector<v1::WorkerInfo>> workers = client_->ListWorkers();
    if (workers.ok()) {
      absl::flat_hash_map<std::string, v1::WorkerState> states;
      for (const v1::WorkerInfo& w : *workers) states[w.name()] = w.state();
      bool all = true;
      std::vector<std::string> seen;
      for (const std::string& name : names) {
        auto it = states.find(name);
        if (it == states.end() || it->second != state) all = false;
        seen.push_back(
            absl::StrCat(name, "=", it == states.end() ? "unregistered" : StateName(it->second)));
      }
      if (all) return absl::OkStatus();
      last = absl::StrJoin(seen, ", ");
    } else {
      last = workers.status().ToString();
    }
    if (absl::Now() >= deadline) {
      return absl::DeadlineExceededError(absl::StrCat("workers not ", StateName(state), " within ",
                                                      absl::FormatDuration(timeout), ": ", last));
    }
    // Registration has no push notification for clients: poll the condition.
    absl::SleepFor(kRegistrationPoll);
  }
}

absl::Status Cluster::StartCoordinator(const std::string& listen) {
  ProcessOptions po;
  po.name = "coordinator";
  po.echo_stdout = options_.echo_stdout;
  if (!options_.log_dir.empty()) {
    // coordinator.log, then coordinator.1.log, ... for restarts.
    po.stderr_path = coordinator_starts_ == 0 ? absl::StrCat(options_.log_dir, "/coordinator.log")
                                              : absl::StrCat(options_.log_dir, "/coordinator.",
                                                             coordinator_starts_, ".log");
  }
  ++coordinator_starts_;
  // Port 0 for metrics too, so that parallel tests never meet on 7401.
  std::vector<std::string> argv = {coordinator_bin_, absl::StrCat("--listen=", listen),
                                   "--http-listen=127.0.0.1:0"};
  if (options_.state_dir.empty()) {
    argv.push_back("--state=memory");
  } else {
    argv.push_back(absl::StrCat("--state-dir=", options_.state_dir));
  }
  argv.push_back(absl::StrCat("--relay-max-bytes=", options_.relay_max_bytes));
  argv.insert(argv.end(), options_.coordinator_flags.begin(), options_.coordinator_flags.end());
  absl::StatusOr<std::unique_ptr<Process>> coordinator = Process::Start(argv, po);
  if (!coordinator.ok()) return coordinator.status();
  coordinator_ = *std::move(coordinator);
  const std::string marker = "coordinator listening on ";
  absl::StatusOr<std::string> line = coordinator_->WaitForLine(marker, options_.start_timeout);
  if (!line.ok()) return line.status();
  absl::StatusOr<std::string> address = AddressAfter(*line, marker);
  if (!address.ok()) return address.status();
  coordinator_address_ = *address;
  // Printed before the listening line (absent when a flag turned it off).
  const std::string metrics_marker = "coordinator metrics on http://";
  metrics_address_.clear();
  for (const std::string& l : coordinator_->Lines()) {
    if (l.find(metrics_marker) == std::string::npos) continue;
    absl::StatusOr<std::string> url = AddressAfter(l, metrics_marker);
    if (!url.ok()) return url.status();
    metrics_address_ = url->substr(0, url->find('/'));
  }
  client_ = std::make_unique<CoordinatorClient>(coordinator_address_, options_.client_options);
  return absl::OkStatus();
}

absl::Status Cluster::KillCoordinator() {
  if (coordinator_ == nullptr) return absl::FailedPreconditionError("no running coordinator");
  client_.reset();
  absl::Status s = coordinator_->Kill();
  coordinator_.reset();
  return s;
}

absl::Status Cluster::RestartCoordinator(absl::Duration timeout) {
  if (coordinator_ != nullptr) return absl::FailedPreconditionError("coordinator still running");
  const absl::Duration saved = options_.start_timeout;
  options_.start_timeout = timeout;
  absl::Status s = StartCoordinator(coordinator_address_);
  options_.start_timeout = saved;
  return s;
}

absl::Status Cluster::KillWorker(int index) {
  if (index < 0 || index >= num_workers() || workers_[index] == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat("no running worker ", index));
  }
  absl::Status s = workers_[index]->Kill();
  workers_[index].reset();
  return s;
}

absl::Status Cluster::SignalWorker(int index, int signal) {
  if (index < 0 || index >= num_workers() || workers_[index] == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat("no running worker ", index));
  }
  return workers_[index]->Signal(signal);
}

Cluster::~Cluster() {
  // Workers first, so none of them sees its coordinator vanish mid-run and retries.
  for (auto& w : workers_) {
    if (w != nullptr) w->Signal(SIGTERM).IgnoreError();
  }
  workers_.clear();
  client_.reset();
  coordinator_.reset();
}

}  // namespace shardcoord
