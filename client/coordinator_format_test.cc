#include "client/coordinator_format.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace shardcoord {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

std::vector<v1::WorkerInfo> TwoWorkers() {
  std::vector<v1::WorkerInfo> out(2);
  out[0].set_name("w0");
  out[0].set_rank(0);
  out[0].set_host("h0");
  out[0].set_device("cpu");
  out[0].set_address("127.0.0.1:7501");
  out[0].set_backend("gloo");
  out[0].set_incarnation(3);
  out[0].set_state(v1::ALIVE);
  out[0].set_last_heartbeat_unix_ms(1'000'000);
  out[1] = out[0];
  out[0].set_memory_budget_bytes(int64_t{4} << 30);
  out[0].set_memory_used_bytes(int64_t{1} << 20);
  out[0].set_memory_peak_bytes(int64_t{2} << 20);
  out[0].set_bucket_bytes(int64_t{64} << 20);
  out[1].set_name("w1");
  out[1].set_rank(1);
  out[1].set_state(v1::DEAD);
  out[1].set_last_heartbeat_unix_ms(1'000'000 - 120'000);
  return out;
}

TEST(WorkersFormatTest, TableAndJson) {
  const std::string table = WorkersTable(TwoWorkers(), 1'001'500);
  EXPECT_THAT(
      table,
      HasSubstr("rank  name  host  device  backend  address         state  incarnation  heartbeat  "
                "memory (used / budget, peak)\n"));
  EXPECT_THAT(
      table,
      HasSubstr("   0  w0    h0    cpu     gloo     127.0.0.1:7501  ALIVE            3  1.5 s ago  "
                "1.00 MiB / 4.00 GiB, peak 2.00 MiB\n"));
  EXPECT_THAT(table, HasSubstr("DEAD             3  2 min ago  -\n"));
  EXPECT_THAT(table, HasSubstr("2 workers, 1 alive"));
  EXPECT_EQ(WorkersTable({}, 0), "no workers registered\n");
  EXPECT_EQ(WorkersJson({TwoWorkers()[0]}),
            "{\"workers\": [{\"name\": \"w0\", \"rank\": 0, \"host\": \"h0\", \"device\": \"cpu\", "
            "\"address\": \"127.0.0.1:7501\", \"backend\": \"gloo\", \"state\": \"ALIVE\", "
            "\"incarnation\": 3, \"last_heartbeat_unix_ms\": 1000000, \"leaving\": false, "
            "\"memory_budget_bytes\": 4294967296, \"memory_used_bytes\": 1048576, "
            "\"memory_peak_bytes\": 2097152, \"bucket_bytes\": 67108864}]}");
  std::vector<v1::WorkerInfo> leaving = TwoWorkers();
  leaving[0].set_leaving(true);
  EXPECT_THAT(WorkersTable(leaving, 1'001'500), HasSubstr("127.0.0.1:7501  LEAVING"));
}

v1::MeshInfo Mesh2x2() {
  v1::MeshInfo m;
  m.set_name("m");
  m.add_shape(2);
  m.add_shape(2);
  m.add_dim_names("dp");
  m.add_dim_names("tp");
  for (int i = 0; i < 4; ++i) {
    m.add_ranks(i);
    m.add_workers("w" + std::to_string(i));
  }
  return m;
}

TEST(MeshFormatTest, TableTextAndJson) {
  EXPECT_EQ(MeshesTable({Mesh2x2()}),
            "name  shape         ranks         workers\n"
            "m     2x2 (dp, tp)  [0, 1, 2, 3]  w0,w1,w2,w3\n");
  EXPECT_EQ(MeshText(Mesh2x2()),
            "mesh m  2x2 (dp, tp)  4 ranks\n"
            "  w0 (0)  w1 (1)\n"
            "  w2 (2)  w3 (3)\n");
  EXPECT_EQ(MeshJson(Mesh2x2()),
            "{\"name\": \"m\", \"shape\": [2, 2], \"dim_names\": [\"dp\", \"tp\"], \"ranks\": "
            "[0, 1, 2, 3], \"workers\": [\"w0\", \"w1\", \"w2\", \"w3\"]}");
  EXPECT_EQ(MeshesJson({}), "{\"meshes\": []}");
  EXPECT_EQ(MeshesTable({}), "no meshes\n");
}

// A 4x2 f32 tensor, S(0) over ranks 0 and 1, with a checksum on rank 0 only.
v1::TensorInfo Tensor() {
  v1::TensorInfo t;
  t.set_name("t");
  t.add_shape(4);
  t.add_shape(2);
  t.set_dtype(v1::F32);
  t.set_mesh("m1");
  t.set_spec("S(0)");
  t.set_version(2);
  t.set_bytes(32);
  v1::Layout* layout = t.mutable_layout();
  layout->add_global_shape(4);
  layout->add_global_shape(2);
  for (int r = 0; r < 2; ++r) {
    v1::RankChunks* rc = layout->add_ranks();
    rc->set_rank(r);
    rc->add_coord(r);
    rc->set_local_elements(4);
    v1::Chunk* c = rc->add_chunks();
    c->mutable_box()->add_offset(2 * r);
    c->mutable_box()->add_offset(0);
    c->mutable_box()->add_shape(2);
    c->mutable_box()->add_shape(2);
    if (r == 0) c->set_checksum(0xabcdef0123456789ull);
  }
  return t;
}

TEST(TensorFormatTest, ShowHasChunksChecksumsAndPicture) {
  const std::string text = TensorText(Tensor());
  EXPECT_THAT(text, HasSubstr("tensor t  [4, 2] f32  S(0) on mesh m1  32 B  version 2\n"));
  EXPECT_THAT(text, HasSubstr("rank  coord  offset  shape   bytes  checksum\n"));
  EXPECT_THAT(text, HasSubstr("   0  [0]    [0, 0]  [2, 2]     16  abcdef0123456789\n"));
  EXPECT_THAT(text, HasSubstr("   1  [1]    [2, 0]  [2, 2]     16  -\n"));
  EXPECT_THAT(text, HasSubstr("picture: rows are dim 0"));
  EXPECT_THAT(text, Not(HasSubstr("LOST")));

  v1::TensorInfo lost = Tensor();
  lost.add_lost_chunks("rank 1 [2:4, 0:2]");
  lost.set_busy_plan("p9");
  lost.mutable_layout()->mutable_ranks(1)->clear_chunks();  // No longer covers the tensor.
  const std::string lost_text = TensorText(lost);
  EXPECT_THAT(lost_text, HasSubstr("plan p9 is running on it\n"));
  EXPECT_THAT(lost_text, HasSubstr("LOST (no live replica): rank 1 [2:4, 0:2]\n"));
  EXPECT_THAT(lost_text, HasSubstr("   1  [1]    -       -           0  -\n"));
  EXPECT_THAT(lost_text, HasSubstr("no picture: "));

  v1::TensorInfo attached = Tensor();
  attached.set_attached(true);
  attached.add_unattached_ranks(1);
  EXPECT_THAT(TensorText(attached),
              HasSubstr("attached: its ranks' buffers live in user processes; no buffer attached "
                        "on rank 1\n"));
  EXPECT_THAT(TensorJson(attached), HasSubstr("\"attached\": true, \"unattached_ranks\": [1]"));
}

TEST(TensorFormatTest, Json) {
  EXPECT_EQ(TensorJson(Tensor()),
            "{\"name\": \"t\", \"shape\": [4, 2], \"dtype\": \"f32\", \"mesh\": \"m1\", \"spec\": "
            "\"S(0)\", \"version\": 2, \"bytes\": 32, \"busy_plan\": \"\", \"lost_chunks\": [], "
            "\"attached\": false, \"unattached_ranks\": [], \"chunks\": [{\"rank\": 0, \"coord\": "
            "[0], \"offset\": [0, 0], \"shape\": [2, 2], "
            "\"local_offset\": 0, \"partial_index\": 0, \"checksum\": \"abcdef0123456789\"}, "
            "{\"rank\": 1, \"coord\": [1], \"offset\": [2, 0], \"shape\": [2, 2], "
            "\"local_offset\": 0, \"partial_index\": 0, \"checksum\": \"0000000000000000\"}]}");
  EXPECT_EQ(TensorsJson({}), "{\"tensors\": []}");
  EXPECT_THAT(TensorsTable({Tensor()}),
              HasSubstr("t     [4, 2]  f32    m1    S(0)   32 B        2  -\n"));
}

TEST(PlanOutcomeFormatTest, TextAndJson) {
  v1::RedistributeResponse r;
  r.mutable_progress()->set_plan_id("p1");
  r.mutable_progress()->set_tensor("t");
  r.mutable_progress()->set_state(v1::COMMITTED);
  r.mutable_progress()->set_seconds(0.25);
  r.mutable_progress()->set_bytes_done(64);
  r.mutable_progress()->set_bytes_total(64);
  r.mutable_plan()->set_bytes_moved(64);
  r.mutable_plan()->set_lower_bound_bytes(64);
  for (int i = 0; i < 2; ++i) {
    v1::Step* s = r.mutable_plan()->add_steps();
    s->set_op(v1::ALL_TO_ALL);
    s->add_ranks(2 * i);
    s->add_ranks(2 * i + 1);
    s->set_bytes(32);
  }
  EXPECT_EQ(PlanOutcomeText("redistributed", r),
            "redistributed 't': plan p1 COMMITTED in 0.250 s\n"
            "  64 B moved (lower bound 64 B), 2 steps: all_to_all x2\n");
  EXPECT_EQ(PlanOutcomeJson(r),
            "{\"plan_id\": \"p1\", \"tensor\": \"t\", \"state\": \"COMMITTED\", \"seconds\": 0.25, "
            "\"bytes_done\": 64, \"bytes_total\": 64, \"bytes_moved\": 64, \"lower_bound_bytes\": "
            "64, \"steps\": [{\"op\": \"all_to_all\", \"ranks\": [0, 1], \"bytes\": 32}, {\"op\": "
            "\"all_to_all\", \"ranks\": [2, 3], \"bytes\": 32}], \"bucket_bytes\": 0, "
            "\"error\": \"\"}");
  r.mutable_progress()->set_bucket_bytes(int64_t{1} << 20);
  EXPECT_THAT(PlanOutcomeText("redistributed", r), HasSubstr("  buckets of at most 1.00 MiB\n"));
  r.mutable_progress()->set_waiting_for_memory("worker w1 (rank 1) needs 5 bytes");
  EXPECT_THAT(PlanOutcomeText("redistributed", r),
              HasSubstr("  waiting for memory: worker w1 (rank 1) needs 5 bytes\n"));
  r.mutable_progress()->set_state(v1::ABORTED);
  r.mutable_progress()->set_error("rank 3 died");
  EXPECT_THAT(PlanOutcomeText("redistributed", r), HasSubstr("ABORTED"));
  EXPECT_THAT(PlanOutcomeText("redistributed", r), HasSubstr("  error: rank 3 died\n"));
}

TEST(CopyGroupFormatTest, BlockMembersSayWhatTheyStaged) {
  v1::CopyGroupResponse r;
  r.set_group_id("g-2");
  r.set_stage_group("g-1");
  r.set_state(v1::COMMITTED);
  r.set_bytes_moved(3000);
  r.set_staged_bytes(1024);
  v1::CopyGroupMember* plain = r.add_members();
  plain->set_src("n");
  plain->set_dst("n_h");
  plain->set_dst_version(7);
  v1::CopyGroupMember* block = r.add_members();
  block->set_src("w");
  block->set_dst("wq");
  block->set_dst_version(8);
  block->mutable_block_copy()->set_scale_version(9);
  block->mutable_block_copy()->set_blocks(6);
  block->mutable_block_copy()->set_cut_blocks(2);
  block->mutable_block_copy()->set_staged_bytes(1024);
  block->mutable_block_copy()->set_bytes_moved(2048);
  const std::string text = CopyGroupOutcomeText(r);
  EXPECT_THAT(text, HasSubstr("  n -> n_h: version 7 (plan )\n"));
  EXPECT_THAT(text, HasSubstr("  w -> wq: version 8, scales version 9; 6 blocks, 2 cut across "
                              "source ranks, 1.0 KiB staged, 2.0 KiB moved in all"));
  EXPECT_THAT(text, HasSubstr("blocks made whole by group g-1: 1.0 KiB staged"));
  const std::string json = CopyGroupOutcomeJson(r);
  EXPECT_THAT(json, HasSubstr("\"block_copy\": {\"scale_version\": 9, \"blocks\": 6, "
                              "\"cut_blocks\": 2, \"staged_bytes\": 1024, \"bytes_moved\": "
                              "2048}"));
}

}  // namespace
}  // namespace shardcoord
