// A multi-host cluster on one machine: a coordinator and three "hosts", each its own network
// namespace (and PID and mount namespace, as a container would be) on two bridges, a control
// network (gRPC to the coordinator) and a data network (Gloo between workers, rate-limited with
// tbf), with names resolved through /etc/netns/NAME/hosts as a cluster's DNS would. Two workers
// per host. The workers run from the image's root filesystem (deploy/image/build.sh) when
// $SHARDCOORD_TEST_ROOTFS names it (tools/test.sh does), chrooted into it with this build's
// worker binary bind-mounted over the image's; otherwise from bazel-bin. Needs root; skipped
// with a message where network namespaces cannot be made. Every namespace, link and file it
// makes carries this run's id and is removed when it ends, also on failure.

#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <map>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/strip.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "client/coordinator_client.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "proto/shardcoord.pb.h"
#include "tests/cluster.h"
#include "tests/process.h"
#include "tests/tensor_check.h"

namespace shardcoord {
namespace {

using ::testing::AnyOf;
using ::testing::HasSubstr;

constexpr absl::Duration kHeartbeatTimeout = absl::Seconds(2);
constexpr absl::Duration kHeartbeatInterval = absl::Milliseconds(200);
// On top of the heartbeat timeout: the coordinator's check period and the abort round trips.
constexpr absl::Duration kAbortSlack = absl::Seconds(3);
// Inter-host data links: slow enough that a plan is still moving bytes when a host is cut.
constexpr char kDataRate[] = "20mbit";
const std::vector<std::string> kHosts = {"host-a", "host-b", "host-c"};

// Runs a shell command; its output goes to our stderr (the test log). Returns the exit code.
int Sh(const std::string& command) {
  const int rc = std::system(absl::StrCat(command, " 1>&2").c_str());
  return WIFEXITED(rc) ? WEXITSTATUS(rc) : -1;
}

// The first line a command prints.
std::string ShOut(const std::string& command) {
  std::string out;
  if (FILE* f = popen(command.c_str(), "r"); f != nullptr) {
    char buf[256];
    if (fgets(buf, sizeof(buf), f) != nullptr) out = buf;
    pclose(f);
  }
  return std::string(absl::StripAsciiWhitespace(out));
}

int64_t ReadCounter(const std::string& path) {
  std::ifstream in(path);
  int64_t v = -1;
  in >> v;
  return v;
}

// One "host": a network namespace with a control and a data link, and a PID + mount
// namespace whose init (a sleep) the workers join with nsenter.
struct Host {
  std::string name;      // host-a
  std::string netns;     // sc1234-a
  std::string ctl_ip;    // 10.X.Y.10
  std::string data_ip;   // 10.X.Y.138
  std::string ctl_link;  // Root-side ends of the veth pairs.
  std::string data_link;
  std::unique_ptr<Process> sandbox;
  pid_t init = 0;  // Host PID of the namespace's init.
};

struct Worker {
  std::string name;
  int host = 0;
  std::unique_ptr<Process> process;  // nsenter, whose child is the worker.
};

class MultiHostCluster {
 public:
  ~MultiHostCluster() { TearDown(); }

  // Empty when it is up; otherwise why the test is skipped ("skip: ...") or failed.
  std::string SetUp() {
    if (geteuid() != 0) return "skip: needs root (network namespaces)";
    const int pid = getpid();
    id_ = absl::StrCat("sc", pid % 100000);
    const int a = 64 + pid % 128, b = (pid / 128) % 256;
    net_ = absl::StrCat("10.", a, ".", b, ".");
    probe_ = id_ + "-probe";
    if (Sh(absl::StrCat("ip netns add ", probe_)) != 0) {
      return "skip: cannot create a network namespace here (ip netns add failed)";
    }
    Sh(absl::StrCat("ip netns del ", probe_));
    probe_.clear();
    absl::StatusOr<std::string> coordinator_bin = RunfilePath("coordinator/coordinator");
    absl::StatusOr<std::string> worker_bin = RunfilePath("worker/worker");
    if (!coordinator_bin.ok() || !worker_bin.ok()) return "daemon binaries not in runfiles";
    worker_bin_ = *worker_bin;
    if (const char* r = std::getenv("SHARDCOORD_TEST_ROOTFS"); r != nullptr && *r) rootfs_ = r;
    if (!rootfs_.empty()) {
      struct stat st;
      if (stat((rootfs_ + "/usr/local/bin/shardcoord-worker").c_str(), &st) != 0) {
        return absl::StrCat("$SHARDCOORD_TEST_ROOTFS=", rootfs_,
                            " has no /usr/local/bin/shardcoord-worker (build it with "
                            "deploy/image/build.sh --rootfs DIR)");
      }
      std::fprintf(stderr, "multihost: workers run from the image root filesystem %s\n",
                   rootfs_.c_str());
    } else {
      std::fprintf(stderr,
                   "multihost: workers run from bazel-bin ($SHARDCOORD_TEST_ROOTFS not set)\n");
    }

    // Two bridges in the root namespace; the control one carries the coordinator's address.
    ctl_bridge_ = id_ + "c";
    data_bridge_ = id_ + "d";
    coordinator_ip_ = net_ + "1";
    for (const std::string& br : {ctl_bridge_, data_bridge_}) {
      if (Sh(absl::StrCat("ip link add ", br, " type bridge && ip link set ", br, " up")) != 0) {
        return "cannot create bridges";
      }
    }
    if (Sh(absl::StrCat("ip addr add ", coordinator_ip_, "/25 dev ", ctl_bridge_)) != 0) {
      return "cannot address the control bridge";
    }
    std::string hosts_file =
        absl::StrCat("127.0.0.1 localhost\n", coordinator_ip_, " coordinator\n");
    for (size_t i = 0; i < kHosts.size(); ++i) {
      Host h;
      h.name = kHosts[i];
      h.netns = absl::StrCat(id_, "-", std::string(1, h.name.back()));
      h.ctl_ip = absl::StrCat(net_, 10 + i);
      h.data_ip = absl::StrCat(net_, 138 + i);
      h.ctl_link = absl::StrCat(id_, std::string(1, h.name.back()), "c");
      h.data_link = absl::StrCat(id_, std::string(1, h.name.back()), "d");
      absl::StrAppend(&hosts_file, h.ctl_ip, " ", h.name, "\n");
      hosts_.push_back(std::move(h));
    }
    for (Host& h : hosts_) {
      const std::string ns = h.netns;
      const std::string cmds[] = {
          absl::StrCat("ip netns add ", ns),
          absl::StrCat("ip netns exec ", ns, " ip link set lo up"),
          absl::StrCat("ip link add ", h.ctl_link, " type veth peer name ", h.ctl_link, "n"),
          absl::StrCat("ip link add ", h.data_link, " type veth peer name ", h.data_link, "n"),
          absl::StrCat("ip link set ", h.ctl_link, "n netns ", ns),
          absl::StrCat("ip link set ", h.data_link, "n netns ", ns),
          absl::StrCat("ip link set ", h.ctl_link, " master ", ctl_bridge_, " up"),
          absl::StrCat("ip link set ", h.data_link, " master ", data_bridge_, " up"),
          absl::StrCat("ip netns exec ", ns, " ip addr add ", h.ctl_ip, "/25 dev ", h.ctl_link,
                       "n"),
          absl::StrCat("ip netns exec ", ns, " ip addr add ", h.data_ip, "/25 dev ", h.data_link,
                       "n"),
          absl::StrCat("ip netns exec ", ns, " ip link set ", h.ctl_link, "n up"),
          absl::StrCat("ip netns exec ", ns, " ip link set ", h.data_link, "n up"),
          // Inter-host data rate limits, both ways.
          absl::StrCat("tc qdisc add dev ", h.data_link, " root tbf rate ", kDataRate,
                       " burst 32kb latency 400ms"),
          absl::StrCat("ip netns exec ", ns, " tc qdisc add dev ", h.data_link, "n root tbf rate ",
                       kDataRate, " burst 32kb latency 400ms"),
          absl::StrCat("mkdir -p /etc/netns/", ns),
      };
      for (const std::string& c : cmds) {
        if (Sh(c) != 0) return absl::StrCat("setup command failed: ", c);
      }
      std::ofstream(absl::StrCat("/etc/netns/", ns, "/hosts")) << hosts_file;
      if (std::string err = StartSandbox(h); !err.empty()) return err;
    }
    StartJanitor();

    std::vector<std::string> argv = {
        *coordinator_bin,
        "--listen",
        coordinator_ip_ + ":0",
        "--insecure",
        "--state",
        "memory",
        "--http-listen",
        "off",
        absl::StrCat("--heartbeat-timeout=", absl::ToInt64Milliseconds(kHeartbeatTimeout), "ms"),
        absl::StrCat("--heartbeat-interval=", absl::ToInt64Milliseconds(kHeartbeatInterval), "ms")};
    ProcessOptions po;
    po.name = "coordinator";
    absl::StatusOr<std::unique_ptr<Process>> coordinator = Process::Start(argv, po);
    if (!coordinator.ok()) return coordinator.status().ToString();
    coordinator_ = *std::move(coordinator);
    absl::StatusOr<std::string> line =
        coordinator_->WaitForLine("coordinator listening on", absl::Seconds(30));
    if (!line.ok()) return line.status().ToString();
    absl::StatusOr<std::string> address = AddressAfter(*line, "listening on");
    if (!address.ok()) return address.status().ToString();
    port_ = address->substr(address->rfind(':') + 1);
    coordinator_address_ = *address;
    client_ = std::make_unique<CoordinatorClient>(*address);

    for (size_t i = 0; i < hosts_.size(); ++i) {
      for (int k = 0; k < 2; ++k) {
        Worker w;
        w.name = absl::StrCat("w-", std::string(1, hosts_[i].name.back()), k);
        w.host = static_cast<int>(i);
        workers_.push_back(std::move(w));
      }
    }
    for (Worker& w : workers_) {
      if (std::string err = StartWorker(w); !err.empty()) return err;
    }
    std::vector<std::string> names;
    for (const Worker& w : workers_) names.push_back(w.name);
    if (absl::Status s = WaitForWorkers(names, v1::ALIVE, absl::Seconds(60)); !s.ok()) {
      return s.ToString();
    }
    return "";
  }

  // What TearDown removes, as shell commands (errors ignored).
  std::string CleanupScript() const {
    std::string script;
    for (const Host& h : hosts_) {
      absl::StrAppend(&script, "ip netns del ", h.netns, "; ip link del ", h.ctl_link,
                      "; ip link del ", h.data_link, "; rm -rf /etc/netns/", h.netns, "; ");
    }
    for (const std::string& br : {ctl_bridge_, data_bridge_}) {
      if (!br.empty()) absl::StrAppend(&script, "ip link del ", br, "; ");
    }
    return script;
  }

  // A detached process that removes everything if this one dies without its TearDown
  // (killed at a Bazel timeout): it checks once a second whether we are still there.
  void StartJanitor() {
    Sh(absl::StrCat("setsid sh -c 'while kill -0 ", getpid(), " 2>/dev/null; do sleep 1; done; ",
                    CleanupScript(), "' >/dev/null 2>&1 < /dev/null &"));
  }

  void TearDown() {
    // Killing a sandbox kills its namespace's init, and with it every worker in it.
    for (Host& h : hosts_) h.sandbox.reset();
    workers_.clear();
    coordinator_.reset();
    for (Host& h : hosts_) {
      Sh(absl::StrCat("ip netns del ", h.netns, " 2>/dev/null; ip link del ", h.ctl_link,
                      " 2>/dev/null; ip link del ", h.data_link, " 2>/dev/null; rm -rf /etc/netns/",
                      h.netns));
    }
    hosts_.clear();
    for (const std::string& br : {ctl_bridge_, data_bridge_}) {
      if (!br.empty()) Sh(absl::StrCat("ip link del ", br, " 2>/dev/null"));
    }
    if (!probe_.empty()) Sh(absl::StrCat("ip netns del ", probe_, " 2>/dev/null"));
    ctl_bridge_.clear();
    data_bridge_.clear();
  }

  CoordinatorClient& client() { return *client_; }
  const std::string& coordinator_address() const { return coordinator_address_; }
  const std::vector<Worker>& workers() const { return workers_; }
  const Host& host(int i) const { return hosts_[i]; }
  std::vector<std::string> Names(const std::vector<int>& hosts) const {
    std::vector<std::string> out;
    for (const Worker& w : workers_) {
      for (int h : hosts) {
        if (w.host == h) out.push_back(w.name);
      }
    }
    return out;
  }

  // Bytes the data network delivered into host `i` (the root-side end's transmit counter).
  int64_t DataBytesInto(int i) const {
    return ReadCounter(
        absl::StrCat("/sys/class/net/", hosts_[i].data_link, "/statistics/tx_bytes"));
  }
  // Bytes that went over host `i`'s loopback (TCP between its own workers).
  int64_t LoopbackBytes(int i) const {
    int64_t v = -1;
    if (!absl::SimpleAtoi(ShOut(absl::StrCat("ip netns exec ", hosts_[i].netns,
                                             " cat /sys/class/net/lo/statistics/tx_bytes")),
                          &v)) {
      return -1;
    }
    return v;
  }

  // Cuts host `i` off both networks (as a failed switch port) or brings it back.
  void SetLinks(int i, bool up) {
    const char* state = up ? "up" : "down";
    Sh(absl::StrCat("ip link set ", hosts_[i].ctl_link, " ", state, " && ip link set ",
                    hosts_[i].data_link, " ", state));
  }

  // The worker daemon's own PID (the child of its nsenter).
  pid_t WorkerPid(const std::string& name) const {
    for (const Worker& w : workers_) {
      if (w.name != name || w.process == nullptr) continue;
      const pid_t n = w.process->pid();
      int64_t child = 0;
      if (absl::SimpleAtoi(ShOut(absl::StrCat("cat /proc/", n, "/task/", n, "/children")),
                           &child)) {
        return static_cast<pid_t>(child);
      }
    }
    return 0;
  }
  Process* WorkerProcess(const std::string& name) {
    for (Worker& w : workers_) {
      if (w.name == name) return w.process.get();
    }
    return nullptr;
  }

  absl::Status WaitForWorkers(const std::vector<std::string>& names, v1::WorkerState state,
                              absl::Duration timeout) {
    const absl::Time deadline = absl::Now() + timeout;
    std::string last;
    while (absl::Now() < deadline) {
      absl::StatusOr<std::vector<v1::WorkerInfo>> list = client_->ListWorkers();
      if (list.ok()) {
        int n = 0;
        last.clear();
        for (const v1::WorkerInfo& w : *list) {
          absl::StrAppend(&last, w.name(), "=", v1::WorkerState_Name(w.state()), " ");
          for (const std::string& want : names) n += w.name() == want && w.state() == state;
        }
        if (n == static_cast<int>(names.size())) return absl::OkStatus();
      }
      absl::SleepFor(absl::Milliseconds(50));  // Polling the coordinator's view, not a wait.
    }
    return absl::DeadlineExceededError(
        absl::StrCat("workers not ", v1::WorkerState_Name(state), " in time: ", last));
  }

 private:
  std::string StartSandbox(Host& h) {
    std::string script = "set -e; ";
    if (rootfs_.empty()) {
      absl::StrAppend(&script, "mount -t proc proc /proc; echo ready; exec sleep 100000");
    } else {
      absl::StrAppend(&script, "mount -t proc proc ", rootfs_, "/proc; mount --bind /etc/netns/",
                      h.netns, "/hosts ", rootfs_, "/etc/hosts; mount --bind ", worker_bin_, " ",
                      rootfs_, "/usr/local/bin/shardcoord-worker; echo ready; exec chroot ",
                      rootfs_, " /bin/sleep 100000");
    }
    ProcessOptions po;
    po.name = h.name;
    absl::StatusOr<std::unique_ptr<Process>> p =
        Process::Start({"/usr/sbin/ip", "netns", "exec", h.netns, "unshare", "--pid", "--fork",
                        "--kill-child", "--mount", "--propagation", "private", "sh", "-c", script},
                       po);
    if (!p.ok()) return p.status().ToString();
    h.sandbox = *std::move(p);
    if (absl::StatusOr<std::string> ready = h.sandbox->WaitForLine("ready", absl::Seconds(20));
        !ready.ok()) {
      return absl::StrCat(h.name, ": sandbox did not start: ", ready.status().ToString());
    }
    const pid_t u = h.sandbox->pid();
    for (int i = 0; i < 200 && h.init == 0; ++i) {
      int64_t child = 0;
      if (absl::SimpleAtoi(ShOut(absl::StrCat("cat /proc/", u, "/task/", u, "/children")),
                           &child)) {
        h.init = static_cast<pid_t>(child);
      } else {
        absl::SleepFor(absl::Milliseconds(10));
      }
    }
    return h.init != 0 ? "" : absl::StrCat(h.name, ": no init process in its namespace");
  }

  std::string StartWorker(Worker& w) {
    const Host& h = hosts_[w.host];
    const std::string bin = rootfs_.empty() ? worker_bin_ : "/usr/local/bin/shardcoord-worker";
    std::vector<std::string> argv = {"/usr/bin/nsenter",
                                     "--target",
                                     absl::StrCat(h.init),
                                     "--pid",
                                     "--mount",
                                     "--net",
                                     "--root",
                                     "--wd",
                                     "--",
                                     bin};
    for (std::string a : std::vector<std::string>{
             "--coordinator=coordinator:" + port_, "--listen=" + h.ctl_ip + ":0",
             "--gloo-host=" + h.data_ip, "--host=" + h.name, "--name=" + w.name, "--backend=gloo",
             "--insecure", "--drain-timeout=20s"}) {
      argv.push_back(std::move(a));
    }
    ProcessOptions po;
    po.name = w.name;
    absl::StatusOr<std::unique_ptr<Process>> p = Process::Start(argv, po);
    if (!p.ok()) return p.status().ToString();
    w.process = *std::move(p);
    if (absl::StatusOr<std::string> line =
            w.process->WaitForLine("listening on", absl::Seconds(60));
        !line.ok()) {
      return absl::StrCat(w.name, ": ", line.status().ToString());
    }
    return "";
  }

  std::string id_, net_, probe_, rootfs_, worker_bin_;
  std::string ctl_bridge_, data_bridge_, coordinator_ip_, port_, coordinator_address_;
  std::vector<Host> hosts_;
  std::vector<Worker> workers_;
  std::unique_ptr<Process> coordinator_;
  std::unique_ptr<CoordinatorClient> client_;
};

// One cluster for every test of the binary, started on the main thread (its processes die
// with it), in test order: moves, a host cut off, a drain.
MultiHostCluster* cluster = nullptr;
std::string skip_reason;

class MultiHostEnvironment : public ::testing::Environment {
 public:
  void SetUp() override {
    cluster = new MultiHostCluster();
    std::string err = cluster->SetUp();
    if (absl::StartsWith(err, "skip: ")) {
      skip_reason = err.substr(6);
      std::fprintf(stderr, "multihost: SKIPPED: %s\n", skip_reason.c_str());
      delete cluster;
      cluster = nullptr;
      return;
    }
    if (!err.empty()) {
      delete cluster;
      cluster = nullptr;
      FAIL() << "multi-host cluster did not start: " << err;
    }
  }
  void TearDown() override {
    delete cluster;
    cluster = nullptr;
  }
};

#define REQUIRE_CLUSTER()                                       \
  do {                                                          \
    if (!skip_reason.empty()) GTEST_SKIP() << skip_reason;      \
    ASSERT_NE(cluster, nullptr) << "the cluster did not start"; \
  } while (0)

v1::PlanRequest PlanTo(const std::string& tensor, const std::string& mesh,
                       const std::string& placements) {
  v1::PlanRequest r;
  r.set_tensor(tensor);
  *r.mutable_target() = SpecFromText(mesh, placements);
  return r;
}

// Meshes: "ab" 2x2 over hosts a and b, "all" 3x2 (host, gpu) over every worker.
void MakeMeshes() {
  static bool made = false;
  if (made) return;
  CoordinatorClient& c = cluster->client();
  ASSERT_TRUE(MakeMesh(c, "ab", {2, 2}, cluster->Names({0, 1}), {"host", "gpu"}).ok());
  ASSERT_TRUE(MakeMesh(c, "all", {3, 2}, cluster->Names({0, 1, 2}), {"host", "gpu"}).ok());
  made = true;
}

TEST(MultiHostTest, CrossHostMovesCheckEveryValueAndCrossOnlyWhatTheyMust) {
  REQUIRE_CLUSTER();
  MakeMeshes();
  CoordinatorClient& c = cluster->client();
  // 3 MiB, whole on host a and again on host b (each host's two workers hold column halves).
  const Shape shape = {768, 1024};
  ASSERT_TRUE(CreateFilled(c, "t", shape, DType::kF32, "ab", "R,S(1)").ok());

  // To every worker, S(0) by host: hosts a and b have their rows locally, host c's third
  // must cross, and only that.
  absl::StatusOr<v1::Plan> plan = c.PlanRedistribute(PlanTo("t", "all", "S(0),S(1)"));
  ASSERT_TRUE(plan.ok()) << plan.status();
  const int64_t third = 768 * 1024 * 4 / 3;
  EXPECT_EQ(plan->cross_host_lower_bound_bytes(), third);
  EXPECT_EQ(plan->bytes_across_hosts(), third);
  EXPECT_THAT(plan->explain(), HasSubstr(absl::StrCat(third, " across hosts")));
  std::vector<int64_t> before;
  for (int h = 0; h < 3; ++h) before.push_back(cluster->DataBytesInto(h));
  absl::StatusOr<v1::RedistributeResponse> moved =
      c.Redistribute(RedistributeTo("t", "all", "S(0),S(1)"));
  ASSERT_TRUE(moved.ok()) << moved.status();
  ASSERT_EQ(moved->progress().state(), v1::COMMITTED) << moved->progress().error();
  EXPECT_EQ(moved->plan().bytes_across_hosts(), third);
  ASSERT_TRUE(DownloadAndCheck(c, "t", DType::kF32, shape, FillKind::kArange).ok());
  // What the data network carried matches the plan: host c received its third (plus TCP/IP
  // headers, ~3%, and Gloo's connection setup); hosts a and b only acknowledgements.
  const int64_t into_c = cluster->DataBytesInto(2) - before[2];
  EXPECT_GE(into_c, third);
  EXPECT_LE(into_c, third + third / 10 + (128 << 10));
  for (int h : {0, 1}) {
    EXPECT_LE(cluster->DataBytesInto(h) - before[h], third / 10 + (128 << 10)) << "host " << h;
  }

  // Gather to w-c0: host c's other worker hands over its sixth on the host (a same-host
  // copy, so hardly any loopback bytes), the other four sixths cross.
  absl::StatusOr<std::vector<v1::WorkerInfo>> workers = c.ListWorkers();
  ASSERT_TRUE(workers.ok());
  int64_t c0_rank = -1;
  for (const v1::WorkerInfo& w : *workers) {
    if (w.name() == "w-c0") c0_rank = w.rank();
  }
  const int64_t loopback_before = cluster->LoopbackBytes(2);
  const int64_t into_c_before = cluster->DataBytesInto(2);
  v1::GatherRequest gather;
  gather.set_tensor("t");
  gather.set_to_rank(c0_rank);
  gather.set_has_to_rank(true);
  gather.set_wait(true);
  absl::StatusOr<v1::RedistributeResponse> gathered = c.Gather(gather);
  ASSERT_TRUE(gathered.ok()) << gathered.status();
  ASSERT_EQ(gathered->progress().state(), v1::COMMITTED) << gathered->progress().error();
  const int64_t sixth = 768 * 1024 * 4 / 6;
  EXPECT_EQ(gathered->plan().bytes_within_hosts(), sixth);
  EXPECT_EQ(gathered->plan().bytes_across_hosts(), 4 * sixth);
  EXPECT_EQ(gathered->plan().cross_host_lower_bound_bytes(), 4 * sixth);
  ASSERT_TRUE(DownloadAndCheck(c, "t", DType::kF32, shape, FillKind::kArange).ok());
  EXPECT_GE(cluster->DataBytesInto(2) - into_c_before, 4 * sixth);
  EXPECT_LT(cluster->LoopbackBytes(2) - loopback_before, sixth / 2)
      << "the same-host piece went over loopback TCP, not a same-host copy";
}

// Follows plan `plan_id` and runs `act` once when it is moving data.
absl::StatusOr<v1::PlanProgress> WatchAndAct(const std::string& plan_id,
                                             const std::function<void()>& act, absl::Time* acted) {
  bool done = false;
  return cluster->client().WatchPlan(plan_id, [&](const v1::PlanProgress& p) {
    if (done || !(p.bytes_done() > 0 || p.state() == v1::PREPARED)) return;
    done = true;
    act();
    *acted = absl::Now();
  });
}

TEST(MultiHostTest, AHostCutOffMidPlanAbortsAndRejoinsWithItsData) {
  REQUIRE_CLUSTER();
  MakeMeshes();
  CoordinatorClient& c = cluster->client();
  // 16 MiB whole on hosts a and b; host c's third crosses the 20 Mbit/s link in ~2 s.
  const Shape shape = {4096, 1024};
  ASSERT_TRUE(CreateFilled(c, "big", shape, DType::kF32, "ab", "R,S(1)").ok());
  v1::RedistributeRequest move = RedistributeTo("big", "all", "S(0),S(1)");
  move.set_wait(false);
  absl::StatusOr<v1::RedistributeResponse> started = c.Redistribute(move);
  ASSERT_TRUE(started.ok()) << started.status();
  absl::Time cut_at;
  absl::StatusOr<v1::PlanProgress> last = WatchAndAct(
      started->progress().plan_id(), [] { cluster->SetLinks(1, false); }, &cut_at);
  const absl::Time ended_at = absl::Now();
  ASSERT_TRUE(last.ok()) << last.status();
  ASSERT_EQ(last->state(), v1::ABORTED) << "the plan ended before the cut";
  EXPECT_LE(ended_at - cut_at, kHeartbeatTimeout + kAbortSlack);
  EXPECT_THAT(last->error(), AnyOf(HasSubstr("w-b0"), HasSubstr("w-b1")));
  ASSERT_TRUE(cluster->WaitForWorkers({"w-b0", "w-b1"}, v1::DEAD, absl::Seconds(10)).ok());
  // Host a's replica keeps every committed value readable.
  absl::StatusOr<v1::TensorInfo> info = c.GetTensor("big");
  ASSERT_TRUE(info.ok()) << info.status();
  EXPECT_EQ(info->mesh(), "ab");
  ASSERT_TRUE(DownloadAndCheck(c, "big", DType::kF32, shape, FillKind::kArange).ok());

  // The link returns: host b's workers register again with the buffers they kept.
  cluster->SetLinks(1, true);
  ASSERT_TRUE(cluster->WaitForWorkers({"w-b0", "w-b1"}, v1::ALIVE, absl::Seconds(20)).ok());
  // Now host a goes: the values come from host b's rejoined chunks alone.
  cluster->SetLinks(0, false);
  ASSERT_TRUE(cluster->WaitForWorkers({"w-a0", "w-a1"}, v1::DEAD, absl::Seconds(10)).ok());
  absl::Status read = DownloadAndCheck(c, "big", DType::kF32, shape, FillKind::kArange);
  cluster->SetLinks(0, true);
  EXPECT_TRUE(read.ok()) << read;
  ASSERT_TRUE(cluster->WaitForWorkers({"w-a0", "w-a1"}, v1::ALIVE, absl::Seconds(20)).ok());
}

TEST(MultiHostTest, SigtermDrainsAWorkerWhileAPlanItTakesPartInRuns) {
  REQUIRE_CLUSTER();
  MakeMeshes();
  CoordinatorClient& c = cluster->client();
  const Shape shape = {4096, 1024};
  ASSERT_TRUE(CreateFilled(c, "p", shape, DType::kF32, "ab", "R,S(1)").ok());
  ASSERT_TRUE(CreateFilled(c, "q", {64, 64}, DType::kF32, "all", "S(0),S(1)").ok());
  v1::RedistributeRequest move = RedistributeTo("p", "all", "S(0),S(1)");
  move.set_wait(false);
  absl::StatusOr<v1::RedistributeResponse> started = c.Redistribute(move);
  ASSERT_TRUE(started.ok()) << started.status();
  const pid_t victim = cluster->WorkerPid("w-c1");
  ASSERT_GT(victim, 0);
  bool saw_leaving = false;
  absl::Status refused;
  absl::Time signalled;
  absl::StatusOr<v1::PlanProgress> last = WatchAndAct(
      started->progress().plan_id(),
      [&] {
        ASSERT_EQ(kill(victim, SIGTERM), 0);
        // Until the plan ends the worker stays, leaving: no new plan may use it.
        const absl::Time deadline = absl::Now() + absl::Seconds(10);
        while (!saw_leaving && absl::Now() < deadline) {
          absl::StatusOr<std::vector<v1::WorkerInfo>> list = c.ListWorkers();
          for (const v1::WorkerInfo& w : list.ok() ? *list : std::vector<v1::WorkerInfo>{}) {
            saw_leaving |= w.name() == "w-c1" && w.leaving();
          }
          if (!saw_leaving) absl::SleepFor(absl::Milliseconds(20));  // Polling its state.
        }
        // Without retries: the client would retry UNAVAILABLE until the worker is gone.
        CoordinatorClientOptions once;
        once.retry_for = absl::ZeroDuration();
        CoordinatorClient no_retry(cluster->coordinator_address(), once);
        refused = no_retry.Redistribute(RedistributeTo("q", "all", "R,S(1)")).status();
      },
      &signalled);
  ASSERT_TRUE(last.ok()) << last.status();
  EXPECT_TRUE(saw_leaving);
  EXPECT_EQ(refused.code(), absl::StatusCode::kUnavailable) << refused;
  EXPECT_THAT(refused.message(), HasSubstr("w-c1"));
  // The running plan was let finish, then the worker left and exited 0.
  EXPECT_EQ(last->state(), v1::COMMITTED) << last->error();
  absl::StatusOr<int> status = cluster->WorkerProcess("w-c1")->Wait(absl::Seconds(30));
  ASSERT_TRUE(status.ok()) << status.status();
  EXPECT_TRUE(WIFEXITED(*status) && WEXITSTATUS(*status) == 0)
      << Process::DescribeWaitStatus(*status);
  ASSERT_TRUE(cluster->WaitForWorkers({"w-c1"}, v1::DEAD, absl::Seconds(5)).ok());
  // Its rows of p had no other copy: the coordinator says exactly which are lost.
  absl::Status lost = c.Redistribute(RedistributeTo("p", "ab", "R,S(1)")).status();
  EXPECT_EQ(lost.code(), absl::StatusCode::kFailedPrecondition) << lost;
  EXPECT_THAT(lost.message(), HasSubstr("lost"));
}

}  // namespace
}  // namespace shardcoord

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  ::testing::AddGlobalTestEnvironment(new shardcoord::MultiHostEnvironment());
  return RUN_ALL_TESTS();
}
