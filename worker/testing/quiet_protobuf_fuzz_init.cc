// LLVMFuzzerInitialize of the worker's fuzz targets over serialized protobuf input: protobuf
// logs every string field with invalid UTF-8 it parses, and fuzz inputs are full of them.
// libFuzzer and tools/fuzz/regression_main find it through a weak reference, hence the
// library's alwayslink.

#include <string>

#include "google/protobuf/stubs/logging.h"

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  google::protobuf::SetLogHandler(
      [](google::protobuf::LogLevel, const char*, int, const std::string&) {});
  return 0;
}
