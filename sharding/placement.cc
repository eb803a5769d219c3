#include "sharding/placement.h"

#include <optional>

#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "sharding/enum_names.h"

namespace shardcoord {
namespace {

constexpr EnumName<ReduceOp> kReduceOpNames[] = {{ReduceOp::kSum, "sum"},
                                                 {ReduceOp::kAvg, "avg"},
                                                 {ReduceOp::kMin, "min"},
                                                 {ReduceOp::kMax, "max"}};

absl::Status Bad(absl::string_view text, absl::string_view why) {
  return absl::InvalidArgumentError(absl::StrCat("placement '", text, "': ", why));
}

// Splits on `sep` outside () and [].
std::vector<std::string> SplitTopLevel(absl::string_view text, char sep) {
  std::vector<std::string> out;
  int depth = 0;
  std::string cur;
  for (char c : text) {
    if (c == '(' || c == '[') ++depth;
    if (c == ')' || c == ']') --depth;
    if (c == sep && depth == 0) {
      out.push_back(cur);
      cur.clear();
    } else {
      cur.push_back(c);
    }
  }
  out.push_back(cur);
  return out;
}

}  // namespace

std::string ReduceOpName(ReduceOp op) { return NameOf(kReduceOpNames, op); }

absl::StatusOr<ReduceOp> ParseReduceOp(absl::string_view name) {
  const std::string n = absl::AsciiStrToLower(absl::StripAsciiWhitespace(name));
  if (std::optional<ReduceOp> op = ValueOf(kReduceOpNames, n)) return *op;
  if (n == "mean") return ReduceOp::kAvg;
  return absl::InvalidArgumentError(
      absl::StrCat("unknown reduce op '", name, "' (want sum, avg, min or max)"));
}

std::string Placement::ToString() const {
  switch (kind) {
    case Kind::kReplicate:
      return "R";
    case Kind::kPartial:
      return absl::StrCat("P(", ReduceOpName(op), ")");
    case Kind::kShard:
      if (sizes.empty()) return absl::StrCat("S(", dim, ")");
      return absl::StrCat("S(", dim, ",[", absl::StrJoin(sizes, ","), "])");
  }
  return "?";
}

absl::StatusOr<Placement> ParsePlacement(absl::string_view text) {
  absl::string_view t = absl::StripAsciiWhitespace(text);
  if (t.empty()) return Bad(text, "empty item");
  // Name and optional parenthesised argument.
  absl::string_view name = t, arg;
  bool has_arg = false;
  if (size_t open = t.find('('); open != absl::string_view::npos) {
    if (t.back() != ')') return Bad(text, "missing ')'");
    name = absl::StripAsciiWhitespace(t.substr(0, open));
    arg = absl::StripAsciiWhitespace(t.substr(open + 1, t.size() - open - 2));
    has_arg = true;
  }
  const std::string lname = absl::AsciiStrToLower(name);
  if (lname == "r" || lname == "replicate") {
    if (has_arg && !arg.empty()) return Bad(text, "Replicate takes no argument");
    return Placement::Replicate();
  }
  if (lname == "p" || lname == "partial") {
    if (!has_arg || arg.empty()) return Placement::Partial(ReduceOp::kSum);
    absl::StatusOr<ReduceOp> op = ParseReduceOp(arg);
    if (!op.ok()) return Bad(text, op.status().message());
    return Placement::Partial(*op);
  }
  if (lname == "s" || lname == "shard") {
    if (!has_arg || arg.empty()) return Bad(text, "Shard needs a tensor dim, as in S(0)");
    std::vector<std::string> parts = SplitTopLevel(arg, ',');
    if (parts.size() > 2) return Bad(text, "want S(dim) or S(dim,[size,...])");
    int dim;
    if (!absl::SimpleAtoi(absl::StripAsciiWhitespace(parts[0]), &dim)) {
      return Bad(text, absl::StrCat("tensor dim '", parts[0], "' is not an integer"));
    }
    std::vector<int64_t> sizes;
    if (parts.size() == 2) {
      absl::string_view list = absl::StripAsciiWhitespace(parts[1]);
      if (!absl::ConsumePrefix(&list, "[") || !absl::ConsumeSuffix(&list, "]")) {
        return Bad(text, "explicit sizes must be a bracketed list, as in S(0,[3,5])");
      }
      if (absl::StripAsciiWhitespace(list).empty()) return Bad(text, "explicit sizes are empty");
      for (absl::string_view s : absl::StrSplit(list, ',')) {
        int64_t v;
        if (!absl::SimpleAtoi(absl::StripAsciiWhitespace(s), &v) || v < 0) {
          return Bad(text, absl::StrCat("size '", s, "' is not a non-negative integer"));
        }
        sizes.push_back(v);
      }
    }
    return Placement::Shard(dim, std::move(sizes));
  }
  return Bad(text, "unknown placement (want S(d), S(d,[sizes]), R or P(op))");
}

absl::StatusOr<std::vector<Placement>> ParsePlacements(absl::string_view text) {
  if (absl::StripAsciiWhitespace(text).empty()) {
    return absl::InvalidArgumentError("placements are empty");
  }
  std::vector<Placement> out;
  for (const std::string& item : SplitTopLevel(text, ',')) {
    absl::StatusOr<Placement> p = ParsePlacement(item);
    if (!p.ok()) return p.status();
    out.push_back(*std::move(p));
  }
  return out;
}

std::string PlacementsToString(absl::Span<const Placement> placements) {
  return absl::StrJoin(placements, ",",
                       [](std::string* out, const Placement& p) { out->append(p.ToString()); });
}

absl::StatusOr<FlatSpec> ParseFlatSpec(absl::string_view text) {
  FlatSpec spec;
  for (absl::string_view group : absl::StrSplit(text, ';')) {
    std::vector<FlatRange> ranges;
    group = absl::StripAsciiWhitespace(group);
    if (!group.empty()) {
      for (absl::string_view r : absl::StrSplit(group, ',')) {
        std::vector<absl::string_view> ends = absl::StrSplit(r, ':');
        FlatRange fr;
        if (ends.size() != 2 || !absl::SimpleAtoi(absl::StripAsciiWhitespace(ends[0]), &fr.start) ||
            !absl::SimpleAtoi(absl::StripAsciiWhitespace(ends[1]), &fr.end)) {
          return absl::InvalidArgumentError(
              absl::StrCat("flat range '", r, "' of rank ", spec.size(), " is not start:end"));
        }
        if (fr.start < 0 || fr.end < fr.start) {
          return absl::InvalidArgumentError(absl::StrCat("flat range '", r, "' of rank ",
                                                         spec.size(), " needs 0 <= start <= end"));
        }
        ranges.push_back(fr);
      }
    }
    spec.push_back(std::move(ranges));
  }
  return spec;
}

std::string FlatSpecToString(const FlatSpec& spec) {
  return absl::StrJoin(spec, ";", [](std::string* out, const std::vector<FlatRange>& rs) {
    absl::StrAppend(out, absl::StrJoin(rs, ",", [](std::string* o, const FlatRange& r) {
                      absl::StrAppend(o, r.start, ":", r.end);
                    }));
  });
}

}  // namespace shardcoord
