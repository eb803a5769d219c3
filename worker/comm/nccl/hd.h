#ifndef SHARDCOORD_WORKER_COMM_NCCL_HD_H_
#define SHARDCOORD_WORKER_COMM_NCCL_HD_H_

// Marks functions shared by CUDA kernels and host code: nvcc compiles them for both sides,
// gcc sees plain inline functions, so the host unit tests run the exact code the kernels run.
#if defined(__CUDACC__)
#define SC_HD __host__ __device__
#else
#define SC_HD
#endif

#endif  // SHARDCOORD_WORKER_COMM_NCCL_HD_H_
