// TransferManager: create, store, load, get, list, delete; runs as plans are seen; worker
// deaths. Preparing is transfer_prepare.cc, running transfer_run.cc.

#include "coordinator/transfers/transfer_manager.h"

#include <algorithm>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "coordinator/transfers/transfer_manager_internal.h"
#include "sharding/names.h"

namespace shardcoord {
namespace internal_transfers {

std::string PageName(const std::string& transfer, int64_t page) {
  return absl::StrFormat("%s#%06d", transfer, page);
}

std::string RunId(const std::string& ns, int64_t n) {
  return ns.empty() ? absl::StrCat("t-", n) : absl::StrCat("t-", ns, ".", n);
}

std::string TransferId(const std::string& name, const std::string& ns, int64_t n) {
  return ns.empty() ? absl::StrCat(name, "@", n) : absl::StrCat(name, "@", ns, ".", n);
}

}  // namespace internal_transfers

namespace {

using internal_transfers::kCopiesKind;
using internal_transfers::kTransferKind;
using internal_transfers::PageName;

// The stored pages of `copies`: each about `page_bytes` at most.
std::vector<v1::CreateTransferRequest> CopyPages(const std::string& name,
                                                 const std::vector<TransferCopy>& copies,
                                                 int64_t page_bytes) {
  std::vector<v1::CreateTransferRequest> pages(1);
  int64_t bytes = 0;
  for (const TransferCopy& c : copies) {
    const int64_t size = static_cast<int64_t>(c.src.size() + c.dst.size()) + 8;
    if (bytes > 0 && bytes + size > page_bytes) {
      pages.emplace_back();
      bytes = 0;
    }
    v1::CopyPair* pair = pages.back().add_copies();
    pair->set_src(c.src);
    pair->set_dst(c.dst);
    bytes += size;
  }
  for (v1::CreateTransferRequest& p : pages) p.set_name(name);
  return pages;
}

}  // namespace

TransferManager::TransferManager(const Clock* clock, Timer* timer, WorkerManager* workers,
                                 TensorManager* tensors, WorkerClient* client, StateStore* store,
                                 TransferManagerOptions options)
    : clock_(clock),
      timer_(timer),
      workers_(workers),
      tensors_(tensors),
      client_(client),
      store_(store),
      options_(std::move(options)) {
  if (options_.prepare_threads > 0) pool_ = std::make_unique<ThreadPool>(options_.prepare_threads);
}

TransferManager::~TransferManager() {
  pool_.reset();  // Queued preparations run while everything they use still stands.
  absl::MutexLock lock(&mu_);
  for (auto& [id, r] : runs_) {
    if (r->timer != 0) timer_->Cancel(r->timer);
    if (r->grace_timer != 0) timer_->Cancel(r->grace_timer);
  }
}

// ---- Load, create, store -----------------------------------------------------------------

absl::Status TransferManager::Load() {
  if (store_ == nullptr) return absl::OkStatus();
  // Headers, then pages of copies: only this manager's kinds are read.
  absl::StatusOr<std::vector<StateRecord>> records =
      store_->LoadKinds({kTransferKind, kCopiesKind});
  if (!records.ok()) return records.status();
  std::map<std::string, std::vector<TransferCopy>> copies;
  std::map<std::string, int64_t> pages;
  std::vector<v1::TransferInfo> headers;
  for (const StateRecord& r : *records) {
    auto bad = [&r](absl::string_view why) {
      return absl::InternalError(
          absl::StrCat("state store: bad ", r.kind, " record '", r.name, "': ", why));
    };
    if (r.kind == kTransferKind) {
      v1::TransferInfo& h = headers.emplace_back();
      if (!h.ParseFromString(r.value) || h.name() != r.name) return bad("does not parse");
    } else if (r.kind == kCopiesKind) {
      v1::CreateTransferRequest page;
      if (!page.ParseFromString(r.value)) return bad("does not parse");
      // Pages sort by name within their transfer ("NAME#000001").
      std::vector<TransferCopy>& into = copies[page.name()];
      for (const v1::CopyPair& c : page.copies()) into.push_back(TransferCopy{c.src(), c.dst()});
      ++pages[page.name()];
    }
  }
  for (const v1::TransferInfo& h : headers) {
    std::vector<TransferCopy>& mine = copies[h.name()];
    if (static_cast<int64_t>(mine.size()) != h.members()) {
      return absl::InternalError(absl::StrCat("state store: transfer '", h.name(), "' has ",
                                              mine.size(), " of its ", h.members(), " copies"));
    }
    auto shared = std::make_shared<const std::vector<TransferCopy>>(std::move(mine));
    if (absl::Status s = tensors_->BindTransfer(h.name(), shared, h.version()); !s.ok()) return s;
    absl::MutexLock lock(&mu_);
    Transfer& t = transfers_[h.name()];
    t.name = h.name();
    t.copies = std::move(shared);
    t.stored = true;
    t.runs = h.runs();
    t.replans = h.replans();
    t.version = h.version();
    t.pages_stored = pages[h.name()];
  }
  return absl::OkStatus();
}

void TransferManager::Create(const std::string& name, std::vector<TransferCopy> copies,
                             InfoCallback done) {
  if (absl::Status s = ValidateName(name, "name"); !s.ok()) return done(s);
  if (copies.size() > options_.max_members) {
    return done(absl::InvalidArgumentError(absl::StrCat(
        "copies: ", copies.size(), " members, more than the limit of ", options_.max_members)));
  }
  {
    std::vector<CopyMember> members;
    members.reserve(copies.size());
    for (const TransferCopy& c : copies) members.push_back(CopyMember{c.src, c.dst});
    if (absl::Status s = CheckCopyGroup(members); !s.ok()) return done(s);
  }
  auto shared = std::make_shared<const std::vector<TransferCopy>>(std::move(copies));
  {
    absl::MutexLock lock(&mu_);
    if (!closed_.empty()) return done(absl::UnavailableError(closed_));
    auto [it, added] = transfers_.try_emplace(name);
    if (!added) {
      return done(absl::AlreadyExistsError(absl::StrCat("transfer '", name, "' already exists")));
    }
    it->second.name = name;
    it->second.copies = shared;
    it->second.busy = "creating";
  }
  if (absl::Status s = tensors_->BindTransfer(name, shared, 0); !s.ok()) {
    ForgetCreating(name);
    return done(s);
  }
  Prepare(name, [this, name, done = std::move(done)](
                    absl::StatusOr<std::shared_ptr<const Prepared>> prepared) mutable {
    CreatePrepared(name, std::move(prepared), std::move(done));
  });
}

void TransferManager::CreatePrepared(const std::string& name,
                                     absl::StatusOr<std::shared_ptr<const Prepared>> prepared,
                                     InfoCallback done) {
  if (!prepared.ok()) {
    tensors_->UnbindTransfer(name, StateBatch()).IgnoreError();
    ForgetCreating(name);
    return done(prepared.status());
  }
  // Stored once its workers hold their parts: header and pages in one batch.
  StateBatch batch;
  std::vector<v1::CreateTransferRequest> pages;
  {
    absl::MutexLock lock(&mu_);
    const Transfer& t = transfers_.at(name);
    pages = CopyPages(name, *t.copies, options_.page_bytes);
    StateRecord header = HeaderLocked(t, 0, 0);
    batch.Put(header.kind, header.name, std::move(header.value));
  }
  for (size_t i = 0; i < pages.size(); ++i) {
    batch.Put(kCopiesKind, PageName(name, static_cast<int64_t>(i)), pages[i].SerializeAsString());
  }
  absl::Status stored = store_ == nullptr ? absl::OkStatus() : store_->Apply(batch);
  if (!stored.ok()) {
    v1::DropTransferRequest drop;
    drop.add_transfer_ids((*prepared)->id);
    DropParts((*prepared)->participants, drop);
    tensors_->UnbindTransfer(name, StateBatch()).IgnoreError();
    ForgetCreating(name);
    return done(stored);
  }
  absl::StatusOr<TransferBindingState> binding = tensors_->TransferState(name);
  v1::TransferInfo info;
  {
    absl::MutexLock lock(&mu_);
    Transfer& t = transfers_.at(name);
    t.stored = true;
    t.busy.clear();
    t.prepared = *std::move(prepared);
    // A participant lost since its answer: stored, and prepared again by the first run.
    t.invalid = std::exchange(t.lost_while_preparing, "");
    t.preparing.clear();
    t.pages_stored = static_cast<int64_t>(pages.size());
    info = InfoLocked(t, binding.ok() ? &*binding : nullptr);
  }
  done(std::move(info));
}

void TransferManager::ForgetCreating(const std::string& name) {
  absl::MutexLock lock(&mu_);
  auto it = transfers_.find(name);
  if (it != transfers_.end() && !it->second.stored) transfers_.erase(it);
}

StateRecord TransferManager::HeaderLocked(const Transfer& t, int64_t version, int64_t runs) const {
  v1::TransferInfo h;
  h.set_name(t.name);
  h.set_members(static_cast<int64_t>(t.copies->size()));
  h.set_runs(runs);
  h.set_replans(t.replans);
  h.set_version(version);
  return StateRecord{kTransferKind, t.name, h.SerializeAsString()};
}

// ---- Get, list, delete -------------------------------------------------------------------

std::string TransferManager::InvalidLocked(const Transfer& t,
                                           const TransferBindingState& binding) const {
  if (t.prepared == nullptr) {
    return t.stored ? "not prepared since the coordinator started" : "being prepared";
  }
  if (!t.invalid.empty()) return t.invalid;
  if (binding.generation != t.prepared->generation) {
    return binding.reason.empty() ? "its members changed" : binding.reason;
  }
  return "";
}

v1::TransferInfo TransferManager::InfoLocked(const Transfer& t,
                                             const TransferBindingState* binding) const {
  v1::TransferInfo out;
  out.set_name(t.name);
  out.set_members(static_cast<int64_t>(t.copies->size()));
  const std::string invalid = binding == nullptr ? "not bound" : InvalidLocked(t, *binding);
  out.set_prepared(invalid.empty());
  out.set_invalid_reason(invalid);
  out.set_runs(t.runs);
  out.set_replans(t.replans);
  out.set_version(binding == nullptr ? t.version : binding->version);
  if (const Prepared* p = t.prepared.get(); p != nullptr) {
    out.set_participants(static_cast<int64_t>(p->participants.size()));
    out.set_templates(p->templates);
    out.set_layouts(p->layouts);
    out.set_bytes(p->bytes);
    out.set_bytes_moved(p->bytes_moved);
    out.set_lower_bound_bytes(p->lower_bound_bytes);
    out.set_max_rank_send_bytes(p->max_rank_send_bytes);
    out.set_max_rank_recv_bytes(p->max_rank_recv_bytes);
    out.set_prepare_seconds(p->seconds);
  }
  out.set_last_run_id(t.last_run_id);
  out.set_last_run_state(static_cast<v1::PlanState>(static_cast<int>(t.last_run_state)));
  out.set_last_run_seconds(t.last_run_seconds);
  out.set_last_error(t.last_error);
  out.set_running(!t.busy.empty() && t.busy != "creating" && t.busy != "deleting");
  return out;
}

absl::StatusOr<v1::TransferInfo> TransferManager::Get(const std::string& name,
                                                      bool with_copies) const {
  absl::StatusOr<TransferBindingState> binding = tensors_->TransferState(name);
  TransferCopies copies;
  v1::TransferInfo out;
  {
    absl::MutexLock lock(&mu_);
    auto it = transfers_.find(name);
    if (it == transfers_.end() || !it->second.stored) {
      return absl::NotFoundError(absl::StrCat("unknown transfer '", name, "'"));
    }
    out = InfoLocked(it->second, binding.ok() ? &*binding : nullptr);
    copies = it->second.copies;
  }
  if (with_copies) {
    out.mutable_copies()->Reserve(static_cast<int>(copies->size()));
    for (const TransferCopy& c : *copies) {
      v1::CopyPair* p = out.add_copies();
      p->set_src(c.src);
      p->set_dst(c.dst);
    }
  }
  return out;
}

TransferManager::Page TransferManager::List(absl::string_view after, size_t limit) const {
  std::vector<std::string> names;
  {
    absl::MutexLock lock(&mu_);
    for (auto it = after.empty() ? transfers_.begin() : transfers_.upper_bound(after);
         it != transfers_.end() && names.size() <= limit; ++it) {
      if (it->second.stored) names.push_back(it->first);
    }
  }
  Page page;
  page.more = names.size() > limit;
  if (page.more) names.resize(limit);
  for (const std::string& name : names) {
    absl::StatusOr<v1::TransferInfo> info = Get(name, false);
    if (info.ok()) page.transfers.push_back(*std::move(info));  // Else deleted meanwhile.
  }
  return page;
}

absl::Status TransferManager::Delete(const std::string& name) {
  int64_t pages = 0;
  {
    absl::MutexLock lock(&mu_);
    auto it = transfers_.find(name);
    if (it == transfers_.end() || !it->second.stored) {
      return absl::NotFoundError(absl::StrCat("unknown transfer '", name, "'"));
    }
    Transfer& t = it->second;
    if (!t.busy.empty()) {
      return absl::AbortedError(absl::StrCat(
          "transfer '", name, "' is ",
          t.busy == "deleting" ? "being deleted" : absl::StrCat("running (run ", t.busy, ")")));
    }
    t.busy = "deleting";
    pages = t.pages_stored;
  }
  StateBatch batch;
  batch.Delete(kTransferKind, name);
  for (int64_t i = 0; i < pages; ++i) batch.Delete(kCopiesKind, PageName(name, i));
  // One apply: the transfer's records go, and its dsts keep the last run's version.
  if (absl::Status s = tensors_->UnbindTransfer(name, std::move(batch)); !s.ok()) {
    absl::MutexLock lock(&mu_);
    transfers_.at(name).busy.clear();
    return s;
  }
  std::string prefix;
  {
    absl::MutexLock lock(&mu_);
    auto it = transfers_.find(name);
    if (it->second.prepared != nullptr) prefix = CommPrefixLocked(it->second, *it->second.prepared);
    transfers_.erase(it);
  }
  if (!prefix.empty() && options_.on_prefix_retired) options_.on_prefix_retired(prefix);
  // Every live worker: earlier preparations may have had other participants.
  std::vector<WorkerEndpoint> live;
  for (const WorkerRecord& w : workers_->List()) {
    if (w.alive) live.push_back(w.Endpoint());
  }
  v1::DropTransferRequest drop;
  drop.set_prefix(absl::StrCat(name, "@"));
  DropParts(live, drop);
  return absl::OkStatus();
}

std::string TransferManager::CommPrefixLocked(const Transfer& t, const Prepared& p) const {
  return absl::StrCat("shardcoord/comm/transfer/", p.id, "/", t.comm_epoch, "/");
}

// ---- Runs as plans -----------------------------------------------------------------------

bool TransferManager::IsRun(const std::string& id) const {
  absl::MutexLock lock(&mu_);
  return runs_.count(id) > 0;
}

PlanProgress TransferManager::ProgressLocked(const RunRecord& r) const {
  PlanProgress p;
  p.plan_id = r.id;
  p.tensor = absl::StrCat("transfer ", r.transfer);
  p.state = r.state;
  p.bytes_total = r.prepared == nullptr ? 0 : r.prepared->bytes_moved;
  p.bytes_done =
      r.state == PlanState::kCommitted ? p.bytes_total : std::min(r.bytes_done, p.bytes_total);
  p.error = r.error;
  const absl::Time end = r.end == absl::InfiniteFuture() ? clock_->Now() : r.end;
  p.seconds = absl::ToDoubleSeconds(end - r.start);
  p.seq = r.seq;
  p.bucket_bytes = r.bucket_bytes;
  p.waiting_for_memory = r.waiting_for_memory;
  return p;
}

TransferManager::WatchCalls TransferManager::ChangedLocked(RunRecord& r) {
  ++r.seq;
  WatchCalls calls;
  if (r.watchers.empty()) return calls;
  const PlanProgress p = ProgressLocked(r);
  for (const auto& [id, fn] : r.watchers) calls.emplace_back(fn, p);
  return calls;
}

void TransferManager::Tell(const WatchCalls& calls) {
  for (const auto& [fn, p] : calls) fn(p);
}

absl::StatusOr<PlanProgress> TransferManager::Progress(const std::string& run_id) const {
  absl::MutexLock lock(&mu_);
  auto it = runs_.find(run_id);
  if (it == runs_.end()) return absl::NotFoundError(absl::StrCat("unknown plan '", run_id, "'"));
  return ProgressLocked(*it->second);
}

absl::StatusOr<int64_t> TransferManager::Watch(const std::string& run_id, WatchFn fn) {
  PlanProgress now;
  int64_t wid = 0;
  {
    absl::MutexLock lock(&mu_);
    auto it = runs_.find(run_id);
    if (it == runs_.end()) {
      return absl::NotFoundError(absl::StrCat("unknown plan '", run_id, "'"));
    }
    RunRecord& r = *it->second;
    now = ProgressLocked(r);
    if (!r.over) {
      wid = next_watch_++;
      r.watchers.emplace(wid, fn);
    }
  }
  fn(now);
  return wid;
}

void TransferManager::Unwatch(const std::string& run_id, int64_t watch_id) {
  absl::MutexLock lock(&mu_);
  auto it = runs_.find(run_id);
  if (it != runs_.end()) it->second->watchers.erase(watch_id);
}

absl::StatusOr<v1::PlanTrace> TransferManager::Trace(const std::string& run_id) const {
  absl::MutexLock lock(&mu_);
  auto it = runs_.find(run_id);
  if (it == runs_.end()) return absl::NotFoundError(absl::StrCat("unknown plan '", run_id, "'"));
  const RunRecord& r = *it->second;
  v1::PlanTrace out;
  out.set_plan_id(r.id);
  out.set_tensor(absl::StrCat("transfer ", r.transfer));
  out.set_op("transfer");
  out.set_state(static_cast<v1::PlanState>(static_cast<int>(r.state)));
  out.set_error(r.error);
  out.set_start_unix_us(absl::ToUnixMicros(r.start));
  if (r.transferred != absl::InfinitePast()) {
    out.set_transferred_unix_us(absl::ToUnixMicros(r.transferred));
  }
  if (r.end != absl::InfiniteFuture()) out.set_end_unix_us(absl::ToUnixMicros(r.end));
  if (r.prepared != nullptr) {
    for (size_t i = 0; i < r.prepared->participants.size() && i < r.answers.size(); ++i) {
      v1::RankTrace* rank = out.add_ranks();
      if (r.answers[i].has_value()) *rank = r.answers[i]->timing();
      rank->set_rank(r.prepared->participants[i].rank);
      rank->set_worker(r.prepared->participants[i].name);
    }
  }
  return out;
}

std::vector<v1::PlanSummary> TransferManager::ListRuns(size_t limit) const {
  absl::MutexLock lock(&mu_);
  std::vector<const RunRecord*> runs;
  runs.reserve(runs_.size());
  for (const auto& [id, r] : runs_) runs.push_back(r.get());
  std::sort(runs.begin(), runs.end(), [](const RunRecord* a, const RunRecord* b) {
    return a->start != b->start ? a->start > b->start : a->id > b->id;
  });
  if (runs.size() > limit) runs.resize(limit);
  std::vector<v1::PlanSummary> out;
  out.reserve(runs.size());
  for (const RunRecord* r : runs) {
    const PlanProgress p = ProgressLocked(*r);
    v1::PlanSummary& s = out.emplace_back();
    s.set_plan_id(r->id);
    s.set_tensor(p.tensor);
    s.set_source_tensor(p.tensor);
    s.set_op("transfer");
    s.set_state(static_cast<v1::PlanState>(static_cast<int>(p.state)));
    s.set_bytes_done(p.bytes_done);
    s.set_bytes_moved(p.bytes_total);
    if (r->prepared != nullptr) s.set_lower_bound_bytes(r->prepared->lower_bound_bytes);
    s.set_start_unix_ms(absl::ToUnixMillis(r->start));
    s.set_seconds(p.seconds);
    s.set_error(r->error);
  }
  return out;
}

size_t TransferManager::RunningCount() const {
  absl::MutexLock lock(&mu_);
  size_t n = 0;
  for (const auto& [id, r] : runs_) n += r->over ? 0 : 1;
  return n;
}

void TransferManager::RetireRunLocked(const std::string& run_id) {
  ended_runs_.push_back(run_id);
  while (ended_runs_.size() > options_.keep_ended_runs) {
    runs_.erase(ended_runs_.front());
    ended_runs_.pop_front();
  }
}

// ---- Worker deaths, shutdown -------------------------------------------------------------

void TransferManager::OnWorkerLost(const WorkerRecord& worker, const std::string& reason) {
  const std::string why = absl::StrCat(worker.Describe(), " ", reason);
  auto takes_part = [&worker](const std::vector<WorkerEndpoint>& participants) {
    auto it = std::lower_bound(participants.begin(), participants.end(), worker.rank,
                               [](const WorkerEndpoint& w, int64_t rank) { return w.rank < rank; });
    return it != participants.end() && it->rank == worker.rank &&
           it->incarnation == worker.incarnation;
  };
  std::vector<std::pair<std::string, std::string>> aborts;  // (run, reason)
  {
    absl::MutexLock lock(&mu_);
    for (auto& [name, t] : transfers_) {
      if (takes_part(t.preparing)) t.lost_while_preparing = why;
      if (t.prepared == nullptr || !takes_part(t.prepared->participants)) continue;
      // Its resident part is gone (or stale): the next run prepares again.
      t.invalid = why;
      auto r = runs_.find(t.busy);
      if (r == runs_.end() || !r->second->open() || r->second->prepared != t.prepared) continue;
      // The death is the cause; a peer's error seen in the grace is its echo.
      const std::string& failing = r->second->failing;
      aborts.emplace_back(t.busy,
                          absl::StrCat(why, failing.empty() ? "" : "; before that, ", failing));
    }
  }
  for (const auto& [run, reason] : aborts) AbortRun(run, reason);
}

void TransferManager::Close(const std::string& reason) {
  absl::MutexLock lock(&mu_);
  closed_ = reason;
}

void TransferManager::Shutdown(const std::string& reason) {
  std::vector<std::string> running;
  {
    absl::MutexLock lock(&mu_);
    closed_ = reason;
    for (const auto& [id, r] : runs_) {
      if (r->open()) running.push_back(id);
    }
  }
  for (const std::string& id : running) AbortRun(id, reason);
}

}  // namespace shardcoord
