#include "worker/comm/gloo/same_host.h"

#include <sys/stat.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <random>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"

namespace shardcoord {
namespace {

std::string HostKey() {
  std::ifstream in("/proc/sys/kernel/random/boot_id");
  std::string boot;
  std::getline(in, boot);
  boot = std::string(absl::StripAsciiWhitespace(boot));
  struct stat st;
  if (boot.empty() || stat("/proc/self/ns/pid", &st) != 0) return "";
  return absl::StrCat(boot, "/", st.st_ino);
}

// A word whose value peers check through process_vm_readv; random, so a read that lands
// somewhere else by accident (a reused pid) does not pass.
const uint64_t* ProbeWord() {
  static const uint64_t* word = [] {
    std::random_device rd;
    return new uint64_t((uint64_t{rd()} << 32) ^ rd() ^ 1);
  }();
  return word;
}

// Linux's UIO_MAXIOV: the most iovecs one process_vm_writev takes.
constexpr size_t kMaxIovecs = 1024;

absl::Status PeerMemoryError(int err, const char* verb, int64_t bytes, uint64_t address,
                             int64_t pid) {
  const std::string what = absl::StrCat(verb, " ", bytes, " bytes at 0x", absl::Hex(address),
                                        " of process ", pid, ": ", std::strerror(err));
  if (err == ESRCH) return absl::AbortedError(what);
  if (err == EPERM) return absl::PermissionDeniedError(what);
  return absl::DataLossError(what);
}

}  // namespace

std::string SameHostRecord::Encode() const {
  return absl::StrCat(enabled ? 1 : 0, "|", host_key, "|", pid, "|", probe_address, "|",
                      probe_value);
}

absl::StatusOr<SameHostRecord> SameHostRecord::Decode(absl::string_view text) {
  std::vector<absl::string_view> f = absl::StrSplit(text, '|');
  SameHostRecord r;
  if (f.size() != 5 || (f[0] != "0" && f[0] != "1") || !absl::SimpleAtoi(f[2], &r.pid) ||
      !absl::SimpleAtoi(f[3], &r.probe_address) || !absl::SimpleAtoi(f[4], &r.probe_value)) {
    return absl::InvalidArgumentError(absl::StrCat("malformed same-host record '", text, "'"));
  }
  r.enabled = f[0] == "1";
  r.host_key = std::string(f[1]);
  return r;
}

SameHostRecord LocalSameHostRecord(bool enabled) {
  SameHostRecord r;
  r.enabled = enabled;
  if (!enabled) return r;
  r.host_key = HostKey();
  r.pid = getpid();
  r.probe_address = reinterpret_cast<uint64_t>(ProbeWord());
  r.probe_value = *ProbeWord();
  return r;
}

bool CanReadPeer(const SameHostRecord& self, const SameHostRecord& peer) {
  if (!self.enabled || !peer.enabled || self.host_key.empty() || self.host_key != peer.host_key) {
    return false;
  }
  uint64_t value = 0;
  return ReadPeerMemory(peer.pid, peer.probe_address, &value, sizeof(value)).ok() &&
         value == peer.probe_value;
}

absl::Status WritePeerMemory(int64_t pid, uint64_t remote_address, const MemoryRuns& runs) {
  // Local iovecs in batches; a short write (the kernel stops at an iovec it cannot finish)
  // resumes inside the run where it stopped.
  size_t next = 0;   // First run not fully written (empty runs are passed over).
  int64_t skip = 0;  // Bytes of runs[next] already written.
  uint64_t remote = remote_address;
  std::vector<struct iovec> local;
  while (next < runs.size()) {
    local.clear();
    int64_t batch = 0;
    for (size_t i = next; i < runs.size() && local.size() < kMaxIovecs; ++i) {
      const int64_t off = i == next ? skip : 0;
      const int64_t len = runs[i].second - off;
      if (len <= 0) continue;
      local.push_back({const_cast<char*>(runs[i].first) + off, static_cast<size_t>(len)});
      batch += len;
    }
    if (batch == 0) break;
    struct iovec r {
      reinterpret_cast<void*>(remote), static_cast<size_t>(batch)
    };
    const ssize_t n =
        process_vm_writev(static_cast<pid_t>(pid), local.data(), local.size(), &r, 1, 0);
    if (n <= 0) {
      const int err = n < 0 ? errno : EFAULT;
      if (err == EINTR) continue;
      return PeerMemoryError(err, "writing", batch, remote, pid);
    }
    remote += static_cast<uint64_t>(n);
    // Advance over what was written.
    int64_t left = n;
    while (left > 0 && next < runs.size()) {
      const int64_t rest = runs[next].second - skip;
      if (left >= rest) {
        left -= rest;
        ++next;
        skip = 0;
      } else {
        skip += left;
        left = 0;
      }
    }
  }
  return absl::OkStatus();
}

absl::Status ReadPeerMemory(int64_t pid, uint64_t remote_address, void* local, int64_t bytes) {
  int64_t done = 0;
  while (done < bytes) {
    // One call moves at most about 2 GiB (MAX_RW_COUNT); loop over the rest.
    const size_t len = static_cast<size_t>(std::min<int64_t>(bytes - done, int64_t{1} << 30));
    struct iovec l {
      static_cast<char*>(local) + done, len
    };
    struct iovec r {
      reinterpret_cast<void*>(remote_address + done), len
    };
    const ssize_t n = process_vm_readv(static_cast<pid_t>(pid), &l, 1, &r, 1, 0);
    if (n > 0) {
      done += n;
      continue;
    }
    const int err = n < 0 ? errno : EFAULT;
    if (err == EINTR) continue;
    return PeerMemoryError(err, "reading", bytes - done, remote_address + done, pid);
  }
  return absl::OkStatus();
}

}  // namespace shardcoord
