#ifndef SHARDCOORD_TESTS_TENSOR_CHECK_H_
#define SHARDCOORD_TESTS_TENSOR_CHECK_H_

// Value checks for integration tests: every element of a downloaded tensor against the fill
// formula (sharding/fill.h), per-rank buffers of Partial tensors whose reduction is that
// formula, and layout comparisons.

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "client/coordinator_client.h"
#include "proto/shardcoord.pb.h"
#include "sharding/box.h"
#include "sharding/dtype.h"
#include "sharding/fill.h"

namespace shardcoord {

// OK if `data` holds exactly the tensor of `shape` and `dtype` whose element i is
// FillValue(kind, seed, i) converted to `dtype` (compared bit for bit). Otherwise
// DATA_LOSS naming how many elements differ and the first few (index, got, want).
absl::Status CheckFill(absl::string_view data, DType dtype, const Shape& shape, FillKind kind,
                       uint64_t seed = 0);

// Downloads tensor `name` through `client` and checks its header (shape, dtype) and every
// value as CheckFill does.
absl::Status DownloadAndCheck(CoordinatorClient& client, const std::string& name, DType dtype,
                              const Shape& shape, FillKind kind, uint64_t seed = 0);

// Value of element `flat_index` in partial contribution `partial_index` of `num_partials`
// (reduce op sum) such that the contributions sum to the arange value exactly: every
// contribution but the first holds a small integer k(i) != 0, the first holds i - (n-1) k(i).
// All are integers, so f32 sums are exact for tensors of fewer than 2^23 elements.
double PartialArangeValue(int64_t flat_index, int64_t partial_index, int64_t num_partials);

// The local buffer of one rank (its chunks at their local offsets, row-major inside each)
// of a tensor whose reduction is arange: chunk values from PartialArangeValue with the
// chunk's partial_index. `num_partials` 1 gives plain arange chunks.
absl::StatusOr<std::string> PartialArangeBuffer(const v1::RankChunks& rank, DType dtype,
                                                const Shape& global_shape, int64_t num_partials);

// Creates tensor `name` (uninitialised) on `mesh` with `placements_text`, then uploads every
// rank's local buffer (PartialArangeBuffer) so that the tensor's value is arange whatever
// Partial placements it has. Returns the tensor after the last upload.
absl::StatusOr<v1::TensorInfo> CreatePartialArange(CoordinatorClient& client,
                                                   const std::string& name, const Shape& shape,
                                                   DType dtype, const std::string& mesh,
                                                   const std::string& placements_text);

// A ShardingSpec from CLI syntax: placements ("S(0),R") or, with `flat`, a flat spec
// ("0:4;4:8"). Empty `mesh` = the tensor's current mesh.
v1::ShardingSpec SpecFromText(const std::string& mesh, const std::string& text, bool flat = false);

// CreateMesh with `shape` ("2x2" style dims), `workers` by name and optional dim names.
absl::StatusOr<v1::MeshInfo> MakeMesh(CoordinatorClient& client, const std::string& name,
                                      const Shape& shape, const std::vector<std::string>& workers,
                                      const std::vector<std::string>& dim_names = {});

// The meshes the layout tests share, over a cluster of workers w0..w3: "line" (4), "grid"
// (2x2), "line_rev" (4, workers reversed), "pair" (2: w1, w2), "trio" (3: w0, w2, w3).
// Creates them once per process; returns them by name.
absl::StatusOr<std::map<std::string, v1::MeshInfo>> MakeTestMeshes(CoordinatorClient& client);

// Creates tensor `name` filled with `init` (seed 0) on `mesh` with the spec in CLI syntax.
absl::StatusOr<v1::TensorInfo> CreateFilled(CoordinatorClient& client, const std::string& name,
                                            const Shape& shape, DType dtype,
                                            const std::string& mesh, const std::string& spec_text,
                                            bool flat = false, v1::InitKind init = v1::ARANGE);

// One side of a copy in the copy tests: a mesh and a spec in CLI syntax (a flat spec when
// `flat`).
struct CopyEndpoint {
  std::string mesh;
  std::string spec;
  bool flat = false;
};
bool HasPartial(const CopyEndpoint& e);
// A copy's source `name` at `at`: arange, as partial contributions summing to it when Partial.
absl::StatusOr<v1::TensorInfo> CreateCopySource(CoordinatorClient& client, const std::string& name,
                                                const Shape& shape, DType dtype,
                                                const CopyEndpoint& at);
// A copy's destination `name` at `at`: random values, zeros when Partial.
absl::StatusOr<v1::TensorInfo> CreateCopyDestination(CoordinatorClient& client,
                                                     const std::string& name, const Shape& shape,
                                                     DType dtype, const CopyEndpoint& at);

// A Redistribute request to `spec_text` on `mesh` (empty = current mesh).
v1::RedistributeRequest RedistributeTo(const std::string& tensor, const std::string& mesh,
                                       const std::string& spec_text, bool flat = false,
                                       bool wait = true);

// The layout the coordinator should report for a tensor of `shape` on `mesh` with a spec in
// CLI syntax (placements "S(0),R" or, with `flat`, "0:4;4:8"), from the sharding core.
absl::StatusOr<v1::Layout> ExpectedLayout(const v1::MeshInfo& mesh, const Shape& shape,
                                          const std::string& spec_text, bool flat = false);

// OK if both layouts give every rank the same chunks (box, partial index, local offset),
// same global shape and partial count; checksums are not compared. Otherwise FAILED_PRECONDITION
// naming the first difference.
absl::Status SameChunks(const v1::Layout& got, const v1::Layout& want);

}  // namespace shardcoord

#endif  // SHARDCOORD_TESTS_TENSOR_CHECK_H_
