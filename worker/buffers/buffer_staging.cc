#include "worker/buffers/buffer_staging.h"

#include <algorithm>
#include <vector>

#include "absl/strings/str_cat.h"

namespace shardcoord {

absl::Status CopyBufferBytes(const HostBuffer& from, HostBuffer& to) {
  if (from.bytes() != to.bytes()) {
    return absl::InvalidArgumentError(
        absl::StrCat("copying a buffer of ", from.bytes(), " bytes into one of ", to.bytes()));
  }
  MemorySpace& src = from.space();
  MemorySpace& dst = to.space();
  if (absl::Status s = src.Synchronize(); !s.ok()) return s;
  if (src.is_host()) return dst.CopyFromHost(to.data(), from.data(), from.bytes());
  if (dst.is_host()) return src.CopyToHost(to.data(), from.data(), from.bytes());
  constexpr int64_t kPiece = int64_t{8} << 20;
  std::vector<char> staging(static_cast<size_t>(std::min(kPiece, from.bytes())));
  for (int64_t off = 0; off < from.bytes(); off += kPiece) {
    const int64_t n = std::min(kPiece, from.bytes() - off);
    if (absl::Status s = src.CopyToHost(staging.data(), from.data() + off, n); !s.ok()) return s;
    if (absl::Status s = dst.CopyFromHost(to.data() + off, staging.data(), n); !s.ok()) return s;
  }
  return absl::OkStatus();
}

absl::StatusOr<std::shared_ptr<HostBuffer>> BufferIn(std::shared_ptr<HostBuffer> buffer,
                                                     MemorySpace* space) {
  if (&buffer->space() == space) return buffer;
  absl::StatusOr<std::shared_ptr<HostBuffer>> copy =
      HostBuffer::Create(buffer->dtype(), buffer->chunks(), space);
  if (!copy.ok()) return copy.status();
  if (absl::Status s = CopyBufferBytes(*buffer, **copy); !s.ok()) return s;
  return copy;
}

}  // namespace shardcoord
