"""shardcoord.Client: the coordinator's operations, and attached tensors whose buffers live
in this process."""

import math
import os
import random
import threading
import time
import uuid

import grpc
import numpy as np

from . import _buffers, _progress
from ._lending import human_bytes, local_tensors, member_of, nbytes_of, Silent
from ._buffers import BITS_ONLY, DTYPES, WIRE_NAMES
from ._errors import Error
from ._local import LocalConnection
from ._proto import pb, pb_grpc

_INIT = {"zeros": pb.ZEROS, "arange": pb.ARANGE, "random": pb.RANDOM,
         "attached": pb.ATTACHED}
_NUMPY_OF_WIRE = {enum: np.dtype(np_type).newbyteorder("<")
                  for enum, np_type, _ in DTYPES.values()}
_CHUNK = 1 << 20  # Protocol limit on one data message.


def default_address():
    """$SHARDCOORD_ADDR when set, else 127.0.0.1:7400."""
    return os.environ.get("SHARDCOORD_ADDR") or "127.0.0.1:7400"


# Trailing metadata of a standby coordinator's UNAVAILABLE: the leader's HOST:PORT.
LEADER_METADATA = "shardcoord-leader"


class _Coordinators:
    """The coordinators of an address list ("A" or "A,B": several coordinators on etcd, one
    leading) and the one calls go to. A call answered UNAVAILABLE moves the next one to the
    leader the answer named (trailing metadata `shardcoord-leader`, added to the list when it
    is not in it; a leader names itself), or without a name to the next address.
    Thread-safe."""

    def __init__(self, address, make_channel):
        self.addresses = [a.strip() for a in address.split(",") if a.strip()] or [address]
        self._make_channel = make_channel
        self._lock = threading.Lock()
        self._stubs = {}     # index -> (channel, stub)
        self._current = 0

    def current(self):
        """(index, stub) of the coordinator to call now."""
        with self._lock:
            index = self._current
            if index not in self._stubs:
                channel = self._make_channel(self.addresses[index])
                self._stubs[index] = (channel, pb_grpc.CoordinatorStub(channel))
            return index, self._stubs[index][1]

    def note(self, index, error):
        """After `error` from the coordinator at `index`; True when the next call goes to a
        leader the answer named (worth trying at once)."""
        if error.code() != grpc.StatusCode.UNAVAILABLE:
            return False
        leader = ""
        try:
            for key, value in error.trailing_metadata() or ():
                if key == LEADER_METADATA:
                    leader = value
        except (AttributeError, TypeError):
            pass
        with self._lock:
            if self._current != index:
                return False  # Another call already moved on.
            if leader:
                # The leader named; when that is the coordinator called (the leader busy: a
                # tensor recovering, etcd away), stay.
                if leader not in self.addresses:
                    self.addresses.append(leader)
                self._current = self.addresses.index(leader)
                return self._current != index
            self._current = (index + 1) % len(self.addresses)
            return False

    def close(self):
        with self._lock:
            stubs, self._stubs = self._stubs, {}
        for channel, _ in stubs.values():
            channel.close()


class _Stub:
    """CoordinatorStub's methods, each sent to the coordinator _Coordinators picks; errors
    are noted there (a response stream's too, as it is read)."""

    def __init__(self, coordinators):
        self._coordinators = coordinators

    def __getattr__(self, name):
        coordinators = self._coordinators

        def call(request, **kwargs):
            index, stub = coordinators.current()
            try:
                result = getattr(stub, name)(request, **kwargs)
            except grpc.RpcError as e:
                e.shardcoord_redirected = coordinators.note(index, e)
                raise
            if isinstance(result, grpc.Call) and hasattr(result, "__next__"):
                return _noted_stream(coordinators, index, result)
            return result

        return call


def _noted_stream(coordinators, index, stream):
    try:
        yield from stream
    except grpc.RpcError as e:
        e.shardcoord_redirected = coordinators.note(index, e)
        raise
    finally:
        stream.cancel()  # A reader that stopped early ends the call (no-op once it ended).


class _Attempt:
    """What one attempt of a call did, for the retry loop: `moved` (a stream moved data:
    then only UNAVAILABLE is retried) and `further` (it got further than any before: the
    retry window starts again)."""

    def __init__(self):
        self.moved = False
        self.further = False


def _resumable(name, first, now, delivered):
    """Error ABORTED unless a download may resume on a stream with header `now` after
    `delivered` bytes of one with header `first`: same tensor, shape, dtype and size, and
    once bytes were delivered the same version."""
    if (now.name, list(now.shape), now.dtype, now.total_bytes) != \
            (first.name, list(first.shape), first.dtype, first.total_bytes):
        raise Error("ABORTED", f"tensor '{name}' changed shape or dtype during the download "
                               "(resumed after a failover): retry")
    if delivered == 0:
        return
    if first.version <= 0 or now.version <= 0:
        raise Error("ABORTED", f"download of '{name}' broke and cannot resume: the coordinator "
                               "does not say which version it sends: retry")
    if now.version != first.version:
        raise Error("ABORTED", f"tensor '{name}' changed from version {first.version} to "
                               f"{now.version} during the download (resumed after a failover): "
                               "retry")


def default_token():
    """$SHARDCOORD_TOKEN when set, else None (no token is sent)."""
    return os.environ.get("SHARDCOORD_TOKEN") or None


def _flat_text(flat):
    """A flat spec as text: "0:4,8:12;4:8" as is, or per rank a list of (start, end)."""
    if isinstance(flat, str):
        return flat
    return ";".join(",".join(f"{start}:{end}" for start, end in ranges) for ranges in flat)


def spec(mesh, placements=None, flat=None):
    """A ShardingSpec of exactly one of `placements` ("S(0),R") or `flat` (text, or per rank
    a list of (start, end) ranges of the flattened tensor)."""
    if (placements is None) == (flat is None):
        raise ValueError("give exactly one of placements or flat")
    if placements is not None:
        return pb.ShardingSpec(mesh=mesh or "", placements_text=placements)
    return pb.ShardingSpec(mesh=mesh or "", flat_text=_flat_text(flat))


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


def _rank_chunks(info, rank):
    for rc in info.layout.ranks:
        if rc.rank == rank:
            return rc
    raise Error("INVALID_ARGUMENT", f"rank: tensor '{info.name}' has no chunks on rank {rank} "
                                    f"(its ranks: {sorted(r.rank for r in info.layout.ranks)})")


class Client:
    """One method per operation. Calls have deadlines (`timeout` seconds, `data_timeout` for
    those that move data) and are retried with backoff for up to `retry_for` seconds while the
    coordinator answers UNAVAILABLE; changes carry one request_id over their retries.
    `address` may list several coordinators on etcd ("host:port,host:port"): calls follow
    the leader.

    Attached buffers stay attached while this Client is open and the buffer alive: close()
    (or the process ending) detaches them."""

    def __init__(self, address=None, timeout=30.0, data_timeout=1800.0, token=None,
                 tls_ca=None, tls_cert=None, tls_key=None, retry_for=30.0):
        self.address = address or default_address()
        self.retry_for = retry_for
        token = token or default_token()
        self._metadata = (("authorization", f"Bearer {token}"),) if token else None
        self.timeout = timeout
        self.data_timeout = data_timeout
        options = [("grpc.max_receive_message_length", 1 << 30),
                   # Find a restarted coordinator (or a new leader) within a second.
                   ("grpc.max_reconnect_backoff_ms", 1000)]
        credentials = channel_credentials(tls_ca, tls_cert, tls_key)

        def make_channel(address):
            if credentials is None:
                return grpc.insecure_channel(address, options=options)
            return grpc.secure_channel(address, credentials, options=options)

        self._coordinators = _Coordinators(self.address, make_channel)
        self._stub = _Stub(self._coordinators)
        self._lock = threading.Lock()
        self._local = {}     # socket path -> LocalConnection
        self._attached = {}  # (tensor, rank) -> (LocalConnection, the lent buffer)
        self._workers_by_rank = {}  # rank -> WorkerInfo, from the last ListWorkers

    def close(self):
        """Detaches every buffer this client attached (each answered once the coordinator
        knows) and closes its connections."""
        with self._lock:
            local, self._local = self._local, {}
            attached, self._attached = self._attached, {}
        for (name, rank), (conn, _) in attached.items():
            try:
                conn.request(pb.LocalRequest(detach=pb.LocalDetachRequest(tensor=name,
                                                                          rank=rank)))
            except Error:
                pass  # The worker is gone, or the tensor moved on: nothing is lent any more.
        for conn in local.values():
            conn.close()
        self._coordinators.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    # ---- Calls ---------------------------------------------------------------------------

    def _call(self, method, request, timeout, retry=True):
        return self._retrying(
            lambda attempt: method(request, timeout=timeout, metadata=self._metadata), retry)

    def _list_all(self, method, request, field):
        """The `field` items of every page of List `method`, in order: `request` again with
        each page's next_page_token until one has none."""
        out = []
        while True:
            page = self._call(method, request, self.timeout)
            out.extend(getattr(page, field))
            request.page_token = page.next_page_token
            if not request.page_token:
                return out

    def _retrying(self, call, retry=True):
        """call(attempt) until it returns, while it raises a transient grpc.RpcError, for up
        to retry_for seconds since the first attempt (or since the last that got further:
        attempt.further), with jittered backoff."""
        window = self.retry_for if retry else 0
        give_up = time.monotonic() + window
        pause = 0.1
        while True:
            attempt = _Attempt()
            try:
                return call(attempt)
            except grpc.RpcError as e:
                if attempt.further:
                    give_up = time.monotonic() + window
                    pause = 0.1
                # Jittered, so that clients a restart stopped together do not return together.
                sleep = pause * random.uniform(0.5, 1.0)
                # CANCELLED: gRPC cancels the calls a server had not handed to a handler yet
                # when it shut down (grpc/grpc#41785: a standby handing its port to the
                # leader); this client cancels none, so it is retried as UNAVAILABLE, but not
                # once a stream moved data.
                code = e.code()
                transient = code == grpc.StatusCode.UNAVAILABLE or (
                    code == grpc.StatusCode.CANCELLED and not attempt.moved)
                if not transient or time.monotonic() + sleep >= give_up:
                    raise Error(code.name, e.details()) from None
                if getattr(e, "shardcoord_redirected", False):
                    continue  # A standby named the leader: call it at once.
            time.sleep(sleep)
            pause = min(pause * 2, 2.0)

    def _mutate(self, method, request, timeout):
        """A change: one request_id for the call and all of its retries."""
        if not request.request_id:
            request.request_id = uuid.uuid4().hex
        return self._call(method, request, timeout)

    @staticmethod
    def _finished(response):
        if response.progress.state == pb.ABORTED:
            raise Error("ABORTED", response.progress.error or "plan aborted")
        return response

    # ---- Workers, meshes, tensors --------------------------------------------------------

    def workers(self):
        """Every registered worker (WorkerInfo: name, rank, host, device, state,
        local_socket, memory_budget_bytes, memory_used_bytes, memory_peak_bytes,
        bucket_bytes, ...), in rank order."""
        return self._list_all(self._stub.ListWorkers, pb.ListWorkersRequest(), "workers")

    list_workers = workers

    def meshes(self):
        return list(self._call(self._stub.ListMeshes, pb.ListMeshesRequest(),
                               self.timeout).meshes)

    def create_mesh(self, name, shape, dim_names=(), workers=()):
        request = pb.CreateMeshRequest(name=name, shape=list(shape), dim_names=list(dim_names),
                                       workers=list(workers))
        return self._mutate(self._stub.CreateMesh, request, self.timeout)

    def delete_mesh(self, name):
        self._mutate(self._stub.DeleteMesh, pb.DeleteMeshRequest(name=name), self.timeout)

    def tensors(self, prefix=""):
        """Every tensor (TensorInfo), in name order; only those whose name starts with
        `prefix` when given. Pages through ListTensors (1,000 a call)."""
        return self._list_all(self._stub.ListTensors, pb.ListTensorsRequest(prefix=prefix),
                              "tensors")

    list_tensors = tensors

    def tensor(self, name):
        """The TensorInfo of `name` (layout, version, attached, unattached_ranks, ...)."""
        return self._call(self._stub.GetTensor, pb.GetTensorRequest(name=name), self.timeout)

    def create_tensor(self, name, shape, dtype="f32", mesh=None, placements=None, flat=None,
                      init="zeros", seed=0):
        """A new tensor on `mesh` laid out by `placements` or `flat`; init is "zeros",
        "arange", "random" or "attached" (every rank's buffer lent by a process: attach())."""
        request = self._create_request(name, shape, dtype, mesh, placements, flat, init, seed)
        return self._mutate(self._stub.CreateTensor, request, self.timeout)

    def delete_tensor(self, name):
        self._mutate(self._stub.DeleteTensor, pb.DeleteTensorRequest(name=name), self.timeout)

    def _create_request(self, name, shape, dtype="f32", mesh=None, placements=None, flat=None,
                        init="zeros", seed=0):
        if dtype not in DTYPES:
            raise ValueError(f"dtype: '{dtype}' is not one of {', '.join(DTYPES)}")
        if init not in _INIT:
            raise ValueError(f"init: '{init}' is not one of {', '.join(_INIT)}")
        return pb.CreateTensorRequest(name=name, shape=list(shape), dtype=DTYPES[dtype][0],
                                      spec=spec(mesh, placements, flat), init=_INIT[init],
                                      seed=seed)

    def create_tensors(self, tensors):
        """Creates every tensor of `tensors` (dicts with create_tensor's arguments: name,
        shape, dtype, mesh, placements or flat, init, seed) in one call, all or nothing.
        Returns {"created": N, "bytes": B}. The error names the first bad member."""
        request = pb.CreateTensorsRequest()
        for i, t in enumerate(tensors):
            try:
                request.tensors.append(self._create_request(**t))
            except (TypeError, ValueError) as e:
                raise ValueError(f"tensors[{i}]: {e}") from None
        r = self._mutate(self._stub.CreateTensors, request, self.timeout)
        return {"created": r.created, "bytes": r.bytes}

    def register(self, shapes, mesh, layout, dtype="bf16", init="attached"):
        """Creates every tensor of a model on `mesh` in one CreateTensors call, all or
        nothing. `shapes`: {name: shape} (or (name, shape) pairs) in the model's order.
        `layout`: "fsdp_flat" (OLMo-core/FSDP flat shards over the mesh's ranks, in that
        order), "megatron_tp" (layouts.megatron_tp per name; a 1-d mesh is tp, a 2-d one
        (dp, tp)), {name: {"placements": ...} | {"flat": ...}}, or a function
        (name, shape) -> such a dict. Returns {"created": N, "bytes": B}."""
        from . import layouts
        items = list(shapes.items()) if hasattr(shapes, "items") else list(shapes)
        if not items:
            raise ValueError("shapes: empty")
        info = next((m for m in self.meshes() if m.name == mesh), None)
        if info is None:
            raise Error("NOT_FOUND", f"mesh: unknown mesh '{mesh}'")
        dims = list(info.shape)
        if layout == "fsdp_flat":
            world = math.prod(dims)
            texts = layouts.fsdp_flat([s for _, s in items], world)
            specs = [{"flat": t} for t in texts]
        elif layout == "megatron_tp":
            if len(dims) not in (1, 2):
                raise ValueError(f"layout: megatron_tp needs a 1-d (tp) or 2-d (dp, tp) mesh, "
                                 f"'{mesh}' has {len(dims)} dims")
            tp, dp = dims[-1], (dims[0] if len(dims) == 2 else None)
            specs = [{"placements": layouts.megatron_tp(n, s, tp=tp, dp=dp)} for n, s in items]
        elif callable(layout):
            specs = [layout(n, s) for n, s in items]
        elif hasattr(layout, "get"):
            missing = [n for n, _ in items if n not in layout]
            if missing:
                raise ValueError(f"layout: no spec for '{missing[0]}'")
            specs = [layout[n] for n, _ in items]
        else:
            raise ValueError(f"layout: {layout!r} is not 'fsdp_flat', 'megatron_tp', a dict or "
                             "a function")
        return self.create_tensors([dict(name=n, shape=list(s), dtype=dtype, mesh=mesh,
                                         init=init, **spec)
                                    for (n, s), spec in zip(items, specs)])

    def delete_tensors(self, names=(), prefix=""):
        """Deletes `names` and every tensor whose name starts with `prefix`, all or nothing.
        Returns how many."""
        request = pb.DeleteTensorsRequest(names=list(names), prefix=prefix)
        return self._mutate(self._stub.DeleteTensors, request, self.timeout).deleted

    # ---- Local buffers of attached tensors -----------------------------------------------

    def local_nbytes(self, name, rank):
        """Bytes of `rank`'s local buffer of tensor `name`: its chunks as the layout places
        them (an S(0) shard is DTensor's local tensor; a flat spec the rank's ranges
        concatenated)."""
        info = self.tensor(name)
        return _rank_chunks(info, rank).local_elements * _buffers.element_size(
            WIRE_NAMES[info.dtype])

    def local_shape(self, name, rank):
        """The shape alloc() gives `rank`'s local buffer: its one chunk's box shape, or
        (elements,) for a flat spec or several chunks."""
        return self._local_shape(self.tensor(name), rank)

    @staticmethod
    def _local_shape(info, rank):
        rc = _rank_chunks(info, rank)
        if (len(rc.chunks) == 1 and not info.spec.startswith("flat") and
                math.prod(rc.chunks[0].box.shape) == rc.local_elements):
            return tuple(rc.chunks[0].box.shape)
        return (rc.local_elements,)

    def alloc(self, name, rank, framework="numpy"):
        """A zeroed buffer for `rank`'s local buffer of `name` that attach() lends without a
        copy: a NumPy array or torch CPU tensor in shared memory (a sealed memfd the worker
        maps). For a GPU worker, allocate a CUDA tensor of local_shape() with torch instead."""
        info = self.tensor(name)
        wire = WIRE_NAMES[info.dtype]
        shape = self._local_shape(info, rank)
        nbytes = math.prod(shape) * _buffers.element_size(wire)
        return _buffers.alloc_shared(nbytes, wire, shape, framework,
                                     name=f"shardcoord-{name}-{rank}")

    def _worker_of(self, rank, refresh=False):
        """The WorkerInfo of `rank`'s worker: from one ListWorkers, kept for the next calls
        (`refresh`: listed again, after its worker went away)."""
        with self._lock:
            known = None if refresh else self._workers_by_rank.get(rank)
        if known is not None:
            return known
        workers = {w.rank: w for w in self.workers()}
        with self._lock:
            self._workers_by_rank = workers
        if rank not in workers:
            raise Error("NOT_FOUND", f"rank: no worker holds rank {rank}")
        return workers[rank]

    def _connection(self, worker):
        if not worker.local_socket:
            raise Error("FAILED_PRECONDITION", f"worker {worker.name} (rank {worker.rank}) serves "
                                               "no local socket (started with --local-socket off?)")
        with self._lock:
            conn = self._local.get(worker.local_socket)
        if conn is None:
            conn = LocalConnection(worker.local_socket, f"worker {worker.name}")
            with self._lock:
                conn = self._local.setdefault(worker.local_socket, conn)
        return conn

    def _forget(self, worker, conn):
        """`conn` to `worker` broke (the worker went away or restarted): its attachments
        ended with it."""
        with self._lock:
            if self._local.get(worker.local_socket) is conn:
                del self._local[worker.local_socket]
            self._attached = {k: v for k, v in self._attached.items() if v[0] is not conn}
        conn.close()

    def attach(self, name, rank, buf):
        """Lends `buf` (a NumPy array, or a torch CPU or CUDA tensor; contiguous, of the
        tensor's dtype and exactly local_nbytes()) as `rank`'s local buffer of attached tensor
        `name`, through the local socket of the worker holding `rank` (on this host). Shared
        memory from alloc() and CUDA memory are used in place; other CPU memory is read and
        written with process_vm_readv/writev (one copy per plan). Keep `buf` (and this client)
        alive while attached. Returns True once every rank is attached (the tensor is
        readable). A buffer of the wrong size, dtype or device, or not contiguous, is refused
        with INVALID_ARGUMENT before anything is registered. One buffer of attach_many."""
        try:
            return self.attach_many(rank, {name: buf}, progress=False)[name]
        except Error as e:
            prefix = f"attachments[0] '{name}': "
            message = e.message[len(prefix):] if e.message.startswith(prefix) else e.message
            raise Error(e.code, message, member=e.member) from None

    def attach_many(self, rank, buffers, progress=True, _verb="attach"):
        """Lends every buffer of `buffers` ({tensor name: buffer}, or (name, buffer) pairs;
        each as attach() takes it) as `rank`'s local buffer of that attached tensor, in one
        request to the local socket of `rank`'s worker: all or nothing. The process looks no
        tensor up: the worker takes each tensor's layout from the coordinator and checks the
        buffer's size and dtype against it. Costs the coordinator one ListWorkers per client
        (none once the rank's worker is known) and the worker two AttachBuffers calls,
        whatever the number of buffers. Returns {name: readable}. Refusals raise Error with
        `.member` the failing name (message "attachments[i] 'NAME': ..."). Progress on
        stderr when it is a terminal (`progress`=False: never)."""
        items = list(buffers.items()) if hasattr(buffers, "items") else list(buffers)
        if not items:
            raise ValueError("buffers: empty")
        bar = _progress.Progress(f"{_verb} rank {rank}", len(items),
                                 stream=None if progress else Silent())
        give_up = time.monotonic() + self.retry_for
        pause = 0.1
        while True:
            try:
                readable = self._attach_many_once(rank, items, bar)
                break
            except Error as e:
                # ABORTED: a tensor is busy or moved to a new version; nothing was attached.
                sleep = pause * random.uniform(0.5, 1.0)
                if e.code != "ABORTED" or time.monotonic() + sleep >= give_up:
                    bar.close(f"failed: {e.code}")
                    raise
            time.sleep(sleep)
            pause = min(pause * 2, 2.0)
        nbytes = sum(nbytes_of(buf) for _, buf in items)
        bar.close(f"{len(items)} {bar.what} ({human_bytes(nbytes)}) lent, "
                  f"{sum(readable.values())} tensors readable")
        return readable

    def _attach_many_once(self, rank, items, bar):
        worker = self._worker_of(rank)
        request = pb.LocalRequest()
        many = request.attach_many
        fds, fd_index, plain = [], {}, False
        for i, (name, buf) in enumerate(items):
            try:
                lent = _buffers.describe(buf, "bf16")  # uint16 arrays hold bf16 bits.
            except Error as e:
                raise Error(e.code, f"attachments[{i}] '{name}': {e.message}",
                            member=name) from None
            if worker.device != lent.device and not (worker.device.startswith("cuda") and
                                                     lent.device.startswith("cuda")):
                raise Error("INVALID_ARGUMENT",
                            f"attachments[{i}] '{name}': buffer: on {lent.device}, but worker "
                            f"{worker.name} (rank {rank}) keeps its buffers on {worker.device}",
                            member=name)
            a = many.attachments.add(tensor=name, rank=rank, dtype=DTYPES[lent.wire_dtype][0],
                                     bytes=lent.nbytes)
            if lent.memory == "shared":
                if lent.fd not in fd_index:
                    fd_index[lent.fd] = len(fds)
                    fds.append(lent.fd)
                a.shared.offset = lent.offset
                a.shared.fd_index = fd_index[lent.fd]
            elif lent.memory == "process":
                plain = True
                a.process.address = lent.address
            else:
                a.cuda_ipc.handle = lent.handle
                a.cuda_ipc.offset = lent.offset
                a.cuda_ipc.device_uuid = lent.device_uuid
            bar.update(i + 1, "described")
        bar.update(len(items), f"sent to worker {worker.name}")
        for attempt in (0, 1):
            conn = self._connection(worker)
            if plain:
                conn.allow_reads()
            try:
                response = conn.request(request, fds=fds)
                break
            except Error as e:
                e.member = member_of(e.message, items)
                if e.code != "UNAVAILABLE" or attempt == 1:
                    raise
                # The worker went away (or restarted on the same socket): forget its
                # connection, whose attachments ended with it, and try a new one once.
                self._forget(worker, conn)
                worker = self._worker_of(rank, refresh=True)
        with self._lock:
            for name, buf in items:
                self._attached[(name, rank)] = (conn, buf)
        return {name: a.readable
                for (name, _), a in zip(items, response.attach_many.attachments)}

    def lend(self, rank, state_dict, progress=True):
        """Lends this process's local tensors of a whole model as `rank`'s buffers of its
        attached tensors (created with register(..., init="attached")), in one request
        (attach_many): `state_dict` maps each parameter's name to its local tensor (a torch
        tensor on the CPU or the worker's GPU, a NumPy array; a DTensor lends its local
        shard). A trainer lends its parameters once; every later copy or transfer reads them
        in place. Returns {name: readable}; Error with `.member` on a refusal (nothing is
        lent then)."""
        return self.attach_many(rank, local_tensors(state_dict, "state_dict", writable=False),
                                progress=progress, _verb="lend")

    def receive(self, rank, state_dict, progress=True):
        """Lends an inference process's tensors as `rank`'s buffers of attached tensors that
        copies and transfers write in place (the engine reads its new weights where they
        are, no copy out): as lend, but every buffer must be writable (a read-only NumPy
        array is refused with INVALID_ARGUMENT naming it). Returns {name: readable}."""
        return self.attach_many(rank, local_tensors(state_dict, "state_dict", writable=True),
                                progress=progress, _verb="receive")

    def detach(self, name, rank):
        """Ends the loan of `rank`'s buffer of `name`: the worker stops using it, and the
        rank's chunks are missing until a buffer is attached again."""
        with self._lock:
            entry = self._attached.pop((name, rank), None)
        if entry is None:
            raise Error("NOT_FOUND", f"rank {rank} of '{name}' is not attached by this client")
        entry[0].request(pb.LocalRequest(detach=pb.LocalDetachRequest(tensor=name, rank=rank)))

    # ---- Plans ---------------------------------------------------------------------------

    def redistribute(self, name, placements=None, flat=None, mesh=""):
        """Runs the plan to its end; returns the RedistributeResponse (progress and plan). An
        attached tensor moves into worker-owned buffers."""
        request = pb.RedistributeRequest(tensor=name, target=spec(mesh, placements, flat),
                                         wait=True)
        return self._finished(self._mutate(self._stub.Redistribute, request, self.data_timeout))

    def gather(self, name, mesh="", to_rank=None):
        """Gathers `name` to every rank of `mesh` (empty: its own) or to `to_rank` and waits.
        A list of names goes as one group (gather_many)."""
        if not isinstance(name, str):
            return self.gather_many(name, mesh=mesh, to_rank=to_rank)
        request = pb.GatherRequest(tensor=name, mesh=mesh, wait=True)
        if to_rank is not None:
            request.to_rank = to_rank
            request.has_to_rank = True
        return self._finished(self._mutate(self._stub.Gather, request, self.data_timeout))

    def copy(self, src, dst, quantize="", dequantize=False, scale="", dst_offset=None,
             src_offset=None, src_shape=None):
        """Writes src's values into dst (same shape, any mesh and layout; in place when dst
        is attached; cast to dst's dtype where the dtypes differ, see README "Dtypes and
        casts") and waits; returns the CopyResponse. Block-scaled FP8: quantize="block:128x128"
        with scale=NAME writes dst (f8_e4m3) and the f32 scales; dequantize=True with
        scale=NAME reads them back into dst's dtype (block: `quantize` when given, else
        block:128x128); the response's block_copy says where blocks were made whole. With
        `dst_offset` (a list of ints) src lands in the box of dst starting there (k into a
        fused qkv); with `src_offset` and `src_shape` only that box of src is read (README
        "Slices of fused tensors")."""
        request = pb.CopyRequest(src=src, dst=dst, wait=True, quantize=quantize,
                                 dequantize=dequantize, scale=scale, dst_offset=dst_offset or [],
                                 src_offset=src_offset or [], src_shape=src_shape or [])
        return self._finished(self._mutate(self._stub.Copy, request, self.data_timeout))

    def copy_many(self, pairs):
        """Copies every (src, dst) of `pairs` (tuples or {"src", "dst"} dicts; a dict may
        name boxes: "dst_offset", "src_offset" and "src_shape", lists of ints, or be a
        block-scaled FP8 member: "quantize": "block:128x128" or "dequantize": True, with
        "scale": NAME) as one transaction: every dst (and scale) gets its new version
        together, or none does. Waits; returns
        the CopyGroupResponse (group_id, state, bytes_moved, lower_bound_bytes, buckets,
        bucket_bytes, seconds, members)."""
        request = pb.CopyGroupRequest(copies=_copy_pairs(pairs), wait=True)
        return self._mutate(self._stub.CopyGroup, request, self.data_timeout)

    def redistribute_many(self, items):
        """Redistributes many tensors as one transaction. `items`: a dict {tensor: {"mesh",
        "placements" | "flat"}}, or a list of (tensor, placements) tuples and {"tensor",
        "mesh", "placements" | "flat"} dicts. Waits; returns the RedistributeGroupResponse."""
        if isinstance(items, dict):
            items = [dict(target, tensor=name) for name, target in items.items()]
        members = []
        for item in items:
            if isinstance(item, dict):
                target = spec(item.get("mesh", ""), item.get("placements"), item.get("flat"))
                members.append(pb.RedistributeItem(tensor=item["tensor"], target=target))
            else:
                name, placements = item
                members.append(pb.RedistributeItem(tensor=name, target=spec("", placements)))
        request = pb.RedistributeGroupRequest(redistributes=members, wait=True)
        return self._mutate(self._stub.RedistributeGroup, request, self.data_timeout)

    def gather_many(self, names, mesh="", to_rank=None):
        """Gathers every tensor of `names` as one transaction and one fused plan (to every
        rank of `mesh`, empty: each tensor's own, or to `to_rank`). Waits; returns the
        RedistributeGroupResponse (group_id, state, bytes_moved, lower_bound_bytes, buckets,
        bucket_bytes, seconds, members)."""
        request = pb.GatherGroupRequest(tensors=list(names), mesh=mesh, wait=True)
        if to_rank is not None:
            request.to_rank = to_rank
            request.has_to_rank = True
        return self._mutate(self._stub.GatherGroup, request, self.data_timeout)

    # ---- Prepared transfers (issue 27) ---------------------------------------------------

    def create_transfer(self, name, pairs):
        """Prepares transfer `name`: the (src, dst) `pairs` (as copy_many's) are checked as a
        copy group, every worker keeps its part of the plan, and the transfer is stored; no
        data moves. Returns its TransferInfo (members, participants, templates, layouts,
        bytes, bytes_moved, lower_bound_bytes, max_rank_send_bytes, ...). At most 100,000
        pairs; errors name the pair ("copies[3].dst: ...")."""
        request = pb.CreateTransferRequest(name=name, copies=_copy_pairs(pairs))
        return self._mutate(self._stub.CreateTransfer, request, self.data_timeout)

    def run_transfer(self, name):
        """Runs transfer `name` once and waits: every dst gets its src's values and one new
        version, all or nothing; a transfer whose members or workers changed is prepared
        again first ("replanned"). Returns {"name", "seconds", "bytes_moved",
        "lower_bound_bytes", "members", "replanned", "version", "run_id",
        "prepare_seconds"}. An aborted run raises Error("ABORTED", why): every dst kept its
        version."""
        request = pb.RunTransferRequest(name=name, wait=True)
        r = self._mutate(self._stub.RunTransfer, request, self.data_timeout)
        return {"name": r.name, "seconds": r.seconds, "bytes_moved": r.bytes_moved,
                "lower_bound_bytes": r.lower_bound_bytes, "members": r.members,
                "replanned": r.replanned, "version": r.version, "run_id": r.run_id,
                "prepare_seconds": r.prepare_seconds}

    def transfer(self, name, pairs):
        """The weight-sync step's setup: create_transfer(name, pairs), prepared once; then
        run(name) every step."""
        return self.create_transfer(name, pairs)

    def run(self, name):
        """One weight-sync step: run_transfer(name)."""
        return self.run_transfer(name)

    def transfer_info(self, name, copies=False):
        """The TransferInfo of transfer `name` (prepared, invalid_reason, runs, version,
        ...), with its pairs in `copies` when asked."""
        return self._call(self._stub.GetTransfer, pb.GetTransferRequest(name=name, copies=copies),
                          self.timeout)

    def transfers(self):
        """Every transfer (TransferInfo without copies), in name order; pages through
        ListTransfers."""
        return self._list_all(self._stub.ListTransfers, pb.ListTransfersRequest(), "transfers")

    def delete_transfer(self, name):
        """Deletes transfer `name`: its workers drop their parts; the tensors stay as they are
        (each dst at the version its last run gave it)."""
        self._mutate(self._stub.DeleteTransfer, pb.DeleteTransferRequest(name=name), self.timeout)

    # ---- Checkpoints (workers write and read the files) -----------------------------------

    def save_checkpoint(self, dir, names=None, overwrite=False):
        """Saves tensors `names` (None: every tensor) into checkpoint directory `dir` (made
        absolute here; every worker must reach it): safetensors files and index.json, every
        distinct piece written once. With `overwrite`, replaces an existing `dir` once the new
        one is complete. Waits; returns the SaveCheckpointResponse."""
        request = pb.SaveCheckpointRequest(dir=os.path.abspath(dir), tensors=list(names or ()),
                                           all=names is None, overwrite=overwrite)
        return self._mutate(self._stub.SaveCheckpoint, request, self.data_timeout)

    def load_checkpoint(self, dir, targets=None, mesh=None, placements=None, flat=None,
                        prefix="", into=False, dtype=None, dequantize=False, block=""):
        """Loads tensors of checkpoint `dir` (or a .safetensors file, or a directory of them).
        `targets`: a dict {tensor: {"mesh", "placements" | "flat", optional "name"}}, or a list
        of tensor names all laid out by `mesh` and `placements` / `flat`; None: every tensor,
        laid out so. Created as `prefix` + name (or the target's "name"); with `into`, copied
        into those existing tensors (no layout needed). `dtype`: cast every tensor to it as it
        loads. `dequantize`: every F8_E4M3 entry N with an F32 entry N_scale_inv (block-scaled
        FP8, DeepSeek-V3 / Hugging Face) loads dequantized, into `dtype` (default bf16; with
        `into`, the tensor's), the scales consumed; `block`: "block:RxC" (default 128x128).
        All or nothing. Waits; returns the LoadCheckpointResponse."""
        request = pb.LoadCheckpointRequest(dir=os.path.abspath(dir), prefix=prefix, into=into,
                                           dequantize=dequantize, block=block)
        if dtype is not None:
            if dtype not in DTYPES:
                raise ValueError(f"dtype: '{dtype}' is not one of {', '.join(DTYPES)}")
            request.dtype = DTYPES[dtype][0]
        default = None
        if not into and not isinstance(targets, dict):
            default = spec(mesh, placements, flat)
        if targets is None:
            request.all = True
            if default is not None:
                request.spec.CopyFrom(default)
        elif isinstance(targets, dict):
            for tensor, t in targets.items():
                target = pb.LoadTarget(tensor=tensor, name=t.get("name", ""))
                if not into:
                    target.target.CopyFrom(spec(t["mesh"], t.get("placements"), t.get("flat")))
                request.targets.append(target)
        else:
            for tensor in targets:
                target = pb.LoadTarget(tensor=tensor)
                if default is not None:
                    target.target.CopyFrom(default)
                request.targets.append(target)
        return self._mutate(self._stub.LoadCheckpoint, request, self.data_timeout)

    def inspect_checkpoint(self, dir):
        """The checkpoint's tensors, pieces and writers (InspectCheckpointResponse)."""
        request = pb.InspectCheckpointRequest(dir=os.path.abspath(dir))
        return self._call(self._stub.InspectCheckpoint, request, self.data_timeout)

    # ---- Whole tensors through the coordinator -------------------------------------------

    def download(self, name):
        """The whole tensor as a NumPy array (bf16 as uint16 bit patterns). A download broken
        by UNAVAILABLE (the coordinator gone) is resumed at the leader, within retry_for of
        the last byte received, skipping what arrived before; only a stream of the same
        tensor version resumes (else ABORTED)."""
        got = {"first": None, "delivered": 0}
        parts = []

        def call(attempt):
            before = got["delivered"]
            header, received = None, 0
            stream = self._stub.Download(pb.DownloadRequest(name=name), timeout=self.data_timeout,
                                         metadata=self._metadata)
            try:
                for message in stream:
                    if header is None:
                        header = message.header
                        attempt.moved = True
                        if got["first"] is None:
                            got["first"] = header
                        else:
                            _resumable(name, got["first"], header, got["delivered"])
                    start = received
                    received += len(message.data)
                    if received > header.total_bytes:
                        raise Error("DATA_LOSS", f"download of '{name}': more than the "
                                                 f"{header.total_bytes} bytes announced")
                    if received > got["delivered"]:
                        parts.append(message.data[got["delivered"] - start:])
                        got["delivered"] = received
            finally:
                stream.close()
                attempt.further = got["delivered"] > before
            return header, received

        header, received = self._retrying(call)
        if header is None:
            raise Error("INTERNAL", f"download of '{name}': empty stream")
        data = b"".join(parts)
        if received != header.total_bytes or len(data) != header.total_bytes:
            raise Error("DATA_LOSS", f"download of '{name}': got {len(data)} of "
                                     f"{header.total_bytes} bytes")
        return np.frombuffer(data, dtype=_NUMPY_OF_WIRE[header.dtype]).reshape(tuple(header.shape))

    def upload(self, name, array, mesh, placements=None, flat=None, dtype=None):
        """Stores `array` (any order; sent C-ordered) as tensor `name`, a new version laid out
        by `placements` or `flat` on `mesh`; `dtype` defaults to the array's. All or nothing:
        an upload broken by UNAVAILABLE is sent again whole, at the leader, within retry_for
        of the furthest it got, with one request_id, so that a retry of one that committed
        answers its outcome instead of making a second version."""
        if dtype is None:
            dtype = next((k for k, (_, npt, _) in DTYPES.items()
                          if k not in BITS_ONLY and np.dtype(npt) == array.dtype), None)
            if dtype is None:
                raise ValueError(f"numpy dtype {array.dtype} has no shardcoord equivalent")
        data = np.ascontiguousarray(array, dtype=_NUMPY_OF_WIRE[DTYPES[dtype][0]]).tobytes()
        header = pb.TensorHeader(name=name, shape=list(array.shape), dtype=DTYPES[dtype][0],
                                 spec=spec(mesh, placements, flat), total_bytes=len(data),
                                 request_id=uuid.uuid4().hex)
        furthest = [0]

        def call(attempt):
            sent = [0]

            # attempt.moved stays False: as a unary change, CANCELLED is retried even after
            # data was sent (the upload commits whole or not at all; its request_id answers a
            # commit whose answer was lost).
            def messages():
                yield pb.TensorData(header=header)
                for off in range(0, len(data), _CHUNK):
                    chunk = data[off:off + _CHUNK]
                    yield pb.TensorData(data=chunk)
                    sent[0] = off + len(chunk)

            try:
                return self._stub.Upload(messages(), timeout=self.data_timeout,
                                         metadata=self._metadata)
            finally:
                if sent[0] > furthest[0]:
                    furthest[0] = sent[0]
                    attempt.further = True

        return self._retrying(call).tensor


def _copy_pairs(pairs):
    """CopyPairs of (src, dst) tuples and {"src", "dst"[, "dst_offset", "src_offset",
    "src_shape", "quantize", "dequantize", "scale"]} dicts."""
    copies = []
    for pair in pairs:
        if isinstance(pair, dict):
            copies.append(pb.CopyPair(src=pair["src"], dst=pair["dst"],
                                      dst_offset=pair.get("dst_offset") or [],
                                      src_offset=pair.get("src_offset") or [],
                                      src_shape=pair.get("src_shape") or [],
                                      quantize=pair.get("quantize", ""),
                                      dequantize=bool(pair.get("dequantize", False)),
                                      scale=pair.get("scale", "")))
        else:
            src, dst = pair
            copies.append(pb.CopyPair(src=src, dst=dst))
    return copies


def connect(address=None, token=None, tls_ca=None, **kwargs):
    """A Client for `address` (default $SHARDCOORD_ADDR, then 127.0.0.1:7400; "A,B" for
    several coordinators on etcd, of which calls follow the leader) sending bearer
    `token` (default $SHARDCOORD_TOKEN), over TLS verified with the CA file `tls_ca` (default
    $SHARDCOORD_TLS_CA; plaintext when both are unset). kwargs: timeout, data_timeout,
    retry_for (seconds to retry UNAVAILABLE; 0: never), tls_cert and tls_key."""
    return Client(address, token=token, tls_ca=tls_ca, **kwargs)
