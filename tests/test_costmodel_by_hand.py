"""pdsim/costmodel.py by hand: values worked out in the comments (DESIGN.md's formulas, tiny shapes, a
hand-written device), written against mutmut survivors (tests/MUTANTS.md section 2).  Never pdsim
compared with itself."""
from __future__ import annotations

import numpy as np
import pytest

from pdsim.costmodel import (ConstantCost, CostModel, LinearCost, RooflineCost, StepCost, expected_distinct_experts, expert_hit_probs,
                             sliding_aggregates, sliding_positions, window_sums)
from pdsim.devices import DeviceProfile, EfficiencySpec, InterconnectSpec, ProfileSpec
from pdsim.models import ModelShape


def test_expected_distinct_experts_uniform_by_hand():
    # E = 4 experts, top-2: one token misses an expert with probability 1 - 2/4 = 1/2
    # 1 token: 4 (1 - 1/2) = 2 (its two experts); 2 tokens: 4 (1 - 1/4) = 3; 0 tokens: 0
    assert expected_distinct_experts(1, 2, 4) == pytest.approx(2.0, abs=1e-12)
    assert expected_distinct_experts(2, 2, 4) == pytest.approx(3.0, abs=1e-12)
    assert expected_distinct_experts(0, 2, 4) == 0.0


# --- a tiny dense model on a hand-written device --------------------------------------------------
# L = 2 layers, h = 8, 2 query heads, 1 KV head, head dim 4, gated MLP f = 16, vocab 32.
# Per layer (DESIGN.md): qkv N = (2 + 2*1)*4 = 16, K = 8; attn_out N = 8, K = 2*4 = 8; gate_up N = 32, K = 8;
# down N = 8, K = 16: 128 + 64 + 256 + 128 = 576 parameters = h n_h d + 2 h n_kv d + n_h d h + 3 h f.
# LM head 32 x 8 = 256 parameters.
TINY = ModelShape("tiny", layers=2, hidden=8, heads=2, kv_heads=1, head_dim=4, mlp_width=16, vocab=32)


def _dev(**over) -> DeviceProfile:
    """1e6 FLOP/s (bf16; fp8 twice that, fp32 a quarter), 1e6 B/s of memory, every efficiency 1, no overheads or
    floors: a kernel takes max(FLOPs, bytes) microseconds (decode attention: max(2 FLOPs, bytes))."""
    eff = dict(gemm_max=1.0, gemm_m_half=0.0, memory=1.0, attention_prefill=1.0, attention_decode_memory=1.0,
               kernel_overhead_us=0.0, step_overhead_us=0.0, allreduce=1.0, allreduce_base_us=0.0,
               allreduce_per_peer_us=0.0, elementwise_floor_us=0.0)
    eff.update(over)
    return DeviceProfile(ProfileSpec(name="hand", source="hand-written for tests", memory_GiB=1.0,
                                     memory_bandwidth_GBps=1e-3,
                                     peak_tflops={"bf16": 1e-6, "fp8": 2e-6, "fp32": 0.25e-6},
                                     interconnect=InterconnectSpec(bandwidth_GBps=1e-3, latency_us=0.0),
                                     efficiency=EfficiencySpec(**eff)))


def test_dense_decode_step_flops_bytes_and_time_by_hand():
    # a decode of 2 requests at context 3: T = 2 tokens, attn_work = 2*3 = 6, KV read = 2*4 = 8, 2 sampled
    # FLOPs: linears 2 T 576 L = 4608; attention 4 n_h d attn_work L = 4*2*4*6*2 = 384; LM head 2*2*32*8 = 1024
    # bytes per layer: weights 576*2 = 1152, GEMM activations T*2*((16+8)+(8+8)+(32+8)+(8+16)) = 416;
    #   attention KV 8 * 2*1*4*2 = 128 + new q,k,v 2*(2+2)*4*2 = 64; elementwise per token: norms 2*4*8*2 = 128,
    #   rope 2*(2+1)*4*2 = 48, kv write 2*1*4*(2+2) = 32, act 3*16*2 = 96 -> 304*2 = 608
    #   -> (1152 + 416 + 192 + 608) * 2 = 4736; embed 2*5*8*2 = 160; LM head 256*2 + 2*(32+8)*2 = 672
    c = RooflineCost(TINY, _dev()).step(2, 6.0, 8, 2, 2)
    assert c.flops == 4608 + 384 + 1024
    assert c.bytes == 4736 + 160 + 672
    # time (us), op by op max(FLOPs, bytes): qkv max(512, 352), attn_out max(256, 192), gate_up max(1024, 672),
    # down max(512, 352) -> 2304 per layer; decode attention max(2*192, 192) = 384 per layer;
    # elementwise 608 per layer; embed 160; LM head max(1024, 672)
    assert c.time_s == pytest.approx((2 * (2304 + 384 + 608) + 160 + 1024) * 1e-6, rel=1e-12)


def test_dense_prefill_step_and_the_lone_prompt_helpers_by_hand():
    # a prompt of 4 tokens from empty: T = 4, attn_work = 4*4/2 = 8, KV read 4, 1 sampled (prefill: 8 > 4)
    # FLOPs: linears 2*4*576*2 = 9216; attention 4*2*4*8*2 = 512; LM head 2*1*32*8 = 512
    # bytes per layer: weights 1152, activations 4*2*104 = 832, attention 4*16 + 4*32 = 192, elementwise 304*4 = 1216
    #   -> 3392*2 = 6784; embed 4*80 = 320; LM head 512 + 1*40*2 = 592
    rc = RooflineCost(TINY, _dev())
    c = rc.step(4, 8.0, 4, 1, 1)
    assert (c.flops, c.bytes) == (9216 + 512 + 512, 6784 + 320 + 592)
    # time (us): qkv max(1024, 448), attn_out max(512, 256), gate_up max(2048, 832), down max(1024, 448) = 4608;
    # prefill attention at full rate max(256, 192) = 256; elementwise 1216 -> 6080 per layer; embed 320;
    # LM head max(512, 592) = 592 (memory-bound at one row)
    assert c.time_s == pytest.approx((2 * 6080 + 320 + 592) * 1e-6, rel=1e-12)
    assert rc.prefill_time(4) == pytest.approx(13072e-6, rel=1e-12)
    # a chunk that completes no prompt samples nothing: no LM head (592 us, 512 FLOPs, 592 B less)
    c0 = rc.step(4, 8.0, 4, 0, 1)
    assert (c0.time_s, c0.flops, c0.bytes) == (pytest.approx(12480e-6, rel=1e-12), 9728, 7104)
    assert "lm_head" not in rc.breakdown(4, 8.0, 4, 0, 1)
    # decode_time(batch 2, context 3) is the decode step of the test above
    assert rc.decode_time(2, 3) == pytest.approx(7776e-6, rel=1e-12)


def test_dense_decode_breakdown_op_by_op_by_hand():
    b = RooflineCost(TINY, _dev()).breakdown(2, 6.0, 8, 2, 2)
    us = {k: round(v["time_s"] * 1e6, 6) for k, v in b.items()}
    # per op over both layers (see test_dense_decode_step_flops_bytes_and_time_by_hand); elementwise per layer:
    # norms 2 tokens * 128 = 256, rope 96, kv write 64, act 192
    assert us == {"attention": 768, "qkv": 1024, "attn_out": 512, "gate_up": 2048, "down": 1024, "norm": 512,
                  "rope": 192, "kv_write": 128, "act": 384, "embed": 160, "lm_head": 1024, "step_overhead": 0}
    assert {k: v["flops"] for k, v in b.items() if v["flops"]} == {
        "attention": 384, "qkv": 1024, "attn_out": 512, "gate_up": 2048, "down": 1024, "lm_head": 1024}
    assert {k: v["bytes"] for k, v in b.items()} == {
        "attention": 384, "qkv": 704, "attn_out": 384, "gate_up": 1344, "down": 704, "norm": 512, "rope": 192,
        "kv_write": 128, "act": 384, "embed": 160, "lm_head": 672, "step_overhead": 0}
    assert {v["source"] for v in b.values()} == {"roofline"}


def test_overheads_and_floors_by_hand():
    # the decode step of above (7776 us) with 1 us per GEMM / attention kernel (4 GEMMs and 1 attention per
    # layer, the LM head: 11 kernels) and a 100 us step overhead once
    assert RooflineCost(TINY, _dev(kernel_overhead_us=1.0, step_overhead_us=100.0)).step(2, 6.0, 8, 2, 2).time_s \
        == pytest.approx((7776 + 11 + 100) * 1e-6, rel=1e-12)
    # a 1000 us elementwise floor per kernel: per layer 2 norms + rope + kv write + act = 5 kernels, and the
    # embedding's 2: 12000 us in place of the elementwise 2*608 + 160 = 1376
    assert RooflineCost(TINY, _dev(elementwise_floor_us=1000.0)).step(2, 6.0, 8, 2, 2).time_s \
        == pytest.approx((7776 - 1376 + 12000) * 1e-6, rel=1e-12)
    # TINY_MOE (test_moe_decode_by_hand, 9088 us): elementwise kernels 2*(2 norms + rope + kv write) + act + shared
    # act + experts act + 3 routing kernels (top-k, permute, unpermute) + 2 embed = 16 at 1000 us in place of
    # 2*416 + 192 + 2*(48 + 96 + 160) + 160 = 1792 us
    assert RooflineCost(TINY_MOE, _dev(elementwise_floor_us=1000.0)).step(2, 6.0, 8, 2, 2).time_s \
        == pytest.approx((9088 - 1792 + 16000) * 1e-6, rel=1e-12)
    # a 50 us decode-attention floor is added to each of the 2 attention kernels (their fixed cost)
    assert RooflineCost(TINY, _dev(attention_decode_floor_us=50.0)).step(2, 6.0, 8, 2, 2).time_s \
        == pytest.approx((7776 + 100) * 1e-6, rel=1e-12)


def test_tensor_parallel_two_decode_by_hand():
    # tp = 2: 1 query head and max(1, 1 // 2) = 1 KV head per GPU; qkv N = (1 + 2)*4 = 12, K = 8;
    # attn_out N = 8, K = 4; gate_up N = 2*16/2 = 16, K = 8; down N = 8, K = 8; LM head N = 32/2 = 16, K = 8.
    # decode of 2 at context 3 (T = 2, attn_work 6, KV 8, 2 sampled), us:
    #   qkv max(2*2*96 = 384, 192 + 2*20*2 = 272); attn_out max(128, 64 + 48 = 112); gate_up max(512, 256 + 96 = 352);
    #   down max(256, 128 + 64 = 192) -> 1280 per layer (bytes 928)
    #   attention: FLOPs 4*1*4*6 = 96 at half rate 192; bytes 8*2*1*4*2 + 2*(1+2)*4*2 = 176 -> 192
    #   elementwise per token: norms 128 (replicated), rope 2*(1+1)*4*2 = 32, kv write 2*1*4*4 = 32, act 3*8*2 = 48
    #   -> 240 * 2 = 480 per layer; embed 160; LM head max(2*2*16*8 = 512, 256 + 2*24*2 = 352)
    #   all-reduces: 2 per layer + 1 for the embedding = 5 of T h 2 = 32 bytes; one-shot 1 us + 32 us
    #   (two-shot 2 + 2*(1/2)*32 = 34 us)
    c = RooflineCost(TINY, _dev(allreduce_base_us=1.0), tp=2).step(2, 6.0, 8, 2, 2)
    # the LM head shape as calibration lists it: vocab-parallel, 32/2 rows of 8
    assert RooflineCost(TINY, _dev(), tp=2).lm_head == ("lm_head", 16, 8)
    assert c.time_s == pytest.approx((2 * (1280 + 192 + 480) + 160 + 512 + 5 * 33) * 1e-6, rel=1e-12)
    assert c.flops == 2 * (1280 + 96) + 512
    assert c.bytes == 2 * (928 + 176 + 480) + 160 + 352


def test_plain_mlp_decode_by_hand():
    # OPT-style MLP (not gated): up N = 16, K = 8 and down N = 8, K = 16; activation reads f, writes f: 2*16*2 = 64 B
    # per token.  Decode of 2 at context 3, us: qkv 512, attn_out 256, up max(512, 256 + 96 = 352),
    # down max(512, 352) -> 1792 per layer; attention 384; elementwise 2*(128 + 48 + 32 + 64) = 544
    m = ModelShape("tiny-opt", layers=2, hidden=8, heads=2, kv_heads=1, head_dim=4, mlp_width=16, vocab=32,
                   gated_mlp=False)
    c = RooflineCost(m, _dev()).step(2, 6.0, 8, 2, 2)
    assert c.time_s == pytest.approx((2 * (1792 + 384 + 544) + 160 + 1024) * 1e-6, rel=1e-12)
    assert c.flops == 2 * (1792 + 192) + 1024
    assert c.bytes == 2 * ((352 + 192 + 352 + 352) + 192 + 544) + 160 + 672


def test_quantised_weights_and_kv_by_hand():
    # decode of 2 at context 3 (dense breakdown above: 7776 us bf16), us
    # fp8 weights and KV: 1 B per weight, GEMMs at the fp8 peak (2e6 FLOP/s), the LM head stays bf16:
    #   qkv max(512/2, 128 + 96) = 256; attn_out max(128, 64 + 64) = 128; gate_up max(512, 256 + 160) = 512;
    #   down max(256, 128 + 96) = 256 -> 1152 per layer; attention (bf16 compute) 384, its KV 8*2*1*4*1 + 64 = 128 B;
    #   elementwise: kv write 2*1*4*(2 + 1) = 24 per token -> (128 + 48 + 24 + 96)*2 = 592 per layer
    c = RooflineCost(TINY, _dev(), weight_dtype="fp8", kv_dtype="fp8").step(2, 6.0, 8, 2, 2)
    assert c.time_s == pytest.approx((2 * (1152 + 384 + 592) + 160 + 1024) * 1e-6, rel=1e-12)
    assert c.flops == 6016
    assert c.bytes == 2 * ((224 + 128 + 416 + 224) + 128 + 592) + 160 + 672
    # int4 (weight-only): bf16 compute, and dequantisation of every weight once (ceil(2/64) = 1 pass) at 4 fp32 ops
    # per weight on 0.25e6 FLOP/s = 16 us per weight: qkv 128*16 = 2048, attn_out 1024, gate_up 4096, down 2048
    # (above their FLOPs and 0.5 B weights) -> 9216 per layer
    c = RooflineCost(TINY, _dev(), weight_dtype="int4").step(2, 6.0, 8, 2, 2)
    assert c.time_s == pytest.approx((2 * (9216 + 384 + 608) + 160 + 1024) * 1e-6, rel=1e-12)
    assert c.bytes == 5568 - 2 * 576 * 1.5          # 0.5 B in place of 2 B per layer weight
    # int8 (weight-only too): 2 ops per weight, 8 us: qkv 1024, attn_out 512, gate_up 2048, down 1024 -> 4608 per layer
    c = RooflineCost(TINY, _dev(), weight_dtype="int8").step(2, 6.0, 8, 2, 2)
    assert c.time_s == pytest.approx((2 * (4608 + 384 + 608) + 160 + 1024) * 1e-6, rel=1e-12)
    # fp4 without fp4 tensor cores: weight-only like int4 (4 ops per weight), 0.5625 B per weight
    c = RooflineCost(TINY, _dev(), weight_dtype="fp4").step(2, 6.0, 8, 2, 2)
    assert c.time_s == pytest.approx((2 * (9216 + 384 + 608) + 160 + 1024) * 1e-6, rel=1e-12)
    assert c.bytes == 5568 - 2 * 576 * (2 - 0.5625)
    # fp4 on a device with fp4 tensor cores (4e6 FLOP/s): native, no dequantisation:
    #   qkv max(512/4, 128*0.5625 + 96 = 168) = 168; attn_out max(64, 36 + 64) = 100; gate_up max(256, 144 + 160) = 304;
    #   down max(128, 72 + 96) = 168 -> 740 per layer
    d = _dev()
    d4 = DeviceProfile(ProfileSpec.model_validate({**d.spec.model_dump(),
                                                   "peak_tflops": {**d.spec.peak_tflops, "fp4": 4e-6}}))
    c = RooflineCost(TINY, d4, weight_dtype="fp4").step(2, 6.0, 8, 2, 2)
    assert c.time_s == pytest.approx((2 * (740 + 384 + 608) + 160 + 1024) * 1e-6, rel=1e-12)
    # fp4 tensor cores do nothing for bf16 or fp8 weights: 7776 and 5440 us as on a device without them
    assert RooflineCost(TINY, d4).step(2, 6.0, 8, 2, 2).time_s == pytest.approx(7776e-6, rel=1e-12)
    assert RooflineCost(TINY, d4, weight_dtype="fp8", kv_dtype="fp8").step(2, 6.0, 8, 2, 2).time_s \
        == pytest.approx(5440e-6, rel=1e-12)


def test_k_decode_steps_by_hand():
    # steps 0 and 1 of a batch of 2 from context 3: step 1 has attn_work 8, KV 10 -> attention per layer
    # FLOPs 4*2*4*8 = 256 (512 us at half rate), bytes 10*16 + 64 = 224: 128 us, 64 FLOPs and 32 B per layer more
    t, f, b = RooflineCost(TINY, _dev()).decode_steps(2, 6.0, 8, 2)
    assert t == pytest.approx([7776e-6, 8032e-6], rel=1e-12)
    assert list(f) == [6016, 6144] and list(b) == [5568, 5632]


# --- pipeline stages ----------------------------------------------------------------------------
def test_pipeline_stages_by_hand():
    # 3 layers cut (1, 2): a layer of the decode of 2 at context 3 costs 2304 + 384 + 608 = 3296 us; the embedding
    # (160) sits on stage 0, the LM head (1024) on stage 1, no step overhead in a stage
    m3 = ModelShape("tiny3", layers=3, hidden=8, heads=2, kv_heads=1, head_dim=4, mlp_width=16, vocab=32)
    rc = RooflineCost(m3, _dev(step_overhead_us=100.0), pp=2, pp_layers=(1, 2))
    times, f, b = rc.stage_times(2, 6.0, 8, 2, 2)
    assert times == pytest.approx([(3296 + 160) * 1e-6, (2 * 3296 + 1024) * 1e-6], rel=1e-12)
    assert f == 3 * (2304 + 192) + 1024 and b == 3 * 2368 + 160 + 672
    assert rc.overhead_s() == pytest.approx(100e-6, rel=1e-12)
    # activations of 2 tokens to the next stage, hidden states and residual: 2 x (2*8*2) = 64 B at 1e6 B/s (+ the
    # 0 latency); none for 0 tokens
    assert rc.stage_transfer_s(2) == pytest.approx(64e-6, rel=1e-12) and rc.stage_transfer_s(0) == 0.0
    assert rc.stage_transfer_s(1) == pytest.approx(32e-6, rel=1e-12)
    # arrays over two decode steps: step 1 adds 128 us of attention per layer (test_k_decode_steps_by_hand)
    times, f, b = rc.stage_times(2, np.array([6.0, 8.0]), np.array([8.0, 10.0]), 2, 2)
    assert times[0] == pytest.approx([3456e-6, 3584e-6], rel=1e-12)
    assert times[1] == pytest.approx([7616e-6, 7872e-6], rel=1e-12)
    # tp = 2 within each stage: all-reduces 2 per layer, + 1 on the first stage for the embedding: 3 and 4 of
    # 1 + 32 us; a tp = 2 layer costs 1280 + 192 + 480 = 1952 us (test_tensor_parallel_two_decode_by_hand), LM head 512
    rc = RooflineCost(m3, _dev(allreduce_base_us=1.0), tp=2, pp=2, pp_layers=(1, 2))
    times, _, _ = rc.stage_times(2, 6.0, 8, 2, 2)
    assert times == pytest.approx([(1952 + 160 + 3 * 33) * 1e-6, (2 * 1952 + 512 + 4 * 33) * 1e-6], rel=1e-12)


# --- mixture of experts -------------------------------------------------------------------------
# 2 layers: the first dense (MLP f = 16), the second MoE: 4 experts of width 8, top-2, 1 shared expert (width 8)
TINY_MOE = ModelShape("tiny-moe", layers=2, hidden=8, heads=2, kv_heads=1, head_dim=4, mlp_width=16, vocab=32,
                      experts=4, experts_per_token=2, shared_experts=1, expert_width=8, dense_layers=1)


def test_moe_decode_by_hand():
    # decode of 2 at context 3 (T = 2), tp = ep = 1, us (FLOPs / bytes):
    #   both layers: qkv 512 (352 B), attn_out 256 (192 B), attention 384 (192 FLOPs, 192 B),
    #     norm + rope + kv write (128 + 48 + 32)*2 = 416
    #   dense layer: gate_up 1024 (672 B), down 512 (352 B), act 3*16*2*2 = 192
    #   MoE layer: shared gate_up N = 16, K = 8: max(512, 256 + 2*24*2 = 352); shared down N = K = 8: max(256, 128 + 64)
    #     router N = 4, K = 8 (bf16): max(2*2*32 = 128, 64 + 2*12*2 = 112)
    #     routed: pairs 2*2 = 4, experts hit 4 (1 - (1 - 2/4)^2) = 3 (m = 4/3 rows each)
    #       gate_up N = 16, K = 8: max(2*4*128 = 1024, 3*128*2 + 4*24*2 = 960); down N = K = 8: max(512, 3*64*2 + 4*16*2 = 512)
    #     shared act 3*8*2 = 48 per token, experts act 2*3*8*2 = 96 per token, routing 4*4 + 2*8 + 2*2*2*8*2 = 160 per token
    #   embed 160, LM head 1024 (672 B)
    c = RooflineCost(TINY_MOE, _dev()).step(2, 6.0, 8, 2, 2)
    both = 2 * (512 + 256 + 384 + 416)
    dense = 1024 + 512 + 192
    moe = 512 + 256 + 128 + 1024 + 512 + 2 * (48 + 96 + 160)
    assert c.time_s == pytest.approx((both + dense + moe + 160 + 1024) * 1e-6, rel=1e-12)
    assert c.flops == 2 * (512 + 256 + 192) + 1536 + (512 + 256 + 128 + 1024 + 512) + 1024
    assert c.bytes == 2 * (352 + 192 + 192 + 416) + (672 + 352 + 192) + (352 + 192 + 112 + 960 + 512 + 2 * 304) \
        + 160 + 672


def test_moe_expert_parallel_by_hand():
    # tp = ep = 2: attention and the dense parts split over 2 GPUs (1 query head, 1 KV head each); the 4 experts
    # placed 2 per GPU, each whole (moe_tp = 1); shared expert width 8/2 = 4.  Decode of 2 at context 3, us:
    #   both layers: qkv 384, attn_out 128, attention 192 (test_tensor_parallel_two_decode_by_hand), norm 256,
    #     rope 64, kv write 64
    #   dense layer: gate_up 512, down 256, act 3*8*2*2 = 96
    #   MoE layer: shared gate_up N = 8, K = 8: max(256, 128 + 64); shared down N = 8, K = 4: max(128, 64 + 48);
    #     router 128; pairs 2*2/2 = 2, experts hit 2 (1 - 1/4) = 1.5: gate_up max(2*2*128 = 512, 1.5*256 + 2*48 = 480),
    #     down max(256, 1.5*128 + 2*32 = 256); shared act 3*4*2 = 24 per token, experts act 2*3*8/2*2 = 48,
    #     routing 16 + 16 + 2*2*(2/2)*8*2 = 96 per token
    #   embed 160; LM head N = 16: 512
    #   all-reduces: 2*2 + 1 = 5 of 1 + 32 us (TP attention: every GPU holds every token, so expert parallelism
    #   dispatches nothing and the MoE layer's all-reduce sums its experts' partial outputs; no all-to-all)
    rc = RooflineCost(TINY_MOE, _dev(allreduce_base_us=1.0), tp=2, ep=2)
    us = {k: round(v["time_s"] * 1e6, 6) for k, v in rc.breakdown(2, 6.0, 8, 2, 2).items()}
    assert us == {"attention": 384, "qkv": 768, "attn_out": 256, "gate_up": 512, "down": 256,
                  "shared_gate_up": 256, "shared_down": 128, "router": 128, "experts_gate_up": 512,
                  "experts_down": 256, "norm": 512, "rope": 128, "kv_write": 128, "act": 96, "shared_act": 48,
                  "experts_act": 96, "moe_route": 192, "embed": 160, "lm_head": 512, "allreduce": 165,
                  "step_overhead": 0}
    c = rc.step(2, 6.0, 8, 2, 2)
    assert c.time_s == pytest.approx(sum(us.values()) * 1e-6, rel=1e-12)
    # FLOPs: both layers (384 + 128 + 96)*2, dense 512 + 256, MoE 256 + 128 + 128 + 512 + 256, LM head 512 (the
    # collectives none); bytes: both layers (272 + 112 + 176 + 256 + 64 + 64)*2, dense 352 + 192 + 96, MoE 192 + 112
    # + 112 + 480 + 256 + 48 + 96 + 192, embed 160, LM head 352 (the collectives move activations, counted as none)
    assert c.flops == 1216 + 768 + 1280 + 512
    assert c.bytes == 1888 + 640 + 1488 + 160 + 352
    # and ep < tp: tp = 2, ep = 1 keeps every MLP all-reduce (2*2 + 1 = 5) too;
    # the experts split in width over 2 GPUs (moe_tp 2: width 4): pairs 4, hit 3; gate_up N = 8, K = 8:
    # max(2*4*64 = 512, 3*64*2 + 4*16*2 = 512); down N = 8, K = 4: max(256, 3*32*2 + 4*12*2 = 288)
    b = RooflineCost(TINY_MOE, _dev(allreduce_base_us=1.0), tp=2, ep=1).breakdown(2, 6.0, 8, 2, 2)
    assert round(b["allreduce"]["time_s"] * 1e6, 6) == 5 * 33 and "alltoall" not in b
    assert (b["experts_gate_up"]["flops"], b["experts_gate_up"]["bytes"]) == (512, 512)
    assert (b["experts_down"]["flops"], b["experts_down"]["bytes"]) == (256, 288)
    # routing on tp = 2, ep = 1: 16 + 16 + 2*2*(2/1)*8*2 = 160 per token
    assert b["moe_route"]["bytes"] == 2 * 160


def test_moe_popularity_skew_on_the_hottest_rank_by_hand():
    # Zipf skew 1 over 4 experts, top-2: popularity 1, 1/2, 1/3, 1/4 (sum 25/12) -> q = 2*12/25 p = .96, .48, .32, .24
    # (none above 1).  ep = 2, round robin by popularity: rank 0 holds the 1st and 3rd (.96, .32).
    # T = 2: pairs 2*(.96 + .32) = 2.56, experts hit (1 - .04^2) + (1 - .68^2) = .9984 + .5376 = 1.536
    # gate_up N = 16, K = 8: FLOPs 2*2.56*128 = 655.36, bytes 1.536*128*2 + 2.56*24*2 = 393.216 + 122.88
    b = RooflineCost(TINY_MOE, _dev(), tp=2, ep=2, expert_skew=1.0).breakdown(2, 6.0, 8, 2, 2)
    assert b["experts_gate_up"]["flops"] == pytest.approx(655.36, rel=1e-12)
    assert b["experts_gate_up"]["bytes"] == pytest.approx(393.216 + 122.88, rel=1e-12)
    assert expert_hit_probs(2, 4, 1.0) == pytest.approx([.96, .48, .32, .24], rel=1e-12)
    # one token: it hits its 2 experts (uniform: 4 (1 - 1/2) = 2; skewed on rank 0: .96 + .32 = 1.28 = its pairs),
    # one row each: gate_up bytes 2*128*2 + 2*24*2 = 608 (uniform, tp = ep = 1), 1.28*(256 + 48) = 389.12 (skewed)
    assert RooflineCost(TINY_MOE, _dev()).breakdown(1, 3.0, 4, 1, 1)["experts_gate_up"]["bytes"] == 608
    assert RooflineCost(TINY_MOE, _dev(), tp=2, ep=2, expert_skew=1.0).breakdown(1, 3.0, 4, 1, 1)[
        "experts_gate_up"]["bytes"] == pytest.approx(389.12, rel=1e-12)
    # no token, no expert hit: the grouped GEMMs cost nothing (skewed and uniform)
    for skew in (0.0, 1.0):
        b0 = RooflineCost(TINY_MOE, _dev(), tp=2, ep=2, expert_skew=skew).breakdown(0, 0.0, 0, 0, 0)
        assert b0["experts_gate_up"]["time_s"] == 0.0 and b0["experts_gate_up"]["bytes"] == 0.0


def test_expert_hit_probs_caps_at_one_by_hand():
    # top-2 of 3, skew 1: p = 1, 1/2, 1/3 (sum 11/6) -> 2*6/11 p = 12/11, 6/11, 4/11; the first capped at 1 and the
    # other two scaled to the remaining 1: (6/11, 4/11) * 11/10 = .6, .4
    assert expert_hit_probs(2, 3, 1.0) == pytest.approx([1.0, 0.6, 0.4], rel=1e-12)
    assert expert_hit_probs(2, 4) == pytest.approx([0.5] * 4, rel=1e-12)
    # top-3 of 4, skew 2: p = 1, 1/4, 1/9, 1/16 -> 3p / (205/144) = 2.107, .527, .234, .132; the first capped, the
    # rest scaled to 2: 1.180, .524, .295 -> the second capped too; the last two share the remaining 1 as 1/9 : 1/16
    # = 16 : 9 -> .64, .36
    assert expert_hit_probs(3, 4, 2.0) == pytest.approx([1.0, 1.0, 0.64, 0.36], rel=1e-12)
    # skew 1, top-1 of 2: q = 2/3, 1/3; 2 tokens hit (1 - 1/9) + (1 - 4/9) = 13/9 experts
    assert expected_distinct_experts(2, 1, 2, 1.0) == pytest.approx(13 / 9, rel=1e-12)


def test_dp_attention_on_the_busiest_rank_by_hand():
    # tp = ep = 2 with DP attention: each GPU an attention rank with whole weights (2 query heads, 1 KV head); batch 2
    # -> 1 request (1 token, half the aggregates: attn_work 3, KV 4) on the busiest rank; routed experts on all
    # 2 tokens / ep.  us:
    #   both layers at T = 1: qkv max(256, 256 + 48) = 304; attn_out max(128, 128 + 32) = 160;
    #     attention max(2*4*2*4*3 = 192, 4*16 + 32 = 96) = 192; norm + rope + kv write 128 + 48 + 32 = 208
    #   dense layer: gate_up max(512, 512 + 80) = 592, down max(256, 256 + 48) = 304, act 96
    #   MoE layer: shared gate_up (width 8) max(256, 256 + 48) = 304, shared down max(128, 128 + 32) = 160,
    #     router max(64, 64 + 24) = 88; routed pairs 2*2/2 = 2, hit 2 (1 - 1/4) = 1.5: gate_up 512, down 256;
    #     shared act 48; experts act (all 2 tokens) 2*48 = 96; routing 16 + 16 + 2*2*(2*2/2)*8*2 = 160 (1 token)
    #   embed 80; LM head (1 row, N = 32) max(512, 512 + 80) = 592; no all-reduce; all-to-all of a rank's own
    #   token to the other rank when it holds one of the token's 2 experts (2 of the 4 there): 1 - C(2, 2) /
    #   C(4, 2) = 5/6 copies of 8 x 2 B (bf16 both ways) = 40/3 B: 2 of 1 + 40/3 us
    rc = RooflineCost(TINY_MOE, _dev(allreduce_base_us=1.0), tp=2, ep=2, dp_attention=True)
    total = 2 * (304 + 160 + 192 + 208) + (592 + 304 + 96) + (304 + 160 + 88 + 512 + 256 + 48 + 96 + 160) \
        + 80 + 592 + 2 * (1 + 40 / 3)
    assert rc.step(2, 6.0, 8, 2, 2).time_s == pytest.approx(total * 1e-6, rel=1e-12)
    # k = 2 decode steps: step 1 (attn_work 8, KV 10) puts 4 and 5 on the rank: FLOPs 4*2*4*4 = 128 (256 us),
    # 64 us a layer more
    t, _, _ = rc.decode_steps(2, 6.0, 8, 2)
    assert t == pytest.approx([total * 1e-6, (total + 128) * 1e-6], rel=1e-12)
    # batch 3 (3 tokens, attn_work 9, KV 12): the busiest rank holds ceil(3/2) = 2 requests: 2 tokens, attn_work 6,
    # KV 8 -> attention of the tp = 1 decode of 2 at context 3 (384 us a layer), LM head on 2 rows 1024 us
    b = rc.breakdown(3, 9.0, 12, 3, 3)
    assert round(b["attention"]["time_s"] * 1e6, 6) == 768 and b["attention"]["flops"] == 384
    assert round(b["lm_head"]["time_s"] * 1e6, 6) == 1024
    assert "allreduce" not in b


# --- multi-head latent attention -----------------------------------------------------------------
# 2 heads, q rank 6, KV latent 4 + rope key 2, nope dims 4, value dims 6 (dense MLP as TINY)
TINY_MLA = ModelShape("tiny-mla", layers=2, hidden=8, heads=2, kv_heads=2, head_dim=6, mlp_width=16, vocab=32,
                      q_lora_rank=6, kv_lora_rank=4, qk_rope_head_dim=2, qk_nope_head_dim=4, v_head_dim=6)


def test_mla_decode_and_prefill_by_hand():
    # linears: qkv_a N = 6 + 4 + 2 = 12, K = 8; q_b N = 2*(4 + 2) = 12, K = 6; kv_b N = 2*(4 + 6) = 20, K = 4;
    # attn_out N = 8, K = 2*6 = 12.  Decode of 2 at context 3 (T = 2), us (FLOPs / bytes):
    #   qkv_a max(2*2*96 = 384, 192 + 2*20*2 = 272); q_b max(288, 144 + 2*18*2 = 216); kv_b max(320, 160 + 2*24*2 = 256);
    #   attn_out max(384, 192 + 80 = 272); gate_up 1024 (672 B); down 512 (352 B) -> 2912 per layer (2040 B)
    #   absorbed attention: FLOPs 2*2*(2*4 + 2)*6 = 240 (480 us at half rate); bytes 8*(4 + 2)*2 + 2*2*10*2 = 176
    #   elementwise per token: norms 2*4*8*2 + 2*(6 + 4)*2 = 168, rope 2*(2 + 1)*2*2 = 24, latent write (4 + 2)*(2 + 2)
    #   = 24, act 96 -> 312 * 2 = 624 per layer
    rc = RooflineCost(TINY_MLA, _dev())
    c = rc.step(2, 6.0, 8, 2, 2)
    assert c.time_s == pytest.approx((2 * (2912 + 480 + 624) + 160 + 1024) * 1e-6, rel=1e-12)
    assert c.flops == 2 * (2912 + 240) + 1024
    assert c.bytes == 2 * (2040 + 176 + 624) + 160 + 672
    # k = 2 decode steps: step 1 works 8 and reads 10: FLOPs 2*2*10*8 = 320 (640 us), bytes 10*12 + 80 = 200,
    # 160 us, 80 FLOPs and 24 B a layer more
    t, f, bb = rc.decode_steps(2, 6.0, 8, 2)
    assert t == pytest.approx([9216e-6, 9536e-6], rel=1e-12)
    assert list(f) == [7328, 7488] and list(bb) == [6512, 6560]
    # prefill of 4 from empty (attn_work 8, KV 4): decompressed attention FLOPs 2*2*(4 + 2 + 6)*8 = 384,
    # bytes (4 + 4)*2*12*2 = 384 -> 384 us a layer
    b = rc.breakdown(4, 8.0, 4, 1, 1)
    assert {"qkv_a", "q_b", "kv_b", "attn_out"} <= set(b) and not {"qkv", "q", "kv_a"} & set(b)
    assert (b["attention"]["flops"], b["attention"]["bytes"]) == (768, 768)
    assert round(b["attention"]["time_s"] * 1e6, 6) == 768
    # fp8 latent cache: 1 B per element: decode attention bytes 8*6*1 + 80 = 128; latent write 6*(2 + 1) = 18 per token
    b = RooflineCost(TINY_MLA, _dev(), kv_dtype="fp8").breakdown(2, 6.0, 8, 2, 2)
    assert b["attention"]["bytes"] == 2 * 128 and b["kv_write"]["bytes"] == 2 * 2 * 18


def test_mla_without_a_query_bottleneck_by_hand():
    # q_lora_rank 0: q N = 2*(4 + 2) = 12, K = 8 and kv_a N = 4 + 2 = 6, K = 8 (no q norm: norms 128 + 2*4*2 = 144 B
    # per token); decode of 2: q FLOPs 2*2*96 = 384, bytes 192 + 2*20*2 = 272; kv_a FLOPs 192, bytes 96 + 2*14*2 = 152
    m = ModelShape("tiny-mla0", layers=2, hidden=8, heads=2, kv_heads=2, head_dim=6, mlp_width=16, vocab=32,
                   kv_lora_rank=4, qk_rope_head_dim=2, qk_nope_head_dim=4, v_head_dim=6)
    b = RooflineCost(m, _dev()).breakdown(2, 6.0, 8, 2, 2)
    assert (b["q"]["flops"], b["q"]["bytes"]) == (2 * 384, 2 * 272)
    assert (b["kv_a"]["flops"], b["kv_a"]["bytes"]) == (2 * 192, 2 * 152)
    assert "qkv_a" not in b and "q_b" not in b
    assert b["norm"]["bytes"] == 2 * 2 * 144


# --- sliding-window attention -------------------------------------------------------------------
TINY_SWA = ModelShape("tiny-swa", layers=2, hidden=8, heads=2, kv_heads=1, head_dim=4, mlp_width=16, vocab=32,
                      sliding_window=4, sliding_layers=1)


def test_sliding_positions_and_aggregates_by_hand():
    assert sliding_positions(0, 4, 8) == 1 + 2 + 3 + 4
    assert sliding_positions(10, 3, 8) == 3 * 8
    assert sliding_positions(5, 5, 8) == 6 + 7 + 8 + 8 + 8          # positions 6..10 capped at 8
    assert sliding_positions(3, 0, 8) == 0 and sliding_positions(3, -2, 8) == 0
    # work = positions - n/2; KV read = min(c + n, n + W - 1)
    assert sliding_aggregates(5, 5, 8) == (37 - 2.5, 10)
    assert sliding_aggregates(20, 1, 8) == (8 - 0.5, 8)
    assert sliding_aggregates(20, 3, 8) == (24 - 1.5, 10)
    # k decode steps of contexts 10, 0, 5 (unsorted), window 8: step j sums min(c + 1 + j, 8)
    assert list(window_sums(np.array([10, 0, 5]), 4, 8)) == [8 + 1 + 6, 8 + 2 + 7, 8 + 3 + 8, 8 + 4 + 8]


def test_sliding_layers_by_hand():
    # 1 full and 1 sliding layer (window 4).  Decode of 2 at context 10: full layer attn_work 20, KV 22;
    # sliding layer: each request's new token at position 11 sees min(11, 4) = 4: work 2*(4 - 1/2) = 7, KV 2*4 = 8.
    # full attention: FLOPs 4*2*4*20 = 640 (1280 us), bytes 22*16 + 64 = 416; sliding: FLOPs 4*8*7 = 224 (448 us),
    # bytes 8*16 + 64 = 192.  The rest of the step: 7776 - 768 = 7008 us (the dense decode of 2 above)
    rc = RooflineCost(TINY_SWA, _dev())
    c = rc.step(2, 20.0, 22, 2, 2, swa=(7.0, 8))
    assert c.time_s == pytest.approx((7008 + 1280 + 448) * 1e-6, rel=1e-12)
    assert c.flops == 6016 - 384 + 640 + 224 and c.bytes == 5568 - 384 + 416 + 192
    assert rc.decode_time(2, 10) == pytest.approx(8736e-6, rel=1e-12)
    b = rc.breakdown(2, 20.0, 22, 2, 2, swa=(7.0, 8))
    assert round(b["attention"]["time_s"] * 1e6, 6) == 1280 and round(b["attention_sliding"]["time_s"] * 1e6, 6) == 448
    assert round(b["lm_head"]["time_s"] * 1e6, 6) == 1024          # 2 sampled rows
    # a prefill of 4 from empty at window 4 (positions 1..4, work 10 - 2 = 8 = the full layer's): both layers'
    # attention at the prefill rate, FLOPs 4*2*4*8 = 256 -> 256 us each (decode's half rate would be 512)
    b = rc.breakdown(4, 8.0, 4, 1, 1, swa=(8.0, 4))
    assert round(b["attention"]["time_s"] * 1e6, 6) == 256 and round(b["attention_sliding"]["time_s"] * 1e6, 6) == 256
    # prefill of 6 from empty: full attn_work 18, KV 6 -> FLOPs 576, bytes 6*16 + 6*32 = 288: 576 us;
    # sliding: positions 1, 2, 3, 4, 4, 4 = 18 - 6/2 = 15 work -> 480 us.  Rest at T = 6, 1 sampled: GEMMs
    # 1536 + 768 + 3072 + 1536 = 6912 and elementwise 304*6 = 1824 per layer, embed 480, LM head 592
    assert rc.prefill_time(6) == pytest.approx((2 * (6912 + 1824) + 480 + 592 + 576 + 480) * 1e-6, rel=1e-12)
    # k = 2 decode steps: step 1 at context 11 (attn_work 22, KV 24; the window stays full: 7, 8): the full layer's
    # attention FLOPs 704 -> 1408 us, 128 us more
    t, f, bb = rc.decode_steps(2, 20.0, 22, 2, swa=(np.array([7.0, 7.0]), np.array([8, 8])))
    assert t == pytest.approx([8736e-6, 8864e-6], rel=1e-12)
    assert list(f) == [6496, 6560] and list(bb) == [5792, 5824]
    # two stages of one layer each: per layer the mean attention (1280 + 448)/2 = 864; a layer's other ops
    # 2304 + 608 = 2912; embed on the first, LM head on the last
    rp = RooflineCost(TINY_SWA, _dev(), pp=2)
    times, f2, _ = rp.stage_times(2, 20.0, 22, 2, 2, swa=(7.0, 8))
    assert times == pytest.approx([(2912 + 160 + 864) * 1e-6, (2912 + 1024 + 864) * 1e-6], rel=1e-12)
    assert f2 == 6496


# --- the what-if models ---------------------------------------------------------------------------
def test_linear_and_constant_costs_by_hand():
    lc = LinearCost(base_s=0.01, per_token_s=0.001, per_kv_token_s=0.0001)
    assert lc.step(10, 50.0, 100, 1, 1).time_s == pytest.approx(0.01 + 0.01 + 0.01, rel=1e-12)
    # k = 3 decode steps of 2 from KV 10: KV 10, 12, 14
    t, f, b = lc.decode_steps(2, 5.0, 10, 3)
    assert t == pytest.approx([0.013, 0.0132, 0.0134], rel=1e-12) and not f.any() and not b.any()
    # prompt of 10: 0.01 + 0.01 + 10 KV * 0.0001; a decode of 2 at context 10 reads 2*11 = 22
    assert lc.prefill_time(10) == pytest.approx(0.021, rel=1e-12)
    assert lc.decode_time(2, 10) == pytest.approx(0.01 + 0.002 + 0.0022, rel=1e-12)
    # half the layers slide (window 4): KV term over (1 - 1/2) of the full read and 1/2 of the sliding read
    sc = LinearCost(base_s=0.01, per_token_s=0.001, per_kv_token_s=0.0001, window=4, sliding_share=0.5)
    assert sc.step(10, 50.0, 100, 1, 1, swa=(1.0, 20)).time_s == pytest.approx(0.02 + 0.006, rel=1e-12)
    # decode of 2 at context 10: full 22, sliding 2*min(11, 4) = 8 -> 15 KV tokens
    assert sc.decode_time(2, 10) == pytest.approx(0.012 + 0.0015, rel=1e-12)
    t, _, _ = sc.decode_steps(2, 5.0, 22, 2, swa=(np.zeros(2), np.array([8, 8])))
    assert t == pytest.approx([0.0135, 0.0136], rel=1e-12)      # full 22, 24 -> 15, 16 KV tokens
    cc = ConstantCost(0.25)
    t, f, b = cc.decode_steps(4, 0.0, 0, 3)
    assert list(t) == [0.25] * 3 and list(f) == [0.0] * 3 and list(b) == [0.0] * 3
    assert cc.step(1, 0.0, 0, 1, 1).time_s == 0.25 and cc.prefill_time(100) == 0.25


def test_generic_decode_steps_steps_the_aggregates_by_hand():
    # a cost whose time, FLOPs and bytes echo its arguments: step i of 3 requests from attn 5, KV 7 is
    # (attn 5 + 3 i, KV 7 + 3 i, 3 tokens / 3 sampled / batch 3)
    class Echo(CostModel):
        def step(self, tokens, attn_work, kv_read_tokens, sampled, batch, swa=None):
            extra = 0.0 if swa is None else swa[0] * 1000 + swa[1] * 100000
            return StepCost(attn_work + extra, kv_read_tokens, tokens * 100 + sampled * 10 + batch)

    t, f, b = Echo().decode_steps(3, 5.0, 7, 2)
    assert list(t) == [5, 8] and list(f) == [7, 10] and list(b) == [333, 333]
    t, _, b = Echo().decode_steps(3, 5.0, 7, 2, swa=(np.array([1.0, 2.0]), np.array([3, 4])))
    assert list(t) == [5 + 1000 + 300000, 8 + 2000 + 400000] and list(b) == [333, 333]


def test_sliding_positions_are_exact_integers_beyond_float_precision():
    # the docstring promises an exact integer: the closed forms' products are even, so // 2 is exact where a float
    # division would round.  n = 2^27 + 1 tokens from empty, window 2^28 (covers them): sum 1 .. 2^27 + 1 =
    # (2^27 + 1)(2^27 + 2)/2 = (2^27 + 1)(2^26 + 1) = 2^53 + 2^27 + 2^26 + 1, odd and above 2^53: no float holds it
    n = 2 ** 27 + 1
    got = sliding_positions(0, n, 2 ** 28)
    assert isinstance(got, int) and got == 2 ** 53 + 2 ** 27 + 2 ** 26 + 1
    # window W = 2^27 + 1 inside a chunk of W + 2 tokens from empty: 1 .. W, then 2 tokens at W:
    # W(W + 1)/2 + 2W = (2^27 + 1)(2^26 + 1) + 2^28 + 2 = 2^53 + 2^28 + 2^27 + 2^26 + 3 (odd)
    W = 2 ** 27 + 1
    got = sliding_positions(0, W + 2, W)
    assert isinstance(got, int) and got == 2 ** 53 + 2 ** 28 + 2 ** 27 + 2 ** 26 + 3


# --- a hand-written measured profile: decode attention from its table ----------------------------------
def _measured_dev() -> DeviceProfile:
    """_dev() plus one decode-attention table for 2 query heads, 1 KV head, head dim 4 (bf16): per layer
    1, 2 ms at batch 1 (contexts 2, 4) and 3, 4 ms at batch 2; nothing else measured (the roofline elsewhere)."""
    d = _dev().spec.model_dump()
    d["measured"] = {"device": "cuda", "attention_decode": [
        {"q_heads": 2, "kv_heads": 1, "head_dim": 4, "batch": [1, 2], "context": [2, 4],
         "time_s": [[1e-3, 2e-3], [3e-3, 4e-3]]}]}
    return DeviceProfile(ProfileSpec.model_validate(d))


def test_decode_attention_from_a_measured_table_by_hand():
    dev = _measured_dev()
    rc = RooflineCost(TINY, dev)
    # decode of 2 at context 3 reads 8 KV tokens: 4 per request, the table's (batch 2, context 4) = 4 ms a layer
    # in place of the roofline's 384 us: 7776 - 768 + 8000 us
    assert rc.step(2, 6.0, 8, 2, 2).time_s == pytest.approx(15008e-6, rel=1e-12)
    assert rc.decode_time(2, 3) == pytest.approx(15008e-6, rel=1e-12)
    t, _, _ = rc.decode_steps(2, 6.0, 8, 1)
    assert t == pytest.approx([15008e-6], rel=1e-12)
    b = rc.breakdown(2, 6.0, 8, 2, 2)
    assert b["attention"]["time_s"] == pytest.approx(8e-3, rel=1e-12) and b["attention"]["source"] == "exact"
    # a 2-token prompt works 2 and reads 2 (not more than it reads): decode attention, batch 1 at context 2 = 1 ms;
    # the rest at T = 2 with one LM-head row: 2*(2304 + 608) + 160 + max(512, 592) = 6576 us
    assert rc.prefill_time(2) == pytest.approx((6576 + 2000) * 1e-6, rel=1e-12)
    # sliding layers: both the full and the sliding layer read 4 KV tokens per request of a batch of 2 -> 4 ms each
    rs = RooflineCost(TINY_SWA, dev)
    assert rs.step(2, 6.0, 8, 2, 2, swa=(5.0, 8)).time_s == pytest.approx((7008 + 8000) * 1e-6, rel=1e-12)
    bs = rs.breakdown(2, 6.0, 8, 2, 2, swa=(5.0, 8))
    assert bs["attention_sliding"]["time_s"] == pytest.approx(4e-3, rel=1e-12)
    # a 2-token prompt on it: sliding aggregates (1 + 2 - 2/2, min(2, 2 + 3)) = (2, 2), both layers at batch 1,
    # context 2 = 1 ms each
    assert rs.prefill_time(2) == pytest.approx((6576 + 2000) * 1e-6, rel=1e-12)
    # a decode of 2 at context 3: full (6, 8), sliding 2*(min(4, 4) - 1/2, min(4, 4)) = (7, 8): both at (2, 4)
    assert rs.decode_time(2, 3) == pytest.approx(15008e-6, rel=1e-12)
    t, _, _ = rs.decode_steps(2, 6.0, 8, 1, swa=(np.array([5.0]), np.array([8])))
    assert t == pytest.approx([15008e-6], rel=1e-12)
    # DP attention (tp = ep = 2): the busiest rank holds 1 request reading 4: batch 1, context 4 = 2 ms a layer in
    # place of 192 us (test_dp_attention_on_the_busiest_rank_by_hand: 5016 + 2 (1 + 40/3) us)
    rd = RooflineCost(TINY_MOE, _measured_dev_moe(), tp=2, ep=2, dp_attention=True)
    assert rd.step(2, 6.0, 8, 2, 2).time_s == pytest.approx((5016 + 2 * (1 + 40 / 3) - 384 + 4000) * 1e-6, rel=1e-12)
    assert rd.breakdown(2, 6.0, 8, 2, 2)["attention"]["time_s"] == pytest.approx(4e-3, rel=1e-12)


def _measured_dev_moe() -> DeviceProfile:
    """_measured_dev() with the all-reduce launch of test_dp_attention_on_the_busiest_rank_by_hand (1 us)."""
    d = _measured_dev().spec.model_dump()
    d["efficiency"]["allreduce_base_us"] = 1.0
    return DeviceProfile(ProfileSpec.model_validate(d))


def test_which_measured_table_each_weight_and_kv_dtype_reads():
    # one GEMM shape (the tiny qkv: N = 16, K = 8) measured flat at m = 1, 2, 4 under six table names, 1..6 ms, and
    # decode attention for bf16 and fp8 KV caches (4 and 8 ms at batch 2, context 4)
    ms = {"bf16": 1e-3, "fp8": 2e-3, "int4_wo": 3e-3, "int8": 4e-3, "mxfp4_wo": 5e-3, "nvfp4": 6e-3}
    d = _dev().spec.model_dump()
    d["measured"] = {"device": "cuda",
                     "gemm": [{"n": 16, "k": 8, "dtype": k, "m": [1, 2, 4], "time_s": [v] * 3} for k, v in ms.items()]
                     # the LM head (N = 32, K = 8) and TINY_MOE's router (N = 4, K = 8) in bf16 only: 0.5, 0.25 ms
                     + [{"n": n, "k": 8, "dtype": "bf16", "m": [1, 2, 4], "time_s": [t] * 3}
                        for n, t in ((32, 0.5e-3), (4, 0.25e-3))],
                     "attention_decode": [
                         {"q_heads": 2, "kv_heads": 1, "head_dim": 4, "dtype": k, "batch": [1, 2], "context": [2, 4],
                          "time_s": [[t, t], [t, t]]} for k, t in (("bf16", 4e-3), ("fp8", 8e-3))]}
    dev = DeviceProfile(ProfileSpec.model_validate(d))
    d4 = {**d, "peak_tflops": {**d["peak_tflops"], "fp4": 4e-6}}
    dev4 = DeviceProfile(ProfileSpec.model_validate(d4))

    def qkv_ms(wd, device=dev):
        b = RooflineCost(TINY, device, weight_dtype=wd).breakdown(2, 6.0, 8, 2, 2)["qkv"]
        assert b["source"] == "exact"
        return round(b["time_s"] / 2 * 1e3, 9)          # per layer, ms

    # bf16, fp16 and fp32 weights run bf16 GEMMs; fp8 its own; int4 the imported weight-only table when there is one
    # (int8 has none: its own name); fp4 weight-only (MXFP4 on Hopper) without fp4 tensor cores, NVFP4 with them
    assert [qkv_ms(w) for w in ("bf16", "fp16", "fp32", "fp8", "int4", "int8", "fp4")] == [1, 1, 1, 2, 3, 4, 5]
    assert qkv_ms("fp4", dev4) == 6
    # the LM head and the MoE router stay bf16 (their bf16 tables) whatever the weights
    for wd in ("bf16", "fp8", "int4", "fp4"):
        assert RooflineCost(TINY, dev, weight_dtype=wd).breakdown(2, 6.0, 8, 2, 2)["lm_head"]["time_s"] \
            == pytest.approx(0.5e-3, rel=1e-12)
        assert RooflineCost(TINY_MOE, dev, weight_dtype=wd).breakdown(2, 6.0, 8, 2, 2)["router"]["time_s"] \
            == pytest.approx(0.25e-3, rel=1e-12)
    # the KV cache's dtype names the decode table: fp16 and fp32 caches read bf16's (a 2-layer decode of 2 at
    # context 3 reads 4 per request: 4 ms a layer), fp8 its own (8 ms)
    for kv, t in (("bf16", 4e-3), ("fp16", 4e-3), ("fp32", 4e-3), ("fp8", 8e-3)):
        b = RooflineCost(TINY, dev, kv_dtype=kv).breakdown(2, 6.0, 8, 2, 2)["attention"]
        assert b["time_s"] == pytest.approx(2 * t, rel=1e-12) and b["source"] == "exact"


def test_a_measured_moe_table_replaces_the_routed_experts_by_hand():
    # TINY_MOE's routed experts (h 8, width 8, top-2 of 4, moe_tp 1, ep 1, gated) measured flat at 1, 2, 4 tokens:
    # 7 ms (bf16), 9 ms (fp8, named as an imported database names it: fp8_tensor), 11 ms (mxfp4_wo)
    d = _dev().spec.model_dump()
    d["measured"] = {"device": "cuda", "moe": [
        {"hidden": 8, "inter": 8, "topk": 2, "experts": 4, "dtype": k, "tokens": [1, 2, 4], "time_s": [t] * 3}
        for k, t in (("bf16", 7e-3), ("fp8_tensor", 9e-3), ("mxfp4_wo", 11e-3), ("nvfp4", 12e-3))]}
    # and split over 2 GPUs by experts (moe_ep 2): 13 ms
    d["measured"]["moe"].append({"hidden": 8, "inter": 8, "topk": 2, "experts": 4, "moe_ep": 2, "tokens": [1, 2, 4],
                                 "time_s": [13e-3] * 3})
    dev = DeviceProfile(ProfileSpec.model_validate(d))
    dev4 = DeviceProfile(ProfileSpec.model_validate({**d, "peak_tflops": {**d["peak_tflops"], "fp4": 4e-6}}))
    b = RooflineCost(TINY_MOE, dev, moe_tables=True).breakdown(2, 6.0, 8, 2, 2)
    # one op in place of the two grouped GEMMs, the experts' activation and the routing (test_moe_decode_by_hand):
    # FLOPs 1024 + 512; bytes 960 + 512 + 2*96 + 2*160
    assert b["experts"]["time_s"] == pytest.approx(7e-3, rel=1e-12) and b["experts"]["source"] == "exact"
    assert (b["experts"]["flops"], b["experts"]["bytes"]) == (1536, 1984)
    assert not {"experts_gate_up", "experts_down", "experts_act", "moe_route"} & set(b)
    assert "shared_act" in b and "router" in b
    # the step: test_moe_decode_by_hand's 9088 us less the routed experts' 1024 + 512 + 192 + 320, plus 7 ms
    assert RooflineCost(TINY_MOE, dev, moe_tables=True).step(2, 6.0, 8, 2, 2).time_s \
        == pytest.approx((9088 - 2048 + 7000) * 1e-6, rel=1e-12)
    assert RooflineCost(TINY_MOE, dev, weight_dtype="fp8", moe_tables=True).breakdown(2, 6.0, 8, 2, 2)[
        "experts"]["time_s"] == pytest.approx(9e-3, rel=1e-12)
    assert RooflineCost(TINY_MOE, dev, weight_dtype="fp4", moe_tables=True).breakdown(2, 6.0, 8, 2, 2)[
        "experts"]["time_s"] == pytest.approx(11e-3, rel=1e-12)
    for wd, device, t in (("fp16", dev, 7e-3), ("fp32", dev, 7e-3), ("fp4", dev4, 12e-3)):
        assert RooflineCost(TINY_MOE, device, weight_dtype=wd, moe_tables=True).breakdown(2, 6.0, 8, 2, 2)[
            "experts"]["time_s"] == pytest.approx(t, rel=1e-12)
    assert RooflineCost(TINY_MOE, dev, tp=2, ep=2, moe_tables=True).breakdown(2, 6.0, 8, 2, 2)[
        "experts"]["time_s"] == pytest.approx(13e-3, rel=1e-12)
    # not under DP attention (the tables time one TP-attention instance's tokens)
    assert "experts" not in RooflineCost(TINY_MOE, dev, tp=2, ep=2, dp_attention=True,
                                         moe_tables=True).breakdown(2, 6.0, 8, 2, 2)
    # int4 weights have no table here (fp8's name is no fallback): the grouped GEMMs
    assert "experts" not in RooflineCost(TINY_MOE, dev, weight_dtype="int4", moe_tables=True).breakdown(2, 6.0, 8, 2, 2)
    # opt-in only, uniform routing only: without moe_tables, or with a skew, the grouped GEMMs of the roofline
    for rc in (RooflineCost(TINY_MOE, dev), RooflineCost(TINY_MOE, dev, moe_tables=True, expert_skew=1.0)):
        assert "experts" not in rc.breakdown(2, 6.0, 8, 2, 2)
    # no token enters: no kernel
    assert RooflineCost(TINY_MOE, dev, moe_tables=True).breakdown(0, 0.0, 0, 0, 0)["experts"]["time_s"] == 0.0


def test_dp_attention_rank_share_is_per_batch_not_per_token_count_by_hand():
    # 3 tokens and 2 sampled rows from a batch of 3 (the busiest rank: ceil(3/2) = 2 requests, 2 tokens,
    # 4/3 rows), priced after the same counts from a batch of 2 (1 request, 1.5 tokens, 1 row) on the same instance:
    # the non-attention ops depend on the rank's share, not only on (tokens, sampled).  us, at 2 rank tokens:
    #   both layers: qkv 512, attn_out 256, attention (work 9*2/3 = 6, KV 8) 384, norm + rope + kv write 416
    #   dense layer: 1024 + 512 + act 192
    #   MoE layer: shared gate_up 512, shared down 256, router 128; routed on all 3 tokens: pairs 3*2/2 = 3,
    #     hit 2 (1 - 1/8) = 1.75: gate_up max(768, 1.75*256 + 3*48 = 592), down max(384, 224 + 96 = 320);
    #     shared act 2*48, experts act 3*48, routing 2*160
    #   embed 160; LM head on 4/3 rows: max(2*(4/3)*256, 512 + (4/3)*80) = 2048/3; all-to-all 2*(1 + 2*8*2*5/6) (a
    #   token goes to the other rank with probability 1 - C(2, 2) / C(4, 2) = 5/6)
    rc = RooflineCost(TINY_MOE, _dev(allreduce_base_us=1.0), tp=2, ep=2, dp_attention=True)
    rc.step(3, 9.0, 12, 2, 2)
    total = 2 * (512 + 256 + 384 + 416) + (1024 + 512 + 192) + (512 + 256 + 128 + 768 + 384 + 96 + 144 + 320) \
        + 160 + 2048 / 3 + 2 * (1 + 80 / 3)
    assert rc.step(3, 9.0, 12, 2, 3).time_s == pytest.approx(total * 1e-6, rel=1e-12)


def test_stage_times_with_sliding_layers_and_tables_by_hand():
    # 4 layers, 2 of them sliding (window 4), 2 stages of 2: decode of 2 at context 10 (full work 20, KV 22; sliding
    # 7, 8): full attention 1280 us, 640 FLOPs, 416 B a layer; sliding 448 us, 224 FLOPs, 192 B (test_sliding_layers_by_hand);
    # a stage's mean attention per layer (2*1280 + 2*448)/4 = 864.  The rest of a layer 2304 + 608 = 2912 us,
    # 2304 FLOPs, 1152 + 416 + 608 = 2176 B; embed 160 us / 160 B; LM head 1024 us / 1024 FLOPs / 672 B
    m = ModelShape("tiny-swa4", layers=4, hidden=8, heads=2, kv_heads=1, head_dim=4, mlp_width=16, vocab=32,
                   sliding_window=4, sliding_layers=2)
    times, f, b = RooflineCost(m, _dev(), pp=2).stage_times(2, 20.0, 22, 2, 2, swa=(7.0, 8))
    assert times == pytest.approx([(2 * 2912 + 160 + 2 * 864) * 1e-6, (2 * 2912 + 1024 + 2 * 864) * 1e-6], rel=1e-12)
    assert f == 4 * 2304 + 1024 + 2 * 640 + 2 * 224
    assert b == 4 * 2176 + 160 + 672 + 2 * 416 + 2 * 192
    # a prefill of 4 from empty on TINY_SWA's 2 stages (swa = (8, 4), the full layer's): attention at the prefill
    # rate, 256 us a layer; the rest of a layer at T = 4: 4608 + 1216 us; embed 320 on the first, LM head 592 on the last
    times, _, _ = RooflineCost(TINY_SWA, _dev(), pp=2).stage_times(4, 8.0, 4, 1, 1, swa=(8.0, 4))
    assert times == pytest.approx([(5824 + 320 + 256) * 1e-6, (5824 + 592 + 256) * 1e-6], rel=1e-12)
    # a measured decode table (4 ms a layer at batch 2, context 4) in a stage: 3 layers cut (1, 2)
    m3 = ModelShape("tiny3", layers=3, hidden=8, heads=2, kv_heads=1, head_dim=4, mlp_width=16, vocab=32)
    times, _, _ = RooflineCost(m3, _measured_dev(), pp=2, pp_layers=(1, 2)).stage_times(2, 6.0, 8, 2, 2)
    assert times == pytest.approx([(2912 + 4000 + 160) * 1e-6, (2 * (2912 + 4000) + 1024) * 1e-6], rel=1e-12)
    times, _, _ = RooflineCost(TINY_SWA, _measured_dev(), pp=2).stage_times(2, 6.0, 8, 2, 2, swa=(5.0, 8))
    assert times == pytest.approx([(2912 + 4000 + 160) * 1e-6, (2912 + 4000 + 1024) * 1e-6], rel=1e-12)


def test_weight_bytes_per_gpu_by_hand():
    # TINY in bf16: 2 layers of 576 parameters and an untied 32 x 8 embedding and LM head: (1152 + 512) * 2 B
    assert RooflineCost(TINY, _dev()).weight_bytes_per_gpu() == 3328
    # 4 layers cut (1, 3): the last stage holds 3 layers and the LM head: 3*576*2 + 256*2 (the even cut: 2*1152 + 512)
    m4 = ModelShape("tiny4", layers=4, hidden=8, heads=2, kv_heads=1, head_dim=4, mlp_width=16, vocab=32)
    assert RooflineCost(m4, _dev(), pp=2, pp_layers=(1, 3)).weight_bytes_per_gpu() == 3 * 1152 + 512
    assert RooflineCost(m4, _dev(), pp=2).weight_bytes_per_gpu() == 2 * 1152 + 512
    # TINY_MOE: attention 2*192, dense MLP 384, shared expert 192, routed 4*192 = 768, router 8*4 = 32 parameters.
    # DP attention over 2: all but the routed experts whole ((384 + 384 + 192)*2 + 512*2 + 32*2), routed / 2: 768*2/2
    assert RooflineCost(TINY_MOE, _dev(), tp=2, ep=2, dp_attention=True).weight_bytes_per_gpu() == 1920 + 1024 + 64 + 768
    # plain tp = ep = 2: the dense part and the embeddings / 2, routed / 2, router replicated
    assert RooflineCost(TINY_MOE, _dev(), tp=2, ep=2).weight_bytes_per_gpu() == (1920 + 1024) / 2 + 768 + 64


def test_plain_mlp_moe_by_hand():
    # TINY_MOE with plain (not gated) MLPs: shared_up N = 8, K = 8 and shared_down N = 8, K = 8: 2*2*64 = 256 FLOPs each;
    # routed experts_up N = 8, K = 8 and experts_down: pairs 4, hit 3: FLOPs 2*4*64 = 512, bytes 3*64*2 + 4*16*2 = 512;
    # activations read f, write f: dense 2*16*2 = 64, shared 2*8*2 = 32, routed 2 (top-2) * 2*8*2 = 64 B per token
    m = ModelShape("tiny-moe-plain", layers=2, hidden=8, heads=2, kv_heads=1, head_dim=4, mlp_width=16, vocab=32,
                   gated_mlp=False, experts=4, experts_per_token=2, shared_experts=1, expert_width=8, dense_layers=1)
    b = RooflineCost(m, _dev()).breakdown(2, 6.0, 8, 2, 2)
    assert {k: b[k]["flops"] for k in ("up", "down", "shared_up", "shared_down", "experts_up", "experts_down")} == {
        "up": 512, "down": 512, "shared_up": 256, "shared_down": 256, "experts_up": 512, "experts_down": 512}
    assert (b["experts_up"]["bytes"], b["experts_down"]["bytes"]) == (512, 512)
    assert {k: b[k]["bytes"] for k in ("act", "shared_act", "experts_act")} == {
        "act": 2 * 64, "shared_act": 2 * 32, "experts_act": 2 * 64}
    assert not {"gate_up", "shared_gate_up", "experts_gate_up"} & set(b)


def test_impossible_parallel_layouts_are_refused():
    with pytest.raises(AssertionError):
        RooflineCost(TINY_MOE, _dev(), tp=2, ep=4)              # ep must divide tp
    with pytest.raises(AssertionError):
        RooflineCost(TINY_MOE, _dev(), tp=3, ep=3)              # 4 experts do not split over 3
    moe3 = ModelShape("tiny-moe3", layers=2, hidden=8, heads=2, kv_heads=1, head_dim=4, mlp_width=16, vocab=32,
                      experts=3, experts_per_token=2, expert_width=8)
    with pytest.raises(AssertionError):
        RooflineCost(moe3, _dev(), tp=2, ep=2)                  # nor 3 over 2
    RooflineCost(moe3, _dev(), tp=2, ep=1)                      # (split in width they do)
    with pytest.raises(AssertionError):
        RooflineCost(TINY, _dev(), tp=2, ep=2, dp_attention=True)     # DP attention is for MoE models
    with pytest.raises(AssertionError):
        RooflineCost(TINY_MOE, _dev(), tp=2, ep=1, dp_attention=True)  # with ep = tp
    with pytest.raises(AssertionError):
        RooflineCost(TINY_MOE, _dev(), tp=2, ep=2, pp=2, dp_attention=True)   # and without pipeline stages
    swa_moe = ModelShape("tiny-swa-moe", layers=2, hidden=8, heads=2, kv_heads=1, head_dim=4, mlp_width=16, vocab=32,
                         experts=4, experts_per_token=2, expert_width=8, sliding_window=4, sliding_layers=1)
    with pytest.raises(AssertionError):
        RooflineCost(swa_moe, _dev(), tp=2, ep=2, dp_attention=True)   # nor with sliding layers
    RooflineCost(swa_moe, _dev(), tp=2, ep=2)                   # (the layout itself is fine)


def test_prefill_attention_beyond_a_measured_table_scales_by_the_roofline_by_hand():
    # prefill attention measured for 4 and 8-token prompts (1, 2 ms a layer).  Outside, the nearest point scaled by
    # the roofline's ratio for one prompt of s tokens: FLOPs 4*2*4*s^2/2 = 16 s^2 at 1e6/s, bytes
    # s*(2*1*4*2 + (2 + 2)*4*2) = 48 s at 1e6 B/s
    d = _dev().spec.model_dump()
    d["measured"] = {"device": "cuda", "attention_prefill": [
        {"q_heads": 2, "kv_heads": 1, "head_dim": 4, "seq_len": [4, 8], "time_s": [1e-3, 2e-3]}]}
    dev = DeviceProfile(ProfileSpec.model_validate(d))
    rc = RooflineCost(TINY, dev)
    # a 16-token prompt from the 8-token point: max(4096, 768) / max(1024, 384) = 4 -> 8 ms a layer
    b = rc.breakdown(16, 128.0, 16, 1, 1)["attention"]
    assert b["time_s"] == pytest.approx(2 * 8e-3, rel=1e-12) and b["source"] == "extrapolated"
    # 2 tokens of mean causal length 2.5 (work 2.5 > KV read 2: prefill) from the 4-token point, memory-bound:
    # max(100, 120) / max(256, 192) = 120/256, times the prompts' share 2 / 2.5 -> 1 ms * 0.375 a layer
    b = rc.breakdown(2, 2.5, 2, 1, 1)["attention"]
    assert b["time_s"] == pytest.approx(2 * 0.375e-3, rel=1e-12) and b["source"] == "extrapolated"
    # an fp8 cache has no table of its own here: the roofline, max(16*256, 16*(8 + 32)) us a layer
    b = RooflineCost(TINY, dev, kv_dtype="fp8").breakdown(16, 128.0, 16, 1, 1)["attention"]
    assert b["time_s"] == pytest.approx(2 * 4096e-6, rel=1e-12) and b["source"] == "roofline"


def test_dp_attention_prefill_of_one_request_by_hand():
    # a lone 4-token prompt (batch 1) under DP attention (tp = ep = 2): its one rank holds all of it (4 tokens, work 8,
    # KV 4, 1 row), with whole weights; us:
    #   both layers: qkv max(1024, 256 + 4*24*2 = 448), attn_out max(512, 128 + 4*16*2 = 256), prefill attention at the
    #     full rate max(4*2*4*8 = 256, 4*16 + 4*32 = 192), norm + rope + kv write 208*4 = 832
    #   dense layer: gate_up max(2048, 512 + 4*40*2), down max(1024, 256 + 4*24*2), act 96*4 = 384
    #   MoE layer: shared gate_up 1024, shared down 512, router max(256, 64 + 4*12*2 = 160); routed pairs 4*2/2 = 4, hit
    #     2 (1 - 1/16) = 1.875: gate_up max(2*4*128 = 1024, 1.875*256 + 4*48 = 672), down max(512, 240 + 128 = 368);
    #     shared act 48*4, experts act 48*4, routing 160*4
    #   embed 80*4 = 320, LM head (1 row) max(512, 592) = 592; all-to-all of 4*8*2*5/6 = 160/3 B (5/6: the other
    #   rank holds one of a token's 2 experts): 2 of 1 + 160/3 us
    rc = RooflineCost(TINY_MOE, _dev(allreduce_base_us=1.0), tp=2, ep=2, dp_attention=True)
    total = 2 * (1024 + 512 + 256 + 832) + (2048 + 1024 + 384) + (1024 + 512 + 256 + 1024 + 512 + 192 + 192 + 640) \
        + 320 + 592 + 2 * (1 + 160 / 3)
    assert rc.step(4, 8.0, 4, 1, 1).time_s == pytest.approx(total * 1e-6, rel=1e-12)
    assert rc.breakdown(4, 8.0, 4, 1, 1)["attention"]["time_s"] == pytest.approx(2 * 256e-6, rel=1e-12)


def test_sliding_step_with_several_layers_of_each_kind_by_hand():
    # 4 layers, 2 sliding (test_stage_times_with_sliding_layers_and_tables_by_hand): a decode of 2 at context 10 is
    # 4*2912 + 160 + 1024 us of the rest plus 2*1280 + 2*448 of attention; FLOPs 4*2304 + 1024 + 2*640 + 2*224;
    # bytes 4*2176 + 160 + 672 + 2*416 + 2*192
    m = ModelShape("tiny-swa4", layers=4, hidden=8, heads=2, kv_heads=1, head_dim=4, mlp_width=16, vocab=32,
                   sliding_window=4, sliding_layers=2)
    c = RooflineCost(m, _dev()).step(2, 20.0, 22, 2, 2, swa=(7.0, 8))
    assert c.time_s == pytest.approx((4 * 2912 + 160 + 1024 + 2 * 1280 + 2 * 448) * 1e-6, rel=1e-12)
    assert (c.flops, c.bytes) == (4 * 2304 + 1024 + 2 * 640 + 2 * 224, 4 * 2176 + 160 + 672 + 2 * 416 + 2 * 192)


def test_expert_parallel_smaller_than_tensor_parallel_keeps_every_allreduce_by_hand():
    # 4 query heads of dim 2 over tp = 4, experts over ep = 2 (each split over tp/ep = 2 GPUs), TP attention:
    # 2*2 + 1 = 5 all-reduces of T h 2 = 32 B, each the faster of one-shot 1 + 3*32 = 97 us and two-shot
    # 2 + 2*(3/4)*32 = 50 us; every GPU holds every token, so no all-to-all
    m = ModelShape("tiny-moe-h4", layers=2, hidden=8, heads=4, kv_heads=1, head_dim=2, mlp_width=16, vocab=32,
                   experts=4, experts_per_token=2, shared_experts=1, expert_width=8, dense_layers=1)
    b = RooflineCost(m, _dev(allreduce_base_us=1.0), tp=4, ep=2).breakdown(2, 6.0, 8, 2, 2)
    assert b["allreduce"]["time_s"] == pytest.approx(5 * 50e-6, rel=1e-12)
    assert "alltoall" not in b


def test_a_step_with_no_token_launches_no_gemm_and_costs_only_the_step_overhead():
    # m = 0 rows: no kernel (the roofline's m / m was 0 / 0 = NaN before); an array with a 0 is 0 there only
    from pdsim import kernels
    # kernel overheads and floors on: a 0-row GEMM still launches nothing (elementwise kernels with no bytes
    # neither); only the step's own 25 us remains
    dev = _dev(kernel_overhead_us=3.0, elementwise_floor_us=2.0, step_overhead_us=25.0)
    assert kernels.gemm_roofline(dev, 0, 16, 8, 2.0) == 0.0
    two = kernels.gemm_roofline(dev, 2, 16, 8, 2.0)
    assert two > 0 and list(kernels.gemm_roofline(dev, np.array([0.0, 2.0]), 16, 8, 2.0)) == [0.0, two]
    cm = RooflineCost(TINY, dev)
    b = cm.breakdown(0, 0.0, 0, 0, 0)
    assert {k: v["time_s"] for k, v in b.items() if v["time_s"] != 0} == {"step_overhead": dev.step_overhead_s}
    assert cm.step(0, 0, 0, 0, 0).time_s == dev.step_overhead_s


def _preset_with(name: str, **eff) -> DeviceProfile:
    """A device preset with some efficiency constants replaced."""
    from pdsim.devices import get_device
    d = get_device(name)
    return DeviceProfile(d.spec.model_copy(update={"efficiency": d.spec.efficiency.model_copy(update=eff)}), d.path)


def test_fp8_dense_gemm_efficiencies_by_hand():
    # one dense GEMM, M = 4, N = 4, K = 8: FLOPs 2*4*4*8 = 256; bytes: weights 4*8 at 1 B (fp8) = 32 +
    # activations (4*8 + 4*4)*2 = 96 -> 128. Unit device: bf16 1e6 FLOP/s, fp8 2e6, 1e6 B/s, efficiencies 1,
    # no m_half, no overheads.
    from pdsim.kernels import gemm_roofline
    dev = _dev(fp8_gemm_compute=0.25, fp8_gemm_memory=0.5)
    # fp8: compute 256 / (2e6 * 0.25) = 512 us, memory 128 / (1e6 * 0.5) = 256 us -> 512 us
    assert gemm_roofline(dev, 4, 4, 8, 1.0, 2.0, "fp8") == pytest.approx(512e-6, rel=1e-12)
    # memory-bound with compute 1, memory 0.25: compute 128 us, memory 128 / 2.5e5 = 512 us
    assert gemm_roofline(_dev(fp8_gemm_memory=0.25), 4, 4, 8, 1.0, 2.0, "fp8") == pytest.approx(512e-6, rel=1e-12)
    # the same shapes as arrays (the fast path's k steps) give the same values, and M = 0 no kernel
    got = gemm_roofline(dev, np.array([4.0, 0.0]), 4, 8, 1.0, 2.0, "fp8")
    assert got[0] == pytest.approx(512e-6, rel=1e-12) and got[1] == 0.0
    # bf16 weights (2 B) keep the plain constants whatever the fp8 ones: FLOPs 256 / 1e6 = 256 us, bytes
    # 64 + 96 = 160 us -> 256 us; int8 weight-only (bf16 compute, 1 B weights) too: 256 us
    assert gemm_roofline(dev, 4, 4, 8, 2.0, 2.0, "bf16") == pytest.approx(256e-6, rel=1e-12)
    # the fp8 launch cost replaces the kernel overhead for fp8 only: 512 + 9 us, bf16 256 + 3 us
    dev_o = _dev(kernel_overhead_us=3.0, fp8_gemm_overhead_us=9.0, fp8_gemm_compute=0.25, fp8_gemm_memory=0.5)
    assert gemm_roofline(dev_o, 4, 4, 8, 1.0, 2.0, "fp8") == pytest.approx(521e-6, rel=1e-12)
    assert gemm_roofline(dev_o, 4, 4, 8, 2.0, 2.0, "bf16") == pytest.approx(259e-6, rel=1e-12)
    assert gemm_roofline(dev_o, np.array([4.0]), 4, 8, 1.0, 2.0, "fp8")[0] == pytest.approx(521e-6, rel=1e-12)
    # the device's own GEMM look-up (calibrate's held-out errors) prices the roofline the same way
    looked = dev_o.gemm_lookup(4, 4, 8, 1.0, 2.0, "fp8")
    assert looked.time_s == pytest.approx(521e-6, rel=1e-12) and looked.source == "roofline"
    # through the cost model, only fp8 weights reach them: a dense model's linear layers under fp8 weights
    # slow down with fp8_gemm_compute 0.1 (prefill, compute-bound), under bf16 / int4 / int8 / fp4-on-Hopper
    # weights (bf16 compute) and fp4 on Blackwell (fp4 tensor cores) nothing moves
    from pdsim.devices import get_device
    from pdsim.models import get_model
    llama = get_model("llama-3.1-8b")

    def linears_s(dev_name, wd, kvd, fc):
        d = _preset_with(dev_name, fp8_gemm_compute=fc, fp8_gemm_memory=1.0, fp8_gemm_overhead_us=None)
        rc = RooflineCost(llama, d, 1, wd, kvd)
        ops = [o for o in rc.ops(4096, 4096 * 2048.0, 4096, 1, 1) if o.kind == "gemm" and o.name != "lm_head"]
        assert len(ops) == 4, [o.name for o in ops]
        return sum(rc.op_time(o)[0] for o in ops)
    assert linears_s("h200", "fp8", "bf16", 0.1) > 3 * linears_s("h200", "fp8", "bf16", 1.0)
    for dev_name, wd, kvd in (("h200", "bf16", "fp8"), ("h200", "int4", "bf16"), ("h200", "int8", "bf16"),
                              ("h200", "fp4", "bf16"), ("b200", "fp4", "fp8")):
        assert linears_s(dev_name, wd, kvd, 0.1) == linears_s(dev_name, wd, kvd, 1.0), (dev_name, wd, kvd)
    # the presets with fp8 tensor cores carry the fractions fitted to the TRT-LLM fp8 GEMM tables (below 1: fp8
    # reaches ~1.45x bf16's speed, not 2x) and no launch cost of their own (check_kernels.py --refit-fp8)
    for name in ("h100-sxm", "h200", "b200"):
        e = get_device(name).spec.efficiency
        assert 0.6 < e.fp8_gemm_compute < 0.9 and 0.9 <= e.fp8_gemm_memory <= 1.0 and e.fp8_gemm_overhead_us is None


def test_fp8_grouped_gemm_efficiencies_by_hand():
    # one grouped GEMM of 8 token-expert pairs over 2 experts (m = 4), N = 4, K = 8: FLOPs 2*8*4*8 = 512;
    # bytes: weights 2*4*8 = 64 experts' weights at 1 B (fp8) + activations 8*(4+8)*2 = 192 -> 256.
    # Unit device: bf16 1e6 FLOP/s, fp8 2e6, 1e6 B/s, every efficiency 1, no overheads.
    from pdsim.kernels import grouped_gemm_roofline
    dev = _dev(grouped_fp8_compute=0.25, grouped_fp8_memory=0.5)
    # fp8: compute 512 / (2e6 * 0.25) = 1024 us, memory 256 / (1e6 * 0.5) = 512 us -> 1024 us
    assert grouped_gemm_roofline(dev, 8, 2, 4, 8, 1.0, "fp8") == pytest.approx(1024e-6, rel=1e-12)
    # 1 pair per expert (m = 1), 2 experts: FLOPs 2*2*4*8 = 128 -> 128 / (2e6 * 0.25) = 256 us;
    # bytes 64 + 2*12*2 = 112 -> 112 / (1e6 * 0.5) = 224 us: 256 us
    assert grouped_gemm_roofline(dev, 2, 2, 4, 8, 1.0, "fp8") == pytest.approx(256e-6, rel=1e-12)
    dev_m = _dev(grouped_fp8_compute=1.0, grouped_fp8_memory=0.25)
    # memory-bound at fp8 with 1 / 0.25: FLOPs 128 / 2e6 = 64 us, bytes 112 / 2.5e5 = 448 us
    assert grouped_gemm_roofline(dev_m, 2, 2, 4, 8, 1.0, "fp8") == pytest.approx(448e-6, rel=1e-12)
    # other dtypes keep the dense efficiencies: bf16 weights (2 B): FLOPs 512 / 1e6 = 512 us, bytes
    # 64*2 + 192 = 320 us -> 512 us, whatever the fp8 factors are
    assert grouped_gemm_roofline(dev, 8, 2, 4, 8, 2.0, "bf16") == pytest.approx(512e-6, rel=1e-12)
    # an fp8 grouped GEMM's own launch cost replaces the kernel overhead when given: 1024 + 7 us at fp8;
    # bf16 keeps the kernel overhead: 512 + 3 us
    dev_o = _dev(kernel_overhead_us=3.0, grouped_fp8_overhead_us=7.0, grouped_fp8_compute=0.25,
                 grouped_fp8_memory=0.5)
    assert grouped_gemm_roofline(dev_o, 8, 2, 4, 8, 1.0, "fp8") == pytest.approx(1031e-6, rel=1e-12)
    assert grouped_gemm_roofline(dev_o, 8, 2, 4, 8, 2.0, "bf16") == pytest.approx(515e-6, rel=1e-12)
    assert grouped_gemm_roofline(_dev(kernel_overhead_us=3.0, grouped_fp8_compute=0.25), 8, 2, 4, 8, 1.0, "fp8") \
        == pytest.approx(1027e-6, rel=1e-12)
    # through the cost model: only fp8 *weights* reach the fp8 grouped constants. fp8 KV with bf16 weights,
    # int4 / int8 weight-only, fp4 on Hopper (weight-only) and fp4 on Blackwell (fp4 tensor cores) keep the
    # dense roofline, so a grouped_fp8_compute of 0.1 must leave their routed-expert time unchanged
    from pdsim.models import get_model
    moe = get_model("qwen3-30b-a3b")

    def experts_s(dev_name, wd, kvd, fc):
        d = _preset_with(dev_name, grouped_fp8_compute=fc, grouped_fp8_memory=1.0, grouped_fp8_overhead_us=None)
        rc = RooflineCost(moe, d, 1, wd, kvd)
        gg = [o for o in rc.ops(4096, 4096 * 512.0, 0, 1, 8) if o.kind == "grouped_gemm"]
        assert len(gg) == 2, [o.name for o in gg]
        return sum(rc.op_time(o)[0] for o in gg)
    assert experts_s("h200", "fp8", "bf16", 0.1) > 3 * experts_s("h200", "fp8", "bf16", 1.0)   # prefill: compute-bound
    for dev_name, wd, kvd in (("h200", "bf16", "fp8"), ("h200", "int4", "bf16"), ("h200", "int8", "bf16"),
                              ("h200", "fp4", "bf16"), ("b200", "fp4", "fp8")):
        assert experts_s(dev_name, wd, kvd, 0.1) == experts_s(dev_name, wd, kvd, 1.0), (dev_name, wd, kvd)
    # and the presets carry the values fitted to the TRT-LLM fp8_block MoE tables (benchmarks/check_moe.py --refit)
    from pdsim.devices import get_device
    for name in ("h100-sxm", "h200"):
        e = get_device(name).spec.efficiency
        assert 0.3 < e.grouped_fp8_compute < 0.6 and 0.7 < e.grouped_fp8_memory <= 1.0
        assert e.grouped_fp8_overhead_us > e.kernel_overhead_us
    # B200's fit is not applied (end to end it made its MoE rows worse: calibration/README.md)
    assert get_device("b200").spec.efficiency.grouped_fp8_overhead_us is None
    assert get_device("a100-80gb-sxm").spec.efficiency.grouped_fp8_compute == 1.0   # no fp8 tensor cores: unused
