#include "common/sha256.h"

#include <openssl/sha.h>

#include "absl/strings/escaping.h"
#include "absl/strings/strip.h"

namespace shardcoord {

Sha256Digest Sha256(absl::string_view data) {
  Sha256Digest digest;
  SHA256(reinterpret_cast<const uint8_t*>(data.data()), data.size(), digest.data());
  return digest;
}

std::string Sha256Hex(absl::string_view data) {
  const Sha256Digest digest = Sha256(data);
  return absl::BytesToHexString(
      absl::string_view(reinterpret_cast<const char*>(digest.data()), digest.size()));
}

absl::string_view TrimToken(absl::string_view text) {
  while (!text.empty() && (text.back() == '\n' || text.back() == '\r' || text.back() == ' ' ||
                           text.back() == '\t')) {
    text.remove_suffix(1);
  }
  return text;
}

}  // namespace shardcoord
