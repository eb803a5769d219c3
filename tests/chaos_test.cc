// Issue 12, acceptance 1: the coordinator is killed with SIGKILL 20 times at random moments of
// a workload of 4 concurrent clients creating, redistributing, copying, uploading and
// deleting tensors, and restarted each time on its state directory. Afterwards every
// acknowledged tensor version downloads with the values it was given, no acknowledged delete
// has come back, and ranks never changed. The clients retry UNAVAILABLE with one request_id
// per change (CoordinatorClient), so a retried change takes effect once.
//
// The moments are random but driven by progress, not by sleeps: the killer waits (on a
// condition) until the clients have finished a random number of operations since the last
// restart, then kills whatever is in flight.

#include <cstdint>
#include <functional>
#include <iostream>
#include <iterator>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "client/coordinator_client.h"
#include "gtest/gtest.h"
#include "proto/convert.h"
#include "sharding/fill.h"
#include "tests/cluster.h"
#include "tests/tensor_check.h"

namespace shardcoord {
namespace {

constexpr int kClients = 4;
constexpr int kKills = 20;
constexpr uint64_t kSeed = 20261124;
const Shape kShape = {48, 40};
// Generous: a client retries UNAVAILABLE for this long while the coordinator restarts.
constexpr absl::Duration kRetryFor = absl::Seconds(60);

// What a tensor holds: FillValue(kind, seed, i) at element i.
struct Content {
  FillKind kind = FillKind::kArange;
  uint64_t seed = 0;
};

struct Placement {
  const char* mesh;
  const char* spec;
};
const Placement kPlacements[] = {{"grid", "S(0),R"}, {"grid", "R,S(1)"}, {"grid", "S(1),S(0)"},
                                 {"line", "S(0)"},   {"line", "S(1)"},   {"line", "R"}};

std::string Describe(const absl::Status& s) { return s.ToString(); }

// Counts finished operations; the killer waits on it.
class Progress {
 public:
  void Done() {
    absl::MutexLock lock(&mu_);
    ++ops_;
  }
  // A client stopped on an unexpected error: nobody waits for progress any more.
  void Failed() {
    absl::MutexLock lock(&mu_);
    failed_ = true;
  }
  // Waits until `n` more operations finished than at `since` (or a client failed); returns
  // the count, or -1 after a failure.
  int64_t WaitPast(int64_t since, int64_t n) {
    absl::MutexLock lock(&mu_);
    auto enough = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return failed_ || ops_ >= since + n; };
    mu_.Await(absl::Condition(&enough));
    return failed_ ? -1 : ops_;
  }
  int64_t ops() {
    absl::MutexLock lock(&mu_);
    return ops_;
  }

 private:
  absl::Mutex mu_;
  int64_t ops_ ABSL_GUARDED_BY(mu_) = 0;
  bool failed_ ABSL_GUARDED_BY(mu_) = false;
};

// One client's tensors ("c<i>_<n>") and what each must hold once its operations were
// acknowledged. Only this client's thread touches them.
class Workload {
 public:
  Workload(int index, const std::string& address, Progress* progress)
      : index_(index), rng_(kSeed + index), progress_(progress) {
    CoordinatorClientOptions options;
    options.retry_for = kRetryFor;
    client_ = std::make_unique<CoordinatorClient>(address, options);
  }

  // Runs operations until `stop` returns true. Records the first unexpected error.
  void Run(const std::function<bool()>& stop) {
    while (!stop() && error_.ok()) {
      Step();
      progress_->Done();
    }
    if (!error_.ok()) progress_->Failed();
  }

  const absl::Status& error() const { return error_; }
  const std::map<std::string, Content>& live() const { return live_; }
  const std::vector<std::string>& deleted() const { return deleted_; }
  int64_t acknowledged() const { return acknowledged_; }
  int64_t refused() const { return refused_; }

 private:
  std::string Pick() {
    auto it = live_.begin();
    std::advance(it, std::uniform_int_distribution<size_t>(0, live_.size() - 1)(rng_));
    return it->first;
  }
  const Placement& RandomPlacement() {
    return kPlacements[std::uniform_int_distribution<size_t>(0, std::size(kPlacements) - 1)(rng_)];
  }
  void Fail(const std::string& what, const absl::Status& s) {
    if (error_.ok())
      error_ = absl::InternalError(absl::StrCat("client ", index_, ": ", what, ": ", Describe(s)));
  }

  void Step() {
    const int op = live_.size() < 2 ? 0 : std::uniform_int_distribution<int>(0, 9)(rng_);
    if (op <= 1) return Create();
    if (op <= 4) return Redistribute();
    if (op <= 6) return Copy();
    if (op <= 8) return Upload();
    return Delete();
  }

  void Create() {
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

  void Redistribute() {
    const std::string name = Pick();
    const Placement& p = RandomPlacement();
    absl::StatusOr<v1::RedistributeResponse> r =
        client_->Redistribute(RedistributeTo(name, p.mesh, p.spec));
    if (r.ok()) {
      ++acknowledged_;
      return;
    }
    // A plan aborted by a kill (ABORTED): the old version stays, the values too.
    if (r.status().code() == absl::StatusCode::kAborted) {
      ++refused_;
      return;
    }
    Fail(absl::StrCat("redistribute ", name, " to ", p.spec, " on ", p.mesh), r.status());
  }

  void Copy() {
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
  void Upload() {
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
    const absl::Time give_up = absl::Now() + kRetryFor;
    while (true) {
      absl::StatusOr<v1::TensorInfo> t = client_->Upload(header, data);
      if (t.ok()) break;
      const absl::StatusCode code = t.status().code();
      if ((code != absl::StatusCode::kUnavailable && code != absl::StatusCode::kAborted) ||
          absl::Now() > give_up) {
        return Fail(absl::StrCat("upload ", name), t.status());
      }
    }
    live_[name] = Content{FillKind::kRandom, seed};
    ++acknowledged_;
  }

  void Delete() {
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

  const int index_;
  std::mt19937_64 rng_;
  Progress* const progress_;
  std::unique_ptr<CoordinatorClient> client_;
  int next_ = 0;
  std::map<std::string, Content> live_;
  std::vector<std::string> deleted_;
  int64_t acknowledged_ = 0;
  int64_t refused_ = 0;
  absl::Status error_;
};

TEST(ChaosTest, TwentyKillsLoseNothingAcknowledged) {
  ClusterOptions options;
  options.state_dir = absl::StrCat(std::getenv("TEST_TMPDIR"), "/chaos-state");
  options.coordinator_flags = {"--heartbeat-timeout=3s", "--heartbeat-interval=200ms",
                               "--recovery-timeout=60s"};
  options.echo_stdout = false;
  options.log_dir = std::getenv("TEST_UNDECLARED_OUTPUTS_DIR") != nullptr
                        ? std::getenv("TEST_UNDECLARED_OUTPUTS_DIR")
                        : std::getenv("TEST_TMPDIR");
  options.client_options.retry_for = kRetryFor;
  absl::StatusOr<std::unique_ptr<Cluster>> started = Cluster::Start(options);
  ASSERT_TRUE(started.ok()) << started.status();
  Cluster& cluster = **started;
  ASSERT_TRUE(MakeMesh(cluster.client(), "grid", {2, 2}, {"w0", "w1", "w2", "w3"}).ok());
  ASSERT_TRUE(MakeMesh(cluster.client(), "line", {4}, {"w3", "w2", "w1", "w0"}).ok());
  std::map<std::string, int64_t> ranks;
  absl::StatusOr<std::vector<v1::WorkerInfo>> workers = cluster.client().ListWorkers();
  ASSERT_TRUE(workers.ok()) << workers.status();
  for (const v1::WorkerInfo& w : *workers) ranks[w.name()] = w.rank();

  Progress progress;
  absl::Mutex mu;
  bool stop = false;
  std::vector<std::unique_ptr<Workload>> workloads;
  for (int i = 0; i < kClients; ++i) {
    workloads.push_back(std::make_unique<Workload>(i, cluster.coordinator_address(), &progress));
  }
  std::vector<std::thread> threads;
  for (auto& w : workloads) {
    threads.emplace_back([&mu, &stop, w = w.get()] {
      w->Run([&] {
        absl::MutexLock lock(&mu);
        return stop;
      });
    });
  }
  std::mt19937_64 rng(kSeed);
  int64_t seen = 0;
  std::vector<int64_t> kill_points;
  for (int k = 0; k < kKills; ++k) {
    // 1 to 12 operations after the previous restart: sometimes while the tensors are still
    // recovering, sometimes mid-plan or mid-upload.
    seen = progress.WaitPast(seen, std::uniform_int_distribution<int64_t>(1, 12)(rng));
    if (seen < 0) break;  // A client failed: its error is reported below.
    kill_points.push_back(seen);
    ASSERT_TRUE(cluster.KillCoordinator().ok()) << "kill " << k;
    absl::Status restarted = cluster.RestartCoordinator(absl::Seconds(60));
    ASSERT_TRUE(restarted.ok()) << "restart " << k << ": " << restarted;
  }
  // A last stretch without kills, then stop.
  if (seen >= 0) progress.WaitPast(seen, 8);
  {
    absl::MutexLock lock(&mu);
    stop = true;
  }
  for (std::thread& t : threads) t.join();

  CoordinatorClient& client = cluster.client();
  int64_t acknowledged = 0, refused = 0, checked = 0;
  for (const auto& w : workloads) {
    ASSERT_TRUE(w->error().ok()) << w->error();
    acknowledged += w->acknowledged();
    refused += w->refused();
    for (const auto& [name, content] : w->live()) {
      absl::StatusOr<v1::TensorInfo> t = client.GetTensor(name);
      ASSERT_TRUE(t.ok()) << name << ": " << t.status();
      EXPECT_EQ(t->lost_chunks_size(), 0) << name;
      EXPECT_TRUE(t->busy_plan().empty()) << name << " busy with " << t->busy_plan();
      absl::Status values =
          DownloadAndCheck(client, name, DType::kF32, kShape, content.kind, content.seed);
      EXPECT_TRUE(values.ok()) << name << ": " << values;
      ++checked;
    }
    for (const std::string& name : w->deleted()) {
      EXPECT_EQ(client.GetTensor(name).status().code(), absl::StatusCode::kNotFound)
          << name << " was deleted and came back";
    }
  }
  // Only our tensors exist: nothing acted twice into a tensor the model does not know.
  absl::StatusOr<std::vector<v1::TensorInfo>> all = client.ListTensors();
  ASSERT_TRUE(all.ok()) << all.status();
  EXPECT_EQ(static_cast<int64_t>(all->size()), checked);
  std::map<std::string, int64_t> after;
  workers = client.ListWorkers();
  ASSERT_TRUE(workers.ok()) << workers.status();
  for (const v1::WorkerInfo& w : *workers) after[w.name()] = w.rank();
  EXPECT_EQ(after, ranks);
  EXPECT_GT(acknowledged, kKills);
  std::cerr << "chaos: " << kKills << " kills after operations " << absl::StrJoin(kill_points, ",")
            << "; " << acknowledged << " operations acknowledged, " << refused
            << " aborted by a kill, " << checked << " tensors checked value by value\n";
}

}  // namespace
}  // namespace shardcoord
