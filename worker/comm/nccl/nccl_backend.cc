#include "worker/comm/nccl/nccl_backend.h"

#include <utility>

#include "common/clock.h"
#include "worker/comm/nccl/cuda_nccl_api.h"

namespace shardcoord {
namespace nccl {

std::shared_ptr<CommunicatorFactory> MakeNcclCommunicatorFactory(std::shared_ptr<KvClient> kv,
                                                                 NcclFactoryOptions options) {
  return std::make_shared<NcclCommunicatorFactory>(std::move(kv), std::make_shared<CudaNcclApi>(),
                                                   std::make_shared<RealClock>(), options);
}

}  // namespace nccl
}  // namespace shardcoord
