#include "tests/daemon.h"

#include <sys/wait.h>

#include <cstdlib>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "tests/cluster.h"

namespace shardcoord {

std::string PrintedAddress(const Process& p, const std::string& marker) {
  for (const std::string& line : p.Lines()) {
    if (line.find(marker) == std::string::npos) continue;
    absl::StatusOr<std::string> a = AddressAfter(line, marker);
    if (a.ok()) return a->substr(0, a->find('/'));
  }
  return "";
}

namespace {

bool HasFlag(const std::vector<std::string>& flags, const std::string& name) {
  for (const std::string& f : flags) {
    if (absl::StartsWith(f, name)) return true;
  }
  return false;
}

// Starts `argv` as process `name`, its stderr in TmpDir()/<name>.log.
absl::StatusOr<Daemon> Spawn(const std::string& name, const std::vector<std::string>& argv) {
  Daemon d;
  ProcessOptions po;
  po.name = name;
  d.log = po.stderr_path = absl::StrCat(TmpDir(), "/", name, ".log");
  absl::StatusOr<std::unique_ptr<Process>> p = Process::Start(argv, po);
  if (!p.ok()) return p.status();
  d.process = *std::move(p);
  return d;
}

// Waits for the daemon's "<prefix>listening on ADDRESS" line, then takes its address and the
// "<prefix>health on ADDRESS" one.
absl::Status AwaitListening(Daemon& d, const std::string& prefix) {
  const std::string marker = absl::StrCat(prefix, "listening on ");
  absl::StatusOr<std::string> line = d.process->WaitForLine(marker, kDaemonStartTimeout);
  if (!line.ok()) return line.status();
  d.address = PrintedAddress(*d.process, marker);
  d.health = PrintedAddress(*d.process, absl::StrCat(prefix, "health on "));
  return absl::OkStatus();
}

// The command line StartWorker runs.
absl::StatusOr<std::vector<std::string>> WorkerArgv(const std::string& name,
                                                    const std::string& coordinator,
                                                    const std::vector<std::string>& flags) {
  absl::StatusOr<std::string> bin = RunfilePath("worker/worker");
  if (!bin.ok()) return bin.status();
  std::vector<std::string> argv = {*bin, absl::StrCat("--coordinator=", coordinator),
                                   absl::StrCat("--name=", name), "--backend=gloo",
                                   "--local-socket=off"};
  if (!HasFlag(flags, "--listen")) argv.push_back("--listen=127.0.0.1:0");
  argv.insert(argv.end(), flags.begin(), flags.end());
  return argv;
}

}  // namespace

absl::StatusOr<Daemon> StartCoordinator(const std::string& name, std::vector<std::string> flags) {
  absl::StatusOr<std::string> bin = RunfilePath("coordinator/coordinator");
  if (!bin.ok()) return bin.status();
  std::vector<std::string> argv = {*bin, "--state=memory", "--relay-max-bytes=0"};
  if (!HasFlag(flags, "--listen")) argv.push_back("--listen=127.0.0.1:0");
  if (!HasFlag(flags, "--http-listen")) argv.push_back("--http-listen=off");
  argv.insert(argv.end(), flags.begin(), flags.end());
  absl::StatusOr<Daemon> d = Spawn(name, argv);
  if (!d.ok()) return d.status();
  if (absl::Status s = AwaitListening(*d, "coordinator "); !s.ok()) return s;
  return d;
}

absl::StatusOr<Daemon> StartWorker(const std::string& name, const std::string& coordinator,
                                   std::vector<std::string> flags, bool wait) {
  absl::StatusOr<std::vector<std::string>> argv = WorkerArgv(name, coordinator, flags);
  if (!argv.ok()) return argv.status();
  absl::StatusOr<Daemon> d = Spawn(name, *argv);
  if (!d.ok() || !wait) return d;
  if (absl::Status s = AwaitListening(*d, absl::StrCat("worker ", name, " ")); !s.ok()) return s;
  return d;
}

absl::Status SignalAndExpectExitZero(Daemon& d, int sig, absl::Duration timeout) {
  if (absl::Status s = d.process->Signal(sig); !s.ok()) return s;
  absl::StatusOr<int> status = d.process->Wait(timeout);
  if (!status.ok()) return status.status();
  if (!WIFEXITED(*status) || WEXITSTATUS(*status) != 0) {
    return absl::InternalError(absl::StrCat(d.process->name(), " on signal ", sig, ": ",
                                            Process::DescribeWaitStatus(*status)));
  }
  return absl::OkStatus();
}

absl::StatusOr<Exited> RunToExit(const std::string& name, const std::vector<std::string>& argv,
                                 absl::Duration timeout) {
  absl::StatusOr<Daemon> d = Spawn(name, argv);
  if (!d.ok()) return d.status();
  absl::StatusOr<int> status = d->process->Wait(timeout);
  if (!status.ok()) return status.status();
  return Exited{*status, ReadFile(d->log)};
}

absl::StatusOr<Exited> RunWorkerToExit(const std::string& name, const std::string& coordinator,
                                       const std::vector<std::string>& flags,
                                       absl::Duration timeout) {
  absl::StatusOr<std::vector<std::string>> argv = WorkerArgv(name, coordinator, flags);
  if (!argv.ok()) return argv.status();
  return RunToExit(name, *argv, timeout);
}

bool StillRunning(Daemon& d) { return !d.process->Wait(absl::ZeroDuration()).ok(); }

}  // namespace shardcoord
