#ifndef SHARDCOORD_COMMON_CHROME_TRACE_CHECK_H_
#define SHARDCOORD_COMMON_CHROME_TRACE_CHECK_H_

// Tests only: checks a JSON text against the Chrome trace event format's rules (JSON object
// format), as Perfetto reads it.

#include <map>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace shardcoord {

struct ChromeTraceSummary {
  std::map<int64_t, std::string> thread_names;  // tid -> name, from "M" events.
  std::map<int64_t, int> complete_events;       // tid -> "X" events on it.
};

// Valid JSON; an object with a "traceEvents" list; every event an object with a string
// "name" and "ph", numeric "pid" and "tid"; "X" events with numeric "ts" and "dur" >= 0;
// "M" events "process_name" or "thread_name" with args.name. INVALID_ARGUMENT naming the
// first event that breaks a rule.
absl::StatusOr<ChromeTraceSummary> CheckChromeTrace(absl::string_view json);

}  // namespace shardcoord

#endif  // SHARDCOORD_COMMON_CHROME_TRACE_CHECK_H_
