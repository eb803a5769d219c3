#include "tests/process.h"

#include <signal.h>
#include <sys/wait.h>

#include "absl/status/status.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/cluster.h"

namespace shardcoord {
namespace {

using ::testing::HasSubstr;

std::unique_ptr<Process> StartShell(const std::string& script) {
  ProcessOptions options;
  options.name = "sh";
  absl::StatusOr<std::unique_ptr<Process>> p = Process::Start({"/bin/sh", "-c", script}, options);
  EXPECT_TRUE(p.ok()) << p.status();
  return p.ok() ? *std::move(p) : nullptr;
}

TEST(ProcessTest, WaitsForALineByContent) {
  // `exec sleep` stands for a daemon that keeps running after its ready line.
  std::unique_ptr<Process> p =
      StartShell("echo starting; echo 'coordinator listening on 127.0.0.1:4711'; exec sleep 600");
  ASSERT_NE(p, nullptr);
  absl::StatusOr<std::string> line = p->WaitForLine("listening on", absl::Seconds(30));
  ASSERT_TRUE(line.ok()) << line.status();
  EXPECT_EQ(*line, "coordinator listening on 127.0.0.1:4711");
  absl::StatusOr<std::string> address = AddressAfter(*line, "listening on ");
  ASSERT_TRUE(address.ok()) << address.status();
  EXPECT_EQ(*address, "127.0.0.1:4711");
  EXPECT_THAT(p->Lines(), ::testing::ElementsAre("starting", *line));
  ASSERT_TRUE(p->Kill().ok());
  absl::StatusOr<int> status = p->Wait(absl::Seconds(1));
  ASSERT_TRUE(status.ok()) << status.status();
  EXPECT_TRUE(WIFSIGNALED(*status));
  EXPECT_EQ(WTERMSIG(*status), SIGKILL);
}

TEST(ProcessTest, ReportsAProcessThatExitsBeforeTheLine) {
  std::unique_ptr<Process> p = StartShell("echo 'bad flag --listen'; exit 3");
  ASSERT_NE(p, nullptr);
  absl::StatusOr<std::string> line = p->WaitForLine("listening on", absl::Seconds(30));
  EXPECT_EQ(line.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(line.status().message(), HasSubstr("exited with 3"));
  EXPECT_THAT(line.status().message(), HasSubstr("bad flag --listen"));
}

TEST(ProcessTest, TimesOutWhenTheLineNeverComes) {
  std::unique_ptr<Process> p = StartShell("echo hello; exec sleep 600");
  ASSERT_NE(p, nullptr);
  absl::StatusOr<std::string> line = p->WaitForLine("listening on", absl::Milliseconds(200));
  EXPECT_EQ(line.status().code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_THAT(line.status().message(), HasSubstr("hello"));
  // The destructor stops it (SIGTERM) and reaps it.
}

TEST(ProcessTest, RejectsAMissingBinary) {
  absl::StatusOr<std::unique_ptr<Process>> p = Process::Start({"/nonexistent/daemon"});
  EXPECT_EQ(p.status().code(), absl::StatusCode::kNotFound);
}

TEST(ProcessTest, AddressAfterNeedsAnAddress) {
  EXPECT_EQ(AddressAfter("worker w0 listening on ", "listening on ").status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(AddressAfter("something else", "listening on ").status().code(),
            absl::StatusCode::kInvalidArgument);
  absl::StatusOr<std::string> a = AddressAfter("worker w0 listening on [::1]:5 extra", "on ");
  ASSERT_TRUE(a.ok());
  EXPECT_EQ(*a, "[::1]:5");
}

TEST(ProcessTest, RunfilePathFindsThisTest) {
  absl::StatusOr<std::string> path = RunfilePath("tests/process_test");
  ASSERT_TRUE(path.ok()) << path.status();
  EXPECT_EQ(RunfilePath("no/such/file").status().code(), absl::StatusCode::kNotFound);
}

}  // namespace
}  // namespace shardcoord
