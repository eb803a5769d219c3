#include "coordinator/store/etcd_state_store.h"

#include <algorithm>
#include <map>
#include <optional>
#include <tuple>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/strip.h"

namespace shardcoord {
namespace {

constexpr absl::string_view kRecords = "/records/";
constexpr absl::string_view kBarrier = "barrier ";
// A transaction's bytes beyond its operations (compares, the token put, framing).
constexpr int64_t kTxnOverhead = 1024;

const etcdv3::KeyValue* ReadResult(const etcdv3::TxnResponse& r, int index) {
  if (index >= r.responses_size()) return nullptr;
  const etcdv3::RangeResponse& range = r.responses(index).response_range();
  return range.kvs_size() > 0 ? &range.kvs(0) : nullptr;
}

bool Transient(absl::StatusCode code) {
  return code == absl::StatusCode::kUnavailable || code == absl::StatusCode::kUnknown ||
         code == absl::StatusCode::kDeadlineExceeded;
}

}  // namespace

EtcdStateStore::EtcdStateStore(EtcdClient* etcd, LeaderFence* fence, Clock* clock,
                               EtcdStateStoreOptions options)
    : etcd_(etcd), fence_(fence), clock_(clock), options_(std::move(options)) {}

absl::StatusOr<std::unique_ptr<EtcdStateStore>> EtcdStateStore::Open(
    EtcdClient* etcd, LeaderFence* fence, Clock* clock, EtcdStateStoreOptions options) {
  std::unique_ptr<EtcdStateStore> store(new EtcdStateStore(etcd, fence, clock, std::move(options)));
  etcdv3::RangeRequest read;
  read.set_key(store->TokenKey());
  absl::StatusOr<etcdv3::RangeResponse> token = etcd->Range(read);
  if (!token.ok()) return token.status();
  absl::MutexLock lock(&store->mu_);
  store->token_mod_revision_ = token->kvs_size() > 0 ? token->kvs(0).mod_revision() : 0;
  if (absl::Status s = store->ReplayJournals(); !s.ok()) return s;
  return store;
}

std::string EtcdStateStore::RecordKey(const std::string& kind, const std::string& name) const {
  return absl::StrCat(options_.prefix, kRecords, kind, "/", name);
}

std::string EtcdStateStore::TokenKey() const { return absl::StrCat(options_.prefix, "/write"); }

std::string EtcdStateStore::JournalPrefix() const {
  return absl::StrCat(options_.prefix, "/journal/");
}

std::string EtcdStateStore::Describe() const {
  return absl::StrCat(etcd_->Describe(), " ", options_.prefix);
}

absl::Time EtcdStateStore::LastTrouble() const {
  const int64_t ns = trouble_unix_ns_;
  return ns == std::numeric_limits<int64_t>::min() ? absl::InfinitePast() : absl::FromUnixNanos(ns);
}

int64_t EtcdStateStore::transactions() const {
  absl::MutexLock lock(&mu_);
  return transactions_;
}

absl::Status EtcdStateStore::CompareFailed(const etcdv3::Compare& fence,
                                           const etcdv3::TxnResponse& r, const std::string& token,
                                           bool* applied) {
  *applied = false;
  const etcdv3::KeyValue* leader = ReadResult(r, 0);
  if (leader == nullptr || leader->create_revision() != fence.create_revision()) {
    fence_->FenceFailed("a state write found that this coordinator no longer holds the leader key");
    return absl::UnavailableError(
        "this coordinator lost leadership (its leader key is gone); nothing was written");
  }
  const etcdv3::KeyValue* written = ReadResult(r, 1);
  const std::string value = written == nullptr ? "" : written->value();
  if (value == token) {
    *applied = true;
    token_mod_revision_ = written->mod_revision();
    return absl::OkStatus();
  }
  if (value == absl::StrCat(kBarrier, token)) {
    token_mod_revision_ = written->mod_revision();
    return absl::UnavailableError("etcd did not apply a state write; nothing changed");
  }
  // Someone else wrote under our prefix while we lead: stop leading rather than guess.
  fence_->FenceFailed(absl::StrCat("the state in etcd was written by another writer (", TokenKey(),
                                   " is '", value, "')"));
  return absl::UnavailableError(absl::StrCat(
      "the state under ", options_.prefix, " was changed by another writer; nothing was written"));
}

absl::Status EtcdStateStore::Commit(std::vector<etcdv3::RequestOp> ops) {
  absl::StatusOr<etcdv3::Compare> fence = fence_->Fence();
  if (!fence.ok()) return fence.status();
  const std::string token = absl::StrCat(fence->create_revision(), ":", ++seq_);
  etcdv3::TxnRequest txn;
  *txn.add_compare() = *fence;
  *txn.add_compare() = ModRevisionIs(TokenKey(), token_mod_revision_);
  for (etcdv3::RequestOp& op : ops) *txn.add_success() = std::move(op);
  *txn.add_success() = PutOp(TokenKey(), token);
  *txn.add_failure() = RangeOp(fence->key());
  *txn.add_failure() = RangeOp(TokenKey());
  absl::StatusOr<etcdv3::TxnResponse> r = etcd_->Txn(txn);
  if (r.ok()) {
    ++transactions_;
    if (r->succeeded()) {
      token_mod_revision_ = r->header().revision();
      return absl::OkStatus();
    }
    bool applied;
    return CompareFailed(*fence, *r, token, &applied);
  }
  const absl::Status& s = r.status();
  NoteTrouble();
  if (s.code() == absl::StatusCode::kUnavailable) {
    return absl::UnavailableError(absl::StrCat(s.message(), " (nothing was written)"));
  }
  if (Transient(s.code())) {
    waiting_ = true;
    absl::Status resolved = Resolve(*fence, token);
    waiting_ = false;
    NoteTrouble();
    return resolved;
  }
  return absl::InternalError(absl::StrCat("etcd refused a state write: ", s.message()));
}

absl::Status EtcdStateStore::Resolve(const etcdv3::Compare& fence, const std::string& token) {
  const std::string barrier = absl::StrCat(kBarrier, token);
  while (true) {
    if (absl::StatusOr<etcdv3::Compare> still = fence_->Fence(); !still.ok()) {
      return absl::UnavailableError(absl::StrCat(
          "etcd did not answer a state write, and this coordinator stopped leading before it "
          "learnt the outcome: ",
          still.status().message()));
    }
    etcdv3::TxnRequest txn;
    *txn.add_compare() = fence;
    *txn.add_compare() = ModRevisionIs(TokenKey(), token_mod_revision_);
    *txn.add_success() = PutOp(TokenKey(), barrier);
    *txn.add_failure() = RangeOp(fence.key());
    *txn.add_failure() = RangeOp(TokenKey());
    absl::StatusOr<etcdv3::TxnResponse> r = etcd_->Txn(txn);
    if (r.ok()) {
      ++transactions_;
      if (r->succeeded()) {
        // The lost write's compare can never hold again: it did not and will not apply.
        token_mod_revision_ = r->header().revision();
        return absl::UnavailableError("etcd did not apply a state write; nothing changed");
      }
      bool applied;
      return CompareFailed(fence, *r, token, &applied);
    }
    if (!Transient(r.status().code())) {
      return absl::InternalError(
          absl::StrCat("etcd refused a state write: ", r.status().message()));
    }
    clock_->SleepFor(options_.retry);
  }
}

absl::Status EtcdStateStore::CommitInPieces(const std::vector<etcdv3::RequestOp>& ops) {
  std::vector<etcdv3::RequestOp> piece;
  int64_t bytes = 0;
  for (size_t i = 0; i <= ops.size(); ++i) {
    const int64_t size = i < ops.size() ? static_cast<int64_t>(ops[i].ByteSizeLong()) : 0;
    const bool full = static_cast<int>(piece.size()) + 1 >= options_.max_txn_ops ||
                      bytes + size + kTxnOverhead > options_.max_txn_bytes;
    if (!piece.empty() && (i == ops.size() || full)) {
      if (absl::Status s = Commit(std::move(piece)); !s.ok()) return s;
      piece.clear();
      bytes = 0;
    }
    if (i < ops.size()) {
      piece.push_back(ops[i]);
      bytes += size;
    }
  }
  return absl::OkStatus();
}

absl::Status EtcdStateStore::CommitUntilDone(const std::vector<etcdv3::RequestOp>& ops) {
  // Commits are idempotent (puts and deletes of fixed keys): repeating a piece that applied
  // is harmless, so pieces are simply retried from the start.
  struct Done {
    std::atomic<bool>* waiting;
    ~Done() { *waiting = false; }
  } done{&waiting_};
  while (true) {
    absl::Status s = CommitInPieces(ops);
    if (s.ok()) return s;
    if (!fence_->Fence().ok()) return s;  // The next leader finishes the journal.
    if (s.code() != absl::StatusCode::kUnavailable) {
      fence_->FenceFailed(absl::StrCat("a committed batch cannot be applied (", s.message(), ")"));
      return s;
    }
    waiting_ = true;
    clock_->SleepFor(options_.retry);
  }
}

absl::Status EtcdStateStore::ApplyJournaled(const std::vector<etcdv3::RequestOp>& ops) {
  absl::StatusOr<etcdv3::Compare> fence = fence_->Fence();
  if (!fence.ok()) return fence.status();
  const std::string journal = absl::StrCat(
      JournalPrefix(), absl::StrFormat("%020d.%010d", fence->create_revision(), ++seq_), "/");
  etcdv3::TxnRequest payload;
  for (const etcdv3::RequestOp& op : ops) *payload.add_success() = op;
  const std::string bytes = payload.SerializeAsString();
  const size_t part_bytes = static_cast<size_t>(options_.max_txn_bytes - kTxnOverhead);
  const size_t parts = (bytes.size() + part_bytes - 1) / part_bytes;
  auto discard = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    CommitInPieces({DeleteRangeOp(journal, PrefixRangeEnd(journal))}).IgnoreError();
  };
  for (size_t i = 0; i < parts; ++i) {
    absl::Status s = Commit({PutOp(absl::StrFormat("%spart/%06d", journal, i),
                                   bytes.substr(i * part_bytes, part_bytes))});
    if (!s.ok()) {
      discard();
      return s;
    }
  }
  if (absl::Status s = Commit({PutOp(absl::StrCat(journal, "commit"), absl::StrCat(parts))});
      !s.ok()) {
    discard();
    return s;
  }
  // Committed: from here the batch counts, whoever finishes it.
  if (absl::Status s = CommitUntilDone(ops); !s.ok()) return s;
  return CommitUntilDone({DeleteRangeOp(journal, PrefixRangeEnd(journal))});
}

absl::Status EtcdStateStore::ReplayJournals() {
  etcdv3::RangeRequest read;
  read.set_key(JournalPrefix());
  read.set_range_end(PrefixRangeEnd(JournalPrefix()));
  absl::StatusOr<etcdv3::RangeResponse> r = etcd_->Range(read);
  if (!r.ok()) return r.status();
  // journal id -> (part index -> bytes), and the commit's part count.
  std::map<std::string, std::map<int64_t, std::string>> parts;
  std::map<std::string, int64_t> committed;
  for (const etcdv3::KeyValue& kv : r->kvs()) {
    absl::string_view rest = absl::string_view(kv.key()).substr(JournalPrefix().size());
    const size_t slash = rest.find('/');
    if (slash == absl::string_view::npos) continue;
    const std::string id(rest.substr(0, slash));
    absl::string_view what = rest.substr(slash + 1);
    int64_t n = 0;
    if (what == "commit" && absl::SimpleAtoi(kv.value(), &n)) {
      committed[id] = n;
    } else if (absl::ConsumePrefix(&what, "part/") && absl::SimpleAtoi(what, &n)) {
      parts[id][n] = kv.value();
    } else {
      parts[id];
    }
  }
  for (auto& [id, pieces] : parts) {
    const std::string journal = absl::StrCat(JournalPrefix(), id, "/");
    auto commit = committed.find(id);
    if (commit != committed.end()) {
      std::string bytes;
      for (int64_t i = 0; i < commit->second; ++i) {
        auto it = pieces.find(i);
        if (it == pieces.end()) {
          return absl::InternalError(
              absl::StrCat("state store: journal ", journal, " is committed but misses part ", i));
        }
        bytes += it->second;
      }
      etcdv3::TxnRequest payload;
      if (!payload.ParseFromString(bytes)) {
        return absl::InternalError(
            absl::StrCat("state store: journal ", journal, " does not parse"));
      }
      std::vector<etcdv3::RequestOp> ops(payload.success().begin(), payload.success().end());
      if (absl::Status s = CommitUntilDone(ops); !s.ok()) return s;
    }
    if (absl::Status s = CommitUntilDone({DeleteRangeOp(journal, PrefixRangeEnd(journal))});
        !s.ok()) {
      return s;
    }
  }
  return absl::OkStatus();
}

absl::Status EtcdStateStore::Apply(const StateBatch& batch) {
  if (batch.empty()) return absl::OkStatus();
  // One operation per key, as etcd requires: a put replaces a delete of the same record.
  std::map<std::string, std::optional<std::string>> last;
  for (const auto& [kind, name] : batch.deletes) last[RecordKey(kind, name)] = std::nullopt;
  for (const StateRecord& r : batch.puts) last[RecordKey(r.kind, r.name)] = r.value;
  std::vector<etcdv3::RequestOp> ops;
  ops.reserve(last.size());
  int64_t bytes = 0;
  for (auto& [key, value] : last) {
    ops.push_back(value.has_value() ? PutOp(key, *std::move(value)) : DeleteOp(key));
    const int64_t size = static_cast<int64_t>(ops.back().ByteSizeLong());
    if (size + kTxnOverhead > options_.max_txn_bytes) {
      return absl::ResourceExhaustedError(absl::StrCat(
          "state record '", key, "' is ", size, " bytes; etcd takes at most ",
          options_.max_txn_bytes - kTxnOverhead,
          " per record here (raise etcd's --max-request-bytes and the coordinator's budget)"));
    }
    bytes += size;
  }
  if (waiting_) {
    NoteTrouble();
    return absl::UnavailableError(
        "an earlier state write still waits for etcd's answer; nothing was written, retry");
  }
  absl::MutexLock lock(&mu_);
  if (static_cast<int>(ops.size()) + 1 <= options_.max_txn_ops &&
      bytes + kTxnOverhead <= options_.max_txn_bytes) {
    return Commit(std::move(ops));
  }
  return ApplyJournaled(ops);
}

absl::StatusOr<std::vector<StateRecord>> EtcdStateStore::LoadAll() const {
  const std::string prefix = absl::StrCat(options_.prefix, kRecords);
  std::vector<StateRecord> out;
  etcdv3::RangeRequest read;
  read.set_key(prefix);
  read.set_range_end(PrefixRangeEnd(prefix));
  read.set_limit(options_.page);
  while (true) {
    absl::StatusOr<etcdv3::RangeResponse> r = etcd_->Range(read);
    if (!r.ok()) return r.status();
    // Every page at the first page's revision: one consistent picture.
    if (read.revision() == 0) read.set_revision(r->header().revision());
    for (const etcdv3::KeyValue& kv : r->kvs()) {
      absl::string_view rest = absl::string_view(kv.key()).substr(prefix.size());
      const size_t slash = rest.find('/');
      if (slash == absl::string_view::npos) {
        return absl::InternalError(absl::StrCat("state store: bad key '", kv.key(), "'"));
      }
      out.push_back(
          {std::string(rest.substr(0, slash)), std::string(rest.substr(slash + 1)), kv.value()});
    }
    if (!r->more() || r->kvs_size() == 0) break;
    read.set_key(r->kvs(r->kvs_size() - 1).key() + std::string(1, '\0'));
  }
  std::sort(out.begin(), out.end(), [](const StateRecord& a, const StateRecord& b) {
    return std::tie(a.kind, a.name) < std::tie(b.kind, b.name);
  });
  return out;
}

}  // namespace shardcoord
