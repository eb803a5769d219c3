"""Copy groups between attached tensors against the same group between worker-owned tensors,
in one run on one cluster (bench/attach_bench.sh builds and runs it).

A coordinator and four Gloo workers; `--tensors` tensors of `--shape` f32, S(0) on a 4-rank
mesh, copied as one copy_many into tensors laid out S(1) on the same mesh (every rank sends
to every other). Three kinds of the same group:

  own     both sides in the workers' own buffers (the baseline)
  shared  both sides lent by four user processes in shared memory (memfd, used in place)
  plain   both sides lent as plain process memory (process_vm_readv/writev, one copy each way)

Each kind runs --reps times, interleaved; prints best and median seconds, GB/s, the workers'
CPU seconds per group (steadier than wall time on a loaded machine), and each kind's ratio to
`own` (best over best, median over median, CPU over CPU), or one JSON object with --json.

    attach_bench.py --coordinator BIN --worker BIN [--tensors 8] [--shape 2048,2048] [--reps 5]
"""

import argparse
import json
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests",
                                "python"))

import shardcoord  # noqa: E402  pylint: disable=wrong-import-position
from cluster import Cluster, UserProcess  # noqa: E402  pylint: disable=wrong-import-position

KINDS = ("own", "shared", "plain")


def workers_cpu(pids):
    """User + system CPU seconds the processes have used (/proc/PID/stat)."""
    total = 0
    for pid in pids:
        with open(f"/proc/{pid}/stat", encoding="ascii") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        total += int(fields[11]) + int(fields[12])  # utime, stime (fields 14, 15)
    return total / os.sysconf("SC_CLK_TCK")


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--coordinator", required=True)
    parser.add_argument("--worker", required=True)
    parser.add_argument("--tensors", type=int, default=8)
    parser.add_argument("--shape", default="2048,2048")
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    shape = [int(x) for x in args.shape.split(",")]
    log = (lambda *a: print(*a, file=sys.stderr)) if args.json else print

    cluster = Cluster(args.coordinator, args.worker, workers=4)
    users = []
    try:
        c = shardcoord.connect(cluster.address)
        workers = c.workers()
        ranks = [w.rank for w in workers]
        c.create_mesh("m", [4], workers=[w.name for w in workers])
        users = {r: UserProcess(cluster.address, f"user{r}") for r in ranks}
        pairs = {}
        for kind in KINDS:
            pairs[kind] = []
            for i in range(args.tensors):
                src, dst = f"{kind}/src{i}", f"{kind}/dst{i}"
                init = "arange" if kind == "own" else "attached"
                c.create_tensor(src, shape=shape, mesh="m", placements="S(0)", init=init)
                c.create_tensor(dst, shape=shape, mesh="m", placements="S(1)",
                                init="zeros" if kind == "own" else "attached")
                if kind != "own":
                    for name, scale in ((src, 1), (dst, 0)):
                        for r in ranks:
                            a = users[r].call(op="attach", tensor=name, rank=r, scale=scale,
                                              memory=kind)
                            assert "code" not in a, a
                pairs[kind].append((src, dst))
        nbytes = args.tensors * shape[0] * shape[1] * 4
        c.copy_many(pairs["own"])  # Warm: communicators built once per epoch.
        seconds = {k: [] for k in KINDS}
        cpu = {k: [] for k in KINDS}  # The workers' CPU seconds: steadier than wall time.
        pids = [cluster.worker_pid(i) for i in range(4)]
        moved = {}
        for _ in range(args.reps):
            for kind in KINDS:
                c0 = workers_cpu(pids)
                t0 = time.monotonic()
                group = c.copy_many(pairs[kind])
                seconds[kind].append(time.monotonic() - t0)
                cpu[kind].append(workers_cpu(pids) - c0)
                moved[kind] = group.bytes_moved
        # The attached destinations hold the sources' values, in the user processes' memory.
        for kind in KINDS[1:]:
            for _, dst in pairs[kind]:
                for r in ranks:
                    got = users[r].call(op="check", tensor=dst, rank=r, scale=1)
                    assert got["mismatches"] == 0, (kind, dst, r, got)
        out = {"tensors": args.tensors, "shape": shape, "bytes": nbytes, "reps": args.reps,
               "bytes_moved": moved["own"]}
        log(f"copy_many of {args.tensors} tensors {shape} f32 ({nbytes / 2**20:.0f} MiB, "
            f"{moved['own'] / 2**20:.0f} MiB between workers), S(0) -> S(1) on 4 workers, "
            f"{args.reps} reps:")
        base_best, base_median = min(seconds["own"]), statistics.median(seconds["own"])
        for kind in KINDS:
            best, median = min(seconds[kind]), statistics.median(seconds[kind])
            cpu_median = statistics.median(cpu[kind])
            out[kind] = {"best_seconds": best, "median_seconds": median,
                         "best_gbps": moved[kind] / best / 1e9,
                         "ratio_best": base_best / best, "ratio_median": base_median / median,
                         "worker_cpu_seconds_median": cpu_median,
                         "ratio_cpu": statistics.median(cpu["own"]) / cpu_median}
            log(f"  {kind:6s} best {best * 1000:7.1f} ms  median {median * 1000:7.1f} ms  "
                f"{moved[kind] / best / 1e9:5.2f} GB/s  workers' CPU {cpu_median * 1000:6.1f} ms"
                f"  vs own: {base_best / best:.2f}x best, {base_median / median:.2f}x median, "
                f"{out[kind]['ratio_cpu']:.2f}x CPU")
        if args.json:
            print(json.dumps(out))
    finally:
        for u in (users.values() if isinstance(users, dict) else users):
            u.close()
        cluster.stop()


if __name__ == "__main__":
    main()
