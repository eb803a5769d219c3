#include "sharding/staging.h"

#include <algorithm>

#include "absl/container/flat_hash_map.h"

namespace shardcoord {

std::map<int64_t, int64_t> StagingCaps(const Plan& plan) {
  std::map<int64_t, int64_t> caps;
  for (const Step& step : plan.steps) {
    std::map<int64_t, int64_t> step_bytes;
    for (const Transfer& t : step.transfers) {
      step_bytes[t.src] += t.bytes;
      step_bytes[t.dst] += t.bytes;
    }
    for (const auto& [rank, bytes] : step_bytes) {
      int64_t& cap = caps[rank];
      cap = std::max(cap, 2 * bytes);
    }
  }
  return caps;
}

int64_t StagingBytes(absl::Span<const int64_t> caps, int64_t bucket_bytes) {
  const int64_t limit = StagingLimit(bucket_bytes);
  int64_t total = 0;
  for (int64_t cap : caps) total += std::min(limit, cap);
  return total;
}

std::vector<int> AssignMessageWindows(absl::Span<const WindowMessage> messages, int64_t limit) {
  std::vector<int> window(messages.size(), 0);
  absl::flat_hash_map<int64_t, int> current;  // Each rank's latest window.
  // load[w][rank]: bytes the rank sends plus receives in window w.
  std::vector<absl::flat_hash_map<int64_t, int64_t>> load;
  auto fits = [&](int w, int64_t rank, int64_t bytes) {
    if (w >= static_cast<int>(load.size())) return true;
    auto it = load[w].find(rank);
    const int64_t used = it == load[w].end() ? 0 : it->second;
    return used == 0 || used + bytes <= limit;
  };
  for (size_t i = 0; i < messages.size(); ++i) {
    const WindowMessage& m = messages[i];
    // Two lookups by value: operator[] may rehash, so a reference from the first would
    // dangle by the time std::max read it (ASan caught it).
    const int src_window = current[m.src];
    const int dst_window = current[m.dst];
    int w = std::max(src_window, dst_window);
    while (!fits(w, m.src, m.bytes) || !fits(w, m.dst, m.bytes)) ++w;
    if (w >= static_cast<int>(load.size())) load.resize(w + 1);
    load[w][m.src] += m.bytes;
    if (m.dst != m.src) load[w][m.dst] += m.bytes;
    current[m.src] = current[m.dst] = w;
    window[i] = w;
  }
  return window;
}

}  // namespace shardcoord
