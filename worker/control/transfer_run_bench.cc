// What a prepared transfer's warm run costs on the workers, per member: N ranks as workers of
// this process (each a WorkerCore with its own Gloo TCP device on loopback), a table of M small
// tensors FSDP-flat on a 1-d mesh to TP on a (2, N/2) mesh, run R times (TransferRunner::Run,
// then FinishPlan commit on every rank), beside a one-tensor transfer of the same total bytes
// measured in the same process. Prints wall seconds and process CPU seconds per run (best and
// median) and the ratio many/one: what tensor count costs, not what bytes cost.
//
//   bazel run -c opt //worker/control:transfer_run_bench -- --members 20000 --ranks 8 --json

#include <time.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cstdio>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "proto/convert.h"
#include "sharding/layout.h"
#include "sharding/mesh.h"
#include "sharding/placement.h"
#include "sharding/transfer_table.h"
#include "worker/buffers/buffer_store.h"
#include "worker/comm/gloo/gloo_communicator.h"
#include "worker/control/kv_client.h"
#include "worker/control/transfer_runner.h"
#include "worker/control/worker_core.h"
#include "worker/testing/gloo_test_worker.h"

namespace shardcoord {
namespace {

constexpr int64_t kSrcVersion = 1;
constexpr int64_t kDstVersion = 2;

class NoReports : public ChunkReporter {
 public:
  absl::Status ReportChunks(const v1::ReportChunksRequest&) override {
    return absl::InternalError("a transfer's run reported chunks");
  }
};

struct BenchWorker : worker_testing::GlooTestWorker {
  BenchWorker(KvClient* kv, ChunkReporter* reporter, int rank)
      : GlooTestWorker(kv, reporter, rank, /*incarnation=*/1) {}
};

double ProcessCpuSeconds() {
  timespec ts;
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + ts.tv_nsec * 1e-9;
}

Layout Placed(const DeviceMesh& mesh, const Shape& shape, const std::string& text) {
  return *Layout::FromPlacements(mesh, shape, *ParsePlacements(text));
}

// torch.chunk-style contiguous ranges of the flattened tensor, one per rank.
Layout Flat(const DeviceMesh& mesh, const Shape& shape, int ranks) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  const int64_t per = (n + ranks - 1) / ranks;
  std::vector<std::string> parts;
  for (int r = 0; r < ranks; ++r) {
    const int64_t lo = std::min(n, r * per), hi = std::min(n, (r + 1) * per);
    parts.push_back(hi > lo ? absl::StrCat(lo, ":", hi) : "");
  }
  return *Layout::FromFlat(mesh, shape, *ParseFlatSpec(absl::StrJoin(parts, ";")));
}

struct Kind {
  Shape shape;
  DType dtype;
  std::string tp;
};

// The tensor kinds of tests/transfer_test: column- and row-parallel matrices, replicated
// norms, vocab rows.
const std::vector<Kind>& Kinds() {
  static const std::vector<Kind>* kinds = new std::vector<Kind>{
      {{16, 8}, DType::kBF16, "R,S(0)"},
      {{8, 12}, DType::kBF16, "R,S(1)"},
      {{6}, DType::kF32, "R,R"},
      {{40, 4}, DType::kF32, "S(0),S(0)"},
  };
  return *kinds;
}

class Bench {
 public:
  explicit Bench(int ranks) : ranks_(ranks) {
    for (int r = 0; r < ranks; ++r) {
      workers_.push_back(std::make_unique<BenchWorker>(&kv_, &reporter_, r));
    }
  }

  // Adds the transfer `id` of `table`: fills every src and dst on every rank, prepares.
  absl::Status Prepare(const std::string& id, const TransferTable& table) {
    for (int r = 0; r < ranks_; ++r) {
      for (const TransferMemberSpec& m : table.members) {
        for (auto [name, version, layout] : {std::make_tuple(m.src, m.src_version, m.src_layout),
                                             std::make_tuple(m.dst, m.dst_version, m.dst_layout)}) {
          const RankChunks* rc = table.layouts[layout].Find(r);
          if (rc == nullptr) continue;
          v1::FillRequest fill;
          fill.set_tensor(name);
          fill.set_version(version);
          fill.set_dtype(DTypeToProto(m.dtype));
          *fill.mutable_chunks() = RankChunksToProto(*rc);
          for (int64_t d : table.layouts[layout].global_shape()) fill.add_global_shape(d);
          fill.set_init(v1::RANDOM);
          fill.set_seed(7);
          if (auto filled = workers_[r]->core.Fill(fill); !filled.ok()) return filled.status();
        }
      }
    }
    v1::PrepareTransferRequest page;
    page.set_transfer_id(id);
    page.set_page(0);
    page.set_last(true);
    for (const std::string& h : table.hosts_by_rank) page.add_hosts_by_rank(h);
    for (int r = 0; r < ranks_; ++r) {
      page.add_ranks(r);
      page.add_incarnations(1);
    }
    page.set_step_timeout_ms(120000);
    for (const Layout& l : table.layouts) *page.add_layouts() = TransferLayoutToProto(l, false);
    for (const TransferMemberSpec& m : table.members) {
      *page.add_members() = TransferMemberToProto(m);
    }
    for (int r = 0; r < ranks_; ++r) {
      absl::StatusOr<v1::PrepareTransferResponse> p = workers_[r]->core.transfers()->Prepare(page);
      if (!p.ok()) return p.status();
    }
    versions_[id] = kDstVersion;
    return absl::OkStatus();
  }

  struct Sample {
    double wall = 0, cpu = 0;
  };

  // One warm run of `id` on every rank, committed.
  absl::StatusOr<Sample> Run(const std::string& id) {
    const int64_t version = ++versions_[id] + 1000;
    const std::string run_id = absl::StrCat(id, "-run-", ++runs_);
    absl::Mutex mu;
    int answered = 0;
    absl::Status failed;
    const double cpu0 = ProcessCpuSeconds();
    const absl::Time t0 = absl::Now();
    for (int r = 0; r < ranks_; ++r) {
      v1::RunTransferWorkerRequest req;
      req.set_transfer_id(id);
      req.set_run_id(run_id);
      req.set_rank(r);
      req.set_version(version);
      req.set_communicator_prefix("bench/");
      workers_[r]->core.transfers()->Run(req,
                                         [&](absl::StatusOr<v1::RunTransferWorkerResponse> answer) {
                                           absl::MutexLock lock(&mu);
                                           if (!answer.ok() && failed.ok())
                                             failed = answer.status();
                                           ++answered;
                                         });
    }
    {
      absl::MutexLock lock(&mu);
      auto all = [&] { return answered == ranks_; };
      mu.Await(absl::Condition(&all));
    }
    if (!failed.ok()) return failed;
    v1::FinishPlanRequest finish;
    finish.set_plan_id(run_id);
    finish.set_commit(true);
    for (auto& w : workers_) {
      if (absl::Status s = w->core.FinishPlan(finish); !s.ok()) return s;
    }
    return Sample{absl::ToDoubleSeconds(absl::Now() - t0), ProcessCpuSeconds() - cpu0};
  }

 private:
  const int ranks_;
  InMemoryKvClient kv_;
  NoReports reporter_;
  std::vector<std::unique_ptr<BenchWorker>> workers_;
  std::map<std::string, int64_t> versions_;
  int runs_ = 0;
};

struct Stats {
  double best = 0, median = 0;
};
Stats Of(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return Stats{v.front(), v[v.size() / 2]};
}

int Main(int argc, char** argv) {
  int members = 20000, ranks = 8, runs = 5;
  bool json = false;
  CLI::App app{"a prepared transfer's warm run on the workers, per member, against one tensor"};
  app.add_option("--members", members, "Tensors in the transfer")->check(CLI::PositiveNumber);
  app.add_option("--ranks", ranks, "Workers (threads of this process); even")
      ->check(CLI::Range(2, 64));
  app.add_option("--runs", runs, "Warm runs of each (after one cold run)")
      ->check(CLI::PositiveNumber);
  app.add_flag("--json", json, "One JSON object on stdout");
  CLI11_PARSE(app, argc, argv);
  if (ranks % 2 != 0) {
    std::fprintf(stderr, "--ranks: %d (must be even: the dst mesh is (2, ranks/2))\n", ranks);
    return 2;
  }

  const DeviceMesh train = *DeviceMesh::Create({ranks});
  const DeviceMesh engine = *DeviceMesh::Create({2, ranks / 2});
  TransferTable many;
  std::map<std::pair<size_t, int>, int32_t> layout_of;  // (kind, side) -> layout index.
  int64_t bytes = 0;
  for (size_t k = 0; k < Kinds().size(); ++k) {
    const Kind& kind = Kinds()[k];
    layout_of[{k, 0}] = static_cast<int32_t>(many.layouts.size());
    many.layouts.push_back(Flat(train, kind.shape, ranks));
    layout_of[{k, 1}] = static_cast<int32_t>(many.layouts.size());
    many.layouts.push_back(Placed(engine, kind.shape, kind.tp));
  }
  for (int i = 0; i < members; ++i) {
    const size_t k = i % Kinds().size();
    const Kind& kind = Kinds()[k];
    TransferMemberSpec& m = many.members.emplace_back();
    m.src = absl::StrFormat("train.%06d", i);
    m.dst = absl::StrFormat("infer.%06d", i);
    m.src_version = kSrcVersion;
    m.dst_version = kDstVersion;
    m.src_layout = layout_of[{k, 0}];
    m.dst_layout = layout_of[{k, 1}];
    m.dtype = kind.dtype;
    bytes += Box::Whole(kind.shape).Volume() * ElementSize(kind.dtype);
  }
  TransferTable one;
  const Shape big{bytes / 2};
  one.layouts = {Flat(train, big, ranks), Placed(engine, big, "R,S(0)")};
  TransferMemberSpec& b = one.members.emplace_back();
  b.src = "big.src";
  b.dst = "big.dst";
  b.src_version = kSrcVersion;
  b.dst_version = kDstVersion;
  b.src_layout = 0;
  b.dst_layout = 1;
  b.dtype = DType::kBF16;

  Bench bench(ranks);
  const absl::Time p0 = absl::Now();
  if (absl::Status s = bench.Prepare("many", many); !s.ok()) {
    std::fprintf(stderr, "prepare many: %s\n", s.ToString().c_str());
    return 1;
  }
  const double prepare_s = absl::ToDoubleSeconds(absl::Now() - p0);
  if (absl::Status s = bench.Prepare("one", one); !s.ok()) {
    std::fprintf(stderr, "prepare one: %s\n", s.ToString().c_str());
    return 1;
  }
  std::vector<double> many_wall, many_cpu, one_wall, one_cpu;
  for (int i = 0; i <= runs; ++i) {  // Run 0 is cold (communicators, first allocations).
    absl::StatusOr<Bench::Sample> a = bench.Run("many");
    absl::StatusOr<Bench::Sample> c = bench.Run("one");
    if (!a.ok() || !c.ok()) {
      std::fprintf(stderr, "run: %s\n", (a.ok() ? c.status() : a.status()).ToString().c_str());
      return 1;
    }
    if (i == 0) continue;
    many_wall.push_back(a->wall);
    many_cpu.push_back(a->cpu);
    one_wall.push_back(c->wall);
    one_cpu.push_back(c->cpu);
  }
  const Stats mw = Of(many_wall), mc = Of(many_cpu), ow = Of(one_wall), oc = Of(one_cpu);
  const double per_member_us = mc.best / (static_cast<double>(members) * ranks) * 1e6;
  if (json) {
    std::printf(
        "{\"members\": %d, \"ranks\": %d, \"bytes\": %lld, \"prepare_seconds\": %.4f, "
        "\"many\": {\"best_seconds\": %.5f, \"median_seconds\": %.5f, \"best_cpu_seconds\": "
        "%.5f, \"median_cpu_seconds\": %.5f}, "
        "\"one\": {\"best_seconds\": %.5f, \"median_seconds\": %.5f, \"best_cpu_seconds\": "
        "%.5f, \"median_cpu_seconds\": %.5f}, "
        "\"ratio_best\": %.3f, \"ratio_median\": %.3f, \"cpu_us_per_member_rank\": %.3f}\n",
        members, ranks, static_cast<long long>(bytes), prepare_s, mw.best, mw.median, mc.best,
        mc.median, ow.best, ow.median, oc.best, oc.median, mw.best / ow.best, mw.median / ow.median,
        per_member_us);
  } else {
    std::printf("%d members (%lld B) on %d ranks, prepared in %.3f s\n", members,
                static_cast<long long>(bytes), ranks, prepare_s);
    std::printf("  many: best %.4f s, median %.4f s (CPU best %.4f s, median %.4f s)\n", mw.best,
                mw.median, mc.best, mc.median);
    std::printf("  one:  best %.4f s, median %.4f s (CPU best %.4f s, median %.4f s)\n", ow.best,
                ow.median, oc.best, oc.median);
    std::printf("  many/one: %.2fx best, %.2fx median; %.2f us CPU per (member, rank)\n",
                mw.best / ow.best, mw.median / ow.median, per_member_us);
  }
  return 0;
}

}  // namespace
}  // namespace shardcoord

int main(int argc, char** argv) { return shardcoord::Main(argc, argv); }
