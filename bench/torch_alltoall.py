"""torch.distributed (Gloo) all_to_all_single between N local processes: a peer baseline for
//bench:e2e_bench. Run with /usr/bin/python3 (Debian's python3-torch).

    torch_alltoall.py --size 4 --matrix 0,16,16,16,... [--iters 5] [--warmup 1]

--matrix is size*size byte counts, row-major: entry [i*size+j] is what rank i sends to rank j.
Prints one JSON line from rank 0: {"torch": "1.13.0", "size": 4, "setup_seconds": ..,
"bytes": .., "seconds": [..]}. Exits 3 (and says why on stderr) when torch is missing.
"""

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from torch_ranks import (  # noqa: E402  pylint: disable=wrong-import-position
    gloo_available, run_and_print)


def run_rank(rank, size, store_path, matrix, iters, warmup, queue):
    import torch
    import torch.distributed as dist

    # One thread per rank: the raw Gloo baseline and the workers do not use intra-op threads.
    torch.set_num_threads(1)
    setup_start = time.perf_counter()
    dist.init_process_group("gloo", init_method="file://" + store_path, rank=rank,
                            world_size=size)
    send_counts = [matrix[rank * size + j] for j in range(size)]
    recv_counts = [matrix[j * size + rank] for j in range(size)]
    send = torch.full((sum(send_counts),), rank + 1, dtype=torch.uint8)
    recv = torch.zeros((sum(recv_counts),), dtype=torch.uint8)
    dist.barrier()  # Connections are made lazily; count them as setup.
    setup_seconds = time.perf_counter() - setup_start

    for _ in range(warmup):
        dist.barrier()
        dist.all_to_all_single(recv, send, recv_counts, send_counts)
    seconds = []
    for _ in range(iters):
        dist.barrier()
        start = time.perf_counter()
        dist.all_to_all_single(recv, send, recv_counts, send_counts)
        dist.barrier()
        seconds.append(time.perf_counter() - start)
    offset = 0
    for j in range(size):
        if recv_counts[j] and int(recv[offset]) != j + 1:
            raise RuntimeError(f"rank {rank} received wrong data from rank {j}")
        offset += recv_counts[j]
    if rank == 0:
        moved = sum(matrix[i * size + j] for i in range(size) for j in range(size) if i != j)
        queue.put({"torch": torch.__version__, "size": size,
                   "setup_seconds": setup_seconds, "bytes": moved, "seconds": seconds})
    dist.destroy_process_group()


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", type=int, default=4)
    parser.add_argument("--matrix", required=True)
    parser.add_argument("--iters", type=int, default=5)
    parser.add_argument("--warmup", type=int, default=1)
    args = parser.parse_args()
    if not gloo_available("torch_alltoall"):
        return 3
    matrix = [int(x) for x in args.matrix.split(",")]
    if len(matrix) != args.size * args.size:
        print(f"torch_alltoall: --matrix has {len(matrix)} entries, want {args.size ** 2}",
              file=sys.stderr)
        return 2

    return run_and_print("torch_alltoall", args.size, run_rank, (matrix, args.iters, args.warmup))


if __name__ == "__main__":
    sys.exit(main())
