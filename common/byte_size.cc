#include "common/byte_size.h"

#include <cmath>
#include <limits>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace shardcoord {
namespace {

// The multiplier of a unit (lower case), or 0 when it is none.
int64_t UnitBytes(const std::string& unit) {
  struct Unit {
    const char* names[4];
    int64_t bytes;
  };
  constexpr int64_t kKi = int64_t{1} << 10;
  static const Unit kUnits[] = {
      {{"", "b", nullptr, nullptr}, 1},
      {{"k", "ki", "kib", nullptr}, kKi},
      {{"m", "mi", "mib", nullptr}, kKi * kKi},
      {{"g", "gi", "gib", nullptr}, kKi * kKi * kKi},
      {{"t", "ti", "tib", nullptr}, kKi * kKi * kKi * kKi},
      {{"kb", nullptr, nullptr, nullptr}, 1000},
      {{"mb", nullptr, nullptr, nullptr}, 1000 * 1000},
      {{"gb", nullptr, nullptr, nullptr}, int64_t{1000} * 1000 * 1000},
      {{"tb", nullptr, nullptr, nullptr}, int64_t{1000} * 1000 * 1000 * 1000},
  };
  for (const Unit& u : kUnits) {
    for (const char* name : u.names) {
      if (name != nullptr && unit == name) return u.bytes;
    }
  }
  return 0;
}

}  // namespace

absl::StatusOr<int64_t> ParseByteSize(absl::string_view text) {
  const absl::string_view s = absl::StripAsciiWhitespace(text);
  size_t end = 0;
  while (end < s.size() && (absl::ascii_isdigit(s[end]) || s[end] == '.')) ++end;
  const absl::string_view number = s.substr(0, end);
  const std::string unit = absl::AsciiStrToLower(absl::StripAsciiWhitespace(s.substr(end)));
  const int64_t multiplier = UnitBytes(unit);
  auto bad = [&] {
    return absl::InvalidArgumentError(
        absl::StrCat("'", text, "' is not a byte size (e.g. 4GiB, 512MiB, 1073741824)"));
  };
  if (number.empty() || multiplier == 0) return bad();
  int64_t whole = 0;
  if (absl::SimpleAtoi(number, &whole)) {
    if (whole > std::numeric_limits<int64_t>::max() / multiplier) return bad();
    return whole * multiplier;
  }
  double value = 0;
  if (!absl::SimpleAtod(number, &value) || !std::isfinite(value) || value < 0) return bad();
  const double bytes = std::floor(value * static_cast<double>(multiplier));
  // 2^63 is exactly representable; anything at or past it does not fit.
  if (bytes >= 9223372036854775808.0) return bad();
  return static_cast<int64_t>(bytes);
}

absl::Status ParseByteSizeFlag(absl::string_view name, absl::string_view text, int64_t* out) {
  absl::StatusOr<int64_t> bytes = ParseByteSize(text);
  if (!bytes.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("--", name, ": ", bytes.status().message()));
  }
  *out = *bytes;
  return absl::OkStatus();
}

std::string FormatBytes(int64_t bytes) {
  if (bytes < 1024 && bytes > -1024) return absl::StrCat(bytes, " B");
  static const char* const kUnits[] = {"KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};
  double v = static_cast<double>(bytes) / 1024;
  int u = 0;
  while (std::abs(v) >= 1024 && u < 5) {
    v /= 1024;
    ++u;
  }
  if (std::abs(v) < 10) return absl::StrFormat("%.2f %s", v, kUnits[u]);
  return absl::StrFormat("%.1f %s", v, kUnits[u]);
}

}  // namespace shardcoord
