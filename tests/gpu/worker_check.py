"""A real NCCL worker's data paths on a GPU (tests/gpu/check.sh and the bundle's run.sh run it
where a GPU is lent): a coordinator and one NCCL worker on GPU 0; uploads, creates, a copy
group (a fused plan on device memory, its members' chunk checksums in one launch), a gather
group, a checkpoint saved from device memory and loaded back into it, and downloads, every
value compared with NumPy. One GPU, so every plan has one rank: the device kernels, the
worker's device buffers and checksums run; NCCL transfers between ranks do not.

    worker_check.py --coordinator BIN --worker BIN
"""

import os
import sys
import tempfile

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"))

import numpy as np  # noqa: E402
import shardcoord  # noqa: E402

from cluster import Cluster, binaries_parser  # noqa: E402  pylint: disable=wrong-import-position


def main():
    parser = binaries_parser()
    parser.add_argument("--backend", default="nccl", help="gloo: the same on the CPU")
    args = parser.parse_args()
    rng = np.random.default_rng(7)
    with Cluster(args.coordinator, args.worker, workers=1, backend=args.backend,
                 worker_flags=["--device=0"] if args.backend == "nccl" else []) as cluster:
        c = shardcoord.connect(cluster.address)
        worker = c.workers()[0]
        assert worker.device.startswith("cuda" if args.backend == "nccl" else "cpu"), worker
        c.create_mesh("g", [1])
        # Odd shapes (chunks that are not whole 1 MiB blocks), several dtypes, one tensor of
        # several blocks.
        want = {
            "a": rng.standard_normal((300, 257)).astype(np.float32),
            "b": rng.standard_normal((1000, 333)).astype(np.float64),
            "c": rng.integers(-2**31, 2**31 - 1, (77, 5), dtype=np.int32),
            "d": rng.standard_normal((4096, 129)).astype(np.float16),
            "e": rng.standard_normal((700, 1100)).astype(np.float32),
        }
        for name, values in want.items():
            c.upload(name, values, mesh="g", placements="R")
            c.create_tensor(f"{name}_dst", shape=values.shape,
                            dtype={"float32": "f32", "float64": "f64", "int32": "i32",
                                   "float16": "f16"}[values.dtype.name],
                            mesh="g", placements="R", init="zeros")
        for name, values in want.items():
            assert np.array_equal(c.download(name), values), f"upload/download of {name}"
        group = c.copy_many([(n, f"{n}_dst") for n in want])
        print(f"worker_check: copy group of {len(want)}: {group.bytes_moved} bytes moved, "
              f"{group.seconds:.4f} s")
        for name, values in want.items():
            got = c.download(f"{name}_dst")
            assert np.array_equal(got, values), f"copy group member {name}_dst"
            assert c.tensor(f"{name}_dst").version >= 2, c.tensor(f"{name}_dst")
        c.gather_many(list(want))
        with tempfile.TemporaryDirectory(prefix="sc-ckpt-") as tmp:
            ckpt = os.path.join(tmp, "ckpt")
            saved = c.save_checkpoint(ckpt, list(want))
            loaded = c.load_checkpoint(ckpt, list(want), mesh="g", placements="R", prefix="l_")
            print(f"worker_check: checkpoint saved {saved.bytes} and loaded "
                  f"{loaded.bytes_read} bytes")
            for name, values in want.items():
                assert np.array_equal(c.download(f"l_{name}"), values), f"checkpoint of {name}"
        w = c.workers()[0]
        # The default budget: 80% of the GPU's free memory (of physical memory on the CPU).
        print(f"worker_check: worker on {w.device}, memory budget "
              f"{w.memory_budget_bytes / 2**30:.1f} GiB")
        assert w.memory_budget_bytes > 0, w
        print("worker_check: OK (uploads, a copy group, a gather group and a checkpoint "
              "through an NCCL worker's device memory, every value checked)")
        return 0


if __name__ == "__main__":
    sys.exit(main())
