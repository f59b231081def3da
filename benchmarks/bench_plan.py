"""Capacity-planning speed: a plan of 48 configs (H100/A100, colocated TP x replicas x chunking,
disaggregated P x D) with a goodput search per config on the Azure conversation trace.

Prints configs, simulations run, wall time (target: under 10 minutes on a 2-core machine), the
winner, and a second run's wall time from the result cache.
Run: .venv/bin/python benchmarks/bench_plan.py
"""
from __future__ import annotations

import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from pdsim.plan import LocalExecutor, parse_plan, print_table, run_plan  # noqa: E402

FULL = REPO.parent / "shared" / "traces" / "azure-llm-2023" / "AzureLLMInferenceTrace_conv.csv"
trace = FULL if FULL.is_file() else REPO / "scenarios" / "traces" / "azure_conv_10min.csv"

RAW = {
    "name": "bench-plan-azure-conv", "model": "llama-3.1-8b",
    "workload": {"arrival": "trace", "trace": {"path": str(trace)}, "num_requests": 1000},
    "slo": {"ttft_s": 1.0, "tpot_s": 0.05, "attainment_target": 0.9},
    "objective": "goodput_per_usd",
    "search": {"devices": ["h100-sxm", {"name": "a100-80gb-sxm", "price_per_hour_usd": 1.8}],
               "colocated": {"tp": [1, 2], "replicas": [1, 2, 4, 8], "chunked_prefill": [None, 512]},
               "disaggregated": {"prefill_instances": [1, 2, 3, 4], "decode_instances": [1, 2]}},
    "budget": {"max_gpus": 16},
    "goodput": {"tolerance": 0.05, "seeds": 2},
}

if __name__ == "__main__":
    plan = parse_plan(RAW, "bench_plan", REPO)
    print(f"trace: {trace}\n{len(plan.configs)} configs ({len(plan.excluded)} excluded)", flush=True)
    with tempfile.TemporaryDirectory() as cache:
        ex = LocalExecutor()
        t0 = time.perf_counter()
        res = run_plan(plan, ex, Path(cache), progress=True)
        cold = time.perf_counter() - t0
        print_table(res, limit=12)
        print(f"\ncold: {cold:.1f} s wall, {res['simulations']} simulations on {ex.jobs} processes "
              f"({res['simulations'] / cold:.1f} sims/s)")
        t0 = time.perf_counter()
        res2 = run_plan(plan, ex, Path(cache))
        print(f"warm (cache): {time.perf_counter() - t0:.1f} s wall, {res2['simulations']} simulated, "
              f"{res2['cached']} cached; same winner: {res2['winner'] == res['winner']}")
        ex.close()
