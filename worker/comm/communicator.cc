#include "worker/comm/communicator.h"

#include <algorithm>
#include <utility>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace shardcoord {

absl::Status ValidateCommunicatorSpec(const CommunicatorSpec& spec) {
  if (spec.ranks.empty()) return absl::InvalidArgumentError("communicator ranks is empty");
  absl::flat_hash_set<int64_t> seen;
  for (int64_t r : spec.ranks) {
    if (r < 0) return absl::InvalidArgumentError(absl::StrCat("communicator rank ", r, " < 0"));
    if (!seen.insert(r).second) {
      return absl::InvalidArgumentError(absl::StrCat(
          "communicator ranks [", absl::StrJoin(spec.ranks, ","), "] repeat rank ", r));
    }
  }
  if (spec.incarnations.size() != spec.ranks.size()) {
    return absl::InvalidArgumentError(absl::StrCat("communicator has ", spec.ranks.size(),
                                                   " ranks but ", spec.incarnations.size(),
                                                   " incarnations"));
  }
  if (!seen.contains(spec.my_rank)) {
    return absl::InvalidArgumentError(absl::StrCat("my_rank ", spec.my_rank,
                                                   " is not in communicator ranks [",
                                                   absl::StrJoin(spec.ranks, ","), "]"));
  }
  if (spec.timeout <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "communicator timeout ", absl::FormatDuration(spec.timeout), " is not positive"));
  }
  return absl::OkStatus();
}

int GroupRankOf(const CommunicatorSpec& spec) {
  auto it = std::find(spec.ranks.begin(), spec.ranks.end(), spec.my_rank);
  return it == spec.ranks.end() ? -1 : static_cast<int>(it - spec.ranks.begin());
}

void CancelToken::Cancel() {
  absl::MutexLock lock(&mu_);
  if (cancelled_) return;
  cancelled_ = true;
  // Under the lock, so Remove cannot return while a callback runs.
  for (auto& [handle, fn] : callbacks_) fn();
  callbacks_.clear();
}

bool CancelToken::cancelled() const {
  absl::MutexLock lock(&mu_);
  return cancelled_;
}

int64_t CancelToken::OnCancel(std::function<void()> fn) {
  absl::MutexLock lock(&mu_);
  if (cancelled_) {
    fn();
    return -1;
  }
  callbacks_.emplace(next_, std::move(fn));
  return next_++;
}

void CancelToken::Remove(int64_t handle) {
  absl::MutexLock lock(&mu_);
  callbacks_.erase(handle);
}

absl::Status SendRecvWithHooks(Communicator& comm, absl::Span<const SendOp> sends,
                               absl::Span<const RecvOp> recvs, const CommOptions& options) {
  if (comm.RunsHooks()) return comm.SendRecv(sends, recvs, options);
  for (const SendOp& op : sends) {
    if (op.prepare) {
      if (absl::Status s = op.prepare(); !s.ok()) return s;
    }
  }
  CommOptions plain = options;
  if (absl::Status s = PrepareOptions(comm, &plain); !s.ok()) return s;
  std::vector<SendOp> bare_sends(sends.begin(), sends.end());
  std::vector<RecvOp> bare_recvs(recvs.begin(), recvs.end());
  for (SendOp& op : bare_sends) op.prepare = nullptr;
  for (RecvOp& op : bare_recvs) op.done = nullptr;
  if (absl::Status s = comm.SendRecv(bare_sends, bare_recvs, plain); !s.ok()) return s;
  for (const RecvOp& op : recvs) {
    if (op.done) {
      if (absl::Status s = op.done(); !s.ok()) return s;
    }
  }
  return absl::OkStatus();
}

absl::Status PrepareOptions(const Communicator& comm, CommOptions* options) {
  if (comm.RunsHooks() || !options->while_waiting) return absl::OkStatus();
  absl::Status s = options->while_waiting();
  options->while_waiting = nullptr;
  return s;
}

CommunicatorCache::CommunicatorCache(std::shared_ptr<CommunicatorFactory> factory,
                                     CommunicatorCacheMetrics metrics)
    : factory_(std::move(factory)), metrics_(metrics) {}

void CommunicatorCache::Count(CounterFamily* family, const char* label, double n) const {
  if (family != nullptr && n > 0) family->WithLabels({label})->Increment(n);
}

absl::StatusOr<std::shared_ptr<Communicator>> CommunicatorCache::Get(const CommunicatorSpec& spec) {
  if (absl::Status s = ValidateCommunicatorSpec(spec); !s.ok()) return s;
  Key key(spec.key_prefix, spec.ranks, spec.incarnations);
  std::shared_ptr<Entry> entry;
  {
    absl::MutexLock lock(&mu_);
    while (true) {
      auto it = entries_.find(key);
      if (it == entries_.end()) break;
      std::shared_ptr<Entry> existing = it->second;
      if (existing->building) {
        mu_.Await(absl::Condition(
            +[](Entry* e) { return !e->building; }, existing.get()));
        // The build we waited for failed: report it rather than retry the rendezvous.
        if (!existing->status.ok()) return existing->status;
        continue;
      }
      if (!existing->comm->broken()) return existing->comm;
      entries_.erase(it);  // Broken: build a new one.
      Count(metrics_.aborts, "broken");
      break;
    }
    entry = std::make_shared<Entry>();
    entries_[key] = entry;
  }

  // Build outside the lock: it blocks on the rendezvous with the other members.
  absl::StatusOr<std::shared_ptr<Communicator>> built = factory_->Create(spec);
  Count(metrics_.builds, built.ok() ? "ok" : "error");

  absl::MutexLock lock(&mu_);
  entry->building = false;
  if (!built.ok()) {
    entry->status = built.status();
    auto it = entries_.find(key);
    if (it != entries_.end() && it->second == entry) entries_.erase(it);
    return built.status();
  }
  entry->comm = *built;
  if (entry->released) {
    auto it = entries_.find(key);
    if (it != entries_.end() && it->second == entry) entries_.erase(it);
  }
  return entry->comm;
}

int CommunicatorCache::ReleasePrefix(absl::string_view key_prefix) {
  std::vector<std::shared_ptr<Entry>> dropped;  // Destroyed after the lock is released.
  absl::MutexLock lock(&mu_);
  for (auto it = entries_.begin(); it != entries_.end();) {
    if (std::get<0>(it->first) != key_prefix) {
      ++it;
    } else if (it->second->building) {
      it->second->released = true;  // Its Get still returns it; the cache does not keep it.
      ++it;
    } else {
      dropped.push_back(std::move(it->second));
      it = entries_.erase(it);
    }
  }
  Count(metrics_.aborts, "plan_aborted", static_cast<double>(dropped.size()));
  return static_cast<int>(dropped.size());
}

int CommunicatorCache::size() const {
  absl::MutexLock lock(&mu_);
  return static_cast<int>(entries_.size());
}

}  // namespace shardcoord
