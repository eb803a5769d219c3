#include "sharding/box_copy.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <type_traits>
#include <vector>

#include "absl/container/inlined_vector.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"

namespace shardcoord {
namespace {

absl::Status CheckBox(const Box& box, const char* what) {
  for (int d = 0; d < box.ndim(); ++d) {
    if (box.shape(d) < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat(what, " ", box.ToString(), " has a negative extent in dim ", d));
    }
  }
  return absl::OkStatus();
}

}  // namespace

namespace {

// BoxCopyRuns with its dims inline: the per-copy plan of CopyBox, ReduceIntoBox and
// RegionByteRuns allocates nothing for boxes of up to kInlineDims outer dims (a fused group
// copies thousands of small boxes, where the allocations cost as much as the bytes).
constexpr size_t kInlineDims = 6;
struct InlineRuns {
  bool empty = false;
  int64_t run_elems = 0;
  int64_t run_bytes = 0;
  int64_t src_start = 0;
  int64_t dst_start = 0;
  absl::InlinedVector<int64_t, kInlineDims> count;
  absl::InlinedVector<int64_t, kInlineDims> src_stride;
  absl::InlinedVector<int64_t, kInlineDims> dst_stride;
};

template <typename Runs>
absl::Status PlanRuns(const Box& region, const Box& src_box, const Box& dst_box,
                      int64_t element_size, Runs* out) {
  if (element_size <= 0) {
    return absl::InvalidArgumentError(absl::StrCat("element size ", element_size, " <= 0"));
  }
  if (region.ndim() != src_box.ndim() || region.ndim() != dst_box.ndim()) {
    return absl::InvalidArgumentError(absl::StrCat("region ", region.ToString(), ", source box ",
                                                   src_box.ToString(), " and destination box ",
                                                   dst_box.ToString(), " differ in rank"));
  }
  if (absl::Status s = CheckBox(region, "region"); !s.ok()) return s;
  if (absl::Status s = CheckBox(src_box, "source box"); !s.ok()) return s;
  if (absl::Status s = CheckBox(dst_box, "destination box"); !s.ok()) return s;
  // Buffers whose byte size overflows cannot exist; checking here keeps all offsets in range.
  if (absl::Status s = CheckedBytes(src_box.shape(), element_size).status(); !s.ok()) return s;
  if (absl::Status s = CheckedBytes(dst_box.shape(), element_size).status(); !s.ok()) return s;
  Runs& plan = *out;
  if (region.Empty()) {
    plan.empty = true;
    return absl::OkStatus();
  }
  if (!src_box.Contains(region)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "region ", region.ToString(), " is not inside source box ", src_box.ToString()));
  }
  if (!dst_box.Contains(region)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "region ", region.ToString(), " is not inside destination box ", dst_box.ToString()));
  }
  const int nd = region.ndim();
  // Dims [inner, nd) form one contiguous run: every dim after `inner` is spanned fully in
  // both boxes, so consecutive rows of it are adjacent in both buffers.
  int inner = nd - 1;
  while (inner > 0 && region.shape(inner) == src_box.shape(inner) &&
         region.shape(inner) == dst_box.shape(inner)) {
    --inner;
  }
  plan.run_elems = 1;
  for (int d = inner < 0 ? 0 : inner; d < nd; ++d) plan.run_elems *= region.shape(d);
  plan.run_bytes = plan.run_elems * element_size;
  // Row-major strides in bytes, innermost first (no overflow: both byte sizes were checked).
  int64_t src_stride = element_size, dst_stride = element_size;
  absl::InlinedVector<int64_t, kInlineDims> src_strides(nd), dst_strides(nd);
  for (int d = nd - 1; d >= 0; --d) {
    src_strides[d] = src_stride;
    dst_strides[d] = dst_stride;
    plan.src_start += (region.offset(d) - src_box.offset(d)) * src_stride;
    plan.dst_start += (region.offset(d) - dst_box.offset(d)) * dst_stride;
    src_stride *= src_box.shape(d);
    dst_stride *= dst_box.shape(d);
  }
  for (int d = 0; d < inner; ++d) {
    if (region.shape(d) == 1) continue;
    plan.count.push_back(region.shape(d));
    plan.src_stride.push_back(src_strides[d]);
    plan.dst_stride.push_back(dst_strides[d]);
  }
  return absl::OkStatus();
}

absl::StatusOr<InlineRuns> PlanInline(const Box& region, const Box& src_box, const Box& dst_box,
                                      int64_t element_size) {
  InlineRuns plan;
  if (absl::Status s = PlanRuns(region, src_box, dst_box, element_size, &plan); !s.ok()) return s;
  return plan;
}

}  // namespace

absl::StatusOr<BoxCopyRuns> PlanBoxCopy(const Box& region, const Box& src_box, const Box& dst_box,
                                        int64_t element_size) {
  BoxCopyRuns plan;
  if (absl::Status s = PlanRuns(region, src_box, dst_box, element_size, &plan); !s.ok()) return s;
  return plan;
}

namespace {

// Calls fn(src_run, dst_run) for every run: a tight loop over the innermost outer dim and an
// odometer over the rest. Src and Dst are pointers, or byte offsets (int64_t).
template <typename Runs, typename Src, typename Dst, typename Fn>
void ForEachRun(const Runs& p, Src src, Dst dst, Fn fn) {
  src += p.src_start;
  dst += p.dst_start;
  const int n = static_cast<int>(p.count.size());
  if (n == 0) {
    fn(src, dst);
    return;
  }
  const int last = n - 1;
  const int64_t rows = p.count[last];
  const int64_t ss = p.src_stride[last], ds = p.dst_stride[last];
  absl::InlinedVector<int64_t, kInlineDims> idx(last, 0);
  while (true) {
    Src s = src;
    Dst d = dst;
    for (int64_t i = 0; i < rows; ++i, s += ss, d += ds) fn(s, d);
    int k = last - 1;
    for (; k >= 0; --k) {
      src += p.src_stride[k];
      dst += p.dst_stride[k];
      if (++idx[k] < p.count[k]) break;
      idx[k] = 0;
      src -= p.count[k] * p.src_stride[k];
      dst -= p.count[k] * p.dst_stride[k];
    }
    if (k < 0) return;
  }
}

// A compile-time run length lets the compiler turn memcpy into plain loads and stores,
// which matters when the run is a single small element.
template <int64_t kBytes>
void CopyFixed(const InlineRuns& p, const char* src, char* dst) {
  ForEachRun(p, src, dst, [](const char* s, char* d) { std::memcpy(d, s, kBytes); });
}

struct SumOp {
  template <typename T>
  T operator()(T a, T b) const {
    if constexpr (std::is_integral_v<T>) {
      // Unsigned arithmetic wraps instead of overflowing (UB for signed).
      using U = std::make_unsigned_t<T>;
      return static_cast<T>(static_cast<U>(static_cast<U>(a) + static_cast<U>(b)));
    } else {
      return a + b;
    }
  }
};

struct MinOp {
  template <typename T>
  T operator()(T a, T b) const {
    if constexpr (std::is_floating_point_v<T>) {
      if (std::isnan(a)) return a;
      if (std::isnan(b)) return b;
    }
    return b < a ? b : a;
  }
};

struct MaxOp {
  template <typename T>
  T operator()(T a, T b) const {
    if constexpr (std::is_floating_point_v<T>) {
      if (std::isnan(a)) return a;
      if (std::isnan(b)) return b;
    }
    return a < b ? b : a;
  }
};

// Element loads go through memcpy: local buffers carry no alignment promise.
template <typename T, typename Op>
void CombineRun(char* dst, const char* src, int64_t n, Op op) {
  for (int64_t i = 0; i < n; ++i) {
    T a, b;
    std::memcpy(&a, dst + i * sizeof(T), sizeof(T));
    std::memcpy(&b, src + i * sizeof(T), sizeof(T));
    a = op(a, b);
    std::memcpy(dst + i * sizeof(T), &a, sizeof(T));
  }
}

template <float (*kToFloat)(uint16_t), uint16_t (*kFromFloat)(float), typename Op>
void CombineRun16(char* dst, const char* src, int64_t n, Op op) {
  for (int64_t i = 0; i < n; ++i) {
    uint16_t a, b;
    std::memcpy(&a, dst + i * 2, 2);
    std::memcpy(&b, src + i * 2, 2);
    a = kFromFloat(op(kToFloat(a), kToFloat(b)));
    std::memcpy(dst + i * 2, &a, 2);
  }
}

template <typename Op>
void ReduceWith(const InlineRuns& p, const char* src, char* dst, DType dtype, Op op) {
  const int64_t n = p.run_elems;
  auto run = [&](auto combine) { ForEachRun(p, src, dst, combine); };
  switch (dtype) {
    case DType::kF32:
      run([&](const char* s, char* d) { CombineRun<float>(d, s, n, op); });
      break;
    case DType::kF64:
      run([&](const char* s, char* d) { CombineRun<double>(d, s, n, op); });
      break;
    case DType::kI8:
      run([&](const char* s, char* d) { CombineRun<int8_t>(d, s, n, op); });
      break;
    case DType::kU8:
      run([&](const char* s, char* d) { CombineRun<uint8_t>(d, s, n, op); });
      break;
    case DType::kI32:
      run([&](const char* s, char* d) { CombineRun<int32_t>(d, s, n, op); });
      break;
    case DType::kU32:
      run([&](const char* s, char* d) { CombineRun<uint32_t>(d, s, n, op); });
      break;
    case DType::kI64:
      run([&](const char* s, char* d) { CombineRun<int64_t>(d, s, n, op); });
      break;
    case DType::kU64:
      run([&](const char* s, char* d) { CombineRun<uint64_t>(d, s, n, op); });
      break;
    case DType::kF16:
      run([&](const char* s, char* d) { CombineRun16<HalfToFloat, FloatToHalf>(d, s, n, op); });
      break;
    case DType::kBF16:
      run([&](const char* s, char* d) {
        CombineRun16<BFloat16ToFloat, FloatToBFloat16>(d, s, n, op);
      });
      break;
    default:  // Refused by ReduceIntoBox (PartialAllowed).
      break;
  }
}

template <typename T>
void DivideInts(char* data, int64_t count, int64_t divisor) {
  for (int64_t i = 0; i < count; ++i) {
    T v;
    std::memcpy(&v, data + i * sizeof(T), sizeof(T));
    // In 64 bits so a divisor beyond T's range (e.g. 300 for i8) still divides correctly.
    if constexpr (std::is_unsigned_v<T>) {
      v = static_cast<T>(static_cast<uint64_t>(v) / static_cast<uint64_t>(divisor));
    } else {
      v = static_cast<T>(static_cast<int64_t>(v) / divisor);
    }
    std::memcpy(data + i * sizeof(T), &v, sizeof(T));
  }
}

template <typename T>
void DivideFloats(char* data, int64_t count, int64_t divisor) {
  const T div = static_cast<T>(divisor);
  for (int64_t i = 0; i < count; ++i) {
    T v;
    std::memcpy(&v, data + i * sizeof(T), sizeof(T));
    v /= div;
    std::memcpy(data + i * sizeof(T), &v, sizeof(T));
  }
}

template <float (*kToFloat)(uint16_t), uint16_t (*kFromFloat)(float)>
void Divide16(char* data, int64_t count, int64_t divisor) {
  const float div = static_cast<float>(divisor);
  for (int64_t i = 0; i < count; ++i) {
    uint16_t v;
    std::memcpy(&v, data + i * 2, 2);
    v = kFromFloat(kToFloat(v) / div);
    std::memcpy(data + i * 2, &v, 2);
  }
}

}  // namespace

absl::Status CopyBox(const Box& region, const void* src, const Box& src_box, void* dst,
                     const Box& dst_box, int64_t element_size) {
  absl::StatusOr<InlineRuns> plan = PlanInline(region, src_box, dst_box, element_size);
  if (!plan.ok()) return plan.status();
  if (plan->empty) return absl::OkStatus();
  if (src == nullptr || dst == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat("null buffer for a copy of region ", region.ToString()));
  }
  const char* s = static_cast<const char*>(src);
  char* d = static_cast<char*>(dst);
  switch (plan->run_bytes) {
    case 1:
      CopyFixed<1>(*plan, s, d);
      break;
    case 2:
      CopyFixed<2>(*plan, s, d);
      break;
    case 4:
      CopyFixed<4>(*plan, s, d);
      break;
    case 8:
      CopyFixed<8>(*plan, s, d);
      break;
    case 16:
      CopyFixed<16>(*plan, s, d);
      break;
    default: {
      const size_t bytes = static_cast<size_t>(plan->run_bytes);
      ForEachRun(*plan, s, d,
                 [bytes](const char* from, char* to) { std::memcpy(to, from, bytes); });
    }
  }
  return absl::OkStatus();
}

absl::Status PackBox(const Box& region, const void* chunk, const Box& chunk_box, void* packed,
                     int64_t element_size) {
  return CopyBox(region, chunk, chunk_box, packed, region, element_size);
}

absl::Status UnpackBox(const Box& region, const void* packed, void* chunk, const Box& chunk_box,
                       int64_t element_size) {
  return CopyBox(region, packed, region, chunk, chunk_box, element_size);
}

absl::Status ReduceIntoBox(const Box& region, const void* src, const Box& src_box, void* dst,
                           const Box& dst_box, DType dtype, ReduceOp op) {
  const int64_t element_size = ElementSize(dtype);
  if (element_size == 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("unknown dtype ", static_cast<int>(dtype), " for a reduction"));
  }
  if (!PartialAllowed(dtype)) {
    return absl::InvalidArgumentError(
        absl::StrCat("dtype ", DTypeName(dtype), " has no reduction (it cannot be Partial)"));
  }
  if (op != ReduceOp::kSum && op != ReduceOp::kMin && op != ReduceOp::kMax) {
    return absl::InvalidArgumentError(
        absl::StrCat("reduce op ", ReduceOpName(op),
                     " is not element-wise; reduce with sum and then DivideBox"));
  }
  absl::StatusOr<InlineRuns> plan = PlanInline(region, src_box, dst_box, element_size);
  if (!plan.ok()) return plan.status();
  if (plan->empty) return absl::OkStatus();
  if (src == nullptr || dst == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat("null buffer for a reduction of region ", region.ToString()));
  }
  const char* s = static_cast<const char*>(src);
  char* d = static_cast<char*>(dst);
  switch (op) {
    case ReduceOp::kSum:
      ReduceWith(*plan, s, d, dtype, SumOp());
      break;
    case ReduceOp::kMin:
      ReduceWith(*plan, s, d, dtype, MinOp());
      break;
    case ReduceOp::kMax:
      ReduceWith(*plan, s, d, dtype, MaxOp());
      break;
    case ReduceOp::kAvg:
      break;  // Rejected above.
  }
  return absl::OkStatus();
}

absl::StatusOr<RegionRuns> RegionByteRuns(const Box& region, const Box& box, int64_t element_size) {
  absl::StatusOr<InlineRuns> p = PlanInline(region, box, region, element_size);
  if (!p.ok()) return p.status();
  RegionRuns out;
  if (p->empty) return out;
  out.run_bytes = p->run_bytes;
  int64_t total = 1;
  for (int64_t c : p->count) total *= c;
  out.offsets.reserve(static_cast<size_t>(total));
  ForEachRun(*p, int64_t{0}, int64_t{0},
             [&out](int64_t src, int64_t /*dst*/) { out.offsets.push_back(src); });
  return out;
}

namespace {

void SplitFrom(const Box& box, int first_dim, int64_t element_size, int64_t max_bytes,
               std::vector<Box>* slabs) {
  int d = first_dim;
  while (d < box.ndim() && box.shape(d) == 1) ++d;
  if (d == box.ndim() || box.Empty()) {
    slabs->push_back(box);
    return;
  }
  int64_t slab_bytes = element_size;  // Bytes of one index of dim d.
  for (int e = d + 1; e < box.ndim(); ++e) slab_bytes *= box.shape(e);
  if (slab_bytes * box.shape(d) <= max_bytes) {
    slabs->push_back(box);
    return;
  }
  // Several indices per slab, or (one index alone too big) each index cut further inside.
  const int64_t per_slab = std::max<int64_t>(1, max_bytes / slab_bytes);
  for (int64_t i = 0; i < box.shape(d); i += per_slab) {
    Shape offset = box.offset(), shape = box.shape();
    offset[d] += i;
    shape[d] = std::min(per_slab, box.shape(d) - i);
    Box slab(std::move(offset), std::move(shape));
    if (slab_bytes > max_bytes) {
      SplitFrom(slab, d + 1, element_size, max_bytes, slabs);
    } else {
      slabs->push_back(std::move(slab));
    }
  }
}

}  // namespace

std::vector<Box> SplitIntoSlabs(const Box& box, int64_t element_size, int64_t max_bytes) {
  std::vector<Box> slabs;
  SplitFrom(box, 0, element_size, max_bytes, &slabs);
  return slabs;
}

absl::Status DivideBox(void* data, int64_t count, DType dtype, int64_t divisor) {
  if (ElementSize(dtype) == 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("unknown dtype ", static_cast<int>(dtype), " for a division"));
  }
  if (!PartialAllowed(dtype)) {
    return absl::InvalidArgumentError(
        absl::StrCat("dtype ", DTypeName(dtype), " has no division (it cannot be Partial)"));
  }
  if (divisor <= 0) {
    return absl::InvalidArgumentError(absl::StrCat("divisor ", divisor, " <= 0"));
  }
  if (count < 0) return absl::InvalidArgumentError(absl::StrCat("element count ", count, " < 0"));
  if (count == 0) return absl::OkStatus();
  if (data == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat("null buffer for ", count, " elements"));
  }
  char* p = static_cast<char*>(data);
  switch (dtype) {
    case DType::kF32:
      DivideFloats<float>(p, count, divisor);
      break;
    case DType::kF64:
      DivideFloats<double>(p, count, divisor);
      break;
    case DType::kF16:
      Divide16<HalfToFloat, FloatToHalf>(p, count, divisor);
      break;
    case DType::kBF16:
      Divide16<BFloat16ToFloat, FloatToBFloat16>(p, count, divisor);
      break;
    case DType::kI8:
      DivideInts<int8_t>(p, count, divisor);
      break;
    case DType::kU8:
      DivideInts<uint8_t>(p, count, divisor);
      break;
    case DType::kI32:
      DivideInts<int32_t>(p, count, divisor);
      break;
    case DType::kU32:
      DivideInts<uint32_t>(p, count, divisor);
      break;
    case DType::kI64:
      DivideInts<int64_t>(p, count, divisor);
      break;
    case DType::kU64:
      DivideInts<uint64_t>(p, count, divisor);
      break;
    default:  // Refused above (PartialAllowed).
      break;
  }
  return absl::OkStatus();
}

}  // namespace shardcoord
