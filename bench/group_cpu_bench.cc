// The coordinator's own CPU for a group of many small tensors: PlanManager, TensorManager,
// admission and metrics as the coordinator composes them, in one process, with the workers
// played by fakes (fragments answered with correct reports; no sockets, no state store).
// Baseline in the same run: the same tensors moved one plan at a time, the way they went
// before groups existed. Each figure is the CPU seconds of the one calling thread (robust to
// other load on the machine), best and median of --reps.
//
//   bazel run -c opt //bench:group_cpu_bench -- [--json] [--tensors 1000] [--reps 10]
//
// What this leaves out, and model_bench's "its CPU" line includes: gRPC and protobuf on the
// coordinator's edges, and the SQLite commit.

#include <cstdint>
#include <cstdio>
#include <string>
#include <utility>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
#include "bench/bench_common.h"
#include "bench/coordinator_logic.h"
#include "coordinator/cluster/worker_client.h"
#include "coordinator/cluster/worker_manager.h"
#include "coordinator/plans/plan_manager.h"
#include "coordinator/state/tensor_manager.h"
#include "coordinator/testing/fake_reports.h"
#include "sharding/placement.h"

ABSL_FLAG(bool, json, false, "Print one JSON object instead of text.");
ABSL_FLAG(int, tensors, 1000, "Tensors of 4 KiB (32x32 f32) in the group.");
ABSL_FLAG(int, reps, 10, "Timed repetitions of each kind (after one warm-up).");
ABSL_FLAG(bool, per_tensor, true, "Time the baseline, one plan per tensor (off: profile groups).");

namespace shardcoord {
namespace {

// Workers that take every fragment and FinishPlan at once and keep the fragments for the
// reports; nothing else is called by the plans timed here. Cheaper than FakeWorkerClient,
// which simulates buffers: its work would count as the coordinator's here.
class QueueingWorkerClient : public bench::PlanOnlyWorkerClient {
 public:
  void Execute(const WorkerEndpoint&, v1::PlanFragment fragment, StatusCallback done) override {
    queued_.push_back(std::move(fragment));
    done(absl::OkStatus());
  }
  void FinishPlan(const WorkerEndpoint&, v1::FinishPlanRequest, StatusCallback done) override {
    done(absl::OkStatus());
  }

  // The fragments sent since the last call. Single-threaded: the fakes answer inline.
  std::vector<v1::PlanFragment> Take() { return std::exchange(queued_, {}); }

 private:
  std::vector<v1::PlanFragment> queued_;
};

// The coordinator's plan logic (bench::CoordinatorLogic) over four fake workers.
class Harness {
 public:
  Harness() {
    for (int i = 0; i < 4; ++i) {
      const std::string name = absl::StrCat("w", i);
      OrDie(logic_.workers().Register(WorkerSpec{name, "h", "cpu", name + ":1", "gloo"}),
            "register");
    }
    OrDie(logic_.meshes().Create("N", {4}, {}, {}), "mesh");
  }

  // A ready 32x32 f32 tensor, S(0) on N.
  void Create(const std::string& name) {
    TensorRecord t;
    t.name = name;
    t.shape = {32, 32};
    t.dtype = DType::kF32;
    t.mesh = "N";
    t.spec = "S(0)";
    t.layout = OrDie(Layout::FromPlacements(OrDie(logic_.meshes().Get("N"), "mesh").mesh, t.shape,
                                            Parse("S(0)")),
                     "layout");
    t.version = logic_.tensors().NewVersion();
    OrDie(logic_.tensors().Reserve(t, "create"), "reserve");
    LayoutChecksums sums;
    absl::flat_hash_map<int64_t, int64_t> incarnations;
    for (const RankChunks& rc : t.layout.ranks()) {
      sums.emplace_back(rc.chunks.size(), 0);
      incarnations[rc.rank] = OrDie(logic_.workers().GetByRank(rc.rank), "worker").incarnation;
    }
    OrDie(logic_.tensors().FinishCreate(name, "create", sums, incarnations), "finish create");
  }

  static Spec Target(const std::string& placements) {
    Spec s;
    s.placements = Parse(placements);
    return s;
  }

  // Plays every worker: each fragment sent since the last call gets its correct report.
  void ReportAll(bool group) {
    for (const v1::PlanFragment& f : client_.Take()) {
      const WorkerRecord w = OrDie(logic_.workers().GetByRank(f.rank()), "worker");
      WorkerReport r = group ? FakeFusedFinalReport(f, w.spec.name, w.incarnation)
                             : FakeFinalReport(f, w.spec.name, w.incarnation);
      OrDie(logic_.plans().Report(r), "report");
    }
  }

  PlanManager& plans() { return logic_.plans(); }

 private:
  static std::vector<Placement> Parse(const std::string& text) {
    return OrDie(ParsePlacements(text), "placements");
  }
  static void OrDie(const absl::Status& s, const std::string& what) {
    if (!s.ok()) bench::Die(absl::StrCat(what, ": ", s.ToString()));
  }
  template <typename T>
  static T OrDie(absl::StatusOr<T> v, const std::string& what) {
    return bench::OrDie(std::move(v), what);
  }

  QueueingWorkerClient client_;
  bench::CoordinatorLogic logic_{&client_, /*store=*/nullptr, absl::Minutes(1)};
};

int Main() {
  const int n = std::max(1, absl::GetFlag(FLAGS_tensors));
  const int reps = std::max(1, absl::GetFlag(FLAGS_reps));
  Harness h;
  std::vector<std::string> names;
  for (int i = 0; i < n; ++i) {
    names.push_back(absl::StrCat("small/", i));
    h.Create(names.back());
  }
  bench::Stats group, single;
  int flip = 0;  // Each move goes S(0) -> S(1) or back, as model_bench's.
  for (int rep = 0; rep <= reps; ++rep) {
    const Spec target = Harness::Target(flip++ % 2 == 0 ? "S(1)" : "S(0)");
    std::vector<RedistributeMember> members;
    for (const std::string& name : names) members.push_back(RedistributeMember{name, target});
    bool committed = false;
    const double start = bench::ThreadCpuSeconds();
    bench::OrDie(
        h.plans().RedistributeGroup(
            members, [&](const absl::Status& s, const GroupProgress&) { committed = s.ok(); }),
        "group");
    h.ReportAll(/*group=*/true);
    const double seconds = bench::ThreadCpuSeconds() - start;
    if (!committed) bench::Die("a group did not commit");
    if (rep > 0) group.seconds.push_back(seconds);
  }
  for (int rep = 0; rep <= reps && absl::GetFlag(FLAGS_per_tensor); ++rep) {
    const Spec target = Harness::Target(flip++ % 2 == 0 ? "S(1)" : "S(0)");
    int commits = 0;
    const double start = bench::ThreadCpuSeconds();
    for (const std::string& name : names) {
      bench::OrDie(
          h.plans().Redistribute(
              name, target, [&](const absl::Status& s, const PlanProgress&) { commits += s.ok(); }),
          "redistribute");
      h.ReportAll(/*group=*/false);
    }
    const double seconds = bench::ThreadCpuSeconds() - start;
    if (commits != n) bench::Die("a single plan did not commit");
    if (rep > 0) single.seconds.push_back(seconds);
  }
  if (single.seconds.empty()) single.seconds.push_back(0);
  const double per_member_us = group.Best() / n * 1e6, per_plan_us = single.Best() / n * 1e6;
  if (absl::GetFlag(FLAGS_json)) {
    std::printf(
        "{\"tensors\": %d, \"reps\": %d, \"group_cpu_best_s\": %.6f, \"group_cpu_median_s\": "
        "%.6f, \"per_tensor_cpu_best_s\": %.6f, \"per_tensor_cpu_median_s\": %.6f, "
        "\"group_us_per_member\": %.2f, \"single_us_per_plan\": %.2f, "
        "\"per_tensor_over_group\": %.3f}\n",
        n, reps, group.Best(), group.Median(), single.Best(), single.Median(), per_member_us,
        per_plan_us, single.Best() / group.Best());
    return 0;
  }
  std::printf("coordinator plan logic, one thread's CPU, %d tensors of 4 KiB, 4 fake workers:\n",
              n);
  std::printf("  %-34s best %8.2f ms  median %8.2f ms  (%.1f us per tensor)\n",
              "one RedistributeGroup of all", group.Best() * 1e3, group.Median() * 1e3,
              per_member_us);
  std::printf("  %-34s best %8.2f ms  median %8.2f ms  (%.1f us per tensor)\n",
              "the same, one Redistribute each", single.Best() * 1e3, single.Median() * 1e3,
              per_plan_us);
  std::printf("  per_tensor / group                 %.2f\n", single.Best() / group.Best());
  return 0;
}

}  // namespace
}  // namespace shardcoord

int main(int argc, char** argv) {
  return shardcoord::bench::Main(argc, argv, "group_cpu_bench", shardcoord::Main,
                                 /*as_coordinator=*/true);
}
