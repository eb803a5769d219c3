// shardcoord.v1.Coordinator's prepared transfers (issue 27): check, call TransferManager,
// translate, reply. Create and run finish their reactors from the manager's callbacks.

#include <atomic>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "coordinator/rpc/coordinator_service.h"
#include "coordinator/rpc/coordinator_service_internal.h"
#include "sharding/names.h"

namespace shardcoord {
namespace {

using internal_coordinator_service::Done;
using internal_coordinator_service::PageSize;

absl::Status NoTransfers() {
  return absl::UnimplementedError("this coordinator has no prepared transfers");
}

}  // namespace

grpc::ServerUnaryReactor* CoordinatorService::CreateTransfer(grpc::CallbackServerContext* ctx,
                                                             const v1::CreateTransferRequest* req,
                                                             v1::TransferInfo* resp) {
  if (absl::Status a = Authorize(ctx, "CreateTransfer"); !a.ok()) return Done(ctx, a);
  if (transfers_ == nullptr) return Done(ctx, NoTransfers());
  for (int i = 0; i < req->copies_size(); ++i) {
    const v1::CopyPair& c = req->copies(i);
    const char* slice = !c.dst_offset().empty()   ? "dst_offset"
                        : !c.src_offset().empty() ? "src_offset"
                        : !c.src_shape().empty()  ? "src_shape"
                                                  : nullptr;
    if (slice != nullptr) {
      return Done(ctx, absl::InvalidArgumentError(absl::StrCat(
                           "copies[", i, "].", slice,
                           ": prepared transfers do not take slices of fused tensors yet; "
                           "run it as a CopyGroup")));
    }
  }
  std::vector<TransferCopy> copies;
  copies.reserve(req->copies_size());
  for (const v1::CopyPair& c : req->copies()) {
    if (!c.quantize().empty() || c.dequantize() || !c.scale().empty()) {
      return Done(ctx, absl::InvalidArgumentError(
                           absl::StrCat("copies[", copies.size(),
                                        "].quantize: block copies (quantize, "
                                        "dequantize, scale) are not supported in transfers yet")));
    }
    copies.push_back(TransferCopy{c.src(), c.dst()});
  }
  if (grpc::ServerUnaryReactor* r = Replay(ctx, "CreateTransfer", *req, resp)) return r;
  grpc::ServerUnaryReactor* reactor = ctx->DefaultReactor();
  transfers_->Create(
      req->name(), std::move(copies),
      [this, reactor, resp, id = req->request_id()](absl::StatusOr<v1::TransferInfo> info) {
        if (info.ok()) *resp = *std::move(info);
        Reply(reactor, id, info.status(), *resp);
      });
  return reactor;
}

grpc::ServerUnaryReactor* CoordinatorService::RunTransfer(grpc::CallbackServerContext* ctx,
                                                          const v1::RunTransferRequest* req,
                                                          v1::RunTransferResponse* resp) {
  if (absl::Status a = Authorize(ctx, "RunTransfer"); !a.ok()) return Done(ctx, a);
  if (transfers_ == nullptr) return Done(ctx, NoTransfers());
  if (req->name().empty()) return Done(ctx, absl::InvalidArgumentError("name: empty"));
  if (grpc::ServerUnaryReactor* r = Replay(ctx, "RunTransfer", *req, resp)) return r;
  grpc::ServerUnaryReactor* reactor = ctx->DefaultReactor();
  const std::string id = req->request_id();
  absl::StatusOr<std::function<void()>> slot = TakePlanSlot(ctx);
  if (!slot.ok()) {
    Reply(reactor, id, slot.status(), *resp);
    return reactor;
  }
  // A run holds one running-plan slot, given back once when it ended (or did not start).
  auto given = std::make_shared<std::atomic<bool>>(false);
  auto give_back = [given, release = *std::move(slot)] {
    if (!given->exchange(true)) release();
  };
  const bool wait = req->wait();
  transfers_->Run(
      req->name(),
      [this, reactor, resp, id, wait, give_back](const absl::Status& s,
                                                 const v1::RunTransferResponse& started) {
        if (!s.ok()) give_back();
        if (!s.ok() || !wait) {
          *resp = started;
          Reply(reactor, id, s, *resp);
        }
      },
      [this, reactor, resp, id, wait, give_back](const absl::Status& s,
                                                 const v1::RunTransferResponse& ended) {
        give_back();
        if (!wait) return;
        *resp = ended;
        Reply(reactor, id, s, *resp);
      });
  return reactor;
}

grpc::ServerUnaryReactor* CoordinatorService::GetTransfer(grpc::CallbackServerContext* ctx,
                                                          const v1::GetTransferRequest* req,
                                                          v1::TransferInfo* resp) {
  if (absl::Status a = Authorize(ctx, "GetTransfer"); !a.ok()) return Done(ctx, a);
  if (transfers_ == nullptr) return Done(ctx, NoTransfers());
  absl::StatusOr<v1::TransferInfo> info = transfers_->Get(req->name(), req->copies());
  if (info.ok()) *resp = *std::move(info);
  return Done(ctx, info.status());
}

grpc::ServerUnaryReactor* CoordinatorService::ListTransfers(grpc::CallbackServerContext* ctx,
                                                            const v1::ListTransfersRequest* req,
                                                            v1::ListTransfersResponse* resp) {
  if (absl::Status a = Authorize(ctx, "ListTransfers"); !a.ok()) return Done(ctx, a);
  if (transfers_ == nullptr) return Done(ctx, NoTransfers());
  absl::StatusOr<size_t> size = PageSize(req->page_size());
  if (!size.ok()) return Done(ctx, size.status());
  // The token is the last name of the page before.
  if (!req->page_token().empty()) {
    if (absl::Status s = ValidateName(req->page_token(), "page_token"); !s.ok()) {
      return Done(ctx, absl::InvalidArgumentError(absl::StrCat("page_token: '", req->page_token(),
                                                               "' is not a transfer name")));
    }
  }
  TransferManager::Page page = transfers_->List(req->page_token(), *size);
  for (v1::TransferInfo& t : page.transfers) *resp->add_transfers() = std::move(t);
  if (page.more && resp->transfers_size() > 0) {
    resp->set_next_page_token(resp->transfers(resp->transfers_size() - 1).name());
  }
  return Done(ctx, absl::OkStatus());
}

grpc::ServerUnaryReactor* CoordinatorService::DeleteTransfer(grpc::CallbackServerContext* ctx,
                                                             const v1::DeleteTransferRequest* req,
                                                             v1::DeleteTransferResponse* resp) {
  if (absl::Status a = Authorize(ctx, "DeleteTransfer"); !a.ok()) return Done(ctx, a);
  if (transfers_ == nullptr) return Done(ctx, NoTransfers());
  if (grpc::ServerUnaryReactor* r = Replay(ctx, "DeleteTransfer", *req, resp)) return r;
  return Reply(ctx, req->request_id(), transfers_->Delete(req->name()), *resp);
}

}  // namespace shardcoord
