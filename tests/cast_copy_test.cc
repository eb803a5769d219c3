// Copies that cast (issue 28) through real daemons: a coordinator and four CPU workers over
// Gloo. src is uploaded with chosen bit patterns (NaNs with payloads, infinities, signed
// zeros, subnormals, ties, values past FP8's range, and pseudo-random patterns), copied into
// a dst of another dtype on another mesh and layout, downloaded, and compared byte for byte
// with sharding/cast.h's conversion of the uploaded bytes; likewise a prepared transfer's runs
// and a checkpoint load with a dtype. Pairs the cast table refuses are
// INVALID_ARGUMENT naming both dtypes and change nothing.

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "proto/convert.h"
#include "sharding/cast.h"
#include "tests/cluster.h"
#include "tests/cluster_environment.h"
#include "tests/tensor_check.h"

namespace shardcoord {
namespace {

using ::testing::HasSubstr;

// Uneven under torch.chunk on every mesh used here.
const Shape kShape = {10, 9};
constexpr int64_t kElements = 90;

// Interesting values of a double, converted to each source dtype by its own rules.
std::vector<double> SpecialValues() {
  const double inf = std::numeric_limits<double>::infinity();
  return {0.0,
          -0.0,
          inf,
          -inf,
          std::numeric_limits<double>::quiet_NaN(),
          -std::numeric_limits<double>::quiet_NaN(),
          448,
          464,  // e4m3's tie between 448 and 480: even 448.
          480,
          -1e6,
          57344,
          61440,
          65520,                  // f16: overflows to infinity.
          1.0625,                 // e4m3: a tie, to even 1.
          1.1875,                 // e4m3: a tie, to even 1.25.
          1.00390625,             // bf16: a tie, to even 1.
          std::ldexp(1.0, -9),    // e4m3's smallest subnormal.
          std::ldexp(1.0, -10),   // Half of it: a tie, to 0.
          std::ldexp(3.0, -10),   // A tie, to even 2^-8.
          std::ldexp(1.0, -16),   // e5m2's smallest subnormal.
          std::ldexp(1.0, -24),   // f16's smallest subnormal.
          std::ldexp(1.0, -130),  // An f32 subnormal.
          -std::ldexp(1.0, -140),
          0.1,
          -2.5,
          3.14159};
}

// The source bytes: the special values first, then every third element a pseudo-random bit
// pattern, the others small values with fractions. Integers: patterns over the whole range.
std::string SourceBytes(DType dtype) {
  const int64_t es = ElementSize(dtype);
  std::string out(static_cast<size_t>(kElements * es), '\0');
  const std::vector<double> special = SpecialValues();
  for (int64_t i = 0; i < kElements; ++i) {
    uint64_t bits = 0;
    if (!IsFloat(dtype) || (i >= static_cast<int64_t>(special.size()) && i % 3 == 0)) {
      uint64_t z = static_cast<uint64_t>(i + 1) * 0x9E3779B97F4A7C15ull;
      z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
      bits = z ^ (z >> 31);
    } else {
      const double v = i < static_cast<int64_t>(special.size())
                           ? special[i]
                           : (static_cast<double>(i) - 45) * 0.3 + 0.00390625;
      if (dtype == DType::kF64) {
        std::memcpy(&bits, &v, 8);
      } else if (dtype == DType::kF32) {
        const float f = static_cast<float>(v);
        std::memcpy(&bits, &f, 4);
      } else {
        bits = DoubleToFloatBits(v, dtype);
      }
    }
    std::memcpy(&out[i * es], &bits, static_cast<size_t>(es));
  }
  return out;
}

std::string Hex(const std::string& bytes, int64_t i, int64_t es) {
  uint64_t v = 0;
  std::memcpy(&v, bytes.data() + i * es, static_cast<size_t>(es));
  return absl::StrCat("0x", absl::Hex(v), " (", es, " bytes)");
}

struct Endpoint {
  std::string mesh;
  std::string spec;
};

class CastCopyTest : public MeshTest {
 protected:
  absl::StatusOr<v1::TensorInfo> UploadSource(const std::string& name, DType dtype,
                                              const Endpoint& at) {
    v1::TensorHeader header;
    header.set_name(name);
    for (int64_t d : kShape) header.add_shape(d);
    header.set_dtype(DTypeToProto(dtype));
    *header.mutable_spec() = SpecFromText(at.mesh, at.spec);
    return client().Upload(header, SourceBytes(dtype));
  }

  // dst's downloaded bytes against the cast of src's.
  void ExpectCastOf(const std::string& dst, DType from, DType to) {
    std::string data;
    absl::StatusOr<v1::TensorHeader> header = client().Download(dst, &data);
    ASSERT_TRUE(header.ok()) << header.status();
    EXPECT_EQ(header->dtype(), DTypeToProto(to));
    const int64_t os = ElementSize(to);
    ASSERT_EQ(static_cast<int64_t>(data.size()), kElements * os);
    const std::string src = SourceBytes(from);
    std::string want(data.size(), '\0');
    ASSERT_TRUE(Cast(src.data(), from, want.data(), to, kElements).ok());
    int mismatches = 0;
    for (int64_t i = 0; i < kElements && mismatches < 5; ++i) {
      if (std::memcmp(data.data() + i * os, want.data() + i * os, static_cast<size_t>(os)) != 0) {
        ++mismatches;
        ADD_FAILURE() << dst << " element " << i << ": " << Hex(data, i, os) << ", want "
                      << Hex(want, i, os) << " (source " << Hex(src, i, ElementSize(from)) << ")";
      }
    }
  }

  void CopyAndCheck(const std::string& name, DType from, DType to, const Endpoint& src_at,
                    const Endpoint& dst_at) {
    SCOPED_TRACE(absl::StrCat(name, ": ", DTypeName(from), " ", src_at.spec, " on ", src_at.mesh,
                              " -> ", DTypeName(to), " ", dst_at.spec, " on ", dst_at.mesh));
    const std::string src = name + "_src", dst = name + "_dst";
    absl::StatusOr<v1::TensorInfo> src_before = UploadSource(src, from, src_at);
    ASSERT_TRUE(src_before.ok()) << src_before.status();
    absl::StatusOr<v1::TensorInfo> dst_before =
        CreateFilled(client(), dst, kShape, to, dst_at.mesh, dst_at.spec, false, v1::RANDOM);
    ASSERT_TRUE(dst_before.ok()) << dst_before.status();

    v1::CopyRequest request;
    request.set_src(src);
    request.set_dst(dst);
    request.set_wait(true);
    absl::StatusOr<v1::CopyResponse> response = client().Copy(request);
    ASSERT_TRUE(response.ok()) << response.status();
    EXPECT_EQ(response->progress().state(), v1::COMMITTED) << response->progress().error();
    const v1::Plan& plan = response->plan();
    EXPECT_EQ(plan.dtype(), DTypeToProto(from));
    EXPECT_EQ(plan.target_dtype(), DTypeToProto(to));
    EXPECT_EQ(plan.wire_dtype(), DTypeToProto(WireDType(from, to)));
    EXPECT_EQ(plan.cast_side(),
              ElementSize(to) <= ElementSize(from) ? v1::CAST_BY_SENDER : v1::CAST_BY_RECEIVER);
    EXPECT_EQ(plan.bytes_moved(), plan.lower_bound_bytes());
    EXPECT_EQ(plan.bytes_moved() % ElementSize(WireDType(from, to)), 0);
    {
      // The same copy without a cast moves the same elements in src's dtype: a narrowing
      // copy moves dst's bytes (the sender converted), a widening one src's.
      const std::string same = name + "_same";
      ASSERT_TRUE(
          CreateFilled(client(), same, kShape, from, dst_at.mesh, dst_at.spec, false, v1::ZEROS)
              .ok());
      v1::CopyRequest plain = request;
      plain.set_dst(same);
      absl::StatusOr<v1::CopyResponse> r = client().Copy(plain);
      ASSERT_TRUE(r.ok()) << r.status();
      EXPECT_EQ(plan.bytes_moved() * ElementSize(from),
                r->plan().bytes_moved() * ElementSize(WireDType(from, to)));
      EXPECT_TRUE(client().DeleteTensor(same).ok());
    }

    absl::StatusOr<v1::TensorInfo> dst_after = client().GetTensor(dst);
    ASSERT_TRUE(dst_after.ok()) << dst_after.status();
    EXPECT_EQ(dst_after->dtype(), DTypeToProto(to));
    EXPECT_EQ(dst_after->version(), response->dst_version());
    EXPECT_TRUE(SameChunks(dst_after->layout(), dst_before->layout()).ok());
    ExpectCastOf(dst, from, to);
    // src unchanged.
    EXPECT_EQ(client().GetTensor(src)->version(), src_before->version());
    std::string src_data;
    ASSERT_TRUE(client().Download(src, &src_data).ok());
    EXPECT_TRUE(src_data == SourceBytes(from)) << "src changed";

    EXPECT_TRUE(client().DeleteTensor(src).ok());
    EXPECT_TRUE(client().DeleteTensor(dst).ok());
  }
};

TEST_F(CastCopyTest, F32ToBF16) {
  CopyAndCheck("f32_bf16", DType::kF32, DType::kBF16, {"line", "S(0)"}, {"grid", "R,S(1)"});
}

TEST_F(CastCopyTest, F32ToF8E4M3) {
  CopyAndCheck("f32_e4m3", DType::kF32, DType::kF8E4M3, {"grid", "S(0),S(1)"},
               {"line_rev", "S(1)"});
  CopyAndCheck("f32_e4m3_uneven", DType::kF32, DType::kF8E4M3, {"line", "S(0,[1,3,2,4])"},
               {"trio", "R"});
}

TEST_F(CastCopyTest, BF16ToF32) {
  CopyAndCheck("bf16_f32", DType::kBF16, DType::kF32, {"pair", "R"}, {"grid", "S(1),S(0)"});
}

TEST_F(CastCopyTest, I32ToI64) {
  CopyAndCheck("i32_i64", DType::kI32, DType::kI64, {"grid", "S(0),R"}, {"trio", "S(1)"});
}

TEST_F(CastCopyTest, MoreFloatPairs) {
  CopyAndCheck("f64_e5m2", DType::kF64, DType::kF8E5M2, {"line", "S(1)"}, {"pair", "S(0)"});
  CopyAndCheck("e4m3_f16", DType::kF8E4M3, DType::kF16, {"trio", "S(0)"}, {"line", "R"});
}

TEST_F(CastCopyTest, GroupWithCastingMembers) {
  ASSERT_TRUE(UploadSource("g_a", DType::kF32, {"line", "S(0)"}).ok());
  ASSERT_TRUE(UploadSource("g_b", DType::kI32, {"grid", "S(1),R"}).ok());
  ASSERT_TRUE(UploadSource("g_c", DType::kBF16, {"pair", "S(1)"}).ok());
  ASSERT_TRUE(
      CreateFilled(client(), "g_a_dst", kShape, DType::kF8E4M3, "grid", "R,S(0)", false, v1::ZEROS)
          .ok());
  ASSERT_TRUE(
      CreateFilled(client(), "g_b_dst", kShape, DType::kI64, "line_rev", "S(0)", false, v1::ZEROS)
          .ok());
  ASSERT_TRUE(
      CreateFilled(client(), "g_c_dst", kShape, DType::kBF16, "trio", "R", false, v1::ZEROS).ok());
  v1::CopyGroupRequest request;
  for (const char* name : {"g_a", "g_b", "g_c"}) {
    v1::CopyPair* pair = request.add_copies();
    pair->set_src(name);
    pair->set_dst(absl::StrCat(name, "_dst"));
  }
  request.set_wait(true);
  absl::StatusOr<v1::CopyGroupResponse> response = client().CopyGroup(request);
  ASSERT_TRUE(response.ok()) << response.status();
  EXPECT_EQ(response->state(), v1::COMMITTED);
  ASSERT_EQ(response->members_size(), 3);
  EXPECT_EQ(response->members(0).plan().cast_side(), v1::CAST_BY_SENDER);
  EXPECT_EQ(response->members(1).plan().cast_side(), v1::CAST_BY_RECEIVER);
  EXPECT_EQ(response->members(2).plan().cast_side(), v1::CAST_SIDE_NONE);
  ExpectCastOf("g_a_dst", DType::kF32, DType::kF8E4M3);
  ExpectCastOf("g_b_dst", DType::kI32, DType::kI64);
  ExpectCastOf("g_c_dst", DType::kBF16, DType::kBF16);
  for (const char* name : {"g_a", "g_b", "g_c", "g_a_dst", "g_b_dst", "g_c_dst"}) {
    EXPECT_TRUE(client().DeleteTensor(name).ok()) << name;
  }
}

// A prepared transfer (issue 27) whose members cast: every run converts as a Copy does, and
// moves what the same CopyGroup moves (the narrower dtype's bytes).
TEST_F(CastCopyTest, PreparedTransferCastsOnEveryRun) {
  struct Member {
    const char* name;
    DType from, to;
    Endpoint src_at, dst_at;
  };
  const Member members[] = {
      {"t_a", DType::kF32, DType::kF8E4M3, {"line", "S(0)"}, {"grid", "R,S(0)"}},
      {"t_b", DType::kI32, DType::kI64, {"grid", "S(1),R"}, {"line_rev", "S(0)"}},
      {"t_c", DType::kF64, DType::kBF16, {"pair", "S(1)"}, {"trio", "R"}},
      {"t_d", DType::kBF16, DType::kBF16, {"trio", "S(0)"}, {"line", "S(1)"}},
  };
  v1::CreateTransferRequest create;
  create.set_name("casting");
  v1::CopyGroupRequest group;
  group.set_wait(true);
  for (const Member& m : members) {
    ASSERT_TRUE(UploadSource(m.name, m.from, m.src_at).ok()) << m.name;
    for (const char* suffix : {"_dst", "_group"}) {
      ASSERT_TRUE(CreateFilled(client(), absl::StrCat(m.name, suffix), kShape, m.to, m.dst_at.mesh,
                               m.dst_at.spec, false, v1::ZEROS)
                      .ok());
    }
    v1::CopyPair* pair = create.add_copies();
    pair->set_src(m.name);
    pair->set_dst(absl::StrCat(m.name, "_dst"));
    v1::CopyPair* same = group.add_copies();
    same->set_src(m.name);
    same->set_dst(absl::StrCat(m.name, "_group"));
  }
  absl::StatusOr<v1::CopyGroupResponse> copied = client().CopyGroup(group);
  ASSERT_TRUE(copied.ok()) << copied.status();
  int64_t group_bytes = 0;
  for (const v1::CopyGroupMember& m : copied->members()) group_bytes += m.plan().bytes_moved();

  absl::StatusOr<v1::TransferInfo> info = client().CreateTransfer(create);
  ASSERT_TRUE(info.ok()) << info.status();
  EXPECT_EQ(info->bytes_moved(), group_bytes);
  EXPECT_EQ(info->templates(), 4);
  for (int run = 0; run < 2; ++run) {
    SCOPED_TRACE(absl::StrCat("run ", run));
    v1::RunTransferRequest request;
    request.set_name("casting");
    request.set_wait(true);
    absl::StatusOr<v1::RunTransferResponse> r = client().RunTransfer(request);
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_EQ(r->state(), v1::COMMITTED);
    EXPECT_EQ(r->bytes_moved(), group_bytes);
    for (const Member& m : members) {
      ExpectCastOf(absl::StrCat(m.name, "_dst"), m.from, m.to);
      EXPECT_EQ(client().GetTensor(absl::StrCat(m.name, "_dst"))->version(), r->version());
    }
  }
  EXPECT_TRUE(client().DeleteTransfer("casting").ok());
  for (const Member& m : members) {
    for (const char* suffix : {"", "_dst", "_group"}) {
      EXPECT_TRUE(client().DeleteTensor(absl::StrCat(m.name, suffix)).ok()) << m.name << suffix;
    }
  }
}

TEST_F(CastCopyTest, RefusedPairsAreInvalidArgumentAndChangeNothing) {
  ASSERT_TRUE(UploadSource("r_f32", DType::kF32, {"line", "S(0)"}).ok());
  ASSERT_TRUE(UploadSource("r_i64", DType::kI64, {"line", "S(1)"}).ok());
  ASSERT_TRUE(
      CreateFilled(client(), "r_i32", kShape, DType::kI32, "grid", "S(0),R", false, v1::ZEROS)
          .ok());
  const int64_t version = client().GetTensor("r_i32")->version();
  struct Case {
    std::string src, dst, message;
  };
  const Case cases[] = {
      {"r_f32", "r_i32", "dst: tensor 'r_i32' dtype i32 cannot be cast from src 'r_f32' dtype f32"},
      {"r_i64", "r_i32", "dst: tensor 'r_i32' dtype i32 cannot be cast from src 'r_i64' dtype i64"},
  };
  for (const Case& c : cases) {
    v1::CopyRequest request;
    request.set_src(c.src);
    request.set_dst(c.dst);
    request.set_wait(true);
    absl::StatusOr<v1::CopyResponse> r = client().Copy(request);
    EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument) << r.status();
    EXPECT_THAT(std::string(r.status().message()), HasSubstr(c.message));
  }
  v1::CopyGroupRequest group;
  v1::CopyPair* pair = group.add_copies();
  pair->set_src("r_f32");
  pair->set_dst("r_i32");
  absl::StatusOr<v1::CopyGroupResponse> g = client().CopyGroup(group);
  EXPECT_EQ(g.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(g.status().message()),
              HasSubstr("copies[0].dst: tensor 'r_i32' dtype i32 cannot be cast from src 'r_f32' "
                        "dtype f32"));
  v1::CreateTransferRequest transfer;
  transfer.set_name("refused");
  *transfer.add_copies() = *pair;
  absl::StatusOr<v1::TransferInfo> t = client().CreateTransfer(transfer);
  EXPECT_EQ(t.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(t.status().message()),
              HasSubstr("copies[0].dst: tensor 'r_i32' dtype i32 cannot be cast from src 'r_f32' "
                        "dtype f32"));
  EXPECT_EQ(client().GetTransfer("refused").status().code(), absl::StatusCode::kNotFound);
  absl::StatusOr<v1::TensorInfo> after = client().GetTensor("r_i32");
  ASSERT_TRUE(after.ok());
  EXPECT_EQ(after->version(), version);
  EXPECT_TRUE(after->busy_plan().empty());
  EXPECT_TRUE(DownloadAndCheck(client(), "r_i32", DType::kI32, kShape, FillKind::kZeros).ok());
  for (const char* name : {"r_f32", "r_i64", "r_i32"}) {
    EXPECT_TRUE(client().DeleteTensor(name).ok()) << name;
  }
}

std::string TempPath(const std::string& name) {
  const char* dir = std::getenv("TEST_TMPDIR");
  return absl::StrCat(dir != nullptr ? dir : "/tmp", "/", name);
}

TEST_F(CastCopyTest, CheckpointLoadCastsToTheAskedDType) {
  ASSERT_TRUE(UploadSource("ck_f32", DType::kF32, {"line", "S(0)"}).ok());
  ASSERT_TRUE(UploadSource("ck_bf16", DType::kBF16, {"grid", "S(1),R"}).ok());
  const std::string dir = TempPath("cast_ckpt");
  v1::SaveCheckpointRequest save;
  save.set_dir(dir);
  save.add_tensors("ck_f32");
  save.add_tensors("ck_bf16");
  ASSERT_TRUE(client().SaveCheckpoint(save).ok());

  // --dtype f8_e4m3 into new tensors: f32 narrowed (by the readers), bf16 too.
  v1::LoadCheckpointRequest load;
  load.set_dir(dir);
  load.set_prefix("e4m3_");
  load.set_dtype(v1::F8_E4M3);
  for (const char* name : {"ck_f32", "ck_bf16"}) {
    v1::LoadTarget* t = load.add_targets();
    t->set_tensor(name);
    *t->mutable_target() = SpecFromText("trio", "S(1)");
  }
  absl::StatusOr<v1::LoadCheckpointResponse> loaded = client().LoadCheckpoint(load);
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  for (const char* name : {"e4m3_ck_f32", "e4m3_ck_bf16"}) {
    absl::StatusOr<v1::TensorInfo> info = client().GetTensor(name);
    ASSERT_TRUE(info.ok()) << info.status();
    EXPECT_EQ(info->dtype(), v1::F8_E4M3);
    EXPECT_EQ(info->mesh(), "trio");
  }
  ExpectCastOf("e4m3_ck_f32", DType::kF32, DType::kF8E4M3);
  // The bf16 source's bytes were cast from f32's pattern rules for bf16 (SourceBytes(bf16)).
  ExpectCastOf("e4m3_ck_bf16", DType::kBF16, DType::kF8E4M3);

  // --into existing tensors of other dtypes: each keeps its dtype and layout.
  ASSERT_TRUE(
      CreateFilled(client(), "into_ck_f32", kShape, DType::kBF16, "pair", "R", false, v1::ZEROS)
          .ok());
  ASSERT_TRUE(CreateFilled(client(), "into_ck_bf16", kShape, DType::kF64, "grid", "R,S(0)", false,
                           v1::ZEROS)
                  .ok());
  v1::LoadCheckpointRequest into;
  into.set_dir(dir);
  into.set_prefix("into_");
  into.set_into(true);
  into.add_targets()->set_tensor("ck_f32");
  into.add_targets()->set_tensor("ck_bf16");
  loaded = client().LoadCheckpoint(into);
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  ExpectCastOf("into_ck_f32", DType::kF32, DType::kBF16);
  ExpectCastOf("into_ck_bf16", DType::kBF16, DType::kF64);

  // Refused: a cast the table does not allow; --into with another --dtype. Nothing appears.
  v1::LoadCheckpointRequest bad = load;
  bad.set_prefix("bad_");
  bad.set_dtype(v1::I32);
  absl::StatusOr<v1::LoadCheckpointResponse> r = client().LoadCheckpoint(bad);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument) << r.status();
  EXPECT_THAT(std::string(r.status().message()),
              HasSubstr("dtype: the checkpoint's 'ck_f32' is f32, which cannot be cast to i32"));
  EXPECT_EQ(client().GetTensor("bad_ck_f32").status().code(), absl::StatusCode::kNotFound);
  v1::LoadCheckpointRequest bad_into = into;
  bad_into.set_dtype(v1::F16);
  r = client().LoadCheckpoint(bad_into);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument) << r.status();
  EXPECT_THAT(std::string(r.status().message()), HasSubstr("a load into existing tensors casts"));

  for (const char* name :
       {"ck_f32", "ck_bf16", "e4m3_ck_f32", "e4m3_ck_bf16", "into_ck_f32", "into_ck_bf16"}) {
    EXPECT_TRUE(client().DeleteTensor(name).ok()) << name;
  }
}

}  // namespace
}  // namespace shardcoord
