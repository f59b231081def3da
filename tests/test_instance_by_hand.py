"""pdsim.instance (the engine loop and its multi-step decode fast path) on tiny runs worked out by hand.

Written against mutmut survivors in instance.py (tests/MUTANTS.md section 2).  An Instance is driven
directly (a SimPy environment, a plain KVCache, the fcfs/chunked policy, a sink that logs its calls) with
ConstantCost steps of 0.25 s (binary-exact, so step ends are exact floats) or a test-local cost whose FLOPs
and bytes are stated per step.  Every expected finish time, token time, step count, KV block count, counter
and time-series bin is arithmetic in the comments, never a second call into pdsim's own code path (and
never a fast-vs-step-by-step comparison: both are held to the same hand values).

Conventions of the hand schedules: block size 16; a request of prompt P and output O is prefilled in one
step (its first token at that step's end), then decodes one token a step; after g tokens it holds
P + g - 1 tokens of KV, i.e. ceil((P + g - 1) / 16) blocks (the step computing token g + 1 grows to
ceil((P + g) / 16)).  The fast path opens a window of k = min(left) decode steps once every running
request has its first token, cut short where the KV blocks would run out.
"""
from __future__ import annotations

import numpy as np
import pytest
import simpy

from pdsim.costmodel import ConstantCost, CostModel, StepCost
from pdsim.instance import HANDOFF, Instance, Series, _exact_delay
from pdsim.kvcache import KVCache
from pdsim.scheduler import Limits, chunked, fcfs
from pdsim.workload import ABANDONED, FINISHED, UNFINISHED, Request

STEP = 0.25


class _Sink:
    """The topology's callbacks, logged as (what, request id or instance name, time)."""

    def __init__(self, env):
        self.env, self.log = env, []

    def first_token(self, r):
        self.log.append(("first", r.id, self.env.now))

    def finished(self, r, inst):
        assert inst.name == "i0"
        self.log.append(("finished", r.id, self.env.now))

    def prefill_done(self, r, inst):
        assert inst.name == "i0"
        self.log.append(("prefill_done", r.id, self.env.now))

    def drained(self, inst):
        self.log.append(("drained", inst.name, self.env.now))


class _Known(CostModel):
    """0.25 s a step; 1000 FLOPs per new token; 10 bytes per KV token read (no vectorised decode_steps:
    the base class's generic one calls ``step``)."""

    def step(self, tokens, attn_work, kv_read_tokens, sampled, batch, swa=None):
        return StepCost(STEP, 1000.0 * tokens, 10.0 * kv_read_tokens)


def _inst(cost=None, blocks=100, role="both", policy=fcfs, limits=None, fast=None, bin_s=0.5,
          max_window=None):
    """An instance on a fresh environment; ``fast`` and ``max_window`` left at Instance's defaults if None."""
    env = simpy.Environment()
    sink = _Sink(env)
    kv = KVCache(blocks, 16)
    opts = {k: v for k, v in (("fast", fast), ("max_window", max_window)) if v is not None}
    inst = Instance(env, "i0", "p", role, cost or ConstantCost(STEP), kv, policy, limits or Limits(), 1,
                    sink, bin_s, **opts)
    inst.reserved_count = 0          # set by the topology
    return env, inst, sink


def _at(env, t, fn):
    """Call fn() at time t (a process of its own, as the topology's inputs are)."""
    def p():
        yield env.timeout(t - env.now)
        fn()
    env.process(p())


def _reserve_at(env, inst, t, other, tokens):
    """At time t, a KV transfer reserves blocks for ``tokens`` tokens of ``other`` on ``inst`` (as the
    topology does: settle the window first, then tell the instance its blocks were taken)."""
    def reserve():
        inst.sync()
        assert inst.kv.reserve(other, tokens)
        inst.blocks_taken()
    _at(env, t, reserve)


def _tokens(r):
    r.token_s = []
    return r


# --- a lone request ---------------------------------------------------------------------------------
@pytest.mark.parametrize("fast", [True, False])
def test_lone_request_steps_tokens_and_series_by_hand(fast):
    # prompt 14, output 6, 0.25 s steps: prefill 0-0.25 (token 1), decodes end 0.5 .. 1.5 -> finish 1.5;
    # the fast path: one window of k = 6 - 1 = 5 steps.  KV: 14 tokens = 1 block through the step computing
    # token 3 (16 tokens), 2 blocks from the step computing token 4 (17 tokens).
    # _Known: prefill 14 tokens -> 14,000 FLOPs, 14 KV tokens read -> 140 B; the decode giving token g reads
    # 14 + g - 1 tokens: 15 .. 19 -> 150 .. 190 B, 1000 FLOPs each.  Total 19,000 FLOPs, 140 + 850 = 990 B.
    env, inst, sink = _inst(_Known(), fast=fast)
    r = _tokens(Request(0, 0.0, 14, 6))
    inst.submit(r)
    env.run()
    assert r.status == FINISHED and r.first_token_s == 0.25 and r.finish_s == 1.5
    assert r.prefill_start_s == 0.0 and r.prefill_end_s == 0.25 and r.instance == "i0"
    assert r.token_s == [0.25, 0.5, 0.75, 1.0, 1.25, 1.5]
    assert r.computed == 19 and r.generated == 6 and r.blocks == 0
    assert sink.log == [("first", 0, 0.25), ("finished", 0, 1.5)]
    assert inst.steps == 6 and inst.busy_s == 1.5
    assert inst.flops == 19000.0 and inst.bytes == pytest.approx(990.0, abs=1e-9)
    assert inst.windows == (1 if fast else 0)
    assert inst.kv.peak_used == 2 and inst.kv.used_blocks == 0
    assert inst.outstanding_tokens == 0 and inst.decode_work == 0
    assert inst.running == [] and not inst.waiting
    # 0.5 s bins: steps starting 0, 0.25 | 0.5, 0.75 | 1.0, 1.25
    s = inst.series
    assert s.bin_s == 0.5
    assert s.steps == [2, 2, 2, 0] and s.batch_sum == [2, 2, 2, 0]   # a 4th bin: the last step ends on 1.5
    assert s.busy_s == [0.5, 0.5, 0.5, 0]
    assert s.flops == [15000.0, 2000.0, 2000.0, 0]
    assert s.bytes == pytest.approx([290.0, 330.0, 370.0, 0], abs=1e-9)
    assert s.kv_max == [1, 2, 2, 0] and s.queue_max == [0, 0, 0, 0]


@pytest.mark.parametrize("fast", [True, False])
def test_lone_request_in_one_wide_bin(fast):
    # the same run in 4 s bins: every step in bin 0 (the fast path's one-bin shortcut of record_many)
    env, inst, _ = _inst(_Known(), fast=fast, bin_s=4.0)
    inst.submit(Request(0, 0.0, 14, 6))
    env.run()
    s = inst.series
    assert s.steps == [6] and s.batch_sum == [6] and s.busy_s == [1.5]
    assert s.flops == [19000.0] and s.bytes == pytest.approx([990.0], abs=1e-9) and s.kv_max == [2]


@pytest.mark.parametrize("power, active", [
    ((1e-5, 1e-4), 0.14 + 0.015 + 0.016 + 0.017 + 0.018 + 0.019),   # the busier unit: FLOPs for the prefill,
    ((2e-5, 1e-4), 0.25 + 5 * 0.02),                                 # bytes / FLOPs for the decodes
    ((3e-4, 1e-4), 6 * 0.25),                                        # every step capped at its time
])
@pytest.mark.parametrize("fast", [True, False])
def test_active_seconds_take_the_busier_unit_capped_at_the_step(fast, power, active):
    # per step: min(0.25, max(FLOPs x power[0], bytes x power[1])); FLOPs and bytes as in the test above:
    # prefill 14,000 FLOPs / 140 B, decodes 1000 FLOPs / 150 .. 190 B.
    env, inst, _ = _inst(_Known(), fast=fast)
    inst.power = power
    inst.submit(Request(0, 0.0, 14, 6))
    env.run()
    assert inst.active_s == pytest.approx(active, abs=1e-12)


def test_a_request_after_a_finished_window_starts_at_its_arrival():
    # r0 (14, 3): prefill 0-0.25, a window of 2 to 0.75, done; the instance idles.  r1 (14, 3) arrives at
    # 1.0: prefill 1.0-1.25, a window of 2 to 1.75.
    env, inst, _ = _inst()
    r0, r1 = Request(0, 0.0, 14, 3), Request(1, 1.0, 14, 3)
    inst.submit(r0)
    _at(env, 1.0, lambda: inst.submit(r1))
    env.run()
    assert r0.finish_s == 0.75 and r1.prefill_start_s == 1.0 and r1.first_token_s == 1.25
    assert r1.finish_s == 1.75 and inst.windows == 2 and inst.steps == 6 and inst.busy_s == 1.5


class _PerRequest(CostModel):
    """0.25 s a step + 0.125 s per request in the batch + 0.0625 s per sampled token (an engine overhead)."""

    def step(self, tokens, attn_work, kv_read_tokens, sampled, batch, swa=None):
        return StepCost(STEP + 0.125 * batch + 0.0625 * sampled, 0.0, 0.0)


@pytest.mark.parametrize("fast", [True, False])
def test_step_cost_sees_the_batch_and_the_sampled_tokens(fast):
    # r0, r1 (14, 3) at 0: every step holds both and samples 2 tokens: 0.25 + 0.25 + 0.125 = 0.625 s;
    # prefill to 0.625, decodes to 1.25 and 1.875
    env, inst, _ = _inst(_PerRequest(), fast=fast)
    r0, r1 = _tokens(Request(0, 0.0, 14, 3)), _tokens(Request(1, 0.0, 14, 3))
    inst.submit(r0)
    inst.submit(r1)
    env.run()
    assert r0.token_s == r1.token_s == [0.625, 1.25, 1.875] and inst.busy_s == 1.875


def test_a_one_token_prompt_gets_its_first_token_from_its_prefill_step():
    # prompt 1, output 4: the prefill step (1 token, sampled) looks like a decode but gives the first
    # token: first token 0.25, then a window of 3 decodes -> finish 1.0
    env, inst, sink = _inst()
    r = Request(0, 0.0, 1, 4)
    inst.submit(r)
    env.run()
    assert r.first_token_s == 0.25 and r.finish_s == 1.0 and sink.log[0] == ("first", 0, 0.25)
    assert inst.steps == 4 and inst.windows == 1


def test_default_window_is_at_most_4096_steps():
    # Instance's defaults (the topology's: fast on, 4096-step windows): output 4099 -> 4098 decodes after
    # the prefill: a window of 4096, then one of 2; finish 4099 x 0.25 s
    env, inst, _ = _inst(blocks=300, bin_s=1024.0)        # 14 + 4098 tokens: 257 blocks
    r = Request(0, 0.0, 14, 4099)
    inst.submit(r)
    env.run()
    assert r.finish_s == 1024.75 and inst.steps == 4099 and inst.windows == 2


def test_max_window_caps_the_window_length():
    # output 10: 9 decodes after the prefill; windows of at most 4 steps: 4 + 4, then 1 step alone
    env, inst, _ = _inst(max_window=4)
    r = _tokens(Request(0, 0.0, 14, 10))
    inst.submit(r)
    env.run()
    assert r.finish_s == 2.5 and r.token_s == [0.25 * i for i in range(1, 11)]
    assert inst.windows == 2 and inst.steps == 10


class _Sliding(CostModel):
    """0.25 s a step plus (sliding work + sliding KV read) / 256 s; nothing for the full layers."""

    def step(self, tokens, attn_work, kv_read_tokens, sampled, batch, swa=None):
        return StepCost(STEP + (swa[0] + swa[1]) / 256, 0.0, 0.0)


@pytest.mark.parametrize("batch", [1, 2])
@pytest.mark.parametrize("fast", [True, False])
def test_sliding_window_steps_by_hand(fast, batch):
    # window W = 16, `batch` identical requests of prompt 14, output 6, all at 0.  Per request, a step's
    # sliding work = sum over its new tokens of (min(position, W) - 1/2) and its sliding KV read =
    # min(context, W); the step sums them over the batch.
    #   prefill: positions 1..14: 105 - 7 = 98, KV 14 -> 112 / 256 per request
    #   decode of token g (g = 2..6) at position 13 + g: min(13 + g, 16) = 15, 16, 16, 16, 16 ->
    #   work p - 1/2 plus KV p: 29.5, 31.5, 31.5, 31.5, 31.5 per request
    env, inst, _ = _inst(_Sliding(), limits=Limits(window=16), fast=fast)
    reqs = [_tokens(Request(i, 0.0, 14, 6)) for i in range(batch)]
    for r in reqs:
        inst.submit(r)
    env.run()
    t, want = 0.0, []
    for extra in (112, 29.5, 31.5, 31.5, 31.5, 31.5):
        t += STEP + batch * extra / 256
        want.append(t)
    for r in reqs:
        assert r.token_s == want and r.finish_s == 1.5 + batch * 267.5 / 256
    assert inst.busy_s == 1.5 + batch * 267.5 / 256 and inst.windows == (1 if fast else 0)


# --- windows cut (or not) by inputs -------------------------------------------------------------------------
@pytest.mark.parametrize("fast", [True, False])
def test_an_arrival_cuts_the_window_after_the_step_in_flight(fast):
    # r0 (14, 8) from 0: prefill 0-0.25, window of 7 (ends 0.5 .. 2.0).  r1 (14, 2) arrives at 0.6: the
    # window ends with the step in flight (0.5-0.75).  0.75-1.0: r1's prefill alone (fcfs admits, no decode);
    # 1.0-1.25: both decode (r1 has 1 left: no window), r1 done; r0 then has 4 left: window 1.25 .. 2.25.
    env, inst, sink = _inst(fast=fast)
    r0, r1 = _tokens(Request(0, 0.0, 14, 8)), _tokens(Request(1, 0.6, 14, 2))
    inst.submit(r0)
    _at(env, 0.6, lambda: inst.submit(r1))
    env.run()
    assert r0.token_s == [0.25, 0.5, 0.75, 1.25, 1.5, 1.75, 2.0, 2.25] and r0.finish_s == 2.25
    assert r1.token_s == [1.0, 1.25] and r1.first_token_s == 1.0 and r1.prefill_start_s == 0.75
    assert inst.steps == 9 and inst.busy_s == 2.25
    assert inst.windows == (2 if fast else 0)
    # r1 waited through the step 0.5-0.75 (bin 1); 2 requests in the step 1.0-1.25 (bin 2)
    s = inst.series
    assert s.queue_max == [0, 1, 0, 0, 0] and s.batch_sum == [2, 2, 3, 2, 1] and s.steps == [2, 2, 2, 2, 1]
    assert inst.outstanding_tokens == 0 and inst.decode_work == 0


@pytest.mark.parametrize("fast", [True, False])
def test_an_arrival_cuts_a_window_with_two_steps_left(fast):
    # r0 (14, 4): prefill 0-0.25, window of 3 (0.5, 0.75, 1.0).  r1 (14, 2) at 0.6: the step ending 0.5 is
    # done, two are left; the window ends with the one in flight (0.75).  r1's prefill 0.75-1.0 (token 1 at
    # 1.0), then both decode 1.0-1.25: both done at 1.25.
    env, inst, _ = _inst(fast=fast)
    r0, r1 = Request(0, 0.0, 14, 4), Request(1, 0.6, 14, 2)
    inst.submit(r0)
    _at(env, 0.6, lambda: inst.submit(r1))
    env.run()
    assert r1.first_token_s == 1.0 and r0.finish_s == r1.finish_s == 1.25
    assert inst.steps == 5 and inst.windows == (1 if fast else 0)


@pytest.mark.parametrize("fast", [True, False])
def test_an_arrival_behind_a_full_batch_does_not_cut_the_window(fast):
    # max_running 1: r1 (arriving 0.6) cannot start before r0 (14, 8) finishes at 2.0, so r0's one window
    # runs on; r1: prefill 2.0-2.25, one decode -> 2.5.  Queue seen by the steps 0.5-0.75 .. 1.75-2.0: 1.
    env, inst, _ = _inst(limits=Limits(max_running=1), fast=fast)
    r0, r1 = Request(0, 0.0, 14, 8), Request(1, 0.6, 14, 2)
    inst.submit(r0)
    _at(env, 0.6, lambda: inst.submit(r1))
    env.run()
    assert r0.finish_s == 2.0 and r1.first_token_s == 2.25 and r1.finish_s == 2.5
    assert inst.steps == 10 and inst.windows == (1 if fast else 0)
    assert inst.series.queue_max == [0, 1, 1, 1, 0, 0]


@pytest.mark.parametrize("fast", [True, False])
def test_window_stops_where_the_blocks_run_out_then_preempts_the_newest(fast):
    # 4 blocks.  r0, r1 (16, 20) both at 0: prefill together 0-0.25 (1 block each), the first decode grows
    # each to 2 blocks (17 tokens): the pool is full.  Decodes fit in 2 blocks up to 32 tokens: the step
    # computing token 17 (contexts 31 -> 32) is the last; the window holds the 16 steps ending 0.5 .. 4.25.
    # At 4.25 r0 needs a 3rd block: r1 (the newest) is preempted (32 tokens lost), r0 decodes alone
    # 4.25-4.5 (token 18), then a window of 2 (4.75, 5.0): r0 finished at 5.0 while r1 (33 tokens to
    # recompute: 3 blocks) waited for 3 free blocks.  r1: recompute 5.0-5.25 (token 18), window 5.5, 5.75.
    env, inst, _ = _inst(blocks=4, fast=fast)
    r0, r1 = _tokens(Request(0, 0.0, 16, 20)), _tokens(Request(1, 0.0, 16, 20))
    inst.submit(r0)
    inst.submit(r1)
    env.run()
    assert r0.finish_s == 5.0 and r1.finish_s == 5.75
    assert r0.preemptions == 0 and r1.preemptions == 1
    assert r0.recomputed_tokens == 0 and r1.recomputed_tokens == 32
    assert r1.token_s == [0.25 * i for i in range(1, 18)] + [5.25, 5.5, 5.75]
    assert inst.steps == 23 and inst.busy_s == 5.75
    assert inst.kv.peak_used == 4 and inst.kv.used_blocks == 0
    assert inst.windows == (3 if fast else 0)
    assert inst.outstanding_tokens == 0 and inst.decode_work == 0


@pytest.mark.parametrize("fast", [True, False])
def test_a_window_of_one_sure_step_is_not_opened(fast):
    # 2 blocks.  r0, r1 (15, 10) prefill together 0-0.25 (1 block each: the pool is full).  The decode
    # 0.25-0.5 fits (16 tokens), the next would need a 2nd block each: only one step is sure, no window.
    # At 0.5 r0 grows by preempting r1 (16 tokens lost) and decodes alone 0.5-0.75 (preempted plan: no
    # window); from 0.75 a window of 7 (context 18 .. 24 in 2 blocks) to 2.5, r0 done.  r1 (17 tokens
    # again: 2 blocks) recomputes 2.5-2.75 (token 3), then a window of 7: done at 4.5.
    env, inst, _ = _inst(blocks=2, fast=fast)
    r0, r1 = Request(0, 0.0, 15, 10), Request(1, 0.0, 15, 10)
    inst.submit(r0)
    inst.submit(r1)
    env.run()
    assert r0.finish_s == 2.5 and r1.finish_s == 4.5
    assert r1.preemptions == 1 and r1.recomputed_tokens == 16 and r0.preemptions == 0
    assert inst.steps == 18 and inst.kv.peak_used == 2 and inst.windows == (2 if fast else 0)


@pytest.mark.parametrize("fast", [True, False])
def test_a_window_of_exactly_two_sure_steps_is_opened(fast):
    # as above with prompts of 14: two decodes fit in 1 block each (15, 16 tokens): a window of 2 (0.5, 0.75).
    # At 0.75 r1 is preempted (16 lost), r0 decodes alone 0.75-1.0 (token 4), then a window of 6 (18 .. 23
    # tokens) to 2.5; r1 recomputes 17 tokens 2.5-2.75 (token 4) and decodes 6 more: done at 4.25.
    env, inst, _ = _inst(blocks=2, fast=fast)
    r0, r1 = Request(0, 0.0, 14, 10), Request(1, 0.0, 14, 10)
    inst.submit(r0)
    inst.submit(r1)
    env.run()
    assert r0.finish_s == 2.5 and r1.finish_s == 4.25
    assert r1.preemptions == 1 and r1.recomputed_tokens == 16
    assert inst.steps == 17 and inst.kv.peak_used == 2 and inst.windows == (3 if fast else 0)


@pytest.mark.parametrize("fast", [True, False])
def test_window_ends_where_one_free_block_cannot_serve_two_growths(fast):
    # 5 blocks.  r0, r1 (16, 30): prefill 0-0.25 (1 block each), the first decode grows both to 2 (free 1).
    # Up to 32 tokens they need nothing more (16 steps, to 4.25); the 17th needs 2 blocks, 1 is free: the
    # window holds 16.  At 4.25 r0 (older) takes the last block, r1 finds no younger victim and preempts
    # itself (32 tokens lost); r0 decodes alone 4.25-4.5, then 12 steps to 7.5 (33 .. 45 tokens: 3 blocks).
    # r1 recomputes 33 tokens (3 blocks) 7.5-7.75 (token 18), then 12 steps: done at 10.75.
    env, inst, _ = _inst(blocks=5, fast=fast)
    r0, r1 = Request(0, 0.0, 16, 30), Request(1, 0.0, 16, 30)
    inst.submit(r0)
    inst.submit(r1)
    env.run()
    assert r0.finish_s == 7.5 and r1.finish_s == 10.75
    assert r1.preemptions == 1 and r1.recomputed_tokens == 32 and r0.preemptions == 0
    assert inst.steps == 43 and inst.kv.peak_used == 5 and inst.windows == (3 if fast else 0)


# --- reading the state mid-window -------------------------------------------------------------------------
def test_mid_window_loads_sync_and_blocks_by_hand():
    # r0 (14, 10), r1 (14, 12) at 0: prefill together 0-0.25, then a window of 9 steps ending 0.5 .. 2.5.
    # Outstanding tokens: remaining 14 + 10 - 1 + 14 + 12 - 1 = 48, minus 28 prefilled = 20; decode work
    # 10 + 12 - 2 = 20.  At 1.1 three window steps have ended (0.5, 0.75, 1.0), none applied yet:
    # the loads count them (20 - 2 x 3 = 14) without settling; sync applies them (generated 4, computed 17)
    # and grows the blocks of the step in flight (18 tokens: 2 blocks each).
    env, inst, _ = _inst()
    r0, r1 = Request(0, 0.0, 14, 10), Request(1, 0.0, 14, 12)
    inst.submit(r0)
    inst.submit(r1)
    env.run(until=0.3)
    assert inst._win is not None and inst.load_tokens() == 20 and inst.load_decode() == 20
    env.run(until=1.1)
    assert r0.generated == 1 and inst.steps == 1          # nothing applied between events
    assert inst.load_tokens() == 14 and inst.load_decode() == 14
    assert inst.outstanding_tokens == 20 and inst.decode_work == 20
    assert inst.kv.used_blocks == 2
    inst.sync()
    assert (r0.generated, r0.computed, r1.generated, r1.computed) == (4, 17, 4, 17)
    assert inst.outstanding_tokens == 14 and inst.decode_work == 14
    assert inst.load_tokens() == 14 and inst.load_decode() == 14
    assert inst.steps == 4 and inst.busy_s == 1.0
    assert r0.blocks == r1.blocks == 2 and inst.kv.used_blocks == 4 and inst.kv.peak_used == 4
    inst.sync()                                            # idempotent
    assert r0.generated == 4 and inst.steps == 4 and inst.kv.used_blocks == 4
    env.run(until=2.4)                                     # 8 window steps ended
    assert inst.load_tokens() == 20 - 2 * 8
    env.run()
    # r0 done at 2.5; r1 has 2 left: a window 2.75, 3.0
    assert r0.finish_s == 2.5 and r1.finish_s == 3.0 and inst.steps == 12 and inst.windows == 2


def test_blocks_grown_in_two_settles_of_one_window():
    # r (14, 40): one window of 39 decodes from 0.25 to 10.0, contexts 15 .. 53 tokens: 1 block, then 2 (17
    # tokens), 3 (33), 4 (49).  A sync at 1.1 settles 3 steps and grows the step in flight (18 tokens: 2
    # blocks); the window's end grows the other 2: 4 at the peak, all given back at the finish.
    env, inst, _ = _inst()
    r = Request(0, 0.0, 14, 40)
    inst.submit(r)
    env.run(until=1.1)
    inst.sync()
    assert r.blocks == 2 and inst.kv.used_blocks == 2
    env.run()
    assert r.finish_s == 10.0 and inst.windows == 1
    assert inst.kv.peak_used == 4 and inst.kv.used_blocks == 0 and inst.kv.free_blocks == 100
    # 0.5 s bins: bin b ends with the window step j = 2b + 1 (it starts at 0.25 j), which holds 14 + j + 1
    # tokens: ceil((15 + 2b) / 16) blocks at its maximum; 20 bins to 10.0 s and an empty 21st
    assert inst.series.kv_max == [-(-(15 + 2 * b) // 16) for b in range(20)] + [0]


@pytest.mark.parametrize("prompt, kv", [(14, 1), (15, 2)])
def test_kv_maximum_of_steps_settled_by_a_sync_in_one_bin(prompt, kv):
    # 1 s bins; the window opens at 0.25; a sync at 0.9 settles its steps ending 0.5 and 0.75 (both in
    # bin 0), whose KV holds prompt + 1 and prompt + 2 tokens: 15, 16 -> 1 block; 16, 17 -> 2 blocks
    env, inst, _ = _inst(bin_s=1.0)
    inst.submit(Request(0, 0.0, prompt, 10))
    env.run(until=0.9)
    inst.sync()
    assert inst.series.steps == [3] and inst.series.kv_max == [kv]


@pytest.mark.parametrize("fast", [True, False])
def test_kv_maximum_of_a_bin_is_its_last_steps(fast):
    # prompt 15, output 6, 0.5 s bins: bin 0 holds the prefill (15 tokens) and the decode at 0.25 (16 tokens):
    # 1 block; the decode from 0.5 holds 17 tokens: 2 blocks from bin 1 on
    env, inst, _ = _inst(fast=fast)
    inst.submit(Request(0, 0.0, 15, 6))
    env.run()
    assert inst.series.kv_max == [1, 2, 2, 0]


def test_a_step_ending_exactly_now_is_still_in_flight_for_sync():
    # window of 9 steps from 0.25 (ends 0.5, 0.75, 1.0, ...); at exactly 1.0 only the steps ending 0.5 and
    # 0.75 are applied: the step ending at 1.0 is applied by its own event, as in the step-by-step loop
    env, inst, _ = _inst()
    r = Request(0, 0.0, 14, 10)
    inst.submit(r)
    env.run(until=1.0)
    inst.sync()
    assert r.generated == 3 and inst.steps == 3 and inst.load_tokens() == 9 - 2


def test_failure_mid_window_keeps_the_ended_steps_and_loses_the_rest():
    # r (14, 10): window from 0.25; the GPU fails at 1.1: the steps ending 0.5, 0.75, 1.0 happened
    # (4 tokens, 17 tokens computed), the one in flight is lost, and so is the KV: 17 tokens to recompute.
    # Back at 2.0 and re-submitted: it recomputes 14 + 4 = 18 tokens in one step 2.0-2.25 (token 5), then
    # a window of 5 -> finish 3.5.
    env, inst, sink = _inst()
    r = _tokens(Request(0, 0.0, 14, 10))
    inst.submit(r)
    lost = []
    _at(env, 1.1, lambda: lost.extend(inst.fail()))
    _at(env, 2.0, inst.recover)
    _at(env, 2.0, lambda: inst.submit(lost[0]))
    env.run(until=1.5)
    assert lost == [r] and inst.failed and inst.down and inst.epoch == 1
    assert r.generated == 4 and r.computed == 0 and r.blocks == 0 and r.recomputed_tokens == 17
    assert r.fault_hits == 1 and inst.steps == 4 and inst.busy_s == 1.0
    assert inst.kv.used_blocks == 0 and inst.outstanding_tokens == 0 and inst.decode_work == 0
    assert inst.running == [] and inst._win is None
    env.run()
    assert not inst.down
    assert r.finish_s == 3.5 and r.token_s == [0.25, 0.5, 0.75, 1.0, 2.25, 2.5, 2.75, 3.0, 3.25, 3.5]
    assert inst.steps == 10 and inst.windows == 2 and r.recomputed_tokens == 17
    assert inst.outstanding_tokens == 0 and inst.decode_work == 0


def test_two_failures_accumulate_lost_tokens_and_hits():
    # max_running 1: r0 (14, 10) decodes in a window from 0.25, r1 (14, 2) queued.
    # fail at 1.1: r0 had 4 tokens (17 computed): 17 lost; r1 moved.  Both back at 2.0 (r0 first):
    #   r0 recomputes 14 + 4 = 18 tokens 2.0-2.25 (token 5), window from 2.25 (ends 2.5 ...)
    # fail at 2.6: the step ending 2.5 happened (token 6, 19 computed): 17 + 19 = 36 lost in all.  Back at 3.0:
    #   r0 recomputes 20 tokens 3.0-3.25 (token 7), window 3.5, 3.75, 4.0 (done); r1 4.0-4.25, 4.25-4.5.
    env, inst, _ = _inst(limits=Limits(max_running=1))
    r0, r1 = Request(0, 0.0, 14, 10), Request(1, 0.0, 14, 2)
    inst.submit(r0)
    inst.submit(r1)
    lost = []

    def back():
        inst.recover()
        for r in lost:
            inst.submit(r)
        lost.clear()
    for t_fail, t_back in ((1.1, 2.0), (2.6, 3.0)):
        _at(env, t_fail, lambda: lost.extend(inst.fail()))
        _at(env, t_back, back)
    env.run()
    assert r0.fault_hits == 2 and r1.fault_hits == 2
    assert r0.recomputed_tokens == 36 and r1.recomputed_tokens == 0 and inst.epoch == 2
    assert r0.finish_s == 4.0 and r1.first_token_s == 4.25 and r1.finish_s == 4.5
    assert inst.steps == 4 + 2 + 6


def test_failure_of_a_queue_moves_the_waiting_requests():
    # max_running 1: r1 waits behind r0; a failure at 0.1 (mid-prefill of r0) returns both, r1 untouched
    env, inst, _ = _inst(limits=Limits(max_running=1))
    r0, r1 = Request(0, 0.0, 14, 3), Request(1, 0.0, 14, 3)
    inst.submit(r0)
    inst.submit(r1)
    lost = []
    _at(env, 0.1, lambda: lost.extend(inst.fail()))
    env.run(until=1.0)
    assert lost == [r0, r1] and r0.fault_hits == r1.fault_hits == 1
    assert r0.recomputed_tokens == 0 and r1.computed == 0 and inst.steps == 0 and not inst.waiting


def test_dropping_a_queued_request_cuts_the_window_and_its_load():
    # max_running 1: r0 (14, 10) decodes in a window from 0.25 (9 steps, to 2.5); r1 (14, 5) queued at 0.6
    # (no cut); dropped at 1.1: the window is cut after the step in flight (1.0-1.25), then a new window
    # of 5 (to 2.5).  r1's share (14 + 5 - 1 = 18 tokens, 5 output tokens) leaves the loads.
    env, inst, _ = _inst(limits=Limits(max_running=1))
    r0, r1 = Request(0, 0.0, 14, 10), Request(1, 0.6, 14, 5)
    inst.submit(r0)
    _at(env, 0.6, lambda: inst.submit(r1))
    got = []
    _at(env, 1.1, lambda: got.append((inst.drop(r1), inst.drop(r1))))
    env.run(until=0.7)
    assert inst.outstanding_tokens == 8 + 18 and inst.decode_work == 8 + 5   # r0: 1 window step applied at 0.6
    env.run()
    assert got == [(True, False)]
    assert r0.finish_s == 2.5 and inst.windows == 2 and inst.steps == 10
    assert inst.outstanding_tokens == 0 and inst.decode_work == 0 and r1.computed == 0


def test_dropping_a_running_request_mid_prefill_frees_its_blocks():
    # chunked prefill, 16-token budget: r0 (40, 3) computes 16 + 16 + 8; abandoned at 0.3 (its second chunk
    # in flight): its 2 blocks (32 tokens) come back at once, the step in flight changes nothing, and r1
    # (14, 2, arriving 0.4) is prefilled 0.5-0.75 and decodes 0.75-1.0.
    env, inst, _ = _inst(policy=chunked, limits=Limits(max_batched_tokens=16))
    r0, r1 = Request(0, 0.0, 40, 3), Request(1, 0.4, 14, 2)
    inst.submit(r0)

    def abandon():
        r0.status = ABANDONED
        assert inst.drop(r0)
    _at(env, 0.3, abandon)
    _at(env, 0.4, lambda: inst.submit(r1))
    env.run(until=0.35)
    assert inst.kv.used_blocks == 0 and inst.running == []
    assert inst.outstanding_tokens == 0 and inst.decode_work == 0
    env.run()
    assert r0.computed == 16 and r0.generated == 0 and r0.prefill_start_s == 0.0
    assert r1.prefill_start_s == 0.5 and r1.first_token_s == 0.75 and r1.finish_s == 1.0
    assert inst.steps == 4


def test_a_request_abandoned_mid_step_is_skipped_and_the_rest_of_the_step_applies():
    # r0 (40, 3) and r1 (14, 3) prefill together 0-0.25; r0's client gives up at 0.1: its blocks come back at
    # once and the step's end skips it, but r1's prefill in the same step still counts (token 1 at 0.25,
    # then 0.5, 0.75)
    env, inst, sink = _inst()
    r0, r1 = Request(0, 0.0, 40, 3), Request(1, 0.0, 14, 3)
    inst.submit(r0)
    inst.submit(r1)

    def abandon():
        r0.status = ABANDONED
        assert inst.drop(r0)
    _at(env, 0.1, abandon)
    env.run()
    assert r0.computed == 0 and r0.generated == 0 and r0.prefill_start_s != r0.prefill_start_s   # NaN
    assert r1.first_token_s == 0.25 and r1.finish_s == 0.75 and inst.steps == 3
    assert sink.log == [("first", 1, 0.25), ("finished", 1, 0.75)]


def test_speculative_pool_records_when_each_prefill_starts():
    # a speculative pool (verify steps, pdsim/speculative.py) on an idle instance: r0's prefill starts at
    # its arrival 0, r1's (arriving at 5.0, long after r0 is done) at 5.0.  (The topology turns the fast
    # path off in a speculative pool.)
    from pdsim.config import SpeculativeSpec
    from pdsim.speculative import Speculator
    env, inst, _ = _inst(fast=False)
    inst.spec = Speculator(SpeculativeSpec(k=3, acceptance=1.0, draft_cost_fraction=0.5), inst.cost, None, 0)
    r0, r1 = Request(0, 0.0, 14, 5), Request(1, 5.0, 14, 5)
    inst.submit(r0)
    _at(env, 5.0, lambda: inst.submit(r1))
    env.run()
    assert r0.status == r1.status == FINISHED and r0.finish_s < 5.0
    assert r0.prefill_start_s == 0.0 and r1.prefill_start_s == 5.0


# --- roles ------------------------------------------------------------------------------------------------
def test_prefill_role_hands_off_and_keeps_the_kv():
    # a prefill instance: the prompt's step gives token 1 at 0.25, then the request leaves the batch
    # (HANDOFF) holding its 2 blocks (20 tokens); no decode work is left here; no windows on this role
    env, inst, sink = _inst(role="prefill")
    r = Request(0, 0.0, 20, 5)
    inst.submit(r)
    assert inst.outstanding_tokens == 20 and inst.decode_work == 5
    env.run()
    assert r.status == HANDOFF and r.first_token_s == r.prefill_end_s == 0.25 and r.generated == 1
    assert sink.log == [("first", 0, 0.25), ("prefill_done", 0, 0.25)]
    assert inst.running == [] and inst.kv.used_blocks == 2 and r.blocks == 2
    assert inst.outstanding_tokens == 0 and inst.decode_work == 0 and inst.fast is False


def test_prefill_role_drop_takes_out_the_prompt_tokens_left():
    # prefill instance, batch of 1: r0 (20, 5) prefills 0-0.25; r1 (14, 5) queued behind it, dropped at 0.1:
    # a prefill instance's load is the prompt tokens left to compute (14), not the whole remaining (18)
    env, inst, _ = _inst(role="prefill", limits=Limits(max_running=1))
    r0, r1 = Request(0, 0.0, 20, 5), Request(1, 0.0, 14, 5)
    inst.submit(r0)
    inst.submit(r1)
    assert inst.outstanding_tokens == 34 and inst.decode_work == 10
    got = []
    _at(env, 0.1, lambda: got.append(inst.drop(r1)))
    env.run(until=0.2)
    assert got == [True] and inst.outstanding_tokens == 20 and inst.decode_work == 5 and not inst.waiting
    env.run()
    assert inst.outstanding_tokens == 0 and inst.decode_work == 0 and r0.status == HANDOFF


def test_prefill_role_drop_mid_prefill_takes_out_what_is_left_of_the_prompt():
    # prefill instance, chunks of 16: r (40, 3) computed 16 by 0.25; dropped at 0.3 (chunk 2 in flight):
    # the load drops by the 40 - 16 = 24 prompt tokens left, to 0, and its 2 blocks come back
    env, inst, _ = _inst(role="prefill", policy=chunked, limits=Limits(max_batched_tokens=16))
    r = Request(0, 0.0, 40, 3)
    inst.submit(r)

    def abandon():
        r.status = ABANDONED
        assert inst.drop(r)
    _at(env, 0.3, abandon)
    env.run(until=0.29)
    assert inst.outstanding_tokens == 24 and r.computed == 16
    env.run()
    assert inst.outstanding_tokens == 0 and inst.decode_work == 0 and inst.kv.used_blocks == 0


def _arrived(i, prompt, out, kv):
    """A prefilled request whose KV (prompt tokens) has reached this decode instance."""
    r = Request(i, 0.0, prompt, out, computed=prompt, generated=1)
    assert kv.reserve(r, prompt)
    return r


@pytest.mark.parametrize("fast", [True, False])
def test_decode_role_first_streamed_token_and_accept_mid_window(fast):
    # decode instance: r0 (14, 10) accepted at 0 decodes 9 tokens in a window ending 0.25 .. 2.25; r1 (14, 3)
    # accepted at 0.6: the window is cut after the step in flight (0.5-0.75); both decode 0.75-1.0 and
    # 1.0-1.25 (r1 done), then r0's 4 left: 1.5 .. 2.25.  decode_first_s: r0 0.25, r1 1.0.
    env, inst, _ = _inst(role="decode", fast=fast)
    r0 = _tokens(_arrived(0, 14, 10, inst.kv))
    r1 = _tokens(_arrived(1, 14, 3, inst.kv))
    inst.accept(r0)
    assert inst.outstanding_tokens == 9 and inst.decode_work == 9 and r0.decode_instance == "i0"
    _at(env, 0.6, lambda: inst.accept(r1))
    env.run()
    assert r0.decode_first_s == 0.25 and r1.decode_first_s == 1.0
    assert r0.token_s == [0.25 * i for i in range(1, 10)] and r1.token_s == [1.0, 1.25]
    assert r0.finish_s == 2.25 and r1.finish_s == 1.25
    assert inst.steps == 9 and inst.windows == (3 if fast else 0)
    assert inst.outstanding_tokens == 0 and inst.decode_work == 0


@pytest.mark.parametrize("taken, windows", [(1, 2), (2, 3)])
def test_blocks_taken_mid_window_cut_only_when_the_window_needs_them(taken, windows):
    # decode instance of 4 blocks; r0 (14, 20) arrived (1 block) decodes 19 tokens from 0: its window needs
    # ceil(33 / 16) - 1 = 2 more blocks by its last step (end 4.75).  At 0.6 a transfer reserves `taken`
    # blocks (sync first: the step in flight, computing token 4 at 17 tokens, has grown r0 to 2 blocks):
    #  - 1 block: 1 free = the 1 more the window needs: no cut; the window runs on until the reservation is
    #    given back at 2.0 (a cut, as _unreserve does: the step ending at 2.0 ends it), then a second window;
    #  - 2 blocks: 0 free: cut after the step in flight (0.75); the next window stops where 2 blocks are full
    #    (32 tokens, 15 steps); the reservation is given back at 2.0 (cut there too), and a third window runs
    #    to the end.  Either way r0 finishes at 19 x 0.25 = 4.75 and is never preempted.
    env, inst, _ = _inst(role="decode", blocks=4)
    r0 = _arrived(0, 14, 20, inst.kv)
    other = Request(9, 0.0, 16 * taken, 2)
    inst.accept(r0)

    def unreserve():
        inst.cut()
        inst.kv.release(other)
    _reserve_at(env, inst, 0.6, other, 16 * taken)
    _at(env, 2.0, unreserve)
    env.run(until=0.7)
    assert r0.blocks == 2 and inst.kv.used_blocks == 2 + taken and inst.kv.peak_used == 2 + taken
    env.run()
    assert r0.finish_s == 4.75 and r0.preemptions == 0 and inst.steps == 19
    assert inst.windows == windows and inst.kv.used_blocks == 0


def test_a_reservation_with_a_stuck_queue_does_not_cut_a_window_that_has_its_blocks():
    # max_running 1: r0 (14, 10) decodes in one window from 0.25 to 2.5 (needing 1 more block by its end);
    # r1 queued at 0.1.  At 0.6, 2 of the 98 free blocks are reserved from outside: the window still has its
    # block and the queue's head cannot start before r0 ends (no prefix cache): no cut, one window.
    env, inst, _ = _inst(limits=Limits(max_running=1))
    r0, r1 = Request(0, 0.0, 14, 10), Request(1, 0.1, 14, 2)
    other = Request(9, 0.0, 32, 2)
    inst.submit(r0)
    _at(env, 0.1, lambda: inst.submit(r1))

    _reserve_at(env, inst, 0.6, other, 32)
    env.run()
    assert r0.finish_s == 2.5 and r1.finish_s == 3.0 and inst.windows == 1


def test_a_reservation_of_every_free_block_does_not_cut_a_window_that_needs_none():
    # decode instance of 4 blocks; r0 (20, 10) arrived with 2 blocks (20 tokens): its 9 decodes reach 29
    # tokens, still 2 blocks, so its window (0.25 .. 2.25) needs no block.  At 0.6 a transfer reserves the
    # 2 free blocks: no cut, one window, done at 2.25.
    env, inst, _ = _inst(role="decode", blocks=4)
    r0 = _arrived(0, 20, 10, inst.kv)
    other = Request(9, 0.0, 32, 2)
    inst.accept(r0)

    _reserve_at(env, inst, 0.6, other, 32)
    env.run()
    assert r0.finish_s == 2.25 and inst.windows == 1 and inst.kv.free_blocks == 2 and r0.blocks == 0


def test_a_searched_window_with_blocks_to_spare_is_not_cut_by_a_reservation_of_them():
    # decode instance of 5 blocks; r0, r1 (16, 30) arrived with 1 block each; the first decode grows both to
    # 2 (17 tokens): 1 free.  Up to 32 tokens nothing more (the window, from 0, holds 16 steps to 4.0: it
    # grows no block).  At 1.1 a transfer reserves the free block: no cut.  At 4.0 r0 preempts r1 (32 lost)
    # for its 3rd block and decodes alone 4.0-4.25 (token 18), then a window of 12 to 7.25.  r1 (33 tokens:
    # 3 of the 4 blocks left) recomputes 7.25-7.5 (token 18), then 12 decodes to 10.5.
    env, inst, _ = _inst(role="decode", blocks=5)
    r0, r1 = _arrived(0, 16, 30, inst.kv), _arrived(1, 16, 30, inst.kv)
    other = Request(9, 0.0, 16, 2)
    inst.accept(r0)
    inst.accept(r1)

    _reserve_at(env, inst, 1.1, other, 16)
    env.run()
    assert r0.finish_s == 7.25 and r1.finish_s == 10.5 and r1.preemptions == 1 and r1.recomputed_tokens == 32
    assert inst.steps == 42 and inst.windows == 3 and inst.kv.used_blocks == 1


def test_a_searched_window_that_grows_a_block_is_cut_by_a_reservation_of_it():
    # decode instance of 5 blocks; r0 (16, 30) and r1 (20, 30) arrived (1 and 2 blocks); the first decode
    # grows r0 to 2: 1 free.  r1 needs a 3rd block from 33 tokens (its 13th window step), r0 from its 17th:
    # the window (from 0) holds 16 steps and grows 1 block.  At 1.1 a transfer takes that block: the window
    # is cut after the step in flight (1.0-1.25).  From 1.25 (contexts 21, 25, no block free) a window of 7
    # to 3.0; then r1 needs its 3rd block, finds no younger victim and preempts itself (32 lost); r0 decodes
    # alone 3.0-3.25 (token 14), then 16 steps (29 .. 45 tokens: one more block) to 7.25.  r1 recomputes
    # 20 + 13 = 33 tokens 7.25-7.5 (token 14), then 16 steps to 11.5.
    env, inst, _ = _inst(role="decode", blocks=5)
    r0, r1 = _arrived(0, 16, 30, inst.kv), _arrived(1, 20, 30, inst.kv)
    other = Request(9, 0.0, 16, 2)
    inst.accept(r0)
    inst.accept(r1)

    _reserve_at(env, inst, 1.1, other, 16)
    env.run()
    assert r0.finish_s == 7.25 and r1.finish_s == 11.5 and r1.preemptions == 1 and r1.recomputed_tokens == 32
    assert inst.steps == 46 and inst.windows == 4 and inst.kv.used_blocks == 1 and inst.kv.peak_used == 5


# --- idle, draining, paid time -------------------------------------------------------------------------
def test_a_draining_instance_reports_drained_when_empty():
    env, inst, sink = _inst()
    inst.draining = True
    inst.submit(Request(0, 0.0, 14, 2))
    env.run()
    # served (0.25, 0.5), then empty with no KV and no reservation: drained at 0.5
    assert sink.log == [("first", 0, 0.25), ("finished", 0, 0.5), ("drained", "i0", 0.5)]


def test_a_draining_instance_drained_when_its_stuck_queue_is_dropped():
    # 2 blocks: r (40-token prompt: 3 blocks) can never be admitted; the instance waits.  The client gives
    # up at 1.0: with the queue empty and nothing held, the draining instance is drained at once.
    env, inst, sink = _inst(blocks=2)
    inst.draining = True
    r = Request(0, 0.0, 40, 2)
    inst.submit(r)
    _at(env, 1.0, lambda: inst.drop(r))
    env.run()
    assert sink.log == [("drained", "i0", 1.0)] and inst.steps == 0


def test_paid_time_and_down_state():
    env, inst, _ = _inst()
    inst.alive_from_s, inst.alive_total_s = 2.0, 3.0
    assert inst.alive_s(5.0) == 6.0 and inst.alive_s(1.0) == 3.0
    inst.state = "off"
    assert inst.alive_s(5.0) == 3.0
    inst.set_down()
    assert inst.down
    inst.state = "serving"
    inst.set_down()
    assert not inst.down


# --- Series and _exact_delay, unit by unit ------------------------------------------------------------------
def test_series_record_spreads_a_step_over_the_bins_it_covers():
    s = Series(0.5)
    s.record(0.25, 0.5, 100.0, 10.0, 3, 2, 7)         # [0.25, 0.75): half in bin 0, half in bin 1
    assert s.busy_s == [0.25, 0.25] and s.flops == [50.0, 50.0] and s.bytes == [5.0, 5.0]
    assert s.steps == [1, 0] and s.batch_sum == [3, 0] and s.queue_max == [2, 0] and s.kv_max == [7, 0]
    s.record(0.75, 1.0, 40.0, 8.0, 1, 1, 5)           # [0.75, 1.75): 0.25 | 0.5 | 0.25 of it
    assert s.busy_s == [0.25, 0.5, 0.5, 0.25] and s.flops == [50.0, 60.0, 20.0, 10.0]
    assert s.bytes == [5.0, 7.0, 4.0, 2.0]
    assert s.steps == [1, 1, 0, 0] and s.queue_max == [2, 1, 0, 0] and s.kv_max == [7, 5, 0, 0]
    s.record(0.5, 0.25, 4.0, 2.0, 2, 4, 9)            # inside bin 1: the maxima rise, sums add
    assert s.busy_s[1] == 0.75 and s.flops[1] == 64.0 and s.bytes[1] == 9.0
    assert s.steps == [1, 2, 0, 0] and s.batch_sum == [3, 3, 0, 0] and s.queue_max[1] == 4 and s.kv_max[1] == 9
    s.record(0.5, 0.25, 0.0, 0.0, 1, 1, 1)            # lower queue / KV do not lower the maxima
    assert s.queue_max[1] == 4 and s.kv_max[1] == 9 and s.steps[1] == 3


def test_series_record_many_counts_each_bins_steps_and_last_kv():
    # 5 steps of 0.25 s from 0.25 in 0.5 s bins: starts 0.25 | 0.5, 0.75 | 1.0, 1.25; the first crosses
    # into bin 1 (ends 0.5: on the edge, all of it in bin 0); KV in use is 10 + position
    s = Series(0.5)
    starts = np.array([0.25, 0.5, 0.75, 1.0, 1.25])
    durs = np.full(5, 0.25)
    fl = np.array([1.0, 2.0, 3.0, 4.0, 5.0])
    by = np.array([10.0, 20.0, 30.0, 40.0, 50.0])
    s.record_many(starts, durs, fl, by, 3, 2, lambda pos: 10 + np.asarray(pos))
    assert s.steps == [1, 2, 2, 0] and s.batch_sum == [3, 6, 6, 0]
    assert s.busy_s == [0.25, 0.5, 0.5, 0] and s.flops == [1.0, 5.0, 9.0, 0] and s.bytes == [10.0, 50.0, 90.0, 0]
    assert s.kv_max == [10, 12, 14, 0] and s.queue_max == [2, 2, 2, 0]
    # a step across an edge (0.375 + 0.25): split 1/2 : 1/2 between bins 0 and 1
    s2 = Series(0.5)
    s2.record_many(np.array([0.125, 0.375]), np.array([0.25, 0.25]), np.array([8.0, 8.0]), np.array([4.0, 4.0]),
                   1, 0, lambda pos: np.asarray(pos) + 1)
    assert s2.busy_s == [0.375, 0.125] and s2.flops == [12.0, 4.0] and s2.bytes == [6.0, 2.0]
    assert s2.steps == [2, 0] and s2.kv_max == [2, 0]
    # one bin: the sums given are used as they are
    s3 = Series(4.0)
    s3.record_many(starts, durs, fl, by, 2, 1, lambda pos: 10 + np.asarray(pos), sums=(1.25, 15.0, 150.0))
    assert s3.steps == [5] and s3.batch_sum == [10] and s3.busy_s == [1.25] and s3.flops == [15.0]
    assert s3.bytes == [150.0] and s3.kv_max == [14] and s3.queue_max == [1]
    s3.record_many(starts, durs, fl, by, 2, 0, lambda pos: np.asarray(pos))    # lower maxima stay
    assert s3.kv_max == [14] and s3.queue_max == [1] and s3.busy_s == [2.5] and s3.flops == [30.0]


def test_series_record_many_few_steps_in_python_equal_numpys_bins():
    # windows over several bins: the Python path for a few steps and the numpy path give the same lists, value
    # and type (a bin no step lies wholly inside keeps its int 0), steps across edges spread alike
    class NumpySeries(Series):
        FEW_STEPS = 0

    rng = np.random.default_rng(7)
    for trial in range(200):
        n = int(rng.integers(2, 40))
        durs = rng.choice([0.05, 0.1, 0.125, 0.3, 0.7], n) * rng.uniform(0.5, 1.5, n) ** (trial % 2)
        t0 = float(rng.uniform(0, 3))
        starts = np.concatenate(([t0], t0 + np.cumsum(durs)[:-1]))
        fl = rng.uniform(0, 10, n) * (trial % 3 != 0)       # all-zero FLOPs a third of the time
        by = rng.uniform(0, 10, n)
        series = []
        for cls in (Series, NumpySeries):
            s = cls(0.5)
            s.record(0.0, 0.25, 1.0, 1.0, 1, 1, 1)
            s.record_many(starts.tolist() if cls is Series else starts, durs, fl, by, 3, 2,
                          lambda pos: 10 + np.asarray(pos))
            series.append(s)
        a, b = series
        for name in ("busy_s", "flops", "bytes", "steps", "batch_sum", "queue_max", "kv_max"):
            x, y = getattr(a, name), getattr(b, name)
            assert x == y and [type(v) for v in x] == [type(v) for v in y], (trial, name)


def test_series_coarsens_its_bins_at_max_bins():
    # 1 s bins; a step ending before 20,000 s keeps them, one ending at 20,000 s (bin 20,000) doubles them,
    # merging pairs: sums add, maxima take the larger
    s = Series(1.0)
    s.record(0.0, 1.0, 2.0, 4.0, 1, 3, 5)
    s.record(1.0, 1.0, 6.0, 8.0, 2, 1, 9)
    s.record(2.0, 1.0, 0.0, 0.0, 1, 7, 11)             # bin 2 (merged: 1) has the larger maxima
    s.record(19998.0, 1.5, 0.0, 0.0, 1, 0, 0)          # ends 19,999.5: bins stay 1 s
    assert s.bin_s == 1.0 and len(s.busy_s) == 20000
    s.record(19999.0, 1.0, 0.0, 0.0, 1, 0, 0)          # ends 20,000: 2 s bins
    assert s.bin_s == 2.0 and len(s.busy_s) == 10001
    assert s.busy_s[0] == 2.0 and s.flops[0] == 8.0 and s.bytes[0] == 12.0 and s.steps[0] == 2
    assert s.batch_sum[0] == 3 and s.queue_max[0] == 3 and s.kv_max[0] == 9
    assert s.queue_max[1] == 7 and s.kv_max[1] == 11 and s.busy_s[1] == 1.0
    for name in ("flops", "bytes", "steps", "batch_sum", "queue_max", "kv_max"):
        assert len(getattr(s, name)) == 10001, name
    # bins 19,998 (1 s of the 1.5 s step) and 19,999 (its last 0.5 s, and the 1 s step) merge into 9,999
    assert s.busy_s[9999] == 2.5 and s.steps[9999] == 2 and s.batch_sum[9999] == 2


def test_exact_delay_lands_on_the_target_float():
    # reachable targets: now + d == target exactly
    for now, target in ((0.1, 0.3), (1.5, 2.0), (0.7, 2.1), (3.0, 1e6 + 0.1)):
        d = _exact_delay(now, target)
        assert now + d == target and d >= 0.0, (now, target)
    assert _exact_delay(2.0, 2.0) == 0.0 and _exact_delay(2.0, 1.0) == 0.0     # never a negative delay
    # 0.29 has a bit below 0.955's last one: every now + d is a tie, rounded to even: 0.955 cannot be hit,
    # the delay lands one ulp from it
    now, target = 0.29, 0.955
    d = _exact_delay(now, target)
    assert abs((now + d) - target) == np.spacing(target)


def test_series_record_many_coarsens_at_max_bins():
    # 1 s bins: steps ending at 19,999.5 keep them; a window whose last step ends at 20,000 (bin 20,000)
    # doubles them first (two steps of 0.5 s from 19,999: both in merged bin 9,999)
    s = Series(1.0)
    s.record_many(np.array([19998.5, 19999.0]), np.array([0.5, 0.5]), np.zeros(2), np.zeros(2), 1, 0,
                  lambda pos: np.asarray(pos))
    assert s.bin_s == 1.0 and len(s.steps) == 20000 and s.steps[19998] == 1 and s.steps[19999] == 1
    s2 = Series(1.0)
    s2.record_many(np.array([19999.0, 19999.5]), np.array([0.5, 0.5]), np.zeros(2), np.zeros(2), 1, 0,
                   lambda pos: np.asarray(pos))
    assert s2.bin_s == 2.0 and len(s2.steps) == 10001 and s2.steps[9999] == 2 and s2.busy_s[9999] == 1.0


def test_series_spread_across_a_float_edge():
    # 43 x 0.1 == 4.3 in floats, but int(4.3 / 0.1) == 42: a step starting at 4.3 is exactly on the edge
    # of bin 43; all of its 0.05 s (and its FLOPs and bytes) belong to bin 43, none to bin 42
    assert 43 * 0.1 == 4.3 and int(4.3 / 0.1) == 42
    s = Series(0.1)
    s.record(4.3, 0.05, 10.0, 20.0, 1, 0, 0)
    assert len(s.busy_s) == 44 and sum(s.steps) == 1
    assert s.busy_s[42] == 0 and s.busy_s[43] == pytest.approx(0.05, abs=1e-15)
    assert s.flops[43] == pytest.approx(10.0) and s.bytes[43] == pytest.approx(20.0) and s.flops[42] == 0


def test_series_spread_from_a_float_edge_over_three_bins():
    # 0.1 s bins; a 0.25 s step starting at 4.3 (on the edge of bin 43: int(4.3 / 0.1) == 42) covers
    # [4.3, 4.4) in bin 43, [4.4, 4.5) in bin 44 and [4.5, 4.55) in bin 45: 0.1 + 0.1 + 0.05 s, and its FLOPs
    # (10) and bytes (20) in the same 2 : 2 : 1 shares; nothing in bin 42
    s = Series(0.1)
    s.record(4.3, 0.25, 10.0, 20.0, 1, 0, 0)
    assert len(s.busy_s) == 46 and s.busy_s[42] == 0 and s.flops[42] == 0 and sum(s.steps) == 1
    assert s.busy_s[43:] == pytest.approx([0.1, 0.1, 0.05], abs=1e-12)
    assert s.flops[43:] == pytest.approx([4.0, 4.0, 2.0], abs=1e-9)
    assert s.bytes[43:] == pytest.approx([8.0, 8.0, 4.0], abs=1e-9)


def test_a_failure_in_a_windows_last_step_keeps_every_step_before_it():
    # r (14, 10): prefill 0-0.25, a window of 9 decodes ending 0.5 .. 2.5.  At 2.4 the steps ending 0.5 .. 2.25
    # (8 of them) have happened: a sync applies all 8 (tokens 2 .. 9, 14 + 8 = 22 tokens computed) and only the
    # last step is in flight.  The GPU fails then: 22 tokens to recompute.  Back at 3.0 and re-submitted, the
    # request recomputes 14 + 9 = 23 tokens in one step 3.0-3.25, which gives its 10th and last token.
    env, inst, _ = _inst()
    r = _tokens(Request(0, 0.0, 14, 10))
    inst.submit(r)
    env.run(until=2.4)
    inst.sync()
    assert r.generated == 9 and r.computed == 22 and inst.steps == 9 and inst.busy_s == 2.25
    assert r.token_s == [0.25 * i for i in range(1, 10)] and inst.outstanding_tokens == 1
    lost = inst.fail()
    assert lost == [r] and r.recomputed_tokens == 22 and r.computed == 0 and r.generated == 9
    _at(env, 3.0, inst.recover)
    _at(env, 3.0, lambda: inst.submit(r))
    env.run()
    assert r.finish_s == 3.25 and r.token_s[-1] == 3.25 and len(r.token_s) == 10 and inst.steps == 10


def test_a_prefill_instance_re_prefilling_a_request_with_tokens_keeps_its_loads_by_hand():
    # A decode instance failed after streaming 3 tokens of r0 (20, 5): the request comes back to a prefill
    # instance with computed 0, generated 3, and must prefill 20 + 3 = 23 tokens.  r1 (14, 5) is new.  Both are
    # admitted into one step (fcfs: 37 tokens), r0 first.  Loads on submit: tokens 23 + 14 = 37 (the prompt
    # tokens left), decode work (5 - 3) + 5 = 7.  At the step's end (0.25):
    #   r0: token 4, not its last: handed off (tokens 37 - 23 = 14 left, decode work 7 - 1 - (5 - 4) = 5);
    #   r1: token 1 (tokens 14 - 14 = 0, decode work 5 - 1 = 4), then handed off (4 - (5 - 1) = 0).
    # The sink reads the loads at each callback (a callback may route a new request, which reads them).
    env, inst, sink = _inst(role="prefill")
    seen = []
    sink.first_token = lambda r: seen.append(("first", r.id, inst.outstanding_tokens, inst.decode_work))
    sink.prefill_done = lambda r, i: seen.append(("handoff", r.id, inst.outstanding_tokens, inst.decode_work))
    r0, r1 = Request(0, 0.0, 20, 5, generated=3), Request(1, 0.0, 14, 5)
    inst.submit(r0)
    inst.submit(r1)
    assert inst.outstanding_tokens == 37 and inst.decode_work == 7
    env.run()
    assert seen == [("handoff", 0, 14, 5), ("first", 1, 0, 4), ("handoff", 1, 0, 0)]
    assert r0.status == r1.status == HANDOFF and r0.generated == 4 and r0.computed == 23
    assert r0.first_token_s != r0.first_token_s and r1.first_token_s == 0.25      # r0's first token was earlier
    assert inst.outstanding_tokens == 0 and inst.decode_work == 0 and inst.steps == 1
