// Fused groups on four in-process ranks over real Gloo communicators: every member of every
// layout kind planned, cut into group fragments as the coordinator does, run by
// ExecuteGroup on four threads, and every value of every member's target checked, with its
// checksums. Tiny buckets (24 bytes) drive every path: pieces split, small ones packed,
// pieces landing in place and sent from strided rows; device buffers
// (FakeDeviceMemorySpace) and an NCCL-like backend (hooks run around the call) too.
#include "worker/plans/fused_exchange.h"

#include <cstring>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "proto/convert.h"
#include "sharding/fill.h"
#include "sharding/fused_stream.h"
#include "sharding/layout.h"
#include "sharding/plan_fragment.h"
#include "sharding/planner.h"
#include "worker/buffers/buffer_store.h"
#include "worker/buffers/checksum.h"
#include "worker/comm/gloo/gloo_communicator.h"
#include "worker/control/kv_client.h"
#include "worker/plans/fragment.h"
#include "worker/testing/executor_test_util.h"
#include "worker/testing/fake_device_memory_space.h"

namespace shardcoord {
namespace {

using executor_testing::ForEachElement;
using executor_testing::MakeLayout;
using executor_testing::MakeSource;
using executor_testing::Reduced;

constexpr int kRanks = 4;

struct Endpoint {
  Shape mesh;
  std::vector<int64_t> ranks;  // Empty: 0..n-1.
  std::string spec;
};

struct Member {
  Endpoint from;
  Endpoint to;
  Shape shape = {10, 7};
  DType dtype = DType::kF32;
  double offset = 0;  // Added to every value, so members' bytes differ.
};

GlooOptions SameHost(bool same_host) {
  GlooOptions options;
  options.same_host_copy = same_host;
  return options;
}

struct Cluster : executor_testing::GlooCluster {
  explicit Cluster(bool same_host = true, bool nccl_like = false)
      : GlooCluster(kRanks, nccl_like, SameHost(same_host)) {}
};

struct Devices : executor_testing::FakeDevices {
  Devices() : FakeDevices(kRanks) {}
};

struct GroupRun {
  std::vector<Plan> plans;
  StreamLimits limits;
  std::map<int, absl::StatusOr<GroupExecuteResult>> results;  // By rank.
  std::map<int, Fragment> fragments;
  // By rank, then member section: the target bytes read back to the host.
  std::map<int, std::vector<std::string>> bytes;
};

// Every rank's fragment of a fused transaction, on the wire as the coordinator sends it.
std::map<int64_t, v1::PlanFragment> FusedFragments(absl::Span<const Plan* const> plans,
                                                   absl::Span<const FragmentMemberOptions> members,
                                                   FragmentOptions options) {
  options.fused = true;
  std::map<int64_t, v1::PlanFragment> out;
  for (const auto& [rank, f] : MakeFragments(plans, members, options)) {
    out[rank] = FragmentToProto(f);
  }
  return out;
}

// `runs` > 1: each rank runs its fragment that many times through one GroupScheduleCache
// (host buffers only), its targets cleared before each run; the result is the last run's.
GroupRun RunGroup(Cluster& cluster, const std::vector<Member>& members, int64_t bucket_bytes,
                  const std::string& id, Devices* devices = nullptr, int runs = 1) {
  GroupRun run;
  run.limits = StreamLimitsFor(bucket_bytes);
  std::vector<FragmentMemberOptions> options;
  for (size_t m = 0; m < members.size(); ++m) {
    const Member& mb = members[m];
    Layout from = MakeLayout(mb.from.mesh, mb.from.ranks, mb.from.spec, mb.shape);
    Layout to = MakeLayout(mb.to.mesh, mb.to.ranks, mb.to.spec, mb.shape);
    absl::StatusOr<Plan> plan = Redistribute(from, to, mb.dtype);  // Collectives included.
    EXPECT_TRUE(plan.ok()) << plan.status();
    if (!plan.ok()) return run;
    run.plans.push_back(*std::move(plan));
    FragmentMemberOptions o;
    o.index = static_cast<int32_t>(m);
    o.plan_id = absl::StrCat(id, ".", m);
    o.tensor = absl::StrCat("T", m);
    o.source_version = 1;
    o.target_version = 2;
    options.push_back(o);
  }
  std::vector<const Plan*> plans;
  for (const Plan& p : run.plans) plans.push_back(&p);
  FragmentOptions go;
  go.plan_id = id;
  for (int r = 0; r < kRanks; ++r) go.incarnations[r] = 1;
  go.step_timeout_ms = 30000;
  go.communicator_prefix = absl::StrCat("test/", id, "/");
  go.bucket_bytes = bucket_bytes;
  std::map<int64_t, v1::PlanFragment> protos = FusedFragments(plans, options, go);

  std::map<int, std::vector<std::shared_ptr<HostBuffer>>> sources, targets;
  std::map<int, FakeDeviceMemorySpace::Stats> before;
  for (const auto& [rank, proto] : protos) {
    absl::StatusOr<Fragment> g = ParseFragment(proto);
    EXPECT_TRUE(g.ok()) << g.status();
    if (!g.ok()) return run;
    MemorySpace* space = devices != nullptr ? devices->spaces[rank].get() : nullptr;
    for (size_t i = 0; i < g->members.size(); ++i) {
      const int m = g->members[i].index;
      const Member& mb = members[m];
      sources[rank].push_back(MakeSource(run.plans[m].source, rank, mb.dtype, space, mb.offset));
      targets[rank].push_back(
          *HostBuffer::Create(mb.dtype, g->shapes[g->members[i].shape].target, space));
    }
    if (devices != nullptr) before[rank] = devices->spaces[rank]->stats();
    run.fragments[static_cast<int>(rank)] = *std::move(g);
    run.results.emplace(static_cast<int>(rank), absl::UnknownError("not run"));
  }
  std::vector<std::thread> threads;
  for (auto& [rank, fragment] : run.fragments) {
    threads.emplace_back([&, rank = rank] {
      GroupExecuteInput in;
      in.fragment = &run.fragments.at(rank);
      for (size_t i = 0; i < in.fragment->members.size(); ++i) {
        in.buffers.push_back({sources[rank][i].get(), targets[rank][i].get()});
      }
      in.communicators = cluster.caches[rank].get();
      int64_t last = -1, total = -1;
      in.progress = [&](int64_t done, int64_t t) {
        EXPECT_GE(done, last);
        last = done;
        total = t;
      };
      GroupScheduleCache cache;
      for (int k = 0; k < runs; ++k) {
        if (runs > 1) {
          in.schedule_cache = &cache;
          for (const auto& target : targets[rank]) {
            if (target->bytes() > 0) std::memset(target->data(), 0, target->bytes());
          }
        }
        last = -1;
        total = -1;
        run.results.at(rank) = ExecuteGroup(in);
        if (run.results.at(rank).ok() && total >= 0) {
          EXPECT_EQ(last, total);
        }
        if (runs > 1) {
          // Kept for this fragment at this bucket size only.
          EXPECT_NE(cache.Find(in.fragment, run.limits.bucket_bytes), nullptr);
          EXPECT_EQ(cache.Find(in.fragment, run.limits.bucket_bytes + 1), nullptr);
          const Fragment other = *in.fragment;
          EXPECT_EQ(cache.Find(&other, run.limits.bucket_bytes), nullptr);
        }
      }
    });
  }
  for (auto& t : threads) t.join();
  for (auto& [rank, fragment] : run.fragments) {
    std::vector<std::string>& out = run.bytes[rank];
    int64_t reads = 0;
    for (const auto& target : targets[rank]) {
      reads += target->bytes() > 0 ? 1 : 0;
      std::string b(static_cast<size_t>(target->bytes()), '\0');
      if (devices == nullptr) {
        if (!b.empty()) std::memcpy(b.data(), target->data(), b.size());
      } else if (!b.empty()) {
        EXPECT_TRUE(devices->spaces[rank]->CopyToHost(b.data(), target->data(), b.size()).ok());
      }
      out.push_back(std::move(b));
    }
    if (devices != nullptr && run.results.at(rank).ok()) {
      // Everything ran in device memory: no round trip through the host.
      const FakeDeviceMemorySpace::Stats after = devices->spaces[rank]->stats();
      EXPECT_EQ(after.copies_to_device, before[rank].copies_to_device) << "rank " << rank;
      EXPECT_EQ(after.copies_to_host - before[rank].copies_to_host, reads)  // The reads above.
          << "rank " << rank;
    }
  }
  return run;
}

// Every element of every member's target on every rank, and the checksums.
void CheckGroup(const std::vector<Member>& members, const GroupRun& run) {
  ASSERT_FALSE(run.fragments.empty());
  for (const auto& [rank, g] : run.fragments) {
    const absl::StatusOr<GroupExecuteResult>& res = run.results.at(rank);
    ASSERT_TRUE(res.ok()) << "rank " << rank << ": " << res.status();
    ASSERT_EQ(res->members.size(), g.members.size());
    EXPECT_LE(res->staging_bytes, kBucketsInFlight * run.limits.bucket_bytes) << "rank " << rank;
    for (size_t i = 0; i < g.members.size(); ++i) {
      const int m = g.members[i].index;
      const Plan& plan = run.plans[m];
      const Member& mb = members[m];
      const RankChunks* rc = plan.target.Find(rank);
      const GroupMemberResult& mr = res->members[i];
      // The member's buffer holds its shape's target chunks: those the worker reports.
      const RankChunks& held = g.shapes[g.members[i].shape].target;
      if (rc == nullptr) {
        EXPECT_TRUE(held.chunks.empty());
        EXPECT_TRUE(mr.checksums.empty());
        continue;
      }
      ASSERT_EQ(held.chunks, rc->chunks);
      ASSERT_EQ(mr.checksums.size(), rc->chunks.size());
      const int64_t esize = ElementSize(mb.dtype);
      const std::string& bytes = run.bytes.at(rank)[i];
      for (size_t k = 0; k < rc->chunks.size(); ++k) {
        const Chunk& c = rc->chunks[k];
        const char* data = bytes.data() + c.local_offset * esize;
        EXPECT_EQ(mr.checksums[k], ChunkChecksum(data, c.box.Volume() * esize))
            << "member " << m << " rank " << rank;
        const Layout& target = plan.target;
        const bool zero =
            target.is_partial() && target.partial_op() == ReduceOp::kSum && c.partial_index != 0;
        const Layout& source = plan.source;
        const int where = rank;  // A structured binding cannot be captured (C++17).
        ForEachElement(target.global_shape(), c.box, [&](int64_t e, int64_t flat) {
          double want = 0;
          if (!zero) {
            const int64_t p = source.num_partials();
            // Each contribution carries the offset: sum adds it p times, avg once.
            want = Reduced(source.partial_op(), flat, p) + mb.offset;
            if (p > 1 && source.partial_op() == ReduceOp::kSum) want += mb.offset * (p - 1);
          }
          ASSERT_EQ(LoadAsDouble(data, mb.dtype, e), want)
              << "member " << m << " (" << mb.from.spec << " -> " << mb.to.spec << ") rank "
              << where << " chunk " << c.box.ToString() << " element " << e;
        });
      }
    }
  }
}

// Messages over all ranks' rounds, checking each rank sends to each peer in one round.
int64_t MessagesSent(const GroupRun& run) {
  int64_t n = 0;
  for (const auto& [rank, res] : run.results) {
    if (!res.ok()) continue;
    std::set<int64_t> peers;
    for (const ExchangeRound& r : res->rounds) {
      if (r.send_peer >= 0) EXPECT_TRUE(peers.insert(r.send_peer).second) << r.send_peer;
      n += r.buckets_sent;
    }
  }
  return n;
}

std::vector<Member> EveryLayoutKind() {
  const Shape line = {4}, grid = {2, 2}, two = {2}, three = {3};
  return {
      {{line, {}, "S(0,[1,3,2,4])"}, {grid, {}, "R,S(1)"}},
      {{grid, {}, "S(1),S(0)"}, {line, {3, 2, 1, 0}, "S(0,[2,4,1,3])"}, {10, 7}, DType::kF32, 1000},
      {{line, {}, "flat 0:7;7:70;;"}, {two, {1, 2}, "S(0)"}, {10, 7}, DType::kF64, 2000},
      {{grid, {}, "S(0),S(1)"}, {line, {}, "flat 0:35;35:40;40:70;"}, {10, 7}, DType::kF32, 3000},
      {{grid, {}, "S(0),R"}, {line, {3, 2, 1, 0}, "S(1)"}, {6, 9}, DType::kF32, 4000},
      {{two, {1, 2}, "R"}, {three, {0, 2, 3}, "S(0)"}, {10, 7}, DType::kF32, 5000},
      {{line, {}, "S(1)"}, {three, {0, 2, 3}, "R"}, {4, 5}, DType::kBF16},
      {{line, {}, "R"}, {line, {}, "R"}, {3, 3}, DType::kF32, 6000},  // Local copies only.
  };
}

std::vector<Member> PartialKinds() {
  const Shape line = {4}, grid = {2, 2}, three = {3};
  return {
      {{grid, {}, "P(sum),S(1)"}, {three, {0, 2, 3}, "R"}},
      {{line, {}, "P(sum)"}, {grid, {}, "S(0),S(1)"}, {8, 6}, DType::kF32, 100},
      {{line, {}, "S(0)"}, {grid, {}, "P(sum),S(1)"}, {10, 7}, DType::kF32, 200},
      {{line, {}, "P(avg)"}, {line, {}, "R"}, {5, 4}, DType::kF64, 300},
      {{grid, {}, "P(max),R"}, {line, {}, "S(1)"}, {6, 6}, DType::kF32, 400},
      {{line, {}, "P(min)"}, {three, {1, 2, 3}, "S(0)"}, {9, 2}, DType::kF32, 500},
      {{grid, {}, "R,P(sum)"}, {grid, {}, "S(0),S(1)"}, {4, 4}, DType::kF32},  // All-reduce-ish.
  };
}

TEST(FusedExchangeTest, EveryLayoutKindWithDefaultBuckets) {
  Cluster cluster;
  const std::vector<Member> members = EveryLayoutKind();
  GroupRun run = RunGroup(cluster, members, 0, "g-kinds");
  ASSERT_NO_FATAL_FAILURE(CheckGroup(members, run));
  std::vector<const Plan*> plans;
  for (const Plan& p : run.plans) plans.push_back(&p);
  EXPECT_EQ(MessagesSent(run), FusedExchange(plans, run.limits).messages);
}

// A prepared transfer's runs reuse the first run's schedule: the same values, run after run,
// with small buckets (several messages and windows per stream) and reductions.
TEST(FusedExchangeTest, AScheduleKeptAcrossRunsGivesTheSameValues) {
  for (const std::vector<Member>& members : {EveryLayoutKind(), PartialKinds()}) {
    Cluster cluster;
    GroupRun run = RunGroup(cluster, members, 256, "g-again", nullptr, /*runs=*/3);
    ASSERT_NO_FATAL_FAILURE(CheckGroup(members, run));
  }
}

TEST(FusedExchangeTest, PartialMembersReduceInTheStream) {
  Cluster cluster;
  const std::vector<Member> members = PartialKinds();
  GroupRun run = RunGroup(cluster, members, 0, "g-partial");
  ASSERT_NO_FATAL_FAILURE(CheckGroup(members, run));
}

TEST(FusedExchangeTest, TinyBucketsSplitPackAndLandInPlace) {
  for (bool same_host : {true, false}) {
    SCOPED_TRACE(same_host ? "same-host copies" : "TCP only");
    Cluster cluster(same_host);
    std::vector<Member> members = EveryLayoutKind();
    for (const Member& m : PartialKinds()) members.push_back(m);
    GroupRun run = RunGroup(cluster, members, 24, same_host ? "g-tiny" : "g-tiny-tcp");
    ASSERT_NO_FATAL_FAILURE(CheckGroup(members, run));
    std::vector<const Plan*> plans;
    for (const Plan& p : run.plans) plans.push_back(&p);
    const int64_t messages = FusedExchange(plans, run.limits).messages;
    EXPECT_EQ(MessagesSent(run), messages);
    int64_t packed = 0, in_place = 0, split = 0, windows = 0;
    for (const auto& [rank, res] : run.results) {
      packed += res->messages_packed;
      in_place += res->messages_landed_in_place;
      for (const ExchangeRound& r : res->rounds) windows += r.windows;
    }
    // More messages than transfers: big ones were split.
    for (const Plan& p : run.plans) {
      for (const Step& s : p.steps) split -= static_cast<int64_t>(s.transfers.size());
    }
    split += messages;
    EXPECT_GT(packed, 0);
    EXPECT_GT(in_place, 0);
    EXPECT_GT(split, 0);
    EXPECT_GT(windows, 12);  // Many windows per pair: staging stays within 4 x 24 bytes.
  }
}

TEST(FusedExchangeTest, ManySmallTensorsGoAsOneBucketPerPair) {
  Cluster cluster;
  std::vector<Member> members;
  for (int i = 0; i < 100; ++i) {
    members.push_back({{{4}, {}, "S(0)"}, {{4}, {}, "S(1)"}, {8, 8}, DType::kF32, 10.0 * i});
  }
  GroupRun run = RunGroup(cluster, members, 0, "g-small");
  ASSERT_NO_FATAL_FAILURE(CheckGroup(members, run));
  // 100 all-to-alls of 16 bytes per pair: one message per pair, 12 in all.
  EXPECT_EQ(MessagesSent(run), 12);
  for (const auto& [rank, res] : run.results) {
    EXPECT_EQ(res->rounds.size(), 3u) << "rank " << rank;
    for (const ExchangeRound& r : res->rounds) {
      EXPECT_EQ(r.buckets_sent, 1);
      EXPECT_EQ(r.buckets_received, 1);
      EXPECT_EQ(r.bytes_sent, 100 * 16);
    }
  }
}

TEST(FusedExchangeTest, MembersWithTheSamePlanShareOneShape) {
  Layout from = MakeLayout({4}, {}, "S(0)", {8, 8});
  Layout to = MakeLayout({4}, {}, "S(1)", {8, 8});
  const Plan a = *Redistribute(from, to, DType::kF32);
  const Plan b = *Redistribute(to, from, DType::kF32);
  const Plan* plans[] = {&a, &a, &b, &a};
  std::vector<FragmentMemberOptions> options(4);
  for (int i = 0; i < 4; ++i) {
    options[i].index = i;
    options[i].tensor = absl::StrCat("T", i);
  }
  FragmentOptions go;
  go.plan_id = "g";
  std::map<int64_t, v1::PlanFragment> protos = FusedFragments(plans, options, go);
  ASSERT_EQ(protos.size(), 4u);
  for (const auto& [rank, f] : protos) {
    EXPECT_EQ(f.shapes_size(), 2) << rank;
    ASSERT_EQ(f.members_size(), 4) << rank;
    EXPECT_EQ(f.members(0).shape(), 0);
    EXPECT_EQ(f.members(1).shape(), 0);
    EXPECT_EQ(f.members(2).shape(), 1);
    EXPECT_EQ(f.members(3).shape(), 0);
    EXPECT_EQ(f.members(2).tensor(), "T2");
    absl::StatusOr<Fragment> g = ParseFragment(f);
    ASSERT_TRUE(g.ok()) << g.status();
    EXPECT_EQ(g->members[3].index, 3);
  }
  // A member naming a shape that is not there is refused.
  v1::PlanFragment bad = protos.at(0);
  bad.mutable_members(1)->set_shape(7);
  EXPECT_EQ(ParseFragment(bad).status().code(), absl::StatusCode::kInvalidArgument);
}

// The stream from a to b is what a's fragment sends to b and what b's receives from a, in
// member then plan order: both ends must list the same transfers in the same order.
TEST(FusedExchangeTest, BothEndsOfAPairListItsTransfersInTheSameOrder) {
  std::vector<Plan> plans;
  for (const Member& m : EveryLayoutKind()) {
    plans.push_back(*Redistribute(MakeLayout(m.from.mesh, m.from.ranks, m.from.spec, m.shape),
                                  MakeLayout(m.to.mesh, m.to.ranks, m.to.spec, m.shape), m.dtype));
  }
  std::vector<const Plan*> pointers;
  std::vector<FragmentMemberOptions> options(plans.size());
  for (size_t i = 0; i < plans.size(); ++i) {
    pointers.push_back(&plans[i]);
    options[i].index = static_cast<int32_t>(i);
    options[i].tensor = absl::StrCat("T", i);
  }
  FragmentOptions go;
  go.plan_id = "g";
  for (int r = 0; r < kRanks; ++r) go.incarnations[r] = 1;
  std::map<int64_t, Fragment> groups;
  for (const auto& [rank, proto] : FusedFragments(pointers, options, go)) {
    groups[rank] = *ParseFragment(proto);
  }
  // The stream of (src, dst) as `rank` sees it: (member index, box) in its fragment's order.
  auto stream = [&](int64_t rank, int64_t src, int64_t dst) {
    std::vector<std::pair<int32_t, Box>> out;
    const Fragment& g = groups.at(rank);
    for (const FragmentMember& m : g.members) {
      for (const Transfer& t : g.shapes[m.shape].transfers) {
        if (t.src == src && t.dst == dst) out.emplace_back(m.index, t.box);
      }
    }
    return out;
  };
  int pairs = 0;
  for (int64_t a = 0; a < kRanks; ++a) {
    for (int64_t b = 0; b < kRanks; ++b) {
      if (a == b || !groups.count(a) || !groups.count(b)) continue;
      const auto sent = stream(a, a, b);
      EXPECT_EQ(sent, stream(b, a, b)) << a << " -> " << b;
      // And in the plans' own order.
      std::vector<std::pair<int32_t, Box>> want;
      for (size_t i = 0; i < plans.size(); ++i) {
        for (const Step& st : plans[i].steps) {
          for (const Transfer& t : st.transfers) {
            if (t.src == a && t.dst == b) want.emplace_back(static_cast<int32_t>(i), t.box);
          }
        }
      }
      EXPECT_EQ(sent, want) << a << " -> " << b;
      pairs += sent.empty() ? 0 : 1;
    }
  }
  EXPECT_EQ(pairs, 12);
}

TEST(FusedExchangeTest, DeviceBuffersAndAnNcclLikeBackend) {
  for (bool nccl_like : {false, true}) {
    SCOPED_TRACE(nccl_like ? "NCCL-like" : "Gloo");
    for (int64_t bucket : {int64_t{24}, int64_t{0}}) {
      Cluster cluster(/*same_host=*/false, nccl_like);
      Devices devices;
      std::vector<Member> members = EveryLayoutKind();
      for (const Member& m : PartialKinds()) members.push_back(m);
      GroupRun run = RunGroup(cluster, members, bucket,
                              absl::StrCat("g-dev-", nccl_like, "-", bucket), &devices);
      ASSERT_NO_FATAL_FAILURE(CheckGroup(members, run));
    }
  }
}

TEST(FusedExchangeTest, ABrokenPeerFailsTheGroupNamingTheRound) {
  Cluster cluster;
  const std::vector<Member> members = {{{{4}, {}, "S(0)"}, {{4}, {}, "S(1)"}, {8, 8}}};
  // Rank 3's fragment is never run: the others time out in the rendezvous or the exchange.
  GroupRun run;
  {
    Layout from = MakeLayout({4}, {}, "S(0)", {8, 8});
    Layout to = MakeLayout({4}, {}, "S(1)", {8, 8});
    run.plans.push_back(*Redistribute(from, to, DType::kF32));
  }
  FragmentMemberOptions o;
  o.plan_id = "p";
  o.tensor = "T";
  o.source_version = 1;
  o.target_version = 2;
  const Plan* plans[] = {&run.plans[0]};
  FragmentOptions go;
  go.plan_id = "g-broken";
  for (int r = 0; r < kRanks; ++r) go.incarnations[r] = 1;
  go.step_timeout_ms = 300;
  go.communicator_prefix = "test/g-broken/";
  std::map<int64_t, v1::PlanFragment> protos = FusedFragments(plans, {o}, go);
  Fragment g = *ParseFragment(protos.at(0));
  std::shared_ptr<HostBuffer> source = MakeSource(run.plans[0].source, 0, DType::kF32);
  std::shared_ptr<HostBuffer> target = *HostBuffer::Create(DType::kF32, g.shapes[0].target);
  GroupExecuteInput in;
  in.fragment = &g;
  in.buffers.push_back({source.get(), target.get()});
  in.communicators = cluster.caches[0].get();
  absl::StatusOr<GroupExecuteResult> r = ExecuteGroup(in);
  EXPECT_FALSE(r.ok());
  EXPECT_NE(std::string(r.status().message()).find("fused exchange"), std::string::npos)
      << r.status();
}

}  // namespace
}  // namespace shardcoord
