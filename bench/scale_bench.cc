// A weight-sync step of a frontier model at cluster scale (issue 27 item 5): the state dict of
// a public model (bench/model_shapes.h) from FSDP flat on every rank (trainer) to TP8 x DP on
// the same ranks (inference), measured on the coordinator's real logic with the workers played
// in-process, and on the worker side of a prepared transfer.
//
//   bazel run -c opt //bench:scale_bench -- --model deepseek-v3 --ranks 256 [--tensors N]
//       [--json] [--reps R] [--state sqlite|memory] [--nounprepared] [--group_tensors N]
//       [--dense_flat] [--noprepared] [--runs N]
//
// What it measures (bench/README.md "scale_bench"):
// - the layouts: built sparse and interned, CPU seconds and the memory they take;
// - the worker side of a prepared transfer (sharding/transfer_table.h): the table of the
//   whole model (each distinct layout once), serialized into PrepareTransferRequest pages as
//   the coordinator sends them, parsed back as a worker does, and ExpandTransfer (a worker's
//   own part) for rank 0 and for the rank with the most work;
// - per-rank bytes of a run, from one plan per template (distinct src layout, dst layout,
//   dtype), and what they take over a 400 Gb/s NIC;
// - the unprepared baseline: one CopyGroup of every tensor through PlanManager, TensorManager
//   (on a state store in a temporary SQLite directory by default), admission and metrics as
//   the coordinator composes them, the workers answering every fragment with a correct report
//   at once. Its figure is the calling thread's CPU minus what the fake workers spent in it.
// Every CPU figure is CLOCK_THREAD_CPUTIME_ID of the one thread, best and median of --reps.
//
// - the prepared transfer: CreateTransfer and warm RunTransfers through the coordinator's
//   TransferManager (composed as the coordinator does, on the same state store), the workers
//   summarizing their parts instead of expanding them and answering runs at once; then a
//   restart (new managers loading the state written).

#include <stdlib.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "bench/bench_common.h"
#include "bench/coordinator_logic.h"
#include "bench/model_shapes.h"
#include "common/clock.h"
#include "common/json_writer.h"
#include "common/timer.h"
#include "coordinator/cluster/mesh_manager.h"
#include "coordinator/cluster/worker_client.h"
#include "coordinator/cluster/worker_manager.h"
#include "coordinator/plans/admission.h"
#include "coordinator/plans/coordinator_metrics.h"
#include "coordinator/plans/plan_manager.h"
#include "coordinator/state/tensor_manager.h"
#include "coordinator/store/sqlite_state_store.h"
#include "coordinator/store/state_store.h"
#include "coordinator/testing/fake_reports.h"
#include "coordinator/testing/fake_worker_client.h"
#include "coordinator/transfers/transfer_manager.h"
#include "coordinator/transfers/transfer_test_util.h"
#include "proto/convert.h"
#include "sharding/redistribute.h"
#include "sharding/transfer_table.h"

ABSL_FLAG(std::string, model, "deepseek-v3", "deepseek-v3, qwen3-235b-a22b or llama3-405b.");
ABSL_FLAG(int, ranks, 256, "Ranks of both meshes (a multiple of --tp).");
ABSL_FLAG(int, tp, 8, "Tensor-parallel degree of the inference mesh (dp = ranks / tp).");
ABSL_FLAG(int, tensors, 0, "Cut the model to its first N tensors (0: every tensor).");
ABSL_FLAG(bool, json, false, "Print one JSON object instead of text.");
ABSL_FLAG(int, reps, 2, "Timed repetitions of each measurement (best and median).");
ABSL_FLAG(std::string, state, "sqlite",
          "The coordinator's state store for the unprepared group: sqlite (a temporary "
          "directory, every commit durable) or memory.");
ABSL_FLAG(bool, unprepared, true, "Time the unprepared CopyGroup (off: layouts and worker side).");
ABSL_FLAG(int, group_tensors, 0,
          "The unprepared CopyGroup moves only the model's first N tensors, laid out as in the "
          "whole model (0: every tensor). Its coordinator memory grows as tensors x ranks (about "
          "0.6 GB per 1000 DeepSeek-V3 tensors at 256 ranks): a sample, from which the whole "
          "group's figures are extrapolated (and unprepared_group_cpu_s is null).");
ABSL_FLAG(bool, dense_flat, false,
          "Trainer layouts listing every rank (Layout::FromFlat, as the coordinator builds a "
          "flat spec) instead of only the ranks holding a piece.");
ABSL_FLAG(int64_t, page_bytes, 1 << 20, "Target size of a PrepareTransferRequest page.");
ABSL_FLAG(bool, prepared, true,
          "Time the prepared transfer through TransferManager (create, warm runs, restart).");
ABSL_FLAG(int, runs, 5, "Warm runs of the prepared transfer (best and median).");

namespace shardcoord {
namespace {

double WallSeconds() { return absl::ToDoubleSeconds(absl::Now() - absl::UnixEpoch()); }

// A field of /proc/self/status in bytes ("VmHWM", "VmRSS"); 0 when absent.
int64_t ProcStatusBytes(const std::string& field) {
  std::ifstream in("/proc/self/status");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind(field + ":", 0) == 0) return std::atoll(line.c_str() + field.size() + 1) * 1024;
  }
  return 0;
}

// Progress on stderr, with the wall time since the start and the memory now and at its peak.
void Progress(const std::string& what) {
  static const double start = WallSeconds();
  std::fprintf(stderr, "[scale_bench %7.1fs rss %.2f GB peak %.2f GB] %s\n", WallSeconds() - start,
               ProcStatusBytes("VmRSS") / 1e9, ProcStatusBytes("VmHWM") / 1e9, what.c_str());
}

std::string GB(int64_t bytes) { return absl::StrCat(bytes / 1e9, " GB"); }

// ---- The unprepared baseline's coordinator -----------------------------------------------

// A StateStore that counts what is written through it (not owned: a restarted coordinator
// loads what it wrote).
class CountingStore : public StateStore {
 public:
  explicit CountingStore(StateStore* inner) : inner_(inner) {}

  absl::Status Apply(const StateBatch& batch) override {
    for (const StateRecord& r : batch.puts) {
      bytes_ += static_cast<int64_t>(r.kind.size() + r.name.size() + r.value.size());
    }
    for (const auto& [kind, name] : batch.deletes) {
      bytes_ += static_cast<int64_t>(kind.size() + name.size());
    }
    ++applies_;
    return inner_->Apply(batch);
  }
  absl::StatusOr<std::vector<StateRecord>> LoadAll() const override { return inner_->LoadAll(); }
  absl::StatusOr<std::vector<StateRecord>> Load(absl::string_view kind) const override {
    return inner_->Load(kind);
  }
  std::string Describe() const override { return inner_->Describe(); }

  int64_t bytes() const { return bytes_; }
  int64_t applies() const { return applies_; }

 private:
  StateStore* const inner_;
  int64_t bytes_ = 0;  // Single-threaded: the bench's one thread.
  int64_t applies_ = 0;
};

// The coordinator's state store for --state: a temporary SQLite directory (every commit
// durable) or memory. Reopen() stands for a coordinator's restart.
class BenchStore {
 public:
  BenchStore() : kind_(absl::GetFlag(FLAGS_state)) {
    if (kind_ == "sqlite") {
      std::string tmpl = (std::filesystem::temp_directory_path() / "scale_bench.XXXXXX").string();
      if (mkdtemp(tmpl.data()) == nullptr) bench::Die("mkdtemp");
      dir_ = tmpl;
    } else if (kind_ != "memory") {
      bench::Die("--state must be sqlite or memory");
    }
    Reopen();
  }
  ~BenchStore() {
    inner_.reset();
    if (!dir_.empty()) std::filesystem::remove_all(dir_);
  }

  // Closes the store and opens it again (memory: the same records).
  void Reopen() {
    if (kind_ == "sqlite") {
      inner_.reset();
      inner_ = bench::OrDie(SqliteStateStore::Open(dir_), "sqlite");
    } else if (inner_ == nullptr) {
      inner_ = std::make_unique<MemoryStateStore>();
    }
  }
  StateStore* get() { return inner_.get(); }
  const std::string& kind() const { return kind_; }

 private:
  const std::string kind_;
  std::string dir_;
  std::unique_ptr<StateStore> inner_;
};

// Workers that turn every fragment into the report a correct worker sends, at once, and keep
// only the reports; FinishPlan succeeds. Their own CPU (report building, message sizes) is
// counted apart so that it can be taken out of the coordinator's. Single-threaded.
class FakeWorkers : public bench::PlanOnlyWorkerClient {
 public:
  void Execute(const WorkerEndpoint& w, v1::PlanFragment fragment, StatusCallback done) override {
    const double start = bench::ThreadCpuSeconds();
    ++messages_;
    message_bytes_ += static_cast<int64_t>(fragment.ByteSizeLong());
    reports_.push_back(fragment.members_size() > 0
                           ? FakeFusedFinalReport(fragment, w.name, w.incarnation)
                           : FakeFinalReport(fragment, w.name, w.incarnation));
    fake_cpu_ += bench::ThreadCpuSeconds() - start;
    done(absl::OkStatus());
  }
  void FinishPlan(const WorkerEndpoint&, v1::FinishPlanRequest request,
                  StatusCallback done) override {
    const double start = bench::ThreadCpuSeconds();
    ++messages_;
    message_bytes_ += static_cast<int64_t>(request.ByteSizeLong());
    fake_cpu_ += bench::ThreadCpuSeconds() - start;
    done(absl::OkStatus());
  }
  void DropTensor(const WorkerEndpoint&, const v1::DropTensorRequest&,
                  StatusCallback done) override {
    done(absl::OkStatus());
  }

  std::vector<WorkerReport> TakeReports() { return std::exchange(reports_, {}); }
  double fake_cpu() const { return fake_cpu_; }
  int64_t messages() const { return messages_; }
  int64_t message_bytes() const { return message_bytes_; }

 private:
  std::vector<WorkerReport> reports_;
  double fake_cpu_ = 0;
  int64_t messages_ = 0;
  int64_t message_bytes_ = 0;
};

// `ranks` workers registered (8 a host) and the meshes "fsdp" [ranks] and "infer"
// [ranks / tp, tp] (dp, tp); their incarnations by rank.
absl::flat_hash_map<int64_t, int64_t> RegisterCluster(WorkerManager* workers, MeshManager* meshes,
                                                      int64_t ranks, int64_t tp) {
  absl::flat_hash_map<int64_t, int64_t> incarnations;
  for (int64_t r = 0; r < ranks; ++r) {
    const std::string name = absl::StrCat("w", r);
    const WorkerRecord w = bench::OrDie(
        workers->Register(WorkerSpec{name, absl::StrCat("h", r / 8), "cpu", name + ":1", "gloo"}),
        "register");
    if (w.rank != r) bench::Die(absl::StrCat(name, " got rank ", w.rank));
    incarnations[r] = w.incarnation;
  }
  bench::OrDie(meshes->Create("fsdp", {ranks}, {"fsdp"}, {}), "mesh fsdp");
  bench::OrDie(meshes->Create("infer", {ranks / tp, tp}, {"dp", "tp"}, {}), "mesh infer");
  return incarnations;
}

// Ready tensors created as a bulk create does (coordinator/io/tensor_io_bulk.cc): each hidden
// until Publish makes them all visible and stored in one batch.
class TensorCreator {
 public:
  TensorCreator(TensorManager* tensors, absl::flat_hash_map<int64_t, int64_t> incarnations)
      : tensors_(tensors), incarnations_(std::move(incarnations)) {}

  void Create(const std::string& name, const ModelTensor& t, const std::string& mesh,
              std::string spec, const Layout& layout) {
    TensorRecord r;
    r.name = name;
    r.shape = t.shape;
    r.dtype = t.dtype;
    r.mesh = mesh;
    r.spec = std::move(spec);
    r.layout = layout;
    r.version = tensors_->NewVersion();
    r.owner = kCreator;
    bench::OrDie(tensors_->Reserve(std::move(r), kCreator), "reserve");
    LayoutChecksums sums;
    absl::flat_hash_map<int64_t, int64_t> incarnations;
    sums.reserve(layout.ranks().size());
    for (const RankChunks& rc : layout.ranks()) {
      sums.emplace_back(rc.chunks.size(), 0);
      incarnations[rc.rank] = incarnations_.at(rc.rank);
    }
    bench::OrDie(tensors_->FinishCreate(name, kCreator, std::move(sums), std::move(incarnations)),
                 "finish create");
    created_.push_back(name);
  }
  // Makes every created tensor visible and stored, in one batch.
  void Publish() {
    bench::OrDie(tensors_->PublishAll(created_, kCreator), "publish");
    created_.clear();
  }

 private:
  static constexpr char kCreator[] = "scale_bench-create";

  TensorManager* const tensors_;
  const absl::flat_hash_map<int64_t, int64_t> incarnations_;
  std::vector<std::string> created_;
};

// The coordinator's managers (bench::CoordinatorLogic) over `ranks` fake workers.
class Harness {
 public:
  Harness(StateStore* store, int64_t ranks, int64_t tp)
      : logic_(&client_, store, absl::Hours(1)),
        creator_(&logic_.tensors(),
                 RegisterCluster(&logic_.workers(), &logic_.meshes(), ranks, tp)) {}

  // Adds a ready tensor with `layout` on `mesh` (spec text `spec`), hidden until Publish.
  void Create(const std::string& name, const ModelTensor& t, const std::string& mesh,
              std::string spec, const Layout& layout) {
    creator_.Create(name, t, mesh, std::move(spec), layout);
  }
  void Publish() { creator_.Publish(); }

  // Plays every worker: each report collected since the last call goes in.
  void ReportAll() {
    for (const WorkerReport& r : client_.TakeReports()) {
      bench::OrDie(logic_.plans().Report(r), "report");
    }
  }

  PlanManager& plans() { return logic_.plans(); }
  FakeWorkers& client() { return client_; }

 private:
  FakeWorkers client_;
  bench::CoordinatorLogic logic_;
  TensorCreator creator_;
};

std::string SrcName(const ModelTensor& t) { return "trainer/" + t.name; }
std::string DstName(const ModelTensor& t) { return "infer/" + t.name; }

// ---- Results -------------------------------------------------------------------------------

struct Results {
  std::string model;
  int64_t tensors = 0, params = 0, bytes = 0, ranks = 0, tp = 0;
  int64_t layouts = 0, src_layouts = 0, dst_layouts = 0, templates = 0;
  double layouts_cpu_s = 0, layouts_wall_s = 0;
  int64_t rss_after_layouts = 0;
  // Worker side.
  double table_pages_cpu_s = 0;
  int64_t pages = 0, page_bytes = 0, participants = 0;
  double worker_parse_cpu_s = 0;
  double templates_plan_cpu_s = 0;
  int64_t busiest_rank = 0, busiest_pieces = 0, rank0_pieces = 0;
  bench::Stats expand_rank0, expand_busiest;
  int64_t busiest_fragment_bytes = 0;
  int64_t max_send = 0, max_recv = 0, max_send_rank = 0, max_recv_rank = 0;
  int64_t bytes_moved = 0, bytes_across_hosts = 0;
  int64_t hwm_before_unprepared = 0;
  // Prepared transfer.
  bool prepared = false;
  double prepared_setup_wall_s = 0;
  int64_t state_bytes_setup = 0;
  double prepare_cpu_s = 0, prepare_wall_s = 0, prepare_fake_cpu_s = 0;
  int64_t prepare_messages = 0, prepare_message_bytes = 0, prepare_state_bytes = 0;
  int64_t prepared_participants = 0, prepared_templates = 0, prepared_layouts = 0;
  bench::Stats run_cpu, run_wall;
  int64_t run_messages = 0, run_message_bytes = 0, state_bytes_per_run = 0;
  int64_t rss_prepared = 0;  // VmHWM after the prepared transfer's runs.
  double recovery_s = 0, recovery_cpu_s = 0;
  std::vector<std::pair<std::string, double>> recovery_steps;  // Each manager's Load, wall.
  // Unprepared group.
  bool unprepared = false;
  int64_t group_tensors = 0;  // Members of the unprepared group (tensors, or a sample).
  std::string state;
  double setup_wall_s = 0;
  bench::Stats group_cpu, group_wall;
  int64_t group_messages = 0, group_message_bytes = 0, group_state_bytes = 0;
  int64_t rss_bytes = 0;
};

double Median(const bench::Stats& s) { return s.seconds.empty() ? 0 : s.Median(); }
double Best(const bench::Stats& s) { return s.seconds.empty() ? 0 : s.Best(); }

void PrintJson(const Results& r) {
  JsonWriter w;
  w.BeginObject();
  w.Key("model").String(r.model);
  w.Key("tensors").Int(r.tensors);
  w.Key("params").Int(r.params);
  w.Key("ranks").Int(r.ranks);
  // Keys of the prepared transfer (null with --noprepared).
  if (r.prepared) {
    w.Key("prepare_cpu_s").Double(r.prepare_cpu_s);
    w.Key("prepare_wall_s").Double(r.prepare_wall_s);
    w.Key("run_cpu_s").BeginObject();
    w.Key("best").Double(Best(r.run_cpu)).Key("median").Double(Median(r.run_cpu));
    w.Key("seconds").BeginArray();
    for (double x : r.run_cpu.seconds) w.Double(x);
    w.EndArray().EndObject();
    w.Key("run_messages").Int(r.run_messages);
    w.Key("run_message_bytes").Int(r.run_message_bytes);
    w.Key("state_bytes_per_run").Int(r.state_bytes_per_run);
    // The peak before the unprepared group: layouts, the worker side's one table, the prepared
    // transfer's coordinator and its restart.
    w.Key("rss_bytes").Int(r.hwm_before_unprepared);
    w.Key("recovery_s").Double(r.recovery_s);
  } else {
    for (const char* key : {"prepare_cpu_s", "prepare_wall_s", "run_cpu_s", "run_messages",
                            "run_message_bytes", "state_bytes_per_run"}) {
      w.Key(key).Null();
    }
    w.Key("rss_bytes").Int(r.rss_bytes);
    w.Key("recovery_s").Null();
  }
  w.Key("max_rank_send_bytes").Int(r.max_send);
  w.Key("max_rank_recv_bytes").Int(r.max_recv);
  w.Key("est_data_plane_s_50GBps").Double(std::max(r.max_send, r.max_recv) / 50e9);
  if (r.unprepared && r.group_tensors == r.tensors) {
    w.Key("unprepared_group_cpu_s").Double(Best(r.group_cpu));
  } else {
    w.Key("unprepared_group_cpu_s").Null();
  }
  // What this bench adds.
  if (r.prepared) {
    w.Key("prepared").BeginObject();
    w.Key("setup_wall_s").Double(r.prepared_setup_wall_s);
    w.Key("setup_state_bytes").Int(r.state_bytes_setup);
    w.Key("prepare_fake_workers_cpu_s").Double(r.prepare_fake_cpu_s);
    w.Key("prepare_messages").Int(r.prepare_messages);
    w.Key("prepare_message_bytes").Int(r.prepare_message_bytes);
    w.Key("prepare_state_bytes").Int(r.prepare_state_bytes);
    w.Key("participants").Int(r.prepared_participants);
    w.Key("templates").Int(r.prepared_templates);
    w.Key("layouts").Int(r.prepared_layouts);
    w.Key("run_wall_s").BeginObject();
    w.Key("best").Double(Best(r.run_wall)).Key("median").Double(Median(r.run_wall));
    w.EndObject();
    w.Key("rss_after_runs_bytes").Int(r.rss_prepared);
    w.Key("recovery_cpu_s").Double(r.recovery_cpu_s);
    w.Key("recovery_wall_s_by_manager").BeginObject();
    for (const auto& [what, seconds] : r.recovery_steps) w.Key(what).Double(seconds);
    w.EndObject();
    w.EndObject();
    if (r.unprepared && Best(r.run_cpu) > 0) {
      // Against the unprepared group in the same run (its sample scaled to every tensor).
      const double unprepared =
          Best(r.group_cpu) * static_cast<double>(r.tensors) / r.group_tensors;
      w.Key("run_vs_unprepared").BeginObject();
      w.Key("unprepared_cpu_s").Double(unprepared);
      w.Key("extrapolated").Bool(r.group_tensors != r.tensors);
      w.Key("ratio").Double(unprepared / Best(r.run_cpu));
      w.EndObject();
    }
  }
  w.Key("rss_end_bytes").Int(r.rss_bytes);
  w.Key("bytes").Int(r.bytes);
  w.Key("tp").Int(r.tp);
  w.Key("templates").Int(r.templates);
  w.Key("layouts").Int(r.layouts);
  w.Key("src_layouts").Int(r.src_layouts);
  w.Key("dst_layouts").Int(r.dst_layouts);
  w.Key("layouts_cpu_s").Double(r.layouts_cpu_s);
  w.Key("layouts_wall_s").Double(r.layouts_wall_s);
  w.Key("rss_after_layouts_bytes").Int(r.rss_after_layouts);
  w.Key("participants").Int(r.participants);
  w.Key("table_pages_cpu_s").Double(r.table_pages_cpu_s);
  w.Key("prepare_pages").Int(r.pages);
  w.Key("prepare_page_bytes").Int(r.page_bytes);
  w.Key("worker_parse_cpu_s").Double(r.worker_parse_cpu_s);
  w.Key("templates_plan_cpu_s").Double(r.templates_plan_cpu_s);
  w.Key("worker_expand_cpu_s").BeginObject();
  w.Key("rank0").BeginObject();
  w.Key("best").Double(Best(r.expand_rank0)).Key("median").Double(Median(r.expand_rank0));
  w.Key("pieces").Int(r.rank0_pieces).EndObject();
  w.Key("busiest").BeginObject();
  w.Key("rank").Int(r.busiest_rank);
  w.Key("best").Double(Best(r.expand_busiest)).Key("median").Double(Median(r.expand_busiest));
  w.Key("pieces").Int(r.busiest_pieces);
  w.Key("fragment_bytes").Int(r.busiest_fragment_bytes).EndObject();
  w.EndObject();
  w.Key("max_rank_send_rank").Int(r.max_send_rank);
  w.Key("max_rank_recv_rank").Int(r.max_recv_rank);
  w.Key("bytes_moved").Int(r.bytes_moved);
  w.Key("bytes_across_hosts").Int(r.bytes_across_hosts);
  w.Key("rss_before_unprepared_bytes").Int(r.hwm_before_unprepared);
  if (r.unprepared) {
    // A sample's figures scale to the whole model's by tensors / group_tensors.
    const double scale = static_cast<double>(r.tensors) / r.group_tensors;
    w.Key("unprepared").BeginObject();
    w.Key("tensors").Int(r.group_tensors);
    w.Key("state").String(r.state);
    w.Key("setup_wall_s").Double(r.setup_wall_s);
    w.Key("cpu_best_s").Double(Best(r.group_cpu));
    w.Key("cpu_median_s").Double(Median(r.group_cpu));
    w.Key("cpu_s").BeginArray();
    for (double s : r.group_cpu.seconds) w.Double(s);
    w.EndArray();
    w.Key("wall_s").BeginArray();
    for (double s : r.group_wall.seconds) w.Double(s);
    w.EndArray();
    w.Key("messages").Int(r.group_messages);
    w.Key("message_bytes").Int(r.group_message_bytes);
    w.Key("state_bytes").Int(r.group_state_bytes);
    w.Key("peak_rss_bytes").Int(r.rss_bytes);
    if (r.group_tensors != r.tensors) {
      w.Key("extrapolated").BeginObject();
      w.Key("cpu_best_s").Double(Best(r.group_cpu) * scale);
      w.Key("cpu_median_s").Double(Median(r.group_cpu) * scale);
      w.Key("message_bytes").Double(r.group_message_bytes * scale);
      w.Key("state_bytes").Double(r.group_state_bytes * scale);
      w.Key("coordinator_memory_bytes").Double((r.rss_bytes - r.hwm_before_unprepared) * scale);
      w.EndObject();
    }
    w.EndObject();
  }
  w.Key("reps").Int(absl::GetFlag(FLAGS_reps));
  w.Key("optimized").Bool(bench::kOptimizedBuild);
  w.EndObject();
  if (!w.complete()) bench::Die("json");
  std::printf("%s\n", w.str().c_str());
}

void PrintText(const Results& r) {
  std::printf(
      "%s: %lld tensors, %.1fB params (%s bf16), %lld ranks (trainer FSDP flat, "
      "inference TP%lld x DP%lld)\n",
      r.model.c_str(), static_cast<long long>(r.tensors), r.params / 1e9, GB(r.bytes).c_str(),
      static_cast<long long>(r.ranks), static_cast<long long>(r.tp),
      static_cast<long long>(r.ranks / r.tp));
  std::printf(
      "  layouts        %lld distinct (%lld trainer, %lld inference), %lld templates; "
      "built in %.3f s CPU (%.3f s wall), RSS then %s\n",
      static_cast<long long>(r.layouts), static_cast<long long>(r.src_layouts),
      static_cast<long long>(r.dst_layouts), static_cast<long long>(r.templates), r.layouts_cpu_s,
      r.layouts_wall_s, GB(r.rss_after_layouts).c_str());
  std::printf(
      "  prepare table  %lld pages, %.2f MB in all (%lld participants), built and "
      "serialized in %.3f s CPU; a worker parses them in %.3f s\n",
      static_cast<long long>(r.pages), r.page_bytes / 1e6, static_cast<long long>(r.participants),
      r.table_pages_cpu_s, r.worker_parse_cpu_s);
  std::printf("  ExpandTransfer rank 0: best %.3f s, median %.3f s (%lld pieces per run)\n",
              Best(r.expand_rank0), Median(r.expand_rank0), static_cast<long long>(r.rank0_pieces));
  std::printf(
      "  ExpandTransfer rank %lld (most pieces): best %.3f s, median %.3f s (%lld pieces "
      "per run, resident fragment %.2f MB)\n",
      static_cast<long long>(r.busiest_rank), Best(r.expand_busiest), Median(r.expand_busiest),
      static_cast<long long>(r.busiest_pieces), r.busiest_fragment_bytes / 1e6);
  std::printf("  all templates planned once: %.3f s CPU\n", r.templates_plan_cpu_s);
  std::printf(
      "  per run: %s moved (%s across hosts); max send %s (rank %lld), max receive %s "
      "(rank %lld): %.2f s at 50 GB/s\n",
      GB(r.bytes_moved).c_str(), GB(r.bytes_across_hosts).c_str(), GB(r.max_send).c_str(),
      static_cast<long long>(r.max_send_rank), GB(r.max_recv).c_str(),
      static_cast<long long>(r.max_recv_rank), std::max(r.max_send, r.max_recv) / 50e9);
  if (r.unprepared) {
    std::printf(
        "  unprepared CopyGroup of %lld tensors (state %s): coordinator CPU best %.3f s, "
        "median %.3f s (wall best %.3f s); %lld messages, %.1f MB to workers; %.1f MB "
        "to the state store; setup %.1f s\n",
        static_cast<long long>(r.group_tensors), r.state.c_str(), Best(r.group_cpu),
        Median(r.group_cpu), Best(r.group_wall), static_cast<long long>(r.group_messages),
        r.group_message_bytes / 1e6, r.group_state_bytes / 1e6, r.setup_wall_s);
    if (r.group_tensors != r.tensors) {
      const double scale = static_cast<double>(r.tensors) / r.group_tensors;
      std::printf(
          "    x %.1f for all %lld tensors: CPU best ~%.1f s, median ~%.1f s, ~%.0f MB "
          "to workers, ~%.0f MB to the store, ~%.1f GB of coordinator memory\n",
          scale, static_cast<long long>(r.tensors), Best(r.group_cpu) * scale,
          Median(r.group_cpu) * scale, r.group_message_bytes * scale / 1e6,
          r.group_state_bytes * scale / 1e6, (r.rss_bytes - r.hwm_before_unprepared) * scale / 1e9);
    }
  }
  std::printf("  peak RSS %s (%s before the unprepared group)\n", GB(r.rss_bytes).c_str(),
              GB(r.hwm_before_unprepared).c_str());
  if (r.prepared) {
    std::printf(
        "  prepared transfer (TransferManager, state %s): %lld tensors created and stored in "
        "%.1f s wall\n",
        absl::GetFlag(FLAGS_state).c_str(), static_cast<long long>(2 * r.tensors),
        r.prepared_setup_wall_s);
    std::printf(
        "    CreateTransfer: %.3f s coordinator CPU (%.3f s wall; the fake workers' %.3f s "
        "apart), %lld participants, %lld templates, %lld layouts; %lld messages, %.1f MB to "
        "workers, %.1f MB to the store\n",
        r.prepare_cpu_s, r.prepare_wall_s, r.prepare_fake_cpu_s,
        static_cast<long long>(r.prepared_participants),
        static_cast<long long>(r.prepared_templates), static_cast<long long>(r.prepared_layouts),
        static_cast<long long>(r.prepare_messages), r.prepare_message_bytes / 1e6,
        r.prepare_state_bytes / 1e6);
    std::printf(
        "    warm run: coordinator CPU best %.2f ms, median %.2f ms (wall best %.2f ms) over %zu "
        "runs; %lld messages (%.2f x ranks), %.1f KB to workers; %lld bytes to the store\n",
        Best(r.run_cpu) * 1e3, Median(r.run_cpu) * 1e3, Best(r.run_wall) * 1e3,
        r.run_cpu.seconds.size(), static_cast<long long>(r.run_messages),
        static_cast<double>(r.run_messages) / r.ranks, r.run_message_bytes / 1e3,
        static_cast<long long>(r.state_bytes_per_run));
    std::printf("    restart: managers loaded in %.2f s wall (%.2f s CPU)\n", r.recovery_s,
                r.recovery_cpu_s);
    if (r.unprepared && Best(r.run_cpu) > 0) {
      const double unprepared =
          Best(r.group_cpu) * static_cast<double>(r.tensors) / r.group_tensors;
      std::printf("    unprepared group / warm run: %.0fx (%s%.1f s / %.2f ms)\n",
                  unprepared / Best(r.run_cpu), r.group_tensors != r.tensors ? "~" : "", unprepared,
                  Best(r.run_cpu) * 1e3);
    }
    std::printf("    peak RSS before the unprepared group %s\n",
                GB(r.hwm_before_unprepared).c_str());
  }
}

// ---- The worker side of a prepared transfer ------------------------------------------------

// What each rank moves per run and how many pieces (transfers sent or received, local
// copies, each counted per member), from one plan per template.
struct RankTotals {
  std::vector<int64_t> sent, received, pieces;
};

void WorkerSide(const std::vector<ModelTensor>& tensors, const WeightSyncLayouts& w, Results* out) {
  const int reps = std::max(1, absl::GetFlag(FLAGS_reps));
  std::vector<std::string> hosts(w.ranks);
  for (int64_t r = 0; r < w.ranks; ++r) hosts[r] = absl::StrCat("h", r / 8);

  // The coordinator's part: the table and its pages.
  double start = bench::ThreadCpuSeconds();
  TransferTable table;
  table.layouts = w.layouts;  // Copies share their representation.
  table.hosts_by_rank = hosts;
  table.members.reserve(tensors.size());
  for (size_t i = 0; i < tensors.size(); ++i) {
    TransferMemberSpec& m = table.members.emplace_back();
    m.src = SrcName(tensors[i]);
    m.dst = DstName(tensors[i]);
    m.src_version = 1;
    m.dst_version = 2;
    m.src_layout = w.src[i];
    m.dst_layout = w.dst[i];
    m.dtype = tensors[i].dtype;
  }
  const std::vector<int64_t> participants = TransferParticipants(table);
  std::vector<v1::PrepareTransferRequest> pages(1);
  int64_t page_size = 0;
  auto next_page = [&](int64_t item) {
    if (page_size > 0 && page_size + item > absl::GetFlag(FLAGS_page_bytes)) {
      pages.emplace_back();
      page_size = 0;
    }
    page_size += item + 6;  // The field's tag and length.
    return &pages.back();
  };
  {
    v1::PrepareTransferRequest& p = pages[0];
    p.set_transfer_id("scale@1");
    for (const std::string& h : hosts) p.add_hosts_by_rank(h);
    for (int64_t r : participants) {
      p.add_ranks(r);
      p.add_incarnations(1);
    }
    p.set_step_timeout_ms(300000);
    page_size = static_cast<int64_t>(p.ByteSizeLong());
  }
  for (const Layout& layout : table.layouts) {
    v1::Layout proto = TransferLayoutToProto(layout, /*keep_empty_ranks=*/false);
    *next_page(static_cast<int64_t>(proto.ByteSizeLong()))->add_layouts() = std::move(proto);
  }
  for (const TransferMemberSpec& m : table.members) {
    v1::TransferMember proto = TransferMemberToProto(m);
    *next_page(static_cast<int64_t>(proto.ByteSizeLong()))->add_members() = std::move(proto);
  }
  std::vector<std::string> wire;
  for (size_t i = 0; i < pages.size(); ++i) {
    pages[i].set_page(static_cast<int32_t>(i));
    pages[i].set_last(i + 1 == pages.size());
    wire.push_back(pages[i].SerializeAsString());
    out->page_bytes += static_cast<int64_t>(wire.back().size());
  }
  out->table_pages_cpu_s = bench::ThreadCpuSeconds() - start;
  out->pages = static_cast<int64_t>(pages.size());
  out->participants = static_cast<int64_t>(participants.size());
  pages.clear();
  out->templates = static_cast<int64_t>(TemplatesOf(table).templates.size());
  Progress(absl::StrCat("table: ", out->pages, " pages, ", out->page_bytes / 1e6, " MB, ",
                        out->templates, " templates, ", out->table_pages_cpu_s, " s CPU"));

  // A worker: the pages back into a table.
  start = bench::ThreadCpuSeconds();
  TransferTable parsed;
  for (const std::string& bytes : wire) {
    v1::PrepareTransferRequest page;
    if (!page.ParseFromString(bytes)) bench::Die("a page does not parse");
    bench::OrDie(AppendTransferPage(page, &parsed), "AppendTransferPage");
  }
  bench::OrDie(ValidateTransferTable(parsed), "ValidateTransferTable");
  out->worker_parse_cpu_s = bench::ThreadCpuSeconds() - start;
  wire.clear();
  if (parsed.members.size() != table.members.size() ||
      parsed.layouts.size() != table.layouts.size()) {
    bench::Die("the parsed table differs from the sent one");
  }
  Progress(absl::StrCat("a worker parsed the pages in ", out->worker_parse_cpu_s, " s CPU"));

  // Per-rank totals of a run: each template planned once, as ExpandTransfer plans it.
  start = bench::ThreadCpuSeconds();
  const TransferTemplates templates = TemplatesOf(parsed);
  std::vector<int64_t> members_of(templates.templates.size(), 0);
  for (int32_t k : templates.of_member) ++members_of[k];
  PlanOptions options;
  options.hosts_by_rank = hosts;
  options.use_collectives = false;
  RankTotals totals{std::vector<int64_t>(w.ranks, 0), std::vector<int64_t>(w.ranks, 0),
                    std::vector<int64_t>(w.ranks, 0)};
  for (size_t k = 0; k < templates.templates.size(); ++k) {
    const TransferTemplate& t = templates.templates[k];
    const Plan plan = bench::OrDie(
        Redistribute(parsed.layouts[t.src_layout], parsed.layouts[t.dst_layout], t.dtype, options),
        "plan");
    const int64_t m = members_of[k];
    for (const RankTraffic& rt : plan.traffic) {
      totals.sent[rt.rank] += rt.bytes_sent * m;
      totals.received[rt.rank] += rt.bytes_received * m;
    }
    for (const Step& s : plan.steps) {
      for (const Transfer& tr : s.transfers) {
        totals.pieces[tr.src] += m;
        totals.pieces[tr.dst] += m;
      }
    }
    for (const LocalCopy& c : plan.local_copies) totals.pieces[c.rank] += m;
    out->bytes_moved += plan.bytes_moved * m;
    out->bytes_across_hosts += plan.bytes_across_hosts * m;
    if ((k + 1) % 1000 == 0) {
      Progress(absl::StrCat("planned ", k + 1, " of ", templates.templates.size(), " templates"));
    }
  }
  out->templates_plan_cpu_s = bench::ThreadCpuSeconds() - start;
  for (int64_t r = 0; r < w.ranks; ++r) {
    if (totals.sent[r] > out->max_send) {
      out->max_send = totals.sent[r];
      out->max_send_rank = r;
    }
    if (totals.received[r] > out->max_recv) {
      out->max_recv = totals.received[r];
      out->max_recv_rank = r;
    }
    if (totals.pieces[r] > out->busiest_pieces) {
      out->busiest_pieces = totals.pieces[r];
      out->busiest_rank = r;
    }
  }
  out->rank0_pieces = totals.pieces[0];
  Progress(absl::StrCat("planned every template once in ", out->templates_plan_cpu_s,
                        " s CPU; busiest rank ", out->busiest_rank));

  // Each worker's own part.
  ExpandOptions expand;
  expand.transfer_id = "scale@1";
  for (int64_t r : participants) expand.incarnations[r] = 1;
  std::vector<int64_t> expanded = {0};
  if (out->busiest_rank != 0) expanded.push_back(out->busiest_rank);
  for (const int64_t rank : expanded) {
    bench::Stats& stats = rank == 0 ? out->expand_rank0 : out->expand_busiest;
    for (int rep = 0; rep < reps; ++rep) {
      start = bench::ThreadCpuSeconds();
      absl::StatusOr<RankTransfer> part = ExpandTransfer(parsed, rank, expand);
      const double seconds = bench::ThreadCpuSeconds() - start;
      const RankTransfer rt = bench::OrDie(std::move(part), "ExpandTransfer");
      stats.seconds.push_back(seconds);
      if (rt.bytes_sent != totals.sent[rank] || rt.bytes_received != totals.received[rank]) {
        bench::Die(absl::StrCat("rank ", rank, ": ExpandTransfer sends ", rt.bytes_sent,
                                " and receives ", rt.bytes_received, " bytes, the plans say ",
                                totals.sent[rank], " and ", totals.received[rank]));
      }
      if (rank == out->busiest_rank && rep == 0) {
        out->busiest_fragment_bytes =
            static_cast<int64_t>(FragmentToProto(rt.fragment).ByteSizeLong());
      }
      Progress(absl::StrCat("ExpandTransfer rank ", rank, ": ", seconds, " s CPU"));
    }
  }
  if (out->busiest_rank == 0) out->expand_busiest = out->expand_rank0;
}

// ---- The prepared transfer -----------------------------------------------------------------

// In front of the fake workers: counts the coordinator's messages to workers and their bytes,
// and the CPU the fakes spend on the bench's one thread (from a call until its answer; the
// answers come inline, and what runs in the callback is the coordinator's again).
class MeteredClient : public WorkerClient {
 public:
  explicit MeteredClient(WorkerClient* inner) : inner_(inner) {}

  void Execute(const WorkerEndpoint& w, v1::PlanFragment fragment, StatusCallback done) override {
    const double start = Count(fragment.ByteSizeLong());
    inner_->Execute(w, std::move(fragment), Timed(start, std::move(done)));
  }
  void FinishPlan(const WorkerEndpoint& w, v1::FinishPlanRequest request,
                  StatusCallback done) override {
    const double start = Count(request.ByteSizeLong());
    inner_->FinishPlan(w, std::move(request), Timed(start, std::move(done)));
  }
  void Fill(const WorkerEndpoint& w, const v1::FillRequest& request,
            Callback<v1::FillResponse> done) override {
    inner_->Fill(w, request, std::move(done));
  }
  void DropTensor(const WorkerEndpoint& w, const v1::DropTensorRequest& request,
                  StatusCallback done) override {
    const double start = Count(request.ByteSizeLong());
    inner_->DropTensor(w, request, Timed(start, std::move(done)));
  }
  void ReadChunk(const WorkerEndpoint& w, const v1::ReadChunkRequest& request,
                 Callback<std::string> done) override {
    inner_->ReadChunk(w, request, std::move(done));
  }
  void WriteChunk(const WorkerEndpoint& w, const v1::ChunkData& header, std::string data,
                  Callback<v1::WriteChunkResponse> done) override {
    inner_->WriteChunk(w, header, std::move(data), std::move(done));
  }
  void PrepareTransfer(const WorkerEndpoint& w,
                       std::shared_ptr<const v1::PrepareTransferRequest> request,
                       Callback<v1::PrepareTransferResponse> done) override {
    // The same page goes to every worker: sized once.
    const double start = bench::ThreadCpuSeconds();
    if (request.get() != last_page_) {
      last_page_ = request.get();
      last_page_bytes_ = static_cast<int64_t>(request->ByteSizeLong());
    }
    ++messages_;
    message_bytes_ += last_page_bytes_;
    inner_->PrepareTransfer(w, std::move(request), Timed(start, std::move(done)));
  }
  void RunTransfer(const WorkerEndpoint& w, const v1::RunTransferWorkerRequest& request,
                   absl::Duration timeout, Callback<v1::RunTransferWorkerResponse> done) override {
    const double start = Count(request.ByteSizeLong());
    inner_->RunTransfer(w, request, timeout, Timed(start, std::move(done)));
  }
  void DropTransfer(const WorkerEndpoint& w, const v1::DropTransferRequest& request,
                    StatusCallback done) override {
    const double start = Count(request.ByteSizeLong());
    inner_->DropTransfer(w, request, Timed(start, std::move(done)));
  }

  double fake_cpu() const { return fake_cpu_; }
  int64_t messages() const { return messages_; }
  int64_t message_bytes() const { return message_bytes_; }

 private:
  // Counts one message of `bytes`; the fake's CPU starts.
  double Count(size_t bytes) {
    const double start = bench::ThreadCpuSeconds();
    ++messages_;
    message_bytes_ += static_cast<int64_t>(bytes);
    return start;
  }
  // `done`, once the fake's CPU since `start` is counted.
  template <typename T>
  std::function<void(T)> Timed(double start, std::function<void(T)> done) {
    return [this, start, done = std::move(done)](T result) {
      fake_cpu_ += bench::ThreadCpuSeconds() - start;
      done(std::move(result));
    };
  }

  WorkerClient* const inner_;
  const void* last_page_ = nullptr;
  int64_t last_page_bytes_ = 0;
  double fake_cpu_ = 0;  // Single-threaded: the bench's one thread.
  int64_t messages_ = 0;
  int64_t message_bytes_ = 0;
};

// A prepared transfer of the model (trainer -> inference) through a TransferManager composed
// as the coordinator composes it (coordinator/transfers/transfer_test_util.h's TransferBoot:
// workers, meshes, tensors, admission, metrics) on the --state store, with fake workers that
// summarize their parts instead of expanding them (FakeWorkerClient::SetSummarizePrepares: a
// real worker's answers, each template planned once for all ranks) and answer RunTransfer and
// FinishPlan at once. Then a restart: new managers load the state written.
void PreparedTransfer(const std::vector<ModelTensor>& tensors, const WeightSyncLayouts& w,
                      Results* out) {
  const int runs = std::max(1, absl::GetFlag(FLAGS_runs));
  const int64_t n = static_cast<int64_t>(tensors.size());
  BenchStore inner;
  CountingStore store(inner.get());
  FakeClock clock;
  FakeTimer timer(&clock);
  Registry registry;
  CoordinatorMetrics metrics(&registry);
  FakeWorkerClient fakes;
  fakes.SetSummarizePrepares(true);
  MeteredClient client(&fakes);
  TransferManagerOptions options;
  options.run_timeout = absl::Hours(1);
  options.page_bytes = absl::GetFlag(FLAGS_page_bytes);
  options.max_members = std::max<size_t>(options.max_members, tensors.size());
  {
    std::vector<TransferCopy> copies;
    copies.reserve(n);
    for (const ModelTensor& t : tensors) copies.push_back({SrcName(t), DstName(t)});
    double wall = WallSeconds();
    TransferBoot boot(&clock, &timer, &client, &store, &metrics, options);
    {
      TensorCreator creator(&boot.tensors,
                            RegisterCluster(&boot.workers, &boot.meshes, w.ranks, w.tp));
      const int64_t total = TotalElements(tensors);
      for (int64_t i = 0; i < n; ++i) {
        const ModelTensor& t = tensors[i];
        creator.Create(SrcName(t), t, "fsdp",
                       "flat " + FlatSpecToString(FsdpFlatSpec(t, total, w.ranks)),
                       w.layouts[w.src[i]]);
        creator.Create(DstName(t), t, "infer", w.placements[w.dst_placements[i]],
                       w.layouts[w.dst[i]]);
      }
      creator.Publish();
    }
    out->prepared_setup_wall_s = WallSeconds() - wall;
    out->state_bytes_setup = store.bytes();
    Progress(absl::StrCat("prepared: created and stored ", 2 * n, " tensors in ",
                          out->prepared_setup_wall_s, " s (", store.bytes() / 1e6,
                          " MB to the store)"));

    // CreateTransfer: check, bind, prepare (the table's pages to every participant, their
    // answers summed, admission), store.
    const double fake0 = client.fake_cpu();
    const int64_t messages0 = client.messages(), bytes0 = client.message_bytes();
    const int64_t state0 = store.bytes();
    std::optional<absl::StatusOr<v1::TransferInfo>> info;
    wall = WallSeconds();
    double start = bench::ThreadCpuSeconds();
    boot.transfers->Create("sync", std::move(copies),
                           [&info](absl::StatusOr<v1::TransferInfo> i) { info = std::move(i); });
    const double cpu = bench::ThreadCpuSeconds() - start;
    out->prepare_wall_s = WallSeconds() - wall;
    if (!info.has_value()) bench::Die("CreateTransfer did not answer inline");
    const v1::TransferInfo created = bench::OrDie(*std::move(info), "CreateTransfer");
    out->prepare_fake_cpu_s = client.fake_cpu() - fake0;
    out->prepare_cpu_s = cpu - out->prepare_fake_cpu_s;
    out->prepare_messages = client.messages() - messages0;
    out->prepare_message_bytes = client.message_bytes() - bytes0;
    out->prepare_state_bytes = store.bytes() - state0;
    out->prepared_participants = created.participants();
    out->prepared_templates = created.templates();
    out->prepared_layouts = created.layouts();
    if (created.max_rank_send_bytes() != out->max_send ||
        created.max_rank_recv_bytes() != out->max_recv) {
      bench::Die(absl::StrCat("the prepared transfer's max send / receive (",
                              created.max_rank_send_bytes(), ", ", created.max_rank_recv_bytes(),
                              ") differ from the plans' (", out->max_send, ", ", out->max_recv,
                              ")"));
    }
    Progress(absl::StrCat("CreateTransfer: ", out->prepare_cpu_s,
                          " s coordinator CPU (fake "
                          "workers' ",
                          out->prepare_fake_cpu_s, " s apart), ", out->prepare_messages,
                          " messages, ", out->prepare_message_bytes / 1e6, " MB"));

    // Warm runs: every one after the preparation.
    for (int rep = 0; rep < runs; ++rep) {
      const double run_fake0 = client.fake_cpu(), run_wall0 = WallSeconds();
      const int64_t run_messages0 = client.messages(), run_bytes0 = client.message_bytes();
      const int64_t run_state0 = store.bytes();
      absl::Status started = absl::UnknownError("not started"), ended = started;
      v1::RunTransferResponse response;
      start = bench::ThreadCpuSeconds();
      boot.transfers->Run(
          "sync",
          [&started](const absl::Status& s, const v1::RunTransferResponse&) { started = s; },
          [&ended, &response](const absl::Status& s, const v1::RunTransferResponse& r) {
            ended = s;
            response = r;
          });
      const double run_cpu = bench::ThreadCpuSeconds() - start - (client.fake_cpu() - run_fake0);
      const double run_wall = WallSeconds() - run_wall0;
      bench::OrDie(started, "RunTransfer");
      bench::OrDie(ended, "the run");
      if (response.state() != v1::COMMITTED || response.replanned()) {
        bench::Die(absl::StrCat("run ", rep, ": ", response.ShortDebugString()));
      }
      out->run_cpu.seconds.push_back(run_cpu);
      out->run_wall.seconds.push_back(run_wall);
      out->run_messages = client.messages() - run_messages0;
      out->run_message_bytes = client.message_bytes() - run_bytes0;
      out->state_bytes_per_run = std::max(out->state_bytes_per_run, store.bytes() - run_state0);
      Progress(absl::StrCat("run ", rep + 1, "/", runs, ": ", run_cpu * 1e3,
                            " ms coordinator CPU, ", out->run_messages, " messages, ",
                            store.bytes() - run_state0, " bytes to the store"));
    }
    out->rss_prepared = ProcStatusBytes("VmHWM");
  }

  // A restart: new managers over the same store, loaded in the coordinator's order, ready to
  // run once the workers registered again (the first run prepares again).
  const double wall = WallSeconds(), start = bench::ThreadCpuSeconds();
  inner.Reopen();
  CountingStore reopened(inner.get());
  TransferBoot boot(&clock, &timer, &client, &reopened, &metrics, options);
  double step = WallSeconds();
  auto timed = [&](const char* what, const absl::Status& s) {
    bench::OrDie(s, what);
    out->recovery_steps.emplace_back(what, WallSeconds() - step);
    step = WallSeconds();
  };
  timed("workers", boot.workers.Load());
  timed("meshes", boot.meshes.Load());
  timed("tensors", boot.tensors.Load([&boot](int64_t rank, int64_t incarnation) {
    return boot.workers.WasLiveBeforeRestart(rank, incarnation);
  }));
  timed("transfers", boot.transfers->Load());
  out->recovery_cpu_s = bench::ThreadCpuSeconds() - start;
  out->recovery_s = WallSeconds() - wall;
  const v1::TransferInfo loaded = bench::OrDie(boot.transfers->Get("sync", false), "Get");
  if (loaded.members() != n || loaded.runs() != runs) {
    bench::Die(absl::StrCat("the loaded transfer: ", loaded.ShortDebugString()));
  }
  std::string steps;
  for (const auto& [what, seconds] : out->recovery_steps) {
    absl::StrAppend(&steps, steps.empty() ? "" : ", ", what, " ", seconds, " s");
  }
  Progress(absl::StrCat("restart: loaded in ", out->recovery_s, " s (", out->recovery_cpu_s,
                        " s CPU; ", steps, ")"));
}

// ---- The unprepared group ------------------------------------------------------------------

void Unprepared(const std::vector<ModelTensor>& tensors, const WeightSyncLayouts& w, Results* out) {
  const int reps = std::max(1, absl::GetFlag(FLAGS_reps));
  const std::string state = absl::GetFlag(FLAGS_state);
  BenchStore inner;
  out->unprepared = true;
  out->state = state;
  const int64_t n = absl::GetFlag(FLAGS_group_tensors) > 0
                        ? std::min<int64_t>(absl::GetFlag(FLAGS_group_tensors), tensors.size())
                        : static_cast<int64_t>(tensors.size());
  out->group_tensors = n;
  auto store = std::make_unique<CountingStore>(inner.get());
  {
    const double wall = WallSeconds();
    Harness h(store.get(), w.ranks, w.tp);
    const int64_t total = TotalElements(tensors);
    for (int64_t i = 0; i < n; ++i) {
      const ModelTensor& t = tensors[i];
      h.Create(SrcName(t), t, "fsdp", "flat " + FlatSpecToString(FsdpFlatSpec(t, total, w.ranks)),
               w.layouts[w.src[i]]);
      h.Create(DstName(t), t, "infer", w.placements[w.dst_placements[i]], w.layouts[w.dst[i]]);
      if ((i + 1) % 10000 == 0) Progress(absl::StrCat("created ", i + 1, " tensor pairs"));
    }
    h.Publish();
    out->setup_wall_s = WallSeconds() - wall;
    Progress(absl::StrCat("created and stored ", 2 * n, " tensors in ", out->setup_wall_s, " s (",
                          store->bytes() / 1e6, " MB to the store)"));

    std::vector<CopyMember> copies;
    copies.reserve(n);
    for (int64_t i = 0; i < n; ++i) {
      copies.push_back(CopyMember{SrcName(tensors[i]), DstName(tensors[i])});
    }
    for (int rep = 0; rep < reps; ++rep) {
      const double fake0 = h.client().fake_cpu(), wall0 = WallSeconds();
      const int64_t messages0 = h.client().messages(), bytes0 = h.client().message_bytes();
      const int64_t state0 = store->bytes();
      bool committed = false;
      std::string error;
      const double start = bench::ThreadCpuSeconds();
      bench::OrDie(h.plans().CopyGroup(copies,
                                       [&](const absl::Status& s, const GroupProgress&) {
                                         committed = s.ok();
                                         if (!s.ok()) error = s.ToString();
                                       }),
                   "CopyGroup");
      Progress("group dispatched");
      h.ReportAll();
      const double cpu = bench::ThreadCpuSeconds() - start - (h.client().fake_cpu() - fake0);
      if (!committed) bench::Die("the group did not commit: " + error);
      out->group_cpu.seconds.push_back(cpu);
      out->group_wall.seconds.push_back(WallSeconds() - wall0);
      out->group_messages = h.client().messages() - messages0;
      out->group_message_bytes = h.client().message_bytes() - bytes0;
      out->group_state_bytes = store->bytes() - state0;
      Progress(absl::StrCat("unprepared CopyGroup ", rep + 1, "/", reps, ": ", cpu,
                            " s coordinator CPU (fake workers' ", h.client().fake_cpu() - fake0,
                            " s apart)"));
    }
  }
}

int Main() {
  Results r;
  r.model = absl::GetFlag(FLAGS_model);
  std::vector<ModelTensor> tensors = bench::OrDie(ModelStateDict(r.model), "model");
  if (absl::GetFlag(FLAGS_tensors) > 0) {
    tensors = FirstTensors(std::move(tensors), absl::GetFlag(FLAGS_tensors));
  }
  r.tensors = static_cast<int64_t>(tensors.size());
  r.params = TotalElements(tensors);
  r.bytes = TotalBytes(tensors);
  r.ranks = absl::GetFlag(FLAGS_ranks);
  r.tp = absl::GetFlag(FLAGS_tp);
  Progress(absl::StrCat(r.model, ": ", r.tensors, " tensors, ", r.params, " params, ", r.ranks,
                        " ranks"));

  WeightSyncOptions options;
  options.ranks = r.ranks;
  options.tp = r.tp;
  options.dense_flat = absl::GetFlag(FLAGS_dense_flat);
  const double wall = WallSeconds(), start = bench::ThreadCpuSeconds();
  const WeightSyncLayouts w = bench::OrDie(BuildWeightSyncLayouts(tensors, options), "layouts");
  r.layouts_cpu_s = bench::ThreadCpuSeconds() - start;
  r.layouts_wall_s = WallSeconds() - wall;
  r.rss_after_layouts = ProcStatusBytes("VmRSS");
  r.layouts = static_cast<int64_t>(w.layouts.size());
  {
    std::vector<bool> is_src(w.layouts.size(), false);
    for (int32_t i : w.src) is_src[i] = true;
    r.src_layouts = std::count(is_src.begin(), is_src.end(), true);
    r.dst_layouts = r.layouts - r.src_layouts;
  }
  Progress(absl::StrCat(r.layouts, " layouts in ", r.layouts_cpu_s, " s CPU, RSS ",
                        r.rss_after_layouts / 1e9, " GB"));

  WorkerSide(tensors, w, &r);
  if (absl::GetFlag(FLAGS_prepared)) {
    r.prepared = true;
    PreparedTransfer(tensors, w, &r);
  }
  r.hwm_before_unprepared = ProcStatusBytes("VmHWM");
  if (absl::GetFlag(FLAGS_unprepared)) Unprepared(tensors, w, &r);
  r.rss_bytes = ProcStatusBytes("VmHWM");
  if (absl::GetFlag(FLAGS_json)) {
    PrintJson(r);
  } else {
    PrintText(r);
  }
  return 0;
}

}  // namespace
}  // namespace shardcoord

int main(int argc, char** argv) {
  return shardcoord::bench::Main(argc, argv, "scale_bench", shardcoord::Main,
                                 /*as_coordinator=*/true);
}
