"""Attached tensors end to end: a real coordinator and four Gloo workers, and user processes
(NumPy and torch, shared and plain memory) that lend their buffers and check the values in
their own memory.

    attach_test.py --coordinator PATH --worker PATH [unittest args]
"""

import os
import subprocess
import sys
import unittest

import numpy as np
import shardcoord
from shardcoord import pb
from shardcoord._local import LocalConnection

from cluster import Cluster, UserProcess, parse_test_args

ARGS = None
MIB = 1 << 20


def huge_pages_free():
    with open("/proc/meminfo", encoding="ascii") as f:
        for line in f:
            if line.startswith("HugePages_Free:"):
                return int(line.split()[1])
    return 0


class AttachTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        # A long heartbeat timeout: one test pauses a worker for a moment.
        cls.cluster = Cluster(ARGS.coordinator, ARGS.worker, workers=4,
                              coordinator_flags=["--heartbeat-timeout=60s"])
        cls.c = shardcoord.connect(cls.cluster.address)
        workers = cls.c.workers()
        cls.ranks = [w.rank for w in workers]
        cls.pid_of_rank = {w.rank: cls.cluster.worker_pid(int(w.name[1:])) for w in workers}
        cls.c.create_mesh("m4", [4], workers=[w.name for w in workers])
        cls.c.create_mesh("m2", [2], workers=[w.name for w in workers[2:]])
        cls.m2 = cls.ranks[2:]
        # One user process per rank: NumPy for the first two, torch for the others.
        cls.users = {}
        for i, r in enumerate(cls.ranks):
            cls.users[r] = UserProcess(cls.cluster.address, f"user{r}", torch=i >= 2)

    @classmethod
    def tearDownClass(cls):
        for u in cls.users.values():
            u.close()
        cls.c.close()
        cls.cluster.stop()

    FRAMEWORK = ("numpy", "numpy", "torch", "torch")
    MEMORY = ("shared", "plain", "shared", "plain")

    def attach_all(self, tensor, ranks, scale, users=None, memory=None):
        """Every rank of `tensor` lent by its user process; returns the last readable flag."""
        readable = False
        for i, r in enumerate(ranks):
            user = (users or self.users)[r]
            a = user.call(op="attach", tensor=tensor, rank=r, scale=scale,
                          framework=self.FRAMEWORK[self.ranks.index(r)],
                          memory=memory or self.MEMORY[i % 4])
            self.assertNotIn("code", a, a)
            readable = a["readable"]
        return readable

    def check(self, tensor, ranks, scale, users=None):
        for r in ranks:
            got = (users or self.users)[r].call(op="check", tensor=tensor, rank=r, scale=scale)
            self.assertEqual(got["mismatches"], 0, f"{tensor} rank {r}: {got}")

    def assert_arange(self, tensor, scale=1):
        a = self.c.download(tensor)
        expected = (np.arange(a.size, dtype=np.int64) * scale).astype(a.dtype).reshape(a.shape)
        self.assertTrue((a == expected).all(), f"{tensor} downloaded wrong values")

    def test_copy_into_attached_tensors_of_every_layout_kind(self):
        self.c.create_tensor("src", shape=[64, 48], mesh="m4", placements="S(0)", init="attached")
        self.assertFalse(self.attach_all("src", self.ranks[:3], 1))
        self.assertTrue(self.attach_all("src", self.ranks[3:], 1, memory="plain"))
        info = self.c.tensor("src")
        self.assertTrue(info.attached)
        self.assertEqual(list(info.unattached_ranks), [])
        dsts = {
            "cross": ("m2", {"placements": "S(1)"}, self.m2),               # Another mesh.
            "uneven": ("m4", {"placements": "S(0,[10,30,0,24])"}, self.ranks),  # An empty rank.
            "flat": ("m4", {"flat": [[(0, 1000)], [(1000, 1500), (2000, 3072)], [(1500, 2000)],
                                     []]}, self.ranks),
        }
        for name, (mesh, layout, ranks) in dsts.items():
            self.c.create_tensor(name, shape=[64, 48], mesh=mesh, init="attached", **layout)
            self.assertTrue(self.attach_all(name, ranks, 0))
            response = self.c.copy("src", name)
            self.assertEqual(response.progress.state, pb.COMMITTED)
            self.assertEqual(self.c.tensor(name).version, response.dst_version)
            self.check(name, ranks, 1)   # Written in place, in each process's own memory.
            self.assert_arange(name)     # And readable through the cluster.
            self.assertTrue(self.c.tensor(name).attached)
        self.check("src", self.ranks, 1)  # Only read.

        # The sources change in place (an optimizer step); one group copies them again.
        for r in self.ranks:
            self.users[r].call(op="fill", tensor="src", rank=r, scale=3)
        group = self.c.copy_many([("src", "cross")])
        self.assertEqual(group.state, pb.COMMITTED)
        self.check("cross", self.m2, 3)
        self.check("uneven", self.ranks, 1)  # Not in the group.

    def test_big_shared_buffers_take_reserved_huge_pages(self):
        """alloc() lends a buffer of a huge page or more from a hugetlbfs memfd where the
        host reserved huge pages (workers write it as fast as their own memory), an ordinary
        memfd elsewhere; either way a copy lands in place. Skips the first where none are
        free."""
        free = huge_pages_free()
        self.c.create_tensor("hsrc", shape=[2048, 1024], mesh="m4", placements="S(1)",
                             init="arange")
        self.c.create_tensor("huge", shape=[2048, 1024], mesh="m4", placements="S(0)",
                             init="attached")  # 2 MiB per rank: one huge page.
        huge = []
        for r in self.ranks:
            a = self.users[r].call(op="attach", tensor="huge", rank=r, scale=0,
                                   framework=self.FRAMEWORK[self.ranks.index(r)],
                                   memory="shared")
            self.assertNotIn("code", a, a)
            huge.append(a["huge_pages"])
        self.assertEqual(self.c.copy("hsrc", "huge").progress.state, pb.COMMITTED)
        self.check("huge", self.ranks, 1)
        if free < len(self.ranks):
            self.assertEqual(huge, [False] * len(self.ranks))
            self.skipTest(f"HugePages_Free is {free} (vm.nr_hugepages): ordinary memfds used")
        self.assertEqual(huge, [True] * len(self.ranks))

    def test_wrong_buffers_and_strangers_are_refused_before_anything_is_registered(self):
        self.c.create_tensor("ref", shape=[8, 8], mesh="m4", placements="S(0)", init="attached")
        r = self.ranks[0]
        for kind in ("short", "dtype", "strided"):
            with self.subTest(kind):
                got = self.users[r].call(op="attach_bad", tensor="ref", rank=r, kind=kind)
                self.assertEqual(got.get("code"), "INVALID_ARGUMENT", got)
        # Past the client's own checks, the worker refuses a wrong size itself.
        info = self.c.tensor("ref")
        worker = next(w for w in self.c.workers() if w.rank == r)
        conn = LocalConnection(worker.local_socket)
        rc = next(x for x in info.layout.ranks if x.rank == r)
        request = pb.LocalAttachRequest(tensor="ref", rank=r, version=info.version,
                                        dtype=info.dtype, chunks=rc, bytes=4)
        request.process.address = 4096
        with self.assertRaises(shardcoord.Error) as e:
            conn.request(pb.LocalRequest(attach=request))
        conn.close()
        self.assertEqual(e.exception.code, "INVALID_ARGUMENT")
        self.assertIn("bytes: the buffer has 4 bytes", e.exception.message)
        # Another uid: refused at the socket (SO_PEERCRED).
        if os.geteuid() == 0:
            os.chmod(self.cluster.dir, 0o755)
            os.chmod(worker.local_socket, 0o666)
            stranger = subprocess.run(
                ["/usr/bin/python3", "-c", STRANGER, worker.local_socket], user=65534,
                group=65534, capture_output=True, text=True, timeout=60, check=False)
            os.chmod(worker.local_socket, 0o600)
            self.assertEqual(stranger.returncode, 0, stranger.stdout + stranger.stderr)
            self.assertIn("uid 65534", stranger.stdout)
        self.assertEqual(sorted(self.c.tensor("ref").unattached_ranks), sorted(self.ranks))
        # The same buffers, right this time, are taken.
        self.assertTrue(self.attach_all("ref", self.ranks, 1))

    def test_a_user_process_killed_mid_copy_changes_nothing_and_the_cluster_goes_on(self):
        self.c.create_tensor("ksrc", shape=[256, 256], mesh="m4", placements="S(0)",
                             init="attached")
        self.attach_all("ksrc", self.ranks, 1)
        self.c.create_tensor("kdst", shape=[256, 256], mesh="m2", placements="S(1)",
                             init="attached")
        doomed = {r: UserProcess(self.cluster.address, f"doomed{r}") for r in self.m2}
        try:
            self.attach_all("kdst", self.m2, 0, users=doomed, memory="shared")
            version = self.c.tensor("kdst").version
            # A source rank's worker is paused, so the copy cannot end before the kill.
            paused = self.pid_of_rank[self.ranks[0]]
            os.kill(paused, 19)  # SIGSTOP
            try:
                started = self.c._mutate(  # pylint: disable=protected-access
                    self.c._stub.Copy, pb.CopyRequest(src="ksrc", dst="kdst", wait=False),
                    self.c.timeout)
                victim = self.m2[1]
                doomed[victim].kill()
                final = None
                for p in self.c._stub.WatchPlan(  # pylint: disable=protected-access
                        pb.WatchPlanRequest(plan_id=started.progress.plan_id), timeout=60):
                    final = p
            finally:
                os.kill(paused, 18)  # SIGCONT
            self.assertEqual(final.state, pb.ABORTED)
            self.assertIn(f"rank {victim}'s buffer of 'kdst'", final.error)
            self.assertIn("detached", final.error)
            after = self.c.tensor("kdst")
            self.assertEqual(after.version, version)          # Committed version unchanged.
            self.assertEqual(list(after.unattached_ranks), [victim])
            self.check("ksrc", self.ranks, 1)                 # Source untouched.
            # The cluster goes on: a new process lends the rank, and the copy runs.
            doomed[victim] = UserProcess(self.cluster.address, "reborn")
            self.assertTrue(self.attach_all("kdst", [victim], 0, users=doomed, memory="shared"))
            self.assertEqual(self.c.copy("ksrc", "kdst").progress.state, pb.COMMITTED)
            self.check("kdst", self.m2, 1, users=doomed)
        finally:
            for u in doomed.values():
                u.close()

    def test_a_process_that_exits_detaches_its_ranks(self):
        self.c.create_tensor("ex", shape=[8, 8], mesh="m2", placements="S(0)", init="attached")
        short = {r: UserProcess(self.cluster.address, f"short{r}") for r in self.m2}
        try:
            self.attach_all("ex", self.m2, 1, users=short, memory="plain")
            self.assert_arange("ex")
            gone = self.m2[0]
            short[gone].close()  # Its client detaches on the way out, and waits for that.
            self.assertEqual(list(self.c.tensor("ex").unattached_ranks), [gone])
            with self.assertRaises(shardcoord.Error) as e:
                self.c.download("ex")
            self.assertEqual(e.exception.code, "FAILED_PRECONDITION")
            self.assertIn("no buffer attached", e.exception.message)
        finally:
            for u in short.values():
                u.close()

    def test_redistribute_moves_an_attached_tensor_into_worker_buffers(self):
        self.c.create_tensor("mv", shape=[16, 8], mesh="m4", placements="S(0)", init="attached")
        self.attach_all("mv", self.ranks, 1)
        self.c.redistribute("mv", placements="S(1)")
        self.assertFalse(self.c.tensor("mv").attached)
        for r in self.ranks:  # The processes' buffers are theirs again.
            self.users[r].call(op="fill", tensor="mv", rank=r, scale=5)
        self.assert_arange("mv", 1)

    def test_256_mib_between_attached_tensors_pass_no_byte_through_the_coordinator(self):
        shape = [8192, 8192]  # i32: 256 MiB.
        self.c.create_tensor("big", shape=shape, dtype="i32", mesh="m4", placements="S(0)",
                             init="attached")
        self.c.create_tensor("big_dst", shape=shape, dtype="i32", mesh="m2", placements="S(1)",
                             init="attached")
        try:
            self.attach_all("big", self.ranks, 1, memory="shared")
            self.attach_all("big_dst", self.m2, 0, memory="shared")
            rpc_before = self.cluster.metric("shardcoord_rpc_message_bytes_total")
            moved_before = self.cluster.metric("shardcoord_plan_bytes_moved_total")
            self.assertEqual(self.c.copy("big", "big_dst").progress.state, pb.COMMITTED)
            rpc = self.cluster.metric("shardcoord_rpc_message_bytes_total") - rpc_before
            moved = self.cluster.metric("shardcoord_plan_bytes_moved_total") - moved_before
            print(f"256 MiB copy: {moved / MIB:.0f} MiB moved between workers, "
                  f"{rpc / 1024:.1f} KiB of gRPC messages through the coordinator",
                  file=sys.stderr)
            self.assertGreaterEqual(moved, 128 * MIB)
            self.assertLess(rpc, 1 * MIB)
            self.check("big_dst", self.m2, 1)
        finally:
            for name, ranks in (("big", self.ranks), ("big_dst", self.m2)):
                for r in ranks:
                    self.users[r].call(op="detach", tensor=name, rank=r)
                self.c.delete_tensor(name)


# Connects as another uid and prints the worker's answer: it refuses at accept, before
# reading anything (a LocalResponse: field 1 the code, field 2 the message).
STRANGER = r"""
import socket, struct, sys
s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
s.connect(sys.argv[1])
data = b""
while len(data) < 4 or len(data) < 4 + struct.unpack("<I", data[:4])[0]:
    chunk = s.recv(4096)
    if not chunk:
        break
    data += chunk
payload = data[4:]
print(payload[2:].decode(errors="replace"))
sys.exit(0 if payload[:2] == b"\x08\x07" else 1)
"""


if __name__ == "__main__":
    ARGS, argv = parse_test_args()
    unittest.main(argv=argv)
