"""Overload: scenarios/faults-overload.yaml (200 req/s, about 10x one H100 replica, 600 s simulated).

Prints wall time, peak RSS and the finished / rejected / abandoned counts per topology.
Run: .venv/bin/python benchmarks/bench_overload.py
"""
from __future__ import annotations

import resource
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from pdsim import config, metrics  # noqa: E402
from pdsim.simulation import simulate  # noqa: E402

sc = config.load(REPO / "scenarios" / "faults-overload.yaml")
t0 = time.perf_counter()
res = simulate(sc)
wall = time.perf_counter() - t0
summ = metrics.summarize(res, metrics.requests_frame(res), sc)
print(f"{len(res[0].requests):,} requests x {len(res)} topologies in {wall:.1f} s wall, "
      f"peak RSS {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:.0f} MB")
for name, s in summ.items():
    r = s["requests"]
    print(f"  {name:14s} finished {r['finished']:7,d}  rejected {r['rejected']:7,d}  abandoned {r['abandoned']:7,d}  "
          f"unfinished {r['unfinished']:5d}  TTFT p50 {s['ttft_s']['p50']:.2f} s  TPOT p50 {s['tpot_s']['p50'] * 1e3:.0f} ms")
