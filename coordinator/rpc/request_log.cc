#include "coordinator/rpc/request_log.h"

#include <algorithm>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "proto/shardcoord.pb.h"

namespace shardcoord {
namespace {

constexpr char kRequestKind[] = "request";

bool SaysTryAgain(absl::StatusCode code) {
  return code == absl::StatusCode::kUnavailable || code == absl::StatusCode::kDeadlineExceeded ||
         code == absl::StatusCode::kCancelled || code == absl::StatusCode::kAborted ||
         code == absl::StatusCode::kResourceExhausted;
}

}  // namespace

absl::Status RequestLog::Load() {
  if (store_ == nullptr) return absl::OkStatus();
  absl::StatusOr<std::vector<StateRecord>> records = store_->Load(kRequestKind);
  if (!records.ok()) return records.status();
  std::vector<std::pair<int64_t, std::string>> order;
  absl::MutexLock lock(&mu_);
  for (const StateRecord& r : *records) {
    v1::StoredRequest stored;
    if (!stored.ParseFromString(r.value)) {
      return absl::DataLossError(absl::StrCat("state store: request '", r.name, "' is corrupt"));
    }
    Entry e;
    e.method = stored.method();
    e.fingerprint = stored.fingerprint();
    e.running = false;
    e.outcome.status = absl::Status(static_cast<absl::StatusCode>(stored.code()), stored.message());
    e.outcome.response = stored.response();
    entries_[r.name] = std::move(e);
    order.emplace_back(stored.finished_unix_ms(), r.name);
  }
  std::sort(order.begin(), order.end());
  for (auto& [ms, name] : order) finished_.push_back(std::move(name));
  return absl::OkStatus();
}

absl::StatusOr<std::optional<RequestOutcome>> RequestLog::Begin(absl::string_view request_id,
                                                                absl::string_view method,
                                                                absl::string_view fingerprint) {
  if (request_id.empty()) return std::nullopt;
  if (request_id.size() > kMaxRequestIdBytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        "request_id: ", request_id.size(), " bytes, more than the limit of ", kMaxRequestIdBytes));
  }
  absl::MutexLock lock(&mu_);
  auto [it, inserted] = entries_.try_emplace(request_id);
  Entry& e = it->second;
  if (inserted) {
    e.method = std::string(method);
    e.fingerprint = std::string(fingerprint);
    return std::nullopt;
  }
  if (e.method != method || e.fingerprint != fingerprint) {
    return absl::InvalidArgumentError(absl::StrCat(
        "request_id '", request_id, "' was already used for ", e.method == method ? "another " : "",
        e.method,
        " request; a retry must repeat the request unchanged, a new request needs a new id"));
  }
  if (e.running) {
    return absl::UnavailableError(
        absl::StrCat("request_id '", request_id, "' is still running; retry to get its outcome"));
  }
  return e.outcome;
}

absl::Status RequestLog::Finish(absl::string_view request_id, const RequestOutcome& outcome) {
  if (request_id.empty()) return absl::OkStatus();
  const absl::Time now = clock_->Now();
  absl::MutexLock lock(&mu_);
  auto it = entries_.find(request_id);
  if (it == entries_.end() || !it->second.running) return absl::OkStatus();
  if (SaysTryAgain(outcome.status.code())) {
    entries_.erase(it);
    return absl::OkStatus();
  }
  Entry& e = it->second;
  e.running = false;
  e.outcome = outcome;
  if (!outcome.status.ok()) e.outcome.response.clear();
  finished_.push_back(std::string(request_id));
  std::vector<std::string> evicted;
  while (finished_.size() > capacity_) {
    evicted.push_back(std::move(finished_.front()));
    finished_.pop_front();
    entries_.erase(evicted.back());
  }
  if (store_ == nullptr) return absl::OkStatus();
  v1::StoredRequest stored;
  stored.set_method(e.method);
  stored.set_fingerprint(e.fingerprint);
  stored.set_code(static_cast<int32_t>(e.outcome.status.code()));
  stored.set_message(std::string(e.outcome.status.message()));
  stored.set_response(e.outcome.response);
  stored.set_finished_unix_ms(absl::ToUnixMillis(now));
  StateBatch batch;
  for (std::string& name : evicted) batch.Delete(kRequestKind, std::move(name));
  batch.Put(kRequestKind, std::string(request_id), stored.SerializeAsString());
  // Not synced: the change this outcome answers for was (the client is answered after this
  // returns, so a crash of the coordinator never loses an outcome it gave); a crash of the
  // host may lose the last outcomes, and a retry of one of those acts again (docs/decisions.md).
  batch.sync = false;
  // Under the lock so that stored outcomes and evictions reach the store in order.
  return store_->Apply(batch);
}

size_t RequestLog::size() const {
  absl::MutexLock lock(&mu_);
  return entries_.size();
}

}  // namespace shardcoord
