"""Uneven pipeline splits: pp that does not divide the layers (vLLM's default rule) and an explicit
``pp_layers`` per pool.

Oracles: the split rule worked out by hand (vLLM's ``get_pp_indices``: L // pp layers a stage, the L % pp
left over one each to the stages just before the last, counting back from the second-to-last); weights
and KV bytes per GPU from the Hugging Face shapes by hand; the pipeline period by hand from a ``linear``
cost model whose stages cost n_j pp / L of its step; for the roofline, each stage priced by the unchanged
whole-model path (``RooflineCost`` at pp = 1) on a model cut to that stage's layers; the step-by-step
loop for the fast path.
"""
from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from pdsim import config, metrics
from pdsim.__main__ import main
from pdsim.costmodel import RooflineCost
from pdsim.devices import GiB, get_device
from pdsim.models import get_model, pp_split
from pdsim.pipeline import PipelineCost
from pdsim.simulation import simulate
from pdsim.topology import kv_blocks, make_cost

from test_moe import _err, _run_yaml
from test_pp import (BASE_S, LINEAR, PER_TOKEN_S, _requests, _sc, check_decode_steps_equal_scalar_steps,
                     check_fast_equals_slow_and_nothing_lost)

H100 = get_device("h100-sxm")


def _s(tokens: float) -> float:
    """The linear what-if model's step: base + per_token x tokens."""
    return BASE_S + tokens * PER_TOKEN_S


# --- the split rule --------------------------------------------------------------------------------
def test_vllm_default_split_by_hand():
    # 61 = 4 x 15 + 1: 15 each, the 1 left over to stage pp - 2 = 2 (just before the last)
    assert pp_split(61, 4) == (15, 15, 16, 15)
    # 61 = 2 x 30 + 1: the one extra to stage 0 (the only stage before the last)
    assert pp_split(61, 2) == (31, 30)
    # 61 = 8 x 7 + 5: stages 6, 5, 4, 3, 2 (counting back from the second-to-last) get 8
    assert pp_split(61, 8) == (7, 7, 8, 8, 8, 8, 8, 7)
    # 16 = 3 x 5 + 1: stage 1
    assert pp_split(16, 3) == (5, 6, 5)
    # 80 = 3 x 26 + 2: stages 1 and 0; the last keeps 26
    assert pp_split(80, 3) == (27, 27, 26)
    # 126 = 4 x 31 + 2 (Llama-3.1-405B's layers): stages 2 and 1
    assert pp_split(126, 4) == (31, 32, 32, 31)
    # even splits are L / pp each; pp = L is one layer a stage
    assert pp_split(32, 4) == (8, 8, 8, 8) and pp_split(7, 7) == (1,) * 7 and pp_split(5, 1) == (5,)


def test_dense_first_layers_and_explicit_splits_by_hand():
    """DeepSeek-V3: 61 layers, the first 3 dense.  Default pp 4 = [15, 15, 16, 15]: stage 0 holds the 3
    dense layers and 12 MoE ones.  Explicit [2, 59]: the third dense layer falls in stage 1."""
    ds = get_model("deepseek-v3")
    assert ds.stage_layers(4) == [(3, 12), (0, 15), (0, 16), (0, 15)]
    assert ds.stage_layers(2, [2, 59]) == [(2, 0), (1, 58)]
    assert ds.stage_shape(4, 2).layers == 16 and ds.stage_shape(2, 1, [2, 59]).dense_layers == 1
    # MLA KV per token per GPU (the whole latent on every GPU): (512 + 64) x 1 byte (fp8) per layer; the
    # busiest stage has 16 layers
    assert ds.kv_bytes_per_token_per_gpu("fp8", 8, 4) == 16 * 576 == 9216
    assert ds.stage_kv_bytes_per_token("fp8", 8, 4) == [15 * 576, 15 * 576, 16 * 576, 15 * 576]
    assert ds.kv_bytes_per_token_per_gpu("fp8", 8, 2, [2, 59]) == 59 * 576


# --- memory: weights and KV per GPU of an uneven split ---------------------------------------------
# Llama-3.2-1B (HF config): 16 layers, hidden 2048, 32 heads, 8 KV heads of 64, MLP 8192, vocab 128256, tied
ATTN_1B = 2048 * 32 * 64 + 2 * 2048 * 8 * 64 + 32 * 64 * 2048      # q, k, v, o: 10,485,760
LAYER_1B = ATTN_1B + 3 * 2048 * 8192                                # + gated MLP: 60,817,408
EMB_1B = 128256 * 2048                                              # 262,668,288 (input embedding; the
KV_LAYER_1B = 2 * 8 * 64 * 2                                        # tied LM head is a second copy)
FREE_H100 = 80 * GiB * 0.9 - 2 * GiB                                # memory x utilisation - reserve


def test_weights_and_kv_per_gpu_of_an_uneven_dense_split_by_hand():
    """pp 3 over 16 layers = [5, 6, 5], tp 1, bf16.  Stage 0: 5 layers + the embedding; stage 1: 6 layers;
    stage 2: 5 layers + the LM head (tied: a second copy).  KV per token: 2 KiB a layer (K, V of 8 heads of
    64, bf16)."""
    m = get_model("llama-3.2-1b")
    assert LAYER_1B == 60_817_408 and EMB_1B == 262_668_288 and KV_LAYER_1B == 2048
    w_end = (5 * LAYER_1B + EMB_1B) * 2.0                     # 1,133,510,656 bytes
    w_mid = 6 * LAYER_1B * 2.0                                # 729,808,896 bytes
    assert m.stage_weight_bytes("bf16", 1, 1, 3) == [w_end, w_mid, w_end]
    assert m.weight_bytes_per_gpu("bf16", 1, 1, 3) == w_end == 1_133_510_656
    assert m.stage_kv_bytes_per_token("bf16", 1, 3) == [5 * 2048, 6 * 2048, 5 * 2048]
    assert m.kv_bytes_per_token_per_gpu("bf16", 1, 3) == 6 * 2048
    # tp 2: 4 KV heads a GPU, weights / 2 (the vocab-parallel embedding too)
    assert m.kv_bytes_per_token_per_gpu("bf16", 2, 3) == 6 * 1024
    assert m.weight_bytes_per_gpu("bf16", 2, 1, 3) == pytest.approx(w_end / 2, rel=1e-15)


def test_kv_pool_of_an_uneven_split_keeps_the_fewest_blocks_any_stage_fits_by_hand():
    """Every stage keeps the same number of blocks: the fewest any stage's GPU has room for (vLLM takes the
    minimum over its workers).  [5, 6, 5] on an H100: stage 0 (and 2) fits 451,833 blocks of 16 x 5 x 2 KiB,
    stage 1 (more KV per token, fewer weights) 378,581 blocks of 16 x 6 x 2 KiB: stage 1 binds.  (The
    heaviest weights with the largest blocks would give 376,528: no stage is that short.)"""
    m = get_model("llama-3.2-1b")
    stage0 = int((FREE_H100 - (5 * LAYER_1B + EMB_1B) * 2.0) // (16 * 5 * KV_LAYER_1B))
    stage1 = int((FREE_H100 - 6 * LAYER_1B * 2.0) // (16 * 6 * KV_LAYER_1B))
    assert (stage0, stage1) == (451_833, 378_581)
    blocks, block_bytes = kv_blocks(config.PoolSpec(device="h100-sxm", pp=3), m, "bf16", "bf16", None, "p")
    assert blocks == min(stage0, stage1) == 378_581
    assert block_bytes == 16 * 6 * KV_LAYER_1B                # the busiest stage's block
    # explicit [7, 2, 7]: the end stages hold the most layers and the embedding / LM head: they bind
    ends = int((FREE_H100 - (7 * LAYER_1B + EMB_1B) * 2.0) // (16 * 7 * KV_LAYER_1B))
    blocks, block_bytes = kv_blocks(config.PoolSpec(device="h100-sxm", pp=3, pp_layers=[7, 2, 7]), m,
                                    "bf16", "bf16", None, "p")
    assert (blocks, block_bytes) == (ends, 16 * 7 * KV_LAYER_1B)


def test_kv_pool_of_an_uneven_split_under_an_engine_preset():
    """With an engine preset the engine's other terms (activations, CUDA graphs, non-torch memory) are the
    same on every stage: each stage's KV bytes are the busiest-weights stage's + the weights it does not
    hold, over its own block bytes."""
    from pdsim.engines import kv_cache_bytes
    m = get_model("llama-3.2-1b")
    pool = config.PoolSpec(device="h100-sxm", pp=3, engine="vllm-v1")
    at_max = kv_cache_bytes(pool, m, "bf16", H100.memory_bytes)["kv_bytes"]   # with stage 0's weights
    w_end, w_mid = (5 * LAYER_1B + EMB_1B) * 2.0, 6 * LAYER_1B * 2.0
    stage0 = int(at_max // (16 * 5 * KV_LAYER_1B))
    stage1 = int((at_max + w_end - w_mid) // (16 * 6 * KV_LAYER_1B))
    assert kv_blocks(pool, m, "bf16", "bf16", None, "p")[0] == min(stage0, stage1) == stage1


# --- time: linear what-if stages ----------------------------------------------------------------------
def _linear_cost(model: str, **pool):
    return make_cost(config.PoolSpec(cost_model=LINEAR, kv_blocks=1000, **pool), get_model(model),
                     "bf16", "bf16", None, "t")


def test_linear_stages_scale_with_their_layers_and_a_lone_request_pays_their_sum():
    """A linear step prices an average stage of L / pp layers; stage j costs n_j / (L / pp) of it.
    Llama-3.2-1B pp 3 = [5, 6, 5]: stages of 15/16, 18/16 and 15/16 steps.  A lone request pays the sum:
    (15 + 18 + 15) / 16 = 3 steps for its prompt and for each decode step."""
    cost = _linear_cost("llama-3.2-1b", pp=3)
    s, _, _ = cost.stages.stage_times(100, 100 * 50.0, 100, 1, 1)
    assert s == pytest.approx([15 / 16 * _s(100), 18 / 16 * _s(100), 15 / 16 * _s(100)], rel=1e-15)
    topo = {"kind": "colocated", "cost_model": LINEAR, "kv_blocks": 1000, "pp": 3}
    df = _requests(_sc(topo, model="llama-3.2-1b", output_tokens=5))
    assert df.ttft_s[0] == pytest.approx((15 + 18 + 15) / 16 * _s(100), rel=1e-12)
    assert df.tpot_s[0] == pytest.approx((15 + 18 + 15) / 16 * _s(1), rel=1e-12)
    # an explicit [10, 6] split of the 16 layers: 1.25 and 0.75 steps; a lone request still 2 steps
    cost = _linear_cost("llama-3.2-1b", pp=2, pp_layers=[10, 6])
    assert cost.stages.stage_times(100, 5000.0, 100, 1, 1)[0] == pytest.approx([1.25 * _s(100), 0.75 * _s(100)],
                                                                                rel=1e-15)
    assert cost.step(100, 5000.0, 100, 1, 1).time_s == pytest.approx(2 * _s(100), rel=1e-12)


@pytest.mark.parametrize("pp,pp_layers,m,batch,expected_s", [
    # [10, 6] of 16, B = 8 in 2 micro-batches of 4: stage 0 runs both at 1.25 s(4) each: 2.5 s(4) > trip 2 s(4)
    (2, [10, 6], 2, 8, 2 * 1.25 * (BASE_S + 4 * PER_TOKEN_S)),
    # default [5, 6, 5], B = 9 in 3 of 3: stage 1 runs all three at 18/16 s(3): 54/16 s(3) > trip 3 s(3)
    (3, None, 3, 9, 3 * 18 / 16 * (BASE_S + 3 * PER_TOKEN_S)),
    # [10, 6], one micro-batch of 8: the whole round trip, 1.25 s(8) + 0.75 s(8)
    (2, [10, 6], 1, 8, 2 * (BASE_S + 8 * PER_TOKEN_S)),
])
def test_the_busiest_stage_sets_a_busy_pipelines_cadence(pp, pp_layers, m, batch, expected_s):
    cost = _linear_cost("llama-3.2-1b", pp=pp, pp_layers=pp_layers, micro_batches=m)
    assert cost.step(batch, batch * 100.0, batch * 101, batch, batch).time_s == pytest.approx(expected_s, rel=1e-12)
    # end to end: closed-loop clients start together, then decode in lock step: every TPOT is one iteration
    topo = {"kind": "colocated", "cost_model": LINEAR, "kv_blocks": 1000, "pp": pp, "micro_batches": m,
            **({"pp_layers": pp_layers} if pp_layers else {})}
    df = _requests(_sc(topo, model="llama-3.2-1b", arrival="closed", clients=batch, rate=None,
                       num_requests=batch, prompt_tokens=50, output_tokens=30))
    assert np.allclose(df.tpot_s, expected_s, rtol=1e-9, atol=0)


# --- time: roofline stages ----------------------------------------------------------------------------
def test_lone_request_on_an_uneven_roofline_pipeline_is_the_sum_of_its_stages():
    """tp2 x pp3 Llama-3.1-8B (32 layers = [11, 11, 10]) on H100, a lone 1000-token prompt: TTFT = overhead
    + the three stages + two activation sends.  Each stage is the unchanged pp = 1 path on a cut of its own
    layers: stage 0 without the LM head, stage 1 without the embedding (and its all-reduce) and the LM head,
    stage 2 without the embedding."""
    P, tp = 1000, 2
    m = get_model("llama-3.1-8b")
    agg = (P, P * P / 2.0, P, 1, 1)

    def cut(layers):
        bd = RooflineCost(dataclasses.replace(m, layers=layers), H100, tp).breakdown(*agg)
        return bd, sum(v["time_s"] for v in bd.values()), bd["allreduce"]["time_s"] / (2 * layers + 1)
    (b11, whole11, ar11), (b10, whole10, ar10) = cut(11), cut(10)
    o11 = b11["step_overhead"]["time_s"]
    stage0 = whole11 - b11["lm_head"]["time_s"] - o11
    stage1 = whole11 - b11["embed"]["time_s"] - b11["lm_head"]["time_s"] - ar11 - o11
    stage2 = whole10 - b10["embed"]["time_s"] - ar10 - b10["step_overhead"]["time_s"]
    transfer = 6e-6 + 2 * P * 4096 * 2 / (450e9 * 0.58)      # hidden + residual, NVLink4 450 GB/s x 0.58, 6 us
    cost = RooflineCost(m, H100, tp, pp=3)
    assert cost.stage_times(*agg)[0] == pytest.approx([stage0, stage1, stage2], rel=1e-12)
    assert stage1 > stage2                                  # 11 layers against 10 (+ the LM head's GEMV)
    res = simulate(_sc({"kind": "colocated", "device": "h100-sxm", "tp": tp, "pp": 3}, prompt_tokens=P))
    expected = 800e-6 + stage0 + stage1 + stage2 + 2 * transfer
    assert metrics.requests_frame(res).ttft_s[0] == pytest.approx(expected, rel=1e-9)


def test_uneven_stage_split_conserves_the_whole_models_work():
    """Every operator lands on exactly one stage under uneven splits too: stage times + overhead = the whole
    model's step, FLOPs and bytes too (DeepSeek-V3 61 layers pp 4 with EP, Llama-3.1-70B 80 layers pp 3, an
    explicit split of Qwen3-30B-A3B)."""
    for name, tp, ep, pp, layers in (("deepseek-v3", 8, 8, 4, None), ("llama-3.1-70b", 4, 1, 3, None),
                                     ("qwen3-30b-a3b", 2, 2, 3, (30, 2, 16))):
        m = get_model(name)
        one = RooflineCost(m, H100, tp, "bf16", "bf16", ep)
        split = RooflineCost(m, H100, tp, "bf16", "bf16", ep, 0.0, pp, pp_layers=layers)
        for agg in ((512, 512 * 256.0, 512, 1, 1), (64, 64 * 3000.0, 64 * 3001, 64, 64)):
            s, f, b = split.stage_times(*agg)
            ref = one.step(*agg)
            assert len(s) == pp
            assert sum(s) + H100.step_overhead_s == pytest.approx(ref.time_s, rel=1e-12)
            assert f == pytest.approx(ref.flops, rel=1e-12) and b == pytest.approx(ref.bytes, rel=1e-12)


def test_vectorised_decode_costs_equal_scalar_steps_on_uneven_stages():
    for m, tp, pp, mb, layers in (("llama-3.1-70b", 4, 3, None, None), ("qwen3-30b-a3b", 2, 5, 3, None),
                                  ("llama-3.1-8b", 1, 2, 2, (20, 12))):
        check_decode_steps_equal_scalar_steps(
            PipelineCost(RooflineCost(get_model(m), H100, tp, pp=pp, pp_layers=layers), pp, mb),
            seed=3, batches=(1, 7, 64), k=30)


# --- fast path and invariants on uneven PP topologies -----------------------------------------------
UNEVEN_TOPOS = [     # Llama-3.1-8B, 32 layers
    {"kind": "colocated", "replicas": 2, "device": "h100-sxm", "pp": 3, "kv_blocks": 60, "max_running": 6},
    {"kind": "colocated", "replicas": 1, "pp": 2, "pp_layers": [20, 12], "micro_batches": 3, "kv_blocks": 50,
     "chunked_prefill": {"token_budget": 64},
     "cost_model": {"kind": "linear", "base_s": 0.004, "per_token_s": 2e-5, "per_kv_token_s": 1e-6}},
    {"kind": "disaggregated", "prefill": {"instances": 2, "kv_blocks": 40, "device": "h100-sxm", "pp": 5},
     "decode": {"instances": 1, "kv_blocks": 50, "max_running": 6, "device": "h100-sxm", "pp": 2,
                "pp_layers": [5, 27], "micro_batches": 3},
     "kv_link": {"bandwidth_GBps": 1}},
]


@settings(deadline=None, suppress_health_check=[HealthCheck.too_slow])   # examples: the profile (conftest)
@given(topo=st.integers(0, len(UNEVEN_TOPOS) - 1), seed=st.integers(0, 10**6),
       n=st.integers(1, 6) | st.integers(15, 30), rate=st.floats(0.5, 100), out=st.integers(1, 200))
def test_fast_path_equals_step_by_step_and_nothing_is_lost_under_uneven_pp(topo, seed, n, rate, out):
    check_fast_equals_slow_and_nothing_lost(UNEVEN_TOPOS[topo], seed, n, rate, out)


def test_kv_transfer_of_an_uneven_pp_prefill_waits_for_the_largest_stage():
    """Prefill tp1 x pp3 of Llama-3.1-8B ([11, 11, 10] layers): each stage sends its own layers' KV over its
    own GPU's link; the 11-layer stages carry 11/32 of the prompt's KV and finish last."""
    P = 1000
    topo = {"kind": "disaggregated", "prefill": {"device": "h100-sxm", "pp": 3},
            "decode": {"device": "h100-sxm"}, "kv_link": {"bandwidth_GBps": 10, "latency_us": 20}}
    df = _requests(_sc(topo, prompt_tokens=P, output_tokens=3))
    kv_bytes = P * 2 * 32 * 8 * 128 * 2                    # Llama-3.1-8B: 128 KiB per token, 4 KiB a layer
    assert df.kv_transfer_s[0] == pytest.approx(20e-6 + kv_bytes * 11 / 32 / 10e9, rel=1e-12)


def test_kv_capacity_bytes_count_each_stages_own_share():
    """kv_cache.capacity_bytes of the summary: blocks x block_size x the whole model's KV bytes per token per
    TP rank, each stage's GPU holding its own layers' share: Llama-3.1-8B tp1, 128 KiB per token.  pp 3
    ([11, 11, 10]) and pp 2 (even) hold the same bytes per block; block_bytes is the 11-layer stage's."""
    for pp in (2, 3):
        sc = _sc({"kind": "colocated", "device": "h100-sxm", "pp": pp, "kv_blocks": 100}, num_requests=2,
                 output_tokens=3)
        res = simulate(sc)
        t = metrics.summarize(res, metrics.requests_frame(res), sc)["t"]
        assert t["kv_cache"]["capacity_bytes"] == pytest.approx(100 * 16 * 131072, rel=1e-15)
        per_gpu = 16 * 131072 * (16 if pp == 2 else 11) / 32
        assert t["pools"]["replica"]["kv_capacity_bytes"] == pytest.approx(100 * per_gpu, rel=1e-15)


def test_summary_names_each_pools_split():
    sc = _sc({"kind": "disaggregated", "prefill": {"device": "h100-sxm", "pp": 3},
              "decode": {"device": "h100-sxm", "pp": 2, "pp_layers": [17, 15]}}, num_requests=2, output_tokens=3)
    res = simulate(sc)
    t = metrics.summarize(res, metrics.requests_frame(res), sc)["t"]
    assert t["pools"]["prefill"]["pp_layers"] == [11, 11, 10] and t["pools"]["decode"]["pp_layers"] == [17, 15]
    assert t["gpus"] == 5


# --- CLI -------------------------------------------------------------------------------------------------
def test_estimate_prints_an_uneven_pipeline(capsys):
    """DeepSeek-R1 tp8 ep8 pp4 on H200 (61 layers): the vLLM split, and the 16-layer stage 2 is the slowest
    of the three stages without the embedding (stage 3 has the LM head, stage 0 the dense layers)."""
    rc = main(["estimate", "--model", "deepseek-r1", "--device", "h200", "--tp", "8", "--ep", "8", "--pp", "4",
               "--weight-dtype", "fp8", "--decode-batch", "64", "--context", "2000", "--json"])
    out = json.loads(capsys.readouterr().out)
    p = out["pipeline"]
    assert rc == 0 and p["layers"] == [15, 15, 16, 15] and p["stages"] == 4
    assert p["stage_s"][2] > p["stage_s"][1]
    assert out["time_s"] == pytest.approx(max(p["round_trip_s"], *p["stage_load_s"]), rel=1e-12)
    rc = main(["estimate", "--model", "llama-3.2-1b", "--device", "h100-sxm", "--pp", "3", "--pp-layers", "4,6,6",
               "--decode-batch", "8", "--json"])
    out = json.loads(capsys.readouterr().out)
    assert rc == 0 and out["pipeline"]["layers"] == [4, 6, 6]
    # stage 0 priced on its own 4 layers: the pp = 1 path on a 4-layer cut, less the LM head and the overhead;
    # 8 requests at context 1024 in micro-batches of 3, 3, 2: the stage times shown are the largest's
    m = get_model("llama-3.2-1b")
    assert out["context"] == 1024 and out["pipeline"]["micro_batch_requests"] == 3
    bd3 = RooflineCost(dataclasses.replace(m, layers=4), H100).breakdown(3, 3 * 1024.0, 3 * 1025, 3, 3)
    stage0 = sum(v["time_s"] for k, v in bd3.items() if k not in ("lm_head", "step_overhead"))
    assert out["pipeline"]["stage_s"][0] == pytest.approx(stage0, rel=1e-12)
    # the pool the KV capacity is sized on: [4, 6, 6]'s stage 2 (6 layers + the LM head) binds
    w2 = (6 * LAYER_1B + EMB_1B) * 2.0
    blocks = int((FREE_H100 - w2) // (16 * 6 * KV_LAYER_1B))
    assert out["kv_capacity"]["blocks"] == blocks


# --- bad input: one line naming key and value ----------------------------------------------------------
@pytest.mark.parametrize("pool,needle", [
    ("pp: 2, pp_layers: [10, 10, 12]", "topologies.a.pp_layers = [10, 10, 12]"),   # 3 counts for 2 stages
    ("pp: 2, pp_layers: [31, 30]", "topologies.a.pp_layers = [31, 30]"),           # 61, not 32 layers
    ("pp: 2, pp_layers: [32, 0]", "topologies.a.pp_layers = [32, 0]"),             # an empty stage
    ("pp: 2, pp_layers: [33, -1]", "topologies.a.pp_layers = [33, -1]"),
    ("pp_layers: [16, 16]", "topologies.a.pp_layers = [16, 16]"),                  # pp is 1
])
def test_bad_pp_layers_is_one_line_naming_the_key(tmp_path, capsys, pool, needle):
    err = _err(_run_yaml(tmp_path, "llama-3.1-8b", pool), capsys)
    assert needle in err
    assert ("pp > 1" in err) if "pp:" not in pool else ("32 layers" in err and "2 whole numbers" in err)


def test_bad_pp_layers_elsewhere_is_one_line(tmp_path, capsys):
    err = _err(_run_yaml(tmp_path, "llama-3.1-8b", "pp: 2, pp_layers: [a, b]"), capsys)
    assert "topologies.a.pp_layers" in err


@pytest.mark.parametrize("pool,needle", [
    ("pp: 2, pp_layers: [true, 31]", "topologies.a.pp_layers.0 = True"),     # found in review: ran as [1, 31]
    ("pp: 2, pp_layers: [16, 16.0]", "topologies.a.pp_layers.1 = 16.0"),
])
def test_pp_layers_are_whole_numbers_not_booleans_or_floats(tmp_path, capsys, pool, needle):
    err = _err(_run_yaml(tmp_path, "llama-3.1-8b", pool), capsys)
    assert needle in err and "valid integer" in err
    p = tmp_path / "d.yaml"
    p.write_text("model: llama-3.1-8b\nworkload: {rate: 2, num_requests: 3}\ntopologies:\n"
                 "  pd: {kind: disaggregated, prefill: {device: h200, pp: 3, pp_layers: [10, 10, 10]}, "
                 "decode: {device: h200}}\n")
    err = _err(["run", str(p), "--out", str(tmp_path / "o"), "--quiet"], capsys)
    assert "topologies.pd.prefill.pp_layers = [10, 10, 10]" in err and "32 layers" in err
    est = ["estimate", "--model", "llama-3.1-8b", "--device", "h100-sxm", "--decode-batch", "4"]
    err = _err(est + ["--pp", "2", "--pp-layers", "31,30"], capsys)
    assert "--pp-layers = [31, 30]" in err and "32 layers" in err
    err = _err(est + ["--pp-layers", "16,16"], capsys)
    assert "--pp-layers = [16, 16]" in err and "pp > 1" in err
    err = _err(est + ["--pp", "2", "--pp-layers", "16,x"], capsys)
    assert "--pp-layers" in err and "16,x" in err
    # a stage whose weights do not fit: DeepSeek-V3 bf16 in 3 stages of one H200 ([21, 20, 20] layers)
    err = _err(_run_yaml(tmp_path, "deepseek-v3", "pp: 3"), capsys)
    assert "topologies.a.device = 'h200'" in err and "pipeline stage 0" in err
