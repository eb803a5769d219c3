#ifndef SHARDCOORD_WORKER_COMM_GLOO_SAME_HOST_H_
#define SHARDCOORD_WORKER_COMM_GLOO_SAME_HOST_H_

// Same-host copies for the Gloo backend: when two workers share a kernel (same boot, same
// PID namespace) and may access each other's memory, a point-to-point message moves with one
// process_vm_writev (cross-memory attach, as Open MPI and MPICH do within a node) straight
// from the sender's (possibly strided) memory into the receiver's buffer, instead of a pack
// and two copies through loopback TCP. Gloo still carries a 16-byte descriptor and an
// acknowledgement per message, so ordering, timeouts and cancellation stay Gloo's.

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace shardcoord {

// What a process publishes so peers can tell whether they can read its memory: which kernel
// and PID namespace it runs in, its pid there, and the address and value of a probe word.
struct SameHostRecord {
  std::string host_key;  // "<boot id>/<pid namespace inode>"; empty when unknown.
  int64_t pid = 0;
  uint64_t probe_address = 0;
  uint64_t probe_value = 0;
  bool enabled = false;  // False when this process does not take part (--same-host-copy off).

  std::string Encode() const;  // "enabled|host_key|pid|address|value"
  static absl::StatusOr<SameHostRecord> Decode(absl::string_view text);
};

// This process's record (its probe word lives as long as the process).
SameHostRecord LocalSameHostRecord(bool enabled);

// Whether this process can read `peer`'s memory: both take part, they share the kernel and
// PID namespace, and process_vm_readv of the peer's probe word returns its value.
bool CanReadPeer(const SameHostRecord& self, const SameHostRecord& peer);

// (address, length) pieces of local memory, in order.
using MemoryRuns = std::vector<std::pair<const char*, int64_t>>;

// Copies the local `runs`, concatenated, to `remote_address` in process `pid` (in batches of
// at most 1024 runs per call). Errors as ReadPeerMemory.
absl::Status WritePeerMemory(int64_t pid, uint64_t remote_address, const MemoryRuns& runs);

// Copies `bytes` from `remote_address` in process `pid` to `local`. ABORTED when the process
// is gone, PERMISSION_DENIED when it may not be read, DATA_LOSS when the range is not mapped
// there (or the read comes up short); each message names the pid, address and size.
absl::Status ReadPeerMemory(int64_t pid, uint64_t remote_address, void* local, int64_t bytes);

}  // namespace shardcoord

#endif  // SHARDCOORD_WORKER_COMM_GLOO_SAME_HOST_H_
