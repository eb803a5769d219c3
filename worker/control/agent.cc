#include "worker/control/agent.h"

#include <algorithm>
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

absl::Duration Agent::Backoff(int attempt) const {
  absl::Duration d = options_.initial_retry_interval;
  for (int i = 0; i < attempt && d < options_.retry_interval; ++i) d *= 2;
  return std::min(d, options_.retry_interval);
}

absl::Status Agent::RegisterOnce() {
  v1::RegisterWorkerRequest request = options_.registration;
  if (options_.memory) {
    const MemoryReport m = options_.memory();
    request.set_memory_budget_bytes(m.budget_bytes);
    request.set_memory_used_bytes(m.used_bytes);
    request.set_memory_peak_bytes(m.peak_bytes);
  }
  if (options_.held) {
    for (v1::HeldBuffer& h : options_.held()) *request.add_held() = std::move(h);
  }
  absl::StatusOr<v1::RegisterWorkerResponse> r = rpc_->Register(request);
  if (!r.ok()) return r.status();
  if (r->drop_size() > 0) {
    Log(absl::StrCat("the coordinator dropped ", r->drop_size(), " buffers"));
    for (const v1::HeldBuffer& d : r->drop()) {
      if (options_.drop) options_.drop(d.tensor(), d.version());
    }
  }
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
  for (int attempt = 0;; ++attempt) {
    absl::Status s = RegisterOnce();
    if (s.ok()) break;
    // CANCELLED: a coordinator that stopped before taking the call (gRPC cancels those;
    // grpc/grpc#41785), e.g. a standby handing its port to a new leader.
    const bool transient = s.code() == absl::StatusCode::kUnavailable ||
                           s.code() == absl::StatusCode::kDeadlineExceeded ||
                           s.code() == absl::StatusCode::kCancelled;
    if (!transient || absl::Now() >= deadline) return s;
    Log(absl::StrCat("registration failed, retrying: ", s.ToString()));
    if (WaitOrStop(std::min(Backoff(attempt), deadline - absl::Now()))) {
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
    if (options_.memory) {
      const MemoryReport m = options_.memory();
      beat.set_memory_budget_bytes(m.budget_bytes);
      beat.set_memory_used_bytes(m.used_bytes);
      beat.set_memory_peak_bytes(m.peak_bytes);
    }
    absl::Status s = rpc_->Heartbeat(beat);
    if (s.ok()) continue;
    if (s.code() != absl::StatusCode::kAborted && s.code() != absl::StatusCode::kNotFound) {
      Log(absl::StrCat("heartbeat failed: ", s.ToString()));
      continue;
    }
    {
      absl::MutexLock lock(&mu_);
      if (leaving_) {
        Log(absl::StrCat("heartbeat refused while leaving (", s.ToString(), "); stopping"));
        return;
      }
    }
    Log(absl::StrCat("heartbeat refused (", s.ToString(), "); registering again"));
    if (options_.on_registration) options_.on_registration(false);
    if (options_.before_registering_again) options_.before_registering_again();
    for (int attempt = 0;; ++attempt) {
      absl::Status r = RegisterOnce();
      if (r.ok()) {
        const WorkerIdentity id = identity();
        Log(absl::StrCat("registered again: rank ", id.rank, ", incarnation ", id.incarnation));
        if (options_.on_registration) options_.on_registration(true);
        break;
      }
      Log(absl::StrCat("registration failed: ", r.ToString()));
      if (WaitOrStop(Backoff(attempt))) return;
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

void Agent::Leave() {
  absl::MutexLock lock(&mu_);
  leaving_ = true;
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
