#include "proto/grpc_credentials.h"

#include <algorithm>

#include "grpc/grpc_security_constants.h"
#include "grpcpp/security/auth_context.h"

namespace shardcoord {

std::shared_ptr<grpc::ServerCredentials> MakeServerCredentials(const TlsOptions& tls) {
  if (!tls.enabled()) return grpc::InsecureServerCredentials();
  grpc::SslServerCredentialsOptions options;
  switch (tls.client_auth) {
    case TlsClientAuth::kNone:
      options.client_certificate_request = GRPC_SSL_DONT_REQUEST_CLIENT_CERTIFICATE;
      break;
    case TlsClientAuth::kRequest:
      options.client_certificate_request = GRPC_SSL_REQUEST_CLIENT_CERTIFICATE_AND_VERIFY;
      break;
    case TlsClientAuth::kRequire:
      options.client_certificate_request =
          GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY;
      break;
  }
  options.pem_root_certs = tls.ca_pem;
  options.pem_key_cert_pairs.push_back({tls.key_pem, tls.cert_pem});
  return grpc::SslServerCredentials(options);
}

std::shared_ptr<grpc::ChannelCredentials> MakeChannelCredentials(const TlsOptions& tls) {
  if (!tls.enabled()) return grpc::InsecureChannelCredentials();
  grpc::SslCredentialsOptions options;
  options.pem_root_certs = tls.ca_pem;
  if (tls.has_certificate()) {
    options.pem_private_key = tls.key_pem;
    options.pem_cert_chain = tls.cert_pem;
  }
  return grpc::SslCredentials(options);
}

void ExpectServerName(const TlsOptions& tls, const std::string& name,
                      grpc::ChannelArguments* args) {
  if (tls.enabled() && !name.empty()) args->SetSslTargetNameOverride(name);
}

std::vector<std::string> PeerCertificateNames(const grpc::ServerContextBase& ctx) {
  std::vector<std::string> names;
  std::shared_ptr<const grpc::AuthContext> auth = ctx.auth_context();
  if (auth == nullptr || !auth->IsPeerAuthenticated()) return names;
  for (const char* property : {GRPC_X509_CN_PROPERTY_NAME, GRPC_X509_SAN_PROPERTY_NAME}) {
    for (const grpc::string_ref& value : auth->FindPropertyValues(property)) {
      std::string name(value.data(), value.size());
      if (std::find(names.begin(), names.end(), name) == names.end()) names.push_back(name);
    }
  }
  return names;
}

}  // namespace shardcoord
