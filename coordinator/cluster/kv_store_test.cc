#include "coordinator/cluster/kv_store.h"

#include <optional>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace shardcoord {
namespace {

using ::testing::HasSubstr;

class KvStoreTest : public ::testing::Test {
 protected:
  KvStoreTest() : timer_(&clock_), kv_(&timer_) {}
  absl::Time In(absl::Duration d) { return clock_.Now() + d; }
  FakeClock clock_;
  FakeTimer timer_;
  KvStore kv_;
};

TEST_F(KvStoreTest, GetBeforeSetCompletesOnSet) {
  std::optional<absl::StatusOr<std::string>> got;
  kv_.GetAsync("gloo/0", In(absl::Seconds(5)), [&](absl::StatusOr<std::string> v) { got = v; });
  EXPECT_FALSE(got.has_value());
  EXPECT_EQ(kv_.num_waiters(), 1u);
  EXPECT_EQ(kv_.Get("gloo/0").status().code(), absl::StatusCode::kNotFound);
  ASSERT_TRUE(kv_.Set("gloo/0", "addr").ok());
  ASSERT_TRUE(got.has_value());
  ASSERT_TRUE(got->ok());
  EXPECT_EQ(**got, "addr");
  EXPECT_EQ(kv_.num_waiters(), 0u);
  // The deadline timer was cancelled.
  EXPECT_EQ(timer_.pending(), 0u);
  // Present keys complete at once.
  std::optional<absl::StatusOr<std::string>> again;
  kv_.GetAsync("gloo/0", In(absl::Seconds(5)), [&](absl::StatusOr<std::string> v) { again = v; });
  ASSERT_TRUE(again.has_value() && again->ok());
  EXPECT_EQ(**again, "addr");
}

TEST_F(KvStoreTest, GetTimesOutAtTheDeadline) {
  std::optional<absl::StatusOr<std::string>> got;
  kv_.GetAsync("k", In(absl::Seconds(2)), [&](absl::StatusOr<std::string> v) { got = v; });
  timer_.Advance(absl::Seconds(1));
  EXPECT_FALSE(got.has_value());
  timer_.Advance(absl::Seconds(1));
  ASSERT_TRUE(got.has_value());
  EXPECT_EQ(got->status().code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_THAT(got->status().message(), HasSubstr("key 'k' was not set"));
  // A later Set completes nobody twice.
  ASSERT_TRUE(kv_.Set("k", "v").ok());
  EXPECT_EQ(kv_.num_waiters(), 0u);
}

TEST_F(KvStoreTest, EmptyKeyIsInvalid) {
  EXPECT_EQ(kv_.Set("", "v").code(), absl::StatusCode::kInvalidArgument);
  std::optional<absl::Status> s;
  kv_.GetAsync("", In(absl::Seconds(1)), [&](absl::StatusOr<std::string> v) { s = v.status(); });
  ASSERT_TRUE(s.has_value());
  EXPECT_EQ(s->code(), absl::StatusCode::kInvalidArgument);
}

TEST_F(KvStoreTest, BarrierReleasesEveryoneWhenTheLastArrives) {
  std::vector<std::optional<absl::Status>> got(3);
  for (int i = 0; i < 3; ++i) {
    if (i == 2) EXPECT_FALSE(got[0].has_value() || got[1].has_value());
    kv_.Barrier("b", 3, absl::StrCat("m", i), In(absl::Seconds(5)),
                [&got, i](absl::Status s) { got[i] = s; });
  }
  for (int i = 0; i < 3; ++i) {
    ASSERT_TRUE(got[i].has_value()) << i;
    EXPECT_TRUE(got[i]->ok()) << *got[i];
  }
  EXPECT_EQ(timer_.pending(), 0u);
  // A late arrival at a completed barrier passes at once.
  std::optional<absl::Status> late;
  kv_.Barrier("b", 3, "m0", In(absl::Seconds(5)), [&](absl::Status s) { late = s; });
  ASSERT_TRUE(late.has_value());
  EXPECT_TRUE(late->ok());
}

TEST_F(KvStoreTest, BarrierDeadlineAndMismatch) {
  std::optional<absl::Status> a, mismatch, dup_old, dup_new;
  kv_.Barrier("b", 3, "a", In(absl::Seconds(1)), [&](absl::Status s) { a = s; });
  kv_.Barrier("b", 2, "x", In(absl::Seconds(1)), [&](absl::Status s) { mismatch = s; });
  ASSERT_TRUE(mismatch.has_value());
  EXPECT_EQ(mismatch->code(), absl::StatusCode::kInvalidArgument);
  // The same member arriving twice replaces its first arrival (it does not count twice).
  kv_.Barrier("b", 3, "c", In(absl::Seconds(10)), [&](absl::Status s) { dup_old = s; });
  kv_.Barrier("b", 3, "c", In(absl::Seconds(10)), [&](absl::Status s) { dup_new = s; });
  ASSERT_TRUE(dup_old.has_value());
  EXPECT_EQ(dup_old->code(), absl::StatusCode::kAborted);
  EXPECT_FALSE(dup_new.has_value());

  timer_.Advance(absl::Seconds(1));
  ASSERT_TRUE(a.has_value());
  EXPECT_EQ(a->code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_EQ(a->message(), "barrier 'b': 2 of 3 participants arrived");
  EXPECT_FALSE(dup_new.has_value());
  // "a" left; two more arrivals complete it.
  std::optional<absl::Status> d, e;
  kv_.Barrier("b", 3, "d", In(absl::Seconds(10)), [&](absl::Status s) { d = s; });
  EXPECT_FALSE(d.has_value());
  kv_.Barrier("b", 3, "e", In(absl::Seconds(10)), [&](absl::Status s) { e = s; });
  ASSERT_TRUE(d.has_value() && e.has_value() && dup_new.has_value());
  EXPECT_TRUE(d->ok() && e->ok() && dup_new->ok());
}

TEST_F(KvStoreTest, DeletePrefix) {
  ASSERT_TRUE(kv_.Set("plan/p-1/a", "1").ok());
  ASSERT_TRUE(kv_.Set("plan/p-1/b", "2").ok());
  ASSERT_TRUE(kv_.Set("plan/p-10/a", "3").ok());
  ASSERT_TRUE(kv_.Set("other", "4").ok());
  EXPECT_EQ(kv_.DeletePrefix("plan/p-1/"), 2);
  EXPECT_EQ(kv_.num_keys(), 2u);
  EXPECT_TRUE(kv_.Get("plan/p-10/a").ok());
}

TEST_F(KvStoreTest, CancelAllCompletesWaitersAndRefusesNewWaits) {
  std::optional<absl::StatusOr<std::string>> got;
  std::optional<absl::Status> barrier;
  kv_.GetAsync("k", In(absl::Hours(1)), [&](absl::StatusOr<std::string> v) { got = v; });
  kv_.Barrier("b", 2, "m", In(absl::Hours(1)), [&](absl::Status s) { barrier = s; });
  kv_.CancelAll(absl::UnavailableError("shutting down"));
  ASSERT_TRUE(got.has_value() && barrier.has_value());
  EXPECT_EQ(got->status().code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(barrier->code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(timer_.pending(), 0u);
  std::optional<absl::StatusOr<std::string>> later;
  kv_.GetAsync("k", In(absl::Hours(1)), [&](absl::StatusOr<std::string> v) { later = v; });
  ASSERT_TRUE(later.has_value());
  EXPECT_EQ(later->status().code(), absl::StatusCode::kUnavailable);
  // Present keys are still served.
  ASSERT_TRUE(kv_.Set("k", "v").ok());
  kv_.GetAsync("k", In(absl::Hours(1)), [&](absl::StatusOr<std::string> v) { later = v; });
  ASSERT_TRUE(later->ok());
}

}  // namespace
}  // namespace shardcoord
