// Worker deaths in the middle of streamed whole-tensor transfers (4 KiB bands, real daemons):
// an upload ends UNAVAILABLE and leaves the old version authoritative and readable; a
// download ends its stream with UNAVAILABLE naming the worker (seen by a client that does not
// retry; one that does resumes, and ends FAILED_PRECONDITION once the worker is declared dead
// and its chunk lost). The kill lands while the client is between two messages, so the
// transfer is certainly still under way.

#include <string>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "proto/convert.h"
#include "sharding/fill.h"
#include "tests/cluster.h"
#include "tests/cluster_environment.h"
#include "tests/tensor_check.h"

namespace shardcoord {
namespace {

using ::testing::HasSubstr;

const Shape kShape = {512, 512};  // 1 MiB of f32: 256 bands.

using StreamedIoFaultTest = ClusterTest;

TEST_F(StreamedIoFaultTest, WorkerDeathMidUploadKeepsTheOldVersion) {
  // Replicated on w0, w1, w3: the old version stays readable without w1.
  ASSERT_TRUE(MakeMesh(client(), "up_mesh", {3}, {"w0", "w1", "w3"}).ok());
  absl::StatusOr<v1::TensorInfo> before =
      CreateFilled(client(), "up", kShape, DType::kF32, "up_mesh", "R");
  ASSERT_TRUE(before.ok()) << before.status();

  const Box whole = Box::Whole(kShape);
  std::string data(static_cast<size_t>(whole.Volume() * 4), '\0');
  ASSERT_TRUE(FillBox(FillKind::kRandom, 5, kShape, whole, DType::kF32, data.data()).ok());
  v1::TensorHeader header;
  header.set_name("up");
  for (int64_t d : kShape) header.add_shape(d);
  header.set_dtype(DTypeToProto(DType::kF32));
  header.set_total_bytes(static_cast<int64_t>(data.size()));
  size_t offset = 0;
  bool killed = false;
  absl::StatusOr<v1::TensorInfo> up =
      client().UploadFrom(header, [&](size_t max_bytes, std::string* piece) {
        if (offset > 0 && !killed) {
          killed = true;
          EXPECT_TRUE(cluster_->KillWorker(1).ok());
        }
        const size_t n = std::min({max_bytes, data.size() - offset, size_t{32768}});
        piece->assign(data, offset, n);
        offset += n;
        return absl::OkStatus();
      });
  ASSERT_TRUE(killed);
  ASSERT_FALSE(up.ok());
  EXPECT_EQ(up.status().code(), absl::StatusCode::kUnavailable) << up.status();
  EXPECT_THAT(std::string(up.status().message()), HasSubstr("worker w1 (rank "));

  absl::StatusOr<v1::TensorInfo> after = client().GetTensor("up");
  ASSERT_TRUE(after.ok()) << after.status();
  EXPECT_EQ(after->version(), before->version());
  EXPECT_EQ(after->busy_plan(), "");
  absl::Status values = DownloadAndCheck(client(), "up", DType::kF32, kShape, FillKind::kArange);
  EXPECT_TRUE(values.ok()) << values;
}

TEST_F(StreamedIoFaultTest, WorkerDeathMidDownloadEndsTheStreamUnavailable) {
  // S(0) on w0, w2, w3: w2 alone holds rows [171:342).
  ASSERT_TRUE(MakeMesh(client(), "down_mesh", {3}, {"w0", "w2", "w3"}).ok());
  ASSERT_TRUE(CreateFilled(client(), "down", kShape, DType::kF32, "down_mesh", "S(0)").ok());
  // Without retries, to see the stream's own end (a retrying client resumes the download).
  CoordinatorClientOptions once = client().options();
  once.retry_for = absl::ZeroDuration();
  CoordinatorClient once_client(cluster_->coordinator_address(), once);
  std::string got;
  bool killed = false;
  absl::StatusOr<v1::TensorHeader> r = once_client.DownloadTo(
      "down", [](const v1::TensorHeader&) { return absl::OkStatus(); },
      [&](absl::string_view piece) {
        got.append(piece.data(), piece.size());
        if (!killed) {
          killed = true;
          EXPECT_TRUE(cluster_->KillWorker(2).ok());
        }
        return absl::OkStatus();
      });
  ASSERT_TRUE(killed);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), absl::StatusCode::kUnavailable) << r.status();
  EXPECT_THAT(std::string(r.status().message()), HasSubstr("worker w2 (rank "));
  // What arrived before is the tensor's beginning: rows of w0, then none of w2's.
  const Box whole = Box::Whole(kShape);
  std::string want(static_cast<size_t>(whole.Volume() * 4), '\0');
  ASSERT_TRUE(FillBox(FillKind::kArange, 0, kShape, whole, DType::kF32, want.data()).ok());
  ASSERT_LE(got.size(), size_t{171} * 512 * 4);
  EXPECT_TRUE(got == want.substr(0, got.size()));

  // A retrying client gets UNAVAILABLE (retried) until the coordinator declares w2 dead, then
  // the lasting answer: its chunk has no live replica.
  std::string again;
  r = client().Download("down", &again);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kFailedPrecondition) << r.status();
  EXPECT_THAT(std::string(r.status().message()), HasSubstr("no live replica"));
  EXPECT_TRUE(again == want.substr(0, again.size()));
}

}  // namespace
}  // namespace shardcoord
