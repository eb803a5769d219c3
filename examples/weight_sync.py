"""Weight sync between a trainer and an inference engine, through shardcoord.

The setting of RL post-training: a trainer keeps its model FSDP-sharded (each of its ranks owns
one contiguous piece of the flattened parameters), an inference engine keeps the same model
Megatron tensor-parallel (each of its ranks owns a slice of every matrix), and after every
optimizer step the engine must serve the new weights. Here, on one machine:

  - 4 trainer processes, a torch c10d group on Gloo among them. Each owns its FSDP-flat shard
    of a tiny two-layer MLP (fixed seed). A training step is FSDP's: all-gather the shards into
    the full parameters, forward and backward on this rank's batch, all-reduce the gradients,
    and an SGD update of the rank's own shard, in place.
  - 2 engine processes, their own c10d group on Gloo. Each holds its tensor-parallel shards
    (up_proj split by rows, down_proj by columns) and computes the MLP's forward with one
    all-reduce per layer, as Megatron does.
  - shardcoord moves the weights: each trainer *lends* its shard (the workers read it in
    place), each engine *receives* its shards (the workers write them in place), and the
    driver prepares one *transfer* from the trainer's tensors to the engine's and runs it
    after every step.

After every step each engine compares its forward on a fixed input with the trainer's forward
of the full model, and the driver prints one line per step:

    step 3: engine output matches trainer (max abs diff 5.96e-08)

It exits non-zero on a mismatch.

    python examples/weight_sync.py --coordinator 127.0.0.1:7400   # a running cluster, >= 4 workers
    python examples/weight_sync.py --local   # its own cluster from bazel-bin (the daemons'
        # paths: --coordinator-bin, --worker-bin)
"""

import argparse
import multiprocessing as mp
import os
import socket
import sys
import traceback

import shardcoord
from shardcoord import layouts

TRAINERS, ENGINES = 4, 2
HIDDEN, FFN, LAYERS = 16, 36, 2
SEED, LR = 29, 0.05
TOLERANCE = 1e-4   # Sums in another order (the engine's all-reduce) round differently.
PREFIX = "weight_sync."  # Every mesh, tensor and transfer of this example is named so.


# ---- The model: the same in every process ------------------------------------------------

def parameter_shapes():
    """{name: shape} in the model's order. Llama-style names, so that layouts.megatron_tp
    knows which are column-parallel (up_proj: S(0)) and row-parallel (down_proj: S(1))."""
    shapes = {}
    for i in range(LAYERS):
        shapes[f"layers.{i}.mlp.up_proj.weight"] = (FFN, HIDDEN)
        shapes[f"layers.{i}.mlp.up_proj.bias"] = (FFN,)
        shapes[f"layers.{i}.mlp.down_proj.weight"] = (HIDDEN, FFN)
        shapes[f"layers.{i}.mlp.down_proj.bias"] = (HIDDEN,)
    return shapes


def initial_parameters():
    import torch
    g = torch.Generator().manual_seed(SEED)
    return {n: torch.randn(s, generator=g) * 0.3 for n, s in parameter_shapes().items()}


def forward(p, x):
    """The full model: x + down(relu(up(x))) per layer."""
    import torch
    for i in range(LAYERS):
        m = f"layers.{i}.mlp."
        h = torch.relu(x @ p[m + "up_proj.weight"].T + p[m + "up_proj.bias"])
        x = x + h @ p[m + "down_proj.weight"].T + p[m + "down_proj.bias"]
    return x


def fixed_input():
    import torch
    return torch.randn(3, HIDDEN, generator=torch.Generator().manual_seed(SEED + 1))


# ---- A trainer process: FSDP-flat shards, c10d on Gloo -----------------------------------

def trainer(index, rank, address, gloo_port, pipe):
    import torch
    import torch.distributed as dist
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{gloo_port}",
                            rank=index, world_size=TRAINERS)
    shapes = parameter_shapes()
    numels = [int(torch.Size(s).numel()) for s in shapes.values()]
    total = sum(numels)
    # FSDP's flat parameter: every parameter flattened and concatenated, cut into TRAINERS
    # pieces of ceil(total / TRAINERS) (padded at the end). This rank keeps only its piece.
    piece = -(-total // TRAINERS)
    start, end = layouts.fsdp_rank_range(list(shapes.values()), TRAINERS, index)
    flat = torch.cat([p.reshape(-1) for p in initial_parameters().values()])
    shard = flat[start:end].clone()

    # The state dict this rank lends: per parameter, the view of `shard` holding that
    # parameter's elements (possibly empty). layouts.fsdp_flat gives the same ranges as the
    # layout the driver registered, so the worker finds exactly the bytes it expects.
    local, offset = {}, 0
    for (name, _), n in zip(shapes.items(), numels):
        lo, hi = max(offset, start), min(offset + n, end)
        local[PREFIX + "trainer." + name] = shard[lo - start:max(lo, hi) - start]
        offset += n

    def full_parameters():
        """All-gather the shards into the full parameters (FSDP's unshard)."""
        padded = torch.zeros(piece)
        padded[:shard.numel()] = shard
        pieces = [torch.zeros(piece) for _ in range(TRAINERS)]
        dist.all_gather(pieces, padded)
        full = torch.cat(pieces)[:total]
        return {n: t.reshape(s) for (n, s), t in zip(shapes.items(), full.split(numels))}

    client = shardcoord.connect(address)
    serve(pipe, {
        "lend": lambda: len(client.lend(rank, local, progress=False)),
        "step": lambda step: train_step(step, index, shard, start, full_parameters),
        "forward": lambda: forward(full_parameters(), fixed_input()).tolist(),
    })


def train_step(step, index, shard, start, full_parameters):
    import torch
    import torch.distributed as dist
    params = {n: t.clone().requires_grad_() for n, t in full_parameters().items()}
    # Data parallelism: each rank its own batch, from (seed, step, rank).
    g = torch.Generator().manual_seed(SEED * 1000 + step * TRAINERS + index)
    x = torch.randn(8, HIDDEN, generator=g)
    loss = ((forward(params, x) - x.flip(1)) ** 2).mean()   # Learn to reverse the input.
    loss.backward()
    grad = torch.cat([p.grad.reshape(-1) for p in params.values()])
    dist.all_reduce(grad)                  # Gloo has no reduce_scatter: all-reduce, then slice.
    grad /= TRAINERS
    with torch.no_grad():
        shard -= LR * grad[start:start + shard.numel()]   # In place: the lent memory changes.
    losses = torch.tensor([loss.item()])
    dist.all_reduce(losses)
    return losses.item() / TRAINERS


# ---- An engine process: Megatron tensor-parallel shards, c10d on Gloo --------------------

def engine(index, rank, address, gloo_port, pipe):
    import torch
    import torch.distributed as dist
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{gloo_port}",
                            rank=index, world_size=ENGINES)
    client = shardcoord.connect(address)
    # Zeroed buffers of this rank's shards, shaped as the layout places them (up_proj's rows
    # [i*FFN/2, (i+1)*FFN/2), down_proj's columns, the replicated down_proj bias whole).
    # shardcoord writes every transfer's result into them in place.
    weights = {name: torch.zeros(client.local_shape(PREFIX + "engine." + name, rank))
               for name in parameter_shapes()}

    def tp_forward():
        """Megatron's MLP: the column-parallel up_proj needs no communication, the
        row-parallel down_proj gives each rank a partial sum, all-reduced."""
        x = fixed_input()
        for i in range(LAYERS):
            m = f"layers.{i}.mlp."
            h = torch.relu(x @ weights[m + "up_proj.weight"].T + weights[m + "up_proj.bias"])
            partial = h @ weights[m + "down_proj.weight"].T
            dist.all_reduce(partial)
            x = x + partial + weights[m + "down_proj.bias"]
        return x

    def check(expected):
        return float((tp_forward() - torch.tensor(expected)).abs().max())

    serve(pipe, {
        "receive": lambda: len(client.receive(
            rank, {PREFIX + "engine." + n: w for n, w in weights.items()}, progress=False)),
        "check": check,
    })


def serve(pipe, ops):
    """A child's loop: (op, args) from the driver, the result (or the error) back."""
    while True:
        op, args = pipe.recv()
        if op == "exit":
            return
        try:
            pipe.send(("ok", ops[op](*args)))
        except Exception:  # pylint: disable=broad-except
            pipe.send(("error", traceback.format_exc()))


# ---- The driver ------------------------------------------------------------------------------

class Group:
    """Processes running `target(index, rank, address, gloo_port, pipe)`, one per rank."""

    def __init__(self, target, ranks, address):
        ctx = mp.get_context("spawn")
        port = free_port()
        self.pipes, self.procs = [], []
        for index, rank in enumerate(ranks):
            ours, theirs = ctx.Pipe()
            proc = ctx.Process(target=target, args=(index, rank, address, port, theirs))
            proc.start()
            theirs.close()   # So that a dead child shows as EOFError on our end.
            self.pipes.append(ours)
            self.procs.append(proc)

    def all(self, op, *args):
        """Sends `op` to every process at once (collectives need all of them) and returns
        their results; a failure raises RuntimeError with the child's traceback."""
        for p in self.pipes:
            p.send((op, args))
        out = []
        for i, p in enumerate(self.pipes):
            try:
                status, value = p.recv()
            except EOFError:
                raise RuntimeError(f"process {i} died ({self.procs[i].exitcode})") from None
            if status == "error":
                raise RuntimeError(f"process {i}: {value}")
            out.append(value)
        return out

    def close(self):
        for p, proc in zip(self.pipes, self.procs):
            try:
                p.send(("exit", ()))
            except OSError:
                pass
            proc.join(timeout=30)
            if proc.is_alive():
                proc.kill()
                proc.join()


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def clean(c):
    """Drops what an earlier run of this example left on the cluster."""
    for t in c.transfers():
        if t.name.startswith(PREFIX):
            c.delete_transfer(t.name)
    if c.tensors(prefix=PREFIX):
        c.delete_tensors(prefix=PREFIX)
    for m in c.meshes():
        if m.name.startswith(PREFIX):
            c.delete_mesh(m.name)


def sync(address, steps):
    c = shardcoord.connect(address)
    clean(c)
    workers = [w.name for w in c.workers()]
    if len(workers) < TRAINERS:
        raise SystemExit(f"weight_sync: the cluster at {address} has {len(workers)} workers; "
                         f"this example needs {TRAINERS}")
    # Two meshes over the workers: the trainer's 4 ranks, the engine's 2 (on the last two
    # workers; a worker serves a rank of each mesh it belongs to).
    train = c.create_mesh(PREFIX + "train", [TRAINERS], workers=workers[:TRAINERS])
    infer = c.create_mesh(PREFIX + "engine", [ENGINES], workers=workers[-ENGINES:])

    # Register the model twice, in one call each: FSDP-flat on the trainer's mesh, Megatron
    # TP on the engine's; "attached": the bytes live in the processes, lent to the workers.
    shapes = parameter_shapes()
    c.register({PREFIX + "trainer." + n: s for n, s in shapes.items()}, train.name,
               "fsdp_flat", dtype="f32", init="attached")
    c.register({PREFIX + "engine." + n: s for n, s in shapes.items()}, infer.name,
               "megatron_tp", dtype="f32", init="attached")
    print(f"model: {len(shapes)} tensors; trainer: {TRAINERS} FSDP-flat ranks, engine: "
          f"{ENGINES} TP ranks, placed so:")
    for n, s in shapes.items():
        print(f"  {n:30s} {str(list(s)):9s} engine: "
              f"{layouts.megatron_tp(n, s, tp=ENGINES)}")

    groups = []
    try:
        trainers = Group(trainer, list(train.ranks), address)
        groups.append(trainers)
        engines = Group(engine, list(infer.ranks), address)
        groups.append(engines)
        trainers.all("lend")
        engines.all("receive")
        print(f"{TRAINERS} trainer processes lent their FSDP shards, {ENGINES} engine "
              f"processes their TP buffers")

        # One prepared transfer: every trainer tensor into its engine tensor. Prepared once
        # (the plan is cut and handed to the workers now); each run only moves bytes.
        info = c.transfer(PREFIX + "step", [(PREFIX + "trainer." + n, PREFIX + "engine." + n)
                                            for n in shapes])
        print(f"transfer '{info.name}': {info.members} tensors, {info.bytes} bytes")

        failed = 0
        for step in range(steps + 1):
            loss = ""
            if step:   # Step 0 checks the initial weights.
                loss = f", loss {trainers.all('step', step)[0]:.4f}"
            run = c.run(PREFIX + "step")
            expected = trainers.all("forward")[0]
            diff = max(engines.all("check", expected))
            ok = diff <= TOLERANCE
            failed += not ok
            print(f"step {step}: engine output {'matches' if ok else 'DIFFERS FROM'} trainer "
                  f"(max abs diff {diff:.3g}){loss}; {run['bytes_moved']} bytes moved in "
                  f"{run['seconds'] * 1000:.1f} ms", flush=True)
    finally:
        for g in groups:
            g.close()
        clean(c)
        c.close()
    if failed:
        raise SystemExit(f"weight_sync: {failed} of {steps + 1} checks failed")
    print(f"weight_sync: OK ({steps + 1} checks)")


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--coordinator", help="address of a running coordinator "
                        "(default $SHARDCOORD_ADDR, then 127.0.0.1:7400)")
    parser.add_argument("--local", action="store_true",
                        help="start a coordinator and 4 workers of our own on loopback")
    repo = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
    parser.add_argument("--coordinator-bin",
                        default=os.path.join(repo, "bazel-bin/coordinator/coordinator"))
    parser.add_argument("--worker-bin", default=os.path.join(repo, "bazel-bin/worker/worker"))
    parser.add_argument("--steps", type=int, default=5)
    args = parser.parse_args()
    try:
        import torch  # noqa: F401  pylint: disable=import-outside-toplevel,unused-import
    except ImportError:
        raise SystemExit("weight_sync: needs torch in this interpreter (pip install torch, or "
                         "apt-get install python3-torch)") from None
    if not args.local:
        return sync(args.coordinator or shardcoord.default_address(), args.steps)
    # tests/python/cluster.py starts the daemons (free ports, sockets in a temp dir) and
    # stops them at the end.
    sys.path.insert(0, os.path.join(repo, "tests", "python"))
    from cluster import Cluster  # pylint: disable=import-outside-toplevel
    for path in (args.coordinator_bin, args.worker_bin):
        if not os.access(path, os.X_OK):
            raise SystemExit(f"weight_sync: {path} is not an executable (bazel build "
                             "//coordinator //worker, or pass --coordinator-bin/--worker-bin)")
    cluster = Cluster(args.coordinator_bin, args.worker_bin, workers=TRAINERS)
    try:
        return sync(cluster.address, args.steps)
    finally:
        cluster.stop()


if __name__ == "__main__":
    main()
