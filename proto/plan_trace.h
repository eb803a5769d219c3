#ifndef SHARDCOORD_PROTO_PLAN_TRACE_H_
#define SHARDCOORD_PROTO_PLAN_TRACE_H_

#include <string>

#include "proto/shardcoord.pb.h"

namespace shardcoord {

// A plan's timeline in the Chrome trace event format (JSON object format), which Perfetto
// and chrome://tracing open: one process (the plan), thread 0 the coordinator's phases
// (transfer: start to every final report; validate + commit: to the end), thread rank + 1
// each rank's fragment and, inside it, its steps ("step 2 all_gather", bytes in args).
// Times are microseconds from the plan's start; ranks' times come from their hosts' clocks.
// Every event has name, ph, pid, tid; complete events ("X") have ts and dur >= 0; metadata
// events ("M") name the process and the threads.
std::string ChromeTraceJson(const v1::PlanTrace& trace);

}  // namespace shardcoord

#endif  // SHARDCOORD_PROTO_PLAN_TRACE_H_
