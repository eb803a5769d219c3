#ifndef SHARDCOORD_WORKER_COMM_NCCL_NCCL_BACKEND_H_
#define SHARDCOORD_WORKER_COMM_NCCL_NCCL_BACKEND_H_

#include <memory>

#include "worker/comm/communicator.h"
#include "worker/comm/nccl/nccl_communicator.h"
#include "worker/control/kv_client.h"

namespace shardcoord {
namespace nccl {

// The production factory: NcclCommunicators on the real NCCL and CUDA libraries and the
// real clock, for the worker's GPU `options.device`. Only where CUDA is available.
std::shared_ptr<CommunicatorFactory> MakeNcclCommunicatorFactory(std::shared_ptr<KvClient> kv,
                                                                 NcclFactoryOptions options = {});

}  // namespace nccl
}  // namespace shardcoord

#endif  // SHARDCOORD_WORKER_COMM_NCCL_NCCL_BACKEND_H_
