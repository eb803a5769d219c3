"""A Hugging Face model directory loaded straight into a tensor-parallel layout.

An inference engine starting up wants its tensor-parallel shards of a checkpoint, not the
whole model in one process. shardcoord's workers read the safetensors files themselves, each
only the rows its ranks need, so the model lands already sharded:

  1. a small Llama-shaped model directory (two safetensors files, bf16, and the
     model.safetensors.index.json Hugging Face writes beside them; fixed seed) is written, or
     the one given with --model-dir is used;
  2. `inspect_checkpoint` lists its tensors and shapes (from the files' headers);
  3. `shardcoord.layouts.megatron_tp` picks each tensor's layout by name on a (dp=2, tp=2)
     mesh: q/k/v/gate/up/embed/lm_head split by rows ("R,S(0)"), o/down by columns
     ("R,S(1)"), norms replicated ("R,R");
  4. `load_checkpoint` creates every tensor in its layout in one call;
  5. every tensor is downloaded and compared with the file, bit for bit; one line per tensor.

    python examples/load_hf_checkpoint.py --coordinator 127.0.0.1:7400   # >= 4 workers
    python examples/load_hf_checkpoint.py --local   # its own cluster from bazel-bin (the
        # daemons' paths: --coordinator-bin, --worker-bin)
    python examples/load_hf_checkpoint.py --model-dir /models/my-llama --coordinator ...
"""

import argparse
import json
import os
import struct
import sys
import tempfile

import numpy as np

import shardcoord
from shardcoord import layouts

SEED = 29
PREFIX = "hf_example."   # Every mesh and tensor of this example is named so.
TP, DP = 2, 2


# ---- A Llama-shaped model directory, written with NumPy only --------------------------------

def llama_shapes(vocab=64, hidden=32, intermediate=48, layers=2, heads=4, kv_heads=2):
    """{name: shape} as transformers' LlamaForCausalLM names its parameters."""
    head_dim = hidden // heads
    shapes = {"model.embed_tokens.weight": (vocab, hidden)}
    for i in range(layers):
        p = f"model.layers.{i}."
        shapes.update({
            p + "input_layernorm.weight": (hidden,),
            p + "self_attn.q_proj.weight": (heads * head_dim, hidden),
            p + "self_attn.k_proj.weight": (kv_heads * head_dim, hidden),
            p + "self_attn.v_proj.weight": (kv_heads * head_dim, hidden),
            p + "self_attn.o_proj.weight": (hidden, heads * head_dim),
            p + "post_attention_layernorm.weight": (hidden,),
            p + "mlp.gate_proj.weight": (intermediate, hidden),
            p + "mlp.up_proj.weight": (intermediate, hidden),
            p + "mlp.down_proj.weight": (hidden, intermediate),
        })
    shapes["model.norm.weight"] = (hidden,)
    shapes["lm_head.weight"] = (vocab, hidden)
    return shapes


def to_bf16_bits(a):
    """float32 -> bfloat16 bit patterns (uint16), rounded to nearest even, as torch does."""
    bits = a.astype("<f4").view("<u4").astype(np.uint64)
    return ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16).astype("<u2")


def write_safetensors(path, tensors):
    """The safetensors format: an 8-byte little-endian header length, a JSON header
    ({name: {dtype, shape, data_offsets}}), then the raw bytes."""
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


def write_model(directory):
    """Two shards and model.safetensors.index.json, as save_pretrained writes a model."""
    os.makedirs(directory, exist_ok=True)
    rng = np.random.default_rng(SEED)
    names = list(llama_shapes().items())
    files = {"model-00001-of-00002.safetensors": names[:len(names) // 2],
             "model-00002-of-00002.safetensors": names[len(names) // 2:]}
    weight_map, total = {}, 0
    for file, members in files.items():
        tensors = {}
        for name, shape in members:
            values = np.ones(shape) if "norm" in name else rng.standard_normal(shape) * 0.02
            tensors[name] = ("BF16", to_bf16_bits(values))
            weight_map[name] = file
            total += 2 * int(np.prod(shape))
        write_safetensors(os.path.join(directory, file), tensors)
    with open(os.path.join(directory, "model.safetensors.index.json"), "w",
              encoding="utf-8") as f:
        json.dump({"metadata": {"total_size": total}, "weight_map": weight_map}, f, indent=2)


def read_safetensors_dir(directory):
    """{name: (dtype, shape, raw bytes)} of every .safetensors file in `directory`: what the
    checks compare with, read here independently of shardcoord."""
    out = {}
    for file in sorted(os.listdir(directory)):
        if not file.endswith(".safetensors"):
            continue
        with open(os.path.join(directory, file), "rb") as f:
            blob = f.read()
        (n,) = struct.unpack("<Q", blob[:8])
        header = json.loads(blob[8:8 + n])
        header.pop("__metadata__", None)
        for name, e in header.items():
            begin, end = e["data_offsets"]
            out[name] = (e["dtype"], tuple(e["shape"]), blob[8 + n + begin:8 + n + end])
    return out


# ---- Loading into tensor parallelism --------------------------------------------------------

def load(address, model_dir):
    c = shardcoord.connect(address)
    if c.tensors(prefix=PREFIX):      # What an earlier run left.
        c.delete_tensors(prefix=PREFIX)
    for m in c.meshes():
        if m.name.startswith(PREFIX):
            c.delete_mesh(m.name)
    workers = [w.name for w in c.workers()]
    if len(workers) < DP * TP:
        raise SystemExit(f"load_hf_checkpoint: the cluster at {address} has {len(workers)} "
                         f"workers; this example needs {DP * TP}")
    mesh = c.create_mesh(PREFIX + "infer", [DP, TP], dim_names=["dp", "tp"],
                         workers=workers[:DP * TP]).name

    # The checkpoint's tensors, from the files' headers (read by the workers).
    info = c.inspect_checkpoint(model_dir)
    shapes = {t.name: tuple(t.shape) for t in info.tensors}
    print(f"{model_dir}: {len(shapes)} tensors, {info.bytes} bytes")

    # Each tensor's layout by its name: Megatron's rules, replicated over dp.
    targets = {name: {"mesh": mesh, "placements": layouts.megatron_tp(name, s, tp=TP, dp=DP)}
               for name, s in shapes.items()}
    r = c.load_checkpoint(model_dir, targets, prefix=PREFIX)
    print(f"loaded into mesh {mesh} (dp={DP}, tp={TP}): {r.bytes_read} bytes read")

    # Every tensor downloaded and compared with the file's bytes; its layout shown.
    files = read_safetensors_dir(model_dir)
    bad = 0
    for name, s in shapes.items():
        t = c.tensor(PREFIX + name)
        got = c.download(PREFIX + name)
        _, file_shape, raw = files[name]
        ok = tuple(got.shape) == file_shape and got.tobytes() == raw
        ok = ok and t.spec == targets[name]["placements"]
        bad += not ok
        box = t.layout.ranks[1].chunks[0].box   # Mesh coordinate (dp 0, tp 1).
        print(f"{name:46s} {str(list(s)):9s} {t.spec:7s} tp rank 1 holds "
              f"{str(list(box.offset)):8s}+{str(list(box.shape)):9s} "
              f"{'matches the file' if ok else 'DIFFERS FROM THE FILE'}")
    c.delete_tensors(prefix=PREFIX)
    c.delete_mesh(mesh)
    c.close()
    if bad:
        raise SystemExit(f"load_hf_checkpoint: {bad} of {len(shapes)} tensors differ")
    print(f"load_hf_checkpoint: OK ({len(shapes)} tensors checked)")


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--coordinator", help="address of a running coordinator "
                        "(default $SHARDCOORD_ADDR, then 127.0.0.1:7400)")
    parser.add_argument("--model-dir", help="a safetensors model directory (written here "
                        "first when it does not exist; default: a temporary one)")
    parser.add_argument("--local", action="store_true",
                        help="start a coordinator and 4 workers of our own on loopback")
    repo = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
    parser.add_argument("--coordinator-bin",
                        default=os.path.join(repo, "bazel-bin/coordinator/coordinator"))
    parser.add_argument("--worker-bin", default=os.path.join(repo, "bazel-bin/worker/worker"))
    args = parser.parse_args()

    with tempfile.TemporaryDirectory(prefix="hf-model-") as tmp:
        model_dir = os.path.abspath(args.model_dir or tmp)
        if not os.path.exists(model_dir) or not os.listdir(model_dir):
            write_model(model_dir)
            print(f"wrote a Llama-shaped model (seed {SEED}) into {model_dir}")
        if not args.local:
            return load(args.coordinator or shardcoord.default_address(), model_dir)
        # tests/python/cluster.py starts the daemons (free ports, sockets in a temp dir).
        sys.path.insert(0, os.path.join(repo, "tests", "python"))
        from cluster import Cluster  # pylint: disable=import-outside-toplevel
        for path in (args.coordinator_bin, args.worker_bin):
            if not os.access(path, os.X_OK):
                raise SystemExit(f"load_hf_checkpoint: {path} is not an executable (bazel "
                                 "build //coordinator //worker, or pass --coordinator-bin/"
                                 "--worker-bin)")
        cluster = Cluster(args.coordinator_bin, args.worker_bin, workers=DP * TP)
        try:
            return load(cluster.address, model_dir)
        finally:
            cluster.stop()


if __name__ == "__main__":
    main()
