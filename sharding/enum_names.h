#ifndef SHARDCOORD_SHARDING_ENUM_NAMES_H_
#define SHARDCOORD_SHARDING_ENUM_NAMES_H_

// Names of enum values as tables, e.g.
//   constexpr EnumName<ReduceOp> kReduceOpNames[] = {{ReduceOp::kSum, "sum"}, ...};
// read both ways: value to name (NameOf) and name to value (ValueOf).

#include <cstddef>
#include <optional>
#include <string>

#include "absl/strings/string_view.h"

namespace shardcoord {

template <typename E>
struct EnumName {
  E value;
  const char* name;
};

// The name of `value` in `names`; "unknown" for a value the table lacks (e.g. a number cast
// to the enum).
template <typename E, size_t N>
std::string NameOf(const EnumName<E> (&names)[N], E value) {
  for (const EnumName<E>& n : names) {
    if (n.value == value) return n.name;
  }
  return "unknown";
}

// The value named `name` (exactly) in `names`, if any.
template <typename E, size_t N>
std::optional<E> ValueOf(const EnumName<E> (&names)[N], absl::string_view name) {
  for (const EnumName<E>& n : names) {
    if (name == n.name) return n.value;
  }
  return std::nullopt;
}

}  // namespace shardcoord

#endif  // SHARDCOORD_SHARDING_ENUM_NAMES_H_
