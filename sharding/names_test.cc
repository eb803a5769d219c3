#include "sharding/names.h"

#include <string>

#include "absl/strings/match.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace shardcoord {
namespace {

using ::testing::HasSubstr;

TEST(NamesTest, NamesAreBounded) {
  EXPECT_TRUE(ValidateName("model.layers.0/attn_qkv:w-1").ok());
  EXPECT_EQ(ValidateName("").message(), "name: empty");
  absl::Status s = ValidateName(std::string(kMaxNameBytes + 1, 'a'), "header.name");
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(s.message(), "header.name: 257 bytes, more than the limit of 256");
  EXPECT_EQ(ValidateName("a b").message(),
            "name: 'a b' has ' ' at 1; names use letters, digits and _ . - : /");
  EXPECT_EQ(ValidateName("a\n").message(),
            "name: 'a\\n' has byte 0xa at 1; names use letters, digits and _ . - : /");
  EXPECT_THAT(ValidateName(std::string("x\x01")).message(), HasSubstr("has byte 0x1 at 1"));
}

TEST(NamesTest, WorkerNamesAreHostLike) {
  EXPECT_TRUE(ValidateWorkerName("w0").ok());
  EXPECT_TRUE(ValidateWorkerName("node-3.cluster.local:4711").ok());
  EXPECT_TRUE(ValidateWorkerName("shardcoord-worker-12").ok());
  EXPECT_EQ(ValidateWorkerName("").message(), "name: empty");
  for (const char* bad : {"/", "S(0)", "0:1,2:3;;", "-w", ".w", "w/0", "w 0"}) {
    absl::Status s = ValidateWorkerName(bad);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << bad;
    EXPECT_TRUE(absl::StartsWith(s.message(), "name: '")) << s;
  }
  EXPECT_EQ(ValidateWorkerName(std::string(300, 'a'), "--name").message(),
            "--name: 300 bytes, more than the limit of 253");
  EXPECT_EQ(ValidateWorkerName("/").message(),
            "name: '/' has '/' at 0; worker names use letters, digits and _ . - : and start with "
            "a letter or digit");
}

}  // namespace
}  // namespace shardcoord
