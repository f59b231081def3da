"""Autoscaling (pdsim/autoscaler.py) and the diurnal rate curve (workload.rate_curve).

Each test has its own oracle: a time or an integral worked out by hand, Poisson statistics, or the
step-by-step loop.
"""
from __future__ import annotations

import numpy as np
import pytest

from pdsim import config, metrics
from pdsim.errors import ConfigError
from pdsim.simulation import simulate
from pdsim.workload import nhpp_arrivals

from conftest import scenario
from test_fastpath import _assert_same

H100 = {"device": "h100-sxm"}


def _timeline(res, pool):
    return [(e["t_s"], e["alive"], e["serving"])
            for e in res.topology.autoscaler.summary(res.sim_end_s)["pools"][pool]["timeline"]]


# --- scale-out: exactly provisioning + load time ------------------------------------------------------
def test_scale_out_serves_exactly_provisioning_plus_load_time_after_the_decision():
    # Llama-3.1-8B in bf16 at tp 1, counted by hand from its shape: per layer q and o 4096 x 4096, k and v
    # 4096 x 1024, a gated MLP 3 x 4096 x 14336; 32 layers; untied embedding and LM head 2 x 128256 x 4096
    params = 32 * (2 * 4096 * 4096 + 2 * 4096 * 1024 + 3 * 4096 * 14336) + 2 * 128256 * 4096
    load_s = params * 2 / 4e9                   # load_GBps: 4  -> 4.014997504 s
    decided, provisioning = 3.0, 7.0
    serves_at = decided + provisioning + load_s  # 14.014997504
    topo = {"kind": "disaggregated", "prefill": {"instances": 1, **H100}, "decode": {"instances": 1, **H100},
            "autoscaler": {"policy": "schedule", "provisioning_s": provisioning, "load_GBps": 4,
                           "schedule": [{"at_s": decided, "prefill": 2}]}}
    sc = scenario({"t": topo}, rate=30, num_requests=900, prompt_tokens={"dist": "uniform", "low": 500, "high": 3000},
                  output_tokens=20)
    res = simulate(sc)[0]
    assert _timeline(res, "prefill") == [(0.0, 1, 1), (decided, 2, 1), (pytest.approx(serves_at, abs=1e-9), 2, 2)]
    new = [r for r in res.requests if r.instance == "prefill-1"]
    assert new, "the new instance never served"
    # nothing reached it before it was ready, and it got work at once (prefill-0 is queued up by then)
    first = min(r.prefill_start_s for r in new)
    assert first >= serves_at - 1e-9
    assert first == pytest.approx(serves_at, abs=0.1)
    assert min(r.arrival_s for r in new) >= serves_at - 1e-9
    # paid from the decision: prefill-1 is alive from t=3 to the end
    inst = res.topology.by_name["prefill-1"]
    assert inst.alive_s(res.sim_end_s) == pytest.approx(res.sim_end_s - decided, abs=1e-9)


LLAMA_8B_PARAMS = 32 * (2 * 4096 * 4096 + 2 * 4096 * 1024 + 3 * 4096 * 14336) + 2 * 128256 * 4096


@pytest.mark.parametrize("model, spec, draft_bytes", [
    # Llama-3.2-1B draft, bf16, tp 1, by hand: 16 layers of q and o 2048 x 2048, k and v 2048 x 512, gated MLP
    # 3 x 2048 x 8192 (60,817,408 each), one tied embedding 128256 x 2048: 1,235,746,816 params, 2,471,493,632 B
    ("llama-3.1-8b", {"method": "draft", "k": 3, "acceptance": 0.7, "draft_model": "llama-3.2-1b"},
     2 * (16 * (2 * 2048 * 2048 + 2 * 2048 * 512 + 3 * 2048 * 8192) + 128256 * 2048)),
    # an MTP head on Llama-3.1-8B's shape: one more decoder layer (218,103,808 params, 436,207,616 B); its
    # embedding and LM head are the target's
    ({"name": "llama-3.1-8b-mtp", "layers": 32, "hidden": 4096, "heads": 32, "kv_heads": 8, "mlp_width": 14336,
      "vocab": 128256, "max_context": 131072, "mtp_layers": 1},
     {"method": "mtp", "k": 1, "acceptance": 0.7}, 2 * (2 * 4096 * 4096 + 2 * 4096 * 1024 + 3 * 4096 * 14336)),
])
def test_scale_out_load_time_counts_the_draft_weights(model, spec, draft_bytes):
    """A speculative decode instance loads the target's shard and its draft's (or MTP layer's) weights: load time =
    (16,059,990,016 + draft bytes) / 4 GB/s, i.e. 4.632870912 s with the 1B draft and 4.124049408 s with the MTP
    layer, not the target's 4.014997504 s alone; serving 3 + 7 s + that after the decision."""
    assert draft_bytes in (2471493632, 436207616)
    load_s = (LLAMA_8B_PARAMS * 2 + draft_bytes) / 4e9
    assert load_s == pytest.approx(4.632870912 if spec["method"] == "draft" else 4.124049408, abs=1e-12)
    decided, provisioning = 3.0, 7.0
    topo = {"kind": "disaggregated", "prefill": {"instances": 1, **H100},
            "decode": {"instances": 1, **H100, "speculative": spec},
            "autoscaler": {"policy": "schedule", "provisioning_s": provisioning, "load_GBps": 4,
                           "schedule": [{"at_s": decided, "decode": 2}]}}
    sc = scenario({"t": topo}, model=model, rate=5, num_requests=100, prompt_tokens=200, output_tokens=20)
    res = simulate(sc)[0]
    assert _timeline(res, "decode") == [(0.0, 1, 1), (decided, 2, 1),
                                        (pytest.approx(decided + provisioning + load_s, abs=1e-9), 2, 2)]


def test_taking_back_a_draining_instance_counts_as_a_scale_out():
    """Two constant-cost replicas (10 ms a step), 40 requests at 10/s of 1000 output tokens (10 s each at least):
    at 2 s both hold requests; the schedule drains one (scale-in 1: alive 2, serving 1) and at 3 s asks for 2
    again, which takes the still-draining one back (serving 2 at once, nothing provisioned).  By hand: one
    scale-out and one scale-in, alive 2 throughout, never more."""
    topo = {"kind": "colocated", "replicas": 2, "cost_model": {"kind": "constant", "step_s": 0.01}, "kv_blocks": 10000,
            "autoscaler": {"policy": "schedule", "schedule": [{"at_s": 2.0, "replicas": 1}, {"at_s": 3.0, "replicas": 2}]}}
    sc = scenario({"t": topo}, arrival="constant", rate=10, num_requests=40, prompt_tokens=100, output_tokens=1000)
    res = simulate(sc)[0]
    assert _timeline(res, "replicas") == [(0.0, 2, 2), (2.0, 2, 1), (3.0, 2, 2)]
    p = res.topology.autoscaler.summary(res.sim_end_s)["pools"]["replicas"]
    assert (p["scale_outs"], p["scale_ins"]) == (1, 1)


# --- scale-in drains -----------------------------------------------------------------------------------
@pytest.mark.parametrize("topo, pool", [
    ({"kind": "disaggregated", "prefill": {"instances": 3, **H100}, "decode": {"instances": 3, **H100, "kv_blocks": 3000},
      "autoscaler": {"policy": "schedule", "schedule": [{"at_s": 2.0, "prefill": 1, "decode": 1}]}}, "prefill"),
    ({"kind": "colocated", "replicas": 3, **H100, "kv_blocks": 1500, "max_running": 8,
      "autoscaler": {"policy": "schedule", "schedule": [{"at_s": 2.0, "replicas": 1}]}}, "replicas"),
])
def test_drain_loses_nothing_and_a_draining_instance_gets_no_new_request(topo, pool):
    drain_at = 2.0
    sc = scenario({"t": topo}, rate=60, num_requests=400, prompt_tokens={"dist": "uniform", "low": 200, "high": 2000},
                  output_tokens={"dist": "uniform", "low": 50, "high": 400})
    res = simulate(sc)[0]          # check_conservation ran: every request finished, every KV block returned
    assert all(r.status == "finished" for r in res.requests)
    assert all(r.generated == r.output_tokens for r in res.requests)
    off = [i for i in res.topology.instances if i.state == "off"]
    assert len(off) == (4 if pool == "prefill" else 2)
    for inst in off:
        mine = [r for r in res.requests if r.instance == inst.name]
        # it was busy when told to drain, and finished that work afterwards (drained, not dropped)
        assert any(r.arrival_s < drain_at < r.finish_s for r in mine) or inst.role == "decode"
        # nothing new: every request it prefilled arrived before the drain
        assert all(r.arrival_s <= drain_at for r in mine), inst.name
        if inst.role == "decode":
            got = [r for r in res.requests if r.decode_instance == inst.name]
            # a hand-off reserves decode blocks at its prefill's end: none after the drain began
            assert all(r.prefill_end_s <= drain_at for r in got), inst.name
        # it left when the last thing it held was done, and was paid until then: a replica's last request
        # finished, a prefill instance's last KV reached a decode instance, a decode instance's last finished
        if inst.role == "prefill":
            last = max([r.decode_start_s for r in mine] + [drain_at])
        else:
            last = max([r.finish_s for r in res.requests if inst.name in (r.instance, r.decode_instance)]
                       + [drain_at])
        assert inst.alive_s(res.sim_end_s) == pytest.approx(last, abs=1e-9), inst.name
    # the drain had something to wait for in at least one instance
    assert any(_timeline(res, pool)[i][1] > _timeline(res, pool)[i][2] for i in range(len(_timeline(res, pool))))


# --- GPU-hours and cost: a schedule, integrated by hand -------------------------------------------------
def test_gpu_hours_cost_and_idle_energy_equal_the_hand_computed_integral():
    # tp 2 replicas at $4 per GPU-hour.  1 replica at t=0; at t=10 three (two provisioning 4 s + loading 6 s);
    # at t=50.5 one again.  One request a second (on the whole second), each done in well under 0.5 s, so
    # every replica is idle at 50.5 and the two extra ones leave at once.  Horizon 120 s, past the last
    # request's finish (it arrives at 100 s): the run, and what is paid, ends at that finish.
    topo = {"kind": "colocated", "replicas": 1, "tp": 2, **H100, "price_per_gpu_hour_usd": 4.0,
            "autoscaler": {"policy": "schedule", "provisioning_s": 4, "load_s": 6,
                           "schedule": [{"at_s": 10, "replicas": 3}, {"at_s": 50.5, "replicas": 1}]}}
    sc = scenario({"t": topo}, arrival="constant", rate=1.0, num_requests=100, prompt_tokens=100, output_tokens=10)
    sc = sc.model_copy(update={"horizon_s": 120.0})
    res = simulate(sc)
    s = metrics.summarize(res, metrics.requests_frame(res), sc)["t"]
    assert _timeline(res[0], "replicas") == [(0.0, 1, 1), (10.0, 3, 1), (20.0, 3, 3), (50.5, 1, 1)]
    end = res[0].sim_end_s
    assert end == max(r.finish_s for r in res[0].requests) and 100 < end < 100.5
    gpu_s = 2 * end + 2 * 2 * (50.5 - 10)          # replica-0 all along; replicas 1 and 2 from 10 to 50.5
    assert s["gpu_hours"] == pytest.approx(gpu_s / 3600, rel=1e-12)
    assert s["cost_usd"] == pytest.approx(4.0 * gpu_s / 3600, rel=1e-12)
    assert s["gpus"] == 6 and s["mean_gpus"] == pytest.approx(gpu_s / end, rel=1e-12)
    assert s["autoscaling"]["pools"]["replicas"]["gpu_hours"] == pytest.approx(gpu_s / 3600, rel=1e-12)
    # energy: idle power (H100 preset: 70 W per GPU, an estimate) over the paid GPU-seconds only
    assert s["energy"]["pools"]["replica"]["idle_energy_J"] == pytest.approx(70.0 * gpu_s, rel=1e-12)


# --- the non-homogeneous Poisson generator ---------------------------------------------------------------
def _counts(arr, edges):
    return np.histogram(arr, edges)[0]


def test_nhpp_counts_per_interval_match_the_integral_of_the_rate_curve():
    """Counts in disjoint intervals are independent Poisson(integral of the rate): each within 4 sigma
    (fixed seed), and the sum of squared z-scores within a chi-square bound (p about 0.001)."""
    rng = np.random.default_rng(11)
    # hourly, compressed 36x (an hour = 100 s), scaled 2x, and a burst: x3 over [250, 300)
    hourly = config.RateCurveSpec(hourly=[5, 20, 10, 0, 40], scale=2.0, time_scale=1 / 36,
                                  bursts=[{"at_s": 250, "duration_s": 50, "multiplier": 3}])
    a = nhpp_arrivals(rng, hourly, 500.0)
    edges = [0, 100, 200, 250, 300, 400, 500]
    expect = np.array([10 * 100, 40 * 100, 20 * 50, 60 * 50, 0, 80 * 100], float)   # rate x length, by hand
    got = _counts(a, edges)
    assert got[4] == 0                                    # a zero-rate hour has no arrival at all
    m = expect > 0
    z = (got[m] - expect[m]) / np.sqrt(expect[m])
    assert np.all(np.abs(z) < 4), (got, expect)
    assert float((z ** 2).sum()) < 20.5                   # chi-square, 5 dof, p = 0.001
    # points: linear 0 -> 30 over [0, 1000], 30 -> 10 over [1000, 2000]; trapezoids by hand per 250 s
    pts = config.RateCurveSpec(points=[[0, 0], [1000, 30], [2000, 10]])
    b = nhpp_arrivals(np.random.default_rng(12), pts, 2000.0)
    edges = np.arange(0, 2001, 250)
    rate = lambda t: np.where(t <= 1000, 0.03 * t, 30 - 0.02 * (t - 1000))   # noqa: E731
    expect = (rate(edges[:-1]) + rate(edges[1:])) / 2 * 250
    z = (_counts(b, edges) - expect) / np.sqrt(expect)
    assert np.all(np.abs(z) < 4), (_counts(b, edges), expect)
    assert float((z ** 2).sum()) < 26.1                   # chi-square, 8 dof, p = 0.001
    assert np.all(np.diff(b) >= 0) and b.min() >= 0 and b.max() < 2000


def test_rate_curve_drives_the_scenario_stream():
    sc = scenario(rate=None, duration_s=200, num_requests=None,
                  rate_curve={"hourly": [10, 30], "time_scale": 1 / 36})   # 100 s at 10/s, then 100 s at 30/s
    from pdsim.workload import generate
    from pdsim.models import get_model
    reqs = generate(sc, get_model("llama-3.1-8b"))
    arr = np.array([r.arrival_s for r in reqs])
    lo, hi = (arr < 100).sum(), ((arr >= 100) & (arr < 200)).sum()
    assert abs(lo - 1000) < 4 * 1000 ** 0.5 and abs(hi - 3000) < 4 * 3000 ** 0.5


# --- bad input: one line naming the key and the value ------------------------------------------------
PD = {"kind": "disaggregated", "prefill": {"instances": 2}, "decode": {"instances": 2}}


@pytest.mark.parametrize("workload, topo, match", [
    ({"rate_curve": {"hourly": [1, -2, 3]}}, None, r"rate_curve\.hourly\[1\] \(=-2\.0\) is a negative rate"),
    ({"rate_curve": {"points": [[0, 1], [50, 2], [40, 3]]}}, None,
     r"rate_curve\.points\[2\] time \(=40\.0\) is not after the previous point's \(=50\.0\)"),
    ({"rate_curve": {"points": [[0, 1], [10, -1]]}}, None, r"points\[1\] rate \(=-1\.0\) is negative"),
    ({"rate_curve": {"hourly": [0, 0]}}, None, "every rate is zero"),
    ({"rate_curve": {"hourly": [1]}, "rate": 3}, None, r"give rate \(=3\.0\) or rate_curve, not both"),
    ({"rate_curve": {"hourly": [1]}, "arrival": "gamma"}, None, "needs arrival: poisson"),
    ({"rate_curve": {"hourly": [1], "bursts": [{"at_s": 1, "duration_s": 2, "multiplier": -1}]}}, None,
     r"bursts\.0\.multiplier = -1"),
    ({}, {**PD, "autoscaler": {"policy": "threshold", "prefill": {"max": 4}, "decode": {"max": 4}}},
     r"autoscaler\.prefill: policy threshold needs scale_out_above and scale_in_below"),
    ({}, {**PD, "autoscaler": {"policy": "slo", "prefill": {"max": 4}}},
     r"autoscaler\.decode\.max: policy slo needs the most instances"),
    ({}, {**PD, "autoscaler": {"policy": "slo", "prefill": {"max": 1}, "decode": {"max": 4}}},
     r"autoscaler\.prefill: the initial count \(=2\) must lie within min \(=1\) and max \(=1\)"),
    ({}, {**PD, "autoscaler": {"policy": "schedule", "schedule": [{"at_s": 5, "prefill": 3}, {"at_s": 2, "decode": 1}]}},
     r"autoscaler\.schedule\[1\]\.at_s \(=2\.0\) must be after the previous entry's \(=5\.0\)"),
    ({}, {**PD, "autoscaler": {"policy": "schedule", "schedule": [{"at_s": 5, "replicas": 3}]}},
     r"autoscaler\.schedule\[0\]\.replicas: this topology has no replicas pool"),
    ({}, {"kind": "colocated", "replicas": 2, "autoscaler": {"policy": "slo", "prefill": {"max": 3}}},
     r"autoscaler\.prefill: this topology has no prefill pool"),
    ({}, {**PD, "autoscaler": {"policy": "threshold", "prefill": {"max": 4, "metric": "utilization",
                                                                   "scale_out_above": 5, "scale_in_below": 0.2},
                               "decode": {"max": 4, "scale_out_above": 5, "scale_in_below": 1}}},
     r"autoscaler\.prefill\.scale_out_above \(=5\.0\): utilization is a busy fraction"),
    ({}, {**PD, "autoscaler": {"policy": "slo", "prefill": {"max": 4}, "decode": {"max": 4}, "provisioning_s": -1}},
     r"autoscaler\.provisioning_s = -1"),
    ({}, {**PD, "autoscaler": {"policy": "slo", "prefill": {"max": 4}, "decode": {"max": 4}, "provisoning_s": 3}},
     r"autoscaler\.provisoning_s: unknown key; did you mean .provisioning_s."),
])
def test_bad_autoscaler_and_rate_curve_input_is_one_clear_line(workload, topo, match):
    w = {"arrival": "poisson", "rate": None, "duration_s": 100, "num_requests": None} if "rate_curve" in workload \
        else {}
    w.update(workload)
    with pytest.raises(ConfigError, match=match) as e:
        scenario({"t": topo} if topo else None, **w)
    assert "\n" not in str(e.value) and str(e.value).startswith("test.yaml: ")


def test_faults_with_autoscaling_and_role_switching_are_accepted():
    # (what they do together: tests/test_faults_autoscale.py)
    for a in ({"policy": "schedule", "schedule": [{"at_s": 5, "prefill": 3}]}, {"policy": "mix"}):
        sc = config.parse({"workload": {"rate": 1, "num_requests": 5}, "topologies": {"t": {**PD, "autoscaler": a}},
                           "faults": [{"at_s": 1, "instance": "decode-0", "down_s": 1}]}, "test.yaml")
        assert sc.faults.instances[0].instance == "decode-0" and sc.topologies["t"].autoscaler.policy == a["policy"]


# --- the policies do what they say ---------------------------------------------------------------------
def test_threshold_scales_out_under_overload_and_back_in_when_it_passes():
    # 4 s at 40 req/s (too much for one prefill instance), then 0.5 req/s for a minute
    topo = {"kind": "disaggregated", "prefill": {"instances": 1, **H100}, "decode": {"instances": 1, **H100},
            "autoscaler": {"policy": "threshold", "interval_s": 1, "cooldown_s": 2, "provisioning_s": 1, "load_s": 1,
                           "scale_in_window_s": 5,
                           "prefill": {"max": 4, "metric": "queue", "scale_out_above": 4, "scale_in_below": 0.5},
                           "decode": {"max": 1, "scale_out_above": 1e9, "scale_in_below": 0}}}
    sc = scenario({"t": topo}, rate=None, num_requests=None, duration_s=64,
                  rate_curve={"points": [[0, 40], [4, 40], [4.001, 0.5], [64, 0.5]]},
                  prompt_tokens=6000, output_tokens=5)
    res = simulate(sc)[0]
    tl = _timeline(res, "prefill")
    assert max(a for _, a, _ in tl) > 1                  # it grew
    assert tl[-1][1] == 1                                 # and shrank back to min
    assert all(r.status == "finished" for r in res.requests)


def test_slo_planner_follows_the_rate():
    # 60 s at 2 req/s, 60 s at 20 req/s, 60 s at 2 req/s: the prefill pool is sized up for the middle minute
    topo = {"kind": "disaggregated", "prefill": {"instances": 1, **H100}, "decode": {"instances": 1, **H100},
            "autoscaler": {"policy": "slo", "interval_s": 5, "cooldown_s": 10, "provisioning_s": 2, "load_s": 2,
                           "scale_in_window_s": 10,
                           "slo": {"window_s": 20, "forecast": "average"},
                           "prefill": {"max": 8}, "decode": {"max": 4}}}
    sc = scenario({"t": topo}, rate=None, num_requests=None, duration_s=180,
                  rate_curve={"hourly": [2, 20, 2], "time_scale": 1 / 60},
                  prompt_tokens=4000, output_tokens=50)
    res = simulate(sc)[0]
    tl = _timeline(res, "prefill")
    alive_at = lambda t: [a for ts, a, _ in tl if ts <= t][-1]   # noqa: E731
    assert alive_at(55) <= 2 < alive_at(115)
    assert alive_at(res.sim_end_s) < alive_at(115)
    f = res.topology.autoscaler.forecasts
    mid = [r for t, r in f if 90 <= t <= 120]
    assert all(14 < r < 26 for r in mid), mid            # the window's mean rate: 20 req/s


# --- the fast path with an autoscaler -------------------------------------------------------------------
@pytest.mark.parametrize("topo", [
    {"kind": "disaggregated", "prefill": {"instances": 2, **H100, "kv_blocks": 400},
     "decode": {"instances": 2, **H100, "kv_blocks": 300, "max_running": 12},
     "autoscaler": {"policy": "schedule", "provisioning_s": 0.3, "load_s": 0.2,
                    "schedule": [{"at_s": 0.5, "prefill": 1, "decode": 1}, {"at_s": 1.5, "prefill": 3, "decode": 3},
                                 {"at_s": 2.5, "decode": 1}]}},
    {"kind": "colocated", "replicas": 1, **H100, "kv_blocks": 300, "max_running": 10,
     "autoscaler": {"policy": "threshold", "interval_s": 0.25, "cooldown_s": 0.5, "provisioning_s": 0.2, "load_s": 0.1,
                    "replicas": {"max": 3, "metric": "outstanding_tokens", "scale_out_above": 3000,
                                 "scale_in_below": 800}}},
    {"kind": "disaggregated", "prefill": {"instances": 1, **H100}, "decode": {"instances": 1, **H100, "kv_blocks": 400},
     "autoscaler": {"policy": "slo", "interval_s": 0.5, "cooldown_s": 0.5, "provisioning_s": 0.2, "load_s": 0.2,
                    "slo": {"window_s": 1.0}, "prefill": {"max": 3}, "decode": {"max": 3}}},
    {"kind": "disaggregated", "prefill": {"instances": 1, **H100}, "decode": {"instances": 1, **H100, "kv_blocks": 400},
     "autoscaler": {"policy": "slo", "interval_s": 0.5, "cooldown_s": 0.5, "provisioning_s": 0.2, "load_s": 0.2,
                    "scale_in_window_s": 1, "slo": {"window_s": 1.5, "prefill_capacity": "measured"},
                    "prefill": {"max": 3}, "decode": {"max": 3}}},
])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_fast_path_equals_step_by_step_with_an_autoscaler(topo, seed):
    sc = scenario({"t": topo}, rate=None, num_requests=None, duration_s=4,
                  rate_curve={"points": [[0, 5], [1.5, 40], [4, 5]]},
                  prompt_tokens={"dist": "uniform", "low": 10, "high": 600},
                  output_tokens={"dist": "uniform", "low": 2, "high": 200})
    sc = sc.model_copy(update={"seed": seed})
    fast, slow = simulate(sc), simulate(sc, fast=False)
    _assert_same(fast, slow)
    assert _timeline(fast[0], fast[0].topology.pools[-1].name.replace("replica", "replicas")) == \
        _timeline(slow[0], slow[0].topology.pools[-1].name.replace("replica", "replicas"))
    assert len(_timeline(fast[0], "decode" if topo["kind"] == "disaggregated" else "replicas")) > 1   # it scaled
    assert sum(i.windows for i in fast[0].topology.instances) > 0                            # windows opened


def test_readme_autoscaling_example_is_a_valid_scenario():
    from pathlib import Path

    import yaml
    text = (Path(__file__).resolve().parents[1] / "README.md").read_text()
    part = text.split("## Autoscaling and diurnal traffic", 1)[1]
    block = part.split("```yaml", 1)[1].split("```", 1)[0]
    raw = yaml.safe_load(block)
    sc = config.parse({**raw, "workload": {**raw["workload"], "prompt_tokens": 100, "output_tokens": 10}},
                      "README.md")
    a = sc.topologies["pd"].autoscaler
    assert a.policy == "slo" and a.prefill.max == 4 and sc.workload.rate_curve.scale == 28


# --- role switching (policy mix) --------------------------------------------------------------------------
def _mix_run(prompt, out, rate, fast=True):
    # decode KV for about 20 requests each: hand-offs wait for decode blocks holding their KV on the prefill side
    topo = {"kind": "disaggregated", "prefill": {"instances": 2, **H100},
            "decode": {"instances": 2, **H100, "kv_blocks": 2500},
            "autoscaler": {"policy": "mix", "interval_s": 1, "cooldown_s": 3, "switch_s": 2.5}}
    sc = scenario({"t": topo}, rate=rate, num_requests=500, prompt_tokens=prompt, output_tokens=out)
    res = simulate(sc, fast=fast)
    return sc, res


@pytest.mark.parametrize("prompt, out, more", [(6000, 10, "prefill"), (300, 1500, "decode")])
def test_role_switch_follows_the_token_mix_conserves_kv_and_keeps_the_gpus_paid(prompt, out, more):
    sc, res = _mix_run(prompt, out, rate=25)
    r = res[0]
    a = r.topology.autoscaler
    sw = a.switches
    assert sw, "no role switch"
    # the pool the mix needs more of grew, the other shrank, the total stayed 4 (all finished: conservation)
    final = {k: _timeline(r, k)[-1][1] for k in ("prefill", "decode")}
    assert final[more] > 2 and sum(final.values()) == 4
    assert all(q.status == "finished" for q in r.requests)
    for e in sw:
        assert e["kv_blocks_in_use"] == 0                      # it left with an empty KV cache...
        src = r.topology.by_name[e["from"]]
        assert src.kv.free_blocks == src.kv.total_blocks
        # ...and the same GPUs serve in the other role exactly switch_s after it left
        dst_pool = e["to"].split("-")[0]
        assert (pytest.approx(e["t_s"] + 2.5, abs=1e-9), ) in [(t,) for t, _, _ in _timeline(r, dst_pool)]
        assert all(q.arrival_s <= e["decided_s"] for q in r.requests if q.instance == e["from"])
    # a prefill instance that switches had prompts' KV to hand off first: it left after the decision
    if more == "decode":
        assert any(e["t_s"] > e["decided_s"] for e in sw)
    # GPU-hours: 4 instances x 1 GPU paid without a break through every switch
    s = metrics.summarize(res, metrics.requests_frame(res), sc)["t"]
    assert s["gpu_hours"] == pytest.approx(4 * r.sim_end_s / 3600, rel=1e-12)
    # never more than the 4 GPUs at once, though each pool's own peak counts the switched one (review)
    assert s["gpus"] == 4 and sum(p["gpus"] for p in s["pools"].values()) > 4


def test_role_switching_fast_path_equals_step_by_step():
    _, fast = _mix_run(300, 1500, rate=25)
    _, slow = _mix_run(300, 1500, rate=25, fast=False)
    _assert_same(fast, slow)
    assert fast[0].topology.autoscaler.switches == slow[0].topology.autoscaler.switches


@pytest.mark.parametrize("topo, match", [
    ({"kind": "colocated", "replicas": 2, "autoscaler": {"policy": "mix"}}, "mix switches instances between prefill "
                                                                            "and decode: it needs a disaggregated"),
    ({**PD, "decode": {"instances": 2, "device": "h200"}, "autoscaler": {"policy": "mix"}},
     r"prefill\.device \(=h100-sxm\) must equal decode\.device \(=h200\)"),
    # found in review: a 4-GPU tp2 x pp2 prefill instance became a 2-GPU decode one (GPU-hours fell)
    ({**PD, "prefill": {"instances": 2, "tp": 2, "pp": 2}, "decode": {"instances": 2, "tp": 2},
      "autoscaler": {"policy": "mix"}}, r"prefill\.pp \(=2\) must equal decode\.pp \(=1\)"),
    # found in review: the same pp, another layer split (a switch keeps the weights where they are)
    ({**PD, "prefill": {"instances": 2, "pp": 2, "pp_layers": [20, 12]},
      "decode": {"instances": 2, "pp": 2, "pp_layers": [16, 16]}, "autoscaler": {"policy": "mix"}},
     r"prefill\.pp_layers \(=\[20, 12\]\) must equal decode\.pp_layers \(=\[16, 16\]\)"),
])
def test_role_switching_needs_matching_pools(topo, match):
    with pytest.raises(ConfigError, match=match):
        scenario({"t": topo})


def test_utilization_threshold_reads_the_busy_fraction_of_the_last_interval():
    # one replica kept busy from t=0 (a closed loop of 4 clients, no think time): the first look at t=1 sees
    # a busy fraction of 1, above 0.5, and adds a replica; it must not read 0 (nothing seen yet) and drain
    topo = {"kind": "colocated", "replicas": 1, "cost_model": {"kind": "constant", "step_s": 0.01}, "kv_blocks": 10000,
            "autoscaler": {"policy": "threshold", "interval_s": 1, "cooldown_s": 0, "provisioning_s": 0.5,
                           "replicas": {"max": 2, "metric": "utilization", "scale_out_above": 0.5,
                                        "scale_in_below": 0.1}}}
    sc = scenario({"c": topo}, arrival="closed", clients=4, num_requests=400, prompt_tokens=100, output_tokens=20)
    res = simulate(sc)[0]
    assert _timeline(res, "replicas")[:3] == [(0.0, 1, 1), (1.0, 2, 1), (1.5, 2, 2)]


def test_summary_json_and_report_show_pool_sizes_and_gpu_hours(tmp_path):
    import json

    from pdsim.output import write_outputs
    from pdsim.report import build_report
    topo = {"kind": "colocated", "replicas": 1, "tp": 2, **H100, "price_per_gpu_hour_usd": 4.0,
            "autoscaler": {"policy": "schedule", "provisioning_s": 4, "load_s": 6,
                           "schedule": [{"at_s": 10, "replicas": 3}, {"at_s": 50.5, "replicas": 1}]}}
    sc = scenario({"auto": topo, "static": {"kind": "colocated", "replicas": 1, "tp": 2, **H100}},
                  arrival="constant", rate=1.0, num_requests=100, prompt_tokens=100, output_tokens=10)
    sc = sc.model_copy(update={"horizon_s": 120.0})
    write_outputs(simulate(sc), sc, tmp_path)
    s = json.loads((tmp_path / "summary.json").read_text())["topologies"]
    # each run ends at its last request's finish, just after 100 s (a horizon past it changes nothing)
    end, end_static = s["auto"]["sim_end_s"], s["static"]["sim_end_s"]
    assert 100 < end < 100.5 and 100 < end_static < 100.5
    assert s["auto"]["gpu_hours"] == pytest.approx((2 * end + 4 * 40.5) / 3600, rel=1e-12)
    assert s["static"]["gpu_hours"] == pytest.approx(2 * end_static / 3600, rel=1e-12) and "autoscaling" not in s["static"]
    assert [e["alive"] for e in s["auto"]["autoscaling"]["pools"]["replicas"]["timeline"]] == [1, 3, 3, 1]
    html = (tmp_path / "report.html").read_text(encoding="utf-8")
    assert 'id="autoscaling"' in html and "instances alive" in html and "<svg" in html
    assert build_report(tmp_path).read_text(encoding="utf-8").count('id="autoscaling"') == 1   # pdsim report DIR


def test_measured_prefill_capacity_is_prompts_per_busy_second():
    # constant 50 ms steps and one 100-token prompt per step (max_batched_tokens 100): a busy prefill
    # instance hands off exactly 1 / 0.05 = 20 prompts per busy second, whatever the load
    const = {"cost_model": {"kind": "constant", "step_s": 0.05}, "kv_blocks": 10000}
    topo = {"kind": "disaggregated", "prefill": {"instances": 1, **const, "max_batched_tokens": 100},
            "decode": {"instances": 1, **const},
            "autoscaler": {"policy": "slo", "interval_s": 2, "slo": {"window_s": 6, "prefill_capacity": "measured"},
                           "prefill": {"max": 2}, "decode": {"max": 2}}}
    sc = scenario({"t": topo}, rate=12, num_requests=400, prompt_tokens=100, output_tokens=5)
    a = simulate(sc)[0].topology.autoscaler
    got = [c for _, pool, c, how in a.capacities if pool == "prefill" and how == "measured"]
    assert len(got) > 5
    assert got == pytest.approx([20.0] * len(got), rel=1e-9)


def _shared_prefix_run(topo: dict, rate: float, n: int, output: int, shared: int):
    """One topology ``t`` at ``rate`` of ``n`` 1000-token prompts whose first ``shared`` tokens every prompt
    shares (workload.shared_prefix_tokens), ``output`` tokens out; the run's result."""
    sc = scenario({"t": topo}, rate=rate, num_requests=n, prompt_tokens=1000, output_tokens=output)
    sc = sc.model_copy(update={"workload": sc.workload.model_copy(update={"shared_prefix_tokens": shared})})
    return simulate(sc)[0]


def test_slo_planner_prices_prefill_at_the_share_its_prefix_cache_saves():
    # a linear step cost (10 ms + 0.1 ms per computed token + 0.01 ms per KV token read): a lone prefill of 1000
    # tokens costs 0.01 + 0.1 + 0.01 = 0.12 s; with its first 640 tokens cached (every prompt shares them, 40
    # blocks of 16) 0.01 + 0.1 x 360 / 1000 + 0.01 = 0.056 s.  Once the window holds only completions that hit
    # (the first request found nothing), the estimate is 1 / 0.056 requests/s per prefill instance
    from pdsim.autoscaler import capacity_per_instance, prefill_s
    lin = {"cost_model": {"kind": "linear", "base_s": 0.01, "per_token_s": 1e-4, "per_kv_token_s": 1e-5},
           "kv_blocks": 20000}
    topo = {"kind": "disaggregated", "prefill": {"instances": 1, **lin, "prefix_cache": {"enabled": True}},
            "decode": {"instances": 1, **lin},
            "autoscaler": {"policy": "slo", "interval_s": 2, "slo": {"window_s": 4}, "prefill": {"max": 3},
                           "decode": {"max": 3}}}
    res = _shared_prefix_run(topo, rate=4, n=60, output=4, shared=640)
    a = res.topology.autoscaler
    pool = res.topology.prefill
    assert prefill_s(pool, 1000, 0.64) == pytest.approx(0.056, rel=1e-12)
    assert prefill_s(pool, 1000, 0.0) == pytest.approx(0.12, rel=1e-12)
    assert prefill_s(pool, 1000, 1.0) == pytest.approx(0.01 + 1e-4 + 0.01, rel=1e-12)   # one token still computed
    est = [(t, c) for t, p, c, how in a.capacities if p == "prefill" and how == "estimate"]
    late = [c for t, c in est if t >= 8]
    assert late and late == pytest.approx([1 / 0.056] * len(late), rel=1e-12)
    assert capacity_per_instance(pool, 1000, 4, 0.1) == pytest.approx(1 / 0.12, rel=1e-12)
    # a pool that caches nothing computes the whole prompt whatever share another pool found cached
    from types import SimpleNamespace
    assert prefill_s(SimpleNamespace(cost=pool.cost, spec=SimpleNamespace(prefix_on=False)), 1000, 0.64) == \
        pytest.approx(0.12, rel=1e-12)
    # the decode pool caches nothing: its estimate does not move with the share
    assert capacity_per_instance(res.topology.decode, 1000, 4, 0.1, 0.64) == \
        capacity_per_instance(res.topology.decode, 1000, 4, 0.1, 0.0)


def test_slo_planner_cached_share_is_the_prefill_pool_first_hits():
    # PD, both pools caching, the decode pool short of KV so that it preempts and recomputes (its recompute finds
    # the prompt's pages and overwrites the request's cached_tokens): the planner's share must be the prefill
    # pool's own hit rate (each request admitted there once: hit tokens / prompt tokens), not the decode side's
    lin = {"cost_model": {"kind": "linear", "base_s": 0.005, "per_token_s": 2e-5, "per_kv_token_s": 1e-6}}
    topo = {"kind": "disaggregated",
            "prefill": {"instances": 1, **lin, "kv_blocks": 20000, "prefix_cache": {"enabled": True}},
            "decode": {"instances": 1, **lin, "kv_blocks": 300, "prefix_cache": {"enabled": True}},
            "autoscaler": {"policy": "slo", "interval_s": 2, "slo": {"window_s": 4}, "prefill": {"max": 1},
                           "decode": {"max": 1}}}
    res = _shared_prefix_run(topo, rate=10, n=120, output=400, shared=640)
    a = res.topology.autoscaler
    reqs = res.requests
    assert sum(r.preemptions for r in reqs) > 0                  # (the case needs decode preemptions)
    st = res.topology.prefill.instances[0].kv.stats
    assert st.lookup_tokens == 1000 * len(reqs)                  # every request admitted once on the prefill pool
    assert a.seen_cached == [st.lookup_tokens, st.gpu_hit_tokens + st.host_hit_tokens]
    # (what the finished requests carry is the decode side's recompute hit for the preempted ones: more)
    assert sum(r.cached_tokens for r in reqs) > st.gpu_hit_tokens + st.host_hit_tokens


def test_slo_planner_leaves_preempted_requests_out_of_the_cached_share():
    # colocated, a 16-token shared prefix and a pool short of KV: preempted requests come back to find their own
    # prompt pages cached (hundreds of tokens) though they computed them once; the share counts only requests never
    # preempted (hit 16 of 1000 tokens each, the first request none): 16 x (n - 1) / 1000 n
    lin = {"cost_model": {"kind": "linear", "base_s": 0.005, "per_token_s": 2e-5, "per_kv_token_s": 1e-6}}
    topo = {"kind": "colocated", "replicas": 1, **lin, "kv_blocks": 300, "prefix_cache": {"enabled": True},
            "autoscaler": {"policy": "slo", "interval_s": 2, "slo": {"window_s": 4}, "replicas": {"max": 1}}}
    res = _shared_prefix_run(topo, rate=10, n=120, output=400, shared=16)
    kept = [r for r in res.requests if r.preemptions == 0 and r.status == "finished"]
    preempted = [r for r in res.requests if r.preemptions]
    assert preempted and sum(r.cached_tokens for r in preempted) > 16 * len(preempted) * 2   # their inflated hits
    n = len(kept)
    assert res.topology.autoscaler.seen_cached == [1000 * n, 16 * (n - 1)]


def test_prefill_s_prices_a_cached_prompt_as_the_simulator_steps_it():
    # a vLLM v1 H100 replica (roofline, the engine's step overhead, its default prefix caching): the second of two
    # lone 1000-token prompts sharing 640 tokens finds them cached; its one prefill step (it arrives long after the
    # first has finished) is what prefill_s prices for a 1000-token prompt at that share (attention over the whole
    # context, the computed suffix only)
    from pdsim.autoscaler import prefill_s
    sc = scenario({"c": {"kind": "colocated", **H100, "engine": "vllm-v1"}}, arrival="constant", rate=0.5,
                  num_requests=2, prompt_tokens=1000, output_tokens=2)
    sc = sc.model_copy(update={"workload": sc.workload.model_copy(update={"shared_prefix_tokens": 640})})
    res = simulate(sc)[0]
    first, second = res.requests
    assert (first.cached_tokens, second.cached_tokens) == (0, 640)
    pool = res.topology.pools[0]
    assert second.prefill_end_s - second.prefill_start_s == pytest.approx(prefill_s(pool, 1000, 0.64), rel=1e-9)
    assert first.prefill_end_s - first.prefill_start_s == pytest.approx(prefill_s(pool, 1000, 0.0), rel=1e-9)
    assert prefill_s(pool, 1000, 0.64) < prefill_s(pool, 1000, 0.0)


@pytest.mark.parametrize("acceptance, m", [
    (0.5, 1.875),                                         # (1 - 0.5^4) / (1 - 0.5)
    # per request uniform on [0.3, 0.7]: E[a] = 0.5, E[a^2] = (0.7^3 - 0.3^3) / (3 x 0.4) = 0.26333..,
    # E[a^3] = (0.7^4 - 0.3^4) / (4 x 0.4) = 0.145: m = 1 + 0.5 + 0.263333.. + 0.145 = 1.9083333..
    ({"dist": "uniform", "low": 0.3, "high": 0.7}, 1 + 0.5 + 0.316 / 1.2 + 0.232 / 1.6),
])
def test_slo_capacity_of_a_speculative_decode_pool_by_hand(acceptance, m):
    """A decode pool with speculation (k 3, drafts at 0.1 of a target decode step) on a linear step cost of 5 ms +
    0.1 ms per token (nothing per KV token).  A verify step of B requests computes 4B tokens: 5 + 0.4 B ms; its
    3 drafts 3 x 0.1 x (5 + 0.1 B) ms: a step is 6.5 + 0.43 B ms and emits m tokens per request.  Within TPOT
    10 ms: (6.5 + 0.43 B) / m <= 10, so at m = 1.875 B = 28 (B = 29 gives 10.12 ms) and a request of 100
    output tokens takes 100 / m steps of 18.54 ms: capacity 28 / (100 / 1.875 x 0.01854) = 28.317 requests/s (at
    m = 1.90833, B = 29: 9.94 ms per token, 30 would take 10.17).
    (The plain estimate took a 5 + 0.1 B ms step of one token: B = 50, 50 / (100 x 0.01) = 50 requests/s.)"""
    from pdsim.autoscaler import capacity_per_instance
    lin = {"cost_model": {"kind": "linear", "base_s": 0.005, "per_token_s": 1e-4}, "kv_blocks": 100000,
           "max_running": 64}
    topo = {"kind": "disaggregated", "prefill": {"instances": 1, **lin},
            "decode": {"instances": 1, **lin, "speculative": {"k": 3, "acceptance": acceptance,
                                                             "draft_cost_fraction": 0.1}},
            "autoscaler": {"policy": "slo", "interval_s": 2, "prefill": {"max": 2}, "decode": {"max": 2}}}
    res = simulate(scenario({"t": topo}, rate=4, num_requests=4, prompt_tokens=100, output_tokens=10))[0]
    pool = res.topology.decode
    assert pool.spec_dec.mean_tokens() == pytest.approx(m, rel=1e-12)
    B = max(b for b in range(1, 65) if (0.0065 + 0.00043 * b) / m <= 0.01)
    assert B == (28 if acceptance == 0.5 else 29)
    assert pool.spec_dec.step_time(B, 150) == pytest.approx(0.0065 + 0.00043 * B, rel=1e-12)
    got = capacity_per_instance(pool, 100, 100, 0.01)
    assert got == pytest.approx(B / (100 / m * (0.0065 + 0.00043 * B)), rel=1e-12)
    if acceptance == 0.5:
        assert got == pytest.approx(28 * 1.875 / (100 * 0.01854), rel=1e-12)        # 28.317 requests/s


def test_readme_hours_at_70_percent_of_the_diurnal_peak_match_the_shipped_curve():
    """scenarios/autoscale-diurnal.yaml's hourly list, counted by hand: hours 8-20 are 0.70, 0.82, 0.90, 0.95,
    0.97, 1.00, 1.00, 0.98, 0.95, 0.90, 0.85, 0.80, 0.75 (13 hours at or above 0.70, 12 strictly above) and
    hour 21 is 0.68; README said 14 hours.  Its mean is 16.43 / 24 = 0.6846 (README: 0.68)."""
    import re
    import yaml
    from conftest import REPO
    hourly = yaml.safe_load((REPO / "scenarios" / "autoscale-diurnal.yaml").read_text())["workload"]["rate_curve"][
        "hourly"]
    assert [i for i, x in enumerate(hourly) if x >= 0.70] == list(range(8, 21))
    assert sum(hourly) / 24 == pytest.approx(0.6846, abs=1e-4)
    text = " ".join((REPO / "README.md").read_text().split())
    claims = re.findall(r"(?:above|at or above) 70%(?: of its peak)? for (\d+)(?: of 24)? hours", text)
    assert claims and all(int(n) == 13 for n in claims), claims
