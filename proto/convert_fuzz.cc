// Fuzzes every conversion of wire requests in proto/convert.h: byte 0 of the input picks a
// request type, byte 1 a small mesh, and the rest is parsed as that message, serialized.
// Conversions must only ever return statuses; what converts must convert back to a message
// that converts to the same value, and layouts built from specs must pass ValidateLayout.

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "google/protobuf/stubs/logging.h"
#include "proto/convert.h"
#include "proto/shardcoord.pb.h"
#include "sharding/box.h"
#include "sharding/layout.h"
#include "sharding/mesh.h"

namespace shardcoord {
namespace {

void Check(bool ok, const char* what) {
  if (!ok) {
    std::fprintf(stderr, "convert_fuzz: %s\n", what);
    std::abort();
  }
}

// 1 to 3 mesh dims of 1 to 4 positions, from one byte.
DeviceMesh SmallMesh(uint8_t b) {
  Shape shape;
  const int ndim = 1 + b % 3;
  for (int d = 0; d < ndim; ++d) shape.push_back(1 + (b >> (2 + 2 * d)) % 4);
  absl::StatusOr<DeviceMesh> mesh = DeviceMesh::Create(shape);
  Check(mesh.ok(), "small mesh rejected");
  return *mesh;
}

bool SameChunks(const RankChunks& a, const RankChunks& b) {
  return a.rank == b.rank && a.coord == b.coord && a.chunks == b.chunks &&
         a.local_elements == b.local_elements;
}

void CheckBox(const v1::Box& proto) {
  absl::StatusOr<Box> box = BoxFromProto(proto, "box");
  if (!box.ok()) return;
  absl::StatusOr<Box> again = BoxFromProto(BoxToProto(*box), "box");
  Check(again.ok() && *again == *box, "box round trip");
}

// What the coordinator does with a spec: SpecFromProto, then LayoutForSpec on a mesh.
void CheckSpec(const v1::ShardingSpec& proto, const absl::StatusOr<Shape>& shape,
               const DeviceMesh& mesh) {
  absl::StatusOr<Spec> spec = SpecFromProto(proto, "spec");
  if (!spec.ok()) return;
  // SpecToProto fills both the structured and the text form (for TensorInfo); requests take
  // one, so convert back from the structured one.
  v1::ShardingSpec back = SpecToProto(*spec);
  back.clear_placements_text();
  back.clear_flat_text();
  absl::StatusOr<Spec> again = SpecFromProto(back, "spec");
  Check(again.ok(), "a converted spec does not convert back");
  Check(again->ToString() == spec->ToString() && again->mesh == spec->mesh,
        "spec round trip changes it");
  if (!shape.ok()) return;
  absl::StatusOr<Layout> layout = LayoutForSpec(*spec, mesh, *shape, "spec");
  if (!layout.ok()) return;
  Check(layout->global_shape() == *shape, "layout has another shape");
  Check(ValidateLayout(*shape, layout->ranks(), layout->num_partials()).ok(),
        "a layout built from a spec fails ValidateLayout");
}

void CheckRankChunks(const v1::RankChunks& proto) {
  ChunkChecksums sums;
  absl::StatusOr<RankChunks> rc = RankChunksFromProto(proto, "chunks", &sums);
  if (!rc.ok()) return;
  Check(sums.size() == rc->chunks.size(), "one checksum per chunk");
  ChunkChecksums sums2;
  absl::StatusOr<RankChunks> again =
      RankChunksFromProto(RankChunksToProto(*rc, sums), "chunks", &sums2);
  Check(again.ok() && SameChunks(*again, *rc) && sums2 == sums, "rank chunks round trip");
}

void CheckLayout(const v1::Layout& proto) {
  LayoutChecksums sums;
  absl::StatusOr<Layout> layout = LayoutFromProto(proto, "layout", &sums);
  if (!layout.ok()) return;
  Check(ValidateLayout(layout->global_shape(), layout->ranks(), layout->num_partials()).ok(),
        "a converted layout fails ValidateLayout");
  absl::StatusOr<Layout> again = LayoutFromProto(LayoutToProto(*layout, &sums), "layout");
  Check(again.ok() && *again == *layout, "layout round trip");
}

void CheckStep(const v1::Step& proto) {
  absl::StatusOr<Step> step = StepFromProto(proto, "step");
  if (!step.ok()) return;
  absl::StatusOr<Step> again = StepFromProto(StepToProto(*step, proto.index()), "step");
  Check(again.ok(), "a converted step does not convert back");
  Check(again->op == step->op && again->ranks == step->ranks &&
            again->transfers.size() == step->transfers.size(),
        "step round trip");
}

// The input parsed as an M, handed to `check` when it parses.
template <typename M, typename Check>
void Fuzz(const uint8_t* data, size_t size, Check check) {
  M m;
  if (m.ParseFromArray(data, static_cast<int>(size))) check(m);
}

}  // namespace
}  // namespace shardcoord

// Protobuf logs every string field with invalid UTF-8 it parses; fuzz inputs are full of them.
extern "C" int LLVMFuzzerInitialize(int*, char***) {
  google::protobuf::SetLogHandler(
      [](google::protobuf::LogLevel, const char*, int, const std::string&) {});
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace shardcoord;
  if (size < 2) return 0;
  const uint8_t kind = data[0];
  const DeviceMesh mesh = SmallMesh(data[1]);
  data += 2;
  size -= 2;
  switch (kind % 12) {
    case 0:  // Coordinator.CreateTensor
      Fuzz<v1::CreateTensorRequest>(data, size, [&](const v1::CreateTensorRequest& r) {
        absl::StatusOr<Shape> shape = ShapeFromProto(r.shape(), "shape");
        (void)DTypeFromProto(r.dtype(), "dtype");
        CheckSpec(r.spec(), shape, mesh);
      });
      break;
    case 1:  // Coordinator.Redistribute (the tensor's shape comes from the coordinator).
      Fuzz<v1::RedistributeRequest>(data, size, [&](const v1::RedistributeRequest& r) {
        CheckSpec(r.target(), Shape{4, 6}, mesh);
      });
      break;
    case 2:  // Coordinator.PlanRedistribute
      Fuzz<v1::PlanRequest>(data, size, [&](const v1::PlanRequest& r) {
        CheckSpec(r.target(), Shape{3, 0, 5}, mesh);
      });
      break;
    case 3:  // Coordinator.Upload header
      Fuzz<v1::TensorData>(data, size, [&](const v1::TensorData& r) {
        const v1::TensorHeader& h = r.header();
        absl::StatusOr<Shape> shape = ShapeFromProto(h.shape(), "header.shape");
        absl::StatusOr<DType> dtype = DTypeFromProto(h.dtype(), "header.dtype");
        if (shape.ok() && dtype.ok()) (void)CheckedBytes(*shape, ElementSize(*dtype));
        if (h.has_spec()) CheckSpec(h.spec(), shape, mesh);
      });
      break;
    case 4:  // CoordinatorWorkers.ReportChunks
      Fuzz<v1::ReportChunksRequest>(
          data, size, [](const v1::ReportChunksRequest& r) { CheckRankChunks(r.chunks()); });
      break;
    case 5:  // Worker.Fill
      Fuzz<v1::FillRequest>(data, size, [](const v1::FillRequest& r) {
        (void)DTypeFromProto(r.dtype(), "dtype");
        absl::StatusOr<Shape> shape = ShapeFromProto(r.global_shape(), "global_shape");
        (void)ReduceOpFromProto(r.partial_op(), "partial_op");
        CheckRankChunks(r.chunks());
        absl::StatusOr<RankChunks> rc = RankChunksFromProto(r.chunks(), "chunks");
        if (shape.ok() && rc.ok()) (void)ValidateLayout(*shape, {*rc});
      });
      break;
    case 6:  // Worker.ReadChunk
      Fuzz<v1::ReadChunkRequest>(data, size,
                                 [](const v1::ReadChunkRequest& r) { CheckBox(r.box()); });
      break;
    case 7:  // Worker.WriteChunk header
      Fuzz<v1::ChunkData>(data, size, [](const v1::ChunkData& r) {
        (void)DTypeFromProto(r.dtype(), "dtype");
        CheckRankChunks(r.chunks());
      });
      break;
    case 8:  // Worker.Execute
      Fuzz<v1::PlanFragment>(data, size,
                             [](const v1::PlanFragment& r) { (void)FragmentFromProto(r); });
      break;
    case 9:  // Layouts in responses (shardctl shows them).
      Fuzz<v1::Layout>(data, size, [](const v1::Layout& r) { CheckLayout(r); });
      break;
    case 10:  // Plans in responses (shardctl shows them).
      Fuzz<v1::Plan>(data, size, [](const v1::Plan& r) {
        CheckLayout(r.source());
        CheckLayout(r.target());
        for (const v1::Step& s : r.steps()) CheckStep(s);
        for (const v1::LocalCopy& c : r.local_copies()) {
          absl::StatusOr<LocalCopy> lc = LocalCopyFromProto(c, "local_copy");
          if (lc.ok()) {
            Check(LocalCopyFromProto(LocalCopyToProto(*lc), "c").ok(), "copy round trip");
          }
        }
      });
      break;
    case 11:  // Coordinator.CreateMesh
      Fuzz<v1::CreateMeshRequest>(data, size, [](const v1::CreateMeshRequest& r) {
        (void)ShapeFromProto(r.shape(), "shape");
      });
      break;
  }
  return 0;
}
