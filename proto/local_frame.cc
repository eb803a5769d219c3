#include "proto/local_frame.h"

#include "absl/strings/str_cat.h"

namespace shardcoord {

std::string EncodeLocalFrame(absl::string_view payload) {
  const uint32_t n = static_cast<uint32_t>(payload.size());
  std::string out;
  out.reserve(4 + payload.size());
  for (int i = 0; i < 4; ++i) out.push_back(static_cast<char>((n >> (8 * i)) & 0xff));
  out.append(payload.data(), payload.size());
  return out;
}

absl::StatusOr<std::optional<std::string>> LocalFrameReader::Next() {
  if (buffer_.size() < 4) return std::nullopt;
  uint32_t n = 0;
  for (int i = 0; i < 4; ++i) n |= uint32_t{static_cast<unsigned char>(buffer_[i])} << (8 * i);
  if (n > kMaxLocalFrameBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("local frame of ", n, " bytes, more than the limit of ", kMaxLocalFrameBytes));
  }
  if (buffer_.size() < 4 + size_t{n}) return std::nullopt;
  std::string payload = buffer_.substr(4, n);
  buffer_.erase(0, 4 + size_t{n});
  return payload;
}

}  // namespace shardcoord
