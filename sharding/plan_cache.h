#ifndef SHARDCOORD_SHARDING_PLAN_CACHE_H_
#define SHARDCOORD_SHARDING_PLAN_CACHE_H_

#include <cstddef>
#include <cstdint>
#include <list>
#include <memory>
#include <string>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "sharding/dtype.h"
#include "sharding/layout.h"
#include "sharding/plan.h"
#include "sharding/redistribute.h"

namespace shardcoord {

// Least-recently-used cache of plans keyed by (source fingerprint, target fingerprint,
// dtype and target dtype, options fingerprint). Not thread-safe: callers that share one lock it.
class PlanCache {
 public:
  explicit PlanCache(size_t capacity = 256) : capacity_(capacity == 0 ? 1 : capacity) {}

  // The cached plan, or a new one planned with Redistribute and cached.
  absl::StatusOr<std::shared_ptr<const Plan>> GetOrPlan(const Layout& source, const Layout& target,
                                                        DType dtype,
                                                        const PlanOptions& options = {});
  // A plan that casts to `target_dtype` (Redistribute's cast overload); keyed by both dtypes.
  absl::StatusOr<std::shared_ptr<const Plan>> GetOrPlan(const Layout& source, const Layout& target,
                                                        DType dtype, DType target_dtype,
                                                        const PlanOptions& options);
  // nullptr when absent.
  std::shared_ptr<const Plan> Find(const std::string& key);
  void Insert(const std::string& key, std::shared_ptr<const Plan> plan);

  static std::string Key(const Layout& source, const Layout& target, DType dtype,
                         const PlanOptions& options);
  static std::string Key(const Layout& source, const Layout& target, DType dtype,
                         DType target_dtype, const PlanOptions& options);

  size_t size() const { return entries_.size(); }
  size_t capacity() const { return capacity_; }
  int64_t hits() const { return hits_; }
  int64_t misses() const { return misses_; }

 private:
  using Entry = std::pair<std::string, std::shared_ptr<const Plan>>;
  size_t capacity_;
  std::list<Entry> entries_;  // Most recently used first.
  absl::flat_hash_map<std::string, std::list<Entry>::iterator> index_;
  int64_t hits_ = 0;
  int64_t misses_ = 0;
};

}  // namespace shardcoord

#endif  // SHARDCOORD_SHARDING_PLAN_CACHE_H_
