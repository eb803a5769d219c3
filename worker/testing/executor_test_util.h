#ifndef SHARDCOORD_WORKER_TESTING_EXECUTOR_TEST_UTIL_H_
#define SHARDCOORD_WORKER_TESTING_EXECUTOR_TEST_UTIL_H_

// What the executor tests share: the values a test tensor holds, source buffers filled with
// them, layouts from spec strings, and a plan's fragments in wire form.

#include <cstdint>
#include <functional>
#include <memory>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "proto/shardcoord.pb.h"
#include "sharding/box.h"
#include "sharding/dtype.h"
#include "sharding/layout.h"
#include "sharding/placement.h"
#include "sharding/plan.h"
#include "sharding/plan_fragment.h"
#include "worker/buffers/buffer_store.h"
#include "worker/comm/communicator.h"
#include "worker/comm/gloo/gloo_communicator.h"
#include "worker/control/kv_client.h"
#include "worker/memory/memory_space.h"
#include "worker/plans/executor.h"
#include "worker/plans/fragment.h"
#include "worker/testing/fake_device_memory_space.h"

namespace shardcoord {
namespace executor_testing {

// The value contribution `partial` holds at flat index `flat` of a Partial test tensor, and
// what the reduction of `partials` contributions gives there (the flat index itself for
// a tensor that is not Partial).
double Contribution(ReduceOp op, int64_t flat, int64_t partial);
double Reduced(ReduceOp op, int64_t flat, int64_t partials);

// Calls fn(i, flat) for every element of `box`, i counting row-major inside the box.
void ForEachElement(const Shape& shape, const Box& box,
                    const std::function<void(int64_t, int64_t)>& fn);

// Rank `rank`'s source chunks of `layout` holding the values above plus `offset`, in `space`
// (null: host); null when the rank holds nothing.
std::shared_ptr<HostBuffer> MakeSource(const Layout& layout, int64_t rank, DType dtype,
                                       MemorySpace* space = nullptr, double offset = 0);

// A layout from "S(0),R"-style placements or "flat a:b;c:d;..." over a mesh of `mesh_shape`
// on `ranks` (empty: 0..n-1). Fails the test on a bad spec.
Layout MakeLayout(const Shape& mesh_shape, const std::vector<int64_t>& ranks,
                  const std::string& spec, const Shape& shape);

// What `rank` does in `plan` alone, as the coordinator sends it (MakeFragments, then
// FragmentToProto); a rank outside the plan gets a fragment with no chunks or steps.
v1::PlanFragment PlanFragmentFor(const Plan& plan, int64_t rank, const FragmentOptions& options,
                                 const FragmentMemberOptions& member);

// The fragments of ranks 0..ranks-1 for plan `id` of tensor "T", version 1 -> 2, every
// incarnation 1, a 30 s step timeout and a communicator prefix of its own.
std::vector<v1::PlanFragment> Fragments(const Plan& plan, const std::string& id, int ranks = 4);

// Checks every rank's result against `target`: its chunks, and for each chunk (its bytes
// `chunk(rank, k)`) the reported checksum and every element (`source`'s values reduced; zero
// in a Sum target's other partials). A failed rank ends the check.
void CheckTargets(const Layout& source, const Layout& target, DType dtype,
                  const std::vector<absl::StatusOr<ExecuteResult>>& results,
                  const std::function<absl::string_view(int rank, size_t k)>& chunk);

// The ranks of a test plan, run on threads of one process: a gloo communicator cache per
// rank over one in-memory KV, each factory wrapped in an NcclLikeFactory if `nccl_like`.
struct GlooCluster {
  explicit GlooCluster(int ranks, bool nccl_like = false, const GlooOptions& options = {});
  InMemoryKvClient kv;
  std::vector<std::unique_ptr<CommunicatorCache>> caches;
};

// Runs `fragments[r]` from `sources[r]` into `targets[r]` for every rank r, each on a thread
// of its own with `cluster`'s communicators; checks that a rank's progress never goes back
// and, once it succeeds, ends at its total. The ranks' results, in rank order.
std::vector<absl::StatusOr<ExecuteResult>> ExecuteOnThreads(
    GlooCluster& cluster, const std::vector<Fragment>& fragments,
    const std::vector<std::shared_ptr<HostBuffer>>& sources,
    const std::vector<std::shared_ptr<HostBuffer>>& targets, const ExecutorOptions& options);

// The methods that the successful `results` ran their steps with.
std::set<StepOp> MethodsOf(const std::vector<absl::StatusOr<ExecuteResult>>& results);

// One fake GPU per rank, named "fake-cuda:<rank>".
struct FakeDevices {
  explicit FakeDevices(int ranks);
  MemorySpace* at(int r) { return spaces[r].get(); }
  std::vector<std::unique_ptr<FakeDeviceMemorySpace>> spaces;
};

// Gloo with NCCL's manners, for tests of the device paths: copies run as their collectives
// (PrefersSendRecvForCopies false), and SendRecv's hooks are run around the call by
// SendRecvWithHooks rather than by the backend (RunsHooks false; a hook handed to SendRecv
// fails the test).
class NcclLikeCommunicator final : public Communicator {
 public:
  explicit NcclLikeCommunicator(std::shared_ptr<Communicator> inner) : inner_(std::move(inner)) {}
  int rank() const override { return inner_->rank(); }
  int size() const override { return inner_->size(); }
  bool broken() const override { return inner_->broken(); }
  bool PrefersSendRecvForCopies() const override { return false; }
  bool RunsHooks() const override { return false; }
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

 private:
  const std::shared_ptr<Communicator> inner_;
};

// Wraps every communicator `inner` builds in an NcclLikeCommunicator.
class NcclLikeFactory final : public CommunicatorFactory {
 public:
  explicit NcclLikeFactory(std::shared_ptr<CommunicatorFactory> inner) : inner_(std::move(inner)) {}
  absl::StatusOr<std::shared_ptr<Communicator>> Create(const CommunicatorSpec& spec) override;

 private:
  const std::shared_ptr<CommunicatorFactory> inner_;
};

}  // namespace executor_testing
}  // namespace shardcoord

#endif  // SHARDCOORD_WORKER_TESTING_EXECUTOR_TEST_UTIL_H_
