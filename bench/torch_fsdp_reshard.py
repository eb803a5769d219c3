"""FSDP flat shards to Megatron tensor-parallel shards the way FSDP users do it today, with
torch.distributed (Gloo) in N local processes: all-gather the flat shards into the whole flat
parameter, then every rank copies its Megatron shard of every parameter out of it into its
own pre-allocated tensors. The peer baseline of //bench:model_bench. Run with /usr/bin/python3
(Debian's python3-torch).

    torch_fsdp_reshard.py --workload FILE [--size 4] [--tp 2] [--iters 5] [--warmup 1]

FILE has one parameter per line, in state-dict order: `name dims placements`, e.g.
`model.layers.0.mlp.down_proj.weight 1024x2816 R,S(1)` (placements on the (dp, tp) mesh:
R,S(0) rows split over tp, R,S(1) columns, R,R replicated). Rank r sits at mesh position
(r // tp, r % tp). Elements are 2 bytes (bf16), held as int16 so values compare exactly, and
moved as float16 (Gloo has neither int16 nor bf16 in torch 1.13; an all-gather only copies).
Prints one JSON line from rank 0: {"torch": "1.13.0", "size": 4, "setup_seconds": ..,
"bytes": .., "seconds": [..]} where bytes is what each rank receives in the all-gather,
summed. Exits 3 (and says why on stderr) when torch is missing.
"""

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from torch_ranks import (  # noqa: E402  pylint: disable=wrong-import-position
    gloo_available, run_and_print)

MODULUS = 32749  # Element i of the flat parameter holds i % MODULUS (an int16).


def read_workload(path):
    params = []
    with open(path, encoding="utf-8") as f:
        for line in f:
            if not line.strip():
                continue
            name, dims, placements = line.split()
            params.append((name, [int(d) for d in dims.split("x")], placements))
    return params


def pattern(torch, start, end):
    return (torch.arange(start, end, dtype=torch.int64) % MODULUS).to(torch.int16)


def run_rank(rank, size, store_path, tp, params, iters, warmup, queue):
    import torch
    import torch.distributed as dist

    # One thread per rank, as the raw Gloo baseline and e2e_bench's torch peer.
    torch.set_num_threads(1)
    numels = []
    for _, shape, _ in params:
        n = 1
        for d in shape:
            n *= d
        numels.append(n)
    total = sum(numels)
    per_rank = (total + size - 1) // size  # Padded at the end, as FSDP pads its flat param.
    local = torch.zeros(per_rank, dtype=torch.int16)
    start, end = rank * per_rank, min(total, (rank + 1) * per_rank)
    if start < end:
        local[: end - start] = pattern(torch, start, end)
    full = torch.empty(per_rank * size, dtype=torch.int16)
    gathered = list(full.split(per_rank))
    tp_index = rank % tp

    # Each rank's Megatron shard of every parameter, allocated once (as an inference
    # engine's weights are), and the views of the gathered flat parameter they come from.
    views, dsts = [], []
    offset = 0
    for (_, shape, placements), n in zip(params, numels):
        whole = full[offset:offset + n].view(shape)
        offset += n
        split = placements.split(",")[-1]
        if split == "S(0)":
            view = whole.chunk(tp, dim=0)[tp_index]
        elif split == "S(1)":
            view = whole.chunk(tp, dim=1)[tp_index]
        elif split == "R":
            view = whole
        else:
            raise ValueError(f"placements {placements}: want R,S(0), R,S(1) or R,R")
        views.append(view)
        dsts.append(torch.empty(view.shape, dtype=torch.int16))

    setup_start = time.perf_counter()
    dist.init_process_group("gloo", init_method="file://" + store_path, rank=rank,
                            world_size=size)
    dist.barrier()  # Connections are made lazily; count them as setup.
    setup_seconds = time.perf_counter() - setup_start

    # Gloo has no int16 (nor bf16 in torch 1.13): the all-gather moves the same 2-byte
    # elements as float16, which it only copies.
    gathered_f16 = [g.view(torch.float16) for g in gathered]
    local_f16 = local.view(torch.float16)

    def reshard():
        dist.all_gather(gathered_f16, local_f16)
        for view, dst in zip(views, dsts):
            dst.copy_(view)

    for _ in range(warmup):
        dist.barrier()
        reshard()
    seconds = []
    for _ in range(iters):
        dist.barrier()
        t0 = time.perf_counter()
        reshard()
        dist.barrier()
        seconds.append(time.perf_counter() - t0)
    # Every value: the gathered parameter is the pattern, and each shard its slice of it.
    step = 1 << 24
    for s in range(0, total, step):
        e = min(total, s + step)
        if not torch.equal(full[s:e], pattern(torch, s, e)):
            raise RuntimeError(f"rank {rank}: gathered elements [{s}, {e}) are wrong")
    for view, dst in zip(views, dsts):
        if not torch.equal(view, dst):
            raise RuntimeError(f"rank {rank}: a Megatron shard differs from its slice")
    if rank == 0:
        queue.put({"torch": torch.__version__, "size": size, "setup_seconds": setup_seconds,
                   "bytes": 2 * per_rank * size * (size - 1), "seconds": seconds})
    dist.destroy_process_group()


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workload", required=True)
    parser.add_argument("--size", type=int, default=4)
    parser.add_argument("--tp", type=int, default=2)
    parser.add_argument("--iters", type=int, default=5)
    parser.add_argument("--warmup", type=int, default=1)
    args = parser.parse_args()
    if not gloo_available("torch_fsdp_reshard"):
        return 3
    params = read_workload(args.workload)

    return run_and_print("torch_fsdp_reshard", args.size, run_rank, (args.tp, params, args.iters, args.warmup))


if __name__ == "__main__":
    sys.exit(main())
