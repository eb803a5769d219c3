#include "coordinator/rpc/coordinator_service.h"

#include <algorithm>
#include <atomic>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "common/sha256.h"
#include "common/start_end_join.h"
#include "coordinator/io/tensor_streams.h"
#include "coordinator/rpc/coordinator_convert.h"
#include "coordinator/rpc/coordinator_service_internal.h"
#include "coordinator/rpc/grpc_auth.h"
#include "google/protobuf/io/coded_stream.h"
#include "google/protobuf/io/zero_copy_stream_impl_lite.h"
#include "proto/convert.h"
#include "proto/grpc_status.h"
#include "sharding/block_quant.h"
#include "sharding/field_status.h"
#include "sharding/limits.h"
#include "sharding/names.h"
#include "sharding/planner.h"

namespace shardcoord {
namespace {

// A CreateTensorRequest checked field by field; `field` prefixes the names in errors
// ("tensors[3]." in a bulk create).
absl::StatusOr<CreateTensorArgs> CreateArgsFromProto(const v1::CreateTensorRequest& req,
                                                     const std::string& field) {
  CreateTensorArgs args;
  args.name = req.name();
  if (absl::Status s = ValidateName(args.name, field + "name"); !s.ok()) return s;
  absl::StatusOr<Shape> shape = ShapeFromProto(req.shape(), field + "shape");
  if (!shape.ok()) return shape.status();
  absl::StatusOr<DType> dtype = DTypeFromProto(req.dtype(), field + "dtype");
  if (!dtype.ok()) return dtype.status();
  absl::StatusOr<Spec> spec = SpecFromProto(req.spec(), field + "spec");
  if (!spec.ok()) return spec.status();
  if (!v1::InitKind_IsValid(req.init())) {
    return absl::InvalidArgumentError(absl::StrCat(field, "init: unknown value ", req.init()));
  }
  args.shape = *std::move(shape);
  args.dtype = *dtype;
  args.spec = *std::move(spec);
  args.init = req.init();
  args.seed = req.seed();
  return args;
}

// A Copy's or CopyPair's block-copy fields (quantize, dequantize, scale) as BlockCopyArgs;
// none of them: a plain copy (scale empty). `where` prefixes the fields in errors.
template <typename Pair>
absl::StatusOr<BlockCopyArgs> BlockArgsFromProto(const Pair& req, const std::string& where) {
  BlockCopyArgs args;
  args.src = req.src();
  args.dst = req.dst();
  args.scale = req.scale();
  args.dequantize = req.dequantize();
  if (req.quantize().empty() && !args.dequantize && args.scale.empty()) return args;
  if (args.scale.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(where, "scale: empty; ",
                                                   args.dequantize ? "dequantize" : "quantize",
                                                   " needs the scale tensor"));
  }
  if (req.quantize().empty() && !args.dequantize) {
    return absl::InvalidArgumentError(
        absl::StrCat(where, "scale: '", args.scale, "' given without quantize or dequantize"));
  }
  if (!req.quantize().empty()) {
    absl::StatusOr<BlockSize> block = ParseBlockQuantization(req.quantize());
    if (!block.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, "quantize: ", block.status().message()));
    }
    args.block = *block;
  }
  if (!req.dst_offset().empty() || !req.src_offset().empty() || !req.src_shape().empty()) {
    return absl::InvalidArgumentError(absl::StrCat(
        where,
        "dst_offset/src_offset/src_shape: a block copy (quantize, dequantize) takes whole "
        "tensors; slices of fused tensors are not supported with it yet"));
  }
  return args;
}

void BlockCopyInfoToProto(const BlockCopyResult& r, v1::BlockCopyInfo* info) {
  info->set_scale_version(r.scale_version);
  info->set_blocks(r.blocks);
  info->set_cut_blocks(r.cut_blocks);
  info->set_staged_bytes(r.staged_bytes);
  info->set_bytes_moved(r.bytes_moved);
  for (const std::string& where : r.staging) info->add_staging(where);
  info->set_stage_group(r.stage_group);
  info->set_commit_group(r.commit_group);
}

// A gather's one destination rank, when given: INVALID_ARGUMENT when negative.
absl::StatusOr<std::optional<int64_t>> ToRank(bool has_to_rank, int64_t to_rank) {
  if (!has_to_rank) return std::optional<int64_t>();
  if (to_rank < 0) {
    return absl::InvalidArgumentError(absl::StrCat("to_rank = ", to_rank, " must be >= 0"));
  }
  return std::optional<int64_t>(to_rank);
}

// The SHA-256 of `m` serialized deterministically: what a request_id's retry must repeat.
std::string Fingerprint(const google::protobuf::Message& m) {
  std::string bytes;
  {
    google::protobuf::io::StringOutputStream out(&bytes);
    google::protobuf::io::CodedOutputStream coded(&out);
    coded.SetSerializationDeterministic(true);
    m.SerializeToCodedStream(&coded);
  }
  return Sha256Hex(bytes);
}

// A repeated int64 field of a slice (dst_offset, src_offset, src_shape): empty is "not given".
std::optional<Shape> OptionalShape(const google::protobuf::RepeatedField<int64_t>& dims) {
  if (dims.empty()) return std::nullopt;
  return Shape(dims.begin(), dims.end());
}

}  // namespace

namespace internal_coordinator_service {

absl::StatusOr<size_t> PageSize(int32_t requested) {
  constexpr int32_t kDefault = 1000, kMax = 10000;
  if (requested == 0) return kDefault;
  if (requested < 0 || requested > kMax) {
    return absl::InvalidArgumentError(
        absl::StrCat("page_size: ", requested, " is outside [0, ", kMax, "]"));
  }
  return static_cast<size_t>(requested);
}

grpc::ServerUnaryReactor* Done(grpc::CallbackServerContext* ctx, const absl::Status& s) {
  grpc::ServerUnaryReactor* r = ctx->DefaultReactor();
  r->Finish(ToGrpcStatus(s));
  return r;
}

}  // namespace internal_coordinator_service

using internal_coordinator_service::Done;
using internal_coordinator_service::PageSize;

LivenessFn CoordinatorService::Liveness() const {
  return [w = workers_](int64_t rank, int64_t inc) { return w->IsLive(rank, inc); };
}

// ---- Idempotent retries ------------------------------------------------------------------

template <typename Request>
grpc::ServerUnaryReactor* CoordinatorService::Replay(grpc::CallbackServerContext* ctx,
                                                     const char* method, const Request& req,
                                                     google::protobuf::Message* resp) {
  if (requests_ == nullptr || req.request_id().empty()) return nullptr;
  Request fields = req;
  fields.clear_request_id();
  absl::StatusOr<std::optional<RequestOutcome>> seen =
      requests_->Begin(req.request_id(), method, Fingerprint(fields));
  if (!seen.ok()) return Done(ctx, seen.status());
  if (!seen->has_value()) return nullptr;
  const RequestOutcome& first = **seen;
  if (first.status.ok() && !resp->ParseFromString(first.response)) {
    return Done(ctx, absl::InternalError(absl::StrCat("request_id '", req.request_id(),
                                                      "': the stored response is corrupt")));
  }
  return Done(ctx, first.status);
}

// The transfers' handlers (coordinator_service_transfers.cc) replay through the same log.
template grpc::ServerUnaryReactor* CoordinatorService::Replay<v1::CreateTransferRequest>(
    grpc::CallbackServerContext*, const char*, const v1::CreateTransferRequest&,
    google::protobuf::Message*);
template grpc::ServerUnaryReactor* CoordinatorService::Replay<v1::RunTransferRequest>(
    grpc::CallbackServerContext*, const char*, const v1::RunTransferRequest&,
    google::protobuf::Message*);
template grpc::ServerUnaryReactor* CoordinatorService::Replay<v1::DeleteTransferRequest>(
    grpc::CallbackServerContext*, const char*, const v1::DeleteTransferRequest&,
    google::protobuf::Message*);

void CoordinatorService::Reply(grpc::ServerUnaryReactor* reactor, const std::string& request_id,
                               const absl::Status& s, const google::protobuf::Message& resp) {
  if (requests_ != nullptr && !request_id.empty()) {
    // A store failure loses only the replay after a restart; the outcome itself stands.
    requests_->Finish(request_id, RequestOutcome{s, s.ok() ? resp.SerializeAsString() : ""})
        .IgnoreError();
  }
  reactor->Finish(ToGrpcStatus(s));
}

grpc::ServerUnaryReactor* CoordinatorService::Reply(grpc::CallbackServerContext* ctx,
                                                    const std::string& request_id,
                                                    const absl::Status& s,
                                                    const google::protobuf::Message& resp) {
  grpc::ServerUnaryReactor* reactor = ctx->DefaultReactor();
  Reply(reactor, request_id, s, resp);
  return reactor;
}

// ---- Workers and meshes ------------------------------------------------------------------

grpc::ServerUnaryReactor* CoordinatorService::ListWorkers(grpc::CallbackServerContext* ctx,
                                                          const v1::ListWorkersRequest* req,
                                                          v1::ListWorkersResponse* resp) {
  if (absl::Status a = Authorize(ctx, "ListWorkers"); !a.ok()) return Done(ctx, a);
  absl::StatusOr<size_t> size = PageSize(req->page_size());
  if (!size.ok()) return Done(ctx, size.status());
  // The token is the last rank of the page before.
  int64_t after = -1;
  if (!req->page_token().empty() && (!absl::SimpleAtoi(req->page_token(), &after) || after < 0)) {
    return Done(ctx, absl::InvalidArgumentError(
                         absl::StrCat("page_token: '", req->page_token(), "' is not a rank")));
  }
  for (const WorkerRecord& w : workers_->List()) {  // By rank.
    if (w.rank <= after) continue;
    if (static_cast<size_t>(resp->workers_size()) == *size) {
      resp->set_next_page_token(absl::StrCat(resp->workers(resp->workers_size() - 1).rank()));
      break;
    }
    *resp->add_workers() = WorkerInfoToProto(w);
  }
  return Done(ctx, absl::OkStatus());
}

grpc::ServerUnaryReactor* CoordinatorService::CreateMesh(grpc::CallbackServerContext* ctx,
                                                         const v1::CreateMeshRequest* req,
                                                         v1::MeshInfo* resp) {
  if (absl::Status a = Authorize(ctx, "CreateMesh"); !a.ok()) return Done(ctx, a);
  if (absl::Status s = ValidateName(req->name()); !s.ok()) return Done(ctx, s);
  if (req->shape_size() > kMaxDims) {
    return Done(
        ctx, absl::InvalidArgumentError(absl::StrCat("shape: ", req->shape_size(),
                                                     " dims, more than the limit of ", kMaxDims)));
  }
  if (grpc::ServerUnaryReactor* r = Replay(ctx, "CreateMesh", *req, resp)) return r;
  absl::StatusOr<MeshRecord> m =
      meshes_->Create(req->name(), Shape(req->shape().begin(), req->shape().end()),
                      std::vector<std::string>(req->dim_names().begin(), req->dim_names().end()),
                      std::vector<std::string>(req->workers().begin(), req->workers().end()));
  if (m.ok()) *resp = MeshInfoToProto(*m);
  return Reply(ctx, req->request_id(), m.status(), *resp);
}

grpc::ServerUnaryReactor* CoordinatorService::GetMesh(grpc::CallbackServerContext* ctx,
                                                      const v1::GetMeshRequest* req,
                                                      v1::MeshInfo* resp) {
  if (absl::Status a = Authorize(ctx, "GetMesh"); !a.ok()) return Done(ctx, a);
  absl::StatusOr<MeshRecord> m = meshes_->Get(req->name());
  if (m.ok()) *resp = MeshInfoToProto(*m);
  return Done(ctx, m.status());
}

grpc::ServerUnaryReactor* CoordinatorService::ListMeshes(grpc::CallbackServerContext* ctx,
                                                         const v1::ListMeshesRequest*,
                                                         v1::ListMeshesResponse* resp) {
  if (absl::Status a = Authorize(ctx, "ListMeshes"); !a.ok()) return Done(ctx, a);
  for (const MeshRecord& m : meshes_->List()) *resp->add_meshes() = MeshInfoToProto(m);
  return Done(ctx, absl::OkStatus());
}

grpc::ServerUnaryReactor* CoordinatorService::DeleteMesh(grpc::CallbackServerContext* ctx,
                                                         const v1::DeleteMeshRequest* req,
                                                         v1::DeleteMeshResponse* resp) {
  if (absl::Status a = Authorize(ctx, "DeleteMesh"); !a.ok()) return Done(ctx, a);
  if (grpc::ServerUnaryReactor* r = Replay(ctx, "DeleteMesh", *req, resp)) return r;
  return Reply(ctx, req->request_id(), meshes_->Delete(req->name()), *resp);
}

// ---- Tensors -----------------------------------------------------------------------------

grpc::ServerUnaryReactor* CoordinatorService::CreateTensor(grpc::CallbackServerContext* ctx,
                                                           const v1::CreateTensorRequest* req,
                                                           v1::TensorInfo* resp) {
  if (absl::Status a = Authorize(ctx, "CreateTensor"); !a.ok()) return Done(ctx, a);
  absl::StatusOr<CreateTensorArgs> args = CreateArgsFromProto(*req, "");
  if (!args.ok()) return Done(ctx, args.status());
  if (grpc::ServerUnaryReactor* r = Replay(ctx, "CreateTensor", *req, resp)) return r;
  grpc::ServerUnaryReactor* reactor = ctx->DefaultReactor();
  io_->Create(*args, [this, reactor, resp, id = req->request_id()](absl::StatusOr<TensorRecord> t) {
    if (t.ok()) *resp = TensorInfoToProto(*t, Liveness());
    Reply(reactor, id, t.status(), *resp);
  });
  return reactor;
}

grpc::ServerUnaryReactor* CoordinatorService::GetTensor(grpc::CallbackServerContext* ctx,
                                                        const v1::GetTensorRequest* req,
                                                        v1::TensorInfo* resp) {
  if (absl::Status a = Authorize(ctx, "GetTensor"); !a.ok()) return Done(ctx, a);
  absl::StatusOr<TensorRecord> t = tensors_->Get(req->name());
  if (t.ok()) *resp = TensorInfoToProto(*t, Liveness());
  return Done(ctx, t.status());
}

grpc::ServerUnaryReactor* CoordinatorService::ListTensors(grpc::CallbackServerContext* ctx,
                                                          const v1::ListTensorsRequest* req,
                                                          v1::ListTensorsResponse* resp) {
  if (absl::Status a = Authorize(ctx, "ListTensors"); !a.ok()) return Done(ctx, a);
  absl::StatusOr<size_t> size = PageSize(req->page_size());
  if (!size.ok()) return Done(ctx, size.status());
  if (!req->page_token().empty() && !absl::StartsWith(req->page_token(), req->prefix())) {
    return Done(ctx, absl::InvalidArgumentError(absl::StrCat("page_token: '", req->page_token(),
                                                             "' was not handed out for prefix '",
                                                             req->prefix(), "'")));
  }
  // The token is the last name of the page before: a page costs itself, not the table.
  TensorManager::Page page = tensors_->ListPage(req->prefix(), req->page_token(), *size);
  const LivenessFn live = Liveness();
  for (const TensorRecord& t : page.tensors) *resp->add_tensors() = TensorInfoToProto(t, live);
  if (page.more) resp->set_next_page_token(page.tensors.back().name);
  return Done(ctx, absl::OkStatus());
}

grpc::ServerUnaryReactor* CoordinatorService::CreateTensors(grpc::CallbackServerContext* ctx,
                                                            const v1::CreateTensorsRequest* req,
                                                            v1::CreateTensorsResponse* resp) {
  if (absl::Status a = Authorize(ctx, "CreateTensors"); !a.ok()) return Done(ctx, a);
  if (static_cast<size_t>(req->tensors_size()) > TensorIo::kMaxBulkTensors) {
    return Done(ctx, absl::InvalidArgumentError(absl::StrCat("tensors: ", req->tensors_size(),
                                                             " members, more than the limit of ",
                                                             TensorIo::kMaxBulkTensors)));
  }
  std::vector<CreateTensorArgs> all;
  all.reserve(req->tensors_size());
  for (int i = 0; i < req->tensors_size(); ++i) {
    absl::StatusOr<CreateTensorArgs> args =
        CreateArgsFromProto(req->tensors(i), absl::StrCat("tensors[", i, "]."));
    if (!args.ok()) return Done(ctx, args.status());
    all.push_back(*std::move(args));
  }
  if (grpc::ServerUnaryReactor* r = Replay(ctx, "CreateTensors", *req, resp)) return r;
  grpc::ServerUnaryReactor* reactor = ctx->DefaultReactor();
  io_->CreateMany(std::move(all), [this, reactor, resp, id = req->request_id()](
                                      absl::StatusOr<TensorIo::CreatedMany> made) {
    if (made.ok()) {
      resp->set_created(made->created);
      resp->set_bytes(made->bytes);
    }
    Reply(reactor, id, made.status(), *resp);
  });
  return reactor;
}

grpc::ServerUnaryReactor* CoordinatorService::DeleteTensors(grpc::CallbackServerContext* ctx,
                                                            const v1::DeleteTensorsRequest* req,
                                                            v1::DeleteTensorsResponse* resp) {
  if (absl::Status a = Authorize(ctx, "DeleteTensors"); !a.ok()) return Done(ctx, a);
  if (grpc::ServerUnaryReactor* r = Replay(ctx, "DeleteTensors", *req, resp)) return r;
  absl::StatusOr<int64_t> deleted = io_->DeleteMany(
      std::vector<std::string>(req->names().begin(), req->names().end()), req->prefix());
  if (deleted.ok()) resp->set_deleted(*deleted);
  return Reply(ctx, req->request_id(), deleted.status(), *resp);
}

grpc::ServerUnaryReactor* CoordinatorService::DeleteTensor(grpc::CallbackServerContext* ctx,
                                                           const v1::DeleteTensorRequest* req,
                                                           v1::DeleteTensorResponse* resp) {
  if (absl::Status a = Authorize(ctx, "DeleteTensor"); !a.ok()) return Done(ctx, a);
  if (grpc::ServerUnaryReactor* r = Replay(ctx, "DeleteTensor", *req, resp)) return r;
  return Reply(ctx, req->request_id(), io_->Delete(req->name()), *resp);
}

// ---- Plans -------------------------------------------------------------------------------

grpc::ServerUnaryReactor* CoordinatorService::RunPlan(
    grpc::CallbackServerContext* ctx, bool wait, const std::string& request_id,
    const google::protobuf::Message* resp, v1::Plan* resp_plan, v1::PlanProgress* resp_progress,
    const std::function<absl::StatusOr<StartedPlan>(PlanManager::DoneCallback)>& start) {
  grpc::ServerUnaryReactor* reactor = ctx->DefaultReactor();
  auto reply = [this, reactor, request_id, resp](const absl::Status& s) {
    Reply(reactor, request_id, s, *resp);
  };
  absl::StatusOr<std::function<void()>> slot = TakePlanSlot(ctx);
  if (!slot.ok()) {
    reply(slot.status());
    return reactor;
  }
  // Given back once, when the plan ends (or at once if it does not start).
  auto given = std::make_shared<std::atomic<bool>>(false);
  auto give_back = [given, release = *std::move(slot)] {
    if (!given->exchange(true)) release();
  };
  if (!wait) {
    absl::StatusOr<StartedPlan> started =
        start([give_back](const absl::Status&, const PlanProgress&) { give_back(); });
    if (!started.ok()) give_back();
    if (started.ok()) {
      *resp_plan = PlanToProto(*started->plan, started->id, started->tensor);
      *resp_progress = PlanProgressToProto(started->progress);
    }
    reply(started.status());
    return reactor;
  }
  // The plan may end (inline, or on another thread) before start() returns: its end waits
  // until the started plan is in the response.
  auto join = std::make_shared<StartEndJoin<std::pair<absl::Status, PlanProgress>>>(
      [reply, resp_progress](std::pair<absl::Status, PlanProgress> end) {
        *resp_progress = PlanProgressToProto(end.second);
        reply(end.first);
      });
  absl::StatusOr<StartedPlan> started =
      start([join, give_back](const absl::Status& s, const PlanProgress& p) {
        give_back();
        join->Ended({s, p});
      });
  if (!started.ok()) {
    give_back();
    reply(started.status());
    return reactor;
  }
  *resp_plan = PlanToProto(*started->plan, started->id, started->tensor);
  join->Started();
  return reactor;
}

grpc::ServerUnaryReactor* CoordinatorService::Redistribute(grpc::CallbackServerContext* ctx,
                                                           const v1::RedistributeRequest* req,
                                                           v1::RedistributeResponse* resp) {
  if (absl::Status a = Authorize(ctx, "Redistribute"); !a.ok()) return Done(ctx, a);
  if (req->tensor().empty()) return Done(ctx, absl::InvalidArgumentError("tensor: empty"));
  absl::StatusOr<Spec> spec = SpecFromProto(req->target(), "target");
  if (!spec.ok()) return Done(ctx, spec.status());
  if (grpc::ServerUnaryReactor* r = Replay(ctx, "Redistribute", *req, resp)) return r;
  return RunPlan(ctx, req->wait(), req->request_id(), resp, resp->mutable_plan(),
                 resp->mutable_progress(), [&](PlanManager::DoneCallback done) {
                   return plans_->Redistribute(req->tensor(), *spec, std::move(done));
                 });
}

grpc::ServerUnaryReactor* CoordinatorService::Gather(grpc::CallbackServerContext* ctx,
                                                     const v1::GatherRequest* req,
                                                     v1::RedistributeResponse* resp) {
  if (absl::Status a = Authorize(ctx, "Gather"); !a.ok()) return Done(ctx, a);
  if (req->tensor().empty()) return Done(ctx, absl::InvalidArgumentError("tensor: empty"));
  absl::StatusOr<std::optional<int64_t>> to_rank = ToRank(req->has_to_rank(), req->to_rank());
  if (!to_rank.ok()) return Done(ctx, to_rank.status());
  if (grpc::ServerUnaryReactor* r = Replay(ctx, "Gather", *req, resp)) return r;
  return RunPlan(ctx, req->wait(), req->request_id(), resp, resp->mutable_plan(),
                 resp->mutable_progress(), [&](PlanManager::DoneCallback done) {
                   return plans_->Gather(req->tensor(), req->mesh(), *to_rank, std::move(done));
                 });
}

absl::StatusOr<StartedGroup> CoordinatorService::StartSliced(
    const std::vector<SliceCopyMember>& members, PlanManager::GroupDoneCallback done) {
  if (slices_ == nullptr) {
    return absl::UnimplementedError(
        "copies with slices (dst_offset, src_offset) are not served here");
  }
  return slices_->Start(members, "copies", std::move(done));
}

grpc::ServerUnaryReactor* CoordinatorService::Copy(grpc::CallbackServerContext* ctx,
                                                   const v1::CopyRequest* req,
                                                   v1::CopyResponse* resp) {
  if (absl::Status a = Authorize(ctx, "Copy"); !a.ok()) return Done(ctx, a);
  if (req->src().empty()) return Done(ctx, absl::InvalidArgumentError("src: empty"));
  if (req->dst().empty()) return Done(ctx, absl::InvalidArgumentError("dst: empty"));
  absl::StatusOr<BlockCopyArgs> block = BlockArgsFromProto(*req, "");
  if (!block.ok()) return Done(ctx, block.status());
  if (!block->plain()) return BlockCopyCall(ctx, *block, req, resp);
  if (grpc::ServerUnaryReactor* r = Replay(ctx, "Copy", *req, resp)) return r;
  SliceCopyMember sliced{req->src(), req->dst(), OptionalShape(req->dst_offset()),
                         OptionalShape(req->src_offset()), OptionalShape(req->src_shape())};
  if (sliced.sliced()) {
    // A CopyGroup of one member (errors name "copies[0]"); no plan runs on the workers.
    return RunGroup(
        ctx, req->wait(), req->request_id(), resp,
        [&](PlanManager::GroupDoneCallback done) { return StartSliced({sliced}, std::move(done)); },
        [resp](const StartedGroup& started) {
          resp->set_dst_version(started.members[0].target_version);
          *resp->mutable_progress() = PlanProgressToProto(started.members[0].progress);
          // No plan runs on the workers; its summary says what the slice copy moves.
          resp->mutable_plan()->set_id(started.id);
          resp->mutable_plan()->set_tensor(started.members[0].tensor);
          resp->mutable_plan()->set_bytes_moved(started.bytes_moved);
        },
        [resp](const GroupProgress& p) {
          if (!p.members.empty()) *resp->mutable_progress() = PlanProgressToProto(p.members[0]);
        });
  }
  return RunPlan(ctx, req->wait(), req->request_id(), resp, resp->mutable_plan(),
                 resp->mutable_progress(), [&](PlanManager::DoneCallback done) {
                   absl::StatusOr<StartedPlan> started =
                       plans_->Copy(req->src(), req->dst(), std::move(done));
                   // Before RunPlan looks at the result, so it is set before a waiting call
                   // finishes.
                   if (started.ok()) resp->set_dst_version(started->target_version);
                   return started;
                 });
}

grpc::ServerUnaryReactor* CoordinatorService::BlockCopyCall(grpc::CallbackServerContext* ctx,
                                                            const BlockCopyArgs& args,
                                                            const v1::CopyRequest* req,
                                                            v1::CopyResponse* resp) {
  if (block_copy_ == nullptr) {
    return Done(ctx, absl::UnimplementedError("block copies are not served here"));
  }
  if (grpc::ServerUnaryReactor* r = Replay(ctx, "Copy", *req, resp)) return r;
  grpc::ServerUnaryReactor* reactor = ctx->DefaultReactor();
  const std::string request_id = req->request_id();
  auto reply = [this, reactor, request_id, resp](const absl::Status& s) {
    Reply(reactor, request_id, s, *resp);
  };
  // The copy may end before Start returns; a refusal never calls `done`.
  absl::Status started = block_copy_->Start(args, [reply, resp](absl::StatusOr<BlockCopyResult> r) {
    if (!r.ok()) return reply(r.status());
    resp->set_dst_version(r->dst_version);
    BlockCopyInfoToProto(*r, resp->mutable_block_copy());
    reply(absl::OkStatus());
  });
  if (!started.ok()) reply(started);
  return reactor;
}

grpc::ServerUnaryReactor* CoordinatorService::BlockCopyGroupCall(
    grpc::CallbackServerContext* ctx, const std::vector<BlockCopyArgs>& members,
    const v1::CopyGroupRequest* req, v1::CopyGroupResponse* resp) {
  if (block_copy_ == nullptr) {
    return Done(ctx, absl::UnimplementedError("block copies are not served here"));
  }
  if (grpc::ServerUnaryReactor* r = Replay(ctx, "CopyGroup", *req, resp)) return r;
  grpc::ServerUnaryReactor* reactor = ctx->DefaultReactor();
  const std::string request_id = req->request_id();
  auto reply = [this, reactor, request_id, resp](const absl::Status& s) {
    Reply(reactor, request_id, s, *resp);
  };
  absl::Status started =
      block_copy_->StartGroup(members, [reply, resp, members](absl::StatusOr<BlockGroupResult> r) {
        if (!r.ok()) return reply(r.status());
        resp->set_group_id(r->commit_group);
        resp->set_stage_group(r->stage_group);
        resp->set_state(v1::COMMITTED);
        resp->set_bytes_moved(r->bytes_moved);
        resp->set_staged_bytes(r->staged_bytes);
        resp->set_lower_bound_bytes(r->lower_bound_bytes);
        resp->set_seconds(r->seconds);
        for (size_t i = 0; i < members.size(); ++i) {
          v1::CopyGroupMember* out = resp->add_members();
          out->set_src(members[i].src);
          out->set_dst(members[i].dst);
          out->set_dst_version(r->members[i].dst_version);
          if (i < r->progress.size())
            *out->mutable_progress() = PlanProgressToProto(r->progress[i]);
          const StartedPlan& commit = r->commits[i];
          *out->mutable_plan() = PlanSummaryToProto(*commit.plan, commit.id, commit.tensor);
          if (!members[i].plain()) BlockCopyInfoToProto(r->members[i], out->mutable_block_copy());
        }
        reply(absl::OkStatus());
      });
  if (!started.ok()) reply(started);
  return reactor;
}

grpc::ServerUnaryReactor* CoordinatorService::RunGroup(
    grpc::CallbackServerContext* ctx, bool wait, const std::string& request_id,
    const google::protobuf::Message* resp,
    const std::function<absl::StatusOr<StartedGroup>(PlanManager::GroupDoneCallback)>& start,
    const std::function<void(const StartedGroup&)>& on_started,
    std::function<void(const GroupProgress&)> on_committed) {
  grpc::ServerUnaryReactor* reactor = ctx->DefaultReactor();
  auto reply = [this, reactor, request_id, resp](const absl::Status& s) {
    Reply(reactor, request_id, s, *resp);
  };
  // As RunPlan: the group may end before start() returns; its end waits for on_started.
  auto join = std::make_shared<StartEndJoin<std::pair<absl::Status, GroupProgress>>>(
      [reply, on_committed](std::pair<absl::Status, GroupProgress> end) {
        if (end.first.ok()) on_committed(end.second);
        reply(end.first);
      });
  absl::StatusOr<std::function<void()>> slot = TakePlanSlot(ctx);
  if (!slot.ok()) {
    reply(slot.status());
    return reactor;
  }
  // A group holds one running-plan slot, given back once when it ends.
  auto given = std::make_shared<std::atomic<bool>>(false);
  auto give_back = [given, release = *std::move(slot)] {
    if (!given->exchange(true)) release();
  };
  PlanManager::GroupDoneCallback done = [give_back](const absl::Status&, const GroupProgress&) {
    give_back();
  };
  if (wait) {
    done = [join, give_back](const absl::Status& s, const GroupProgress& p) {
      give_back();
      join->Ended({s, p});
    };
  }
  absl::StatusOr<StartedGroup> started = start(std::move(done));
  if (!started.ok()) {
    give_back();
    reply(started.status());
    return reactor;
  }
  on_started(*started);
  if (!wait) {
    reply(absl::OkStatus());
    return reactor;
  }
  join->Started();
  return reactor;
}

grpc::ServerUnaryReactor* CoordinatorService::CopyGroup(grpc::CallbackServerContext* ctx,
                                                        const v1::CopyGroupRequest* req,
                                                        v1::CopyGroupResponse* resp) {
  if (absl::Status a = Authorize(ctx, "CopyGroup"); !a.ok()) return Done(ctx, a);
  std::vector<CopyMember> copies;
  std::vector<SliceCopyMember> sliced;
  std::vector<BlockCopyArgs> blocks;
  bool any_block = false;
  for (const v1::CopyPair& c : req->copies()) {
    absl::StatusOr<BlockCopyArgs> block =
        BlockArgsFromProto(c, absl::StrCat("copies[", blocks.size(), "]."));
    if (!block.ok()) return Done(ctx, block.status());
    any_block = any_block || !block->plain();
    blocks.push_back(*std::move(block));
    copies.push_back(CopyMember{c.src(), c.dst()});
    sliced.push_back(SliceCopyMember{c.src(), c.dst(), OptionalShape(c.dst_offset()),
                                     OptionalShape(c.src_offset()), OptionalShape(c.src_shape())});
  }
  if (any_block) {
    if (AnySliced(sliced)) {
      for (size_t i = 0; i < sliced.size(); ++i) {
        if (!sliced[i].sliced()) continue;
        return Done(ctx, absl::InvalidArgumentError(absl::StrCat(
                             "copies[", i,
                             "].dst_offset: a group with block copies (quantize, dequantize) "
                             "takes whole tensors; run the slices as a group of their own")));
      }
    }
    return BlockCopyGroupCall(ctx, blocks, req, resp);
  }
  if (grpc::ServerUnaryReactor* r = Replay(ctx, "CopyGroup", *req, resp)) return r;
  if (AnySliced(sliced)) {
    return RunGroup(
        ctx, req->wait(), req->request_id(), resp,
        [&](PlanManager::GroupDoneCallback done) { return StartSliced(sliced, std::move(done)); },
        [&](const StartedGroup& started) {
          resp->set_group_id(started.id);
          resp->set_state(v1::PENDING);
          resp->set_bytes_moved(started.bytes_moved);
          for (size_t i = 0; i < started.members.size(); ++i) {
            v1::CopyGroupMember* out = resp->add_members();
            out->set_src(copies[i].src);
            out->set_dst(copies[i].dst);
            out->set_dst_version(started.members[i].target_version);
            *out->mutable_progress() = PlanProgressToProto(started.members[i].progress);
          }
        },
        [resp](const GroupProgress& p) {
          resp->set_state(static_cast<v1::PlanState>(p.state));
          resp->set_seconds(p.seconds);
          for (size_t i = 0; i < p.members.size() && static_cast<int>(i) < resp->members_size();
               ++i) {
            *resp->mutable_members(i)->mutable_progress() = PlanProgressToProto(p.members[i]);
          }
        });
  }
  return RunGroup(
      ctx, req->wait(), req->request_id(), resp,
      [&](PlanManager::GroupDoneCallback done) {
        return plans_->CopyGroup(copies, std::move(done));
      },
      [&](const StartedGroup& started) {
        resp->set_group_id(started.id);
        resp->set_state(v1::PENDING);
        resp->set_bytes_moved(started.bytes_moved);
        resp->set_lower_bound_bytes(started.lower_bound_bytes);
        resp->set_buckets(started.buckets);
        resp->set_bucket_bytes(started.bucket_bytes);
        for (size_t i = 0; i < started.members.size(); ++i) {
          const StartedPlan& m = started.members[i];
          v1::CopyGroupMember* out = resp->add_members();
          out->set_src(copies[i].src);
          out->set_dst(copies[i].dst);
          out->set_dst_version(m.target_version);
          *out->mutable_progress() = PlanProgressToProto(m.progress);
          *out->mutable_plan() = PlanSummaryToProto(*m.plan, m.id, m.tensor);
        }
      },
      [resp](const GroupProgress& p) {
        resp->set_state(static_cast<v1::PlanState>(p.state));
        resp->set_seconds(p.seconds);
        for (size_t i = 0; i < p.members.size() && static_cast<int>(i) < resp->members_size();
             ++i) {
          *resp->mutable_members(i)->mutable_progress() = PlanProgressToProto(p.members[i]);
        }
      });
}

namespace {

// RedistributeGroupResponse from a started group (RedistributeGroup, GatherGroup).
void FillGroupResponse(const StartedGroup& started, v1::RedistributeGroupResponse* resp) {
  resp->set_group_id(started.id);
  resp->set_state(v1::PENDING);
  resp->set_bytes_moved(started.bytes_moved);
  resp->set_lower_bound_bytes(started.lower_bound_bytes);
  resp->set_buckets(started.buckets);
  resp->set_bucket_bytes(started.bucket_bytes);
  for (const StartedPlan& m : started.members) {
    v1::RedistributeGroupMember* out = resp->add_members();
    out->set_tensor(m.tensor);
    out->set_version(m.target_version);
    *out->mutable_progress() = PlanProgressToProto(m.progress);
    *out->mutable_plan() = PlanSummaryToProto(*m.plan, m.id, m.tensor);
  }
}

void FinishGroupResponse(const GroupProgress& p, v1::RedistributeGroupResponse* resp) {
  resp->set_state(static_cast<v1::PlanState>(p.state));
  resp->set_seconds(p.seconds);
  for (size_t i = 0; i < p.members.size() && static_cast<int>(i) < resp->members_size(); ++i) {
    *resp->mutable_members(i)->mutable_progress() = PlanProgressToProto(p.members[i]);
  }
}

}  // namespace

grpc::ServerUnaryReactor* CoordinatorService::RedistributeGroup(
    grpc::CallbackServerContext* ctx, const v1::RedistributeGroupRequest* req,
    v1::RedistributeGroupResponse* resp) {
  if (absl::Status a = Authorize(ctx, "RedistributeGroup"); !a.ok()) return Done(ctx, a);
  std::vector<RedistributeMember> members;
  for (int i = 0; i < req->redistributes_size(); ++i) {
    const v1::RedistributeItem& item = req->redistributes(i);
    absl::StatusOr<Spec> spec =
        SpecFromProto(item.target(), absl::StrCat("redistributes[", i, "].target"));
    if (!spec.ok()) return Done(ctx, spec.status());
    members.push_back(RedistributeMember{item.tensor(), *std::move(spec)});
  }
  if (grpc::ServerUnaryReactor* r = Replay(ctx, "RedistributeGroup", *req, resp)) return r;
  return RunGroup(
      ctx, req->wait(), req->request_id(), resp,
      [&](PlanManager::GroupDoneCallback done) {
        return plans_->RedistributeGroup(members, std::move(done));
      },
      [resp](const StartedGroup& started) { FillGroupResponse(started, resp); },
      [resp](const GroupProgress& p) { FinishGroupResponse(p, resp); });
}

grpc::ServerUnaryReactor* CoordinatorService::GatherGroup(grpc::CallbackServerContext* ctx,
                                                          const v1::GatherGroupRequest* req,
                                                          v1::RedistributeGroupResponse* resp) {
  if (absl::Status a = Authorize(ctx, "GatherGroup"); !a.ok()) return Done(ctx, a);
  absl::StatusOr<std::optional<int64_t>> to_rank = ToRank(req->has_to_rank(), req->to_rank());
  if (!to_rank.ok()) return Done(ctx, to_rank.status());
  std::vector<std::string> tensors(req->tensors().begin(), req->tensors().end());
  if (grpc::ServerUnaryReactor* r = Replay(ctx, "GatherGroup", *req, resp)) return r;
  return RunGroup(
      ctx, req->wait(), req->request_id(), resp,
      [&](PlanManager::GroupDoneCallback done) {
        return plans_->GatherGroup(tensors, req->mesh(), *to_rank, std::move(done));
      },
      [resp](const StartedGroup& started) { FillGroupResponse(started, resp); },
      [resp](const GroupProgress& p) { FinishGroupResponse(p, resp); });
}

grpc::ServerUnaryReactor* CoordinatorService::PlanRedistribute(grpc::CallbackServerContext* ctx,
                                                               const v1::PlanRequest* req,
                                                               v1::Plan* resp) {
  if (absl::Status a = Authorize(ctx, "PlanRedistribute"); !a.ok()) return Done(ctx, a);
  absl::StatusOr<Spec> spec = SpecFromProto(req->target(), "target");
  if (!spec.ok()) return Done(ctx, spec.status());
  absl::StatusOr<StartedPlan> plan = plans_->DryRun(req->tensor(), *spec);
  if (plan.ok()) {
    *resp = PlanToProto(*plan->plan, "", plan->tensor);
    resp->set_explain(ExplainPlan(*plan->plan));
  }
  return Done(ctx, plan.status());
}

// ---- Data --------------------------------------------------------------------------------

// Moves messages between the call and an UploadSession (coordinator/io/tensor_streams.h),
// which holds the upload's logic. With `requests` (null: none), a header with a request_id
// seen before answers the first outcome (replayed) without reading the data, and the outcome
// of an upload that acts is kept before the client hears it.
class UploadReactor : public grpc::ServerReadReactor<v1::TensorData>,
                      private UploadSession::Transport {
 public:
  UploadReactor(TensorIo* io, v1::UploadResponse* resp, LivenessFn live, Counter* bytes,
                RequestLog* requests)
      : resp_(resp),
        live_(std::move(live)),
        bytes_(bytes),
        requests_(requests),
        session_(io, this) {
    StartRead(&message_);
  }

  void OnReadDone(bool ok) override {
    if (!ok) return session_.OnEnd();
    if (bytes_ != nullptr) bytes_->Increment(static_cast<double>(message_.data().size()));
    if (first_) {
      first_ = false;
      if (Replayed()) return;
    }
    session_.OnMessage(std::move(message_));
  }

  void OnDone() override {
    // Every session ends through End; should one not, its id must not stay "running".
    if (!request_id_.empty()) {
      requests_->Finish(request_id_, RequestOutcome{absl::CancelledError("upload ended"), ""})
          .IgnoreError();
    }
    delete this;
  }

 private:
  // The first message: true when it was answered from the request log (the call is ended).
  bool Replayed() {
    if (requests_ == nullptr || !message_.has_header() || message_.header().request_id().empty()) {
      return false;
    }
    v1::TensorHeader fields = message_.header();
    fields.clear_request_id();
    absl::StatusOr<std::optional<RequestOutcome>> seen =
        requests_->Begin(message_.header().request_id(), "Upload", Fingerprint(fields));
    if (seen.ok() && !seen->has_value()) {
      request_id_ = message_.header().request_id();  // Acts now; End records the outcome.
      return false;
    }
    absl::Status s = seen.status();
    if (seen.ok()) {
      s = (*seen)->status;
      if (s.ok()) {
        if (resp_->ParseFromString((*seen)->response)) {
          resp_->set_replayed(true);
        } else {
          s = absl::InternalError(absl::StrCat("request_id '", message_.header().request_id(),
                                               "': the stored response is corrupt"));
        }
      }
    }
    Finish(ToGrpcStatus(s));
    return true;
  }

  void ReadNext() override {
    message_.Clear();
    StartRead(&message_);
  }

  void End(absl::StatusOr<TensorRecord> t) override {
    if (t.ok()) *resp_->mutable_tensor() = TensorInfoToProto(*t, live_);
    if (!request_id_.empty()) {
      // Kept before the client hears it; a store failure loses only the replay after a
      // restart.
      requests_
          ->Finish(request_id_,
                   RequestOutcome{t.status(), t.ok() ? resp_->SerializeAsString() : ""})
          .IgnoreError();
      request_id_.clear();
    }
    Finish(ToGrpcStatus(t.status()));
  }

  v1::UploadResponse* const resp_;
  const LivenessFn live_;
  Counter* const bytes_;
  RequestLog* const requests_;
  bool first_ = true;       // Only reactor callbacks touch these, one at a time.
  std::string request_id_;  // Begun in the request log, not finished yet.
  v1::TensorData message_;  // The read in flight.
  UploadSession session_;
};

grpc::ServerReadReactor<v1::TensorData>* CoordinatorService::Upload(
    grpc::CallbackServerContext* ctx, v1::UploadResponse* resp) {
  if (absl::Status a = Authorize(ctx, "Upload"); !a.ok()) {
    return new RefusedStream<grpc::ServerReadReactor<v1::TensorData>>(a);
  }
  return new UploadReactor(io_, resp, Liveness(), upload_bytes_, requests_);
}

// Moves messages between the call and a DownloadSession (coordinator/io/tensor_streams.h),
// which holds the download's logic and ends the call only when nothing is in flight.
class DownloadReactor : public grpc::ServerWriteReactor<v1::TensorData>,
                        private DownloadSession::Transport {
 public:
  DownloadReactor(TensorIo* io, const std::string& name, int64_t slice, Counter* bytes)
      : bytes_(bytes), session_(io, this, slice) {
    session_.Start(name);
  }

  void OnWriteDone(bool ok) override { session_.OnWriteDone(ok); }
  void OnCancel() override { session_.OnCancel(); }
  void OnDone() override { delete this; }

 private:
  // One write at a time (the session's write claim), so message_ is free here.
  void Send(v1::TensorData message) override {
    message_ = std::move(message);
    if (bytes_ != nullptr) bytes_->Increment(static_cast<double>(message_.data().size()));
    StartWrite(&message_);
  }

  void End(absl::Status s) override { Finish(ToGrpcStatus(s)); }

  v1::TensorData message_;  // The write in flight.
  Counter* const bytes_;
  DownloadSession session_;
};

grpc::ServerWriteReactor<v1::TensorData>* CoordinatorService::Download(
    grpc::CallbackServerContext* ctx, const v1::DownloadRequest* req) {
  if (absl::Status a = Authorize(ctx, "Download"); !a.ok()) {
    return new RefusedStream<grpc::ServerWriteReactor<v1::TensorData>>(a);
  }
  return new DownloadReactor(io_, req->name(), max_message_bytes_, download_bytes_);
}

absl::Status CoordinatorService::Authorize(grpc::CallbackServerContext* ctx, absl::string_view rpc,
                                           std::string* caller) const {
  return AuthorizeCall(auth_, ctx, FullMethodName(v1::Coordinator::service_full_name(), rpc),
                       caller);
}

absl::StatusOr<std::function<void()>> CoordinatorService::TakePlanSlot(
    grpc::CallbackServerContext* ctx) {
  if (running_plans_ == nullptr) return std::function<void()>([] {});
  std::string caller = auth_ == nullptr ? PeerHost(ctx->peer()) : "";
  if (auth_ != nullptr) {
    // Authorized already: this only reads the token's name.
    AuthorizeCall(auth_, ctx, FullMethodName(v1::Coordinator::service_full_name(), "Copy"), &caller)
        .IgnoreError();
  }
  if (absl::Status s = running_plans_->Acquire(caller); !s.ok()) return s;
  return std::function<void()>([quota = running_plans_, caller] { quota->Release(caller); });
}

// ---- Checkpoints ---------------------------------------------------------------------------

namespace {

absl::Status NoCheckpoints() {
  return absl::UnimplementedError("this coordinator has no checkpoint support");
}

// A spec when one is given (into loads need none).
absl::StatusOr<std::optional<Spec>> OptionalSpec(const v1::ShardingSpec& spec,
                                                 const std::string& field) {
  if (spec.ByteSizeLong() == 0) return std::optional<Spec>();
  absl::StatusOr<Spec> s = SpecFromProto(spec, field);
  if (!s.ok()) return s.status();
  return std::optional<Spec>(*std::move(s));
}

}  // namespace

grpc::ServerUnaryReactor* CoordinatorService::SaveCheckpoint(grpc::CallbackServerContext* ctx,
                                                             const v1::SaveCheckpointRequest* req,
                                                             v1::SaveCheckpointResponse* resp) {
  if (absl::Status a = Authorize(ctx, "SaveCheckpoint"); !a.ok()) return Done(ctx, a);
  if (checkpoints_ == nullptr) return Done(ctx, NoCheckpoints());
  if (grpc::ServerUnaryReactor* r = Replay(ctx, "SaveCheckpoint", *req, resp)) return r;
  SaveCheckpointArgs args;
  args.id = req->request_id();
  args.dir = req->dir();
  args.tensors.assign(req->tensors().begin(), req->tensors().end());
  args.all = req->all();
  args.overwrite = req->overwrite();
  grpc::ServerUnaryReactor* reactor = ctx->DefaultReactor();
  checkpoints_->Save(std::move(args), [this, reactor, resp, id = req->request_id()](
                                          absl::StatusOr<v1::SaveCheckpointResponse> r) {
    if (r.ok()) *resp = *std::move(r);
    Reply(reactor, id, r.status(), *resp);
  });
  return reactor;
}

grpc::ServerUnaryReactor* CoordinatorService::LoadCheckpoint(grpc::CallbackServerContext* ctx,
                                                             const v1::LoadCheckpointRequest* req,
                                                             v1::LoadCheckpointResponse* resp) {
  if (absl::Status a = Authorize(ctx, "LoadCheckpoint"); !a.ok()) return Done(ctx, a);
  if (checkpoints_ == nullptr) return Done(ctx, NoCheckpoints());
  LoadCheckpointArgs args;
  args.id = req->request_id();
  args.dir = req->dir();
  args.all = req->all();
  args.prefix = req->prefix();
  args.into = req->into();
  if (req->dtype() != v1::DTYPE_UNSPECIFIED) {
    absl::StatusOr<DType> dtype = DTypeFromProto(req->dtype(), "dtype");
    if (!dtype.ok()) return Done(ctx, dtype.status());
    args.dtype = *dtype;
  }
  args.dequantize = req->dequantize();
  if (!req->block().empty()) {
    if (!req->dequantize()) {
      return Done(ctx, absl::InvalidArgumentError(absl::StrCat(
                           "block: '", req->block(), "' is only for a load with dequantize")));
    }
    absl::StatusOr<BlockSize> block = ParseBlockQuantization(req->block());
    if (!block.ok()) return Done(ctx, field_status::Prefixed("block: ", block.status()));
    args.block = *block;
  }
  absl::StatusOr<std::optional<Spec>> spec = OptionalSpec(req->spec(), "spec");
  if (!spec.ok()) return Done(ctx, spec.status());
  args.spec = *std::move(spec);
  for (int i = 0; i < req->targets_size(); ++i) {
    const v1::LoadTarget& t = req->targets(i);
    absl::StatusOr<std::optional<Spec>> ts =
        OptionalSpec(t.target(), absl::StrCat("targets[", i, "].target"));
    if (!ts.ok()) return Done(ctx, ts.status());
    args.targets.push_back(LoadTargetArgs{t.tensor(), t.name(), *std::move(ts)});
  }
  if (grpc::ServerUnaryReactor* r = Replay(ctx, "LoadCheckpoint", *req, resp)) return r;
  grpc::ServerUnaryReactor* reactor = ctx->DefaultReactor();
  checkpoints_->Load(std::move(args), [this, reactor, resp, id = req->request_id()](
                                          absl::StatusOr<v1::LoadCheckpointResponse> r) {
    if (r.ok()) *resp = *std::move(r);
    Reply(reactor, id, r.status(), *resp);
  });
  return reactor;
}

grpc::ServerUnaryReactor* CoordinatorService::InspectCheckpoint(
    grpc::CallbackServerContext* ctx, const v1::InspectCheckpointRequest* req,
    v1::InspectCheckpointResponse* resp) {
  if (absl::Status a = Authorize(ctx, "InspectCheckpoint"); !a.ok()) return Done(ctx, a);
  if (checkpoints_ == nullptr) return Done(ctx, NoCheckpoints());
  grpc::ServerUnaryReactor* reactor = ctx->DefaultReactor();
  checkpoints_->Inspect(req->dir(),
                        [reactor, resp](absl::StatusOr<v1::InspectCheckpointResponse> r) {
                          if (r.ok()) *resp = *std::move(r);
                          reactor->Finish(ToGrpcStatus(r.status()));
                        });
  return reactor;
}

grpc::ServerUnaryReactor* CoordinatorService::GetCheckpointProgress(
    grpc::CallbackServerContext* ctx, const v1::GetCheckpointProgressRequest* req,
    v1::CheckpointProgress* resp) {
  if (absl::Status a = Authorize(ctx, "GetCheckpointProgress"); !a.ok()) return Done(ctx, a);
  if (checkpoints_ == nullptr) return Done(ctx, NoCheckpoints());
  absl::StatusOr<v1::CheckpointProgress> p = checkpoints_->Progress(req->request_id());
  if (p.ok()) *resp = *std::move(p);
  return Done(ctx, p.status());
}

}  // namespace shardcoord
