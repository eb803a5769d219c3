#include "worker/buffers/checkpoint_io.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>

#include <climits>
#include <cstdlib>
#include <fstream>
#include <memory>
#include <random>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "proto/convert.h"
#include "sharding/block_quant.h"
#include "sharding/checkpoint_index.h"
#include "sharding/checkpoint_plan.h"
#include "sharding/fill.h"
#include "sharding/safetensors.h"
#include "worker/buffers/buffer_store.h"
#include "worker/buffers/checksum.h"
#include "worker/memory/memory_space.h"
#include "worker/testing/fake_device_memory_space.h"

namespace shardcoord {
namespace {

using ::testing::HasSubstr;

const Shape kShape = {40, 12};

std::string TempDir(const std::string& name) {
  const char* base = std::getenv("TEST_TMPDIR");
  std::string dir = absl::StrCat(base != nullptr ? base : "/tmp", "/", name);
  std::string cmd = absl::StrCat("rm -rf '", dir, "' && mkdir -p '", dir, "'");
  EXPECT_EQ(std::system(cmd.c_str()), 0);
  return dir;
}

std::string ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// The safetensors header of the file at `path`.
SafetensorsHeader HeaderOf(const std::string& path) {
  const std::string file = ReadFile(path);
  absl::StatusOr<SafetensorsHeader> h =
      ParseSafetensorsHeader(file.substr(8, *ParseSafetensorsPrefix(file.substr(0, 8))));
  EXPECT_TRUE(h.ok()) << h.status();
  return h.ok() ? *h : SafetensorsHeader();
}

// `req` reads from `dir` into one new f32 buffer, tensor "r" version 9: returns it.
v1::CheckpointReadBuffer* ReadIntoR(const std::string& dir, v1::ReadCheckpointRequest* req) {
  req->set_dir(dir);
  v1::CheckpointReadBuffer* b = req->add_buffers();
  b->set_tensor("r");
  b->set_version(9);
  b->set_dtype(v1::F32);
  return b;
}

// The bytes of `box` of the arange tensor of kShape in f32.
std::string Arange(const Box& box) {
  std::string out(static_cast<size_t>(box.Volume() * 4), '\0');
  EXPECT_TRUE(FillBox(FillKind::kArange, 0, kShape, box, DType::kF32, out.data()).ok());
  return out;
}

// A buffer holding rows [0, 20) and [20, 40) of kShape as two chunks, filled with arange, in
// `space`.
std::shared_ptr<HostBuffer> TwoChunkBuffer(MemorySpace* space) {
  RankChunks rc;
  rc.chunks.push_back(Chunk{Box({20, 0}, {20, 12}), 0, 0});
  rc.chunks.push_back(Chunk{Box({0, 0}, {20, 12}), 240, 0});
  rc.local_elements = 480;
  absl::StatusOr<std::shared_ptr<HostBuffer>> b = HostBuffer::Create(DType::kF32, rc, space);
  EXPECT_TRUE(b.ok());
  std::string host = Arange(Box({20, 0}, {20, 12})) + Arange(Box({0, 0}, {20, 12}));
  EXPECT_TRUE(space->CopyFromHost((*b)->data(), host.data(), 480 * 4).ok());
  return *b;
}

v1::CheckpointWriteEntry Entry(const std::string& name, const Box& box) {
  v1::CheckpointWriteEntry e;
  e.set_entry(name);
  e.set_tensor("w");
  e.set_version(3);
  *e.mutable_box() = BoxToProto(box);
  return e;
}

class CheckpointIoTest : public ::testing::TestWithParam<bool> {
 protected:
  void SetUp() override {
    if (GetParam()) {
      device_ = std::make_unique<FakeDeviceMemorySpace>();
      space_ = device_.get();
    } else {
      space_ = &HostMemorySpace::Global();
    }
    io_ = std::make_unique<CheckpointIo>(&buffers_, space_);
    buffers_.Put("w", 3, TwoChunkBuffer(space_));
    dir_ = TempDir(GetParam() ? "device" : "host");
  }
  void TearDown() override {
    buffers_.DropTensor("w");
    buffers_.DropTensor("r");
  }

  // Writes entries (a whole chunk, rows of a chunk, and a box that is not one run) into
  // dir_/f.safetensors.
  v1::WriteCheckpointResponse WriteThree() {
    v1::WriteCheckpointRequest req;
    req.set_dir(dir_);
    req.set_file("f.safetensors");
    *req.add_entries() = Entry("whole", Box({0, 0}, {20, 12}));
    *req.add_entries() = Entry("rows", Box({25, 0}, {10, 12}));
    *req.add_entries() = Entry("cols", Box({30, 4}, {5, 3}));
    absl::StatusOr<v1::WriteCheckpointResponse> r = io_->Write(req);
    EXPECT_TRUE(r.ok()) << r.status();
    return r.ok() ? *r : v1::WriteCheckpointResponse();
  }

  BufferStore buffers_;
  std::unique_ptr<FakeDeviceMemorySpace> device_;
  MemorySpace* space_ = nullptr;
  std::unique_ptr<CheckpointIo> io_;
  std::string dir_;
};

TEST_P(CheckpointIoTest, WritesASafetensorsFileAnyReaderCanRead) {
  const v1::WriteCheckpointResponse r = WriteThree();
  const std::string file = ReadFile(dir_ + "/f.safetensors");
  EXPECT_EQ(r.file_bytes(), static_cast<int64_t>(file.size()));
  absl::StatusOr<int64_t> n = ParseSafetensorsPrefix(file.substr(0, 8));
  ASSERT_TRUE(n.ok());
  absl::StatusOr<SafetensorsHeader> h =
      ParseSafetensorsHeader(file.substr(8, *n), static_cast<int64_t>(file.size()));
  ASSERT_TRUE(h.ok()) << h.status();
  ASSERT_EQ(h->entries.size(), 3u);
  EXPECT_EQ(h->metadata[0], std::make_pair(std::string("format"), std::string("pt")));
  const Box boxes[] = {Box({0, 0}, {20, 12}), Box({25, 0}, {10, 12}), Box({30, 4}, {5, 3})};
  for (int i = 0; i < 3; ++i) {
    const SafetensorsEntry& e = h->entries[i];
    EXPECT_EQ(e.shape, boxes[i].shape());
    const std::string bytes = file.substr(h->data_start() + e.begin, e.bytes());
    EXPECT_EQ(bytes, Arange(boxes[i])) << e.name;
    EXPECT_EQ(r.entries(i).xxh64(), XXH64(bytes.data(), bytes.size(), 0));
    EXPECT_EQ(r.entries(i).bytes(), static_cast<int64_t>(bytes.size()));
    // Blocks of whole rows: a 48-byte row makes blocks of 21846 rows, so one block here.
    EXPECT_EQ(r.entries(i).rows_per_block(), RowsPerBlock(boxes[i].shape(1) * 4));
    ASSERT_EQ(r.entries(i).blocks_size(), 1);
    EXPECT_EQ(r.entries(i).blocks(0), r.entries(i).xxh64());
  }
}

TEST_P(CheckpointIoTest, ReadsRunsIntoANewBufferAndChecksThem) {
  const v1::WriteCheckpointResponse w = WriteThree();
  const SafetensorsHeader h = HeaderOf(dir_ + "/f.safetensors");
  // Rows [5, 13) of "whole", checked in blocks of 4 rows, and all of "rows", checked by the
  // entry's hash.
  v1::ReadCheckpointRequest req;
  v1::CheckpointReadBuffer* b = ReadIntoR(dir_, &req);
  RankChunks rc;
  rc.chunks.push_back(Chunk{Box({5, 0}, {8, 12}), 0, 0});
  rc.chunks.push_back(Chunk{Box({25, 0}, {10, 12}), 96, 0});
  rc.local_elements = 96 + 120;
  *b->mutable_chunks() = RankChunksToProto(rc);
  v1::CheckpointReadRun* run = b->add_runs();
  run->set_file("f.safetensors");
  run->set_entry("whole");
  run->set_offset(h.data_start() + h.Find("whole")->begin + 5 * 48);
  run->set_bytes(8 * 48);
  run->set_block_bytes(4 * 48);
  for (int k = 0; k < 2; ++k) {
    const std::string block = Arange(Box({5 + 4 * k, 0}, {4, 12}));
    run->add_blocks(XXH64(block.data(), block.size(), 0));
  }
  run = b->add_runs();
  run->set_file("f.safetensors");
  run->set_entry("rows");
  run->set_offset(h.data_start() + h.Find("rows")->begin);
  run->set_bytes(120 * 4);
  run->set_has_xxh64(true);
  run->set_xxh64(w.entries(1).xxh64());
  absl::StatusOr<v1::ReadCheckpointResponse> r = io_->Read(req);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->bytes_read(), 8 * 48 + 120 * 4);
  std::shared_ptr<HostBuffer> got = buffers_.Find("r", 9);
  ASSERT_NE(got, nullptr);
  EXPECT_EQ(&got->space(), space_);
  std::string host(static_cast<size_t>(got->bytes()), '\0');
  ASSERT_TRUE(space_->CopyToHost(host.data(), got->data(), got->bytes()).ok());
  EXPECT_EQ(host, Arange(Box({5, 0}, {8, 12})) + Arange(Box({25, 0}, {10, 12})));
  ASSERT_EQ(r->chunks_size(), 1);
  ASSERT_EQ(r->chunks(0).chunks_size(), 2);
  // The chunk checksums (built as the bytes arrived on the host) are the buffer's own.
  absl::StatusOr<std::vector<uint64_t>> sums = got->Checksums();
  ASSERT_TRUE(sums.ok());
  EXPECT_EQ(r->chunks(0).chunks(0).checksum(), (*sums)[0]);
  EXPECT_EQ(r->chunks(0).chunks(1).checksum(), (*sums)[1]);

  // Reading the same buffer again: ALREADY_EXISTS, and nothing changes.
  EXPECT_EQ(io_->Read(req).status().code(), absl::StatusCode::kAlreadyExists);
  buffers_.DropTensor("r");

  // One flipped byte: DATA_LOSS naming the file and entry, and no buffer is stored.
  {
    const int fd = open((dir_ + "/f.safetensors").c_str(), O_WRONLY);
    ASSERT_GE(fd, 0);
    const char x = 0x5a;
    ASSERT_EQ(pwrite(fd, &x, 1, h.data_start() + h.Find("rows")->begin + 77), 1);
    close(fd);
  }
  absl::StatusOr<v1::ReadCheckpointResponse> bad = io_->Read(req);
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(bad.status().message(), HasSubstr("f.safetensors: entry \"rows\""));
  EXPECT_EQ(buffers_.Find("r", 9), nullptr);

  // Truncated inside the run: DATA_LOSS naming file and entry.
  ASSERT_EQ(
      truncate((dir_ + "/f.safetensors").c_str(), h.data_start() + h.Find("rows")->begin + 100), 0);
  bad = io_->Read(req);
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(bad.status().message(), HasSubstr("f.safetensors: entry \"rows\""));
  EXPECT_THAT(bad.status().message(), HasSubstr("truncated"));
  EXPECT_EQ(buffers_.Find("r", 9), nullptr);
}

// A dequantizing read (issue 28): rows [0, 128) and [256, 300) of a 300x260 f8_e4m3 entry
// (every bit pattern, NaN included) with its 3x3 f32 scales, read and dequantized into bf16:
// the bytes are the reference DequantizeBlocks' of the whole tensor, in the device space too.
TEST_P(CheckpointIoTest, DequantizesF8RunsWithTheirScales) {
  const Shape shape = {300, 260};
  const BlockSize block;
  std::string q(300 * 260, '\0');
  std::mt19937 rng(28);
  for (char& c : q) c = static_cast<char>(rng() & 0xff);
  std::vector<float> scales = {1.0f, 0.5f, 3.0e-8f, 1.5e30f, 1e-3f, 7.0f, 2.0f, 0.25f, 1e-40f};
  const std::string scale_bytes(reinterpret_cast<const char*>(scales.data()), scales.size() * 4);
  absl::StatusOr<std::string> header =
      BuildSafetensorsHeader({{"q", DType::kF8E4M3, shape}, {"q_scale_inv", DType::kF32, {3, 3}}});
  ASSERT_TRUE(header.ok()) << header.status();
  {
    std::ofstream out(dir_ + "/m.safetensors", std::ios::binary);
    out << *header << q << scale_bytes;
  }
  const SafetensorsHeader h = HeaderOf(dir_ + "/m.safetensors");
  std::string want(300 * 260 * 2, '\0');
  ASSERT_TRUE(
      DequantizeBlocks(q.data(), scales.data(), shape, block, want.data(), DType::kBF16).ok());

  v1::ReadCheckpointRequest req;
  v1::CheckpointReadBuffer* b = ReadIntoR(dir_, &req);
  b->set_dtype(v1::BF16);
  RankChunks rc;
  rc.chunks.push_back(Chunk{Box({0, 0}, {128, 260}), 0, 0});
  rc.chunks.push_back(Chunk{Box({256, 0}, {44, 260}), 128 * 260, 0});
  rc.local_elements = 172 * 260;
  *b->mutable_chunks() = RankChunksToProto(rc);
  v1::CheckpointDequantize* dq = b->mutable_dequantize();
  dq->set_block("block:128x128");
  const int64_t values = h.data_start() + h.Find("q")->begin;
  const int64_t scales_at = h.data_start() + h.Find("q_scale_inv")->begin;
  for (const auto& [row, rows] : std::vector<std::pair<int64_t, int64_t>>{{0, 128}, {256, 44}}) {
    v1::CheckpointReadRun* run = b->add_runs();
    run->set_file("m.safetensors");
    run->set_entry("q");
    run->set_offset(values + row * 260);
    run->set_bytes(rows * 260);
    *dq->add_scale_boxes() = BoxToProto(Box({row / 128, 0}, {1, 3}));
    run = dq->add_scale_runs();
    run->set_file("m.safetensors");
    run->set_entry("q_scale_inv");
    run->set_offset(scales_at + row / 128 * 12);
    run->set_bytes(12);
    run->set_has_xxh64(row == 0);  // Checked as a whole run.
    run->set_xxh64(XXH64(scale_bytes.data(), 12, 0));
  }
  absl::StatusOr<v1::ReadCheckpointResponse> r = io_->Read(req);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->bytes_read(), 172 * 260 + 24);
  std::shared_ptr<HostBuffer> got = buffers_.Find("r", 9);
  ASSERT_NE(got, nullptr);
  EXPECT_EQ(got->dtype(), DType::kBF16);
  EXPECT_EQ(&got->space(), space_);
  std::string host(static_cast<size_t>(got->bytes()), '\0');
  ASSERT_TRUE(space_->CopyToHost(host.data(), got->data(), got->bytes()).ok());
  EXPECT_TRUE(host == want.substr(0, 128 * 260 * 2) + want.substr(256 * 260 * 2));
  absl::StatusOr<std::vector<uint64_t>> sums = got->Checksums();
  ASSERT_TRUE(sums.ok());
  ASSERT_EQ(r->chunks(0).chunks_size(), 2);
  EXPECT_EQ(r->chunks(0).chunks(1).checksum(), (*sums)[1]);
  buffers_.DropTensor("r");

  // Each chunk's scales read as the whole scale entry (rows it does not need too, as a reader
  // reads whole checksum blocks): the same values.
  v1::ReadCheckpointRequest whole = req;
  for (int i = 0; i < 2; ++i) {
    v1::CheckpointDequantize* wd = whole.mutable_buffers(0)->mutable_dequantize();
    *wd->mutable_scale_boxes(i) = BoxToProto(Box({0, 0}, {3, 3}));
    wd->mutable_scale_runs(i)->set_offset(scales_at);
    wd->mutable_scale_runs(i)->set_bytes(36);
    wd->mutable_scale_runs(i)->set_has_xxh64(true);
    wd->mutable_scale_runs(i)->set_xxh64(XXH64(scale_bytes.data(), 36, 0));
  }
  r = io_->Read(whole);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->bytes_read(), 172 * 260 + 72);
  got = buffers_.Find("r", 9);
  ASSERT_NE(got, nullptr);
  ASSERT_TRUE(space_->CopyToHost(host.data(), got->data(), got->bytes()).ok());
  EXPECT_TRUE(host == want.substr(0, 128 * 260 * 2) + want.substr(256 * 260 * 2));
  buffers_.DropTensor("r");

  // A scale that does not match its checksum: DATA_LOSS naming the scale entry, nothing stored.
  b->mutable_dequantize()->mutable_scale_runs(0)->set_xxh64(1);
  absl::StatusOr<v1::ReadCheckpointResponse> bad = io_->Read(req);
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(bad.status().message(), HasSubstr("q_scale_inv"));
  EXPECT_EQ(buffers_.Find("r", 9), nullptr);

  // Scale boxes that are not the chunk's blocks, a chunk that does not start on a block
  // boundary: INVALID_ARGUMENT, nothing stored.
  b->mutable_dequantize()->mutable_scale_runs(0)->set_xxh64(XXH64(scale_bytes.data(), 12, 0));
  *b->mutable_dequantize()->mutable_scale_boxes(1) = BoxToProto(Box({1, 0}, {1, 3}));
  bad = io_->Read(req);
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(bad.status().message(), HasSubstr("scale_boxes[1]"));
  rc.chunks[1].box = Box({250, 0}, {50, 260});
  *b->mutable_chunks() = RankChunksToProto(rc);
  b->mutable_runs(1)->set_bytes(50 * 260);
  bad = io_->Read(req);
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(bad.status().message(), HasSubstr("block boundary"));
  EXPECT_EQ(buffers_.Find("r", 9), nullptr);
}

// Runs of several MiB, read in several pieces: checked in the index's blocks, both when those
// are the chunk checksum's 1 MiB blocks (rows of 1 KiB) and when they are not (rows of
// 2800 bytes); the chunk checksums the read reports are the buffer's own either way.
TEST_P(CheckpointIoTest, LargeRunsAreCheckedInBlocksAndSummed) {
  const Shape shape = {3000, 700};
  auto arange = [&](const Box& box) {
    std::string out(static_cast<size_t>(box.Volume() * 4), '\0');
    EXPECT_TRUE(FillBox(FillKind::kArange, 0, shape, box, DType::kF32, out.data()).ok());
    return out;
  };
  RankChunks src;
  src.chunks.push_back(Chunk{Box::Whole(shape), 0, 0});
  src.local_elements = 3000 * 700;
  absl::StatusOr<std::shared_ptr<HostBuffer>> big = HostBuffer::Create(DType::kF32, src, space_);
  ASSERT_TRUE(big.ok());
  const std::string all = arange(Box::Whole(shape));
  ASSERT_TRUE(space_->CopyFromHost((*big)->data(), all.data(), all.size()).ok());
  buffers_.Put("big", 1, *big);
  v1::WriteCheckpointRequest wreq;
  wreq.set_dir(dir_);
  wreq.set_file("big.safetensors");
  *wreq.add_entries() = Entry("whole", Box::Whole(shape));
  *wreq.add_entries() = Entry("left", Box({0, 0}, {3000, 256}));
  for (v1::CheckpointWriteEntry& e : *wreq.mutable_entries()) {
    e.set_tensor("big");
    e.set_version(1);
  }
  absl::StatusOr<v1::WriteCheckpointResponse> w = io_->Write(wreq);
  ASSERT_TRUE(w.ok()) << w.status();
  ASSERT_EQ(w->entries(0).rows_per_block(), RowsPerBlock(2800));
  ASSERT_EQ(w->entries(1).rows_per_block() * 1024, kChecksumBlockBytes);
  const std::string path = dir_ + "/big.safetensors";
  const SafetensorsHeader h = HeaderOf(path);

  // All of "whole" (8.4 MB, more than one read piece) and rows [1024, 3000) of "left" (its
  // blocks 1 and 2).
  v1::ReadCheckpointRequest req;
  v1::CheckpointReadBuffer* b = ReadIntoR(dir_, &req);
  RankChunks rc;
  rc.chunks.push_back(Chunk{Box::Whole(shape), 0, 0});
  rc.chunks.push_back(Chunk{Box({1024, 0}, {1976, 256}), 3000 * 700, 0});
  rc.local_elements = 3000 * 700 + 1976 * 256;
  *b->mutable_chunks() = RankChunksToProto(rc);
  v1::CheckpointReadRun* run = b->add_runs();
  run->set_file("big.safetensors");
  run->set_entry("whole");
  run->set_offset(h.data_start() + h.Find("whole")->begin);
  run->set_bytes(3000 * 2800);
  run->set_block_bytes(w->entries(0).rows_per_block() * 2800);
  *run->mutable_blocks() = w->entries(0).blocks();
  run = b->add_runs();
  run->set_file("big.safetensors");
  run->set_entry("left");
  run->set_offset(h.data_start() + h.Find("left")->begin + 1024 * 1024);
  run->set_bytes(1976 * 1024);
  run->set_block_bytes(kChecksumBlockBytes);
  run->add_blocks(w->entries(1).blocks(1));
  run->add_blocks(w->entries(1).blocks(2));
  // The same runs placed in the buffer at their file offsets' residues modulo
  // kDirectIoAlignment, as the load plan places large runs: on the host their aligned middles
  // are read with O_DIRECT (where the file system has it), with the same bytes and checks.
  v1::ReadCheckpointRequest aligned = req;
  {
    RankChunks placed = rc;
    int64_t at = 0;
    for (int i = 0; i < 2; ++i) {
      const int64_t file_offset = b->runs(i).offset();
      ASSERT_EQ(file_offset % 4, 0);
      at += ((file_offset - at * 4) % kDirectIoAlignment + kDirectIoAlignment) %
            kDirectIoAlignment / 4;
      placed.chunks[i].local_offset = at;
      at += placed.chunks[i].box.Volume();
    }
    placed.local_elements = at;
    *aligned.mutable_buffers(0)->mutable_chunks() = RankChunksToProto(placed);
  }
  // And on pages of their own (as the load plan places them now): each is read whole with one
  // O_DIRECT read of its pages, nothing through the page cache.
  v1::ReadCheckpointRequest own_pages = req;
  {
    RankChunks placed = rc;
    int64_t at = 0;  // Bytes.
    for (int i = 0; i < 2; ++i) {
      const int64_t file_offset = b->runs(i).offset();
      at = (at + kDirectIoAlignment - 1) / kDirectIoAlignment * kDirectIoAlignment +
           file_offset % kDirectIoAlignment;
      placed.chunks[i].local_offset = at / 4;
      at += placed.chunks[i].box.Volume() * 4;
    }
    placed.local_elements =
        (at + kDirectIoAlignment - 1) / kDirectIoAlignment * kDirectIoAlignment / 4;
    *own_pages.mutable_buffers(0)->mutable_chunks() = RankChunksToProto(placed);
  }
  const int direct_fd = open(path.c_str(), O_RDONLY | O_DIRECT);
  const bool direct = !GetParam() && direct_fd >= 0;
  if (direct_fd >= 0) close(direct_fd);
  const std::string want = all + arange(Box({1024, 0}, {1976, 256}));
  for (const v1::ReadCheckpointRequest* request : {&req, &aligned, &own_pages}) {
    SCOPED_TRACE(request == &req ? "packed" : request == &aligned ? "aligned" : "own pages");
    absl::StatusOr<v1::ReadCheckpointResponse> r = io_->Read(*request);
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_EQ(r->bytes_read(), 3000 * 2800 + 1976 * 1024);
    if (request == &aligned && direct) {
      // All but the partial pages at the runs' ends.
      EXPECT_GE(r->bytes_read_direct(), r->bytes_read() - 4 * kDirectIoAlignment);
    } else if (request == &own_pages && direct) {
      EXPECT_EQ(r->bytes_read_direct(), r->bytes_read());
    } else if (GetParam()) {
      // A device buffer is filled through a host staging buffer, which O_DIRECT may fill when
      // the allocator hands out a page-aligned one (tcmalloc does for large sizes, glibc does
      // not): never more than was read.
      EXPECT_LE(r->bytes_read_direct(), r->bytes_read());
    }
    std::shared_ptr<HostBuffer> got = buffers_.Find("r", 9);
    ASSERT_NE(got, nullptr);
    std::string host;
    for (int i = 0; i < 2; ++i) {
      std::string chunk(static_cast<size_t>(got->chunk_bytes(i)), '\0');
      ASSERT_TRUE(space_->CopyToHost(chunk.data(), got->chunk_data(i), chunk.size()).ok());
      host += chunk;
    }
    EXPECT_TRUE(host == want);
    absl::StatusOr<std::vector<uint64_t>> sums = got->Checksums();
    ASSERT_TRUE(sums.ok());
    ASSERT_EQ(r->chunks(0).chunks_size(), 2);
    EXPECT_EQ(r->chunks(0).chunks(0).checksum(), (*sums)[0]);
    EXPECT_EQ(r->chunks(0).chunks(1).checksum(), (*sums)[1]);
    buffers_.DropTensor("r");

    // A flipped byte inside each run (the middle of "whole", the last block of "left"):
    // DATA_LOSS naming the file, entry and bytes, and no buffer.
    for (const auto& [entry, at] : {std::pair<std::string, int64_t>{"whole", 4000001},
                                    std::pair<std::string, int64_t>{"left", 3000 * 1024 - 5}}) {
      const int64_t pos = h.data_start() + h.Find(entry)->begin + at;
      const int fd = open(path.c_str(), O_RDWR);
      ASSERT_GE(fd, 0);
      char x = 0;
      ASSERT_EQ(pread(fd, &x, 1, pos), 1);
      x ^= 0x10;
      ASSERT_EQ(pwrite(fd, &x, 1, pos), 1);
      fsync(fd);  // O_DIRECT reads the device.
      absl::StatusOr<v1::ReadCheckpointResponse> bad = io_->Read(*request);
      EXPECT_EQ(bad.status().code(), absl::StatusCode::kDataLoss);
      EXPECT_THAT(bad.status().message(),
                  HasSubstr(absl::StrCat("big.safetensors: entry \"", entry, "\": bytes [")));
      EXPECT_THAT(bad.status().message(), HasSubstr("corrupted"));
      EXPECT_EQ(buffers_.Find("r", 9), nullptr);
      x ^= 0x10;
      ASSERT_EQ(pwrite(fd, &x, 1, pos), 1);
      fsync(fd);
      close(fd);
    }
  }
  // Truncated inside the aligned middle of "whole": DATA_LOSS naming the file and entry.
  ASSERT_EQ(truncate(path.c_str(), h.data_start() + h.Find("whole")->begin + 5000000), 0);
  for (const v1::ReadCheckpointRequest* request : {&aligned, &own_pages}) {
    absl::StatusOr<v1::ReadCheckpointResponse> bad = io_->Read(*request);
    EXPECT_EQ(bad.status().code(), absl::StatusCode::kDataLoss);
    EXPECT_THAT(bad.status().message(), HasSubstr("big.safetensors: entry \"whole\""));
    EXPECT_THAT(bad.status().message(), HasSubstr("truncated"));
    EXPECT_EQ(buffers_.Find("r", 9), nullptr);
  }
  buffers_.DropTensor("big");
}

TEST_P(CheckpointIoTest, RefusesBadWrites) {
  v1::WriteCheckpointRequest req;
  req.set_dir("relative/dir");
  req.set_file("f.safetensors");
  EXPECT_EQ(io_->Write(req).status().code(), absl::StatusCode::kInvalidArgument);
  req.set_dir(dir_);
  req.set_file("../f.safetensors");
  EXPECT_EQ(io_->Write(req).status().code(), absl::StatusCode::kInvalidArgument);
  req.set_file("f.safetensors");
  *req.add_entries() = Entry("x", Box({15, 0}, {10, 12}));  // Spans both chunks.
  EXPECT_THAT(io_->Write(req).status().message(), HasSubstr("lies in no chunk"));
  req.clear_entries();
  *req.add_entries() = Entry("x", Box({0, 0}, {1, 1}));
  req.mutable_entries(0)->set_version(4);
  EXPECT_EQ(io_->Write(req).status().code(), absl::StatusCode::kNotFound);
  EXPECT_NE(access((dir_ + "/f.safetensors").c_str(), F_OK), 0);  // No file left.
  // An existing file is never overwritten.
  WriteThree();
  req.mutable_entries(0)->set_version(3);
  EXPECT_EQ(io_->Write(req).status().code(), absl::StatusCode::kAlreadyExists);
}

TEST_P(CheckpointIoTest, IndexOfADirectoryAndOfAFile) {
  WriteThree();
  v1::ReadCheckpointIndexRequest req;
  req.set_path(dir_);
  absl::StatusOr<v1::ReadCheckpointIndexResponse> r = io_->ReadIndex(req);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->dir(), dir_);
  EXPECT_TRUE(r->index_json().empty());
  ASSERT_EQ(r->files_size(), 1);
  EXPECT_EQ(r->files(0).file(), "f.safetensors");
  EXPECT_TRUE(ParseSafetensorsHeader(r->files(0).json(), r->files(0).file_bytes()).ok());
  req.set_path(dir_ + "/f.safetensors");
  r = io_->ReadIndex(req);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->dir(), dir_);
  EXPECT_EQ(r->files_size(), 1);
  req.set_path(dir_ + "/missing");
  EXPECT_EQ(io_->ReadIndex(req).status().code(), absl::StatusCode::kNotFound);
  // A file cut inside its header.
  ASSERT_EQ(truncate((dir_ + "/f.safetensors").c_str(), 20), 0);
  req.set_path(dir_);
  absl::StatusOr<v1::ReadCheckpointIndexResponse> cut = io_->ReadIndex(req);
  EXPECT_EQ(cut.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(cut.status().message(), HasSubstr("f.safetensors"));
}

TEST_P(CheckpointIoTest, ARootKeepsEveryPathAndLinkInsideIt) {
  // dir_/root is the root; dir_/out is outside it, reached directly, through "..", and
  // through links inside the root (a directory and a file).
  const std::string root = dir_ + "/root", out = dir_ + "/out";
  ASSERT_EQ(
      std::system(absl::StrCat("mkdir -p '", root, "/in' '", root, "/in2' '", out, "'").c_str()),
      0);
  EXPECT_EQ(CheckpointIo::CanonicalRoot("relative").status().code(),
            absl::StatusCode::kInvalidArgument);
  absl::StatusOr<std::string> missing = CheckpointIo::CanonicalRoot(dir_ + "/missing");
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(missing.status().message(), HasSubstr("--checkpoint-root"));
  // The root itself through a link: stored resolved.
  ASSERT_EQ(symlink(root.c_str(), (dir_ + "/root-link").c_str()), 0);
  absl::StatusOr<std::string> canonical = CheckpointIo::CanonicalRoot(dir_ + "/root-link/");
  ASSERT_TRUE(canonical.ok()) << canonical.status();
  char real[PATH_MAX];
  ASSERT_NE(realpath(root.c_str(), real), nullptr);
  EXPECT_EQ(*canonical, real);
  CheckpointIo io(&buffers_, space_, *canonical);

  auto write = [&](const std::string& dir) {
    v1::WriteCheckpointRequest req;
    req.set_dir(dir);
    req.set_file("f.safetensors");
    *req.add_entries() = Entry("whole", Box({0, 0}, {20, 12}));
    return io.Write(req).status();
  };
  EXPECT_TRUE(write(root + "/in").ok());
  EXPECT_TRUE(write(dir_ + "/root-link/./in/../in2").ok());  // The root's "in2".
  absl::Status outside = write(out);
  EXPECT_EQ(outside.code(), absl::StatusCode::kPermissionDenied);
  EXPECT_THAT(outside.message(), HasSubstr("dir: '" + out +
                                           "' is outside the worker's "
                                           "--checkpoint-root '" +
                                           std::string(real) + "'"));
  EXPECT_EQ(write(root + "/../out").code(), absl::StatusCode::kPermissionDenied);
  EXPECT_EQ(write(dir_ + "/root-linkx").code(), absl::StatusCode::kPermissionDenied);
  ASSERT_EQ(symlink(out.c_str(), (root + "/escape").c_str()), 0);
  EXPECT_EQ(write(root + "/escape").code(), absl::StatusCode::kPermissionDenied);
  EXPECT_EQ(write(root + "/escape/not-yet").code(), absl::StatusCode::kPermissionDenied);
  // "escape/.." is the link target's parent, dir_, as the kernel resolves it, not the root.
  EXPECT_EQ(write(root + "/escape/../out").code(), absl::StatusCode::kPermissionDenied);
  EXPECT_EQ(write(root + "/new/../in").code(), absl::StatusCode::kPermissionDenied);
  EXPECT_NE(access((out + "/f.safetensors").c_str(), F_OK), 0);  // Nothing written outside.

  // Saves' directories, indexes and reads alike.
  v1::CheckpointDirRequest d;
  d.set_dir(out + "/ckpt");
  d.set_tmp(out + "/ckpt.tmp-1");
  d.set_action(v1::CHECKPOINT_DIR_PREPARE);
  EXPECT_EQ(io.Dir(d).code(), absl::StatusCode::kPermissionDenied);
  d.set_dir(root + "/ckpt");
  d.set_tmp(root + "/ckpt.tmp-1");
  EXPECT_TRUE(io.Dir(d).ok());
  v1::ReadCheckpointIndexRequest index;
  index.set_path(root + "/in");
  EXPECT_TRUE(io.ReadIndex(index).ok());
  index.set_path(root + "/escape");
  EXPECT_EQ(io.ReadIndex(index).status().code(), absl::StatusCode::kPermissionDenied);
  // A file inside the root that links out: neither listed nor read.
  ASSERT_EQ(std::system(
                absl::StrCat("cp '", root, "/in/f.safetensors' '", out, "/g.safetensors'").c_str()),
            0);
  ASSERT_EQ(symlink((out + "/g.safetensors").c_str(), (root + "/in/g.safetensors").c_str()), 0);
  index.set_path(root + "/in");
  absl::StatusOr<v1::ReadCheckpointIndexResponse> listed = io.ReadIndex(index);
  EXPECT_EQ(listed.status().code(), absl::StatusCode::kPermissionDenied);
  EXPECT_THAT(listed.status().message(), HasSubstr("g.safetensors"));
  index.set_path(root + "/in/g.safetensors");
  EXPECT_EQ(io.ReadIndex(index).status().code(), absl::StatusCode::kPermissionDenied);
  // Nor read into a buffer.
  const SafetensorsHeader h = HeaderOf(root + "/in/f.safetensors");
  v1::ReadCheckpointRequest read;
  v1::CheckpointReadBuffer* b = ReadIntoR(root + "/in", &read);
  RankChunks rc;
  rc.chunks.push_back(Chunk{Box({0, 0}, {20, 12}), 0, 0});
  rc.local_elements = 240;
  *b->mutable_chunks() = RankChunksToProto(rc);
  v1::CheckpointReadRun* run = b->add_runs();
  run->set_file("g.safetensors");
  run->set_entry("whole");
  run->set_offset(h.data_start() + h.Find("whole")->begin);
  run->set_bytes(240 * 4);
  absl::StatusOr<v1::ReadCheckpointResponse> denied = io.Read(read);
  EXPECT_EQ(denied.status().code(), absl::StatusCode::kPermissionDenied);
  EXPECT_THAT(denied.status().message(), HasSubstr("file: '" + root + "/in/g.safetensors'"));
  EXPECT_EQ(buffers_.Find("r", 9), nullptr);
  run->set_file("f.safetensors");
  EXPECT_TRUE(io.Read(read).ok());
  // A link that stays inside the root is fine.
  ASSERT_EQ(unlink((root + "/in/g.safetensors").c_str()), 0);
  ASSERT_EQ(symlink((root + "/in/f.safetensors").c_str(), (root + "/in/g.safetensors").c_str()), 0);
  EXPECT_TRUE(io.ReadIndex(index).ok());
}

TEST_P(CheckpointIoTest, DirectoryLifecycle) {
  const std::string dir = dir_ + "/ckpt", tmp = dir_ + "/ckpt.tmp-1";
  v1::CheckpointDirRequest req;
  req.set_dir(dir);
  req.set_tmp(tmp);
  req.set_action(v1::CHECKPOINT_DIR_PREPARE);
  ASSERT_TRUE(io_->Dir(req).ok());
  struct stat st;
  ASSERT_EQ(stat(tmp.c_str(), &st), 0);
  req.set_action(v1::CHECKPOINT_DIR_COMMIT);
  req.set_index_json("{\"first\": 1}");
  ASSERT_TRUE(io_->Dir(req).ok());
  EXPECT_NE(stat(tmp.c_str(), &st), 0);
  EXPECT_EQ(ReadFile(dir + "/index.json"), "{\"first\": 1}");

  // A second save to the same dir: refused without overwrite, before anything is written.
  req.set_action(v1::CHECKPOINT_DIR_PREPARE);
  EXPECT_EQ(io_->Dir(req).code(), absl::StatusCode::kAlreadyExists);
  // With overwrite: the old one stays until the new one is complete, then is swapped out.
  req.set_overwrite(true);
  ASSERT_TRUE(io_->Dir(req).ok());
  EXPECT_EQ(ReadFile(dir + "/index.json"), "{\"first\": 1}");
  req.set_action(v1::CHECKPOINT_DIR_COMMIT);
  req.set_index_json("{\"second\": 2}");
  ASSERT_TRUE(io_->Dir(req).ok());
  EXPECT_EQ(ReadFile(dir + "/index.json"), "{\"second\": 2}");
  EXPECT_NE(stat(tmp.c_str(), &st), 0);

  // An aborted save leaves the previous checkpoint as it was and no tmp.
  req.set_action(v1::CHECKPOINT_DIR_PREPARE);
  ASSERT_TRUE(io_->Dir(req).ok());
  req.set_action(v1::CHECKPOINT_DIR_ABORT);
  ASSERT_TRUE(io_->Dir(req).ok());
  EXPECT_NE(stat(tmp.c_str(), &st), 0);
  EXPECT_EQ(ReadFile(dir + "/index.json"), "{\"second\": 2}");

  // A missing parent.
  req.set_dir(dir_ + "/no/such/ckpt");
  req.set_tmp(dir_ + "/no/such/ckpt.tmp-2");
  req.set_action(v1::CHECKPOINT_DIR_PREPARE);
  EXPECT_EQ(io_->Dir(req).code(), absl::StatusCode::kFailedPrecondition);
}

INSTANTIATE_TEST_SUITE_P(HostAndDevice, CheckpointIoTest, ::testing::Bool(),
                         [](const ::testing::TestParamInfo<bool>& p) {
                           return p.param ? "Device" : "Host";
                         });

}  // namespace
}  // namespace shardcoord
