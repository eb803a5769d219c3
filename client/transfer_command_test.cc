// `shardctl transfer ...` against a scripted coordinator on a loopback port: what each
// subcommand sends, prints and exits with, through the whole command line (ShardctlMain).

#include "client/transfer_command.h"

#include <cstdlib>
#include <fstream>
#include <iostream>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/synchronization/mutex.h"
#include "client/shardctl_app.h"
#include "client/shardctl_test_util.h"
#include "gmock/gmock.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"

namespace shardcoord {
namespace {

using ::testing::HasSubstr;
using ::testing::StartsWith;

class FakeTransfers final : public v1::Coordinator::Service {
 public:
  grpc::Status CreateTransfer(grpc::ServerContext*, const v1::CreateTransferRequest* request,
                              v1::TransferInfo* response) override {
    absl::MutexLock lock(&mu_);
    create_ = *request;
    response->set_name(request->name());
    response->set_members(request->copies_size());
    response->set_prepared(true);
    response->set_participants(8);
    return grpc::Status::OK;
  }

  grpc::Status RunTransfer(grpc::ServerContext*, const v1::RunTransferRequest* request,
                           v1::RunTransferResponse* response) override {
    absl::MutexLock lock(&mu_);
    run_ = *request;
    if (request->name() == "gone") {
      return grpc::Status(grpc::StatusCode::FAILED_PRECONDITION,
                          "copies[3].dst: unknown tensor 'b.3'");
    }
    response->set_name(request->name());
    response->set_run_id("t-7");
    response->set_state(v1::COMMITTED);
    response->set_seconds(0.25);
    response->set_bytes_moved(4096);
    response->set_lower_bound_bytes(2048);
    response->set_members(3);
    response->set_replanned(true);
    response->set_version(42);
    response->set_prepare_seconds(0.5);
    return grpc::Status::OK;
  }

  grpc::Status GetTransfer(grpc::ServerContext*, const v1::GetTransferRequest* request,
                           v1::TransferInfo* response) override {
    absl::MutexLock lock(&mu_);
    get_ = *request;
    if (request->name() != "sync") {
      return grpc::Status(grpc::StatusCode::NOT_FOUND, "unknown transfer 'x'");
    }
    response->set_name("sync");
    response->set_members(1);
    response->set_invalid_reason("tensor 'a' was deleted");
    v1::CopyPair* c = response->add_copies();
    c->set_src("a");
    c->set_dst("b");
    return grpc::Status::OK;
  }

  // 1,500 transfers, in pages of 1,000.
  grpc::Status ListTransfers(grpc::ServerContext*, const v1::ListTransfersRequest* request,
                             v1::ListTransfersResponse* response) override {
    absl::MutexLock lock(&mu_);
    ++list_calls_;
    const int start =
        request->page_token().empty() ? 0 : std::stoi(request->page_token().substr(1)) + 1;
    for (int i = start; i < 1500 && response->transfers_size() < 1000; ++i) {
      response->add_transfers()->set_name(absl::StrFormat("x%04d", i));
    }
    if (start + response->transfers_size() < 1500) {
      response->set_next_page_token(response->transfers(response->transfers_size() - 1).name());
    }
    return grpc::Status::OK;
  }

  grpc::Status DeleteTransfer(grpc::ServerContext*, const v1::DeleteTransferRequest* request,
                              v1::DeleteTransferResponse*) override {
    absl::MutexLock lock(&mu_);
    delete_ = *request;
    return grpc::Status::OK;
  }

  absl::Mutex mu_;
  v1::CreateTransferRequest create_;
  v1::RunTransferRequest run_;
  v1::GetTransferRequest get_;
  v1::DeleteTransferRequest delete_;
  int list_calls_ = 0;
};

class TransferCommandTest : public ::testing::Test {
 protected:
  void SetUp() override {
    server_ = ServeOnLoopback(&fake_, &address_);
    ASSERT_NE(server_, nullptr);
  }
  void TearDown() override { server_->Shutdown(); }

  int Run(std::vector<std::string> args) {
    args.push_back("--coordinator");
    args.push_back(address_);
    return RunShardctlMain(std::move(args), "", &out_, &err_);
  }

  std::string WriteFile(const std::string& name, const std::string& text) {
    const std::string path = absl::StrCat(std::getenv("TEST_TMPDIR"), "/", name);
    std::ofstream(path) << text;
    return path;
  }

  FakeTransfers fake_;
  std::unique_ptr<grpc::Server> server_;
  std::string address_;
  std::ostringstream out_, err_;
};

TEST_F(TransferCommandTest, CreateSendsTheCopiesFileOfTensorCopy) {
  const std::string copies = WriteFile(
      "copies.json", R"({"copies": [{"src": "a", "dst": "b"}, {"src": "c", "dst": "d"}]})");
  ASSERT_EQ(Run({"transfer", "create", "sync", "--from-file", copies}), 0) << err_.str();
  EXPECT_EQ(fake_.create_.name(), "sync");
  ASSERT_EQ(fake_.create_.copies_size(), 2);
  EXPECT_EQ(fake_.create_.copies(1).src(), "c");
  EXPECT_EQ(fake_.create_.copies(1).dst(), "d");
  EXPECT_FALSE(fake_.create_.request_id().empty());  // Retries replay, never create twice.
  EXPECT_THAT(out_.str(), StartsWith("transfer sync: 2 tensors"));

  ASSERT_EQ(Run({"transfer", "create", "sync", "--from-file", copies, "--json"}), 0);
  EXPECT_THAT(out_.str(), StartsWith(R"({"name": "sync", "members": 2, "prepared": true)"));
}

TEST_F(TransferCommandTest, CreateChecksFlagsAndTheFileBeforeCalling) {
  EXPECT_EQ(Run({"transfer", "create", "sync"}), 2);
  EXPECT_THAT(err_.str(), HasSubstr("--from-file"));
  const std::string empty = WriteFile("empty.json", R"({"copies": []})");
  EXPECT_EQ(Run({"transfer", "create", "sync", "--from-file", empty}), 2);
  EXPECT_THAT(err_.str(), HasSubstr("\"copies\": empty"));
  const std::string bad = WriteFile("bad.json", R"({"copies": [{"from": "a"}]})");
  EXPECT_EQ(Run({"transfer", "create", "sync", "--from-file", bad}), 2);
  EXPECT_THAT(err_.str(), StartsWith("shardctl transfer create: --from-file "));
  EXPECT_EQ(fake_.create_.name(), "");  // Nothing was sent.
}

TEST_F(TransferCommandTest, RunWaitsAndPrintsTheIssuesJson) {
  ASSERT_EQ(Run({"transfer", "run", "sync", "--json"}), 0) << err_.str();
  EXPECT_EQ(fake_.run_.name(), "sync");
  EXPECT_TRUE(fake_.run_.wait());
  EXPECT_EQ(out_.str(),
            R"({"name": "sync", "run_id": "t-7", "state": "COMMITTED", "seconds": 0.25, )"
            R"("bytes_moved": 4096, "lower_bound_bytes": 2048, "members": 3, "replanned": true, )"
            R"("version": 42, "prepare_seconds": 0.5})"
            "\n");
  ASSERT_EQ(Run({"transfer", "run", "sync"}), 0);
  EXPECT_THAT(out_.str(), StartsWith("ran transfer sync (run t-7): COMMITTED in 0.250 s"));
  EXPECT_THAT(out_.str(), HasSubstr("prepared again first in 0.500 s"));
  EXPECT_EQ(Run({"transfer", "run", "gone"}), 1);
  EXPECT_EQ(err_.str(), "shardctl: FAILED_PRECONDITION: copies[3].dst: unknown tensor 'b.3'\n");
}

TEST_F(TransferCommandTest, ListPagesShowAndDelete) {
  ASSERT_EQ(Run({"transfer", "list"}), 0) << err_.str();
  EXPECT_EQ(fake_.list_calls_, 2);
  EXPECT_THAT(out_.str(), StartsWith("NAME"));
  EXPECT_THAT(out_.str(), HasSubstr("x1499"));
  ASSERT_EQ(Run({"transfer", "show", "sync"}), 0);
  EXPECT_TRUE(fake_.get_.copies());
  EXPECT_THAT(out_.str(), HasSubstr("not prepared (tensor 'a' was deleted)"));
  EXPECT_THAT(out_.str(), HasSubstr("  a -> b\n"));
  EXPECT_EQ(Run({"transfer", "show", "x"}), 1);
  EXPECT_EQ(err_.str(), "shardctl: NOT_FOUND: unknown transfer 'x'\n");
  ASSERT_EQ(Run({"transfer", "delete", "sync", "--json"}), 0);
  EXPECT_EQ(fake_.delete_.name(), "sync");
  EXPECT_EQ(out_.str(), "{\"deleted\": \"sync\"}\n");
  EXPECT_EQ(Run({"transfer"}), 2);  // A subcommand is required.
}

}  // namespace
}  // namespace shardcoord
