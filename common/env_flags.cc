#include "common/env_flags.h"

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"

namespace shardcoord {

std::string EnvNameOf(absl::string_view prefix, absl::string_view long_name) {
  return absl::StrCat(prefix, absl::AsciiStrToUpper(absl::StrReplaceAll(long_name, {{"-", "_"}})));
}

void BindFlagsToEnvironment(CLI::App& app, absl::string_view prefix) {
  for (CLI::Option* option : app.get_options()) {
    if (option == app.get_help_ptr() || option == app.get_help_all_ptr()) continue;
    if (!option->get_envname().empty() || option->get_lnames().empty()) continue;
    const std::string& name = option->get_lnames().front();
    if (name == "version") continue;
    option->envname(EnvNameOf(prefix, name));
  }
}

}  // namespace shardcoord
