"""A goodput search started from a guess (``Search.guess``) and the family rule that supplies it
(``plan._family``, ``plan._guide``), worked by hand.

The guided search probes the guess, then steps away from it in the direction its verdict points, by
f = 1 / (1 - 0.999 tol) first and then f^2, f^4 ... from the last probe, until a verdict flips; then
it bisects as an unguided search does.  Whatever the guess, the search ends on the same rule (a pass at
lo and a fail at hi, hi - lo <= tol x hi), so its goodput is within the tolerance of the unguided one's
whenever the attainment falls with the rate: the property test at the end checks that on thresholds and
guesses drawn at random.
"""
from __future__ import annotations

import math

from hypothesis import example, given, settings
from hypothesis import strategies as st

from conftest import ScriptedExecutor, drive_search
from pdsim.plan import Config, Search, _family, _guide, parse_plan, run_plan

TOL = 0.05
F = 1.0 / (1.0 - 0.999 * TOL)        # 1.052576...


def _cfg(bound, topology=None, name="c"):
    return Config(name, topology or {}, 1, 1.0, bound_rate=bound)


def _drive(s: Search, passes) -> list[float]:
    return drive_search(s, passes)


def _approx(xs, want):
    return len(xs) == len(want) and all(math.isclose(a, b, rel_tol=1e-12) for a, b in zip(xs, want))


def test_a_good_guess_closes_the_bracket_in_two_probes():
    # target mode: 10 req/s passed; guess 40, the config passes up to 41: 40 passes, 40 f = 42.10 fails, and
    # [40, 42.10] is 2.10 wide <= 5% of 42.10 (2.105): done at 40 after two simulations (unguided: 20, 40, 80,
    # 60, 50, 45, 42.5, 41.25 - eight)
    s = Search(_cfg(100.0), TOL, guess=40.0)
    s.update(10.0, {"pass_att": 1.0}, 0.9)
    assert _approx(_drive(s, lambda r: r <= 41), [40.0, 40.0 * F])
    assert s.goodput == 40.0 and s.done and s.hi - s.lo <= TOL * s.hi
    u = Search(_cfg(100.0), TOL)
    u.update(10.0, {"pass_att": 1.0}, 0.9)
    assert _drive(u, lambda r: r <= 41) == [20.0, 40.0, 80.0, 60.0, 50.0, 45.0, 42.5, 41.25]
    # the guess fails, the config passes up to 39: 40 F, 40 / f = 38.00 P: [38.00, 40] is 2.00 <= 2.0: done
    s = Search(_cfg(100.0), TOL, guess=40.0)
    s.update(10.0, {"pass_att": 1.0}, 0.9)
    assert _approx(_drive(s, lambda r: r <= 39), [40.0, 40.0 / F]) and s.goodput == 40.0 / F


def test_a_poor_guess_steps_out_doubling_the_exponent_then_bisects():
    # guess 40, the config passes up to 50: 40 P, 40 f = 42.103 P, 42.103 f^2 = 46.647 P, 46.647 f^4 = 57.258 F:
    # the verdict flipped; the bracket [46.647, 57.258] is f^4 wide: halved geometrically, 46.647 f^2 = 51.681 F,
    # then 46.647 f = 49.099 P: [49.099, 51.681] is f wide, within 5%: done at 49.099 (six simulations)
    s = Search(_cfg(100.0), TOL, guess=40.0)
    s.update(10.0, {"pass_att": 1.0}, 0.9)
    seen = _drive(s, lambda r: r <= 50)
    assert _approx(seen, [40.0, 40.0 * F, 40.0 * F ** 3, 40.0 * F ** 7, 40.0 * F ** 5, 40.0 * F ** 4])
    assert [round(x, 3) for x in seen] == [40.0, 42.103, 46.647, 57.258, 51.681, 49.099]
    assert _approx([s.goodput, s.hi], [40.0 * F ** 4, 40.0 * F ** 5]) and s.hi - s.lo <= TOL * s.hi
    # down: guess 40, passes up to 30: 40 F, 38.002 F, 38.002 / f^2 = 34.300 F, 34.300 / f^4 = 27.944 P; halving
    # [27.944, 34.300]: 30.959 F, 29.413 P: [29.413, 30.959] within 5%: done at 29.413
    s = Search(_cfg(100.0), TOL, guess=40.0)
    s.update(10.0, {"pass_att": 1.0}, 0.9)
    seen = _drive(s, lambda r: r <= 30)
    assert [round(x, 3) for x in seen] == [40.0, 38.002, 34.3, 27.944, 30.959, 29.413]
    assert s.lo <= 30 < s.hi and s.hi - s.lo <= TOL * s.hi


def test_a_guess_outside_the_bracket_or_above_the_bound():
    # a guess at or below what passed says nothing: the unguided doubling from the target (20, ...)
    s = Search(_cfg(100.0), TOL, guess=10.0)
    s.update(10.0, {"pass_att": 1.0}, 0.9)
    assert s.next_rate() == 20.0 and s.guess is None
    # above the bound: probed at the bound (45); passing everywhere, the walk's next step is capped at the bound
    # again, so it hands over, and the unguided rule stops there: "reaches the analytic bound"
    s = Search(_cfg(45.0), TOL, guess=60.0)
    s.update(10.0, {"pass_att": 1.0}, 0.9)
    assert _drive(s, lambda r: True) == [45.0]
    assert s.note == "reaches the analytic bound" and s.goodput == 45.0
    # the walk up reaches the bound: 40 P, 42.10 P, min(46.64, 45) = 45 P: done at the bound after three
    s = Search(_cfg(45.0), TOL, guess=40.0)
    s.update(10.0, {"pass_att": 1.0}, 0.9)
    assert _approx(_drive(s, lambda r: True), [40.0, 40.0 * F, 45.0]) and s.goodput == 45.0
    # goodput mode (nothing passed yet), failing everywhere: the walk down ends at a thousandth of the highest
    # rate tried, then the unguided rule (divide by 4 from the lowest, stop below 1e-3 x the highest) ends it
    s = Search(_cfg(100.0), TOL, guess=40.0)
    seen = _drive(s, lambda r: False)
    assert seen[0] == 40.0 and min(seen) >= 40.0 * 1e-3 and s.note == "misses the SLO even at a trickle"
    assert all(b < a for a, b in zip(seen, seen[1:]))      # always down


@settings(max_examples=300, deadline=None)
@given(threshold=st.floats(0.5, 500.0), guess=st.floats(0.01, 2000.0), bound=st.floats(1.0, 1000.0),
       tol=st.sampled_from([0.02, 0.05, 0.1, 0.25]), target=st.sampled_from([None, 0.25, 1.0]))
@example(threshold=41.0, guess=40.0, bound=100.0, tol=0.05, target=10.0)
@example(threshold=50.0, guess=40.0, bound=45.0, tol=0.05, target=None)
@example(threshold=0.6, guess=1500.0, bound=1000.0, tol=0.02, target=None)
def test_guided_and_unguided_searches_end_on_the_same_rule(threshold, guess, bound, tol, target):
    """The config passes at rates <= threshold.  Both searches end with a pass at lo and a fail at hi (or at
    the bound, or at a trickle), the bracket within the tolerance, the threshold inside it: so their goodputs
    are within the tolerance of each other."""
    if target is not None and target > threshold:
        return                                   # run_plan searches only configs that passed at the target
    ends = []
    for g in (None, guess):
        s = Search(_cfg(bound), tol, guess=g)
        if target is not None:
            s.update(target, {"pass_att": 1.0}, 0.9)
        _drive(s, lambda r: r <= threshold)
        assert s.done
        if s.note == "reaches the analytic bound":
            assert s.lo <= min(threshold, bound) and s.lo >= bound / (1 + tol) - 1e-9
        elif s.note == "misses the SLO even at a trickle":      # every rate tried failed, the lowest a thousandth
            assert s.lo == 0 and threshold < min(s.points) < 4e-3 * max(s.points)    # of the highest, or near
            ends.append(None)
            continue
        else:
            assert s.lo <= threshold < s.hi and s.hi - s.lo <= tol * s.hi * (1 + 1e-12), (g, s.lo, s.hi)
            assert all(s.verdicts[r] == (r <= threshold) for r in s.points)
        ends.append(s.lo)
    if bound > threshold * (1 + tol) and None not in ends:
        assert abs(ends[0] - ends[1]) <= tol * max(ends) * (1 + 1e-12) + 1e-12


def test_families_by_replicas_and_by_prefill_decode_ratio():
    colo = {"kind": "colocated", "device": "h100-sxm", "tp": 1}
    a1, a2, a8 = ({**colo, "replicas": n} for n in (1, 2, 8))
    other = {**colo, "tp": 2, "replicas": 2}
    assert _family(_cfg(1, a2))[0] == _family(_cfg(1, a8))[0] == _family(_cfg(1, a1))[0]
    assert [_family(_cfg(1, t))[1] for t in (a1, a2, a8)] == [1, 2, 8]
    assert _family(_cfg(1, other))[0] != _family(_cfg(1, a2))[0]

    def pd(p, d):
        return {"kind": "disaggregated", "prefill": {"device": "h100-sxm", "instances": p},
                "decode": {"device": "h100-sxm", "instances": d}, "kv_link": {"preset": "infiniband"}}
    # 1P1D, 2P2D: one family (sizes 1, 2); 2P1D another (ratio 2:1); 4P2D with 2P1D (size 2)
    f = {k: _family(_cfg(1, pd(*k))) for k in ((1, 1), (2, 2), (2, 1), (4, 2), (3, 2))}
    assert f[(1, 1)][0] == f[(2, 2)][0] != f[(2, 1)][0] == f[(4, 2)][0] != f[(3, 2)][0]
    assert [f[k][1] for k in ((1, 1), (2, 2), (2, 1), (4, 2), (3, 2))] == [1, 2, 1, 2, 1]
    assert _family(_cfg(1, {"kind": "other"})) is None


def test_guide_holds_a_family_until_its_smallest_is_done_then_scales_its_goodput():
    colo = {"kind": "colocated", "device": "h100-sxm", "tp": 1}
    mk = {n: Search(_cfg(100.0 * n, {**colo, "replicas": n}, f"x{n}"), TOL) for n in (2, 3, 8)}
    lone = Search(_cfg(50.0, {**colo, "tp": 4, "replicas": 1}, "lone"), TOL)
    searches = {s.cfg.name: s for s in (*mk.values(), lone)}
    assert _guide(searches) == 0
    assert [s.waiting for s in searches.values()] == [False, True, True, False]
    # the reference ends at [30, 31]: its goodput is taken as the middle sqrt(30 x 31) = 30.496, x 3/2 and x 8/2
    mk[2].lo, mk[2].hi, mk[2].done = 30.0, 31.0, True
    assert _guide(searches) == 2
    assert [round(mk[n].guess, 3) for n in (3, 8)] == [45.744, 121.984] and not mk[3].waiting and not mk[8].waiting
    assert _guide(searches) == 0                 # given once
    # a dominated reference (its lo is whatever it had passed) gives no guess; the others search unguided
    mk = {n: Search(_cfg(100.0 * n, {**colo, "replicas": n}, f"x{n}"), TOL) for n in (2, 3)}
    searches = {s.cfg.name: s for s in mk.values()}
    _guide(searches)
    mk[2].lo, mk[2].done, mk[2].note = 20.0, True, "dominated: ..."
    assert _guide(searches) == 0 and mk[3].guess is None and not mk[3].waiting


SEARCH = {"devices": [{"name": "h100-sxm", "price_per_hour_usd": 1.0}], "colocated": {"replicas": [1]},
          "pool": {"max_running": 1, "kv_blocks": 1000, "cost_model": {"kind": "constant", "step_s": 0.1}}}


def _plan(configs, **goodput):
    raw = {"name": "hand", "model": "llama-3.1-8b", "seed": 7,
           "workload": {"arrival": "poisson", "num_requests": 100, "prompt_tokens": 8, "output_tokens": 1},
           "slo": {"ttft_s": 0.5, "tpot_s": 0.05, "attainment_target": 0.9},
           "search": SEARCH, "objective": "goodput_per_usd",
           "goodput": {"min_duration_s": 0, "seeds": 1, "tolerance": 0.25, "confirm_top": 0, **goodput}}
    plan = parse_plan(raw)
    plan.configs = [Config(name, topo, gpus, float(gpus), bound) for name, topo, gpus, bound in configs]
    return plan


def _res(ok: bool, n: int) -> dict:
    """An evaluate() result: every request met both bounds, or none did."""
    k = n if ok else 0
    return {"n": n, "ok": k, "ttft_ok": k, "tpot_ok": n, "finished": n, "early": None, "settled": n, "total": n,
            "ci": None, "ttft_p": 0.1 if ok else 9.0, "tpot_p": 0.01, "slo_met": ok}


def test_run_plan_holds_the_larger_replicas_and_starts_them_from_the_scaled_goodput():
    # goodput mode, tolerance 25%, one seed.  R1 (1 replica, bound 100) passes up to 30 req/s: 50 F, 12.5 P,
    # bisect: 31.25 F, 21.875 P, 26.5625 P; [26.5625, 31.25] is 4.69 <= 7.81: done (5 rounds).  R4 (4 replicas,
    # bound 400) passes up to 125 (a little better than 4 x 30: pooling): held for rounds 1-5, then in round 6
    # (the round R1 finishes in) starts from 4 x sqrt(26.5625 x 31.25) = 115.244: P, then 115.244 f (f = 1 /
    # (1 - 0.24975) = 1.3329) = 153.608 F: [115.244, 153.608] is within 25%: done (2 simulations; unguided: 200 F,
    # 50 P, 125 P, 162.5 F, and [125, 162.5] is 37.5 <= 40.6: 4).  Unguided, R4 ends at 125, guided at 115.244: both within
    # 25% of the threshold.
    topo = {"kind": "colocated", "device": "h100-sxm", "tp": 1}
    configs = [("R1", {**topo, "replicas": 1}, 1, 100.0), ("R4", {**topo, "replicas": 4}, 4, 400.0)]
    limit = {"R1": 30.0, "R4": 125.0}
    ex = ScriptedExecutor(lambda name, rate, seed, n: _res(rate <= limit[name], n))
    res = run_plan(_plan(configs), ex)
    rows = {r["config"]: r for r in res["rows"]}
    asked = [(c, round(r, 4)) for c, r, *_ in ex.calls]
    assert asked == [("R1", 50.0), ("R1", 12.5), ("R1", 31.25), ("R1", 21.875), ("R1", 26.5625),
                     ("R4", 115.2443), ("R4", 153.6079)]
    assert rows["R1"]["goodput"] == 26.5625 and round(rows["R4"]["goodput"], 4) == 115.2443
    assert res["skipped"]["guided_by_sibling"] == 1
    ex = ScriptedExecutor(lambda name, rate, seed, n: _res(rate <= limit[name], n))
    res = run_plan(_plan(configs, scale_guess=False), ex)
    assert [round(r, 4) for c, r, *_ in ex.calls if c == "R4"] == [200.0, 50.0, 125.0, 162.5]
    assert {r["config"]: r["goodput"] for r in res["rows"]}["R4"] == 125.0
    assert res["skipped"]["guided_by_sibling"] == 0


class _Workers(ScriptedExecutor):
    """The scripted executor with ``jobs`` workers, as LocalExecutor says it has."""

    def __init__(self, answer, jobs):
        super().__init__(answer)
        self.jobs, self.batches = jobs, []

    def map(self, fn, tasks, on_done=None):
        self.batches.append([t["scenario"]["workload"]["num_requests"] for t in tasks])
        return super().map(fn, tasks, on_done)


def test_long_runs_ahead_on_idle_workers_change_nothing_but_when_they_run():
    # target mode, 10 req/s, one long run at a time (confirm_top 1, 2x: 200 requests).  A ($1/h) and B ($2/h)
    # pass at the target; A fails its long run, B passes.  One worker: A's long run, then (A demoted) B's, in
    # two batches.  Two workers: A's long run leaves one idle, so B's runs beside it, in the same batch, and
    # is used when A fails; the table is the same.  D ($4/h) also passes at the target: once A fails, B's long
    # run is known, nothing is sent, and D's must not go "ahead" alone (it would run for nothing, and the plan
    # would wait for it).
    configs = [("A", {"kind": "colocated", "device": "a"}, 1, 40.0), ("B", {"kind": "colocated", "device": "b"}, 2, 40.0),
               ("C", {"kind": "colocated", "device": "c"}, 3, 40.0), ("D", {"kind": "colocated", "device": "d"}, 4, 40.0)]

    def answer(name, rate, seed, n):
        if n == 200:
            return _res(name != "A", n)
        return _res(name != "C" and rate <= 10, n)

    tables = []
    for jobs in (1, 2):
        ex = _Workers(answer, jobs)
        plan = _plan(configs, confirm_top=1, confirm_factor=2)
        plan.spec.target.rate, plan.spec.objective = 10.0, "cheapest"
        res = run_plan(plan, ex)
        longs = [(c, n) for c, r, s, n, e in ex.calls if n == 200]
        assert longs == [("A", 200), ("B", 200)]
        long_batches = [b for b in ex.batches if 200 in b]
        assert long_batches == ([[200], [200]] if jobs == 1 else [[200, 200]])
        tables.append(([(r["config"], r["status"], r["long_run_attainment"]) for r in res["rows"]], res["winner"]))
        assert (res["skipped"]["long_runs_ahead"], res["skipped"]["long_runs_ahead_used"]) == \
            ((0, 0) if jobs == 1 else (1, 1))
    assert tables[0] == tables[1]
    assert tables[0][1] == "B" and tables[0][0][:3] == [("B", "ok", 1.0), ("D", "ok", None), ("A", "fails long run", 0.0)]


def test_a_reference_stopped_at_max_rounds_lets_its_family_search_unguided():
    # max_rounds 2, goodput mode, tolerance 25%.  R1 (bound 100) fails everywhere: 50 F, 12.5 F, and its two
    # probes are spent before it is done ("search stopped at max_rounds").  R2 was held for it; once R1 can
    # probe no more, R2 is let go without a guess (R1 found no goodput) and searches as an unguided config:
    # 100 F, 25 P in its own two probes - not left unprobed with the goodput it never measured
    topo = {"kind": "colocated", "device": "h100-sxm", "tp": 1}
    configs = [("R1", {**topo, "replicas": 1}, 1, 100.0), ("R2", {**topo, "replicas": 2}, 2, 200.0)]
    ex = ScriptedExecutor(lambda name, rate, seed, n: _res(name == "R2" and rate <= 30, n))
    res = run_plan(_plan(configs, max_rounds=2), ex)
    assert [(c, r) for c, r, *_ in ex.calls] == [("R1", 50.0), ("R1", 12.5), ("R2", 100.0), ("R2", 25.0)]
    rows = {r["config"]: r for r in res["rows"]}
    assert rows["R2"]["goodput"] == 25.0 and rows["R2"]["note"].endswith("search stopped at max_rounds")
    assert rows["R1"]["status"] == "misses SLO at every rate" and res["skipped"]["guided_by_sibling"] == 0


def test_a_search_whose_last_allowed_probe_closes_its_bracket_is_done_not_stopped():
    # max_rounds 5, one config (bound 100) passing up to 30, tolerance 25%: 50 F, 12.5 P, 31.25 F, 21.875 P,
    # 26.5625 P - the fifth probe closes [26.5625, 31.25] (4.69 <= 7.81).  The search is done, with no "stopped
    # at max_rounds" note (its next rate, asked once more after the last probe, says so), as before searches
    # counted their own probes
    topo = {"kind": "colocated", "device": "h100-sxm", "tp": 1}
    ex = ScriptedExecutor(lambda name, rate, seed, n: _res(rate <= 30, n))
    res = run_plan(_plan([("R1", {**topo, "replicas": 1}, 1, 100.0)], max_rounds=5), ex)
    row = res["rows"][0]
    assert len(ex.calls) == 5 and row["goodput"] == 26.5625 and row["status"] == "ok" and row["note"] == ""
    # a family reference that closes on its last allowed probe still gives its family a guess: R2 starts at
    # 2 x sqrt(26.5625 x 31.25) = 57.62 (P: R2 passes up to 60), then x f (f = 1.3329) = 76.80 F: done
    ex = ScriptedExecutor(lambda name, rate, seed, n: _res(rate <= (30 if name == "R1" else 60), n))
    res = run_plan(_plan([("R1", {**topo, "replicas": 1}, 1, 100.0), ("R2", {**topo, "replicas": 2}, 2, 200.0)],
                         max_rounds=5), ex)
    assert [round(r, 2) for c, r, *_ in ex.calls if c == "R2"] == [57.62, 76.8]
    assert res["skipped"]["guided_by_sibling"] == 1


def test_a_guided_walk_that_would_leave_the_bracket_halves_it_and_never_outsteps_the_unguided():
    # target mode: 10 passed; guess 40, passes up to 11: 40 F, 40 / f = 38.00 F, 38.00 / f^2 = 34.30 F,
    # 34.30 / f^4 = 27.94 F, 27.94 / f^8 = 18.55 F; the next, 18.55 / f^16 = 8.17, would cross the pass at 10:
    # the walk stops and halves [10, 18.55] geometrically: 13.62 F, 11.67 F, 10.80 P; [10.80, 11.67] is 0.87 >
    # 5% of 11.67: 11.23 F; [10.80, 11.23] is 0.43 <= 0.56: done at 10.80
    s = Search(_cfg(100.0), TOL, guess=40.0)
    s.update(10.0, {"pass_att": 1.0}, 0.9)
    seen = _drive(s, lambda r: r <= 11)
    assert [round(x, 2) for x in seen] == [40.0, 38.0, 34.3, 27.94, 18.55, 13.62, 11.67, 10.8, 11.23]
    assert s.lo <= 11 < s.hi and s.hi - s.lo <= TOL * s.hi
    # a step is never wider than the unguided doubling: no bound, passing everywhere, tolerance 25%: f = 1.333,
    # then f^2 = 1.78, then f^4 = 3.16 -> capped at 2, so 1, 1.333, 2.370, 4.740, 9.481 ...
    s = Search(_cfg(math.inf), 0.25, guess=1.0)
    for _ in range(5):
        r = s.next_rate()
        s.update(r, {"pass_att": 1.0}, 0.9)
    w = s._walk
    assert [round(b / a, 3) for a, b in zip(w, w[1:])] == [1.333, 1.777, 2.0, 2.0]
    # tolerance 1%: the first step is GUESS_STEP (5%), not 1%: guess 20 passing up to 22: 20 P, 21 P, 21 x
    # 1.05^2 = 23.15 F, then halving [21, 23.15] geometrically down to 1%: 22.05 F, 21.52 P, 21.78 P, 21.92 P:
    # [21.92, 22.05] is within 1%: seven probes (unguided from half the bound: 50, 12.5, 31.25 ... ten)
    s = Search(_cfg(100.0), 0.01, guess=20.0)
    seen = _drive(s, lambda r: r <= 22)
    assert [round(x, 2) for x in seen] == [20.0, 21.0, 23.15, 22.05, 21.52, 21.78, 21.92]
    assert len(_drive(Search(_cfg(100.0), 0.01), lambda r: r <= 22)) == 10
    assert s.lo <= 22 < s.hi and s.hi - s.lo <= 0.01 * s.hi
