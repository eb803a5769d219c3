// NcclCommunicator and its factory on a fake NCCL and a fake clock: the rendezvous through
// the KvClient, the NCCL calls each Communicator op issues, and the watchdog/abort path
// (timeouts, NCCL errors, abort requests, teardown), all without a GPU or real waiting.
#include "worker/comm/nccl/nccl_communicator.h"

#include <algorithm>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/synchronization/notification.h"
#include "common/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "worker/comm/communicator.h"
#include "worker/comm/nccl/fake_nccl_api.h"
#include "worker/control/kv_client.h"

namespace shardcoord {
namespace nccl {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

// A KvClient whose Get never finds the key: the wait's outcome without waiting.
class NeverKvClient : public KvClient {
 public:
  absl::Status Set(absl::string_view, absl::string_view) override { return absl::OkStatus(); }
  absl::StatusOr<std::string> Get(absl::string_view key, absl::Duration timeout) override {
    last_timeout = timeout;
    return absl::DeadlineExceededError(
        absl::StrCat("key '", key, "' did not appear within ", absl::FormatDuration(timeout)));
  }
  absl::Duration last_timeout;
};

class NcclCommunicatorTest : public ::testing::Test {
 protected:
  NcclCommunicatorTest() {
    options_.device = 3;
    options_.watchdog.spin_polls = 0;
    options_.watchdog.poll_interval = absl::Milliseconds(1);
    api_->Label(in_, sizeof(in_), "in");
    api_->Label(out_, sizeof(out_), "out");
  }

  CommunicatorSpec Spec(std::vector<int64_t> ranks, int64_t my_rank) {
    CommunicatorSpec spec;
    spec.incarnations.assign(ranks.size(), 0);
    spec.ranks = std::move(ranks);
    spec.my_rank = my_rank;
    spec.key_prefix = "plan-7";
    spec.timeout = absl::Seconds(5);
    return spec;
  }

  // Scripts the fake to answer `call` with `result`.
  void FailCall(const std::string& call, NcclResult result) {
    FakeNcclApi::Script s;
    s.fail_call = call;
    s.fail_result = result;
    api_->SetScript(s);
  }

  NcclCommunicatorFactory Factory(std::shared_ptr<KvClient> kv = nullptr) {
    return NcclCommunicatorFactory(kv ? kv : kv_, api_, clock_, options_);
  }

  // This process as group rank `my_index` of `ranks`; the id is already published for
  // members other than rank 0.
  std::shared_ptr<NcclCommunicator> Make(std::vector<int64_t> ranks, int my_index) {
    CommunicatorSpec spec = Spec(ranks, ranks[my_index]);
    if (my_index != 0) {
      EXPECT_TRUE(kv_->Set(NcclIdKey(spec), std::string(kNcclUniqueIdBytes, 'z')).ok());
    }
    absl::StatusOr<std::shared_ptr<Communicator>> c = Factory().Create(spec);
    EXPECT_TRUE(c.ok()) << c.status();
    if (!c.ok()) return nullptr;
    api_->ClearCalls();
    return std::dynamic_pointer_cast<NcclCommunicator>(*c);
  }

  static CommOptions Tag(uint32_t tag, absl::Duration timeout = absl::ZeroDuration()) {
    CommOptions o;
    o.tag = tag;
    o.timeout = timeout;
    return o;
  }

  std::shared_ptr<FakeNcclApi> api_ = std::make_shared<FakeNcclApi>();
  std::shared_ptr<FakeClock> clock_ = std::make_shared<FakeClock>();
  std::shared_ptr<InMemoryKvClient> kv_ = std::make_shared<InMemoryKvClient>();
  NcclFactoryOptions options_;
  char in_[256] = {};
  char out_[1024] = {};
};

// --- Rendezvous and creation ---

TEST_F(NcclCommunicatorTest, GroupOfOneNeedsNoRendezvous) {
  absl::StatusOr<std::shared_ptr<Communicator>> c = Factory().Create(Spec({6}, 6));
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ((*c)->rank(), 0);
  EXPECT_EQ((*c)->size(), 1);
  EXPECT_FALSE((*c)->broken());
  EXPECT_EQ(kv_->size(), 0);
  EXPECT_THAT(
      api_->calls(),
      ElementsAre("ncclGetUniqueId", "cudaSetDevice(3)", "cudaStreamCreate", "cudaEventCreate",
                  "ncclCommInitRankConfig(nranks=1, id=fake-nccl-id-1, rank=0, "
                  "blocking=0)"));
}

TEST_F(NcclCommunicatorTest, RankZeroPublishesTheIdAndTheOthersFetchIt) {
  NcclCommunicatorFactory factory = Factory();
  std::vector<absl::StatusOr<std::shared_ptr<Communicator>>> built(3);
  std::vector<std::thread> threads;
  // Group rank order is the spec's order, not global rank order.
  const std::vector<int64_t> ranks = {9, 4, 12};
  for (int i = 2; i >= 0; --i) {
    threads.emplace_back([&, i] { built[i] = factory.Create(Spec(ranks, ranks[i])); });
  }
  for (auto& t : threads) t.join();
  for (int i = 0; i < 3; ++i) {
    ASSERT_TRUE(built[i].ok()) << built[i].status();
    EXPECT_EQ((*built[i])->rank(), i);
    EXPECT_EQ((*built[i])->size(), 3);
  }
  EXPECT_EQ(*kv_->Get("plan-7/nccl_id/9,4,12/0,0,0", absl::ZeroDuration()),
            std::string("fake-nccl-id-1") + std::string(kNcclUniqueIdBytes - 14, '\0'));
  std::vector<std::string> inits;
  for (const std::string& c : api_->calls()) {
    if (c.rfind("ncclCommInitRankConfig", 0) == 0) inits.push_back(c);
  }
  std::sort(inits.begin(), inits.end());
  EXPECT_THAT(
      inits,
      ElementsAre("ncclCommInitRankConfig(nranks=3, id=fake-nccl-id-1, rank=0, blocking=0)",
                  "ncclCommInitRankConfig(nranks=3, id=fake-nccl-id-1, rank=1, blocking=0)",
                  "ncclCommInitRankConfig(nranks=3, id=fake-nccl-id-1, rank=2, blocking=0)"));
}

TEST_F(NcclCommunicatorTest, KeyIncludesIncarnations) {
  CommunicatorSpec spec = Spec({1, 2}, 1);
  spec.incarnations = {3, 8};
  EXPECT_EQ(NcclIdKey(spec), "plan-7/nccl_id/1,2/3,8");
  EXPECT_EQ(DescribeGroup(spec), "group [1,2] (prefix 'plan-7')");
}

TEST_F(NcclCommunicatorTest, MissingIdTimesOutNamingKeyAndGroup) {
  auto never = std::make_shared<NeverKvClient>();
  absl::StatusOr<std::shared_ptr<Communicator>> c = Factory(never).Create(Spec({4, 9}, 9));
  EXPECT_EQ(c.status().code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_EQ(c.status().message(),
            "waiting for the NCCL id of group [4,9] (prefix 'plan-7') under key "
            "'plan-7/nccl_id/4,9/0,0': key 'plan-7/nccl_id/4,9/0,0' did not appear within 5s");
  EXPECT_EQ(never->last_timeout, absl::Seconds(5));
  EXPECT_EQ(api_->live_streams(), 0);
  EXPECT_THAT(api_->calls(), ElementsAre());  // Nothing reached NCCL or CUDA.
}

TEST_F(NcclCommunicatorTest, WrongSizedIdIsInternal) {
  CommunicatorSpec spec = Spec({4, 9}, 9);
  ASSERT_TRUE(kv_->Set(NcclIdKey(spec), "short").ok());
  absl::StatusOr<std::shared_ptr<Communicator>> c = Factory().Create(spec);
  EXPECT_EQ(c.status().code(), absl::StatusCode::kInternal);
  EXPECT_THAT(std::string(c.status().message()), HasSubstr("has 5 bytes, not 128"));
}

TEST_F(NcclCommunicatorTest, InvalidSpecIsRejected) {
  CommunicatorSpec spec = Spec({4, 9}, 5);
  EXPECT_EQ(Factory().Create(spec).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST_F(NcclCommunicatorTest, UniqueIdFailureIsUnavailable) {
  FakeNcclApi::Script s;
  s.unique_id = NcclResult::kSystemError;
  api_->SetScript(s);
  absl::StatusOr<std::shared_ptr<Communicator>> c = Factory().Create(Spec({4, 9}, 4));
  EXPECT_EQ(c.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(std::string(c.status().message()), HasSubstr("ncclGetUniqueId for group [4,9]"));
  EXPECT_EQ(kv_->size(), 0);
}

TEST_F(NcclCommunicatorTest, NonBlockingInitIsPolledToCompletion) {
  FakeNcclApi::Script s;
  s.in_progress_polls = 3;
  api_->SetScript(s);
  absl::StatusOr<std::shared_ptr<Communicator>> c = Factory().Create(Spec({0}, 0));
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(api_->async_polls(), 4);
}

TEST_F(NcclCommunicatorTest, StuckInitTimesOutAbortsAndReleasesEverything) {
  FakeNcclApi::Script s;
  s.in_progress_polls = -1;  // A peer never joined.
  api_->SetScript(s);
  absl::StatusOr<std::shared_ptr<Communicator>> c = Factory().Create(Spec({2}, 2));
  EXPECT_EQ(c.status().code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_EQ(c.status().message(),
            "NCCL init of rank 0/1 on group [2] (prefix 'plan-7') did not complete within 5s "
            "(still in ncclInProgress); communicator aborted");
  EXPECT_EQ(api_->aborted_comms(), 1);
  EXPECT_EQ(api_->live_streams(), 0);
  EXPECT_EQ(api_->live_events(), 0);
  EXPECT_EQ(clock_->slept(), absl::Seconds(5));
}

TEST_F(NcclCommunicatorTest, FailedInitAbortsAndReleases) {
  FakeNcclApi::Script s;
  s.init = NcclResult::kInvalidUsage;
  api_->SetScript(s);
  absl::StatusOr<std::shared_ptr<Communicator>> c = Factory().Create(Spec({2}, 2));
  EXPECT_EQ(c.status().code(), absl::StatusCode::kAborted);
  EXPECT_THAT(std::string(c.status().message()),
              HasSubstr("failed: ncclCommInitRankConfig returned ncclInvalidUsage"));
  EXPECT_EQ(api_->aborted_comms(), 1);
  EXPECT_EQ(api_->live_streams(), 0);
}

// --- Op -> NCCL call mapping (group of 4, this process is group rank 1) ---

TEST_F(NcclCommunicatorTest, AllGatherVEqualCountsIsNcclAllGather) {
  auto c = Make({0, 1, 2, 3}, 1);
  ASSERT_TRUE(c->AllGatherV(in_, 16, out_, {16, 16, 16, 16}, Tag(1)).ok());
  EXPECT_THAT(api_->op_calls(), ElementsAre("ncclAllGather(send=in+0, recv=out+0, count=16, u8)"));
}

TEST_F(NcclCommunicatorTest, AllGatherVUnevenIsGroupedBroadcasts) {
  auto c = Make({0, 1, 2, 3}, 1);
  ASSERT_TRUE(c->AllGatherV(in_, 5, out_, {3, 5, 0, 2}, Tag(1)).ok());
  EXPECT_THAT(
      api_->op_calls(),
      ElementsAre("ncclGroupStart", "ncclBroadcast(send=out+0, recv=out+0, count=3, u8, root=0)",
                  "ncclBroadcast(send=in+0, recv=out+3, count=5, u8, root=1)",
                  "ncclBroadcast(send=out+8, recv=out+8, count=2, u8, root=3)", "ncclGroupEnd"));
}

TEST_F(NcclCommunicatorTest, AllToAllVIsGroupedSendRecv) {
  auto c = Make({0, 1, 2, 3}, 1);
  ASSERT_TRUE(c->AllToAllV(in_, {1, 2, 0, 3}, out_, {4, 2, 1, 0}, Tag(2)).ok());
  EXPECT_THAT(api_->op_calls(),
              ElementsAre("ncclGroupStart", "ncclSend(send=in+0, count=1, u8, peer=0)",
                          "ncclRecv(recv=out+0, count=4, u8, peer=0)",
                          "ncclSend(send=in+1, count=2, u8, peer=1)",
                          "ncclRecv(recv=out+4, count=2, u8, peer=1)",
                          "ncclRecv(recv=out+6, count=1, u8, peer=2)",
                          "ncclSend(send=in+3, count=3, u8, peer=3)", "ncclGroupEnd"));
}

TEST_F(NcclCommunicatorTest, ReduceScatterVMapping) {
  auto c = Make({0, 1, 2, 3}, 1);
  ASSERT_TRUE(c->ReduceScatterV(in_, out_, {2, 2, 2, 2}, DType::kF32, ReduceOp::kSum, Tag(3)).ok());
  EXPECT_THAT(api_->op_calls(),
              ElementsAre("ncclReduceScatter(send=in+0, recv=out+0, count=2, f32, sum)"));
  api_->ClearCalls();
  ASSERT_TRUE(c->ReduceScatterV(in_, out_, {1, 3, 0, 2}, DType::kI64, ReduceOp::kMin, Tag(4)).ok());
  EXPECT_THAT(
      api_->op_calls(),
      ElementsAre("ncclGroupStart", "ncclReduce(send=in+0, recv=null, count=1, i64, min, root=0)",
                  "ncclReduce(send=in+8, recv=out+0, count=3, i64, min, root=1)",
                  "ncclReduce(send=in+32, recv=null, count=2, i64, min, root=3)", "ncclGroupEnd"));
}

TEST_F(NcclCommunicatorTest, AllReduceBroadcastAndSendRecvMapping) {
  auto c = Make({0, 1, 2, 3}, 1);
  ASSERT_TRUE(c->AllReduce(in_, in_, 8, DType::kBF16, ReduceOp::kMax, Tag(5)).ok());
  ASSERT_TRUE(c->Broadcast(out_, 100, 2, Tag(6)).ok());
  const std::vector<SendOp> sends = {{3, in_, 10}, {0, in_ + 10, 6}};
  const std::vector<RecvOp> recvs = {{3, out_, 7}};
  ASSERT_TRUE(c->SendRecv(sends, recvs, Tag(7)).ok());
  EXPECT_THAT(api_->op_calls(),
              ElementsAre("ncclAllReduce(send=in+0, recv=in+0, count=8, bf16, max)",
                          "ncclBroadcast(send=out+0, recv=out+0, count=100, u8, root=2)",
                          "ncclGroupStart", "ncclSend(send=in+0, count=10, u8, peer=3)",
                          "ncclSend(send=in+10, count=6, u8, peer=0)",
                          "ncclRecv(recv=out+0, count=7, u8, peer=3)", "ncclGroupEnd"));
}

TEST_F(NcclCommunicatorTest, EveryOpWaitsForItsEventOnItsOwnStream) {
  auto c = Make({0, 1}, 0);
  FakeNcclApi::Script s;
  s.in_progress_polls = 2;
  s.event_pending_polls = 3;
  api_->SetScript(s);
  ASSERT_TRUE(c->AllReduce(in_, out_, 4, DType::kF32, ReduceOp::kSum, Tag(1)).ok());
  EXPECT_THAT(api_->calls(), ElementsAre("cudaSetDevice(3)",
                                         "ncclAllReduce(send=in+0, recv=out+0, count=4, f32, sum)",
                                         "cudaEventRecord"));
  EXPECT_EQ(api_->event_polls(), 4);
  EXPECT_TRUE(api_->misuse().empty());
}

TEST_F(NcclCommunicatorTest, GroupOfOneRunsEveryOp) {
  auto c = Make({5}, 0);
  const CommOptions o = Tag(1);
  ASSERT_TRUE(c->AllGatherV(in_, 8, out_, {8}, o).ok());
  ASSERT_TRUE(c->AllToAllV(in_, {8}, out_, {8}, o).ok());
  ASSERT_TRUE(c->ReduceScatterV(in_, out_, {2}, DType::kF32, ReduceOp::kSum, o).ok());
  ASSERT_TRUE(c->AllReduce(in_, out_, 2, DType::kF32, ReduceOp::kSum, o).ok());
  ASSERT_TRUE(c->Broadcast(out_, 8, 0, o).ok());
  ASSERT_TRUE(c->SendRecv({}, {}, o).ok());
  EXPECT_THAT(api_->op_calls(),
              ElementsAre("ncclAllGather(send=in+0, recv=out+0, count=8, u8)", "ncclGroupStart",
                          "ncclSend(send=in+0, count=8, u8, peer=0)",
                          "ncclRecv(recv=out+0, count=8, u8, peer=0)", "ncclGroupEnd",
                          "ncclReduceScatter(send=in+0, recv=out+0, count=2, f32, sum)",
                          "ncclAllReduce(send=in+0, recv=out+0, count=2, f32, sum)",
                          "ncclBroadcast(send=out+0, recv=out+0, count=8, u8, root=0)"));
}

TEST_F(NcclCommunicatorTest, InvalidArgumentsNeverReachNcclNorBreakTheCommunicator) {
  auto c = Make({0, 1, 2, 3}, 1);
  absl::Status st = c->AllGatherV(in_, 4, out_, {4, 5, 4, 4}, Tag(1));
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
  st = c->AllReduce(in_, out_, 4, DType::kF32, ReduceOp::kAvg, Tag(1));
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
  st = c->Broadcast(out_, 4, 7, Tag(1));
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(api_->calls(), ElementsAre());
  EXPECT_FALSE(c->broken());
  EXPECT_TRUE(c->AllReduce(in_, out_, 4, DType::kF32, ReduceOp::kSum, Tag(1)).ok());
}

TEST_F(NcclCommunicatorTest, NothingToMoveIssuesNothing) {
  auto c = Make({0, 1}, 1);
  ASSERT_TRUE(c->AllGatherV(nullptr, 0, nullptr, {0, 0}, Tag(1)).ok());
  ASSERT_TRUE(c->AllReduce(nullptr, nullptr, 0, DType::kF32, ReduceOp::kSum, Tag(1)).ok());
  EXPECT_THAT(api_->calls(), ElementsAre());
}

// --- Watchdog and abort path through the communicator ---

TEST_F(NcclCommunicatorTest, OpTimeoutAbortsNamesTheStepAndBreaksTheCommunicator) {
  auto c = Make({3, 5}, 0);
  FakeNcclApi::Script s;
  s.event_pending_polls = -1;  // The peer never shows up.
  api_->SetScript(s);
  const absl::Time start = clock_->Now();
  absl::Status st =
      c->AllReduce(in_, out_, 4, DType::kF32, ReduceOp::kSum, Tag(42, absl::Seconds(2)));
  EXPECT_EQ(st.code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_EQ(st.message(),
            "NCCL AllReduce (tag 42) on group [3,5] (prefix 'plan-7') did not complete within "
            "2s (enqueued, waiting for the GPU); communicator aborted");
  EXPECT_TRUE(c->broken());
  EXPECT_EQ(clock_->Now() - start, absl::Seconds(2));
  EXPECT_EQ(api_->aborted_comms(), 1);

  // The broken communicator refuses further work without touching NCCL.
  api_->ClearCalls();
  absl::Status again = c->Broadcast(out_, 4, 0, Tag(43));
  EXPECT_EQ(again.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(again.message(),
            "NCCL Broadcast (tag 43) on group [3,5] (prefix 'plan-7'): the communicator is "
            "broken: NCCL AllReduce (tag 42) on group [3,5] (prefix 'plan-7') did not complete "
            "within 2s (enqueued, waiting for the GPU); communicator aborted");
  EXPECT_THAT(api_->calls(), ElementsAre());

  // Teardown neither finalizes nor destroys the aborted communicator.
  c.reset();
  EXPECT_THAT(api_->op_calls(), ElementsAre());
  EXPECT_EQ(api_->destroyed_comms(), 0);
  EXPECT_EQ(api_->live_streams(), 0);
  EXPECT_EQ(api_->live_events(), 0);
  EXPECT_TRUE(api_->misuse().empty()) << api_->misuse()[0];
}

TEST_F(NcclCommunicatorTest, DefaultOpTimeoutIsTheSpecTimeout) {
  auto c = Make({3, 5}, 0);
  FakeNcclApi::Script s;
  s.in_progress_polls = -1;  // Stuck before the work reaches the stream.
  api_->SetScript(s);
  const absl::Time start = clock_->Now();
  absl::Status st = c->SendRecv({{1, in_, 4}}, {}, Tag(9));
  EXPECT_EQ(st.code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_THAT(std::string(st.message()),
              HasSubstr("NCCL SendRecv (tag 9) on group [3,5] (prefix 'plan-7') did not "
                        "complete within 5s (still in ncclInProgress)"));
  EXPECT_EQ(clock_->Now() - start, absl::Seconds(5));
}

TEST_F(NcclCommunicatorTest, AsyncRemoteErrorAbortsWithAborted) {
  auto c = Make({3, 5}, 1);
  FakeNcclApi::Script s;
  s.event_pending_polls = -1;
  s.async_error_after = 5;
  s.async_error = NcclResult::kRemoteError;
  s.last_error = "peer 3 exited";
  api_->SetScript(s);
  absl::Status st = c->AllToAllV(in_, {2, 2}, out_, {2, 2}, Tag(11));
  EXPECT_EQ(st.code(), absl::StatusCode::kAborted);
  EXPECT_EQ(st.message(),
            "NCCL AllToAllV (tag 11) on group [3,5] (prefix 'plan-7') failed: ncclRemoteError: "
            "remote process exited or there was a network error (peer 3 exited); communicator "
            "aborted");
  EXPECT_TRUE(c->broken());
  EXPECT_EQ(api_->aborted_comms(), 1);
}

TEST_F(NcclCommunicatorTest, FailedGroupEndAborts) {
  auto c = Make({3, 5}, 1);
  FailCall("ncclGroupEnd", NcclResult::kInvalidUsage);
  absl::Status st = c->AllGatherV(in_, 2, out_, {1, 2}, Tag(12));
  EXPECT_EQ(st.code(), absl::StatusCode::kAborted);
  EXPECT_THAT(std::string(st.message()),
              HasSubstr("failed: ncclGroupEnd returned ncclInvalidUsage"));
  EXPECT_EQ(api_->op_calls().back(), "ncclCommAbort");
  EXPECT_TRUE(c->broken());
}

TEST_F(NcclCommunicatorTest, FailedCallInsideAGroupStillClosesTheGroup) {
  auto c = Make({3, 5}, 0);
  FailCall("ncclSend", NcclResult::kInvalidArgument);
  absl::Status st = c->AllToAllV(in_, {1, 1}, out_, {1, 1}, Tag(13));
  EXPECT_EQ(st.code(), absl::StatusCode::kAborted);
  EXPECT_THAT(std::string(st.message()),
              HasSubstr("failed: ncclSend returned ncclInvalidArgument"));
  EXPECT_THAT(api_->op_calls(),
              ElementsAre("ncclGroupStart", "ncclSend(send=in+0, count=1, u8, peer=0)",
                          "ncclGroupEnd", "ncclCommAbort"));
  EXPECT_TRUE(api_->misuse().empty()) << api_->misuse()[0];
}

TEST_F(NcclCommunicatorTest, SetDeviceFailureAborts) {
  auto c = Make({3, 5}, 0);
  FakeNcclApi::Script s;
  s.set_device = absl::InternalError("cudaSetDevice(3): invalid device ordinal");
  api_->SetScript(s);
  absl::Status st = c->Broadcast(out_, 4, 0, Tag(14));
  EXPECT_EQ(st.code(), absl::StatusCode::kAborted);
  EXPECT_THAT(std::string(st.message()), HasSubstr("invalid device ordinal"));
  EXPECT_TRUE(c->broken());
}

TEST_F(NcclCommunicatorTest, AbortFromAnotherThreadEndsTheOpInFlight) {
  auto c = Make({3, 5}, 0);
  absl::Notification waiting;
  FakeNcclApi::Script s;
  s.event_pending_polls = -1;
  s.on_event_poll = [&waiting] {
    if (!waiting.HasBeenNotified()) waiting.Notify();
  };
  api_->SetScript(s);
  absl::Status st;
  std::thread op([&] {
    st = c->AllReduce(in_, out_, 4, DType::kF32, ReduceOp::kSum, Tag(21, absl::Hours(1000)));
  });
  waiting.WaitForNotification();
  c->Abort("plan 12 was aborted by the coordinator");
  op.join();
  EXPECT_EQ(st.code(), absl::StatusCode::kAborted);
  EXPECT_EQ(st.message(),
            "NCCL AllReduce (tag 21) on group [3,5] (prefix 'plan-7') was cancelled by an abort "
            "request; communicator aborted");
  EXPECT_TRUE(c->broken());
  EXPECT_EQ(api_->aborted_comms(), 1);
  EXPECT_TRUE(api_->misuse().empty()) << api_->misuse()[0];
}

TEST_F(NcclCommunicatorTest, AbortWhileIdleBreaksTheCommunicator) {
  auto c = Make({3, 5}, 0);
  c->Abort("plan 12 was aborted by the coordinator");
  EXPECT_TRUE(c->broken());
  EXPECT_EQ(api_->aborted_comms(), 1);
  absl::Status st = c->Broadcast(out_, 4, 0, Tag(1));
  EXPECT_EQ(st.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(st.message()),
              HasSubstr("was aborted: plan 12 was aborted by the coordinator"));
  c->Abort("again");  // Idempotent.
  EXPECT_EQ(api_->aborted_comms(), 1);
}

TEST_F(NcclCommunicatorTest, HealthyTeardownFinalizesThenDestroys) {
  auto c = Make({3, 5}, 0);
  FakeNcclApi::Script s;
  s.in_progress_polls = 2;
  api_->SetScript(s);
  c.reset();
  EXPECT_THAT(api_->op_calls(), ElementsAre("ncclCommFinalize", "ncclCommDestroy"));
  EXPECT_EQ(api_->live_streams(), 0);
  EXPECT_EQ(api_->live_events(), 0);
}

TEST_F(NcclCommunicatorTest, TeardownAbortsWhenFinalizeHangs) {
  options_.finalize_timeout = absl::Seconds(3);
  auto c = Make({3, 5}, 0);
  FakeNcclApi::Script s;
  s.in_progress_polls = -1;  // A peer died: finalize never quiesces.
  api_->SetScript(s);
  c.reset();
  EXPECT_THAT(api_->op_calls(), ElementsAre("ncclCommFinalize", "ncclCommAbort"));
  EXPECT_EQ(api_->destroyed_comms(), 0);
  EXPECT_EQ(clock_->slept(), absl::Seconds(3));
  EXPECT_EQ(api_->live_streams(), 0);
}

TEST_F(NcclCommunicatorTest, CacheRebuildsABrokenCommunicator) {
  CommunicatorCache cache(std::make_shared<NcclCommunicatorFactory>(kv_, api_, clock_, options_));
  const CommunicatorSpec spec = Spec({7}, 7);
  absl::StatusOr<std::shared_ptr<Communicator>> first = cache.Get(spec);
  ASSERT_TRUE(first.ok()) << first.status();
  FakeNcclApi::Script s;
  s.event_pending_polls = -1;
  api_->SetScript(s);
  EXPECT_EQ((*first)->Broadcast(out_, 4, 0, Tag(1, absl::Seconds(1))).code(),
            absl::StatusCode::kDeadlineExceeded);
  api_->SetScript(FakeNcclApi::Script());
  absl::StatusOr<std::shared_ptr<Communicator>> second = cache.Get(spec);
  ASSERT_TRUE(second.ok()) << second.status();
  EXPECT_NE(first->get(), second->get());
  EXPECT_FALSE((*second)->broken());
  EXPECT_TRUE((*second)->Broadcast(out_, 4, 0, Tag(2)).ok());
}

}  // namespace
}  // namespace nccl
}  // namespace shardcoord
