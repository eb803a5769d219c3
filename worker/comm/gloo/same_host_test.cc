#include "worker/comm/gloo/same_host.h"

#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <vector>

#include "gtest/gtest.h"

namespace shardcoord {
namespace {

TEST(SameHostRecordTest, EncodesAndDecodes) {
  SameHostRecord r;
  r.enabled = true;
  r.host_key = "0f3e-boot/4026531836";
  r.pid = 4242;
  r.probe_address = 0x7ffd1234;
  r.probe_value = 0xfeedfacecafebeefULL;
  absl::StatusOr<SameHostRecord> back = SameHostRecord::Decode(r.Encode());
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_TRUE(back->enabled);
  EXPECT_EQ(back->host_key, r.host_key);
  EXPECT_EQ(back->pid, r.pid);
  EXPECT_EQ(back->probe_address, r.probe_address);
  EXPECT_EQ(back->probe_value, r.probe_value);
  for (const char* bad : {"", "1|a|b|c|d", "2|k|1|2|3", "1|k|1|2", "1|k|1|2|3|4"}) {
    absl::StatusOr<SameHostRecord> d = SameHostRecord::Decode(bad);
    EXPECT_EQ(d.status().code(), absl::StatusCode::kInvalidArgument) << bad;
  }
}

TEST(SameHostRecordTest, ThisProcessCanReadItselfOnlyWhenEveryCheckPasses) {
  const SameHostRecord self = LocalSameHostRecord(true);
  ASSERT_FALSE(self.host_key.empty()) << "no /proc/sys/kernel/random/boot_id here";
  EXPECT_EQ(self.pid, getpid());
  EXPECT_TRUE(CanReadPeer(self, self));

  SameHostRecord other_host = self;
  other_host.host_key += "x";
  EXPECT_FALSE(CanReadPeer(self, other_host));
  SameHostRecord wrong_value = self;
  wrong_value.probe_value ^= 1;
  EXPECT_FALSE(CanReadPeer(self, wrong_value));
  EXPECT_FALSE(CanReadPeer(self, LocalSameHostRecord(false)));
  EXPECT_FALSE(CanReadPeer(LocalSameHostRecord(false), self));
}

TEST(ReadPeerMemoryTest, CopiesFromAChildProcess) {
  // The child's copy of `data` is changed after fork; the parent reads the child's bytes.
  std::vector<uint64_t> data(1 << 17, 1);  // 1 MiB.
  int ready[2], quit[2];
  ASSERT_EQ(pipe(ready), 0);
  ASSERT_EQ(pipe(quit), 0);
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    for (size_t i = 0; i < data.size(); ++i) data[i] = i * 3 + 7;
    char c = 'r';
    (void)!write(ready[1], &c, 1);
    (void)!read(quit[0], &c, 1);  // Stay alive until the parent has read.
    _exit(0);
  }
  char c;
  ASSERT_EQ(read(ready[0], &c, 1), 1);
  std::vector<uint64_t> got(data.size(), 0);
  absl::Status s = ReadPeerMemory(child, reinterpret_cast<uint64_t>(data.data()), got.data(),
                                  static_cast<int64_t>(got.size() * sizeof(uint64_t)));
  (void)!write(quit[1], &c, 1);
  int status = 0;
  waitpid(child, &status, 0);
  ASSERT_TRUE(s.ok()) << s;
  for (size_t i = 0; i < got.size(); ++i) ASSERT_EQ(got[i], i * 3 + 7) << i;

  // The child is gone now.
  uint64_t word = 0;
  s = ReadPeerMemory(child, reinterpret_cast<uint64_t>(data.data()), &word, sizeof(word));
  EXPECT_EQ(s.code(), absl::StatusCode::kAborted) << s;
}

TEST(ReadPeerMemoryTest, UnmappedAddressIsDataLoss) {
  uint64_t word = 0;
  absl::Status s = ReadPeerMemory(getpid(), 8, &word, sizeof(word));
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss) << s;
  EXPECT_NE(s.message().find("process"), absl::string_view::npos) << s;
}

TEST(WritePeerMemoryTest, WritesRunsIntoAChildProcessInOrder) {
  // 3000 runs (more than one process_vm_writev takes) of varying lengths, some empty.
  std::vector<unsigned char> source(200000);
  for (size_t i = 0; i < source.size(); ++i) source[i] = static_cast<unsigned char>(i * 7 + 3);
  MemoryRuns runs;
  std::vector<unsigned char> want;
  size_t at = 0;
  for (int i = 0; i < 3000; ++i) {
    const int64_t len = i % 5 == 0 ? 0 : 1 + i % 37;
    runs.emplace_back(reinterpret_cast<const char*>(source.data()) + at, len);
    want.insert(want.end(), source.begin() + at, source.begin() + at + len);
    at += len + 11;  // Strided: gaps between runs.
  }
  std::vector<unsigned char> target(want.size() + 16, 0xAB);
  int go[2], back[2];
  ASSERT_EQ(pipe(go), 0);
  ASSERT_EQ(pipe(back), 0);
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    // Waits for the parent's write, then reports whether its copy of `target` holds `want`
    // followed by untouched bytes.
    char c;
    (void)!read(go[0], &c, 1);
    bool ok = std::equal(want.begin(), want.end(), target.begin());
    for (size_t i = want.size(); i < target.size(); ++i) ok &= target[i] == 0xAB;
    c = ok ? 'y' : 'n';
    (void)!write(back[1], &c, 1);
    _exit(0);
  }
  absl::Status s = WritePeerMemory(child, reinterpret_cast<uint64_t>(target.data()), runs);
  char c = 'g';
  (void)!write(go[1], &c, 1);
  ASSERT_EQ(read(back[0], &c, 1), 1);
  int status = 0;
  waitpid(child, &status, 0);
  ASSERT_TRUE(s.ok()) << s;
  EXPECT_EQ(c, 'y');
  // Nothing to write is fine; a dead process is ABORTED.
  EXPECT_TRUE(WritePeerMemory(child, 8, {}).ok());
  s = WritePeerMemory(child, reinterpret_cast<uint64_t>(target.data()), runs);
  EXPECT_EQ(s.code(), absl::StatusCode::kAborted) << s;
}

}  // namespace
}  // namespace shardcoord
