#ifndef SHARDCOORD_CLIENT_COMMAND_UTIL_H_
#define SHARDCOORD_CLIENT_COMMAND_UTIL_H_

// Pieces shared by the shardctl subcommands: the global flags (--coordinator, --json),
// one-line error reporting with the exit codes the CLI promises, text tables and a progress
// bar. Formatting is free of I/O decisions so it is unit-tested.

#include <cstdint>
#include <ostream>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "client/coordinator_client.h"

namespace CLI {
class App;
}  // namespace CLI

namespace shardcoord {

// Exit statuses of shardctl: 1 when the coordinator (or the local file system) refused,
// 2 for bad flags.
inline constexpr int kExitServerError = 1;
inline constexpr int kExitBadFlags = 2;

// The global flags, defined once on the root app and read by every subcommand.
struct ConnectionFlags {
  std::string coordinator;  // host:port; empty = DefaultCoordinatorAddress().
  bool json = false;
  std::string token;     // Bearer token; empty = DefaultToken() ($SHARDCOORD_TOKEN).
  std::string tls_ca;    // CA file; empty = $SHARDCOORD_TLS_CA; neither: plaintext.
  std::string tls_cert;  // Client certificate file (needs tls_key and a CA).
  std::string tls_key;
  std::string wait;  // How long to retry UNAVAILABLE; empty = $SHARDCOORD_WAIT, else 30s.
};

// Adds the global flags --coordinator, --token and --json to the root `app`, writing into `flags`
// (which must outlive the app), and makes every subcommand added to `app` afterwards accept
// them before or after its name, at any depth: `shardctl --json tensor list`,
// `shardctl tensor --json list` and `shardctl tensor list --json` are the same command.
// A global flag given twice with different values is a usage error naming the flag.
// Call before adding subcommands; call DescribeGlobalFlags after.
void AddGlobalFlags(CLI::App* app, ConnectionFlags* flags);

// Names the global flags (the root's options in kGlobalFlagsGroup) in the help of every
// subcommand under the root `app` (CLI11 prints only a command's own options), pointing to
// `shardctl --help` for their description.
void DescribeGlobalFlags(CLI::App* app);

// The help group of the global flags; main() puts --version in it too.
inline constexpr char kGlobalFlagsGroup[] = "Global flags (before or after the subcommand)";

// The address to dial: the flag, else $SHARDCOORD_ADDR, else 127.0.0.1:7400.
std::string CoordinatorAddress(const ConnectionFlags& flags);

// Client options carrying the token to send (the flag, else $SHARDCOORD_TOKEN, else none)
// and the TLS material (--tls-ca, else $SHARDCOORD_TLS_CA; --tls-cert, --tls-key). A TLS
// file that cannot be used throws CLI::ValidationError naming the flag and the path (a usage
// error: status 2).
CoordinatorClientOptions ClientOptions(const ConnectionFlags& flags);

// "shardctl: NOT_FOUND: tensor 'x' does not exist" on one line (newlines in the message
// become spaces); for UNAVAILABLE and DEADLINE_EXCEEDED the address is appended, since the
// usual cause is a coordinator that is not running there. Returns kExitServerError.
int ReportStatus(std::ostream& err, const absl::Status& status, absl::string_view address = "");

// A subcommand's outcome: a non-zero exit code ends shardctl with it (CLI::RuntimeError).
void FinishCommand(int rc);

// What a delete prints: {"deleted": NAME} with --json, else "deleted KIND 'NAME'". Returns 0.
int ReportDeleted(std::ostream& out, bool json, absl::string_view kind, absl::string_view name);
// "shardctl <command>: <message>" for a flag problem. Returns kExitBadFlags.
int ReportFlagError(std::ostream& err, absl::string_view command, absl::string_view message);

// The whole file at `path` (a --from-file flag's).
absl::StatusOr<std::string> ReadFlagFile(const std::string& path);
// A --from-file's request: `parse` of the file's text; the errors say "--from-file: cannot
// read 'PATH'" or "--from-file PATH: <parse's message>".
template <typename Parse>
auto ParseFlagFile(const std::string& path, Parse parse) -> decltype(parse(std::string())) {
  absl::StatusOr<std::string> text = ReadFlagFile(path);
  if (!text.ok()) return text.status();
  auto request = parse(*text);
  if (!request.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("--from-file ", path, ": ", request.status().message()));
  }
  return request;
}

// The one-line form ReportStatus prints (without the trailing newline).
std::string StatusLine(const absl::Status& status, absl::string_view address = "");

// Columns padded to their widest cell, two spaces apart, trailing spaces trimmed. Columns
// whose index is in `right_aligned` are right-aligned (numbers).
std::string FormatTable(const std::vector<std::vector<std::string>>& rows,
                        const std::vector<int>& right_aligned = {});

// "512 B", "1.5 KiB", "4.0 MiB", "2.00 GiB".
std::string HumanBytes(int64_t bytes);

// "[0, 4]" for lists of ints.
std::string BracketList(const std::vector<int64_t>& values);

// One progress line: "label [#########...........]  45%  1.8/4.0 MiB". `width` is the bar's
// width in characters. total <= 0 shows an empty bar and the bytes done.
std::string ProgressLine(absl::string_view label, int64_t done, int64_t total, int width = 30);

// Draws ProgressLine on a terminal, redrawing in place with '\r'; does nothing when disabled
// (stderr is not a terminal), so scripts and logs get no control characters.
class ProgressBar {
 public:
  ProgressBar(std::ostream& out, bool enabled, std::string label);
  ~ProgressBar();  // Finish().

  void Update(int64_t done, int64_t total);
  // Ends the line (once), leaving the last state visible.
  void Finish();

  // True when stderr is a terminal.
  static bool StderrIsTerminal();

 private:
  std::ostream& out_;
  bool enabled_;
  std::string label_;
  std::string last_;  // Identical redraws are skipped.
  bool drawn_ = false;
  bool finished_ = false;
};

}  // namespace shardcoord

#endif  // SHARDCOORD_CLIENT_COMMAND_UTIL_H_
