#include "sharding/transfer_table.h"

#include <functional>
#include <map>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "sharding/planner.h"
#include "sharding/testing/test_util.h"

namespace shardcoord {
namespace {

using sharding_testing::ErrorOf;
using sharding_testing::Mesh;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;

Layout Placed(const DeviceMesh& mesh, const Shape& shape, const std::string& placements) {
  absl::StatusOr<std::vector<Placement>> p = ParsePlacements(placements);
  EXPECT_TRUE(p.ok()) << p.status();
  absl::StatusOr<Layout> l = Layout::FromPlacements(mesh, shape, *p);
  EXPECT_TRUE(l.ok()) << l.status();
  return *l;
}

Layout Flat(const DeviceMesh& mesh, const Shape& shape, const std::string& flat) {
  absl::StatusOr<FlatSpec> spec = ParseFlatSpec(flat);
  EXPECT_TRUE(spec.ok()) << spec.status();
  absl::StatusOr<Layout> l = Layout::FromFlat(mesh, shape, *spec);
  EXPECT_TRUE(l.ok()) << l.status();
  return *l;
}

// A weight sync in small: an FSDP-flat trainer on ranks 0-3 (a 1-d mesh) to a (dp 2, tp 2)
// engine on ranks 2-5, cross-mesh; two members share a template, one is bf16, one is
// attached.
TransferTable Table() {
  const DeviceMesh train = Mesh({4});
  const DeviceMesh engine = Mesh({2, 2}, {2, 3, 4, 5});
  TransferTable t;
  t.layouts = {
      Flat(train, {8, 4}, "0:10;10:20;20:30;30:32"),  // 0: a's and b's src
      Placed(engine, {8, 4}, "R,S(0)"),               // 1: a's, b's and d's dst
      Flat(train, {6}, "0:6;;;"),                     // 2: c's src (all on rank 0)
      Placed(engine, {6}, "R,R"),                     // 3: c's dst
      Placed(train, {8, 4}, "S(1)"),                  // 4: d's src
  };
  auto add = [&](std::string src, std::string dst, int32_t from, int32_t to, DType dtype) {
    TransferMemberSpec& m = t.members.emplace_back();
    m.src = std::move(src);
    m.dst = std::move(dst);
    m.src_version = 3;
    m.dst_version = 7;
    m.src_layout = from;
    m.dst_layout = to;
    m.dtype = dtype;
  };
  add("a.src", "a.dst", 0, 1, DType::kF32);
  add("b.src", "b.dst", 0, 1, DType::kF32);  // a's template
  add("c.src", "c.dst", 2, 3, DType::kF32);
  add("d.src", "d.dst", 4, 1, DType::kBF16);
  t.members.back().dst_attached = true;
  t.hosts_by_rank = {"h0", "h0", "h1", "h1", "h2", "h2"};
  return t;
}

ExpandOptions Options() {
  ExpandOptions o;
  o.transfer_id = "sync@1";
  for (int64_t r = 0; r < 6; ++r) o.incarnations[r] = 10 + r;
  o.step_timeout_ms = 500;
  return o;
}

TEST(TransferTableTest, TemplatesAreTheDistinctLayoutPairsAndDtypes) {
  const TransferTemplates t = TemplatesOf(Table());
  ASSERT_EQ(t.templates.size(), 3u);
  EXPECT_THAT(t.of_member, ElementsAre(0, 0, 1, 2));
  EXPECT_EQ(t.templates[2].dtype, DType::kBF16);
  EXPECT_THAT(TransferParticipants(Table()), ElementsAre(0, 1, 2, 3, 4, 5));
}

// Every rank's expansion is the rank's fragment of the fused transaction the coordinator
// would have sent (MakeFragments over every member's plan), and the ranks agree.
TEST(TransferTableTest, EachRankExpandsItsOwnFusedFragment) {
  const TransferTable table = Table();
  PlanOptions plan_options;
  plan_options.hosts_by_rank = table.hosts_by_rank;
  plan_options.use_collectives = false;
  std::vector<Plan> plans;
  for (const TransferMemberSpec& m : table.members) {
    absl::StatusOr<Plan> p = Redistribute(table.layouts[m.src_layout], table.layouts[m.dst_layout],
                                          m.dtype, plan_options);
    ASSERT_TRUE(p.ok()) << p.status();
    plans.push_back(*std::move(p));
  }
  std::vector<const Plan*> pointers;
  std::vector<FragmentMemberOptions> members;
  for (size_t i = 0; i < plans.size(); ++i) {
    pointers.push_back(&plans[i]);
    FragmentMemberOptions& m = members.emplace_back();
    m.index = static_cast<int32_t>(i);
    m.plan_id = "sync@1";
    m.tensor = table.members[i].src;
    m.target_tensor = table.members[i].dst;
    m.source_version = 3;
    m.target_version = 7;
    m.attached_target_version = table.members[i].dst_attached ? 7 : 0;
  }
  FragmentOptions fragment_options;
  fragment_options.plan_id = "sync@1";
  fragment_options.fused = true;
  const std::map<int64_t, Fragment> want = MakeFragments(pointers, members, fragment_options);

  int64_t sent = 0, received = 0, moved = 0, lower = 0;
  for (int64_t rank = 0; rank < 6; ++rank) {
    SCOPED_TRACE(absl::StrCat("rank ", rank));
    absl::StatusOr<RankTransfer> got = ExpandTransfer(table, rank, Options());
    ASSERT_TRUE(got.ok()) << got.status();
    const Fragment& f = got->fragment;
    EXPECT_TRUE(f.fused);
    EXPECT_EQ(f.plan_id, "sync@1");
    EXPECT_EQ(f.rank, rank);
    EXPECT_EQ(f.step_timeout_ms, 500);
    EXPECT_THAT(f.exchange_ranks, ElementsAre(0, 1, 2, 3, 4, 5));
    EXPECT_EQ(f.member_incarnations.at(rank), 10 + rank);
    auto it = want.find(rank);
    ASSERT_NE(it, want.end());
    // MakeFragments gives a member to every rank its layouts list; expansion leaves out a
    // rank that holds no source chunk and is not in the target (nothing to read, write or
    // move).
    std::vector<size_t> kept;
    for (size_t i = 0; i < it->second.members.size(); ++i) {
      const FragmentMember& b = it->second.members[i];
      const FragmentShape& sb = it->second.shape_of(i);
      if (!sb.source.chunks.empty() ||
          table.layouts[table.members[b.index].dst_layout].Find(rank) != nullptr) {
        kept.push_back(i);
      }
    }
    const Fragment& w = it->second;
    // MakeFragments shares shapes by plan object; members of one template share one here.
    ASSERT_EQ(f.members.size(), kept.size());
    for (size_t i = 0; i < f.members.size(); ++i) {
      const FragmentMember& a = f.members[i];
      const FragmentMember& b = w.members[kept[i]];
      EXPECT_EQ(a.index, b.index);
      EXPECT_EQ(a.tensor, b.tensor);
      EXPECT_EQ(a.target_tensor, b.target_tensor);
      EXPECT_EQ(a.source_version, b.source_version);
      EXPECT_EQ(a.target_version, b.target_version);
      EXPECT_EQ(a.attached_target_version, b.attached_target_version) << a.target_tensor;
      const FragmentShape& sa = f.shape_of(i);
      const FragmentShape& sb = w.shape_of(kept[i]);
      EXPECT_EQ(sa.rank, rank);
      EXPECT_EQ(sa.dtype, sb.dtype);
      EXPECT_EQ(sa.source.chunks, sb.source.chunks);
      EXPECT_EQ(sa.target.chunks, sb.target.chunks);
      EXPECT_EQ(sa.target.local_elements, sb.target.local_elements);
      EXPECT_EQ(sa.local_copies, sb.local_copies);
      EXPECT_EQ(sa.transfers, sb.transfers);
    }
    // a and b share their template's shape.
    if (f.members.size() >= 2 && f.members[0].index == 0 && f.members[1].index == 1) {
      EXPECT_EQ(f.members[0].shape, f.members[1].shape);
    }
    sent += got->bytes_sent;
    received += got->bytes_received;
    moved += got->owned_bytes_moved;
    lower += got->owned_lower_bound_bytes;
  }
  int64_t want_moved = 0, want_lower = 0;
  for (const Plan& p : plans) {
    want_moved += p.bytes_moved;
    want_lower += p.lower_bound_bytes;
  }
  EXPECT_GT(want_moved, 0);
  EXPECT_EQ(sent, want_moved);
  EXPECT_EQ(received, want_moved);
  EXPECT_EQ(moved, want_moved);
  EXPECT_EQ(lower, want_lower);
}

TEST(TransferTableTest, ReplicasShareAKeyAndTargetBytesCountNewBuffersOnly) {
  const TransferTable table = Table();
  std::map<int64_t, RankTransfer> by_rank;
  for (int64_t rank = 0; rank < 6; ++rank) {
    absl::StatusOr<RankTransfer> got = ExpandTransfer(table, rank, Options());
    ASSERT_TRUE(got.ok()) << got.status();
    by_rank[rank] = *std::move(got);
  }
  // The engine is (dp 2, tp 2) over 2, 3, 4, 5: R,S(0) and R,R make 2 and 4 replicas, 3 and 5.
  EXPECT_EQ(by_rank[2].replica_key, by_rank[4].replica_key);
  EXPECT_EQ(by_rank[3].replica_key, by_rank[5].replica_key);
  EXPECT_NE(by_rank[2].replica_key, by_rank[3].replica_key);
  EXPECT_NE(by_rank[2].replica_key, 0u);
  // The trainer's ranks 0 and 1 hold no target.
  EXPECT_EQ(by_rank[0].replica_key, 0u);
  EXPECT_EQ(by_rank[1].target_bytes, 0);
  // Rank 2: half of a and b (4x4 f32 each) and all of c (6 f32); d is attached (in place).
  EXPECT_EQ(by_rank[2].target_bytes, 2 * 16 * 4 + 6 * 4);
}

// SummarizeTransfer plans each template once and agrees with every rank's own expansion.
TEST(TransferTableTest, SummaryIsEachRanksExpansionWithoutItsFragment) {
  TransferTable table = Table();
  table.members[2].dst_attached = true;  // c: its replicas' keys still agree, no new buffer.
  absl::StatusOr<std::vector<RankTransfer>> summary = SummarizeTransfer(table);
  ASSERT_TRUE(summary.ok()) << summary.status();
  ASSERT_EQ(summary->size(), 6u);
  for (int64_t rank = 0; rank < 6; ++rank) {
    absl::StatusOr<RankTransfer> want = ExpandTransfer(table, rank, Options());
    ASSERT_TRUE(want.ok()) << want.status();
    const RankTransfer& got = (*summary)[rank];
    EXPECT_EQ(got.bytes_sent, want->bytes_sent) << rank;
    EXPECT_EQ(got.bytes_received, want->bytes_received) << rank;
    EXPECT_EQ(got.target_bytes, want->target_bytes) << rank;
    EXPECT_EQ(got.replica_key, want->replica_key) << rank;
    EXPECT_EQ(got.owned_bytes_moved, want->owned_bytes_moved) << rank;
    EXPECT_EQ(got.owned_lower_bound_bytes, want->owned_lower_bound_bytes) << rank;
    EXPECT_EQ(got.templates_planned, want->templates_planned) << rank;
    EXPECT_THAT(got.fragment.members, IsEmpty());
  }
  EXPECT_EQ((*summary)[2].replica_key, (*summary)[4].replica_key);
  EXPECT_NE((*summary)[2].replica_key, (*summary)[3].replica_key);

  TransferTable bad = Table();
  bad.members[1].dst_layout = 9;
  EXPECT_THAT(ErrorOf(SummarizeTransfer(bad)), HasSubstr("members[1].dst_layout"));
}

TEST(TransferTableTest, ARankOutsideEveryLayoutHasNothing) {
  absl::StatusOr<RankTransfer> got = ExpandTransfer(Table(), 9, Options());
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_THAT(got->fragment.members, IsEmpty());
  EXPECT_THAT(got->fragment.shapes, IsEmpty());
  EXPECT_THAT(got->fragment.exchange_ranks, IsEmpty());
  EXPECT_EQ(got->templates_planned, 0);
  EXPECT_EQ(got->bytes_sent + got->bytes_received + got->target_bytes, 0);
}

TEST(TransferTableTest, ExpansionIsDeterministic) {
  for (int64_t rank = 0; rank < 6; ++rank) {
    absl::StatusOr<RankTransfer> a = ExpandTransfer(Table(), rank, Options());
    absl::StatusOr<RankTransfer> b = ExpandTransfer(Table(), rank, Options());
    ASSERT_TRUE(a.ok() && b.ok());
    ASSERT_EQ(a->fragment.shapes.size(), b->fragment.shapes.size());
    for (size_t i = 0; i < a->fragment.shapes.size(); ++i) {
      EXPECT_EQ(a->fragment.shapes[i].transfers, b->fragment.shapes[i].transfers);
    }
    EXPECT_EQ(a->replica_key, b->replica_key);
  }
}

TEST(TransferTableTest, BadTablesNameTheMemberAndField) {
  struct Case {
    std::function<void(TransferTable&)> edit;
    std::string error;
  };
  const Case cases[] = {
      {[](TransferTable& t) { t.members[1].dst_layout = 9; },
       "members[1].dst_layout: 9 (the table has 5 layouts)"},
      {[](TransferTable& t) { t.members[2].dst = "a.src"; },
       "members[2].dst: 'a.src' is also named by members[0]"},
      {[](TransferTable& t) { t.members[2].dst_layout = 1; },  // [6] -> [8, 4]
       "members[2].dst_layout: layout 1 is of another global shape"},
      {[](TransferTable& t) { t.members[0].src_version = 0; },
       "members[0].src_version: 0 (must be positive)"},
      {[](TransferTable& t) { t.members[3].src = "d.dst"; },
       "members[3].dst: 'd.dst' is also the member's src"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.error);
    TransferTable t = Table();
    c.edit(t);
    EXPECT_THAT(ErrorOf(ExpandTransfer(t, 0, Options())), HasSubstr(c.error));
  }
}

// A member whose dst has another dtype is its own template; its plan casts (Plan::cast_to),
// moves the narrower dtype's bytes and its new buffers hold the dst's dtype.
TEST(TransferTableTest, ACastingMemberIsItsOwnTemplateAndMovesTheNarrowerDType) {
  TransferTable table = Table();
  TransferTable narrowed = Table();
  narrowed.members[1].cast_to = DType::kBF16;  // b: f32 -> bf16, a's layouts.
  const TransferTemplates t = TemplatesOf(narrowed);
  ASSERT_EQ(t.templates.size(), 4u);
  EXPECT_THAT(t.of_member, ElementsAre(0, 1, 2, 3));
  EXPECT_EQ(t.templates[1].dtype, DType::kF32);
  EXPECT_EQ(t.templates[1].target_dtype(), DType::kBF16);

  int64_t sent = 0, narrowed_sent = 0;
  for (int64_t rank = 0; rank < 6; ++rank) {
    SCOPED_TRACE(absl::StrCat("rank ", rank));
    absl::StatusOr<RankTransfer> same = ExpandTransfer(table, rank, Options());
    absl::StatusOr<RankTransfer> got = ExpandTransfer(narrowed, rank, Options());
    ASSERT_TRUE(same.ok() && got.ok()) << got.status();
    sent += same->bytes_sent;
    narrowed_sent += got->bytes_sent;
    for (const FragmentMember& m : got->fragment.members) {
      const FragmentShape& shape = got->fragment.shapes[m.shape];
      EXPECT_EQ(shape.target_dtype(), m.index == 1 ? DType::kBF16 : narrowed.members[m.index].dtype)
          << m.index;
      EXPECT_EQ(shape.dtype, narrowed.members[m.index].dtype) << m.index;
    }
    // Rank 2 holds a 4x4 block of b: bf16 now.
    if (rank == 2) {
      EXPECT_EQ(same->target_bytes - got->target_bytes, 16 * 2);
    }
  }
  // b's sends halve: a and b moved the same bytes before.
  int64_t a_sent = 0;
  {
    TransferTable only_a = Table();
    only_a.members.resize(1);
    for (int64_t rank = 0; rank < 6; ++rank) {
      absl::StatusOr<RankTransfer> r = ExpandTransfer(only_a, rank, Options());
      ASSERT_TRUE(r.ok());
      a_sent += r->bytes_sent;
    }
  }
  ASSERT_GT(a_sent, 0);
  EXPECT_EQ(sent - narrowed_sent, a_sent / 2);

  absl::StatusOr<std::vector<RankTransfer>> summary = SummarizeTransfer(narrowed);
  ASSERT_TRUE(summary.ok()) << summary.status();
  for (int64_t rank = 0; rank < 6; ++rank) {
    absl::StatusOr<RankTransfer> want = ExpandTransfer(narrowed, rank, Options());
    ASSERT_TRUE(want.ok());
    EXPECT_EQ((*summary)[rank].bytes_sent, want->bytes_sent) << rank;
    EXPECT_EQ((*summary)[rank].target_bytes, want->target_bytes) << rank;
  }

  TransferTable refused = Table();
  refused.members[2].cast_to = DType::kI8;  // f32 -> i8: float to integer.
  EXPECT_THAT(ErrorOf(ExpandTransfer(refused, 0, Options())),
              HasSubstr("members[2].cast_to: cannot cast f32 to i8"));
}

TEST(StableHashTest, SameInputsSameValueAndOrderMatters) {
  StableHash a, b, c;
  a.Add(1);
  a.Add(2);
  b.Add(1);
  b.Add(2);
  c.Add(2);
  c.Add(1);
  EXPECT_EQ(a.value(), b.value());
  EXPECT_NE(a.value(), c.value());
  // Pinned: a digest compared across processes must never change between builds.
  StableHash d;
  d.Add(Box({1, 2}, {3, 4}));
  EXPECT_EQ(d.value(), 0xcc3b54b7e877781aull) << std::hex << d.value();
}

}  // namespace
}  // namespace shardcoord
