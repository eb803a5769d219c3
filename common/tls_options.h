#ifndef SHARDCOORD_COMMON_TLS_OPTIONS_H_
#define SHARDCOORD_COMMON_TLS_OPTIONS_H_

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace shardcoord {

// Whether a TLS server asks its callers for a certificate (gRPC's
// SslServerCredentialsOptions::client_certificate_request): kRequest verifies one when it
// comes, kRequire refuses the connection without one signed by the CA.
enum class TlsClientAuth { kNone, kRequest, kRequire };

// "none", "request", "require"; INVALID_ARGUMENT naming --tls-client-auth otherwise.
absl::StatusOr<TlsClientAuth> ParseTlsClientAuth(absl::string_view mode);
absl::string_view TlsClientAuthName(TlsClientAuth mode);

// The TLS flags as given: file paths, empty when not given.
struct TlsFlags {
  std::string cert;                  // --tls-cert: this process's certificate chain (PEM).
  std::string key;                   // --tls-key: its private key (PEM).
  std::string ca;                    // --tls-ca: the CA that signs the peers' certificates (PEM).
  std::string client_auth = "none";  // --tls-client-auth (servers only).
};

// TLS material read from the files of TlsFlags; no gRPC here (proto/grpc_credentials turns it
// into credentials). Empty `ca_pem`: plaintext.
struct TlsOptions {
  std::string cert_pem;
  std::string key_pem;
  std::string ca_pem;
  TlsClientAuth client_auth = TlsClientAuth::kNone;

  bool enabled() const { return !ca_pem.empty(); }
  bool has_certificate() const { return !cert_pem.empty(); }
};

// For a daemon (coordinator, worker), which serves and calls out with the same material:
// either no flag (plaintext), or all of --tls-cert, --tls-key and --tls-ca. --tls-client-auth
// other than none needs TLS. Errors name the flag and the path (INVALID_ARGUMENT for a bad
// combination, NOT_FOUND / PERMISSION_DENIED / INVALID_ARGUMENT for an unreadable, empty or
// non-PEM file).
absl::StatusOr<TlsOptions> LoadDaemonTls(const TlsFlags& flags);

// For a client (shardctl, CoordinatorClient): --tls-ca turns TLS on; --tls-cert and --tls-key
// (a client certificate) come together and need --tls-ca. --tls-client-auth is ignored.
absl::StatusOr<TlsOptions> LoadClientTls(const TlsFlags& flags);

// Whether the host of "host:port" is a loopback address: localhost, 127.0.0.0/8, ::1.
bool IsLoopbackListenAddress(absl::string_view listen);

// Plaintext stays the default only on loopback: serving plaintext on any other address
// needs `insecure` (FAILED_PRECONDITION naming `flag` and --insecure otherwise).
absl::Status CheckPlaintextListen(absl::string_view flag, absl::string_view listen, bool tls,
                                  bool insecure);

// With --tls-client-auth=require, a worker registers only under a name its certificate
// holds (the common name or a subject alternative name): PERMISSION_DENIED naming both the
// name and the certificate's names otherwise.
absl::Status CheckPeerName(absl::string_view name, const std::vector<std::string>& peer_names);

// A worker with --tls-client-auth=require serves only the coordinator: the caller's
// certificate must name (CN or SAN) one of the hosts the worker itself dials as its
// coordinators (CoordinatorHosts of --coordinator), as the worker's own calls there check the
// other way. PERMISSION_DENIED naming the certificate's names and the hosts otherwise.
absl::Status CheckCallerIsCoordinator(const std::vector<std::string>& coordinator_hosts,
                                      const std::vector<std::string>& peer_names);
// The hosts of "HOST:PORT[,HOST:PORT...]" ("[::1]:7400" gives "::1"; gRPC's "dns:///HOST:PORT"
// and "ipv4:" / "ipv6:" forms too; "unix:" addresses name none), without duplicates.
std::vector<std::string> CoordinatorHosts(absl::string_view list);

}  // namespace shardcoord

#endif  // SHARDCOORD_COMMON_TLS_OPTIONS_H_
