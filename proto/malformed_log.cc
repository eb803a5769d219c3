#include "proto/malformed_log.h"

#include <memory>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/rate_limit.h"
#include "google/protobuf/stubs/logging.h"
#include "spdlog/spdlog.h"

namespace shardcoord {
namespace {

constexpr int64_t kLinesPerWindow = 20;
constexpr absl::Duration kWindow = absl::Minutes(1);

std::string Suppressed(int64_t n) {
  return n > 0 ? absl::StrCat(" (", n, " similar lines suppressed before this one)") : "";
}

void ProtobufLogHandler(google::protobuf::LogLevel level, const char* filename, int line,
                        const std::string& message) {
  static RateLimit* const limit = new RateLimit(kLinesPerWindow, kWindow);
  if (level == google::protobuf::LOGLEVEL_FATAL) {  // libprotobuf aborts next: always say why.
    spdlog::critical("libprotobuf {}:{}: {}", filename, line, message);
    return;
  }
  int64_t suppressed = 0;
  if (!limit->Allow(absl::Now(), &suppressed)) return;
  spdlog::warn("libprotobuf {}:{}: {}{}", filename, line, message, Suppressed(suppressed));
}

}  // namespace

void RouteProtobufLogsToSpdlog() { google::protobuf::SetLogHandler(&ProtobufLogHandler); }

MalformedCallFn LogMalformedCallsRateLimited() {
  auto limit = std::make_shared<RateLimit>(kLinesPerWindow, kWindow);
  return [limit](const std::string& method, const std::string& peer, const grpc::Status& s) {
    int64_t suppressed = 0;
    if (!limit->Allow(absl::Now(), &suppressed)) return;
    spdlog::warn("{} from {} answered {}: {}{}", method, peer, RpcCodeName(s.error_code()),
                 s.error_message().empty() ? "the request could not be parsed or names no method"
                                           : s.error_message(),
                 Suppressed(suppressed));
  };
}

}  // namespace shardcoord
