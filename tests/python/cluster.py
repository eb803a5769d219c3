"""A real shardcoord cluster for Python tests and demos: one coordinator and N Gloo workers
on loopback (free ports), each worker serving its local socket in a short temporary directory;
and user processes (tests/python/user_process.py) driven over pipes; the command line of the
tests and checks that start one; and what the user processes share (their command loop, the
element indices of a rank's local buffer)."""

import argparse
import json
import os
import queue
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import traceback
import urllib.request

_HERE = os.path.dirname(os.path.abspath(__file__))


class Daemon:
    """A daemon whose stdout lines are collected (stderr goes to `log`)."""

    def __init__(self, name, argv, log):
        self.name = name
        self._log = open(log, "wb")  # pylint: disable=consider-using-with
        self.proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=self._log,
                                     stdin=subprocess.DEVNULL, text=True)
        self.lines = queue.Queue()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self):
        for line in self.proc.stdout:
            self.lines.put(line.rstrip("\n"))
        self.lines.put(None)

    def wait_for(self, marker, timeout=60):
        """The first stdout line containing `marker`."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                line = self.lines.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                raise TimeoutError(f"{self.name}: no line with {marker!r} in {timeout}s") from None
            if line is None:
                raise RuntimeError(f"{self.name} exited ({self.proc.wait()}) before {marker!r}")
            if marker in line:
                return line

    def stop(self):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._log.close()


class Cluster:
    """A coordinator and `workers` workers (w0.., `backend` gloo or nccl) from the two
    binaries (bazel-bin's coordinator/coordinator and worker/worker)."""

    def __init__(self, coordinator_bin, worker_bin, workers=4, coordinator_flags=(),
                 worker_flags=(), log_dir=None, backend="gloo"):
        # Unix socket paths have at most 107 bytes: a short directory of our own under /tmp.
        self.dir = tempfile.mkdtemp(prefix="sc-", dir="/tmp")
        self.log_dir = log_dir or self.dir
        self.workers = []
        self.coordinator = None
        try:
            self.coordinator = Daemon(
                "coordinator",
                [coordinator_bin, "--listen=127.0.0.1:0", "--http-listen=127.0.0.1:0",
                 "--state=memory", *coordinator_flags],
                os.path.join(self.log_dir, "coordinator.log"))
            metrics = self.coordinator.wait_for("coordinator metrics on http://")
            self.metrics_url = re.search(r"(http://\S+)", metrics).group(1)
            line = self.coordinator.wait_for("coordinator listening on ")
            self.address = line.split("listening on ")[1].split()[0]
            for i in range(workers):
                name = f"w{i}"
                self.workers.append(Daemon(
                    name,
                    [worker_bin, f"--coordinator={self.address}", "--listen=127.0.0.1:0",
                     f"--name={name}", f"--backend={backend}",
                     f"--local-socket={self.dir}/{name}.sock", *worker_flags],
                    os.path.join(self.log_dir, f"{name}.log")))
            for w in self.workers:
                w.wait_for(f"worker {w.name} listening on ")
        except BaseException:
            self.stop()
            raise

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.stop()

    def worker_pid(self, index):
        return self.workers[index].proc.pid

    def metric(self, name):
        """The sum of every sample of metric `name` on the coordinator's /metrics."""
        return sum(self.metric_by(name, None).values())

    def metric_by(self, name, label):
        """{value of `label`: sum of metric `name`'s samples with it} on the coordinator's
        /metrics (label None: every sample under the key None)."""
        with urllib.request.urlopen(self.metrics_url, timeout=10) as r:
            text = r.read().decode()
        out = {}
        for line in text.splitlines():
            if not (line.startswith(name + "{") or line.startswith(name + " ")):
                continue
            key = None
            if label is not None:
                m = re.search(label + r'="([^"]*)"', line)
                key = m.group(1) if m else ""
            out[key] = out.get(key, 0.0) + float(line.rsplit(" ", 1)[1])
        return out

    def stop(self):
        for w in self.workers:
            if w.proc.poll() is None:
                os.kill(w.proc.pid, signal.SIGCONT)  # A paused worker must see its SIGTERM.
            w.stop()
        if self.coordinator is not None:
            self.coordinator.stop()
        shutil.rmtree(self.dir, ignore_errors=True)


class UserProcess:
    """A process that lends buffers (tests/python/user_process.py, or `script` beside it):
    each call sends one JSON command and returns its JSON answer (raising RuntimeError with
    the process's error)."""

    def __init__(self, address, name, torch=False, script="user_process.py"):
        env = dict(os.environ, SHARDCOORD_ADDR=address)
        self.name = name
        self.proc = subprocess.Popen(
            [sys.executable, os.path.join(_HERE, script)] + (["--torch"] if torch else []),
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env)
        ready = self.proc.stdout.readline()
        if not ready.startswith("ready"):
            raise RuntimeError(f"user process {name} did not start: {ready!r}")
        self.pid = int(ready.split()[1])

    def call(self, **command):
        self.send(**command)
        return self.answer()

    def send(self, **command):
        """Sends a command without waiting (several processes then work at once)."""
        self.proc.stdin.write(json.dumps(command) + "\n")
        self.proc.stdin.flush()

    def answer(self):
        """The answer to the command sent last."""
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError(f"user process {self.name} exited ({self.proc.wait()})")
        answer = json.loads(line)
        if "exception" in answer:
            raise RuntimeError(f"user process {self.name}: {answer['exception']}")
        return answer

    def kill(self):
        self.proc.kill()
        self.proc.wait()
        self._close_pipes()

    def _close_pipes(self):
        for pipe in (self.proc.stdin, self.proc.stdout):
            try:
                pipe.close()
            except OSError:
                pass

    def close(self):
        if self.proc.poll() is None:
            try:
                self.call(op="exit")
            except (RuntimeError, BrokenPipeError, OSError):
                pass
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._close_pipes()


def binaries_parser():
    """The command line of a test or check that starts a Cluster: --coordinator and --worker,
    the daemons' binaries (a caller adds its own arguments)."""
    parser = argparse.ArgumentParser()
    parser.add_argument("--coordinator", required=True)
    parser.add_argument("--worker", required=True)
    return parser


def parse_test_args():
    """A unittest file's command line: the binaries (binaries_parser) and the argv that
    unittest.main gets (the rest)."""
    args, rest = binaries_parser().parse_known_args()
    return args, [sys.argv[0], *rest]


def serve_commands(target, error_answer):
    """The user process's side of UserProcess: says "ready PID", then answers each JSON
    command line on stdin ({"op": name, args...}) with target.name(**args) as one JSON line;
    error_answer(e) for a shardcoord.Error e, {"exception": its traceback} for anything else.
    Returns True at {"op": "exit"}, unanswered (the caller answers {} as it exits), and
    False at the end of stdin."""
    import shardcoord  # pylint: disable=import-outside-toplevel  (only the user processes)
    print(f"ready {os.getpid()}", flush=True)
    for line in sys.stdin:
        command = json.loads(line)
        op = command.pop("op")
        if op == "exit":
            return True
        try:
            answer = getattr(target, op)(**command)
        except shardcoord.Error as e:
            answer = error_answer(e)
        except Exception:  # pylint: disable=broad-except
            answer = {"exception": traceback.format_exc()}
        print(json.dumps(answer), flush=True)
    return False


def local_flat_indices(shape, rc):
    """Where each element of a rank's local buffer sits in the whole tensor of `shape`: for
    each non-empty chunk of `rc` (a RankChunks), its local_offset and the flat row-major
    indices of its box's elements, in the order the local buffer lays them out (the box
    row-major from local_offset)."""
    import numpy as np  # pylint: disable=import-outside-toplevel  (only the user processes)
    strides = [int(np.prod(shape[d + 1:])) for d in range(len(shape))]
    for chunk in rc.chunks:
        box = chunk.box
        if any(n == 0 for n in box.shape):
            continue
        index = np.zeros([1] * len(shape), dtype=np.int64)
        for d in range(len(shape)):
            axis = (np.arange(box.shape[d], dtype=np.int64) + box.offset[d]) * strides[d]
            index = index + axis.reshape([-1 if e == d else 1 for e in range(len(shape))])
        yield chunk.local_offset, index.reshape(-1)
