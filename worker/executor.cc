#include "worker/executor.h"

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
#include "worker/checksum.h"
#include "worker/fragment.h"
#include "worker/memory_space.h"

namespace shardcoord {
namespace {

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
    const std::vector<Box>* first = nullptr;
    bool sends = false;
    for (int d = 0; d < shape->n; ++d) sends |= d != g && Boxes(pairs, g, d) != nullptr;
    if (!sends) continue;
    for (int d = 0; d < shape->n; ++d) {
      if (d == g) continue;
      const std::vector<Box>* b = Boxes(pairs, g, d);
      if (b == nullptr) return false;
      if (first == nullptr) first = b;
      if (*b != *first) return false;
    }
    shape->boxes[g] = *first;
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
  const std::vector<Box>* first = nullptr;
  for (int d = 0; d < shape->n; ++d) {
    if (d == root) continue;
    const std::vector<Box>* b = Boxes(pairs, root, d);
    if (b == nullptr) return false;
    if (first == nullptr) first = b;
    if (*b != *first) return false;
  }
  for (const auto& [key, boxes] : pairs) {
    if (key.first != root) return false;
  }
  if (first == nullptr) return false;
  shape->boxes.assign(shape->n, {});
  shape->boxes[root] = *first;
  return true;
}

bool MatchReduceScatter(const Step& step, StepShape* shape, bool require_all_receive) {
  if (shape->n < 2 || !OnePartialPerMember(step, shape)) return false;
  PairBoxes pairs;
  if (!CollectPairs(step, *shape, &pairs)) return false;
  shape->boxes.assign(shape->n, {});
  for (int d = 0; d < shape->n; ++d) {
    bool receives = false;
    for (int m = 0; m < shape->n; ++m) receives |= m != d && Boxes(pairs, m, d) != nullptr;
    if (!receives) {
      if (require_all_receive) return false;
      continue;
    }
    const std::vector<Box>* first = nullptr;
    for (int m = 0; m < shape->n; ++m) {
      if (m == d) continue;
      const std::vector<Box>* b = Boxes(pairs, m, d);
      if (b == nullptr) return false;
      if (first == nullptr) first = b;
      if (*b != *first) return false;
    }
    shape->boxes[d] = *first;
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
// Element movement between the rank's buffers.

class Mover {
 public:
  Mover(const Fragment& f, const HostBuffer* source, HostBuffer* target)
      : f_(f),
        source_(source),
        target_(target),
        space_(target->space()),
        esize_(ElementSize(f.dtype)),
        op_(f.reduce_op == ReduceOp::kAvg ? ReduceOp::kSum : f.reduce_op) {
    // Host memory is hashed as it is written; other spaces hash on their device at the end.
    if (!space_.is_host()) return;
    sums_.reserve(target->chunks().chunks.size());
    for (size_t i = 0; i < target->chunks().chunks.size(); ++i) {
      sums_.emplace_back(target->chunk_data(i), target->chunk_bytes(i));
    }
  }

  int64_t esize() const { return esize_; }
  ReduceOp op() const { return op_; }
  // Where both buffers and all staging memory live.
  MemorySpace& space() const { return space_; }

  // The source chunk holding `box` of contribution `partial`.
  absl::StatusOr<int> SourceChunk(const Box& box, int64_t partial) const {
    int k = source_ == nullptr
                ? -1
                : FindContainingChunk(source_->chunks(), box, SourceIsPartial(f_), partial);
    if (k < 0) {
      return absl::FailedPreconditionError(absl::StrCat(
          "rank ", f_.rank, " holds no source chunk with box ", box.ToString(),
          SourceIsPartial(f_) ? absl::StrCat(" of contribution ", partial) : std::string()));
    }
    return k;
  }

  absl::Status Pack(const Box& box, int64_t partial, char* out) const {
    if (box.Empty()) return absl::OkStatus();
    absl::StatusOr<int> k = SourceChunk(box, partial);
    if (!k.ok()) return k.status();
    return space_.PackBox(box, source_->chunk_data(*k), source_->chunks().chunks[*k].box, out,
                          esize_);
  }

  // Where `box` lies contiguously in a source chunk, or null (then it must be packed).
  const char* DirectSource(const Box& box, int64_t partial) const {
    absl::StatusOr<int> k = SourceChunk(box, partial);
    if (!k.ok()) return nullptr;
    std::optional<int64_t> off = ContiguousOffset(box, source_->chunks().chunks[*k].box);
    return off ? source_->chunk_data(*k) + *off * esize_ : nullptr;
  }

  // Where `box` lies in the source chunk holding it, as (address, length) runs in row-major
  // order, so a transport that can send strided host memory needs no packing (SendOp::runs).
  // Empty for device memory or when no source chunk holds it.
  std::vector<std::pair<const char*, int64_t>> SourceRuns(const Box& box, int64_t partial) const {
    std::vector<std::pair<const char*, int64_t>> out;
    if (!space_.is_host()) return out;
    absl::StatusOr<int> k = SourceChunk(box, partial);
    if (!k.ok()) return out;
    absl::StatusOr<RegionRuns> runs = RegionByteRuns(box, source_->chunks().chunks[*k].box, esize_);
    if (!runs.ok()) return out;
    const char* base = source_->chunk_data(*k);
    out.reserve(runs->offsets.size());
    for (int64_t off : runs->offsets) out.emplace_back(base + off, runs->run_bytes);
    return out;
  }

  // Where a received box lands directly: bytes [begin, end) of target chunk `chunk`.
  struct Landing {
    size_t chunk = 0;
    int64_t begin = 0;
    int64_t end = 0;
  };

  // Where a received `box` can land directly: one target chunk takes it, contiguously, and
  // it overwrites. None otherwise (receive into a staging buffer and Apply).
  std::optional<Landing> DirectTarget(const Box& box, bool reduce, int64_t partial) const {
    if (reduce || box.Empty()) return std::nullopt;
    int found = -1;
    const auto& chunks = target_->chunks().chunks;
    for (size_t i = 0; i < chunks.size(); ++i) {
      if (!Takes(chunks[i], false, partial) || !chunks[i].box.Overlaps(box)) continue;
      if (found >= 0) return std::nullopt;
      found = static_cast<int>(i);
    }
    if (found < 0 || !chunks[found].box.Contains(box)) return std::nullopt;
    std::optional<int64_t> off = ContiguousOffset(box, chunks[found].box);
    if (!off) return std::nullopt;
    return Landing{static_cast<size_t>(found), *off * esize_, (*off + box.Volume()) * esize_};
  }
  char* Data(const Landing& l) const { return target_->chunk_data(l.chunk) + l.begin; }

  // A receive into Data(l) completed.
  void Landed(const Landing& l) {
    if (ChunkChecksumBuilder* sum = ChecksumOf(l.chunk)) sum->Final(l.begin, l.end);
  }

  // Writes (or combines) `box`, held in `data` laid out for `data_box`, into every target
  // chunk that takes it.
  absl::Status Apply(const Box& box, const char* data, const Box& data_box, bool reduce,
                     int64_t partial) {
    const auto& chunks = target_->chunks().chunks;
    for (size_t i = 0; i < chunks.size(); ++i) {
      const Chunk& c = chunks[i];
      if (!Takes(c, reduce, partial)) continue;
      Box region = c.box.Intersect(box);
      if (region.Empty()) continue;
      absl::Status s =
          reduce ? space_.ReduceIntoBox(region, data, data_box, target_->chunk_data(i), c.box,
                                        f_.dtype, op_)
                 : space_.CopyBox(region, data, data_box, target_->chunk_data(i), c.box, esize_);
      if (!s.ok()) return s;
      Wrote(i, region, /*final=*/!reduce);
    }
    return absl::OkStatus();
  }

  absl::Status LocalCopy(const shardcoord::LocalCopy& copy) {
    if (copy.box.Empty()) return absl::OkStatus();
    absl::StatusOr<int> k = SourceChunk(copy.box, copy.partial_index);
    if (!k.ok()) return k.status();
    return Apply(copy.box, source_->chunk_data(*k), source_->chunks().chunks[*k].box, copy.reduce,
                 copy.partial_index);
  }

  // Identity of the reduce op in every target chunk that takes a value; zeros in the
  // contributions that take none.
  absl::Status Initialise(bool reducing) {
    const auto& chunks = target_->chunks().chunks;
    for (size_t i = 0; i < chunks.size(); ++i) {
      const int64_t n = chunks[i].box.Volume();
      absl::Status s;
      if (!NeedsValue(f_, chunks[i])) {
        s = space_.FillZeros(target_->chunk_data(i), n * esize_);
        if (ChunkChecksumBuilder* sum = ChecksumOf(i)) sum->Final(0, n * esize_);
      } else if (reducing) {
        s = space_.FillIdentity(target_->chunk_data(i), n, f_.dtype, op_);
        if (ChunkChecksumBuilder* sum = ChecksumOf(i)) sum->Dirty(0, n * esize_);
      }
      if (!s.ok()) return s;
    }
    return absl::OkStatus();
  }

  absl::Status Divide() {
    if (f_.divide_by <= 1) return absl::OkStatus();
    const auto& chunks = target_->chunks().chunks;
    for (size_t i = 0; i < chunks.size(); ++i) {
      if (!NeedsValue(f_, chunks[i])) continue;
      absl::Status s =
          space_.DivideBox(target_->chunk_data(i), chunks[i].box.Volume(), f_.dtype, f_.divide_by);
      if (!s.ok()) return s;
      if (ChunkChecksumBuilder* sum = ChecksumOf(i)) sum->Dirty(0, target_->chunk_bytes(i));
    }
    return absl::OkStatus();
  }

  // ChunkChecksum of every target chunk: on the host, most blocks were hashed as they were
  // written; other spaces compute them (after a Synchronize).
  absl::StatusOr<std::vector<uint64_t>> Checksums() {
    if (!space_.is_host()) return target_->Checksums();
    std::vector<uint64_t> out;
    out.reserve(sums_.size());
    for (ChunkChecksumBuilder& b : sums_) out.push_back(b.Finish());
    return out;
  }

 private:
  // Tells target chunk i's checksum that `region` was written: a final overwrite of one
  // contiguous run is hashed as its blocks complete; anything else is hashed at the end.
  void Wrote(size_t i, const Box& region, bool final) {
    ChunkChecksumBuilder* sum = ChecksumOf(i);
    if (sum == nullptr) return;
    const Box& box = target_->chunks().chunks[i].box;
    if (final) {
      if (std::optional<int64_t> off = ContiguousOffset(region, box)) {
        sum->Final(*off * esize_, (*off + region.Volume()) * esize_);
        return;
      }
    }
    // The byte span from the region's first element to its last.
    const Shape strides = RowMajorStrides(box.shape());
    int64_t first = 0, last = 0;
    for (int d = 0; d < box.ndim(); ++d) {
      first += (region.offset(d) - box.offset(d)) * strides[d];
      last += (region.end(d) - 1 - box.offset(d)) * strides[d];
    }
    sum->Dirty(first * esize_, (last + 1) * esize_);
  }

  // Target chunk i's checksum under construction; null when the target is not host memory.
  ChunkChecksumBuilder* ChecksumOf(size_t i) { return sums_.empty() ? nullptr : &sums_[i]; }

  // Whether target chunk `c` takes a piece: it needs a value, and a plain copy of one
  // contribution of a Partial source goes to the chunk of that contribution.
  bool Takes(const Chunk& c, bool reduce, int64_t partial) const {
    if (!NeedsValue(f_, c)) return false;
    return reduce || !SourceIsPartial(f_) || c.partial_index == partial;
  }

  // Element offset of `region` in a row-major buffer for `box` if it is one contiguous run.
  static std::optional<int64_t> ContiguousOffset(const Box& region, const Box& box) {
    const int nd = box.ndim();
    int last_partial = -1;  // Last dim where region is narrower than box.
    for (int d = 0; d < nd; ++d) {
      if (region.shape(d) != box.shape(d)) last_partial = d;
    }
    for (int d = 0; d < last_partial; ++d) {
      if (region.shape(d) != 1) return std::nullopt;
    }
    const Shape strides = RowMajorStrides(box.shape());
    int64_t off = 0;
    for (int d = 0; d < nd; ++d) off += (region.offset(d) - box.offset(d)) * strides[d];
    return off;
  }

  const Fragment& f_;
  const HostBuffer* source_;
  HostBuffer* target_;
  MemorySpace& space_;
  const int64_t esize_;
  const ReduceOp op_;
  std::vector<ChunkChecksumBuilder> sums_;  // One per target chunk.
};

bool SameChunks(const RankChunks& a, const RankChunks& b) { return a.chunks == b.chunks; }

std::string ChunkList(const RankChunks& rc) {
  return absl::StrJoin(rc.chunks, ", ", [](std::string* out, const Chunk& c) {
    absl::StrAppend(out, c.box.ToString(), "@", c.local_offset, "#", c.partial_index);
  });
}

int64_t Sum(const std::vector<int64_t>& v) {
  int64_t s = 0;
  for (int64_t x : v) s += x;
  return s;
}

int64_t BoxBytes(const std::vector<Box>& boxes, int64_t esize) {
  int64_t s = 0;
  for (const Box& b : boxes) s += b.Volume() * esize;
  return s;
}

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

// Staging memory for packed pieces, from the buffers' memory space (the recycling host
// memory cache, or device memory: the communicator reads and writes it where the chunks
// are), not zero-filled (every byte is written before it is read), which matters at hundreds
// of MiB.
class Staging {
 public:
  Staging(MemorySpace& space, int64_t bytes) : space_(&space) {
    if (bytes <= 0) return;
    absl::StatusOr<Allocation> a = space.Allocate(bytes);
    if (a.ok()) {
      allocation_ = *a;
    } else {
      status_ = a.status();  // E.g. the worker's memory budget, naming the bytes free.
    }
  }
  ~Staging() { space_->Free(allocation_); }
  Staging(Staging&& other) noexcept
      : space_(other.space_), allocation_(std::exchange(other.allocation_, Allocation{})) {}
  Staging(const Staging&) = delete;
  Staging& operator=(const Staging&) = delete;

  bool ok(int64_t bytes) const { return bytes <= 0 || allocation_.data != nullptr; }
  char* data() { return allocation_.data != nullptr ? allocation_.data : empty_; }
  const absl::Status& status() const { return status_; }

 private:
  MemorySpace* space_;
  Allocation allocation_;
  absl::Status status_;
  char empty_[1] = {0};
};

// What a step communicates through when the buffers are not host memory: the space's queued
// work (fills, local copies, packing, unpacking) has finished before the communicator reads
// or writes the memory. A send's packing, run as a hook just before the send is posted, is
// synchronised before the send goes out. Unpacking queued by a receive's hook needs nothing:
// later steps synchronise first, and the final checksum comes after a Synchronize.
class SpaceSyncedCommunicator final : public Communicator {
 public:
  SpaceSyncedCommunicator(Communicator* inner, MemorySpace* space) : inner_(inner), space_(space) {}

  int rank() const override { return inner_->rank(); }
  int size() const override { return inner_->size(); }
  bool broken() const override { return inner_->broken(); }
  bool PrefersSendRecvForCopies() const override { return inner_->PrefersSendRecvForCopies(); }
  bool RunsHooks() const override { return inner_->RunsHooks(); }

  absl::Status AllGatherV(const void* send, int64_t send_bytes, void* recv,
                          absl::Span<const int64_t> recv_bytes,
                          const CommOptions& options) override {
    if (absl::Status s = space_->Synchronize(); !s.ok()) return s;
    return inner_->AllGatherV(send, send_bytes, recv, recv_bytes, options);
  }
  absl::Status AllToAllV(const void* send, absl::Span<const int64_t> send_bytes, void* recv,
                         absl::Span<const int64_t> recv_bytes,
                         const CommOptions& options) override {
    if (absl::Status s = space_->Synchronize(); !s.ok()) return s;
    return inner_->AllToAllV(send, send_bytes, recv, recv_bytes, options);
  }
  absl::Status ReduceScatterV(const void* send, void* recv, absl::Span<const int64_t> recv_elements,
                              DType dtype, ReduceOp op, const CommOptions& options) override {
    if (absl::Status s = space_->Synchronize(); !s.ok()) return s;
    return inner_->ReduceScatterV(send, recv, recv_elements, dtype, op, options);
  }
  absl::Status AllReduce(const void* send, void* recv, int64_t elements, DType dtype, ReduceOp op,
                         const CommOptions& options) override {
    if (absl::Status s = space_->Synchronize(); !s.ok()) return s;
    return inner_->AllReduce(send, recv, elements, dtype, op, options);
  }
  absl::Status Broadcast(void* data, int64_t bytes, int root, const CommOptions& options) override {
    if (absl::Status s = space_->Synchronize(); !s.ok()) return s;
    return inner_->Broadcast(data, bytes, root, options);
  }
  absl::Status SendRecv(absl::Span<const SendOp> sends, absl::Span<const RecvOp> recvs,
                        const CommOptions& options) override {
    if (absl::Status s = space_->Synchronize(); !s.ok()) return s;
    // A backend that does not run hooks gets them run around this call (SendRecvWithHooks):
    // every prepare has run before it, so the Synchronize above covers them.
    if (!inner_->RunsHooks()) return inner_->SendRecv(sends, recvs, options);
    std::vector<SendOp> synced(sends.begin(), sends.end());
    for (SendOp& op : synced) {
      if (!op.prepare) continue;
      op.prepare = [prepare = std::move(op.prepare), space = space_]() -> absl::Status {
        if (absl::Status s = prepare(); !s.ok()) return s;
        return space->Synchronize();
      };
    }
    return inner_->SendRecv(synced, recvs, options);
  }

 private:
  Communicator* const inner_;
  MemorySpace* const space_;
};

// ---------------------------------------------------------------------------------------
// One step.

class StepRunner {
 public:
  StepRunner(const Fragment& f, const Step& step, const StepShape& shape, Mover* mover,
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
    const char* source = nullptr;           // Send straight from a source chunk.
    std::optional<Mover::Landing> landing;  // Receive straight into a target chunk.
    int64_t offset = -1;                    // Else: where in the window's staging.
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
          if (p.source == nullptr) {
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
        if (buf != nullptr) {
          op.data = buf;
          op.prepare = [this, slab, buf] {
            return mover_->Pack(slab->box, slab->t->partial_index, buf);
          };
          op.runs = mover_->SourceRuns(slab->box, slab->t->partial_index);
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

  const Fragment& f_;
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

std::string StepName(const Fragment& f, size_t i) {
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
  const Fragment& f = *input.fragment;
  if (absl::Status s = ValidateFragment(f); !s.ok()) return s;
  if (!f.source.chunks.empty()) {
    if (input.source == nullptr) {
      return absl::FailedPreconditionError(absl::StrCat(
          "rank ", f.rank, " has no buffer of tensor '", f.tensor, "' version ", f.source_version));
    }
    if (input.source->dtype() != f.dtype || !SameChunks(input.source->chunks(), f.source)) {
      return absl::FailedPreconditionError(absl::StrCat(
          "rank ", f.rank, " holds tensor '", f.tensor, "' version ", f.source_version, " as ",
          DTypeName(input.source->dtype()), " chunks [", ChunkList(input.source->chunks()),
          "] but the plan expects ", DTypeName(f.dtype), " chunks [", ChunkList(f.source), "]"));
    }
  }
  if (input.target == nullptr || input.target->dtype() != f.dtype ||
      !SameChunks(input.target->chunks(), f.target)) {
    return absl::InvalidArgumentError("target buffer does not match the fragment's target");
  }
  if (input.source != nullptr && &input.source->space() != &input.target->space()) {
    return absl::FailedPreconditionError(
        absl::StrCat("rank ", f.rank, " holds tensor '", f.tensor, "' version ", f.source_version,
                     " in ", input.source->space().name(), " but its target buffer is in ",
                     input.target->space().name()));
  }
  auto cancelled = [&] { return input.cancel != nullptr && input.cancel->cancelled(); };
  const absl::Duration timeout = f.step_timeout_ms > 0 ? absl::Milliseconds(f.step_timeout_ms)
                                                       : input.options.default_step_timeout;

  // The plan's buckets bound its messages and the staging held at once (sharding/staging.h).
  const int64_t bucket =
      std::max<int64_t>(1, f.bucket_bytes > 0 ? f.bucket_bytes : input.options.bucket_bytes);
  const int64_t staging_limit = StagingLimit(bucket);
  const int64_t esize = ElementSize(f.dtype);

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
      return absl::AbortedError(absl::StrCat("plan ", f.plan_id, " cancelled before ", name));
    const absl::Time start = absl::Now();
    // Held for the whole fragment: a release of the prefix (another plan's abort) must not
    // make a later step rebuild a group this plan already uses.
    std::shared_ptr<Communicator>& held = held_communicators[step.ranks];
    if (held == nullptr) {
      CommunicatorSpec spec;
      spec.ranks = step.ranks;
      for (int64_t r : step.ranks) spec.incarnations.push_back(f.member_incarnations.at(r));
      spec.my_rank = f.rank;
      spec.key_prefix = f.communicator_prefix;
      spec.timeout = timeout;
      absl::StatusOr<std::shared_ptr<Communicator>> got = input.communicators->Get(spec);
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
    options.tag = StepTag(f.plan_id, i < f.step_indices.size() ? f.step_indices[i] : i);
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
  if (cancelled()) return absl::AbortedError(absl::StrCat("plan ", f.plan_id, " cancelled"));
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
