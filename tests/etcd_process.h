#ifndef SHARDCOORD_TESTS_ETCD_PROCESS_H_
#define SHARDCOORD_TESTS_ETCD_PROCESS_H_

// A real etcd for tests: Debian's etcd-server binary as a single-member cluster on free
// loopback ports, its data in a directory of the test's. Start returns once etcd serves
// clients (its "serving client traffic" log line); Kill and Restart keep the data and the
// ports, so coordinators configured with its address meet it again.

#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "tests/process.h"

namespace shardcoord {

// A free TCP port on 127.0.0.1 (bound, read, closed: free when it returns).
absl::StatusOr<int> PickFreePort();

class EtcdProcess {
 public:
  // The etcd binary on PATH (or /usr/bin/etcd). NOT_FOUND naming the package when there is
  // none: tests skip with that message.
  static absl::StatusOr<std::string> FindBinary();

  // `log_path`: where etcd's log goes (its stderr); empty: discarded.
  static absl::StatusOr<std::unique_ptr<EtcdProcess>> Start(
      std::string data_dir, std::string log_path = "", absl::Duration timeout = absl::Seconds(60));

  // "127.0.0.1:PORT" of its client URL.
  const std::string& endpoint() const { return endpoint_; }
  // "etcd://127.0.0.1:PORT", the coordinator's --state.
  std::string url() const { return "etcd://" + endpoint_; }
  bool running() const { return process_ != nullptr; }

  // SIGKILL, as a crashed host.
  absl::Status Kill();
  // Starts it again on the same ports and data, and waits until it serves.
  absl::Status Restart(absl::Duration timeout = absl::Seconds(60));

 private:
  EtcdProcess() = default;
  absl::Status Launch(absl::Duration timeout);

  std::string binary_;
  std::string data_dir_;
  std::string log_path_;
  int client_port_ = 0;
  int peer_port_ = 0;
  int starts_ = 0;
  std::string endpoint_;
  std::unique_ptr<Process> process_;
};

}  // namespace shardcoord

#endif  // SHARDCOORD_TESTS_ETCD_PROCESS_H_
