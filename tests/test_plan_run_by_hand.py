"""`pdsim.plan.run_plan` worked by hand: which configs are pruned, which are judged at the target,
the rounds of the goodput searches and their dominance rule, the notes, the log lines and the
result dict (tests/MUTANTS.md, branch mutplan6).

No simulation runs here: an executor answers each task from a table written in the test (the
attainment a run "measured"), and the configs are written by hand (name, GPUs, $/h, analytic bound),
so every rate the searches try, every status and every count below is worked out in the comments
from the rules in pdsim/plan.py's docstrings (Search: start at half the bound, double while it
passes, divide by 4 while it fails, then bisect until the bracket is within the tolerance of its
failing end; dominance: a config whose bound is below a rate that a config using no more of the
objective's resource already passed is not searched further).
"""
from __future__ import annotations

import math
from types import SimpleNamespace

import pytest

from conftest import ScriptedExecutor

import pdsim.plan as plan_mod
from pdsim.plan import Config, parse_plan, run_plan

SEARCH = {"devices": [{"name": "h100-sxm", "price_per_hour_usd": 1.0}], "colocated": {"replicas": [1]},
          "pool": {"max_running": 1, "kv_blocks": 1000, "cost_model": {"kind": "constant", "step_s": 0.1}}}


@pytest.fixture(autouse=True)
def _no_own_executor(monkeypatch):
    """run_plan given an executor must not make its own (a LocalExecutor would simulate for real)."""
    def refuse(*a, **k):
        raise AssertionError("run_plan made its own executor though it was given one")
    monkeypatch.setattr(plan_mod, "LocalExecutor", refuse)


def _plan(configs, target=None, slo=None, objective=None, **goodput) -> "plan_mod.Plan":
    """A plan of 100-request search windows (seed 7, SLO 0.5 s / 0.05 s at 90%) whose configs are
    replaced by hand-written ones: (name, kind, gpus, $/h, bound, infeasible).  One seed, tolerance 25%,
    no long runs unless asked."""
    raw = {"name": "hand", "model": "llama-3.1-8b", "seed": 7,
           "workload": {"arrival": "poisson", "num_requests": 100, "prompt_tokens": 8, "output_tokens": 1},
           "slo": {"ttft_s": 0.5, "tpot_s": 0.05, "attainment_target": 0.9, **(slo or {})},
           "search": SEARCH,
           "goodput": {"min_duration_s": 0, "seeds": 1, "tolerance": 0.25, "confirm_top": 0, **goodput}}
    if target is not None:
        raw["target"] = {"rate": target}
    if objective is not None:
        raw["objective"] = objective
    plan = parse_plan(raw)
    plan.configs = [Config(name, {"kind": kind, "hand": name}, gpus, usd, bound, infeasible,
                           expected_error={"hand": name})
                    for name, kind, gpus, usd, bound, infeasible in configs]
    return plan


def _res(ok, n=100, early=None, settled=None, met=None, ttft_p=0.1):
    """An evaluate() result: ``ok`` of ``n`` requests met both bounds (the TTFT misses are the misses);
    ``slo_met`` the run's own verdict (by default ok / n >= 0.9)."""
    return {"n": n, "ok": ok, "ttft_ok": ok, "tpot_ok": n, "finished": n, "early": early,
            "settled": n if settled is None else settled, "total": n, "ci": None,
            "ttft_p": ttft_p, "tpot_p": 0.01, "slo_met": ok / n >= 0.9 if met is None else met}


class _Script(ScriptedExecutor):
    """conftest's executor answering from ``answer(config, rate, requests)`` (the seed is not asked)."""

    def __init__(self, answer, clock=None):
        super().__init__(lambda name, rate, seed, n: answer(name, rate, n), clock)


# target 20 req/s.  I: infeasible (and its bound 10 is below the target too: infeasible is said first);
# L: bound 17.5 < 20, pruned; M: bound exactly 20, so it is run at the target (pruned only *below*), and
# misses there (50 of 100 within the TTFT bound); W: bound 40, passes at 20.
TARGET_CONFIGS = [("I", "colocated", 1, 1.0, 10.0, "TTFT: a lone prefill exceeds 0.5 s for 100%"),
                  ("L", "colocated", 1, 1.5, 17.5, ""),
                  ("M", "disaggregated", 2, 2.0, 20.0, ""),
                  ("W", "colocated", 4, 4.0, 40.0, "")]


def _target_answer(name, rate, n):
    if n == 200:                                   # W's long run (2x the 100-request window): 190 of 200
        return _res(190, n=200)
    if name == "W" and rate <= 33:                 # W passes up to 33 req/s
        return _res(95)
    return _res(50, early="fail", settled=60)      # a miss stops early, 60 of its 100 requests settled


def _target_run(progress=False, clock=None):
    plan = _plan(TARGET_CONFIGS, target=20, confirm_top=1, confirm_factor=2)
    ex = _Script(_target_answer, clock)
    return plan, ex, run_plan(plan, ex, progress=progress)


def test_target_mode_prunes_judges_at_the_target_then_searches_up_from_it(capsys):
    plan, ex, res = _target_run()
    # M and W at 20 (seed 7, early stop "both": worst_seed with early_stop); W's search starts from the target
    # it passed (lo 20, no failure): doubling gives min(40, bound 40) = 40 > 20 x 1.25: run 40, fails (hi 40);
    # bisect: 40 - 20 = 20 > 0.25 x 40 = 10: run 30, passes; [30, 40]: 10 <= 10: done, goodput 30.  Then the
    # best (W, the only one that meets) runs long at the target 20: 2x = 200 requests, seed 7 + 1000, to the end
    assert ex.calls == [("M", 20, 7, 100, "both"), ("W", 20, 7, 100, "both"), ("W", 40, 7, 100, "both"),
                        ("W", 30, 7, 100, "both"), ("W", 20, 1007, 200, None)]
    assert ex.maps == 4 and ex.closed == 0          # the caller's executor is the caller's to close
    assert capsys.readouterr().err == ""             # progress is off by default
    # cheapest: W meets; the rest by attainment at the target (M 0.5; I and L none: 0), ties by goodput
    # (I 0.0, L none: both 0), then by name
    w, m, i, lo = res["rows"]
    assert [r["config"] for r in res["rows"]] == ["W", "M", "I", "L"] and res["winner"] == "W"
    assert [r["rank"] for r in res["rows"]] == [1, 2, 3, 4]
    assert {k: w[k] for k in ("config", "kind", "gpus", "usd_per_hour", "bound_rate", "status", "goodput",
                              "bracket", "note", "topology", "expected_error", "meets")} == {
        "config": "W", "kind": "colocated", "gpus": 4, "usd_per_hour": 4.0, "bound_rate": 40.0, "status": "ok",
        "goodput": 30.0, "bracket": [30.0, 40.0], "note": "", "topology": {"kind": "colocated", "hand": "W"},
        "expected_error": {"hand": "W"}, "meets": True}
    # W's points: the target 20 (95%), 30 (95%), 40 (50%, stopped early); its margin 30 / 20; at the target
    # 95%; its long run 190 / 200
    assert list(w["points"]) == ["20", "30", "40"]
    assert w["points"]["40"] == {"attainment": 0.5, "worst_seed_attainment": 0.5, "ttft_p": 0.1, "tpot_p": 0.01,
                                 "early_stop": "fail"}
    assert w["points"]["20"]["attainment"] == w["points"]["30"]["attainment"] == 0.95
    assert (w["margin"], w["attainment_at_target"], w["long_run_attainment"]) == (1.5, 0.95, 0.95)
    # M: judged at the target only; 50 of 100 within 0.5 s (p90 0.1 s), every TPOT within its bound
    assert {k: m[k] for k in ("config", "kind", "gpus", "usd_per_hour", "bound_rate", "status", "goodput",
                              "bracket", "note", "topology", "expected_error", "attainment_at_target")} == {
        "config": "M", "kind": "disaggregated", "gpus": 2, "usd_per_hour": 2.0, "bound_rate": 20.0,
        "status": "misses SLO at target", "goodput": None, "bracket": None,
        "note": "TTFT: 50% within 0.5 s (p90 0.1 s)", "topology": {"kind": "disaggregated", "hand": "M"},
        "expected_error": {"hand": "M"}, "attainment_at_target": 0.5}
    assert m["points"] == {"20": {"attainment": 0.5, "worst_seed_attainment": 0.5, "ttft_p": 0.1, "tpot_p": 0.01,
                                  "early_stop": "fail"}}
    assert {k: i[k] for k in ("config", "status", "goodput", "bracket", "note", "points", "bound_rate",
                              "usd_per_hour", "gpus")} == {
        "config": "I", "status": "infeasible", "goodput": 0.0, "bracket": None,
        "note": "TTFT: a lone prefill exceeds 0.5 s for 100%", "points": {}, "bound_rate": 10.0,
        "usd_per_hour": 1.0, "gpus": 1}
    assert {k: lo[k] for k in ("config", "status", "goodput", "bracket", "note", "points", "bound_rate")} == {
        "config": "L", "status": "below target (bound)", "goodput": None, "bracket": None,
        "note": "analytic bound 17.5 req/s < target 20", "points": {}, "bound_rate": 17.5}
    assert not (m["meets"] or i["meets"] or lo["meets"])
    # 5 simulations: 4 of 100 requests and 1 of 200; the two misses (M@20, W@40) stopped with 40 unsettled each
    assert (res["simulations"], res["cached"]) == (5, 0)
    # not simulated: I infeasible, L below the target by its bound (counted apart)
    assert res["skipped"] == {"infeasible": 1, "pruned_by_bound": 1, "dominated": 0, "guided_by_sibling": 0,
                              "long_runs_ahead": 0, "long_runs_ahead_used": 0,
                              "worst_seed": 0, "early_stop_pass": 0,
                              "early_stop_fail": 2, "cached": 0, "requests_not_simulated": 80,
                              "requests_total": 600}


def test_progress_lines_and_eta_by_hand_on_a_fake_clock(monkeypatch, capsys):
    # the plan of the test above with progress on and a clock that starts at 1000 s and moves 10 s per
    # simulation (the executor moves it), so the elapsed times are exact:
    # - before anything runs (0 s): 2 configs at the target, 4 - 2 = 2 pruned;
    # - round 1 after the two target runs (20 s): W's search, 1 open; no ETA in the first round;
    # - round 2 (30 s): W's bracket [20, 40] needs ceil(log2(20 / (0.25 x 40))) + 1 = 2 more rounds, and the
    #   one finished round took 30 - 20 = 10 s (the target runs before it not counted), so the ETA is 2 x 10 s;
    # - the long runs (40 s): W at 2x the 100-request window = 200 requests
    clock = [1000.0]
    monkeypatch.setattr(plan_mod, "time", SimpleNamespace(perf_counter=lambda: clock[0]))
    plan, ex, res = _target_run(progress=True, clock=clock)
    assert capsys.readouterr().err.splitlines() == [
        "pdsim plan: 2 configs at the target rate 20 req/s (1 infeasible, 1 below it by the analytic bound) "
        "[0 simulated, 0 cached, 0 s]",
        "pdsim plan: round 1: 1 configs x up to 1 seeds; 1 searches open [2 simulated, 0 cached, 20 s]",
        "pdsim plan: round 2: 1 configs x up to 1 seeds; 1 searches open, ETA ~20 s [3 simulated, 0 cached, 30 s]",
        "pdsim plan: long runs: W (2x the search window, [200] requests, fresh seeds) [4 simulated, 0 cached, 40 s]"]
    assert res["wall_s"] == 50.0 and res["winner"] == "W"      # 5 simulations x 10 s on the fake clock


def test_a_config_passes_at_the_target_by_its_rule(capsys):
    # pooled seeds in attainment mode: no per-seed verdict, the pooled attainment is compared with the target
    # and an attainment exactly at it passes: P 90 / 100 = 0.9 passes, Q 89 / 100 misses.  P's bound is the
    # target: doubling gives min(40, 20) = 20 <= 20 x 1.25, so its search is done without another run
    configs = [("P", "colocated", 1, 1.0, 20.0, ""), ("Q", "colocated", 1, 2.0, 20.0, "")]
    ex = _Script(lambda name, rate, n: _res(90 if name == "P" else 89))
    res = run_plan(_plan(configs, target=20, aggregate="pooled"), ex)
    assert ex.calls == [("P", 20, 7, 100, None), ("Q", 20, 7, 100, None)]   # pooled: no early stop
    p, q = res["rows"]
    assert (p["config"], p["status"], p["goodput"], p["bracket"], p["note"]) == (
        "P", "ok", 20.0, [20.0, None], "reaches the analytic bound")
    assert (q["config"], q["status"], q["note"]) == ("Q", "misses SLO at target", "TTFT: 89% within 0.5 s (p90 0.1 s)")
    # percentile mode: each seed's own verdict (slo_met) decides, not the attainment: P with only 80% within
    # both bounds passes (its percentiles hold), Q with 95% misses (a percentile does not)
    ex = _Script(lambda name, rate, n: _res(80, met=True) if name == "P" else _res(95, met=False))
    res = run_plan(_plan(configs, target=20, slo={"mode": "percentile"}), ex)
    p, q = res["rows"]
    assert (p["config"], p["status"], p["goodput"], p["meets"]) == ("P", "ok", 20.0, True)
    assert (q["config"], q["status"], q["meets"]) == ("Q", "misses SLO at target", False)
    assert len(ex.calls) == 2 and capsys.readouterr().err == ""


# goodput per $/h, tolerance 25%, every config passes every rate it is tried at.  The dict order (the
# plan's config order) is B, G, A, T, E; dominance looks at the searches by ($/h, name): A, E, T, B, G.
DOMINANCE = [("B", "colocated", 1, 2.0, 8.0, ""),      # $2 but 1 GPU (the rule reads $/h here, not GPUs)
             ("G", "colocated", 3, 3.0, 3.9, ""),
             ("A", "colocated", 1, 1.0, 16.0, ""),
             ("T", "colocated", 1, 1.0, 6.0, ""),
             ("E", "colocated", 1, 1.0, 8.0, "")]


def test_dominance_by_dollars_per_hour_round_by_round():
    ex = _Script(lambda name, rate, n: _res(95))
    res = run_plan(_plan(DOMINANCE), ex)
    # round 1 (nothing passed yet, nothing dominated): half of each bound, in dict order: B 4, G 1.95, A 8,
    # T 3, E 4; all pass.
    # round 2, dominance in ($/h, name) order:
    # - A (bound 16): the other $1 configs passed only 3 and 4: not dominated;
    # - E (bound 8): A passed 8 with the same $1/h: 8 < 8 fails, and "<=" counts only for a strictly cheaper
    #   config: not dominated;
    # - T (bound 6 < A's 8 at the same $/h): dominated by A;
    # - B ($2, bound 8 <= A's 8 with A strictly cheaper): dominated by A;
    # - G ($3, bound 3.9): B (first in dict order) passed 4 > 3.9 with $2, but B is dominated itself and
    #   only undominated configs dominate; A (8) is next: dominated by A.
    # A and E double: min(16, 16) = 16 > 8 x 1.25, min(8, 8) = 8 > 4 x 1.25: both pass.
    # round 3: A and E passed their bounds: complete, not dominated (skipped by the rule); doubling gives
    # their bounds again, within 25% of what passed: both done at the bound, no third round runs.
    assert [(c, r) for c, r, _, _, _ in ex.calls] == [("B", 4.0), ("G", 1.95), ("A", 8.0), ("T", 3.0), ("E", 4.0),
                                                      ("A", 16.0), ("E", 8.0)]
    rows = {r["config"]: r for r in res["rows"]}
    assert {n: (r["status"], r["goodput"], r["bracket"]) for n, r in rows.items()} == {
        "A": ("ok", 16.0, [16.0, None]), "E": ("ok", 8.0, [8.0, None]),
        "T": ("dominated (not fully searched)", 3.0, [3.0, None]),
        "B": ("dominated (not fully searched)", 4.0, [4.0, None]),
        "G": ("dominated (not fully searched)", 1.95, [1.95, None])}
    assert rows["A"]["note"] == rows["E"]["note"] == "reaches the analytic bound"
    assert rows["T"]["note"] == "dominated: bound 6 <= 8 req/s passed by A with no more $/h"
    assert rows["B"]["note"] == "dominated: bound 8 <= 8 req/s passed by A with no more $/h"
    assert rows["G"]["note"] == "dominated: bound 3.9 <= 8 req/s passed by A with no more $/h"
    # a dominated config passed every rate it was tried at: it meets, ranked by goodput per $/h:
    # A 16, E 8, T 3, B 2, G 0.65
    assert [r["config"] for r in res["rows"]] == ["A", "E", "T", "B", "G"] and all(r["meets"] for r in res["rows"])
    assert res["skipped"]["dominated"] == 3 and res["skipped"]["pruned_by_bound"] == 0
    assert res["simulations"] == 7 and res["skipped"]["requests_total"] == 700


def test_dominance_by_gpus_for_goodput_per_gpu():
    # goodput per GPU: the resource is GPUs.  P (1 GPU, $5/h, bound 2) and Q (2 GPUs, $1/h, bound 0.8).
    # Round 1: P 1, Q 0.4, both pass.  Round 2: Q's bound 0.8 < 1 passed by P with fewer GPUs: dominated
    # (by $/h it would not be: P costs more).  A rate of 1 req/s passed is enough to dominate (any rate > 0).
    # P doubles to min(2, 2) = 2 > 1.25: passes; then done at its bound.
    configs = [("P", "colocated", 1, 5.0, 2.0, ""), ("Q", "colocated", 2, 1.0, 0.8, "")]
    ex = _Script(lambda name, rate, n: _res(95))
    res = run_plan(_plan(configs, objective="goodput_per_gpu"), ex)
    assert [(c, r) for c, r, _, _, _ in ex.calls] == [("P", 1.0), ("Q", 0.4), ("P", 2.0)]
    p, q = res["rows"]                              # per GPU: P 2 / 1 = 2, Q 0.4 / 2 = 0.2
    assert (p["config"], p["status"], p["goodput"], p["note"]) == ("P", "ok", 2.0, "reaches the analytic bound")
    assert (q["config"], q["status"], q["goodput"], q["note"]) == (
        "Q", "dominated (not fully searched)", 0.4, "dominated: bound 0.8 <= 1 req/s passed by P with no more GPUs")
    assert res["skipped"]["dominated"] == 1


def test_misses_at_every_rate_and_searches_stopped_at_max_rounds():
    # goodput per $/h, max_rounds 3.  N (bound 8) fails everywhere: 4, then down by 4: 1, 0.25; it passes
    # nothing, so it "misses SLO at every rate" with the note of its lowest rate, 0.25 (70% there, 40% at the
    # others), and was still open at round 3.  R (bound 100) passes up to 30: 50 F, 12.5 P, then bisects
    # [12.5, 50]: 31.25 F; stopped at round 3 with goodput 12.5.  S (bound 10) passes: 5, 10, then done at
    # its bound (its note kept, no "stopped").
    configs = [("N", "colocated", 1, 1.0, 8.0, ""), ("R", "colocated", 2, 2.0, 100.0, ""),
               ("S", "colocated", 3, 3.0, 10.0, "")]

    def answer(name, rate, n):
        if name == "N":
            return _res(70 if rate == 0.25 else 40)
        return _res(95) if name == "S" or rate <= 30 else _res(50)
    ex = _Script(answer)
    res = run_plan(_plan(configs, max_rounds=3), ex)
    assert [(c, r) for c, r, _, _, _ in ex.calls] == [("N", 4.0), ("R", 50.0), ("S", 5.0), ("N", 1.0), ("R", 12.5),
                                                      ("S", 10.0), ("N", 0.25), ("R", 31.25)]
    rows = {r["config"]: r for r in res["rows"]}
    assert (rows["N"]["status"], rows["N"]["goodput"], rows["N"]["bracket"], rows["N"]["note"]) == (
        "misses SLO at every rate", 0.0, [0.0, 0.25],
        "at 0.25 req/s: TTFT: 70% within 0.5 s (p90 0.1 s); search stopped at max_rounds")
    assert list(rows["N"]["points"]) == ["0.25", "1", "4"]
    assert (rows["R"]["status"], rows["R"]["goodput"], rows["R"]["bracket"], rows["R"]["note"]) == (
        "ok", 12.5, [12.5, 31.25], "search stopped at max_rounds")
    assert (rows["S"]["status"], rows["S"]["goodput"], rows["S"]["bracket"], rows["S"]["note"]) == (
        "ok", 10.0, [10.0, None], "reaches the analytic bound")
    # per $/h: R 12.5 / 2 = 6.25, S 10 / 3 = 3.33; N meets nothing
    assert [r["config"] for r in res["rows"]] == ["R", "S", "N"] and res["winner"] == "R"
    assert res["simulations"] == 8 and res["skipped"]["dominated"] == 0


def test_own_executor_is_closed_and_a_second_plan_reads_the_cache(tmp_path, monkeypatch, capsys):
    # one config C (bound 20) that passes everything: 10, 20, done at its bound; then a long run at its
    # goodput 20 (2x: 200 requests).  Without an executor, run_plan makes its own (LocalExecutor, replaced
    # here by the script) and closes it at the end.
    configs = [("C", "colocated", 1, 1.0, 20.0, "")]
    own = _Script(lambda name, rate, n: _res(95 * n // 100, n=n))
    monkeypatch.setattr(plan_mod, "LocalExecutor", lambda: own)
    res = run_plan(_plan(configs, confirm_top=1, confirm_factor=2), cache_dir=tmp_path / "cache")
    assert [(c, r, n) for c, r, _, n, _ in own.calls] == [("C", 10.0, 100), ("C", 20.0, 100), ("C", 20.0, 200)]
    assert own.closed == 1 and (res["simulations"], res["cached"], res["winner"]) == (3, 0, "C")
    # the same plan again with the caller's executor: all three answers come from the cache, nothing is
    # simulated, and the caller's executor is not closed
    mine = _Script(lambda name, rate, n: pytest.fail("a cached task was simulated"))
    res = run_plan(_plan(configs, confirm_top=1, confirm_factor=2), mine, cache_dir=tmp_path / "cache")
    assert mine.calls == [] and mine.closed == 0 and own.closed == 1
    assert (res["simulations"], res["cached"], res["skipped"]["cached"]) == (0, 3, 3)
    assert (res["skipped"]["requests_total"], res["skipped"]["requests_not_simulated"]) == (0, 0)
    assert res["rows"][0]["goodput"] == 20.0 and res["rows"][0]["long_run_attainment"] == 0.95
    assert capsys.readouterr().err == ""


def test_a_search_complete_at_its_bound_is_passed_over_and_a_later_one_dominated():
    # goodput per $/h; X ($0.5, bound 2), A ($1, bound 16), C ($3, bound 12, passes up to 9).  The executor has
    # no close(): run_plan needs only map() of the executor it is given.
    # round 1: X 1, A 8, C 6, all pass.  Round 2: C's bound 12 is above A's 8 and X's 1: nobody dominated;
    # X 2 and A 16 pass (their bounds), C 12 fails (bracket [6, 12]).
    # round 3, in ($/h, name) order: X has passed its bound (complete: passed over, and the rule goes on to the
    # next), A too, then C: 12 < 16 passed by A at $1: dominated, with its bracket [6, 12] as it stands.
    # X and A are done at their bounds: no round 3 runs.
    configs = [("X", "colocated", 1, 0.5, 2.0, ""), ("A", "colocated", 1, 1.0, 16.0, ""),
               ("C", "colocated", 3, 3.0, 12.0, "")]
    script = _Script(lambda name, rate, n: _res(95) if name != "C" or rate <= 9 else _res(50))
    res = run_plan(_plan(configs), SimpleNamespace(map=script.map))
    assert [(c, r) for c, r, _, _, _ in script.calls] == [("X", 1.0), ("A", 8.0), ("C", 6.0), ("X", 2.0), ("A", 16.0),
                                                          ("C", 12.0)]
    rows = {r["config"]: r for r in res["rows"]}
    assert {n: (r["status"], r["goodput"], r["bracket"], r["note"]) for n, r in rows.items()} == {
        "X": ("ok", 2.0, [2.0, None], "reaches the analytic bound"),
        "A": ("ok", 16.0, [16.0, None], "reaches the analytic bound"),
        "C": ("dominated (not fully searched)", 6.0, [6.0, 12.0],
              "dominated: bound 12 <= 16 req/s passed by A with no more $/h")}
    # per $/h: A 16, X 2 / 0.5 = 4, C 6 / 3 = 2
    assert [r["config"] for r in res["rows"]] == ["A", "X", "C"] and res["skipped"]["dominated"] == 1


def test_percentile_mode_notes_name_the_percentile_that_fails():
    """In percentile mode a miss is a percentile above its bound, and the note says which one and by how much
    (it used to compare the shares within each bound with attainment_target, which this mode does not use:
    "attainment 95% < 90% (TTFT and TPOT each pass)").  TTFT bound 0.5 s at p90, TPOT 0.05 s."""
    configs = [("P", "colocated", 1, 1.0, 20.0, ""), ("Q", "colocated", 1, 2.0, 20.0, ""),
               ("R", "colocated", 1, 3.0, 20.0, "")]
    answers = {"P": _res(95, met=False, ttft_p=0.7),                         # 95% within both, but p90 0.7 s
               "Q": _res(100, met=False, ttft_p=math.inf),                   # p90 on a request never served
               "R": dict(_res(100, met=False), tpot_p=0.06)}                 # the TPOT percentile fails
    ex = _Script(lambda name, rate, n: answers[name])
    res = run_plan(_plan(configs, target=20, slo={"mode": "percentile"}), ex)
    notes = {r["config"]: (r["status"], r["note"]) for r in res["rows"]}
    assert notes == {"P": ("misses SLO at target", "TTFT p90 0.7 s > 0.5 s"),
                     "Q": ("misses SLO at target", "TTFT p90 inf (requests never served) > 0.5 s"),
                     "R": ("misses SLO at target", "TPOT p90 0.06 s > 0.05 s")}


def test_a_percentile_mode_long_run_describes_a_failing_seed_and_the_worst_percentiles():
    """Two long-run seeds of W (target 20 req/s, 200 requests each): seed 1007 has the lower attainment (85%)
    but passes its percentiles (p90 0.4 s); seed 1008 has 99% within both and fails (p90 0.6 s).  The long
    run fails on seed 1008, and its note gives that seed's attainment and the worst p90 over the seeds,
    0.6 s; the search run (100 requests) passes."""
    configs = [("W", "colocated", 4, 4.0, 40.0, "")]
    long = {1007: _res(170, n=200, met=True, ttft_p=0.4), 1008: _res(198, n=200, met=False, ttft_p=0.6)}

    class _Seeds(_Script):
        def map(self, fn, tasks, on_done=None):
            out = []
            for t in tasks:
                sc = t["scenario"]
                n = sc["workload"]["num_requests"]
                self.calls.append((sc["seed"], n))
                out.append(long[sc["seed"]] if n == 200 else _res(100, met=True))
                if on_done:
                    on_done()
            return out
    ex = _Seeds(None)
    res = run_plan(_plan(configs, target=20, slo={"mode": "percentile"}, confirm_top=1, confirm_factor=2,
                         confirm_seeds=2), ex)
    (w,) = res["rows"]
    assert sorted(c for c in ex.calls if c[1] == 200) == [(1007, 200), (1008, 200)]
    assert w["status"] == "fails long run"
    assert w["note"] == "long run at 20 req/s: attainment 99.0% < target; TTFT p90 0.6 s > 0.5 s"
