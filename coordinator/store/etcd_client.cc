#include "coordinator/store/etcd_client.h"

#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"

namespace shardcoord {

std::string PrefixRangeEnd(absl::string_view prefix) {
  std::string end(prefix);
  while (!end.empty()) {
    unsigned char last = static_cast<unsigned char>(end.back());
    if (last < 0xff) {
      end.back() = static_cast<char>(last + 1);
      return end;
    }
    end.pop_back();
  }
  return std::string(1, '\0');  // Every key.
}

absl::StatusOr<std::vector<std::string>> ParseEtcdUrl(absl::string_view flag,
                                                      absl::string_view url) {
  constexpr absl::string_view kScheme = "etcd://";
  auto bad = [&](absl::string_view why) {
    return absl::InvalidArgumentError(absl::StrCat("--", flag, ": '", url, "' ", why,
                                                   " (expected etcd://HOST:PORT[,HOST:PORT...])"));
  };
  if (!absl::StartsWith(url, kScheme)) return bad("does not start with etcd://");
  std::vector<std::string> endpoints;
  for (absl::string_view e : absl::StrSplit(url.substr(kScheme.size()), ',')) {
    e = absl::StripAsciiWhitespace(e);
    const size_t colon = e.rfind(':');
    int port = 0;
    if (colon == absl::string_view::npos || colon == 0 ||
        !absl::SimpleAtoi(e.substr(colon + 1), &port) || port <= 0 || port > 65535) {
      return bad(absl::StrCat("has an endpoint '", e, "' that is not HOST:PORT"));
    }
    if (e.find('/') != absl::string_view::npos) {
      return bad(absl::StrCat("has an endpoint '", e, "' with a path"));
    }
    endpoints.emplace_back(e);
  }
  return endpoints;
}

etcdv3::RequestOp PutOp(std::string key, std::string value, int64_t lease) {
  etcdv3::RequestOp op;
  etcdv3::PutRequest* put = op.mutable_request_put();
  put->set_key(std::move(key));
  put->set_value(std::move(value));
  put->set_lease(lease);
  return op;
}

etcdv3::RequestOp DeleteOp(std::string key) {
  etcdv3::RequestOp op;
  op.mutable_request_delete_range()->set_key(std::move(key));
  return op;
}

etcdv3::RequestOp DeleteRangeOp(std::string key, std::string range_end) {
  etcdv3::RequestOp op;
  op.mutable_request_delete_range()->set_key(std::move(key));
  op.mutable_request_delete_range()->set_range_end(std::move(range_end));
  return op;
}

etcdv3::RequestOp RangeOp(std::string key) {
  etcdv3::RequestOp op;
  op.mutable_request_range()->set_key(std::move(key));
  return op;
}

namespace {

// `key`'s CREATE or MOD revision equals `revision`.
etcdv3::Compare RevisionIs(std::string key, etcdv3::Compare::CompareTarget target,
                           int64_t revision) {
  etcdv3::Compare c;
  c.set_key(std::move(key));
  c.set_target(target);
  c.set_result(etcdv3::Compare::EQUAL);
  if (target == etcdv3::Compare::CREATE) {
    c.set_create_revision(revision);
  } else {
    c.set_mod_revision(revision);
  }
  return c;
}

}  // namespace

etcdv3::Compare CreateRevisionIs(std::string key, int64_t revision) {
  return RevisionIs(std::move(key), etcdv3::Compare::CREATE, revision);
}

etcdv3::Compare ModRevisionIs(std::string key, int64_t revision) {
  return RevisionIs(std::move(key), etcdv3::Compare::MOD, revision);
}

}  // namespace shardcoord
