#include "coordinator/io/tensor_streams.h"

#include <cstring>
#include <deque>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "coordinator/testing/fake_worker_client.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace shardcoord {
namespace {

using ::testing::HasSubstr;

// The fake workers, with ReadChunk answers and WriteChunk stream writes that can be held
// (to see what a session does while a fetch or a band write is in flight) or failed.
// Single-threaded: the tests release what is held.
class HoldingClient : public WorkerClient {
 public:
  void Execute(const WorkerEndpoint& w, v1::PlanFragment f, StatusCallback done) override {
    fake_.Execute(w, f, std::move(done));
  }
  void FinishPlan(const WorkerEndpoint& w, v1::FinishPlanRequest r, StatusCallback done) override {
    fake_.FinishPlan(w, std::move(r), std::move(done));
  }
  void Fill(const WorkerEndpoint& w, const v1::FillRequest& r,
            Callback<v1::FillResponse> done) override {
    fake_.Fill(w, r, std::move(done));
  }
  void DropTensor(const WorkerEndpoint& w, const v1::DropTensorRequest& r,
                  StatusCallback done) override {
    fake_.DropTensor(w, r, std::move(done));
  }
  void ReadChunk(const WorkerEndpoint& w, const v1::ReadChunkRequest& r,
                 Callback<std::string> done) override {
    reads_.push_back(r);
    if (!hold_reads_) return fake_.ReadChunk(w, r, std::move(done));
    held_reads_.push_back([this, w, r, done](std::optional<absl::Status> error) {
      if (error.has_value()) return done(*error);
      fake_.ReadChunk(w, r, done);
    });
  }
  void WriteChunk(const WorkerEndpoint& w, const v1::ChunkData& header, std::string data,
                  Callback<v1::WriteChunkResponse> done) override {
    fake_.WriteChunk(w, header, std::move(data), std::move(done));
  }
  std::shared_ptr<ChunkWriteStream> OpenWriteChunk(const WorkerEndpoint& w,
                                                   const v1::ChunkData& header) override {
    return std::make_shared<Stream>(this, w, WorkerClient::OpenWriteChunk(w, header));
  }

  FakeWorkerClient& fake() { return fake_; }
  void HoldReads() { hold_reads_ = true; }
  void HoldWrites() { hold_writes_ = true; }
  // Stream writes to `rank` fail from now on.
  void FailWrites(int64_t rank) { failing_writes_.push_back(rank); }
  int held_reads() const { return static_cast<int>(held_reads_.size()); }
  int held_writes() const { return static_cast<int>(held_writes_.size()); }
  // Answers the oldest held read, with the worker's data or `error`.
  void ReleaseRead(std::optional<absl::Status> error = std::nullopt) {
    auto next = std::move(held_reads_.front());
    held_reads_.pop_front();
    next(std::move(error));
  }
  void ReleaseWrites() {
    std::deque<std::function<void()>> held;
    held.swap(held_writes_);
    for (auto& f : held) f();
  }
  // The requests of every ReadChunk, in order.
  const std::vector<v1::ReadChunkRequest>& reads() const { return reads_; }

 private:
  class Stream : public ChunkWriteStream {
   public:
    Stream(HoldingClient* client, WorkerEndpoint w, std::shared_ptr<ChunkWriteStream> inner)
        : client_(client), worker_(std::move(w)), inner_(std::move(inner)) {}
    void Write(std::string data, std::function<void(absl::Status)> done) override {
      for (int64_t r : client_->failing_writes_) {
        if (r == worker_.rank) return done(absl::UnavailableError("disk full"));
      }
      if (!client_->hold_writes_) return inner_->Write(std::move(data), std::move(done));
      auto inner = inner_;
      client_->held_writes_.push_back(
          [inner, data = std::move(data), done]() mutable { inner->Write(std::move(data), done); });
    }
    void Finish(std::function<void(absl::StatusOr<v1::WriteChunkResponse>)> done) override {
      inner_->Finish(std::move(done));
    }
    void Cancel() override { inner_->Cancel(); }

   private:
    HoldingClient* const client_;
    const WorkerEndpoint worker_;
    const std::shared_ptr<ChunkWriteStream> inner_;
  };

  FakeWorkerClient fake_;
  bool hold_reads_ = false;
  bool hold_writes_ = false;
  std::vector<int64_t> failing_writes_;
  std::vector<v1::ReadChunkRequest> reads_;
  std::deque<std::function<void(std::optional<absl::Status>)>> held_reads_;
  std::deque<std::function<void()>> held_writes_;
};

class FakeUploadTransport : public UploadSession::Transport {
 public:
  void ReadNext() override {
    EXPECT_FALSE(result.has_value()) << "read asked after the end";
    ++reads;
  }
  void End(absl::StatusOr<TensorRecord> r) override {
    EXPECT_FALSE(result.has_value()) << "ended twice";
    result = std::move(r);
  }
  int reads = 0;
  std::optional<absl::StatusOr<TensorRecord>> result;
};

class FakeDownloadTransport : public DownloadSession::Transport {
 public:
  void Send(v1::TensorData message) override {
    EXPECT_FALSE(writing) << "a second write while one is in flight";
    EXPECT_FALSE(status.has_value()) << "a write after the end";
    writing = true;
    messages.push_back(std::move(message));
  }
  void End(absl::Status s) override {
    EXPECT_FALSE(writing) << "ended with a write in flight";
    EXPECT_FALSE(status.has_value()) << "ended twice";
    status = std::move(s);
  }
  // The data of every message after the header, joined.
  std::string Data() const {
    std::string out;
    for (size_t i = 1; i < messages.size(); ++i) out += messages[i].data();
    return out;
  }
  bool writing = false;
  std::vector<v1::TensorData> messages;
  std::optional<absl::Status> status;
};

// [8, 4] f32 tensors (128 bytes) in bands of one row (16 bytes).
class TensorStreamsTest : public ::testing::Test {
 protected:
  static constexpr int64_t kBytes = 8 * 4 * 4;

  TensorStreamsTest()
      : workers_(&clock_, absl::Seconds(5)),
        meshes_(&workers_),
        tensors_(&meshes_),
        io_(&workers_, &meshes_, &tensors_, &client_, /*band_bytes=*/16) {
    for (int i = 0; i < 4; ++i) {
      const std::string name = absl::StrCat("w", i);
      EXPECT_TRUE(workers_.Register(WorkerSpec{name, "h", "cpu", name + ":1", "gloo"}).ok());
    }
    EXPECT_TRUE(meshes_.Create("N", {4}, {}, {}).ok());
  }

  static v1::TensorHeader Header(const std::string& name = "T",
                                 const std::string& placements = "S(0)") {
    v1::TensorHeader h;
    h.set_name(name);
    h.add_shape(8);
    h.add_shape(4);
    h.set_dtype(v1::F32);
    if (!placements.empty()) {
      h.mutable_spec()->set_mesh("N");
      h.mutable_spec()->set_placements_text(placements);
    }
    return h;
  }
  static v1::TensorData HeaderMessage(const v1::TensorHeader& h, std::string data = "") {
    v1::TensorData m;
    *m.mutable_header() = h;
    m.set_data(std::move(data));
    return m;
  }
  static v1::TensorData DataMessage(std::string data) {
    v1::TensorData m;
    m.set_data(std::move(data));
    return m;
  }
  // Bytes 0, 1, 2, ... (mod 251, so no band repeats another).
  static std::string Pattern(int64_t n) {
    std::string out(static_cast<size_t>(n), '\0');
    for (int64_t i = 0; i < n; ++i) out[static_cast<size_t>(i)] = static_cast<char>(i % 251);
    return out;
  }

  // Whether `name` is taken, ready or reserved by an upload (Get sees only ready ones).
  bool Taken(const std::string& name) {
    TensorRecord probe;
    probe.name = name;
    if (!tensors_.Reserve(probe, "probe").ok()) return true;
    tensors_.CancelCreate(name, "probe");
    return false;
  }

  absl::StatusOr<std::string> DownloadAll(const std::string& name) {
    std::optional<absl::StatusOr<DownloadedTensor>> out;
    io_.Download(name, [&](absl::StatusOr<DownloadedTensor> r) { out = std::move(r); });
    EXPECT_TRUE(out.has_value());
    if (!out->ok()) return out->status();
    return (*out)->data;
  }

  // A whole upload of `data` as `T` (layout S(0) over N, one row per band).
  void UploadT(const std::string& data) {
    FakeUploadTransport t;
    UploadSession s(&io_, &t);
    s.OnMessage(HeaderMessage(Header(), data));
    s.OnEnd();
    ASSERT_TRUE(t.result.has_value());
    ASSERT_TRUE(t.result->ok()) << t.result->status();
  }

  // Answers every write until the session ends or stops writing.
  static void WriteAll(DownloadSession& s, FakeDownloadTransport& t) {
    while (t.writing) {
      t.writing = false;
      s.OnWriteDone(true);
    }
  }

  FakeClock clock_;
  WorkerManager workers_;
  MeshManager meshes_;
  TensorManager tensors_;
  HoldingClient client_;
  TensorIo io_;
};

// ---- ParseUploadHeader -------------------------------------------------------------------

TEST(ParseUploadHeaderTest, NamesTheFieldAndTheValue) {
  struct Case {
    std::function<void(v1::TensorHeader*)> edit;
    std::string message;
  };
  const std::vector<Case> cases = {
      {[](v1::TensorHeader* h) { h->clear_name(); }, "header.name: empty"},
      {[](v1::TensorHeader* h) { h->set_shape(1, -3); }, "header.shape[1] = -3 must be >= 0"},
      {[](v1::TensorHeader* h) { h->set_dtype(v1::DTYPE_UNSPECIFIED); },
       "header.dtype: unspecified"},
      {[](v1::TensorHeader* h) { h->mutable_spec()->set_placements_text("Q(9)"); },
       "header.spec.placements_text"},
      {[](v1::TensorHeader* h) { h->set_total_bytes(15); },
       "header.total_bytes = 15 but a [8, 4] f32 tensor has 128"},
      {[](v1::TensorHeader* h) {
         h->set_has_rank(true);
         h->set_rank(-1);
       },
       "header.rank = -1 must be >= 0"},
      {[](v1::TensorHeader* h) {
         h->set_has_rank(true);
         h->set_total_bytes(-5);
       },
       "header.total_bytes = -5 must be >= 0"},
  };
  for (const Case& c : cases) {
    v1::TensorHeader h;
    h.set_name("T");
    h.add_shape(8);
    h.add_shape(4);
    h.set_dtype(v1::F32);
    h.mutable_spec()->set_mesh("N");
    h.mutable_spec()->set_placements_text("S(0)");
    c.edit(&h);
    absl::StatusOr<UploadHeader> got = ParseUploadHeader(h);
    ASSERT_FALSE(got.ok()) << c.message;
    EXPECT_EQ(got.status().code(), absl::StatusCode::kInvalidArgument) << got.status();
    EXPECT_THAT(std::string(got.status().message()), HasSubstr(c.message));
  }
}

TEST(ParseUploadHeaderTest, LimitIsTheTensorOrTheRankBuffer) {
  v1::TensorHeader h;
  h.set_name("T");
  h.add_shape(8);
  h.add_shape(4);
  h.set_dtype(v1::F64);
  absl::StatusOr<UploadHeader> whole = ParseUploadHeader(h);
  ASSERT_TRUE(whole.ok()) << whole.status();
  EXPECT_EQ(whole->limit, 256);
  EXPECT_FALSE(whole->args.rank.has_value());
  EXPECT_FALSE(whole->args.spec.has_value());  // An empty spec keeps an existing layout.

  h.set_has_rank(true);
  h.set_rank(2);
  absl::StatusOr<UploadHeader> rank = ParseUploadHeader(h);
  ASSERT_TRUE(rank.ok()) << rank.status();
  EXPECT_EQ(rank->args.rank, 2);
  EXPECT_EQ(rank->limit, 256);  // total_bytes 0: at most the tensor.
  h.set_total_bytes(64);
  EXPECT_EQ(ParseUploadHeader(h)->limit, 64);
}

// ---- UploadSession -----------------------------------------------------------------------

TEST_F(TensorStreamsTest, UploadRefusesAFirstMessageWithoutHeader) {
  FakeUploadTransport t;
  UploadSession s(&io_, &t);
  s.OnMessage(DataMessage("abcd"));
  ASSERT_TRUE(t.result.has_value());
  EXPECT_EQ(t.result->status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(t.result->status().message()),
              HasSubstr("header: missing in the first message"));
  EXPECT_EQ(t.reads, 0);
}

TEST_F(TensorStreamsTest, UploadRefusesAnEmptyStream) {
  FakeUploadTransport t;
  UploadSession s(&io_, &t);
  s.OnEnd();
  ASSERT_TRUE(t.result.has_value());
  EXPECT_EQ(t.result->status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(t.result->status().message()), HasSubstr("header: no message received"));
}

TEST_F(TensorStreamsTest, UploadRefusesASecondHeaderAndDropsWhatWasReserved) {
  FakeUploadTransport t;
  UploadSession s(&io_, &t);
  s.OnMessage(HeaderMessage(Header(), Pattern(20)));
  EXPECT_EQ(t.reads, 1);
  EXPECT_TRUE(Taken("T"));  // Reserved.
  s.OnMessage(HeaderMessage(Header()));
  ASSERT_TRUE(t.result.has_value());
  EXPECT_EQ(t.result->status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(t.result->status().message()),
              HasSubstr("header: sent again after the first message"));
  EXPECT_FALSE(Taken("T"));
}

TEST_F(TensorStreamsTest, UploadBadHeaderEndsBeforeAnythingIsReserved) {
  FakeUploadTransport t;
  UploadSession s(&io_, &t);
  v1::TensorHeader h = Header();
  h.set_total_bytes(7);
  s.OnMessage(HeaderMessage(h));
  ASSERT_TRUE(t.result.has_value());
  EXPECT_EQ(t.result->status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(t.result->status().message()), HasSubstr("header.total_bytes = 7"));
  EXPECT_FALSE(Taken("T"));
  EXPECT_EQ(t.reads, 0);
}

TEST_F(TensorStreamsTest, UploadAssemblesBandsAcrossMessageBoundaries) {
  const std::string data = Pattern(kBytes);
  FakeUploadTransport t;
  UploadSession s(&io_, &t);
  // Pieces that start and end mid-band, one that holds several bands, an empty one.
  const std::vector<size_t> cuts = {5, 23, 23, 70, 71, 128};
  s.OnMessage(HeaderMessage(Header(), data.substr(0, cuts[0])));
  for (size_t i = 1; i < cuts.size(); ++i) {
    EXPECT_EQ(t.reads, static_cast<int>(i));
    s.OnMessage(DataMessage(data.substr(cuts[i - 1], cuts[i] - cuts[i - 1])));
  }
  EXPECT_EQ(t.reads, static_cast<int>(cuts.size()));
  EXPECT_FALSE(t.result.has_value());
  s.OnEnd();
  ASSERT_TRUE(t.result.has_value());
  ASSERT_TRUE(t.result->ok()) << t.result->status();
  EXPECT_EQ((*t.result)->version, (*tensors_.Get("T")).version);
  EXPECT_EQ((*t.result)->spec, "S(0)");
  absl::StatusOr<std::string> back = DownloadAll("T");
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(*back, data);
  // Rank 1 holds rows [2, 4).
  EXPECT_EQ(client_.fake().Buffer(1, "T", (*t.result)->version), data.substr(32, 32));
}

TEST_F(TensorStreamsTest, UploadReadsNothingWhileABandIsBeingWritten) {
  client_.HoldWrites();
  const std::string data = Pattern(kBytes);
  FakeUploadTransport t;
  UploadSession s(&io_, &t);
  // Band 0 and 4 bytes of band 1: band 0 goes out, and no read until it was written.
  s.OnMessage(HeaderMessage(Header(), data.substr(0, 20)));
  EXPECT_EQ(client_.held_writes(), 1);
  EXPECT_EQ(t.reads, 0);
  client_.ReleaseWrites();
  EXPECT_EQ(t.reads, 1);
  // Bands 1 and 2 are complete in this message: one at a time.
  s.OnMessage(DataMessage(data.substr(20, 40)));
  EXPECT_EQ(client_.held_writes(), 1);
  client_.ReleaseWrites();
  EXPECT_EQ(client_.held_writes(), 1);
  EXPECT_EQ(t.reads, 1);
  client_.ReleaseWrites();
  EXPECT_EQ(t.reads, 2);
  s.OnMessage(DataMessage(data.substr(60)));
  while (client_.held_writes() > 0) client_.ReleaseWrites();
  EXPECT_EQ(t.reads, 3);
  s.OnEnd();
  ASSERT_TRUE(t.result.has_value());
  ASSERT_TRUE(t.result->ok()) << t.result->status();
  EXPECT_EQ(*DownloadAll("T"), data);
}

TEST_F(TensorStreamsTest, UploadShortDataFailsAndKeepsNothing) {
  FakeUploadTransport t;
  UploadSession s(&io_, &t);
  s.OnMessage(HeaderMessage(Header(), Pattern(100)));
  s.OnEnd();
  ASSERT_TRUE(t.result.has_value());
  EXPECT_EQ(t.result->status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(t.result->status().message()),
              HasSubstr("data: 100 bytes for a [8, 4] f32 tensor of 128 bytes"));
  EXPECT_FALSE(Taken("T"));
}

TEST_F(TensorStreamsTest, UploadTooMuchDataFails) {
  FakeUploadTransport t;
  UploadSession s(&io_, &t);
  s.OnMessage(HeaderMessage(Header(), Pattern(100)));
  s.OnMessage(DataMessage(Pattern(29)));
  ASSERT_TRUE(t.result.has_value());
  EXPECT_EQ(t.result->status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(t.result->status().message()),
              HasSubstr("data: more than the 128 bytes the header announced"));
  EXPECT_FALSE(Taken("T"));
}

TEST_F(TensorStreamsTest, UploadWorkerFailureMidStreamEndsTheCallAndKeepsTheOldVersion) {
  UploadT(Pattern(kBytes));
  const int64_t old_version = tensors_.Get("T")->version;
  client_.FailWrites(1);
  FakeUploadTransport t;
  UploadSession s(&io_, &t);
  // Bands 0 and 1 go to rank 0; band 2 is rank 1's first.
  s.OnMessage(HeaderMessage(Header(), std::string(32, 'x')));
  EXPECT_EQ(t.reads, 1);
  EXPECT_FALSE(t.result.has_value());
  s.OnMessage(DataMessage(std::string(16, 'y')));
  ASSERT_TRUE(t.result.has_value());
  EXPECT_EQ(t.result->status().code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(std::string(t.result->status().message()),
              HasSubstr("uploading 'T': worker w1 (rank 1): UNAVAILABLE: disk full"));
  EXPECT_EQ(t.reads, 1);
  absl::StatusOr<TensorRecord> now = tensors_.Get("T");
  ASSERT_TRUE(now.ok());
  EXPECT_EQ(now->version, old_version);
  EXPECT_TRUE(now->busy_plan.empty());
  EXPECT_EQ(*DownloadAll("T"), Pattern(kBytes));
}

TEST_F(TensorStreamsTest, UploadFailureAtTheWorkersAnswerEndsTheCall) {
  client_.fake().Fail("WriteChunk", 3, absl::UnavailableError("gone"));
  FakeUploadTransport t;
  UploadSession s(&io_, &t);
  s.OnMessage(HeaderMessage(Header(), Pattern(kBytes)));
  EXPECT_FALSE(t.result.has_value());
  s.OnEnd();
  ASSERT_TRUE(t.result.has_value());
  EXPECT_EQ(t.result->status().code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(std::string(t.result->status().message()), HasSubstr("worker w3 (rank 3)"));
  EXPECT_FALSE(Taken("T"));
}

TEST_F(TensorStreamsTest, UploadDestroyedMidStreamAbortsTheUpload) {
  {
    FakeUploadTransport t;
    UploadSession s(&io_, &t);
    s.OnMessage(HeaderMessage(Header(), Pattern(40)));
    EXPECT_TRUE(Taken("T"));  // Reserved while the upload runs.
  }
  EXPECT_FALSE(Taken("T"));
}

TEST_F(TensorStreamsTest, RankUploadCollectsTheBufferThenWritesIt) {
  UploadT(Pattern(kBytes));
  v1::TensorHeader h = Header("T", "");
  h.set_has_rank(true);
  h.set_rank(2);
  h.set_total_bytes(32);
  FakeUploadTransport t;
  UploadSession s(&io_, &t);
  s.OnMessage(HeaderMessage(h, std::string(10, 'a')));
  s.OnMessage(DataMessage(std::string(22, 'b')));
  EXPECT_EQ(t.reads, 2);
  EXPECT_FALSE(t.result.has_value());
  s.OnEnd();
  ASSERT_TRUE(t.result.has_value());
  ASSERT_TRUE(t.result->ok()) << t.result->status();
  std::string want = Pattern(kBytes);
  want.replace(64, 32, std::string(10, 'a') + std::string(22, 'b'));
  EXPECT_EQ(*DownloadAll("T"), want);
}

TEST_F(TensorStreamsTest, RankUploadOfTheWrongSizeFails) {
  UploadT(Pattern(kBytes));
  v1::TensorHeader h = Header("T", "");
  h.set_has_rank(true);
  h.set_rank(2);
  FakeUploadTransport t;
  UploadSession s(&io_, &t);
  s.OnMessage(HeaderMessage(h, std::string(12, 'a')));
  s.OnEnd();
  ASSERT_TRUE(t.result.has_value());
  EXPECT_EQ(t.result->status().code(), absl::StatusCode::kInvalidArgument);
}

// A caller's total_bytes is a claim: an unknown tensor answers NOT_FOUND before any data is
// read, whatever size it declares (it used to reserve that many bytes first).
TEST_F(TensorStreamsTest, RankUploadOfAnUnknownTensorFailsBeforeReading) {
  v1::TensorHeader h = Header("nope", "");
  h.clear_shape();
  h.add_shape(int64_t{1} << 38);  // 1 TiB of f32.
  h.set_has_rank(true);
  h.set_rank(0);
  h.set_total_bytes(int64_t{1} << 40);
  FakeUploadTransport t;
  UploadSession s(&io_, &t);
  s.OnMessage(HeaderMessage(h));
  ASSERT_TRUE(t.result.has_value());
  EXPECT_EQ(t.result->status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(t.reads, 0);
}

TEST_F(TensorStreamsTest, RankUploadDeclaringAnotherSizeThanTheBufferFailsBeforeReading) {
  UploadT(Pattern(kBytes));
  v1::TensorHeader h = Header("T", "");
  h.set_has_rank(true);
  h.set_rank(2);
  h.set_total_bytes(int64_t{1} << 40);
  FakeUploadTransport t;
  UploadSession s(&io_, &t);
  s.OnMessage(HeaderMessage(h));
  ASSERT_TRUE(t.result.has_value());
  EXPECT_EQ(t.result->status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(t.result->status().message()),
              HasSubstr("header.total_bytes = 1099511627776 but rank 2's local buffer of 'T' "
                        "holds 32"));
  EXPECT_EQ(t.reads, 0);
}

TEST_F(TensorStreamsTest, WholeUploadOfAnUnknownTensorWithoutSpecIsNotFound) {
  v1::TensorHeader h = Header("nope", "");
  h.clear_spec();
  FakeUploadTransport t;
  UploadSession s(&io_, &t);
  s.OnMessage(HeaderMessage(h));
  ASSERT_TRUE(t.result.has_value());
  EXPECT_EQ(t.result->status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(std::string(t.result->status().message()), HasSubstr("tensor 'nope' not found"));
  EXPECT_EQ(t.reads, 0);
}

// ---- DownloadSession ---------------------------------------------------------------------

TEST_F(TensorStreamsTest, DownloadOfAMissingTensorEndsWithoutSending) {
  FakeDownloadTransport t;
  DownloadSession s(&io_, &t, 6);
  s.Start("nope");
  ASSERT_TRUE(t.status.has_value());
  EXPECT_EQ(t.status->code(), absl::StatusCode::kNotFound);
  EXPECT_TRUE(t.messages.empty());
}

TEST_F(TensorStreamsTest, DownloadSendsTheHeaderThenBandsInSlices) {
  const std::string data = Pattern(kBytes);
  UploadT(data);
  FakeDownloadTransport t;
  DownloadSession s(&io_, &t, /*slice=*/6);
  s.Start("T");
  ASSERT_EQ(t.messages.size(), 1u);
  const v1::TensorHeader& h = t.messages[0].header();
  EXPECT_EQ(h.name(), "T");
  EXPECT_EQ(h.shape_size(), 2);
  EXPECT_EQ(h.dtype(), v1::F32);
  EXPECT_EQ(h.spec().mesh(), "N");
  EXPECT_EQ(h.total_bytes(), kBytes);
  EXPECT_TRUE(t.messages[0].data().empty());
  WriteAll(s, t);
  ASSERT_TRUE(t.status.has_value());
  EXPECT_TRUE(t.status->ok()) << *t.status;
  EXPECT_EQ(t.Data(), data);
  // Each 16-byte band as 6 + 6 + 4: a message never spans two bands.
  ASSERT_EQ(t.messages.size(), 1u + 8 * 3);
  for (size_t i = 1; i < t.messages.size(); ++i) {
    EXPECT_FALSE(t.messages[i].has_header());
    EXPECT_EQ(t.messages[i].data().size(), (i % 3 == 0) ? 4u : 6u) << i;
  }
}

TEST_F(TensorStreamsTest, DownloadFetchesOneBandAheadOfTheOneBeingWritten) {
  const std::string data = Pattern(kBytes);
  UploadT(data);
  client_.HoldReads();
  const size_t reads_before = client_.reads().size();
  FakeDownloadTransport t;
  DownloadSession s(&io_, &t, /*slice=*/16);
  s.Start("T");
  // The header is out, band 0 alone is fetched.
  ASSERT_EQ(t.messages.size(), 1u);
  EXPECT_EQ(client_.held_reads(), 1);
  // The header written before band 0 arrived: nothing to write, nothing more fetched.
  t.writing = false;
  s.OnWriteDone(true);
  EXPECT_FALSE(t.writing);
  EXPECT_EQ(client_.held_reads(), 1);
  for (int band = 0; band < 8; ++band) {
    // Band `band` arrives: it is written at once and band + 1 is fetched meanwhile.
    client_.ReleaseRead();
    ASSERT_TRUE(t.writing) << band;
    EXPECT_EQ(t.messages.back().data(), data.substr(band * 16, 16));
    EXPECT_EQ(client_.held_reads(), band < 7 ? 1 : 0) << band;
    t.writing = false;
    s.OnWriteDone(true);
    // Band + 1 is not there yet: the session waits, fetching no further.
    EXPECT_FALSE(t.writing);
    EXPECT_EQ(client_.held_reads(), band < 7 ? 1 : 0) << band;
    if (band < 7) {
      EXPECT_FALSE(t.status.has_value());
    }
  }
  ASSERT_TRUE(t.status.has_value());
  EXPECT_TRUE(t.status->ok()) << *t.status;
  // Bands were read in order, one row each.
  ASSERT_EQ(client_.reads().size(), reads_before + 8);
  for (size_t i = 0; i < 8; ++i) {
    const v1::ReadChunkRequest& r = client_.reads()[reads_before + i];
    EXPECT_EQ(r.box().offset(0), static_cast<int64_t>(i)) << r.DebugString();
    EXPECT_EQ(r.box().shape(0), 1) << r.DebugString();
  }
}

TEST_F(TensorStreamsTest, DownloadWithReadyBandsWritesThemInOrderAndHoldsTwoAtMost) {
  const std::string data = Pattern(kBytes);
  UploadT(data);
  client_.HoldReads();
  FakeDownloadTransport t;
  DownloadSession s(&io_, &t, /*slice=*/16);
  s.Start("T");
  // Band 0 arrives while the header is being written; band 1 is not fetched yet.
  client_.ReleaseRead();
  EXPECT_EQ(client_.held_reads(), 0);
  t.writing = false;
  s.OnWriteDone(true);  // Band 0 goes out, band 1 is fetched.
  EXPECT_EQ(t.messages.back().data(), data.substr(0, 16));
  EXPECT_EQ(client_.held_reads(), 1);
  client_.ReleaseRead();  // Band 1 is ready behind band 0's write: held, not written.
  EXPECT_EQ(client_.held_reads(), 0);
  EXPECT_EQ(t.messages.size(), 2u);
  t.writing = false;
  s.OnWriteDone(true);
  EXPECT_EQ(t.messages.back().data(), data.substr(16, 16));
  EXPECT_EQ(client_.held_reads(), 1);
}

TEST_F(TensorStreamsTest, DownloadFetchErrorEndsOnlyAfterTheWriteInFlight) {
  UploadT(Pattern(kBytes));
  client_.HoldReads();
  FakeDownloadTransport t;
  DownloadSession s(&io_, &t, /*slice=*/16);
  s.Start("T");
  client_.ReleaseRead();  // Band 0, behind the header.
  t.writing = false;
  s.OnWriteDone(true);  // Band 0 is written; band 1 is fetched.
  ASSERT_TRUE(t.writing);
  client_.ReleaseRead(absl::UnavailableError("worker w0 (rank 0): gone"));
  EXPECT_FALSE(t.status.has_value());  // Band 0's write is still in flight.
  t.writing = false;
  s.OnWriteDone(true);
  EXPECT_FALSE(t.writing);
  ASSERT_TRUE(t.status.has_value());
  EXPECT_EQ(t.status->code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(std::string(t.status->message()), HasSubstr("gone"));
  EXPECT_EQ(t.messages.size(), 2u);
}

TEST_F(TensorStreamsTest, DownloadWorkerFailureEndsWithUnavailable) {
  UploadT(Pattern(kBytes));
  client_.fake().Fail("ReadChunk", 1, absl::UnavailableError("gone"));
  FakeDownloadTransport t;
  DownloadSession s(&io_, &t, /*slice=*/16);
  s.Start("T");
  WriteAll(s, t);
  ASSERT_TRUE(t.status.has_value());
  EXPECT_EQ(t.status->code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(std::string(t.status->message()), HasSubstr("rank 1"));
  // Rank 0's rows at most: nothing of rank 1 or after.
  EXPECT_LE(t.Data().size(), 32u);
  EXPECT_EQ(t.Data(), Pattern(kBytes).substr(0, t.Data().size()));
}

TEST_F(TensorStreamsTest, DownloadCancelWaitsForTheFetchInFlight) {
  UploadT(Pattern(kBytes));
  client_.HoldReads();
  FakeDownloadTransport t;
  DownloadSession s(&io_, &t, /*slice=*/16);
  s.Start("T");
  t.writing = false;
  s.OnWriteDone(true);
  s.OnCancel();
  EXPECT_FALSE(t.status.has_value());  // Band 0's fetch still runs.
  client_.ReleaseRead();
  ASSERT_TRUE(t.status.has_value());
  EXPECT_EQ(t.status->code(), absl::StatusCode::kCancelled);
  EXPECT_FALSE(t.writing);
  EXPECT_EQ(t.messages.size(), 1u);
}

TEST_F(TensorStreamsTest, DownloadBrokenStreamEndsCancelled) {
  UploadT(Pattern(kBytes));
  FakeDownloadTransport t;
  DownloadSession s(&io_, &t, /*slice=*/16);
  s.Start("T");
  t.writing = false;
  s.OnWriteDone(true);
  ASSERT_TRUE(t.writing);
  t.writing = false;
  s.OnWriteDone(false);
  ASSERT_TRUE(t.status.has_value());
  EXPECT_EQ(t.status->code(), absl::StatusCode::kCancelled);
  EXPECT_THAT(std::string(t.status->message()), HasSubstr("stream broken"));
}

}  // namespace
}  // namespace shardcoord
