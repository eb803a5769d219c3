"""A real attach on a GPU (tests/gpu/check.sh runs it where a GPU is lent): a coordinator and
one NCCL worker on GPU 0; this process lends torch CUDA tensors (CUDA IPC handles the worker
opens on its GPU) and checks, on the GPU, that a Copy wrote them in place and that a Copy out
of them read them in place.

    attach_check.py --coordinator BIN --worker BIN
"""

import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"))

import numpy as np  # noqa: E402
import shardcoord  # noqa: E402
import torch  # noqa: E402

from cluster import Cluster, binaries_parser  # noqa: E402  pylint: disable=wrong-import-position


def main():
    parser = binaries_parser()
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print("attach_check: torch sees no CUDA device", file=sys.stderr)
        return 2
    with Cluster(args.coordinator, args.worker, workers=1, backend="nccl",
                 worker_flags=["--device=0"]) as cluster:
        c = shardcoord.connect(cluster.address)
        worker = c.workers()[0]
        assert worker.device.startswith("cuda"), worker
        c.create_mesh("g", [1])
        shape = [1024, 768]
        n = shape[0] * shape[1]
        c.create_tensor("src", shape=shape, mesh="g", placements="R", init="arange")
        c.create_tensor("dst", shape=shape, mesh="g", placements="R", init="attached")
        # A slice of a bigger allocation: the offset inside the IPC allocation matters.
        block = torch.full((n + 4096,), -1.0, device="cuda:0")
        dst = block[4096:].view(shape)
        assert c.attach("dst", worker.rank, dst)
        c.copy("src", "dst")
        torch.cuda.synchronize()
        want = torch.arange(n, dtype=torch.float32, device="cuda:0").view(shape)
        assert torch.equal(dst, want), "the copy did not land in the lent CUDA tensor"
        assert torch.equal(block[:4096], torch.full((4096,), -1.0, device="cuda:0")), \
            "the copy wrote outside the lent range"
        # Read in place: change the lent tensor on the GPU, copy it out, download it.
        dst.mul_(2)
        torch.cuda.synchronize()
        c.create_tensor("out", shape=shape, mesh="g", placements="R", init="zeros")
        c.copy("dst", "out")
        got = c.download("out")
        assert np.array_equal(got, (np.arange(n, dtype=np.float32) * 2).reshape(shape))
        # A CPU buffer on a GPU worker is refused before anything is registered.
        try:
            c.attach("dst", worker.rank, np.zeros(shape, np.float32))
            raise AssertionError("a CPU buffer was accepted by a GPU worker")
        except shardcoord.Error as e:
            assert e.code == "INVALID_ARGUMENT", e
        print("attach_check: OK (a CUDA tensor lent through an IPC handle was written and read "
              "in place)")
        return 0


if __name__ == "__main__":
    sys.exit(main())
