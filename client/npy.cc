#include "client/npy.h"

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <optional>
#include <sstream>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace shardcoord {
namespace {

constexpr char kMagic[] = "\x93NUMPY";
constexpr size_t kMagicSize = 6;
// The header dict is padded so that the data starts at a multiple of this.
constexpr size_t kAlignment = 64;

absl::Status Invalid(absl::string_view what) {
  return absl::InvalidArgumentError(absl::StrCat("malformed .npy: ", what));
}

// Shown in errors: the header as text, shortened, control characters escaped.
std::string Excerpt(absl::string_view text) {
  constexpr size_t kMax = 80;
  std::string out;
  for (char c : text.substr(0, kMax)) {
    if (absl::ascii_isprint(static_cast<unsigned char>(c))) {
      out += c;
    } else {
      out += '?';
    }
  }
  if (text.size() > kMax) out += "...";
  return out;
}

// A recursive-descent reader for the Python dict literal numpy writes, e.g.
// {'descr': '<f4', 'fortran_order': False, 'shape': (64, 48), }
// It accepts exactly what the dict can hold: strings, True/False, tuples of non-negative ints.
class HeaderParser {
 public:
  explicit HeaderParser(absl::string_view text) : text_(text) {}

  struct Value {
    enum class Kind { kString, kBool, kTuple } kind = Kind::kString;
    std::string str;
    bool boolean = false;
    std::vector<int64_t> ints;
  };

  // Parses the whole dict; calls `on_item` for each key/value in order.
  template <typename F>
  absl::Status ParseDict(F on_item) {
    SkipSpace();
    if (!Consume('{')) return Error("the header does not start with '{'");
    SkipSpace();
    while (!Consume('}')) {
      std::string key;
      if (absl::Status s = ParseString(&key); !s.ok()) return s;
      SkipSpace();
      if (!Consume(':')) return Error(absl::StrCat("expected ':' after key '", key, "'"));
      SkipSpace();
      Value value;
      if (absl::Status s = ParseValue(&value); !s.ok()) return s;
      if (absl::Status s = on_item(key, value); !s.ok()) return s;
      SkipSpace();
      if (Consume(',')) {
        SkipSpace();
      } else if (Peek() != '}') {
        return Error(absl::StrCat("expected ',' or '}' after the value of '", key, "'"));
      }
    }
    SkipSpace();
    if (pos_ != text_.size()) return Error("unexpected text after the closing '}'");
    return absl::OkStatus();
  }

 private:
  char Peek() const { return pos_ < text_.size() ? text_[pos_] : '\0'; }
  bool Consume(char c) {
    if (Peek() != c || pos_ >= text_.size()) return false;
    ++pos_;
    return true;
  }
  void SkipSpace() {
    while (pos_ < text_.size() && (text_[pos_] == ' ' || text_[pos_] == '\t' ||
                                   text_[pos_] == '\n' || text_[pos_] == '\r')) {
      ++pos_;
    }
  }
  absl::Status Error(absl::string_view what) const {
    return Invalid(
        absl::StrCat("header dict: ", what, " at character ", pos_, " of '", Excerpt(text_), "'"));
  }

  absl::Status ParseString(std::string* out) {
    const char quote = Peek();
    if (quote != '\'' && quote != '"') return Error("expected a quoted string");
    ++pos_;
    const size_t end = text_.find(quote, pos_);
    if (end == absl::string_view::npos) return Error("unterminated string");
    const absl::string_view body = text_.substr(pos_, end - pos_);
    // numpy never writes escapes; a backslash means this is not a header numpy wrote.
    if (body.find('\\') != absl::string_view::npos) return Error("escapes are not supported");
    *out = std::string(body);
    pos_ = end + 1;
    return absl::OkStatus();
  }

  absl::Status ParseInt(int64_t* out) {
    const size_t start = pos_;
    while (pos_ < text_.size() && absl::ascii_isdigit(static_cast<unsigned char>(text_[pos_]))) {
      ++pos_;
    }
    // Python 2 era files may carry a long suffix.
    const absl::string_view digits = text_.substr(start, pos_ - start);
    if (Peek() == 'L') ++pos_;
    if (digits.empty()) return Error("expected a non-negative integer");
    if (!absl::SimpleAtoi(digits, out))
      return Error(absl::StrCat("integer ", digits, " is too large"));
    return absl::OkStatus();
  }

  absl::Status ParseValue(Value* value) {
    const char c = Peek();
    if (c == '\'' || c == '"') {
      value->kind = Value::Kind::kString;
      return ParseString(&value->str);
    }
    if (text_.substr(pos_, 4) == "True") {
      value->kind = Value::Kind::kBool;
      value->boolean = true;
      pos_ += 4;
      return absl::OkStatus();
    }
    if (text_.substr(pos_, 5) == "False") {
      value->kind = Value::Kind::kBool;
      value->boolean = false;
      pos_ += 5;
      return absl::OkStatus();
    }
    if (c == '(') {
      ++pos_;
      value->kind = Value::Kind::kTuple;
      SkipSpace();
      bool trailing_comma = false;
      while (!Consume(')')) {
        int64_t v;
        if (absl::Status s = ParseInt(&v); !s.ok()) return s;
        value->ints.push_back(v);
        SkipSpace();
        trailing_comma = Consume(',');
        if (!trailing_comma && Peek() != ')') return Error("expected ',' or ')' in a tuple");
        SkipSpace();
      }
      // In Python "(5)" is the int 5, not a tuple.
      if (value->ints.size() == 1 && !trailing_comma) {
        return Error("a one-element shape must be written '(n,)'");
      }
      return absl::OkStatus();
    }
    return Error("expected a string, True, False or a tuple");
  }

  absl::string_view text_;
  size_t pos_ = 0;
};

struct DescrInfo {
  DType dtype;
  const char* descr;
  bool numpy;  // NumPy has the dtype; else the descr is the unsigned integer of its bits.
};

constexpr DescrInfo kDescrs[] = {
    {DType::kF32, "<f4", true},     {DType::kF64, "<f8", true},     {DType::kF16, "<f2", true},
    {DType::kI32, "<i4", true},     {DType::kI64, "<i8", true},     {DType::kI8, "|i1", true},
    {DType::kU8, "|u1", true},      {DType::kBool, "|b1", true},    {DType::kI16, "<i2", true},
    {DType::kU16, "<u2", true},     {DType::kU32, "<u4", true},     {DType::kU64, "<u8", true},
    {DType::kBF16, "<u2", false},   {DType::kF8E4M3, "|u1", false}, {DType::kF8E5M2, "|u1", false},
    {DType::kF8E8M0, "|u1", false},
};

absl::StatusOr<DType> DTypeFromDescr(absl::string_view descr, const NpyReadOptions& options) {
  // Byte order does not apply to one-byte types; numpy writes '|' but accepts the others.
  std::string normalized(descr);
  if (normalized.size() == 3 && normalized[2] == '1' &&
      (normalized[0] == '<' || normalized[0] == '>' || normalized[0] == '=')) {
    normalized[0] = '|';
  }
  std::optional<DType> bits = options.bits_of;
  if (options.u2_as_bf16) bits = DType::kBF16;
  for (const DescrInfo& d : kDescrs) {
    if (!d.numpy && bits == d.dtype && normalized == d.descr) return d.dtype;
  }
  for (const DescrInfo& d : kDescrs) {
    if (d.numpy && normalized == d.descr) return d.dtype;
  }
  if (!descr.empty() && descr[0] == '>') {
    return Invalid(absl::StrCat("dtype '", descr,
                                "' is big-endian; only little-endian arrays are supported "
                                "(convert with a.astype('<",
                                descr.substr(1), "'))"));
  }
  return Invalid(absl::StrCat("dtype '", descr,
                              "' is not supported; supported: <f4 <f8 <f2 <i8 <i4 <i2 |i1 <u8 <u4 "
                              "<u2 |u1 |b1 (and <u2 as bf16 bits, |u1 as float8 bits)"));
}

uint32_t ReadLittleEndian(absl::string_view bytes) {
  uint32_t v = 0;
  for (size_t i = bytes.size(); i-- > 0;) v = (v << 8) | static_cast<unsigned char>(bytes[i]);
  return v;
}

std::string ShapeTuple(const Shape& shape) {
  if (shape.size() == 1) return absl::StrCat("(", shape[0], ",)");
  return absl::StrCat("(", absl::StrJoin(shape, ", "), ")");
}

// Called after NpyHeader validated the shape, so the byte count cannot overflow.
absl::Status CheckDataSize(DType dtype, const Shape& shape, size_t size) {
  const int64_t expected = *CheckedBytes(shape, ElementSize(dtype));
  if (static_cast<uint64_t>(expected) == size) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat("data is ", size, " bytes, but shape ",
                                                 ShapeToString(shape), " of ", DTypeName(dtype),
                                                 " needs ", expected));
}

absl::Status IoError(const std::string& path, absl::string_view action, int err) {
  const std::string message =
      absl::StrCat("cannot ", action, " '", path, "': ", std::strerror(err));
  if (err == ENOENT) return absl::NotFoundError(message);
  if (err == EACCES || err == EPERM) return absl::PermissionDeniedError(message);
  return absl::InternalError(message);
}

// The fixed start of an .npy file: magic, version, and the header dict's length.
struct NpyPrefix {
  size_t size = 0;          // Bytes of magic, version and length field.
  uint64_t header_len = 0;  // Bytes of the header dict that follow.
};

absl::StatusOr<NpyPrefix> ParseNpyPrefix(absl::string_view file) {
  if (file.size() < kMagicSize ||
      file.substr(0, kMagicSize) != absl::string_view(kMagic, kMagicSize)) {
    return Invalid("bad magic: the file does not start with \\x93NUMPY");
  }
  if (file.size() < kMagicSize + 2) return Invalid("truncated before the version bytes");
  const int major = static_cast<unsigned char>(file[kMagicSize]);
  const int minor = static_cast<unsigned char>(file[kMagicSize + 1]);
  size_t length_bytes;
  if (major == 1 && minor == 0) {
    length_bytes = 2;
  } else if ((major == 2 || major == 3) && minor == 0) {
    length_bytes = 4;
  } else {
    return Invalid(absl::StrCat("format version ", major, ".", minor,
                                " is not supported (1.0, 2.0, 3.0 are)"));
  }
  NpyPrefix out;
  out.size = kMagicSize + 2 + length_bytes;
  if (file.size() < out.size) return Invalid("truncated inside the header length");
  out.header_len = ReadLittleEndian(file.substr(kMagicSize + 2, length_bytes));
  return out;
}

}  // namespace

bool NpyHasDType(DType dtype) {
  for (const DescrInfo& d : kDescrs) {
    if (d.dtype == dtype) return d.numpy;
  }
  return false;
}

std::string NpyDescr(DType dtype) {
  for (const DescrInfo& d : kDescrs) {
    if (d.dtype == dtype) return d.descr;
  }
  return "";
}

absl::StatusOr<NpyFileHeader> ParseNpyHeader(absl::string_view file,
                                             const NpyReadOptions& options) {
  absl::StatusOr<NpyPrefix> start = ParseNpyPrefix(file);
  if (!start.ok()) return start.status();
  const size_t prefix = start->size;
  const uint64_t header_len = start->header_len;
  if (file.size() - prefix < header_len) {
    return Invalid(absl::StrCat("truncated header: it declares ", header_len,
                                " bytes, the file has ", file.size() - prefix,
                                " after the prefix"));
  }
  const absl::string_view header = file.substr(prefix, header_len);
  if (header.find('\0') != absl::string_view::npos) return Invalid("header contains a NUL byte");

  std::optional<std::string> descr;
  std::optional<bool> fortran_order;
  std::optional<Shape> shape;
  HeaderParser parser(header);
  absl::Status parsed = parser.ParseDict(
      [&](const std::string& key, const HeaderParser::Value& value) -> absl::Status {
        using Kind = HeaderParser::Value::Kind;
        if (key == "descr") {
          if (descr) return Invalid("header dict: key 'descr' appears twice");
          if (value.kind != Kind::kString) {
            return Invalid(
                "header dict: 'descr' must be a string (structured dtypes are not supported)");
          }
          descr = value.str;
        } else if (key == "fortran_order") {
          if (fortran_order) return Invalid("header dict: key 'fortran_order' appears twice");
          if (value.kind != Kind::kBool)
            return Invalid("header dict: 'fortran_order' must be True or False");
          fortran_order = value.boolean;
        } else if (key == "shape") {
          if (shape) return Invalid("header dict: key 'shape' appears twice");
          if (value.kind != Kind::kTuple)
            return Invalid("header dict: 'shape' must be a tuple of ints");
          shape = value.ints;
        } else {
          return Invalid(absl::StrCat("header dict: unexpected key '", key,
                                      "' (want descr, fortran_order, shape)"));
        }
        return absl::OkStatus();
      });
  if (!parsed.ok()) return parsed;
  if (!descr) return Invalid("header dict: missing key 'descr'");
  if (!fortran_order) return Invalid("header dict: missing key 'fortran_order'");
  if (!shape) return Invalid("header dict: missing key 'shape'");
  if (*fortran_order) {
    return Invalid(
        "fortran_order is True; only C-order arrays are supported "
        "(save np.ascontiguousarray(a) instead)");
  }
  absl::StatusOr<DType> dtype = DTypeFromDescr(*descr, options);
  if (!dtype.ok()) return dtype.status();
  absl::StatusOr<int64_t> expected = CheckedBytes(*shape, ElementSize(*dtype));
  if (!expected.ok()) {
    return Invalid(absl::StrCat("shape ", ShapeToString(*shape),
                                " is too large: ", expected.status().message()));
  }
  NpyFileHeader out;
  out.dtype = *dtype;
  out.shape = *std::move(shape);
  out.descr = *std::move(descr);
  out.data_offset = static_cast<int64_t>(prefix + header_len);
  out.data_bytes = *expected;
  return out;
}

absl::Status CheckNpyDataSize(const NpyFileHeader& header, uint64_t data_size) {
  if (static_cast<uint64_t>(header.data_bytes) == data_size) return absl::OkStatus();
  return Invalid(
      absl::StrCat("data is ", data_size, " bytes, but shape ", ShapeToString(header.shape),
                   " of '", header.descr, "' needs ", header.data_bytes,
                   data_size < static_cast<uint64_t>(header.data_bytes) ? " (truncated)" : ""));
}

absl::StatusOr<NpyArray> ParseNpy(absl::string_view file, const NpyReadOptions& options) {
  absl::StatusOr<NpyFileHeader> header = ParseNpyHeader(file, options);
  if (!header.ok()) return header.status();
  const absl::string_view data = file.substr(static_cast<size_t>(header->data_offset));
  if (absl::Status s = CheckNpyDataSize(*header, data.size()); !s.ok()) return s;
  NpyArray array;
  array.dtype = header->dtype;
  array.shape = std::move(header->shape);
  array.data = std::string(data);
  return array;
}

absl::StatusOr<std::string> NpyHeader(DType dtype, const Shape& shape) {
  absl::StatusOr<int64_t> bytes = CheckedBytes(shape, ElementSize(dtype));
  if (!bytes.ok()) return bytes.status();
  const std::string descr = NpyDescr(dtype);
  if (descr.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("dtype ", static_cast<int>(dtype), " has no .npy equivalent"));
  }
  std::string dict = absl::StrCat("{'descr': '", descr,
                                  "', 'fortran_order': False, 'shape': ", ShapeTuple(shape), ", }");
  // Pad with spaces and end with '\n' so the data is aligned, as numpy does.
  auto build = [&](int major, size_t length_bytes) -> std::string {
    const size_t unpadded = kMagicSize + 2 + length_bytes + dict.size() + 1;
    const size_t padding = (kAlignment - unpadded % kAlignment) % kAlignment;
    const size_t header_len = dict.size() + padding + 1;
    std::string out(kMagic, kMagicSize);
    out += static_cast<char>(major);
    out += '\0';
    for (size_t i = 0; i < length_bytes; ++i)
      out += static_cast<char>((header_len >> (8 * i)) & 0xff);
    out += dict;
    out.append(padding, ' ');
    out += '\n';
    return out;
  };
  std::string v1 = build(1, 2);
  if (v1.size() - (kMagicSize + 4) <= 0xffff) return v1;
  return build(2, 4);
}

absl::StatusOr<std::string> SerializeNpy(DType dtype, const Shape& shape, absl::string_view data) {
  absl::StatusOr<std::string> header = NpyHeader(dtype, shape);
  if (!header.ok()) return header.status();
  if (absl::Status s = CheckDataSize(dtype, shape, data.size()); !s.ok()) return s;
  std::string out = *std::move(header);
  out.append(data.data(), data.size());
  return out;
}

absl::StatusOr<NpyArray> ReadNpyFile(const std::string& path, const NpyReadOptions& options) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return IoError(path, "open", errno);
  std::ostringstream buffer;
  buffer << in.rdbuf();
  if (in.bad()) return IoError(path, "read", errno);
  absl::StatusOr<NpyArray> array = ParseNpy(buffer.str(), options);
  if (!array.ok()) {
    return absl::Status(array.status().code(), absl::StrCat(path, ": ", array.status().message()));
  }
  return array;
}

absl::Status WriteNpyFile(const std::string& path, DType dtype, const Shape& shape,
                          absl::string_view data) {
  absl::StatusOr<std::string> header = NpyHeader(dtype, shape);
  if (!header.ok()) return header.status();
  if (absl::Status s = CheckDataSize(dtype, shape, data.size()); !s.ok()) return s;
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  if (!out) return IoError(path, "create", errno);
  out.write(header->data(), header->size());
  out.write(data.data(), data.size());
  out.close();
  if (!out) return IoError(path, "write", errno);
  return absl::OkStatus();
}

// ---- Streaming ---------------------------------------------------------------------------

namespace {

// Opens `path` into `in` (binary, at its start); its size in bytes.
absl::StatusOr<std::streamoff> OpenAndMeasure(const std::string& path, std::ifstream& in) {
  in.open(path, std::ios::binary);
  if (!in) return IoError(path, "open", errno);
  in.seekg(0, std::ios::end);
  const std::streamoff size = in.tellg();
  in.seekg(0, std::ios::beg);
  if (size < 0 || !in) return IoError(path, "read", errno);
  return size;
}

}  // namespace

absl::StatusOr<std::unique_ptr<NpyFileReader>> NpyFileReader::Open(const std::string& path,
                                                                   const NpyReadOptions& options) {
  auto reader = std::unique_ptr<NpyFileReader>(new NpyFileReader());
  std::ifstream& in = reader->in_;
  const absl::StatusOr<std::streamoff> opened = OpenAndMeasure(path, in);
  if (!opened.ok()) return opened.status();
  const std::streamoff size = *opened;
  auto prefixed = [&](const absl::Status& s) {
    return absl::Status(s.code(), absl::StrCat(path, ": ", s.message()));
  };
  // The fixed prefix first (magic, version, header length), then the whole header.
  auto read_prefix = [&](size_t n, std::string* out) -> absl::Status {
    n = std::min<size_t>(n, static_cast<size_t>(size));
    out->resize(n);
    in.seekg(0, std::ios::beg);
    in.read(out->data(), static_cast<std::streamsize>(n));
    if (static_cast<size_t>(in.gcount()) != n) return IoError(path, "read", errno);
    return absl::OkStatus();
  };
  std::string prefix;
  if (absl::Status s = read_prefix(kMagicSize + 6, &prefix); !s.ok()) return s;
  absl::StatusOr<NpyPrefix> start = ParseNpyPrefix(prefix);
  if (!start.ok()) return prefixed(start.status());
  const uint64_t header_end = start->size + start->header_len;
  if (header_end > prefix.size()) {
    if (absl::Status s = read_prefix(header_end, &prefix); !s.ok()) return s;
  }
  absl::StatusOr<NpyFileHeader> header = ParseNpyHeader(prefix, options);
  if (!header.ok()) return prefixed(header.status());
  const uint64_t data_size =
      static_cast<uint64_t>(size) - static_cast<uint64_t>(header->data_offset);
  if (absl::Status s = CheckNpyDataSize(*header, data_size); !s.ok()) return prefixed(s);
  in.seekg(header->data_offset, std::ios::beg);
  if (!in) return IoError(path, "read", errno);
  reader->path_ = path;
  reader->header_ = *std::move(header);
  return reader;
}

absl::Status NpyFileReader::Read(size_t max_bytes, std::string* out) {
  const uint64_t left = static_cast<uint64_t>(header_.data_bytes - done_);
  const size_t n = static_cast<size_t>(std::min<uint64_t>(left, max_bytes));
  out->resize(n);
  if (n == 0) return absl::OkStatus();
  in_.read(out->data(), static_cast<std::streamsize>(n));
  if (static_cast<size_t>(in_.gcount()) != n) return IoError(path_, "read", errno);
  done_ += static_cast<int64_t>(n);
  return absl::OkStatus();
}

absl::Status NpyFileReader::Rewind() {
  in_.clear();  // A read that hit the end set eofbit.
  in_.seekg(header_.data_offset, std::ios::beg);
  if (!in_) return IoError(path_, "seek", errno);
  done_ = 0;
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<NpyFileReader>> NpyFileReader::OpenRaw(const std::string& path,
                                                                      DType dtype,
                                                                      const Shape& shape) {
  absl::StatusOr<int64_t> bytes = CheckedBytes(shape, ElementSize(dtype));
  if (!bytes.ok()) return bytes.status();
  auto reader = std::unique_ptr<NpyFileReader>(new NpyFileReader());
  std::ifstream& in = reader->in_;
  const absl::StatusOr<std::streamoff> opened = OpenAndMeasure(path, in);
  if (!opened.ok()) return opened.status();
  const std::streamoff size = *opened;
  if (static_cast<int64_t>(size) != *bytes) {
    return Invalid(absl::StrCat(path, ": holds ", static_cast<int64_t>(size), " bytes but a ",
                                ShapeToString(shape), " ", DTypeName(dtype), " array is ", *bytes,
                                " (raw files are C-order little-endian elements, nothing else)"));
  }
  reader->path_ = path;
  reader->header_.dtype = dtype;
  reader->header_.shape = shape;
  reader->header_.data_offset = 0;
  reader->header_.data_bytes = *bytes;
  return reader;
}

absl::StatusOr<std::unique_ptr<NpyFileWriter>> NpyFileWriter::Create(const std::string& path,
                                                                     DType dtype,
                                                                     const Shape& shape, bool raw) {
  absl::StatusOr<std::string> header =
      raw ? absl::StatusOr<std::string>(std::string()) : NpyHeader(dtype, shape);
  if (!header.ok()) return header.status();
  if (absl::StatusOr<int64_t> b = CheckedBytes(shape, ElementSize(dtype)); !b.ok()) {
    return b.status();
  }
  auto writer = std::unique_ptr<NpyFileWriter>(new NpyFileWriter());
  writer->path_ = path;
  writer->temp_path_ = absl::StrCat(path, ".partial");
  writer->dtype_ = dtype;
  writer->shape_ = shape;
  writer->data_bytes_ = *CheckedBytes(shape, ElementSize(dtype));
  writer->out_.open(writer->temp_path_, std::ios::binary | std::ios::trunc);
  if (!writer->out_) return IoError(writer->temp_path_, "create", errno);
  writer->created_ = true;
  writer->out_.write(header->data(), static_cast<std::streamsize>(header->size()));
  if (!writer->out_) return IoError(writer->temp_path_, "write", errno);
  return writer;
}

NpyFileWriter::~NpyFileWriter() {
  if (created_ && !committed_) {
    out_.close();
    std::remove(temp_path_.c_str());
  }
}

absl::Status NpyFileWriter::Append(absl::string_view data) {
  if (written_ + static_cast<int64_t>(data.size()) > data_bytes_) {
    return absl::InvalidArgumentError(absl::StrCat("data: more than the ", data_bytes_,
                                                   " bytes of a ", ShapeToString(shape_), " ",
                                                   DTypeName(dtype_), " array"));
  }
  out_.write(data.data(), static_cast<std::streamsize>(data.size()));
  if (!out_) return IoError(temp_path_, "write", errno);
  written_ += static_cast<int64_t>(data.size());
  return absl::OkStatus();
}

absl::Status NpyFileWriter::Commit() {
  if (absl::Status s = CheckDataSize(dtype_, shape_, static_cast<size_t>(written_)); !s.ok()) {
    return s;
  }
  out_.close();
  if (!out_) return IoError(temp_path_, "write", errno);
  if (std::rename(temp_path_.c_str(), path_.c_str()) != 0) return IoError(path_, "create", errno);
  committed_ = true;
  return absl::OkStatus();
}

}  // namespace shardcoord
