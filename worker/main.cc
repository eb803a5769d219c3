// The worker daemon: registers with the coordinator, heartbeats, holds chunk buffers and
// executes plan fragments through the Communicator interface: NCCL with the buffers in the
// memory of the one GPU it owns, or Gloo with the buffers in host memory.
//
//   worker --coordinator 127.0.0.1:7400 --listen 127.0.0.1:0 --name w0
//   worker --backend nccl --device 1 ...
//
// --backend auto (the default) picks nccl when a CUDA device is visible, else gloo; its log
// line is the first. --backend nccl without a GPU exits 2 with one line
// "no CUDA device visible: <why>". Builds without the CUDA toolkit have no NCCL branch.
//
// When ready it prints one line to stdout: "worker <name> listening on <host:port>". Logs go
// to stderr. SIGTERM drains (see --drain-timeout) and exits 0; SIGINT shuts down at once.
//
// This file is flags, environment and signals; Worker (worker/worker.h) wires the daemon.

#include <signal.h>
#include <spdlog/sinks/stdout_color_sinks.h>
#include <spdlog/spdlog.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>
#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/byte_size.h"
#include "common/duration_flag.h"
#include "common/env_flags.h"
#include "common/sha256.h"
#include "common/tls_options.h"
#include "proto/convert.h"
#include "proto/malformed_log.h"
#include "sharding/names.h"
#include "worker/worker.h"

namespace shardcoord {
namespace {

// The node a pod runs on when the manifest passes it ($NODE_NAME, the downward API's
// spec.nodeName), else the hostname.
std::string DefaultHost() {
  if (const char* node = std::getenv("NODE_NAME"); node != nullptr && *node) return node;
  char buf[256] = {};
  if (gethostname(buf, sizeof(buf) - 1) != 0) return "localhost";
  return buf;
}

// The token in `path`, without trailing newlines and spaces; NOT_FOUND when unreadable,
// INVALID_ARGUMENT when empty.
absl::StatusOr<std::string> ReadTokenFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot read ", path));
  std::ostringstream contents;
  contents << in.rdbuf();
  const std::string text = contents.str();
  const absl::string_view token = TrimToken(text);
  if (token.empty()) return absl::InvalidArgumentError(absl::StrCat(path, " holds no token"));
  return std::string(token);
}

int Main(int argc, char** argv) {
#ifdef NDEBUG
  // As the coordinator's: no lock-order graph in optimised builds.
  absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kIgnore);
#endif
  WorkerOptions options;
  options.host = DefaultHost();
  std::string backend = "auto";
  std::string device;
  // Durations as the coordinator's flags take them: 60s, 500ms, 2m.
  std::string step_timeout = "60s", register_timeout = "60s", drain_timeout = "30s";
  std::string log_level = "info";
  std::string token_file;
  std::string memory_budget, bucket_bytes = "64MiB";
  TlsFlags tls_flags;

  CLI::App app{"shardcoord worker: holds chunk buffers and executes plan fragments"};
  app.add_option("--coordinator", options.coordinator,
                 "Coordinator address HOST:PORT, or all of several coordinators on etcd "
                 "(HOST:PORT,HOST:PORT: the worker follows the leader a standby names) "
                 "(default $SHARDCOORD_ADDR, then 127.0.0.1:7400)")
      ->envname("SHARDCOORD_ADDR");
  app.add_option("--listen", options.listen,
                 "Address of the Worker service; port 0 picks a free one")
      ->capture_default_str();
  app.add_option("--name", options.name, "Stable worker name (default host:pid)");
  app.add_option("--http-listen", options.http_listen,
                 "host:port of an HTTP server for Prometheus metrics at /metrics (port 0: pick "
                 "a free one; default: off)");
  app.add_option("--host", options.host,
                 "Host reported to the coordinator: the planner prefers senders on a "
                 "destination's host (default $NODE_NAME, then the hostname)")
      ->capture_default_str();
  app.add_option("--backend", backend, "Communication backend")
      ->check(CLI::IsMember({"gloo", "nccl", "auto"}))
      ->capture_default_str();
  app.add_option("--device", device,
                 "The GPU this worker owns for the nccl backend: N or cuda:N (default: the "
                 "first device CUDA_VISIBLE_DEVICES leaves visible); cpu: host buffers, gloo");
  app.add_option("--gloo-host", options.gloo_host,
                 "Address Gloo binds and advertises (default: the --listen host, or --host "
                 "when that is a wildcard)");
  app.add_option("--same-host-copy", options.same_host_copy,
                 "Send big point-to-point messages to workers on this host by writing into "
                 "their memory with process_vm_writev instead of over loopback TCP, where the "
                 "peer allows it")
      ->capture_default_str();
  app.add_option("--step-timeout", step_timeout,
                 "How long one plan step may take when the plan gives no timeout")
      ->capture_default_str();
  app.add_option("--register-timeout", register_timeout,
                 "How long to keep trying to register with the coordinator at startup")
      ->capture_default_str();
  app.add_option("--token-file", token_file,
                 "File holding the bearer token (worker role) of a coordinator started with "
                 "--auth-tokens; trailing newlines and spaces are not part of the token");
  app.add_option("--tls-cert", tls_flags.cert,
                 "TLS: this worker's certificate (PEM; its CN or a SAN must be --name when the "
                 "coordinator requires client certificates), served and presented to the "
                 "coordinator; needs --tls-key and --tls-ca");
  app.add_option("--tls-key", tls_flags.key, "the private key of --tls-cert (PEM)");
  app.add_option("--tls-ca", tls_flags.ca,
                 "CA certificate (PEM) that verifies the coordinator's certificate");
  app.add_option("--tls-client-auth", tls_flags.client_auth,
                 "client certificates on the Worker service: none, request or require")
      ->capture_default_str();
  std::string local_socket = WorkerOptions::kDefaultLocalSocket;
  app.add_option("--local-socket", local_socket,
                 "Unix domain socket where user processes on this host attach their buffers "
                 "to attached tensors ({name}: the worker's name; 'off': none). When the "
                 "default's directory cannot be created, $TMPDIR/shardcoord-<uid>/ is used")
      ->capture_default_str();
  app.add_option("--checkpoint-root", options.checkpoint_root,
                 "An existing directory: checkpoints may only be saved to, loaded from and "
                 "inspected in paths under it (links resolved; others are refused with "
                 "PERMISSION_DENIED). Empty: any path the worker process may use");
  app.add_option("--local-group", options.local_group,
                 "A group (name or gid) whose processes may attach buffers, besides the "
                 "worker's own uid (checked with SO_PEERCRED)");
  app.add_flag("--insecure", options.insecure,
               "allow plaintext on a non-loopback --listen address (logs a warning)");
  app.add_option("--drain-timeout", drain_timeout,
                 "on SIGTERM: readiness turns NOT_SERVING, the worker tells the coordinator it "
                 "leaves, and plans it takes part in get this long to end before they are "
                 "aborted (chunks only it holds are first copied to a live replica where the "
                 "layout has one); then exit 0")
      ->capture_default_str();
  app.add_option("--health-listen", options.health_listen,
                 "host:port of a plaintext gRPC server that serves only grpc.health.v1.Health "
                 "(Kubernetes gRPC probes cannot speak TLS); the Worker port serves it too; "
                 "default: none");
  app.add_option("--memory-budget", memory_budget,
                 "Most bytes this worker holds in its buffers' memory (host memory for gloo, "
                 "the GPU's for nccl): committed buffers, buffers of plans in flight and "
                 "staging, not memory user processes lend. A byte size (4GiB, 512MiB, "
                 "1073741824) or a percentage (50%) of the host's physical memory (or its "
                 "cgroup's limit) for gloo, of the GPU's free memory at start for nccl. "
                 "Beyond it allocations fail with RESOURCE_EXHAUSTED naming the worker; the "
                 "coordinator admits plans only where they fit (default: 80%)");
  app.add_option("--bucket-bytes", bucket_bytes,
                 "Largest bucket of the plans this worker runs: transfers move as messages of "
                 "at most this size, and a plan stages at most 2 of them at once; the "
                 "coordinator lowers it per plan when a worker's free memory needs smaller ones")
      ->capture_default_str();
  app.add_option("--log-level", log_level, "trace, debug, info, warn, error")
      ->capture_default_str();
  app.footer(
      "Every flag can also come from the environment: --name from SHARDCOORD_NAME, --host from "
      "SHARDCOORD_HOST and so on (a flag on the command line wins; --coordinator reads "
      "SHARDCOORD_ADDR).\n"
      "grpc.health.v1.Health: service \"\" is SERVING while registered and not draining; "
      "\"liveness\" is SERVING until the process stops.");
  BindFlagsToEnvironment(app);
  CLI11_PARSE(app, argc, argv);
  options.local_socket_default = app.count("--local-socket") == 0;
  options.local_socket = local_socket == "off" ? "" : local_socket;
  if (!token_file.empty()) {
    absl::StatusOr<std::string> token = ReadTokenFile(token_file);
    if (!token.ok()) {
      std::fprintf(stderr, "--token-file: %s\n", std::string(token.status().message()).c_str());
      return 2;
    }
    options.token = *std::move(token);
  }
  absl::StatusOr<TlsOptions> tls = LoadDaemonTls(tls_flags);
  if (!tls.ok()) {
    std::fprintf(stderr, "%s\n", std::string(tls.status().message()).c_str());
    return 2;
  }
  options.tls = *std::move(tls);
  if (absl::Status plain =
          CheckPlaintextListen("listen", options.listen, options.tls.enabled(), options.insecure);
      !plain.ok()) {
    std::fprintf(stderr, "%s\n", std::string(plain.message()).c_str());
    return 2;
  }
  absl::StatusOr<MemoryBudgetSetting> budget = ParseMemoryBudgetFlag(memory_budget);
  if (!budget.ok()) {
    std::fprintf(stderr, "%s\n", std::string(budget.status().message()).c_str());
    return 2;
  }
  options.memory_budget = *budget;
  if (absl::Status s = ParseByteSizeFlag("bucket-bytes", bucket_bytes, &options.bucket_bytes);
      !s.ok() || options.bucket_bytes <= 0) {
    std::fprintf(
        stderr, "%s\n",
        s.ok() ? "--bucket-bytes: must be more than 0 bytes" : std::string(s.message()).c_str());
    return 2;
  }
  if (!options.name.empty()) {
    if (absl::Status s = shardcoord::ValidateWorkerName(options.name, "--name"); !s.ok()) {
      std::fprintf(stderr, "%s\n", std::string(s.message()).c_str());
      return 2;
    }
  }
  absl::Duration drain = absl::ZeroDuration();
  absl::Status durations = ParseDurationFlag("step-timeout", step_timeout, &options.step_timeout);
  if (durations.ok()) {
    durations = ParseDurationFlag("register-timeout", register_timeout, &options.register_timeout);
  }
  if (durations.ok()) durations = ParseDurationFlag("drain-timeout", drain_timeout, &drain);
  if (!durations.ok()) {
    std::fprintf(stderr, "%s\n", std::string(durations.message()).c_str());
    return 2;
  }

  auto logger = spdlog::stderr_color_mt("worker");
  spdlog::set_default_logger(logger);
  shardcoord::RouteProtobufLogsToSpdlog();  // Malformed requests must not flood the log.
  spdlog::set_level(spdlog::level::from_str(log_level));

  // Backend choice comes first: its log line is the first one.
  absl::StatusOr<BackendSelection> selection = SelectBackend(
      backend, device, [](absl::string_view line) { spdlog::info("{}", std::string(line)); });
  if (!selection.ok()) {  // e.g. "no CUDA device visible: ..."
    std::fprintf(stderr, "%s\n", std::string(selection.status().message()).c_str());
    return 2;
  }
  options.backend = *std::move(selection);

  // Block the shutdown signals in every thread; main waits for them with sigwait.
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGTERM);
  sigaddset(&signals, SIGINT);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);

  Worker worker(options);
  absl::StatusOr<std::string> address = worker.Start();
  if (!address.ok()) {
    spdlog::error("{}", std::string(address.status().message()));
    return 1;
  }
  // The metrics line comes first: whoever waits for the listening line has both.
  if (!worker.http_address().empty()) {
    std::printf("worker %s metrics on http://%s/metrics\n", worker.name().c_str(),
                worker.http_address().c_str());
    spdlog::info("metrics on http://{}/metrics", worker.http_address());
  }
  if (!worker.health_address().empty()) {
    std::printf("worker %s health on %s\n", worker.name().c_str(), worker.health_address().c_str());
  }
  std::printf("worker %s listening on %s\n", worker.name().c_str(), address->c_str());
  std::fflush(stdout);

  int sig = 0;
  sigwait(&signals, &sig);
  if (sig == SIGTERM) {
    spdlog::info("SIGTERM: draining (drain timeout {})", drain_timeout);
    worker.Drain(drain);
  } else {
    spdlog::info("signal {}: shutting down", sig);
  }
  if (!worker.Shutdown(absl::Seconds(2))) {
    // A fragment is stuck in a step; its thread references the worker.
    spdlog::warn("a plan fragment is still running; exiting without waiting for it");
    spdlog::shutdown();
    std::fflush(nullptr);
    _exit(0);
  }
  spdlog::info("stopped");
  return 0;
}

}  // namespace
}  // namespace shardcoord

int main(int argc, char** argv) { return shardcoord::Main(argc, argv); }
