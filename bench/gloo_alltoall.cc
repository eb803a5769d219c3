// One rank of a raw Gloo all-to-all(v): the baseline //bench:e2e_bench compares shardcoord's
// redistribute against. Started once per rank; ranks rendezvous through a
// gloo::rendezvous::FileStore in a shared directory, connect a full mesh over TCP on
// loopback, then time alltoallv with the byte matrix given on the command line (the bytes
// the redistribute plan moves between each pair of ranks).
//
//   gloo_alltoall --rank 0 --size 4 --store_dir /tmp/x --matrix 0,16,16,16,16,0,...
//
// Prints one JSON line: {"rank":0,"size":4,"setup_seconds":..,"bytes":..,"seconds":[..]}.
// Every iteration is bracketed by barriers, so rank 0's time covers every rank's transfer.

#include <gloo/alltoallv.h>
#include <gloo/barrier.h>
#include <gloo/rendezvous/context.h>
#include <gloo/rendezvous/file_store.h>
#include <gloo/transport/tcp/device.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <exception>
#include <memory>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"

ABSL_FLAG(int, rank, -1, "This process's rank in [0, size).");
ABSL_FLAG(int, size, 4, "Number of ranks.");
ABSL_FLAG(std::string, store_dir, "", "Directory of the Gloo FileStore (shared by all ranks).");
ABSL_FLAG(std::string, matrix, "",
          "size*size comma-separated byte counts, row-major: entry [i*size+j] is what rank i "
          "sends to rank j.");
ABSL_FLAG(int, iters, 5, "Timed iterations.");
ABSL_FLAG(int, warmup, 1, "Untimed iterations first.");
ABSL_FLAG(std::string, hostname, "127.0.0.1", "Address of the TCP device.");
ABSL_FLAG(int, timeout_seconds, 300, "Gloo timeout.");

namespace {

int Fail(const std::string& message) {
  std::fprintf(stderr, "gloo_alltoall: %s\n", message.c_str());
  return 1;
}

}  // namespace

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  const int rank = absl::GetFlag(FLAGS_rank);
  const int size = absl::GetFlag(FLAGS_size);
  if (size < 1 || rank < 0 || rank >= size) {
    return Fail(absl::StrCat("--rank ", rank, " is not in [0, --size ", size, ")"));
  }
  if (absl::GetFlag(FLAGS_store_dir).empty()) return Fail("--store_dir is required");
  std::vector<int64_t> matrix;
  for (absl::string_view item : absl::StrSplit(absl::GetFlag(FLAGS_matrix), ',')) {
    int64_t v;
    if (!absl::SimpleAtoi(item, &v) || v < 0) {
      return Fail(absl::StrCat("--matrix entry '", item, "' is not a byte count"));
    }
    matrix.push_back(v);
  }
  if (static_cast<int>(matrix.size()) != size * size) {
    return Fail(absl::StrCat("--matrix has ", matrix.size(), " entries, want ", size * size));
  }
  std::vector<int64_t> send_counts(size), recv_counts(size);
  int64_t send_total = 0, recv_total = 0, moved = 0;
  for (int j = 0; j < size; ++j) {
    send_counts[j] = matrix[rank * size + j];
    recv_counts[j] = matrix[j * size + rank];
    send_total += send_counts[j];
    recv_total += recv_counts[j];
  }
  for (int i = 0; i < size; ++i) {
    for (int j = 0; j < size; ++j) {
      if (i != j) moved += matrix[i * size + j];
    }
  }
  // Touch every page before timing: first-touch faults are not the transport's cost.
  std::vector<char> send(static_cast<size_t>(send_total) + 1, static_cast<char>(rank + 1));
  std::vector<char> recv(static_cast<size_t>(recv_total) + 1, 0);

  try {
    const auto timeout = std::chrono::seconds(absl::GetFlag(FLAGS_timeout_seconds));
    const absl::Time setup_start = absl::Now();
    gloo::transport::tcp::attr attr;
    attr.hostname = absl::GetFlag(FLAGS_hostname);
    auto device = gloo::transport::tcp::CreateDevice(attr);
    gloo::rendezvous::FileStore store(absl::GetFlag(FLAGS_store_dir));
    auto context = std::make_shared<gloo::rendezvous::Context>(rank, size);
    context->setTimeout(timeout);
    context->connectFullMesh(store, device);
    const double setup_seconds = absl::ToDoubleSeconds(absl::Now() - setup_start);

    uint32_t tag = 1;
    auto barrier = [&] {
      gloo::BarrierOptions opts(context);
      opts.setTag(tag++);
      opts.setTimeout(timeout);
      gloo::barrier(opts);
    };
    auto alltoallv = [&] {
      gloo::AlltoallvOptions opts(context);
      opts.setInput(send.data(), send_counts);
      opts.setOutput(recv.data(), recv_counts);
      opts.setTag(tag++);
      opts.setTimeout(timeout);
      gloo::alltoallv(opts);
    };
    for (int i = 0; i < absl::GetFlag(FLAGS_warmup); ++i) {
      barrier();
      alltoallv();
    }
    std::vector<double> seconds;
    for (int i = 0; i < absl::GetFlag(FLAGS_iters); ++i) {
      barrier();
      const absl::Time start = absl::Now();
      alltoallv();
      barrier();
      seconds.push_back(absl::ToDoubleSeconds(absl::Now() - start));
    }
    // Each received block holds its sender's fill byte: a cheap check that data moved.
    int64_t offset = 0;
    for (int j = 0; j < size; ++j) {
      for (int64_t k = 0; k < recv_counts[j]; k += 4096) {
        if (recv[offset + k] != static_cast<char>(j + 1)) {
          return Fail(absl::StrCat("rank ", rank, " received wrong data from rank ", j));
        }
      }
      offset += recv_counts[j];
    }
    std::printf(
        "{\"rank\":%d,\"size\":%d,\"setup_seconds\":%.6f,\"bytes\":%lld,\"seconds\":[%s]}\n", rank,
        size, setup_seconds, static_cast<long long>(moved),
        absl::StrJoin(seconds, ",", [](std::string* out, double s) {
          absl::StrAppend(out, s);
        }).c_str());
    std::fflush(stdout);
  } catch (const std::exception& e) {
    return Fail(absl::StrCat("rank ", rank, ": ", e.what()));
  }
  return 0;
}
