#ifndef SHARDCOORD_PROTO_LOCAL_FRAME_H_
#define SHARDCOORD_PROTO_LOCAL_FRAME_H_

// Framing of the local attach protocol (shardcoord.proto, "Local attach protocol"): each
// message is a 4-byte little-endian length, then that many bytes of a serialized message.

#include <cstdint>
#include <optional>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"

namespace shardcoord {

// Largest message either side accepts: an attach is a few hundred bytes (chunk lists grow
// with flat ranges, at most 4096 per rank); an attach_many of a whole model's 100,000
// attachments without chunks about 10 MiB.
constexpr int64_t kMaxLocalFrameBytes = int64_t{64} << 20;

// `payload` with its length prefix.
std::string EncodeLocalFrame(absl::string_view payload);

// Splits a byte stream into payloads.
class LocalFrameReader {
 public:
  void Append(absl::string_view bytes) { buffer_.append(bytes.data(), bytes.size()); }
  // The next complete payload, nullopt when more bytes are needed; INVALID_ARGUMENT for a
  // length over kMaxLocalFrameBytes (the stream cannot be resynchronised: close it).
  absl::StatusOr<std::optional<std::string>> Next();
  // Bytes received but not yet returned.
  size_t pending() const { return buffer_.size(); }

 private:
  std::string buffer_;
};

// Descriptors one sendmsg may carry (the kernel's SCM_MAX_FD).
constexpr int kMaxLocalFdsPerSend = 253;

// Writes `payload` as one frame to the stream socket `socket`, with `fd` (when >= 0) as
// SCM_RIGHTS data of its first bytes. UNAVAILABLE when the peer is gone.
absl::Status SendLocalFrame(int socket, absl::string_view payload, int fd = -1);
// The same with any number of descriptors (an attach_many's, in fd_index order): groups of
// kMaxLocalFdsPerSend, group g with the frame's byte g and the last with the rest.
// INVALID_ARGUMENT when there are more groups than bytes.
absl::Status SendLocalFrameFds(int socket, absl::string_view payload, absl::Span<const int> fds);

// Reads from `socket` until `reader` holds a whole frame and returns its payload (descriptors
// that come with it are not taken: use recvmsg for those). UNAVAILABLE when the peer closed
// first; INVALID_ARGUMENT for a frame over the limit.
absl::StatusOr<std::string> ReceiveLocalFrame(int socket, LocalFrameReader& reader);

}  // namespace shardcoord

#endif  // SHARDCOORD_PROTO_LOCAL_FRAME_H_
