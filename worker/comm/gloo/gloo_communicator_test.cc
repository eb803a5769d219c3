#include "worker/comm/gloo/gloo_communicator.h"

#include <signal.h>

#include <csignal>
#include <cstring>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "sharding/box_copy.h"
#include "worker/control/kv_client.h"

namespace shardcoord {
namespace {

// Ranks are threads of this process; each has its own TCP device, as a worker process does.
class GlooGroup {
 public:
  // same_host[r]: GlooOptions::same_host_copy of rank r (default: all true).
  GlooGroup(int n, const std::string& prefix, absl::Duration timeout = absl::Seconds(30),
            std::vector<bool> same_host = {}) {
    factories_.resize(n);
    comms_.resize(n);
    for (int r = 0; r < n; ++r) {
      GlooOptions options;
      options.same_host_copy = same_host.empty() || same_host[r];
      auto f = GlooCommunicatorFactory::Create(&kv_, options);
      EXPECT_TRUE(f.ok()) << f.status();
      factories_[r] = *f;
    }
    Run([&](int r) {
      auto comm = factories_[r]->Create(SpecFor(n, r, prefix, timeout));
      ASSERT_TRUE(comm.ok()) << comm.status();
      comms_[r] = *comm;
    });
  }

  static CommunicatorSpec SpecFor(int n, int r, const std::string& prefix, absl::Duration timeout) {
    CommunicatorSpec spec;
    for (int i = 0; i < n; ++i) {
      spec.ranks.push_back(100 + i);  // Global ranks differ from group ranks.
      spec.incarnations.push_back(7);
    }
    spec.my_rank = 100 + r;
    spec.key_prefix = prefix;
    spec.timeout = timeout;
    return spec;
  }

  int size() const { return static_cast<int>(comms_.size()); }
  Communicator& comm(int r) { return *comms_[r]; }
  std::shared_ptr<Communicator>& comm_ptr(int r) { return comms_[r]; }
  KvClient* kv() { return &kv_; }
  GlooCommunicatorFactory& factory(int r) { return *factories_[r]; }

  void Run(const std::function<void(int)>& fn) {
    std::vector<std::thread> threads;
    for (int r = 0; r < static_cast<int>(comms_.size()); ++r) threads.emplace_back(fn, r);
    for (auto& t : threads) t.join();
  }

 private:
  InMemoryKvClient kv_;
  std::vector<std::shared_ptr<GlooCommunicatorFactory>> factories_;
  std::vector<std::shared_ptr<Communicator>> comms_;
};

// Deterministic bytes for (rank, peer, index).
unsigned char Byte(int a, int b, int64_t i) {
  return static_cast<unsigned char>((a * 131 + b * 31 + i * 7 + (i >> 8)) & 0xff);
}

TEST(GlooCommunicatorTest, RanksAndSizes) {
  GlooGroup g(3, "ranks/");
  for (int r = 0; r < 3; ++r) {
    EXPECT_EQ(g.comm(r).rank(), r);
    EXPECT_EQ(g.comm(r).size(), 3);
    EXPECT_FALSE(g.comm(r).broken());
  }
  EXPECT_EQ(
      GlooCommunicatorFactory::RendezvousPrefix(GlooGroup::SpecFor(2, 0, "p/", absl::Seconds(1))),
      "p/gloo/100,101/7,7/");
}

TEST(GlooCommunicatorTest, AllGatherVUnevenWithEmpty) {
  const int n = 4;
  GlooGroup g(n, "allgatherv/");
  const std::vector<int64_t> counts = {5, 0, 3000000, 17};  // One piece spans several MiB.
  int64_t total = 0;
  for (int64_t c : counts) total += c;
  g.Run([&](int r) {
    std::vector<unsigned char> send(counts[r]);
    for (int64_t i = 0; i < counts[r]; ++i) send[i] = Byte(r, 0, i);
    std::vector<unsigned char> recv(total, 0xEE);
    ASSERT_TRUE(
        g.comm(r).AllGatherV(send.data(), counts[r], recv.data(), counts, CommOptions{1}).ok());
    int64_t off = 0;
    for (int src = 0; src < n; ++src) {
      for (int64_t i = 0; i < counts[src]; ++i) {
        ASSERT_EQ(recv[off + i], Byte(src, 0, i)) << "rank " << r << " src " << src;
      }
      off += counts[src];
    }
  });
}

TEST(GlooCommunicatorTest, AllToAllV) {
  const int n = 4;
  GlooGroup g(n, "alltoallv/");
  auto count = [](int a, int b) -> int64_t {
    return (a * 3 + b * 5) % 7 == 0 ? 0 : 1000 * (a + 1) + b;
  };
  g.Run([&](int r) {
    std::vector<int64_t> send_bytes(n), recv_bytes(n);
    std::vector<unsigned char> send;
    for (int b = 0; b < n; ++b) {
      send_bytes[b] = count(r, b);
      recv_bytes[b] = count(b, r);
      for (int64_t i = 0; i < send_bytes[b]; ++i) send.push_back(Byte(r, b, i));
    }
    int64_t total = 0;
    for (int64_t c : recv_bytes) total += c;
    std::vector<unsigned char> recv(total);
    ASSERT_TRUE(
        g.comm(r).AllToAllV(send.data(), send_bytes, recv.data(), recv_bytes, CommOptions{2}).ok());
    int64_t off = 0;
    for (int a = 0; a < n; ++a) {
      for (int64_t i = 0; i < recv_bytes[a]; ++i) ASSERT_EQ(recv[off + i], Byte(a, r, i));
      off += recv_bytes[a];
    }
  });
}

TEST(GlooCommunicatorTest, ReduceScatterVSumF32AndMaxI32) {
  const int n = 4;
  GlooGroup g(n, "reducescatter/");
  const std::vector<int64_t> elems = {3, 0, 1000, 6};
  int64_t total = 0;
  for (int64_t e : elems) total += e;
  g.Run([&](int r) {
    std::vector<float> send(total);
    std::vector<int32_t> isend(total);
    for (int64_t i = 0; i < total; ++i) {
      send[i] = static_cast<float>(i * 4 + r);
      isend[i] = static_cast<int32_t>((i * 7 + r * 13) % 23) - 11;
    }
    std::vector<float> recv(elems[r] + 1, -1.0f);
    ASSERT_TRUE(g.comm(r)
                    .ReduceScatterV(send.data(), recv.data(), elems, DType::kF32, ReduceOp::kSum,
                                    CommOptions{3})
                    .ok());
    std::vector<int32_t> irecv(elems[r] + 1, 99);
    ASSERT_TRUE(g.comm(r)
                    .ReduceScatterV(isend.data(), irecv.data(), elems, DType::kI32, ReduceOp::kMax,
                                    CommOptions{4})
                    .ok());
    int64_t off = 0;
    for (int q = 0; q < r; ++q) off += elems[q];
    for (int64_t i = 0; i < elems[r]; ++i) {
      const int64_t gi = off + i;
      ASSERT_EQ(recv[i], static_cast<float>(16 * gi + 6)) << "rank " << r << " i " << i;
      int32_t best = -1000;
      for (int q = 0; q < n; ++q)
        best = std::max(best, static_cast<int32_t>((gi * 7 + q * 13) % 23) - 11);
      ASSERT_EQ(irecv[i], best);
    }
    EXPECT_EQ(recv[elems[r]], -1.0f);  // Nothing written past the slice.
    EXPECT_EQ(irecv[elems[r]], 99);
  });
}

TEST(GlooCommunicatorTest, AllReduceAcrossDtypesAndSegments) {
  const int n = 4;
  GlooGroup g(n, "allreduce/");
  const int64_t big = 600000;  // 2.4 MB of f32: several ring segments.
  g.Run([&](int r) {
    // f32 sum, out of place.
    std::vector<float> in(big), out(big);
    for (int64_t i = 0; i < big; ++i) in[i] = static_cast<float>((i % 1000) * (r + 1));
    ASSERT_TRUE(
        g.comm(r)
            .AllReduce(in.data(), out.data(), big, DType::kF32, ReduceOp::kSum, CommOptions{5})
            .ok());
    for (int64_t i = 0; i < big; ++i) ASSERT_EQ(out[i], static_cast<float>((i % 1000) * 10));
    // i64 min, in place.
    std::vector<int64_t> v(1001);
    for (int64_t i = 0; i < 1001; ++i) v[i] = (i * 17 + r * 5) % 11 - (int64_t{1} << 40);
    ASSERT_TRUE(
        g.comm(r)
            .AllReduce(v.data(), v.data(), 1001, DType::kI64, ReduceOp::kMin, CommOptions{6})
            .ok());
    for (int64_t i = 0; i < 1001; ++i) {
      int64_t m = INT64_MAX;
      for (int q = 0; q < n; ++q) m = std::min(m, (i * 17 + q * 5) % 11 - (int64_t{1} << 40));
      ASSERT_EQ(v[i], m);
    }
    // bf16 sum of small integers (exact), odd count.
    std::vector<uint16_t> h(333);
    for (int i = 0; i < 333; ++i) h[i] = FloatToBFloat16(static_cast<float>(i % 10 + r));
    ASSERT_TRUE(
        g.comm(r)
            .AllReduce(h.data(), h.data(), 333, DType::kBF16, ReduceOp::kSum, CommOptions{7})
            .ok());
    for (int i = 0; i < 333; ++i) {
      ASSERT_EQ(BFloat16ToFloat(h[i]), static_cast<float>(4 * (i % 10) + 6));
    }
    // u8 max.
    std::vector<uint8_t> b(50);
    for (int i = 0; i < 50; ++i) b[i] = static_cast<uint8_t>((i * 3 + r * 60) % 256);
    ASSERT_TRUE(g.comm(r)
                    .AllReduce(b.data(), b.data(), 50, DType::kU8, ReduceOp::kMax, CommOptions{8})
                    .ok());
    for (int i = 0; i < 50; ++i) {
      uint8_t m = 0;
      for (int q = 0; q < n; ++q) m = std::max<uint8_t>(m, (i * 3 + q * 60) % 256);
      ASSERT_EQ(b[i], m);
    }
  });
}

TEST(GlooCommunicatorTest, AvgIsRejected) {
  GlooGroup g(1, "avg/");
  float x = 1;
  EXPECT_EQ(g.comm(0).AllReduce(&x, &x, 1, DType::kF32, ReduceOp::kAvg, {}).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_FALSE(g.comm(0).broken());
}

TEST(GlooCommunicatorTest, Broadcast) {
  const int n = 4;
  GlooGroup g(n, "broadcast/");
  const int64_t bytes = 3 << 20;
  g.Run([&](int r) {
    std::vector<unsigned char> data(bytes, 0);
    if (r == 2) {
      for (int64_t i = 0; i < bytes; ++i) data[i] = Byte(2, 9, i);
    }
    ASSERT_TRUE(g.comm(r).Broadcast(data.data(), bytes, 2, CommOptions{9}).ok());
    for (int64_t i = 0; i < bytes; ++i) ASSERT_EQ(data[i], Byte(2, 9, i));
  });
}

TEST(GlooCommunicatorTest, SendRecvArbitraryPattern) {
  const int n = 4;
  GlooGroup g(n, "sendrecv/");
  // Messages (src, dst, bytes), several per pair, a cycle, an empty one.
  struct Msg {
    int src, dst;
    int64_t bytes;
  };
  std::vector<Msg> msgs;
  std::mt19937 gen(42);
  for (int k = 0; k < 40; ++k) {
    int a = gen() % n, b = gen() % n;
    if (a == b) continue;
    msgs.push_back({a, b, static_cast<int64_t>(gen() % 5000)});
  }
  msgs.push_back({0, 1, 0});
  msgs.push_back({1, 2, 2 << 20});
  msgs.push_back({2, 0, 2 << 20});
  g.Run([&](int r) {
    std::vector<std::vector<unsigned char>> out, in;
    std::vector<SendOp> sends;
    std::vector<RecvOp> recvs;
    std::vector<int> recv_msg;
    for (size_t m = 0; m < msgs.size(); ++m) {
      if (msgs[m].src == r) {
        out.emplace_back(msgs[m].bytes);
        for (int64_t i = 0; i < msgs[m].bytes; ++i) out.back()[i] = Byte(r, m, i);
      }
      if (msgs[m].dst == r) in.emplace_back(msgs[m].bytes, 0xEE);
    }
    size_t o = 0, q = 0;
    for (size_t m = 0; m < msgs.size(); ++m) {
      if (msgs[m].src == r) sends.push_back({msgs[m].dst, out[o++].data(), msgs[m].bytes});
      if (msgs[m].dst == r) {
        recvs.push_back({msgs[m].src, in[q++].data(), msgs[m].bytes});
        recv_msg.push_back(m);
      }
    }
    ASSERT_TRUE(g.comm(r).SendRecv(sends, recvs, CommOptions{10}).ok());
    for (size_t k = 0; k < recvs.size(); ++k) {
      const Msg& m = msgs[recv_msg[k]];
      for (int64_t i = 0; i < m.bytes; ++i) {
        ASSERT_EQ(in[k][i], Byte(m.src, recv_msg[k], i)) << "msg " << recv_msg[k];
      }
    }
  });
}

// Big messages between ranks that both take part go by same-host copy (ranks are threads of
// one process here, so the probe reads succeed); a rank with it off gets plain TCP from and
// to everyone, and the bytes are the same either way.
TEST(GlooCommunicatorTest, SendRecvSameHostCopyAndFallback) {
  const int n = 3;
  GlooGroup g(n, "samehost/", absl::Seconds(30), {true, true, false});
  auto& c0 = dynamic_cast<GlooCommunicator&>(g.comm(0));
  auto& c2 = dynamic_cast<GlooCommunicator&>(g.comm(2));
  EXPECT_TRUE(c0.SameHostPeer(1));
  EXPECT_FALSE(c0.SameHostPeer(2));
  EXPECT_FALSE(c2.SameHostPeer(0));
  EXPECT_FALSE(c2.SameHostPeer(1));
  // Every rank sends every other rank one small and two big messages (the last one odd).
  const std::vector<int64_t> sizes = {100, GlooCommunicator::kSameHostMinBytes, (3 << 20) + 5};
  g.Run([&](int r) {
    std::vector<std::vector<unsigned char>> out, in;
    std::vector<SendOp> sends;
    std::vector<RecvOp> recvs;
    for (int p = 0; p < n; ++p) {
      if (p == r) continue;
      for (size_t m = 0; m < sizes.size(); ++m) {
        out.emplace_back(sizes[m]);
        for (int64_t i = 0; i < sizes[m]; ++i) out.back()[i] = Byte(r, p * 10 + m, i);
        in.emplace_back(sizes[m], 0xEE);
      }
    }
    size_t k = 0;
    for (int p = 0; p < n; ++p) {
      if (p == r) continue;
      for (size_t m = 0; m < sizes.size(); ++m, ++k) {
        sends.push_back({p, out[k].data(), sizes[m]});
        recvs.push_back({p, in[k].data(), sizes[m]});
      }
    }
    absl::Status s = g.comm(r).SendRecv(sends, recvs, CommOptions{5});
    ASSERT_TRUE(s.ok()) << s;
    k = 0;
    for (int p = 0; p < n; ++p) {
      if (p == r) continue;
      for (size_t m = 0; m < sizes.size(); ++m, ++k) {
        for (int64_t i = 0; i < sizes[m]; ++i) {
          ASSERT_EQ(in[k][i], Byte(p, r * 10 + m, i)) << "from " << p << " msg " << m;
        }
      }
    }
  });
}

// A send given as strided runs: same-host peers take the runs (no prepare call); over TCP
// the prepare hook packs `data` as before. The receiver gets the same bytes either way.
TEST(GlooCommunicatorTest, SendRecvFromRunsWithAndWithoutSameHost) {
  for (bool same_host : {true, false}) {
    SCOPED_TRACE(same_host ? "same host" : "tcp");
    GlooGroup g(2, same_host ? "runs-sh/" : "runs-tcp/", absl::Seconds(30), {same_host, same_host});
    const int64_t kRuns = 3000, kRun = 40;  // 120000 bytes, above kSameHostMinBytes.
    g.Run([&](int r) {
      const int peer = 1 - r;
      std::vector<char> strided(kRuns * kRun * 2), packed(kRuns * kRun);
      for (size_t i = 0; i < strided.size(); ++i) strided[i] = static_cast<char>(Byte(r, 0, i));
      int prepared = 0;
      SendOp send{peer, packed.data(), kRuns * kRun, [&] {
                    ++prepared;
                    for (int64_t k = 0; k < kRuns; ++k) {
                      std::memcpy(packed.data() + k * kRun, strided.data() + 2 * k * kRun, kRun);
                    }
                    return absl::OkStatus();
                  }};
      for (int64_t k = 0; k < kRuns; ++k)
        send.runs.emplace_back(strided.data() + 2 * k * kRun, kRun);
      std::vector<char> in(kRuns * kRun, 0);
      RecvOp recv{peer, in.data(), kRuns * kRun};
      absl::Status s = g.comm(r).SendRecv({&send, 1}, {&recv, 1}, CommOptions{9});
      ASSERT_TRUE(s.ok()) << s;
      EXPECT_EQ(prepared, same_host ? 0 : 1);
      for (int64_t k = 0; k < kRuns; ++k) {
        for (int64_t b = 0; b < kRun; ++b) {
          ASSERT_EQ(in[k * kRun + b], static_cast<char>(Byte(peer, 0, 2 * k * kRun + b)))
              << "run " << k;
        }
      }
    });
  }
}

TEST(GlooCommunicatorTest, SendRecvHooks) {
  GlooGroup g(2, "hooks/");
  g.Run([&](int r) {
    const int peer = 1 - r;
    std::vector<int> out(1000), in(1000, -1);
    bool prepared = false, checked = false;
    int waited = 0;
    SendOp send{peer, out.data(), 4000, [&] {
                  for (int i = 0; i < 1000; ++i) out[i] = r * 10000 + i;  // Filled late.
                  prepared = true;
                  return absl::OkStatus();
                }};
    RecvOp recv{peer, in.data(), 4000, [&] {
                  for (int i = 0; i < 1000; ++i) {
                    if (in[i] != peer * 10000 + i) return absl::InternalError("bad data");
                  }
                  checked = true;
                  return absl::OkStatus();
                }};
    CommOptions options;
    options.tag = 3;
    options.while_waiting = [&] {
      ++waited;
      return absl::OkStatus();
    };
    absl::Status s = g.comm(r).SendRecv({&send, 1}, {&recv, 1}, options);
    ASSERT_TRUE(s.ok()) << s;
    EXPECT_TRUE(prepared);
    EXPECT_TRUE(checked);
    EXPECT_EQ(waited, 1);
  });
}

TEST(GlooCommunicatorTest, FailingHookBreaksTheCommunicator) {
  GlooGroup g(2, "hookfail/");
  char c = 0;
  std::vector<RecvOp> recvs = {{1, &c, 1, nullptr}};
  CommOptions options;
  options.timeout = absl::Seconds(20);
  options.while_waiting = [] { return absl::DataLossError("local copy failed"); };
  EXPECT_EQ(g.comm(0).SendRecv({}, recvs, options).code(), absl::StatusCode::kDataLoss);
  EXPECT_TRUE(g.comm(0).broken());
}

TEST(GlooCommunicatorTest, CollectivesRunWhileWaitingFirst) {
  GlooGroup g(1, "ww/");
  int calls = 0;
  CommOptions options;
  options.while_waiting = [&] {
    ++calls;
    return absl::OkStatus();
  };
  float x = 1;
  ASSERT_TRUE(g.comm(0).AllReduce(&x, &x, 0, DType::kF32, ReduceOp::kSum, options).ok());
  ASSERT_TRUE(g.comm(0).Broadcast(&x, 4, 0, options).ok());
  EXPECT_EQ(calls, 2);
  EXPECT_TRUE(g.comm(0).PrefersSendRecvForCopies());
}

TEST(GlooCommunicatorTest, SendRecvRejectsSelfAndBadPeer) {
  GlooGroup g(2, "sendrecv_bad/");
  char c = 0;
  std::vector<SendOp> to_self = {{0, &c, 1}};
  EXPECT_EQ(g.comm(0).SendRecv(to_self, {}, {}).code(), absl::StatusCode::kInvalidArgument);
  std::vector<RecvOp> from_nowhere = {{5, &c, 1}};
  EXPECT_EQ(g.comm(0).SendRecv({}, from_nowhere, {}).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_FALSE(g.comm(0).broken());
}

// Two ops with different tags in flight at once on one communicator, issued in opposite
// orders on different ranks (two plans sharing a process group).
TEST(GlooCommunicatorTest, ConcurrentOpsWithDifferentTags) {
  const int n = 3;
  GlooGroup g(n, "concurrent/");
  const int64_t bytes = 1 << 20;
  g.Run([&](int r) {
    std::vector<unsigned char> a(bytes * n), b(bytes * n);
    std::vector<unsigned char> sa(bytes), sb(bytes);
    for (int64_t i = 0; i < bytes; ++i) {
      sa[i] = Byte(r, 1, i);
      sb[i] = Byte(r, 2, i);
    }
    std::vector<int64_t> counts(n, bytes);
    absl::Status first, second;
    std::function<void()> op_a = [&] {
      first = g.comm(r).AllGatherV(sa.data(), bytes, a.data(), counts, CommOptions{100});
    };
    std::function<void()> op_b = [&] {
      second = g.comm(r).AllGatherV(sb.data(), bytes, b.data(), counts, CommOptions{200});
    };
    std::thread t1(r % 2 == 0 ? op_a : op_b);
    std::thread t2(r % 2 == 0 ? op_b : op_a);
    t1.join();
    t2.join();
    ASSERT_TRUE(first.ok()) << first;
    ASSERT_TRUE(second.ok()) << second;
    for (int src = 0; src < n; ++src) {
      for (int64_t i = 0; i < bytes; ++i) {
        ASSERT_EQ(a[src * bytes + i], Byte(src, 1, i));
        ASSERT_EQ(b[src * bytes + i], Byte(src, 2, i));
      }
    }
  });
}

TEST(GlooCommunicatorTest, MissingPeerTimesOutAndBreaks) {
  GlooGroup g(2, "timeout/");
  std::vector<char> buf(16), out(32);
  std::vector<int64_t> counts = {16, 16};
  // Rank 1 never joins this op.
  CommOptions options;
  options.tag = 11;
  options.timeout = absl::Milliseconds(300);
  absl::Status s = g.comm(0).AllGatherV(buf.data(), 16, out.data(), counts, options);
  EXPECT_EQ(s.code(), absl::StatusCode::kDeadlineExceeded) << s;
  EXPECT_TRUE(g.comm(0).broken());
  EXPECT_EQ(g.comm(0).Broadcast(buf.data(), 16, 0, {}).code(), absl::StatusCode::kAborted);
}

TEST(GlooCommunicatorTest, SendRecvTimesOut) {
  GlooGroup g(2, "timeout_p2p/");
  std::vector<char> buf(16);
  std::vector<RecvOp> recvs = {{1, buf.data(), 16}};
  CommOptions options;
  options.timeout = absl::Milliseconds(300);
  absl::Status s = g.comm(0).SendRecv({}, recvs, options);
  EXPECT_EQ(s.code(), absl::StatusCode::kDeadlineExceeded) << s;
}

// A peer that never sends: cancelling the token ends the wait long before the timeout,
// whether the cancel lands before or during the wait.
TEST(GlooCommunicatorTest, CancelInterruptsSendRecv) {
  GlooGroup g(2, "cancel/");
  std::vector<char> buf(16);
  std::vector<RecvOp> recvs = {{1, buf.data(), 16, nullptr}};
  CancelToken cancel;
  CommOptions options;
  options.timeout = absl::Seconds(600);
  options.cancel = &cancel;
  absl::Status s;
  std::thread waiter([&] { s = g.comm(0).SendRecv({}, recvs, options); });
  cancel.Cancel();
  waiter.join();
  EXPECT_EQ(s.code(), absl::StatusCode::kAborted) << s;
  EXPECT_TRUE(g.comm(0).broken());
}

// A peer that closes its sockets mid-transfer must fail the step, not kill this process:
// Gloo writes without MSG_NOSIGNAL, so the factory ignores SIGPIPE (worker_core_test died of
// it about once in 30 runs before).
TEST(GlooCommunicatorTest, FactoryIgnoresSigpipe) {
  std::signal(SIGPIPE, SIG_DFL);
  InMemoryKvClient kv;
  ASSERT_TRUE(GlooCommunicatorFactory::Create(&kv, GlooOptions{}).ok());
  struct sigaction now;
  ASSERT_EQ(sigaction(SIGPIPE, nullptr, &now), 0);
  EXPECT_EQ(now.sa_handler, SIG_IGN);
}

TEST(GlooCommunicatorTest, RendezvousWithoutPeerTimesOut) {
  InMemoryKvClient kv;
  auto factory = GlooCommunicatorFactory::Create(&kv, GlooOptions{});
  ASSERT_TRUE(factory.ok());
  auto comm = (*factory)->Create(GlooGroup::SpecFor(2, 0, "lonely/", absl::Milliseconds(300)));
  EXPECT_EQ(comm.status().code(), absl::StatusCode::kDeadlineExceeded) << comm.status();
  EXPECT_NE(comm.status().message().find("lonely/gloo/100,101/7,7/"), std::string::npos)
      << comm.status();
}

// A KV store that hands out wrong peer-proof nonces (those whose key ends with `key`), as an
// impostor who never saw the rendezvous would have to guess them.
class TamperedKvClient : public KvClient {
 public:
  explicit TamperedKvClient(std::string key) : key_(std::move(key)) {}
  absl::Status Set(absl::string_view key, absl::string_view value) override {
    return kv_.Set(key, value);
  }
  absl::StatusOr<std::string> Get(absl::string_view key, absl::Duration timeout) override {
    absl::StatusOr<std::string> v = kv_.Get(key, timeout);
    if (v.ok() && absl::StrContains(key, "peerproof/") && absl::EndsWith(key, key_)) {
      return std::string(v->size(), 'x');
    }
    return v;
  }

 private:
  const std::string key_;
  InMemoryKvClient kv_;
};

TEST(GlooCommunicatorTest, APeerWithoutTheRendezvousNonceIsRefused) {
  // Each rank reads a wrong nonce for its peer, as an impostor who connected to the peer's
  // Gloo socket without taking part in the rendezvous would: each end gets a wrong proof and
  // refuses the connection before anything else crosses it.
  TamperedKvClient kv("");
  std::vector<std::shared_ptr<GlooCommunicatorFactory>> factories;
  for (int r = 0; r < 2; ++r) {
    auto f = GlooCommunicatorFactory::Create(&kv, GlooOptions{});
    ASSERT_TRUE(f.ok()) << f.status();
    factories.push_back(*f);
  }
  std::vector<absl::Status> results(2);
  std::vector<std::thread> threads;
  for (int r = 0; r < 2; ++r) {
    threads.emplace_back([&, r] {
      results[r] =
          factories[r]->Create(GlooGroup::SpecFor(2, r, "proof/", absl::Seconds(20))).status();
    });
  }
  for (auto& t : threads) t.join();
  for (int r = 0; r < 2; ++r) {
    EXPECT_EQ(results[r].code(), absl::StatusCode::kPermissionDenied) << results[r];
    EXPECT_THAT(
        std::string(results[r].message()),
        ::testing::HasSubstr(absl::StrCat("connection to group rank ", 1 - r, " does not prove")));
  }
}

TEST(GlooCommunicatorTest, PeerGoneIsAnError) {
  GlooGroup g(2, "gone/");
  g.comm_ptr(1).reset();  // Rank 1's context closes its connections.
  std::vector<char> buf(16);
  std::vector<RecvOp> recvs = {{1, buf.data(), 16}};
  CommOptions options;
  options.timeout = absl::Seconds(20);
  absl::Status s = g.comm(0).SendRecv({}, recvs, options);
  EXPECT_EQ(s.code(), absl::StatusCode::kAborted) << s;
  EXPECT_TRUE(g.comm(0).broken());
}

TEST(GlooCommunicatorTest, WorksThroughCommunicatorCache) {
  InMemoryKvClient kv;
  const int n = 3;
  std::vector<std::unique_ptr<CommunicatorCache>> caches;
  for (int r = 0; r < n; ++r) {
    caches.push_back(
        std::make_unique<CommunicatorCache>(*GlooCommunicatorFactory::Create(&kv, GlooOptions{})));
  }
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r) {
    threads.emplace_back([&, r] {
      auto spec = GlooGroup::SpecFor(n, r, "cache/", absl::Seconds(30));
      auto c1 = caches[r]->Get(spec);
      ASSERT_TRUE(c1.ok()) << c1.status();
      auto c2 = caches[r]->Get(spec);
      ASSERT_TRUE(c2.ok());
      EXPECT_EQ(*c1, *c2);
      int64_t x = r + 1;
      ASSERT_TRUE((*c2)->AllReduce(&x, &x, 1, DType::kI64, ReduceOp::kSum, {}).ok());
      EXPECT_EQ(x, 6);
    });
  }
  for (auto& t : threads) t.join();
}

}  // namespace
}  // namespace shardcoord
