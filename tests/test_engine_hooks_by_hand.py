"""The engine hooks off the GPU's kernels, worked by hand: the per-step prefill dispatch
(``step_overhead.prefill_per_layer_us`` / ``prefill_per_moe_layer_us``) and the per-request front-end latency
(``frontend_latency_ms``, engines.frontend_latency_s).  Both are 0 in every preset (README "Two engine costs
off the GPU's kernels"); these tests set them explicitly.  In mutmut's test selection (tests/MUTANTS.md)."""
from __future__ import annotations

import numpy as np
import pytest

from conftest import scenario
from pdsim import config
from pdsim.models import get_model
from pdsim.simulation import simulate

LLAMA8 = get_model("llama-3.1-8b")


def _pool(**kw):
    sc = scenario({"t": {"kind": "colocated", **kw}})
    return sc.topologies["t"]


# --- prefill dispatch: a step holding prompt tokens pays per-layer CPU dispatch (eager, no CUDA graph) ------
def _lone(model, overhead, prompt=1000, out=6, fast=True, pool=None, chunk=None):
    topo = {"kind": "colocated", "device": "h100-sxm", "tp": 1, "engine": "sglang", "kv_blocks": 100000,
            "step_overhead": overhead, **(pool or {})}
    if chunk:
        topo["chunked_prefill"] = {"token_budget": chunk}
    raw = {"seed": 0, "model": model, "workload": {"arrival": "poisson", "rate": 1.0, "num_requests": 1,
                                                   "prompt_tokens": prompt, "output_tokens": out},
           "topologies": {"t": topo}}
    return simulate(config.parse(raw, "t.yaml"), fast=fast)[0].requests[0]


@pytest.mark.parametrize("fast", [True, False])
def test_prefill_dispatch_is_paid_once_per_prefill_step_by_layers(fast):
    # Llama-3.1-8B has 32 layers (HF config num_hidden_layers): 1000 us per layer = 32 ms on the prefill
    # step only; the five decode gaps do not change (decode steps replay CUDA graphs)
    a = _lone("llama-3.1-8b", {"prefill_per_layer_us": 0.0}, fast=fast)
    b = _lone("llama-3.1-8b", {"prefill_per_layer_us": 1000.0}, fast=fast)
    assert (b.token_s[0] - b.arrival_s) - (a.token_s[0] - a.arrival_s) == pytest.approx(0.032, rel=1e-9)
    assert np.diff(b.token_s) == pytest.approx(np.diff(a.token_s), rel=1e-12)
    # a prompt of 1000 tokens in chunks of 256 runs four prefill steps: 4 x 32 ms
    a = _lone("llama-3.1-8b", {"prefill_per_layer_us": 0.0}, fast=fast, chunk=256)
    b = _lone("llama-3.1-8b", {"prefill_per_layer_us": 1000.0}, fast=fast, chunk=256)
    assert (b.token_s[0] - b.arrival_s) - (a.token_s[0] - a.arrival_s) == pytest.approx(4 * 0.032, rel=1e-9)


def test_prefill_dispatch_of_moe_layers_by_hand():
    # DeepSeek-V3 (HF config): 61 layers, the first 3 dense (first_k_dense_replace), 58 MoE:
    # 61 x 100 us + 58 x 1000 us = 64.1 ms; on 8 GPUs with EP 8, as the silicon rows run it
    pool = {"tp": 8, "ep": 8, "device": "h200"}
    kw = {"prompt": 500, "out": 3, "pool": pool}
    a = _lone("deepseek-v3", {"prefill_per_layer_us": 0.0, "prefill_per_moe_layer_us": 0.0}, **kw)
    b = _lone("deepseek-v3", {"prefill_per_layer_us": 100.0, "prefill_per_moe_layer_us": 1000.0}, **kw)
    assert (b.token_s[0] - b.arrival_s) - (a.token_s[0] - a.arrival_s) == pytest.approx(0.0641, rel=1e-9)
    assert np.diff(b.token_s) == pytest.approx(np.diff(a.token_s), rel=1e-12)


def test_verify_steps_of_speculative_decoding_pay_no_prefill_dispatch():
    # a verify step computes k + 1 tokens per request but holds no prompt: only the prefill step pays 32 ms
    # (Llama-3.1-8B's 32 layers, given an MTP head: method mtp needs one)
    spec = {"speculative": {"method": "mtp", "k": 2, "acceptance": 1.0}}
    llama_mtp = {"name": "llama-3.1-8b-mtp", "layers": 32, "hidden": 4096, "heads": 32, "kv_heads": 8,
                 "mlp_width": 14336, "vocab": 128256, "max_context": 131072, "mtp_layers": 1}
    a = _lone(llama_mtp, {"prefill_per_layer_us": 0.0}, out=7, pool=spec)
    b = _lone(llama_mtp, {"prefill_per_layer_us": 1000.0}, out=7, pool=spec)
    assert (b.token_s[0] - b.arrival_s) - (a.token_s[0] - a.arrival_s) == pytest.approx(0.032, rel=1e-9)
    assert b.finish_s - b.token_s[0] == pytest.approx(a.finish_s - a.token_s[0], rel=1e-12)


def test_prefill_dispatch_key_rejects_a_negative_value():
    with pytest.raises(config.ConfigError, match="prefill_per_layer_us"):
        _pool(engine="sglang", step_overhead={"prefill_per_layer_us": -1})


def test_prefill_dispatch_under_pipeline_parallelism_by_hand():
    # pp 2 (16 + 16 layers): a lone prompt is one micro-batch through both stages; the dispatch of all
    # 32 layers (1000 us each) adds 32 ms to its prefill, nothing to its decode steps
    a = _lone("llama-3.1-8b", {"prefill_per_layer_us": 0.0}, pool={"pp": 2})
    b = _lone("llama-3.1-8b", {"prefill_per_layer_us": 1000.0}, pool={"pp": 2})
    assert (b.token_s[0] - b.arrival_s) - (a.token_s[0] - a.arrival_s) == pytest.approx(0.032, rel=1e-9)
    assert np.diff(b.token_s) == pytest.approx(np.diff(a.token_s), rel=1e-12)


# --- front-end latency: per request, before the scheduler sees it, no GPU time ------------------------------
@pytest.mark.parametrize("fast", [True, False])
def test_frontend_latency_delays_the_first_token_only(fast):
    # 50 ms before the request reaches the scheduler: TTFT and E2E + 50 ms, every token gap unchanged
    a = _lone("llama-3.1-8b", None, fast=fast, pool={"frontend_latency_ms": 0.0})
    b = _lone("llama-3.1-8b", None, fast=fast, pool={"frontend_latency_ms": 50.0})
    assert (b.token_s[0] - b.arrival_s) - (a.token_s[0] - a.arrival_s) == pytest.approx(0.05, rel=1e-9)
    assert b.finish_s - b.arrival_s == pytest.approx(a.finish_s - a.arrival_s + 0.05, rel=1e-9)
    assert np.diff(b.token_s) == pytest.approx(np.diff(a.token_s), rel=1e-12)
    assert b.prefill_start_s - b.arrival_s == pytest.approx(0.05, rel=1e-9)   # queued nowhere else


def test_frontend_latency_takes_no_gpu_time_from_other_requests():
    # two requests 10 ms apart on a constant-cost pool (prefill and decode steps 0.1 s): with a 1 s front
    # end each is served exactly 1 s later than without one, and the pool is busy for the same time
    topo = {"kind": "colocated", "cost_model": {"kind": "constant", "step_s": 0.1}, "kv_blocks": 1000}
    runs = []
    for f in (0.0, 1000.0):
        sc = scenario({"c": {**topo, "frontend_latency_ms": f}}, arrival="constant", rate=100.0, num_requests=2,
                      prompt_tokens=10, output_tokens=3)
        res = simulate(sc)[0]
        runs.append(([r.token_s[0] - r.arrival_s for r in res.requests], res.topology.instances[0].busy_s))
    (t0, busy0), (t1, busy1) = runs
    assert t1 == pytest.approx([x + 1.0 for x in t0], rel=1e-9)
    assert busy1 == pytest.approx(busy0, rel=1e-12)


def test_a_request_abandoned_in_the_front_end_is_never_served():
    # 0.05 s timeout, 0.2 s front end: the client gives up before the engine sees the request
    topo = {"kind": "colocated", "cost_model": {"kind": "constant", "step_s": 0.01}, "kv_blocks": 1000,
            "frontend_latency_ms": 200.0}
    sc = scenario({"c": topo}, num_requests=3, timeout_s=0.05)
    res = simulate(sc)[0]
    assert [r.status for r in res.requests] == ["abandoned"] * 3
    assert all(r.finish_s - r.arrival_s == pytest.approx(0.05) and r.instance == "" for r in res.requests)
    assert res.topology.instances[0].steps == 0


def test_frontend_latency_defaults_from_the_engine_preset(monkeypatch):
    # a preset with 1000 us per layer and 500 us more per MoE layer: DeepSeek-V3 (61 layers, 58 MoE)
    # 61 + 29 = 90 ms; a constant-cost what-if pool and a pool without engine get none; an explicit key wins
    import dataclasses

    from pdsim import engines
    from pdsim.engines import frontend_latency_s
    monkeypatch.setitem(engines.PRESETS, "sglang", dataclasses.replace(
        engines.PRESETS["sglang"], frontend_per_layer_us=1000.0, frontend_per_moe_layer_us=500.0))
    ds = get_model("deepseek-v3")
    assert frontend_latency_s(_pool(engine="sglang", device="h200", tp=8, cost_model={"kind": "roofline"}),
                              ds) == pytest.approx(0.090)
    assert frontend_latency_s(_pool(engine="sglang", device="h200", cost_model={"kind": "roofline"}),
                              LLAMA8) == pytest.approx(0.032)
    assert frontend_latency_s(_pool(engine="sglang", cost_model={"kind": "constant", "step_s": 0.01}), ds) == 0.0
    assert frontend_latency_s(_pool(device="h200", cost_model={"kind": "roofline"}), ds) == 0.0
    assert frontend_latency_s(_pool(engine="sglang", device="h200", cost_model={"kind": "roofline"},
                                    frontend_latency_ms=7.0), ds) == pytest.approx(0.007)


def test_frontend_latency_of_a_disaggregated_topology_is_the_prefill_pools():
    # the prefill engine receives the request: its 100 ms delay the first token (a decode pool's is refused)
    def ttft(pf, dc):
        topo = {"kind": "disaggregated", "kv_link": {"bandwidth_GBps": 10, "latency_us": 100},
                "prefill": {"cost_model": {"kind": "constant", "step_s": 0.05}, "kv_blocks": 1000,
                            "frontend_latency_ms": pf},
                "decode": {"cost_model": {"kind": "constant", "step_s": 0.01}, "kv_blocks": 1000,
                           "frontend_latency_ms": dc}}
        r = simulate(scenario({"d": topo}, num_requests=1, prompt_tokens=100, output_tokens=4))[0].requests[0]
        return r.token_s[0] - r.arrival_s
    assert ttft(100.0, None) - ttft(0.0, None) == pytest.approx(0.1, rel=1e-9)


def test_prefill_dispatch_counts_steps_with_more_new_tokens_than_sampled():
    # the rule, by hand: a 257-token prompt in chunks of 256 runs a 256-token step (256 new, 0 sampled: a
    # prefill) then a 1-token last chunk (1 new, 1 sampled: counted as decode), so it pays 32 ms once
    a = _lone("llama-3.1-8b", {"prefill_per_layer_us": 0.0}, prompt=257, chunk=256)
    b = _lone("llama-3.1-8b", {"prefill_per_layer_us": 1000.0}, prompt=257, chunk=256)
    assert (b.token_s[0] - b.arrival_s) - (a.token_s[0] - a.arrival_s) == pytest.approx(0.032, rel=1e-9)


def test_explicit_prefill_dispatch_on_a_constant_cost_pool_counts_the_models_layers():
    # a constant 10 ms step: with step_overhead set the engine overhead applies, and so does the prefill
    # dispatch over Llama-3.1-8B's 32 layers (1000 us each): 10 + 32 ms to the first token
    topo = {"kind": "colocated", "cost_model": {"kind": "constant", "step_s": 0.01}, "kv_blocks": 1000,
            "step_overhead": {"base_us": 0.0, "per_seq_us": 0.0, "prefill_per_layer_us": 1000.0}}
    r = simulate(scenario({"c": topo}, num_requests=1, prompt_tokens=100, output_tokens=3))[0].requests[0]
    assert r.token_s[0] - r.arrival_s == pytest.approx(0.042, rel=1e-9)
    assert np.diff(r.token_s) == pytest.approx([0.01, 0.01], rel=1e-9)


def test_frontend_latency_on_a_decode_pool_is_refused():
    topo = {"kind": "disaggregated", "prefill": {"cost_model": {"kind": "constant", "step_s": 0.05},
                                                 "kv_blocks": 1000},
            "decode": {"cost_model": {"kind": "constant", "step_s": 0.01}, "kv_blocks": 1000,
                       "frontend_latency_ms": 5.0}}
    with pytest.raises(config.ConfigError, match="decode.frontend_latency_ms"):
        simulate(scenario({"d": topo}, num_requests=1))


def test_negative_frontend_latency_is_refused():
    with pytest.raises(config.ConfigError, match="frontend_latency_ms"):
        _pool(frontend_latency_ms=-1)


def test_a_pool_with_a_frontend_latency_shows_no_stored_error_band():
    from pdsim.metrics import expected_error
    topo = {"kind": "colocated", "device": "h100-sxm", "engine": "sglang", "frontend_latency_ms": 50.0}
    res = simulate(scenario({"c": topo}, num_requests=2, prompt_tokens=50, output_tokens=2))[0]
    assert expected_error(res.topology)["replica"].startswith("unvalidated: frontend_latency_ms 50")


def test_prefill_dispatch_under_pipeline_parallelism_is_each_stages_own():
    # pp 2 of a constant 10 ms step (UniformStages: each stage one 10 ms step per micro-batch, no transfer);
    # Llama-3.1-8B's 32 layers split 16 + 16, 1000 us a layer: each stage's worker dispatches its 16 ms.
    # Two prompts arriving together run as 2 micro-batches of one in one iteration:
    #   round trip 10 + 16 + 10 + 16 = 52 ms; each stage's load 2 x (10 + 16) = 52 ms; driver overhead 0
    #   -> both first tokens at 52 ms (the whole 32 ms on the driver per micro-batch would give 2 x 32 = 64)
    topo = {"kind": "colocated", "pp": 2, "cost_model": {"kind": "constant", "step_s": 0.01}, "kv_blocks": 1000,
            "step_overhead": {"base_us": 0.0, "per_seq_us": 0.0, "prefill_per_layer_us": 1000.0}}
    sc = scenario({"c": topo}, arrival="closed", clients=2, num_requests=2, prompt_tokens=100, output_tokens=2)
    reqs = simulate(sc)[0].requests
    assert [r.token_s[0] - r.arrival_s for r in reqs] == pytest.approx([0.052, 0.052], abs=1e-8)
