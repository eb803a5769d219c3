#include "proto/plan_trace.h"

#include <algorithm>
#include <cstdint>

#include "absl/strings/str_cat.h"
#include "common/json_writer.h"

namespace shardcoord {
namespace {

constexpr int kPid = 1;

void Metadata(JsonWriter& w, const char* what, int64_t tid, const std::string& name) {
  w.BeginObject();
  w.Key("name").String(what).Key("ph").String("M").Key("pid").Int(kPid).Key("tid").Int(tid);
  w.Key("args").BeginObject().Key("name").String(name).EndObject();
  w.EndObject();
}

// A complete event; `end` before `start` (a clock step) is clamped to zero length.
JsonWriter& Complete(JsonWriter& w, const std::string& name, int64_t tid, int64_t start,
                     int64_t end) {
  w.BeginObject();
  w.Key("name").String(name).Key("ph").String("X").Key("pid").Int(kPid).Key("tid").Int(tid);
  w.Key("ts").Int(start).Key("dur").Int(std::max<int64_t>(0, end - start));
  return w;  // The caller adds args, if any, and closes the object.
}

}  // namespace

std::string ChromeTraceJson(const v1::PlanTrace& trace) {
  const int64_t t0 = trace.start_unix_us();
  auto rel = [t0](int64_t unix_us) { return unix_us - t0; };
  // A plan still running (or aborted before every report) ends at its last known time.
  int64_t last = trace.end_unix_us();
  for (const v1::RankTrace& r : trace.ranks()) last = std::max(last, r.end_unix_us());
  if (last == 0) last = t0;

  JsonWriter w;
  w.BeginObject();
  w.Key("traceEvents").BeginArray();
  Metadata(w, "process_name", 0,
           absl::StrCat("plan ", trace.plan_id(), " (", trace.op(), " ", trace.tensor(), ")"));
  Metadata(w, "thread_name", 0, "coordinator");
  for (const v1::RankTrace& r : trace.ranks()) {
    Metadata(w, "thread_name", r.rank() + 1,
             absl::StrCat("rank ", r.rank(), r.worker().empty() ? "" : " (" + r.worker() + ")"));
  }
  const int64_t transferred = trace.transferred_unix_us() != 0 ? trace.transferred_unix_us() : last;
  Complete(w, "transfer", 0, 0, rel(transferred));
  w.EndObject();
  if (trace.transferred_unix_us() != 0 && trace.end_unix_us() != 0) {
    Complete(w, "validate + commit", 0, rel(trace.transferred_unix_us()), rel(trace.end_unix_us()));
    w.EndObject();
  }
  for (const v1::RankTrace& r : trace.ranks()) {
    const int64_t tid = r.rank() + 1;
    if (r.start_unix_us() != 0) {
      Complete(w, "fragment", tid, rel(r.start_unix_us()), rel(r.end_unix_us()));
      if (!r.error().empty())
        w.Key("args").BeginObject().Key("error").String(r.error()).EndObject();
      w.EndObject();
    }
    for (const v1::StepTiming& s : r.steps()) {
      Complete(w, absl::StrCat("step ", s.index(), " ", s.op()), tid, rel(s.start_unix_us()),
               rel(s.start_unix_us() + s.duration_us()));
      w.Key("args").BeginObject();
      w.Key("bytes_sent").Int(s.bytes_sent()).Key("bytes_received").Int(s.bytes_received());
      if (s.buckets_sent() > 0 || s.buckets_received() > 0) {
        // A fused group's exchange round: with whom, in how many buckets.
        w.Key("send_peer").Int(s.send_peer()).Key("recv_peer").Int(s.recv_peer());
        w.Key("buckets_sent").Int(s.buckets_sent());
        w.Key("buckets_received").Int(s.buckets_received());
      }
      w.EndObject();
      w.EndObject();
    }
  }
  w.EndArray();
  w.Key("displayTimeUnit").String("ms");
  w.Key("otherData").BeginObject();
  w.Key("plan_id").String(trace.plan_id()).Key("tensor").String(trace.tensor());
  w.Key("op").String(trace.op()).Key("state").String(v1::PlanState_Name(trace.state()));
  if (!trace.error().empty()) w.Key("error").String(trace.error());
  w.Key("start_unix_us").Int(t0);
  w.EndObject();
  w.EndObject();
  return w.str();
}

}  // namespace shardcoord
