#ifndef SHARDCOORD_COMMON_JSON_WRITER_H_
#define SHARDCOORD_COMMON_JSON_WRITER_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/strings/string_view.h"
#include "absl/types/span.h"

namespace shardcoord {

// A small streaming JSON writer for CLI output. It writes one line in the style of Python's
// json.dumps ({"a": [1, 2]}), so output is both diffable and easy to read:
//
//   JsonWriter w;
//   w.BeginObject().Key("chunks").BeginArray().Int(1).Int(2).EndArray().EndObject();
//   w.str();  // {"chunks": [1, 2]}
//
// Misuse (a value where a key is expected, a key outside an object, mismatched ends, a second
// top-level value) is a programming error: it makes ok() false and the call is ignored, so
// callers check once at the end instead of after every call.
class JsonWriter {
 public:
  JsonWriter() = default;

  JsonWriter& BeginObject();
  JsonWriter& EndObject();
  JsonWriter& BeginArray();
  JsonWriter& EndArray();
  // The next value belongs to this key; only valid directly inside an object.
  JsonWriter& Key(absl::string_view key);

  // Escapes '"', '\\' and control characters; other bytes (UTF-8) pass through.
  JsonWriter& String(absl::string_view value);
  JsonWriter& Int(int64_t value);
  JsonWriter& Uint(uint64_t value);
  // Shortest text that reads back as the same double; always has a '.' or exponent so that
  // readers keep it a float. NaN and infinities (not JSON numbers) are written as null.
  JsonWriter& Double(double value);
  JsonWriter& Bool(bool value);
  JsonWriter& Null();

  // An array of ints, e.g. a shape: [8, 4].
  JsonWriter& IntArray(absl::Span<const int64_t> values);

  // False after any misuse.
  bool ok() const { return ok_; }
  // True when ok() and exactly one complete top-level value has been written.
  bool complete() const { return ok_ && done_; }
  // The text written so far.
  const std::string& str() const { return out_; }

 private:
  struct Frame {
    bool is_object = false;
    int64_t count = 0;      // Members (or elements) written so far.
    bool have_key = false;  // Objects: a key is waiting for its value.
  };

  // Writes the separator before a value and checks that a value may come here.
  bool BeforeValue();
  // Marks the value just written as finished (top level: the document is done).
  void AfterValue();
  JsonWriter& Scalar(absl::string_view text);
  // Begin/End of an object (else an array); End checks it closes the innermost one.
  JsonWriter& Open(bool is_object);
  JsonWriter& Close(bool is_object);

  std::string out_;
  std::vector<Frame> stack_;
  bool ok_ = true;
  bool done_ = false;
};

// The JSON string literal for `value`, quotes included.
std::string JsonQuote(absl::string_view value);

}  // namespace shardcoord

#endif  // SHARDCOORD_COMMON_JSON_WRITER_H_
