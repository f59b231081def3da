"""Start and finish: process wall of small CLI runs, imports and outputs included.

  pdsim --help                                        (imports only)
  pdsim run scenarios/quickstart.yaml --no-report     (imports + 3 topologies x 1,500 requests + CSVs)

Each is run --runs times in a fresh interpreter; prints the median and min wall and the median
CPU (user + sys) of the process, and the load average before and after (a busy machine stretches
wall time: compare figures taken in the same session).  --pythonpath DIR runs another checkout's
pdsim (e.g. `git archive <commit> | tar -x -C DIR`) for a before/after in one session.
Run: .venv/bin/python benchmarks/bench_start.py [--runs 5] [--pythonpath DIR]
"""
from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def timed(cmd: list[str], env: dict, cwd: Path) -> tuple[float, float]:
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    subprocess.run(cmd, env=env, cwd=cwd, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return wall, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--pythonpath", help="a checkout whose pdsim to run instead of this one")
    a = ap.parse_args()
    env = dict(os.environ)
    root = REPO
    if a.pythonpath:
        root = Path(a.pythonpath).resolve()
        env["PYTHONPATH"] = str(root)
    print(f"pdsim from {root}; load average {os.getloadavg()[0]:.2f}")
    with tempfile.TemporaryDirectory() as tmp:
        cases = [("pdsim --help", [sys.executable, "-m", "pdsim", "--help"]),
                 ("run quickstart --no-report", [sys.executable, "-m", "pdsim", "run", "scenarios/quickstart.yaml",
                                                 "--no-report", "--quiet", "--out", os.path.join(tmp, "qs")])]
        for label, cmd in cases:
            runs = [timed(cmd, env, root) for _ in range(a.runs)]
            walls, cpus = [w for w, _ in runs], [c for _, c in runs]
            print(f"{label:28s} wall median {statistics.median(walls):6.2f} s  min {min(walls):6.2f} s  "
                  f"| cpu median {statistics.median(cpus):6.2f} s  ({a.runs} runs)")
    print(f"load average after: {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
