"""What the speculative-decoding path costs in simulator speed, on the Azure conversation trace's 10-minute
slice (scenarios/traces) replayed at 2x: 3P1D Llama-3.1-8B on H100, decode pool

- plain, with the multi-step fast path (the default),
- plain, step by step (``fast=False``: what a speculative pool gives up),
- speculative (Llama-3.2-1B draft, k=3, acceptance 0.7; the fast path is off in speculative pools).

Prints wall seconds (least of ``--repeat`` runs), SimPy events and output tokens per decode step.
Run: .venv/bin/python benchmarks/bench_speculative.py [--repeat 3]
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from pdsim import config  # noqa: E402
from pdsim.simulation import simulate  # noqa: E402

SLICE = REPO / "scenarios" / "traces" / "azure_conv_10min.csv"
SPEC = {"method": "draft", "draft_model": "llama-3.2-1b", "k": 3, "acceptance": 0.7}


def topo(spec=None) -> dict:
    dec = {"instances": 1, "device": "h100-sxm"}
    if spec:
        dec["speculative"] = spec
    return {"kind": "disaggregated", "prefill": {"instances": 3, "device": "h100-sxm"}, "decode": dec,
            "kv_link": {"preset": "infiniband"}}


def run(spec, fast: bool, repeat: int):
    sc = config.parse({"model": "llama-3.1-8b", "workload": {"arrival": "trace",
                       "trace": {"path": str(SLICE), "rate_scale": 2}}, "topologies": {"3p1d": topo(spec)}}, "bench")
    best = None
    for _ in range(repeat):
        t0 = time.perf_counter()
        res = simulate(sc, fast=fast)
        wall = time.perf_counter() - t0
        best = wall if best is None else min(best, wall)
    return best, res[0]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeat", type=int, default=3)
    a = ap.parse_args()
    print(f"trace: {SLICE} (x2 rate)")
    rows = [("plain, fast path", None, True), ("plain, step by step", None, False),
            ("speculative (fast path off)", SPEC, True)]
    walls = {}
    for label, spec, fast in rows:
        wall, r = run(spec, fast, a.repeat)
        walls[label] = wall
        dec = r.topology.pools[1]
        steps = sum(i.steps for i in dec.instances)
        toks = sum(q.output_tokens - 1 for q in r.requests if q.status == "finished")
        tpot = sorted(q.finish_s - q.first_token_s for q in r.requests if q.output_tokens > 1)
        print(f"{label:30s} wall {wall:6.2f} s | {r.events:8d} SimPy events | decode steps {steps:7d} | "
              f"decode tokens per step {toks / steps:6.2f} | requests {len(r.requests)}")
    print(f"speculative vs plain fast path: {walls['speculative (fast path off)'] / walls['plain, fast path']:.2f}x "
          f"wall; plain step by step vs fast path: {walls['plain, step by step'] / walls['plain, fast path']:.2f}x")


if __name__ == "__main__":
    main()
