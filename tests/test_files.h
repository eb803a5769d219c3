#ifndef SHARDCOORD_TESTS_TEST_FILES_H_
#define SHARDCOORD_TESTS_TEST_FILES_H_

// Files an integration test writes and reads in its temporary folder: token files, logs,
// and the development certificates of tools/dev_certs.sh.

#include <string>
#include <vector>

#include "absl/status/status.h"

namespace shardcoord {

// $TEST_TMPDIR, else /tmp.
std::string TmpDir();

// The whole of `path` (empty when it cannot be read); `path` replaced by `bytes`.
std::string ReadFile(const std::string& path);
void WriteFile(const std::string& path, const std::string& bytes);

// TmpDir()/certs, and the certificate and key of `name` there ("ca", "coordinator", a
// worker's name).
std::string CertDir();
std::string Cert(const std::string& name);
std::string Key(const std::string& name);

// Runs tools/dev_certs.sh into CertDir(), with certificates for the workers `names`.
absl::Status MakeDevCerts(const std::vector<std::string>& names);

}  // namespace shardcoord

#endif  // SHARDCOORD_TESTS_TEST_FILES_H_
