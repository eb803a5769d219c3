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
                                 absl::StrCat("--recovery-timeout=", recovery_timeout_)};
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
                    const std::string& spec, const Shape& shape = kShape) {
    absl::StatusOr<v1::TensorInfo> t = client().GetTensor(name);
    ASSERT_TRUE(t.ok()) << name << ": " << t.status();
    EXPECT_EQ(t->version(), version) << name;
    EXPECT_EQ(t->mesh(), mesh) << name;
    absl::StatusOr<v1::MeshInfo> m = client().GetMesh(mesh);
    ASSERT_TRUE(m.ok());
    absl::StatusOr<v1::Layout> want = ExpectedLayout(*m, shape, spec);
    ASSERT_TRUE(want.ok()) << want.status();
    EXPECT_TRUE(SameChunks(t->layout(), *want).ok()) << name;
    absl::Status values = DownloadAndCheck(client(), name, DType::kF32, shape, FillKind::kArange);
    EXPECT_TRUE(values.ok()) << name << ": " << values;
  }

  // Long: recovery must end because every worker reported, not by the timeout.
  std::string recovery_timeout_ = "60s";
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

// Killed while a 64 MiB move runs: after the restart the tensor is intact, in its old
// layout (the plan ended ABORTED with the coordinator) or, if the commit was stored before
// the kill, in the new one; new moves run.
TEST_F(RestartTest, KillDuringALargeMove) {
  const Shape big = {4096, 4096};
  ASSERT_TRUE(CreateFilled(client(), "big", big, DType::kF32, "grid", "S(0),R").ok());
  const int64_t before = client().GetTensor("big")->version();
  absl::StatusOr<v1::RedistributeResponse> started =
      client().Redistribute(RedistributeTo("big", "line", "S(1)", false, /*wait=*/false));
  ASSERT_TRUE(started.ok()) << started.status();
  ASSERT_NO_FATAL_FAILURE(Restart({"big"}));
  const int64_t after = client().GetTensor("big")->version();
  if (after == before) {
    ExpectArange("big", before, "grid", "S(0),R", big);
  } else {
    ExpectArange("big", after, "line", "S(1)", big);
  }
  ASSERT_TRUE(client().Redistribute(RedistributeTo("big", "grid", "R,S(0)")).ok());
  ExpectArange("big", client().GetTensor("big")->version(), "grid", "R,S(0)", big);
}

// A client that retries a request after a restart, with its request_id, gets the first
// outcome and the request does not act again: the move runs no second plan, and the create
// does not bring back a tensor deleted since.
TEST_F(RestartTest, RetriesWithARequestIdActOnceAcrossARestart) {
  v1::CreateTensorRequest create;
  create.set_name("C");
  for (int64_t d : kShape) create.add_shape(d);
  create.set_dtype(v1::F32);
  create.mutable_spec()->set_mesh("grid");
  create.mutable_spec()->set_placements_text("S(0),R");
  create.set_init(v1::ARANGE);
  create.set_request_id("create-C");
  absl::StatusOr<v1::TensorInfo> created = client().CreateTensor(create);
  ASSERT_TRUE(created.ok()) << created.status();
  v1::RedistributeRequest move = RedistributeTo("C", "line", "S(1)");
  move.set_request_id("move-C");
  absl::StatusOr<v1::RedistributeResponse> moved = client().Redistribute(move);
  ASSERT_TRUE(moved.ok()) << moved.status();
  const int64_t version = client().GetTensor("C")->version();

  ASSERT_NO_FATAL_FAILURE(Restart({"C"}));
  absl::StatusOr<v1::RedistributeResponse> again = client().Redistribute(move);
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(again->plan().id(), moved->plan().id());
  EXPECT_EQ(again->progress().state(), v1::COMMITTED);
  ExpectArange("C", version, "line", "S(1)");  // No second plan made a new version.
  // The same id with another target is another request: refused.
  move.mutable_target()->set_placements_text("R");
  EXPECT_EQ(client().Redistribute(move).status().code(), absl::StatusCode::kInvalidArgument);

  ASSERT_TRUE(client().DeleteTensor("C").ok());
  absl::StatusOr<v1::TensorInfo> replayed = client().CreateTensor(create);
  ASSERT_TRUE(replayed.ok()) << replayed.status();
  EXPECT_EQ(replayed->version(), created->version());
  EXPECT_EQ(client().GetTensor("C").status().code(), absl::StatusCode::kNotFound);
}

class RestartLosingAWorkerTest : public RestartTest {
 protected:
  void SetUp() override {
    recovery_timeout_ = "2s";
    RestartTest::SetUp();
  }
};

// A worker dies while the coordinator is down: after the restart and the recovery timeout,
// a tensor with a replica of its chunks is readable, one without says which chunk was lost,
// and the other workers kept their ranks.
TEST_F(RestartLosingAWorkerTest, ChunksOfAWorkerThatDoesNotComeBackAreLost) {
  // grid: w0 (0,0), w1 (0,1), w2 (1,0), w3 (1,1); line: w3, w2, w1, w0.
  ASSERT_TRUE(CreateFilled(client(), "replicated", kShape, DType::kF32, "grid", "R,S(1)").ok());
  ASSERT_TRUE(CreateFilled(client(), "sharded", kShape, DType::kF32, "line", "S(0)").ok());
  const int64_t version = client().GetTensor("replicated")->version();
  ASSERT_TRUE(cluster_->KillCoordinator().ok());
  ASSERT_TRUE(cluster_->KillWorker(3).ok());
  ASSERT_TRUE(cluster_->RestartCoordinator(kWait).ok());

  absl::StatusOr<v1::TensorInfo> r = WaitReadable(*cluster_, "replicated");
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->lost_chunks_size(), 0);
  ExpectArange("replicated", version, "grid", "R,S(1)");

  absl::StatusOr<v1::TensorInfo> s = WaitReadable(*cluster_, "sharded");
  ASSERT_TRUE(s.ok()) << s.status();
  ASSERT_EQ(s->lost_chunks_size(), 1);
  EXPECT_THAT(s->lost_chunks(0), ::testing::HasSubstr(absl::StrCat("rank ", ranks_.at("w3"))));
  std::string data;
  EXPECT_EQ(client().Download("sharded", &data).status().code(),
            absl::StatusCode::kFailedPrecondition);

  std::map<std::string, int64_t> ranks = Ranks(*cluster_);
  EXPECT_EQ(ranks, ranks_);
  EXPECT_TRUE(cluster_->WaitForWorkers({"w0", "w1", "w2"}, v1::ALIVE, kWait).ok());
  absl::StatusOr<std::vector<v1::WorkerInfo>> workers = client().ListWorkers();
  ASSERT_TRUE(workers.ok());
  for (const v1::WorkerInfo& w : *workers) {
    if (w.name() == "w3") EXPECT_EQ(w.state(), v1::DEAD);
  }
}

}  // namespace
}  // namespace shardcoord
