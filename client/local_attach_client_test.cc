// SharedMemory: sealed memfds, huge pages where the host reserved them.
#include "client/local_attach_client.h"

#include <fcntl.h>
#include <linux/magic.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <sys/vfs.h>

#include <cstring>
#include <fstream>
#include <memory>
#include <string>

#include "gtest/gtest.h"

namespace shardcoord {
namespace {

int64_t FreeHugePages() {
  std::ifstream in("/proc/meminfo");
  std::string key;
  int64_t value = 0;
  while (in >> key >> value) {
    if (key == "HugePages_Free:") return value;
    in.ignore(256, '\n');
  }
  return 0;
}

bool OnHugetlbfs(int fd) {
  struct statfs fs;
  return fstatfs(fd, &fs) == 0 && fs.f_type == HUGETLBFS_MAGIC;
}

void ExpectSealedZeroedAndWritable(const SharedMemory& m) {
  const int seals = fcntl(m.fd(), F_GET_SEALS);
  EXPECT_TRUE(seals & F_SEAL_SHRINK);
  EXPECT_TRUE(seals & F_SEAL_GROW);
  for (int64_t i = 0; i < m.bytes(); i += 4093) EXPECT_EQ(m.data()[i], 0) << i;
  m.data()[m.bytes() - 1] = 42;
  EXPECT_EQ(m.data()[m.bytes() - 1], 42);
}

TEST(SharedMemoryTest, ABufferSmallerThanAHugePageIsAnOrdinaryMemfd) {
  absl::StatusOr<std::unique_ptr<SharedMemory>> m = SharedMemory::Create(4096 + 17);
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_FALSE((*m)->huge_pages());
  EXPECT_FALSE(OnHugetlbfs((*m)->fd()));
  EXPECT_EQ((*m)->bytes(), 4096 + 17);
  ExpectSealedZeroedAndWritable(**m);
}

TEST(SharedMemoryTest, HugetlbOffLeavesHugePagesAlone) {
  setenv("SHARDCOORD_HUGETLB", "off", 1);
  absl::StatusOr<std::unique_ptr<SharedMemory>> m = SharedMemory::Create(int64_t{3} << 20);
  unsetenv("SHARDCOORD_HUGETLB");
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_FALSE((*m)->huge_pages());
  EXPECT_FALSE(OnHugetlbfs((*m)->fd()));
  ExpectSealedZeroedAndWritable(**m);
}

// Where huge pages are reserved and free, a buffer of at least one is a hugetlbfs memfd of
// whole huge pages; elsewhere an ordinary one (both lendable). Skips the first where none
// are free.
TEST(SharedMemoryTest, ABigBufferTakesReservedHugePages) {
  const int64_t free_pages = FreeHugePages();
  absl::StatusOr<std::unique_ptr<SharedMemory>> m = SharedMemory::Create(int64_t{3} << 20);
  ASSERT_TRUE(m.ok()) << m.status();
  ExpectSealedZeroedAndWritable(**m);
  if (free_pages < 2) {
    EXPECT_FALSE((*m)->huge_pages());
    GTEST_SKIP() << "HugePages_Free is " << free_pages << " (vm.nr_hugepages): fell back";
  }
  EXPECT_TRUE((*m)->huge_pages());
  EXPECT_TRUE(OnHugetlbfs((*m)->fd()));
  struct stat st;
  ASSERT_EQ(fstat((*m)->fd(), &st), 0);
  EXPECT_EQ(st.st_size % st.st_blksize, 0);
  EXPECT_GE(st.st_size, int64_t{3} << 20);
  EXPECT_EQ((*m)->bytes(), int64_t{3} << 20);
}

}  // namespace
}  // namespace shardcoord
