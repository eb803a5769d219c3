"""The torch recipe checkpoint_bench compares against: what an FSDP job does today to save its
flat shards and load them into Megatron tensor parallelism.

Four processes (one per rank). Save: each rank torch.save()s a dict of its FSDP flat shards
(one 1-d tensor per parameter piece it holds) into its own file and fsyncs it. Load: each rank
torch.load()s every rank's file, rebuilds each full parameter by concatenating the pieces in
rank order, and keeps (a contiguous copy of) its Megatron shard. Both are timed from a barrier
all ranks pass before the work to one all pass after it. Between the two, every rank evicts
its file from the page cache (posix_fadvise DONTNEED after fsync, as for shardcoord's files).

    torch_checkpoint.py --layout FILE --dir DIR [--reps N]

FILE: {"ranks": 4, "tp": 2, "tensors": [{"name": ..., "shape": [...], "flat": [[a, b] or
null per rank], "megatron": "R,S(0)"}]}. Prints one JSON line {"save_seconds": [...],
"load_seconds": [...], "bytes": N, "bytes_read": N}. Exit status 3: no torch here.
"""

import argparse
import json
import multiprocessing as mp
import os
import sys
import time

try:
    import torch
except ImportError:
    sys.exit(3)


def evict(path):
    fd = os.open(path, os.O_RDONLY)
    try:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def megatron_shard(full, placements, rank, tp):
    t = rank % tp
    if placements == "R,S(0)":
        return full.chunk(tp, dim=0)[t].clone()
    if placements == "R,S(1)":
        return full.chunk(tp, dim=1)[t].clone()
    return full.clone()


def rank_main(rank, layout, directory, reps, barrier, out):
    torch.set_num_threads(1)
    ranks, tp = layout["ranks"], layout["tp"]
    gen = torch.Generator().manual_seed(rank)
    shards = {}
    for t in layout["tensors"]:
        r = t["flat"][rank]
        if r is not None:
            bits = torch.randint(-32768, 32767, (r[1] - r[0],), dtype=torch.int16, generator=gen)
            shards[t["name"]] = bits.view(torch.bfloat16)
    paths = [os.path.join(directory, f"rank{r}.pt") for r in range(ranks)]
    save, load = [], []
    read = 0
    for _ in range(reps):
        barrier.wait()
        t0 = time.perf_counter()
        with open(paths[rank], "wb") as f:
            torch.save(shards, f)
            f.flush()
            os.fsync(f.fileno())
        barrier.wait()
        save.append(time.perf_counter() - t0)
        evict(paths[rank])
        barrier.wait()
        t0 = time.perf_counter()
        loaded = [torch.load(p) for p in paths]
        mine = {}
        for t in layout["tensors"]:
            pieces = [d[t["name"]] for d in loaded if t["name"] in d]
            full = torch.cat(pieces).view(*t["shape"])
            mine[t["name"]] = megatron_shard(full, t["megatron"], rank, tp)
        barrier.wait()
        load.append(time.perf_counter() - t0)
        read = sum(os.path.getsize(p) for p in paths)
        del loaded, mine
        barrier.wait()
        if rank == 0:
            for p in paths:
                os.remove(p)
    if rank == 0:
        out.put({"save_seconds": save, "load_seconds": load, "bytes_read": read})


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--layout", required=True)
    parser.add_argument("--dir", required=True)
    parser.add_argument("--reps", type=int, default=5)
    args = parser.parse_args()
    with open(args.layout) as f:
        layout = json.load(f)
    os.makedirs(args.dir, exist_ok=True)
    ctx = mp.get_context("fork")
    barrier = ctx.Barrier(layout["ranks"])
    out = ctx.Queue()
    procs = [ctx.Process(target=rank_main, args=(r, layout, args.dir, args.reps, barrier, out))
             for r in range(layout["ranks"])]
    for p in procs:
        p.start()
    result = out.get()
    for p in procs:
        p.join()
        if p.exitcode != 0:
            sys.exit(f"rank process exited with {p.exitcode}")
    result["bytes"] = sum(2 * max(0, (r[1] - r[0]) if r else 0)
                          for t in layout["tensors"] for r in t["flat"])
    print(json.dumps(result))


if __name__ == "__main__":
    main()
