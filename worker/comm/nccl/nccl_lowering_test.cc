#include "worker/comm/nccl/nccl_lowering.h"

#include <vector>

#include "gtest/gtest.h"

namespace shardcoord {
namespace nccl {
namespace {

using Kind = NcclCall::Kind;

char in[64];
char out[256];

TEST(NcclLoweringTest, EqualAllGatherIsOneAllGather) {
  absl::StatusOr<NcclLaunch> l = LowerAllGatherV(1, 3, in, 8, out, {8, 8, 8});
  ASSERT_TRUE(l.ok()) << l.status();
  EXPECT_FALSE(l->grouped);
  ASSERT_EQ(l->calls.size(), 1u);
  EXPECT_EQ(l->calls[0].kind, Kind::kAllGather);
  EXPECT_EQ(l->calls[0].send, in);
  EXPECT_EQ(l->calls[0].recv, out);
  EXPECT_EQ(l->calls[0].count, 8u);  // Per rank.
  EXPECT_EQ(l->calls[0].dtype, NcclDataType::kUint8);
}

TEST(NcclLoweringTest, UnevenAllGatherIsGroupedBroadcastsIntoSlices) {
  absl::StatusOr<NcclLaunch> l = LowerAllGatherV(2, 4, in, 5, out, {3, 0, 5, 2});
  ASSERT_TRUE(l.ok()) << l.status();
  EXPECT_TRUE(l->grouped);
  ASSERT_EQ(l->calls.size(), 3u);  // Rank 1's empty piece is left out.
  EXPECT_EQ(l->calls[0].kind, Kind::kBroadcast);
  EXPECT_EQ(l->calls[0].peer, 0);
  EXPECT_EQ(l->calls[0].recv, out + 0);
  EXPECT_EQ(l->calls[0].count, 3u);
  EXPECT_EQ(l->calls[1].peer, 2);
  EXPECT_EQ(l->calls[1].send, in);  // This rank is the root: its own send buffer.
  EXPECT_EQ(l->calls[1].recv, out + 3);
  EXPECT_EQ(l->calls[2].peer, 3);
  EXPECT_EQ(l->calls[2].recv, out + 8);
  EXPECT_EQ(l->calls[2].count, 2u);
}

TEST(NcclLoweringTest, AllGatherChecksItsArguments) {
  EXPECT_EQ(LowerAllGatherV(0, 2, in, 4, out, {4}).status().message(),
            "AllGatherV recv_bytes has 1 entries for a group of 2");
  EXPECT_EQ(LowerAllGatherV(0, 2, in, 4, out, {5, 4}).status().message(),
            "AllGatherV send_bytes 4 != recv_bytes[0] 5");
  EXPECT_EQ(LowerAllGatherV(0, 2, in, 4, out, {4, -1}).status().message(),
            "AllGatherV recv_bytes[1] = -1 is negative");
  EXPECT_EQ(LowerAllGatherV(0, 2, nullptr, 4, out, {4, 4}).status().message(),
            "AllGatherV send is null for 4 bytes");
  absl::StatusOr<NcclLaunch> empty = LowerAllGatherV(0, 2, nullptr, 0, nullptr, {0, 0});
  ASSERT_TRUE(empty.ok());
  EXPECT_TRUE(empty->calls.empty());
}

TEST(NcclLoweringTest, AllToAllIsGroupedSendRecvPerPeerIncludingSelf) {
  absl::StatusOr<NcclLaunch> l = LowerAllToAllV(1, 3, in, {1, 2, 0}, out, {4, 2, 3});
  ASSERT_TRUE(l.ok()) << l.status();
  EXPECT_TRUE(l->grouped);
  ASSERT_EQ(l->calls.size(), 5u);
  EXPECT_EQ(l->calls[0].kind, Kind::kSend);
  EXPECT_EQ(l->calls[0].peer, 0);
  EXPECT_EQ(l->calls[0].send, in);
  EXPECT_EQ(l->calls[1].kind, Kind::kRecv);
  EXPECT_EQ(l->calls[1].peer, 0);
  EXPECT_EQ(l->calls[1].recv, out);
  EXPECT_EQ(l->calls[1].count, 4u);
  EXPECT_EQ(l->calls[2].kind, Kind::kSend);
  EXPECT_EQ(l->calls[2].peer, 1);
  EXPECT_EQ(l->calls[2].send, in + 1);
  EXPECT_EQ(l->calls[3].kind, Kind::kRecv);
  EXPECT_EQ(l->calls[3].recv, out + 4);
  EXPECT_EQ(l->calls[4].kind, Kind::kRecv);  // Nothing is sent to rank 2.
  EXPECT_EQ(l->calls[4].peer, 2);
  EXPECT_EQ(l->calls[4].recv, out + 6);
}

TEST(NcclLoweringTest, AllToAllSelfPieceMustMatch) {
  EXPECT_EQ(LowerAllToAllV(0, 2, in, {1, 2}, out, {3, 2}).status().message(),
            "AllToAllV send_bytes[0] 1 != recv_bytes[0] 3 for the piece to itself");
}

TEST(NcclLoweringTest, ReduceScatterEqualAndUneven) {
  absl::StatusOr<NcclLaunch> eq =
      LowerReduceScatterV(0, 2, in, out, {3, 3}, DType::kF32, ReduceOp::kMax);
  ASSERT_TRUE(eq.ok()) << eq.status();
  ASSERT_EQ(eq->calls.size(), 1u);
  EXPECT_FALSE(eq->grouped);
  EXPECT_EQ(eq->calls[0].kind, Kind::kReduceScatter);
  EXPECT_EQ(eq->calls[0].count, 3u);
  EXPECT_EQ(eq->calls[0].dtype, NcclDataType::kFloat32);
  EXPECT_EQ(eq->calls[0].op, NcclRedOp::kMax);

  absl::StatusOr<NcclLaunch> uneven =
      LowerReduceScatterV(1, 3, in, out, {2, 1, 0}, DType::kBF16, ReduceOp::kSum);
  ASSERT_TRUE(uneven.ok()) << uneven.status();
  EXPECT_TRUE(uneven->grouped);
  ASSERT_EQ(uneven->calls.size(), 2u);
  EXPECT_EQ(uneven->calls[0].kind, Kind::kReduce);
  EXPECT_EQ(uneven->calls[0].peer, 0);
  EXPECT_EQ(uneven->calls[0].send, in);
  EXPECT_EQ(uneven->calls[0].recv, nullptr);  // Only the root receives.
  EXPECT_EQ(uneven->calls[1].peer, 1);
  EXPECT_EQ(uneven->calls[1].send, in + 4);  // 2 bf16 elements in.
  EXPECT_EQ(uneven->calls[1].recv, out);
  EXPECT_EQ(uneven->calls[1].dtype, NcclDataType::kBfloat16);
}

TEST(NcclLoweringTest, AvgIsRejected) {
  absl::StatusOr<NcclLaunch> l = LowerAllReduce(in, out, 4, DType::kF32, ReduceOp::kAvg);
  EXPECT_EQ(l.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(l.status().message().find("reduce op avg"), absl::string_view::npos) << l.status();
}

TEST(NcclLoweringTest, EveryDTypeMaps) {
  EXPECT_EQ(*ToNcclDataType(DType::kF64), NcclDataType::kFloat64);
  EXPECT_EQ(*ToNcclDataType(DType::kF16), NcclDataType::kFloat16);
  EXPECT_EQ(*ToNcclDataType(DType::kI8), NcclDataType::kInt8);
  EXPECT_EQ(*ToNcclDataType(DType::kU8), NcclDataType::kUint8);
  EXPECT_EQ(*ToNcclDataType(DType::kI32), NcclDataType::kInt32);
  EXPECT_EQ(*ToNcclDataType(DType::kI64), NcclDataType::kInt64);
  EXPECT_EQ(*ToNcclRedOp(ReduceOp::kMin), NcclRedOp::kMin);
}

TEST(NcclLoweringTest, AllReduceAndBroadcast) {
  absl::StatusOr<NcclLaunch> ar = LowerAllReduce(in, in, 6, DType::kI64, ReduceOp::kSum);
  ASSERT_TRUE(ar.ok());
  ASSERT_EQ(ar->calls.size(), 1u);
  EXPECT_EQ(ar->calls[0].kind, Kind::kAllReduce);
  EXPECT_EQ(ar->calls[0].count, 6u);
  EXPECT_EQ(ar->calls[0].dtype, NcclDataType::kInt64);

  absl::StatusOr<NcclLaunch> bc = LowerBroadcast(0, 4, out, 10, 3);
  ASSERT_TRUE(bc.ok());
  ASSERT_EQ(bc->calls.size(), 1u);
  EXPECT_EQ(bc->calls[0].kind, Kind::kBroadcast);
  EXPECT_EQ(bc->calls[0].send, out);
  EXPECT_EQ(bc->calls[0].recv, out);
  EXPECT_EQ(bc->calls[0].peer, 3);
  EXPECT_EQ(LowerBroadcast(0, 4, out, 10, 4).status().message(),
            "Broadcast root 4 is not a rank of a group of 4");
}

TEST(NcclLoweringTest, SendRecvKeepsOrderAndRejectsSelf) {
  const std::vector<SendOp> sends = {{2, in, 4}, {0, in + 4, 0}, {2, in + 8, 3}};
  const std::vector<RecvOp> recvs = {{0, out, 5}};
  absl::StatusOr<NcclLaunch> l = LowerSendRecv(1, 3, sends, recvs);
  ASSERT_TRUE(l.ok()) << l.status();
  EXPECT_TRUE(l->grouped);
  ASSERT_EQ(l->calls.size(), 3u);  // The empty send is left out.
  EXPECT_EQ(l->calls[0].send, in);
  EXPECT_EQ(l->calls[1].send, in + 8);
  EXPECT_EQ(l->calls[2].kind, Kind::kRecv);

  const std::vector<SendOp> to_self = {{1, in, 4}};
  EXPECT_EQ(LowerSendRecv(1, 3, to_self, {}).status().message(),
            "SendRecv sends[0] is to rank 1 itself");
  const std::vector<RecvOp> bad_peer = {{3, out, 4}};
  EXPECT_EQ(LowerSendRecv(1, 3, {}, bad_peer).status().message(),
            "SendRecv recvs[0] peer 3 is not a rank of a group of 3");
  absl::StatusOr<NcclLaunch> none = LowerSendRecv(1, 3, {}, {});
  ASSERT_TRUE(none.ok());
  EXPECT_TRUE(none->calls.empty());
  EXPECT_FALSE(none->grouped);
}

}  // namespace
}  // namespace nccl
}  // namespace shardcoord
