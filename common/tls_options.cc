#include "common/tls_options.h"

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <optional>
#include <sstream>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"

namespace shardcoord {
namespace {

// Reads a PEM file given as --`flag`; `marker` is a word its BEGIN line must hold
// ("CERTIFICATE", "PRIVATE KEY").
absl::StatusOr<std::string> ReadPem(absl::string_view flag, const std::string& path,
                                    absl::string_view marker) {
  errno = 0;
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    const int err = errno;
    const std::string what = absl::StrCat("--", flag, ": cannot read ", path, ": ",
                                          err != 0 ? std::strerror(err) : "cannot open");
    if (err == EACCES) return absl::PermissionDeniedError(what);
    return absl::NotFoundError(what);
  }
  std::ostringstream contents;
  contents << in.rdbuf();
  if (in.bad()) return absl::NotFoundError(absl::StrCat("--", flag, ": cannot read ", path));
  std::string pem = contents.str();
  if (!absl::StrContains(pem, "-----BEGIN ") || !absl::StrContains(pem, marker)) {
    return absl::InvalidArgumentError(
        absl::StrCat("--", flag, ": ", path, " is not a PEM file holding a ", marker));
  }
  return pem;
}

// --tls-cert and --tls-key read into `out` (the certificate's error first).
absl::Status ReadCertificate(const TlsFlags& flags, TlsOptions& out) {
  absl::StatusOr<std::string> cert = ReadPem("tls-cert", flags.cert, "CERTIFICATE");
  if (!cert.ok()) return cert.status();
  absl::StatusOr<std::string> key = ReadPem("tls-key", flags.key, "PRIVATE KEY");
  if (!key.ok()) return key.status();
  out.cert_pem = *std::move(cert);
  out.key_pem = *std::move(key);
  return absl::OkStatus();
}

// The host of "HOST:PORT" or "[V6]:PORT" (a bare IPv6 address, with more than one colon and
// no port, is its own host); nullopt for an unclosed '['.
std::optional<absl::string_view> HostOf(absl::string_view address) {
  absl::string_view host = address;
  if (absl::ConsumePrefix(&host, "[")) {
    const size_t close = host.find(']');
    if (close == absl::string_view::npos) return std::nullopt;
    return host.substr(0, close);
  }
  if (const size_t colon = host.rfind(':');
      colon != absl::string_view::npos && host.find(':') == colon) {
    host = host.substr(0, colon);
  }
  return host;
}

// A certificate's names for a message: "a, b", or "none".
std::string NamesOrNone(const std::vector<std::string>& names) {
  return names.empty() ? std::string("none") : absl::StrJoin(names, ", ");
}

}  // namespace

absl::StatusOr<TlsClientAuth> ParseTlsClientAuth(absl::string_view mode) {
  if (mode == "none") return TlsClientAuth::kNone;
  if (mode == "request") return TlsClientAuth::kRequest;
  if (mode == "require") return TlsClientAuth::kRequire;
  return absl::InvalidArgumentError(
      absl::StrCat("--tls-client-auth: '", mode, "' is not none, request or require"));
}

absl::string_view TlsClientAuthName(TlsClientAuth mode) {
  switch (mode) {
    case TlsClientAuth::kNone:
      return "none";
    case TlsClientAuth::kRequest:
      return "request";
    case TlsClientAuth::kRequire:
      return "require";
  }
  return "none";
}

absl::StatusOr<TlsOptions> LoadDaemonTls(const TlsFlags& flags) {
  TlsOptions out;
  absl::StatusOr<TlsClientAuth> mode = ParseTlsClientAuth(flags.client_auth);
  if (!mode.ok()) return mode.status();
  out.client_auth = *mode;
  const int given = !flags.cert.empty() + !flags.key.empty() + !flags.ca.empty();
  if (given == 0) {
    if (out.client_auth != TlsClientAuth::kNone) {
      return absl::InvalidArgumentError(absl::StrCat("--tls-client-auth=", flags.client_auth,
                                                     " needs --tls-cert, --tls-key and --tls-ca"));
    }
    return out;
  }
  if (given != 3) {
    std::vector<std::string> missing;
    if (flags.cert.empty()) missing.push_back("--tls-cert");
    if (flags.key.empty()) missing.push_back("--tls-key");
    if (flags.ca.empty()) missing.push_back("--tls-ca");
    return absl::InvalidArgumentError(
        absl::StrCat("TLS needs --tls-cert, --tls-key and --tls-ca together; missing ",
                     absl::StrJoin(missing, ", ")));
  }
  if (absl::Status s = ReadCertificate(flags, out); !s.ok()) return s;
  absl::StatusOr<std::string> ca = ReadPem("tls-ca", flags.ca, "CERTIFICATE");
  if (!ca.ok()) return ca.status();
  out.ca_pem = *std::move(ca);
  return out;
}

absl::StatusOr<TlsOptions> LoadClientTls(const TlsFlags& flags) {
  TlsOptions out;
  if (flags.cert.empty() != flags.key.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("a client certificate needs --tls-cert and --tls-key together; missing ",
                     flags.cert.empty() ? "--tls-cert" : "--tls-key"));
  }
  if (flags.ca.empty()) {
    if (!flags.cert.empty()) {
      return absl::InvalidArgumentError("--tls-cert and --tls-key need --tls-ca (TLS)");
    }
    return out;
  }
  absl::StatusOr<std::string> ca = ReadPem("tls-ca", flags.ca, "CERTIFICATE");
  if (!ca.ok()) return ca.status();
  out.ca_pem = *std::move(ca);
  if (!flags.cert.empty()) {
    if (absl::Status s = ReadCertificate(flags, out); !s.ok()) return s;
  }
  return out;
}

bool IsLoopbackListenAddress(absl::string_view listen) {
  const std::optional<absl::string_view> found = HostOf(listen);
  if (!found.has_value()) return false;
  const absl::string_view host = *found;
  if (host == "localhost" || host == "::1") return true;
  std::vector<absl::string_view> octets = absl::StrSplit(host, '.');
  if (octets.size() != 4 || octets[0] != "127") return false;
  for (absl::string_view o : octets) {
    int v = 0;
    if (!absl::SimpleAtoi(o, &v) || v < 0 || v > 255) return false;
  }
  return true;
}

absl::Status CheckPlaintextListen(absl::string_view flag, absl::string_view listen, bool tls,
                                  bool insecure) {
  if (tls || insecure || IsLoopbackListenAddress(listen)) return absl::OkStatus();
  return absl::FailedPreconditionError(absl::StrCat(
      "--", flag, "=", listen,
      " is not a loopback address: serve it with TLS (--tls-cert, --tls-key, --tls-ca) or "
      "pass --insecure to serve plaintext anyway"));
}

absl::Status CheckPeerName(absl::string_view name, const std::vector<std::string>& peer_names) {
  for (const std::string& p : peer_names) {
    if (p == name) return absl::OkStatus();
  }
  return absl::PermissionDeniedError(
      absl::StrCat("worker name '", name,
                   "' does not match its TLS certificate (names: ", NamesOrNone(peer_names), ")"));
}

absl::Status CheckCallerIsCoordinator(const std::vector<std::string>& coordinator_hosts,
                                      const std::vector<std::string>& peer_names) {
  for (const std::string& p : peer_names) {
    for (const std::string& h : coordinator_hosts) {
      if (p == h) return absl::OkStatus();
    }
  }
  return absl::PermissionDeniedError(
      absl::StrCat("only the coordinator may call a worker: the caller's TLS certificate (names: ",
                   NamesOrNone(peer_names), ") names none of the worker's --coordinator hosts (",
                   absl::StrJoin(coordinator_hosts, ", "), ")"));
}

std::vector<std::string> CoordinatorHosts(absl::string_view list) {
  std::vector<std::string> hosts;
  for (absl::string_view address : absl::StrSplit(list, ',', absl::SkipWhitespace())) {
    address = absl::StripAsciiWhitespace(address);
    // gRPC target URIs: "dns:///host:port", "dns:host:port", "ipv4:a.b.c.d:port",
    // "ipv6:[::1]:port"; a Unix socket names no host.
    if (absl::StartsWith(address, "unix:") || absl::StartsWith(address, "unix-abstract:")) {
      continue;
    }
    for (absl::string_view scheme : {"dns:", "ipv4:", "ipv6:"}) {
      if (absl::ConsumePrefix(&address, scheme)) {
        if (absl::ConsumePrefix(&address, "//")) {
          address = address.substr(std::min(address.find('/') + 1, address.size()));
        }
        break;
      }
    }
    const std::optional<absl::string_view> host = HostOf(address);
    if (!host.has_value() || host->empty()) continue;
    if (std::find(hosts.begin(), hosts.end(), *host) == hosts.end()) hosts.emplace_back(*host);
  }
  return hosts;
}

}  // namespace shardcoord
