// End-to-end benchmark: shardcoord's redistribute against the same bytes moved by a raw Gloo
// all-to-all(v) and by torch.distributed (Gloo) all_to_all_single, in one run on this
// machine, plus the latency of a tiny redistribute through the coordinator.
//
//   bazel run -c opt //bench:e2e_bench -- [--json] [--mib 256] [--reps 5]
//
// 1. Starts a coordinator and four CPU (Gloo) workers on loopback, creates a f32 tensor of
//    --mib MiB with S(0) on a 1-d mesh of the four, and times Redistribute(S(0) -> S(1),
//    wait=true) at the client, --reps times (moving it back to S(0), untimed, in between).
//    Values are checked once at the end, so the numbers are for work that was really done.
// 2. Right after each of those repetitions, four gloo_alltoall processes send each other
//    exactly the bytes the plan moved between each pair of ranks (its transfers), one warm-up
//    and one timed alltoallv. Interleaving pairs every sample with one taken under the same
//    machine load (on a shared 2-core machine, load from other work swamps the difference).
// 3. Runs bench/torch_alltoall.py with /usr/bin/python3 on the same byte matrix, when that
//    Python has torch (skipped with a message otherwise), after the cluster is stopped.
// 4. Times --latency_runs redistributes of a 4 KiB tensor (32x32 f32, S(0) <-> S(1)) and as
//    many bare unary RPCs to the coordinator (GetMesh), in blocks that take turns: the
//    baseline of issue 10's "a 4 KiB redistribute costs at most 5x a bare round trip".
// GB/s is bytes moved between ranks / seconds (1 GB = 1e9 bytes), from the best run.

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "bench/bench_common.h"
#include "client/coordinator_client.h"
#include "common/json_writer.h"
#include "tests/cluster.h"
#include "tests/process.h"
#include "tests/tensor_check.h"

ABSL_FLAG(int64_t, relay_max_bytes, 64 << 10,
          "The coordinator's --relay-max-bytes (its default: small plans are relayed by the "
          "coordinator); 0 runs every plan on the workers.");
ABSL_FLAG(bool, json, false, "Print one JSON object with every number instead of text.");
ABSL_FLAG(int64_t, mib, 256, "Size of the big tensor in MiB (f32, square-ish 2-d).");
ABSL_FLAG(int, reps, 5, "Timed repetitions of each throughput measurement.");
ABSL_FLAG(int, latency_runs, 200, "Redistributes of the 4 KiB tensor.");
ABSL_FLAG(bool, torch, true, "Also run the torch.distributed peer when available.");
ABSL_FLAG(std::string, python, "/usr/bin/python3", "Python with torch for the torch peer.");
ABSL_FLAG(bool, tcp, true,
          "Also time shardcoord with --same-host-copy=false (every byte over Gloo's TCP "
          "transport), on a second cluster, in the same repetitions.");
ABSL_FLAG(bool, check_values, true, "Download the big tensor at the end and check it.");
ABSL_FLAG(std::string, log_dir, "",
          "Keep the daemons' logs (stderr) here; default: a temporary directory, removed.");

namespace shardcoord {
namespace {

constexpr int kWorkers = 4;
constexpr absl::Duration kPeerTimeout = absl::Minutes(5);

using bench::Die;
using bench::GBps;
using bench::OrDie;
using bench::PeerResult;
using bench::Stats;

PeerResult RunGloo(const std::vector<int64_t>& matrix, int iters, const std::string& tmp) {
  return bench::RunGlooAlltoall(matrix, kWorkers, iters, tmp);
}

PeerResult RunTorch(const std::vector<int64_t>& matrix, int reps) {
  const std::string python = absl::GetFlag(FLAGS_python);
  return bench::RunPythonPeer(
      python, OrDie(RunfilePath("bench/torch_alltoall.py"), "torch script"),
      {absl::StrCat("--size=", kWorkers), absl::StrCat("--matrix=", absl::StrJoin(matrix, ",")),
       absl::StrCat("--iters=", reps), "--warmup=1"},
      absl::StrCat(python, " has no torch (or no Gloo in torch.distributed)"), kPeerTimeout);
}

// bytes[i * n + j]: what mesh position i sends to position j in `plan`.
std::vector<int64_t> TrafficMatrix(const v1::Plan& plan, const v1::MeshInfo& mesh) {
  const std::vector<int64_t> ranks(mesh.ranks().begin(), mesh.ranks().end());
  std::vector<int64_t> matrix(ranks.size() * ranks.size(), 0);
  if (absl::Status s = bench::AddPlanTraffic(plan, ranks, &matrix); !s.ok()) Die(s.ToString());
  return matrix;
}

int Run() {
  const int64_t mib = absl::GetFlag(FLAGS_mib);
  const int reps = std::max(1, absl::GetFlag(FLAGS_reps));
  const int latency_runs = std::max(1, absl::GetFlag(FLAGS_latency_runs));
  const bool json = absl::GetFlag(FLAGS_json);
  auto say = [&](const std::string& s) {
    if (!json) std::fprintf(stderr, "%s\n", s.c_str());
  };

  const std::string tmp = bench::ScratchDir("e2e_bench");
  const std::string log_dir = bench::LogDir(absl::GetFlag(FLAGS_log_dir), tmp);

  // A square-ish f32 tensor of `mib` MiB whose rows and columns split evenly over 4.
  const int64_t elements = mib * (1 << 20) / 4;
  int64_t rows = 4;
  while (rows * rows * 4 <= elements && elements % (rows * 2) == 0) rows *= 2;
  const Shape shape = {rows, elements / rows};

  ClusterOptions options;
  options.num_workers = kWorkers;
  options.echo_stdout = false;
  options.log_dir = log_dir;
  options.relay_max_bytes = absl::GetFlag(FLAGS_relay_max_bytes);
  say(absl::StrCat("starting a coordinator and ", kWorkers, " workers (logs in ", log_dir, ")"));
  std::unique_ptr<Cluster> cluster = OrDie(Cluster::Start(options), "cluster");
  CoordinatorClient& client = cluster->client();
  const v1::MeshInfo mesh =
      OrDie(MakeMesh(client, "line", {kWorkers}, cluster->WorkerNames()), "mesh");
  // The same, with every byte over Gloo's TCP transport.
  const bool tcp = absl::GetFlag(FLAGS_tcp);
  std::unique_ptr<Cluster> tcp_cluster;
  if (tcp) {
    ClusterOptions tcp_options = options;
    tcp_options.worker_flags.push_back("--same-host-copy=false");
    tcp_options.log_dir = absl::StrCat(log_dir, "/tcp");
    std::filesystem::create_directories(tcp_options.log_dir);
    say("starting a second cluster with --same-host-copy=false");
    tcp_cluster = OrDie(Cluster::Start(tcp_options), "tcp cluster");
    OrDie(MakeMesh(tcp_cluster->client(), "line", {kWorkers}, tcp_cluster->WorkerNames()),
          "tcp mesh");
  }

  // ---- Throughput through shardcoord.
  say(absl::StrCat("creating a ", mib, " MiB f32 tensor ", ShapeToString(shape), " with S(0)"));
  OrDie(CreateFilled(client, "big", shape, DType::kF32, "line", "S(0)"), "create big");
  if (tcp) {
    OrDie(CreateFilled(tcp_cluster->client(), "big", shape, DType::kF32, "line", "S(0)"),
          "create big (tcp)");
  }
  auto redistribute_on = [&](CoordinatorClient& c, const std::string& spec) {
    const absl::Time start = absl::Now();
    v1::RedistributeResponse r =
        OrDie(c.Redistribute(RedistributeTo("big", "", spec)), "redistribute");
    const double seconds = absl::ToDoubleSeconds(absl::Now() - start);
    if (r.progress().state() != v1::COMMITTED) {
      Die(absl::StrCat("plan to ", spec, " ended ", v1::PlanState_Name(r.progress().state()), ": ",
                       r.progress().error()));
    }
    return std::make_pair(seconds, r);
  };
  auto redistribute = [&](const std::string& spec) { return redistribute_on(client, spec); };
  if (tcp) {  // Builds its communicators.
    redistribute_on(tcp_cluster->client(), "S(1)");
    redistribute_on(tcp_cluster->client(), "S(0)");
  }
  // The first move also builds the Gloo communicators: reported apart. Plans are
  // deterministic, so its transfers are every repetition's.
  auto [first_seconds, first] = redistribute("S(1)");
  redistribute("S(0)");
  const v1::Plan plan = first.plan();
  const int64_t moved = plan.bytes_moved();
  const std::vector<int64_t> matrix = TrafficMatrix(plan, mesh);
  int64_t matrix_total = 0;
  for (int i = 0; i < kWorkers; ++i) {
    for (int j = 0; j < kWorkers; ++j) {
      if (i != j) matrix_total += matrix[i * kWorkers + j];
    }
  }
  if (matrix_total != moved) {
    Die(absl::StrCat("plan transfers add up to ", matrix_total, " bytes, bytes_moved says ",
                     moved));
  }
  std::vector<std::string> ops;
  for (const v1::Step& s : plan.steps()) ops.push_back(v1::StepOp_Name(s.op()));

  Stats shard;
  Stats plan_seconds;  // The coordinator's own time for the plan.
  PeerResult gloo;
  gloo.ran = true;
  std::vector<double> paired_ratios;  // Per repetition: gloo seconds / shardcoord seconds.
  Stats shard_tcp;
  std::vector<double> paired_tcp;
  for (int i = 0; i < reps; ++i) {
    auto [seconds, r] = redistribute("S(1)");
    if (r.plan().bytes_moved() != moved) Die("a repetition moved a different byte count");
    shard.seconds.push_back(seconds);
    plan_seconds.seconds.push_back(r.progress().seconds());
    redistribute("S(0)");
    double tcp_seconds = 0;
    if (tcp) {
      auto [t, tr] = redistribute_on(tcp_cluster->client(), "S(1)");
      if (tr.plan().bytes_moved() != moved) Die("a tcp repetition moved a different byte count");
      tcp_seconds = t;
      shard_tcp.seconds.push_back(t);
      redistribute_on(tcp_cluster->client(), "S(0)");
    }
    PeerResult g = RunGloo(matrix, 1, tmp);
    if (g.bytes != moved) Die("gloo moved a different byte count");
    gloo.setup_seconds = std::max(gloo.setup_seconds, g.setup_seconds);
    gloo.bytes = g.bytes;
    gloo.stats.seconds.push_back(g.stats.seconds[0]);
    paired_ratios.push_back(g.stats.seconds[0] / seconds);
    if (tcp) paired_tcp.push_back(g.stats.seconds[0] / tcp_seconds);
    say(absl::StrCat("  rep ", i, ": shardcoord ", seconds, " s",
                     tcp ? absl::StrCat(" (over TCP ", tcp_seconds, " s)") : "", ", raw Gloo ",
                     g.stats.seconds[0], " s"));
  }
  Stats paired{paired_ratios};
  Stats paired_tcp_stats{paired_tcp};

  // ---- Latency of a 4 KiB redistribute.
  say(absl::StrCat("timing ", latency_runs, " redistributes of a 4 KiB tensor"));
  OrDie(CreateFilled(client, "small", {32, 32}, DType::kF32, "line", "S(0)"), "create small");
  Stats latency;
  Stats bare_rpc;
  bench::TimeSmallRedistributes(client, "small", "line", latency_runs, &latency, &bare_rpc);

  if (absl::GetFlag(FLAGS_check_values)) {
    say("checking every value of the big tensor");
    absl::Status values = DownloadAndCheck(client, "big", DType::kF32, shape, FillKind::kArange);
    if (!values.ok()) Die(values.ToString());
    if (tcp) {
      values =
          DownloadAndCheck(tcp_cluster->client(), "big", DType::kF32, shape, FillKind::kArange);
      if (!values.ok()) Die(absl::StrCat("tcp cluster: ", values.ToString()));
    }
  }
  cluster.reset();
  tcp_cluster.reset();  // The torch peer runs without the daemons around.

  // ---- Peers.
  PeerResult torch;
  if (absl::GetFlag(FLAGS_torch)) {
    say("torch.distributed (Gloo) all_to_all_single between 4 processes");
    torch = RunTorch(matrix, reps);
    if (!torch.ran) say(absl::StrCat("  torch skipped: ", torch.skipped));
  } else {
    torch.skipped = "--notorch";
  }
  std::filesystem::remove_all(tmp);

  const double shard_gbps = GBps(moved, shard.Best());
  const double gloo_gbps = GBps(moved, gloo.stats.Best());
  const double torch_gbps = torch.ran ? GBps(moved, torch.stats.Best()) : 0;
  const double ratio_gloo = gloo_gbps > 0 ? shard_gbps / gloo_gbps : 0;
  const double ratio_torch = torch_gbps > 0 ? shard_gbps / torch_gbps : 0;

  if (json) {
    JsonWriter w;
    w.BeginObject();
    w.Key("optimized").Bool(bench::kOptimizedBuild);
    w.Key("tensor_bytes").Int(elements * 4).Key("shape").IntArray(shape);
    w.Key("bytes_moved").Int(moved).Key("lower_bound_bytes").Int(plan.lower_bound_bytes());
    w.Key("plan_steps").BeginArray();
    for (const std::string& op : ops) w.String(op);
    w.EndArray();
    w.Key("reps").Int(reps);
    w.Key("shardcoord").BeginObject();
    w.Key("first_seconds").Double(first_seconds);
    w.Key("best_seconds").Double(shard.Best()).Key("median_seconds").Double(shard.Median());
    w.Key("plan_best_seconds").Double(plan_seconds.Best());
    w.Key("plan_median_seconds").Double(plan_seconds.Median());
    w.Key("gbps").Double(shard_gbps).Key("median_gbps").Double(GBps(moved, shard.Median()));
    w.EndObject();
    if (tcp) {
      w.Key("shardcoord_tcp").BeginObject();
      w.Key("best_seconds").Double(shard_tcp.Best());
      w.Key("median_seconds").Double(shard_tcp.Median());
      w.Key("gbps").Double(GBps(moved, shard_tcp.Best()));
      w.EndObject();
    }
    w.Key("gloo").BeginObject();
    w.Key("setup_seconds").Double(gloo.setup_seconds);
    w.Key("best_seconds")
        .Double(gloo.stats.Best())
        .Key("median_seconds")
        .Double(gloo.stats.Median());
    w.Key("gbps").Double(gloo_gbps);
    w.EndObject();
    w.Key("torch").BeginObject();
    if (torch.ran) {
      w.Key("setup_seconds").Double(torch.setup_seconds);
      w.Key("best_seconds").Double(torch.stats.Best());
      w.Key("median_seconds").Double(torch.stats.Median());
      w.Key("gbps").Double(torch_gbps);
    } else {
      w.Key("skipped").String(torch.skipped);
    }
    w.EndObject();
    w.Key("ratio_vs_gloo").Double(ratio_gloo);
    w.Key("ratio_vs_gloo_paired_median").Double(paired.Median());
    if (tcp) {
      w.Key("ratio_tcp_vs_gloo").Double(GBps(moved, shard_tcp.Best()) / gloo_gbps);
      w.Key("ratio_tcp_vs_gloo_paired_median").Double(paired_tcp_stats.Median());
    }
    if (torch.ran) w.Key("ratio_vs_torch").Double(ratio_torch);
    w.Key("latency_4k").BeginObject();
    w.Key("runs").Int(latency_runs);
    w.Key("p50_ms").Double(latency.Percentile(50) * 1e3);
    w.Key("p99_ms").Double(latency.Percentile(99) * 1e3);
    w.Key("best_ms").Double(latency.Best() * 1e3);
    w.Key("bare_rpc_p50_ms").Double(bare_rpc.Percentile(50) * 1e3);
    w.Key("ratio_vs_bare_rpc_p50").Double(latency.Percentile(50) / bare_rpc.Percentile(50));
    w.EndObject();
    w.EndObject();
    std::printf("%s\n", w.str().c_str());
    return 0;
  }
  std::printf(
      "tensor %s f32 (%lld MiB), S(0) -> S(1) on 4 CPU workers: %s moved "
      "(lower bound %s), steps: %s\n",
      ShapeToString(shape).c_str(), static_cast<long long>(mib), absl::StrCat(moved).c_str(),
      absl::StrCat(plan.lower_bound_bytes()).c_str(), absl::StrJoin(ops, ", ").c_str());
  std::printf("%-34s %10s %10s %10s\n", "", "best s", "median s", "GB/s");
  std::printf("%-34s %10.4f %10.4f %10.3f   (first run %.4f s; plan time %.4f s)\n",
              "shardcoord Redistribute", shard.Best(), shard.Median(), shard_gbps, first_seconds,
              plan_seconds.Best());
  if (tcp) {
    std::printf("%-34s %10.4f %10.4f %10.3f\n", "  same, --same-host-copy=false", shard_tcp.Best(),
                shard_tcp.Median(), GBps(moved, shard_tcp.Best()));
  }
  std::printf("%-34s %10.4f %10.4f %10.3f   (setup %.4f s)\n", "raw Gloo alltoallv",
              gloo.stats.Best(), gloo.stats.Median(), gloo_gbps, gloo.setup_seconds);
  if (torch.ran) {
    std::printf("%-34s %10.4f %10.4f %10.3f   (setup %.4f s)\n",
                "torch.distributed all_to_all_single", torch.stats.Best(), torch.stats.Median(),
                torch_gbps, torch.setup_seconds);
  } else {
    std::printf("torch.distributed: skipped (%s)\n", torch.skipped.c_str());
  }
  std::printf(
      "shardcoord / raw Gloo = %.3f best vs best, %.3f median of paired runs "
      "(target >= 0.8)",
      ratio_gloo, paired.Median());
  if (torch.ran) std::printf("; shardcoord / torch = %.3f", ratio_torch);
  if (tcp) {
    std::printf("\nover TCP only: shardcoord / raw Gloo = %.3f best vs best, %.3f paired median",
                GBps(moved, shard_tcp.Best()) / gloo_gbps, paired_tcp_stats.Median());
  }
  std::printf("\n4 KiB redistribute through the coordinator, %d runs: p50 %.3f ms, p99 %.3f ms\n",
              latency_runs, latency.Percentile(50) * 1e3, latency.Percentile(99) * 1e3);
  std::printf("bare unary RPC (GetMesh) p50 %.3f ms: the redistribute costs %.1fx (goal <= 5x)\n",
              bare_rpc.Percentile(50) * 1e3, latency.Percentile(50) / bare_rpc.Percentile(50));
  return 0;
}

}  // namespace
}  // namespace shardcoord

int main(int argc, char** argv) {
  return shardcoord::bench::Main(argc, argv, "e2e_bench", shardcoord::Run);
}
