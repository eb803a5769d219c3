#ifndef SHARDCOORD_SHARDING_TESTING_FUZZ_CHECK_H_
#define SHARDCOORD_SHARDING_TESTING_FUZZ_CHECK_H_

// The property check of a fuzz target (no gtest: libFuzzer runs the target).

#include <cstdio>
#include <cstdlib>

namespace shardcoord {
namespace sharding_testing {

// `constexpr FuzzCheck Check{"npy_fuzz"};` then `Check(ok, "what broke")`: unless `ok`, prints
// "npy_fuzz: what broke" to stderr and aborts, which libFuzzer reports as a crash.
struct FuzzCheck {
  const char* target;

  void operator()(bool ok, const char* what) const {
    if (!ok) {
      std::fprintf(stderr, "%s: %s\n", target, what);
      std::abort();
    }
  }
};

}  // namespace sharding_testing
}  // namespace shardcoord

#endif  // SHARDCOORD_SHARDING_TESTING_FUZZ_CHECK_H_
