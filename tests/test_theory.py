"""Queueing theory: a colocated replica with batch size 1 is an M/D/1 or M/G/1 queue (Pollaczek-Khinchine)."""
from __future__ import annotations

import numpy as np
import pytest

from conftest import scenario
from pdsim import metrics
from pdsim.simulation import simulate


def _mean_wait(rate, topo, seeds, n, **w):
    waits = []
    for seed in seeds:
        sc = scenario({"c": topo}, rate=rate, num_requests=n, **w).model_copy(update={"seed": seed})
        res = simulate(sc)
        df = metrics.requests_frame(res)
        df = df.iloc[n // 10:]                       # trim the warm-up
        waits.append(df.queue_s.mean())
    return float(np.mean(waits))


@pytest.mark.parametrize("rho", [0.5, 0.8])
def test_md1_mean_wait_matches_pollaczek_khinchine(rho):
    D = 0.01
    topo = {"kind": "colocated", "replicas": 1, "max_running": 1, "kv_blocks": 100000,
            "cost_model": {"kind": "constant", "step_s": D}}
    rate = rho / D
    expected = rho * D / (2 * (1 - rho))             # M/D/1: W = rho D / (2 (1 - rho))
    got = _mean_wait(rate, topo, seeds=range(6), n=40000, prompt_tokens=8, output_tokens=1)
    assert got == pytest.approx(expected, rel=0.03)


def test_mg1_lognormal_prompts_linear_cost():
    a, mean, cv, rho = 1e-5, 1000.0, 1.0, 0.7
    topo = {"kind": "colocated", "replicas": 1, "max_running": 1, "kv_blocks": 10**7,
            "cost_model": {"kind": "linear", "per_token_s": a}}
    rate = rho / (a * mean)
    # service S = a * P with P lognormal(mean, cv): E[S^2] = a^2 mean^2 (1 + cv^2)
    es2 = a * a * mean * mean * (1 + cv * cv)
    expected = rate * es2 / (2 * (1 - rho))
    got = _mean_wait(rate, topo, seeds=range(6), n=30000,
                     prompt_tokens={"dist": "lognormal", "mean": mean, "cv": cv, "max": 100000},
                     output_tokens=1)
    assert got == pytest.approx(expected, rel=0.05)


def test_unbounded_replicas_never_wait():
    """M/D/inf: with a replica per request nobody queues."""
    n = 50
    topo = {"kind": "colocated", "replicas": n, "router": "round_robin", "max_running": 1, "kv_blocks": 1000,
            "cost_model": {"kind": "constant", "step_s": 0.5}}
    df = metrics.requests_frame(simulate(scenario({"c": topo}, rate=100.0, num_requests=n, output_tokens=1)))
    assert (df.queue_s == 0).all()
    assert np.allclose(df.ttft_s, 0.5)
