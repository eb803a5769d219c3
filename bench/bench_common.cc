#include "bench/bench_common.h"

#include <errno.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <climits>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <memory>

#include "absl/flags/parse.h"
#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "tests/process.h"
#include "tests/tensor_check.h"

namespace shardcoord {
namespace bench {

double Stats::Best() const { return *std::min_element(seconds.begin(), seconds.end()); }

double Stats::Median() const {
  std::vector<double> s = seconds;
  std::sort(s.begin(), s.end());
  const size_t n = s.size();
  return n % 2 == 1 ? s[n / 2] : (s[n / 2 - 1] + s[n / 2]) / 2;
}

double Stats::Percentile(double p) const {
  std::vector<double> s = seconds;
  std::sort(s.begin(), s.end());
  size_t k = static_cast<size_t>(std::ceil(p / 100.0 * static_cast<double>(s.size())));
  k = std::clamp<size_t>(k, 1, s.size());
  return s[k - 1];
}

void Die(const std::string& message) {
  std::fprintf(stderr, "%s: %s\n", program_invocation_short_name, message.c_str());
  std::exit(1);
}

std::string ScratchDir(const std::string& bench) {
  const std::string tmp =
      std::filesystem::temp_directory_path() / absl::StrCat("shardcoord_", bench, ".", getpid());
  std::filesystem::create_directories(tmp);
  return tmp;
}

std::string LogDir(const std::string& log_dir, const std::string& tmp) {
  const std::string dir = log_dir.empty() ? tmp : log_dir;
  std::filesystem::create_directories(dir);
  return dir;
}

void EvictFromPageCache(const std::string& path) {
  const int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) Die(absl::StrCat("open ", path, ": ", std::strerror(errno)));
  fdatasync(fd);
  posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
  close(fd);
}

int64_t ResidentBytes(const std::string& path) {
  const int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return 0;
  struct stat st;
  fstat(fd, &st);
  int64_t resident = 0;
  if (st.st_size > 0) {
    void* map = mmap(nullptr, static_cast<size_t>(st.st_size), PROT_READ, MAP_SHARED, fd, 0);
    if (map != MAP_FAILED) {
      const int64_t page = sysconf(_SC_PAGESIZE);
      std::vector<unsigned char> vec(static_cast<size_t>((st.st_size + page - 1) / page));
      if (mincore(map, static_cast<size_t>(st.st_size), vec.data()) == 0) {
        for (unsigned char v : vec) resident += (v & 1) ? page : 0;
      }
      munmap(map, static_cast<size_t>(st.st_size));
    }
  }
  close(fd);
  return resident;
}

int64_t ReadSequentially(const std::string& path, int64_t piece_bytes) {
  const int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) Die(absl::StrCat("open ", path, ": ", std::strerror(errno)));
  posix_fadvise(fd, 0, 0, POSIX_FADV_SEQUENTIAL);
  std::string in(static_cast<size_t>(piece_bytes), '\0');
  int64_t got = 0;
  while (true) {
    const ssize_t r = read(fd, in.data(), in.size());
    if (r <= 0) break;
    got += r;
  }
  close(fd);
  return got;
}

double ProcessCpuSeconds(const std::vector<pid_t>& pids) {
  double total = 0;
  for (pid_t pid : pids) {
    std::ifstream in(absl::StrCat("/proc/", pid, "/stat"));
    std::string stat((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    const size_t paren = stat.rfind(')');
    if (paren == std::string::npos) continue;
    std::vector<std::string> f = absl::StrSplit(stat.substr(paren + 2), ' ');
    int64_t utime = 0, stime = 0;  // Fields 14 and 15 of the whole line.
    if (f.size() > 12 && absl::SimpleAtoi(f[11], &utime) && absl::SimpleAtoi(f[12], &stime)) {
      total += static_cast<double>(utime + stime) / sysconf(_SC_CLK_TCK);
    }
  }
  return total;
}

double ThreadCpuSeconds() {
  timespec ts;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + static_cast<double>(ts.tv_nsec) * 1e-9;
}

bool JsonNumber(const std::string& line, const std::string& key, double* out) {
  const size_t at = line.find(absl::StrCat("\"", key, "\""));
  if (at == std::string::npos) return false;
  const size_t colon = line.find(':', at);
  if (colon == std::string::npos) return false;
  size_t end = line.find_first_of(",}", colon);
  std::string text(absl::StripAsciiWhitespace(line.substr(colon + 1, end - colon - 1)));
  return absl::SimpleAtod(text, out);
}

bool JsonNumbers(const std::string& line, const std::string& key, std::vector<double>* out) {
  const size_t at = line.find(absl::StrCat("\"", key, "\""));
  if (at == std::string::npos) return false;
  const size_t open = line.find('[', at), close = line.find(']', at);
  if (open == std::string::npos || close == std::string::npos) return false;
  out->clear();
  for (absl::string_view item : absl::StrSplit(line.substr(open + 1, close - open - 1), ',')) {
    double v;
    if (!absl::SimpleAtod(absl::StripAsciiWhitespace(item), &v)) return false;
    out->push_back(v);
  }
  return !out->empty();
}

PeerResult ParsePeerLine(const std::string& line) {
  PeerResult r;
  double bytes = 0;
  if (!JsonNumber(line, "setup_seconds", &r.setup_seconds) || !JsonNumber(line, "bytes", &bytes) ||
      !JsonNumbers(line, "seconds", &r.stats.seconds)) {
    Die(absl::StrCat("cannot parse peer output '", line, "'"));
  }
  r.bytes = static_cast<int64_t>(bytes);
  r.ran = true;
  return r;
}

PeerResult RunGlooAlltoall(const std::vector<int64_t>& matrix, int size, int iters,
                           const std::string& tmp) {
  static int run = 0;
  constexpr absl::Duration kTimeout = absl::Minutes(5);
  const std::string bin = OrDie(RunfilePath("bench/gloo_alltoall"), "gloo_alltoall");
  const std::string store = absl::StrCat(tmp, "/gloo_store_", run++);
  std::filesystem::create_directories(store);
  std::vector<std::unique_ptr<Process>> ranks;
  for (int r = 0; r < size; ++r) {
    ProcessOptions options;
    options.name = absl::StrCat("gloo", r);
    options.echo_stdout = false;
    ranks.push_back(
        OrDie(Process::Start({bin, absl::StrCat("--rank=", r), absl::StrCat("--size=", size),
                              absl::StrCat("--store_dir=", store),
                              absl::StrCat("--matrix=", absl::StrJoin(matrix, ",")),
                              absl::StrCat("--iters=", iters), "--warmup=1"},
                             options),
              "start gloo_alltoall"));
  }
  std::string line = OrDie(ranks[0]->WaitForLine("\"seconds\"", kTimeout), "gloo rank 0");
  for (auto& p : ranks) {
    const int status = OrDie(p->Wait(kTimeout), p->name());
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
      Die(absl::StrCat(p->name(), " ", Process::DescribeWaitStatus(status)));
    }
  }
  std::filesystem::remove_all(store);
  return ParsePeerLine(line);
}

PeerResult RunPythonPeer(const std::string& python, const std::string& script,
                         const std::vector<std::string>& args, const std::string& skip_reason,
                         absl::Duration timeout) {
  PeerResult r;
  if (access(python.c_str(), X_OK) != 0) {
    r.skipped = absl::StrCat(python, " not found");
    return r;
  }
  std::vector<std::string> argv = {python, script};
  argv.insert(argv.end(), args.begin(), args.end());
  ProcessOptions options;
  options.name = std::filesystem::path(script).filename();
  options.echo_stdout = false;
  std::unique_ptr<Process> p = OrDie(Process::Start(argv, options), "start " + options.name);
  const int status = OrDie(p->Wait(timeout), options.name);
  if (WIFEXITED(status) && WEXITSTATUS(status) == 3) {
    r.skipped = skip_reason;
    return r;
  }
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
    Die(absl::StrCat(options.name, " ", Process::DescribeWaitStatus(status), ": ",
                     absl::StrJoin(p->Lines(), " | ")));
  }
  for (const std::string& line : p->Lines()) {
    if (line.find("\"seconds\"") != std::string::npos) return ParsePeerLine(line);
  }
  Die(options.name + " printed no result");
}

namespace {

// Index of `rank` in `ranks`, or -1.
int64_t PositionOf(const std::vector<int64_t>& ranks, int64_t rank) {
  for (size_t i = 0; i < ranks.size(); ++i) {
    if (ranks[i] == rank) return static_cast<int64_t>(i);
  }
  return -1;
}

}  // namespace

absl::Status AddPlanTraffic(const v1::Plan& plan, const std::vector<int64_t>& ranks,
                            std::vector<int64_t>* matrix) {
  const size_t n = ranks.size();
  for (const v1::Step& step : plan.steps()) {
    for (const v1::Transfer& t : step.transfers()) {
      const int64_t i = PositionOf(ranks, t.src()), j = PositionOf(ranks, t.dst());
      if (i < 0 || j < 0) {
        return absl::InvalidArgumentError(absl::StrCat("plan ", plan.id(), " moves rank ", t.src(),
                                                       " -> ", t.dst(), ", outside the ranks ",
                                                       absl::StrJoin(ranks, ",")));
      }
      (*matrix)[i * n + j] += t.bytes();
    }
  }
  return absl::OkStatus();
}

absl::Status AddGroupTraffic(const v1::PlanTrace& trace, const std::vector<int64_t>& ranks,
                             std::vector<int64_t>* matrix) {
  const size_t n = ranks.size();
  for (const v1::RankTrace& rank : trace.ranks()) {
    for (const v1::StepTiming& step : rank.steps()) {
      if (step.op() != "fused_exchange" || step.send_peer() < 0) continue;
      const int64_t i = PositionOf(ranks, rank.rank()), j = PositionOf(ranks, step.send_peer());
      if (i < 0 || j < 0) {
        return absl::InvalidArgumentError(
            absl::StrCat("group ", trace.plan_id(), " moves rank ", rank.rank(), " -> ",
                         step.send_peer(), ", outside the ranks ", absl::StrJoin(ranks, ",")));
      }
      (*matrix)[i * n + j] += step.bytes_sent();
    }
  }
  return absl::OkStatus();
}

std::vector<ClientSpan> TimeSmallRedistributes(CoordinatorClient& client, const std::string& tensor,
                                               const std::string& mesh, int runs, Stats* latency,
                                               Stats* bare_rpc) {
  constexpr int kBlock = 20;
  std::vector<ClientSpan> spans;
  for (int i = 0; i < runs; ++i) {
    if (i % kBlock == 0) {
      for (int k = 0; k < kBlock; ++k) {
        const absl::Time rpc_start = absl::Now();
        OrDie(client.GetMesh(mesh), "bare GetMesh");
        bare_rpc->seconds.push_back(absl::ToDoubleSeconds(absl::Now() - rpc_start));
      }
    }
    const std::string spec = i % 2 == 0 ? "S(1)" : "S(0)";
    const absl::Time start = absl::Now();
    v1::RedistributeResponse r =
        OrDie(client.Redistribute(RedistributeTo(tensor, "", spec)), "small redistribute");
    const absl::Time end = absl::Now();
    latency->seconds.push_back(absl::ToDoubleSeconds(end - start));
    if (r.progress().state() != v1::COMMITTED) Die("a small plan did not commit");
    spans.push_back({r.progress().plan_id(), start, end});
  }
  return spans;
}

void WarnIfUnoptimized(const char* bench) {
  if (kOptimizedBuild) return;
  std::fprintf(
      stderr,
      "%s: WARNING: not an optimized build (no -c opt): its numbers (and those of the daemons "
      "it starts) are several times slower than with `bazel run -c opt //bench:%s`\n",
      bench, bench);
}

int Main(int argc, char** argv, const char* bench, int (*run)(), bool as_coordinator) {
  absl::ParseCommandLine(argc, argv);
  WarnIfUnoptimized(bench);
#ifdef NDEBUG
  if (as_coordinator) absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kIgnore);
#endif
  return run();
}

std::vector<Phase> LatencyPhases(CoordinatorClient& client, const std::vector<ClientSpan>& spans) {
  std::vector<Phase> phases = {
      {"client_to_planned"}, {"dispatch"},        {"start_skew"}, {"fragments"},
      {"reports"},           {"validate_commit"}, {"answer"}};
  const size_t from = spans.size() > 100 ? spans.size() - 100 : 0;
  for (size_t i = from; i < spans.size(); ++i) {
    absl::StatusOr<v1::PlanTrace> t = client.GetPlanTrace(spans[i].plan_id);
    if (!t.ok() || t->ranks_size() == 0 || t->end_unix_us() == 0) continue;
    int64_t first_start = INT64_MAX, last_start = 0, last_end = 0;
    for (const v1::RankTrace& r : t->ranks()) {
      first_start = std::min(first_start, r.start_unix_us());
      last_start = std::max(last_start, r.start_unix_us());
      last_end = std::max(last_end, r.end_unix_us());
    }
    const int64_t marks[] = {absl::ToUnixMicros(spans[i].start),
                             t->start_unix_us(),
                             first_start,
                             last_start,
                             last_end,
                             t->transferred_unix_us(),
                             t->end_unix_us(),
                             absl::ToUnixMicros(spans[i].end)};
    for (size_t k = 0; k < phases.size(); ++k) {
      phases[k].stats.seconds.push_back(static_cast<double>(marks[k + 1] - marks[k]) * 1e-6);
    }
  }
  if (phases[0].stats.seconds.empty()) return {};
  return phases;
}

}  // namespace bench
}  // namespace shardcoord
