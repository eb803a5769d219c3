#ifndef SHARDCOORD_COORDINATOR_TESTING_CALL_HELPERS_H_
#define SHARDCOORD_COORDINATOR_TESTING_CALL_HELPERS_H_

#include <string>

#include "common/coordinator_addresses.h"
#include "grpcpp/grpcpp.h"
#include "proto/shardcoord.grpc.pb.h"

namespace shardcoord {

// The leader a finished call's trailing metadata names (kLeaderMetadataKey); "" when none.
inline std::string LeaderTrailer(const grpc::ClientContext& ctx) {
  auto it = ctx.GetServerTrailingMetadata().find(kLeaderMetadataKey);
  if (it == ctx.GetServerTrailingMetadata().end()) return "";
  return std::string(it->second.data(), it->second.size());
}

// An Upload of tensor `name` that sends only its header and ends: the call's status.
inline grpc::Status UploadHeaderOnly(v1::Coordinator::Stub* coordinator, grpc::ClientContext* ctx,
                                     const std::string& name) {
  v1::UploadResponse resp;
  auto writer = coordinator->Upload(ctx, &resp);
  v1::TensorData header;
  header.mutable_header()->set_name(name);
  writer->Write(header);
  writer->WritesDone();
  return writer->Finish();
}

}  // namespace shardcoord

#endif  // SHARDCOORD_COORDINATOR_TESTING_CALL_HELPERS_H_
