#ifndef SHARDCOORD_COORDINATOR_STORE_HTTP_ETCD_CLIENT_H_
#define SHARDCOORD_COORDINATOR_STORE_HTTP_ETCD_CLIENT_H_

// EtcdClient over etcd's v3 JSON gateway (POST /v3/kv/range, /v3/kv/txn, /v3/lease/grant,
// /v3/lease/keepalive, /v3/lease/revoke on the client URL), with cpp-httplib and protobuf's
// JSON mapping of coordinator/store/etcd_api.proto. Why not gRPC stubs: docs/decisions.md, "HA on
// etcd".

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "coordinator/store/etcd_client.h"
#include "google/protobuf/message.h"

namespace httplib {
class Client;
}  // namespace httplib

namespace shardcoord {

struct HttpEtcdClientOptions {
  absl::Duration connect_timeout = absl::Seconds(1);
  // Reading an answer; a call that takes longer counts as an outcome unknown (UNKNOWN).
  absl::Duration request_timeout = absl::Seconds(5);
};

// Endpoints are tried in turn from the last one that answered: a call moves on only when it
// could not connect (nothing was sent). Errors: UNAVAILABLE when no endpoint could be reached
// (nothing sent); UNKNOWN when a request was sent and no answer came (the connection broke or
// timed out), or etcd answered that it timed out, has no leader or lost it: the request may
// still take effect; otherwise etcd's own code and message. Thread-safe: each call uses a
// connection of its own (kept for reuse).
class HttpEtcdClient : public EtcdClient {
 public:
  explicit HttpEtcdClient(std::vector<std::string> endpoints, HttpEtcdClientOptions options = {});
  ~HttpEtcdClient() override;

  absl::StatusOr<etcdv3::RangeResponse> Range(const etcdv3::RangeRequest& request) override;
  absl::StatusOr<etcdv3::TxnResponse> Txn(const etcdv3::TxnRequest& request) override;
  absl::StatusOr<etcdv3::LeaseGrantResponse> LeaseGrant(int64_t ttl_seconds) override;
  absl::StatusOr<int64_t> LeaseKeepAlive(int64_t lease_id) override;
  absl::Status LeaseRevoke(int64_t lease_id) override;
  std::string Describe() const override;

 private:
  // POSTs `request` as JSON and parses the answer into `response`.
  absl::Status Call(absl::string_view path, const google::protobuf::Message& request,
                    google::protobuf::Message* response);
  std::unique_ptr<httplib::Client> Take(size_t endpoint);
  void Give(size_t endpoint, std::unique_ptr<httplib::Client> client);

  const std::vector<std::string> endpoints_;
  const HttpEtcdClientOptions options_;
  absl::Mutex mu_;
  size_t current_ ABSL_GUARDED_BY(mu_) = 0;
  std::vector<std::vector<std::unique_ptr<httplib::Client>>> idle_ ABSL_GUARDED_BY(mu_);
};

}  // namespace shardcoord

#endif  // SHARDCOORD_COORDINATOR_STORE_HTTP_ETCD_CLIENT_H_
