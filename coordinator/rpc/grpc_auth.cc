#include "coordinator/rpc/grpc_auth.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "spdlog/spdlog.h"

namespace shardcoord {

std::string FullMethodName(absl::string_view service, absl::string_view rpc) {
  return absl::StrCat("/", service, "/", rpc);
}

std::string PeerHost(absl::string_view peer) {
  for (absl::string_view scheme : {"ipv4:", "ipv6:"}) {
    if (absl::ConsumePrefix(&peer, scheme)) {
      const size_t colon = peer.rfind(':');
      if (colon != absl::string_view::npos) peer = peer.substr(0, colon);
      break;
    }
  }
  return std::string(peer);
}

absl::Status AuthorizeCall(const Authenticator* auth, grpc::CallbackServerContext* ctx,
                           absl::string_view method, std::string* caller_name) {
  if (auth == nullptr) {
    if (caller_name != nullptr) *caller_name = PeerHost(ctx->peer());
    return absl::OkStatus();
  }
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
  if (caller_name != nullptr) *caller_name = caller->name;
  return absl::OkStatus();
}

}  // namespace shardcoord
