#include "coordinator/transfers/transfer_manager.h"

#include <optional>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/metrics.h"
#include "coordinator/transfers/transfer_test_util.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace shardcoord {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;
using ::testing::SizeIs;

class TransferManagerTest : public TransferTest {};

TEST_F(TransferManagerTest, CreateRunsNothingAndRunCommitsEveryDstAtTheRunsVersion) {
  CreateMembers(3);
  absl::StatusOr<v1::TransferInfo> info = Create("sync", Copies(3));
  ASSERT_TRUE(info.ok()) << info.status();
  EXPECT_TRUE(info->prepared()) << info->invalid_reason();
  EXPECT_EQ(info->members(), 3);
  EXPECT_EQ(info->participants(), 6);  // Source ranks 0-3, dst ranks 4, 5.
  EXPECT_EQ(info->templates(), 1);     // Three members of one shape and layouts.
  EXPECT_EQ(info->layouts(), 2);
  EXPECT_EQ(info->bytes(), 3 * 8 * 4 * 4);
  EXPECT_GT(info->bytes_moved(), 0);
  EXPECT_EQ(info->runs(), 0);
  EXPECT_EQ(client_.calls("RunTransfer"), 0);
  const int64_t before = tensors_.Get("b.0")->version;

  RunResult& run = RunNow("sync");
  ASSERT_TRUE(run.started.ok()) << run.started;
  ASSERT_TRUE(run.ended.has_value());
  ASSERT_TRUE(run.ended->ok()) << *run.ended;
  EXPECT_EQ(run.response.state(), v1::COMMITTED);
  EXPECT_FALSE(run.response.replanned());
  EXPECT_EQ(run.response.members(), 3);
  EXPECT_EQ(run.response.bytes_moved(), info->bytes_moved());
  const int64_t v = run.response.version();
  EXPECT_GT(v, before);
  for (int i = 0; i < 3; ++i) {
    absl::StatusOr<TensorRecord> dst = tensors_.Get(absl::StrCat("b.", i));
    ASSERT_TRUE(dst.ok());
    EXPECT_EQ(dst->version, v);
    // The run's checksums stay with the workers: unknown here.
    for (const ChunkChecksums& c : dst->checksums) {
      for (uint64_t sum : c) EXPECT_EQ(sum, 0u);
    }
    EXPECT_LT(tensors_.Get(absl::StrCat("a.", i))->version, v);  // Sources only read.
  }
  absl::StatusOr<v1::TransferInfo> after = transfers_->Get("sync", false);
  ASSERT_TRUE(after.ok());
  EXPECT_EQ(after->runs(), 1);
  EXPECT_EQ(after->version(), v);
  EXPECT_EQ(after->last_run_id(), run.response.run_id());
  EXPECT_EQ(after->last_run_state(), v1::COMMITTED);
  EXPECT_FALSE(after->running());
  EXPECT_EQ(metrics_.transfer_runs->WithLabels({"committed"})->Value(), 1);
}

// Fake workers that summarize instead of expanding (scale_bench at 10^3 ranks) answer the
// preparation as expanding ones do, and their runs commit (their replicas agree).
TEST_F(TransferManagerTest, SummarizingWorkersPrepareAsExpandingOnes) {
  CreateMembers(4);
  absl::StatusOr<v1::TransferInfo> expanded = Create("expanded", {{"a.0", "b.0"}, {"a.1", "b.1"}});
  ASSERT_TRUE(expanded.ok()) << expanded.status();
  client_.SetSummarizePrepares(true);
  absl::StatusOr<v1::TransferInfo> summarized =
      Create("summarized", {{"a.2", "b.2"}, {"a.3", "b.3"}});
  ASSERT_TRUE(summarized.ok()) << summarized.status();
  EXPECT_TRUE(summarized->prepared()) << summarized->invalid_reason();
  EXPECT_EQ(summarized->participants(), expanded->participants());
  EXPECT_EQ(summarized->bytes_moved(), expanded->bytes_moved());
  EXPECT_EQ(summarized->lower_bound_bytes(), expanded->lower_bound_bytes());
  EXPECT_EQ(summarized->max_rank_send_bytes(), expanded->max_rank_send_bytes());
  EXPECT_EQ(summarized->max_rank_recv_bytes(), expanded->max_rank_recv_bytes());
  for (int round = 0; round < 2; ++round) {
    RunResult& run = RunNow("summarized");
    ASSERT_TRUE(run.Committed()) << run.Error();
    EXPECT_FALSE(run.response.replanned());
  }
  EXPECT_THAT(client_.ResidentTransfers(4), SizeIs(2));
}

// What a run costs: one RunTransfer and one FinishPlan per participant, one store write, no
// preparation.
TEST_F(TransferManagerTest, ARunIsOneMessageEachWayPerParticipantAndOneStoreWrite) {
  CreateMembers(4);
  ASSERT_TRUE(Create("sync", Copies(4)).ok());
  ASSERT_TRUE(RunNow("sync").Committed());  // Also stores the version counter's first block.
  const int prepares = client_.calls("PrepareTransfer");
  const int runs = client_.calls("RunTransfer");
  const int finishes = client_.calls("FinishPlan");
  const int64_t applies = store_.applies();

  RunResult& second = RunNow("sync");
  ASSERT_TRUE(second.Committed()) << second.Error();
  EXPECT_FALSE(second.response.replanned());
  EXPECT_EQ(client_.calls("PrepareTransfer"), prepares);
  EXPECT_EQ(client_.calls("RunTransfer") - runs, 6);
  EXPECT_EQ(client_.calls("FinishPlan") - finishes, 6);
  EXPECT_EQ(store_.applies() - applies, 1);
  std::set<int64_t> ranks;
  for (const auto& [rank, req] : client_.finishes()) {
    if (req.plan_id() != second.response.run_id()) continue;
    EXPECT_TRUE(req.commit());
    ranks.insert(rank);
  }
  EXPECT_THAT(ranks, ElementsAre(0, 1, 2, 3, 4, 5));
  for (const auto& [rank, req] : client_.transfer_runs()) {
    if (req.run_id() != second.response.run_id()) continue;
    EXPECT_EQ(req.version(), second.response.version());
    EXPECT_GT(req.bucket_bytes(), 0);  // One bucket for all: both ends cut streams alike.
  }
  EXPECT_GT(second.response.version(), tensors_.Get("b.0")->version - 1);
  EXPECT_EQ(tensors_.Get("b.3")->version, second.response.version());
}

// Every participant gets the same page objects, in order; pages are cut by size.
TEST_F(TransferManagerTest, EveryParticipantGetsTheSamePagesInOrder) {
  options_.page_bytes = 60;
  Rebuild();
  CreateMembers(6);
  ASSERT_TRUE(Create("sync", Copies(6)).ok());
  std::map<int64_t, std::vector<const v1::PrepareTransferRequest*>> by_rank;
  for (const auto& [rank, page] : client_.pages()) by_rank[rank].push_back(page.get());
  ASSERT_THAT(by_rank, SizeIs(6));
  const std::vector<const v1::PrepareTransferRequest*>& first = by_rank.begin()->second;
  EXPECT_GT(first.size(), 3u);
  for (const auto& [rank, pages] : by_rank) {
    EXPECT_EQ(pages, first) << "rank " << rank;
    for (size_t i = 0; i < pages.size(); ++i) {
      EXPECT_EQ(pages[i]->page(), static_cast<int>(i));
      EXPECT_EQ(pages[i]->last(), i + 1 == pages.size());
    }
  }
  EXPECT_THAT(first.front()->ranks(), ElementsAre(0, 1, 2, 3, 4, 5));
  int members = 0;
  for (const v1::PrepareTransferRequest* page : first) members += page->members_size();
  EXPECT_EQ(members, 6);
  ASSERT_TRUE(RunNow("sync").Committed());
}

TEST_F(TransferManagerTest, AMembersRedistributeInvalidatesAndTheNextRunReplans) {
  CreateMembers(2);
  ASSERT_TRUE(Create("sync", Copies(2)).ok());
  ASSERT_TRUE(RunNow("sync").Committed());
  const std::string first_id = client_.transfer_runs().back().second.transfer_id();
  // Another plan commits a new version of a source.
  ASSERT_TRUE(tensors_.Acquire("a.1", "p-9").ok());
  absl::StatusOr<TensorRecord> a1 = tensors_.Get("a.1");
  TensorManager::NewState state{
      a1->mesh, a1->spec, a1->layout, a1->checksums, tensors_.NewVersion(), a1->incarnations};
  ASSERT_TRUE(tensors_.Commit("a.1", "p-9", state).ok());
  absl::StatusOr<v1::TransferInfo> info = transfers_->Get("sync", false);
  EXPECT_FALSE(info->prepared());
  EXPECT_THAT(info->invalid_reason(), HasSubstr("tensor 'a.1' was committed by p-9"));

  RunResult& run = RunNow("sync");
  ASSERT_TRUE(run.Committed()) << run.Error();
  EXPECT_TRUE(run.response.replanned());
  const std::string second_id = client_.transfer_runs().back().second.transfer_id();
  EXPECT_NE(second_id, first_id);
  EXPECT_EQ(transfers_->Get("sync", false)->replans(), 1);
  EXPECT_EQ(metrics_.transfer_replans->Value(), 1);
  // Earlier preparations were dropped before the new pages went out.
  bool dropped = false;
  for (const auto& [rank, req] : client_.transfer_drops()) dropped |= req.prefix() == "sync@";
  EXPECT_TRUE(dropped);
  for (int64_t rank = 0; rank < 6; ++rank) {
    EXPECT_THAT(client_.ResidentTransfers(rank), ElementsAre(second_id)) << rank;
  }
  // The new table read a.1 at its new version.
  EXPECT_TRUE(transfers_->Get("sync", false)->prepared());
}

TEST_F(TransferManagerTest, AParticipantsDeathInvalidatesAndTheNextRunPlansWithoutIt) {
  CreateMembers(2);
  ASSERT_TRUE(Create("sync", Copies(2)).ok());
  ASSERT_TRUE(RunNow("sync").Committed());
  Kill(1);  // Holds a replica of the sources' first rows (rank 0 has them too).
  absl::StatusOr<v1::TransferInfo> info = transfers_->Get("sync", false);
  EXPECT_FALSE(info->prepared());
  EXPECT_THAT(info->invalid_reason(), HasSubstr("worker w1 (rank 1)"));

  RunResult& run = RunNow("sync");
  ASSERT_TRUE(run.Committed()) << run.Error();
  EXPECT_TRUE(run.response.replanned());
  EXPECT_EQ(transfers_->Get("sync", false)->participants(), 5);
  for (const auto& [rank, req] : client_.transfer_runs()) {
    if (req.run_id() == run.response.run_id()) {
      EXPECT_NE(rank, 1);
    }
  }
}

TEST_F(TransferManagerTest, ADeletedMemberFailsThePreconditionNamingIt) {
  CreateMembers(3);
  ASSERT_TRUE(Create("sync", Copies(3)).ok());
  ASSERT_TRUE(tensors_.Remove("b.1").ok());
  EXPECT_THAT(transfers_->Get("sync", false)->invalid_reason(), HasSubstr("'b.1' was deleted"));
  RunResult& run = RunNow("sync");
  EXPECT_EQ(run.started.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(run.started.message(), HasSubstr("copies[1].dst: unknown tensor 'b.1'"));
  EXPECT_FALSE(run.ended.has_value());
  EXPECT_FALSE(transfers_->Get("sync", false)->running());
}

TEST_F(TransferManagerTest, ABusyMemberAbortsTheRunNamingIt) {
  CreateMembers(2);
  ASSERT_TRUE(Create("sync", Copies(2)).ok());
  ASSERT_TRUE(tensors_.Acquire("a.0", "p-7").ok());
  RunResult& run = RunNow("sync");
  EXPECT_EQ(run.started.code(), absl::StatusCode::kAborted);
  EXPECT_THAT(run.started.message(), HasSubstr("tensor 'a.0'"));
  EXPECT_THAT(run.started.message(), HasSubstr("busy with p-7"));
  tensors_.Release("a.0", "p-7");
  ASSERT_TRUE(RunNow("sync").Committed());
}

// While a run holds them, its members are busy for everything else: one flag, not a lease
// per tensor.
TEST_F(TransferManagerTest, MembersAreBusyWithTheRunningTransfer) {
  CreateMembers(2);
  ASSERT_TRUE(Create("sync", Copies(2)).ok());
  client_.HoldRuns(true);
  RunResult& run = RunNow("sync");
  ASSERT_TRUE(run.started.ok()) << run.started;
  EXPECT_FALSE(run.ended.has_value());
  EXPECT_TRUE(transfers_->Get("sync", false)->running());
  absl::StatusOr<TensorRecord> busy = tensors_.Acquire("b.1", "p-3");
  EXPECT_EQ(busy.status().code(), absl::StatusCode::kAborted);
  EXPECT_THAT(busy.status().message(), HasSubstr("transfer 'sync' (run "));
  EXPECT_EQ(tensors_.Remove("a.0").status().code(), absl::StatusCode::kAborted);
  // A second run of the same transfer, and its delete, are refused too.
  RunResult& again = RunNow("sync");
  EXPECT_EQ(again.started.code(), absl::StatusCode::kAborted);
  EXPECT_THAT(again.started.message(), HasSubstr("already running"));
  EXPECT_EQ(transfers_->Delete("sync").code(), absl::StatusCode::kAborted);
  client_.HoldRuns(false);
  client_.ReleaseRuns();
  ASSERT_TRUE(run.ended.has_value());
  EXPECT_TRUE(run.ended->ok()) << *run.ended;
  EXPECT_TRUE(tensors_.Acquire("b.1", "p-3").ok());
}

// A worker holds its part of a run until the run's FinishPlan: the caller hears of the commit,
// and a next run may start, only once every participant has it (a worker would refuse a run
// that finds the previous one still held).
TEST_F(TransferManagerTest, ACommitIsAnsweredOnceEveryWorkerHasItsFinishPlan) {
  CreateMembers(2);
  ASSERT_TRUE(Create("sync", Copies(2)).ok());
  client_.HoldFinishes(true);
  RunResult& run = RunNow("sync");
  ASSERT_TRUE(run.started.ok()) << run.started;
  EXPECT_FALSE(run.ended.has_value());
  EXPECT_EQ(client_.finishes().size(), 6u);
  // Committed (every dst reads the run's version) but not yet free for the next run.
  EXPECT_EQ(tensors_.Get("b.0")->version, transfers_->Get("sync", false)->version());
  RunResult& again = RunNow("sync");
  EXPECT_EQ(again.started.code(), absl::StatusCode::kAborted);
  EXPECT_THAT(again.started.message(), HasSubstr("already running"));
  client_.HoldFinishes(false);
  client_.ReleaseFinishes();
  ASSERT_TRUE(run.Committed()) << run.Error();
  EXPECT_FALSE(transfers_->Get("sync", false)->running());
  EXPECT_TRUE(RunNow("sync").Committed());
}

TEST_F(TransferManagerTest, AWorkersErrorAbortsAndEveryDstKeepsItsVersion) {
  CreateMembers(2);
  ASSERT_TRUE(Create("sync", Copies(2)).ok());
  const int64_t b0 = tensors_.Get("b.0")->version, b1 = tensors_.Get("b.1")->version;
  client_.Fail("RunTransfer", 3, absl::InternalError("gloo: connection reset"));
  RunResult& run = RunNow("sync");
  ASSERT_TRUE(run.started.ok()) << run.started;
  ASSERT_TRUE(run.ended.has_value());
  EXPECT_EQ(run.ended->code(), absl::StatusCode::kAborted);
  EXPECT_THAT(run.ended->message(), HasSubstr("worker w3 (rank 3): gloo: connection reset"));
  EXPECT_THAT(run.ended->message(), HasSubstr("every dst keeps its version"));
  EXPECT_EQ(tensors_.Get("b.0")->version, b0);
  EXPECT_EQ(tensors_.Get("b.1")->version, b1);
  int aborts = 0;
  for (const auto& [rank, req] : client_.finishes()) {
    if (req.plan_id() != run.response.run_id()) continue;
    EXPECT_FALSE(req.commit());
    ++aborts;
  }
  EXPECT_EQ(aborts, 6);
  absl::StatusOr<v1::TransferInfo> info = transfers_->Get("sync", false);
  EXPECT_EQ(info->last_run_state(), v1::ABORTED);
  EXPECT_THAT(info->last_error(), HasSubstr("connection reset"));
  EXPECT_EQ(info->runs(), 0);
  EXPECT_EQ(metrics_.transfer_runs->WithLabels({"aborted"})->Value(), 1);
  // The members are free again; the next run prepares again and commits.
  client_.Fail("RunTransfer", 3, absl::OkStatus());
  RunResult& next = RunNow("sync");
  ASSERT_TRUE(next.Committed()) << next.Error();
  EXPECT_TRUE(next.response.replanned());
}

TEST_F(TransferManagerTest, ReplicasWithDifferentDigestsAbortTheRun) {
  CreateMembers(2);
  ASSERT_TRUE(Create("sync", Copies(2)).ok());
  const int64_t b0 = tensors_.Get("b.0")->version;
  client_.SetRunDigest(5, 0x1234);  // Ranks 4 and 5 both hold every dst (R).
  RunResult& run = RunNow("sync");
  ASSERT_TRUE(run.ended.has_value());
  EXPECT_EQ(run.ended->code(), absl::StatusCode::kAborted);
  EXPECT_THAT(run.ended->message(), HasSubstr("replicas disagree"));
  EXPECT_THAT(run.ended->message(), HasSubstr("worker w4 (rank 4)"));
  EXPECT_THAT(run.ended->message(), HasSubstr("worker w5 (rank 5) 0000000000001234"));
  EXPECT_EQ(tensors_.Get("b.0")->version, b0);
}

TEST_F(TransferManagerTest, AParticipantsDeathDuringARunAbortsIt) {
  CreateMembers(2);
  ASSERT_TRUE(Create("sync", Copies(2)).ok());
  const int64_t b0 = tensors_.Get("b.0")->version;
  client_.HoldRuns(true);
  RunResult& run = RunNow("sync");
  ASSERT_TRUE(run.started.ok());
  Kill(4);
  ASSERT_TRUE(run.ended.has_value());
  EXPECT_EQ(run.ended->code(), absl::StatusCode::kAborted);
  EXPECT_THAT(run.ended->message(), HasSubstr("worker w4 (rank 4)"));
  EXPECT_EQ(tensors_.Get("b.0")->version, b0);
  client_.ReleaseRuns();  // Late answers of the aborted run change nothing.
  EXPECT_EQ(tensors_.Get("b.0")->version, b0);
  // Rank 4 holds dst chunks: no run until it is back.
  client_.HoldRuns(false);
  RunResult& next = RunNow("sync");
  EXPECT_EQ(next.started.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(next.started.message(), HasSubstr("copies[0].dst"));
}

TEST_F(TransferManagerTest, ARunThatNeverEndsTimesOut) {
  CreateMembers(1);
  ASSERT_TRUE(Create("sync", Copies(1)).ok());
  client_.HoldRuns(true);
  RunResult& run = RunNow("sync");
  ASSERT_TRUE(run.started.ok());
  timer_.Advance(options_.run_timeout);
  ASSERT_TRUE(run.ended.has_value());
  EXPECT_THAT(run.ended->message(), HasSubstr("timed out after"));
  EXPECT_THAT(run.ended->message(), HasSubstr("waiting for worker w0 (rank 0)"));
}

TEST_F(TransferManagerTest, CreateChecksTheCopiesAsCopyGroupDoes) {
  CreateMembers(2);
  CreateTensorOn("odd", "D", "R", {4, 4});
  EXPECT_EQ(Create("bad name!", Copies(1)).status().code(), absl::StatusCode::kInvalidArgument);
  absl::StatusOr<v1::TransferInfo> twice = Create("t", {{"a.0", "b.0"}, {"a.0", "b.1"}});
  EXPECT_EQ(twice.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(twice.status().message(),
              HasSubstr("copies[1].src: tensor 'a.0' is also copies[0].src"));
  absl::StatusOr<v1::TransferInfo> missing = Create("t", {{"a.0", "b.0"}, {"a.1", "nope"}});
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(missing.status().message(), HasSubstr("copies[1].dst: unknown tensor 'nope'"));
  absl::StatusOr<v1::TransferInfo> shape = Create("t", {{"a.0", "b.0"}, {"a.1", "odd"}});
  EXPECT_EQ(shape.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(shape.status().message(), HasSubstr("copies[1].dst: tensor 'odd' has shape [4, 4]"));
  ASSERT_TRUE(tensors_.Acquire("b.1", "p-1").ok());
  absl::StatusOr<v1::TransferInfo> busy = Create("t", Copies(2));
  EXPECT_EQ(busy.status().code(), absl::StatusCode::kAborted);
  EXPECT_THAT(busy.status().message(), HasSubstr("copies[1].dst: tensor 'b.1' is busy with p-1"));
  tensors_.Release("b.1", "p-1");
  // A refused create left nothing: the name is free, and no tensor is bound.
  EXPECT_EQ(transfers_->Get("t", false).status().code(), absl::StatusCode::kNotFound);
  ASSERT_TRUE(Create("t", Copies(2)).ok());
  EXPECT_EQ(Create("t", Copies(2)).status().code(), absl::StatusCode::kAlreadyExists);
}

TEST_F(TransferManagerTest, CreateRefusesMoreThanTheMemberLimit) {
  options_.max_members = 2;
  Rebuild();
  CreateMembers(3);
  absl::StatusOr<v1::TransferInfo> big = Create("t", Copies(3));
  EXPECT_EQ(big.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(big.status().message(), HasSubstr("copies: 3 members, more than the limit of 2"));
}

TEST_F(TransferManagerTest, AWorkerThatRefusesItsPartFailsTheCreateAndNoneKeepsOne) {
  CreateMembers(2);
  client_.Fail("PrepareTransfer", 4, absl::InternalError("out of sockets"));
  absl::StatusOr<v1::TransferInfo> info = Create("sync", Copies(2));
  EXPECT_EQ(info.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(info.status().message(), HasSubstr("worker w4 (rank 4) did not take its part"));
  for (int64_t rank = 0; rank < 6; ++rank) {
    EXPECT_THAT(client_.ResidentTransfers(rank), IsEmpty()) << rank;
  }
  EXPECT_EQ(transfers_->Get("sync", false).status().code(), absl::StatusCode::kNotFound);
  // Nothing stored, nothing bound: the members are plain tensors.
  EXPECT_TRUE(tensors_.Acquire("b.0", "p-1").ok());
  tensors_.Release("b.0", "p-1");
  client_.Fail("PrepareTransfer", 4, absl::OkStatus());
  EXPECT_TRUE(Create("sync", Copies(2)).ok());
}

TEST_F(TransferManagerTest, ARunIsWatchedListedAndTracedAsAPlan) {
  CreateMembers(2);
  ASSERT_TRUE(Create("sync", Copies(2)).ok());
  client_.HoldRuns(true);
  RunResult& run = RunNow("sync");
  ASSERT_TRUE(run.started.ok());
  const std::string id = run.response.run_id();
  EXPECT_TRUE(transfers_->IsRun(id));
  std::vector<PlanState> seen;
  absl::StatusOr<int64_t> watch =
      transfers_->Watch(id, [&seen](const PlanProgress& p) { seen.push_back(p.state); });
  ASSERT_TRUE(watch.ok());
  client_.ReleaseRuns();
  ASSERT_TRUE(run.ended.has_value() && run.ended->ok());
  EXPECT_EQ(seen.front(), PlanState::kPrepared);  // Sent, waiting for the answers.
  EXPECT_EQ(seen.back(), PlanState::kCommitted);
  std::vector<v1::PlanSummary> runs = transfers_->ListRuns(10);
  ASSERT_THAT(runs, SizeIs(1));
  EXPECT_EQ(runs[0].plan_id(), id);
  EXPECT_EQ(runs[0].op(), "transfer");
  EXPECT_EQ(runs[0].state(), v1::COMMITTED);
  absl::StatusOr<v1::PlanTrace> trace = transfers_->Trace(id);
  ASSERT_TRUE(trace.ok());
  EXPECT_EQ(trace->ranks_size(), 6);
  EXPECT_EQ(transfers_->Progress(id)->state, PlanState::kCommitted);
}

TEST_F(TransferManagerTest, DeleteDropsThePartsAndTheDstsKeepTheLastRunsVersion) {
  CreateMembers(2);
  ASSERT_TRUE(Create("sync", Copies(2)).ok());
  RunResult& run = RunNow("sync");
  ASSERT_TRUE(run.Committed());
  ASSERT_TRUE(transfers_->Delete("sync").ok());
  EXPECT_EQ(transfers_->Get("sync", false).status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(transfers_->Delete("sync").code(), absl::StatusCode::kNotFound);
  for (int64_t rank = 0; rank < 6; ++rank) {
    EXPECT_THAT(client_.ResidentTransfers(rank), IsEmpty()) << rank;
  }
  EXPECT_EQ(tensors_.Get("b.0")->version, run.response.version());
  // Stored too: a tensor manager loaded from the store (no binding) reads it.
  TensorManager reloaded(&meshes_, &store_);
  ASSERT_TRUE(reloaded.Load([](int64_t, int64_t) { return false; }).ok());
  EXPECT_EQ(reloaded.Get("b.1")->version, run.response.version());
  absl::StatusOr<std::vector<StateRecord>> left = store_.LoadAll();
  for (const StateRecord& r : *left) EXPECT_NE(r.kind.rfind("transfer", 0), 0u) << r.kind;
  // The tensors are plain again.
  EXPECT_TRUE(tensors_.Acquire("b.0", "p-1").ok());
}

TEST_F(TransferManagerTest, ListPagesInNameOrder) {
  CreateMembers(6);
  for (int i = 0; i < 3; ++i) {
    ASSERT_TRUE(
        Create(absl::StrCat("t", i), {{absl::StrCat("a.", 2 * i), absl::StrCat("b.", 2 * i)}})
            .ok());
  }
  TransferManager::Page first = transfers_->List("", 2);
  ASSERT_THAT(first.transfers, SizeIs(2));
  EXPECT_TRUE(first.more);
  EXPECT_EQ(first.transfers[1].name(), "t1");
  TransferManager::Page rest = transfers_->List("t1", 2);
  ASSERT_THAT(rest.transfers, SizeIs(1));
  EXPECT_FALSE(rest.more);
  EXPECT_EQ(rest.transfers[0].name(), "t2");
  EXPECT_THAT(transfers_->Get("t0", true)->copies(), SizeIs(1));
  EXPECT_THAT(transfers_->Get("t0", false)->copies(), IsEmpty());
}

// Two transfers sharing a tensor: runs exclude each other, and one writing the other's
// source invalidates it.
TEST_F(TransferManagerTest, TransfersSharingATensorExcludeAndInvalidateEachOther) {
  CreateMembers(2);
  CreateTensorOn("c.0", "D", "R", {8, 4});
  ASSERT_TRUE(Create("first", {{"a.0", "b.0"}}).ok());
  ASSERT_TRUE(Create("second", {{"b.0", "c.0"}}).ok());  // Reads first's dst.
  client_.HoldRuns(true);
  RunResult& one = RunNow("first");
  ASSERT_TRUE(one.started.ok());
  RunResult& two = RunNow("second");
  EXPECT_EQ(two.started.code(), absl::StatusCode::kAborted);
  EXPECT_THAT(two.started.message(), HasSubstr("transfer 'first', which is running"));
  client_.HoldRuns(false);
  client_.ReleaseRuns();
  ASSERT_TRUE(one.ended.has_value() && one.ended->ok());
  absl::StatusOr<v1::TransferInfo> second = transfers_->Get("second", false);
  EXPECT_FALSE(second->prepared());
  EXPECT_THAT(second->invalid_reason(), HasSubstr("transfer 'first'"));
  RunResult& again = RunNow("second");
  ASSERT_TRUE(again.Committed()) << again.Error();
  EXPECT_TRUE(again.response.replanned());
  // The first transfer read nothing the second wrote: still valid.
  EXPECT_TRUE(transfers_->Get("first", false)->prepared());
}

}  // namespace
}  // namespace shardcoord
