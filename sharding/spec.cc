#include "sharding/spec.h"

#include "absl/strings/str_cat.h"
#include "sharding/field_status.h"

namespace shardcoord {
namespace {

using field_status::Bad;
using field_status::Index;
using field_status::Prefixed;
using field_status::Sub;

}  // namespace

std::string Spec::ToString() const {
  if (is_flat) return absl::StrCat("flat ", FlatSpecToString(flat));
  return PlacementsToString(placements);
}

absl::Status CheckPlacements(absl::Span<const Placement> placements, const Shape& tensor_shape,
                             const DeviceMesh& mesh, absl::string_view field) {
  if (static_cast<int>(placements.size()) != mesh.ndim()) {
    return Bad(field, "'", PlacementsToString(placements), "' has ", placements.size(),
               " items but mesh ", mesh.ShapeString(), " has ", mesh.ndim(), " dims");
  }
  const int ndim = static_cast<int>(tensor_shape.size());
  const Placement* first_partial = nullptr;
  for (size_t i = 0; i < placements.size(); ++i) {
    const Placement& p = placements[i];
    const std::string item = Index(field, i);
    if (p.is_shard()) {
      if (p.dim < -ndim || p.dim >= ndim) {
        return Bad(item, p.ToString(), " on a ", ndim, "-d tensor");
      }
      if (!p.sizes.empty() && static_cast<int64_t>(p.sizes.size()) != mesh.shape(i)) {
        return Bad(item, p.ToString(), " has ", p.sizes.size(), " sizes but mesh dim ", i, " has ",
                   mesh.shape(i), " positions");
      }
      for (size_t j = 0; j < p.sizes.size(); ++j) {
        if (p.sizes[j] < 0) return Bad(item, p.ToString(), ": size ", p.sizes[j], " < 0");
      }
    } else if (p.is_partial()) {
      if (first_partial != nullptr && first_partial->op != p.op) {
        return Bad(item, p.ToString(), " after ", first_partial->ToString(),
                   ": all Partial dims must use one reduce op");
      }
      if (first_partial == nullptr) first_partial = &p;
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<Layout> LayoutForSpec(const Spec& spec, const DeviceMesh& mesh, const Shape& shape,
                                     absl::string_view field) {
  if (spec.is_flat) {
    const std::string f = Sub(field, "flat");
    if (static_cast<int64_t>(spec.flat.size()) != mesh.size()) {
      return Bad(f, spec.flat.size(), " ranks given for mesh ", mesh.ShapeString(), " of ",
                 mesh.size(), " ranks");
    }
    absl::StatusOr<Layout> layout = Layout::FromFlat(mesh, shape, spec.flat);
    if (!layout.ok()) return Prefixed(f, layout.status());
    return layout;
  }
  const std::string f = Sub(field, "placements");
  if (absl::Status s = CheckPlacements(spec.placements, shape, mesh, f); !s.ok()) return s;
  absl::StatusOr<Layout> layout = Layout::FromPlacements(mesh, shape, spec.placements);
  if (!layout.ok()) return Prefixed(f, layout.status());
  return layout;
}

}  // namespace shardcoord
