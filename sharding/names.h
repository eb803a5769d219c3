#ifndef SHARDCOORD_SHARDING_NAMES_H_
#define SHARDCOORD_SHARDING_NAMES_H_

// What a mesh, tensor or worker may be called (issue 15: bounds on what a client controls).

#include <cstddef>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"

namespace shardcoord {

// Mesh and tensor names.
inline constexpr size_t kMaxNameBytes = 256;

// A mesh or tensor name: 1 to kMaxNameBytes of letters, digits and `_ . - : /` (names end
// up in logs, metrics labels of nothing, file names of checkpoints and shell commands).
// INVALID_ARGUMENT "<field>: ..." naming the limit or the first bad character otherwise.
absl::Status ValidateName(absl::string_view name, absl::string_view field = "name");

// Worker names.
inline constexpr size_t kMaxWorkerNameBytes = 253;

// A worker name: 1 to kMaxWorkerNameBytes of letters, digits and `_ . - :`, starting with a
// letter or digit (a host name, a pod name, or the default "host:pid"; it names the worker's
// certificate and its "{name}" in flags, so no '/'). INVALID_ARGUMENT "<field>: ..." else.
absl::Status ValidateWorkerName(absl::string_view name, absl::string_view field = "name");

}  // namespace shardcoord

#endif  // SHARDCOORD_SHARDING_NAMES_H_
