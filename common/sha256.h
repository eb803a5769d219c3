#ifndef SHARDCOORD_COMMON_SHA256_H_
#define SHARDCOORD_COMMON_SHA256_H_

// SHA-256 from OpenSSL's libcrypto: bearer tokens are stored and compared as their hashes
// (coordinator/rpc/auth.h) and `shardctl token hash` prints one.

#include <array>
#include <cstdint>
#include <string>

#include "absl/strings/string_view.h"

namespace shardcoord {

using Sha256Digest = std::array<uint8_t, 32>;

Sha256Digest Sha256(absl::string_view data);

// Lowercase hex SHA-256 of `data` (64 characters).
std::string Sha256Hex(absl::string_view data);

// A token as read from a file or stdin: without trailing spaces, tabs, CR and LF (what
// `echo` and editors append), so `echo TOKEN | shardctl token hash` and a token file
// written by an editor give the token itself.
absl::string_view TrimToken(absl::string_view text);

}  // namespace shardcoord

#endif  // SHARDCOORD_COMMON_SHA256_H_
