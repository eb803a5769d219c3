// HttpEtcdClient, EtcdStateStore and LeaderElection against a real etcd (Debian's
// etcd-server, started on free ports in TEST_TMPDIR): the JSON gateway's field names and
// encodings, its errors, and endpoints that do not answer. Skips when etcd is not installed.

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdlib>
#include <memory>
#include <string>

#include "absl/strings/str_cat.h"
#include "common/clock.h"
#include "coordinator/store/etcd_state_store.h"
#include "coordinator/store/http_etcd_client.h"
#include "coordinator/store/leader_election.h"
#include "gtest/gtest.h"
#include "tests/etcd_process.h"

namespace shardcoord {
namespace {

class EtcdClientTest : public ::testing::Test {
 protected:
  void SetUp() override {
    absl::StatusOr<std::string> binary = EtcdProcess::FindBinary();
    if (!binary.ok()) GTEST_SKIP() << binary.status().message();
    const std::string dir =
        absl::StrCat(std::getenv("TEST_TMPDIR"), "/etcd-",
                     ::testing::UnitTest::GetInstance()->current_test_info()->name());
    absl::StatusOr<std::unique_ptr<EtcdProcess>> etcd =
        EtcdProcess::Start(dir, absl::StrCat(dir, ".log"));
    ASSERT_TRUE(etcd.ok()) << etcd.status();
    etcd_ = *std::move(etcd);
    client_ = std::make_unique<HttpEtcdClient>(std::vector<std::string>{etcd_->endpoint()});
  }

  std::unique_ptr<EtcdProcess> etcd_;
  std::unique_ptr<HttpEtcdClient> client_;
};

TEST_F(EtcdClientTest, KeysValuesAndRevisionsRoundTrip) {
  // Bytes that JSON could not carry as text: etcd's gateway takes and gives base64.
  const std::string key("/k/\x01\xff\"", 6);
  const std::string value("\0bin\xfe", 5);
  etcdv3::TxnRequest put;
  *put.add_success() = PutOp(key, value);
  absl::StatusOr<etcdv3::TxnResponse> r = client_->Txn(put);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_TRUE(r->succeeded());
  const int64_t revision = r->header().revision();
  EXPECT_GT(revision, 1);

  etcdv3::RangeRequest get;
  get.set_key("/k/");
  get.set_range_end(PrefixRangeEnd("/k/"));
  absl::StatusOr<etcdv3::RangeResponse> got = client_->Range(get);
  ASSERT_TRUE(got.ok()) << got.status();
  ASSERT_EQ(got->kvs_size(), 1);
  EXPECT_EQ(got->kvs(0).key(), key);
  EXPECT_EQ(got->kvs(0).value(), value);
  EXPECT_EQ(got->kvs(0).create_revision(), revision);
  EXPECT_EQ(got->count(), 1);

  // A compare that fails runs the failure branch.
  etcdv3::TxnRequest take;
  *take.add_compare() = CreateRevisionIs(key, 0);
  *take.add_success() = PutOp(key, "other");
  *take.add_failure() = RangeOp(key);
  r = client_->Txn(take);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_FALSE(r->succeeded());
  ASSERT_EQ(r->responses_size(), 1);
  EXPECT_EQ(r->responses(0).response_range().kvs(0).value(), value);
}

TEST_F(EtcdClientTest, LeasesGrantRenewAndRevoke) {
  absl::StatusOr<etcdv3::LeaseGrantResponse> lease = client_->LeaseGrant(5);
  ASSERT_TRUE(lease.ok()) << lease.status();
  EXPECT_NE(lease->id(), 0);
  EXPECT_GE(lease->ttl(), 5);
  etcdv3::TxnRequest put;
  *put.add_success() = PutOp("/leased", "x", lease->id());
  ASSERT_TRUE(client_->Txn(put).ok());
  absl::StatusOr<int64_t> ttl = client_->LeaseKeepAlive(lease->id());
  ASSERT_TRUE(ttl.ok()) << ttl.status();
  EXPECT_GE(*ttl, 5);
  ASSERT_TRUE(client_->LeaseRevoke(lease->id()).ok());
  etcdv3::RangeRequest get;
  get.set_key("/leased");
  EXPECT_EQ(client_->Range(get)->kvs_size(), 0);  // Revoking deleted the key.
  ttl = client_->LeaseKeepAlive(lease->id());
  ASSERT_TRUE(ttl.ok()) << ttl.status();
  EXPECT_EQ(*ttl, 0);
  EXPECT_EQ(client_->LeaseRevoke(lease->id()).code(), absl::StatusCode::kNotFound);
}

TEST_F(EtcdClientTest, EtcdsRefusalsKeepTheirCodeAndMessage) {
  etcdv3::TxnRequest many;
  for (int i = 0; i < 200; ++i) *many.add_success() = PutOp(absl::StrCat("/m/", i), "x");
  absl::StatusOr<etcdv3::TxnResponse> r = client_->Txn(many);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument) << r.status();
  EXPECT_NE(r.status().message().find("too many operations"), std::string::npos) << r.status();
  etcdv3::TxnRequest leased;
  *leased.add_success() = PutOp("/x", "y", 12345);
  EXPECT_EQ(client_->Txn(leased).status().code(), absl::StatusCode::kNotFound);
}

TEST_F(EtcdClientTest, ADeadEndpointIsSkippedAndNoneAnsweringIsUnavailable) {
  absl::StatusOr<int> dead = PickFreePort();
  ASSERT_TRUE(dead.ok());
  const std::string nobody = absl::StrCat("127.0.0.1:", *dead);
  HttpEtcdClient two({nobody, etcd_->endpoint()});
  etcdv3::RangeRequest get;
  get.set_key("/a");
  ASSERT_TRUE(two.Range(get).ok());
  ASSERT_TRUE(etcd_->Kill().ok());
  absl::StatusOr<etcdv3::RangeResponse> r = two.Range(get);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kUnavailable) << r.status();
  EXPECT_NE(r.status().message().find(nobody), std::string::npos) << r.status();
  ASSERT_TRUE(etcd_->Restart().ok());
  EXPECT_TRUE(two.Range(get).ok());  // A kept connection to the old process is replaced.
}

TEST(HttpEtcdClientTest, AnEndpointThatNeverAnswersIsAnUnknownOutcome) {
  // A listener that accepts connections (the kernel does) but never answers: an etcd that is
  // starting, or stopped. The call ends with the request timeout, as an unknown outcome.
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  ASSERT_GE(fd, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(addr);
  ASSERT_EQ(bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
  ASSERT_EQ(listen(fd, 16), 0);
  ASSERT_EQ(getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len), 0);
  HttpEtcdClientOptions o;
  o.request_timeout = absl::Milliseconds(300);
  HttpEtcdClient client({absl::StrCat("127.0.0.1:", ntohs(addr.sin_port))}, o);
  etcdv3::TxnRequest txn;
  *txn.add_success() = PutOp("/k", "v");
  absl::StatusOr<etcdv3::TxnResponse> r = client.Txn(txn);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kUnknown) << r.status();
  EXPECT_EQ(client.LeaseKeepAlive(1).status().code(), absl::StatusCode::kUnknown);
  close(fd);
}

TEST_F(EtcdClientTest, ElectionAndFencedStoreOnRealEtcd) {
  RealClock clock;
  LeaderElectionOptions o;
  o.key = "/c/leader";
  o.value = LeaderValue("a:1", "a");
  o.ttl = absl::Seconds(5);
  LeaderElection a(client_.get(), &clock, o);
  o.value = LeaderValue("b:2", "b");
  LeaderElection b(client_.get(), &clock, o);
  a.Step();
  b.Step();
  ASSERT_EQ(a.state(), LeaderElection::State::kLeading) << a.last_error();
  ASSERT_EQ(b.state(), LeaderElection::State::kCampaigning) << b.last_error();
  EXPECT_EQ(LeaderAddress(b.leader_value()), "a:1");

  EtcdStateStoreOptions so;
  so.prefix = "/c";
  absl::StatusOr<std::unique_ptr<EtcdStateStore>> store =
      EtcdStateStore::Open(client_.get(), &a, &clock, so);
  ASSERT_TRUE(store.ok()) << store.status();
  StateBatch batch;
  for (int i = 0; i < 300; ++i) batch.Put("tensor", absl::StrCat("t", i), std::string(64, 'v'));
  ASSERT_TRUE((*store)->Apply(batch).ok());  // Beyond etcd's 128 operations: the journal.
  absl::StatusOr<std::vector<StateRecord>> all = (*store)->LoadAll();
  ASSERT_TRUE(all.ok()) << all.status();
  EXPECT_EQ(all->size(), 300u);

  // a resigns; b wins at once and a's store is refused by etcd's compare.
  absl::StatusOr<std::unique_ptr<EtcdStateStore>> b_store =
      EtcdStateStore::Open(client_.get(), &b, &clock, so);
  ASSERT_TRUE(b_store.ok()) << b_store.status();
  const int64_t a_lease = a.lease_id();
  ASSERT_TRUE(client_->LeaseRevoke(a_lease).ok());  // As etcd would once the TTL passed.
  b.Step();
  ASSERT_EQ(b.state(), LeaderElection::State::kLeading) << b.last_error();
  ASSERT_TRUE((*b_store)->Put("mesh", "m", "b").ok());
  EXPECT_EQ((*store)->Put("mesh", "m", "a").code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(a.state(), LeaderElection::State::kLost);
}

}  // namespace
}  // namespace shardcoord
