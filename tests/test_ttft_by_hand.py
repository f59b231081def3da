"""TTFT mechanisms worked by hand: TensorRT-LLM's in-flight batching without chunked prefill (``scheduler: inflight``).

Every expected value below is computed in the comments, step by step, not read off a run."""
from __future__ import annotations

from collections import deque

import pytest

from pdsim.kvcache import KVCache
from pdsim.scheduler import SCHEDULERS, Limits
from pdsim.workload import Request


# --- TensorRT-LLM in-flight batching without chunked prefill -----------------------------------------------
def _decoding(rid, prompt, kv):
    """A request that has its prompt's KV and one output token: its next step is a 1-token decode."""
    q = Request(rid, 0.0, prompt, 10)
    assert kv.grow(q, prompt + 1)
    q.computed, q.generated = prompt, 1
    return q


def _state():
    kv = KVCache(1000, 16)
    running = [_decoding(1, 10, kv), _decoding(2, 10, kv)]
    waiting = deque([Request(3, 0.0, 60, 5), Request(4, 0.0, 50, 5), Request(5, 0.0, 5, 5)])
    return running, waiting, kv, Limits(max_running=256, max_batched_tokens=100)


def _plan(name):
    running, waiting, kv, limits = _state()
    plan = SCHEDULERS[name](running, waiting, kv, limits)
    return [(q.id, n) for q, n in plan.items], plan.tokens


def test_inflight_decodes_first_then_whole_prompts_until_one_does_not_fit():
    """Budget 100, two running decodes, waiting prompts of 60, 50 and 5 tokens (in that order).

    - inflight: decodes 1 + 1 (98 left); the 60-token prompt fits whole (38 left); the 50-token one
      does not and stops admission, so the 5-token prompt behind it waits too: 62 tokens.
    - chunked (vLLM v1): the same, but the 50-token prompt gets a 38-token chunk: 100 tokens.
    - fcfs (prefill first): prompts only, 60 (40 left), then 50 > 40 stops: 60 tokens, no decode."""
    assert _plan("inflight") == ([(1, 1), (2, 1), (3, 60)], 62)
    assert _plan("chunked") == ([(1, 1), (2, 1), (3, 60), (4, 38)], 100)
    assert _plan("fcfs") == ([(3, 60)], 60)


def test_inflight_prompt_over_the_budget_runs_alone_and_waits_behind_decodes():
    """A 150-token prompt with a 100-token budget: with a running decode it cannot join (150 > 99) and the
    step is the decode alone; with nothing running it runs whole, alone (TensorRT-LLM would refuse a
    context over max_num_tokens; pdsim, as for fcfs, runs it alone rather than never)."""
    kv = KVCache(1000, 16)
    limits = Limits(max_running=256, max_batched_tokens=100)
    big = Request(9, 0.0, 150, 5)
    running, waiting = [_decoding(1, 10, kv)], deque([big])
    plan = SCHEDULERS["inflight"](running, waiting, kv, limits)
    assert [(q.id, n) for q, n in plan.items] == [(1, 1)] and list(waiting) == [big]
    plan = SCHEDULERS["inflight"]([], deque([big]), kv, limits)
    assert [(q.id, n) for q, n in plan.items] == [(9, 150)] and plan.tokens == 150


def test_inflight_is_a_pool_scheduler(tmp_path):
    """``scheduler: inflight`` parses and runs: one client, linear cost 1 ms per token, 100-token prompts and
    4 output tokens: TTFT = 100 ms (the whole prompt in one step), TPOT = 1 ms (one token per decode step)."""
    from pdsim import config
    from pdsim.simulation import simulate
    sc = config.parse({"model": "llama-3.1-8b",
                       "workload": {"arrival": "closed", "clients": 1, "num_requests": 3, "prompt_tokens": 100,
                                    "output_tokens": 4},
                       "topologies": {"t": {"kind": "colocated", "scheduler": "inflight",
                                            "cost_model": {"kind": "linear", "per_token_s": 0.001}}}}, "t")
    assert sc.topologies["t"].scheduler_name == "inflight"
    for q in simulate(sc)[0].requests:
        assert q.first_token_s - q.arrival_s == pytest.approx(0.100)
        assert (q.finish_s - q.first_token_s) / 3 == pytest.approx(0.001)
