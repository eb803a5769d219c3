#include "coordinator/store/state_store.h"

#include <iterator>
#include <utility>

namespace shardcoord {

absl::Status StateStore::Put(std::string kind, std::string name, std::string value) {
  StateBatch b;
  b.Put(std::move(kind), std::move(name), std::move(value));
  return Apply(b);
}

absl::Status StateStore::Delete(std::string kind, std::string name) {
  StateBatch b;
  b.Delete(std::move(kind), std::move(name));
  return Apply(b);
}

absl::StatusOr<std::vector<StateRecord>> StateStore::Load(absl::string_view kind) const {
  absl::StatusOr<std::vector<StateRecord>> all = LoadAll();
  if (!all.ok()) return all.status();
  std::vector<StateRecord> out;
  for (StateRecord& r : *all) {
    if (r.kind == kind) out.push_back(std::move(r));
  }
  return out;
}

absl::StatusOr<std::vector<StateRecord>> StateStore::LoadKinds(
    std::initializer_list<absl::string_view> kinds) const {
  std::vector<StateRecord> out;
  for (absl::string_view kind : kinds) {
    absl::StatusOr<std::vector<StateRecord>> records = Load(kind);
    if (!records.ok()) return records.status();
    out.reserve(out.size() + records->size());
    std::move(records->begin(), records->end(), std::back_inserter(out));
  }
  return out;
}

absl::Status MemoryStateStore::Apply(const StateBatch& batch) {
  absl::MutexLock lock(&mu_);
  for (const auto& key : batch.deletes) records_.erase(key);
  for (const StateRecord& r : batch.puts) records_[{r.kind, r.name}] = r.value;
  ++applies_;
  return absl::OkStatus();
}

absl::StatusOr<std::vector<StateRecord>> MemoryStateStore::LoadAll() const {
  absl::MutexLock lock(&mu_);
  std::vector<StateRecord> out;
  out.reserve(records_.size());
  for (const auto& [key, value] : records_) out.push_back({key.first, key.second, value});
  return out;
}

absl::StatusOr<std::vector<StateRecord>> MemoryStateStore::Load(absl::string_view kind) const {
  absl::MutexLock lock(&mu_);
  std::vector<StateRecord> out;
  for (auto it = records_.lower_bound({std::string(kind), std::string()});
       it != records_.end() && it->first.first == kind; ++it) {
    out.push_back({it->first.first, it->first.second, it->second});
  }
  return out;
}

int64_t MemoryStateStore::applies() const {
  absl::MutexLock lock(&mu_);
  return applies_;
}

}  // namespace shardcoord
