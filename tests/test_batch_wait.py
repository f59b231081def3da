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


def _run(tmp_path, rows, wait, budget=100, scheduler="inflight", **extra):
    trace = tmp_path / "t.csv"
    trace.write_text("arrived_at,num_prefill_tokens,num_decode_tokens\n" + "\n".join(rows) + "\n")
    pool = {"kind": "colocated", "kv_blocks": 1000, "cost_model": {"kind": "constant", "step_s": 1.0},
            "scheduler": scheduler, "max_batched_tokens": budget, **extra}
    if wait is not None:
        pool["batch_wait"] = wait
    sc = config.parse({"model": "llama-3.1-8b", "workload": {"arrival": "trace", "trace": {"path": str(trace)}},
                       "topologies": {"t": pool}}, "t.yaml")
    (res,) = simulate(sc)
    res.scenario = sc
    return sorted(res.requests, key=lambda r: r.id), res


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


@pytest.mark.parametrize("pool,words", [
    ({"tp": 2, "ep": 2, "dp_attention": True, "scheduler": "inflight", "batch_wait": {}}, "only without attention"),
    ({"scheduler": "fcfs", "batch_wait": {}}, "not fcfs"),
    ({"scheduler": "inflight", "batch_wait": {"max_tokens_ratio": 1.5}}, "max_tokens_ratio"),
])
def test_bad_batch_wait_settings_are_one_clear_error(pool, words):
    with pytest.raises(ConfigError, match=words):
        config.parse({"model": "qwen3-30b-a3b", "workload": {"rate": 1, "num_requests": 2},
                      "topologies": {"t": {"kind": "colocated", **pool}}}, "b.yaml")


def test_the_harness_config_of_inferencemax_trtllm_deepseek_chat_rows():
    """InferenceMAX's DeepSeek-R1 fp8 TensorRT-LLM scripts (H200 and B200): at 1024 in / 1024 out and 64 or more
    clients, without DP attention, batch_wait_timeout_iters 40 and batch_wait_max_tokens_ratio 0.8."""
    row = {"dp_attention": False, "engine": "trtllm", "harness": "inferencemax", "model": "deepseek-r1",
           "weight_dtype": "fp8", "isl": 1024, "osl": 1024, "concurrency": 64, "tp": 8}
    assert harness_engine_config(row) == {"batch_wait": {"timeout_iters": 40, "max_tokens_ratio": 0.8}}
    for other in ({"concurrency": 32}, {"osl": 8192}, {"model": "gpt-oss-120b"}, {"engine": "sglang"},
                  {"harness": "unknown"}, {"weight_dtype": "bf16"}):
        assert harness_engine_config({**row, **other}) == {}
