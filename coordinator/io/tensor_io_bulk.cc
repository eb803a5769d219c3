// TensorIo's bulk calls: creating and deleting many tensors as one operation (issue 27).
// A model is tens of thousands of tensors; a create per tensor costs a durable commit each
// and a Fill per tensor per rank. Here it costs one commit, and per worker one FillMany per
// kFillsPerCall buffers.

#include <algorithm>
#include <map>
#include <memory>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "common/fan_in.h"
#include "coordinator/io/tensor_io.h"
#include "proto/convert.h"

namespace shardcoord {
namespace {

absl::Status Named(size_t i, const std::string& name, const absl::Status& s) {
  return absl::Status(s.code(), absl::StrCat("tensors[", i, "] '", name, "': ", s.message()));
}

}  // namespace

void TensorIo::CreateMany(std::vector<CreateTensorArgs> args,
                          std::function<void(absl::StatusOr<CreatedMany>)> done) {
  if (args.empty()) return done(absl::InvalidArgumentError("tensors: empty"));
  if (args.size() > kMaxBulkTensors) {
    return done(absl::InvalidArgumentError(absl::StrCat(
        "tensors: ", args.size(), " members, more than the limit of ", kMaxBulkTensors)));
  }
  absl::flat_hash_map<std::string, size_t> first;
  for (size_t i = 0; i < args.size(); ++i) {
    auto [it, fresh] = first.emplace(args[i].name, i);
    if (!fresh) {
      return done(absl::InvalidArgumentError(absl::StrCat("tensors[", i, "]: name '", args[i].name,
                                                          "' is also tensors[", it->second, "]")));
    }
  }

  // Everything shared by the fills' callbacks; written before the first call, then each
  // slot of `sums` by its own fill's callback only (FanIn orders them before the end).
  struct State {
    std::string op;
    std::vector<PreparedCreate> members;
    std::vector<LayoutChecksums> sums;  // Per member, shaped as its layout.
    std::shared_ptr<AdmissionHold> memory;
    CreatedMany result;
  };
  auto st = std::make_shared<State>();
  st->op = NewOp("create-many");
  st->members.reserve(args.size());
  std::map<int64_t, int64_t> bytes_by_rank;
  for (size_t i = 0; i < args.size(); ++i) {
    absl::StatusOr<PreparedCreate> p = PrepareCreate(args[i]);
    if (!p.ok()) return done(Named(i, args[i].name, p.status()));
    p->record.owner = st->op;  // Hidden until every member is ready (PublishAll).
    st->result.bytes += p->record.bytes();
    if (!p->record.attached) {
      for (const auto& [rank, b] : LayoutBytesByRank(p->record.layout, p->record.dtype)) {
        bytes_by_rank[rank] += b;
      }
    }
    st->members.push_back(*std::move(p));
  }
  st->result.created = static_cast<int64_t>(st->members.size());
  absl::StatusOr<std::shared_ptr<AdmissionHold>> memory =
      AdmitNow(admission_, absl::StrCat("creating ", args.size(), " tensors"), bytes_by_rank);
  if (!memory.ok()) return done(memory.status());
  st->memory = *std::move(memory);

  // Forgets every reserved member (and drops whatever the workers filled), then reports `s`.
  auto abandon = [this, st, done](size_t reserved, bool filled, const absl::Status& s) {
    for (size_t i = 0; i < reserved; ++i) {
      const TensorRecord& r = st->members[i].record;
      if (filled && !r.attached) Drop(st->members[i].endpoints, r.name, r.version);
      tensors_->CancelCreate(r.name, st->op);
      (void)tensors_->Remove(r.name, st->op);  // Ready but hidden: NOT_FOUND when cancelled.
    }
    if (st->memory) st->memory->Release();
    done(s);
  };
  for (size_t i = 0; i < st->members.size(); ++i) {
    if (absl::Status s = tensors_->Reserve(st->members[i].record, st->op); !s.ok()) {
      return abandon(i, false, Named(i, st->members[i].record.name, s));
    }
  }

  // Which fills go to which worker: (member, slot in its layout) per rank, in member order.
  st->sums.resize(st->members.size());
  std::map<int64_t, std::vector<std::pair<size_t, size_t>>> by_rank;
  std::map<int64_t, WorkerEndpoint> endpoint_of;
  for (size_t m = 0; m < st->members.size(); ++m) {
    const PreparedCreate& p = st->members[m];
    if (p.record.attached) {
      st->sums[m] = p.NoChecksums();
      continue;
    }
    st->sums[m].resize(p.record.layout.ranks().size());
    for (size_t k = 0; k < p.record.layout.ranks().size(); ++k) {
      const int64_t rank = p.record.layout.ranks()[k].rank;
      by_rank[rank].emplace_back(m, k);
      endpoint_of.emplace(rank, p.endpoints[k]);
    }
  }
  struct Call {
    WorkerEndpoint endpoint;
    std::vector<std::pair<size_t, size_t>> fills;
  };
  std::vector<Call> calls;
  for (auto& [rank, fills] : by_rank) {
    for (size_t b = 0; b < fills.size(); b += kFillsPerCall) {
      const size_t e = std::min(fills.size(), b + kFillsPerCall);
      calls.push_back(Call{endpoint_of.at(rank), {fills.begin() + b, fills.begin() + e}});
    }
  }

  std::shared_ptr<FanIn> fan =
      FanIn::Start(calls.size(), [this, st, abandon, done](absl::Status error) {
        if (!error.ok()) return abandon(st->members.size(), true, error);
        std::vector<std::string> names;
        names.reserve(st->members.size());
        for (size_t m = 0; m < st->members.size(); ++m) {
          const PreparedCreate& p = st->members[m];
          absl::Status s = CheckReplicas(p.record.layout, st->sums[m], p.endpoints);
          if (s.ok()) {
            s = tensors_->FinishCreate(p.record.name, st->op, std::move(st->sums[m]),
                                       p.record.attached ? absl::flat_hash_map<int64_t, int64_t>()
                                                         : Incarnations(p.endpoints));
          }
          if (!s.ok()) return abandon(st->members.size(), true, Named(m, p.record.name, s));
          names.push_back(p.record.name);
        }
        // One store batch makes them all visible (not stored: nothing was created).
        if (absl::Status s = tensors_->PublishAll(names, st->op); !s.ok()) {
          return abandon(st->members.size(), true, s);
        }
        if (st->memory) st->memory->Release();
        done(st->result);
      });
  for (Call& call : calls) {
    v1::FillManyRequest req;
    req.mutable_fills()->Reserve(static_cast<int>(call.fills.size()));
    for (const auto& [m, k] : call.fills) {
      *req.add_fills() = st->members[m].FillFor(st->members[m].record.layout.ranks()[k]);
    }
    client_->FillMany(
        call.endpoint, req,
        [st, fan, ep = call.endpoint,
         fills = std::move(call.fills)](absl::StatusOr<v1::FillManyResponse> r) {
          if (!r.ok()) {
            return fan->Report(absl::UnavailableError(absl::StrCat("creating ", st->members.size(),
                                                                   " tensors: ", Describe(ep), ": ",
                                                                   r.status().ToString())));
          }
          if (r->chunks_size() != static_cast<int>(fills.size())) {
            return fan->Report(absl::InternalError(absl::StrCat(
                Describe(ep), " answered ", r->chunks_size(), " fills of ", fills.size())));
          }
          for (size_t j = 0; j < fills.size(); ++j) {
            const auto [m, k] = fills[j];
            const PreparedCreate& p = st->members[m];
            ChunkChecksums sums;
            absl::Status s = CheckRankAnswer(ep, p.record.layout.ranks()[k],
                                             absl::StatusOr<v1::RankChunks>(r->chunks(j)), &sums);
            if (!s.ok()) return fan->Report(Named(m, p.record.name, s));
            st->sums[m][k] = std::move(sums);
          }
          fan->Report(absl::OkStatus());
        });
  }
}

absl::StatusOr<int64_t> TensorIo::DeleteMany(const std::vector<std::string>& names,
                                             const std::string& prefix) {
  if (names.empty() && prefix.empty()) {
    return absl::InvalidArgumentError("names: empty and no prefix (name what to delete)");
  }
  absl::StatusOr<std::vector<TensorRecord>> removed = tensors_->RemoveAll(names, prefix);
  if (!removed.ok()) return removed.status();
  // One DropTensor per worker (per kDropsPerCall names), not one per tensor per rank.
  std::map<int64_t, std::vector<const std::string*>> by_rank;
  for (const TensorRecord& t : *removed) {
    for (const RankChunks& rc : t.layout.ranks()) by_rank[rc.rank].push_back(&t.name);
  }
  for (const auto& [rank, tensors] : by_rank) {
    absl::StatusOr<WorkerRecord> w = workers_->GetByRank(rank);
    if (!w.ok() || !workers_->IsLive(rank, w->incarnation)) continue;
    for (size_t b = 0; b < tensors.size(); b += kDropsPerCall) {
      v1::DropTensorRequest req;
      req.set_version(-1);
      for (size_t i = b; i < std::min(tensors.size(), b + kDropsPerCall); ++i) {
        req.add_tensors(*tensors[i]);
      }
      client_->DropTensor(w->Endpoint(), req, [](absl::Status) {});
    }
  }
  // Their buffers no longer count: waiting plans may fit (the workers' next reports confirm).
  if (admission_ != nullptr) admission_->Recheck();
  return static_cast<int64_t>(removed->size());
}

}  // namespace shardcoord
