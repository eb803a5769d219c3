// Fuzzes the worker's plan-fragment validation (Worker.Execute input): the input is a
// serialized PlanFragment; ParseFragment must only ever return statuses. A fragment it accepts
// must pass ValidateFragment again, its steps must be analysable (ChooseStepOp), and,
// when its buffers are small, running its local part (zero fill, local copies, division;
// steps need peers and are left out) on real buffers must return a status, never touch
// memory outside them (ASan).

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>

#include "proto/convert.h"
#include "proto/shardcoord.pb.h"
#include "sharding/dtype.h"
#include "worker/buffers/buffer_store.h"
#include "worker/plans/executor.h"
#include "worker/plans/fragment.h"

namespace {

void Check(bool ok, const char* what) {
  if (!ok) {
    std::fprintf(stderr, "fragment_fuzz: %s\n", what);
    std::abort();
  }
}

constexpr int64_t kMaxLocalElements = 1 << 14;

}  // namespace

// LLVMFuzzerInitialize: worker/testing/quiet_protobuf_fuzz_init.cc.
extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace shardcoord;
  v1::PlanFragment proto;
  if (!proto.ParseFromArray(data, static_cast<int>(size))) return 0;
  absl::StatusOr<Fragment> parsed = ParseFragment(proto);
  if (!parsed.ok()) return 0;
  Fragment fragment = *std::move(parsed);
  Check(ValidateFragment(fragment).ok(), "an accepted fragment fails ValidateFragment");
  for (const FragmentShape& shape : fragment.shapes) {
    for (const Step& s : shape.steps) {
      (void)ChooseStepOp(s, false);
      (void)ChooseStepOp(s, true);
    }
  }
  // The local part of a plan's fragment (a fused one needs its exchange's peers).
  if (fragment.fused) return 0;
  FragmentShape& f = fragment.shapes[0];

  if (f.source.local_elements > kMaxLocalElements || f.target.local_elements > kMaxLocalElements) {
    return 0;
  }
  std::shared_ptr<HostBuffer> source;
  if (!f.source.chunks.empty()) {
    absl::StatusOr<std::shared_ptr<HostBuffer>> b = HostBuffer::Create(f.dtype, f.source);
    if (!b.ok()) return 0;
    source = *b;
    // Arbitrary but defined values (floats included: any bit pattern is a value).
    for (int64_t i = 0; i < source->bytes(); ++i) source->data()[i] = static_cast<char>(i * 7);
  }
  absl::StatusOr<std::shared_ptr<HostBuffer>> target = HostBuffer::Create(f.dtype, f.target);
  if (!target.ok()) return 0;
  std::memset((*target)->data(), 0, (*target)->bytes());
  f.steps.clear();  // No peers here.
  f.step_indices.clear();
  ExecuteInput input;
  input.fragment = &fragment;
  input.source = source.get();
  input.target = target->get();
  (void)ExecuteFragment(input);
  return 0;
}
