"""`goodput.error_margin` worked by hand: a plan that judges each config at SLO bounds tightened by pdsim's
measured error for its engine and GPU, so that its goodput holds if real latencies exceed pdsim's as they
did on held-out benchmark runs (pdsim/plan.py: error_margin, judged_slo)."""
from __future__ import annotations

import json

import pytest

from conftest import ScriptedExecutor

from pdsim.errors import ConfigError
from pdsim.plan import MarginSpec, error_margin, judged_slo, parse_plan, run_plan
from pdsim.config import SLOSpec

BAND = {"engine": "vllm-v1", "device": "h100-sxm", "ttft_measured_over_sim_p90": 1.8,
        "ttft_measured_over_sim_median": 0.9, "tpot_measured_over_sim_p90": 1.25, "tpot_measured_over_sim_median": 1.05}


def test_error_margin_factors_by_hand():
    # fixed margins: factor 1 + margin
    m = error_margin(MarginSpec(ttft=0.3, tpot=0.1), {}, "replica", "replica")
    assert (m["ttft_factor"], m["tpot_factor"]) == (1.3, 1.1)
    assert error_margin("none", {"replica": BAND}, "replica", "replica") is None
    # p90: the band's measured/simulated ratios as they are
    m = error_margin("p90", {"replica": BAND}, "replica", "replica")
    assert (m["ttft_factor"], m["tpot_factor"]) == (1.8, 1.25)
    assert "p90" in m["source"] and "vllm-v1|h100-sxm" in m["source"]
    # median: a ratio below 1 (pdsim slower than the real runs) never loosens a bound
    m = error_margin("median", {"replica": BAND}, "replica", "replica")
    assert (m["ttft_factor"], m["tpot_factor"]) == (1.0, 1.05)
    # how often both factors held at once is the band's own figure, for p90 and one band only
    shared = {**BAND, "both_within_p90_share": 0.764}
    assert error_margin("p90", {"replica": shared}, "replica", "replica")["both_within_share"] == 0.764
    assert error_margin("median", {"replica": shared}, "replica", "replica")["both_within_share"] is None
    # disaggregated: TTFT from the pool a request enters, TPOT from the one it decodes on
    other = {**BAND, "engine": "trtllm", "ttft_measured_over_sim_p90": 3.0, "tpot_measured_over_sim_p90": 1.1}
    m = error_margin("p90", {"prefill": BAND, "decode": other}, "prefill", "decode")
    assert (m["ttft_factor"], m["tpot_factor"]) == (1.8, 1.1)
    assert "TTFT vllm-v1|h100-sxm" in m["source"] and "TPOT trtllm|h100-sxm" in m["source"]
    assert error_margin("p90", {"prefill": shared, "decode": {**other, "both_within_p90_share": 0.8}},
                        "prefill", "decode")["both_within_share"] is None       # two bands: not measured together


def test_error_margin_without_a_measured_band_says_which_pool_and_key():
    with pytest.raises(ConfigError) as e:
        error_margin("p90", {"prefill": BAND, "decode": "unvalidated"}, "prefill", "decode")
    assert (e.value.key, e.value.value) == ("goodput.error_margin", "p90")
    assert "TPOT" in str(e.value) and "pool decode" in str(e.value) and "unvalidated" in str(e.value)
    old = {k: v for k, v in BAND.items() if "measured_over_sim" not in k}      # a table written before the ratios
    with pytest.raises(ConfigError) as e:
        error_margin("median", {"replica": old}, "replica", "replica")
    assert "TTFT" in str(e.value) and "no measured/simulated ratios" in str(e.value)


def test_judged_slo_divides_the_bounds_and_keeps_the_rest():
    slo = SLOSpec(ttft_s=0.5, tpot_s=0.05, attainment_target=0.95, mode="percentile", ttft_percentile=99)
    j = judged_slo(slo, {"ttft_factor": 2.0, "tpot_factor": 1.25})
    assert (j.ttft_s, j.tpot_s, j.attainment_target, j.mode, j.ttft_percentile) == (0.25, 0.04, 0.95, "percentile", 99)
    assert judged_slo(slo, None) is slo
    with pytest.raises(Exception):
        MarginSpec(ttft=-0.1)


# one colocated replica whose every step takes 0.1 s (a constant cost model): a lone request's TTFT is one
# prefill step, 0.1 s, and its TPOT one decode step, 0.1 s (output 2 tokens)
SEARCH = {"devices": [{"name": "h100-sxm", "price_per_hour_usd": 1.0}], "colocated": {"replicas": [1]},
          "pool": {"max_running": 4, "kv_blocks": 1000, "cost_model": {"kind": "constant", "step_s": 0.1}}}


def _raw(margin, tpot_s=0.5):
    return {"name": "m", "model": "llama-3.1-8b", "seed": 3,
            "workload": {"arrival": "poisson", "num_requests": 50, "prompt_tokens": 8, "output_tokens": 2},
            "slo": {"ttft_s": 0.5, "tpot_s": tpot_s, "attainment_target": 0.9},
            "search": SEARCH, "goodput": {"min_duration_s": 0, "seeds": 1, "confirm_top": 0, "error_margin": margin}}


def test_a_fixed_margin_can_make_a_config_infeasible_alone():
    # TTFT margin 3 (factor 4): judged bound 0.5 / 4 = 0.125 s >= the lone prefill's 0.1 s: feasible
    (cfg,) = parse_plan(_raw({"ttft": 3.0, "tpot": 0.25})).configs
    assert (cfg.slo.ttft_s, cfg.slo.tpot_s) == (pytest.approx(0.125), pytest.approx(0.4))
    assert cfg.infeasible == ""
    # factor 6: 0.5 / 6 = 0.0833 s < 0.1 s for every request: infeasible, the note names the judged bound
    (cfg,) = parse_plan(_raw({"ttft": 5.0})).configs
    assert cfg.infeasible.startswith("TTFT: a lone prefill exceeds 0.08333") and "100%" in cfg.infeasible
    # TPOT 0.5 / 6 < the 0.1 s decode step: infeasible by TPOT
    (cfg,) = parse_plan(_raw({"tpot": 5.0})).configs
    assert cfg.infeasible.startswith("TPOT: a lone decode step exceeds 0.08333")
    # no margin: the plan's own bounds
    (cfg,) = parse_plan(_raw("none")).configs
    assert (cfg.slo.ttft_s, cfg.slo.tpot_s, cfg.margin, cfg.p90_factors) == (0.5, 0.5, None, None)   # no band


def test_a_named_margin_excludes_a_config_nobody_measured():
    # a constant cost model is a what-if with no measured band: the only config goes, the plan says why
    with pytest.raises(ConfigError) as e:
        parse_plan(_raw("p90"))
    assert e.value.key == "goodput.error_margin" and "constant cost model" in str(e.value)
    assert "no configuration of the search space both fits the budget and the model and has a measured error band" \
        in str(e.value)
    # over budget as well: the budget says so first (the margin is asked only of configs the budget keeps)
    raw = _raw("p90")
    raw["search"]["colocated"]["replicas"] = [2]
    raw["budget"] = {"max_gpus": 1}
    with pytest.raises(ConfigError) as e:
        parse_plan(raw)
    assert e.value.key == "budget" and "2 GPUs > budget.max_gpus 1" in str(e.value)


@pytest.mark.parametrize("target", [None, 2.0])      # goodput mode; target mode (its own miss note)
def test_every_simulation_is_judged_at_the_config_bounds_and_the_outputs_say_so(target):
    raw = _raw({"ttft": 1.0, "tpot": 0.0})                      # TTFT bound 0.5 / 2 = 0.25 s
    if target:
        raw["target"] = {"rate": target}
    plan = parse_plan(raw)
    seen = []

    class Recording(ScriptedExecutor):
        def map(self, fn, tasks, on_done=None):
            seen.extend(t["scenario"]["slo"] for t in tasks)
            return super().map(fn, tasks, on_done)

    # every rate misses: 50 of 100 within the TTFT bound
    res = {"n": 100, "ok": 50, "ttft_ok": 50, "tpot_ok": 100, "finished": 100, "early": None, "settled": 100,
           "total": 100, "ci": None, "ttft_p": 0.3, "tpot_p": 0.1, "slo_met": False}
    result = run_plan(plan, executor=Recording(lambda *a: dict(res)))
    assert seen and all((s["ttft_s"], s["tpot_s"]) == (0.25, 0.5) for s in seen)
    (row,) = result["rows"]
    assert (row["judged_ttft_s"], row["judged_tpot_s"]) == (0.25, 0.5)
    assert row["error_margin"]["ttft_factor"] == 2.0 and result["error_margin"] == {"ttft": 1.0, "tpot": 0.0}
    assert result["slo"]["ttft_s"] == 0.5                           # the plan's own SLO is reported as given
    assert "TTFT: 50% within 0.25 s" in row["note"]                 # the miss is told against the judged bound
    assert row["status"] == ("misses SLO at target" if target else "misses SLO at every rate")
    json.dumps(result, default=str)


def test_print_table_states_the_winner_judged_bounds():
    import io
    from pdsim.plan import print_table
    row = {"rank": 1, "config": "c", "pareto": True, "gpus": 1, "usd_per_hour": 1.0, "goodput": 2.0, "margin": None,
           "goodput_per_gpu": 2.0, "goodput_per_usd_hour": 2.0, "attainment_at_target": None, "status": "ok", "note": "",
           "expected_error": {}, "judged_ttft_s": 0.25, "judged_tpot_s": 0.04,
           "error_margin": {"ttft_factor": 2.0, "tpot_factor": 1.25, "source": "fixed: TTFT +100%, TPOT +25%"}}
    out = io.StringIO()
    print_table({"rows": [row], "winner": "c", "target_rate": None}, out=out)
    assert ("c judged at TTFT <= 0.25 s and TPOT <= 0.04 s: the SLO's bounds / 2 and / 1.25 (goodput.error_margin, "
            "fixed: TTFT +100%, TPOT +25%)") in out.getvalue()
    out = io.StringIO()
    print_table({"rows": [{**row, "error_margin": None}], "winner": "c", "target_rate": None}, out=out)
    assert "judged at" not in out.getvalue()
    # no winner: the closing line says the bounds were tightened
    for margin, says in (("p90", " at the bounds goodput.error_margin (p90) tightened (plan.csv: judged_ttft_s, "
                                 "judged_tpot_s)"), ({"ttft": 0.3, "tpot": 0.0}, " at the bounds goodput.error_margin "
                                                                                "(fixed) tightened (plan.csv: judged_ttft_s, "
                                                                                "judged_tpot_s)"), ("none", "")):
        out = io.StringIO()
        print_table({"rows": [row], "winner": None, "target_rate": 2.0, "error_margin": margin}, out=out)
        assert f"no configuration meets the SLO at 2 req/s{says} within the budget" in out.getvalue()


def test_a_failed_long_run_is_told_against_the_judged_bounds():
    # target 2 req/s: the 50-request search run passes (all 100 within the bounds); the long run (10 x 50 = 500
    # requests, fresh seed) has 60 of 100 within the judged TTFT bound, so the config fails it
    raw = _raw({"ttft": 1.0, "tpot": 0.0})
    raw["target"] = {"rate": 2.0}
    raw["goodput"].update(confirm_top=1, confirm_factor=10, confirm_max_factor=10)
    base = {"n": 100, "tpot_ok": 100, "finished": 100, "early": None, "settled": 100, "total": 100, "ci": None,
            "ttft_p": 0.3, "tpot_p": 0.1}

    def answer(name, rate, n):
        ok = 100 if n == 50 else 60
        return {**base, "ok": ok, "ttft_ok": ok, "slo_met": ok >= 90}

    class Script(ScriptedExecutor):
        def __init__(self):
            super().__init__(lambda name, rate, seed, n: answer(name, rate, n))

    (row,) = run_plan(parse_plan(raw), executor=Script())["rows"]
    assert row["status"] == "fails long run"
    assert "TTFT: 60% within 0.25 s" in row["note"]


def test_the_plan_report_verdict_states_the_judged_bounds():
    from pdsim.plan_report import _verdict
    row = {"config": "c", "meets": True, "gpus": 1, "usd_per_hour": 1.0, "goodput": 2.0, "expected_error": {},
           "judged_ttft_s": 0.25, "judged_tpot_s": 0.04,
           "error_margin": {"ttft_factor": 2.0, "tpot_factor": 1.25, "source": "fixed: TTFT +100%, TPOT +25%"}}
    result = {"slo": {"ttft_s": 0.5, "tpot_s": 0.05, "attainment_target": 0.9}, "target_rate": None, "rows": [row],
              "winner": "c", "objective": "goodput_per_usd"}
    text = _verdict(result)
    assert "judged at TTFT ≤ 250\xa0ms and TPOT ≤ 40\xa0ms" in text and "divided by 2 and 1.25" in text
    assert "judged at" not in _verdict({**result, "rows": [{**row, "error_margin": None}]})
    text = _verdict({**result, "rows": [{**row, "error_margin": None, "long_run_attainment_at_p90_error": 0.7}]})
    assert "p90 measured/simulated latency over its validation runs: attainment 70.0% (target 90.0%" in text


# --- a run's verdict at the p90 error (summary.json's slo_at_error) ------------------------------------------
def _df(rows):
    """A requests frame of (status, ttft_s, tpot_s, output_tokens) rows."""
    import pandas as pd
    return pd.DataFrame(rows, columns=["status", "ttft_s", "tpot_s", "output_tokens"])


def test_slo_at_error_judges_at_the_p90_bounds_by_hand():
    from pdsim import metrics
    from pdsim.workload import FINISHED, REJECTED
    slo = SLOSpec(ttft_s=0.5, tpot_s=0.05, attainment_target=0.75)
    # TTFT p90 ratio 1.8 and TPOT 1.25: judged at 0.5 / 1.8 = 0.2778 s and 0.05 / 1.25 = 0.04 s
    df = _df([(FINISHED, 0.10, 0.030, 10),     # within both, as simulated and at the error
              (FINISHED, 0.30, 0.030, 10),     # TTFT 0.30 <= 0.5 but > 0.2778: a miss at the error
              (FINISHED, 0.20, 0.045, 10),     # TPOT 0.045 <= 0.05 but > 0.04: a miss at the error
              (FINISHED, 0.27, 0.040, 10),     # on the edge of both (0.27 <= 0.2778, 0.04 <= 0.04): a pass
              (REJECTED, float("nan"), float("nan"), 10)])
    assert metrics.slo_verdict(df, slo)["attainment"] == 0.8          # 4 of 5 as simulated: met (>= 0.75)
    e = metrics.slo_at_error(df, slo, {"replica": BAND}, "replica", "replica")
    assert (e["attainment"], e["met"]) == (0.4, False)                 # 2 of 5 at the error
    assert (e["ttft_s"], e["tpot_s"]) == (pytest.approx(0.5 / 1.8), pytest.approx(0.04))
    assert (e["margin"]["ttft_factor"], e["margin"]["tpot_factor"]) == (1.8, 1.25)
    # a target of 40% is met at the error (2 of 5)
    e = metrics.slo_at_error(df, slo.model_copy(update={"attainment_target": 0.4}), {"replica": BAND}, "replica", "replica")
    assert (e["attainment"], e["met"]) == (0.4, True)
    # percentile mode judges percentiles at the tightened bounds: TTFT of the 5 (the rejected one +inf), p60 by
    # nearest rank is the 3rd of .10 .20 .27 .30 inf = 0.27 <= 0.2778; TPOT p50 of the five (the rejected one +inf
    # too: .030 .030 .040 .045 inf): the 3rd, 0.040 <= 0.04: met; p80 of TTFT is the 4th, 0.30 > 0.2778: missed
    pslo = slo.model_copy(update={"mode": "percentile", "ttft_percentile": 60, "tpot_percentile": 50})
    e = metrics.slo_at_error(df, pslo, {"replica": BAND}, "replica", "replica")
    assert (e["mode"], e["ttft_p_s"], e["tpot_p_s"], e["met"]) == ("percentile", 0.27, 0.04, True)
    e = metrics.slo_at_error(df, pslo.model_copy(update={"ttft_percentile": 80}), {"replica": BAND}, "replica", "replica")
    assert (e["ttft_p_s"], e["met"]) == (0.30, False)
    import io
    from pdsim.__main__ import print_error_bands
    out = io.StringIO()
    print_error_bands({"t": {"slo_at_error": e}}, out=out)
    assert out.getvalue().rstrip().endswith("t MISSED (TTFT p80 300 ms, TPOT p50 40 ms)")
    # a pool nobody measured: no verdict, and why
    e = metrics.slo_at_error(df, slo, {"prefill": BAND, "decode": "unvalidated"}, "prefill", "decode")
    assert e == {"margin": None, "why": "decode: unvalidated"}


def test_a_run_reports_its_verdict_at_the_stored_p90_error(tmp_path):
    # a vLLM v1 replica on an H100: the factors are the stored band's (pdsim/data/validation_error.json), and the
    # verdict is the run's requests judged at the bounds divided by them
    from pdsim import config, metrics
    from pdsim.simulation import simulate
    from pdsim.validate import ERROR_TABLE
    raw = {"seed": 1, "model": "llama-3.1-8b", "slo": {"ttft_s": 0.08, "tpot_s": 0.012, "attainment_target": 0.5},
           "workload": {"arrival": "poisson", "rate": 4, "num_requests": 40, "prompt_tokens": 1000, "output_tokens": 20},
           "topologies": {"c": {"kind": "colocated", "device": "h100-sxm", "engine": "vllm-v1"}}}
    sc = config.parse(raw, "t.yaml")
    res = simulate(sc)
    df = metrics.requests_frame(res, sc.client)
    s = metrics.summarize(res, df, sc)["c"]
    band = json.loads(ERROR_TABLE.read_text())["bands"]["vllm-v1|h100-sxm"]
    f_ttft, f_tpot = max(1.0, band["ttft_measured_over_sim_p90"]), max(1.0, band["tpot_measured_over_sim_p90"])
    e = s["slo_at_error"]
    assert (e["margin"]["ttft_factor"], e["margin"]["tpot_factor"]) == (f_ttft, f_tpot)
    fin = df.status == "finished"
    ok = fin & (df.ttft_s <= 0.08 / f_ttft) & (df.tpot_s.isna() | (df.tpot_s <= 0.012 / f_tpot))
    assert e["attainment"] == pytest.approx(float(ok.mean()))
    assert e["attainment"] < s["slo_attainment"]       # (tighter bounds, chosen so that some requests fall between)
    assert e["met"] == (e["attainment"] >= 0.5)
    # the CLI says it under the bands
    import io
    from pdsim.__main__ import print_error_bands
    out = io.StringIO()
    print_error_bands({"c": s}, out=out)
    line = out.getvalue().splitlines()[-1]
    assert line.startswith("SLO at p90 error (TTFT <= ")
    both = band.get("both_within_p90_share")
    assert line.endswith(f"the bounds / {f_ttft:.3g} and / {f_tpot:.3g}, the p90 (at least 1) of measured/simulated TTFT and of "
                         "TPOT over held-out runs" + (f"; both within them on {both:.0%} of those runs" if both else "")
                         + f"): c {'met' if e['met'] else 'MISSED'} ({e['attainment']:.1%})")
    # two topologies judged at the same bounds share one line; different bounds get their own
    out = io.StringIO()
    print_error_bands({"c": s, "d": {**s, "slo_at_error": {**e, "met": False}},
                       "x": {**s, "slo_at_error": {**e, "ttft_s": 1.0}}}, out=out)
    lines = [ln for ln in out.getvalue().splitlines() if ln.startswith("SLO at p90 error")]
    assert len(lines) == 2 and lines[0].endswith(f"c {'met' if e['met'] else 'MISSED'} ({e['attainment']:.1%}), "
                                                 f"d MISSED ({e['attainment']:.1%})")
    assert lines[1].startswith("SLO at p90 error (TTFT <= 1,000 ms")
    assert lines[1].endswith(f"): x {'met' if e['met'] else 'MISSED'} ({e['attainment']:.1%})")
    # and the report's summary rows
    from pdsim.report import _engine_items
    rows = dict(_engine_items(s))
    assert rows["SLO at p90 error"].startswith(f"{'met' if e['met'] else 'missed'}: attainment ")


def test_a_disaggregated_run_takes_ttft_error_from_prefill_and_tpot_error_from_decode():
    from pdsim import config, metrics
    from pdsim.simulation import simulate
    from pdsim.validate import ERROR_TABLE
    raw = {"seed": 1, "model": "llama-3.1-8b",
           "workload": {"arrival": "poisson", "rate": 2, "num_requests": 10, "prompt_tokens": 500, "output_tokens": 8},
           "topologies": {"pd": {"kind": "disaggregated", "prefill": {"device": "h100-sxm", "engine": "vllm-v1"},
                                 "decode": {"device": "h100-sxm", "engine": "trtllm"}}}}
    sc = config.parse(raw, "t.yaml")
    res = simulate(sc)
    e = metrics.summarize(res, metrics.requests_frame(res, sc.client), sc)["pd"]["slo_at_error"]
    bands = json.loads(ERROR_TABLE.read_text())["bands"]
    assert e["margin"]["ttft_factor"] == max(1.0, bands["vllm-v1|h100-sxm"]["ttft_measured_over_sim_p90"])
    assert e["margin"]["tpot_factor"] == max(1.0, bands["trtllm|h100-sxm"]["tpot_measured_over_sim_p90"])
    assert bands["vllm-v1|h100-sxm"]["ttft_measured_over_sim_p90"] != bands["trtllm|h100-sxm"]["ttft_measured_over_sim_p90"]


def test_a_plan_takes_ttft_error_from_the_prefill_gpu_and_tpot_error_from_the_decode_gpu():
    from pdsim.validate import ERROR_TABLE
    raw = _raw("p90")
    raw["search"] = {"devices": ["h100-sxm"], "pool": {"engine": "vllm-v1"},
                     "disaggregated": {"prefill_instances": [1], "decode_instances": [1], "decode_devices": ["h200"],
                                       "kv_link": ["infiniband"]}}
    (cfg,) = parse_plan(raw).configs
    bands = json.loads(ERROR_TABLE.read_text())["bands"]
    want = (max(1.0, bands["vllm-v1|h100-sxm"]["ttft_measured_over_sim_p90"]),
            max(1.0, bands["vllm-v1|h200"]["tpot_measured_over_sim_p90"]))
    assert (cfg.margin["ttft_factor"], cfg.margin["tpot_factor"]) == want
    assert want != (max(1.0, bands["vllm-v1|h200"]["ttft_measured_over_sim_p90"]),
                    max(1.0, bands["vllm-v1|h100-sxm"]["tpot_measured_over_sim_p90"]))    # the two GPUs differ
    assert (cfg.slo.ttft_s, cfg.slo.tpot_s) == (pytest.approx(0.5 / want[0]), pytest.approx(0.5 / want[1]))
    # without a margin the config still knows its p90 factors (its long runs are judged at them too)
    raw["goodput"]["error_margin"] = "none"
    (cfg,) = parse_plan(raw).configs
    assert (cfg.margin, cfg.p90_factors, cfg.slo.ttft_s) == (None, want, 0.5)


def test_miss_notes_give_judged_bounds_to_four_digits():
    from pdsim.plan import _misses
    r = {"n": 100, "ok": 50, "ttft_ok": 50, "tpot_ok": 50, "ttft_p": 0.3, "tpot_p": 0.2}
    slo = SLOSpec(ttft_s=0.5, tpot_s=0.05, attainment_target=0.9).tightened(3.0, 1.6)    # 0.1666..., 0.03125
    assert _misses(r, slo) == "TTFT: 50% within 0.1667 s (p90 0.3 s); TPOT: 50% within 0.03125 s (p90 0.2 s)"
    slo = slo.model_copy(update={"mode": "percentile"})
    assert _misses(r, slo) == "TTFT p90 0.3 s > 0.1667 s; TPOT p90 0.2 s > 0.03125 s"


def test_the_plan_log_counts_configs_excluded_for_want_of_a_band(tmp_path, capsys):
    # H100 (a band: the idealised engine's) and A100 (none) under p90: the A100 config is excluded, and said so
    import yaml
    from pdsim.__main__ import main
    raw = _raw("p90")
    raw["search"] = {"devices": ["h100-sxm", "a100-80gb-sxm"], "colocated": {"replicas": [1]}}
    raw["workload"]["num_requests"] = 20
    raw["target"] = {"rate": 0.5}
    raw["goodput"]["max_rounds"] = 2
    (tmp_path / "p.yaml").write_text(yaml.safe_dump(raw))
    main(["plan", str(tmp_path / "p.yaml"), "--no-cache", "--jobs", "1", "--out", str(tmp_path / "o")])
    err = capsys.readouterr().err
    assert ("1 configs in the search space (0 excluded by budget or fit, 1 with no measured error band for "
            "goodput.error_margin; plan.json lists each)") in err
    ex = json.loads((tmp_path / "o" / "plan.json").read_text())["excluded"]
    assert [e["config"] for e in ex] == ["colo-a100-80gb-sxm-tp1x1"] and "unvalidated" in ex[0]["reason"]


def test_a_sweep_gives_the_goodput_at_pdsim_p90_error(tmp_path, capsys):
    # a vLLM v1 H100 replica (a measured band) and a constant-cost one (none) over four rates: each row's
    # attainment at the error is the run judged at the tightened bounds, never above the plain one (tighter
    # bounds can only lose requests), and the goodput at the error follows the same rule over those
    import yaml
    from pdsim.__main__ import main
    from pdsim.sweep import goodput
    raw = {"name": "s", "seed": 2, "model": "llama-3.1-8b",
           "slo": {"ttft_s": 0.05, "tpot_s": 0.012, "attainment_target": 0.9},
           "workload": {"arrival": "poisson", "rate": 1, "num_requests": 60, "prompt_tokens": 800, "output_tokens": 20},
           "topologies": {"v1": {"kind": "colocated", "device": "h100-sxm", "engine": "vllm-v1"},
                          "const": {"kind": "colocated", "kv_blocks": 1000, "cost_model": {"kind": "constant", "step_s": 0.001}}}}
    (tmp_path / "s.yaml").write_text(yaml.safe_dump(raw))
    out = tmp_path / "o"
    assert main(["sweep", str(tmp_path / "s.yaml"), "--set", "workload.rate=5,20,40,80", "--out", str(out),
                 "--jobs", "1", "--quiet"]) == 0
    res = json.loads((out / "sweep.json").read_text())
    v1 = [r for r in res["rows"] if r["topology"] == "v1"]
    assert all(r["slo_attainment_at_p90_error"] <= r["slo_attainment"] for r in v1)
    assert any(r["slo_attainment_at_p90_error"] < r["slo_attainment"] for r in v1)     # (the grid is chosen so)
    assert all(r["slo_attainment_at_p90_error"] is None for r in res["rows"] if r["topology"] == "const")
    want = goodput([r["workload.rate"] for r in v1], [r["slo_attainment_at_p90_error"] for r in v1], 0.9)
    assert res["goodput_at_p90_error"] == {"v1": want}
    printed = capsys.readouterr().out
    assert "v1: at pdsim's p90 error" in printed and "const: at pdsim's p90 error" not in printed
    html = (out / "sweep.html").read_text()
    assert html.count("at pdsim&#x27;s p90 error") == 1           # v1's clause in the verdict, none for const


# --- a plan's long runs judged at pdsim's p90 error ----------------------------------------------------------
def test_a_run_to_the_end_counts_its_requests_at_the_error_factors(tmp_path):
    # test_plan_evaluate_by_hand's block of five (constant 0.25 s steps): TTFT .25 .25 .375 .25 .25, TPOT .375
    # .375 .333 .25 and none.  Bounds 0.5 / 0.5: all five meet both.  At factors (2, 1.4) the bounds are 0.25 and
    # 0.357: TTFT ok r0 r1 r3 r4, TPOT ok r2 (.333) r3 r4 -> both: r3, r4 = 2
    from test_plan_evaluate_by_hand import BLOCK, _task
    from pdsim.plan import evaluate
    task = _task(tmp_path, BLOCK, {"ttft_s": 0.5, "tpot_s": 0.5, "attainment_target": 0.9})
    r = evaluate({**task, "error_factors": [2.0, 1.4]})
    assert (r["n"], r["ok"], r["ok_at_error"]) == (5, 5, 2)
    assert "ok_at_error" not in evaluate(task)              # no factors asked: nothing judged at the error


def test_the_winner_long_run_is_also_judged_at_the_p90_error(capsys):
    # goodput mode, one config whose pools have a measured band (p90 factors 1.5 and 1.2 given by hand here), no
    # margin set: its long runs carry the factors and the winner's line reports the worst seed's share at the error
    import io
    from pdsim.plan import Config, print_table
    raw = _raw("none")
    raw["goodput"].update(confirm_top=1, confirm_seeds=2, confirm_factor=10, confirm_max_factor=10)
    plan = parse_plan(raw)
    (cfg,) = plan.configs
    plan.configs = [Config(cfg.name, cfg.topology, 1, 1.0, bound_rate=4.0, slo=cfg.slo, p90_factors=(1.5, 1.2))]
    asked = []

    class Script(ScriptedExecutor):
        def map(self, fn, tasks, on_done=None):
            asked.extend(t.get("error_factors") for t in tasks)
            return super().map(fn, tasks, on_done)

    def answer(name, rate, seed, n):
        r = {"n": 100, "ok": 95, "ttft_ok": 95, "tpot_ok": 100, "finished": 100, "early": None, "settled": 100,
             "total": 100, "ci": [0.94, 0.96], "ttft_p": 0.1, "tpot_p": 0.1, "slo_met": True}
        if n == 500:       # a long run (10 x the 50-request window): 80 and 70 of 100 at the error on its 2 seeds
            r["ok_at_error"] = 80 if seed % 2 else 70          # (the two fresh seeds are consecutive)
        return r
    result = run_plan(plan, executor=Script(answer))
    long_asks = [a for a in asked if a is not None]
    assert long_asks == [[1.5, 1.2], [1.5, 1.2]]          # only the two long runs, with the config's factors
    (row,) = result["rows"]
    assert row["long_run_attainment_at_p90_error"] == 0.7
    out = io.StringIO()
    print_table(result, out=out)
    assert f"{row['config']} at pdsim's p90 error (its long run judged at the bounds / the p90 of measured/simulated " \
           "latency over its validation runs): attainment 70.0%" in out.getvalue()
    # with a margin set, the long runs are judged at the margin already: no second judgement
    plan = parse_plan(_raw({"ttft": 0.5}) | {"goodput": raw["goodput"] | {"error_margin": {"ttft": 0.5}}})
    (cfg,) = plan.configs
    plan.configs = [Config(cfg.name, cfg.topology, 1, 1.0, bound_rate=4.0, slo=cfg.slo, margin=cfg.margin,
                           p90_factors=(1.5, 1.2))]
    asked.clear()
    run_plan(plan, executor=Script(answer))
    assert all(a is None for a in asked)
    # percentile mode judges percentiles, not a share: no second judgement either
    raw["slo"]["mode"] = "percentile"
    plan = parse_plan(raw)
    plan.configs = [Config(cfg.name, cfg.topology, 1, 1.0, bound_rate=4.0, slo=plan.spec.slo, p90_factors=(1.5, 1.2))]
    asked.clear()
    run_plan(plan, executor=Script(answer))
    assert asked and all(a is None for a in asked)


def test_an_in_sample_moe_band_is_said_to_be_in_sample():
    import io
    from pdsim.__main__ import print_error_bands
    from pdsim.validate import margin_factors
    moe = {**BAND, "moe": True, "in_sample": True}
    assert margin_factors({"r": BAND}, "r", "r")["in_sample"] is False
    m = margin_factors({"p": BAND, "d": moe}, "p", "d")
    assert m["in_sample"] is True and "TPOT vllm-v1|h100-sxm (MoE, in sample)" in m["source"]
    e = {"margin": m, "met": True, "attainment": 1.0, "ttft_s": 0.1, "tpot_s": 0.01}
    out = io.StringIO()
    print_error_bands({"t": {"slo_at_error": e}, "u": {"slo_at_error": {**e, "margin": {**m, "in_sample": False}}}},
                      out=out)
    lines = out.getvalue().splitlines()
    assert "TPOT over its in-sample MoE runs): t met (100.0%)" in lines[0]
    assert "TPOT over held-out runs): u met (100.0%)" in lines[1]


def test_error_stats_ratios_round_up_and_say_how_often_both_held():
    # two runs: TTFT measured/simulated 1.1 and 0.8, TPOT 1.05 and 0.95.  p90 by nearest rank: the
    # ceil(0.9 x 2) = 2nd smallest, 1.1 and 1.05 (linear interpolation would give 1.07 and 1.04, which run 1 exceeds:
    # a factor covering 1 run in 2); both within them: both runs.  Three runs, TTFT 0.8, 1.1, 1.5 with TPOT 1.0
    # each: p90 = the 3rd, 1.5; run 2 (1.1, 1.0) and all are within: 1.0
    from pdsim.validate import _ceil2, error_stats
    rows = [{"ttft_ape": 10.0, "tpot_ape": 5.0, "sim_ttft_ms": 100.0, "ttft_ms": 110.0, "sim_tpot_ms": 10.0, "tpot_ms": 10.5},
            {"ttft_ape": 20.0, "tpot_ape": 5.0, "sim_ttft_ms": 100.0, "ttft_ms": 80.0, "sim_tpot_ms": 10.0, "tpot_ms": 9.5}]
    s = error_stats(rows)
    assert (s["ttft_measured_over_sim_p90"], s["tpot_measured_over_sim_p90"]) == (1.1, 1.05)
    assert (s["ttft_measured_over_sim_median"], s["tpot_measured_over_sim_median"]) == (0.95, 1.0)
    assert s["both_within_p90_share"] == 1.0
    # ten runs, TTFT ratios 0.5 .. 1.4 and TPOT 1.0: p90 = the 9th, 1.3; run 10 (1.4) lies beyond: 0.9 within
    ten = [{"ttft_ape": 1.0, "tpot_ape": 1.0, "sim_ttft_ms": 100.0, "ttft_ms": 50.0 + 10 * k, "sim_tpot_ms": 10.0,
            "tpot_ms": 10.0} for k in range(10)]
    s = error_stats(ten)
    assert (s["ttft_measured_over_sim_p90"], s["both_within_p90_share"]) == (1.3, 0.9)
    # a stored factor is rounded up: 1.1927 is stored as 1.2 (rounded to nearest it would be 1.19 and cover less)
    assert (_ceil2(1.1927), _ceil2(1.19), _ceil2(1.0), _ceil2(2.675)) == (1.2, 1.19, 1.0, 2.68)


@pytest.mark.parametrize("value, says", [
    ("bogus", "'bogus' is not one of none, median, p90, or a mapping {ttft: M, tpot: M}"),
    (0.3, "0.3 is not one of none, median, p90"),
    (None, "None is not one of"),
    ({}, "an empty mapping"),
    ({"ttft": -1}, "ttft = -1: Input should be greater than or equal to 0"),
    ({"ttft": 11}, "ttft = 11: Input should be less than or equal to 10"),
    ({"ttft": float("nan")}, "ttft = nan: Input should be a finite number"),
    ({"ttfft": 0.3}, "unknown key 'ttfft' (ttft, tpot)"),
    ({"ttft_s": 0.3}, "unknown key 'ttft_s' (ttft, tpot)"),
])
def test_a_bad_error_margin_is_one_line_naming_its_key(value, says):
    with pytest.raises(ConfigError) as e:
        parse_plan(_raw(value))
    assert e.value.key == "goodput.error_margin" and says in str(e.value)
    assert "literal" not in str(e.value) and "MarginSpec" not in str(e.value)


def test_pipeline_parallel_pools_have_no_band():
    # no validation run used pipeline parallelism (validate.read_measured skips them): a PP pool is unvalidated,
    # so p90 excludes its config while the same config without PP is judged at its band
    raw = _raw("p90")
    raw["search"] = {"devices": ["h100-sxm"], "pool": {"engine": "vllm-v1"}, "colocated": {"replicas": [1], "pp": [1, 2]}}
    plan = parse_plan(raw)
    assert [c.name for c in plan.configs] == ["colo-h100-sxm-tp1x1"]
    (ex,) = plan.excluded
    assert ex["config"] == "colo-h100-sxm-tp1pp2x1" and "unvalidated: pipeline parallel" in ex["reason"]


def test_winner_yaml_keeps_the_plan_slo_and_says_the_goodput_was_found_at_tightened_bounds():
    from pdsim.plan import winner_scenario
    plan = parse_plan(_raw({"ttft": 1.0}))
    (cfg,) = plan.configs
    row = {"config": cfg.name, "topology": cfg.topology, "gpus": 1, "usd_per_hour": 1.0, "goodput": 2.0,
           "judged_ttft_s": 0.25, "judged_tpot_s": 0.5, "error_margin": cfg.margin}
    sc = winner_scenario(plan, {"winner": cfg.name, "rows": [row]})
    assert (sc["slo"]["ttft_s"], sc["slo"]["tpot_s"]) == (0.5, 0.5)
    assert "goodput 2 req/s at the bounds goodput.error_margin tightened (TTFT <= 0.25 s, TPOT <= 0.5 s; the SLO " \
           "below is the plan's own)" in sc["description"]
    sc = winner_scenario(plan, {"winner": cfg.name, "rows": [{**row, "error_margin": None}]})
    assert "tightened" not in sc["description"]


def test_a_profile_file_named_like_a_preset_does_not_borrow_its_band():
    from pdsim.validate import error_band
    assert isinstance(error_band("vllm-v1", "h100-sxm"), dict)
    assert error_band("vllm-v1", "my/h100-sxm.yaml").startswith("unvalidated: the profile my/h100-sxm.yaml")
    assert isinstance(error_band("trtllm", "calibration/profiles/h100_sxm-trtllm-aic.yaml"), dict)   # imported: its own


def test_estimate_states_the_band_of_its_engine_and_gpu(capsys):
    from pdsim.__main__ import main
    from pdsim.validate import ERROR_TABLE, band_text
    band = json.loads(ERROR_TABLE.read_text())["bands"]["trtllm|h100-sxm"]
    assert main(["estimate", "--model", "llama-3.1-8b", "--device", "h100-sxm", "--engine", "trtllm",
                 "--prefill", "1000", "--json"]) == 0
    got = json.loads(capsys.readouterr().out)["expected_error"]
    assert got["ttft_measured_over_sim_p90"] == band["ttft_measured_over_sim_p90"] and got["rows"] == band["rows"]
    assert main(["estimate", "--model", "llama-3.1-8b", "--device", "h100-sxm", "--engine", "trtllm",
                 "--prefill", "1000"]) == 0
    assert f"expected error of serving runs on trtllm / h100-sxm: {band_text(got)}" in capsys.readouterr().out
    assert main(["estimate", "--model", "llama-3.1-8b", "--device", "h100-sxm", "--pp", "2", "--prefill", "1000"]) == 0
    assert "no engine preset / h100-sxm: unvalidated: pipeline parallel" in capsys.readouterr().out
