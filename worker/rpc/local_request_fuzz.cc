// Fuzzes the worker's side of the local attach protocol (what any process of the worker's uid
// may send to its socket): the input is a byte stream of length-prefixed frames, each a
// LocalRequest handed to an AttachRegistry as the socket server does (attach, attach_many,
// detach; plain memory of this very process, so every probe and copy stays inside the
// fuzzer; a process address of 1 stands for a 1 MiB buffer of it, so attaches can succeed). The
// registry must only return statuses, and once the session closes nothing it registered may be left
// in the store.

#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "proto/local_frame.h"
#include "proto/shardcoord.pb.h"
#include "worker/buffers/attach_registry.h"
#include "worker/buffers/buffer_store.h"
#include "worker/testing/attach_test_util.h"

// LLVMFuzzerInitialize: worker/testing/quiet_protobuf_fuzz_init.cc.
extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace shardcoord;
  attach_testing::FakeAttachRpc rpc;
  BufferStore buffers;
  AttachRegistry registry(&buffers, nullptr, &rpc, [] { return WorkerIdentity{"w0", 1, 0}; });
  const int64_t session = registry.OpenSession(PeerCredentials{getpid(), 0, 0});
  LocalFrameReader reader;
  reader.Append(absl::string_view(reinterpret_cast<const char*>(data), size));
  while (true) {
    absl::StatusOr<std::optional<std::string>> frame = reader.Next();
    if (!frame.ok() || !frame->has_value()) break;
    v1::LocalRequest request;
    if (!request.ParseFromString(**frame)) continue;
    if (request.has_attach()) {
      static char lendable[1 << 20];
      v1::LocalAttachRequest attach = request.attach();
      if (attach.has_process() && attach.process().address() == 1) {
        attach.mutable_process()->set_address(reinterpret_cast<uint64_t>(lendable));
        if (attach.bytes() > static_cast<int64_t>(sizeof(lendable))) continue;
      }
      registry.Attach(session, attach, -1).status().IgnoreError();
    } else if (request.has_attach_many()) {
      static char lendable_many[1 << 20];
      v1::LocalAttachManyRequest many = request.attach_many();
      bool fits = true;
      for (v1::LocalAttachRequest& a : *many.mutable_attachments()) {
        if (a.has_process() && a.process().address() == 1) {
          a.mutable_process()->set_address(reinterpret_cast<uint64_t>(lendable_many));
          fits &= a.bytes() <= static_cast<int64_t>(sizeof(lendable_many));
        }
      }
      if (fits) registry.AttachMany(session, many, {}).status().IgnoreError();
    } else if (request.has_detach()) {
      registry.Detach(session, request.detach()).IgnoreError();
    }
  }
  registry.CloseSession(session, "fuzz input done");
  if (!buffers.List().empty()) {
    std::fprintf(stderr, "local_request_fuzz: a buffer outlived its session\n");
    std::abort();
  }
  return 0;
}
