#ifndef SHARDCOORD_COMMON_DURATION_FLAG_H_
#define SHARDCOORD_COMMON_DURATION_FLAG_H_

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"

namespace shardcoord {

// Parses `text`, the value of the flag --`name`, as a positive duration in absl's syntax
// ("60s", "500ms", "2m") into `out`. INVALID_ARGUMENT "--<name>: '<text>' is not a positive
// duration (e.g. 60s, 500ms)" otherwise, the one line a main prints before exiting 2; `out`
// is then unchanged.
absl::Status ParseDurationFlag(absl::string_view name, absl::string_view text, absl::Duration* out);

}  // namespace shardcoord

#endif  // SHARDCOORD_COMMON_DURATION_FLAG_H_
