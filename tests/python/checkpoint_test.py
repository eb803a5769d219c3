"""Checkpoints and the open format (issue 13), with NumPy only on the file side: a real
coordinator and four Gloo workers.

- Files saved by shardcoord are read back by an independent safetensors reader written here
  (NumPy and the standard library: no safetensors package, no shardcoord code), which checks
  every file's header, that index.json matches the files (entries, dtypes, shapes, sizes,
  XXH64 of every entry and block, computed by a pure-Python XXH64), that the pieces tile each
  tensor, and every value.
- safetensors files written here with NumPy only (one file, and a directory of two as a
  sharded Hugging Face model is) load into sharded layouts, every value checked.

    checkpoint_test.py --coordinator PATH --worker PATH [unittest args]
"""

import json
import os
import struct
import sys
import tempfile
import unittest

import numpy as np
import shardcoord

from cluster import Cluster, parse_test_args

ARGS = None

# ---- An independent safetensors reader and XXH64 ----------------------------------------------

_M = (1 << 64) - 1
_P1, _P2, _P3 = 11400714785074694791, 14029467366897019727, 1609587929392839161
_P4, _P5 = 9650029242287828579, 2870177450012600261


def _rotl(x, r):
    return ((x << r) | (x >> (64 - r))) & _M


def _round(acc, lane):
    return (_rotl((acc + lane * _P2) & _M, 31) * _P1) & _M


def xxh64(data, seed=0):
    """XXH64 as specified (github.com/Cyan4973/xxHash/blob/dev/doc/xxhash_spec.md)."""
    n, i = len(data), 0
    if n >= 32:
        v = [(seed + _P1 + _P2) & _M, (seed + _P2) & _M, seed, (seed - _P1) & _M]
        lanes = np.frombuffer(data, dtype="<u8", count=(n // 32) * 4).tolist()
        for j in range(0, len(lanes), 4):
            v = [_round(v[k], lanes[j + k]) for k in range(4)]
        h = (_rotl(v[0], 1) + _rotl(v[1], 7) + _rotl(v[2], 12) + _rotl(v[3], 18)) & _M
        for x in v:
            h = ((h ^ _round(0, x)) * _P1 + _P4) & _M
        i = (n // 32) * 32
    else:
        h = (seed + _P5) & _M
    h = (h + n) & _M
    while i + 8 <= n:
        h ^= _round(0, int.from_bytes(data[i:i + 8], "little"))
        h = (_rotl(h, 27) * _P1 + _P4) & _M
        i += 8
    if i + 4 <= n:
        h ^= (int.from_bytes(data[i:i + 4], "little") * _P1) & _M
        h = (_rotl(h, 23) * _P2 + _P3) & _M
        i += 4
    while i < n:
        h ^= (data[i] * _P5) & _M
        h = (_rotl(h, 11) * _P1) & _M
        i += 1
    h ^= h >> 33
    h = (h * _P2) & _M
    h ^= h >> 29
    h = (h * _P3) & _M
    h ^= h >> 32
    return h


# NumPy dtypes of safetensors names (BF16 as its 16-bit patterns).
NUMPY = {"F32": "<f4", "F64": "<f8", "F16": "<f2", "BF16": "<u2", "I8": "i1", "U8": "u1",
         "I32": "<i4", "I64": "<i8"}
NAME_OF = {np.dtype("<f4"): "F32", np.dtype("<f8"): "F64", np.dtype("<f2"): "F16",
           np.dtype("<i4"): "I32", np.dtype("<i8"): "I64", np.dtype("i1"): "I8",
           np.dtype("u1"): "U8"}


def read_safetensors(path):
    """(header dict without __metadata__, metadata, data bytes); checks the layout rules."""
    with open(path, "rb") as f:
        blob = f.read()
    (n,) = struct.unpack("<Q", blob[:8])
    header = json.loads(blob[8:8 + n].decode("utf-8"))
    metadata = header.pop("__metadata__", {})
    data = blob[8 + n:]
    at = 0
    for name, e in sorted(header.items(), key=lambda kv: kv[1]["data_offsets"]):
        begin, end = e["data_offsets"]
        assert begin == at, f"{path}: {name} starts at {begin}, not {at}"
        want = int(np.prod(e["shape"], dtype=np.int64)) * np.dtype(NUMPY[e["dtype"]]).itemsize
        assert end - begin == want, f"{path}: {name} holds {end - begin} bytes, needs {want}"
        at = end
    assert at == len(data), f"{path}: entries end at {at}, data has {len(data)} bytes"
    return header, metadata, data


def write_safetensors(path, tensors):
    """A safetensors file of {name: (safetensors dtype, array)}, as the format specifies."""
    header, parts, at = {}, [], 0
    for name, (dtype, array) in tensors.items():
        raw = np.ascontiguousarray(array).tobytes()
        header[name] = {"dtype": dtype, "shape": list(array.shape),
                        "data_offsets": [at, at + len(raw)]}
        parts.append(raw)
        at += len(raw)
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text + b"".join(parts))


# ---- Block-scaled FP8 (issue 28), a NumPy reference ------------------------------------------


def e4m3_to_f32(bits):
    """f8_e4m3fn bit patterns (uint8) as float32 values, exactly: bias 7, subnormals at
    exponent 0, S.1111.111 the only NaN (no infinities). NaN here is positive; the caller
    handles NaN bits by the cast rules."""
    b = bits.astype(np.int64)
    e = (b >> 3) & 0xF
    m = (b & 7).astype(np.float64)
    v = np.where(e == 0, m / 8.0 * 2.0 ** -6, (1.0 + m / 8.0) * np.exp2(e - 7.0))
    v = np.where(b & 0x80, -v, v)
    v = np.where((b & 0x7F) == 0x7F, np.nan, v)
    return v.astype(np.float32)  # Every e4m3 value is exact in f32.


def expand_scales(scales, shape, block=(128, 128)):
    """Each element's block scale: scales [..., ceil(M/r), ceil(N/c)] repeated over blocks."""
    s = np.repeat(np.repeat(scales, block[0], axis=-2), block[1], axis=-1)
    return s[..., :shape[-2], :shape[-1]]


def dequantize_reference(q, scales, dtype):
    """y = dtype(f32(q) * s): the product in f32 (IEEE, ties to even), then f32 -> bf16 with
    ties to even, or kept as f32. NaN (S.1111.111) becomes the cast rules' quiet NaN, sign and
    payload kept: f32 S.11111111.1110000..., bf16 S.11111111.1110000. Returns bit patterns."""
    with np.errstate(all="ignore"):
        x = e4m3_to_f32(q) * expand_scales(scales.astype(np.float32), q.shape)
    u = x.astype(np.float32).view("<u4").astype(np.uint64)
    sign = (q.astype(np.uint64) >> 7) & 1
    nan = (q & 0x7F) == 0x7F
    if dtype == "f32":
        return np.where(nan, (sign << 31) | 0x7FF00000, u).astype("<u4")
    rounded = (u + 0x7FFF + ((u >> 16) & 1)) >> 16
    return np.where(nan, (sign << 15) | 0x7FF0, rounded).astype("<u2")


class CheckpointTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.cluster = Cluster(ARGS.coordinator, ARGS.worker, workers=4)
        cls.c = shardcoord.connect(cls.cluster.address)
        workers = [w.name for w in cls.c.workers()]
        cls.c.create_mesh("m4", [4], workers=workers)
        cls.c.create_mesh("g", [2, 2], dim_names=["dp", "tp"], workers=workers)
        cls.c.create_mesh("m3", [3], workers=workers[1:])
        cls.tmp = tempfile.mkdtemp(prefix="ckpt-", dir=os.environ.get("TEST_TMPDIR"))

    @classmethod
    def tearDownClass(cls):
        cls.c.close()
        cls.cluster.stop()

    def test_xxh64_reference(self):
        # The specification's test values.
        self.assertEqual(xxh64(b""), 0xEF46DB3751D8E999)
        self.assertEqual(xxh64(b"a"), 0xD24EC4F1A98C6E5B)
        self.assertEqual(xxh64(b"abc"), 0x44BC2CF5AD770999)
        self.assertEqual(xxh64(b"Nobody inspects the spammish repetition"), 0xFBCEA83C8A378BF1)

    def test_saved_files_read_back_with_numpy_and_match_the_index(self):
        rng = np.random.default_rng(13)
        arrays = {
            "ind.w": (rng.standard_normal((96, 40)).astype("<f4"), "g", "S(0),R", None),
            "ind.v": (rng.integers(-2**40, 2**40, size=(50,)).astype("<i8"), "m4", None,
                      "0:13;13:14;14:44;44:50"),
            "ind.h": (rng.standard_normal((7, 33)).astype("<f2"), "m3", "S(1)", None),
            "ind.r": (rng.integers(0, 255, size=(3000,)).astype("u1"), "m4", "R", None),
        }
        for name, (a, mesh, placements, flat) in arrays.items():
            self.c.upload(name, a, mesh, placements=placements, flat=flat)
        d = os.path.join(self.tmp, "saved")
        r = self.c.save_checkpoint(d, list(arrays))
        self.assertEqual(r.bytes, sum(a.nbytes for a, *_ in arrays.values()))

        with open(os.path.join(d, "index.json")) as f:
            index = json.load(f)
        self.assertEqual(index["format"], "shardcoord-checkpoint")
        files = {}
        for entry in index["files"]:
            path = os.path.join(d, entry["file"])
            self.assertEqual(os.path.getsize(path), entry["bytes"])
            files[entry["file"]] = read_safetensors(path)
        self.assertEqual(sorted(files), sorted(f for f in os.listdir(d) if f != "index.json"))
        used = {f: set() for f in files}
        for name, (a, *_) in arrays.items():
            t = index["tensors"][name]
            self.assertEqual(t["shape"], list(a.shape))
            self.assertEqual(t["dtype"], NAME_OF[a.dtype])
            whole = np.zeros(a.shape, dtype=a.dtype)
            covered = np.zeros(a.shape, dtype=np.int64)
            for p in t["pieces"]:
                header, metadata, data = files[p["file"]]
                self.assertEqual(metadata.get("format"), "pt")
                e = header[p["entry"]]
                used[p["file"]].add(p["entry"])
                self.assertEqual(e["dtype"], t["dtype"])
                self.assertEqual(e["shape"], p["box"]["shape"])
                raw = data[e["data_offsets"][0]:e["data_offsets"][1]]
                self.assertEqual(xxh64(raw), int(p["xxh64"], 16), p["entry"])
                row = len(raw) // max(1, p["box"]["shape"][0]) if p["box"]["shape"] else len(raw)
                step = p["rows_per_block"] * row
                blocks = [xxh64(raw[i:i + step]) for i in range(0, len(raw), step)]
                self.assertEqual(blocks, [int(b, 16) for b in p["blocks"]], p["entry"])
                piece = np.frombuffer(raw, dtype=a.dtype).reshape(e["shape"])
                sl = tuple(slice(o, o + s) for o, s in zip(p["box"]["offset"], p["box"]["shape"]))
                whole[sl] = piece
                covered[sl] += 1
            self.assertTrue((covered == 1).all(), f"{name}: pieces do not tile it")
            np.testing.assert_array_equal(whole, a, err_msg=name)
        # Every entry of every file belongs to the index.
        for f, (header, _, _) in files.items():
            self.assertEqual(set(header), used[f], f)

    def test_numpy_written_file_loads_into_sharded_layouts(self):
        rng = np.random.default_rng(7)
        emb = rng.standard_normal((101, 24)).astype("<f4")
        bias = np.arange(-17, 17, dtype="<i8")
        bf16 = rng.integers(0, 1 << 16, size=(9, 10), dtype="<u2")  # bf16 bit patterns.
        half = rng.standard_normal((12,)).astype("<f2")
        path = os.path.join(self.tmp, "model.safetensors")
        write_safetensors(path, {"emb": ("F32", emb), "bias": ("I64", bias),
                                 "bf": ("BF16", bf16), "half": ("F16", half)})
        r = self.c.load_checkpoint(path, targets={
            "emb": {"mesh": "g", "placements": "S(0),S(1)"},
            "bias": {"mesh": "m4", "flat": "0:5;5:5;5:30;30:34"},
            "bf": {"mesh": "m3", "placements": "S(1)", "name": "bf_loaded"},
            "half": {"mesh": "m4", "placements": "R"},
        }, prefix="np_")
        self.assertEqual(r.bytes_read, emb.nbytes + bias.nbytes + bf16.nbytes + half.nbytes)
        self.assertEqual(self.c.tensor("np_emb").spec, "S(0),S(1)")
        np.testing.assert_array_equal(self.c.download("np_emb"), emb)
        np.testing.assert_array_equal(self.c.download("np_bias"), bias)
        np.testing.assert_array_equal(self.c.download("bf_loaded").view("<u2"), bf16)
        np.testing.assert_array_equal(self.c.download("np_half"), half)

        # A directory of two such files (a sharded model without our index), every tensor to
        # one layout.
        d = os.path.join(self.tmp, "hf")
        os.mkdir(d)
        w1 = rng.standard_normal((40, 16)).astype("<f4")
        w2 = rng.standard_normal((16, 40)).astype("<f4")
        write_safetensors(os.path.join(d, "model-00001-of-00002.safetensors"), {"l0.w": ("F32", w1)})
        write_safetensors(os.path.join(d, "model-00002-of-00002.safetensors"), {"l1.w": ("F32", w2)})
        info = self.c.inspect_checkpoint(d)
        self.assertTrue(info.plain)
        self.assertEqual([t.name for t in info.tensors], ["l0.w", "l1.w"])
        self.c.load_checkpoint(d, mesh="g", placements="R,S(0)", prefix="hf.")
        np.testing.assert_array_equal(self.c.download("hf.l0.w"), w1)
        np.testing.assert_array_equal(self.c.download("hf.l1.w"), w2)

        # A truncated copy is refused naming the file and entry, creating nothing.
        with open(path, "rb") as f:
            blob = f.read()
        cut = os.path.join(self.tmp, "cut.safetensors")
        with open(cut, "wb") as f:
            f.write(blob[:-3])
        before = {t.name for t in self.c.tensors()}
        with self.assertRaises(shardcoord.Error) as e:
            self.c.load_checkpoint(cut, mesh="m4", placements="R", prefix="cut_")
        self.assertEqual(e.exception.code, "DATA_LOSS")
        self.assertIn("cut.safetensors: entry", e.exception.message)
        self.assertEqual({t.name for t in self.c.tensors()}, before)

    def test_fp8_checkpoint_loads_dequantized(self):
        # A DeepSeek-V3 style file written with NumPy: F8_E4M3 weights (bit patterns) with F32
        # *_scale_inv block scales, a 3-d expert weight, a plain BF16 entry.
        rng = np.random.default_rng(28)
        down = rng.integers(0, 256, size=(300, 260), dtype=np.uint8)
        # NaN, -NaN, 0, -0, the smallest subnormals, the largest, a normal.
        down[0, :10] = [0x7F, 0xFF, 0x00, 0x80, 0x01, 0x81, 0x07, 0x7E, 0xFE, 0x38]
        down[299, 259] = 0x7F  # In the edge block.
        down_s = np.array([[1.0, 0.5, 3e-8], [1.5e30, 1e-3, 7.0],
                           [2.0 ** -20, 0.25, 1e-40]], dtype="<f4")  # 1e-40: subnormal.
        experts = rng.integers(0, 256, size=(4, 130, 200), dtype=np.uint8)
        experts_s = rng.uniform(1e-4, 10.0, size=(4, 2, 2)).astype("<f4")
        norm = rng.integers(0, 1 << 16, size=(64,), dtype="<u2")
        down_n = "model.layers.0.mlp.down_proj.weight"
        experts_n = "model.layers.0.mlp.experts.w"
        d = os.path.join(self.tmp, "fp8")
        os.mkdir(d)
        path = os.path.join(d, "model.safetensors")
        write_safetensors(path, {down_n: ("F8_E4M3", down),
                                 down_n + "_scale_inv": ("F32", down_s),
                                 experts_n: ("F8_E4M3", experts),
                                 experts_n + "_scale_inv": ("F32", experts_s),
                                 "model.norm.weight": ("BF16", norm)})

        # Into a BF16 S(0) layout on 4 workers: 75 rows each cut the 128-row blocks, so the
        # readers (whole blocks) differ from the targets and the exchange moves rows.
        r = self.c.load_checkpoint(path, targets=[down_n, experts_n, "model.norm.weight"],
                                   mesh="m4", placements="S(0)", prefix="dq.", dequantize=True)
        self.assertEqual(r.bytes_read, down.nbytes + down_s.nbytes + experts.nbytes +
                         experts_s.nbytes + norm.nbytes)
        self.assertGreater(r.exchange_bytes_moved, 0)
        info = {t.tensor: t for t in r.tensors}
        self.assertEqual(info[down_n].scale_tensor, down_n + "_scale_inv")
        self.assertEqual(info[down_n].dtype, shardcoord.pb.BF16)
        self.assertEqual(info["model.norm.weight"].scale_tensor, "")
        self.assertEqual(self.c.tensor("dq." + down_n).spec, "S(0)")
        got = self.c.download("dq." + down_n).view("<u2")
        np.testing.assert_array_equal(got, dequantize_reference(down, down_s, "bf16"))
        np.testing.assert_array_equal(self.c.download("dq." + experts_n).view("<u2"),
                                      dequantize_reference(experts, experts_s, "bf16"))
        np.testing.assert_array_equal(self.c.download("dq.model.norm.weight").view("<u2"), norm)

        # Every tensor (all): the scales are consumed, not created.
        before = {t.name for t in self.c.tensors()}
        r = self.c.load_checkpoint(path, mesh="m4", placements="R", prefix="all.",
                                   dequantize=True, dtype="f32")
        self.assertEqual(sorted(t.tensor for t in r.tensors),
                         sorted([down_n, experts_n, "model.norm.weight"]))
        self.assertEqual({t.name for t in self.c.tensors()} - before,
                         {"all." + down_n, "all." + experts_n, "all.model.norm.weight"})
        np.testing.assert_array_equal(self.c.download("all." + down_n).view("<u4"),
                                      dequantize_reference(down, down_s, "f32"))

        # Into an existing f32 tensor of another layout: its dtype.
        self.c.create_tensor("into_down", [300, 260], dtype="f32", mesh="g",
                             placements="S(1),S(0)")
        r = self.c.load_checkpoint(path, targets={down_n: {"name": "into_down"}}, into=True,
                                   dequantize=True)
        self.assertEqual(r.tensors[0].dtype, shardcoord.pb.F32)
        np.testing.assert_array_equal(self.c.download("into_down").view("<u4"),
                                      dequantize_reference(down, down_s, "f32"))

        # Without --dequantize the FP8 entry loads unchanged.
        self.c.load_checkpoint(path, targets=[down_n], mesh="m4", placements="S(0)", prefix="raw.")
        np.testing.assert_array_equal(self.c.download("raw." + down_n).view(np.uint8), down)

        # Refusals: INVALID_ARGUMENT naming the entry, nothing created or changed.
        noscale = os.path.join(self.tmp, "noscale.safetensors")
        write_safetensors(noscale, {"x": ("F8_E4M3", down[:16, :16]), "y": ("F32", down_s)})
        badscale = os.path.join(self.tmp, "badscale.safetensors")
        write_safetensors(badscale, {"x": ("F8_E4M3", down), "x_scale_inv": ("F32", down_s[:2])})
        badtype = os.path.join(self.tmp, "badtype.safetensors")
        write_safetensors(badtype, {"x": ("F8_E4M3", down),
                                    "x_scale_inv": ("F16", np.ones((3, 3), dtype="<f2"))})
        before = {t.name: t.version for t in self.c.tensors()}
        for file, targets, want in [
                (noscale, None, "'x_scale_inv'"),
                (badscale, ["x"], "f32 [3, 3]"),
                (badtype, ["x"], "f16"),
                (path, [down_n + "_scale_inv"], "consumes")]:
            with self.assertRaises(shardcoord.Error) as e:
                self.c.load_checkpoint(file, targets=targets, mesh="m4", placements="S(0)",
                                       prefix="bad.", dequantize=True)
            self.assertEqual(e.exception.code, "INVALID_ARGUMENT", e.exception.message)
            self.assertIn(want, e.exception.message)
        with self.assertRaises(shardcoord.Error) as e:
            self.c.load_checkpoint(path, targets={down_n: {"name": "into_down"}}, into=True,
                                   dequantize=True, dtype="bf16")
        self.assertEqual(e.exception.code, "INVALID_ARGUMENT", e.exception.message)
        self.assertEqual({t.name: t.version for t in self.c.tensors()}, before)
        np.testing.assert_array_equal(self.c.download("into_down").view("<u4"),
                                      dequantize_reference(down, down_s, "f32"))

    def test_fp8_shardcoord_checkpoint_dequantizes_when_cut_on_blocks(self):
        # A shardcoord checkpoint (index.json, XXH64 of every block) of an FP8 tensor and its
        # scales: pieces of 128 rows start on block boundaries and load dequantized, every run
        # (scales included) checked; pieces of 75 rows cut blocks: FAILED_PRECONDITION naming
        # the piece, nothing created.
        rng = np.random.default_rng(281)
        w = rng.integers(0, 256, size=(256, 260), dtype=np.uint8)
        w_s = rng.uniform(1e-3, 4.0, size=(2, 3)).astype("<f4")
        self.c.upload("sv.w", w, "g", placements="S(0),R", dtype="f8_e4m3")
        self.c.upload("sv.w_scale_inv", w_s, "m4", placements="R")
        d = os.path.join(self.tmp, "fp8-saved")
        self.c.save_checkpoint(d, ["sv.w", "sv.w_scale_inv"])
        r = self.c.load_checkpoint(d, mesh="m4", placements="S(0)", prefix="svl.",
                                   dequantize=True)
        self.assertEqual([t.tensor for t in r.tensors], ["sv.w"])
        np.testing.assert_array_equal(self.c.download("svl.sv.w").view("<u2"),
                                      dequantize_reference(w, w_s, "bf16"))

        cut = rng.integers(0, 256, size=(300, 260), dtype=np.uint8)
        self.c.upload("cut.w", cut, "m4", placements="S(0)", dtype="f8_e4m3")
        self.c.upload("cut.w_scale_inv", rng.uniform(1, 2, size=(3, 3)).astype("<f4"), "m4",
                      placements="R")
        d = os.path.join(self.tmp, "fp8-cut")
        self.c.save_checkpoint(d, ["cut.w", "cut.w_scale_inv"])
        before = {t.name: t.version for t in self.c.tensors()}
        with self.assertRaises(shardcoord.Error) as e:
            self.c.load_checkpoint(d, mesh="m4", placements="S(0)", prefix="cutl.",
                                   dequantize=True)
        self.assertEqual(e.exception.code, "FAILED_PRECONDITION", e.exception.message)
        self.assertIn("block boundary", e.exception.message)
        self.assertEqual({t.name: t.version for t in self.c.tensors()}, before)


if __name__ == "__main__":
    ARGS, argv = parse_test_args()
    unittest.main(argv=argv)
