"""A step worked by hand: its aggregates from the two policies, and what applying it does.

The cost model prices a step from four sums the scheduler builds (pdsim/scheduler.py): new tokens,
attention work (each new token attends to the cache before it and to the new tokens before it:
n (c + n/2) for a request at c computed tokens taking n), KV read (c + n) and sampled rows (requests
whose step reaches their known tokens).  The running batch's sums are built by an inlined copy of
``StepPlan.add`` (it runs for every request of every step), so these tests pin both copies.
"""
from __future__ import annotations

from collections import deque

import pytest
import simpy

from pdsim.costmodel import ConstantCost
from pdsim.instance import Instance
from pdsim.kvcache import KVCache, PrefixKVCache
from pdsim.scheduler import Limits, SlidingStepPlan, chunked, fcfs, inflight
from pdsim.workload import Request


def _req(rid: int, prompt: int, output: int, generated: int = 0, computed: int = 0, blocks: int = 0) -> Request:
    r = Request(rid, 0.0, prompt, output)
    r.generated, r.computed, r.blocks = generated, computed, blocks
    return r


def _batch(free: int = 100):
    # A: decoding (prompt 10, 3 tokens out, 12 computed: one new token at c = 12), 1 block of 16
    # B: a prompt of 200 mid-way (64 computed: chunked prefill), 4 blocks
    a = _req(1, 10, 8, generated=3, computed=12, blocks=1)
    b = _req(2, 200, 4, computed=64, blocks=4)
    kv = KVCache(total_blocks=5 + free, block_size=16)
    kv.free_blocks = free
    return a, b, kv


def _sums(plan):
    return plan.tokens, plan.attn_work, plan.kv_read_tokens, plan.sampled


def test_chunked_budget_spent_by_the_running_batch_admits_nothing():
    a, b, kv = _batch()
    c = _req(3, 50, 5)
    running, waiting = [a, b], deque([c])
    plan = chunked(running, waiting, kv, Limits(max_running=8, max_batched_tokens=100))
    # A: n 1, work 1 (12 + 0.5) = 12.5, read 13, sampled (13 = 10 + 3 known)
    # B: n = min(200 - 64, 100 - 1) = 99, work 99 (64 + 49.5) = 11236.5, read 163, not sampled (163 < 200)
    assert [(r.id, n) for r, n in plan.items] == [(1, 1), (2, 99)]
    assert _sums(plan) == (100, 12.5 + 11236.5, 13 + 163, 1)
    # B grew from 4 to ceil(163 / 16) = 11 blocks; A's 13th token stays in its first block; C still waits
    assert (a.blocks, b.blocks, kv.free_blocks) == (1, 11, 93)
    assert list(waiting) == [c] and running == [a, b]


def test_chunked_fills_the_rest_of_the_budget_with_an_admitted_prompt():
    a, b, kv = _batch()
    c = _req(3, 50, 5)
    running, waiting = [a, b], deque([c])
    plan = chunked(running, waiting, kv, Limits(max_running=8, max_batched_tokens=200))
    # A as above; B: its last 136 prompt tokens, work 136 (64 + 68) = 17952, read 200, sampled (its first token);
    # budget left 200 - 137 = 63: C's whole prompt of 50, work 50 (0 + 25) = 1250, read 50, sampled
    assert [(r.id, n) for r, n in plan.items] == [(1, 1), (2, 136), (3, 50)]
    assert _sums(plan) == (187, 12.5 + 17952 + 1250, 13 + 200 + 50, 3)
    assert running == [a, b, c] and not waiting
    assert (b.blocks, c.blocks) == (13, 4)          # ceil(200 / 16), ceil(50 / 16)


def test_fcfs_admits_whole_prompts_first_and_stalls_the_decodes():
    a, b, kv = _batch()
    c = _req(3, 50, 5)
    plan = fcfs([a, b], deque([c]), kv, Limits(max_running=8, max_batched_tokens=8192))
    assert [(r.id, n) for r, n in plan.items] == [(3, 50)]
    assert _sums(plan) == (50, 1250.0, 50, 1)
    # nothing waiting: every running request takes all it has left (B its 136 prompt tokens at once)
    a, b, kv = _batch()
    plan = fcfs([a, b], deque(), kv, Limits(max_running=8, max_batched_tokens=8192))
    assert [(r.id, n) for r, n in plan.items] == [(1, 1), (2, 136)]
    assert _sums(plan) == (137, 12.5 + 17952, 13 + 200, 2)


def test_a_request_that_cannot_grow_preempts_the_newest_unscheduled_then_itself():
    # pool of 7 blocks, all held: A 1, B 4, D 2 (D: prompt 30, 1 token out, 30 computed, its 31st in block 2).
    # B needs ceil(163 / 16) - 4 = 7 more: D (newest, not yet in the step) gives back 2, still short; A is
    # already in the step, so B goes itself.  Both lose their KV (lost 30 + 64 = 94 tokens) and rejoin the
    # queue's front, B ahead of D; with a preemption no prompt is admitted
    a, b, _ = _batch()
    d = _req(4, 30, 6, generated=1, computed=30, blocks=2)
    kv = KVCache(total_blocks=7, block_size=16)
    kv.free_blocks = 0
    c = _req(3, 5, 5)
    running, waiting = [a, b, d], deque([c])
    plan = chunked(running, waiting, kv, Limits(max_running=8, max_batched_tokens=100))
    assert [(r.id, n) for r, n in plan.items] == [(1, 1)]
    assert _sums(plan) == (1, 12.5, 13, 1)
    assert plan.preempted == [d, b] and plan.lost_tokens == 30 + 64
    assert running == [a] and list(waiting) == [b, d, c]
    assert (b.blocks, d.blocks, b.computed, d.computed, kv.free_blocks) == (0, 0, 0, 0, 6)
    assert (b.preemptions, d.preemptions, b.recomputed_tokens, d.recomputed_tokens) == (1, 1, 64, 30)


def test_a_growth_that_fits_takes_exactly_the_missing_blocks():
    # the same batch with 7 free blocks: B takes them all, nobody is preempted
    a, b, kv = _batch(free=7)
    plan = fcfs([a, b], deque(), kv, Limits(max_running=8, max_batched_tokens=8192))
    # fcfs gives B all 136 of its prompt: ceil(200 / 16) = 13 blocks, 9 more than it holds: short by 2
    assert plan.preempted == [b] and [(r.id, n) for r, n in plan.items] == [(1, 1)]
    a, b, kv = _batch(free=7)
    plan = chunked([a, b], deque(), kv, Limits(max_running=8, max_batched_tokens=100))
    assert not plan.preempted and (b.blocks, kv.free_blocks) == (11, 0)


def test_chunked_cuts_a_chunk_one_token_short_of_the_prompt_to_the_budget():
    # budget 136: A takes 1, B's remaining 136 is one more than the 135 left: 135 (work 135 (64 + 67.5) = 17752.5,
    # read 199, no token yet); a budget of 137 would finish its prompt
    a, b, kv = _batch()
    plan = chunked([a, b], deque(), kv, Limits(max_running=8, max_batched_tokens=136))
    assert [(r.id, n) for r, n in plan.items] == [(1, 1), (2, 135)]
    assert _sums(plan) == (136, 12.5 + 17752.5, 13 + 199, 1)


def test_inflight_admits_whole_prompts_after_the_decodes_while_they_fit():
    # TRT-LLM in-flight batching: A decodes first (1 token: 12.5 work, 13 read, sampled), budget 100 - 1 = 99 left;
    # C's whole prompt of 50 fits (work 50 x 25 = 1250, read 50, sampled its first token), 49 left; D's 60 does
    # not fit and is not chunked: admission stops there.  C takes ceil(50 / 16) = 4 blocks of the 100 free
    a, _, kv = _batch()
    c, d = _req(3, 50, 5), _req(4, 60, 5)
    running, waiting = [a], deque([c, d])
    plan = inflight(running, waiting, kv, Limits(max_running=8, max_batched_tokens=100))
    assert [(r.id, n) for r, n in plan.items] == [(1, 1), (3, 50)]
    assert _sums(plan) == (51, 12.5 + 1250, 13 + 50, 2)
    assert running == [a, c] and list(waiting) == [d] and (c.blocks, kv.free_blocks) == (4, 96)
    # a budget of 2: A takes 1, the 1 token left still admits a one-token prompt (work 0.5, read 1, sampled)
    a, _, kv = _batch()
    e = _req(5, 1, 3)
    plan = inflight([a], deque([e]), kv, Limits(max_running=8, max_batched_tokens=2))
    assert [(r.id, n) for r, n in plan.items] == [(1, 1), (5, 1)] and _sums(plan) == (2, 13.0, 14, 2)


def test_inflight_preempts_the_newest_decode_and_admits_nothing_that_step():
    # a 3-block pool, all held: A (prompt 16, 1 out, 16 computed: its 17th token needs a 2nd block) and D
    # (prompt 20, 1 out, 20 computed, 2 blocks).  A cannot grow: D, the newest, gives back its 2 blocks (20 tokens
    # lost) and goes to the queue's front; A takes one (work 16.5, read 17, sampled), 1 block free; no admission
    a = _req(1, 16, 4, generated=1, computed=16, blocks=1)
    d = _req(4, 20, 4, generated=1, computed=20, blocks=2)
    kv = KVCache(total_blocks=3, block_size=16)
    kv.free_blocks = 0
    c = _req(3, 5, 5)
    running, waiting = [a, d], deque([c])
    plan = inflight(running, waiting, kv, Limits(max_running=8, max_batched_tokens=100))
    assert [(r.id, n) for r, n in plan.items] == [(1, 1)] and _sums(plan) == (1, 16.5, 17, 1)
    assert plan.preempted == [d] and plan.lost_tokens == 20
    assert running == [a] and list(waiting) == [d, c] and (a.blocks, d.blocks, kv.free_blocks) == (2, 0, 1)


def test_inflight_runs_a_prompt_larger_than_the_budget_alone():
    # nothing running: E's 200-token prompt exceeds the 100-token budget and runs whole, alone (work 200 x 100),
    # F waits for the next step
    _, _, kv = _batch()
    e, f = _req(5, 200, 2), _req(6, 10, 2)
    running, waiting = [], deque([e, f])
    plan = inflight(running, waiting, kv, Limits(max_running=8, max_batched_tokens=100))
    assert [(r.id, n) for r, n in plan.items] == [(5, 200)] and _sums(plan) == (200, 20000.0, 200, 1)
    assert running == [e] and list(waiting) == [f]


def test_inflight_step_of_a_sliding_window_model_sums_the_window_by_hand():
    # window W = 4, a 6-token prompt from c = 0: positions 1..6, min(p, 4) = 1, 2, 3, 4, 4, 4: sum 18, work
    # 18 - 6 / 2 = 15; the sliding layers read min(6, 6 + 4 - 1) = 6 KV tokens
    _, _, kv = _batch()
    plan = inflight([], deque([_req(7, 6, 2)]), kv, Limits(max_running=8, max_batched_tokens=100, window=4))
    assert isinstance(plan, SlidingStepPlan) and plan.swa == (15.0, 6)
    assert _sums(plan) == (6, 18.0, 6, 1)


def test_full_reservation_takes_the_whole_final_kv_at_admission():
    # kv_reservation full: a request's KV at the end is prompt + output - 1 = 16 + 2 - 1 = 17 tokens (the last
    # token is never cached) = 2 blocks of 16, taken at admission from a 2-block pool; one block more, none left
    for policy in (fcfs, chunked, inflight):
        kv = KVCache(total_blocks=2, block_size=16)
        r = _req(8, 16, 2)
        plan = policy([], deque([r]), kv, Limits(max_running=8, max_batched_tokens=100, reserve_full=True))
        assert [(x.id, n) for x, n in plan.items] == [(8, 16)], policy
        assert (r.blocks, kv.free_blocks) == (2, 0), policy


def test_a_preempted_request_readmitted_recomputes_its_generated_tokens_and_samples():
    # P was preempted after 2 output tokens: back in the queue with 0 computed, it knows 10 + 2 = 12 tokens.
    # Readmitted, it recomputes all 12 (work 12 x 6 = 72, read 12) and that step samples its third token
    p = _req(9, 10, 5, generated=2)
    _, _, kv = _batch()
    plan = fcfs([], deque([p]), kv, Limits(max_running=8, max_batched_tokens=100))
    assert [(r.id, n) for r, n in plan.items] == [(9, 12)] and _sums(plan) == (12, 72.0, 12, 1)


@pytest.mark.parametrize("policy", [fcfs, chunked, inflight])
def test_a_prefix_pool_never_evicts_a_request_already_in_the_step(policy):
    # the prefix pool's own path (every running request goes through grow): 5 blocks of 4 tokens; A and B (no
    # hash ids) hold 2 full blocks each (8 tokens computed, prompt 7 + 2 generated = 9 known) and need a third;
    # one block is free.  A (oldest) takes it; B finds no victim outside the step (A is in it) and gives up its
    # own 2 blocks: 8 tokens lost, 2 blocks free, B back in the queue
    kv = PrefixKVCache(5, 4, 0.0)
    a, b = Request(0, 0.0, 7, 100), Request(1, 1.0, 7, 100)
    for r in (a, b):
        r.computed, r.generated = 8, 2
        assert kv.grow(r, 8)
    running, waiting = [a, b], deque()
    plan = policy(running, waiting, kv, Limits(max_running=8, max_batched_tokens=64))
    assert [(r.id, n) for r, n in plan.items] == [(0, 1)] and plan.preempted == [b] and plan.lost_tokens == 8
    assert (a.computed, a.blocks, b.blocks, kv.free_blocks) == (8, 3, 0, 2) and list(waiting) == [b]


class _Sink:
    """Records the instance's load counters at each callback (a router reads them there)."""
    def __init__(self):
        self.seen = []
        self.inst = None

    def first_token(self, req):
        self.seen.append(("first", req.id, self.inst.outstanding_tokens, self.inst.decode_work))

    def finished(self, req, inst):
        self.seen.append(("done", req.id, inst.outstanding_tokens, inst.decode_work))

    def prefill_done(self, req, inst):
        self.seen.append(("handoff", req.id, inst.outstanding_tokens, inst.decode_work))


def _run(role: str, fast: bool):
    env = simpy.Environment()
    sink = _Sink()
    inst = Instance(env, "i0", "pool", role, ConstantCost(0.1), KVCache(100, 16), chunked,
                    Limits(max_running=8, max_batched_tokens=64), 1, sink, 1.0, fast=fast)
    sink.inst = inst
    r1, r2 = Request(1, 0.0, 4, 2), Request(2, 0.0, 4, 3)
    inst.submit(r1)
    inst.submit(r2)
    env.run()
    return inst, sink.seen, (r1, r2)


def test_load_counters_are_current_at_every_callback():
    # outstanding = tokens still to compute (prompt + output - 1 - computed): 5 + 6 = 11; decode work = tokens
    # still to emit: 2 + 3 = 5.  Step 1 prefills both (4 tokens each, a first token each): at R1's callback
    # 11 - 4 = 7 and 5 - 1 = 4 (R2 not applied yet), at R2's 3 and 3.  Step 2: R1's second token finishes it
    # (2 and 2 at its callback, R2's token after it), step 3 R2's third (0 and 0).  Fast path or not.
    for fast in (True, False):
        inst, seen, (r1, r2) = _run("both", fast)
        assert seen == [("first", 1, 7, 4), ("first", 2, 3, 3), ("done", 1, 2, 2), ("done", 2, 0, 0)], fast
        assert (r1.finish_s, r2.finish_s) == (0.2, 0.30000000000000004)
        assert (inst.outstanding_tokens, inst.decode_work, inst.kv.free_blocks) == (0, 0, 100)


def test_a_prefill_instance_hands_off_with_the_decode_work_gone():
    # role prefill: outstanding counts prompt tokens only (4 + 4 = 8); after its first token a request leaves
    # with its remaining output (R1 1, R2 2) off the decode work (5 - 1 - 1 = 3, then 3 - 1 - 2 = 0); its KV
    # stays held (1 block each) until the transfer
    inst, seen, _ = _run("prefill", False)
    assert seen == [("first", 1, 4, 4), ("handoff", 1, 4, 3), ("first", 2, 0, 2), ("handoff", 2, 0, 0)]
    assert inst.running == [] and inst.kv.free_blocks == 98
