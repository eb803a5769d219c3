#ifndef SHARDCOORD_COORDINATOR_RPC_AUTH_H_
#define SHARDCOORD_COORDINATOR_RPC_AUTH_H_

// Bearer tokens and roles (no gRPC here; coordinator/rpc/grpc_auth.h reads the call's metadata).
//
// The coordinator's --auth-tokens file has one token per line, `ROLE NAME SHA256HEX`: the
// lowercase or uppercase hex SHA-256 of the token, never the token itself. `#` starts a
// comment; blank lines are ignored. Every RPC the coordinator serves is allowed to a fixed set
// of roles (RpcRoleTable); a token authorises a call when its hash matches a line and that
// line's role is allowed the RPC.

#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "common/sha256.h"

namespace shardcoord {

enum class Role {
  kAdmin,     // Every Coordinator RPC, including meshes and deletes.
  kOperator,  // Reads, and creates, redistributes, copies, uploads, gathers tensors.
  kReader,    // Read-only RPCs: lists, gets, downloads, plans, watches.
  kWorker,    // The worker-facing service (CoordinatorWorkers) only.
};

// "admin", "operator", "reader", "worker".
absl::string_view RoleName(Role role);
// INVALID_ARGUMENT for anything but the four names above.
absl::StatusOr<Role> ParseRole(absl::string_view name);

// One RPC and the roles allowed to call it. `method` is gRPC's full method name,
// "/shardcoord.v1.Coordinator/ListWorkers".
struct RpcRule {
  const char* method;
  std::vector<Role> roles;
};

// Every RPC of the services the coordinator serves (Coordinator, CoordinatorWorkers), with
// its roles. The worker daemons' own service (Worker) is not served by the coordinator and
// is not listed.
const std::vector<RpcRule>& RpcRoleTable();

// The token of an `authorization` metadata value "Bearer TOKEN" (the scheme is
// case-insensitive); UNAUTHENTICATED when the value is empty or of another form.
absl::StatusOr<std::string> BearerToken(absl::string_view authorization);

// Who made a call.
struct Caller {
  std::string name;  // The NAME column of the tokens file (never the token).
  Role role;
};

// An immutable set of token hashes; thread-safe.
class Authenticator {
 public:
  // Parses the contents of a tokens file; `file` names it in errors, which are
  // INVALID_ARGUMENT "FILE:LINE: ..." for the first bad line (wrong column count, unknown
  // role, a hash that is not 64 hex digits, a hash or name given twice).
  static absl::StatusOr<Authenticator> Parse(absl::string_view contents, absl::string_view file);
  // Reads and parses `path`; NOT_FOUND when it cannot be read.
  static absl::StatusOr<Authenticator> Load(const std::string& path);

  // Who may call `method` (a full method name) with `token`: UNAUTHENTICATED when the token is
  // empty or matches no line; PERMISSION_DENIED naming the RPC and the role when the role is
  // not allowed it (or the method is unknown). Hashes are compared in constant time, and
  // every line is compared whatever matches.
  absl::StatusOr<Caller> Authorize(absl::string_view method, absl::string_view token) const;

  size_t size() const { return entries_.size(); }

 private:
  struct Entry {
    Role role;
    std::string name;
    Sha256Digest digest;
  };

  explicit Authenticator(std::vector<Entry> entries) : entries_(std::move(entries)) {}

  std::vector<Entry> entries_;
};

}  // namespace shardcoord

#endif  // SHARDCOORD_COORDINATOR_RPC_AUTH_H_
