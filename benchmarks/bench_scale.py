"""Scale: 10 k, 100 k and 1 M synthetic chat requests (Poisson) on 32 colocated Llama-3.1-8B H100 replicas.

Each size runs in its own process so its peak RSS is its own.  Prints wall time (simulation, and
simulation + writing requests.csv/summary.json/timeseries.csv), peak RSS, SimPy events, and the
growth of wall time per request from one size to the next (linear scaling = ratio ~1).
Run: .venv/bin/python benchmarks/bench_scale.py [sizes...]
"""
from __future__ import annotations

import json
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

RATE_PER_INSTANCE = 4.0     # requests/s per replica: busy but stable for these lengths


def one(n: int) -> dict:
    from pdsim import config
    from pdsim.output import write_outputs
    from pdsim.simulation import simulate
    sc = config.parse({
        "model": "llama-3.1-8b", "seed": 1,
        "workload": {"arrival": "poisson", "rate": RATE_PER_INSTANCE * 32, "num_requests": n,
                     "prompt_tokens": {"dist": "lognormal", "mean": 1000, "cv": 1.0, "max": 8000},
                     "output_tokens": {"dist": "lognormal", "mean": 250, "cv": 1.0, "max": 2000}},
        "topologies": {"colocated-32": {"kind": "colocated", "replicas": 32, "device": "h100-sxm"}}}, "bench")
    t0 = time.perf_counter()
    res = simulate(sc)
    t_sim = time.perf_counter() - t0
    toks = sum(q.output_tokens for q in res[0].requests if q.status == "finished")
    t1 = time.perf_counter()                        # the count above is not part of either wall time
    with tempfile.TemporaryDirectory() as d:
        # as `pdsim run` does: the Request objects are dropped as the requests frame is built
        write_outputs(res, sc, Path(d), wall_s=t_sim, report=False, release=True)
    t_all = t_sim + time.perf_counter() - t1
    return {"n": n, "sim_s": t_sim, "total_s": t_all, "events": res[0].events, "out_tokens": toks,
            "peak_rss_MB": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}


if __name__ == "__main__":
    if len(sys.argv) > 2 and sys.argv[1] == "--one":
        print(json.dumps(one(int(sys.argv[2]))))
        sys.exit(0)
    sizes = [int(x) for x in sys.argv[1:]] or [10_000, 100_000, 1_000_000]
    prev = None
    for n in sizes:
        out = subprocess.run([sys.executable, __file__, "--one", str(n)], capture_output=True, text=True)
        if out.returncode:
            print(out.stderr[-2000:])
            sys.exit(1)
        r = json.loads(out.stdout.strip().splitlines()[-1])
        growth = "" if prev is None else \
            f" | wall per request x{(r['total_s'] / r['n']) / (prev['total_s'] / prev['n']):.2f} vs previous size"
        print(f"{n:>9,d} requests: sim {r['sim_s']:7.1f} s, with outputs {r['total_s']:7.1f} s, "
              f"peak RSS {r['peak_rss_MB']:7.0f} MB, {r['events']:>9,d} events "
              f"({r['events'] / r['sim_s'] / 1e3:.0f} k/s), {r['out_tokens'] / r['sim_s'] / 1e6:.2f} M out-tok/s{growth}",
              flush=True)
        prev = r
