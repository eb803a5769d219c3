#include "coordinator/tensor_manager.h"

#include <algorithm>
#include <map>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"

namespace shardcoord {

int64_t TensorRecord::bytes() const {
  absl::StatusOr<int64_t> b = CheckedBytes(shape, ElementSize(dtype));
  return b.ok() ? *b : -1;
}

std::string LostChunk::ToString() const {
  std::string s = box.ToString();
  if (partial_index != 0) absl::StrAppend(&s, " (partial ", partial_index, ")");
  absl::StrAppend(&s, " on rank", ranks.size() > 1 ? "s " : " ", absl::StrJoin(ranks, ", "));
  return s;
}

std::vector<LostChunk> LostChunks(const TensorRecord& tensor, const LivenessFn& live) {
  struct Holders {
    bool any_live = false;
    std::vector<int64_t> dead;
    size_t order = 0;
  };
  std::map<std::pair<Box, int64_t>, Holders> chunks;
  for (const RankChunks& rc : tensor.layout.ranks()) {
    auto inc = tensor.incarnations.find(rc.rank);
    const bool alive = inc != tensor.incarnations.end() && live(rc.rank, inc->second);
    for (const Chunk& c : rc.chunks) {
      if (c.box.Empty()) continue;
      auto [it, inserted] = chunks.try_emplace({c.box, c.partial_index});
      if (inserted) it->second.order = chunks.size();
      if (alive) {
        it->second.any_live = true;
      } else {
        it->second.dead.push_back(rc.rank);
      }
    }
  }
  std::vector<std::pair<size_t, LostChunk>> lost;
  for (auto& [key, h] : chunks) {
    if (h.any_live) continue;
    lost.push_back({h.order, LostChunk{key.first, key.second, std::move(h.dead)}});
  }
  std::sort(lost.begin(), lost.end(),
            [](const auto& a, const auto& b) { return a.first < b.first; });
  std::vector<LostChunk> out;
  for (auto& [order, c] : lost) out.push_back(std::move(c));
  return out;
}

absl::StatusOr<Layout> LiveLayout(const TensorRecord& tensor, const LivenessFn& live) {
  std::vector<RankChunks> ranks;
  bool all_live = true;
  for (const RankChunks& rc : tensor.layout.ranks()) {
    auto inc = tensor.incarnations.find(rc.rank);
    if (inc != tensor.incarnations.end() && live(rc.rank, inc->second)) {
      ranks.push_back(rc);
    } else {
      all_live = false;
    }
  }
  if (all_live) return tensor.layout;
  std::vector<LostChunk> lost = LostChunks(tensor, live);
  if (!lost.empty()) {
    std::vector<std::string> names;
    for (const LostChunk& c : lost) names.push_back(c.ToString());
    return absl::FailedPreconditionError(absl::StrCat(
        "tensor '", tensor.name, "' lost ", lost.size(), " chunk", lost.size() > 1 ? "s" : "",
        " with no live replica: ", absl::StrJoin(names, "; ")));
  }
  absl::StatusOr<Layout> out = Layout::FromChunks(
      tensor.shape, std::move(ranks), tensor.layout.num_partials(), tensor.layout.partial_op());
  if (!out.ok()) {
    return absl::InternalError(absl::StrCat("live replicas of '", tensor.name,
                                            "' do not form a layout: ", out.status().message()));
  }
  return out;
}

absl::Status CheckReplicaChecksums(const Layout& layout, const LayoutChecksums& checksums,
                                   const std::function<std::string(int64_t rank)>& describe) {
  std::map<std::pair<Box, int64_t>, std::pair<uint64_t, int64_t>> first;
  for (size_t i = 0; i < layout.ranks().size() && i < checksums.size(); ++i) {
    const RankChunks& rc = layout.ranks()[i];
    for (size_t j = 0; j < rc.chunks.size() && j < checksums[i].size(); ++j) {
      const Chunk& c = rc.chunks[j];
      if (c.box.Empty()) continue;
      auto [it, inserted] = first.try_emplace({c.box, c.partial_index}, checksums[i][j], rc.rank);
      if (!inserted && it->second.first != checksums[i][j]) {
        return absl::DataLossError(absl::StrFormat(
            "replicas of chunk %s%s disagree: checksum %016x on %s but %016x on %s",
            c.box.ToString(),
            c.partial_index ? absl::StrCat(" (partial ", c.partial_index, ")") : "",
            it->second.first, describe(it->second.second), checksums[i][j], describe(rc.rank)));
      }
    }
  }
  return absl::OkStatus();
}

int64_t TensorManager::NewVersion() {
  absl::MutexLock lock(&mu_);
  return ++last_version_;
}

absl::Status TensorManager::Reserve(TensorRecord record, const std::string& op) {
  if (!record.mesh.empty()) {
    if (absl::Status s = meshes_->AddUser(record.mesh, record.name); !s.ok()) return s;
  }
  const std::string mesh = record.mesh, name = record.name;
  {
    absl::MutexLock lock(&mu_);
    if (tensors_.find(name) == tensors_.end()) {
      record.ready = false;
      record.busy_plan = op;
      tensors_.emplace(name, std::move(record));
      return absl::OkStatus();
    }
  }
  if (!mesh.empty()) meshes_->RemoveUser(mesh, name);
  return absl::AlreadyExistsError(absl::StrCat("tensor '", name, "' already exists"));
}

absl::Status TensorManager::FinishCreate(absl::string_view name, const std::string& op,
                                         LayoutChecksums checksums,
                                         absl::flat_hash_map<int64_t, int64_t> incarnations) {
  absl::MutexLock lock(&mu_);
  auto it = tensors_.find(name);
  if (it == tensors_.end() || it->second.ready || it->second.busy_plan != op) {
    return absl::FailedPreconditionError(
        absl::StrCat("tensor '", name, "' is not being created by ", op));
  }
  it->second.ready = true;
  it->second.busy_plan.clear();
  it->second.checksums = std::move(checksums);
  it->second.incarnations = std::move(incarnations);
  return absl::OkStatus();
}

void TensorManager::CancelCreate(absl::string_view name, const std::string& op) {
  std::string mesh;
  {
    absl::MutexLock lock(&mu_);
    auto it = tensors_.find(name);
    if (it == tensors_.end() || it->second.ready || it->second.busy_plan != op) return;
    mesh = it->second.mesh;
    tensors_.erase(it);
  }
  if (!mesh.empty()) meshes_->RemoveUser(mesh, name);
}

absl::StatusOr<TensorRecord> TensorManager::Acquire(absl::string_view name, const std::string& op,
                                                    const std::string& target_mesh) {
  TensorRecord out;
  {
    absl::MutexLock lock(&mu_);
    auto it = tensors_.find(name);
    if (it == tensors_.end() || !it->second.ready) {
      if (it != tensors_.end()) {
        return absl::AbortedError(absl::StrCat("tensor '", name, "' is busy being created"));
      }
      return absl::NotFoundError(absl::StrCat("unknown tensor '", name, "'"));
    }
    if (!it->second.busy_plan.empty()) {
      return absl::AbortedError(
          absl::StrCat("tensor '", name, "' is busy with ", it->second.busy_plan));
    }
    it->second.busy_plan = op;
    out = it->second;
  }
  if (!target_mesh.empty()) {
    if (absl::Status s = meshes_->AddUser(target_mesh, name); !s.ok()) {
      Release(name, op);
      return s;
    }
  }
  return out;
}

void TensorManager::Release(absl::string_view name, const std::string& op,
                            const std::string& target_mesh) {
  {
    absl::MutexLock lock(&mu_);
    auto it = tensors_.find(name);
    if (it == tensors_.end() || it->second.busy_plan != op) return;
    it->second.busy_plan.clear();
  }
  if (!target_mesh.empty()) meshes_->RemoveUser(target_mesh, name);
}

absl::Status TensorManager::Commit(absl::string_view name, const std::string& op, NewState state) {
  std::vector<CommitItem> items;
  items.push_back(CommitItem{std::string(name), op, std::move(state)});
  return CommitAll(std::move(items));
}

absl::Status TensorManager::CommitAll(std::vector<CommitItem> items) {
  std::vector<std::pair<std::string, std::string>> old_meshes;  // (mesh, tensor)
  {
    absl::MutexLock lock(&mu_);
    for (const CommitItem& item : items) {
      auto it = tensors_.find(item.name);
      if (it == tensors_.end() || it->second.busy_plan != item.op) {
        return absl::FailedPreconditionError(
            absl::StrCat("tensor '", item.name, "' is not held by ", item.op));
      }
    }
    for (CommitItem& item : items) {
      TensorRecord& t = tensors_.find(item.name)->second;
      old_meshes.emplace_back(t.mesh, item.name);
      NewState& state = item.state;
      t.mesh = std::move(state.mesh);
      t.spec = std::move(state.spec);
      t.layout = std::move(state.layout);
      t.checksums = std::move(state.checksums);
      t.version = state.version;
      t.incarnations = std::move(state.incarnations);
      t.busy_plan.clear();
    }
  }
  // Each tensor now uses its target mesh (counted at Acquire) instead of the old one.
  for (const auto& [mesh, name] : old_meshes) {
    if (!mesh.empty()) meshes_->RemoveUser(mesh, name);
  }
  return absl::OkStatus();
}

absl::Status TensorManager::UpdateRank(absl::string_view name, const std::string& op, int64_t rank,
                                       ChunkChecksums checksums, int64_t incarnation) {
  absl::MutexLock lock(&mu_);
  auto it = tensors_.find(name);
  if (it == tensors_.end() || it->second.busy_plan != op) {
    return absl::FailedPreconditionError(absl::StrCat("tensor '", name, "' is not held by ", op));
  }
  TensorRecord& t = it->second;
  const std::vector<RankChunks>& ranks = t.layout.ranks();
  for (size_t i = 0; i < ranks.size(); ++i) {
    if (ranks[i].rank != rank) continue;
    if (checksums.size() != ranks[i].chunks.size()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "rank ", rank, " holds ", ranks[i].chunks.size(), " chunks, not ", checksums.size()));
    }
    if (t.checksums.size() != ranks.size()) t.checksums.resize(ranks.size());
    t.checksums[i] = std::move(checksums);
    t.incarnations[rank] = incarnation;
    return absl::OkStatus();
  }
  return absl::NotFoundError(absl::StrCat("rank ", rank, " holds nothing of '", name, "'"));
}

absl::StatusOr<TensorRecord> TensorManager::Get(absl::string_view name) const {
  absl::MutexLock lock(&mu_);
  auto it = tensors_.find(name);
  if (it == tensors_.end() || !it->second.ready) {
    return absl::NotFoundError(absl::StrCat("unknown tensor '", name, "'"));
  }
  return it->second;
}

std::vector<TensorRecord> TensorManager::List() const {
  absl::MutexLock lock(&mu_);
  std::vector<TensorRecord> out;
  for (const auto& [name, t] : tensors_) {
    if (t.ready) out.push_back(t);
  }
  return out;
}

absl::StatusOr<TensorRecord> TensorManager::Remove(absl::string_view name) {
  TensorRecord out;
  {
    absl::MutexLock lock(&mu_);
    auto it = tensors_.find(name);
    if (it == tensors_.end() || !it->second.ready) {
      return absl::NotFoundError(absl::StrCat("unknown tensor '", name, "'"));
    }
    if (!it->second.busy_plan.empty()) {
      return absl::AbortedError(
          absl::StrCat("tensor '", name, "' is busy with ", it->second.busy_plan));
    }
    out = std::move(it->second);
    tensors_.erase(it);
  }
  if (!out.mesh.empty()) meshes_->RemoveUser(out.mesh, out.name);
  return out;
}

}  // namespace shardcoord
