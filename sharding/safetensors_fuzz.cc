// Fuzzes the safetensors header reader (checkpoint loads read files anyone may have written,
// e.g. a downloaded model): ParseSafetensorsPrefix and ParseSafetensorsHeader must only ever
// return statuses; an accepted header describes entries that tile its data exactly, and
// rebuilding the header from its entries (in data order) parses back to the same entries.
// The input is a whole file: 8-byte length, JSON, data.

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/strings/string_view.h"
#include "sharding/safetensors.h"
#include "sharding/testing/fuzz_check.h"

constexpr shardcoord::sharding_testing::FuzzCheck Check{"safetensors_fuzz"};

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace shardcoord;
  const absl::string_view file(reinterpret_cast<const char*>(data), size);
  absl::StatusOr<int64_t> n = ParseSafetensorsPrefix(file.substr(0, 8));
  if (!n.ok()) return 0;
  Check(*n > 0 && *n <= kMaxSafetensorsHeaderBytes, "header length out of bounds");
  if (static_cast<uint64_t>(*n) > size - 8) return 0;
  absl::StatusOr<SafetensorsHeader> h =
      ParseSafetensorsHeader(file.substr(8, static_cast<size_t>(*n)), static_cast<int64_t>(size));
  // Without the size check the same JSON parses or not the same way, apart from the size.
  absl::StatusOr<SafetensorsHeader> loose = ParseSafetensorsHeader(file.substr(8, *n));
  if (h.ok()) Check(loose.ok(), "accepted with the file size but not without");
  if (!h.ok()) return 0;
  Check(h->file_bytes() == static_cast<int64_t>(size), "file size not checked");
  int64_t at = 0;
  std::vector<SafetensorsEntrySpec> specs;
  bool ours = true;
  for (const SafetensorsEntry& e : h->entries) {
    Check(e.begin == at && e.end >= e.begin, "entries do not tile the data");
    at = e.end;
    Check(e.element_size > 0, "unknown element size");
    if (!e.dtype.has_value()) {
      ours = false;
      continue;
    }
    specs.push_back({e.name, *e.dtype, e.shape});
  }
  Check(at == h->data_bytes, "data bytes differ from the last entry's end");
  if (!ours) return 0;
  SafetensorsHeader laid;
  absl::StatusOr<std::string> again = BuildSafetensorsHeader(specs, h->metadata, &laid);
  if (!again.ok()) {
    // Only a name the builder reserves can fail it (the parser read "__metadata__" itself).
    return 0;
  }
  absl::StatusOr<int64_t> n2 = ParseSafetensorsPrefix(again->substr(0, 8));
  Check(n2.ok() && *n2 + 8 == static_cast<int64_t>(again->size()), "rebuilt prefix");
  absl::StatusOr<SafetensorsHeader> back = ParseSafetensorsHeader(again->substr(8));
  Check(back.ok(), "a rebuilt header does not parse");
  Check(back->entries.size() == h->entries.size(), "entry count changed");
  for (size_t i = 0; i < h->entries.size(); ++i) {
    const SafetensorsEntry& a = h->entries[i];
    const SafetensorsEntry& b = back->entries[i];
    Check(a.name == b.name && a.dtype == b.dtype && a.shape == b.shape && a.begin == b.begin &&
              a.end == b.end,
          "rebuilt entry differs");
  }
  Check(back->metadata == h->metadata, "metadata differs");
  return 0;
}
