"""Simulator speed: the full Azure conversation trace (19,366 requests, 1 hour) on 4 colocated
Llama-3.1-8B H100 replicas, and through colocated-4 + 3P1D in one run.

Prints simulated requests and output tokens per wall-second, SimPy events and events per second.
Reads ../shared/traces when present (else the 10-minute slice shipped in scenarios/traces).
Run: .venv/bin/python benchmarks/bench_speed.py
"""
from __future__ import annotations

import os
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from pdsim import config  # noqa: E402
from pdsim.simulation import simulate  # noqa: E402

FULL = REPO.parent / "shared" / "traces" / "azure-llm-2023" / "AzureLLMInferenceTrace_conv.csv"
trace = FULL if FULL.is_file() else REPO / "scenarios" / "traces" / "azure_conv_10min.csv"

COLO = {"kind": "colocated", "replicas": 4, "device": "h100-sxm"}
DIS = {"kind": "disaggregated", "prefill": {"instances": 3, "device": "h100-sxm"},
       "decode": {"instances": 1, "device": "h100-sxm"}, "kv_link": {"preset": "infiniband"}}


def run(topologies: dict, path=None, fast=True) -> tuple[float, list, float]:
    sc = config.parse({"model": "llama-3.1-8b",
                       "workload": {"arrival": "trace", "trace": {"path": str(path or trace)}},
                       "topologies": topologies}, "bench")
    t0, c0 = time.perf_counter(), time.process_time()
    res = simulate(sc, fast=fast)
    # CPU of this process: steadier than wall on a busy machine
    return time.perf_counter() - t0, res, time.process_time() - c0


def show(label, wall, res, cpu):
    reqs = sum(len(r.requests) for r in res)
    toks = sum(q.output_tokens for r in res for q in r.requests if q.status == "finished")
    events = sum(r.events for r in res)
    print(f"{label:24s} wall {wall:7.2f} s | cpu {cpu:7.2f} s | {reqs / wall:9.0f} req/s "
          f"| {toks / wall / 1e6:6.3f} M out-tok/s | {events:8d} SimPy events, {events / wall / 1e3:7.1f} k events/s")


print(f"trace: {trace}; load average {os.getloadavg()[0]:.2f} (wall stretches on a busy machine: compare runs "
      "taken in the same session)")
for label, topos in [("colocated-4", {"colocated-4": COLO}), ("3P1D", {"disagg-3p1d": DIS}),
                     ("colocated-4 + 3P1D", {"colocated-4": COLO, "disagg-3p1d": DIS})]:
    wall, res, cpu = run(topos)
    show(label, wall, res, cpu)

# the fast path against the step-by-step reference loop, on the 10-minute slice (same run, same machine)
SLICE = REPO / "scenarios" / "traces" / "azure_conv_10min.csv"
for label, topos in [("colocated-4", {"colocated-4": COLO}), ("3P1D", {"disagg-3p1d": DIS})]:
    wf, rf, cf = run(topos, SLICE, True)
    ws, rs, cs = run(topos, SLICE, False)
    show(f"10-min {label} fast", wf, rf, cf)
    show(f"10-min {label} step", ws, rs, cs)
    print(f"{'':24s} fast path speed-up: {ws / wf:.1f}x")
