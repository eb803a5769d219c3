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


if __name__ == "__main__":
    ARGS, argv = parse_test_args()
    unittest.main(argv=argv)
