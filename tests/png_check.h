#ifndef SHARDCOORD_TESTS_PNG_CHECK_H_
#define SHARDCOORD_TESTS_PNG_CHECK_H_

// Tests only: decodes a PNG (8-bit RGB or RGBA, not interlaced, as Chromium writes its
// screenshots) far enough to say what it shows.

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace shardcoord {

struct PngSummary {
  int64_t width = 0;
  int64_t height = 0;
  int64_t pixels_not_white = 0;  // Any channel below 0xf0.
  int64_t distinct_colors = 0;   // Of the RGB values, capped at 4096.
};

// INVALID_ARGUMENT for anything that is not such a PNG (bad signature, chunk CRC or zlib
// stream, another bit depth or colour type, interlacing, a wrong amount of pixel data).
absl::StatusOr<PngSummary> SummarizePng(absl::string_view png);

}  // namespace shardcoord

#endif  // SHARDCOORD_TESTS_PNG_CHECK_H_
