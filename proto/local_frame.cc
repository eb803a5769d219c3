#include "proto/local_frame.h"

#include <sys/socket.h>

#include <cerrno>
#include <cstring>

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

absl::Status SendLocalFrame(int socket, absl::string_view payload, int fd) {
  const std::string frame = EncodeLocalFrame(payload);
  size_t sent = 0;
  while (sent < frame.size()) {
    iovec iov{const_cast<char*>(frame.data() + sent), frame.size() - sent};
    msghdr msg{};
    msg.msg_iov = &iov;
    msg.msg_iovlen = 1;
    char control[CMSG_SPACE(sizeof(int))] = {};
    if (fd >= 0 && sent == 0) {  // The descriptor travels with the first bytes.
      msg.msg_control = control;
      msg.msg_controllen = sizeof(control);
      cmsghdr* c = CMSG_FIRSTHDR(&msg);
      c->cmsg_level = SOL_SOCKET;
      c->cmsg_type = SCM_RIGHTS;
      c->cmsg_len = CMSG_LEN(sizeof(int));
      std::memcpy(CMSG_DATA(c), &fd, sizeof(int));
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
