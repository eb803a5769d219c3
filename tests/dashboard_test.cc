// Issue 16, acceptance 2: Debian's headless Chromium loads the dashboard of a live cluster
// (with bearer tokens on), and the DOM it builds shows the workers, meshes, tensors and plans
// the test made; after a redistribute the tensor's spec and version change on the page, and
// so does its layout picture. A screenshot of the page is checked and kept in the test's
// outputs (the README's picture).

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/sha256.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/cluster.h"
#include "tests/cluster_environment.h"
#include "tests/png_check.h"
#include "tests/tensor_check.h"
#include "tests/test_files.h"

namespace shardcoord {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

constexpr char kChromium[] = "/usr/bin/chromium";
constexpr char kReaderToken[] = "dashboard-test-reader-7f3a9c";
constexpr char kAdminToken[] = "dashboard-test-admin-51be02";
constexpr char kWorkerToken[] = "dashboard-test-worker-c0ffee";
constexpr int kWidth = 1280, kHeight = 1500;

// Runs headless Chromium on `url` with `args` and returns its standard output. The virtual
// time budget lets the page's fetches and timers run before Chromium dumps or shoots it.
absl::StatusOr<std::string> RunChromium(const std::string& url, const std::string& args) {
  static int run = 0;
  const std::string cmd = absl::StrCat(
      kChromium, " --headless --no-sandbox --disable-gpu --no-first-run --hide-scrollbars",
      " --user-data-dir=", TmpDir(), "/chromium-profile-", ++run, " --virtual-time-budget=10000 ",
      args, " '", url, "' 2>>", TmpDir(), "/chromium.log");
  FILE* pipe = popen(cmd.c_str(), "r");
  if (pipe == nullptr) return absl::InternalError("popen failed");
  std::string out;
  char buf[65536];
  for (size_t n; (n = fread(buf, 1, sizeof(buf), pipe)) > 0;) out.append(buf, n);
  const int rc = pclose(pipe);
  if (rc != 0) {
    return absl::InternalError(absl::StrCat("chromium exited with ", rc,
                                            "; its log: ", ReadFile(TmpDir() + "/chromium.log")));
  }
  return out;
}

// The <tr> of the tensors table for `name`, or "".
std::string TensorRow(const std::string& dom, const std::string& name) {
  const size_t at = dom.find(absl::StrCat("<tr data-key=\"", name, "\""));
  if (at == std::string::npos) return "";
  return dom.substr(at, dom.find("</tr>", at) - at);
}

class DashboardTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (access(kChromium, X_OK) != 0) {
      GTEST_SKIP() << kChromium << " is not installed (tools/setup.sh installs Debian's chromium)";
    }
    cluster_ = ClusterEnvironment::Get();
    ASSERT_NE(cluster_, nullptr);
    url_ = absl::StrCat("http://", cluster_->metrics_address(), "/");
  }

  Cluster* cluster_ = nullptr;
  std::string url_;
};

// `data-ranks` of the layout picture's block held by mesh positions `a` and `b`.
std::string Block(const v1::MeshInfo& mesh, int a, int b) {
  const int64_t x = mesh.ranks(a), y = mesh.ranks(b);
  return absl::StrCat("data-ranks=\"", std::min(x, y), ",", std::max(x, y), "\"");
}

TEST_F(DashboardTest, ShowsTheClusterAndFollowsARedistribute) {
  CoordinatorClient& client = cluster_->client();
  const absl::StatusOr<v1::MeshInfo> grid =
      MakeMesh(client, "grid", {2, 2}, {"w0", "w1", "w2", "w3"});
  ASSERT_TRUE(grid.ok()) << grid.status();
  ASSERT_TRUE(MakeMesh(client, "line", {4}, {"w3", "w2", "w1", "w0"}).ok());
  ASSERT_TRUE(CreateFilled(client, "model.w", {64, 48}, DType::kF32, "grid", "S(0),R").ok());
  ASSERT_TRUE(CreateFilled(client, "model.b", {1000}, DType::kBF16, "line", "S(0)").ok());
  const absl::StatusOr<v1::TensorInfo> before = client.GetTensor("model.w");
  ASSERT_TRUE(before.ok()) << before.status();

  const std::string page = absl::StrCat(url_, "#token=", kReaderToken, "&tensor=model.w");
  absl::StatusOr<std::string> dom = RunChromium(page, "--dump-dom");
  ASSERT_TRUE(dom.ok()) << dom.status();
  EXPECT_THAT(*dom, HasSubstr("4 workers, 2 meshes, 2 tensors")) << *dom;
  for (const std::string& w : cluster_->WorkerNames()) {
    EXPECT_THAT(*dom, HasSubstr(absl::StrCat("<td>", w, "</td>"))) << w;
  }
  EXPECT_THAT(*dom, HasSubstr("grid: 2x2"));
  EXPECT_THAT(*dom, HasSubstr("line: 4"));
  EXPECT_THAT(*dom, HasSubstr("<b>rank 3</b>"));
  std::string row = TensorRow(*dom, "model.w");
  EXPECT_THAT(row, HasSubstr("<td>64x48</td><td>F32</td><td>grid</td><td>S(0),R</td>")) << row;
  EXPECT_THAT(row, HasSubstr(absl::StrCat("<td>", before->version(), "</td>"))) << row;
  EXPECT_THAT(TensorRow(*dom, "model.b"), HasSubstr("<td>1000</td><td>BF16</td><td>line</td>"));
  // The selected tensor's layout picture: rows [0,32) on the grid's first row, [32,64) on
  // its second.
  EXPECT_THAT(*dom, HasSubstr("class=\"layout\""));
  EXPECT_THAT(*dom, HasSubstr(Block(*grid, 0, 1)));
  EXPECT_THAT(*dom, HasSubstr(Block(*grid, 2, 3)));

  absl::StatusOr<v1::RedistributeResponse> moved =
      client.Redistribute(RedistributeTo("model.w", "", "R,S(1)"));
  ASSERT_TRUE(moved.ok()) << moved.status();
  const absl::StatusOr<v1::TensorInfo> after = client.GetTensor("model.w");
  ASSERT_TRUE(after.ok()) << after.status();
  ASSERT_GT(after->version(), before->version());

  dom = RunChromium(page, "--dump-dom");
  ASSERT_TRUE(dom.ok()) << dom.status();
  row = TensorRow(*dom, "model.w");
  EXPECT_THAT(row, HasSubstr("<td>grid</td><td>R,S(1)</td>")) << row;
  EXPECT_THAT(row, HasSubstr(absl::StrCat("<td>", after->version(), "</td>"))) << row;
  EXPECT_THAT(row, Not(HasSubstr("S(0),R")));
  // Columns now: [0,24) on the grid's first column, [24,48) on its second.
  EXPECT_THAT(*dom, HasSubstr(Block(*grid, 0, 2)));
  EXPECT_THAT(*dom, HasSubstr(Block(*grid, 1, 3)));
  EXPECT_THAT(*dom, Not(HasSubstr(Block(*grid, 0, 1))));
  // The plan, committed, with its trace link.
  EXPECT_THAT(*dom, HasSubstr(absl::StrCat("<td>", moved->progress().plan_id(),
                                           "</td><td>redistribute</td><td>model.w</td>"
                                           "<td class=\"COMMITTED\">COMMITTED</td>")));

  // The picture for the README: the page as a user sees it.
  const char* outputs = std::getenv("TEST_UNDECLARED_OUTPUTS_DIR");
  const std::string png = absl::StrCat(outputs != nullptr ? outputs : TmpDir(), "/dashboard.png");
  ASSERT_TRUE(
      RunChromium(page, absl::StrCat("--window-size=", kWidth, ",", kHeight, " --screenshot=", png))
          .ok());
  absl::StatusOr<PngSummary> shot = SummarizePng(ReadFile(png));
  ASSERT_TRUE(shot.ok()) << shot.status();
  EXPECT_EQ(shot->width, kWidth);
  EXPECT_EQ(shot->height, kHeight);
  // Text, tables and the coloured layout blocks, not a blank or error page.
  EXPECT_GT(shot->pixels_not_white, kWidth * kHeight / 100);
  EXPECT_GT(shot->distinct_colors, 64);
}

TEST_F(DashboardTest, WithoutATokenThePageAsksForOneAndShowsNothing) {
  absl::StatusOr<std::string> dom = RunChromium(url_, "--dump-dom");
  ASSERT_TRUE(dom.ok()) << dom.status();
  EXPECT_THAT(*dom, HasSubstr("id=\"login\" style=\"display: block;\"")) << *dom;
  EXPECT_THAT(*dom, HasSubstr("HTTP 401"));
  EXPECT_THAT(*dom, Not(HasSubstr("<td>w0</td>")));
}

}  // namespace
}  // namespace shardcoord

int main(int argc, char** argv) {
  using shardcoord::Sha256Hex;
  const std::string tokens = shardcoord::TmpDir() + "/tokens";
  const std::string worker_token = shardcoord::TmpDir() + "/worker.token";
  shardcoord::WriteFile(
      tokens, absl::StrCat("admin alice ", Sha256Hex(shardcoord::kAdminToken), "\n", "reader rick ",
                           Sha256Hex(shardcoord::kReaderToken), "\n", "worker workers ",
                           Sha256Hex(shardcoord::kWorkerToken), "\n"));
  shardcoord::WriteFile(worker_token, absl::StrCat(shardcoord::kWorkerToken, "\n"));
  shardcoord::ClusterOptions options;
  options.coordinator_flags = {"--auth-tokens=" + tokens};
  options.worker_flags = {"--token-file=" + worker_token};
  options.client_options.token = shardcoord::kAdminToken;
  return shardcoord::RunWithCluster(argc, argv, std::move(options));
}
