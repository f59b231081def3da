"""DP attention (a pool's ``dp_attention``): attention data-parallel over the instance's GPUs, MoE layers
expert-parallel over all of them, as SGLang and TensorRT-LLM serve DeepSeek.

Oracles: weights and KV per GPU from DeepSeek-V3's Hugging Face config by hand; a rank's attention equals a
one-GPU instance's attention on that rank's requests (the unchanged tp=1 path); the experts equal the TP
attention instance's (same tokens over the same EP ranks); the all-to-all by hand from the device file; and
the step-by-step loop for the fast path.
"""
from __future__ import annotations

import math

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from pdsim import config, metrics
from types import SimpleNamespace as NS

from pdsim.costmodel import RooflineCost, busiest_rank
from pdsim.devices import GiB, get_device
from pdsim.models import get_model
from pdsim.simulation import simulate
from pdsim.topology import kv_blocks

from test_fastpath import _assert_same, _both
from test_moe import _err, _run_yaml

H200 = get_device("h200")
DS = get_model("deepseek-v3")


def test_weights_and_kv_per_gpu_by_hand():
    """DeepSeek-V3 fp8 on 8 x H200, DP attention: every GPU holds the whole attention (61 layers of MLA
    projections), the 3 dense MLPs, the 58 shared experts, embedding and LM head (bf16) and the routers
    (bf16); a 1/8 of the 58 x 256 routed experts.  KV: a GPU keeps the whole 576-dim fp8 latent of its own
    requests only, so the instance holds 8 GPUs' worth of distinct tokens."""
    h = 7168
    attn = h * 1536 + 1536 * 128 * 192 + h * 576 + 512 * 128 * 256 + 128 * 128 * h   # q_a, q_b, kv_a, kv_b, o
    dense_mlp = 3 * h * 18432
    expert = 3 * h * 2048
    weights = (61 * attn + 3 * dense_mlp + 58 * expert) * 1 + 2 * 129280 * h * 2 + 58 * 256 * expert / 8 \
        + 58 * h * 256 * 2
    assert DS.weight_bytes_per_gpu("fp8", 8, 8, 1, True) == pytest.approx(weights, rel=1e-12)
    pool = config.PoolSpec(device="h200", tp=8, ep=8, dp_attention=True)
    blocks, block_bytes = kv_blocks(pool, DS, "fp8", "fp8", None, "p")
    per_rank_block = 16 * 576 * 61
    free = H200.memory_bytes * 0.9 - weights - 2 * GiB
    assert blocks == 8 * int(free // per_rank_block)
    assert block_bytes == per_rank_block / 8          # per GPU, averaged: a block lives on one of the 8
    tp_blocks, _ = kv_blocks(config.PoolSpec(device="h200", tp=8, ep=8), DS, "fp8", "fp8", None, "p")
    assert blocks > 4 * tp_blocks                     # the latent is no longer replicated on every GPU


def test_a_decode_step_by_its_parts():
    """64 decoding requests at context 2000 on 8 ranks: each rank's attention is a one-GPU instance's on its
    8 requests (all 128 heads); the routed experts see all 64 tokens over 8 EP ranks, as with TP attention;
    no all-reduce; the all-to-all sends each of a rank's 8 tokens to every other rank holding one of its experts."""
    dp = RooflineCost(DS, H200, 8, "fp8", "fp8", 8, 0.0, 1, True)
    tp = RooflineCost(DS, H200, 8, "fp8", "fp8", 8)
    one = RooflineCost(DS, H200, 1, "fp8", "fp8")
    b, c = 64, 2000
    agg = lambda n: (n, float(n * c), n * (c + 1), n, n)       # noqa: E731
    got = dp.breakdown(*agg(b))
    assert got["attention"] == one.breakdown(*agg(8))["attention"]
    assert got["attn_out"] == one.breakdown(*agg(8))["attn_out"]
    for op in ("experts_gate_up", "experts_down", "experts_act"):
        assert got[op] == tp.breakdown(*agg(b))[op]
    assert "allreduce" not in got and "allreduce" in tp.breakdown(*agg(b))
    e = H200.spec.efficiency
    # a rank's 8 tokens, each to the 7 x (1 - C(224, 8) / C(256, 8)) = 4.63 other ranks that hold one of its
    # experts, 7168 x 1.5 B a copy (fp8 dispatch, bf16 combine, averaged over the two kernels)
    fan = 7 * (1 - math.comb(224, 8) / math.comb(256, 8))
    one_a2a = (e.allreduce_base_us + 7 * e.allreduce_per_peer_us) * 1e-6 + 8 * 7168 * 1.5 * fan \
        / (H200.interconnect_Bps * e.allreduce)
    assert got["alltoall"]["time_s"] == pytest.approx(2 * 58 * one_a2a, rel=1e-12)
    assert sum(v["time_s"] for v in got.values()) == pytest.approx(dp.step(*agg(b)).time_s, rel=1e-12)
    # 12 requests over 8 ranks: the step waits for a rank with 2 of them
    assert dp.breakdown(*agg(12))["attention"] == one.breakdown(*agg(2))["attention"]


def h_bytes() -> float:
    return 7168 * 2.0


def test_a_lone_request_runs_on_one_rank():
    """One request is not split: its rank does all its attention, at prefill and at decode."""
    dp = RooflineCost(DS, H200, 8, "fp8", "fp8", 8, 0.0, 1, True)
    one = RooflineCost(DS, H200, 1, "fp8", "fp8")
    P = 3000
    assert dp.breakdown(P, P * P / 2.0, P, 1, 1)["attention"] == one.breakdown(P, P * P / 2.0, P, 1, 1)["attention"]
    assert dp.breakdown(1, 5000.0, 5001, 1, 1)["attention"] == one.breakdown(1, 5000.0, 5001, 1, 1)["attention"]


def _item(computed, prompt, generated, n):
    return (NS(computed=computed, prompt_tokens=prompt, generated=generated), n)


def test_busiest_rank_deals_whole_requests_by_hand():
    """8 ranks.  20 decodes (contexts 500..519: work c + 0.5, KV c + 1, each samples) stay spread evenly: 3 on
    ranks 0-3, 2 on ranks 4-7, each carrying the mean (work 10,200 / 20, KV 10,210 / 20).  The chunks go whole,
    largest first, onto the rank with the fewest tokens: the 3000-token prompt (from empty, it samples) onto
    rank 4, the 1000-token chunk of a 4000-token prompt (no sample) onto rank 5."""
    dec = [_item(500 + i, 500, i + 1, 1) for i in range(20)]
    items = [_item(0, 4000, 0, 1000), *dec, _item(0, 3000, 0, 3000)]
    got = busiest_rank(items, 8)
    three, two = (3, 1530.0, 1531.5, 3, 3), (2, 1020.0, 1021.0, 2, 2)
    want = [three] * 4 + [(3002, 1020.0 + 4_500_000, 1021.0 + 3000, 3, 3), (1002, 1020.0 + 500_000, 1021.0 + 1000, 2, 3),
                          two, two]
    assert len(got) == 8 and all(g[:5] == pytest.approx(w) for g, w in zip(got, want)), got
    # each rank's decode part last (tokens, work, KV read, requests): what it holds besides its chunks
    assert [g[5] == pytest.approx((3, 1530.0, 1531.5, 3) if j < 4 else (2, 1020.0, 1021.0, 2))
            for j, g in enumerate(got)] == [True] * 8
    # decodes only: None (the proportional share is the same even placement)
    assert busiest_rank([_item(10, 5, 6, 1)] * 9, 8) is None
    # one rank: everything on it (a 64-token prompt from empty and a decode at context 99)
    assert busiest_rank([_item(0, 64, 0, 64), _item(99, 50, 50, 1)], 1) == \
        [(65, 64 * 32 + 99.5, 64 + 100, 2, 2, (1, 99.5, 100, 1))]
    # ranks without work are not listed: one chunk and one decode over 8 ranks
    assert busiest_rank([_item(0, 64, 0, 64), _item(99, 50, 50, 1)], 8) == \
        [(1, 99.5, 100, 1, 1, (1, 99.5, 100, 1)), (64, 2048.0, 64, 1, 1, (0, 0.0, 0.0, 0))]


def test_a_chunk_never_makes_a_decode_step_cheaper():
    """256 decodes at context 2000 on 8 ranks (32 each); a prompt chunk of 20 to 512 tokens joins the first
    rank.  The step waits for its slowest rank, so it never costs less than the decodes alone (it once did:
    the rank with the most tokens was priced, on the whole step's kernel, 39.3 -> 33.9 ms with 40 tokens)."""
    dp = RooflineCost(DS, H200, 8, "fp8", "fp8", 8, 0.0, 1, True)
    b, c = 256, 2000
    alone = dp.step(b, float(b * c), b * (c + 1), b, b).time_s
    dec = [_item(c, 1000, c - 999, 1) for _ in range(b)]
    last = alone
    for n in (1, 20, 36, 40, 64, 512, 4096):
        items = [*dec, _item(0, 8000, 0, n)]
        rank = busiest_rank(items, 8)
        t = dp.step(b + n, b * (c + 0.5) + n * n / 2, b * (c + 1) + n, b, b + 1, rank=rank).time_s if rank else \
            dp.step(b + n, b * (c + 0.5) + n * n / 2, b * (c + 1) + n, b, b + 1).time_s
        assert t >= alone * (1 - 1e-12) and t >= last * (1 - 1e-12), (n, t, alone)
        last = t


def test_a_prompt_chunk_beside_decodes_costs_its_rank_what_it_costs_alone():
    """A 3000-token prompt prefilled in the same step as 7 decodes: its rank does the whole prompt, so the
    step costs at least the prompt alone on an idle instance (the experts see 7 more tokens: within 1%); the
    proportional share (3007 tokens / 8 requests, one rank's 1/8) priced it at well under that."""
    dp = RooflineCost(DS, H200, 8, "fp8", "fp8", 8, 0.0, 1, True)
    P, c = 3000, 2000
    items = [_item(0, P, 0, P), *[_item(c, 1000, c - 999, 1) for _ in range(7)]]
    tokens, work, kv = P + 7, P * P / 2.0 + 7 * (c + 0.5), P + 7 * (c + 1)
    rank = busiest_rank(items, 8)
    assert rank[-1][:5] == (P, P * P / 2.0, P, 1, 1) and [r[:5] for r in rank[:-1]] == [(1, c + 0.5, c + 1, 1, 1)] * 7
    lone = dp.step(P, P * P / 2.0, P, 1, 1).time_s
    mixed = dp.step(tokens, work, kv, 8, 8, rank=rank).time_s
    assert lone <= mixed <= 1.01 * lone
    assert dp.step(tokens, work, kv, 8, 8).time_s < 0.6 * lone


@pytest.mark.parametrize("extra", [{}, {"engine": "sglang"}, {"power_cap_W": 500},
                                   {"speculative": {"method": "mtp", "k": 2, "acceptance": 0.8}}])
def test_a_prompt_arriving_among_decodes_waits_its_whole_prefill(tmp_path, extra):
    """Simulated: 7 short requests decode on a DP-attention instance (8 ranks) when a 3000-token prompt
    arrives; its first token comes no sooner than its prefill alone takes on the idle instance (also through
    an engine's overhead and a power cap, which wrap the cost model, and with MTP drafts in the decodes)."""
    trace = tmp_path / "t.csv"
    rows = ["arrived_at,num_prefill_tokens,num_decode_tokens"] + ["0.0,16,400"] * 7 + ["0.5,3000,4"]
    trace.write_text("\n".join(rows) + "\n")
    pool = {"kind": "colocated", "device": "h200", "tp": 8, "ep": 8, "dp_attention": True,
            "chunked_prefill": {"token_budget": 8192}, **extra}
    sc = config.parse({"model": "deepseek-v3", "weight_dtype": "fp8", "kv_dtype": "fp8",
                       "workload": {"arrival": "trace", "trace": {"path": str(trace)}},
                       "topologies": {"t": pool}}, "t.yaml")
    (res,) = simulate(sc)
    long = max(res.requests, key=lambda r: r.prompt_tokens)
    cost = res.topology.instances[0].cost
    assert long.first_token_s - long.arrival_s >= cost.prefill_time(3000) * (1 - 1e-9)
    assert all(r.first_token_s < 0.5 < r.finish_s for r in res.requests if r is not long)   # it met 7 decodes


DP_TOPOS = [
    {"kind": "colocated", "replicas": 1, "device": "h200", "tp": 8, "ep": 8, "dp_attention": True, "kv_blocks": 300,
     "max_running": 12},
    {"kind": "disaggregated", "prefill": {"device": "h200", "tp": 8, "ep": 8, "kv_blocks": 200},
     "decode": {"instances": 2, "device": "h200", "tp": 8, "ep": 8, "dp_attention": True, "kv_blocks": 150,
                "max_running": 10, "chunked_prefill": {"token_budget": 64}},
     "kv_link": {"bandwidth_GBps": 5}},
]


@settings(deadline=None, suppress_health_check=[HealthCheck.too_slow], max_examples=10)
@given(topo=st.integers(0, len(DP_TOPOS) - 1), seed=st.integers(0, 10**6), n=st.integers(1, 25),
       rate=st.floats(1, 100))
def test_fast_path_equals_step_by_step_and_nothing_lost_with_dp_attention(topo, seed, n, rate):
    sc = config.parse({"seed": seed, "model": "deepseek-v3", "weight_dtype": "fp8", "kv_dtype": "fp8",
                       "workload": {"rate": rate, "num_requests": n,
                                    "prompt_tokens": {"dist": "uniform", "low": 1, "high": 600},
                                    "output_tokens": {"dist": "uniform", "low": 1, "high": 120}},
                       "topologies": {"t": DP_TOPOS[topo]}})
    fast, slow = _both(sc)
    _assert_same(fast, slow)
    df = metrics.requests_frame(fast)
    assert len(df) == n == (df.status == "finished").sum() + (df.status == "rejected").sum()
    for inst in fast[0].topology.instances:
        assert inst.kv.free_blocks == inst.kv.total_blocks


def test_dp_attention_on_a_bad_pool_is_one_line(tmp_path, capsys):
    err = _err(_run_yaml(tmp_path, "llama-3.1-70b", "tp: 8, dp_attention: true"), capsys)
    assert "topologies.a.dp_attention = True" in err and "dense" in err
    err = _err(_run_yaml(tmp_path, "deepseek-v3", "tp: 8, ep: 4, dp_attention: true"), capsys)
    assert "topologies.a.dp_attention = True" in err and "ep = tp" in err
    err = _err(_run_yaml(tmp_path, "qwen3-30b-a3b", "tp: 2, ep: 2, pp: 2, dp_attention: true"), capsys)
    assert "topologies.a.dp_attention = True" in err and "pp=2" in err
    err = _err(["estimate", "--model", "deepseek-v3", "--device", "h200", "--tp", "8", "--dp-attention",
                "--decode-batch", "4"], capsys)
    assert "--dp-attention = True" in err


def test_summary_says_dp_attention():
    sc = config.parse({"model": "qwen3-30b-a3b", "workload": {"rate": 5, "num_requests": 4},
                       "topologies": {"t": {"kind": "colocated", "device": "h100-sxm", "tp": 2, "ep": 2,
                                            "dp_attention": True}}})
    res = simulate(sc)
    pool = metrics.summarize(res, metrics.requests_frame(res), sc)["t"]["pools"]["replica"]
    assert pool["dp_attention"] is True and pool["gpus"] == 2


def test_a_dp_attention_rank_prefills_at_most_its_share_of_the_budget():
    """Under DP attention a request runs on one of the tp ranks, each with budget / tp of a step's tokens (SGLang
    splits chunked_prefill_size over its DP ranks): a 100-token prompt alone with a 64-token budget on 2 ranks
    goes in chunks of 32, 32, 32, 4 (4 steps of 10 ms: first token at 40 ms), not 64 + 36 (20 ms); a second
    prompt 1 ms behind joins at the second step and takes its own 32 a step beside the first (the budget holds
    both): its first token 4 steps later, 49 ms after it arrived."""
    def run(dp, n):
        sc = config.parse({"model": "qwen3-30b-a3b", "workload": {"arrival": "constant", "rate": 1000.0,
                                                                   "num_requests": n, "prompt_tokens": 100,
                                                                   "output_tokens": 2},
                           "topologies": {"t": {"kind": "colocated", "tp": 2, "ep": 2, "dp_attention": dp,
                                                "kv_blocks": 1000, "chunked_prefill": {"token_budget": 64},
                                                "cost_model": {"kind": "constant", "step_s": 0.01}}}})
        (res,) = simulate(sc)
        return sorted(r.first_token_s - r.arrival_s for r in res.requests)
    assert run(True, 1) == pytest.approx([0.04], abs=1e-12)
    assert run(False, 1) == pytest.approx([0.02], abs=1e-12)
    assert run(True, 2) == pytest.approx([0.04, 0.04 - 0.001 + 0.01], abs=1e-12)


def test_engine_budgets_under_dp_attention_follow_each_engine():
    """TensorRT-LLM's max_num_tokens (8192) and vLLM's max_num_batched_tokens are per attention rank (each rank
    its own scheduler): an 8-rank instance steps up to 8 x 8192 tokens, 8192 of them a request's.  SGLang's
    chunked_prefill_size is the instance's, divided over the ranks (8192 / 8 = 1024 a rank).  Without DP
    attention every preset keeps its 8192."""
    from pdsim.topology import build
    from pdsim.simulation import Context, Sink
    import simpy
    from pathlib import Path

    def pool(engine, dp):
        sc = config.parse({"model": "deepseek-v3", "weight_dtype": "fp8", "kv_dtype": "fp8",
                           "workload": {"rate": 1, "num_requests": 1},
                           "topologies": {"t": {"kind": "colocated", "device": "h200", "tp": 8, "ep": 8,
                                                "dp_attention": dp, "engine": engine, "scheduler": "chunked"}}})
        spec = sc.topologies["t"]
        env = simpy.Environment()
        topo = build("t", spec, env, Context(get_model("deepseek-v3"), "fp8", "fp8", Path("."), 1.0), Sink(env))
        lim = topo.instances[0].limits
        return spec.max_batched_tokens, lim.max_batched_tokens, lim.max_chunk
    assert pool("trtllm", True) == (65536, 65536, 8192)
    assert pool("vllm-v1", True) == (65536, 65536, 8192)
    assert pool("sglang", True) == (8192, 8192, 1024)
    for engine in ("trtllm", "vllm-v1", "sglang"):
        assert pool(engine, False) == (8192, 8192, None)
    # the activation peak a GPU sizes its KV around: one rank's 8192 tokens and 2048 / 8 = 256 rows through
    # unsharded layers (attention TP 1), not 65536 tokens over 8-way shards
    from pdsim.engines import activation_peak_bytes, kv_cache_bytes
    spec = config.parse({"model": "deepseek-v3", "weight_dtype": "fp8", "workload": {"rate": 1, "num_requests": 1},
                         "topologies": {"t": {"kind": "colocated", "device": "h200", "tp": 8, "ep": 8,
                                              "dp_attention": True, "engine": "trtllm"}}}).topologies["t"]
    got = kv_cache_bytes(spec, DS, "fp8", H200.memory_bytes)["activation_bytes"]
    m = DS
    per_token = 2 * m.hidden + (m.heads + 2 * m.kv_heads) * m.head_dim + (3 if m.gated_mlp else 2) * m.mlp_width
    assert got == activation_peak_bytes(DS, 8192, 256, 1) == 8192 * per_token * 2.0 + 256 * m.vocab * 4.0




def test_the_plans_prefill_bound_is_a_bound_under_dp_attention():
    """The plan prunes configs whose analytic bound is below the target, so its per-token prefill price must
    not exceed what any step the simulator forms costs per token.  Under DP attention a step of 8 prompts of
    2000 tokens deals one to each rank (busiest_rank); the bound once priced the whole budget on one rank
    (batch 1), 3x what the simulator pays per token."""
    from pdsim.plan import prefill_bound_s_per_token
    dp = RooflineCost(DS, H200, 8, "fp8", "fp8", 8, 0.0, 1, True)
    spec = config.PoolSpec(device="h200", tp=8, ep=8, dp_attention=True, max_batched_tokens=16384)
    bound = prefill_bound_s_per_token(dp, spec, 2000)
    for k in (1, 4, 8):             # k prompts of 2000 tokens from empty, dealt over the ranks
        items = [_item(0, 2000, 0, 2000) for _ in range(k)]
        T = 2000 * k
        t = dp.step(T, k * 2000 * 1000.0, T, k, k, rank=busiest_rank(items, 8)).time_s
        assert bound <= t / T, (k, bound, t / T)
    one_rank = dp.step(16000, 0.0, 0, 0, 1).time_s / 16000        # the old bound's price: all on one rank
    assert one_rank > 2 * (dp.step(16000, 8 * 2000 * 1000.0, 16000, 8, 8,
                                   rank=busiest_rank([_item(0, 2000, 0, 2000)] * 8, 8)).time_s / 16000)


def test_a_dp_steps_flops_are_the_mean_over_its_ranks_by_parts():
    """FLOPs and bytes per GPU (what MFU, MBU and energy read) of a DP step with whole requests per rank: the
    mean over the 8 ranks, each rank's static part (experts on all tokens, the rest on its own) plus its
    attention; the ranks with no request run the experts alone.  A lone 512-token chunk is on one rank: its
    FLOPs are (that rank's + 7 idle ranks') / 8, not the busy rank's (3.4x more)."""
    dp = RooflineCost(DS, H200, 8, "fp8", "fp8", 8, 0.0, 1, True)
    rank = busiest_rank([_item(0, 512, 0, 512)], 8)
    assert rank == [(512, 512 * 256.0, 512, 1, 1, (0, 0.0, 0.0, 0))]
    c = dp.step(512, 512 * 256.0, 512, 1, 1, rank=rank)
    _, f_busy, b_busy = dp._static(512, 1, (512, 1))
    _, f_idle, b_idle = dp._static(512, 1, (0, 0))
    att = dp._attention_op(512, 512 * 256.0, 512, 1, True)
    assert c.flops == pytest.approx((f_busy + att.flops * att.count + 7 * f_idle) / 8, rel=1e-12)
    assert c.bytes == pytest.approx((b_busy + att.bytes * att.count + 7 * b_idle) / 8, rel=1e-12)
    assert c.time_s == pytest.approx(dp.step(512, 512 * 256.0, 512, 1, 1).time_s, rel=1e-12)   # time: the busy rank
    assert f_busy + att.flops * att.count > 3 * c.flops


def test_a_power_cap_slows_a_dp_step_by_its_slowest_ranks_own_mix():
    """A lone 4096-token prompt on one of 8 ranks under a 350 W cap: that rank is compute-bound and slows by
    max(c / f, m) / max(c, m) of its own FLOPs and bytes; the step's FLOPs (the ranks' mean, 7 of them idle)
    would look memory-bound and not slow at all (the review measured 1.000 where the rank's own is 1.3)."""
    from pdsim.energy import CappedCost, power_model
    dp = RooflineCost(DS, H200, 8, "fp8", "fp8", 8, 0.0, 1, True)
    capped = CappedCost(dp, power_model(H200, dp, 350.0, "t"))
    P = 4096
    rank = busiest_rank([_item(0, P, 0, P)], 8)
    (t, f, b), = dp.rank_costs(P, 1, rank)
    want = t * float(capped._stretch(f, b))
    got = capped.step(P, P * P / 2.0, P, 1, 1, rank=rank)
    assert got.time_s == pytest.approx(want, rel=1e-12) and want > 1.2 * t
    mean = dp.step(P, P * P / 2.0, P, 1, 1, rank=rank)
    assert float(capped._stretch(mean.flops, mean.bytes)) < want / t       # what the mean would have said


def test_a_mixed_mla_step_prices_decodes_and_chunks_on_their_own_kernels_by_parts():
    """DeepSeek-V3 (MLA), 8 x H200, TP attention: 256 decodes at context 2000 and a 512-token prompt in one
    step.  Engines run decode attention (absorbed, over the 576-dim latent) and context attention
    (decompressed) as two kernels, so the step is the static part plus the two attention ops; one
    decompressed kernel for all of it would read every decode's context at ~80 kB a token.  The step is
    at most the two alone (they share one static part), and it was once well above that."""
    tp = RooflineCost(DS, H200, 8, "fp8", "fp8", 8)
    b, c, n = 256, 2000, 512
    dec = (b, b * (c + 0.5), b * (c + 1), b)
    T, A, K = b + n, b * (c + 0.5) + n * n / 2, b * (c + 1) + n
    got = tp.step(T, A, K, b + 1, b + 1, decodes=dec)
    t_s, f_s, b_s = tp._static(T, b + 1)
    d_op = tp._attention_op(b, b * (c + 0.5), b * (c + 1), b, False)
    p_op = tp._attention_op(n, n * n / 2, n, 1, True)
    L = d_op.count
    assert got.time_s == pytest.approx(t_s + (tp.op_time(d_op)[0] + tp.op_time(p_op)[0]) * L, rel=1e-12)
    assert got.flops == pytest.approx(f_s + (d_op.flops + p_op.flops) * L, rel=1e-12)
    alone = tp.step(b, b * c, b * (c + 1), b, b).time_s + tp.prefill_time(n)
    assert got.time_s <= alone
    assert tp.step(T, A, K, b + 1, b + 1).time_s > 1.5 * alone          # one kernel for both: the old price
    # under DP attention each rank with decodes and a chunk does the same
    dp = RooflineCost(DS, H200, 8, "fp8", "fp8", 8, 0.0, 1, True)
    items = [*[_item(c, 1000, c - 999, 1) for _ in range(b)], _item(0, 8000, 0, n)]
    mixed = dp.step(T, A, K, b + 1, b + 1, rank=busiest_rank(items, 8)).time_s
    assert mixed <= dp.step(b, b * c, b * (c + 1), b, b).time_s + dp.prefill_time(n)


def test_a_prompt_among_mla_decodes_costs_at_most_both_alone(tmp_path):
    """Simulated: 64 DeepSeek-V3 requests decode (prompts of 2000) when a 512-token prompt arrives; the step
    that prefills it also decodes the 64, and costs at most a decode step of 64 at the longest context plus
    the prompt alone (so its TTFT does too): the instance passes its decodes apart (two kernels)."""
    trace = tmp_path / "t.csv"
    rows = ["arrived_at,num_prefill_tokens,num_decode_tokens"] + ["0.0,2000,600"] * 64 + ["8.0,512,2"]
    trace.write_text("\n".join(rows) + "\n")
    sc = config.parse({"model": "deepseek-v3", "weight_dtype": "fp8", "kv_dtype": "fp8",
                       "workload": {"arrival": "trace", "trace": {"path": str(trace)}},
                       "topologies": {"t": {"kind": "colocated", "device": "h200", "tp": 8, "ep": 8,
                                            "chunked_prefill": {"token_budget": 8192}}}}, "t.yaml")
    (res,) = simulate(sc)
    late = max(res.requests, key=lambda r: r.arrival_s)
    cost = res.topology.instances[0].cost
    assert all(r.first_token_s < 8.0 < r.finish_s for r in res.requests if r is not late)   # it met 64 decodes
    bound = cost.decode_time(64, 2600) + cost.prefill_time(512)
    assert late.first_token_s - late.arrival_s <= bound
