"""Progress of long work (plan, sweep, calibrate, a long run) on stderr.

On a terminal: a tqdm bar (count, rate, ETA) that clears itself when done.  Not on a terminal (a
log file, CI, a pipe): quiet, apart from at most one plain line every ``log_every_s`` seconds of
wall time for work that takes that long, so a log still shows the process is alive.  ``enabled``
False (``--quiet``) silences both.  The callers' own one-line headers and summaries are not
progress and are printed regardless of the terminal.
"""
from __future__ import annotations

import sys
import time

LOG_EVERY_S = 30.0


def is_tty(stream=None) -> bool:
    stream = sys.stderr if stream is None else stream
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError):     # closed or replaced streams (pytest capture, mutmut)
        return False


class Bar:
    """``update()`` once per unit of work done; ``close()`` at the end (or use it as a context manager)."""

    def __init__(self, total: int, desc: str, unit: str = "it", enabled: bool = True,
                 log_every_s: float = LOG_EVERY_S, stream=None, tty: bool | None = None):
        self.total, self.desc, self.unit = max(int(total), 0), desc, unit
        self.stream = sys.stderr if stream is None else stream
        self.enabled = enabled
        self.tty = enabled and (is_tty(self.stream) if tty is None else tty)
        self.done = 0
        self.log_every_s = log_every_s
        self.t0 = self._last = time.perf_counter()
        self._bar = None
        if self.tty:
            try:
                from tqdm import tqdm
            except ImportError:          # tqdm is a dependency; a stripped install falls back to log lines
                self.tty = False
            else:
                self._bar = tqdm(total=self.total or None, desc=desc, unit=unit, file=self.stream,
                                 dynamic_ncols=True, leave=False, mininterval=0.2)

    def update(self, n: int = 1, note: str | None = None) -> None:
        self.done += n
        if self._bar is not None:
            if note:
                self._bar.set_postfix_str(note[:40], refresh=False)
            self._bar.update(n)
            return
        if not self.enabled:
            return
        now = time.perf_counter()
        if now - self._last >= self.log_every_s:
            self._last = now
            print(self.line(now), file=self.stream, flush=True)

    def line(self, now: float | None = None) -> str:
        """The plain log line: count, wall time, and the time left at the average pace so far."""
        el = (time.perf_counter() if now is None else now) - self.t0
        of = f"/{self.total:,}" if self.total else ""
        left = f", ~{el * (self.total - self.done) / self.done:.0f} s to go" if self.total and self.done else ""
        return f"pdsim: {self.desc}: {self.done:,}{of} {self.unit}, {el:.0f} s{left}"

    def clear(self) -> None:
        """Wipe the bar before other text goes to the same terminal."""
        if self._bar is not None:
            self._bar.clear()

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
            self._bar = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
