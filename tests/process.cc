#include "tests/process.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

extern char** environ;

namespace shardcoord {
namespace {

constexpr char kWorkspace[] = "shardcoord";
constexpr absl::Duration kTermGrace = absl::Seconds(5);
constexpr absl::Duration kWaitPoll = absl::Milliseconds(5);

bool IsExecutableFile(const std::string& path) { return access(path.c_str(), X_OK) == 0; }

std::vector<char*> CStrings(std::vector<std::string>& strings) {
  std::vector<char*> out;
  out.reserve(strings.size() + 1);
  for (std::string& s : strings) out.push_back(s.data());
  out.push_back(nullptr);
  return out;
}

}  // namespace

CommandResult RunCommand(const std::string& command) {
  CommandResult result;
  FILE* pipe = popen(absl::StrCat(command, " 2>&1").c_str(), "r");
  if (pipe == nullptr) return result;
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof(buf), pipe)) > 0) result.output.append(buf, n);
  const int status = pclose(pipe);
  result.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return result;
}

CommandResult RunShardctl(const std::vector<std::string>& args) {
  CommandResult result;
  absl::StatusOr<std::string> bin = RunfilePath("client/shardctl");
  if (!bin.ok()) {
    result.output = bin.status().ToString();
    return result;
  }
  std::string command = absl::StrCat("'", *bin, "'");
  for (const std::string& a : args) absl::StrAppend(&command, " '", a, "'");
  return RunCommand(command);
}

absl::StatusOr<std::string> RunfilePath(absl::string_view relative_path) {
  std::vector<std::string> roots;
  for (const char* var : {"TEST_SRCDIR", "RUNFILES_DIR"}) {
    const char* v = std::getenv(var);
    if (v != nullptr && v[0] != '\0') roots.push_back(v);
  }
  char self[4096];
  const ssize_t n = readlink("/proc/self/exe", self, sizeof(self) - 1);
  if (n > 0) roots.push_back(absl::StrCat(absl::string_view(self, n), ".runfiles"));
  std::vector<std::string> tried;
  for (const std::string& root : roots) {
    std::string path = absl::StrCat(root, "/", kWorkspace, "/", relative_path);
    if (access(path.c_str(), F_OK) == 0) return path;
    tried.push_back(std::move(path));
  }
  return absl::NotFoundError(
      absl::StrCat("runfile '", relative_path, "' not found; tried ", absl::StrJoin(tried, ", ")));
}

absl::StatusOr<std::unique_ptr<Process>> Process::Start(std::vector<std::string> argv,
                                                        ProcessOptions options) {
  if (argv.empty()) return absl::InvalidArgumentError("argv is empty");
  if (!IsExecutableFile(argv[0])) {
    return absl::NotFoundError(absl::StrCat("'", argv[0], "' is not an executable file"));
  }
  if (options.name.empty()) options.name = argv[0];

  // Everything the child touches is prepared before fork: between fork and exec a
  // multithreaded parent's child may only make async-signal-safe calls.
  std::vector<std::string> env;
  for (char** e = environ; *e != nullptr; ++e) env.push_back(*e);
  for (const std::string& e : options.extra_env) env.push_back(e);
  std::vector<char*> c_argv = CStrings(argv);
  std::vector<char*> c_env = CStrings(env);

  int stderr_fd = -1;
  if (!options.stderr_path.empty()) {
    stderr_fd = open(options.stderr_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (stderr_fd < 0) {
      return absl::InternalError(
          absl::StrCat("open ", options.stderr_path, ": ", std::strerror(errno)));
    }
  }
  // O_CLOEXEC: pipes of other children started concurrently must not leak into this one
  // (the reader would never see EOF).
  int fds[2];
  if (pipe2(fds, O_CLOEXEC) != 0) {
    if (stderr_fd >= 0) close(stderr_fd);
    return absl::InternalError(absl::StrCat("pipe2: ", std::strerror(errno)));
  }
  const pid_t parent = getpid();
  const pid_t pid = fork();
  if (pid < 0) {
    const int err = errno;
    close(fds[0]);
    close(fds[1]);
    if (stderr_fd >= 0) close(stderr_fd);
    return absl::InternalError(absl::StrCat("fork: ", std::strerror(err)));
  }
  if (pid == 0) {
    // dup2 clears O_CLOEXEC on the new descriptor.
    if (dup2(fds[1], STDOUT_FILENO) < 0) _exit(126);
    if (stderr_fd >= 0 && dup2(stderr_fd, STDERR_FILENO) < 0) _exit(126);
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (getppid() != parent) _exit(125);  // The parent died before prctl.
    execve(c_argv[0], c_argv.data(), c_env.data());
    _exit(127);
  }
  close(fds[1]);
  if (stderr_fd >= 0) close(stderr_fd);
  return std::unique_ptr<Process>(new Process(pid, fds[0], std::move(options)));
}

Process::Process(pid_t pid, int stdout_fd, ProcessOptions options)
    : pid_(pid), stdout_fd_(stdout_fd), options_(std::move(options)) {
  reader_ = std::thread([this] { ReadLoop(); });
}

Process::~Process() {
  bool reaped;
  {
    absl::MutexLock lock(&mu_);
    reaped = reaped_;
  }
  if (!reaped) {
    kill(pid_, SIGTERM);
    if (!Wait(kTermGrace).ok()) {
      kill(pid_, SIGKILL);
      Wait(absl::InfiniteDuration()).IgnoreError();
    }
  }
  reader_.join();
  close(stdout_fd_);
}

void Process::ReadLoop() {
  std::string pending;
  char buf[4096];
  while (true) {
    const ssize_t n = read(stdout_fd_, buf, sizeof(buf));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    pending.append(buf, static_cast<size_t>(n));
    size_t start = 0;
    for (size_t nl = pending.find('\n'); nl != std::string::npos; nl = pending.find('\n', start)) {
      std::string line = pending.substr(start, nl - start);
      start = nl + 1;
      if (options_.echo_stdout) {
        std::fprintf(stderr, "[%s] %s\n", options_.name.c_str(), line.c_str());
      }
      absl::MutexLock lock(&mu_);
      lines_.push_back(std::move(line));
    }
    pending.erase(0, start);
  }
  absl::MutexLock lock(&mu_);
  if (!pending.empty()) lines_.push_back(std::move(pending));
  eof_ = true;
}

absl::StatusOr<std::string> Process::WaitForLine(absl::string_view needle, absl::Duration timeout) {
  size_t checked = 0;
  bool matched = false;
  std::string found;
  auto ready = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    for (; checked < lines_.size(); ++checked) {
      if (absl::StrContains(lines_[checked], needle)) {
        found = lines_[checked];
        matched = true;
        return true;
      }
    }
    return eof_;
  };
  std::string tail;
  {
    absl::MutexLock lock(&mu_);
    mu_.AwaitWithTimeout(absl::Condition(&ready), timeout);
    if (matched) return found;
    const size_t from = lines_.size() > 5 ? lines_.size() - 5 : 0;
    tail = absl::StrJoin(lines_.begin() + from, lines_.end(), " | ");
    if (!eof_) {
      return absl::DeadlineExceededError(
          absl::StrCat(options_.name, " printed no line containing '", needle, "' within ",
                       absl::FormatDuration(timeout), "; last lines: ", tail));
    }
  }
  absl::StatusOr<int> status = Wait(absl::Seconds(5));
  return absl::FailedPreconditionError(absl::StrCat(
      options_.name, " closed stdout before printing '", needle, "' (",
      status.ok() ? DescribeWaitStatus(*status) : "still running", "); last lines: ", tail));
}

std::vector<std::string> Process::Lines() const {
  absl::MutexLock lock(&mu_);
  return lines_;
}

absl::Status Process::Signal(int signal) {
  absl::MutexLock lock(&mu_);
  if (reaped_) return absl::OkStatus();
  if (kill(pid_, signal) != 0) {
    return absl::InternalError(
        absl::StrCat("kill ", options_.name, " (pid ", pid_, "): ", std::strerror(errno)));
  }
  return absl::OkStatus();
}

absl::StatusOr<int> Process::Wait(absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  while (true) {
    {
      absl::MutexLock lock(&mu_);
      if (reaped_) return wait_status_;
    }
    int status = 0;
    const pid_t r = waitpid(pid_, &status, WNOHANG);
    if (r == pid_) {
      absl::MutexLock lock(&mu_);
      reaped_ = true;
      wait_status_ = status;
      return status;
    }
    if (r < 0 && errno != EINTR) {
      return absl::InternalError(
          absl::StrCat("waitpid ", options_.name, ": ", std::strerror(errno)));
    }
    if (absl::Now() >= deadline) {
      return absl::DeadlineExceededError(absl::StrCat(
          options_.name, " (pid ", pid_, ") still running after ", absl::FormatDuration(timeout)));
    }
    // waitpid has no timeout; polling the exit is cheap and bounded by the deadline.
    absl::SleepFor(kWaitPoll);
  }
}

absl::Status Process::Kill() {
  if (absl::Status s = Signal(SIGKILL); !s.ok()) return s;
  return Wait(absl::InfiniteDuration()).status();
}

std::string Process::DescribeWaitStatus(int status) {
  if (WIFEXITED(status)) return absl::StrCat("exited with ", WEXITSTATUS(status));
  if (WIFSIGNALED(status)) return absl::StrCat("killed by signal ", WTERMSIG(status));
  return absl::StrCat("wait status ", status);
}

}  // namespace shardcoord
