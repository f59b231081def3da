"""SLO semantics: percentiles on known samples, attainment vs percentile mode, the binding bound.

Oracles: samples whose percentiles are counted by hand, and the M/D/1 waiting-time distribution
(Erlang's formula) for a batch-1 replica under Poisson arrivals.
"""
from __future__ import annotations

import json
import math

import numpy as np
import pandas as pd
import pytest

from conftest import scenario
from pdsim import config, metrics
from pdsim.errors import ConfigError
from pdsim.simulation import simulate


def _frame(ttft, tpot=None, status=None, output=None):
    n = len(ttft)
    return pd.DataFrame({"ttft_s": np.asarray(ttft, float),
                         "tpot_s": np.asarray(tpot if tpot is not None else [0.01] * n, float),
                         "status": status or ["finished"] * n,
                         "output_tokens": output or [10] * n})


def _slo(**kw):
    return config.SLOSpec(**kw)


def test_summary_percentiles_on_a_known_sample():
    # 1..101: linear interpolation puts p50 at 51, p90 at 91, p99 at 100 exactly (p95 would be 96)
    s = metrics._stats(pd.Series(np.arange(1, 102, dtype=float)))
    assert (s["p50"], s["p90"], s["p99"], s["mean"]) == (51.0, 91.0, 100.0, 51.0)
    # NaN (no value: a rejected request's TPOT) is left out, not counted as 0
    s = metrics._stats(pd.Series([1.0, 3.0, np.nan]))
    assert s["mean"] == 2.0 and s["p50"] == 2.0


def test_nearest_rank_percentile_counts_by_hand():
    x = np.arange(1, 1001, dtype=float)[::-1]        # unsorted on purpose
    assert metrics.nearest_rank(x, 99) == 990.0      # 990 of 1000 samples are <= 990
    assert metrics.nearest_rank(x, 99.9) == 999.0
    assert metrics.nearest_rank(x, 50) == 500.0
    assert metrics.nearest_rank(x, 100) == 1000.0
    assert metrics.nearest_rank(np.array([5.0]), 1) == 5.0
    assert metrics.nearest_rank(np.array([]), 99) is None
    # an infinite sample (a request never served) beyond the rank does not spoil the percentile
    assert metrics.nearest_rank(np.r_[np.arange(1.0, 100.0), np.inf], 99) == 99.0
    assert metrics.nearest_rank(np.r_[np.arange(1.0, 100.0), np.inf], 99.5) == math.inf


def test_percentile_mode_fails_where_attainment_mode_passes():
    # 1000 requests: 985 with TTFT 50 ms, 15 with 150 ms. Share within 100 ms = 98.5% >= 90%
    # (attainment PASS); the 99th and 99.9th percentiles are 150 ms > 100 ms (percentile FAIL).
    df = _frame([0.05] * 985 + [0.15] * 15)
    att = metrics.slo_verdict(df, _slo(ttft_s=0.1, tpot_s=0.05, ttft_percentile=99.9, attainment_target=0.9))
    pct = metrics.slo_verdict(df, _slo(mode="percentile", ttft_s=0.1, tpot_s=0.05, ttft_percentile=99.9))
    assert att["met"] is True and att["mode"] == "attainment"
    assert att["attainment"] == pytest.approx(0.985) and att["margin"] == pytest.approx(0.085)
    assert pct["met"] is False and pct["mode"] == "percentile"
    assert pct["bounds"]["ttft"]["measured_s"] == 0.15
    assert pct["binding"] == "ttft" and pct["margin"] == pytest.approx(0.1 - 0.15)
    assert pct["margin_unit"] == "s"
    # both bounds are reported with their own measured percentile (p90 of 10 ms TPOT = 10 ms)
    assert pct["bounds"]["tpot"]["measured_s"] == 0.01 and pct["bounds"]["tpot"]["met"] is True
    # with 985 of 1000 under the bound, p98.5 is the last percentile that passes
    assert metrics.slo_verdict(df, _slo(mode="percentile", ttft_s=0.1, ttft_percentile=98.5))["met"] is True
    assert metrics.slo_verdict(df, _slo(mode="percentile", ttft_s=0.1, ttft_percentile=98.6))["met"] is False


def test_binding_bound_is_the_tighter_one():
    # TTFT p90 = 0.09 of a 0.1 bound (10% headroom); TPOT p90 = 0.02 of a 0.05 bound (60%): TTFT binds
    df = _frame([0.09] * 10, tpot=[0.02] * 10)
    v = metrics.slo_verdict(df, _slo(mode="percentile", ttft_s=0.1, tpot_s=0.05))
    assert v["met"] and v["binding"] == "ttft" and v["margin"] == pytest.approx(0.01)
    v = metrics.slo_verdict(df, _slo(mode="percentile", ttft_s=1.0, tpot_s=0.021))
    assert v["met"] and v["binding"] == "tpot" and v["margin"] == pytest.approx(0.001)
    # attainment mode: the bound fewer requests meet binds; 3 of 10 miss TPOT, 1 of 10 misses TTFT
    df = _frame([2.0] + [0.01] * 9, tpot=[0.01] * 7 + [0.5] * 3)   # misses: request 0 (TTFT), 7-9 (TPOT)
    v = metrics.slo_verdict(df, _slo(ttft_s=1.0, tpot_s=0.1, attainment_target=0.5))
    assert v["binding"] == "tpot" and v["bounds"]["tpot"]["share_within"] == pytest.approx(0.7)
    assert v["attainment"] == pytest.approx(0.6) and v["met"] and v["margin"] == pytest.approx(0.1)


def test_unserved_requests_count_as_infinitely_late_in_percentile_mode():
    # 95 served at 10 ms, 5 rejected: rejecting work must not improve a percentile
    df = _frame([0.01] * 95 + [np.nan] * 5, tpot=[0.01] * 95 + [np.nan] * 5,
                status=["finished"] * 95 + ["rejected"] * 5)
    v = metrics.slo_verdict(df, _slo(mode="percentile", ttft_s=0.1, ttft_percentile=99, tpot_percentile=99))
    assert v["met"] is False and v["bounds"]["ttft"]["unserved"] and v["bounds"]["ttft"]["measured_s"] is None
    assert v["bounds"]["tpot"]["unserved"]
    v = metrics.slo_verdict(df, _slo(mode="percentile", ttft_s=0.1, ttft_percentile=95, tpot_percentile=95))
    assert v["met"] is True and v["bounds"]["ttft"]["measured_s"] == 0.01
    # one-token replies have no TPOT: they are not in the TPOT sample at all
    df = _frame([0.01] * 4, tpot=[np.nan] * 4, output=[1] * 4)
    v = metrics.slo_verdict(df, _slo(mode="percentile", tpot_s=1e-6))
    assert v["met"] is True and v["bounds"]["tpot"]["measured_s"] is None


def _md1_wait_cdf(t: float, lam: float, d: float) -> float:
    """P(W <= t) in an M/D/1 queue (Erlang): (1-rho) sum_{k<=t/d} (lam(kd-t))^k / k! e^{-lam(kd-t)}."""
    rho = lam * d
    return (1 - rho) * sum((lam * (k * d - t)) ** k / math.factorial(k) * math.exp(-lam * (k * d - t))
                           for k in range(int(t // d) + 1))


def test_md1_run_with_ttft_p99_near_150ms_fails_p999_in_percentile_mode(tmp_path):
    # a batch-1 replica, one-token replies: each request is one 30 ms step; Poisson at 20/s (rho 0.6)
    topo = {"kind": "colocated", "max_running": 1, "kv_blocks": 10000,
            "cost_model": {"kind": "constant", "step_s": 0.03}}
    base = scenario({"c": topo}, rate=20.0, num_requests=2000, prompt_tokens=10, output_tokens=1)
    raw = base.model_dump(exclude={"base_dir"}, exclude_unset=True)
    runs = {}
    for mode in ("attainment", "percentile"):
        raw["slo"] = {"mode": mode, "ttft_s": 0.1, "tpot_s": 0.05, "ttft_percentile": 99.9,
                      "attainment_target": 0.9}
        sc = config.parse(raw, "slo.yaml")
        from pdsim.output import write_outputs
        out = tmp_path / mode
        write_outputs(simulate(sc), sc, out)
        runs[mode] = (json.loads((out / "summary.json").read_text())["topologies"]["c"],
                      (out / "report.html").read_text())
    summ, html = runs["percentile"]
    v = summ["slo"]
    # TTFT = wait + 30 ms; theory: P(TTFT <= 0.1) = P(W <= 0.07) = 0.9196 (Erlang's M/D/1 formula)
    share = _md1_wait_cdf(0.07, 20.0, 0.03)
    assert share == pytest.approx(0.9196, abs=1e-3)
    assert summ["slo_attainment"] == pytest.approx(share, abs=0.03)
    assert 0.12 < summ["ttft_s"]["p99"] < 0.2                    # the "TTFT p99 ~150 ms" run
    assert v["mode"] == "percentile" and v["met"] is False and summ["slo_met"] is False
    assert v["bounds"]["ttft"]["measured_s"] > 0.1 and v["binding"] == "ttft" and v["margin"] < 0
    assert '<span class="fail">FAIL</span>' in html and '<span class="pass">' not in html
    from pdsim.charts import seconds
    assert "percentile mode" in html
    assert f"TTFT p99.9 {seconds(v['bounds']['ttft']['measured_s'])} vs 100\u00a0ms bound" in html
    summ_a, html_a = runs["attainment"]
    assert summ_a["slo"]["met"] is True and summ_a["slo_met"] is True and '<span class="pass">PASS</span>' in html_a
    assert summ_a["slo"]["bounds"]["ttft"]["measured_s"] == v["bounds"]["ttft"]["measured_s"]


def test_bad_slo_mode_is_one_line():
    raw = {"workload": {"rate": 1, "num_requests": 2}, "topologies": {"c": {"kind": "colocated"}},
           "slo": {"mode": "p99"}}
    with pytest.raises(ConfigError) as e:
        config.parse(raw, "s.yaml")
    msg = str(e.value)
    assert "\n" not in msg and msg.startswith("s.yaml") and "slo.mode" in msg and "p99" in msg, msg


def test_plan_judges_a_rate_by_the_slo_mode():
    # the M/D/1 replica above at its 20 req/s target: 95.7% of requests have TTFT <= 0.12 s
    # (Erlang: P(W <= 0.09) = 0.957), so attainment mode passes at 90%; TTFT p99.9 is ~0.2 s > 0.12 s,
    # so percentile mode must not recommend it
    from pdsim.plan import LocalExecutor, parse_plan, run_plan
    assert _md1_wait_cdf(0.09, 20.0, 0.03) == pytest.approx(0.957, abs=1e-3)
    rows = {}
    for mode in ("attainment", "percentile"):
        raw = {"name": "m", "model": "llama-3.1-8b", "seed": 0,
               "workload": {"arrival": "poisson", "num_requests": 1200, "prompt_tokens": 10, "output_tokens": 1},
               "slo": {"mode": mode, "ttft_s": 0.12, "tpot_s": 1.0, "ttft_percentile": 99.9,
                       "attainment_target": 0.9},
               "target": {"rate": 20},
               "search": {"devices": [{"name": "h100-sxm", "price_per_hour_usd": 1.0}],
                          "colocated": {"replicas": [1]},
                          "pool": {"kv_blocks": 10000, "max_running": 1,
                                   "cost_model": {"kind": "constant", "step_s": 0.03}}},
               "goodput": {"seeds": 2}}
        (rows[mode],) = run_plan(parse_plan(raw), LocalExecutor(1))["rows"]
    assert rows["attainment"]["meets"] is True
    assert rows["percentile"]["meets"] is False and rows["percentile"]["status"] == "misses SLO at target"
