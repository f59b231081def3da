"""Progress output (pdsim.progress): a bar on a terminal, quiet in a log, silent with --quiet."""
from __future__ import annotations

import io

from pdsim import progress
from pdsim.progress import Bar


class _Tty(io.StringIO):
    def isatty(self):
        return True


def test_not_a_terminal_is_quiet_until_the_log_interval_then_one_line_with_eta(monkeypatch):
    out = io.StringIO()
    clock = iter([0.0, 1.0, 2.0, 40.0, 41.0])
    monkeypatch.setattr(progress.time, "perf_counter", lambda: next(clock))
    bar = Bar(4, "plan", unit="sim", stream=out)           # t0 = 0
    bar.update()                                            # 1 s: quiet
    bar.update()                                            # 2 s: quiet
    bar.update()                                            # 40 s >= 30 s: one line; 3 of 4 in 40 s -> ~13 s left
    bar.close()
    lines = out.getvalue().splitlines()
    assert lines == ["pdsim: plan: 3/4 sim, 40 s, ~13 s to go"]


def test_quiet_prints_nothing_even_on_a_terminal():
    out = _Tty()
    with Bar(3, "sweep", enabled=False, stream=out, log_every_s=0.0) as bar:
        for _ in range(3):
            bar.update()
    assert out.getvalue() == "" and bar.done == 3


def test_a_terminal_gets_a_bar_that_counts_and_clears_itself():
    out = _Tty()
    with Bar(5, "calibrate", unit="shapes", stream=out) as bar:
        for _ in range(5):
            bar.update(1, "gemm M=128")
        assert bar.tty and bar._bar.n == 5 and "calibrate" in out.getvalue()
    assert out.getvalue().rsplit("\r", 1)[-1].strip() == ""     # leave=False: the last line is wiped


def test_a_closed_stream_counts_as_no_terminal():
    s = io.StringIO()
    s.close()
    assert progress.is_tty(s) is False


def test_the_plan_executor_ticks_once_per_simulation():
    from pdsim.plan import LocalExecutor
    ticks = []
    out = LocalExecutor(jobs=1).map(abs, [-1, -2, -3], on_done=lambda: ticks.append(1))
    assert out == [1, 2, 3] and len(ticks) == 3
