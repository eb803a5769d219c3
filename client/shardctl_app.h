#ifndef SHARDCOORD_CLIENT_SHARDCTL_APP_H_
#define SHARDCOORD_CLIENT_SHARDCTL_APP_H_

// The whole shardctl command line, as a function so tests can run it in-process: the global
// flags, every subcommand, and the mapping of parse errors to exit statuses.

namespace shardcoord {

// Parses argv (argv[0] is the program name), runs the chosen subcommand and returns the exit
// status: 0, 1 when the coordinator refused, 2 for bad flags (one line on stderr naming the
// flag). Help and --version print to stdout and return 0.
int ShardctlMain(int argc, const char* const* argv);

}  // namespace shardcoord

#endif  // SHARDCOORD_CLIENT_SHARDCTL_APP_H_
