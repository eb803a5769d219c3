"""Tests `python -m shardcoord.check` against a real coordinator and two workers on loopback:
SERVING with the workers listed (exit 0), --workers asking for more than are alive (exit 3),
--json, and after the coordinator stops: unreachable, exit 1.

Arguments: --coordinator=PATH --worker=PATH --cluster=PATH (tests/python/cluster.py)."""

import importlib.util
import json
import subprocess
import sys
import unittest

ARGS = {}


def check(*args):
    # The installed package (the test runs from outside the checkout).
    return subprocess.run([sys.executable, "-m", "shardcoord.check", *args],
                          capture_output=True, text=True, timeout=60, check=False, cwd="/")


class CheckTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        spec = importlib.util.spec_from_file_location("cluster", ARGS["cluster"])
        cluster = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(cluster)
        cls.cluster = cluster.Cluster(ARGS["coordinator"], ARGS["worker"], workers=2)

    @classmethod
    def tearDownClass(cls):
        cls.cluster.stop()

    def test_1_serving_cluster(self):
        address = self.cluster.address
        r = check(address)
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        lines = r.stdout.splitlines()
        self.assertEqual(lines[0], f"coordinator {address}: SERVING (liveness SERVING)")
        self.assertEqual(lines[1], "workers: 2 alive of 2")
        # In rank order; which worker got which rank depends on who registered first.
        self.assertRegex(lines[2], r"^  w[01]  rank 0  ALIVE  cpu  gloo  ")
        self.assertRegex(lines[3], r"^  w[01]  rank 1  ALIVE  cpu  gloo  ")
        self.assertEqual({lines[2].split()[0], lines[3].split()[0]}, {"w0", "w1"})

        r = check(address, "--workers", "3")
        self.assertEqual(r.returncode, 3, r.stdout + r.stderr)
        r = check(address, "--workers", "2", "--json")
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        result = json.loads(r.stdout)
        self.assertTrue(result["serving"])
        self.assertEqual(sorted((w["name"], w["state"]) for w in result["workers"]),
                         [("w0", "ALIVE"), ("w1", "ALIVE")])

    def test_2_bad_arguments(self):
        r = check(self.cluster.address, "--timeout", "0")
        self.assertEqual(r.returncode, 2, r.stdout + r.stderr)
        r = check(self.cluster.address, "--tls-ca", "/nonexistent/ca.pem")
        self.assertEqual(r.returncode, 2, r.stdout + r.stderr)
        self.assertIn("tls_ca", r.stderr)

    def test_3_coordinator_gone(self):
        address = self.cluster.address
        self.cluster.coordinator.stop()
        r = check(address, "--timeout", "2")
        self.assertEqual(r.returncode, 1, r.stdout + r.stderr)
        self.assertRegex(r.stdout, rf"coordinator {address}: UNREACHABLE: UNAVAILABLE")
        self.assertIn("workers: unknown (no coordinator is SERVING)", r.stdout)


if __name__ == "__main__":
    for arg in list(sys.argv[1:]):
        if arg.startswith("--") and "=" in arg and arg[2:].split("=")[0] in (
                "coordinator", "worker", "cluster"):
            key, value = arg[2:].split("=", 1)
            ARGS[key] = value
            sys.argv.remove(arg)
    unittest.main(verbosity=2)
