"""Pipeline parallelism (pdsim/pipeline.py): stages, micro-batches, per-stage weights and KV.

Oracles: the pipeline period worked out by hand from a ``linear`` cost model (a stage's step time is
base + per_token x tokens, so every period is arithmetic); for the roofline, the stage times of a
model cut to L / pp layers priced by the unchanged whole-model path (``RooflineCost`` at pp = 1)
plus the interconnect numbers of the device file; KV pool sizes from the parameter counts by hand;
and the step-by-step loop for the fast path.
"""
from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from pdsim import config, metrics
from pdsim.__main__ import main
from pdsim.costmodel import LinearCost, RooflineCost
from pdsim.devices import GiB, get_device
from pdsim.models import get_model
from pdsim.pipeline import PipelineCost
from pdsim.simulation import simulate
from pdsim.topology import kv_blocks, make_cost

from test_fastpath import _assert_same, _both
from test_moe import _err, _run_yaml

H100 = get_device("h100-sxm")
BASE_S, PER_TOKEN_S = 0.004, 1e-5
LINEAR = {"kind": "linear", "base_s": BASE_S, "per_token_s": PER_TOKEN_S}


def _sc(topo: dict, model="llama-3.1-8b", **workload) -> config.Scenario:
    w = {"arrival": "poisson", "rate": 1.0, "num_requests": 1, "prompt_tokens": 100, "output_tokens": 1}
    w.update(workload)
    return config.parse({"seed": 0, "model": model, "workload": w, "topologies": {"t": topo}}, "test.yaml")


def _requests(sc):
    return metrics.requests_frame(simulate(sc))


# --- a lone request: the whole bubble ------------------------------------------------------------
@pytest.mark.parametrize("pp", [1, 2, 4])
def test_lone_request_takes_stages_times_stage_time(pp):
    """Linear stages: a lone prompt of 100 tokens passes pp stages of base + 100 per_token each, and each
    of its decode steps pp stages of base + 1 per_token (no interconnect, no overhead in a what-if model)."""
    topo = {"kind": "colocated", "cost_model": LINEAR, "kv_blocks": 1000, "pp": pp}
    df = _requests(_sc(topo, output_tokens=5))
    stage_prefill_s = BASE_S + 100 * PER_TOKEN_S
    stage_decode_s = BASE_S + 1 * PER_TOKEN_S
    assert df.ttft_s[0] == pytest.approx(pp * stage_prefill_s, rel=1e-12)
    assert df.tpot_s[0] == pytest.approx(pp * stage_decode_s, rel=1e-12)


def test_lone_request_on_the_roofline_is_the_sum_of_its_stages_plus_transfers():
    """tp2 x pp2 Llama-3.1-8B on H100: TTFT of a lone 1000-token prompt = overhead + stage 0 + stage 1 +
    one activation send.  Each stage is priced by the unchanged pp = 1 cost path on a 16-layer cut of the
    model: stage 0 without the LM head, stage 1 without the embedding and the embedding's all-reduce."""
    P, L, tp = 1000, 32, 2
    m = get_model("llama-3.1-8b")
    half = dataclasses.replace(m, layers=L // 2)
    agg = (P, P * P / 2.0, P, 1, 1)
    bd = RooflineCost(half, H100, tp).breakdown(*agg)
    whole = sum(v["time_s"] for v in bd.values())
    one_allreduce = bd["allreduce"]["time_s"] / (2 * (L // 2) + 1)
    stage0 = whole - bd["lm_head"]["time_s"] - bd["step_overhead"]["time_s"]
    stage1 = whole - bd["embed"]["time_s"] - bd["step_overhead"]["time_s"] - one_allreduce
    # activations: 1000 tokens x 4096 hidden x 2 bytes, hidden states and residual (vLLM's IntermediateTensors),
    # over NVLink4 (450 GB/s x 0.58 link efficiency, 6 us)
    transfer = 6e-6 + 2 * P * 4096 * 2 / (450e9 * 0.58)
    overhead = 800e-6                        # the device file's step_overhead_us
    res = simulate(_sc({"kind": "colocated", "device": "h100-sxm", "tp": tp, "pp": 2}, prompt_tokens=P))
    assert metrics.requests_frame(res).ttft_s[0] == pytest.approx(overhead + stage0 + stage1 + transfer, rel=1e-9)
    # FLOPs and bytes are per GPU: the whole model's per-TP-rank work spread over the 2 stages' GPUs
    whole_model = RooflineCost(m, H100, tp).step(*agg)
    inst = res[0].topology.instances[0]
    assert inst.gpus == 4
    assert inst.flops == pytest.approx(whole_model.flops / 2, rel=1e-12)
    assert inst.bytes == pytest.approx(whole_model.bytes / 2, rel=1e-12)


def test_stage_split_conserves_the_whole_models_work():
    """Every operator lands on exactly one stage: stage times + overhead = the whole model's step (the pp=1
    path), FLOPs and bytes too, for a dense and an MoE model (even splits; uneven ones:
    tests/test_pp_uneven.py)."""
    for name, tp, ep, pp in (("llama-3.1-70b", 4, 1, 4), ("qwen3-30b-a3b", 2, 2, 3)):
        m = get_model(name)
        one = RooflineCost(m, H100, tp, "bf16", "bf16", ep)
        split = RooflineCost(m, H100, tp, "bf16", "bf16", ep, 0.0, pp)
        for agg in ((512, 512 * 256.0, 512, 1, 1), (64, 64 * 3000.0, 64 * 3001, 64, 64)):
            s, f, b = split.stage_times(*agg)
            ref = one.step(*agg)
            assert len(s) == pp
            assert sum(s) + H100.step_overhead_s == pytest.approx(ref.time_s, rel=1e-12)
            assert f == pytest.approx(ref.flops, rel=1e-12) and b == pytest.approx(ref.bytes, rel=1e-12)
            assert split.step(*agg) == ref           # the pp field changes nothing outside stage_times


# --- saturated decode: micro-batches -------------------------------------------------------------
@pytest.mark.parametrize("pp,m,expected_s", [
    # B = 8 decoding requests; a stage of b requests costs s(b) = BASE_S + b PER_TOKEN_S
    (2, 2, 2 * (BASE_S + 4 * PER_TOKEN_S)),     # 2 micro-batches of 4: max(2 s(4) per stage, trip 2 s(4))
    (2, 4, 4 * (BASE_S + 2 * PER_TOKEN_S)),     # 4 of 2: each stage runs all four, 4 s(2) > trip 2 s(2)
    (2, 1, 2 * (BASE_S + 8 * PER_TOKEN_S)),     # one micro-batch: the whole bubble, 2 s(8)
    (2, 3, 3 * BASE_S + 8 * PER_TOKEN_S),       # 3, 3, 2: a stage's load 2 s(3) + s(2) > trip 2 s(3)
    (4, 2, 4 * (BASE_S + 4 * PER_TOKEN_S)),     # fewer micro-batches than stages: the trip, 4 s(4)
])
def test_saturated_decode_iteration_matches_the_formula(pp, m, expected_s):
    topo = {"kind": "colocated", "cost_model": LINEAR, "kv_blocks": 1000, "pp": pp, "micro_batches": m}
    cost = make_cost(config.PoolSpec(**{k: v for k, v in topo.items() if k != "kind"}), get_model("llama-3.1-8b"),
                     "bf16", "bf16", None, "t")
    assert cost.step(8, 8 * 100.0, 8 * 101, 8, 8).time_s == pytest.approx(expected_s, rel=1e-12)
    # end to end: 8 closed-loop clients start together (one prefill step of 8 x 50 tokens, split the same way),
    # then decode in lock step: every TPOT is one iteration
    df = _requests(_sc(topo, arrival="closed", clients=8, rate=None, num_requests=8, prompt_tokens=50,
                        output_tokens=30))
    assert np.allclose(df.tpot_s, expected_s, rtol=1e-9, atol=0)


def test_micro_batches_raise_decode_throughput_to_the_slowest_stage():
    """Roofline, Llama-3.1-70B tp4 x pp2, 64 requests at context 2048: one micro-batch waits for the whole
    bubble; pp micro-batches keep both stages busy, so the iteration is bound by one stage's work on both
    micro-batches (about half the bubble of the single micro-batch)."""
    m = get_model("llama-3.1-70b")
    stages = RooflineCost(m, H100, 4, pp=2)
    agg = (64, 64 * 2048.0, 64 * 2049, 64, 64)
    one = PipelineCost(stages, 2, 1).step(*agg).time_s
    two = PipelineCost(stages, 2, 2).step(*agg).time_s
    s1 = stages.stage_times(*agg)[0]                       # 64 requests per stage pass
    s2 = stages.stage_times(32, 32 * 2048.0, 32 * 2049, 32, 32)[0]
    x1, x2 = (stages.stage_transfer_s(b) for b in (64, 32))
    o = H100.step_overhead_s
    assert one == pytest.approx(o + s1[0] + s1[1] + x1, rel=1e-12)
    assert two == pytest.approx(max(2 * s2[0], 2 * s2[1], o + s2[0] + s2[1] + x2), rel=1e-12)
    assert two < one          # memory-bound decode: two passes of 32 cost about one of 64 per stage


# --- memory: per-stage weights and KV -----------------------------------------------------------
def test_kv_capacity_grows_with_pp_by_hand():
    """Llama-3.1-70B, tp4, H100 80 GiB x 0.9 - 2 GiB reserve.  Per GPU: the stage's 80/pp layers of
    855,638,016 parameters / tp (bf16) + one vocab-parallel embedding or LM head (128256 x 8192 / tp, bf16;
    pp = 1 holds both), KV of 80/pp layers x 2 local KV heads x 128 x 2 (K, V) x 2 bytes per token."""
    m = get_model("llama-3.1-70b")
    per_layer = 8192 * 8192 * 2 + 2 * 8192 * 1024 + 3 * 8192 * 28672
    assert m.params_per_layer == per_layer == 855_638_016
    emb = 128256 * 8192
    tokens = {}
    for pp in (1, 2, 4):
        layers = 80 // pp
        weights = (layers * per_layer + emb * (2 if pp == 1 else 1)) * 2 / 4
        kv_per_token = layers * 2 * 128 * 2 * 2
        free = 80 * GiB * 0.9 - weights - 2 * GiB
        blocks, block_bytes = kv_blocks(config.PoolSpec(device="h100-sxm", tp=4, pp=pp), m, "bf16", "bf16", None, "p")
        assert block_bytes == 16 * kv_per_token
        assert blocks == int(free // block_bytes)
        tokens[pp] = blocks * 16
    assert tokens[4] > 2 * tokens[2] > 4 * tokens[1]      # more than linear: each GPU also holds fewer weights


def test_weights_per_gpu_of_an_moe_stage_split_by_hand():
    """4 layers, the first dense, pp 2: stage 0 = 1 dense + 1 MoE layer + embedding, stage 1 = 2 MoE layers
    + LM head; the heavier (stage 1) bounds the pool."""
    from pdsim.models import ModelShape
    shape = ModelShape("tiny-moe", 4, 64, 8, 2, 8, 256, 1000, experts=8, experts_per_token=2, expert_width=32,
                       dense_layers=1)
    attn = 64 * 64 + 2 * 64 * 16 + 64 * 64                 # q, k, v (2 heads of 8), o
    dense_mlp, moe = 3 * 64 * 256, 8 * 3 * 64 * 32         # gated MLP; 8 experts of width 32
    router = 64 * 8                                        # bf16, replicated
    stage0 = (2 * attn + dense_mlp + moe) * 1.0 / 2 + router * 2 + 1000 * 64 * 2 / 2    # fp8 weights, tp 2
    stage1 = (2 * attn + 2 * moe) * 1.0 / 2 + 2 * router * 2 + 1000 * 64 * 2 / 2
    assert stage1 > stage0
    assert shape.stage_layers(2) == [(1, 1), (0, 2)]                       # (dense, MoE) layers per stage
    assert dataclasses.replace(shape, dense_layers=3).stage_layers(2) == [(2, 0), (1, 1)]
    assert dataclasses.replace(shape, dense_layers=3).stage_layers(4) == [(1, 0), (1, 0), (1, 0), (0, 1)]
    assert shape.weight_bytes_per_gpu("fp8", 2, 1, 2) == pytest.approx(stage1, rel=1e-12)


# --- disaggregated: KV transfer per stage ------------------------------------------------------
def test_kv_transfer_of_a_pp_prefill_goes_over_every_stages_links():
    """Prefill tp1 x pp2: the two stages each send their layers' KV over their own GPU's link, so the
    whole prompt's KV (unchanged bytes) moves at 2 x the per-GPU bandwidth."""
    P = 1000
    topo = {"kind": "disaggregated", "prefill": {"device": "h100-sxm", "pp": 2},
            "decode": {"device": "h100-sxm"}, "kv_link": {"bandwidth_GBps": 10, "latency_us": 20}}
    df = _requests(_sc(topo, prompt_tokens=P, output_tokens=3))
    kv_bytes = P * 2 * 32 * 8 * 128 * 2                    # Llama-3.1-8B: 128 KiB per token
    assert df.kv_transfer_s[0] == pytest.approx(20e-6 + kv_bytes / (10e9 * 2), rel=1e-12)


# --- pp = 1 is the old path ---------------------------------------------------------------------
def test_pp1_builds_no_pipeline_and_reproduces_the_run():
    base = {"kind": "colocated", "device": "h100-sxm", "tp": 2, "kv_blocks": 400, "max_running": 8}
    kw = dict(num_requests=30, rate=20, prompt_tokens={"dist": "uniform", "low": 10, "high": 400},
              output_tokens={"dist": "uniform", "low": 1, "high": 60})
    pool = config.PoolSpec(device="h100-sxm", tp=2, pp=1)
    assert type(make_cost(pool, get_model("llama-3.1-8b"), "bf16", "bf16", None, "p")) is RooflineCost
    a = metrics.requests_frame(simulate(_sc(base, **kw)))
    b = metrics.requests_frame(simulate(_sc({**base, "pp": 1}, **kw)))
    assert a.equals(b)


# --- fast path and invariants on PP topologies -----------------------------------------------------
PP_TOPOS = [
    {"kind": "colocated", "replicas": 2, "device": "h100-sxm", "tp": 2, "pp": 2, "kv_blocks": 60, "max_running": 6},
    {"kind": "colocated", "replicas": 1, "device": "h100-sxm", "pp": 4, "micro_batches": 3, "kv_blocks": 40,
     "chunked_prefill": {"token_budget": 64}},
    {"kind": "colocated", "replicas": 1, "pp": 2, "kv_blocks": 80,
     "cost_model": {"kind": "linear", "base_s": 0.004, "per_token_s": 2e-5, "per_kv_token_s": 1e-6}},
    {"kind": "disaggregated", "prefill": {"instances": 2, "kv_blocks": 40, "device": "h100-sxm", "pp": 2},
     "decode": {"instances": 1, "kv_blocks": 50, "max_running": 6, "device": "h100-sxm", "pp": 2, "micro_batches": 3},
     "kv_link": {"bandwidth_GBps": 1}},
]


@settings(deadline=None, suppress_health_check=[HealthCheck.too_slow])   # examples: the profile (conftest)
@given(topo=st.integers(0, len(PP_TOPOS) - 1), seed=st.integers(0, 10**6), n=st.integers(1, 6) | st.integers(15, 30),
       rate=st.floats(0.5, 100), out=st.integers(1, 200))
def test_fast_path_equals_step_by_step_and_nothing_is_lost_under_pp(topo, seed, n, rate, out):
    check_fast_equals_slow_and_nothing_lost(PP_TOPOS[topo], seed, n, rate, out)


def check_fast_equals_slow_and_nothing_lost(topo: dict, seed: int, n: int, rate: float, out: int) -> None:
    """One random run of ``topo``: fast path == step by step, every request accounted for, every block back."""
    sc = _sc(topo, rate=rate, num_requests=n, prompt_tokens={"dist": "uniform", "low": 1, "high": 300},
             output_tokens={"dist": "uniform", "low": 1, "high": out})
    sc = sc.model_copy(update={"seed": seed})
    fast, slow = _both(sc)               # simulate checks conservation (raises on a lost request or block)
    _assert_same(fast, slow)
    df = metrics.requests_frame(fast)
    assert len(df) == n == (df.status == "finished").sum() + (df.status == "rejected").sum()
    for inst in fast[0].topology.instances:
        assert inst.kv.free_blocks == inst.kv.total_blocks
    for r in fast[0].requests:
        if r.status == "finished":
            assert r.generated == r.output_tokens and r.first_token_s <= r.finish_s


def test_vectorised_pipeline_decode_costs_equal_scalar_steps():
    for m, tp, pp, mb in (("llama-3.1-70b", 4, 2, None), ("qwen3-30b-a3b", 2, 4, 3)):
        check_decode_steps_equal_scalar_steps(PipelineCost(RooflineCost(get_model(m), H100, tp, pp=pp), pp, mb),
                                              seed=2, batches=(1, 5, 64), k=50)


def check_decode_steps_equal_scalar_steps(cost, seed: int, batches, k: int) -> None:
    """``decode_steps`` over k steps of random contexts equals k scalar ``step`` calls (time, FLOPs, bytes)."""
    rng = np.random.default_rng(seed)
    for batch in batches:
        c0 = rng.integers(10, 3000, batch)
        attn0, kv0 = float(c0.sum()), int((c0 + 1).sum())
        got = cost.decode_steps(batch, attn0, kv0, k)
        for i in range(k):
            ref = cost.step(batch, attn0 + batch * i, kv0 + batch * i, batch, batch)
            assert got[0][i] == pytest.approx(ref.time_s, rel=1e-12)
            assert got[1][i] == pytest.approx(ref.flops, rel=1e-12) and got[2][i] == pytest.approx(ref.bytes, rel=1e-12)


def test_gpus_and_summary_count_tp_times_pp():
    sc = _sc({"kind": "disaggregated", "prefill": {"device": "h100-sxm", "tp": 2, "pp": 2, "instances": 2},
              "decode": {"device": "h100-sxm", "tp": 2}}, num_requests=3, output_tokens=4)
    res = simulate(sc)
    topo = res[0].topology
    assert topo.prefill.gpus == 8 and topo.decode.gpus == 2
    t = metrics.summarize(res, metrics.requests_frame(res), sc)["t"]
    assert t["gpus"] == 10 and t["pools"]["prefill"]["pp"] == 2 and t["pools"]["prefill"]["micro_batches"] == 2
    assert t["pools"]["decode"]["pp"] == 1 and t["pools"]["decode"]["micro_batches"] is None


# --- bad input: one line naming key and value --------------------------------------------------
def test_bad_pp_is_one_line(tmp_path, capsys):
    """pp need not divide the layers any more (uneven splits: tests/test_pp_uneven.py), but each stage needs
    at least one layer: pp above the layer count, or below 1, is one line naming the key."""
    err = _err(_run_yaml(tmp_path, "llama-3.2-1b", "pp: 17"), capsys)              # 16 layers
    assert "topologies.a.pp = 17" in err and "16 layers" in err
    err = _err(_run_yaml(tmp_path, "llama-3.1-70b", "tp: 4, pp: 0"), capsys)
    assert "topologies.a.pp" in err and "0" in err
    err = _err(_run_yaml(tmp_path, "llama-3.1-70b", "tp: 4, micro_batches: 2"), capsys)
    assert "micro_batches" in err and "pp" in err
    err = _err(["estimate", "--model", "llama-3.1-8b", "--device", "h100-sxm", "--pp", "33", "--decode-batch", "4"],
               capsys)                                                             # 32 layers
    assert "--pp = 33" in err and "32 layers" in err
    err = _err(["estimate", "--model", "llama-3.1-8b", "--device", "h100-sxm", "--micro-batches", "2",
                "--decode-batch", "4"], capsys)
    assert "--micro-batches = 2" in err


def test_estimate_prints_the_pipeline(capsys):
    rc = main(["estimate", "--model", "llama-3.1-70b", "--device", "h100-sxm", "--tp", "4", "--pp", "2",
               "--decode-batch", "64", "--context", "2048", "--json"])
    import json
    out = json.loads(capsys.readouterr().out)
    assert rc == 0 and out["pp"] == 2
    p = out["pipeline"]
    assert p["micro_batches"] == 2 and p["micro_batch_requests"] == 32 and len(p["stage_s"]) == 2
    assert out["time_s"] == pytest.approx(max(p["round_trip_s"], *p["stage_load_s"]), rel=1e-12)
    assert out["kv_capacity"]["blocks"] > 0


def test_plan_searches_pipeline_depths():
    from test_plan import small_plan
    from pdsim.plan import parse_plan
    raw = small_plan(search={"devices": [{"name": "h100-sxm", "price_per_hour_usd": 2.0}],
                             "colocated": {"tp": [1], "pp": [1, 2], "replicas": [1]},
                             "disaggregated": {"prefill_pp": [2], "decode_pp": [1, 4]},
                             "pool": {"kv_blocks": 2000}})
    plan = parse_plan(raw, "p.yaml")
    got = {c.name: c for c in plan.configs}
    assert set(got) == {"colo-h100-sxm-tp1x1", "colo-h100-sxm-tp1pp2x1", "pd-h100-sxm-1p1pp2-1d1-infiniband",
                        "pd-h100-sxm-1p1pp2-1d1pp4-infiniband"}
    assert got["colo-h100-sxm-tp1x1"].gpus == 1 and "pp" not in got["colo-h100-sxm-tp1x1"].topology
    assert got["colo-h100-sxm-tp1pp2x1"].gpus == 2 and got["colo-h100-sxm-tp1pp2x1"].topology["pp"] == 2
    assert got["pd-h100-sxm-1p1pp2-1d1pp4-infiniband"].gpus == 6
    assert all(0 < c.bound_rate < math.inf for c in plan.configs)


def test_the_plans_prefill_bound_under_pp_takes_the_cheapest_micro_batch_count():
    # A constant 0.01 s stage pass, pp 2, micro_batches 4, token budget 2048, prompts of at most 1000 tokens.
    # A step of 2048 tokens in 4 micro-batches takes 4 x 0.01 s (each stage runs four passes, more than the
    # 2-pass trip); in 2 micro-batches max(2 x 0.01, trip 2 x 0.01) = 0.02 s; in 1, the trip 0.02 s; 1000
    # tokens at best 0.02 s too.  The least per prompt token is 0.02 / 2048 s.  Priced only at 4 micro-batches
    # the bound was 0.04 / 2048: twice what the pool then does (a step holds as many micro-batches as it has
    # prompts, here two), so the plan capped the search below a goodput the config reaches.
    from pdsim.plan import prefill_bound_s_per_token
    pool = {"cost_model": {"kind": "constant", "step_s": 0.01}, "pp": 2, "micro_batches": 4, "kv_blocks": 5000,
            "max_batched_tokens": 2048}
    spec = config.PoolSpec(**pool)
    cm = make_cost(spec, get_model("llama-3.1-8b"), "bf16", "bf16", None, "p")
    assert [cm.step(2048, 0.0, 0, 0, b).time_s for b in (1, 2, 4)] == pytest.approx([0.02, 0.02, 0.04], rel=1e-12)
    bound = prefill_bound_s_per_token(cm, spec, 1000)
    assert bound == pytest.approx(0.02 / 2048, rel=1e-12)
    # and it bounds the simulation: 40 prompts of 1000 tokens (one output token each) arriving at 2000 req/s
    # keep the pool busy at no less than the bound per prompt token
    res = simulate(_sc({"kind": "colocated", **pool}, rate=2000, num_requests=40, prompt_tokens=1000,
                       output_tokens=1))
    inst = res[0].topology.instances[0]
    assert bound <= inst.busy_s / 40_000
