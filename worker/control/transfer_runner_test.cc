// Prepared transfers on workers: pages, the resident part, runs through the plan runner over
// Gloo on loopback (four workers in one process), commits, aborts and the refusals.
#include "worker/control/transfer_runner.h"

#include <cstring>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "proto/convert.h"
#include "sharding/fill.h"
#include "sharding/layout.h"
#include "sharding/mesh.h"
#include "sharding/placement.h"
#include "sharding/transfer_table.h"
#include "worker/buffers/buffer_store.h"
#include "worker/comm/gloo/gloo_communicator.h"
#include "worker/control/kv_client.h"
#include "worker/control/worker_core.h"
#include "worker/testing/gloo_test_worker.h"

namespace shardcoord {
namespace {

using ::testing::HasSubstr;

constexpr int kRanks = 4;
constexpr int64_t kIncarnation = 7;
constexpr int64_t kSrcVersion = 3;
constexpr int64_t kDstVersion = 7;

// A transfer's runs answer their RunTransfer; they never report chunks.
class NoReports : public ChunkReporter {
 public:
  absl::Status ReportChunks(const v1::ReportChunksRequest& request) override {
    ADD_FAILURE() << "a transfer's run reported chunks: " << request.ShortDebugString();
    return absl::OkStatus();
  }
};

// Memory the test lends as an attached dst's buffer.
class TestLent : public LentMemory {
 public:
  std::string Describe() const override { return "test memory"; }
};

struct TestWorker : worker_testing::GlooTestWorker {
  TestWorker(KvClient* kv, ChunkReporter* reporter, int rank)
      : GlooTestWorker(kv, reporter, rank, kIncarnation) {}
};

// RunTransfer's answers by (run id, rank).
class Answers {
 public:
  using Answer = absl::StatusOr<v1::RunTransferWorkerResponse>;
  TransferRunner::RunDone For(const std::string& run_id, int rank) {
    return [this, key = std::make_pair(run_id, rank)](Answer answer) {
      absl::MutexLock lock(&mu_);
      EXPECT_TRUE(answers_.emplace(key, std::move(answer)).second)
          << "answered twice: " << key.first << " rank " << key.second;
    };
  }
  Answer Wait(const std::string& run_id, int rank) {
    const auto key = std::make_pair(run_id, rank);
    absl::MutexLock lock(&mu_);
    auto there = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return answers_.count(key) > 0; };
    mu_.Await(absl::Condition(&there));
    return answers_.at(key);
  }
  bool Has(const std::string& run_id, int rank) {
    absl::MutexLock lock(&mu_);
    return answers_.count(std::make_pair(run_id, rank)) > 0;
  }

 private:
  absl::Mutex mu_;
  std::map<std::pair<std::string, int>, Answer> answers_ ABSL_GUARDED_BY(mu_);
};

Layout Placed(const DeviceMesh& mesh, const Shape& shape, const std::string& placements) {
  absl::StatusOr<std::vector<Placement>> p = ParsePlacements(placements);
  EXPECT_TRUE(p.ok()) << p.status();
  absl::StatusOr<Layout> l = Layout::FromPlacements(mesh, shape, *p);
  EXPECT_TRUE(l.ok()) << l.status();
  return *l;
}

// A weight sync in small: a trainer on a 1-d mesh of ranks 0-3 to an engine on a (2, 2) mesh
// of the same ranks, replicated over its first dimension (ranks 0 and 2 hold the same
// chunks, and 1 and 3). a and b share a template; d's dst is attached (lent memory).
TransferTable Table() {
  const DeviceMesh train = *DeviceMesh::Create({4});
  const DeviceMesh engine = *DeviceMesh::Create({2, 2});
  TransferTable t;
  t.layouts = {
      Placed(train, {8, 12}, "S(0)"),     // 0: a's and b's src
      Placed(engine, {8, 12}, "R,S(1)"),  // 1: a's, b's and d's dst
      Placed(train, {6, 8}, "S(1)"),      // 2: c's src
      Placed(engine, {6, 8}, "R,S(0)"),   // 3: c's dst
      Placed(train, {8, 12}, "S(1)"),     // 4: d's src
  };
  auto add = [&](std::string src, std::string dst, int32_t from, int32_t to) {
    TransferMemberSpec& m = t.members.emplace_back();
    m.src = std::move(src);
    m.dst = std::move(dst);
    m.src_version = kSrcVersion;
    m.dst_version = kDstVersion;
    m.src_layout = from;
    m.dst_layout = to;
    m.dtype = DType::kF32;
  };
  add("a.src", "a.dst", 0, 1);
  add("b.src", "b.dst", 0, 1);
  add("c.src", "c.dst", 2, 3);
  add("d.src", "d.dst", 4, 1);
  t.members.back().dst_attached = true;
  t.hosts_by_rank = {"h0", "h0", "h1", "h1"};
  return t;
}

// The table in two pages (layouts and members split), page 0 listing `incarnations` for
// `ranks`.
std::vector<v1::PrepareTransferRequest> Pages(
    const TransferTable& t, const std::string& id, const std::vector<int64_t>& ranks = {0, 1, 2, 3},
    const std::vector<int64_t>& incarnations = std::vector<int64_t>(kRanks, kIncarnation)) {
  std::vector<bool> attached_layout(t.layouts.size(), false);
  for (const TransferMemberSpec& m : t.members) {
    if (m.dst_attached) attached_layout[m.dst_layout] = true;
  }
  std::vector<v1::PrepareTransferRequest> pages(2);
  for (int p = 0; p < 2; ++p) {
    pages[p].set_transfer_id(id);
    pages[p].set_page(p);
  }
  pages[1].set_last(true);
  v1::PrepareTransferRequest& first = pages[0];
  for (const std::string& h : t.hosts_by_rank) first.add_hosts_by_rank(h);
  for (int64_t r : ranks) first.add_ranks(r);
  for (int64_t i : incarnations) first.add_incarnations(i);
  first.set_step_timeout_ms(30000);
  for (size_t i = 0; i < t.layouts.size(); ++i) {
    *pages[i < 2 ? 0 : 1].add_layouts() = TransferLayoutToProto(t.layouts[i], attached_layout[i]);
  }
  for (size_t i = 0; i < t.members.size(); ++i) {
    *pages[i < 2 ? 0 : 1].add_members() = TransferMemberToProto(t.members[i]);
  }
  return pages;
}

absl::StatusOr<v1::PrepareTransferResponse> PrepareOn(
    TestWorker& w, const std::vector<v1::PrepareTransferRequest>& pages) {
  absl::StatusOr<v1::PrepareTransferResponse> r;
  for (const v1::PrepareTransferRequest& page : pages) {
    r = w.transfers().Prepare(page);
    if (!r.ok()) return r;
  }
  return r;
}

// The RANDOM fill of `seed` in every chunk of `buffer` (a tensor of `shape`).
void ExpectValues(const HostBuffer& buffer, const Shape& shape, uint64_t seed,
                  const std::string& what) {
  for (size_t i = 0; i < buffer.chunks().chunks.size(); ++i) {
    const Box& box = buffer.chunks().chunks[i].box;
    std::vector<float> want(static_cast<size_t>(box.Volume()));
    ASSERT_TRUE(FillBox(FillKind::kRandom, seed, shape, box, DType::kF32, want.data()).ok());
    EXPECT_EQ(std::memcmp(buffer.chunk_data(i), want.data(), want.size() * 4), 0)
        << what << " chunk " << i << " " << box.ToString() << " seed " << seed;
  }
}

class TransferRunnerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    table_ = Table();
    for (int r = 0; r < kRanks; ++r) {
      workers_.push_back(std::make_unique<TestWorker>(&kv_, &reporter_, r));
      lent_.emplace_back();
    }
    for (int r = 0; r < kRanks; ++r) {
      FillSources(r, /*round=*/1);
      for (const TransferMemberSpec& m : table_.members) {
        const RankChunks& rc = *table_.layouts[m.dst_layout].Find(r);
        if (!m.dst_attached) {
          ASSERT_TRUE(
              workers_[r]
                  ->core.Fill(FillRequest(m.dst, kDstVersion, rc, m.dst_layout, v1::ZEROS, 0))
                  .ok());
          continue;
        }
        // The inference process's buffer, lent at the dst's version.
        lent_[r].assign(static_cast<size_t>(rc.local_elements), -1.0f);
        std::shared_ptr<HostBuffer> buffer = *HostBuffer::Wrap(
            DType::kF32, rc, &HostMemorySpace::Global(), reinterpret_cast<char*>(lent_[r].data()),
            std::make_shared<TestLent>());
        ASSERT_TRUE(workers_[r]->buffers.Store(m.dst, kDstVersion, buffer).ok());
      }
    }
  }

  v1::FillRequest FillRequest(const std::string& tensor, int64_t version, const RankChunks& rc,
                              int32_t layout, v1::InitKind init, uint64_t seed) {
    v1::FillRequest req;
    req.set_tensor(tensor);
    req.set_version(version);
    req.set_dtype(v1::F32);
    *req.mutable_chunks() = RankChunksToProto(rc);
    for (int64_t d : table_.layouts[layout].global_shape()) req.add_global_shape(d);
    req.set_init(init);
    req.set_seed(seed);
    return req;
  }

  // Each member's src at its (unchanged) version holds the RANDOM fill of Seed(member, round).
  static uint64_t Seed(size_t member, int round) { return 1000 * round + member; }
  void FillSources(int r, int round) {
    for (size_t i = 0; i < table_.members.size(); ++i) {
      const TransferMemberSpec& m = table_.members[i];
      const RankChunks& rc = *table_.layouts[m.src_layout].Find(r);
      ASSERT_TRUE(
          workers_[r]
              ->core
              .Fill(FillRequest(m.src, kSrcVersion, rc, m.src_layout, v1::RANDOM, Seed(i, round)))
              .ok());
    }
  }

  std::vector<v1::PrepareTransferResponse> PrepareAll(const std::string& id) {
    std::vector<v1::PrepareTransferResponse> out;
    for (int r = 0; r < kRanks; ++r) {
      absl::StatusOr<v1::PrepareTransferResponse> got = PrepareOn(*workers_[r], Pages(table_, id));
      EXPECT_TRUE(got.ok()) << "rank " << r << ": " << got.status();
      out.push_back(got.ok() ? *got : v1::PrepareTransferResponse());
    }
    return out;
  }

  v1::RunTransferWorkerRequest RunRequest(const std::string& id, const std::string& run_id, int r,
                                          int64_t version) {
    v1::RunTransferWorkerRequest req;
    req.set_transfer_id(id);
    req.set_run_id(run_id);
    req.set_rank(r);
    req.set_version(version);
    req.set_bucket_bytes(64);  // Several buckets per stream.
    req.set_communicator_prefix(absl::StrCat("xfer/", run_id, "/"));
    req.set_step_timeout_ms(30000);
    return req;
  }
  void StartRun(const std::string& id, const std::string& run_id, int r, int64_t version) {
    workers_[r]->transfers().Run(RunRequest(id, run_id, r, version), answers_.For(run_id, r));
  }
  // Runs `run_id` on every rank; every answer OK.
  std::vector<v1::RunTransferWorkerResponse> RunAll(const std::string& id,
                                                    const std::string& run_id, int64_t version) {
    for (int r = 0; r < kRanks; ++r) StartRun(id, run_id, r, version);
    std::vector<v1::RunTransferWorkerResponse> out;
    for (int r = 0; r < kRanks; ++r) {
      Answers::Answer a = answers_.Wait(run_id, r);
      EXPECT_TRUE(a.ok()) << run_id << " rank " << r << ": " << a.status();
      out.push_back(a.ok() ? *a : v1::RunTransferWorkerResponse());
    }
    return out;
  }
  void FinishAll(const std::string& run_id, bool commit) {
    v1::FinishPlanRequest req;
    req.set_plan_id(run_id);
    req.set_commit(commit);
    for (auto& w : workers_) ASSERT_TRUE(w->core.FinishPlan(req).ok());
  }

  // Every dst on every rank holds round `round`'s values at `version` (attached ones in the
  // lent memory itself) and nothing at `gone`.
  void ExpectDsts(int64_t version, int round, int64_t gone) {
    for (int r = 0; r < kRanks; ++r) {
      for (size_t i = 0; i < table_.members.size(); ++i) {
        const TransferMemberSpec& m = table_.members[i];
        SCOPED_TRACE(absl::StrCat("rank ", r, " ", m.dst, " v", version));
        std::shared_ptr<HostBuffer> b = workers_[r]->buffers.Find(m.dst, version);
        ASSERT_NE(b, nullptr);
        EXPECT_EQ(b->attached(), m.dst_attached);
        if (m.dst_attached) {
          EXPECT_EQ(b->data(), reinterpret_cast<char*>(lent_[r].data()));
        }
        ExpectValues(*b, table_.layouts[m.dst_layout].global_shape(), Seed(i, round), m.dst);
        EXPECT_EQ(workers_[r]->buffers.Find(m.dst, gone), nullptr) << "v" << gone;
        EXPECT_NE(workers_[r]->buffers.Find(m.src, kSrcVersion), nullptr);  // Only read.
      }
    }
  }

  InMemoryKvClient kv_;
  NoReports reporter_;
  TransferTable table_;
  std::vector<std::unique_ptr<TestWorker>> workers_;
  std::vector<std::vector<float>> lent_;  // Per rank: d.dst's lent buffer.
  Answers answers_;
};

// Every worker gets the same pages; a run writes every dst at the run's version, and a commit
// drops the previous one. The next run reads the sources at their unchanged versions (their
// values changed in place, as a trainer's do) and writes the next version.
TEST_F(TransferRunnerTest, PreparedOnceRunTwiceCommittingEach) {
  const std::vector<v1::PrepareTransferResponse> prepared = PrepareAll("sync@1");
  int64_t sent = 0, received = 0, moved = 0;
  for (int r = 0; r < kRanks; ++r) {
    const v1::PrepareTransferResponse& p = prepared[r];
    SCOPED_TRACE(p.ShortDebugString());
    EXPECT_EQ(p.members(), 4);
    EXPECT_EQ(p.shapes(), 3);  // a and b share a template.
    EXPECT_EQ(p.templates(), 3);
    EXPECT_EQ(p.exchange_ranks(), 4);
    EXPECT_EQ(p.target_bytes(), (2 * 8 * 6 + 3 * 8) * 4);  // a, b and c; d is lent.
    EXPECT_EQ(p.plan_digest(), 0u);
    EXPECT_NE(p.replica_key(), 0u);
    sent += p.bytes_sent();
    received += p.bytes_received();
    moved += p.total_bytes_moved();
    EXPECT_EQ(workers_[r]->transfers().resident(), 1);
  }
  EXPECT_GT(sent, 0);
  EXPECT_EQ(sent, received);
  EXPECT_EQ(moved, received);  // Each plan counted once, by its lowest participant.
  EXPECT_EQ(prepared[0].replica_key(), prepared[2].replica_key());
  EXPECT_EQ(prepared[1].replica_key(), prepared[3].replica_key());
  EXPECT_NE(prepared[0].replica_key(), prepared[1].replica_key());

  std::vector<uint64_t> first_digests;
  for (int round = 1; round <= 2; ++round) {
    const std::string run_id = absl::StrCat("sync@1/run", round);
    const int64_t version = 9 + round;
    if (round == 2) {
      for (int r = 0; r < kRanks; ++r) FillSources(r, round);
    }
    const std::vector<v1::RunTransferWorkerResponse> runs = RunAll("sync@1", run_id, version);
    for (int r = 0; r < kRanks; ++r) {
      SCOPED_TRACE(runs[r].ShortDebugString());
      EXPECT_EQ(runs[r].bytes_sent(), prepared[r].bytes_sent());
      EXPECT_EQ(runs[r].bytes_received(), prepared[r].bytes_received());
      EXPECT_NE(runs[r].digest(), 0u);
      EXPECT_EQ(runs[r].timing().rank(), r);
      EXPECT_EQ(runs[r].timing().worker(), absl::StrCat("w", r));
      EXPECT_LE(runs[r].timing().start_unix_us(), runs[r].timing().end_unix_us());
      EXPECT_GT(runs[r].timing().steps_size(), 0);
      EXPECT_EQ(runs[r].timing().error(), "");
      if (round == 1) {
        first_digests.push_back(runs[r].digest());
      } else {
        EXPECT_NE(runs[r].digest(), first_digests[r]);  // New values.
      }
    }
    // Replicas hold the same values: their digests agree.
    EXPECT_EQ(runs[0].digest(), runs[2].digest());
    EXPECT_EQ(runs[1].digest(), runs[3].digest());
    EXPECT_NE(runs[0].digest(), runs[1].digest());
    const int64_t previous = round == 1 ? kDstVersion : version - 1;
    for (int r = 0; r < kRanks; ++r) {
      // Until the commit both versions are held.
      EXPECT_NE(workers_[r]->buffers.Find("a.dst", previous), nullptr);
      EXPECT_NE(workers_[r]->buffers.Find("d.dst", previous), nullptr);
    }
    FinishAll(run_id, /*commit=*/true);
    ExpectDsts(version, round, /*gone=*/previous);
  }
  for (auto& w : workers_) {
    w->core.WaitIdle();
    EXPECT_EQ(w->core.running(), 0);
    EXPECT_EQ(w->transfers().resident(), 1);  // Still prepared for the next step.
  }
}

// The lent buffer is the one written, run after run; it follows the dst's versions: stored
// under each run's version, the previous key dropped on commit.
TEST_F(TransferRunnerTest, AttachedDstIsWrittenInPlaceAcrossRuns) {
  PrepareAll("sync@1");
  const Layout& dst = table_.layouts[1];
  for (int round = 1; round <= 2; ++round) {
    if (round == 2) {
      for (int r = 0; r < kRanks; ++r) FillSources(r, round);
    }
    const std::string run_id = absl::StrCat("run", round);
    RunAll("sync@1", run_id, 20 + round);
    FinishAll(run_id, /*commit=*/true);
    for (int r = 0; r < kRanks; ++r) {
      SCOPED_TRACE(absl::StrCat("rank ", r, " round ", round));
      std::shared_ptr<HostBuffer> kept = workers_[r]->buffers.Find("d.dst", 20 + round);
      ASSERT_NE(kept, nullptr);
      EXPECT_TRUE(kept->attached());
      EXPECT_EQ(kept->data(), reinterpret_cast<char*>(lent_[r].data()));
      EXPECT_EQ(workers_[r]->buffers.Find("d.dst", round == 1 ? kDstVersion : 21), nullptr);
      // The process's own memory holds the values.
      const RankChunks& rc = *dst.Find(r);
      ASSERT_EQ(rc.chunks.size(), 1u);
      std::vector<float> want(lent_[r].size());
      ASSERT_TRUE(FillBox(FillKind::kRandom, Seed(3, round), dst.global_shape(), rc.chunks[0].box,
                          DType::kF32, want.data())
                      .ok());
      EXPECT_EQ(lent_[r], want);
    }
  }
}

// An abort drops the run's new buffers and keeps each dst at its previous version (the lent
// buffer too); the next run reads and writes from there.
TEST_F(TransferRunnerTest, AbortKeepsThePreviousVersion) {
  PrepareAll("sync@1");
  RunAll("sync@1", "run1", 10);
  FinishAll("run1", /*commit=*/false);
  for (int r = 0; r < kRanks; ++r) {
    workers_[r]->core.WaitIdle();
    for (const TransferMemberSpec& m : table_.members) {
      EXPECT_EQ(workers_[r]->buffers.Find(m.dst, 10), nullptr) << m.dst << " rank " << r;
      EXPECT_NE(workers_[r]->buffers.Find(m.dst, kDstVersion), nullptr) << m.dst << " rank " << r;
    }
    EXPECT_TRUE(workers_[r]->buffers.Find("d.dst", kDstVersion)->attached());
  }
  RunAll("sync@1", "run2", 11);
  FinishAll("run2", /*commit=*/true);
  ExpectDsts(11, /*round=*/1, /*gone=*/kDstVersion);
}

TEST_F(TransferRunnerTest, PagesOutOfOrderAreRefused) {
  TransferRunner& t = workers_[0]->transfers();
  std::vector<v1::PrepareTransferRequest> pages = Pages(table_, "sync@1");
  auto refused = [&](const v1::PrepareTransferRequest& page) {
    absl::StatusOr<v1::PrepareTransferResponse> r = t.Prepare(page);
    EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument) << r.status();
    EXPECT_THAT(r.status().message(), HasSubstr("page")) << r.status();
  };
  refused(pages[1]);  // No page 0 before it.
  ASSERT_TRUE(t.Prepare(pages[0]).ok());
  v1::PrepareTransferRequest skipped = pages[1];
  skipped.set_page(2);
  refused(skipped);
  refused(pages[1]);  // The refusal forgot the table: page 0 again.
  EXPECT_EQ(t.resident(), 0);

  // Tables of two ids page in side by side; page 0 starts one again.
  std::vector<v1::PrepareTransferRequest> other = Pages(table_, "other@1");
  ASSERT_TRUE(t.Prepare(pages[0]).ok());
  ASSERT_TRUE(t.Prepare(other[0]).ok());
  ASSERT_TRUE(t.Prepare(pages[0]).ok());
  absl::StatusOr<v1::PrepareTransferResponse> last = t.Prepare(pages[1]);
  ASSERT_TRUE(last.ok()) << last.status();
  EXPECT_EQ(last->members(), 4);
  ASSERT_TRUE(t.Prepare(other[1]).ok());
  EXPECT_EQ(t.resident(), 2);
  // Prepared again under the same id: replaced.
  ASSERT_TRUE(PrepareOn(*workers_[0], pages).ok());
  EXPECT_EQ(t.resident(), 2);

  v1::PrepareTransferRequest nameless = pages[0];
  nameless.clear_transfer_id();
  EXPECT_EQ(t.Prepare(nameless).status().code(), absl::StatusCode::kInvalidArgument);
  // A malformed page names the table-wide field.
  std::vector<v1::PrepareTransferRequest> bad = Pages(table_, "bad@1");
  bad[1].mutable_members(0)->set_dtype(v1::DTYPE_UNSPECIFIED);
  absl::StatusOr<v1::PrepareTransferResponse> r = PrepareOn(*workers_[0], bad);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument) << r.status();
  EXPECT_THAT(r.status().message(), HasSubstr("members[2].dtype"));
  bad = Pages(table_, "bad@2");
  bad[1].mutable_members(0)->set_src_layout(9);
  r = PrepareOn(*workers_[0], bad);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument) << r.status();
  EXPECT_THAT(r.status().message(), HasSubstr("members[2].src_layout"));
  bad = Pages(table_, "bad@3");
  *bad[1].add_layouts() = TransferLayoutToProto(table_.layouts[0], false);
  r = PrepareOn(*workers_[0], bad);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument) << r.status();
  EXPECT_THAT(r.status().message(), HasSubstr("layouts[5]: no member"));
  EXPECT_EQ(t.resident(), 2);
}

TEST_F(TransferRunnerTest, AnotherIncarnationOrRankIsRefused) {
  // Rank 1 registered again since the coordinator built the table.
  std::vector<v1::PrepareTransferRequest> pages =
      Pages(table_, "sync@1", {0, 1, 2, 3}, {kIncarnation, kIncarnation + 1, kIncarnation, 0});
  absl::StatusOr<v1::PrepareTransferResponse> r = PrepareOn(*workers_[1], pages);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kFailedPrecondition) << r.status();
  EXPECT_THAT(r.status().message(), HasSubstr("incarnation 8 of rank 1"));
  EXPECT_TRUE(PrepareOn(*workers_[0], pages).ok());
  EXPECT_EQ(PrepareOn(*workers_[3], pages).status().code(), absl::StatusCode::kFailedPrecondition);
  // Rank 2 is not listed.
  pages = Pages(table_, "sync@2", {0, 1, 3}, {kIncarnation, kIncarnation, kIncarnation});
  r = PrepareOn(*workers_[2], pages);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kFailedPrecondition) << r.status();
  EXPECT_THAT(r.status().message(), HasSubstr("not among the participants"));
  // Ranks and incarnations pair up.
  pages[0].add_incarnations(1);
  EXPECT_EQ(PrepareOn(*workers_[0], pages).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(workers_[1]->transfers().resident(), 0);
  EXPECT_EQ(workers_[2]->transfers().resident(), 0);
}

TEST_F(TransferRunnerTest, MissingOrOtherSourceBufferIsRefused) {
  ASSERT_TRUE(workers_[1]->buffers.Drop("a.src", kSrcVersion));
  absl::StatusOr<v1::PrepareTransferResponse> r = PrepareOn(*workers_[1], Pages(table_, "sync@1"));
  EXPECT_EQ(r.status().code(), absl::StatusCode::kFailedPrecondition) << r.status();
  EXPECT_THAT(r.status().message(), HasSubstr("tensor 'a.src' version 3"));
  EXPECT_EQ(workers_[1]->transfers().resident(), 0);

  // b.src v3 held as i32.
  v1::FillRequest other =
      FillRequest("b.src", kSrcVersion, *table_.layouts[0].Find(2), 0, v1::ZEROS, 0);
  other.set_dtype(v1::I32);
  ASSERT_TRUE(workers_[2]->core.Fill(other).ok());
  r = PrepareOn(*workers_[2], Pages(table_, "sync@1"));
  EXPECT_EQ(r.status().code(), absl::StatusCode::kFailedPrecondition) << r.status();
  EXPECT_THAT(r.status().message(), HasSubstr("tensor 'b.src' version 3"));

  // Gone after the preparation: the run fails before it communicates, naming the member.
  ASSERT_TRUE(PrepareOn(*workers_[0], Pages(table_, "sync@1")).ok());
  ASSERT_TRUE(workers_[0]->buffers.Drop("c.src", kSrcVersion));
  StartRun("sync@1", "run1", 0, 10);
  Answers::Answer a = answers_.Wait("run1", 0);
  EXPECT_EQ(a.status().code(), absl::StatusCode::kFailedPrecondition) << a.status();
  EXPECT_THAT(a.status().message(), HasSubstr("member 2"));
  v1::FinishPlanRequest abort;
  abort.set_plan_id("run1");
  ASSERT_TRUE(workers_[0]->core.FinishPlan(abort).ok());
  workers_[0]->core.WaitIdle();
  EXPECT_EQ(workers_[0]->buffers.Find("a.dst", 10), nullptr);
}

// One run at a time: while a run holds the transfer (running, or ended and awaiting its
// FinishPlan) another is ABORTED.
TEST_F(TransferRunnerTest, ASecondRunWhileOneHoldsTheTransferIsAborted) {
  PrepareAll("sync@1");
  // Rank 0's run waits for the others (it receives from them), which have not started.
  StartRun("sync@1", "run1", 0, 10);
  StartRun("sync@1", "run2", 0, 11);
  Answers::Answer second = answers_.Wait("run2", 0);
  EXPECT_EQ(second.status().code(), absl::StatusCode::kAborted) << second.status();
  EXPECT_THAT(second.status().message(), HasSubstr("still runs"));
  EXPECT_FALSE(answers_.Has("run1", 0));
  for (int r = 1; r < kRanks; ++r) StartRun("sync@1", "run1", r, 10);
  for (int r = 0; r < kRanks; ++r) {
    Answers::Answer a = answers_.Wait("run1", r);
    EXPECT_TRUE(a.ok()) << r << ": " << a.status();
  }
  // Ended, but its FinishPlan has not come: the next run cannot know which version to read.
  StartRun("sync@1", "run3", 0, 12);
  Answers::Answer third = answers_.Wait("run3", 0);
  EXPECT_EQ(third.status().code(), absl::StatusCode::kAborted) << third.status();
  EXPECT_THAT(third.status().message(), HasSubstr("awaits its FinishPlan"));
  FinishAll("run1", /*commit=*/true);
  // A finished run id is not run again (refused at once).
  absl::Status again;
  workers_[0]->transfers().Run(RunRequest("sync@1", "run1", 0, 13),
                               [&](Answers::Answer a) { again = a.status(); });
  EXPECT_EQ(again.code(), absl::StatusCode::kAborted) << again;
  RunAll("sync@1", "run4", 14);
  FinishAll("run4", /*commit=*/true);
  ExpectDsts(14, /*round=*/1, /*gone=*/10);
}

TEST_F(TransferRunnerTest, RunRefusals) {
  TransferRunner& t = workers_[0]->transfers();
  auto code = [&](const v1::RunTransferWorkerRequest& req, const std::string& run_id) {
    t.Run(req, answers_.For(run_id, 0));
    EXPECT_TRUE(answers_.Has(run_id, 0)) << "refusals answer at once";
    return answers_.Wait(run_id, 0).status();
  };
  absl::Status s = code(RunRequest("sync@1", "r0", 0, 10), "r0");
  EXPECT_EQ(s.code(), absl::StatusCode::kNotFound) << s;
  EXPECT_THAT(s.message(), HasSubstr("prepare it again"));
  ASSERT_TRUE(PrepareOn(*workers_[0], Pages(table_, "sync@1")).ok());
  EXPECT_EQ(code(RunRequest("sync@1", "r1", 1, 10), "r1").code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(code(RunRequest("sync@1", "r2", 0, 0), "r2").code(),
            absl::StatusCode::kInvalidArgument);
  s = code(RunRequest("sync@1", "r3", 0, kDstVersion), "r3");
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_THAT(s.message(), HasSubstr("version"));
  v1::RunTransferWorkerRequest nameless = RunRequest("sync@1", "", 0, 10);
  EXPECT_EQ(code(nameless, "").code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(workers_[0]->core.running(), 0);
}

TEST_F(TransferRunnerTest, DropTransferForgetsByIdAndPrefix) {
  TestWorker& w = *workers_[0];
  for (const char* id : {"x@1", "x@2", "y@1"}) {
    ASSERT_TRUE(PrepareOn(w, Pages(table_, id)).ok()) << id;
  }
  ASSERT_TRUE(w.transfers().Prepare(Pages(table_, "x@3")[0]).ok());  // Half paged.
  v1::DropTransferRequest drop;
  drop.set_prefix("x@");
  EXPECT_EQ(w.transfers().Drop(drop), 2);
  EXPECT_EQ(w.transfers().resident(), 1);
  EXPECT_EQ(w.transfers().Prepare(Pages(table_, "x@3")[1]).status().code(),
            absl::StatusCode::kInvalidArgument);
  w.transfers().Run(RunRequest("x@1", "run1", 0, 10), answers_.For("run1", 0));
  absl::Status s = answers_.Wait("run1", 0).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kNotFound) << s;
  EXPECT_THAT(s.message(), HasSubstr("prepare it again"));
  drop.clear_prefix();
  drop.add_transfer_ids("y@1");
  drop.add_transfer_ids("never@1");
  EXPECT_EQ(w.transfers().Drop(drop), 1);
  EXPECT_EQ(w.transfers().Drop(drop), 0);  // Idempotent.
  EXPECT_EQ(w.transfers().Drop(v1::DropTransferRequest()), 0);
  EXPECT_EQ(w.transfers().resident(), 0);
}

// Before registering again a worker forgets its plans and its resident transfers: running
// parts end ABORTED, and the next run asks for a preparation.
TEST_F(TransferRunnerTest, AbortAllForgetsResidentTransfers) {
  PrepareAll("sync@1");
  for (int r = 0; r < 3; ++r) StartRun("sync@1", "run1", r, 10);
  // Rank 3 joins the exchange's communicator but runs nothing: the others wait on it.
  CommunicatorSpec spec;
  spec.ranks = {0, 1, 2, 3};
  spec.incarnations = {kIncarnation, kIncarnation, kIncarnation, kIncarnation};
  spec.my_rank = 3;
  spec.key_prefix = "xfer/run1/";
  ASSERT_TRUE(workers_[3]->cache.Get(spec).ok());
  for (int r = 0; r < 3; ++r) {
    EXPECT_EQ(workers_[r]->core.AbortAll(), 1);
    Answers::Answer a = answers_.Wait("run1", r);
    EXPECT_EQ(a.status().code(), absl::StatusCode::kAborted) << a.status();
    workers_[r]->core.WaitIdle();
    EXPECT_EQ(workers_[r]->transfers().resident(), 0);
    EXPECT_EQ(workers_[r]->buffers.Find("a.dst", 10), nullptr);
    EXPECT_NE(workers_[r]->buffers.Find("a.dst", kDstVersion), nullptr);
  }
  workers_[3]->cache.ReleasePrefix("xfer/run1/");
  EXPECT_EQ(workers_[3]->core.AbortAll(), 0);
  EXPECT_EQ(workers_[3]->transfers().resident(), 0);
  StartRun("sync@1", "run2", 3, 11);
  EXPECT_EQ(answers_.Wait("run2", 3).status().code(), absl::StatusCode::kNotFound);
}

TEST_F(TransferRunnerTest, DrainingRefusesPrepareAndRun) {
  TestWorker& w = *workers_[0];
  ASSERT_TRUE(PrepareOn(w, Pages(table_, "sync@1")).ok());
  EXPECT_TRUE(w.core.StopAcceptingAndAwaitIdle("worker is draining", absl::ZeroDuration()));
  absl::StatusOr<v1::PrepareTransferResponse> p = PrepareOn(w, Pages(table_, "sync@2"));
  EXPECT_EQ(p.status().code(), absl::StatusCode::kUnavailable) << p.status();
  StartRun("sync@1", "run1", 0, 10);
  absl::Status s = answers_.Wait("run1", 0).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable) << s;
  EXPECT_THAT(s.message(), HasSubstr("draining"));
}

// The digest covers the members that hold targets here, by table index, in member order.
TEST(TransferDigestTest, CoversTargetChunksByMemberIndex) {
  Fragment f;
  f.fused = true;
  f.shapes.resize(2);
  f.shapes[0].target.chunks.push_back(Chunk{Box({0}, {4}), 0, 0});
  // shapes[1] holds no target here.
  for (int32_t index : {3, 5, 8}) {
    FragmentMember& m = f.members.emplace_back();
    m.index = index;
    m.shape = index == 5 ? 1 : 0;
  }
  const std::vector<std::vector<uint64_t>> sums = {{11}, {}, {12}};
  const uint64_t digest = TransferDigest(f, sums);
  EXPECT_NE(digest, 0u);
  EXPECT_EQ(TransferDigest(f, sums), digest);
  EXPECT_NE(TransferDigest(f, {{12}, {}, {11}}), digest);  // Values swapped between members.
  f.members[2].index = 9;
  EXPECT_NE(TransferDigest(f, sums), digest);  // Another member of the table.
  f.members.clear();
  EXPECT_EQ(TransferDigest(f, {}), 0u);  // No target here.
  StableHash h;                          // The definition the coordinator's docs state.
  h.Add(3);
  h.Add(11);
  h.Add(8);
  h.Add(12);
  EXPECT_EQ(h.value(), digest);
}

}  // namespace
}  // namespace shardcoord
