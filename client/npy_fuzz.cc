// Fuzzes the .npy reader (`shardctl tensor upload` reads user files): ParseNpyHeader and
// ParseNpy must only ever return statuses, and an array that parses must serialize back to a
// file that parses to the same array. Byte 0 of the input picks the read options (bf16 for
// '<u2'); the rest is the file.

#include <cstddef>
#include <cstdint>

#include "absl/strings/string_view.h"
#include "client/npy.h"
#include "sharding/testing/fuzz_check.h"

constexpr shardcoord::sharding_testing::FuzzCheck Check{"npy_fuzz"};

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace shardcoord;
  if (size == 0) return 0;
  NpyReadOptions options;
  options.u2_as_bf16 = (data[0] & 1) != 0;
  const absl::string_view file(reinterpret_cast<const char*>(data + 1), size - 1);

  absl::StatusOr<NpyFileHeader> header = ParseNpyHeader(file, options);
  absl::StatusOr<NpyArray> array = ParseNpy(file, options);
  if (!header.ok()) {
    Check(!array.ok(), "ParseNpy accepts what ParseNpyHeader rejects");
    return 0;
  }
  Check(header->data_offset >= 0 && static_cast<size_t>(header->data_offset) <= file.size(),
        "data offset outside the file");
  Check(header->data_bytes >= 0, "negative data size");
  Check(CheckNpyDataSize(*header, file.size() - header->data_offset).ok() == array.ok(),
        "CheckNpyDataSize and ParseNpy disagree");
  if (!array.ok()) return 0;
  Check(array->dtype == header->dtype && array->shape == header->shape, "header and array differ");

  absl::StatusOr<std::string> again = SerializeNpy(array->dtype, array->shape, array->data);
  Check(again.ok(), "a parsed array does not serialize");
  absl::StatusOr<NpyArray> reread = ParseNpy(*again, options);
  Check(reread.ok(), "a serialized array does not parse");
  Check(
      reread->dtype == array->dtype && reread->shape == array->shape && reread->data == array->data,
      "a serialized array parses to another");
  return 0;
}
