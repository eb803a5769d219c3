#include "common/sha256.h"

#include "gtest/gtest.h"

namespace shardcoord {
namespace {

TEST(Sha256Test, KnownVectors) {
  EXPECT_EQ(Sha256Hex(""), "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
  EXPECT_EQ(Sha256Hex("abc"), "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  EXPECT_EQ(Sha256("abc")[0], 0xba);
}

TEST(TrimTokenTest, DropsTrailingNewlinesAndSpacesOnly) {
  EXPECT_EQ(TrimToken("tok\n"), "tok");
  EXPECT_EQ(TrimToken("tok\r\n \t"), "tok");
  EXPECT_EQ(TrimToken(" tok"), " tok");
  EXPECT_EQ(TrimToken("\n"), "");
}

}  // namespace
}  // namespace shardcoord
