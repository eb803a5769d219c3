// Checks every value of a .npy file (as `shardctl tensor download` writes it) against the
// fill formula a tensor was created with (sharding/fill.h): the main job's last step.
//
//   check_npy t.npy --init arange [--seed 0] [--shape 1024,1024] [--dtype f32]
//
// Prints one line saying how many values were checked and exits 0 when every value, the
// shape and the dtype match; otherwise names the first differences and exits 1.

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "CLI/CLI.hpp"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "client/npy.h"
#include "sharding/box.h"
#include "sharding/dtype.h"
#include "sharding/fill.h"

namespace shardcoord {
namespace {

int Fail(const std::string& message) {
  std::fprintf(stderr, "check_npy: %s\n", message.c_str());
  return 1;
}

int Run(int argc, char** argv) {
  CLI::App app("Check every value of a .npy file against a fill formula");
  std::string path, init = "arange", shape_text, dtype_text;
  uint64_t seed = 0;
  app.add_option("file", path, "The .npy file")->required();
  app.add_option("--init", init, "zeros, arange or random")->capture_default_str();
  app.add_option("--seed", seed, "Seed of --init random")->capture_default_str();
  app.add_option("--shape", shape_text, "Expected shape, comma-separated");
  app.add_option("--dtype", dtype_text, "Expected dtype (f32, bf16, ...)");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }

  FillKind kind;
  if (init == "zeros") {
    kind = FillKind::kZeros;
  } else if (init == "arange") {
    kind = FillKind::kArange;
  } else if (init == "random") {
    kind = FillKind::kRandom;
  } else {
    return Fail(absl::StrCat("--init '", init, "' is not zeros, arange or random"));
  }
  NpyReadOptions read_options;
  if (!dtype_text.empty()) {
    absl::StatusOr<DType> want = ParseDType(dtype_text);
    if (!want.ok()) return Fail(std::string(want.status().message()));
    read_options.u2_as_bf16 = *want == DType::kBF16;
  }
  absl::StatusOr<NpyArray> array = ReadNpyFile(path, read_options);
  if (!array.ok()) return Fail(array.status().ToString());
  if (!dtype_text.empty() && DTypeName(array->dtype) != DTypeName(*ParseDType(dtype_text))) {
    return Fail(absl::StrCat(path, " holds ", DTypeName(array->dtype), ", want ", dtype_text));
  }
  if (!shape_text.empty()) {
    Shape want;
    for (absl::string_view d : absl::StrSplit(shape_text, ',')) {
      int64_t v;
      if (!absl::SimpleAtoi(d, &v)) return Fail(absl::StrCat("--shape '", shape_text, "'"));
      want.push_back(v);
    }
    if (want != array->shape) {
      return Fail(absl::StrCat(path, " has shape ", ShapeToString(array->shape), ", want ",
                               ShapeToString(want)));
    }
  }

  const int64_t size = ElementSize(array->dtype);
  const int64_t n = static_cast<int64_t>(array->data.size()) / size;
  int64_t wrong = 0;
  std::vector<std::string> examples;
  char want[8];
  for (int64_t i = 0; i < n; ++i) {
    StoreFromDouble(want, array->dtype, 0, FillValue(kind, seed, i));
    if (std::memcmp(want, array->data.data() + i * size, static_cast<size_t>(size)) == 0) {
      continue;
    }
    if (++wrong <= 5) {
      examples.push_back(absl::StrCat("[", i,
                                      "] = ", LoadAsDouble(array->data.data(), array->dtype, i),
                                      " (want ", LoadAsDouble(want, array->dtype, 0), ")"));
    }
  }
  if (wrong > 0) {
    return Fail(absl::StrCat(path, ": ", wrong, " of ", n, " values differ from ", init, ": ",
                             absl::StrJoin(examples, ", ")));
  }
  std::printf("%s: all %lld values of the %s %s tensor equal %s\n", path.c_str(),
              static_cast<long long>(n), DTypeName(array->dtype).c_str(),
              ShapeToString(array->shape).c_str(), init.c_str());
  return 0;
}

}  // namespace
}  // namespace shardcoord

int main(int argc, char** argv) { return shardcoord::Run(argc, argv); }
