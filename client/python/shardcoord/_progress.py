"""Progress of the calls on a whole model (lend, receive): tqdm-like text on stderr when it
is a terminal, nothing otherwise (logs, CI, pipes)."""

import sys
import time


class Progress:
    """`label: done/total what` rewritten in place (at most every 0.1 s), and a last line
    with its outcome. Silent unless `stream` (default sys.stderr) is a terminal."""

    def __init__(self, label, total, what="buffers", stream=None):
        self.stream = stream if stream is not None else sys.stderr
        isatty = getattr(self.stream, "isatty", None)
        try:
            self.enabled = bool(isatty and isatty())
        except (OSError, ValueError):
            self.enabled = False
        self.label = label
        self.total = total
        self.what = what
        self._start = time.monotonic()
        self._shown = 0.0

    def update(self, done, note=""):
        if not self.enabled:
            return
        now = time.monotonic()
        if done < self.total and now - self._shown < 0.1:
            return
        self._shown = now
        width = 24
        filled = width * done // max(self.total, 1)
        bar = "#" * filled + "." * (width - filled)
        self._write(f"\r{self.label}: [{bar}] {done}/{self.total} {self.what}"
                    f"{' ' + note if note else ''}")

    def close(self, outcome):
        if not self.enabled:
            return
        seconds = time.monotonic() - self._start
        self._write(f"\r{self.label}: {outcome} in {seconds:.2f} s\x1b[K\n")

    def _write(self, text):
        try:
            self.stream.write(text)
            self.stream.flush()
        except (OSError, ValueError):
            self.enabled = False
