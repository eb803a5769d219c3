"""Layouts in the vocabulary trainers and engines already use, as shardcoord spec text.

Every helper returns what shardctl takes (README.md, `shardctl layout`), so what Python computes
can be pasted into `shardctl layout/tensor create --placements ... | --flat ...` or passed to
`Client.create_tensor(placements=...)` / `(flat=...)`:

- `fsdp_flat(shapes, world)`: FSDP / OLMo-core `ShardingSpec` flat-parameter ranges, one
  `--flat` text per parameter;
- `megatron_tp(name, shape, tp, dp)`: Megatron-style tensor parallelism by parameter name
  (`MEGATRON_TP_RULES`), `--placements` text;
- `colossal(spec, tp, dp)`: ColossalAI `ShardSpec` / `ReplicaSpec` over a ProcessGroup's
  (dp, tp) mesh, `--placements` text;
- `from_placements(mesh, placements)` / `from_dtensor(dt)`: torch DTensor `Shard`, `Replicate`,
  `Partial` and `_StridedShard` (duck-typed: torch is never imported), a `Spec`.

Pure Python: no gRPC, NumPy or torch here. Bad input raises ValueError naming the argument.
"""

import math
import re
from typing import NamedTuple

__all__ = ["MEGATRON_TP_RULES", "ReplicaSpec", "ShardSpec", "Spec", "colossal", "from_dtensor",
           "from_placements", "fsdp_flat", "fsdp_rank_range", "megatron_tp", "megatron_tp_rule"]


# ---- Validation ----------------------------------------------------------------------------

def _int(value, what, minimum=0):
    if isinstance(value, bool) or not isinstance(value, int):
        try:
            import operator  # pylint: disable=import-outside-toplevel
            value = operator.index(value)  # NumPy integers
        except TypeError:
            raise ValueError(f"{what} must be an integer, not {value!r}") from None
    if value < minimum:
        raise ValueError(f"{what} must be >= {minimum}, not {value}")
    return value


def _shape(shape, what):
    try:
        dims = list(shape)
    except TypeError:
        raise ValueError(f"{what} must be a sequence of dims, not {shape!r}") from None
    return tuple(_int(d, f"{what}[{i}]") for i, d in enumerate(dims))


def _numel(shape):
    return math.prod(shape)


def _flat_text(per_rank):
    """Per rank a list of (start, end): "0:4,20:30;4:20;;"."""
    return ";".join(",".join(f"{a}:{b}" for a, b in ranges) for ranges in per_rank)


# ---- FSDP / OLMo-core flat parameters ------------------------------------------------------

def fsdp_rank_range(shapes, world, rank):
    """[start, end) of the flattened concatenation of `shapes` that `rank` holds: FSDP's
    padding convention, pieces of ceil(N/world) elements, trailing ranks short or empty."""
    world = _int(world, "world", 1)
    rank = _int(rank, "rank")
    if rank >= world:
        raise ValueError(f"rank {rank} is out of range for world {world}")
    total = sum(_numel(_shape(s, f"shapes[{i}]")) for i, s in enumerate(shapes))
    piece = -(-total // world)
    return min(rank * piece, total), min((rank + 1) * piece, total)


def fsdp_flat(shapes, world):
    """One `--flat` text per shape: all parameters flattened and concatenated in order (N
    elements), rank r holding [r*ceil(N/world), min((r+1)*ceil(N/world), N)) of the
    concatenation; each text gives, per rank, the range of that tensor's own flattened
    elements the rank holds (empty where it holds none).

        fsdp_flat([(2, 3), (4,)], 3) == ["0:4;4:6;", ";0:2;2:4"]
    """
    world = _int(world, "world", 1)
    if isinstance(shapes, (str, bytes)):
        raise ValueError(f"shapes must be a list of shapes, not {shapes!r}")
    shapes = [_shape(s, f"shapes[{i}]") for i, s in enumerate(shapes)]
    total = sum(_numel(s) for s in shapes)
    piece = -(-total // world)
    texts = []
    offset = 0
    for s in shapes:
        n = _numel(s)
        per_rank = []
        for r in range(world):
            start, end = max(r * piece, offset), min((r + 1) * piece, offset + n, total)
            per_rank.append([(start - offset, end - offset)] if start < end else [])
        texts.append(_flat_text(per_rank))
        offset += n
    return texts


# ---- Megatron tensor parallelism -----------------------------------------------------------

# (pattern searched in the parameter name, kind): the first match wins. "column": the output
# dim (0 of a torch Linear weight [out, in], and its bias) is split; "row": the input dim (1)
# is split and the bias is replicated; "replicate": every rank holds it all.
MEGATRON_TP_RULES = (
    # Norms (Llama/Qwen input_layernorm, post_attention_layernorm, model.norm; DeepSeek's
    # q_a_layernorm, kv_a_layernorm; Qwen3's q_norm/k_norm) and MoE routers.
    (r"(^|[._])(\w*norm\w*|ln_\w+|ln)\.(weight|bias)$", "replicate"),
    (r"(^|\.)mlp\.gate\.(weight|e_score_correction_bias)$", "replicate"),
    (r"(^|\.)router\.\w+$", "replicate"),
    # DeepSeek MLA's low-rank down-projections are small and replicated.
    (r"(^|\.)(q_a_proj|kv_a_proj_with_mqa)\.(weight|bias)$", "replicate"),
    # Column-parallel.
    (r"(^|\.)(q_proj|k_proj|v_proj|qkv_proj|query_key_value|q_b_proj|kv_b_proj|wq|wk|wv|wqkv|"
     r"gate_proj|up_proj|gate_up_proj|w1|w3|c_fc|linear_fc1)\.(weight|bias)$", "column"),
    (r"(^|\.)(embed_tokens|wte|word_embeddings|tok_embeddings)\.weight$", "column"),
    (r"(^|\.)(lm_head|output)\.weight$", "column"),
    # Row-parallel.
    (r"(^|\.)(o_proj|down_proj|dense|wo|w2|c_proj|out_proj|linear_proj|linear_fc2)\.weight$",
     "row"),
    (r"(^|\.)(o_proj|down_proj|dense|wo|w2|c_proj|out_proj|linear_proj|linear_fc2)\.bias$",
     "replicate"),
)


def megatron_tp_rule(name, rules=MEGATRON_TP_RULES):
    """"column", "row" or "replicate" for parameter `name` (the first matching rule)."""
    if not isinstance(name, str):
        raise ValueError(f"name must be a parameter name, not {name!r}")
    for pattern, kind in rules:
        if re.search(pattern, name):
            return kind
    raise ValueError(f"name {name!r} matches no tensor-parallel rule (MEGATRON_TP_RULES); "
                     "pass rules= with one that does")


def megatron_tp(name, shape, tp=None, dp=None, sizes=None, rules=MEGATRON_TP_RULES):
    """`--placements` text for parameter `name` of `shape` under Megatron-style tensor
    parallelism: column-parallel weights and their biases (q/k/v/gate/up, embed_tokens,
    lm_head) "S(0)", row-parallel weights (o/down) "S(1)", norms, routers and row-parallel
    biases "R". On a 1-d tp mesh; with `dp` on a (dp, tp) mesh, replicated over dp ("R,S(0)").

    `sizes` (with `tp`): explicit per-tp-rank sizes of the split dim (Megatron's uneven chunk
    metadata), "S(0,[3,5])"; they must sum to that dim. Without them the split is torch.chunk's.
    """
    shape = _shape(shape, "shape")
    kind = megatron_tp_rule(name, rules)
    if tp is not None:
        tp = _int(tp, "tp", 1)
    if dp is not None:
        dp = _int(dp, "dp", 1)
    if kind == "replicate":
        if sizes is not None:
            raise ValueError(f"sizes given for {name!r}, which is replicated")
        item = "R"
    else:
        dim = 0 if kind == "column" else 1
        if dim >= len(shape):
            raise ValueError(f"shape {list(shape)} of {name!r} has no dim {dim} to split "
                             f"({kind}-parallel)")
        if sizes is None:
            item = f"S({dim})"
        else:
            sizes = _shape(sizes, "sizes")
            if tp is None:
                raise ValueError("sizes needs tp (one size per tp rank)")
            if len(sizes) != tp:
                raise ValueError(f"sizes has {len(sizes)} entries, not tp={tp}")
            if sum(sizes) != shape[dim]:
                raise ValueError(f"sizes {list(sizes)} sum to {sum(sizes)}, not shape[{dim}]="
                                 f"{shape[dim]} of {name!r}")
            item = f"S({dim},[{','.join(str(s) for s in sizes)}])"
    return item if dp is None else f"R,{item}"


# ---- ColossalAI ----------------------------------------------------------------------------

class ShardSpec(NamedTuple):
    """ColossalAI's ShardSpec(dims, num_partitions): sharded over the tp process group."""
    dims: tuple
    num_partitions: tuple


class ReplicaSpec(NamedTuple):
    """ColossalAI's ReplicaSpec(): replicated over the tp process group."""


def _colossal_kind(spec):
    if isinstance(spec, ReplicaSpec):
        return "r"
    if isinstance(spec, ShardSpec):
        return "s"
    placement = getattr(spec, "placement", None)  # colossalai _DistSpec: DistPlacementPattern
    value = str(getattr(placement, "value", placement) or "").lower()
    if value in ("r", "replicate", "distplacementpattern.replicate"):
        return "r"
    if value in ("s", "shard", "distplacementpattern.shard"):
        return "s"
    raise ValueError(f"spec must be a ShardSpec or ReplicaSpec, not {spec!r}")


def colossal(spec, tp=None, dp=1, shape=None):
    """`--placements` text on the 2-d (dp, tp) mesh of a ColossalAI ProcessGroup (tp ranks
    consecutive: global rank = dp_rank * tp + tp_rank) for `spec`, a ShardSpec(dims,
    num_partitions) (this module's or colossalai's) or a ReplicaSpec: "R,S(d)" or "R,R".

    `tp` is the tp degree, or a ProcessGroup-like object (tp_world_size(), dp_world_size()),
    whose degrees are used. ColossalAI splits evenly: with `shape`, a dim that tp does not
    divide is refused."""
    if hasattr(tp, "tp_world_size"):
        tp, dp = tp.tp_world_size(), tp.dp_world_size()
    tp = _int(tp if tp is not None else 1, "tp", 1)
    dp = _int(dp, "dp", 1)
    if _colossal_kind(spec) == "r":
        return "R,R"
    dims = list(getattr(spec, "dims", ()))
    parts = list(getattr(spec, "num_partitions", ()))
    if len(dims) != 1 or len(parts) != 1:
        raise ValueError(f"spec.dims {dims} and spec.num_partitions {parts} must have one entry "
                         "each (ColossalAI shards one dim over the tp group)")
    dim = _int(dims[0], "spec.dims[0]", -64)
    if _int(parts[0], "spec.num_partitions[0]", 1) != tp:
        raise ValueError(f"spec.num_partitions [{parts[0]}] must equal the tp degree {tp}")
    if shape is not None:
        shape = _shape(shape, "shape")
        if not -len(shape) <= dim < len(shape):
            raise ValueError(f"spec.dims [{dim}] is out of range for shape {list(shape)}")
        if shape[dim] % tp:
            raise ValueError(f"shape[{dim}]={shape[dim]} is not divisible by tp={tp} "
                             "(ColossalAI splits evenly)")
        dim %= len(shape)
    return f"R,S({dim})"


# ---- torch DTensor placements --------------------------------------------------------------

class Spec(NamedTuple):
    """A spec as shardctl takes it: `kind` "placements" or "flat", and its `text`."""
    kind: str
    text: str

    def __str__(self):
        return self.text

    @property
    def flag(self):
        """The shardctl flag: "--placements" or "--flat"."""
        return f"--{self.kind}"

    def kwargs(self):
        """Client.create_tensor's / redistribute's keyword: {"placements": text} or
        {"flat": text}."""
        return {self.kind: self.text}


_REDUCE_OPS = {"sum": "sum", "avg": "avg", "mean": "avg", "min": "min", "max": "max"}


def _placement(p, i):
    """("R",), ("P", op), ("S", dim) or ("SS", dim, split_factor) of one torch placement."""
    what = f"placements[{i}]"
    if isinstance(p, str):
        raise ValueError(f"{what} must be a torch placement object, not the string {p!r}")
    if getattr(p, "split_factor", None) is not None and hasattr(p, "dim"):
        return ("SS", _int(p.dim, f"{what}.dim", -64), _int(p.split_factor,
                                                             f"{what}.split_factor", 1))
    name = type(p).__name__
    is_shard = getattr(p, "is_shard", None)
    if name == "Shard" or (callable(is_shard) and is_shard()):
        return ("S", _int(p.dim, f"{what}.dim", -64))
    is_partial = getattr(p, "is_partial", None)
    if name in ("Partial", "_Partial") or (callable(is_partial) and is_partial()):
        op = getattr(p, "reduce_op", "sum")
        op = str(getattr(op, "name", op)).lower().rsplit(".", 1)[-1]
        if op not in _REDUCE_OPS:
            raise ValueError(f"{what} reduces with {op!r}; shardcoord has sum, avg, min, max")
        return ("P", _REDUCE_OPS[op])
    is_replicate = getattr(p, "is_replicate", None)
    if name == "Replicate" or (callable(is_replicate) and is_replicate()):
        return ("R",)
    raise ValueError(f"{what} is not a Shard, Replicate, Partial or _StridedShard: {p!r}")


def _chunk(indices, k, c):
    """torch.chunk(indices, k)[c] (pieces of ceil(n/k); trailing ones short or empty)."""
    piece = -(-len(indices) // k) if indices else 0
    return indices[c * piece:(c + 1) * piece]


def _strided(indices, k, split_factor, c):
    """torch's _StridedShard split: chunk into k*split_factor pieces, rank c concatenates
    pieces c, c+k, c+2k, ..."""
    return [i for j in range(split_factor) for i in _chunk(indices, k * split_factor, c + j * k)]


def _region(shape, mesh_shape, items, coord):
    """Per tensor dim, the (sorted) global indices the rank at `coord` holds."""
    region = [list(range(n)) for n in shape]
    for m, item in enumerate(items):
        if item[0] in ("S", "SS"):
            d = item[1] % len(shape)
            if item[0] == "S":
                region[d] = _chunk(region[d], mesh_shape[m], coord[m])
            else:
                region[d] = _strided(region[d], mesh_shape[m], item[2], coord[m])
    return region


def _runs(indices):
    runs = []
    for i in indices:
        if runs and runs[-1][1] == i:
            runs[-1][1] = i + 1
        else:
            runs.append([i, i + 1])
    return runs


def _flat_ranges(shape, region):
    """Row-major flat [start, end) ranges of the product of index lists `region`."""
    strides = [math.prod(shape[d + 1:]) for d in range(len(shape))]
    if any(not r for r in region):
        return []
    ranges = []

    def walk(d, base):
        if d == len(shape) - 1:
            for a, b in _runs(region[d]):
                if ranges and ranges[-1][1] == base + a:
                    ranges[-1][1] = base + b
                else:
                    ranges.append([base + a, base + b])
            return
        for i in region[d]:
            walk(d + 1, base + i * strides[d])

    if not shape:
        return [(0, 1)]
    walk(0, 0)
    return [tuple(r) for r in ranges]


def from_placements(mesh, placements, shape=None):
    """The Spec of a DTensor's `placements` (torch's Shard, Replicate, Partial, _StridedShard,
    duck-typed by class name and attributes) on a mesh of `mesh` dims (an int) or of shape
    `mesh` (a tuple). Shard/Replicate/Partial give "placements" text ("R,S(0)", "P(sum)",
    shardcoord applies them in mesh-dim order as DTensor does); a _StridedShard (FSDP2 over
    TP) gives "flat" text, which needs the mesh's and the tensor's `shape`."""
    if isinstance(mesh, int) and not isinstance(mesh, bool):
        mesh_shape = None
        ndim = _int(mesh, "mesh", 1)
    else:
        mesh_shape = _shape(mesh, "mesh")
        ndim = len(mesh_shape)
        if not ndim or min(mesh_shape) < 1:
            raise ValueError(f"mesh {list(mesh_shape)} must have dims >= 1")
    placements = list(placements)
    if len(placements) != ndim:
        raise ValueError(f"placements has {len(placements)} entries for a {ndim}-d mesh")
    items = [_placement(p, i) for i, p in enumerate(placements)]
    if shape is not None:
        shape = _shape(shape, "shape")
        for i, item in enumerate(items):
            if item[0] in ("S", "SS") and not -len(shape) <= item[1] < len(shape):
                raise ValueError(f"placements[{i}] shards dim {item[1]} of a "
                                 f"{len(shape)}-d shape {list(shape)}")
            if item[0] in ("S", "SS"):
                items[i] = (item[0], item[1] % len(shape)) + item[2:]
    if not any(item[0] == "SS" for item in items):
        text = ",".join({"R": lambda it: "R", "P": lambda it: f"P({it[1]})",
                         "S": lambda it: f"S({it[1]})"}[item[0]](item) for item in items)
        return Spec("placements", text)
    if mesh_shape is None or shape is None:
        raise ValueError("a _StridedShard placement needs mesh as a shape tuple and the "
                         "tensor's shape (it becomes a flat spec)")
    if any(item[0] == "P" for item in items):
        raise ValueError("placements mixes Partial with _StridedShard: a flat spec holds no "
                         "partial values")
    per_rank = []
    for rank in range(math.prod(mesh_shape)):
        coord, rest = [], rank
        for n in reversed(mesh_shape):
            coord.append(rest % n)
            rest //= n
        coord.reverse()
        per_rank.append(_flat_ranges(shape, _region(shape, mesh_shape, items, coord)))
    return Spec("flat", _flat_text(per_rank))


def from_dtensor(dt):
    """from_placements for a torch DTensor (or anything with .device_mesh, .placements and
    .shape): its mesh's shape, its placements and its global shape."""
    for attr in ("device_mesh", "placements", "shape"):
        if not hasattr(dt, attr):
            raise ValueError(f"dt has no .{attr}: not a DTensor ({type(dt).__name__})")
    mesh = dt.device_mesh
    mesh_shape = getattr(mesh, "shape", None)
    if mesh_shape is None or callable(mesh_shape):
        mesh_shape = getattr(getattr(mesh, "mesh", None), "shape", None)
    if mesh_shape is None:
        raise ValueError("dt.device_mesh has no shape")
    return from_placements(tuple(mesh_shape), dt.placements, tuple(dt.shape))
