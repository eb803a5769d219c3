// What a memory budget costs a group: the same RedistributeGroup with room to spare and with
// only --headroom_mib left on every worker after its new buffers, in one run on one cluster,
// and the most each worker held (its own accounting) against its budget.
//
//   bazel run -c opt //bench:budget_bench -- [--json] [--reps 5] [--tensors 16]
//       [--tensor_mib 16] [--budget_mib 1024] [--headroom_mib 64]
//
// Four CPU (Gloo) workers with --memory-budget=budget_mib, a 1-d mesh of the four, --tensors
// f32 tensors of --tensor_mib MiB each with S(0). Each repetition times, at the client:
// - `free`: RedistributeGroup of every tensor to S(1) (wait=true), nothing else on the
//   workers; moved back to S(0) untimed;
// - `budget`: the same, after a ballast tensor has filled every worker so that only
//   --headroom_mib remain once the group's new buffers are allocated: admission lowers the
//   buckets until the staging fits that; moved back and the ballast deleted, untimed.
// The two alternate, so both see the same machine load. Peaks are the plan traces' per-rank
// memory_peak_bytes (the worker's accounting while its fragment ran); values are checked
// once at the end.

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "bench/bench_common.h"
#include "client/coordinator_client.h"
#include "common/json_writer.h"
#include "tests/cluster.h"
#include "tests/tensor_check.h"

ABSL_FLAG(bool, json, false, "Print one JSON object with every number instead of text.");
ABSL_FLAG(int, reps, 5, "Timed repetitions of each configuration.");
ABSL_FLAG(int, tensors, 16, "Tensors in the group.");
ABSL_FLAG(int64_t, tensor_mib, 16, "Size of each tensor in MiB (f32, [mib * 256, 1024]).");
ABSL_FLAG(int64_t, budget_mib, 1024, "Every worker's --memory-budget in MiB.");
ABSL_FLAG(int64_t, headroom_mib, 64,
          "What the budget run leaves free on each worker after the group's new buffers.");
ABSL_FLAG(std::string, log_dir, "", "Keep the daemons' logs here (default: not kept).");
ABSL_FLAG(std::string, bucket_bytes, "",
          "The workers' --bucket-bytes (default: theirs, 64 MiB): small values show what small "
          "buckets cost with room to spare.");

namespace shardcoord {
namespace {

constexpr int kWorkers = 4;
constexpr int64_t kMiB = int64_t{1} << 20;

using bench::Die;
using bench::OrDie;

struct Series : bench::Stats {
  int64_t bucket_bytes = 0;  // Of the last run.
  int64_t peak_bytes = 0;    // The most any worker held while a member ran.
};

std::string Name(int i) { return absl::StrCat("t", i); }

// Every tensor to `spec` as one group; returns the seconds at the client and records the
// group's bucket size and its members' peaks.
double MoveGroup(CoordinatorClient& client, int tensors, const std::string& spec, Series* series) {
  v1::RedistributeGroupRequest request;
  for (int i = 0; i < tensors; ++i) {
    v1::RedistributeItem* item = request.add_redistributes();
    item->set_tensor(Name(i));
    *item->mutable_target() = SpecFromText("", spec);
  }
  request.set_wait(true);
  const absl::Time start = absl::Now();
  v1::RedistributeGroupResponse r = OrDie(client.RedistributeGroup(request), "group " + spec);
  const double seconds = absl::ToDoubleSeconds(absl::Now() - start);
  if (r.state() != v1::COMMITTED) Die(absl::StrCat("group ", r.group_id(), " did not commit"));
  if (series != nullptr) {
    for (const v1::RedistributeGroupMember& m : r.members()) {
      series->bucket_bytes = m.progress().bucket_bytes();
      v1::PlanTrace trace = OrDie(client.GetPlanTrace(m.progress().plan_id()), "trace");
      for (const v1::RankTrace& rank : trace.ranks()) {
        series->peak_bytes = std::max(series->peak_bytes, rank.memory_peak_bytes());
      }
    }
  }
  return seconds;
}

// Polls until every worker reports holding at most `bytes` (deletes reach them in the
// background).
void AwaitHolding(CoordinatorClient& client, int64_t bytes) {
  const absl::Time deadline = absl::Now() + absl::Minutes(2);
  while (true) {
    bool done = true;
    for (const v1::WorkerInfo& w : OrDie(client.ListWorkers(), "workers")) {
      done &= w.memory_used_bytes() <= bytes;
    }
    if (done) return;
    if (absl::Now() > deadline) Die("workers did not free the ballast");
    absl::SleepFor(absl::Milliseconds(50));
  }
}

int Main() {
  const int reps = absl::GetFlag(FLAGS_reps), tensors = absl::GetFlag(FLAGS_tensors);
  const int64_t tensor_mib = absl::GetFlag(FLAGS_tensor_mib);
  const int64_t budget = absl::GetFlag(FLAGS_budget_mib) * kMiB;
  const int64_t headroom = absl::GetFlag(FLAGS_headroom_mib) * kMiB;
  const int64_t per_worker = tensors * tensor_mib * kMiB / kWorkers;  // Committed, and new.
  const int64_t ballast = budget - 2 * per_worker - headroom;         // Per worker.
  if (ballast <= 0) Die("--budget_mib leaves no room for ballast: raise it");
  const Shape shape = {tensor_mib * 256, 1024};

  ClusterOptions options;
  options.worker_flags = {absl::StrCat("--memory-budget=", budget)};
  if (!absl::GetFlag(FLAGS_bucket_bytes).empty()) {
    options.worker_flags.push_back(
        absl::StrCat("--bucket-bytes=", absl::GetFlag(FLAGS_bucket_bytes)));
  }
  options.coordinator_flags = {"--admission-timeout=600s"};
  options.echo_stdout = false;
  options.log_dir = absl::GetFlag(FLAGS_log_dir);
  std::unique_ptr<Cluster> cluster = OrDie(Cluster::Start(options), "cluster");
  CoordinatorClient& client = cluster->client();
  OrDie(MakeMesh(client, "line", {kWorkers}, cluster->WorkerNames()).status(), "mesh");
  for (int i = 0; i < tensors; ++i) {
    OrDie(CreateFilled(client, Name(i), shape, DType::kF32, "line", "S(0)").status(), Name(i));
  }
  // Rows divisible by the workers, so S(0) gives each exactly its share.
  const Shape ballast_shape = {ballast * kWorkers / (1024 * 4) / kWorkers * kWorkers, 1024};
  Series free, limited;
  for (int rep = 0; rep < reps; ++rep) {
    free.seconds.push_back(MoveGroup(client, tensors, "S(1)", &free));
    MoveGroup(client, tensors, "S(0)", nullptr);
    OrDie(CreateFilled(client, "ballast", ballast_shape, DType::kF32, "line", "S(0)", false,
                       v1::ZEROS)
              .status(),
          "ballast");
    limited.seconds.push_back(MoveGroup(client, tensors, "S(1)", &limited));
    MoveGroup(client, tensors, "S(0)", nullptr);
    OrDie(client.DeleteTensor("ballast"), "delete ballast");
    AwaitHolding(client, per_worker);
  }
  for (int i = 0; i < tensors; i += std::max(1, tensors / 4)) {
    OrDie(DownloadAndCheck(client, Name(i), DType::kF32, shape, FillKind::kArange), Name(i));
  }
  const int64_t moved = tensors * tensor_mib * kMiB * (kWorkers - 1) / kWorkers;
  const bool within = free.peak_bytes <= budget && limited.peak_bytes <= budget;
  if (absl::GetFlag(FLAGS_json)) {
    JsonWriter w;
    w.BeginObject();
    w.Key("optimized").Bool(bench::kOptimizedBuild);
    w.Key("workers")
        .Int(kWorkers)
        .Key("tensors")
        .Int(tensors)
        .Key("tensor_bytes")
        .Int(tensor_mib * kMiB);
    w.Key("budget_bytes").Int(budget).Key("headroom_bytes").Int(headroom);
    w.Key("bytes_moved").Int(moved);
    for (const auto& [name, s] :
         {std::make_pair("free", &free), std::make_pair("budget", &limited)}) {
      w.Key(name).BeginObject();
      w.Key("best_seconds").Double(s->Best()).Key("median_seconds").Double(s->Median());
      w.Key("seconds").BeginArray();
      for (double v : s->seconds) w.Double(v);
      w.EndArray();
      w.Key("bucket_bytes").Int(s->bucket_bytes).Key("peak_bytes").Int(s->peak_bytes);
      w.EndObject();
    }
    w.Key("budget_vs_free_best").Double(free.Best() / limited.Best());
    w.Key("peaks_within_budget").Bool(within);
    w.EndObject();
    std::printf("%s\n", w.str().c_str());
  } else {
    std::printf(
        "group of %d x %lld MiB f32 S(0) -> S(1) on %d Gloo workers, budget %lld MiB each\n",
        tensors, static_cast<long long>(tensor_mib), kWorkers,
        static_cast<long long>(budget / kMiB));
    for (const auto& [name, s] :
         {std::make_pair("free", &free), std::make_pair("budget", &limited)}) {
      std::printf("%-7s best %.3f s  median %.3f s  %.2f GB/s  buckets %lld KiB  peak %lld MiB\n",
                  name, s->Best(), s->Median(), moved / s->Best() / 1e9,
                  static_cast<long long>(s->bucket_bytes >> 10),
                  static_cast<long long>(s->peak_bytes / kMiB));
    }
    std::printf("budget run (%lld MiB headroom) vs free, best vs best: %.2fx; peaks %s budget\n",
                static_cast<long long>(headroom / kMiB), free.Best() / limited.Best(),
                within ? "within" : "OVER");
  }
  return within ? 0 : 1;
}

}  // namespace
}  // namespace shardcoord

int main(int argc, char** argv) {
  return shardcoord::bench::Main(argc, argv, "budget_bench", shardcoord::Main);
}
