// Executor overhead on one machine: N ranks as threads of this process, each with its own
// Gloo TCP device. Moves an R x C f32 tensor S(0) -> S(1) through ExecuteFragment, and the
// same bytes through a raw GlooCommunicator::AllToAllV on pre-packed buffers, and prints
// both throughputs and their ratio.
//
//   bazel run -c opt //worker/plans:executor_bench -- --rows 4096 --cols 16384 --ranks 4

#include <CLI/CLI.hpp>
#include <cstdio>
#include <cstring>
#include <map>
#include <memory>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "proto/convert.h"
#include "sharding/layout.h"
#include "sharding/mesh.h"
#include "sharding/placement.h"
#include "sharding/plan_fragment.h"
#include "sharding/planner.h"
#include "worker/buffers/buffer_store.h"
#include "worker/comm/gloo/gloo_communicator.h"
#include "worker/control/kv_client.h"
#include "worker/plans/executor.h"
#include "worker/plans/fragment.h"

namespace shardcoord {
namespace {

// Rank `r`'s spec of the communicator of ranks 0..ranks-1 (incarnation 1) under `prefix`.
CommunicatorSpec AllRanksSpec(int ranks, int r, const std::string& prefix) {
  CommunicatorSpec spec;
  for (int i = 0; i < ranks; ++i) {
    spec.ranks.push_back(i);
    spec.incarnations.push_back(1);
  }
  spec.my_rank = r;
  spec.key_prefix = prefix;
  return spec;
}

int Main(int argc, char** argv) {
  int64_t rows = 4096, cols = 16384;
  int ranks = 4, iterations = 3;
  bool p2p = false;
  std::string from = "S(0)", to = "S(1)";
  CLI::App app{"executor vs raw Gloo alltoallv"};
  app.add_option("--rows", rows);
  app.add_option("--cols", cols);
  app.add_option("--ranks", ranks);
  app.add_option("--iterations", iterations);
  app.add_flag("--p2p", p2p, "Run every step as grouped send/recv");
  app.add_option("--from", from, "Source placements on a 1-d mesh");
  app.add_option("--to", to, "Target placements on a 1-d mesh");
  CLI11_PARSE(app, argc, argv);

  DeviceMesh mesh = *DeviceMesh::Create({ranks});
  Layout a = *Layout::FromPlacements(mesh, {rows, cols}, *ParsePlacements(from));
  Layout b = *Layout::FromPlacements(mesh, {rows, cols}, *ParsePlacements(to));
  Plan plan = *Redistribute(a, b, DType::kF32);

  InMemoryKvClient kv;
  std::vector<std::unique_ptr<CommunicatorCache>> caches;
  for (int r = 0; r < ranks; ++r) {
    caches.push_back(
        std::make_unique<CommunicatorCache>(*GlooCommunicatorFactory::Create(&kv, GlooOptions{})));
  }
  std::vector<std::shared_ptr<HostBuffer>> sources(ranks);
  for (int r = 0; r < ranks; ++r) {
    sources[r] = *HostBuffer::Create(DType::kF32, *a.Find(r));
    std::memset(sources[r]->data(), r + 1, sources[r]->bytes());
  }
  const int64_t moved = plan.bytes_moved;

  auto run_all = [&](const std::function<void(int)>& fn) {
    std::vector<std::thread> threads;
    for (int r = 0; r < ranks; ++r) threads.emplace_back(fn, r);
    for (auto& t : threads) t.join();
  };

  double best_exec = 1e30, best_raw = 1e30;
  for (int it = 0; it < iterations; ++it) {
    // Executor.
    FragmentOptions fo;
    fo.plan_id = absl::StrCat("bench", it);
    for (int r = 0; r < ranks; ++r) fo.incarnations[r] = 1;
    fo.communicator_prefix = absl::StrCat("bench/", it, "/");
    FragmentMemberOptions member;
    member.tensor = "T";
    member.source_version = 1;
    member.target_version = 2;
    const Plan* plans[] = {&plan};
    std::map<int64_t, Fragment> made = MakeFragments(plans, {member}, fo);
    std::vector<Fragment> fragments;
    std::vector<std::shared_ptr<HostBuffer>> targets;
    for (int r = 0; r < ranks; ++r) {
      fragments.push_back(*ParseFragment(FragmentToProto(made.at(r))));
      targets.push_back(*HostBuffer::Create(DType::kF32, fragments.back().shapes[0].target));
    }
    // Build the communicators first so both timings exclude the rendezvous.
    run_all([&](int r) {
      caches[r]->Get(AllRanksSpec(ranks, r, fo.communicator_prefix)).IgnoreError();
    });
    absl::Time t0 = absl::Now();
    run_all([&](int r) {
      ExecuteInput in;
      in.fragment = &fragments[r];
      in.source = sources[r].get();
      in.target = targets[r].get();
      in.communicators = caches[r].get();
      in.options.force_point_to_point = p2p;
      absl::StatusOr<ExecuteResult> res = ExecuteFragment(in);
      if (!res.ok()) std::fprintf(stderr, "rank %d: %s\n", r, res.status().ToString().c_str());
    });
    best_exec = std::min(best_exec, absl::ToDoubleSeconds(absl::Now() - t0));

    // Raw alltoallv of the same bytes, buffers already packed and allocated.
    std::vector<std::vector<char>> send(ranks), recv(ranks);
    const int64_t per_rank = moved / ranks * ranks / (ranks - 1);
    for (int r = 0; r < ranks; ++r) {
      send[r].assign(per_rank, 1);
      recv[r].assign(per_rank, 0);
    }
    std::vector<std::shared_ptr<Communicator>> comms(ranks);
    run_all([&](int r) {
      comms[r] = *caches[r]->Get(AllRanksSpec(ranks, r, absl::StrCat("raw/", it, "/")));
    });
    t0 = absl::Now();
    run_all([&](int r) {
      std::vector<int64_t> counts(ranks, per_rank / ranks);
      absl::Status s =
          comms[r]->AllToAllV(send[r].data(), counts, recv[r].data(), counts, CommOptions{77});
      if (!s.ok()) std::fprintf(stderr, "raw rank %d: %s\n", r, s.ToString().c_str());
    });
    best_raw = std::min(best_raw, absl::ToDoubleSeconds(absl::Now() - t0));
  }
  // The raw exchange also moves each rank's self piece locally; count only remote bytes.
  std::printf(
      "bytes moved %lld\nexecutor  %.3f s  %.3f GB/s\nraw a2av  %.3f s  %.3f GB/s\n"
      "ratio %.2f\n",
      static_cast<long long>(moved), best_exec, moved / best_exec / 1e9, best_raw,
      moved / best_raw / 1e9, best_raw / best_exec);
  return 0;
}

}  // namespace
}  // namespace shardcoord

int main(int argc, char** argv) { return shardcoord::Main(argc, argv); }
