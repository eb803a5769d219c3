#include "sharding/checkpoint_index.h"

#include <string>

#include "absl/strings/str_replace.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace shardcoord {
namespace {

using ::testing::HasSubstr;

CheckpointIndex TwoPieces() {
  CheckpointIndex index;
  index.files.push_back({"rank-00000.safetensors", 0, "w0", 200});
  index.files.push_back({"rank-00001.safetensors", 1, "w1", 200});
  CheckpointTensor t;
  t.name = "layer.0/w";
  t.shape = {8, 4};
  t.dtype = DType::kBF16;
  for (int i = 0; i < 2; ++i) {
    CheckpointPiece p;
    p.box = Box({4 * i, 0}, {4, 4});
    p.file = CheckpointFileName(i);
    p.entry = PieceEntryName(t.name, p.box);
    p.has_xxh64 = true;
    p.xxh64 = 0xfedcba9876543210ULL + i;
    p.rows_per_block = 3;
    p.blocks = {1, 0xffffffffffffffffULL};
    t.pieces.push_back(p);
  }
  index.tensors.push_back(t);
  CheckpointTensor s;  // A scalar in one piece without checksums.
  s.name = "step";
  s.dtype = DType::kI64;
  CheckpointPiece p;
  p.file = CheckpointFileName(0);
  p.entry = "step[]";
  s.pieces.push_back(p);
  index.tensors.push_back(s);
  return index;
}

TEST(CheckpointIndexTest, RoundTrips) {
  const CheckpointIndex index = TwoPieces();
  ASSERT_TRUE(ValidateCheckpointIndex(index).ok()) << ValidateCheckpointIndex(index);
  const std::string json = SerializeCheckpointIndex(index);
  absl::StatusOr<CheckpointIndex> back = ParseCheckpointIndex(json);
  ASSERT_TRUE(back.ok()) << back.status() << "\n" << json;
  EXPECT_EQ(SerializeCheckpointIndex(*back), json);
  const CheckpointTensor* t = back->Find("layer.0/w");
  ASSERT_NE(t, nullptr);
  EXPECT_EQ(t->dtype, DType::kBF16);
  EXPECT_EQ(t->pieces[1].box, Box({4, 0}, {4, 4}));
  EXPECT_EQ(t->pieces[1].xxh64, 0xfedcba9876543211ULL);
  EXPECT_EQ(t->pieces[0].blocks[1], 0xffffffffffffffffULL);
  EXPECT_EQ(t->pieces[0].entry, "layer.0/w[0:4,0:4]");
  EXPECT_EQ(back->files[1].writer, "w1");
  EXPECT_EQ(back->Find("nope"), nullptr);
  EXPECT_EQ(back->TotalBytes(), 8 * 4 * 2 + 8);
}

TEST(CheckpointIndexTest, ErrorsNameTheField) {
  const std::string good = SerializeCheckpointIndex(TwoPieces());
  struct Case {
    std::string from, to, error;
  };
  const Case cases[] = {
      {"\"version\": 1", "\"version\": 2", "index.version"},
      {"shardcoord-checkpoint", "other", "index.format"},
      {"\"dtype\": \"BF16\"", "\"dtype\": \"F4\"", "tensors.layer.0/w.dtype"},
      {"\"offset\": [4, 0]", "\"offset\": [3, 0]", "tensors.layer.0/w.pieces"},
      {"\"offset\": [4, 0]", "\"offset\": [5, 0]", "tensors.layer.0/w.pieces[1].box"},
      {"\"xxh64\": \"fedcba9876543211\"", "\"xxh64\": \"xyz\"",
       "tensors.layer.0/w.pieces[1].xxh64"},
      {"\"rows_per_block\": 3", "\"rows_per_block\": 4", "pieces[0].blocks"},
      {"\"file\": \"rank-00001.safetensors\", \"entry\"",
       "\"file\": \"../x.safetensors\", \"entry\"", "pieces[1].file"},
      {"\"writer\": \"w1\"", "\"writer\": 1", "files[1].writer"},
      {"\"files\":", "\"extra\": 1, \"files\":", "unknown field \"extra\""},
      {"{\"file\": \"rank-00001.safetensors\",", "{\"file\": \"x/y.safetensors\",",
       "files[1].file"},
  };
  for (const Case& c : cases) {
    const std::string bad = absl::StrReplaceAll(good, {{c.from, c.to}});
    ASSERT_NE(bad, good) << c.from;
    absl::StatusOr<CheckpointIndex> parsed = ParseCheckpointIndex(bad);
    ASSERT_FALSE(parsed.ok()) << c.to;
    EXPECT_THAT(parsed.status().message(), HasSubstr(c.error)) << c.to;
  }
}

TEST(CheckpointIndexTest, PiecesMustTile) {
  CheckpointIndex index = TwoPieces();
  index.tensors[0].pieces.pop_back();  // Half the tensor is missing.
  absl::Status s = ValidateCheckpointIndex(index);
  EXPECT_THAT(s.message(), HasSubstr("cover 16 of the 32"));
  index = TwoPieces();
  index.tensors[0].pieces[1].entry = index.tensors[0].pieces[0].entry;
  index.tensors[0].pieces[1].file = index.tensors[0].pieces[0].file;
  EXPECT_THAT(ValidateCheckpointIndex(index).message(), HasSubstr("appears twice"));
  index = TwoPieces();
  index.tensors[0].pieces.push_back(index.tensors[0].pieces[0]);
  index.tensors[0].pieces.back().entry = "other";
  EXPECT_FALSE(ValidateCheckpointIndex(index).ok());
}

TEST(CheckpointIndexTest, FromPlainSafetensors) {
  SafetensorsHeader a;
  absl::StatusOr<std::string> bytes =
      BuildSafetensorsHeader({{"x", DType::kF32, {3, 2}}, {"y", DType::kF16, {5}}}, {}, &a);
  ASSERT_TRUE(bytes.ok());
  absl::StatusOr<CheckpointIndex> index = IndexFromSafetensors({{"model.safetensors", a}});
  ASSERT_TRUE(index.ok()) << index.status();
  ASSERT_EQ(index->tensors.size(), 2u);
  EXPECT_EQ(index->Find("x")->pieces[0].box, Box::Whole({3, 2}));
  EXPECT_FALSE(index->Find("x")->pieces[0].has_xxh64);
  EXPECT_TRUE(CheckPiecesAgainstHeader(*index, "model.safetensors", a).ok());
  // The same name in two files.
  absl::StatusOr<CheckpointIndex> twice =
      IndexFromSafetensors({{"a.safetensors", a}, {"b.safetensors", a}});
  EXPECT_THAT(twice.status().message(), HasSubstr("also in a.safetensors"));
}

TEST(CheckpointIndexTest, HeaderMismatchNamesFileAndEntry) {
  const CheckpointIndex index = TwoPieces();
  SafetensorsHeader h;
  ASSERT_TRUE(
      BuildSafetensorsHeader(
          {{"layer.0/w[0:4,0:4]", DType::kBF16, {4, 3}}, {"step[]", DType::kI64, {}}}, {}, &h)
          .ok());
  absl::Status s = CheckPiecesAgainstHeader(index, "rank-00000.safetensors", h);
  EXPECT_THAT(s.message(), HasSubstr("rank-00000.safetensors: entry \"layer.0/w[0:4,0:4]\""));
  EXPECT_THAT(s.message(), HasSubstr("shape [4, 3]"));
  SafetensorsHeader missing;
  ASSERT_TRUE(BuildSafetensorsHeader({{"step[]", DType::kI64, {}}}, {}, &missing).ok());
  EXPECT_THAT(CheckPiecesAgainstHeader(index, "rank-00000.safetensors", missing).message(),
              HasSubstr("is not in the file"));
}

TEST(CheckpointIndexTest, RowsPerBlock) {
  EXPECT_EQ(RowsPerBlock(2048), 512);
  EXPECT_EQ(RowsPerBlock(3), 349526);
  EXPECT_EQ(RowsPerBlock(int64_t{4} << 20), 1);
  EXPECT_EQ(BoxRows(Box({}, {})), 1);
  EXPECT_EQ(BoxRowElements(Box({0, 0, 0}, {5, 3, 2})), 6);
}

}  // namespace
}  // namespace shardcoord
