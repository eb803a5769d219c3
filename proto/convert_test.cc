#include "proto/convert.h"

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "sharding/plan_fragment.h"
#include "sharding/plan_participants.h"
#include "sharding/testing/test_util.h"

namespace shardcoord {
namespace {

using sharding_testing::ErrorOf;
using sharding_testing::Mesh;
using sharding_testing::TwoStepPlan;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

// `spec` to proto and back in through the structured form only (the text forms cleared).
absl::StatusOr<Spec> ViaStructuredForm(const Spec& spec) {
  v1::ShardingSpec p = SpecToProto(spec);
  p.clear_placements_text();
  p.clear_flat_text();
  return SpecFromProto(p);
}

TEST(ConvertTest, DTypeRoundTripsAndRejectsUnspecified) {
  for (DType d : AllDTypes()) {
    absl::StatusOr<DType> back = DTypeFromProto(DTypeToProto(d));
    ASSERT_TRUE(back.ok());
    EXPECT_EQ(*back, d);
  }
  EXPECT_EQ(DTypeToProto(DType::kBF16), v1::BF16);
  EXPECT_EQ(DTypeToProto(DType::kF8E4M3), v1::F8_E4M3);
  EXPECT_EQ(DTypeToProto(DType::kF8E8M0), v1::F8_E8M0);
  EXPECT_EQ(DTypeToProto(DType::kBool), v1::BOOL);
  EXPECT_EQ(ErrorOf(DTypeFromProto(v1::DTYPE_UNSPECIFIED)), "dtype: unspecified");
  EXPECT_EQ(ErrorOf(DTypeFromProto(static_cast<v1::DType>(42), "header.dtype")),
            "header.dtype: unknown value 42");
}

TEST(ConvertTest, ReduceOpUnspecifiedIsSum) {
  EXPECT_EQ(*ReduceOpFromProto(v1::REDUCE_OP_UNSPECIFIED, "op"), ReduceOp::kSum);
  for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kAvg, ReduceOp::kMin, ReduceOp::kMax}) {
    EXPECT_EQ(*ReduceOpFromProto(ReduceOpToProto(op), "op"), op);
  }
  EXPECT_THAT(ErrorOf(ReduceOpFromProto(static_cast<v1::ReduceOp>(9), "p.op")),
              HasSubstr("p.op: unknown reduce op 9"));
}

TEST(ConvertTest, ShapesAndSpecsAreBounded) {
  Int64List dims;
  for (int i = 0; i <= kMaxDims; ++i) dims.Add(1);
  absl::Status s = ShapeFromProto(dims).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(s.message(), "shape: 17 dims, more than the limit of 16");
  v1::ShardingSpec spec;
  std::string text;
  for (int i = 0; i <= kMaxFlatRangesPerRank; ++i) {
    absl::StrAppend(&text, i == 0 ? "" : ",", 2 * i, ":", 2 * i + 1);
  }
  spec.set_flat_text(absl::StrCat("0:0;", text));
  s = SpecFromProto(spec).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(s.message(), "spec.flat[1]: 4097 ranges, more than the limit of 4096 per rank");
}

TEST(ConvertTest, ShapeNamesTheNegativeDim) {
  v1::CreateTensorRequest req;
  req.add_shape(4);
  req.add_shape(-1);
  EXPECT_EQ(ErrorOf(ShapeFromProto(req.shape())), "shape[1] = -1 must be >= 0");
  req.set_shape(1, int64_t{1} << 40);
  req.add_shape(int64_t{1} << 40);
  EXPECT_THAT(ErrorOf(ShapeFromProto(req.shape())), HasSubstr("shape: "));
  req.clear_shape();
  req.add_shape(3);
  req.add_shape(0);
  EXPECT_THAT(*ShapeFromProto(req.shape()), ElementsAre(3, 0));
}

TEST(ConvertTest, BoxRoundTripAndErrors) {
  Box box({1, 2}, {3, 4});
  absl::StatusOr<Box> back = BoxFromProto(BoxToProto(box), "box");
  ASSERT_TRUE(back.ok());
  EXPECT_EQ(*back, box);

  v1::Box bad;
  bad.add_offset(0);
  EXPECT_EQ(ErrorOf(BoxFromProto(bad, "chunks[0].box")),
            "chunks[0].box: offset has 1 dims but shape has 0");
  bad.add_shape(-5);
  EXPECT_EQ(ErrorOf(BoxFromProto(bad, "b")), "b.shape[0] = -5 must be >= 0");
}

TEST(ConvertTest, PlacementRoundTrip) {
  for (const Placement& p : {Placement::Shard(1), Placement::Shard(0, {3, 5}),
                             Placement::Replicate(), Placement::Partial(ReduceOp::kMax)}) {
    absl::StatusOr<Placement> back = PlacementFromProto(PlacementToProto(p), "p");
    ASSERT_TRUE(back.ok()) << back.status();
    EXPECT_EQ(*back, p) << p.ToString();
  }
  EXPECT_EQ(ErrorOf(PlacementFromProto(v1::Placement(), "spec.placements[0]")),
            "spec.placements[0]: no kind set (want shard, replicate or partial)");
  v1::Placement neg;
  neg.mutable_shard()->add_sizes(2);
  neg.mutable_shard()->add_sizes(-1);
  EXPECT_EQ(ErrorOf(PlacementFromProto(neg, "p")), "p.shard.sizes[1] = -1 must be >= 0");
}

TEST(ConvertTest, SpecFromTextAndStructured) {
  v1::ShardingSpec text;
  text.set_mesh("m");
  text.set_placements_text("S(0),R");
  absl::StatusOr<Spec> spec = SpecFromProto(text);
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->mesh, "m");
  EXPECT_FALSE(spec->is_flat);
  EXPECT_THAT(spec->placements, ElementsAre(Placement::Shard(0), Placement::Replicate()));
  EXPECT_EQ(spec->ToString(), "S(0),R");

  // Back to proto and in again: the structured form gives the same spec.
  absl::StatusOr<Spec> again = ViaStructuredForm(*spec);
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(again->placements, spec->placements);

  v1::ShardingSpec flat;
  flat.set_flat_text("0:4;4:8");
  absl::StatusOr<Spec> f = SpecFromProto(flat);
  ASSERT_TRUE(f.ok()) << f.status();
  ASSERT_TRUE(f->is_flat);
  ASSERT_EQ(f->flat.size(), 2u);
  EXPECT_EQ(f->flat[1][0], (FlatRange{4, 8}));
  EXPECT_EQ(f->ToString(), "flat 0:4;4:8");
  absl::StatusOr<Spec> f2 = ViaStructuredForm(*f);
  ASSERT_TRUE(f2.ok());
  EXPECT_EQ(f2->flat, f->flat);
}

TEST(ConvertTest, SpecErrorsNameTheField) {
  EXPECT_EQ(ErrorOf(SpecFromProto(v1::ShardingSpec())), "spec: no placements or flat ranges given");
  v1::ShardingSpec both;
  both.set_placements_text("R");
  both.set_flat_text("0:4");
  EXPECT_THAT(ErrorOf(SpecFromProto(both, "target")),
              HasSubstr("target: give exactly one of placements, flat, placements_text, "
                        "flat_text (got placements_text and flat_text)"));
  v1::ShardingSpec garbage;
  garbage.set_placements_text("S(0),Q");
  EXPECT_THAT(ErrorOf(SpecFromProto(garbage)), HasSubstr("spec.placements_text: "));
  v1::ShardingSpec bad_range;
  v1::FlatRange* r = bad_range.add_flat()->add_ranges();
  r->set_start(5);
  r->set_end(3);
  EXPECT_EQ(ErrorOf(SpecFromProto(bad_range)),
            "spec.flat[0].ranges[0]: 5:3 must have 0 <= start <= end");
}

TEST(ConvertTest, LayoutRoundTripCarriesChecksums) {
  const DeviceMesh mesh = Mesh({2, 2}, {7, 5, 3, 1});
  absl::StatusOr<Layout> layout = Layout::FromPlacements(
      mesh, {6, 4}, {Placement::Shard(0), Placement::Partial(ReduceOp::kAvg)});
  ASSERT_TRUE(layout.ok()) << layout.status();
  LayoutChecksums sums = {{11}, {22}, {33}, {44}};
  v1::Layout proto = LayoutToProto(*layout, &sums);
  EXPECT_EQ(proto.ranks(2).rank(), 3);
  EXPECT_EQ(proto.ranks(2).chunks(0).checksum(), 33u);
  EXPECT_EQ(proto.num_partials(), 2);
  EXPECT_EQ(proto.partial_op(), v1::AVG);

  LayoutChecksums back_sums;
  absl::StatusOr<Layout> back = LayoutFromProto(proto, "layout", &back_sums);
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(*back, *layout);
  EXPECT_EQ(back_sums, sums);
  EXPECT_EQ(back->partial_op(), ReduceOp::kAvg);

  // Without checksums every chunk says 0 (unknown).
  EXPECT_EQ(LayoutToProto(*layout).ranks(0).chunks(0).checksum(), 0u);
}

TEST(ConvertTest, LayoutFromProtoValidates) {
  v1::Layout proto;
  proto.add_global_shape(4);
  for (int r = 0; r < 2; ++r) {
    v1::RankChunks* rc = proto.add_ranks();
    rc->set_rank(r);
    rc->set_local_elements(3);
    *rc->add_chunks() = ChunkToProto(Chunk{Box({r == 0 ? 0 : 1}, {3}), 0, 0});
  }
  // [0:3] and [1:4] overlap without being replicas.
  EXPECT_THAT(ErrorOf(LayoutFromProto(proto, "layout")), HasSubstr("layout: "));
  proto.mutable_ranks(1)->mutable_chunks(0)->set_local_offset(-1);
  EXPECT_EQ(ErrorOf(LayoutFromProto(proto, "layout")),
            "layout.ranks[1].chunks[0].local_offset = -1 must be >= 0");
}

TEST(ConvertTest, PlanToProto) {
  const Plan plan = TwoStepPlan();
  v1::Plan proto = PlanToProto(plan, "p-1", "T");
  EXPECT_EQ(proto.id(), "p-1");
  EXPECT_EQ(proto.tensor(), "T");
  EXPECT_EQ(proto.dtype(), v1::F32);
  ASSERT_EQ(proto.steps_size(), 2);
  EXPECT_EQ(proto.steps(1).index(), 1);
  EXPECT_EQ(proto.steps(1).op(), v1::POINT_TO_POINT);
  EXPECT_EQ(proto.steps(0).transfers(1).src(), 1);
  EXPECT_EQ(proto.local_copies_size(), 4);
  EXPECT_EQ(proto.bytes_moved(), 32);
  EXPECT_EQ(proto.traffic(0).bytes_received(), 8);
  EXPECT_EQ(*LayoutFromProto(proto.target(), "target"), plan.target);
  EXPECT_THAT(PlanParticipants(plan), ElementsAre(0, 1, 2, 3));
}

FragmentOptions PlanOptions(const std::string& plan_id) {
  FragmentOptions options;
  options.plan_id = plan_id;
  options.incarnations = {{0, 10}, {1, 11}, {2, 12}, {3, 13}};
  options.step_timeout_ms = 500;
  options.communicator_prefix = absl::StrCat("plan/", plan_id);
  return options;
}

FragmentMemberOptions MemberOptions(const std::string& plan_id, const std::string& tensor) {
  FragmentMemberOptions member;
  member.plan_id = plan_id;
  member.tensor = tensor;
  member.source_version = 3;
  member.target_version = 4;
  return member;
}

// What `rank` does in `plan` alone, on the wire.
v1::PlanFragment PlanFragmentOf(const Plan& plan, int64_t rank, const FragmentOptions& options,
                                const FragmentMemberOptions& member) {
  const Plan* plans[] = {&plan};
  return FragmentToProto(MakeFragments(plans, {member}, options).at(rank));
}

TEST(ConvertTest, APlansFragmentHasTheLegacyFieldsAndOnlyTheRanksSteps) {
  const Plan plan = TwoStepPlan();
  v1::PlanFragment f2 = PlanFragmentOf(plan, 2, PlanOptions("p-1"), MemberOptions("p-1", "T"));
  EXPECT_EQ(f2.plan_id(), "p-1");
  EXPECT_EQ(f2.tensor(), "T");
  EXPECT_EQ(f2.source_version(), 3);
  EXPECT_EQ(f2.target_version(), 4);
  ASSERT_EQ(f2.steps_size(), 1);
  EXPECT_EQ(f2.steps(0).index(), 1);
  EXPECT_EQ(f2.local_copies_size(), 1);
  EXPECT_EQ(f2.local_copies(0).rank(), 2);
  EXPECT_THAT(f2.member_ranks(), ElementsAre(2, 3));
  EXPECT_THAT(f2.member_incarnations(), ElementsAre(12, 13));
  EXPECT_EQ(f2.source().chunks(0).box().offset(0), 4);
  EXPECT_EQ(f2.target().chunks(0).box().offset(0), 4);
  EXPECT_EQ(f2.step_timeout_ms(), 500);
  EXPECT_EQ(f2.members_size(), 0);
  EXPECT_EQ(f2.shapes_size(), 0);
  EXPECT_EQ(f2.exchange_ranks_size(), 0);
  EXPECT_TRUE(f2.target_tensor().empty());

  absl::StatusOr<Fragment> parsed = FragmentFromProto(f2);
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_EQ(parsed->plan_id, "p-1");
  EXPECT_EQ(parsed->rank, 2);
  EXPECT_FALSE(parsed->fused);
  ASSERT_EQ(parsed->shapes.size(), 1u);
  ASSERT_EQ(parsed->members.size(), 1u);
  const FragmentShape& shape = parsed->shapes[0];
  const FragmentMember& member = parsed->members[0];
  EXPECT_EQ(member.plan_id, "p-1");
  EXPECT_EQ(member.source_version, 3);
  EXPECT_EQ(member.target_version, 4);
  ASSERT_EQ(shape.steps.size(), 1u);
  EXPECT_EQ(shape.step_indices[0], 1);
  EXPECT_EQ(shape.steps[0].transfers, plan.steps[1].transfers);
  EXPECT_EQ(shape.local_copies[0], plan.local_copies[2]);
  EXPECT_EQ(parsed->member_incarnations.at(3), 13);
  EXPECT_EQ(shape.target.chunks, plan.target.Find(2)->chunks);
  EXPECT_EQ(parsed->communicator_prefix, "plan/p-1");
  EXPECT_EQ(member.target_tensor, "T");  // Not a Copy: the target is the tensor itself.
  // And back: the same wire message.
  EXPECT_EQ(FragmentToProto(*parsed).SerializeAsString(), f2.SerializeAsString());
}

TEST(ConvertTest, CopyFragmentNamesItsTargetTensor) {
  FragmentMemberOptions member = MemberOptions("p-2", "src");
  member.target_tensor = "dst";
  member.target_version = 9;
  v1::PlanFragment f = PlanFragmentOf(TwoStepPlan(), 2, PlanOptions("p-2"), member);
  EXPECT_EQ(f.tensor(), "src");
  EXPECT_EQ(f.target_tensor(), "dst");
  absl::StatusOr<Fragment> parsed = FragmentFromProto(f);
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_EQ(parsed->members[0].tensor, "src");
  EXPECT_EQ(parsed->members[0].target_tensor, "dst");
  EXPECT_EQ(parsed->members[0].source_version, 3);
  EXPECT_EQ(parsed->members[0].target_version, 9);
}

TEST(ConvertTest, AFragmentThatCastsCarriesItsTargetDType) {
  Plan plan = TwoStepPlan();
  plan.dtype = DType::kF64;  // Transfers of 16 bytes carry four f32 elements on the wire.
  plan.cast_to = DType::kF32;
  v1::PlanFragment f = PlanFragmentOf(plan, 2, PlanOptions("p-3"), MemberOptions("p-3", "T"));
  EXPECT_EQ(f.dtype(), v1::F64);
  EXPECT_EQ(f.target_dtype(), v1::F32);
  absl::StatusOr<Fragment> parsed = FragmentFromProto(f);
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_EQ(parsed->shapes[0].dtype, DType::kF64);
  EXPECT_EQ(parsed->shapes[0].cast_to, DType::kF32);
  EXPECT_EQ(parsed->shapes[0].wire_dtype(), DType::kF32);
  EXPECT_EQ(FragmentToProto(*parsed).SerializeAsString(), f.SerializeAsString());

  // A plain fragment has no target dtype; naming the source's own is no cast.
  v1::PlanFragment plain =
      PlanFragmentOf(TwoStepPlan(), 2, PlanOptions("p-4"), MemberOptions("p-4", "T"));
  EXPECT_EQ(plain.target_dtype(), v1::DTYPE_UNSPECIFIED);
  plain.set_target_dtype(v1::F32);
  absl::StatusOr<Fragment> same = FragmentFromProto(plain);
  ASSERT_TRUE(same.ok()) << same.status();
  EXPECT_FALSE(same->shapes[0].cast_to.has_value());

  f.set_target_dtype(v1::I32);
  EXPECT_THAT(ErrorOf(FragmentFromProto(f)), HasSubstr("target_dtype: cannot cast f64 to i32"));

  const v1::Plan summary = PlanSummaryToProto(plan, "p-3", "T");
  EXPECT_EQ(summary.target_dtype(), v1::F32);
  EXPECT_EQ(summary.wire_dtype(), v1::F32);
  EXPECT_EQ(summary.cast_side(), v1::CAST_BY_SENDER);
}

TEST(ConvertTest, AFusedFragmentHasMembersAndShapesOnly) {
  const Plan a = TwoStepPlan();
  const Plan b = TwoStepPlan();
  const Plan* plans[] = {&a, &b, &a};
  FragmentOptions options = PlanOptions("g-1");
  options.fused = true;
  options.bucket_bytes = 4096;
  std::vector<FragmentMemberOptions> members = {
      MemberOptions("p-x", "x"), MemberOptions("p-y", "y"), MemberOptions("p-z", "z")};
  members[1].index = 1;
  members[2].index = 2;
  members[2].target_tensor = "w";
  v1::PlanFragment f = FragmentToProto(MakeFragments(plans, members, options).at(3));
  EXPECT_EQ(f.plan_id(), "g-1");
  EXPECT_EQ(f.rank(), 3);
  EXPECT_TRUE(f.tensor().empty());
  EXPECT_FALSE(f.has_source());
  EXPECT_FALSE(f.has_target());
  EXPECT_EQ(f.steps_size(), 0);
  EXPECT_EQ(f.dtype(), v1::DTYPE_UNSPECIFIED);
  EXPECT_EQ(f.bucket_bytes(), 4096);
  EXPECT_THAT(f.exchange_ranks(), ElementsAre(0, 1, 2, 3));
  EXPECT_THAT(f.member_ranks(), ElementsAre(0, 1, 2, 3));
  EXPECT_THAT(f.member_incarnations(), ElementsAre(10, 11, 12, 13));
  ASSERT_EQ(f.shapes_size(), 2);
  EXPECT_EQ(f.shapes(0).transfers_size(), 2);
  EXPECT_EQ(f.shapes(0).source().rank(), 3);
  ASSERT_EQ(f.members_size(), 3);
  EXPECT_EQ(f.members(2).shape(), 0);
  EXPECT_EQ(f.members(1).shape(), 1);
  EXPECT_EQ(f.members(2).target_tensor(), "w");
  EXPECT_TRUE(f.members(1).target_tensor().empty());

  absl::StatusOr<Fragment> parsed = FragmentFromProto(f);
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_TRUE(parsed->fused);
  EXPECT_EQ(parsed->members[1].plan_id, "p-y");
  EXPECT_EQ(parsed->members[1].target_tensor, "y");
  EXPECT_EQ(parsed->shapes[0].transfers, std::vector<Transfer>(a.steps[1].transfers));
  EXPECT_EQ(FragmentToProto(*parsed).SerializeAsString(), f.SerializeAsString());

  f.mutable_members(1)->set_shape(5);
  EXPECT_EQ(ErrorOf(FragmentFromProto(f)), "members[1].shape: 5 is not one of the 2 shapes");
}

TEST(ConvertTest, FragmentFromProtoRejectsInconsistentFragments) {
  const Plan plan = TwoStepPlan();
  const FragmentOptions options = PlanOptions("p");
  const FragmentMemberOptions member = MemberOptions("p", "T");
  v1::PlanFragment f = PlanFragmentOf(plan, 0, options, member);
  f.set_rank(2);  // Step 0 is among {0, 1}.
  f.clear_local_copies();
  f.mutable_source()->clear_chunks();
  f.mutable_target()->clear_chunks();
  EXPECT_EQ(ErrorOf(FragmentFromProto(f)), "steps[0]: rank 2 is not in the step's group");

  f = PlanFragmentOf(plan, 0, options, member);
  f.mutable_steps(0)->mutable_transfers(0)->set_dst(3);
  EXPECT_EQ(ErrorOf(FragmentFromProto(f)),
            "steps[0].transfers[0]: 0 -> 3 leaves the step's group [0,1]");

  f = PlanFragmentOf(plan, 0, options, member);
  f.add_member_incarnations(5);
  EXPECT_THAT(ErrorOf(FragmentFromProto(f)), HasSubstr("member_incarnations: "));

  f = PlanFragmentOf(plan, 0, options, member);
  f.set_dtype(v1::DTYPE_UNSPECIFIED);
  EXPECT_EQ(ErrorOf(FragmentFromProto(f)), "dtype: unspecified");
}

TEST(ConvertTest, TransferPagesRoundTrip) {
  const DeviceMesh mesh = Mesh({4});
  absl::StatusOr<FlatSpec> flat = ParseFlatSpec("0:6;;;");
  ASSERT_TRUE(flat.ok());
  absl::StatusOr<Layout> sparse = Layout::FromFlat(mesh, {6}, *flat);
  ASSERT_TRUE(sparse.ok());
  absl::StatusOr<Layout> dense = Layout::FromPlacements(mesh, {6}, {Placement::Replicate()});
  ASSERT_TRUE(dense.ok());
  TransferTable table;
  table.layouts = {*sparse, *dense};
  table.hosts_by_rank = {"a", "a", "b", "b"};
  for (int i = 0; i < 3; ++i) {
    TransferMemberSpec& m = table.members.emplace_back();
    m.src = absl::StrCat("s", i);
    m.dst = absl::StrCat("d", i);
    m.src_version = 2 + i;
    m.dst_version = 9;
    m.dst_attached = i == 1;
    m.src_layout = 0;
    m.dst_layout = 1;
    m.dtype = i == 2 ? DType::kBF16 : DType::kF32;
    if (i == 1) m.cast_to = DType::kF8E4M3;
  }
  v1::PrepareTransferRequest page0, page1;
  page0.set_page(0);
  for (const std::string& h : table.hosts_by_rank) page0.add_hosts_by_rank(h);
  *page0.add_layouts() = TransferLayoutToProto(table.layouts[0], false);
  *page0.add_members() = TransferMemberToProto(table.members[0]);
  page1.set_page(1);
  *page1.add_layouts() = TransferLayoutToProto(table.layouts[1], false);
  *page1.add_members() = TransferMemberToProto(table.members[1]);
  *page1.add_members() = TransferMemberToProto(table.members[2]);
  // Ranks holding nothing are left out, unless kept.
  EXPECT_EQ(page0.layouts(0).ranks_size(), 1);
  EXPECT_EQ(TransferLayoutToProto(table.layouts[0], true).ranks_size(), 4);

  TransferTable got;
  ASSERT_TRUE(AppendTransferPage(page0, &got).ok());
  ASSERT_TRUE(AppendTransferPage(page1, &got).ok());
  EXPECT_EQ(got.hosts_by_rank, table.hosts_by_rank);
  ASSERT_EQ(got.layouts.size(), 2u);
  EXPECT_EQ(got.layouts[0].Find(0)->chunks, sparse->Find(0)->chunks);
  EXPECT_EQ(got.layouts[0].Find(1), nullptr);
  EXPECT_EQ(got.layouts[1].ranks().size(), 4u);
  ASSERT_EQ(got.members.size(), 3u);
  for (size_t i = 0; i < 3; ++i) {
    EXPECT_EQ(got.members[i].src, table.members[i].src);
    EXPECT_EQ(got.members[i].dst, table.members[i].dst);
    EXPECT_EQ(got.members[i].src_version, table.members[i].src_version);
    EXPECT_EQ(got.members[i].dst_version, 9);
    EXPECT_EQ(got.members[i].dst_attached, i == 1);
    EXPECT_EQ(got.members[i].dtype, table.members[i].dtype);
    EXPECT_EQ(got.members[i].cast_to, table.members[i].cast_to);
  }
  EXPECT_TRUE(ValidateTransferTable(got).ok());
  // A target_dtype equal to dtype is no cast.
  v1::TransferMember same = TransferMemberToProto(table.members[0]);
  same.set_target_dtype(same.dtype());
  v1::PrepareTransferRequest page2;
  page2.set_page(2);
  *page2.add_members() = same;
  ASSERT_TRUE(AppendTransferPage(page2, &got).ok());
  EXPECT_EQ(got.members.back().cast_to, std::nullopt);

  v1::PrepareTransferRequest bad = page1;
  bad.mutable_members(1)->set_dtype(v1::DTYPE_UNSPECIFIED);
  TransferTable partial;
  ASSERT_TRUE(AppendTransferPage(page0, &partial).ok());
  EXPECT_EQ(ErrorOf(absl::StatusOr<int>(AppendTransferPage(bad, &partial))),
            "members[2].dtype: unspecified");
}

}  // namespace
}  // namespace shardcoord
