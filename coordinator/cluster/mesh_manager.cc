#include "coordinator/cluster/mesh_manager.h"

#include <set>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "proto/shardcoord.pb.h"

namespace shardcoord {
namespace {

constexpr char kMeshKind[] = "mesh";

std::string SerializeMesh(const MeshRecord& m) {
  v1::MeshInfo out;
  out.set_name(m.name);
  for (int64_t d : m.mesh.shape()) out.add_shape(d);
  for (const std::string& d : m.mesh.dim_names()) out.add_dim_names(d);
  for (int64_t r : m.mesh.ranks()) out.add_ranks(r);
  for (const std::string& w : m.workers) out.add_workers(w);
  return out.SerializeAsString();
}

}  // namespace

absl::Status MeshManager::Load() {
  if (store_ == nullptr) return absl::OkStatus();
  absl::StatusOr<std::vector<StateRecord>> records = store_->Load(kMeshKind);
  if (!records.ok()) return records.status();
  absl::MutexLock lock(&mu_);
  for (const StateRecord& r : *records) {
    v1::MeshInfo info;
    if (!info.ParseFromString(r.value) || info.name() != r.name) {
      return absl::InternalError(absl::StrCat("state store: bad mesh record '", r.name, "'"));
    }
    absl::StatusOr<DeviceMesh> mesh = DeviceMesh::Create(
        Shape(info.shape().begin(), info.shape().end()),
        std::vector<int64_t>(info.ranks().begin(), info.ranks().end()),
        std::vector<std::string>(info.dim_names().begin(), info.dim_names().end()));
    if (!mesh.ok()) {
      return absl::InternalError(absl::StrCat("state store: mesh '", r.name,
                                              "' does not load: ", mesh.status().message()));
    }
    MeshRecord& m = meshes_[r.name].record;
    m.name = r.name;
    m.mesh = *std::move(mesh);
    m.workers.assign(info.workers().begin(), info.workers().end());
  }
  return absl::OkStatus();
}

absl::StatusOr<MeshRecord> MeshManager::Create(const std::string& name, const Shape& shape,
                                               const std::vector<std::string>& dim_names,
                                               const std::vector<std::string>& workers) {
  if (name.empty()) return absl::InvalidArgumentError("name: empty");
  if (shape.empty()) return absl::InvalidArgumentError("shape: empty (a mesh has >= 1 dim)");
  for (size_t i = 0; i < shape.size(); ++i) {
    if (shape[i] < 1) {
      return absl::InvalidArgumentError(
          absl::StrCat("shape[", i, "] = ", shape[i], " must be >= 1"));
    }
  }
  absl::StatusOr<int64_t> size = CheckedProduct(shape);
  if (!size.ok())
    return absl::InvalidArgumentError(absl::StrCat("shape: ", size.status().message()));
  if (!dim_names.empty() && dim_names.size() != shape.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("dim_names: ", dim_names.size(), " names for a ", shape.size(), "-d mesh"));
  }

  MeshRecord record;
  record.name = name;
  std::vector<int64_t> ranks;
  if (workers.empty()) {
    for (const WorkerRecord& w : workers_->List()) {
      if (static_cast<int64_t>(ranks.size()) == *size) break;
      if (!w.alive) continue;
      ranks.push_back(w.rank);
      record.workers.push_back(w.spec.name);
    }
    if (static_cast<int64_t>(ranks.size()) < *size) {
      return absl::FailedPreconditionError(absl::StrCat("mesh ", ShapeToString(shape), " needs ",
                                                        *size, " workers but ", ranks.size(),
                                                        " are alive"));
    }
  } else {
    if (static_cast<int64_t>(workers.size()) != *size) {
      return absl::InvalidArgumentError(
          absl::StrCat("workers: ", workers.size(), " given for a mesh of ", *size, " positions"));
    }
    std::set<std::string> seen;
    for (size_t i = 0; i < workers.size(); ++i) {
      if (!seen.insert(workers[i]).second) {
        return absl::InvalidArgumentError(
            absl::StrCat("workers[", i, "]: '", workers[i], "' is listed twice"));
      }
      absl::StatusOr<WorkerRecord> w = workers_->Get(workers[i]);
      if (!w.ok()) return w.status();
      if (!w->alive) return w->DeadError("is dead");
      ranks.push_back(w->rank);
      record.workers.push_back(workers[i]);
    }
  }
  absl::StatusOr<DeviceMesh> mesh = DeviceMesh::Create(shape, ranks, dim_names);
  if (!mesh.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("mesh: ", mesh.status().message()));
  }
  record.mesh = *std::move(mesh);

  absl::MutexLock lock(&mu_);
  if (meshes_.find(name) != meshes_.end()) {
    return absl::AlreadyExistsError(absl::StrCat("mesh '", name, "' already exists"));
  }
  if (store_ != nullptr) {
    if (absl::Status s = store_->Put(kMeshKind, name, SerializeMesh(record)); !s.ok()) return s;
  }
  meshes_[name].record = record;
  return record;
}

absl::StatusOr<MeshRecord> MeshManager::Get(absl::string_view name) const {
  absl::MutexLock lock(&mu_);
  auto it = meshes_.find(name);
  if (it == meshes_.end()) return absl::NotFoundError(absl::StrCat("unknown mesh '", name, "'"));
  return it->second.record;
}

std::vector<MeshRecord> MeshManager::List() const {
  absl::MutexLock lock(&mu_);
  std::vector<MeshRecord> out;
  for (const auto& [name, e] : meshes_) out.push_back(e.record);
  return out;
}

absl::Status MeshManager::Delete(absl::string_view name) {
  absl::MutexLock lock(&mu_);
  auto it = meshes_.find(name);
  if (it == meshes_.end()) return absl::NotFoundError(absl::StrCat("unknown mesh '", name, "'"));
  if (!it->second.users.empty()) {
    std::set<std::string> users(it->second.users.begin(), it->second.users.end());
    return absl::FailedPreconditionError(absl::StrCat("mesh '", name, "' is in use by tensor",
                                                      users.size() > 1 ? "s " : " ",
                                                      absl::StrJoin(users, ", ")));
  }
  if (store_ != nullptr) {
    if (absl::Status s = store_->Delete(kMeshKind, it->first); !s.ok()) return s;
  }
  meshes_.erase(it);
  return absl::OkStatus();
}

absl::Status MeshManager::AddUser(absl::string_view mesh, absl::string_view user) {
  absl::MutexLock lock(&mu_);
  auto it = meshes_.find(mesh);
  if (it == meshes_.end()) return absl::NotFoundError(absl::StrCat("unknown mesh '", mesh, "'"));
  it->second.users.insert(std::string(user));
  return absl::OkStatus();
}

void MeshManager::RemoveUser(absl::string_view mesh, absl::string_view user) {
  absl::MutexLock lock(&mu_);
  auto it = meshes_.find(mesh);
  if (it == meshes_.end()) return;
  auto u = it->second.users.find(std::string(user));
  if (u != it->second.users.end()) it->second.users.erase(u);
}

}  // namespace shardcoord
