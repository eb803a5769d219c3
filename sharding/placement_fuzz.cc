// Fuzzes the text specs users type (shardctl --placements / --flat): ParsePlacements and
// ParseFlatSpec, then, as shardctl does, the layout they give on a small mesh. Parsers and
// layout constructors must only ever return statuses; what parses must print back to text
// that parses to the same value, and every layout built must pass ValidateLayout.
//
// Input: byte 0 picks the parser (even: placements, odd: flat) and bit 1 whether tensor dims
// are small or taken as raw 64-bit values (overflow checks); byte 1 the mesh shape; byte 2
// the tensor rank; then 8 bytes per tensor dim; the rest is the spec text.

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "absl/strings/string_view.h"
#include "sharding/box.h"
#include "sharding/layout.h"
#include "sharding/mesh.h"
#include "sharding/placement.h"
#include "sharding/testing/fuzz_check.h"

namespace shardcoord {
namespace {

constexpr sharding_testing::FuzzCheck Check{"placement_fuzz"};

struct Reader {
  const uint8_t* data;
  size_t size;
  uint8_t Byte() {
    if (size == 0) return 0;
    --size;
    return *data++;
  }
  uint64_t U64() {
    uint64_t v = 0;
    for (int i = 0; i < 8; ++i) v = v << 8 | Byte();
    return v;
  }
};

void CheckLayout(const absl::StatusOr<Layout>& layout, const Shape& shape) {
  if (!layout.ok()) return;
  Check(layout->global_shape() == shape, "layout has another shape");
  Check(ValidateLayout(shape, layout->ranks(), layout->num_partials()).ok(),
        "a built layout fails ValidateLayout");
}

}  // namespace
}  // namespace shardcoord

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace shardcoord;
  Reader in{data, size};
  const uint8_t mode = in.Byte();
  const uint8_t mesh_byte = in.Byte();
  const int ndim = in.Byte() % 5;
  Shape shape;
  for (int d = 0; d < ndim; ++d) {
    const uint64_t v = in.U64();
    shape.push_back((mode & 2) ? static_cast<int64_t>(v) : static_cast<int64_t>(v % 9));
  }
  const absl::string_view text(reinterpret_cast<const char*>(in.data), in.size);

  // Mesh: 1 to 3 dims of 1 to 4 positions.
  Shape mesh_shape;
  const int mesh_ndim = 1 + mesh_byte % 3;
  for (int d = 0; d < mesh_ndim; ++d) mesh_shape.push_back(1 + (mesh_byte >> (2 + 2 * d)) % 4);

  if ((mode & 1) == 0) {
    absl::StatusOr<std::vector<Placement>> p = ParsePlacements(text);
    if (!p.ok()) return 0;
    const std::string printed = PlacementsToString(*p);
    absl::StatusOr<std::vector<Placement>> again = ParsePlacements(printed);
    Check(again.ok(), "printed placements do not parse");
    Check(*again == *p, "printed placements parse to something else");
    // One placement per mesh dim, as shardctl requires.
    mesh_shape.resize(p->size() > 3 ? 3 : p->size(), 1);
    if (p->size() > 3) return 0;
    absl::StatusOr<DeviceMesh> mesh = DeviceMesh::Create(mesh_shape);
    Check(mesh.ok(), "small mesh rejected");
    CheckLayout(Layout::FromPlacements(*mesh, shape, *p), shape);
  } else {
    absl::StatusOr<FlatSpec> spec = ParseFlatSpec(text);
    if (!spec.ok()) return 0;
    const std::string printed = FlatSpecToString(*spec);
    absl::StatusOr<FlatSpec> again = ParseFlatSpec(printed);
    Check(again.ok(), "printed flat spec does not parse");
    Check(*again == *spec, "printed flat spec parses to something else");
    if (spec->empty() || spec->size() > 64) return 0;
    absl::StatusOr<DeviceMesh> mesh = DeviceMesh::Create({static_cast<int64_t>(spec->size())});
    Check(mesh.ok(), "small mesh rejected");
    CheckLayout(Layout::FromFlat(*mesh, shape, *spec), shape);
  }
  return 0;
}
