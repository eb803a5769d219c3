#include "common/chrome_trace_check.h"

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "google/protobuf/struct.pb.h"
#include "google/protobuf/util/json_util.h"

namespace shardcoord {

absl::StatusOr<ChromeTraceSummary> CheckChromeTrace(absl::string_view json) {
  using google::protobuf::Value;
  google::protobuf::Struct doc;
  const auto parsed = google::protobuf::util::JsonStringToMessage(
      google::protobuf::StringPiece(json.data(), json.size()), &doc);
  if (!parsed.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("not JSON: ", std::string(parsed.message().data(), parsed.message().size())));
  }
  auto events = doc.fields().find("traceEvents");
  if (events == doc.fields().end() || !events->second.has_list_value()) {
    return absl::InvalidArgumentError("no \"traceEvents\" list");
  }
  ChromeTraceSummary out;
  const auto& list = events->second.list_value().values();
  for (int i = 0; i < list.size(); ++i) {
    const std::string where = absl::StrCat("traceEvents[", i, "]");
    if (!list[i].has_struct_value()) return absl::InvalidArgumentError(where + ": not an object");
    const auto& f = list[i].struct_value().fields();
    auto str = [&](const char* key) -> const Value* {
      auto it = f.find(key);
      return it != f.end() && it->second.kind_case() == Value::kStringValue ? &it->second : nullptr;
    };
    auto num = [&](const char* key) -> const Value* {
      auto it = f.find(key);
      return it != f.end() && it->second.kind_case() == Value::kNumberValue ? &it->second : nullptr;
    };
    if (str("name") == nullptr || str("ph") == nullptr || num("pid") == nullptr ||
        num("tid") == nullptr) {
      return absl::InvalidArgumentError(where + ": needs string name and ph, numeric pid and tid");
    }
    const std::string ph = str("ph")->string_value();
    const int64_t tid = static_cast<int64_t>(num("tid")->number_value());
    if (ph == "X") {
      if (num("ts") == nullptr || num("dur") == nullptr || num("dur")->number_value() < 0) {
        return absl::InvalidArgumentError(where + ": an X event needs numeric ts and dur >= 0");
      }
      ++out.complete_events[tid];
    } else if (ph == "M") {
      const std::string name = str("name")->string_value();
      auto args = f.find("args");
      if ((name != "process_name" && name != "thread_name") || args == f.end() ||
          !args->second.has_struct_value() ||
          args->second.struct_value().fields().count("name") == 0) {
        return absl::InvalidArgumentError(where + ": an M event names a process or thread");
      }
      if (name == "thread_name") {
        out.thread_names[tid] = args->second.struct_value().fields().at("name").string_value();
      }
    } else {
      return absl::InvalidArgumentError(absl::StrCat(where, ": unexpected ph '", ph, "'"));
    }
  }
  return out;
}

}  // namespace shardcoord
