"""A whole model lent and received (issues 27 item 3, 29 item 2): a 2,000-parameter synthetic
Llama-style model (mixed shapes, some uneven under tensor parallelism; fixed seed) registered
attached in FSDP-flat over four Gloo workers, lent by four trainer processes (one per rank)
with `lend`, then copied as one group into worker-owned tensors of a Megatron TP layout
(checked value by value by download) and into attached TP tensors four engine processes
`receive` (checked in their own memory). `lend`, `receive` and `register` are counted through
the coordinator's RPC metrics: O(1) calls per process whatever the number of tensors.

    lend_test.py --coordinator PATH --worker PATH [unittest args]
"""

import json
import os
import random
import sys
import unittest

import numpy as np
import shardcoord
from shardcoord import pb

from cluster import Cluster, UserProcess, parse_test_args

ARGS = None
PARAMS = 2000
SEED = 29
HEARTBEAT = "shardcoord.v1.CoordinatorWorkers/Heartbeat"


def synthetic_model(count, seed):
    """[(name, shape)] of `count` parameters of a Llama-style model whose layers have mixed
    sizes (some odd: uneven tensor-parallel shards)."""
    rng = random.Random(seed)
    hidden = rng.choice([8, 12, 13, 16])
    vocab = 37
    out = [("model.embed_tokens.weight", (vocab, hidden))]
    layer = 0
    while len(out) < count - 2:
        h = rng.choice([8, 12, 13, 16])
        heads = rng.choice([h, 2 * h - 3])
        kv = rng.choice([4, 5, 6])
        ffn = rng.choice([16, 22, 27])
        p = f"model.layers.{layer}."
        out += [(p + "input_layernorm.weight", (h,)),
                (p + "self_attn.q_proj.weight", (heads, h)),
                (p + "self_attn.q_proj.bias", (heads,)),
                (p + "self_attn.k_proj.weight", (kv, h)),
                (p + "self_attn.v_proj.weight", (kv, h)),
                (p + "self_attn.o_proj.weight", (h, heads)),
                (p + "post_attention_layernorm.weight", (h,)),
                (p + "mlp.gate_proj.weight", (ffn, h)),
                (p + "mlp.up_proj.weight", (ffn, h)),
                (p + "mlp.down_proj.weight", (h, ffn))]
        layer += 1
    out = out[:count - 2]
    out += [("model.norm.weight", (hidden,)), ("lm_head.weight", (vocab, hidden))]
    return out


def rpc_calls(cluster):
    """{method: calls the coordinator answered}, heartbeats left out (workers send them on
    their own clock)."""
    calls = cluster.metric_by("shardcoord_rpcs_total", "method")
    calls.pop(HEARTBEAT, None)
    return calls


def delta(before, after):
    return {m: int(after[m] - before.get(m, 0)) for m in after if after[m] != before.get(m, 0)}


class LendTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.cluster = Cluster(ARGS.coordinator, ARGS.worker, workers=4)
        cls.c = shardcoord.connect(cls.cluster.address)
        workers = cls.c.workers()
        cls.ranks = [w.rank for w in workers]
        names = [w.name for w in workers]
        cls.c.create_mesh("train", [4], workers=names)
        cls.c.create_mesh("infer", [2, 2], dim_names=["dp", "tp"], workers=names)
        cls.model = synthetic_model(PARAMS, SEED)
        cls.model_path = os.path.join(cls.cluster.dir, "model.json")
        with open(cls.model_path, "w", encoding="utf-8") as f:
            json.dump(cls.model, f)
        cls.processes = []

    @classmethod
    def tearDownClass(cls):
        for p in cls.processes:
            p.close()
        cls.c.close()
        cls.cluster.stop()

    def spawn(self, role, count, torch_ranks):
        out = []
        for i in range(count):
            p = UserProcess(self.cluster.address, f"{role}{i}", torch=i in torch_ranks,
                            script="model_process.py")
            self.processes.append(p)
            out.append(p)
        return out

    def measured(self, what, processes, commands):
        """Sends every process its command at once, waits for every answer; returns the
        answers and the coordinator's calls meanwhile by method."""
        before = rpc_calls(self.cluster)
        for p, command in zip(processes, commands):
            p.send(**command)
        answers = [p.answer() for p in processes]
        calls = delta(before, rpc_calls(self.cluster))
        print(f"{what}: coordinator calls {calls} for {len(processes)} processes",
              file=sys.stderr)
        return answers, calls

    def assert_o1(self, calls, processes):
        """Per process: at most one ListWorkers and the worker's two AttachBuffers (layouts,
        then the attach), nothing per tensor."""
        self.assertLessEqual(calls.get("shardcoord.v1.Coordinator/ListWorkers", 0), processes)
        self.assertEqual(calls.get("shardcoord.v1.CoordinatorWorkers/AttachBuffers", 0),
                         2 * processes)
        for per_tensor in ("Coordinator/GetTensor", "CoordinatorWorkers/AttachBuffer"):
            self.assertEqual(calls.get("shardcoord.v1." + per_tensor, 0), 0, per_tensor)
        self.assertLessEqual(sum(calls.values()), 3 * processes, calls)

    def test_a_model_lent_by_four_processes_moves_into_tensor_parallel_layouts(self):
        shapes = dict(self.model)
        self.assertEqual(len(shapes), PARAMS)

        # Registered in one CreateTensors (and one ListMeshes), however many tensors.
        before = rpc_calls(self.cluster)
        created = self.c.register(shapes, "train", "fsdp_flat", dtype="f32", init="attached")
        calls = delta(before, rpc_calls(self.cluster))
        print(f"register: coordinator calls {calls}", file=sys.stderr)
        self.assertEqual(created["created"], PARAMS)
        self.assertEqual(calls.get("shardcoord.v1.Coordinator/CreateTensors"), 1)
        self.assertLessEqual(sum(calls.values()), 2)
        tp = {f"tp.{n}": s for n, s in self.model}
        self.assertEqual(self.c.register(tp, "infer", "megatron_tp", dtype="f32",
                                         init="zeros")["created"], PARAMS)
        self.c.register({f"recv.{n}": s for n, s in self.model}, "infer", "megatron_tp",
                        dtype="f32", init="attached")

        # Four trainer processes lend their FSDP shards (NumPy and torch, plain and shared
        # memory: rank 3's in hundreds of memfds, more than one sendmsg carries).
        trainers = self.spawn("trainer", 4, torch_ranks=(1, 3))
        shared_every = {0: 0, 1: 0, 2: 4, 3: 1}
        answers, calls = self.measured("lend", trainers, [
            dict(op="lend", model=self.model_path, rank=r, world=4,
                 framework="torch" if i in (1, 3) else "numpy", shared_every=shared_every[i])
            for i, r in enumerate(self.ranks)])
        for a in answers:
            self.assertNotIn("code", a, a)
            self.assertEqual(a["lent"], PARAMS)
        self.assertGreater(answers[3]["shared"], 253)
        # Every tensor is someone's; at most three straddle a boundary between two ranks.
        self.assertIn(sum(a["nonempty"] for a in answers) - PARAMS, (0, 1, 2, 3))
        self.assert_o1(calls, len(trainers))
        attached = self.c.tensors(prefix="model.") + self.c.tensors(prefix="lm_head.")
        self.assertEqual(len(attached), PARAMS)
        self.assertTrue(all(t.attached and not t.unattached_ranks for t in attached))

        # Four engine processes receive the TP tensors they serve, written in place.
        engines = self.spawn("engine", 4, torch_ranks=(0,))
        for i, (p, r) in enumerate(zip(engines, self.ranks)):
            p.send(op="allocate", prefix="recv.", rank=r,
                   framework="torch" if i == 0 else "numpy", shared_every=3 if i == 2 else 0)
        for p in engines:
            self.assertEqual(p.answer(), {"allocated": PARAMS})
        answers, calls = self.measured("receive", engines,
                                       [dict(op="receive", rank=r) for r in self.ranks])
        for a in answers:
            self.assertNotIn("code", a, a)
            self.assertEqual(a["received"], PARAMS)
        self.assert_o1(calls, len(engines))

        # One prepared transfer per destination moves the whole model (a transfer reads each
        # tensor once), run twice as a trainer's steps would: the second run is a warm one.
        for prefix in ("tp.", "recv."):
            info = self.c.transfer("sync." + prefix, [(n, prefix + n) for n, _ in self.model])
            self.assertEqual(info.members, PARAMS, info)
            versions = []
            for step in range(2):
                run = self.c.run("sync." + prefix)
                self.assertEqual(run["members"], PARAMS, run)
                self.assertFalse(run["replanned"], run)
                versions.append(run["version"])
            self.assertLess(versions[0], versions[1])
        for p in engines:
            got = p.call(op="check", model=self.model_path, prefix="recv.")
            self.assertEqual(got["mismatches"], 0, got)
            self.assertGreater(got["elements"], 0)
        for k, (name, shape) in enumerate(self.model):
            a = self.c.download(f"tp.{name}")
            want = (k * 1009 + np.arange(int(np.prod(shape)), dtype=np.int64)).astype(
                np.float32).reshape(shape)
            self.assertTrue(np.array_equal(a, want), f"tp.{name} holds other values")

    def test_a_refused_member_is_named_and_nothing_is_lent(self):
        self.c.create_tensors([dict(name=f"bad.{i}", shape=[4, 3], mesh="train",
                                    placements="S(0)", init="attached") for i in range(3)])
        rank = self.ranks[1]
        state = {f"bad.{i}": np.zeros(3, dtype=np.float32) for i in range(3)}
        state["bad.1"] = np.zeros(4, dtype=np.float32)  # Rank 1's rows take 3 elements.
        with self.assertRaises(shardcoord.Error) as e:
            self.c.lend(rank, state)
        self.assertEqual(e.exception.code, "INVALID_ARGUMENT")
        self.assertEqual(e.exception.member, "bad.1")
        self.assertTrue(e.exception.message.startswith("attachments[1] 'bad.1': bytes:"),
                        e.exception.message)
        for i in range(3):
            self.assertIn(rank, list(self.c.tensor(f"bad.{i}").unattached_ranks))
        read_only = np.zeros(3, dtype=np.float32)
        read_only.flags.writeable = False
        with self.assertRaises(shardcoord.Error) as e:
            self.c.receive(rank, {"bad.0": np.zeros(3, dtype=np.float32), "bad.2": read_only})
        self.assertEqual(e.exception.member, "bad.2")
        state["bad.1"] = np.zeros(3, dtype=np.float32)
        self.assertEqual(self.c.lend(rank, state), {f"bad.{i}": False for i in range(3)})
        self.c.delete_tensors(prefix="bad.")


if __name__ == "__main__":
    ARGS, argv = parse_test_args()
    unittest.main(argv=argv)
