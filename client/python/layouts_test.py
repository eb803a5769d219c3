"""Tests shardcoord.layouts against NumPy references of each seed's semantics (FSDP/OLMo-core
flat parameters, Megatron TP, ColossalAI ShardSpec, DTensor placements with _StridedShard),
on seeded random shapes: each helper's spec text, read back (by an independent parser here and
by the real `shardctl layout --json`), must give every rank exactly the local tensor the
reference gives it.

Argument: --shardctl=PATH (bazel-bin/client/shardctl) for the cross-checks against shardctl;
without it those are skipped (saying so)."""

import json
import math
import re
import subprocess
import sys
import unittest

import numpy as np

from shardcoord import layouts

SHARDCTL = None


# ---- NumPy references of the seeds' semantics ----------------------------------------------

def torch_chunk(a, k, axis):
    """torch.chunk(a, k, dim=axis) as NumPy views, padded with empty pieces to k (DTensor's
    Shard pads the missing trailing pieces with empty shards)."""
    n = a.shape[axis]
    size = -(-n // k) if n else 0
    pieces = []
    for c in range(k):
        index = [slice(None)] * a.ndim
        index[axis] = slice(min(c * size, n), min((c + 1) * size, n))
        pieces.append(a[tuple(index)])
    return pieces


def fsdp_reference(arrays, world):
    """FSDP / OLMo-core: per rank, per tensor, the elements of that tensor in the rank's
    slice of the flattened concatenation (pieces of ceil(N/world))."""
    flat = np.concatenate([a.ravel() for a in arrays]) if arrays else np.zeros(0)
    owner = np.concatenate([np.full(a.size, t) for t, a in enumerate(arrays)]) \
        if arrays else np.zeros(0, dtype=int)
    piece = -(-flat.size // world)
    out = []
    for r in range(world):
        part, who = flat[r * piece:(r + 1) * piece], owner[r * piece:(r + 1) * piece]
        out.append([part[who == t] for t in range(len(arrays))])
    return out


def megatron_reference(kind, a, tp, dp, sizes=None):
    """Megatron TP: column-parallel splits dim 0 (torch.chunk over tp, or explicit sizes),
    row-parallel dim 1, replicated otherwise; every dp replica holds the same; rank =
    dp_rank * tp + tp_rank."""
    if kind == "replicate":
        pieces = [a] * tp
    else:
        axis = 0 if kind == "column" else 1
        if sizes is None:
            pieces = torch_chunk(a, tp, axis)
        else:
            pieces = np.split(a, np.cumsum(sizes)[:-1], axis=axis)
    return [pieces[g % tp] for g in range(dp * tp)]


def colossal_reference(a, dim, tp, dp):
    """ColossalAI: ProcessGroup(tp_degree=tp, dp_degree=dp) puts tp ranks consecutively;
    ShardSpec([dim], [tp]) narrows dim to size//tp at tp_local_rank * (size//tp); dim None is
    a ReplicaSpec."""
    out = []
    for g in range(dp * tp):
        if dim is None:
            out.append(a)
            continue
        chunk = a.shape[dim] // tp
        out.append(np.take(a, np.arange((g % tp) * chunk, (g % tp + 1) * chunk), axis=dim))
    return out


def dtensor_reference(a, mesh, placements):
    """DTensor's distribution, placements applied in mesh-dim order to the local tensor
    (Shard: torch.chunk; _StridedShard: chunk into k*split_factor, rank c concatenating
    pieces c, c+k, ...; Replicate and Partial: unchanged)."""
    out = []
    for rank in range(math.prod(mesh)):
        coord = np.unravel_index(rank, mesh)
        local = a
        for m, p in enumerate(placements):
            k, c = mesh[m], int(coord[m])
            if isinstance(p, FakeStridedShard):
                pieces = torch_chunk(local, k * p.split_factor, p.dim)
                local = np.concatenate([pieces[c + j * k] for j in range(p.split_factor)],
                                       axis=p.dim)
            elif isinstance(p, FakeShard):
                local = torch_chunk(local, k, p.dim)[c]
        out.append(local)
    return out


# ---- Fakes of torch's placement classes (torch here is 1.13: no DTensor) --------------------

class FakePlacement:
    """What layouts asks of a placement besides its class name: is_shard (of `dim`, when
    given), is_replicate, is_partial; KIND says which one it is."""
    KIND = None  # "shard", "replicate" or "partial"

    def is_shard(self, dim=None):
        return self.KIND == "shard" and (dim is None or dim == self.dim)

    def is_replicate(self):
        return self.KIND == "replicate"

    def is_partial(self):
        return self.KIND == "partial"


class FakeShard(FakePlacement):
    KIND = "shard"

    def __init__(self, dim):
        self.dim = dim


FakeShard.__name__ = "Shard"


class FakeStridedShard(FakeShard):
    def __init__(self, dim, split_factor):
        super().__init__(dim)
        self.split_factor = split_factor


FakeStridedShard.__name__ = "_StridedShard"


class FakeReplicate(FakePlacement):
    KIND = "replicate"


FakeReplicate.__name__ = "Replicate"


class FakePartial(FakePlacement):
    KIND = "partial"

    def __init__(self, reduce_op="sum"):
        self.reduce_op = reduce_op


FakePartial.__name__ = "Partial"


class FakeMesh:
    def __init__(self, shape):
        self.shape = tuple(shape)


class FakeDTensor:
    def __init__(self, shape, mesh, placements):
        self.shape = tuple(shape)
        self.device_mesh = FakeMesh(mesh)
        self.placements = tuple(placements)


# ---- Reading spec text back: an independent parser, and shardctl ----------------------------

def parse_flat(text, world):
    ranks = text.split(";")
    assert len(ranks) == world, (text, world)
    out = []
    for r in ranks:
        ranges = []
        for item in filter(None, r.split(",")):
            a, b = item.split(":")
            ranges.append((int(a), int(b)))
        out.append(ranges)
    return out


def locals_of_flat(a, text, world):
    """Each rank's local buffer for flat text: its ranges of a.ravel() concatenated."""
    flat = a.ravel()
    return [np.concatenate([flat[s:e] for s, e in ranges] + [flat[:0]])
            for ranges in parse_flat(text, world)]


_ITEM = re.compile(r"S\((-?\d+)(?:,\[([\d,]*)\])?\)|R|P\((sum|avg|min|max)\)")


def locals_of_placements(a, mesh, text):
    """Each rank's local tensor for placements text on `mesh`: items in mesh-dim order, each
    splitting what the previous ones left (torch.chunk, or explicit sizes)."""
    items = []
    depth, start = 0, 0
    for i, ch in enumerate(text + ","):  # Split on top-level commas only.
        depth += ch == "[" or ch == "("
        depth -= ch == "]" or ch == ")"
        if ch == "," and depth == 0:
            items.append(text[start:i])
            start = i + 1
    assert len(items) == len(mesh), (text, mesh)
    out = []
    for rank in range(math.prod(mesh)):
        coord = np.unravel_index(rank, mesh)
        local = a
        for m, item in enumerate(items):
            match = _ITEM.fullmatch(item)
            assert match, item
            if item.startswith("S"):
                axis = int(match.group(1)) % a.ndim
                if match.group(2) is not None:
                    sizes = [int(s) for s in match.group(2).split(",")]
                    local = np.split(local, np.cumsum(sizes)[:-1], axis=axis)[int(coord[m])]
                else:
                    local = torch_chunk(local, mesh[m], axis)[int(coord[m])]
        out.append(local)
    return out


def shardctl_locals(a, mesh, flag, text):
    """Each rank's local buffer (flat, in its order) as `shardctl layout --json` lays it out:
    a chunk's box of `a` at its local offset."""
    result = subprocess.run(
        [SHARDCTL, "layout", "--mesh", "x".join(str(m) for m in mesh),
         "--shape", ",".join(str(n) for n in a.shape), flag, text, "--json"],
        check=False, capture_output=True, text=True)
    if result.returncode != 0:
        raise AssertionError(f"shardctl refused {flag} {text!r} for {a.shape} on {mesh}: "
                             f"{result.stderr}")
    chunks = json.loads(result.stdout)["chunks"]
    out = [[] for _ in range(math.prod(mesh))]
    for chunk in chunks:
        box = tuple(slice(o, o + n) for o, n in zip(chunk["offset"], chunk["shape"]))
        out[chunk["rank"]].append((chunk.get("local_offset", 0), a[box].ravel()))
    return [np.concatenate([piece for _, piece in sorted(pieces, key=lambda p: p[0])]
                           + [a.ravel()[:0]]) for pieces in out]


def random_shape(rng, max_ndim=3, max_dim=7, allow_zero=False):
    ndim = int(rng.integers(1, max_ndim + 1))
    return tuple(int(rng.integers(0 if allow_zero else 1, max_dim + 1)) for _ in range(ndim))


class TestCase(unittest.TestCase):
    def assert_locals(self, got, want, what):
        self.assertEqual(len(got), len(want), what)
        for r, (g, w) in enumerate(zip(got, want)):
            np.testing.assert_array_equal(np.asarray(g).ravel(), np.asarray(w).ravel(),
                                          err_msg=f"{what}: rank {r}")

    def need_shardctl(self):
        if not SHARDCTL:
            self.skipTest("no --shardctl: the cross-check against shardctl layout is skipped")


class FsdpFlatTest(TestCase):
    def test_known_answer(self):
        self.assertEqual(layouts.fsdp_flat([(2, 3), (4,)], 3), ["0:4;4:6;", ";0:2;2:4"])
        # 10 elements over 4 ranks: pieces of 3, the last rank holds 1.
        self.assertEqual(layouts.fsdp_flat([(10,)], 4), ["0:3;3:6;6:9;9:10"])
        # 2 elements over 4 ranks: pieces of 1, trailing ranks hold nothing.
        self.assertEqual(layouts.fsdp_flat([(1,), (1,)], 4), ["0:1;;;", ";0:1;;"])
        self.assertEqual(layouts.fsdp_rank_range([(3, 3), (1,)], 4, 3), (9, 10))

    def test_random_against_reference(self):
        rng = np.random.default_rng(1234)
        for case in range(200):
            shapes = [random_shape(rng, allow_zero=True)
                      for _ in range(int(rng.integers(1, 7)))]
            world = int(rng.integers(1, 10))
            arrays, start = [], 0
            for s in shapes:
                arrays.append(np.arange(start, start + math.prod(s)).reshape(s))
                start += math.prod(s)
            texts = layouts.fsdp_flat(shapes, world)
            want = fsdp_reference(arrays, world)
            self.assertEqual(len(texts), len(shapes))
            for t, (a, text) in enumerate(zip(arrays, texts)):
                self.assert_locals(locals_of_flat(a, text, world), [w[t] for w in want],
                                   f"case {case} tensor {t} {a.shape} world {world} {text!r}")
            # The ranks' ranges tile the concatenation: fsdp_rank_range agrees.
            sizes = [sum(len(w[t]) for t in range(len(shapes))) for w in want]
            for r in range(world):
                a, b = layouts.fsdp_rank_range(shapes, world, r)
                self.assertEqual(b - a, sizes[r], f"case {case} rank {r}")

    def test_shardctl_lays_out_what_the_reference_says(self):
        self.need_shardctl()
        rng = np.random.default_rng(99)
        for case in range(25):
            shapes = [random_shape(rng) for _ in range(int(rng.integers(1, 5)))]
            world = int(rng.integers(1, 8))
            arrays = [rng.integers(0, 1 << 30, size=s) for s in shapes]
            want = fsdp_reference(arrays, world)
            for t, (a, text) in enumerate(zip(arrays, layouts.fsdp_flat(shapes, world))):
                self.assert_locals(shardctl_locals(a, [world], "--flat", text),
                                   [w[t] for w in want],
                                   f"case {case} tensor {t} {a.shape} world {world} {text!r}")

    def test_bad_input(self):
        with self.assertRaisesRegex(ValueError, "world"):
            layouts.fsdp_flat([(2,)], 0)
        with self.assertRaisesRegex(ValueError, r"shapes\[1\]\[0\]"):
            layouts.fsdp_flat([(2,), (-1,)], 2)
        with self.assertRaisesRegex(ValueError, r"shapes\[0\]"):
            layouts.fsdp_flat([3], 2)
        with self.assertRaisesRegex(ValueError, "rank 4 is out of range"):
            layouts.fsdp_rank_range([(8,)], 4, 4)
        with self.assertRaisesRegex(ValueError, "rank"):
            layouts.fsdp_rank_range([(8,)], 4, -1)


LLAMA = {  # name -> (kind, shape) of a small Llama/Qwen/DeepSeek-style state dict
    "model.embed_tokens.weight": ("column", (11, 6)),
    "model.layers.0.input_layernorm.weight": ("replicate", (6,)),
    "model.layers.0.self_attn.q_proj.weight": ("column", (8, 6)),
    "model.layers.0.self_attn.q_proj.bias": ("column", (8,)),
    "model.layers.0.self_attn.k_proj.weight": ("column", (5, 6)),
    "model.layers.0.self_attn.v_proj.weight": ("column", (5, 6)),
    "model.layers.0.self_attn.o_proj.weight": ("row", (6, 8)),
    "model.layers.0.self_attn.q_norm.weight": ("replicate", (4,)),
    "model.layers.0.post_attention_layernorm.weight": ("replicate", (6,)),
    "model.layers.0.mlp.gate_proj.weight": ("column", (9, 6)),
    "model.layers.0.mlp.up_proj.weight": ("column", (9, 6)),
    "model.layers.0.mlp.down_proj.weight": ("row", (6, 9)),
    "model.layers.0.mlp.down_proj.bias": ("replicate", (6,)),
    "model.layers.1.self_attn.q_a_proj.weight": ("replicate", (3, 6)),
    "model.layers.1.self_attn.q_a_layernorm.weight": ("replicate", (3,)),
    "model.layers.1.self_attn.q_b_proj.weight": ("column", (8, 3)),
    "model.layers.1.self_attn.kv_a_proj_with_mqa.weight": ("replicate", (4, 6)),
    "model.layers.1.self_attn.kv_b_proj.weight": ("column", (10, 4)),
    "model.layers.1.mlp.gate.weight": ("replicate", (4, 6)),
    "model.layers.1.mlp.experts.3.gate_proj.weight": ("column", (7, 6)),
    "model.layers.1.mlp.experts.3.down_proj.weight": ("row", (6, 7)),
    "model.layers.1.mlp.shared_experts.up_proj.weight": ("column", (7, 6)),
    "model.norm.weight": ("replicate", (6,)),
    "lm_head.weight": ("column", (11, 6)),
}


class MegatronTpTest(TestCase):
    def test_rule_table(self):
        for name, (kind, _) in LLAMA.items():
            self.assertEqual(layouts.megatron_tp_rule(name), kind, name)
        self.assertEqual(layouts.megatron_tp("model.layers.0.self_attn.q_proj.weight", (8, 6)),
                         "S(0)")
        self.assertEqual(layouts.megatron_tp("model.layers.0.mlp.down_proj.weight", (6, 9),
                                             tp=2, dp=3), "R,S(1)")
        self.assertEqual(layouts.megatron_tp("model.norm.weight", (6,), tp=2, dp=2), "R,R")
        self.assertEqual(layouts.megatron_tp("lm_head.weight", (11, 6), tp=2, sizes=[5, 6]),
                         "S(0,[5,6])")

    def check(self, read, seed, cases):
        rng = np.random.default_rng(seed)
        names = sorted(LLAMA)
        for case in range(cases):
            name = names[int(rng.integers(len(names)))]
            kind, ndim_shape = LLAMA[name]
            shape = tuple(int(rng.integers(1, 12)) for _ in ndim_shape)
            tp = int(rng.integers(1, 6))
            dp = int(rng.integers(1, 4)) if rng.integers(2) else None
            sizes = None
            if kind != "replicate" and rng.integers(3) == 0:
                axis = 0 if kind == "column" else 1
                cuts = np.sort(rng.integers(0, shape[axis] + 1, size=tp - 1))
                sizes = [int(s) for s in np.diff(np.concatenate([[0], cuts, [shape[axis]]]))]
            a = rng.integers(0, 1 << 30, size=shape)
            text = layouts.megatron_tp(name, shape, tp=tp, dp=dp, sizes=sizes)
            mesh = [tp] if dp is None else [dp, tp]
            self.assert_locals(read(a, mesh, text),
                               megatron_reference(kind, a, tp, dp or 1, sizes),
                               f"case {case} {name} {shape} tp {tp} dp {dp} {text!r}")

    def test_random_against_reference(self):
        self.check(locals_of_placements, 5, 300)

    def test_shardctl_lays_out_what_the_reference_says(self):
        self.need_shardctl()
        self.check(lambda a, mesh, text: shardctl_locals(a, mesh, "--placements", text), 6, 30)

    def test_bad_input(self):
        with self.assertRaisesRegex(ValueError, "name 'model.rotary_emb.inv_freq'"):
            layouts.megatron_tp("model.rotary_emb.inv_freq", (4,))
        with self.assertRaisesRegex(ValueError, r"sizes \[3, 3\] sum to 6, not shape\[0\]=8"):
            layouts.megatron_tp("model.layers.0.self_attn.q_proj.weight", (8, 6), tp=2,
                                sizes=[3, 3])
        with self.assertRaisesRegex(ValueError, "sizes has 3 entries, not tp=2"):
            layouts.megatron_tp("model.layers.0.self_attn.q_proj.weight", (8, 6), tp=2,
                                sizes=[3, 3, 2])
        with self.assertRaisesRegex(ValueError, "tp"):
            layouts.megatron_tp("lm_head.weight", (8, 6), tp=0)
        with self.assertRaisesRegex(ValueError, "dp"):
            layouts.megatron_tp("lm_head.weight", (8, 6), tp=2, dp=-1)
        with self.assertRaisesRegex(ValueError, r"shape \[6\] .* has no dim 1"):
            layouts.megatron_tp("x.o_proj.weight", (6,))
        with self.assertRaisesRegex(ValueError, r"shape\[1\]"):
            layouts.megatron_tp("lm_head.weight", (8, "a"))


class FakeProcessGroup:
    def __init__(self, tp, dp):
        self._tp, self._dp = tp, dp

    def tp_world_size(self):
        return self._tp

    def dp_world_size(self):
        return self._dp


class ColossalTest(TestCase):
    def test_known_answer(self):
        self.assertEqual(layouts.colossal(layouts.ShardSpec([0], [4]), tp=4, dp=2), "R,S(0)")
        self.assertEqual(layouts.colossal(layouts.ReplicaSpec(), tp=4, dp=2), "R,R")
        self.assertEqual(layouts.colossal(layouts.ShardSpec([-1], [2]), FakeProcessGroup(2, 3),
                                          shape=(4, 6)), "R,S(1)")

        class Pattern:  # colossalai's _DistSpec with a DistPlacementPattern enum
            value = "s"

        class DistSpec:
            placement = Pattern()
            dims = (1,)
            num_partitions = (2,)

        self.assertEqual(layouts.colossal(DistSpec(), tp=2), "R,S(1)")

    def check(self, read, seed, cases):
        rng = np.random.default_rng(seed)
        for case in range(cases):
            tp, dp = int(rng.integers(1, 5)), int(rng.integers(1, 4))
            shape = list(random_shape(rng))
            dim = None if rng.integers(4) == 0 else int(rng.integers(len(shape)))
            if dim is not None:
                shape[dim] = tp * int(rng.integers(0, 4))  # ColossalAI splits evenly.
            a = rng.integers(0, 1 << 30, size=shape)
            spec = layouts.ReplicaSpec() if dim is None else layouts.ShardSpec([dim], [tp])
            text = layouts.colossal(spec, tp=tp, dp=dp, shape=shape)
            self.assert_locals(read(a, [dp, tp], text), colossal_reference(a, dim, tp, dp),
                               f"case {case} {shape} dim {dim} tp {tp} dp {dp} {text!r}")

    def test_random_against_reference(self):
        self.check(locals_of_placements, 7, 200)

    def test_shardctl_lays_out_what_the_reference_says(self):
        self.need_shardctl()
        # shardctl refuses zero-size dims; keep shapes whole here.
        def read(a, mesh, text):
            if 0 in a.shape:
                return locals_of_placements(a, mesh, text)
            return shardctl_locals(a, mesh, "--placements", text)
        self.check(read, 8, 20)

    def test_bad_input(self):
        with self.assertRaisesRegex(ValueError, "num_partitions"):
            layouts.colossal(layouts.ShardSpec([0], [3]), tp=2)
        with self.assertRaisesRegex(ValueError, "spec.dims"):
            layouts.colossal(layouts.ShardSpec([0, 1], [2, 2]), tp=2)
        with self.assertRaisesRegex(ValueError, r"shape\[0\]=5 is not divisible by tp=2"):
            layouts.colossal(layouts.ShardSpec([0], [2]), tp=2, shape=(5, 3))
        with self.assertRaisesRegex(ValueError, r"spec.dims \[2\] is out of range"):
            layouts.colossal(layouts.ShardSpec([2], [2]), tp=2, shape=(4, 4))
        with self.assertRaisesRegex(ValueError, "spec must be"):
            layouts.colossal("S(0)", tp=2)
        with self.assertRaisesRegex(ValueError, "tp"):
            layouts.colossal(layouts.ReplicaSpec(), tp=0)


def random_placements(rng, mesh, ndim, strided):
    """Placements for `mesh`: Shard/Replicate (Partial when not strided) and, when `strided`,
    FSDP2-over-TP pairs: _StridedShard(d, split_factor=k) on an earlier mesh dim, Shard(d)
    on a later one of size k."""
    out = []
    for _ in mesh:
        roll = int(rng.integers(4 if not strided else 3))
        out.append(FakeShard(int(rng.integers(-ndim, ndim))) if roll < 2 else
                   FakeReplicate() if roll == 2 else FakePartial("sum"))
    if strided and len(mesh) >= 2:
        i = int(rng.integers(len(mesh) - 1))
        j = int(rng.integers(i + 1, len(mesh)))
        d = int(rng.integers(ndim))
        out[i] = FakeStridedShard(d, mesh[j])
        out[j] = FakeShard(d)
    return out


class FromPlacementsTest(TestCase):
    def test_known_answer(self):
        spec = layouts.from_placements(2, [FakeReplicate(), FakeShard(0)])
        self.assertEqual(spec, layouts.Spec("placements", "R,S(0)"))
        self.assertEqual((spec.flag, spec.kwargs(), str(spec)),
                         ("--placements", {"placements": "R,S(0)"}, "R,S(0)"))
        self.assertEqual(layouts.from_placements(1, [FakePartial("avg")]).text, "P(avg)")
        self.assertEqual(layouts.from_placements((2,), [FakeShard(-1)], shape=(3, 4)).text,
                         "S(1)")
        # FSDP2 over TP: TP shards dim 0 first (mesh dim 1), FSDP what TP left (mesh dim 0).
        spec = layouts.from_placements((2, 2), [FakeStridedShard(0, 2), FakeShard(0)], (8,))
        self.assertEqual(spec, layouts.Spec("flat", "0:2;4:6;2:4;6:8"))
        dt = FakeDTensor((2, 8), (2, 2), [FakeStridedShard(1, 2), FakeShard(1)])
        self.assertEqual(layouts.from_dtensor(dt).text, "0:2,8:10;4:6,12:14;2:4,10:12;6:8,14:16")

    def check(self, read, seed, cases, strided):
        rng = np.random.default_rng(seed)
        for case in range(cases):
            mesh = tuple(int(rng.integers(1, 4)) for _ in range(int(rng.integers(1, 4))))
            shape = random_shape(rng, max_dim=9)
            placements = random_placements(rng, mesh, len(shape), strided)
            a = rng.integers(0, 1 << 30, size=shape)
            spec = layouts.from_dtensor(FakeDTensor(shape, mesh, placements))
            what = f"case {case} {shape} on {mesh} {[vars(p) for p in placements]} {spec}"
            self.assert_locals(read(a, mesh, spec), dtensor_reference(a, mesh, placements), what)

    def test_random_against_reference(self):
        def read(a, mesh, spec):
            if spec.kind == "flat":
                return locals_of_flat(a, spec.text, math.prod(mesh))
            return locals_of_placements(a, mesh, spec.text)
        self.check(read, 11, 300, strided=False)
        self.check(read, 12, 300, strided=True)

    def test_shardctl_lays_out_what_the_reference_says(self):
        self.need_shardctl()
        read = lambda a, mesh, spec: shardctl_locals(a, mesh, spec.flag, spec.text)
        self.check(read, 13, 15, strided=False)
        self.check(read, 14, 15, strided=True)

    def test_bad_input(self):
        with self.assertRaisesRegex(ValueError, "placements has 1 entries for a 2-d mesh"):
            layouts.from_placements(2, [FakeShard(0)])
        with self.assertRaisesRegex(ValueError, r"placements\[0\] shards dim 2"):
            layouts.from_placements(1, [FakeShard(2)], shape=(3, 3))
        with self.assertRaisesRegex(ValueError, r"placements\[1\] is not a Shard"):
            layouts.from_placements(2, [FakeShard(0), object()])
        with self.assertRaisesRegex(ValueError, r"placements\[0\] reduces with 'product'"):
            layouts.from_placements(1, [FakePartial("product")])
        with self.assertRaisesRegex(ValueError, "needs mesh as a shape"):
            layouts.from_placements(2, [FakeStridedShard(0, 2), FakeShard(0)], shape=(8,))
        with self.assertRaisesRegex(ValueError, "Partial with _StridedShard"):
            layouts.from_placements((2, 2), [FakeStridedShard(0, 2), FakePartial()], (8,))
        with self.assertRaisesRegex(ValueError, r"mesh\[1\]"):
            layouts.from_placements((2, -1), [FakeShard(0), FakeShard(0)])
        with self.assertRaisesRegex(ValueError, "dt has no .device_mesh"):
            layouts.from_dtensor(np.zeros(3))


class RealTorchTest(TestCase):
    """torch's own placement classes, where this torch has DTensor (torch >= 2.2)."""

    def test_torch_placements(self):
        try:
            import torch.distributed.tensor as dtensor  # pylint: disable=import-outside-toplevel
            from torch.distributed.tensor import Partial, Replicate, Shard  # noqa: F401
        except Exception as e:  # pylint: disable=broad-except
            self.skipTest(f"this torch has no torch.distributed.tensor (DTensor): {e}")
        self.assertEqual(layouts.from_placements(3, [dtensor.Replicate(), dtensor.Shard(1),
                                                     dtensor.Partial()]).text, "R,S(1),P(sum)")
        try:
            from torch.distributed.tensor.placement_types import \
                _StridedShard  # pylint: disable=import-outside-toplevel
        except ImportError:
            return
        spec = layouts.from_placements((2, 2), [_StridedShard(0, split_factor=2),
                                                dtensor.Shard(0)], (8,))
        self.assertEqual(spec.text, "0:2;4:6;2:4;6:8")


if __name__ == "__main__":
    for arg in list(sys.argv[1:]):
        if arg.startswith("--shardctl="):
            SHARDCTL = arg.split("=", 1)[1]
            sys.argv.remove(arg)
    unittest.main(verbosity=2)
