#include "coordinator/store/http_etcd_client.h"

#include <chrono>
#include <utility>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "google/protobuf/util/json_util.h"
#include "httplib.h"

namespace shardcoord {
namespace {

// At most this many idle connections are kept per endpoint.
constexpr size_t kIdlePerEndpoint = 8;

int64_t Micros(absl::Duration d) { return absl::ToInt64Microseconds(d); }

absl::Status FromGateway(const std::string& endpoint, int http_status, const std::string& body) {
  etcdv3::GatewayError error;
  google::protobuf::util::JsonParseOptions lenient;
  lenient.ignore_unknown_fields = true;
  std::string message = body;
  int code = 2;  // UNKNOWN.
  if (google::protobuf::util::JsonStringToMessage(body, &error, lenient).ok()) {
    message = error.message().empty() ? error.error() : error.message();
    code = error.code();
  }
  const std::string text = absl::StrCat("etcd ", endpoint, " (HTTP ", http_status, "): ", message);
  switch (code) {
    case 2:   // UNKNOWN
    case 4:   // DEADLINE_EXCEEDED: "request timed out"
    case 14:  // UNAVAILABLE: "no leader", "leader changed"
      return absl::UnknownError(text);
    default:
      if (code <= 0 || code > 16) return absl::UnknownError(text);
      return absl::Status(static_cast<absl::StatusCode>(code), text);
  }
}

}  // namespace

HttpEtcdClient::HttpEtcdClient(std::vector<std::string> endpoints, HttpEtcdClientOptions options)
    : endpoints_(std::move(endpoints)), options_(options), idle_(endpoints_.size()) {}

HttpEtcdClient::~HttpEtcdClient() = default;

std::string HttpEtcdClient::Describe() const {
  return absl::StrCat("etcd://", absl::StrJoin(endpoints_, ","));
}

std::unique_ptr<httplib::Client> HttpEtcdClient::Take(size_t endpoint) {
  {
    absl::MutexLock lock(&mu_);
    if (!idle_[endpoint].empty()) {
      std::unique_ptr<httplib::Client> c = std::move(idle_[endpoint].back());
      idle_[endpoint].pop_back();
      return c;
    }
  }
  const std::string& e = endpoints_[endpoint];
  const size_t colon = e.rfind(':');
  int port = 0;
  if (!absl::SimpleAtoi(e.substr(colon + 1), &port)) port = 2379;
  auto c = std::make_unique<httplib::Client>(e.substr(0, colon), port);
  c->set_keep_alive(true);
  c->set_connection_timeout(std::chrono::microseconds(Micros(options_.connect_timeout)));
  c->set_read_timeout(std::chrono::microseconds(Micros(options_.request_timeout)));
  c->set_write_timeout(std::chrono::microseconds(Micros(options_.request_timeout)));
  return c;
}

void HttpEtcdClient::Give(size_t endpoint, std::unique_ptr<httplib::Client> client) {
  absl::MutexLock lock(&mu_);
  if (idle_[endpoint].size() < kIdlePerEndpoint) idle_[endpoint].push_back(std::move(client));
}

absl::Status HttpEtcdClient::Call(absl::string_view path, const google::protobuf::Message& request,
                                  google::protobuf::Message* response) {
  std::string body;
  google::protobuf::util::JsonPrintOptions print;
  print.preserve_proto_field_names = true;
  if (auto s = google::protobuf::util::MessageToJsonString(request, &body, print); !s.ok()) {
    return absl::InternalError(absl::StrCat("etcd request to JSON: ", s.ToString()));
  }
  size_t first;
  {
    absl::MutexLock lock(&mu_);
    first = current_;
  }
  std::vector<std::string> refused;
  for (size_t i = 0; i < endpoints_.size(); ++i) {
    const size_t e = (first + i) % endpoints_.size();
    std::unique_ptr<httplib::Client> client = Take(e);
    httplib::Request req;
    req.method = "POST";
    req.path = std::string(path);
    req.body = body;
    req.set_header("Content-Type", "application/json");
    // The body is collected as it arrives: etcd's gateway ends its error answers with an HTTP
    // trailer (Grpc-Trailer-Content-Type) that cpp-httplib 0.11 reports as a read error after
    // the whole body came.
    std::string answer;
    req.content_receiver = [&answer](const char* data, size_t n, uint64_t, uint64_t) {
      answer.append(data, n);
      return true;
    };
    httplib::Response res;
    httplib::Error error = httplib::Error::Success;
    const bool complete = client->send(req, res, error);
    if (!complete && res.status <= 0) {
      if (error == httplib::Error::Connection) {
        refused.push_back(absl::StrCat(endpoints_[e], ": ", httplib::to_string(error)));
        continue;  // Nothing was sent: the next endpoint may take it.
      }
      return absl::UnknownError(absl::StrCat("etcd ", endpoints_[e], ": ", path, ": ",
                                             httplib::to_string(error), " (outcome unknown)"));
    }
    {
      absl::MutexLock lock(&mu_);
      current_ = e;
    }
    const int status = res.status;
    if (complete) Give(e, std::move(client));  // Otherwise the connection is not reusable.
    if (status != 200) return FromGateway(endpoints_[e], status, answer);
    google::protobuf::util::JsonParseOptions lenient;
    lenient.ignore_unknown_fields = true;
    if (auto s = google::protobuf::util::JsonStringToMessage(answer, response, lenient); !s.ok()) {
      // A broken answer to a request that was received: its outcome is unknown.
      return absl::Status(complete ? absl::StatusCode::kInternal : absl::StatusCode::kUnknown,
                          absl::StrCat("etcd ", endpoints_[e], ": ", path,
                                       ": cannot parse the answer: ", s.ToString()));
    }
    return absl::OkStatus();
  }
  return absl::UnavailableError(absl::StrCat("etcd unreachable: ", absl::StrJoin(refused, "; ")));
}

absl::StatusOr<etcdv3::RangeResponse> HttpEtcdClient::Range(const etcdv3::RangeRequest& request) {
  etcdv3::RangeResponse response;
  if (absl::Status s = Call("/v3/kv/range", request, &response); !s.ok()) return s;
  return response;
}

absl::StatusOr<etcdv3::TxnResponse> HttpEtcdClient::Txn(const etcdv3::TxnRequest& request) {
  etcdv3::TxnResponse response;
  if (absl::Status s = Call("/v3/kv/txn", request, &response); !s.ok()) return s;
  return response;
}

absl::StatusOr<etcdv3::LeaseGrantResponse> HttpEtcdClient::LeaseGrant(int64_t ttl_seconds) {
  etcdv3::LeaseGrantRequest request;
  request.set_ttl(ttl_seconds);
  etcdv3::LeaseGrantResponse response;
  if (absl::Status s = Call("/v3/lease/grant", request, &response); !s.ok()) return s;
  if (!response.error().empty()) {
    return absl::UnknownError(absl::StrCat("etcd lease grant: ", response.error()));
  }
  return response;
}

absl::StatusOr<int64_t> HttpEtcdClient::LeaseKeepAlive(int64_t lease_id) {
  etcdv3::LeaseKeepAliveRequest request;
  request.set_id(lease_id);
  // A stream in gRPC: the gateway sends one message per request, wrapped in "result".
  etcdv3::LeaseKeepAliveResult response;
  if (absl::Status s = Call("/v3/lease/keepalive", request, &response); !s.ok()) return s;
  return response.result().ttl();
}

absl::Status HttpEtcdClient::LeaseRevoke(int64_t lease_id) {
  etcdv3::LeaseRevokeRequest request;
  request.set_id(lease_id);
  etcdv3::LeaseRevokeResponse response;
  return Call("/v3/lease/revoke", request, &response);
}

}  // namespace shardcoord
