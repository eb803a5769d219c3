#ifndef SHARDCOORD_TESTS_PROCESS_H_
#define SHARDCOORD_TESTS_PROCESS_H_

// A child process for integration tests and benchmarks: started with fork/exec, its stdout
// read line by line on a thread of ours (so it never blocks on a full pipe), and waited for
// by content ("listening on ...") with a deadline instead of sleeps.

#include <sys/types.h>

#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace shardcoord {

// The absolute path of a runfile of this workspace ("coordinator/coordinator"): looked up
// under $TEST_SRCDIR (bazel test), $RUNFILES_DIR, then <this binary>.runfiles (bazel run).
// NOT_FOUND naming every place tried.
absl::StatusOr<std::string> RunfilePath(absl::string_view relative_path);

// A shell command run to its end: its exit code (-1 when it did not exit normally) and its
// stdout and stderr together.
struct CommandResult {
  int exit_code = -1;
  std::string output;
};
CommandResult RunCommand(const std::string& command);

// This workspace's shardctl (a runfile) with `args`, each quoted for the shell, run to its
// end; when the binary is not found, exit code -1 and the error as output.
CommandResult RunShardctl(const std::vector<std::string>& args);

struct ProcessOptions {
  // Prefix for echoed lines ("[w0] ..."); also used in error messages.
  std::string name;
  // Copy every stdout line to our stderr (test logs show what daemons printed).
  bool echo_stdout = true;
  // Where the child's stderr goes: empty = inherited; otherwise a file (truncated).
  std::string stderr_path;
  // Extra environment entries ("KEY=value") on top of ours.
  std::vector<std::string> extra_env;
};

class Process {
 public:
  // Starts argv[0] (a path) with argv. The child gets SIGKILL when the thread that started
  // it exits (PR_SET_PDEATHSIG), so a crashed test leaves no daemons behind: start
  // processes from a thread that outlives them (the test's main thread).
  static absl::StatusOr<std::unique_ptr<Process>> Start(std::vector<std::string> argv,
                                                        ProcessOptions options = {});

  // SIGTERM, then SIGKILL if it has not exited within 5 s; reaps it.
  ~Process();

  Process(const Process&) = delete;
  Process& operator=(const Process&) = delete;

  pid_t pid() const { return pid_; }
  const std::string& name() const { return options_.name; }

  // Blocks until a stdout line contains `needle` and returns that line. DEADLINE_EXCEEDED
  // when `timeout` passes first; FAILED_PRECONDITION when stdout closes first (the process
  // died), with its exit status and last lines.
  absl::StatusOr<std::string> WaitForLine(absl::string_view needle, absl::Duration timeout);

  // Every stdout line so far.
  std::vector<std::string> Lines() const;

  // Sends `signal` (no-op once reaped).
  absl::Status Signal(int signal);

  // Waits for the process to exit and returns its wait status (as waitpid gives it).
  // DEADLINE_EXCEEDED when `timeout` passes first (the process keeps running).
  absl::StatusOr<int> Wait(absl::Duration timeout);

  // SIGKILL and reap.
  absl::Status Kill();

  // "exited with 3", "killed by signal 9".
  static std::string DescribeWaitStatus(int status);

 private:
  Process(pid_t pid, int stdout_fd, ProcessOptions options);
  void ReadLoop();

  const pid_t pid_;
  const int stdout_fd_;
  const ProcessOptions options_;
  std::thread reader_;

  mutable absl::Mutex mu_;
  std::vector<std::string> lines_ ABSL_GUARDED_BY(mu_);
  bool eof_ ABSL_GUARDED_BY(mu_) = false;
  bool reaped_ ABSL_GUARDED_BY(mu_) = false;
  int wait_status_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace shardcoord

#endif  // SHARDCOORD_TESTS_PROCESS_H_
