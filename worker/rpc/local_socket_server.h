#ifndef SHARDCOORD_WORKER_RPC_LOCAL_SOCKET_SERVER_H_
#define SHARDCOORD_WORKER_RPC_LOCAL_SOCKET_SERVER_H_

#include <sys/types.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "worker/buffers/attach_registry.h"

namespace shardcoord {

struct LocalSocketOptions {
  // Where the socket is created (its directory too, mode 0755, when missing). A stale socket
  // there (nobody accepting) is replaced; a live one is an error.
  std::string path;
  // Besides processes of the worker's own uid, those in this group (a name or a numeric
  // gid) may attach; the socket file then belongs to that group with mode 0660 (else 0600).
  std::string group;
};

// Whether a peer may use the worker's local socket: same uid as the worker, or a member of
// `group` (its primary gid or one of `peer_groups`, from SO_PEERGROUPS). PERMISSION_DENIED
// naming the peer's uid and pid otherwise. Pure.
absl::Status CheckLocalPeer(const PeerCredentials& peer, uid_t worker_uid,
                            std::optional<gid_t> group, const std::vector<gid_t>& peer_groups);

// The numeric gid of `group` (a name or a number). NOT_FOUND for an unknown name.
absl::StatusOr<gid_t> ResolveGroup(const std::string& group);

// Serves the local attach protocol on a Unix domain socket: one thread accepts, one thread
// per connection reads requests (with their SCM_RIGHTS descriptors), checks nothing but
// framing and the peer (CheckLocalPeer, at accept: a refused peer gets one
// PERMISSION_DENIED response and is disconnected), and hands them to the AttachRegistry,
// whose session is the connection: when it closes, the registry detaches what it attached.
class LocalSocketServer {
 public:
  // Binds and listens. INVALID_ARGUMENT a path too long for a socket address or an unknown
  // group; FAILED_PRECONDITION another process serves the path; UNAVAILABLE it cannot be
  // created (the message names the path and why).
  static absl::StatusOr<std::unique_ptr<LocalSocketServer>> Start(
      const LocalSocketOptions& options, AttachRegistry* registry,
      std::function<void(absl::string_view)> log = nullptr);
  ~LocalSocketServer();

  LocalSocketServer(const LocalSocketServer&) = delete;
  LocalSocketServer& operator=(const LocalSocketServer&) = delete;

  // Stops accepting, disconnects every peer (their sessions close) and removes the socket
  // file. Idempotent.
  void Stop();
  const std::string& path() const { return path_; }

 private:
  LocalSocketServer(std::string path, int listen_fd, int wake_fd, std::optional<gid_t> group,
                    AttachRegistry* registry, std::function<void(absl::string_view)> log);
  void AcceptLoop();
  void Serve(int fd, PeerCredentials peer);

  const std::string path_;
  const int listen_fd_;
  const int wake_fd_;  // An eventfd that wakes the accept loop at Stop.
  const std::optional<gid_t> group_;
  AttachRegistry* const registry_;
  const std::function<void(absl::string_view)> log_;
  std::thread acceptor_;

  absl::Mutex mu_;
  std::set<int> connections_ ABSL_GUARDED_BY(mu_);  // Open connection descriptors.
  int serving_ ABSL_GUARDED_BY(mu_) = 0;            // Connection threads running.
  bool stopped_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace shardcoord

#endif  // SHARDCOORD_WORKER_RPC_LOCAL_SOCKET_SERVER_H_
