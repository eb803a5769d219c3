#include "client/coordinator_client.h"

#include <chrono>
#include <cstdlib>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace shardcoord {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

// A scripted coordinator behind an in-process channel: no sockets, no daemons.
class FakeCoordinator final : public v1::Coordinator::Service {
 public:
  grpc::Status ListWorkers(grpc::ServerContext* context, const v1::ListWorkersRequest*,
                           v1::ListWorkersResponse* response) override {
    RecordDeadline(context);
    for (const char* name : {"w0", "w1"}) {
      v1::WorkerInfo* w = response->add_workers();
      w->set_name(name);
      w->set_rank(response->workers_size() - 1);
    }
    return grpc::Status::OK;
  }

  grpc::Status GetMesh(grpc::ServerContext*, const v1::GetMeshRequest* request,
                       v1::MeshInfo*) override {
    return grpc::Status(grpc::StatusCode::NOT_FOUND,
                        "mesh '" + request->name() + "' does not exist");
  }

  grpc::Status DeleteTensor(grpc::ServerContext*, const v1::DeleteTensorRequest* request,
                            v1::DeleteTensorResponse*) override {
    if (request->name() == "busy") {
      return grpc::Status(grpc::StatusCode::ABORTED, "tensor 'busy' has plan p1 running");
    }
    return grpc::Status::OK;
  }

  // UNAVAILABLE to the first `unavailable_deletes` calls, as a restarting coordinator.
  grpc::Status DeleteMesh(grpc::ServerContext*, const v1::DeleteMeshRequest* request,
                          v1::DeleteMeshResponse*) override {
    absl::MutexLock lock(&mu_);
    delete_mesh_ids_.push_back(request->request_id());
    if (static_cast<int>(delete_mesh_ids_.size()) <= unavailable_deletes_) {
      return grpc::Status(grpc::StatusCode::UNAVAILABLE, "recovering");
    }
    return grpc::Status::OK;
  }
  void set_unavailable_deletes(int n) {
    absl::MutexLock lock(&mu_);
    unavailable_deletes_ = n;
    delete_mesh_ids_.clear();
  }
  std::vector<std::string> delete_mesh_ids() {
    absl::MutexLock lock(&mu_);
    return delete_mesh_ids_;
  }

  grpc::Status CreateTensor(grpc::ServerContext*, const v1::CreateTensorRequest* request,
                            v1::TensorInfo* response) override {
    response->set_name(request->name());
    *response->mutable_shape() = request->shape();
    response->set_dtype(request->dtype());
    response->set_mesh(request->spec().mesh());
    response->set_spec(request->spec().placements_text());
    return grpc::Status::OK;
  }

  grpc::Status Redistribute(grpc::ServerContext* context, const v1::RedistributeRequest* request,
                            v1::RedistributeResponse* response) override {
    RecordDeadline(context);
    response->mutable_progress()->set_plan_id("plan-" + request->tensor());
    response->mutable_progress()->set_state(request->wait() ? v1::COMMITTED : v1::PENDING);
    return grpc::Status::OK;
  }

  grpc::Status Copy(grpc::ServerContext* context, const v1::CopyRequest* request,
                    v1::CopyResponse* response) override {
    RecordDeadline(context);
    response->mutable_progress()->set_plan_id("plan-" + request->dst());
    response->mutable_progress()->set_state(request->wait() ? v1::COMMITTED : v1::PENDING);
    response->set_dst_version(3);
    return grpc::Status::OK;
  }

  grpc::Status WatchPlan(grpc::ServerContext*, const v1::WatchPlanRequest* request,
                         grpc::ServerWriter<v1::PlanProgress>* writer) override {
    if (request->plan_id() == "unknown") {
      return grpc::Status(grpc::StatusCode::NOT_FOUND, "plan 'unknown' does not exist");
    }
    for (int64_t done : {0, 400, 1000}) {
      v1::PlanProgress p;
      p.set_plan_id(request->plan_id());
      p.set_bytes_done(done);
      p.set_bytes_total(1000);
      p.set_state(done == 1000 ? v1::COMMITTED : v1::PENDING);
      writer->Write(p);
    }
    return grpc::Status::OK;
  }

  grpc::Status Upload(grpc::ServerContext* context, grpc::ServerReader<v1::TensorData>* reader,
                      v1::UploadResponse* response) override {
    RecordDeadline(context);
    absl::MutexLock lock(&mu_);
    upload_messages_.clear();
    upload_data_.clear();
    v1::TensorData message;
    while (reader->Read(&message)) {
      upload_messages_.push_back(message);
      upload_data_ += message.data();
      if (upload_messages_.size() == 1 && message.header().name() == "reject") {
        return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                            "upload 'reject': shape [4] of f32 needs 16 bytes, header says 3");
      }
    }
    const v1::TensorHeader& header = upload_messages_.front().header();
    response->mutable_tensor()->set_name(header.name());
    response->mutable_tensor()->set_bytes(static_cast<int64_t>(upload_data_.size()));
    return grpc::Status::OK;
  }

  grpc::Status Download(grpc::ServerContext*, const v1::DownloadRequest* request,
                        grpc::ServerWriter<v1::TensorData>* writer) override {
    const std::string& name = request->name();
    if (name == "missing") {
      return grpc::Status(grpc::StatusCode::NOT_FOUND, "tensor 'missing' does not exist");
    }
    v1::TensorData first;
    first.mutable_header()->set_name(name);
    first.mutable_header()->add_shape(static_cast<int64_t>(download_data_.size()));
    first.mutable_header()->set_dtype(v1::U8);
    int64_t total = static_cast<int64_t>(download_data_.size());
    if (name == "short") total += 10;  // Announces more than it sends.
    if (name == "long") total -= 10;   // Sends more than it announces.
    first.mutable_header()->set_total_bytes(total);
    if (name == "headerless") first.clear_header();
    writer->Write(first);
    for (size_t off = 0; off < download_data_.size(); off += kMaxDataMessageBytes) {
      v1::TensorData m;
      m.set_data(download_data_.substr(off, kMaxDataMessageBytes));
      if (!writer->Write(m)) break;
    }
    return grpc::Status::OK;
  }

  void set_download_data(std::string data) { download_data_ = std::move(data); }

  std::vector<v1::TensorData> upload_messages() {
    absl::MutexLock lock(&mu_);
    return upload_messages_;
  }
  std::string upload_data() {
    absl::MutexLock lock(&mu_);
    return upload_data_;
  }
  // Seconds from the server's clock to the deadline of the last recorded call.
  double last_deadline_seconds() {
    absl::MutexLock lock(&mu_);
    return last_deadline_seconds_;
  }

 private:
  void RecordDeadline(grpc::ServerContext* context) {
    absl::MutexLock lock(&mu_);
    last_deadline_seconds_ =
        absl::ToDoubleSeconds(absl::FromChrono(context->deadline()) - absl::Now());
  }

  absl::Mutex mu_;
  std::vector<v1::TensorData> upload_messages_ ABSL_GUARDED_BY(mu_);
  std::string upload_data_ ABSL_GUARDED_BY(mu_);
  double last_deadline_seconds_ ABSL_GUARDED_BY(mu_) = 0;
  int unavailable_deletes_ ABSL_GUARDED_BY(mu_) = 0;
  std::vector<std::string> delete_mesh_ids_ ABSL_GUARDED_BY(mu_);
  std::string download_data_;  // Set before any call.
};

class CoordinatorClientTest : public ::testing::Test {
 protected:
  void SetUp() override {
    grpc::ServerBuilder builder;
    builder.RegisterService(&service_);
    server_ = builder.BuildAndStart();
    ASSERT_NE(server_, nullptr);
  }
  void TearDown() override { server_->Shutdown(); }

  std::unique_ptr<CoordinatorClient> Client(CoordinatorClientOptions options = {}) {
    grpc::ChannelArguments args;
    args.SetMaxReceiveMessageSize(64 << 20);
    return std::make_unique<CoordinatorClient>(server_->InProcessChannel(args), "in-process",
                                               options);
  }

  FakeCoordinator service_;
  std::unique_ptr<grpc::Server> server_;
};

std::string Pattern(size_t n) {
  std::string s(n, '\0');
  for (size_t i = 0; i < n; ++i) s[i] = static_cast<char>((i * 131) ^ (i >> 9));
  return s;
}

TEST(FromGrpcStatusTest, KeepsCodeAndMessage) {
  EXPECT_TRUE(FromGrpcStatus(grpc::Status::OK).ok());
  const std::vector<std::pair<grpc::StatusCode, absl::StatusCode>> codes = {
      {grpc::StatusCode::CANCELLED, absl::StatusCode::kCancelled},
      {grpc::StatusCode::UNKNOWN, absl::StatusCode::kUnknown},
      {grpc::StatusCode::INVALID_ARGUMENT, absl::StatusCode::kInvalidArgument},
      {grpc::StatusCode::DEADLINE_EXCEEDED, absl::StatusCode::kDeadlineExceeded},
      {grpc::StatusCode::NOT_FOUND, absl::StatusCode::kNotFound},
      {grpc::StatusCode::ALREADY_EXISTS, absl::StatusCode::kAlreadyExists},
      {grpc::StatusCode::PERMISSION_DENIED, absl::StatusCode::kPermissionDenied},
      {grpc::StatusCode::RESOURCE_EXHAUSTED, absl::StatusCode::kResourceExhausted},
      {grpc::StatusCode::FAILED_PRECONDITION, absl::StatusCode::kFailedPrecondition},
      {grpc::StatusCode::ABORTED, absl::StatusCode::kAborted},
      {grpc::StatusCode::OUT_OF_RANGE, absl::StatusCode::kOutOfRange},
      {grpc::StatusCode::UNIMPLEMENTED, absl::StatusCode::kUnimplemented},
      {grpc::StatusCode::INTERNAL, absl::StatusCode::kInternal},
      {grpc::StatusCode::UNAVAILABLE, absl::StatusCode::kUnavailable},
      {grpc::StatusCode::DATA_LOSS, absl::StatusCode::kDataLoss},
      {grpc::StatusCode::UNAUTHENTICATED, absl::StatusCode::kUnauthenticated},
  };
  for (const auto& [g, a] : codes) {
    const absl::Status s = FromGrpcStatus(grpc::Status(g, "the message"));
    EXPECT_EQ(s.code(), a) << static_cast<int>(g);
    EXPECT_EQ(s.message(), "the message");
  }
}

TEST(DefaultCoordinatorAddressTest, EnvironmentThenDefault) {
  ASSERT_EQ(setenv("SHARDCOORD_ADDR", "10.0.0.7:9000", 1), 0);
  EXPECT_EQ(DefaultCoordinatorAddress(), "10.0.0.7:9000");
  ASSERT_EQ(setenv("SHARDCOORD_ADDR", "", 1), 0);
  EXPECT_EQ(DefaultCoordinatorAddress(), "127.0.0.1:7400");
  ASSERT_EQ(unsetenv("SHARDCOORD_ADDR"), 0);
  EXPECT_EQ(DefaultCoordinatorAddress(), "127.0.0.1:7400");
}

TEST_F(CoordinatorClientTest, UnaryCallsCarryTheirDeadline) {
  CoordinatorClientOptions options;
  options.rpc_timeout = absl::Seconds(1000);
  options.data_timeout = absl::Seconds(5000);
  auto client = Client(options);
  absl::StatusOr<std::vector<v1::WorkerInfo>> workers = client->ListWorkers();
  ASSERT_TRUE(workers.ok()) << workers.status();
  ASSERT_EQ(workers->size(), 2u);
  EXPECT_EQ((*workers)[1].name(), "w1");
  EXPECT_EQ((*workers)[1].rank(), 1);
  // Deadlines are absolute: the server sees what is left of them.
  EXPECT_GT(service_.last_deadline_seconds(), 900);
  EXPECT_LE(service_.last_deadline_seconds(), 1001);  // gRPC rounds deadlines up.

  // Redistribute without wait is a metadata call; with wait it gets the data deadline.
  v1::RedistributeRequest request;
  request.set_tensor("t");
  absl::StatusOr<v1::RedistributeResponse> r = client->Redistribute(request);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->progress().plan_id(), "plan-t");
  EXPECT_LE(service_.last_deadline_seconds(), 1001);  // gRPC rounds deadlines up.
  request.set_wait(true);
  r = client->Redistribute(request);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->progress().state(), v1::COMMITTED);
  EXPECT_GT(service_.last_deadline_seconds(), 4900);

  // Copy likewise.
  v1::CopyRequest copy;
  copy.set_src("a");
  copy.set_dst("b");
  absl::StatusOr<v1::CopyResponse> c = client->Copy(copy);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->progress().plan_id(), "plan-b");
  EXPECT_EQ(c->dst_version(), 3);
  EXPECT_LE(service_.last_deadline_seconds(), 1001);
  copy.set_wait(true);
  c = client->Copy(copy);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_GT(service_.last_deadline_seconds(), 4900);
}

TEST_F(CoordinatorClientTest, ServerErrorsKeepCodeAndMessage) {
  auto client = Client();
  absl::StatusOr<v1::MeshInfo> mesh = client->GetMesh("m9");
  EXPECT_EQ(mesh.status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(mesh.status().message(), "mesh 'm9' does not exist");
  absl::Status s = client->DeleteTensor("busy");
  EXPECT_EQ(s.code(), absl::StatusCode::kAborted);
  EXPECT_EQ(s.message(), "tensor 'busy' has plan p1 running");
  EXPECT_TRUE(client->DeleteTensor("idle").ok());
  // Not implemented by the fake: the service's default answer comes through unchanged.
  EXPECT_EQ(client->ListMeshes().status().code(), absl::StatusCode::kUnimplemented);
}

TEST_F(CoordinatorClientTest, ExpiredDeadlineIsDeadlineExceeded) {
  CoordinatorClientOptions options;
  options.rpc_timeout = -absl::Seconds(1);
  options.data_timeout = -absl::Seconds(1);
  auto client = Client(options);
  EXPECT_EQ(client->ListWorkers().status().code(), absl::StatusCode::kDeadlineExceeded);
  std::string data;
  EXPECT_EQ(client->Download("t", &data).status().code(), absl::StatusCode::kDeadlineExceeded);
}

TEST_F(CoordinatorClientTest, CreateTensorSendsTheRequest) {
  auto client = Client();
  v1::CreateTensorRequest request;
  request.set_name("t");
  request.add_shape(64);
  request.add_shape(48);
  request.set_dtype(v1::F32);
  request.mutable_spec()->set_mesh("m");
  request.mutable_spec()->set_placements_text("S(0),R");
  absl::StatusOr<v1::TensorInfo> t = client->CreateTensor(request);
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ(t->name(), "t");
  EXPECT_THAT(t->shape(), ElementsAre(64, 48));
  EXPECT_EQ(t->mesh(), "m");
  EXPECT_EQ(t->spec(), "S(0),R");
}

TEST_F(CoordinatorClientTest, WatchPlanReportsEveryMessage) {
  auto client = Client();
  std::vector<int64_t> seen;
  absl::StatusOr<v1::PlanProgress> last =
      client->WatchPlan("p7", [&](const v1::PlanProgress& p) { seen.push_back(p.bytes_done()); });
  ASSERT_TRUE(last.ok()) << last.status();
  EXPECT_THAT(seen, ElementsAre(0, 400, 1000));
  EXPECT_EQ(last->state(), v1::COMMITTED);
  EXPECT_EQ(last->plan_id(), "p7");
  last = client->WatchPlan("unknown", nullptr);
  EXPECT_EQ(last.status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(last.status().message(), "plan 'unknown' does not exist");
}

TEST_F(CoordinatorClientTest, UploadStreamsHeaderThenMessagesOfAtMostOneMiB) {
  auto client = Client();
  const std::string data = Pattern(2 * kMaxDataMessageBytes + 12345);
  v1::TensorHeader header;
  header.set_name("t");
  header.add_shape(static_cast<int64_t>(data.size()));
  header.set_dtype(v1::U8);
  std::vector<std::pair<int64_t, int64_t>> progress;
  absl::StatusOr<v1::TensorInfo> info = client->Upload(
      header, data, [&](int64_t done, int64_t total) { progress.emplace_back(done, total); });
  ASSERT_TRUE(info.ok()) << info.status();
  EXPECT_EQ(info->name(), "t");
  EXPECT_EQ(info->bytes(), static_cast<int64_t>(data.size()));

  const std::vector<v1::TensorData> messages = service_.upload_messages();
  ASSERT_EQ(messages.size(), 4u);
  EXPECT_TRUE(messages[0].has_header());
  EXPECT_EQ(messages[0].header().total_bytes(), static_cast<int64_t>(data.size()));
  EXPECT_TRUE(messages[0].data().empty());
  for (size_t i = 1; i < messages.size(); ++i) {
    EXPECT_FALSE(messages[i].has_header());
    EXPECT_LE(messages[i].data().size(), kMaxDataMessageBytes);
  }
  EXPECT_EQ(service_.upload_data(), data);
  const int64_t total = static_cast<int64_t>(data.size());
  EXPECT_THAT(progress,
              ElementsAre(std::make_pair(int64_t{1} << 20, total),
                          std::make_pair(int64_t{2} << 20, total), std::make_pair(total, total)));
}

TEST_F(CoordinatorClientTest, UploadChunkSizeIsConfigurableAndClamped) {
  CoordinatorClientOptions options;
  options.upload_chunk_bytes = 1000;
  v1::TensorHeader header;
  header.set_name("t");
  ASSERT_TRUE(Client(options)->Upload(header, Pattern(2500)).ok());
  std::vector<v1::TensorData> messages = service_.upload_messages();
  ASSERT_EQ(messages.size(), 4u);
  EXPECT_EQ(messages[3].data().size(), 500u);

  options.upload_chunk_bytes = 8 << 20;  // Above the protocol limit.
  ASSERT_TRUE(Client(options)->Upload(header, Pattern(kMaxDataMessageBytes + 1)).ok());
  messages = service_.upload_messages();
  ASSERT_EQ(messages.size(), 3u);
  EXPECT_EQ(messages[1].data().size(), kMaxDataMessageBytes);
}

TEST_F(CoordinatorClientTest, UploadRejectedByTheServer) {
  auto client = Client();
  v1::TensorHeader header;
  header.set_name("reject");
  absl::StatusOr<v1::TensorInfo> info = client->Upload(header, Pattern(3 * kMaxDataMessageBytes));
  EXPECT_EQ(info.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(info.status().message(),
            "upload 'reject': shape [4] of f32 needs 16 bytes, header says 3");
}

TEST_F(CoordinatorClientTest, DownloadAssemblesTheStream) {
  const std::string expected = Pattern(kMaxDataMessageBytes * 5 / 2);
  service_.set_download_data(expected);
  auto client = Client();
  std::string data = "stale";
  std::vector<int64_t> done;
  absl::StatusOr<v1::TensorHeader> header =
      client->Download("t", &data, [&](int64_t d, int64_t total) {
        EXPECT_EQ(total, static_cast<int64_t>(expected.size()));
        done.push_back(d);
      });
  ASSERT_TRUE(header.ok()) << header.status();
  EXPECT_EQ(header->name(), "t");
  EXPECT_EQ(header->dtype(), v1::U8);
  EXPECT_EQ(data, expected);
  EXPECT_THAT(
      done, ElementsAre(int64_t{1} << 20, int64_t{2} << 20, static_cast<int64_t>(expected.size())));
}

TEST_F(CoordinatorClientTest, DownloadChecksTheStream) {
  service_.set_download_data(Pattern(5000));
  auto client = Client();
  std::string data;
  absl::StatusOr<v1::TensorHeader> h = client->Download("missing", &data);
  EXPECT_EQ(h.status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(h.status().message(), "tensor 'missing' does not exist");
  h = client->Download("short", &data);
  EXPECT_EQ(h.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(h.status().message(), HasSubstr("got 5000 of 5010 bytes"));
  h = client->Download("long", &data);
  EXPECT_EQ(h.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(h.status().message(), HasSubstr("more than the 4990 bytes announced"));
  h = client->Download("headerless", &data);
  EXPECT_EQ(h.status().code(), absl::StatusCode::kInternal);
  EXPECT_THAT(h.status().message(), HasSubstr("the first message carries no header"));
}

// UNAVAILABLE is retried with one request_id for every attempt; a new call gets a new id; a
// caller's own id is kept; retry_for bounds the retries.
TEST_F(CoordinatorClientTest, RetriesUnavailableWithOneRequestId) {
  CoordinatorClientOptions options;
  options.retry_backoff = absl::Milliseconds(1);
  std::unique_ptr<CoordinatorClient> client = Client(options);
  service_.set_unavailable_deletes(2);
  ASSERT_TRUE(client->DeleteMesh("M").ok());
  std::vector<std::string> ids = service_.delete_mesh_ids();
  ASSERT_EQ(ids.size(), 3u);
  EXPECT_EQ(ids[0].size(), 32u);
  EXPECT_EQ(ids[1], ids[0]);
  EXPECT_EQ(ids[2], ids[0]);
  service_.set_unavailable_deletes(0);
  ASSERT_TRUE(client->DeleteMesh("M").ok());
  ASSERT_EQ(service_.delete_mesh_ids().size(), 1u);
  EXPECT_NE(service_.delete_mesh_ids()[0], ids[0]);

  options.retry_for = absl::ZeroDuration();
  service_.set_unavailable_deletes(1);
  absl::Status once = Client(options)->DeleteMesh("M");
  EXPECT_EQ(once.code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(once.message(), "recovering");
  EXPECT_EQ(service_.delete_mesh_ids().size(), 1u);
}

TEST(CoordinatorClientAddressTest, NothingListeningIsUnavailable) {
  // Port 1 on loopback: connection refused, so gRPC fails the call instead of waiting.
  CoordinatorClientOptions options;
  options.rpc_timeout = absl::Seconds(20);
  options.retry_for = absl::ZeroDuration();
  CoordinatorClient client("127.0.0.1:1", options);
  EXPECT_EQ(client.address(), "127.0.0.1:1");
  EXPECT_EQ(client.ListWorkers().status().code(), absl::StatusCode::kUnavailable);
}

}  // namespace
}  // namespace shardcoord
