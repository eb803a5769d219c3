// Fuzzes index.json (a checkpoint directory is read from storage anyone may have written to):
// ParseCheckpointIndex must only ever return statuses; an accepted index serializes to text
// that parses to the same index, and a load of every tensor that is small enough into a few
// layouts plans without error, every element read exactly once by a rank whose target needs
// it.

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/strings/string_view.h"
#include "sharding/checkpoint_index.h"
#include "sharding/checkpoint_plan.h"
#include "sharding/layout.h"
#include "sharding/mesh.h"
#include "sharding/placement.h"
#include "sharding/testing/fuzz_check.h"

constexpr shardcoord::sharding_testing::FuzzCheck Check{"checkpoint_index_fuzz"};

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace shardcoord;
  const absl::string_view text(reinterpret_cast<const char*>(data), size);
  absl::StatusOr<CheckpointIndex> index = ParseCheckpointIndex(text);
  if (!index.ok()) {
    Check(index.status().code() == absl::StatusCode::kInvalidArgument, "not INVALID_ARGUMENT");
    return 0;
  }
  const std::string again = SerializeCheckpointIndex(*index);
  absl::StatusOr<CheckpointIndex> back = ParseCheckpointIndex(again);
  Check(back.ok(), "a serialized index does not parse");
  Check(SerializeCheckpointIndex(*back) == again, "serialization is not stable");

  absl::StatusOr<DeviceMesh> mesh = DeviceMesh::Create({3});
  Check(mesh.ok(), "mesh");
  for (const CheckpointTensor& t : index->tensors) {
    const int64_t elements = Box::Whole(t.shape).Volume();
    if (elements > 4096 || t.pieces.size() > 64) continue;
    for (const char* spec : {"R", "S(0)", "S(-1)"}) {
      if (t.shape.empty() && spec[0] == 'S') continue;
      absl::StatusOr<std::vector<Placement>> p = ParsePlacements(spec);
      absl::StatusOr<Layout> target = Layout::FromPlacements(*mesh, t.shape, *p);
      Check(target.ok(), "target layout");
      absl::StatusOr<LoadPlan> plan = PlanLoad({LoadTensor{&t, *target}});
      Check(plan.ok(), "a valid index does not plan");
      int64_t read = 0;
      for (const ReadRun& r : plan->tensors[0].runs) read += r.box.Volume();
      Check(read == elements, "not every element read exactly once");
    }
  }
  return 0;
}
