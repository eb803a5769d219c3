"""Runs a torch.distributed peer baseline's ranks as spawned local processes and prints rank
0's result (shared by bench/torch_alltoall.py and bench/torch_fsdp_reshard.py)."""

import json
import os
import queue as queue_module
import sys
import tempfile


def gloo_available(name):
    """Whether torch.distributed with its Gloo backend can run here; when not, says why on
    stderr (the peer then exits 3: it cannot run here)."""
    try:
        import torch.distributed as dist  # pylint: disable=import-outside-toplevel
    except ImportError as e:
        print(f"{name}: torch is not available to {sys.executable}: {e}", file=sys.stderr)
        return False
    if not dist.is_available() or not dist.is_gloo_available():
        print(f"{name}: torch.distributed has no Gloo backend", file=sys.stderr)
        return False
    return True


def run_ranks(name, size, run_rank, args):
    """Calls run_rank(rank, size, store_path, *args, queue) in `size` spawned processes, with
    a file store in a temporary directory, and returns what rank 0 puts on the queue. Returns
    None, after saying so on stderr, when a rank fails (a rank that dies never reports: the
    others are killed instead of waited for)."""
    import torch.multiprocessing as mp  # pylint: disable=import-outside-toplevel

    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    with tempfile.TemporaryDirectory(prefix=name) as tmp:
        store_path = os.path.join(tmp, "store")
        procs = [ctx.Process(target=run_rank, args=(r, size, store_path, *args, queue))
                 for r in range(size)]
        for p in procs:
            p.start()
        result = None
        while result is None:
            try:
                result = queue.get(timeout=1.0)
            except queue_module.Empty:
                if any(p.exitcode not in (None, 0) for p in procs):
                    for p in procs:
                        p.kill()
                    break
        for p in procs:
            p.join()
        if result is None or any(p.exitcode != 0 for p in procs):
            print(f"{name}: a rank failed: exit codes {[p.exitcode for p in procs]}",
                  file=sys.stderr)
            return None
    return result


def run_and_print(name, size, run_rank, args):
    """run_ranks, then rank 0's result as one JSON line on stdout; returns the exit status
    (1 when a rank failed)."""
    result = run_ranks(name, size, run_rank, args)
    if result is None:
        return 1
    print(json.dumps(result), flush=True)
    return 0
