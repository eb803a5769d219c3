#include "coordinator/checkpoints/checkpoint_manager.h"

#include <optional>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/timer.h"
#include "coordinator/testing/cluster_fixture.h"
#include "coordinator/testing/fake_reports.h"
#include "coordinator/testing/fake_worker_client.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "proto/convert.h"
#include "sharding/checkpoint_index.h"
#include "sharding/fill.h"
#include "sharding/safetensors.h"

namespace shardcoord {
namespace {

using ::testing::HasSubstr;

class CheckpointManagerTest : public ClusterFixture {
 protected:
  CheckpointManagerTest()
      : plans_(&clock_, &timer_, &workers_, &meshes_, &tensors_, &client_, PlanManagerOptions()),
        checkpoints_(&clock_, &workers_, &meshes_, &tensors_, &plans_, &client_,
                     CheckpointManagerOptions{256, /*load_batch_bytes=*/64,
                                              /*load_first_batch_bytes=*/0}) {
    workers_.AddListener(&plans_);
    RegisterWorkers(4);
    EXPECT_TRUE(meshes_.Create("M", {2, 2}, {"dp", "tp"}, {}).ok());
    EXPECT_TRUE(meshes_.Create("N", {4}, {}, {}).ok());
    client_.AddDir("/data");
    // Workers that execute every fragment correctly (the fake moves no bytes): each reports
    // its target chunks with a checksum that depends only on the box, so replicas agree.
    client_.SetExecuteHook([this](const WorkerEndpoint&, const v1::PlanFragment& f) {
      if (fail_exchange_rank_ == f.rank() && skip_failures_-- <= 0) {
        WorkerReport r = Report(f);
        r.error = "injected failure";
        plans_.Report(r).IgnoreError();
        return;
      }
      plans_.Report(Report(f)).IgnoreError();
    });
  }

  // A correct worker's report (fake_reports.h), with checksums that hash each chunk's box.
  WorkerReport Report(const v1::PlanFragment& f) {
    const std::string worker = workers_.GetByRank(f.rank())->spec.name;
    const int64_t incarnation = workers_.GetByRank(f.rank())->incarnation;
    auto sum = [](const Chunk& c) {
      uint64_t h = 7;
      for (int64_t v : c.box.offset()) h = h * 131 + v;
      for (int64_t v : c.box.shape()) h = h * 131 + v;
      return h;
    };
    // A fused group's fragment (a load's exchange): every shape's chunks, each member's sums.
    if (f.members_size() > 0) return FakeFusedFinalReport(f, worker, incarnation, sum);
    return FakeFinalReport(f, worker, incarnation, sum);
  }

  Spec SpecOf(const std::string& placements, const std::string& mesh) {
    return TestSpec(placements, mesh);
  }

  absl::StatusOr<v1::SaveCheckpointResponse> Save(const std::string& dir,
                                                  std::vector<std::string> names,
                                                  bool overwrite = false) {
    SaveCheckpointArgs args;
    args.id = "save-" + dir;
    args.dir = dir;
    args.tensors = std::move(names);
    args.overwrite = overwrite;
    return Answer<v1::SaveCheckpointResponse>([&](auto done) { checkpoints_.Save(args, done); });
  }

  absl::StatusOr<v1::LoadCheckpointResponse> Load(LoadCheckpointArgs args) {
    return Answer<v1::LoadCheckpointResponse>([&](auto done) { checkpoints_.Load(args, done); });
  }

  absl::StatusOr<v1::InspectCheckpointResponse> Inspect(const std::string& dir) {
    return Answer<v1::InspectCheckpointResponse>(
        [&](auto done) { checkpoints_.Inspect(dir, done); });
  }

  // What the call `start` starts with its callback answered (the fake answers inline).
  template <typename Resp, typename Start>
  static absl::StatusOr<Resp> Answer(Start start) {
    std::optional<absl::StatusOr<Resp>> out;
    start([&](absl::StatusOr<Resp> r) { out = r; });
    EXPECT_TRUE(out.has_value()) << "the fake answers inline";
    return out.value_or(absl::InternalError("no answer"));
  }

  LoadCheckpointArgs LoadAll(const std::string& dir, const std::string& placements,
                             const std::string& mesh, const std::string& prefix) {
    LoadCheckpointArgs args;
    args.id = "load";
    args.dir = dir;
    args.all = true;
    args.spec = SpecOf(placements, mesh);
    args.prefix = prefix;
    return args;
  }

  std::set<std::string> TensorNames() {
    std::set<std::string> out;
    for (const TensorRecord& t : tensors_.List()) out.insert(t.name);
    return out;
  }

  PlanManager plans_;
  CheckpointManager checkpoints_;
  int64_t fail_exchange_rank_ = -1;
  int skip_failures_ = 0;  // Fragments of fail_exchange_rank_ that still succeed.
};

TEST_F(CheckpointManagerTest, SaveWritesEveryPieceOnceThenCommits) {
  CreateFilled("a", "S(0),R", "M", {64, 32});  // Replicated over dp: each half written once.
  CreateFilled("b", "R", "N", {40, 8});        // Replicated everywhere.
  CreateFilled("c", "S(1)", "N", {6, 10});     // Uneven columns.
  absl::StatusOr<v1::SaveCheckpointResponse> r = Save("/data/ck", {"a", "b", "c"});
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->bytes(), (64 * 32 + 40 * 8 + 6 * 10) * 4);
  EXPECT_EQ(r->tensors(), 3);
  EXPECT_LE(r->max_writer_bytes(), 1.1 * r->ideal_writer_bytes());
  // Only the committed directory remains: no dir.tmp-*.
  for (const std::string& p : client_.Paths()) {
    EXPECT_FALSE(absl::StrContains(p, ".tmp-")) << p;
  }
  // The index, and every piece's bytes in its file are the tensor's values.
  absl::StatusOr<CheckpointIndex> index = ParseCheckpointIndex(client_.File("/data/ck/index.json"));
  ASSERT_TRUE(index.ok()) << index.status();
  ASSERT_EQ(index->tensors.size(), 3u);
  int64_t written = 0;
  for (const CheckpointTensor& t : index->tensors) {
    for (const CheckpointPiece& p : t.pieces) {
      const std::string file = client_.File("/data/ck/" + p.file);
      const SafetensorsHeader h =
          *ParseSafetensorsHeader(file.substr(8, *ParseSafetensorsPrefix(file.substr(0, 8))));
      const SafetensorsEntry* e = h.Find(p.entry);
      ASSERT_NE(e, nullptr) << p.entry;
      std::string want(static_cast<size_t>(p.box.Volume() * 4), '\0');
      ASSERT_TRUE(FillBox(FillKind::kArange, 0, t.shape, p.box, DType::kF32, want.data()).ok());
      EXPECT_EQ(file.substr(h.data_start() + e->begin, e->bytes()), want) << p.entry;
      written += e->bytes();
    }
  }
  EXPECT_EQ(written, r->bytes());
  // The tensors are free again.
  EXPECT_TRUE(tensors_.Acquire("a", "next").ok());
  absl::StatusOr<v1::CheckpointProgress> progress = checkpoints_.Progress("save-/data/ck");
  ASSERT_TRUE(progress.ok());
  EXPECT_TRUE(progress->ended());
  EXPECT_EQ(progress->phase(), "done");
  EXPECT_EQ(progress->bytes_done(), r->bytes());
}

TEST_F(CheckpointManagerTest, SaveRefusalsChangeNothing) {
  CreateFilled("a", "S(0)", "N", {8, 4});
  EXPECT_EQ(Save("relative", {"a"}).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(Save("/data/ck", {}).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(Save("/data/ck", {"a", "a"}).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(Save("/data/ck", {"a", "nope"}).status().code(), absl::StatusCode::kNotFound);
  ASSERT_TRUE(tensors_.Acquire("a", "busy").ok());
  EXPECT_EQ(Save("/data/ck", {"a"}).status().code(), absl::StatusCode::kAborted);
  tensors_.Release("a", "busy");
  EXPECT_EQ(client_.calls("CheckpointDir"), 0);
  EXPECT_FALSE(client_.HasDir("/data/ck"));
  EXPECT_TRUE(tensors_.Acquire("a", "next").ok());  // Nothing kept it busy.
}

TEST_F(CheckpointManagerTest, AFailedSaveLeavesThePreviousCheckpoint) {
  CreateFilled("a", "S(0),R", "M", {64, 32});
  ASSERT_TRUE(Save("/data/ck", {"a"}).ok());
  const std::string index = client_.File("/data/ck/index.json");
  // Without overwrite: refused before anything is written.
  absl::StatusOr<v1::SaveCheckpointResponse> again = Save("/data/ck", {"a"});
  EXPECT_EQ(again.status().code(), absl::StatusCode::kAlreadyExists);
  // A writer fails (a worker dying mid-save): the save fails naming it, dir is untouched and
  // the temporary directory is gone.
  client_.Fail("WriteCheckpoint", 2, absl::UnavailableError("connection reset"));
  absl::StatusOr<v1::SaveCheckpointResponse> failed = Save("/data/ck", {"a"}, true);
  EXPECT_EQ(failed.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(failed.status().message(), HasSubstr("worker w2 (rank 2)"));
  EXPECT_EQ(client_.File("/data/ck/index.json"), index);
  for (const std::string& p : client_.Paths()) {
    EXPECT_FALSE(absl::StrContains(p, ".tmp-")) << p;
  }
  EXPECT_TRUE(tensors_.Acquire("a", "next").ok());
}

TEST_F(CheckpointManagerTest, LoadCreatesEveryTensorTogether) {
  CreateFilled("a", "S(0),R", "M", {64, 32});
  CreateFilled("b", "R", "N", {40, 8});
  ASSERT_TRUE(Save("/data/ck", {"a", "b"}).ok());
  absl::StatusOr<v1::LoadCheckpointResponse> r = Load(LoadAll("/data/ck", "R", "N", "x_"));
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(TensorNames(), (std::set<std::string>{"a", "b", "x_a", "x_b"}));
  // A load into a replicated layout reads every byte exactly once.
  EXPECT_EQ(r->bytes(), (64 * 32 + 40 * 8) * 4);
  EXPECT_EQ(r->bytes_read(), r->bytes());
  absl::StatusOr<TensorRecord> xa = tensors_.Get("x_a");
  ASSERT_TRUE(xa.ok());
  EXPECT_EQ(xa->mesh, "N");
  EXPECT_EQ(xa->spec, "R");
  EXPECT_TRUE(xa->owner.empty());
  EXPECT_EQ(xa->version, r->tensors(0).version());
  // A second load of the same names: ALREADY_EXISTS before anything is read.
  const int reads = client_.calls("ReadCheckpoint");
  EXPECT_EQ(Load(LoadAll("/data/ck", "R", "N", "x_")).status().code(),
            absl::StatusCode::kAlreadyExists);
  EXPECT_EQ(client_.calls("ReadCheckpoint"), reads);
}

TEST_F(CheckpointManagerTest, LoadIntoCopiesAndDropsTheStaging) {
  CreateFilled("a", "S(0)", "N", {16, 4});
  ASSERT_TRUE(Save("/data/ck", {"a"}).ok());
  const int64_t before = tensors_.Get("a")->version;
  LoadCheckpointArgs args = LoadAll("/data/ck", "R", "N", "");
  args.spec.reset();
  args.into = true;
  absl::StatusOr<v1::LoadCheckpointResponse> r = Load(args);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_GT(tensors_.Get("a")->version, before);
  EXPECT_EQ(tensors_.Get("a")->spec, "S(0)");  // Keeps its layout.
  EXPECT_EQ(TensorNames(), (std::set<std::string>{"a"}));
  bool dropped = false;
  for (const auto& [rank, drop] : client_.drops()) {
    dropped = dropped || absl::StartsWith(drop.tensor(), "~load-");
  }
  EXPECT_TRUE(dropped);
  for (const TensorRecord& t : tensors_.List()) EXPECT_FALSE(absl::StartsWith(t.name, "~"));
  // Into a tensor of another shape: refused, naming both.
  CreateFilled("small", "S(0)", "N", {8, 4});
  args.all = false;
  args.targets = {LoadTargetArgs{"a", "small", std::nullopt}};
  EXPECT_THAT(Load(args).status().message(), HasSubstr("tensor 'small' is [8, 4] f32"));
}

TEST_F(CheckpointManagerTest, CorruptedAndTruncatedFilesAreRefusedCreatingNothing) {
  CreateFilled("a", "S(0)", "N", {64, 32});
  ASSERT_TRUE(Save("/data/ck", {"a"}).ok());
  const CheckpointIndex index = *ParseCheckpointIndex(client_.File("/data/ck/index.json"));
  const CheckpointPiece& p = index.Find("a")->pieces[1];
  const std::string path = "/data/ck/" + p.file;
  const std::string good = client_.File(path);

  std::string bad = good;
  bad[bad.size() - 3] ^= 0x40;  // In the last entry's data.
  client_.SetFile(path, bad);
  absl::StatusOr<v1::LoadCheckpointResponse> r = Load(LoadAll("/data/ck", "S(0)", "N", "x_"));
  EXPECT_EQ(r.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(r.status().message(), HasSubstr(absl::StrCat(p.file, ": entry \"", p.entry, "\"")));
  EXPECT_EQ(TensorNames(), (std::set<std::string>{"a"}));

  client_.SetFile(path, good.substr(0, good.size() - 5));
  r = Load(LoadAll("/data/ck", "S(0)", "N", "x_"));
  EXPECT_EQ(r.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(r.status().message(), HasSubstr(absl::StrCat(p.file, ": entry \"", p.entry, "\"")));
  EXPECT_THAT(r.status().message(), HasSubstr("truncated"));
  EXPECT_EQ(TensorNames(), (std::set<std::string>{"a"}));
  // No buffer read for the failed loads stays on any worker.
  EXPECT_EQ(client_.BufferCount("x_a"), 0);
}

TEST_F(CheckpointManagerTest, AFailedExchangeCreatesNothing) {
  CreateFilled("a", "S(0)", "N", {64, 32});
  CreateFilled("b", "S(1)", "N", {8, 32});
  ASSERT_TRUE(Save("/data/ck", {"a", "b"}).ok());
  fail_exchange_rank_ = 3;
  absl::StatusOr<v1::LoadCheckpointResponse> r = Load(LoadAll("/data/ck", "R,R", "M", "x_"));
  EXPECT_EQ(r.status().code(), absl::StatusCode::kAborted);
  EXPECT_THAT(r.status().message(), HasSubstr("injected failure"));
  EXPECT_EQ(TensorNames(), (std::set<std::string>{"a", "b"}));
  EXPECT_FALSE(tensors_.Get("x_a").ok());
  // The staging tensors are gone (the names are free again) and their buffers dropped.
  EXPECT_EQ(client_.BufferCount("x_a"), 0);
  EXPECT_EQ(client_.BufferCount("x_b"), 0);
  fail_exchange_rank_ = -1;
  ASSERT_TRUE(Load(LoadAll("/data/ck", "R,R", "M", "x_")).ok());
  EXPECT_EQ(TensorNames(), (std::set<std::string>{"a", "b", "x_a", "x_b"}));
}

// The load reads in batches (64 bytes here: a batch per tensor), each batch's group committing
// its tensors hidden: a later batch's failure removes what earlier batches committed, with
// their target buffers.
TEST_F(CheckpointManagerTest, ALaterBatchFailingRemovesWhatEarlierBatchesCommitted) {
  CreateFilled("a", "S(0)", "N", {64, 32});
  CreateFilled("b", "S(1)", "N", {8, 32});
  ASSERT_TRUE(Save("/data/ck", {"a", "b"}).ok());
  fail_exchange_rank_ = 3;
  // One batch's group commits (hidden), the other one's aborts (the fake answers inline, so
  // batch 1's group, started as soon as it is read, runs before batch 0's).
  skip_failures_ = 1;
  const int executes = client_.calls("Execute");
  absl::StatusOr<v1::LoadCheckpointResponse> r = Load(LoadAll("/data/ck", "R,R", "M", "x_"));
  EXPECT_EQ(r.status().code(), absl::StatusCode::kAborted);
  EXPECT_THAT(r.status().message(), HasSubstr("batch 0: "));
  EXPECT_GT(client_.calls("Execute"), executes);
  EXPECT_EQ(TensorNames(), (std::set<std::string>{"a", "b"}));
  EXPECT_FALSE(tensors_.Get("x_a").ok());
  EXPECT_EQ(client_.BufferCount("x_a"), 0);
  EXPECT_EQ(client_.BufferCount("x_b"), 0);
  fail_exchange_rank_ = -1;
  r = Load(LoadAll("/data/ck", "R,R", "M", "x_"));
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->group_ids_size(), 2);
  EXPECT_EQ(TensorNames(), (std::set<std::string>{"a", "b", "x_a", "x_b"}));
}

// The composition root tells the manager of a worker's death: a load that reads through it
// (rank 0 reads the index) fails naming it, starts no further exchange, and leaves nothing.
TEST_F(CheckpointManagerTest, AWorkerDeathFailsTheLoadUsingItNamingIt) {
  CreateFilled("a", "S(0)", "N", {64, 32});
  CreateFilled("b", "S(1)", "N", {8, 32});
  ASSERT_TRUE(Save("/data/ck", {"a", "b"}).ok());
  bool told = false;
  client_.SetExecuteHook([&](const WorkerEndpoint&, const v1::PlanFragment& f) {
    if (!told) {
      told = true;
      checkpoints_.OnWorkerLost(*workers_.GetByRank(0), "died: no heartbeat for 6s");
    }
    plans_.Report(Report(f)).IgnoreError();
  });
  absl::StatusOr<v1::LoadCheckpointResponse> r = Load(LoadAll("/data/ck", "R,R", "M", "x_"));
  EXPECT_TRUE(told);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kUnavailable) << r.status();
  EXPECT_THAT(r.status().message(), HasSubstr("worker w0 (rank 0) died: no heartbeat"));
  EXPECT_EQ(TensorNames(), (std::set<std::string>{"a", "b"}));
  EXPECT_EQ(client_.BufferCount("x_a"), 0);
  EXPECT_EQ(client_.BufferCount("x_b"), 0);
  absl::StatusOr<v1::CheckpointProgress> p = checkpoints_.Progress("load");
  ASSERT_TRUE(p.ok());
  EXPECT_EQ(p->phase(), "failed");
}

TEST_F(CheckpointManagerTest, LoadsAPlainSafetensorsFileAndInspects) {
  // A file as another tool writes it: one whole tensor per entry, no index, no checksums.
  SafetensorsHeader h;
  const std::string header =
      *BuildSafetensorsHeader({{"emb", DType::kF32, {6, 4}}, {"bias", DType::kI64, {3}}}, {}, &h);
  std::string emb(24 * 4, '\0'), bias(3 * 8, '\0');
  ASSERT_TRUE(
      FillBox(FillKind::kArange, 0, {6, 4}, Box::Whole({6, 4}), DType::kF32, emb.data()).ok());
  ASSERT_TRUE(FillBox(FillKind::kArange, 0, {3}, Box::Whole({3}), DType::kI64, bias.data()).ok());
  client_.SetFile("/data/hf/model.safetensors", header + emb + bias);
  client_.AddDir("/data/hf");
  absl::StatusOr<v1::LoadCheckpointResponse> r =
      Load(LoadAll("/data/hf/model.safetensors", "S(0)", "N", "hf."));
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(TensorNames(), (std::set<std::string>{"hf.bias", "hf.emb"}));
  EXPECT_EQ(r->bytes_read(), 24 * 4 + 3 * 8);

  absl::StatusOr<v1::InspectCheckpointResponse> info = Inspect("/data/hf");
  ASSERT_TRUE(info.ok()) << info.status();
  EXPECT_TRUE(info->plain());
  ASSERT_EQ(info->tensors_size(), 2);
  EXPECT_EQ(info->tensors(1).name(), "emb");
  EXPECT_EQ(info->tensors(1).pieces(0).xxh64(), "");
}

TEST_F(CheckpointManagerTest, InspectShowsPiecesAndWriters) {
  CreateFilled("a", "S(0),R", "M", {64, 32});
  ASSERT_TRUE(Save("/data/ck", {"a"}).ok());
  absl::StatusOr<v1::InspectCheckpointResponse> info = Inspect("/data/ck/");
  ASSERT_TRUE(info.ok()) << info.status();
  EXPECT_FALSE(info->plain());
  ASSERT_EQ(info->tensors_size(), 1);
  EXPECT_EQ(info->tensors(0).pieces_size(), 4);  // Two halves, each split over its 2 holders.
  EXPECT_EQ(info->files_size(), 4);
  std::set<std::string> writers;
  for (const v1::CheckpointFileInfo& f : info->files()) writers.insert(f.worker());
  EXPECT_EQ(writers, (std::set<std::string>{"w0", "w1", "w2", "w3"}));
  EXPECT_EQ(info->tensors(0).pieces(0).xxh64().size(), 16u);
}

}  // namespace
}  // namespace shardcoord
