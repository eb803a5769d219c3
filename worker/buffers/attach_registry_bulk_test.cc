// AttachRegistry::AttachMany: a process's buffers of every memory kind in one request, one
// descriptor for several buffers, layouts taken from the coordinator when the process gave
// none, and refusals that name the attachment and leave nothing held or counted.
#include <unistd.h>

#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "proto/convert.h"
#include "sharding/layout.h"
#include "sharding/mesh.h"
#include "sharding/placement.h"
#include "worker/buffers/attach_registry.h"
#include "worker/testing/attach_test_util.h"

namespace shardcoord {
namespace {

using attach_testing::FakeAttachRpc;
using attach_testing::Memfd;
using ::testing::ElementsAre;
using ::testing::StartsWith;

// Rank 0's chunks of an 8x6 f32 tensor as S(1) over 2 ranks: 8x3, 24 elements, 96 bytes.
RankChunks Rank0() {
  Layout layout =
      *Layout::FromPlacements(*DeviceMesh::Create({2}), {8, 6}, *ParsePlacements("S(1)"));
  return *layout.Find(0);
}

// An attachment as a process that looked nothing up sends it: no version, no chunks.
v1::LocalAttachRequest Bare(const std::string& tensor, int64_t bytes = 96) {
  v1::LocalAttachRequest a;
  a.set_tensor(tensor);
  a.set_rank(0);
  a.set_dtype(v1::F32);
  a.set_bytes(bytes);
  return a;
}

v1::LocalAttachRequest Shared(const std::string& tensor, int64_t offset, int fd_index = 0) {
  v1::LocalAttachRequest a = Bare(tensor);
  a.mutable_shared()->set_offset(offset);
  a.mutable_shared()->set_fd_index(fd_index);
  return a;
}

v1::LocalAttachRequest Plain(const std::string& tensor, const void* data) {
  v1::LocalAttachRequest a = Bare(tensor);
  a.mutable_process()->set_address(reinterpret_cast<uint64_t>(data));
  return a;
}

PeerCredentials Self() {
  return PeerCredentials{getpid(), static_cast<int64_t>(getuid()), static_cast<int64_t>(getgid())};
}

class AttachManyTest : public ::testing::Test {
 protected:
  AttachManyTest() {
    for (const char* name : {"A", "B", "C"}) rpc_.Know(name, 5, RankChunksToProto(Rank0()));
  }

  v1::LocalAttachManyRequest Many(std::vector<v1::LocalAttachRequest> attachments) {
    v1::LocalAttachManyRequest r;
    for (v1::LocalAttachRequest& a : attachments) *r.add_attachments() = std::move(a);
    return r;
  }

  // Nothing held, nothing counted, nothing reported as detached.
  void ExpectNothingLeft() {
    EXPECT_TRUE(buffers_.List().empty());
    EXPECT_EQ(registry_.attachments(), 0);
    EXPECT_TRUE(rpc_.detaches().empty());
  }

  FakeAttachRpc rpc_;
  BufferStore buffers_;
  AttachRegistry registry_{&buffers_, nullptr, &rpc_, [] { return WorkerIdentity{"w0", 3, 0}; }};
};

TEST_F(AttachManyTest, EveryKindInOneRequestWithOneDescriptorForTwoBuffers) {
  Memfd mem(160 + 96);
  std::vector<float> plain(24, 2.5f);
  const int64_t session = registry_.OpenSession(Self());
  absl::StatusOr<v1::LocalAttachManyResponse> got = registry_.AttachMany(
      session, Many({Shared("A", 0), Shared("B", 160), Plain("C", plain.data())}), {mem.Give()});
  ASSERT_TRUE(got.ok()) << got.status();
  ASSERT_EQ(got->attachments_size(), 3);
  EXPECT_EQ(got->attachments(0).memory(), "shared");
  EXPECT_EQ(got->attachments(1).memory(), "shared");
  EXPECT_EQ(got->attachments(2).memory(), "process");
  EXPECT_TRUE(got->attachments(2).readable());
  EXPECT_EQ(got->attachments(0).worker(), "w0");

  // Held at the version and chunks the coordinator answered, over the process's memory.
  std::shared_ptr<HostBuffer> a = buffers_.Find("A", 5), b = buffers_.Find("B", 5);
  ASSERT_NE(a, nullptr);
  ASSERT_NE(b, nullptr);
  EXPECT_EQ(a->chunks().chunks, Rank0().chunks);
  mem.floats()[40 + 3] = 9.0f;  // B's element 3, at byte 160 + 12 of the file.
  float seen;
  std::memcpy(&seen, b->data() + 12, 4);
  EXPECT_EQ(seen, 9.0f);
  std::memcpy(a->data(), &seen, 4);
  EXPECT_EQ(mem.floats()[0], 9.0f);
  EXPECT_FALSE(buffers_.Find("C", 5)->space().is_host());  // Reached by process_vm_*.
  a.reset();
  b.reset();

  // Asked for the layouts first (the process gave none), then counted in one call.
  const std::vector<v1::AttachBuffersRequest> calls = rpc_.bulk_attaches();
  ASSERT_EQ(calls.size(), 2u);
  EXPECT_TRUE(calls[0].validate_only());
  EXPECT_FALSE(calls[0].buffers(0).has_chunks());
  EXPECT_EQ(calls[0].buffers(0).version(), 0);
  EXPECT_FALSE(calls[1].validate_only());
  EXPECT_EQ(calls[1].worker(), "w0");
  EXPECT_EQ(calls[1].incarnation(), 3);
  EXPECT_EQ(calls[1].pid(), getpid());
  ASSERT_EQ(calls[1].buffers_size(), 3);
  for (const v1::LentBuffer& lent : calls[1].buffers()) {
    EXPECT_EQ(lent.version(), 5);
    EXPECT_EQ(lent.chunks().local_elements(), 24);
    EXPECT_EQ(lent.bytes(), 96);
  }
  EXPECT_EQ(calls[1].buffers(2).memory(), "process");
  EXPECT_TRUE(rpc_.attaches().empty());  // No per-buffer AttachBuffer.
  EXPECT_EQ(registry_.attachments(), 3);

  // The connection's end detaches all of them.
  registry_.CloseSession(session, "process exited");
  EXPECT_TRUE(buffers_.List().empty());
  std::vector<std::string> detached;
  for (const v1::DetachBufferRequest& d : rpc_.detaches()) detached.push_back(d.tensor());
  EXPECT_THAT(detached, ElementsAre("A", "B", "C"));
}

// A process that gives versions and chunks (as an attach does) is counted in one call.
TEST_F(AttachManyTest, GivenLayoutsAreCountedInOneCall) {
  Memfd mem(96);
  const int64_t session = registry_.OpenSession(Self());
  v1::LocalAttachRequest a = Shared("A", 0);
  a.set_version(5);
  *a.mutable_chunks() = RankChunksToProto(Rank0());
  ASSERT_TRUE(registry_.AttachMany(session, Many({a}), {mem.Give()}).ok());
  ASSERT_EQ(rpc_.bulk_attaches().size(), 1u);
  EXPECT_FALSE(rpc_.bulk_attaches()[0].validate_only());
  registry_.CloseSession(session, "done");
}

TEST_F(AttachManyTest, RefusalsNameTheAttachmentAndLeaveNothing) {
  Memfd mem(400);
  std::vector<float> plain(24);
  const int64_t session = registry_.OpenSession(Self());
  auto refused = [&](v1::LocalAttachManyRequest req, std::vector<int> fds, absl::StatusCode code,
                     const std::string& starts) {
    SCOPED_TRACE(starts);
    absl::StatusOr<v1::LocalAttachManyResponse> got =
        registry_.AttachMany(session, req, std::move(fds));
    EXPECT_EQ(got.status().code(), code) << got.status();
    EXPECT_THAT(std::string(got.status().message()), StartsWith(starts));
    ExpectNothingLeft();
  };
  // Refused before the coordinator hears of them.
  v1::LocalAttachRequest sized = Shared("B", 100);
  *sized.mutable_chunks() = RankChunksToProto(Rank0());
  sized.set_bytes(92);
  refused(Many({Shared("A", 0), sized}), {mem.Give()}, absl::StatusCode::kInvalidArgument,
          "attachments[1] 'B': bytes: the buffer has 92 bytes");
  refused(Many({Shared("A", 0), Shared("B", 100), Shared("A", 200)}), {mem.Give()},
          absl::StatusCode::kInvalidArgument, "attachments[2] 'A': tensor: also attachments[0]");
  refused(Many({Shared("A", 0, /*fd_index=*/1)}), {mem.Give()}, absl::StatusCode::kInvalidArgument,
          "attachments[0] 'A': shared.fd_index: 1 but the request came with 1");
  v1::LocalAttachRequest other_rank = Plain("B", plain.data());
  other_rank.set_rank(1);
  refused(Many({Plain("A", plain.data()), other_rank}), {}, absl::StatusCode::kFailedPrecondition,
          "attachments[1] 'B': rank: worker w0 holds rank 0, not rank 1");
  refused(Many({Plain("A", plain.data()), Shared("B", 0)}), {}, absl::StatusCode::kInvalidArgument,
          "attachments[1] 'B': shared.fd_index: 0 but the request came with 0");
  v1::LocalAttachRequest unmapped = Bare("B");
  unmapped.mutable_process()->set_address(4096);
  refused(Many({Plain("A", plain.data()), unmapped}), {}, absl::StatusCode::kInvalidArgument,
          "attachments[1] 'B': process.address");
  refused(Many({}), {}, absl::StatusCode::kInvalidArgument, "attachments: none given");
  EXPECT_TRUE(rpc_.bulk_attaches().empty());

  // The coordinator's refusals, validating and counting, name the process's attachment.
  refused(Many({Plain("A", plain.data()), Plain("Z", plain.data())}), {},
          absl::StatusCode::kNotFound, "attachments[1] 'Z': unknown tensor 'Z'");
  rpc_.Refuse(absl::AbortedError("buffers[2] 'C': tensor 'C' is busy with p-1"));
  refused(Many({Shared("A", 0), Shared("B", 100), Plain("C", plain.data())}), {mem.Give()},
          absl::StatusCode::kAborted, "attachments[2] 'C': tensor 'C' is busy with p-1");
  rpc_.Refuse(absl::OkStatus());

  // A buffer held already (another connection lent it): the others are not kept either.
  const int64_t first = registry_.OpenSession(Self());
  std::vector<float> lent(24);
  ASSERT_TRUE(registry_.AttachMany(first, Many({Plain("B", lent.data())}), {}).ok());
  absl::StatusOr<v1::LocalAttachManyResponse> twice =
      registry_.AttachMany(session, Many({Plain("A", plain.data()), Plain("B", plain.data())}), {});
  EXPECT_EQ(twice.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(twice.status().message()),
              StartsWith("attachments[1] 'B': rank 0 of 'B' version 5 is held"));
  EXPECT_EQ(buffers_.Find("A", 5), nullptr);
  EXPECT_NE(buffers_.Find("B", 5), nullptr);  // The first connection's.
  EXPECT_EQ(registry_.attachments(), 1);
  registry_.CloseSession(first, "done");
  registry_.CloseSession(session, "done");

  registry_.Shutdown();
  const int64_t late = registry_.OpenSession(Self());
  EXPECT_EQ(registry_.AttachMany(late, Many({Plain("A", plain.data())}), {}).status().code(),
            absl::StatusCode::kUnavailable);
}

}  // namespace
}  // namespace shardcoord
