"""A 200 k-request run completes with every request accounted for (its peak RSS is printed by
benchmarks/bench_scale.py, not asserted here)."""
from __future__ import annotations

from conftest import scenario
from pdsim.simulation import simulate


def test_200k_requests_complete_and_conserve():
    n = 200_000
    topo = {"kind": "colocated", "replicas": 16, "kv_blocks": 4000, "router": "round_robin",
            "cost_model": {"kind": "linear", "base_s": 0.005, "per_token_s": 1e-5, "per_kv_token_s": 1e-7}}
    sc = scenario({"c": topo}, rate=400.0, num_requests=n,
                  prompt_tokens={"dist": "uniform", "low": 20, "high": 400},
                  output_tokens={"dist": "uniform", "low": 1, "high": 40})
    res = simulate(sc)[0]                 # check_conservation raises on anything lost
    assert len(res.requests) == n
    assert all(r.status == "finished" for r in res.requests)
    assert sum(r.generated for r in res.requests) == sum(r.output_tokens for r in res.requests)
    assert res.events < 30 * n            # windows, not one event per token
