#include "client/npy.h"

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iterator>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace shardcoord {
namespace {

using ::testing::HasSubstr;

// A .npy file with an arbitrary header dict (padded as numpy does) and data.
std::string MakeNpy(absl::string_view dict, absl::string_view data, int major = 1) {
  const size_t length_bytes = major == 1 ? 2 : 4;
  std::string header(dict);
  const size_t unpadded = 6 + 2 + length_bytes + header.size() + 1;
  header.append((64 - unpadded % 64) % 64, ' ');
  header += '\n';
  std::string out = "\x93NUMPY";
  out += static_cast<char>(major);
  out += '\0';
  for (size_t i = 0; i < length_bytes; ++i)
    out += static_cast<char>((header.size() >> (8 * i)) & 0xff);
  out += header;
  out.append(data.data(), data.size());
  return out;
}

std::string Bytes(const void* p, size_t n) { return std::string(static_cast<const char*>(p), n); }

void ExpectInvalid(absl::string_view file, absl::string_view what,
                   const NpyReadOptions& options = {}) {
  absl::StatusOr<NpyArray> a = ParseNpy(file, options);
  ASSERT_FALSE(a.ok()) << "parsed although malformed: " << what;
  EXPECT_EQ(a.status().code(), absl::StatusCode::kInvalidArgument) << a.status();
  EXPECT_THAT(a.status().message(), HasSubstr(what));
}

TEST(NpyTest, DescrOfEveryDType) {
  EXPECT_EQ(NpyDescr(DType::kF32), "<f4");
  EXPECT_EQ(NpyDescr(DType::kF64), "<f8");
  EXPECT_EQ(NpyDescr(DType::kF16), "<f2");
  EXPECT_EQ(NpyDescr(DType::kI32), "<i4");
  EXPECT_EQ(NpyDescr(DType::kI64), "<i8");
  EXPECT_EQ(NpyDescr(DType::kI8), "|i1");
  EXPECT_EQ(NpyDescr(DType::kU8), "|u1");
  EXPECT_EQ(NpyDescr(DType::kBF16), "<u2");
}

TEST(NpyTest, HeaderIsWhatNumpyWrites) {
  absl::StatusOr<std::string> h = NpyHeader(DType::kF32, {2, 3});
  ASSERT_TRUE(h.ok()) << h.status();
  const std::string dict = "{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }";
  ASSERT_EQ(h->size(), 128u);
  EXPECT_EQ(h->substr(0, 8), std::string("\x93NUMPY\x01\x00", 8));
  EXPECT_EQ(static_cast<unsigned char>((*h)[8]) | static_cast<unsigned char>((*h)[9]) << 8, 118);
  EXPECT_EQ(h->substr(10, dict.size()), dict);
  EXPECT_EQ(h->back(), '\n');
  EXPECT_EQ(h->find_first_not_of(' ', 10 + dict.size()), h->size() - 1);

  EXPECT_THAT(*NpyHeader(DType::kI8, {5}),
              HasSubstr("'descr': '|i1', 'fortran_order': False, 'shape': (5,), }"));
  EXPECT_THAT(*NpyHeader(DType::kF64, {}), HasSubstr("'shape': (), }"));
}

TEST(NpyTest, RoundTripsEveryDTypeAndShape) {
  const std::vector<DType> dtypes = {DType::kF32, DType::kF64, DType::kF16, DType::kBF16,
                                     DType::kI8,  DType::kU8,  DType::kI32, DType::kI64};
  const std::vector<Shape> shapes = {{}, {0}, {5}, {2, 3}, {2, 0, 4}, {3, 1, 2, 2}};
  for (DType dtype : dtypes) {
    for (const Shape& shape : shapes) {
      const int64_t bytes = *CheckedBytes(shape, ElementSize(dtype));
      std::string data(bytes, '\0');
      for (int64_t i = 0; i < bytes; ++i) data[i] = static_cast<char>(i * 37 + 11);
      absl::StatusOr<std::string> file = SerializeNpy(dtype, shape, data);
      ASSERT_TRUE(file.ok()) << file.status();
      const size_t header_size = file->size() - data.size();
      EXPECT_EQ(header_size % 64, 0u) << DTypeName(dtype);
      NpyReadOptions options;
      options.u2_as_bf16 = dtype == DType::kBF16;
      absl::StatusOr<NpyArray> a = ParseNpy(*file, options);
      ASSERT_TRUE(a.ok()) << a.status();
      EXPECT_EQ(a->dtype, dtype);
      EXPECT_EQ(a->shape, shape);
      EXPECT_EQ(a->data, data);
    }
  }
}

TEST(NpyTest, ReadsValuesNumpyWrote) {
  // np.save of np.arange(6, dtype='<i8').reshape(3, 2) (numpy 1.24 pads to 128 bytes).
  std::vector<int64_t> values = {0, 1, 2, 3, 4, 5};
  std::string dict = "{'descr': '<i8', 'fortran_order': False, 'shape': (3, 2), }";
  dict.append(118 - dict.size() - 1, ' ');
  std::string file = std::string("\x93NUMPY\x01\x00\x76\x00", 10) + dict + "\n" +
                     Bytes(values.data(), values.size() * 8);
  ASSERT_EQ(file.size(), 128u + 48u);
  absl::StatusOr<NpyArray> a = ParseNpy(file);
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_EQ(a->dtype, DType::kI64);
  EXPECT_EQ(a->shape, (Shape{3, 2}));
  ASSERT_EQ(a->data.size(), 48u);
  int64_t v5;
  std::memcpy(&v5, a->data.data() + 40, 8);
  EXPECT_EQ(v5, 5);
}

TEST(NpyTest, AcceptsHeaderVariants) {
  const float f[2] = {1.5f, -2.0f};
  const std::string data = Bytes(f, sizeof(f));
  // Double quotes, keys in another order, no trailing comma, extra spaces.
  absl::StatusOr<NpyArray> a =
      ParseNpy(MakeNpy("{ \"shape\" : ( 2 , ) ,\"descr\":\"<f4\",  'fortran_order':False}", data));
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_EQ(a->shape, (Shape{2}));
  EXPECT_EQ(a->dtype, DType::kF32);
  // Versions 2.0 and 3.0 use a 4-byte header length.
  for (int major : {2, 3}) {
    a = ParseNpy(
        MakeNpy("{'descr': '<f4', 'fortran_order': False, 'shape': (1, 2), }", data, major));
    ASSERT_TRUE(a.ok()) << a.status();
    EXPECT_EQ(a->shape, (Shape{1, 2}));
  }
  // One-byte types with any byte-order mark; Python 2 long suffixes.
  a = ParseNpy(MakeNpy("{'descr': '<i1', 'fortran_order': False, 'shape': (2L,), }", "ab"));
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_EQ(a->dtype, DType::kI8);
  EXPECT_EQ(a->data, "ab");
}

TEST(NpyTest, LongHeaderUsesVersion2) {
  const Shape shape(30000, 1);  // "1, " per dim: a dict over 64 KiB.
  absl::StatusOr<std::string> file = SerializeNpy(DType::kU8, shape, "z");
  ASSERT_TRUE(file.ok()) << file.status();
  EXPECT_EQ((*file)[6], '\x02');
  EXPECT_EQ((file->size() - 1) % 64, 0u);
  absl::StatusOr<NpyArray> a = ParseNpy(*file);
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_EQ(a->shape, shape);
  EXPECT_EQ(a->data, "z");
}

TEST(NpyTest, Bf16NeedsTheOption) {
  const std::string file = *SerializeNpy(DType::kBF16, {2}, "abcd");
  EXPECT_THAT(file, HasSubstr("'<u2'"));
  absl::StatusOr<NpyArray> plain = ParseNpy(file);  // What NumPy says: u16.
  ASSERT_TRUE(plain.ok()) << plain.status();
  EXPECT_EQ(plain->dtype, DType::kU16);
  NpyReadOptions options;
  options.u2_as_bf16 = true;
  absl::StatusOr<NpyArray> a = ParseNpy(file, options);
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_EQ(a->dtype, DType::kBF16);
  options = {};
  options.bits_of = DType::kBF16;
  EXPECT_EQ(ParseNpy(file, options)->dtype, DType::kBF16);
}

TEST(NpyTest, EveryDTypeRoundTrips) {
  for (DType d : AllDTypes()) {
    const std::string data(static_cast<size_t>(3 * ElementSize(d)), '\x01');
    absl::StatusOr<std::string> file = SerializeNpy(d, {3}, data);
    ASSERT_TRUE(file.ok()) << DTypeName(d) << ": " << file.status();
    NpyReadOptions options;
    if (!NpyHasDType(d)) options.bits_of = d;
    absl::StatusOr<NpyArray> a = ParseNpy(*file, options);
    ASSERT_TRUE(a.ok()) << DTypeName(d) << ": " << a.status();
    EXPECT_EQ(a->dtype, d);
    EXPECT_EQ(a->data, data);
  }
  EXPECT_EQ(NpyDescr(DType::kBool), "|b1");
  EXPECT_EQ(NpyDescr(DType::kU64), "<u8");
  EXPECT_EQ(NpyDescr(DType::kF8E4M3), "|u1");
  EXPECT_FALSE(NpyHasDType(DType::kF8E5M2));
  EXPECT_TRUE(NpyHasDType(DType::kI16));
  // A float8 file without the option is what NumPy says: u8.
  EXPECT_EQ(ParseNpy(*SerializeNpy(DType::kF8E4M3, {1}, "x"))->dtype, DType::kU8);
}

TEST(NpyTest, RejectsBadMagicAndVersion) {
  ExpectInvalid("", "bad magic");
  ExpectInvalid("\x93NUMP", "bad magic");
  ExpectInvalid("PK\x03\x04 this is a zip file, maybe an .npz", "bad magic");
  ExpectInvalid(std::string("\x93NUMPY\x01", 7), "truncated before the version");
  ExpectInvalid(std::string("\x93NUMPY\x04\x00\x10\x00", 10),
                "format version 4.0 is not supported");
  ExpectInvalid(std::string("\x93NUMPY\x01\x00\x10", 9), "truncated inside the header length");
  ExpectInvalid(std::string("\x93NUMPY\x02\x00\x10\x00", 10), "truncated inside the header length");
}

TEST(NpyTest, RejectsTruncatedHeader) {
  const std::string file = *SerializeNpy(DType::kF32, {2, 3}, std::string(24, '\0'));
  ExpectInvalid(file.substr(0, 40), "truncated header: it declares 118 bytes, the file has 30");
  // A length field far beyond the file.
  std::string huge = std::string("\x93NUMPY\x02\x00\xff\xff\xff\x7f", 12) + "{}";
  ExpectInvalid(huge, "truncated header");
}

TEST(NpyTest, RejectsBadDicts) {
  const std::string d4(4, '\0');
  ExpectInvalid(MakeNpy("['descr', '<f4']", d4), "does not start with '{'");
  ExpectInvalid(MakeNpy("{'descr': '<f4', 'fortran_order': False", d4),
                "expected ',' or '}' after the value of 'fortran_order'");
  ExpectInvalid(MakeNpy("{'descr': '<f4', 1: 2}", d4), "expected a quoted string");
  ExpectInvalid(MakeNpy("{'descr' '<f4'}", d4), "expected ':' after key 'descr'");
  ExpectInvalid(MakeNpy("{'descr': '<f4 , 'shape': (1,)}", d4), "expected ',' or '}'");
  ExpectInvalid(MakeNpy("{'descr: 1}", d4), "unterminated string");
  ExpectInvalid(MakeNpy("{'descr': '<f4', 'fortran_order': False, 'shape': (1,)} x", d4),
                "unexpected text after the closing '}'");
  ExpectInvalid(MakeNpy("{'descr': '<f4', 'fortran_order': False}", d4), "missing key 'shape'");
  ExpectInvalid(MakeNpy("{'fortran_order': False, 'shape': (1,)}", d4), "missing key 'descr'");
  ExpectInvalid(MakeNpy("{'descr': '<f4', 'shape': (1,)}", d4), "missing key 'fortran_order'");
  ExpectInvalid(MakeNpy("{'descr': '<f4', 'fortran_order': False, 'shape': (1,), 'x': 'y'}", d4),
                "unexpected key 'x'");
  ExpectInvalid(
      MakeNpy("{'descr': '<f4', 'descr': '<f4', 'fortran_order': False, 'shape': (1,)}", d4),
      "key 'descr' appears twice");
  ExpectInvalid(MakeNpy("{'descr': [('a', '<f4')], 'fortran_order': False, 'shape': (1,)}", d4),
                "expected a string, True, False or a tuple");
  ExpectInvalid(MakeNpy("{'descr': '<f4', 'fortran_order': 0, 'shape': (1,)}", d4),
                "expected a string, True, False or a tuple");
  ExpectInvalid(MakeNpy("{'descr': '<f4', 'fortran_order': 'no', 'shape': (1,)}", d4),
                "'fortran_order' must be True or False");
  ExpectInvalid(MakeNpy("{'descr': '<f4', 'fortran_order': False, 'shape': '1'}", d4),
                "'shape' must be a tuple of ints");
  ExpectInvalid(MakeNpy("{'descr': '<f4', 'fortran_order': False, 'shape': (1)}", d4),
                "a one-element shape must be written '(n,)'");
  ExpectInvalid(MakeNpy("{'descr': '<f4', 'fortran_order': False, 'shape': (-1,)}", d4),
                "expected a non-negative integer");
  ExpectInvalid(MakeNpy("{'descr': '<f4', 'fortran_order': False, 'shape': (1 2)}", d4),
                "expected ',' or ')' in a tuple");
  ExpectInvalid(
      MakeNpy("{'descr': '<f4', 'fortran_order': False, 'shape': (99999999999999999999,)}", d4),
      "integer 99999999999999999999 is too large");
  ExpectInvalid(MakeNpy("{'descr': 'a\\'b', 'fortran_order': False, 'shape': (1,)}", d4),
                "escapes are not supported");
  ExpectInvalid(MakeNpy(std::string("{'descr': '<f4'\0}", 17), d4), "NUL byte");
}

TEST(NpyTest, RejectsFortranOrderAndUnsupportedDTypes) {
  ExpectInvalid(
      MakeNpy("{'descr': '<f4', 'fortran_order': True, 'shape': (2, 2), }", std::string(16, '\0')),
      "fortran_order is True; only C-order arrays are supported");
  ExpectInvalid(
      MakeNpy("{'descr': '>f4', 'fortran_order': False, 'shape': (1,), }", std::string(4, '\0')),
      "dtype '>f4' is big-endian");
  ExpectInvalid(
      MakeNpy("{'descr': '<c8', 'fortran_order': False, 'shape': (1,), }", std::string(8, '\0')),
      "dtype '<c8' is not supported");
  ExpectInvalid(
      MakeNpy("{'descr': '|O', 'fortran_order': False, 'shape': (1,), }", std::string(8, '\0')),
      "dtype '|O' is not supported");
}

TEST(NpyTest, RejectsDataThatDoesNotMatchTheShape) {
  const std::string dict = "{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }";
  ExpectInvalid(MakeNpy(dict, std::string(23, '\0')),
                "data is 23 bytes, but shape [2, 3] of '<f4' needs 24 (truncated)");
  ExpectInvalid(MakeNpy(dict, std::string(25, '\0')),
                "data is 25 bytes, but shape [2, 3] of '<f4' needs 24");
  ExpectInvalid(
      MakeNpy("{'descr': '<f8', 'fortran_order': False, 'shape': (4294967296, 4294967296), }", ""),
      "shape [4294967296, 4294967296] is too large");
}

TEST(NpyTest, SerializeChecksItsInput) {
  absl::StatusOr<std::string> f = SerializeNpy(DType::kF32, {2, 3}, std::string(20, '\0'));
  ASSERT_FALSE(f.ok());
  EXPECT_EQ(f.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(f.status().message(),
              HasSubstr("data is 20 bytes, but shape [2, 3] of f32 needs 24"));
  f = SerializeNpy(DType::kF32, {-1}, "");
  EXPECT_EQ(f.status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(NpyTest, Files) {
  const char* tmp = std::getenv("TEST_TMPDIR");
  const std::string dir = tmp != nullptr ? tmp : "/tmp";
  const std::string path = dir + "/npy_test_a.npy";
  const std::vector<double> values = {0.5, 1.5, -3.0};
  ASSERT_TRUE(WriteNpyFile(path, DType::kF64, {3}, Bytes(values.data(), 24)).ok());
  absl::StatusOr<NpyArray> a = ReadNpyFile(path);
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_EQ(a->shape, (Shape{3}));
  EXPECT_EQ(a->data, Bytes(values.data(), 24));

  EXPECT_EQ(WriteNpyFile(path, DType::kF64, {4}, Bytes(values.data(), 24)).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ReadNpyFile(dir + "/does_not_exist.npy").status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(WriteNpyFile(dir + "/no/such/dir/x.npy", DType::kF64, {0}, "").code(),
            absl::StatusCode::kNotFound);

  const std::string bad = dir + "/npy_test_bad.npy";
  { std::ofstream(bad, std::ios::binary) << "not a numpy file"; }
  a = ReadNpyFile(bad);
  EXPECT_EQ(a.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(a.status().message(), HasSubstr(absl::StrCat(bad, ": malformed .npy: bad magic")));
}

TEST(NpyTest, StreamedFilesMatchWholeOnes) {
  const char* tmp = std::getenv("TEST_TMPDIR");
  const std::string dir = tmp != nullptr ? tmp : "/tmp";
  const std::string path = dir + "/npy_test_streamed.npy";
  std::string data;
  for (int i = 0; i < 1000; ++i) data += static_cast<char>(i * 7);
  {
    absl::StatusOr<std::unique_ptr<NpyFileWriter>> w =
        NpyFileWriter::Create(path, DType::kI32, {10, 25});
    ASSERT_TRUE(w.ok()) << w.status();
    for (size_t at = 0; at < data.size(); at += 333) {
      ASSERT_TRUE((*w)->Append(absl::string_view(data).substr(at, 333)).ok());
    }
    EXPECT_EQ((*w)->Append("x").code(), absl::StatusCode::kInvalidArgument);
    ASSERT_TRUE((*w)->Commit().ok());
  }
  absl::StatusOr<std::string> whole = SerializeNpy(DType::kI32, {10, 25}, data);
  ASSERT_TRUE(whole.ok());
  std::ifstream in(path, std::ios::binary);
  EXPECT_EQ(std::string(std::istreambuf_iterator<char>(in), {}), *whole);

  absl::StatusOr<std::unique_ptr<NpyFileReader>> r = NpyFileReader::Open(path);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ((*r)->header().dtype, DType::kI32);
  EXPECT_EQ((*r)->header().shape, (Shape{10, 25}));
  EXPECT_EQ((*r)->header().data_bytes, 1000);
  std::string got, piece;
  do {
    ASSERT_TRUE((*r)->Read(77, &piece).ok());
    EXPECT_LE(piece.size(), 77u);
    got += piece;
  } while (!piece.empty());
  EXPECT_EQ(got, data);

  // Rewound (a restarted upload), after the end and from the middle: the data again, whole.
  for (int read_first : {0, 1, 0}) {
    ASSERT_TRUE((*r)->Rewind().ok());
    got.clear();
    for (int i = 0; i < read_first; ++i) ASSERT_TRUE((*r)->Read(300, &piece).ok());
    if (read_first > 0) {
      ASSERT_TRUE((*r)->Rewind().ok());
    }
    do {
      ASSERT_TRUE((*r)->Read(300, &piece).ok());
      got += piece;
    } while (!piece.empty());
    EXPECT_EQ(got, data) << "after reading " << read_first;
  }
}

TEST(NpyTest, UncommittedWriterLeavesTheOldFileAndReaderChecksTheSize) {
  const char* tmp = std::getenv("TEST_TMPDIR");
  const std::string dir = tmp != nullptr ? tmp : "/tmp";
  const std::string path = dir + "/npy_test_keep.npy";
  ASSERT_TRUE(WriteNpyFile(path, DType::kU8, {3}, "abc").ok());
  {
    absl::StatusOr<std::unique_ptr<NpyFileWriter>> w = NpyFileWriter::Create(path, DType::kU8, {5});
    ASSERT_TRUE(w.ok());
    ASSERT_TRUE((*w)->Append("xy").ok());
    EXPECT_EQ((*w)->Commit().code(), absl::StatusCode::kInvalidArgument);  // 2 of 5 bytes.
  }
  absl::StatusOr<NpyArray> kept = ReadNpyFile(path);
  ASSERT_TRUE(kept.ok()) << kept.status();
  EXPECT_EQ(kept->data, "abc");
  EXPECT_FALSE(std::ifstream(path + ".partial").good());

  absl::StatusOr<std::string> npy = SerializeNpy(DType::kU8, {4}, "abcd");
  ASSERT_TRUE(npy.ok());
  const std::string truncated = dir + "/npy_test_truncated.npy";
  { std::ofstream(truncated, std::ios::binary) << npy->substr(0, npy->size() - 1); }
  absl::StatusOr<std::unique_ptr<NpyFileReader>> r = NpyFileReader::Open(truncated);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(r.status().message(), HasSubstr("data is 3 bytes"));
  EXPECT_THAT(r.status().message(), HasSubstr("(truncated)"));
  const std::string bad = dir + "/npy_test_bad2.npy";
  { std::ofstream(bad, std::ios::binary) << "\x93NUM"; }
  r = NpyFileReader::Open(bad);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(r.status().message(), HasSubstr(bad));
}

}  // namespace
}  // namespace shardcoord
