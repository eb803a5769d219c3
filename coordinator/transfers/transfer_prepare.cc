// Preparing a transfer: one snapshot of its members, their layouts interned, the table every
// participant gets (the same pages, serialized once), and the participants' answers summed.

#include <algorithm>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/fan_in.h"
#include "coordinator/transfers/transfer_manager.h"
#include "coordinator/transfers/transfer_manager_internal.h"
#include "proto/convert.h"
#include "sharding/cast.h"
#include "sharding/staging.h"
#include "sharding/transfer_table.h"

namespace shardcoord {

struct TransferManager::PrepareJob {
  std::string name;
  PreparedCallback done;
  std::shared_ptr<Prepared> prepared;
  std::vector<std::shared_ptr<const v1::PrepareTransferRequest>> pages;
  // The last page's answers, by participant (each slot written by its own callback).
  std::vector<v1::PrepareTransferResponse> answers;
  absl::Time start;
};

namespace {

// A layout of the table, by what determines it: a tensor's layout follows from its mesh, spec
// and shape, and its live layout from the ranks left out. Cheap to build per member, unlike a
// fingerprint of every chunk. An attached dst's layout keeps its empty ranks (their lent
// buffers follow the dst's versions), so it is a layout of its own.
// A dst's layout is its whole layout (every rank gets the new version).
std::string LayoutKey(const TransferSide& side, bool src, bool keep_empty) {
  return absl::StrCat(keep_empty ? "k|" : "|", side.mesh, "|", side.spec, "|",
                      absl::StrJoin(side.shape, ","), "|",
                      src ? absl::StrJoin(side.dropped, ",") : "");
}

std::string Field(size_t i, bool src) {
  return absl::StrCat("copies[", i, "].", src ? "src" : "dst");
}

// A worker's refusal of its part, as the transfer's error: its own code where it says what is
// wrong with a member, INTERNAL where it says the table is (a coordinator bug), else
// UNAVAILABLE (a worker failed to take its part).
absl::Status PartError(const WorkerEndpoint& w, const std::string& name, const absl::Status& s) {
  absl::StatusCode code = absl::StatusCode::kUnavailable;
  if (s.code() == absl::StatusCode::kFailedPrecondition ||
      s.code() == absl::StatusCode::kResourceExhausted) {
    code = s.code();
  } else if (s.code() == absl::StatusCode::kInvalidArgument) {
    code = absl::StatusCode::kInternal;
  }
  return absl::Status(code, absl::StrCat(Describe(w), " did not take its part of transfer '", name,
                                         "': ", s.message()));
}

}  // namespace

void TransferManager::Prepare(const std::string& name, PreparedCallback done) {
  if (pool_ == nullptr) return PrepareNow(name, std::move(done));
  pool_->Schedule([this, name, done = std::move(done)]() mutable { PrepareNow(name, done); });
}

void TransferManager::PrepareNow(const std::string& name, PreparedCallback done) {
  TransferCopies copies;
  std::string closed;
  {
    absl::MutexLock lock(&mu_);
    auto it = transfers_.find(name);
    if (it != transfers_.end()) copies = it->second.copies;
    closed = closed_;
  }
  // Shut down while queued: the worker client may be gone.
  if (!closed.empty()) return done(absl::UnavailableError(closed));
  if (copies == nullptr)
    return done(absl::NotFoundError(absl::StrCat("unknown transfer '", name, "'")));
  const absl::Time start = clock_->Now();
  const std::vector<WorkerRecord> workers = workers_->List();  // Index = rank.
  std::vector<int64_t> live(workers.size(), -1);
  for (const WorkerRecord& w : workers) {
    if (w.alive) live[w.rank] = w.incarnation;
  }
  absl::StatusOr<TransferSnapshot> snap = tensors_->SnapshotTransfer(name, live);
  if (!snap.ok()) return done(snap.status());
  const size_t n = snap->src.size();
  const LivenessFn liveness = [&live](int64_t rank, int64_t incarnation) {
    return rank >= 0 && rank < static_cast<int64_t>(live.size()) && live[rank] == incarnation;
  };

  TransferTable table;
  table.hosts_by_rank = HostsOf(workers);
  table.members.reserve(n);
  absl::flat_hash_map<std::string, int32_t> interned;
  auto prepared = std::make_shared<Prepared>();
  // The layout index of member i's side, interned; the first member of a key looks it up.
  auto layout_of = [&](size_t i, bool src) -> absl::StatusOr<int32_t> {
    const TransferSide& side = src ? snap->src[i] : snap->dst[i];
    const bool keep_empty = !src && side.attached;
    auto [it, added] = interned.try_emplace(LayoutKey(side, src, keep_empty),
                                            static_cast<int32_t>(interned.size()));
    if (!added) return it->second;
    const std::string& tensor = src ? (*copies)[i].src : (*copies)[i].dst;
    absl::StatusOr<TensorRecord> rec = tensors_->Get(tensor);
    if (!rec.ok() || rec->mesh != side.mesh || rec->spec != side.spec || rec->shape != side.shape) {
      return absl::AbortedError(absl::StrCat(Field(i, src), ": tensor '", tensor,
                                             "' changed while transfer '", name,
                                             "' was prepared; try again"));
    }
    absl::StatusOr<Layout> layout = src ? LiveLayout(*rec, liveness) : rec->layout;
    if (!layout.ok()) {
      return absl::Status(layout.status().code(),
                          absl::StrCat(Field(i, src), ": ", layout.status().message()));
    }
    table.layouts.push_back(*std::move(layout));
    return it->second;
  };
  std::vector<bool> keep_empty;
  for (size_t i = 0; i < n; ++i) {
    const TransferSide& src = snap->src[i];
    const TransferSide& dst = snap->dst[i];
    const TransferCopy& c = (*copies)[i];
    // As a Copy: equal shapes, and the dst keeps its dtype (a run converts where the pair
    // may be cast).
    if (absl::Status s = CheckCopyPair(c.src, src.shape, src.dtype, c.dst, dst.shape, dst.dtype);
        !s.ok()) {
      return done(absl::Status(s.code(), absl::StrCat(Field(i, false), ": ", s.message())));
    }
    // Every rank of a dst gets its new buffer (or writes its lent one): each must be alive.
    // One whose worker registered again without the buffer gets a new one (the run repairs
    // the dst); a lent buffer must be lent again first.
    if (!dst.dropped.empty()) {
      if (!dst.unattached.empty()) {
        return done(absl::FailedPreconditionError(
            absl::StrCat(Field(i, false), ": tensor '", c.dst, "' is attached but rank",
                         dst.unattached.size() > 1 ? "s " : " ",
                         absl::StrJoin(dst.unattached, ", "), " has no buffer attached (attach ",
                         dst.unattached.size() > 1 ? "them" : "it", " first)")));
      }
      for (int64_t rank : dst.dropped) {
        if (rank < 0 || rank >= static_cast<int64_t>(workers.size())) {
          return done(absl::FailedPreconditionError(
              absl::StrCat(Field(i, false), ": tensor '", c.dst, "': no worker has rank ", rank)));
        }
        const WorkerRecord& w = workers[rank];
        if (!w.alive) {
          absl::Status dead = w.DeadError("holds a chunk of the dst and is dead");
          return done(absl::Status(dead.code(), absl::StrCat(Field(i, false), ": tensor '", c.dst,
                                                             "': ", dead.message())));
        }
        if (dst.attached) {
          return done(absl::FailedPreconditionError(
              absl::StrCat(Field(i, false), ": tensor '", c.dst, "' is attached but ", w.Describe(),
                           " registered again without its lent buffer (attach it again first)")));
        }
      }
      prepared->repaired.push_back(c.dst);
    }
    absl::StatusOr<int32_t> from = layout_of(i, true);
    if (!from.ok()) return done(from.status());
    absl::StatusOr<int32_t> to = layout_of(i, false);
    if (!to.ok()) return done(to.status());
    keep_empty.resize(table.layouts.size(), false);
    if (dst.attached) keep_empty[*to] = true;
    TransferMemberSpec& m = table.members.emplace_back();
    m.src = c.src;
    m.dst = c.dst;
    m.src_version = src.version;
    m.dst_version = dst.version;
    m.dst_attached = dst.attached;
    m.src_layout = *from;
    m.dst_layout = *to;
    m.dtype = src.dtype;
    if (src.dtype != dst.dtype) m.cast_to = dst.dtype;
    absl::StatusOr<int64_t> bytes = CheckedBytes(dst.shape, ElementSize(dst.dtype));
    if (bytes.ok()) prepared->bytes += *bytes;
  }
  if (absl::Status s = ValidateTransferTable(table); !s.ok()) {
    return done(absl::InternalError(absl::StrCat("transfer '", name, "': ", s.message())));
  }

  // Every rank holding a chunk of a table layout takes part: alive, and staying.
  for (int64_t rank : TransferParticipants(table)) {
    absl::StatusOr<const WorkerRecord*> w = WorkerOfRank(workers, rank);
    if (!w.ok()) return done(w.status());
    if (!(*w)->alive) return done((*w)->DeadError("takes part in the transfer but is dead"));
    if ((*w)->leaving) {
      return done(absl::UnavailableError(
          absl::StrCat((*w)->Describe(),
                       " is leaving the cluster (draining); retry once it is replaced or gone")));
    }
    prepared->participants.push_back((*w)->Endpoint());
    const int64_t b = (*w)->spec.bucket_bytes > 0 ? (*w)->spec.bucket_bytes : kDefaultBucketBytes;
    prepared->default_bucket_bytes =
        prepared->default_bucket_bytes == 0 ? b : std::min(prepared->default_bucket_bytes, b);
  }
  prepared->generation = snap->generation;
  prepared->templates = static_cast<int64_t>(TemplatesOf(table).templates.size());
  prepared->layouts = static_cast<int64_t>(table.layouts.size());
  {
    absl::MutexLock lock(&mu_);
    prepared->id = internal_transfers::TransferId(name, options_.id_namespace, next_preparation_++);
  }

  // The pages: the same bytes for every participant (page 0 also carries the exchange's
  // hosts and incarnations), at most about page_bytes each.
  auto job = std::make_shared<PrepareJob>();
  job->name = name;
  job->done = std::move(done);
  job->prepared = prepared;
  job->start = start;
  job->answers.resize(prepared->participants.size());
  {
    auto page = std::make_shared<v1::PrepareTransferRequest>();
    int64_t bytes = 0;
    auto cut = [&](bool last) {
      page->set_transfer_id(prepared->id);
      page->set_page(static_cast<int32_t>(job->pages.size()));
      page->set_last(last);
      job->pages.push_back(std::move(page));
      page = std::make_shared<v1::PrepareTransferRequest>();
      bytes = 0;
    };
    for (const std::string& host : table.hosts_by_rank) page->add_hosts_by_rank(host);
    for (const WorkerEndpoint& p : prepared->participants) {
      page->add_ranks(p.rank);
      page->add_incarnations(p.incarnation);
    }
    page->set_step_timeout_ms(absl::ToInt64Milliseconds(options_.step_timeout));
    for (size_t l = 0; l < table.layouts.size(); ++l) {
      v1::Layout* out = page->add_layouts();
      *out = TransferLayoutToProto(table.layouts[l], keep_empty[l]);
      bytes += static_cast<int64_t>(out->ByteSizeLong()) + 8;
      if (bytes >= options_.page_bytes) cut(false);
    }
    for (const TransferMemberSpec& m : table.members) {
      v1::TransferMember* out = page->add_members();
      *out = TransferMemberToProto(m);
      bytes += static_cast<int64_t>(out->ByteSizeLong()) + 4;
      if (bytes >= options_.page_bytes) cut(false);
    }
    cut(true);  // The last page may be empty: it says "plan now".
  }
  {
    absl::MutexLock lock(&mu_);
    auto it = transfers_.find(name);
    if (it != transfers_.end()) {
      it->second.preparing = prepared->participants;
      it->second.lost_while_preparing.clear();
    }
  }
  // Earlier preparations of this transfer (before a restart too) go first.
  v1::DropTransferRequest drop;
  drop.set_prefix(absl::StrCat(name, "@"));
  std::shared_ptr<FanIn> fan =
      FanIn::Start(prepared->participants.size(), [this, job](absl::Status) { SendPage(job, 0); });
  for (const WorkerEndpoint& w : prepared->participants) {
    client_->DropTransfer(w, drop, [fan](absl::Status s) { fan->Report(s); });
  }
}

void TransferManager::SendPage(std::shared_ptr<PrepareJob> job, size_t page) {
  std::string lost;
  {
    absl::MutexLock lock(&mu_);
    auto it = transfers_.find(job->name);
    if (it != transfers_.end()) lost = it->second.lost_while_preparing;
  }
  // A participant died: the rest of the pages would be for nothing.
  if (!lost.empty()) return FinishPrepare(job, absl::UnavailableError(lost));
  const std::vector<WorkerEndpoint>& participants = job->prepared->participants;
  const bool last = page + 1 == job->pages.size();
  std::shared_ptr<FanIn> fan =
      FanIn::Start(participants.size(), [this, job, page, last](absl::Status s) {
        if (!s.ok() || last) return FinishPrepare(job, s);
        SendPage(job, page + 1);
      });
  for (size_t i = 0; i < participants.size(); ++i) {
    const WorkerEndpoint& w = participants[i];
    client_->PrepareTransfer(w, job->pages[page],
                             [job, fan, i, w, last](absl::StatusOr<v1::PrepareTransferResponse> r) {
                               if (!r.ok()) return fan->Report(PartError(w, job->name, r.status()));
                               if (last) job->answers[i] = *std::move(r);
                               fan->Report(absl::OkStatus());
                             });
  }
}

void TransferManager::FinishPrepare(std::shared_ptr<PrepareJob> job, absl::Status status) {
  Prepared& p = *job->prepared;
  if (status.ok()) {
    // The answers must add up: what ranks send is what ranks receive is what the plans move
    // (each worker counts the templates it plans first); else they planned differently.
    int64_t sent = 0, received = 0, moved = 0, lower = 0;
    uint64_t digest = 0;
    p.parts.resize(p.participants.size());
    for (size_t i = 0; i < p.participants.size(); ++i) {
      const v1::PrepareTransferResponse& a = job->answers[i];
      Part& part = p.parts[i];
      part.bytes_sent = a.bytes_sent();
      part.bytes_received = a.bytes_received();
      part.target_bytes = a.target_bytes();
      part.replica_key = a.replica_key();
      sent += a.bytes_sent();
      received += a.bytes_received();
      moved += a.total_bytes_moved();
      lower += a.total_lower_bound_bytes();
      p.max_rank_send_bytes = std::max(p.max_rank_send_bytes, a.bytes_sent());
      p.max_rank_recv_bytes = std::max(p.max_rank_recv_bytes, a.bytes_received());
      if (a.plan_digest() != 0 && digest != 0 && a.plan_digest() != digest && status.ok()) {
        status =
            absl::InternalError(absl::StrCat("the workers planned transfer '", job->name,
                                             "' differently: ", Describe(p.participants[i]),
                                             "'s plan digest differs from an earlier worker's"));
      }
      if (a.plan_digest() != 0) digest = a.plan_digest();
      const int64_t rank = p.participants[i].rank;
      if (part.target_bytes > 0) {
        p.demand.buffers[rank] = part.target_bytes;
        // The dsts' old versions go when the run commits.
        p.demand.frees[rank] = part.target_bytes;
      }
      if (const int64_t cap = part.bytes_sent + part.bytes_received; cap > 0) {
        p.demand.staging[rank].push_back(StagingNeed{cap, kBucketsInFlight});
      }
    }
    if (status.ok() && (sent != received || sent != moved)) {
      status = absl::InternalError(
          absl::StrCat("the workers planned transfer '", job->name, "' differently: they send ",
                       sent, " bytes, receive ", received, " and their plans move ", moved));
    }
    p.bytes_moved = moved;
    p.lower_bound_bytes = lower;
  }
  if (status.ok() && options_.admission != nullptr) {
    // A run that could never fit is refused now rather than at every run.
    absl::StatusOr<AdmissionController::Grant> probe = options_.admission->Request(
        absl::StrCat("transfer '", job->name, "'"), p.demand, /*may_wait=*/true, [](int64_t) {},
        [](const absl::Status&) {});
    if (probe.ok()) {
      options_.admission->Release(probe->ticket);
    } else {
      status = probe.status();
    }
  }
  if (!status.ok()) {
    // A preparation that succeeded keeps `preparing` until it is installed: a death before
    // then still invalidates it (CreatePrepared, OnRunPrepared).
    absl::MutexLock lock(&mu_);
    auto it = transfers_.find(job->name);
    if (it != transfers_.end()) {
      it->second.preparing.clear();
      it->second.lost_while_preparing.clear();
    }
  }
  p.seconds = absl::ToDoubleSeconds(clock_->Now() - job->start);
  if (options_.metrics != nullptr) {
    options_.metrics->transfer_prepare_seconds->WithLabels({status.ok() ? "ok" : "failed"})
        ->Observe(p.seconds);
  }
  PreparedCallback done = std::move(job->done);
  if (!status.ok()) {
    v1::DropTransferRequest drop;
    drop.add_transfer_ids(p.id);
    DropParts(p.participants, drop);
    return done(status);
  }
  done(std::shared_ptr<const Prepared>(job->prepared));
}

void TransferManager::DropParts(const std::vector<WorkerEndpoint>& workers,
                                const v1::DropTransferRequest& request) {
  for (const WorkerEndpoint& w : workers) client_->DropTransfer(w, request, [](absl::Status) {});
}

}  // namespace shardcoord
