// WorkerCore with its buffers in (fake) device memory: Fill, ReadChunk and WriteChunk stage
// through host memory, plans run on device buffers, and every value and checksum matches a
// host-memory worker.
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "proto/convert.h"
#include "sharding/layout.h"
#include "sharding/mesh.h"
#include "sharding/placement.h"
#include "sharding/planner.h"
#include "worker/buffers/checksum.h"
#include "worker/comm/gloo/gloo_communicator.h"
#include "worker/control/kv_client.h"
#include "worker/control/worker_core.h"
#include "worker/memory/memory_space.h"
#include "worker/testing/executor_test_util.h"
#include "worker/testing/fake_device_memory_space.h"
#include "worker/testing/gloo_test_worker.h"
#include "worker/testing/worker_core_test_util.h"

namespace shardcoord {
namespace {

using worker_testing::RecordingReporter;

// One worker; `device` true puts its buffers in its own fake GPU. The space is the first
// base, so it outlives the buffers.
struct DeviceSpace {
  explicit DeviceSpace(int rank) : space(absl::StrCat("fake-cuda:", rank)) {}
  FakeDeviceMemorySpace space;
};

struct TestWorker : DeviceSpace, worker_testing::GlooTestWorker {
  TestWorker(KvClient* kv, ChunkReporter* reporter, int rank, bool device)
      : DeviceSpace(rank),
        GlooTestWorker(kv, reporter, rank, /*incarnation=*/7, device ? &space : nullptr) {}
};

v1::FillRequest FillFor(const RankChunks& rc, const Shape& shape, v1::InitKind init,
                        v1::DType dtype = v1::F32) {
  v1::FillRequest req = worker_testing::FillRequestFor("T", rc, shape, init, dtype);
  req.set_seed(42);
  return req;
}

// The bytes of `box` of (tensor, version), read in messages of at most `max_bytes`.
std::string ReadAll(WorkerCore& core, const std::string& tensor, int64_t version, const Box& box,
                    int64_t max_bytes, int* messages = nullptr) {
  std::vector<int64_t> sizes;
  std::string bytes = worker_testing::ReadAllBytes(core, tensor, version, box, max_bytes, &sizes);
  if (messages != nullptr) *messages = static_cast<int>(sizes.size());
  return bytes;
}

TEST(WorkerCoreMemorySpaceTest, FillAndReadMatchHostWorker) {
  InMemoryKvClient kv;
  RecordingReporter reporter;
  TestWorker host(&kv, &reporter, 0, false), device(&kv, &reporter, 1, true);
  // Two chunks with a gap between them; one a partial contribution that fills as zeros.
  RankChunks rc;
  rc.chunks.push_back(Chunk{Box({2, 0}, {3, 8}), 30, 0});
  rc.chunks.push_back(Chunk{Box({0, 0}, {2, 8}), 0, 1});
  rc.local_elements = 54;
  for (v1::InitKind init : {v1::ARANGE, v1::RANDOM, v1::ZEROS}) {
    SCOPED_TRACE(v1::InitKind_Name(init));
    v1::FillRequest req = FillFor(rc, {6, 8}, init);
    req.set_partial_op(v1::SUM);
    absl::StatusOr<v1::FillResponse> h = host.core.Fill(req);
    const FakeDeviceMemorySpace::Stats before = device.space.stats();
    absl::StatusOr<v1::FillResponse> d = device.core.Fill(req);
    ASSERT_TRUE(h.ok()) << h.status();
    ASSERT_TRUE(d.ok()) << d.status();
    EXPECT_EQ(d->chunks().DebugString(), h->chunks().DebugString());
    const FakeDeviceMemorySpace::Stats after = device.space.stats();
    EXPECT_EQ(after.copies_to_device - before.copies_to_device, 1);  // The whole buffer.
    EXPECT_EQ(after.bytes_to_device - before.bytes_to_device, 54 * 4);
    std::shared_ptr<HostBuffer> stored = device.buffers.Find("T", 1);
    ASSERT_NE(stored, nullptr);
    EXPECT_EQ(&stored->space(), &device.space);
    EXPECT_TRUE(device.space.Owns(stored->data(), stored->bytes()));

    // A strided sub-box in pieces of 3 elements: one device->host copy per message, of the
    // message's bytes only.
    const Box box({3, 2}, {2, 5});
    const FakeDeviceMemorySpace::Stats before_read = device.space.stats();
    int messages = 0;
    std::string got = ReadAll(device.core, "T", 1, box, 12, &messages);
    EXPECT_EQ(got, ReadAll(host.core, "T", 1, box, 12));
    EXPECT_EQ(got.size(), 40u);
    const FakeDeviceMemorySpace::Stats after_read = device.space.stats();
    EXPECT_EQ(after_read.copies_to_host - before_read.copies_to_host, messages);
    EXPECT_EQ(after_read.bytes_to_host - before_read.bytes_to_host, 40);
    EXPECT_EQ(after_read.live_bytes, before_read.live_bytes);  // Staging freed.
    if (init == v1::ARANGE) {
      std::vector<float> values(10);
      std::memcpy(values.data(), got.data(), 40);
      EXPECT_EQ(values[0], 3 * 8 + 2);
      EXPECT_EQ(values[9], 4 * 8 + 6);
    }
  }
}

TEST(WorkerCoreMemorySpaceTest, WriteAccumulatesThenCopiesAndChecksums) {
  InMemoryKvClient kv;
  RecordingReporter reporter;
  TestWorker host(&kv, &reporter, 0, false), device(&kv, &reporter, 1, true);
  // Two chunks of i32 sent in 1 MiB messages: about 3 MiB (below the staging threshold: one
  // copy, at Finish) and about 9 MiB (above it: two copies).
  for (int64_t elements : {int64_t{(3 << 20) / 4 + 3}, int64_t{(9 << 20) / 4 + 5}}) {
    SCOPED_TRACE(elements);
    RankChunks rc;
    rc.chunks.push_back(Chunk{Box({0}, {elements - 7}), 0, 0});
    rc.chunks.push_back(Chunk{Box({elements}, {7}), elements - 7, 0});
    rc.local_elements = elements;
    std::vector<int32_t> values(static_cast<size_t>(elements));
    for (int64_t i = 0; i < elements; ++i) values[i] = static_cast<int32_t>(i * 7 - 3);
    const std::string data(reinterpret_cast<const char*>(values.data()), values.size() * 4);
    v1::ChunkData header;
    header.set_tensor("W");
    header.set_version(elements);
    header.set_dtype(v1::I32);
    *header.mutable_chunks() = RankChunksToProto(rc);
    header.set_total_bytes(static_cast<int64_t>(data.size()));
    std::vector<v1::WriteChunkResponse> responses;
    for (TestWorker* w : {&host, &device}) {
      const FakeDeviceMemorySpace::Stats before = device.space.stats();
      auto writer = w->core.OpenWrite(header);
      ASSERT_TRUE(writer.ok()) << writer.status();
      for (size_t at = 0; at < data.size(); at += kMaxChunkMessageBytes) {
        ASSERT_TRUE(
            (*writer)->Append(absl::string_view(data).substr(at, kMaxChunkMessageBytes)).ok());
      }
      absl::StatusOr<v1::WriteChunkResponse> done = (*writer)->Finish();
      ASSERT_TRUE(done.ok()) << done.status();
      responses.push_back(*done);
      const FakeDeviceMemorySpace::Stats after = device.space.stats();
      const int64_t copies = after.copies_to_device - before.copies_to_device;
      if (w == &host) {
        EXPECT_EQ(copies, 0);
      } else {
        const int64_t want =
            (static_cast<int64_t>(data.size()) + WorkerCore::ChunkWriter::kStagingBytes - 1) /
            WorkerCore::ChunkWriter::kStagingBytes;
        EXPECT_EQ(copies, want);
        EXPECT_EQ(after.bytes_to_device - before.bytes_to_device,
                  static_cast<int64_t>(data.size()));
      }
    }
    EXPECT_EQ(responses[1].chunks().DebugString(), responses[0].chunks().DebugString());
    EXPECT_EQ(responses[1].chunks().chunks(1).checksum(),
              ChunkChecksum(values.data() + elements - 7, 28));
    EXPECT_EQ(ReadAll(device.core, "W", elements, Box({elements}, {7}), 1 << 20),
              data.substr(static_cast<size_t>(elements - 7) * 4));
  }
}

TEST(WorkerCoreMemorySpaceTest, PlanRunsOnDeviceBuffers) {
  InMemoryKvClient kv;
  RecordingReporter reporter;
  std::vector<std::unique_ptr<TestWorker>> workers;
  for (int r = 0; r < 4; ++r) {
    workers.push_back(std::make_unique<TestWorker>(&kv, &reporter, r, true));
  }
  DeviceMesh mesh = *DeviceMesh::Create({4});
  const Shape shape = {8, 12};
  Layout source = *Layout::FromPlacements(mesh, shape, *ParsePlacements("P(avg)"));
  Layout target = *Layout::FromPlacements(mesh, shape, *ParsePlacements("S(1)"));
  Plan plan = *Redistribute(source, target, DType::kF32);
  for (int r = 0; r < 4; ++r) {
    v1::FillRequest req = FillFor(*source.Find(r), shape, v1::ARANGE);
    req.set_partial_op(v1::AVG);
    ASSERT_TRUE(workers[r]->core.Fill(req).ok());
  }
  FragmentOptions options;
  options.plan_id = "avg";
  for (int i = 0; i < 4; ++i) options.incarnations[i] = 7;
  options.step_timeout_ms = 30000;
  options.communicator_prefix = "plan/avg/";
  FragmentMemberOptions member;
  member.tensor = "T";
  member.source_version = 1;
  member.target_version = 2;
  for (int r = 0; r < 4; ++r) {
    ASSERT_TRUE(
        workers[r]->core.Execute(executor_testing::PlanFragmentFor(plan, r, options, member)).ok());
  }
  std::vector<v1::ReportChunksRequest> finals = reporter.WaitFinals(4, "avg");
  for (const auto& rep : finals) {
    ASSERT_EQ(rep.error(), "") << rep.DebugString();
    const int r = static_cast<int>(rep.rank());
    std::shared_ptr<HostBuffer> stored = workers[r]->buffers.Find("T", 2);
    ASSERT_NE(stored, nullptr);
    EXPECT_TRUE(workers[r]->space.Owns(stored->data(), stored->bytes()));
    const Box box = target.Find(r)->chunks[0].box;
    std::string got = ReadAll(workers[r]->core, "T", 2, box, 1 << 20);
    ASSERT_EQ(got.size(), static_cast<size_t>(box.Volume() * 4));
    EXPECT_EQ(rep.chunks().chunks(0).checksum(), ChunkChecksum(got.data(), got.size()));
    std::vector<float> values(static_cast<size_t>(box.Volume()));
    std::memcpy(values.data(), got.data(), got.size());
    // Every contribution holds the arange value, so their average does too.
    size_t i = 0;
    for (int64_t row = 0; row < 8; ++row) {
      for (int64_t col = box.offset(1); col < box.end(1); ++col) {
        EXPECT_EQ(values[i++], static_cast<float>(row * 12 + col)) << "rank " << r;
      }
    }
  }
  for (auto& w : workers) w->core.WaitIdle();
}

}  // namespace
}  // namespace shardcoord
