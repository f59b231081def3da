"""Sliding-window attention (gpt-oss's interleaved 128-token layers): KV by hand, step times by hand,
the closed forms against brute force, fast path == step by step, nothing lost, one-line errors."""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from pdsim import config
from pdsim.costmodel import RooflineCost, sliding_aggregates, sliding_positions, window_sums
from pdsim.devices import get_device
from pdsim.errors import ConfigError
from pdsim.kvcache import SlidingKVCache
from pdsim.models import ModelShape, get_model
from pdsim.scheduler import SlidingStepPlan
from pdsim.simulation import resolve_model, simulate
from pdsim.workload import Request

from test_fastpath import _assert_same, _both

# 2 layers, one of them sliding with a 4-token window (tiny: hand-checkable)
TINY = {"name": "tiny-swa", "layers": 2, "hidden": 256, "heads": 4, "kv_heads": 2, "mlp_width": 512, "vocab": 1000,
        "sliding_window": 4, "sliding_layers": 1}
# a small roofline-priced shape: 4 layers, 2 sliding, a 24-token window (contexts cross it often)
SMALL = {"name": "small-swa", "layers": 4, "hidden": 1024, "heads": 8, "kv_heads": 4, "mlp_width": 2048,
         "vocab": 32000, "max_context": 8192, "sliding_window": 24, "sliding_layers": 2}


def _sc(model, topologies, **workload):
    w = {"arrival": "poisson", "rate": 1.0, "num_requests": 20, "prompt_tokens": 100, "output_tokens": 10}
    w.update(workload)
    return config.parse({"seed": 0, "model": model, "workload": w, "topologies": topologies}, "test.yaml")


# --- KV memory by hand -------------------------------------------------------------------------------
def test_gpt_oss_kv_bytes_and_blocks_by_hand():
    # HF config of openai/gpt-oss-120b: 36 layers, layer_types alternating sliding_attention / full_attention
    # (18 each), sliding_window 128, num_key_value_heads 8, head_dim 64
    m = get_model("gpt-oss-120b")
    assert (m.layers, m.sliding_layers, m.full_layers, m.sliding_window) == (36, 18, 18, 128)
    per_layer = 2 * 8 * 64 * 2                    # K and V, 8 heads x 64 dims, bf16 = 2048 B per token per layer
    assert m.kv_bytes_per_token("bf16") == 18 * per_layer == 36864
    assert m.sliding_kv_bytes_per_token("bf16") == 18 * per_layer
    assert m.kv_bytes_per_token("fp8") == 18 * 2 * 8 * 64 * 1
    # the window: ceil(128 / 16) + 1 = 9 blocks of the 18 sliding layers = 9 blocks of the 18 full layers
    assert m.sliding_extra_blocks(16) == 9
    assert m.sliding_extra_blocks(32) == 5          # ceil(128 / 32) + 1
    assert m.sliding_extra_blocks(256) == 2         # ceil(128 / 256) + 1
    # tp 2: 4 KV heads a GPU; a 16-token block = 16 x 18 layers x 2 x 4 x 64 x 2 B
    assert m.kv_bytes_per_token_per_gpu("bf16", 2) == 18 * 2 * 4 * 64 * 2
    # pp 2 (18 layers a stage, 9 of them sliding): half the full layers' bytes per stage
    assert m.stage_kv_bytes_per_token("bf16", 1, 2) == [18 * per_layer / 2] * 2
    # a request of 1000 tokens holds ceil(1000 / 16) = 63 full-layer blocks + 9
    kv = SlidingKVCache(1000, 16, 0.0, m.sliding_extra_blocks(16))
    assert kv.blocks_for(1000) == 63 + 9 and kv.blocks_for(0) == 0
    # uneven ratios, rounded up in full-layer units: 2 sliding of 3 layers, W 4, bs 16: (1 + 1) x 2 / 1 = 4;
    # 1 sliding of 4 layers, W 40: (3 + 1) x 1 / 3 = 1.33 -> 2
    s = dict(name="x", hidden=64, heads=2, kv_heads=1, head_dim=32, mlp_width=64, vocab=10)
    assert ModelShape(layers=3, sliding_window=4, sliding_layers=2, **s).sliding_extra_blocks(16) == 4
    assert ModelShape(layers=4, sliding_window=40, sliding_layers=1, **s).sliding_extra_blocks(16) == 2


def test_sliding_pool_takes_window_blocks_with_the_first_and_returns_them():
    kv = SlidingKVCache(100, 16, 0.0, 9)
    r = Request(0, 0.0, 40, 5)
    assert kv.grow(r, 40, admit=True)
    assert (r.blocks, kv.used_blocks, kv.held(r)) == (3, 12, 12)     # ceil(40 / 16) = 3, + 9
    assert kv.grow(r, 48) and kv.used_blocks == 12                     # still 3 blocks
    assert kv.grow(r, 49) and (r.blocks, kv.used_blocks) == (4, 13)    # one more, no second window
    assert not kv.grow(Request(1, 0.0, 16 * 80, 1), 16 * 80)          # 80 + 9 > 87 free: nothing taken
    assert kv.used_blocks == 13
    kv.release(r)
    assert (kv.used_blocks, r.blocks) == (0, 0)
    kv.release(r)                                                      # holding nothing: frees nothing
    assert kv.free_blocks == 100
    assert kv.fits_ever(16 * 91) and not kv.fits_ever(16 * 91 + 1)     # 91 + 9 = 100 blocks


def test_lone_request_holds_its_window_and_is_rejected_by_it():
    # gpt-oss, 100-token prompt, 10 output tokens: the KV ends at 109 tokens = 7 blocks, + 9 for the window
    topo = {"kind": "colocated", "replicas": 1, "cost_model": {"kind": "constant", "step_s": 0.01}, "kv_blocks": 16}
    res = simulate(_sc("gpt-oss-120b", {"c": topo}, num_requests=1))
    inst = res[0].topology.instances[0]
    assert inst.kv.peak_used == 16 and inst.kv.used_blocks == 0
    assert res[0].requests[0].status == "finished"
    # one block fewer: 16 needed, 15 there -> rejected at the door, saying so
    res = simulate(_sc("gpt-oss-120b", {"c": {**topo, "kv_blocks": 15}}, num_requests=1))
    r = res[0].requests[0]
    assert r.status == "rejected" and "needs 16 KV blocks" in r.reject_reason


def test_pd_transfer_sends_the_window_of_the_sliding_layers():
    # 1000-token prompt of gpt-oss over a 1 GB/s link: full layers 1000 x 36864 B, sliding layers 128 x 36864 B
    topo = {"kind": "disaggregated",
            "prefill": {"kv_blocks": 500, "cost_model": {"kind": "constant", "step_s": 0.01}},
            "decode": {"kv_blocks": 500, "cost_model": {"kind": "constant", "step_s": 0.01}},
            "kv_link": {"bandwidth_GBps": 1, "latency_us": 0}}
    res = simulate(_sc("gpt-oss-120b", {"pd": topo}, num_requests=1, prompt_tokens=1000, output_tokens=3))
    link = res[0].topology.links[0]
    assert link.bytes == 1000 * 36864 + 128 * 36864
    r = res[0].requests[0]
    assert r.kv_transfer_s == pytest.approx((1000 + 128) * 36864 / 1e9, rel=1e-12)


# --- cost: closed forms against brute force ---------------------------------------------------------
@given(c=st.integers(0, 300), n=st.integers(0, 300), W=st.integers(1, 200))
def test_prefill_closed_form_equals_brute_force(c, n, W):
    assert sliding_positions(c, n, W) == sum(min(p, W) for p in range(c + 1, c + n + 1))
    work, kv = sliding_aggregates(c, n, W)
    if n:
        assert work == sum(min(p, W) - 0.5 for p in range(c + 1, c + n + 1))
        # KV read: the distinct cached tokens the chunk's queries see (each sees its last min(p, W) positions)
        assert kv == len({q for p in range(c + 1, c + n + 1) for q in range(max(1, p - W + 1), p + 1)})
    if c + n <= W:    # the window covers everything: a full layer's n (c + n / 2) and c + n
        assert work == n * (c + 0.5 * n) and kv == c + n


@given(c0=st.lists(st.integers(0, 400), min_size=1, max_size=40), k=st.integers(1, 300), W=st.integers(1, 300))
def test_vectorised_window_sum_equals_brute_force(c0, k, W):
    got = window_sums(np.array(c0), k, W)
    ref = [sum(min(c + 1 + j, W) for c in c0) for j in range(k)]
    assert got.dtype == np.int64 and got.tolist() == ref


@given(items=st.lists(st.tuples(st.integers(0, 300), st.integers(1, 300)), min_size=1, max_size=20),
       W=st.integers(1, 200))
def test_sliding_step_plan_sums_equal_brute_force(items, W):
    plan = SlidingStepPlan(window=W)
    for c, n in items:
        r = Request(0, 0.0, c + n + 5, 3)
        r.computed = c
        plan.add(r, n)
    pos = sum(min(p, W) for c, n in items for p in range(c + 1, c + n + 1))
    assert plan.swa == (pos - 0.5 * sum(n for _, n in items), sum(sliding_aggregates(c, n, W)[1] for c, n in items))
    assert isinstance(plan.swa_pos, int) and isinstance(plan.swa_kv, int)


# --- cost: a lone request's step times by hand ------------------------------------------------------
U = 2.0 ** -10      # seconds per KV token read on every layer: binary-exact sums


@pytest.mark.parametrize("fast", [True, False])
def test_lone_request_step_times_by_hand_linear(fast):
    """TINY (2 layers, 1 sliding, W = 4) under a linear model of per_kv_token_s = U: a step costs
    U x (kv_full + kv_sliding) / 2, the mean over the two layers of the KV tokens each reads.

    Prompt 3, 6 output tokens, fcfs.  Prefill (3 tokens from 0): full reads 3, sliding min(3, 3 + 4 - 1) = 3
    -> 3U.  Decodes at context c = 3..7: full reads c + 1, sliding min(c + 1, 4):
    c=3: (4 + 4)/2 = 4U; c=4: (5 + 4)/2 = 4.5U; c=5: 5U; c=6: 5.5U; c=7: 6U.
    Token times 3, 7, 11.5, 16.5, 22, 28 U (full attention on both layers: 3, 7, 12, 18, 25, 33 U)."""
    topo = {"kind": "colocated", "replicas": 1, "kv_blocks": 100,
            "cost_model": {"kind": "linear", "per_kv_token_s": U}}
    sc = _sc(TINY, {"c": topo}, num_requests=1, prompt_tokens=3, output_tokens=6)
    res = simulate(sc, fast=fast)
    r = res[0].requests[0]
    assert r.token_s == [x * U + r.arrival_s for x in (3, 7, 11.5, 16.5, 22, 28)]
    dense = simulate(_sc({**TINY, "sliding_layers": 0, "sliding_window": None}, {"c": topo}, num_requests=1,
                         prompt_tokens=3, output_tokens=6), fast=fast)[0].requests[0]
    assert dense.token_s == [x * U + dense.arrival_s for x in (3, 7, 12, 18, 25, 33)]


def test_roofline_attention_ops_by_hand():
    """A decode at context 10 on SMALL (W = 24 > 11: the window covers it) and at context 100 (it does not):
    the sliding op has the sliding layers' count and is priced on min(c + 1, W)."""
    m = resolve_model(_sc(SMALL, {"c": {"kind": "colocated", "device": "h100-sxm"}}))
    cm = RooflineCost(m, get_device("h100-sxm"))
    H, kvh, d = 8, 4, 128
    for c in (10, 100):
        w, kv = sliding_aggregates(c, 1, 24)
        assert (w, kv) == ((c + 0.5, c + 1) if c + 1 <= 24 else (23.5, 24))
        ops = cm.breakdown(1, c + 0.5, c + 1, 1, 1, swa=(w, kv))
        full, sl = ops["attention"], ops["attention_sliding"]
        assert full["flops"] == 2 * 4.0 * H * d * (c + 0.5)              # 2 full layers
        assert sl["flops"] == 2 * 4.0 * H * d * w                        # 2 sliding layers
        assert sl["bytes"] == 2 * (kv * 2 * kvh * d * 2.0 + 1 * (H + 2 * kvh) * d * 2.0)
        if c + 1 <= 24:
            assert sl == full


def test_pipeline_stages_share_full_and_sliding_attention_evenly():
    """pp 2 on SMALL (2 + 2 layers: each stage 1 full + 1 sliding, the even interleaving assumed): the stages'
    attention times add up to the whole model's full + sliding attention, half on each stage."""
    m = resolve_model(_sc(SMALL, {"c": {"kind": "colocated", "device": "h100-sxm"}}))
    dev = get_device("h100-sxm")
    one, two = RooflineCost(m, dev), RooflineCost(m, dev, pp=2)
    for c in (10, 500):
        swa = sliding_aggregates(c, 1, 24)
        ops = one.breakdown(4, 4 * (c + 0.5), 4 * (c + 1), 4, 4, swa=(4 * swa[0], 4 * swa[1]))
        attn = ops["attention"]["time_s"] + ops["attention_sliding"]["time_s"]
        stages, _, _ = two.stage_times(4, 4 * (c + 0.5), 4 * (c + 1), 4, 4, swa=(4 * swa[0], 4 * swa[1]))
        static = two._stage_static(4, 4)[0]
        assert [s - t for s, t in zip(stages, static)] == pytest.approx([attn / 2] * 2, rel=1e-12)
        if c > 24:     # the sliding half is cheaper than a full layer's
            assert ops["attention_sliding"]["time_s"] < ops["attention"]["time_s"]


def test_window_covering_every_context_prices_as_full_attention():
    """Theory: a window at least as long as every request is full attention.  Step times, and so every
    request's timings, equal those of the same shape without sliding layers (KV pools large enough)."""
    topo = {"kind": "colocated", "replicas": 1, "device": "h100-sxm", "kv_blocks": 5000,
            "chunked_prefill": {"token_budget": 64}}
    w = dict(num_requests=12, rate=20.0, prompt_tokens={"dist": "uniform", "low": 1, "high": 200},
             output_tokens={"dist": "uniform", "low": 1, "high": 50})
    swa = simulate(_sc({**SMALL, "sliding_window": 250}, {"c": topo}, **w))
    dense = simulate(_sc({**SMALL, "sliding_window": None, "sliding_layers": 0}, {"c": topo}, **w))
    a, b = swa[0].requests, dense[0].requests
    assert [r.token_s for r in a] == [r.token_s for r in b]
    assert swa[0].topology.instances[0].busy_s == dense[0].topology.instances[0].busy_s
    # and a short window makes the same run faster (less attention), never slower
    short = simulate(_sc(SMALL, {"c": topo}, **w))
    assert short[0].topology.instances[0].busy_s < dense[0].topology.instances[0].busy_s


# --- fast path == step by step, nothing lost --------------------------------------------------------
ROOF = {"device": "h100-sxm"}
SWA_TOPOS = st.sampled_from([
    {"kind": "colocated", "replicas": 2, **ROOF, "router": "least_outstanding"},
    {"kind": "colocated", "replicas": 1, **ROOF, "kv_blocks": 60, "max_running": 4},
    {"kind": "colocated", "replicas": 1, **ROOF, "kv_blocks": 50, "chunked_prefill": {"token_budget": 64}},
    {"kind": "colocated", "replicas": 1, "kv_blocks": 80,
     "cost_model": {"kind": "linear", "base_s": 0.004, "per_token_s": 2e-5, "per_kv_token_s": 1e-6}},
    {"kind": "colocated", "replicas": 1, **ROOF, "tp": 2, "pp": 2, "kv_blocks": 80},
    {"kind": "colocated", "replicas": 1, **ROOF, "kv_blocks": 70, "kv_reservation": "full"},
    {"kind": "disaggregated", "prefill": {"instances": 2, "kv_blocks": 40, **ROOF},
     "decode": {"instances": 1, "kv_blocks": 50, "max_running": 6, **ROOF}, "kv_link": {"bandwidth_GBps": 1}},
    {"kind": "disaggregated", "prefill": {"kv_blocks": 40, "chunked_prefill": {"token_budget": 32}, **ROOF},
     "decode": {"instances": 2, "kv_blocks": 45, **ROOF}, "assignment": "least_loaded",
     "kv_link": {"shared": True, "bandwidth_GBps": 0.5, "layerwise_overlap": True}},
])


@settings(deadline=None, suppress_health_check=[HealthCheck.too_slow], max_examples=25)
@given(topo=SWA_TOPOS, seed=st.integers(0, 10**6), n=st.integers(1, 6) | st.integers(20, 30),
       rate=st.floats(0.5, 100), out=st.integers(1, 200), horizon=st.sampled_from([None, None, 3.0]))
def test_fast_path_equals_step_by_step_sliding(topo, seed, n, rate, out, horizon):
    sc = _sc(SMALL, {"t": topo}, rate=rate, num_requests=n, prompt_tokens={"dist": "uniform", "low": 1, "high": 200},
             output_tokens={"dist": "uniform", "low": 1, "high": out})
    sc = sc.model_copy(update={"seed": seed, "horizon_s": horizon})
    fast, slow = _both(sc)
    _assert_same(fast, slow)
    for res in (fast, slow):
        topo_ = res[0].topology
        for inst in topo_.instances:
            inst.sync()
            if horizon is None:        # nothing left held (simulate's check_conservation also ran)
                assert inst.kv.used_blocks == 0 and inst.kv.free_blocks == inst.kv.total_blocks
            elif topo["kind"] == "colocated":   # blocks conserved: what the pool lent = what requests hold
                assert inst.kv.used_blocks == sum(inst.kv.held(r) for r in inst.running)


def test_fast_path_windows_cross_the_window_edge():
    """Long decodes whose contexts cross W inside one fast-path window: same as step by step."""
    sc = _sc(SMALL, {"t": {"kind": "colocated", "replicas": 1, **ROOF}}, rate=5.0, num_requests=8,
             prompt_tokens={"dist": "uniform", "low": 1, "high": 30}, output_tokens=120)
    fast, slow = _both(sc)
    _assert_same(fast, slow)
    assert fast[0].topology.instances[0].windows > 0


# --- bad input ----------------------------------------------------------------------------------------
@pytest.mark.parametrize("extra,key", [
    ({"sliding_layers": 3}, "model.sliding_layers"),                       # more than the 2 layers
    ({"sliding_window": None}, "model.sliding_window"),                    # sliding layers without a window
    ({"sliding_layers": 0}, "model.sliding_layers"),                       # a window without sliding layers
    ({"sliding_window": 0}, "model.sliding_window"),                       # an empty window
    ({"sliding_layers": -1}, "model.sliding_layers"),
])
def test_bad_inline_sliding_fields_name_the_key(extra, key):
    topo = {"c": {"kind": "colocated", "cost_model": {"kind": "constant", "step_s": 0.01}, "kv_blocks": 100}}
    with pytest.raises(ConfigError) as e:
        simulate(_sc({**TINY, **extra}, topo))
    assert e.value.key == key and "\n" not in str(e.value)


@pytest.mark.parametrize("pool,key", [
    ({"prefix_cache": {"enabled": True}}, "topologies.c.prefix_cache.enabled"),
    ({"speculative": {"method": "draft", "draft_model": "llama-3.2-1b", "k": 2, "acceptance": 0.5}},
     "topologies.c.speculative"),
    ({"tp": 8, "ep": 8, "dp_attention": True}, "topologies.c.dp_attention"),
])
def test_unmodelled_combinations_are_refused(pool, key):
    topo = {"c": {"kind": "colocated", "device": "h200", "kv_blocks": 1000, **pool}}
    with pytest.raises(ConfigError) as e:
        simulate(_sc("gpt-oss-120b", topo, num_requests=1))
    assert e.value.key == key and "not modelled" in str(e.value) and "\n" not in str(e.value)


def test_every_layer_sliding_is_refused():
    topo = {"c": {"kind": "colocated", "cost_model": {"kind": "constant", "step_s": 0.01}, "kv_blocks": 100}}
    with pytest.raises(ConfigError) as e:
        simulate(_sc({**TINY, "sliding_layers": 2}, topo))
    assert e.value.key == "model.sliding_layers"


def test_model_shape_validates_its_sliding_fields():
    s = dict(name="x", layers=2, hidden=64, heads=2, kv_heads=1, head_dim=32, mlp_width=64, vocab=10)
    with pytest.raises(ConfigError):
        ModelShape(sliding_layers=3, sliding_window=4, **s)
    with pytest.raises(ConfigError):
        ModelShape(sliding_layers=1, **s)
    with pytest.raises(ConfigError):
        ModelShape(sliding_layers=1, sliding_window=0, **s)


# --- the vectorised decode costs and pdsim estimate ---------------------------------------------------
def test_vectorised_sliding_decode_costs_equal_scalar_steps():
    from pdsim.costmodel import CostModel
    cm = RooflineCost(get_model("gpt-oss-120b"), get_device("h200"), 2, "fp8", "fp8", 2)
    rng = np.random.default_rng(5)
    for batch in (1, 7, 120):
        c0 = rng.integers(1, 400, batch)           # contexts on both sides of the 128-token window
        attn0, kv0 = float(sum(c + 0.5 for c in c0)), int((c0 + 1).sum())
        pos = window_sums(c0, 200, 128)
        swa = (pos - 0.5 * batch, pos)
        got = cm.decode_steps(batch, attn0, kv0, 200, swa=swa)
        ref = CostModel.decode_steps(cm, batch, attn0, kv0, 200, swa=swa)      # step() called 200 times
        for g, r in zip(got, ref):
            assert np.array_equal(g, r)


def test_estimate_counts_the_window_blocks_per_request(capsys):
    import json
    from pdsim.__main__ import main
    args = ["estimate", "--model", "gpt-oss-120b", "--device", "h200", "--tp", "2", "--decode-batch", "8",
            "--context", "4096", "--json"]
    assert main(args) == 0
    res = json.loads(capsys.readouterr().out)
    kv = res["kv_capacity"]
    # a request of 4097 tokens: ceil(4097 / 16) = 257 full-layer blocks + 9 for the 128-token window
    assert kv["requests"] == kv["tokens"] // 16 // (257 + 9)
    assert set(res["ops"]) >= {"attention", "attention_sliding"}
    # a decode at context 4096: the sliding layers read 128 tokens a request, the full ones 4097
    assert res["ops"]["attention_sliding"]["flops"] == pytest.approx(res["ops"]["attention"]["flops"] * 127.5 / 4096)


def test_readme_sliding_window_examples_are_valid_models():
    import re
    from pathlib import Path

    import yaml
    text = (Path(__file__).resolve().parents[1] / "README.md").read_text()
    block = re.search(r"### Sliding-window attention\n\n```yaml\n(.*?)```", text, re.S).group(1)
    preset = yaml.safe_load(block.split("\n# or")[0])["model"]
    commented = block.split("\n# or")[1].splitlines()[1:]          # the inline example, commented out
    inline = yaml.safe_load("\n".join(line[2:] for line in commented))["model"]
    assert get_model(preset).sliding_layers == 18
    m = resolve_model(_sc(inline, {"c": {"kind": "colocated", "device": "h100-sxm"}}))
    assert (m.sliding_window, m.sliding_layers, m.full_layers) == (4096, 24, 8)


def test_silicon_rows_of_gpt_oss_with_dp_attention_are_skipped_with_a_reason(tmp_path):
    from pdsim.validate import read_measured
    from test_validate import _silicon
    oss = {"model_path": "openai/gpt-oss-120b", "system": "h200_sxm", "precision": "fp8", "moe_quant_mode": "fp8"}
    path = _silicon(tmp_path / "silicon.csv", [
        {**oss, "id": "dp4", "tp_size": 1, "moe_tp_size": 1, "moe_ep_size": 4, "attention_dp_size": 4},
        {**oss, "id": "tp4", "tp_size": 4, "moe_tp_size": 4, "moe_ep_size": 1}])
    rows = {r["id"]: why for r, why in read_measured(path)}
    assert rows == {"dp4": "dp_attention_sliding_window", "tp4": None}


def test_gpt_oss_fast_path_equals_step_by_step_colocated_and_pd():
    topos = {"c": {"kind": "colocated", "replicas": 2, "device": "h200", "tp": 2,
                   "kv_blocks": 400, "chunked_prefill": {"token_budget": 512}},
             "pd": {"kind": "disaggregated", "prefill": {"device": "h200", "tp": 2, "kv_blocks": 300},
                    "decode": {"device": "h200", "tp": 2, "kv_blocks": 350}, "kv_link": {"bandwidth_GBps": 5}}}
    sc = _sc("gpt-oss-120b", topos, rate=8.0, num_requests=30,
             prompt_tokens={"dist": "uniform", "low": 1, "high": 1500},
             output_tokens={"dist": "uniform", "low": 1, "high": 300})
    fast, slow = _both(sc)
    for f, s in zip(fast, slow):
        _assert_same([f], [s])
    assert all(r.status == "finished" for res in fast for r in res.requests)


def test_sliding_pool_unit_cases_by_hand():
    """20 blocks of 16 tokens, watermark 0.2 (4 blocks), 3 window blocks per request holding any KV."""
    kv = SlidingKVCache(20, 16, watermark=0.2, extra=3)
    assert kv.watermark_blocks == 4
    assert (kv.blocks_for(0), kv.blocks_for(1), kv.blocks_for(16), kv.blocks_for(17)) == (0, 4, 4, 5)
    r = Request(0, 0.0, 300, 10)
    assert kv.grow(r, 0) and kv.free_blocks == 20 and kv.held(r) == 0      # no token, no window blocks
    assert not kv.grow(r, 16 * 14, admit=True) and r.blocks == 0           # 14 + 3 = 17 > 20 - 4
    assert kv.grow(r, 16 * 13, admit=True) and (r.blocks, kv.free_blocks, kv.held(r)) == (13, 4, 16)
    assert kv.grow(r, 16 * 13 + 1) and (r.blocks, kv.free_blocks, kv.peak_used) == (14, 3, 17)
    kv.release(r)
    assert (kv.free_blocks, kv.held(r)) == (20, 0)
    plain = SlidingKVCache(10, 16)                  # no window blocks: a plain pool
    q = Request(1, 0.0, 40, 1)
    assert plain.grow(q, 40) and plain.free_blocks == 7
