#ifndef SHARDCOORD_WORKER_BUFFERS_BUFFER_STAGING_H_
#define SHARDCOORD_WORKER_BUFFERS_BUFFER_STAGING_H_

// Moving a whole local buffer between memory spaces: how plans use lent memory they cannot
// use in place (plain memory of a user process, reached only by process_vm copies; host
// memory lent to a GPU worker). Shared memory mapped by the worker and CUDA IPC memory
// opened on its GPU are in the worker's own space and need none of this.

#include <memory>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "worker/buffers/buffer_store.h"
#include "worker/memory/memory_space.h"

namespace shardcoord {

// Copies every byte of `from` into `to` (the same size), whatever spaces they are in: one
// copy when either is host memory, else through host memory in pieces of 8 MiB. `from`'s
// space is synchronized first. INVALID_ARGUMENT different sizes; the spaces' errors.
absl::Status CopyBufferBytes(const HostBuffer& from, HostBuffer& to);

// `buffer` as memory of `space`: itself when it lives there, else a new buffer of `space`
// with the same dtype and chunks holding a copy of its bytes.
absl::StatusOr<std::shared_ptr<HostBuffer>> BufferIn(std::shared_ptr<HostBuffer> buffer,
                                                     MemorySpace* space);

}  // namespace shardcoord

#endif  // SHARDCOORD_WORKER_BUFFERS_BUFFER_STAGING_H_
