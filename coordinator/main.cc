// The shardcoord coordinator daemon.
#include <pthread.h>
#include <signal.h>
#ifdef __GLIBC__
#include <malloc.h>
#endif

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <string>
#include <thread>
#include <utility>

#include "CLI/CLI.hpp"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/time.h"
#include "common/duration_flag.h"
#include "common/env_flags.h"
#include "common/tls_options.h"
#include "coordinator/coordinator.h"
#include "coordinator/rpc/auth.h"
#include "coordinator/store/etcd_coordinator.h"
#include "coordinator/store/state_store_uri.h"
#include "proto/malformed_log.h"
#include "spdlog/sinks/stdout_color_sinks.h"
#include "spdlog/spdlog.h"

namespace {

// What the operator and scripts read once the coordinator serves; stdout carries these lines.
void PrintServing(const shardcoord::Coordinator& coordinator, const std::string& address,
                  const shardcoord::CoordinatorOptions& options, const std::string& auth_tokens,
                  const shardcoord::TlsFlags& tls_flags, const std::string& timings) {
  // The metrics line comes first: whoever waits for the listening line has both.
  if (!coordinator.http_address().empty()) {
    std::printf("coordinator metrics on http://%s/metrics\n", coordinator.http_address().c_str());
    spdlog::info("metrics on http://{}/metrics", coordinator.http_address());
  }
  if (!coordinator.health_address().empty()) {
    std::printf("coordinator health on %s\n", coordinator.health_address().c_str());
  }
  std::printf("coordinator listening on %s\n", address.c_str());
  std::fflush(stdout);
  spdlog::info("listening on {} ({}, state {})", address, timings, coordinator.state_description());
  if (options.auth.has_value()) {
    spdlog::info("authentication on: {} tokens from {}", options.auth->size(), auth_tokens);
    if (options.auth->size() == 0)
      spdlog::warn("{} holds no token: every call is refused", auth_tokens);
  } else {
    spdlog::info("authentication off (no --auth-tokens): every call is allowed");
  }
  if (options.worker_client.tls.enabled()) {
    spdlog::info("TLS on (certificate {}, CA {}, client certificates: {})", tls_flags.cert,
                 tls_flags.ca,
                 std::string(shardcoord::TlsClientAuthName(options.worker_client.tls.client_auth)));
  } else {
    spdlog::info("TLS off: plaintext");
  }
}

// SIGTERM drains (running plans get `drain`), SIGINT stops at once.
void Stop(shardcoord::Coordinator& coordinator, int sig, absl::Duration drain,
          const std::string& drain_timeout) {
  if (sig == SIGTERM) {
    spdlog::info("SIGTERM: draining (new plans refused; running ones get up to {})", drain_timeout);
    if (int left = coordinator.Drain(drain); left > 0) {
      spdlog::warn("drain timeout: aborting {} running plans", left);
    }
  } else {
    spdlog::info("signal {}: shutting down", sig);
  }
  coordinator.Shutdown();
}

// Exit status of a leader that lost its lease: its supervisor starts it again, as a standby.
constexpr int kLostLeadershipExit = 75;

}  // namespace

int main(int argc, char** argv) {
#ifdef NDEBUG
  // Optimised builds skip Abseil's lock-order graph, which Debian's Abseil keeps on; debug
  // builds (the tests') keep it. A 1000-member group spent ~3% of the coordinator's CPU there.
  absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kIgnore);
#endif
  CLI::App app{"shardcoord coordinator: meshes, tensors, plans, worker health"};
  shardcoord::CoordinatorOptions options;
  std::string heartbeat_timeout = "5s", heartbeat_interval = "500ms", plan_timeout = "5m";
  std::string log_level = "info";
  std::string auth_tokens;
  std::string state = "sqlite", state_dir = "./shardcoord-state", recovery_timeout = "15s";
  std::string drain_timeout = "30s", admission_timeout = "30s";
  std::string etcd_prefix = "/shardcoord/default", leader_ttl = "10s", advertise;
  bool no_collectives = false;
  shardcoord::TlsFlags tls_flags;
  app.add_option("--listen", options.listen, "host:port to serve on (port 0: pick a free one)")
      ->capture_default_str();
  app.add_option("--heartbeat-timeout", heartbeat_timeout,
                 "a worker without a heartbeat this long is dead")
      ->capture_default_str();
  app.add_option("--heartbeat-interval", heartbeat_interval,
                 "how often workers are told to heartbeat")
      ->capture_default_str();
  app.add_option("--plan-timeout", plan_timeout, "a plan not done by then is aborted")
      ->capture_default_str();
  app.add_flag("--no-collectives", no_collectives, "lower every plan to point-to-point steps");
  app.add_option("--admission-timeout", admission_timeout,
                 "how long a plan (or group) waits for its new buffers and staging to fit the "
                 "workers' memory budgets before it fails with RESOURCE_EXHAUSTED naming the "
                 "worker, the bytes needed and free; 0: fail at once. Plans that could not fit "
                 "even on idle workers, creates and uploads never wait. Keep it below "
                 "--plan-timeout, which counts from the plan's start")
      ->capture_default_str();
  app.add_option("--io-band-bytes", options.io_band_bytes,
                 "whole uploads and downloads stream through the coordinator in bands of at "
                 "most this many bytes along dim 0 (at least one dim-0 index each); it holds "
                 "about two bands per transfer")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  app.add_option("--relay-max-bytes", options.relay_max_bytes,
                 "a plan whose tensor holds at most this many bytes (and no Partial layout, "
                 "no attached target) is moved by the coordinator itself: it reads the source "
                 "chunks and writes the new buffers, two parallel RPC rounds instead of a "
                 "fragment, a rendezvous and a report on every worker; 0: every plan runs on "
                 "the workers; at most 1 MiB")
      ->check(CLI::Range(int64_t{0}, shardcoord::kMaxRelayMaxBytes))
      ->capture_default_str();
  app.add_option("--max-tensor-bytes", options.max_tensor_bytes,
                 "refuse to create or upload a tensor larger than this (RESOURCE_EXHAUSTED)")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  app.add_option("--max-message-bytes", options.max_message_bytes,
                 "largest gRPC message accepted from clients and workers (RESOURCE_EXHAUSTED "
                 "beyond); at least 2 MiB, as data streams use 1 MiB messages")
      ->check(CLI::Range(2 << 20, 1 << 30))
      ->capture_default_str();
  app.add_option("--max-watches-per-caller", options.max_watches_per_caller,
                 "open WatchPlan streams per caller (token name, or host without tokens)")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  app.add_option("--max-plans-per-caller", options.max_plans_per_caller,
                 "plans and groups running at once per caller")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  app.add_option("--auth-tokens", auth_tokens,
                 "require bearer tokens: a file of lines 'ROLE NAME SHA256HEX' (role admin, "
                 "operator, reader or worker; the hex SHA-256 of the token, from `shardctl "
                 "token hash`; # comments); without it every call is allowed");
  app.add_option("--http-listen", options.http_listen,
                 "host:port of the HTTP server for Prometheus metrics at /metrics (port 0: "
                 "pick a free one; \"off\": no HTTP server)")
      ->capture_default_str();
  app.add_option("--state", state,
                 "where meshes, tensors, worker ranks and request outcomes live: sqlite "
                 "(durable, in --state-dir; a restarted coordinator recovers them), sqlite:DIR "
                 "(the same in DIR), memory (lost on exit), or etcd://HOST:PORT[,HOST:PORT...] "
                 "(several coordinators, one leads: see --etcd-prefix, --leader-ttl, --advertise)")
      ->check(CLI::Validator(
          [](std::string& v) -> std::string {
            // The directory is checked once every flag is parsed; here only the form.
            absl::StatusOr<shardcoord::StateStoreUri> u =
                shardcoord::ParseStateStoreUri("state", v, "-");
            return u.ok() ? "" : std::string(u.status().message());
          },
          "memory|sqlite|sqlite:DIR|etcd://HOST:PORT[,...]", "state"))
      ->capture_default_str();
  app.add_option("--etcd-prefix", etcd_prefix,
                 "with --state etcd://...: every key of this cluster lives under it (the leader "
                 "key PREFIX/leader, the state PREFIX/records/...); the coordinators of one "
                 "cluster share it, another cluster on the same etcd takes another")
      ->capture_default_str();
  app.add_option("--leader-ttl", leader_ttl,
                 "with --state etcd://...: TTL of the etcd lease the leader holds; a leader that "
                 "cannot renew it stops acting after 5/6 of it (and exits with status 75 for its "
                 "supervisor to restart it as a standby); a dead leader's standby takes over "
                 "after at most this long")
      ->capture_default_str();
  app.add_option("--advertise", advertise,
                 "with --state etcd://...: HOST:PORT that the leader key names for clients and "
                 "workers (standbys point them there); default: the --listen address with the "
                 "bound port, the host name for a wildcard host");
  CLI::Option* state_dir_flag =
      app.add_option("--state-dir", state_dir,
                     "with --state sqlite: directory of the SQLite state (state.db, WAL mode); "
                     "created if missing; one coordinator per directory")
          ->capture_default_str();
  app.add_option("--recovery-timeout", recovery_timeout,
                 "after a restart, how long recovered tensors wait for the workers that held "
                 "them to register again (reads answer UNAVAILABLE meanwhile); chunks of "
                 "workers still missing then are lost")
      ->capture_default_str();
  app.add_option("--tls-cert", tls_flags.cert,
                 "serve TLS with this certificate (PEM), also presented to workers; needs "
                 "--tls-key and --tls-ca");
  app.add_option("--tls-key", tls_flags.key, "the private key of --tls-cert (PEM)");
  app.add_option("--tls-ca", tls_flags.ca,
                 "CA certificate (PEM) that verifies the workers' (and clients') certificates");
  app.add_option("--tls-client-auth", tls_flags.client_auth,
                 "client certificates: none, request (verified when sent) or require (a "
                 "worker's must name the worker it registers)")
      ->capture_default_str();
  app.add_flag("--insecure", options.insecure,
               "allow plaintext on a non-loopback --listen address (logs a warning)");
  app.add_option("--drain-timeout", drain_timeout,
                 "on SIGTERM: readiness turns NOT_SERVING, new plans are refused (UNAVAILABLE) "
                 "and running plans get this long to end before they are aborted; then exit 0")
      ->capture_default_str();
  app.add_option("--health-listen", options.health_listen,
                 "host:port of a plaintext gRPC server that serves only grpc.health.v1.Health "
                 "(Kubernetes gRPC probes cannot speak TLS); the main port serves it too; "
                 "default: none")
      ->capture_default_str();
  app.add_option("--log-level", log_level, "trace, debug, info, warn, error")
      ->capture_default_str();
  app.footer(
      "Every flag can also come from the environment: --drain-timeout from "
      "SHARDCOORD_DRAIN_TIMEOUT and so on (a flag on the command line wins).\n"
      "grpc.health.v1.Health: service \"\" is SERVING once the state is loaded and NOT_SERVING "
      "while draining; \"liveness\" is SERVING until the process stops.\n"
      "--state sqlite --state-dir DIR and --state sqlite:DIR are the same store.\n"
      "Several coordinators on one etcd (--state etcd://HOST:PORT, the same --etcd-prefix): one "
      "leads; the others print 'coordinator standby on ADDR', answer every call UNAVAILABLE "
      "naming the leader (trailing metadata shardcoord-leader) and report readiness "
      "NOT_SERVING; workers and clients take all their addresses (--coordinator A,B). A "
      "leader that loses its lease exits with status 75.");
  shardcoord::BindFlagsToEnvironment(app);
  CLI11_PARSE(app, argc, argv);
  absl::Duration drain = absl::ZeroDuration();
  if (absl::Status s = shardcoord::ParseDurationFlag("drain-timeout", drain_timeout, &drain);
      !s.ok()) {
    std::cerr << s.message() << "\n";
    return 2;
  }
  absl::Status durations = shardcoord::ParseDurationFlag("heartbeat-timeout", heartbeat_timeout,
                                                         &options.heartbeat_timeout);
  if (durations.ok()) {
    durations = shardcoord::ParseDurationFlag("heartbeat-interval", heartbeat_interval,
                                              &options.heartbeat_interval);
  }
  if (durations.ok()) {
    durations = shardcoord::ParseDurationFlag("plan-timeout", plan_timeout, &options.plan_timeout);
  }
  if (durations.ok()) {
    durations = shardcoord::ParseDurationFlag("recovery-timeout", recovery_timeout,
                                              &options.recovery_timeout);
  }
  if (durations.ok() && admission_timeout != "0" && admission_timeout != "0s") {
    durations = shardcoord::ParseDurationFlag("admission-timeout", admission_timeout,
                                              &options.admission_timeout);
  } else if (durations.ok()) {
    options.admission_timeout = absl::ZeroDuration();
  }
  absl::Duration leader_ttl_value = absl::ZeroDuration();
  if (durations.ok()) {
    durations = shardcoord::ParseDurationFlag("leader-ttl", leader_ttl, &leader_ttl_value);
  }
  if (durations.ok() && leader_ttl_value < absl::Seconds(2)) {
    durations = absl::InvalidArgumentError(absl::StrCat(
        "--leader-ttl: ", leader_ttl, " is below 2s (etcd grants leases of at least ~1.5 s)"));
  }
  if (!durations.ok()) {
    std::cerr << durations.message() << "\n";
    return 2;
  }
  options.use_collectives = !no_collectives;
  absl::StatusOr<shardcoord::TlsOptions> tls = shardcoord::LoadDaemonTls(tls_flags);
  if (!tls.ok()) {
    std::cerr << "coordinator: " << tls.status().message() << "\n";
    return 2;
  }
  options.worker_client.tls = *std::move(tls);
  if (absl::Status plain = shardcoord::CheckPlaintextListen(
          "listen", options.listen, options.worker_client.tls.enabled(), options.insecure);
      !plain.ok()) {
    std::cerr << "coordinator: " << plain.message() << "\n";
    return 2;
  }
  if (!auth_tokens.empty()) {
    absl::StatusOr<shardcoord::Authenticator> auth = shardcoord::Authenticator::Load(auth_tokens);
    if (!auth.ok()) {
      std::cerr << "coordinator: --auth-tokens: " << auth.status().message() << "\n";
      return 2;
    }
    options.auth = *std::move(auth);
  }
  if (options.http_listen == "off") options.http_listen.clear();
  absl::StatusOr<shardcoord::StateStoreUri> state_uri =
      shardcoord::ParseStateStoreUri("state", state, state_dir);
  if (state_uri.ok() && absl::StartsWith(state, "sqlite:") && state_dir_flag->count() > 0 &&
      state_uri->dir != state_dir) {
    state_uri = absl::InvalidArgumentError(
        absl::StrCat("--state: '", state, "' names another directory than --state-dir '", state_dir,
                     "'; give it once"));
  }
  if (!state_uri.ok()) {
    std::cerr << "coordinator: " << state_uri.status().message() << "\n";
    return 2;
  }
  options.state = *std::move(state_uri);
#ifdef __GLIBC__
  // Uploads and downloads allocate and free band-sized buffers on gRPC's threads. glibc
  // raises its mmap threshold (up to 32 MiB) after the first such free and then serves them
  // from per-thread arenas, which keep freed memory: the peak grew with every transfer.
  // A fixed threshold maps them and unmaps them on free, so memory follows the bands held.
  mallopt(M_MMAP_THRESHOLD, 4 << 20);
#endif
  spdlog::set_level(spdlog::level::from_str(log_level));
  // Logs go to stderr: stdout carries only the ready line that scripts and tests read.
  spdlog::set_default_logger(spdlog::stderr_color_mt("coordinator"));
  shardcoord::RouteProtobufLogsToSpdlog();  // Malformed requests must not flood the log.

  // Every thread started from here on inherits the blocked signals; this thread takes them.
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGINT);
  sigaddset(&signals, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);

  const std::string timings = absl::StrCat("heartbeat timeout ", heartbeat_timeout, ", interval ",
                                           heartbeat_interval, ", plan timeout ", plan_timeout);
  if (options.state.scheme == shardcoord::StateStoreUri::Scheme::kEtcd) {
    shardcoord::EtcdCoordinatorOptions eo;
    eo.prefix = etcd_prefix;
    eo.leader_ttl = leader_ttl_value;
    eo.advertise = advertise;
    eo.on_lost = [](const std::string& why) {
      // Stop acting at once: no answer, plan or write of this process may follow.
      spdlog::critical("lost leadership: {}; exiting with status {} (restart me as a standby)", why,
                       kLostLeadershipExit);
      spdlog::default_logger()->flush();
      std::_Exit(kLostLeadershipExit);
    };
    shardcoord::EtcdCoordinator ha(options, eo);
    absl::StatusOr<std::string> bound = ha.Start();
    if (!bound.ok()) {
      spdlog::error("{}", bound.status().ToString());
      return 1;
    }
    std::printf("coordinator standby on %s (state %s)\n", bound->c_str(),
                ha.state_description().c_str());
    std::fflush(stdout);
    spdlog::info("standing by on {} as {} (state {}, leader TTL {})", *bound, ha.advertise(),
                 ha.state_description(), leader_ttl);
    // A signal thread: the main thread waits for leadership, then for the signal.
    std::atomic<int> sig{0};
    absl::Notification signaled;
    std::thread signal_thread([&] {
      int s = 0;
      sigwait(&signals, &s);
      sig = s;
      ha.Interrupt();
      signaled.Notify();
    });
    signal_thread.detach();  // Blocked in sigwait until a signal; ends with the process.
    absl::StatusOr<bool> leading = ha.AwaitLeadership();
    if (!leading.ok()) {
      spdlog::error("could not lead: {}", leading.status().ToString());
      ha.Shutdown();
      return 1;
    }
    if (*leading) {
      PrintServing(*ha.coordinator(), *bound, options, auth_tokens, tls_flags, timings);
      signaled.WaitForNotification();
      Stop(*ha.coordinator(), sig, drain, drain_timeout);
    } else {
      spdlog::info("signal {} while standing by", sig.load());
    }
    ha.Shutdown();  // Resigns: a standby takes over at once.
    spdlog::info("stopped");
    return 0;
  }

  shardcoord::Coordinator coordinator(options);
  absl::StatusOr<std::string> address = coordinator.Start();
  if (!address.ok()) {
    spdlog::error("{}", address.status().ToString());
    return 1;
  }
  PrintServing(coordinator, *address, options, auth_tokens, tls_flags, timings);
  int sig = 0;
  sigwait(&signals, &sig);
  Stop(coordinator, sig, drain, drain_timeout);
  spdlog::info("stopped");
  return 0;
}
