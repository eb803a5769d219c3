// The composition root of coordinators on etcd, in process over an etcd in memory: the first
// leads and serves, the second stands by naming it; the leader's answers name the leader too;
// when the leader resigns the standby takes over on its own port with the state the leader
// stored (worker ranks), exactly as a restarted coordinator; a signal while standing by ends
// the wait.

#include "coordinator/store/etcd_coordinator.h"

#include <memory>
#include <string>

#include "common/clock.h"
#include "common/coordinator_addresses.h"
#include "coordinator/testing/call_helpers.h"
#include "coordinator/testing/fake_etcd.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "proto/shardcoord.grpc.pb.h"

namespace shardcoord {
namespace {

CoordinatorOptions Options() {
  CoordinatorOptions o;
  o.listen = "127.0.0.1:0";
  o.http_listen.clear();
  // The endpoints are unused: the test's etcd is in memory (EtcdCoordinatorOptions::etcd).
  o.state = *ParseStateStoreUri("state", "etcd://127.0.0.1:2379", "");
  return o;
}

class EtcdCoordinatorTest : public ::testing::Test {
 protected:
  EtcdCoordinatorTest() : etcd_(&clock_), client_(etcd_.NewClient()) {}

  std::unique_ptr<EtcdCoordinator> Make() {
    EtcdCoordinatorOptions eo;
    eo.prefix = "/t";
    eo.etcd = client_.get();
    eo.on_lost = [](const std::string& why) { ADD_FAILURE() << "lost leadership: " << why; };
    return std::make_unique<EtcdCoordinator>(Options(), eo);
  }

  static grpc::Status ListWorkers(const std::string& address, v1::ListWorkersResponse* resp,
                                  std::string* trailer) {
    auto stub =
        v1::Coordinator::NewStub(grpc::CreateChannel(address, grpc::InsecureChannelCredentials()));
    grpc::ClientContext ctx;
    grpc::Status s = stub->ListWorkers(&ctx, v1::ListWorkersRequest(), resp);
    *trailer = LeaderTrailer(ctx);
    return s;
  }

  RealClock clock_;
  FakeEtcd etcd_;
  std::unique_ptr<EtcdClient> client_;
};

TEST_F(EtcdCoordinatorTest, OneLeadsTheOtherStandsByAndTakesOverOnResign) {
  std::unique_ptr<EtcdCoordinator> a = Make();
  absl::StatusOr<std::string> a_address = a->Start();
  ASSERT_TRUE(a_address.ok()) << a_address.status();
  absl::StatusOr<bool> leading = a->AwaitLeadership();
  ASSERT_TRUE(leading.ok()) << leading.status();
  ASSERT_TRUE(*leading);
  EXPECT_EQ(a->advertise(), *a_address);
  EXPECT_EQ(a->coordinator()->state_description(), "etcd://fake /t");

  // A worker registers with the leader: its rank goes to etcd.
  {
    auto stub = v1::CoordinatorWorkers::NewStub(
        grpc::CreateChannel(*a_address, grpc::InsecureChannelCredentials()));
    grpc::ClientContext ctx;
    v1::RegisterWorkerRequest req;
    req.set_name("w0");
    req.set_address("127.0.0.1:1");
    req.set_backend("gloo");
    v1::RegisterWorkerResponse resp;
    grpc::Status s = stub->RegisterWorker(&ctx, req, &resp);
    ASSERT_TRUE(s.ok()) << s.error_message();
    EXPECT_EQ(resp.rank(), 0);
    EXPECT_EQ(LeaderTrailer(ctx), *a_address);  // The leader names itself.
  }
  EXPECT_TRUE(etcd_.Get("/t/records/worker/w0").has_value());

  std::unique_ptr<EtcdCoordinator> b = Make();
  absl::StatusOr<std::string> b_address = b->Start();
  ASSERT_TRUE(b_address.ok()) << b_address.status();
  v1::ListWorkersResponse resp;
  std::string trailer;
  // The standby answers once its election has read the leader key.
  grpc::Status s;
  do {
    s = ListWorkers(*b_address, &resp, &trailer);
  } while (trailer.empty() && s.error_code() == grpc::StatusCode::UNAVAILABLE);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::UNAVAILABLE);
  EXPECT_EQ(trailer, *a_address);
  EXPECT_NE(s.error_message().find("the leader is " + *a_address), std::string::npos)
      << s.error_message();

  a->Shutdown();  // Resigns: b need not wait for a's lease to expire.
  leading = b->AwaitLeadership();
  ASSERT_TRUE(leading.ok()) << leading.status();
  ASSERT_TRUE(*leading);
  s = ListWorkers(*b_address, &resp, &trailer);
  ASSERT_TRUE(s.ok()) << s.error_message();
  ASSERT_EQ(resp.workers_size(), 1);
  EXPECT_EQ(resp.workers(0).name(), "w0");
  EXPECT_EQ(resp.workers(0).rank(), 0);
  // Recovered as after a restart: dead until it registers again, under the same rank.
  EXPECT_EQ(resp.workers(0).state(), v1::DEAD);
  EXPECT_EQ(trailer, *b_address);
  b->Shutdown();
}

TEST_F(EtcdCoordinatorTest, ASignalWhileStandingByEndsTheWait) {
  std::unique_ptr<EtcdCoordinator> a = Make();
  ASSERT_TRUE(a->Start().ok());
  ASSERT_TRUE(*a->AwaitLeadership());
  std::unique_ptr<EtcdCoordinator> b = Make();
  ASSERT_TRUE(b->Start().ok());
  b->Interrupt();
  absl::StatusOr<bool> leading = b->AwaitLeadership();
  ASSERT_TRUE(leading.ok()) << leading.status();
  EXPECT_FALSE(*leading);
  b->Shutdown();
  EXPECT_EQ(a->election()->state(), LeaderElection::State::kLeading);
}

}  // namespace
}  // namespace shardcoord
