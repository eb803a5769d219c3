#ifndef SHARDCOORD_TESTS_STREAMED_IO_MAIN_H_
#define SHARDCOORD_TESTS_STREAMED_IO_MAIN_H_

// The streamed I/O tests' cluster (streamed_io_main.cc is their main()): its coordinator
// streams tensors in bands of kStreamedIoBandBytes, so that small tensors take many bands.

#include <cstdint>

namespace shardcoord {

inline constexpr int64_t kStreamedIoBandBytes = 4096;

}  // namespace shardcoord

#endif  // SHARDCOORD_TESTS_STREAMED_IO_MAIN_H_
