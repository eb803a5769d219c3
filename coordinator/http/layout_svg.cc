#include "coordinator/http/layout_svg.h"

#include <algorithm>
#include <cstdint>
#include <map>
#include <set>
#include <tuple>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace shardcoord {
namespace {

constexpr int kMargin = 8;
constexpr int kCaption = 36;  // Title and axis lines above the drawing.
constexpr int kMinHeight = 48;
constexpr int kMaxHeight = 480;

std::string Escape(const std::string& text) {
  std::string out;
  for (char c : text) {
    switch (c) {
      case '&':
        out += "&amp;";
        break;
      case '<':
        out += "&lt;";
        break;
      case '>':
        out += "&gt;";
        break;
      case '"':
        out += "&quot;";
        break;
      default:
        out += c;
    }
  }
  return out;
}

// "0", "0,2", "0-3", "0-3,8".
std::string RankList(const std::set<int64_t>& ranks) {
  std::vector<std::string> parts;
  for (auto it = ranks.begin(); it != ranks.end();) {
    int64_t first = *it, last = *it;
    for (++it; it != ranks.end() && *it == last + 1; ++it) last = *it;
    parts.push_back(first == last       ? absl::StrCat(first)
                    : last == first + 1 ? absl::StrCat(first, ",", last)
                                        : absl::StrCat(first, "-", last));
  }
  return absl::StrJoin(parts, ",");
}

}  // namespace

std::string LayoutSvg(const Layout& layout, const std::string& title) {
  const int ndim = layout.ndim();
  const int64_t rows = ndim >= 2 ? layout.global_shape()[0] : 1;
  const int64_t cols = ndim >= 1 ? layout.global_shape()[ndim - 1] : 1;
  // Projected block [r0, r1) x [c0, c1) -> its holders.
  std::map<std::tuple<int64_t, int64_t, int64_t, int64_t>, std::set<int64_t>> blocks;
  for (const RankChunks& rc : layout.ranks()) {
    for (const Chunk& c : rc.chunks) {
      if (c.box.Empty()) continue;
      const int64_t r0 = ndim >= 2 ? c.box.offset(0) : 0;
      const int64_t r1 = ndim >= 2 ? c.box.end(0) : 1;
      const int64_t c0 = ndim >= 1 ? c.box.offset(ndim - 1) : 0;
      const int64_t c1 = ndim >= 1 ? c.box.end(ndim - 1) : 1;
      blocks[{r0, r1, c0, c1}].insert(rc.rank);
    }
  }
  // Keep the tensor's aspect ratio within [kMinHeight, kMaxHeight] x [kMinHeight, width].
  const double aspect = cols > 0 ? static_cast<double>(rows) / static_cast<double>(cols) : 1;
  int width = kLayoutSvgWidth - 2 * kMargin;
  if (width * aspect > kMaxHeight) {
    width = std::max(kMinHeight, static_cast<int>(kMaxHeight / aspect));
  }
  const int height = std::clamp(static_cast<int>(width * aspect), kMinHeight, kMaxHeight);
  const double sx = cols > 0 ? static_cast<double>(width) / cols : 0;
  const double sy = rows > 0 ? static_cast<double>(height) / rows : 0;

  std::string out = absl::StrCat(
      "<svg xmlns=\"http://www.w3.org/2000/svg\" class=\"layout\" width=\"", kLayoutSvgWidth,
      "\" height=\"", height + kCaption + 2 * kMargin, "\" font-family=\"sans-serif\">\n");
  std::string axes =
      ndim >= 2 ? absl::StrCat("rows: dim 0 (", rows, "), columns: dim ", ndim - 1, " (", cols, ")")
      : ndim == 1 ? absl::StrCat("dim 0 (", cols, ")")
                  : std::string("a scalar");
  if (ndim > 2) absl::StrAppend(&axes, "; dims 1..", ndim - 2, " projected away");
  absl::StrAppend(&out, "<text x=\"", kMargin, "\" y=\"16\" font-size=\"14\">", Escape(title),
                  "</text>\n<text x=\"", kMargin, "\" y=\"31\" font-size=\"11\" fill=\"#555\">",
                  Escape(axes), "</text>\n");
  absl::StrAppend(&out, "<rect x=\"", kMargin, "\" y=\"", kCaption + kMargin, "\" width=\"", width,
                  "\" height=\"", height, "\" fill=\"#ddd\"/>\n");
  // Larger blocks first, so that smaller ones stay visible on top.
  std::vector<
      std::pair<const std::tuple<int64_t, int64_t, int64_t, int64_t>*, const std::set<int64_t>*>>
      order;
  for (const auto& [box, ranks] : blocks) order.emplace_back(&box, &ranks);
  std::stable_sort(order.begin(), order.end(), [](const auto& a, const auto& b) {
    const auto& [ar0, ar1, ac0, ac1] = *a.first;
    const auto& [br0, br1, bc0, bc1] = *b.first;
    return (ar1 - ar0) * (ac1 - ac0) > (br1 - br0) * (bc1 - bc0);
  });
  for (const auto& [box, ranks] : order) {
    const auto& [r0, r1, c0, c1] = *box;
    const double x = kMargin + c0 * sx, y = kCaption + kMargin + r0 * sy;
    const double w = std::max(1.0, (c1 - c0) * sx), h = std::max(1.0, (r1 - r0) * sy);
    const int64_t first = *ranks->begin();
    const std::string label = RankList(*ranks);
    const std::string where =
        ndim >= 2 ? absl::StrCat("rows [", r0, ", ", r1, "), columns [", c0, ", ", c1, ")")
                  : absl::StrCat("[", c0, ", ", c1, ")");
    absl::StrAppend(&out, "<g class=\"block\" data-ranks=\"", label, "\"><title>",
                    ranks->size() == 1 ? "rank " : "ranks ", label, ": ", where,
                    "</title><rect x=\"", x, "\" y=\"", y, "\" width=\"", w, "\" height=\"", h,
                    "\" fill=\"hsl(", (first * 137) % 360,
                    ", 60%, 75%)\" stroke=\"#333\" stroke-width=\"0.5\"/>");
    // A label only where it fits (about 7 px per character at 11 px).
    if (h >= 14 && w >= 7.0 * static_cast<double>(label.size()) + 4) {
      absl::StrAppend(&out, "<text x=\"", x + w / 2, "\" y=\"", y + h / 2 + 4,
                      "\" font-size=\"11\" text-anchor=\"middle\">", label, "</text>");
    }
    out += "</g>\n";
  }
  out += "</svg>\n";
  return out;
}

}  // namespace shardcoord
