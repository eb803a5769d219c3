#ifndef SHARDCOORD_WORKER_CUDA_PROBE_H_
#define SHARDCOORD_WORKER_CUDA_PROBE_H_

#include <string>

namespace shardcoord {

// Number of CUDA devices this process can see (honouring CUDA_VISIBLE_DEVICES), asked of the
// driver through dlopen so the worker runs, and links, on machines without CUDA. 0 when there
// is no driver or no device; `why` (optional) says which.
int CountVisibleCudaDevices(std::string* why = nullptr);

}  // namespace shardcoord

#endif  // SHARDCOORD_WORKER_CUDA_PROBE_H_
