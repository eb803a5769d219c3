"""A user process for the attach tests: lends buffers to the workers of the cluster at
$SHARDCOORD_ADDR and checks their values in its own memory. Reads one JSON command per line
on stdin, answers one JSON line on stdout:

  {"op": "attach", "tensor", "rank", "framework": "numpy"|"torch",
   "memory": "shared"|"plain", "scale": k}   lend rank's local buffer, filled with k * index
                                             (answers readable, bytes, huge_pages)
  {"op": "fill", "tensor", "rank", "scale": k}   write k * index into the lent buffer in place
  {"op": "check", "tensor", "rank", "scale": k}  count elements != k * index
  {"op": "attach_bad", "tensor", "rank", "kind": "short"|"dtype"|"strided"}
  {"op": "detach", "tensor", "rank"}
  {"op": "exit"}

Values are k times each element's flat index in the whole tensor, converted to its dtype, so
any layout of the same tensor holds them and every process computes them on its own. Errors
of the package come back as {"code", "message"}.
"""

import json
import mmap
import os
import sys

import numpy as np

import shardcoord
import shardcoord._buffers  # pylint: disable=unused-import (huge_pages looks at its regions)

from cluster import local_flat_indices, serve_commands


def expected(info, rank, scale):
    """Rank `rank`'s local buffer of `info` holding scale * flat index, as a 1-d array."""
    np_dtype = shardcoord.DTYPES[WIRE[info.dtype]][1]
    rc = next(r for r in info.layout.ranks if r.rank == rank)
    out = np.zeros(rc.local_elements, dtype=np_dtype)
    for at, flat in local_flat_indices(list(info.shape), rc):
        out[at:at + flat.size] = (flat * scale).astype(np_dtype)
    return out


WIRE = {enum: name for name, (enum, _, _) in shardcoord.DTYPES.items()}


def flat_view(buf):
    """The buffer's elements as a 1-d NumPy array over the same memory."""
    if isinstance(buf, np.ndarray):
        return buf.reshape(-1)
    return buf.numpy().reshape(-1)


def huge_pages(buf):
    """Whether alloc() put the buffer in a hugetlbfs memfd (its block size is a huge page)."""
    arr = flat_view(buf)
    found = shardcoord._buffers.SHARED.find(  # pylint: disable=protected-access
        arr.__array_interface__["data"][0], arr.nbytes)
    return found is not None and os.fstat(found[0]).st_blksize > mmap.PAGESIZE


class User:
    def __init__(self):
        self.client = shardcoord.connect()
        self.buffers = {}

    def attach(self, tensor, rank, framework="numpy", memory="shared", scale=1):
        info = self.client.tensor(tensor)
        if memory == "shared":
            buf = self.client.alloc(tensor, rank, framework=framework)
        else:
            shape = self.client.local_shape(tensor, rank)
            np_dtype = shardcoord.DTYPES[WIRE[info.dtype]][1]
            buf = np.zeros(shape, dtype=np_dtype)
            if framework == "torch":
                import torch  # pylint: disable=import-outside-toplevel
                buf = torch.zeros(shape, dtype=getattr(torch, shardcoord.DTYPES[WIRE[info.dtype]][2]))
        flat_view(buf)[:] = expected(info, rank, scale)
        readable = self.client.attach(tensor, rank, buf)
        self.buffers[(tensor, rank)] = buf
        return {"readable": readable, "bytes": int(flat_view(buf).nbytes),
                "huge_pages": huge_pages(buf)}

    def fill(self, tensor, rank, scale):
        info = self.client.tensor(tensor)
        flat_view(self.buffers[(tensor, rank)])[:] = expected(info, rank, scale)
        return {}

    def check(self, tensor, rank, scale):
        info = self.client.tensor(tensor)
        got = flat_view(self.buffers[(tensor, rank)])
        return {"mismatches": int(np.count_nonzero(got != expected(info, rank, scale))),
                "total": int(got.size)}

    def attach_bad(self, tensor, rank, kind):
        info = self.client.tensor(tensor)
        shape = self.client.local_shape(tensor, rank)
        n = int(np.prod(shape))
        np_dtype = shardcoord.DTYPES[WIRE[info.dtype]][1]
        if kind == "short":
            buf = np.zeros(n - 1, dtype=np_dtype)
        elif kind == "dtype":
            buf = np.zeros(n, dtype=np.float64 if np_dtype != np.float64 else np.float32)
        else:  # strided: every other element of a twice larger array
            buf = np.zeros(2 * n, dtype=np_dtype)[::2]
        self.client.attach(tensor, rank, buf)
        return {}

    def detach(self, tensor, rank):
        self.client.detach(tensor, rank)
        return {}


def main():
    if "--torch" in sys.argv:
        import torch  # noqa: F401  pylint: disable=import-outside-toplevel,unused-import
    user = User()
    if serve_commands(user, lambda e: {"code": e.code, "message": e.message}):
        user.client.close()
        print(json.dumps({}), flush=True)


if __name__ == "__main__":
    main()
