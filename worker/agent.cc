#include "worker/agent.h"

#include <utility>

#include "absl/strings/str_cat.h"

namespace shardcoord {

Agent::Agent(CoordinatorAgentRpc* rpc, AgentOptions options)
    : rpc_(rpc), options_(std::move(options)), interval_(options_.default_heartbeat_interval) {
  identity_.name = options_.registration.name();
}

Agent::~Agent() { Stop(); }

void Agent::Log(absl::string_view line) const {
  if (options_.log) options_.log(line);
}

bool Agent::WaitOrStop(absl::Duration d) {
  absl::MutexLock lock(&mu_);
  mu_.AwaitWithTimeout(absl::Condition(&stopping_), d);
  return stopping_;
}

absl::Status Agent::RegisterOnce() {
  absl::StatusOr<v1::RegisterWorkerResponse> r = rpc_->Register(options_.registration);
  if (!r.ok()) return r.status();
  absl::MutexLock lock(&mu_);
  identity_.name = options_.registration.name();
  identity_.rank = r->rank();
  identity_.incarnation = r->incarnation();
  interval_ = r->heartbeat_interval_ms() > 0 ? absl::Milliseconds(r->heartbeat_interval_ms())
                                             : options_.default_heartbeat_interval;
  ++registrations_;
  return absl::OkStatus();
}

absl::Status Agent::Start(absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  while (true) {
    absl::Status s = RegisterOnce();
    if (s.ok()) break;
    const bool transient = s.code() == absl::StatusCode::kUnavailable ||
                           s.code() == absl::StatusCode::kDeadlineExceeded;
    if (!transient || absl::Now() >= deadline) return s;
    Log(absl::StrCat("registration failed, retrying: ", s.ToString()));
    if (WaitOrStop(std::min(options_.retry_interval, deadline - absl::Now()))) {
      return absl::CancelledError("agent stopped before registering");
    }
  }
  const WorkerIdentity id = identity();
  Log(absl::StrCat("registered as ", id.name, ": rank ", id.rank, ", incarnation ",
                   id.incarnation));
  thread_ = std::thread([this] { Loop(); });
  return absl::OkStatus();
}

void Agent::Loop() {
  while (true) {
    absl::Duration interval;
    v1::HeartbeatRequest beat;
    {
      absl::MutexLock lock(&mu_);
      interval = interval_;
      beat.set_name(identity_.name);
      beat.set_incarnation(identity_.incarnation);
    }
    if (WaitOrStop(interval)) return;
    absl::Status s = rpc_->Heartbeat(beat);
    if (s.ok()) continue;
    if (s.code() != absl::StatusCode::kAborted && s.code() != absl::StatusCode::kNotFound) {
      Log(absl::StrCat("heartbeat failed: ", s.ToString()));
      continue;
    }
    Log(absl::StrCat("heartbeat refused (", s.ToString(), "); registering again"));
    while (true) {
      absl::Status r = RegisterOnce();
      if (r.ok()) {
        const WorkerIdentity id = identity();
        Log(absl::StrCat("registered again: rank ", id.rank, ", incarnation ", id.incarnation));
        break;
      }
      Log(absl::StrCat("registration failed: ", r.ToString()));
      if (WaitOrStop(options_.retry_interval)) return;
    }
  }
}

void Agent::Stop() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
  }
  if (thread_.joinable()) thread_.join();
}

WorkerIdentity Agent::identity() const {
  absl::MutexLock lock(&mu_);
  return identity_;
}

int64_t Agent::registrations() const {
  absl::MutexLock lock(&mu_);
  return registrations_;
}

}  // namespace shardcoord
