#include "sharding/json.h"

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace shardcoord {

JsonValue JsonValue::Bool(bool b) {
  JsonValue v;
  v.kind_ = Kind::kBool;
  v.bool_ = b;
  return v;
}

JsonValue JsonValue::Number(std::string text, bool integer) {
  JsonValue v;
  v.kind_ = Kind::kNumber;
  v.text_ = std::move(text);
  v.integer_ = integer;
  return v;
}

JsonValue JsonValue::String(std::string s) {
  JsonValue v;
  v.kind_ = Kind::kString;
  v.text_ = std::move(s);
  return v;
}

JsonValue JsonValue::Array(std::vector<JsonValue> items) {
  JsonValue v;
  v.kind_ = Kind::kArray;
  v.items_ = std::move(items);
  return v;
}

JsonValue JsonValue::Object(std::vector<Member> members) {
  JsonValue v;
  v.kind_ = Kind::kObject;
  v.members_ = std::move(members);
  return v;
}

const JsonValue* JsonValue::Find(absl::string_view key) const {
  for (const Member& m : members_) {
    if (m.first == key) return &m.second;
  }
  return nullptr;
}

const char* JsonKindName(JsonValue::Kind kind) {
  switch (kind) {
    case JsonValue::Kind::kNull:
      return "null";
    case JsonValue::Kind::kBool:
      return "boolean";
    case JsonValue::Kind::kNumber:
      return "number";
    case JsonValue::Kind::kString:
      return "string";
    case JsonValue::Kind::kArray:
      return "array";
    case JsonValue::Kind::kObject:
      return "object";
  }
  return "?";
}

absl::StatusOr<int64_t> JsonValue::AsInt64(absl::string_view field) const {
  int64_t v = 0;
  if (!is_integer() || !absl::SimpleAtoi(text_, &v)) {
    return absl::InvalidArgumentError(
        absl::StrCat(field, ": expected an integer, got ",
                     kind_ == Kind::kNumber ? absl::StrCat("'", text_, "'") : JsonKindName(kind_)));
  }
  return v;
}

absl::StatusOr<uint64_t> JsonValue::AsUint64(absl::string_view field) const {
  uint64_t v = 0;
  if (!is_integer() || text_[0] == '-' || !absl::SimpleAtoi(text_, &v)) {
    return absl::InvalidArgumentError(
        absl::StrCat(field, ": expected a non-negative integer, got ",
                     kind_ == Kind::kNumber ? absl::StrCat("'", text_, "'") : JsonKindName(kind_)));
  }
  return v;
}

namespace {

class Parser {
 public:
  explicit Parser(absl::string_view text) : s_(text) {}

  absl::StatusOr<JsonValue> ParseDocument() {
    SkipSpace();
    absl::StatusOr<JsonValue> v = ParseValue(0);
    if (!v.ok()) return v;
    SkipSpace();
    if (pos_ != s_.size()) return Error("unexpected data after the JSON value");
    return v;
  }

 private:
  absl::Status Error(absl::string_view what) const {
    return absl::InvalidArgumentError(absl::StrCat("JSON byte ", pos_, ": ", what));
  }

  void SkipSpace() {
    while (pos_ < s_.size() &&
           (s_[pos_] == ' ' || s_[pos_] == '\t' || s_[pos_] == '\n' || s_[pos_] == '\r')) {
      ++pos_;
    }
  }

  bool Literal(absl::string_view word) {
    if (s_.substr(pos_, word.size()) != word) return false;
    pos_ += word.size();
    return true;
  }

  absl::StatusOr<JsonValue> ParseValue(int depth) {
    if (depth >= kMaxJsonDepth) {
      return Error(absl::StrCat("nesting deeper than ", kMaxJsonDepth));
    }
    if (pos_ >= s_.size()) return Error("unexpected end of input");
    const char c = s_[pos_];
    if (c == '{') return ParseObject(depth);
    if (c == '[') return ParseArray(depth);
    if (c == '"') {
      absl::StatusOr<std::string> str = ParseString();
      if (!str.ok()) return str.status();
      return JsonValue::String(*std::move(str));
    }
    if (c == '-' || (c >= '0' && c <= '9')) return ParseNumber();
    if (Literal("true")) return JsonValue::Bool(true);
    if (Literal("false")) return JsonValue::Bool(false);
    if (Literal("null")) return JsonValue::Null();
    return Error(absl::StrFormat("unexpected character 0x%02x", static_cast<unsigned char>(c)));
  }

  absl::StatusOr<JsonValue> ParseObject(int depth) {
    ++pos_;  // '{'
    std::vector<JsonValue::Member> members;
    absl::flat_hash_set<std::string> keys;
    SkipSpace();
    if (pos_ < s_.size() && s_[pos_] == '}') {
      ++pos_;
      return JsonValue::Object(std::move(members));
    }
    while (true) {
      SkipSpace();
      if (pos_ >= s_.size() || s_[pos_] != '"') return Error("expected a string key");
      const size_t key_at = pos_;
      absl::StatusOr<std::string> key = ParseString();
      if (!key.ok()) return key.status();
      if (!keys.insert(*key).second) {
        pos_ = key_at;
        return Error(absl::StrCat("duplicate key ", QuoteJson(*key)));
      }
      SkipSpace();
      if (pos_ >= s_.size() || s_[pos_] != ':') return Error("expected ':'");
      ++pos_;
      SkipSpace();
      absl::StatusOr<JsonValue> value = ParseValue(depth + 1);
      if (!value.ok()) return value.status();
      members.emplace_back(*std::move(key), *std::move(value));
      SkipSpace();
      if (pos_ < s_.size() && s_[pos_] == ',') {
        ++pos_;
        continue;
      }
      if (pos_ < s_.size() && s_[pos_] == '}') {
        ++pos_;
        return JsonValue::Object(std::move(members));
      }
      return Error("expected ',' or '}'");
    }
  }

  absl::StatusOr<JsonValue> ParseArray(int depth) {
    ++pos_;  // '['
    std::vector<JsonValue> items;
    SkipSpace();
    if (pos_ < s_.size() && s_[pos_] == ']') {
      ++pos_;
      return JsonValue::Array(std::move(items));
    }
    while (true) {
      SkipSpace();
      absl::StatusOr<JsonValue> value = ParseValue(depth + 1);
      if (!value.ok()) return value.status();
      items.push_back(*std::move(value));
      SkipSpace();
      if (pos_ < s_.size() && s_[pos_] == ',') {
        ++pos_;
        continue;
      }
      if (pos_ < s_.size() && s_[pos_] == ']') {
        ++pos_;
        return JsonValue::Array(std::move(items));
      }
      return Error("expected ',' or ']'");
    }
  }

  absl::StatusOr<JsonValue> ParseNumber() {
    const size_t start = pos_;
    bool integer = true;
    if (s_[pos_] == '-') ++pos_;
    auto digits = [&] {
      const size_t from = pos_;
      while (pos_ < s_.size() && s_[pos_] >= '0' && s_[pos_] <= '9') ++pos_;
      return pos_ - from;
    };
    if (pos_ < s_.size() && s_[pos_] == '0') {
      ++pos_;
    } else if (digits() == 0) {
      return Error("expected digits");
    }
    if (pos_ < s_.size() && s_[pos_] == '.') {
      ++pos_;
      integer = false;
      if (digits() == 0) return Error("expected digits after '.'");
    }
    if (pos_ < s_.size() && (s_[pos_] == 'e' || s_[pos_] == 'E')) {
      ++pos_;
      integer = false;
      if (pos_ < s_.size() && (s_[pos_] == '+' || s_[pos_] == '-')) ++pos_;
      if (digits() == 0) return Error("expected digits in the exponent");
    }
    return JsonValue::Number(std::string(s_.substr(start, pos_ - start)), integer);
  }

  static void AppendUtf8(uint32_t cp, std::string* out) {
    if (cp < 0x80) {
      out->push_back(static_cast<char>(cp));
    } else if (cp < 0x800) {
      out->push_back(static_cast<char>(0xC0 | (cp >> 6)));
      out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
    } else if (cp < 0x10000) {
      out->push_back(static_cast<char>(0xE0 | (cp >> 12)));
      out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
      out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
    } else {
      out->push_back(static_cast<char>(0xF0 | (cp >> 18)));
      out->push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
      out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
      out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
    }
  }

  absl::StatusOr<uint32_t> Hex4() {
    if (pos_ + 4 > s_.size()) return Error("truncated \\u escape");
    uint32_t v = 0;
    for (int i = 0; i < 4; ++i) {
      const char c = s_[pos_ + i];
      v <<= 4;
      if (c >= '0' && c <= '9') {
        v |= static_cast<uint32_t>(c - '0');
      } else if (c >= 'a' && c <= 'f') {
        v |= static_cast<uint32_t>(c - 'a' + 10);
      } else if (c >= 'A' && c <= 'F') {
        v |= static_cast<uint32_t>(c - 'A' + 10);
      } else {
        return Error("bad hex digit in \\u escape");
      }
    }
    pos_ += 4;
    return v;
  }

  // Length of the valid UTF-8 sequence at pos_ (non-ASCII lead byte), or 0.
  size_t Utf8Length() const {
    const auto b = [&](size_t i) { return static_cast<unsigned char>(s_[pos_ + i]); };
    const size_t left = s_.size() - pos_;
    const unsigned char c = b(0);
    auto cont = [&](size_t i) { return i < left && (b(i) & 0xC0) == 0x80; };
    if (c >= 0xC2 && c <= 0xDF) return cont(1) ? 2 : 0;
    if (c >= 0xE0 && c <= 0xEF) {
      if (!cont(1) || !cont(2)) return 0;
      if (c == 0xE0 && b(1) < 0xA0) return 0;   // Overlong.
      if (c == 0xED && b(1) >= 0xA0) return 0;  // Surrogates.
      return 3;
    }
    if (c >= 0xF0 && c <= 0xF4) {
      if (!cont(1) || !cont(2) || !cont(3)) return 0;
      if (c == 0xF0 && b(1) < 0x90) return 0;   // Overlong.
      if (c == 0xF4 && b(1) >= 0x90) return 0;  // Past U+10FFFF.
      return 4;
    }
    return 0;
  }

  absl::StatusOr<std::string> ParseString() {
    ++pos_;  // '"'
    std::string out;
    while (true) {
      if (pos_ >= s_.size()) return Error("unterminated string");
      const unsigned char c = static_cast<unsigned char>(s_[pos_]);
      if (c == '"') {
        ++pos_;
        return out;
      }
      if (c < 0x20) return Error("control character in a string");
      if (c >= 0x80) {
        const size_t n = Utf8Length();
        if (n == 0) return Error("invalid UTF-8 in a string");
        out.append(s_.data() + pos_, n);
        pos_ += n;
        continue;
      }
      if (c != '\\') {
        out.push_back(static_cast<char>(c));
        ++pos_;
        continue;
      }
      ++pos_;
      if (pos_ >= s_.size()) return Error("unterminated escape");
      const char e = s_[pos_++];
      switch (e) {
        case '"':
          out.push_back('"');
          break;
        case '\\':
          out.push_back('\\');
          break;
        case '/':
          out.push_back('/');
          break;
        case 'b':
          out.push_back('\b');
          break;
        case 'f':
          out.push_back('\f');
          break;
        case 'n':
          out.push_back('\n');
          break;
        case 'r':
          out.push_back('\r');
          break;
        case 't':
          out.push_back('\t');
          break;
        case 'u': {
          absl::StatusOr<uint32_t> cp = Hex4();
          if (!cp.ok()) return cp.status();
          if (*cp >= 0xDC00 && *cp <= 0xDFFF) return Error("lone low surrogate in \\u escape");
          if (*cp >= 0xD800 && *cp <= 0xDBFF) {
            if (!Literal("\\u")) return Error("high surrogate without a low one");
            absl::StatusOr<uint32_t> low = Hex4();
            if (!low.ok()) return low.status();
            if (*low < 0xDC00 || *low > 0xDFFF) return Error("high surrogate without a low one");
            *cp = 0x10000 + ((*cp - 0xD800) << 10) + (*low - 0xDC00);
          }
          AppendUtf8(*cp, &out);
          break;
        }
        default:
          --pos_;
          return Error(absl::StrCat("bad escape '\\", std::string(1, e), "'"));
      }
    }
  }

  absl::string_view s_;
  size_t pos_ = 0;
};

}  // namespace

absl::StatusOr<JsonValue> ParseJson(absl::string_view text) { return Parser(text).ParseDocument(); }

std::string QuoteJson(absl::string_view s) {
  std::string out = "\"";
  for (char ch : s) {
    const unsigned char c = static_cast<unsigned char>(ch);
    if (c == '"') {
      out += "\\\"";
    } else if (c == '\\') {
      out += "\\\\";
    } else if (c == '\n') {
      out += "\\n";
    } else if (c < 0x20) {
      out += absl::StrFormat("\\u%04x", c);
    } else {
      out.push_back(ch);
    }
  }
  out += "\"";
  return out;
}

}  // namespace shardcoord
