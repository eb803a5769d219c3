#ifndef SHARDCOORD_BENCH_BENCH_COMMON_H_
#define SHARDCOORD_BENCH_BENCH_COMMON_H_

// What the end-to-end benches share: sample statistics, failing loudly, and the peer
// baselines they start as child processes (raw Gloo ranks, a Python torch.distributed script)
// whose one-line JSON results they parse.

#include <sys/types.h>

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "client/coordinator_client.h"
#include "proto/shardcoord.pb.h"

namespace shardcoord {
namespace bench {

struct Stats {
  std::vector<double> seconds;
  double Best() const;
  double Median() const;
  // Nearest rank: the smallest value with at least p% of the samples at or below it.
  double Percentile(double p) const;
};

// Prints "<program>: message" to stderr and exits 1.
[[noreturn]] void Die(const std::string& message);

template <typename T>
T OrDie(absl::StatusOr<T> v, const std::string& what) {
  if (!v.ok()) Die(absl::StrCat(what, ": ", v.status().ToString()));
  return *std::move(v);
}
inline void OrDie(const absl::Status& s, const std::string& what) {
  if (!s.ok()) Die(absl::StrCat(what, ": ", s.ToString()));
}

// The result of a peer run: its setup time, the bytes it moved and its timed seconds.
struct PeerResult {
  bool ran = false;
  std::string skipped;  // Why it did not run.
  double setup_seconds = 0;
  int64_t bytes = 0;
  Stats stats;
};

// A bench's scratch directory, <temp dir>/shardcoord_<bench>.<pid>, created.
std::string ScratchDir(const std::string& bench);
// Where a bench's daemons log: `log_dir` (its --log_dir) when set, else `tmp`; created.
std::string LogDir(const std::string& log_dir, const std::string& tmp);

// Drops a file's pages from the page cache: fdatasync, then posix_fadvise(POSIX_FADV_DONTNEED)
// (clean pages go). Needs no root and touches only this file, unlike
// /proc/sys/vm/drop_caches on a machine shared with other builds. Dies when it cannot open it.
void EvictFromPageCache(const std::string& path);
// Bytes of `path` resident in the page cache now (mincore over a mapping; 0 for a missing file).
int64_t ResidentBytes(const std::string& path);
// Reads the whole file sequentially (POSIX_FADV_SEQUENTIAL, reads of `piece_bytes`) and
// returns the bytes read (dies when it cannot open it).
int64_t ReadSequentially(const std::string& path, int64_t piece_bytes = int64_t{64} << 20);

// User + system CPU seconds the processes have used so far (/proc/PID/stat).
double ProcessCpuSeconds(const std::vector<pid_t>& pids);
// The calling thread's CPU seconds so far (CLOCK_THREAD_CPUTIME_ID).
double ThreadCpuSeconds();

// The number after "key": in a one-line JSON object written by our peers.
bool JsonNumber(const std::string& line, const std::string& key, double* out);
// The numbers of the array after "key":.
bool JsonNumbers(const std::string& line, const std::string& key, std::vector<double>* out);

// A peer's {"setup_seconds": .., "bytes": .., "seconds": [..]} line (dies when malformed).
PeerResult ParsePeerLine(const std::string& line);

// One run of `size` //bench:gloo_alltoall processes (a FileStore under `tmp`): `iters` timed
// alltoallv of `matrix` (size*size bytes, [i*size+j] = what i sends to j) after one warm-up.
PeerResult RunGlooAlltoall(const std::vector<int64_t>& matrix, int size, int iters,
                           const std::string& tmp);

// Runs `python script args...` and parses the line of its stdout that holds "seconds".
// Exit status 3 means the peer cannot run here (no torch): returned as skipped, with
// `skip_reason`; any other failure dies.
PeerResult RunPythonPeer(const std::string& python, const std::string& script,
                         const std::vector<std::string>& args, const std::string& skip_reason,
                         absl::Duration timeout);

// Adds what each of `ranks` (global ranks, by position) sends to each other in `plan`'s
// transfers to `matrix` ([i * n + j]: position i to position j, n = ranks.size()).
// INVALID_ARGUMENT when a transfer names a rank outside `ranks`.
absl::Status AddPlanTraffic(const v1::Plan& plan, const std::vector<int64_t>& ranks,
                            std::vector<int64_t>* matrix);

// As AddPlanTraffic, from a fused group's trace (GetPlanTrace of the group's id): what each
// rank's exchange rounds sent to their peers (steps of op "fused_exchange"). A group's
// members report only their totals, so their transfers are read here, as the workers moved
// them.
absl::Status AddGroupTraffic(const v1::PlanTrace& trace, const std::vector<int64_t>& ranks,
                             std::vector<int64_t>* matrix);

// ---- Small-op latency (issue 10: a 4 KiB redistribute against a bare unary RPC).

// One plan as the client saw it.
struct ClientSpan {
  std::string plan_id;
  absl::Time start, end;  // At the client: the call and its answer.
};

// `runs` redistributes of `tensor` between S(1) and S(0) (a tensor with S(0) on a 1-d mesh),
// timed into `latency`, and as many bare GetMesh(`mesh`) calls into `bare_rpc`: blocks of 20
// of each take turns, so both see the machine's load but no bare RPC is timed in the tail of
// a plan (its asynchronous buffer drops). Dies when a plan does not commit.
std::vector<ClientSpan> TimeSmallRedistributes(CoordinatorClient& client, const std::string& tensor,
                                               const std::string& mesh, int runs, Stats* latency,
                                               Stats* bare_rpc);

// Whether this binary was built with -c opt (NDEBUG). The daemons a bench starts come from
// its runfiles, built in the same configuration; and bazel-bin follows the configuration
// of the last build, so bazel-bin/bench/... after `bazel test //...` is a fastbuild, several
// times slower. Benches call WarnIfUnoptimized first, and their JSON says "optimized".
#ifdef NDEBUG
inline constexpr bool kOptimizedBuild = true;
#else
inline constexpr bool kOptimizedBuild = false;
#endif
// A warning on stderr naming `bench` when !kOptimizedBuild.
void WarnIfUnoptimized(const char* bench);

// A bench's main: parses the flags, warns when unoptimized (WarnIfUnoptimized(`bench`)) and
// returns `run`(). `as_coordinator`: the bench times the coordinator's own logic in-process,
// so an optimized build ignores mutex deadlock cycles as the coordinator's does
// (coordinator/main.cc).
int Main(int argc, char** argv, const char* bench, int (*run)(), bool as_coordinator = false);

struct Phase {
  std::string name;
  Stats stats;
};

// Where the time of the last (up to 100) spans' plans went, from their traces (the client's,
// the coordinator's and the workers' clocks: one host here): client_to_planned (the call,
// checks, planning, the version), dispatch (to the first fragment start), start_skew (first
// to last fragment start), fragments (last start to last end: the step), reports (to the
// last report in), validate_commit (validation and the durable commit), answer (until the
// client has the reply). Empty when no trace was found.
std::vector<Phase> LatencyPhases(CoordinatorClient& client, const std::vector<ClientSpan>& spans);

inline double GBps(int64_t bytes, double seconds) {
  return seconds > 0 ? bytes / seconds / 1e9 : 0;
}

}  // namespace bench
}  // namespace shardcoord

#endif  // SHARDCOORD_BENCH_BENCH_COMMON_H_
