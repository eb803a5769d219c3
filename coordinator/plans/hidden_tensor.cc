#include "coordinator/plans/hidden_tensor.h"

#include <utility>

#include "absl/container/flat_hash_map.h"

namespace shardcoord {

absl::StatusOr<WorkerEndpoint> LiveEndpoint(const WorkerManager& workers, int64_t rank) {
  absl::StatusOr<WorkerRecord> w = workers.GetByRank(rank);
  if (!w.ok()) return w.status();
  if (!w->alive) return w->DeadError("is dead");
  return w->Endpoint();
}

absl::Status AddHiddenTensor(TensorManager* tensors, const WorkerManager& workers,
                             const std::string& owner, const std::string& name, DType dtype,
                             const Layout& layout, int64_t version, const std::string& spec,
                             LayoutChecksums checksums, std::vector<std::string>* reserved) {
  TensorRecord rec;
  rec.name = name;
  rec.shape = layout.global_shape();
  rec.dtype = dtype;
  rec.spec = spec;
  rec.layout = layout;
  rec.version = version;
  rec.owner = owner;
  absl::flat_hash_map<int64_t, int64_t> holders;
  for (const RankChunks& rc : layout.ranks()) {
    absl::StatusOr<WorkerEndpoint> e = LiveEndpoint(workers, rc.rank);
    if (!e.ok()) return e.status();
    holders[rc.rank] = e->incarnation;
  }
  if (checksums.empty()) {
    for (const RankChunks& rc : layout.ranks()) checksums.emplace_back(rc.chunks.size(), 0);
  }
  if (absl::Status s = tensors->Reserve(std::move(rec), owner); !s.ok()) return s;
  reserved->push_back(name);
  return tensors->FinishCreate(name, owner, std::move(checksums), std::move(holders));
}

}  // namespace shardcoord
