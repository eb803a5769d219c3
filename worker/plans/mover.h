#ifndef SHARDCOORD_WORKER_PLANS_MOVER_H_
#define SHARDCOORD_WORKER_PLANS_MOVER_H_

// The executor's element movement for one fragment (worker/plans/executor.cc and
// worker/plans/fused_exchange.cc share it): packing from the source chunks, landing in or
// combining into the target chunks, local copies, the reduction rule's initialisation and
// division, checksums built as the target is written, and staging memory, all through the
// buffers' MemorySpace. Internal to the executor.
//
// Casts (FragmentShape::cast_to): the source chunks hold the shape's dtype, the target chunks
// its target_dtype(), and every packed piece (what a transfer carries, what staging holds)
// its wire_dtype(), the narrower. Pack converts source -> wire where they differ (the sender
// converts: narrowing), Apply converts wire -> target where they differ (the receiver
// converts: widening), a local copy converts source -> target. A piece is sent straight from
// a source chunk only when the source dtype is the wire's, and lands straight in a target
// chunk only when the wire dtype is the target's. esize() is the wire element size.

#include <cstdint>
#include <cstring>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/time.h"
#include "sharding/box.h"
#include "sharding/box_copy.h"
#include "sharding/layout.h"
#include "sharding/plan_fragment.h"
#include "worker/buffers/buffer_store.h"
#include "worker/buffers/checksum.h"
#include "worker/comm/communicator.h"
#include "worker/memory/memory_space.h"
#include "worker/plans/fragment.h"

namespace shardcoord {
namespace executor_internal {

// ---------------------------------------------------------------------------------------
// Element movement between the rank's buffers.

class Mover {
 public:
  Mover(const FragmentShape& f, const HostBuffer* source, HostBuffer* target)
      : f_(f),
        source_(source),
        target_(target),
        space_(target->space()),
        wire_(f.wire_dtype()),
        target_dtype_(f.target_dtype()),
        esize_(ElementSize(wire_)),
        source_esize_(ElementSize(f.dtype)),
        target_esize_(ElementSize(target_dtype_)),
        op_(f.reduce_op == ReduceOp::kAvg ? ReduceOp::kSum : f.reduce_op) {
    // Host memory is hashed as it is written; other spaces hash on their device at the end.
    if (!space_.is_host()) return;
    sums_.reserve(target->chunks().chunks.size());
    for (size_t i = 0; i < target->chunks().chunks.size(); ++i) {
      sums_.emplace_back(target->chunk_data(i), target->chunk_bytes(i));
    }
  }

  // The size of an element as transfers and staging hold it (the wire dtype's).
  int64_t esize() const { return esize_; }
  DType wire_dtype() const { return wire_; }
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
    if (f_.dtype != wire_) {  // The sender converts.
      return space_.CastBox(box, source_->chunk_data(*k), source_->chunks().chunks[*k].box,
                            f_.dtype, out, box, wire_);
    }
    return space_.PackBox(box, source_->chunk_data(*k), source_->chunks().chunks[*k].box, out,
                          esize_);
  }

  // Whether the sender converts (the wire dtype is not the source's): then every message is
  // packed (converted) before it is sent, never sent from the source's own memory.
  bool SenderConverts() const { return f_.dtype != wire_; }

  // Where `box` lies contiguously in a source chunk, or null (then it must be packed, also
  // when the sender converts).
  const char* DirectSource(const Box& box, int64_t partial) const {
    if (f_.dtype != wire_) return nullptr;
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
    if (!space_.is_host() || f_.dtype != wire_) return out;
    absl::StatusOr<int> k = SourceChunk(box, partial);
    if (!k.ok()) return out;
    absl::StatusOr<RegionRuns> runs =
        RegionByteRuns(box, source_->chunks().chunks[*k].box, source_esize_);
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

  // Where a received `box` can land directly: one target chunk takes it, contiguously, it
  // overwrites, and the receiver does not convert. None otherwise (receive into a staging
  // buffer and Apply).
  std::optional<Landing> DirectTarget(const Box& box, bool reduce, int64_t partial) const {
    if (reduce || box.Empty() || wire_ != target_dtype_) return std::nullopt;
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
    return Landing{static_cast<size_t>(found), *off * target_esize_,
                   (*off + box.Volume()) * target_esize_};
  }
  char* Data(const Landing& l) const { return target_->chunk_data(l.chunk) + l.begin; }

  // A receive into Data(l) completed.
  void Landed(const Landing& l) {
    if (ChunkChecksumBuilder* sum = ChecksumOf(l.chunk)) sum->Final(l.begin, l.end);
  }

  // Writes (or combines) `box`, held in `data` laid out for `data_box` in the wire dtype
  // (a received piece), into every target chunk that takes it.
  absl::Status Apply(const Box& box, const char* data, const Box& data_box, bool reduce,
                     int64_t partial) {
    return ApplyFrom(box, data, data_box, wire_, reduce, partial);
  }

  // As Apply, from `data` of dtype `data_dtype`: converted where it is not the target's.
  // Reductions never convert (a plan that casts has no Partial source).
  absl::Status ApplyFrom(const Box& box, const char* data, const Box& data_box, DType data_dtype,
                         bool reduce, int64_t partial) {
    if (reduce && data_dtype != target_dtype_) {
      return absl::InternalError(absl::StrCat("a reducing piece of ", box.ToString(),
                                              " would cast ", DTypeName(data_dtype), " to ",
                                              DTypeName(target_dtype_)));
    }
    const auto& chunks = target_->chunks().chunks;
    for (size_t i = 0; i < chunks.size(); ++i) {
      const Chunk& c = chunks[i];
      if (!Takes(c, reduce, partial)) continue;
      // Mostly the chunk holds the whole box: no intersection to build (and allocate).
      Box part;
      const bool whole = c.box.ndim() == box.ndim() && c.box.Contains(box);
      if (!whole) part = c.box.Intersect(box);
      const Box& region = whole ? box : part;
      if (region.Empty()) continue;
      absl::Status s;
      if (reduce) {
        s = space_.ReduceIntoBox(region, data, data_box, target_->chunk_data(i), c.box,
                                 target_dtype_, op_);
      } else if (data_dtype != target_dtype_) {  // The receiver (or a local copy) converts.
        s = space_.CastBox(region, data, data_box, data_dtype, target_->chunk_data(i), c.box,
                           target_dtype_);
      } else {
        s = space_.CopyBox(region, data, data_box, target_->chunk_data(i), c.box, target_esize_);
      }
      if (!s.ok()) return s;
      Wrote(i, region, /*final=*/!reduce);
    }
    return absl::OkStatus();
  }

  absl::Status LocalCopy(const shardcoord::LocalCopy& copy) {
    if (copy.box.Empty()) return absl::OkStatus();
    absl::StatusOr<int> k = SourceChunk(copy.box, copy.partial_index);
    if (!k.ok()) return k.status();
    return ApplyFrom(copy.box, source_->chunk_data(*k), source_->chunks().chunks[*k].box, f_.dtype,
                     copy.reduce, copy.partial_index);
  }

  // Identity of the reduce op in every target chunk that takes a value; zeros in the
  // contributions that take none.
  absl::Status Initialise(bool reducing) {
    const auto& chunks = target_->chunks().chunks;
    for (size_t i = 0; i < chunks.size(); ++i) {
      const int64_t n = chunks[i].box.Volume();
      absl::Status s;
      if (!NeedsValue(f_, chunks[i])) {
        s = space_.FillZeros(target_->chunk_data(i), n * target_esize_);
        if (ChunkChecksumBuilder* sum = ChecksumOf(i)) sum->Final(0, n * target_esize_);
      } else if (reducing) {
        s = space_.FillIdentity(target_->chunk_data(i), n, target_dtype_, op_);
        if (ChunkChecksumBuilder* sum = ChecksumOf(i)) sum->Dirty(0, n * target_esize_);
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
      absl::Status s = space_.DivideBox(target_->chunk_data(i), chunks[i].box.Volume(),
                                        target_dtype_, f_.divide_by);
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
        sum->Final(*off * target_esize_, (*off + region.Volume()) * target_esize_);
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
    sum->Dirty(first * target_esize_, (last + 1) * target_esize_);
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

  const FragmentShape& f_;
  const HostBuffer* source_;
  HostBuffer* target_;
  MemorySpace& space_;
  const DType wire_;          // What packed pieces hold.
  const DType target_dtype_;  // What the target chunks hold.
  const int64_t esize_;       // Of wire_.
  const int64_t source_esize_;
  const int64_t target_esize_;
  const ReduceOp op_;
  std::vector<ChunkChecksumBuilder> sums_;  // One per target chunk.
};

inline bool SameChunks(const RankChunks& a, const RankChunks& b) { return a.chunks == b.chunks; }

inline std::string ChunkList(const RankChunks& rc) {
  return absl::StrJoin(rc.chunks, ", ", [](std::string* out, const Chunk& c) {
    absl::StrAppend(out, c.box.ToString(), "@", c.local_offset, "#", c.partial_index);
  });
}

inline int64_t Sum(const std::vector<int64_t>& v) {
  int64_t s = 0;
  for (int64_t x : v) s += x;
  return s;
}

inline int64_t BoxBytes(const std::vector<Box>& boxes, int64_t esize) {
  int64_t s = 0;
  for (const Box& b : boxes) s += b.Volume() * esize;
  return s;
}

// FAILED_PRECONDITION when `source` is missing or does not hold f.source (or lies in another
// memory space than `target`); INVALID_ARGUMENT when `target` does not hold f.target.
inline absl::Status CheckBuffers(const FragmentShape& f, const std::string& tensor,
                                 int64_t source_version, const std::string& target_tensor,
                                 const HostBuffer* source, const HostBuffer* target) {
  if (!f.source.chunks.empty()) {
    if (source == nullptr) {
      return absl::FailedPreconditionError(absl::StrCat(
          "rank ", f.rank, " has no buffer of tensor '", tensor, "' version ", source_version));
    }
    if (source->dtype() != f.dtype || !SameChunks(source->chunks(), f.source)) {
      return absl::FailedPreconditionError(absl::StrCat(
          "rank ", f.rank, " holds tensor '", tensor, "' version ", source_version, " as ",
          DTypeName(source->dtype()), " chunks [", ChunkList(source->chunks()),
          "] but the plan expects ", DTypeName(f.dtype), " chunks [", ChunkList(f.source), "]"));
    }
  }
  if (target == nullptr || target->dtype() != f.target_dtype() ||
      !SameChunks(target->chunks(), f.target)) {
    return absl::InvalidArgumentError(absl::StrCat("target buffer of tensor '", target_tensor,
                                                   "' does not match the fragment's target"));
  }
  if (source != nullptr && &source->space() != &target->space()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "rank ", f.rank, " holds tensor '", tensor, "' version ", source_version, " in ",
        source->space().name(), " but its target buffer is in ", target->space().name()));
  }
  return absl::OkStatus();
}

// The spec of a communicator over `ranks` for rank `me`, whose incarnations come from
// `incarnations` (every rank must have one: ValidateFragment and FragmentFromProto check).
inline CommunicatorSpec SpecOf(const std::vector<int64_t>& ranks,
                               const absl::flat_hash_map<int64_t, int64_t>& incarnations,
                               int64_t me, const std::string& prefix, absl::Duration timeout) {
  CommunicatorSpec spec;
  spec.ranks = ranks;
  for (int64_t r : ranks) spec.incarnations.push_back(incarnations.at(r));
  spec.my_rank = me;
  spec.key_prefix = prefix;
  spec.timeout = timeout;
  return spec;
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
  bool SendsFromRuns(int peer, int64_t bytes) const override {
    return inner_->SendsFromRuns(peer, bytes);
  }

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

}  // namespace executor_internal
}  // namespace shardcoord

#endif  // SHARDCOORD_WORKER_PLANS_MOVER_H_
