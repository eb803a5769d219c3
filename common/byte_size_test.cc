#include "common/byte_size.h"

#include <cstdint>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace shardcoord {
namespace {

using ::testing::HasSubstr;

TEST(ByteSizeTest, ParsesNumbersAndUnits) {
  EXPECT_EQ(*ParseByteSize("0"), 0);
  EXPECT_EQ(*ParseByteSize("1073741824"), int64_t{1} << 30);
  EXPECT_EQ(*ParseByteSize("512MiB"), int64_t{512} << 20);
  EXPECT_EQ(*ParseByteSize("4GiB"), int64_t{4} << 30);
  EXPECT_EQ(*ParseByteSize("4 GiB"), int64_t{4} << 30);
  EXPECT_EQ(*ParseByteSize("64KiB"), int64_t{64} << 10);
  EXPECT_EQ(*ParseByteSize("64ki"), int64_t{64} << 10);
  EXPECT_EQ(*ParseByteSize("2Gi"), int64_t{2} << 30);
  EXPECT_EQ(*ParseByteSize("2G"), int64_t{2} << 30);
  EXPECT_EQ(*ParseByteSize("1T"), int64_t{1} << 40);
  EXPECT_EQ(*ParseByteSize("10GB"), int64_t{10} * 1000 * 1000 * 1000);
  EXPECT_EQ(*ParseByteSize("3kb"), 3000);
  EXPECT_EQ(*ParseByteSize("100B"), 100);
  EXPECT_EQ(*ParseByteSize("1.5GiB"), int64_t{3} << 29);
  EXPECT_EQ(*ParseByteSize("0.5KiB"), 512);
  EXPECT_EQ(*ParseByteSize("1.0001B"), 1);  // Rounded down.
}

TEST(ByteSizeTest, RefusesWhatIsNotOne) {
  for (const char* text : {"", "GiB", "-1", "-1GiB", "1.2.3MiB", "4XB", "4 G B", "1e9", "nan",
                           "9223372036854775808", "8589934592GiB", "99999999999999999999TB"}) {
    absl::StatusOr<int64_t> bytes = ParseByteSize(text);
    EXPECT_FALSE(bytes.ok()) << text << " -> " << *bytes;
  }
  int64_t out = 7;
  absl::Status s = ParseByteSizeFlag("memory-budget", "lots", &out);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("--memory-budget: 'lots' is not a byte size"));
  EXPECT_EQ(out, 7);
  EXPECT_TRUE(ParseByteSizeFlag("memory-budget", "1KiB", &out).ok());
  EXPECT_EQ(out, 1024);
}

TEST(ByteSizeTest, Formats) {
  EXPECT_EQ(FormatBytes(0), "0 B");
  EXPECT_EQ(FormatBytes(1023), "1023 B");
  EXPECT_EQ(FormatBytes(1536), "1.50 KiB");
  EXPECT_EQ(FormatBytes(int64_t{64} << 20), "64.0 MiB");
  EXPECT_EQ(FormatBytes(int64_t{2} << 30), "2.00 GiB");
}

}  // namespace
}  // namespace shardcoord
