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


def _tandem(rate, d1, link_GBps, n, seed=0, prompt=8):
    """Prefill (one instance, one request at a time, every step d1) -> a shared KV link -> a decode pool that
    never queues: two single-server FIFO stations with deterministic service in tandem."""
    topo = {"kind": "disaggregated",
            "prefill": {"instances": 1, "max_running": 1, "kv_blocks": 10**6,
                        "cost_model": {"kind": "constant", "step_s": d1}},
            "decode": {"instances": 1, "kv_blocks": 10**6, "cost_model": {"kind": "constant", "step_s": 1e-4}},
            "kv_link": {"bandwidth_GBps": link_GBps, "latency_us": 0.0, "shared": True}}
    sc = scenario({"t": topo}, rate=rate, num_requests=n, prompt_tokens=prompt, output_tokens=2)
    (res,) = simulate(sc.model_copy(update={"seed": seed}))
    reqs = sorted(res.requests, key=lambda r: r.arrival_s)
    return (np.array([r.arrival_s for r in reqs]), np.array([r.prefill_end_s for r in reqs]),
            np.array([r.decode_start_s for r in reqs]))


KV_BYTES_PER_TOKEN = 2 * 32 * 8 * 128 * 2       # llama-3.1-8b, bf16: K and V x layers x kv heads x head dim x 2 B


@pytest.mark.parametrize("d1, d2", [(0.004, 0.010), (0.010, 0.004)])
def test_pd_tandem_follows_the_deterministic_tandem_recurrence(d1, d2):
    """Two FIFO servers with deterministic service d1 (prefill) then d2 (the KV link), infinite buffers:
    prefill ends at p_n = max(a_n, p_{n-1}) + d1 and the KV is in place at x_n = max(p_n, x_{n-1}) + d2
    (Lindley's recurrence at each station), computed here from the arrival times alone and compared with
    every request's simulated times; and the sojourn to the KV being in place equals the bottleneck alone
    (Friedman 1965: x_n = max(a_n + min, x_{n-1}) + max, pathwise, for either order)."""
    prompt = 8
    bw = prompt * KV_BYTES_PER_TOKEN / d2 / 1e9          # a link that moves the 8-token KV in exactly d2
    a, p, x = _tandem(0.7 / max(d1, d2), d1, bw, n=400)
    pe = np.empty_like(a)
    xe = np.empty_like(a)
    fr = np.empty_like(a)
    prev_p = prev_x = prev_f = -np.inf
    for i, t in enumerate(a):
        prev_p = pe[i] = max(t, prev_p) + d1
        prev_x = xe[i] = max(prev_p, prev_x) + d2
        prev_f = fr[i] = max(t + min(d1, d2), prev_f) + max(d1, d2)
    assert p == pytest.approx(pe, abs=1e-9)
    assert x == pytest.approx(xe, abs=1e-9)
    assert xe == pytest.approx(fr, abs=1e-12)              # Friedman's reduction, on the same arrivals
    if d2 > d1:
        assert (x - p).max() > d2 + 1e-3                   # the link is the bottleneck: transfers queue
    else:
        assert x - p == pytest.approx(np.full_like(x, d2), abs=1e-9)   # a faster link never queues


def test_pd_tandem_mean_sojourn_matches_the_bottleneck_md1():
    """Friedman's reduction with Pollaczek-Khinchine: prefill 4 ms then a 10 ms link at rho = 0.7 on the
    link: the mean time from arrival to the KV in place is d1 + d2 + rho d2 / (2 (1 - rho)) = 14 + 11.67 ms."""
    d1, d2, rho, prompt = 0.004, 0.010, 0.7, 8
    bw = prompt * KV_BYTES_PER_TOKEN / d2 / 1e9
    soj = []
    for seed in range(3):
        a, _, x = _tandem(rho / d2, d1, bw, n=10000, seed=seed)
        soj.append((x - a)[1000:].mean())
    expected = d1 + d2 + rho * d2 / (2 * (1 - rho))
    # one seed's mean scatters ~2.5% (12 seeds: 0.980-1.060 of the formula), three seeds' ~1.5%: 6% is 4 sigma
    assert float(np.mean(soj)) == pytest.approx(expected, rel=0.06)
