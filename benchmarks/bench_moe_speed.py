"""Issue #14's speed figure: a DeepSeek-R1 2P1D run of the Azure conversation trace against the dense
Llama-3.1-8B 3P1D run of the same trace, wall and CPU measured in one process (alternating, best of N).

R1: fp8 weights and KV on H200, each instance 8 GPUs with EP8 (as scenarios/moe-deepseek-pd.yaml), 2 prefill
+ 1 decode instance (DP attention on the decode instance with --dp-attention). Llama: 3 prefill + 1 decode
H100, bf16 (as benchmarks/bench_speed.py). The target is R1 <= 2x the Llama time.
Reads ../shared/traces when present (else the 10-minute slice shipped in scenarios/traces).
Run: .venv/bin/python benchmarks/bench_moe_speed.py [--repeats N] [--dp-attention]
"""
from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from pdsim import config  # noqa: E402
from pdsim.simulation import simulate  # noqa: E402

FULL = REPO.parent / "shared" / "traces" / "azure-llm-2023" / "AzureLLMInferenceTrace_conv.csv"
TRACE = FULL if FULL.is_file() else REPO / "scenarios" / "traces" / "azure_conv_10min.csv"


def scenarios(dp_attention: bool) -> dict:
    r1_pool = {"device": "h200", "tp": 8, "ep": 8}
    dec = {**r1_pool, "instances": 1, "max_running": 256, **({"dp_attention": True} if dp_attention else {})}
    return {
        "llama-3.1-8b 3P1D": {"model": "llama-3.1-8b", "topologies": {"3p1d": {
            "kind": "disaggregated", "prefill": {"instances": 3, "device": "h100-sxm"},
            "decode": {"instances": 1, "device": "h100-sxm"}, "kv_link": {"preset": "infiniband"}}}},
        "deepseek-r1 2P1D": {"model": "deepseek-r1", "weight_dtype": "fp8", "kv_dtype": "fp8", "topologies": {"2p1d": {
            "kind": "disaggregated", "prefill": {**r1_pool, "instances": 2, "max_batched_tokens": 16384},
            "decode": dec, "kv_link": {"preset": "infiniband", "layerwise_overlap": True}}}},
    }


def run(doc: dict) -> tuple[float, float, list]:
    sc = config.parse({**doc, "workload": {"arrival": "trace", "trace": {"path": str(TRACE)}}}, "bench-moe")
    t0, c0 = time.perf_counter(), time.process_time()
    res = simulate(sc)
    return time.perf_counter() - t0, time.process_time() - c0, res


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--dp-attention", action="store_true", help="DP attention on R1's decode instance")
    a = ap.parse_args()
    docs = scenarios(a.dp_attention)
    best: dict[str, tuple[float, float]] = {}
    print(f"trace: {TRACE.name}; load average {os.getloadavg()[0]:.2f}; best of {a.repeats}, alternating")
    for _ in range(a.repeats):
        for label, doc in docs.items():
            wall, cpu, res = run(doc)
            r = res[0]
            fin = sum(q.status == "finished" for q in r.requests)
            print(f"  {label:20s} wall {wall:6.2f} s  cpu {cpu:6.2f} s  {len(r.requests):,} requests "
                  f"({fin:,} finished)  {r.events:,} SimPy events")
            w, c = best.get(label, (float("inf"), float("inf")))
            best[label] = (min(w, wall), min(c, cpu))
    (lw, lc), (rw, rc) = best["llama-3.1-8b 3P1D"], best["deepseek-r1 2P1D"]
    print(f"R1 2P1D / Llama 3P1D: wall {rw / lw:.2f}x, CPU {rc / lc:.2f}x (target <= 2x)")


if __name__ == "__main__":
    main()
