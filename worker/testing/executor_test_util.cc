#include "worker/testing/executor_test_util.h"

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "proto/convert.h"
#include "sharding/fill.h"
#include "sharding/mesh.h"

namespace shardcoord {
namespace executor_testing {

double Contribution(ReduceOp op, int64_t flat, int64_t partial) {
  switch (op) {
    case ReduceOp::kSum:
    case ReduceOp::kAvg:
      return static_cast<double>(flat * (partial + 1));
    case ReduceOp::kMax:
      return static_cast<double>(flat + partial);
    case ReduceOp::kMin:
      return static_cast<double>(flat - partial);
  }
  return 0;
}

double Reduced(ReduceOp op, int64_t flat, int64_t partials) {
  if (partials <= 1) return static_cast<double>(flat);
  switch (op) {
    case ReduceOp::kSum:
      return static_cast<double>(flat * partials * (partials + 1) / 2);
    case ReduceOp::kAvg:
      return static_cast<double>(flat * (partials + 1)) / 2.0;
    case ReduceOp::kMax:
      return static_cast<double>(flat + partials - 1);
    case ReduceOp::kMin:
      return static_cast<double>(flat - partials + 1);
  }
  return 0;
}

void ForEachElement(const Shape& shape, const Box& box,
                    const std::function<void(int64_t, int64_t)>& fn) {
  if (box.Empty()) return;
  const Shape strides = RowMajorStrides(shape);
  Shape idx(box.ndim(), 0);
  for (int64_t i = 0; i < box.Volume(); ++i) {
    int64_t flat = 0;
    for (int d = 0; d < box.ndim(); ++d) flat += (box.offset(d) + idx[d]) * strides[d];
    fn(i, flat);
    for (int d = box.ndim() - 1; d >= 0; --d) {
      if (++idx[d] < box.shape(d)) break;
      idx[d] = 0;
    }
  }
}

std::shared_ptr<HostBuffer> MakeSource(const Layout& layout, int64_t rank, DType dtype,
                                       MemorySpace* space) {
  const RankChunks* rc = layout.Find(rank);
  if (rc == nullptr) return nullptr;
  auto host = *HostBuffer::Create(dtype, *rc);
  for (size_t k = 0; k < rc->chunks.size(); ++k) {
    const Chunk& c = rc->chunks[k];
    char* data = host->chunk_data(k);
    ForEachElement(layout.global_shape(), c.box, [&](int64_t i, int64_t flat) {
      const double v = layout.is_partial()
                           ? Contribution(layout.partial_op(), flat, c.partial_index)
                           : static_cast<double>(flat);
      StoreFromDouble(data, dtype, i, v);
    });
  }
  if (space == nullptr) return host;
  auto device = *HostBuffer::Create(dtype, *rc, space);
  EXPECT_TRUE(space->CopyFromHost(device->data(), host->data(), host->bytes()).ok());
  return device;
}

Layout MakeLayout(const Shape& mesh_shape, const std::vector<int64_t>& ranks,
                  const std::string& spec, const Shape& shape) {
  DeviceMesh mesh = *DeviceMesh::Create(mesh_shape, ranks);
  if (spec.rfind("flat ", 0) == 0) {
    absl::StatusOr<Layout> l = Layout::FromFlat(mesh, shape, *ParseFlatSpec(spec.substr(5)));
    EXPECT_TRUE(l.ok()) << l.status();
    return *l;
  }
  absl::StatusOr<Layout> l = Layout::FromPlacements(mesh, shape, *ParsePlacements(spec));
  EXPECT_TRUE(l.ok()) << spec << ": " << l.status();
  return *l;
}

std::vector<v1::PlanFragment> Fragments(const Plan& plan, const std::string& id, int ranks) {
  FragmentOptions options;
  options.plan_id = id;
  options.tensor = "T";
  options.source_version = 1;
  options.target_version = 2;
  for (int r = 0; r < ranks; ++r) options.incarnations[r] = 1;
  options.step_timeout_ms = 30000;
  options.communicator_prefix = absl::StrCat("plan/", id, "/");
  std::vector<v1::PlanFragment> out;
  for (int r = 0; r < ranks; ++r) out.push_back(MakeFragment(plan, r, options));
  return out;
}

}  // namespace executor_testing
}  // namespace shardcoord
