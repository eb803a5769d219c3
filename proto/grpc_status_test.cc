#include "proto/grpc_status.h"

#include <string>

#include "absl/status/status.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace shardcoord {
namespace {

using ::testing::EndsWith;
using ::testing::StartsWith;

TEST(GrpcStatusTest, CodesAndShortMessagesCrossUnchanged) {
  EXPECT_TRUE(ToGrpcStatus(absl::OkStatus()).ok());
  const grpc::Status s = ToGrpcStatus(absl::NotFoundError("unknown tensor 'x'"));
  EXPECT_EQ(s.error_code(), grpc::StatusCode::NOT_FOUND);
  EXPECT_EQ(s.error_message(), "unknown tensor 'x'");
  const std::string longest(kMaxGrpcStatusMessageBytes, 'a');
  EXPECT_EQ(ToGrpcStatus(absl::InvalidArgumentError(longest)).error_message(), longest);
  const absl::Status back = FromGrpcStatus(grpc::Status(grpc::StatusCode::ABORTED, "stale"));
  EXPECT_EQ(back, absl::AbortedError("stale"));
  EXPECT_EQ(FromGrpcStatus(grpc::Status(static_cast<grpc::StatusCode>(42), "odd")).code(),
            absl::StatusCode::kUnknown);
}

TEST(GrpcStatusTest, LongMessagesAreCutAndSaySo) {
  const std::string name(70000, 'n');
  const grpc::Status s = ToGrpcStatus(absl::NotFoundError("unknown tensor '" + name + "'"));
  EXPECT_EQ(s.error_code(), grpc::StatusCode::NOT_FOUND);
  EXPECT_LE(s.error_message().size(), kMaxGrpcStatusMessageBytes);
  EXPECT_THAT(s.error_message(), StartsWith("unknown tensor 'nnn"));
  EXPECT_THAT(s.error_message(), EndsWith("nnn... (cut from 70017 bytes)"));
}

TEST(GrpcStatusTest, CutsOnACharacterBoundary) {
  // Two-byte characters (U+00E9) from an odd offset: every possible cut lands inside one.
  for (int shift = 0; shift < 2; ++shift) {
    const std::string message = std::string(shift, 'x') + [] {
      std::string s;
      for (int i = 0; i < 5000; ++i) s += "\xc3\xa9";
      return s;
    }();
    const std::string cut = ToGrpcStatus(absl::InternalError(message)).error_message();
    ASSERT_LE(cut.size(), kMaxGrpcStatusMessageBytes);
    const size_t end = cut.find("... (cut from");
    ASSERT_NE(end, std::string::npos);
    EXPECT_EQ((end - shift) % 2, 0u) << "shift " << shift << ": cut inside a character";
    EXPECT_EQ(cut.substr(0, end), message.substr(0, end));
  }
}

}  // namespace
}  // namespace shardcoord
