"""The multi-step decode fast path gives the step-by-step loop's results, request by request.

``simulate(sc, fast=False)`` runs one SimPy event per step (the reference); the default
opens windows of many decode steps per event.  Random small workloads over topologies
that exercise preemption, chunked prefill, KV transfer back-pressure, state-reading
routers and a horizon must give the same requests.csv (floats to 1e-9 s), the same
per-instance counters and the same time series.
"""
from __future__ import annotations

import numpy as np
import pandas as pd
from hypothesis import HealthCheck, given, settings, strategies as st

from pdsim import metrics
from pdsim.costmodel import CostModel, RooflineCost
from pdsim.devices import get_device
from pdsim.models import get_model
from pdsim.simulation import simulate

from conftest import scenario

ROOF = {"device": "h100-sxm"}
TOPOS = st.sampled_from([
    {"kind": "colocated", "replicas": 2, **ROOF, "router": "least_outstanding"},
    {"kind": "colocated", "replicas": 2, **ROOF, "kv_blocks": 60, "max_running": 4},
    {"kind": "colocated", "replicas": 1, **ROOF, "kv_blocks": 40, "chunked_prefill": {"token_budget": 64}},
    {"kind": "colocated", "replicas": 1, "kv_blocks": 80,
     "cost_model": {"kind": "linear", "base_s": 0.004, "per_token_s": 2e-5, "per_kv_token_s": 1e-6}},
    {"kind": "disaggregated", "prefill": {"instances": 2, "kv_blocks": 40, **ROOF},
     "decode": {"instances": 1, "kv_blocks": 50, "max_running": 6, **ROOF}, "kv_link": {"bandwidth_GBps": 1}},
    {"kind": "disaggregated", "prefill": {"kv_blocks": 30, "chunked_prefill": {"token_budget": 32}, **ROOF},
     "decode": {"instances": 2, "kv_blocks": 30, **ROOF}, "assignment": "least_decode_work",
     "kv_link": {"shared": True, "bandwidth_GBps": 0.5, "layerwise_overlap": True}},
    {"kind": "disaggregated", "prefill": {"instances": 1, **ROOF}, "decode": {"instances": 2, **ROOF},
     "assignment": "least_loaded"},
])

FLOAT_COLS = ["first_token_s", "finish_s", "ttft_s", "tpot_s", "e2e_s", "queue_s", "prefill_s", "kv_wait_s",
              "kv_transfer_s", "decode_queue_s"]


def _both(sc):
    fast, slow = simulate(sc), simulate(sc, fast=False)
    return fast, slow


def _assert_same(fast, slow):
    assert abs(fast[0].sim_end_s - slow[0].sim_end_s) <= 1e-9
    a, b = metrics.requests_frame(fast), metrics.requests_frame(slow)
    exact = [c for c in a.columns if c not in FLOAT_COLS]
    pd.testing.assert_frame_equal(a[exact], b[exact])
    for c in FLOAT_COLS:
        x, y = a[c].to_numpy(float), b[c].to_numpy(float)
        assert np.array_equal(np.isnan(x), np.isnan(y)), c
        m = ~np.isnan(x)
        assert np.allclose(x[m], y[m], rtol=0, atol=1e-9), (c, np.abs(x[m] - y[m]).max())
    for fi, si in zip(fast[0].topology.instances, slow[0].topology.instances):
        assert fi.steps == si.steps, fi.name
        assert np.isclose(fi.busy_s, si.busy_s, rtol=1e-9), fi.name
        assert np.isclose(fi.flops, si.flops, rtol=1e-9) and np.isclose(fi.bytes, si.bytes, rtol=1e-9)
        assert fi.kv.peak_used == si.kv.peak_used and fi.kv.free_blocks == si.kv.free_blocks
        fs, ss = fi.series, si.series
        assert fs.steps == ss.steps and fs.batch_sum == ss.batch_sum and fs.kv_max == ss.kv_max
        assert fs.queue_max == ss.queue_max
        assert np.allclose(fs.busy_s, ss.busy_s, rtol=1e-9, atol=1e-12)
    ta, tb = metrics.timeseries_frame(fast), metrics.timeseries_frame(slow)
    assert ta.shape == tb.shape


@settings(deadline=None, suppress_health_check=[HealthCheck.too_slow])   # examples: the profile (conftest)
@given(topo=TOPOS, seed=st.integers(0, 10**6), n=st.integers(1, 6) | st.integers(20, 40), rate=st.floats(0.5, 100),
       out=st.integers(1, 300), horizon=st.sampled_from([None, None, 3.0]))
def test_fast_path_equals_step_by_step(topo, seed, n, rate, out, horizon):
    sc = scenario({"t": topo}, rate=rate, num_requests=n,
                  prompt_tokens={"dist": "uniform", "low": 1, "high": 300},
                  output_tokens={"dist": "uniform", "low": 1, "high": out})
    sc = sc.model_copy(update={"seed": seed, "horizon_s": horizon})
    _assert_same(*_both(sc))


def test_fast_path_opens_windows_and_saves_events():
    sc = scenario({"t": {"kind": "colocated", "replicas": 1, "device": "h100-sxm"}}, rate=2.0, num_requests=30,
                  prompt_tokens=200, output_tokens=400)
    fast, slow = _both(sc)
    _assert_same(fast, slow)
    inst = fast[0].topology.instances[0]
    assert inst.windows > 0
    assert fast[0].events * 5 < slow[0].events      # the point of it


def test_closed_loop_clients_fast_equals_slow():
    sc = scenario({"t": {"kind": "colocated", "replicas": 2, "device": "h100-sxm", "router": "least_outstanding"}},
                  arrival="closed", clients=5, think_s=0.3, num_requests=40,
                  prompt_tokens={"dist": "uniform", "low": 10, "high": 500},
                  output_tokens={"dist": "uniform", "low": 2, "high": 200})
    _assert_same(*_both(sc))


def test_vectorised_decode_costs_equal_scalar_steps():
    rng = np.random.default_rng(1)
    for tp, dev in ((1, "h100-sxm"), (2, "a100-80gb-sxm"), (1, "cpu-epyc-2c")):
        cm = RooflineCost(get_model("llama-3.1-8b"), get_device(dev), tp)
        c0 = rng.integers(10, 4000, 33)
        attn0, kv0 = float(sum(c + 0.5 for c in c0)), int((c0 + 1).sum())
        got = cm.decode_steps(33, attn0, kv0, 300)
        ref = CostModel.decode_steps(cm, 33, attn0, kv0, 300)
        for g, r in zip(got, ref):
            assert np.allclose(g, r, rtol=1e-12, atol=0)


@settings(deadline=None, suppress_health_check=[HealthCheck.too_slow])   # examples: the profile (conftest)
@given(topo=TOPOS, seed=st.integers(0, 10**6), n=st.integers(1, 6) | st.integers(15, 30), rate=st.floats(1, 60),
       at=st.floats(0.05, 2), down=st.floats(0.01, 1), link=st.booleans(), timeout=st.sampled_from([None, 0.3]))
def test_fast_path_equals_step_by_step_under_faults(topo, seed, n, rate, at, down, link, timeout):
    from pdsim.config import FaultsSpec
    sc = scenario({"t": topo}, rate=rate, num_requests=n, timeout_s=timeout,
                  prompt_tokens={"dist": "uniform", "low": 1, "high": 300},
                  output_tokens={"dist": "uniform", "low": 1, "high": 200})
    victim = sc.instance_names("t")[-1]          # the last decode instance or replica
    faults = FaultsSpec(instances=[{"at_s": at, "instance": victim, "down_s": down, "warmup_s": 0.1}],
                        links=[{"at_s": at / 2, "duration_s": down, "bandwidth_fraction": 0.0}] if link else [])
    sc = sc.model_copy(update={"seed": seed, "faults": faults})
    _assert_same(*_both(sc))


def test_exact_time_ties_and_horizon_on_a_step_end():
    # binary-exact 0.25 s steps and arrivals on whole seconds: step ends coincide with arrivals and the horizon
    topo = {"kind": "colocated", "replicas": 1, "cost_model": {"kind": "constant", "step_s": 0.25}, "kv_blocks": 10000}
    sc = scenario({"t": topo}, arrival="constant", rate=1.0, num_requests=3, prompt_tokens=10, output_tokens=20)
    _assert_same(*_both(sc))
    sc = scenario({"t": topo}, arrival="constant", rate=1.0, num_requests=1, prompt_tokens=10, output_tokens=100)
    _assert_same(*_both(sc.model_copy(update={"horizon_s": 3.0})))
