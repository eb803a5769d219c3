#ifndef SHARDCOORD_COMMON_ENV_FLAGS_H_
#define SHARDCOORD_COMMON_ENV_FLAGS_H_

// Daemon flags from the environment, so Kubernetes manifests can set them with `env:` and
// the downward API (the worker's name from the pod name, its host from the node name).

#include <string>

#include "CLI/CLI.hpp"
#include "absl/strings/string_view.h"

namespace shardcoord {

// "SHARDCOORD_DRAIN_TIMEOUT" for "drain-timeout": `prefix` + the long name in upper case,
// '-' as '_'.
std::string EnvNameOf(absl::string_view prefix, absl::string_view long_name);

// Gives every option of `app` that has a long name and no environment variable yet the
// variable EnvNameOf(prefix, name) (CLI11's envname: a value on the command line wins over
// the environment, which wins over the default; --help shows the variable). Call after
// adding the options, before parsing. --help and --version are left alone.
void BindFlagsToEnvironment(CLI::App& app, absl::string_view prefix = "SHARDCOORD_");

}  // namespace shardcoord

#endif  // SHARDCOORD_COMMON_ENV_FLAGS_H_
