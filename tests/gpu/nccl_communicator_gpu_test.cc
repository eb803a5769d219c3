// NcclCommunicator on real NCCL and device memory. Single-rank communicators (every op with
// a group of one) need one GPU; the multi-rank tests run one rank per GPU in threads of this
// process and need two or more. Skips (saying why) without them.
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <memory>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "gtest/gtest.h"
#include "tests/gpu/gpu_test_util.h"
#include "worker/comm/communicator.h"
#include "worker/comm/nccl/device_buffer.h"
#include "worker/comm/nccl/nccl_backend.h"
#include "worker/comm/nccl/nccl_communicator.h"
#include "worker/control/kv_client.h"

namespace shardcoord {
namespace nccl {
namespace {

template <typename T>
DeviceBuffer Upload(const std::vector<T>& host, int device) {
  absl::StatusOr<DeviceBuffer> b =
      DeviceBuffer::Allocate(static_cast<int64_t>(host.size() * sizeof(T)), device);
  EXPECT_TRUE(b.ok()) << b.status();
  EXPECT_TRUE(b->CopyFromHost(host.data(), b->bytes()).ok());
  return std::move(*b);
}

template <typename T>
std::vector<T> Download(const DeviceBuffer& b) {
  std::vector<T> host(static_cast<size_t>(b.bytes()) / sizeof(T));
  EXPECT_TRUE(b.CopyToHost(host.data(), b.bytes()).ok());
  return host;
}

DeviceBuffer Zeros(int64_t bytes, int device) {
  absl::StatusOr<DeviceBuffer> b = DeviceBuffer::Allocate(bytes, device);
  EXPECT_TRUE(b.ok()) << b.status();
  EXPECT_TRUE(b->Fill(0).ok());
  return std::move(*b);
}

CommunicatorSpec Spec(int n, int my_rank, const std::string& prefix) {
  CommunicatorSpec spec;
  for (int r = 0; r < n; ++r) {
    spec.ranks.push_back(r);
    spec.incarnations.push_back(1);
  }
  spec.my_rank = my_rank;
  spec.key_prefix = prefix;
  spec.timeout = absl::Seconds(120);
  return spec;
}

std::shared_ptr<NcclCommunicator> Build(const std::shared_ptr<KvClient>& kv, int n, int rank,
                                        const std::string& prefix) {
  NcclFactoryOptions options;
  options.device = rank;
  absl::StatusOr<std::shared_ptr<Communicator>> c =
      MakeNcclCommunicatorFactory(kv, options)->Create(Spec(n, rank, prefix));
  EXPECT_TRUE(c.ok()) << c.status();
  if (!c.ok()) return nullptr;
  return std::dynamic_pointer_cast<NcclCommunicator>(*c);
}

CommOptions Tag(uint32_t tag) {
  CommOptions o;
  o.tag = tag;
  return o;
}

TEST(NcclSingleRankTest, EveryOpWithAGroupOfOne) {
  SHARDCOORD_SKIP_WITHOUT_GPU();
  auto kv = std::make_shared<InMemoryKvClient>();
  std::shared_ptr<NcclCommunicator> c = Build(kv, 1, 0, "single");
  ASSERT_NE(c, nullptr);
  EXPECT_EQ(c->size(), 1);
  std::vector<float> x(1024);
  for (size_t i = 0; i < x.size(); ++i) x[i] = 0.5f * static_cast<float>(i) - 17.0f;
  const int64_t bytes = static_cast<int64_t>(x.size() * sizeof(float));
  DeviceBuffer in = Upload(x, 0);

  DeviceBuffer out = Zeros(bytes, 0);
  ASSERT_TRUE(c->AllGatherV(in.data(), bytes, out.data(), {bytes}, Tag(1)).ok());
  EXPECT_EQ(Download<float>(out), x);

  out = Zeros(bytes, 0);
  ASSERT_TRUE(c->AllToAllV(in.data(), {bytes}, out.data(), {bytes}, Tag(2)).ok());
  EXPECT_EQ(Download<float>(out), x);

  out = Zeros(bytes, 0);
  ASSERT_TRUE(
      c->ReduceScatterV(in.data(), out.data(), {1024}, DType::kF32, ReduceOp::kSum, Tag(3)).ok());
  EXPECT_EQ(Download<float>(out), x);

  out = Zeros(bytes, 0);
  ASSERT_TRUE(c->AllReduce(in.data(), out.data(), 1024, DType::kF32, ReduceOp::kMax, Tag(4)).ok());
  EXPECT_EQ(Download<float>(out), x);
  ASSERT_TRUE(c->AllReduce(out.data(), out.data(), 1024, DType::kF32, ReduceOp::kSum, Tag(5)).ok());
  EXPECT_EQ(Download<float>(out), x);

  ASSERT_TRUE(c->Broadcast(in.data(), bytes, 0, Tag(6)).ok());
  EXPECT_EQ(Download<float>(in), x);
  ASSERT_TRUE(c->SendRecv({}, {}, Tag(7)).ok());
  EXPECT_FALSE(c->broken());
}

TEST(NcclSingleRankTest, ManyOpsReuseOneCommunicator) {
  SHARDCOORD_SKIP_WITHOUT_GPU();
  auto kv = std::make_shared<InMemoryKvClient>();
  std::shared_ptr<NcclCommunicator> c = Build(kv, 1, 0, "reuse");
  ASSERT_NE(c, nullptr);
  DeviceBuffer buf = Upload(std::vector<int64_t>(4096, 3), 0);
  for (uint32_t i = 0; i < 200; ++i) {
    ASSERT_TRUE(
        c->AllReduce(buf.data(), buf.data(), 4096, DType::kI64, ReduceOp::kSum, Tag(i)).ok());
  }
  EXPECT_EQ(Download<int64_t>(buf), std::vector<int64_t>(4096, 3));
}

TEST(NcclSingleRankTest, AbortThenTeardownOnRealNccl) {
  SHARDCOORD_SKIP_WITHOUT_GPU();
  auto kv = std::make_shared<InMemoryKvClient>();
  std::shared_ptr<NcclCommunicator> c = Build(kv, 1, 0, "abort");
  ASSERT_NE(c, nullptr);
  c->Abort("test abort");
  EXPECT_TRUE(c->broken());
  DeviceBuffer buf = Zeros(64, 0);
  absl::Status s = c->Broadcast(buf.data(), 64, 0, Tag(1));
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
  c.reset();  // Must not hang or crash after ncclCommAbort.
}

TEST(NcclSingleRankTest, CacheSharesAndRebuilds) {
  SHARDCOORD_SKIP_WITHOUT_GPU();
  auto kv = std::make_shared<InMemoryKvClient>();
  CommunicatorCache cache(MakeNcclCommunicatorFactory(kv));
  const CommunicatorSpec spec = Spec(1, 0, "cache");
  absl::StatusOr<std::shared_ptr<Communicator>> a = cache.Get(spec);
  absl::StatusOr<std::shared_ptr<Communicator>> b = cache.Get(spec);
  ASSERT_TRUE(a.ok()) << a.status();
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_EQ(a->get(), b->get());
  std::dynamic_pointer_cast<NcclCommunicator>(*a)->Abort("rebuild");
  absl::StatusOr<std::shared_ptr<Communicator>> c = cache.Get(spec);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_NE(c->get(), a->get());
  EXPECT_EQ(cache.ReleasePrefix("cache"), 1);
}

// --- One rank per GPU, in threads ---

int RanksToUse() {
  absl::StatusOr<int> n = VisibleCudaDevices();
  return n.ok() ? std::min(*n, 8) : 0;
}

template <typename Fn>
void RunRanks(int n, const std::string& prefix, Fn fn) {
  auto kv = std::make_shared<InMemoryKvClient>();
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r) {
    threads.emplace_back([&, r] {
      ASSERT_EQ(cudaSetDevice(r), cudaSuccess);
      std::shared_ptr<NcclCommunicator> c = Build(kv, n, r, prefix);
      ASSERT_NE(c, nullptr);
      fn(r, *c);
    });
  }
  for (auto& t : threads) t.join();
}

TEST(NcclMultiRankTest, CollectivesAcrossGpus) {
  SHARDCOORD_SKIP_WITHOUT_GPUS(2);
  const int n = RanksToUse();
  RunRanks(n, "multi", [n](int r, NcclCommunicator& c) {
    // Uneven all-gather: rank q contributes q+1 ints valued 100q + i.
    std::vector<int64_t> recv_bytes;
    std::vector<int32_t> want;
    for (int q = 0; q < n; ++q) {
      recv_bytes.push_back((q + 1) * 4);
      for (int i = 0; i <= q; ++i) want.push_back(100 * q + i);
    }
    std::vector<int32_t> mine;
    for (int i = 0; i <= r; ++i) mine.push_back(100 * r + i);
    DeviceBuffer in = Upload(mine, r);
    DeviceBuffer out = Zeros(static_cast<int64_t>(want.size()) * 4, r);
    ASSERT_TRUE(c.AllGatherV(in.data(), in.bytes(), out.data(), recv_bytes, Tag(1)).ok());
    EXPECT_EQ(Download<int32_t>(out), want) << "rank " << r;

    // All-to-all: rank a sends a+b+1 bytes valued 16a+b to rank b.
    std::vector<int64_t> send_bytes, recv_b;
    std::vector<uint8_t> send, want_recv;
    for (int b = 0; b < n; ++b) {
      send_bytes.push_back(r + b + 1);
      send.insert(send.end(), r + b + 1, static_cast<uint8_t>(16 * r + b));
      recv_b.push_back(b + r + 1);
      want_recv.insert(want_recv.end(), b + r + 1, static_cast<uint8_t>(16 * b + r));
    }
    DeviceBuffer a2a_in = Upload(send, r);
    DeviceBuffer a2a_out = Zeros(static_cast<int64_t>(want_recv.size()), r);
    ASSERT_TRUE(c.AllToAllV(a2a_in.data(), send_bytes, a2a_out.data(), recv_b, Tag(2)).ok());
    EXPECT_EQ(Download<uint8_t>(a2a_out), want_recv);

    // Uneven reduce-scatter (sum of i32): slice q has q+1 elements; element j of rank p's
    // send is p + j.
    std::vector<int64_t> elems;
    int64_t total = 0;
    for (int q = 0; q < n; ++q) {
      elems.push_back(q + 1);
      total += q + 1;
    }
    std::vector<int32_t> rs_send(total);
    for (int64_t j = 0; j < total; ++j) rs_send[j] = r + static_cast<int32_t>(j);
    int64_t my_off = 0;
    for (int q = 0; q < r; ++q) my_off += q + 1;
    std::vector<int32_t> rs_want(r + 1);
    for (int i = 0; i <= r; ++i)
      rs_want[i] = n * (n - 1) / 2 + n * static_cast<int32_t>(my_off + i);
    DeviceBuffer rs_in = Upload(rs_send, r);
    DeviceBuffer rs_out = Zeros((r + 1) * 4, r);
    ASSERT_TRUE(
        c.ReduceScatterV(rs_in.data(), rs_out.data(), elems, DType::kI32, ReduceOp::kSum, Tag(3))
            .ok());
    EXPECT_EQ(Download<int32_t>(rs_out), rs_want);

    // Equal reduce-scatter (max of f32) and all-reduce (sum of i64).
    std::vector<float> eq_send(4 * n);
    for (int j = 0; j < 4 * n; ++j) eq_send[j] = static_cast<float>((j * 7 + r * 3) % 11);
    DeviceBuffer eq_in = Upload(eq_send, r);
    DeviceBuffer eq_out = Zeros(16, r);
    ASSERT_TRUE(c.ReduceScatterV(eq_in.data(), eq_out.data(), std::vector<int64_t>(n, 4),
                                 DType::kF32, ReduceOp::kMax, Tag(4))
                    .ok());
    std::vector<float> eq_want(4);
    for (int i = 0; i < 4; ++i) {
      float m = -1;
      for (int p = 0; p < n; ++p)
        m = std::max(m, static_cast<float>(((4 * r + i) * 7 + p * 3) % 11));
      eq_want[i] = m;
    }
    EXPECT_EQ(Download<float>(eq_out), eq_want);

    DeviceBuffer ar = Upload(std::vector<int64_t>(1000, r + 1), r);
    ASSERT_TRUE(c.AllReduce(ar.data(), ar.data(), 1000, DType::kI64, ReduceOp::kSum, Tag(5)).ok());
    EXPECT_EQ(Download<int64_t>(ar), std::vector<int64_t>(1000, n * (n + 1) / 2));

    // Broadcast from the last rank.
    DeviceBuffer bc = Upload(std::vector<int32_t>(333, r == n - 1 ? 42 : -1), r);
    ASSERT_TRUE(c.Broadcast(bc.data(), bc.bytes(), n - 1, Tag(6)).ok());
    EXPECT_EQ(Download<int32_t>(bc), std::vector<int32_t>(333, 42));

    // A ring exchange: send to the next rank, receive from the previous one.
    DeviceBuffer ring_in = Upload(std::vector<int32_t>(100, r), r);
    DeviceBuffer ring_out = Zeros(400, r);
    const std::vector<SendOp> sends = {{(r + 1) % n, ring_in.data(), 400}};
    const std::vector<RecvOp> recvs = {{(r + n - 1) % n, ring_out.data(), 400}};
    ASSERT_TRUE(c.SendRecv(sends, recvs, Tag(7)).ok());
    EXPECT_EQ(Download<int32_t>(ring_out), std::vector<int32_t>(100, (r + n - 1) % n));
  });
}

TEST(NcclMultiRankTest, MissingPeerTimesOutAndAborts) {
  SHARDCOORD_SKIP_WITHOUT_GPUS(2);
  absl::Status rank0;
  absl::Notification done;
  RunRanks(2, "timeout", [&](int r, NcclCommunicator& c) {
    if (r == 0) {
      DeviceBuffer buf = Zeros(1 << 20, 0);
      CommOptions o = Tag(77);
      o.timeout = absl::Seconds(3);
      rank0 = c.AllReduce(buf.data(), buf.data(), 1 << 18, DType::kF32, ReduceOp::kSum, o);
      done.Notify();
    } else {
      done.WaitForNotification();  // Never joins the all-reduce.
      c.Abort("peer gave up");
    }
  });
  EXPECT_EQ(rank0.code(), absl::StatusCode::kDeadlineExceeded) << rank0;
  EXPECT_NE(rank0.message().find("NCCL AllReduce (tag 77) on group [0,1] (prefix 'timeout')"),
            absl::string_view::npos)
      << rank0;
}

}  // namespace
}  // namespace nccl
}  // namespace shardcoord
