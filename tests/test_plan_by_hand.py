"""The plan's judging rules worked by hand: how many passes a target needs, the batch-means interval,
when a run's verdict is certain (early stop), and the goodput search's sequence of rates.

These are the pieces a capacity verdict rests on (pdsim/plan.py); each expected value below is
computed in the comments from the definitions, not by running the code under test another way.
"""
from __future__ import annotations

import math
from types import SimpleNamespace

import numpy as np
import pytest
import simpy

from conftest import ScriptedExecutor, drive_search

from pdsim.plan import Config, Search, _JudgeSink, _passes_needed, _seed_passes, batch_means_ci
from pdsim.workload import FINISHED, REJECTED


@pytest.mark.parametrize("n, target, want", [
    (10, 0.9, 9),       # 9 / 10 = 0.9 >= 0.9
    (7, 0.9, 7),        # 6 / 7 = 0.857 < 0.9: all 7
    (100, 0.95, 95),
    (10, 0.7, 7),
    (100, 0.07, 7),     # 0.07 * 100 is 7.000000000000001 in floats: ceil says 8, but 7 / 100 >= 0.07 holds
    (3, 1.0, 3),
    (5, 0.0, 0),
    (1, 0.5, 1),
    # the float just above 1/3: 3 x t rounds to exactly 1.0, so the ceiling guess is 1, but 1 / 3 (0.333...33 in
    # floats) < t: one pass is not enough, the guess must move up to 2 (2 / 3 >= t)
    (3, math.nextafter(1 / 3, 1), 2),
])
def test_passes_needed_is_the_least_count_meeting_the_target(n, target, want):
    if n == 3 and want == 2:
        assert 3 * target == 1.0 and 1 / 3 < target      # the two float facts the case rests on
    assert _passes_needed(n, target) == want
    assert want / n >= target and (want == 0 or (want - 1) / n < target)


def test_batch_means_interval_by_hand():
    # 40 judged requests, 20 batches of 2: the first 10 batches all pass (mean 1), the last 10 pass half
    # (mean 0.5).  Mean 0.75; the batch means deviate by +-0.25: sample variance 20 x 0.0625 / 19;
    # half-width t(0.975, 19) = 2.093 x sqrt(1.25 / 19) / sqrt(20) = 0.12004...
    ok = np.array([1, 1] * 10 + [1, 0] * 10, float)
    lo, hi = batch_means_ci(ok)
    half = 2.093 * math.sqrt(1.25 / 19) / math.sqrt(20)
    assert (lo, hi) == pytest.approx((0.75 - half, 0.75 + half), rel=1e-12)
    assert round(half, 5) == 0.12004
    # fewer than 2 requests per batch: no interval; a run that always passes: [1, 1] (clipped, no spread)
    assert batch_means_ci(np.ones(39)) is None
    assert batch_means_ci(np.ones(40)) == (1.0, 1.0)
    # 41 requests: batches of 2 over the first 40; the mean still over all 41 (one extra miss: 30 / 41)
    lo, hi = batch_means_ci(np.append(ok, 0.0))
    assert (lo + hi) / 2 == pytest.approx(30 / 41, rel=1e-12)


def _req(i, ttft, tpot, out=11, status=FINISHED, arrival=0.0):
    # first token at arrival + ttft, then out - 1 more tokens at tpot each
    return SimpleNamespace(id=i, status=status, arrival_s=arrival, first_token_s=arrival + ttft, output_tokens=out,
                           finish_s=arrival + ttft + (out - 1) * tpot, decode_first_s=float("nan"))


def _sink(expected=10, first=0, target=0.8, early="both", rtt=0.0):
    slo = SimpleNamespace(ttft_s=0.5, tpot_s=0.05, attainment_target=target)
    client = SimpleNamespace(ttft_at="first_decode_token", network_rtt_s=rtt)
    return _JudgeSink(simpy.Environment(), expected, first, slo, early, False, client)


def test_judge_fails_a_run_at_the_first_miss_the_target_cannot_absorb():
    # 10 judged, target 0.8: 8 must pass, so the 3rd miss decides "fail" whatever the other 7 do
    s = _sink()
    assert s.need == 8
    for i, (ttft, tpot) in enumerate([(0.6, 0.01), (0.1, 0.06), (0.1, 0.01)]):
        s.finished(_req(i, ttft, tpot))
    assert (s.ok, s.miss, s.ttft_miss, s.tpot_miss, s.decided) == (1, 2, 1, 1, None)
    s.finished(_req(3, 0.7, 0.07))          # misses both bounds: one request, one miss
    assert (s.miss, s.ttft_miss, s.tpot_miss, s.decided) == (3, 2, 2, "fail") and s.all_done.triggered


def test_judge_passes_a_run_once_enough_requests_met_both_bounds():
    # the bounds are inclusive: TTFT exactly 0.5 s and TPOT exactly 0.05 s meet them (values exact in binary
    # after the arithmetic: 0.5 and 0.5 + 10 x 0.05 = 1.0, TPOT (1.0 - 0.5) / 10 = 0.05)
    s = _sink()
    for i in range(7):
        s.finished(_req(i, 0.5, 0.05))
    assert (s.ok, s.decided) == (7, None)
    s.finished(_req(7, 0.1, 0.01))
    assert (s.ok, s.decided) == (8, "pass")
    # early "fail" only: 8 passes decide nothing, the run goes on
    s = _sink(early="fail")
    for i in range(8):
        s.finished(_req(i, 0.1, 0.01))
    assert s.decided is None and not s.all_done.triggered


def test_judge_without_early_stopping_counts_but_never_decides():
    # early None (long runs, percentile mode): 3 misses of 10 at target 0.8 (need 8) already make the run a
    # fail, but the run must go on to its end: no verdict, all_done only once all 10 requests settled
    s = _sink(early=None)
    for i in range(3):
        s.finished(_req(i, 0.9, 0.01))
    assert (s.miss, s.decided) == (3, None) and not s.all_done.triggered
    for i in range(3, 10):
        s.finished(_req(i, 0.1, 0.01))
    assert (s.ok, s.miss, s.decided) == (7, 3, None) and s.all_done.triggered


def test_judge_takes_the_clients_first_token_behind_a_pd_proxy():
    # a PD request: prefill's token at 0.3 s, the decode instance's first at 0.6 s, 11 tokens done at 0.7 s
    # (TPOT from the prefill token: 0.4 / 10 = 0.04 s; from the decode token: 0.1 / 9 = 0.011 s)
    req = _req(0, 0.3, 0.04)
    req.decode_first_s = 0.6
    slo = SimpleNamespace(ttft_s=0.5, tpot_s=0.05, attainment_target=0.8)
    # ttft_at prefill_end: the client's first token is the prefill's: TTFT 0.3 s, TPOT 0.04 s: a pass
    s = _JudgeSink(simpy.Environment(), 10, 0, slo, "both", True,
                   SimpleNamespace(ttft_at="prefill_end", network_rtt_s=0.0))
    s.finished(req)
    assert (s.ok, s.miss, s.ttft_miss, s.tpot_miss) == (1, 0, 0, 0)
    # first_decode_token (the default): TTFT 0.6 s > 0.5 s misses, TPOT over the 10 decode tokens 0.011 s passes
    s = _JudgeSink(simpy.Environment(), 10, 0, slo, "both", True,
                   SimpleNamespace(ttft_at="first_decode_token", network_rtt_s=0.0))
    s.finished(req)
    assert (s.ok, s.miss, s.ttft_miss, s.tpot_miss) == (0, 1, 1, 0)


def test_judge_leaves_out_the_warm_up_and_counts_a_rejection_as_a_miss():
    # 10 requests, the first 4 warm-up: 6 judged, target 0.8 -> 5 needed; misses allowed 1
    s = _sink(expected=10, first=4)
    assert (s.judged, s.need) == (6, 5)
    for i in range(4):
        s.finished(_req(i, 9.0, 9.0))          # warm-up: terrible, not counted
    assert (s.ok, s.miss) == (0, 0)
    s.rejected(SimpleNamespace(id=4, status="unfinished", reject_reason="", finish_s=float("nan"), arrival_s=0.0,
                               first_token_s=float("nan"), output_tokens=3, decode_first_s=float("nan")), "kv")
    assert (s.miss, s.decided) == (1, None)
    s.finished(_req(5, 0.1, 0.01, status=REJECTED))
    assert (s.miss, s.decided) == (2, "fail")


def test_judge_adds_the_network_rtt_and_a_one_token_reply_has_no_tpot():
    # TTFT 0.45 s + RTT 0.1 s = 0.55 s > 0.5 s: a miss; one output token: TPOT not judged (no gap)
    s = _sink(rtt=0.1)
    s.finished(_req(0, 0.45, 1.0))
    s.finished(_req(1, 0.30, 9.0, out=1))
    assert (s.ttft_miss, s.tpot_miss, s.ok) == (1, 1, 1)


def test_seed_verdict_takes_the_run_rule_else_the_attainment():
    assert _seed_passes({"slo_met": False, "ok": 99, "n": 100}, 0.9) is False
    assert _seed_passes({"slo_met": None, "ok": 90, "n": 100}, 0.9) is True
    assert _seed_passes({"ok": 89, "n": 100}, 0.9) is False


def _cfg(bound):
    return Config("c", {}, 1, 1.0, bound_rate=bound)


def _drive(s: Search, passes) -> list[float]:
    """The rates the search asks for until it is done (at most 30: a search that never ends fails here)."""
    return drive_search(s, passes, limit=30)


def test_goodput_search_sequence_by_hand():
    # bound 10 req/s, tolerance 5%; the config passes up to 8.2 req/s.  Rates: half the bound 5 (pass),
    # double to the bound 10 (fail), then bisect: 7.5 (pass), 8.75 (fail), 8.125 (pass), 8.4375 (fail);
    # the bracket [8.125, 8.4375] is 0.3125 wide <= 5% of 8.4375: done, goodput 8.125
    s = Search(_cfg(10.0), 0.05)
    seen = _drive(s, lambda r: r <= 8.2)
    assert seen == [5.0, 10.0, 7.5, 8.75, 8.125, 8.4375]
    assert (s.lo, s.hi, s.goodput, s.done) == (8.125, 8.4375, 8.125, True)
    # the tolerance is relative to the failing end: at 50%, [5, 10] is already narrow enough (5 <= 0.5 x 10)
    s = Search(_cfg(10.0), 0.5)
    assert _drive(s, lambda r: r <= 6) == [5.0, 10.0] and s.goodput == 5.0


def test_goodput_search_stops_at_the_bound_and_at_a_trickle():
    s = Search(_cfg(10.0), 0.05)        # passes everywhere: 5, then the bound 10; doubling again stays at 10
    for r in (5.0, 10.0):
        assert s.next_rate() == r
        s.update(r, {"pass_att": 1.0}, 0.9)
    assert s.next_rate() is None and s.note == "reaches the analytic bound" and s.goodput == 10.0
    s = Search(_cfg(math.inf), 0.05)    # no bound: start at 1 req/s; fails everywhere: divide by 4 each time
    seen = _drive(s, lambda r: False)
    # 1, 1/4, 1/16, 1/64, 1/256; the next, 1/1024, is below 1e-3 x the first rate tried (1): stop
    # (it compared with the lowest failure, which falls with it: the search ran on to max_rounds)
    assert seen == [1.0, 0.25, 0.0625, 0.015625, 0.00390625]
    assert s.note == "misses the SLO even at a trickle" and s.goodput == 0.0
    # a result that carries its own verdict ("passes") overrides the attainment
    s = Search(_cfg(10.0), 0.05)
    s.update(5.0, {"pass_att": 1.0, "passes": False}, 0.9)
    assert (s.lo, s.hi) == (0.0, 5.0)


# --- certain misses counted before the requests settle (_JudgeSink.sweep) ----------------------------------
NAN = float("nan")


def _open(i, arrival, first=NAN, out=11, decode_first=NAN, decode_instance=""):
    from pdsim.workload import UNFINISHED
    return SimpleNamespace(id=i, status=UNFINISHED, arrival_s=arrival, first_token_s=first, output_tokens=out,
                           finish_s=NAN, decode_first_s=decode_first, decode_instance=decode_instance)


def _swept(s, stream, every_s=0.25, topo=None):
    s.env.timeout(100.0)          # the simulation's own events (a step in flight): the run is alive
    s.env.process(s.sweep(topo, stream, every_s))
    s.env.run(until=s.all_done)
    return s


def test_sweep_stops_when_nothing_else_can_happen_so_a_deadlock_is_reported_not_judged():
    # nothing in the event queue but the sweep: nothing will ever settle these requests (a deadlock); the
    # sweep must not keep the run alive and call it an SLO fail (the run ends, check_conservation reports it)
    # (requests at 0, TTFT bound 0.5 s: at the look at 0.5 no deadline has passed yet; after it nothing is
    # scheduled any more, so the sweep ends there instead of counting 10 misses at 0.75)
    s = _sink(early="fail")
    s.env.timeout(0.3)            # the last event of a run that then deadlocks
    s.env.process(s.sweep(None, [_open(i, 0.0) for i in range(10)], 0.25))
    with pytest.raises(RuntimeError, match="No scheduled events left"):
        s.env.run(until=s.all_done)
    assert s.decided is None and s.env.now == 0.5 and s.miss == 0


def test_sweep_counts_a_ttft_miss_once_the_deadline_passes_without_a_first_token():
    # 10 judged, target 0.8: the 3rd miss fails the run.  Requests arrive every 0.125 s and none gets a first
    # token; TTFT bound 0.5 s (inclusive), a look every 0.25 s.  At 0.75 the deadlines of requests 0 and 1
    # have passed (0.75 - 0.125 = 0.625 > 0.5), not request 2's (0.75 - 0.25 = 0.5 meets the bound): 2 misses.
    # At 1.0 requests 2 and 3 (1.0 - 0.375 = 0.625) add two: 4 > 2, the run fails at 1.0, long before any of
    # them would have finished.
    s = _swept(_sink(early="fail"), [_open(i, 0.125 * i) for i in range(10)])
    assert s.env.now == 1.0 and s.decided == "fail" and s.all_done.triggered
    assert s.premissed == {0: "ttft", 1: "ttft", 2: "ttft", 3: "ttft"}
    assert (s.miss, s.ttft_miss, s.tpot_miss, s.swept, s.swept_misses) == (4, 4, 0, 4, 4)


def test_sweep_counts_a_late_first_token_and_leaves_settled_requests_to_the_judge():
    # request 0 got its first token late (TTFT 0.625 > 0.5): a certain miss once its deadline passed, though
    # still decoding; request 1 already finished (finished() judges it: the sweep skips it); request 2's
    # first token came exactly at its deadline (TTFT 0.5 meets the bound) and it decodes 10 more tokens at
    # most 0.05 s each: its TPOT deadline is 0.5 + 10 x 0.05 = 1.0, so at 0.75 it is no miss yet
    done = _open(1, 0.0, first=0.125)
    done.status = FINISHED
    stream = [_open(0, 0.0, first=0.625), done, _open(2, 0.0, first=0.5)]
    s = _sink(expected=3, target=1.0, early="fail")       # every miss fails: the first one ends the run
    _swept(s, stream)
    assert s.env.now == 0.75 and s.premissed == {0: "ttft"} and s.decoding == [(1.0, 2, 0.5, 11)]


def test_sweep_counts_a_tpot_miss_once_the_request_can_no_longer_meet_the_bound():
    # all 10 arrive at 0 and get their first token at 0.125 (in time); 22 more tokens each at most 0.05 s:
    # TPOT deadline 0.125 + 22 x 0.05 = 1.225.  Looks at 0.25 k: at 0.75 (TTFT deadlines passed) all enter the
    # TPOT heap; at 1.0 none is late; at 1.25 each has (1.25 - 0.125) / 22 = 0.0511 > 0.05: all 10 miss
    # (TPOT divides by the tokens after the first: over all 23 it would be 0.0489, no miss yet)
    s = _swept(_sink(early="fail"), [_open(i, 0.0, first=0.125, out=23) for i in range(10)])
    assert s.env.now == 1.25 and s.decided == "fail"
    assert s.premissed == {i: "tpot" for i in range(10)} and (s.miss, s.ttft_miss, s.tpot_miss) == (10, 0, 10)
    assert s.swept_misses == 10


def test_a_request_counted_early_is_not_counted_again_when_it_finishes():
    s = _sink(expected=10, early="fail")
    late = _open(0, 0.0)
    s.env.timeout(100.0)
    s.env.process(s.sweep(None, [late] + [_open(i, 10.0) for i in range(1, 10)], 0.25))
    s.env.run(until=0.8)                                   # at 0.75: request 0 has no first token: a miss
    assert s.premissed == {0: "ttft"} and (s.miss, s.ttft_miss) == (1, 1)
    late.status, late.first_token_s, late.finish_s = FINISHED, 0.9, 0.9 + 10 * 0.06    # TTFT and TPOT miss
    s.finished(late)
    assert (s.miss, s.ttft_miss, s.tpot_miss, s.premissed) == (1, 1, 1, {})
    # a request counted as a TTFT miss that then shows a TTFT within the bound would mean a wrong count
    s.premissed[1] = "ttft"
    with pytest.raises(AssertionError):
        s.finished(_req(1, 0.1, 0.01))
    # ... and so would a request counted as a TPOT miss that then meets both bounds
    s.premissed[2] = "tpot"
    with pytest.raises(AssertionError):
        s.finished(_req(2, 0.1, 0.01))


def test_sweep_adds_the_network_rtt_to_the_ttft_deadline():
    # RTT 0.1 s: a request that arrived at 0 with no first token misses 0.5 s once now + 0.1 > 0.5; at the look
    # at 0.25 (0.35) not yet, at 0.5 (0.6) all 10 do: 10 misses > the 2 allowed (target 0.8), the run fails at 0.5
    # (without the RTT it would fail only at 0.75)
    s = _swept(_sink(early="fail", rtt=0.1), [_open(i, 0.0) for i in range(10)])
    assert s.env.now == 0.5 and s.decided == "fail" and (s.miss, s.ttft_miss, s.swept_misses) == (10, 10, 10)


def test_sweep_syncs_the_decode_instance_before_reading_a_first_decode_token():
    # behind a PD proxy the client's first token is the decode instance's, which an open fast-path window
    # records only when synced: the sweep syncs that instance once before calling the request late
    synced = []

    class Inst:
        def __init__(self, r):
            self.r = r

        def sync(self):
            synced.append(1)
            self.r.decode_first_s = 0.375                 # its first decode step ended in the window

    r = _open(0, 0.0, first=0.25, decode_instance="decode-0")
    topo = SimpleNamespace(by_name={"decode-0": Inst(r)})
    slo = SimpleNamespace(ttft_s=0.5, tpot_s=0.05, attainment_target=1.0)
    client = SimpleNamespace(ttft_at="first_decode_token", network_rtt_s=0.0)
    s = _JudgeSink(simpy.Environment(), 1, 0, slo, "fail", True, client)
    s.env.timeout(100.0)
    s.env.process(s.sweep(topo, [r], 0.25))
    s.env.run(until=0.8)
    # TTFT 0.375 <= 0.5: no miss; it decodes 9 more tokens (10 streamed by the decode instance) until 0.825
    assert synced == [1] and s.miss == 0 and s.decoding == [(0.375 + 0.05 * 9, 0, 0.375, 10)]


def _one_colo_one_pd(kv_blocks: int, num_requests: int):
    """A plan of one colocated replica and a 1P1D pair (linear steps, TTFT <= 0.3 s, TPOT <= 20 ms): the parsed
    plan and a runner whose tasks evaluate() runs."""
    from pdsim.plan import LocalExecutor, _Runner, parse_plan
    from test_plan import LINEAR, small_plan
    raw = small_plan(search={"devices": [{"name": "h100-sxm", "price_per_hour_usd": 2.0}],
                             "colocated": {"replicas": [1]},
                             "disaggregated": {"prefill_instances": [1], "decode_instances": [1]},
                             "pool": {"kv_blocks": kv_blocks, "cost_model": LINEAR}},
                     slo={"ttft_s": 0.3, "tpot_s": 0.02, "attainment_target": 0.9},
                     workload={"arrival": "poisson", "num_requests": num_requests,
                               "prompt_tokens": {"dist": "uniform", "low": 50, "high": 600},
                               "output_tokens": {"dist": "uniform", "low": 2, "high": 60}})
    plan = parse_plan(raw)
    return plan, _Runner(plan, LocalExecutor(1), None, False)


def test_counting_certain_misses_early_gives_the_same_counts_as_the_whole_run(monkeypatch):
    # the sweep on, verdicts never taken (so the runs go to the end): every request the sweep counted as a
    # miss misses at the end (finished() asserts it), and the counts equal those of the run without it
    from pdsim import plan as P
    from pdsim.plan import evaluate
    sinks = []
    monkeypatch.setattr(P._JudgeSink, "_decide", lambda self: sinks.append(self) if self not in sinks else None)
    plan, runner = _one_colo_one_pd(kv_blocks=600, num_requests=150)
    early_counted = 0
    for cfg in plan.configs:
        for rate in (10.0, 40.0):
            full = evaluate(runner._task(cfg, rate, 0, early=None))
            sinks.clear()
            swept = evaluate(runner._task(cfg, rate, 0, early="fail"))
            s = sinks[-1]
            assert swept["early"] is None and swept["settled"] == swept["total"]
            n = full["n"]
            assert (n - s.miss, n - s.ttft_miss, n - s.tpot_miss) == (full["ok"], full["ttft_ok"], full["tpot_ok"])
            assert s.premissed == {}                         # each one settled later, as a miss
            early_counted += s.swept_misses
    assert early_counted > 0


def test_percentiles_of_a_run_stopped_at_a_fail_are_lower_bounds(monkeypatch):
    # the notes of a fail-stopped run give p90 >= X: X must not exceed the p90 the same requests (those that
    # had arrived when it stopped) show once the whole run is simulated, colocated and behind a PD proxy
    from pdsim import metrics
    from pdsim.plan import evaluate
    frames = []
    real = metrics.requests_frame
    monkeypatch.setattr(metrics, "requests_frame", lambda *a, **k: frames.append(real(*a, **k)) or frames[-1])
    plan, runner = _one_colo_one_pd(kv_blocks=300, num_requests=300)
    stopped = 0
    for cfg in plan.configs:
        for rate in (30.0, 60.0, 120.0):
            task = runner._task(cfg, rate, 0, early="fail")
            early = evaluate(task)
            if early["early"] != "fail":
                continue
            stopped += 1
            full = evaluate(runner._task(cfg, rate, 0, early=None))
            df = frames[-1]
            first = min(int(full["total"] * task.get("warmup_fraction", 0.0)), full["total"] - 1)
            seen = df[(df.request_id >= first) & (df.arrival_s <= early["stopped_s"])]
            slo = plan.spec.slo
            # the verdict's own percentile of those requests (nearest rank, never served = +inf)
            t_sample, p_sample = metrics.slo_samples(seen)
            want_ttft = metrics.nearest_rank(t_sample, slo.ttft_percentile)
            want_tpot = metrics.nearest_rank(p_sample, slo.tpot_percentile)
            assert early["ttft_p"] <= want_ttft + 1e-12, (cfg.name, rate, early["ttft_p"], want_ttft)
            assert early["tpot_p"] <= want_tpot + 1e-12, (cfg.name, rate, early["tpot_p"], want_tpot)
    assert stopped >= 2


# --- the search space, the paths, the runner and the long-run check (no simulation) ---------------------------
# Everything below runs without a simulation: the plan is parsed (pricing and bounds are cheap), and the
# executor is a script that answers each task with a result written in the test, so which tasks the
# runner sends, with which seeds, windows and early-stop rule, and what it makes of the answers, can be
# checked one by one against the rules of pdsim/plan.py's docstrings.
import json  # noqa: E402
from pathlib import Path  # noqa: E402

from pdsim.errors import ConfigError  # noqa: E402
from pdsim.plan import (CONFIRM_SEED_OFFSET, MAX_CONFIRM_STEPS, _absolute_paths, _confirm, _Runner,  # noqa: E402
                        evaluate, parse_plan, run_plan)

LINEAR = {"kind": "linear", "base_s": 0.01, "per_token_s": 1e-4, "per_kv_token_s": 1e-6}


def _raw(search=None, **over) -> dict:
    raw = {"name": "hand", "model": "llama-3.1-8b", "seed": 7,
           "workload": {"arrival": "poisson", "num_requests": 100, "prompt_tokens": 100, "output_tokens": 10},
           "slo": {"ttft_s": 0.5, "tpot_s": 0.05, "attainment_target": 0.9},
           "search": search or {"devices": [{"name": "h100-sxm", "price_per_hour_usd": 1.0}],
                                "colocated": {"replicas": [1, 2]}, "pool": {"kv_blocks": 2000, "cost_model": LINEAR}},
           "goodput": {"min_duration_s": 0}}
    raw.update(over)
    return raw


def test_enumerate_yields_the_product_less_the_budget_in_price_order():
    # 2 devices x (colocated: tp {1, 2} x replicas {1, 3} x chunk {off, 128} = 8; disaggregated: prefill
    # instances {1, 2} x links {nvlink, roce} = 4) = 24 configs.  GPUs: colocated tp x replicas (1, 3, 2, 6),
    # disaggregated instances + 1 (2, 3).  budget.max_gpus 4 drops the four 6-GPU ones; max $5/h then drops
    # the h100's ($2/GPU) 3-GPU ones ($6/h): 2 colocated + 2 disaggregated.  16 left, 8 excluded.
    search = {"devices": [{"name": "h100-sxm", "price_per_hour_usd": 2.0},
                          {"name": "a100-80gb-sxm", "price_per_hour_usd": 1.0}],
              "colocated": {"tp": [1, 2], "replicas": [1, 3], "chunked_prefill": [None, 128]},
              "disaggregated": {"prefill_instances": [1, 2], "kv_link": ["nvlink", "roce"]},
              "pool": {"kv_blocks": 2000, "cost_model": LINEAR}}
    plan = parse_plan(_raw(search, budget={"max_gpus": 4, "max_usd_per_hour": 5.0}))
    a, h = "a100-80gb-sxm", "h100-sxm"
    # sorted by ($/h, GPUs, name): $1 (a100 x1), $2 (h100 x1, then a100 2-GPU), $3 (a100 3-GPU), $4 (h100 2-GPU)
    assert [(c.name, c.gpus, c.usd_per_hour) for c in plan.configs] == [
        (f"colo-{a}-tp1x1", 1, 1.0), (f"colo-{a}-tp1x1-chunk128", 1, 1.0),
        (f"colo-{h}-tp1x1", 1, 2.0), (f"colo-{h}-tp1x1-chunk128", 1, 2.0),
        (f"colo-{a}-tp2x1", 2, 2.0), (f"colo-{a}-tp2x1-chunk128", 2, 2.0),
        (f"pd-{a}-1p1-1d1-nvlink", 2, 2.0), (f"pd-{a}-1p1-1d1-roce", 2, 2.0),
        (f"colo-{a}-tp1x3", 3, 3.0), (f"colo-{a}-tp1x3-chunk128", 3, 3.0),
        (f"pd-{a}-2p1-1d1-nvlink", 3, 3.0), (f"pd-{a}-2p1-1d1-roce", 3, 3.0),
        (f"colo-{h}-tp2x1", 2, 4.0), (f"colo-{h}-tp2x1-chunk128", 2, 4.0),
        (f"pd-{h}-1p1-1d1-nvlink", 2, 4.0), (f"pd-{h}-1p1-1d1-roce", 2, 4.0)]
    # excluded in enumeration order (h100 first; tp, replicas, chunk; then the disaggregated ones), GPUs
    # checked before dollars
    gpus6 = "6 GPUs > budget.max_gpus 4"
    usd6 = "$6.00/h > budget.max_usd_per_hour 5.0"
    assert plan.excluded == [
        {"config": f"colo-{h}-tp1x3", "reason": usd6}, {"config": f"colo-{h}-tp1x3-chunk128", "reason": usd6},
        {"config": f"colo-{h}-tp2x3", "reason": gpus6}, {"config": f"colo-{h}-tp2x3-chunk128", "reason": gpus6},
        {"config": f"pd-{h}-2p1-1d1-nvlink", "reason": usd6}, {"config": f"pd-{h}-2p1-1d1-roce", "reason": usd6},
        {"config": f"colo-{a}-tp2x3", "reason": gpus6}, {"config": f"colo-{a}-tp2x3-chunk128", "reason": gpus6}]
    # the topology entries: the plan's pool keys, the device and its price on every pool, the chunk budget
    # only where asked, the KV link as a preset
    cfg = {c.name: c for c in plan.configs}
    pool = {"kv_blocks": 2000, "cost_model": LINEAR}
    assert cfg[f"colo-{h}-tp1x1-chunk128"].topology == {
        "kind": "colocated", "replicas": 1, **pool, "device": h, "tp": 1, "price_per_gpu_hour_usd": 2.0,
        "chunked_prefill": {"token_budget": 128}}
    assert cfg[f"colo-{a}-tp1x3"].topology == {"kind": "colocated", "replicas": 3, **pool, "device": a, "tp": 1,
                                               "price_per_gpu_hour_usd": 1.0}
    assert cfg[f"pd-{a}-2p1-1d1-roce"].topology == {
        "kind": "disaggregated",
        "prefill": {**pool, "device": a, "tp": 1, "instances": 2, "price_per_gpu_hour_usd": 1.0},
        "decode": {**pool, "device": a, "tp": 1, "instances": 1, "price_per_gpu_hour_usd": 1.0},
        "kv_link": {"preset": "roce"}}
    # every config is priced and bounded: more replicas, more bound (the bound itself: test_semantics)
    assert cfg[f"colo-{a}-tp1x3"].bound_rate == pytest.approx(3 * cfg[f"colo-{a}-tp1x1"].bound_rate)
    assert all(c.infeasible == "" and 0 < c.bound_rate < math.inf for c in plan.configs)


def test_enumerate_names_pipelines_decode_devices_and_profiles(tmp_path):
    from pdsim.devices import DATA_DIR
    (tmp_path / "profiles").mkdir()
    (tmp_path / "profiles" / "gpu.yaml").write_text((DATA_DIR / "h100-sxm.yaml").read_text())
    search = {"devices": ["profiles/gpu.yaml"],
              "colocated": {"pp": [1, 2]},
              "disaggregated": {"prefill_pp": [2], "decode_pp": [1, 2],
                                "decode_devices": ["a100-80gb-sxm", "profiles/gpu.yaml"]},
              "pool": {"kv_blocks": 2000, "cost_model": LINEAR}}
    plan = parse_plan(_raw(search), str(tmp_path / "p.yaml"), tmp_path)
    cfg = {c.name: c for c in plan.configs}
    # a profile is named by its file's stem; pp 1 leaves no trace in names or pools; a decode device other
    # than the prefill one is named after the decode pool; no price given: no price key
    assert sorted(cfg) == ["colo-gpu-tp1pp2x1", "colo-gpu-tp1x1", "pd-gpu-1p1pp2-1d1-a100-80gb-sxm-infiniband",
                           "pd-gpu-1p1pp2-1d1-infiniband", "pd-gpu-1p1pp2-1d1pp2-a100-80gb-sxm-infiniband",
                           "pd-gpu-1p1pp2-1d1pp2-infiniband"]
    assert cfg["colo-gpu-tp1x1"].topology == {"kind": "colocated", "replicas": 1, "kv_blocks": 2000,
                                              "cost_model": LINEAR, "device": "profiles/gpu.yaml", "tp": 1}
    assert cfg["colo-gpu-tp1pp2x1"].topology["pp"] == 2 and cfg["colo-gpu-tp1pp2x1"].gpus == 2
    pd = cfg["pd-gpu-1p1pp2-1d1-a100-80gb-sxm-infiniband"].topology
    assert (pd["prefill"]["device"], pd["prefill"]["pp"], pd["decode"]["device"]) == ("profiles/gpu.yaml", 2,
                                                                                        "a100-80gb-sxm")
    assert "pp" not in pd["decode"] and pd["kv_link"] == {"preset": "infiniband"}
    assert cfg["pd-gpu-1p1pp2-1d1-infiniband"].topology["decode"]["device"] == "profiles/gpu.yaml"
    assert cfg["pd-gpu-1p1pp2-1d1-infiniband"].gpus == 3          # 2 prefill stages + 1 decode GPU
    deep = cfg["pd-gpu-1p1pp2-1d1pp2-a100-80gb-sxm-infiniband"]
    assert (deep.topology["decode"]["pp"], deep.topology["decode"]["device"], deep.gpus) == (2, "a100-80gb-sxm", 4)


def test_enumerate_excludes_what_cannot_run_and_says_why_nothing_fits():
    # tp 3 does not divide Llama-3.1-8B's 32 heads (the roofline cost shards them): that config cannot be
    # built (excluded with the builder's reason); tp 1 and 2 on either side of it are kept
    search = {"devices": ["h100-sxm"], "colocated": {"tp": [1, 3, 2]}, "pool": {"kv_blocks": 2000}}
    plan = parse_plan(_raw(search))
    assert [c.name for c in plan.configs] == ["colo-h100-sxm-tp1x1", "colo-h100-sxm-tp2x1"]
    assert plan.excluded == [{"config": "colo-h100-sxm-tp3x1", "reason": "topologies.colo-h100-sxm-tp3x1.tp = 3: "
                              "tensor parallelism must divide the 32 attention heads of llama-3.1-8b"}]
    # nothing fits: the error names one excluded config and its reason (the first reason in text order:
    # "2 GPUs ..." before "4 GPUs ...")
    search = {"devices": ["h100-sxm"], "colocated": {"tp": [2], "replicas": [2, 1]},
              "pool": {"kv_blocks": 2000, "cost_model": LINEAR}}
    with pytest.raises(ConfigError) as e:
        parse_plan(_raw(search, budget={"max_gpus": 1}), "p.yaml")
    assert str(e.value).startswith("p.yaml: budget: ")
    assert ("no configuration of the search space fits the budget and the model "
            "(e.g. colo-h100-sxm-tp2x1: 2 GPUs > budget.max_gpus 1)") in str(e.value)




def test_search_pool_keys_are_checked_against_every_config_with_the_plan_file_named():
    # search.pool goes into every pool: an unknown key fails the first config, so the whole plan, naming
    # the plan file; a key a colocated topology takes but a disaggregated pool does not (router) excludes
    # just the disaggregated configs, the reason naming the file too
    search = {"devices": ["h100-sxm"], "colocated": {"replicas": [1]}, "disaggregated": {"kv_link": ["nvlink"]},
              "pool": {"kv_blocks": 2000, "bogus": 1}}
    with pytest.raises(ConfigError) as e:
        parse_plan(_raw(search), "p.yaml")
    assert str(e.value).startswith("p.yaml: topologies.colo-h100-sxm-tp1x1.bogus: ")     # then why (wording)
    search["pool"] = {"kv_blocks": 2000, "router": "round_robin"}
    plan = parse_plan(_raw(search), "p.yaml")
    assert [c.name for c in plan.configs] == ["colo-h100-sxm-tp1x1"]
    (ex,) = plan.excluded
    assert ex["config"] == "pd-h100-sxm-1p1-1d1-nvlink"
    assert ex["reason"].startswith("p.yaml: topologies.pd-h100-sxm-1p1-1d1-nvlink.prefill.router: ")


@pytest.mark.parametrize("key", ["replicas", "tp", "pp", "instances", "device", "kind"])
def test_search_pool_cannot_set_what_the_search_space_sets(key):
    # search.pool {replicas: 4} went into every colocated topology after its own replicas: colo-...-x1 and
    # colo-...-x2 both ran 4 replicas; tp, pp, device and instances were silently overridden the other way
    search = {"devices": ["h100-sxm"], "colocated": {"replicas": [1, 2]},
              "pool": {"kv_blocks": 2000, "cost_model": LINEAR, key: 4}}
    with pytest.raises(ConfigError) as e:
        parse_plan(_raw(search), "p.yaml")
    assert str(e.value).startswith("p.yaml: search") and f"pool.{key}: set by the search space" in str(e.value)

def test_budget_limits_are_inclusive():
    # a config at exactly max_gpus or exactly max_usd_per_hour is within the budget
    search = {"devices": [{"name": "h100-sxm", "price_per_hour_usd": 2.0}], "colocated": {"tp": [1, 2, 4]},
              "pool": {"kv_blocks": 2000, "cost_model": LINEAR}}
    plan = parse_plan(_raw(search, budget={"max_gpus": 2}))
    assert [c.name for c in plan.configs] == ["colo-h100-sxm-tp1x1", "colo-h100-sxm-tp2x1"]
    assert plan.excluded == [{"config": "colo-h100-sxm-tp4x1", "reason": "4 GPUs > budget.max_gpus 2"}]
    plan = parse_plan(_raw(search, budget={"max_usd_per_hour": 4.0}))
    assert [c.name for c in plan.configs] == ["colo-h100-sxm-tp1x1", "colo-h100-sxm-tp2x1"]
    assert plan.excluded == [{"config": "colo-h100-sxm-tp4x1", "reason": "$8.00/h > budget.max_usd_per_hour 4.0"}]

def test_absolute_paths_rewrites_exactly_the_relative_file_paths(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    base = tmp_path.resolve() / "plans"
    w = {"trace": {"path": "traces/t.csv", "rate_scale": 2.0},
         "prompt_tokens": {"dist": "empirical", "path": "lens/p.csv"},
         "output_tokens": {"dist": "empirical", "path": "lens/o.csv"},
         "rate": 3.0}
    topologies = {
        "a": {"kind": "colocated", "device": "h100-sxm"},                    # a preset name: kept
        "b": {"kind": "colocated", "device": "gpu.yaml"},                    # a profile beside the plan
        "c": {"kind": "disaggregated", "prefill": {"device": "profiles/p.json"},
              "decode": {"device": "/opt/d.yml"}, "kv_link": {"preset": "nvlink"}},
        "d": {"kind": "disaggregated", "prefill": {"device": "a100-80gb-sxm"}, "decode": {"device": "x/y"}}}
    _absolute_paths(w, topologies, Path("plans"))           # relative: resolved against the working folder
    assert w == {"trace": {"path": f"{base}/traces/t.csv", "rate_scale": 2.0},
                 "prompt_tokens": {"dist": "empirical", "path": f"{base}/lens/p.csv"},
                 "output_tokens": {"dist": "empirical", "path": f"{base}/lens/o.csv"}, "rate": 3.0}
    assert topologies == {
        "a": {"kind": "colocated", "device": "h100-sxm"},
        "b": {"kind": "colocated", "device": f"{base}/gpu.yaml"},
        "c": {"kind": "disaggregated", "prefill": {"device": f"{base}/profiles/p.json"},
              "decode": {"device": "/opt/d.yml"}, "kv_link": {"preset": "nvlink"}},
        "d": {"kind": "disaggregated", "prefill": {"device": "a100-80gb-sxm"}, "decode": {"device": f"{base}/x/y"}}}
    # absolute paths kept; lengths given as numbers or without a file; a pool without a device: nothing to
    # rewrite, nothing added
    for w in ({"trace": {"path": "/data/t.csv"}, "prompt_tokens": {"path": "/data/p.csv"},
               "output_tokens": {"path": "/data/o.csv"}},
              {"prompt_tokens": 100, "output_tokens": {"dist": "uniform", "low": 1, "high": 9}, "trace": None}):
        before = json.loads(json.dumps(w))
        _absolute_paths(w, {}, base)
        assert w == before
    topologies = {"a": {"kind": "colocated"}, "b": {"kind": "colocated", "device": None}}
    _absolute_paths({}, topologies, base)
    assert topologies == {"a": {"kind": "colocated"}, "b": {"kind": "colocated", "device": None}}


_Script = ScriptedExecutor       # answer(config, rate, seed, requests) (conftest)


def _res(ok, n=100, met=None, early=None, ci=None, ttft_p=0.1, tpot_p=0.01, total=None, settled=None):
    """An evaluate() result: ``ok`` of ``n`` judged requests met both bounds."""
    return {"n": n, "ok": ok, "ttft_ok": ok, "tpot_ok": n, "finished": n, "early": early,
            "settled": total or n if settled is None else settled, "total": total or n, "ci": ci,
            "ttft_p": ttft_p, "tpot_p": tpot_p, "slo_met": ok / n >= 0.9 if met is None else met}


def _runner(goodput=None, slo=None, ex=None, cache_dir=None, progress=False):
    raw = _raw(goodput={"min_duration_s": 0, **(goodput or {})})
    if slo:
        raw["slo"] = {**raw["slo"], **slo}
    plan = parse_plan(raw)
    one, two = plan.configs
    return plan, _Runner(plan, ex, cache_dir, progress), one, two


def test_runner_worst_seed_runs_seeds_in_turn_and_drops_what_failed():
    # 3 seeds from the plan's seed 7.  A at 5 req/s passes every seed (95, 92, 99 of 100); B at 5 req/s
    # passes seed 7 and fails seed 8 (80 of 100); A at 8 req/s fails seed 7 (50).  worst_seed: a failure
    # ends that (config, rate): seed 8 runs A@5 and B@5, seed 9 only A@5.  Saved: A@8's two seeds and
    # B@5's last one = 3.  Early stop "both" on every task (worst_seed with early_stop).
    table = {("A", 5.0): {7: 95, 8: 92, 9: 99}, ("B", 5.0): {7: 96, 8: 80}, ("A", 8.0): {7: 50}}
    ex = _Script(None)
    plan, runner, one, two = _runner({"seeds": 3}, ex=ex)
    name = {one.name: "A", two.name: "B"}
    ex.answer = lambda c, rate, seed, n: _res(table[name[c], rate][seed], ttft_p=seed / 10,
                                             early="pass" if seed == 8 else None)
    a5, b5, a8 = runner.run([(one, 5.0), (two, 5.0), (one, 8.0)])
    assert [(name[c], r, s, n, e) for c, r, s, n, e in ex.calls] == [
        ("A", 5.0, 7, 100, "both"), ("B", 5.0, 7, 100, "both"), ("A", 8.0, 7, 100, "both"),
        ("A", 5.0, 8, 100, "both"), ("B", 5.0, 8, 100, "both"), ("A", 5.0, 9, 100, "both")]
    assert ex.maps == 3 and runner.skipped["worst_seed"] == 3 and runner.simulated == 6
    # pooled over the seeds run: sums; the worst seed's attainment judges (pass_att); every seed's own
    # verdict decides (passes); the percentiles are the worst seed's; the first early stop is reported
    assert {k: a5[k] for k in ("n", "ok", "ttft_ok", "tpot_ok", "finished")} == {
        "n": 300, "ok": 286, "ttft_ok": 286, "tpot_ok": 300, "finished": 300}
    assert (a5["min_att"], a5["pass_att"], a5["passes"], a5["all_met"]) == (0.92, 0.92, True, True)
    assert (a5["ttft_p"], a5["tpot_p"], a5["early"]) == (0.9, 0.01, "pass")
    assert (b5["n"], b5["ok"], b5["pass_att"], b5["passes"], b5["ttft_p"]) == (200, 176, 0.8, False, 0.8)
    assert (a8["n"], a8["ok"], a8["pass_att"], a8["passes"], a8["early"]) == (100, 50, 0.5, False, None)
    # the early stops counted by kind as they come back (seed 8: A@5 and B@5)
    assert runner.skipped["early_stop_pass"] == 2 and runner.skipped["early_stop_fail"] == 0


def test_runner_pooled_runs_every_seed_without_early_stop_and_judges_the_pool():
    # pooled: every seed of every (config, rate) runs (a failed seed may be outweighed), no early stop
    # (pooled sums need exact counts), the rate passes on the pooled attainment, not on the seeds'
    # verdicts (attainment mode): A@5 passes at 94 + 86 = 180 / 200 = 0.9 though seed 8 alone fails
    ex = _Script(lambda c, rate, seed, n: _res({7: 94, 8: 86}[seed]))
    plan, runner, one, two = _runner({"seeds": 2, "aggregate": "pooled"}, ex=ex)
    (a5,) = runner.run([(one, 5.0)])
    assert [(s, e) for _, _, s, _, e in ex.calls] == [(7, None), (8, None)]
    assert (a5["ok"], a5["n"], a5["pass_att"], a5["min_att"], a5["all_met"]) == (180, 200, 0.9, 0.86, False)
    assert "passes" not in a5 and runner.skipped["worst_seed"] == 0
    # percentile mode has no pooled form: each seed's own verdict decides, whatever the aggregate
    ex = _Script(lambda c, rate, seed, n: _res({7: 94, 8: 86}[seed], met=seed == 7))
    plan, runner, one, two = _runner({"seeds": 2, "aggregate": "pooled"}, slo={"mode": "percentile"}, ex=ex)
    (a5,) = runner.run([(one, 5.0)])
    assert len(ex.calls) == 2 and a5["passes"] is False and a5["pass_att"] == 0.9
    # worst_seed without early stop: the seeds still stop at a failure, the tasks run to the end
    ex = _Script(lambda c, rate, seed, n: _res(50))
    plan, runner, one, two = _runner({"seeds": 4, "early_stop": False}, ex=ex)
    (a5,) = runner.run([(one, 5.0)])
    assert [(s, e) for _, _, s, _, e in ex.calls] == [(7, None)] and runner.skipped["worst_seed"] == 3
    assert a5["passes"] is False and a5["n"] == 100


def test_runner_results_come_from_the_cache_in_task_order(tmp_path):
    # a task already answered is read back from the cache dir, not sent; the answers keep the order of
    # the tasks whatever mix of cached and new; counters: simulated / cached, early stops by kind,
    # requests simulated (total) and settled, only for tasks simulated now
    answers = {4.0: _res(90, early="fail", total=200, settled=150), 5.0: _res(95, early="pass", total=200,
                                                                                 settled=120),
               6.0: _res(97, total=200, settled=200)}
    ex = _Script(lambda c, rate, seed, n: answers[rate])
    plan, runner, one, two = _runner(ex=ex, cache_dir=tmp_path / "cache")
    t4, t5, t6 = (runner._task(one, r, 7) for r in (4.0, 5.0, 6.0))
    assert runner._results([t4, t5]) == [answers[4.0], answers[5.0]]
    assert (runner.simulated, runner.cached, runner.requests_total, runner.requests_settled) == (2, 0, 400, 270)
    assert runner.skipped == {"worst_seed": 0, "early_stop_pass": 1, "early_stop_fail": 1}
    assert len(list((tmp_path / "cache").glob("*.json"))) == 2
    ex.answer = lambda c, rate, seed, n: answers[rate] if rate == 6.0 else pytest.fail("sent a cached task")
    assert runner._results([t6, t5, t4]) == [answers[6.0], answers[5.0], answers[4.0]]
    assert [r for _, r, _, _, _ in ex.calls] == [4.0, 5.0, 6.0] and ex.maps == 2
    assert (runner.simulated, runner.cached, runner.requests_total, runner.requests_settled) == (3, 2, 600, 470)
    assert runner.skipped == {"worst_seed": 0, "early_stop_pass": 1, "early_stop_fail": 1}
    # all cached: the executor is not called at all
    assert runner._results([t5]) == [answers[5.0]] and ex.maps == 2 and runner.cached == 3
    # no cache dir: every task is sent, nothing is stored
    plan, runner, one, two = _runner(ex=_Script(lambda c, rate, seed, n: answers[rate]))
    assert runner._results([runner._task(one, 4.0, 7)] * 2) == [answers[4.0]] * 2
    assert (runner.simulated, runner.cached) == (2, 0)


def test_runner_log_line(capsys):
    plan, runner, one, two = _runner(ex=_Script(None), progress=True)
    runner.simulated, runner.cached = 12, 3
    runner.t0 = __import__("time").perf_counter() - 41.6       # 41.6 s ago: printed rounded to 42 s
    runner.log("round 2: 4 configs")
    assert capsys.readouterr().err == "pdsim plan: round 2: 4 configs [12 simulated, 3 cached, 42 s]\n"
    runner.progress = False                                        # --quiet
    runner.log("round 3")
    assert capsys.readouterr() == ("", "")


def test_runner_confirm_doubles_the_window_while_the_interval_straddles_the_target():
    # 2 confirm seeds from 7 + 1000; windows from 2x the search's 100 requests up to 8x (200, 400, 800);
    # a window is doubled while its interval is wider than 2 x 0.02 and holds the target 0.9
    target = 0.9
    seen = []

    def answer(c, rate, seed, n):
        seen.append((c, seed, n))
        if c.endswith("x1"):      # A
            if seed == 1007:
                # 200: wide, holds 0.9 -> 400: upper end exactly 0.9 (still holds it: target <= hi) -> 800: the
                # next doubling (1600) is past 8x: keep 800 whatever its interval
                return {200: _res(182, n=200, ci=[0.85, 0.97]), 400: _res(356, n=400, ci=[0.85, 0.9]),
                        800: _res(736, n=800, ci=[0.88, 0.96])}[n]
            return _res(190, n=200, ci=[0.92, 0.98])          # 1008: all above 0.9: no doubling
        # B at 6 req/s, seed 1007: interval 0.05 wide but all below 0.9 (hi < target): no doubling, fails;
        # its second seed is never run
        return _res(160, n=200, ci=[0.775, 0.825])
    ex = _Script(answer)
    plan, runner, one, two = _runner({"confirm_seeds": 2, "confirm_factor": 2, "confirm_max_factor": 8,
                                      "ci_halfwidth": 0.02}, ex=ex)
    a, b = runner.confirm([(one, 4.0), (two, 6.0)])
    assert [(c[-2:], r, s, n, e) for c, r, s, n, e in ex.calls] == [
        ("x1", 4.0, 1007, 200, None), ("x2", 6.0, 1007, 200, None), ("x1", 4.0, 1007, 400, None),
        ("x1", 4.0, 1007, 800, None), ("x1", 4.0, 1008, 200, None)]
    # A: 736 / 800 = 0.92 and 190 / 200 = 0.95 both pass; the worst seed (0.92) is reported, its interval,
    # the largest window (8x), the seeds and every request simulated for the verdict kept (800 + 200)
    want_a = {"passed": True, "attainment": 0.92, "ci": [0.88, 0.96], "early": None, "requests": 1000,
              "factor": 8, "seeds": [1007, 1008], "ttft_ok": 736, "tpot_ok": 800, "n": 800, "ok": 736,
              "ttft_p": 0.1, "tpot_p": 0.01}
    want_b = {"passed": False, "attainment": 0.8, "ci": [0.775, 0.825], "early": None, "requests": 200,
              "factor": 2, "seeds": [1007], "ttft_ok": 160, "tpot_ok": 200, "n": 200, "ok": 160,
              "ttft_p": 0.1, "tpot_p": 0.01}
    assert {k: a[k] for k in want_a} == want_a and {k: b[k] for k in want_b} == want_b
    assert target == plan.spec.slo.attainment_target and CONFIRM_SEED_OFFSET == 1000


@pytest.mark.parametrize("ci, doubles", [
    # ci_halfwidth 1/32: narrow enough at a width of 2/32 = 0.0625 (values exact in binary)
    ([0.875, 0.9375], False),   # 0.0625 wide: narrow enough
    ([0.87, 0.94], True),       # 0.07 wide, holds 0.9
    ([0.9, 0.97], False),       # lower end at the target: cannot fail on a longer run (ci[0] < target)
    ([0.899, 0.97], True),
    ([0.83, 0.9], True),        # upper end at the target: can still pass (target <= ci[1])
    ([0.83, 0.899], False),     # all below: cannot pass
    (None, False),              # too few requests for an interval
])
def test_runner_confirm_doubling_rule_at_its_edges(ci, doubles):
    ex = _Script(lambda c, rate, seed, n: _res(int(0.9 * n), n=n, ci=ci))
    plan, runner, one, two = _runner({"confirm_factor": 3, "confirm_max_factor": 6, "ci_halfwidth": 1 / 32},
                                     ex=ex)
    (r,) = runner.confirm([(one, 4.0)])
    # 3x = 300 requests; doubling once reaches 6x = the maximum (allowed: 6 <= 6), never 12x
    assert [n for _, _, _, n, _ in ex.calls] == ([300, 600] if doubles else [300])
    assert r["factor"] == (6 if doubles else 3) and r["passed"] is True and r["seeds"] == [1007]


def _rows(plan, goodputs, at_target=None):
    """The rows run_plan hands to _confirm: each config measured (status ok) at the given goodput."""
    rows = {}
    for c, g in zip(plan.configs, goodputs):
        rows[c.name] = {"config": c.name, "gpus": c.gpus, "usd_per_hour": c.usd_per_hour, "status": "ok",
                        "goodput": g, "note": "", "bound_rate": c.bound_rate, "points": {}, "topology": c.topology}
        if at_target is not None:
            rows[c.name]["at_target"] = {"pass_att": 0.95, "early": None, "ttft_p": 0.2, "tpot_p": 0.02,
                                         "passes": True}
    return rows


class _Confirmer:
    """A runner whose long runs pass or fail by ``passes(config, rate)``; records each batch asked."""

    def __init__(self, passes):
        self.passes, self.batches, self.logged = passes, [], []

    def log(self, msg):
        self.logged.append(msg)

    def confirm(self, cfg_rates):
        self.batches.append([(c.name, r) for c, r in cfg_rates])
        return [dict(_res(190 if self.passes(c.name, r) else 174, n=200, ci=[0.8, 0.88], ttft_p=0.61),
                     passed=self.passes(c.name, r), attainment=0.95 if self.passes(c.name, r) else 0.87)
                for c, r in cfg_rates]


def _four(**over):
    # four one-replica configs priced $1 ... $4/h (one device each: a config is named by its device)
    search = {"devices": [{"name": d, "price_per_hour_usd": p}
                          for d, p in (("l40s", 1.0), ("a100-80gb-sxm", 2.0), ("h100-sxm", 3.0), ("h200", 4.0))],
              "colocated": {"replicas": [1]}, "pool": {"kv_blocks": 2000, "cost_model": LINEAR}}
    return parse_plan(_raw(search, **over))


def test_confirm_target_mode_demotes_a_failure_and_checks_the_next_cheapest():
    # cheapest at 10 req/s, confirm_top 2: the two cheapest ($1, $2) are run long at the target rate; $1
    # passes, $2 fails and is demoted ("fails long run"); the top two are then $1 (passed: not run again)
    # and $3, which is run alone and passes; $4 is never run
    plan = _four(target={"rate": 10}, goodput={"confirm_top": 2, "confirm_factor": 3, "min_duration_s": 20})
    names = [c.name for c in plan.configs]
    assert [c.usd_per_hour for c in plan.configs] == [1.0, 2.0, 3.0, 4.0]
    rows = _rows(plan, [12.0, 11.0, 13.0, 14.0], at_target=True)
    runner = _Confirmer(lambda c, r: c != names[1])
    _confirm(plan, rows, runner)
    assert runner.batches == [[(names[0], 10), (names[1], 10)], [(names[2], 10)]]
    failed = rows[names[1]]
    assert failed["status"] == "fails long run" and failed["long_run_failures"] == 1
    # the note: the rate, the attainment with its interval, then which SLO misses (174 of 200 within TTFT)
    assert failed["note"] == ("long run at 10 req/s: attainment 87.0% (95% CI 80.0%-88.0%) < target; "
                              "TTFT: 87% within 0.5 s (p90 0.61 s)")
    assert failed["long_run"]["rate"] == 10 and failed["long_run"]["passed"] is False
    assert failed["goodput"] == 11.0                       # target mode: the goodput is not touched
    for n in (names[0], names[2]):
        assert rows[n]["status"] == "ok" and rows[n]["long_run"]["passed"] and "long_run_failures" not in rows[n]
    assert "long_run" not in rows[names[3]]
    # each batch is announced with its configs and windows: at 10 req/s the search window is 10 x 20 s =
    # 200 requests (more than the workload's 100), 3x that for a long run
    assert runner.logged[0] == (f"long runs: {names[0]}, {names[1]} (3x the search window, [600, 600] requests, "
                                "fresh seeds)")
    assert runner.logged[1].startswith(f"long runs: {names[2]} (") and len(runner.logged) == 2


def test_confirm_goodput_mode_lowers_a_failed_goodput_by_the_tolerance_then_demotes():
    # goodput per $/h, tolerance 0.1, confirm_top 1.  $1 at 10 req/s passes long runs only up to 8.5 req/s:
    # 10 fails -> 9 (10 x 0.9) fails -> 8.1 passes.  $2 at 12 req/s (6 per $/h) stays below: never run.
    plan = _four(goodput={"confirm_top": 1, "tolerance": 0.1, "min_duration_s": 0})
    names = [c.name for c in plan.configs]
    rows = _rows(plan, [10.0, 12.0, 3.0, 4.0])
    runner = _Confirmer(lambda c, r: r <= 8.5)
    _confirm(plan, rows, runner)
    assert [[(c, round(r, 9)) for c, r in b] for b in runner.batches] == [[(names[0], 10.0)], [(names[0], 9.0)],
                                                                          [(names[0], 8.1)]]
    row = rows[names[0]]
    assert row["goodput"] == pytest.approx(8.1) and row["status"] == "ok" and row["long_run_failures"] == 2
    assert row["long_run"]["passed"] and row["long_run"]["rate"] == pytest.approx(8.1)
    assert row["note"] == ("goodput lowered: long run at 10 req/s: attainment 87.0% (95% CI 80.0%-88.0%); "
                           "goodput lowered: long run at 9 req/s: attainment 87.0% (95% CI 80.0%-88.0%)")
    # lowered below the next config's ratio, the next one is checked instead: $2 at 15 req/s (7.5 per $/h);
    # $1 failing every long run goes 10 -> 9 -> 8.1 -> 7.29 (below 7.5): $2 is first and checked (passes at
    # 15), and with confirm_top 1 nothing else is: $1 keeps 7.29, still "ok" (not first, not demoted)
    rows = _rows(plan, [10.0, 15.0, 3.0, 4.0])
    runner = _Confirmer(lambda c, r: c != names[0])
    _confirm(plan, rows, runner)
    assert [[(c, round(r, 9)) for c, r in b] for b in runner.batches] == [
        [(names[0], 10.0)], [(names[0], 9.0)], [(names[0], 8.1)], [(names[1], 15.0)]]
    assert rows[names[0]]["goodput"] == pytest.approx(7.29) and rows[names[0]]["long_run_failures"] == 3
    assert rows[names[0]]["status"] == "ok" and rows[names[1]]["long_run"]["passed"]


def test_confirm_goodput_mode_demotes_after_max_confirm_steps_failures():
    # one config that fails every long run: its goodput is lowered 4 times (10, 9, 8.1, 7.29, 6.561 tried),
    # the 5th failure (> MAX_CONFIRM_STEPS) demotes it; nothing is left to confirm
    plan = _four(goodput={"confirm_top": 3, "tolerance": 0.1, "min_duration_s": 0})
    names = [c.name for c in plan.configs]
    rows = _rows(plan, [10.0])
    del plan.configs[1:]
    runner = _Confirmer(lambda c, r: False)
    _confirm(plan, rows, runner)
    rates = [r for ((_, r),) in runner.batches]
    assert rates == pytest.approx([10.0, 9.0, 8.1, 7.29, 6.561])
    row = rows[names[0]]
    assert row["status"] == "fails long run" and row["long_run_failures"] == 5
    assert row["goodput"] == pytest.approx(6.561)          # the last lowering stays; the row no longer meets
    assert MAX_CONFIRM_STEPS == 4
    assert row["note"].startswith("long run at 6.56 req/s: attainment 87.0% (95% CI 80.0%-88.0%) < target; ")
    # confirm_top 0: no long run at all
    plan = _four(goodput={"confirm_top": 0})
    runner = _Confirmer(lambda c, r: False)
    rows = _rows(plan, [10.0, 9.0, 8.0, 7.0])
    _confirm(plan, rows, runner)
    assert runner.batches == [] and runner.logged == [] and all("long_run" not in r for r in rows.values())


def test_plan_table_by_hand_through_a_scripted_executor():
    # One and two batch-1 replicas of a constant 0.1 s step ($1 per GPU-hour), 8-token prompts, 1 output
    # token: a request is one 0.1 s step, so the analytic bound is 10 req/s per replica.  The script says a
    # search run passes up to 3.3 req/s on one replica and 7 on two (95% of the requests meet the SLO, else
    # 50%; a failing one stops early with 60 of 100 settled).  Goodput per $/h, tolerance 5%, one seed, the
    # best config run long (2x: 200 requests), where two replicas pass only up to 6.8 req/s.
    search = {"devices": [{"name": "h100-sxm", "price_per_hour_usd": 1.0}], "colocated": {"replicas": [1, 2]},
              "pool": {"max_running": 1, "kv_blocks": 1000, "cost_model": {"kind": "constant", "step_s": 0.1}}}
    raw = _raw(search, workload={"arrival": "poisson", "num_requests": 100, "prompt_tokens": 8, "output_tokens": 1},
               goodput={"min_duration_s": 0, "seeds": 1, "tolerance": 0.05, "confirm_top": 1, "confirm_factor": 2,
                        "scale_guess": False})     # unguided searches (the guided: tests/test_plan_guess.py)
    plan = parse_plan(raw)
    x1, x2 = "colo-h100-sxm-tp1x1", "colo-h100-sxm-tp1x2"
    assert [(c.name, c.bound_rate) for c in plan.configs] == [(x1, pytest.approx(10.0)), (x2, pytest.approx(20.0))]
    cap = {x1: 3.3, x2: 7.0}

    def answer(c, rate, seed, n):
        if n == 200:              # a long run: to the end
            return _res(190 if rate <= 6.8 else 100, n=200)
        # a search run that fails stops early, 60 of its 100 requests settled
        return _res(95, n=100) if rate <= cap[c] else _res(50, n=100, early="fail", settled=60)
    ex = _Script(answer)
    res = run_plan(plan, ex)
    # the searches, by the rules of test_goodput_search_sequence_by_hand: half the bound, then down by 4
    # after a failure, then bisection until the bracket is within 5% of its failing end
    # one replica: 5 F, 1.25 P, 3.125 P, 4.0625 F, 3.59375 F, 3.359375 F, 3.2421875 P (0.117 <= 0.168): 3.2421875
    # two: 10 F, 2.5 P, 6.25 P, 8.125 F, 7.1875 F, 6.71875 P, 6.953125 P (0.234 <= 0.359): 6.953125
    search_calls = [(c, r) for c, r, s, n, e in ex.calls if n == 100]
    assert [r for c, r in search_calls if c == x1] == [5.0, 1.25, 3.125, 4.0625, 3.59375, 3.359375, 3.2421875]
    assert [r for c, r in search_calls if c == x2] == [10.0, 2.5, 6.25, 8.125, 7.1875, 6.71875, 6.953125]
    assert {s for _, _, s, n, _ in ex.calls if n == 100} == {7}
    # two replicas first (6.953125 / $2 = 3.48 per $/h > 3.24): long run at 6.953125 fails, the goodput is
    # lowered 5% to 6.60546875 (3.30 per $/h, still first), which passes; seeds 1007
    long = [(c, r, s) for c, r, s, n, e in ex.calls if n == 200]
    assert long == [(x2, 6.953125, 1007), (x2, 6.953125 * 0.95, 1007)]
    assert res["winner"] == x2 and res["simulations"] == 16 and res["cached"] == 0
    two, one = res["rows"]
    assert (two["config"], two["rank"], one["config"], one["rank"]) == (x2, 1, x1, 2)
    assert (two["goodput"], two["bracket"], two["gpus"], two["usd_per_hour"]) == (6.953125 * 0.95, [6.953125, 7.1875],
                                                                                 2, 2.0)
    assert two["goodput_per_gpu"] == two["goodput_per_usd_hour"] == 6.953125 * 0.95 / 2
    assert (one["goodput"], one["bracket"], one["goodput_per_usd_hour"]) == (3.2421875, [3.2421875, 3.359375],
                                                                             3.2421875)
    assert two["meets"] and one["meets"] and two["status"] == one["status"] == "ok"
    assert two["long_run_attainment"] == 0.95 and one["long_run_attainment"] is None and two["margin"] is None
    assert two["note"] == "goodput lowered: long run at 6.95 req/s: attainment 50.0%"
    # both on the $/h-goodput frontier ($1: 3.24; $2: 6.6 > 3.24); points keyed by rate, their attainments
    assert res["frontier"] == [x1, x2] and one["pareto"] and two["pareto"]
    assert list(one["points"]) == ["1.25", "3.125", "3.24219", "3.35938", "3.59375", "4.0625", "5"]
    assert one["points"]["5"] == {"attainment": 0.5, "worst_seed_attainment": 0.5, "ttft_p": 0.1, "tpot_p": 0.01,
                                  "early_stop": "fail"}
    assert one["points"]["1.25"]["worst_seed_attainment"] == 0.95 and one["points"]["1.25"]["early_stop"] is None
    # 7 search runs failed (4 + 3), each stopped with 40 of its requests not simulated
    assert res["skipped"] == {"infeasible": 0, "pruned_by_bound": 0, "dominated": 0, "guided_by_sibling": 0,
                              "long_runs_ahead": 0, "long_runs_ahead_used": 0,
                              "worst_seed": 0, "early_stop_pass": 0, "early_stop_fail": 7, "cached": 0, "requests_not_simulated": 7 * 40,
                              "requests_total": 14 * 100 + 2 * 200}


def test_runner_without_the_runs_own_verdict_judges_each_seed_by_the_attainment():
    # a result without slo_met (the run's own SLO rule) is judged by its attainment against the target 0.9:
    # the search's worst-seed rule drops 89% after seed 7; on the long runs (10x: 1000 requests) 90% passes,
    # 89% fails (and its second seed is not run)
    def bare(ok, n=100):
        r = _res(ok, n=n)
        del r["slo_met"]
        return r
    ex = _Script(lambda c, rate, seed, n: bare({4.0: 90, 5.0: 89}[rate] * n // 100, n))
    plan, runner, one, two = _runner({"seeds": 2, "confirm_seeds": 2}, ex=ex)
    a4, a5 = runner.run([(one, 4.0), (one, 5.0)])
    assert [(r, s) for _, r, s, _, _ in ex.calls] == [(4.0, 7), (5.0, 7), (4.0, 8)]
    assert (a4["all_met"], a4["pass_att"], a5["pass_att"]) == (None, 0.9, 0.89) and "passes" not in a4
    ex.calls.clear()
    p4, p5 = runner.confirm([(one, 4.0), (one, 5.0)])
    assert [(r, s) for _, r, s, _, _ in ex.calls] == [(4.0, 1007), (5.0, 1007), (4.0, 1008)]
    assert (p4["passed"], p4["seeds"], p5["passed"], p5["seeds"]) == (True, [1007, 1008], False, [1007])


def test_runner_shows_a_progress_bar_of_its_simulations_on_a_terminal(monkeypatch):
    # on a terminal (faked), the simulations of a batch tick a bar named "plan" counted in "sim", one tick
    # per simulation, only for the tasks not cached; --quiet (progress False) makes no bar.  tqdm itself is
    # replaced by a recorder (a real bar starts a monitor thread, which deadlocks mutmut's forked children).
    import tqdm

    import pdsim.progress
    bars = []

    class Recorder:
        def __init__(self, total=None, desc=None, unit="it", **_):
            self.total, self.desc, self.unit, self.n = total, desc, unit, 0
            bars.append(self)

        def update(self, n=1):
            self.n += n

        def clear(self):
            pass

        def close(self):
            pass
    monkeypatch.setattr(tqdm, "tqdm", Recorder)
    monkeypatch.setattr(pdsim.progress, "is_tty", lambda stream=None: True)
    plan, runner, one, two = _runner(ex=_Script(lambda *a: _res(95)), progress=True)
    runner._results([runner._task(one, r, 7) for r in (4.0, 5.0)])
    assert [(b.desc, b.unit, b.total, b.n) for b in bars] == [("plan", "sim", 2, 2)]
    plan, runner, one, two = _runner(ex=_Script(lambda *a: _res(95)), progress=False)
    runner._results([runner._task(one, r, 7) for r in (4.0, 5.0)])
    assert len(bars) == 1


def test_two_device_choices_of_one_name_are_refused_not_merged():
    # the same preset at two prices gave two configs of one name: run_plan's rows (a dict by name) kept one,
    # so the $2/h config vanished from the table and its search mixed with the $3/h one's
    search = {"devices": [{"name": "h100-sxm", "price_per_hour_usd": 2.0},
                          {"name": "h100-sxm", "price_per_hour_usd": 3.0}],
              "colocated": {"replicas": [1]}, "pool": {"kv_blocks": 2000, "cost_model": LINEAR}}
    with pytest.raises(ConfigError) as e:
        parse_plan(_raw(search), "p.yaml")
    assert str(e.value).startswith("p.yaml: search.devices: two configurations of the search space are both named "
                                   "colo-h100-sxm-tp1x1")
    # a decode device listed twice under one name: the same
    search = {"devices": ["h100-sxm"], "disaggregated": {"decode_devices": ["a100-80gb-sxm",
                                                                           {"name": "a100-80gb-sxm",
                                                                            "price_per_hour_usd": 1.0}]},
              "pool": {"kv_blocks": 2000, "cost_model": LINEAR}}
    with pytest.raises(ConfigError, match="both named pd-h100-sxm-1p1-1d1-a100-80gb-sxm-infiniband"):
        parse_plan(_raw(search))
    # distinct device names: two configs
    search = {"devices": [{"name": "h100-sxm", "price_per_hour_usd": 2.0}, "a100-80gb-sxm"],
              "colocated": {"replicas": [1]}, "pool": {"kv_blocks": 2000, "cost_model": LINEAR}}
    assert len(parse_plan(_raw(search)).configs) == 2


# --- the search's edges, the interval's clip, the miss notes, the ranking and the cache key (branch mutplan3) -----
import time  # noqa: E402

from pdsim import __version__  # noqa: E402
from pdsim.config import SLOSpec  # noqa: E402
from pdsim.plan import _misses, _order, _pooled, _rank, task_key  # noqa: E402


def test_goodput_search_doubles_from_a_passed_target_and_without_a_bound():
    # target mode: run_plan first records the target rate 10 (passed); with the bound at 100 the search doubles
    # from there: 20 (not 30, and not the bound)
    s = Search(_cfg(100.0), 0.05)
    s.update(10.0, {"pass_att": 1.0}, 0.9)
    assert s.next_rate() == 20.0
    # no bound: start at 1 req/s and double while it passes; the config passes up to 5 req/s:
    # 1 P, 2 P, 4 P, 8 F, then bisect [4, 8]: 6 F, 5 P, [5, 6]: 1 > 5% of 6 (0.3): 5.5 F; [5, 5.5]: 0.5 > 0.275:
    # 5.25 F; [5, 5.25]: 0.25 <= 0.2625: done, goodput 5
    s = Search(_cfg(math.inf), 0.05)
    assert _drive(s, lambda r: r <= 5) == [1.0, 2.0, 4.0, 8.0, 6.0, 5.0, 5.5, 5.25]
    assert (s.lo, s.hi, s.done) == (5.0, 5.25, True)


def test_goodput_search_edges_of_its_stopping_rules():
    # the bound rule is inclusive: lo 10 passed, bound 15, tolerance 50%: doubling gives min(20, 15) = 15, which
    # is exactly 10 x 1.5: no room above what passed, so the search is done at the bound without running 15
    s = Search(_cfg(15.0), 0.5)
    s.update(10.0, {"pass_att": 1.0}, 0.9)
    assert s.next_rate() is None and s.done and s.note == "reaches the analytic bound"
    # the trickle rule stops only *below* a thousandth of the highest rate tried: failures at 1000 and 4 req/s:
    # next 4 / 4 = 1 = 1000 x 1e-3 (exactly, in floats): still tried; after a failure there, 0.25 < 1: done
    s = Search(_cfg(math.inf), 0.05)
    s.update(1000.0, {"pass_att": 0.0}, 0.9)
    s.update(4.0, {"pass_att": 0.0}, 0.9)
    assert 1000 * 1e-3 == 1.0 and s.next_rate() == 1.0
    s.update(1.0, {"pass_att": 0.0}, 0.9)
    assert s.next_rate() is None and s.done and s.note == "misses the SLO even at a trickle"
    # an attainment exactly at the target passes (>=)
    s = Search(_cfg(10.0), 0.05)
    s.update(5.0, {"pass_att": 0.9}, 0.9)
    assert (s.lo, s.hi) == (5.0, math.inf)


def test_search_rounds_left_by_hand():
    # bracketing (no failure, or no pass, yet): 1 + max(1, ceil(log2(1 / tol))) rounds
    s = Search(_cfg(10.0), 0.05)
    assert s.rounds_left() == 6                   # log2(20) = 4.32 -> 5, + 1
    assert Search(_cfg(10.0), 0.5).rounds_left() == 2      # log2(2) = 1, + 1
    s.update(5.0, {"pass_att": 0.0}, 0.9)         # a failure, no pass: still bracketing (lo 0)
    assert s.rounds_left() == 6
    # bisecting [6, 10] at tol 1/8: width 4 / (1/8 x 10 = 1.25) = 3.2 -> log2 1.68 -> 2 halvings, + 1 = 3
    s = Search(_cfg(100.0), 0.125)
    s.update(6.0, {"pass_att": 1.0}, 0.9)
    s.update(10.0, {"pass_att": 0.0}, 0.9)
    assert s.rounds_left() == 3
    # [1, 2] at tol 1/8: 1 / 0.25 = 4 -> 2, + 1 = 3 (a pass at exactly 1 req/s is a pass: bisecting)
    s = Search(_cfg(100.0), 0.125)
    s.update(1.0, {"pass_att": 1.0}, 0.9)
    s.update(2.0, {"pass_att": 0.0}, 0.9)
    assert s.rounds_left() == 3
    s.done = True
    assert s.rounds_left() == 0


def test_batch_means_interval_is_clipped_at_one():
    # 20 batches of 2: the first [1, 0] (mean 0.5), 19 of [1, 1]: mean 39 / 40 = 0.975; batch means deviate
    # by +0.025 (19x) and -0.475: sum of squares 19 x 0.000625 + 0.225625 = 0.2375, variance / 19 = 0.0125;
    # half-width 2.093 x sqrt(0.0125 / 20) = 2.093 x 0.025 = 0.052325: [0.922675, 1.027325] clipped to 1
    ok = np.array([1, 0] + [1, 1] * 19, float)
    lo, hi = batch_means_ci(ok)
    assert hi == 1.0 and lo == pytest.approx(0.975 - 0.052325, rel=1e-12)


def test_pooled_results_keep_that_a_seed_stopped_early():
    # a seed stopped at a certain fail reports bounds so far (p_so_far): the pool says so if any seed does
    assert _pooled([_res(95), dict(_res(50, early="fail"), p_so_far=True)])["p_so_far"] is True
    assert _pooled([_res(95), _res(96)])["p_so_far"] is False


SLO_HAND = SLOSpec(ttft_s=0.5, tpot_s=0.05, attainment_target=0.9, ttft_percentile=90, tpot_percentile=99)


def _mr(n, ok, ttft_ok, tpot_ok, ttft_p=None, tpot_p=None, early=None, p_so_far=None):
    r = {"n": n, "ok": ok, "ttft_ok": ttft_ok, "tpot_ok": tpot_ok, "ttft_p": ttft_p, "tpot_p": tpot_p, "early": early}
    if p_so_far is not None:
        r["p_so_far"] = p_so_far
    return r


def test_miss_notes_by_hand():
    # a run stopped at a certain fail: 8 of 10 within TTFT and 7 within TPOT are upper bounds ("at most"), the
    # p90 TTFT so far a lower bound (">="); no TPOT percentile known: no parenthesis
    r = _mr(10, 6, 8, 7, ttft_p=0.734, early="fail", p_so_far=True)
    assert _misses(r, SLO_HAND) == "TTFT: at most 80% within 0.5 s (p90 >= 0.734 s); TPOT: at most 70% within 0.05 s"
    # a whole run: TTFT 9 of 10 is exactly the target 0.9 (passes, not named); TPOT 8 of 10 with its p99
    r = _mr(10, 8, 9, 8, tpot_p=0.0612)
    assert _misses(r, SLO_HAND) == "TPOT: 80% within 0.05 s (p99 0.0612 s)"
    # TTFT misses without a known percentile; TPOT 9 of 10 exactly at the target
    r = _mr(10, 7, 7, 9, tpot_p=0.04)
    assert _misses(r, SLO_HAND) == "TTFT: 70% within 0.5 s"
    # each bound passes on its own (19 and 18 of 20) but only 17 meet both: 85% < 90%; stopped early the share
    # is an upper bound and the misses of the two bounds overlap
    r = _mr(20, 17, 19, 18, ttft_p=0.4, tpot_p=0.03, early="fail", p_so_far=True)
    assert _misses(r, SLO_HAND) == ("attainment at most 85% < 90% (run stopped once it could no longer pass; "
                                    "TTFT and TPOT misses overlap)")
    r = _mr(20, 17, 19, 18, ttft_p=0.4, tpot_p=0.03)
    assert _misses(r, SLO_HAND) == "attainment 85% < 90% (TTFT and TPOT each pass)"


def _plan_ns(objective, rate=None, att=0.9):
    return SimpleNamespace(spec=SimpleNamespace(objective=objective, target=SimpleNamespace(rate=rate),
                                                slo=SimpleNamespace(attainment_target=att)))


def _orow(name, usd, goodput, status="ok", gpus=1, at=None, lr=None):
    """A row as run_plan leaves it for the ranking: at_target (the target-rate result) and long_run only if run."""
    row = {"config": name, "gpus": gpus, "usd_per_hour": usd, "goodput": goodput, "status": status, "points": {}}
    if at is not None:
        row["at_target"] = at
    if lr is not None:
        row["long_run"] = lr
    return row


def _at(pass_att, passes=None, early=None, ttft_p=0.1, tpot_p=0.01):
    at = {"pass_att": pass_att, "early": early, "ttft_p": ttft_p, "tpot_p": tpot_p}
    if passes is not None:       # set by the runner in worst-seed or percentile mode; absent when pooled
        at["passes"] = passes
    return at


def _cheapest_rows():
    # target 0.5 req/s, target attainment 0.9.  Meeting: c $0.5 (dominated, passed the target), b $1 (percentile
    # mode: passes with only half its requests within both bounds), a $2 (pooled: no "passes", 0.9 is exactly
    # the target).  Not meeting: z failed its long run (goodput 0.75 stays), y missed the p99 at the target
    # though 95% met both bounds, d missed at the target (50%), e was pruned by its bound, f is infeasible.
    return [_orow("a", 2.0, 20.0, at=_at(0.9, early="pass", ttft_p=0.3, tpot_p=0.04),
                  lr={"attainment": 0.93, "ci": [0.91, 0.95], "passed": True}),
            _orow("y", 5.0, None, "misses SLO at target", at=_at(0.95, passes=False)),
            _orow("e", 0.25, None, "below target (bound)"),
            _orow("b", 1.0, 1.1, at=_at(0.5, passes=True)),
            _orow("d", 3.0, None, "misses SLO at target", at=_at(0.5, passes=False, early="fail")),
            _orow("f", 0.25, 0.0, "infeasible"),
            _orow("c", 0.5, 1.0, "dominated (not fully searched)", at=_at(0.95, passes=True)),
            _orow("z", 4.5, 0.75, "fails long run", at=_at(0.95, passes=True))]


def test_cheapest_ranking_by_hand():
    rows = {r["config"]: r for r in _cheapest_rows()}
    ranked = _order(_plan_ns("cheapest", rate=0.5), rows)
    # meeting rows by $/h: c, b, a; then the rest by their attainment at the target, best first (z and y 0.95,
    # d 0.5, e and f none: 0), ties by goodput, best first (z 0.75 before y none), then by name (e, f)
    assert [r["config"] for r in ranked] == ["c", "b", "a", "z", "y", "d", "e", "f"]
    assert [r["meets"] for r in ranked] == [True] * 3 + [False] * 5
    a, e = rows["a"], rows["e"]
    # a: 20 req/s on 1 GPU at $2/h; 20 / 0.5 = 40x the target; its target-rate and long-run figures copied
    assert (a["goodput_per_gpu"], a["goodput_per_usd_hour"], a["margin"]) == (20.0, 10.0, 40.0)
    assert (a["attainment_at_target"], a["at_target_early_stop"], a["ttft_p_at_target_s"], a["tpot_p_at_target_s"],
            a["long_run_attainment"], a["long_run_ci"]) == (0.9, "pass", 0.3, 0.04, 0.93, [0.91, 0.95])
    assert (e["goodput_per_gpu"], e["goodput_per_usd_hour"], e["margin"], e["attainment_at_target"],
            e["at_target_early_stop"], e["ttft_p_at_target_s"], e["tpot_p_at_target_s"], e["long_run_attainment"],
            e["long_run_ci"]) == (None,) * 9
    assert rows["f"]["goodput_per_usd_hour"] == 0.0 and rows["d"]["at_target_early_stop"] == "fail"
    # the same rows by goodput per $/h: a (10), c (2), b (1.1), then the non-meeting by goodput per $/h
    # (z 0.75 / 4.5, then y, d, e none and f 0 at ties: by $/h, then name: e, f, d, y)
    ranked = _order(_plan_ns("goodput_per_usd", rate=0.5), {r["config"]: r for r in _cheapest_rows()})
    assert [r["config"] for r in ranked] == ["a", "c", "b", "z", "e", "f", "d", "y"]


def test_goodput_per_gpu_ranking_by_hand():
    # no target.  Goodput per GPU: q 10/2 = 5 ($2), s 20/4 = 5 ($4), r 8/2 = 4 ($1), p 4/1 = 4 ($3), u and v
    # 3/1 ($6, twins: by name), m 0.5 (still a goodput: it meets); not meeting: x (failed its long runs,
    # 1.2 / 2 = 0.6 per GPU), w infeasible (0 per GPU)
    rows = [_orow("w", 0.2, 0.0, "infeasible"), _orow("x", 5.0, 1.2, "fails long run", gpus=2),
            _orow("m", 0.1, 0.5), _orow("v", 6.0, 3.0), _orow("u", 6.0, 3.0), _orow("p", 3.0, 4.0),
            _orow("r", 1.0, 8.0, gpus=2), _orow("s", 4.0, 20.0, gpus=4), _orow("q", 2.0, 10.0, gpus=2)]
    ranked = _order(_plan_ns("goodput_per_gpu"), {r["config"]: r for r in rows})
    assert [r["config"] for r in ranked] == ["q", "s", "r", "p", "u", "v", "m", "x", "w"]
    assert [r["meets"] for r in ranked] == [True] * 7 + [False] * 2
    assert [r["margin"] for r in ranked] == [None] * 9


def test_goodput_per_usd_ranking_by_hand():
    # no target.  Per $/h: B 5 / $1 = 5 and A 10 / $2 = 5 (tie: cheaper first), m 0.5 / $4 = 0.125, C free ($0/h:
    # no ratio, ranks as 0 but still meets), then the non-meeting: x 1.2 / $2 = 0.6, w infeasible 0
    rows = [_orow("w", 0.2, 0.0, "infeasible"), _orow("x", 2.0, 1.2, "fails long run"), _orow("C", 0.0, 3.0),
            _orow("m", 4.0, 0.5), _orow("A", 2.0, 10.0), _orow("B", 1.0, 5.0)]
    ranked = _order(_plan_ns("goodput_per_usd"), {r["config"]: r for r in rows})
    assert [r["config"] for r in ranked] == ["B", "A", "m", "C", "x", "w"]
    assert [r["goodput_per_usd_hour"] for r in ranked] == [5.0, 5.0, 0.125, None, 0.6, 0.0]
    assert [r["meets"] for r in ranked] == [True] * 4 + [False] * 2


def test_rank_frontier_winner_and_the_result_header():
    plan = parse_plan(_raw(target={"rate": 0.5}, goodput={"min_duration_s": 0, "confirm_top": 0}))
    # all meet at the target.  Frontier by $/h up, goodput up: k1 $1 0.75 (any goodput > 0 counts), k2 $2 5
    # (k3 at the same $2 has only 4), k4 $3 has 5 again: not more; k5 $4 8
    rows = [_orow("k4", 3.0, 5.0, at=_at(0.95, True)), _orow("k3", 2.0, 4.0, at=_at(0.95, True)),
            _orow("k5", 4.0, 8.0, at=_at(0.95, True)), _orow("k2", 2.0, 5.0, at=_at(0.95, True)),
            _orow("k1", 1.0, 0.75, at=_at(0.95, True))]
    runner = SimpleNamespace(simulated=3, cached=1, t0=time.perf_counter() - 5.0)
    res = _rank(plan, {r["config"]: r for r in rows}, runner)
    assert res["frontier"] == ["k1", "k2", "k5"]
    assert [(r["config"], r["rank"], r["pareto"]) for r in res["rows"]] == [
        ("k1", 1, True), ("k2", 2, True), ("k3", 3, False), ("k4", 4, False), ("k5", 5, True)]
    assert res["winner"] == "k1"
    assert {k: res[k] for k in ("plan", "pdsim_version", "objective", "target_rate", "tolerance", "seeds",
                                "warmup_fraction", "confirm_factor", "excluded", "simulations", "cached")} == {
        "plan": "hand", "pdsim_version": __version__, "objective": "cheapest", "target_rate": 0.5,
        "tolerance": 0.05, "seeds": 2, "warmup_fraction": 0.2, "confirm_factor": 10.0, "excluded": [],
        "simulations": 3, "cached": 1}
    assert (res["slo"]["ttft_s"], res["slo"]["tpot_s"], res["slo"]["attainment_target"]) == (0.5, 0.05, 0.9)
    assert 5.0 <= res["wall_s"] < 65.0            # the runner started 5 s before
    # nothing meets: no winner (the first row is the best of the misses)
    rows = [_orow("n1", 1.0, None, "misses SLO at target", at=_at(0.5, False)),
            _orow("n2", 2.0, 0.0, "infeasible")]
    res = _rank(plan, {r["config"]: r for r in rows}, runner)
    assert res["winner"] is None and res["rows"][0]["config"] == "n1" and res["frontier"] == []


def test_cache_key_is_the_content_of_what_decides_a_result(tmp_path):
    import pdsim.plan as plan_mod
    (tmp_path / "p.txt").write_text("100\n")
    (tmp_path / "o.txt").write_text("10\n")
    sc = {"seed": 7, "workload": {"rate": 2.0, "prompt_tokens": {"path": "p.txt"}, "output_tokens": {"path": "o.txt"}},
          "topologies": {"x": {"kind": "colocated", "device": "h100-sxm"}}}

    def key(scenario=sc, early="both", warmup=0.2):
        plan_mod._FILE_HASHES.clear()          # as run_plan does: files are hashed afresh
        return task_key({"scenario": scenario, "base_dir": str(tmp_path), "warmup_fraction": warmup, "early": early})
    k = key()
    # the same scenario written in another key order is the same task
    flipped = {"topologies": sc["topologies"], "workload": dict(reversed(list(sc["workload"].items()))), "seed": 7}
    assert key(flipped) == k
    # how it is judged is part of the task
    assert key(early="fail") != k and key(warmup=0.3) != k
    # so is what each file it reads holds: either length file edited, the key changes; restored, it is back
    for name, old in (("p.txt", "100\n"), ("o.txt", "10\n")):
        (tmp_path / name).write_text(old + "5\n")
        assert key() != k
        (tmp_path / name).write_text(old)
        assert key() == k


def test_referenced_files_are_the_trace_the_length_files_and_the_device_profiles():
    from pdsim.plan import _referenced_files
    base = Path("/plans")
    # a trace workload, one colocated pool on a profile file: the trace, then the profile
    sc = {"workload": {"arrival": "trace", "trace": {"path": "t.csv"}},
          "topologies": {"c": {"kind": "colocated", "device": "a.yaml"}}}
    assert _referenced_files(sc, base) == [base / "t.csv", base / "a.yaml"]
    # length files (prompt, output), a PD pair on .yml / .json profiles, a preset name (no file) and a
    # profile path without a suffix (a '/' makes it a path, devices.get_device's rule)
    sc = {"workload": {"prompt_tokens": {"dist": "file", "path": "p.txt"}, "output_tokens": {"path": "o.txt"}},
          "topologies": {"pd": {"kind": "disaggregated", "prefill": {"device": "b.yml"},
                                "decode": {"device": "c.json"}},
                         "x": {"kind": "colocated", "device": "h100-sxm"},
                         "y": {"kind": "colocated", "device": "profiles/nosuffix"}}}
    assert _referenced_files(sc, base) == [base / "p.txt", base / "o.txt", base / "b.yml", base / "c.json",
                                           base / "profiles/nosuffix"]
    # numbers and presets only: nothing
    sc = {"workload": {"prompt_tokens": 100, "output_tokens": 10}, "topologies": {"x": {"device": "h100-sxm"}}}
    assert _referenced_files(sc, base) == []


def test_winner_scenario_by_hand():
    from pdsim.plan import winner_scenario
    plan = parse_plan(_raw())
    x1, x2 = plan.configs
    rows = [{"config": x2.name, "topology": x2.topology, "gpus": 2, "usd_per_hour": 2.0, "goodput": 6.25},
            {"config": x1.name, "topology": x1.topology, "gpus": 1, "usd_per_hour": 1.0, "goodput": 3.0}]
    # no target: the winner's scenario at its goodput, 6.25 req/s, the plan's seed and workload (100 requests,
    # min_duration_s 0), only the winner's topology
    sc = winner_scenario(plan, {"winner": x2.name, "rows": rows})
    assert sc["description"] == (f"Winner of plan 'hand' (goodput_per_usd): 2 GPUs, $2.00/h, goodput 6.25 req/s; "
                                 "written by pdsim plan")
    assert (sc["seed"], sc["workload"]["rate"], sc["workload"]["num_requests"]) == (7, 6.25, 100)
    assert sc["topologies"] == {x2.name: x2.topology} and sc["slo"]["ttft_s"] == 0.5
    # a target: the scenario runs at the target rate, not at the goodput
    plan = parse_plan(_raw(target={"rate": 4.0}))
    sc = winner_scenario(plan, {"winner": x1.name, "rows": rows})
    assert sc["workload"]["rate"] == 4.0 and sc["description"].startswith(
        "Winner of plan 'hand' (cheapest): 1 GPUs, $1.00/h, goodput 3 req/s")
    assert winner_scenario(plan, {"winner": None, "rows": rows}) is None


def test_winner_scenario_of_a_trace_on_a_profile_reads_the_plans_files_from_anywhere(tmp_path):
    from pdsim.devices import DATA_DIR
    from pdsim.plan import winner_scenario
    (tmp_path / "traces").mkdir()
    (tmp_path / "traces" / "t.csv").write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n" + "".join(
        f"2023-11-16 18:15:4{i}.0000000,100,10\n" for i in range(5)))       # 5 requests 1 s apart: 1 req/s
    (tmp_path / "profiles").mkdir()
    (tmp_path / "profiles" / "gpu.yaml").write_text((DATA_DIR / "h100-sxm.yaml").read_text())
    search = {"devices": ["profiles/gpu.yaml"], "disaggregated": {}, "pool": {"kv_blocks": 2000, "cost_model": LINEAR}}
    raw = _raw(search, workload={"arrival": "trace", "trace": {"path": "traces/t.csv"}, "num_requests": 4})
    plan = parse_plan(raw, str(tmp_path / "p.yaml"), tmp_path)
    (cfg,) = plan.configs
    row = {"config": cfg.name, "topology": cfg.topology, "gpus": 2, "usd_per_hour": 0.0, "goodput": 2.0}
    sc = winner_scenario(plan, {"winner": cfg.name, "rows": [row]})
    # the trace at the goodput, 2 req/s = 2x its own rate; its path and both pools' profile absolute, nothing
    # else added to them
    base = tmp_path.resolve()
    assert sc["workload"]["trace"] == {"path": str(base / "traces" / "t.csv"), "rate_scale": 2.0}
    (t,) = sc["topologies"].values()
    profile = str(base / "profiles" / "gpu.yaml")
    assert t["prefill"] == {**cfg.topology["prefill"], "device": profile}
    assert t["decode"] == {**cfg.topology["decode"], "device": profile}
    assert {k: v for k, v in t.items() if k not in ("prefill", "decode")} == {
        k: v for k, v in cfg.topology.items() if k not in ("prefill", "decode")}


def test_file_hash_memo_tells_two_files_of_one_size_and_time_apart():
    # two files with the same size and timestamps (coarse clocks, copies): the memo keys by path too, so each
    # gets the sha256 of its own bytes; a file that cannot be read hashes as "missing"
    import hashlib

    import pdsim.plan as plan_mod

    class Fake:
        def __init__(self, name, data):
            self.name, self.data = name, data

        def stat(self):
            return SimpleNamespace(st_size=len(self.data), st_mtime_ns=0, st_ctime_ns=0)

        def read_bytes(self):
            return self.data

        def __str__(self):
            return self.name
    plan_mod._FILE_HASHES.clear()
    assert plan_mod._file_hash(Fake("/a", b"1")) == hashlib.sha256(b"1").hexdigest()
    assert plan_mod._file_hash(Fake("/b", b"2")) == hashlib.sha256(b"2").hexdigest()
    plan_mod._FILE_HASHES.clear()


def test_judge_without_a_client_adds_no_network_time():
    # no client given: no RTT, a TTFT of 0.45 s meets 0.5 s (with any RTT of 0.05 s or more it would not)
    slo = SimpleNamespace(ttft_s=0.5, tpot_s=0.05, attainment_target=0.8)
    s = _JudgeSink(simpy.Environment(), 10, 0, slo, "both")
    s.finished(_req(0, 0.45, 0.01))
    assert (s.rtt, s.ok, s.ttft_miss) == (0.0, 1, 0)


def _pd_sink(expected=10, target=0.8, rtt=0.0):
    slo = SimpleNamespace(ttft_s=0.5, tpot_s=0.05, attainment_target=target)
    return _JudgeSink(simpy.Environment(), expected, 0, slo, "fail", True,
                      SimpleNamespace(ttft_at="first_decode_token", network_rtt_s=rtt))


def _look(s, stream, until):
    """Run the sweep alone (every 0.25 s, the run kept alive) up to ``until``."""
    s.env.timeout(100.0)
    s.env.process(s.sweep(None, stream, 0.25))
    s.env.run(until=until)
    return s


def test_sweep_judges_one_and_two_token_replies_by_the_tokens_the_client_sees():
    # a one-token reply, first token at 0.1 s, not yet settled at the look at 0.75: TTFT met, no TPOT (no gap
    # between tokens): nothing to count, nothing to watch
    s = _look(_sink(early="fail"), [_open(0, 0.0, first=0.1, out=1)], 1.0)
    assert (s.miss, s.premissed, s.decoding, s.swept) == (0, {}, [], 1)
    # behind a PD proxy too: a one-token reply's first token is the prefill's (there is no decode token)
    s = _look(_pd_sink(), [_open(0, 0.0, first=0.1, out=1)], 1.0)
    assert (s.miss, s.premissed, s.decoding) == (0, {}, [])
    # a two-token reply, first token at 0.1 s: one gap, at most 0.05 s: TPOT deadline 0.15; at 0.75 it has
    # not finished: (0.75 - 0.1) / 1 > 0.05, a certain TPOT miss
    s = _look(_sink(early="fail"), [_open(0, 0.0, first=0.1, out=2)], 1.0)
    assert (s.miss, s.premissed) == (1, {0: "tpot"})
    # behind a PD proxy a two-token reply's first client token is the decode instance's, at 0.7 s: TTFT 0.7 >
    # 0.5, a TTFT miss (one token left to stream: no TPOT), whatever the prefill's token at 0.1 s says
    s = _look(_pd_sink(), [_open(0, 0.0, first=0.1, out=2, decode_first=0.7)], 1.0)
    assert (s.miss, s.premissed, s.decoding) == (1, {0: "ttft"}, [])


def test_sweep_adds_the_rtt_to_a_late_first_token_too():
    # RTT 0.1 s: a first token 0.45 s after arrival reaches the client at 0.55 s > 0.5: a TTFT miss, counted
    # at the look at 0.5 (0.5 + 0.1 > 0.5: the deadline has passed); one miss fails (target 1.0)
    s = _swept(_sink(expected=2, target=1.0, early="fail", rtt=0.1), [_open(0, 0.0, first=0.45), _open(1, 10.0)])
    assert s.env.now == 0.5 and s.premissed == {0: "ttft"} and s.decided == "fail"


def test_sweep_skips_a_settled_request_in_the_tpot_heap_and_looks_at_the_next():
    # two requests at 0, first tokens at 0.1 (in time), 31 tokens: TPOT deadlines 0.1 + 30 x 0.05 = 1.6; both
    # enter the heap at 0.75; request 0 finishes at 1.0 (settled), request 1 still decodes at the look at 1.75:
    # (1.75 - 0.1) / 30 = 0.055 > 0.05, a miss counted there, behind the settled one
    stream = [_open(0, 0.0, first=0.1, out=31), _open(1, 0.0, first=0.1, out=31)]
    s = _sink(early="fail")

    def settle():
        yield s.env.timeout(1.0)
        stream[0].status = FINISHED
    s.env.process(settle())
    _look(s, stream, 1.8)
    assert s.premissed == {1: "tpot"} and s.miss == 1 and s.decoding == []


def test_sweep_waits_when_a_tpot_deadline_rounds_below_now_but_the_bound_still_holds():
    # first token at F = 0.05929768490588714 (in time), 76 tokens: 75 gaps, TPOT deadline F + 75 x 0.05 rounds to
    # d = 3.809297684905887; the look comes at the next float, now = 3.8092976849058875 > d, yet (now - F) / 75 is
    # exactly 0.05 in floats: finishing now would meet the bound (the judge's <=), so it is no certain miss yet: the
    # request goes back to the heap.  At the next look (2 x now) (2now - F) / 75 = 0.1 > 0.05: a certain miss.
    F, now = 0.05929768490588714, 3.8092976849058875
    d = F + 0.05 * 75
    assert d < now and (now - F) / 75 == 0.05 and math.nextafter(d, math.inf) == now
    s = _sink(expected=1, target=1.0, early="fail")
    stream = [_open(0, 0.0, first=F, out=76)]
    s.env.timeout(100.0)
    s.env.process(s.sweep(None, stream, now))
    s.env.run(until=1.5 * now)
    assert (s.miss, s.premissed, s.decoding) == (0, {}, [(d, 0, F, 76)])
    s.env.run(until=2.5 * now)
    assert (s.miss, s.premissed, s.decided) == (1, {0: "tpot"}, "fail")


def test_scenario_dict_sizes_the_window_by_hand():
    from pdsim.plan import _scenario_dict
    lengths = {"arrival": "poisson", "prompt_tokens": 100, "output_tokens": 10}
    # neither num_requests nor duration_s: 1000 requests at the rate asked; a long run (2.5x) 2500
    plan = parse_plan(_raw(workload=dict(lengths)))
    w = _scenario_dict(plan, {}, 2.0, 7)["workload"]
    assert (w["num_requests"], w["rate"], "duration_s" in w) == (1000, 2.0, False)
    assert _scenario_dict(plan, {}, 2.0, 7, scale=2.5)["workload"]["num_requests"] == 2500
    # at least min_duration_s of arrivals: 20 requests asked, 2.01 req/s x 10 s = 20.1 -> 21
    plan = parse_plan(_raw(workload={**lengths, "num_requests": 20}, goodput={"min_duration_s": 10}))
    assert _scenario_dict(plan, {}, 2.01, 7)["workload"]["num_requests"] == 21
    assert _scenario_dict(plan, {}, 1.0, 7)["workload"]["num_requests"] == 20
    # a duration instead: a long run 2x as long (30 -> 60 s), no request count added
    plan = parse_plan(_raw(workload={**lengths, "duration_s": 30}))
    w = _scenario_dict(plan, {}, 2.0, 7, scale=2.0)["workload"]
    assert (w["duration_s"], "num_requests" in w) == (60.0, False)


def test_scenario_dict_moves_a_traces_window_for_each_further_seed(tmp_path):
    from pdsim.plan import _scenario_dict
    # 9 requests 1 s apart: 1 req/s over an 8 s span.  3 requests need a 3 s window: room 8 - 3 = 5 s, so seed
    # 7 + k starts at (3k) mod 5: k = 1 -> 3, 2 -> 1, 4 -> 2; the plan's own seed (k = 0) keeps the start
    (tmp_path / "t.csv").write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n" + "".join(
        f"2023-11-16 18:15:4{i}.0000000,100,10\n" for i in range(9)))
    plan = parse_plan(_raw(workload={"arrival": "trace", "trace": {"path": "t.csv"}, "num_requests": 3}),
                      str(tmp_path / "p.yaml"), tmp_path)
    starts = {}
    for seed in (7, 8, 9, 11):
        tr = _scenario_dict(plan, {}, 3.0, seed)["workload"]["trace"]
        assert tr["rate_scale"] == 3.0 and tr["path"] == str(tmp_path.resolve() / "t.csv")
        starts[seed] = tr.get("start_s")
    assert starts == {7: None, 8: 3.0, 9: 1.0, 11: 2.0}
    # 9 requests need 9 s > the 8 s span: no room to move, every seed replays from the start
    plan = parse_plan(_raw(workload={"arrival": "trace", "trace": {"path": "t.csv"}, "num_requests": 9}),
                      str(tmp_path / "p.yaml"), tmp_path)
    assert "start_s" not in _scenario_dict(plan, {}, 3.0, 8)["workload"]["trace"]


def _trace_plan(folder, seconds, num_requests=None):
    folder.mkdir(exist_ok=True)
    (folder / "t.csv").write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n" + "".join(
        f"2023-11-16 18:15:{s:02d}.0000000,100,10\n" for s in seconds))
    w = {"arrival": "trace", "trace": {"path": "t.csv"}}
    if num_requests:
        w["num_requests"] = num_requests
    return parse_plan(_raw(workload=w), str(folder / "p.yaml"), folder)


def test_plan_base_rate_is_the_whole_windows_rate_per_plan_folder(tmp_path):
    from pdsim.plan import plan_base_rate
    # 9 requests at 40, 41, 42, 43, 45, 47, 49, 51, 53 s: 8 gaps over 13 s = 8/13 req/s, though the plan
    # asks for 3 requests (whose own rate would be 2 / 2 s = 1)
    plan = _trace_plan(tmp_path / "a", [40, 41, 42, 43, 45, 47, 49, 51, 53], num_requests=3)
    assert plan_base_rate(plan) == 8 / 13 and plan_base_rate(plan, with_span=True) == (8 / 13, 13.0)
    # the same file name and workload in another folder: another trace (5 requests 2 s apart: 4 / 8 = 0.5)
    other = _trace_plan(tmp_path / "b", [40, 42, 44, 46, 48], num_requests=3)
    assert plan_base_rate(other) == 0.5 and plan_base_rate(plan) == 8 / 13
    # one request has no span to scale
    with pytest.raises(ConfigError) as e:
        _trace_plan(tmp_path / "c", [40])
    assert str(e.value) == f"{tmp_path / 'c' / 'p.yaml'}: workload.trace: the trace window has no time span to scale"


def test_trace_window_moves_by_hand_at_another_base_rate_and_at_the_edges(tmp_path):
    from pdsim.plan import _scenario_dict, plan_base_rate
    # 9 requests 2 s apart (40 ... 56 s): 0.5 req/s over 16 s.  3 requests need 3 / 0.5 = 6 s: room 10 s; at
    # 3 req/s the trace is scaled 3 / 0.5 = 6x; seed 7 + k starts at 6k mod 10: k = 1 -> 6, 2 -> 2, 4 -> 4
    even = list(range(40, 57, 2))
    plan = _trace_plan(tmp_path / "a", even, num_requests=3)
    trs = {seed: _scenario_dict(plan, {}, 3.0, seed)["workload"]["trace"] for seed in (8, 9, 11)}
    assert {s: (t["rate_scale"], t["start_s"]) for s, t in trs.items()} == {8: (6.0, 6.0), 9: (6.0, 2.0),
                                                                            11: (6.0, 4.0)}
    # 8 requests need exactly the 16 s span: no room (0 s), every seed starts at the start
    plan = _trace_plan(tmp_path / "b", even, num_requests=8)
    assert "start_s" not in _scenario_dict(plan, {}, 3.0, 8)["workload"]["trace"]
    # 1 req/s over 8 s (9 requests 1 s apart), 7 requests: 1 s of room, 7k mod 1 = 0: the window starts at 0
    plan = _trace_plan(tmp_path / "c", list(range(40, 49)), num_requests=7)
    assert _scenario_dict(plan, {}, 3.0, 8)["workload"]["trace"]["start_s"] == 0.0
    # two requests 1 s apart: one gap over 1 s, 1 req/s (a span of 1 s is a span)
    assert plan_base_rate(_trace_plan(tmp_path / "d", [40, 41]), with_span=True) == (1.0, 1.0)
    # another trace file in the same folder is another base rate (4 requests, 3 gaps over 6 s: 0.5)
    (tmp_path / "d" / "u.csv").write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n" + "".join(
        f"2023-11-16 18:15:{s:02d}.0000000,100,10\n" for s in (40, 42, 44, 46)))
    u = parse_plan(_raw(workload={"arrival": "trace", "trace": {"path": "u.csv"}}), str(tmp_path / "d" / "p.yaml"),
                   tmp_path / "d")
    assert plan_base_rate(u) == 0.5


def test_trace_window_moves_from_the_traces_own_start(tmp_path):
    from pdsim.plan import _scenario_dict, plan_base_rate
    # 9 requests 1 s apart (40 ... 48 s) read from start_s = 1 s: 8 requests at 1 ... 8 s, 7 gaps over 7 s,
    # 1 req/s.  3 requests need 3 s: room 7 - 3 = 4 s; seed 7 + k starts at 1 + (3k mod 4): k = 1 -> 4,
    # 2 -> 1 + 2 = 3, 4 -> 1 + 0 = 1; the plan's own seed keeps the trace's own start (1 s, untouched)
    (tmp_path / "t.csv").write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n" + "".join(
        f"2023-11-16 18:15:4{i}.0000000,100,10\n" for i in range(9)))
    plan = parse_plan(_raw(workload={"arrival": "trace", "trace": {"path": "t.csv", "start_s": 1.0},
                                     "num_requests": 3}), str(tmp_path / "p.yaml"), tmp_path)
    assert plan_base_rate(plan, with_span=True) == (1.0, 7.0)
    starts = {seed: _scenario_dict(plan, {}, 3.0, seed)["workload"]["trace"]["start_s"] for seed in (7, 8, 9, 11)}
    assert starts == {7: 1.0, 8: 4.0, 9: 3.0, 11: 1.0}


# --- pricing and the analytic bound (_price_and_bound) and the plan file's own checks (parse_plan), branch mutplan4 --
# The bound is worked out by hand from a linear cost model (step = base + per_token x tokens + per_kv x KV read) on a
# request stream written in the test: shared_stream (what every config's bound reads) is replaced by it, so the means
# and the largest prompt are known exactly.
LIN = {"kind": "linear", "base_s": 0.01, "per_token_s": 1e-3}


def _stream(monkeypatch, prompts, outputs):
    import pdsim.simulation
    reqs = [SimpleNamespace(prompt_tokens=p, output_tokens=o) for p, o in zip(prompts, outputs)]
    monkeypatch.setattr(pdsim.simulation, "shared_stream", lambda sc, model: list(reqs))


def _stream_with_ids(monkeypatch, prompts, outputs, ids, unit=16):
    import pdsim.simulation
    reqs = [SimpleNamespace(prompt_tokens=p, output_tokens=o, hash_ids=h, hash_block_tokens=unit)
            for p, o, h in zip(prompts, outputs, ids)]
    monkeypatch.setattr(pdsim.simulation, "shared_stream", lambda sc, model: list(reqs))


def _bounds(search, slo=None, **over) -> dict:
    raw = _raw(search, slo=slo or {"ttft_s": 5.0, "tpot_s": 1.0, "attainment_target": 0.9}, **over)
    return {c.name: c for c in parse_plan(raw).configs}


@pytest.mark.parametrize("pool_extra,cached", [({"prefix_cache": {"enabled": True}}, 159),
                                               ({"engine": "vllm-v0", "prefix_cache": {"enabled": True}}, 159),
                                               ({"engine": "vllm-v1"}, 159),       # the engine's default caching
                                               ({}, 0), ({"prefix_cache": {"enabled": False}}, 0)])
def test_the_bound_of_a_caching_pool_takes_every_prompt_at_its_ideal_hit(monkeypatch, pool_extra, cached):
    # two 160-token prompts with the same ten 16-token ids, 2 tokens out.  A caching pool: the second finds all
    # ten ids seen, 160 tokens, less its last token: 159 cached (an infinite cache; the engine's whole-block rule
    # would leave 144: the bound stays optimistic).  Mean prompt computed (160 + 1) / 2 = 80.5, else 160.
    # fcfs, max_running 4: prefill steps up to 4 x 160 = 640 tokens, (0.01 + 0.64) / 640 s a token (160 alone:
    # .17 / 160, more); decode: 161 tokens in 11 blocks, 1000 // 11 = 90 fit, max_running 4: (0.01 + 0.004) / 4 s
    # a token; 1 decode token a request.  One replica: bound = 1 / (p_mean x .65 / 640 + .0035).
    _stream_with_ids(monkeypatch, [160, 160], [2, 2], [list(range(10))] * 2)
    search = {"devices": [{"name": "h100-sxm", "price_per_hour_usd": 1.0}], "colocated": {"replicas": [1]},
              "pool": {"max_running": 4, "kv_blocks": 1000, "cost_model": LIN, "scheduler": "fcfs", **pool_extra}}
    (cfg,) = _bounds(search).values()
    p_mean = (160 + (160 - cached)) / 2
    assert cfg.bound_rate == pytest.approx(1 / (p_mean * 0.65 / 640 + 0.014 / 4), rel=1e-12)


def test_colocated_bound_and_price_by_hand(monkeypatch):
    # prompts 100 and 316 (mean 208, largest 316), outputs 1 and 11 (decode tokens 0 and 10: mean 5).
    # tp 2 x 2 replicas at $1.5 per GPU-hour: 4 GPUs, $6/h.
    # fcfs, max_running 4, max_batched_tokens 8192: the largest prefill step is 4 prompts of 316 = 1264 tokens,
    #   (0.01 + 1.264) / 1264 s per prompt token; a decode batch: 208 + 1 tokens need 14 blocks of 16, 39 // 14 = 2
    #   requests fit (not 3: 13 blocks would give 3), so (0.01 + 2 x 0.001) / 2 = 6 ms per output token;
    #   per request 208 x 1.274 / 1264 + 5 x 0.006 s, 2 replicas: 2 / that = 8.35 req/s.
    # chunked, budget 256: one whole 316-token prompt is the largest step (above the budget): 0.326 / 316 s per
    #   token (256 tokens: 0.266 / 256, more), cheaper than a decode token: (208 + 5) x 0.326 / 316 s a request.
    _stream(monkeypatch, [100, 316], [1, 11])
    search = {"devices": [{"name": "h100-sxm", "price_per_hour_usd": 1.5}],
              "colocated": {"tp": [2], "replicas": [2], "chunked_prefill": [None, 256]},
              "pool": {"max_running": 4, "kv_blocks": 39, "cost_model": LIN}}
    cfg = _bounds(search)
    fcfs, chunk = cfg["colo-h100-sxm-tp2x2"], cfg["colo-h100-sxm-tp2x2-chunk256"]
    assert (fcfs.gpus, fcfs.usd_per_hour, chunk.gpus, chunk.usd_per_hour) == (4, 6.0, 4, 6.0)
    assert fcfs.bound_rate == pytest.approx(2 / (208 * 1.274 / 1264 + 5 * 0.012 / 2), rel=1e-12)
    assert chunk.bound_rate == pytest.approx(2 / (213 * 0.326 / 316), rel=1e-12)
    assert fcfs.infeasible == chunk.infeasible == ""
    # the pool's error band (metrics.expected_error) travels with the config: a linear model is unvalidated
    assert fcfs.expected_error == {"replica": "unvalidated: a linear cost model (a what-if, not the roofline)"}
    # the in-flight scheduler mixes prefills and decodes too: the chunked rule, at the fcfs step sizes
    # (1264 tokens): 213 x 1.274 / 1264 s a request.  max_running 1: prefill steps of one 316-token prompt,
    # (0.01 + 0.316) / 316 s a token, a decode batch of 1 (0.011 s a token): 208 x 0.326 / 316 + 5 x 0.011 s.
    search["colocated"] = {"tp": [2], "replicas": [2]}
    search["pool"] = {"max_running": 4, "kv_blocks": 39, "cost_model": LIN, "scheduler": "inflight"}
    assert _bounds(search)["colo-h100-sxm-tp2x2"].bound_rate == pytest.approx(2 / (213 * 1.274 / 1264), rel=1e-12)
    search["pool"] = {"max_running": 1, "kv_blocks": 39, "cost_model": LIN}
    assert _bounds(search)["colo-h100-sxm-tp2x2"].bound_rate == pytest.approx(2 / (208 * 0.326 / 316 + 5 * 0.011),
                                                                              rel=1e-12)
    # max_batched_tokens 1000: the largest step is 1000 tokens (4 x 316 = 1264 above it), (0.01 + 1.0) / 1000 s a
    # token; kv_blocks 1000: the batch is max_running (4: 1000 // 14 = 71 fit), (0.01 + 0.004) / 4 s a token
    search["pool"] = {"max_running": 4, "max_batched_tokens": 1000, "kv_blocks": 1000, "cost_model": LIN}
    assert _bounds(search)["colo-h100-sxm-tp2x2"].bound_rate == pytest.approx(
        2 / (208 * 1.01 / 1000 + 5 * 0.014 / 4), rel=1e-12)
    # the decode batch's blocks are for the mean prompt and the first output token: prompts 100 and 314 (mean 207):
    # 208 tokens fill exactly 13 blocks, 39 // 13 = 3 fit (209 tokens would need 14: 2); the largest prefill step
    # 4 x 314 = 1256 tokens.  8-token prompts: 9 tokens in 1 block, 3 blocks hold 3 (the guard max(1, blocks)
    # binds nothing); the largest prefill step 4 x 8 = 32 tokens; 10 decode tokens each
    search["pool"] = {"max_running": 4, "kv_blocks": 39, "cost_model": LIN}
    _stream(monkeypatch, [100, 314], [1, 11])
    assert _bounds(search)["colo-h100-sxm-tp2x2"].bound_rate == pytest.approx(
        2 / (207 * 1.266 / 1256 + 5 * 0.013 / 3), rel=1e-12)
    search["pool"]["kv_blocks"] = 3
    _stream(monkeypatch, [8, 8], [11, 11])
    assert _bounds(search)["colo-h100-sxm-tp2x2"].bound_rate == pytest.approx(
        2 / (8 * 0.042 / 32 + 10 * 0.013 / 3), rel=1e-12)
    _stream(monkeypatch, [100, 316], [1, 11])
    search["pool"] = {"max_running": 4, "max_batched_tokens": 1000, "kv_blocks": 1000, "cost_model": LIN}
    # max_batched_tokens 200, below the 316-token prompt: the largest step is that one prompt, 0.326 / 316 s a token
    search["pool"]["max_batched_tokens"] = 200
    assert _bounds(search)["colo-h100-sxm-tp2x2"].bound_rate == pytest.approx(
        2 / (208 * 0.326 / 316 + 5 * 0.014 / 4), rel=1e-12)


def test_disaggregated_bound_is_the_slower_side_and_prices_both_pools(monkeypatch):
    # prompts 100 and 316 (mean 208), outputs 1 and 67 (decode tokens 0 and 66: mean 33).  Prefill on h100 at
    # $1/GPU-h, tp 1, 1 or 2 instances; decode one tp-2 a100 at $3/GPU-h: 3 GPUs $1 + $6 = $7/h, 4 GPUs $8/h.
    # prefill: 208 x 1.274 / 1264 = 0.20965 s a request per instance (as the colocated fcfs case);
    # decode: 33 x 6 ms = 0.198 s a request (batch of 2, as there).
    # 1 prefill instance: min(1 / 0.20965, 1 / 0.198) = 4.77 (prefill); 2: min(9.54, 5.05) = 5.05 (decode)
    _stream(monkeypatch, [100, 316], [1, 67])
    search = {"devices": [{"name": "h100-sxm", "price_per_hour_usd": 1.0}],
              "disaggregated": {"prefill_instances": [1, 2], "decode_tp": [2], "kv_link": ["nvlink"],
                                "decode_devices": [{"name": "a100-80gb-sxm", "price_per_hour_usd": 3.0}]},
              "pool": {"max_running": 4, "kv_blocks": 39, "cost_model": LIN}}
    cfg = _bounds(search)
    one, two = cfg["pd-h100-sxm-1p1-1d2-a100-80gb-sxm-nvlink"], cfg["pd-h100-sxm-2p1-1d2-a100-80gb-sxm-nvlink"]
    assert (one.gpus, one.usd_per_hour, two.gpus, two.usd_per_hour) == (3, 7.0, 4, 8.0)
    band = "unvalidated: a linear cost model (a what-if, not the roofline)"
    assert one.expected_error == {"prefill": band, "decode": band}
    pre = 208 * 1.274 / 1264
    assert one.bound_rate == pytest.approx(1 / pre, rel=1e-12)
    assert two.bound_rate == pytest.approx(1 / (33 * 0.006), rel=1e-12)
    # every reply one token long: no decode work, the decode side bounds nothing (2 / 0.20965 req/s)
    _stream(monkeypatch, [100, 316], [1, 1])
    assert _bounds(search)["pd-h100-sxm-2p1-1d2-a100-80gb-sxm-nvlink"].bound_rate == pytest.approx(2 / pre, rel=1e-12)
    # a step priced only per KV token read: the bound's steps read none (prefill of new tokens, decode at no
    # context), so no side costs anything and nothing bounds the rate, colocated or not
    search["colocated"] = {}
    search["pool"]["cost_model"] = {"kind": "linear", "per_kv_token_s": 1e-4}
    _stream(monkeypatch, [100, 316], [1, 67])
    assert {n: c.bound_rate for n, c in _bounds(search).items()} == {
        "colo-h100-sxm-tp1x1": math.inf, "pd-h100-sxm-1p1-1d2-a100-80gb-sxm-nvlink": math.inf,
        "pd-h100-sxm-2p1-1d2-a100-80gb-sxm-nvlink": math.inf}


def test_pipelined_prefill_is_priced_over_its_micro_batches_and_its_lone_prefill_takes_every_stage(monkeypatch):
    # prefill pp 2 (2 micro-batches, the default), decode pp 1, one instance each, $1/GPU-h: 3 GPUs, $3/h.
    # A linear stage prices one stage of one micro-batch: a prefill step of T tokens as 2 micro-batches of
    # T / 2 is bound by one stage's work on both, 2 x (0.01 + 0.001 T / 2) = 0.02 + 0.001 T (pipeline.py's
    # docstring): at T = 1264, 1.284 / 1264 s a token; prompts 100 and 316 (mean 208), outputs 11 (mean 10):
    # prefill side 1 / (208 x 1.284 / 1264), decode side 1 / (10 x 6 ms) (batch 39 // 14 = 2).
    # A lone prefill runs through both stages: 2 x (0.01 + 0.001 p + 1e-4 p) = 0.24 s (p = 100), 0.715 s
    # (p = 316: 2 x 0.3576 = 0.7152); the decode pool's lone step (pp 1) 0.01 + 0.001 + 1e-4 (p + 1) = 0.0211 s
    # and 0.0427 s.  TTFT 0.5 s: the long prompt (half the requests) misses; TPOT 0.05 s: all meet
    # (priced on the prefill pool, 0.0422 and 0.0854 s, half would miss)
    _stream(monkeypatch, [100, 316], [11, 11])
    search = {"devices": [{"name": "h100-sxm", "price_per_hour_usd": 1.0}],
              "disaggregated": {"prefill_pp": [2], "kv_link": ["nvlink"]},
              "pool": {"max_running": 4, "kv_blocks": 39, "cost_model": dict(LIN, per_kv_token_s=1e-4)}}
    (cfg,) = _bounds(search, slo={"ttft_s": 0.5, "tpot_s": 0.05, "attainment_target": 0.9}).values()
    assert (cfg.name, cfg.gpus, cfg.usd_per_hour) == ("pd-h100-sxm-1p1pp2-1d1-nvlink", 3, 3.0)
    assert cfg.bound_rate == pytest.approx(min(1 / (208 * 1.284 / 1264), 1 / (10 * 0.006)), rel=1e-12)
    assert cfg.infeasible == "TTFT: a lone prefill exceeds 0.5 s for 50%"


# lone steps of the linear model with per_kv 1e-4: prefill 0.01 + 0.0011 p (p = 100: 0.12, 180: 0.208, 300: 0.34 s);
# decode 0.011 + 1e-4 (p + 1) (0.0211, 0.0291, 0.0411 s)
_TEN = [100] * 8 + [180, 300]


@pytest.mark.parametrize("ttft, tpot, outputs, want, target", [
    # 2 of 10 lone prefills over 0.2 s: 80% < 90%; 1 of 10 decode steps over 0.03 s: 90% is enough (no TPOT note)
    (0.2, 0.03, [11] * 10, "TTFT: a lone prefill exceeds 0.2 s for 20%", 0.9),
    (0.5, 0.025, [11] * 10, "TPOT: a lone decode step exceeds 0.025 s for 20%", 0.9),
    (0.2, 0.025, [11] * 10, "TTFT: a lone prefill exceeds 0.2 s for 20%; TPOT: a lone decode step exceeds 0.025 s "
                            "for 20%", 0.9),
    # the two slow decoders reply with one token: no decode step to miss, all 10 can meet the SLO alone
    (0.5, 0.025, [11] * 8 + [1, 1], "", 0.9),
    # one of them replies with 2 tokens: 9 of 10 can (90%, exactly the target: feasible)
    (0.5, 0.025, [11] * 8 + [1, 2], "", 0.9),
    # ... but not at a 95% target; the note counts the slow decoders among the 9 requests with a TPOT: 1 of 9
    (0.5, 0.025, [11] * 8 + [1, 2], "TPOT: a lone decode step exceeds 0.025 s for 11% of requests with a TPOT", 0.95),
    # 9 of 10 lone prefills meet 0.3 s (exactly the target: no TTFT note); 2 of 10 decode steps miss 0.025 s
    (0.3, 0.025, [11] * 10, "TPOT: a lone decode step exceeds 0.025 s for 20%", 0.9),
])
def test_lone_request_slo_bounds_by_hand(monkeypatch, ttft, tpot, outputs, want, target):
    _stream(monkeypatch, _TEN, outputs)
    search = {"devices": ["h100-sxm"], "colocated": {},
              "pool": {"kv_blocks": 2000, "cost_model": dict(LIN, per_kv_token_s=1e-4)}}
    (cfg,) = _bounds(search, slo={"ttft_s": ttft, "tpot_s": tpot, "attainment_target": target}).values()
    assert cfg.infeasible == want


@pytest.mark.parametrize("cost, prompts, ttft, tpot, want", [
    # 1/1024 s per token, nothing else: a lone prefill of 256 tokens takes exactly 0.25 s (meets 0.25 s), of 512
    # tokens 0.5 s; the share that exceeds counts only the 512-token ones
    ({"kind": "linear", "per_token_s": 1 / 1024}, [256] * 5 + [512] * 5, 0.25, 1.0,
     "TTFT: a lone prefill exceeds 0.25 s for 50%"),
    # 1/1024 s per KV token read only: a lone decode step at context p reads p + 1 tokens: (255 + 1) / 1024 = 0.25 s
    # exactly, (511 + 1) / 1024 = 0.5 s (their prefills, 255 / 1024 and 511 / 1024 s, meet 1 s)
    ({"kind": "linear", "per_kv_token_s": 1 / 1024}, [255] * 5 + [511] * 5, 1.0, 0.25,
     "TPOT: a lone decode step exceeds 0.25 s for 50%"),
    # a constant 0.25 s step: every TTFT exactly at its 0.25 s bound (no TTFT note), every decode step over 0.2 s
    ({"kind": "constant", "step_s": 0.25}, [100] * 10, 0.25, 0.2, "TPOT: a lone decode step exceeds 0.2 s for 100%"),
    ({"kind": "constant", "step_s": 0.25}, [100] * 10, 0.2, 0.25, "TTFT: a lone prefill exceeds 0.2 s for 100%"),
])
def test_lone_request_slo_notes_at_their_edges(monkeypatch, cost, prompts, ttft, tpot, want):
    _stream(monkeypatch, prompts, [11] * 10)
    search = {"devices": ["h100-sxm"], "colocated": {}, "pool": {"kv_blocks": 2000, "cost_model": cost}}
    (cfg,) = _bounds(search, slo={"ttft_s": ttft, "tpot_s": tpot, "attainment_target": 0.9}).values()
    assert cfg.infeasible == want


def test_lone_request_slo_bounds_are_inclusive_and_read_the_first_400_requests(monkeypatch):
    # a constant 0.25 s step: every lone prefill and decode step takes exactly the 0.25 s bounds: feasible at 100%
    _stream(monkeypatch, [100, 300], [11, 11])
    search = {"devices": ["h100-sxm"], "colocated": {},
              "pool": {"kv_blocks": 2000, "cost_model": {"kind": "constant", "step_s": 0.25}}}
    slo = {"ttft_s": 0.25, "tpot_s": 0.25, "attainment_target": 1.0}
    assert _bounds(search, slo=slo)["colo-h100-sxm-tp1x1"].infeasible == ""
    # the lone-request check samples the first 400 requests: a 401st that could never meet 0.2 s (0.34 s) is not
    # read; at the 400th it is (1 of 400 over: 99.75% < 100%, shown rounded)
    search["pool"]["cost_model"] = dict(LIN, per_kv_token_s=1e-4)
    slo = {"ttft_s": 0.2, "tpot_s": 1.0, "attainment_target": 1.0}
    _stream(monkeypatch, [100] * 400 + [300], [11] * 401)
    assert _bounds(search, slo=slo)["colo-h100-sxm-tp1x1"].infeasible == ""
    _stream(monkeypatch, [100] * 399 + [300], [11] * 400)
    assert _bounds(search, slo=slo)["colo-h100-sxm-tp1x1"].infeasible == "TTFT: a lone prefill exceeds 0.2 s for 0%"


def test_speculative_decoding_divides_the_decode_time_by_the_tokens_a_step_can_emit(monkeypatch):
    # k = 3 drafts: a verify step emits up to 4 tokens.  As the fcfs case of test_colocated_bound_and_price_by_hand
    # (one replica) but a decode token costs 6 / 4 = 1.5 ms; the lone decode steps (0.0211 .. 0.0411 s, /4: at
    # most 0.0103 s) all meet 0.025 s, which 2 of 10 plain ones miss
    spec = {"method": "draft", "k": 3, "draft_cost_fraction": 0.1}
    search = {"devices": ["h100-sxm"], "colocated": {},
              "pool": {"max_running": 4, "kv_blocks": 39, "cost_model": LIN, "speculative": spec}}
    _stream(monkeypatch, [100, 316], [1, 11])
    assert _bounds(search)["colo-h100-sxm-tp1x1"].bound_rate == pytest.approx(
        1 / (208 * 1.274 / 1264 + 5 * 0.006 / 4), rel=1e-12)
    _stream(monkeypatch, _TEN, [11] * 10)
    search["pool"] = {"kv_blocks": 2000, "cost_model": dict(LIN, per_kv_token_s=1e-4), "speculative": spec}
    slo = {"ttft_s": 0.5, "tpot_s": 0.025, "attainment_target": 0.9}
    assert _bounds(search, slo=slo)["colo-h100-sxm-tp1x1"].infeasible == ""


def test_parse_plan_refuses_a_closed_loop_workload_naming_file_key_and_value():
    with pytest.raises(ConfigError) as e:
        parse_plan(_raw(workload={"arrival": "closed", "clients": 2, "num_requests": 5}), "p.yaml")
    assert str(e.value) == ("p.yaml: workload.arrival = 'closed': a plan searches over the arrival rate: use an "
                            "open-loop arrival (poisson, gamma, constant or trace)")
    # without a file name: the default, plan.yaml
    with pytest.raises(ConfigError, match=r"^plan\.yaml: workload\.arrival = 'closed': "):
        parse_plan(_raw(workload={"arrival": "closed", "clients": 2, "num_requests": 5}))
    # no arrival key: Poisson (open loop), accepted; the plan keeps its file and folder (default: plan.yaml, ".")
    plan = parse_plan(_raw(workload={"num_requests": 100, "prompt_tokens": 100, "output_tokens": 10}), "q.yaml",
                      "plans")
    assert (plan.file, plan.base_dir, plan.spec.name, len(plan.configs)) == ("q.yaml", Path("plans"), "hand", 2)
    plan = parse_plan(_raw())
    assert (plan.file, plan.base_dir) == ("plan.yaml", Path("."))


def test_parse_plan_errors_name_the_plan_file_and_suggest_the_plans_own_keys():
    # a typo of a plan key: the suggestion comes from the plan's keys (prefill_instances is no scenario key), the
    # key path keeps 'disaggregated' (a key of the plan; in a scenario it is a topology's tag)
    search = {"devices": ["h100-sxm"], "disaggregated": {"prefill_instance": [1]}}
    with pytest.raises(ConfigError) as e:
        parse_plan(_raw(search), "p.yaml")
    assert str(e.value) == ("p.yaml: search.disaggregated.prefill_instance: unknown key; did you mean "
                            "'prefill_instances'?")
    # the workload is checked as a scenario's (the plan only holds it as a mapping), in the plan's file
    with pytest.raises(ConfigError) as e:
        parse_plan(_raw(workload={"arrival": "poisson", "num_requests": 100, "prompt_tokens": 100,
                                  "output_tokens": 10, "rat": 3}), "p.yaml")
    assert str(e.value) == "p.yaml: workload.rat: unknown key; did you mean 'rate'?"


@pytest.mark.parametrize("model", ["llama-3.1-8b", "gpt-oss-120b"])
def test_lone_prefill_is_the_cost_models_idle_instance_ttft(monkeypatch, model):
    # On the roofline the plan's lone TTFT is the cost model's lone prefill (CostModel.prefill_time: the whole
    # prompt's causal attention, p^2 / 2, and with gpt-oss's sliding-window layers only their window; its values
    # are checked by hand in tests/test_costmodel*.py): a TTFT bound at exactly that time is met, one a float
    # below it is not.  401 requests: the check reads the first 400 (the sliding layers' path too).
    from pdsim.config import PoolSpec
    from pdsim.models import get_model
    from pdsim.topology import make_cost
    lone = make_cost(PoolSpec(device="h100-sxm", kv_blocks=2000), get_model(model), "bf16", "bf16", ".",
                     "x").prefill_time(1000)
    _stream(monkeypatch, [1000] * 401, [11] * 401)
    search = {"devices": ["h100-sxm"], "colocated": {}, "pool": {"kv_blocks": 2000}}
    below = math.nextafter(lone, 0)
    for ttft, want in [(lone, ""), (below, f"TTFT: a lone prefill exceeds {below:.4g} s for 100%")]:
        (cfg,) = _bounds(search, slo={"ttft_s": ttft, "tpot_s": 1.0, "attainment_target": 0.9},
                         model=model).values()
        assert cfg.infeasible == want


def test_bound_and_lone_prefill_count_the_engine_overhead_per_request_in_a_step(monkeypatch):
    # an explicit step overhead of 1 ms per request in the step (per_seq_us 1000, nothing else) on the linear model:
    # the bound's prefill step holds one prompt's worth of requests (1): (0.01 + 1.264 + 0.001) / 1264 s a token
    # (one 316-token prompt: 0.327 / 316, more); its decode batch of 2 pays 2 ms: (0.01 + 0.002 + 0.002) / 2 = 7 ms
    # a token.  As test_colocated_bound_and_price_by_hand's fcfs case otherwise.
    _stream(monkeypatch, [100, 316], [1, 11])
    search = {"devices": ["h100-sxm"], "colocated": {"tp": [2], "replicas": [2]},
              "pool": {"max_running": 4, "kv_blocks": 39, "cost_model": LIN, "step_overhead": {"per_seq_us": 1000}}}
    assert _bounds(search)["colo-h100-sxm-tp2x2"].bound_rate == pytest.approx(
        2 / (208 * 1.275 / 1264 + 5 * 0.007), rel=1e-12)
    # a lone prefill is one request: 1/1024 s a token and 1 ms: 256 tokens take 0.251 s (meets 0.2515 s; priced as a
    # step of 2 requests, 0.252 s, it would not); 512 tokens 0.501 s; a decode step (1 / 1024 + 0.001 s) meets 1 s
    _stream(monkeypatch, [256] * 9 + [512], [11] * 10)
    search["pool"]["cost_model"] = {"kind": "linear", "per_token_s": 1 / 1024}
    (cfg,) = _bounds(search, slo={"ttft_s": 0.2515, "tpot_s": 1.0, "attainment_target": 0.9}).values()
    assert cfg.infeasible == ""
    (cfg,) = _bounds(search, slo={"ttft_s": 0.2515, "tpot_s": 1.0, "attainment_target": 0.95}).values()
    assert cfg.infeasible == "TTFT: a lone prefill exceeds 0.2515 s for 10%"


def test_a_bad_trace_workload_is_reported_in_the_plan_file(tmp_path):
    # a trace workload is first read for its base rate (plan_base_rate, while the plan is parsed): a typo in its
    # trace mapping is reported there, naming the plan file and the key
    (tmp_path / "t.csv").write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n" + "".join(
        f"2023-11-16 18:15:4{i}.0000000,100,10\n" for i in range(3)))
    with pytest.raises(ConfigError) as e:
        parse_plan(_raw(workload={"arrival": "trace", "trace": {"path": "t.csv", "rate_scal": 2.0}}), "p.yaml",
                   tmp_path)
    assert str(e.value) == "p.yaml: workload.trace.rate_scal: unknown key; did you mean 'rate_scale'?"


def test_plan_base_rate_spans_the_first_to_the_last_arrival_after_an_idle_start(tmp_path):
    # requests at 0, 2, 3 and 4 s into the trace, read from start_s = 1 s: the window keeps 2, 3, 4 s, re-based
    # on start_s (traces.window keeps the idle second): arrivals at 1, 2 and 3 s.  The base rate is over the
    # arrivals' own span: 2 gaps over 3 - 1 = 2 s, 1 req/s (not over 3 s from the window's start)
    from pdsim.plan import plan_base_rate
    (tmp_path / "t.csv").write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n" + "".join(
        f"2023-11-16 18:15:4{s}.0000000,100,10\n" for s in (0, 2, 3, 4)))
    plan = parse_plan(_raw(workload={"arrival": "trace", "trace": {"path": "t.csv", "start_s": 1.0}}),
                      str(tmp_path / "p.yaml"), tmp_path)
    assert plan_base_rate(plan, with_span=True) == (1.0, 2.0)


def test_lone_request_ttft_bound_counts_the_front_end(monkeypatch):
    # a constant 0.2 s step meets a 0.25 s TTFT bound alone; 60 ms in the engine's front end (no GPU time) makes
    # every lone first token 0.26 s: infeasible for all; 50 ms makes it exactly 0.25 s: feasible (inclusive)
    _stream(monkeypatch, [100] * 10, [11] * 10)
    for fe, want in ((60.0, "TTFT: a lone prefill exceeds 0.25 s for 100%"), (50.0, ""), (0.0, "")):
        search = {"devices": ["h100-sxm"], "colocated": {},
                  "pool": {"kv_blocks": 2000, "cost_model": {"kind": "constant", "step_s": 0.2},
                           "frontend_latency_ms": fe}}
        (cfg,) = _bounds(search, slo={"ttft_s": 0.25, "tpot_s": 1.0, "attainment_target": 0.9}).values()
        assert cfg.infeasible == want, fe


def test_percentile_mode_judges_lone_requests_by_each_percentile(monkeypatch):
    # a linear step of 1/1024 s per token: a lone prefill of 256 tokens takes 0.25 s, of 512 tokens 0.5 s; nine
    # of each ten prompts are 256 tokens, so 90% of lone TTFTs are within 0.3 s.  TTFT p50 <= 0.3 s is reachable
    # (the config is feasible) though attainment mode at 95% is not; TTFT p95 needs 95% within: infeasible.
    # TPOT: a decode step of one token, 1/1024 s, meets any bound here; one-token replies have no TPOT at all
    _stream(monkeypatch, [256] * 9 + [512], [11] * 9 + [1])
    search = {"devices": ["h100-sxm"], "colocated": {"replicas": [1]},
              "pool": {"max_running": 4, "kv_blocks": 100, "cost_model": {"kind": "linear", "per_token_s": 1 / 1024}}}
    pct = {"ttft_s": 0.3, "tpot_s": 1.0, "mode": "percentile", "tpot_percentile": 99}
    (cfg,) = _bounds(search, slo={**pct, "ttft_percentile": 50}).values()
    assert cfg.infeasible == ""
    (cfg,) = _bounds(search, slo={"ttft_s": 0.3, "tpot_s": 1.0, "attainment_target": 0.95}).values()
    assert cfg.infeasible == "TTFT: a lone prefill exceeds 0.3 s for 10%"
    (cfg,) = _bounds(search, slo={**pct, "ttft_percentile": 95}).values()
    assert cfg.infeasible == "TTFT: a lone prefill is within 0.3 s for only 90.0% of requests (p95 needs 95%)"
    # TPOT p99 over the nine multi-token requests: their lone steps (1/1024 s) exceed a 0.0009 s bound: all of them
    (cfg,) = _bounds(search, slo={**pct, "ttft_percentile": 50, "tpot_s": 0.0009}).values()
    assert cfg.infeasible == ("TPOT: a lone decode step is within 0.0009 s for only 0.0% of requests with a TPOT "
                              "(p99 needs 99%)")


def test_percentile_mode_takes_tpot_over_the_requests_that_have_one(monkeypatch):
    # the KV read makes a lone decode step grow with the prompt: 0.005 + 1e-5 (p + 1) s -> 256 tokens 7.57 ms, 512
    # tokens 10.13 ms.  The one 512-token prompt replies with one token: it has no TPOT, so TPOT p95 <= 9 ms is
    # reachable (9 of 9 within); counted among all ten it would be 90% < 95%
    _stream(monkeypatch, [256] * 9 + [512], [11] * 9 + [1])
    search = {"devices": ["h100-sxm"], "colocated": {"replicas": [1]},
              "pool": {"max_running": 4, "kv_blocks": 100,
                       "cost_model": {"kind": "linear", "base_s": 0.005, "per_kv_token_s": 1e-5}}}
    slo = {"ttft_s": 5.0, "tpot_s": 0.009, "mode": "percentile", "ttft_percentile": 50, "tpot_percentile": 95}
    (cfg,) = _bounds(search, slo=slo).values()
    assert cfg.infeasible == ""
    _stream(monkeypatch, [256] * 9 + [512], [11] * 10)          # now it has a TPOT: 9 of 10 within < 95%
    (cfg,) = _bounds(search, slo=slo).values()
    assert cfg.infeasible == ("TPOT: a lone decode step is within 0.009 s for only 90.0% of requests with a TPOT "
                              "(p95 needs 95%)")


def test_a_two_token_reply_behind_the_pd_proxy_has_no_tpot_to_miss(monkeypatch):
    # the client of a PD deployment sees the decode instance's tokens only (ttft_at: first_decode_token): a 2-token
    # reply streams one token and has no TPOT (metrics.slo_samples), so no decode step can make it miss; colocated,
    # the same reply streams 2 tokens and its lone decode step (0.01 + ... s) misses a 1 ms TPOT bound
    _stream(monkeypatch, [100] * 10, [2] * 10)
    pool = {"kv_blocks": 2000, "cost_model": dict(LIN, per_kv_token_s=1e-4)}
    slo = {"ttft_s": 5.0, "tpot_s": 0.001, "attainment_target": 0.9}
    pd = {"devices": ["h100-sxm"], "pool": pool,
          "disaggregated": {"prefill_instances": [1], "decode_instances": [1], "kv_link": ["infiniband"]}}
    (cfg,) = _bounds(pd, slo=slo).values()
    assert cfg.infeasible == ""
    (cfg,) = _bounds({"devices": ["h100-sxm"], "pool": pool, "colocated": {}}, slo=slo).values()
    assert cfg.infeasible == "TPOT: a lone decode step exceeds 0.001 s for 100%"
    (cfg,) = _bounds(pd, slo={**slo, "mode": "percentile", "tpot_percentile": 50}).values()
    assert cfg.infeasible == ""


class _Jobs(_Script):
    """The scripted executor with ``jobs`` workers (LocalExecutor's attribute), recording each batch's
    (config, rate, requests)."""

    def __init__(self, answer, jobs):
        super().__init__(answer)
        self.jobs, self.batches = jobs, []

    def map(self, fn, tasks, on_done=None):
        self.batches.append([(next(iter(t["scenario"]["topologies"])), t["scenario"]["workload"]["rate"],
                              t["scenario"]["workload"]["num_requests"]) for t in tasks])
        return super().map(fn, tasks, on_done)


def test_long_runs_ahead_take_only_shorter_candidates_never_double_and_are_used_when_asked():
    # goodput per $/h, confirm_top 1, 4 workers, windows of at least 20 s (x 3 for a long run), 100 requests
    # otherwise.  Goodputs 12, 13, 11, 14 req/s on the $1 ... $4 configs: per $/h 12, 6.5, 3.67, 3.5, so the
    # $1 one is run long first, at 12 req/s: 240 x 3 = 720 requests.  Spare workers 3, but at most confirm_top
    # (1) go along, and none longer than 720: the $2 config's (13 req/s: 780) is not taken, the $3 one's
    # (11: 660) is.  The $1 run fails (lowered 5% to 11.4 and run again: 684), the $3 rider's interval is wide
    # (it would double) but a rider never doubles in the batch it rides.  Second round: $1 at 11.4 passes
    # (the rider taken then: the $2's 780 is longer than 684: none; the $3 one is memoised, not re-taken).
    plan = _four(goodput={"confirm_top": 1, "confirm_factor": 3, "min_duration_s": 20})
    names = [c.name for c in plan.configs]
    rows = _rows(plan, [12.0, 13.0, 11.0, 14.0])

    def answer(c, rate, seed, n):
        if c == names[0]:
            return _res(190 if rate < 12 else 170, n=200)
        return dict(_res(190, n=200), ci=[0.85, 0.97])        # wide and holding the target: would double
    ex = _Jobs(answer, jobs=4)
    runner = _Runner(plan, ex, None, False)
    counts = _confirm(plan, rows, runner)
    assert ex.batches == [[(names[0], 12.0, 720), (names[2], 11.0, 660)], [(names[0], 12.0 * 0.95, 684)]]
    assert counts == {"long_runs_ahead": 1, "long_runs_ahead_used": 0}
    assert rows[names[0]]["long_run"]["passed"] and rows[names[0]]["goodput"] == 12.0 * 0.95
    # the rider's result is kept for when it is asked: confirm at (the $3 config, 11) sends its first run (x3)
    # to no worker, then doubles it as any long run whose interval is that wide: x6, x12, x24 (x48 > 40)
    ex.batches.clear()
    res = runner.confirm([(plan.configs[2], 11.0)])
    assert ex.batches == [[(names[2], 11.0, 1320)], [(names[2], 11.0, 2640)], [(names[2], 11.0, 5280)]]
    assert runner.reused == 1 and res[0]["factor"] == 24.0
