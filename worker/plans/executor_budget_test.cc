// The executor under a memory budget: real fragments over in-process Gloo, every rank's
// buffers in a BudgetedMemorySpace over host memory, so each rank's own accounting measures
// what the fragment held. With a plan's small buckets the staging held at once stays within
// StagingLimit(bucket) (point-to-point exchanges in windows, collectives falling back to
// point-to-point), every value arrives, and a budget with room for the buffers plus that
// staging is enough; one below the buffers' needs is refused with RESOURCE_EXHAUSTED naming
// the worker.
#include <cstring>
#include <memory>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "proto/convert.h"
#include "sharding/fill.h"
#include "sharding/layout.h"
#include "sharding/planner.h"
#include "sharding/staging.h"
#include "worker/buffers/buffer_store.h"
#include "worker/comm/gloo/gloo_communicator.h"
#include "worker/control/kv_client.h"
#include "worker/memory/memory_budget.h"
#include "worker/plans/executor.h"
#include "worker/plans/fragment.h"
#include "worker/testing/executor_test_util.h"
#include "worker/testing/forwarding_communicator.h"

namespace shardcoord {
namespace {

using executor_testing::ForEachElement;
using executor_testing::Fragments;
using executor_testing::MakeLayout;
using executor_testing::MakeSource;
using executor_testing::Reduced;
using ::testing::HasSubstr;

constexpr int kRanks = 4;

// Gloo that asks for its collectives (as NCCL does), so the staging fallback is exercised.
class CollectivesCommunicator final : public ForwardingCommunicator {
 public:
  using ForwardingCommunicator::ForwardingCommunicator;
  bool PrefersSendRecvForCopies() const override { return false; }
};

struct Cluster {
  explicit Cluster(bool collectives) {
    for (int r = 0; r < kRanks; ++r) {
      std::shared_ptr<CommunicatorFactory> gloo =
          *GlooCommunicatorFactory::Create(&kv, GlooOptions{});
      if (collectives) {
        gloo = std::make_shared<WrappingCommunicatorFactory>(
            gloo, [](std::shared_ptr<Communicator> c) -> std::shared_ptr<Communicator> {
              return std::make_shared<CollectivesCommunicator>(std::move(c));
            });
      }
      caches.push_back(std::make_unique<CommunicatorCache>(gloo));
    }
  }
  InMemoryKvClient kv;
  std::vector<std::unique_ptr<CommunicatorCache>> caches;
};

struct RankRun {
  absl::StatusOr<ExecuteResult> result = absl::UnknownError("not run");
  int64_t buffers = 0;  // Source + target bytes the rank held.
  int64_t peak = 0;     // Its budget's watermark over the fragment.
  // The target's space outlives it (members go in reverse order).
  std::shared_ptr<MemoryBudget> budget;
  std::shared_ptr<BudgetedMemorySpace> space;
  std::shared_ptr<HostBuffer> target;
};

// Runs every rank's fragment of `plan` with bucket `bucket` (0: the option's default), each
// rank's buffers counted by a budget of `budget_bytes` (0: no limit).
std::vector<RankRun> RunFragments(Cluster& cluster, const Plan& plan, const std::string& id,
                                  int64_t bucket, int64_t budget_bytes) {
  std::vector<RankRun> runs(kRanks);
  std::vector<std::shared_ptr<MemoryBudget>> budgets;
  std::vector<std::shared_ptr<BudgetedMemorySpace>> spaces;
  std::vector<Fragment> fragments(kRanks);
  std::vector<std::shared_ptr<HostBuffer>> sources(kRanks);
  std::vector<v1::PlanFragment> protos = Fragments(plan, id, kRanks);
  for (int r = 0; r < kRanks; ++r) {
    protos[r].set_bucket_bytes(bucket);
    fragments[r] = *ParseFragment(protos[r]);
    budgets.push_back(std::make_shared<MemoryBudget>(absl::StrCat("worker w", r), budget_bytes));
    spaces.push_back(
        std::make_shared<BudgetedMemorySpace>(&HostMemorySpace::Global(), budgets.back().get()));
    runs[r].budget = budgets[r];
    runs[r].space = spaces[r];
  }
  std::vector<std::thread> threads;
  for (int r = 0; r < kRanks; ++r) {
    threads.emplace_back([&, r] {
      // Buffers first (a source the rank holds, then the new target), as a worker does.
      sources[r] = MakeSource(plan.source, r, plan.dtype, spaces[r].get());
      absl::StatusOr<std::shared_ptr<HostBuffer>> target =
          HostBuffer::Create(plan.dtype, fragments[r].shapes[0].target, spaces[r].get());
      if (!target.ok()) {
        runs[r].result = target.status();
        return;
      }
      runs[r].target = *target;
      runs[r].buffers = budgets[r]->used();
      const int64_t mark = budgets[r]->OpenWatermark();
      ExecuteInput in;
      in.fragment = &fragments[r];
      in.source = sources[r].get();
      in.target = runs[r].target.get();
      in.communicators = cluster.caches[r].get();
      runs[r].result = ExecuteFragment(in);
      runs[r].peak = budgets[r]->CloseWatermark(mark);
    });
  }
  for (auto& t : threads) t.join();
  sources.clear();
  return runs;
}

void CheckValues(const Plan& plan, const std::vector<RankRun>& runs) {
  for (int r = 0; r < kRanks; ++r) {
    ASSERT_TRUE(runs[r].result.ok()) << "rank " << r << ": " << runs[r].result.status();
    const RankChunks* rc = plan.target.Find(r);
    if (rc == nullptr) continue;
    const int64_t esize = ElementSize(plan.dtype);
    for (const Chunk& c : rc->chunks) {
      const char* data = runs[r].target->data() + c.local_offset * esize;
      ForEachElement(plan.target.global_shape(), c.box, [&](int64_t i, int64_t flat) {
        const double want = Reduced(plan.source.partial_op(), flat, plan.source.num_partials());
        ASSERT_EQ(LoadAsDouble(data, plan.dtype, i), want)
            << "rank " << r << " chunk " << c.box.ToString() << " element " << i;
      });
    }
  }
}

// Largest staging any rank held: its peak beyond the buffers it holds throughout.
int64_t MostStaging(const std::vector<RankRun>& runs) {
  int64_t most = 0;
  for (const RankRun& r : runs) most = std::max(most, r.peak - r.buffers);
  return most;
}

Plan MakePlan(const std::string& from, const std::string& to, const Shape& shape) {
  absl::StatusOr<Plan> plan = Redistribute(MakeLayout({kRanks}, {}, from, shape),
                                           MakeLayout({kRanks}, {}, to, shape), DType::kF32);
  EXPECT_TRUE(plan.ok()) << plan.status();
  return *plan;
}

struct Case {
  std::string from, to;
  Shape shape;
};

// 256 KiB f32 tensors: with 4 KiB buckets every step needs many windows; with the default
// (64 MiB) buckets one.
const std::vector<Case>& Cases() {
  static const std::vector<Case>* cases = new std::vector<Case>{
      {"S(0)", "S(1)", {256, 256}},              // All-to-all.
      {"S(1)", "R", {256, 256}},                 // All-gather.
      {"P(sum)", "R", {256, 256}},               // All-reduce.
      {"P(sum)", "S(0)", {256, 256}},            // Reduce-scatter.
      {"S(0)", "S(1,[1,255,0,0])", {256, 256}},  // Uneven point-to-point.
  };
  return *cases;
}

class ExecutorBudgetTest : public ::testing::TestWithParam<bool> {};

TEST_P(ExecutorBudgetTest, SmallBucketsBoundTheStagingAndMoveEveryValue) {
  Cluster cluster(/*collectives=*/GetParam());
  constexpr int64_t kBucket = 4096;
  int serial = 0;
  for (const Case& c : Cases()) {
    SCOPED_TRACE(absl::StrCat(c.from, " -> ", c.to, GetParam() ? " (collectives)" : ""));
    const Plan plan = MakePlan(c.from, c.to, c.shape);
    std::vector<RankRun> small =
        RunFragments(cluster, plan, absl::StrCat("s", serial++), kBucket, 0);
    CheckValues(plan, small);
    EXPECT_LE(MostStaging(small), StagingLimit(kBucket));
    // The same plan with default buckets stages far more: the bound above is the buckets'.
    std::vector<RankRun> big = RunFragments(cluster, plan, absl::StrCat("b", serial++), 0, 0);
    CheckValues(plan, big);
    EXPECT_GT(MostStaging(big), StagingLimit(kBucket));
    // The coordinator's staging caps bound what any bucket size stages.
    const std::map<int64_t, int64_t> caps = StagingCaps(plan);
    for (int r = 0; r < kRanks; ++r) {
      const int64_t cap = caps.count(r) ? caps.at(r) : 0;
      EXPECT_LE(big[r].peak - big[r].buffers, cap) << "rank " << r;
      EXPECT_LE(small[r].peak - small[r].buffers, std::min(cap, StagingLimit(kBucket)))
          << "rank " << r;
    }
  }
}

TEST_P(ExecutorBudgetTest, ABudgetWithRoomForBuffersAndBucketsIsEnough) {
  Cluster cluster(GetParam());
  constexpr int64_t kBucket = 8192;
  const Plan plan = MakePlan("S(0)", "S(1)", {256, 256});
  // Each rank holds 64 KiB of source and 64 KiB of target.
  const int64_t buffers = 2 * 64 * 256 * 4;
  std::vector<RankRun> fits =
      RunFragments(cluster, plan, "fits", kBucket, buffers + StagingLimit(kBucket));
  CheckValues(plan, fits);
  for (const RankRun& r : fits) EXPECT_LE(r.peak, buffers + StagingLimit(kBucket));
  // Default buckets would stage the whole exchange: the same budget refuses it, naming the
  // worker, before any byte of it is sent.
  std::vector<RankRun> refused =
      RunFragments(cluster, plan, "refused", 0, buffers + StagingLimit(kBucket));
  bool any = false;
  for (int r = 0; r < kRanks; ++r) {
    if (refused[r].result.ok()) continue;
    any = true;
    EXPECT_EQ(refused[r].result.status().code(), absl::StatusCode::kResourceExhausted);
    EXPECT_THAT(refused[r].result.status().message(),
                HasSubstr(absl::StrCat("worker w", r, ": memory budget exceeded")));
  }
  EXPECT_TRUE(any);
}

INSTANTIATE_TEST_SUITE_P(Backends, ExecutorBudgetTest, ::testing::Bool());

}  // namespace
}  // namespace shardcoord
