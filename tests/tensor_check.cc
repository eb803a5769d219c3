#include "tests/tensor_check.h"

#include <algorithm>
#include <cstring>
#include <map>
#include <tuple>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "proto/convert.h"
#include "sharding/layout.h"
#include "sharding/mesh.h"
#include "sharding/placement.h"

namespace shardcoord {
namespace {

constexpr int kMaxReported = 5;

// Calls f(flat_index, i) for the i-th element (row-major) of `box` in a tensor of `shape`.
template <typename F>
void ForEachElement(const Shape& shape, const Box& box, F&& f) {
  if (box.Empty()) return;
  const int nd = box.ndim();
  const Shape strides = RowMajorStrides(shape);
  if (nd == 0) {
    f(int64_t{0}, int64_t{0});
    return;
  }
  Shape idx(nd, 0);
  const int64_t volume = box.Volume();
  const int64_t inner = box.shape(nd - 1);
  for (int64_t i = 0; i < volume; i += inner) {
    int64_t base = 0;
    for (int d = 0; d < nd; ++d) base += (box.offset(d) + idx[d]) * strides[d];
    for (int64_t j = 0; j < inner; ++j) f(base + j, i + j);
    for (int d = nd - 2; d >= 0; --d) {
      if (++idx[d] < box.shape(d)) break;
      idx[d] = 0;
    }
  }
}

std::string ShapeText(const google::protobuf::RepeatedField<int64_t>& dims) {
  return ShapeToString(Shape(dims.begin(), dims.end()));
}

}  // namespace

absl::Status CheckFill(absl::string_view data, DType dtype, const Shape& shape, FillKind kind,
                       uint64_t seed) {
  absl::StatusOr<int64_t> bytes = CheckedBytes(shape, ElementSize(dtype));
  if (!bytes.ok()) return bytes.status();
  if (static_cast<int64_t>(data.size()) != *bytes) {
    return absl::DataLossError(absl::StrCat("got ", data.size(), " bytes for a ", DTypeName(dtype),
                                            " tensor of shape ", ShapeToString(shape), " (", *bytes,
                                            " bytes)"));
  }
  const int64_t size = ElementSize(dtype);
  const int64_t n = *bytes / size;
  int64_t wrong = 0;
  std::vector<std::string> examples;
  char want[8];
  for (int64_t i = 0; i < n; ++i) {
    StoreFromDouble(want, dtype, 0, FillValue(kind, seed, i));
    if (std::memcmp(want, data.data() + i * size, static_cast<size_t>(size)) == 0) continue;
    if (++wrong <= kMaxReported) {
      examples.push_back(absl::StrCat("[", i, "] = ", LoadAsDouble(data.data(), dtype, i),
                                      " (want ", LoadAsDouble(want, dtype, 0), ")"));
    }
  }
  if (wrong == 0) return absl::OkStatus();
  return absl::DataLossError(absl::StrCat(wrong, " of ", n, " elements differ from the fill; ",
                                          absl::StrJoin(examples, ", ")));
}

absl::Status DownloadAndCheck(CoordinatorClient& client, const std::string& name, DType dtype,
                              const Shape& shape, FillKind kind, uint64_t seed) {
  std::string data;
  absl::StatusOr<v1::TensorHeader> header = client.Download(name, &data);
  if (!header.ok()) return header.status();
  if (Shape(header->shape().begin(), header->shape().end()) != shape) {
    return absl::DataLossError(absl::StrCat("download of ", name, " has shape ",
                                            ShapeText(header->shape()), ", want ",
                                            ShapeToString(shape)));
  }
  if (header->dtype() != DTypeToProto(dtype)) {
    return absl::DataLossError(absl::StrCat("download of ", name, " has dtype ",
                                            v1::DType_Name(header->dtype()), ", want ",
                                            DTypeName(dtype)));
  }
  absl::Status s = CheckFill(data, dtype, shape, kind, seed);
  if (!s.ok()) return absl::DataLossError(absl::StrCat(name, ": ", s.message()));
  return absl::OkStatus();
}

double PartialArangeValue(int64_t flat_index, int64_t partial_index, int64_t num_partials) {
  const double k = static_cast<double>(flat_index % 5 + 1);
  if (num_partials <= 1) return static_cast<double>(flat_index);
  if (partial_index != 0) return k;
  return static_cast<double>(flat_index) - static_cast<double>(num_partials - 1) * k;
}

absl::StatusOr<std::string> PartialArangeBuffer(const v1::RankChunks& rank, DType dtype,
                                                const Shape& global_shape, int64_t num_partials) {
  const int64_t size = ElementSize(dtype);
  absl::StatusOr<int64_t> bytes = CheckedMul(rank.local_elements(), size);
  if (!bytes.ok()) return bytes.status();
  std::string buffer(static_cast<size_t>(*bytes), '\0');
  for (int c = 0; c < rank.chunks_size(); ++c) {
    absl::StatusOr<Chunk> chunk = ChunkFromProto(rank.chunks(c), absl::StrCat("chunks[", c, "]"));
    if (!chunk.ok()) return chunk.status();
    if (chunk->local_offset + chunk->box.Volume() > rank.local_elements()) {
      return absl::InvalidArgumentError(absl::StrCat("chunk ", chunk->box.ToString(), " of rank ",
                                                     rank.rank(), " exceeds its local buffer"));
    }
    char* out = buffer.data() + chunk->local_offset * size;
    const int64_t p = chunk->partial_index;
    ForEachElement(global_shape, chunk->box, [&](int64_t flat, int64_t i) {
      StoreFromDouble(out, dtype, i, PartialArangeValue(flat, p, num_partials));
    });
  }
  return buffer;
}

absl::StatusOr<v1::TensorInfo> CreatePartialArange(CoordinatorClient& client,
                                                   const std::string& name, const Shape& shape,
                                                   DType dtype, const std::string& mesh,
                                                   const std::string& placements_text) {
  v1::CreateTensorRequest create;
  create.set_name(name);
  for (int64_t d : shape) create.add_shape(d);
  create.set_dtype(DTypeToProto(dtype));
  *create.mutable_spec() = SpecFromText(mesh, placements_text);
  create.set_init(v1::UNINITIALIZED);
  absl::StatusOr<v1::TensorInfo> info = client.CreateTensor(create);
  if (!info.ok()) return info.status();
  const v1::Layout layout = info->layout();
  const int64_t num_partials = std::max<int64_t>(1, layout.num_partials());
  for (const v1::RankChunks& rank : layout.ranks()) {
    absl::StatusOr<std::string> buffer = PartialArangeBuffer(rank, dtype, shape, num_partials);
    if (!buffer.ok()) return buffer.status();
    v1::TensorHeader header;
    header.set_name(name);
    for (int64_t d : shape) header.add_shape(d);
    header.set_dtype(DTypeToProto(dtype));
    *header.mutable_spec() = create.spec();
    header.set_has_rank(true);
    header.set_rank(rank.rank());
    info = client.Upload(header, *buffer);
    if (!info.ok()) {
      return absl::Status(info.status().code(), absl::StrCat("upload of rank ", rank.rank(), " of ",
                                                             name, ": ", info.status().message()));
    }
  }
  return info;
}

v1::ShardingSpec SpecFromText(const std::string& mesh, const std::string& text, bool flat) {
  v1::ShardingSpec spec;
  spec.set_mesh(mesh);
  if (flat) {
    spec.set_flat_text(text);
  } else {
    spec.set_placements_text(text);
  }
  return spec;
}

absl::StatusOr<v1::MeshInfo> MakeMesh(CoordinatorClient& client, const std::string& name,
                                      const Shape& shape, const std::vector<std::string>& workers,
                                      const std::vector<std::string>& dim_names) {
  v1::CreateMeshRequest request;
  request.set_name(name);
  for (int64_t d : shape) request.add_shape(d);
  for (const std::string& w : workers) request.add_workers(w);
  for (const std::string& d : dim_names) request.add_dim_names(d);
  return client.CreateMesh(request);
}

absl::StatusOr<std::map<std::string, v1::MeshInfo>> MakeTestMeshes(CoordinatorClient& client) {
  static auto* made = new std::map<std::string, v1::MeshInfo>();
  if (!made->empty()) return *made;
  struct Def {
    std::string name;
    Shape shape;
    std::vector<std::string> workers;
  };
  const std::vector<Def> defs = {
      {"line", {4}, {"w0", "w1", "w2", "w3"}},     {"grid", {2, 2}, {"w0", "w1", "w2", "w3"}},
      {"line_rev", {4}, {"w3", "w2", "w1", "w0"}}, {"pair", {2}, {"w1", "w2"}},
      {"trio", {3}, {"w0", "w2", "w3"}},
  };
  std::map<std::string, v1::MeshInfo> meshes;
  for (const Def& d : defs) {
    absl::StatusOr<v1::MeshInfo> mesh = MakeMesh(client, d.name, d.shape, d.workers);
    if (!mesh.ok()) {
      return absl::Status(mesh.status().code(),
                          absl::StrCat("mesh ", d.name, ": ", mesh.status().message()));
    }
    meshes[d.name] = *std::move(mesh);
  }
  *made = meshes;
  return meshes;
}

absl::StatusOr<v1::TensorInfo> CreateFilled(CoordinatorClient& client, const std::string& name,
                                            const Shape& shape, DType dtype,
                                            const std::string& mesh, const std::string& spec_text,
                                            bool flat, v1::InitKind init) {
  v1::CreateTensorRequest request;
  request.set_name(name);
  for (int64_t d : shape) request.add_shape(d);
  request.set_dtype(DTypeToProto(dtype));
  *request.mutable_spec() = SpecFromText(mesh, spec_text, flat);
  request.set_init(init);
  return client.CreateTensor(request);
}

bool HasPartial(const CopyEndpoint& e) { return !e.flat && absl::StrContains(e.spec, "P"); }

absl::StatusOr<v1::TensorInfo> CreateCopySource(CoordinatorClient& client, const std::string& name,
                                                const Shape& shape, DType dtype,
                                                const CopyEndpoint& at) {
  return HasPartial(at) ? CreatePartialArange(client, name, shape, dtype, at.mesh, at.spec)
                        : CreateFilled(client, name, shape, dtype, at.mesh, at.spec, at.flat);
}

absl::StatusOr<v1::TensorInfo> CreateCopyDestination(CoordinatorClient& client,
                                                     const std::string& name, const Shape& shape,
                                                     DType dtype, const CopyEndpoint& at) {
  return CreateFilled(client, name, shape, dtype, at.mesh, at.spec, at.flat,
                      HasPartial(at) ? v1::ZEROS : v1::RANDOM);
}

v1::RedistributeRequest RedistributeTo(const std::string& tensor, const std::string& mesh,
                                       const std::string& spec_text, bool flat, bool wait) {
  v1::RedistributeRequest request;
  request.set_tensor(tensor);
  *request.mutable_target() = SpecFromText(mesh, spec_text, flat);
  request.set_wait(wait);
  return request;
}

absl::StatusOr<v1::Layout> ExpectedLayout(const v1::MeshInfo& mesh, const Shape& shape,
                                          const std::string& spec_text, bool flat) {
  absl::StatusOr<DeviceMesh> device_mesh = DeviceMesh::Create(
      Shape(mesh.shape().begin(), mesh.shape().end()),
      std::vector<int64_t>(mesh.ranks().begin(), mesh.ranks().end()),
      std::vector<std::string>(mesh.dim_names().begin(), mesh.dim_names().end()));
  if (!device_mesh.ok()) return device_mesh.status();
  Spec spec;
  spec.mesh = mesh.name();
  spec.is_flat = flat;
  if (flat) {
    absl::StatusOr<FlatSpec> f = ParseFlatSpec(spec_text);
    if (!f.ok()) return f.status();
    spec.flat = *std::move(f);
  } else {
    absl::StatusOr<std::vector<Placement>> p = ParsePlacements(spec_text);
    if (!p.ok()) return p.status();
    spec.placements = *std::move(p);
  }
  absl::StatusOr<Layout> layout = LayoutForSpec(spec, *device_mesh, shape);
  if (!layout.ok()) return layout.status();
  return LayoutToProto(*layout);
}

absl::Status SameChunks(const v1::Layout& got, const v1::Layout& want) {
  if (ShapeText(got.global_shape()) != ShapeText(want.global_shape())) {
    return absl::FailedPreconditionError(absl::StrCat(
        "global shape ", ShapeText(got.global_shape()), " != ", ShapeText(want.global_shape())));
  }
  if (std::max<int64_t>(1, got.num_partials()) != std::max<int64_t>(1, want.num_partials())) {
    return absl::FailedPreconditionError(
        absl::StrCat("num_partials ", got.num_partials(), " != ", want.num_partials()));
  }
  using Key = std::tuple<std::string, int64_t, int64_t>;  // box, local offset, partial.
  auto chunks_by_rank = [](const v1::Layout& layout) {
    std::map<int64_t, std::vector<Key>> out;
    for (const v1::RankChunks& r : layout.ranks()) {
      std::vector<Key>& keys = out[r.rank()];
      for (const v1::Chunk& c : r.chunks()) {
        const Box box(Shape(c.box().offset().begin(), c.box().offset().end()),
                      Shape(c.box().shape().begin(), c.box().shape().end()));
        // Empty chunks carry no data; where the layout puts them does not matter.
        if (box.Empty()) continue;
        keys.emplace_back(box.ToString(), c.local_offset(), c.partial_index());
      }
      std::sort(keys.begin(), keys.end());
    }
    return out;
  };
  std::map<int64_t, std::vector<Key>> g = chunks_by_rank(got);
  std::map<int64_t, std::vector<Key>> w = chunks_by_rank(want);
  auto describe = [](const std::vector<Key>& keys) {
    std::vector<std::string> parts;
    for (const Key& k : keys) {
      parts.push_back(absl::StrCat(std::get<0>(k), "@", std::get<1>(k), "/p", std::get<2>(k)));
    }
    return absl::StrCat("{", absl::StrJoin(parts, " "), "}");
  };
  for (const auto& [rank, keys] : w) {
    auto it = g.find(rank);
    const std::vector<Key> none;
    const std::vector<Key>& have = it == g.end() ? none : it->second;
    if (have != keys) {
      return absl::FailedPreconditionError(
          absl::StrCat("rank ", rank, " holds ", describe(have), ", want ", describe(keys)));
    }
  }
  for (const auto& [rank, keys] : g) {
    if (!keys.empty() && w.count(rank) == 0) {
      return absl::FailedPreconditionError(
          absl::StrCat("rank ", rank, " holds ", describe(keys), " but should hold nothing"));
    }
  }
  return absl::OkStatus();
}

}  // namespace shardcoord
