#include "coordinator/rpc/auth.h"

#include <openssl/crypto.h>

#include <algorithm>
#include <fstream>
#include <sstream>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"

namespace shardcoord {
namespace {

constexpr Role kAll[] = {Role::kAdmin, Role::kOperator, Role::kReader};
constexpr Role kWrite[] = {Role::kAdmin, Role::kOperator};
constexpr Role kAdminOnly[] = {Role::kAdmin};
constexpr Role kWorkerOnly[] = {Role::kWorker};

template <size_t N>
std::vector<Role> Roles(const Role (&roles)[N]) {
  return std::vector<Role>(roles, roles + N);
}

bool IsHex(absl::string_view s) {
  return std::all_of(s.begin(), s.end(), [](char c) { return absl::ascii_isxdigit(c); });
}

}  // namespace

absl::string_view RoleName(Role role) {
  switch (role) {
    case Role::kAdmin:
      return "admin";
    case Role::kOperator:
      return "operator";
    case Role::kReader:
      return "reader";
    case Role::kWorker:
      return "worker";
  }
  return "unknown";
}

absl::StatusOr<Role> ParseRole(absl::string_view name) {
  for (Role r : {Role::kAdmin, Role::kOperator, Role::kReader, Role::kWorker}) {
    if (name == RoleName(r)) return r;
  }
  return absl::InvalidArgumentError(
      absl::StrCat("unknown role '", name, "' (admin, operator, reader, worker)"));
}

const std::vector<RpcRule>& RpcRoleTable() {
  // Reads go to every client role, changes to operators, meshes and deletes to admins.
  static const std::vector<RpcRule>* const table = new std::vector<RpcRule>{
      {"/shardcoord.v1.Coordinator/ListWorkers", Roles(kAll)},
      {"/shardcoord.v1.Coordinator/CreateMesh", Roles(kAdminOnly)},
      {"/shardcoord.v1.Coordinator/GetMesh", Roles(kAll)},
      {"/shardcoord.v1.Coordinator/ListMeshes", Roles(kAll)},
      {"/shardcoord.v1.Coordinator/DeleteMesh", Roles(kAdminOnly)},
      {"/shardcoord.v1.Coordinator/CreateTensor", Roles(kWrite)},
      {"/shardcoord.v1.Coordinator/GetTensor", Roles(kAll)},
      {"/shardcoord.v1.Coordinator/ListTensors", Roles(kAll)},
      {"/shardcoord.v1.Coordinator/DeleteTensor", Roles(kAdminOnly)},
      {"/shardcoord.v1.Coordinator/CreateTensors", Roles(kWrite)},
      {"/shardcoord.v1.Coordinator/DeleteTensors", Roles(kAdminOnly)},
      {"/shardcoord.v1.Coordinator/Redistribute", Roles(kWrite)},
      {"/shardcoord.v1.Coordinator/Gather", Roles(kWrite)},
      {"/shardcoord.v1.Coordinator/Copy", Roles(kWrite)},
      {"/shardcoord.v1.Coordinator/CopyGroup", Roles(kWrite)},
      {"/shardcoord.v1.Coordinator/RedistributeGroup", Roles(kWrite)},
      {"/shardcoord.v1.Coordinator/GatherGroup", Roles(kWrite)},
      {"/shardcoord.v1.Coordinator/PlanRedistribute", Roles(kAll)},
      {"/shardcoord.v1.Coordinator/WatchPlan", Roles(kAll)},
      {"/shardcoord.v1.Coordinator/GetPlanTrace", Roles(kAll)},
      {"/shardcoord.v1.Coordinator/ListPlans", Roles(kAll)},
      {"/shardcoord.v1.Coordinator/Upload", Roles(kWrite)},
      {"/shardcoord.v1.Coordinator/Download", Roles(kAll)},
      // Checkpoints write and read files on every worker's storage: admins only.
      {"/shardcoord.v1.Coordinator/SaveCheckpoint", Roles(kAdminOnly)},
      {"/shardcoord.v1.Coordinator/LoadCheckpoint", Roles(kAdminOnly)},
      {"/shardcoord.v1.Coordinator/InspectCheckpoint", Roles(kAll)},
      {"/shardcoord.v1.Coordinator/GetCheckpointProgress", Roles(kAll)},
      // Prepared transfers: a run rewrites every dst of a model at once; admins prepare, run
      // and delete them.
      {"/shardcoord.v1.Coordinator/CreateTransfer", Roles(kAdminOnly)},
      {"/shardcoord.v1.Coordinator/RunTransfer", Roles(kAdminOnly)},
      {"/shardcoord.v1.Coordinator/GetTransfer", Roles(kAll)},
      {"/shardcoord.v1.Coordinator/ListTransfers", Roles(kAll)},
      {"/shardcoord.v1.Coordinator/DeleteTransfer", Roles(kAdminOnly)},
      {"/shardcoord.v1.CoordinatorWorkers/RegisterWorker", Roles(kWorkerOnly)},
      {"/shardcoord.v1.CoordinatorWorkers/Heartbeat", Roles(kWorkerOnly)},
      {"/shardcoord.v1.CoordinatorWorkers/KvSet", Roles(kWorkerOnly)},
      {"/shardcoord.v1.CoordinatorWorkers/KvGet", Roles(kWorkerOnly)},
      {"/shardcoord.v1.CoordinatorWorkers/Barrier", Roles(kWorkerOnly)},
      {"/shardcoord.v1.CoordinatorWorkers/ReportChunks", Roles(kWorkerOnly)},
      {"/shardcoord.v1.CoordinatorWorkers/AttachBuffer", Roles(kWorkerOnly)},
      {"/shardcoord.v1.CoordinatorWorkers/DetachBuffer", Roles(kWorkerOnly)},
      {"/shardcoord.v1.CoordinatorWorkers/LeaveWorker", Roles(kWorkerOnly)},
  };
  return *table;
}

absl::StatusOr<std::string> BearerToken(absl::string_view authorization) {
  if (authorization.empty()) {
    return absl::UnauthenticatedError("no token: send metadata 'authorization: Bearer TOKEN'");
  }
  constexpr absl::string_view kScheme = "bearer ";
  if (authorization.size() <= kScheme.size() ||
      !absl::StartsWithIgnoreCase(authorization, kScheme)) {
    return absl::UnauthenticatedError("authorization metadata is not 'Bearer TOKEN'");
  }
  absl::string_view token = absl::StripAsciiWhitespace(authorization.substr(kScheme.size()));
  if (token.empty()) return absl::UnauthenticatedError("empty bearer token");
  return std::string(token);
}

absl::StatusOr<Authenticator> Authenticator::Parse(absl::string_view contents,
                                                   absl::string_view file) {
  std::vector<Entry> entries;
  absl::flat_hash_set<std::string> names;
  absl::flat_hash_set<std::string> hashes;
  int line_number = 0;
  for (absl::string_view line : absl::StrSplit(contents, '\n')) {
    ++line_number;
    const size_t hash_mark = line.find('#');
    if (hash_mark != absl::string_view::npos) line = line.substr(0, hash_mark);
    std::vector<absl::string_view> fields =
        absl::StrSplit(line, absl::ByAnyChar(" \t\r"), absl::SkipEmpty());
    if (fields.empty()) continue;
    auto bad = [&](absl::string_view why) {
      return absl::InvalidArgumentError(absl::StrCat(file, ":", line_number, ": ", why));
    };
    if (fields.size() != 3) {
      return bad(absl::StrCat("expected 'ROLE NAME SHA256HEX', got ", fields.size(), " fields"));
    }
    absl::StatusOr<Role> role = ParseRole(fields[0]);
    if (!role.ok()) return bad(role.status().message());
    const std::string hex = absl::AsciiStrToLower(fields[2]);
    if (hex.size() != 64 || !IsHex(hex)) {
      return bad("the third field must be the 64 hex digits of the token's SHA-256");
    }
    if (!names.insert(std::string(fields[1])).second) {
      return bad(absl::StrCat("name '", fields[1], "' given twice"));
    }
    if (!hashes.insert(hex).second) return bad("this token hash is given twice");
    Entry e;
    e.role = *role;
    e.name = std::string(fields[1]);
    const std::string bytes = absl::HexStringToBytes(hex);
    std::copy(bytes.begin(), bytes.end(), e.digest.begin());
    entries.push_back(std::move(e));
  }
  return Authenticator(std::move(entries));
}

absl::StatusOr<Authenticator> Authenticator::Load(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot read tokens file ", path));
  std::ostringstream contents;
  contents << in.rdbuf();
  if (in.bad()) return absl::NotFoundError(absl::StrCat("cannot read tokens file ", path));
  return Parse(contents.str(), path);
}

absl::StatusOr<Caller> Authenticator::Authorize(absl::string_view method,
                                                absl::string_view token) const {
  if (token.empty()) {
    return absl::UnauthenticatedError("no token: send metadata 'authorization: Bearer TOKEN'");
  }
  const Sha256Digest digest = Sha256(token);
  const Entry* match = nullptr;
  for (const Entry& e : entries_) {
    // No early exit: the time taken does not depend on which line (if any) matches.
    const bool equal = CRYPTO_memcmp(e.digest.data(), digest.data(), digest.size()) == 0;
    if (equal) match = &e;
  }
  if (match == nullptr) return absl::UnauthenticatedError("unknown token");

  static const absl::flat_hash_map<std::string, const RpcRule*>* const rules = [] {
    auto* m = new absl::flat_hash_map<std::string, const RpcRule*>;
    for (const RpcRule& r : RpcRoleTable()) (*m)[r.method] = &r;
    return m;
  }();
  auto it = rules->find(method);
  const bool allowed = it != rules->end() &&
                       std::find(it->second->roles.begin(), it->second->roles.end(), match->role) !=
                           it->second->roles.end();
  if (!allowed) {
    return absl::PermissionDeniedError(absl::StrCat("token '", match->name, "' has role ",
                                                    RoleName(match->role), ", which may not call ",
                                                    method));
  }
  return Caller{match->name, match->role};
}

}  // namespace shardcoord
