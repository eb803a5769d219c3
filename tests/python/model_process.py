"""A process of a trainer or an inference engine for lend_test: lends its local tensors of a
whole synthetic model (lend) or receives one (receive) through the workers of the cluster at
$SHARDCOORD_ADDR, and checks what was written into its own memory. One JSON command per line
on stdin, one JSON answer per line on stdout:

  {"op": "lend", "model": PATH, "rank": r, "world": w, "framework": "numpy"|"torch",
   "shared_every": k}     every tensor's rank-r FSDP-flat shard (layouts.fsdp_flat, computed
                          here: nothing is looked up), filled with its values; every k-th
                          non-empty one in shared memory (0: none). Answers lent, readable,
                          nonempty, shared.
  {"op": "allocate", "prefix": P, "rank": r, "framework": ..., "shared_every": k}
                          zeroed local buffers of every tensor named P + name (their
                          layouts from one paged listing), every k-th in shared memory.
  {"op": "receive", "rank": r}   the allocated buffers received. Answers received.
  {"op": "check", "model": PATH}   elements of the received buffers that differ from their
                          values (answers mismatches, elements).
  {"op": "exit"}

A tensor's values: element j (flat, row-major) of the model's k-th tensor is k * 1009 + j, so
any process computes any layout's values on its own. Errors of the package come back as
{"code", "message", "member"}.
"""

import json
import os

import numpy as np

import shardcoord
from shardcoord import _buffers, layouts

from cluster import local_flat_indices, serve_commands


def load_model(path):
    """[(name, shape)] in the model's order."""
    with open(path, encoding="utf-8") as f:
        return [(name, tuple(shape)) for name, shape in json.load(f)]


def values(k, start, end):
    return (k * 1009 + np.arange(start, end, dtype=np.int64)).astype(np.float32)


def chunk_values(k, shape, rc):
    """Rank chunks `rc` (a RankChunks) of tensor k of `shape` as its local buffer lays them
    out: each chunk's box row-major from its local_offset."""
    out = np.zeros(rc.local_elements, dtype=np.float32)
    for at, flat in local_flat_indices(shape, rc):
        out[at:at + flat.size] = (k * 1009 + flat).astype(np.float32)
    return out


class Process:
    def __init__(self):
        self.client = shardcoord.connect()
        self.buffers = {}    # name -> the lent or received buffer
        self.received = {}   # name -> (shape, RankChunks)
        self.to_receive = {}  # name -> buffer, allocated for receive

    def _buffer(self, n, framework, shared):
        if shared:
            return _buffers.alloc_shared(n * 4, "f32", (n,), framework)
        if framework == "torch":
            import torch  # pylint: disable=import-outside-toplevel
            return torch.zeros(n, dtype=torch.float32)
        return np.zeros(n, dtype=np.float32)

    def lend(self, model, rank, world, framework, shared_every):
        shapes = load_model(model)
        texts = layouts.fsdp_flat([s for _, s in shapes], world)
        state, nonempty, shared = {}, 0, 0
        for k, ((name, _), text) in enumerate(zip(shapes, texts)):
            ranges = [r for r in text.split(";")[rank].split(",") if r]
            parts = [values(k, *map(int, r.split(":"))) for r in ranges]
            local = np.concatenate(parts) if parts else np.zeros(0, dtype=np.float32)
            use_shared = bool(local.size and shared_every and nonempty % shared_every == 0)
            nonempty += 1 if local.size else 0
            shared += 1 if use_shared else 0
            buf = self._buffer(local.size, framework, use_shared)
            view = buf if isinstance(buf, np.ndarray) else buf.numpy()
            view[:] = local
            state[name] = buf
        readable = self.client.lend(rank, state)
        self.buffers.update(state)
        return {"lent": len(readable), "readable": sum(readable.values()), "nonempty": nonempty,
                "shared": shared}

    def allocate(self, prefix, rank, framework, shared_every=0):
        infos = self.client.tensors(prefix=prefix)
        self.to_receive = {}
        for i, info in enumerate(infos):
            rc = next(r for r in info.layout.ranks if r.rank == rank)
            use_shared = bool(shared_every and rc.local_elements and i % shared_every == 0)
            self.to_receive[info.name] = self._buffer(rc.local_elements, framework, use_shared)
            self.received[info.name] = (tuple(info.shape), rc)
        return {"allocated": len(self.to_receive)}

    def receive(self, rank):
        readable = self.client.receive(rank, self.to_receive)
        self.buffers.update(self.to_receive)
        return {"received": len(readable), "readable": sum(readable.values())}

    def check(self, model, prefix):
        index = {prefix + name: k for k, (name, _) in enumerate(load_model(model))}
        mismatches, elements = 0, 0
        for name, (shape, rc) in self.received.items():
            buf = self.buffers[name]
            got = buf if isinstance(buf, np.ndarray) else buf.numpy()
            want = chunk_values(index[name], shape, rc)
            mismatches += int(np.count_nonzero(got.reshape(-1) != want))
            elements += int(want.size)
        return {"mismatches": mismatches, "elements": elements}


def main():
    if serve_commands(Process(),
                      lambda e: {"code": e.code, "message": e.message, "member": e.member}):
        # No detach one by one: the connections close with the process, and the workers
        # detach what was lent through them.
        print(json.dumps({}), flush=True)
        os._exit(0)  # pylint: disable=protected-access


if __name__ == "__main__":
    main()
