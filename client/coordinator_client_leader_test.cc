// CoordinatorClient with several coordinators ("A,B"): it follows the leader a standby names
// in its UNAVAILABLE (trailing metadata shardcoord-leader), rotates past coordinators that do
// not answer, and keeps one request_id across them. The standby is the coordinator's own
// StandbyService; the leader a small scripted service; both on loopback ports.

#include <algorithm>
#include <memory>
#include <string>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "client/coordinator_client.h"
#include "coordinator/rpc/standby_service.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"

namespace shardcoord {
namespace {

class Leader final : public v1::Coordinator::Service {
 public:
  grpc::Status ListWorkers(grpc::ServerContext*, const v1::ListWorkersRequest*,
                           v1::ListWorkersResponse* response) override {
    response->add_workers()->set_name("w0");
    return grpc::Status::OK;
  }
  grpc::Status DeleteMesh(grpc::ServerContext*, const v1::DeleteMeshRequest* request,
                          v1::DeleteMeshResponse*) override {
    absl::MutexLock lock(&mu_);
    ids_.push_back(request->request_id());
    return grpc::Status::OK;
  }
  grpc::Status Download(grpc::ServerContext*, const v1::DownloadRequest*,
                        grpc::ServerWriter<v1::TensorData>* writer) override {
    v1::TensorData m;
    m.mutable_header()->set_name("t");
    m.mutable_header()->set_total_bytes(1);
    m.set_data("x");
    writer->Write(m);
    return grpc::Status::OK;
  }
  std::vector<std::string> ids() {
    absl::MutexLock lock(&mu_);
    return ids_;
  }

 private:
  absl::Mutex mu_;
  std::vector<std::string> ids_ ABSL_GUARDED_BY(mu_);
};

class LeaderFollowingTest : public ::testing::Test {
 protected:
  void SetUp() override {
    grpc::ServerBuilder builder;
    int port = 0;
    builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
    builder.RegisterService(&leader_);
    leader_server_ = builder.BuildAndStart();
    ASSERT_NE(leader_server_, nullptr);
    leader_address_ = "127.0.0.1:" + std::to_string(port);
    absl::StatusOr<std::unique_ptr<StandbyServer>> standby = StandbyServer::Start(
        "127.0.0.1:0", grpc::InsecureServerCredentials(), "",
        [this] {
          absl::MutexLock lock(&mu_);
          return hint_;
        },
        "etcd://test");
    ASSERT_TRUE(standby.ok()) << standby.status();
    standby_ = *std::move(standby);
    SetHint(leader_address_);
  }
  void TearDown() override {
    if (leader_server_ != nullptr) leader_server_->Shutdown();
  }
  void SetHint(const std::string& h) {
    absl::MutexLock lock(&mu_);
    hint_ = h;
  }
  static CoordinatorClientOptions Quick() {
    CoordinatorClientOptions o;
    o.retry_for = absl::Seconds(30);
    o.retry_backoff = absl::Milliseconds(10);
    return o;
  }

  Leader leader_;
  std::unique_ptr<grpc::Server> leader_server_;
  std::string leader_address_;
  std::unique_ptr<StandbyServer> standby_;
  absl::Mutex mu_;
  std::string hint_ ABSL_GUARDED_BY(mu_);
};

TEST_F(LeaderFollowingTest, FollowsTheStandbysHintWithOneRequestId) {
  CoordinatorClient client(standby_->address() + "," + leader_address_, Quick());
  EXPECT_EQ(client.current_address(), standby_->address());
  ASSERT_TRUE(client.DeleteMesh("m").ok());
  EXPECT_EQ(client.current_address(), leader_address_);
  ASSERT_EQ(leader_.ids().size(), 1u);
  EXPECT_FALSE(leader_.ids()[0].empty());
  absl::StatusOr<std::vector<v1::WorkerInfo>> workers = client.ListWorkers();
  ASSERT_TRUE(workers.ok()) << workers.status();
  EXPECT_EQ(client.current_address(), leader_address_);
}

TEST_F(LeaderFollowingTest, ALeaderOutsideTheListIsFollowedToo) {
  CoordinatorClient client(standby_->address(), Quick());
  ASSERT_TRUE(client.ListWorkers().ok());
  EXPECT_EQ(client.current_address(), leader_address_);
}

TEST_F(LeaderFollowingTest, ACoordinatorThatDoesNotAnswerIsPassedBy) {
  // A port nobody serves: connection refused, no hint; the next address is tried.
  grpc::ServerBuilder b;
  int dead_port = 0;
  b.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &dead_port);
  std::unique_ptr<grpc::Server> gone = b.BuildAndStart();
  gone->Shutdown();
  const std::string dead = "127.0.0.1:" + std::to_string(dead_port);
  CoordinatorClient client(dead + "," + leader_address_, Quick());
  ASSERT_TRUE(client.ListWorkers().ok());
  EXPECT_EQ(client.current_address(), leader_address_);
}

TEST_F(LeaderFollowingTest, AStreamRefusedByAStandbyFollowsTheLeaderAtOnce) {
  CoordinatorClient client(standby_->address() + "," + leader_address_, Quick());
  std::string data;
  absl::StatusOr<v1::TensorHeader> h = client.Download("t", &data);
  ASSERT_TRUE(h.ok()) << h.status();
  EXPECT_EQ(data, "x");
  EXPECT_EQ(client.current_address(), leader_address_);
}

TEST_F(LeaderFollowingTest, WithoutRetriesAStreamRefusedByAStandbyMovesTheNextCall) {
  CoordinatorClientOptions o = Quick();
  o.retry_for = absl::ZeroDuration();
  CoordinatorClient client(standby_->address() + "," + leader_address_, o);
  std::string data;
  absl::StatusOr<v1::TensorHeader> h = client.Download("t", &data);
  EXPECT_EQ(h.status().code(), absl::StatusCode::kUnavailable) << h.status();
  EXPECT_EQ(client.current_address(), leader_address_);
  h = client.Download("t", &data);
  ASSERT_TRUE(h.ok()) << h.status();
  EXPECT_EQ(data, "x");
}

TEST_F(LeaderFollowingTest, WithoutALeaderTheRetryLoopEndsUnavailable) {
  SetHint("");
  CoordinatorClientOptions o = Quick();
  o.retry_for = absl::Milliseconds(200);
  CoordinatorClient client(standby_->address(), o);
  absl::StatusOr<std::vector<v1::WorkerInfo>> workers = client.ListWorkers();
  EXPECT_EQ(workers.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_NE(workers.status().message().find("no leader serves"), std::string::npos)
      << workers.status();
}

// ---- Streams that fail over --------------------------------------------------------------

// A coordinator whose streams follow a script: Download sends `data` of `version` in slices
// and, with fail_after >= 0, ends with `fail_code` once that many bytes are out; Upload takes
// the data and, with fail_after >= 0, ends with `fail_code` once it took that many, or with
// `replay` answers a stored outcome after the header; WatchPlan sends `progress` and ends
// with `fail_code` when it is not OK.
class StreamServer final : public v1::Coordinator::Service {
 public:
  struct Script {
    std::string data;
    int64_t version = 7;
    size_t slice = 5;
    int64_t fail_after = -1;
    grpc::StatusCode fail_code = grpc::StatusCode::UNAVAILABLE;
    bool fail_once = false;  // Uploads: only the first one fails.
    bool replay = false;
    std::vector<v1::PlanProgress> progress;
  };
  struct UploadSeen {
    std::string request_id;
    std::string data;
  };

  void Set(Script script) {
    absl::MutexLock lock(&mu_);
    script_ = std::move(script);
  }
  int calls() {
    absl::MutexLock lock(&mu_);
    return calls_;
  }
  std::vector<UploadSeen> uploads() {
    absl::MutexLock lock(&mu_);
    return uploads_;
  }

  grpc::Status Download(grpc::ServerContext*, const v1::DownloadRequest* request,
                        grpc::ServerWriter<v1::TensorData>* writer) override {
    const Script script = Begin();
    v1::TensorData m;
    v1::TensorHeader* h = m.mutable_header();
    h->set_name(request->name());
    h->add_shape(static_cast<int64_t>(script.data.size()));
    h->set_dtype(v1::U8);
    h->set_total_bytes(static_cast<int64_t>(script.data.size()));
    h->set_version(script.version);
    if (!writer->Write(m)) return grpc::Status::CANCELLED;
    m.clear_header();
    for (size_t at = 0; at < script.data.size(); at += script.slice) {
      if (script.fail_after >= 0 && at >= static_cast<size_t>(script.fail_after)) break;
      m.set_data(script.data.substr(at, script.slice));
      if (!writer->Write(m)) return grpc::Status::CANCELLED;
    }
    if (script.fail_after >= 0) return grpc::Status(script.fail_code, "scripted failure");
    return grpc::Status::OK;
  }

  grpc::Status Upload(grpc::ServerContext*, grpc::ServerReader<v1::TensorData>* reader,
                      v1::UploadResponse* response) override {
    const Script script = Begin();
    UploadSeen seen;
    v1::TensorData m;
    if (!reader->Read(&m) || !m.has_header()) {
      return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "no header");
    }
    seen.request_id = m.header().request_id();
    const int64_t total = m.header().total_bytes();
    grpc::Status status = grpc::Status::OK;
    if (script.replay) {
      response->set_replayed(true);
    } else {
      while (reader->Read(&m)) {
        seen.data += m.data();
        if (script.fail_after >= 0 && static_cast<int64_t>(seen.data.size()) >= script.fail_after) {
          status = grpc::Status(script.fail_code, "scripted failure");
          if (script.fail_once) {
            absl::MutexLock lock(&mu_);
            script_.fail_after = -1;
          }
          break;
        }
      }
    }
    response->mutable_tensor()->set_name("t");
    response->mutable_tensor()->set_bytes(total);
    response->mutable_tensor()->set_version(script.version);
    absl::MutexLock lock(&mu_);
    uploads_.push_back(std::move(seen));
    return status;
  }

  grpc::Status WatchPlan(grpc::ServerContext*, const v1::WatchPlanRequest*,
                         grpc::ServerWriter<v1::PlanProgress>* writer) override {
    const Script script = Begin();
    for (const v1::PlanProgress& p : script.progress) writer->Write(p);
    if (script.fail_after >= 0) return grpc::Status(script.fail_code, "scripted failure");
    return grpc::Status::OK;
  }

 private:
  Script Begin() {
    absl::MutexLock lock(&mu_);
    ++calls_;
    return script_;
  }

  absl::Mutex mu_;
  Script script_ ABSL_GUARDED_BY(mu_);
  int calls_ ABSL_GUARDED_BY(mu_) = 0;
  std::vector<UploadSeen> uploads_ ABSL_GUARDED_BY(mu_);
};

// Bytes 0, 1, ... 250, 0, ... : every offset distinguishable within 251.
std::string Pattern(size_t n) {
  std::string s(n, '\0');
  for (size_t i = 0; i < n; ++i) s[i] = static_cast<char>(i % 251);
  return s;
}

v1::PlanProgress Progress(v1::PlanState state, int64_t done) {
  v1::PlanProgress p;
  p.set_plan_id("p1");
  p.set_state(state);
  p.set_bytes_done(done);
  p.set_bytes_total(100);
  return p;
}

class StreamFailoverTest : public ::testing::Test {
 protected:
  void SetUp() override {
    for (int i = 0; i < 2; ++i) {
      grpc::ServerBuilder builder;
      int port = 0;
      builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
      builder.RegisterService(&services_[i]);
      servers_[i] = builder.BuildAndStart();
      ASSERT_NE(servers_[i], nullptr);
      addresses_[i] = "127.0.0.1:" + std::to_string(port);
    }
  }
  void TearDown() override {
    for (auto& s : servers_) {
      if (s != nullptr) s->Shutdown();
    }
  }
  static CoordinatorClientOptions Quick() {
    CoordinatorClientOptions o;
    o.retry_for = absl::Seconds(30);
    o.retry_backoff = absl::Milliseconds(10);
    o.upload_chunk_bytes = 7;
    return o;
  }
  std::string Both() const { return addresses_[0] + "," + addresses_[1]; }

  StreamServer services_[2];
  std::unique_ptr<grpc::Server> servers_[2];
  std::string addresses_[2];
};

TEST_F(StreamFailoverTest, ADownloadBrokenMidwayResumesOnTheNextWithoutDuplicatedBytes) {
  const std::string data = Pattern(1000);
  // A breaks after 333 bytes in slices of 37; B sends slices of 50, so the resumed stream's
  // first new byte lies inside a slice.
  services_[0].Set({.data = data, .slice = 37, .fail_after = 333});
  services_[1].Set({.data = data, .slice = 50});
  CoordinatorClient client(Both(), Quick());
  std::string got;
  int headers = 0;
  std::vector<int64_t> done;
  absl::StatusOr<v1::TensorHeader> h = client.DownloadTo(
      "t",
      [&](const v1::TensorHeader& header) {
        ++headers;
        EXPECT_EQ(header.version(), 7);
        return absl::OkStatus();
      },
      [&](absl::string_view piece) {
        got.append(piece.data(), piece.size());
        return absl::OkStatus();
      },
      [&](int64_t d, int64_t) { done.push_back(d); });
  ASSERT_TRUE(h.ok()) << h.status();
  EXPECT_EQ(got.size(), data.size());
  EXPECT_EQ(got, data);
  EXPECT_EQ(headers, 1);
  EXPECT_TRUE(std::is_sorted(done.begin(), done.end()));
  EXPECT_EQ(std::adjacent_find(done.begin(), done.end()), done.end()) << "a repeated offset";
  EXPECT_EQ(services_[0].calls(), 1);
  EXPECT_EQ(services_[1].calls(), 1);
  EXPECT_EQ(client.current_address(), addresses_[1]);
}

TEST_F(StreamFailoverTest, ADownloadDoesNotResumeOnAnotherVersion) {
  const std::string data = Pattern(500);
  services_[0].Set({.data = data, .version = 7, .slice = 40, .fail_after = 120});
  services_[1].Set({.data = Pattern(501).substr(1), .version = 8, .slice = 40});
  CoordinatorClient client(Both(), Quick());
  std::string got;
  absl::StatusOr<v1::TensorHeader> h = client.Download("t", &got);
  EXPECT_EQ(h.status().code(), absl::StatusCode::kAborted) << h.status();
  EXPECT_NE(h.status().message().find("from version 7 to 8"), std::string::npos) << h.status();
  // Only the first version's bytes were handed over, nothing of the second.
  EXPECT_EQ(got, data.substr(0, 120));
}

TEST_F(StreamFailoverTest, ADownloadThatFailsOtherwiseAfterDataMovedIsNotRetried) {
  for (grpc::StatusCode code :
       {grpc::StatusCode::CANCELLED, grpc::StatusCode::INTERNAL, grpc::StatusCode::ABORTED}) {
    services_[0].Set({.data = Pattern(300), .slice = 30, .fail_after = 90, .fail_code = code});
    services_[1].Set({.data = Pattern(300)});
    const int before = services_[1].calls();
    CoordinatorClient client(Both(), Quick());
    std::string got;
    absl::StatusOr<v1::TensorHeader> h = client.Download("t", &got);
    EXPECT_EQ(static_cast<int>(h.status().code()), static_cast<int>(code)) << h.status();
    EXPECT_EQ(services_[1].calls(), before) << "retried after " << h.status();
  }
}

TEST_F(StreamFailoverTest, AResumedDownloadIsBoundedByRetryFor) {
  services_[0].Set({.data = Pattern(300), .slice = 30, .fail_after = 60});
  services_[1].Set({.data = Pattern(300), .slice = 30, .fail_after = 60});
  CoordinatorClientOptions o = Quick();
  o.retry_for = absl::Milliseconds(300);
  CoordinatorClient client(Both(), o);
  std::string got;
  absl::StatusOr<v1::TensorHeader> h = client.Download("t", &got);
  // Both break at byte 60: no attempt gets further, so the window ends.
  EXPECT_EQ(h.status().code(), absl::StatusCode::kUnavailable) << h.status();
  EXPECT_NE(h.status().message().find("attempts in"), std::string::npos) << h.status();
  EXPECT_EQ(got, Pattern(60));
}

TEST_F(StreamFailoverTest, AnUploadBrokenMidwayIsSentAgainWholeWithTheSameRequestId) {
  const std::string data = Pattern(200);
  services_[0].Set({.fail_after = 50});
  services_[1].Set({});
  CoordinatorClient client(Both(), Quick());
  v1::TensorHeader header;
  header.set_name("t");
  header.set_total_bytes(static_cast<int64_t>(data.size()));
  int opened = 0;
  absl::StatusOr<v1::TensorInfo> info =
      client.UploadFrom(header, [&]() -> absl::StatusOr<CoordinatorClient::ReadFn> {
        ++opened;
        auto offset = std::make_shared<size_t>(0);
        return CoordinatorClient::ReadFn([&data, offset](size_t max, std::string* piece) {
          *piece = data.substr(*offset, max);
          *offset += piece->size();
          return absl::OkStatus();
        });
      });
  ASSERT_TRUE(info.ok()) << info.status();
  EXPECT_EQ(opened, 2);
  const std::vector<StreamServer::UploadSeen> a = services_[0].uploads();
  const std::vector<StreamServer::UploadSeen> b = services_[1].uploads();
  ASSERT_EQ(a.size(), 1u);
  ASSERT_EQ(b.size(), 1u);
  EXPECT_GE(a[0].data.size(), 50u);
  EXPECT_LT(a[0].data.size(), data.size());
  EXPECT_EQ(b[0].data, data);  // From the first byte, all of it.
  EXPECT_FALSE(a[0].request_id.empty());
  EXPECT_EQ(a[0].request_id, b[0].request_id);
}

TEST_F(StreamFailoverTest, UploadOfABufferIsRestartedToo) {
  const std::string data = Pattern(100);
  services_[0].Set({.fail_after = 14});
  services_[1].Set({});
  CoordinatorClient client(Both(), Quick());
  v1::TensorHeader header;
  header.set_name("t");
  absl::StatusOr<v1::TensorInfo> info = client.Upload(header, data);
  ASSERT_TRUE(info.ok()) << info.status();
  ASSERT_EQ(services_[1].uploads().size(), 1u);
  EXPECT_EQ(services_[1].uploads()[0].data, data);
}

TEST_F(StreamFailoverTest, AReplayedUploadAnswersTheFirstOutcomeWithoutTheData) {
  services_[0].Set({.fail_after = 7});
  services_[1].Set({.version = 42, .replay = true});
  CoordinatorClient client(Both(), Quick());
  v1::TensorHeader header;
  header.set_name("t");
  absl::StatusOr<v1::TensorInfo> info = client.Upload(header, Pattern(5000));
  ASSERT_TRUE(info.ok()) << info.status();
  EXPECT_EQ(info->version(), 42);
}

TEST_F(StreamFailoverTest, AOnePassSourceIsNotReadTwice) {
  services_[0].Set({.fail_after = 7});
  services_[1].Set({});
  CoordinatorClient client(Both(), Quick());
  v1::TensorHeader header;
  header.set_name("t");
  header.set_total_bytes(70);
  size_t offset = 0;
  const std::string data = Pattern(70);
  absl::StatusOr<v1::TensorInfo> info =
      client.UploadFrom(header, [&](size_t max, std::string* piece) {
        *piece = data.substr(offset, max);
        offset += piece->size();
        return absl::OkStatus();
      });
  EXPECT_EQ(info.status().code(), absl::StatusCode::kUnavailable) << info.status();
  EXPECT_NE(info.status().message().find("not retried"), std::string::npos) << info.status();
  EXPECT_EQ(services_[1].calls(), 0);
}

TEST_F(StreamFailoverTest, AnUploadCancelledByTheServerIsRestartedAsAUnaryChangeWouldBe) {
  // A standby handing its port to the new leader cancels the calls it holds; the leader then
  // answers on that same address.
  services_[0].Set({.fail_after = 14, .fail_code = grpc::StatusCode::CANCELLED, .fail_once = true});
  services_[1].Set({});
  CoordinatorClient client(Both(), Quick());
  v1::TensorHeader header;
  header.set_name("t");
  const std::string data = Pattern(100);
  absl::StatusOr<v1::TensorInfo> info = client.Upload(header, data);
  ASSERT_TRUE(info.ok()) << info.status();
  std::vector<std::string> sent;
  for (int i = 0; i < 2; ++i) {
    for (const auto& u : services_[i].uploads()) sent.push_back(u.data);
  }
  ASSERT_EQ(sent.size(), 2u);  // The cancelled attempt, then all of it again.
  EXPECT_LT(sent[0].size(), data.size());
  EXPECT_EQ(sent[1], data);
}

TEST_F(StreamFailoverTest, AnUploadRefusedOtherwiseIsNotRetried) {
  services_[0].Set({.fail_after = 7, .fail_code = grpc::StatusCode::INVALID_ARGUMENT});
  services_[1].Set({});
  CoordinatorClient client(Both(), Quick());
  v1::TensorHeader header;
  header.set_name("t");
  absl::StatusOr<v1::TensorInfo> info = client.Upload(header, Pattern(70));
  EXPECT_EQ(info.status().code(), absl::StatusCode::kInvalidArgument) << info.status();
  EXPECT_EQ(services_[1].calls(), 0);
}

TEST_F(StreamFailoverTest, AWatchBrokenMidwayIsOpenedAgainAtTheNext) {
  services_[0].Set(
      {.fail_after = 0, .progress = {Progress(v1::PREPARED, 10), Progress(v1::PREPARED, 40)}});
  services_[1].Set({.progress = {Progress(v1::PREPARED, 40), Progress(v1::COMMITTED, 100)}});
  CoordinatorClient client(Both(), Quick());
  std::vector<int64_t> seen;
  absl::StatusOr<v1::PlanProgress> last =
      client.WatchPlan("p1", [&](const v1::PlanProgress& p) { seen.push_back(p.bytes_done()); });
  ASSERT_TRUE(last.ok()) << last.status();
  EXPECT_EQ(last->state(), v1::COMMITTED);
  EXPECT_EQ(seen, (std::vector<int64_t>{10, 40, 40, 100}));
}

TEST_F(StreamFailoverTest, AWatchThatSawTheEndReturnsIt) {
  services_[0].Set({.fail_after = 0, .progress = {Progress(v1::COMMITTED, 100)}});
  CoordinatorClient client(Both(), Quick());
  absl::StatusOr<v1::PlanProgress> last = client.WatchPlan("p1", nullptr);
  ASSERT_TRUE(last.ok()) << last.status();
  EXPECT_EQ(last->state(), v1::COMMITTED);
  EXPECT_EQ(services_[1].calls(), 0);
}

}  // namespace
}  // namespace shardcoord
