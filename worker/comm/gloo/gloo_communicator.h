#ifndef SHARDCOORD_WORKER_COMM_GLOO_GLOO_COMMUNICATOR_H_
#define SHARDCOORD_WORKER_COMM_GLOO_GLOO_COMMUNICATOR_H_

#include <gloo/rendezvous/store.h>

#include <atomic>
#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "worker/comm/communicator.h"
#include "worker/control/kv_client.h"

namespace gloo {
class Context;
namespace transport {
class Device;
}  // namespace transport
}  // namespace gloo

namespace shardcoord {

// gloo::rendezvous::Store over a KvClient, every key under `prefix`. Gloo reports failures by
// exception, so errors from the KvClient are thrown as gloo::IoException (a timeout's message
// starts with "Wait timeout"). Values fetched by wait() are kept for the get() that follows.
class KvGlooStore : public gloo::rendezvous::Store {
 public:
  KvGlooStore(KvClient* kv, std::string prefix, absl::Duration timeout);

  void set(const std::string& key, const std::vector<char>& data) override;
  std::vector<char> get(const std::string& key) override;
  void wait(const std::vector<std::string>& keys) override;
  void wait(const std::vector<std::string>& keys,
            const std::chrono::milliseconds& timeout) override;

 private:
  KvClient* const kv_;
  const std::string prefix_;
  const absl::Duration timeout_;
  absl::Mutex mu_;
  absl::flat_hash_map<std::string, std::vector<char>> fetched_ ABSL_GUARDED_BY(mu_);
};

struct GlooOptions {
  // Address the TCP transport binds and advertises to peers: an IP or a resolvable host name
  // of an interface the other workers can reach ("127.0.0.1" for loopback clusters).
  std::string hostname = "127.0.0.1";
  // Move point-to-point messages between workers on the same host with process_vm_writev
  // (same_host.h) where both take part and the probe read succeeds; over TCP otherwise.
  bool same_host_copy = true;
};

// Communicator over a connected gloo::rendezvous::Context (TCP transport).
//
// ReduceScatterV: Gloo's reduce_scatter is a legacy typed algorithm with bound buffers and
// equal-ish blocks, so it runs as alltoallv (each rank receives every rank's copy of its
// slice: the same (n-1)/n bytes per rank as a ring reduce-scatter) followed by a local
// reduction in group-rank order. AllReduce is gloo::allreduce (ring), so every rank holds
// bitwise identical results. SendRecv posts unbound-buffer receives, then sends (each after
// its `prepare`), on slots (0x40 << 56) | (tag << 24) | k, k counting messages per (peer,
// direction), runs `while_waiting`, then waits. The blocking collectives run
// `while_waiting` before they start.
//
// Same-host messages: a SendRecv message of at least kSameHostMinBytes to or from a peer
// with a known pid (peer_pids[g] >= 0, the same on both ends: the factory agrees on it)
// moves by process_vm_writev. The receiver sends a 16-byte descriptor (address, bytes) of its
// buffer on slot (0x42 << 56) | (tag << 24) | k; the sender writes the bytes there, from
// SendOp::runs when given (no packing: `prepare` is not called) or from `data`, and acknowledges on
// slot (0x41 << 56) | (tag << 24) | k. The receiver's message completes with the acknowledgement.
class GlooCommunicator : public Communicator {
 public:
  static constexpr int64_t kSameHostMinBytes = int64_t{64} << 10;

  // peer_pids: empty, or one entry per group rank (-1: over TCP).
  GlooCommunicator(std::shared_ptr<gloo::Context> context, absl::Duration timeout,
                   std::vector<int64_t> peer_pids = {});
  ~GlooCommunicator() override;

  int rank() const override;
  int size() const override;
  bool broken() const override { return broken_.load(); }
  // Measured on 4 ranks, 256 MiB S(0) -> S(1): grouped send/recv into place ran at 1.5x
  // the throughput of alltoallv through staging buffers; all-gather similar.
  bool PrefersSendRecvForCopies() const override { return true; }
  bool RunsHooks() const override { return true; }
  bool SendsFromRuns(int peer, int64_t bytes) const override { return SameHost(peer, bytes); }

  absl::Status AllGatherV(const void* send, int64_t send_bytes, void* recv,
                          absl::Span<const int64_t> recv_bytes,
                          const CommOptions& options) override;
  absl::Status AllToAllV(const void* send, absl::Span<const int64_t> send_bytes, void* recv,
                         absl::Span<const int64_t> recv_bytes, const CommOptions& options) override;
  absl::Status ReduceScatterV(const void* send, void* recv, absl::Span<const int64_t> recv_elements,
                              DType dtype, ReduceOp op, const CommOptions& options) override;
  absl::Status AllReduce(const void* send, void* recv, int64_t elements, DType dtype, ReduceOp op,
                         const CommOptions& options) override;
  absl::Status Broadcast(void* data, int64_t bytes, int root, const CommOptions& options) override;
  absl::Status SendRecv(absl::Span<const SendOp> sends, absl::Span<const RecvOp> recvs,
                        const CommOptions& options) override;

  // Whether big messages to and from group rank `peer` go by same-host copy.
  bool SameHostPeer(int peer) const { return SameHost(peer, kSameHostMinBytes); }

 private:
  std::chrono::milliseconds TimeoutFor(const CommOptions& options) const;
  static absl::Status RunWhileWaiting(const CommOptions& options);
  // Runs `op`, turning Gloo's exceptions into a status and marking the communicator broken.
  template <typename F>
  absl::Status Guard(const char* what, F&& op);

  bool SameHost(int peer, int64_t bytes) const {
    return bytes >= kSameHostMinBytes && peer < static_cast<int>(peer_pids_.size()) &&
           peer_pids_[peer] >= 0;
  }

  std::shared_ptr<gloo::Context> context_;
  const absl::Duration timeout_;
  const std::vector<int64_t> peer_pids_;
  std::atomic<bool> broken_{false};
};

// Builds GlooCommunicators: one TCP device for the process, one rendezvous per communicator
// under "<key_prefix>gloo/<ranks>/<incarnations>/" in the KvClient.
class GlooCommunicatorFactory : public CommunicatorFactory {
 public:
  // `kv` must outlive the factory and every communicator it builds.
  static absl::StatusOr<std::shared_ptr<GlooCommunicatorFactory>> Create(KvClient* kv,
                                                                         GlooOptions options);

  absl::StatusOr<std::shared_ptr<Communicator>> Create(const CommunicatorSpec& spec) override;

  // The rendezvous key prefix of a spec (exposed for tests and logs).
  static std::string RendezvousPrefix(const CommunicatorSpec& spec);

 private:
  GlooCommunicatorFactory(KvClient* kv, std::shared_ptr<gloo::transport::Device> device,
                          bool same_host_copy);

  // Per group rank, the pid of a peer this rank and that peer both read by same-host copy,
  // else -1. Every member publishes its SameHostRecord under "<prefix>samehost/<g>" and
  // which peers it can read under "<prefix>samehost_ok/<g>"; a pair uses it only when both
  // directions work, so both ends decide alike.
  absl::StatusOr<std::vector<int64_t>> AgreeSameHostPeers(const std::string& prefix, int rank,
                                                          int size, absl::Duration timeout);

  // Gloo's TCP pairs accept the first connection to their listening socket, from anyone. So
  // before a communicator is used, each end proves to its peer that it read the peer's
  // nonce from the rendezvous store (the coordinator's KV store, which only authenticated
  // workers reach): every member publishes 32 random bytes under "<prefix>peerproof/<g>" and
  // sends each peer g SHA-256(nonce_g | its own group rank) over their connection; it checks
  // what arrives against SHA-256(own nonce | g) in constant time. PERMISSION_DENIED names
  // the peer whose proof is wrong (an impostor holds that connection); nothing else is sent.
  absl::Status VerifyPeers(gloo::Context& context, const std::string& prefix, int rank, int size,
                           absl::Duration timeout);

  KvClient* const kv_;
  const bool same_host_copy_;
  std::shared_ptr<gloo::transport::Device> device_;
};

}  // namespace shardcoord

#endif  // SHARDCOORD_WORKER_COMM_GLOO_GLOO_COMMUNICATOR_H_
