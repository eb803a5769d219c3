"""The local attach protocol (shardcoord.proto, "Local attach protocol"): length-prefixed
LocalRequest / LocalResponse messages over a worker's Unix domain socket, a shared-memory
descriptor passed with SCM_RIGHTS. The connection owns what it attached: closing it (or the
process ending) detaches everything."""

import array
import ctypes
import socket
import struct
import threading

import grpc

from ._errors import Error
from ._proto import pb

_CODE_NAMES = {code.value[0]: code.name for code in grpc.StatusCode}
_MAX_FRAME = 64 << 20          # proto/local_frame.h kMaxLocalFrameBytes
MAX_FDS_PER_SEND = 253         # The kernel's SCM_MAX_FD (kMaxLocalFdsPerSend).
_PR_SET_PTRACER = 0x59616D61


def _frame(payload):
    return struct.pack("<I", len(payload)) + payload


class LocalConnection:
    """One connection to one worker's local socket. Thread-safe (one request at a time)."""

    def __init__(self, path, worker="worker"):
        self.path = path
        self.worker = worker
        self._lock = threading.Lock()
        self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            self._sock.connect(path)
        except OSError as e:
            self._sock.close()
            raise Error("UNAVAILABLE", f"cannot connect to {worker}'s local socket {path}: "
                                       f"{e.strerror}") from None
        creds = self._sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED,
                                      struct.calcsize("3i"))
        self.worker_pid, _, _ = struct.unpack("3i", creds)
        self._ptracer_set = False

    def close(self):
        self._sock.close()

    def allow_reads(self):
        """Lets the worker read and write this process's plain memory where Yama's
        ptrace_scope 1 would refuse it (the worker is no ancestor of this process)."""
        if self._ptracer_set:
            return
        try:
            with open("/proc/sys/kernel/yama/ptrace_scope", encoding="ascii") as f:
                scope = int(f.read().strip() or 0)
        except (OSError, ValueError):
            scope = 0
        if scope == 1:
            libc = ctypes.CDLL(None, use_errno=True)
            libc.prctl(_PR_SET_PTRACER, ctypes.c_ulong(self.worker_pid), 0, 0, 0)
        self._ptracer_set = True

    def request(self, request, fd=None, fds=()):
        """Sends a LocalRequest (with descriptor `fd`, or the descriptors `fds` in fd_index
        order, as SCM_RIGHTS data) and returns the LocalResponse; Error with the worker's
        code and message when it refuses."""
        data = _frame(request.SerializeToString())
        fds = [fd] if fd is not None else list(fds)
        # At most MAX_FDS_PER_SEND descriptors go with one sendmsg: group g travels with the
        # frame's byte g, the last group with the rest (shardcoord.proto, attach_many).
        groups = [fds[i:i + MAX_FDS_PER_SEND] for i in range(0, len(fds), MAX_FDS_PER_SEND)]
        if len(groups) > len(data):
            raise Error("INVALID_ARGUMENT", f"{len(fds)} descriptors for a request of "
                                            f"{len(data)} bytes")
        with self._lock:
            try:
                for g, group in enumerate(groups[:-1]):
                    self._send(data[g:g + 1], group)
                last = max(len(groups) - 1, 0)
                self._send(data[last:], groups[-1] if groups else [])
            except (BrokenPipeError, ConnectionResetError):
                pass  # A worker that refused this peer has answered and hung up: read it.
            response = self._read()
        if response.code != 0:
            raise Error(_CODE_NAMES.get(response.code, str(response.code)), response.message)
        return response

    def _send(self, piece, fds):
        if not fds:
            self._sock.sendall(piece)
            return
        sent = self._sock.sendmsg([piece], [(socket.SOL_SOCKET, socket.SCM_RIGHTS,
                                             array.array("i", fds))])
        if sent < len(piece):
            self._sock.sendall(piece[sent:])

    def _read(self):
        header = self._read_exactly(4)
        (n,) = struct.unpack("<I", header)
        if n > _MAX_FRAME:
            raise Error("INTERNAL", f"{self.worker} sent a frame of {n} bytes")
        response = pb.LocalResponse()
        response.ParseFromString(self._read_exactly(n))
        return response

    def _read_exactly(self, n):
        out = bytearray()
        while len(out) < n:
            try:
                chunk = self._sock.recv(n - len(out))
            except ConnectionResetError:
                chunk = b""
            if not chunk:
                raise Error("UNAVAILABLE",
                            f"{self.worker} closed its local socket {self.path} (did it stop?)")
            out += chunk
        return bytes(out)

