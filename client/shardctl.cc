// shardctl: the shardcoord command-line client. Each subcommand lives in its own
// *_command.cc; shardctl_app.cc puts them together with the global flags.

#include "client/shardctl_app.h"

int main(int argc, char** argv) { return shardcoord::ShardctlMain(argc, argv); }
