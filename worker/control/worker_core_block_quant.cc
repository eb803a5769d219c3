// Host-only worker RPCs of issue 28 that compute new buffers from stored ones, on the
// service's pool, never on a reactor: WorkerCore::BlockQuantize (block-scaled FP8 of one staged
// buffer, chunk by chunk, with sharding/block_staging.h) and WorkerCore::ComposeBoxes (a buffer
// of a fused tensor's new version from several buffers' boxes, sharding/box_slices.h).

#include <algorithm>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "proto/convert.h"
#include "sharding/block_quant.h"
#include "sharding/block_staging.h"
#include "sharding/box_copy.h"
#include "sharding/box_slices.h"
#include "worker/control/worker_core.h"

namespace shardcoord {
namespace {

// The bytes of `buffer` in host memory: the buffer itself in a host space, a copy otherwise.
absl::StatusOr<std::shared_ptr<HostBuffer>> OnHost(const std::shared_ptr<HostBuffer>& buffer) {
  if (buffer->space().is_host()) return buffer;
  absl::StatusOr<std::shared_ptr<HostBuffer>> host =
      HostBuffer::Create(buffer->dtype(), buffer->chunks());
  if (!host.ok()) return host.status();
  absl::Status s = buffer->space().CopyToHost((*host)->data(), buffer->data(), buffer->bytes());
  if (!s.ok()) return s;
  return host;
}

// `host` moved to `space` (itself when `space` is host memory).
absl::StatusOr<std::shared_ptr<HostBuffer>> InSpace(std::shared_ptr<HostBuffer> host,
                                                    MemorySpace* space) {
  if (space->is_host()) return host;
  absl::StatusOr<std::shared_ptr<HostBuffer>> device =
      HostBuffer::Create(host->dtype(), host->chunks(), space);
  if (!device.ok()) return device.status();
  absl::Status s = space->CopyFromHost((*device)->data(), host->data(), host->bytes());
  if (!s.ok()) return s;
  return device;
}

bool SameChunkBoxes(const RankChunks& a, const RankChunks& b) {
  if (a.chunks.size() != b.chunks.size()) return false;
  for (size_t i = 0; i < a.chunks.size(); ++i) {
    if (a.chunks[i].box != b.chunks[i].box) return false;
  }
  return true;
}

}  // namespace

absl::StatusOr<v1::BlockQuantizeResponse> WorkerCore::BlockQuantize(
    const v1::BlockQuantizeRequest& request) {
  if (request.tensor().empty()) return absl::InvalidArgumentError("tensor: empty");
  if (request.scales_tensor().empty()) return absl::InvalidArgumentError("scales_tensor: empty");
  if (request.out_tensor().empty()) return absl::InvalidArgumentError("out_tensor: empty");
  absl::StatusOr<BlockSize> block = ParseBlockQuantization(request.block());
  if (!block.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("block: ", block.status().message()));
  }
  absl::StatusOr<Shape> shape = ShapeFromProto(request.global_shape(), "global_shape");
  if (!shape.ok()) return shape.status();
  absl::StatusOr<RankChunks> scale_chunks =
      RankChunksFromProto(request.scale_chunks(), "scale_chunks");
  if (!scale_chunks.ok()) return scale_chunks.status();
  absl::StatusOr<std::shared_ptr<HostBuffer>> input =
      buffers_->Get(request.tensor(), request.version());
  if (!input.ok()) return input.status();
  if (buffers_->Find(request.out_tensor(), request.out_version()) != nullptr) {
    return absl::AlreadyExistsError(absl::StrCat("out_tensor: buffer '", request.out_tensor(),
                                                 "' version ", request.out_version(), " exists"));
  }
  const RankChunks& chunks = (*input)->chunks();
  absl::StatusOr<std::shared_ptr<HostBuffer>> in_host = OnHost(*input);
  if (!in_host.ok()) return in_host.status();

  // Computed in host memory (the worker's own space when that is host memory, so it counts
  // against its budget); a device space gets the results in one copy each, as Fill's.
  MemorySpace* const host_space = space_->is_host() ? space_ : nullptr;
  std::shared_ptr<HostBuffer> out, scales;
  if (!request.dequantize()) {
    if (buffers_->Find(request.scales_tensor(), request.scales_version()) != nullptr) {
      return absl::AlreadyExistsError(absl::StrCat("scales_tensor: buffer '",
                                                   request.scales_tensor(), "' version ",
                                                   request.scales_version(), " exists"));
    }
    absl::StatusOr<std::shared_ptr<HostBuffer>> q =
        HostBuffer::Create(DType::kF8E4M3, chunks, host_space);
    if (!q.ok()) return q.status();
    absl::StatusOr<std::shared_ptr<HostBuffer>> s =
        HostBuffer::Create(DType::kF32, *scale_chunks, host_space);
    if (!s.ok()) return s.status();
    // No memset: QuantizeChunks writes every element of every chunk (the chunks tile the
    // buffer), and a failed call stores nothing.
    absl::Status st =
        QuantizeChunks((*in_host)->data(), (*input)->dtype(), *shape, chunks, *block, *scale_chunks,
                       (*q)->data(), reinterpret_cast<float*>((*s)->data()));
    if (!st.ok()) return st;
    out = *std::move(q);
    scales = *std::move(s);
  } else {
    if ((*input)->dtype() != DType::kF8E4M3) {
      return absl::InvalidArgumentError(absl::StrCat("tensor: buffer '", request.tensor(),
                                                     "' holds ", DTypeName((*input)->dtype()),
                                                     ", dequantize needs f8_e4m3"));
    }
    absl::StatusOr<DType> dtype = DTypeFromProto(request.out_dtype(), "out_dtype");
    if (!dtype.ok()) return dtype.status();
    absl::StatusOr<std::shared_ptr<HostBuffer>> s =
        buffers_->Get(request.scales_tensor(), request.scales_version());
    if (!s.ok()) return s.status();
    if ((*s)->dtype() != DType::kF32 || !SameChunkBoxes((*s)->chunks(), *scale_chunks)) {
      return absl::InvalidArgumentError(
          absl::StrCat("scales_tensor: buffer '", request.scales_tensor(), "' version ",
                       request.scales_version(), " is not f32 with scale_chunks' boxes"));
    }
    absl::StatusOr<std::shared_ptr<HostBuffer>> s_host = OnHost(*s);
    if (!s_host.ok()) return s_host.status();
    absl::StatusOr<std::shared_ptr<HostBuffer>> y = HostBuffer::Create(*dtype, chunks, host_space);
    if (!y.ok()) return y.status();
    absl::Status st =
        DequantizeChunks((*in_host)->data(), reinterpret_cast<const float*>((*s_host)->data()),
                         *shape, chunks, *block, (*s)->chunks(), (*y)->data(), *dtype);
    if (!st.ok()) return st;
    out = *std::move(y);
  }

  v1::BlockQuantizeResponse response;
  absl::StatusOr<std::shared_ptr<HostBuffer>> stored = InSpace(std::move(out), space_);
  if (!stored.ok()) return stored.status();
  absl::StatusOr<std::vector<uint64_t>> sums = (*stored)->Checksums();
  if (!sums.ok()) return sums.status();
  *response.mutable_chunks() = RankChunksToProto((*stored)->chunks(), *sums);
  std::shared_ptr<HostBuffer> stored_scales;
  if (scales != nullptr) {
    absl::StatusOr<std::shared_ptr<HostBuffer>> in_space = InSpace(std::move(scales), space_);
    if (!in_space.ok()) return in_space.status();
    absl::StatusOr<std::vector<uint64_t>> scale_sums = (*in_space)->Checksums();
    if (!scale_sums.ok()) return scale_sums.status();
    *response.mutable_scale_chunks() = RankChunksToProto((*in_space)->chunks(), *scale_sums);
    stored_scales = *std::move(in_space);
  }
  // Stored last, both or neither: a refusal above leaves nothing behind.
  if (absl::Status s = buffers_->Insert(request.out_tensor(), request.out_version(), *stored);
      !s.ok()) {
    return s;
  }
  if (stored_scales != nullptr) {
    absl::Status s =
        buffers_->Insert(request.scales_tensor(), request.scales_version(), stored_scales);
    if (!s.ok()) {
      buffers_->Drop(request.out_tensor(), request.out_version());
      return s;
    }
  }
  return response;
}

absl::StatusOr<v1::ComposeBoxesResponse> WorkerCore::ComposeBoxes(
    const v1::ComposeBoxesRequest& request) {
  if (request.out_tensor().empty()) return absl::InvalidArgumentError("out_tensor: empty");
  absl::StatusOr<DType> dtype = DTypeFromProto(request.out_dtype(), "out_dtype");
  if (!dtype.ok()) return dtype.status();
  absl::StatusOr<RankChunks> out_chunks = RankChunksFromProto(request.out_chunks(), "out_chunks");
  if (!out_chunks.ok()) return out_chunks.status();
  if (buffers_->Find(request.out_tensor(), request.out_version()) != nullptr) {
    return absl::AlreadyExistsError(absl::StrCat("out_tensor: buffer '", request.out_tensor(),
                                                 "' version ", request.out_version(), " exists"));
  }
  const int64_t es = ElementSize(*dtype);
  int out_rank = 0;
  for (const Chunk& c : out_chunks->chunks) out_rank = std::max(out_rank, c.box.ndim());
  // Every input in host memory, with its offset.
  struct Input {
    std::shared_ptr<HostBuffer> host;
    Shape offset;
  };
  std::vector<Input> inputs;
  for (int i = 0; i < request.inputs_size(); ++i) {
    const v1::ComposeInput& in = request.inputs(i);
    const std::string field = absl::StrCat("inputs[", i, "]");
    if (in.tensor().empty()) return absl::InvalidArgumentError(field + ".tensor: empty");
    absl::StatusOr<std::shared_ptr<HostBuffer>> buffer = buffers_->Get(in.tensor(), in.version());
    if (!buffer.ok()) return buffer.status();
    if ((*buffer)->dtype() != *dtype) {
      return absl::InvalidArgumentError(absl::StrCat(
          field, ".tensor: buffer '", in.tensor(), "' version ", in.version(), " holds ",
          DTypeName((*buffer)->dtype()), ", out_dtype is ", DTypeName(*dtype)));
    }
    Input input;
    input.offset.assign(in.offset().begin(), in.offset().end());
    int in_rank = 0;
    for (const Chunk& c : (*buffer)->chunks().chunks) in_rank = std::max(in_rank, c.box.ndim());
    if (input.offset.size() != static_cast<size_t>(std::max(in_rank, out_rank))) {
      return absl::InvalidArgumentError(absl::StrCat(
          field, ".offset: ", ShapeToString(input.offset), " has ", input.offset.size(),
          " dims; input '", in.tensor(), "' has ", in_rank, " and out_chunks ", out_rank));
    }
    absl::StatusOr<std::shared_ptr<HostBuffer>> host = OnHost(*buffer);
    if (!host.ok()) return host.status();
    input.host = *std::move(host);
    inputs.push_back(std::move(input));
  }

  MemorySpace* const host_space = space_->is_host() ? space_ : nullptr;
  absl::StatusOr<std::shared_ptr<HostBuffer>> out =
      HostBuffer::Create(*dtype, *out_chunks, host_space);
  if (!out.ok()) return out.status();
  for (size_t ci = 0; ci < out_chunks->chunks.size(); ++ci) {
    const Chunk& oc = out_chunks->chunks[ci];
    // The out chunk and every input chunk in a frame of the input's offset's rank.
    std::vector<Box> covered;
    char* const to = (*out)->data() + oc.local_offset * es;
    for (const Input& in : inputs) {
      absl::StatusOr<Box> at = PlaceBox(oc.box, Shape(in.offset.size(), 0));
      if (!at.ok())
        return absl::InvalidArgumentError(absl::StrCat("out_chunks: ", at.status().message()));
      for (const Chunk& c : in.host->chunks().chunks) {
        absl::StatusOr<Box> from = PlaceBox(c.box, in.offset);
        if (!from.ok()) {
          return absl::InvalidArgumentError(
              absl::StrCat("inputs[", &in - inputs.data(), "].offset: ", from.status().message()));
        }
        const Box region = at->Intersect(*from);
        if (region.Empty()) continue;
        const char* src = in.host->data() + c.local_offset * es;
        if (absl::Status s = CopyBox(region, src, *from, to, *at, es); !s.ok()) return s;
        // Kept at the out chunk's own rank (the leading dims added are [0:1]).
        covered.push_back(Box(Shape(region.offset().end() - oc.box.ndim(), region.offset().end()),
                              Shape(region.shape().end() - oc.box.ndim(), region.shape().end())));
      }
    }
    std::vector<Box> left = SubtractBoxes(oc.box, covered);
    if (!left.empty()) {
      return absl::InvalidArgumentError(absl::StrCat("out_chunks: chunk ", ci, " ",
                                                     oc.box.ToString(), ": no input covers ",
                                                     left[0].ToString()));
    }
  }
  absl::StatusOr<std::shared_ptr<HostBuffer>> stored = InSpace(*std::move(out), space_);
  if (!stored.ok()) return stored.status();
  absl::StatusOr<std::vector<uint64_t>> sums = (*stored)->Checksums();
  if (!sums.ok()) return sums.status();
  v1::ComposeBoxesResponse response;
  *response.mutable_chunks() = RankChunksToProto((*stored)->chunks(), *sums);
  if (absl::Status s = buffers_->Insert(request.out_tensor(), request.out_version(), *stored);
      !s.ok()) {
    return s;
  }
  return response;
}

}  // namespace shardcoord
