#include "sharding/names.h"

#include <string>

#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "sharding/field_status.h"

namespace shardcoord {

using field_status::Bad;

absl::Status ValidateName(absl::string_view name, absl::string_view field) {
  if (name.empty()) return Bad(field, "empty");
  if (name.size() > kMaxNameBytes) {
    return Bad(field, name.size(), " bytes, more than the limit of ", kMaxNameBytes);
  }
  for (size_t i = 0; i < name.size(); ++i) {
    const char c = name[i];
    if (absl::ascii_isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '.' || c == '-' ||
        c == ':' || c == '/') {
      continue;
    }
    return Bad(field, "'", absl::CHexEscape(name), "' has ",
               absl::ascii_isprint(static_cast<unsigned char>(c))
                   ? absl::StrCat("'", std::string(1, c), "'")
                   : absl::StrCat("byte 0x", absl::Hex(static_cast<unsigned char>(c))),
               " at ", i, "; names use letters, digits and _ . - : /");
  }
  return absl::OkStatus();
}

absl::Status ValidateWorkerName(absl::string_view name, absl::string_view field) {
  if (name.empty()) return Bad(field, "empty");
  if (name.size() > kMaxWorkerNameBytes) {
    return Bad(field, name.size(), " bytes, more than the limit of ", kMaxWorkerNameBytes);
  }
  for (size_t i = 0; i < name.size(); ++i) {
    const unsigned char c = static_cast<unsigned char>(name[i]);
    if (absl::ascii_isalnum(c) || (i > 0 && (c == '_' || c == '.' || c == '-' || c == ':'))) {
      continue;
    }
    return Bad(field, "'", absl::CHexEscape(name), "' has ",
               absl::ascii_isprint(c) ? absl::StrCat("'", std::string(1, name[i]), "'")
                                      : absl::StrCat("byte 0x", absl::Hex(c)),
               " at ", i,
               "; worker names use letters, digits and _ . - : and start with a letter or digit");
  }
  return absl::OkStatus();
}

}  // namespace shardcoord
