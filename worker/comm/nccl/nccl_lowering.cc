#include "worker/comm/nccl/nccl_lowering.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace shardcoord {
namespace nccl {
namespace {

const char* Offset(const void* base, int64_t bytes) {
  return static_cast<const char*>(base) + bytes;
}
char* Offset(void* base, int64_t bytes) { return static_cast<char*>(base) + bytes; }

// One count per rank, none negative; `sum` gets their total.
absl::Status CheckCounts(const char* what, absl::Span<const int64_t> counts, int size,
                         int64_t* sum) {
  if (static_cast<int>(counts.size()) != size) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, " has ", counts.size(), " entries for a group of ", size));
  }
  *sum = 0;
  for (int r = 0; r < size; ++r) {
    if (counts[r] < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat(what, "[", r, "] = ", counts[r], " is negative"));
    }
    *sum += counts[r];
  }
  return absl::OkStatus();
}

absl::Status CheckBuffer(const char* what, const void* p, int64_t bytes) {
  if (p == nullptr && bytes > 0) {
    return absl::InvalidArgumentError(absl::StrCat(what, " is null for ", bytes, " bytes"));
  }
  return absl::OkStatus();
}

absl::Status CheckRank(const char* what, int r, int size) {
  if (r < 0 || r >= size) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, " ", r, " is not a rank of a group of ", size));
  }
  return absl::OkStatus();
}

bool AllEqual(absl::Span<const int64_t> v) {
  return std::all_of(v.begin(), v.end(), [&](int64_t x) { return x == v[0]; });
}

NcclCall Call(NcclCall::Kind kind, const void* send, void* recv, int64_t count, int peer = -1) {
  NcclCall c;
  c.kind = kind;
  c.send = send;
  c.recv = recv;
  c.count = static_cast<size_t>(count);
  c.peer = peer;
  return c;
}

}  // namespace

absl::StatusOr<NcclDataType> ToNcclDataType(DType dtype) {
  switch (dtype) {
    case DType::kF32:
      return NcclDataType::kFloat32;
    case DType::kF64:
      return NcclDataType::kFloat64;
    case DType::kF16:
      return NcclDataType::kFloat16;
    case DType::kBF16:
      return NcclDataType::kBfloat16;
    case DType::kI8:
      return NcclDataType::kInt8;
    case DType::kU8:
      return NcclDataType::kUint8;
    case DType::kI32:
      return NcclDataType::kInt32;
    case DType::kI64:
      return NcclDataType::kInt64;
    case DType::kU32:
      return NcclDataType::kUint32;
    case DType::kU64:
      return NcclDataType::kUint64;
    default:  // No reduction (dtype.h's PartialAllowed); copies move bytes.
      break;
  }
  return absl::InvalidArgumentError(
      absl::StrCat("dtype ", static_cast<int>(dtype), " has no NCCL type"));
}

absl::StatusOr<NcclRedOp> ToNcclRedOp(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum:
      return NcclRedOp::kSum;
    case ReduceOp::kMin:
      return NcclRedOp::kMin;
    case ReduceOp::kMax:
      return NcclRedOp::kMax;
    case ReduceOp::kAvg:
      break;
  }
  return absl::InvalidArgumentError(
      absl::StrCat("reduce op ", ReduceOpName(op),
                   " is not supported by communicators; reduce with sum and "
                   "divide"));
}

absl::StatusOr<NcclLaunch> LowerAllGatherV(int rank, int size, const void* send, int64_t send_bytes,
                                           void* recv, absl::Span<const int64_t> recv_bytes) {
  int64_t total = 0;
  if (absl::Status s = CheckCounts("AllGatherV recv_bytes", recv_bytes, size, &total); !s.ok()) {
    return s;
  }
  if (recv_bytes[rank] != send_bytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        "AllGatherV send_bytes ", send_bytes, " != recv_bytes[", rank, "] ", recv_bytes[rank]));
  }
  if (absl::Status s = CheckBuffer("AllGatherV send", send, send_bytes); !s.ok()) return s;
  if (absl::Status s = CheckBuffer("AllGatherV recv", recv, total); !s.ok()) return s;
  NcclLaunch launch;
  if (total == 0) return launch;
  if (AllEqual(recv_bytes)) {
    launch.calls.push_back(Call(NcclCall::Kind::kAllGather, send, recv, send_bytes));
    return launch;
  }
  // Uneven: rank r broadcasts its piece into slice r of everyone's recv (its own included).
  launch.grouped = true;
  int64_t offset = 0;
  for (int r = 0; r < size; ++r) {
    if (recv_bytes[r] > 0) {
      const void* from = r == rank ? send : Offset(recv, offset);
      launch.calls.push_back(
          Call(NcclCall::Kind::kBroadcast, from, Offset(recv, offset), recv_bytes[r], r));
    }
    offset += recv_bytes[r];
  }
  return launch;
}

absl::StatusOr<NcclLaunch> LowerAllToAllV(int rank, int size, const void* send,
                                          absl::Span<const int64_t> send_bytes, void* recv,
                                          absl::Span<const int64_t> recv_bytes) {
  int64_t send_total = 0, recv_total = 0;
  if (absl::Status s = CheckCounts("AllToAllV send_bytes", send_bytes, size, &send_total);
      !s.ok()) {
    return s;
  }
  if (absl::Status s = CheckCounts("AllToAllV recv_bytes", recv_bytes, size, &recv_total);
      !s.ok()) {
    return s;
  }
  if (send_bytes[rank] != recv_bytes[rank]) {
    return absl::InvalidArgumentError(absl::StrCat("AllToAllV send_bytes[", rank, "] ",
                                                   send_bytes[rank], " != recv_bytes[", rank, "] ",
                                                   recv_bytes[rank], " for the piece to itself"));
  }
  if (absl::Status s = CheckBuffer("AllToAllV send", send, send_total); !s.ok()) return s;
  if (absl::Status s = CheckBuffer("AllToAllV recv", recv, recv_total); !s.ok()) return s;
  NcclLaunch launch;
  launch.grouped = true;
  int64_t send_off = 0, recv_off = 0;
  for (int p = 0; p < size; ++p) {
    if (send_bytes[p] > 0) {
      launch.calls.push_back(
          Call(NcclCall::Kind::kSend, Offset(send, send_off), nullptr, send_bytes[p], p));
    }
    if (recv_bytes[p] > 0) {
      launch.calls.push_back(
          Call(NcclCall::Kind::kRecv, nullptr, Offset(recv, recv_off), recv_bytes[p], p));
    }
    send_off += send_bytes[p];
    recv_off += recv_bytes[p];
  }
  if (launch.calls.empty()) launch.grouped = false;
  return launch;
}

absl::StatusOr<NcclLaunch> LowerReduceScatterV(int rank, int size, const void* send, void* recv,
                                               absl::Span<const int64_t> recv_elements, DType dtype,
                                               ReduceOp op) {
  absl::StatusOr<NcclDataType> nccl_dtype = ToNcclDataType(dtype);
  if (!nccl_dtype.ok()) return nccl_dtype.status();
  absl::StatusOr<NcclRedOp> nccl_op = ToNcclRedOp(op);
  if (!nccl_op.ok()) return nccl_op.status();
  int64_t total = 0;
  if (absl::Status s = CheckCounts("ReduceScatterV recv_elements", recv_elements, size, &total);
      !s.ok()) {
    return s;
  }
  const int64_t esize = ElementSize(dtype);
  if (absl::Status s = CheckBuffer("ReduceScatterV send", send, total * esize); !s.ok()) {
    return s;
  }
  if (absl::Status s = CheckBuffer("ReduceScatterV recv", recv, recv_elements[rank] * esize);
      !s.ok()) {
    return s;
  }
  NcclLaunch launch;
  if (total == 0) return launch;
  auto with_types = [&](NcclCall c) {
    c.dtype = *nccl_dtype;
    c.op = *nccl_op;
    return c;
  };
  if (AllEqual(recv_elements)) {
    launch.calls.push_back(
        with_types(Call(NcclCall::Kind::kReduceScatter, send, recv, recv_elements[0])));
    return launch;
  }
  // Uneven: slice r is reduced onto its owner r. recv is only written on the root.
  launch.grouped = true;
  int64_t offset = 0;
  for (int r = 0; r < size; ++r) {
    if (recv_elements[r] > 0) {
      launch.calls.push_back(with_types(Call(NcclCall::Kind::kReduce, Offset(send, offset * esize),
                                             r == rank ? recv : nullptr, recv_elements[r], r)));
    }
    offset += recv_elements[r];
  }
  return launch;
}

absl::StatusOr<NcclLaunch> LowerAllReduce(const void* send, void* recv, int64_t elements,
                                          DType dtype, ReduceOp op) {
  absl::StatusOr<NcclDataType> nccl_dtype = ToNcclDataType(dtype);
  if (!nccl_dtype.ok()) return nccl_dtype.status();
  absl::StatusOr<NcclRedOp> nccl_op = ToNcclRedOp(op);
  if (!nccl_op.ok()) return nccl_op.status();
  if (elements < 0) {
    return absl::InvalidArgumentError(absl::StrCat("AllReduce elements ", elements, " < 0"));
  }
  const int64_t bytes = elements * ElementSize(dtype);
  if (absl::Status s = CheckBuffer("AllReduce send", send, bytes); !s.ok()) return s;
  if (absl::Status s = CheckBuffer("AllReduce recv", recv, bytes); !s.ok()) return s;
  NcclLaunch launch;
  if (elements == 0) return launch;
  NcclCall c = Call(NcclCall::Kind::kAllReduce, send, recv, elements);
  c.dtype = *nccl_dtype;
  c.op = *nccl_op;
  launch.calls.push_back(c);
  return launch;
}

absl::StatusOr<NcclLaunch> LowerBroadcast(int rank, int size, void* data, int64_t bytes, int root) {
  if (absl::Status s = CheckRank("Broadcast root", root, size); !s.ok()) return s;
  if (bytes < 0) {
    return absl::InvalidArgumentError(absl::StrCat("Broadcast bytes ", bytes, " < 0"));
  }
  if (absl::Status s = CheckBuffer("Broadcast data", data, bytes); !s.ok()) return s;
  NcclLaunch launch;
  if (bytes == 0) return launch;
  launch.calls.push_back(Call(NcclCall::Kind::kBroadcast, data, data, bytes, root));
  return launch;
}

absl::StatusOr<NcclLaunch> LowerSendRecv(int rank, int size, absl::Span<const SendOp> sends,
                                         absl::Span<const RecvOp> recvs) {
  NcclLaunch launch;
  launch.grouped = true;
  for (size_t i = 0; i < sends.size(); ++i) {
    const SendOp& s = sends[i];
    const std::string what = absl::StrCat("SendRecv sends[", i, "] peer");
    if (absl::Status st = CheckRank(what.c_str(), s.peer, size); !st.ok()) return st;
    if (s.peer == rank) {
      return absl::InvalidArgumentError(
          absl::StrCat("SendRecv sends[", i, "] is to rank ", rank, " itself"));
    }
    if (s.bytes < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("SendRecv sends[", i, "] bytes ", s.bytes, " < 0"));
    }
    if (absl::Status st = CheckBuffer("SendRecv send data", s.data, s.bytes); !st.ok()) return st;
    if (s.bytes > 0) {
      launch.calls.push_back(Call(NcclCall::Kind::kSend, s.data, nullptr, s.bytes, s.peer));
    }
  }
  for (size_t i = 0; i < recvs.size(); ++i) {
    const RecvOp& r = recvs[i];
    const std::string what = absl::StrCat("SendRecv recvs[", i, "] peer");
    if (absl::Status st = CheckRank(what.c_str(), r.peer, size); !st.ok()) return st;
    if (r.peer == rank) {
      return absl::InvalidArgumentError(
          absl::StrCat("SendRecv recvs[", i, "] is from rank ", rank, " itself"));
    }
    if (r.bytes < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("SendRecv recvs[", i, "] bytes ", r.bytes, " < 0"));
    }
    if (absl::Status st = CheckBuffer("SendRecv recv data", r.data, r.bytes); !st.ok()) return st;
    if (r.bytes > 0) {
      launch.calls.push_back(Call(NcclCall::Kind::kRecv, nullptr, r.data, r.bytes, r.peer));
    }
  }
  if (launch.calls.empty()) launch.grouped = false;
  return launch;
}

}  // namespace nccl
}  // namespace shardcoord
