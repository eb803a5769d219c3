#include "worker/rpc/local_socket_server.h"

#include <grp.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <utility>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "proto/local_frame.h"
#include "proto/shardcoord.pb.h"

namespace shardcoord {
namespace {

// Descriptors one sendmsg may carry (the kernel's SCM_MAX_FD): an attach_many with more
// sends its frame in pieces (shardcoord.proto, LocalAttachManyRequest).
constexpr int kMaxFdsPerMessage = kMaxLocalFdsPerSend;

std::string Errno(const char* what, const std::string& path) {
  return absl::StrCat(what, " ", path, ": ", std::strerror(errno));
}

// Creates `dir` and its missing parents (mode 0755).
absl::Status MakeDirs(const std::string& dir) {
  if (dir.empty() || dir == "/") return absl::OkStatus();
  struct stat st;
  if (stat(dir.c_str(), &st) == 0) {
    if (S_ISDIR(st.st_mode)) return absl::OkStatus();
    return absl::FailedPreconditionError(absl::StrCat(dir, " exists and is not a directory"));
  }
  const size_t slash = dir.rfind('/');
  if (slash != std::string::npos && slash > 0) {
    if (absl::Status s = MakeDirs(dir.substr(0, slash)); !s.ok()) return s;
  }
  if (mkdir(dir.c_str(), 0755) != 0 && errno != EEXIST) {
    return absl::UnavailableError(Errno("cannot create directory", dir));
  }
  return absl::OkStatus();
}

bool SendResponse(int fd, const absl::Status& status, v1::LocalResponse response) {
  response.set_code(static_cast<int32_t>(status.code()));
  response.set_message(std::string(status.message()));
  return SendLocalFrame(fd, response.SerializeAsString()).ok();
}

std::vector<gid_t> PeerGroups(int fd) {
  std::vector<gid_t> groups(64);
  socklen_t len = static_cast<socklen_t>(groups.size() * sizeof(gid_t));
  if (getsockopt(fd, SOL_SOCKET, SO_PEERGROUPS, groups.data(), &len) != 0) {
    if (errno != ERANGE) return {};
    groups.resize(len / sizeof(gid_t));
    if (getsockopt(fd, SOL_SOCKET, SO_PEERGROUPS, groups.data(), &len) != 0) return {};
  }
  groups.resize(len / sizeof(gid_t));
  return groups;
}

}  // namespace

absl::Status CheckLocalPeer(const PeerCredentials& peer, uid_t worker_uid,
                            std::optional<gid_t> group, const std::vector<gid_t>& peer_groups) {
  if (peer.uid == static_cast<int64_t>(worker_uid)) return absl::OkStatus();
  if (group.has_value() &&
      (peer.gid == static_cast<int64_t>(*group) ||
       std::find(peer_groups.begin(), peer_groups.end(), *group) != peer_groups.end())) {
    return absl::OkStatus();
  }
  return absl::PermissionDeniedError(absl::StrCat(
      "process ", peer.pid, " of uid ", peer.uid,
      " may not attach buffers to this worker: only "
      "uid ",
      worker_uid,
      group.has_value() ? absl::StrCat(" and members of group ", *group, " (--local-group)")
                        : std::string(" (start the worker with --local-group to admit a group)")));
}

absl::StatusOr<gid_t> ResolveGroup(const std::string& group) {
  gid_t gid = 0;
  if (absl::SimpleAtoi(group, &gid)) return gid;
  struct group entry;
  struct group* found = nullptr;
  std::vector<char> buffer(16384);
  if (getgrnam_r(group.c_str(), &entry, buffer.data(), buffer.size(), &found) != 0 ||
      found == nullptr) {
    return absl::NotFoundError(absl::StrCat("--local-group: no group named '", group, "'"));
  }
  return found->gr_gid;
}

absl::StatusOr<std::unique_ptr<LocalSocketServer>> LocalSocketServer::Start(
    const LocalSocketOptions& options, AttachRegistry* registry,
    std::function<void(absl::string_view)> log) {
  const std::string& path = options.path;
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  if (path.empty() || path.size() >= sizeof(addr.sun_path)) {
    return absl::InvalidArgumentError(absl::StrCat("--local-socket: '", path, "' is ", path.size(),
                                                   " bytes; a Unix socket path has 1 to ",
                                                   sizeof(addr.sun_path) - 1));
  }
  std::memcpy(addr.sun_path, path.data(), path.size());
  std::optional<gid_t> group;
  if (!options.group.empty()) {
    absl::StatusOr<gid_t> gid = ResolveGroup(options.group);
    if (!gid.ok()) return absl::InvalidArgumentError(gid.status().message());
    group = *gid;
  }
  const size_t slash = path.rfind('/');
  if (slash != std::string::npos && slash > 0) {
    if (absl::Status s = MakeDirs(path.substr(0, slash)); !s.ok()) {
      return absl::Status(s.code(), absl::StrCat("--local-socket: ", s.message()));
    }
  }
  const int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return absl::UnavailableError(Errno("cannot create a socket for", path));
  auto fail = [fd](absl::Status s) {
    close(fd);
    return s;
  };
  struct stat st;
  if (lstat(path.c_str(), &st) == 0) {
    if (!S_ISSOCK(st.st_mode)) {
      return fail(absl::FailedPreconditionError(
          absl::StrCat("--local-socket: ", path, " exists and is not a socket")));
    }
    // A socket someone accepts on is another worker's; one nobody accepts on is stale.
    const int probe = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    const bool live =
        probe >= 0 && connect(probe, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0;
    if (probe >= 0) close(probe);
    if (live) {
      return fail(absl::FailedPreconditionError(absl::StrCat(
          "--local-socket: another process serves ", path, " (another worker of this name?)")));
    }
    unlink(path.c_str());
  }
  if (bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    return fail(absl::UnavailableError(Errno("--local-socket: cannot bind", path)));
  }
  // Peers are checked at accept (SO_PEERCRED); the file mode keeps others from connecting.
  if (chmod(path.c_str(), group ? 0660 : 0600) != 0 ||
      (group && chown(path.c_str(), static_cast<uid_t>(-1), *group) != 0)) {
    unlink(path.c_str());
    return fail(absl::UnavailableError(Errno("--local-socket: cannot set the mode of", path)));
  }
  if (listen(fd, 64) != 0) {
    unlink(path.c_str());
    return fail(absl::UnavailableError(Errno("--local-socket: cannot listen on", path)));
  }
  const int wake = eventfd(0, EFD_CLOEXEC);
  if (wake < 0) {
    unlink(path.c_str());
    return fail(absl::UnavailableError(Errno("--local-socket: no eventfd for", path)));
  }
  std::unique_ptr<LocalSocketServer> server(
      new LocalSocketServer(path, fd, wake, group, registry, std::move(log)));
  server->acceptor_ = std::thread([s = server.get()] { s->AcceptLoop(); });
  return server;
}

LocalSocketServer::LocalSocketServer(std::string path, int listen_fd, int wake_fd,
                                     std::optional<gid_t> group, AttachRegistry* registry,
                                     std::function<void(absl::string_view)> log)
    : path_(std::move(path)),
      listen_fd_(listen_fd),
      wake_fd_(wake_fd),
      group_(group),
      registry_(registry),
      log_(std::move(log)) {}

LocalSocketServer::~LocalSocketServer() { Stop(); }

void LocalSocketServer::AcceptLoop() {
  while (true) {
    pollfd fds[2] = {{listen_fd_, POLLIN, 0}, {wake_fd_, POLLIN, 0}};
    if (poll(fds, 2, -1) < 0) {
      if (errno == EINTR) continue;
      return;
    }
    if (fds[1].revents != 0) return;
    if (fds[0].revents == 0) continue;
    const int conn = accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC);
    if (conn < 0) continue;
    ucred cred{};
    socklen_t len = sizeof(cred);
    PeerCredentials peer;
    if (getsockopt(conn, SOL_SOCKET, SO_PEERCRED, &cred, &len) == 0) {
      peer.pid = cred.pid;
      peer.uid = cred.uid;
      peer.gid = cred.gid;
    }
    if (absl::Status s = CheckLocalPeer(peer, geteuid(), group_, PeerGroups(conn)); !s.ok()) {
      if (log_) log_(absl::StrCat("local socket: refused: ", s.message()));
      SendResponse(conn, s, v1::LocalResponse());
      close(conn);
      continue;
    }
    {
      absl::MutexLock lock(&mu_);
      if (stopped_) {
        close(conn);
        return;
      }
      connections_.insert(conn);
      ++serving_;
    }
    std::thread([this, conn, peer] { Serve(conn, peer); }).detach();
  }
}

void LocalSocketServer::Serve(int fd, PeerCredentials peer) {
  const int64_t session = registry_->OpenSession(peer);
  LocalFrameReader reader;
  std::vector<int> fds;   // Descriptors received for the request being read.
  bool fds_lost = false;  // Some were dropped (MSG_CTRUNC): too many, or no descriptor free.
  std::vector<char> buf(64 << 10);
  while (true) {
    alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int) * kMaxFdsPerMessage)];
    iovec iov{buf.data(), buf.size()};
    msghdr msg{};
    msg.msg_iov = &iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control;
    msg.msg_controllen = sizeof(control);
    const ssize_t n = recvmsg(fd, &msg, MSG_CMSG_CLOEXEC);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    if (msg.msg_flags & MSG_CTRUNC) fds_lost = true;
    for (cmsghdr* c = CMSG_FIRSTHDR(&msg); c != nullptr; c = CMSG_NXTHDR(&msg, c)) {
      if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS) continue;
      const size_t count = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
      for (size_t i = 0; i < count; ++i) {
        int received;
        std::memcpy(&received, CMSG_DATA(c) + i * sizeof(int), sizeof(int));
        fds.push_back(received);
      }
    }
    reader.Append(absl::string_view(buf.data(), static_cast<size_t>(n)));
    bool open = true;
    while (open) {
      absl::StatusOr<std::optional<std::string>> frame = reader.Next();
      if (!frame.ok()) {
        SendResponse(fd, frame.status(), v1::LocalResponse());
        open = false;
        break;
      }
      if (!frame->has_value()) break;
      // The descriptors came with this request's first bytes (a client waits for each
      // answer before it sends the next request).
      std::vector<int> mine;
      mine.swap(fds);
      const bool lost = std::exchange(fds_lost, false);
      v1::LocalRequest request;
      v1::LocalResponse response;
      absl::Status status;
      if (!request.ParseFromString(**frame)) {
        status = absl::InvalidArgumentError("request: not a shardcoord.v1.LocalRequest");
      } else if (lost) {
        // Which attachment's descriptor is missing cannot be told: refuse the whole request.
        status = absl::ResourceExhaustedError(absl::StrCat(
            "descriptors: the worker could not receive every file descriptor of the request "
            "(more than ",
            kMaxFdsPerMessage, " in one sendmsg, or its open-file limit RLIMIT_NOFILE reached)"));
      } else if (request.has_attach_many()) {
        absl::StatusOr<v1::LocalAttachManyResponse> r =
            registry_->AttachMany(session, request.attach_many(), std::move(mine));
        mine.clear();
        status = r.status();
        if (r.ok()) *response.mutable_attach_many() = *std::move(r);
      } else if (request.has_attach()) {
        const int given = mine.empty() ? -1 : mine.front();
        if (!mine.empty()) mine.erase(mine.begin());
        absl::StatusOr<v1::LocalAttachResponse> r =
            registry_->Attach(session, request.attach(), given);
        status = r.status();
        if (r.ok()) *response.mutable_attach() = *std::move(r);
      } else if (request.has_detach()) {
        status = registry_->Detach(session, request.detach());
      } else {
        status = absl::InvalidArgumentError("request: neither attach, attach_many nor detach");
      }
      for (int extra : mine) close(extra);
      if (!SendResponse(fd, status, std::move(response))) open = false;
    }
    if (!open) break;
  }
  for (int extra : fds) close(extra);
  registry_->CloseSession(
      session, absl::StrCat("process ", peer.pid,
                            " closed its connection to the worker (detached, exited or died)"));
  absl::MutexLock lock(&mu_);
  connections_.erase(fd);
  close(fd);
  --serving_;
}

void LocalSocketServer::Stop() {
  {
    absl::MutexLock lock(&mu_);
    if (stopped_) return;
    stopped_ = true;
  }
  const uint64_t one = 1;
  if (write(wake_fd_, &one, sizeof(one)) < 0) {
    // The acceptor also ends when the listening socket is shut down below.
    shutdown(listen_fd_, SHUT_RDWR);
  }
  if (acceptor_.joinable()) acceptor_.join();
  absl::MutexLock lock(&mu_);
  for (int fd : connections_) shutdown(fd, SHUT_RDWR);
  mu_.Await(absl::Condition(
      +[](int* serving) { return *serving == 0; }, &serving_));
  close(listen_fd_);
  close(wake_fd_);
  unlink(path_.c_str());
}

}  // namespace shardcoord
