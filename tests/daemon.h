#ifndef SHARDCOORD_TESTS_DAEMON_H_
#define SHARDCOORD_TESTS_DAEMON_H_

// One coordinator or worker process started by a test on its own (tests/cluster.h starts a
// whole cluster): for tests that signal a daemon and read its exit status, or start a worker
// before its coordinator. Daemons run from this target's runfiles, log to TEST_TMPDIR.

#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "tests/process.h"
#include "tests/test_files.h"

namespace shardcoord {

// Bound on a daemon's startup and on its exit after a signal; never reached when all is well.
inline constexpr absl::Duration kDaemonStartTimeout = absl::Seconds(60);
inline constexpr absl::Duration kDaemonExitTimeout = absl::Seconds(60);

// One daemon process and the addresses it printed.
struct Daemon {
  std::unique_ptr<Process> process;
  std::string address;  // Main port.
  std::string health;   // --health-listen; empty when off.
  std::string log;      // Its stderr.
  bool running() const { return process != nullptr; }
};

// The text after `marker` on any stdout line of `p` so far (up to '/' for URLs); empty if
// none.
std::string PrintedAddress(const Process& p, const std::string& marker);

// A coordinator with its state in memory (unless `flags` say otherwise) and the relay off;
// --listen defaults to a free port, --http-listen to off. Returns once it printed its
// listening line. Its stderr goes to TmpDir()/<name>.log.
absl::StatusOr<Daemon> StartCoordinator(const std::string& name, std::vector<std::string> flags);

// A Gloo worker named `name` of `coordinator`; --listen defaults to a free port. With `wait`,
// returns once it is registered (its listening line); else at once.
absl::StatusOr<Daemon> StartWorker(const std::string& name, const std::string& coordinator,
                                   std::vector<std::string> flags, bool wait = true);

// Sends `sig` and waits (up to `timeout`) for the exit; OK only for exit status 0.
absl::Status SignalAndExpectExitZero(Daemon& d, int sig,
                                     absl::Duration timeout = kDaemonExitTimeout);

// How a process that was to stop by itself (e.g. refused at startup) ended.
struct Exited {
  int wait_status = 0;  // As Process::Wait gives it.
  std::string log;      // Its stderr.
};

// Runs `argv` as process `name`, its stderr in TmpDir()/<name>.log, until it exits (at most
// `timeout`): an error if it cannot start or is still running then.
absl::StatusOr<Exited> RunToExit(const std::string& name, const std::vector<std::string>& argv,
                                 absl::Duration timeout = absl::Seconds(50));

// As RunToExit, a Gloo worker as StartWorker starts it (for workers that must be refused).
absl::StatusOr<Exited> RunWorkerToExit(const std::string& name, const std::string& coordinator,
                                       const std::vector<std::string>& flags,
                                       absl::Duration timeout = absl::Seconds(50));

// Whether the process still runs (it has not exited, e.g. of a SIGSEGV).
bool StillRunning(Daemon& d);

}  // namespace shardcoord

#endif  // SHARDCOORD_TESTS_DAEMON_H_
