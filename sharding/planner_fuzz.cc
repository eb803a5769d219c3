// Fuzzes the planner on valid layout pairs: the input bytes choose a tensor shape and two
// layouts (placements on a small mesh, flat ranges, or arbitrary chunk lists, Partial ones
// included), as planner_property_test's random cases do but steered by the fuzzer. Planning
// must succeed, the plan must be structurally sound, move exactly the lower bound for
// non-Partial sources, and, run through the reference executor (with and without
// collectives), leave every target element with the source's value.

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <numeric>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "sharding/box.h"
#include "sharding/dtype.h"
#include "sharding/layout.h"
#include "sharding/mesh.h"
#include "sharding/placement.h"
#include "sharding/plan.h"
#include "sharding/planner.h"
#include "sharding/reference_executor.h"

namespace shardcoord {
namespace {

void Fail(const std::string& what) {
  std::fprintf(stderr, "planner_fuzz: %s\n", what.c_str());
  std::abort();
}

// Choices from the input bytes; once they run out every choice is its lowest option.
class Choices {
 public:
  Choices(const uint8_t* data, size_t size) : data_(data), size_(size) {}
  int64_t Uniform(int64_t lo, int64_t hi) {  // Inclusive.
    if (hi <= lo || pos_ >= size_) return lo;
    uint64_t v = data_[pos_++];
    if (hi - lo > 255 && pos_ < size_) v = v << 8 | data_[pos_++];
    return lo + static_cast<int64_t>(v % static_cast<uint64_t>(hi - lo + 1));
  }
  bool Chance() { return Uniform(0, 1) == 1; }
  template <typename T>
  void Shuffle(std::vector<T>* v) {
    for (size_t i = v->size(); i > 1; --i) std::swap((*v)[i - 1], (*v)[Uniform(0, i - 1)]);
  }

 private:
  const uint8_t* data_;
  size_t size_;
  size_t pos_ = 0;
};

constexpr int64_t kRankPool = 12;

std::vector<int64_t> Ranks(Choices& in, int64_t count) {
  std::vector<int64_t> all(kRankPool);
  std::iota(all.begin(), all.end(), 0);
  in.Shuffle(&all);
  all.resize(count);
  return all;
}

DeviceMesh Mesh(Choices& in) {
  const int nd = static_cast<int>(in.Uniform(1, 3));
  Shape shape;
  for (int d = 0; d < nd; ++d) shape.push_back(in.Uniform(1, nd == 1 ? 5 : nd == 2 ? 3 : 2));
  const int64_t size =
      std::accumulate(shape.begin(), shape.end(), int64_t{1}, std::multiplies<int64_t>());
  absl::StatusOr<DeviceMesh> mesh = DeviceMesh::Create(shape, Ranks(in, size));
  if (!mesh.ok()) Fail(absl::StrCat("mesh: ", mesh.status().ToString()));
  return *mesh;
}

ReduceOp Op(Choices& in) {
  static const ReduceOp kOps[] = {ReduceOp::kSum, ReduceOp::kAvg, ReduceOp::kMin, ReduceOp::kMax};
  return kOps[in.Uniform(0, 3)];
}

std::vector<int64_t> Sizes(Choices& in, int64_t n, int64_t k) {  // k sizes summing to n.
  std::vector<int64_t> cuts{0, n};
  for (int64_t i = 0; i + 1 < k; ++i) cuts.push_back(in.Uniform(0, n));
  std::sort(cuts.begin(), cuts.end());
  std::vector<int64_t> sizes;
  for (size_t i = 0; i + 1 < cuts.size(); ++i) sizes.push_back(cuts[i + 1] - cuts[i]);
  return sizes;
}

std::vector<Placement> Placements(Choices& in, const DeviceMesh& mesh, const Shape& shape) {
  const int ndim = static_cast<int>(shape.size());
  const ReduceOp op = Op(in);
  std::vector<bool> sharded(ndim, false);
  std::vector<Placement> out;
  for (int i = 0; i < mesh.ndim(); ++i) {
    const int64_t kind = in.Uniform(0, 3);
    if (ndim > 0 && kind <= 1) {
      const int d = static_cast<int>(in.Uniform(0, ndim - 1));
      if (!sharded[d] && kind == 1) {
        out.push_back(Placement::Shard(d, Sizes(in, shape[d], mesh.shape(i))));
      } else {
        out.push_back(Placement::Shard(in.Chance() ? d - ndim : d));
      }
      sharded[d] = true;
    } else if (kind == 2) {
      out.push_back(Placement::Partial(op));
    } else {
      out.push_back(Placement::Replicate());
    }
  }
  return out;
}

FlatSpec Flat(Choices& in, int64_t total, int64_t ranks) {
  FlatSpec spec(ranks);
  std::vector<int64_t> cuts{0, total};
  const int64_t pieces = in.Uniform(1, 2 * ranks + 1);
  for (int64_t i = 0; i + 1 < pieces; ++i) cuts.push_back(in.Uniform(0, total));
  std::sort(cuts.begin(), cuts.end());
  for (size_t i = 0; i + 1 < cuts.size(); ++i) {
    if (cuts[i] == cuts[i + 1]) continue;
    const int64_t a = in.Uniform(0, ranks - 1);
    spec[a].push_back({cuts[i], cuts[i + 1]});
    const int64_t b = in.Uniform(0, ranks - 1);
    if (b != a && in.Chance()) spec[b].push_back({cuts[i], cuts[i + 1]});
  }
  for (auto& r : spec) in.Shuffle(&r);
  return spec;
}

void SplitBox(Choices& in, const Box& b, int depth, std::vector<Box>* out) {
  std::vector<int> dims;
  for (int d = 0; d < b.ndim(); ++d) {
    if (b.shape(d) >= 2) dims.push_back(d);
  }
  if (depth == 0 || dims.empty() || in.Uniform(0, 3) == 0) {
    out->push_back(b);
    return;
  }
  const int d = dims[in.Uniform(0, dims.size() - 1)];
  const int64_t cut = in.Uniform(1, b.shape(d) - 1);
  Shape o1 = b.offset(), s1 = b.shape(), o2 = b.offset(), s2 = b.shape();
  s1[d] = cut;
  o2[d] += cut;
  s2[d] -= cut;
  SplitBox(in, Box(o1, s1), depth - 1, out);
  SplitBox(in, Box(o2, s2), depth - 1, out);
}

Layout Chunks(Choices& in, const Shape& shape) {
  const int64_t nranks = in.Uniform(1, 6);
  const std::vector<int64_t> ranks = Ranks(in, nranks);
  const int64_t np = in.Chance() ? in.Uniform(2, 3) : 1;
  std::vector<RankChunks> rcs(nranks);
  for (int64_t i = 0; i < nranks; ++i) rcs[i].rank = ranks[i];
  for (int64_t p = 0; p < np; ++p) {
    std::vector<Box> boxes;
    SplitBox(in, Box::Whole(shape), 4, &boxes);
    for (const Box& b : boxes) {
      const int64_t a = in.Uniform(0, nranks - 1);
      std::vector<int64_t> owners{a};
      const int64_t c = in.Uniform(0, nranks - 1);
      if (c != a && in.Chance()) owners.push_back(c);
      for (int64_t o : owners) {
        rcs[o].chunks.push_back({b, rcs[o].local_elements, p});
        rcs[o].local_elements += b.Volume();
      }
    }
  }
  absl::StatusOr<Layout> l = Layout::FromChunks(shape, std::move(rcs), np, Op(in));
  if (!l.ok()) Fail(absl::StrCat("chunk layout: ", l.status().ToString()));
  return *l;
}

Layout AnyLayout(Choices& in, const Shape& shape, const DeviceMesh* same_mesh) {
  const int64_t kind = same_mesh != nullptr ? 0 : in.Uniform(0, 2);
  if (kind == 0) {
    const DeviceMesh mesh = same_mesh != nullptr ? *same_mesh : Mesh(in);
    const std::vector<Placement> p = Placements(in, mesh, shape);
    absl::StatusOr<Layout> l = Layout::FromPlacements(mesh, shape, p);
    if (!l.ok()) Fail(absl::StrCat(PlacementsToString(p), ": ", l.status().ToString()));
    return *l;
  }
  if (kind == 1) {
    const int64_t n = in.Uniform(1, 6);
    absl::StatusOr<DeviceMesh> mesh = DeviceMesh::Create({n}, Ranks(in, n));
    if (!mesh.ok()) Fail("flat mesh");
    const FlatSpec spec = Flat(in, Box::Whole(shape).Volume(), n);
    absl::StatusOr<Layout> l = Layout::FromFlat(*mesh, shape, spec);
    if (!l.ok()) Fail(absl::StrCat(FlatSpecToString(spec), ": ", l.status().ToString()));
    return *l;
  }
  return Chunks(in, shape);
}

}  // namespace
}  // namespace shardcoord

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace shardcoord;
  Choices in(data, size);
  const int ndim = static_cast<int>(in.Uniform(0, 3));
  Shape shape;
  for (int d = 0; d < ndim; ++d) shape.push_back(in.Uniform(0, 7));
  // Sometimes an empty tensor whose other dims are huge: valid (zero elements), and every
  // product of its dims must be taken with care.
  if (ndim >= 2 && in.Uniform(0, 7) == 0) {
    const int64_t zero = in.Uniform(0, ndim - 1);
    for (int d = 0; d < ndim; ++d) shape[d] = d == zero ? 0 : int64_t{1} << in.Uniform(20, 40);
  }
  const Layout source = AnyLayout(in, shape, nullptr);
  const int64_t how = in.Uniform(0, 4);
  Layout target;
  std::vector<int64_t> gather_ranks;
  if (how == 0) {
    target = source;
  } else if (how == 1) {
    gather_ranks = Ranks(in, in.Uniform(1, 4));
  } else if (how == 2 && source.mesh().has_value() && !source.placements().empty()) {
    target = AnyLayout(in, shape, &*source.mesh());
  } else {
    target = AnyLayout(in, shape, nullptr);
  }
  PlanOptions options;
  if (in.Chance()) {
    for (int i = 0; i < kRankPool; ++i)
      options.hosts_by_rank.push_back(absl::StrCat("h", in.Uniform(0, 2)));
  }
  options.use_collectives = in.Uniform(0, 3) != 0;
  const DType dtype = in.Chance() ? DType::kF32 : DType::kBF16;
  const absl::StatusOr<Plan> plan = how == 1 ? Gather(source, gather_ranks, dtype, options)
                                             : Redistribute(source, target, dtype, options);
  if (!plan.ok()) Fail(absl::StrCat("planning a valid pair failed: ", plan.status().ToString()));
  const std::string pair =
      absl::StrCat(" (shape ", ShapeToString(shape), ", source ", plan->source.SpecString(),
                   ", target ", plan->target.SpecString(), ")");
  if (absl::Status s = CheckPlanStructure(*plan); !s.ok()) Fail(s.ToString() + pair);
  for (bool collectives : {false, true}) {
    if (absl::Status s = CheckPlanByExecution(*plan, size, collectives); !s.ok()) {
      Fail(absl::StrCat(collectives ? "with collectives: " : "", s.ToString(), pair));
    }
  }
  if (plan->lower_bound_bytes != BruteForceLowerBound(*plan)) Fail("lower bound" + pair);
  if (!plan->source.is_partial() && plan->bytes_moved != plan->lower_bound_bytes) {
    Fail("bytes moved differ from the lower bound" + pair);
  }
  return 0;
}
