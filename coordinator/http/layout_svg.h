#ifndef SHARDCOORD_COORDINATOR_HTTP_LAYOUT_SVG_H_
#define SHARDCOORD_COORDINATOR_HTTP_LAYOUT_SVG_H_

// The dashboard's layout picture: which rank holds which block of a tensor, as SVG.

#include <string>

#include "sharding/layout.h"

namespace shardcoord {

// An SVG document (at most kLayoutSvgWidth wide) drawing the tensor as a rectangle: rows
// are dim 0 and columns the last dim (a 1-d tensor is one row; dims in between are
// projected away, and a caption says so). Each distinct block (a chunk's box, projected)
// is a rectangle coloured by its lowest holder and labelled with every rank that holds it
// (replicas and partial contributions share a block); <title> gives the exact box. Parts
// of the tensor nobody holds show as the grey background. `title` heads the picture.
std::string LayoutSvg(const Layout& layout, const std::string& title);

inline constexpr int kLayoutSvgWidth = 640;

}  // namespace shardcoord

#endif  // SHARDCOORD_COORDINATOR_HTTP_LAYOUT_SVG_H_
