#include "proto/grpc_credentials.h"

#include <algorithm>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "grpc/grpc_security_constants.h"
#include "grpcpp/security/auth_context.h"

namespace shardcoord {

namespace {

// The certificate names in `auth` (CN, then SANs), each once.
std::vector<std::string> CertificateNames(const grpc::AuthContext& auth) {
  std::vector<std::string> names;
  if (!auth.IsPeerAuthenticated()) return names;
  for (const char* property : {GRPC_X509_CN_PROPERTY_NAME, GRPC_X509_SAN_PROPERTY_NAME}) {
    for (const grpc::string_ref& value : auth.FindPropertyValues(property)) {
      std::string name(value.data(), value.size());
      if (std::find(names.begin(), names.end(), name) == names.end()) names.push_back(name);
    }
  }
  return names;
}

// Runs for every call on the server's credentials, before the call reaches a service.
class OnlyCoordinators : public grpc::AuthMetadataProcessor {
 public:
  explicit OnlyCoordinators(std::vector<std::string> hosts) : hosts_(std::move(hosts)) {}
  bool IsBlocking() const override { return false; }  // A comparison of a few strings.
  grpc::Status Process(const InputMetadata& /*auth_metadata*/, grpc::AuthContext* context,
                       OutputMetadata* /*consumed*/, OutputMetadata* /*response*/) override {
    absl::Status s = CheckCallerIsCoordinator(hosts_, CertificateNames(*context));
    if (s.ok()) return grpc::Status::OK;
    return grpc::Status(grpc::StatusCode::PERMISSION_DENIED, std::string(s.message()));
  }

 private:
  const std::vector<std::string> hosts_;
};

}  // namespace

std::shared_ptr<grpc::ServerCredentials> MakeServerCredentials(
    const TlsOptions& tls, std::vector<std::string> only_coordinators) {
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
  std::shared_ptr<grpc::ServerCredentials> creds = grpc::SslServerCredentials(options);
  if (tls.client_auth == TlsClientAuth::kRequire && !only_coordinators.empty()) {
    creds->SetAuthMetadataProcessor(
        std::make_shared<OnlyCoordinators>(std::move(only_coordinators)));
  }
  return creds;
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
  std::shared_ptr<const grpc::AuthContext> auth = ctx.auth_context();
  if (auth == nullptr) return {};
  return CertificateNames(*auth);
}

}  // namespace shardcoord
