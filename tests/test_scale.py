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


def test_requests_share_one_int_object_per_distinct_count():
    """Memory at scale (issue #19): a million requests repeat a few thousand lengths, and every int above 256
    is a 32-byte object of its own, so a request's prompt and output lengths (at generation) and its final
    computed and generated counts (at finish) point at one object per distinct value. Values unchanged."""
    import numpy as np
    from pdsim.workload import make_requests
    prompt = np.array([1000, 1000, 3000, 1000, 3000], dtype=np.int64)
    output = np.array([300, 300, 300, 700, 700], dtype=np.int64)
    reqs = make_requests(np.array([0.0, 0.5, 1.0, 1.5, 2.0]), prompt, output)
    assert [(r.id, r.arrival_s, r.prompt_tokens, r.output_tokens) for r in reqs] == \
        [(0, 0.0, 1000, 300), (1, 0.5, 1000, 300), (2, 1.0, 3000, 300), (3, 1.5, 1000, 700), (4, 2.0, 3000, 700)]
    assert all(type(r.prompt_tokens) is int and type(r.arrival_s) is float for r in reqs)
    assert reqs[0].prompt_tokens is reqs[1].prompt_tokens is reqs[3].prompt_tokens
    assert reqs[2].prompt_tokens is reqs[4].prompt_tokens
    assert reqs[0].output_tokens is reqs[2].output_tokens and reqs[3].output_tokens is reqs[4].output_tokens

    topo = {"kind": "colocated", "replicas": 2, "kv_blocks": 4000,
            "cost_model": {"kind": "constant", "step_s": 0.01}}
    sc = scenario({"c": topo}, rate=50.0, num_requests=40,
                  prompt_tokens={"dist": "uniform", "low": 300, "high": 302},
                  output_tokens={"dist": "uniform", "low": 400, "high": 401})
    res = simulate(sc)[0]
    fin = [r for r in res.requests if r.status == "finished"]
    assert len(fin) == 40 and all(r.generated == r.output_tokens for r in fin)
    by_value: dict = {}
    for r in fin:   # every count above 256 here: without sharing, each finished request has its own objects
        for v in (r.generated, r.computed):
            assert by_value.setdefault(v, v) is v
    assert len(by_value) <= 2 + 6      # 2 output lengths; computed = prompt + output - 1: 3 x 2 values
