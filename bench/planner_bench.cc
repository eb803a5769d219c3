// Plans resharding a transformer's weights from dp=512 x tp=8 to dp=256 x tp=16 on the same
// 4096 ranks, and times the same chunk intersection done all-pairs (every target chunk
// against every source chunk, as torch.distributed.checkpoint does) in the same run.
//
//   bazel run -c opt //bench:planner_bench -- [--json] [--tensors N] [--naive-full]
//
// Times are CPU seconds of the one planning thread (robust to other load on the machine).

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <map>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "sharding/box.h"
#include "sharding/dtype.h"
#include "sharding/layout.h"
#include "sharding/mesh.h"
#include "sharding/placement.h"
#include "sharding/plan.h"
#include "sharding/planner.h"

extern double g_phase[8];
namespace shardcoord {
namespace {

constexpr int64_t kHidden = 4096;
constexpr int64_t kFfn = 14336;
constexpr int64_t kVocab = 128256;

struct TensorKind {
  std::string name;
  Shape shape;
  std::string placements;  // Same style on both meshes: "<dp>,<tp>".
};

// Column-parallel weights shard the output dim (0) over tp and the input dim over dp;
// row-parallel ones the other way round; norms are FSDP-sharded or replicated.
std::vector<TensorKind> Kinds() {
  return {
      {"embed", {kVocab, kHidden}, "S(1),S(0)"},      // 0
      {"attn_norm", {kHidden}, "S(0),R"},             // 1
      {"qkv", {3 * kHidden, kHidden}, "S(1),S(0)"},   // 2
      {"attn_out", {kHidden, kHidden}, "S(0),S(1)"},  // 3
      {"mlp_norm", {kHidden}, "R,R"},                 // 4
      {"mlp_gate", {kFfn, kHidden}, "S(1),S(0)"},     // 5
      {"mlp_up", {kFfn, kHidden}, "S(1),S(0)"},       // 6
      {"mlp_down", {kHidden, kFfn}, "S(0),S(1)"},     // 7
      {"final_norm", {kHidden}, "S(0),R"},            // 8
      {"lm_head", {kVocab, kHidden}, "S(1),S(0)"},    // 9
  };
}

// embed, then layers (7 tensors each) until two slots remain, then final norm and lm_head.
std::vector<int> TensorSequence(int n) {
  std::vector<int> seq;
  if (n > 0) seq.push_back(0);
  const int layer[] = {1, 2, 3, 4, 5, 6, 7};
  for (int i = 0; static_cast<int>(seq.size()) < n - 2; ++i) seq.push_back(layer[i % 7]);
  if (n > 2) seq.push_back(8);
  if (n > 1) seq.push_back(9);
  return seq;
}

Layout MakeLayout(int64_t dp, int64_t tp, const TensorKind& k) {
  DeviceMesh mesh = *DeviceMesh::Create({dp, tp}, {}, {"dp", "tp"});
  absl::StatusOr<Layout> l = Layout::FromPlacements(mesh, k.shape, *ParsePlacements(k.placements));
  if (!l.ok()) {
    std::fprintf(stderr, "layout %s: %s\n", k.name.c_str(),
                 std::string(l.status().message()).c_str());
    std::exit(1);
  }
  return *l;
}

// CPU time of this thread: "on one core", and robust to other processes sharing the machine.
double CpuNow() {
  timespec ts;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return ts.tv_sec + ts.tv_nsec * 1e-9;
}

double WallNow() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// The DCP way: the distinct source chunks, then every target chunk against every one of them.
struct NaiveResult {
  int64_t pieces = 0;
  int64_t bytes = 0;
};
NaiveResult AllPairs(const Layout& source, const Layout& target, int64_t esize) {
  std::vector<Box> stored;
  for (const RankChunks& rc : source.ranks()) {
    for (const Chunk& c : rc.chunks) {
      if (!c.box.Empty()) stored.push_back(c.box);
    }
  }
  std::sort(stored.begin(), stored.end());
  stored.erase(std::unique(stored.begin(), stored.end()), stored.end());
  NaiveResult r;
  for (const RankChunks& rc : target.ranks()) {
    for (const Chunk& c : rc.chunks) {
      for (const Box& s : stored) {
        if (!s.Overlaps(c.box)) continue;
        const Box piece = s.Intersect(c.box);
        ++r.pieces;
        r.bytes += piece.Volume() * esize;
      }
    }
  }
  return r;
}

int Main(int argc, char** argv) {
  bool json = false;
  int tensors = 1000;
  bool naive_full = false;
  bool plan_only = false;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--json") == 0) {
      json = true;
    } else if (std::strcmp(argv[i], "--tensors") == 0 && i + 1 < argc) {
      tensors = std::atoi(argv[++i]);
    } else if (std::strcmp(argv[i], "--naive-full") == 0) {
      naive_full = true;
    } else if (std::strcmp(argv[i], "--plan-only") == 0) {  // For profilers.
      plan_only = true;
    } else {
      std::fprintf(stderr,
                   "usage: planner_bench [--json] [--tensors N] [--naive-full] [--plan-only]\n");
      return 2;
    }
  }
  const DType dtype = DType::kBF16;
  const int64_t esize = ElementSize(dtype);
  const std::vector<TensorKind> kinds = Kinds();
  std::vector<Layout> sources, targets;
  for (const TensorKind& k : kinds) {
    sources.push_back(MakeLayout(512, 8, k));
    targets.push_back(MakeLayout(256, 16, k));
  }
  const std::vector<int> seq = TensorSequence(tensors);
  PlanOptions options;
  options.ranks_per_host = 8;

  // Planner: every tensor planned from scratch (no cache), one thread. Only the calls are
  // timed: building the input layouts and freeing the plans are the caller's business.
  // Handing the layouts over (as a coordinator does with a tensor's layouts) is the main
  // number; the copying overload is timed as well.
  int64_t transfers = 0, bytes_moved = 0, lower_bound = 0, local_copies = 0;
  double estimated = 0, plan_s = 0, plan_wall_s = 0, plan_copy_s = 0;
  std::map<std::string, int64_t> steps;
  for (int k : seq) {
    Layout src = sources[k], dst = targets[k];
    const double c0 = CpuNow(), w0 = WallNow();
    absl::StatusOr<Plan> plan = Redistribute(std::move(src), std::move(dst), dtype, options);
    plan_s += CpuNow() - c0;
    plan_wall_s += WallNow() - w0;
    if (!plan.ok()) {
      std::fprintf(stderr, "plan %s: %s\n", kinds[k].name.c_str(),
                   std::string(plan.status().message()).c_str());
      return 1;
    }
    for (const Step& s : plan->steps) {
      transfers += static_cast<int64_t>(s.transfers.size());
      ++steps[StepOpName(s.op)];
    }
    bytes_moved += plan->bytes_moved;
    lower_bound += plan->lower_bound_bytes;
    local_copies += static_cast<int64_t>(plan->local_copies.size());
    estimated += plan->estimated_seconds;
  }
  if (plan_only) {
    std::printf("planned %zu tensors in %.3f s\n", seq.size(), plan_s);
    return 0;
  }
  for (int k : seq) {
    const double c0 = CpuNow();
    absl::StatusOr<Plan> plan = Redistribute(sources[k], targets[k], dtype, options);
    plan_copy_s += CpuNow() - c0;
    if (!plan.ok()) return 1;
  }

  // The same through a plan cache: repeated layer shapes plan once.
  PlanCache cache(64);
  const double cache0 = CpuNow();
  for (int k : seq) {
    if (!cache.GetOrPlan(sources[k], targets[k], dtype, options).ok()) return 1;
  }
  const double cached_s = CpuNow() - cache0;

  // All-pairs: with --naive-full on every tensor; otherwise timed once per tensor kind (it
  // does the same work for every tensor of a kind) and summed over the sequence.
  std::vector<double> kind_s(kinds.size(), -1);
  std::vector<int64_t> kind_pieces(kinds.size(), 0);
  double naive_s = 0;
  int64_t naive_pieces = 0;
  int naive_runs = 0;
  for (int k : seq) {
    if (naive_full || kind_s[k] < 0) {
      const double c0 = CpuNow();
      const NaiveResult r = AllPairs(sources[k], targets[k], esize);
      kind_s[k] = CpuNow() - c0;
      kind_pieces[k] = r.pieces;
      ++naive_runs;
    }
    naive_s += kind_s[k];
    naive_pieces += kind_pieces[k];
  }
  const bool extrapolated = naive_runs < static_cast<int>(seq.size());
  const int64_t ranks = static_cast<int64_t>(sources[0].ranks().size());

  // Scaling: one mlp_gate tensor from (R/8) x 8 to (R/16) x 16 at growing R. The planner
  // should grow like R log R, all-pairs like R^2. Best of a few runs each.
  struct ScalePoint {
    int64_t ranks;
    double plan_ms, naive_ms;
  };
  std::vector<ScalePoint> scaling;
  for (int64_t r : {256, 1024, 4096, 16384}) {
    const TensorKind& k = kinds[5];
    const Layout s = MakeLayout(r / 8, 8, k), t = MakeLayout(r / 16, 16, k);
    double best_plan = 1e9, best_naive = 1e9;
    for (int rep = 0; rep < 3; ++rep) {
      Layout s_in = s, t_in = t;
      const double c0 = CpuNow();
      absl::StatusOr<Plan> plan = Redistribute(std::move(s_in), std::move(t_in), dtype, options);
      const double c1 = CpuNow();
      if (!plan.ok()) return 1;
      best_plan = std::min(best_plan, c1 - c0);
      if (r <= 4096 || rep == 0) {
        const double n0 = CpuNow();
        AllPairs(s, t, esize);
        best_naive = std::min(best_naive, CpuNow() - n0);
      }
    }
    scaling.push_back({r, best_plan * 1e3, best_naive * 1e3});
  }

  const bool exact = bytes_moved == lower_bound;
  std::string scaling_json;
  for (const ScalePoint& p : scaling) {
    absl::StrAppend(&scaling_json, scaling_json.empty() ? "" : ",",
                    absl::StrFormat("{\"ranks\":%d,\"plan_ms\":%.3f,\"naive_ms\":%.3f}", p.ranks,
                                    p.plan_ms, p.naive_ms));
  }
  if (json) {
    std::string step_json;
    for (const auto& [op, n] : steps) {
      absl::StrAppend(&step_json, step_json.empty() ? "" : ",", "\"", op, "\":", n);
    }
    std::printf(
        "{\"ranks\":%lld,\"tensors\":%zu,\"transfers\":%lld,\"plan_seconds\":%.6f,"
        "\"naive_seconds\":%.6f,\"speedup\":%.1f,\"bytes_moved\":%lld,"
        "\"lower_bound_bytes\":%lld,\"naive_extrapolated\":%s,\"naive_runs\":%d,"
        "\"naive_pieces\":%lld,\"plan_wall_seconds\":%.6f,"
        "\"plan_seconds_copying_layouts\":%.6f,\"plan_seconds_cached\":%.6f,"
        "\"local_copies\":%lld,\"estimated_transfer_seconds\":%.6f,\"dtype\":\"%s\","
        "\"source\":\"dp=512 x tp=8\",\"target\":\"dp=256 x tp=16\",\"steps\":{%s},"
        "\"clock\":\"thread cpu\",\"scaling\":[%s]}\n",
        static_cast<long long>(ranks), seq.size(), static_cast<long long>(transfers), plan_s,
        naive_s, naive_s / plan_s, static_cast<long long>(bytes_moved),
        static_cast<long long>(lower_bound), extrapolated ? "true" : "false", naive_runs,
        static_cast<long long>(naive_pieces), plan_wall_s, plan_copy_s, cached_s,
        static_cast<long long>(local_copies), estimated, DTypeName(dtype).c_str(),
        step_json.c_str(), scaling_json.c_str());
    return exact ? 0 : 1;
  }
  std::printf(
      "planner_bench: %lld ranks, %zu tensors (%s), dp=512 x tp=8 -> dp=256 x tp=16, "
      "CPU seconds of one thread\n",
      static_cast<long long>(ranks), seq.size(), DTypeName(dtype).c_str());
  std::printf(
      "  planner:   %.3f s (%.3f ms per tensor; wall %.3f s), %lld transfers, "
      "%lld local copies\n",
      plan_s, plan_s * 1e3 / seq.size(), plan_wall_s, static_cast<long long>(transfers),
      static_cast<long long>(local_copies));
  std::printf("  copying:   %.3f s through the overload that copies both layouts into the plan\n",
              plan_copy_s);
  std::printf("  cached:    %.3f s through PlanCache (%lld distinct plans)\n", cached_s,
              static_cast<long long>(cache.misses()));
  std::printf("  steps:     %s\n", absl::StrJoin(steps, ", ", absl::PairFormatter(": ")).c_str());
  std::printf("  bytes:     moved %lld, lower bound %lld (%s)\n",
              static_cast<long long>(bytes_moved), static_cast<long long>(lower_bound),
              exact ? "equal" : "DIFFERENT");
  std::printf("  all-pairs: %.3f s, %lld pieces (%s)\n", naive_s,
              static_cast<long long>(naive_pieces),
              extrapolated ? absl::StrCat("timed once per tensor kind, ", naive_runs,
                                          " runs, summed over the sequence")
                                 .c_str()
                           : "every tensor timed");
  std::printf("  speedup:   %.1fx over all-pairs\n", naive_s / plan_s);
  std::printf("  estimated transfer time for all tensors: %.3f s (8 ranks per host)\n", estimated);
  std::printf("  scaling (one %s tensor, R/8 x 8 -> R/16 x 16):\n", kinds[5].name.c_str());
  for (const ScalePoint& p : scaling) {
    std::printf("    R=%-6lld planner %8.3f ms   all-pairs %10.3f ms\n",
                static_cast<long long>(p.ranks), p.plan_ms, p.naive_ms);
  }
  return exact ? 0 : 1;
}

}  // namespace
}  // namespace shardcoord

int main(int argc, char** argv) { return shardcoord::Main(argc, argv); }
