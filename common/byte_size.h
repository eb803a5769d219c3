#ifndef SHARDCOORD_COMMON_BYTE_SIZE_H_
#define SHARDCOORD_COMMON_BYTE_SIZE_H_

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace shardcoord {

// A byte count as flags take it: an integer or decimal number and an optional unit, with or
// without a space: "1073741824", "512MiB", "4GiB", "1.5GiB", "64KiB", "2G", "10GB". Binary
// units are KiB/MiB/GiB/TiB, their Kubernetes spellings Ki/Mi/Gi/Ti, and the bare K/M/G/T;
// KB/MB/GB/TB are decimal (powers of 1000); "B" or no unit is bytes. Units are
// case-insensitive. Fractions are rounded down to whole bytes. INVALID_ARGUMENT for anything
// else, a negative value, or one beyond int64.
absl::StatusOr<int64_t> ParseByteSize(absl::string_view text);

// ParseByteSize for the flag --`name`: INVALID_ARGUMENT "--<name>: '<text>' is not a byte size
// (e.g. 4GiB, 512MiB, 1073741824)", the one line a main prints before exiting 2; `out` is then
// unchanged.
absl::Status ParseByteSizeFlag(absl::string_view name, absl::string_view text, int64_t* out);

// "512 B", "1.50 KiB", "64.0 MiB", "2.00 GiB": for messages and logs.
std::string FormatBytes(int64_t bytes);

}  // namespace shardcoord

#endif  // SHARDCOORD_COMMON_BYTE_SIZE_H_
