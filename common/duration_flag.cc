#include "common/duration_flag.h"

#include "absl/strings/str_cat.h"

namespace shardcoord {

absl::Status ParseDurationFlag(absl::string_view name, absl::string_view text,
                               absl::Duration* out) {
  absl::Duration d;
  if (!absl::ParseDuration(text, &d) || d <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError(
        absl::StrCat("--", name, ": '", text, "' is not a positive duration (e.g. 60s, 500ms)"));
  }
  *out = d;
  return absl::OkStatus();
}

}  // namespace shardcoord
