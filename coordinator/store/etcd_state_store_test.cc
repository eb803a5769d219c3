#include "coordinator/store/etcd_state_store.h"

#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "coordinator/store/leader_election.h"
#include "coordinator/testing/fake_etcd.h"
#include "gtest/gtest.h"

namespace shardcoord {
namespace {

constexpr char kPrefix[] = "/t";

LeaderElectionOptions ElectionOptions(const std::string& address) {
  return TestElectionOptions(absl::StrCat(kPrefix, "/leader"), address);
}

class EtcdStateStoreTest : public ::testing::Test {
 protected:
  EtcdStateStoreTest()
      : etcd_(&clock_),
        client_(etcd_.NewClient()),
        election_(client_.get(), &clock_, ElectionOptions("a:1")) {
    election_.Step();
  }

  std::unique_ptr<EtcdStateStore> Open(LeaderElection* election, EtcdStateStoreOptions o = {}) {
    o.prefix = kPrefix;
    absl::StatusOr<std::unique_ptr<EtcdStateStore>> store =
        EtcdStateStore::Open(client_.get(), election, &clock_, o);
    EXPECT_TRUE(store.ok()) << store.status();
    return store.ok() ? *std::move(store) : nullptr;
  }

  std::vector<StateRecord> Load(const StateStore& store) {
    absl::StatusOr<std::vector<StateRecord>> all = store.LoadAll();
    EXPECT_TRUE(all.ok()) << all.status();
    return all.ok() ? *all : std::vector<StateRecord>{};
  }

  FakeClock clock_;
  FakeEtcd etcd_;
  std::unique_ptr<EtcdClient> client_;
  LeaderElection election_;
};

TEST_F(EtcdStateStoreTest, BatchesRoundTripOneTransactionEach) {
  ASSERT_EQ(election_.state(), LeaderElection::State::kLeading);
  std::unique_ptr<EtcdStateStore> store = Open(&election_);
  StateBatch b;
  b.Put("tensor", "x/y", "1");
  b.Put("mesh", "m", "2");
  b.Put("counter", "boot", "3");
  ASSERT_TRUE(store->Apply(b).ok());
  StateBatch c;
  c.Delete("mesh", "m");
  c.Put("tensor", "x/y", "4");
  // A delete and a put of one record in one batch: the put wins (etcd refuses duplicate keys
  // in one transaction, so the store sends only the put).
  c.Delete("tensor", "x/y");
  ASSERT_TRUE(store->Apply(c).ok());
  EXPECT_EQ(store->transactions(), 2);
  EXPECT_EQ(Load(*store),
            (std::vector<StateRecord>{{"counter", "boot", "3"}, {"tensor", "x/y", "4"}}));
  EXPECT_EQ(etcd_.Get("/t/records/tensor/x/y")->value(), "4");
  // A second coordinator's store reads the same state.
  LeaderElection other(client_.get(), &clock_, ElectionOptions("b:2"));
  std::unique_ptr<EtcdStateStore> reader = Open(&other);
  EXPECT_EQ(Load(*reader), Load(*store));
  EXPECT_TRUE(store->Apply(StateBatch()).ok());
  EXPECT_EQ(store->transactions(), 2);
}

TEST_F(EtcdStateStoreTest, LoadsInPagesAtOneRevision) {
  EtcdStateStoreOptions o;
  o.page = 3;
  std::unique_ptr<EtcdStateStore> store = Open(&election_, o);
  StateBatch b;
  for (int i = 0; i < 10; ++i) b.Put("request", absl::StrCat("r", i), absl::StrCat(i));
  ASSERT_TRUE(store->Apply(b).ok());
  EXPECT_EQ(Load(*store).size(), 10u);
}

TEST_F(EtcdStateStoreTest, ACoordinatorThatDoesNotLeadCannotWrite) {
  LeaderElection standby(client_.get(), &clock_, ElectionOptions("b:2"));
  standby.Step();
  ASSERT_EQ(standby.state(), LeaderElection::State::kCampaigning);
  std::unique_ptr<EtcdStateStore> store = Open(&standby);
  absl::Status s = store->Put("mesh", "m", "1");
  EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable) << s;
  EXPECT_TRUE(etcd_.GetPrefix("/t/records/").empty());
}

TEST_F(EtcdStateStoreTest, AFormerLeaderIsFencedByEtcdItself) {
  std::unique_ptr<EtcdStateStore> old_store = Open(&election_);
  ASSERT_TRUE(old_store->Put("mesh", "m", "old").ok());
  // The old leader is paused (no keepalives); etcd expires its lease and b takes over. The
  // old leader's own clock has not run yet (a paused process), so only etcd can stop it.
  etcd_.ExpireLease(election_.lease_id());
  LeaderElection b(client_.get(), &clock_, ElectionOptions("b:2"));
  b.Step();
  ASSERT_EQ(b.state(), LeaderElection::State::kLeading);
  std::unique_ptr<EtcdStateStore> new_store = Open(&b);
  ASSERT_TRUE(new_store->Put("mesh", "m", "new").ok());
  ASSERT_TRUE(election_.Fence().ok());  // It still believes it leads...
  absl::Status s = old_store->Put("mesh", "m", "stale");
  EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable) << s;
  EXPECT_EQ(etcd_.Get("/t/records/mesh/m")->value(), "new");
  // ...until its write was refused: it has stopped leading.
  EXPECT_EQ(election_.state(), LeaderElection::State::kLost);
  EXPECT_EQ(old_store->Put("mesh", "n", "x").code(), absl::StatusCode::kUnavailable);
  EXPECT_FALSE(etcd_.Get("/t/records/mesh/n").has_value());
}

TEST_F(EtcdStateStoreTest, AWriteWhoseAnswerWasLostButAppliedIsOk) {
  std::unique_ptr<EtcdStateStore> store = Open(&election_);
  etcd_.FailNextTxn(absl::UnknownError("read timeout"), /*apply_first=*/true);
  ASSERT_TRUE(store->Put("tensor", "t", "1").ok());
  EXPECT_EQ(etcd_.Get("/t/records/tensor/t")->value(), "1");
  ASSERT_TRUE(store->Put("tensor", "u", "2").ok());  // Writing goes on.
  EXPECT_EQ(Load(*store).size(), 2u);
}

TEST_F(EtcdStateStoreTest, AWriteWhoseAnswerWasLostAndNotAppliedCanNeverApply) {
  std::unique_ptr<EtcdStateStore> store = Open(&election_);
  ASSERT_TRUE(store->Put("tensor", "t", "1").ok());
  etcd_.FailNextTxn(absl::UnknownError("etcdserver: request timed out"), /*apply_first=*/false);
  absl::Status s = store->Put("tensor", "t", "2");
  EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable) << s;
  EXPECT_EQ(etcd_.Get("/t/records/tensor/t")->value(), "1");
  // A barrier moved PREFIX/write on: the lost transaction's compare can never hold again.
  EXPECT_EQ(etcd_.Get("/t/write")->value().rfind("barrier ", 0), 0u);
  ASSERT_TRUE(store->Put("tensor", "t", "3").ok());
  EXPECT_EQ(etcd_.Get("/t/records/tensor/t")->value(), "3");
}

TEST_F(EtcdStateStoreTest, EtcdUnreachableIsUnavailableAndWritesNothing) {
  std::unique_ptr<EtcdStateStore> store = Open(&election_);
  EXPECT_EQ(store->LastTrouble(), absl::InfinitePast());
  ASSERT_TRUE(store->Put("mesh", "a", "1").ok());
  EXPECT_EQ(store->LastTrouble(), absl::InfinitePast());
  etcd_.set_down(true);
  clock_.Advance(absl::Seconds(1));
  const absl::Time failed_at = clock_.Now();
  EXPECT_EQ(store->Put("mesh", "m", "1").code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(store->LoadAll().status().code(), absl::StatusCode::kUnavailable);
  // The health check holds back deaths after such trouble.
  EXPECT_EQ(store->LastTrouble(), failed_at);
  etcd_.set_down(false);
  EXPECT_FALSE(etcd_.Get("/t/records/mesh/m").has_value());
  ASSERT_TRUE(store->Put("mesh", "m", "1").ok());
}

TEST_F(EtcdStateStoreTest, ABatchBeyondOneTransactionGoesThroughTheJournal) {
  etcd_.set_limits(8, 4096);
  EtcdStateStoreOptions o;
  o.max_txn_ops = 8;
  o.max_txn_bytes = 4096;
  std::unique_ptr<EtcdStateStore> store = Open(&election_, o);
  StateBatch b;
  for (int i = 0; i < 100; ++i) b.Put("tensor", absl::StrFormat("t%03d", i), std::string(100, 'v'));
  ASSERT_TRUE(store->Apply(b).ok());
  std::vector<StateRecord> all = Load(*store);
  ASSERT_EQ(all.size(), 100u);
  EXPECT_EQ(all[99].name, "t099");
  EXPECT_GT(store->transactions(), 14);  // 100 puts at 7 a transaction, plus the journal.
  EXPECT_TRUE(etcd_.GetPrefix("/t/journal/").empty());
  StateBatch d;
  for (int i = 0; i < 100; ++i) d.Delete("tensor", absl::StrFormat("t%03d", i));
  ASSERT_TRUE(store->Apply(d).ok());
  EXPECT_TRUE(Load(*store).empty());
}

TEST_F(EtcdStateStoreTest, ARecordBeyondTheByteBudgetIsRefused) {
  EtcdStateStoreOptions o;
  o.max_txn_bytes = 4096;
  std::unique_ptr<EtcdStateStore> store = Open(&election_, o);
  absl::Status s = store->Put("tensor", "huge", std::string(5000, 'x'));
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted) << s;
  EXPECT_NE(s.message().find("--max-request-bytes"), std::string::npos) << s;
  EXPECT_TRUE(etcd_.GetPrefix("/t/").size() == 1u);  // Only the leader key.
}

// What a leader that died in the middle of a journaled batch leaves, written by hand.
void WriteJournal(FakeEtcd* etcd, const std::string& id, const std::vector<std::string>& names,
                  bool committed) {
  etcdv3::TxnRequest payload;
  for (const std::string& n : names) {
    *payload.add_success() = PutOp(absl::StrCat("/t/records/tensor/", n), "from-journal");
  }
  const std::string bytes = payload.SerializeAsString();
  const size_t half = bytes.size() / 2;
  etcd->Put(absl::StrCat("/t/journal/", id, "/part/000000"), bytes.substr(0, half));
  etcd->Put(absl::StrCat("/t/journal/", id, "/part/000001"), bytes.substr(half));
  if (committed) etcd->Put(absl::StrCat("/t/journal/", id, "/commit"), "2");
}

TEST_F(EtcdStateStoreTest, TheNextLeaderFinishesACommittedJournalAndDropsAnUncommittedOne) {
  WriteJournal(&etcd_, "1.1", {"a", "b", "c"}, /*committed=*/true);
  WriteJournal(&etcd_, "1.2", {"d"}, /*committed=*/false);
  std::unique_ptr<EtcdStateStore> store = Open(&election_);
  std::vector<StateRecord> all = Load(*store);
  ASSERT_EQ(all.size(), 3u);
  EXPECT_EQ(all[0], (StateRecord{"tensor", "a", "from-journal"}));
  EXPECT_EQ(all[2].name, "c");
  EXPECT_TRUE(etcd_.GetPrefix("/t/journal/").empty());
}

TEST_F(EtcdStateStoreTest, AJournalMissingAPartStopsTheLoad) {
  WriteJournal(&etcd_, "1.1", {"a"}, /*committed=*/true);
  etcd_.Delete("/t/journal/1.1/part/000001");
  absl::StatusOr<std::unique_ptr<EtcdStateStore>> store =
      EtcdStateStore::Open(client_.get(), &election_, &clock_, EtcdStateStoreOptions{kPrefix});
  EXPECT_EQ(store.status().code(), absl::StatusCode::kInternal) << store.status();
}

}  // namespace
}  // namespace shardcoord
