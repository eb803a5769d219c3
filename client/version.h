#ifndef SHARDCOORD_CLIENT_VERSION_H_
#define SHARDCOORD_CLIENT_VERSION_H_

namespace shardcoord {

// What `shardctl --version` prints after "shardctl ". Defined here only; bump it with
// releases. A constant rather than a Bazel stamp keeps builds hermetic and cacheable.
inline constexpr char kShardctlVersion[] = "0.1.0";

}  // namespace shardcoord

#endif  // SHARDCOORD_CLIENT_VERSION_H_
