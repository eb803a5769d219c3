// Host cast and block-FP8 throughput: ns per element of sharding/cast.h's Cast for the common
// float pairs and of block_quant.h's DequantizeBlocks / QuantizeBlocks on a 4096 x 4096 tensor
// (128 x 128 blocks), against memcpy of the same bytes timed in the same run (the larger of
// the source and destination buffers: what a plain load of the wider side would copy). Each
// case runs --reps times; best and median are reported, and the ratios to memcpy's best and
// median. One thread, no cluster.
//
//   bazel run -c opt //bench:cast_bench -- [--json] [--reps 7] [--rows 4096] [--cols 4096]

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/status/status.h"
#include "common/json_writer.h"
#include "sharding/block_quant.h"
#include "sharding/cast.h"
#include "sharding/dtype.h"

ABSL_FLAG(bool, json, false, "Print one JSON object with every number instead of text.");
ABSL_FLAG(int, reps, 7, "Timed repetitions of each case (after one warm-up).");
ABSL_FLAG(int64_t, rows, 4096, "Rows of the tensor.");
ABSL_FLAG(int64_t, cols, 4096, "Columns of the tensor.");

namespace shardcoord {
namespace {

struct Stats {
  double best_ns = 0, median_ns = 0;  // Per element.
};

Stats Time(int reps, int64_t elements, const std::function<void()>& fn) {
  fn();  // Warm-up: page faults, one-time tables.
  std::vector<double> ns;
  for (int r = 0; r < reps; ++r) {
    const auto t0 = std::chrono::steady_clock::now();
    fn();
    const auto t1 = std::chrono::steady_clock::now();
    ns.push_back(std::chrono::duration<double, std::nano>(t1 - t0).count() /
                 static_cast<double>(elements));
  }
  std::sort(ns.begin(), ns.end());
  return Stats{ns.front(), ns[ns.size() / 2]};
}

void Check(const absl::Status& s) {
  if (!s.ok()) {
    std::fprintf(stderr, "cast_bench: %s\n", s.ToString().c_str());
    std::exit(1);
  }
}

// Random bytes of `dtype`: normal-distributed values (as a model's weights), cast from f32.
std::vector<unsigned char> Values(DType dtype, int64_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> f(static_cast<size_t>(n));
  for (float& v : f) v = normal(rng) * 40.0f;
  std::vector<unsigned char> out(static_cast<size_t>(n * ElementSize(dtype)));
  Check(Cast(f.data(), DType::kF32, out.data(), dtype, n));
  return out;
}

int Main() {
  const int reps = std::max(1, absl::GetFlag(FLAGS_reps));
  const int64_t m = absl::GetFlag(FLAGS_rows), n = absl::GetFlag(FLAGS_cols);
  const int64_t count = m * n;
  const Shape shape = {m, n};
  const BlockSize block{128, 128};
  const int64_t scale_count = ((m + 127) / 128) * ((n + 127) / 128);

  struct Result {
    std::string name;
    int64_t bytes;  // The memcpy baseline's bytes.
    Stats stats, memcpy_stats;
  };
  std::vector<Result> results;
  std::vector<unsigned char> copy_src(static_cast<size_t>(count * 8), 1),
      copy_dst(static_cast<size_t>(count * 8), 2);
  auto memcpy_stats = [&](int64_t bytes) {
    return Time(reps, count,
                [&] { std::memcpy(copy_dst.data(), copy_src.data(), static_cast<size_t>(bytes)); });
  };
  auto run = [&](const std::string& name, int64_t bytes, const std::function<void()>& fn) {
    // The baseline right before the case, so that both see the same machine state.
    const Stats base = memcpy_stats(bytes);
    const Stats s = Time(reps, count, fn);
    results.push_back(Result{name, bytes, s, base});
    if (!absl::GetFlag(FLAGS_json)) {
      std::fprintf(stderr,
                   "%-28s best %7.3f ns/elem median %7.3f | memcpy %8lld B best %6.3f median "
                   "%6.3f | x memcpy best %6.2f median %6.2f\n",
                   name.c_str(), s.best_ns, s.median_ns, static_cast<long long>(bytes),
                   base.best_ns, base.median_ns, s.best_ns / base.best_ns,
                   s.median_ns / base.median_ns);
    }
  };

  // Block-scaled FP8: quantize a model-like tensor once, then time both ways.
  std::vector<float> scales(static_cast<size_t>(scale_count));
  std::vector<unsigned char> q(static_cast<size_t>(count));
  const std::vector<unsigned char> f32 = Values(DType::kF32, count, 28);
  const std::vector<unsigned char> bf16 = Values(DType::kBF16, count, 29);
  Check(QuantizeBlocks(f32.data(), DType::kF32, shape, block, q.data(), scales.data()));
  std::vector<unsigned char> out(static_cast<size_t>(count * 4));
  run("dequantize_e4m3_to_bf16", count * 2, [&] {
    Check(DequantizeBlocks(q.data(), scales.data(), shape, block, out.data(), DType::kBF16));
  });
  run("dequantize_e4m3_to_f32", count * 4, [&] {
    Check(DequantizeBlocks(q.data(), scales.data(), shape, block, out.data(), DType::kF32));
  });
  run("quantize_f32_to_e4m3", count * 4, [&] {
    Check(QuantizeBlocks(f32.data(), DType::kF32, shape, block, out.data(), scales.data()));
  });
  run("quantize_bf16_to_e4m3", count * 2, [&] {
    Check(QuantizeBlocks(bf16.data(), DType::kBF16, shape, block, out.data(), scales.data()));
  });

  // Plain casts.
  struct Pair {
    DType from, to;
  };
  const Pair pairs[] = {
      {DType::kF8E4M3, DType::kF32}, {DType::kF8E4M3, DType::kBF16}, {DType::kF8E5M2, DType::kF32},
      {DType::kBF16, DType::kF32},   {DType::kF32, DType::kBF16},    {DType::kF16, DType::kF32},
      {DType::kF32, DType::kF16},    {DType::kF32, DType::kF8E4M3},  {DType::kBF16, DType::kF8E4M3},
      {DType::kF32, DType::kF8E5M2},
  };
  for (const Pair& p : pairs) {
    const std::vector<unsigned char> src = Values(p.from, count, 30);
    run(std::string("cast_") + std::string(DTypeName(p.from)) + "_to_" +
            std::string(DTypeName(p.to)),
        count * std::max(ElementSize(p.from), ElementSize(p.to)),
        [&] { Check(Cast(src.data(), p.from, out.data(), p.to, count)); });
  }

  if (absl::GetFlag(FLAGS_json)) {
    JsonWriter w;
    w.BeginObject().Key("rows").Int(m).Key("cols").Int(n).Key("reps").Int(reps);
    w.Key("cases").BeginArray();
    for (const Result& r : results) {
      w.BeginObject()
          .Key("name")
          .String(r.name)
          .Key("ns_per_element_best")
          .Double(r.stats.best_ns)
          .Key("ns_per_element_median")
          .Double(r.stats.median_ns)
          .Key("memcpy_bytes")
          .Int(r.bytes)
          .Key("memcpy_ns_per_element_best")
          .Double(r.memcpy_stats.best_ns)
          .Key("memcpy_ns_per_element_median")
          .Double(r.memcpy_stats.median_ns)
          .Key("ratio_to_memcpy_best")
          .Double(r.stats.best_ns / r.memcpy_stats.best_ns)
          .Key("ratio_to_memcpy_median")
          .Double(r.stats.median_ns / r.memcpy_stats.median_ns)
          .EndObject();
    }
    w.EndArray().EndObject();
    std::printf("%s\n", w.str().c_str());
  }
  return 0;
}

}  // namespace
}  // namespace shardcoord

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  return shardcoord::Main();
}
