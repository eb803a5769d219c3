#include "client/token_command.h"

#include <iostream>
#include <iterator>
#include <string>

#include "CLI/CLI.hpp"
#include "client/command_util.h"
#include "common/sha256.h"

namespace shardcoord {

int RunTokenHashCommand(std::istream& in, std::ostream& out, std::ostream& err) {
  const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const absl::string_view token = TrimToken(text);
  if (token.empty()) return ReportFlagError(err, "token hash", "no token on stdin");
  out << Sha256Hex(token) << "\n";
  return 0;
}

void AddTokenCommand(CLI::App& app) {
  CLI::App* token = app.add_subcommand("token", "Bearer tokens for --auth-tokens");
  token->require_subcommand(1);
  CLI::App* hash = token->add_subcommand(
      "hash",
      "Read a token from stdin and print its hex SHA-256, the third field of a line "
      "'ROLE NAME SHA256HEX' of the coordinator's --auth-tokens file (trailing newlines and "
      "spaces are not part of the token): head -c 32 /dev/urandom | base64 > tok; "
      "shardctl token hash < tok");
  hash->callback([]() {
    const int rc = RunTokenHashCommand(std::cin, std::cout, std::cerr);
    if (rc != 0) throw CLI::RuntimeError(rc);
  });
}

}  // namespace shardcoord
