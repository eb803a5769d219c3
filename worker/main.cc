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
// to stderr. SIGTERM or SIGINT shuts it down cleanly.

#include <grpcpp/grpcpp.h>
#include <signal.h>
#include <spdlog/sinks/stdout_color_sinks.h>
#include <spdlog/spdlog.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "common/duration_flag.h"
#include "worker/agent.h"
#include "worker/backends/gloo/gloo_communicator.h"
#include "worker/buffer_store.h"
#include "worker/communicator.h"
#include "worker/backends/nccl/gpu_probe.h"
#include "worker/grpc_coordinator_client.h"
#include "worker/memory_space.h"
#include "worker/thread_pool.h"
#include "worker/worker_core.h"
#include "worker/worker_service.h"

#ifdef SHARDCOORD_HAVE_CUDA
#include "worker/backends/nccl/cuda_memory_space.h"
#include "worker/backends/nccl/nccl_backend.h"
#endif

namespace shardcoord {
namespace {

std::string HostName() {
  char buf[256] = {};
  if (gethostname(buf, sizeof(buf) - 1) != 0) return "localhost";
  return buf;
}

// "host:port" -> host ("[::1]:5" -> "::1").
std::string HostOf(const std::string& address) {
  const size_t colon = address.rfind(':');
  std::string host = colon == std::string::npos ? address : address.substr(0, colon);
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']') {
    host = host.substr(1, host.size() - 2);
  }
  return host;
}

bool IsWildcard(const std::string& host) {
  return host.empty() || host == "0.0.0.0" || host == "::" || host == "*";
}

std::string JoinHostPort(const std::string& host, int port) {
  if (absl::StrContains(host, ':')) return absl::StrCat("[", host, "]:", port);
  return absl::StrCat(host, ":", port);
}

int Main(int argc, char** argv) {
  const char* env_addr = std::getenv("SHARDCOORD_ADDR");
  std::string coordinator = env_addr != nullptr && *env_addr ? env_addr : "127.0.0.1:7400";
  std::string listen = "127.0.0.1:0";
  std::string name;
  std::string host = HostName();
  std::string backend = "auto";
  std::string device;
  std::string gloo_host;
  bool same_host_copy = true;
  // Durations as the coordinator's flags take them: 60s, 500ms, 2m.
  std::string step_timeout = "60s", register_timeout = "60s";
  std::string log_level = "info";

  CLI::App app{"shardcoord worker: holds chunk buffers and executes plan fragments"};
  app.add_option("--coordinator", coordinator,
                 "Coordinator address (default $SHARDCOORD_ADDR, then 127.0.0.1:7400)");
  app.add_option("--listen", listen, "Address of the Worker service; port 0 picks a free one")
      ->capture_default_str();
  app.add_option("--name", name, "Stable worker name (default host:pid)");
  app.add_option("--host", host, "Host name reported to the coordinator")->capture_default_str();
  app.add_option("--backend", backend, "Communication backend")
      ->check(CLI::IsMember({"gloo", "nccl", "auto"}))
      ->capture_default_str();
  app.add_option("--device", device,
                 "The GPU this worker owns for the nccl backend: N or cuda:N (default: the "
                 "first device CUDA_VISIBLE_DEVICES leaves visible); cpu: host buffers, gloo");
  app.add_option("--gloo-host", gloo_host,
                 "Address Gloo binds and advertises (default: the --listen host, or --host "
                 "when that is a wildcard)");
  app.add_option("--same-host-copy", same_host_copy,
                 "Move big point-to-point messages to and from workers on this host with "
                 "process_vm_readv instead of loopback TCP, where the peer allows it")
      ->capture_default_str();
  app.add_option("--step-timeout", step_timeout,
                 "How long one plan step may take when the plan gives no timeout")
      ->capture_default_str();
  app.add_option("--register-timeout", register_timeout,
                 "How long to keep trying to register with the coordinator at startup")
      ->capture_default_str();
  app.add_option("--log-level", log_level, "trace, debug, info, warn, error")
      ->capture_default_str();
  CLI11_PARSE(app, argc, argv);
  absl::Duration step_timeout_d, register_timeout_d;
  absl::Status durations = ParseDurationFlag("step-timeout", step_timeout, &step_timeout_d);
  if (durations.ok()) {
    durations = ParseDurationFlag("register-timeout", register_timeout, &register_timeout_d);
  }
  if (!durations.ok()) {
    std::fprintf(stderr, "%s\n", std::string(durations.message()).c_str());
    return 2;
  }

  auto logger = spdlog::stderr_color_mt("worker");
  spdlog::set_default_logger(logger);
  spdlog::set_level(spdlog::level::from_str(log_level));

  // Backend choice comes first: its log line is the first one.
  absl::StatusOr<DeviceFlag> device_flag = ParseDeviceFlag(device);
  if (!device_flag.ok()) {
    std::fprintf(stderr, "%s\n", std::string(device_flag.status().message()).c_str());
    return 2;
  }
  BackendChoice choice;
  if (device_flag->cpu) {
    if (backend == "nccl") {
      std::fprintf(stderr, "--device cpu: the nccl backend needs a CUDA device\n");
      return 2;
    }
    choice.log_line = backend == "auto" ? "backend auto: --device cpu, using gloo"
                                        : "backend gloo: selected by --backend";
  } else {
    absl::StatusOr<BackendChoice> chosen = ChooseBackend(backend);
    if (!chosen.ok()) {  // "no CUDA device visible: ..."
      std::fprintf(stderr, "%s\n", std::string(chosen.status().message()).c_str());
      return 2;
    }
    choice = *std::move(chosen);
  }
  spdlog::info("{}", choice.log_line);
  int gpu = -1;
  if (choice.backend == Backend::kNccl) {
    absl::StatusOr<int> resolved = ResolveDevice(device_flag->index, choice.visible_devices);
    if (!resolved.ok()) {
      spdlog::error("{}", std::string(resolved.status().message()));
      return 2;
    }
    gpu = *resolved;
#ifndef SHARDCOORD_HAVE_CUDA
    // Unreachable: without the toolkit the probe finds no device.
    spdlog::error("the nccl backend is not built into this worker (no CUDA toolkit at build time)");
    return 2;
#endif
  }
  backend = choice.backend == Backend::kNccl ? "nccl" : "gloo";
  const std::string device_name = gpu >= 0 ? absl::StrCat("cuda:", gpu) : "cpu";
  if (name.empty()) name = absl::StrCat(host, ":", getpid());

  // Block the shutdown signals in every thread; main waits for them with sigwait.
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGTERM);
  sigaddset(&signals, SIGINT);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);

  std::unique_ptr<GrpcCoordinatorClient> client = GrpcCoordinatorClient::Connect(coordinator);
  const std::string listen_host = HostOf(listen);
  if (gloo_host.empty()) gloo_host = IsWildcard(listen_host) ? host : listen_host;
  // NCCL: buffers in the GPU's memory, communicators on it. Gloo: host memory.
  std::unique_ptr<MemorySpace> device_space;
  std::shared_ptr<CommunicatorFactory> factory;
  if (gpu >= 0) {
#ifdef SHARDCOORD_HAVE_CUDA
    absl::StatusOr<std::unique_ptr<nccl::CudaMemorySpace>> space =
        nccl::CudaMemorySpace::Create(gpu);
    if (!space.ok()) {
      spdlog::error("{}", space.status().ToString());
      return 1;
    }
    device_space = *std::move(space);
    nccl::NcclFactoryOptions nccl_options;
    nccl_options.device = gpu;
    // The client outlives every communicator: no ownership.
    factory = nccl::MakeNcclCommunicatorFactory(
        std::shared_ptr<KvClient>(std::shared_ptr<void>(), client.get()), nccl_options);
#endif
  } else {
    absl::StatusOr<std::shared_ptr<GlooCommunicatorFactory>> gloo =
        GlooCommunicatorFactory::Create(client.get(), GlooOptions{gloo_host, same_host_copy});
    if (!gloo.ok()) {
      spdlog::error("{}", gloo.status().ToString());
      return 1;
    }
    factory = *std::move(gloo);
  }
  CommunicatorCache communicators(factory);
  BufferStore buffers;
  ThreadPool pool(2);

  AgentOptions agent_options;
  agent_options.registration.set_name(name);
  agent_options.registration.set_host(host);
  agent_options.registration.set_device(device_name);
  agent_options.registration.set_backend(backend);
  agent_options.log = [](absl::string_view line) { spdlog::info("{}", std::string(line)); };

  ExecutorOptions executor_options;
  executor_options.default_step_timeout = step_timeout_d;
  std::unique_ptr<Agent> agent;
  WorkerCore core(
      &buffers, &communicators, client.get(),
      [&agent, name] {
        return agent != nullptr ? agent->identity() : WorkerIdentity{name, 0, -1};
      },
      executor_options, [](absl::string_view line) { spdlog::info("{}", std::string(line)); },
      device_space.get());
  WorkerServiceImpl service(&core, &pool);

  grpc::ServerBuilder builder;
  int port = 0;
  builder.AddListeningPort(listen, grpc::InsecureServerCredentials(), &port);
  builder.SetMaxReceiveMessageSize(256 << 20);
  builder.SetMaxSendMessageSize(256 << 20);
  builder.RegisterService(&service);
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  if (server == nullptr || port == 0) {
    spdlog::error("cannot listen on {}", listen);
    return 1;
  }
  const std::string address = JoinHostPort(IsWildcard(listen_host) ? host : listen_host, port);
  agent_options.registration.set_address(address);

  agent = std::make_unique<Agent>(client.get(), agent_options);
  absl::Status registered = agent->Start(register_timeout_d);
  if (!registered.ok()) {
    spdlog::error("cannot register with the coordinator at {}: {}", coordinator,
                  registered.ToString());
    server->Shutdown(std::chrono::system_clock::now());
    return 1;
  }
  if (gpu >= 0) {
    spdlog::info("worker {} (nccl on {}, buffers in {}) serving on {}, coordinator {}", name,
                 device_name, device_space->name(), address, coordinator);
  } else {
    spdlog::info("worker {} (gloo on {}, same-host copy {}) serving on {}, coordinator {}",
                 name, gloo_host, same_host_copy ? "on" : "off", address, coordinator);
  }
  std::printf("worker %s listening on %s\n", name.c_str(), address.c_str());
  std::fflush(stdout);

  int sig = 0;
  sigwait(&signals, &sig);
  spdlog::info("signal {}: shutting down", sig);
  agent->Stop();
  server->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(2));
  if (!core.Shutdown(absl::Seconds(2))) {
    // A fragment is stuck in a step; its thread references everything above.
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
