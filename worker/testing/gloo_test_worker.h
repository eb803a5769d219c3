#ifndef SHARDCOORD_WORKER_TESTING_GLOO_TEST_WORKER_H_
#define SHARDCOORD_WORKER_TESTING_GLOO_TEST_WORKER_H_

// A worker's pieces in one process, for tests and benches that run several workers side by
// side: no sockets except Gloo's loopback TCP.

#include <cstdint>

#include "absl/strings/str_cat.h"
#include "worker/buffers/buffer_store.h"
#include "worker/comm/gloo/gloo_communicator.h"
#include "worker/control/coordinator_rpc.h"
#include "worker/control/kv_client.h"
#include "worker/control/worker_core.h"
#include "worker/memory/memory_space.h"

namespace shardcoord {
namespace worker_testing {

// The buffers, the communicator cache (Gloo, meeting its peers through `kv`) and the core of
// the worker "w<rank>" of `incarnation`, reporting to `reporter`. Its buffers live in `space`
// (null: host memory), which must outlive it.
struct GlooTestWorker {
  GlooTestWorker(KvClient* kv, ChunkReporter* reporter, int rank, int64_t incarnation,
                 MemorySpace* space = nullptr)
      : cache(*GlooCommunicatorFactory::Create(kv, GlooOptions{})),
        core(
            &buffers, &cache, reporter,
            [rank, incarnation] {
              return WorkerIdentity{absl::StrCat("w", rank), incarnation, rank};
            },
            {}, nullptr, space) {}

  TransferRunner& transfers() { return *core.transfers(); }

  BufferStore buffers;
  CommunicatorCache cache;
  WorkerCore core;
};

}  // namespace worker_testing
}  // namespace shardcoord

#endif  // SHARDCOORD_WORKER_TESTING_GLOO_TEST_WORKER_H_
