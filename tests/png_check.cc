#include "tests/png_check.h"

#include <zlib.h>

#include <cstdlib>
#include <set>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace shardcoord {
namespace {

uint32_t Be32(const unsigned char* p) {
  return (uint32_t{p[0]} << 24) | (uint32_t{p[1]} << 16) | (uint32_t{p[2]} << 8) | p[3];
}

int Paeth(int a, int b, int c) {
  const int p = a + b - c, pa = std::abs(p - a), pb = std::abs(p - b), pc = std::abs(p - c);
  return pa <= pb && pa <= pc ? a : pb <= pc ? b : c;
}

}  // namespace

absl::StatusOr<PngSummary> SummarizePng(absl::string_view png) {
  static constexpr unsigned char kSignature[8] = {0x89, 'P', 'N', 'G', '\r', '\n', 0x1a, '\n'};
  const auto* data = reinterpret_cast<const unsigned char*>(png.data());
  if (png.size() < 8 || std::equal(kSignature, kSignature + 8, data) == false) {
    return absl::InvalidArgumentError("not a PNG: bad signature");
  }
  PngSummary out;
  int channels = 0;
  std::string idat;
  for (size_t pos = 8; pos < png.size();) {
    if (pos + 12 > png.size()) return absl::InvalidArgumentError("truncated chunk");
    const uint32_t length = Be32(data + pos);
    if (pos + 12 + length > png.size()) return absl::InvalidArgumentError("truncated chunk");
    const std::string type(png.substr(pos + 4, 4));
    const unsigned char* body = data + pos + 8;
    const uint32_t crc = crc32(crc32(0, data + pos + 4, 4), body, length);
    if (crc != Be32(body + length)) {
      return absl::InvalidArgumentError(absl::StrCat("chunk ", type, ": bad CRC"));
    }
    if (type == "IHDR") {
      if (length != 13) return absl::InvalidArgumentError("IHDR: bad length");
      out.width = Be32(body);
      out.height = Be32(body + 4);
      const int depth = body[8], color = body[9], interlace = body[12];
      if (depth != 8 || (color != 2 && color != 6) || interlace != 0) {
        return absl::InvalidArgumentError(absl::StrCat("IHDR: depth ", depth, ", colour type ",
                                                       color, ", interlace ", interlace,
                                                       " (want 8-bit RGB(A), not interlaced)"));
      }
      channels = color == 2 ? 3 : 4;
    } else if (type == "IDAT") {
      idat.append(reinterpret_cast<const char*>(body), length);
    } else if (type == "IEND") {
      break;
    }
    pos += 12 + length;
  }
  if (channels == 0) return absl::InvalidArgumentError("no IHDR");
  const size_t stride = static_cast<size_t>(out.width) * channels;
  std::vector<unsigned char> raw((stride + 1) * out.height);
  uLongf raw_size = raw.size();
  if (uncompress(raw.data(), &raw_size, reinterpret_cast<const Bytef*>(idat.data()), idat.size()) !=
          Z_OK ||
      raw_size != raw.size()) {
    return absl::InvalidArgumentError("IDAT: not a zlib stream of the image's size");
  }
  // Undo the per-row filters in place (PNG spec, section 9).
  std::vector<unsigned char> prev(stride, 0);
  std::set<uint32_t> colors;
  for (int64_t y = 0; y < out.height; ++y) {
    unsigned char* row = raw.data() + y * (stride + 1);
    const int filter = row[0];
    unsigned char* px = row + 1;
    for (size_t i = 0; i < stride; ++i) {
      const int a = i >= static_cast<size_t>(channels) ? px[i - channels] : 0;
      const int b = prev[i];
      const int c = i >= static_cast<size_t>(channels) ? prev[i - channels] : 0;
      switch (filter) {
        case 0:
          break;
        case 1:
          px[i] += a;
          break;
        case 2:
          px[i] += b;
          break;
        case 3:
          px[i] += (a + b) / 2;
          break;
        case 4:
          px[i] += Paeth(a, b, c);
          break;
        default:
          return absl::InvalidArgumentError(absl::StrCat("row ", y, ": filter ", filter));
      }
    }
    for (int64_t x = 0; x < out.width; ++x) {
      const unsigned char* p = px + x * channels;
      if (p[0] < 0xf0 || p[1] < 0xf0 || p[2] < 0xf0) ++out.pixels_not_white;
      if (colors.size() < 4096) colors.insert((uint32_t{p[0]} << 16) | (p[1] << 8) | p[2]);
    }
    prev.assign(px, px + stride);
  }
  out.distinct_colors = static_cast<int64_t>(colors.size());
  return out;
}

}  // namespace shardcoord
