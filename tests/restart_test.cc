// A coordinator that survives itself (issue 12): the coordinator keeps its state in SQLite
// (--state-dir under TEST_TMPDIR), is SIGKILLed at several moments - after committed moves,
// right after starting a move, right after a delete - and restarted on the same address
// with the same state dir. The workers keep their buffers, register again under the same
// names and report what they hold; the test waits (polling GetTensor) until every tensor is
// readable again, then checks every value by download, that no rank changed, that deleted
// tensors stay deleted and that new plans run.

#include <cstdlib>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/cluster.h"
#include "tests/tensor_check.h"

namespace shardcoord {
namespace {

const Shape kShape = {96, 40};
constexpr absl::Duration kWait = absl::Seconds(60);
// How often a poll asks again: GetTensor answers UNAVAILABLE until the tensor is recovered
// and there is no notification to wait on.
constexpr absl::Duration kPoll = absl::Milliseconds(20);

// Polls GetTensor until the tensor is readable (not UNAVAILABLE: recovering, or the
// coordinator not answering yet). Other errors return at once.
absl::StatusOr<v1::TensorInfo> WaitReadable(Cluster& cluster, const std::string& name) {
  const absl::Time deadline = absl::Now() + kWait;
  while (true) {
    absl::StatusOr<v1::TensorInfo> t = cluster.client().GetTensor(name);
    if (t.ok() || t.status().code() != absl::StatusCode::kUnavailable) return t;
    if (absl::Now() >= deadline) {
      return absl::DeadlineExceededError(absl::StrCat(
          name, " not readable within ", absl::FormatDuration(kWait), ": ", t.status().ToString()));
    }
    absl::SleepFor(kPoll);
  }
}

std::map<std::string, int64_t> Ranks(Cluster& cluster) {
  std::map<std::string, int64_t> out;
  absl::StatusOr<std::vector<v1::WorkerInfo>> workers = cluster.client().ListWorkers();
  EXPECT_TRUE(workers.ok()) << workers.status();
  if (workers.ok()) {
    for (const v1::WorkerInfo& w : *workers) out[w.name()] = w.rank();
  }
  return out;
}

class RestartTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ClusterOptions options;
    options.state_dir =
        absl::StrCat(std::getenv("TEST_TMPDIR"), "/state-",
                     ::testing::UnitTest::GetInstance()->current_test_info()->name());
    options.coordinator_flags = {"--heartbeat-timeout=3s", "--heartbeat-interval=200ms",
                                 "--recovery-timeout=60s"};
    absl::StatusOr<std::unique_ptr<Cluster>> cluster = Cluster::Start(options);
    ASSERT_TRUE(cluster.ok()) << cluster.status();
    cluster_ = *std::move(cluster);
    ASSERT_TRUE(MakeMesh(client(), "grid", {2, 2}, {"w0", "w1", "w2", "w3"}, {"dp", "tp"}).ok());
    ASSERT_TRUE(MakeMesh(client(), "line", {4}, {"w3", "w2", "w1", "w0"}).ok());
    ranks_ = Ranks(*cluster_);
    ASSERT_EQ(ranks_.size(), 4u);
  }

  CoordinatorClient& client() { return cluster_->client(); }

  // Kills and restarts the coordinator, then waits until every tensor in `names` is
  // readable; checks that ranks and meshes did not change.
  void Restart(const std::vector<std::string>& names) {
    ASSERT_TRUE(cluster_->KillCoordinator().ok());
    absl::Status restarted = cluster_->RestartCoordinator(kWait);
    ASSERT_TRUE(restarted.ok()) << restarted;
    for (const std::string& name : names) {
      absl::StatusOr<v1::TensorInfo> t = WaitReadable(*cluster_, name);
      ASSERT_TRUE(t.ok()) << name << ": " << t.status();
      EXPECT_EQ(t->lost_chunks_size(), 0) << name << ": " << t->lost_chunks(0);
    }
    EXPECT_EQ(Ranks(*cluster_), ranks_);
    absl::StatusOr<v1::MeshInfo> line = client().GetMesh("line");
    ASSERT_TRUE(line.ok()) << line.status();
    EXPECT_THAT(line->workers(), ::testing::ElementsAre("w3", "w2", "w1", "w0"));
    EXPECT_TRUE(cluster_->WaitForWorkers(cluster_->WorkerNames(), v1::ALIVE, kWait).ok());
  }

  void ExpectArange(const std::string& name, int64_t version, const std::string& mesh,
                    const std::string& spec) {
    absl::StatusOr<v1::TensorInfo> t = client().GetTensor(name);
    ASSERT_TRUE(t.ok()) << name << ": " << t.status();
    EXPECT_EQ(t->version(), version) << name;
    EXPECT_EQ(t->mesh(), mesh) << name;
    absl::StatusOr<v1::MeshInfo> m = client().GetMesh(mesh);
    ASSERT_TRUE(m.ok());
    absl::StatusOr<v1::Layout> want = ExpectedLayout(*m, kShape, spec);
    ASSERT_TRUE(want.ok()) << want.status();
    EXPECT_TRUE(SameChunks(t->layout(), *want).ok()) << name;
    absl::Status values = DownloadAndCheck(client(), name, DType::kF32, kShape, FillKind::kArange);
    EXPECT_TRUE(values.ok()) << name << ": " << values;
  }

  std::unique_ptr<Cluster> cluster_;
  std::map<std::string, int64_t> ranks_;
};

TEST_F(RestartTest, TensorsRanksAndDeletionsSurviveRepeatedKills) {
  ASSERT_TRUE(CreateFilled(client(), "A", kShape, DType::kF32, "grid", "S(0),R").ok());
  ASSERT_TRUE(CreateFilled(client(), "B", kShape, DType::kF32, "line", "S(1)").ok());
  ASSERT_TRUE(CreateFilled(client(), "gone", kShape, DType::kF32, "grid", "R,R").ok());
  ASSERT_TRUE(client().Redistribute(RedistributeTo("A", "", "R,S(1)")).ok());
  ASSERT_TRUE(client().Redistribute(RedistributeTo("B", "grid", "S(1),S(0)")).ok());
  ASSERT_TRUE(client().DeleteTensor("gone").ok());
  const int64_t a1 = client().GetTensor("A")->version();
  const int64_t b1 = client().GetTensor("B")->version();

  // 1. After committed moves and a delete.
  ASSERT_NO_FATAL_FAILURE(Restart({"A", "B"}));
  ExpectArange("A", a1, "grid", "R,S(1)");
  ExpectArange("B", b1, "grid", "S(1),S(0)");
  EXPECT_EQ(client().GetTensor("gone").status().code(), absl::StatusCode::kNotFound);

  // 2. New plans run on the recovered tensors (new incarnations, new communicators).
  ASSERT_TRUE(client().Redistribute(RedistributeTo("A", "line", "S(0)")).ok());
  const int64_t a2 = client().GetTensor("A")->version();
  EXPECT_GT(a2, a1);
  ExpectArange("A", a2, "line", "S(0)");

  // 3. Killed right after a move was started: the move either committed before the kill
  // or never did (its buffers are dropped); the tensor is intact in one of the two layouts.
  absl::StatusOr<v1::RedistributeResponse> started =
      client().Redistribute(RedistributeTo("B", "line", "R", false, /*wait=*/false));
  ASSERT_TRUE(started.ok()) << started.status();
  ASSERT_NO_FATAL_FAILURE(Restart({"A", "B"}));
  absl::StatusOr<v1::TensorInfo> b = client().GetTensor("B");
  ASSERT_TRUE(b.ok());
  if (b->version() == b1) {
    ExpectArange("B", b1, "grid", "S(1),S(0)");
  } else {
    ExpectArange("B", b->version(), "line", "R");
  }
  ExpectArange("A", a2, "line", "S(0)");

  // 4. Killed right after a delete was acknowledged: it stays deleted; a new tensor of the
  // same name can be made.
  ASSERT_TRUE(client().DeleteTensor("A").ok());
  ASSERT_NO_FATAL_FAILURE(Restart({"B"}));
  EXPECT_EQ(client().GetTensor("A").status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(client().GetTensor("gone").status().code(), absl::StatusCode::kNotFound);
  ASSERT_TRUE(CreateFilled(client(), "A", kShape, DType::kF32, "grid", "S(0),S(1)").ok());
  ExpectArange("A", client().GetTensor("A")->version(), "grid", "S(0),S(1)");
  ASSERT_TRUE(client().Redistribute(RedistributeTo("B", "grid", "S(0),R")).ok());
  ExpectArange("B", client().GetTensor("B")->version(), "grid", "S(0),R");
}

}  // namespace
}  // namespace shardcoord
