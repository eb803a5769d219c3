#include "sharding/plan_cache.h"

#include <utility>

#include "absl/strings/str_cat.h"

namespace shardcoord {

std::string PlanCache::Key(const Layout& source, const Layout& target, DType dtype,
                           const PlanOptions& options) {
  return Key(source, target, dtype, dtype, options);
}

std::string PlanCache::Key(const Layout& source, const Layout& target, DType dtype,
                           DType target_dtype, const PlanOptions& options) {
  return absl::StrCat(source.Fingerprint(), "\n", target.Fingerprint(), "\n", DTypeName(dtype),
                      target_dtype == dtype ? "" : absl::StrCat("->", DTypeName(target_dtype)),
                      "\n", OptionsFingerprint(options));
}

std::shared_ptr<const Plan> PlanCache::Find(const std::string& key) {
  auto it = index_.find(key);
  if (it == index_.end()) return nullptr;
  entries_.splice(entries_.begin(), entries_, it->second);
  return it->second->second;
}

void PlanCache::Insert(const std::string& key, std::shared_ptr<const Plan> plan) {
  auto it = index_.find(key);
  if (it != index_.end()) {
    it->second->second = std::move(plan);
    entries_.splice(entries_.begin(), entries_, it->second);
    return;
  }
  entries_.emplace_front(key, std::move(plan));
  index_[key] = entries_.begin();
  while (entries_.size() > capacity_) {
    index_.erase(entries_.back().first);
    entries_.pop_back();
  }
}

absl::StatusOr<std::shared_ptr<const Plan>> PlanCache::GetOrPlan(const Layout& source,
                                                                 const Layout& target, DType dtype,
                                                                 const PlanOptions& options) {
  return GetOrPlan(source, target, dtype, dtype, options);
}

absl::StatusOr<std::shared_ptr<const Plan>> PlanCache::GetOrPlan(const Layout& source,
                                                                 const Layout& target, DType dtype,
                                                                 DType target_dtype,
                                                                 const PlanOptions& options) {
  const std::string key = Key(source, target, dtype, target_dtype, options);
  if (std::shared_ptr<const Plan> hit = Find(key)) {
    ++hits_;
    return hit;
  }
  ++misses_;
  absl::StatusOr<Plan> plan = dtype == target_dtype
                                  ? Redistribute(source, target, dtype, options)
                                  : Redistribute(source, target, dtype, target_dtype, options);
  if (!plan.ok()) return plan.status();
  auto shared = std::make_shared<const Plan>(*std::move(plan));
  Insert(key, shared);
  return shared;
}

}  // namespace shardcoord
