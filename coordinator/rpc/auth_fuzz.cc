// Fuzzes the coordinator's --auth-tokens parser and the bearer-token checks: the input is a
// tokens file. Parse must only ever return statuses; an error names "tokens:LINE" with a line
// of the input; an accepted file authorises the token "fuzz" (whose hash a line may hold)
// only with OK, UNAUTHENTICATED or PERMISSION_DENIED for every RPC, and BearerToken of any
// input line returns a non-empty token or UNAUTHENTICATED.

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"
#include "coordinator/rpc/auth.h"

namespace {

void Check(bool ok, const char* what) {
  if (!ok) {
    std::fprintf(stderr, "auth_fuzz: %s\n", what);
    std::abort();
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace shardcoord;
  const absl::string_view file(reinterpret_cast<const char*>(data), size);
  const std::vector<absl::string_view> lines = absl::StrSplit(file, '\n');

  for (absl::string_view line : lines) {
    absl::StatusOr<std::string> token = BearerToken(line);
    Check(
        token.ok() ? !token->empty() : token.status().code() == absl::StatusCode::kUnauthenticated,
        "BearerToken: empty token or wrong code");
  }

  absl::StatusOr<Authenticator> auth = Authenticator::Parse(file, "tokens");
  if (!auth.ok()) {
    Check(auth.status().code() == absl::StatusCode::kInvalidArgument,
          "Parse: not INVALID_ARGUMENT");
    const absl::string_view message = auth.status().message();
    Check(absl::StartsWith(message, "tokens:"), "Parse: error does not name the file");
    const absl::string_view rest = message.substr(7);
    int line = 0;
    Check(absl::SimpleAtoi(rest.substr(0, rest.find(':')), &line), "Parse: no line number");
    Check(line >= 1 && static_cast<size_t>(line) <= lines.size(), "Parse: line out of range");
    return 0;
  }
  Check(auth->size() <= lines.size(), "Parse: more tokens than lines");
  for (const RpcRule& rule : RpcRoleTable()) {
    for (absl::string_view token : {absl::string_view("fuzz"), absl::string_view()}) {
      absl::StatusOr<Caller> caller = auth->Authorize(rule.method, token);
      const absl::StatusCode code = caller.status().code();
      Check(code == absl::StatusCode::kOk || code == absl::StatusCode::kUnauthenticated ||
                code == absl::StatusCode::kPermissionDenied,
            "Authorize: unexpected code");
      Check(!token.empty() || code == absl::StatusCode::kUnauthenticated,
            "Authorize: empty token accepted");
    }
  }
  return 0;
}
