// Random layouts (fixed seeds) through the planner, checked by the reference executor
// (sharding/reference_executor), which simulates every rank's memory and applies the plan as
// plan.h specifies.

#include <algorithm>
#include <cstdint>
#include <map>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "sharding/box.h"
#include "sharding/cost_model.h"
#include "sharding/dtype.h"
#include "sharding/layout.h"
#include "sharding/mesh.h"
#include "sharding/placement.h"
#include "sharding/plan.h"
#include "sharding/planner.h"
#include "sharding/reference_executor.h"

namespace shardcoord {
namespace {

using Rng = std::mt19937_64;

int64_t Uniform(Rng& rng, int64_t lo, int64_t hi) {  // Inclusive.
  return std::uniform_int_distribution<int64_t>(lo, hi)(rng);
}
bool Chance(Rng& rng, double p) { return std::uniform_real_distribution<double>(0, 1)(rng) < p; }

// Random sizes summing to n over k pieces (zeros allowed).
std::vector<int64_t> RandomSizes(Rng& rng, int64_t n, int64_t k) {
  std::vector<int64_t> cuts{0, n};
  for (int64_t i = 0; i + 1 < k; ++i) cuts.push_back(Uniform(rng, 0, n));
  std::sort(cuts.begin(), cuts.end());
  std::vector<int64_t> sizes;
  for (int64_t i = 0; i + 1 < static_cast<int64_t>(cuts.size()); ++i) {
    sizes.push_back(cuts[i + 1] - cuts[i]);
  }
  return sizes;
}

std::vector<int64_t> RandomRanks(Rng& rng, int64_t count, int64_t pool) {
  std::vector<int64_t> all(pool);
  std::iota(all.begin(), all.end(), 0);
  std::shuffle(all.begin(), all.end(), rng);
  all.resize(count);
  return all;
}

DeviceMesh RandomMesh(Rng& rng, int64_t pool) {
  const int nd = static_cast<int>(Uniform(rng, 1, 3));
  Shape shape;
  for (int d = 0; d < nd; ++d) shape.push_back(Uniform(rng, 1, nd == 1 ? 5 : nd == 2 ? 3 : 2));
  const int64_t size =
      std::accumulate(shape.begin(), shape.end(), int64_t{1}, std::multiplies<int64_t>());
  std::vector<int64_t> ranks = RandomRanks(rng, size, pool);
  if (Chance(rng, 0.3)) std::sort(ranks.begin(), ranks.end());
  return *DeviceMesh::Create(shape, ranks);
}

ReduceOp RandomOp(Rng& rng) {
  static const ReduceOp kOps[] = {ReduceOp::kSum, ReduceOp::kAvg, ReduceOp::kMin, ReduceOp::kMax};
  return kOps[Uniform(rng, 0, 3)];
}

std::vector<Placement> RandomPlacements(Rng& rng, const DeviceMesh& mesh, const Shape& shape,
                                        bool allow_partial) {
  const int ndim = static_cast<int>(shape.size());
  const ReduceOp op = RandomOp(rng);
  std::vector<bool> sharded(ndim, false);
  std::vector<Placement> out;
  for (int i = 0; i < mesh.ndim(); ++i) {
    const double r = std::uniform_real_distribution<double>(0, 1)(rng);
    if (ndim > 0 && r < 0.5) {
      const int d = static_cast<int>(Uniform(rng, 0, ndim - 1));
      if (!sharded[d] && Chance(rng, 0.35)) {
        out.push_back(Placement::Shard(d, RandomSizes(rng, shape[d], mesh.shape(i))));
      } else {
        out.push_back(Placement::Shard(Chance(rng, 0.1) ? d - ndim : d));
      }
      sharded[d] = true;
    } else if (allow_partial && r < 0.75) {
      out.push_back(Placement::Partial(op));
    } else {
      out.push_back(Placement::Replicate());
    }
  }
  return out;
}

FlatSpec RandomFlat(Rng& rng, int64_t total, int64_t ranks) {
  FlatSpec spec(ranks);
  std::vector<int64_t> cuts{0, total};
  const int64_t pieces = Uniform(rng, 1, 2 * ranks + 1);
  for (int64_t i = 0; i + 1 < pieces; ++i) cuts.push_back(Uniform(rng, 0, total));
  std::sort(cuts.begin(), cuts.end());
  for (size_t i = 0; i + 1 < cuts.size(); ++i) {
    if (cuts[i] == cuts[i + 1]) continue;
    const int64_t a = Uniform(rng, 0, ranks - 1);
    spec[a].push_back({cuts[i], cuts[i + 1]});
    const int64_t b = Uniform(rng, 0, ranks - 1);
    if (b != a && Chance(rng, 0.25)) spec[b].push_back({cuts[i], cuts[i + 1]});
  }
  for (auto& r : spec) std::shuffle(r.begin(), r.end(), rng);
  return spec;
}

void SplitBox(Rng& rng, const Box& b, int depth, std::vector<Box>* out) {
  std::vector<int> dims;
  for (int d = 0; d < b.ndim(); ++d) {
    if (b.shape(d) >= 2) dims.push_back(d);
  }
  if (depth == 0 || dims.empty() || Chance(rng, 0.25)) {
    out->push_back(b);
    return;
  }
  const int d = dims[Uniform(rng, 0, dims.size() - 1)];
  const int64_t cut = Uniform(rng, 1, b.shape(d) - 1);
  Shape o1 = b.offset(), s1 = b.shape(), o2 = b.offset(), s2 = b.shape();
  s1[d] = cut;
  o2[d] += cut;
  s2[d] -= cut;
  SplitBox(rng, Box(o1, s1), depth - 1, out);
  SplitBox(rng, Box(o2, s2), depth - 1, out);
}

Layout RandomChunks(Rng& rng, const Shape& shape, bool allow_partial) {
  const int64_t nranks = Uniform(rng, 1, 6);
  const std::vector<int64_t> ranks = RandomRanks(rng, nranks, 20);
  const int64_t np = allow_partial && Chance(rng, 0.4) ? Uniform(rng, 2, 3) : 1;
  std::vector<RankChunks> rcs(nranks);
  for (int64_t i = 0; i < nranks; ++i) rcs[i].rank = ranks[i];
  for (int64_t p = 0; p < np; ++p) {
    std::vector<Box> boxes;
    SplitBox(rng, Box::Whole(shape), 4, &boxes);
    for (const Box& b : boxes) {
      const int64_t a = Uniform(rng, 0, nranks - 1);
      std::vector<int64_t> owners{a};
      const int64_t c = Uniform(rng, 0, nranks - 1);
      if (c != a && Chance(rng, 0.3)) owners.push_back(c);
      for (int64_t o : owners) {
        rcs[o].chunks.push_back({b, rcs[o].local_elements, p});
        rcs[o].local_elements += b.Volume();
      }
    }
  }
  return *Layout::FromChunks(shape, std::move(rcs), np, RandomOp(rng));
}

Layout RandomLayout(Rng& rng, const Shape& shape, const DeviceMesh* same_mesh, bool allow_partial) {
  const double r = std::uniform_real_distribution<double>(0, 1)(rng);
  const int64_t total = Box::Whole(shape).Volume();
  if (same_mesh != nullptr || r < 0.65) {
    const DeviceMesh mesh = same_mesh != nullptr ? *same_mesh : RandomMesh(rng, 20);
    absl::StatusOr<Layout> l =
        Layout::FromPlacements(mesh, shape, RandomPlacements(rng, mesh, shape, allow_partial));
    EXPECT_TRUE(l.ok()) << l.status();
    return *l;
  }
  if (r < 0.85) {
    const int64_t n = Uniform(rng, 1, 6);
    const DeviceMesh mesh = *DeviceMesh::Create({n}, RandomRanks(rng, n, 20));
    absl::StatusOr<Layout> l = Layout::FromFlat(mesh, shape, RandomFlat(rng, total, n));
    EXPECT_TRUE(l.ok()) << l.status();
    return *l;
  }
  return RandomChunks(rng, shape, allow_partial);
}

// ---- Reference executor ----

// What the reference executor (sharding/reference_executor) does not know: the options the
// plan was made with. Estimates match the cost model; every transfer is within or across
// hosts, and a piece crosses hosts only when no copy of it is on the destination's host, so
// the crossing bytes are exactly the cross-host bound.
void CheckAgainstOptions(const Plan& plan, const PlanOptions& options) {
  const HostMap hosts = HostMapFor(options);
  int64_t across = 0;
  for (size_t si = 0; si < plan.steps.size(); ++si) {
    const Step& s = plan.steps[si];
    const double estimate = EstimateStep(options.cost, hosts, s);
    ASSERT_NEAR(s.estimated_seconds, estimate, 1e-9 * estimate) << "step " << si;
    for (const Transfer& t : s.transfers) across += hosts.SameHost(t.src, t.dst) ? 0 : t.bytes;
  }
  ASSERT_EQ(plan.bytes_across_hosts, across);
  ASSERT_EQ(plan.bytes_within_hosts + plan.bytes_across_hosts, plan.bytes_moved);
  ASSERT_EQ(plan.bytes_across_hosts, plan.cross_host_lower_bound_bytes);
  const double total = EstimatePlan(options.cost, hosts, plan);
  ASSERT_NEAR(plan.estimated_seconds, total, 1e-9 * total);
}

// For placement sources (every holder set is one source box's replicas, and the sets are
// disjoint), the busiest sender stays within 1.1x of the ideal plus the slab granularity.
// Not with hosts: a destination then reads from its own host's holders, balanced among them
// only (locality first; CheckStructure checks the cross-host bytes instead).
void CheckBalance(const Plan& plan, const PlanOptions& options) {
  const Layout& s = plan.source;
  if (s.placements().empty() || HostMapFor(options).known()) return;
  const int64_t esize = ElementSize(plan.dtype);
  std::map<std::pair<int64_t, Box>, std::vector<int64_t>> classes;
  int64_t row = 0;
  for (const RankChunks& rc : s.ranks()) {
    const Chunk& c = rc.chunks[0];
    if (c.box.Empty()) continue;
    classes[{c.partial_index, c.box}].push_back(rc.rank);
    int64_t longest = 1;
    for (int d = 0; d < c.box.ndim(); ++d) longest = std::max(longest, c.box.shape(d));
    row = std::max(row, c.box.Volume() / longest * esize);
  }
  std::map<int64_t, int64_t> sent;
  for (const RankTraffic& t : plan.traffic) sent[t.rank] = t.bytes_sent;
  double ideal = 0;
  int64_t worst = 0;
  for (const auto& [key, ranks] : classes) {
    int64_t sum = 0;
    for (int64_t r : ranks) {
      sum += sent[r];
      worst = std::max(worst, sent[r]);
    }
    ideal = std::max(ideal, static_cast<double>(sum) / ranks.size());
  }
  EXPECT_LE(worst, 1.1 * ideal + 2 * row) << "ideal " << ideal;
}

std::string Describe(const Layout& l) {
  std::string out = l.SpecString();
  if (l.placements().empty()) {
    for (const RankChunks& rc : l.ranks()) {
      absl::StrAppend(&out, " | r", rc.rank, ":");
      for (const Chunk& c : rc.chunks)
        absl::StrAppend(&out, c.box.ToString(), "p", c.partial_index);
    }
  } else if (l.mesh().has_value()) {
    absl::StrAppend(&out, " ranks ", l.mesh()->ToString());
  }
  return out;
}

void RunCase(uint64_t seed) {
  Rng rng(seed);
  const int ndim = static_cast<int>(Chance(rng, 0.05) ? 0 : Uniform(rng, 1, 3));
  Shape shape;
  for (int d = 0; d < ndim; ++d) shape.push_back(Chance(rng, 0.04) ? 0 : Uniform(rng, 1, 7));
  const Layout source = RandomLayout(rng, shape, nullptr, true);
  Layout target;
  const double r = std::uniform_real_distribution<double>(0, 1)(rng);
  bool gather = false;
  std::vector<int64_t> gather_ranks;
  if (r < 0.05) {
    target = source;
  } else if (r < 0.15) {
    gather = true;
    gather_ranks = RandomRanks(rng, Uniform(rng, 1, 4), 20);
  } else if (r < 0.45 && source.mesh().has_value() && !source.placements().empty()) {
    target = RandomLayout(rng, shape, &*source.mesh(), true);
  } else {
    target = RandomLayout(rng, shape, nullptr, true);
  }
  PlanOptions options;
  if (Chance(rng, 0.3)) {
    for (int i = 0; i < 20; ++i)
      options.hosts_by_rank.push_back(absl::StrCat("h", Uniform(rng, 0, 2)));
  }
  options.use_collectives = !Chance(rng, 0.1);
  const DType dtype = Chance(rng, 0.5) ? DType::kF32 : DType::kBF16;
  absl::StatusOr<Plan> plan = gather ? Gather(source, gather_ranks, dtype, options)
                                     : Redistribute(source, target, dtype, options);
  ASSERT_TRUE(plan.ok()) << plan.status();
  SCOPED_TRACE(absl::StrCat("seed ", seed, " shape ", ShapeToString(shape), "\n  source ",
                            Describe(plan->source), "\n  target ", Describe(plan->target)));
  const absl::Status structure = CheckPlanStructure(*plan);
  ASSERT_TRUE(structure.ok()) << structure;
  CheckAgainstOptions(*plan, options);
  if (::testing::Test::HasFatalFailure()) return;
  for (bool collectives : {false, true}) {
    const absl::Status executed = CheckPlanByExecution(*plan, seed, collectives);
    ASSERT_TRUE(executed.ok()) << (collectives ? "with" : "without")
                               << " collectives: " << executed;
  }
  ASSERT_EQ(plan->lower_bound_bytes, BruteForceLowerBound(*plan));
  if (!plan->source.is_partial()) ASSERT_EQ(plan->bytes_moved, plan->lower_bound_bytes);
  CheckBalance(*plan, options);
  // Deterministic: planning again gives the same plan.
  absl::StatusOr<Plan> again = gather ? Gather(source, gather_ranks, dtype, options)
                                      : Redistribute(source, target, dtype, options);
  ASSERT_TRUE(again.ok());
  ASSERT_EQ(again->steps.size(), plan->steps.size());
  for (size_t i = 0; i < plan->steps.size(); ++i) {
    ASSERT_EQ(again->steps[i].op, plan->steps[i].op);
    ASSERT_EQ(again->steps[i].ranks, plan->steps[i].ranks);
    ASSERT_EQ(again->steps[i].transfers, plan->steps[i].transfers);
  }
  ASSERT_EQ(again->local_copies, plan->local_copies);
}

TEST(PlannerPropertyTest, RandomLayoutsExecuteExactly) {
  for (uint64_t seed = 1; seed <= 4000; ++seed) {
    RunCase(seed);
    if (HasFailure()) {
      ADD_FAILURE() << "first failing seed " << seed;
      return;
    }
  }
}

// Statistics over the same seeds, so the random cases demonstrably reach every kind of step.
TEST(PlannerPropertyTest, RandomLayoutsReachEveryStepKind) {
  std::map<StepOp, int> seen;
  int partial_cases = 0, cross_mesh = 0;
  for (uint64_t seed = 1; seed <= 4000; ++seed) {
    Rng rng(seed);
    const int ndim = static_cast<int>(Chance(rng, 0.05) ? 0 : Uniform(rng, 1, 3));
    Shape shape;
    for (int d = 0; d < ndim; ++d) shape.push_back(Chance(rng, 0.04) ? 0 : Uniform(rng, 1, 7));
    const Layout source = RandomLayout(rng, shape, nullptr, true);
    const Layout target =
        RandomLayout(rng, shape,
                     source.mesh().has_value() && !source.placements().empty() && Chance(rng, 0.5)
                         ? &*source.mesh()
                         : nullptr,
                     true);
    // Bandwidth only: with latency, point-to-point beats an all-reduce on tensors this small.
    PlanOptions options;
    options.cost.intra_alpha_s = options.cost.inter_alpha_s = 0;
    absl::StatusOr<Plan> plan = Redistribute(source, target, DType::kF32, options);
    ASSERT_TRUE(plan.ok());
    partial_cases += source.is_partial();
    cross_mesh += source.RankIds() != target.RankIds();
    for (const Step& s : plan->steps) ++seen[s.op];
  }
  for (StepOp op : {StepOp::kAllGather, StepOp::kReduceScatter, StepOp::kAllReduce,
                    StepOp::kAllToAll, StepOp::kBroadcast, StepOp::kPointToPoint}) {
    EXPECT_GT(seen[op], 0) << StepOpName(op);
  }
  EXPECT_GT(partial_cases, 100);
  EXPECT_GT(cross_mesh, 1000);
}

}  // namespace
}  // namespace shardcoord
