#ifndef SHARDCOORD_COORDINATOR_CLUSTER_MESH_MANAGER_H_
#define SHARDCOORD_COORDINATOR_CLUSTER_MESH_MANAGER_H_

#include <cstdint>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "coordinator/cluster/worker_manager.h"
#include "coordinator/store/state_store.h"
#include "sharding/box.h"
#include "sharding/mesh.h"

namespace shardcoord {

// A named device mesh over workers: position i holds workers[i], whose global rank is
// mesh.ranks()[i].
struct MeshRecord {
  std::string name;
  DeviceMesh mesh;
  std::vector<std::string> workers;
};

// Named meshes over registered workers. A mesh cannot be deleted while tensors (or plans
// moving a tensor onto it) use it: TensorManager counts users with AddUser / RemoveUser.
// Thread-safe.
class MeshManager {
 public:
  // `store` (not owned; null: nothing is stored) keeps every mesh ("mesh" records,
  // MeshInfo); Create and Delete return once the change is stored.
  explicit MeshManager(const WorkerManager* workers, StateStore* store = nullptr)
      : workers_(workers), store_(store) {}

  // Loads the stored meshes (call once, before serving). INTERNAL for a record that does
  // not parse or does not make a mesh.
  absl::Status Load();

  // INVALID_ARGUMENT empty name, a dim < 1, dim names that do not fit, repeated workers, or
  // a worker list whose length is not the mesh size; ALREADY_EXISTS; NOT_FOUND unknown
  // worker; FAILED_PRECONDITION a dead worker or too few live workers; the store's error
  // (UNAVAILABLE) when it could not be stored. An empty worker
  // list takes the first size() live workers in rank order.
  absl::StatusOr<MeshRecord> Create(const std::string& name, const Shape& shape,
                                    const std::vector<std::string>& dim_names,
                                    const std::vector<std::string>& workers);
  absl::StatusOr<MeshRecord> Get(absl::string_view name) const;
  // By name.
  std::vector<MeshRecord> List() const;
  // NOT_FOUND; FAILED_PRECONDITION while in use (the message names the users).
  absl::Status Delete(absl::string_view name);

  // NOT_FOUND when the mesh does not exist. A user may be added more than once.
  absl::Status AddUser(absl::string_view mesh, absl::string_view user);
  void RemoveUser(absl::string_view mesh, absl::string_view user);

 private:
  struct Entry {
    MeshRecord record;
    std::multiset<std::string> users;
  };

  const WorkerManager* const workers_;
  StateStore* const store_;
  mutable absl::Mutex mu_;
  std::map<std::string, Entry, std::less<>> meshes_ ABSL_GUARDED_BY(mu_);
};

}  // namespace shardcoord

#endif  // SHARDCOORD_COORDINATOR_CLUSTER_MESH_MANAGER_H_
