#include "tests/test_files.h"

#include <sys/wait.h>

#include <cstdlib>
#include <fstream>
#include <memory>
#include <sstream>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "tests/process.h"

namespace shardcoord {

std::string TmpDir() {
  const char* dir = std::getenv("TEST_TMPDIR");
  return dir != nullptr ? dir : "/tmp";
}

std::string ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

void WriteFile(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << bytes;
}

std::string CertDir() { return absl::StrCat(TmpDir(), "/certs"); }
std::string Cert(const std::string& name) { return absl::StrCat(CertDir(), "/", name, ".pem"); }
std::string Key(const std::string& name) { return absl::StrCat(CertDir(), "/", name, ".key"); }

absl::Status MakeDevCerts(const std::vector<std::string>& names) {
  absl::StatusOr<std::string> script = RunfilePath("tools/dev_certs.sh");
  if (!script.ok()) return script.status();
  std::vector<std::string> argv = {"/bin/bash", *script, CertDir()};
  argv.insert(argv.end(), names.begin(), names.end());
  ProcessOptions po;
  po.name = "dev_certs";
  absl::StatusOr<std::unique_ptr<Process>> p = Process::Start(argv, po);
  if (!p.ok()) return p.status();
  absl::StatusOr<int> status = (*p)->Wait(absl::Seconds(120));
  if (!status.ok()) return status.status();
  if (!WIFEXITED(*status) || WEXITSTATUS(*status) != 0) {
    return absl::InternalError(absl::StrCat("dev_certs.sh ", Process::DescribeWaitStatus(*status)));
  }
  return absl::OkStatus();
}

}  // namespace shardcoord
