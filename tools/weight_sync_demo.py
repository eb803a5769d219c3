"""RL weight sync with attached tensors (tools/weight_sync_demo.sh runs this).

A coordinator and six CPU workers; four trainer processes hold the FSDP-flat shards of a small
transformer (torch.nn, fixed seed), each parameter flattened and cut into four contiguous
ranges as OLMo-core's FSDP does; two inference processes hold its Megatron tensor-parallel
shards (column-parallel weights split by rows, row-parallel ones by columns, the embedding by
vocabulary rows, norms replicated). Every process lends its shards to the worker beside it
(attached tensors: shared memory, no copy). Ten times: the trainers take an optimizer step in
their shards in place, one copy_many writes the new weights into the inference processes'
buffers in place, and each inference process checks its shards against the full state dict it
computes itself. Prints the time and bytes of every sync.

    weight_sync_demo.py --coordinator BIN --worker BIN [--steps 10] [--width 512]
    weight_sync_demo.py --role trainer|inference ...   (the processes it starts)
"""

import argparse
import json
import math
import os
import statistics
import sys
import time

_HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(_HERE, "..", "tests", "python"))

TRAINERS = 4
INFERENCE = 2
LR = 0.02


# ---- The model and its training, identical in every process -----------------------------

def build_model(width, layers, vocab, seed):
    import torch  # pylint: disable=import-outside-toplevel
    from torch import nn  # pylint: disable=import-outside-toplevel

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.norm1 = nn.LayerNorm(width)
            self.q = nn.Linear(width, width)
            self.k = nn.Linear(width, width)
            self.v = nn.Linear(width, width)
            self.o = nn.Linear(width, width)
            self.norm2 = nn.LayerNorm(width)
            self.fc1 = nn.Linear(width, 4 * width)
            self.fc2 = nn.Linear(4 * width, width)
            self.heads = 8

        def forward(self, x):
            b, t, d = x.shape
            h = self.norm1(x)
            split = lambda y: y.view(b, t, self.heads, d // self.heads).transpose(1, 2)  # noqa
            attn = torch.softmax(split(self.q(h)) @ split(self.k(h)).transpose(-1, -2) /
                                 math.sqrt(d // self.heads), dim=-1) @ split(self.v(h))
            x = x + self.o(attn.transpose(1, 2).reshape(b, t, d))
            return x + self.fc2(torch.relu(self.fc1(self.norm2(x))))

    class Model(nn.Module):
        def __init__(self):
            super().__init__()
            self.embed = nn.Embedding(vocab, width)
            self.layers = nn.ModuleList([Block() for _ in range(layers)])
            self.norm = nn.LayerNorm(width)
            self.head = nn.Linear(width, vocab, bias=False)

        def forward(self, tokens):
            x = self.embed(tokens)
            for layer in self.layers:
                x = layer(x)
            return self.head(self.norm(x))

    torch.manual_seed(seed)
    return Model()


def train_step(model, step, vocab, seed):
    """One SGD step on a batch drawn from (seed, step): the same in every process."""
    import torch  # pylint: disable=import-outside-toplevel
    g = torch.Generator().manual_seed(seed * 1000 + step)
    tokens = torch.randint(0, vocab, (4, 33), generator=g)
    logits = model(tokens[:, :-1])
    loss = torch.nn.functional.cross_entropy(logits.reshape(-1, vocab), tokens[:, 1:].reshape(-1))
    model.zero_grad()
    loss.backward()
    return float(loss)


def tp_placement(name, param):
    """Megatron tensor parallelism: "S(0)" (column-parallel weights and biases, the
    vocabulary-parallel embedding and head), "S(1)" (row-parallel weights) or "R"."""
    column = (".q.", ".k.", ".v.", ".fc1.")
    if name.startswith(("embed.", "head.")) or any(c in name for c in column):
        return "S(0)"
    if (".o." in name or ".fc2." in name) and name.endswith("weight"):
        return "S(1)"
    return "R"


def fsdp_ranges(numel, ranks):
    """Each rank's [start, end) of the flattened parameter: contiguous, as even as it gets."""
    per = -(-numel // ranks)
    return [(min(r * per, numel), min((r + 1) * per, numel)) for r in range(ranks)]


def tp_shard(tensor, placement, index, ranks):
    import torch  # pylint: disable=import-outside-toplevel
    if placement == "R":
        return tensor
    return torch.chunk(tensor, ranks, dim=int(placement[2]))[index]


# ---- The processes ----------------------------------------------------------------------

def role_main(args):
    import torch  # pylint: disable=import-outside-toplevel
    import shardcoord  # pylint: disable=import-outside-toplevel
    torch.set_num_threads(1)  # Bit-identical results in every process.
    model = build_model(args.width, args.layers, args.vocab, args.seed)
    params = dict(model.named_parameters())
    client = shardcoord.connect(args.address)
    buffers = {}
    reference, trained = model, 0  # Inference: the state dict it checks against.
    print("ready", flush=True)
    for line in sys.stdin:
        cmd = json.loads(line)
        answer = {}
        if cmd["op"] == "attach":
            with torch.no_grad():
                for name, p in params.items():
                    tensor = f"{args.role}/{name}"
                    buf = client.alloc(tensor, args.rank, framework="torch")
                    if args.role == "trainer":
                        start, end = fsdp_ranges(p.numel(), TRAINERS)[args.index]
                        buf.copy_(p.detach().reshape(-1)[start:end])
                    client.attach(tensor, args.rank, buf)
                    buffers[name] = buf
        elif cmd["op"] == "step":
            # FSDP: each rank updates its own shard (the gradient's matching ranges), in the
            # lent buffer itself; the full replica it computes with moves the same way.
            answer["loss"] = train_step(model, cmd["step"], args.vocab, args.seed)
            with torch.no_grad():
                for name, p in params.items():
                    start, end = fsdp_ranges(p.numel(), TRAINERS)[args.index]
                    buffers[name].sub_(LR * p.grad.reshape(-1)[start:end])
                    p.sub_(LR * p.grad)
        elif cmd["op"] == "verify":
            # The inference process computes the trained weights itself (its own replica,
            # stepped as the trainers do) and compares its shards with them.
            while trained < cmd["step"]:
                trained += 1
                train_step(reference, trained, args.vocab, args.seed)
                with torch.no_grad():
                    for p in reference.parameters():
                        p.sub_(LR * p.grad)
            wrong = []
            for name, p in reference.named_parameters():
                want = tp_shard(p.detach(), tp_placement(name, p), args.index, INFERENCE)
                if not torch.equal(buffers[name], want):
                    wrong.append(name)
            answer["wrong"] = wrong
        elif cmd["op"] == "exit":
            client.close()
            print(json.dumps(answer), flush=True)
            return
        print(json.dumps(answer), flush=True)


class Role:
    def __init__(self, args, role, index, rank, address):
        import subprocess  # pylint: disable=import-outside-toplevel
        argv = [sys.executable, os.path.abspath(__file__), "--role", role, "--index", str(index),
                "--rank", str(rank), "--address", address, "--width", str(args.width),
                "--layers", str(args.layers), "--vocab", str(args.vocab), "--seed",
                str(args.seed)]
        self.name = f"{role} {index} (rank {rank})"
        self.proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     text=True)
        if self.proc.stdout.readline().strip() != "ready":
            raise RuntimeError(f"{self.name} did not start")

    def send(self, **cmd):
        self.proc.stdin.write(json.dumps(cmd) + "\n")
        self.proc.stdin.flush()

    def answer(self):
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError(f"{self.name} exited ({self.proc.wait()})")
        return json.loads(line)

    def close(self):
        if self.proc.poll() is None:
            try:
                self.send(op="exit")
                self.answer()
            except (RuntimeError, OSError):
                pass
            self.proc.wait(timeout=30)


def all_do(roles, **cmd):
    """Sends `cmd` to every process at once and returns their answers."""
    for r in roles:
        r.send(**cmd)
    return [r.answer() for r in roles]


def orchestrate(args):
    import shardcoord  # pylint: disable=import-outside-toplevel
    from cluster import Cluster  # pylint: disable=import-outside-toplevel
    model = build_model(args.width, args.layers, args.vocab, args.seed)
    params = dict(model.named_parameters())
    model_bytes = sum(p.numel() * 4 for p in params.values())
    cluster = Cluster(args.coordinator, args.worker, workers=TRAINERS + INFERENCE,
                      log_dir=args.log_dir)
    roles = []
    try:
        c = shardcoord.connect(cluster.address)
        workers = c.workers()
        train = c.create_mesh("train", [TRAINERS], workers=[w.name for w in workers[:TRAINERS]])
        infer = c.create_mesh("infer", [INFERENCE], workers=[w.name for w in workers[TRAINERS:]])
        pairs = []
        for name, p in params.items():
            c.create_tensor(f"trainer/{name}", shape=list(p.shape), mesh="train", init="attached",
                            flat=[[r] for r in fsdp_ranges(p.numel(), TRAINERS)])
            c.create_tensor(f"inference/{name}", shape=list(p.shape), mesh="infer",
                            init="attached", placements=tp_placement(name, p))
            pairs.append((f"trainer/{name}", f"inference/{name}"))
        print(f"weight sync: a {args.layers}-layer transformer of width {args.width}, "
              f"{len(params)} tensors, {model_bytes / 1e6:.1f} MB of f32; "
              f"trainers: {TRAINERS} FSDP-flat ranks (mesh train), inference: {INFERENCE} "
              f"Megatron TP ranks (mesh infer)", flush=True)
        started = time.monotonic()
        trainers = [Role(args, "trainer", i, r, cluster.address)
                    for i, r in enumerate(train.ranks)]
        inference = [Role(args, "inference", i, r, cluster.address)
                     for i, r in enumerate(infer.ranks)]
        roles = trainers + inference
        all_do(roles, op="attach")
        print(f"{len(roles)} processes lent their shards to the workers beside them "
              f"({time.monotonic() - started:.1f} s)", flush=True)
        times = []
        for step in range(1, args.steps + 1):
            losses = all_do(trainers, op="step", step=step)
            t0 = time.monotonic()
            group = c.copy_many(pairs)
            elapsed = time.monotonic() - t0
            times.append(elapsed)
            verdicts = all_do(inference, op="verify", step=step)
            wrong = [w for v in verdicts for w in v["wrong"]]
            print(f"step {step:2d}: loss {losses[0]['loss']:.4f}; sync {elapsed * 1000:.0f} ms, "
                  f"{group.bytes_moved / 1e6:.1f} MB moved (lower bound "
                  f"{group.lower_bound_bytes / 1e6:.1f} MB, "
                  f"{group.bytes_moved / elapsed / 1e9:.2f} GB/s); inference shards "
                  f"{'match' if not wrong else 'DIFFER: ' + ', '.join(wrong)}", flush=True)
            if wrong:
                raise SystemExit(f"weight-sync: FAILED at step {step}")
        print(f"weight-sync: OK ({args.steps} syncs of {model_bytes / 1e6:.1f} MB: median "
              f"{statistics.median(times) * 1000:.0f} ms, best {min(times) * 1000:.0f} ms)")
    finally:
        for r in roles:
            r.close()
        cluster.stop()


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--coordinator")
    parser.add_argument("--worker")
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--width", type=int, default=512)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--vocab", type=int, default=1024)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--log-dir")
    parser.add_argument("--role", choices=["trainer", "inference"])
    parser.add_argument("--index", type=int)
    parser.add_argument("--rank", type=int)
    parser.add_argument("--address")
    args = parser.parse_args()
    if args.role:
        return role_main(args)
    if not args.coordinator or not args.worker:
        parser.error("--coordinator and --worker are required")
    return orchestrate(args)


if __name__ == "__main__":
    main()
