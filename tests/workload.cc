#include "tests/workload.h"

#include <iterator>
#include <utility>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "proto/convert.h"
#include "tests/tensor_check.h"

namespace shardcoord {
namespace {

const Shape kShape = {48, 40};

}  // namespace

void Progress::Done() {
  absl::MutexLock lock(&mu_);
  ++ops_;
}

void Progress::Failed() {
  absl::MutexLock lock(&mu_);
  failed_ = true;
}

int64_t Progress::WaitPast(int64_t since, int64_t n) {
  absl::MutexLock lock(&mu_);
  auto enough = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return failed_ || ops_ >= since + n; };
  mu_.Await(absl::Condition(&enough));
  return failed_ ? -1 : ops_;
}

int64_t Progress::ops() {
  absl::MutexLock lock(&mu_);
  return ops_;
}

Workload::Workload(int index, const std::string& address, uint64_t seed, absl::Duration retry_for,
                   Progress* progress)
    : index_(index), retry_for_(retry_for), rng_(seed + index), progress_(progress) {
  CoordinatorClientOptions options;
  options.retry_for = retry_for;
  client_ = std::make_unique<CoordinatorClient>(address, options);
}

void Workload::Run(const std::function<bool()>& stop) {
  while (!stop() && error_.ok()) {
    Step();
    progress_->Done();
  }
  if (!error_.ok()) progress_->Failed();
}

std::string Workload::Pick() {
  auto it = live_.begin();
  std::advance(it, std::uniform_int_distribution<size_t>(0, live_.size() - 1)(rng_));
  return it->first;
}

const Workload::Placement& Workload::RandomPlacement() {
  static const Placement kPlacements[] = {{"grid", "S(0),R"},    {"grid", "R,S(1)"},
                                          {"grid", "S(1),S(0)"}, {"line", "S(0)"},
                                          {"line", "S(1)"},      {"line", "R"}};
  return kPlacements[std::uniform_int_distribution<size_t>(0, std::size(kPlacements) - 1)(rng_)];
}

void Workload::Fail(const std::string& what, const absl::Status& s) {
  if (error_.ok()) {
    error_ = absl::InternalError(absl::StrCat("client ", index_, ": ", what, ": ", s.ToString()));
  }
}

void Workload::Step() {
  const int op = live_.size() < 2 ? 0 : std::uniform_int_distribution<int>(0, 9)(rng_);
  if (op <= 1) return Create();
  if (op <= 4) return Redistribute();
  if (op <= 6) return Copy();
  if (op <= 8) return Upload();
  return Delete();
}

void Workload::Create() {
  const std::string name = absl::StrCat("c", index_, "_", next_++);
  const Placement& p = RandomPlacement();
  v1::CreateTensorRequest request;
  request.set_name(name);
  for (int64_t d : kShape) request.add_shape(d);
  request.set_dtype(v1::F32);
  *request.mutable_spec() = SpecFromText(p.mesh, p.spec);
  request.set_init(v1::RANDOM);
  const uint64_t seed = rng_();
  request.set_seed(seed);
  absl::StatusOr<v1::TensorInfo> t = client_->CreateTensor(request);
  // ALREADY_EXISTS: the create committed just before a kill that came before its outcome
  // was stored (docs/decisions.md, "The window that remains"); it took effect once.
  if (t.ok() || t.status().code() == absl::StatusCode::kAlreadyExists) {
    live_[name] = Content{FillKind::kRandom, seed};
    ++acknowledged_;
    return;
  }
  Fail(absl::StrCat("create ", name), t.status());
}

void Workload::Redistribute() {
  const std::string name = Pick();
  const Placement& p = RandomPlacement();
  absl::StatusOr<v1::RedistributeResponse> r =
      client_->Redistribute(RedistributeTo(name, p.mesh, p.spec));
  if (r.ok()) {
    ++acknowledged_;
    return;
  }
  // A plan aborted by a fault (ABORTED): the old version stays, the values too.
  if (r.status().code() == absl::StatusCode::kAborted) {
    ++refused_;
    return;
  }
  Fail(absl::StrCat("redistribute ", name, " to ", p.spec, " on ", p.mesh), r.status());
}

void Workload::Copy() {
  const std::string src = Pick();
  std::string dst = Pick();
  if (dst == src) return;
  v1::CopyRequest request;
  request.set_src(src);
  request.set_dst(dst);
  request.set_wait(true);
  absl::StatusOr<v1::CopyResponse> r = client_->Copy(request);
  if (r.ok()) {
    live_[dst] = live_[src];
    ++acknowledged_;
    return;
  }
  if (r.status().code() == absl::StatusCode::kAborted) {
    ++refused_;
    return;
  }
  Fail(absl::StrCat("copy ", src, " -> ", dst), r.status());
}

// A new version with new values. Streams are not retried by the client: a broken upload
// is sent again, whole, until it is acknowledged (the same values, so at most once more).
void Workload::Upload() {
  const std::string name = Pick();
  const Placement& p = RandomPlacement();
  const uint64_t seed = rng_();
  std::string data(static_cast<size_t>(kShape[0] * kShape[1] * 4), '\0');
  if (absl::Status s =
          FillBox(FillKind::kRandom, seed, kShape, Box::Whole(kShape), DType::kF32, data.data());
      !s.ok()) {
    return Fail("fill", s);
  }
  v1::TensorHeader header;
  header.set_name(name);
  for (int64_t d : kShape) header.add_shape(d);
  header.set_dtype(v1::F32);
  *header.mutable_spec() = SpecFromText(p.mesh, p.spec);
  const absl::Time give_up = absl::Now() + retry_for_;
  while (true) {
    absl::StatusOr<v1::TensorInfo> t = client_->Upload(header, data);
    if (t.ok()) break;
    // CANCELLED: a coordinator that stopped before taking the stream (grpc/grpc#41785).
    const absl::StatusCode code = t.status().code();
    if ((code != absl::StatusCode::kUnavailable && code != absl::StatusCode::kAborted &&
         code != absl::StatusCode::kCancelled) ||
        absl::Now() > give_up) {
      return Fail(absl::StrCat("upload ", name), t.status());
    }
  }
  live_[name] = Content{FillKind::kRandom, seed};
  ++acknowledged_;
}

void Workload::Delete() {
  const std::string name = Pick();
  absl::Status s = client_->DeleteTensor(name);
  // NOT_FOUND: deleted just before a kill that came before the outcome was stored.
  if (s.ok() || s.code() == absl::StatusCode::kNotFound) {
    live_.erase(name);
    deleted_.push_back(name);
    ++acknowledged_;
    return;
  }
  Fail(absl::StrCat("delete ", name), s);
}

WorkloadRunner::WorkloadRunner(int clients, const std::string& address, uint64_t seed,
                               absl::Duration retry_for) {
  for (int i = 0; i < clients; ++i) {
    workloads_.push_back(std::make_unique<Workload>(i, address, seed, retry_for, &progress_));
  }
  for (auto& w : workloads_) {
    threads_.emplace_back([this, w = w.get()] {
      w->Run([this] {
        absl::MutexLock lock(&mu_);
        return stop_;
      });
    });
  }
}

WorkloadRunner::~WorkloadRunner() { Stop(); }

void WorkloadRunner::Stop() {
  {
    absl::MutexLock lock(&mu_);
    stop_ = true;
  }
  for (std::thread& t : threads_) {
    if (t.joinable()) t.join();
  }
}

absl::Status MakeWorkloadMeshes(CoordinatorClient& client) {
  if (absl::Status s = MakeMesh(client, "grid", {2, 2}, {"w0", "w1", "w2", "w3"}).status();
      !s.ok()) {
    return s;
  }
  return MakeMesh(client, "line", {4}, {"w3", "w2", "w1", "w0"}).status();
}

WorkloadTotals ExpectAcknowledgedState(CoordinatorClient& client, const WorkloadRunner& runner) {
  WorkloadTotals totals;
  for (const auto& w : runner.workloads()) {
    EXPECT_TRUE(w->error().ok()) << w->error();
    totals.acknowledged += w->acknowledged();
    totals.refused += w->refused();
    for (const auto& [name, content] : w->live()) {
      absl::StatusOr<v1::TensorInfo> t = client.GetTensor(name);
      EXPECT_TRUE(t.ok()) << name << ": " << t.status();
      if (!t.ok()) continue;
      EXPECT_EQ(t->lost_chunks_size(), 0) << name;
      EXPECT_TRUE(t->busy_plan().empty()) << name << " busy with " << t->busy_plan();
      absl::Status values =
          DownloadAndCheck(client, name, DType::kF32, kShape, content.kind, content.seed);
      EXPECT_TRUE(values.ok()) << name << ": " << values;
      ++totals.checked;
    }
    for (const std::string& name : w->deleted()) {
      EXPECT_EQ(client.GetTensor(name).status().code(), absl::StatusCode::kNotFound)
          << name << " was deleted and came back";
    }
  }
  // Only our tensors exist: nothing acted twice into a tensor the record does not know.
  absl::StatusOr<std::vector<v1::TensorInfo>> all = client.ListTensors();
  EXPECT_TRUE(all.ok()) << all.status();
  if (all.ok()) {
    EXPECT_EQ(static_cast<int64_t>(all->size()), totals.checked);
  }
  return totals;
}

}  // namespace shardcoord
