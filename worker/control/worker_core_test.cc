#include "worker/control/worker_core.h"

#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "proto/convert.h"
#include "sharding/block_quant.h"
#include "sharding/fill.h"
#include "sharding/layout.h"
#include "sharding/mesh.h"
#include "sharding/placement.h"
#include "sharding/planner.h"
#include "worker/buffers/checksum.h"
#include "worker/comm/gloo/gloo_communicator.h"
#include "worker/control/kv_client.h"
#include "worker/testing/executor_test_util.h"
#include "worker/testing/gloo_test_worker.h"
#include "worker/testing/worker_core_test_util.h"

namespace shardcoord {
namespace {

using worker_testing::RecordingReporter;

// One worker's pieces, incarnation 7.
struct TestWorker : worker_testing::GlooTestWorker {
  TestWorker(KvClient* kv, RecordingReporter* reporter, int rank)
      : GlooTestWorker(kv, reporter, rank, /*incarnation=*/7) {}
};

v1::FillRequest FillFor(const Layout& layout, int64_t rank, v1::InitKind init,
                        int64_t version = 1) {
  return worker_testing::FillRequestFor("T", *layout.Find(rank), layout.global_shape(), init,
                                        v1::F32, version);
}

std::vector<float> ReadAll(WorkerCore& core, const std::string& tensor, int64_t version,
                           const Box& box, int64_t max_bytes) {
  std::vector<int64_t> sizes;
  const std::string bytes =
      worker_testing::ReadAllBytes(core, tensor, version, box, max_bytes, &sizes);
  for (int64_t size : sizes) EXPECT_LE(size, std::max<int64_t>(max_bytes, 4));
  std::vector<float> out(bytes.size() / 4);
  std::memcpy(out.data(), bytes.data(), bytes.size());
  return out;
}

// A bulk create's fills: each buffer as its own Fill would make it; the first bad one is
// named by its index.
TEST(WorkerCoreTest, FillManyFillsEachInOrderAndNamesTheBadOne) {
  InMemoryKvClient kv;
  RecordingReporter reporter;
  TestWorker w(&kv, &reporter, 0);
  RankChunks rc;
  rc.chunks.push_back(Chunk{Box({0}, {4}), 0, 0});
  rc.local_elements = 4;
  v1::FillManyRequest many;
  for (int i = 0; i < 3; ++i) {
    v1::FillRequest* f = many.add_fills();
    f->set_tensor(absl::StrCat("T", i));
    f->set_version(1);
    f->set_dtype(v1::F32);
    *f->mutable_chunks() = RankChunksToProto(rc);
    f->add_global_shape(4);
    f->set_init(v1::ARANGE);
  }
  absl::StatusOr<v1::FillManyResponse> filled = w.core.FillMany(many);
  ASSERT_TRUE(filled.ok()) << filled.status();
  ASSERT_EQ(filled->chunks_size(), 3);
  const std::vector<float> arange = {0, 1, 2, 3};
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(filled->chunks(i).chunks(0).checksum(), ChunkChecksum(arange.data(), 16));
    EXPECT_EQ(ReadAll(w.core, absl::StrCat("T", i), 1, Box({0}, {4}), 16), arange);
  }

  // A bulk delete drops every version of each listed tensor in one call.
  v1::DropTensorRequest drop;
  drop.set_version(-1);
  drop.add_tensors("T0");
  drop.add_tensors("T2");
  ASSERT_TRUE(w.core.DropTensor(drop).ok());
  for (int i = 0; i < 3; ++i) {
    v1::ReadChunkRequest read;
    read.set_tensor(absl::StrCat("T", i));
    read.set_version(1);
    *read.mutable_box() = BoxToProto(Box({0}, {4}));
    EXPECT_EQ(w.core.OpenRead(read).ok(), i == 1) << i;
  }

  many.mutable_fills(1)->clear_global_shape();  // Box [0:4] outside a 0-d shape.
  for (int i = 0; i < 3; ++i) many.mutable_fills(i)->set_version(2);
  absl::StatusOr<v1::FillManyResponse> bad = w.core.FillMany(many);
  ASSERT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument) << bad.status();
  EXPECT_NE(bad.status().message().find("fills[1] ('T1')"), absl::string_view::npos)
      << bad.status();
}

// Block-scaled FP8 of a buffer holding two block-aligned chunks: each chunk quantized as
// sharding/block_quant does for its box, then dequantized back; refusals store nothing.
TEST(WorkerCoreTest, BlockQuantizeChunksAndBack) {
  InMemoryKvClient kv;
  RecordingReporter reporter;
  TestWorker w(&kv, &reporter, 0);
  // A 6 x 8 tensor, blocks of 2 x 4: rows 0:2 and 4:6, each two blocks wide.
  RankChunks rc;
  rc.chunks.push_back(Chunk{Box({0, 0}, {2, 8}), 0, 0});
  rc.chunks.push_back(Chunk{Box({4, 0}, {2, 8}), 16, 0});
  rc.local_elements = 32;
  v1::FillRequest fill;
  fill.set_tensor("X");
  fill.set_version(1);
  fill.set_dtype(v1::F32);
  *fill.mutable_chunks() = RankChunksToProto(rc);
  fill.add_global_shape(6);
  fill.add_global_shape(8);
  fill.set_init(v1::ARANGE);
  ASSERT_TRUE(w.core.Fill(fill).ok());
  RankChunks sc;
  sc.chunks.push_back(Chunk{Box({0, 0}, {1, 2}), 0, 0});
  sc.chunks.push_back(Chunk{Box({2, 0}, {1, 2}), 2, 0});
  sc.local_elements = 4;
  v1::BlockQuantizeRequest req;
  req.set_tensor("X");
  req.set_version(1);
  req.add_global_shape(6);
  req.add_global_shape(8);
  req.set_block("block:2x4");
  req.set_scales_tensor("S");
  req.set_scales_version(1);
  *req.mutable_scale_chunks() = RankChunksToProto(sc);
  req.set_out_tensor("Q");
  req.set_out_version(1);
  absl::StatusOr<v1::BlockQuantizeResponse> q = w.core.BlockQuantize(req);
  ASSERT_TRUE(q.ok()) << q.status();

  // The expected values: each chunk's box (arange values) quantized on its own.
  std::vector<float> x(32);
  for (int i = 0; i < 16; ++i) x[i] = static_cast<float>(i);
  for (int i = 0; i < 16; ++i) x[16 + i] = static_cast<float>(32 + i);
  std::vector<uint8_t> want_q(32);
  std::vector<float> want_s(4);
  for (int c = 0; c < 2; ++c) {
    ASSERT_TRUE(QuantizeBlocks(x.data() + 16 * c, DType::kF32, {2, 8}, BlockSize{2, 4},
                               want_q.data() + 16 * c, want_s.data() + 2 * c)
                    .ok());
  }
  auto bytes_of = [&](const std::string& t, const Box& box) {
    return worker_testing::ReadAllBytes(w.core, t, 1, box, 1 << 20, nullptr);
  };
  std::string got_q = bytes_of("Q", Box({0, 0}, {2, 8})) + bytes_of("Q", Box({4, 0}, {2, 8}));
  EXPECT_EQ(got_q, std::string(want_q.begin(), want_q.end()));
  std::string got_s = bytes_of("S", Box({0, 0}, {1, 2})) + bytes_of("S", Box({2, 0}, {1, 2}));
  EXPECT_EQ(got_s, std::string(reinterpret_cast<const char*>(want_s.data()), 16));
  EXPECT_EQ(q->chunks().chunks_size(), 2);
  EXPECT_EQ(q->scale_chunks().chunks_size(), 2);

  // Back to f32 with the scales.
  v1::BlockQuantizeRequest back = req;
  back.set_tensor("Q");
  back.set_dequantize(true);
  back.set_out_tensor("Y");
  back.set_out_dtype(v1::F32);
  ASSERT_TRUE(w.core.BlockQuantize(back).ok());
  std::vector<float> want_y(32);
  for (int c = 0; c < 2; ++c) {
    ASSERT_TRUE(DequantizeBlocks(want_q.data() + 16 * c, want_s.data() + 2 * c, {2, 8},
                                 BlockSize{2, 4}, want_y.data() + 16 * c, DType::kF32)
                    .ok());
  }
  std::string got_y = bytes_of("Y", Box({0, 0}, {2, 8})) + bytes_of("Y", Box({4, 0}, {2, 8}));
  EXPECT_EQ(got_y, std::string(reinterpret_cast<const char*>(want_y.data()), 128));

  // Refusals name the field; nothing is stored.
  v1::BlockQuantizeRequest bad = req;
  bad.set_out_tensor("Q2");
  bad.set_scales_tensor("S2");
  bad.set_block("block:3x4");  // Chunk rows 4:6 do not start on a 3-row block.
  absl::StatusOr<v1::BlockQuantizeResponse> r = w.core.BlockQuantize(bad);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument) << r.status();
  bad.set_block("block:2x4x");
  r = w.core.BlockQuantize(bad);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument) << r.status();
  EXPECT_NE(r.status().message().find("block: "), absl::string_view::npos) << r.status();
  bad.set_block("block:2x4");
  bad.set_version(9);
  EXPECT_EQ(w.core.BlockQuantize(bad).status().code(), absl::StatusCode::kNotFound);
  bad.set_version(1);
  bad.set_out_tensor("Q");  // Exists.
  EXPECT_EQ(w.core.BlockQuantize(bad).status().code(), absl::StatusCode::kAlreadyExists);
  v1::ReadChunkRequest read;
  read.set_tensor("Q2");
  read.set_version(1);
  *read.mutable_box() = BoxToProto(Box({0, 0}, {2, 8}));
  EXPECT_EQ(w.core.OpenRead(read).status().code(), absl::StatusCode::kNotFound);
  read.set_tensor("S2");
  *read.mutable_box() = BoxToProto(Box({0, 0}, {1, 2}));
  EXPECT_EQ(w.core.OpenRead(read).status().code(), absl::StatusCode::kNotFound);
}

TEST(WorkerCoreTest, FillThenReadSubBoxInPieces) {
  InMemoryKvClient kv;
  RecordingReporter reporter;
  TestWorker w(&kv, &reporter, 0);
  RankChunks rc;
  rc.chunks.push_back(Chunk{Box({2, 0}, {3, 8}), 0, 0});
  rc.local_elements = 24;
  v1::FillRequest req;
  req.set_tensor("T");
  req.set_version(1);
  req.set_dtype(v1::F32);
  *req.mutable_chunks() = RankChunksToProto(rc);
  req.add_global_shape(6);
  req.add_global_shape(8);
  req.set_init(v1::ARANGE);
  absl::StatusOr<v1::FillResponse> filled = w.core.Fill(req);
  ASSERT_TRUE(filled.ok()) << filled.status();
  std::vector<float> expect(24);
  for (int i = 0; i < 24; ++i) expect[i] = 16 + i;
  EXPECT_EQ(filled->chunks().chunks(0).checksum(), ChunkChecksum(expect.data(), 96));

  // Rows 3..4, columns 2..6, 3 elements per piece.
  std::vector<float> got = ReadAll(w.core, "T", 1, Box({3, 2}, {2, 5}), 12);
  std::vector<float> want;
  for (int r = 3; r < 5; ++r) {
    for (int c = 2; c < 7; ++c) want.push_back(r * 8 + c);
  }
  EXPECT_EQ(got, want);

  v1::ReadChunkRequest bad;
  bad.set_tensor("T");
  bad.set_version(1);
  *bad.mutable_box() = BoxToProto(Box({1, 0}, {2, 8}));  // Row 1 is not held.
  EXPECT_EQ(w.core.OpenRead(bad).status().code(), absl::StatusCode::kInvalidArgument);
  bad.set_version(2);
  EXPECT_EQ(w.core.OpenRead(bad).status().code(), absl::StatusCode::kNotFound);
}

TEST(WorkerCoreTest, FillPartialContributions) {
  InMemoryKvClient kv;
  RecordingReporter reporter;
  TestWorker w(&kv, &reporter, 0);
  RankChunks rc;
  rc.chunks.push_back(Chunk{Box({0}, {4}), 0, 1});  // Contribution 1.
  rc.local_elements = 4;
  v1::FillRequest req = worker_testing::FillRequestFor("P", rc, {4}, v1::ARANGE);
  ASSERT_TRUE(w.core.Fill(req).ok());
  EXPECT_EQ(ReadAll(w.core, "P", 1, Box({0}, {4}), 1 << 20), std::vector<float>(4, 0.0f));
  req.set_partial_op(v1::MAX);
  ASSERT_TRUE(w.core.Fill(req).ok());
  EXPECT_EQ(ReadAll(w.core, "P", 1, Box({0}, {4}), 1 << 20), (std::vector<float>{0, 1, 2, 3}));
}

TEST(WorkerCoreTest, FillErrorsNameTheField) {
  InMemoryKvClient kv;
  RecordingReporter reporter;
  TestWorker w(&kv, &reporter, 0);
  RankChunks rc;
  rc.chunks.push_back(Chunk{Box({0, 0}, {5, 2}), 0, 0});
  rc.local_elements = 10;
  v1::FillRequest req;
  req.set_tensor("T");
  req.set_dtype(v1::F32);
  *req.mutable_chunks() = RankChunksToProto(rc);
  req.add_global_shape(4);
  req.add_global_shape(2);
  absl::StatusOr<v1::FillResponse> r = w.core.Fill(req);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(r.status().message().find("chunks.chunks[0]"), std::string::npos) << r.status();
  req.set_dtype(v1::DTYPE_UNSPECIFIED);
  r = w.core.Fill(req);
  EXPECT_NE(r.status().message().find("dtype"), std::string::npos) << r.status();
  EXPECT_TRUE(w.buffers.List().empty());
}

TEST(WorkerCoreTest, WriteChunkChecksBytes) {
  InMemoryKvClient kv;
  RecordingReporter reporter;
  TestWorker w(&kv, &reporter, 0);
  RankChunks rc;
  rc.chunks.push_back(Chunk{Box({0}, {3}), 0, 0});
  rc.chunks.push_back(Chunk{Box({5}, {2}), 3, 0});
  rc.local_elements = 5;
  v1::ChunkData header;
  header.set_tensor("W");
  header.set_version(4);
  header.set_dtype(v1::I32);
  *header.mutable_chunks() = RankChunksToProto(rc);
  header.set_total_bytes(16);
  EXPECT_EQ(w.core.OpenWrite(header).status().code(), absl::StatusCode::kInvalidArgument);
  header.set_total_bytes(20);
  const int32_t values[5] = {1, 2, 3, 4, 5};
  header.set_data(std::string(reinterpret_cast<const char*>(values), 8));
  auto writer = w.core.OpenWrite(header);
  ASSERT_TRUE(writer.ok()) << writer.status();
  EXPECT_EQ((*writer)->Finish().status().code(), absl::StatusCode::kInvalidArgument);
  ASSERT_TRUE((*writer)->Append(std::string(reinterpret_cast<const char*>(values) + 8, 12)).ok());
  EXPECT_EQ((*writer)->Append("x").code(), absl::StatusCode::kInvalidArgument);
  absl::StatusOr<v1::WriteChunkResponse> done = (*writer)->Finish();
  ASSERT_TRUE(done.ok()) << done.status();
  EXPECT_EQ(done->chunks().chunks(0).checksum(), ChunkChecksum(values, 12));
  EXPECT_EQ(done->chunks().chunks(1).checksum(), ChunkChecksum(values + 3, 8));
  EXPECT_NE(w.buffers.Find("W", 4), nullptr);
}

TEST(WorkerCoreTest, WriteBufferThenReadBoxesRoundTripsAndRefusesLargeCalls) {
  InMemoryKvClient kv;
  RecordingReporter reporter;
  TestWorker w(&kv, &reporter, 0);
  RankChunks rc;
  rc.chunks.push_back(Chunk{Box({0, 0}, {2, 3}), 0, 0});
  rc.chunks.push_back(Chunk{Box({4, 0}, {1, 3}), 6, 0});
  rc.local_elements = 9;
  const int32_t values[9] = {1, 2, 3, 4, 5, 6, 7, 8, 9};
  v1::ChunkData message;
  message.set_tensor("W");
  message.set_version(2);
  message.set_dtype(v1::I32);
  *message.mutable_chunks() = RankChunksToProto(rc);
  message.set_total_bytes(36);
  message.set_data(std::string(reinterpret_cast<const char*>(values), 32));
  EXPECT_EQ(w.core.WriteBuffer(message).status().code(), absl::StatusCode::kInvalidArgument);
  message.set_data(std::string(reinterpret_cast<const char*>(values), 36));
  absl::StatusOr<v1::WriteChunkResponse> wrote = w.core.WriteBuffer(message);
  ASSERT_TRUE(wrote.ok()) << wrote.status();
  EXPECT_EQ(wrote->chunks().chunks(1).checksum(), ChunkChecksum(values + 6, 12));

  v1::ReadBoxesRequest read;
  read.set_tensor("W");
  read.set_version(2);
  *read.add_boxes() = BoxToProto(Box({1, 1}, {1, 2}));  // Inside the first chunk.
  *read.add_boxes() = BoxToProto(Box({4, 0}, {1, 3}));  // The second chunk whole.
  absl::StatusOr<v1::ReadBoxesResponse> got = w.core.ReadBoxes(read);
  ASSERT_TRUE(got.ok()) << got.status();
  ASSERT_EQ(got->data_size(), 2);
  EXPECT_EQ(got->data(0), std::string(reinterpret_cast<const char*>(values + 4), 8));
  EXPECT_EQ(got->data(1), std::string(reinterpret_cast<const char*>(values + 6), 12));
  // A box outside every chunk names its index.
  *read.add_boxes() = BoxToProto(Box({2, 0}, {1, 3}));
  got = w.core.ReadBoxes(read);
  EXPECT_EQ(got.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(got.status().message().find("boxes[2]"), std::string::npos) << got.status();

  // Beyond kMaxRelayBytes: refused, pointing at the streaming calls.
  RankChunks big;
  big.chunks.push_back(Chunk{Box({0}, {kMaxRelayBytes / 4 + 1}), 0, 0});
  big.local_elements = kMaxRelayBytes / 4 + 1;
  message.set_tensor("B");
  *message.mutable_chunks() = RankChunksToProto(big);
  message.set_total_bytes(kMaxRelayBytes + 4);
  message.set_data(std::string(static_cast<size_t>(kMaxRelayBytes + 4), '\0'));
  absl::StatusOr<v1::WriteChunkResponse> refused = w.core.WriteBuffer(message);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(refused.status().message().find("WriteChunk"), std::string::npos) << refused.status();
  EXPECT_EQ(w.buffers.Find("B", 2), nullptr);
}

// Four workers run a planner-made S(0) -> S(1) plan end to end: fill, execute, report,
// commit, read back.
// Fills (tensor, 1) of `shape` on this worker with its global arange over `chunks`.
void FillArange(TestWorker& w, const std::string& tensor, const Shape& shape,
                const RankChunks& rc) {
  v1::FillRequest fill;
  fill.set_tensor(tensor);
  fill.set_version(1);
  fill.set_dtype(v1::F32);
  *fill.mutable_chunks() = RankChunksToProto(rc);
  for (int64_t d : shape) fill.add_global_shape(d);
  fill.set_init(v1::ARANGE);
  ASSERT_TRUE(w.core.Fill(fill).ok());
}

RankChunks OneChunk(const Box& box) {
  RankChunks rc;
  rc.chunks.push_back(Chunk{box, 0, 0});
  rc.local_elements = box.Volume();
  return rc;
}

std::vector<float> FloatsOf(const std::string& bytes) {
  std::vector<float> f(bytes.size() / 4);
  std::memcpy(f.data(), bytes.data(), f.size() * 4);
  return f;
}

// Worker.ComposeBoxes: a fused tensor's rank buffer from its old buffer and staged members at
// their offsets (later inputs over earlier ones), an expert into a stacked tensor (an input of
// lower rank), an expert read back out (out of lower rank); refusals store nothing.
TEST(WorkerCoreTest, ComposeBoxesPlacesInputsAtTheirOffsets) {
  InMemoryKvClient kv;
  RecordingReporter reporter;
  TestWorker w(&kv, &reporter, 0);
  auto read = [&](const std::string& t, const Box& box) {
    return FloatsOf(worker_testing::ReadAllBytes(w.core, t, 2, box, 1 << 20, nullptr));
  };
  // Old: rows 0:4 of an [8, 4] fused tensor (values 0..15); k [2, 4] (0..7) goes to rows 2:4.
  FillArange(w, "F", {8, 4}, OneChunk(Box({0, 0}, {4, 4})));
  FillArange(w, "K", {2, 4}, OneChunk(Box({0, 0}, {2, 4})));
  v1::ComposeBoxesRequest req;
  req.set_out_tensor("F");
  req.set_out_version(2);
  req.set_out_dtype(v1::F32);
  *req.mutable_out_chunks() = RankChunksToProto(OneChunk(Box({0, 0}, {4, 4})));
  v1::ComposeInput* old = req.add_inputs();
  old->set_tensor("F");
  old->set_version(1);
  old->add_offset(0);
  old->add_offset(0);
  v1::ComposeInput* k = req.add_inputs();
  k->set_tensor("K");
  k->set_version(1);
  k->add_offset(2);
  k->add_offset(0);
  absl::StatusOr<v1::ComposeBoxesResponse> got = w.core.ComposeBoxes(req);
  ASSERT_TRUE(got.ok()) << got.status();
  std::vector<float> want = {0, 1, 2, 3, 4, 5, 6, 7, 0, 1, 2, 3, 4, 5, 6, 7};
  EXPECT_EQ(read("F", Box({0, 0}, {4, 4})), want);
  ASSERT_EQ(got->chunks().chunks_size(), 1);
  EXPECT_EQ(got->chunks().chunks(0).checksum(), ChunkChecksum(want.data(), 64));

  // Two [2, 4] experts (E0 0..7 as [2, 4], E1 as [1, 2, 4]) into a stacked [2, 2, 4].
  FillArange(w, "E0", {2, 4}, OneChunk(Box({0, 0}, {2, 4})));
  FillArange(w, "E1", {1, 2, 4}, OneChunk(Box({0, 0, 0}, {1, 2, 4})));
  v1::ComposeBoxesRequest stack;
  stack.set_out_tensor("S");
  stack.set_out_version(2);
  stack.set_out_dtype(v1::F32);
  *stack.mutable_out_chunks() = RankChunksToProto(OneChunk(Box({0, 0, 0}, {2, 2, 4})));
  for (int e = 0; e < 2; ++e) {
    v1::ComposeInput* in = stack.add_inputs();
    in->set_tensor(absl::StrCat("E", e));
    in->set_version(1);
    for (int64_t d : {e, 0, 0}) in->add_offset(d);
  }
  ASSERT_TRUE(w.core.ComposeBoxes(stack).ok());
  EXPECT_EQ(read("S", Box({0, 0, 0}, {2, 2, 4})),
            (std::vector<float>{0, 1, 2, 3, 4, 5, 6, 7, 0, 1, 2, 3, 4, 5, 6, 7}));
  // The reverse: expert 1 of the stacked tensor out as a [2, 4].
  v1::ComposeBoxesRequest out;
  out.set_out_tensor("X");
  out.set_out_version(2);
  out.set_out_dtype(v1::F32);
  *out.mutable_out_chunks() = RankChunksToProto(OneChunk(Box({0, 1}, {2, 3})));
  v1::ComposeInput* from = out.add_inputs();
  from->set_tensor("S");
  from->set_version(2);
  for (int64_t d : {-1, 0, 0}) from->add_offset(d);
  ASSERT_TRUE(w.core.ComposeBoxes(out).ok());
  EXPECT_EQ(read("X", Box({0, 1}, {2, 3})), (std::vector<float>{1, 2, 3, 5, 6, 7}));

  // Refusals: a part no input covers, another dtype, an offset of another rank, a missing
  // input, an existing out buffer. None stores anything.
  v1::ComposeBoxesRequest bad = req;
  bad.set_out_version(3);
  bad.mutable_inputs()->DeleteSubrange(0, 1);  // Only K: rows 0:2 are uncovered.
  absl::StatusOr<v1::ComposeBoxesResponse> r = w.core.ComposeBoxes(bad);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument) << r.status();
  EXPECT_NE(r.status().message().find("no input covers [0:2, 0:4]"), absl::string_view::npos)
      << r.status();
  bad = req;
  bad.set_out_version(3);
  bad.set_out_dtype(v1::BF16);
  r = w.core.ComposeBoxes(bad);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument) << r.status();
  EXPECT_NE(r.status().message().find("inputs[0].tensor"), absl::string_view::npos) << r.status();
  bad = req;
  bad.set_out_version(3);
  bad.mutable_inputs(1)->add_offset(0);
  r = w.core.ComposeBoxes(bad);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument) << r.status();
  EXPECT_NE(r.status().message().find("inputs[1].offset"), absl::string_view::npos) << r.status();
  bad = req;
  bad.set_out_version(3);
  bad.mutable_inputs(1)->set_version(7);
  EXPECT_EQ(w.core.ComposeBoxes(bad).status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(w.core.ComposeBoxes(req).status().code(), absl::StatusCode::kAlreadyExists);
  v1::ReadChunkRequest probe;
  probe.set_tensor("F");
  probe.set_version(3);
  *probe.mutable_box() = BoxToProto(Box({0, 0}, {4, 4}));
  EXPECT_EQ(w.core.OpenRead(probe).status().code(), absl::StatusCode::kNotFound);
}

class LifecycleTest : public ::testing::Test {
 protected:
  void SetUp() override {
    for (int r = 0; r < 4; ++r)
      workers_.push_back(std::make_unique<TestWorker>(&kv_, &reporter_, r));
    mesh_ = *DeviceMesh::Create({4});
    source_ = *Layout::FromPlacements(mesh_, {8, 12}, *ParsePlacements("S(0)"));
    target_ = *Layout::FromPlacements(mesh_, {8, 12}, *ParsePlacements("S(1)"));
    plan_ = *Redistribute(source_, target_, DType::kF32);
    for (int r = 0; r < 4; ++r) {
      ASSERT_TRUE(workers_[r]->core.Fill(FillFor(source_, r, v1::ARANGE)).ok());
    }
  }

  v1::PlanFragment Fragment(int r, const std::string& id, int64_t timeout_ms = 30000) {
    FragmentOptions options;
    options.plan_id = id;
    for (int i = 0; i < 4; ++i) options.incarnations[i] = 7;
    options.step_timeout_ms = timeout_ms;
    options.communicator_prefix = absl::StrCat("plan/", id, "/");
    FragmentMemberOptions member;
    member.tensor = "T";
    member.source_version = 1;
    member.target_version = 2;
    return executor_testing::PlanFragmentFor(plan_, r, options, member);
  }

  v1::FinishPlanRequest Finish(const std::string& id, bool commit) {
    v1::FinishPlanRequest req;
    req.set_plan_id(id);
    req.set_tensor("T");
    req.set_commit(commit);
    req.set_drop_version(1);
    return req;
  }

  InMemoryKvClient kv_;
  RecordingReporter reporter_;
  std::vector<std::unique_ptr<TestWorker>> workers_;
  DeviceMesh mesh_;
  Layout source_, target_;
  Plan plan_;
};

TEST_F(LifecycleTest, ExecuteReportCommitRead) {
  for (int r = 0; r < 4; ++r) ASSERT_TRUE(workers_[r]->core.Execute(Fragment(r, "p1")).ok());
  std::vector<v1::ReportChunksRequest> finals = reporter_.WaitFinals(4, "p1");
  ASSERT_EQ(finals.size(), 4u);
  for (const auto& rep : finals) {
    SCOPED_TRACE(rep.DebugString());
    EXPECT_EQ(rep.plan_id(), "p1");
    EXPECT_EQ(rep.error(), "");
    EXPECT_EQ(rep.incarnation(), 7);
    EXPECT_EQ(rep.worker(), absl::StrCat("w", rep.rank()));
    const int r = static_cast<int>(rep.rank());
    auto stored = workers_[r]->buffers.Find("T", 2);
    ASSERT_NE(stored, nullptr);
    ASSERT_EQ(rep.chunks().chunks_size(), 1);
    EXPECT_EQ(rep.chunks().chunks(0).checksum(), (*stored->Checksums())[0]);
    EXPECT_EQ(rep.bytes_done(), 3 * 2 * 3 * 4);  // Three 2x3 f32 pieces from the others.
  }
  // Re-executing a running (not yet finished) plan id is refused.
  EXPECT_EQ(workers_[0]->core.Execute(Fragment(0, "p1")).code(), absl::StatusCode::kAlreadyExists);
  for (int r = 0; r < 4; ++r) {
    ASSERT_TRUE(workers_[r]->core.FinishPlan(Finish("p1", true)).ok());
    ASSERT_TRUE(workers_[r]->core.FinishPlan(Finish("p1", true)).ok());  // Idempotent.
    EXPECT_EQ(workers_[r]->buffers.Find("T", 1), nullptr);
    const Box box = target_.Find(r)->chunks[0].box;
    std::vector<float> got = ReadAll(workers_[r]->core, "T", 2, box, 1 << 20);
    std::vector<float> want;
    for (int64_t i = 0; i < 8; ++i) {
      for (int64_t j = box.offset(1); j < box.end(1); ++j) want.push_back(i * 12 + j);
    }
    EXPECT_EQ(got, want) << "rank " << r;
    EXPECT_EQ(workers_[r]->cache.size(), 1);  // Kept for the next plan of the epoch.
  }
  EXPECT_EQ(workers_[0]->core.Execute(Fragment(0, "p1")).code(), absl::StatusCode::kAborted);
}

TEST_F(LifecycleTest, MissingPeerFailsThenAbortKeepsSource) {
  for (int r = 0; r < 3; ++r) {
    ASSERT_TRUE(workers_[r]->core.Execute(Fragment(r, "p2", /*timeout_ms=*/300)).ok());
  }
  std::vector<v1::ReportChunksRequest> finals = reporter_.WaitFinals(3, "p2");
  for (const auto& rep : finals) {
    EXPECT_NE(rep.error().find("DEADLINE_EXCEEDED"), std::string::npos) << rep.error();
    EXPECT_NE(rep.error().find("step 0"), std::string::npos) << rep.error();
    EXPECT_EQ(rep.chunks().chunks_size(), 0);
  }
  for (int r = 0; r < 4; ++r) {
    ASSERT_TRUE(workers_[r]->core.FinishPlan(Finish("p2", false)).ok());
    workers_[r]->core.WaitIdle();
    EXPECT_NE(workers_[r]->buffers.Find("T", 1), nullptr);
    EXPECT_EQ(workers_[r]->buffers.Find("T", 2), nullptr);
  }
}

// Rank 3 joins the rendezvous but never executes: the others wait in the exchange (with a
// ten-minute step timeout) until the abort cancels them.
TEST_F(LifecycleTest, AbortInterruptsAStepInFlight) {
  for (int r = 0; r < 3; ++r) {
    ASSERT_TRUE(workers_[r]->core.Execute(Fragment(r, "p6", /*timeout_ms=*/600000)).ok());
  }
  CommunicatorSpec spec;
  spec.ranks = {0, 1, 2, 3};
  spec.incarnations = {7, 7, 7, 7};
  spec.my_rank = 3;
  spec.key_prefix = "plan/p6/";
  ASSERT_TRUE(workers_[3]->cache.Get(spec).ok());
  for (int r = 0; r < 4; ++r) {
    ASSERT_TRUE(workers_[r]->core.FinishPlan(Finish("p6", false)).ok());
  }
  for (int r = 0; r < 3; ++r) {
    workers_[r]->core.WaitIdle();
    EXPECT_EQ(workers_[r]->buffers.Find("T", 2), nullptr);
    EXPECT_NE(workers_[r]->buffers.Find("T", 1), nullptr);
  }
  // An aborted fragment never reports success. A peer may report its own failure: its step
  // broke when another rank's abort closed that rank's communicator first.
  for (const auto& rep : reporter_.Reports()) {
    EXPECT_TRUE(!rep.final() || !rep.error().empty()) << rep.DebugString();
  }
}

// Before registering again a worker forgets every plan it still has: running fragments are
// cancelled and never store their target; stored targets of plans whose commit never came
// stay (the coordinator decides at registration).
TEST_F(LifecycleTest, AbortAllCancelsRunningPlansAndKeepsStoredTargets) {
  for (int r = 0; r < 3; ++r) {
    ASSERT_TRUE(workers_[r]->core.Execute(Fragment(r, "p9", /*timeout_ms=*/600000)).ok());
  }
  // Rank 3 joins the communicator but runs no fragment: the others wait in the step.
  CommunicatorSpec spec;
  spec.ranks = {0, 1, 2, 3};
  spec.incarnations = {7, 7, 7, 7};
  spec.my_rank = 3;
  spec.key_prefix = "plan/p9/";
  ASSERT_TRUE(workers_[3]->cache.Get(spec).ok());
  for (int r = 0; r < 3; ++r) {
    EXPECT_EQ(workers_[r]->core.AbortAll(), 1);
    workers_[r]->core.WaitIdle();
    EXPECT_EQ(workers_[r]->buffers.Find("T", 2), nullptr);
    EXPECT_NE(workers_[r]->buffers.Find("T", 1), nullptr);
    EXPECT_EQ(workers_[r]->core.AbortAll(), 0);
    EXPECT_EQ(workers_[r]->core.Execute(Fragment(r, "p9")).code(), absl::StatusCode::kAborted);
  }
  workers_[3]->cache.ReleasePrefix("plan/p9/");

  for (int r = 0; r < 4; ++r) ASSERT_TRUE(workers_[r]->core.Execute(Fragment(r, "p8")).ok());
  reporter_.WaitFinals(4, "p8");
  for (int r = 0; r < 4; ++r) {
    EXPECT_EQ(workers_[r]->core.AbortAll(), 1);
    EXPECT_NE(workers_[r]->buffers.Find("T", 2), nullptr);
    EXPECT_NE(workers_[r]->buffers.Find("T", 1), nullptr);
  }
}

TEST_F(LifecycleTest, AbortAfterSuccessDropsTheNewBuffer) {
  for (int r = 0; r < 4; ++r) ASSERT_TRUE(workers_[r]->core.Execute(Fragment(r, "p3")).ok());
  reporter_.WaitFinals(4, "p3");
  for (int r = 0; r < 4; ++r) {
    ASSERT_NE(workers_[r]->buffers.Find("T", 2), nullptr);
    ASSERT_TRUE(workers_[r]->core.FinishPlan(Finish("p3", false)).ok());
    EXPECT_EQ(workers_[r]->cache.size(), 0);  // The abort retired the prefix.
    EXPECT_EQ(workers_[r]->buffers.Find("T", 2), nullptr);
    EXPECT_NE(workers_[r]->buffers.Find("T", 1), nullptr);
  }
}

TEST_F(LifecycleTest, CommitNeverDropsItsOwnTarget) {
  for (int r = 0; r < 4; ++r) ASSERT_TRUE(workers_[r]->core.Execute(Fragment(r, "p4")).ok());
  reporter_.WaitFinals(4, "p4");
  v1::FinishPlanRequest req = Finish("p4", true);
  req.set_drop_version(2);
  ASSERT_TRUE(workers_[1]->core.FinishPlan(req).ok());
  EXPECT_NE(workers_[1]->buffers.Find("T", 2), nullptr);
}

// A Copy's fragment reads T's version 1 and writes U's version 5: T is left alone, a commit
// drops U's old version (never the new one), an abort drops only U's new buffer.
TEST_F(LifecycleTest, CopyWritesTheTargetTensor) {
  auto copy_fragment = [this](int r, const std::string& id, int64_t version) {
    v1::PlanFragment f = Fragment(r, id);
    f.set_target_tensor("U");
    f.set_target_version(version);
    return f;
  };
  for (int r = 0; r < 4; ++r)
    ASSERT_TRUE(workers_[r]->core.Execute(copy_fragment(r, "c1", 5)).ok());
  for (const auto& rep : reporter_.WaitFinals(4, "c1")) EXPECT_EQ(rep.error(), "") << rep.rank();
  for (int r = 0; r < 4; ++r) {
    EXPECT_NE(workers_[r]->buffers.Find("U", 5), nullptr);
    EXPECT_EQ(workers_[r]->buffers.Find("T", 5), nullptr);
    v1::FinishPlanRequest commit = Finish("c1", true);
    commit.set_tensor("U");
    commit.set_drop_version(5);  // Never the version the plan just wrote.
    ASSERT_TRUE(workers_[r]->core.FinishPlan(commit).ok());
    EXPECT_NE(workers_[r]->buffers.Find("U", 5), nullptr);
    EXPECT_NE(workers_[r]->buffers.Find("T", 1), nullptr);  // The source is only read.
    const Box box = target_.Find(r)->chunks[0].box;
    std::vector<float> got = ReadAll(workers_[r]->core, "U", 5, box, 1 << 20);
    std::vector<float> want;
    for (int64_t i = 0; i < 8; ++i) {
      for (int64_t j = box.offset(1); j < box.end(1); ++j) want.push_back(i * 12 + j);
    }
    EXPECT_EQ(got, want) << "rank " << r;
  }
  for (int r = 0; r < 4; ++r)
    ASSERT_TRUE(workers_[r]->core.Execute(copy_fragment(r, "c2", 6)).ok());
  reporter_.WaitFinals(4, "c2");
  for (int r = 0; r < 4; ++r) {
    v1::FinishPlanRequest abort = Finish("c2", false);
    abort.set_tensor("U");
    abort.set_drop_version(6);
    ASSERT_TRUE(workers_[r]->core.FinishPlan(abort).ok());
    workers_[r]->core.WaitIdle();
    EXPECT_EQ(workers_[r]->buffers.Find("U", 6), nullptr);
    EXPECT_NE(workers_[r]->buffers.Find("U", 5), nullptr);
    EXPECT_NE(workers_[r]->buffers.Find("T", 1), nullptr);
  }
}

TEST_F(LifecycleTest, ExecuteValidation) {
  v1::PlanFragment f = Fragment(0, "p5");
  f.set_plan_id("");
  EXPECT_EQ(workers_[0]->core.Execute(f).code(), absl::StatusCode::kInvalidArgument);
  f = Fragment(0, "p5");
  f.set_source_version(9);
  EXPECT_EQ(workers_[0]->core.Execute(f).code(), absl::StatusCode::kFailedPrecondition);
  // A buffer with other chunks under the source version is refused up front too.
  v1::FillRequest other = FillFor(target_, 0, v1::ZEROS, /*version=*/1);
  other.set_tensor("T");
  ASSERT_TRUE(workers_[0]->core.Fill(other).ok());
  absl::Status s = workers_[0]->core.Execute(Fragment(0, "p5"));
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
  EXPECT_EQ(workers_[0]->core.running(), 0);
  EXPECT_TRUE(reporter_.Reports().empty());
}

}  // namespace
}  // namespace shardcoord
