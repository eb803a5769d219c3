#include "coordinator/io/tensor_io.h"

#include <cstring>
#include <memory>
#include <optional>
#include <vector>

#include "absl/strings/str_cat.h"
#include "coordinator/store/state_store.h"
#include "coordinator/testing/cluster_fixture.h"
#include "coordinator/testing/fake_worker_client.h"
#include "coordinator/testing/flaky_store.h"
#include "coordinator/testing/float_data.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "sharding/fill.h"
#include "sharding/tensor_split.h"

namespace shardcoord {
namespace {

using ::testing::HasSubstr;

// The fake answers inline, so every call below has completed when it returns.
class TensorIoTest : public ClusterFixture {
 protected:
  TensorIoTest()
      : io_(&workers_, &meshes_, &tensors_, &client_),
        banded_(&workers_, &meshes_, &tensors_, &client_, /*band_bytes=*/16) {
    RegisterWorkers(4);
    EXPECT_TRUE(meshes_.Create("M", {2, 2}, {}, {}).ok());
    EXPECT_TRUE(meshes_.Create("N", {4}, {}, {}).ok());
  }

  static Spec MakeSpec(const std::string& mesh, const std::string& placements) {
    return TestSpec(placements, mesh);
  }

  // What an asynchronous call answered: `call` starts it with the callback (the fake answers
  // inline, so it has when `call` returns).
  template <typename T, typename Call>
  static T Answer(Call call) {
    std::optional<T> out;
    call([&](T r) { out = std::move(r); });
    EXPECT_TRUE(out.has_value());
    return *std::move(out);
  }

  // An [8, 4] f32 tensor `placements` on `mesh`, seed 7.
  static CreateTensorArgs Args(const std::string& name, const std::string& placements,
                               v1::InitKind init = v1::ARANGE, const std::string& mesh = "M") {
    CreateTensorArgs args;
    args.name = name;
    args.shape = {8, 4};
    args.dtype = DType::kF32;
    args.spec = MakeSpec(mesh, placements);
    args.init = init;
    args.seed = 7;
    return args;
  }

  // An upload of an [8, 4] f32 tensor `name` (no spec: the tensor's own).
  static UploadArgs UploadOf(const std::string& name) {
    UploadArgs args;
    args.name = name;
    args.shape = {8, 4};
    args.dtype = DType::kF32;
    return args;
  }

  absl::StatusOr<TensorRecord> Create(const std::string& name, const std::string& placements,
                                      v1::InitKind init = v1::ARANGE,
                                      const std::string& mesh = "M") {
    return Answer<absl::StatusOr<TensorRecord>>(
        [&](auto done) { io_.Create(Args(name, placements, init, mesh), done); });
  }

  absl::StatusOr<std::string> Download(const std::string& name) { return Download(io_, name); }
  absl::StatusOr<std::string> Download(TensorIo& io, const std::string& name) {
    absl::StatusOr<DownloadedTensor> out =
        Answer<absl::StatusOr<DownloadedTensor>>([&](auto done) { io.Download(name, done); });
    if (!out.ok()) return out.status();
    return out->data;
  }

  absl::StatusOr<TensorRecord> Upload(UploadArgs args, std::string data) {
    return Upload(io_, std::move(args), std::move(data));
  }
  absl::StatusOr<TensorRecord> Upload(TensorIo& io, UploadArgs args, std::string data) {
    return Answer<absl::StatusOr<TensorRecord>>(
        [&](auto done) { io.Upload(args, std::move(data), done); });
  }

  TensorIo io_;
  TensorIo banded_;  // One row of an [8, 4] f32 tensor per band.
};

TEST_F(TensorIoTest, CreateFillsEveryRankAndDownloadAssembles) {
  absl::StatusOr<TensorRecord> t = Create("T", "S(0),R");
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ(client_.calls("Fill"), 4);
  EXPECT_EQ(t->spec, "S(0),R");
  EXPECT_TRUE(t->busy_plan.empty());
  // Replicas (ranks 0 and 1 hold rows [0:4)) have equal checksums, different rows differ.
  EXPECT_EQ(t->checksums[0][0], t->checksums[1][0]);
  EXPECT_NE(t->checksums[0][0], t->checksums[2][0]);
  absl::StatusOr<std::string> data = Download("T");
  ASSERT_TRUE(data.ok()) << data.status();
  ASSERT_EQ(data->size(), 32 * sizeof(float));
  for (int i = 0; i < 32; ++i) EXPECT_EQ(FloatAt(*data, i), static_cast<float>(i)) << i;
  // Each row block was read once.
  EXPECT_EQ(client_.calls("ReadChunk"), 2);
}

TEST_F(TensorIoTest, RandomInitIsTheSameFunctionOfTheIndexInAnyLayout) {
  ASSERT_TRUE(Create("A", "S(1),S(0)", v1::RANDOM).ok());
  ASSERT_TRUE(Create("B", "S(0)", v1::RANDOM, "N").ok());
  absl::StatusOr<std::string> a = Download("A"), b = Download("B");
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_EQ(*a, *b);
  for (int i = 0; i < 32; ++i) {
    EXPECT_EQ(FloatAt(*a, i), static_cast<float>(FillValue(FillKind::kRandom, 7, i)));
  }
}

TEST_F(TensorIoTest, PartialTensorsDownloadReduced) {
  // P(sum): contribution 0 holds the values, the other zeros; P(max): every contribution.
  ASSERT_TRUE(Create("S", "P(sum),S(1)").ok());
  ASSERT_TRUE(Create("X", "P(max),R").ok());
  for (const char* name : {"S", "X"}) {
    absl::StatusOr<std::string> data = Download(name);
    ASSERT_TRUE(data.ok()) << data.status();
    for (int i = 0; i < 32; ++i) EXPECT_EQ(FloatAt(*data, i), static_cast<float>(i)) << name << i;
  }
}

TEST_F(TensorIoTest, FailedFillLeavesNothingBehind) {
  client_.Fail("Fill", 2, absl::ResourceExhaustedError("out of memory"));
  absl::StatusOr<TensorRecord> t = Create("T", "S(0),R");
  EXPECT_EQ(t.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(t.status().message(),
              HasSubstr("worker w2 (rank 2): RESOURCE_EXHAUSTED: out of memory"));
  EXPECT_EQ(tensors_.Get("T").status().code(), absl::StatusCode::kNotFound);
  for (int64_t r = 0; r < 4; ++r) EXPECT_FALSE(client_.HasBuffer(r, "T", 1)) << r;
  EXPECT_EQ(client_.drops().size(), 4u);
  // The name and the mesh are free again.
  client_.Fail("Fill", 2, absl::OkStatus());
  EXPECT_TRUE(Create("T", "S(0),R").ok());
}

TEST_F(TensorIoTest, CreateValidation) {
  ASSERT_TRUE(Create("T", "S(0),R").ok());
  EXPECT_EQ(Create("T", "S(0),R").status().code(), absl::StatusCode::kAlreadyExists);
  absl::Status bad = Create("U", "S(2),R").status();
  EXPECT_EQ(bad.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(bad.message(), "spec.placements[0]: S(2) on a 2-d tensor");
  EXPECT_EQ(Create("U", "S(0)", v1::ZEROS, "nomesh").status().code(), absl::StatusCode::kNotFound);
  Kill(3);
  absl::Status dead = Create("U", "S(0)", v1::ZEROS, "N").status();
  EXPECT_EQ(dead.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(dead.message(), HasSubstr("worker w3 (rank 3) is dead"));
}

// --max-tensor-bytes bounds creates and uploads; nothing is sent to a worker.
TEST_F(TensorIoTest, TensorsOverTheByteLimitAreRefused) {
  TensorIo small(&workers_, &meshes_, &tensors_, &client_, kDefaultBandBytes,
                 /*max_tensor_bytes=*/100);
  CreateTensorArgs args;
  args.name = "T";
  args.shape = {8, 4};
  args.dtype = DType::kF32;
  args.spec = MakeSpec("M", "S(0),R");
  std::optional<absl::StatusOr<TensorRecord>> out;
  small.Create(args, [&](absl::StatusOr<TensorRecord> r) { out = std::move(r); });
  ASSERT_TRUE(out.has_value());
  EXPECT_EQ(out->status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(out->status().message(),
            "shape: [8, 4] of f32 is 128 bytes, more than the limit of 100 (--max-tensor-bytes)");
  UploadArgs up = UploadOf("U");
  up.spec = MakeSpec("N", "S(1)");
  absl::Status refused = Upload(small, up, Floats(32, 0)).status();
  EXPECT_EQ(refused.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(refused.message(), HasSubstr("header.shape: [8, 4] of f32 is 128 bytes"));
  EXPECT_EQ(client_.calls("Fill"), 0);
  EXPECT_EQ(client_.calls("WriteChunk"), 0);
  up.shape = {5, 4};  // 80 bytes: under the limit.
  EXPECT_TRUE(Upload(small, up, Floats(20, 0)).ok());
}

TEST_F(TensorIoTest, WholeUploadCreatesThenReplacesAsANewVersion) {
  UploadArgs args = UploadOf("U");
  args.spec = MakeSpec("N", "S(1)");
  absl::StatusOr<TensorRecord> first = Upload(args, Floats(32, 100));
  ASSERT_TRUE(first.ok()) << first.status();
  EXPECT_EQ(first->mesh, "N");
  absl::StatusOr<std::string> data = Download("U");
  ASSERT_TRUE(data.ok());
  EXPECT_EQ(*data, Floats(32, 100));

  // Replace with new values in another layout: a new version; the old one is dropped.
  args.spec = MakeSpec("M", "R,S(0)");
  absl::StatusOr<TensorRecord> second = Upload(args, Floats(32, -5));
  ASSERT_TRUE(second.ok()) << second.status();
  EXPECT_GT(second->version, first->version);
  EXPECT_EQ(second->mesh, "M");
  for (int64_t r = 0; r < 4; ++r) {
    EXPECT_FALSE(client_.HasBuffer(r, "U", first->version));
    EXPECT_TRUE(client_.HasBuffer(r, "U", second->version));
  }
  data = Download("U");
  ASSERT_TRUE(data.ok());
  EXPECT_EQ(*data, Floats(32, -5));
  EXPECT_TRUE(meshes_.Delete("N").ok());

  // Without a spec, an existing tensor keeps its layout.
  args.spec.reset();
  absl::StatusOr<TensorRecord> third = Upload(args, Floats(32, 1));
  ASSERT_TRUE(third.ok()) << third.status();
  EXPECT_EQ(third->spec, "R,S(0)");
}

TEST_F(TensorIoTest, UploadValidationChangesNothing) {
  ASSERT_TRUE(Create("T", "S(0),R").ok());
  UploadArgs args = UploadOf("T");
  args.shape = {4, 8};
  EXPECT_EQ(Upload(args, Floats(32, 0)).status().code(), absl::StatusCode::kAlreadyExists);
  args.shape = {8, 4};
  absl::Status short_data = Upload(args, Floats(31, 0)).status();
  EXPECT_EQ(short_data.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(short_data.message(), "data: 124 bytes for a [8, 4] f32 tensor of 128 bytes");
  args.name = "new";  // No spec to create it from.
  EXPECT_EQ(Upload(args, Floats(32, 0)).status().code(), absl::StatusCode::kNotFound);
  args.name = "T";
  ASSERT_TRUE(tensors_.Acquire("T", "p-9").ok());
  EXPECT_EQ(Upload(args, Floats(32, 0)).status().code(), absl::StatusCode::kAborted);
  EXPECT_EQ(tensors_.Get("T")->busy_plan, "p-9");  // Still the other operation's.
  tensors_.Release("T", "p-9");
  EXPECT_EQ(client_.calls("WriteChunk"), 0);
  EXPECT_TRUE(client_.drops().empty());
  absl::StatusOr<std::string> data = Download("T");
  ASSERT_TRUE(data.ok());
  EXPECT_EQ(FloatAt(*data, 31), 31.0f);
}

TEST_F(TensorIoTest, FailedWriteRollsBackToTheOldVersion) {
  absl::StatusOr<TensorRecord> t = Create("T", "S(0),R");
  ASSERT_TRUE(t.ok());
  client_.Fail("WriteChunk", 1, absl::UnavailableError("connection reset"));
  UploadArgs args = UploadOf("T");
  absl::Status s = Upload(args, Floats(32, 50)).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(s.message(), HasSubstr("worker w1 (rank 1)"));
  const TensorRecord after = *tensors_.Get("T");
  EXPECT_EQ(after.version, t->version);
  EXPECT_TRUE(after.busy_plan.empty());
  for (int64_t r = 0; r < 4; ++r) EXPECT_FALSE(client_.HasBuffer(r, "T", t->version + 1));
  absl::StatusOr<std::string> data = Download("T");
  ASSERT_TRUE(data.ok());
  EXPECT_EQ(FloatAt(*data, 5), 5.0f);
}

TEST_F(TensorIoTest, RankUploadReplacesOneLocalBuffer) {
  ASSERT_TRUE(Create("T", "S(0),S(1)").ok());
  UploadArgs args = UploadOf("T");
  args.rank = 3;  // Rows [4:8), columns [2:4): 8 elements.
  absl::StatusOr<TensorRecord> t = Upload(args, Floats(8, 1000));
  ASSERT_TRUE(t.ok()) << t.status();
  absl::StatusOr<std::string> data = Download("T");
  ASSERT_TRUE(data.ok());
  EXPECT_EQ(FloatAt(*data, 4 * 4 + 2), 1000.0f);
  EXPECT_EQ(FloatAt(*data, 7 * 4 + 3), 1007.0f);
  EXPECT_EQ(FloatAt(*data, 4 * 4 + 1), 17.0f);  // Rank 2's part is untouched.
  EXPECT_EQ(Upload(args, Floats(7, 0)).status().code(), absl::StatusCode::kInvalidArgument);
  args.rank = 9;
  EXPECT_EQ(Upload(args, Floats(8, 0)).status().code(), absl::StatusCode::kInvalidArgument);
  args.name = "nope";
  EXPECT_EQ(Upload(args, Floats(8, 0)).status().code(), absl::StatusCode::kNotFound);
}

TEST_F(TensorIoTest, DownloadUsesLiveReplicasAndNamesLostChunks) {
  ASSERT_TRUE(Create("T", "S(0),R").ok());
  Kill(0);
  absl::StatusOr<std::string> data = Download("T");
  ASSERT_TRUE(data.ok()) << data.status();
  EXPECT_EQ(FloatAt(*data, 3), 3.0f);
  Kill(1);
  absl::Status lost = Download("T").status();
  EXPECT_EQ(lost.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(lost.message(), HasSubstr("[0:4, 0:4] on ranks 0, 1"));
}

TEST_F(TensorIoTest, ReadFailureIsUnavailable) {
  ASSERT_TRUE(Create("T", "S(0)", v1::ARANGE, "N").ok());
  client_.Fail("ReadChunk", 2, absl::UnavailableError("gone"));
  absl::Status s = Download("T").status();
  EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(s.message(), HasSubstr("reading [4:6, 0:4] from worker w2 (rank 2)"));
}

TEST_F(TensorIoTest, DeleteDropsEveryVersion) {
  ASSERT_TRUE(Create("T", "S(0),R").ok());
  ASSERT_TRUE(io_.Delete("T").ok());
  EXPECT_EQ(tensors_.Get("T").status().code(), absl::StatusCode::kNotFound);
  ASSERT_EQ(client_.drops().size(), 4u);
  for (const auto& [rank, req] : client_.drops()) EXPECT_EQ(req.version(), -1);
  EXPECT_EQ(io_.Delete("T").code(), absl::StatusCode::kNotFound);
  EXPECT_TRUE(meshes_.Delete("M").ok());
}

// ---- Bands -------------------------------------------------------------------------------

TEST_F(TensorIoTest, BandedDownloadReadsEachBandsPartOfEveryChunk) {
  ASSERT_TRUE(Create("T", "S(0),R").ok());
  ASSERT_TRUE(Create("P", "P(sum),S(1)").ok());
  ASSERT_TRUE(Create("X", "P(avg),R").ok());
  for (const char* name : {"T", "P", "X"}) {
    absl::StatusOr<std::string> data = Download(banded_, name);
    ASSERT_TRUE(data.ok()) << name << ": " << data.status();
    ASSERT_EQ(data->size(), 32 * sizeof(float));
    for (int i = 0; i < 32; ++i) EXPECT_EQ(FloatAt(*data, i), static_cast<float>(i)) << name << i;
  }
  // 8 one-row bands: T reads one row from one replica per band (8); P reads a half row of
  // both contributions' two column halves (32); X one row of each contribution (16).
  EXPECT_EQ(client_.calls("ReadChunk"), 8 + 32 + 16);
}

TEST_F(TensorIoTest, BandedUploadWritesTheLocalBuffersChunkUnshardedBuilds) {
  UploadArgs args = UploadOf("U");
  for (const char* placements : {"S(1),S(0)", "P(sum),S(0)", "R,S(1)"}) {
    SCOPED_TRACE(placements);
    args.spec = MakeSpec("M", placements);
    const std::string values = Floats(32, 3);
    absl::StatusOr<TensorRecord> t = Upload(banded_, args, values);
    ASSERT_TRUE(t.ok()) << t.status();
    absl::StatusOr<std::vector<std::vector<char>>> want =
        ChunkUnsharded(t->layout, values.data(), sizeof(float));
    ASSERT_TRUE(want.ok());
    for (size_t i = 0; i < t->layout.ranks().size(); ++i) {
      const int64_t rank = t->layout.ranks()[i].rank;
      EXPECT_EQ(client_.Buffer(rank, "U", t->version),
                std::string((*want)[i].begin(), (*want)[i].end()))
          << "rank " << rank;
    }
    absl::StatusOr<std::string> data = Download(banded_, "U");
    ASSERT_TRUE(data.ok()) << data.status();
    EXPECT_EQ(*data, values);
  }
}

TEST_F(TensorIoTest, DownloadMeetingANewVersionIsAbortedNotMixed) {
  ASSERT_TRUE(Create("T", "S(0)", v1::ARANGE, "N").ok());
  absl::StatusOr<std::shared_ptr<TensorIo::DownloadStream>> d = banded_.OpenDownload("T");
  ASSERT_TRUE(d.ok()) << d.status();
  ASSERT_EQ((*d)->num_bands(), 8);
  std::optional<absl::StatusOr<std::string>> band;
  (*d)->FetchBand(0, [&](absl::StatusOr<std::string> r) { band = std::move(r); });
  ASSERT_TRUE(band.has_value() && band->ok());
  EXPECT_EQ(**band, Floats(4, 0));

  // A whole upload commits a new version and drops the one being downloaded.
  UploadArgs args = UploadOf("T");
  ASSERT_TRUE(Upload(args, Floats(32, 100)).ok());
  band.reset();
  (*d)->FetchBand(1, [&](absl::StatusOr<std::string> r) { band = std::move(r); });
  ASSERT_TRUE(band.has_value());
  EXPECT_EQ(band->status().code(), absl::StatusCode::kAborted) << band->status();
  EXPECT_THAT(band->status().message(), HasSubstr("changed from version"));

  // Deleted under a download: ABORTED too.
  absl::StatusOr<std::shared_ptr<TensorIo::DownloadStream>> d2 = banded_.OpenDownload("T");
  ASSERT_TRUE(d2.ok());
  d->reset();
  ASSERT_TRUE(io_.Delete("T").ok());
  band.reset();
  (*d2)->FetchBand(0, [&](absl::StatusOr<std::string> r) { band = std::move(r); });
  ASSERT_TRUE(band.has_value());
  EXPECT_EQ(band->status().code(), absl::StatusCode::kAborted) << band->status();
  EXPECT_THAT(band->status().message(), HasSubstr("deleted during the download"));
}

// The composition root tells the I/O of a worker's death: an upload writing to it and a
// download reading from it fail at once, naming the worker, not when an RPC to it times out.
TEST_F(TensorIoTest, AWorkerDeathFailsItsUploadsAndDownloadsNamingIt) {
  ASSERT_TRUE(Create("T", "S(0)", v1::ARANGE, "N").ok());
  absl::StatusOr<std::shared_ptr<TensorIo::DownloadStream>> d = banded_.OpenDownload("T");
  ASSERT_TRUE(d.ok()) << d.status();
  UploadArgs args = UploadOf("U");
  args.spec = MakeSpec("N", "S(0)");
  absl::StatusOr<std::shared_ptr<TensorIo::UploadStream>> up = banded_.StartUpload(args);
  ASSERT_TRUE(up.ok()) << up.status();

  absl::StatusOr<WorkerRecord> w2 = workers_.Get("w2");
  ASSERT_TRUE(w2.ok());
  banded_.OnWorkerLost(*w2, "died: no heartbeat for 6s (timeout 5s)");

  std::optional<absl::Status> written;
  (*up)->WriteBand(0, std::string(static_cast<size_t>((*up)->band_bytes(0)), '\0'),
                   [&](absl::Status s) { written = s; });
  ASSERT_TRUE(written.has_value());
  EXPECT_EQ(written->code(), absl::StatusCode::kUnavailable) << *written;
  EXPECT_THAT(written->message(), HasSubstr("worker w2 (rank 2) died: no heartbeat"));
  (*up)->Abort();
  EXPECT_EQ(tensors_.Get("U").status().code(), absl::StatusCode::kNotFound);

  std::optional<absl::StatusOr<std::string>> band;
  (*d)->FetchBand(0, [&](absl::StatusOr<std::string> r) { band = std::move(r); });
  ASSERT_TRUE(band.has_value());
  EXPECT_EQ(band->status().code(), absl::StatusCode::kUnavailable) << band->status();
  EXPECT_THAT(band->status().message(), HasSubstr("worker w2 (rank 2) died"));

  // Another worker's death, or another incarnation's, leaves a new download alone.
  absl::StatusOr<std::shared_ptr<TensorIo::DownloadStream>> d2 = banded_.OpenDownload("T");
  ASSERT_TRUE(d2.ok()) << d2.status();
  WorkerRecord old = *w2;
  --old.incarnation;
  banded_.OnWorkerLost(old, "re-registered");
  band.reset();
  (*d2)->FetchBand(0, [&](absl::StatusOr<std::string> r) { band = std::move(r); });
  ASSERT_TRUE(band.has_value());
  EXPECT_TRUE(band->ok()) << band->status();
}

TEST_F(TensorIoTest, RankUploadsWaitForDownloadsToEnd) {
  ASSERT_TRUE(Create("T", "S(0)", v1::ARANGE, "N").ok());
  UploadArgs args = UploadOf("T");
  args.rank = 1;
  absl::StatusOr<std::shared_ptr<TensorIo::DownloadStream>> d = banded_.OpenDownload("T");
  ASSERT_TRUE(d.ok());
  absl::Status refused = Upload(banded_, args, Floats(8, 0)).status();
  EXPECT_EQ(refused.code(), absl::StatusCode::kAborted) << refused;
  EXPECT_THAT(refused.message(), HasSubstr("is being downloaded"));
  EXPECT_EQ(client_.calls("WriteChunk"), 0);
  d->reset();
  EXPECT_TRUE(Upload(banded_, args, Floats(8, 0)).ok());
}

// A create whose record cannot be stored is undone, so that its retry creates the tensor
// (and does not find a half-created one: ALREADY_EXISTS for a tensor nobody can see).
TEST_F(TensorIoTest, ACreateThatCannotBeStoredLeavesNothing) {
  FlakyStore store("etcd unreachable");
  TensorManager stored(&meshes_, &store);
  TensorIo io(&workers_, &meshes_, &stored, &client_);
  CreateTensorArgs args;
  args.name = "T";
  args.shape = {8, 4};
  args.dtype = DType::kF32;
  args.spec = MakeSpec("M", "S(0),R");
  args.init = v1::ARANGE;
  std::optional<absl::StatusOr<TensorRecord>> out;
  store.down = true;
  io.Create(args, [&](absl::StatusOr<TensorRecord> r) { out = std::move(r); });
  ASSERT_TRUE(out.has_value());
  EXPECT_EQ(out->status().code(), absl::StatusCode::kUnavailable) << out->status();
  EXPECT_EQ(stored.Get("T").status().code(), absl::StatusCode::kNotFound);
  store.down = false;
  out.reset();
  io.Create(args, [&](absl::StatusOr<TensorRecord> r) { out = std::move(r); });
  ASSERT_TRUE(out.has_value());
  EXPECT_TRUE(out->ok()) << out->status();
}

// ---- Bulk -------------------------------------------------------------------------------

class TensorIoBulkTest : public TensorIoTest {
 protected:
  static absl::StatusOr<TensorIo::CreatedMany> CreateMany(TensorIo& io,
                                                          std::vector<CreateTensorArgs> args) {
    return Answer<absl::StatusOr<TensorIo::CreatedMany>>(
        [&](auto done) { io.CreateMany(std::move(args), done); });
  }
  absl::StatusOr<TensorIo::CreatedMany> CreateMany(std::vector<CreateTensorArgs> args) {
    return CreateMany(io_, std::move(args));
  }
};

// Each worker fills every buffer of the call in one FillMany; the tensors hold what a
// create of each would have made (values, replicas' checksums), attached ones no buffer.
TEST_F(TensorIoBulkTest, CreateManyFillsOncePerWorker) {
  absl::StatusOr<TensorIo::CreatedMany> made =
      CreateMany({Args("a", "S(0),R"), Args("b", "R,S(1)"), Args("c", "S(0)", v1::ARANGE, "N"),
                  Args("d", "S(0),R", v1::ATTACHED)});
  ASSERT_TRUE(made.ok()) << made.status();
  EXPECT_EQ(made->created, 4);
  EXPECT_EQ(made->bytes, 4 * 32 * 4);
  EXPECT_EQ(client_.calls("FillMany"), 4);
  for (const char* name : {"a", "b", "c"}) {
    absl::StatusOr<std::string> data = Download(name);
    ASSERT_TRUE(data.ok()) << name << ": " << data.status();
    for (int i = 0; i < 32; ++i) EXPECT_EQ(FloatAt(*data, i), static_cast<float>(i)) << name << i;
  }
  absl::StatusOr<TensorRecord> a = tensors_.Get("a");
  ASSERT_TRUE(a.ok());
  EXPECT_EQ(a->checksums[0][0], a->checksums[1][0]);
  EXPECT_EQ(a->incarnations.size(), 4u);
  absl::StatusOr<TensorRecord> d = tensors_.Get("d");
  ASSERT_TRUE(d.ok());
  EXPECT_TRUE(d->attached);
  EXPECT_EQ(d->unattached.size(), 4u);
  EXPECT_FALSE(client_.HasBuffer(0, "d", d->version));
  EXPECT_EQ(tensors_.List().size(), 4u);
}

TEST_F(TensorIoBulkTest, CreateManyNamesTheBadMemberAndCreatesNothing) {
  ASSERT_TRUE(Create("b", "S(0),R").ok());
  const int fills = client_.calls("FillMany");
  struct Case {
    std::vector<CreateTensorArgs> args;
    absl::StatusCode code;
    std::string message;
  };
  std::vector<Case> cases;
  cases.push_back({{}, absl::StatusCode::kInvalidArgument, "tensors: empty"});
  cases.push_back({{Args("a", "S(0),R"), Args("b", "S(0),R"), Args("c", "S(0),R")},
                   absl::StatusCode::kAlreadyExists,
                   "tensors[1] 'b': tensor 'b' already exists"});
  cases.push_back({{Args("a", "S(0),R"), Args("a", "R,R")},
                   absl::StatusCode::kInvalidArgument,
                   "tensors[1]: name 'a' is also tensors[0]"});
  cases.push_back({{Args("a", "S(0),R"), Args("c", "S(0)", v1::ARANGE, "nope")},
                   absl::StatusCode::kNotFound,
                   "tensors[1] 'c': "});
  cases.push_back({{Args("a", "S(0),R"), Args("c", "S(2),R")},
                   absl::StatusCode::kInvalidArgument,
                   "tensors[1] 'c': spec"});
  for (const Case& c : cases) {
    absl::StatusOr<TensorIo::CreatedMany> made = CreateMany(c.args);
    EXPECT_EQ(made.status().code(), c.code) << made.status();
    EXPECT_THAT(made.status().message(), HasSubstr(c.message));
    EXPECT_EQ(tensors_.Get("a").status().code(), absl::StatusCode::kNotFound);
    EXPECT_EQ(tensors_.Get("c").status().code(), absl::StatusCode::kNotFound);
  }
  EXPECT_EQ(client_.calls("FillMany"), fills);  // Refused before any worker was called.
  EXPECT_EQ(tensors_.List().size(), 1u);
}

// A worker that fails its fills undoes the whole call: no tensor, no buffer left, the names
// and meshes free for a retry.
TEST_F(TensorIoBulkTest, AFailedFillUndoesEveryMember) {
  client_.Fail("FillMany", 2, absl::ResourceExhaustedError("out of memory"));
  std::vector<CreateTensorArgs> args = {Args("a", "S(0),R"), Args("b", "R,S(1)"),
                                        Args("c", "S(0)", v1::ARANGE, "N")};
  absl::StatusOr<TensorIo::CreatedMany> made = CreateMany(args);
  EXPECT_EQ(made.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(made.status().message(),
              HasSubstr("creating 3 tensors: worker w2 (rank 2): RESOURCE_EXHAUSTED"));
  EXPECT_TRUE(tensors_.List().empty());
  for (const char* name : {"a", "b", "c"}) {
    EXPECT_EQ(tensors_.Get(name).status().code(), absl::StatusCode::kNotFound) << name;
    for (int64_t r = 0; r < 4; ++r) EXPECT_FALSE(client_.HasBuffer(r, name, -1)) << name << r;
  }
  EXPECT_EQ(meshes_.Delete("N").code(), absl::StatusCode::kOk);  // Nobody uses it.
  ASSERT_TRUE(meshes_.Create("N", {4}, {}, {}).ok());
  client_.Fail("FillMany", 2, absl::OkStatus());
  made = CreateMany(args);
  EXPECT_TRUE(made.ok()) << made.status();
}

// The members become visible in one store batch; a store that refuses it leaves nothing.
TEST_F(TensorIoBulkTest, CreateManyIsOneStoreBatch) {
  FlakyStore store("etcd unreachable");
  TensorManager stored(&meshes_, &store);
  TensorIo io(&workers_, &meshes_, &stored, &client_);
  std::vector<CreateTensorArgs> args;
  for (int i = 0; i < 50; ++i) args.push_back(Args(absl::StrCat("t", i), "S(0),R"));
  store.down = true;
  absl::StatusOr<TensorIo::CreatedMany> made = CreateMany(io, args);
  EXPECT_EQ(made.status().code(), absl::StatusCode::kUnavailable) << made.status();
  EXPECT_TRUE(stored.List().empty());
  EXPECT_EQ(stored.Get("t0").status().code(), absl::StatusCode::kNotFound);
  store.down = false;
  const int64_t applies = store.applies();
  made = CreateMany(io, args);
  ASSERT_TRUE(made.ok()) << made.status();
  // The version counter's block (first use) and the tensors: one batch for all 50.
  EXPECT_LE(store.applies(), applies + 2);
  EXPECT_EQ(stored.List().size(), 50u);
}

TEST_F(TensorIoBulkTest, DeleteManyTakesNamesAndAPrefixAndDropsTheirBuffers) {
  ASSERT_TRUE(CreateMany({Args("layers.0.w", "S(0),R"), Args("layers.1.w", "S(0),R"),
                          Args("head", "S(0),R"), Args("keep", "S(0),R")})
                  .ok());
  EXPECT_EQ(io_.DeleteMany({}, "").status().code(), absl::StatusCode::kInvalidArgument);
  absl::StatusOr<int64_t> gone = io_.DeleteMany({"head"}, "layers.");
  ASSERT_TRUE(gone.ok()) << gone.status();
  EXPECT_EQ(*gone, 3);
  ASSERT_EQ(tensors_.List().size(), 1u);
  EXPECT_EQ(tensors_.List()[0].name, "keep");
  for (int64_t r = 0; r < 4; ++r) EXPECT_FALSE(client_.HasBuffer(r, "head", -1)) << r;
  EXPECT_EQ(client_.calls("DropTensor"), 4);  // One per worker for all three.
  EXPECT_TRUE(client_.HasBuffer(0, "keep", -1));
}

}  // namespace
}  // namespace shardcoord
