// Model-scale benchmark (issue 10): the state dict of a Llama-style decoder (bench/llama_state.h:
// 16 layers, hidden 1024, bf16, 147 tensors, 0.54 GB) moved from FSDP flat shards on a 4-rank
// mesh to Megatron tensor-parallel shards on a 2x2 (dp, tp) mesh over the same four CPU (Gloo)
// workers, against raw Gloo and torch.distributed, plus the latency of small operations.
//
//   bazel run -c opt //bench:model_bench -- [--json] [--reps 5]
//
// In one run, every throughput kind interleaved per repetition so each shares the machine's
// load with the others:
//   group           one CopyGroup of all 147 tensors, flat source -> pre-created Megatron dsts
//   transfer        the same 147 copies as a prepared transfer (CreateTransfer once, then
//                   warm RunTransfers) into Megatron dsts of its own
//   per_tensor      the same 147 copies as 147 Copy calls, one after another
//   gloo_floor      raw Gloo alltoallv (//bench:gloo_alltoall, 4 processes) of exactly the
//                   per-pair byte matrix of the group's plans' transfers
//   group_attached  the same group between tensors whose every buffer four user processes
//                   (this binary, --attach_child_rank) lend in shared memory (memfds)
//   group_budget    the same group on a second cluster whose workers run with --memory-budget
//                   = their committed bytes + --budget_slack_mib (skipped, saying so, when the
//                   worker binary has no --memory-budget)
//   group_fp8       the same group into FP8 inference weights (issue 28): every 2-d tensor
//                   quantized to f8_e4m3 with 128x128 block scales (f32 `<name>_scale_inv`,
//                   replicated), the 1-d norms copied as bf16, one transaction; its bytes moved
//                   against group's (the narrowing is done before sending) and its time
// then, after the clusters stop, torch: bench/torch_fsdp_reshard.py (all-gather the flat
// shards with torch.distributed Gloo, each rank copies out its Megatron shards).
// Latency: p50/p99 of a 4 KiB redistribute and of a bare unary RPC (GetMesh), in blocks of 20
// that take turns, and of a RedistributeGroup of --group_tensors 4 KiB tensors; a warm
// prepared transfer of as many 4 KiB tensors against one 4 KiB Copy.
// Every destination value is checked once after the timed repetitions (downloads against the
// fill formula; attached ones inside the user processes' own memory).

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "bench/bench_common.h"
#include "bench/llama_state.h"
#include "client/coordinator_client.h"
#include "client/local_attach_client.h"
#include "common/json_writer.h"
#include "google/protobuf/descriptor.h"
#include "google/protobuf/message.h"
#include "proto/convert.h"
#include "sharding/block_quant.h"
#include "sharding/fill.h"
#include "tests/cluster.h"
#include "tests/process.h"
#include "tests/tensor_check.h"

ABSL_FLAG(int64_t, relay_max_bytes, 64 << 10,
          "The coordinator's --relay-max-bytes (its default: small plans are relayed by the "
          "coordinator); 0 runs every plan on the workers.");
ABSL_FLAG(bool, json, false, "Print one JSON object with every number instead of text.");
ABSL_FLAG(int, reps, 5, "Timed repetitions of each throughput kind (after one warm-up).");
ABSL_FLAG(int, layers, 16, "Decoder layers of the model.");
ABSL_FLAG(int64_t, hidden, 1024, "Hidden size.");
ABSL_FLAG(int64_t, intermediate, 2816, "MLP intermediate size.");
ABSL_FLAG(int64_t, vocab, 32000, "Vocabulary size.");
ABSL_FLAG(bool, per_tensor, true, "Time the per-tensor copies.");
ABSL_FLAG(bool, attached, true, "Time the group between attached tensors (user processes).");
ABSL_FLAG(bool, transfer, true,
          "Time a prepared transfer of the group's copies (warm runs) and of the small group's "
          "4 KiB tensors.");
ABSL_FLAG(bool, fp8, true,
          "Time the group into FP8 block-quantized (block:128x128) destinations (group_fp8).");
ABSL_FLAG(bool, budget, true, "Time the group under --memory-budget when workers support it.");
ABSL_FLAG(int64_t, budget_slack_mib, 64, "Budget above each worker's committed bytes.");
ABSL_FLAG(bool, torch, true, "Run the torch.distributed peer when available.");
ABSL_FLAG(std::string, python, "/usr/bin/python3", "Python with torch for the torch peer.");
ABSL_FLAG(int, latency_runs, 200, "4 KiB redistributes (and as many bare RPCs).");
ABSL_FLAG(int, group_tensors, 1000, "Tensors of 4 KiB in the small-tensor group.");
ABSL_FLAG(int, group_reps, 10, "Repetitions of the small-tensor group.");
ABSL_FLAG(std::string, state, "sqlite",
          "The coordinator's state: sqlite (--state-dir in a temporary directory, durable "
          "commits as deployed) or memory.");
ABSL_FLAG(bool, check_values, true, "Check every destination value after the timed reps.");
ABSL_FLAG(std::string, log_dir, "",
          "Keep the daemons' logs here; default: a temporary directory, removed.");
// A user process lending one rank's buffers of the attached model: started by the bench.
ABSL_FLAG(int64_t, attach_child_rank, -1, "(internal) Run as the user process of this rank.");
ABSL_FLAG(std::string, attach_child_coordinator, "", "(internal) The coordinator's address.");
ABSL_FLAG(std::string, attach_child_socket, "", "(internal) The rank's worker's local socket.");

namespace shardcoord {
namespace {

using bench::Die;
using bench::GBps;
using bench::OrDie;
using bench::PeerResult;
using bench::Stats;

constexpr int kWorkers = 4;
constexpr char kFlatMesh[] = "fsdp";     // 1-d, the four workers.
constexpr char kTpMesh[] = "megatron";   // 2 x 2 (dp, tp), the same four.
constexpr char kSrc[] = "fsdp/";         // Flat sources (worker-owned).
constexpr char kDst[] = "tp/";           // The group's Megatron destinations.
constexpr char kPerTensorDst[] = "pt/";  // The per-tensor copies' destinations.
constexpr char kTransferDst[] = "xtp/";  // The prepared transfer's Megatron destinations.
constexpr char kFp8Dst[] = "fp8/";       // group_fp8's destinations and scales.
constexpr BlockSize kFp8Block{128, 128};
constexpr char kAttachedSrc[] = "afsdp/";
constexpr char kAttachedDst[] = "atp/";
constexpr absl::Duration kChildTimeout = absl::Minutes(10);

struct Workload {
  LlamaConfig config;
  std::vector<LlamaParam> params;
  int64_t total = 0;
  std::vector<std::string> flat_text;  // Per parameter: its FSDP flat spec.
  int64_t bytes() const { return total * ElementSize(config.dtype); }
};

Workload MakeWorkload() {
  Workload w;
  w.config.layers = absl::GetFlag(FLAGS_layers);
  w.config.hidden = absl::GetFlag(FLAGS_hidden);
  w.config.intermediate = absl::GetFlag(FLAGS_intermediate);
  w.config.vocab = absl::GetFlag(FLAGS_vocab);
  w.params = LlamaStateDict(w.config);
  w.total = TotalElements(w.params);
  for (const LlamaParam& p : w.params) {
    w.flat_text.push_back(FlatSpecToString(FsdpFlatSpec(p, w.total, kWorkers)));
  }
  return w;
}

// Every tensor gets values of its own (RANDOM with this seed), so a swapped pair is caught.
uint64_t SeedOf(size_t i) { return 1 + i; }

std::string Name(const char* prefix, const LlamaParam& p) { return prefix + p.name; }

v1::CreateTensorRequest CreateRequest(const std::string& name, const Shape& shape, DType dtype,
                                      const std::string& mesh, const std::string& spec, bool flat,
                                      v1::InitKind init, uint64_t seed) {
  v1::CreateTensorRequest r;
  r.set_name(name);
  for (int64_t d : shape) r.add_shape(d);
  r.set_dtype(DTypeToProto(dtype));
  *r.mutable_spec() = SpecFromText(mesh, spec, flat);
  r.set_init(init);
  r.set_seed(seed);
  return r;
}

// Flat sources under `src` (RANDOM, or ATTACHED) and Megatron destinations under each of
// `dsts` (zeros, or ATTACHED).
void CreateModel(CoordinatorClient& c, const Workload& w, const char* src,
                 const std::vector<const char*>& dsts, bool attached) {
  for (size_t i = 0; i < w.params.size(); ++i) {
    const LlamaParam& p = w.params[i];
    OrDie(c.CreateTensor(CreateRequest(Name(src, p), p.shape, w.config.dtype, kFlatMesh,
                                       w.flat_text[i], true, attached ? v1::ATTACHED : v1::RANDOM,
                                       SeedOf(i))),
          "create " + Name(src, p));
    for (const char* dst : dsts) {
      OrDie(c.CreateTensor(CreateRequest(Name(dst, p), p.shape, w.config.dtype, kTpMesh, p.megatron,
                                         false, attached ? v1::ATTACHED : v1::ZEROS, 0)),
            "create " + Name(dst, p));
    }
  }
}

// group_fp8's destinations: 2-d tensors f8_e4m3 in their Megatron layout with replicated f32
// block scales ("<name>_scale_inv"), 1-d ones in the model's dtype.
bool Quantized(const LlamaParam& p) { return p.shape.size() >= 2; }
std::string ScaleName(const LlamaParam& p) { return Name(kFp8Dst, p) + "_scale_inv"; }

void CreateFp8Model(CoordinatorClient& c, const Workload& w) {
  for (const LlamaParam& p : w.params) {
    const DType dtype = Quantized(p) ? DType::kF8E4M3 : w.config.dtype;
    OrDie(c.CreateTensor(CreateRequest(Name(kFp8Dst, p), p.shape, dtype, kTpMesh, p.megatron, false,
                                       v1::ZEROS, 0)),
          "create " + Name(kFp8Dst, p));
    if (!Quantized(p)) continue;
    const Shape scales = OrDie(BlockScaleShape(p.shape, kFp8Block), "scale shape");
    OrDie(c.CreateTensor(CreateRequest(ScaleName(p), scales, DType::kF32, kTpMesh, "R,R", false,
                                       v1::ZEROS, 0)),
          "create " + ScaleName(p));
  }
}

v1::CopyGroupRequest Fp8GroupRequest(const Workload& w) {
  v1::CopyGroupRequest r;
  for (const LlamaParam& p : w.params) {
    v1::CopyPair* pair = r.add_copies();
    pair->set_src(Name(kSrc, p));
    pair->set_dst(Name(kFp8Dst, p));
    if (Quantized(p)) {
      pair->set_quantize(BlockQuantizationText(kFp8Block));
      pair->set_scale(ScaleName(p));
    }
  }
  r.set_wait(true);
  return r;
}

// The FP8 destinations against the sources' fill quantized here (sharding/block_quant.h).
absl::Status CheckFp8Model(CoordinatorClient& c, const Workload& w, int64_t* checked) {
  for (size_t i = 0; i < w.params.size(); ++i) {
    const LlamaParam& p = w.params[i];
    if (!Quantized(p)) {
      absl::Status s = DownloadAndCheck(c, Name(kFp8Dst, p), w.config.dtype, p.shape,
                                        FillKind::kRandom, SeedOf(i));
      if (!s.ok()) return s;
      ++*checked;
      continue;
    }
    const Box whole = Box::Whole(p.shape);
    const int64_t n = whole.Volume();
    std::string src(static_cast<size_t>(n * ElementSize(w.config.dtype)), '\0');
    if (absl::Status s =
            FillBox(FillKind::kRandom, SeedOf(i), p.shape, whole, w.config.dtype, src.data());
        !s.ok()) {
      return s;
    }
    const Shape scale_shape = OrDie(BlockScaleShape(p.shape, kFp8Block), "scale shape");
    std::string want_q(static_cast<size_t>(n), '\0');
    std::vector<float> want_s(static_cast<size_t>(Box::Whole(scale_shape).Volume()));
    if (absl::Status s = QuantizeBlocks(src.data(), w.config.dtype, p.shape, kFp8Block,
                                        want_q.data(), want_s.data());
        !s.ok()) {
      return s;
    }
    std::string got_q, got_s;
    if (auto h = c.Download(Name(kFp8Dst, p), &got_q); !h.ok()) return h.status();
    if (auto h = c.Download(ScaleName(p), &got_s); !h.ok()) return h.status();
    if (got_q != want_q) return absl::DataLossError(Name(kFp8Dst, p) + ": values differ");
    if (got_s.size() != want_s.size() * sizeof(float) ||
        std::memcmp(got_s.data(), want_s.data(), got_s.size()) != 0) {
      return absl::DataLossError(ScaleName(p) + ": scales differ");
    }
    *checked += 2;
  }
  return absl::OkStatus();
}

v1::CopyGroupRequest GroupRequest(const Workload& w, const char* src, const char* dst) {
  v1::CopyGroupRequest r;
  for (const LlamaParam& p : w.params) {
    v1::CopyPair* pair = r.add_copies();
    pair->set_src(Name(src, p));
    pair->set_dst(Name(dst, p));
  }
  r.set_wait(true);
  return r;
}

std::pair<double, v1::CopyGroupResponse> TimeGroup(CoordinatorClient& c,
                                                   const v1::CopyGroupRequest& request,
                                                   const std::string& what) {
  const absl::Time start = absl::Now();
  v1::CopyGroupResponse r = OrDie(c.CopyGroup(request), what);
  const double seconds = absl::ToDoubleSeconds(absl::Now() - start);
  if (r.state() != v1::COMMITTED) {
    Die(absl::StrCat(what, " ended ", v1::PlanState_Name(r.state())));
  }
  return {seconds, std::move(r)};
}

double TimePerTensor(CoordinatorClient& c, const Workload& w, const char* src, const char* dst) {
  const absl::Time start = absl::Now();
  for (const LlamaParam& p : w.params) {
    v1::CopyRequest r;
    r.set_src(Name(src, p));
    r.set_dst(Name(dst, p));
    r.set_wait(true);
    v1::CopyResponse done = OrDie(c.Copy(r), "copy " + p.name);
    if (done.progress().state() != v1::COMMITTED) {
      Die(absl::StrCat("copy ", p.name, " ended ", v1::PlanState_Name(done.progress().state()),
                       ": ", done.progress().error()));
    }
  }
  return absl::ToDoubleSeconds(absl::Now() - start);
}

v1::CreateTransferRequest TransferRequest(const std::string& name,
                                          const v1::CopyGroupRequest& group) {
  v1::CreateTransferRequest r;
  r.set_name(name);
  *r.mutable_copies() = group.copies();
  return r;
}

// One run of a prepared transfer, waited for; its seconds as the client saw them, or why it
// did not commit (reported, the bench goes on without the transfer's later runs).
absl::StatusOr<std::pair<double, v1::RunTransferResponse>> TimeTransfer(CoordinatorClient& c,
                                                                        const std::string& name,
                                                                        const std::string& what) {
  v1::RunTransferRequest r;
  r.set_name(name);
  r.set_wait(true);
  const absl::Time start = absl::Now();
  absl::StatusOr<v1::RunTransferResponse> done = c.RunTransfer(r);
  const double seconds = absl::ToDoubleSeconds(absl::Now() - start);
  if (!done.ok())
    return absl::Status(done.status().code(), absl::StrCat(what, ": ", done.status().message()));
  if (done->state() != v1::COMMITTED) {
    return absl::AbortedError(absl::StrCat(what, " ended ", v1::PlanState_Name(done->state())));
  }
  return std::make_pair(seconds, *std::move(done));
}

// Bytes each rank holds of the tensors named by `prefixes` (their layouts' local elements).
std::vector<int64_t> HeldBytes(CoordinatorClient& c, const Workload& w,
                               const std::vector<const char*>& prefixes,
                               const std::vector<int64_t>& ranks) {
  std::vector<int64_t> held(ranks.size(), 0);
  for (const char* prefix : prefixes) {
    for (const LlamaParam& p : w.params) {
      const v1::TensorInfo t = OrDie(c.GetTensor(Name(prefix, p)), "get " + Name(prefix, p));
      for (const v1::RankChunks& rc : t.layout().ranks()) {
        for (size_t i = 0; i < ranks.size(); ++i) {
          if (ranks[i] == rc.rank()) held[i] += rc.local_elements() * ElementSize(w.config.dtype);
        }
      }
    }
  }
  return held;
}

// ---- The user processes of group_attached.

// The child: lends rank `rank`'s buffers of every attached source and destination from two
// memfds (its flat shard, then its Megatron shards, each back to back as a framework holds
// them), fills the sources with the values the worker-owned sources have, says "attached",
// and then, at each SIGUSR1, checks every destination in its own memory and says "checked".
int RunAttachChild() {
  sigset_t usr1;
  sigemptyset(&usr1);
  sigaddset(&usr1, SIGUSR1);
  sigprocmask(SIG_BLOCK, &usr1, nullptr);  // Before the parent can signal: taken by sigwait.

  const int64_t rank = absl::GetFlag(FLAGS_attach_child_rank);
  const Workload w = MakeWorkload();
  const int64_t esize = ElementSize(w.config.dtype);
  CoordinatorClient c(absl::GetFlag(FLAGS_attach_child_coordinator));
  std::unique_ptr<LocalAttachClient> local =
      OrDie(LocalAttachClient::Connect(absl::GetFlag(FLAGS_attach_child_socket)), "local socket");

  struct Lent {
    v1::TensorInfo info;
    const v1::RankChunks* chunks = nullptr;  // Into info; null when the rank holds none.
    int64_t offset = 0;
  };
  struct Arena {
    std::vector<Lent> lent;  // One per parameter.
    std::unique_ptr<SharedMemory> memory;
  };
  auto open_arena = [&](const char* prefix) {
    Arena a;
    int64_t bytes = 0;
    for (const LlamaParam& p : w.params) {
      Lent l;
      l.info = OrDie(c.GetTensor(Name(prefix, p)), "get " + Name(prefix, p));
      a.lent.push_back(std::move(l));
    }
    for (Lent& l : a.lent) {
      for (const v1::RankChunks& rc : l.info.layout().ranks()) {
        if (rc.rank() == rank) l.chunks = &rc;
      }
      l.offset = bytes;
      if (l.chunks != nullptr) bytes += l.chunks->local_elements() * esize;
    }
    a.memory = OrDie(SharedMemory::Create(std::max<int64_t>(bytes, 1), prefix), "memfd");
    return a;
  };
  Arena src = open_arena(kAttachedSrc);
  Arena dst = open_arena(kAttachedDst);

  // The values of rank's chunks of parameter i, at their local offsets.
  auto expected = [&](size_t i, const Lent& l, char* out) {
    for (int k = 0; k < l.chunks->chunks_size(); ++k) {
      const Chunk chunk = OrDie(ChunkFromProto(l.chunks->chunks(k), "chunk"), "chunk");
      absl::Status s = FillBox(FillKind::kRandom, SeedOf(i), w.params[i].shape, chunk.box,
                               w.config.dtype, out + chunk.local_offset * esize);
      if (!s.ok()) Die(s.ToString());
    }
  };
  for (size_t i = 0; i < w.params.size(); ++i) {
    if (src.lent[i].chunks != nullptr) {
      expected(i, src.lent[i], src.memory->data() + src.lent[i].offset);
    }
  }
  int attached = 0;
  for (Arena* a : {&src, &dst}) {
    for (const Lent& l : a->lent) {
      if (l.chunks == nullptr) continue;
      OrDie(local->AttachShared(l.info, rank, *a->memory, l.offset),
            absl::StrCat("attach rank ", rank, " of ", l.info.name()));
      ++attached;
    }
  }
  std::printf("attached %d buffers of rank %lld huge_pages %d\n", attached,
              static_cast<long long>(rank),
              src.memory->huge_pages() && dst.memory->huge_pages() ? 1 : 0);
  std::fflush(stdout);

  for (;;) {
    int sig = 0;
    sigwait(&usr1, &sig);
    int64_t checked = 0, wrong = 0;
    std::string first_wrong = "-";
    std::string want;
    for (size_t i = 0; i < w.params.size(); ++i) {
      const Lent& l = dst.lent[i];
      if (l.chunks == nullptr) continue;
      want.assign(static_cast<size_t>(l.chunks->local_elements() * esize), '\0');
      expected(i, l, want.data());
      ++checked;
      if (std::memcmp(want.data(), dst.memory->data() + l.offset, want.size()) != 0) {
        if (wrong++ == 0) first_wrong = l.info.name();
      }
    }
    std::printf("checked %lld wrong %lld first %s\n", static_cast<long long>(checked),
                static_cast<long long>(wrong), first_wrong.c_str());
    std::fflush(stdout);
  }
}

class AttachedUsers {
 public:
  AttachedUsers(const Cluster& cluster, const Workload& w) {
    char self[4096];
    const ssize_t n = readlink("/proc/self/exe", self, sizeof(self) - 1);
    if (n <= 0) Die("readlink /proc/self/exe");
    self[n] = '\0';
    for (int i = 0; i < cluster.num_workers(); ++i) {
      const v1::WorkerInfo& info = cluster.worker_info(i);
      ProcessOptions options;
      options.name = absl::StrCat("user", info.rank());
      options.echo_stdout = false;
      children_.push_back(
          OrDie(Process::Start(
                    {self, absl::StrCat("--attach_child_rank=", info.rank()),
                     absl::StrCat("--attach_child_coordinator=", cluster.coordinator_address()),
                     absl::StrCat("--attach_child_socket=", info.local_socket()),
                     absl::StrCat("--layers=", w.config.layers),
                     absl::StrCat("--hidden=", w.config.hidden),
                     absl::StrCat("--intermediate=", w.config.intermediate),
                     absl::StrCat("--vocab=", w.config.vocab)},
                    options),
                "start " + options.name));
    }
    for (auto& child : children_) {
      const std::string line = OrDie(child->WaitForLine("attached", kChildTimeout), child->name());
      huge_pages_ = huge_pages_ && absl::EndsWith(line, "huge_pages 1");
    }
  }

  // Whether every lent buffer is in huge pages (hugetlbfs memfds: the host reserved them).
  bool huge_pages() const { return huge_pages_; }

  // Every destination value, in the user processes' memory; dies on a mismatch. Once.
  int64_t Check() {
    int64_t checked = 0;
    for (auto& child : children_) {
      if (!child->Signal(SIGUSR1).ok()) Die(child->name() + " is gone");
    }
    for (auto& child : children_) {
      const std::string line = OrDie(child->WaitForLine("checked ", kChildTimeout), child->name());
      std::vector<std::string> f = absl::StrSplit(line, ' ');
      int64_t n = 0, wrong = 0;
      if (f.size() != 6 || !absl::SimpleAtoi(f[1], &n) || !absl::SimpleAtoi(f[3], &wrong)) {
        Die(absl::StrCat(child->name(), " said '", line, "'"));
      }
      if (wrong != 0) {
        Die(absl::StrCat(child->name(), ": ", wrong, " of ", n,
                         " attached destinations hold wrong values, the first ", f[5]));
      }
      checked += n;
    }
    return checked;
  }

 private:
  std::vector<std::unique_ptr<Process>> children_;
  bool huge_pages_ = true;
};

// ---- group_budget: whether the worker binary has --memory-budget, and what workers report.

bool WorkerHasMemoryBudget() {
  const std::string worker = OrDie(RunfilePath("worker/worker"), "worker binary");
  ProcessOptions options;
  options.name = "worker --help";
  options.echo_stdout = false;
  std::unique_ptr<Process> p = OrDie(Process::Start({worker, "--help"}, options), "worker --help");
  OrDie(p->Wait(absl::Seconds(30)), "worker --help");
  for (const std::string& line : p->Lines()) {
    if (line.find("--memory-budget") != std::string::npos) return true;
  }
  return false;
}

// What a budget worker reports about its memory (WorkerInfo).
struct WorkerMemory {
  std::string name;
  int64_t budget = 0, used = 0, peak = 0;
  bool within() const { return peak <= budget; }
};
WorkerMemory MemoryOf(const v1::WorkerInfo& info) {
  return WorkerMemory{info.name(), info.memory_budget_bytes(), info.memory_used_bytes(),
                      info.memory_peak_bytes()};
}

std::vector<pid_t> WorkerPids(const Cluster& cluster) {
  std::vector<pid_t> pids;
  for (int i = 0; i < cluster.num_workers(); ++i) pids.push_back(cluster.worker_pid(i));
  return pids;
}

// ---- The run.

struct Kind {
  std::string name;
  bool ran = false;
  std::string skipped;
  Stats stats;
  Stats worker_cpu;  // The workers' CPU seconds per repetition (shardcoord kinds).
};

void WriteKind(JsonWriter& w, const Kind& k, int64_t bytes) {
  w.Key(k.name).BeginObject();
  if (!k.ran) {
    w.Key("skipped").String(k.skipped);
    w.EndObject();
    return;
  }
  w.Key("best_seconds").Double(k.stats.Best()).Key("median_seconds").Double(k.stats.Median());
  w.Key("best_gbps").Double(GBps(bytes, k.stats.Best()));
  w.Key("seconds").BeginArray();
  for (double s : k.stats.seconds) w.Double(s);
  w.EndArray();
  if (!k.worker_cpu.seconds.empty()) {
    w.Key("worker_cpu_median_seconds").Double(k.worker_cpu.Median());
  }
  w.EndObject();
}

// "<name>_p50_ms" and "<name>_p99_ms" of `s`.
void WritePercentilesMs(JsonWriter& w, const std::string& name, const Stats& s) {
  w.Key(name + "_p50_ms").Double(s.Percentile(50) * 1e3);
  w.Key(name + "_p99_ms").Double(s.Percentile(99) * 1e3);
}

// "<key>": {each phase's name: its median in ms}.
void WritePhasesMs(JsonWriter& w, const std::string& key, const std::vector<bench::Phase>& phases) {
  w.Key(key).BeginObject();
  for (const bench::Phase& ph : phases) w.Key(ph.name).Double(ph.stats.Median() * 1e3);
  w.EndObject();
}

// Throughput of `a` relative to `b`, best vs best (b's time / a's time); 0 if either is missing.
double Ratio(const Kind& a, const Kind& b) {
  return a.ran && b.ran ? b.stats.Best() / a.stats.Best() : 0;
}

int Run() {
  // A child that group_attached started (--attach_child_rank) plays its user process.
  if (absl::GetFlag(FLAGS_attach_child_rank) >= 0) return RunAttachChild();
  const bool json = absl::GetFlag(FLAGS_json);
  const int reps = std::max(1, absl::GetFlag(FLAGS_reps));
  auto say = [&](const std::string& s) {
    if (!json) std::fprintf(stderr, "%s\n", s.c_str());
  };
  const Workload w = MakeWorkload();
  say(absl::StrCat("model: ", w.params.size(), " tensors, ", w.total, " elements, ", w.bytes(),
                   " bytes (", DTypeName(w.config.dtype), ")"));

  const std::string tmp = bench::ScratchDir("model_bench");
  const std::string log_dir = bench::LogDir(absl::GetFlag(FLAGS_log_dir), tmp);
  // Socket paths are short (107 bytes at most): a directory of their own under /tmp.
  char sockets[] = "/tmp/sc-model-XXXXXX";
  if (mkdtemp(sockets) == nullptr) Die("mkdtemp");

  Kind group{"group"}, per_tensor{"per_tensor"}, gloo{"gloo_floor"}, attached{"group_attached"},
      budget{"group_budget"}, torch{"torch"}, transfer{"transfer"}, fp8{"group_fp8"};
  const bool run_fp8 = absl::GetFlag(FLAGS_fp8);
  if (!run_fp8) fp8.skipped = "--nofp8";
  const bool run_budget = absl::GetFlag(FLAGS_budget) && WorkerHasMemoryBudget();
  if (!absl::GetFlag(FLAGS_budget)) {
    budget.skipped = "--nobudget";
  } else if (!run_budget) {
    budget.skipped = "the worker binary has no --memory-budget flag (worker --help) yet";
  }
  if (!absl::GetFlag(FLAGS_per_tensor)) per_tensor.skipped = "--noper_tensor";
  if (!absl::GetFlag(FLAGS_attached)) attached.skipped = "--noattached";
  const bool run_transfer = absl::GetFlag(FLAGS_transfer);
  if (!run_transfer) transfer.skipped = "--notransfer";

  ClusterOptions options;
  options.num_workers = kWorkers;
  options.echo_stdout = false;
  options.log_dir = log_dir;
  options.worker_flags = {absl::StrCat("--local-socket=", sockets, "/{name}.sock")};
  options.relay_max_bytes = absl::GetFlag(FLAGS_relay_max_bytes);
  const std::string state = absl::GetFlag(FLAGS_state);
  if (state == "sqlite") {
    options.state_dir = tmp + "/state";
  } else if (state != "memory") {
    Die(absl::StrCat("--state ", state, ": want sqlite or memory"));
  }
  say(absl::StrCat("starting a coordinator and ", kWorkers, " workers (logs in ", log_dir, ")"));
  std::unique_ptr<Cluster> cluster = OrDie(Cluster::Start(options), "cluster");
  CoordinatorClient& client = cluster->client();
  const v1::MeshInfo flat_mesh =
      OrDie(MakeMesh(client, kFlatMesh, {kWorkers}, cluster->WorkerNames()), "flat mesh");
  OrDie(MakeMesh(client, kTpMesh, MegatronMeshShape(), cluster->WorkerNames(), MegatronMeshDims()),
        "megatron mesh");
  const std::vector<int64_t> ranks(flat_mesh.ranks().begin(), flat_mesh.ranks().end());

  say("creating the model: flat sources, Megatron destinations");
  std::vector<const char*> dsts = {kDst};
  if (absl::GetFlag(FLAGS_per_tensor)) dsts.push_back(kPerTensorDst);
  if (run_transfer) dsts.push_back(kTransferDst);
  CreateModel(client, w, kSrc, dsts, /*attached=*/false);
  if (run_fp8) CreateFp8Model(client, w);
  const std::vector<int64_t> committed = HeldBytes(client, w, {kSrc, kDst}, ranks);

  std::unique_ptr<AttachedUsers> users;
  bool attached_huge_pages = false;
  if (absl::GetFlag(FLAGS_attached)) {
    say("creating the attached model and four user processes lending its buffers");
    CreateModel(client, w, kAttachedSrc, {kAttachedDst}, /*attached=*/true);
    users = std::make_unique<AttachedUsers>(*cluster, w);
    attached_huge_pages = users->huge_pages();
  }

  // The budget cluster: every worker's budget is the most any rank holds while the group runs
  // (its committed buffers and the group's new destination buffers) + the slack, so the
  // buckets and everything else must fit in the slack.
  std::unique_ptr<Cluster> budget_cluster;
  int64_t budget_bytes = 0;
  if (run_budget) {
    const std::vector<int64_t> new_buffers = HeldBytes(client, w, {kDst}, ranks);
    for (size_t r = 0; r < committed.size(); ++r) {
      budget_bytes = std::max(budget_bytes, committed[r] + new_buffers[r]);
    }
    budget_bytes += absl::GetFlag(FLAGS_budget_slack_mib) * (int64_t{1} << 20);
    ClusterOptions b = options;
    b.worker_flags = {"--local-socket=off", absl::StrCat("--memory-budget=", budget_bytes)};
    b.log_dir = absl::StrCat(log_dir, "/budget");
    if (!b.state_dir.empty()) b.state_dir = tmp + "/budget_state";
    std::filesystem::create_directories(b.log_dir);
    say(absl::StrCat("starting a second cluster with --memory-budget=", budget_bytes));
    budget_cluster = OrDie(Cluster::Start(b), "budget cluster");
    OrDie(MakeMesh(budget_cluster->client(), kFlatMesh, {kWorkers}, budget_cluster->WorkerNames()),
          "budget flat mesh");
    OrDie(MakeMesh(budget_cluster->client(), kTpMesh, MegatronMeshShape(),
                   budget_cluster->WorkerNames(), MegatronMeshDims()),
          "budget megatron mesh");
    CreateModel(budget_cluster->client(), w, kSrc, {kDst}, /*attached=*/false);
  }

  // Warm-up (communicators are built once), and the plans whose transfers gloo_floor moves.
  const v1::CopyGroupRequest group_request = GroupRequest(w, kSrc, kDst);
  say("warm-up group");
  auto [first_seconds, first] = TimeGroup(client, group_request, "warm-up group");
  std::vector<int64_t> matrix(kWorkers * kWorkers, 0);
  // The group runs as one fused plan: its trace has what each worker sent to each other.
  const v1::PlanTrace group_trace = OrDie(client.GetPlanTrace(first.group_id()), "group trace");
  if (absl::Status s = bench::AddGroupTraffic(group_trace, ranks, &matrix); !s.ok()) {
    Die(s.ToString());
  }
  int64_t matrix_total = 0;
  for (int i = 0; i < kWorkers; ++i) {
    for (int j = 0; j < kWorkers; ++j) {
      if (i != j) matrix_total += matrix[i * kWorkers + j];
    }
  }
  const int64_t moved = first.bytes_moved();
  if (matrix_total != moved) {
    Die(absl::StrCat("the group's exchange moved ", matrix_total, " bytes, bytes_moved says ",
                     moved));
  }
  const v1::CopyGroupRequest attached_request = GroupRequest(w, kAttachedSrc, kAttachedDst);
  if (users) TimeGroup(client, attached_request, "warm-up attached group");
  // The prepared transfer: the group's copies into dsts of its own (a group writing a
  // transfer's dsts would not invalidate it, but the two would share their values); created
  // (prepared) once, then one warm-up run.
  int64_t transfer_replanned = 0;
  double transfer_prepare_seconds = 0;
  std::string transfer_error, small_transfer_error;  // Runs that failed: reported.
  if (run_transfer) {
    say("creating the prepared transfer");
    const absl::Time start = absl::Now();
    const v1::TransferInfo info =
        OrDie(client.CreateTransfer(TransferRequest("model", GroupRequest(w, kSrc, kTransferDst))),
              "create transfer");
    transfer_prepare_seconds = absl::ToDoubleSeconds(absl::Now() - start);
    if (info.bytes_moved() != moved) {
      Die(absl::StrCat("the transfer moves ", info.bytes_moved(), " bytes, the group ", moved));
    }
    if (auto warm = TimeTransfer(client, "model", "warm-up transfer"); !warm.ok()) {
      transfer_error = warm.status().ToString();
    }
  }
  if (budget_cluster) TimeGroup(budget_cluster->client(), group_request, "warm-up budget group");
  const v1::CopyGroupRequest fp8_request = Fp8GroupRequest(w);
  int64_t fp8_moved = 0, fp8_staged = 0;
  if (run_fp8) {
    say("warm-up fp8 group");
    v1::CopyGroupResponse r = TimeGroup(client, fp8_request, "warm-up fp8 group").second;
    fp8_moved = r.bytes_moved();
    fp8_staged = r.staged_bytes();
  }

  std::vector<double> paired_gloo, paired_attached;  // Per rep: other's seconds / group's.
  const std::vector<pid_t> pids = WorkerPids(*cluster);
  for (int i = 0; i < reps; ++i) {
    double cpu = bench::ProcessCpuSeconds(pids);
    auto [seconds, r] = TimeGroup(client, group_request, "group");
    group.worker_cpu.seconds.push_back(bench::ProcessCpuSeconds(pids) - cpu);
    if (r.bytes_moved() != moved) Die("a repetition moved a different byte count");
    group.stats.seconds.push_back(seconds);
    std::string line = absl::StrCat("  rep ", i, ": group ", seconds, " s");
    if (run_fp8) {
      cpu = bench::ProcessCpuSeconds(pids);
      auto [f, fr] = TimeGroup(client, fp8_request, "fp8 group");
      fp8.worker_cpu.seconds.push_back(bench::ProcessCpuSeconds(pids) - cpu);
      if (fr.bytes_moved() != fp8_moved) Die("an fp8 repetition moved a different byte count");
      fp8.stats.seconds.push_back(f);
      absl::StrAppend(&line, ", group_fp8 ", f, " s");
    }
    if (absl::GetFlag(FLAGS_per_tensor)) {
      cpu = bench::ProcessCpuSeconds(pids);
      per_tensor.stats.seconds.push_back(TimePerTensor(client, w, kSrc, kPerTensorDst));
      per_tensor.worker_cpu.seconds.push_back(bench::ProcessCpuSeconds(pids) - cpu);
      absl::StrAppend(&line, ", per_tensor ", per_tensor.stats.seconds.back(), " s");
    }
    PeerResult g = bench::RunGlooAlltoall(matrix, kWorkers, 1, tmp);
    if (g.bytes != moved) Die("gloo moved a different byte count");
    gloo.stats.seconds.push_back(g.stats.seconds[0]);
    paired_gloo.push_back(g.stats.seconds[0] / seconds);
    absl::StrAppend(&line, ", gloo_floor ", g.stats.seconds[0], " s");
    if (run_transfer && transfer_error.empty()) {
      cpu = bench::ProcessCpuSeconds(pids);
      auto timed = TimeTransfer(client, "model", "transfer");
      if (timed.ok()) {
        auto [t, tr] = *std::move(timed);
        transfer.worker_cpu.seconds.push_back(bench::ProcessCpuSeconds(pids) - cpu);
        if (tr.bytes_moved() != moved) Die("a transfer run moved a different byte count");
        transfer_replanned += tr.replanned() ? 1 : 0;
        transfer.stats.seconds.push_back(t);
        absl::StrAppend(&line, ", transfer ", t, " s");
      } else {
        transfer_error = timed.status().ToString();
        absl::StrAppend(&line, ", transfer failed: ", transfer_error);
      }
    }
    if (users) {
      cpu = bench::ProcessCpuSeconds(pids);
      auto [a, ar] = TimeGroup(client, attached_request, "attached group");
      attached.worker_cpu.seconds.push_back(bench::ProcessCpuSeconds(pids) - cpu);
      attached.stats.seconds.push_back(a);
      paired_attached.push_back(seconds / a);
      absl::StrAppend(&line, ", group_attached ", a, " s");
    }
    if (budget_cluster) {
      const std::vector<pid_t> budget_pids = WorkerPids(*budget_cluster);
      cpu = bench::ProcessCpuSeconds(budget_pids);
      auto [b, br] = TimeGroup(budget_cluster->client(), group_request, "budget group");
      budget.worker_cpu.seconds.push_back(bench::ProcessCpuSeconds(budget_pids) - cpu);
      budget.stats.seconds.push_back(b);
      absl::StrAppend(&line, ", group_budget ", b, " s");
    }
    say(line);
  }
  group.ran = gloo.ran = true;
  per_tensor.ran = absl::GetFlag(FLAGS_per_tensor);
  attached.ran = users != nullptr;
  budget.ran = budget_cluster != nullptr;
  transfer.ran = run_transfer && !transfer.stats.seconds.empty();
  fp8.ran = run_fp8;
  if (run_transfer && !transfer.ran) transfer.skipped = transfer_error;

  // What the budget workers report about their memory.
  std::vector<WorkerMemory> budget_memory;
  if (budget_cluster) {
    for (const v1::WorkerInfo& info :
         OrDie(budget_cluster->client().ListWorkers(), "budget workers")) {
      budget_memory.push_back(MemoryOf(info));
    }
  }
  const bool peaks_within_budget = std::all_of(budget_memory.begin(), budget_memory.end(),
                                               [](const WorkerMemory& m) { return m.within(); });

  // ---- Every model destination value, once (before the small-op part, whose 1000
  // concurrent member plans have starved a worker's heartbeats on this machine).
  int64_t checked = 0;
  const bool check = absl::GetFlag(FLAGS_check_values);
  if (check) {
    say("checking every destination value");
    auto check_model = [&](CoordinatorClient& c, const char* prefix) {
      for (size_t i = 0; i < w.params.size(); ++i) {
        const LlamaParam& p = w.params[i];
        absl::Status s = DownloadAndCheck(c, Name(prefix, p), w.config.dtype, p.shape,
                                          FillKind::kRandom, SeedOf(i));
        if (!s.ok()) Die(absl::StrCat(Name(prefix, p), ": ", s.ToString()));
        ++checked;
      }
    };
    check_model(client, kDst);
    if (per_tensor.ran) check_model(client, kPerTensorDst);
    if (transfer.ran && transfer_error.empty()) check_model(client, kTransferDst);
    if (budget_cluster) check_model(budget_cluster->client(), kDst);
    if (fp8.ran) {
      if (absl::Status s = CheckFp8Model(client, w, &checked); !s.ok()) Die(s.ToString());
    }
    if (users) checked += users->Check();
  }
  budget_cluster.reset();

  // ---- Latency (the user processes stay: their detaches would load the coordinator).
  const int latency_runs = std::max(1, absl::GetFlag(FLAGS_latency_runs));
  const int group_tensors = std::max(1, absl::GetFlag(FLAGS_group_tensors));
  const int group_reps = std::max(1, absl::GetFlag(FLAGS_group_reps));
  say(absl::StrCat("timing ", latency_runs, " redistributes of a 4 KiB tensor"));
  OrDie(CreateFilled(client, "small", {32, 32}, DType::kF32, kFlatMesh, "S(0)"), "create small");
  Stats latency, bare_rpc, small_group;
  // CPU seconds of all small groups: the coordinator's, and the four workers' together (a
  // mean per group, as /proc counts in 10 ms ticks). On a small machine CPU, not the wire, is
  // what a group of tiny tensors waits for.
  double group_coordinator_cpu = 0, group_workers_cpu = 0;
  const std::vector<pid_t> worker_pids = WorkerPids(*cluster);
  const std::vector<bench::ClientSpan> spans =
      bench::TimeSmallRedistributes(client, "small", kFlatMesh, latency_runs, &latency, &bare_rpc);
  const std::vector<bench::Phase> phases = bench::LatencyPhases(client, spans);
  say(absl::StrCat("timing ", group_reps, " groups of ", group_tensors, " 4 KiB tensors"));
  for (int i = 0; i < group_tensors; ++i) {
    OrDie(CreateFilled(client, absl::StrCat("small/", i), {32, 32}, DType::kF32, kFlatMesh, "S(0)"),
          "create small group");
  }
  std::string small_group_error;  // A group that failed: reported, the run goes on.
  std::vector<bench::ClientSpan> group_spans;
  for (int rep = 0; rep < group_reps && small_group_error.empty(); ++rep) {
    v1::RedistributeGroupRequest r;
    for (int i = 0; i < group_tensors; ++i) {
      v1::RedistributeItem* item = r.add_redistributes();
      item->set_tensor(absl::StrCat("small/", i));
      *item->mutable_target() = SpecFromText("", rep % 2 == 0 ? "S(1)" : "S(0)");
    }
    r.set_wait(true);
    const double coordinator_cpu = bench::ProcessCpuSeconds({cluster->coordinator_pid()});
    const double workers_cpu = bench::ProcessCpuSeconds(worker_pids);
    const absl::Time start = absl::Now();
    absl::StatusOr<v1::RedistributeGroupResponse> done = client.RedistributeGroup(r);
    if (!done.ok() || done->state() != v1::COMMITTED) {
      small_group_error =
          absl::StrCat("rep ", rep, ": ",
                       done.ok() ? v1::PlanState_Name(done->state()) : done.status().ToString());
      say(absl::StrCat("  the small group failed, ", small_group_error));
      break;
    }
    const absl::Time end = absl::Now();
    small_group.seconds.push_back(absl::ToDoubleSeconds(end - start));
    group_coordinator_cpu +=
        bench::ProcessCpuSeconds({cluster->coordinator_pid()}) - coordinator_cpu;
    group_workers_cpu += bench::ProcessCpuSeconds(worker_pids) - workers_cpu;
    group_spans.push_back({done->group_id(), start, end});
  }
  if (!small_group.seconds.empty()) {
    group_coordinator_cpu /= static_cast<double>(small_group.seconds.size());
    group_workers_cpu /= static_cast<double>(small_group.seconds.size());
  }
  if (small_group.seconds.empty()) small_group.seconds.push_back(0);
  const std::vector<bench::Phase> group_phases = bench::LatencyPhases(client, group_spans);
  if (check && small_group_error.empty()) {
    for (int i = 0; i < group_tensors; ++i) {
      absl::Status s = DownloadAndCheck(client, absl::StrCat("small/", i), DType::kF32, {32, 32},
                                        FillKind::kArange);
      if (!s.ok()) Die(absl::StrCat("small/", i, ": ", s.ToString()));
      ++checked;
    }
  }
  // A prepared transfer of group_tensors 4 KiB tensors (S(0) -> S(1) on the flat mesh),
  // warm, against one 4 KiB copy of the same layouts.
  Stats small_transfer, copy_4k;
  if (run_transfer) {
    say(absl::StrCat("timing ", group_reps, " warm transfers of ", group_tensors,
                     " 4 KiB tensors and ", latency_runs, " 4 KiB copies"));
    v1::CreateTransferRequest r;
    r.set_name("small");
    for (int i = 0; i < group_tensors; ++i) {
      const std::string src = absl::StrCat("tsmall/", i), dst = absl::StrCat("tsmallx/", i);
      OrDie(CreateFilled(client, src, {32, 32}, DType::kF32, kFlatMesh, "S(0)"), "create " + src);
      OrDie(CreateFilled(client, dst, {32, 32}, DType::kF32, kFlatMesh, "S(1)", false, v1::ZEROS),
            "create " + dst);
      v1::CopyPair* pair = r.add_copies();
      pair->set_src(src);
      pair->set_dst(dst);
    }
    OrDie(client.CreateTransfer(r), "create small transfer");
    for (int rep = -1; rep < group_reps && small_transfer_error.empty(); ++rep) {
      auto timed =
          TimeTransfer(client, "small",
                       rep < 0 ? "warm-up small transfer" : absl::StrCat("small transfer ", rep));
      if (!timed.ok()) {
        small_transfer_error = timed.status().ToString();
        say(absl::StrCat("  the small transfer failed: ", small_transfer_error));
        break;
      }
      transfer_replanned += timed->second.replanned() ? 1 : 0;
      if (rep >= 0) small_transfer.seconds.push_back(timed->first);
    }
    OrDie(CreateFilled(client, "small_copy", {32, 32}, DType::kF32, kFlatMesh, "S(1)", false,
                       v1::ZEROS),
          "create small_copy");
    v1::CopyRequest copy;
    copy.set_src("small");
    copy.set_dst("small_copy");
    copy.set_wait(true);
    OrDie(client.Copy(copy), "warm-up copy");
    for (int i = 0; i < latency_runs; ++i) {
      const absl::Time start = absl::Now();
      v1::CopyResponse done = OrDie(client.Copy(copy), "copy small");
      if (done.progress().state() != v1::COMMITTED) Die("a 4 KiB copy did not commit");
      copy_4k.seconds.push_back(absl::ToDoubleSeconds(absl::Now() - start));
    }
    if (check && small_transfer_error.empty()) {
      for (int i = 0; i < group_tensors; ++i) {
        absl::Status s = DownloadAndCheck(client, absl::StrCat("tsmallx/", i), DType::kF32,
                                          {32, 32}, FillKind::kArange);
        if (!s.ok()) Die(absl::StrCat("tsmallx/", i, ": ", s.ToString()));
        ++checked;
      }
    }
  }
  if (small_transfer.seconds.empty()) small_transfer.seconds.push_back(0);
  if (copy_4k.seconds.empty()) copy_4k.seconds.push_back(0);
  users.reset();
  cluster.reset();  // The torch peer runs without the daemons around.

  if (absl::GetFlag(FLAGS_torch)) {
    say("torch.distributed (Gloo): all-gather the flat shards, slice the Megatron shards");
    const std::string workload = tmp + "/workload.txt";
    {
      std::ofstream out(workload);
      for (const LlamaParam& p : w.params) {
        out << p.name << " " << absl::StrJoin(p.shape, "x") << " " << p.megatron << "\n";
      }
    }
    const std::string python = absl::GetFlag(FLAGS_python);
    PeerResult t = bench::RunPythonPeer(
        python, OrDie(RunfilePath("bench/torch_fsdp_reshard.py"), "torch script"),
        {absl::StrCat("--workload=", workload), absl::StrCat("--size=", kWorkers),
         absl::StrCat("--tp=", MegatronMeshShape()[1]), absl::StrCat("--iters=", reps),
         "--warmup=1"},
        absl::StrCat(python, " has no torch (or no Gloo in torch.distributed)"), kChildTimeout);
    torch.ran = t.ran;
    torch.skipped = t.skipped;
    torch.stats = t.stats;
  } else {
    torch.skipped = "--notorch";
  }
  std::filesystem::remove_all(tmp);
  std::filesystem::remove_all(sockets);

  const double lat_p50 = latency.Percentile(50), rpc_p50 = bare_rpc.Percentile(50);
  const double group_p50 = small_group.Percentile(50);
  const double transfer_p50 = small_transfer.Percentile(50), copy_p50 = copy_4k.Percentile(50);
  if (json) {
    JsonWriter j;
    j.BeginObject();
    j.Key("optimized").Bool(bench::kOptimizedBuild);
    j.Key("tensors").Int(static_cast<int64_t>(w.params.size()));
    j.Key("state").String(state);
    j.Key("relay_max_bytes").Int(absl::GetFlag(FLAGS_relay_max_bytes));
    j.Key("model_bytes").Int(w.bytes()).Key("dtype").String(DTypeName(w.config.dtype));
    j.Key("group_kind").String("CopyGroup");
    j.Key("bytes_moved").Int(moved).Key("lower_bound_bytes").Int(first.lower_bound_bytes());
    j.Key("pair_bytes").IntArray(matrix);
    j.Key("reps").Int(reps);
    j.Key("first_group_seconds").Double(first_seconds);
    for (const Kind* k :
         {&group, &transfer, &per_tensor, &gloo, &torch, &attached, &budget, &fp8}) {
      WriteKind(j, *k, moved);
    }
    if (run_transfer) {
      j.Key("transfer_prepare_seconds").Double(transfer_prepare_seconds);
      j.Key("transfer_replanned_runs").Int(transfer_replanned);
      if (!transfer_error.empty()) j.Key("transfer_error").String(transfer_error);
    }
    if (attached.ran) j.Key("attached_huge_pages").Bool(attached_huge_pages);
    if (budget.ran) {
      j.Key("budget_bytes").Int(budget_bytes);
      j.Key("budget_workers").BeginArray();
      for (const WorkerMemory& m : budget_memory) {
        j.BeginObject();
        j.Key("name").String(m.name);
        j.Key("memory_budget_bytes").Int(m.budget);
        j.Key("memory_used_bytes").Int(m.used);
        j.Key("memory_peak_bytes").Int(m.peak);
        j.EndObject();
      }
      j.EndArray();
      j.Key("budget_peaks_within_budget").Bool(peaks_within_budget);
    }
    j.Key("committed_bytes_per_worker").IntArray(committed);
    j.Key("ratios").BeginObject();
    j.Key("group_vs_gloo_floor").Double(Ratio(group, gloo));
    j.Key("group_vs_gloo_floor_paired_median").Double(Stats{paired_gloo}.Median());
    j.Key("group_vs_per_tensor").Double(Ratio(group, per_tensor));
    j.Key("group_vs_torch").Double(Ratio(group, torch));
    j.Key("group_budget_vs_gloo_floor").Double(Ratio(budget, gloo));
    j.Key("transfer_vs_gloo_floor").Double(Ratio(transfer, gloo));
    j.Key("transfer_vs_group").Double(Ratio(transfer, group));
    j.Key("group_attached_vs_group").Double(Ratio(attached, group));
    j.Key("group_fp8_vs_group").Double(Ratio(fp8, group));
    j.Key("group_fp8_bytes_moved").Int(fp8_moved);
    j.Key("group_fp8_staged_bytes").Int(fp8_staged);
    j.Key("group_fp8_bytes_vs_group")
        .Double(moved > 0 ? static_cast<double>(fp8_moved) / moved : 0);
    if (attached.ran) {
      j.Key("group_attached_vs_group_worker_cpu")
          .Double(group.worker_cpu.Median() / attached.worker_cpu.Median());
    }
    if (attached.ran) {
      j.Key("group_attached_vs_group_paired_median").Double(Stats{paired_attached}.Median());
    }
    j.Key("latency_4k_p50_vs_bare_rpc_p50").Double(lat_p50 / rpc_p50);
    j.Key("group_small_p50_vs_4k_p50").Double(group_p50 / lat_p50);
    if (run_transfer) {
      j.Key("transfer_1000_p50_vs_copy_4k_p50").Double(transfer_p50 / copy_p50);
    }
    j.EndObject();
    j.Key("latency").BeginObject();
    j.Key("runs").Int(latency_runs);
    WritePercentilesMs(j, "redistribute_4k", latency);
    WritePercentilesMs(j, "bare_rpc", bare_rpc);
    WritePhasesMs(j, "redistribute_4k_phases_median_ms", phases);
    j.Key("group_tensors").Int(group_tensors).Key("group_reps").Int(group_reps);
    j.Key("group_p50_ms").Double(group_p50 * 1e3);
    if (!small_group_error.empty()) j.Key("group_error").String(small_group_error);
    j.Key("group_p99_ms").Double(small_group.Percentile(99) * 1e3);
    j.Key("group_coordinator_cpu_mean_ms").Double(group_coordinator_cpu * 1e3);
    j.Key("group_workers_cpu_mean_ms").Double(group_workers_cpu * 1e3);
    if (!small_transfer_error.empty()) j.Key("transfer_1000_error").String(small_transfer_error);
    if (run_transfer) {
      WritePercentilesMs(j, "transfer_1000", small_transfer);
      WritePercentilesMs(j, "copy_4k", copy_4k);
    }
    WritePhasesMs(j, "group_phases_median_ms", group_phases);
    j.EndObject();
    j.Key("values_checked").Int(checked);
    j.EndObject();
    std::printf("%s\n", j.str().c_str());
    return 0;
  }
  std::printf(
      "%zu tensors (%lld bytes %s), FSDP flat on 4 ranks -> Megatron R,S(0)/R,S(1)/R,R on 2x2, "
      "4 CPU workers:\n  CopyGroup moves %lld bytes (lower bound %lld); %d reps after a warm-up "
      "of %.3f s\n",
      w.params.size(), static_cast<long long>(w.bytes()), DTypeName(w.config.dtype).c_str(),
      static_cast<long long>(moved), static_cast<long long>(first.lower_bound_bytes()), reps,
      first_seconds);
  std::printf("%-16s %10s %10s %10s %16s\n", "", "best s", "median s", "GB/s", "workers' CPU s");
  for (const Kind* k : {&group, &transfer, &per_tensor, &gloo, &torch, &attached, &budget, &fp8}) {
    if (k->ran) {
      std::printf("%-16s %10.4f %10.4f %10.3f %16s\n", k->name.c_str(), k->stats.Best(),
                  k->stats.Median(), GBps(moved, k->stats.Best()),
                  k->worker_cpu.seconds.empty()
                      ? ""
                      : absl::StrFormat("%.3f", k->worker_cpu.Median()).c_str());
    } else {
      std::printf("%-16s skipped: %s\n", k->name.c_str(), k->skipped.c_str());
    }
  }
  if (attached.ran) {
    std::printf("group_attached buffers: %s\n",
                attached_huge_pages ? "hugetlbfs memfds (reserved huge pages)"
                                    : "memfds of 4 KiB shared pages (no huge pages reserved)");
  }
  if (budget.ran) {
    std::printf("group_budget workers (budget %lld bytes each):\n",
                static_cast<long long>(budget_bytes));
    for (const WorkerMemory& m : budget_memory) {
      std::printf("  %s: peak %lld of %lld bytes (%s), %lld held now\n", m.name.c_str(),
                  static_cast<long long>(m.peak), static_cast<long long>(m.budget),
                  m.within() ? "within" : "OVER", static_cast<long long>(m.used));
    }
  }
  std::printf("ratios, best vs best (throughput: baseline seconds / measured seconds):\n");
  std::printf("  group / gloo_floor        %6.3f  (goal >= 0.8; paired median %.3f)\n",
              Ratio(group, gloo), Stats{paired_gloo}.Median());
  std::printf("  group / per_tensor        %6.3f  (goal >= 3)\n", Ratio(group, per_tensor));
  std::printf("  group / torch             %6.3f  (goal >= 2)\n", Ratio(group, torch));
  std::printf("  group_budget / gloo_floor %6.3f  (goal >= 0.6)\n", Ratio(budget, gloo));
  std::printf("  transfer / gloo_floor     %6.3f  (goal >= 0.9; transfer / group %.3f)\n",
              Ratio(transfer, gloo), Ratio(transfer, group));
  std::printf("  group_attached / group    %6.3f  (goal >= 0.9%s)\n", Ratio(attached, group),
              attached.ran
                  ? absl::StrFormat("; paired median %.3f; workers' CPU %.3f",
                                    Stats{paired_attached}.Median(),
                                    group.worker_cpu.Median() / attached.worker_cpu.Median())
                        .c_str()
                  : "");
  if (fp8.ran) {
    std::printf(
        "  group_fp8 / group         %6.3f  (bytes moved %.3f of group's: %lld of %lld, %lld of "
        "them staging cut blocks; goal about 0.5)\n",
        Ratio(fp8, group), moved > 0 ? static_cast<double>(fp8_moved) / moved : 0.0,
        static_cast<long long>(fp8_moved), static_cast<long long>(moved),
        static_cast<long long>(fp8_staged));
  }
  std::printf(
      "latency: 4 KiB redistribute p50 %.3f ms p99 %.3f ms; bare RPC p50 %.3f ms p99 %.3f ms\n",
      lat_p50 * 1e3, latency.Percentile(99) * 1e3, rpc_p50 * 1e3, bare_rpc.Percentile(99) * 1e3);
  std::printf("  4 KiB p50 / bare RPC p50  %6.2f  (goal <= 5)\n", lat_p50 / rpc_p50);
  auto print_phases = [](const std::vector<bench::Phase>& ps) {
    if (ps.empty()) return;
    std::vector<std::string> parts;
    for (const bench::Phase& ph : ps) {
      parts.push_back(absl::StrFormat("%s %.3f", ph.name, ph.stats.Median() * 1e3));
    }
    std::printf("  its phases, median ms: %s\n", absl::StrJoin(parts, ", ").c_str());
  };
  print_phases(phases);
  std::printf("  group of %d x 4 KiB: p50 %.1f ms p99 %.1f ms; / one 4 KiB p50 %.1f (goal <= 20)\n",
              group_tensors, group_p50 * 1e3, small_group.Percentile(99) * 1e3,
              group_p50 / lat_p50);
  print_phases(group_phases);
  std::printf("  its CPU, mean ms: coordinator %.1f, the 4 workers %.1f\n",
              group_coordinator_cpu * 1e3, group_workers_cpu * 1e3);
  if (!small_transfer_error.empty()) {
    std::printf("  the small transfer failed (%s): its numbers cover the runs before\n",
                small_transfer_error.c_str());
  }
  if (run_transfer) {
    std::printf(
        "  warm transfer of %d x 4 KiB: p50 %.1f ms p99 %.1f ms; one 4 KiB copy p50 %.3f ms; "
        "ratio %.1f (goal <= 5)\n",
        group_tensors, transfer_p50 * 1e3, small_transfer.Percentile(99) * 1e3, copy_p50 * 1e3,
        transfer_p50 / copy_p50);
  }
  if (!small_group_error.empty()) {
    std::printf("  the small group failed (%s): its numbers cover the reps before\n",
                small_group_error.c_str());
  }
  std::printf("values checked: %lld tensors\n", static_cast<long long>(checked));
  return 0;
}

}  // namespace
}  // namespace shardcoord

int main(int argc, char** argv) {
  return shardcoord::bench::Main(argc, argv, "model_bench", shardcoord::Run);
}
