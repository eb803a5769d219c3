#include "common/json_writer.h"

#include <cmath>
#include <cstdio>
#include <cstdlib>

#include "absl/strings/str_cat.h"

namespace shardcoord {

std::string JsonQuote(absl::string_view value) {
  std::string out;
  out.reserve(value.size() + 2);
  out.push_back('"');
  for (char c : value) {
    switch (c) {
      case '"':
        out += "\\\"";
        break;
      case '\\':
        out += "\\\\";
        break;
      case '\b':
        out += "\\b";
        break;
      case '\f':
        out += "\\f";
        break;
      case '\n':
        out += "\\n";
        break;
      case '\r':
        out += "\\r";
        break;
      case '\t':
        out += "\\t";
        break;
      default:
        if (static_cast<unsigned char>(c) < 0x20) {
          char buf[8];
          std::snprintf(buf, sizeof(buf), "\\u%04x", static_cast<unsigned char>(c));
          out += buf;
        } else {
          out.push_back(c);
        }
    }
  }
  out.push_back('"');
  return out;
}

bool JsonWriter::BeforeValue() {
  if (!ok_ || done_) {
    ok_ = false;
    return false;
  }
  if (stack_.empty()) return true;
  Frame& top = stack_.back();
  if (top.is_object) {
    if (!top.have_key) ok_ = false;  // A value inside an object needs a key first.
    return ok_;
  }
  if (top.count > 0) out_ += ", ";
  return true;
}

void JsonWriter::AfterValue() {
  if (stack_.empty()) {
    done_ = true;
    return;
  }
  ++stack_.back().count;
  stack_.back().have_key = false;
}

JsonWriter& JsonWriter::Scalar(absl::string_view text) {
  if (!BeforeValue()) return *this;
  out_.append(text.data(), text.size());
  AfterValue();
  return *this;
}

JsonWriter& JsonWriter::Open(bool is_object) {
  if (!BeforeValue()) return *this;
  out_.push_back(is_object ? '{' : '[');
  stack_.push_back(Frame{is_object, 0, false});
  return *this;
}

JsonWriter& JsonWriter::Close(bool is_object) {
  // An array's frame never has a key waiting.
  if (!ok_ || stack_.empty() || stack_.back().is_object != is_object || stack_.back().have_key) {
    ok_ = false;
    return *this;
  }
  out_.push_back(is_object ? '}' : ']');
  stack_.pop_back();
  AfterValue();
  return *this;
}

JsonWriter& JsonWriter::BeginObject() { return Open(/*is_object=*/true); }

JsonWriter& JsonWriter::EndObject() { return Close(/*is_object=*/true); }

JsonWriter& JsonWriter::BeginArray() { return Open(/*is_object=*/false); }

JsonWriter& JsonWriter::EndArray() { return Close(/*is_object=*/false); }

JsonWriter& JsonWriter::Key(absl::string_view key) {
  if (!ok_ || stack_.empty() || !stack_.back().is_object || stack_.back().have_key) {
    ok_ = false;
    return *this;
  }
  Frame& top = stack_.back();
  if (top.count > 0) out_ += ", ";
  out_ += JsonQuote(key);
  out_ += ": ";
  top.have_key = true;
  return *this;
}

JsonWriter& JsonWriter::String(absl::string_view value) { return Scalar(JsonQuote(value)); }

JsonWriter& JsonWriter::Int(int64_t value) { return Scalar(absl::StrCat(value)); }

JsonWriter& JsonWriter::Uint(uint64_t value) { return Scalar(absl::StrCat(value)); }

JsonWriter& JsonWriter::Double(double value) {
  if (!std::isfinite(value)) return Null();
  // The shortest %g precision that round-trips; 17 digits always does.
  char buf[32];
  for (int precision = 1; precision <= 17; ++precision) {
    std::snprintf(buf, sizeof(buf), "%.*g", precision, value);
    if (std::strtod(buf, nullptr) == value) break;
  }
  std::string text = buf;
  if (text.find_first_of(".eE") == std::string::npos) text += ".0";  // Keep it a float.
  return Scalar(text);
}

JsonWriter& JsonWriter::Bool(bool value) { return Scalar(value ? "true" : "false"); }

JsonWriter& JsonWriter::Null() { return Scalar("null"); }

JsonWriter& JsonWriter::IntArray(absl::Span<const int64_t> values) {
  BeginArray();
  for (int64_t v : values) Int(v);
  return EndArray();
}

}  // namespace shardcoord
