#include "worker/plans/executor.h"

#include <atomic>
#include <cstring>
#include <functional>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "proto/convert.h"
#include "sharding/cast.h"
#include "sharding/fill.h"
#include "sharding/layout.h"
#include "sharding/mesh.h"
#include "sharding/placement.h"
#include "sharding/planner.h"
#include "worker/buffers/buffer_store.h"
#include "worker/buffers/checksum.h"
#include "worker/comm/gloo/gloo_communicator.h"
#include "worker/control/kv_client.h"
#include "worker/plans/fragment.h"
#include "worker/testing/executor_test_util.h"

namespace shardcoord {
namespace {

using executor_testing::ForEachElement;
using executor_testing::Fragments;
using executor_testing::MakeLayout;
using executor_testing::MakeSource;

constexpr int kRanks = 4;

struct Cluster : executor_testing::GlooCluster {
  Cluster() : GlooCluster(kRanks) {}
};

struct RunOutput {
  std::vector<absl::StatusOr<ExecuteResult>> results;
  std::vector<std::shared_ptr<HostBuffer>> targets;
  std::set<StepOp> methods;
};

// Runs fragments (one per rank, through the wire format) on threads.
RunOutput RunFragments(Cluster& cluster, const std::vector<v1::PlanFragment>& protos,
                       const std::vector<std::shared_ptr<HostBuffer>>& sources,
                       ExecutorOptions options, int ranks_running = kRanks) {
  RunOutput out;
  out.results.resize(ranks_running, absl::UnknownError("not run"));
  out.targets.resize(ranks_running);
  std::vector<Fragment> fragments(ranks_running);
  for (int r = 0; r < ranks_running; ++r) {
    absl::StatusOr<Fragment> f = ParseFragment(protos[r]);
    EXPECT_TRUE(f.ok()) << f.status();
    if (!f.ok()) return out;
    fragments[r] = *f;
    out.targets[r] = *HostBuffer::Create(f->shapes[0].target_dtype(), f->shapes[0].target);
  }
  out.results =
      executor_testing::ExecuteOnThreads(cluster, fragments, sources, out.targets, options);
  out.methods = executor_testing::MethodsOf(out.results);
  return out;
}

// Checks every element of every target chunk and the reported checksums.
void CheckTarget(const Layout& source, const Layout& target, DType dtype, const RunOutput& out) {
  executor_testing::CheckTargets(source, target, dtype, out.results, [&](int r, size_t k) {
    return absl::string_view(out.targets[r]->chunk_data(k), out.targets[r]->chunk_bytes(k));
  });
}

// Runs the hand-built f32 `plan` (source and target as in the plan) with its collectives
// (copy-based ones when `copy_collectives`) and then point-to-point only, checking the target
// each time. The methods of the collective run.
std::set<StepOp> RunHandBuilt(const Plan& plan, absl::string_view id, bool copy_collectives) {
  Cluster cluster;
  std::set<StepOp> methods;
  for (bool p2p_only : {false, true}) {
    std::vector<std::shared_ptr<HostBuffer>> sources;
    for (int r = 0; r < kRanks; ++r) sources.push_back(MakeSource(plan.source, r, DType::kF32));
    ExecutorOptions options;
    options.force_point_to_point = p2p_only;
    options.force_copy_collectives = copy_collectives && !p2p_only;
    RunOutput out = RunFragments(cluster, Fragments(plan, absl::StrCat(id, p2p_only ? 1 : 0)),
                                 sources, options);
    CheckTarget(plan.source, plan.target, DType::kF32, out);
    if (!p2p_only) methods = out.methods;
  }
  return methods;
}

struct Case {
  std::string name;
  Shape mesh_from, mesh_to;
  std::vector<int64_t> ranks_from, ranks_to;  // Empty: 0..n-1.
  std::string from, to;
  Shape shape;
  DType dtype = DType::kF32;
};

// kSmallMessages: the default methods, with SendRecv transfers cut into messages of at most
// 24 bytes (many slabs per transfer, some staged, some landing in place).
enum class Mode { kDefault, kCopyCollectives, kPointToPoint, kSmallMessages };

std::set<StepOp> RunCase(Cluster& cluster, const Case& c, Mode mode, int serial) {
  const bool force_p2p = mode == Mode::kPointToPoint;
  SCOPED_TRACE(absl::StrCat(c.name, force_p2p                        ? " (point-to-point)"
                                    : mode == Mode::kCopyCollectives ? " (copy collectives)"
                                    : mode == Mode::kSmallMessages   ? " (small messages)"
                                                                     : ""));
  Layout a = MakeLayout(c.mesh_from, c.ranks_from, c.from, c.shape);
  Layout b = MakeLayout(c.mesh_to, c.ranks_to, c.to, c.shape);
  absl::StatusOr<Plan> plan = Redistribute(a, b, c.dtype);
  EXPECT_TRUE(plan.ok()) << plan.status();
  if (!plan.ok()) return {};
  std::vector<std::shared_ptr<HostBuffer>> sources;
  for (int r = 0; r < kRanks; ++r) sources.push_back(MakeSource(a, r, c.dtype));
  ExecutorOptions options;
  options.force_point_to_point = force_p2p;
  options.force_copy_collectives = mode == Mode::kCopyCollectives;
  if (mode == Mode::kSmallMessages) options.message_bytes = 24;
  RunOutput out =
      RunFragments(cluster, Fragments(*plan, absl::StrCat("p", serial), kRanks), sources, options);
  CheckTarget(a, b, c.dtype, out);
  if (force_p2p) {
    EXPECT_TRUE(out.methods.empty() ||
                (out.methods.size() == 1 && *out.methods.begin() == StepOp::kPointToPoint));
  }
  return out.methods;
}

TEST(ExecutorTest, PlannerPlansAllTransitions) {
  const std::vector<Case> cases = {
      {"1d S(0)->S(1)", {4}, {4}, {}, {}, "S(0)", "S(1)", {16, 12}},
      {"1d S(0)->R", {4}, {4}, {}, {}, "S(0)", "R", {10, 6}},
      {"1d R->S(1)", {4}, {4}, {}, {}, "R", "S(1)", {4, 8}, DType::kBF16},
      {"1d P(sum)->R", {4}, {4}, {}, {}, "P(sum)", "R", {6, 5}},
      // Large enough that the cost model prefers the all-reduce.
      {"1d P(sum)->R large", {4}, {4}, {}, {}, "P(sum)", "R", {256, 512}},
      {"1d P(sum)->S(0)", {4}, {4}, {}, {}, "P(sum)", "S(0)", {8, 3}, DType::kI32},
      {"1d P(max)->S(1)", {4}, {4}, {}, {}, "P(max)", "S(1)", {5, 8}},
      {"1d P(min)->R", {4}, {4}, {}, {}, "P(min)", "R", {3, 3}, DType::kI64},
      {"1d P(avg)->R f64", {4}, {4}, {}, {}, "P(avg)", "R", {4, 5}, DType::kF64},
      {"1d S(0)->P(sum)", {4}, {4}, {}, {}, "S(0)", "P(sum)", {8, 2}},
      {"2x2 S(0),R->R,S(1)", {2, 2}, {2, 2}, {}, {}, "S(0),R", "R,S(1)", {12, 10}},
      {"2x2 P(sum),R->R,R", {2, 2}, {2, 2}, {}, {}, "P(sum),R", "R,R", {6, 4}},
      {"2x2 P(sum),P(sum)->R,S(0)", {2, 2}, {2, 2}, {}, {}, "P(sum),P(sum)", "R,S(0)", {6, 4}},
      {"2x2 S(0),S(1)->S(1),S(0)", {2, 2}, {2, 2}, {}, {}, "S(0),S(1)", "S(1),S(0)", {8, 6}},
      {"uneven S(0)->S(1)", {4}, {4}, {}, {}, "S(0,[1,6,0,2])", "S(1)", {9, 7}},
      {"flat->S(1) 3d",
       {4},
       {4},
       {},
       {},
       "flat 0:10;10:50;50:100;100:120",
       "S(1)",
       {4, 5, 6},
       DType::kU8},
      {"S(1)->flat",
       {4},
       {4},
       {},
       {},
       "S(1)",
       "flat 0:7,60:100;7:20;20:60;100:120",
       {4, 5, 6},
       DType::kI8},
      {"cross-mesh 1 rank R -> 4 ranks R", {1}, {4}, {2}, {}, "R", "R", {7, 9}},
      {"cross-mesh 2x2 S(0),R -> permuted 1d S(0)",
       {2, 2},
       {4},
       {},
       {3, 1, 0, 2},
       "S(0),R",
       "S(0)",
       {8, 4}},
  };
  Cluster cluster;
  std::set<StepOp> used;
  int serial = 0;
  std::set<StepOp> used_by_default;
  for (const Case& c : cases) {
    for (Mode mode :
         {Mode::kDefault, Mode::kCopyCollectives, Mode::kPointToPoint, Mode::kSmallMessages}) {
      std::set<StepOp> m = RunCase(cluster, c, mode, serial++);
      used.insert(m.begin(), m.end());
      if (mode == Mode::kDefault) used_by_default.insert(m.begin(), m.end());
    }
  }
  // Gloo prefers grouped send/recv for copies; reductions keep their collectives.
  EXPECT_FALSE(used_by_default.count(StepOp::kAllToAll));
  EXPECT_FALSE(used_by_default.count(StepOp::kAllGather));
  EXPECT_TRUE(used_by_default.count(StepOp::kAllReduce));
  EXPECT_TRUE(used_by_default.count(StepOp::kReduceScatter));
  // The collectives the planner emits all ran as collectives somewhere above.
  for (StepOp m : {StepOp::kAllToAll, StepOp::kAllGather, StepOp::kAllReduce,
                   StepOp::kReduceScatter, StepOp::kBroadcast, StepOp::kPointToPoint}) {
    EXPECT_TRUE(used.count(m)) << StepOpName(m) << " never used";
  }
}

TEST(ExecutorTest, GatherToOneRank) {
  Cluster cluster;
  Layout a = MakeLayout({2, 2}, {}, "S(0),S(1)", {6, 6});
  absl::StatusOr<Plan> plan = Gather(a, {2}, DType::kF32);
  ASSERT_TRUE(plan.ok()) << plan.status();
  std::vector<std::shared_ptr<HostBuffer>> sources;
  for (int r = 0; r < kRanks; ++r) sources.push_back(MakeSource(a, r, DType::kF32));
  RunOutput out = RunFragments(cluster, Fragments(*plan, "gather"), sources, {});
  CheckTarget(a, plan->target, DType::kF32, out);
}

// ---------------------------------------------------------------------------------------
// Plans that cast: every element of the target is sharding/cast.h's conversion of the source
// element, bit for bit, whatever the method and wherever the conversion happens.

// The bits source element `flat` holds: every third a pseudo-random bit pattern (NaNs with
// payloads, infinities, subnormals, huge values), the others small values with fractions.
void StoreCastSource(char* data, DType dtype, int64_t i, int64_t flat) {
  if (flat % 3 == 0) {
    uint64_t z = static_cast<uint64_t>(flat) * 0x9E3779B97F4A7C15ull + 0x632BE59BD9B4E019ull;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z ^= z >> 31;
    std::memcpy(data + i * ElementSize(dtype), &z, static_cast<size_t>(ElementSize(dtype)));
  } else {
    StoreFromDouble(data, dtype, i, (static_cast<double>(flat) - 40) * 0.3125 + 0.0078125);
  }
}

TEST(ExecutorTest, CastsInFlightAreBitExact) {
  struct CastCase {
    std::string name;
    Shape mesh_from, mesh_to;
    std::vector<int64_t> ranks_to;
    std::string from, to;
    Shape shape;
    DType src, dst;
  };
  const std::vector<CastCase> cases = {
      {"f32->bf16 S(0)->S(1)", {4}, {4}, {}, "S(0)", "S(1)", {16, 12}, DType::kF32, DType::kBF16},
      {"f32->f8_e4m3 2x2 S(0),R->R,S(1)",
       {2, 2},
       {2, 2},
       {},
       "S(0),R",
       "R,S(1)",
       {12, 10},
       DType::kF32,
       DType::kF8E4M3},
      {"bf16->f32 R->S(1)", {4}, {4}, {}, "R", "S(1)", {4, 8}, DType::kBF16, DType::kF32},
      {"i32->i64 S(0)->R", {4}, {4}, {}, "S(0)", "R", {10, 6}, DType::kI32, DType::kI64},
      {"f64->f8_e5m2 cross-mesh permuted",
       {2, 2},
       {4},
       {3, 1, 0, 2},
       "S(0),S(1)",
       "S(1)",
       {8, 4},
       DType::kF64,
       DType::kF8E5M2},
      {"f8_e4m3->f16 uneven",
       {4},
       {4},
       {},
       "S(0,[1,6,0,2])",
       "S(1)",
       {9, 7},
       DType::kF8E4M3,
       DType::kF16},
  };
  Cluster cluster;
  int serial = 0;
  for (const CastCase& c : cases) {
    for (Mode mode :
         {Mode::kDefault, Mode::kCopyCollectives, Mode::kPointToPoint, Mode::kSmallMessages}) {
      SCOPED_TRACE(absl::StrCat(c.name, " mode ", static_cast<int>(mode)));
      Layout a = MakeLayout(c.mesh_from, {}, c.from, c.shape);
      Layout b = MakeLayout(c.mesh_to, c.ranks_to, c.to, c.shape);
      absl::StatusOr<Plan> plan = Redistribute(a, b, c.src, c.dst, {});
      ASSERT_TRUE(plan.ok()) << plan.status();
      std::vector<std::shared_ptr<HostBuffer>> sources;
      for (int r = 0; r < kRanks; ++r) {
        const RankChunks* rc = a.Find(r);
        if (rc == nullptr) {
          sources.push_back(nullptr);
          continue;
        }
        sources.push_back(*HostBuffer::Create(c.src, *rc));
        for (size_t k = 0; k < rc->chunks.size(); ++k) {
          char* data = sources.back()->chunk_data(k);
          ForEachElement(a.global_shape(), rc->chunks[k].box,
                         [&](int64_t i, int64_t flat) { StoreCastSource(data, c.src, i, flat); });
        }
      }
      ExecutorOptions options;
      options.force_point_to_point = mode == Mode::kPointToPoint;
      options.force_copy_collectives = mode == Mode::kCopyCollectives;
      if (mode == Mode::kSmallMessages) options.message_bytes = 6;
      RunOutput out = RunFragments(
          cluster, Fragments(*plan, absl::StrCat("cast", serial++), kRanks), sources, options);
      const int64_t in = ElementSize(c.src), os = ElementSize(c.dst);
      for (int r = 0; r < kRanks; ++r) {
        ASSERT_TRUE(out.results[r].ok()) << "rank " << r << ": " << out.results[r].status();
        const RankChunks* rc = b.Find(r);
        if (rc == nullptr) continue;
        ASSERT_EQ(out.targets[r]->dtype(), c.dst);
        for (size_t k = 0; k < rc->chunks.size(); ++k) {
          const char* data = out.targets[r]->chunk_data(k);
          EXPECT_EQ(out.results[r]->checksums[k],
                    ChunkChecksum(data, out.targets[r]->chunk_bytes(k)));
          ForEachElement(b.global_shape(), rc->chunks[k].box, [&](int64_t i, int64_t flat) {
            char src[8] = {}, want[8] = {};
            StoreCastSource(src, c.src, 0, flat);
            ASSERT_TRUE(Cast(src, c.src, want, c.dst, 1).ok());
            ASSERT_EQ(std::memcmp(data + i * os, want, static_cast<size_t>(os)), 0)
                << "rank " << r << " element " << i << " flat " << flat << " (source " << in
                << " bytes)";
          });
        }
      }
    }
  }
}

// ---------------------------------------------------------------------------------------
// Hand-built fragments: each collective shape the planner may not produce here, checked
// against the same execution as point-to-point.

Chunk C(Box box, int64_t offset = 0, int64_t partial = 0) { return Chunk{box, offset, partial}; }

RankChunks Rc(int64_t rank, std::vector<Chunk> chunks) {
  RankChunks rc;
  rc.rank = rank;
  rc.chunks = std::move(chunks);
  for (const Chunk& c : rc.chunks) {
    rc.local_elements = std::max(rc.local_elements, c.local_offset + c.box.Volume());
  }
  return rc;
}

Transfer T(int64_t src, int64_t dst, Box box, bool reduce = false, int64_t partial = 0) {
  Transfer t;
  t.src = src;
  t.dst = dst;
  t.bytes = box.Volume() * 4;
  t.box = std::move(box);
  t.reduce = reduce;
  t.partial_index = partial;
  return t;
}

TEST(ExecutorTest, HandBuiltBroadcastAndAllGatherWithTwoBoxPieces) {
  // Tensor [4, 4] f32. Rank 0 holds rows 0..1 in two chunks (row 0 at offset 4, row 1 at
  // 0: local order differs from global), rank 1 rows 2..3; ranks 2, 3 hold nothing.
  // Target: every rank holds all rows.
  const Shape shape = {4, 4};
  Layout source =
      *Layout::FromChunks(shape, {Rc(0, {C(Box({1, 0}, {1, 4}), 0), C(Box({0, 0}, {1, 4}), 4)}),
                                  Rc(1, {C(Box({2, 0}, {2, 4}))}), Rc(2, {}), Rc(3, {})});
  std::vector<RankChunks> all;
  for (int r = 0; r < kRanks; ++r) all.push_back(Rc(r, {C(Box({0, 0}, {4, 4}))}));
  Layout target = *Layout::FromChunks(shape, all);

  Plan plan;
  plan.source = source;
  plan.target = target;
  plan.dtype = DType::kF32;
  plan.local_copies = {
      {0, Box({0, 0}, {1, 4})}, {0, Box({1, 0}, {1, 4})}, {1, Box({2, 0}, {2, 4})}};
  Step gather;  // Ranks 0 and 1 exchange pieces; rank 0's piece is two boxes.
  gather.op = StepOp::kAllGather;
  gather.ranks = {0, 1};
  gather.transfers = {T(0, 1, Box({1, 0}, {1, 4})), T(0, 1, Box({0, 0}, {1, 4})),
                      T(1, 0, Box({2, 0}, {2, 4}))};
  Step bcast;  // Rank 0 broadcasts its two row chunks to ranks 2, 3 (steps read only
               // source chunks, so pieces keep the source chunk boundaries).
  bcast.op = StepOp::kBroadcast;
  bcast.ranks = {2, 0, 3};
  bcast.root = 0;
  bcast.transfers = {T(0, 2, Box({0, 0}, {1, 4})), T(0, 2, Box({1, 0}, {1, 4})),
                     T(0, 3, Box({1, 0}, {1, 4})), T(0, 3, Box({0, 0}, {1, 4}))};
  Step p2p;
  p2p.op = StepOp::kPointToPoint;
  p2p.ranks = {1, 2, 3};
  p2p.transfers = {T(1, 2, Box({2, 0}, {1, 4})), T(1, 2, Box({3, 0}, {1, 4})),
                   T(1, 3, Box({2, 0}, {2, 4}))};
  plan.steps = {gather, bcast, p2p};
  for (Step& s : plan.steps) {
    for (const Transfer& t : s.transfers) s.bytes += t.bytes;
  }

  const std::set<StepOp> methods = RunHandBuilt(plan, "hand", /*copy_collectives=*/true);
  EXPECT_TRUE(methods.count(StepOp::kAllGather));
  EXPECT_TRUE(methods.count(StepOp::kBroadcast));
}

TEST(ExecutorTest, HandBuiltReduceScatterWithNonReceiver) {
  // P(sum) over 3 contributions on ranks 0, 1, 2 of a [3, 4] tensor; rows 0..1 end on rank 0
  // and row 2 on rank 1; rank 2 only contributes. Rank 3 sits out.
  const Shape shape = {3, 4};
  Layout source = *Layout::FromChunks(
      shape,
      {Rc(0, {C(Box({0, 0}, {3, 4}), 0, 0)}), Rc(1, {C(Box({0, 0}, {3, 4}), 0, 1)}),
       Rc(2, {C(Box({0, 0}, {3, 4}), 0, 2)})},
      3, ReduceOp::kSum);
  Layout target = *Layout::FromChunks(
      shape, {Rc(0, {C(Box({0, 0}, {2, 4}))}), Rc(1, {C(Box({2, 0}, {1, 4}))})});
  Plan plan;
  plan.source = source;
  plan.target = target;
  plan.dtype = DType::kF32;
  plan.local_copies = {{0, Box({0, 0}, {2, 4}), true, 0}, {1, Box({2, 0}, {1, 4}), true, 1}};
  Step rs;
  rs.op = StepOp::kReduceScatter;
  rs.ranks = {0, 1, 2};
  rs.transfers = {T(1, 0, Box({0, 0}, {2, 4}), true, 1), T(2, 0, Box({0, 0}, {2, 4}), true, 2),
                  T(0, 1, Box({2, 0}, {1, 4}), true, 0), T(2, 1, Box({2, 0}, {1, 4}), true, 2)};
  for (const Transfer& t : rs.transfers) rs.bytes += t.bytes;
  plan.steps = {rs};
  EXPECT_EQ(ChooseStepOp(rs), StepOp::kReduceScatter);
  RunHandBuilt(plan, "rs", /*copy_collectives=*/false);
}

TEST(ExecutorTest, ShapeMismatchFallsBackToSendRecv) {
  Step s;
  s.op = StepOp::kAllGather;
  s.ranks = {0, 1, 2};
  // Rank 0 sends to 1 only: not an all-gather.
  s.transfers = {T(0, 1, Box({0}, {2})), T(1, 0, Box({2}, {2})), T(1, 2, Box({2}, {2}))};
  EXPECT_EQ(ChooseStepOp(s), StepOp::kPointToPoint);
  s.op = StepOp::kAllReduce;
  s.transfers = {T(0, 1, Box({0}, {2}), true, 0), T(1, 0, Box({0}, {2}), true, 0)};
  EXPECT_EQ(ChooseStepOp(s), StepOp::kPointToPoint);  // Same contribution twice.
  s.ranks = {0, 1};
  s.transfers = {T(0, 1, Box({0}, {2}), true, 0), T(1, 0, Box({0}, {2}), true, 1)};
  EXPECT_EQ(ChooseStepOp(s), StepOp::kAllReduce);
  EXPECT_EQ(ChooseStepOp(s, /*force_point_to_point=*/true), StepOp::kPointToPoint);
  s.op = StepOp::kBroadcast;
  s.root = 0;
  s.transfers = {T(0, 1, Box({0}, {2}))};
  EXPECT_EQ(ChooseStepOp(s), StepOp::kBroadcast);
  s.root = 1;
  EXPECT_EQ(ChooseStepOp(s), StepOp::kPointToPoint);
}

TEST(ExecutorTest, MissingSourceIsFailedPrecondition) {
  Layout a = MakeLayout({4}, {}, "S(0)", {8, 4});
  Layout b = MakeLayout({4}, {}, "S(1)", {8, 4});
  Plan plan = *Redistribute(a, b, DType::kF32);
  Fragment f = *ParseFragment(Fragments(plan, "nosrc")[1]);
  auto target = *HostBuffer::Create(f.shapes[0].dtype, f.shapes[0].target);
  Cluster cluster;
  ExecuteInput in;
  in.fragment = &f;
  in.target = target.get();
  in.communicators = cluster.caches[1].get();
  absl::StatusOr<ExecuteResult> r = ExecuteFragment(in);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kFailedPrecondition) << r.status();
  // A buffer with other chunks is refused too.
  auto wrong = MakeSource(a, 2, DType::kF32);
  in.source = wrong.get();
  r = ExecuteFragment(in);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kFailedPrecondition) << r.status();
}

TEST(ExecutorTest, CancelledBeforeFirstStep) {
  Layout a = MakeLayout({4}, {}, "S(0)", {8, 4});
  Layout b = MakeLayout({4}, {}, "S(1)", {8, 4});
  Plan plan = *Redistribute(a, b, DType::kF32);
  Fragment f = *ParseFragment(Fragments(plan, "cancel")[0]);
  auto source = MakeSource(a, 0, DType::kF32);
  auto target = *HostBuffer::Create(f.shapes[0].dtype, f.shapes[0].target);
  Cluster cluster;
  CancelToken cancel;
  cancel.Cancel();
  ExecuteInput in;
  in.fragment = &f;
  in.source = source.get();
  in.target = target.get();
  in.communicators = cluster.caches[0].get();
  in.cancel = &cancel;
  absl::StatusOr<ExecuteResult> r = ExecuteFragment(in);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kAborted) << r.status();
  EXPECT_EQ(cluster.caches[0]->size(), 0);  // Nothing was built.
}

TEST(ExecutorTest, AbsentPeerTimesOutNamingTheStep) {
  Layout a = MakeLayout({4}, {}, "S(0)", {8, 4});
  Layout b = MakeLayout({4}, {}, "S(1)", {8, 4});
  Plan plan = *Redistribute(a, b, DType::kF32);
  std::vector<v1::PlanFragment> protos = Fragments(plan, "late");
  for (auto& p : protos) p.set_step_timeout_ms(400);
  std::vector<std::shared_ptr<HostBuffer>> sources;
  for (int r = 0; r < kRanks; ++r) sources.push_back(MakeSource(a, r, DType::kF32));
  Cluster cluster;
  RunOutput out = RunFragments(cluster, protos, sources, {}, /*ranks_running=*/3);
  for (int r = 0; r < 3; ++r) {
    const absl::Status& s = out.results[r].status();
    EXPECT_EQ(s.code(), absl::StatusCode::kDeadlineExceeded) << s;
    EXPECT_NE(s.message().find("step 0 (all_to_all over ranks [0,1,2,3]) on rank"),
              std::string::npos)
        << s;
  }
}

TEST(ExecutorTest, StepTagIsStableAndDistinct) {
  EXPECT_EQ(StepTag("p", 0), StepTag("p", 0));
  EXPECT_NE(StepTag("p", 0), StepTag("p", 1));
  EXPECT_NE(StepTag("p", 1), StepTag("q", 1));
  // FNV-1a of "a/0" (stable across processes and builds).
  EXPECT_EQ(StepTag("a", 0), 0xE88DF4ABu);
}

}  // namespace
}  // namespace shardcoord
