#include "sharding/reference_executor.h"

#include <algorithm>
#include <limits>
#include <map>
#include <set>
#include <string>
#include <tuple>
#include <vector>

#include "absl/strings/str_cat.h"
#include "sharding/box.h"
#include "sharding/dtype.h"
#include "sharding/fill.h"
#include "sharding/layout.h"

namespace shardcoord {
namespace {

// Calls f(local index within the box, flat index in the tensor) for every element; stops at
// the first error f returns.
template <typename F>
absl::Status ForEachElement(const Box& box, const Shape& strides, F f) {
  const int nd = box.ndim();
  if (box.Empty()) return absl::OkStatus();
  Shape idx(nd, 0);
  int64_t local = 0;
  while (true) {
    int64_t flat = 0;
    for (int d = 0; d < nd; ++d) flat += (box.offset(d) + idx[d]) * strides[d];
    if (absl::Status s = f(local++, flat); !s.ok()) return s;
    int d = nd - 1;
    while (d >= 0 && ++idx[d] == box.shape(d)) idx[d--] = 0;
    if (d < 0) return absl::OkStatus();
  }
}

absl::Status Fail(const std::string& what) { return absl::InternalError(what); }

constexpr int64_t kPoison = std::numeric_limits<int64_t>::min() / 3;

class Simulation {
 public:
  Simulation(const Plan& plan, uint64_t seed) : plan_(plan), seed_(seed) {
    const Layout& s = plan.source;
    const Layout& t = plan.target;
    shape_ = s.global_shape();
    strides_ = RowMajorStrides(shape_);
    total_ = Box::Whole(shape_).Volume();
    np_ = s.num_partials();
    noop_ = s.is_partial() && s == t;
    for (const RankChunks& rc : s.ranks()) Id(rc.rank);
    for (const RankChunks& rc : t.ranks()) Id(rc.rank);
    const size_t n = ids_.size();
    src_pos_.assign(n, std::vector<int64_t>(np_ * total_, -1));
    src_mem_.assign(n, {});
    tgt_mem_.assign(n, {});
    for (const RankChunks& rc : s.ranks()) {
      const int id = Id(rc.rank);
      src_mem_[id].assign(rc.local_elements, kPoison);
      for (const Chunk& c : rc.chunks) {
        (void)ForEachElement(c.box, strides_, [&](int64_t i, int64_t e) {
          src_mem_[id][c.local_offset + i] = Contribution(c.partial_index, e);
          src_pos_[id][c.partial_index * total_ + e] = c.local_offset + i;
          return absl::OkStatus();
        });
      }
    }
    for (const RankChunks& rc : t.ranks()) tgt_mem_[Id(rc.rank)].assign(rc.local_elements, kPoison);
  }

  int Id(int64_t rank) {
    auto it = ids_.find(rank);
    if (it != ids_.end()) return it->second;
    const int id = static_cast<int>(ids_.size());
    ids_[rank] = id;
    return id;
  }

  int64_t Value(int64_t e) const {
    return static_cast<int64_t>(SplitMix64(seed_ * 1000003 + e) % 2000001) - 1000000;
  }
  // Contribution p of element e: the contributions reduce to Value(e) (avg: after division).
  int64_t Contribution(int64_t p, int64_t e) const {
    const Layout& s = plan_.source;
    if (!s.is_partial()) return Value(e);
    const uint64_t h = SplitMix64(seed_ ^ SplitMix64(e * 131 + p));
    const int64_t small = static_cast<int64_t>(h % 1000) - 500;
    const int64_t v = Value(e);
    switch (s.partial_op()) {
      case ReduceOp::kSum:
      case ReduceOp::kAvg: {
        const int64_t want = s.partial_op() == ReduceOp::kAvg ? v * np_ : v;
        if (p < np_ - 1) return small;
        int64_t rest = want;
        for (int64_t q = 0; q < np_ - 1; ++q) rest -= Contribution(q, e);
        return rest;
      }
      case ReduceOp::kMin:
      case ReduceOp::kMax: {
        const int64_t exact = static_cast<int64_t>(SplitMix64(e + seed_) % np_);
        if (p == exact) return v;
        const int64_t off = static_cast<int64_t>(h % 100) + 1;
        return s.partial_op() == ReduceOp::kMin ? v + off : v - off;
      }
    }
    return v;
  }

  // Which target chunks a piece of contribution p lands in: those that need a value, or in
  // the no-op plan (target == Partial source) the chunk of the same contribution.
  bool Receives(const Chunk& c, int64_t p) const { return noop_ ? c.partial_index == p : Needs(c); }

  bool Needs(const Chunk& c) const {
    const Layout& t = plan_.target;
    return !(t.is_partial() && t.partial_op() == ReduceOp::kSum && c.partial_index != 0);
  }

  int64_t Combine(int64_t a, int64_t b) const {
    switch (plan_.reduce_op) {
      case ReduceOp::kMin:
        return std::min(a, b);
      case ReduceOp::kMax:
        return std::max(a, b);
      default:
        return a + b;
    }
  }

  // Moves `box` (contribution p) from src's source memory into dst's target memory.
  absl::Status Deliver(int64_t src, int64_t dst, const Box& box, bool reduce, int64_t p,
                       const std::string& what) {
    const RankChunks* sc = plan_.source.Find(src);
    const RankChunks* tc = plan_.target.Find(dst);
    if (sc == nullptr) return Fail(absl::StrCat(what, ": sender holds nothing of the source"));
    if (tc == nullptr) return Fail(absl::StrCat(what, ": receiver holds nothing of the target"));
    if (box.ndim() != static_cast<int>(shape_.size())) {
      return Fail(absl::StrCat(what, ": box has ", box.ndim(), " dims"));
    }
    bool in_src = false, in_tgt = false;
    for (const Chunk& c : sc->chunks) {
      in_src |= (!plan_.source.is_partial() || c.partial_index == p) && c.box.Contains(box);
    }
    for (const Chunk& c : tc->chunks) in_tgt |= Receives(c, p) && c.box.Contains(box);
    if (!in_src) {
      return Fail(absl::StrCat(what, ": box not inside one source chunk of rank ", src));
    }
    if (!in_tgt) {
      return Fail(absl::StrCat(what, ": box not inside one needing target chunk of rank ", dst));
    }
    const int s = Id(src), d = Id(dst);
    return ForEachElement(box, strides_, [&](int64_t, int64_t e) -> absl::Status {
      const int64_t pos = src_pos_[s][(plan_.source.is_partial() ? p : 0) * total_ + e];
      if (pos < 0) return Fail(absl::StrCat(what, ": element ", e, " not held by the sender"));
      const int64_t v = src_mem_[s][pos];
      ++deliveries_[{dst, e, reduce ? p : 0}];
      for (const Chunk& c : tc->chunks) {
        if (!Receives(c, p) || !c.box.Contains(Box(Coord(e), Shape(shape_.size(), 1)))) {
          continue;
        }
        int64_t& slot = tgt_mem_[d][c.local_offset + LocalIndex(c.box, e)];
        slot = reduce ? Combine(slot, v) : v;
      }
      return absl::OkStatus();
    });
  }

  Shape Coord(int64_t e) const {
    Shape c(shape_.size());
    for (size_t d = 0; d < shape_.size(); ++d) {
      c[d] = e / strides_[d];
      e %= strides_[d];
    }
    return c;
  }
  int64_t LocalIndex(const Box& box, int64_t e) const {
    const Shape c = Coord(e);
    int64_t i = 0;
    for (int d = 0; d < box.ndim(); ++d) i = i * box.shape(d) + (c[d] - box.offset(d));
    return i;
  }

  absl::Status Execute(bool collectives) {
    bool any_reduce = false;
    for (const LocalCopy& c : plan_.local_copies) any_reduce |= c.reduce;
    for (const Step& s : plan_.steps) {
      for (const Transfer& t : s.transfers) any_reduce |= t.reduce;
    }
    int64_t identity = 0;
    if (plan_.reduce_op == ReduceOp::kMin) identity = std::numeric_limits<int64_t>::max();
    if (plan_.reduce_op == ReduceOp::kMax) identity = std::numeric_limits<int64_t>::min();
    for (const RankChunks& rc : plan_.target.ranks()) {
      const int id = Id(rc.rank);
      const bool zero =
          std::binary_search(plan_.zero_fill_ranks.begin(), plan_.zero_fill_ranks.end(), rc.rank);
      for (const Chunk& c : rc.chunks) {
        const bool needs = Needs(c);
        if (!needs && !zero) continue;
        if (needs && !any_reduce) continue;
        for (int64_t i = 0; i < c.box.Volume(); ++i) {
          tgt_mem_[id][c.local_offset + i] = needs ? identity : 0;
        }
      }
    }
    for (const LocalCopy& c : plan_.local_copies) {
      if (collectives && c.collective_step >= 0) continue;
      if (absl::Status s =
              Deliver(c.rank, c.rank, c.box, c.reduce, c.partial_index,
                      absl::StrCat("local copy on rank ", c.rank, " ", c.box.ToString()));
          !s.ok()) {
        return s;
      }
    }
    for (const Step& s : plan_.steps) {
      const bool reducing = s.op == StepOp::kAllReduce || s.op == StepOp::kReduceScatter;
      if (collectives && reducing) {
        if (absl::Status st = RunReducingCollective(s); !st.ok()) return st;
        continue;
      }
      for (const Transfer& t : s.transfers) {
        if (absl::Status st =
                Deliver(t.src, t.dst, t.box, t.reduce, t.partial_index,
                        absl::StrCat("transfer ", t.src, "->", t.dst, " ", t.box.ToString()));
            !st.ok()) {
          return st;
        }
      }
    }
    if (plan_.divide_by > 1) {
      for (const RankChunks& rc : plan_.target.ranks()) {
        for (const Chunk& c : rc.chunks) {
          if (!Needs(c)) continue;
          for (int64_t i = 0; i < c.box.Volume(); ++i) {
            tgt_mem_[Id(rc.rank)][c.local_offset + i] /= plan_.divide_by;
          }
        }
      }
    }
    return absl::OkStatus();
  }

  absl::Status RunReducingCollective(const Step& s) {
    std::map<int64_t, int64_t> partial_of;
    std::map<int64_t, std::set<Box>> received;
    for (const Transfer& t : s.transfers) {
      partial_of[t.src] = t.partial_index;
      received[t.dst].insert(t.box);
    }
    for (const auto& [dst, boxes] : received) {
      for (const Box& b : boxes) {
        for (int64_t member : s.ranks) {
          if (absl::Status st =
                  Deliver(member, dst, b, true, partial_of[member],
                          absl::StrCat("collective ", StepOpName(s.op), " into ", dst));
              !st.ok()) {
            return st;
          }
        }
      }
    }
    return absl::OkStatus();
  }

  // Every needed element got each contribution exactly once and holds the right value.
  absl::Status Check() {
    const Layout& t = plan_.target;
    for (const RankChunks& rc : t.ranks()) {
      const int id = Id(rc.rank);
      std::set<int64_t> needed;
      for (const Chunk& c : rc.chunks) {
        absl::Status s = ForEachElement(c.box, strides_, [&](int64_t i, int64_t e) {
          const int64_t got = tgt_mem_[id][c.local_offset + i];
          int64_t want = Needs(c) ? Value(e) : 0;
          if (noop_) want = Contribution(c.partial_index, e);
          if (got != want) {
            return Fail(absl::StrCat("rank ", rc.rank, " chunk ", c.box.ToString(), " partial ",
                                     c.partial_index, " element ", e, ": got ", got, ", want ",
                                     want));
          }
          if (Needs(c)) needed.insert(e);
          return absl::OkStatus();
        });
        if (!s.ok()) return s;
      }
      if (noop_) continue;
      const bool reduced = plan_.source.is_partial();
      for (int64_t e : needed) {
        for (int64_t p = 0; p < (reduced ? np_ : 1); ++p) {
          auto it = deliveries_.find({rc.rank, e, p});
          const int64_t n = it == deliveries_.end() ? 0 : it->second;
          if (n != 1) {
            return Fail(absl::StrCat("rank ", rc.rank, " element ", e, " contribution ", p,
                                     " delivered ", n, " times"));
          }
        }
      }
    }
    return absl::OkStatus();
  }

  int64_t LowerBound() {
    const Layout& t = plan_.target;
    if (noop_) return 0;
    const int64_t esize = ElementSize(plan_.wire_dtype());
    const bool reduced = plan_.source.is_partial();
    int64_t bytes = 0;
    for (const RankChunks& rc : t.ranks()) {
      const int id = Id(rc.rank);
      std::set<int64_t> needed;
      for (const Chunk& c : rc.chunks) {
        if (!Needs(c)) continue;
        (void)ForEachElement(c.box, strides_, [&](int64_t, int64_t e) {
          needed.insert(e);
          return absl::OkStatus();
        });
      }
      for (int64_t e : needed) {
        for (int64_t p = 0; p < (reduced ? np_ : 1); ++p) {
          if (src_pos_[id][p * total_ + e] < 0) bytes += esize;
        }
      }
    }
    return bytes;
  }

 private:
  const Plan& plan_;
  uint64_t seed_;
  Shape shape_, strides_;
  int64_t total_ = 0, np_ = 1;
  bool noop_ = false;
  std::map<int64_t, int> ids_;
  std::vector<std::vector<int64_t>> src_pos_;  // By rank id: (partial, element) -> local.
  std::vector<std::vector<int64_t>> src_mem_, tgt_mem_;
  std::map<std::tuple<int64_t, int64_t, int64_t>, int64_t> deliveries_;
};

}  // namespace

absl::Status CheckPlanByExecution(const Plan& plan, uint64_t seed, bool collectives) {
  if (plan.source.global_shape() != plan.target.global_shape()) {
    return Fail("source and target shapes differ");
  }
  Simulation sim(plan, seed);
  if (absl::Status s = sim.Execute(collectives); !s.ok()) return s;
  return sim.Check();
}

int64_t BruteForceLowerBound(const Plan& plan) { return Simulation(plan, 0).LowerBound(); }

absl::Status CheckPlanStructure(const Plan& plan) {
  const int64_t esize = ElementSize(plan.wire_dtype());
  int64_t moved = 0;
  std::map<int64_t, std::pair<int64_t, int64_t>> traffic;
  for (size_t si = 0; si < plan.steps.size(); ++si) {
    const Step& s = plan.steps[si];
    const std::string step = absl::StrCat("step ", si);
    int64_t step_bytes = 0;
    const std::set<int64_t> group(s.ranks.begin(), s.ranks.end());
    if (group.size() != s.ranks.size()) return Fail(step + " lists a rank twice");
    if (s.transfers.empty()) return Fail(step + " moves nothing");
    for (const Transfer& t : s.transfers) {
      const std::string tr =
          absl::StrCat(step, " transfer ", t.src, "->", t.dst, " ", t.box.ToString());
      if (t.src == t.dst) return Fail(tr + " is to itself");
      if (t.box.Empty()) return Fail(tr + " is empty");
      if (t.bytes != t.box.Volume() * esize) return Fail(tr + " has wrong bytes");
      if (!group.count(t.src) || !group.count(t.dst)) return Fail(tr + " leaves its group");
      if (t.reduce != plan.source.is_partial()) return Fail(tr + " has the wrong reduce flag");
      if (s.op == StepOp::kBroadcast && t.src != s.root) return Fail(tr + " is not from root");
      step_bytes += t.bytes;
      traffic[t.src].first += t.bytes;
      traffic[t.dst].second += t.bytes;
    }
    if (s.bytes != step_bytes) return Fail(step + " bytes differ from its transfers'");
    moved += step_bytes;
  }
  if (plan.bytes_moved != moved) return Fail("bytes_moved differs from the steps'");
  for (const RankTraffic& t : plan.traffic) {
    if (t.bytes_sent != traffic[t.rank].first || t.bytes_received != traffic[t.rank].second) {
      return Fail(absl::StrCat("traffic of rank ", t.rank, " differs from the transfers'"));
    }
  }
  for (const LocalCopy& c : plan.local_copies) {
    const std::string lc = absl::StrCat("local copy on rank ", c.rank, " ", c.box.ToString());
    if (c.box.Empty()) return Fail(lc + " is empty");
    if (c.collective_step < 0) continue;
    if (c.collective_step >= static_cast<int64_t>(plan.steps.size())) {
      return Fail(lc + " names no step");
    }
    const Step& s = plan.steps[c.collective_step];
    if (s.op != StepOp::kAllReduce && s.op != StepOp::kReduceScatter) {
      return Fail(lc + " is tied to a step that does not reduce");
    }
    if (!c.reduce) return Fail(lc + " is tied to a collective but does not reduce");
    if (std::find(s.ranks.begin(), s.ranks.end(), c.rank) == s.ranks.end()) {
      return Fail(lc + " is tied to a collective its rank is not in");
    }
  }
  return absl::OkStatus();
}

}  // namespace shardcoord
