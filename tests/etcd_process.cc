#include "tests/etcd_process.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdlib>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"

namespace shardcoord {

absl::StatusOr<int> PickFreePort() {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return absl::InternalError("socket() failed");
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = 0;
  socklen_t len = sizeof(addr);
  if (bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 ||
      getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
    close(fd);
    return absl::InternalError("cannot bind a free port on 127.0.0.1");
  }
  const int port = ntohs(addr.sin_port);
  close(fd);
  return port;
}

absl::StatusOr<std::string> EtcdProcess::FindBinary() {
  std::vector<std::string> dirs;
  if (const char* path = std::getenv("PATH"); path != nullptr) {
    dirs = absl::StrSplit(path, ':', absl::SkipEmpty());
  }
  dirs.push_back("/usr/bin");
  for (const std::string& d : dirs) {
    const std::string candidate = absl::StrCat(d, "/etcd");
    if (access(candidate.c_str(), X_OK) == 0) return candidate;
  }
  return absl::NotFoundError(
      "no etcd binary on PATH or in /usr/bin (Debian package etcd-server; tools/setup.sh "
      "installs it)");
}

absl::StatusOr<std::unique_ptr<EtcdProcess>> EtcdProcess::Start(std::string data_dir,
                                                                std::string log_path,
                                                                absl::Duration timeout) {
  absl::StatusOr<std::string> binary = FindBinary();
  if (!binary.ok()) return binary.status();
  std::unique_ptr<EtcdProcess> etcd(new EtcdProcess());
  etcd->binary_ = *binary;
  etcd->data_dir_ = std::move(data_dir);
  etcd->log_path_ = std::move(log_path);
  absl::StatusOr<int> client = PickFreePort();
  if (!client.ok()) return client.status();
  absl::StatusOr<int> peer = PickFreePort();
  if (!peer.ok()) return peer.status();
  etcd->client_port_ = *client;
  etcd->peer_port_ = *peer;
  etcd->endpoint_ = absl::StrCat("127.0.0.1:", *client);
  if (absl::Status s = etcd->Launch(timeout); !s.ok()) return s;
  return etcd;
}

absl::Status EtcdProcess::Launch(absl::Duration timeout) {
  const std::string client_url = absl::StrCat("http://", endpoint_);
  const std::string peer_url = absl::StrCat("http://127.0.0.1:", peer_port_);
  std::vector<std::string> argv = {
      binary_,
      absl::StrCat("--data-dir=", data_dir_),
      "--name=default",
      absl::StrCat("--listen-client-urls=", client_url),
      absl::StrCat("--advertise-client-urls=", client_url),
      absl::StrCat("--listen-peer-urls=", peer_url),
      absl::StrCat("--initial-advertise-peer-urls=", peer_url),
      absl::StrCat("--initial-cluster=default=", peer_url),
      // Its log on stdout (and in the log file), so that readiness is a line to wait for,
      // not a poll.
      "--logger=zap",
      log_path_.empty() ? "--log-outputs=stdout" : absl::StrCat("--log-outputs=stdout,", log_path_),
  };
  ProcessOptions po;
  po.name = starts_ == 0 ? "etcd" : absl::StrCat("etcd.", starts_);
  po.echo_stdout = false;
  po.stderr_path = "/dev/null";
  ++starts_;
  absl::StatusOr<std::unique_ptr<Process>> p = Process::Start(argv, po);
  if (!p.ok()) return p.status();
  process_ = *std::move(p);
  absl::StatusOr<std::string> ready = process_->WaitForLine("serving client traffic", timeout);
  if (!ready.ok()) return ready.status();
  return absl::OkStatus();
}

absl::Status EtcdProcess::Kill() {
  if (process_ == nullptr) return absl::FailedPreconditionError("etcd is not running");
  absl::Status s = process_->Kill();
  process_.reset();
  return s;
}

absl::Status EtcdProcess::Restart(absl::Duration timeout) {
  if (process_ != nullptr) return absl::FailedPreconditionError("etcd is still running");
  return Launch(timeout);
}

}  // namespace shardcoord
