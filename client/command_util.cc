#include "client/command_util.h"

#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "CLI/CLI.hpp"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_replace.h"
#include "absl/strings/strip.h"
#include "absl/time/time.h"
#include "client/coordinator_client.h"
#include "common/json_writer.h"
#include "common/tls_options.h"

namespace shardcoord {

namespace {

// Accepts a repeated global flag only when every occurrence has the same value: with
// fallthrough all occurrences land on the root's one option, and silently keeping the first
// or the last of `--coordinator A ... --coordinator B` would dial a coordinator the user may
// not mean. The validator sees each value in turn; the error names the flag.
CLI::Option* RejectConflictingRepeats(CLI::Option* opt) {
  auto first = std::make_shared<std::string>();
  auto seen = std::make_shared<bool>(false);
  opt->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);
  opt->check(CLI::Validator(
      [first, seen](std::string& value) -> std::string {
        if (!*seen) {
          *seen = true;
          *first = value;
          return "";
        }
        if (value == *first) return "";
        return absl::StrCat("given twice with different values ('", *first, "' and '", value, "')");
      },
      "", "same value if repeated"));
  return opt;
}

}  // namespace

// Global flags are defined once, on the root, and subcommands fall through to it (CLI11's
// fallthrough(), inherited by every subcommand created afterwards): an option a subcommand
// does not know is offered to its parent, then the root. The alternatives are worse: copies
// of the flags on every subcommand would each need their own storage and a merge step, and
// an option group cannot be shared between apps. Help shows them once, on the root.
void AddGlobalFlags(CLI::App* app, ConnectionFlags* flags) {
  app->fallthrough();
  RejectConflictingRepeats(
      app->add_option("--coordinator", flags->coordinator,
                      "Coordinator address host:port, or all of several coordinators on etcd "
                      "(host:port,host:port: calls follow the leader) (default: "
                      "$SHARDCOORD_ADDR, then 127.0.0.1:7400)"))
      ->type_name("HOST:PORT[,...]")
      ->group(kGlobalFlagsGroup);
  RejectConflictingRepeats(
      app->add_option("--token", flags->token,
                      "Bearer token for a coordinator started with --auth-tokens (default: "
                      "$SHARDCOORD_TOKEN; prefer the variable: flags show in `ps`)"))
      ->type_name("TOKEN")
      ->group(kGlobalFlagsGroup);
  RejectConflictingRepeats(
      app->add_option("--tls-ca", flags->tls_ca,
                      "Use TLS, verifying the coordinator with this CA certificate (PEM; "
                      "default: $SHARDCOORD_TLS_CA; neither: plaintext)"))
      ->type_name("FILE")
      ->group(kGlobalFlagsGroup);
  RejectConflictingRepeats(
      app->add_option("--tls-cert", flags->tls_cert,
                      "Client certificate (PEM) for a coordinator that requests one; needs "
                      "--tls-key and a CA"))
      ->type_name("FILE")
      ->group(kGlobalFlagsGroup);
  RejectConflictingRepeats(
      app->add_option("--tls-key", flags->tls_key, "Private key (PEM) of --tls-cert"))
      ->type_name("FILE")
      ->group(kGlobalFlagsGroup);
  RejectConflictingRepeats(
      app->add_option("--wait", flags->wait,
                      "Retry a call the coordinator answers UNAVAILABLE (restarting, recovering, "
                      "a standby: then at the leader) for up to this long, with backoff; changes "
                      "are retried with the same "
                      "request id, so they take effect once; a download resumes where it "
                      "stopped, an upload starts again (0s: no retry; default: "
                      "$SHARDCOORD_WAIT, else 30s)"))
      ->type_name("DURATION")
      ->group(kGlobalFlagsGroup);
  RejectConflictingRepeats(
      app->add_flag("--json", flags->json, "Print one JSON object instead of a table"))
      ->group(kGlobalFlagsGroup);
}

namespace {

void SetFooter(CLI::App* app, const std::string& footer) {
  for (CLI::App* sub : app->get_subcommands({})) {
    sub->footer(footer);
    SetFooter(sub, footer);
  }
}

}  // namespace

void DescribeGlobalFlags(CLI::App* app) {
  std::vector<std::string> names;
  for (const CLI::Option* opt : app->get_options()) {
    if (opt->get_group() != kGlobalFlagsGroup) continue;
    std::string name = opt->get_name();
    if (!opt->get_type_name().empty()) absl::StrAppend(&name, " ", opt->get_type_name());
    names.push_back(std::move(name));
  }
  SetFooter(app, absl::StrCat("Global flags (before or after the subcommand; see ", app->get_name(),
                              " --help):\n  ", absl::StrJoin(names, ", ")));
}

std::string CoordinatorAddress(const ConnectionFlags& flags) {
  return flags.coordinator.empty() ? DefaultCoordinatorAddress() : flags.coordinator;
}

CoordinatorClientOptions ClientOptions(const ConnectionFlags& flags) {
  CoordinatorClientOptions options;
  options.token = flags.token.empty() ? DefaultToken() : flags.token;
  std::string wait_text = flags.wait;
  const char* wait_env = std::getenv("SHARDCOORD_WAIT");
  if (wait_text.empty() && wait_env != nullptr && wait_env[0] != '\0') wait_text = wait_env;
  if (wait_text.empty()) wait_text = "30s";
  absl::Duration wait;
  if (!absl::ParseDuration(wait_text, &wait) || wait < absl::ZeroDuration() ||
      wait == absl::InfiniteDuration()) {
    throw CLI::ValidationError(absl::StrCat(flags.wait.empty() ? "$SHARDCOORD_WAIT" : "--wait",
                                            ": '", wait_text,
                                            "' is not a duration >= 0 (e.g. 30s, 2m, 0s)"));
  }
  options.retry_for = wait;
  TlsFlags tls;
  tls.ca = flags.tls_ca;
  if (tls.ca.empty()) {
    const char* env = std::getenv("SHARDCOORD_TLS_CA");
    if (env != nullptr) tls.ca = env;
  }
  tls.cert = flags.tls_cert;
  tls.key = flags.tls_key;
  absl::StatusOr<TlsOptions> loaded = LoadClientTls(tls);
  if (!loaded.ok()) throw CLI::ValidationError(std::string(loaded.status().message()));
  options.tls = *std::move(loaded);
  return options;
}

std::string StatusLine(const absl::Status& status, absl::string_view address) {
  std::string line =
      absl::StrCat("shardctl: ", absl::StatusCodeToString(status.code()), ": ",
                   absl::StrReplaceAll(status.message(), {{"\r\n", " "}, {"\n", " "}}));
  if (!address.empty() && (status.code() == absl::StatusCode::kUnavailable ||
                           status.code() == absl::StatusCode::kDeadlineExceeded)) {
    absl::StrAppend(&line, " (coordinator ", address, ")");
  }
  return line;
}

void FinishCommand(int rc) {
  if (rc != 0) throw CLI::RuntimeError(rc);
}

int ReportDeleted(std::ostream& out, bool json, absl::string_view kind, absl::string_view name) {
  if (json) {
    JsonWriter w;
    w.BeginObject().Key("deleted").String(name).EndObject();
    out << w.str() << "\n";
  } else {
    out << "deleted " << kind << " '" << name << "'\n";
  }
  return 0;
}

int ReportStatus(std::ostream& err, const absl::Status& status, absl::string_view address) {
  err << StatusLine(status, address) << "\n";
  return kExitServerError;
}

absl::StatusOr<std::string> ReadFlagFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::InvalidArgumentError(absl::StrCat("--from-file: cannot read '", path, "'"));
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

int ReportFlagError(std::ostream& err, absl::string_view command, absl::string_view message) {
  err << "shardctl " << command << ": " << absl::StrReplaceAll(message, {{"\n", " "}}) << "\n";
  return kExitBadFlags;
}

std::string FormatTable(const std::vector<std::vector<std::string>>& rows,
                        const std::vector<int>& right_aligned) {
  std::vector<size_t> width;
  for (const auto& row : rows) {
    if (row.size() > width.size()) width.resize(row.size(), 0);
    for (size_t i = 0; i < row.size(); ++i) width[i] = std::max(width[i], row[i].size());
  }
  std::string out;
  for (const auto& row : rows) {
    std::string line;
    for (size_t i = 0; i < row.size(); ++i) {
      if (i > 0) line += "  ";
      const std::string pad(width[i] - row[i].size(), ' ');
      const bool right = std::find(right_aligned.begin(), right_aligned.end(),
                                   static_cast<int>(i)) != right_aligned.end();
      line += right ? pad + row[i] : row[i] + pad;
    }
    absl::StrAppend(&out, absl::StripTrailingAsciiWhitespace(line), "\n");
  }
  return out;
}

std::string HumanBytes(int64_t bytes) {
  if (bytes < 1024) return absl::StrCat(bytes, " B");
  const char* units[] = {"KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};
  double v = static_cast<double>(bytes) / 1024;
  int u = 0;
  while (v >= 1024 && u < 5) {
    v /= 1024;
    ++u;
  }
  // Two literal formats: clang checks StrFormat's format at compile time.
  if (u >= 1 && v < 10) return absl::StrFormat("%.2f %s", v, units[u]);
  return absl::StrFormat("%.1f %s", v, units[u]);
}

std::string BracketList(const std::vector<int64_t>& values) {
  return absl::StrCat("[", absl::StrJoin(values, ", "), "]");
}

std::string ProgressLine(absl::string_view label, int64_t done, int64_t total, int width) {
  width = std::max(width, 1);
  int filled = 0;
  std::string percent = "   ";
  if (total > 0) {
    const double fraction = std::clamp(static_cast<double>(done) / total, 0.0, 1.0);
    filled = static_cast<int>(fraction * width);
    percent = absl::StrFormat("%3d", static_cast<int>(fraction * 100));
  }
  std::string amount = HumanBytes(done);
  if (total > 0) amount = absl::StrCat(amount, " / ", HumanBytes(total));
  return absl::StrCat(label, " [", std::string(filled, '#'), std::string(width - filled, '.'), "] ",
                      percent, "%  ", amount);
}

ProgressBar::ProgressBar(std::ostream& out, bool enabled, std::string label)
    : out_(out), enabled_(enabled), label_(std::move(label)) {}

ProgressBar::~ProgressBar() { Finish(); }

void ProgressBar::Update(int64_t done, int64_t total) {
  if (!enabled_ || finished_) return;
  std::string line = ProgressLine(label_, done, total);
  if (line == last_) return;
  // Pad over a longer previous line.
  std::string padded = line;
  if (last_.size() > line.size()) padded.append(last_.size() - line.size(), ' ');
  out_ << "\r" << padded << std::flush;
  last_ = std::move(line);
  drawn_ = true;
}

void ProgressBar::Finish() {
  if (finished_) return;
  finished_ = true;
  if (enabled_ && drawn_) out_ << "\n" << std::flush;
}

bool ProgressBar::StderrIsTerminal() { return isatty(STDERR_FILENO) == 1; }

}  // namespace shardcoord
