"""KV reservation at admission (pool key ``kv_reservation``): ``incremental`` (vLLM, SGLang: a block at
a time, preempt when short) vs ``full`` (TensorRT-LLM's GUARANTEED_NO_EVICT: blocks for the whole
sequence, prompt + output - 1 tokens, at admission; nothing is ever preempted).

Oracles: finish times worked out by hand under a constant step cost, block counts by hand, and the
invariant that a ``full`` pool never preempts (any workload, checked on seeded streams).
"""
from __future__ import annotations

import pytest

from conftest import scenario
from test_fastpath import _assert_same
from test_semantics import _stream

from pdsim import config
from pdsim.simulation import simulate

STEP = {"kind": "constant", "step_s": 0.01}


def _colo(reservation: str, blocks: int = 20) -> dict:
    return {"kind": "colocated", "replicas": 1, "cost_model": STEP, "kv_blocks": blocks, "block_size": 16,
            "watermark": 0.0, "kv_reservation": reservation}


def test_full_reservation_serialises_what_would_not_fit_to_the_end_by_hand():
    # 20 blocks of 16 tokens.  Each request: 64-token prompt, 129 output tokens -> 64 + 128 = 192 KV
    # tokens at the end = 12 blocks.  Full: A takes 12 at t=0, B (12 > 8 free) waits; A = 1 prefill
    # step + 128 decode steps of 10 ms -> first token 0.01 s, done 1.29 s; B is admitted at 1.29 s:
    # first token 1.30 s, done 2.58 s.  Nothing preempted.
    sc = scenario({"t": _colo("full")})
    a, b = _stream(sc, [(0.0, 64, 129), (0.0, 64, 129)]).requests
    assert (a.first_token_s, a.finish_s) == (pytest.approx(0.01), pytest.approx(1.29))
    assert (b.first_token_s, b.finish_s) == (pytest.approx(1.30), pytest.approx(2.58))
    assert a.preemptions == b.preemptions == 0
    # incremental: both start at once (4 + 4 blocks) and collide as they grow: B, the newer, is preempted
    a, b = _stream(scenario({"t": _colo("incremental")}), [(0.0, 64, 129), (0.0, 64, 129)]).requests
    assert a.first_token_s == b.first_token_s == pytest.approx(0.01)
    assert a.preemptions == 0 and b.preemptions >= 1


def test_full_reservation_holds_the_whole_sequence_while_it_runs():
    sc = scenario({"t": _colo("full", blocks=100)})
    res = _stream(sc, [(0.0, 64, 129)])
    inst = res.topology.instances[0]
    assert inst.kv.peak_used == 12                      # ceil(192 / 16) from the first step on
    assert inst.kv.free_blocks == 100                   # all given back


def test_trtllm_preset_reserves_in_full_and_a_key_overrides_it():
    def pool(**kw):
        sc = config.parse({"model": "llama-3.1-8b", "workload": {"rate": 1, "num_requests": 2},
                           "topologies": {"t": {"kind": "colocated", **kw}}}, "x.yaml")
        return sc.topologies["t"]
    assert pool(engine="trtllm").kv_reservation == "full"
    assert pool(engine="vllm-v1").kv_reservation == "incremental"
    assert pool(engine="sglang").kv_reservation == "incremental"
    assert pool(engine="trtllm", kv_reservation="incremental").kv_reservation == "incremental"
    assert pool().kv_reservation == "incremental"


def test_a_misspelt_reservation_is_one_clear_error(tmp_path):
    p = tmp_path / "s.yaml"
    p.write_text("model: llama-3.1-8b\nworkload: {rate: 1, num_requests: 2}\n"
                 "topologies:\n  t: {kind: colocated, kv_reservation: eager}\n")
    with pytest.raises(config.ConfigError) as e:
        config.load(p)
    assert e.value.key == "topologies.t.kv_reservation" and "eager" in str(e.value)


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("scheduler", ["fcfs", "chunked", "chunked+prefix"])
def test_full_pools_never_preempt_and_fast_path_equals_step_by_step(seed, scheduler):
    topo = {**_colo("full", blocks=60), "cost_model": {"kind": "linear", "base_s": 0.005, "per_token_s": 1e-5,
                                                       "per_kv_token_s": 1e-7}}
    extra = {}
    if scheduler.startswith("chunked"):
        topo["chunked_prefill"] = {"token_budget": 128}
    if scheduler.endswith("prefix"):     # shared system prompts and multi-turn history: cached prefixes
        topo["prefix_cache"] = {}
        extra = {"conversation": {"turns": 3, "think_s": 0.2, "system_prompts": 2, "system_tokens": 48}}
    sc = scenario({"t": topo}, rate=20.0, num_requests=40,
                  prompt_tokens={"dist": "uniform", "low": 16, "high": 400},
                  output_tokens={"dist": "uniform", "low": 1, "high": 300}, **extra)
    sc = sc.model_copy(update={"seed": seed})
    fast, slow = simulate(sc), simulate(sc, fast=False)
    assert all(r.preemptions == 0 for r in fast[0].requests)
    # every request finishes, or (long conversation turns) is rejected for never fitting the 60 blocks
    assert all(r.status == "finished" or (r.status == "rejected" and 16 * 60 < r.prompt_tokens + r.output_tokens - 1)
               for r in fast[0].requests)
    assert sum(r.status == "finished" for r in fast[0].requests) >= 10
    _assert_same(fast, slow)
    # the same stream under incremental reservation does preempt in this tight pool (the test can fail)
    inc = simulate(sc.model_copy(update={"topologies": {"t": config.ColocatedSpec.model_validate(
        {**topo, "kv_reservation": "incremental"})}}))
    assert sum(r.preemptions for r in inc[0].requests) > 0


def test_full_decode_pool_reserves_the_whole_sequence_when_the_kv_arrives():
    # decode pool of 20 blocks: each request needs 12 at the end, so B's KV can only be received once A
    # has finished; with incremental reservation B starts decoding while A still runs
    def run(reservation):
        topo = {"kind": "disaggregated",
                "prefill": {"instances": 1, "cost_model": STEP, "kv_blocks": 100, "block_size": 16, "watermark": 0.0},
                "decode": {"instances": 1, "cost_model": STEP, "kv_blocks": 20, "block_size": 16, "watermark": 0.0,
                           "kv_reservation": reservation},
                "kv_link": {"preset": "nvlink"}}
        return _stream(scenario({"t": topo}), [(0.0, 64, 129), (0.0, 64, 129)]).requests
    a, b = run("full")
    assert b.decode_first_s > a.finish_s and a.preemptions == b.preemptions == 0
    a, b = run("incremental")
    assert b.decode_first_s < a.finish_s


def test_a_full_prefill_pool_reserves_the_prompt_only():
    """Found in review: a prefill pool took blocks for prompt + output although it hands off after the
    first token, so a 20-block prefill pool deadlocked on 100-token prompts with 300-token replies
    (7 + 19 blocks > 20).  Its admission must be the prompt's 7 blocks; the decode pool reserves in full."""
    topo = {"kind": "disaggregated",
            "prefill": {"instances": 1, "cost_model": STEP, "kv_blocks": 20, "block_size": 16, "watermark": 0.0,
                        "kv_reservation": "full"},
            "decode": {"instances": 1, "cost_model": STEP, "kv_blocks": 200, "block_size": 16, "watermark": 0.0,
                       "kv_reservation": "full"},
            "kv_link": {"preset": "nvlink"}}
    res = _stream(scenario({"t": topo}), [(0.01 * i, 100, 300) for i in range(10)])
    assert all(r.status == "finished" for r in res.requests)
    pre = next(p for p in res.topology.pools if p.role == "prefill")
    assert max(i.kv.peak_used for i in pre.instances) <= 20 and pre.instances[0].limits.reserve_full is False
