"""Buffers a process lends a worker: what attach() needs to know of a NumPy array or a torch
tensor, and attachable buffers allocated in shared memory (alloc)."""

import fcntl
import mmap
import os
import threading
import weakref

import numpy as np

from ._errors import Error
from ._proto import pb

# Wire dtype name -> (enum, NumPy dtype, torch dtype name): every safetensors dtype. NumPy
# has no bfloat16 or float8: their bits travel as uint16 and uint8 (BITS_ONLY).
DTYPES = {
    "f32": (pb.F32, np.float32, "float32"), "f64": (pb.F64, np.float64, "float64"),
    "f16": (pb.F16, np.float16, "float16"), "bf16": (pb.BF16, np.uint16, "bfloat16"),
    "i8": (pb.I8, np.int8, "int8"), "u8": (pb.U8, np.uint8, "uint8"),
    "i32": (pb.I32, np.int32, "int32"), "i64": (pb.I64, np.int64, "int64"),
    "bool": (pb.BOOL, np.bool_, "bool"), "i16": (pb.I16, np.int16, "int16"),
    "u16": (pb.U16, np.uint16, "uint16"), "u32": (pb.U32, np.uint32, "uint32"),
    "u64": (pb.U64, np.uint64, "uint64"),
    "f8_e4m3": (pb.F8_E4M3, np.uint8, "float8_e4m3fn"),
    "f8_e5m2": (pb.F8_E5M2, np.uint8, "float8_e5m2"),
    "f8_e8m0": (pb.F8_E8M0, np.uint8, "float8_e8m0fnu"),
}
# Dtypes NumPy lacks: an array of their bits is never taken for one unless named.
BITS_ONLY = frozenset({"bf16", "f8_e4m3", "f8_e5m2", "f8_e8m0"})
WIRE_NAMES = {enum: name for name, (enum, _, _) in DTYPES.items()}


def element_size(wire_name):
    return np.dtype(DTYPES[wire_name][1]).itemsize


class _SharedRegions:
    """Address ranges of this process that alloc() mapped from a memfd: a buffer inside one
    is lent as shared memory (the worker maps the same pages) instead of plain memory."""

    def __init__(self):
        self._lock = threading.Lock()
        self._regions = {}  # start address -> (end, fd)

    def add(self, start, end, fd):
        with self._lock:
            self._regions[start] = (end, fd)

    def remove(self, start):
        with self._lock:
            end, fd = self._regions.pop(start, (None, None))
        if fd is not None:
            os.close(fd)

    def find(self, address, nbytes):
        """(fd, offset) of the region holding [address, address + nbytes), or None."""
        with self._lock:
            for start, (end, fd) in self._regions.items():
                if start <= address and address + nbytes <= end:
                    return fd, address - start
        return None


SHARED = _SharedRegions()


def alloc_shared(nbytes, wire_dtype, shape, framework, name="shardcoord"):
    """A zeroed NumPy array or torch CPU tensor of `shape` and `wire_dtype` in a new sealed
    memfd, which attach() lends as shared memory (zero copy)."""
    if framework not in ("numpy", "torch"):
        raise ValueError(f"framework: '{framework}' is neither 'numpy' nor 'torch'")
    fd, size, mapping = _huge_memfd(nbytes, name)
    if fd is None:
        fd = os.memfd_create(name, os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
        size = max(nbytes, 1)
        try:
            os.ftruncate(fd, size)
            # Sealed against shrinking: the worker maps it, and a shrink would crash the mapper.
            fcntl.fcntl(fd, fcntl.F_ADD_SEALS, fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW)
            mapping = mmap.mmap(fd, size)
            if hasattr(mmap, "MADV_HUGEPAGE"):
                mapping.madvise(mmap.MADV_HUGEPAGE)  # Where the host allows huge shmem pages.
        except BaseException:
            os.close(fd)
            raise
    count = nbytes // element_size(wire_dtype)
    array = np.frombuffer(mapping, dtype=DTYPES[wire_dtype][1], count=count).reshape(shape)
    start = array.__array_interface__["data"][0] if count else _address_of(mapping)
    SHARED.add(start, start + size, fd)
    # The region (and its descriptor) lives as long as the mapping does.
    weakref.finalize(mapping, SHARED.remove, start)
    if framework == "numpy":
        return array
    import torch  # pylint: disable=import-outside-toplevel
    tensor = torch.from_numpy(array)
    if wire_dtype == "bf16":
        tensor = tensor.view(torch.bfloat16)
    return tensor


def _huge_memfd(nbytes, name):
    """(fd, size, mapping) of a sealed hugetlbfs memfd of whole huge pages holding nbytes,
    where the host reserved huge pages (vm.nr_hugepages) and enough are free, as the C++
    client's SharedMemory does: the workers write into it as fast as into their own huge
    pages, about 2.5x faster than into 4 KiB shared pages. (None, 0, None) otherwise, for a
    buffer smaller than a huge page, or with SHARDCOORD_HUGETLB=off."""
    if os.environ.get("SHARDCOORD_HUGETLB") == "off" or not hasattr(os, "MFD_HUGETLB"):
        return None, 0, None
    try:
        fd = os.memfd_create(name, os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING | os.MFD_HUGETLB)
    except OSError:
        return None, 0, None  # No hugetlbfs.
    try:
        page = os.fstat(fd).st_blksize
        if nbytes < page:
            os.close(fd)
            return None, 0, None
        size = (nbytes + page - 1) // page * page
        os.ftruncate(fd, size)
        fcntl.fcntl(fd, fcntl.F_ADD_SEALS, fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW)
        # The mapping reserves the huge pages (fails when too few are free).
        return fd, size, mmap.mmap(fd, size)
    except OSError:
        os.close(fd)
        return None, 0, None


def _address_of(mapping):
    import ctypes  # pylint: disable=import-outside-toplevel
    return ctypes.addressof(ctypes.c_char.from_buffer(mapping))


class Lent:
    """What attach() sends for a buffer: its memory kind and where it is."""

    def __init__(self, memory, nbytes, wire_dtype, device, keep):
        self.memory = memory  # "shared", "process" or "cuda_ipc"
        self.nbytes = nbytes
        self.wire_dtype = wire_dtype
        self.device = device  # "cpu" or "cuda:N"
        self.keep = keep      # The array or tensor: it must outlive the attachment.
        self.address = 0
        self.fd = None
        self.offset = 0
        self.handle = b""
        self.device_uuid = ""


def _invalid(message):
    return Error("INVALID_ARGUMENT", message)


def _wire_of_numpy(dtype, want):
    """The wire name of a NumPy dtype (uint16 stands for bf16, uint8 for a float8, when the
    tensor is of that dtype)."""
    dtype = np.dtype(dtype)
    if dtype.byteorder == ">":
        return None
    if want in BITS_ONLY and dtype == np.dtype(DTYPES[want][1]):
        return want
    return next((name for name, (_, np_type, _) in DTYPES.items()
                 if name not in BITS_ONLY and np.dtype(np_type) == dtype), None)


def describe(buf, want_dtype):
    """A Lent for `buf` (a NumPy array or a torch tensor); Error(INVALID_ARGUMENT) when it
    is not contiguous or its dtype has no shardcoord equivalent."""
    if isinstance(buf, np.ndarray):
        if not buf.flags.c_contiguous:
            raise _invalid("buffer: the NumPy array is not C-contiguous "
                           "(np.ascontiguousarray copies it, but then lend the copy)")
        wire = _wire_of_numpy(buf.dtype, want_dtype)
        if wire is None:
            raise _invalid(f"buffer: NumPy dtype {buf.dtype} has no shardcoord equivalent")
        lent = Lent("process", buf.nbytes, wire, "cpu", buf)
        lent.address = buf.__array_interface__["data"][0]
        _shared_or_plain(lent)
        return lent
    torch = _torch_of(buf)
    if torch is None:
        raise _invalid(f"buffer: a {type(buf).__name__} is neither a NumPy array nor a torch "
                       "tensor")
    if not buf.is_contiguous():
        raise _invalid("buffer: the torch tensor is not contiguous (.contiguous() copies it, "
                       "but then lend the copy)")
    wire = next((n for n, (_, _, t) in DTYPES.items()
                 if getattr(torch, t, None) == buf.dtype), None)
    if wire is None:
        raise _invalid(f"buffer: torch dtype {buf.dtype} has no shardcoord equivalent")
    nbytes = buf.numel() * buf.element_size()
    if buf.device.type == "cpu":
        lent = Lent("process", nbytes, wire, "cpu", buf)
        lent.address = buf.data_ptr()
        _shared_or_plain(lent)
        return lent
    if buf.device.type != "cuda":
        raise _invalid(f"buffer: torch device {buf.device} is neither cpu nor cuda")
    lent = Lent("cuda_ipc", nbytes, wire, f"cuda:{buf.device.index}", buf)
    if nbytes:
        storage = buf.untyped_storage() if hasattr(buf, "untyped_storage") else buf.storage()
        shared = storage._share_cuda_()  # pylint: disable=protected-access
        # (device, handle, storage bytes, storage offset in the allocation, ...)
        lent.handle = cuda_ipc_handle(bytes(shared[1]))
        lent.offset = int(shared[3]) + buf.storage_offset() * buf.element_size()
    props = torch.cuda.get_device_properties(buf.device)
    uuid = getattr(props, "uuid", None)
    if uuid is not None:
        uuid = str(uuid)
        lent.device_uuid = uuid if uuid.startswith("GPU-") else f"GPU-{uuid}"
    return lent


CUDA_IPC_HANDLE_BYTES = 64  # sizeof(cudaIpcMemHandle_t)


def cuda_ipc_handle(torch_handle):
    """The cudaIpcMemHandle_t inside what torch's `_share_cuda_` returns: the bare 64 bytes
    (torch before 2.2), or a version byte, a type byte and then the handle for a plain
    cudaMalloc block ('c'). Blocks of expandable segments ('e') are shared through file
    descriptors of the driver's virtual memory API, which a worker cannot open."""
    if len(torch_handle) == CUDA_IPC_HANDLE_BYTES:
        return torch_handle
    kind = chr(torch_handle[1]) if len(torch_handle) >= 2 else ""
    if kind == "c" and len(torch_handle) == CUDA_IPC_HANDLE_BYTES + 2:
        return torch_handle[2:]
    if kind == "e":
        raise _invalid("buffer: the torch CUDA tensor lives in an expandable segment "
                       "(PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True), which has no CUDA IPC "
                       "handle; lend a tensor allocated with expandable_segments:False")
    raise _invalid(f"buffer: torch's CUDA sharing handle has an unknown layout "
                   f"({len(torch_handle)} bytes, type byte {kind!r})")


def _shared_or_plain(lent):
    found = SHARED.find(lent.address, lent.nbytes) if lent.nbytes else None
    if found is not None:
        lent.memory = "shared"
        lent.fd, lent.offset = found


def _torch_of(buf):
    module = type(buf).__module__
    if not module.startswith("torch"):
        return None
    import torch  # pylint: disable=import-outside-toplevel
    return torch if isinstance(buf, torch.Tensor) else None
