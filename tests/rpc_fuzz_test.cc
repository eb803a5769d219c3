// A seeded, bounded fuzz of every gRPC method both daemons serve, over real processes: the
// methods come from the protobuf descriptors (every service of proto/shardcoord.proto, split
// by which daemon registers it), plus grpc.health.v1.Health (Check, Watch), server reflection
// (v1alpha and v1, served or not) and methods that do not exist. Each method gets a fixed
// number of calls (a count, not a time) through a generic stub: empty messages, random
// bytes, random valid messages of the request type (every field filled by reflection with
// edge values: huge sizes, negative numbers, long strings, odd names) and such messages with
// bytes flipped, cut or appended; unary methods sometimes get no message or two, streams
// several. Every call has a short deadline.
//
// Afterwards the coordinator and every worker must still be running, the coordinator must
// list every worker ALIVE, health must answer SERVING on every main port, a tensor created
// before the fuzz must still hold its exact values (and redistribute and download again), and
// methods that do not exist must have answered UNIMPLEMENTED. The log shows how many calls
// each daemon got and a histogram of the status codes they answered.
//
// The generator never produces what could destroy that checked state by design rather than
// by accident (the real workers' names and addresses, the checked tensor's and mesh's names,
// absolute paths outside this test's sandbox, non-loopback addresses): every message that
// would parse as the request type is checked and replaced by an empty one if it holds such a
// value. Workers run with --checkpoint-root in the sandbox.
//
// Environment: RPC_FUZZ_SEED (default 25), RPC_FUZZ_CALLS (calls per method and daemon,
// default 64), RPC_FUZZ_SKIP (methods not to call; see Skipped).

#include <signal.h>
#include <sys/stat.h>
#include <sys/types.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <functional>
#include <limits>
#include <map>
#include <memory>
#include <random>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_replace.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "google/protobuf/descriptor.h"
#include "google/protobuf/descriptor.pb.h"
#include "google/protobuf/dynamic_message.h"
#include "google/protobuf/message.h"
#include "google/protobuf/text_format.h"
#include "grpcpp/create_channel.h"
#include "grpcpp/generic/generic_stub.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "proto/convert.h"
#include "proto/shardcoord.pb.h"
#include "sharding/dtype.h"
#include "sharding/fill.h"
#include "tests/cluster.h"
#include "tests/tensor_check.h"

namespace shardcoord {
namespace {

using ::google::protobuf::Descriptor;
using ::google::protobuf::FieldDescriptor;
using ::google::protobuf::Message;
using ::google::protobuf::MethodDescriptor;
using ::google::protobuf::Reflection;

constexpr int kNumWorkers = 3;
// Names the generator never produces (see Protected).
constexpr char kCheckedTensor[] = "rpc_fuzz_checked_tensor";
constexpr char kCheckedMesh[] = "rpc_fuzz_checked_mesh";
const Shape kCheckedShape = {48, 5};

// grpc.health.v1 and grpc.reflection (v1alpha and v1), which the daemons' binaries do not
// carry as generated code: request types as gRPC defines them, for the same random filling.
constexpr char kExtraProtos[] = R"pb(
  file {
    name: "rpc_fuzz/health.proto"
    package: "grpc.health.v1"
    syntax: "proto3"
    message_type {
      name: "HealthCheckRequest"
      field { name: "service" number: 1 label: LABEL_OPTIONAL type: TYPE_STRING }
    }
    message_type {
      name: "HealthCheckResponse"
      field { name: "status" number: 1 label: LABEL_OPTIONAL type: TYPE_INT32 }
    }
    service {
      name: "Health"
      method {
        name: "Check"
        input_type: ".grpc.health.v1.HealthCheckRequest"
        output_type: ".grpc.health.v1.HealthCheckResponse"
      }
      method {
        name: "Watch"
        input_type: ".grpc.health.v1.HealthCheckRequest"
        output_type: ".grpc.health.v1.HealthCheckResponse"
        server_streaming: true
      }
    }
  }
  file {
    name: "rpc_fuzz/reflection_v1alpha.proto"
    package: "grpc.reflection.v1alpha"
    syntax: "proto3"
    message_type {
      name: "ExtensionRequest"
      field { name: "containing_type" number: 1 label: LABEL_OPTIONAL type: TYPE_STRING }
      field { name: "extension_number" number: 2 label: LABEL_OPTIONAL type: TYPE_INT32 }
    }
    message_type {
      name: "ServerReflectionRequest"
      field { name: "host" number: 1 label: LABEL_OPTIONAL type: TYPE_STRING }
      field {
        name: "file_by_filename"
        number: 3
        label: LABEL_OPTIONAL
        type: TYPE_STRING
        oneof_index: 0
      }
      field {
        name: "file_containing_symbol"
        number: 4
        label: LABEL_OPTIONAL
        type: TYPE_STRING
        oneof_index: 0
      }
      field {
        name: "file_containing_extension"
        number: 5
        label: LABEL_OPTIONAL
        type: TYPE_MESSAGE
        type_name: ".grpc.reflection.v1alpha.ExtensionRequest"
        oneof_index: 0
      }
      field {
        name: "all_extension_numbers_of_type"
        number: 6
        label: LABEL_OPTIONAL
        type: TYPE_STRING
        oneof_index: 0
      }
      field {
        name: "list_services"
        number: 7
        label: LABEL_OPTIONAL
        type: TYPE_STRING
        oneof_index: 0
      }
      oneof_decl { name: "message_request" }
    }
    message_type { name: "ServerReflectionResponse" }
    service {
      name: "ServerReflection"
      method {
        name: "ServerReflectionInfo"
        input_type: ".grpc.reflection.v1alpha.ServerReflectionRequest"
        output_type: ".grpc.reflection.v1alpha.ServerReflectionResponse"
        client_streaming: true
        server_streaming: true
      }
    }
  }
  file {
    name: "rpc_fuzz/reflection_v1.proto"
    package: "grpc.reflection.v1"
    syntax: "proto3"
    dependency: "rpc_fuzz/reflection_v1alpha.proto"
    message_type { name: "ServerReflectionResponse" }
    service {
      name: "ServerReflection"
      method {
        name: "ServerReflectionInfo"
        input_type: ".grpc.reflection.v1alpha.ServerReflectionRequest"
        output_type: ".grpc.reflection.v1.ServerReflectionResponse"
        client_streaming: true
        server_streaming: true
      }
    }
  }
)pb";

// Valid requests to start from ("{sandbox}" stands for the test's sandbox directory), by
// method path, in text format; a client-streaming method's seed is its messages separated by
// "|". The fuzz mutates a few fields of them (Generator::MutateFields), which reaches the
// handlers' code past their first checks (a mesh exists, a tensor is on it, an upload's header
// is whole) far more often than random messages do. Names "fa", "fb", "fz" are the fuzz's own.
const std::map<std::string, std::vector<std::string>>& Seeds() {
  static const auto* seeds = new std::map<std::string, std::vector<std::string>>{
      {"/shardcoord.v1.Coordinator/CreateMesh",
       {R"seed(name: "fa" shape: 2 workers: "w0" workers: "w1")seed",
        R"seed(name: "fb" shape: 3)seed"}},
      {"/shardcoord.v1.Coordinator/CreateTensor",
       {R"seed(name: "fa" shape: 4 shape: 3 dtype: F32 spec { mesh: "fa" placements_text: )seed"
        R"seed("S(0)" } init: ARANGE)seed",
        R"seed(name: "fb" shape: 6 dtype: BF16 spec { mesh: "fb" placements_text: "P" } init: )seed"
        R"seed(RANDOM seed: 7)seed"}},
      {"/shardcoord.v1.Coordinator/Upload",
       {R"seed(header { name: "fc" shape: 4 dtype: F32 spec { mesh: "fa" placements_text: )seed"
        R"seed("S(0)" } } | data: "0123456789abcdef")seed",
        R"seed(header { name: "fa" shape: 4 shape: 3 dtype: F32 has_rank: true rank: 0 )seed"
        R"seed(total_bytes: 24 } | data: "0123456789abcdef01234567")seed",
        // The issue's case: one rank's buffer of 1 TiB, for a tensor that may not exist.
        R"seed(header { name: "fa" shape: 4 shape: 3 dtype: F32 has_rank: true rank: 1 )seed"
        R"seed(total_bytes: 1099511627776 } | data: "x")seed",
        R"seed(header { name: "ghost" shape: 4 dtype: F32 has_rank: true rank: 0 )seed"
        R"seed(total_bytes: 1099511627776 })seed",
        R"seed(header { name: "ghost" shape: 1048576 shape: 1048576 dtype: F64 spec { mesh: )seed"
        R"seed("fb" placements_text: "R" } total_bytes: 8796093022208 })seed"}},
      {"/shardcoord.v1.Coordinator/Download", {R"seed(name: "fa")seed", R"seed(name: "fc")seed"}},
      {"/shardcoord.v1.Coordinator/Redistribute",
       {R"seed(tensor: "fa" target { placements_text: "R" } wait: true)seed",
        R"seed(tensor: "fb" target { mesh: "fa" placements_text: "S(0)" })seed"}},
      {"/shardcoord.v1.Coordinator/Gather", {R"seed(tensor: "fa" wait: true)seed"}},
      {"/shardcoord.v1.Coordinator/Copy", {R"seed(src: "fa" dst: "fc" wait: true)seed"}},
      {"/shardcoord.v1.Coordinator/DeleteTensor", {R"seed(name: "fc")seed"}},
      {"/shardcoord.v1.Coordinator/CreateTransfer",
       {R"seed(name: "fx" copies { src: "fa" dst: "fc" })seed"}},
      {"/shardcoord.v1.Coordinator/RunTransfer", {R"seed(name: "fx" wait: true)seed"}},
      {"/shardcoord.v1.Coordinator/GetTransfer", {R"seed(name: "fx" copies: true)seed"}},
      {"/shardcoord.v1.Coordinator/ListTransfers", {R"seed(page_size: 2)seed"}},
      {"/shardcoord.v1.Coordinator/DeleteTransfer", {R"seed(name: "fx")seed"}},
      {"/shardcoord.v1.Coordinator/DeleteMesh", {R"seed(name: "fb")seed"}},
      {"/shardcoord.v1.Coordinator/PlanRedistribute",
       {R"seed(tensor: "fa" target { placements_text: "S(1)" })seed"}},
      {"/shardcoord.v1.Coordinator/SaveCheckpoint",
       {R"seed(dir: "{sandbox}/0" tensors: "fa" tensors: "fb")seed",
        R"seed(dir: "{sandbox}/1" all: true overwrite: true)seed"}},
      {"/shardcoord.v1.Coordinator/LoadCheckpoint",
       {R"seed(dir: "{sandbox}/0" all: true prefix: "l_" spec { mesh: "fa" )seed"
        R"seed(placements_text: "R" )seed"
        R"seed(})seed"}},
      {"/shardcoord.v1.Coordinator/InspectCheckpoint", {R"seed(dir: "{sandbox}/0")seed"}},
      {"/shardcoord.v1.CoordinatorWorkers/RegisterWorker",
       {R"seed(name: "fake0" host: "127.0.0.1" address: "127.0.0.1:1" backend: "gloo")seed"}},
      {"/shardcoord.v1.CoordinatorWorkers/Heartbeat", {R"seed(name: "fake0" incarnation: 1)seed"}},
      {"/shardcoord.v1.CoordinatorWorkers/LeaveWorker",
       {R"seed(name: "fake0" incarnation: 1 drain_timeout_ms: 10)seed"}},
      {"/shardcoord.v1.CoordinatorWorkers/KvSet", {R"seed(key: "k" value: "v")seed"}},
      {"/shardcoord.v1.CoordinatorWorkers/KvGet", {R"seed(key: "k" timeout_ms: 10)seed"}},
      {"/shardcoord.v1.CoordinatorWorkers/Barrier",
       {R"seed(key: "b" participants: 2 member: "m" timeout_ms: 50)seed"}},
      {"/shardcoord.v1.Worker/Fill",
       {R"seed(tensor: "fz" version: 1 dtype: F32 global_shape: 4 init: ARANGE )seed"
        R"seed(chunks { rank: 0 )seed"
        R"seed(chunks { box { offset: 0 shape: 4 } } local_elements: 4 })seed"}},
      {"/shardcoord.v1.Worker/WriteChunk",
       {R"seed(tensor: "fz" version: 2 dtype: F32 total_bytes: 16 chunks { rank: )seed"
        R"seed(0 chunks { box )seed"
        R"seed({ offset: 0 shape: 4 } } local_elements: 4 } | data: "0123456789abcdef")seed",
        R"seed(tensor: "fz" version: 3 dtype: F32 total_bytes: 1099511627776 chunks { rank: 0 )seed"
        R"seed(chunks { box { offset: 0 shape: 4 } } local_elements: 4 } | data: "0123")seed"}},
      {"/shardcoord.v1.Worker/WriteBuffer",
       {R"seed(tensor: "fz" version: 4 dtype: F32 total_bytes: 16 data: "0123456789abcdef" )seed"
        R"seed(chunks { rank: 0 chunks { box { offset: 0 shape: 4 } } local_elements: 4 })seed"}},
      {"/shardcoord.v1.Worker/ReadChunk",
       {R"seed(tensor: "fz" version: 1 box { offset: 0 shape: 4 })seed"}},
      {"/shardcoord.v1.Worker/ReadBoxes",
       {R"seed(tensor: "fz" version: 1 boxes { offset: 1 shape: 2 } boxes { )seed"
        R"seed(offset: 0 shape: 4 )seed"
        R"seed(})seed"}},
      {"/shardcoord.v1.Worker/DropTensor", {R"seed(tensor: "fz" version: 2)seed"}},
      {"/shardcoord.v1.Worker/Execute",
       {R"seed(plan_id: "p1" tensor: "fz" dtype: F32 rank: 0 source_version: 1 )seed"
        R"seed(target_version: )seed"
        R"seed(5 step_timeout_ms: 100 source { rank: 0 chunks { box { offset: 0 shape: 4 } } )seed"
        R"seed(local_elements: 4 } target { rank: 0 chunks { box { offset: 0 shape: 4 } } )seed"
        R"seed(local_elements: 4 } local_copies {})seed"}},
      {"/shardcoord.v1.Worker/FinishPlan", {R"seed(plan_id: "p1" tensor: "fz" commit: true)seed"}},
      {"/shardcoord.v1.Worker/WriteCheckpoint",
       {R"seed(dir: "{sandbox}/{worker}" file: "a.safetensors" entries { entry: "e" tensor: )seed"
        R"seed("fz" version: 1 box { offset: 0 shape: 4 } })seed"}},
      {"/shardcoord.v1.Worker/ReadCheckpointIndex", {R"seed(path: "{sandbox}/{worker}")seed"}},
      {"/grpc.health.v1.Health/Check",
       {R"seed(service: "")seed", R"seed(service: "liveness")seed"}},
      {"/grpc.health.v1.Health/Watch", {R"seed(service: "liveness")seed"}},
      {"/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo",
       {R"seed(list_services: "")seed",
        R"seed(file_containing_symbol: "shardcoord.v1.Coordinator")seed",
        R"seed(file_by_filename: "shardcoord.proto")seed"}},
  };
  return *seeds;
}

int64_t EnvInt(const char* name, int64_t fallback) {
  const char* value = std::getenv(name);
  int64_t parsed = 0;
  if (value == nullptr || !absl::SimpleAtoi(value, &parsed)) return fallback;
  return parsed;
}

// True while `pid` runs (a zombie, which has exited, is not running).
bool Running(pid_t pid) {
  if (pid <= 0) return false;
  std::ifstream stat(absl::StrCat("/proc/", pid, "/stat"));
  std::string text((std::istreambuf_iterator<char>(stat)), std::istreambuf_iterator<char>());
  const size_t paren = text.rfind(')');
  if (paren == std::string::npos || paren + 2 >= text.size()) return false;
  const char state = text[paren + 2];
  return state != 'Z' && state != 'X';
}

std::string CodeName(grpc::StatusCode code) {
  return absl::StatusCodeToString(static_cast<absl::StatusCode>(code));
}

struct Protected;

// One method as a path, with its request type when the method exists.
struct Method {
  std::string path;                   // "/shardcoord.v1.Coordinator/Upload"
  const Descriptor* input = nullptr;  // nullptr: a method no daemon serves.
  const Message* prototype = nullptr;
  bool client_streaming = false;
  bool server_streaming = false;
  bool must_be_unimplemented = false;
  const Protected* protect = nullptr;  // What its requests must not hold.
  // Valid request sequences to mutate (from Seeds()); each one message unless the method is
  // client-streaming.
  std::vector<std::vector<std::shared_ptr<const Message>>> seeds;
};

// What the generator must never produce (exact strings), and where paths may point. The
// real workers' names are protected everywhere but in the Coordinator service, where they
// only name mesh members (CreateMesh); CoordinatorWorkers calls with them (RegisterWorker,
// LeaveWorker, DetachBuffer) would take the worker away.
struct Protected {
  std::set<std::string> names;
  std::set<std::string> addresses;
  std::string sandbox;  // Absolute; the only absolute paths generated lie under it.
};

bool AddressField(const FieldDescriptor* f) {
  const std::string name = absl::AsciiStrToLower(f->name());
  return absl::StrContains(name, "address") || absl::StrContains(name, "host") ||
         absl::StrContains(name, "endpoint") || absl::StrContains(name, "hint") ||
         absl::StrContains(name, "url");
}

bool PathField(const FieldDescriptor* f) {
  const std::string name = absl::AsciiStrToLower(f->name());
  return absl::StrContains(name, "path") || absl::StrContains(name, "dir") ||
         absl::StrContains(name, "tmp") || absl::StrContains(name, "file") ||
         absl::StrContains(name, "root");
}

// Whether `value` in field `f` is one the generator may send (see Protected).
bool SafeString(const FieldDescriptor* f, const std::string& value, const Protected& p) {
  if (p.names.count(value) > 0 || p.addresses.count(value) > 0) return false;
  if (AddressField(f) && !value.empty() && value != "127.0.0.1" && value != "::1" &&
      !absl::StartsWith(value, "127.0.0.1:") && !absl::StartsWith(value, "[::1]:")) {
    return false;
  }
  if (absl::StrContains(value, "..") && absl::StrContains(value, "/")) return false;
  if (!value.empty() && value[0] == '/') {
    if (value == "/") return !PathField(f);
    return value == p.sandbox || absl::StartsWith(value, p.sandbox + "/");
  }
  return true;
}

// Whether every string anywhere in `m` is safe.
bool SafeMessage(const Message& m, const Protected& p) {
  const Reflection* r = m.GetReflection();
  // A load `into` existing tensors writes whatever tensor the checkpoint names, which a save
  // of `all` tensors made the checked one.
  if (m.GetDescriptor()->full_name() == "shardcoord.v1.LoadCheckpointRequest") {
    const FieldDescriptor* into = m.GetDescriptor()->FindFieldByName("into");
    if (into != nullptr && r->GetBool(m, into)) return false;
  }
  std::vector<const FieldDescriptor*> fields;
  r->ListFields(m, &fields);
  for (const FieldDescriptor* f : fields) {
    if (f->cpp_type() == FieldDescriptor::CPPTYPE_STRING) {
      if (f->is_repeated()) {
        for (int i = 0; i < r->FieldSize(m, f); ++i) {
          if (!SafeString(f, r->GetRepeatedString(m, f, i), p)) return false;
        }
      } else if (!SafeString(f, r->GetString(m, f), p)) {
        return false;
      }
    } else if (f->cpp_type() == FieldDescriptor::CPPTYPE_MESSAGE) {
      if (f->is_repeated()) {
        for (int i = 0; i < r->FieldSize(m, f); ++i) {
          if (!SafeMessage(r->GetRepeatedMessage(m, f, i), p)) return false;
        }
      } else if (!SafeMessage(r->GetMessage(m, f), p)) {
        return false;
      }
    }
  }
  return true;
}

// Requests for one method from one seed.
class Generator {
 public:
  Generator(uint64_t seed, const Protected* p) : rng_(seed), p_(p) {}

  uint64_t Next() { return rng_(); }
  // True with probability `num` / `den`.
  bool Chance(int num, int den) { return static_cast<int>(rng_() % den) < num; }
  int64_t Below(int64_t n) { return static_cast<int64_t>(rng_() % static_cast<uint64_t>(n)); }

  std::string RandomBytes(int64_t max_len) {
    std::string s(Below(max_len + 1), '\0');
    for (char& c : s) c = static_cast<char>(rng_());
    return s;
  }

  // A seed's messages with a few fields changed (none, sometimes), each sometimes mutated as
  // bytes; sometimes a message dropped.
  std::vector<std::string> FromSeed(const Method& method,
                                    const std::vector<std::shared_ptr<const Message>>& seed) {
    std::vector<std::string> out;
    for (const std::shared_ptr<const Message>& s : seed) {
      if (seed.size() > 1 && Chance(1, 10)) continue;
      std::unique_ptr<Message> m(s->New());
      m->CopyFrom(*s);
      plausible_ = Chance(2, 3);
      for (int64_t i = 0, n = Below(4); i < n; ++i) MutateField(m.get(), 0);
      std::string bytes = m->SerializeAsString();
      if (Chance(1, 6) && !bytes.empty()) bytes = Mutate(std::move(bytes));
      out.push_back(Checked(method, std::move(bytes)));
    }
    return out;
  }

  // One serialized request for `method` (or arbitrary bytes for an unknown method).
  std::string Request(const Method& method) {
    const int kind = static_cast<int>(Below(100));
    if (kind < 8 || method.prototype == nullptr) {
      return kind % 2 == 0 ? std::string() : RandomBytes(Chance(1, 10) ? 4096 : 64);
    }
    if (kind < 20) return Checked(method, RandomBytes(Chance(1, 10) ? 65536 : 256));
    // Half the messages are plausible (small numbers, names that exist or are valid) to get
    // past the first checks into the handlers; the others take edge values everywhere.
    plausible_ = Chance(1, 2);
    std::unique_ptr<Message> m(method.prototype->New());
    Fill(m.get(), 0);
    std::string bytes = m->SerializeAsString();
    if (kind < 80 || bytes.empty()) return Checked(method, bytes);
    return Checked(method, Mutate(std::move(bytes)));
  }

 private:
  // `bytes`, or an empty message when they would parse into something the generator must
  // not send.
  std::string Checked(const Method& method, std::string bytes) {
    std::unique_ptr<Message> parsed(method.prototype->New());
    if (parsed->ParseFromString(bytes) && !SafeMessage(*parsed, *p_)) return std::string();
    return bytes;
  }

  std::string Mutate(std::string bytes) {
    switch (Below(5)) {
      case 0:  // Flip a few bytes.
        for (int64_t i = 0, n = 1 + Below(8); i < n; ++i) {
          bytes[Below(bytes.size())] ^= static_cast<char>(1 + Below(255));
        }
        return bytes;
      case 1:  // Cut.
        bytes.resize(Below(bytes.size()));
        return bytes;
      case 2:  // Append garbage.
        return bytes + RandomBytes(32);
      case 3: {  // A length-delimited field 1 claiming far more bytes than follow.
        std::string prefix = "\x0a\xff\xff\xff\xff\x0f";
        return prefix + bytes;
      }
      default: {  // Insert random bytes in the middle.
        const size_t at = Below(bytes.size() + 1);
        return bytes.substr(0, at) + RandomBytes(8) + bytes.substr(at);
      }
    }
  }

  int64_t Int64() {
    if (plausible_) {
      const int kind = static_cast<int>(Below(20));
      if (kind < 16) return Below(5);
      if (kind < 18) return int64_t{1} << (20 + Below(21));  // 1 MiB .. 1 TiB as a size.
      return -Below(3);
    }
    static const int64_t kEdges[] = {0,
                                     1,
                                     -1,
                                     2,
                                     3,
                                     4,
                                     -2,
                                     7,
                                     16,
                                     255,
                                     1 << 20,
                                     int64_t{1} << 31,
                                     int64_t{1} << 32,
                                     int64_t{1} << 40,
                                     int64_t{1} << 53,
                                     std::numeric_limits<int64_t>::max(),
                                     std::numeric_limits<int64_t>::max() - 1,
                                     std::numeric_limits<int64_t>::min(),
                                     std::numeric_limits<int32_t>::max(),
                                     std::numeric_limits<int32_t>::min()};
    const int kind = static_cast<int>(Below(10));
    if (kind < 4) return Below(9);
    if (kind < 8) return kEdges[Below(sizeof(kEdges) / sizeof(kEdges[0]))];
    return static_cast<int64_t>(rng_());
  }

  double Double() {
    static const double kEdges[] = {0.0,
                                    -0.0,
                                    1.0,
                                    -1.0,
                                    0.5,
                                    1e308,
                                    -1e308,
                                    std::numeric_limits<double>::infinity(),
                                    -std::numeric_limits<double>::infinity(),
                                    std::numeric_limits<double>::quiet_NaN(),
                                    std::numeric_limits<double>::denorm_min()};
    if (Chance(1, 2)) return kEdges[Below(sizeof(kEdges) / sizeof(kEdges[0]))];
    double d;
    const uint64_t bits = rng_();
    std::memcpy(&d, &bits, sizeof(d));
    return d;
  }

  std::string Name() {
    if (plausible_) {
      // Names the fuzz itself creates and refers to again, and the real workers where that
      // is harmless (see Protected).
      static const char* const kPlausible[] = {"fa", "fb", "fc", "S(0)", "R", "0:2;2:4"};
      if (Chance(1, 3)) {
        const std::string worker = Cluster::WorkerName(static_cast<int>(Below(kNumWorkers)));
        if (p_->names.count(worker) == 0) return worker;
      }
      return kPlausible[Below(sizeof(kPlausible) / sizeof(kPlausible[0]))];
    }
    static const char* const kNames[] = {"",
                                         "/",
                                         ".",
                                         "..",
                                         "S(0)",
                                         "S(1),R",
                                         "R",
                                         "P",
                                         "0:1,2:3;;",
                                         "a",
                                         "t",
                                         "m",
                                         "fuzz",
                                         "w9",
                                         "ghost",
                                         " ",
                                         "\t\n",
                                         "a b",
                                         "-1",
                                         "*",
                                         "%s%n",
                                         "\xc3\xa9t\xc3\xa9",
                                         "liveness",
                                         "shardcoord.v1.Coordinator",
                                         "grpc.health.v1.Health"};
    const int kind = static_cast<int>(Below(20));
    if (kind < 12) return kNames[Below(sizeof(kNames) / sizeof(kNames[0]))];
    if (kind < 14) return std::string(300, 'a');
    if (kind < 15) return std::string(Chance(1, 2) ? 70000 : 4096, 'n');
    std::string s(1 + Below(24), 'x');
    for (char& c : s) c = static_cast<char>(' ' + Below(95));  // Printable ASCII.
    return s;
  }

  std::string Address() {
    switch (Below(6)) {
      case 0:
        return "";
      case 1:
        return absl::StrCat("127.0.0.1:", Below(65536));
      case 2:
        return absl::StrCat("[::1]:", Below(70000));
      case 3:
        return "127.0.0.1:";
      case 4:
        return "127.0.0.1:-1";
      default:
        return absl::StrCat("127.0.0.1:1", std::string(Below(40), '9'));
    }
  }

  std::string Path() {
    switch (Below(6)) {
      case 0:
        return "";
      case 1:
        return p_->sandbox;
      case 2:
        return "relative/x";
      case 3:
        return absl::StrCat(p_->sandbox, "/", Below(4));
      case 4:
        return absl::StrCat(p_->sandbox, "/", Below(4), "/", Name());
      default:
        return Name();
    }
  }

  std::string String(const FieldDescriptor* f) {
    if (f->type() == FieldDescriptor::TYPE_BYTES) {
      return RandomBytes(plausible_ ? 64 : Chance(1, 20) ? 300000 : 1024);
    }
    if (AddressField(f)) return Address();
    if (PathField(f)) return Path();
    return Name();
  }

  int RepeatCount() {
    if (plausible_) return static_cast<int>(1 + Below(3));
    const int kind = static_cast<int>(Below(20));
    if (kind < 17) return static_cast<int>(Below(4));
    if (kind < 19) return static_cast<int>(4 + Below(12));
    return 300;
  }

  void SetScalar(Message* m, const FieldDescriptor* f) {
    const Reflection* r = m->GetReflection();
    const bool add = f->is_repeated();
    switch (f->cpp_type()) {
      case FieldDescriptor::CPPTYPE_INT32: {
        const int32_t v = static_cast<int32_t>(Int64());
        add ? r->AddInt32(m, f, v) : r->SetInt32(m, f, v);
        break;
      }
      case FieldDescriptor::CPPTYPE_INT64: {
        const int64_t v = Int64();
        add ? r->AddInt64(m, f, v) : r->SetInt64(m, f, v);
        break;
      }
      case FieldDescriptor::CPPTYPE_UINT32: {
        const uint32_t v = static_cast<uint32_t>(Int64());
        add ? r->AddUInt32(m, f, v) : r->SetUInt32(m, f, v);
        break;
      }
      case FieldDescriptor::CPPTYPE_UINT64: {
        const uint64_t v = static_cast<uint64_t>(Int64());
        add ? r->AddUInt64(m, f, v) : r->SetUInt64(m, f, v);
        break;
      }
      case FieldDescriptor::CPPTYPE_DOUBLE: {
        const double v = Double();
        add ? r->AddDouble(m, f, v) : r->SetDouble(m, f, v);
        break;
      }
      case FieldDescriptor::CPPTYPE_FLOAT: {
        const float v = static_cast<float>(Double());
        add ? r->AddFloat(m, f, v) : r->SetFloat(m, f, v);
        break;
      }
      case FieldDescriptor::CPPTYPE_BOOL: {
        const bool v = Chance(1, 2);
        add ? r->AddBool(m, f, v) : r->SetBool(m, f, v);
        break;
      }
      case FieldDescriptor::CPPTYPE_ENUM: {
        // Mostly a declared value, sometimes any number (proto3 enums are open).
        const google::protobuf::EnumDescriptor* e = f->enum_type();
        const int v = plausible_ || Chance(4, 5) ? e->value(Below(e->value_count()))->number()
                                                 : static_cast<int>(Int64());
        add ? r->AddEnumValue(m, f, v) : r->SetEnumValue(m, f, v);
        break;
      }
      case FieldDescriptor::CPPTYPE_STRING: {
        std::string v = String(f);
        add ? r->AddString(m, f, std::move(v)) : r->SetString(m, f, std::move(v));
        break;
      }
      case FieldDescriptor::CPPTYPE_MESSAGE:
        break;
    }
  }

  // Changes one field of `m` or of a message inside it: a new value, one more element, or
  // the field cleared.
  void MutateField(Message* m, int depth) {
    const Descriptor* d = m->GetDescriptor();
    const Reflection* r = m->GetReflection();
    if (d->field_count() == 0) return;
    const FieldDescriptor* f = d->field(Below(d->field_count()));
    if (Chance(1, 8)) {
      r->ClearField(m, f);
      return;
    }
    if (f->cpp_type() == FieldDescriptor::CPPTYPE_MESSAGE) {
      if (depth >= 4) return;
      Message* sub = nullptr;
      if (f->is_repeated()) {
        const int size = r->FieldSize(*m, f);
        sub = size > 0 && Chance(2, 3) ? r->MutableRepeatedMessage(m, f, Below(size))
                                       : r->AddMessage(m, f);
      } else {
        sub = r->MutableMessage(m, f);
      }
      if (Chance(1, 4)) {
        Fill(sub, depth + 1);
      } else {
        MutateField(sub, depth + 1);
      }
      return;
    }
    if (f->is_repeated()) {
      if (r->FieldSize(*m, f) > 0 && Chance(1, 2)) {
        // Replace the last element: set a new one and swap it into place.
        SetScalar(m, f);
        const int size = r->FieldSize(*m, f);
        r->SwapElements(m, f, size - 2, size - 1);
        r->RemoveLast(m, f);
      } else {
        SetScalar(m, f);
      }
      return;
    }
    SetScalar(m, f);
  }

  void Fill(Message* m, int depth) {
    const Descriptor* d = m->GetDescriptor();
    const Reflection* r = m->GetReflection();
    for (int i = 0; i < d->field_count(); ++i) {
      const FieldDescriptor* f = d->field(i);
      if (!Chance(3, 5)) continue;
      const bool message = f->cpp_type() == FieldDescriptor::CPPTYPE_MESSAGE;
      if (message && depth >= (plausible_ ? 3 : 4)) continue;
      if (f->is_map()) {
        for (int k = 0, n = RepeatCount(); k < n; ++k) {
          Message* entry = r->AddMessage(m, f);
          const Descriptor* ed = entry->GetDescriptor();
          for (int j = 0; j < ed->field_count(); ++j) {
            const FieldDescriptor* ef = ed->field(j);
            if (ef->cpp_type() == FieldDescriptor::CPPTYPE_MESSAGE) {
              Fill(entry->GetReflection()->MutableMessage(entry, ef), depth + 1);
            } else {
              SetScalar(entry, ef);
            }
          }
        }
      } else if (f->is_repeated()) {
        for (int k = 0, n = message ? std::min(RepeatCount(), 8) : RepeatCount(); k < n; ++k) {
          if (message) {
            Fill(r->AddMessage(m, f), depth + 1);
          } else {
            SetScalar(m, f);
          }
        }
      } else if (message) {
        Fill(r->MutableMessage(m, f), depth + 1);
      } else {
        SetScalar(m, f);
      }
    }
  }

  std::mt19937_64 rng_;
  const Protected* p_;
  bool plausible_ = false;
};

// One call: every message written in turn (stopping at the first refused write), then
// WritesDone (unless `half_close` is false), then every response read (at most
// `max_reads`, then the call is cancelled), then the status.
struct CallResult {
  grpc::StatusCode code = grpc::StatusCode::UNKNOWN;
  std::string message;
  std::vector<std::string> responses;
};

CallResult Call(grpc::GenericStub& stub, const std::string& method,
                const std::vector<std::string>& messages, bool half_close, absl::Duration deadline,
                int max_reads = 64) {
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(absl::Now() + deadline));
  grpc::CompletionQueue cq;
  std::unique_ptr<grpc::GenericClientAsyncReaderWriter> call =
      stub.PrepareCall(&context, method, &cq);
  int tag_counter = 0;
  auto wait = [&cq, &tag_counter]() {
    void* tag = nullptr;
    bool ok = false;
    const bool got = cq.Next(&tag, &ok);
    ++tag_counter;
    return got && ok;
  };
  CallResult result;
  call->StartCall(reinterpret_cast<void*>(1));
  bool ok = wait();
  for (size_t i = 0; ok && i < messages.size(); ++i) {
    grpc::Slice slice(messages[i]);
    grpc::ByteBuffer buffer(&slice, 1);
    call->Write(buffer, reinterpret_cast<void*>(2));
    ok = wait();
  }
  if (ok && half_close) {
    call->WritesDone(reinterpret_cast<void*>(3));
    ok = wait();
  }
  // Reads go on even after a refused write: the status may already be on its way.
  for (int i = 0; i < max_reads; ++i) {
    grpc::ByteBuffer response;
    call->Read(&response, reinterpret_cast<void*>(4));
    if (!wait()) break;
    std::vector<grpc::Slice> slices;
    std::string data;
    if (response.Dump(&slices).ok()) {
      for (const grpc::Slice& s : slices) {
        data.append(reinterpret_cast<const char*>(s.begin()), s.size());
      }
    }
    result.responses.push_back(std::move(data));
    if (i + 1 == max_reads) context.TryCancel();
  }
  grpc::Status status;
  call->Finish(&status, reinterpret_cast<void*>(5));
  wait();
  cq.Shutdown();
  void* tag = nullptr;
  bool drained_ok = false;
  while (cq.Next(&tag, &drained_ok)) {
  }
  result.code = status.error_code();
  result.message = status.error_message();
  return result;
}

// One daemon under fuzz and what it answered.
struct Target {
  std::string label;  // "coordinator", "w0"
  std::string address;
  pid_t pid = 0;
  std::vector<Method> methods;

  int64_t requests = 0;  // Calls made.
  std::map<grpc::StatusCode, int64_t> codes;
  std::map<std::string, std::map<grpc::StatusCode, int64_t>> codes_by_method;
  std::map<std::string, absl::Duration> time_by_method;  // For the log only.
  std::map<std::string, int64_t> bytes_by_method;        // Request bytes sent.
  // The first message of each code that no handler documents for bad input, and of a
  // deadline exceeded by a whole request (a call that may hang), for the log.
  std::map<std::pair<std::string, grpc::StatusCode>, std::string> odd_messages;
  // Unknown methods not UNIMPLEMENTED; statuses too large for a client to read.
  std::vector<std::string> failures;
  std::string death;  // Set when the daemon died under the fuzz.
};

std::string Histogram(const std::map<grpc::StatusCode, int64_t>& codes) {
  std::vector<std::string> parts;
  for (const auto& [code, n] : codes) parts.push_back(absl::StrCat(CodeName(code), " ", n));
  return absl::StrJoin(parts, ", ");
}

std::string Preview(const std::string& bytes) {
  return absl::StrCat(bytes.size(), " bytes: ",
                      absl::BytesToHexString(bytes.substr(0, std::min<size_t>(bytes.size(), 96))),
                      bytes.size() > 96 ? "..." : "");
}

// RPC_FUZZ_SKIP: comma-separated substrings of method paths not to call (to reproduce or
// to look past a known crash; the test then fails on the count of calls).
bool Skipped(const std::string& path) {
  const char* skip = std::getenv("RPC_FUZZ_SKIP");
  if (skip == nullptr) return false;
  for (absl::string_view part : absl::StrSplit(skip, ',', absl::SkipEmpty())) {
    if (absl::StrContains(path, part)) return true;
  }
  return false;
}

// Fuzzes every method of `target` in turn, `calls` calls each; stops at the daemon's death.
void FuzzTarget(Target* target, uint64_t seed, int calls) {
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(-1);
  args.SetMaxSendMessageSize(-1);
  std::shared_ptr<grpc::Channel> channel =
      grpc::CreateCustomChannel(target->address, grpc::InsecureChannelCredentials(), args);
  grpc::GenericStub stub(channel);
  // Every method `calls` times, in a shuffled order, so that calls build state (a mesh, a
  // tensor on it, a checkpoint of it) that later calls of other methods find.
  std::vector<Generator> generators;
  std::vector<int> order;
  for (size_t m = 0; m < target->methods.size(); ++m) {
    const Method& method = target->methods[m];
    generators.emplace_back(seed ^ std::hash<std::string>()(target->label + method.path),
                            method.protect);
    if (Skipped(method.path)) continue;
    order.insert(order.end(), calls, static_cast<int>(m));
  }
  std::mt19937_64 shuffle(seed ^ std::hash<std::string>()(target->label));
  std::shuffle(order.begin(), order.end(), shuffle);
  std::vector<int> calls_made(target->methods.size(), 0);
  std::string last_call = "none";
  for (const int m : order) {
    const Method& method = target->methods[m];
    Generator& gen = generators[m];
    const int i = calls_made[m]++;
    {
      int count = 1;
      const int shape = static_cast<int>(gen.Below(20));
      if (method.client_streaming) {
        count = static_cast<int>(gen.Below(5));
      } else if (shape == 0) {
        count = 0;  // A unary call with no request message.
      } else if (shape == 1) {
        count = 2;  // ... or with two.
      }
      std::vector<std::string> messages;
      if (!method.seeds.empty() && gen.Chance(1, 3)) {
        messages = gen.FromSeed(method, method.seeds[gen.Below(method.seeds.size())]);
      } else {
        for (int k = 0; k < count; ++k) messages.push_back(gen.Request(method));
      }
      const bool half_close = method.must_be_unimplemented || !gen.Chance(1, 12);
      // Mostly 1 s; sometimes a deadline that may pass in the middle of the handler. A watch
      // (Health/Watch, WatchPlan: the server streams until the call ends) gets 300 ms, which
      // is what bounds most of them.
      const bool watch = method.server_streaming && !method.client_streaming &&
                         absl::StrContains(method.path, "/Watch");
      const absl::Duration deadline = method.must_be_unimplemented ? absl::Seconds(5)
                                      : gen.Chance(1, 5) ? absl::Milliseconds(20 + gen.Below(200))
                                      : watch            ? absl::Milliseconds(300)
                                                         : absl::Seconds(1);
      const absl::Time start = absl::Now();
      CallResult result = Call(stub, method.path, messages, half_close, deadline);
      target->time_by_method[method.path] += absl::Now() - start;
      for (const std::string& m : messages) target->bytes_by_method[method.path] += m.size();
      if (result.code == grpc::StatusCode::UNAVAILABLE ||
          result.code == grpc::StatusCode::UNKNOWN || result.code == grpc::StatusCode::INTERNAL ||
          result.code == grpc::StatusCode::DATA_LOSS ||
          (result.code == grpc::StatusCode::DEADLINE_EXCEEDED && half_close && !messages.empty())) {
        int64_t sent = 0;
        for (const std::string& m : messages) sent += m.size();
        target->odd_messages.emplace(std::make_pair(method.path, result.code),
                                     absl::StrCat(result.message, " (call ", i, ": ",
                                                  messages.size(), " messages, ", sent, " bytes)"));
      }
      ++target->requests;
      ++target->codes[result.code];
      ++target->codes_by_method[method.path][result.code];
      // A status whose message is too long for a client's metadata limit: the caller never
      // learns what went wrong (and the connection may break for the calls after it).
      if (result.code == grpc::StatusCode::RESOURCE_EXHAUSTED &&
          absl::StrContains(result.message, "metadata size exceeds limit")) {
        target->failures.push_back(absl::StrCat(
            method.path, " call ", i, " answered a status too large to read: ", result.message));
      }
      if (method.must_be_unimplemented && result.code != grpc::StatusCode::UNIMPLEMENTED) {
        target->failures.push_back(
            absl::StrCat(method.path, " answered ", CodeName(result.code), ": ", result.message));
      }
      std::vector<std::string> sent;
      for (const std::string& m : messages) sent.push_back(Preview(m));
      std::string this_call = absl::StrCat(
          "call ", i, " of ", method.path, " (answered ", CodeName(result.code), ": ",
          result.message, "; ", messages.size(), " messages [", absl::StrJoin(sent, "; "), "])");
      if (!Running(target->pid)) {
        target->death = absl::StrCat(target->label, " died during ", this_call,
                                     "; the call before: ", last_call);
        return;
      }
      last_call = std::move(this_call);
    }
  }
}

// Every method of every service in `services`, then health, reflection and unknown methods.
std::vector<Method> MethodsOf(
    const std::vector<const google::protobuf::ServiceDescriptor*>& services,
    google::protobuf::MessageFactory* generated, google::protobuf::MessageFactory* dynamic,
    const Protected* strict, const Protected* coordinator_service, const std::string& worker) {
  std::vector<Method> methods;
  for (const google::protobuf::ServiceDescriptor* s : services) {
    const bool ours = s->file()->pool() == google::protobuf::DescriptorPool::generated_pool();
    for (int i = 0; i < s->method_count(); ++i) {
      const MethodDescriptor* md = s->method(i);
      Method m;
      m.path = absl::StrCat("/", s->full_name(), "/", md->name());
      m.input = md->input_type();
      m.prototype = (ours ? generated : dynamic)->GetPrototype(m.input);
      m.client_streaming = md->client_streaming();
      m.server_streaming = md->server_streaming();
      m.protect = s->full_name() == "shardcoord.v1.Coordinator" ? coordinator_service : strict;
      auto seeds = Seeds().find(m.path);
      if (seeds != Seeds().end()) {
        for (const std::string& text : seeds->second) {
          std::vector<std::shared_ptr<const Message>> sequence;
          for (absl::string_view part : absl::StrSplit(text, '|')) {
            std::shared_ptr<Message> message(m.prototype->New());
            const std::string filled =
                absl::StrReplaceAll(part, {{"{sandbox}", strict->sandbox}, {"{worker}", worker}});
            EXPECT_TRUE(google::protobuf::TextFormat::ParseFromString(filled, message.get()))
                << m.path << ": seed " << filled;
            EXPECT_TRUE(SafeMessage(*message, *m.protect)) << m.path << ": seed " << filled;
            sequence.push_back(std::move(message));
          }
          EXPECT_TRUE(sequence.size() == 1 || m.client_streaming) << m.path << ": " << text;
          m.seeds.push_back(std::move(sequence));
        }
      }
      methods.push_back(m);
    }
  }
  const std::string first_service = services.empty() ? "x.Y" : services[0]->full_name();
  for (const std::string& path :
       {absl::StrCat("/", first_service, "/NoSuchMethod"),
        std::string("/shardcoord.v1.NoSuchService/Get"),
        std::string("/grpc.health.v1.Health/NoSuchMethod"), std::string("/x")}) {
    Method m;
    m.path = path;
    m.client_streaming = true;
    m.must_be_unimplemented = true;
    m.protect = strict;
    methods.push_back(m);
  }
  return methods;
}

// The checked tensor's mesh and tensor, made before the fuzz.
void CreateChecked(Cluster& cluster) {
  absl::StatusOr<v1::MeshInfo> mesh =
      MakeMesh(cluster.client(), kCheckedMesh, {kNumWorkers}, cluster.WorkerNames());
  ASSERT_TRUE(mesh.ok()) << mesh.status();
  absl::StatusOr<v1::TensorInfo> tensor = CreateFilled(
      cluster.client(), kCheckedTensor, kCheckedShape, DType::kF32, kCheckedMesh, "S(0)");
  ASSERT_TRUE(tensor.ok()) << tensor.status();
}

// SERVING (1) from grpc.health.v1.Health/Check for `service` at `address`.
void ExpectServing(const std::string& address, const std::string& service) {
  if (Skipped("/grpc.health.v1.Health/Check")) return;
  grpc::GenericStub stub(grpc::CreateChannel(address, grpc::InsecureChannelCredentials()));
  std::string request;
  if (!service.empty())
    request = absl::StrCat("\x0a", std::string(1, static_cast<char>(service.size())), service);
  CallResult result =
      Call(stub, "/grpc.health.v1.Health/Check", {request}, true, absl::Seconds(10));
  ASSERT_EQ(result.code, grpc::StatusCode::OK)
      << address << " '" << service << "': " << result.message;
  ASSERT_EQ(result.responses.size(), 1u);
  EXPECT_EQ(result.responses[0], std::string("\x08\x01", 2))
      << address << " '" << service << "' answered " << Preview(result.responses[0]);
}

TEST(RpcFuzzTest, EveryMethodOfBothDaemonsSurvivesMalformedAndRandomRequests) {
  const uint64_t seed = static_cast<uint64_t>(EnvInt("RPC_FUZZ_SEED", 25));
  const int calls = static_cast<int>(EnvInt("RPC_FUZZ_CALLS", 64));
  const char* tmp = std::getenv("TEST_TMPDIR");
  ASSERT_NE(tmp, nullptr) << "run under bazel test";
  Protected p;
  p.sandbox = absl::StrCat(tmp, "/rpc_fuzz");
  ASSERT_EQ(mkdir(p.sandbox.c_str(), 0755) == 0 || errno == EEXIST, true) << p.sandbox;
  for (int i = 0; i < kNumWorkers; ++i) {
    const std::string root = absl::StrCat(p.sandbox, "/", Cluster::WorkerName(i));
    ASSERT_EQ(mkdir(root.c_str(), 0755), 0) << root;
  }

  ClusterOptions options;
  options.num_workers = kNumWorkers;
  options.worker_flags = {"--http-listen=127.0.0.1:0",
                          absl::StrCat("--checkpoint-root=", p.sandbox)};
  absl::StatusOr<std::unique_ptr<Cluster>> started = Cluster::Start(options);
  ASSERT_TRUE(started.ok()) << started.status();
  Cluster& cluster = **started;
  ASSERT_NO_FATAL_FAILURE(CreateChecked(cluster));
  absl::StatusOr<v1::TensorInfo> before = cluster.client().GetTensor(kCheckedTensor);
  ASSERT_TRUE(before.ok()) << before.status();

  p.names = {kCheckedTensor, kCheckedMesh};
  p.addresses = {cluster.coordinator_address(), cluster.metrics_address()};
  for (int i = 0; i < kNumWorkers; ++i) {
    p.addresses.insert(cluster.worker_info(i).address());
    p.addresses.insert(cluster.worker_metrics_address(i));
  }
  const Protected coordinator_service = p;
  for (int i = 0; i < kNumWorkers; ++i) p.names.insert(Cluster::WorkerName(i));

  // The services: which daemon registers which (coordinator/coordinator.cc, worker/worker.cc).
  // The file that declares the services (proto/shardcoord.proto; its messages partly live in the
  // files it imports publicly).
  const google::protobuf::ServiceDescriptor* coordinator =
      google::protobuf::DescriptorPool::generated_pool()->FindServiceByName(
          "shardcoord.v1.Coordinator");
  ASSERT_NE(coordinator, nullptr);
  const google::protobuf::FileDescriptor* file = coordinator->file();
  google::protobuf::FileDescriptorSet extra_set;
  ASSERT_TRUE(google::protobuf::TextFormat::ParseFromString(kExtraProtos, &extra_set));
  google::protobuf::DescriptorPool extra_pool;
  for (const google::protobuf::FileDescriptorProto& f : extra_set.file()) {
    ASSERT_NE(extra_pool.BuildFile(f), nullptr) << f.name();
  }
  google::protobuf::DynamicMessageFactory dynamic(&extra_pool);
  std::vector<const google::protobuf::ServiceDescriptor*> coordinator_services;
  std::vector<const google::protobuf::ServiceDescriptor*> worker_services;
  for (int i = 0; i < file->service_count(); ++i) {
    const google::protobuf::ServiceDescriptor* s = file->service(i);
    if (s->name() == "Coordinator" || s->name() == "CoordinatorWorkers") {
      coordinator_services.push_back(s);
    } else if (s->name() == "Worker") {
      worker_services.push_back(s);
    } else {
      FAIL() << "service " << s->full_name()
             << " is new: say here which daemon serves it, so that it is fuzzed";
    }
  }
  ASSERT_EQ(coordinator_services.size(), 2u);
  ASSERT_EQ(worker_services.size(), 1u);
  for (const char* name : {"grpc.health.v1.Health", "grpc.reflection.v1alpha.ServerReflection",
                           "grpc.reflection.v1.ServerReflection"}) {
    const google::protobuf::ServiceDescriptor* s = extra_pool.FindServiceByName(name);
    ASSERT_NE(s, nullptr) << name;
    coordinator_services.push_back(s);
    worker_services.push_back(s);
  }
  google::protobuf::MessageFactory* generated =
      google::protobuf::MessageFactory::generated_factory();

  std::vector<Target> targets(1 + kNumWorkers);
  targets[0].label = "coordinator";
  targets[0].address = cluster.coordinator_address();
  targets[0].pid = cluster.coordinator_pid();
  targets[0].methods =
      MethodsOf(coordinator_services, generated, &dynamic, &p, &coordinator_service, "");
  for (int i = 0; i < kNumWorkers; ++i) {
    Target& t = targets[1 + i];
    t.label = Cluster::WorkerName(i);
    t.address = cluster.worker_info(i).address();
    t.pid = cluster.worker_pid(i);
    t.methods = MethodsOf(worker_services, generated, &dynamic, &p, &coordinator_service, t.label);
  }
  std::set<std::string> paths;
  for (const Target& t : targets) {
    for (const Method& m : t.methods) paths.insert(m.path);
  }
  for (const auto& [path, seeds] : Seeds()) {
    EXPECT_EQ(paths.count(path), 1u) << "a seed for " << path << ", which is not fuzzed";
  }
  if (::testing::Test::HasFailure()) return;
  std::fprintf(stderr,
               "rpc_fuzz: seed %llu, %d calls per method; %zu coordinator methods, %zu "
               "worker methods, %d workers\n",
               static_cast<unsigned long long>(seed), calls, targets[0].methods.size(),
               targets[1].methods.size(), kNumWorkers);

  // One thread per daemon, each daemon's calls in sequence, so a death is pinned on the call
  // in flight.
  std::vector<std::thread> threads;
  for (Target& t : targets) threads.emplace_back(FuzzTarget, &t, seed, calls);
  for (std::thread& t : threads) t.join();

  int64_t total = 0;
  for (const Target& t : targets) {
    total += t.requests;
    std::fprintf(stderr, "rpc_fuzz: %s (%s): %lld requests: %s\n", t.label.c_str(),
                 t.address.c_str(), static_cast<long long>(t.requests), Histogram(t.codes).c_str());
    for (const auto& [path, codes] : t.codes_by_method) {
      std::fprintf(stderr, "rpc_fuzz:   %s %s: %s (%lld request bytes, %s)\n", t.label.c_str(),
                   path.c_str(), Histogram(codes).c_str(),
                   static_cast<long long>(t.bytes_by_method.at(path)),
                   absl::FormatDuration(t.time_by_method.at(path)).c_str());
    }
  }
  for (const Target& t : targets) {
    for (const auto& [key, message] : t.odd_messages) {
      std::fprintf(stderr, "rpc_fuzz: %s %s answered %s: %s\n", t.label.c_str(), key.first.c_str(),
                   CodeName(key.second).c_str(), message.c_str());
    }
  }
  std::fprintf(stderr, "rpc_fuzz: %lld requests in all\n", static_cast<long long>(total));

  for (const Target& t : targets) {
    EXPECT_TRUE(t.death.empty()) << t.death;
    EXPECT_TRUE(Running(t.pid)) << t.label << " (pid " << t.pid << ") is not running";
    for (const std::string& f : t.failures) ADD_FAILURE() << t.label << ": " << f;
    const int64_t methods = std::count_if(t.methods.begin(), t.methods.end(),
                                          [](const Method& m) { return !Skipped(m.path); });
    EXPECT_EQ(t.requests, methods * calls) << t.label;
  }
  if (::testing::Test::HasFailure()) return;

  // Both daemons still do their work.
  for (const Target& t : targets) {
    ExpectServing(t.address, "");
    ExpectServing(t.address, "liveness");
  }
  absl::Status alive = cluster.WaitForWorkers(cluster.WorkerNames(), v1::ALIVE, absl::Seconds(30));
  EXPECT_TRUE(alive.ok()) << alive;
  absl::StatusOr<v1::TensorInfo> after = cluster.client().GetTensor(kCheckedTensor);
  ASSERT_TRUE(after.ok()) << after.status();
  EXPECT_EQ(after->version(), before->version());
  absl::Status values = DownloadAndCheck(cluster.client(), kCheckedTensor, DType::kF32,
                                         kCheckedShape, FillKind::kArange);
  EXPECT_TRUE(values.ok()) << values;
  absl::StatusOr<v1::RedistributeResponse> moved =
      cluster.client().Redistribute(RedistributeTo(kCheckedTensor, "", "R"));
  ASSERT_TRUE(moved.ok()) << moved.status();
  values = DownloadAndCheck(cluster.client(), kCheckedTensor, DType::kF32, kCheckedShape,
                            FillKind::kArange);
  EXPECT_TRUE(values.ok()) << "after a redistribute: " << values;

  // Whatever the fuzz left in flight, SIGTERM ends every daemon within its drain timeout
  // (30 s) and a margin: the workers first (they drain and leave), then the coordinator.
  auto ends = [](pid_t pid, absl::Duration timeout) {
    const absl::Time deadline = absl::Now() + timeout;
    while (Running(pid) && absl::Now() < deadline) absl::SleepFor(absl::Milliseconds(20));
    return !Running(pid);
  };
  for (int i = 0; i < kNumWorkers; ++i) {
    ASSERT_TRUE(cluster.SignalWorker(i, SIGTERM).ok());
    EXPECT_TRUE(ends(cluster.worker_pid(i), absl::Seconds(40)))
        << Cluster::WorkerName(i) << " still runs 40 s after SIGTERM";
  }
  ASSERT_EQ(kill(cluster.coordinator_pid(), SIGTERM), 0);
  EXPECT_TRUE(ends(cluster.coordinator_pid(), absl::Seconds(40)))
      << "the coordinator still runs 40 s after SIGTERM";
}

}  // namespace
}  // namespace shardcoord
