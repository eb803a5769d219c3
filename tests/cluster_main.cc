// The main() of an integration test that runs on one default cluster (ClusterEnvironment).

#include "tests/cluster_environment.h"

int main(int argc, char** argv) { return shardcoord::RunWithCluster(argc, argv); }
