#include "coordinator/plans/block_copy.h"

#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace shardcoord {
namespace {

using ::testing::HasSubstr;

TensorRecord Rec(const std::string& name, DType dtype, Shape shape) {
  TensorRecord r;
  r.name = name;
  r.dtype = dtype;
  r.shape = std::move(shape);
  return r;
}

std::string Refusal(const BlockCopyArgs& args, const TensorRecord& src, const TensorRecord& dst,
                    const TensorRecord& scale) {
  absl::Status s = CheckBlockCopy(args, src, dst, scale);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  return std::string(s.message());
}

TEST(CheckBlockCopyTest, QuantizeAcceptsAndRefusesNamingFieldAndValues) {
  BlockCopyArgs q{"w", "q", "s", BlockSize{128, 128}, false};
  const TensorRecord src = Rec("w", DType::kBF16, {300, 260});
  const TensorRecord dst = Rec("q", DType::kF8E4M3, {300, 260});
  const TensorRecord scale = Rec("s", DType::kF32, {3, 3});
  EXPECT_TRUE(CheckBlockCopy(q, src, dst, scale).ok());
  EXPECT_THAT(Refusal(q, src, Rec("q", DType::kBF16, {300, 260}), scale),
              HasSubstr("dst: 'q' is bf16; quantize writes f8_e4m3"));
  EXPECT_THAT(Refusal(q, Rec("w", DType::kI32, {300, 260}), dst, scale),
              HasSubstr("src: 'w' is i32"));
  EXPECT_THAT(Refusal(q, Rec("w", DType::kF8E8M0, {300, 260}), dst, scale),
              HasSubstr("other than f8_e8m0"));
  EXPECT_THAT(Refusal(q, src, dst, Rec("s", DType::kF32, {3, 2})),
              HasSubstr("scale: 's' is f32 [3, 2]; quantize with block:128x128 of [300, 260] "
                        "needs f32 [3, 3]"));
  EXPECT_THAT(Refusal(q, src, dst, Rec("s", DType::kBF16, {3, 3})), HasSubstr("needs f32"));
  EXPECT_THAT(Refusal(q, src, Rec("q", DType::kF8E4M3, {300, 261}), scale),
              HasSubstr("dst: 'q' has shape [300, 261], src 'w' has [300, 260]"));
  EXPECT_THAT(Refusal(q, Rec("w", DType::kF32, {8}), Rec("q", DType::kF8E4M3, {8}), scale),
              HasSubstr("two dims"));
  BlockCopyArgs same = q;
  same.scale = "q";
  EXPECT_THAT(Refusal(same, src, dst, dst), HasSubstr("scale: 'q' is also dst"));
}

TEST(CheckBlockCopyTest, DequantizeChecksTheOtherWay) {
  BlockCopyArgs d{"q", "y", "s", BlockSize{4, 8}, true};
  const TensorRecord src = Rec("q", DType::kF8E4M3, {2, 9, 17});
  const TensorRecord scale = Rec("s", DType::kF32, {2, 3, 3});
  EXPECT_TRUE(CheckBlockCopy(d, src, Rec("y", DType::kF32, {2, 9, 17}), scale).ok());
  EXPECT_TRUE(CheckBlockCopy(d, src, Rec("y", DType::kBF16, {2, 9, 17}), scale).ok());
  EXPECT_THAT(
      Refusal(d, Rec("q", DType::kBF16, {2, 9, 17}), Rec("y", DType::kF32, {2, 9, 17}), scale),
      HasSubstr("src: 'q' is bf16; dequantize reads f8_e4m3"));
  EXPECT_THAT(Refusal(d, src, Rec("y", DType::kI8, {2, 9, 17}), scale),
              HasSubstr("dst: 'y' is i8"));
}

}  // namespace
}  // namespace shardcoord
