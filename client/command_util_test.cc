#include "client/command_util.h"

#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>

#include "CLI/CLI.hpp"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace shardcoord {
namespace {

using ::testing::HasSubstr;

TEST(StatusLineTest, CodeNameAndMessageOnOneLine) {
  EXPECT_EQ(StatusLine(absl::NotFoundError("tensor 'x' does not exist")),
            "shardctl: NOT_FOUND: tensor 'x' does not exist");
  EXPECT_EQ(StatusLine(absl::AbortedError("step 2 failed\non rank 3")),
            "shardctl: ABORTED: step 2 failed on rank 3");
  // The address helps only when the coordinator could not be reached.
  EXPECT_EQ(StatusLine(absl::UnavailableError("failed to connect"), "127.0.0.1:7400"),
            "shardctl: UNAVAILABLE: failed to connect (coordinator 127.0.0.1:7400)");
  EXPECT_EQ(StatusLine(absl::DeadlineExceededError("Deadline Exceeded"), "h:1"),
            "shardctl: DEADLINE_EXCEEDED: Deadline Exceeded (coordinator h:1)");
  EXPECT_EQ(StatusLine(absl::InvalidArgumentError("bad"), "h:1"),
            "shardctl: INVALID_ARGUMENT: bad");
}

TEST(ReportTest, ExitCodes) {
  std::ostringstream err;
  EXPECT_EQ(ReportStatus(err, absl::FailedPreconditionError("dead worker w3")), 1);
  EXPECT_EQ(err.str(), "shardctl: FAILED_PRECONDITION: dead worker w3\n");
  err.str("");
  EXPECT_EQ(ReportFlagError(err, "tensor create", "--shape: 'a' is not an integer"), 2);
  EXPECT_EQ(err.str(), "shardctl tensor create: --shape: 'a' is not an integer\n");
}

TEST(CoordinatorAddressTest, FlagWins) {
  ConnectionFlags flags;
  flags.coordinator = "10.1.2.3:99";
  EXPECT_EQ(CoordinatorAddress(flags), "10.1.2.3:99");
  ASSERT_EQ(setenv("SHARDCOORD_ADDR", "e:1", 1), 0);
  flags.coordinator = "";
  EXPECT_EQ(CoordinatorAddress(flags), "e:1");
  ASSERT_EQ(unsetenv("SHARDCOORD_ADDR"), 0);
  EXPECT_EQ(CoordinatorAddress(flags), "127.0.0.1:7400");
}

TEST(ClientOptionsTest, TlsCaFromFlagElseEnvironment) {
  const std::string ca = std::string(std::getenv("TEST_TMPDIR")) + "/ca.pem";
  std::ofstream(ca) << "-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n";
  ASSERT_EQ(unsetenv("SHARDCOORD_TLS_CA"), 0);
  ConnectionFlags flags;
  EXPECT_FALSE(ClientOptions(flags).tls.enabled());
  flags.tls_ca = ca;
  EXPECT_TRUE(ClientOptions(flags).tls.enabled());
  flags.tls_ca.clear();
  ASSERT_EQ(setenv("SHARDCOORD_TLS_CA", ca.c_str(), 1), 0);
  EXPECT_TRUE(ClientOptions(flags).tls.enabled());
  ASSERT_EQ(unsetenv("SHARDCOORD_TLS_CA"), 0);
}

TEST(ClientOptionsTest, UnusableTlsFileIsAUsageErrorNamingFlagAndPath) {
  ConnectionFlags flags;
  flags.tls_ca = "/nonexistent/ca.pem";
  try {
    ClientOptions(flags);
    ADD_FAILURE() << "no error";
  } catch (const CLI::ValidationError& e) {
    EXPECT_THAT(e.what(), HasSubstr("--tls-ca: cannot read /nonexistent/ca.pem"));
  }
}

TEST(FormatTableTest, PadsAndAligns) {
  EXPECT_EQ(FormatTable({{"name", "bytes"}, {"a", "5"}, {"long", "12345"}}, {1}),
            "name  bytes\n"
            "a         5\n"
            "long  12345\n");
  EXPECT_EQ(FormatTable({{"x", ""}, {"yy", "z"}}), "x\nyy  z\n");
}

TEST(HumanBytesTest, Units) {
  EXPECT_EQ(HumanBytes(0), "0 B");
  EXPECT_EQ(HumanBytes(1023), "1023 B");
  EXPECT_EQ(HumanBytes(1536), "1.5 KiB");
  EXPECT_EQ(HumanBytes(4 << 20), "4.00 MiB");
  EXPECT_EQ(HumanBytes(int64_t{300} << 20), "300.0 MiB");
  EXPECT_EQ(HumanBytes(int64_t{2} << 30), "2.00 GiB");
}

TEST(ProgressLineTest, BarPercentAndBytes) {
  EXPECT_EQ(ProgressLine("upload t", 0, 4 << 20, 10), "upload t [..........]   0%  0 B / 4.00 MiB");
  EXPECT_EQ(ProgressLine("upload t", 1 << 20, 4 << 20, 10),
            "upload t [##........]  25%  1.00 MiB / 4.00 MiB");
  EXPECT_EQ(ProgressLine("x", 4 << 20, 4 << 20, 4), "x [####] 100%  4.00 MiB / 4.00 MiB");
  // More than the total (a server that miscounts) stays at 100%.
  EXPECT_EQ(ProgressLine("x", 9, 4, 4), "x [####] 100%  9 B / 4 B");
  EXPECT_EQ(ProgressLine("x", 100, 0, 4), "x [....]    %  100 B");
}

TEST(ProgressBarTest, DrawsOnlyWhenEnabledAndSkipsRepeats) {
  std::ostringstream off;
  {
    ProgressBar bar(off, false, "t");
    bar.Update(1, 2);
  }
  EXPECT_EQ(off.str(), "");

  std::ostringstream on;
  {
    ProgressBar bar(on, true, "t");
    bar.Update(0, 100);
    bar.Update(0, 100);  // Same line: not redrawn.
    bar.Update(100, 100);
    bar.Finish();
    bar.Update(50, 100);  // After Finish: ignored.
  }
  const std::string s = on.str();
  EXPECT_EQ(std::count(s.begin(), s.end(), '\r'), 2);
  EXPECT_EQ(std::count(s.begin(), s.end(), '\n'), 1);
  EXPECT_THAT(s, HasSubstr("100%  100 B / 100 B\n"));
}

}  // namespace
}  // namespace shardcoord
