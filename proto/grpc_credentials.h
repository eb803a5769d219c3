#ifndef SHARDCOORD_PROTO_GRPC_CREDENTIALS_H_
#define SHARDCOORD_PROTO_GRPC_CREDENTIALS_H_

#include <memory>
#include <string>
#include <vector>

#include "common/tls_options.h"
#include "grpcpp/security/credentials.h"
#include "grpcpp/security/server_credentials.h"
#include "grpcpp/server_context.h"
#include "grpcpp/support/channel_arguments.h"

namespace shardcoord {

// The one place that turns TlsOptions into gRPC credentials; every server and channel of
// the daemons and clients goes through it. Plaintext (insecure credentials) when
// !tls.enabled().
// With --tls-client-auth=require and `only_coordinators` (hosts), every call must come with
// a certificate naming one of them (CheckCallerIsCoordinator), checked before any handler
// runs: a worker serves the coordinator alone.
std::shared_ptr<grpc::ServerCredentials> MakeServerCredentials(
    const TlsOptions& tls, std::vector<std::string> only_coordinators = {});
// Verifies the server against tls.ca_pem and presents tls.cert_pem when there is one.
std::shared_ptr<grpc::ChannelCredentials> MakeChannelCredentials(const TlsOptions& tls);
// With TLS, makes the channel check that the server's certificate is for `name` (its CN or
// a SAN) instead of the host of the address dialled: the coordinator dials a worker by
// address but expects the certificate of the worker it registered.
void ExpectServerName(const TlsOptions& tls, const std::string& name, grpc::ChannelArguments* args);

// The names of the caller's verified certificate: its common name and subject alternative
// names, from the call's auth context; empty without a verified certificate.
std::vector<std::string> PeerCertificateNames(const grpc::ServerContextBase& ctx);

}  // namespace shardcoord

#endif  // SHARDCOORD_PROTO_GRPC_CREDENTIALS_H_
