#include "coordinator/grpc_auth.h"

#include "absl/strings/str_cat.h"
#include "spdlog/spdlog.h"

namespace shardcoord {

std::string FullMethodName(absl::string_view service, absl::string_view rpc) {
  return absl::StrCat("/", service, "/", rpc);
}

absl::Status AuthorizeCall(const Authenticator* auth, grpc::CallbackServerContext* ctx,
                           absl::string_view method) {
  if (auth == nullptr) return absl::OkStatus();
  const auto& metadata = ctx->client_metadata();
  auto it = metadata.find("authorization");
  absl::string_view header;
  if (it != metadata.end()) header = absl::string_view(it->second.data(), it->second.size());
  absl::StatusOr<std::string> token = BearerToken(header);
  absl::StatusOr<Caller> caller =
      token.ok() ? auth->Authorize(method, *token) : absl::StatusOr<Caller>(token.status());
  if (!caller.ok()) {
    // The status names the token's NAME (PERMISSION_DENIED) or none; never the token.
    spdlog::warn("refused {} from {}: {}", std::string(method), ctx->peer(),
                 caller.status().ToString());
    return caller.status();
  }
  spdlog::debug("{} ({}) calls {}", caller->name, std::string(RoleName(caller->role)),
                std::string(method));
  return absl::OkStatus();
}

}  // namespace shardcoord
