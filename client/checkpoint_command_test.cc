#include "client/checkpoint_command.h"

#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace shardcoord {
namespace {

using ::testing::HasSubstr;

TEST(CheckpointCommandTest, PathsAreMadeAbsolute) {
  EXPECT_EQ(AbsoluteCheckpointPath("/a/b/../c/"), "/a/c");
  const std::string rel = AbsoluteCheckpointPath("ckpt/x");
  EXPECT_EQ(rel.front(), '/');
  EXPECT_THAT(rel, testing::EndsWith("/ckpt/x"));
}

TEST(CheckpointCommandTest, SaveNamesTensorsOrAll) {
  CheckpointSaveFlags flags;
  flags.dir = "/c";
  EXPECT_FALSE(BuildSaveCheckpointRequest(flags).ok());  // Neither.
  flags.all = true;
  absl::StatusOr<v1::SaveCheckpointRequest> r = BuildSaveCheckpointRequest(flags);
  ASSERT_TRUE(r.ok());
  EXPECT_TRUE(r->all());
  EXPECT_FALSE(r->request_id().empty());  // Known before the call, to follow its progress.
  flags.tensors = {"a"};
  EXPECT_FALSE(BuildSaveCheckpointRequest(flags).ok());  // Both.
}

TEST(CheckpointCommandTest, LoadTargets) {
  CheckpointLoadFlags flags;
  flags.dir = "/c";
  EXPECT_THAT(BuildLoadCheckpointRequest(flags).status().message(), HasSubstr("--mesh"));
  flags.mesh = "m";
  flags.placements = "S(0)";
  flags.prefix = "p_";
  absl::StatusOr<v1::LoadCheckpointRequest> all = BuildLoadCheckpointRequest(flags);
  ASSERT_TRUE(all.ok()) << all.status();
  EXPECT_TRUE(all->all());
  EXPECT_EQ(all->spec().mesh(), "m");
  EXPECT_EQ(all->prefix(), "p_");
  flags.tensors = {"a", "b"};
  absl::StatusOr<v1::LoadCheckpointRequest> two = BuildLoadCheckpointRequest(flags);
  ASSERT_TRUE(two.ok());
  ASSERT_EQ(two->targets_size(), 2);
  EXPECT_EQ(two->targets(1).tensor(), "b");
  EXPECT_EQ(two->targets(1).target().placements_text(), "S(0)");
  flags.placements = "S(";  // A typo is a flag error, before any call.
  EXPECT_FALSE(BuildLoadCheckpointRequest(flags).ok());
  flags.placements.reset();
  flags.into = true;
  flags.mesh.clear();
  absl::StatusOr<v1::LoadCheckpointRequest> into = BuildLoadCheckpointRequest(flags);
  ASSERT_TRUE(into.ok()) << into.status();
  EXPECT_TRUE(into->into());
  EXPECT_FALSE(into->targets(0).has_target());
  flags.mesh = "m";
  EXPECT_THAT(BuildLoadCheckpointRequest(flags).status().message(), HasSubstr("--into"));
}

TEST(CheckpointCommandTest, LoadDequantizeAndBlock) {
  CheckpointLoadFlags flags;
  flags.dir = "/c";
  flags.mesh = "m";
  flags.placements = "S(0)";
  flags.block = "64x32";
  EXPECT_THAT(BuildLoadCheckpointRequest(flags).status().message(), HasSubstr("--dequantize"));
  flags.dequantize = true;
  absl::StatusOr<v1::LoadCheckpointRequest> r = BuildLoadCheckpointRequest(flags);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_TRUE(r->dequantize());
  EXPECT_EQ(r->block(), "block:64x32");
  flags.block = "block:128x128";
  r = BuildLoadCheckpointRequest(flags);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->block(), "block:128x128");
  flags.block = "0x5";
  EXPECT_THAT(BuildLoadCheckpointRequest(flags).status().message(), HasSubstr("--block"));
  flags.block.clear();
  r = BuildLoadCheckpointRequest(flags);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_TRUE(r->block().empty());  // The coordinator's default, 128x128.
}

TEST(CheckpointCommandTest, LoadFromFile) {
  CheckpointLoadFlags flags;
  flags.dir = "/c";
  flags.from_file = "targets.json";
  absl::StatusOr<v1::LoadCheckpointRequest> r = BuildLoadCheckpointRequest(
      flags, R"json({"moves": [{"tensor": "a", "mesh": "m4", "placements": "S(0)"},
                               {"tensor": "b", "mesh": "m4", "flat": "0:4;4:8;;"}]})json");
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_EQ(r->targets_size(), 2);
  EXPECT_EQ(r->targets(1).target().flat_text(), "0:4;4:8;;");
  EXPECT_FALSE(BuildLoadCheckpointRequest(
                   flags, R"json({"moves": [{"tensor": "a", "placements": "S(0)"}]})json")
                   .ok());  // No mesh.
}

}  // namespace
}  // namespace shardcoord
