"""The per-operator cost model: one description of the operators, checked against hand computations.

Oracles: byte counts worked out by hand from the model's config numbers, datasheet peaks, the
tables' own points, and the scalar step itself for the vectorised k-step path.
"""
from __future__ import annotations

import json

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from conftest import REPO
from pdsim import kernels
from pdsim.__main__ import main
from pdsim.costmodel import CostModel, RooflineCost
from pdsim.devices import DeviceProfile, ProfileSpec, get_device, load_profile_file
from pdsim.models import ModelShape, get_model

LLAMA8 = get_model("llama-3.1-8b")
H100 = get_device("h100-sxm")
CPU_MEASURED = REPO / "calibration" / "profiles" / "cpu-epyc-2c-measured.yaml"


def _with_eff(dev: DeviceProfile, **eff) -> DeviceProfile:
    d = dev.spec.model_dump()
    d["efficiency"] = {**d["efficiency"], **eff}
    return DeviceProfile(ProfileSpec.model_validate(d))


# --- elementwise operators: bytes by hand ------------------------------------------------------
ELEMENTWISE = ("norm", "rope", "kv_write", "act", "embed")


def test_elementwise_cost_equals_a_hand_computation():
    # Llama-3.1-8B: h 4096, 32 query heads, 8 KV heads, head dim 128, MLP 14336, 32 layers, bf16
    # per token per layer: 2 fused add+RMSNorm 2*(4*4096*2) = 65536 B; RoPE on q,k 2*(32+8)*128*2 = 20480 B;
    # KV write 2*8*128*(2+2) = 8192 B; SiLU*mul 3*14336*2 = 86016 B  -> 180224 B; embed + final norm 5*4096*2
    T = 4096
    per_layer, embed = 180224, 40960
    dev = _with_eff(H100, elementwise_floor_us=0.0, memory=0.85)
    ops = RooflineCost(LLAMA8, dev).breakdown(T, T * T / 2.0, T, 1, 1)
    assert sum(ops[k]["bytes"] for k in ELEMENTWISE) == T * (32 * per_layer + embed)
    bw = 3350e9 * 0.85                                       # datasheet HBM3 x efficiency.memory
    assert sum(ops[k]["time_s"] for k in ELEMENTWISE) == pytest.approx(T * (32 * per_layer + embed) / bw, rel=1e-12)
    # their share of a prefill step of 4096 tokens: the issue measured ~8-10% on H100
    share = sum(ops[k]["time_s"] for k in ELEMENTWISE) / sum(v["time_s"] for v in ops.values())
    assert 0.04 < share < 0.15
    # one token: every kernel pays its floor (2 norms, rope, kv write, act per layer; embed + final norm)
    one = RooflineCost(LLAMA8, _with_eff(H100, elementwise_floor_us=2.0)).breakdown(1, 0.5, 1, 1, 1)
    assert sum(one[k]["time_s"] for k in ELEMENTWISE) == pytest.approx((32 * 5 + 2) * 2e-6, rel=1e-12)


# --- quantised weights ---------------------------------------------------------------------------
@pytest.mark.parametrize("dev", ["h100-sxm", "h200", "a100-80gb-sxm"])
def test_int4_decodes_faster_than_fp8_faster_than_bf16(dev):
    d = get_device(dev)
    t = {w: RooflineCost(LLAMA8, d, 1, w).decode_time(8, 512) for w in ("int4", "fp8", "bf16")}
    assert t["int4"] < t["fp8"] < t["bf16"]
    # memory-bound: each step re-reads the weights, so a step is no faster than its weight bytes
    for w, wb in (("int4", 0.5), ("fp8", 1.0), ("bf16", 2.0)):
        assert t[w] > LLAMA8.layers * LLAMA8.params_per_layer * wb / d.mem_bw_Bps
    # the dequantisation is not free: int4 saves less than the 4x of its bytes on the linear layers
    lin = {w: sum(v["time_s"] for k, v in RooflineCost(LLAMA8, d, 1, w).breakdown(8, 8 * 512.0, 8 * 513, 8, 8).items()
                  if k in ("qkv", "attn_out", "gate_up", "down")) for w in ("int4", "bf16")}
    assert lin["bf16"] / 4 < lin["int4"] < lin["bf16"]


def test_fp4_weights_use_fp4_tensor_cores_on_blackwell_and_are_weight_only_on_hopper():
    """NVFP4: 0.5 + 1/16 bytes per weight.  On B200 (fp4 peak 9 PFLOP/s) a big prefill GEMM is
    compute-bound at the fp4 peak; on H200 (no fp4 units) it computes in bf16 after dequantising."""
    m = get_model("llama-3.1-70b")
    assert m.weight_bytes_per_gpu("fp4", 4) == pytest.approx(
        ((m.decoder_params - m.routed_params - m.router_params - m.replicated_attn_params) * 0.5625
         + m.embedding_params * 2.0) / 4 + m.replicated_attn_params * 0.5625 + m.router_params * 2.0)
    T, n, k = 8192, 8192 * 2 * 28672 // 8192 // 4, 8192          # gate_up of tp4: N = 2 x 28672 / 4
    for dev_name, dtype in (("b200", "fp4"), ("h200", "bf16")):
        dev = get_device(dev_name)
        cm = RooflineCost(m, dev, 4, "fp4")
        e = dev.spec.efficiency
        op = cm.breakdown(T, T * T / 2.0, T, 1, 1)["gate_up"]
        m_half = e.gemm_m_half if dtype == "fp4" else min(e.gemm_m_half, kernels.WEIGHT_ONLY_M_HALF)
        compute = 2.0 * T * n * k * (T + m_half) / (T * dev.peak_flops(dtype) * e.gemm_max)
        assert op["time_s"] / m.layers == pytest.approx(compute + e.kernel_overhead_us * 1e-6, rel=1e-9)
        assert (cm.compute_dtype, cm.weight_only) == (("fp4", None) if dtype == "fp4" else ("bf16", "fp4"))
    # decode is memory-bound on the weights' bytes: fp4 reads less than fp8 on both
    for dev_name in ("b200", "h200"):
        d = get_device(dev_name)
        t = {w: RooflineCost(m, d, 4, w).decode_time(8, 512) for w in ("fp4", "fp8")}
        assert t["fp4"] < t["fp8"]


def test_fp4_is_a_weight_dtype_not_a_kv_dtype(tmp_path):
    from pdsim import config
    base = "model: llama-3.1-8b\nworkload: {rate: 1, num_requests: 2}\ntopologies:\n  t: {kind: colocated}\n"
    p = tmp_path / "w.yaml"
    p.write_text(base + "weight_dtype: fp4\n")
    assert config.load(p).weight_dtype == "fp4"
    p.write_text(base + "kv_dtype: fp4\n")
    with pytest.raises(config.ConfigError) as e:
        config.load(p)
    assert e.value.key == "kv_dtype"


# --- all-reduce --------------------------------------------------------------------------------------
def test_datasheet_allreduce_one_shot_small_ring_large():
    # 8 KiB over 4 H100s: a custom one-shot kernel, ~3 us (measured custom all-reduce), not 6 hops x 6 us
    t_small = kernels.allreduce_datasheet(H100, 8192, 4)
    assert 3e-6 <= t_small <= 5e-6
    # 256 MiB over 8: bandwidth-bound two-shot, 2 (t-1)/t of the message per link at 450 GB/s x 0.75
    dev = _with_eff(H100, allreduce=0.75, allreduce_base_us=3.0, allreduce_per_peer_us=0.5)
    big = 256 * 2 ** 20
    assert kernels.allreduce_datasheet(dev, big, 8) == pytest.approx(2 * (3e-6 + 7 * 0.5e-6)
                                                                     + 2 * 7 / 8 * big / (450e9 * 0.75))
    # small: one-shot, every GPU reads the 3 other buffers
    assert kernels.allreduce_datasheet(dev, 8192, 4) == pytest.approx(3e-6 + 3 * 0.5e-6 + 3 * 8192 / (450e9 * 0.75))
    assert kernels.allreduce_datasheet(dev, big, 1) == 0.0


# --- one source: step, breakdown and k decode steps ------------------------------------------------
def _devices():
    return {"h100-sxm": H100, "a100-80gb-sxm": get_device("a100-80gb-sxm"),
            "cpu-measured": load_profile_file(CPU_MEASURED)}


DEVS = _devices()


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(dev=st.sampled_from(sorted(DEVS)), tp=st.sampled_from([1, 2, 4]),
       wd=st.sampled_from(["bf16", "fp8", "int4"]), kvd=st.sampled_from(["bf16", "fp8"]),
       batch=st.integers(1, 300), ctx=st.integers(1, 40000), k=st.integers(1, 400))
def test_breakdown_sums_to_step_and_decode_steps_equal_step(dev, tp, wd, kvd, batch, ctx, k):
    cm = RooflineCost(LLAMA8, DEVS[dev], tp, wd, kvd)
    attn0, kv0 = batch * (ctx + 0.5), batch * (ctx + 1)
    st_ = cm.step(batch, attn0, kv0, batch, batch)
    ops = cm.breakdown(batch, attn0, kv0, batch, batch)
    assert sum(v["time_s"] for v in ops.values()) == pytest.approx(st_.time_s, rel=1e-12)
    assert sum(v["flops"] for v in ops.values()) == pytest.approx(st_.flops, rel=1e-12)
    assert sum(v["bytes"] for v in ops.values()) == pytest.approx(st_.bytes, rel=1e-12)
    got = cm.decode_steps(batch, attn0, kv0, k)
    ref = CostModel.decode_steps(cm, batch, attn0, kv0, k)      # step() called k times
    for g, r in zip(got, ref):
        assert np.allclose(g, r, rtol=1e-12, atol=0)
    # prefill: the breakdown still sums to the step
    p = ctx % 8192 + 1
    ops = cm.breakdown(p, p * p / 2.0, p, 1, 1)
    assert sum(v["time_s"] for v in ops.values()) == pytest.approx(cm.step(p, p * p / 2.0, p, 1, 1).time_s, rel=1e-12)


# --- measured tables inside the k-step path ----------------------------------------------------------
TINY = ModelShape("tiny", 2, 512, 4, 1, 128, 1024, 1000)
DEC = {"q_heads": 4, "kv_heads": 1, "head_dim": 128, "batch": [1, 4, 16], "context": [128, 512, 2048],
       "time_s": [[1e-5, 2e-5, 6e-5], [2e-5, 7e-5, 2.5e-4], [7e-5, 2.6e-4, 1e-3]]}


def _tiny_measured(**extra) -> DeviceProfile:
    base = get_device("h100-sxm").spec.model_dump()
    return DeviceProfile(ProfileSpec.model_validate({**base, "name": "t", "source": "test tables",
                                                     "measured": {"attention_decode": [DEC], **extra}}))


def test_table_interpolation_in_decode_steps_is_exact_at_table_points():
    dev = _tiny_measured()
    cm = RooflineCost(TINY, dev)
    for bi, b in enumerate(DEC["batch"]):
        # contexts 127.5 ... : step i reads kv0 + b*i tokens, i.e. a context of kv0/b + i
        for cj, c in enumerate(DEC["context"]):
            kv0 = b * (c - 3)
            att = cm._attention_op(b, b * (c - 3.5) + b * np.arange(7.0), kv0 + b * np.arange(7.0), b, False)
            t, code = cm.op_time(att)
            assert t[3] == DEC["time_s"][bi][cj]                # step 3 reads exactly c per sequence
            assert kernels.SOURCE_NAMES[code[3]] == "exact"
            if 0 < cj < 2:
                assert all(kernels.SOURCE_NAMES[x] == "interpolated" for x in np.delete(code, 3))
            times = cm.decode_steps(b, b * (c - 3.5), kv0, 7)[0]
            assert times[3] == cm.step(b, b * (c - 3.5) + 3 * b, kv0 + 3 * b, b, b).time_s
    # between grid points: log-log in context (a geometric mean at the geometric midpoint)
    t, code = cm.op_time(cm._attention_op(4, np.array([4 * 256.0]), np.array([4 * 256.0]), 4, False))
    assert t[0] == pytest.approx(np.sqrt(2e-5 * 7e-5), rel=1e-12)
    # beyond the grid: extrapolated, continuous with the last point
    t, code = cm.op_time(cm._attention_op(4, np.array([4 * 2048.0, 4 * 4096.0]), np.array([4 * 2048.0, 4 * 4096.0]),
                                          4, False))
    assert t[0] == 2.5e-4 and 2.5e-4 < t[1] < 4 * 2.5e-4 and kernels.SOURCE_NAMES[code[1]] == "extrapolated"


def test_measured_profile_keeps_the_fast_path_vectorised(monkeypatch):
    """decode_steps with tables is one vectorised evaluation, not k calls to step()."""
    cm = RooflineCost(TINY, _tiny_measured())
    calls = []
    monkeypatch.setattr(RooflineCost, "step", lambda self, *a: calls.append(a))
    t, f, b = cm.decode_steps(4, 4 * 200.5, 4 * 201, 50)
    assert len(t) == 50 and not calls


# --- pdsim estimate --json says where each op came from ---------------------------------------------
def test_estimate_json_flags_sources(capsys):
    prof = load_profile_file(CPU_MEASURED)
    g = next(t for t in prof.spec.measured.gemm if t.op == "qkv")
    m_in = g.m[1]
    assert main(["estimate", "--model", "llama-3.1-8b", "--device", str(CPU_MEASURED), "--decode-batch", str(m_in),
                 "--context", "1000", "--json"]) == 0
    ops = json.loads(capsys.readouterr().out)["ops"]
    assert ops["qkv"]["source"] == "exact"                  # M = a measured point of the qkv table
    assert ops["norm"]["source"] == "roofline"              # no table for elementwise kernels
    m_mid = (g.m[-2] + g.m[-1]) // 2
    assert m_mid not in g.m
    assert main(["estimate", "--model", "llama-3.1-8b", "--device", str(CPU_MEASURED), "--decode-batch",
                 str(m_mid), "--context", "1000", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["ops"]["qkv"]["source"] == "interpolated" and "qkv" in out["sources"]["interpolated"]
    big = g.m[-1] * 4                                       # beyond the measured M range
    assert main(["estimate", "--model", "llama-3.1-8b", "--device", str(CPU_MEASURED), "--prefill", str(big),
                 "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["ops"]["qkv"]["source"] == "extrapolated"
    assert main(["estimate", "--model", "llama-3.1-8b", "--device", "h100-sxm", "--decode-batch", "8", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert set(out["sources"]["roofline"]) == set(out["ops"])


def test_allreduce_table_is_used_when_present():
    # TINY: hidden 512, 2 layers; a decode step of 8 tokens all-reduces 8 * 512 * 2 = 8192 bytes, 2L + 1 = 5 times
    def prof(t_8k):
        return _tiny_measured(transfers=[{"kind": "allreduce", "tp": 2, "bytes": [4096, 8192, 16384],
                                          "time_s": [5e-6, t_8k, 9e-6]}])
    a, b = RooflineCost(TINY, prof(6e-6), 2), RooflineCost(TINY, prof(7.5e-6), 2)
    agg = (8, 8 * 300.5, 8 * 301, 8, 8)
    ops = a.breakdown(*agg)
    assert ops["allreduce"]["time_s"] == pytest.approx(5 * 6e-6, rel=1e-12) and ops["allreduce"]["source"] == "exact"
    assert b.step(*agg).time_s - a.step(*agg).time_s == pytest.approx(5 * 1.5e-6, rel=1e-9)
    # a profile without an all-reduce table for this TP uses the datasheet model, and says so
    c = RooflineCost(TINY, _tiny_measured(), 2).breakdown(*agg)["allreduce"]
    assert c["source"] == "roofline" and c["time_s"] == pytest.approx(5 * kernels.allreduce_datasheet(H100, 8192, 2))


def test_fast_path_equals_step_by_step_on_a_measured_profile():
    """The multi-step fast path with imported tables (vectorised lookups) gives the reference loop's results."""
    from pdsim.simulation import simulate
    from conftest import scenario
    from test_fastpath import _assert_same
    path = REPO / "calibration" / "profiles" / "h100_sxm-trtllm-aic.yaml"
    topo = {"kind": "colocated", "replicas": 1, "tp": 2, "device": str(path), "kv_blocks": 400}
    sc = scenario({"t": topo}, rate=20.0, num_requests=25, prompt_tokens={"dist": "uniform", "low": 10, "high": 600},
                  output_tokens={"dist": "uniform", "low": 20, "high": 300})
    fast, slow = simulate(sc), simulate(sc, fast=False)
    _assert_same(fast, slow)
    assert fast[0].topology.instances[0].windows > 0
