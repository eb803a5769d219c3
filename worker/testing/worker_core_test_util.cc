#include "worker/testing/worker_core_test_util.h"

#include "gtest/gtest.h"
#include "proto/convert.h"

namespace shardcoord {
namespace worker_testing {

v1::FillRequest FillRequestFor(const std::string& tensor, const RankChunks& chunks,
                               absl::Span<const int64_t> global_shape, v1::InitKind init,
                               v1::DType dtype, int64_t version) {
  v1::FillRequest req;
  req.set_tensor(tensor);
  req.set_version(version);
  req.set_dtype(dtype);
  *req.mutable_chunks() = RankChunksToProto(chunks);
  for (int64_t d : global_shape) req.add_global_shape(d);
  req.set_init(init);
  return req;
}

std::string ReadAllBytes(WorkerCore& core, const std::string& tensor, int64_t version,
                         const Box& box, int64_t max_bytes, std::vector<int64_t>* message_bytes) {
  v1::ReadChunkRequest req;
  req.set_tensor(tensor);
  req.set_version(version);
  *req.mutable_box() = BoxToProto(box);
  absl::StatusOr<WorkerCore::ChunkReader> reader = core.OpenRead(req);
  EXPECT_TRUE(reader.ok()) << reader.status();
  if (!reader.ok()) return {};
  std::string bytes;
  while (!reader->done()) {
    const size_t before = bytes.size();
    absl::Status s = reader->Next(max_bytes, &bytes);
    EXPECT_TRUE(s.ok()) << s;
    if (!s.ok()) return bytes;
    if (message_bytes != nullptr) message_bytes->push_back(bytes.size() - before);
  }
  EXPECT_EQ(static_cast<int64_t>(bytes.size()), reader->total_bytes());
  return bytes;
}

}  // namespace worker_testing
}  // namespace shardcoord
