"""TensorRT-LLM's batch waiting (a TP pool's ``batch_wait``, scheduler.BatchWait): while decodes run, new prompts
wait until the step would carry max_tokens_ratio x the token budget (decodes + the prompts it would admit,
counted whole) or timeout_iters such steps have held them.

Oracle: exact timelines by hand with a constant cost model (every step 1 s), the rule as TensorRT-LLM's
``_waiting_requests`` states it (the count grows on each held step and restarts when prompts go).
"""
from __future__ import annotations

import pytest

from pdsim import config, metrics
from pdsim.errors import ConfigError
from pdsim.simulation import simulate
from pdsim.validate import harness_engine_config

from conftest import run_trace


def _run(tmp_path, rows, wait, budget=100, scheduler="inflight", **extra):
    pool = {"kv_blocks": 1000, "cost_model": {"kind": "constant", "step_s": 1.0},
            "scheduler": scheduler, "max_batched_tokens": budget, **extra}
    if wait is not None:
        pool["batch_wait"] = wait
    return run_trace(tmp_path, "llama-3.1-8b", pool, rows)


def test_a_prompt_beside_decodes_waits_the_timeout_by_hand(tmp_path):
    """A (10 in, 20 out) alone at 0: no decode, it goes (first token 1).  B (10 in) at 1.5: the step at t=2
    would carry 1 + 10 = 11 < 0.5 x 100 tokens, so B waits at t=2, 3, 4 (count 1, 2, 3) and goes at t=5 when
    the count has reached timeout 3: first token 6 (without batch waiting: 3)."""
    rows = ["0,10,20", "1.5,10,3"]
    reqs, res = _run(tmp_path, rows, {"timeout_iters": 3, "max_tokens_ratio": 0.5})
    assert [r.first_token_s for r in reqs] == [1.0, 6.0]
    plain, _ = _run(tmp_path, rows, None)
    assert [r.first_token_s for r in plain] == [1.0, 3.0]
    pool = metrics.summarize([res], metrics.requests_frame([res]), res.scenario)["t"]["pools"]["replica"]
    assert pool["batch_wait"] == {"timeout_iters": 3, "max_tokens_ratio": 0.5, "steps_held": 3}


def test_prompts_go_once_the_step_is_full_enough_by_hand(tmp_path):
    """Five 10-token prompts at 1.5 beside A's decode: 1 + 50 = 51 >= 50 tokens: they go at t=2 (first token 3);
    four of them (41 < 50) wait for the timeout (t=5, first token 6).  A fifth arriving at 3.5 makes the step
    at t=4 carry 51: all go at t=4 (first token 5) and the count restarts."""
    reqs, _ = _run(tmp_path, ["0,10,20"] + ["1.5,10,3"] * 5, {"timeout_iters": 3, "max_tokens_ratio": 0.5})
    assert [r.first_token_s for r in reqs[1:]] == [3.0] * 5
    reqs, _ = _run(tmp_path, ["0,10,20"] + ["1.5,10,3"] * 4, {"timeout_iters": 3, "max_tokens_ratio": 0.5})
    assert [r.first_token_s for r in reqs[1:]] == [6.0] * 4
    reqs, _ = _run(tmp_path, ["0,10,20"] + ["1.5,10,3"] * 4 + ["3.5,10,3"], {"timeout_iters": 3,
                                                                               "max_tokens_ratio": 0.5})
    assert [r.first_token_s for r in reqs[1:]] == [5.0] * 5


def test_the_count_restarts_when_prompts_go_by_hand(tmp_path):
    """Timeout 2: B at 1.5 waits t=2, 3 and goes at t=4 (first token 5), restarting the count; C at 5.5 waits
    t=6, 7 and goes at t=8 (first token 9).  Had the count not restarted, C would have gone at t=6."""
    reqs, _ = _run(tmp_path, ["0,10,30", "1.5,10,3", "5.5,10,3"], {"timeout_iters": 2, "max_tokens_ratio": 0.9})
    assert [r.first_token_s for r in reqs] == [1.0, 5.0, 9.0]


def test_the_decodes_count_and_the_ratio_is_reached_at_equality_by_hand(tmp_path):
    """B (49 in) beside A's decode: 1 + 49 = 50 = 0.5 x 100 tokens: the step is full enough, B goes at t=2
    (first token 3).  Without A's token counted, or with a strict comparison, it would wait to t=5."""
    reqs, _ = _run(tmp_path, ["0,10,20", "1.5,49,3"], {"timeout_iters": 3, "max_tokens_ratio": 0.5})
    assert [r.first_token_s for r in reqs] == [1.0, 3.0]


def test_a_part_way_prompt_is_a_context_counted_whole_and_held_by_hand(tmp_path):
    """Chunked, budget 100, ratio 0.8, timeout 5.  A (10 in) decodes from t=1.  B (40) and C (90) arrive at 1.5:
    at t=2 the step would carry 1 + 40 + 90 = 131 >= 80: they go, B whole and C's first 59 tokens (the budget
    left).  D (10) at 2.5: at t=3 the contexts are C, part-way (counted whole: 90) and D: 1 + 1 (B's decode) +
    90 + 10 = 102 >= 80: D goes at once (first token 4), C takes its last 31 (first token 4).  Counted by its
    chunk (31), C would have made 43 < 80 and held D to the timeout."""
    reqs, _ = _run(tmp_path, ["0,10,40", "1.5,40,3", "1.5,90,3", "2.5,10,3"],
                   {"timeout_iters": 5, "max_tokens_ratio": 0.8}, scheduler="chunked")
    assert [r.first_token_s for r in reqs] == [1.0, 3.0, 4.0, 4.0]
    # B (70) and C (50) at 1.5: 1 + 120 >= 80, they go at t=2, C gets the 29 left.  At t=3: 1 + 1 + 50 (C whole)
    # + 10 (D) = 62 < 80: C's chunk is held with D (count 1 .. 5 at t=3 .. 7) and both go at t=8
    # (first token 9); a part-way prompt never held would have had its first token at 4.
    reqs, _ = _run(tmp_path, ["0,10,40", "1.5,70,3", "1.5,50,3", "2.5,10,3"],
                   {"timeout_iters": 5, "max_tokens_ratio": 0.8}, scheduler="chunked")
    assert [r.first_token_s for r in reqs] == [1.0, 3.0, 9.0, 9.0]


def test_without_a_decode_nothing_waits(tmp_path):
    reqs, _ = _run(tmp_path, ["0,10,1", "0.5,10,1"], {"timeout_iters": 100, "max_tokens_ratio": 1.0})
    assert [r.first_token_s for r in reqs] == [1.0, 2.0]


def test_a_held_step_that_preempts_keeps_the_victim_queued(tmp_path):
    """A KV pool of 3 16-token blocks: A (8 in) and B (8 in) decode, C waits from 1.5 (held: timeout 50); at t=9
    both reach 16 tokens and need a second block, so B is preempted in a held step -- back to the queue's front,
    where it must still be (and finish), not lost with the held step's empty queue."""
    reqs, res = _run(tmp_path, ["0,8,20", "0,8,20", "1.5,10,3"], {"timeout_iters": 50, "max_tokens_ratio": 1.0},
                     kv_blocks=3, watermark=0)
    assert reqs[1].preemptions == 1 and res.topology.instances[0].policy.held > 0
    assert all(r.status == "finished" and r.generated == r.output_tokens for r in reqs)
    assert res.topology.instances[0].kv.free_blocks == 3


ON = {"timeout_iters": 5, "max_tokens_ratio": 0.5}


@pytest.mark.parametrize("pool,words", [
    ({"tp": 2, "ep": 2, "dp_attention": True, "scheduler": "inflight", "batch_wait": ON}, "only without attention"),
    ({"scheduler": "fcfs", "batch_wait": ON}, "not fcfs"),
    ({"scheduler": "inflight", "batch_wait": {"timeout_iters": 5, "max_tokens_ratio": 1.5}}, "max_tokens_ratio"),
    ({"scheduler": "inflight", "batch_wait": {"timeout_iters": 5}}, "never holds a prompt"),
    ({"scheduler": "inflight", "batch_wait": {"max_tokens_ratio": 0.5}}, "never holds a prompt"),
])
def test_bad_batch_wait_settings_are_one_clear_error(pool, words):
    with pytest.raises(ConfigError, match=words):
        config.parse({"model": "qwen3-30b-a3b", "workload": {"rate": 1, "num_requests": 2},
                      "topologies": {"t": {"kind": "colocated", **pool}}}, "b.yaml")


@pytest.mark.parametrize("side", ["prefill", "decode"])
def test_batch_wait_on_a_disaggregated_pool_is_refused(side):
    pools = {"prefill": {}, "decode": {}}
    pools[side] = {"scheduler": "inflight", "batch_wait": ON}
    sc = config.parse({"model": "llama-3.1-8b", "workload": {"rate": 1, "num_requests": 2},
                       "topologies": {"pd": {"kind": "disaggregated", **pools}}}, "d.yaml")
    with pytest.raises(ConfigError, match=f"pd.{side}.batch_wait.*would do nothing"):
        simulate(sc)


def test_the_harness_config_of_inferencemax_trtllm_deepseek_chat_rows():
    """InferenceMAX's DeepSeek-R1 fp8 TensorRT-LLM scripts (H200 and B200): at 1024 in / 1024 out and 64 or more
    clients, without DP attention, batch_wait_timeout_iters 40 and batch_wait_max_tokens_ratio 0.8."""
    row = {"dp_attention": False, "engine": "trtllm", "harness": "inferencemax", "model": "deepseek-r1",
           "weight_dtype": "fp8", "isl": 1024, "osl": 1024, "concurrency": 64, "tp": 8}
    assert harness_engine_config(row) == {"batch_wait": {"timeout_iters": 40, "max_tokens_ratio": 0.8}}
    for other in ({"concurrency": 32}, {"osl": 8192}, {"model": "gpt-oss-120b"}, {"engine": "sglang"},
                  {"harness": "unknown"}, {"weight_dtype": "bf16"}):
        assert harness_engine_config({**row, **other}) == {}
