#ifndef SHARDCOORD_WORKER_TESTING_EXECUTOR_TEST_UTIL_H_
#define SHARDCOORD_WORKER_TESTING_EXECUTOR_TEST_UTIL_H_

// What the executor tests share: the values a test tensor holds, source buffers filled with
// them, layouts from spec strings, and a plan's fragments in wire form.

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "proto/shardcoord.pb.h"
#include "sharding/box.h"
#include "sharding/dtype.h"
#include "sharding/layout.h"
#include "sharding/placement.h"
#include "sharding/plan.h"
#include "worker/buffer_store.h"
#include "worker/memory_space.h"

namespace shardcoord {
namespace executor_testing {

// The value contribution `partial` holds at flat index `flat` of a Partial test tensor, and
// what the reduction of `partials` contributions gives there (the flat index itself for
// a tensor that is not Partial).
double Contribution(ReduceOp op, int64_t flat, int64_t partial);
double Reduced(ReduceOp op, int64_t flat, int64_t partials);

// Calls fn(i, flat) for every element of `box`, i counting row-major inside the box.
void ForEachElement(const Shape& shape, const Box& box,
                    const std::function<void(int64_t, int64_t)>& fn);

// Rank `rank`'s source chunks of `layout` holding the values above, in `space` (null: host);
// null when the rank holds nothing.
std::shared_ptr<HostBuffer> MakeSource(const Layout& layout, int64_t rank, DType dtype,
                                       MemorySpace* space = nullptr);

// A layout from "S(0),R"-style placements or "flat a:b;c:d;..." over a mesh of `mesh_shape`
// on `ranks` (empty: 0..n-1). Fails the test on a bad spec.
Layout MakeLayout(const Shape& mesh_shape, const std::vector<int64_t>& ranks,
                  const std::string& spec, const Shape& shape);

// The fragments of ranks 0..ranks-1 for plan `id` of tensor "T", version 1 -> 2, every
// incarnation 1, a 30 s step timeout and a communicator prefix of its own.
std::vector<v1::PlanFragment> Fragments(const Plan& plan, const std::string& id, int ranks = 4);

}  // namespace executor_testing
}  // namespace shardcoord

#endif  // SHARDCOORD_WORKER_TESTING_EXECUTOR_TEST_UTIL_H_
