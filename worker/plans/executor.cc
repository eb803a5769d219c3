#include "worker/plans/executor.h"

#include <algorithm>
#include <cstring>
#include <limits>
#include <map>
#include <memory>
#include <optional>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "sharding/box_copy.h"
#include "sharding/staging.h"
#include "worker/buffers/checksum.h"
#include "worker/memory/memory_space.h"
#include "worker/plans/fragment.h"
#include "worker/plans/mover.h"

namespace shardcoord {
namespace {

using executor_internal::BoxBytes;
using executor_internal::CheckBuffers;
using executor_internal::Mover;
using executor_internal::SpaceSyncedCommunicator;
using executor_internal::SpecOf;
using executor_internal::Staging;
using executor_internal::Sum;

// ---------------------------------------------------------------------------------------
// Step analysis: a function of the step only, so every member reaches the same decision.

struct StepShape {
  StepOp method = StepOp::kPointToPoint;
  int n = 0;
  absl::flat_hash_map<int64_t, int> group_rank;  // Global rank -> position in step.ranks.
  // kAllGather: the boxes group rank g contributes (empty for non-senders).
  // kBroadcast: boxes[root] is what the root sends.
  // kAllReduce: boxes[g] is the common box list for every g.
  // kReduceScatter: boxes[g] is what receiver g gets (empty for non-receivers).
  std::vector<std::vector<Box>> boxes;
  std::vector<int64_t> partial;  // Reducing methods: contribution of group rank g.
};

using PairBoxes = std::map<std::pair<int, int>, std::vector<Box>>;

// Sorted box lists per (src, dst) group-rank pair; false if a transfer leaves the group.
bool CollectPairs(const Step& step, const StepShape& shape, PairBoxes* pairs) {
  for (const Transfer& t : step.transfers) {
    auto s = shape.group_rank.find(t.src);
    auto d = shape.group_rank.find(t.dst);
    if (s == shape.group_rank.end() || d == shape.group_rank.end()) return false;
    (*pairs)[{s->second, d->second}].push_back(t.box);
  }
  for (auto& [key, boxes] : *pairs) std::sort(boxes.begin(), boxes.end());
  return true;
}

const std::vector<Box>* Boxes(const PairBoxes& pairs, int a, int b) {
  auto it = pairs.find({a, b});
  return it == pairs.end() ? nullptr : &it->second;
}

// The boxes `member` sends to `other` when `sends`, else those `other` sends it.
const std::vector<Box>* PairOf(const PairBoxes& pairs, int member, int other, bool sends) {
  return sends ? Boxes(pairs, member, other) : Boxes(pairs, other, member);
}

// Whether `member` sends to (when `sends`, else receives from) any other of the `n` members.
bool AnyPeer(const PairBoxes& pairs, int n, int member, bool sends) {
  for (int o = 0; o < n; ++o) {
    if (o != member && PairOf(pairs, member, o, sends) != nullptr) return true;
  }
  return false;
}

// The one box list `member` sends to (when `sends`, else receives from) every other of the
// `n` members; null when a peer has no boxes or the lists differ.
const std::vector<Box>* CommonBoxes(const PairBoxes& pairs, int n, int member, bool sends) {
  const std::vector<Box>* first = nullptr;
  for (int o = 0; o < n; ++o) {
    if (o == member) continue;
    const std::vector<Box>* b = PairOf(pairs, member, o, sends);
    if (b == nullptr) return nullptr;
    if (first == nullptr) first = b;
    if (*b != *first) return nullptr;
  }
  return first;
}

// Every member sends transfers of exactly one contribution, distinct across members.
bool OnePartialPerMember(const Step& step, StepShape* shape) {
  shape->partial.assign(shape->n, -1);
  for (const Transfer& t : step.transfers) {
    if (!t.reduce) return false;
    int64_t& p = shape->partial[shape->group_rank.at(t.src)];
    if (p >= 0 && p != t.partial_index) return false;
    p = t.partial_index;
  }
  absl::flat_hash_set<int64_t> seen;
  for (int64_t p : shape->partial) {
    if (p < 0 || !seen.insert(p).second) return false;
  }
  return true;
}

bool AnyReduce(const Step& step) {
  for (const Transfer& t : step.transfers) {
    if (t.reduce) return true;
  }
  return false;
}

bool MatchAllGather(const Step& step, StepShape* shape) {
  if (AnyReduce(step)) return false;
  PairBoxes pairs;
  if (!CollectPairs(step, *shape, &pairs)) return false;
  shape->boxes.assign(shape->n, {});
  for (int g = 0; g < shape->n; ++g) {
    if (!AnyPeer(pairs, shape->n, g, /*sends=*/true)) continue;
    const std::vector<Box>* boxes = CommonBoxes(pairs, shape->n, g, /*sends=*/true);
    if (boxes == nullptr) return false;
    shape->boxes[g] = *boxes;
  }
  return true;
}

bool MatchBroadcast(const Step& step, StepShape* shape) {
  if (AnyReduce(step)) return false;
  auto r = shape->group_rank.find(step.root);
  if (r == shape->group_rank.end()) return false;
  const int root = r->second;
  PairBoxes pairs;
  if (!CollectPairs(step, *shape, &pairs)) return false;
  const std::vector<Box>* sent = CommonBoxes(pairs, shape->n, root, /*sends=*/true);
  if (sent == nullptr) return false;
  for (const auto& [key, boxes] : pairs) {
    if (key.first != root) return false;
  }
  shape->boxes.assign(shape->n, {});
  shape->boxes[root] = *sent;
  return true;
}

bool MatchReduceScatter(const Step& step, StepShape* shape, bool require_all_receive) {
  if (shape->n < 2 || !OnePartialPerMember(step, shape)) return false;
  PairBoxes pairs;
  if (!CollectPairs(step, *shape, &pairs)) return false;
  shape->boxes.assign(shape->n, {});
  for (int d = 0; d < shape->n; ++d) {
    if (!AnyPeer(pairs, shape->n, d, /*sends=*/false)) {
      if (require_all_receive) return false;
      continue;
    }
    const std::vector<Box>* boxes = CommonBoxes(pairs, shape->n, d, /*sends=*/false);
    if (boxes == nullptr) return false;
    shape->boxes[d] = *boxes;
  }
  if (require_all_receive) {
    for (int d = 1; d < shape->n; ++d) {
      if (shape->boxes[d] != shape->boxes[0]) return false;
    }
  }
  return true;
}

StepShape AnalyzeStep(const Step& step, bool force_point_to_point) {
  StepShape shape;
  shape.n = static_cast<int>(step.ranks.size());
  for (int g = 0; g < shape.n; ++g) shape.group_rank[step.ranks[g]] = g;
  if (force_point_to_point || shape.n < 2 || static_cast<int>(shape.group_rank.size()) != shape.n) {
    return shape;
  }
  bool ok = false;
  switch (step.op) {
    case StepOp::kAllGather:
      ok = MatchAllGather(step, &shape);
      break;
    case StepOp::kBroadcast:
      ok = MatchBroadcast(step, &shape);
      break;
    case StepOp::kAllReduce:
      ok = MatchReduceScatter(step, &shape, true);
      break;
    case StepOp::kReduceScatter:
      ok = MatchReduceScatter(step, &shape, false);
      break;
    case StepOp::kAllToAll: {
      // Any pattern is an alltoallv; only the group must hold every transfer's ends.
      PairBoxes pairs;
      ok = CollectPairs(step, shape, &pairs);
      break;
    }
    case StepOp::kPointToPoint:
      break;
  }
  if (ok) shape.method = step.op;
  return shape;
}

// ---------------------------------------------------------------------------------------
// Staging limits.

// The most staging memory any member holds when `step` runs as `shape.method` (the buffers
// StepRunner allocates for it): a function of the step alone, so every member decides alike
// whether the collective fits the plan's staging limit.
int64_t CollectiveStaging(const Step& step, const StepShape& shape, int64_t esize) {
  int64_t sum = 0, most = 0;
  switch (shape.method) {
    case StepOp::kAllGather:
    case StepOp::kAllReduce:
    case StepOp::kReduceScatter:
      for (const std::vector<Box>& boxes : shape.boxes) {
        const int64_t b = BoxBytes(boxes, esize);
        sum += b;
        most = std::max(most, b);
      }
      // All-gather: own send + every piece; all-reduce: own boxes; reduce-scatter: every
      // piece sent + own piece received.
      return shape.method == StepOp::kAllReduce ? most : sum + most;
    case StepOp::kBroadcast:
      return BoxBytes(shape.boxes[shape.group_rank.at(step.root)], esize);
    case StepOp::kAllToAll: {
      absl::flat_hash_map<int64_t, int64_t> per_rank;
      for (const Transfer& t : step.transfers) {
        most = std::max(most, per_rank[t.src] += t.bytes);
        most = std::max(most, per_rank[t.dst] += t.bytes);
      }
      return most;
    }
    case StepOp::kPointToPoint:
      return 0;
  }
  return 0;
}

// ---------------------------------------------------------------------------------------
// One step.

class StepRunner {
 public:
  StepRunner(const FragmentShape& f, const Step& step, const StepShape& shape, Mover* mover,
             Communicator* comm, const CommOptions& options, int64_t message_bytes,
             int64_t staging_limit)
      : f_(f),
        step_(step),
        shape_(shape),
        mover_(mover),
        comm_(comm),
        options_(options),
        me_(shape.group_rank.at(f.rank)),
        esize_(mover->esize()),
        message_bytes_(message_bytes),
        staging_limit_(staging_limit) {}

  absl::Status Run() {
    switch (shape_.method) {
      case StepOp::kAllGather:
        return AllGather();
      case StepOp::kBroadcast:
        return Broadcast();
      case StepOp::kAllToAll:
        return AllToAll();
      case StepOp::kAllReduce:
        return AllReduce();
      case StepOp::kReduceScatter:
        return ReduceScatter();
      case StepOp::kPointToPoint:
        return SendRecv();
    }
    return absl::InternalError("unknown step method");
  }

 private:
  absl::Status PackBoxes(const std::vector<Box>& boxes, int64_t partial, char* out) {
    for (const Box& b : boxes) {
      if (absl::Status s = mover_->Pack(b, partial, out); !s.ok()) return s;
      out += b.Volume() * esize_;
    }
    return absl::OkStatus();
  }

  absl::Status ApplyBoxes(const std::vector<Box>& boxes, const char* data, bool reduce,
                          int64_t partial) {
    for (const Box& b : boxes) {
      if (absl::Status s = mover_->Apply(b, data, b, reduce, partial); !s.ok()) return s;
      data += b.Volume() * esize_;
    }
    return absl::OkStatus();
  }

  // The partial index of the transfers a member sends (all equal for plain copies).
  int64_t PartialFrom(int g) const {
    for (const Transfer& t : step_.transfers) {
      if (shape_.group_rank.at(t.src) == g) return t.partial_index;
    }
    return 0;
  }

  absl::Status AllGather() {
    std::vector<int64_t> counts(shape_.n);
    for (int g = 0; g < shape_.n; ++g) counts[g] = BoxBytes(shape_.boxes[g], esize_);
    Staging send(mover_->space(), counts[me_]), recv(mover_->space(), Sum(counts));
    if (!send.ok(counts[me_]) || !recv.ok(Sum(counts))) {
      return OutOfMemory(Sum(counts), send.ok(counts[me_]) ? &recv : &send);
    }
    if (absl::Status s = PackBoxes(shape_.boxes[me_], PartialFrom(me_), send.data()); !s.ok()) {
      return s;
    }
    absl::Status s = comm_->AllGatherV(send.data(), counts[me_], recv.data(), counts, options_);
    if (!s.ok()) return s;
    const char* p = recv.data();
    for (int g = 0; g < shape_.n; ++g) {
      if (g != me_) {
        if (absl::Status a = ApplyBoxes(shape_.boxes[g], p, false, PartialFrom(g)); !a.ok()) {
          return a;
        }
      }
      p += counts[g];
    }
    return absl::OkStatus();
  }

  absl::Status Broadcast() {
    const int root = shape_.group_rank.at(step_.root);
    const std::vector<Box>& boxes = shape_.boxes[root];
    const int64_t bytes = BoxBytes(boxes, esize_);
    Staging data(mover_->space(), bytes);
    if (!data.ok(bytes)) return OutOfMemory(bytes, &data);
    const int64_t partial = PartialFrom(root);
    if (me_ == root) {
      if (absl::Status s = PackBoxes(boxes, partial, data.data()); !s.ok()) return s;
    }
    absl::Status s = comm_->Broadcast(data.data(), bytes, root, options_);
    if (!s.ok()) return s;
    if (me_ == root) {
      return absl::OkStatus();
    }
    return ApplyBoxes(boxes, data.data(), false, partial);
  }

  absl::Status AllToAll() {
    std::vector<int64_t> send_bytes(shape_.n, 0), recv_bytes(shape_.n, 0);
    std::vector<std::vector<const Transfer*>> out(shape_.n), in(shape_.n);
    for (const Transfer& t : step_.transfers) {
      const int s = shape_.group_rank.at(t.src), d = shape_.group_rank.at(t.dst);
      if (s == me_) {
        out[d].push_back(&t);
        send_bytes[d] += t.bytes;
      }
      if (d == me_) {
        in[s].push_back(&t);
        recv_bytes[s] += t.bytes;
      }
    }
    Staging send(mover_->space(), Sum(send_bytes)), recv(mover_->space(), Sum(recv_bytes));
    if (!send.ok(Sum(send_bytes)) || !recv.ok(Sum(recv_bytes))) {
      return OutOfMemory(Sum(send_bytes) + Sum(recv_bytes),
                         send.ok(Sum(send_bytes)) ? &recv : &send);
    }
    char* p = send.data();
    for (int g = 0; g < shape_.n; ++g) {
      for (const Transfer* t : out[g]) {
        if (absl::Status s = mover_->Pack(t->box, t->partial_index, p); !s.ok()) return s;
        p += t->bytes;
      }
    }
    absl::Status s = comm_->AllToAllV(send.data(), send_bytes, recv.data(), recv_bytes, options_);
    if (!s.ok()) return s;
    const char* q = recv.data();
    for (int g = 0; g < shape_.n; ++g) {
      for (const Transfer* t : in[g]) {
        if (absl::Status a = mover_->Apply(t->box, q, t->box, t->reduce, t->partial_index);
            !a.ok()) {
          return a;
        }
        q += t->bytes;
      }
    }
    return absl::OkStatus();
  }

  absl::Status AllReduce() {
    const std::vector<Box>& boxes = shape_.boxes[me_];
    const int64_t bytes = BoxBytes(boxes, esize_);
    Staging data(mover_->space(), bytes);
    if (!data.ok(bytes)) return OutOfMemory(bytes, &data);
    if (absl::Status s = PackBoxes(boxes, shape_.partial[me_], data.data()); !s.ok()) return s;
    absl::Status s = comm_->AllReduce(data.data(), data.data(), bytes / esize_, f_.dtype,
                                      mover_->op(), options_);
    if (!s.ok()) return s;
    return ApplyBoxes(boxes, data.data(), true, shape_.partial[me_]);
  }

  absl::Status ReduceScatter() {
    std::vector<int64_t> elements(shape_.n);
    for (int g = 0; g < shape_.n; ++g) elements[g] = BoxBytes(shape_.boxes[g], esize_) / esize_;
    Staging send(mover_->space(), Sum(elements) * esize_),
        recv(mover_->space(), elements[me_] * esize_);
    if (!send.ok(Sum(elements) * esize_) || !recv.ok(elements[me_] * esize_)) {
      return OutOfMemory(Sum(elements) * esize_, send.ok(Sum(elements) * esize_) ? &recv : &send);
    }
    char* p = send.data();
    for (int g = 0; g < shape_.n; ++g) {
      if (absl::Status s = PackBoxes(shape_.boxes[g], shape_.partial[me_], p); !s.ok()) return s;
      p += elements[g] * esize_;
    }
    absl::Status s =
        comm_->ReduceScatterV(send.data(), recv.data(), elements, f_.dtype, mover_->op(), options_);
    if (!s.ok()) return s;
    return ApplyBoxes(shape_.boxes[me_], recv.data(), true, shape_.partial[me_]);
  }

  // Every transfer goes as slabs of at most message_bytes_ (SplitIntoSlabs; both ends cut
  // alike), posted round-robin over the peers, so the first bytes leave after one slab is
  // packed rather than after a whole piece, every peer gets data from the start, and each
  // slab is hashed into the target's checksum as soon as it lands. Slabs land directly in the
  // target chunk when one chunk takes them contiguously, and leave straight from a source
  // chunk when they are contiguous there; the others are packed just before their send is
  // posted and unpacked as soon as they arrive. The exchange runs in windows
  // (AssignMessageWindows over every transfer's slabs, so every member cuts it alike) in which
  // no rank sends plus receives more than staging_limit_, so the staging held at once is
  // bounded by the plan's buckets however large the step.
  absl::Status SendRecv() {
    std::vector<Slab> slabs;
    std::map<std::pair<int, int>, std::vector<size_t>> pairs;  // Group ranks -> slabs, in order.
    for (const Transfer& t : step_.transfers) {
      for (Box& b : SplitIntoSlabs(t.box, esize_, message_bytes_)) {
        pairs[{shape_.group_rank.at(t.src), shape_.group_rank.at(t.dst)}].push_back(slabs.size());
        const int64_t bytes = b.Volume() * esize_;
        slabs.push_back(Slab{&t, std::move(b), bytes});
      }
    }
    // Windows are filled in the order slabs are posted (round j of every pair, peers in ring
    // order), so each window has every rank sending and receiving, not some ranks only.
    std::vector<size_t> order;
    std::vector<WindowMessage> messages;
    size_t rounds = 0;
    for (const auto& [pair, list] : pairs) rounds = std::max(rounds, list.size());
    for (size_t j = 0; j < rounds; ++j) {
      for (int k = 1; k < shape_.n; ++k) {
        for (int src = 0; src < shape_.n; ++src) {
          auto it = pairs.find({src, (src + k) % shape_.n});
          if (it == pairs.end() || j >= it->second.size()) continue;
          const Slab& slab = slabs[it->second[j]];
          order.push_back(it->second[j]);
          messages.push_back(WindowMessage{slab.t->src, slab.t->dst, slab.bytes});
        }
      }
    }
    const std::vector<int> assigned = AssignMessageWindows(messages, staging_limit_);
    std::vector<int> windows(slabs.size(), 0);
    for (size_t i = 0; i < order.size(); ++i) windows[order[i]] = assigned[i];
    std::map<int, Window> mine;  // This rank's slabs by window.
    for (size_t i = 0; i < slabs.size(); ++i) {
      const Transfer& t = *slabs[i].t;
      if (t.src != f_.rank && t.dst != f_.rank) continue;
      Window& w = mine[windows[i]];
      if (w.out.empty()) {
        w.out.resize(shape_.n);
        w.in.resize(shape_.n);
      }
      if (t.src == f_.rank) {
        w.out[shape_.group_rank.at(t.dst)].push_back(&slabs[i]);
      } else {
        w.in[shape_.group_rank.at(t.src)].push_back(&slabs[i]);
      }
    }
    CommOptions options = options_;
    if (mine.empty()) return SendRecvWithHooks(*comm_, {}, {}, options);  // Runs while_waiting.
    // One staging buffer for the step, as large as its largest window: windows run one after
    // another, so they reuse it (one allocation per step, of a size the next plan reuses).
    std::vector<std::vector<Post>> posts;
    int64_t staged = 0;
    for (const auto& [index, window] : mine) {
      posts.emplace_back();
      staged = std::max(staged, PlanWindow(window, &posts.back()));
    }
    Staging staging(mover_->space(), staged);
    if (!staging.ok(staged)) return OutOfMemory(staged, &staging);
    for (const std::vector<Post>& window : posts) {
      if (absl::Status s = RunWindow(window, staging.data(), options); !s.ok()) return s;
      options.while_waiting = nullptr;  // Ran during the first window.
    }
    return absl::OkStatus();
  }

  static absl::Status OutOfMemory(int64_t bytes, const Staging* failed = nullptr) {
    const bool why = failed != nullptr && !failed->status().ok();
    return absl::ResourceExhaustedError(
        absl::StrCat("cannot allocate ", bytes, " bytes of staging memory",
                     why ? absl::StrCat(": ", failed->status().message()) : std::string()));
  }

 private:
  struct Slab {
    const Transfer* t;
    Box box;
    int64_t bytes;
  };
  // One window's slabs of this rank, by peer (group rank).
  struct Window {
    std::vector<std::vector<const Slab*>> out, in;
  };

  // One message of a window, as posted.
  struct Post {
    const Slab* slab = nullptr;
    int peer = 0;
    bool send = false;
    const char* source = nullptr;                       // Send straight from a source chunk.
    std::vector<std::pair<const char*, int64_t>> runs;  // Or from its rows (SendsFromRuns).
    std::optional<Mover::Landing> landing;              // Receive straight into a target chunk.
    int64_t offset = -1;                                // Else: where in the window's staging.
  };

  // One window's posts in posting order; returns the staging bytes they need.
  int64_t PlanWindow(const Window& w, std::vector<Post>* out) {
    std::vector<Post>& posts = *out;
    int64_t staged = 0;
    size_t rounds = 0;
    for (int g = 0; g < shape_.n; ++g) rounds = std::max({rounds, w.out[g].size(), w.in[g].size()});
    for (size_t j = 0; j < rounds; ++j) {
      for (int k = 1; k < shape_.n; ++k) {
        const int to = (me_ + k) % shape_.n;  // Peers in ring order, each starting elsewhere.
        if (j < w.out[to].size()) {
          Post p;
          p.slab = w.out[to][j];
          p.peer = to;
          p.send = true;
          p.source = mover_->DirectSource(p.slab->box, p.slab->t->partial_index);
          if (p.source == nullptr && comm_->SendsFromRuns(to, p.slab->bytes)) {
            // Strided in the source: the backend sends from the rows, no staging.
            p.runs = mover_->SourceRuns(p.slab->box, p.slab->t->partial_index);
          }
          if (p.source == nullptr && p.runs.empty()) {
            p.offset = staged;
            staged += p.slab->bytes;
          }
          posts.push_back(std::move(p));
        }
        const int from = (me_ - k + shape_.n) % shape_.n;
        if (j < w.in[from].size()) {
          Post p;
          p.slab = w.in[from][j];
          p.peer = from;
          const Transfer& t = *p.slab->t;
          p.landing = mover_->DirectTarget(p.slab->box, t.reduce, t.partial_index);
          if (!p.landing) {
            p.offset = staged;
            staged += p.slab->bytes;
          }
          posts.push_back(std::move(p));
        }
      }
    }
    return staged;
  }

  // One window as one grouped exchange, staging at `staging` (the windows run one after
  // another and share it).
  absl::Status RunWindow(const std::vector<Post>& posts, char* staging,
                         const CommOptions& options) {
    std::vector<SendOp> sends;
    std::vector<RecvOp> recvs;
    for (const Post& p : posts) {
      const Slab* slab = p.slab;
      char* buf = p.offset >= 0 ? staging + p.offset : nullptr;
      if (p.send) {
        SendOp op{p.peer, p.source, slab->bytes, nullptr};
        if (!p.runs.empty()) {
          op.runs = p.runs;
          op.data = op.runs.front().first;
        } else if (buf != nullptr) {
          op.data = buf;
          op.prepare = [this, slab, buf] {
            return mover_->Pack(slab->box, slab->t->partial_index, buf);
          };
        }
        sends.push_back(std::move(op));
      } else {
        RecvOp op{p.peer, nullptr, slab->bytes, nullptr};
        if (p.landing) {
          op.data = mover_->Data(*p.landing);
          op.done = [this, landing = *p.landing] {
            mover_->Landed(landing);
            return absl::OkStatus();
          };
        } else {
          op.data = buf;
          op.done = [this, slab, buf] {
            return mover_->Apply(slab->box, buf, slab->box, slab->t->reduce,
                                 slab->t->partial_index);
          };
        }
        recvs.push_back(std::move(op));
      }
    }
    return SendRecvWithHooks(*comm_, sends, recvs, options);
  }

  const FragmentShape& f_;
  const Step& step_;
  const StepShape& shape_;
  Mover* mover_;
  Communicator* comm_;
  const CommOptions options_;
  const int me_;
  const int64_t esize_;
  const int64_t message_bytes_;
  const int64_t staging_limit_;
};

std::string StepName(const FragmentShape& f, size_t i) {
  const Step& step = f.steps[i];
  const int index = i < f.step_indices.size() ? f.step_indices[i] : static_cast<int>(i);
  return absl::StrCat("step ", index, " (", StepOpName(step.op), " over ranks [",
                      absl::StrJoin(step.ranks, ","), "]) on rank ", f.rank);
}

absl::Status Annotate(const absl::Status& s, const std::string& where) {
  return absl::Status(s.code(), absl::StrCat(where, ": ", s.message()));
}

}  // namespace

StepOp ChooseStepOp(const Step& step, bool force_point_to_point) {
  return AnalyzeStep(step, force_point_to_point).method;
}

uint32_t StepTag(const std::string& plan_id, int step_index) {
  uint32_t h = 2166136261u;
  for (char c : absl::StrCat(plan_id, "/", step_index)) {
    h ^= static_cast<unsigned char>(c);
    h *= 16777619u;
  }
  return h;
}

absl::StatusOr<ExecuteResult> ExecuteFragment(const ExecuteInput& input) {
  const Fragment& fragment = *input.fragment;
  if (absl::Status s = ValidateFragment(fragment); !s.ok()) return s;
  if (fragment.fused) {
    return absl::InvalidArgumentError(
        absl::StrCat("plan ", fragment.plan_id, " is fused: it runs as one exchange"));
  }
  const FragmentShape& f = fragment.shapes[0];
  const FragmentMember& m = fragment.members[0];
  if (absl::Status s =
          CheckBuffers(f, m.tensor, m.source_version, m.target_tensor, input.source, input.target);
      !s.ok()) {
    return s;
  }
  auto cancelled = [&] { return input.cancel != nullptr && input.cancel->cancelled(); };
  const absl::Duration timeout = fragment.step_timeout_ms > 0
                                     ? absl::Milliseconds(fragment.step_timeout_ms)
                                     : input.options.default_step_timeout;

  // The plan's buckets bound its messages and the staging held at once (sharding/staging.h).
  const int64_t bucket = std::max<int64_t>(
      1, fragment.bucket_bytes > 0 ? fragment.bucket_bytes : input.options.bucket_bytes);
  const int64_t staging_limit = StagingLimit(bucket);
  const int64_t esize = ElementSize(f.wire_dtype());  // What the steps' transfers carry.

  // Decide every step's method first: a reducing collective consumes this rank's own
  // contribution, so the local copy that would add it is skipped. A collective whose buffers
  // exceed the staging limit runs as point-to-point, which stages in bounded windows.
  std::vector<StepShape> shapes;
  shapes.reserve(f.steps.size());
  absl::flat_hash_set<std::pair<int64_t, Box>> consumed;  // (partial, box) of own copies.
  for (const Step& step : f.steps) {
    shapes.push_back(AnalyzeStep(step, input.options.force_point_to_point));
    StepShape& shape = shapes.back();
    if (CollectiveStaging(step, shape, esize) > staging_limit) shape.method = StepOp::kPointToPoint;
    if (shape.method == StepOp::kAllReduce || shape.method == StepOp::kReduceScatter) {
      const int me = shape.group_rank.at(f.rank);
      for (const Box& b : shape.boxes[me]) consumed.insert({shape.partial[me], b});
    }
  }

  bool reducing = false;
  for (const LocalCopy& c : f.local_copies) reducing |= c.reduce;
  int64_t bytes_total = 0;
  for (const Step& step : f.steps) {
    for (const Transfer& t : step.transfers) {
      if (t.dst != f.rank) continue;
      reducing |= t.reduce;
      bytes_total += t.bytes;
    }
  }

  Mover mover(f, input.source, input.target);
  if (absl::Status s = mover.Initialise(reducing); !s.ok()) return s;
  // Local copies touch only elements no step writes (or combine commutatively), so they run
  // while the first step's transfers are in flight.
  auto local_copies = [&]() -> absl::Status {
    for (size_t i = 0; i < f.local_copies.size(); ++i) {
      const LocalCopy& c = f.local_copies[i];
      if (c.reduce && consumed.contains({c.partial_index, c.box})) continue;
      if (absl::Status s = mover.LocalCopy(c); !s.ok()) {
        return Annotate(s, absl::StrCat("local_copies[", i, "] on rank ", f.rank));
      }
    }
    return absl::OkStatus();
  };
  if (f.steps.empty()) {
    if (absl::Status s = local_copies(); !s.ok()) return s;
  }

  ExecuteResult result;
  std::map<std::vector<int64_t>, std::shared_ptr<Communicator>> held_communicators;
  for (size_t i = 0; i < f.steps.size(); ++i) {
    const Step& step = f.steps[i];
    const std::string name = StepName(f, i);
    if (cancelled())
      return absl::AbortedError(
          absl::StrCat("plan ", fragment.plan_id, " cancelled before ", name));
    const absl::Time start = absl::Now();
    // Held for the whole fragment: a release of the prefix (another plan's abort) must not
    // make a later step rebuild a group this plan already uses.
    std::shared_ptr<Communicator>& held = held_communicators[step.ranks];
    if (held == nullptr) {
      absl::StatusOr<std::shared_ptr<Communicator>> got = input.communicators->Get(SpecOf(
          step.ranks, fragment.member_incarnations, f.rank, fragment.communicator_prefix, timeout));
      if (!got.ok()) return Annotate(got.status(), name);
      held = *std::move(got);
    }
    std::shared_ptr<Communicator>* comm = &held;
    StepShape& shape = shapes[i];
    const bool copy = shape.method == StepOp::kAllGather || shape.method == StepOp::kAllToAll ||
                      shape.method == StepOp::kBroadcast;
    if (copy && (*comm)->PrefersSendRecvForCopies() && !input.options.force_copy_collectives) {
      shape.method = StepOp::kPointToPoint;
    }
    CommOptions options;
    options.tag = StepTag(fragment.plan_id, i < f.step_indices.size() ? f.step_indices[i] : i);
    options.timeout = timeout;
    options.cancel = input.cancel;
    if (i == 0) options.while_waiting = local_copies;
    if (shape.method != StepOp::kPointToPoint) {
      if (absl::Status s = PrepareOptions(**comm, &options); !s.ok()) return s;
    }
    std::optional<SpaceSyncedCommunicator> synced;  // Device buffers only.
    Communicator* step_comm = comm->get();
    if (!mover.space().is_host()) step_comm = &synced.emplace(step_comm, &mover.space());
    StepRunner runner(f, step, shapes[i], &mover, step_comm, options,
                      std::clamp<int64_t>(input.options.message_bytes, 1, bucket), staging_limit);
    if (absl::Status s = runner.Run(); !s.ok()) return Annotate(s, name);
    StepReport report;
    report.index = i < f.step_indices.size() ? f.step_indices[i] : static_cast<int>(i);
    report.op = step.op;
    report.method = shapes[i].method;
    for (const Transfer& t : step.transfers) {
      if (t.src == f.rank) report.bytes_sent += t.bytes;
      if (t.dst == f.rank) report.bytes_received += t.bytes;
    }
    report.start = start;
    report.time = absl::Now() - start;
    result.steps.push_back(report);
    result.bytes_sent += report.bytes_sent;
    result.bytes_received += report.bytes_received;
    if (input.progress) input.progress(result.bytes_received, bytes_total);
  }
  if (cancelled()) return absl::AbortedError(absl::StrCat("plan ", fragment.plan_id, " cancelled"));
  if (absl::Status s = mover.Divide(); !s.ok()) return Annotate(s, "divide_by");
  if (absl::Status s = mover.space().Synchronize(); !s.ok()) {
    return Annotate(s, mover.space().name());
  }
  result.chunks = input.target->chunks();
  absl::StatusOr<std::vector<uint64_t>> checksums = mover.Checksums();
  if (!checksums.ok()) return checksums.status();
  result.checksums = *std::move(checksums);
  return result;
}

}  // namespace shardcoord
