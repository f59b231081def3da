"""Speculative decoding (pdsim/speculative.py) against hand-worked timings and the acceptance process.

Oracles: finish times summed by hand from the constant / linear cost models; tokens per verify step
from the definition (1 + leading accepted drafts, i.i.d. per position); the mean
(1 - p^(k+1)) / (1 - p) and the variance of that distribution (worked out here by enumeration)
for a statistical bound; output-token conservation; the step-by-step loop.
"""
from __future__ import annotations

import math

import numpy as np
import pytest

from pdsim import metrics
from pdsim.config import SpeculativeSpec
from pdsim.costmodel import RooflineCost
from pdsim.devices import get_device
from pdsim.errors import ConfigError
from pdsim.models import get_model
from pdsim.simulation import simulate
from pdsim.speculative import Speculator, mean_tokens_per_step

from conftest import scenario

STEP = 0.01


def _colocated(spec: dict, **pool) -> dict:
    base = {"kind": "colocated", "replicas": 1, "kv_blocks": 10000,
            "cost_model": {"kind": "constant", "step_s": STEP}, "speculative": spec}
    base.update(pool)
    return {"c": base}


def _one(topos, output_tokens: int, prompt_tokens: int = 100, **wl):
    sc = scenario(topos, num_requests=1, arrival="constant", rate=1.0, prompt_tokens=prompt_tokens,
                  output_tokens=output_tokens, **wl)
    sc.client.itl = "on"
    res = simulate(sc)
    (r,) = res[0].requests
    return res, r


def _groups(token_s) -> list[int]:
    """Tokens streamed at each distinct instant (one verify step streams its tokens at once)."""
    t = np.asarray(token_s)
    return np.diff(np.flatnonzero(np.r_[True, np.diff(t) != 0, True])).tolist()


@pytest.mark.parametrize("draft_frac", [0.5])
def test_acceptance_one_gives_k_plus_one_tokens_per_step(draft_frac):
    # k=3, every draft accepted: after the prefill's token each verify step streams 4 tokens
    res, r = _one(_colocated({"k": 3, "acceptance": 1.0, "draft_cost_fraction": draft_frac}), 13)
    assert _groups(r.token_s) == [1, 4, 4, 4]
    # each verify step: the target step (constant) + 3 draft steps of 0.5 x a target step
    assert r.finish_s - r.arrival_s == pytest.approx(STEP + 3 * (STEP + 3 * draft_frac * STEP), abs=1e-12)
    s = res[0].topology.pools[0].spec_dec.summary()
    assert s["tokens_per_verify_step"] == 4.0 and s["draft_acceptance_rate"] == 1.0


def test_acceptance_one_last_step_truncates():
    # 11 tokens: 1 + 4 + 4, then 2 left: the last step drafts 1 and streams 2 (never more than asked)
    res, r = _one(_colocated({"k": 3, "acceptance": 1.0, "draft_cost_fraction": 0.5}), 11)
    assert _groups(r.token_s) == [1, 4, 4, 2]
    assert r.generated == 11 and len(r.token_s) == 11
    assert r.finish_s - r.arrival_s == pytest.approx(STEP + 2 * 0.025 + (STEP + 0.5 * STEP), abs=1e-12)


def test_acceptance_zero_gives_one_token_per_step():
    res, r = _one(_colocated({"k": 3, "acceptance": 0.0, "draft_cost_fraction": 0.5}), 11)
    assert _groups(r.token_s) == [1] * 11
    # 10 verify steps; drafts d = min(3, left - 1) for left = 10..1: 3 (x7), 2, 1, 0
    drafts = [min(3, left - 1) for left in range(10, 0, -1)]
    assert drafts == [3] * 7 + [2, 1, 0]
    assert r.finish_s - r.arrival_s == pytest.approx(STEP + sum(STEP + 0.5 * d * STEP for d in drafts), abs=1e-12)


def test_verify_step_cost_by_hand_linear_model():
    # linear model: base + per_token x T + per_kv x KV tokens read.  Prompt 100, 5 output tokens:
    # prefill (T=100, KV 100), then one verify step with 3 drafts (T = 1 + 3, KV = 100 + 4) that
    # streams the other 4, plus 3 draft steps at 0.5 x a one-token decode at contexts 100, 101, 102
    base, pt, pk = 1e-3, 1e-4, 1e-6
    topos = _colocated({"k": 3, "acceptance": 1.0, "draft_cost_fraction": 0.5},
                       cost_model={"kind": "linear", "base_s": base, "per_token_s": pt, "per_kv_token_s": pk})
    _, r = _one(topos, 5)
    prefill = base + 100 * pt + 100 * pk
    verify = base + 4 * pt + 104 * pk
    drafts = 0.5 * sum(base + pt + (101 + j) * pk for j in range(3))
    assert r.finish_s - r.arrival_s == pytest.approx(prefill + verify + drafts, abs=1e-12)
    assert _groups(r.token_s) == [1, 4]


def test_mixed_draft_lengths_in_one_step_by_hand():
    # two requests arrive together (prompt 100 each; 3 and 13 output tokens), every draft accepted.
    # Step 1 prefills both (T = 200).  Step 2 verifies A with d = 1 (2 tokens left) and B with d = 3:
    # T = 2 + 4, KV read (100 + 2) + (100 + 4); draft step 1 holds both (contexts 100, 100), draft
    # steps 2 and 3 only B (contexts 101, 102).  A finishes at the end of step 2.
    base, pt, pk = 1e-3, 1e-4, 1e-6
    topos = _colocated({"k": 3, "acceptance": 1.0, "draft_cost_fraction": 0.5},
                       cost_model={"kind": "linear", "base_s": base, "per_token_s": pt, "per_kv_token_s": pk})
    sc = scenario(topos, num_requests=2)
    from pdsim.simulation import resolve_model, run_topology
    from pdsim.workload import Request
    stream = [Request(0, 0.0, 100, 3), Request(1, 0.0, 100, 13)]      # a hand-made stream, both at t = 0
    r = run_topology(sc, "c", sc.topologies["c"], stream, resolve_model(sc), 1.0)
    ra, rb = r.requests
    prefill = base + 200 * pt + 200 * pk
    verify = base + 6 * pt + 206 * pk
    drafts = 0.5 * ((base + 2 * pt + 202 * pk) + (base + pt + 102 * pk) + (base + pt + 103 * pk))
    assert ra.finish_s == pytest.approx(prefill + verify + drafts, abs=1e-12)
    assert ra.generated == 3 and rb.generated == 13


def test_verify_step_roofline_more_flops_same_weight_bytes():
    # a verify step of B requests with k drafts computes B(k+1) tokens: the linear layers' FLOPs grow
    # (k+1)x, their weight bytes stay (read once); worked from the model shape, not the cost model
    m, dev = get_model("llama-3.1-8b"), get_device("h100-sxm")
    cost = RooflineCost(m, dev)
    spec = Speculator(SpeculativeSpec(k=3, acceptance=0.5, draft_cost_fraction=1e-9), cost, None, 0)
    B, c = 8, 1000
    plain = cost.step(B, B * (c + 0.5), B * (c + 1), B, B)
    verify = spec._verify_cost(B * 4, B * 4 * (c + 2.0), B * (c + 4), B * 4, B, True)
    linear_flops = 2.0 * m.layers * m.params_per_layer
    lm_head = 2.0 * m.vocab * m.hidden
    # attention (DESIGN.md): 4 n_h d per unit of work per layer; work c + 0.5 -> 4 (c + 2) per request
    attention = 4.0 * m.heads * m.head_dim * m.layers * B * (4 * (c + 2.0) - (c + 0.5))
    assert verify.flops - plain.flops == pytest.approx(B * 3 * (linear_flops + lm_head) + attention, rel=1e-3)
    weight_bytes = m.weight_bytes("bf16") - m.vocab * m.hidden * 2      # the input embedding is gathered
    extra_bytes = verify.bytes - plain.bytes
    # only activations (about 11 MB per extra token for this shape) and 3 more KV tokens per request:
    # reading the weights once more per query token would add 3 x 15 GB
    assert 0 < extra_bytes < 0.05 * weight_bytes
    assert plain.time_s < verify.time_s < 1.5 * plain.time_s      # decode is memory-bound: 4x tokens, not 4x time


def _distribution(p: float, k: int) -> np.ndarray:
    """P(tokens = 1 + j), j = 0..k: j leading acceptances then a rejection, or all k accepted."""
    probs = np.array([p ** j * (1 - p) for j in range(k)] + [p ** k])
    assert math.isclose(probs.sum(), 1.0)
    return probs


@pytest.mark.parametrize("p,k", [(0.7, 3), (0.4, 5), (0.9, 2)])
def test_mean_tokens_per_step_matches_formula(p, k):
    probs = _distribution(p, k)
    tokens = np.arange(1, k + 2)
    mu = float(probs @ tokens)
    assert mu == pytest.approx((1 - p ** (k + 1)) / (1 - p)) == mean_tokens_per_step(p, k)
    sd = math.sqrt(float(probs @ (tokens - mu) ** 2))
    spec = Speculator(SpeculativeSpec(k=k, acceptance=p, draft_cost_fraction=1.0), None, None, seed=3)
    draws = np.array([1 + spec.accepted(rid) for rid in range(200) for _ in range(100)])
    n = len(draws)
    assert abs(draws.mean() - mu) < 4 * sd / math.sqrt(n)
    # and the shape: each count's frequency within 4 binomial standard errors
    freq = np.bincount(draws - 1, minlength=k + 1) / n
    assert np.all(np.abs(freq - probs) < 4 * np.sqrt(probs * (1 - probs) / n) + 1e-12)


def test_simulated_tokens_per_step_match_formula():
    # through the simulator: long outputs (truncated last steps are a small share), p = 0.6, k = 3
    p, k = 0.6, 3
    sc = scenario(_colocated({"k": k, "acceptance": p, "draft_cost_fraction": 0.2}), num_requests=30, rate=50,
                  prompt_tokens=50, output_tokens=400)
    s = simulate(sc)[0].topology.pools[0].spec_dec.summary()
    mu = mean_tokens_per_step(p, k)
    probs = _distribution(p, k)
    sd = math.sqrt(float(probs @ (np.arange(1, k + 2) - mu) ** 2))
    n = s["verify_request_steps"]
    # truncated steps (d < k) only lower the mean; at most 2 per request of ~190 steps
    assert mu - 4 * sd / math.sqrt(n) - 2 * 30 * k / n < s["tokens_per_verify_step"] < mu + 4 * sd / math.sqrt(n)


def test_draws_depend_on_request_and_step_only():
    spec = SpeculativeSpec(k=4, acceptance=0.5, draft_cost_fraction=1.0)
    a, b = Speculator(spec, None, None, seed=7), Speculator(spec, None, None, seed=7)
    seq_a = {rid: [a.accepted(rid) for _ in range(150)] for rid in range(5)}
    seq_b = {rid: [] for rid in range(5)}
    for _ in range(150):                   # interleaved in another order: the same per-request sequences
        for rid in reversed(range(5)):
            seq_b[rid].append(b.accepted(rid))
    assert seq_a == seq_b
    c = Speculator(spec, None, None, seed=8)
    assert [c.accepted(0) for _ in range(150)] != seq_a[0]


def test_per_request_acceptance_distribution():
    spec = SpeculativeSpec(k=3, acceptance={"dist": "beta", "mean": 0.6, "std": 0.1}, draft_cost_fraction=1.0)
    s = Speculator(spec, None, None, seed=1)
    rates = np.array([s.rate(i) for i in range(4000)])
    assert abs(rates.mean() - 0.6) < 4 * 0.1 / math.sqrt(4000)
    assert abs(rates.std() - 0.1) < 0.01
    u = Speculator(SpeculativeSpec(k=3, acceptance={"dist": "uniform", "low": 0.2, "high": 0.4},
                                   draft_cost_fraction=1.0), None, None, seed=1)
    r = np.array([u.rate(i) for i in range(2000)])
    assert r.min() >= 0.2 and r.max() <= 0.4 and abs(r.mean() - 0.3) < 0.01


#: Llama-3.1-8B's shape with a multi-token-prediction head it does not have: speculative method mtp needs one
LLAMA_8B_MTP = {"name": "llama-3.1-8b-mtp", "layers": 32, "hidden": 4096, "heads": 32, "kv_heads": 8,
                "mlp_width": 14336, "vocab": 128256, "max_context": 131072, "mtp_layers": 1}
LLAMA_70B_MTP = {**LLAMA_8B_MTP, "name": "llama-3.1-70b-mtp", "layers": 80, "hidden": 8192, "heads": 64,
                 "mlp_width": 28672}


SPEC_TOPOS = {
    "colo": {"kind": "colocated", "replicas": 2, "device": "h100-sxm", "kv_blocks": 120, "max_running": 8,
             "chunked_prefill": {"token_budget": 64},
             "speculative": {"method": "draft", "k": 3, "acceptance": 0.7, "draft_model": "llama-3.2-1b"}},
    "pd": {"kind": "disaggregated", "prefill": {"instances": 1, "device": "h100-sxm"},
           "decode": {"instances": 2, "device": "h100-sxm", "kv_blocks": 80,
                      "speculative": {"method": "mtp", "k": 2, "acceptance": {"dist": "uniform", "low": 0.3,
                                                                               "high": 0.9}}},
           "kv_link": {"bandwidth_GBps": 5}},
    "plain": {"kind": "colocated", "replicas": 1, "device": "h100-sxm"},
}


@pytest.mark.parametrize("seed", [0, 1])
def test_output_tokens_conserved_and_fast_equals_step_by_step(seed):
    sc = scenario(SPEC_TOPOS, model=LLAMA_8B_MTP, num_requests=40, rate=30,
                  prompt_tokens={"dist": "uniform", "low": 10, "high": 300},
                  output_tokens={"dist": "uniform", "low": 1, "high": 60})
    sc.seed = seed
    sc.client.itl = "on"
    fast, slow = simulate(sc), simulate(sc, fast=False)
    for res in fast:
        for r in res.requests:           # every request streams exactly the tokens it asked for
            assert r.status == "finished" and r.generated == r.output_tokens == len(r.token_s), (res.name, r.id)
        for inst in res.topology.instances:
            assert inst.kv.used_blocks == 0
            if inst.spec is not None:
                assert inst.windows == 0          # the fast path is off in speculative pools
    assert fast[-1].topology.instances[0].windows > 0    # ... and still on in the plain pool
    a, b = metrics.requests_frame(fast), metrics.requests_frame(slow)
    for col in ("first_token_s", "finish_s", "ttft_s", "tpot_s"):
        assert np.allclose(a[col].to_numpy(float), b[col].to_numpy(float), rtol=0, atol=1e-9, equal_nan=True), col
    # the speculative pools really verified drafts
    spec_pools = [p for res in fast for p in res.topology.pools if p.spec_dec is not None]
    assert len(spec_pools) == 2 and all(p.spec_dec.drafted > 0 for p in spec_pools)


def test_speculation_lowers_tpot_and_draft_takes_kv_memory():
    topos = {"spec": {"kind": "colocated", "device": "h100-sxm",
                      "speculative": {"k": 3, "acceptance": 0.8, "draft_model": "llama-3.2-1b"}},
             "plain": {"kind": "colocated", "device": "h100-sxm"}}
    sc = scenario(topos, num_requests=20, rate=2, prompt_tokens=200, output_tokens=100)
    res = {r.name: r for r in simulate(sc)}
    df = metrics.requests_frame(list(res.values()))
    tpot = df.groupby("topology").tpot_s.median()
    assert tpot["spec"] < 0.75 * tpot["plain"]
    # the draft's weights (1.24 B params x 2 bytes) and KV (32 of 128 KiB per token) share the memory
    spec_blocks = res["spec"].topology.instances[0].kv.total_blocks
    plain_blocks = res["plain"].topology.instances[0].kv.total_blocks
    d, t = get_model("llama-3.2-1b"), get_model("llama-3.1-8b")
    block_bytes = 16 * t.kv_bytes_per_token()
    expect = int((plain_blocks * block_bytes - d.weight_bytes()) // (block_bytes * (1 + 32 / 128)))
    assert d.kv_bytes_per_token() / t.kv_bytes_per_token() == 32 / 128
    assert spec_blocks == expect


@pytest.mark.parametrize("topos,key", [
    ({"pd": {"kind": "disaggregated", "prefill": {"speculative": {"draft_cost_fraction": 0.1}}, "decode": {}}},
     "speculative"),
    ({"c": {"kind": "colocated", "speculative": {"k": 3}}}, "speculative"),
    ({"c": {"kind": "colocated", "speculative": {"draft_model": "llama-9b"}}}, "draft_model"),
    ({"c": {"kind": "colocated", "speculative": {"method": "mtp", "draft_model": "llama-3.2-1b"}}}, "speculative"),
    ({"c": {"kind": "colocated", "speculative": {"acceptance": 1.5, "draft_cost_fraction": 0.1}}}, "acceptance"),
    ({"c": {"kind": "colocated", "cost_model": {"kind": "constant", "step_s": 0.01},
            "speculative": {"method": "mtp"}}}, "speculative"),
])
def test_bad_speculative_config_is_one_line(topos, key):
    with pytest.raises(ConfigError) as e:
        simulate(scenario(topos, model=LLAMA_8B_MTP, num_requests=2))
    msg = str(e.value)
    assert "\n" not in msg and key in msg


def test_readme_snippet_parses_and_builds():
    # the README's speculative-decoding example is a valid pool (parsed and built, not simulated)
    import re
    import yaml
    from pathlib import Path
    text = (Path(__file__).resolve().parents[1] / "README.md").read_text()
    block = re.search(r"## Speculative decoding and energy\n\n```yaml\n(.*?)```", text, re.S).group(1)
    topos = yaml.safe_load(block)["topologies"]
    sc = scenario(topos, num_requests=2)
    sc.model = "llama-3.1-70b"
    res = simulate(sc)
    pool = res[0].topology.pools[1]
    assert pool.spec_dec is not None and pool.spec_dec.k == 3 and pool.power.cap_W == 500


def test_plan_bounds_leave_room_for_speculation():
    # every plain decode step takes >= 10 ms, so a 9 ms TPOT bound is infeasible without speculation;
    # drafting 3 tokens that are always accepted brings TPOT near 2.6 ms: the plan must not prune it
    from pdsim.plan import parse_plan
    linear = {"kind": "linear", "base_s": 0.01, "per_token_s": 1e-5, "per_kv_token_s": 1e-8}

    def plan(pool_extra):
        return parse_plan({
            "name": "spec", "model": "llama-3.1-8b", "seed": 0,
            "workload": {"arrival": "poisson", "num_requests": 100, "prompt_tokens": 100, "output_tokens": 40},
            "slo": {"ttft_s": 0.5, "tpot_s": 0.009, "attainment_target": 0.9}, "target": {"rate": 5},
            "search": {"devices": [{"name": "h100-sxm", "price_per_hour_usd": 2.0}],
                       "colocated": {"replicas": [1]},
                       "pool": {"kv_blocks": 2000, "cost_model": linear, **pool_extra}}})
    plain = plan({})
    assert all(c.infeasible for c in plain.configs)
    spec = plan({"speculative": {"k": 3, "acceptance": 1.0, "draft_cost_fraction": 0.01}})
    assert spec.configs and not any(c.infeasible for c in spec.configs)
    assert all(s.bound_rate > p.bound_rate for s, p in zip(spec.configs, plain.configs))
    # and the simulation agrees: TPOT = (10 ms verify + 3 x 0.1 ms drafts + small terms) / 4 tokens
    sc = scenario({"c": {"kind": "colocated", "kv_blocks": 2000, "cost_model": linear,
                         "speculative": {"k": 3, "acceptance": 1.0, "draft_cost_fraction": 0.01}}},
                  num_requests=1, prompt_tokens=100, output_tokens=41)
    (r,) = simulate(sc)[0].requests
    assert (r.finish_s - r.first_token_s) / 40 < 0.003


# --- speculative decoding under DP attention (DeepSeek with MTP, as SGLang and TensorRT-LLM serve it) ----------
def _dp_speculator(k: int = 2):
    from pdsim.config import PoolSpec
    from pdsim.speculative import build
    ds = get_model("deepseek-v3")
    h200 = get_device("h200")
    target = RooflineCost(ds, h200, 8, "fp8", "fp8", 8, 0.0, 1, True)
    pool = PoolSpec(device="h200", tp=8, ep=8, dp_attention=True, speculative={"method": "mtp", "k": k})
    return build(pool.speculative, pool, target, ds, "fp8", "fp8", h200, 0, "p"), target, ds, h200


def test_verify_step_under_dp_attention_prices_the_busiest_ranks_attention():
    """64 requests at context 2000 verify 2 drafts each on 8 attention ranks: a rank's attention is a one-GPU
    instance's pure verify attention on its 8 requests (24 query tokens), exactly; 12 requests put 2 on the
    busiest rank.  (Priced on the whole batch, every rank would do the 64 requests' attention.)"""
    spec, dp, ds, h200 = _dp_speculator()
    one = Speculator(SpeculativeSpec(method="mtp", k=2), RooflineCost(ds, h200, 1, "fp8", "fp8"), None, 0)
    c, q = 2000, 3                                  # context, query tokens per request (1 + d)

    def agg(n):                                     # T, attention work, KV read, sampled, requests
        return n * q, float(n * q * (c + 0.5 * q)), n * (c + q), n * q, n

    def attention_part(s, cost, n, rank):
        T, aw, kv, S, B = agg(n)
        return s._verify_cost(T, aw, kv, S, B, True).time_s - cost._static(T, S, *rank)[0]

    for n, per_rank in ((64, 8), (12, 2), (8, 1)):
        T, _, _, S, _ = agg(n)
        Ta, Sa = T * per_rank / n, S * per_rank / n
        got = attention_part(spec, dp, n, ((Ta, Sa),))
        want = attention_part(one, one.target, per_rank, ())
        assert got == pytest.approx(want, rel=1e-9), n
    # the rank holds 8 requests: far less attention than the batch's 64 on one GPU
    assert attention_part(spec, dp, 64, ((24.0, 24.0),)) < 0.5 * attention_part(one, one.target, 64, ())


def test_mtp_head_is_sharded_like_the_target_layers():
    spec, dp, _, _ = _dp_speculator()
    d = spec.draft
    assert d.model.layers == 1 and (d.tp, d.ep, d.attn_dp) == (8, 8, 8) and d.dp_attention
    # DeepSeek-V3's MTP module is a MoE block (its first 3 dense layers are not its kind): one MoE layer
    assert (d.model.moe_layers, d.model.dense_mlp_layers) == (1, 0)
    # its step grows with the batch (a layer with -2 MoE layers got cheaper)
    t = [d.decode_time(b, 2000) for b in (1, 64, 512)]
    assert t[0] < t[1] < t[2]
    assert (d.mla_tables, d.moe_tables, d.a2a_tables, d.expert_skew) == (dp.mla_tables, dp.moe_tables,
                                                                          dp.a2a_tables, dp.expert_skew)


def test_mtp_under_dp_attention_end_to_end_accepts_k_plus_one_and_conserves_tokens():
    topo = {"kind": "disaggregated", "prefill": {"device": "h200", "tp": 8, "ep": 8, "kv_blocks": 2000},
            "decode": {"device": "h200", "tp": 8, "ep": 8, "dp_attention": True, "kv_blocks": 2000,
                       "speculative": {"method": "mtp", "k": 3, "acceptance": 1.0}},
            "kv_link": {"bandwidth_GBps": 50}}
    plain = {**topo, "decode": {k: v for k, v in topo["decode"].items() if k != "speculative"}}
    sc = scenario({"spec": topo, "plain": plain}, model="deepseek-v3", num_requests=24, rate=20, prompt_tokens=500,
                  output_tokens=41)
    sc.client.itl = "on"
    res = {r.name: r for r in simulate(sc)}
    for r in res["spec"].requests:
        # the prefill's token, then 10 verify steps of 4 tokens each
        assert r.status == "finished" and r.generated == 41 == len(r.token_s) and _groups(r.token_s) == [1] + [4] * 10
    s = res["spec"].topology.pools[1].spec_dec.summary()
    assert s["tokens_per_verify_step"] == 4.0 and s["draft_acceptance_rate"] == 1.0
    tpot = metrics.requests_frame(list(res.values())).groupby("topology").tpot_s.median()
    assert tpot["spec"] < 0.5 * tpot["plain"]


def test_a_separate_draft_model_under_dp_attention_is_refused_by_key():
    topo = {"c": {"kind": "colocated", "device": "h200", "tp": 8, "ep": 8, "dp_attention": True, "kv_blocks": 500,
                  "speculative": {"method": "draft", "draft_model": "llama-3.2-1b"}}}
    sc = scenario(topo, num_requests=2)
    sc.model = "deepseek-v3"
    with pytest.raises(ConfigError, match=r"topologies\.c\.speculative\.draft_model.*DP attention") as e:
        simulate(sc)
    assert "\n" not in str(e.value)


# --- speculative decoding under pipeline parallelism -------------------------------------------------------
def test_pipeline_verify_iteration_plus_drafts_by_hand():
    # constant 10 ms a stage, pp 2: a lone request's iteration is 2 x 10 ms (the whole bubble); the prefill
    # gives the first token at 20 ms; each verify iteration is 20 ms plus 3 drafts of 0.5 x a plain decode
    # iteration (20 ms): 50 ms for 4 tokens.  13 tokens: 1 + 4 + 4 + 4, done at 20 + 3 x 50 = 170 ms.
    res, r = _one(_colocated({"k": 3, "acceptance": 1.0, "draft_cost_fraction": 0.5}, pp=2), 13)
    assert _groups(r.token_s) == [1, 4, 4, 4]
    assert r.first_token_s - r.arrival_s == pytest.approx(2 * STEP, abs=1e-12)
    assert r.finish_s - r.arrival_s == pytest.approx(2 * STEP + 3 * (2 * STEP + 3 * 0.5 * 2 * STEP), abs=1e-12)


def test_a_draft_under_pipeline_parallelism_sits_on_the_last_stage():
    # Llama-3.2-1B drafting for Llama-3.1-8B on 2 stages of one H100 each: the draft's weights come off the last
    # stage's GPU, and its KV per token (32 KiB) against that stage's share of the target's (128 / 2 KiB):
    # a block costs 1 + 2 x 32 / 128 of its share
    topos = {"spec": {"kind": "colocated", "device": "h100-sxm", "pp": 2,
                      "speculative": {"k": 3, "acceptance": 0.8, "draft_model": "llama-3.2-1b"}},
             "plain": {"kind": "colocated", "device": "h100-sxm", "pp": 2}}
    sc = scenario(topos, num_requests=6, rate=2, prompt_tokens=200, output_tokens=40)
    res = {r.name: r for r in simulate(sc)}
    plain = res["plain"].topology.pools[0]
    blocks, block_bytes = plain.instances[0].kv.total_blocks, plain.block_bytes
    d = get_model("llama-3.2-1b")
    assert block_bytes == pytest.approx(16 * get_model("llama-3.1-8b").kv_bytes_per_token() / 2, rel=1e-12)
    expect = int((blocks * block_bytes - d.weight_bytes()) // (block_bytes * (1 + 2 * 32 / 128)))
    assert res["spec"].topology.instances[0].kv.total_blocks == expect
    for r in res["spec"].requests:
        assert r.status == "finished" and r.generated == 40


@pytest.mark.parametrize("split, expect", [([10, 22], 31_556), ([22, 10], 44_746), ([16, 16], 41_110)])
def test_a_draft_under_an_uneven_pipeline_takes_memory_on_the_last_stage_only(split, expect):
    # Llama-3.1-8B on 2 stages of one H100 (80 GiB x 0.9 - 2 GiB reserve = 75,161,927,680 B for weights + KV),
    # Llama-3.2-1B draft (2,471,493,632 B of weights, 32,768 B of KV a token) on the LAST stage.  Target: a layer
    # is 218,103,808 params = 436,207,616 B, the embedding and the LM head 128256 x 4096 x 2 = 1,050,673,152 B
    # each (first / last stage), KV 4,096 B a token a layer, 16-token blocks.  The pool keeps the fewest blocks
    # any stage has room for:
    #   [10, 22]: stage 0: 10 layers + embedding = 5,412,749,312 B -> 69,749,178,368 free / (16 x 10 x 4096 =
    #     655,360) = 106,428; stage 1: 22 layers + LM head = 10,647,240,704 B, minus the draft's weights:
    #     62,043,193,344 / (16 x 22 x 4096 + 16 x 32,768 = 1,966,080) = 31,556 -> 31,556
    #   [22, 10]: stage 0: 64,514,686,976 / 1,441,792 = 44,746; stage 1 (draft): (69,749,178,368 - 2,471,493,632)
    #     / (655,360 + 524,288) = 57,032 -> 44,746
    #   (both were 28,687: the draft's weights and 2 x its KV against the busiest stage's 44,746 blocks of
    #   1,441,792 B: (44,746 x 1,441,792 - 2,471,493,632) // (1,441,792 x 1.5))
    #   [16, 16] (uniform, unchanged): 67,131,932,672 // 1,048,576 = 64,022 blocks without the draft, then
    #     (64,022 x 1,048,576 - 2,471,493,632) // (1,048,576 x (1 + 2 x 32 / 128)) = 41,110
    topos = {"spec": {"kind": "colocated", "device": "h100-sxm", "pp": 2, "pp_layers": split,
                      "speculative": {"k": 3, "acceptance": 0.8, "draft_model": "llama-3.2-1b"}}}
    (res,) = simulate(scenario(topos, num_requests=1, rate=1, prompt_tokens=20, output_tokens=3))
    assert res.topology.instances[0].kv.total_blocks == expect
    assert res.requests[0].status == "finished"


def test_mtp_under_pipeline_parallelism_is_one_layer_on_one_stage():
    topo = {"c": {"kind": "colocated", "device": "h100-sxm", "tp": 4, "pp": 2, "kv_blocks": 3000,
                  "speculative": {"method": "mtp", "k": 2, "acceptance": 1.0}}}
    sc = scenario(topo, model=LLAMA_70B_MTP, num_requests=8, rate=4, prompt_tokens=300, output_tokens=31)
    (res,) = simulate(sc)
    pool = res.topology.pools[0]
    d = pool.spec_dec.draft
    assert (d.model.layers, d.pp, d.tp, d.pp_layers) == (1, 1, 4, None)
    assert pool.spec_dec.summary()["tokens_per_verify_step"] == 3.0
    assert all(r.status == "finished" and r.generated == 31 for r in res.requests)


def test_mtp_layer_weights_per_gpu_by_hand():
    """DeepSeek-V3's MTP layer, fp8, 8 GPUs, EP8: under DP attention every GPU holds its whole attention (MLA
    projections), the shared expert, the bf16 router and 256 / 8 routed experts; under TP attention the
    attention and the shared expert are split 8 ways (MLA down-projections replicated, as vLLM shards them:
    the package's weight rule, checked for the whole model in test_dp_attention).  The embedding and LM head
    are the target's."""
    from pdsim.speculative import mtp_weight_bytes_per_gpu
    ds, h = get_model("deepseek-v3"), 7168
    attn = h * 1536 + 1536 * 128 * 192 + h * 576 + 512 * 128 * 256 + 128 * 128 * h
    expert = 3 * h * 2048
    assert mtp_weight_bytes_per_gpu(ds, "fp8", 8, 8, True) == attn + expert + 256 * expert / 8 + h * 256 * 2
    replicated = h * 1536 + h * 576                       # q_a and kv_a down-projections
    split = 1536 * 128 * 192 + 512 * 128 * 256 + 128 * 128 * h    # q_b, kv_b, o
    assert mtp_weight_bytes_per_gpu(ds, "fp8", 8, 8, False) == \
        replicated + split / 8 + expert / 8 + 256 * expert / 8 + h * 256 * 2
    # a dense model's MTP layer: one decoder layer, / tp
    ll = get_model("llama-3.1-8b")
    assert mtp_weight_bytes_per_gpu(ll, "bf16", 2) == ll.params_per_layer * 2 / 2


def test_an_mla_verify_step_with_a_prompt_chunk_prices_the_two_kernels_by_hand():
    """DeepSeek-V3 (MLA), 8 x H200, TP attention, k = 1: four requests at context 1004 (five tokens out) verify
    one draft each (2 query tokens: work 2 x (1004 + 1) = 2010, KV read 1006, 2 sampled) beside a 512-token
    prompt from empty (work 512 x 256, read 512, it samples).  The target step is the one the cost model gives
    with the verify items as its decodes: (8 tokens, 8040, 4024, 4 requests), the chunk decompressed, not the
    one-kernel price (which differs: at four decodes the decode kernel's launch floors cost about what the
    decompressed reads would)."""
    from pdsim.kvcache import KVCache
    from pdsim.scheduler import StepPlan
    from pdsim.workload import Request
    cost = RooflineCost(get_model("deepseek-v3"), get_device("h200"), 8, "fp8", "fp8", 8)
    spec = Speculator(SpeculativeSpec(k=1, acceptance=1.0, draft_cost_fraction=1e-9), cost, None, 0)
    kv = KVCache(100000, 16)
    plan = StepPlan()
    for i in range(4):
        r = Request(i, 0.0, 1000, 50)
        r.generated, r.computed = 5, 1004
        assert kv.grow(r, 1005)
        plan.add(r, 1)
    p = Request(9, 0.0, 512, 2)
    assert kv.grow(p, 512)
    plan.add(p, 512)
    c, drafts = spec.plan_step(plan, kv)
    assert drafts == [1, 1, 1, 1, -1]
    T, A, K, S, B = 4 * 2 + 512, 4 * 2010.0 + 512 * 256.0, 4 * 1006 + 512, 4 * 2 + 1, 5
    two = cost.step(T, A, K, S, B, decodes=(8, 8040.0, 4024, 4))
    assert c.time_s == pytest.approx(two.time_s + spec.draft_time_s, rel=1e-9)
    assert spec.draft_time_s < 1e-6 * two.time_s + 1e-9
    assert abs(cost.step(T, A, K, S, B).time_s - two.time_s) > 1e-4


def test_a_draft_model_equal_to_its_target_warns_by_name():
    """A draft model that is the target itself costs a whole target step per draft: a warning names the key
    and the model (a smaller draft gives none)."""
    import warnings
    from pdsim import config
    from pdsim.simulation import simulate
    raw = {"model": "llama-3.1-8b", "workload": {"rate": 1, "num_requests": 2, "prompt_tokens": 50,
                                                  "output_tokens": 5},
           "topologies": {"t": {"kind": "colocated", "speculative": {"method": "draft",
                                                                     "draft_model": "llama-3.1-8b"}}}}
    with pytest.warns(UserWarning, match=r"topologies\.t.*draft_model is the target model itself \(llama-3\.1-8b\)"):
        simulate(config.parse(raw, "s.yaml"))
    raw["topologies"]["t"]["speculative"]["draft_model"] = "llama-3.2-1b"
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        simulate(config.parse(raw, "s.yaml"))


def test_drafts_count_against_the_step_token_budget_by_hand():
    """Chunked prefill with a 10-token budget, k=3, every draft accepted, constant target step 0.01 s and
    drafts at 0.5 of it.  A (prompt 8, 13 out) and B (prompt 20, 2 out) arrive together.  Step 1: A's 8 and
    B's first 2 (no one verifies yet).  From step 2 A verifies 3 drafts, which take 3 of the budget before
    B's chunk does (vLLM charges a request's speculative tokens to the step): A 1 + 3, B 6 in steps 2, 3, 4,
    so B's prompt ends in step 4: first token at 0.01 + 3 x (0.01 + 3 x 0.005) = 0.085 s.  Had the drafts
    not counted, B would take 9 a step and be done in step 3 (0.06 s), 13 tokens in a 10-token step."""
    topos = _colocated({"k": 3, "acceptance": 1.0, "draft_cost_fraction": 0.5},
                       chunked_prefill={"token_budget": 10})
    sc = scenario(topos, num_requests=2)
    from pdsim.simulation import resolve_model, run_topology
    from pdsim.workload import Request
    r = run_topology(sc, "c", sc.topologies["c"], [Request(0, 0.0, 8, 13), Request(1, 0.0, 20, 2)],
                     resolve_model(sc), 1.0)
    a, b = r.requests
    assert b.first_token_s == pytest.approx(0.01 + 3 * 0.025, abs=1e-12)
    assert a.first_token_s == pytest.approx(0.01, abs=1e-12) and a.generated == 13


def test_a_full_budget_leaves_no_room_for_drafts_and_fcfs_is_unbudgeted():
    """Budget 2 with two decoding requests: one token each fills it, so no draft is proposed (every step
    streams one token each); under fcfs (decode steps unbudgeted) the same pair with the same budget drafts
    k=3."""
    from pdsim.simulation import resolve_model, run_topology
    from pdsim.workload import Request
    for pool, groups in (({"chunked_prefill": {"token_budget": 2}}, [1] * 9),
                         ({"scheduler": "fcfs", "max_batched_tokens": 2}, [1, 4, 4])):
        topos = _colocated({"k": 3, "acceptance": 1.0, "draft_cost_fraction": 0.5}, **pool)
        sc = scenario(topos, num_requests=2)
        sc.client.itl = "on"
        r = run_topology(sc, "c", sc.topologies["c"], [Request(0, 0.0, 1, 9), Request(1, 0.0, 1, 9)],
                         resolve_model(sc), 1.0)
        assert [_groups(q.token_s) for q in r.requests] == [groups, groups]


@pytest.mark.parametrize("budget,groups", [(5, ([1, 4, 4], [1, 1, 1, 4, 2])), (6, ([1, 4, 4], [1, 2, 2, 4]))])
def test_two_verifiers_share_the_draft_room_in_batch_order_by_hand(budget, groups):
    """A and B (1 in, 9 out each), k=3, every draft accepted, chunked budget 5 or 6.  Step 2 (both decoding):
    room = min(3 + 3, budget - 2) = 3 or 4: A takes 3, B what is left (0 or 1).  Budget 5: A 1+3, B 1; step 3
    the same (A done at 9); then B alone: room min(3, 4) = 3 -> 4 tokens, then its last 2 (d = 1).  Budget 6:
    A 1+3 and B 1+1 twice (A done), then B 1+3.  Without the room shared out a step would carry 8 tokens."""
    from pdsim.simulation import resolve_model, run_topology
    from pdsim.workload import Request
    topos = _colocated({"k": 3, "acceptance": 1.0, "draft_cost_fraction": 0.5},
                       chunked_prefill={"token_budget": budget})
    sc = scenario(topos, num_requests=2)
    sc.client.itl = "on"
    r = run_topology(sc, "c", sc.topologies["c"], [Request(0, 0.0, 1, 9), Request(1, 0.0, 1, 9)],
                     resolve_model(sc), 1.0)
    assert tuple(_groups(q.token_s) for q in r.requests) == groups
