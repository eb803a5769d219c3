#include "worker/memory/memory_budget.h"

#include <unistd.h>

#include <algorithm>
#include <fstream>
#include <limits>
#include <string>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "common/byte_size.h"

namespace shardcoord {

MemoryBudget::MemoryBudget(std::string owner, int64_t budget_bytes)
    : owner_(std::move(owner)), budget_(budget_bytes) {}

absl::Status MemoryBudget::Reserve(int64_t bytes, absl::string_view what) {
  if (bytes < 0) {
    return absl::InvalidArgumentError(absl::StrCat(owner_, ": reserving ", bytes, " bytes"));
  }
  absl::MutexLock lock(&mu_);
  if (budget_ > 0 && bytes > budget_ - used_) {
    const int64_t free = std::max<int64_t>(0, budget_ - used_);
    return absl::ResourceExhaustedError(absl::StrCat(
        owner_, ": memory budget exceeded: ", what, " needs ", bytes, " bytes (",
        FormatBytes(bytes), "), ", free, " bytes (", FormatBytes(free), ") free of the ", budget_,
        "-byte budget (", FormatBytes(budget_), "; ", used_, " bytes used)"));
  }
  used_ += bytes;
  peak_ = std::max(peak_, used_);
  for (auto& [id, high] : watermarks_) high = std::max(high, used_);
  return absl::OkStatus();
}

void MemoryBudget::Release(int64_t bytes) {
  absl::MutexLock lock(&mu_);
  used_ -= bytes;
}

int64_t MemoryBudget::used() const {
  absl::MutexLock lock(&mu_);
  return used_;
}

int64_t MemoryBudget::free() const {
  absl::MutexLock lock(&mu_);
  if (budget_ <= 0) return std::numeric_limits<int64_t>::max();
  return std::max<int64_t>(0, budget_ - used_);
}

int64_t MemoryBudget::peak() const {
  absl::MutexLock lock(&mu_);
  return peak_;
}

int64_t MemoryBudget::ResetPeak() {
  absl::MutexLock lock(&mu_);
  const int64_t peak = peak_;
  peak_ = used_;
  return peak;
}

int64_t MemoryBudget::OpenWatermark() {
  absl::MutexLock lock(&mu_);
  const int64_t id = next_watermark_++;
  watermarks_[id] = used_;
  return id;
}

int64_t MemoryBudget::CloseWatermark(int64_t id) {
  absl::MutexLock lock(&mu_);
  auto it = watermarks_.find(id);
  if (it == watermarks_.end()) return 0;
  const int64_t high = it->second;
  watermarks_.erase(it);
  return high;
}

BudgetedMemorySpace::BudgetedMemorySpace(MemorySpace* inner, MemoryBudget* budget)
    : inner_(inner),
      budget_(budget),
      allocation_name_(absl::StrCat("an allocation in ", inner->name())) {}

BudgetedMemorySpace::~BudgetedMemorySpace() = default;

absl::StatusOr<Allocation> BudgetedMemorySpace::Allocate(int64_t bytes) {
  if (bytes < 0) return inner_->Allocate(bytes);  // The space's own INVALID_ARGUMENT.
  if (absl::Status s = budget_->Reserve(bytes, allocation_name_); !s.ok()) {
    return s;
  }
  absl::StatusOr<Allocation> a = inner_->Allocate(bytes);
  if (!a.ok()) {
    budget_->Release(bytes);
    return a.status();
  }
  absl::MutexLock lock(&mu_);
  counted_[a->data] = bytes;
  return a;
}

void BudgetedMemorySpace::Free(const Allocation& allocation) {
  if (allocation.data == nullptr) return;
  int64_t bytes = 0;
  {
    absl::MutexLock lock(&mu_);
    auto it = counted_.find(allocation.data);
    if (it != counted_.end()) {
      bytes = it->second;
      counted_.erase(it);
    }
  }
  inner_->Free(allocation);
  budget_->Release(bytes);
}

namespace {

// A cgroup memory limit file's value: a number of bytes, or nothing ("max", absent).
int64_t ReadCgroupLimit(const char* path) {
  std::ifstream in(path);
  std::string text;
  if (!in || !std::getline(in, text)) return 0;
  int64_t bytes = 0;
  if (!absl::SimpleAtoi(absl::StripAsciiWhitespace(text), &bytes) || bytes <= 0) return 0;
  return bytes;
}

}  // namespace

int64_t HostMemoryLimit() {
  const int64_t pages = sysconf(_SC_PHYS_PAGES);
  const int64_t page_size = sysconf(_SC_PAGE_SIZE);
  int64_t limit = pages > 0 && page_size > 0 ? pages * page_size : 0;
  // cgroup v2, then v1 (where "no limit" is a huge number, which min() ignores).
  for (const char* path :
       {"/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes"}) {
    const int64_t cgroup = ReadCgroupLimit(path);
    if (cgroup > 0 && (limit == 0 || cgroup < limit)) limit = cgroup;
  }
  return limit;
}

absl::StatusOr<MemoryBudgetSetting> ParseMemoryBudgetFlag(absl::string_view text) {
  MemoryBudgetSetting setting;
  const absl::string_view t = absl::StripAsciiWhitespace(text);
  if (t.empty()) return setting;
  absl::string_view number = t;
  if (absl::ConsumeSuffix(&number, "%")) {
    double percent = 0;
    if (!absl::SimpleAtod(absl::StripAsciiWhitespace(number), &percent) || !(percent > 0) ||
        percent > 100) {
      return absl::InvalidArgumentError(
          absl::StrCat("--memory-budget: '", text, "' is not a percentage in (0, 100]"));
    }
    setting.fraction = percent / 100;
    return setting;
  }
  if (absl::Status s = ParseByteSizeFlag("memory-budget", t, &setting.bytes); !s.ok()) return s;
  if (setting.bytes <= 0) {
    return absl::InvalidArgumentError("--memory-budget: must be more than 0 bytes");
  }
  return setting;
}

absl::StatusOr<int64_t> ResolveMemoryBudget(const MemoryBudgetSetting& setting,
                                            MemorySpace& space) {
  if (setting.bytes > 0) return setting.bytes;
  int64_t base = 0;
  if (space.is_host()) {
    base = HostMemoryLimit();
    if (base <= 0) {
      return absl::FailedPreconditionError(
          "cannot tell this machine's physical memory; give --memory-budget in bytes");
    }
  } else {
    absl::StatusOr<int64_t> free = space.DeviceFreeBytes();
    if (!free.ok()) return free.status();
    base = *free;
  }
  return std::max<int64_t>(1, static_cast<int64_t>(static_cast<double>(base) * setting.fraction));
}

}  // namespace shardcoord
