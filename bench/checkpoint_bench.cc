// Checkpoint save and load (issue 13) against the disk's own throughput and the torch recipe,
// in one run on this machine.
//
//   bazel run -c opt //bench:checkpoint_bench -- [--json] [--reps 5] [--dir DIR]
//
// Workload (bench/llama_state.h, shared with model_bench): the state dict of a Llama-style
// decoder (16 layers, hidden 1024, intermediate 2816, vocab 32000, bf16: 147 tensors, about
// 0.54 GB) on four CPU (Gloo) workers, created in FSDP flat sharding on a 1-d mesh of four.
//
// Each repetition, in this order, so that every sample of ours sits next to a baseline sample
// taken under the same machine load:
//  1. disk: one file of the same bytes written with write(2) in 64 MiB pieces and fsynced
//     (write), evicted from the page cache, read back sequentially (read);
//  2. save: SaveCheckpoint of all 147 tensors from the FSDP layout into a fresh directory;
//  3. load: the checkpoint's files evicted from the page cache, then LoadCheckpoint of all 147
//     into the Megatron 2x2 (dp, tp) layout (column-parallel R,S(0), row-parallel R,S(1),
//     norms R,R) over the same workers: the workers read each byte once and exchange.
// Eviction is posix_fadvise(POSIX_FADV_DONTNEED) on each file after its fsync (clean pages
// are dropped), checked with mincore: the report says how much of the files was still
// resident before each read (0 when eviction worked). It needs no root and touches only our
// files, unlike /proc/sys/vm/drop_caches, which drops every process's cache on a machine
// shared with other builds.
// Then torch (bench/torch_checkpoint.py, /usr/bin/python3): four processes save their FSDP
// shards with torch.save + fsync and load every file and slice their Megatron shard.
// Times are client wall clock; GB/s = the state dict's bytes / seconds (1 GB = 1e9 bytes);
// best and median of --reps. Values of a few loaded tensors are checked against the fill
// formula once, at the end.

#include <fcntl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "bench/bench_common.h"
#include "bench/llama_state.h"
#include "client/coordinator_client.h"
#include "common/json_writer.h"
#include "proto/convert.h"
#include "tests/cluster.h"
#include "tests/process.h"
#include "tests/tensor_check.h"

ABSL_FLAG(bool, json, false, "Print one JSON object with every number instead of text.");
ABSL_FLAG(int, reps, 5, "Timed repetitions of each measurement.");
ABSL_FLAG(std::string, dir, "",
          "Where checkpoints and the disk baseline's file go (a real disk, not tmpfs); "
          "default: a new directory under $TMPDIR or /tmp.");
ABSL_FLAG(bool, torch, true, "Also run the torch recipe when /usr/bin/python3 has torch.");
ABSL_FLAG(std::string, python, "/usr/bin/python3", "Python with torch.");
ABSL_FLAG(int, layers, 16, "Decoder layers of the state dict.");
ABSL_FLAG(std::string, log_dir, "", "Keep the daemons' logs here (default: in --dir).");
ABSL_FLAG(std::string, perf_control, "",
          "A FIFO of `perf record --control fifo:FIFO,ACK -D -1`: perf samples only the loads "
          "after the first (\"enable\" is written to it before each, \"disable\" after; ACK "
          "is FIFO.ack).");

namespace shardcoord {
namespace {

constexpr int kWorkers = 4;
constexpr int64_t kIoPiece = int64_t{64} << 20;

using bench::Die;
using bench::EvictFromPageCache;
using bench::GBps;
using bench::OrDie;
using bench::ResidentBytes;
using bench::Stats;

// Sends `command` to perf through --perf_control's FIFO and waits for its ack (no-op without).
void PerfControl(const char* command) {
  const std::string fifo = absl::GetFlag(FLAGS_perf_control);
  if (fifo.empty()) return;
  std::ofstream(fifo) << command << "\n" << std::flush;
  std::string ack;
  std::ifstream(fifo + ".ack") >> ack;
}

std::vector<std::string> FilesIn(const std::string& dir) {
  std::vector<std::string> out;
  for (const auto& e : std::filesystem::directory_iterator(dir)) out.push_back(e.path().string());
  return out;
}

// CPU seconds all CPUs of the machine spent busy (not idle or waiting for I/O) so far, from
// /proc/stat: the load's share of the machine (with whatever else runs on it).
double BusyCpuSeconds() {
  std::ifstream in("/proc/stat");
  std::string cpu;
  int64_t user = 0, nice = 0, system = 0, idle = 0, iowait = 0, irq = 0, softirq = 0, steal = 0;
  in >> cpu >> user >> nice >> system >> idle >> iowait >> irq >> softirq >> steal;
  return static_cast<double>(user + nice + system + irq + softirq) / sysconf(_SC_CLK_TCK);
}

// One file of `bytes` written (fsynced), evicted, read back: {write, read} seconds.
std::pair<double, double> DiskBaseline(const std::string& path, int64_t bytes,
                                       const std::string& buffer, int64_t* resident) {
  absl::Time t0 = absl::Now();
  {
    const int fd = open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) Die(absl::StrCat("create ", path, ": ", std::strerror(errno)));
    for (int64_t done = 0; done < bytes;) {
      const int64_t n = std::min<int64_t>(kIoPiece, bytes - done);
      const ssize_t w = write(fd, buffer.data(), static_cast<size_t>(n));
      if (w <= 0) Die(absl::StrCat("write ", path, ": ", std::strerror(errno)));
      done += w;
    }
    if (fsync(fd) != 0) Die("fsync");
    close(fd);
  }
  const double write_s = absl::ToDoubleSeconds(absl::Now() - t0);
  EvictFromPageCache(path);
  *resident = ResidentBytes(path);
  t0 = absl::Now();
  if (bench::ReadSequentially(path, kIoPiece) != bytes) Die("short read of the baseline file");
  const double read_s = absl::ToDoubleSeconds(absl::Now() - t0);
  std::filesystem::remove(path);
  return {write_s, read_s};
}

// The same bytes as `files` files written by as many threads at once (fsynced), evicted, read
// back by as many threads: the disk with the parallelism the workers have.
std::pair<double, double> ParallelDiskBaseline(const std::string& dir, int files, int64_t bytes,
                                               const std::string& buffer, int64_t* resident) {
  std::vector<std::string> paths;
  for (int i = 0; i < files; ++i) paths.push_back(absl::StrCat(dir, "/disk_parallel.", i));
  const int64_t each = bytes / files;
  auto run = [&](const std::function<void(int)>& work) {
    const absl::Time t0 = absl::Now();
    std::vector<std::thread> threads;
    for (int i = 0; i < files; ++i) threads.emplace_back(work, i);
    for (std::thread& t : threads) t.join();
    return absl::ToDoubleSeconds(absl::Now() - t0);
  };
  const double write_s = run([&](int i) {
    const int fd = open(paths[i].c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) Die(absl::StrCat("create ", paths[i], ": ", std::strerror(errno)));
    for (int64_t done = 0; done < each;) {
      const ssize_t w =
          write(fd, buffer.data(), static_cast<size_t>(std::min<int64_t>(kIoPiece, each - done)));
      if (w <= 0) Die("write");
      done += w;
    }
    if (fsync(fd) != 0) Die("fsync");
    close(fd);
  });
  for (const std::string& p : paths) EvictFromPageCache(p);
  for (const std::string& p : paths) *resident += ResidentBytes(p);
  const double read_s = run([&](int i) {
    std::string in(static_cast<size_t>(kIoPiece), '\0');
    const int fd = open(paths[i].c_str(), O_RDONLY | O_CLOEXEC);
    posix_fadvise(fd, 0, 0, POSIX_FADV_SEQUENTIAL);
    while (read(fd, in.data(), in.size()) > 0) {
    }
    close(fd);
  });
  for (const std::string& p : paths) std::filesystem::remove(p);
  return {write_s, read_s};
}

struct TorchResult {
  bool ran = false;
  std::string skipped;
  Stats save, load;
  int64_t bytes_read = 0;
};

TorchResult RunTorch(const std::vector<LlamaParam>& state, const std::vector<std::string>& flat,
                     const std::string& dir, int reps) {
  TorchResult r;
  const std::string python = absl::GetFlag(FLAGS_python);
  if (access(python.c_str(), X_OK) != 0) {
    r.skipped = absl::StrCat(python, " not found");
    return r;
  }
  // The layout file: every tensor's shape, FSDP ranges per rank and Megatron placements.
  JsonWriter w;
  w.BeginObject().Key("ranks").Int(kWorkers).Key("tp").Int(2).Key("tensors").BeginArray();
  for (size_t i = 0; i < state.size(); ++i) {
    w.BeginObject().Key("name").String(state[i].name).Key("shape").IntArray(state[i].shape);
    w.Key("flat").BeginArray();
    for (absl::string_view part : absl::StrSplit(flat[i], ';')) {
      if (part.empty()) {
        w.Null();
        continue;
      }
      std::vector<std::string> ab = absl::StrSplit(part, ':');
      w.BeginArray().Int(std::stoll(ab[0])).Int(std::stoll(ab[1])).EndArray();
    }
    w.EndArray().Key("megatron").String(state[i].megatron).EndObject();
  }
  w.EndArray().EndObject();
  const std::string layout = dir + "/torch_layout.json";
  std::ofstream(layout) << w.str();
  const std::string script = OrDie(RunfilePath("bench/torch_checkpoint.py"), "torch script");
  ProcessOptions options;
  options.name = "torch";
  options.echo_stdout = false;
  std::unique_ptr<Process> p = OrDie(Process::Start({python, script, "--layout", layout, "--dir",
                                                     dir + "/torch", absl::StrCat("--reps=", reps)},
                                                    options),
                                     "start torch_checkpoint.py");
  const int status = OrDie(p->Wait(absl::Minutes(30)), "torch_checkpoint.py");
  if (WIFEXITED(status) && WEXITSTATUS(status) == 3) {
    r.skipped = absl::StrCat(python, " has no torch");
    return r;
  }
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
    Die(absl::StrCat("torch_checkpoint.py ", Process::DescribeWaitStatus(status), ": ",
                     absl::StrJoin(p->Lines(), " | ")));
  }
  for (const std::string& line : p->Lines()) {
    if (line.find("\"save_seconds\"") == std::string::npos) continue;
    auto list = [&](const std::string& key) {
      std::vector<double> out;
      const size_t at = line.find(absl::StrCat("\"", key, "\": ["));
      if (at == std::string::npos) Die("torch output");
      const size_t open = line.find('[', at), close = line.find(']', open);
      for (absl::string_view v : absl::StrSplit(line.substr(open + 1, close - open - 1), ", ")) {
        out.push_back(std::stod(std::string(v)));
      }
      return out;
    };
    r.save.seconds = list("save_seconds");
    r.load.seconds = list("load_seconds");
    const size_t at = line.find("\"bytes_read\": ");
    if (at != std::string::npos) r.bytes_read = std::stoll(line.substr(at + 14));
    r.ran = true;
    return r;
  }
  Die("torch_checkpoint.py printed no result");
}

int Run() {
  const int reps = std::max(1, absl::GetFlag(FLAGS_reps));
  const bool json = absl::GetFlag(FLAGS_json);
  auto say = [&](const std::string& s) {
    if (!json) std::fprintf(stderr, "%s\n", s.c_str());
  };
  std::string dir = absl::GetFlag(FLAGS_dir);
  const bool own_dir = dir.empty();
  if (own_dir) {
    const char* tmp = std::getenv("TMPDIR");
    dir = absl::StrCat(tmp != nullptr ? tmp : "/tmp", "/shardcoord_checkpoint_bench.", getpid());
  }
  std::filesystem::create_directories(dir);
  dir = std::filesystem::canonical(dir).string();
  const std::string log_dir =
      absl::GetFlag(FLAGS_log_dir).empty() ? dir + "/logs" : absl::GetFlag(FLAGS_log_dir);
  std::filesystem::create_directories(log_dir);

  LlamaConfig config;
  config.layers = absl::GetFlag(FLAGS_layers);
  const std::vector<LlamaParam> state = LlamaStateDict(config);
  const int64_t total = TotalElements(state);
  std::vector<std::string> flat;
  for (const LlamaParam& p : state) {
    flat.push_back(FlatSpecToString(FsdpFlatSpec(p, total, kWorkers)));
  }
  const int64_t bytes = total * ElementSize(config.dtype);

  ClusterOptions options;
  options.num_workers = kWorkers;
  options.echo_stdout = false;
  options.log_dir = log_dir;
  say(absl::StrCat("starting a coordinator and ", kWorkers, " workers (logs in ", log_dir, ")"));
  std::unique_ptr<Cluster> cluster = OrDie(Cluster::Start(options), "cluster");
  CoordinatorClient& client = cluster->client();
  OrDie(MakeMesh(client, "fsdp", {kWorkers}, cluster->WorkerNames()), "mesh fsdp");
  OrDie(
      MakeMesh(client, "megatron", MegatronMeshShape(), cluster->WorkerNames(), MegatronMeshDims()),
      "mesh megatron");
  say(absl::StrCat("creating ", state.size(), " tensors (", bytes, " bytes) in FSDP flat layout"));
  for (size_t i = 0; i < state.size(); ++i) {
    OrDie(CreateFilled(client, state[i].name, state[i].shape, config.dtype, "fsdp", flat[i],
                       /*flat=*/true, v1::RANDOM),
          state[i].name);
  }
  v1::LoadCheckpointRequest load_base;
  load_base.set_prefix("L.");
  for (const LlamaParam& t : state) {
    v1::LoadTarget* target = load_base.add_targets();
    target->set_tensor(t.name);
    *target->mutable_target() = SpecFromText("megatron", t.megatron);
  }

  std::string buffer(static_cast<size_t>(kIoPiece), '\0');
  for (size_t i = 0; i < buffer.size(); ++i) buffer[i] = static_cast<char>((i * 2654435761u) >> 13);
  Stats disk_write, disk_read, par_write, par_read, save, load, read_phase, exchange_phase;
  Stats load_cpu;          // Busy CPU-seconds of the machine during each load.
  Stats load_process_cpu;  // CPU-seconds of the coordinator and the workers during each load.
  std::vector<pid_t> pids = {cluster->coordinator_pid()};
  for (int i = 0; i < kWorkers; ++i) pids.push_back(cluster->worker_pid(i));
  int64_t max_resident = 0, bytes_read = 0, exchanged = 0, read_direct = 0;
  double balance = 0;
  for (int rep = 0; rep < reps; ++rep) {
    int64_t resident = 0;
    const auto [w_s, r_s] = DiskBaseline(dir + "/disk_baseline.bin", bytes, buffer, &resident);
    max_resident = std::max(max_resident, resident);
    disk_write.seconds.push_back(w_s);
    disk_read.seconds.push_back(r_s);
    const auto [pw_s, pr_s] = ParallelDiskBaseline(dir, kWorkers, bytes, buffer, &resident);
    max_resident = std::max(max_resident, resident);
    par_write.seconds.push_back(pw_s);
    par_read.seconds.push_back(pr_s);

    const std::string ckpt = absl::StrCat(dir, "/ckpt", rep);
    v1::SaveCheckpointRequest save_req;
    save_req.set_dir(ckpt);
    for (const LlamaParam& t : state) save_req.add_tensors(t.name);
    absl::Time t0 = absl::Now();
    const v1::SaveCheckpointResponse saved = OrDie(client.SaveCheckpoint(save_req), "save");
    save.seconds.push_back(absl::ToDoubleSeconds(absl::Now() - t0));
    balance = saved.max_writer_bytes() / std::max(1.0, saved.ideal_writer_bytes());

    for (const std::string& f : FilesIn(ckpt)) EvictFromPageCache(f);
    int64_t resident_ckpt = 0;
    for (const std::string& f : FilesIn(ckpt)) resident_ckpt += ResidentBytes(f);
    max_resident = std::max(max_resident, resident_ckpt);
    v1::LoadCheckpointRequest load_req = load_base;
    load_req.set_dir(ckpt);
    // The first load pays the kernel's first touch of every new buffer: perf samples the rest.
    if (rep > 0) PerfControl("enable");
    t0 = absl::Now();
    const double cpu0 = BusyCpuSeconds(), process_cpu0 = bench::ProcessCpuSeconds(pids);
    const v1::LoadCheckpointResponse loaded = OrDie(client.LoadCheckpoint(load_req), "load");
    load.seconds.push_back(absl::ToDoubleSeconds(absl::Now() - t0));
    load_cpu.seconds.push_back(BusyCpuSeconds() - cpu0);
    load_process_cpu.seconds.push_back(bench::ProcessCpuSeconds(pids) - process_cpu0);
    if (rep > 0) PerfControl("disable");
    read_phase.seconds.push_back(loaded.read_seconds());
    exchange_phase.seconds.push_back(loaded.exchange_seconds());
    bytes_read = loaded.bytes_read();
    read_direct = loaded.bytes_read_direct();
    exchanged = loaded.exchange_bytes_moved();
    if (loaded.bytes_read() != bytes) Die("the load did not read every byte exactly once");
    say(absl::StrCat("rep ", rep + 1, ": disk write ", w_s, " s, read ", r_s, " s; 4 files ", pw_s,
                     " s, ", pr_s, " s; save ", save.seconds.back(), " s; load ",
                     load.seconds.back(), " s (read ", loaded.read_seconds(), " s, exchange ",
                     loaded.exchange_seconds(), " s; ", load_cpu.seconds.back(),
                     " CPU-seconds busy of ",
                     load.seconds.back() * std::thread::hardware_concurrency(), ", ",
                     load_process_cpu.seconds.back(), " in the coordinator and workers)"));
    for (const v1::CheckpointFileInfo& r : loaded.readers()) {
      say(absl::StrCat("  reader ", r.worker(), ": ", r.bytes(), " bytes in ", r.entries(),
                       " runs, ", r.seconds(), " s"));
    }
    if (rep == reps - 1) {
      // The values are what was created, for a few tensors of every kind.
      for (const char* name :
           {"model.embed_tokens.weight", "model.layers.3.self_attn.o_proj.weight",
            "model.layers.7.mlp.up_proj.weight",
            "model.layers.15.post_attention_layernorm.weight"}) {
        for (const LlamaParam& t : state) {
          if (t.name != name) continue;
          absl::Status s = DownloadAndCheck(client, absl::StrCat("L.", name), config.dtype, t.shape,
                                            FillKind::kRandom);
          if (!s.ok()) Die(absl::StrCat("values of L.", name, ": ", s.ToString()));
        }
      }
    }
    for (const LlamaParam& t : state) {
      if (absl::Status s = client.DeleteTensor(absl::StrCat("L.", t.name)); !s.ok()) {
        Die(s.ToString());
      }
    }
    std::filesystem::remove_all(ckpt);
  }
  cluster.reset();

  TorchResult torch;
  if (absl::GetFlag(FLAGS_torch)) {
    say("running the torch recipe");
    torch = RunTorch(state, flat, dir, reps);
  } else {
    torch.skipped = "--torch=false";
  }
  if (own_dir) std::filesystem::remove_all(dir);

  const double save_gbps = GBps(bytes, save.Best()), load_gbps = GBps(bytes, load.Best());
  const double write_gbps = GBps(bytes, disk_write.Best()),
               read_gbps = GBps(bytes, disk_read.Best());
  if (json) {
    JsonWriter w;
    w.BeginObject()
        .Key("optimized")
        .Bool(bench::kOptimizedBuild)
        .Key("bytes")
        .Int(bytes)
        .Key("tensors")
        .Int(static_cast<int64_t>(state.size()));
    w.Key("reps").Int(reps).Key("workers").Int(kWorkers);
    auto stats = [&](const char* key, const Stats& s) {
      w.Key(key).BeginObject();
      w.Key("best_seconds").Double(s.Best()).Key("median_seconds").Double(s.Median());
      w.Key("gbps")
          .Double(GBps(bytes, s.Best()))
          .Key("median_gbps")
          .Double(GBps(bytes, s.Median()));
      w.EndObject();
    };
    stats("disk_write", disk_write);
    stats("disk_read", disk_read);
    stats("disk_write_4_files", par_write);
    stats("disk_read_4_files", par_read);
    stats("save", save);
    stats("load", load);
    w.Key("load_read_phase_best_seconds").Double(read_phase.Best());
    w.Key("load_exchange_phase_best_seconds").Double(exchange_phase.Best());
    w.Key("load_busy_cpu_seconds_median").Double(load_cpu.Median());
    w.Key("load_process_cpu_seconds_best").Double(load_process_cpu.Best());
    w.Key("load_process_cpu_seconds_median").Double(load_process_cpu.Median());
    w.Key("cpus").Int(std::thread::hardware_concurrency());
    w.Key("load_bytes_read").Int(bytes_read).Key("load_bytes_exchanged").Int(exchanged);
    w.Key("load_bytes_read_direct").Int(read_direct);
    w.Key("writer_balance").Double(balance);
    w.Key("max_resident_bytes_before_reads").Int(max_resident);
    if (torch.ran) {
      stats("torch_save", torch.save);
      stats("torch_load", torch.load);
      w.Key("torch_load_bytes_read").Int(torch.bytes_read);
    } else {
      w.Key("torch_skipped").String(torch.skipped);
    }
    w.Key("save_vs_disk_write").Double(save_gbps / write_gbps);
    w.Key("load_vs_disk_read").Double(load_gbps / read_gbps);
    w.Key("save_vs_disk_write_4_files").Double(par_write.Best() / save.Best());
    w.Key("load_vs_disk_read_4_files").Double(par_read.Best() / load.Best());
    if (torch.ran) {
      w.Key("save_vs_torch").Double(torch.save.Best() / save.Best());
      w.Key("load_vs_torch").Double(torch.load.Best() / load.Best());
    }
    w.EndObject();
    std::printf("%s\n", w.str().c_str());
    return 0;
  }
  std::printf("state dict: %zu tensors, %.3f GB; %d reps; best (median) seconds and GB/s\n",
              state.size(), bytes / 1e9, reps);
  auto line = [&](const char* what, const Stats& s) {
    std::printf("  %-34s %8.3f (%8.3f) s  %6.3f GB/s\n", what, s.Best(), s.Median(),
                GBps(bytes, s.Best()));
  };
  line("disk write (one file, fsync)", disk_write);
  line("disk read (page cache evicted)", disk_read);
  line("disk write, 4 files by 4 threads", par_write);
  line("disk read, 4 files by 4 threads", par_read);
  line("shardcoord save (FSDP flat)", save);
  line("shardcoord load (-> Megatron 2x2)", load);
  std::printf(
      "    load phases: read %.3f s, exchange %.3f s; %lld bytes read (%lld with O_DIRECT), %lld "
      "exchanged\n",
      read_phase.Best(), exchange_phase.Best(), static_cast<long long>(bytes_read),
      static_cast<long long>(read_direct), static_cast<long long>(exchanged));
  std::printf("    load CPU-seconds of the coordinator and workers: best %.3f, median %.3f\n",
              load_process_cpu.Best(), load_process_cpu.Median());
  if (torch.ran) {
    line("torch.save of each rank's shards", torch.save);
    line("torch.load of all + slice", torch.load);
  } else {
    std::printf("  torch: skipped (%s)\n", torch.skipped.c_str());
  }
  std::printf("  save / disk write %.2fx (4 files: %.2fx), load / disk read %.2fx (4 files: %.2fx)",
              save_gbps / write_gbps, par_write.Best() / save.Best(), load_gbps / read_gbps,
              par_read.Best() / load.Best());
  if (torch.ran) {
    std::printf(", save %.2fx and load %.2fx faster than torch", torch.save.Best() / save.Best(),
                torch.load.Best() / load.Best());
  }
  std::printf(
      "\n  writer balance (busiest / ideal) %.3f; page cache resident before reads: %lld B\n",
      balance, static_cast<long long>(max_resident));
  return 0;
}

}  // namespace
}  // namespace shardcoord

int main(int argc, char** argv) {
  return shardcoord::bench::Main(argc, argv, "checkpoint_bench", shardcoord::Run);
}
