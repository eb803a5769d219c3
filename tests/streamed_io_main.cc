// The main() of the streamed I/O tests: one cluster whose coordinator uses small bands.

#include "tests/streamed_io_main.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "tests/cluster_environment.h"

int main(int argc, char** argv) {
  shardcoord::ClusterOptions options;
  options.coordinator_flags = {absl::StrCat("--io-band-bytes=", shardcoord::kStreamedIoBandBytes)};
  return shardcoord::RunWithCluster(argc, argv, std::move(options));
}
