"""A small Python client for the shardcoord coordinator (shardcoord.v1.Coordinator).

Needs grpcio and numpy (Debian: /usr/bin/python3 with python3-grpcio, python3-numpy) and the
stubs that `bazel build //proto:shardcoord_py_gen` generates. They are found under
$SHARDCOORD_PY_STUBS, else the repository's bazel-bin (the directory that holds
proto/shardcoord_pb2.py).

    from shardcoord_client import ShardcoordClient
    c = ShardcoordClient()                      # $SHARDCOORD_ADDR or 127.0.0.1:7400
    c.create_mesh("m", [2, 2])
    c.create_tensor("t", "m", [64, 48], placements="S(0),R", init="arange")
    c.redistribute("t", placements="R,S(1)")
    a = c.download("t")                          # numpy array of shape (64, 48)

A coordinator started with --auth-tokens needs a bearer token: `connect(token=...)` or
`ShardcoordClient(token=...)`, default $SHARDCOORD_TOKEN; it travels as the metadata
`authorization: Bearer TOKEN` on every call. Refusals raise ShardcoordError with code
UNAUTHENTICATED or PERMISSION_DENIED.

A coordinator started with --tls-cert needs TLS: `connect(tls_ca="ca.pem")` (default
$SHARDCOORD_TLS_CA) verifies it; `tls_cert=` and `tls_key=` add a client certificate (for
--tls-client-auth=request or require). Without a CA the channel is plaintext.

Calls answered UNAVAILABLE (a coordinator restarting, or recovering a tensor) are retried with
backoff for up to `retry_for` seconds (default 30; 0: never). Changes carry a request_id
(a fresh one per call, the same on every retry), so a retried change takes effect once.
"""

import os
import random
import sys
import time
import uuid

import grpc
import numpy as np


def _import_stubs():
    here = os.path.dirname(os.path.abspath(__file__))
    candidates = [os.environ.get("SHARDCOORD_PY_STUBS", ""),
                  os.path.join(here, "..", "..", "bazel-bin")]
    for path in candidates:
        if path and os.path.exists(os.path.join(path, "proto", "shardcoord_pb2.py")):
            if path not in sys.path:
                sys.path.insert(0, path)
            break
    from proto import shardcoord_pb2, shardcoord_pb2_grpc  # pylint: disable=import-outside-toplevel
    return shardcoord_pb2, shardcoord_pb2_grpc


pb, pb_grpc = _import_stubs()

# Wire dtypes and their NumPy equivalents. bf16 has none: its bits travel as uint16.
_DTYPES = {
    "f32": (pb.F32, np.float32), "f64": (pb.F64, np.float64), "f16": (pb.F16, np.float16),
    "bf16": (pb.BF16, np.uint16), "i8": (pb.I8, np.int8), "u8": (pb.U8, np.uint8),
    "i32": (pb.I32, np.int32), "i64": (pb.I64, np.int64),
}
_NUMPY_OF_WIRE = {wire: np.dtype(npt).newbyteorder("<") for wire, npt in _DTYPES.values()}
_INIT = {"zeros": pb.ZEROS, "arange": pb.ARANGE, "random": pb.RANDOM}
_CHUNK = 1 << 20  # Protocol limit on one data message.


def default_address():
    """$SHARDCOORD_ADDR when set, else 127.0.0.1:7400."""
    return os.environ.get("SHARDCOORD_ADDR") or "127.0.0.1:7400"


def default_token():
    """$SHARDCOORD_TOKEN when set, else None (no token is sent)."""
    return os.environ.get("SHARDCOORD_TOKEN") or None


class ShardcoordError(Exception):
    """A failed call: `code` is the gRPC status name ("NOT_FOUND"), `message` the server's."""

    def __init__(self, code, message):
        super().__init__(f"{code}: {message}")
        self.code = code
        self.message = message


def _spec(mesh, placements, flat):
    if (placements is None) == (flat is None):
        raise ValueError("give exactly one of placements or flat")
    if placements is not None:
        return pb.ShardingSpec(mesh=mesh, placements_text=placements)
    return pb.ShardingSpec(mesh=mesh, flat_text=flat)


def _read_pem(what, path):
    try:
        with open(path, "rb") as f:
            return f.read()
    except OSError as e:
        raise ValueError(f"{what}: cannot read {path}: {e.strerror}") from e


def channel_credentials(tls_ca=None, tls_cert=None, tls_key=None):
    """grpc.ChannelCredentials for the CA file `tls_ca` (default $SHARDCOORD_TLS_CA) and an
    optional client certificate; None (plaintext) without a CA. ValueError naming the argument
    and the path when a file cannot be read or the arguments do not go together."""
    tls_ca = tls_ca or os.environ.get("SHARDCOORD_TLS_CA") or None
    if (tls_cert is None) != (tls_key is None):
        raise ValueError("a client certificate needs tls_cert and tls_key together")
    if tls_ca is None:
        if tls_cert is not None:
            raise ValueError("tls_cert and tls_key need tls_ca (TLS)")
        return None
    root = _read_pem("tls_ca", tls_ca)
    key = _read_pem("tls_key", tls_key) if tls_key else None
    cert = _read_pem("tls_cert", tls_cert) if tls_cert else None
    return grpc.ssl_channel_credentials(root_certificates=root, private_key=key,
                                        certificate_chain=cert)


class ShardcoordClient:
    """One method per operation; each call has a deadline (seconds)."""

    def __init__(self, address=None, timeout=30.0, data_timeout=1800.0, token=None,
                 tls_ca=None, tls_cert=None, tls_key=None, retry_for=30.0):
        self.address = address or default_address()
        self.retry_for = retry_for
        token = token or default_token()
        self._metadata = (("authorization", f"Bearer {token}"),) if token else None
        self.timeout = timeout
        self.data_timeout = data_timeout
        options = [("grpc.max_receive_message_length", 1 << 30)]
        credentials = channel_credentials(tls_ca, tls_cert, tls_key)
        if credentials is None:
            self._channel = grpc.insecure_channel(self.address, options=options)
        else:
            self._channel = grpc.secure_channel(self.address, credentials, options=options)
        self._stub = pb_grpc.CoordinatorStub(self._channel)

    def close(self):
        self._channel.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def _call(self, method, request, timeout, retry=True):
        give_up = time.monotonic() + (self.retry_for if retry else 0)
        pause = 0.1
        while True:
            try:
                return method(request, timeout=timeout, metadata=self._metadata)
            except grpc.RpcError as e:
                # Jittered, so that clients a restart stopped together do not return together.
                sleep = pause * random.uniform(0.5, 1.0)
                if e.code() != grpc.StatusCode.UNAVAILABLE or time.monotonic() + sleep >= give_up:
                    raise ShardcoordError(e.code().name, e.details()) from None
            time.sleep(sleep)
            pause = min(pause * 2, 2.0)

    def _mutate(self, method, request, timeout):
        """A change: one request_id for the call and all of its retries."""
        if not request.request_id:
            request.request_id = uuid.uuid4().hex
        return self._call(method, request, timeout)

    def list_workers(self):
        return list(self._call(self._stub.ListWorkers, pb.ListWorkersRequest(), self.timeout).workers)

    def create_mesh(self, name, shape, dim_names=(), workers=()):
        request = pb.CreateMeshRequest(name=name, shape=list(shape), dim_names=list(dim_names),
                                       workers=list(workers))
        return self._mutate(self._stub.CreateMesh, request, self.timeout)

    def create_tensor(self, name, mesh, shape, dtype="f32", placements=None, flat=None,
                      init="zeros", seed=0):
        request = pb.CreateTensorRequest(name=name, shape=list(shape), dtype=_DTYPES[dtype][0],
                                         spec=_spec(mesh, placements, flat), init=_INIT[init],
                                         seed=seed)
        return self._mutate(self._stub.CreateTensor, request, self.timeout)

    def redistribute(self, name, placements=None, flat=None, mesh=""):
        """Runs the plan to its end; returns the RedistributeResponse (progress and plan)."""
        request = pb.RedistributeRequest(tensor=name, target=_spec(mesh, placements, flat),
                                         wait=True)
        return self._finished(self._mutate(self._stub.Redistribute, request, self.data_timeout))

    def gather(self, name, mesh="", to_rank=None):
        request = pb.GatherRequest(tensor=name, mesh=mesh, wait=True)
        if to_rank is not None:
            request.to_rank = to_rank
            request.has_to_rank = True
        return self._finished(self._mutate(self._stub.Gather, request, self.data_timeout))

    def copy(self, src, dst):
        """Writes src's values into dst (same shape and dtype, any mesh and layout) and waits
        for the plan; returns the CopyResponse (progress, plan and dst_version)."""
        request = pb.CopyRequest(src=src, dst=dst, wait=True)
        return self._finished(self._mutate(self._stub.Copy, request, self.data_timeout))

    def copy_many(self, pairs):
        """Copies every (src, dst) of `pairs` (tuples or {"src", "dst"} dicts) as one
        transaction: every dst gets its new version together, or none does. Waits; returns
        the CopyGroupResponse (group_id, state, bytes_moved, lower_bound_bytes, seconds and
        per-member dst_version). A bad or busy member refuses the whole group (ShardcoordError
        naming copies[i]); a member that fails rolls back all (ABORTED)."""
        copies = []
        for pair in pairs:
            if isinstance(pair, dict):
                copies.append(pb.CopyPair(src=pair["src"], dst=pair["dst"]))
            else:
                src, dst = pair
                copies.append(pb.CopyPair(src=src, dst=dst))
        request = pb.CopyGroupRequest(copies=copies, wait=True)
        return self._mutate(self._stub.CopyGroup, request, self.data_timeout)

    def redistribute_many(self, items):
        """Redistributes every (name, placements) or {"tensor", "placements" | "flat", "mesh"}
        of `items` as one transaction: every tensor gets its new layout together, or none
        does. Waits; returns the RedistributeGroupResponse."""
        members = []
        for item in items:
            if isinstance(item, dict):
                target = _spec(item.get("mesh", ""), item.get("placements"), item.get("flat"))
                members.append(pb.RedistributeItem(tensor=item["tensor"], target=target))
            else:
                name, placements = item
                members.append(pb.RedistributeItem(tensor=name, target=_spec("", placements, None)))
        request = pb.RedistributeGroupRequest(redistributes=members, wait=True)
        return self._mutate(self._stub.RedistributeGroup, request, self.data_timeout)

    @staticmethod
    def _finished(response):
        if response.progress.state == pb.ABORTED:
            raise ShardcoordError("ABORTED", response.progress.error or "plan aborted")
        return response

    def download(self, name):
        """The whole tensor as a numpy array (bf16 as uint16 bit patterns)."""
        try:
            stream = self._stub.Download(pb.DownloadRequest(name=name), timeout=self.data_timeout,
                                         metadata=self._metadata)
            header, parts = None, []
            for message in stream:
                if header is None:
                    header = message.header
                parts.append(message.data)
        except grpc.RpcError as e:
            raise ShardcoordError(e.code().name, e.details()) from None
        if header is None:
            raise ShardcoordError("INTERNAL", f"download of '{name}': empty stream")
        data = b"".join(parts)
        if len(data) != header.total_bytes:
            raise ShardcoordError("DATA_LOSS", f"download of '{name}': got {len(data)} of "
                                  f"{header.total_bytes} bytes")
        return np.frombuffer(data, dtype=_NUMPY_OF_WIRE[header.dtype]).reshape(tuple(header.shape))

    def upload(self, name, array, mesh, placements=None, flat=None, dtype=None):
        """Stores `array` (C order) as tensor `name`; `dtype` defaults to the array's."""
        if dtype is None:
            dtype = next((k for k, (_, npt) in _DTYPES.items()
                          if k != "bf16" and np.dtype(npt) == array.dtype), None)
            if dtype is None:
                raise ValueError(f"numpy dtype {array.dtype} has no shardcoord equivalent")
        data = np.ascontiguousarray(array, dtype=_NUMPY_OF_WIRE[_DTYPES[dtype][0]]).tobytes()
        header = pb.TensorHeader(name=name, shape=list(array.shape), dtype=_DTYPES[dtype][0],
                                 spec=_spec(mesh, placements, flat), total_bytes=len(data))

        def messages():
            yield pb.TensorData(header=header)
            for off in range(0, len(data), _CHUNK):
                yield pb.TensorData(data=data[off:off + _CHUNK])

        return self._call(self._stub.Upload, messages(), self.data_timeout, retry=False).tensor


def connect(address=None, token=None, tls_ca=None, **kwargs):
    """A ShardcoordClient for `address` (default $SHARDCOORD_ADDR) sending bearer `token`
    (default $SHARDCOORD_TOKEN; none when both are unset), over TLS verified with the CA file
    `tls_ca` (default $SHARDCOORD_TLS_CA; plaintext when both are unset). kwargs: timeout,
    data_timeout, retry_for (seconds to retry UNAVAILABLE; 0: never), tls_cert and tls_key (a
    client certificate)."""
    return ShardcoordClient(address, token=token, tls_ca=tls_ca, **kwargs)
