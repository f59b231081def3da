"""Does the shipped chat plan's recommendation hold?  Plans scenarios/plan-chat-llama8b.yaml (prints
its wall time and the simulations each shortcut saved), then simulates the winner at the target rate
on N fresh seeds (never used by the plan) over 10-minute windows, judging every request (no warm-up
discarded: stricter than the plan), and prints each run's SLO attainment and whether it meets the target.

Run: nice .venv/bin/python benchmarks/bench_plan_holds.py [--runs 10] [--minutes 10] [--jobs 2]
     [--winner reports/plan-chat/winner.yaml]  (skip the plan, check a winner already written)
"""
from __future__ import annotations

import argparse
import sys
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from pdsim.plan import LocalExecutor, evaluate, load_plan, print_table, run_plan, winner_scenario  # noqa: E402


def one_run(args):
    sc, seed, minutes = args
    sc = dict(sc, seed=seed)
    w = dict(sc["workload"])
    w.pop("num_requests", None)
    w["duration_s"] = minutes * 60.0
    sc["workload"] = w
    t0 = time.perf_counter()
    r = evaluate({"scenario": sc, "file": "winner", "base_dir": str(REPO), "warmup_fraction": 0.0, "early": None})
    return seed, r, time.perf_counter() - t0


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=10)
    ap.add_argument("--minutes", type=float, default=10.0)
    ap.add_argument("--jobs", type=int, default=None)
    ap.add_argument("--winner", help="a winner.yaml to check instead of planning")
    a = ap.parse_args()
    if a.winner:
        sc = yaml.safe_load(Path(a.winner).read_text())
    else:
        plan = load_plan(REPO / "scenarios" / "plan-chat-llama8b.yaml")
        ex = LocalExecutor(a.jobs)
        t0 = time.perf_counter()
        with tempfile.TemporaryDirectory() as cache:
            res = run_plan(plan, ex, Path(cache), progress=True)
        wall = time.perf_counter() - t0
        ex.close()
        print_table(res, limit=10)
        print(f"\nplan: {wall:.1f} s wall on {ex.jobs} processes, {res['simulations']} simulations")
        sc = winner_scenario(plan, res)
        if sc is None:
            sys.exit("no winner")
    name = next(iter(sc["topologies"]))
    target = sc["slo"]["attainment_target"]
    print(f"winner {name} at {sc['workload'].get('rate')} req/s: {a.runs} fresh seeds x {a.minutes:g} min, "
          f"every request judged", flush=True)
    seeds = [900_000 + i for i in range(a.runs)]
    met = 0
    with ProcessPoolExecutor(a.jobs) as pool:
        for seed, r, s in pool.map(one_run, [(sc, seed, a.minutes) for seed in seeds]):
            att = r["ok"] / r["n"]
            met += att >= target
            ci = r["ci"]
            print(f"  seed {seed}: {r['n']:,} requests, attainment {att:.2%} (95% CI {ci[0]:.1%}-{ci[1]:.1%}), "
                  f"p90 TTFT {r['ttft_p']:.3f} s, p90 TPOT {r['tpot_p']:.4f} s: "
                  f"{'meets' if att >= target else 'MISSES'} {target:.0%}  [{s:.0f} s]", flush=True)
    print(f"{met}/{a.runs} fresh {a.minutes:g}-minute runs meet the SLO")
