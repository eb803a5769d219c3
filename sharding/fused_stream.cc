#include "sharding/fused_stream.h"

#include <algorithm>
#include <map>
#include <set>
#include <utility>

namespace shardcoord {
namespace {

void SplitInto(const Box& box, int64_t element_size, int64_t max_bytes, std::vector<Box>* out) {
  if (box.Volume() * element_size <= max_bytes) {
    out->push_back(box);
    return;
  }
  // More than one element: some dim has extent > 1. Cut along the outermost one.
  int d = 0;
  while (box.shape(d) == 1) ++d;
  int64_t index_bytes = element_size;  // Bytes of one index of dim d.
  for (int e = d + 1; e < box.ndim(); ++e) index_bytes *= box.shape(e);
  const int64_t per_piece = std::max<int64_t>(1, max_bytes / index_bytes);
  for (int64_t i = 0; i < box.shape(d); i += per_piece) {
    Shape offset = box.offset(), shape = box.shape();
    offset[d] += i;
    shape[d] = std::min(per_piece, box.shape(d) - i);
    Box piece(std::move(offset), std::move(shape));
    if (index_bytes > max_bytes) {
      SplitInto(piece, element_size, max_bytes, out);  // One index: cut its inner dims.
    } else {
      out->push_back(std::move(piece));
    }
  }
}

}  // namespace

StreamLimits StreamLimitsFor(int64_t bucket_bytes) {
  StreamLimits l;
  l.bucket_bytes = bucket_bytes <= 0 ? kDefaultBucketBytes
                                     : std::max<int64_t>(bucket_bytes, kMinStreamBucketBytes);
  l.message_bytes = std::min(l.bucket_bytes, kMaxStreamMessageBytes);
  l.pack_below = std::min(l.bucket_bytes, kPackBelowBytes);
  l.window_bytes = l.bucket_bytes * (kBucketsInFlight / 2);
  return l;
}

std::vector<Box> SplitIntoPieces(const Box& box, int64_t element_size, int64_t max_bytes) {
  std::vector<Box> out;
  if (box.Empty() || box.ndim() == 0) {
    out.push_back(box);
    return out;
  }
  SplitInto(box, element_size, std::max(max_bytes, element_size), &out);
  return out;
}

int64_t CountPieces(const Box& box, int64_t element_size, int64_t max_bytes) {
  if (box.Empty() || box.ndim() == 0) return 1;
  max_bytes = std::max(max_bytes, element_size);
  if (box.Volume() * element_size <= max_bytes) return 1;
  int d = 0;
  while (box.shape(d) == 1) ++d;
  int64_t index_bytes = element_size;
  for (int e = d + 1; e < box.ndim(); ++e) index_bytes *= box.shape(e);
  if (index_bytes <= max_bytes) {
    const int64_t per_piece = max_bytes / index_bytes;
    return (box.shape(d) + per_piece - 1) / per_piece;
  }
  // Every index of dim d is cut alike.
  Shape shape = box.shape();
  shape[d] = 1;
  return box.shape(d) * CountPieces(Box(box.offset(), std::move(shape)), element_size, max_bytes);
}

void StreamCounter::Add(const Box& box, int64_t element_size) {
  if (box.Empty()) return;
  const int64_t bytes = box.Volume() * element_size;
  if (bytes < limits_.pack_below) {
    if (open_bytes_ > 0 && open_bytes_ + bytes > limits_.message_bytes) {
      ++messages_;
      open_bytes_ = 0;
    }
    open_bytes_ += bytes;
    return;
  }
  messages_ += CountPieces(box, element_size, limits_.message_bytes);
}

std::vector<StreamMessage> CutStream(absl::Span<const StreamItem> items,
                                     const StreamLimits& limits) {
  std::vector<StreamMessage> out;
  StreamMessage open;
  auto flush = [&] {
    if (open.pieces.empty()) return;
    out.push_back(std::move(open));
    open = StreamMessage();
  };
  for (size_t i = 0; i < items.size(); ++i) {
    const StreamItem& item = items[i];
    if (item.box.Empty()) continue;
    const int64_t bytes = item.box.Volume() * item.element_size;
    const int32_t index = static_cast<int32_t>(i);
    if (bytes < limits.pack_below) {
      if (open.bytes + bytes > limits.message_bytes) flush();
      open.pieces.push_back(StreamPiece{index, item.box, open.bytes, bytes});
      open.bytes += bytes;
      continue;
    }
    for (Box& piece : SplitIntoPieces(item.box, item.element_size, limits.message_bytes)) {
      StreamMessage m;
      m.bytes = piece.Volume() * item.element_size;
      m.pieces.push_back(StreamPiece{index, std::move(piece), 0, m.bytes});
      out.push_back(std::move(m));
    }
  }
  flush();
  return out;
}

std::vector<size_t> CutWindows(absl::Span<const StreamMessage> messages,
                               const StreamLimits& limits) {
  std::vector<size_t> starts;
  int64_t bytes = 0;
  for (size_t j = 0; j < messages.size(); ++j) {
    if (starts.empty() || (bytes > 0 && bytes + messages[j].bytes > limits.window_bytes)) {
      starts.push_back(j);
      bytes = 0;
    }
    bytes += messages[j].bytes;
  }
  return starts;
}

FusedExchangeStats FusedExchange(absl::Span<const Plan* const> plans, const StreamLimits& limits) {
  std::map<std::pair<int64_t, int64_t>, StreamCounter> streams;
  std::set<int64_t> ranks;
  for (const Plan* plan : plans) {
    const int64_t esize = ElementSize(plan->wire_dtype());
    for (const Step& step : plan->steps) {
      for (const Transfer& t : step.transfers) {
        if (t.box.Empty()) continue;
        streams.try_emplace({t.src, t.dst}, limits).first->second.Add(t.box, esize);
        ranks.insert(t.src);
        ranks.insert(t.dst);
      }
    }
  }
  FusedExchangeStats out;
  out.ranks.assign(ranks.begin(), ranks.end());
  out.pairs = static_cast<int64_t>(streams.size());
  for (const auto& [pair, counter] : streams) out.messages += counter.messages();
  return out;
}

std::map<int64_t, int64_t> FusedStagingCaps(absl::Span<const Plan* const> plans) {
  std::map<std::pair<int64_t, int64_t>, int64_t> streams;  // (src, dst) -> bytes.
  for (const Plan* plan : plans) {
    for (const Step& step : plan->steps) {
      for (const Transfer& t : step.transfers) {
        if (t.box.Empty() || t.src == t.dst) continue;
        streams[{t.src, t.dst}] += t.bytes;
      }
    }
  }
  std::map<int64_t, int64_t> most_sent, most_received;
  for (const auto& [pair, bytes] : streams) {
    most_sent[pair.first] = std::max(most_sent[pair.first], bytes);
    most_received[pair.second] = std::max(most_received[pair.second], bytes);
  }
  std::map<int64_t, int64_t> caps = std::move(most_sent);
  for (const auto& [rank, bytes] : most_received) caps[rank] += bytes;
  return caps;
}

}  // namespace shardcoord
