#ifndef SHARDCOORD_SHARDING_FIELD_STATUS_H_
#define SHARDCOORD_SHARDING_FIELD_STATUS_H_

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"

namespace shardcoord {
// INVALID_ARGUMENT errors that name the field they are about ("layout.chunks[2].box: ..."),
// shared by the checks in sharding/ and the conversions in proto/ so both word them alike.
// Callers bring them in with `using field_status::Bad;` etc.
namespace field_status {

template <typename... Args>
absl::Status Bad(absl::string_view field, const Args&... args) {
  return absl::InvalidArgumentError(absl::StrCat(field, ": ", args...));
}

// Keeps the code, puts the field in front of the message.
inline absl::Status Prefixed(absl::string_view field, const absl::Status& s) {
  if (s.ok()) return s;
  return absl::Status(s.code(), absl::StrCat(field, ": ", s.message()));
}

inline std::string Sub(absl::string_view field, absl::string_view member) {
  return absl::StrCat(field, ".", member);
}
inline std::string Index(absl::string_view field, int64_t i) {
  return absl::StrCat(field, "[", i, "]");
}

}  // namespace field_status
}  // namespace shardcoord

#endif  // SHARDCOORD_SHARDING_FIELD_STATUS_H_
