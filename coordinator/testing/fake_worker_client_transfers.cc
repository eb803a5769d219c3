// FakeWorkerClient's prepared transfers: the worker's side of the contract in memory.

#include <algorithm>
#include <iterator>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "coordinator/testing/fake_worker_client.h"
#include "proto/convert.h"

namespace shardcoord {
namespace {

// A prepared part's answer.
v1::PrepareTransferResponse Answer(const RankTransfer& part) {
  v1::PrepareTransferResponse r;
  r.set_members(static_cast<int64_t>(part.fragment.members.size()));
  r.set_shapes(static_cast<int64_t>(part.fragment.shapes.size()));
  r.set_bytes_sent(part.bytes_sent);
  r.set_bytes_received(part.bytes_received);
  r.set_target_bytes(part.target_bytes);
  r.set_replica_key(part.replica_key);
  r.set_templates(part.templates_planned);
  r.set_total_bytes_moved(part.owned_bytes_moved);
  r.set_total_lower_bound_bytes(part.owned_lower_bound_bytes);
  r.set_exchange_ranks(static_cast<int64_t>(part.fragment.exchange_ranks.size()));
  return r;
}

}  // namespace

void FakeWorkerClient::SetSummarizePrepares(bool summarize) {
  absl::MutexLock lock(&mu_);
  summarize_ = summarize;
}

absl::StatusOr<v1::PrepareTransferResponse> FakeWorkerClient::SummarizedPrepare(
    int64_t rank, const v1::PrepareTransferRequest& request) {
  ResidentTransfer& t = transfers_[{rank, request.transfer_id()}];
  if (request.page() == 0) t = ResidentTransfer();
  if (request.page() != t.next_page) {
    return absl::InvalidArgumentError(
        absl::StrCat("page: ", request.page(), " out of order (", t.next_page, " expected)"));
  }
  ++t.next_page;
  // Ids are never prepared twice (DropTransfer forgets a summary with its parts). The first
  // rank to get a page appends it for all.
  SummarizedTransfer& shared = summarized_[request.transfer_id()];
  if (request.page() == shared.pages) {
    if (absl::Status s = AppendTransferPage(request, &shared.table); !s.ok()) return s;
    ++shared.pages;
  }
  if (!request.last()) return v1::PrepareTransferResponse();
  if (shared.ranks.empty()) {
    absl::StatusOr<std::vector<RankTransfer>> summary = SummarizeTransfer(shared.table);
    if (!summary.ok()) return summary.status();
    shared.ranks = *std::move(summary);
    shared.table = TransferTable();  // Only the summaries are needed from now on.
  }
  if (rank < 0 || rank >= static_cast<int64_t>(shared.ranks.size())) {
    t.planned = true;  // Outside every layout: nothing to do.
    return Answer(t.part);
  }
  const RankTransfer& part = shared.ranks[rank];
  t.part.bytes_sent = part.bytes_sent;
  t.part.bytes_received = part.bytes_received;
  t.part.target_bytes = part.target_bytes;
  t.part.replica_key = part.replica_key;
  t.part.owned_bytes_moved = part.owned_bytes_moved;
  t.part.owned_lower_bound_bytes = part.owned_lower_bound_bytes;
  t.part.templates_planned = part.templates_planned;
  t.planned = true;
  return Answer(t.part);
}

void FakeWorkerClient::PrepareTransfer(const WorkerEndpoint& worker,
                                       std::shared_ptr<const v1::PrepareTransferRequest> request,
                                       Callback<v1::PrepareTransferResponse> done) {
  absl::StatusOr<v1::PrepareTransferResponse> out = v1::PrepareTransferResponse();
  {
    absl::MutexLock lock(&mu_);
    ++calls_["PrepareTransfer"];
    pages_.emplace_back(worker.rank, request);
    if (absl::Status injected = Injected("PrepareTransfer", worker.rank); !injected.ok()) {
      out = injected;
    } else if (summarize_) {
      out = SummarizedPrepare(worker.rank, *request);
      if (!out.ok()) transfers_.erase({worker.rank, request->transfer_id()});
    } else {
      ResidentTransfer& t = transfers_[{worker.rank, request->transfer_id()}];
      if (request->page() == 0) t = ResidentTransfer();
      absl::Status s;
      if (request->page() != t.next_page) {
        s = absl::InvalidArgumentError(
            absl::StrCat("page: ", request->page(), " out of order (", t.next_page, " expected)"));
      } else {
        s = AppendTransferPage(*request, &t.table);
      }
      if (request->page() == 0) {
        t.options.transfer_id = request->transfer_id();
        t.options.step_timeout_ms = request->step_timeout_ms();
        for (int i = 0; i < request->ranks_size() && i < request->incarnations_size(); ++i) {
          t.options.incarnations[request->ranks(i)] = request->incarnations(i);
        }
      }
      ++t.next_page;
      if (s.ok() && request->last()) {
        absl::StatusOr<RankTransfer> part = ExpandTransfer(t.table, worker.rank, t.options);
        if (part.ok()) {
          t.part = *std::move(part);
          t.planned = true;
          out = Answer(t.part);
        } else {
          s = part.status();
        }
      }
      if (!s.ok()) {
        transfers_.erase({worker.rank, request->transfer_id()});
        out = s;
      }
    }
  }
  done(std::move(out));
}

void FakeWorkerClient::RunTransfer(const WorkerEndpoint& worker,
                                   const v1::RunTransferWorkerRequest& request, absl::Duration,
                                   Callback<v1::RunTransferWorkerResponse> done) {
  absl::StatusOr<v1::RunTransferWorkerResponse> out = v1::RunTransferWorkerResponse();
  {
    absl::MutexLock lock(&mu_);
    ++calls_["RunTransfer"];
    transfer_runs_.emplace_back(worker.rank, request);
    auto it = transfers_.find({worker.rank, request.transfer_id()});
    if (absl::Status s = Injected("RunTransfer", worker.rank); !s.ok()) {
      out = s;
    } else if (it == transfers_.end() || !it->second.planned) {
      out = absl::NotFoundError(
          absl::StrCat("transfer '", request.transfer_id(), "' is not resident; prepare it again"));
    } else {
      const RankTransfer& part = it->second.part;
      out->set_bytes_sent(part.bytes_sent);
      out->set_bytes_received(part.bytes_received);
      if (part.replica_key != 0) {
        StableHash digest;
        digest.Add(part.replica_key);
        digest.Add(static_cast<uint64_t>(request.version()));
        out->set_digest(digest.value());
      }
      if (auto d = run_digests_.find(worker.rank); d != run_digests_.end()) {
        out->set_digest(d->second);
      }
      out->mutable_timing()->set_rank(worker.rank);
    }
    if (hold_runs_) {
      held_runs_.push_back(
          [done = std::move(done), out = std::move(out)]() mutable { done(std::move(out)); });
      return;
    }
  }
  done(std::move(out));
}

void FakeWorkerClient::DropTransfer(const WorkerEndpoint& worker,
                                    const v1::DropTransferRequest& request, StatusCallback done) {
  absl::Status status;
  {
    absl::MutexLock lock(&mu_);
    ++calls_["DropTransfer"];
    transfer_drops_.emplace_back(worker.rank, request);
    status = Injected("DropTransfer", worker.rank);
    if (status.ok()) {
      for (auto it = transfers_.begin(); it != transfers_.end();) {
        const bool named = std::find(request.transfer_ids().begin(), request.transfer_ids().end(),
                                     it->first.second) != request.transfer_ids().end();
        const bool prefixed =
            !request.prefix().empty() && absl::StartsWith(it->first.second, request.prefix());
        if (it->first.first == worker.rank && (named || prefixed)) {
          it = transfers_.erase(it);
        } else {
          ++it;
        }
      }
      // Each rank's part holds its own copy of its summary.
      for (auto it = summarized_.begin(); it != summarized_.end();) {
        const bool named = std::find(request.transfer_ids().begin(), request.transfer_ids().end(),
                                     it->first) != request.transfer_ids().end();
        const bool prefixed =
            !request.prefix().empty() && absl::StartsWith(it->first, request.prefix());
        it = named || prefixed ? summarized_.erase(it) : std::next(it);
      }
    }
  }
  done(status);
}

void FakeWorkerClient::HoldRuns(bool hold) {
  absl::MutexLock lock(&mu_);
  hold_runs_ = hold;
}

void FakeWorkerClient::ReleaseRuns() {
  std::vector<std::function<void()>> held;
  {
    absl::MutexLock lock(&mu_);
    held.swap(held_runs_);
  }
  for (std::function<void()>& answer : held) answer();
}

void FakeWorkerClient::SetRunDigest(int64_t rank, uint64_t digest) {
  absl::MutexLock lock(&mu_);
  run_digests_[rank] = digest;
}

std::vector<std::string> FakeWorkerClient::ResidentTransfers(int64_t rank) const {
  absl::MutexLock lock(&mu_);
  std::vector<std::string> out;
  for (const auto& [key, t] : transfers_) {
    if (key.first == rank && t.planned) out.push_back(key.second);
  }
  return out;
}

std::vector<std::pair<int64_t, std::shared_ptr<const v1::PrepareTransferRequest>>>
FakeWorkerClient::pages() const {
  absl::MutexLock lock(&mu_);
  return pages_;
}

std::vector<std::pair<int64_t, v1::RunTransferWorkerRequest>> FakeWorkerClient::transfer_runs()
    const {
  absl::MutexLock lock(&mu_);
  return transfer_runs_;
}

std::vector<std::pair<int64_t, v1::DropTransferRequest>> FakeWorkerClient::transfer_drops() const {
  absl::MutexLock lock(&mu_);
  return transfer_drops_;
}

}  // namespace shardcoord
