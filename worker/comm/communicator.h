#ifndef SHARDCOORD_WORKER_COMM_COMMUNICATOR_H_
#define SHARDCOORD_WORKER_COMM_COMMUNICATOR_H_

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "common/metrics.h"
#include "sharding/dtype.h"
#include "sharding/placement.h"

namespace shardcoord {

// Cancels operations in flight: a backend registers how to interrupt its waits (Gloo:
// abortWaitRecv/abortWaitSend on the posted buffers) and Cancel runs that, so an aborted plan
// does not sit in a step until the step timeout (Gloo does not notice a peer killed
// mid-exchange). Thread-safe.
class CancelToken {
 public:
  // Idempotent. Runs every registered callback once, on this thread.
  void Cancel();
  bool cancelled() const;
  // Registers `fn` to run on Cancel (at once, here, if already cancelled). Returns a handle
  // for Remove. `fn` must not call back into the token.
  int64_t OnCancel(std::function<void()> fn);
  // After Remove returns, the callback is not running and will not run.
  void Remove(int64_t handle);

 private:
  mutable absl::Mutex mu_;
  bool cancelled_ ABSL_GUARDED_BY(mu_) = false;
  int64_t next_ ABSL_GUARDED_BY(mu_) = 0;
  std::map<int64_t, std::function<void()>> callbacks_ ABSL_GUARDED_BY(mu_);
};

// Per-operation options.
struct CommOptions {
  // Keeps apart operations that run at the same time on one communicator (two plans on
  // different tensors over the same process group). Every member passes the same tag for
  // the same operation; operations in flight together must have different tags.
  // The executor derives it from (plan id, step index). NCCL has no tags and runs one op at
  // a time per communicator, so there it only names the step in errors.
  uint32_t tag = 0;
  // Bound on the whole operation; zero = the communicator's default timeout.
  absl::Duration timeout = absl::ZeroDuration();
  // Optional local work that may overlap the operation (the executor's local copies): called
  // once, after the operation's messages are posted where the backend runs the hooks itself
  // (Gloo SendRecv), else just before the operation (NCCL; see RunsHooks). An error ends the
  // operation with that error.
  std::function<absl::Status()> while_waiting;
  // Optional: cancelling it ends the operation with ABORTED where the backend can interrupt
  // it (Gloo: SendRecv; its blocking collectives run to their timeout). NCCL does not read
  // it: its ops run to their timeout unless NcclCommunicator::Abort is called.
  CancelToken* cancel = nullptr;
};

// One point-to-point message of a grouped exchange. `peer` is a group rank.
struct SendOp {
  int peer = 0;
  const void* data = nullptr;
  int64_t bytes = 0;
  // Optional: fills `data` (e.g. packs a strided box). Called just before this send is posted,
  // after every receive of the exchange is posted, so packing overlaps the transfers already
  // under way.
  std::function<absl::Status()> prepare;
  // Optional: where the bytes already lie, as (address, length) runs in order adding up to
  // `bytes` (host memory). A backend that can move strided memory without a contiguous copy
  // (Gloo's same-host copies) sends from them and does not call `prepare`; the others
  // ignore them.
  std::vector<std::pair<const char*, int64_t>> runs;
};
struct RecvOp {
  int peer = 0;
  void* data = nullptr;
  int64_t bytes = 0;
  // Optional: consumes `data` (e.g. unpacks it) as soon as this receive completed, while
  // other messages of the exchange may still be in flight.
  std::function<absl::Status()> done;
};

// A communicator over one process group: the collective operations a plan step may lower to,
// on raw host (or, for NCCL, device) byte buffers. Every backend implements exactly this
// interface (worker/backends/gloo, worker/backends/nccl); each op maps to one library call
// or one grouped call (nccl_lowering.h has the NCCL details):
//
//   op              Gloo                          NCCL
//   AllGatherV      gloo::allgatherv              ncclGroup of ncclBroadcast (or AllGather
//                                                 when counts are equal)
//   AllToAllV       gloo::alltoallv               ncclGroup of ncclSend/ncclRecv
//   ReduceScatterV  gloo::alltoallv + local       ncclReduceScatter (equal counts) or
//                   reduce in group-rank order    ncclGroup of ncclReduce
//   AllReduce       gloo::allreduce (ring)        ncclAllReduce
//   Broadcast       gloo::broadcast               ncclBroadcast
//   SendRecv        unbound-buffer send/recv      ncclGroupStart; ncclSend/ncclRecv...; End
//
// Ranks are positions in the group, [0, size()). Every member calls the same op with
// matching sizes. Ops block until done or the timeout. Errors: INVALID_ARGUMENT for
// inconsistent arguments (checked locally), DEADLINE_EXCEEDED when the op ran out of time,
// ABORTED when a peer failed or a connection broke. After any error other than
// INVALID_ARGUMENT the communicator is broken(): in-flight state with the peers is unknown,
// so it must not be used again (CommunicatorCache rebuilds it).
//
// Reductions take a DType and kSum, kMin or kMax (kAvg is kSum followed by a division that
// the caller does). Reduced results are bitwise identical on every member that receives
// them.
class Communicator {
 public:
  virtual ~Communicator() = default;

  virtual int rank() const = 0;
  virtual int size() const = 0;
  virtual bool broken() const = 0;

  // Whether steps that only copy (all-gather, all-to-all, broadcast) should run as SendRecv:
  // true where grouped send/recv moves the same bytes and lets pieces land in place, while
  // the collective needs contiguous staging buffers (Gloo, whose collectives are pairwise
  // sends themselves). Every member of a group has the same backend, so all choose alike.
  virtual bool PrefersSendRecvForCopies() const { return false; }

  // Whether this backend runs the hooks (CommOptions::while_waiting, SendOp::prepare,
  // RecvOp::done) itself. A backend that does not ignores them; callers then go through
  // SendRecvWithHooks and PrepareOptions below, which run them around the call.
  virtual bool RunsHooks() const { return false; }

  // Whether a SendRecv message of `bytes` to group rank `peer` goes from SendOp::runs when
  // they are given (then `prepare` is not called and `data` not read), so a caller needs no
  // staging to pack it (Gloo's same-host copies).
  virtual bool SendsFromRuns(int peer, int64_t bytes) const { return false; }

  // `send` (send_bytes) from every rank, concatenated in rank order into `recv`;
  // recv_bytes[r] is rank r's contribution and recv_bytes[rank()] == send_bytes.
  virtual absl::Status AllGatherV(const void* send, int64_t send_bytes, void* recv,
                                  absl::Span<const int64_t> recv_bytes,
                                  const CommOptions& options) = 0;

  // `send` holds the pieces for ranks 0..size-1 concatenated (send_bytes[r] each); `recv`
  // receives the pieces from ranks 0..size-1 concatenated (recv_bytes[r] each). The piece
  // rank a sends to b has send_bytes[b] at a == recv_bytes[a] at b.
  virtual absl::Status AllToAllV(const void* send, absl::Span<const int64_t> send_bytes, void* recv,
                                 absl::Span<const int64_t> recv_bytes,
                                 const CommOptions& options) = 0;

  // `send` holds sum(recv_elements) elements on every rank, slice r being recv_elements[r]
  // elements for rank r; `recv` gets the reduction over all ranks of this rank's slice.
  virtual absl::Status ReduceScatterV(const void* send, void* recv,
                                      absl::Span<const int64_t> recv_elements, DType dtype,
                                      ReduceOp op, const CommOptions& options) = 0;

  // recv = reduction over all ranks of send, `elements` each. send == recv is allowed.
  virtual absl::Status AllReduce(const void* send, void* recv, int64_t elements, DType dtype,
                                 ReduceOp op, const CommOptions& options) = 0;

  // `bytes` of `data` from group rank `root` into `data` on every other rank.
  virtual absl::Status Broadcast(void* data, int64_t bytes, int root,
                                 const CommOptions& options) = 0;

  // One grouped exchange: posts every receive, then every send (calling its `prepare` first),
  // then waits for all of them (calling each receive's `done` as it completes), so any
  // pattern (cycles included) completes. The k-th send from a to b matches the k-th receive
  // from a at b, with equal byte counts. No send or receive to oneself.
  virtual absl::Status SendRecv(absl::Span<const SendOp> sends, absl::Span<const RecvOp> recvs,
                                const CommOptions& options) = 0;
};

// comm.SendRecv, with the hooks run around it (every prepare, while_waiting, the exchange,
// every done) when the backend does not run them itself.
absl::Status SendRecvWithHooks(Communicator& comm, absl::Span<const SendOp> sends,
                               absl::Span<const RecvOp> recvs, const CommOptions& options);

// For the other ops: runs `options->while_waiting` now and clears it when the backend does
// not run it itself.
absl::Status PrepareOptions(const Communicator& comm, CommOptions* options);

// What a communicator is built for.
struct CommunicatorSpec {
  std::vector<int64_t> ranks;         // Global ranks of the group, in group-rank order.
  std::vector<int64_t> incarnations;  // incarnations[i] of ranks[i].
  int64_t my_rank = 0;                // This process's global rank; must be in `ranks`.
  // Rendezvous key prefix. Builds of the same (prefix, ranks, incarnations) on different
  // members meet under the same keys, so a prefix must never be reused for a second build
  // of the same group (see CommunicatorCache).
  std::string key_prefix;
  absl::Duration timeout = absl::Seconds(60);  // Rendezvous and default op timeout.
};

// INVALID_ARGUMENT naming the field: empty or duplicate ranks, incarnation count mismatch,
// my_rank not a member, non-positive timeout.
absl::Status ValidateCommunicatorSpec(const CommunicatorSpec& spec);
// Group rank of spec.my_rank.
int GroupRankOf(const CommunicatorSpec& spec);

// Builds one communicator (blocking rendezvous with the other members). Implemented by
// each backend.
class CommunicatorFactory {
 public:
  virtual ~CommunicatorFactory() = default;
  virtual absl::StatusOr<std::shared_ptr<Communicator>> Create(const CommunicatorSpec& spec) = 0;
};

// Communicators by (key prefix, group ranks, member incarnations). Thread-safe; builds for
// different groups run concurrently (so two plans building different groups in different
// orders on different workers cannot deadlock); concurrent Gets of one key share one build.
//
// Contract with the coordinator: communicator_prefix names a rendezvous epoch. Plans in one
// epoch share communicators (their ops are kept apart by tags), so a group pays one
// rendezvous per epoch, and builds of one group meet under the same keys whichever plan
// triggered them. After any failure some members may hold broken communicators and others
// healthy ones, so an abort retires the epoch: the coordinator moves to a new prefix and
// FinishPlan(abort) releases the old one here. A member that restarted has a new incarnation
// and so a new key on every member. A per-plan prefix works too (then FinishPlan should also
// release on commit, or entries accumulate). A broken communicator is dropped and rebuilt
// on the next Get of its key.
//
// Metrics, when given: builds by result ("ok", "error"), and communicators torn down by
// reason ("plan_aborted": released with an aborted plan's epoch; "broken": found broken and
// rebuilt).
struct CommunicatorCacheMetrics {
  CounterFamily* builds = nullptr;  // Labels {"result"}.
  CounterFamily* aborts = nullptr;  // Labels {"reason"}.
};

class CommunicatorCache {
 public:
  explicit CommunicatorCache(std::shared_ptr<CommunicatorFactory> factory,
                             CommunicatorCacheMetrics metrics = {});

  absl::StatusOr<std::shared_ptr<Communicator>> Get(const CommunicatorSpec& spec);

  // Drops every communicator built under `key_prefix` (users keep theirs alive).
  int ReleasePrefix(absl::string_view key_prefix);
  int size() const;

 private:
  using Key = std::tuple<std::string, std::vector<int64_t>, std::vector<int64_t>>;
  struct Entry {
    bool building = true;
    bool released = false;  // ReleasePrefix ran during the build: drop it when done.
    absl::Status status;    // Of a finished build that failed.
    std::shared_ptr<Communicator> comm;
  };

  void Count(CounterFamily* family, const char* label, double n = 1) const;

  std::shared_ptr<CommunicatorFactory> factory_;
  const CommunicatorCacheMetrics metrics_;
  mutable absl::Mutex mu_;
  std::map<Key, std::shared_ptr<Entry>> entries_ ABSL_GUARDED_BY(mu_);
};

}  // namespace shardcoord

#endif  // SHARDCOORD_WORKER_COMM_COMMUNICATOR_H_
