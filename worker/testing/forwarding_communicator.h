#ifndef SHARDCOORD_WORKER_TESTING_FORWARDING_COMMUNICATOR_H_
#define SHARDCOORD_WORKER_TESTING_FORWARDING_COMMUNICATOR_H_

// A Communicator that passes every call to a real one, for tests that change one of its
// manners (which copies it prefers as collectives, whether it runs hooks) by overriding that
// method; and a factory that wraps every communicator it creates.

#include <functional>
#include <memory>
#include <utility>

#include "worker/comm/communicator.h"

namespace shardcoord {

class ForwardingCommunicator : public Communicator {
 public:
  explicit ForwardingCommunicator(std::shared_ptr<Communicator> inner) : inner_(std::move(inner)) {}

  int rank() const override { return inner_->rank(); }
  int size() const override { return inner_->size(); }
  bool broken() const override { return inner_->broken(); }
  bool PrefersSendRecvForCopies() const override { return inner_->PrefersSendRecvForCopies(); }
  bool RunsHooks() const override { return inner_->RunsHooks(); }
  absl::Status AllGatherV(const void* send, int64_t send_bytes, void* recv,
                          absl::Span<const int64_t> recv_bytes,
                          const CommOptions& options) override {
    return inner_->AllGatherV(send, send_bytes, recv, recv_bytes, options);
  }
  absl::Status AllToAllV(const void* send, absl::Span<const int64_t> send_bytes, void* recv,
                         absl::Span<const int64_t> recv_bytes,
                         const CommOptions& options) override {
    return inner_->AllToAllV(send, send_bytes, recv, recv_bytes, options);
  }
  absl::Status ReduceScatterV(const void* send, void* recv, absl::Span<const int64_t> recv_elements,
                              DType dtype, ReduceOp op, const CommOptions& options) override {
    return inner_->ReduceScatterV(send, recv, recv_elements, dtype, op, options);
  }
  absl::Status AllReduce(const void* send, void* recv, int64_t elements, DType dtype, ReduceOp op,
                         const CommOptions& options) override {
    return inner_->AllReduce(send, recv, elements, dtype, op, options);
  }
  absl::Status Broadcast(void* data, int64_t bytes, int root, const CommOptions& options) override {
    return inner_->Broadcast(data, bytes, root, options);
  }
  absl::Status SendRecv(absl::Span<const SendOp> sends, absl::Span<const RecvOp> recvs,
                        const CommOptions& options) override {
    return inner_->SendRecv(sends, recvs, options);
  }

 protected:
  Communicator& inner() const { return *inner_; }

 private:
  const std::shared_ptr<Communicator> inner_;
};

// Creates communicators with `inner` and hands each to `wrap`.
class WrappingCommunicatorFactory final : public CommunicatorFactory {
 public:
  using Wrap = std::function<std::shared_ptr<Communicator>(std::shared_ptr<Communicator>)>;
  WrappingCommunicatorFactory(std::shared_ptr<CommunicatorFactory> inner, Wrap wrap)
      : inner_(std::move(inner)), wrap_(std::move(wrap)) {}

  absl::StatusOr<std::shared_ptr<Communicator>> Create(const CommunicatorSpec& spec) override {
    absl::StatusOr<std::shared_ptr<Communicator>> c = inner_->Create(spec);
    if (!c.ok()) return c.status();
    return wrap_(*std::move(c));
  }

 private:
  const std::shared_ptr<CommunicatorFactory> inner_;
  const Wrap wrap_;
};

}  // namespace shardcoord

#endif  // SHARDCOORD_WORKER_TESTING_FORWARDING_COMMUNICATOR_H_
