"""Mixture of experts, multi-head latent attention and expert parallelism (pdsim/models.py, costmodel.py).

Oracles: published parameter counts (model cards), KV bytes and weight bytes worked out by hand from
the Hugging Face configs, the expected-distinct-experts formula by hand and by Monte Carlo, and the
step-by-step loop for the fast paths.
"""
from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from pdsim import config, metrics
from pdsim.__main__ import main
from pdsim.costmodel import CostModel, RooflineCost, alltoall_fanout, expected_distinct_experts, expert_hit_probs
from pdsim.devices import get_device
from pdsim.errors import ConfigError
from pdsim.models import ModelShape, get_model
from pdsim.simulation import resolve_model, simulate
from pdsim.topology import kv_blocks

from test_fastpath import _assert_same, _both

H200 = get_device("h200")

# --- shapes against the published figures --------------------------------------------------------
# (total, active) in billions as the model cards state them; gpt-oss's card counts the unembedding
# but not the input embedding in its 5.13B active (OpenAI gpt-oss model card, table 1)
PUBLISHED = {
    "deepseek-v3": (671, 37, True),          # DeepSeek-V3 technical report: 671B total, 37B activated
    "deepseek-r1": (671, 37, True),
    "qwen3-30b-a3b": (30.5, 3.3, True),      # Qwen3 model cards
    "qwen3-235b-a22b": (235, 22, True),
    "mixtral-8x7b": (46.7, 12.9, True),      # Mistral: 46.7B total, 12.9B per token
    "gpt-oss-120b": (116.83, 5.13, False),
}


@pytest.mark.parametrize("name", sorted(PUBLISHED))
def test_parameter_counts_match_published(name):
    total_B, active_B, with_input_embedding = PUBLISHED[name]
    m = get_model(name)
    assert m.params / 1e9 == pytest.approx(total_B, rel=0.01)
    # published active counts are rounded to two or three figures
    assert m.active_params(with_input_embedding) / 1e9 == pytest.approx(active_B, rel=0.03)
    assert "config.json" in m.source and "aiconfigurator-core" in m.source


def test_kv_bytes_per_token_by_hand():
    ds = get_model("deepseek-v3")
    # MLA: the 512-dim latent plus the 64-dim shared rope key, 61 layers, not 2 x 128 heads x 192
    assert ds.kv_bytes_per_token("fp8") == (512 + 64) * 61 * 1
    assert ds.kv_bytes_per_token("bf16") == (512 + 64) * 61 * 2 == 70272
    # Qwen3-30B-A3B: GQA, K and V of 4 KV heads of 128 over 48 layers
    assert get_model("qwen3-30b-a3b").kv_bytes_per_token("bf16") == 2 * 48 * 4 * 128 * 2 == 98304
    # the latent is kept whole on every GPU of a TP instance; GQA heads split
    assert ds.kv_bytes_per_token_per_gpu("fp8", 8) == 35136
    assert get_model("qwen3-30b-a3b").kv_bytes_per_token_per_gpu("bf16", 2) == 98304 / 2


def test_kv_pool_sizing_per_gpu_for_mla():
    pool = config.PoolSpec(device="h200", tp=8, ep=8, block_size=16)
    ds = get_model("deepseek-v3")
    blocks, block_bytes = kv_blocks(pool, ds, "fp8", "fp8", None, "p")
    assert block_bytes == 16 * 35136
    free = H200.memory_bytes * 0.9 - ds.weight_bytes_per_gpu("fp8", 8, 8) - 2 * 2**30
    assert blocks == int(free // block_bytes)


# --- expected distinct experts ---------------------------------------------------------------------
def test_expected_distinct_experts_by_hand():
    assert expected_distinct_experts(1, 8, 256) == pytest.approx(8)          # one token: its k experts
    assert expected_distinct_experts(10_000, 8, 256) == pytest.approx(256)   # many tokens: all of them
    assert expected_distinct_experts(2, 2, 8) == pytest.approx(8 * (1 - (3 / 4) ** 2)) == pytest.approx(3.5)
    assert expected_distinct_experts(4, 2, 4) == pytest.approx(3.75)         # 4 (1 - (1/2)^4)


def test_expected_distinct_experts_monte_carlo():
    rng = np.random.default_rng(0)
    E, k, B, trials = 16, 4, 5, 20_000
    picks = rng.random((trials, B, E)).argsort(-1)[..., :k]          # k distinct experts per token
    hit = np.zeros((trials, E), bool)
    np.put_along_axis(hit, picks.reshape(trials, B * k), True, axis=1)
    mc = hit.sum(1)
    se = mc.std() / math.sqrt(trials)
    assert abs(mc.mean() - expected_distinct_experts(B, k, E)) < 4 * se


def test_expert_popularity_skew_by_hand():
    # Zipf popularity 1, 1/2, 1/3, 1/4 normalised by 25/12; top-1 routes with exactly these probabilities
    assert expert_hit_probs(1, 4, 1.0) == pytest.approx(np.array([12, 6, 4, 3]) / 25)
    assert expert_hit_probs(8, 256, 0.0) == pytest.approx(np.full(256, 8 / 256))
    # top-2 with skew 2: the first expert's 2 x 144/205 > 1 is capped at 1 and the rest share the other 1
    assert expert_hit_probs(2, 4, 2.0) == pytest.approx([1, 36 / 61, 16 / 61, 9 / 61])
    # two top-1 tokens: sum of 1 - (1 - q)^2 = 2 - sum q^2
    assert expected_distinct_experts(2, 1, 4, 1.0) == pytest.approx(2 - (144 + 36 + 16 + 9) / 625)
    rng = np.random.default_rng(1)
    picks = rng.choice(4, size=(40_000, 2), p=np.array([12, 6, 4, 3]) / 25)
    distinct = 1 + (picks[:, 0] != picks[:, 1])
    assert abs(distinct.mean() - 1.672) < 4 * distinct.std() / 200


def test_skew_loads_the_hottest_ep_rank():
    m = _tiny(experts_per_token=1)
    h, w, L, T = 64, 32, 2, 4
    expert_w = 3 * h * w * 2
    cm = RooflineCost(m, H200, tp=2, ep=2, expert_skew=1.0)
    # round robin in popularity order: rank 0 holds the experts of probability 12/25 and 4/25
    q = np.array([12, 4]) / 25
    pairs, hit = T * q.sum(), np.sum(1 - (1 - q) ** T)
    acts = pairs * ((2 * w + h) + (h + w)) * 2
    assert _expert_bytes(cm, T) == pytest.approx(L * (hit * expert_w + acts))
    bd = cm.breakdown(T, 40.0, 44, T, T)
    assert bd["experts_gate_up"]["flops"] == pytest.approx(L * 2 * pairs * 2 * w * h)
    # no skew: the mean rank, T k / ep pairs
    assert RooflineCost(m, H200, tp=2, ep=2).breakdown(T, 40.0, 44, T, T)["experts_gate_up"]["flops"] == \
        pytest.approx(L * 2 * (T / 2) * 2 * w * h)


# --- a tiny MoE by hand ----------------------------------------------------------------------------
TINY = dict(name="tiny-moe", layers=2, hidden=64, heads=4, kv_heads=2, head_dim=16, mlp_width=128, vocab=100,
            experts=4, experts_per_token=2, expert_width=32)


def _tiny(**kw) -> ModelShape:
    sc = config.parse({"model": {**TINY, **kw}, "workload": {"rate": 1, "num_requests": 1},
                       "topologies": {"a": {"kind": "colocated"}}})
    return resolve_model(sc)


def _expert_bytes(cm, tokens):
    bd = cm.breakdown(tokens, float(tokens * 10), tokens * 11, tokens, tokens)
    return sum(bd[k]["bytes"] for k in bd if k.startswith("experts_") and k != "experts_act")


def test_moe_decode_weight_bytes_by_hand():
    m = _tiny()
    h, w, L = 64, 32, 2
    expert_w = 3 * h * w * 2                   # gate, up, down of one expert in bf16
    for tokens, hit in ((1, 2.0), (4, 3.75)):  # one token hits its 2 experts; 4 tokens 4 (1 - 1/2^4)
        acts = tokens * 2 * ((2 * w + h) + (h + w)) * 2      # token-expert pairs x (N + K) x bf16
        assert _expert_bytes(RooflineCost(m, H200), tokens) == pytest.approx(L * (hit * expert_w + acts))
    # ep = tp = 2: each GPU holds 2 whole experts, is hit by 2 (1 - 1/2^4) of them and gets half the pairs
    tokens = 4
    acts = tokens * 2 / 2 * ((2 * w + h) + (h + w)) * 2
    cm = RooflineCost(m, H200, tp=2, ep=2)
    assert _expert_bytes(cm, tokens) == pytest.approx(L * (1.875 * expert_w + acts))
    # FLOPs: every token-expert pair, not every expert
    bd = cm.breakdown(4, 40.0, 44, 4, 4)
    assert bd["experts_gate_up"]["flops"] + bd["experts_down"]["flops"] == pytest.approx(L * 2 * 4 * 2 / 2 * 3 * h * w)


def test_weights_per_gpu_by_hand():
    m = _tiny(shared_experts=1, dense_layers=1)
    h, w, f, V = 64, 32, 128, 100
    attn = 2 * (h * 4 * 16) + 2 * (h * 2 * 16)               # q, o; k, v
    dense_mlp, expert, router = 3 * h * f, 3 * h * w, h * 4
    assert m.params == 2 * attn + dense_mlp + (4 + 1) * expert + router + 2 * V * h
    assert m.active_params() == 2 * attn + dense_mlp + (2 + 1) * expert + router + 2 * V * h
    # fp8 weights on tp=4, ep=2: dense part / 4, the 4 routed experts / 2 GPU groups of 2 (each expert
    # split in 2: / 4 in all), the bf16 router replicated, embeddings bf16 / 4
    got = m.weight_bytes_per_gpu("fp8", tp=4, ep=2)
    assert got == pytest.approx((2 * attn + dense_mlp + expert) / 4 + 4 * expert / 4 + router * 2 + 2 * V * h * 2 / 4)
    # ep = tp: experts / ep whole experts per GPU
    assert m.weight_bytes_per_gpu("fp8", 2, 2) - m.weight_bytes_per_gpu("fp8", 2, 1) == 0


def test_alltoall_only_under_dp_attention_and_tp_attention_keeps_every_allreduce():
    ds = get_model("deepseek-v3")
    ep1 = RooflineCost(ds, H200, 8, "fp8", "fp8", 1).breakdown(64, 64 * 1000.0, 64 * 1001, 64, 64)
    ep8 = RooflineCost(ds, H200, 8, "fp8", "fp8", 8).breakdown(64, 64 * 1000.0, 64 * 1001, 64, 64)
    # TP attention: every GPU holds every token, so EP dispatches nothing and the MoE layer's all-reduce stays
    assert "alltoall" not in ep1 and "alltoall" not in ep8
    ar1 = RooflineCost(ds, H200, 8, "fp8", "fp8", 1).ops(64, 64e3, 64064, 64, 64)
    ar8 = RooflineCost(ds, H200, 8, "fp8", "fp8", 8).ops(64, 64e3, 64064, 64, 64)
    count = {o.name: o.count for o in ar1}, {o.name: o.count for o in ar8}
    assert count[0]["allreduce"] == count[1]["allreduce"] == 2 * 61 + 1
    assert ep8["allreduce"]["time_s"] == ep1["allreduce"]["time_s"]
    # DP attention over 8 ranks: 64 requests, 8 on the busiest rank; 58 MoE layers each dispatch and combine
    # that rank's 8 tokens; each token goes to every other rank holding one of its 8 experts (32 of the 256 on
    # each rank): 7 x (1 - C(224, 8) / C(256, 8)) = 4.6328 copies; dispatch in fp8 (fp8 weights), combine in
    # bf16: 7168 x (1 + 2) / 2 B a copy per kernel on average; no all-reduce
    dp = RooflineCost(ds, H200, 8, "fp8", "fp8", 8, dp_attention=True).ops(64, 64e3, 64064, 64, 64)
    a2a = next(o for o in dp if o.name == "alltoall")
    fan = 7 * (1 - math.comb(224, 8) / math.comb(256, 8))
    assert round(fan, 4) == 4.6328
    assert a2a.count == 2 * 58 and a2a.args[1:] == (8, 8)
    assert a2a.args[0] == pytest.approx(8 * 7168 * 1.5 * fan, rel=1e-12)
    # bf16 weights: bf16 both ways
    bf = RooflineCost(ds, H200, 8, "bf16", "bf16", 8, dp_attention=True).ops(64, 64e3, 64064, 64, 64)
    assert next(o for o in bf if o.name == "alltoall").args[0] == pytest.approx(8 * 7168 * 2 * fan, rel=1e-12)
    assert not any(o.name == "allreduce" for o in dp)


def test_mla_attention_by_hand():
    ds = get_model("deepseek-v3")
    cm = RooflineCost(ds, H200, 8, "fp8", "fp8", 8)
    b, c = 16, 1000
    dec = cm.breakdown(b, float(b * c), b * (c + 1), b, b)["attention"]
    qh = 128 // 8
    # absorbed decode: 16 heads score 512 + 64 dims and sum 512 of the shared latent per context token
    assert dec["flops"] == pytest.approx(61 * 2 * qh * (2 * 512 + 64) * b * c)
    assert dec["bytes"] == pytest.approx(61 * (b * (c + 1) * 576 * 1 + b * qh * (2 * 512 + 64) * 2))
    p = 512
    pre = cm.breakdown(p, p * p / 2.0, p, 1, 1)["attention"]
    # decompressed prefill: keys of 128 + 64 and values of 128 per head
    assert pre["flops"] == pytest.approx(61 * 2 * qh * (128 + 64 + 128) * p * p / 2)


# --- the fast paths ------------------------------------------------------------------------------
@pytest.mark.parametrize("name,tp,ep,wd,skew", [("deepseek-v3", 8, 8, "fp8", 0.0), ("qwen3-30b-a3b", 1, 1, "bf16", 0.0),
                                                ("mixtral-8x7b", 4, 2, "bf16", 0.0), ("gpt-oss-120b", 2, 2, "fp8", 0.0),
                                                ("deepseek-v3", 8, 4, "fp8", 1.2)])
def test_decode_steps_equal_repeated_step(name, tp, ep, wd, skew):
    cm = RooflineCost(get_model(name), H200, tp, wd, "fp8", ep, skew)
    rng = np.random.default_rng(3)
    for batch in (1, 7, 200):
        c0 = rng.integers(10, 4000, batch)
        attn0, kv0 = float(c0.sum()), int((c0 + 1).sum())
        got = cm.decode_steps(batch, attn0, kv0, 150)
        ref = CostModel.decode_steps(cm, batch, attn0, kv0, 150)      # step() called 150 times
        for g, r in zip(got, ref):
            assert np.allclose(g, r, rtol=1e-12, atol=0)
        st = cm.step(batch, attn0, kv0, batch, batch)
        bd = cm.breakdown(batch, attn0, kv0, batch, batch)
        assert sum(v["time_s"] for v in bd.values()) == pytest.approx(st.time_s, rel=1e-12)
        assert sum(v["bytes"] for v in bd.values()) == pytest.approx(st.bytes, rel=1e-12)


MOE_TOPOS = [
    {"kind": "colocated", "replicas": 2, "device": "h200", "tp": 8, "ep": 8, "kv_blocks": 300, "max_running": 6},
    {"kind": "colocated", "replicas": 1, "device": "h200", "tp": 8, "ep": 8, "kv_blocks": 200,
     "chunked_prefill": {"token_budget": 128}},
    {"kind": "disaggregated", "prefill": {"device": "h200", "tp": 8, "ep": 8, "kv_blocks": 200},
     "decode": {"instances": 2, "device": "h200", "tp": 8, "ep": 4, "kv_blocks": 150, "max_running": 8,
                "expert_skew": 1.0},
     "kv_link": {"bandwidth_GBps": 5}},
]


@pytest.mark.parametrize("topo", MOE_TOPOS, ids=["colocated", "chunked", "disagg"])
def test_fast_path_equals_step_by_step_moe(topo):
    sc = config.parse({"seed": 5, "model": "deepseek-v3", "weight_dtype": "fp8", "kv_dtype": "fp8",
                       "workload": {"rate": 30, "num_requests": 30,
                                    "prompt_tokens": {"dist": "uniform", "low": 1, "high": 600},
                                    "output_tokens": {"dist": "uniform", "low": 1, "high": 200}},
                       "topologies": {"t": topo}})
    fast, slow = _both(sc)
    _assert_same(fast, slow)
    assert sum(i.windows for i in fast[0].topology.instances) > 0      # the fast path did open windows


@settings(deadline=None, suppress_health_check=[HealthCheck.too_slow])   # examples: the profile (conftest)
@given(topo=st.integers(0, len(MOE_TOPOS) - 1), seed=st.integers(0, 10**6), n=st.integers(1, 40),
       rate=st.floats(0.5, 200), high=st.sampled_from([300, 3000, 6000]), skew=st.sampled_from([0.0, 1.2]))
def test_moe_nothing_lost_blocks_conserved(topo, seed, n, rate, high, skew):
    t = {**MOE_TOPOS[topo]}
    if skew:
        pools = ("prefill", "decode") if t["kind"] == "disaggregated" else ()
        t = {**t, **{p: {**t[p], "expert_skew": skew} for p in pools}} if pools else {**t, "expert_skew": skew}
    sc = config.parse({"seed": seed, "model": "deepseek-v3", "weight_dtype": "fp8", "kv_dtype": "fp8",
                       "workload": {"rate": rate, "num_requests": n,
                                    "prompt_tokens": {"dist": "uniform", "low": 1, "high": high},
                                    "output_tokens": {"dist": "uniform", "low": 1, "high": 80}},
                       "topologies": {"t": t}})
    res = simulate(sc)          # check_conservation raises on lost requests or leaked KV blocks
    df = metrics.requests_frame(res)
    assert len(df) == n == (df.status == "finished").sum() + (df.status == "rejected").sum()
    for inst in res[0].topology.instances:
        assert inst.kv.free_blocks == inst.kv.total_blocks
    for r in res[0].requests:
        if r.status == "finished":
            assert r.generated == r.output_tokens and r.first_token_s <= r.finish_s
        else:                    # only prompts no KV pool can ever hold are turned away
            assert r.reject_reason.startswith("kv_capacity")


# --- bad input: one line naming the key -----------------------------------------------------------
def _err(argv, capsys) -> str:
    rc = main(argv)
    err = capsys.readouterr().err
    assert rc == 2 and "Traceback" not in err
    assert err.startswith("pdsim: error: ") and err.count("\n") == 1, err
    return err


def _run_yaml(tmp_path, model: str, pool: str) -> list[str]:
    p = tmp_path / "s.yaml"
    p.write_text(f"model: {model}\nworkload: {{rate: 2, num_requests: 3}}\n"
                 f"topologies:\n  a: {{kind: colocated, device: h200, {pool}}}\n")
    return ["run", str(p), "--out", str(tmp_path / "o"), "--quiet"]


def test_ep_that_does_not_divide_experts_is_one_line(tmp_path, capsys):
    tiny = "{layers: 2, hidden: 64, heads: 8, kv_heads: 2, mlp_width: 128, vocab: 100, experts: 6, " \
           "experts_per_token: 2, expert_width: 32}"
    err = _err(_run_yaml(tmp_path, tiny, "tp: 4, ep: 4"), capsys)
    assert "topologies.a.ep = 4" in err and "6 experts" in err
    err = _err(_run_yaml(tmp_path, "deepseek-v3", "tp: 8, ep: 3"), capsys)     # 3 does not divide tp 8 either
    assert "topologies.a.ep = 3" in err
    err = _err(_run_yaml(tmp_path, "mixtral-8x7b", "tp: 2, ep: 4"), capsys)    # divides 8 experts, not tp 2
    assert "topologies.a.ep = 4" in err and "tp=2" in err
    err = _err(_run_yaml(tmp_path, "llama-3.1-8b", "tp: 2, ep: 2"), capsys)
    assert "topologies.a.ep = 2" in err and "dense" in err
    err = _err(["estimate", "--model", "deepseek-v3", "--device", "h200", "--tp", "8", "--ep", "3",
                "--decode-batch", "4"], capsys)
    assert "--ep = 3" in err


def test_expert_skew_out_of_range_or_on_a_dense_model_is_one_line(tmp_path, capsys):
    err = _err(_run_yaml(tmp_path, "deepseek-v3", "tp: 8, expert_skew: 5"), capsys)
    assert "topologies.a.expert_skew = 5" in err
    err = _err(_run_yaml(tmp_path, "llama-3.1-8b", "expert_skew: 1"), capsys)
    assert "topologies.a.expert_skew = 1" in err and "dense" in err
    err = _err(["estimate", "--model", "deepseek-v3", "--device", "h200", "--tp", "8", "--expert-skew", "-1",
                "--decode-batch", "4"], capsys)
    assert "--expert-skew" in err


@pytest.mark.parametrize("extra,key", [("q_lora_rank: 64", "model.q_lora_rank"),
                                       ("experts_per_token: 2", "model.experts_per_token"),
                                       ("experts: 4, experts_per_token: 5, expert_width: 8", "model.experts_per_token"),
                                       ("kv_lora_rank: 32, qk_rope_head_dim: 8, v_head_dim: 16",
                                        "model.qk_nope_head_dim")])
def test_misplaced_moe_mla_fields_are_one_line(tmp_path, capsys, extra, key):
    model = f"{{layers: 2, hidden: 64, heads: 8, kv_heads: 2, mlp_width: 128, vocab: 100, {extra}}}"
    err = _err(_run_yaml(tmp_path, model, "tp: 1"), capsys)
    assert key in err


def test_estimate_deepseek_prints_per_op_times(capsys):
    rc = main(["estimate", "--model", "deepseek-v3", "--device", "h200", "--tp", "8", "--decode-batch", "64",
               "--context", "4096"])
    out = capsys.readouterr().out
    assert rc == 0
    for op in ("attention", "experts_gate_up", "shared_down", "router", "allreduce"):
        assert f"  {op} " in out
    # bf16 DeepSeek-V3 does not fit 8 H200s: the step time stands, the KV line says why there is none
    assert "KV cache: none" in out and "do not fit" in out


def test_alltoall_fanout_by_hand():
    # a token goes once to each other rank holding at least one of its k experts:
    # DeepSeek-V3 (256 experts, top 8, ep 8: 32 a rank): 7 x (1 - C(224, 8) / C(256, 8)) = 4.6328 copies
    assert alltoall_fanout(8, 256, 8) == pytest.approx(7 * (1 - math.comb(224, 8) / math.comb(256, 8)), rel=1e-15)
    # Mixtral-8x7B (8 experts, top 2) over 2 ranks: the other rank holds none of the 2 with C(4, 2) / C(8, 2) =
    # 6 / 28: 22 / 28 copies; over 8 ranks (one expert each): the 2 experts are on 2 ranks, one of them maybe
    # its own: 7 x (1 - C(7, 2) / C(8, 2)) = 7 x 7 / 28 = 1.75
    assert alltoall_fanout(2, 8, 2) == pytest.approx(22 / 28, rel=1e-15)
    assert alltoall_fanout(2, 8, 8) == pytest.approx(1.75, rel=1e-15)
    assert alltoall_fanout(8, 256, 1) == 0.0
    # top-1 under a skew: 4 experts, popularity 1, 1/2, 1/3, 1/4, round robin over 2 ranks: the token lands on
    # exactly one rank, its own with probability 1/2: 0.5 copies whatever the skew
    assert alltoall_fanout(1, 4, 2, skew=1.0) == pytest.approx(0.5, rel=1e-12)
    # a skew concentrates the picks on fewer ranks: fewer copies than uniform routing's
    assert alltoall_fanout(8, 256, 8, skew=1.0) < alltoall_fanout(8, 256, 8, skew=0.5) < alltoall_fanout(8, 256, 8)
