#include "proto/grpc_status.h"

#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"

namespace shardcoord {

absl::Status FromGrpcStatus(const grpc::Status& status) {
  if (status.ok()) return absl::OkStatus();
  const int code = static_cast<int>(status.error_code());
  const absl::StatusCode absl_code =
      code >= 1 && code <= 16 ? static_cast<absl::StatusCode>(code) : absl::StatusCode::kUnknown;
  return absl::Status(absl_code, status.error_message());
}

grpc::Status ToGrpcStatus(const absl::Status& status) {
  if (status.ok()) return grpc::Status::OK;
  const grpc::StatusCode code = static_cast<grpc::StatusCode>(status.code());
  const absl::string_view message = status.message();
  if (message.size() <= kMaxGrpcStatusMessageBytes) return grpc::Status(code, std::string(message));
  const std::string suffix = absl::StrCat("... (cut from ", message.size(), " bytes)");
  size_t keep = kMaxGrpcStatusMessageBytes - suffix.size();
  // Not inside a UTF-8 sequence: back off over continuation bytes (10xxxxxx).
  while (keep > 0 && (static_cast<unsigned char>(message[keep]) & 0xC0) == 0x80) --keep;
  return grpc::Status(code, absl::StrCat(message.substr(0, keep), suffix));
}

}  // namespace shardcoord
