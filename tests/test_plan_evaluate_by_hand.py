"""pdsim.plan.evaluate by hand (tests/MUTANTS.md, `evaluate`): small simulations whose results are worked out
in the comments, step by step, from the scheduler's rules, the judge's rules and the verdict's percentile
definition (metrics.nearest_rank over metrics.slo_samples: the smallest value with at least p% of the sample at
or below it, rank ceil(p/100 x n); a request never served counts as +inf, one with a single streamed token has no
TPOT).

Every run here is a constant-cost colocated replica (each step 0.25 s whatever it holds; fcfs: a step holds the
waiting prompts, or, when none is waiting, one decode token of every running request) fed by a vidur trace of a
few requests with exact arrival times, so every time below is a sum of binary fractions, exact in floats.  A
prompt of 5000 tokens fills more than half of the 8192-token step budget: such prompts are prefilled one per step.
"""
from __future__ import annotations

import math
import shutil
from pathlib import Path

import pytest

from pdsim.errors import ConfigError, SimulationInvariantError
from pdsim.plan import evaluate

STEP = {"kind": "constant", "step_s": 0.25}
DEVICES = Path(__file__).resolve().parents[1] / "pdsim" / "data" / "devices"


def _task(tmp_path, rows, slo, early=None, pool=None, client=None, file=None, warmup=None, **workload):
    """A task as the plan's runner makes one (pdsim.plan._Runner._task), on a trace of ``rows`` (arrival s,
    prompt tokens, output tokens) written to ``tmp_path``; paths in it are relative to the task's base_dir."""
    (tmp_path / "t.csv").write_text("arrived_at,num_prefill_tokens,num_decode_tokens\n"
                                    + "".join(f"{a},{p},{o}\n" for a, p, o in rows))
    sc = {"name": "x", "seed": 0, "model": "llama-3.1-8b",
          "workload": {"arrival": "trace", "trace": {"path": "t.csv"}, **workload}, "slo": slo,
          "topologies": {"c": {"kind": "colocated", "replicas": 1, "cost_model": STEP, "kv_blocks": 100000,
                               **(pool or {})}}}
    if client is not None:
        sc["client"] = client
    task = {"scenario": sc, "base_dir": str(tmp_path), "early": early}
    if file is not None:
        task["file"] = file
    if warmup is not None:
        task["warmup_fraction"] = warmup
    return task


# one block of five requests (prompt 10 tokens: they share a prefill step), at 0, 0, 0.125, 1 and 1 s:
#   [0, .25]     prefill r0, r1                 first tokens at .25
#   [.25, .5]    prefill r2 (arrived .125; a waiting prompt goes before the decodes)   first token .5
#   [.5, .75]    decode r0, r1, r2
#   [.75, 1]     decode r0, r1 (their 3rd token: done at 1.0), r2
#   [1, 1.25]    prefill r3, r4 (arrived 1.0): r4's only token, done at 1.25
#   [1.25, 1.5]  decode r2 (4th token: done), r3 (2nd: done)
# TTFT: r0 .25, r1 .25, r2 .375, r3 .25, r4 .25
# TPOT ((finish - first) / (tokens - 1)): r0 .75 / 2 = .375, r1 .375, r2 1.0 / 3 = .333..., r3 .25 / 1 = .25,
#   r4 none (one token: meets any TPOT bound)
BLOCK = [(0.0, 10, 3), (0.0, 10, 3), (0.125, 10, 4), (1.0, 10, 2), (1.0, 10, 1)]


def test_a_run_to_the_end_counts_bounds_inclusively_with_its_batch_means_interval(tmp_path):
    # eight blocks 2 s apart (each block is idle again by 1.5 s): 40 judged requests (no warmup_fraction in the
    # task: none left out).  Bounds TTFT 0.25 and TPOT 0.25, both met exactly by some requests (a bound is met
    # at equality): TTFT ok r0, r1, r3, r4 (r2's .375 misses); TPOT ok r3 (.25) and r4 (one token).
    # Per block: ttft_ok 4, tpot_ok 2, both 2 (r3, r4): 32, 16, 16 of 40.
    rows = [(2.0 * k + a, p, o) for k in range(8) for a, p, o in BLOCK]
    slo = {"ttft_s": 0.25, "tpot_s": 0.25, "attainment_target": 0.4}
    r = evaluate(_task(tmp_path, rows, slo))
    # interval: 20 batches of 2 in arrival order; "both met" runs 0,0,0,1,1 per block, so the pairs run
    # (0,0) (0,1) (1,0) (0,0) (1,1): means 0, .5, .5, 0, 1, four times.  Mean 16 / 40 = 0.4; squared deviations
    # .16 + .01 + .01 + .16 + .36 = .70 per five, 2.8 in all: sample sd sqrt(2.8 / 19);
    # half-width 2.093 x sqrt(2.8 / 19) / sqrt(20) = 0.17966...
    half = 2.093 * math.sqrt(2.8 / 19) / math.sqrt(20)
    assert round(half, 5) == 0.17966
    ci = r.pop("ci")
    assert ci == pytest.approx([0.4 - half, 0.4 + half], rel=1e-12)
    # p90 by nearest rank: TTFT of 40 values, 32 x .25 then 8 x .375: rank ceil(36) = 36, a .375; TPOT of the 32
    # multi-token requests (8 x .25, 8 x .333, 16 x .375): rank ceil(28.8) = 29, a .375.
    # 16 / 40 = 0.4 >= the 0.4 target: met.  Ran to the end: no early verdict, no stop time.
    assert r == {"n": 40, "ok": 16, "ttft_ok": 32, "tpot_ok": 16, "finished": 40, "early": None, "settled": 40,
                 "total": 40, "stopped_s": None, "ttft_p": 0.375, "tpot_p": 0.375, "slo_met": True}


def test_a_run_too_short_for_an_interval_has_none(tmp_path):
    # one block: 5 judged requests, fewer than 2 per batch of 20: no interval.  TTFT bound 0.5, TPOT 0.4:
    # r0, r1 (.375), r3 (.25), r4 meet both, r2 (.333) too: 5 of 5.  p90 of the TTFTs (.25 x 4, .375):
    # rank ceil(4.5) = 5, .375 (numpy's interpolation would say .325, below an observed latency); of the 4
    # TPOTs (.25, .333, .375, .375): rank ceil(3.6) = 4, .375
    slo = {"ttft_s": 0.5, "tpot_s": 0.4, "attainment_target": 0.9}
    r = evaluate(_task(tmp_path, BLOCK, slo))
    assert r == {"n": 5, "ok": 5, "ttft_ok": 5, "tpot_ok": 5, "finished": 5, "early": None, "settled": 5,
                 "total": 5, "ci": None, "stopped_s": None, "ttft_p": 0.375, "tpot_p": 0.375, "slo_met": True}


@pytest.mark.parametrize("warmup, first", [(0.8, 4), (0.5, 2)])
def test_the_warm_up_leaves_out_the_first_requests_by_arrival(tmp_path, warmup, first):
    # 5 requests: the first int(5 x w) are warm-up.  TTFT bound .3 (r2's .375 misses), TPOT .4 (all meet it).
    # 0.8 -> 4: r4 alone is judged: TTFT .25, one token (no TPOT): 1 of 1.
    # 0.5 -> 2: r2, r3, r4 judged: TTFT ok 2 (r3, r4), TPOT ok 3; p90 of the TTFTs (.25, .25, .375): rank
    #   ceil(2.7) = 3, .375; of the multi-token requests' TPOTs (.25, 1/3): rank ceil(1.8) = 2, 1/3.  2 / 3 >= .5.
    # "settled" counts every request, the warm-up's too.
    slo = {"ttft_s": 0.3, "tpot_s": 0.4, "attainment_target": 0.5}
    r = evaluate(_task(tmp_path, BLOCK, slo, warmup=warmup))
    want = {4: dict(n=1, ok=1, ttft_ok=1, tpot_ok=1, finished=1, ttft_p=0.25, tpot_p=None),
            2: dict(n=3, ok=2, ttft_ok=2, tpot_ok=3, finished=3, ttft_p=0.375, tpot_p=1 / 3)}[first]
    assert r == {**want, "early": None, "settled": 5, "total": 5, "ci": None, "stopped_s": None, "slo_met": True}


def test_a_run_stopped_at_a_certain_pass_reports_what_had_settled(tmp_path):
    # one block, early "both": TTFT .5, TPOT .375, target .4: 5 judged, 2 passes needed (2 / 5 = .4).  r0 and r1
    # finish at 1.0 meeting both (.25, .375 <= .375): the second makes the pass certain, and the run stops there,
    # at 1.0, before r2 (1.5), r3 (1.5) and r4 (1.25) finish.  The counts are of what had settled: 2 finished,
    # both ok; the percentiles are theirs (TTFT .25, .25; TPOT .375, .375); no interval for a stopped run.
    slo = {"ttft_s": 0.5, "tpot_s": 0.375, "attainment_target": 0.4}
    r = evaluate(_task(tmp_path, BLOCK, slo, early="both"))
    assert r == {"n": 5, "ok": 2, "ttft_ok": 2, "tpot_ok": 2, "finished": 2, "early": "pass", "settled": 2,
                 "total": 5, "ci": None, "stopped_s": 1.0, "ttft_p": 0.25, "tpot_p": 0.375, "slo_met": True}


# early "fail": seven requests, all 5000-token prompts (one prefill per step); TTFT .5, TPOT .25, target .7
# (5 of 7 needed: 4 / 7 = .57 < .7 <= 5 / 7; the run fails at its 3rd miss).  The judge's sweep runs every
# .25 x .5 = .125 s and looks at requests whose TTFT deadline has passed (now - arrival + rtt > .5).
#   r0 at 0 (2 tokens): prefill [0, .25], decode [.25, .5]: finished at .5 (TTFT .25, TPOT .25: ok)
#   r1 (2 tokens), r2 (3), r3 (2), r4 (2) at .5: prefills [.5, .75], [.75, 1], [1, 1.25], [1.25, 1.5]
#     (no decode step while a prompt waits): first tokens .75, 1.0, 1.25, 1.5
#   r5 at 1.125 (1 token), r6 at 3.0 (2 tokens)
FAIL_ROWS = [(0.0, 5000, 2), (0.5, 5000, 2), (0.5, 5000, 3), (0.5, 5000, 2), (0.5, 5000, 2), (1.125, 5000, 1),
             (3.0, 5000, 2)]
FAIL_SLO = {"ttft_s": 0.5, "tpot_s": 0.25, "attainment_target": 0.7, "ttft_percentile": 50, "tpot_percentile": 60}


def test_a_run_stopped_at_a_certain_fail_gives_bounds_and_percentiles_so_far(tmp_path):
    # Without an RTT the sweep first looks at the .5 arrivals at 1.125 (1.0 - .5 = .5 is not past the bound):
    #   r1: first token .75 (TTFT .25, in time); r2: 1.0 (TTFT .5, in time); r3, r4: none yet: 2 TTFT misses;
    #   then r1's TPOT deadline .75 + .25 x 1 = 1.0 has passed unfinished: (1.125 - .75) / 1 = .375 > .25, a miss
    #   (r2's, 1.0 + .25 x 2 = 1.5, is ahead).  3 misses: fail at 1.125.
    # Upper bounds: ok 7 - 3 = 4, TTFT ok 7 - 2 = 5, TPOT ok 7 - 1 = 6; only r0 finished (and settled).
    # Percentiles so far, at now = 1.125, of the settled and the open (arrived, unsettled) requests: r6 has
    # not arrived; r5 arrived just now.
    #   TTFT: r0 .25 (settled), r1 .25, r2 .5 (first tokens), r3, r4 1.125 - .5 = .625, r5 0 (lower bounds):
    #     sorted 0, .25, .25, .5, .625, .625: p50 at rank ceil(3) = 3: .25
    #   TPOT: r0 .25 (finished); decoding (open, > 1 token): r1 (1.125 - .75) / 1 = .375, r2 (1.125 - 1) / 2 =
    #     .0625, r3, r4 0 (no first token: could still be ~0); r5 (one token) has none:
    #     sorted 0, 0, .0625, .25, .375: p60 at rank ceil(3) = 3: .0625
    r = evaluate(_task(tmp_path, FAIL_ROWS, FAIL_SLO, early="fail"))
    assert r == {"n": 7, "ok": 4, "ttft_ok": 5, "tpot_ok": 6, "finished": 1, "early": "fail", "settled": 1,
                 "total": 7, "ci": None, "stopped_s": 1.125, "ttft_p": 0.25, "tpot_p": 0.0625, "slo_met": False,
                 "p_so_far": True}


def test_the_network_rtt_counts_in_the_judge_and_in_the_percentiles(tmp_path):
    # FAIL_ROWS with a 1/16 s RTT added to every TTFT: the deadline passes at now - arrival > .4375, so the sweep
    # looks at the .5 arrivals at 1.0 (not 1.125):  r1: .25 + .0625 = .3125, in time (its TPOT deadline, 1.0, is
    # not yet past); r2: first token at 1.0 or none yet, either way .5625 > .5; r3, r4: none: 3 TTFT misses, fail
    # at 1.0.  Bounds: ok 7 - 3 = 4, TTFT ok 4, TPOT ok 7.
    # TTFT so far (+ .0625): r0 .3125 (settled), r1 .3125, r2 .5625, r3, r4 1 - .5 + .0625 = .5625 (r5 arrives at
    #   1.125): sorted .3125, .3125, .5625 x 3: p10 at rank ceil(.5) = 1: .3125
    # TPOT so far: r0 .25, r1 (1 - .75) / 1 = .25, r2 (first token at now or none) 0, r3, r4 0:
    #   sorted 0, 0, 0, .25, .25: p60 at rank ceil(3) = 3: 0
    slo = {**FAIL_SLO, "ttft_percentile": 10}
    r = evaluate(_task(tmp_path, FAIL_ROWS, slo, early="fail", client={"network_rtt_s": 0.0625}))
    assert r == {"n": 7, "ok": 4, "ttft_ok": 4, "tpot_ok": 7, "finished": 1, "early": "fail", "settled": 1,
                 "total": 7, "ci": None, "stopped_s": 1.0, "ttft_p": 0.3125, "tpot_p": 0.0, "slo_met": False,
                 "p_so_far": True}
    # run to the end: TTFTs r0 .25, r1 .25, r2 .5, r3 .75, r4 1.0, r5 (prefill after r4's, [1.5, 1.75]: its only
    # token) .625, r6 (alone, [3, 3.25]) .25, each + .0625: in time (<= .5) r0, r1, r6.
    r = evaluate(_task(tmp_path, FAIL_ROWS, slo, client={"network_rtt_s": 0.0625}))
    assert (r["ttft_ok"], r["ttft_p"], r["early"]) == (3, 0.3125, None)


def test_a_client_timeout_abandons_requests_still_without_a_first_token(tmp_path):
    # four 5000-token prompts at 0 (one token each), timeout .6 s: prefills [0, .25], [.25, .5] answer r0, r1
    # (TTFT .25, .5); r2 (its prefill would end at .75) and r3 are abandoned at .6: settled, not finished.
    # Abandoned requests were never served: +inf in the TTFT sample (.25, .5, inf, inf), whose p90 (rank
    # ceil(3.6) = 4) is inf, as the verdict sees it; one-token requests have no TPOT.  2 of 4 >= .5: met
    # (attainment mode).  In percentile mode the same run fails, and its p90 says why (it used to show .475,
    # the interpolated p90 of the two served requests, under the .5 bound, beside a failed verdict).
    slo = {"ttft_s": 0.5, "tpot_s": 0.25, "attainment_target": 0.5}
    r = evaluate(_task(tmp_path, [(0.0, 5000, 1)] * 4, slo, timeout_s=0.6))
    assert r == {"n": 4, "ok": 2, "ttft_ok": 2, "tpot_ok": 2, "finished": 2, "early": None, "settled": 4,
                 "total": 4, "ci": None, "stopped_s": None, "ttft_p": math.inf, "tpot_p": None, "slo_met": True}
    r = evaluate(_task(tmp_path, [(0.0, 5000, 1)] * 4, {**slo, "mode": "percentile"}, timeout_s=0.6))
    assert (r["ttft_p"], r["slo_met"]) == (math.inf, False)
    # p50 (rank 2): .5, at the bound: met in percentile mode
    r = evaluate(_task(tmp_path, [(0.0, 5000, 1)] * 4, {**slo, "mode": "percentile", "ttft_percentile": 50},
                       timeout_s=0.6))
    assert (r["ttft_p"], r["slo_met"]) == (0.5, True)


def test_a_run_whose_queue_runs_dry_is_reported_as_a_deadlock(tmp_path, monkeypatch):
    # a request that never reaches the topology (the open loop made to skip r1) leaves simpy's queue empty
    # before the judge's last event: evaluate reports the deadlock by the topology's name, not simpy's error
    from pdsim import simulation
    real = simulation._open_loop
    monkeypatch.setattr(simulation, "_open_loop", lambda env, topo, reqs, model, timeout_s=None:
                        real(env, topo, [q for q in reqs if q.id != 1], model, timeout_s))
    with pytest.raises(SimulationInvariantError) as e:
        evaluate(_task(tmp_path, BLOCK, {"ttft_s": 0.5}))
    assert str(e.value) == "c: 1 requests never finished without a horizon (first: id 1); the simulation deadlocked"


def test_errors_name_the_plan_file_and_the_topology(tmp_path):
    # the scenario is parsed as the task's file ("plan" when the task names none) ...
    for file, want in (("my-plan.yaml", "my-plan.yaml"), (None, "plan")):
        with pytest.raises(ConfigError) as e:
            evaluate(_task(tmp_path, BLOCK, {"ttft_s": -0.5}, file=file))
        assert (e.value.file, e.value.key) == (want, "slo.ttft_s")
    # ... and a pool's error names its topology's key
    with pytest.raises(ConfigError) as e:
        evaluate(_task(tmp_path, BLOCK, {"ttft_s": 0.5}, pool={"device": "nodev", "kv_blocks": None}))
    assert e.value.key == "topologies.c.device"


def test_relative_trace_and_device_profile_paths_resolve_against_the_task_base_dir(tmp_path):
    # the trace (t.csv) and a device profile (a copy of the H100 preset, its KV pool sized from its 80 GiB,
    # room for every one of these few requests) named relative to base_dir, wherever the worker runs: the
    # block's results by hand (TTFT .5, TPOT .4: all 5 meet both; p90s .375 and .375, as above)
    (tmp_path / "prof").mkdir()
    shutil.copy(DEVICES / "h100-sxm.yaml", tmp_path / "prof" / "mydev.yaml")
    r = evaluate(_task(tmp_path, BLOCK, {"ttft_s": 0.5, "tpot_s": 0.4},
                       pool={"device": "prof/mydev.yaml", "kv_blocks": None}))
    assert (r["n"], r["ok"], r["finished"], r["ttft_p"], r["tpot_p"]) == (5, 5, 5, 0.375, 0.375)


def test_a_fail_stop_behind_a_pd_proxy_counts_the_decode_instances_tokens(tmp_path):
    # 1P1D, both pools 0.25 s a step; the KV of a 5000-token prompt (2 x 32 layers x 8 KV heads x 128 x 2 bytes
    # = 131072 B a token: 655,360,000 B) crosses a 1e6 GB/s link in e = 6.5536e-7 s.  Five prompts at 0, prefilled
    # one per step: prefill tokens at .25, .5, .75, 1.0, 1.25; each request then decodes on the decode instance,
    # whose first token is the client's (a PD proxy drops the prefill's): r0 .5 + e, r1 .75 + e, r2 1 + e,
    # r3 1.25 + e; r4 (1 token) is done at its prefill token.  Outputs 3, 2, 4, 2, 1 tokens: the client
    # receives 2, 1, 3, 1 and 1 tokens (r0 done at .75 + e: TPOT .25; r1 done at .75 + e).
    # TTFT .875 (sweep every .21875 s), TPOT .3, target .75 (4 of 5 needed: the 2nd miss fails the run).
    # The first sweep with a deadline past is at 1.09375: r0, r1 settled in time; r2 (first at 1 + e),
    # r3 and r4 (none yet) miss: fail at 1.09375; bounds ok 2, TTFT ok 2, TPOT ok 5.
    # TTFT so far: r0 .5 + e, r1 .75 + e (settled), r2 1 + e (its decode token), r3 and r4 1.09375 (r3's prefill
    #   token at 1.0 is not the client's first): p75 at rank ceil(3.75) = 4: 1.09375
    # TPOT so far: r0 .25 (finished; r1 has one client token: no TPOT); decoding: r2, 3 client tokens, its first
    #   at 1 + e: (1.09375 - 1 - e) / 2; r3 (1 client token) is not decoding.  p50 of the two, rank 1: the smaller.
    rows = [(0.0, 5000, 3), (0.0, 5000, 2), (0.0, 5000, 4), (0.0, 5000, 2), (0.0, 5000, 1)]
    (tmp_path / "t.csv").write_text("arrived_at,num_prefill_tokens,num_decode_tokens\n"
                                    + "".join(f"{a},{p},{o}\n" for a, p, o in rows))
    pool = {"cost_model": STEP, "kv_blocks": 100000}
    sc = {"name": "x", "seed": 0, "model": "llama-3.1-8b",
          "workload": {"arrival": "trace", "trace": {"path": "t.csv"}},
          "slo": {"ttft_s": 0.875, "tpot_s": 0.3, "attainment_target": 0.75, "ttft_percentile": 75,
                  "tpot_percentile": 50},
          "topologies": {"d": {"kind": "disaggregated", "kv_link": {"bandwidth_GBps": 1e6, "latency_us": 0},
                               "prefill": pool, "decode": pool}}}
    r = evaluate({"scenario": sc, "base_dir": str(tmp_path), "early": "fail"})
    e = 655_360_000 / 1e15
    assert r.pop("tpot_p") == pytest.approx((1.09375 - 1 - e) / 2, rel=1e-9)
    assert r == {"n": 5, "ok": 2, "ttft_ok": 2, "tpot_ok": 5, "finished": 2, "early": "fail", "settled": 2,
                 "total": 5, "ci": None, "stopped_s": 1.09375, "ttft_p": 1.09375, "slo_met": False, "p_so_far": True}


def test_a_speculative_pool_with_every_draft_accepted_by_hand(tmp_path):
    # the per-request draws are seeded by the run's seed (a run built without one cannot draw); which seed is not
    # seen here (every draw is 1).  Speculative decoding, k = 2 drafts at 0.5 x a plain decode step each (.125 s), per-request acceptance drawn
    # uniform in [1, 1] from the scenario's seed (7): every draft accepted, whatever the draw.  One request,
    # 10-token prompt, 7 tokens: prefill [0, .25] (token 1); verify step with 2 drafts: .25 + 2 x .125 = .5 s,
    # tokens 2-4 at .75; 3 left, 2 drafts again: tokens 5-7 at 1.25.  TTFT .25, TPOT (1.25 - .25) / 6 = 1/6.
    spec = {"method": "draft", "k": 2, "acceptance": {"dist": "uniform", "low": 1.0, "high": 1.0},
            "draft_cost_fraction": 0.5}
    task = _task(tmp_path, [(0.0, 10, 7)], {"ttft_s": 0.5, "tpot_s": 0.2}, pool={"speculative": spec})
    task["scenario"]["seed"] = 7
    r = evaluate(task)
    assert r.pop("tpot_p") == pytest.approx(1 / 6, rel=1e-12)
    assert r == {"n": 1, "ok": 1, "ttft_ok": 1, "tpot_ok": 1, "finished": 1, "early": None, "settled": 1,
                 "total": 1, "ci": None, "stopped_s": None, "ttft_p": 0.25, "slo_met": True}


def test_a_speculative_pool_draws_from_the_scenarios_seed(tmp_path):
    # the rule of pdsim/speculative.py's docstring: request r's i-th verify step reads row i of a table of k
    # uniforms from numpy.random.default_rng([seed, 0x5BEC, r, i // 64]); a draft is accepted if its uniform is
    # below the acceptance.  k = 1 at acceptance .5, one request (id 0), 3 tokens, a draft at .5 x .25 s:
    #   prefill [0, .25]: token 1; verify step with 1 draft: .25 + .125 = .375 s, ends at .625:
    #   seed 1: first uniform .0159 < .5, accepted: tokens 2 and 3 at .625: TPOT (.625 - .25) / 2 = .1875
    #   (seed 0 would draw .7716: rejected, token 2 at .625, then a plain .25 s step: token 3 at .875, TPOT .3125)
    import numpy as np
    draw = {s: np.random.default_rng([s, 0x5BEC, 0, 0]).random() for s in (0, 1)}
    assert draw[1] < 0.5 <= draw[0]
    spec = {"method": "draft", "k": 1, "acceptance": 0.5, "draft_cost_fraction": 0.5}
    task = _task(tmp_path, [(0.0, 10, 3)], {"ttft_s": 0.5, "tpot_s": 0.25}, pool={"speculative": spec})
    task["scenario"]["seed"] = 1
    r = evaluate(task)
    assert (r["ok"], r["ttft_p"], r["tpot_p"]) == (1, 0.25, 0.1875)


def test_plan_json_stays_strict_json_with_an_unserved_percentile():
    import json

    from pdsim.plan import json_safe
    got = json_safe({"ttft_p": math.inf, "rows": [{"x": -math.inf, "y": float("nan"), "z": 0.5}], "t": (1.0, math.inf)})
    assert got == {"ttft_p": "inf", "rows": [{"x": "-inf", "y": "nan", "z": 0.5}], "t": [1.0, "inf"]}
    json.dumps(got, allow_nan=False)          # no Infinity / NaN tokens left
