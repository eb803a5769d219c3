#ifndef SHARDCOORD_WORKER_COMM_NCCL_BOX_GEOMETRY_H_
#define SHARDCOORD_WORKER_COMM_NCCL_BOX_GEOMETRY_H_

// The index math of a strided box copy on the GPU, shared by the kernels and the host tests.
// Plain C++ only: this header is included by .cu files. box_geometry_builder.h builds a
// geometry from Boxes with the same rules as sharding/box_copy.h.

#include <cstdint>

#include "worker/comm/nccl/hd.h"

namespace shardcoord {
namespace nccl {

// Outer dims a geometry can walk after merging; more is rejected when building it.
constexpr int kMaxCopyDims = 8;

// A region as `runs` contiguous runs of `run_bytes` bytes. Runs are numbered row-major over
// the outer dims (count[0] outermost), which is also their order in a dense buffer for the
// region. Offsets and strides are in bytes, relative to the two buffers' starts.
struct BoxCopyGeometry {
  int64_t element_size = 1;
  int64_t runs = 0;  // 0 for an empty region.
  int64_t run_bytes = 0;
  int64_t src_start = 0;
  int64_t dst_start = 0;
  int ndims = 0;
  int64_t count[kMaxCopyDims] = {};
  int64_t src_stride[kMaxCopyDims] = {};
  int64_t dst_stride[kMaxCopyDims] = {};
};

SC_HD inline int64_t TotalBytes(const BoxCopyGeometry& g) { return g.runs * g.run_bytes; }

// Byte offsets of run `run` in the source and destination buffers.
SC_HD inline void RunOffsets(const BoxCopyGeometry& g, int64_t run, int64_t* src, int64_t* dst) {
  int64_t s = g.src_start;
  int64_t d = g.dst_start;
  for (int k = g.ndims - 1; k >= 0; --k) {
    const int64_t i = run % g.count[k];
    run /= g.count[k];
    s += i * g.src_stride[k];
    d += i * g.dst_stride[k];
  }
  *src = s;
  *dst = d;
}

// The widest unit (16, 8, 4, 2 or 1 bytes) that divides every run and stride and keeps every
// access aligned given the two buffer addresses, so a kernel can move whole units.
SC_HD inline int CopyUnitBytes(const BoxCopyGeometry& g, uint64_t src_addr, uint64_t dst_addr) {
  uint64_t bits = static_cast<uint64_t>(g.run_bytes) | static_cast<uint64_t>(g.src_start) |
                  static_cast<uint64_t>(g.dst_start) | src_addr | dst_addr;
  for (int k = 0; k < g.ndims; ++k) {
    bits |= static_cast<uint64_t>(g.src_stride[k]) | static_cast<uint64_t>(g.dst_stride[k]);
  }
  int unit = 16;
  while (unit > 1 && (bits & static_cast<uint64_t>(unit - 1)) != 0) unit /= 2;
  return unit;
}

// Byte offsets of unit `u` (of `unit` bytes) of the copy: units are numbered run by run.
SC_HD inline void UnitOffsets(const BoxCopyGeometry& g, int unit, int64_t u, int64_t* src,
                              int64_t* dst) {
  const int64_t per_run = g.run_bytes / unit;
  int64_t s, d;
  RunOffsets(g, u / per_run, &s, &d);
  const int64_t within = (u % per_run) * unit;
  *src = s + within;
  *dst = d + within;
}

// Byte offsets of element `e` of the region (row-major order over the region).
SC_HD inline void ElementOffsets(const BoxCopyGeometry& g, int64_t e, int64_t* src, int64_t* dst) {
  UnitOffsets(g, static_cast<int>(g.element_size), e, src, dst);
}

SC_HD inline int64_t ElementCount(const BoxCopyGeometry& g) {
  return TotalBytes(g) / g.element_size;
}

}  // namespace nccl
}  // namespace shardcoord

#endif  // SHARDCOORD_WORKER_COMM_NCCL_BOX_GEOMETRY_H_
