// GPU benchmark of the NCCL backend: every Communicator op through NcclCommunicator (one rank
// per visible GPU, in threads), plus the pack and checksum kernels. Bandwidths follow
// nccl-tests (doc/PERFORMANCE.md there): for a "size" S and time t, algbw = S / t and
//   busbw = algbw * (n-1)/n    all-gather (S = all ranks' data), reduce-scatter (S = one
//                              rank's input), all-to-all (S = one rank's send buffer)
//   busbw = algbw * 2(n-1)/n   all-reduce
//   busbw = algbw              broadcast, send-recv (S = bytes per rank)
// so the numbers compare directly with all_gather_perf, all_reduce_perf, ... at the same S.
//
//   nccl_bench [--ranks N] [--min-bytes B] [--max-bytes B] [--iters K] [--warmup W] [--json]
//
// Prints a table, or one JSON object with --json. Exits 2 with "no CUDA device visible: ..."
// when there is no GPU.
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "CLI/CLI.hpp"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "sharding/box.h"
#include "worker/comm/nccl/cuda_nccl_api.h"
#include "worker/comm/nccl/device_buffer.h"
#include "worker/comm/nccl/device_ops.h"
#include "worker/comm/nccl/gpu_probe.h"
#include "worker/comm/nccl/nccl_backend.h"
#include "worker/comm/nccl/nccl_communicator.h"
#include "worker/control/kv_client.h"

namespace shardcoord {
namespace nccl {
namespace {

struct Result {
  std::string op;
  int ranks = 0;
  int64_t bytes = 0;
  double seconds = 0;      // Per op, slowest rank.
  double bus_factor = -1;  // < 0: not a collective (kernels).
};

struct Flags {
  int ranks = 0;
  int64_t min_bytes = 1 << 10;
  int64_t max_bytes = 64 << 20;
  int iters = 20;
  int warmup = 5;
  bool json = false;
};

struct Rank {
  std::shared_ptr<NcclCommunicator> comm;
  DeviceBuffer send;
  DeviceBuffer recv;
};

// Runs `op` on every rank `warmup` + `iters` times; returns the slowest rank's time per op.
double TimeOp(std::vector<Rank>& ranks, const Flags& flags,
              const std::function<absl::Status(int, Rank&, uint32_t)>& op, bool* ok) {
  const int n = static_cast<int>(ranks.size());
  std::vector<double> seconds(n, 0);
  std::vector<absl::Status> status(n);
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r) {
    threads.emplace_back([&, r] {
      cudaSetDevice(r);
      uint32_t tag = 0;
      for (int i = 0; i < flags.warmup && status[r].ok(); ++i) status[r] = op(r, ranks[r], tag++);
      const absl::Time start = absl::Now();
      for (int i = 0; i < flags.iters && status[r].ok(); ++i) status[r] = op(r, ranks[r], tag++);
      seconds[r] = absl::ToDoubleSeconds(absl::Now() - start) / flags.iters;
    });
  }
  for (auto& t : threads) t.join();
  for (int r = 0; r < n; ++r) {
    if (!status[r].ok()) {
      std::fprintf(stderr, "rank %d: %s\n", r, std::string(status[r].message()).c_str());
      *ok = false;
    }
  }
  return *std::max_element(seconds.begin(), seconds.end());
}

std::vector<int64_t> Split(int64_t total, int n) { return std::vector<int64_t>(n, total / n); }

int Run(const Flags& flags) {
  absl::StatusOr<int> visible = VisibleCudaDevices();
  if (!visible.ok()) {
    std::fprintf(stderr, "%s\n", std::string(visible.status().message()).c_str());
    return 2;
  }
  const int n = flags.ranks > 0 ? std::min(flags.ranks, *visible) : *visible;
  cudaDeviceProp prop;
  cudaGetDeviceProperties(&prop, 0);

  // One communicator per GPU, built concurrently (the init is collective).
  auto kv = std::make_shared<InMemoryKvClient>();
  std::vector<Rank> ranks(n);
  {
    std::vector<std::thread> threads;
    std::vector<absl::Status> status(n);
    for (int r = 0; r < n; ++r) {
      threads.emplace_back([&, r] {
        CommunicatorSpec spec;
        for (int q = 0; q < n; ++q) {
          spec.ranks.push_back(q);
          spec.incarnations.push_back(0);
        }
        spec.my_rank = r;
        spec.key_prefix = "bench";
        spec.timeout = absl::Seconds(120);
        NcclFactoryOptions options;
        options.device = r;
        absl::StatusOr<std::shared_ptr<Communicator>> c =
            MakeNcclCommunicatorFactory(kv, options)->Create(spec);
        if (!c.ok()) {
          status[r] = c.status();
          return;
        }
        ranks[r].comm = std::dynamic_pointer_cast<NcclCommunicator>(*c);
        absl::StatusOr<DeviceBuffer> s = DeviceBuffer::Allocate(flags.max_bytes, r);
        absl::StatusOr<DeviceBuffer> v = DeviceBuffer::Allocate(flags.max_bytes, r);
        if (!s.ok() || !v.ok()) {
          status[r] = s.ok() ? v.status() : s.status();
          return;
        }
        ranks[r].send = std::move(*s);
        ranks[r].recv = std::move(*v);
        status[r] = ranks[r].send.Fill(1);
      });
    }
    for (auto& t : threads) t.join();
    for (const absl::Status& s : status) {
      if (!s.ok()) {
        std::fprintf(stderr, "setup failed: %s\n", std::string(s.message()).c_str());
        return 1;
      }
    }
  }

  std::vector<Result> results;
  bool ok = true;
  const double nm1 = n > 1 ? static_cast<double>(n - 1) / n : 0.0;
  for (int64_t size = flags.min_bytes; size <= flags.max_bytes; size *= 4) {
    const int64_t s = size / (4 * n) * (4 * n);  // Whole f32 elements per rank.
    if (s == 0) continue;
    auto add = [&](const std::string& op, double factor,
                   const std::function<absl::Status(int, Rank&, uint32_t)>& fn) {
      results.push_back({op, n, s, TimeOp(ranks, flags, fn, &ok), factor});
    };
    auto opts = [](uint32_t tag) {
      CommOptions o;
      o.tag = tag;
      return o;
    };
    add("all_gather", nm1, [&](int r, Rank& k, uint32_t tag) {
      return k.comm->AllGatherV(k.send.data(), s / n, k.recv.data(), Split(s, n), opts(tag));
    });
    add("reduce_scatter", nm1, [&](int r, Rank& k, uint32_t tag) {
      return k.comm->ReduceScatterV(k.send.data(), k.recv.data(), Split(s / 4, n), DType::kF32,
                                    ReduceOp::kSum, opts(tag));
    });
    add("all_reduce", 2 * nm1, [&](int r, Rank& k, uint32_t tag) {
      return k.comm->AllReduce(k.send.data(), k.recv.data(), s / 4, DType::kF32, ReduceOp::kSum,
                               opts(tag));
    });
    add("broadcast", 1.0, [&](int r, Rank& k, uint32_t tag) {
      return k.comm->Broadcast(k.recv.data(), s, 0, opts(tag));
    });
    add("all_to_all", nm1, [&](int r, Rank& k, uint32_t tag) {
      return k.comm->AllToAllV(k.send.data(), Split(s, n), k.recv.data(), Split(s, n), opts(tag));
    });
    if (n > 1) {
      add("send_recv", 1.0, [&](int r, Rank& k, uint32_t tag) {
        const SendOp send{(r + 1) % n, k.send.data(), s};
        const RecvOp recv{(r + n - 1) % n, k.recv.data(), s};
        return k.comm->SendRecv({&send, 1}, {&recv, 1}, opts(tag));
      });
    }
  }

  // Kernels on GPU 0: pack half the columns of a [rows, 2*cols] f32 chunk (a 2-D strided
  // copy), pack a [4, rows, cols/2] box out of [8, rows, cols] (the generic kernel), and the
  // device checksum. Bytes = bytes packed / hashed.
  {
    cudaSetDevice(0);
    cudaStream_t stream;
    cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking);
    Rank& k = ranks[0];
    for (int64_t size = flags.min_bytes; size <= flags.max_bytes / 2; size *= 4) {
      const int64_t cols = 256;
      const int64_t rows = std::max<int64_t>(1, size / (4 * cols));
      const int64_t moved = rows * cols * 4;
      auto time_kernel = [&](const std::string& op, const std::function<absl::Status()>& fn) {
        absl::Status st;
        for (int i = 0; i < flags.warmup && st.ok(); ++i) st = fn();
        cudaStreamSynchronize(stream);
        const absl::Time start = absl::Now();
        for (int i = 0; i < flags.iters && st.ok(); ++i) st = fn();
        cudaStreamSynchronize(stream);
        const double t = absl::ToDoubleSeconds(absl::Now() - start) / flags.iters;
        if (!st.ok()) {
          std::fprintf(stderr, "%s: %s\n", op.c_str(), std::string(st.message()).c_str());
          ok = false;
        }
        results.push_back({op, 1, moved, t, -1});
      };
      time_kernel("pack_2d", [&] {
        return DevicePackBox(Box({0, 0}, {rows, cols}), k.send.data(),
                             Box({0, 0}, {rows, 2 * cols}), k.recv.data(), 4, stream);
      });
      const int64_t rows3 = std::max<int64_t>(1, rows / 4);
      time_kernel("pack_3d", [&] {
        return DevicePackBox(Box({2, 0, 0}, {4, rows3, cols / 2}), k.send.data(),
                             Box({0, 0, 0}, {8, rows3, cols / 2 * 2}), k.recv.data(), 4, stream);
      });
      time_kernel("checksum",
                  [&] { return DeviceChunkChecksum(k.send.data(), moved, stream).status(); });
      // The same bytes as 64 chunks (a plan's or a group's chunks) in one launch.
      std::vector<ChecksumRegion> parts;
      for (int64_t i = 0; i < 64; ++i) {
        parts.push_back({static_cast<const char*>(k.send.data()) + moved * i / 64,
                         moved * (i + 1) / 64 - moved * i / 64});
      }
      time_kernel("checksum_x64", [&] { return DeviceChunkChecksums(parts, stream).status(); });
    }
    cudaStreamDestroy(stream);
  }

  if (flags.json) {
    std::vector<std::string> rows;
    for (const Result& r : results) {
      const double algbw = r.bytes / r.seconds / 1e9;
      rows.push_back(absl::StrFormat(
          "{\"op\":\"%s\",\"ranks\":%d,\"bytes\":%d,\"time_us\":%.3f,\"algbw_gbps\":%.3f,"
          "\"busbw_gbps\":%s,\"busbw_factor\":%s}",
          r.op, r.ranks, r.bytes, r.seconds * 1e6, algbw,
          r.bus_factor < 0 ? "null" : absl::StrFormat("%.3f", algbw * r.bus_factor),
          r.bus_factor < 0 ? "null" : absl::StrFormat("%.4f", r.bus_factor)));
    }
    std::printf(
        "{\"benchmark\":\"nccl_bench\",\"device\":\"%s\",\"visible_devices\":%d,\"nccl\":\"%s\","
        "\"ranks\":%d,\"iters\":%d,\"warmup\":%d,\"ok\":%s,\"results\":[%s]}\n",
        prop.name, *visible, NcclVersionString().c_str(), n, flags.iters, flags.warmup,
        ok ? "true" : "false", absl::StrJoin(rows, ",").c_str());
  } else {
    std::printf("# nccl_bench on %d x %s, NCCL %s, %d iters (+%d warmup)\n", n, prop.name,
                NcclVersionString().c_str(), flags.iters, flags.warmup);
    std::printf("%-15s %5s %12s %12s %12s %12s\n", "op", "ranks", "bytes", "time_us", "algbw_GB/s",
                "busbw_GB/s");
    for (const Result& r : results) {
      const double algbw = r.bytes / r.seconds / 1e9;
      std::printf("%-15s %5d %12lld %12.2f %12.2f %12s\n", r.op.c_str(), r.ranks,
                  static_cast<long long>(r.bytes), r.seconds * 1e6, algbw,
                  r.bus_factor < 0 ? "-" : absl::StrFormat("%.2f", algbw * r.bus_factor).c_str());
    }
    if (n == 1) {
      std::printf(
          "# one rank: bus bandwidth of all-gather, reduce-scatter, all-to-all and "
          "all-reduce is 0 by definition ((n-1)/n = 0)\n");
    }
  }
  return ok ? 0 : 1;
}

}  // namespace
}  // namespace nccl
}  // namespace shardcoord

int main(int argc, char** argv) {
  shardcoord::nccl::Flags flags;
  CLI::App app("Bus bandwidth of the NCCL backend's ops and its kernels (nccl-tests formulas)");
  app.add_option("--ranks", flags.ranks, "ranks, one per GPU (default: every visible GPU)");
  app.add_option("--min-bytes", flags.min_bytes, "smallest size");
  app.add_option("--max-bytes", flags.max_bytes, "largest size (sizes grow 4x)");
  app.add_option("--iters", flags.iters, "timed iterations per size");
  app.add_option("--warmup", flags.warmup, "untimed iterations per size");
  app.add_flag("--json", flags.json, "one JSON object instead of a table");
  CLI11_PARSE(app, argc, argv);
  if (flags.min_bytes <= 0 || flags.max_bytes < flags.min_bytes || flags.iters <= 0 ||
      flags.warmup < 0) {
    std::fprintf(stderr, "need 0 < --min-bytes <= --max-bytes, --iters > 0, --warmup >= 0\n");
    return 1;
  }
  return shardcoord::nccl::Run(flags);
}
