#include "worker/plans/fragment.h"

#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "sharding/cast.h"

namespace shardcoord {
namespace {

absl::Status Bad(const std::string& field, const std::string& what) {
  return absl::InvalidArgumentError(absl::StrCat(field, ": ", what));
}

int FragmentNdim(const FragmentShape& f) {
  if (!f.source.chunks.empty()) return f.source.chunks[0].box.ndim();
  if (!f.target.chunks.empty()) return f.target.chunks[0].box.ndim();
  return -1;
}

// Checks a piece this rank reads from its source chunks.
absl::Status CheckSourcePiece(const FragmentShape& f, const std::string& field, const Box& box,
                              int64_t partial_index) {
  if (box.Empty()) return absl::OkStatus();
  if (FindContainingChunk(f.source, box, SourceIsPartial(f), partial_index) < 0) {
    return Bad(field,
               absl::StrCat("box ", box.ToString(),
                            SourceIsPartial(f) ? absl::StrCat(" of contribution ", partial_index)
                                               : std::string(),
                            " lies in no source chunk of rank ", f.rank));
  }
  return absl::OkStatus();
}

// Checks a piece this rank writes into its target chunks.
absl::Status CheckTargetPiece(const FragmentShape& f, const std::string& field, const Box& box) {
  if (box.Empty()) return absl::OkStatus();
  for (const Chunk& c : f.target.chunks) {
    if (NeedsValue(f, c) && c.box.Contains(box)) return absl::OkStatus();
  }
  return Bad(field, absl::StrCat("box ", box.ToString(), " lies in no target chunk of rank ",
                                 f.rank, " that takes a value"));
}

// Checks transfers' boxes and byte counts, and the pieces this rank reads and writes;
// returns their bytes.
absl::StatusOr<int64_t> CheckTransfers(const FragmentShape& f, int ndim,
                                       const std::string& field_name,
                                       const std::vector<Transfer>& transfers) {
  const int64_t esize = ElementSize(f.wire_dtype());  // Transfers carry the wire dtype.
  int64_t bytes = 0;
  for (size_t j = 0; j < transfers.size(); ++j) {
    const Transfer& t = transfers[j];
    const std::string field = absl::StrCat(field_name, "[", j, "]");
    if (ndim >= 0 && t.box.ndim() != ndim) {
      return Bad(field, absl::StrCat("box ", t.box.ToString(), " does not have ", ndim, " dims"));
    }
    // Checked: a box's element count fits in int64 but its bytes need not, and a wrapped
    // product could match a bogus `bytes`.
    absl::StatusOr<int64_t> box_bytes = CheckedBytes(t.box.shape(), esize);
    if (!box_bytes.ok()) return Bad(field, std::string(box_bytes.status().message()));
    if (t.bytes != *box_bytes) {
      return Bad(field, absl::StrCat("bytes ", t.bytes, " but box ", t.box.ToString(), " holds ",
                                     *box_bytes, " bytes of ", DTypeName(f.wire_dtype())));
    }
    if (t.reduce && f.cast_to.has_value()) {
      return Bad(field, absl::StrCat("a reducing transfer in a shape that casts ",
                                     DTypeName(f.dtype), " to ", DTypeName(*f.cast_to)));
    }
    absl::StatusOr<int64_t> sum = CheckedAdd(bytes, t.bytes);
    if (!sum.ok()) return Bad(field_name, "transfers move more than 2^63 bytes");
    bytes = *sum;
    if (t.src == f.rank) {
      if (absl::Status s = CheckSourcePiece(f, field, t.box, t.partial_index); !s.ok()) return s;
    }
    if (t.dst == f.rank) {
      if (absl::Status s = CheckTargetPiece(f, field, t.box); !s.ok()) return s;
    }
  }
  return bytes;
}

absl::Status ValidateShape(const FragmentShape& f,
                           const absl::flat_hash_map<int64_t, int64_t>& member_incarnations) {
  const int ndim = FragmentNdim(f);
  if (f.divide_by < 1) return Bad("divide_by", absl::StrCat(f.divide_by, " < 1"));
  if (f.cast_to.has_value()) {
    if (absl::Status s = CheckCast(f.dtype, *f.cast_to); !s.ok()) {
      return Bad("target_dtype", std::string(s.message()));
    }
    if (f.num_partials > 1 || f.divide_by > 1) {
      return Bad("target_dtype", absl::StrCat("a shape with ", f.num_partials,
                                              " partial contributions cannot cast ",
                                              DTypeName(f.dtype), " to ", DTypeName(*f.cast_to)));
    }
  }
  for (const auto& [name, rc] : {std::pair<const char*, const RankChunks*>{"source", &f.source},
                                 std::pair<const char*, const RankChunks*>{"target", &f.target}}) {
    for (size_t i = 0; i < rc->chunks.size(); ++i) {
      const Chunk& c = rc->chunks[i];
      if (c.box.ndim() != ndim) {
        return Bad(absl::StrCat(name, ".chunks[", i, "]"),
                   absl::StrCat("box ", c.box.ToString(), " has ", c.box.ndim(),
                                " dims, other chunks ", ndim));
      }
    }
  }
  for (size_t i = 0; i < f.local_copies.size(); ++i) {
    const LocalCopy& c = f.local_copies[i];
    const std::string field = absl::StrCat("local_copies[", i, "]");
    if (ndim >= 0 && c.box.ndim() != ndim) {
      return Bad(field, absl::StrCat("box ", c.box.ToString(), " does not have ", ndim, " dims"));
    }
    if (c.reduce && f.cast_to.has_value()) {
      return Bad(field, absl::StrCat("a reducing copy in a shape that casts ", DTypeName(f.dtype),
                                     " to ", DTypeName(*f.cast_to)));
    }
    if (absl::Status s = CheckSourcePiece(f, field, c.box, c.partial_index); !s.ok()) return s;
    if (absl::Status s = CheckTargetPiece(f, field, c.box); !s.ok()) return s;
  }
  for (size_t i = 0; i < f.steps.size(); ++i) {
    const Step& step = f.steps[i];
    const std::string sfield = absl::StrCat("steps[", i, "]");
    for (int64_t member : step.ranks) {
      if (!member_incarnations.contains(member)) {
        return Bad(sfield, absl::StrCat("member rank ", member,
                                        " has no entry in member_ranks/member_incarnations"));
      }
    }
    absl::StatusOr<int64_t> bytes = CheckTransfers(f, ndim, sfield + ".transfers", step.transfers);
    if (!bytes.ok()) return bytes.status();
    if (step.bytes != 0 && step.bytes != *bytes) {
      return Bad(sfield + ".bytes", absl::StrCat(step.bytes, " but its transfers move ", *bytes));
    }
  }
  // A fused group member's own transfers.
  if (absl::StatusOr<int64_t> bytes = CheckTransfers(f, ndim, "transfers", f.transfers);
      !bytes.ok()) {
    return bytes.status();
  }
  return absl::OkStatus();
}

}  // namespace

int FindContainingChunk(const RankChunks& chunks, const Box& box, bool match_partial,
                        int64_t partial_index) {
  for (size_t i = 0; i < chunks.chunks.size(); ++i) {
    const Chunk& c = chunks.chunks[i];
    if (match_partial && c.partial_index != partial_index) continue;
    if (c.box.ndim() == box.ndim() && c.box.Contains(box)) return static_cast<int>(i);
  }
  return -1;
}

absl::Status ValidateFragment(const Fragment& f) {
  for (size_t i = 0; i < f.shapes.size(); ++i) {
    if (absl::Status s = ValidateShape(f.shapes[i], f.member_incarnations); !s.ok()) {
      if (!f.fused) return s;
      return absl::Status(s.code(), absl::StrCat("shapes[", i, "].", s.message()));
    }
  }
  for (size_t i = 0; i < f.members.size(); ++i) {
    const int shape = f.members[i].shape;
    if (shape < 0 || static_cast<size_t>(shape) >= f.shapes.size()) {
      return Bad(absl::StrCat("members[", i, "].shape"),
                 absl::StrCat(shape, " is not one of the ", f.shapes.size(), " shapes"));
    }
  }
  if (!f.fused && (f.shapes.size() != 1 || f.members.size() != 1)) {
    return absl::InvalidArgumentError(absl::StrCat("a plan's fragment has ", f.shapes.size(),
                                                   " shapes and ", f.members.size(),
                                                   " members, not one each"));
  }
  return absl::OkStatus();
}

absl::StatusOr<Fragment> ParseFragment(const v1::PlanFragment& proto) {
  absl::StatusOr<Fragment> f = FragmentFromProto(proto);
  if (!f.ok()) return f.status();
  if (absl::Status s = ValidateFragment(*f); !s.ok()) return s;
  return f;
}

}  // namespace shardcoord
