#include "worker/plans/fused_exchange.h"

#include <algorithm>
#include <memory>
#include <optional>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "sharding/fused_stream.h"
#include "worker/plans/fragment.h"
#include "worker/plans/mover.h"

namespace shardcoord {
namespace {

using executor_internal::CheckBuffers;
using executor_internal::Mover;
using executor_internal::SpaceSyncedCommunicator;
using executor_internal::SpecOf;
using executor_internal::Staging;

// A transfer of the stream with the member it belongs to.
struct Entry {
  int member = 0;
  const Transfer* transfer = nullptr;
};

// How one message moves on this rank, decided before anything is sent so that the staging
// areas are allocated once.
enum class Via { kInPlace, kRuns, kStaged };
struct MessagePlan {
  Via via = Via::kStaged;
  const char* source = nullptr;           // kInPlace sends: where it lies.
  std::optional<Mover::Landing> landing;  // kInPlace receives: where it lands.
  int64_t staged_offset = 0;              // kStaged: in its window's staging area.
};

// One direction of one round: the stream, its messages and windows.
struct Stream {
  int peer = -1;  // Group rank.
  std::vector<Entry> entries;
  std::vector<StreamMessage> messages;
  std::vector<size_t> windows;  // First message of each.
  int64_t bytes = 0;

  // Messages [begin, end) of window w (empty past the last window).
  std::pair<size_t, size_t> Window(size_t w) const {
    if (w >= windows.size()) return {0, 0};
    return {windows[w], w + 1 < windows.size() ? windows[w + 1] : messages.size()};
  }
};

struct ScheduledRound {
  int r = 0;
  Stream send, recv;
};

// A run's decisions for one round's messages, index for index with its streams'.
struct RoundPlans {
  std::vector<MessagePlan> send, recv;
};

std::string MemberName(const FragmentMember& m) {
  return absl::StrCat("member ", m.index, " (plan ", m.plan_id, ", tensor '", m.target_tensor,
                      "')");
}

absl::Status Annotate(const absl::Status& s, const std::string& where) {
  return absl::Status(s.code(), absl::StrCat(where, ": ", s.message()));
}

}  // namespace

struct GroupSchedule {
  const Fragment* fragment = nullptr;
  int64_t bucket_bytes = 0;
  std::vector<bool> reducing;          // Per member: something reduces into its target.
  int64_t bytes_total = 0;             // Received over the exchange.
  std::vector<ScheduledRound> rounds;  // Those with messages either way, in order.
};

GroupScheduleCache::GroupScheduleCache() = default;
GroupScheduleCache::~GroupScheduleCache() = default;

std::shared_ptr<const GroupSchedule> GroupScheduleCache::Find(const Fragment* fragment,
                                                              int64_t bucket_bytes) {
  absl::MutexLock lock(&mu_);
  if (schedule_ == nullptr || schedule_->fragment != fragment ||
      schedule_->bucket_bytes != bucket_bytes) {
    return nullptr;
  }
  return schedule_;
}

void GroupScheduleCache::Keep(std::shared_ptr<const GroupSchedule> schedule) {
  absl::MutexLock lock(&mu_);
  schedule_ = std::move(schedule);
}

namespace {

// Group rank of `rank` among the sorted exchange ranks.
int GroupRank(const Fragment& g, int64_t rank) {
  return static_cast<int>(std::lower_bound(g.exchange_ranks.begin(), g.exchange_ranks.end(), rank) -
                          g.exchange_ranks.begin());
}

// This rank's place among the exchange ranks, or -1.
int MyGroupRank(const Fragment& g) {
  const auto mine = std::lower_bound(g.exchange_ranks.begin(), g.exchange_ranks.end(), g.rank);
  return mine != g.exchange_ranks.end() && *mine == g.rank
             ? static_cast<int>(mine - g.exchange_ranks.begin())
             : -1;
}

// Every member's transfers sorted into the streams to and from each peer (in member, then plan
// order), each stream cut into messages and windows.
std::shared_ptr<const GroupSchedule> MakeSchedule(const Fragment& g, const StreamLimits& limits) {
  auto schedule = std::make_shared<GroupSchedule>();
  schedule->fragment = &g;
  schedule->bucket_bytes = limits.bucket_bytes;
  const size_t nm = g.members.size();
  const int n = static_cast<int>(g.exchange_ranks.size());
  const int me = MyGroupRank(g);
  schedule->reducing.assign(nm, false);
  std::vector<std::vector<Entry>> out(std::max(n, 0)), in(std::max(n, 0));
  for (size_t i = 0; i < nm; ++i) {
    const FragmentShape& f = g.shape_of(i);
    bool reducing = false;
    for (const LocalCopy& c : f.local_copies) reducing |= c.reduce;
    for (const Transfer& t : f.transfers) {
      if (t.bytes == 0) continue;
      if (t.src == g.rank) {
        out[GroupRank(g, t.dst)].push_back(Entry{static_cast<int>(i), &t});
      } else {
        in[GroupRank(g, t.src)].push_back(Entry{static_cast<int>(i), &t});
        reducing |= t.reduce;
        schedule->bytes_total += t.bytes;
      }
    }
    schedule->reducing[i] = reducing;
  }
  if (me < 0 || n <= 1) return schedule;
  auto cut = [&](Stream& s, std::vector<Entry> entries, int peer) {
    s.peer = peer;
    s.entries = std::move(entries);
    std::vector<StreamItem> items;
    items.reserve(s.entries.size());
    for (const Entry& e : s.entries) {
      // Transfers travel in the wire dtype (the narrower of source and target when casting).
      const DType wire = g.shape_of(static_cast<size_t>(e.member)).wire_dtype();
      items.push_back(StreamItem{e.transfer->box, ElementSize(wire)});
      s.bytes += e.transfer->bytes;
    }
    s.messages = CutStream(items, limits);
    s.windows = CutWindows(s.messages, limits);
  };
  for (int r = 1; r < n; ++r) {
    ScheduledRound round;
    round.r = r;
    cut(round.send, std::move(out[(me + r) % n]), (me + r) % n);
    cut(round.recv, std::move(in[(me - r + n) % n]), (me - r + n) % n);
    if (round.send.messages.empty() && round.recv.messages.empty()) continue;
    schedule->rounds.push_back(std::move(round));
  }
  return schedule;
}

}  // namespace

uint32_t ExchangeTag(const std::string& plan_id, int round, int window) {
  uint32_t h = 2166136261u;
  for (char c : absl::StrCat(plan_id, "/x", round, ".", window)) {
    h ^= static_cast<unsigned char>(c);
    h *= 16777619u;
  }
  return h;
}

absl::StatusOr<GroupExecuteResult> ExecuteGroup(const GroupExecuteInput& input) {
  const Fragment& g = *input.fragment;
  const size_t nm = g.members.size();
  if (input.buffers.size() != nm) {
    return absl::InvalidArgumentError(
        absl::StrCat(input.buffers.size(), " buffer pairs for ", nm, " group members"));
  }
  if (absl::Status s = ValidateFragment(g); !s.ok()) return s;
  if (!g.fused) {
    return absl::InvalidArgumentError(
        absl::StrCat("plan ", g.plan_id, " is not fused: it runs its steps in order"));
  }
  MemorySpace* space = nullptr;
  for (size_t i = 0; i < nm; ++i) {
    const FragmentMember& m = g.members[i];
    const GroupMemberBuffers& b = input.buffers[i];
    if (absl::Status s = CheckBuffers(g.shapes[m.shape], m.tensor, m.source_version,
                                      m.target_tensor, b.source, b.target);
        !s.ok()) {
      return Annotate(s, MemberName(m));
    }
    if (space == nullptr) space = &b.target->space();
    if (&b.target->space() != space) {
      return absl::FailedPreconditionError(
          absl::StrCat(MemberName(m), ": its target buffer is in ", b.target->space().name(),
                       " but another member's is in ", space->name()));
    }
  }
  auto cancelled = [&] { return input.cancel != nullptr && input.cancel->cancelled(); };
  const absl::Duration timeout = g.step_timeout_ms > 0 ? absl::Milliseconds(g.step_timeout_ms)
                                                       : input.options.default_step_timeout;
  const StreamLimits limits =
      StreamLimitsFor(g.bucket_bytes > 0 ? g.bucket_bytes : input.options.bucket_bytes);

  GroupExecuteResult result;
  result.bucket_bytes = limits.bucket_bytes;
  const int n = static_cast<int>(g.exchange_ranks.size());
  const int me = MyGroupRank(g);

  std::shared_ptr<const GroupSchedule> schedule =
      input.schedule_cache != nullptr ? input.schedule_cache->Find(&g, limits.bucket_bytes)
                                      : nullptr;
  if (schedule == nullptr) {
    schedule = MakeSchedule(g, limits);
    if (input.schedule_cache != nullptr) input.schedule_cache->Keep(schedule);
  }
  const int64_t bytes_total = schedule->bytes_total;

  // Per member: its mover, with the reduction rule's identity where anything reduces.
  std::vector<Mover> movers;  // One allocation for all members, not one each.
  movers.reserve(nm);
  for (size_t i = 0; i < nm; ++i) {
    movers.emplace_back(g.shape_of(i), input.buffers[i].source, input.buffers[i].target);
    if (absl::Status s = movers.back().Initialise(schedule->reducing[i]); !s.ok()) {
      return Annotate(s, MemberName(g.members[i]));
    }
  }
  // Local copies touch only elements no transfer writes (or combine commutatively), so they
  // run while the first window is on the wire.
  auto local_copies = [&]() -> absl::Status {
    for (size_t i = 0; i < nm; ++i) {
      const FragmentShape& f = g.shape_of(i);
      for (size_t j = 0; j < f.local_copies.size(); ++j) {
        if (absl::Status s = movers[i].LocalCopy(f.local_copies[j]); !s.ok()) {
          return Annotate(
              s, absl::StrCat(MemberName(g.members[i]), " local_copies[", j, "] on rank ", g.rank));
        }
      }
    }
    return absl::OkStatus();
  };
  bool local_done = false;

  if (me >= 0 && n > 1) {
    // Every exchange rank builds the communicator, also one with nothing to move: the others
    // meet it in the rendezvous.
    absl::StatusOr<std::shared_ptr<Communicator>> held = input.communicators->Get(
        SpecOf(g.exchange_ranks, g.member_incarnations, g.rank, g.communicator_prefix, timeout));
    if (!held.ok()) {
      return Annotate(held.status(),
                      absl::StrCat("fused exchange over ranks [",
                                   absl::StrJoin(g.exchange_ranks, ","), "] on rank ", g.rank));
    }
    std::optional<SpaceSyncedCommunicator> synced;  // Device buffers only.
    Communicator* comm = held->get();
    if (!space->is_host()) comm = &synced.emplace(comm, space);

    // How each message moves here: from where it lies, from strided rows, or staged (the
    // buffers' addresses are this run's).
    const std::vector<ScheduledRound>& rounds = schedule->rounds;
    std::vector<RoundPlans> plans(rounds.size());
    int64_t send_area = 0, recv_area = 0;
    for (size_t k = 0; k < rounds.size(); ++k) {
      const ScheduledRound& round = rounds[k];
      plans[k].send.resize(round.send.messages.size());
      plans[k].recv.resize(round.recv.messages.size());
      for (size_t w = 0; w < round.send.windows.size(); ++w) {
        int64_t staged = 0;
        auto [begin, end] = round.send.Window(w);
        for (size_t j = begin; j < end; ++j) {
          const StreamMessage& m = round.send.messages[j];
          MessagePlan& p = plans[k].send[j];
          if (m.pieces.size() == 1) {
            const Entry& e = round.send.entries[m.pieces[0].item];
            const Mover& mover = movers[e.member];
            p.source = mover.DirectSource(m.pieces[0].box, e.transfer->partial_index);
            if (p.source != nullptr) {
              p.via = Via::kInPlace;
              continue;
            }
            // Runs are the source's own bytes: not when the sender converts them first.
            if (space->is_host() && !mover.SenderConverts() &&
                comm->SendsFromRuns(round.send.peer, m.bytes)) {
              p.via = Via::kRuns;
              continue;
            }
          }
          p.via = Via::kStaged;
          p.staged_offset = staged;
          staged += m.bytes;
        }
        send_area = std::max(send_area, staged);
      }
      for (size_t w = 0; w < round.recv.windows.size(); ++w) {
        int64_t staged = 0;
        auto [begin, end] = round.recv.Window(w);
        for (size_t j = begin; j < end; ++j) {
          const StreamMessage& m = round.recv.messages[j];
          MessagePlan& p = plans[k].recv[j];
          if (m.pieces.size() == 1) {
            const Entry& e = round.recv.entries[m.pieces[0].item];
            p.landing = movers[e.member].DirectTarget(m.pieces[0].box, e.transfer->reduce,
                                                      e.transfer->partial_index);
            if (p.landing.has_value()) {
              p.via = Via::kInPlace;
              continue;
            }
          }
          p.via = Via::kStaged;
          p.staged_offset = staged;
          staged += m.bytes;
        }
        recv_area = std::max(recv_area, staged);
      }
    }

    Staging send_staging(*space, send_area), recv_staging(*space, recv_area);
    if (!send_staging.ok(send_area) || !recv_staging.ok(recv_area)) {
      return absl::ResourceExhaustedError(
          absl::StrCat("rank ", g.rank, " cannot allocate ", send_area + recv_area,
                       " bytes of staging memory for plan ", g.plan_id, " (bucket_bytes ",
                       limits.bucket_bytes, ")"));
    }
    result.staging_bytes = send_area + recv_area;

    for (size_t k = 0; k < rounds.size(); ++k) {
      const ScheduledRound& round = rounds[k];
      const Stream& send = round.send;
      const Stream& recv = round.recv;
      ExchangeRound report;
      report.round = round.r;
      report.start = absl::Now();
      if (!send.messages.empty()) report.send_peer = g.exchange_ranks[send.peer];
      if (!recv.messages.empty()) report.recv_peer = g.exchange_ranks[recv.peer];
      const std::string where =
          absl::StrCat("fused exchange round ", round.r, " (to rank ", report.send_peer,
                       ", from rank ", report.recv_peer, ") on rank ", g.rank);
      const size_t windows = std::max(send.windows.size(), recv.windows.size());
      for (size_t w = 0; w < windows; ++w) {
        if (cancelled()) {
          return absl::AbortedError(absl::StrCat("plan ", g.plan_id, " cancelled before ", where));
        }
        std::vector<SendOp> sends;
        std::vector<RecvOp> recvs;
        auto [sbegin, send_end] = send.Window(w);
        for (size_t j = sbegin; j < send_end; ++j) {
          const StreamMessage* m = &send.messages[j];
          const MessagePlan& p = plans[k].send[j];
          SendOp op{send.peer, p.source, m->bytes, nullptr};
          if (m->pieces.size() > 1) ++result.messages_packed;
          if (p.via == Via::kRuns) {
            ++result.messages_from_rows;
            const Entry& e = send.entries[m->pieces[0].item];
            op.runs = movers[e.member].SourceRuns(m->pieces[0].box, e.transfer->partial_index);
            if (op.runs.empty()) {
              return absl::InternalError(
                  absl::StrCat(where, ": no source rows for ", m->pieces[0].box.ToString()));
            }
            op.data = op.runs.front().first;
          } else if (p.via == Via::kStaged) {
            char* base = send_staging.data() + p.staged_offset;
            op.data = base;
            op.prepare = [m, base, &send, &movers]() -> absl::Status {
              for (const StreamPiece& piece : m->pieces) {
                const Entry& e = send.entries[piece.item];
                if (absl::Status s = movers[e.member].Pack(piece.box, e.transfer->partial_index,
                                                           base + piece.offset);
                    !s.ok()) {
                  return s;
                }
              }
              return absl::OkStatus();
            };
          }
          sends.push_back(std::move(op));
        }
        auto [rbegin, recv_end] = recv.Window(w);
        for (size_t j = rbegin; j < recv_end; ++j) {
          const StreamMessage* m = &recv.messages[j];
          const MessagePlan& p = plans[k].recv[j];
          RecvOp op{recv.peer, nullptr, m->bytes, nullptr};
          if (p.via == Via::kInPlace) {
            ++result.messages_landed_in_place;
            Mover* mover = &movers[recv.entries[m->pieces[0].item].member];
            op.data = mover->Data(*p.landing);
            op.done = [mover, landing = *p.landing] {
              mover->Landed(landing);
              return absl::OkStatus();
            };
          } else {
            char* base = recv_staging.data() + p.staged_offset;
            op.data = base;
            op.done = [m, base, &recv, &movers]() -> absl::Status {
              for (const StreamPiece& piece : m->pieces) {
                const Entry& e = recv.entries[piece.item];
                const Transfer& t = *e.transfer;
                if (absl::Status s = movers[e.member].Apply(piece.box, base + piece.offset,
                                                            piece.box, t.reduce, t.partial_index);
                    !s.ok()) {
                  return s;
                }
              }
              return absl::OkStatus();
            };
          }
          recvs.push_back(std::move(op));
        }
        CommOptions options;
        options.tag = ExchangeTag(g.plan_id, round.r, static_cast<int>(w));
        options.timeout = timeout;
        options.cancel = input.cancel;
        if (!local_done) {
          options.while_waiting = local_copies;
          local_done = true;
        }
        if (absl::Status s = SendRecvWithHooks(*comm, sends, recvs, options); !s.ok()) {
          return Annotate(s, absl::StrCat(where, ", window ", w));
        }
      }
      report.bytes_sent = send.bytes;
      report.bytes_received = recv.bytes;
      report.buckets_sent = static_cast<int64_t>(send.messages.size());
      report.buckets_received = static_cast<int64_t>(recv.messages.size());
      report.windows = static_cast<int64_t>(windows);
      report.time = absl::Now() - report.start;
      result.bytes_sent += report.bytes_sent;
      result.bytes_received += report.bytes_received;
      result.rounds.push_back(report);
      if (input.progress) input.progress(result.bytes_received, bytes_total);
    }
  }
  if (!local_done) {
    if (absl::Status s = local_copies(); !s.ok()) return s;
  }
  if (cancelled()) return absl::AbortedError(absl::StrCat("plan ", g.plan_id, " cancelled"));
  for (size_t i = 0; i < nm; ++i) {
    if (absl::Status s = movers[i].Divide(); !s.ok()) {
      return Annotate(s, absl::StrCat(MemberName(g.members[i]), " divide_by"));
    }
  }
  if (space != nullptr) {
    if (absl::Status s = space->Synchronize(); !s.ok()) return Annotate(s, space->name());
  }
  result.members.resize(nm);
  if (space != nullptr && !space->is_host()) {
    // Every member's chunks in one device checksum: each chunk's 1 MiB blocks hash serially
    // (~2 ms per block on an H200), so member after member would add those up.
    std::vector<ChecksumRegion> regions;
    std::vector<size_t> first(nm + 1, 0);
    for (size_t i = 0; i < nm; ++i) {
      first[i] = regions.size();
      for (const ChecksumRegion& r : input.buffers[i].target->ChecksumRegions()) {
        regions.push_back(r);
      }
    }
    first[nm] = regions.size();
    absl::StatusOr<std::vector<uint64_t>> sums = space->ChunkChecksums(regions);
    if (!sums.ok()) return Annotate(sums.status(), "the group's chunk checksums");
    for (size_t i = 0; i < nm; ++i) {
      result.members[i].checksums.assign(sums->begin() + first[i], sums->begin() + first[i + 1]);
    }
    return result;
  }
  for (size_t i = 0; i < nm; ++i) {
    absl::StatusOr<std::vector<uint64_t>> sums = movers[i].Checksums();
    if (!sums.ok()) return Annotate(sums.status(), MemberName(g.members[i]));
    result.members[i].checksums = *std::move(sums);
  }
  return result;
}

}  // namespace shardcoord
