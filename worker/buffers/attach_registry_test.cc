// AttachRegistry: lending shared memory (a memfd), plain memory (process_vm_*) and CUDA IPC
// memory (FakeDeviceMemorySpace's handles), refusals that leave nothing registered, detaches;
// then WorkerCore plans that write lent buffers in place and read them.
#include "worker/buffers/attach_registry.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "proto/convert.h"
#include "sharding/layout.h"
#include "sharding/mesh.h"
#include "sharding/placement.h"
#include "sharding/planner.h"
#include "worker/buffers/buffer_staging.h"
#include "worker/comm/gloo/gloo_communicator.h"
#include "worker/control/kv_client.h"
#include "worker/control/worker_core.h"
#include "worker/testing/attach_test_util.h"
#include "worker/testing/executor_test_util.h"
#include "worker/testing/fake_device_memory_space.h"

namespace shardcoord {
namespace {

using attach_testing::FakeAttachRpc;
using attach_testing::Memfd;
using ::testing::HasSubstr;

const Shape kShape = {8, 6};

// The member of the copies these tests run: "S" v1 into "D", lent at v5 (new version 6).
FragmentMemberOptions SIntoD() {
  FragmentMemberOptions m;
  m.tensor = "S";
  m.target_tensor = "D";
  m.source_version = 1;
  m.target_version = 6;
  m.attached_target_version = 5;
  return m;
}

Layout LayoutOf(const std::string& placements) {
  return *Layout::FromPlacements(*DeviceMesh::Create({2}), kShape, *ParsePlacements(placements));
}

// A local attach request for `rank`'s chunks of `layout`, lent as nothing yet.
v1::LocalAttachRequest RequestFor(const std::string& tensor, const Layout& layout, int64_t rank,
                                  int64_t version) {
  const RankChunks& rc = *layout.Find(rank);
  v1::LocalAttachRequest r;
  r.set_tensor(tensor);
  r.set_rank(rank);
  r.set_version(version);
  r.set_dtype(v1::F32);
  *r.mutable_chunks() = RankChunksToProto(rc);
  r.set_bytes(rc.local_elements * 4);
  return r;
}

// Rank `rank`'s local buffer of the 8x6 f32 tensor as S(1) over 2 ranks: 8x3 each.
v1::LocalAttachRequest Request(const std::string& tensor, int64_t rank, int64_t version = 5) {
  return RequestFor(tensor, LayoutOf("S(1)"), rank, version);
}

struct Registry {
  explicit Registry(int64_t rank = 0, MemorySpace* space = nullptr)
      : registry(&buffers, space, &rpc, [rank] {
          return WorkerIdentity{"w0", 3, rank};
        }) {}
  FakeAttachRpc rpc;
  BufferStore buffers;
  AttachRegistry registry;
};

PeerCredentials Self() {
  return PeerCredentials{getpid(), static_cast<int64_t>(getuid()), static_cast<int64_t>(getgid())};
}

TEST(AttachRegistryTest, SharedMemoryIsMappedInPlaceAndDetachedWithItsSession) {
  Registry r;
  Memfd mem(96 + 64);
  const int64_t session = r.registry.OpenSession(Self());
  v1::LocalAttachRequest req = Request("D", 0);
  req.mutable_shared()->set_offset(64);
  absl::StatusOr<v1::LocalAttachResponse> got = r.registry.Attach(session, req, mem.Give());
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(got->memory(), "shared");
  EXPECT_TRUE(got->readable());
  std::shared_ptr<HostBuffer> b = r.buffers.Find("D", 5);
  ASSERT_NE(b, nullptr);
  EXPECT_TRUE(b->attached());
  EXPECT_TRUE(b->space().is_host());
  EXPECT_EQ(r.buffers.TotalBytes(), 0);  // Not the worker's memory.
  EXPECT_EQ(r.buffers.LentBytes(), 96);
  // The same pages, both ways.
  mem.floats()[16] = 7.5f;
  float seen;
  std::memcpy(&seen, b->data(), 4);
  EXPECT_EQ(seen, 7.5f);
  const float put = -2.0f;
  std::memcpy(b->data() + 92, &put, 4);
  EXPECT_EQ(mem.floats()[16 + 23], -2.0f);
  // The seal the worker relies on was set.
  EXPECT_TRUE(fcntl(mem.fd, F_GET_SEALS) & F_SEAL_SHRINK);

  ASSERT_EQ(r.rpc.attaches().size(), 1u);
  const v1::AttachBufferRequest a = r.rpc.attaches()[0];
  EXPECT_EQ(a.worker(), "w0");
  EXPECT_EQ(a.incarnation(), 3);
  EXPECT_EQ(a.tensor(), "D");
  EXPECT_EQ(a.version(), 5);
  EXPECT_EQ(a.memory(), "shared");
  EXPECT_EQ(a.pid(), getpid());
  EXPECT_EQ(r.registry.attachments(), 1);

  // A version a plan stored (a Copy in place) goes with it.
  ASSERT_TRUE(r.buffers.Store("D", 6, b).ok());
  r.registry.CloseSession(session, "process exited");
  EXPECT_EQ(r.buffers.Find("D", 5), nullptr);
  EXPECT_EQ(r.buffers.Find("D", 6), nullptr);
  EXPECT_EQ(r.registry.attachments(), 0);
  ASSERT_EQ(r.rpc.detaches().size(), 1u);
  EXPECT_EQ(r.rpc.detaches()[0].rank(), 0);
  EXPECT_EQ(r.rpc.detaches()[0].reason(), "process exited");
  // A plan that still holds it cannot store it again.
  absl::Status late = r.buffers.Store("D", 7, b);
  EXPECT_EQ(late.code(), absl::StatusCode::kAborted) << late;
  EXPECT_EQ(r.buffers.Find("D", 7), nullptr);
}

// A hugetlbfs memfd (MFD_HUGETLB: what the clients allocate where the host reserved huge
// pages) maps only in whole huge pages: buffers at any offset, also across a huge page
// boundary, are mapped in place. Skips where no huge pages are free.
TEST(AttachRegistryTest, HugetlbMemoryIsMappedAtAnyOffset) {
  const int fd = memfd_create("huge", MFD_CLOEXEC | MFD_ALLOW_SEALING | MFD_HUGETLB);
  if (fd < 0) GTEST_SKIP() << "no hugetlbfs: " << std::strerror(errno);
  struct stat st;
  ASSERT_EQ(fstat(fd, &st), 0);
  const int64_t page = st.st_blksize;
  ASSERT_EQ(ftruncate(fd, 2 * page), 0);
  void* mine = mmap(nullptr, 2 * page, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (mine == MAP_FAILED) {
    close(fd);
    GTEST_SKIP() << "no 2 free huge pages (vm.nr_hugepages): " << std::strerror(errno);
  }
  float* floats = static_cast<float*>(mine);
  Registry r;
  const int64_t session = r.registry.OpenSession(Self());
  int64_t version = 5;
  for (const int64_t offset : {int64_t{3 * 4096 + 64}, page - 48}) {
    v1::LocalAttachRequest req = Request("D" + std::to_string(version), 0, version);
    req.mutable_shared()->set_offset(offset);
    absl::StatusOr<v1::LocalAttachResponse> got =
        r.registry.Attach(session, req, fcntl(fd, F_DUPFD_CLOEXEC, 0));
    ASSERT_TRUE(got.ok()) << "offset " << offset << ": " << got.status();
    std::shared_ptr<HostBuffer> b = r.buffers.Find(req.tensor(), version);
    ASSERT_NE(b, nullptr);
    floats[offset / 4] = 7.5f;
    float seen;
    std::memcpy(&seen, b->data(), 4);
    EXPECT_EQ(seen, 7.5f) << "offset " << offset;
    const float put = -2.0f;
    std::memcpy(b->data() + 92, &put, 4);  // The last element: past the boundary for page - 48.
    EXPECT_EQ(floats[offset / 4 + 23], -2.0f) << "offset " << offset;
    ++version;
  }
  r.registry.CloseSession(session, "done");
  munmap(mine, 2 * page);
  close(fd);
}

TEST(AttachRegistryTest, RefusalsRegisterNothing) {
  Registry r;
  const int64_t session = r.registry.OpenSession(Self());
  auto refused = [&](v1::LocalAttachRequest req, int fd, absl::StatusCode code,
                     const std::string& text) {
    SCOPED_TRACE(text);
    absl::StatusOr<v1::LocalAttachResponse> got = r.registry.Attach(session, req, fd);
    EXPECT_EQ(got.status().code(), code) << got.status();
    EXPECT_THAT(got.status().message(), HasSubstr(text));
    EXPECT_TRUE(r.buffers.List().empty());
  };
  Memfd mem(96);
  v1::LocalAttachRequest req = Request("D", 0);
  req.mutable_shared()->set_offset(0);

  v1::LocalAttachRequest size = req;
  size.set_bytes(92);
  refused(size, mem.Give(), absl::StatusCode::kInvalidArgument, "bytes: the buffer has 92");
  v1::LocalAttachRequest rank = req;
  rank.set_rank(1);
  refused(rank, mem.Give(), absl::StatusCode::kFailedPrecondition, "holds rank 0, not rank 1");
  refused(req, -1, absl::StatusCode::kInvalidArgument, "no file descriptor");
  Memfd small(64);
  refused(req, small.Give(), absl::StatusCode::kInvalidArgument, "fewer than offset 0 + 96");
  Memfd unsealable(96, /*sealable=*/false);
  refused(req, unsealable.Give(), absl::StatusCode::kInvalidArgument, "can shrink");
  v1::LocalAttachRequest none = Request("D", 0);
  refused(none, -1, absl::StatusCode::kInvalidArgument, "memory: none given");
  v1::LocalAttachRequest ipc = Request("D", 0);
  ipc.mutable_cuda_ipc()->set_handle("x");
  refused(ipc, -1, absl::StatusCode::kInvalidArgument, "keeps its buffers in host memory");
  std::vector<float> plain(24);
  v1::LocalAttachRequest unmapped = Request("D", 0);
  unmapped.mutable_process()->set_address(4096);  // The zero page: never mapped.
  refused(unmapped, -1, absl::StatusCode::kInvalidArgument, "is not readable memory");
  EXPECT_TRUE(r.rpc.attaches().empty());  // None of them reached the coordinator.

  // The coordinator's refusal leaves nothing behind either.
  r.rpc.Refuse(absl::InvalidArgumentError("dtype: the buffer holds f32 but tensor 'D' is f16"));
  refused(req, mem.Give(), absl::StatusCode::kInvalidArgument, "tensor 'D' is f16");
  EXPECT_EQ(r.registry.attachments(), 0);
  r.registry.CloseSession(session, "done");
  EXPECT_TRUE(r.rpc.detaches().empty());
}

TEST(AttachRegistryTest, PlainMemoryIsReachedByCopies) {
  Registry r;
  const int64_t session = r.registry.OpenSession(Self());
  std::vector<float> mine(24);
  for (int i = 0; i < 24; ++i) mine[i] = static_cast<float>(i);
  v1::LocalAttachRequest req = Request("D", 0);
  req.mutable_process()->set_address(reinterpret_cast<uint64_t>(mine.data()));
  absl::StatusOr<v1::LocalAttachResponse> got = r.registry.Attach(session, req, -1);
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(got->memory(), "process");
  std::shared_ptr<HostBuffer> b = r.buffers.Find("D", 5);
  ASSERT_NE(b, nullptr);
  EXPECT_FALSE(b->space().is_host());
  EXPECT_THAT(b->space().name(), HasSubstr(absl::StrCat("process ", getpid())));
  // Read with one copy into the worker's memory...
  absl::StatusOr<std::shared_ptr<HostBuffer>> local = BufferIn(b, &HostMemorySpace::Global());
  ASSERT_TRUE(local.ok()) << local.status();
  EXPECT_EQ(std::memcmp((*local)->data(), mine.data(), 96), 0);
  // ...and written back with one.
  std::vector<float> next(24, 3.0f);
  std::memcpy((*local)->data(), next.data(), 96);
  ASSERT_TRUE(CopyBufferBytes(**local, *b).ok());
  EXPECT_EQ(mine, next);
  r.registry.CloseSession(session, "exited");
}

TEST(AttachRegistryTest, IpcHandleIsOpenedByTheWorkersSpaceAndClosedAtTheEnd) {
  FakeDeviceMemorySpace user("user-gpu"), worker("worker-gpu");
  {
    Registry r(0, &worker);
    Allocation block = *user.Allocate(256);
    const int64_t session = r.registry.OpenSession(Self());
    v1::LocalAttachRequest req = Request("D", 0);
    req.mutable_cuda_ipc()->set_handle(user.ExportHandle(block));
    req.mutable_cuda_ipc()->set_offset(128);
    absl::StatusOr<v1::LocalAttachResponse> got = r.registry.Attach(session, req, -1);
    ASSERT_TRUE(got.ok()) << got.status();
    EXPECT_EQ(got->memory(), "cuda_ipc");
    std::shared_ptr<HostBuffer> b = r.buffers.Find("D", 5);
    ASSERT_NE(b, nullptr);
    EXPECT_EQ(&b->space(), &worker);
    EXPECT_EQ(b->data(), block.data + 128);  // The exporter's memory itself.
    EXPECT_EQ(worker.stats().shared_opened, 1);
    EXPECT_EQ(worker.stats().live_allocations, 0);
    b.reset();

    // Past the allocation, or on another device: refused.
    v1::LocalAttachRequest past = req;
    past.mutable_cuda_ipc()->set_offset(200);
    EXPECT_EQ(r.registry.Attach(session, past, -1).status().code(),
              absl::StatusCode::kInvalidArgument);
    v1::LocalAttachRequest other = req;
    other.mutable_cuda_ipc()->set_device_uuid("GPU-another");
    EXPECT_THAT(r.registry.Attach(session, other, -1).status().message(),
                HasSubstr("owns worker-gpu"));

    r.registry.CloseSession(session, "exited");
    EXPECT_EQ(worker.stats().live_shared, 0);
    user.Free(block);
  }
}

// ---- Plans over lent buffers ---------------------------------------------------------------

// arange over kShape at `rank`'s one chunk of `layout`.
std::vector<float> Arange(const Layout& layout, int64_t rank) {
  const Box box = layout.Find(rank)->chunks[0].box;
  std::vector<float> out;
  for (int64_t i = box.offset(0); i < box.end(0); ++i) {
    for (int64_t j = box.offset(1); j < box.end(1); ++j)
      out.push_back(static_cast<float>(i * 6 + j));
  }
  return out;
}

// One worker of a 2-rank plan: its buffers, core and registry, in host memory or a
// FakeDeviceMemorySpace.
struct TestWorker {
  TestWorker(KvClient* kv, FakeAttachRpc* rpc, int rank, bool device)
      : space(absl::StrCat("fake-cuda:", rank)),
        own(device ? static_cast<MemorySpace*>(&space) : &HostMemorySpace::Global()),
        cache(*GlooCommunicatorFactory::Create(kv, GlooOptions{})),
        core(
            &buffers, &cache, rpc,
            [rank] {
              return WorkerIdentity{absl::StrCat("w", rank), 1, rank};
            },
            {}, nullptr, own),
        registry(&buffers, own, rpc,
                 [rank] {
                   return WorkerIdentity{absl::StrCat("w", rank), 1, rank};
                 }),
        session(registry.OpenSession(Self())) {}
  ~TestWorker() {
    core.WaitIdle();
    registry.CloseSession(session, "test over");
  }
  FakeDeviceMemorySpace space;
  MemorySpace* own;
  BufferStore buffers;
  CommunicatorCache cache;
  WorkerCore core;
  AttachRegistry registry;
  int64_t session;
};

class AttachedPlanTest : public ::testing::Test {
 protected:
  void Start(bool device) {
    for (int r = 0; r < 2; ++r) {
      workers_.push_back(std::make_unique<TestWorker>(&kv_, &rpc_, r, device));
    }
  }
  // "S" v1 as S(0), arange, in each worker's own memory.
  void OwnSource() {
    const Layout source = LayoutOf("S(0)");
    for (int r = 0; r < 2; ++r) {
      std::vector<float> values = Arange(source, r);
      auto host = *HostBuffer::Create(DType::kF32, *source.Find(r));
      std::memcpy(host->data(), values.data(), host->bytes());
      workers_[r]->buffers.Put("S", 1, *BufferIn(host, workers_[r]->own));
    }
  }
  void Lend(int r, v1::LocalAttachRequest request, int fd) {
    absl::StatusOr<v1::LocalAttachResponse> got =
        workers_[r]->registry.Attach(workers_[r]->session, request, fd);
    ASSERT_TRUE(got.ok()) << got.status();
  }
  // Copies "S" v1 (S(0)) into "D" (S(1), lent at v5; new version 6) and commits.
  void CopySIntoD(const std::string& id) {
    const Plan plan = *Redistribute(LayoutOf("S(0)"), LayoutOf("S(1)"), DType::kF32);
    FragmentOptions o;
    o.plan_id = id;
    for (int r = 0; r < 2; ++r) o.incarnations[r] = 1;
    o.step_timeout_ms = 30000;
    o.communicator_prefix = absl::StrCat("plan/", id, "/");
    for (int r = 0; r < 2; ++r) {
      ASSERT_TRUE(
          workers_[r]->core.Execute(executor_testing::PlanFragmentFor(plan, r, o, SIntoD())).ok());
    }
    for (const v1::ReportChunksRequest& rep : rpc_.WaitFinals(2)) {
      EXPECT_EQ(rep.error(), "") << rep.DebugString();
    }
    v1::FinishPlanRequest commit;
    commit.set_plan_id(id);
    commit.set_tensor("D");
    commit.set_commit(true);
    commit.set_drop_version(5);
    for (auto& w : workers_) {
      w->core.WaitIdle();
      ASSERT_TRUE(w->core.FinishPlan(commit).ok());
      // The lent buffer is the tensor's new version now.
      EXPECT_EQ(w->buffers.Find("D", 5), nullptr);
      std::shared_ptr<HostBuffer> kept = w->buffers.Find("D", 6);
      ASSERT_NE(kept, nullptr);
      EXPECT_TRUE(kept->attached());
    }
  }

  InMemoryKvClient kv_;
  FakeAttachRpc rpc_;
  std::vector<std::unique_ptr<TestWorker>> workers_;
};

TEST_F(AttachedPlanTest, CopyWritesLentSharedMemoryInPlace) {
  Start(/*device=*/false);
  OwnSource();
  const Layout target = LayoutOf("S(1)");
  std::vector<std::unique_ptr<Memfd>> mem;
  for (int r = 0; r < 2; ++r) {
    mem.push_back(std::make_unique<Memfd>(96));
    v1::LocalAttachRequest req = RequestFor("D", target, r, 5);
    req.mutable_shared()->set_offset(0);
    Lend(r, req, mem[r]->Give());
  }
  CopySIntoD("shared");
  for (int r = 0; r < 2; ++r) {
    EXPECT_EQ(std::vector<float>(mem[r]->floats(), mem[r]->floats() + 24), Arange(target, r));
  }
}

TEST_F(AttachedPlanTest, PlainMemoryIsReadAndWrittenWithOneCopyEach) {
  Start(/*device=*/false);
  const Layout source = LayoutOf("S(0)"), target = LayoutOf("S(1)");
  std::vector<std::vector<float>> src(2), dst(2, std::vector<float>(24, -1.0f));
  for (int r = 0; r < 2; ++r) {
    src[r] = Arange(source, r);
    v1::LocalAttachRequest s = RequestFor("S", source, r, 1);
    s.mutable_process()->set_address(reinterpret_cast<uint64_t>(src[r].data()));
    Lend(r, s, -1);
    v1::LocalAttachRequest d = RequestFor("D", target, r, 5);
    d.mutable_process()->set_address(reinterpret_cast<uint64_t>(dst[r].data()));
    Lend(r, d, -1);
  }
  CopySIntoD("plain");
  for (int r = 0; r < 2; ++r) {
    EXPECT_EQ(dst[r], Arange(target, r));
    EXPECT_EQ(src[r], Arange(source, r));  // Only read.
  }
}

TEST_F(AttachedPlanTest, CopyWritesAnOpenedIpcHandleInPlace) {
  FakeDeviceMemorySpace user("user-gpu");  // The inference process's GPU: outlives the workers.
  std::vector<Allocation> blocks;
  for (int r = 0; r < 2; ++r) blocks.push_back(*user.Allocate(64 + 96));
  Start(/*device=*/true);
  OwnSource();
  const Layout target = LayoutOf("S(1)");
  for (int r = 0; r < 2; ++r) {
    v1::LocalAttachRequest req = RequestFor("D", target, r, 5);
    req.mutable_cuda_ipc()->set_handle(user.ExportHandle(blocks[r]));
    req.mutable_cuda_ipc()->set_offset(64);
    Lend(r, req, -1);
  }
  std::vector<FakeDeviceMemorySpace::Stats> before;
  for (auto& w : workers_) before.push_back(w->space.stats());
  CopySIntoD("ipc");
  for (int r = 0; r < 2; ++r) {
    // The plan wrote the opened memory itself: no host round trip, no target allocation.
    const FakeDeviceMemorySpace::Stats after = workers_[r]->space.stats();
    EXPECT_EQ(after.copies_to_device, before[r].copies_to_device);
    EXPECT_EQ(after.copies_to_host, before[r].copies_to_host);
    EXPECT_EQ(after.live_allocations, before[r].live_allocations);
    EXPECT_EQ(workers_[r]->buffers.Find("D", 6)->data(), blocks[r].data + 64);
    std::vector<float> got(24);
    ASSERT_TRUE(user.CopyToHost(got.data(), blocks[r].data + 64, 96).ok());
    EXPECT_EQ(got, Arange(target, r));
  }
  workers_.clear();  // Closes the openings before the user's memory goes.
  for (const Allocation& b : blocks) user.Free(b);
}

TEST_F(AttachedPlanTest, ADetachedTargetFailsThePlanBeforeItStarts) {
  Start(/*device=*/false);
  OwnSource();
  Memfd mem(96);
  v1::LocalAttachRequest req = RequestFor("D", LayoutOf("S(1)"), 0, 5);
  req.mutable_shared()->set_offset(0);
  Lend(0, req, mem.Give());
  workers_[0]->registry.CloseSession(workers_[0]->session, "process 1 died");
  ASSERT_EQ(rpc_.detaches().size(), 1u);
  FragmentOptions o;
  o.plan_id = "gone";
  o.incarnations = {{0, 1}, {1, 1}};
  const Plan plan = *Redistribute(LayoutOf("S(0)"), LayoutOf("S(1)"), DType::kF32);
  absl::Status s =
      workers_[0]->core.Execute(executor_testing::PlanFragmentFor(plan, 0, o, SIntoD()));
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
  EXPECT_THAT(s.message(), HasSubstr("holds no attached buffer"));
}

}  // namespace
}  // namespace shardcoord
