#include "worker/comm/gloo/gloo_communicator.h"

#include <gloo/allgatherv.h>
#include <gloo/allreduce.h>
#include <gloo/alltoallv.h>
#include <gloo/broadcast.h>
#include <gloo/common/error.h>
#include <gloo/common/logging.h>
#include <gloo/rendezvous/context.h>
#include <gloo/transport/tcp/device.h>
#include <gloo/transport/unbound_buffer.h>

#include <algorithm>
#include <csignal>
#include <cstring>
#include <exception>
#include <numeric>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/sha256.h"
#include "openssl/crypto.h"
#include "openssl/rand.h"
#include "sharding/box.h"
#include "sharding/box_copy.h"
#include "worker/comm/gloo/same_host.h"

namespace shardcoord {
namespace {

constexpr uint64_t kP2PSlotPrefix = 0x40;
constexpr uint64_t kP2PAckSlotPrefix = 0x41;    // Same-host: sender -> receiver, done.
constexpr uint64_t kP2PReadySlotPrefix = 0x42;  // Same-host: receiver -> sender, where to.

// What a same-host message carries over Gloo instead of its bytes.
struct SameHostDescriptor {
  uint64_t address = 0;
  uint64_t bytes = 0;
};
constexpr int64_t kMaxMessagesPerPeer = int64_t{1} << 24;

// Gloo asserts non-null data even for empty buffers.
char kEmpty[64];

void* NonNull(const void* p) { return p == nullptr ? kEmpty : const_cast<void*>(p); }

std::chrono::milliseconds ToMillis(absl::Duration d) {
  return std::chrono::milliseconds(std::max<int64_t>(1, absl::ToInt64Milliseconds(d)));
}

// out[i] = op(a[i], b[i]) for `n` elements; out may alias a or b.
absl::Status ReduceElements(DType dtype, ReduceOp op, void* out, const void* a, const void* b,
                            int64_t n) {
  const Box region({0}, {n});
  if (out == a) return ReduceIntoBox(region, b, region, out, region, dtype, op);
  // The ops are commutative (NaN propagates either way), so b == out reduces a into it.
  if (out == b) return ReduceIntoBox(region, a, region, out, region, dtype, op);
  std::memcpy(out, a, static_cast<size_t>(n * ElementSize(dtype)));
  return ReduceIntoBox(region, b, region, out, region, dtype, op);
}

absl::Status CheckReduceOp(ReduceOp op) {
  if (op == ReduceOp::kAvg) {
    return absl::InvalidArgumentError(
        "reduce op avg is not a communicator op: reduce with sum and divide");
  }
  return absl::OkStatus();
}

absl::Status CheckCounts(absl::Span<const int64_t> counts, int size, const char* name) {
  if (static_cast<int>(counts.size()) != size) {
    return absl::InvalidArgumentError(
        absl::StrCat(name, " has ", counts.size(), " entries for a group of ", size));
  }
  for (int64_t c : counts) {
    if (c < 0) return absl::InvalidArgumentError(absl::StrCat(name, " has negative count ", c));
  }
  return absl::OkStatus();
}

template <typename T>
void RunAllreduce(const std::shared_ptr<gloo::Context>& context, const void* send, void* recv,
                  int64_t elements, gloo::AllreduceOptions::Func fn, uint32_t tag,
                  std::chrono::milliseconds timeout) {
  gloo::AllreduceOptions opts(context);
  if (send != recv) opts.setInput(static_cast<T*>(NonNull(send)), elements);
  opts.setOutput(static_cast<T*>(NonNull(recv)), elements);
  opts.setReduceFunction(std::move(fn));
  opts.setTag(tag);
  opts.setTimeout(timeout);
  gloo::allreduce(opts);
}

}  // namespace

// ---------------------------------------------------------------------------------------
// KvGlooStore

KvGlooStore::KvGlooStore(KvClient* kv, std::string prefix, absl::Duration timeout)
    : kv_(kv), prefix_(std::move(prefix)), timeout_(timeout) {}

void KvGlooStore::set(const std::string& key, const std::vector<char>& data) {
  absl::Status s = kv_->Set(prefix_ + key, absl::string_view(data.data(), data.size()));
  if (!s.ok()) GLOO_THROW_IO_EXCEPTION("rendezvous set '", prefix_, key, "': ", s.ToString());
}

std::vector<char> KvGlooStore::get(const std::string& key) {
  {
    absl::MutexLock lock(&mu_);
    auto it = fetched_.find(key);
    if (it != fetched_.end()) return it->second;
  }
  absl::StatusOr<std::string> v = kv_->Get(prefix_ + key, timeout_);
  if (!v.ok()) {
    GLOO_THROW_IO_EXCEPTION("rendezvous get '", prefix_, key, "': ", v.status().ToString());
  }
  return std::vector<char>(v->begin(), v->end());
}

void KvGlooStore::wait(const std::vector<std::string>& keys) { wait(keys, ToMillis(timeout_)); }

void KvGlooStore::wait(const std::vector<std::string>& keys,
                       const std::chrono::milliseconds& timeout) {
  const absl::Time deadline = absl::Now() + absl::FromChrono(timeout);
  for (const std::string& key : keys) {
    {
      absl::MutexLock lock(&mu_);
      if (fetched_.contains(key)) continue;
    }
    absl::StatusOr<std::string> v =
        kv_->Get(prefix_ + key, std::max(absl::ZeroDuration(), deadline - absl::Now()));
    if (!v.ok()) {
      GLOO_THROW_IO_EXCEPTION("Wait timeout for key '", prefix_, key, "': ", v.status().ToString());
    }
    absl::MutexLock lock(&mu_);
    fetched_[key] = std::vector<char>(v->begin(), v->end());
  }
}

// ---------------------------------------------------------------------------------------
// GlooCommunicator

GlooCommunicator::GlooCommunicator(std::shared_ptr<gloo::Context> context, absl::Duration timeout,
                                   std::vector<int64_t> peer_pids)
    : context_(std::move(context)), timeout_(timeout), peer_pids_(std::move(peer_pids)) {}

GlooCommunicator::~GlooCommunicator() = default;

int GlooCommunicator::rank() const { return context_->rank; }
int GlooCommunicator::size() const { return context_->size; }

std::chrono::milliseconds GlooCommunicator::TimeoutFor(const CommOptions& options) const {
  return ToMillis(options.timeout > absl::ZeroDuration() ? options.timeout : timeout_);
}

absl::Status GlooCommunicator::RunWhileWaiting(const CommOptions& options) {
  // Gloo's collectives block until done, so the overlapping work runs first.
  return options.while_waiting ? options.while_waiting() : absl::OkStatus();
}

template <typename F>
absl::Status GlooCommunicator::Guard(const char* what, F&& op) {
  if (broken_.load()) {
    return absl::AbortedError(absl::StrCat(what, ": communicator is broken by an earlier failure"));
  }
  try {
    return op();
  } catch (const gloo::IoException& e) {
    broken_ = true;
    const std::string msg = e.what();
    if (absl::StrContains(msg, "Timed out") || absl::StrContains(msg, "timeout")) {
      return absl::DeadlineExceededError(
          absl::StrCat(what, " on group rank ", rank(), "/", size(), " timed out: ", msg));
    }
    return absl::AbortedError(
        absl::StrCat(what, " on group rank ", rank(), "/", size(), " failed: ", msg));
  } catch (const std::exception& e) {
    broken_ = true;
    return absl::InternalError(
        absl::StrCat(what, " on group rank ", rank(), "/", size(), " failed in Gloo: ", e.what()));
  }
}

absl::Status GlooCommunicator::AllGatherV(const void* send, int64_t send_bytes, void* recv,
                                          absl::Span<const int64_t> recv_bytes,
                                          const CommOptions& options) {
  if (absl::Status s = CheckCounts(recv_bytes, size(), "recv_bytes"); !s.ok()) return s;
  if (recv_bytes[rank()] != send_bytes) {
    return absl::InvalidArgumentError(absl::StrCat("send_bytes ", send_bytes, " != recv_bytes[",
                                                   rank(), "] ", recv_bytes[rank()]));
  }
  if (absl::Status s = RunWhileWaiting(options); !s.ok()) return s;
  return Guard("allgatherv", [&] {
    gloo::AllgathervOptions opts(context_);
    opts.setInput(static_cast<char*>(NonNull(send)), static_cast<size_t>(send_bytes));
    opts.setOutput(static_cast<char*>(NonNull(recv)),
                   std::vector<size_t>(recv_bytes.begin(), recv_bytes.end()));
    opts.setTag(options.tag);
    opts.setTimeout(TimeoutFor(options));
    gloo::allgatherv(opts);
    return absl::OkStatus();
  });
}

absl::Status GlooCommunicator::AllToAllV(const void* send, absl::Span<const int64_t> send_bytes,
                                         void* recv, absl::Span<const int64_t> recv_bytes,
                                         const CommOptions& options) {
  if (absl::Status s = CheckCounts(send_bytes, size(), "send_bytes"); !s.ok()) return s;
  if (absl::Status s = CheckCounts(recv_bytes, size(), "recv_bytes"); !s.ok()) return s;
  if (send_bytes[rank()] != recv_bytes[rank()]) {
    return absl::InvalidArgumentError(absl::StrCat("send_bytes[", rank(), "] ", send_bytes[rank()],
                                                   " != recv_bytes[", rank(), "] ",
                                                   recv_bytes[rank()]));
  }
  if (absl::Status s = RunWhileWaiting(options); !s.ok()) return s;
  return Guard("alltoallv", [&] {
    gloo::AlltoallvOptions opts(context_);
    opts.setInput(static_cast<char*>(NonNull(send)),
                  std::vector<int64_t>(send_bytes.begin(), send_bytes.end()));
    opts.setOutput(static_cast<char*>(NonNull(recv)),
                   std::vector<int64_t>(recv_bytes.begin(), recv_bytes.end()));
    opts.setTag(options.tag);
    opts.setTimeout(TimeoutFor(options));
    gloo::alltoallv(opts);
    return absl::OkStatus();
  });
}

absl::Status GlooCommunicator::ReduceScatterV(const void* send, void* recv,
                                              absl::Span<const int64_t> recv_elements, DType dtype,
                                              ReduceOp op, const CommOptions& options) {
  if (absl::Status s = CheckReduceOp(op); !s.ok()) return s;
  if (absl::Status s = CheckCounts(recv_elements, size(), "recv_elements"); !s.ok()) return s;
  const int64_t es = ElementSize(dtype);
  const int n = size();
  const int64_t mine = recv_elements[rank()];
  std::vector<int64_t> send_bytes(n), recv_bytes(n, mine * es);
  for (int r = 0; r < n; ++r) send_bytes[r] = recv_elements[r] * es;
  // Every rank's copy of my slice, in group-rank order.
  std::vector<char> gathered(static_cast<size_t>(n * mine * es));
  absl::Status s = AllToAllV(send, send_bytes, gathered.data(), recv_bytes, options);
  if (!s.ok()) return s;
  if (mine == 0) return absl::OkStatus();
  std::memcpy(recv, gathered.data(), static_cast<size_t>(mine * es));
  const Box region({0}, {mine});
  for (int r = 1; r < n; ++r) {
    s = ReduceIntoBox(region, gathered.data() + r * mine * es, region, recv, region, dtype, op);
    if (!s.ok()) return s;
  }
  return absl::OkStatus();
}

absl::Status GlooCommunicator::AllReduce(const void* send, void* recv, int64_t elements,
                                         DType dtype, ReduceOp op, const CommOptions& options) {
  if (absl::Status s = CheckReduceOp(op); !s.ok()) return s;
  if (elements < 0) return absl::InvalidArgumentError(absl::StrCat("elements ", elements));
  if (absl::Status s = RunWhileWaiting(options); !s.ok()) return s;
  if (elements == 0) return absl::OkStatus();  // Same count everywhere: all skip.
  // The reduce function cannot return a status; the dtype and op are checked here, so a
  // failure inside it is a broken invariant.
  gloo::AllreduceOptions::Func fn = [dtype, op](void* out, const void* a, const void* b, size_t n) {
    absl::Status s = ReduceElements(dtype, op, out, a, b, static_cast<int64_t>(n));
    if (!s.ok()) GLOO_THROW("reduction failed: ", s.ToString());
  };
  return Guard("allreduce", [&] {
    const auto timeout = TimeoutFor(options);
    switch (ElementSize(dtype)) {
      case 1:
        RunAllreduce<uint8_t>(context_, send, recv, elements, fn, options.tag, timeout);
        break;
      case 2:
        RunAllreduce<uint16_t>(context_, send, recv, elements, fn, options.tag, timeout);
        break;
      case 4:
        RunAllreduce<uint32_t>(context_, send, recv, elements, fn, options.tag, timeout);
        break;
      case 8:
        RunAllreduce<uint64_t>(context_, send, recv, elements, fn, options.tag, timeout);
        break;
      default:
        return absl::InvalidArgumentError("unsupported element size");
    }
    return absl::OkStatus();
  });
}

absl::Status GlooCommunicator::Broadcast(void* data, int64_t bytes, int root,
                                         const CommOptions& options) {
  if (root < 0 || root >= size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("broadcast root ", root, " is not in a group of ", size()));
  }
  if (bytes < 0) return absl::InvalidArgumentError(absl::StrCat("bytes ", bytes));
  if (absl::Status s = RunWhileWaiting(options); !s.ok()) return s;
  if (bytes == 0) return absl::OkStatus();
  return Guard("broadcast", [&] {
    gloo::BroadcastOptions opts(context_);
    opts.setOutput(static_cast<char*>(NonNull(data)), static_cast<size_t>(bytes));
    opts.setRoot(root);
    opts.setTag(options.tag);
    opts.setTimeout(TimeoutFor(options));
    gloo::broadcast(opts);
    return absl::OkStatus();
  });
}

absl::Status GlooCommunicator::SendRecv(absl::Span<const SendOp> sends,
                                        absl::Span<const RecvOp> recvs,
                                        const CommOptions& options) {
  std::vector<int64_t> per_peer(size(), 0);
  for (const SendOp& op : sends) {
    if (op.peer < 0 || op.peer >= size() || op.peer == rank() || op.bytes < 0 ||
        ++per_peer[op.peer] > kMaxMessagesPerPeer) {
      return absl::InvalidArgumentError(absl::StrCat("send to peer ", op.peer, " of ", op.bytes,
                                                     " bytes from group rank ", rank(), "/",
                                                     size()));
    }
  }
  std::fill(per_peer.begin(), per_peer.end(), 0);
  for (const RecvOp& op : recvs) {
    if (op.peer < 0 || op.peer >= size() || op.peer == rank() || op.bytes < 0 ||
        ++per_peer[op.peer] > kMaxMessagesPerPeer) {
      return absl::InvalidArgumentError(absl::StrCat("recv from peer ", op.peer, " of ", op.bytes,
                                                     " bytes at group rank ", rank(), "/", size()));
    }
  }
  const uint64_t base = (kP2PSlotPrefix << 56) | (static_cast<uint64_t>(options.tag) << 24);
  const uint64_t ack_base = (kP2PAckSlotPrefix << 56) | (static_cast<uint64_t>(options.tag) << 24);
  // Descriptors flow against the message, so they get slots of their own: the peer's own
  // messages to us use base | k.
  const uint64_t ready_base =
      (kP2PReadySlotPrefix << 56) | (static_cast<uint64_t>(options.tag) << 24);
  return Guard("send/recv", [&]() -> absl::Status {
    const auto timeout = TimeoutFor(options);
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    auto remaining = [&] {
      return std::max(std::chrono::milliseconds(1),
                      std::chrono::duration_cast<std::chrono::milliseconds>(
                          deadline - std::chrono::steady_clock::now()));
    };
    // A failing hook or same-host copy leaves messages posted with the peers: the
    // communicator cannot be trusted afterwards.
    auto failed = [&](const absl::Status& s) {
      broken_ = true;
      return s;
    };
    using Buffer = std::unique_ptr<gloo::transport::UnboundBuffer>;
    std::vector<int64_t> sent(size(), 0), received(size(), 0);
    // Fixed-size arrays: Gloo holds pointers into them until the waits below.
    std::vector<SameHostDescriptor> ready_in(sends.size()), ready_out(recvs.size());
    std::vector<uint64_t> acks_out(sends.size()), acks_in(recvs.size());
    struct Recv {
      Buffer buf;  // The data, or for a same-host message the sender's acknowledgement.
      const RecvOp* op;
      const uint64_t* ack;  // Same-host: the acknowledged byte count; else null.
    };
    struct SameHostSend {
      Buffer ready;  // The receiver's descriptor of where the bytes go.
      const SendOp* op;
      size_t index;  // In `sends`.
      uint64_t k;    // Message number to this peer.
    };
    std::vector<Buffer> send_bufs;  // Data, descriptors and acknowledgements we send.
    std::vector<Recv> recv_bufs;
    std::vector<SameHostSend> same_host_sends;
    // Every receive first, so no peer's send waits on our packing. A same-host receive tells
    // the sender where to write and waits for its acknowledgement.
    for (size_t i = 0; i < recvs.size(); ++i) {
      const RecvOp& op = recvs[i];
      const int64_t k = received[op.peer]++;
      if (op.bytes == 0) {  // Both sides skip empty messages.
        if (op.done) {
          if (absl::Status s = op.done(); !s.ok()) return failed(s);
        }
        continue;
      }
      if (SameHost(op.peer, op.bytes)) {
        ready_out[i] = {reinterpret_cast<uint64_t>(op.data), static_cast<uint64_t>(op.bytes)};
        auto ready = context_->createUnboundBuffer(&ready_out[i], sizeof(SameHostDescriptor));
        ready->send(op.peer, ready_base | static_cast<uint64_t>(k));
        send_bufs.push_back(std::move(ready));
        auto ack = context_->createUnboundBuffer(&acks_in[i], sizeof(uint64_t));
        ack->recv(op.peer, ack_base | static_cast<uint64_t>(k));
        recv_bufs.push_back(Recv{std::move(ack), &op, &acks_in[i]});
        continue;
      }
      auto buf = context_->createUnboundBuffer(op.data, static_cast<size_t>(op.bytes));
      buf->recv(op.peer, base | static_cast<uint64_t>(k));
      recv_bufs.push_back(Recv{std::move(buf), &op, nullptr});
    }
    for (size_t i = 0; i < sends.size(); ++i) {
      const SendOp& op = sends[i];
      const int64_t k = sent[op.peer]++;
      const bool same_host = op.bytes > 0 && SameHost(op.peer, op.bytes);
      // Same-host sends with runs go straight from them: nothing to pack.
      if (op.prepare && !(same_host && !op.runs.empty())) {
        if (absl::Status s = op.prepare(); !s.ok()) return failed(s);
      }
      if (op.bytes == 0) continue;
      if (same_host) {
        auto ready = context_->createUnboundBuffer(&ready_in[i], sizeof(SameHostDescriptor));
        ready->recv(op.peer, ready_base | static_cast<uint64_t>(k));
        same_host_sends.push_back(SameHostSend{std::move(ready), &op, i, static_cast<uint64_t>(k)});
        continue;
      }
      auto buf =
          context_->createUnboundBuffer(const_cast<void*>(op.data), static_cast<size_t>(op.bytes));
      buf->send(op.peer, base | static_cast<uint64_t>(k));
      send_bufs.push_back(std::move(buf));
    }
    if (options.while_waiting) {
      if (absl::Status s = options.while_waiting(); !s.ok()) return failed(s);
    }
    // Cancellation interrupts the waits below (the aborts are sticky, so a cancel that comes
    // before a wait starts counts too). Removed before the buffers go.
    struct CancelGuard {
      CancelToken* token = nullptr;
      int64_t handle = -1;
      ~CancelGuard() {
        if (token != nullptr && handle >= 0) token->Remove(handle);
      }
    } guard;
    // Acknowledgements we send: not in the cancel callback (which runs on another thread
    // while this one appends); they are 8 bytes to a receive posted at the start.
    std::vector<Buffer> ack_bufs;
    ack_bufs.reserve(same_host_sends.size());
    if (options.cancel != nullptr) {
      guard.token = options.cancel;
      guard.handle = options.cancel->OnCancel([&recv_bufs, &send_bufs, &same_host_sends] {
        for (auto& r : recv_bufs) r.buf->abortWaitRecv();
        for (auto& s : same_host_sends) s.ready->abortWaitRecv();
        for (auto& buf : send_bufs) buf->abortWaitSend();
      });
    }
    // Same-host sends: write where each receiver said, then acknowledge. Every descriptor was
    // posted before any rank waits, so these waits cannot form a cycle.
    for (SameHostSend& s : same_host_sends) {
      if (!s.ready->waitRecv(remaining())) GLOO_THROW_IO_EXCEPTION("recv cancelled");
      const SendOp& op = *s.op;
      const SameHostDescriptor& to = ready_in[s.index];
      if (to.bytes != static_cast<uint64_t>(op.bytes)) {
        return failed(
            absl::DataLossError(absl::StrCat("same-host message ", s.k, " to group rank ", op.peer,
                                             " expects ", to.bytes, " bytes, sending ", op.bytes)));
      }
      const MemoryRuns whole = {{static_cast<const char*>(op.data), op.bytes}};
      absl::Status wrote =
          WritePeerMemory(peer_pids_[op.peer], to.address, op.runs.empty() ? whole : op.runs);
      if (!wrote.ok()) {
        return failed(absl::Status(wrote.code(), absl::StrCat("same-host copy to group rank ",
                                                              op.peer, ": ", wrote.message())));
      }
      acks_out[s.index] = to.bytes;
      auto ack = context_->createUnboundBuffer(&acks_out[s.index], sizeof(uint64_t));
      ack->send(op.peer, ack_base | s.k);
      ack_bufs.push_back(std::move(ack));
    }
    for (Recv& r : recv_bufs) {
      if (!r.buf->waitRecv(remaining())) GLOO_THROW_IO_EXCEPTION("recv cancelled");
      if (r.ack != nullptr && *r.ack != static_cast<uint64_t>(r.op->bytes)) {
        return failed(absl::DataLossError(absl::StrCat("same-host message from group rank ",
                                                       r.op->peer, " acknowledged ", *r.ack,
                                                       " bytes, expected ", r.op->bytes)));
      }
      if (r.op->done) {
        if (absl::Status s = r.op->done(); !s.ok()) return failed(s);
      }
    }
    for (auto& buf : send_bufs) {
      if (!buf->waitSend(remaining())) GLOO_THROW_IO_EXCEPTION("send cancelled");
    }
    for (auto& buf : ack_bufs) {
      if (!buf->waitSend(remaining())) GLOO_THROW_IO_EXCEPTION("send cancelled");
    }
    return absl::OkStatus();
  });
}

// ---------------------------------------------------------------------------------------
// GlooCommunicatorFactory

absl::StatusOr<std::shared_ptr<GlooCommunicatorFactory>> GlooCommunicatorFactory::Create(
    KvClient* kv, GlooOptions options) {
  // Gloo's TCP pairs write without MSG_NOSIGNAL: when a peer closes its sockets mid-transfer
  // (its plan was aborted, it died), the next write raises SIGPIPE, whose default action
  // kills this process without a word. Ignored, the write fails with EPIPE, which Gloo turns
  // into an IoException and the step into an error. Process-wide, as gRPC also does.
  std::signal(SIGPIPE, SIG_IGN);
  try {
    gloo::transport::tcp::attr attr;
    attr.hostname = options.hostname;
    std::shared_ptr<gloo::transport::Device> device = gloo::transport::tcp::CreateDevice(attr);
    return std::shared_ptr<GlooCommunicatorFactory>(
        new GlooCommunicatorFactory(kv, std::move(device), options.same_host_copy));
  } catch (const std::exception& e) {
    return absl::UnavailableError(
        absl::StrCat("cannot create a Gloo TCP device on '", options.hostname, "': ", e.what()));
  }
}

GlooCommunicatorFactory::GlooCommunicatorFactory(KvClient* kv,
                                                 std::shared_ptr<gloo::transport::Device> device,
                                                 bool same_host_copy)
    : kv_(kv), same_host_copy_(same_host_copy), device_(std::move(device)) {}

absl::StatusOr<std::vector<int64_t>> GlooCommunicatorFactory::AgreeSameHostPeers(
    const std::string& prefix, int rank, int size, absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  const SameHostRecord self = LocalSameHostRecord(same_host_copy_);
  if (absl::Status s = kv_->Set(absl::StrCat(prefix, "samehost/", rank), self.Encode()); !s.ok()) {
    return s;
  }
  std::vector<SameHostRecord> peers(size);
  std::string readable(size, '0');
  for (int g = 0; g < size; ++g) {
    if (g == rank) continue;
    absl::StatusOr<std::string> v =
        kv_->Get(absl::StrCat(prefix, "samehost/", g), deadline - absl::Now());
    if (!v.ok()) return v.status();
    absl::StatusOr<SameHostRecord> peer = SameHostRecord::Decode(*v);
    if (!peer.ok()) return peer.status();
    peers[g] = *peer;
    if (CanReadPeer(self, peers[g])) readable[g] = '1';
  }
  if (absl::Status s = kv_->Set(absl::StrCat(prefix, "samehost_ok/", rank), readable); !s.ok()) {
    return s;
  }
  std::vector<int64_t> pids(size, -1);
  for (int g = 0; g < size; ++g) {
    if (g == rank) continue;
    absl::StatusOr<std::string> v =
        kv_->Get(absl::StrCat(prefix, "samehost_ok/", g), deadline - absl::Now());
    if (!v.ok()) return v.status();
    if (readable[g] == '1' && static_cast<int>(v->size()) == size && (*v)[rank] == '1') {
      pids[g] = peers[g].pid;
    }
  }
  return pids;
}

absl::Status GlooCommunicatorFactory::VerifyPeers(gloo::Context& context, const std::string& prefix,
                                                  int rank, int size, absl::Duration timeout) {
  // A slot no plan uses: the communicator is fresh, but keep the proofs apart anyway.
  constexpr uint64_t kProofSlot = 0x7072'6f6f'6600'0000;  // "proof"
  const absl::Time deadline = absl::Now() + timeout;
  std::string nonce(32, '\0');
  if (RAND_bytes(reinterpret_cast<unsigned char*>(nonce.data()), 32) != 1) {
    return absl::InternalError("no random bytes for the peer proof (RAND_bytes failed)");
  }
  if (absl::Status s = kv_->Set(absl::StrCat(prefix, "peerproof/", rank), nonce); !s.ok()) return s;
  std::vector<Sha256Digest> out(size), in(size), want(size);
  for (int g = 0; g < size; ++g) {
    if (g == rank) continue;
    absl::StatusOr<std::string> theirs =
        kv_->Get(absl::StrCat(prefix, "peerproof/", g), deadline - absl::Now());
    if (!theirs.ok()) return theirs.status();
    out[g] = Sha256(absl::StrCat(*theirs, "|", rank));
    want[g] = Sha256(absl::StrCat(nonce, "|", g));
  }
  std::vector<std::unique_ptr<gloo::transport::UnboundBuffer>> sends, recvs;
  for (int g = 0; g < size; ++g) {
    if (g == rank) continue;
    sends.push_back(context.createUnboundBuffer(out[g].data(), out[g].size()));
    sends.back()->send(g, kProofSlot);
    recvs.push_back(context.createUnboundBuffer(in[g].data(), in[g].size()));
    recvs.back()->recv(g, kProofSlot);
  }
  for (auto& b : recvs)
    b->waitRecv(ToMillis(std::max(absl::ZeroDuration(), deadline - absl::Now())));
  for (auto& b : sends)
    b->waitSend(ToMillis(std::max(absl::ZeroDuration(), deadline - absl::Now())));
  for (int g = 0; g < size; ++g) {
    if (g != rank && CRYPTO_memcmp(in[g].data(), want[g].data(), want[g].size()) != 0) {
      return absl::PermissionDeniedError(
          absl::StrCat("the connection to group rank ", g,
                       " does not prove it took part in the rendezvous "
                       "(wrong peer proof): refusing it, as an impostor may hold it"));
    }
  }
  return absl::OkStatus();
}

std::string GlooCommunicatorFactory::RendezvousPrefix(const CommunicatorSpec& spec) {
  return absl::StrCat(spec.key_prefix, "gloo/", absl::StrJoin(spec.ranks, ","), "/",
                      absl::StrJoin(spec.incarnations, ","), "/");
}

absl::StatusOr<std::shared_ptr<Communicator>> GlooCommunicatorFactory::Create(
    const CommunicatorSpec& spec) {
  if (absl::Status s = ValidateCommunicatorSpec(spec); !s.ok()) return s;
  const int rank = GroupRankOf(spec);
  const int size = static_cast<int>(spec.ranks.size());
  const std::string prefix = RendezvousPrefix(spec);
  try {
    auto context = std::make_shared<gloo::rendezvous::Context>(rank, size);
    context->setTimeout(ToMillis(spec.timeout));
    KvGlooStore store(kv_, prefix, spec.timeout);
    context->connectFullMesh(store, device_);
    if (absl::Status s = VerifyPeers(*context, prefix, rank, size, spec.timeout); !s.ok()) {
      return absl::Status(s.code(), absl::StrCat("Gloo rendezvous '", prefix, "' as group rank ",
                                                 rank, "/", size, ": ", s.message()));
    }
    absl::StatusOr<std::vector<int64_t>> pids =
        AgreeSameHostPeers(prefix, rank, size, spec.timeout);
    if (!pids.ok()) {
      return absl::Status(pids.status().code(),
                          absl::StrCat("same-host rendezvous '", prefix, "' as group rank ", rank,
                                       "/", size, ": ", pids.status().message()));
    }
    return std::shared_ptr<Communicator>(
        std::make_shared<GlooCommunicator>(std::move(context), spec.timeout, *pids));
  } catch (const gloo::IoException& e) {
    const std::string msg = e.what();
    const std::string what =
        absl::StrCat("Gloo rendezvous '", prefix, "' as group rank ", rank, "/", size, ": ", msg);
    if (absl::StrContains(msg, "timeout") || absl::StrContains(msg, "Timed out") ||
        absl::StrContains(msg, "DEADLINE_EXCEEDED")) {
      return absl::DeadlineExceededError(what);
    }
    return absl::UnavailableError(what);
  } catch (const std::exception& e) {
    return absl::InternalError(absl::StrCat("Gloo rendezvous '", prefix, "' failed: ", e.what()));
  }
}

}  // namespace shardcoord
