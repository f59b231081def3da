"""How fast bad input is refused: the timings that used to be wall-clock asserts in tests/test_fuzz.py.

The tests check *that* each input is refused with one clear line; this prints *how long* it took,
next to the budget the tests used to assert (a figure, not a pass/fail: wall time depends on the
machine and its load).  Run: .venv/bin/python benchmarks/bench_input_guards.py
"""
from __future__ import annotations

import shutil
import sys
import tempfile
import time
import tracemalloc
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from pdsim import config  # noqa: E402
from pdsim.__main__ import main  # noqa: E402
from pdsim.errors import PdsimError  # noqa: E402
from pdsim.traces import MAX_LINE_BYTES, load_trace  # noqa: E402


def laughs(levels: int, width: int = 10) -> str:
    lines = ["l0: &l0 [lol]"]
    for i in range(1, levels):
        lines.append(f"l{i}: &l{i} [" + ", ".join([f"*l{i - 1}"] * width) + "]")
    return "\n".join(lines) + "\n"


def timed(name: str, budget_s: float, fn) -> None:
    t0 = time.perf_counter()
    try:
        fn()
        outcome = "accepted (!)"
    except PdsimError as exc:
        outcome = str(exc).splitlines()[0][:60]
    dt = time.perf_counter() - t0
    print(f"{name:<34} {dt * 1e3:9.1f} ms   (tests used to assert < {budget_s:g} s)   {outcome}")


def main_() -> None:
    tmp = Path(tempfile.mkdtemp(prefix="pdsim-guards-"))

    def write(name, data):
        p = tmp / name
        p.write_bytes(data if isinstance(data, bytes) else data.encode())
        return p

    bomb = write("bomb.yaml", laughs(9))                       # 10^9 leaves when expanded
    timed("billion laughs (libyaml)", 5, lambda: config.load(bomb))
    for depth in (2_000, 100_000):
        p = write(f"deep{depth}.yaml", "name: " + "[" * depth + "]" * depth + "\n")
        timed(f"flow nesting depth {depth:,}", 5, lambda p=p: config.load(p))
    saved = config._Loader
    config._Loader = config._PyLoader
    try:
        deep = write("deep-py.yaml", "name: " + "[" * 20_000 + "]" * 20_000)
        timed("pure-Python parser, depth 20,000", 5, lambda: config.load(deep))
        timed("pure-Python parser, laughs", 5, lambda: config.load(bomb))
    finally:
        config._Loader = saved
    huge = tmp / "huge.yaml"
    with huge.open("wb") as f:
        f.truncate(config.MAX_YAML_BYTES + 1)
    timed("17 MiB scenario file (size cap)", 1, lambda: config.load(huge))
    long = tmp / "long.csv"
    with long.open("wb") as f:
        f.write(b"arrived_at,num_prefill_tokens,num_decode_tokens\n")
        f.write(b"1" * (4 * MAX_LINE_BYTES) + b"\n")
    tracemalloc.start()
    timed(f"trace line of {4 * MAX_LINE_BYTES >> 20} MiB", 2, lambda: load_trace(long, "vidur"))
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    print(f"{'':<34} peak traced memory {peak / 2**20:.1f} MiB (cap per line {MAX_LINE_BYTES / 2**20:.1f} MiB)")
    t0 = time.perf_counter()
    rc = main(["run", str(bomb), "--out", str(tmp / "out"), "--quiet"])
    print(f"{'CLI run of the bomb (exit ' + str(rc) + ')':<34} {(time.perf_counter() - t0) * 1e3:9.1f} ms   "
          "(tests used to assert < 10 s)")
    shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main_()
