#include "proto/local_frame.h"

#include <sys/socket.h>

#include <cerrno>
#include <cstring>
#include <vector>

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

namespace {

// Sends frame[from, to), `fds` as SCM_RIGHTS data of its first byte.
absl::Status SendPiece(int socket, const std::string& frame, size_t from, size_t to,
                       absl::Span<const int> fds) {
  std::vector<char> control(fds.empty() ? 0 : CMSG_SPACE(sizeof(int) * fds.size()));
  size_t sent = from;
  while (sent < to) {
    iovec iov{const_cast<char*>(frame.data() + sent), to - sent};
    msghdr msg{};
    msg.msg_iov = &iov;
    msg.msg_iovlen = 1;
    if (!fds.empty() && sent == from) {  // The descriptors travel with the first byte.
      msg.msg_control = control.data();
      msg.msg_controllen = control.size();
      cmsghdr* c = CMSG_FIRSTHDR(&msg);
      c->cmsg_level = SOL_SOCKET;
      c->cmsg_type = SCM_RIGHTS;
      c->cmsg_len = CMSG_LEN(sizeof(int) * fds.size());
      std::memcpy(CMSG_DATA(c), fds.data(), sizeof(int) * fds.size());
    }
    const ssize_t n = sendmsg(socket, &msg, MSG_NOSIGNAL);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      return absl::UnavailableError(absl::StrCat("sending a local frame: ", std::strerror(errno)));
    }
    sent += static_cast<size_t>(n);
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status SendLocalFrame(int socket, absl::string_view payload, int fd) {
  if (fd < 0) return SendLocalFrameFds(socket, payload, {});
  return SendLocalFrameFds(socket, payload, absl::MakeConstSpan(&fd, 1));
}

absl::Status SendLocalFrameFds(int socket, absl::string_view payload, absl::Span<const int> fds) {
  const std::string frame = EncodeLocalFrame(payload);
  const size_t groups = (fds.size() + kMaxLocalFdsPerSend - 1) / kMaxLocalFdsPerSend;
  if (groups > frame.size()) {
    return absl::InvalidArgumentError(absl::StrCat(fds.size(), " descriptors need ", groups,
                                                   " sends, more than the frame's ", frame.size(),
                                                   " bytes"));
  }
  for (size_t g = 0; g + 1 < groups; ++g) {
    if (absl::Status s = SendPiece(socket, frame, g, g + 1,
                                   fds.subspan(g * kMaxLocalFdsPerSend, kMaxLocalFdsPerSend));
        !s.ok()) {
      return s;
    }
  }
  const size_t last = groups == 0 ? 0 : groups - 1;
  return SendPiece(socket, frame, last, frame.size(), fds.subspan(last * kMaxLocalFdsPerSend));
}

absl::StatusOr<std::string> ReceiveLocalFrame(int socket, LocalFrameReader& reader) {
  char buf[4096];
  while (true) {
    absl::StatusOr<std::optional<std::string>> next = reader.Next();
    if (!next.ok()) return next.status();
    if (next->has_value()) return **std::move(next);
    const ssize_t n = recv(socket, buf, sizeof(buf), 0);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return absl::UnavailableError("the other end closed the local socket");
    reader.Append(absl::string_view(buf, static_cast<size_t>(n)));
  }
}

}  // namespace shardcoord
