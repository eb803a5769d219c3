#include "worker/testing/executor_test_util.h"

#include <map>
#include <thread>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "proto/convert.h"
#include "sharding/fill.h"
#include "sharding/mesh.h"
#include "worker/buffers/checksum.h"

namespace shardcoord {
namespace executor_testing {

double Contribution(ReduceOp op, int64_t flat, int64_t partial) {
  switch (op) {
    case ReduceOp::kSum:
    case ReduceOp::kAvg:
      return static_cast<double>(flat * (partial + 1));
    case ReduceOp::kMax:
      return static_cast<double>(flat + partial);
    case ReduceOp::kMin:
      return static_cast<double>(flat - partial);
  }
  return 0;
}

double Reduced(ReduceOp op, int64_t flat, int64_t partials) {
  if (partials <= 1) return static_cast<double>(flat);
  switch (op) {
    case ReduceOp::kSum:
      return static_cast<double>(flat * partials * (partials + 1) / 2);
    case ReduceOp::kAvg:
      return static_cast<double>(flat * (partials + 1)) / 2.0;
    case ReduceOp::kMax:
      return static_cast<double>(flat + partials - 1);
    case ReduceOp::kMin:
      return static_cast<double>(flat - partials + 1);
  }
  return 0;
}

void ForEachElement(const Shape& shape, const Box& box,
                    const std::function<void(int64_t, int64_t)>& fn) {
  if (box.Empty()) return;
  const Shape strides = RowMajorStrides(shape);
  Shape idx(box.ndim(), 0);
  for (int64_t i = 0; i < box.Volume(); ++i) {
    int64_t flat = 0;
    for (int d = 0; d < box.ndim(); ++d) flat += (box.offset(d) + idx[d]) * strides[d];
    fn(i, flat);
    for (int d = box.ndim() - 1; d >= 0; --d) {
      if (++idx[d] < box.shape(d)) break;
      idx[d] = 0;
    }
  }
}

std::shared_ptr<HostBuffer> MakeSource(const Layout& layout, int64_t rank, DType dtype,
                                       MemorySpace* space, double offset) {
  const RankChunks* rc = layout.Find(rank);
  if (rc == nullptr) return nullptr;
  auto host = *HostBuffer::Create(dtype, *rc);
  for (size_t k = 0; k < rc->chunks.size(); ++k) {
    const Chunk& c = rc->chunks[k];
    char* data = host->chunk_data(k);
    ForEachElement(layout.global_shape(), c.box, [&](int64_t i, int64_t flat) {
      const double v = layout.is_partial()
                           ? Contribution(layout.partial_op(), flat, c.partial_index) + offset
                           : static_cast<double>(flat) + offset;
      StoreFromDouble(data, dtype, i, v);
    });
  }
  if (space == nullptr) return host;
  auto device = *HostBuffer::Create(dtype, *rc, space);
  EXPECT_TRUE(space->CopyFromHost(device->data(), host->data(), host->bytes()).ok());
  return device;
}

void CheckTargets(const Layout& source, const Layout& target, DType dtype,
                  const std::vector<absl::StatusOr<ExecuteResult>>& results,
                  const std::function<absl::string_view(int rank, size_t k)>& chunk) {
  for (int r = 0; r < static_cast<int>(results.size()); ++r) {
    ASSERT_TRUE(results[r].ok()) << "rank " << r << ": " << results[r].status();
    const RankChunks* rc = target.Find(r);
    const ExecuteResult& res = *results[r];
    if (rc == nullptr) {
      EXPECT_TRUE(res.chunks.chunks.empty());
      continue;
    }
    ASSERT_EQ(res.chunks.chunks, rc->chunks);
    ASSERT_EQ(res.checksums.size(), rc->chunks.size());
    for (size_t k = 0; k < rc->chunks.size(); ++k) {
      const Chunk& c = rc->chunks[k];
      const absl::string_view bytes = chunk(r, k);
      EXPECT_EQ(res.checksums[k], ChunkChecksum(bytes.data(), bytes.size()));
      const bool zero =
          target.is_partial() && target.partial_op() == ReduceOp::kSum && c.partial_index != 0;
      ForEachElement(target.global_shape(), c.box, [&](int64_t i, int64_t flat) {
        const double want = zero ? 0.0 : Reduced(source.partial_op(), flat, source.num_partials());
        ASSERT_EQ(LoadAsDouble(bytes.data(), dtype, i), want)
            << "rank " << r << " chunk " << c.box.ToString() << " element " << i;
      });
    }
  }
}

Layout MakeLayout(const Shape& mesh_shape, const std::vector<int64_t>& ranks,
                  const std::string& spec, const Shape& shape) {
  DeviceMesh mesh = *DeviceMesh::Create(mesh_shape, ranks);
  if (spec.rfind("flat ", 0) == 0) {
    absl::StatusOr<Layout> l = Layout::FromFlat(mesh, shape, *ParseFlatSpec(spec.substr(5)));
    EXPECT_TRUE(l.ok()) << l.status();
    return *l;
  }
  absl::StatusOr<Layout> l = Layout::FromPlacements(mesh, shape, *ParsePlacements(spec));
  EXPECT_TRUE(l.ok()) << spec << ": " << l.status();
  return *l;
}

v1::PlanFragment PlanFragmentFor(const Plan& plan, int64_t rank, const FragmentOptions& options,
                                 const FragmentMemberOptions& member) {
  const Plan* plans[] = {&plan};
  std::map<int64_t, Fragment> fragments = MakeFragments(plans, {member}, options);
  if (auto it = fragments.find(rank); it != fragments.end()) return FragmentToProto(it->second);
  Fragment empty;
  empty.plan_id = options.plan_id;
  empty.rank = rank;
  empty.step_timeout_ms = options.step_timeout_ms;
  empty.communicator_prefix = options.communicator_prefix;
  FragmentShape& shape = empty.shapes.emplace_back();
  shape.rank = rank;
  shape.dtype = plan.dtype;
  shape.source.rank = rank;
  shape.target.rank = rank;
  FragmentMember& m = empty.members.emplace_back();
  m.plan_id = options.plan_id;
  m.tensor = member.tensor;
  m.target_tensor = member.target_tensor.empty() ? member.tensor : member.target_tensor;
  m.source_version = member.source_version;
  m.target_version = member.target_version;
  auto inc = options.incarnations.find(rank);
  empty.member_incarnations[rank] = inc == options.incarnations.end() ? 0 : inc->second;
  return FragmentToProto(empty);
}

std::vector<v1::PlanFragment> Fragments(const Plan& plan, const std::string& id, int ranks) {
  FragmentOptions options;
  options.plan_id = id;
  for (int r = 0; r < ranks; ++r) options.incarnations[r] = 1;
  options.step_timeout_ms = 30000;
  options.communicator_prefix = absl::StrCat("plan/", id, "/");
  FragmentMemberOptions member;
  member.tensor = "T";
  member.source_version = 1;
  member.target_version = 2;
  std::vector<v1::PlanFragment> out;
  for (int r = 0; r < ranks; ++r) out.push_back(PlanFragmentFor(plan, r, options, member));
  return out;
}

absl::Status NcclLikeCommunicator::AllGatherV(const void* send, int64_t send_bytes, void* recv,
                                              absl::Span<const int64_t> recv_bytes,
                                              const CommOptions& options) {
  return inner_->AllGatherV(send, send_bytes, recv, recv_bytes, options);
}

absl::Status NcclLikeCommunicator::AllToAllV(const void* send, absl::Span<const int64_t> send_bytes,
                                             void* recv, absl::Span<const int64_t> recv_bytes,
                                             const CommOptions& options) {
  return inner_->AllToAllV(send, send_bytes, recv, recv_bytes, options);
}

absl::Status NcclLikeCommunicator::ReduceScatterV(const void* send, void* recv,
                                                  absl::Span<const int64_t> recv_elements,
                                                  DType dtype, ReduceOp op,
                                                  const CommOptions& options) {
  return inner_->ReduceScatterV(send, recv, recv_elements, dtype, op, options);
}

absl::Status NcclLikeCommunicator::AllReduce(const void* send, void* recv, int64_t elements,
                                             DType dtype, ReduceOp op, const CommOptions& options) {
  return inner_->AllReduce(send, recv, elements, dtype, op, options);
}

absl::Status NcclLikeCommunicator::Broadcast(void* data, int64_t bytes, int root,
                                             const CommOptions& options) {
  return inner_->Broadcast(data, bytes, root, options);
}

absl::Status NcclLikeCommunicator::SendRecv(absl::Span<const SendOp> sends,
                                            absl::Span<const RecvOp> recvs,
                                            const CommOptions& options) {
  for (const SendOp& op : sends) EXPECT_FALSE(op.prepare);  // Run by SendRecvWithHooks.
  for (const RecvOp& op : recvs) EXPECT_FALSE(op.done);
  return inner_->SendRecv(sends, recvs, options);
}

absl::StatusOr<std::shared_ptr<Communicator>> NcclLikeFactory::Create(
    const CommunicatorSpec& spec) {
  absl::StatusOr<std::shared_ptr<Communicator>> c = inner_->Create(spec);
  if (!c.ok()) return c.status();
  return std::shared_ptr<Communicator>(std::make_shared<NcclLikeCommunicator>(*std::move(c)));
}

GlooCluster::GlooCluster(int ranks, bool nccl_like, const GlooOptions& options) {
  for (int r = 0; r < ranks; ++r) {
    std::shared_ptr<CommunicatorFactory> f = *GlooCommunicatorFactory::Create(&kv, options);
    if (nccl_like) f = std::make_shared<NcclLikeFactory>(f);
    caches.push_back(std::make_unique<CommunicatorCache>(f));
  }
}

std::vector<absl::StatusOr<ExecuteResult>> ExecuteOnThreads(
    GlooCluster& cluster, const std::vector<Fragment>& fragments,
    const std::vector<std::shared_ptr<HostBuffer>>& sources,
    const std::vector<std::shared_ptr<HostBuffer>>& targets, const ExecutorOptions& options) {
  std::vector<absl::StatusOr<ExecuteResult>> results(fragments.size(),
                                                     absl::UnknownError("not run"));
  std::vector<std::thread> threads;
  for (size_t r = 0; r < fragments.size(); ++r) {
    threads.emplace_back([&, r] {
      ExecuteInput in;
      in.fragment = &fragments[r];
      in.source = sources[r].get();
      in.target = targets[r].get();
      in.communicators = cluster.caches[r].get();
      in.options = options;
      int64_t last = -1, total = -1;
      in.progress = [&](int64_t done, int64_t t) {
        EXPECT_GE(done, last);
        last = done;
        total = t;
      };
      results[r] = ExecuteFragment(in);
      if (results[r].ok() && total >= 0) EXPECT_EQ(last, total);
    });
  }
  for (auto& t : threads) t.join();
  return results;
}

std::set<StepOp> MethodsOf(const std::vector<absl::StatusOr<ExecuteResult>>& results) {
  std::set<StepOp> out;
  for (const auto& res : results) {
    if (!res.ok()) continue;
    for (const StepReport& s : res->steps) out.insert(s.method);
  }
  return out;
}

FakeDevices::FakeDevices(int ranks) {
  for (int r = 0; r < ranks; ++r) {
    spaces.push_back(std::make_unique<FakeDeviceMemorySpace>(absl::StrCat("fake-cuda:", r)));
  }
}

}  // namespace executor_testing
}  // namespace shardcoord
