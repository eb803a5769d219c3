// The worker's local socket: framing, SCM_RIGHTS, the peer check, sessions that end with their
// connection, and a second server on a live path refused.
#include "worker/rpc/local_socket_server.h"

#include <fcntl.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "proto/convert.h"
#include "proto/local_frame.h"
#include "worker/buffers/buffer_store.h"
#include "worker/testing/attach_test_util.h"

namespace shardcoord {
namespace {

using attach_testing::FakeAttachRpc;
using attach_testing::Memfd;
using ::testing::HasSubstr;

TEST(LocalFrameTest, SplitsAStreamIntoPayloads) {
  const std::string stream =
      EncodeLocalFrame("hello") + EncodeLocalFrame("") + EncodeLocalFrame(std::string(300, 'x'));
  LocalFrameReader reader;
  std::vector<std::string> got;
  for (char c : stream) {  // One byte at a time: frames complete across reads.
    reader.Append(absl::string_view(&c, 1));
    while (true) {
      absl::StatusOr<std::optional<std::string>> next = reader.Next();
      ASSERT_TRUE(next.ok()) << next.status();
      if (!next->has_value()) break;
      got.push_back(**next);
    }
  }
  EXPECT_EQ(got, (std::vector<std::string>{"hello", "", std::string(300, 'x')}));
  EXPECT_EQ(reader.pending(), 0u);
  LocalFrameReader huge;
  huge.Append(std::string("\xff\xff\xff\x7f", 4));
  EXPECT_EQ(huge.Next().status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(CheckLocalPeerTest, SameUidOrTheGroup) {
  const PeerCredentials peer{42, 1000, 1000};
  EXPECT_TRUE(CheckLocalPeer(peer, 1000, std::nullopt, {}).ok());
  absl::Status other = CheckLocalPeer(peer, 0, std::nullopt, {});
  EXPECT_EQ(other.code(), absl::StatusCode::kPermissionDenied);
  EXPECT_THAT(other.message(), HasSubstr("process 42 of uid 1000"));
  EXPECT_THAT(other.message(), HasSubstr("--local-group"));
  EXPECT_TRUE(CheckLocalPeer(peer, 0, 1000, {}).ok());          // Primary group.
  EXPECT_TRUE(CheckLocalPeer(peer, 0, 27, {4, 27, 100}).ok());  // Supplementary group.
  EXPECT_EQ(CheckLocalPeer(peer, 0, 27, {4, 100}).code(), absl::StatusCode::kPermissionDenied);
  EXPECT_EQ(ResolveGroup("0").value_or(99), 0u);
  EXPECT_EQ(ResolveGroup("no-such-group-here").status().code(), absl::StatusCode::kNotFound);
}

// A connected client of the test's server.
class Client {
 public:
  explicit Client(const std::string& path) : fd_(socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0)) {
    sockaddr_un addr{};
    addr.sun_family = AF_UNIX;
    std::memcpy(addr.sun_path, path.data(), path.size());
    connected_ = connect(fd_, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0;
  }
  ~Client() { Close(); }
  bool connected() const { return connected_; }
  void Close() {
    if (fd_ >= 0) close(fd_);
    fd_ = -1;
  }
  // Sends one frame of `payload`, with `fd` in SCM_RIGHTS when >= 0.
  void Send(const std::string& payload, int fd = -1) {
    ASSERT_TRUE(SendLocalFrame(fd_, payload, fd).ok());
  }
  // The next response; code UNKNOWN when the connection ended first.
  v1::LocalResponse Read() {
    LocalFrameReader reader;
    v1::LocalResponse r;
    absl::StatusOr<std::string> frame = ReceiveLocalFrame(fd_, reader);
    if (!frame.ok()) {
      r.set_code(static_cast<int>(absl::StatusCode::kUnknown));
      return r;
    }
    r.ParseFromString(*frame);
    return r;
  }
  v1::LocalResponse Call(const v1::LocalRequest& request, int fd = -1) {
    Send(request.SerializeAsString(), fd);
    return Read();
  }
  // A request with any number of descriptors (in pieces of kMaxLocalFdsPerSend).
  v1::LocalResponse CallWithFds(const v1::LocalRequest& request, const std::vector<int>& fds) {
    EXPECT_TRUE(SendLocalFrameFds(fd_, request.SerializeAsString(), fds).ok());
    return Read();
  }

 private:
  int fd_;
  bool connected_ = false;
};

v1::LocalRequest AttachRequest(int64_t rank) {
  RankChunks rc;
  rc.rank = rank;
  rc.chunks.push_back(Chunk{Box({0}, {16}), 0, 0});
  rc.local_elements = 16;
  v1::LocalRequest r;
  v1::LocalAttachRequest* a = r.mutable_attach();
  a->set_tensor("T");
  a->set_rank(rank);
  a->set_version(3);
  a->set_dtype(v1::F32);
  *a->mutable_chunks() = RankChunksToProto(rc);
  a->set_bytes(64);
  a->mutable_shared()->set_offset(0);
  return r;
}

class LocalSocketServerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char dir[] = "/tmp/sc-local-XXXXXX";
    ASSERT_NE(mkdtemp(dir), nullptr);
    dir_ = dir;
    path_ = dir_ + "/w0.sock";
    absl::StatusOr<std::unique_ptr<LocalSocketServer>> server =
        LocalSocketServer::Start(LocalSocketOptions{path_, ""}, &registry_);
    ASSERT_TRUE(server.ok()) << server.status();
    server_ = *std::move(server);
  }
  void TearDown() override {
    server_.reset();
    rmdir(dir_.c_str());
  }

  FakeAttachRpc rpc_;
  BufferStore buffers_;
  AttachRegistry registry_{&buffers_, nullptr, &rpc_, [] { return WorkerIdentity{"w0", 1, 0}; }};
  std::string dir_, path_;
  std::unique_ptr<LocalSocketServer> server_;
};

TEST_F(LocalSocketServerTest, AttachesThroughTheSocketAndDetachesWhenItCloses) {
  struct stat st;
  ASSERT_EQ(stat(path_.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0600u);  // Only the worker's uid without --local-group.
  Memfd mem(64);
  Client client(path_);
  ASSERT_TRUE(client.connected());
  v1::LocalResponse r = client.Call(AttachRequest(0), mem.fd);
  ASSERT_EQ(r.code(), 0) << r.message();
  EXPECT_EQ(r.attach().worker(), "w0");
  EXPECT_EQ(r.attach().memory(), "shared");
  std::shared_ptr<HostBuffer> b = buffers_.Find("T", 3);
  ASSERT_NE(b, nullptr);
  mem.floats()[5] = 1.25f;
  float seen;
  std::memcpy(&seen, b->data() + 20, 4);
  EXPECT_EQ(seen, 1.25f);
  b.reset();

  // Errors come back as codes with messages; the connection stays usable.
  v1::LocalRequest wrong_rank = AttachRequest(1);
  r = client.Call(wrong_rank, mem.fd);
  EXPECT_EQ(r.code(), static_cast<int>(absl::StatusCode::kFailedPrecondition));
  EXPECT_THAT(r.message(), HasSubstr("holds rank 0, not rank 1"));
  v1::LocalRequest unknown;
  unknown.mutable_detach()->set_tensor("T");
  unknown.mutable_detach()->set_rank(2);
  r = client.Call(unknown);
  EXPECT_EQ(r.code(), static_cast<int>(absl::StatusCode::kNotFound));
  client.Send("\xff\xff not a message");
  EXPECT_EQ(client.Read().code(), static_cast<int>(absl::StatusCode::kInvalidArgument));

  // The connection's end is the attachment's end.
  client.Close();
  std::vector<v1::DetachBufferRequest> detaches = rpc_.WaitDetaches(1);
  EXPECT_EQ(detaches[0].tensor(), "T");
  EXPECT_THAT(detaches[0].reason(), HasSubstr(absl::StrCat("process ", getpid())));
  EXPECT_EQ(buffers_.Find("T", 3), nullptr);
}

TEST_F(LocalSocketServerTest, ExplicitDetach) {
  Memfd mem(64);
  Client client(path_);
  ASSERT_EQ(client.Call(AttachRequest(0), mem.fd).code(), 0);
  v1::LocalRequest detach;
  detach.mutable_detach()->set_tensor("T");
  detach.mutable_detach()->set_rank(0);
  EXPECT_EQ(client.Call(detach).code(), 0);
  EXPECT_EQ(buffers_.Find("T", 3), nullptr);
  ASSERT_EQ(rpc_.detaches().size(), 1u);
  EXPECT_THAT(rpc_.detaches()[0].reason(), HasSubstr("detached it"));
}

// An attach_many of `n` 16-float shared buffers "T<i>", attachment i in descriptor i, with no
// versions or chunks (the coordinator, faked, answers version 3).
v1::LocalRequest AttachMany(int n) {
  v1::LocalRequest r;
  for (int i = 0; i < n; ++i) {
    v1::LocalAttachRequest* a = r.mutable_attach_many()->add_attachments();
    a->set_tensor(absl::StrCat("T", i));
    a->set_rank(0);
    a->set_dtype(v1::F32);
    a->set_bytes(64);
    a->mutable_shared()->set_fd_index(i);
  }
  return r;
}

// More descriptors than one sendmsg carries arrive in pieces, each with its attachment.
TEST_F(LocalSocketServerTest, AttachManyTakesHundredsOfDescriptorsInOneRequest) {
  constexpr int kBuffers = kMaxLocalFdsPerSend + 47;
  const v1::LocalRequest request = AttachMany(kBuffers);
  v1::LocalRequest one = AttachRequest(0);
  std::vector<std::unique_ptr<Memfd>> mems;
  std::vector<int> fds;
  for (int i = 0; i < kBuffers; ++i) {
    rpc_.Know(absl::StrCat("T", i), 3, one.attach().chunks());
    mems.push_back(std::make_unique<Memfd>(64));
    mems.back()->floats()[7] = static_cast<float>(i);
    fds.push_back(mems.back()->fd);
  }
  Client client(path_);
  v1::LocalResponse r = client.CallWithFds(request, fds);
  ASSERT_EQ(r.code(), 0) << r.message();
  ASSERT_EQ(r.attach_many().attachments_size(), kBuffers);
  for (int i = 0; i < kBuffers; ++i) {
    std::shared_ptr<HostBuffer> b = buffers_.Find(absl::StrCat("T", i), 3);
    ASSERT_NE(b, nullptr) << i;
    float seen;
    std::memcpy(&seen, b->data() + 28, 4);
    EXPECT_EQ(seen, static_cast<float>(i));  // Its own memfd, not a neighbour's.
  }
  EXPECT_EQ(rpc_.bulk_attaches().size(), 2u);  // Layouts asked once, counted once.
  client.Close();
  EXPECT_EQ(rpc_.WaitDetaches(kBuffers).size(), static_cast<size_t>(kBuffers));
  EXPECT_TRUE(buffers_.List().empty());
}

// Descriptors the worker cannot take (its open-file limit) cannot be told apart: the whole
// request is refused, nothing is held, and the connection serves the next one.
TEST_F(LocalSocketServerTest, DescriptorsTheWorkerCannotReceiveRefuseTheRequest) {
  Client client(path_);
  ASSERT_TRUE(client.connected());
  rlimit before;
  ASSERT_EQ(getrlimit(RLIMIT_NOFILE, &before), 0);
  std::vector<std::unique_ptr<Memfd>> mems;
  int highest = 0;
  for (int i = 0; i < 8; ++i) {
    mems.push_back(std::make_unique<Memfd>(64));
    highest = std::max(highest, mems.back()->fd);
  }
  // Room for at most `free` more descriptors below the lowered limit: send more than that.
  const rlim_t limit = static_cast<rlim_t>(highest) + 4;
  int free = 0;
  for (int fd = 0; fd < static_cast<int>(limit); ++fd) free += fcntl(fd, F_GETFD) < 0 ? 1 : 0;
  std::vector<int> fds;
  for (int i = 0; i < free + 8; ++i) fds.push_back(mems[i % mems.size()]->fd);
  for (int i = 0; i < free + 8; ++i)
    rpc_.Know(absl::StrCat("T", i), 3, AttachRequest(0).attach().chunks());
  rlimit lowered = before;
  lowered.rlim_cur = limit;
  ASSERT_EQ(setrlimit(RLIMIT_NOFILE, &lowered), 0);
  v1::LocalResponse r = client.CallWithFds(AttachMany(free + 8), fds);
  ASSERT_EQ(setrlimit(RLIMIT_NOFILE, &before), 0);
  EXPECT_EQ(r.code(), static_cast<int>(absl::StatusCode::kResourceExhausted)) << r.message();
  EXPECT_THAT(r.message(), HasSubstr("RLIMIT_NOFILE"));
  EXPECT_TRUE(buffers_.List().empty());
  EXPECT_TRUE(rpc_.bulk_attaches().empty());
  r = client.CallWithFds(AttachMany(1), {mems[0]->fd});
  EXPECT_EQ(r.code(), 0) << r.message();
}

TEST_F(LocalSocketServerTest, ASecondServerOnALivePathIsRefusedAndAStaleOneReplaced) {
  absl::StatusOr<std::unique_ptr<LocalSocketServer>> second =
      LocalSocketServer::Start(LocalSocketOptions{path_, ""}, &registry_);
  EXPECT_EQ(second.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(second.status().message(), HasSubstr("another process serves"));
  // A socket file nobody accepts on (a worker that was killed) is replaced.
  server_->Stop();
  const int stale = socket(AF_UNIX, SOCK_STREAM, 0);
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::memcpy(addr.sun_path, path_.data(), path_.size());
  ASSERT_EQ(bind(stale, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
  close(stale);
  absl::StatusOr<std::unique_ptr<LocalSocketServer>> again =
      LocalSocketServer::Start(LocalSocketOptions{path_, ""}, &registry_);
  ASSERT_TRUE(again.ok()) << again.status();
  server_ = *std::move(again);
  absl::StatusOr<std::unique_ptr<LocalSocketServer>> too_long = LocalSocketServer::Start(
      LocalSocketOptions{"/tmp/" + std::string(200, 'x') + ".sock", ""}, &registry_);
  EXPECT_EQ(too_long.status().code(), absl::StatusCode::kInvalidArgument);
}

TEST_F(LocalSocketServerTest, AnotherUidIsRefusedAndRegistersNothing) {
  if (geteuid() != 0) GTEST_SKIP() << "needs root to connect as another uid";
  // The file mode would stop the stranger before SO_PEERCRED does: open it up.
  ASSERT_EQ(chmod(dir_.c_str(), 0755), 0);
  ASSERT_EQ(chmod(path_.c_str(), 0666), 0);
  Memfd mem(64);
  const pid_t child = fork();
  if (child == 0) {
    if (setgid(65534) != 0 || setuid(65534) != 0) _exit(2);
    Client client(path_);
    if (!client.connected()) _exit(3);
    const v1::LocalResponse r = client.Call(AttachRequest(0), mem.fd);
    _exit(r.code() == static_cast<int>(absl::StatusCode::kPermissionDenied) &&
                  r.message().find("uid 65534") != std::string::npos
              ? 0
              : 4);
  }
  int status = 0;
  ASSERT_EQ(waitpid(child, &status, 0), child);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << status;
  EXPECT_TRUE(buffers_.List().empty());
  EXPECT_TRUE(rpc_.attaches().empty());
}

}  // namespace
}  // namespace shardcoord
