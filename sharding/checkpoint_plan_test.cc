#include "sharding/checkpoint_plan.h"

#include <algorithm>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "sharding/checkpoint_index.h"
#include "sharding/layout.h"
#include "sharding/mesh.h"
#include "sharding/placement.h"
#include "sharding/planner.h"
#include "sharding/reference_executor.h"
#include "sharding/test_layouts.h"

namespace shardcoord {
namespace {

using ::testing::HasSubstr;

Layout Flat(int64_t ranks, const Shape& shape, const std::string& spec) {
  absl::StatusOr<DeviceMesh> mesh = DeviceMesh::Create({ranks});
  absl::StatusOr<FlatSpec> f = ParseFlatSpec(spec);
  EXPECT_TRUE(f.ok()) << spec;
  absl::StatusOr<Layout> layout = Layout::FromFlat(*mesh, shape, *f);
  EXPECT_TRUE(layout.ok()) << layout.status();
  return *layout;
}

// Checks a save plan: every element of every tensor in exactly one entry, each entry inside a
// chunk its writer holds.
void CheckSaveCovers(const std::vector<SaveTensor>& tensors, const SavePlan& plan) {
  std::vector<int64_t> covered(tensors.size(), 0);
  for (const SaveFile& f : plan.files) {
    EXPECT_EQ(f.file, CheckpointFileName(f.rank));
    int64_t bytes = 0;
    for (const SaveEntry& e : f.entries) {
      const Layout& layout = tensors[e.tensor].layout;
      const RankChunks* rc = layout.Find(f.rank);
      ASSERT_NE(rc, nullptr) << "rank " << f.rank << " writes what it does not hold";
      bool inside = false;
      for (const Chunk& c : rc->chunks) inside = inside || c.box.Contains(e.box);
      EXPECT_TRUE(inside) << e.entry;
      EXPECT_EQ(e.entry, PieceEntryName(tensors[e.tensor].name, e.box));
      covered[e.tensor] += e.box.Volume();
      bytes += e.bytes;
    }
    EXPECT_EQ(bytes, f.bytes);
  }
  for (size_t t = 0; t < tensors.size(); ++t) {
    EXPECT_EQ(covered[t], tensors[t].layout.num_elements()) << tensors[t].name;
  }
}

TEST(PlanSaveTest, ReplicatedIsWrittenOnceAndShared) {
  // R on 4 ranks: each writes a quarter.
  std::vector<SaveTensor> tensors = {{"r", DType::kF32, Placed({4}, {1024, 256}, "R")}};
  absl::StatusOr<SavePlan> plan = PlanSave(tensors);
  ASSERT_TRUE(plan.ok()) << plan.status();
  CheckSaveCovers(tensors, *plan);
  ASSERT_EQ(plan->files.size(), 4u);
  for (const SaveFile& f : plan->files) EXPECT_EQ(f.bytes, 1024 * 256 * 4 / 4);
  EXPECT_EQ(plan->total_bytes, 1024 * 256 * 4);
}

TEST(PlanSaveTest, DedupesReplicasOfShards) {
  // S(0),R on 2x2: two distinct halves, each held by two ranks: all four write a quarter.
  std::vector<SaveTensor> tensors = {{"m", DType::kBF16, Placed({2, 2}, {512, 512}, "S(0),R")}};
  absl::StatusOr<SavePlan> plan = PlanSave(tensors);
  ASSERT_TRUE(plan.ok());
  CheckSaveCovers(tensors, *plan);
  ASSERT_EQ(plan->files.size(), 4u);
  for (const SaveFile& f : plan->files) EXPECT_EQ(f.bytes, 512 * 512 * 2 / 4);
}

TEST(PlanSaveTest, UnevenFlatAndSmallPieces) {
  std::vector<SaveTensor> tensors = {
      {"uneven", DType::kF32, Placed({4}, {10, 7}, "S(0)")},  // 3,3,3,1 rows.
      {"flat", DType::kF64, Flat(2, {5, 3}, "0:7;7:15")},
      {"norm", DType::kF32, Placed({4}, {16}, "R")},  // Too small to split: one writer.
      {"scalar", DType::kI64, Placed({2}, {}, "R")},
  };
  absl::StatusOr<SavePlan> plan = PlanSave(tensors);
  ASSERT_TRUE(plan.ok()) << plan.status();
  CheckSaveCovers(tensors, *plan);
  int norm_entries = 0;
  for (const SaveFile& f : plan->files) {
    for (const SaveEntry& e : f.entries) norm_entries += tensors[e.tensor].name == "norm";
  }
  EXPECT_EQ(norm_entries, 1);
}

TEST(PlanSaveTest, BalancedWithinTenPercentOnAModel) {
  // A small decoder's state dict on a 2x2 (dp, tp) Megatron layout: replicated over dp, row or
  // column parallel over tp, norms replicated everywhere.
  std::vector<SaveTensor> tensors;
  const int64_t h = 256, ffn = 704, vocab = 1000;
  tensors.push_back({"embed", DType::kBF16, Placed({2, 2}, {vocab, h}, "R,S(0)")});
  for (int l = 0; l < 4; ++l) {
    const std::string p = "layers." + std::to_string(l) + ".";
    tensors.push_back({p + "q", DType::kBF16, Placed({2, 2}, {h, h}, "R,S(0)")});
    tensors.push_back({p + "o", DType::kBF16, Placed({2, 2}, {h, h}, "R,S(1)")});
    tensors.push_back({p + "up", DType::kBF16, Placed({2, 2}, {ffn, h}, "R,S(0)")});
    tensors.push_back({p + "down", DType::kBF16, Placed({2, 2}, {h, ffn}, "R,S(1)")});
    tensors.push_back({p + "norm", DType::kBF16, Placed({2, 2}, {h}, "R,R")});
  }
  absl::StatusOr<SavePlan> plan = PlanSave(tensors, SavePlanOptions{4096});
  ASSERT_TRUE(plan.ok());
  CheckSaveCovers(tensors, *plan);
  EXPECT_EQ(plan->candidate_writers, 4);
  EXPECT_LE(static_cast<double>(plan->max_writer_bytes), 1.1 * plan->ideal_writer_bytes);
}

TEST(PlanSaveTest, RefusesPartial) {
  std::vector<SaveTensor> tensors = {{"p", DType::kF32, Placed({2}, {4}, "P")}};
  absl::StatusOr<SavePlan> plan = PlanSave(tensors);
  EXPECT_EQ(plan.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(plan.status().message(), HasSubstr("'p'"));
}

// The index a save of `layout` writes (without checksums).
CheckpointTensor Saved(const std::string& name, DType dtype, const Layout& layout,
                       int64_t rows_per_block = 0) {
  std::vector<SaveTensor> tensors = {{name, dtype, layout}};
  absl::StatusOr<SavePlan> plan = PlanSave(tensors, SavePlanOptions{1});
  EXPECT_TRUE(plan.ok());
  CheckpointTensor t;
  t.name = name;
  t.shape = layout.global_shape();
  t.dtype = dtype;
  for (const SaveFile& f : plan->files) {
    for (const SaveEntry& e : f.entries) {
      CheckpointPiece p;
      p.box = e.box;
      p.file = f.file;
      p.entry = e.entry;
      if (rows_per_block > 0) {
        p.rows_per_block = rows_per_block;
        p.blocks.assign((BoxRows(e.box) + rows_per_block - 1) / rows_per_block, 0);
      }
      t.pieces.push_back(p);
    }
  }
  return t;
}

// Checks a load plan for one tensor: the read layout tiles the tensor, each run lies in one
// piece and whole blocks of it, its reader's target needs part of it, and the exchange from
// the read layout to the target delivers every value.
void CheckLoad(const CheckpointTensor& t, const Layout& target, const TensorRead& read) {
  int64_t elements = 0;
  for (const ReadRun& r : read.runs) {
    const CheckpointPiece& p = t.pieces[r.piece];
    EXPECT_TRUE(p.box.Contains(r.box));
    if (p.rows_per_block > 0) {
      EXPECT_EQ(r.row_begin % p.rows_per_block, 0);
      EXPECT_TRUE(r.row_end % p.rows_per_block == 0 || r.row_end == BoxRows(p.box));
    }
    const RankChunks* mine = target.Find(r.rank);
    ASSERT_NE(mine, nullptr) << "rank " << r.rank << " reads but is not in the target";
    bool needed = false;
    for (const Chunk& c : mine->chunks) needed = needed || c.box.Overlaps(r.box);
    EXPECT_TRUE(needed) << "rank " << r.rank << " reads " << r.box.ToString();
    elements += r.box.Volume();
  }
  EXPECT_EQ(elements, Box::Whole(t.shape).Volume());
  absl::StatusOr<Plan> exchange = Redistribute(read.read_layout, target, t.dtype);
  ASSERT_TRUE(exchange.ok()) << exchange.status();
  EXPECT_TRUE(CheckPlanByExecution(*exchange, 7, true).ok());
  EXPECT_EQ(exchange->bytes_moved, exchange->lower_bound_bytes);
}

TEST(PlanLoadTest, ReplicatedTargetReadsEveryByteOnceBalanced) {
  const Layout source = Placed({2}, {256, 16}, "S(0)");
  const CheckpointTensor t = Saved("w", DType::kF32, source);
  const Layout target = Placed({4}, {256, 16}, "R");
  absl::StatusOr<LoadPlan> plan = PlanLoad({LoadTensor{&t, target}});
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(plan->total_bytes, 256 * 16 * 4);
  ASSERT_EQ(plan->bytes_by_rank.size(), 4u);
  for (const auto& [rank, bytes] : plan->bytes_by_rank) {
    EXPECT_EQ(bytes, 256 * 16 * 4 / 4) << "rank " << rank;
  }
  CheckLoad(t, target, plan->tensors[0]);
}

// Bytes each rank reads of tensor `t` of a plan.
std::map<int64_t, int64_t> BytesByRank(const LoadPlan& plan, size_t t, int64_t element_size) {
  std::map<int64_t, int64_t> out;
  for (const ReadRun& r : plan.tensors[t].runs) out[r.rank] += r.box.Volume() * element_size;
  return out;
}

TEST(PlanLoadTest, BalancedWithinEachGroup) {
  // `a` goes to ranks 0 and 1 only (each reads its own half); `b` is replicated on all four.
  // Balanced over both tensors at once, ranks 2 and 3 read all of `b` (0 and 1 have their
  // half of `a` already); a load reading `a` and `b` in separate batches wants each batch
  // spread over every rank that can read it, which separate groups give.
  const CheckpointTensor a = Saved("a", DType::kF32, Placed({1}, {256, 16}, "R"));
  const CheckpointTensor b = Saved("b", DType::kF32, Placed({1}, {256, 16}, "R"));
  const Layout a_target = Placed({2}, {256, 16}, "S(0)");
  const Layout b_target = Placed({4}, {256, 16}, "R");
  absl::StatusOr<LoadPlan> together =
      PlanLoad({LoadTensor{&a, a_target}, LoadTensor{&b, b_target}});
  ASSERT_TRUE(together.ok()) << together.status();
  EXPECT_EQ(BytesByRank(*together, 1, 4), (std::map<int64_t, int64_t>{{2, 8192}, {3, 8192}}));

  LoadTensor la{&a, a_target}, lb{&b, b_target};
  la.group = 0;
  lb.group = 1;
  absl::StatusOr<LoadPlan> grouped = PlanLoad({la, lb});
  ASSERT_TRUE(grouped.ok()) << grouped.status();
  EXPECT_EQ(BytesByRank(*grouped, 0, 4), (std::map<int64_t, int64_t>{{0, 8192}, {1, 8192}}));
  EXPECT_EQ(BytesByRank(*grouped, 1, 4),
            (std::map<int64_t, int64_t>{{0, 4096}, {1, 4096}, {2, 4096}, {3, 4096}}));
  EXPECT_EQ(grouped->total_bytes, 2 * 256 * 16 * 4);
  CheckLoad(a, a_target, grouped->tensors[0]);
  CheckLoad(b, b_target, grouped->tensors[1]);
}

TEST(PlanLoadTest, ShardedTargetReadsOnlyItsRows) {
  // Saved flat on 4 ranks, loaded as S(0) on 4: each rank reads exactly its quarter.
  const Shape shape = {64, 32};
  const CheckpointTensor t =
      Saved("w", DType::kBF16, Flat(4, shape, "0:500;500:1024;1024:1600;1600:2048"));
  const Layout target = Placed({4}, shape, "S(0)");
  absl::StatusOr<LoadPlan> plan = PlanLoad({LoadTensor{&t, target}});
  ASSERT_TRUE(plan.ok()) << plan.status();
  for (const ReadRun& r : plan->tensors[0].runs) {
    EXPECT_TRUE(target.Find(r.rank)->chunks[0].box.Contains(r.box)) << r.box.ToString();
  }
  CheckLoad(t, target, plan->tensors[0]);
}

TEST(PlanLoadTest, RowAlignReadsWholeBlocksOfRows) {
  // A 300-row entry (as a Hugging Face file holds it: one piece) loaded S(0) on 4 ranks of 75
  // rows: with row_align 128 every run starts on a multiple of 128 rows and ends on one or at
  // row 300, so each reader holds whole 128-row blocks (a dequantizing load); the exchange
  // still delivers every value. With block checksums of 48 rows, runs cut on multiples of 384.
  const Shape shape = {300, 260};
  const CheckpointTensor t = Saved("w", DType::kF8E4M3, Placed({1}, shape, "R"));
  const Layout target = Placed({4}, shape, "S(0)");
  LoadTensor lt{&t, target};
  lt.row_align = 128;
  absl::StatusOr<LoadPlan> plan = PlanLoad({lt});
  ASSERT_TRUE(plan.ok()) << plan.status();
  std::vector<std::pair<int64_t, int64_t>> rows;
  for (const ReadRun& r : plan->tensors[0].runs) {
    EXPECT_EQ(r.row_begin % 128, 0) << r.box.ToString();
    EXPECT_TRUE(r.row_end % 128 == 0 || r.row_end == 300) << r.box.ToString();
    rows.push_back({r.row_begin, r.row_end});
  }
  std::sort(rows.begin(), rows.end());
  EXPECT_EQ(rows, (std::vector<std::pair<int64_t, int64_t>>{{0, 128}, {128, 256}, {256, 300}}));
  EXPECT_EQ(plan->total_bytes, 300 * 260);
  CheckLoad(t, target, plan->tensors[0]);

  const CheckpointTensor checked = Saved("w", DType::kF8E4M3, Placed({1}, shape, "R"), 48);
  LoadTensor lc{&checked, target};
  lc.row_align = 128;
  plan = PlanLoad({lc});
  ASSERT_TRUE(plan.ok()) << plan.status();
  for (const ReadRun& r : plan->tensors[0].runs) {
    EXPECT_EQ(r.row_begin % 384, 0) << r.box.ToString();
  }
  CheckLoad(checked, target, plan->tensors[0]);

  // Without it, the readers' rows follow the target's 75-row chunks.
  plan = PlanLoad({LoadTensor{&t, target}});
  ASSERT_TRUE(plan.ok()) << plan.status();
  bool unaligned = false;
  for (const ReadRun& r : plan->tensors[0].runs) unaligned = unaligned || r.row_begin % 128 != 0;
  EXPECT_TRUE(unaligned);
}

TEST(PlanLoadTest, EveryLayoutKind) {
  const Shape shape = {10, 7};
  const std::vector<Layout> sources = {
      Placed({4}, shape, "S(0)"),         Placed({2, 2}, shape, "S(1),R"), Placed({4}, shape, "R"),
      Flat(3, shape, "0:30;30:31;31:70"), Placed({1}, shape, "R"),
  };
  const std::vector<Layout> targets = {
      Placed({4}, shape, "S(0)"),
      Placed({4}, shape, "S(1)"),
      Placed({2, 2}, shape, "R,S(0)"),
      Placed({2, 2}, shape, "S(0),S(1)"),
      Placed({3}, shape, "R"),
      Flat(4, shape, "0:17;17:40;40:41;41:70"),
      Placed({4}, shape, "S(0,[1,0,6,3])"),
  };
  for (int64_t rows_per_block : {0, 1, 2}) {
    for (const Layout& s : sources) {
      const CheckpointTensor t = Saved("x", DType::kI32, s, rows_per_block);
      for (const Layout& target : targets) {
        absl::StatusOr<LoadPlan> plan = PlanLoad({LoadTensor{&t, target}});
        ASSERT_TRUE(plan.ok()) << plan.status();
        EXPECT_EQ(plan->total_bytes, 70 * 4);
        SCOPED_TRACE(s.SpecString() + " -> " + target.SpecString());
        CheckLoad(t, target, plan->tensors[0]);
      }
    }
  }
}

TEST(PlanLoadTest, AlignsLargeRunsWithTheirFileOffsets) {
  const Shape shape = {1024, 512};  // bf16 rows of 1 KiB.
  const CheckpointTensor t =
      Saved("w", DType::kBF16, Flat(3, shape, "0:100001;100001:300000;300000:524288"), 64);
  const Layout target = Placed({2, 2}, shape, "R,S(0)");
  LoadTensor load{&t, target};
  // Arbitrary offsets; the last piece's is odd, which no gap of whole bf16 elements can match.
  for (size_t p = 0; p < t.pieces.size(); ++p) {
    load.piece_file_offsets.push_back(p + 1 == t.pieces.size() ? 777777 : 1000 + 4242 * p);
  }
  absl::StatusOr<LoadPlan> plan = PlanLoad({load}, LoadPlanOptions{4096});
  ASSERT_TRUE(plan.ok()) << plan.status();
  int aligned = 0;
  for (const ReadRun& r : plan->tensors[0].runs) {
    const int64_t piece_offset = load.piece_file_offsets[r.piece];
    const CheckpointPiece& p = t.pieces[r.piece];
    EXPECT_EQ(r.file_offset, piece_offset + r.row_begin * BoxRowElements(p.box) * 2);
    if (r.box.Volume() * 2 < kAlignedRunBytes || piece_offset % 2 != 0) continue;
    EXPECT_EQ(((r.local_offset * 2 - r.file_offset) % 4096 + 4096) % 4096, 0) << r.box.ToString();
    // Its pages hold no other run's bytes and lie inside the buffer.
    const int64_t first = r.local_offset * 2 / 4096 * 4096;
    const int64_t last = ((r.local_offset + r.box.Volume()) * 2 + 4095) / 4096 * 4096;
    const RankChunks* rc = plan->tensors[0].read_layout.Find(r.rank);
    ASSERT_NE(rc, nullptr);
    EXPECT_LE(last, rc->local_elements * 2);
    for (const Chunk& c : rc->chunks) {
      if (c.local_offset == r.local_offset) continue;
      const int64_t begin = c.local_offset * 2, end = (c.local_offset + c.box.Volume()) * 2;
      EXPECT_TRUE(end <= first || begin >= last) << r.box.ToString() << " and " << c.box.ToString();
    }
    ++aligned;
  }
  EXPECT_GT(aligned, 2);
  // The gaps leave the read layout valid and the exchange exact.
  CheckLoad(t, target, plan->tensors[0]);
  // Without offsets, or without alignment: no gaps.
  for (const LoadPlanOptions& options : {LoadPlanOptions{0}, LoadPlanOptions{4096}}) {
    LoadTensor plain = load;
    if (options.align_bytes > 0) plain.piece_file_offsets.clear();
    plan = PlanLoad({plain}, options);
    ASSERT_TRUE(plan.ok()) << plan.status();
    for (const RankChunks& rc : plan->tensors[0].read_layout.ranks()) {
      int64_t sum = 0;
      for (const Chunk& c : rc.chunks) sum += c.box.Volume();
      EXPECT_EQ(rc.local_elements, sum);
    }
  }
  EXPECT_FALSE(PlanLoad({load}, LoadPlanOptions{1000}).ok());
}

TEST(PlanLoadTest, ScalarsAndEmptyTensors) {
  const CheckpointTensor s = Saved("s", DType::kF64, Placed({2}, {}, "R"));
  const Layout target = Placed({3}, {}, "R");
  absl::StatusOr<LoadPlan> plan = PlanLoad({LoadTensor{&s, target}});
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(plan->total_bytes, 8);
  CheckLoad(s, target, plan->tensors[0]);
  CheckpointTensor empty;
  empty.name = "e";
  empty.shape = {0, 4};
  absl::StatusOr<LoadPlan> none = PlanLoad({LoadTensor{&empty, Placed({2}, {0, 4}, "S(0)")}});
  ASSERT_TRUE(none.ok()) << none.status();
  EXPECT_EQ(none->total_bytes, 0);
}

TEST(PlanLoadTest, RefusesShapeMismatchAndPartial) {
  const CheckpointTensor t = Saved("w", DType::kF32, Placed({2}, {4, 4}, "S(0)"));
  EXPECT_THAT(PlanLoad({LoadTensor{&t, Placed({2}, {4, 5}, "S(0)")}}).status().message(),
              HasSubstr("shape"));
  EXPECT_FALSE(PlanLoad({LoadTensor{&t, Placed({2}, {4, 4}, "P")}}).ok());
}

TEST(CutLoadBatchesTest, EvenBatchesInOrderNoTensorSplit) {
  using Batches = std::vector<std::vector<size_t>>;
  // 8 tensors of 10 bytes in batches of 20: four batches of two, in order.
  const std::vector<int64_t> even(8, 10);
  EXPECT_EQ(CutLoadBatches(even, 20), (Batches{{0, 1}, {2, 3}, {4, 5}, {6, 7}}));
  // No batch size, or one larger than everything: one batch.
  EXPECT_EQ(CutLoadBatches(even, 0), (Batches{{0, 1, 2, 3, 4, 5, 6, 7}}));
  EXPECT_EQ(CutLoadBatches(even, 1000), (Batches{{0, 1, 2, 3, 4, 5, 6, 7}}));
  // Never more batches than tensors.
  EXPECT_EQ(CutLoadBatches({5, 5}, 1), (Batches{{0}, {1}}));
  // A big tensor goes where its middle falls; every tensor is in exactly one batch, in order.
  const std::vector<int64_t> mixed = {1, 1, 60, 1, 1, 30, 3, 3};
  const Batches cut = CutLoadBatches(mixed, 25);
  ASSERT_EQ(cut.size(), 4u);
  std::vector<size_t> all;
  for (const std::vector<size_t>& b : cut) {
    EXPECT_FALSE(b.empty());
    all.insert(all.end(), b.begin(), b.end());
  }
  EXPECT_EQ(all, (std::vector<size_t>{0, 1, 2, 3, 4, 5, 6, 7}));
  EXPECT_EQ(cut, (Batches{{0, 1}, {2}, {3, 4}, {5, 6, 7}}));
  EXPECT_TRUE(CutLoadBatches({}, 10).empty());
  // Empty tensors ride along.
  EXPECT_EQ(CutLoadBatches({0, 0, 0}, 10), (Batches{{0, 1, 2}}));
}

TEST(CutLoadBatchesTest, SmallFirstBatch) {
  using Batches = std::vector<std::vector<size_t>>;
  const std::vector<int64_t> even(8, 10);
  // The tensors that fit in 15 bytes, then batches of about 20 (7 tensors in
  // round(70 / 20) = 4 batches, each tensor where its middle falls).
  EXPECT_EQ(CutLoadBatches(even, 20, 15), (Batches{{0}, {1, 2}, {3}, {4, 5}, {6, 7}}));
  EXPECT_EQ(CutLoadBatches(even, 20, 25), (Batches{{0, 1}, {2, 3}, {4, 5}, {6, 7}}));
  // A large tensor waits for the next batch; the small ones after it still go first.
  EXPECT_EQ(CutLoadBatches({60, 1, 1, 30, 2}, 40, 10), (Batches{{1, 2, 4}, {0}, {3}}));
  // None fits: the first tensor alone.
  EXPECT_EQ(CutLoadBatches({60, 20, 30}, 40, 10), (Batches{{0}, {1, 2}}));
  // Everything fits the first batch; no batch size means one batch.
  EXPECT_EQ(CutLoadBatches({1, 2, 3}, 20, 100), (Batches{{0, 1, 2}}));
  EXPECT_EQ(CutLoadBatches(even, 0, 15), (Batches{{0, 1, 2, 3, 4, 5, 6, 7}}));
}

}  // namespace
}  // namespace shardcoord
