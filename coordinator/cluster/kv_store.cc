#include "coordinator/cluster/kv_store.h"

#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace shardcoord {

KvStore::~KvStore() {
  absl::MutexLock lock(&mu_);
  for (auto& [key, waiters] : get_waiters_) {
    for (auto& [id, w] : waiters) timer_->Cancel(w.timer);
  }
  for (auto& [key, b] : barriers_) {
    for (auto& [member, m] : b.waiting) timer_->Cancel(m.timer);
  }
}

absl::Status KvStore::Set(absl::string_view key, std::string value) {
  if (key.empty()) return absl::InvalidArgumentError("key: empty");
  std::vector<GetWaiter> ready;
  {
    absl::MutexLock lock(&mu_);
    values_[std::string(key)] = value;
    auto it = get_waiters_.find(key);
    if (it != get_waiters_.end()) {
      for (auto& [id, w] : it->second) ready.push_back(std::move(w));
      get_waiters_.erase(it);
    }
  }
  for (GetWaiter& w : ready) {
    timer_->Cancel(w.timer);
    w.done(value);
  }
  return absl::OkStatus();
}

absl::StatusOr<std::string> KvStore::Get(absl::string_view key) const {
  if (key.empty()) return absl::InvalidArgumentError("key: empty");
  absl::MutexLock lock(&mu_);
  auto it = values_.find(key);
  if (it == values_.end()) return absl::NotFoundError(absl::StrCat("key '", key, "' is not set"));
  return it->second;
}

void KvStore::GetAsync(absl::string_view key, absl::Time deadline, GetCallback done) {
  if (key.empty()) return done(absl::InvalidArgumentError("key: empty"));
  absl::StatusOr<std::string> now;
  {
    absl::MutexLock lock(&mu_);
    auto it = values_.find(key);
    if (it != values_.end()) {
      now = it->second;
    } else if (!closed_.ok()) {
      now = closed_;
    } else {
      const int64_t id = next_waiter_id_++;
      GetWaiter& w = get_waiters_[std::string(key)][id];
      w.done = std::move(done);
      // Scheduling under the lock keeps the id and the timer together; the timer never
      // calls back inline, so this cannot re-enter.
      w.timer = timer_->Schedule(
          deadline, [this, k = std::string(key), id, deadline] { ExpireGet(k, id, deadline); });
      return;
    }
  }
  done(std::move(now));
}

void KvStore::ExpireGet(const std::string& key, int64_t waiter_id, absl::Time deadline) {
  GetCallback done;
  {
    absl::MutexLock lock(&mu_);
    auto it = get_waiters_.find(key);
    if (it == get_waiters_.end()) return;
    auto w = it->second.find(waiter_id);
    if (w == it->second.end()) return;
    done = std::move(w->second.done);
    it->second.erase(w);
    if (it->second.empty()) get_waiters_.erase(it);
  }
  done(absl::DeadlineExceededError(
      absl::StrCat("key '", key, "' was not set by ", absl::FormatTime(deadline))));
}

void KvStore::Barrier(absl::string_view key, int64_t participants, absl::string_view member,
                      absl::Time deadline, DoneCallback done) {
  if (key.empty()) return done(absl::InvalidArgumentError("key: empty"));
  if (member.empty()) return done(absl::InvalidArgumentError("member: empty"));
  if (participants < 1) {
    return done(
        absl::InvalidArgumentError(absl::StrCat("participants = ", participants, " must be >= 1")));
  }
  std::vector<DoneCallback> ok_now;
  DoneCallback superseded;
  std::vector<Timer::Id> cancel;
  absl::Status status;
  {
    absl::MutexLock lock(&mu_);
    BarrierState& b = barriers_[std::string(key)];
    if (b.participants == 0) b.participants = participants;
    if (!closed_.ok() && !b.complete) {
      status = closed_;
    } else if (b.participants != participants) {
      status = absl::InvalidArgumentError(absl::StrCat("barrier '", key, "' has ", b.participants,
                                                       " participants, not ", participants));
    } else if (b.complete) {
      ok_now.push_back(std::move(done));
    } else {
      const std::string m(member);
      if (auto old = b.waiting.find(m); old != b.waiting.end()) {
        // The member retried (e.g. after a lost response): the new call replaces the old.
        superseded = std::move(old->second.done);
        cancel.push_back(old->second.timer);
        b.waiting.erase(old);
      }
      if (static_cast<int64_t>(b.waiting.size()) + 1 < participants) {
        BarrierMember& bm = b.waiting[m];
        bm.done = std::move(done);
        bm.timer = timer_->Schedule(deadline,
                                    [this, k = std::string(key), m] { ExpireBarrierMember(k, m); });
      } else {
        b.complete = true;
        for (auto& [name, w] : b.waiting) {
          ok_now.push_back(std::move(w.done));
          cancel.push_back(w.timer);
        }
        b.waiting.clear();
        ok_now.push_back(std::move(done));
      }
    }
  }
  if (!status.ok()) return done(status);
  for (Timer::Id id : cancel) timer_->Cancel(id);
  if (superseded)
    superseded(absl::AbortedError("superseded by a newer arrival of the same member"));
  for (DoneCallback& f : ok_now) f(absl::OkStatus());
}

void KvStore::ExpireBarrierMember(const std::string& key, const std::string& member) {
  DoneCallback done;
  int64_t arrived = 0, participants = 0;
  {
    absl::MutexLock lock(&mu_);
    auto it = barriers_.find(key);
    if (it == barriers_.end()) return;
    auto m = it->second.waiting.find(member);
    if (m == it->second.waiting.end()) return;
    done = std::move(m->second.done);
    it->second.waiting.erase(m);
    arrived = static_cast<int64_t>(it->second.waiting.size()) + 1;
    participants = it->second.participants;
  }
  done(absl::DeadlineExceededError(absl::StrCat("barrier '", key, "': ", arrived, " of ",
                                                participants, " participants arrived")));
}

int KvStore::DeletePrefix(absl::string_view prefix) {
  absl::MutexLock lock(&mu_);
  int n = 0;
  for (auto it = values_.lower_bound(prefix);
       it != values_.end() && absl::StartsWith(it->first, prefix);) {
    it = values_.erase(it);
    ++n;
  }
  for (auto it = barriers_.lower_bound(prefix);
       it != barriers_.end() && absl::StartsWith(it->first, prefix);) {
    if (!it->second.waiting.empty()) {
      ++it;  // Waiters still need it; their deadlines end it.
      continue;
    }
    it = barriers_.erase(it);
    ++n;
  }
  return n;
}

void KvStore::CancelAll(const absl::Status& status) {
  std::vector<GetWaiter> gets;
  std::vector<BarrierMember> members;
  {
    absl::MutexLock lock(&mu_);
    closed_ = status.ok() ? absl::CancelledError("closed") : status;
    for (auto& [key, waiters] : get_waiters_) {
      for (auto& [id, w] : waiters) gets.push_back(std::move(w));
    }
    get_waiters_.clear();
    for (auto& [key, b] : barriers_) {
      for (auto& [member, m] : b.waiting) members.push_back(std::move(m));
      b.waiting.clear();
    }
  }
  for (GetWaiter& w : gets) {
    timer_->Cancel(w.timer);
    w.done(status);
  }
  for (BarrierMember& m : members) {
    timer_->Cancel(m.timer);
    m.done(status);
  }
}

size_t KvStore::num_keys() const {
  absl::MutexLock lock(&mu_);
  return values_.size();
}

size_t KvStore::num_waiters() const {
  absl::MutexLock lock(&mu_);
  size_t n = 0;
  for (const auto& [k, w] : get_waiters_) n += w.size();
  for (const auto& [k, b] : barriers_) n += b.waiting.size();
  return n;
}

}  // namespace shardcoord
