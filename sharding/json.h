#ifndef SHARDCOORD_SHARDING_JSON_H_
#define SHARDCOORD_SHARDING_JSON_H_

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace shardcoord {

// A strict JSON reader for the checkpoint formats (safetensors headers, index.json), which
// come from files anyone may have written. Strict where lenient readers are not: duplicate
// object keys, invalid UTF-8, raw control characters in strings, trailing data and nesting
// deeper than kMaxJsonDepth are errors; numbers keep their text, so 64-bit offsets are read
// exactly (not through a double). Objects keep their keys in file order.
class JsonValue {
 public:
  enum class Kind { kNull, kBool, kNumber, kString, kArray, kObject };
  using Member = std::pair<std::string, JsonValue>;

  JsonValue() = default;
  static JsonValue Null() { return JsonValue(); }
  static JsonValue Bool(bool b);
  static JsonValue Number(std::string text, bool integer);
  static JsonValue String(std::string s);
  static JsonValue Array(std::vector<JsonValue> items);
  static JsonValue Object(std::vector<Member> members);

  Kind kind() const { return kind_; }
  bool is_object() const { return kind_ == Kind::kObject; }
  bool is_array() const { return kind_ == Kind::kArray; }
  bool is_string() const { return kind_ == Kind::kString; }
  bool is_number() const { return kind_ == Kind::kNumber; }

  bool bool_value() const { return bool_; }
  // String contents (kString) or the number's text (kNumber).
  const std::string& text() const { return text_; }
  // True for a number written without fraction or exponent.
  bool is_integer() const { return kind_ == Kind::kNumber && integer_; }
  const std::vector<JsonValue>& items() const { return items_; }
  const std::vector<Member>& members() const { return members_; }
  // The member named `key`, or null.
  const JsonValue* Find(absl::string_view key) const;

  // INVALID_ARGUMENT naming `field` unless this is an integer in range.
  absl::StatusOr<int64_t> AsInt64(absl::string_view field) const;
  absl::StatusOr<uint64_t> AsUint64(absl::string_view field) const;

 private:
  Kind kind_ = Kind::kNull;
  bool bool_ = false;
  bool integer_ = false;
  std::string text_;
  std::vector<JsonValue> items_;
  std::vector<Member> members_;
};

inline constexpr int kMaxJsonDepth = 64;

// Parses one JSON value spanning all of `text` (whitespace around it allowed).
// INVALID_ARGUMENT "byte N: ..." naming where and what.
absl::StatusOr<JsonValue> ParseJson(absl::string_view text);

// `s` as a JSON string literal: quotes, escapes for '"', '\\' and control characters; other
// bytes pass through (callers give UTF-8).
std::string QuoteJson(absl::string_view s);

// "string", "number", ... for messages.
const char* JsonKindName(JsonValue::Kind kind);

}  // namespace shardcoord

#endif  // SHARDCOORD_SHARDING_JSON_H_
