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
])
def test_passes_needed_is_the_least_count_meeting_the_target(n, target, want):
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
    seen = []
    for _ in range(30):
        r = s.next_rate()
        if r is None:
            return seen
        seen.append(r)
        s.update(r, {"pass_att": 1.0 if passes(r) else 0.0}, 0.9)
    raise AssertionError(f"the search did not end: {seen}")


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
    assert (s.miss, s.ttft_miss, s.tpot_miss, s.swept) == (4, 4, 0, 4)


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


def test_counting_certain_misses_early_gives_the_same_counts_as_the_whole_run(monkeypatch):
    # the sweep on, verdicts never taken (so the runs go to the end): every request the sweep counted as a
    # miss misses at the end (finished() asserts it), and the counts equal those of the run without it
    from pdsim import plan as P
    from pdsim.plan import LocalExecutor, _Runner, evaluate, parse_plan
    from test_plan import LINEAR, small_plan
    sinks = []
    monkeypatch.setattr(P._JudgeSink, "_decide", lambda self: sinks.append(self) if self not in sinks else None)
    raw = small_plan(search={"devices": [{"name": "h100-sxm", "price_per_hour_usd": 2.0}],
                             "colocated": {"replicas": [1]},
                             "disaggregated": {"prefill_instances": [1], "decode_instances": [1]},
                             "pool": {"kv_blocks": 600, "cost_model": LINEAR}},
                     slo={"ttft_s": 0.3, "tpot_s": 0.02, "attainment_target": 0.9},
                     workload={"arrival": "poisson", "num_requests": 150,
                               "prompt_tokens": {"dist": "uniform", "low": 50, "high": 600},
                               "output_tokens": {"dist": "uniform", "low": 2, "high": 60}})
    plan = parse_plan(raw)
    runner = _Runner(plan, LocalExecutor(1), None, False)
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
    from pdsim.plan import LocalExecutor, _Runner, evaluate, parse_plan
    from test_plan import LINEAR, small_plan
    frames = []
    real = metrics.requests_frame
    monkeypatch.setattr(metrics, "requests_frame", lambda *a, **k: frames.append(real(*a, **k)) or frames[-1])
    raw = small_plan(search={"devices": [{"name": "h100-sxm", "price_per_hour_usd": 2.0}],
                             "colocated": {"replicas": [1]},
                             "disaggregated": {"prefill_instances": [1], "decode_instances": [1]},
                             "pool": {"kv_blocks": 300, "cost_model": LINEAR}},
                     slo={"ttft_s": 0.3, "tpot_s": 0.02, "attainment_target": 0.9},
                     workload={"arrival": "poisson", "num_requests": 300,
                               "prompt_tokens": {"dist": "uniform", "low": 50, "high": 600},
                               "output_tokens": {"dist": "uniform", "low": 2, "high": 60}})
    plan = parse_plan(raw)
    runner = _Runner(plan, LocalExecutor(1), None, False)
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
            want_ttft = np.percentile(seen.ttft_s.dropna(), slo.ttft_percentile)
            want_tpot = np.percentile(seen.tpot_s.dropna(), slo.tpot_percentile)
            assert early["ttft_p"] <= want_ttft + 1e-12, (cfg.name, rate, early["ttft_p"], want_ttft)
            assert early["tpot_p"] <= want_tpot + 1e-12, (cfg.name, rate, early["tpot_p"], want_tpot)
    assert stopped >= 2
