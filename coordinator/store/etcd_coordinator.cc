#include "coordinator/store/etcd_coordinator.h"

#include <unistd.h>

#include <utility>

#include "absl/strings/str_cat.h"
#include "coordinator/store/http_etcd_client.h"
#include "proto/grpc_credentials.h"
#include "spdlog/spdlog.h"

namespace shardcoord {
namespace {

std::string HostName() {
  char name[256] = {};
  if (gethostname(name, sizeof(name) - 1) != 0 || name[0] == '\0') return "localhost";
  return name;
}

// What the leader key names: --advertise, or the bound address with the host name in place of
// a wildcard host (0.0.0.0, [::]).
std::string AdvertiseAddress(const std::string& flag, const std::string& bound) {
  if (!flag.empty()) return flag;
  const size_t colon = bound.rfind(':');
  const std::string host = bound.substr(0, colon);
  if (host.empty() || host == "0.0.0.0" || host == "[::]" || host == "::") {
    return absl::StrCat(HostName(), bound.substr(colon));
  }
  return bound;
}

}  // namespace

EtcdCoordinator::EtcdCoordinator(CoordinatorOptions options, EtcdCoordinatorOptions etcd_options)
    : options_(std::move(options)), etcd_options_(std::move(etcd_options)) {
  etcd_ = etcd_options_.etcd;
  if (etcd_ == nullptr) {
    own_etcd_ = std::make_unique<HttpEtcdClient>(options_.state.endpoints);
    etcd_ = own_etcd_.get();
  }
}

EtcdCoordinator::~EtcdCoordinator() { Shutdown(); }

std::string EtcdCoordinator::state_description() const {
  return absl::StrCat(etcd_->Describe(), " ", etcd_options_.prefix);
}

std::string EtcdCoordinator::leader_address() const {
  LeaderElection* election;
  {
    absl::MutexLock lock(&mu_);
    election = election_view_;  // The standby's threads ask before the election exists.
  }
  if (election == nullptr || election->state() == LeaderElection::State::kLeading) return "";
  return LeaderAddress(election->leader_value());
}

absl::StatusOr<std::string> EtcdCoordinator::Start() {
  if (options_.state.scheme != StateStoreUri::Scheme::kEtcd) {
    return absl::InvalidArgumentError(absl::StrCat("state: ", options_.state.ToString(),
                                                   " is not on etcd (etcd://HOST:PORT[,...])"));
  }
  const std::string where = state_description();
  absl::StatusOr<std::unique_ptr<StandbyServer>> standby = StandbyServer::Start(
      options_.listen, MakeServerCredentials(options_.worker_client.tls), options_.health_listen,
      [this] { return leader_address(); }, where);
  if (!standby.ok()) return standby.status();
  standby_ = *std::move(standby);
  address_ = standby_->address();
  advertise_ = AdvertiseAddress(etcd_options_.advertise, address_);
  LeaderElectionOptions eo;
  eo.key = absl::StrCat(etcd_options_.prefix, "/leader");
  eo.value = LeaderValue(advertise_, HostName());
  eo.ttl = etcd_options_.leader_ttl;
  eo.on_lost = etcd_options_.on_lost;
  eo.log = [](absl::string_view line) { spdlog::warn("{}", std::string(line)); };
  election_ = std::make_unique<LeaderElection>(etcd_, &clock_, std::move(eo));
  {
    absl::MutexLock lock(&mu_);
    election_view_ = election_.get();
  }
  election_->Start();
  return address_;
}

void EtcdCoordinator::Interrupt() {
  {
    absl::MutexLock lock(&mu_);
    interrupted_ = true;
  }
  if (election_ != nullptr) election_->Interrupt();
}

absl::StatusOr<bool> EtcdCoordinator::AwaitLeadership() {
  const LeaderElection::State state = election_->AwaitDecided();
  {
    absl::MutexLock lock(&mu_);
    if (interrupted_) return false;
  }
  if (state != LeaderElection::State::kLeading) {
    return absl::UnavailableError(
        absl::StrCat("the election ended without leadership: ", election_->lost_reason()));
  }
  spdlog::info("elected leader ({}, lease {}); loading the state", state_description(),
               election_->lease_id());
  CoordinatorOptions o = options_;
  // The Coordinator opens the store from its URI, fenced by the election.
  o.etcd_store = EtcdStoreEnv{etcd_, election_.get(), &clock_, etcd_options_.prefix};
  o.listen = address_;
  o.leader_hint = advertise_;
  if (!standby_->health_address().empty()) o.health_listen = standby_->health_address();
  // Loads and reconciles the state while the standby still answers ("no leader serves yet").
  coordinator_ = std::make_unique<Coordinator>(std::move(o));
  // The leader's servers bind the standby's ports beside it (gRPC sets SO_REUSEPORT), then the
  // standby stops: no moment without a listener, and calls the standby had not taken yet
  // when it stopped are few (gRPC cancels those: clients retry CANCELLED as UNAVAILABLE).
  absl::StatusOr<std::string> serving = coordinator_->Start();
  standby_->Shutdown();
  if (!serving.ok()) {
    coordinator_->Shutdown();
    election_->Resign().IgnoreError();
    return serving.status();
  }
  return true;
}

void EtcdCoordinator::Shutdown() {
  if (coordinator_ != nullptr) coordinator_->Shutdown();
  if (standby_ != nullptr) standby_->Shutdown();
  if (election_ != nullptr) {
    if (absl::Status s = election_->Resign(); !s.ok()) {
      spdlog::warn("could not resign (the lease expires in {}): {}",
                   absl::FormatDuration(etcd_options_.leader_ttl), s.ToString());
    }
  }
}

}  // namespace shardcoord
