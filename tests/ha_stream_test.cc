// Issue 25, acceptance 2: streams fail over like unary calls. Two coordinators on one etcd
// (Debian's etcd-server, started by the test in TEST_TMPDIR) and four Gloo workers given both
// addresses (tests/ha_cluster.h); every client is given both addresses too.
//
// ShardctlDownloadAndUploadAfterTheLeaderIsKilled: a tensor is uploaded, the leader is
// SIGKILLed, and at once the real shardctl binary downloads it and uploads another with
// `--coordinator A,B --wait 90s`: both succeed (through the standby's refusals until it leads)
// and the values are exact, every byte of the .npy file checked.
//
// StreamsBrokenMidwayBySigkillResumeOrRestart: the C++ client's Download and Upload, each with
// the leader SIGKILLed while the stream moves data (from the client's own data and progress
// callbacks, so the kill lands mid-stream by construction): the download resumes on the new
// leader without a duplicated byte (the same version: the bytes equal the uploaded ones), the
// upload is restarted whole and commits once (one new version, every value the new data's).
//
// Skips when the etcd binary is missing.

#include <sys/wait.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "client/coordinator_client.h"
#include "client/npy.h"
#include "gtest/gtest.h"
#include "sharding/dtype.h"
#include "tests/etcd_process.h"
#include "tests/ha_cluster.h"
#include "tests/process.h"
#include "tests/tensor_check.h"

namespace shardcoord {
namespace {

constexpr int kWorkers = 4;
constexpr uint64_t kSeed = 20261202;
constexpr absl::Duration kRetryFor = absl::Seconds(90);
constexpr absl::Duration kStartTimeout = absl::Seconds(60);
// [1024, 1024] f32: 4 MiB, four 1 MiB messages, for shardctl.
const Shape kShape = {1024, 1024};
// [4096, 4096] f32: 64 MiB, far more than gRPC's flow-control windows hold, so that a stream
// stopped in a callback while its leader is killed cannot have been sent whole before.
const Shape kBigShape = {4096, 4096};

// f32 values from a seeded generator, as little-endian bytes.
std::string RandomF32(const Shape& shape, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> dist(-1000.0f, 1000.0f);
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  std::string out(static_cast<size_t>(n) * 4, '\0');
  for (int64_t i = 0; i < n; ++i) {
    const float v = dist(rng);
    std::memcpy(out.data() + i * 4, &v, 4);
  }
  return out;
}

// How many f32 elements differ (bit for bit), and the first one that does, as a message.
std::string CompareF32(const std::string& got, const std::string& want) {
  if (got.size() != want.size()) {
    return absl::StrCat(got.size(), " bytes, want ", want.size());
  }
  int64_t differ = 0;
  int64_t first = -1;
  for (size_t i = 0; i < want.size(); i += 4) {
    if (std::memcmp(got.data() + i, want.data() + i, 4) != 0) {
      if (first < 0) first = static_cast<int64_t>(i / 4);
      ++differ;
    }
  }
  if (differ == 0) return "";
  return absl::StrCat(differ, " of ", want.size() / 4, " values differ, the first at element ",
                      first);
}

using CliResult = CommandResult;

// The real shardctl (runfiles) with `args` and both coordinators; its exit code and output.
CliResult RunShardctl(const std::string& coordinators, std::vector<std::string> args) {
  args.insert(args.end(),
              {"--coordinator", coordinators, "--wait", absl::FormatDuration(kRetryFor)});
  return shardcoord::RunShardctl(args);
}

std::string TempPath(const std::string& name) {
  return absl::StrCat(std::getenv("TEST_TMPDIR"), "/", name);
}

v1::TensorHeader Header(const std::string& name, const Shape& shape, const std::string& mesh,
                        const std::string& placements) {
  v1::TensorHeader h;
  h.set_name(name);
  for (int64_t d : shape) h.add_shape(d);
  h.set_dtype(v1::F32);
  h.mutable_spec()->set_mesh(mesh);
  h.mutable_spec()->set_placements_text(placements);
  return h;
}

class HaStreamTest : public ::testing::Test {
 protected:
  void SetUp() override {
    absl::StatusOr<std::string> etcd = EtcdProcess::FindBinary();
    if (!etcd.ok()) GTEST_SKIP() << etcd.status().message();
  }

  void StartCluster(const std::string& name) {
    HaClusterOptions o;
    o.name = name;
    o.tmp_dir = std::getenv("TEST_TMPDIR");
    const char* out = std::getenv("TEST_UNDECLARED_OUTPUTS_DIR");
    o.log_dir = out != nullptr ? out : o.tmp_dir;
    // Bands of 256 KiB: a download is fetched from the workers in 16 bands.
    o.coordinator_flags = {"--leader-ttl=5s", "--heartbeat-timeout=3s",
                           "--heartbeat-interval=200ms", "--recovery-timeout=60s",
                           "--io-band-bytes=262144"};
    o.num_workers = kWorkers;
    o.start_timeout = kStartTimeout;
    o.client_retry_for = kRetryFor;
    absl::StatusOr<std::unique_ptr<HaCluster>> started = HaCluster::Start(std::move(o));
    ASSERT_TRUE(started.ok()) << started.status();
    cluster_ = *std::move(started);
    ASSERT_TRUE(cluster_->WaitForWorkersAlive(kStartTimeout).ok());
    ASSERT_TRUE(MakeMesh(cluster_->client(), "grid", {2, 2}, {"w0", "w1", "w2", "w3"}).ok());
  }

  // Kills the leader c<leader_>; the standby takes over (it prints its listening line once
  // elected) and the killed one is started again as a standby, as its supervisor would.
  // Called from a client's callback, it must not block on that client: it only waits for
  // the coordinators' own lines.
  absl::Status FailOver() {
    const int was = leader_;
    if (absl::Status s = cluster_->KillCoordinator(was); !s.ok()) return s;
    absl::StatusOr<std::string> took_over =
        cluster_->coordinator(1 - was)->WaitForLine(kListeningLine, kStartTimeout);
    if (!took_over.ok()) return took_over.status();
    leader_ = 1 - was;
    return cluster_->StartCoordinator(was, kStandbyLine);
  }

  std::unique_ptr<HaCluster> cluster_;
  int leader_ = 0;
};

TEST_F(HaStreamTest, ShardctlDownloadAndUploadAfterTheLeaderIsKilled) {
  ASSERT_NO_FATAL_FAILURE(StartCluster("shardctl"));
  CoordinatorClient& client = cluster_->client();
  const std::string first = RandomF32(kShape, kSeed);
  absl::StatusOr<v1::TensorInfo> up =
      client.Upload(Header("t", kShape, "grid", "S(0),S(1)"), first);
  ASSERT_TRUE(up.ok()) << up.status();

  // SIGKILL, and shardctl at once: its first calls meet a dead leader and a standby that does
  // not lead yet; --wait covers the election.
  ASSERT_TRUE(cluster_->KillCoordinator(0).ok());
  const std::string out_path = TempPath("t.npy");
  CliResult down = RunShardctl(cluster_->all(), {"tensor", "download", "t", "--out", out_path});
  ASSERT_EQ(down.exit_code, 0) << down.output;
  absl::StatusOr<NpyArray> file = ReadNpyFile(out_path);
  ASSERT_TRUE(file.ok()) << file.status();
  EXPECT_EQ(file->dtype, DType::kF32);
  EXPECT_EQ(file->shape, kShape);
  EXPECT_EQ(CompareF32(file->data, first), "");
  EXPECT_TRUE(PrintedLine(cluster_->coordinator(1), kListeningLine));
  leader_ = 1;

  // The same again for an upload, through a fresh failover: c0 back as a standby, c1 killed.
  ASSERT_TRUE(cluster_->StartCoordinator(0, kStandbyLine).ok());
  const std::string second = RandomF32(kShape, kSeed + 1);
  const std::string in_path = TempPath("u.npy");
  ASSERT_TRUE(WriteNpyFile(in_path, DType::kF32, kShape, second).ok());
  ASSERT_TRUE(cluster_->KillCoordinator(1).ok());
  CliResult upload = RunShardctl(cluster_->all(), {"tensor", "upload", "u", "--mesh", "grid",
                                                   "--placements", "S(1),S(0)", "--from", in_path});
  ASSERT_EQ(upload.exit_code, 0) << upload.output;
  leader_ = 0;
  std::string got;
  absl::StatusOr<v1::TensorHeader> h = client.Download("u", &got);
  ASSERT_TRUE(h.ok()) << h.status();
  EXPECT_EQ(CompareF32(got, second), "");
  // The first tensor came through both failovers too.
  h = client.Download("t", &got);
  ASSERT_TRUE(h.ok()) << h.status();
  EXPECT_EQ(CompareF32(got, first), "");
  std::cerr << "ha_stream: shardctl download and upload through two failovers, " << kShape[0] << "x"
            << kShape[1] << " f32 each, every value checked\n";
}

TEST_F(HaStreamTest, StreamsBrokenMidwayBySigkillResumeOrRestart) {
  ASSERT_NO_FATAL_FAILURE(StartCluster("midway"));
  CoordinatorClient& client = cluster_->client();
  const std::string first = RandomF32(kBigShape, kSeed + 2);
  absl::StatusOr<v1::TensorInfo> up =
      client.Upload(Header("t", kBigShape, "grid", "S(0),S(1)"), first);
  ASSERT_TRUE(up.ok()) << up.status();
  const int64_t version = up->version();

  // Download: the leader dies after the first message's data was handed over (the rest, far
  // beyond what flow control let it send, can only come from the new leader).
  {
    CoordinatorClient reader(cluster_->all(), cluster_->client().options());
    std::string got;
    int headers = 0;
    int64_t delivered_at_kill = -1;
    absl::Status killed;
    absl::StatusOr<v1::TensorHeader> h = reader.DownloadTo(
        "t",
        [&](const v1::TensorHeader& header) {
          ++headers;
          EXPECT_EQ(header.version(), version);
          return absl::OkStatus();
        },
        [&](absl::string_view piece) {
          got.append(piece.data(), piece.size());
          if (delivered_at_kill < 0) {
            delivered_at_kill = static_cast<int64_t>(got.size());
            killed = FailOver();
          }
          return absl::OkStatus();
        });
    ASSERT_TRUE(killed.ok()) << killed;
    ASSERT_TRUE(h.ok()) << h.status();
    EXPECT_EQ(h->version(), version);
    EXPECT_EQ(headers, 1);
    ASSERT_GT(delivered_at_kill, 0);
    ASSERT_LT(delivered_at_kill, static_cast<int64_t>(first.size()));
    EXPECT_EQ(CompareF32(got, first), "");  // Exact, so no byte came twice or went missing.
  }

  // Upload: the leader dies after the first data message was sent; the upload starts again
  // from its first byte at the new leader and commits once.
  {
    CoordinatorClient writer(cluster_->all(), cluster_->client().options());
    const std::string second = RandomF32(kBigShape, kSeed + 3);
    std::vector<int64_t> progress;
    absl::Status killed;
    bool did_kill = false;
    absl::StatusOr<v1::TensorInfo> info = writer.Upload(Header("t", kBigShape, "grid", "S(1),S(0)"),
                                                        second, [&](int64_t done, int64_t) {
                                                          progress.push_back(done);
                                                          if (!did_kill) {
                                                            did_kill = true;
                                                            killed = FailOver();
                                                          }
                                                        });
    ASSERT_TRUE(killed.ok()) << killed;
    ASSERT_TRUE(info.ok()) << info.status();
    EXPECT_GT(info->version(), version);
    EXPECT_EQ(info->spec(), "S(1),S(0)");
    // Restarted: the progress began again at the first message after the kill (it ran in the
    // first message's callback, so no more was sent to the dead leader).
    ASSERT_FALSE(progress.empty());
    EXPECT_GE(std::count(progress.begin(), progress.end(), progress[0]), 2);
    EXPECT_EQ(progress.back(), static_cast<int64_t>(second.size()));
    absl::StatusOr<v1::TensorInfo> now = client.GetTensor("t");
    ASSERT_TRUE(now.ok()) << now.status();
    EXPECT_EQ(now->version(), info->version());
    EXPECT_EQ(now->spec(), "S(1),S(0)");
    std::string got;
    absl::StatusOr<v1::TensorHeader> h = client.Download("t", &got);
    ASSERT_TRUE(h.ok()) << h.status();
    EXPECT_EQ(CompareF32(got, second), "");
    absl::StatusOr<std::vector<v1::TensorInfo>> all = client.ListTensors();
    ASSERT_TRUE(all.ok()) << all.status();
    EXPECT_EQ(all->size(), 1u);  // Nothing but "t", half-uploaded or otherwise.
  }
  std::cerr << "ha_stream: a download resumed and an upload restarted across SIGKILLs of the "
               "leader, every value checked\n";
}

}  // namespace
}  // namespace shardcoord
