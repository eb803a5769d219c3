// Loading a DeepSeek-V3-shaped block-scaled FP8 checkpoint into BF16 tensor-parallel layouts
// (issue 28 item 6), against the disk and against a BF16 checkpoint of the same tensors, in
// one run on this machine.
//
//   bazel run -c opt //bench:fp8_checkpoint_bench -- [--json] [--reps 3] [--layers 1]
//       [--shrink 2] [--tp 4] [--dir DIR]
//
// Workload: the first --layers dense decoder layers of DeepSeek-V3 (config: hidden_size 7168,
// intermediate_size 18432 for the first_k_dense_replace = 3 dense layers, q_lora_rank 1536,
// kv_lora_rank 512, qk_rope_head_dim 64, qk_nope_head_dim 128, v_head_dim 128,
// num_attention_heads 128) with the checkpoint's tensor names, generated here with a fixed
// seed. --shrink K divides hidden, intermediate and the head count by K (hidden kept a multiple
// of 128, intermediate of 128 x tp, the heads of tp), so every 128x128 block stays a real block;
// the low-rank dims and head dims keep their real sizes. Two safetensors files of the same
// tensors, each written, fsynced and evicted from the page cache:
//  - FP8, as the real checkpoint: every 2-d projection weight N is F8_E4M3 with an F32 entry
//    N_scale_inv of one scale per 128x128 block (ceil(M/128) x ceil(N/128)); norms are BF16.
//    The FP8 values are real quantized data: random BF16 weights (per-block magnitudes that
//    differ, a few outliers) quantized per block by sharding/block_quant.h (s = amax / 448).
//  - BF16: the same names, each weight's dequantized value bf16(f32(q) * s), no scales.
// Both load into the same layouts on a (dp, tp) mesh of the four workers (1x4 with --tp 4,
// 2x2 with --tp 2): column-parallel q_b_proj, kv_b_proj, gate_proj, up_proj `R,S(0)`;
// row-parallel o_proj, down_proj `R,S(1)`; q_a_proj, kv_a_proj_with_mqa and the norms `R,R`.
//
// Each repetition, in this order, so that every sample sits next to its baselines under the
// same machine load: the disk (each file evicted, then read sequentially in 64 MiB reads), then
// LoadCheckpoint of the FP8 file with dequantize (into BF16) and of the BF16 file without, each
// after evicting its file (the two loads alternate which goes first); the loaded tensors are
// deleted after each load. --warmup untimed loads of each come first: a run's first load pays
// the kernel's first touch of the workers' new buffers. Times are the client's wall clock;
// best and median of --reps. After the last repetition's loads, a few tensors of each (one
// of every placement kind, the edge block of kv_a_proj_with_mqa, a norm) are downloaded and
// compared byte for byte with the dequantized reference computed here (dequantizing is exact),
// and their layouts with the target's.

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <map>
#include <memory>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "bench/bench_common.h"
#include "client/coordinator_client.h"
#include "common/json_writer.h"
#include "sharding/block_quant.h"
#include "sharding/cast.h"
#include "sharding/dtype.h"
#include "sharding/safetensors.h"
#include "tests/cluster.h"
#include "tests/tensor_check.h"

ABSL_FLAG(bool, json, false, "Print one JSON object with every number instead of text.");
ABSL_FLAG(int, reps, 3, "Timed repetitions.");
ABSL_FLAG(int, warmup, 1, "Untimed loads of each checkpoint before the timed repetitions.");
ABSL_FLAG(int, layers, 1, "Dense decoder layers, 1..3 (DeepSeek-V3's first_k_dense_replace).");
ABSL_FLAG(int, shrink, 2,
          "Divide hidden_size, intermediate_size and num_attention_heads by K (1..32; 1: the "
          "real shapes, ~0.58 GB of FP8 and 1.17 GB of BF16 a layer).");
ABSL_FLAG(int, tp, 4, "Tensor-parallel degree: 4 (a 1x4 (dp, tp) mesh) or 2 (2x2).");
ABSL_FLAG(uint64_t, seed, 28, "Seed of the generated weights.");
ABSL_FLAG(std::string, dir, "",
          "Where the checkpoints go (a real disk, not tmpfs); default: a new directory under "
          "$TMPDIR or /tmp, removed at the end.");
ABSL_FLAG(std::string, log_dir, "", "Keep the daemons' logs here (default: in --dir).");

namespace shardcoord {
namespace {

constexpr int kWorkers = 4;
constexpr int64_t kIoPiece = int64_t{64} << 20;
constexpr char kMesh[] = "tp";

using bench::Die;
using bench::GBps;
using bench::OrDie;
using bench::Stats;

// DeepSeek-V3's attention and dense-MLP dims (config.json), hidden, intermediate and heads
// divided by --shrink.
struct Dims {
  int64_t hidden = 7168;
  int64_t intermediate = 18432;
  int64_t heads = 128;
  int64_t q_lora = 1536;
  int64_t kv_lora = 512;
  int64_t rope = 64;
  int64_t nope = 128;
  int64_t v_head = 128;
};

Dims ShrunkDims(int shrink, int tp) {
  auto down_to = [](int64_t x, int64_t multiple) {
    return std::max(multiple, x / multiple * multiple);
  };
  Dims d;
  d.hidden = down_to(d.hidden / shrink, 128);
  d.intermediate = down_to(d.intermediate / shrink, 128 * tp);
  d.heads = down_to(d.heads / shrink, tp);
  return d;
}

struct Param {
  std::string name;
  Shape shape;
  std::string placements;  // On the (dp, tp) mesh.
  bool quantized = false;  // A 2-d projection: F8_E4M3 + <name>_scale_inv in the FP8 file.
  int64_t numel() const {
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    return n;
  }
};

constexpr char kColumn[] = "R,S(0)";
constexpr char kRow[] = "R,S(1)";
constexpr char kReplicated[] = "R,R";

// The dense layers' tensors in the order of DeepSeek-V3's modeling code.
std::vector<Param> DenseLayers(const Dims& d, int layers) {
  std::vector<Param> out;
  for (int l = 0; l < layers; ++l) {
    const std::string p = absl::StrCat("model.layers.", l, ".");
    auto add = [&](const std::string& name, Shape shape, const char* placements) {
      const bool quantized = shape.size() == 2;
      out.push_back({p + name, std::move(shape), placements, quantized});
    };
    add("input_layernorm.weight", {d.hidden}, kReplicated);
    add("self_attn.q_a_proj.weight", {d.q_lora, d.hidden}, kReplicated);
    add("self_attn.q_a_layernorm.weight", {d.q_lora}, kReplicated);
    add("self_attn.q_b_proj.weight", {d.heads * (d.nope + d.rope), d.q_lora}, kColumn);
    add("self_attn.kv_a_proj_with_mqa.weight", {d.kv_lora + d.rope, d.hidden}, kReplicated);
    add("self_attn.kv_a_layernorm.weight", {d.kv_lora}, kReplicated);
    add("self_attn.kv_b_proj.weight", {d.heads * (d.nope + d.v_head), d.kv_lora}, kColumn);
    add("self_attn.o_proj.weight", {d.hidden, d.heads * d.v_head}, kRow);
    add("mlp.gate_proj.weight", {d.intermediate, d.hidden}, kColumn);
    add("mlp.up_proj.weight", {d.intermediate, d.hidden}, kColumn);
    add("mlp.down_proj.weight", {d.hidden, d.intermediate}, kRow);
    add("post_attention_layernorm.weight", {d.hidden}, kReplicated);
  }
  return out;
}

uint64_t SplitMix64(uint64_t& state) {
  uint64_t z = (state += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

uint64_t NameSeed(uint64_t seed, const std::string& name) {
  uint64_t h = 0xCBF29CE484222325ull ^ seed;
  for (unsigned char c : name) h = (h ^ c) * 0x100000001B3ull;
  return h;
}

// Uniform in [-1, 1) from 24 random bits.
float Unit(uint64_t r) { return static_cast<float>(r >> 40) * (2.0f / 16777216.0f) - 1.0f; }

// A parameter's BF16 value: norms 1 +- 0.1; a weight uniform in +-a, a = 0.02 x a factor in
// [0.25, 4) per 128x128 block (so the blocks' scales differ), one element in 256 eight times
// larger (outliers set their block's amax).
std::string RandomBf16(const Param& p, uint64_t seed) {
  uint64_t state = NameSeed(seed, p.name);
  const int64_t cols = p.shape.back();
  const int64_t rows = p.numel() / cols;
  std::string out(static_cast<size_t>(p.numel() * 2), '\0');
  std::vector<float> row(static_cast<size_t>(cols));
  std::vector<float> block_scale(static_cast<size_t>((cols + 127) / 128));
  for (int64_t i = 0; i < rows; ++i) {
    if (p.shape.size() == 1) {
      for (int64_t j = 0; j < cols; ++j) row[j] = 1.0f + 0.1f * Unit(SplitMix64(state));
    } else {
      if (i % 128 == 0) {
        for (float& s : block_scale) {
          s = 0.02f * (0.25f + 3.75f * (Unit(SplitMix64(state)) + 1.0f) / 2.0f);
        }
      }
      for (int64_t j = 0; j < cols; ++j) {
        const uint64_t r = SplitMix64(state);
        row[j] = block_scale[j / 128] * Unit(r) * ((r & 0xFF) == 0 ? 8.0f : 1.0f);
      }
    }
    OrDie(Cast(row.data(), DType::kF32, out.data() + i * cols * 2, DType::kBF16, cols),
          "cast to bf16");
  }
  return out;
}

void WriteAll(int fd, absl::string_view data, const std::string& path) {
  while (!data.empty()) {
    const ssize_t w = write(fd, data.data(), std::min<size_t>(data.size(), kIoPiece));
    if (w <= 0) Die(absl::StrCat("write ", path, ": ", std::strerror(errno)));
    data.remove_prefix(static_cast<size_t>(w));
  }
}

struct Checkpoints {
  std::string fp8_dir, bf16_dir;    // Each holds model.safetensors.
  std::string fp8_file, bf16_file;  // The files.
  int64_t fp8_file_bytes = 0, bf16_file_bytes = 0;
  int64_t fp8_weight_bytes = 0, scale_bytes = 0, norm_bytes = 0;
  int64_t state_bytes = 0;                       // The loaded state dict: every tensor in BF16.
  std::map<std::string, std::string> reference;  // BF16 bytes of the checked tensors.
  std::map<std::string, Shape> scale_shapes;
  double seconds = 0;
};

std::string FileSpecs(const std::vector<Param>& params, bool fp8,
                      std::map<std::string, Shape>* scale_shapes) {
  std::vector<SafetensorsEntrySpec> entries;
  const BlockSize block;
  for (const Param& p : params) {
    if (fp8 && p.quantized) {
      entries.push_back({p.name, DType::kF8E4M3, p.shape});
      const Shape s = OrDie(BlockScaleShape(p.shape, block), p.name);
      (*scale_shapes)[p.name] = s;
      entries.push_back({p.name + "_scale_inv", DType::kF32, s});
    } else {
      entries.push_back({p.name, DType::kBF16, p.shape});
    }
  }
  return OrDie(BuildSafetensorsHeader(entries, {{"format", "pt"}}), "safetensors header");
}

// Writes both checkpoints under `dir` (fsynced) and keeps the reference of `checked`.
Checkpoints Generate(const std::vector<Param>& params, const std::vector<std::string>& checked,
                     uint64_t seed, const std::string& dir) {
  const absl::Time t0 = absl::Now();
  Checkpoints c;
  c.fp8_dir = dir + "/fp8";
  c.bf16_dir = dir + "/bf16";
  std::filesystem::create_directories(c.fp8_dir);
  std::filesystem::create_directories(c.bf16_dir);
  c.fp8_file = c.fp8_dir + "/model.safetensors";
  c.bf16_file = c.bf16_dir + "/model.safetensors";
  const std::string fp8_header = FileSpecs(params, /*fp8=*/true, &c.scale_shapes);
  const std::string bf16_header = FileSpecs(params, /*fp8=*/false, nullptr);
  const int fp8_fd = open(c.fp8_file.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  const int bf16_fd = open(c.bf16_file.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fp8_fd < 0 || bf16_fd < 0) Die(absl::StrCat("create files in ", dir));
  WriteAll(fp8_fd, fp8_header, c.fp8_file);
  WriteAll(bf16_fd, bf16_header, c.bf16_file);
  c.fp8_file_bytes = static_cast<int64_t>(fp8_header.size());
  c.bf16_file_bytes = static_cast<int64_t>(bf16_header.size());
  const BlockSize block;
  for (const Param& p : params) {
    const std::string bf16 = RandomBf16(p, seed);
    c.state_bytes += static_cast<int64_t>(bf16.size());
    if (!p.quantized) {
      WriteAll(fp8_fd, bf16, c.fp8_file);
      WriteAll(bf16_fd, bf16, c.bf16_file);
      c.norm_bytes += static_cast<int64_t>(bf16.size());
      c.fp8_file_bytes += static_cast<int64_t>(bf16.size());
      c.bf16_file_bytes += static_cast<int64_t>(bf16.size());
      if (std::count(checked.begin(), checked.end(), p.name) > 0) c.reference[p.name] = bf16;
      continue;
    }
    const Shape& scale_shape = c.scale_shapes.at(p.name);
    std::string q(static_cast<size_t>(p.numel()), '\0');
    std::vector<float> scales(static_cast<size_t>(scale_shape[0] * scale_shape[1]));
    OrDie(QuantizeBlocks(bf16.data(), DType::kBF16, p.shape, block, q.data(), scales.data()),
          absl::StrCat("quantize ", p.name));
    std::string dequantized(bf16.size(), '\0');
    OrDie(
        DequantizeBlocks(q.data(), scales.data(), p.shape, block, dequantized.data(), DType::kBF16),
        absl::StrCat("dequantize ", p.name));
    const absl::string_view scale_bytes(reinterpret_cast<const char*>(scales.data()),
                                        scales.size() * sizeof(float));
    WriteAll(fp8_fd, q, c.fp8_file);
    WriteAll(fp8_fd, scale_bytes, c.fp8_file);
    WriteAll(bf16_fd, dequantized, c.bf16_file);
    c.fp8_weight_bytes += static_cast<int64_t>(q.size());
    c.scale_bytes += static_cast<int64_t>(scale_bytes.size());
    c.fp8_file_bytes += static_cast<int64_t>(q.size() + scale_bytes.size());
    c.bf16_file_bytes += static_cast<int64_t>(dequantized.size());
    if (std::count(checked.begin(), checked.end(), p.name) > 0) {
      c.reference[p.name] = std::move(dequantized);
    }
  }
  for (int fd : {fp8_fd, bf16_fd}) {
    if (fsync(fd) != 0) Die(absl::StrCat("fsync: ", std::strerror(errno)));
    close(fd);
  }
  c.seconds = absl::ToDoubleSeconds(absl::Now() - t0);
  return c;
}

// One load's numbers.
struct LoadStats {
  Stats wall, read_phase, exchange_phase, process_cpu;
  int64_t bytes_read = 0, bytes_read_direct = 0, exchanged = 0;
};

struct Loader {
  CoordinatorClient& client;
  const std::vector<Param>& params;
  std::vector<pid_t> pids;
  int64_t max_resident = 0;

  v1::LoadCheckpointRequest Request(const std::string& dir, const std::string& prefix,
                                    bool dequantize) const {
    v1::LoadCheckpointRequest req;
    req.set_dir(dir);
    req.set_prefix(prefix);
    req.set_dequantize(dequantize);
    for (const Param& p : params) {
      v1::LoadTarget* t = req.add_targets();
      t->set_tensor(p.name);
      *t->mutable_target() = SpecFromText(kMesh, p.placements);
    }
    return req;
  }

  // Evicts `file`, loads, checks the answer; records into `stats` when not null.
  v1::LoadCheckpointResponse Load(const v1::LoadCheckpointRequest& req, const std::string& file,
                                  int64_t want_bytes_read, LoadStats* stats) {
    bench::EvictFromPageCache(file);
    max_resident = std::max(max_resident, bench::ResidentBytes(file));
    const double cpu0 = bench::ProcessCpuSeconds(pids);
    const absl::Time t0 = absl::Now();
    v1::LoadCheckpointResponse r = OrDie(client.LoadCheckpoint(req), "load " + req.dir());
    const double seconds = absl::ToDoubleSeconds(absl::Now() - t0);
    const double cpu = bench::ProcessCpuSeconds(pids) - cpu0;
    if (r.bytes_read() != want_bytes_read) {
      Die(absl::StrCat("load of ", req.dir(), " read ", r.bytes_read(), " bytes, not the file's ",
                       want_bytes_read, " data bytes once"));
    }
    if (r.tensors_size() != static_cast<int>(params.size())) Die("load: tensors missing");
    for (const v1::LoadedTensor& t : r.tensors()) {
      const auto p = std::find_if(params.begin(), params.end(),
                                  [&](const Param& q) { return q.name == t.tensor(); });
      if (p == params.end()) Die(absl::StrCat("load: unexpected tensor ", t.tensor()));
      const std::string want_scale =
          req.dequantize() && p->quantized ? t.tensor() + "_scale_inv" : "";
      if (t.dtype() != v1::BF16 || t.scale_tensor() != want_scale) {
        Die(absl::StrCat("load: ", t.tensor(), " came as ", v1::DType_Name(t.dtype()),
                         " with scale '", t.scale_tensor(), "', want BF16 with '", want_scale,
                         "'"));
      }
    }
    if (stats != nullptr) {
      stats->wall.seconds.push_back(seconds);
      stats->read_phase.seconds.push_back(r.read_seconds());
      stats->exchange_phase.seconds.push_back(r.exchange_seconds());
      stats->process_cpu.seconds.push_back(cpu);
      stats->bytes_read = r.bytes_read();
      stats->bytes_read_direct = r.bytes_read_direct();
      stats->exchanged = r.exchange_bytes_moved();
    }
    return r;
  }

  void Delete(const std::string& prefix) {
    std::vector<std::string> names;
    for (const Param& p : params) names.push_back(prefix + p.name);
    const int64_t deleted = OrDie(client.DeleteTensors(names, ""), "delete " + prefix);
    if (deleted != static_cast<int64_t>(params.size())) Die("delete: tensors missing");
  }
};

// Downloads `prefix` + each checked tensor and compares it with the reference, byte for byte,
// and its layout with the target's. Returns the bytes compared.
int64_t CheckValues(CoordinatorClient& client, const v1::MeshInfo& mesh,
                    const std::vector<Param>& params, const Checkpoints& c,
                    const std::string& prefix) {
  int64_t compared = 0;
  for (const auto& [name, want] : c.reference) {
    const std::string& wanted = name;  // Lambdas may not capture structured bindings (C++17).
    const Param& p = *std::find_if(params.begin(), params.end(),
                                   [&](const Param& q) { return q.name == wanted; });
    std::string got;
    const v1::TensorHeader header = OrDie(client.Download(prefix + name, &got), "download");
    if (header.dtype() != v1::BF16) Die(absl::StrCat(prefix, name, ": not bf16"));
    if (got.size() != want.size()) {
      Die(absl::StrCat(prefix, name, ": ", got.size(), " bytes, want ", want.size()));
    }
    if (got != want) {
      int64_t differ = 0, first = -1;
      for (size_t i = 0; i < got.size(); i += 2) {
        if (got.compare(i, 2, want, i, 2) != 0) {
          if (first < 0) first = static_cast<int64_t>(i / 2);
          ++differ;
        }
      }
      Die(absl::StrCat(prefix, name, ": ", differ, " of ", got.size() / 2,
                       " elements differ from the dequantized reference (first at ", first, ")"));
    }
    const v1::TensorInfo info = OrDie(client.GetTensor(prefix + name), "get " + prefix + name);
    const v1::Layout layout = OrDie(ExpectedLayout(mesh, p.shape, p.placements), "layout");
    OrDie(SameChunks(info.layout(), layout), absl::StrCat(prefix, name, ": layout"));
    compared += static_cast<int64_t>(got.size());
  }
  return compared;
}

std::string ShapeText(const Shape& s) { return absl::StrCat("[", absl::StrJoin(s, ", "), "]"); }

int Run() {
  const int reps = std::max(1, absl::GetFlag(FLAGS_reps));
  const int warmup = std::max(0, absl::GetFlag(FLAGS_warmup));
  const int layers = absl::GetFlag(FLAGS_layers);
  const int shrink = absl::GetFlag(FLAGS_shrink);
  const int tp = absl::GetFlag(FLAGS_tp);
  const bool json = absl::GetFlag(FLAGS_json);
  if (layers < 1 || layers > 3) Die("--layers: 1..3 (the dense layers; MoE layers not modelled)");
  if (shrink < 1 || shrink > 32) Die("--shrink: 1..32");
  if (tp != 2 && tp != 4) Die("--tp: 2 or 4");
  auto say = [&](const std::string& s) {
    if (!json) std::fprintf(stderr, "%s\n", s.c_str());
  };
  std::string dir = absl::GetFlag(FLAGS_dir);
  const bool own_dir = dir.empty();
  if (own_dir) dir = bench::ScratchDir("fp8_checkpoint_bench");
  std::filesystem::create_directories(dir);
  dir = std::filesystem::canonical(dir).string();
  const std::string log_dir = bench::LogDir(absl::GetFlag(FLAGS_log_dir), dir + "/logs");

  const Dims dims = ShrunkDims(shrink, tp);
  const std::vector<Param> params = DenseLayers(dims, layers);
  const std::string last = absl::StrCat("model.layers.", layers - 1, ".");
  const std::vector<std::string> checked = {
      last + "self_attn.q_b_proj.weight", last + "self_attn.kv_a_proj_with_mqa.weight",
      last + "self_attn.o_proj.weight",   last + "mlp.gate_proj.weight",
      last + "mlp.down_proj.weight",      last + "self_attn.q_a_layernorm.weight"};
  say(absl::StrCat("generating ", params.size(), " tensors (dense layers: ", layers, ", shrink ",
                   shrink, ") in ", dir));
  const Checkpoints c = Generate(params, checked, absl::GetFlag(FLAGS_seed), dir);
  say(absl::StrCat("generated in ", c.seconds, " s"));

  ClusterOptions options;
  options.num_workers = kWorkers;
  options.echo_stdout = false;
  options.log_dir = log_dir;
  say(absl::StrCat("starting a coordinator and ", kWorkers, " workers (logs in ", log_dir, ")"));
  std::unique_ptr<Cluster> cluster = OrDie(Cluster::Start(options), "cluster");
  CoordinatorClient& client = cluster->client();
  const v1::MeshInfo mesh = OrDie(
      MakeMesh(client, kMesh, {kWorkers / tp, tp}, cluster->WorkerNames(), {"dp", "tp"}), "mesh");
  Loader loader{client, params, {cluster->coordinator_pid()}};
  for (int i = 0; i < kWorkers; ++i) loader.pids.push_back(cluster->worker_pid(i));
  const v1::LoadCheckpointRequest fp8_req = loader.Request(c.fp8_dir, "F.", true);
  const v1::LoadCheckpointRequest bf16_req = loader.Request(c.bf16_dir, "B.", false);
  const int64_t fp8_data = c.fp8_weight_bytes + c.scale_bytes + c.norm_bytes;
  const int64_t bf16_data = c.state_bytes;

  for (int w = 0; w < warmup; ++w) {
    say(absl::StrCat("warm-up ", w + 1, " (untimed)"));
    loader.Load(fp8_req, c.fp8_file, fp8_data, nullptr);
    loader.Delete("F.");
    loader.Load(bf16_req, c.bf16_file, bf16_data, nullptr);
    loader.Delete("B.");
  }
  Stats disk_fp8, disk_bf16;
  LoadStats fp8, bf16;
  int64_t values_compared = 0;
  for (int rep = 0; rep < reps; ++rep) {
    for (auto [file, bytes, stats] :
         {std::make_tuple(&c.fp8_file, c.fp8_file_bytes, &disk_fp8),
          std::make_tuple(&c.bf16_file, c.bf16_file_bytes, &disk_bf16)}) {
      bench::EvictFromPageCache(*file);
      loader.max_resident = std::max(loader.max_resident, bench::ResidentBytes(*file));
      const absl::Time t0 = absl::Now();
      if (bench::ReadSequentially(*file, kIoPiece) != bytes) Die("short read of " + *file);
      stats->seconds.push_back(absl::ToDoubleSeconds(absl::Now() - t0));
    }
    const bool last_rep = rep == reps - 1;
    auto load_fp8 = [&] {
      loader.Load(fp8_req, c.fp8_file, fp8_data, &fp8);
      if (last_rep) values_compared += CheckValues(client, mesh, params, c, "F.");
      loader.Delete("F.");
    };
    auto load_bf16 = [&] {
      loader.Load(bf16_req, c.bf16_file, bf16_data, &bf16);
      if (last_rep) values_compared += CheckValues(client, mesh, params, c, "B.");
      loader.Delete("B.");
    };
    if (rep % 2 == 0) {
      load_fp8();
      load_bf16();
    } else {
      load_bf16();
      load_fp8();
    }
    say(absl::StrCat("rep ", rep + 1, ": disk read fp8 ", disk_fp8.seconds.back(), " s, bf16 ",
                     disk_bf16.seconds.back(), " s; load fp8+dequantize ", fp8.wall.seconds.back(),
                     " s (read ", fp8.read_phase.seconds.back(), ", exchange ",
                     fp8.exchange_phase.seconds.back(), "), bf16 ", bf16.wall.seconds.back(),
                     " s (read ", bf16.read_phase.seconds.back(), ", exchange ",
                     bf16.exchange_phase.seconds.back(), ")"));
  }
  cluster.reset();
  if (own_dir) std::filesystem::remove_all(dir);

  const std::string mesh_text = absl::StrCat(kWorkers / tp, "x", tp);
  const double fp8_vs_bf16 = fp8.wall.Best() / bf16.wall.Best();
  const double fp8_vs_bf16_median = fp8.wall.Median() / bf16.wall.Median();
  const double fp8_vs_disk = disk_fp8.Best() / fp8.wall.Best();
  const double bf16_vs_disk = disk_bf16.Best() / bf16.wall.Best();
  const double fp8_vs_disk_bf16 = disk_bf16.Best() / fp8.wall.Best();
  if (json) {
    JsonWriter w;
    w.BeginObject().Key("optimized").Bool(bench::kOptimizedBuild);
    w.Key("layers").Int(layers).Key("shrink").Int(shrink).Key("mesh").String(mesh_text);
    w.Key("dims").BeginObject();
    w.Key("hidden_size").Int(dims.hidden).Key("intermediate_size").Int(dims.intermediate);
    w.Key("num_attention_heads").Int(dims.heads).Key("q_lora_rank").Int(dims.q_lora);
    w.Key("kv_lora_rank").Int(dims.kv_lora).Key("qk_rope_head_dim").Int(dims.rope);
    w.Key("qk_nope_head_dim").Int(dims.nope).Key("v_head_dim").Int(dims.v_head);
    w.EndObject();
    w.Key("tensors").Int(static_cast<int64_t>(params.size()));
    w.Key("reps").Int(reps).Key("warmup").Int(warmup).Key("workers").Int(kWorkers);
    w.Key("fp8_file_bytes").Int(c.fp8_file_bytes).Key("bf16_file_bytes").Int(c.bf16_file_bytes);
    w.Key("fp8_weight_bytes").Int(c.fp8_weight_bytes).Key("scale_bytes").Int(c.scale_bytes);
    w.Key("norm_bytes").Int(c.norm_bytes).Key("state_bytes").Int(c.state_bytes);
    w.Key("generate_seconds").Double(c.seconds);
    auto stats = [&](const char* key, const Stats& s, int64_t bytes) {
      w.Key(key).BeginObject();
      w.Key("best_seconds").Double(s.Best()).Key("median_seconds").Double(s.Median());
      w.Key("seconds").BeginArray();
      for (double v : s.seconds) w.Double(v);
      w.EndArray();
      w.Key("gbps")
          .Double(GBps(bytes, s.Best()))
          .Key("median_gbps")
          .Double(GBps(bytes, s.Median()));
      w.EndObject();
    };
    stats("disk_read_fp8", disk_fp8, c.fp8_file_bytes);
    stats("disk_read_bf16", disk_bf16, c.bf16_file_bytes);
    auto load = [&](const char* key, const LoadStats& s, int64_t file_bytes) {
      stats(key, s.wall, file_bytes);
      w.Key(absl::StrCat(key, "_state_gbps")).Double(GBps(c.state_bytes, s.wall.Best()));
      w.Key(absl::StrCat(key, "_read_phase_best_seconds")).Double(s.read_phase.Best());
      w.Key(absl::StrCat(key, "_exchange_phase_best_seconds")).Double(s.exchange_phase.Best());
      w.Key(absl::StrCat(key, "_process_cpu_seconds_median")).Double(s.process_cpu.Median());
      w.Key(absl::StrCat(key, "_bytes_read")).Int(s.bytes_read);
      w.Key(absl::StrCat(key, "_bytes_read_direct")).Int(s.bytes_read_direct);
      w.Key(absl::StrCat(key, "_bytes_exchanged")).Int(s.exchanged);
    };
    load("fp8_load", fp8, c.fp8_file_bytes);
    load("bf16_load", bf16, c.bf16_file_bytes);
    w.Key("fp8_load_over_bf16_load").Double(fp8_vs_bf16);
    w.Key("fp8_load_over_bf16_load_median").Double(fp8_vs_bf16_median);
    w.Key("fp8_load_vs_disk_read_fp8").Double(fp8_vs_disk);
    w.Key("bf16_load_vs_disk_read_bf16").Double(bf16_vs_disk);
    w.Key("fp8_load_vs_disk_read_bf16").Double(fp8_vs_disk_bf16);
    w.Key("max_resident_bytes_before_reads").Int(loader.max_resident);
    w.Key("values_checked_tensors").Int(2 * static_cast<int64_t>(c.reference.size()));
    w.Key("values_checked_bytes").Int(values_compared).Key("values_ok").Bool(true);
    w.EndObject();
    std::printf("%s\n", w.str().c_str());
    return 0;
  }
  std::printf(
      "DeepSeek-V3 dense layers 0..%d, shrink %d: hidden_size %lld, intermediate_size %lld, "
      "heads %lld (q_lora_rank %lld, kv_lora_rank %lld, rope %lld, nope %lld, v %lld)\n",
      layers - 1, shrink, static_cast<long long>(dims.hidden),
      static_cast<long long>(dims.intermediate), static_cast<long long>(dims.heads),
      static_cast<long long>(dims.q_lora), static_cast<long long>(dims.kv_lora),
      static_cast<long long>(dims.rope), static_cast<long long>(dims.nope),
      static_cast<long long>(dims.v_head));
  for (const Param& p : params) {
    if (p.name.rfind("model.layers.0.", 0) != 0) continue;
    std::printf(
        "  %-50s %-14s %-7s%s\n", p.name.c_str(), ShapeText(p.shape).c_str(), p.placements.c_str(),
        p.quantized
            ? absl::StrCat("  F8_E4M3 + scale_inv ", ShapeText(c.scale_shapes.at(p.name))).c_str()
            : "  BF16");
  }
  std::printf(
      "FP8 file %lld bytes (FP8 %lld, scales %lld, BF16 norms %lld); BF16 file %lld bytes "
      "(generated in %.1f s)\n",
      static_cast<long long>(c.fp8_file_bytes), static_cast<long long>(c.fp8_weight_bytes),
      static_cast<long long>(c.scale_bytes), static_cast<long long>(c.norm_bytes),
      static_cast<long long>(c.bf16_file_bytes), c.seconds);
  std::printf(
      "%zu tensors onto a %s (dp, tp) mesh of %d CPU workers; %d reps after %d warm-up; best "
      "(median) seconds, GB/s of the file read\n",
      params.size(), mesh_text.c_str(), kWorkers, reps, warmup);
  auto line = [&](const char* what, const Stats& s, int64_t bytes) {
    std::printf("  %-40s %7.3f (%7.3f) s  %6.3f GB/s\n", what, s.Best(), s.Median(),
                GBps(bytes, s.Best()));
  };
  line("disk read, FP8 file (evicted)", disk_fp8, c.fp8_file_bytes);
  line("disk read, BF16 file (evicted)", disk_bf16, c.bf16_file_bytes);
  line("load FP8 + dequantize -> BF16 TP", fp8.wall, c.fp8_file_bytes);
  line("load BF16 -> BF16 TP", bf16.wall, c.bf16_file_bytes);
  for (const auto& [what, s] : {std::make_pair("FP8", &fp8), std::make_pair("BF16", &bf16)}) {
    std::printf(
        "    %s load: read %.3f s, exchange %.3f s (best); %lld bytes read (%lld O_DIRECT), %lld "
        "exchanged; %.3f CPU-s of the daemons (median); %.3f GB/s of BF16 state\n",
        what, s->read_phase.Best(), s->exchange_phase.Best(), static_cast<long long>(s->bytes_read),
        static_cast<long long>(s->bytes_read_direct), static_cast<long long>(s->exchanged),
        s->process_cpu.Median(), GBps(c.state_bytes, s->wall.Best()));
  }
  std::printf(
      "  fp8 load / bf16 load: %.2fx the time (best), %.2fx (median); fp8 load %.2fx the disk "
      "read of its file, bf16 load %.2fx of its file; fp8 load %.2fx the disk read of the BF16 "
      "file\n",
      fp8_vs_bf16, fp8_vs_bf16_median, fp8_vs_disk, bf16_vs_disk, fp8_vs_disk_bf16);
  std::printf(
      "  values: %zu tensors of each load equal the dequantized reference byte for byte (%lld "
      "bytes), layouts as targeted; page cache resident before reads: %lld B\n",
      c.reference.size(), static_cast<long long>(values_compared),
      static_cast<long long>(loader.max_resident));
  return 0;
}

}  // namespace
}  // namespace shardcoord

int main(int argc, char** argv) {
  return shardcoord::bench::Main(argc, argv, "fp8_checkpoint_bench", shardcoord::Run);
}
