#include "common/env_flags.h"

#include <stdlib.h>

#include <string>
#include <vector>

#include "gtest/gtest.h"

namespace shardcoord {
namespace {

TEST(EnvFlagsTest, EnvNameOf) {
  EXPECT_EQ(EnvNameOf("SHARDCOORD_", "drain-timeout"), "SHARDCOORD_DRAIN_TIMEOUT");
  EXPECT_EQ(EnvNameOf("X_", "host"), "X_HOST");
}

// Parses `args` (after the program name) with the variables in `env` set.
struct Parsed {
  std::string name = "default";
  std::string host = "h";
  bool insecure = false;
};
Parsed Parse(std::vector<std::string> args,
             const std::vector<std::pair<const char*, const char*>>& env) {
  for (const auto& [k, v] : env) setenv(k, v, 1);
  Parsed p;
  CLI::App app{"test"};
  app.add_option("--name", p.name);
  app.add_option("--host", p.host)->envname("MY_HOST");
  app.add_flag("--insecure", p.insecure);
  BindFlagsToEnvironment(app, "ENVTEST_");
  std::vector<const char*> argv = {"prog"};
  for (const std::string& a : args) argv.push_back(a.c_str());
  app.parse(static_cast<int>(argv.size()), const_cast<char**>(argv.data()));
  for (const auto& [k, v] : env) unsetenv(k);
  return p;
}

TEST(EnvFlagsTest, EnvironmentFillsUnsetFlags) {
  Parsed p = Parse({}, {{"ENVTEST_NAME", "w-7"}, {"MY_HOST", "node-3"}, {"ENVTEST_INSECURE", "1"}});
  EXPECT_EQ(p.name, "w-7");
  EXPECT_EQ(p.host, "node-3");  // An envname given before binding is kept.
  EXPECT_TRUE(p.insecure);
}

TEST(EnvFlagsTest, CommandLineWins) {
  Parsed p = Parse({"--name", "cli"}, {{"ENVTEST_NAME", "env"}});
  EXPECT_EQ(p.name, "cli");
}

TEST(EnvFlagsTest, DefaultsWithoutEnvironment) {
  Parsed p = Parse({}, {});
  EXPECT_EQ(p.name, "default");
  EXPECT_EQ(p.host, "h");
  EXPECT_FALSE(p.insecure);
}

TEST(EnvFlagsTest, HelpShowsTheVariable) {
  CLI::App app{"test"};
  std::string v;
  app.add_option("--drain-timeout", v, "how long");
  BindFlagsToEnvironment(app);
  EXPECT_NE(app.help().find("SHARDCOORD_DRAIN_TIMEOUT"), std::string::npos) << app.help();
}

}  // namespace
}  // namespace shardcoord
