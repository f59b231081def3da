"""pdsim.metrics on tiny runs and hand-made records whose every figure is worked out by hand.

Written to kill mutmut survivors in metrics.py (tests/MUTANTS.md section 2): each expected value is
arithmetic on the inputs, in the comments, never a second call into pdsim's own code path.
Runs use ConstantCost (every step 0.1 s whatever its size), so the schedule is counted on fingers.
"""
from __future__ import annotations

import math
from types import SimpleNamespace as NS

import numpy as np
import pandas as pd
import pytest

from pdsim import config, metrics
from pdsim.simulation import resolve_model, run_topology
from pdsim.workload import Request

BLOCK_BYTES = 16 * 2 * 32 * 8 * 128 * 2      # llama-3.1-8b bf16: 16 tokens x 2 (K,V) x 32 layers x 8 heads x 128 x 2 B


def _run(rows, topo=None, slo=None, client=None, bin_s=0.1, name="c", **extra):
    """One topology on a hand-made stream of (arrival_s, prompt, output)."""
    topo = topo or {"kind": "colocated", "max_running": 1, "kv_blocks": 100, "watermark": 0.1,
                    "price_per_gpu_hour_usd": 3.6, "cost_model": {"kind": "constant", "step_s": 0.1}}
    raw = {"seed": 0, "model": "llama-3.1-8b", "topologies": {name: topo},
           "workload": {"arrival": "poisson", "rate": 1.0, "num_requests": len(rows),
                        "prompt_tokens": 20, "output_tokens": 3},
           "slo": slo or {"ttft_s": 0.15, "tpot_s": 0.05, "attainment_target": 0.5}}
    if client:
        raw["client"] = client
    raw.update(extra)
    sc = config.parse(raw, "t.yaml")
    reqs = [Request(i, a, p, o) for i, (a, p, o) in enumerate(rows)]
    (n, spec), = sc.topologies.items()
    res = run_topology(sc, n, spec, reqs, resolve_model(sc), bin_s)
    return sc, res


def test_summary_of_two_requests_by_hand():
    # batch-1 replica, every step 0.1 s, $3.60 per GPU-hour (= $0.001 per GPU-second):
    #   r0 arrives 0.0 (20 prompt, 3 output): prefill 0-0.1 (1st token), decodes end 0.2, 0.3 -> finish 0.3
    #   r1 arrives 1.0 (30 prompt, 1 output): prefill 1.0-1.1, its only token -> finish 1.1 = end of run
    sc, res = _run([(0.0, 20, 3), (1.0, 30, 1)])
    df = metrics.requests_frame([res], sc.client)
    assert list(df.ttft_s) == pytest.approx([0.1, 0.1]) and list(df.e2e_s) == pytest.approx([0.3, 0.1])
    assert df.tpot_s[0] == pytest.approx(0.1) and math.isnan(df.tpot_s[1])
    assert list(df.queue_s) == pytest.approx([0.0, 0.0]) and list(df.prefill_s) == pytest.approx([0.1, 0.1])
    s = metrics.summarize([res], df, sc)["c"]
    assert res.sim_end_s == pytest.approx(1.1)
    assert s["requests"] == {"total": 2, "finished": 2, "rejected": 0, "abandoned": 0, "unfinished": 0}
    # E2E sample {0.1, 0.3}: mean 0.2; linear percentiles 0.1 + 0.2 q: p50 0.2, p90 0.28, p99 0.298
    assert (s["e2e_s"]["mean"], s["e2e_s"]["p50"], s["e2e_s"]["p90"], s["e2e_s"]["p99"]) == \
        pytest.approx((0.2, 0.2, 0.28, 0.298))
    assert s["ttft_s"]["mean"] == pytest.approx(0.1) and s["tpot_s"]["mean"] == pytest.approx(0.1)
    assert s["queue_s"]["p99"] == pytest.approx(0.0) and s["kv_transfer_s"] is None
    # 2 requests and 3 + 1 = 4 output tokens in 1.1 s, on 1 GPU
    tp = s["throughput"]
    assert tp["requests_per_s"] == pytest.approx(2 / 1.1)
    assert tp["output_tokens_per_s"] == pytest.approx(4 / 1.1)
    assert tp["output_tokens_per_s_per_gpu"] == pytest.approx(4 / 1.1)
    # paid: 1 GPU x 1.1 s = 1.1/3600 GPU-hours = $0.0011; a static cluster costs its price per hour, $3.60
    assert s["gpus"] == 1 and s["mean_gpus"] == pytest.approx(1.0)
    assert s["gpu_hours"] == pytest.approx(1.1 / 3600) and s["cost_usd"] == pytest.approx(0.0011)
    assert s["cost_per_hour_usd"] == pytest.approx(3.6)
    # $0.0011 for 4 tokens = $275 per million
    assert s["cost_per_million_output_tokens_usd"] == pytest.approx(275.0)
    # SLO: TTFT 0.1 <= 0.15 for both; TPOT 0.1 > 0.05 for r0, r1 has no TPOT: 1 of 2 meet both
    assert s["slo_attainment"] == pytest.approx(0.5) and s["slo_met"] is True     # 0.5 >= 0.5
    p = s["pools"]["replica"]
    # busy 4 steps x 0.1 s = 0.4 s of 1.1 s
    assert p["busy_fraction"] == pytest.approx(0.4 / 1.1)
    assert s["utilization"] == {"replica": {"busy_fraction": p["busy_fraction"], "mfu": None, "mbu": None}}
    assert (p["instances"], p["tp"], p["pp"], p["ep"], p["gpus"], p["micro_batches"]) == (1, 1, 1, 1, 1, None)
    assert p["gpu_hours"] == pytest.approx(1.1 / 3600) and p["cost_usd"] == pytest.approx(0.0011)
    assert p["price_per_gpu_hour_usd"] == 3.6 and p["weights_bytes_per_gpu"] is None
    # KV: r0 holds ceil(22 / 16) = 2 blocks at most, r1 ceil(30 / 16) = 2; never together (batch 1)
    assert p["kv_peak_bytes"] == 2 * BLOCK_BYTES and p["kv_capacity_bytes"] == 100 * BLOCK_BYTES
    assert s["kv_cache"] == {"peak_bytes": 2 * BLOCK_BYTES, "capacity_bytes": 100 * BLOCK_BYTES}
    # capacity: 100 blocks less a 10% watermark = 90 blocks = 1440 tokens; the mean request is
    # (23 + 31) / 2 = 27 tokens = 2 blocks, so 90 // 2 = 45 such requests
    assert (p["kv_blocks"], p["kv_block_size"], p["kv_capacity_tokens"]) == (100, 16, 1440)
    assert p["kv_request_tokens_mean"] == 27.0 and p["kv_capacity_requests"] == 45 and p["engine"] is None
    assert s["preemptions"] == 0 and s["rejected_by_reason"] == {} and s["warmup_excluded"] == 0
    assert s["links"] == [] and s["faults"] is None and s["sim_end_s"] == pytest.approx(1.1)


def _tok(times, dfirst=float("nan")):
    return NS(token_s=times, decode_first_s=dfirst)


def test_itl_columns_by_hand():
    # r0: tokens at 0, 0.1, 0.3, 0.6 -> gaps 0.1, 0.2, 0.3: mean 0.2, max 0.3, p99 (linear, numpy's
    #     default) at index (3 - 1) x 0.99 = 1.98 of the sorted gaps: 0.2 + 0.98 x (0.3 - 0.2) = 0.298
    # r1: no token times recorded; r2: one token, no gap -> NaN
    # r3: tokens at 2.0, 2.5, 2.6 -> gaps 0.5, 0.1: mean 0.3, max 0.5, p99 at 0.99: 0.1 + 0.99 x 0.4 = 0.496
    #     (the 1.4 s from r0's last token to r3's first is no gap of either request)
    rs = [_tok([0.0, 0.1, 0.3, 0.6]), _tok(None), _tok([1.0]), _tok([2.0, 2.5, 2.6])]
    mean, p99, mx = metrics.itl_columns(rs, np.zeros(4, np.int64))
    assert mean[0] == pytest.approx(0.2) and mx[0] == pytest.approx(0.3) and p99[0] == pytest.approx(0.298)
    assert mean[3] == pytest.approx(0.3) and mx[3] == pytest.approx(0.5) and p99[3] == pytest.approx(0.496)
    assert np.isnan([mean[1], p99[1], mx[1], mean[2], p99[2], mx[2]]).all()
    # the client's first token is r3's second (k0 = 1): one gap left, 0.1; r0 from its 2nd token: 0.2, 0.3
    mean, p99, mx = metrics.itl_columns(rs, np.array([1, 0, 0, 1]))
    assert (mean[3], p99[3], mx[3]) == pytest.approx((0.1, 0.1, 0.1))
    assert (mean[0], mx[0]) == pytest.approx((0.25, 0.3)) and p99[0] == pytest.approx(0.2 + 0.99 * 0.1)
    # a request with 2 tokens from k0 = 1 on has 1 token left: no gap
    mean, _, _ = metrics.itl_columns([_tok([0.0, 1.0])], np.array([1]))
    assert np.isnan(mean[0])
    # nothing recorded anywhere: all NaN, same length
    mean, p99, mx = metrics.itl_columns([_tok(None), _tok([5.0])], np.zeros(2, np.int64))
    assert len(mean) == 2 and np.isnan(np.r_[mean, p99, mx]).all()
    # every gap of the kept requests, concatenated: r0's three, then r3's two
    g = metrics.itl_gaps(rs, np.zeros(4, np.int64), np.array([True, True, True, True]))
    assert g == pytest.approx([0.1, 0.2, 0.3, 0.5, 0.1])
    g = metrics.itl_gaps(rs, np.zeros(4, np.int64), np.array([False, True, True, True]))
    assert g == pytest.approx([0.5, 0.1])


def test_p99_of_many_gaps_interpolates_by_hand():
    # 101 tokens 0, 1, 3, 6, ... (gap k = k for k = 1..100): p99 at index 99 x 0.99 = 98.01 of the sorted
    # gaps 1..100: 99 + 0.01 x (100 - 99) = 99.01; mean 50.5, max 100.  gamma = 0.01 < 0.5 takes the
    # a + d*gamma branch; the 3-gap case above (gamma 0.98) the other
    t = np.concatenate([[0.0], np.cumsum(np.arange(1.0, 101.0))]).tolist()
    mean, p99, mx = metrics.itl_columns([_tok(t)], np.zeros(1, np.int64))
    assert (mean[0], p99[0], mx[0]) == pytest.approx((50.5, 99.01, 100.0))


def test_client_first_token_by_hand():
    first = np.array([1.0, 2.0, 3.0, 4.0])
    # r1: a one-token reply, no decode; r3: a 5-token reply prefilled (4.0) but never decoded (abandoned)
    rs = [_tok(None, 1.5), _tok(None, float("nan")), _tok(None, 3.25), _tok(None, float("nan"))]
    for r, out in zip(rs, (5, 1, 5, 5)):
        r.output_tokens = out
    seen, k0 = metrics.client_first_token(rs, first, "disaggregated", config.ClientSpec())
    assert list(seen[:3]) == [1.5, 2.0, 3.25] and np.isnan(seen[3]) and list(k0) == [1, 0, 1, 0]
    rs, first = rs[:3], first[:3]
    for kind, client in (("colocated", config.ClientSpec()),
                         ("disaggregated", config.ClientSpec(ttft_at="prefill_end"))):
        seen, k0 = metrics.client_first_token(rs, first, kind, client)
        assert list(seen) == [1.0, 2.0, 3.0] and list(k0) == [0, 0, 0]


def test_warmup_mask_takes_the_first_to_finish_ties_by_order():
    # finished: r0 at 0.5, r1 at 0.2, r3 at 0.2; r2 rejected (earliest "finish" 0.1 but not finished)
    finish = np.array([0.5, 0.2, 0.1, 0.2])
    status = np.array(["finished", "finished", "rejected", "finished"], dtype=object)
    assert list(metrics.warmup_mask(finish, status, 2)) == [False, True, False, True]
    assert list(metrics.warmup_mask(finish, status, 1)) == [False, True, False, False]
    assert list(metrics.warmup_mask(finish, status, 0)) == [False] * 4


def test_network_rtt_and_warmup_in_the_summary_by_hand():
    # the two-request run of test_summary_of_two_requests_by_hand, seen by a client 50 ms away that
    # leaves out the first request to finish (r0, at 0.3 s)
    sc, res = _run([(0.0, 20, 3), (1.0, 30, 1)], client={"network_rtt_s": 0.05, "warmup_requests": 1},
                   slo={"ttft_s": 0.2, "tpot_s": 0.05, "attainment_target": 0.5})
    df = metrics.requests_frame([res], sc.client)
    assert list(df.ttft_s) == pytest.approx([0.15, 0.15]) and list(df.e2e_s) == pytest.approx([0.35, 0.15])
    assert list(df.ttft_prefill_end_s) == pytest.approx([0.1, 0.1])         # server side: no RTT
    assert df.tpot_s[0] == pytest.approx(0.1)                                  # (0.3 - 0.1) / 2: RTT cancels
    assert list(df.warmup) == [True, False]
    s = metrics.summarize([res], df, sc)["c"]
    assert s["warmup_excluded"] == 1 and s["requests"]["total"] == 2 and s["requests"]["finished"] == 2
    # measured: r1 alone, E2E 0.15 s, 1 request and 1 output token in 1.1 s
    assert s["e2e_s"]["mean"] == pytest.approx(0.15) and s["tpot_s"]["mean"] is None
    assert s["throughput"]["requests_per_s"] == pytest.approx(1 / 1.1)
    assert s["throughput"]["output_tokens_per_s"] == pytest.approx(1 / 1.1)
    # TTFT 0.15 <= 0.2 and no TPOT: r1 meets the SLO, 1 of 1 (r0, TPOT 0.1 > 0.05, is not counted)
    assert s["slo_attainment"] == 1.0


def test_slo_edge_cases_by_hand():
    slo = config.SLOSpec(ttft_s=1.0, tpot_s=1.0, attainment_target=0.9)
    assert math.isnan(metrics.slo_attainment(pd.DataFrame(columns=["status", "ttft_s", "tpot_s"]), slo))
    assert metrics.slo_passes(slo, 0.9, None, None) is True           # exactly the target passes
    assert metrics.slo_passes(slo, 0.89, None, None) is False
    assert metrics.slo_passes(slo, float("nan"), None, None) is False  # no request: no pass
    pct = config.SLOSpec(mode="percentile", ttft_s=1.0, tpot_s=0.5)
    assert metrics.slo_passes(pct, 0.0, None, None) is True           # no sample binds nothing
    assert metrics.slo_passes(pct, 0.0, 1.0, 0.5) is True             # equal to the bound passes
    assert metrics.slo_passes(pct, 1.0, 1.01, 0.5) is False
    assert metrics.slo_passes(pct, 1.0, 1.0, 0.51) is False
    # nearest rank at the extremes: p0 is the smallest sample, p > 100 the largest
    x = np.array([3.0, 1.0, 2.0])
    assert metrics.nearest_rank(x, 0) == 1.0 and metrics.nearest_rank(x, 150) == 3.0
    # 1 of 3 is 33.3%: p33.3 is rank 1 (0.999 -> 1), p34 rank 2 (1.02 -> 2)
    assert metrics.nearest_rank(x, 33.3) == 1.0 and metrics.nearest_rank(x, 34) == 2.0


def test_timeseries_bins_by_hand():
    # the two-request run in 0.25 s bins. Steps 0-0.1, 0.1-0.2, 0.2-0.3 (r0) and 1.0-1.1 (r1):
    #   bin 0 [0, 0.25): 0.25 s busy (1.0), 3 steps of batch 1, r0's 2 blocks
    #   bin 1 [0.25, 0.5): the last 0.05 s of r0's third step (0.2), no step starts there
    #   bins 2, 3 idle; bin 4 [1.0, 1.25): 0.1 s busy (0.4), 1 step, r1's 2 blocks
    sc, res = _run([(0.0, 20, 3), (1.0, 30, 1)], bin_s=0.25)
    ts = metrics.timeseries_frame([res])
    assert list(ts.t_s) == pytest.approx([0.0, 0.25, 0.5, 0.75, 1.0])
    assert list(ts.busy_fraction) == pytest.approx([1.0, 0.2, 0.0, 0.0, 0.4])
    assert list(ts.steps) == [3, 0, 0, 0, 1] and list(ts.batch_size) == pytest.approx([1, 0, 0, 0, 1])
    assert list(ts.kv_blocks_used_max) == [2, 0, 0, 0, 2] and set(ts.kv_blocks_total) == {100}
    assert set(ts.instance) == {"replica-0"} and set(ts.pool) == {"replica"} and set(ts.topology) == {"c"}
    assert ts.mfu.isna().all() and ts.mbu.isna().all()             # a constant cost model has no device
    # both at 0.0 on a batch-4 replica: steps of batch 2 (both prefills), 2 (decodes; r1 ends), 1 (r0 ends):
    # mean batch (2 + 2 + 1) / 3; 2 + 2 blocks at once
    topo = {"kind": "colocated", "max_running": 4, "kv_blocks": 100, "watermark": 0.0,
            "cost_model": {"kind": "constant", "step_s": 0.1}}
    sc, res = _run([(0.0, 20, 3), (0.0, 30, 2)], topo=topo, bin_s=0.25)
    ts = metrics.timeseries_frame([res])
    assert list(ts.batch_size) == pytest.approx([5 / 3, 0.0]) and list(ts.kv_blocks_used_max) == [4, 0]
    assert metrics.timeseries_frame([]).empty


class _FakeCost:
    """FLOPs of a step as a known sum of its arguments, so what prefix_summary prices is read off by hand."""
    def __init__(self, zero=False, scale=1.0):
        self.zero, self.scale = zero, scale

    def step(self, tokens, attn_work, kv_read_tokens, sampled, batch):
        f = 0.0 if self.zero else 1e6 * tokens + 1e3 * attn_work + 10 * kv_read_tokens + 7 * sampled + 3 * batch
        f *= self.scale
        return NS(time_s=0.0, flops=f, bytes=0.0)


def _stats(adm, look, gpu, host, hits=()):
    return NS(admissions=adm, lookup_tokens=look, gpu_hit_tokens=gpu, host_hit_tokens=host, evicted_blocks=2,
              host_evicted_blocks=1, host_load_bytes=4096, transfer_hit_tokens=16, hits=list(hits))


def test_prefix_summary_by_hand():
    cost = _FakeCost()
    off = NS(name="x-0", kv=NS(prefix_on=False, stats=_stats(1, 50, 0, 0, (50, 16))), cost=cost)   # not counted
    # a-0 logged one admission: 100 tokens, 40 found; b-0 one: 20 tokens, 16 found
    a = NS(name="a-0", kv=NS(prefix_on=True, stats=_stats(3, 400, 100, 50, (100, 40)), cached_blocks=5), cost=cost)
    b = NS(name="b-0", kv=NS(prefix_on=True, stats=_stats(1, 100, 20, 50, (20, 16)), cached_blocks=0),
           cost=_FakeCost(scale=2.0))            # another cost model (twice the FLOPs): b-0's hits priced on it
    idle = NS(name="d-0", kv=NS(prefix_on=True, stats=_stats(0, 0, 0, 0), cached_blocks=0), cost=cost)
    # the requests' own cached_tokens (the last admission's) are not what is priced
    reqs = [NS(cached_tokens=99, instance="a-0", prompt_tokens=100)]
    res = NS(topology=NS(instances=[off, a, b, idle]), requests=reqs)
    s = metrics.prefix_summary(res)
    # a-0: (100 + 50) / 400 hit, 100 / 400 on the GPU, 50 / 400 from host memory
    assert s["instances"]["a-0"] == {
        "admissions": 3, "lookup_tokens": 400, "gpu_hit_tokens": 100, "host_hit_tokens": 50,
        "hit_rate": 0.375, "gpu_hit_rate": 0.25, "host_hit_rate": 0.125, "evicted_blocks": 2,
        "host_evicted_blocks": 1, "host_load_bytes": 4096, "transfer_hit_tokens": 16, "cached_blocks_at_end": 5}
    assert set(s["instances"]) == {"a-0", "b-0", "d-0"}
    assert s["instances"]["b-0"]["hit_rate"] == 0.7                       # (20 + 50) / 100
    d = s["instances"]["d-0"]
    assert d["hit_rate"] is None and d["gpu_hit_rate"] is None and d["host_hit_rate"] is None   # 0 looked up
    # all: 500 looked up, 120 GPU hits, 100 host hits
    assert (s["hit_rate"], s["gpu_hit_rate"], s["host_hit_rate"]) == (0.44, 0.24, 0.2)
    assert s["prompt_tokens_looked_up"] == 500 and s["tokens_saved"] == 220
    # a-0's admission: the whole 100-token prompt, alone (attention work 100^2 / 2, reads 100, samples 1, batch 1)
    # 1e8 + 5e6 + 1000 + 7 + 3; its 60-token suffix over 40 cached: work 60 x (40 + 30) = 4200
    # 6e7 + 4.2e6 + 1000 + 7 + 3.  Saved: 105_001_010 - 64_201_010 = 40_800_000
    # b-0's: 20 tokens, 16 cached: 2e7 + 2e5 + 200 + 10 = 20_200_210 less its 4-token suffix
    # (work 4 x (16 + 2) = 72): 4e6 + 72_000 + 200 + 10 = 4_072_210 -> 16_128_000, twice on b-0's model:
    # 32_256_000; both: 73_056_000
    assert s["prefill_flops_saved"] == 73_056_000.0
    assert s["transfer_bytes_saved"] == 0.0                                 # a topology without links
    res.topology.transfer_bytes_saved = 123.0
    assert metrics.prefix_summary(res)["transfer_bytes_saved"] == 123.0
    # a cost model without FLOPs: nothing to report, not 0
    for inst in (a, b, idle):
        inst.cost = _FakeCost(zero=True)
    assert metrics.prefix_summary(res)["prefill_flops_saved"] is None
    # nothing looked up anywhere
    res = NS(topology=NS(instances=[off, idle]), requests=[])
    s = metrics.prefix_summary(res)
    assert s["hit_rate"] is None and s["gpu_hit_rate"] is None and s["host_hit_rate"] is None
    assert s["prefill_flops_saved"] == 0.0 and s["tokens_saved"] == 0


def test_mfu_adds_up_to_the_prefill_flops_by_the_design_formula():
    # one 1024-token prompt, one output token, on an H100 (989 dense bf16 TFLOP/s, datasheet). Per DESIGN.md
    # a prefill of P tokens costs, over L layers, 2 P x params (linear) + 4 n_h d x P^2 / 2 (attention),
    # plus the LM head 2 x hidden x vocab for the one sampled token (Llama-3.1-8B shapes below).
    # MFU in a bin = FLOPs in it / (bin x peak): summed back over the bins it gives the FLOPs.
    hid, nh, kvh, d, f, L, V, P = 4096, 32, 8, 128, 14336, 32, 128256, 1024
    params = hid * nh * d + 2 * hid * kvh * d + nh * d * hid + 3 * hid * f
    want = 2 * P * params * L + 2 * nh * d * L * P * P + 2 * hid * V
    sc, res = _run([(0.0, P, 1)], topo={"kind": "colocated", "device": "h100-sxm", "kv_blocks": 1000}, bin_s=0.01)
    ts = metrics.timeseries_frame([res])
    assert ts.mfu.sum() * 0.01 * 989e12 == pytest.approx(want, rel=1e-9)
    # no bin beats the GEMM efficiency ceiling of the profile (gemm_max 0.792)
    assert 0.0 < ts.mfu.max() <= 0.792
    # the summary's MFU is over the whole run: FLOPs / (run x peak)
    s = metrics.summarize([res], metrics.requests_frame([res], sc.client), sc)["c"]
    assert s["pools"]["replica"]["mfu"] * res.sim_end_s * 989e12 == pytest.approx(want, rel=1e-9)
    assert s["utilization"]["replica"]["mfu"] == s["pools"]["replica"]["mfu"]


def test_timeseries_skips_an_instance_that_never_ran_and_keeps_a_one_bin_one():
    # two replicas, replica-0 down from t = 0 for 100 s: the request runs on replica-1 (3 steps, 0-0.3 s),
    # all in one 1 s bin (busy 0.3); replica-0 has no bin at all and comes first in the topology
    topo = {"kind": "colocated", "replicas": 2, "kv_blocks": 100, "cost_model": {"kind": "constant", "step_s": 0.1}}
    sc, res = _run([(0.0, 20, 3)], topo=topo, bin_s=1.0,
                   faults={"instances": [{"at_s": 0.0, "instance": "replica-0", "down_s": 100}]})
    ts = metrics.timeseries_frame([res])
    assert list(ts.instance) == ["replica-1"] and list(ts.steps) == [3]
    assert list(ts.busy_fraction) == pytest.approx([0.3])


def test_mfu_of_an_fp8_run_is_over_the_fp8_peak_in_bins_and_in_the_summary():
    # fp8 weights compute in fp8: the same FLOPs (the formula above) over the datasheet's 1979 TFLOP/s
    hid, nh, kvh, d, f, L, V, P = 4096, 32, 8, 128, 14336, 32, 128256, 1024
    params = hid * nh * d + 2 * hid * kvh * d + nh * d * hid + 3 * hid * f
    want = 2 * P * params * L + 2 * nh * d * L * P * P + 2 * hid * V
    sc, res = _run([(0.0, P, 1)], topo={"kind": "colocated", "device": "h100-sxm", "kv_blocks": 1000}, bin_s=0.01,
                   weight_dtype="fp8")
    ts = metrics.timeseries_frame([res])
    assert ts.mfu.sum() * 0.01 * 1979e12 == pytest.approx(want, rel=1e-9)
    s = metrics.summarize([res], metrics.requests_frame([res], sc.client), sc)["c"]
    assert s["pools"]["replica"]["mfu"] * res.sim_end_s * 1979e12 == pytest.approx(want, rel=1e-9)


def test_busy_fraction_is_never_above_one():
    # a busy instance's bins are busy their whole width: 1.0, never more, though the step times spread over
    # the bins add up with float rounding to 1 + 2e-14 in some of them in this run
    topo = {"kind": "colocated", "device": "h100-sxm", "kv_blocks": 1000, "max_running": 64}
    sc, res = _run([(0.001 * i, 500, 50) for i in range(64)], topo=topo, bin_s=0.005)
    ts = metrics.timeseries_frame([res])
    assert ts.busy_fraction.max() == 1.0


def test_fault_summary_by_hand():
    # an outage of r-0 over [10, 20), a link fault over [61, 62); r-1 went down at 95 and is still down at 100
    log = [{"instance": "r-0", "at_s": 10.0, "until_s": 20.0}, {"link": "all", "at_s": 61.0, "until_s": 62.0}]
    topo = NS(fault_log=log, instances=[NS(name="r-0", down_s=10.0, down=False, failed=False, down_since=10.0),
                                        NS(name="r-1", down_s=0.0, down=True, failed=True, down_since=95.0),
                                        NS(name="r-2", down_s=0.0, down=False, failed=False, down_since=0.0),
                                        NS(name="r-3", down_s=2.0, down=True, failed=True, down_since=99.5)])
    # (arrival, TTFT, E2E, fault hits, tokens recomputed after a fault); the request at 5 was rejected
    rows = [(0, 1, 2, 0, 0), (1, 1, 2, 0, 0), (2, 1, 2, 0, 0), (3, 1, 2, 0, 0), (5, None, None, 0, 0),
            (10, 5, 6, 1, 0), (12, 5, 6, 1, 100), (15, 5, 9, 1, 50),                 # inside [10, 20)
            (20, 4, 5, 0, 0), (22, 4, 5, 0, 0), (23, 4, 5, 0, 0), (24, 4, 5, 0, 0),   # slow after it
            (30, 1, 2, 0, 0), (31, 1, 2, 0, 0), (32, 1, 2, 0, 0), (60, 1, 2, 0, 0)]
    d = pd.DataFrame({"arrival_s": [float(r[0]) for r in rows],
                      "ttft_s": [np.nan if r[1] is None else float(r[1]) for r in rows],
                      "e2e_s": [np.nan if r[2] is None else float(r[2]) for r in rows],
                      "tpot_s": np.nan, "fault_hits": [r[3] for r in rows],
                      "fault_recomputed_tokens": [r[4] for r in rows],
                      # all recompute: r0 and r1 were also preempted (30 and 7 tokens): not a fault's doing
                      "recomputed_tokens": [r[4] + (30, 7)[i] if i < 2 else r[4] for i, r in enumerate(rows)],
                      "status": ["rejected" if r[1] is None else "finished" for r in rows]})
    slo = config.SLOSpec(ttft_s=2.0, tpot_s=1.0)
    f = metrics.fault_summary(topo, d, slo, 100.0)
    assert f["events"] is log and f["requests_affected"] == 3 and f["recomputed_tokens"] == 150
    # arrivals in [10, 20) or [61, 62): 10, 12, 15 (20 is not: the window is half-open)
    assert f["requests_arriving_in_fault_windows"] == 3
    # E2E of the finished requests hit: (6 + 6 + 9) / 3 = 7; of the others: (8 x 2 + 4 x 5) / 12 = 3
    assert f["extra_e2e_s_affected"] == pytest.approx(4.0)
    # inside: none of 3 has TTFT <= 2; outside: 8 of 13 (the rejected one counts as a miss)
    assert f["slo_attainment_inside_fault_windows"] == 0.0
    assert f["slo_attainment_outside_fault_windows"] == pytest.approx(8 / 13)
    # recovery: baseline = median TTFT outside the windows = 1 (eight 1s, four 4s; NaN left out).
    # From 20: arrivals in [20, 50) have TTFTs 4,4,4,4,1,1,1: median 4 > 1.25. From 25 (a sixth of the 30 s
    # window later): [25, 55) holds 30, 31, 32, all 1: recovered 5 s after the end. The link window ends at
    # 62, after the last arrival (60): never measured
    assert f["recovery"] == [{"fault_start_s": 10.0, "fault_end_s": 20.0, "time_to_recover_s": 5.0},
                             {"fault_start_s": 61.0, "fault_end_s": 62.0, "time_to_recover_s": None}]
    # r-0: its 10 s; r-1: down since 95, counted to the end of the run (100); r-2 never down: not listed;
    # r-3: 2 s of an earlier outage plus the last half second
    assert f["instance_down_s"] == {"r-0": 10.0, "r-1": 5.0, "r-3": 2.5}
    # nothing outside any window: no baseline, no recovery, no outside attainment; nothing hit: no extra E2E
    d2 = d[(d.arrival_s >= 10) & (d.arrival_s < 20)].assign(fault_hits=0)
    f = metrics.fault_summary(topo, d2, slo, 100.0)
    assert f["slo_attainment_outside_fault_windows"] is None and f["recovery"][0]["time_to_recover_s"] is None
    assert f["extra_e2e_s_affected"] is None and f["slo_attainment_inside_fault_windows"] == 0.0
    # every finished request hit: nothing to compare with
    assert metrics.fault_summary(topo, d.assign(fault_hits=1), slo, 100.0)["extra_e2e_s_affected"] is None
    d3 = d[d.arrival_s < 5]
    f = metrics.fault_summary(topo, d3, slo, 100.0)
    assert f["slo_attainment_inside_fault_windows"] is None and f["slo_attainment_outside_fault_windows"] == 1.0


def test_timeseries_of_two_instances_is_one_frame_numbered_from_zero():
    # two replicas, one request each at 0 (3 steps of 0.1 s): one 1 s bin per instance, rows 0 and 1
    topo = {"kind": "colocated", "replicas": 2, "kv_blocks": 100, "cost_model": {"kind": "constant", "step_s": 0.1}}
    sc, res = _run([(0.0, 20, 3), (0.0, 20, 3)], topo=topo, bin_s=1.0)
    ts = metrics.timeseries_frame([res])
    assert list(ts.instance) == ["replica-0", "replica-1"] and list(ts.index) == [0, 1]
    assert list(ts.steps) == [3, 3]
    assert ts.loc[1, "instance"] == "replica-1"


def test_kv_capacity_with_an_engine_shows_its_sizing_by_hand():
    # SGLang sizes its KV pool as memory x mem_fraction_static - weights (- the CUDA-graph pool given here);
    # Llama-3.1-8B bf16 weights: 2 B x (32 layers x (2 x 4096^2 + 2 x 4096 x 1024 + 3 x 4096 x 14336)
    # + 2 x 128256 x 4096 (embeddings and LM head))
    gib = 1024 ** 3
    weights = 2 * (32 * (2 * 4096 * 4096 + 2 * 4096 * 1024 + 3 * 4096 * 14336) + 2 * 128256 * 4096)
    topo = {"kind": "colocated", "engine": "sglang", "device": "h100-sxm", "gpu_memory_utilization": 0.8,
            "cuda_graph_GiB": 1.0, "watermark": 0.0}
    sc, res = _run([(0.0, 20, 3)], topo=topo)
    p = metrics.summarize([res], metrics.requests_frame([res], sc.client), sc)["c"]["pools"]["replica"]
    k = p["kv_sizing_bytes"]
    assert k["kv_bytes"] == pytest.approx(80 * gib * 0.8 - weights - 1 * gib, rel=1e-12)
    assert k["weights_bytes"] == weights and k["memory_bytes"] == 80 * gib and p["engine"] == "sglang"
    # the pool: that many bytes in SGLang's 1-token pages of 128 KiB (BLOCK_BYTES / 16)
    assert p["kv_block_size"] == 1 and p["kv_blocks"] == int(k["kv_bytes"] // (BLOCK_BYTES // 16))
    assert p["kv_capacity_tokens"] == p["kv_blocks"]
    # kv_blocks given: no sizing shown
    topo["kv_blocks"] = 100
    sc, res = _run([(0.0, 20, 3)], topo=topo)
    assert "kv_sizing_bytes" not in metrics.summarize([res], metrics.requests_frame([res], sc.client), sc)["c"]["pools"]["replica"]


def _fault_frame(rows):
    """(arrival, TTFT) rows of finished requests, E2E = TTFT + 1, no fault hits."""
    return pd.DataFrame({"arrival_s": [float(a) for a, _ in rows], "ttft_s": [float(t) for _, t in rows],
                         "e2e_s": [t + 1.0 for _, t in rows], "tpot_s": np.nan, "fault_hits": 0,
                         "recomputed_tokens": 0, "fault_recomputed_tokens": 0, "status": "finished"})


def test_fault_recovery_scan_edges_by_hand():
    slo = config.SLOSpec(ttft_s=2.0, tpot_s=1.0)
    topo = NS(fault_log=[{"instance": "r-0", "at_s": 100.0, "until_s": 105.0}], instances=[])
    fast = [(k, 1) for k in range(20)]                        # the baseline: median TTFT 1, bound 1.25
    # slow arrivals every 5 s after the fault, one fast one at 135 = the last arrival. Scan from 105 in 5 s
    # steps: every 30 s window holds a majority of 9 s TTFTs until t = 130 ([130, 160): 9 and 1, median 5);
    # at t = 135 = the last arrival, [135, 165) holds only the fast one: recovered 30 s after the end
    d = _fault_frame(fast + [(105 + 5 * k, 9) for k in range(6)] + [(135, 1)])
    assert metrics.fault_summary(topo, d, slo, 200.0)["recovery"][0]["time_to_recover_s"] == 30.0
    # the window is half-open: at t = 105, [105, 135) holds 105 (9) and 110 (1): median 5, not yet; the fast
    # one at 135 belongs to t = 110's window: [110, 140) holds 1 and 1: recovered 5 s after the end
    d = _fault_frame(fast + [(105, 9), (110, 1), (135, 1)])
    assert metrics.fault_summary(topo, d, slo, 200.0)["recovery"][0]["time_to_recover_s"] == 5.0
    # recovered means a median TTFT within 1.25 x the baseline, the bound included: baseline 4 -> bound 5.
    # t = 105: [105, 135) holds 9 and 5, median 7 > 5; t = 110: 5 <= 5, recovered 5 s after the end
    d = _fault_frame([(k, 4) for k in range(20)] + [(105, 9), (110, 5)])
    assert metrics.fault_summary(topo, d, slo, 200.0)["recovery"][0]["time_to_recover_s"] == 5.0
    # every arrival inside some window: no baseline, no recovery (even though arrivals follow the first one)
    topo = NS(fault_log=[{"at_s": 10.0, "until_s": 20.0}, {"at_s": 30.0, "until_s": 40.0}], instances=[])
    f = metrics.fault_summary(topo, _fault_frame([(15, 1), (35, 1)]), slo, 50.0)
    assert [r["time_to_recover_s"] for r in f["recovery"]] == [None, None]


def test_a_run_that_ends_at_t0_paid_nothing(tmp_path):
    """Every request rejected on arrival at t = 0 (prompt + output beyond Llama-3.1-8B's 131,072-token context):
    no time elapsed, so 0 GPU-hours and $0 (not the 1 s a span fallback once charged: 2 GPUs x 1 s = 5.6e-4 h),
    rates 0, and a static topology's mean GPUs its GPUs."""
    from pdsim.simulation import simulate
    trace = tmp_path / "t0.csv"
    trace.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n"
                     "2023-11-16 18:15:46.6805900,200000,10\n2023-11-16 18:15:46.6805900,200000,10\n")
    sc = config.parse({"model": "llama-3.1-8b", "workload": {"arrival": "trace", "trace": {"path": str(trace)}},
                       "topologies": {"a": {"kind": "colocated", "replicas": 2, "device": "h100-sxm",
                                            "price_per_gpu_hour_usd": 2.5}}}, "t.yaml")
    res = simulate(sc)
    s = metrics.summarize(res, metrics.requests_frame(res, sc.client), sc)["a"]
    assert s["sim_end_s"] == 0 and s["requests"]["rejected"] == 2
    assert s["gpu_hours"] == 0.0 and s["cost_usd"] == 0.0 and s["pools"]["replica"]["gpu_hours"] == 0.0
    assert s["mean_gpus"] == 2 and s["throughput"]["requests_per_s"] == 0.0
    assert s["cost_per_million_output_tokens_usd"] is None
    # nothing elapsed: a static cluster's price per hour is still its GPUs' (2 x $2.50), not $0 over a 1 s span;
    # no token: 0 per GPU too. Both rejected for the context: "context: prompt+output = ... exceed ..."
    assert s["cost_per_hour_usd"] == 5.0 and s["throughput"]["output_tokens_per_s_per_gpu"] == 0.0
    assert s["rejected_by_reason"] == {"context": 2}


# --- written against the survivors of the summarize / requests_frame run (branch mutmet2) ----------------
PD = {"kind": "disaggregated",
      "prefill": {"instances": 1, "kv_blocks": 100, "cost_model": {"kind": "constant", "step_s": 0.1}},
      "decode": {"instances": 1, "kv_blocks": 100, "cost_model": {"kind": "constant", "step_s": 0.1}},
      "kv_link": {"bandwidth_GBps": 1, "latency_us": 0}}
KV_TOKEN_BYTES = BLOCK_BYTES // 16     # 131,072 B of KV per token (llama-3.1-8b bf16)


def test_disaggregated_summary_by_hand():
    # 1 prefill + 1 decode instance, every step 0.1 s, a 1 GB/s link without latency:
    #   r0 (0.0, 20 prompt, 3 output): prefill 0-0.1 (token 1 at 0.1); its 20 tokens' KV, 20 x 131,072 B =
    #      2,621,440 B, take x = 2.62144 ms on the wire; decode steps from 0.1 + x: token 2 at 0.2 + x (the first
    #      the client sees behind a PD proxy), token 3 at 0.3 + x = finish
    #   r1 (1.0, 20, 1): prefill 1.0-1.1, its only token; nothing decoded, nothing sent. End of run 1.1
    x = 20 * KV_TOKEN_BYTES / 1e9
    sc, res = _run([(0.0, 20, 3), (1.0, 20, 1)], topo=PD, name="pd")
    df = metrics.requests_frame([res], sc.client)
    assert list(df.first_token_s) == pytest.approx([0.2 + x, 1.1])
    assert list(df.ttft_s) == pytest.approx([0.2 + x, 0.1]) and list(df.ttft_prefill_end_s) == pytest.approx([0.1, 0.1])
    # the client streams 2 tokens of r0 after the first it sees: TPOT (0.3 + x - (0.2 + x)) / (2 - 1) = 0.1
    assert df.tpot_s[0] == pytest.approx(0.1) and math.isnan(df.tpot_s[1])
    assert list(df.e2e_s) == pytest.approx([0.3 + x, 0.1])
    assert list(df.kv_transfer_s) == pytest.approx([x, 0.0]) and list(df.kv_wait_s) == [0.0, 0.0]
    # decode queue: decode start (0.1 + x) - prefill end 0.1 - wait 0 - transfer x = 0; r1 never decoded: NaN
    assert df.decode_queue_s[0] == pytest.approx(0.0, abs=1e-12) and math.isnan(df.decode_queue_s[1])
    assert list(df.instance) == ["prefill-0", "prefill-0"] and list(df.decode_instance) == ["decode-0", ""]
    # ITL after the client's first token (index 1): one gap, 0.1
    assert (df.itl_mean_s[0], df.itl_p99_s[0], df.itl_max_s[0]) == pytest.approx((0.1, 0.1, 0.1))
    s = metrics.summarize([res], df, sc)["pd"]
    assert s["kind"] == "disaggregated" and s["gpus"] == 2
    # KV over both pools: 2 blocks at most on each instance (20 and 22 tokens); 100 + 100 blocks of capacity
    assert s["kv_cache"] == {"peak_bytes": 4 * BLOCK_BYTES, "capacity_bytes": 200 * BLOCK_BYTES}
    # KV transfer over the finished: {x, 0}: mean x / 2, linear percentiles x q
    assert (s["kv_transfer_s"]["mean"], s["kv_transfer_s"]["p90"], s["kv_transfer_s"]["p99"]) == \
        pytest.approx((x / 2, 0.9 * x, 0.99 * x))
    assert s["links"] == [{"name": "kv-link-prefill-0", "transfers": 1, "bytes": 20 * KV_TOKEN_BYTES,
                           "busy_fraction": pytest.approx(x / 1.1)}]
    # 3 + 1 output tokens in 1.1 s on 2 GPUs
    assert s["throughput"]["output_tokens_per_s_per_gpu"] == pytest.approx(4 / 1.1 / 2)
    # each pool: 1 instance busy 2 steps (0.2 s) of 1.1 s
    for pool in ("prefill", "decode"):
        p = s["pools"][pool]
        assert p["busy_fraction"] == pytest.approx(0.2 / 1.1)
        assert (p["dp_attention"], p["pp_layers"], p["micro_batches"]) == (False, None, None)
        assert p["device"] == "h100-sxm" and p["device_source"] == "n/a (constant/linear cost model)"
        assert p["mbu"] is None and p["weights_bytes_per_gpu"] is None
    # ITL over the measured finished requests: r0's one gap
    itl = s["itl_s"]
    assert (itl["mean"], itl["p50"], itl["p99"], itl["gaps"]) == pytest.approx((0.1, 0.1, 0.1, 1))
    assert len(itl["quantiles"]) == 201 and itl["quantiles"] == pytest.approx([0.1] * 201)
    assert s["slo"]["bounds"]["ttft"]["bound_s"] == 0.15
    assert s["expected_error"]["prefill"] == "unvalidated: a constant cost model (a what-if, not the roofline)"
    # server-side TTFT (ttft_at: prefill_end): the prefill's token is the first; r0 streams 3 tokens:
    # TPOT (0.3 + x - 0.1) / 2, ITL gaps 0.1 + x and 0.1
    sc, res = _run([(0.0, 20, 3), (1.0, 20, 1)], topo=PD, name="pd", client={"ttft_at": "prefill_end"})
    df = metrics.requests_frame([res], sc.client)
    assert list(df.ttft_s) == pytest.approx([0.1, 0.1]) and df.tpot_s[0] == pytest.approx((0.2 + x) / 2)
    assert df.itl_mean_s[0] == pytest.approx((0.2 + x) / 2) and df.itl_max_s[0] == pytest.approx(0.1 + x)
    itl = metrics.summarize([res], df, sc)["pd"]["itl_s"]
    assert itl["gaps"] == 2 and itl["mean"] == pytest.approx((0.2 + x) / 2)


def test_autoscaled_summary_by_hand():
    # one replica ($3.60 per GPU-hour = $0.001 per GPU-second), a second one decided at 1.0 (0.5 s provisioning
    # + 0.5 s loading, paid, serving at 2.0) and drained at 3.0. Steps 0.1 s:
    #   r0 at 0.0 (3 tokens) on replica-0: 0-0.3; r1, r2 at 2.5: one per replica, 2.5-2.8; r3 at 4.0 (1 token):
    #   4.0-4.1 = end of run
    topo = {"kind": "colocated", "replicas": 1, "kv_blocks": 100, "price_per_gpu_hour_usd": 3.6,
            "cost_model": {"kind": "constant", "step_s": 0.1},
            "autoscaler": {"policy": "schedule", "provisioning_s": 0.5, "load_s": 0.5,
                           "schedule": [{"at_s": 1.0, "replicas": 2}, {"at_s": 3.0, "replicas": 1}]}}
    sc, res = _run([(0.0, 20, 3), (2.5, 20, 3), (2.5, 20, 3), (4.0, 20, 1)], topo=topo, name="a")
    s = metrics.summarize([res], metrics.requests_frame([res], sc.client), sc)["a"]
    assert res.sim_end_s == pytest.approx(4.1) and [r.instance for r in res.requests] == \
        ["replica-0", "replica-0", "replica-1", "replica-0"]
    # paid: replica-0 4.1 s + replica-1 1.0-3.0 = 6.1 GPU-s: $0.0061; the peak is 2 GPUs, the mean 6.1 / 4.1
    assert s["gpus"] == 2 and s["gpu_hours"] == pytest.approx(6.1 / 3600) and s["cost_usd"] == pytest.approx(0.0061)
    assert s["mean_gpus"] == pytest.approx(6.1 / 4.1)
    # an autoscaled cluster's price per hour is its mean over the run: $0.0061 / (4.1 / 3600) h
    assert s["cost_per_hour_usd"] == pytest.approx(0.0061 * 3600 / 4.1)
    # 3 + 3 + 3 + 1 = 10 output tokens: $610 per million; per GPU alive on average: 10 / 4.1 / (6.1 / 4.1)
    assert s["cost_per_million_output_tokens_usd"] == pytest.approx(610.0)
    assert s["throughput"]["output_tokens_per_s_per_gpu"] == pytest.approx(10 / 6.1)
    # busy 0.3 + 0.3 + 0.1 (replica-0) + 0.3 (replica-1) = 1.0 s over the 6.1 instance-seconds paid
    assert s["pools"]["replica"]["busy_fraction"] == pytest.approx(1.0 / 6.1)
    assert s["pools"]["replica"]["instances"] == 2
    a = s["autoscaling"]["pools"]["replicas"]
    assert a["gpu_hours"] == pytest.approx(6.1 / 3600) and a["cost_usd"] == pytest.approx(0.0061)
    assert (a["scale_outs"], a["scale_ins"], a["peak_instances"]) == (1, 1, 2)


def _req(i, arrival, prompt, output, status="finished", **kw):
    r = Request(i, arrival, prompt, output)
    r.status = status
    for k, v in kw.items():
        setattr(r, k, v)
    return r


def _pd_requests():
    """Five hand-made records of a disaggregated run (client default: first token = the decode side's)."""
    return [
        # prefill 1.2-1.5, held 0.1 s, 0.2 s on the wire, KV on decode at 1.9, its first decode step 1.95-2.0,
        # tokens 1.5 | 2.0, 2.2, 2.6
        _req(0, 1.0, 100, 4, first_token_s=1.5, finish_s=2.6, prefill_start_s=1.2, prefill_end_s=1.5,
             decode_start_s=1.9, kv_wait_s=0.1, kv_transfer_s=0.2, decode_first_s=2.0, decode_step_s=1.95,
             token_s=[1.5, 2.0, 2.2, 2.6], preemptions=1, recomputed_tokens=10, fault_hits=2,
             instance="p-0", decode_instance="d-0"),
        # a one-token reply: done at the prefill's end, nothing decoded
        _req(1, 2.0, 50, 1, first_token_s=2.3, finish_s=2.3, prefill_start_s=2.1, prefill_end_s=2.3,
             token_s=[2.3], instance="p-0"),
        # rejected on arrival
        _req(2, 3.0, 9000, 5, status="rejected", reject_reason="kv: prompt beyond the pool", token_s=[]),
        # two tokens: the client sees the second as its first, so it streams only one: no TPOT, no ITL
        _req(3, 3.0, 10, 2, first_token_s=3.2, finish_s=3.5, prefill_start_s=3.0, prefill_end_s=3.2,
             decode_start_s=3.3, decode_first_s=3.5, token_s=[3.2, 3.5], instance="p-0", decode_instance="d-0",
             decode_step_s=3.4),
        # abandoned after its prefill (client gave up): a TTFT, no E2E, no TPOT
        _req(4, 4.0, 30, 8, status="abandoned", first_token_s=4.4, prefill_start_s=4.1, prefill_end_s=4.4,
             decode_start_s=4.6, decode_first_s=4.7, token_s=[4.4, 4.7, 4.9], instance="p-0", decode_instance="d-0",
             decode_step_s=4.6),
    ]


def test_requests_frame_of_hand_made_records(monkeypatch):
    # FRAME_CHUNK = 2: the five records are read in chunks [0, 2), [2, 4), [4, 5); each column is per request
    monkeypatch.setattr(metrics, "FRAME_CHUNK", 2)
    res = NS(name="pd", topology=NS(kind="disaggregated"), requests=_pd_requests())
    df = metrics.requests_frame([res], config.ClientSpec(network_rtt_s=0.01))
    nan = float("nan")
    assert list(df.columns) == metrics.REQUEST_COLUMNS and list(df.index) == [0, 1, 2, 3, 4]
    assert list(df.topology) == ["pd"] * 5 and list(df.request_id) == [0, 1, 2, 3, 4]
    assert list(df.status) == ["finished", "finished", "rejected", "finished", "abandoned"]
    assert list(df.prompt_tokens) == [100, 50, 9000, 10, 30] and list(df.output_tokens) == [4, 1, 5, 2, 8]
    assert list(df.arrival_s) == [1.0, 2.0, 3.0, 3.0, 4.0]
    # the client's first token: decode side where it decoded (2.0, 3.5, 4.7), else the prefill's (2.3)
    assert df.first_token_s.tolist() == pytest.approx([2.0, 2.3, nan, 3.5, 4.7], nan_ok=True)
    assert df.finish_s.tolist() == pytest.approx([2.6, 2.3, nan, 3.5, nan], nan_ok=True)
    # TTFT = first seen - arrival + RTT 0.01: 1.01, 0.31, -, 0.51, 0.71; server side (prefill end) without RTT
    assert df.ttft_s.tolist() == pytest.approx([1.01, 0.31, nan, 0.51, 0.71], nan_ok=True)
    assert df.ttft_prefill_end_s.tolist() == pytest.approx([0.5, 0.3, nan, 0.2, 0.4], nan_ok=True)
    # TPOT: r0 streams 4 - 1 = 3 tokens: (2.6 - 2.0) / 2 = 0.3; r1 one token, r3 one streamed, r4 unfinished
    assert df.tpot_s.tolist() == pytest.approx([0.3, nan, nan, nan, nan], nan_ok=True)
    # E2E (finished only) = finish - arrival + RTT
    assert df.e2e_s.tolist() == pytest.approx([1.61, 0.31, nan, 0.51, nan], nan_ok=True)
    assert df.queue_s.tolist() == pytest.approx([0.2, 0.1, nan, 0.0, 0.1], nan_ok=True)
    assert df.prefill_s.tolist() == pytest.approx([0.3, 0.2, nan, 0.2, 0.3], nan_ok=True)
    assert df.kv_wait_s.tolist() == [0.1, 0.0, 0.0, 0.0, 0.0] and df.kv_transfer_s.tolist() == [0.2, 0, 0, 0, 0]
    # decode queue = its first decode step's start - its KV's arrival: 1.95 - 1.9, 3.4 - 3.3, 4.6 - 4.6
    assert df.decode_queue_s.tolist() == pytest.approx([0.05, nan, nan, 0.1, 0.0], nan_ok=True)
    assert df.preemptions.tolist() == [1, 0, 0, 0, 0] and df.recomputed_tokens.tolist() == [10, 0, 0, 0, 0]
    assert df.fault_hits.tolist() == [2, 0, 0, 0, 0]
    assert df.instance.tolist() == ["p-0", "p-0", "", "p-0", "p-0"]
    assert df.decode_instance.tolist() == ["d-0", "", "", "d-0", "d-0"]
    assert df.reject_reason.tolist() == ["", "", "kv: prompt beyond the pool", "", ""]
    # ITL after the first seen token: r0 gaps 0.2, 0.4 (mean 0.3, p99 0.2 + 0.99 x 0.2, max 0.4);
    # r4 one gap 0.2 (unfinished requests keep their columns); r1, r2, r3 none
    assert df.itl_mean_s.tolist() == pytest.approx([0.3, nan, nan, nan, 0.2], nan_ok=True)
    assert df.itl_p99_s.tolist() == pytest.approx([0.398, nan, nan, nan, 0.2], nan_ok=True)
    assert df.itl_max_s.tolist() == pytest.approx([0.4, nan, nan, nan, 0.2], nan_ok=True)
    assert df.warmup.tolist() == [False] * 5 and df.warmup.dtype == bool
    # numeric columns keep their types (requests.csv writes ints as ints)
    assert df.request_id.dtype == np.int64 and df.preemptions.dtype == np.int64 and df.arrival_s.dtype == np.float64
    # warm-up: the first 2 to finish are r1 (2.3) and r0 (2.6)
    df = metrics.requests_frame([res], config.ClientSpec(warmup_requests=2))
    assert df.warmup.tolist() == [True, True, False, False, False]
    # two topologies: one frame, numbered on; release=True empties each topology's list of objects
    res2 = NS(name="co", topology=NS(kind="colocated"), requests=_pd_requests()[:2])
    assert metrics.releasable([NS(requests=[], topology=NS(pools=[]))])
    df = metrics.requests_frame([res, res2], release=True)
    assert list(df.index) == list(range(7)) and df.topology.tolist() == ["pd"] * 5 + ["co"] * 2
    assert res.requests == [] and res2.requests == []
    # colocated: the first token is the prefill's (1.5 for r0), TPOT (2.6 - 1.5) / 3, ITL gaps 0.5, 0.2, 0.4
    assert df.ttft_s[5] == pytest.approx(0.5) and df.tpot_s[5] == pytest.approx(1.1 / 3)
    assert df.itl_mean_s[5] == pytest.approx(1.1 / 3) and df.itl_max_s[5] == pytest.approx(0.5)
    assert df.request_id.tolist() == [0, 1, 2, 3, 4, 0, 1]
    # nothing at all: an empty frame with the columns
    assert list(metrics.requests_frame([]).columns) == metrics.REQUEST_COLUMNS


def test_itl_summary_of_hand_made_records():
    # the measured finished requests are r0 and r3 (d's rows); gaps after the client's first token (the decode
    # side's): r0 0.2, 0.4; r3 none (one streamed token); r4 unfinished and r1 not in d: left out
    rs = _pd_requests()
    res = NS(requests=rs, topology=NS(kind="disaggregated"))
    d = pd.DataFrame({"request_id": [0, 3, 4], "status": ["finished", "finished", "abandoned"]})
    s = metrics.itl_summary(res, d, config.ClientSpec())
    assert s["gaps"] == 2 and (s["mean"], s["p50"], s["p90"], s["p99"]) == pytest.approx((0.3, 0.3, 0.38, 0.398))
    assert s["quantiles"][0] == pytest.approx(0.2) and s["quantiles"][-1] == pytest.approx(0.4)
    assert s["quantiles"][100] == pytest.approx(0.3) and len(s["quantiles"]) == 201
    # server-side first token: r0's gaps 0.5, 0.2, 0.4 and r3's 0.3
    s = metrics.itl_summary(res, d, config.ClientSpec(ttft_at="prefill_end"))
    assert s["gaps"] == 4 and s["mean"] == pytest.approx(1.4 / 4)
    # colocated: also from the first token
    s = metrics.itl_summary(NS(requests=rs, topology=NS(kind="colocated")), d, config.ClientSpec())
    assert s["gaps"] == 4 and s["mean"] == pytest.approx(1.4 / 4)
    # only r3 measured: no gap at all -> None (not a summary of an empty or made-up sample)
    d3 = d[d.request_id == 3]
    assert metrics.itl_summary(res, d3, config.ClientSpec()) is None
    assert metrics.itl_gaps(rs, np.ones(5, np.int64), np.array([False, True, True, True, False])).size == 0
    # token times not recorded: None
    res0 = NS(requests=[_req(0, 0.0, 10, 3, first_token_s=0.1, finish_s=0.3)], topology=NS(kind="colocated"))
    assert metrics.itl_summary(res0, d, config.ClientSpec()) is None
    assert metrics.itl_summary(NS(requests=[], topology=NS(kind="colocated")), d, config.ClientSpec()) is None


def test_warmup_ties_by_order_beyond_a_small_sort():
    # 20 finished requests, finish times 0.2, 0.1, 0.2, 0.1, ... (ten of each): the 5 warm-up requests are the
    # first five to finish at 0.1 in request order: indices 1, 3, 5, 7, 9 (an unstable sort of 20 picks others)
    finish = np.array([0.2, 0.1] * 10)
    status = np.array(["finished"] * 20, dtype=object)
    m = metrics.warmup_mask(finish, status, 5)
    assert m.dtype == bool and np.nonzero(m)[0].tolist() == [1, 3, 5, 7, 9]


def test_p99_of_more_than_101_gaps_and_numpys_rounding_by_hand():
    # 201 tokens, gap k = k for k = 1..200: p99 at index 199 x 0.99 = 197.01 of the sorted gaps: between the
    # 198th and 199th gap (198 and 199): 198 + 0.01 x 1 = 198.01 (the next gap, 200, is not the neighbour)
    t = np.concatenate([[0.0], np.cumsum(np.arange(1.0, 201.0))]).tolist()
    _, p99, mx = metrics.itl_columns([_tok(t)], np.zeros(1, np.int64))
    assert p99[0] == pytest.approx(198.01, rel=1e-9) and mx[0] == 200.0
    # numpy's linear rule interpolates down from the upper neighbour when the fraction is >= 0.5:
    # gaps 0.3 and 1.2 (tokens 0, 0.3, 1.5): 1.2 - 0.9 x (1 - 0.99) = 1.191 exactly as a float, where
    # 0.3 + 0.9 x 0.99 rounds to 1.1909999999999998 (the column is bit-for-bit np.percentile's)
    _, p99, _ = metrics.itl_columns([_tok([0.0, 0.3, 1.5])], np.zeros(1, np.int64))
    assert p99[0] == 1.191


def test_a_topology_without_requests_gives_an_empty_frame_and_a_summary():
    res = NS(name="e", topology=NS(kind="colocated"), requests=[])
    df = metrics.requests_frame([res])
    assert len(df) == 0 and list(df.columns) == metrics.REQUEST_COLUMNS
    assert metrics.requests_frame([res], release=True).empty


def test_summary_of_faults_and_of_two_replicas_by_hand():
    # two replicas (0.1 s steps), replica-0 down from t = 0 for 100 s: the request (arrival 0, 20 prompt,
    # 3 output) is routed to replica-0 at 0, lost there (1 fault hit) and served on replica-1, 0-0.3 s
    topo = {"kind": "colocated", "replicas": 2, "kv_blocks": 100, "cost_model": {"kind": "constant", "step_s": 0.1}}
    sc, res = _run([(0.0, 20, 3)], topo=topo, faults={"instances": [{"at_s": 0.0, "instance": "replica-0",
                                                                      "down_s": 100}]})
    s = metrics.summarize([res], metrics.requests_frame([res], sc.client), sc)["c"]
    f = s["faults"]
    assert f["requests_affected"] == 1 and f["requests_arriving_in_fault_windows"] == 1
    # TPOT 0.1 > 0.05: the one request, inside the window [0, 100), misses; none outside
    assert f["slo_attainment_inside_fault_windows"] == 0.0 and f["slo_attainment_outside_fault_windows"] is None
    assert f["recovery"] == [{"fault_start_s": 0, "fault_end_s": 100.0, "time_to_recover_s": None}]
    # still down when the run ends at 0.3: counted to the end
    assert f["instance_down_s"] == {"replica-0": pytest.approx(0.3)}
    assert [e["instance"] for e in f["events"]] == ["replica-0"]
    # busy 3 steps (0.3 s) over 2 instances x 0.3 s paid
    assert s["pools"]["replica"]["busy_fraction"] == pytest.approx(0.5)
    assert s["gpus"] == 2 and s["throughput"]["output_tokens_per_s_per_gpu"] == pytest.approx(3 / 0.3 / 2)


def test_two_topologies_in_one_frame_are_summarised_apart():
    # "x": the two-request run of test_summary_of_two_requests_by_hand; "y": one request (0.0, 20, 5) alone,
    # 5 steps: E2E 0.5 s, run 0.5 s
    sc, rx = _run([(0.0, 20, 3), (1.0, 30, 1)], name="x")
    _, ry = _run([(0.0, 20, 5)], name="y")
    df = metrics.requests_frame([rx, ry], sc.client)
    s = metrics.summarize([rx, ry], df, sc)
    assert s["x"]["requests"]["total"] == 2 and s["y"]["requests"]["total"] == 1
    assert s["x"]["e2e_s"]["mean"] == pytest.approx(0.2) and s["y"]["e2e_s"]["mean"] == pytest.approx(0.5)
    assert s["y"]["throughput"]["output_tokens_per_s"] == pytest.approx(5 / 0.5)


def test_request_counts_partition_the_statuses():
    # the two-request run's frame with r1 marked abandoned, then unfinished: every arrived request is
    # counted once, in its own status
    sc, res = _run([(0.0, 20, 3), (1.0, 30, 1)])
    for status in ("abandoned", "unfinished"):
        df = metrics.requests_frame([res], sc.client)
        df.loc[1, "status"] = status
        c = metrics.summarize([res], df, sc)["c"]["requests"]
        assert c == {"total": 2, "finished": 1, "rejected": 0, "abandoned": 0, "unfinished": 0, status: 1}


def test_pipeline_pool_summary_by_hand():
    # pp 2 of Llama-3.1-8B's 32 layers: 16 + 16, micro-batches default to pp, 2 GPUs
    topo = {"kind": "colocated", "pp": 2, "kv_blocks": 100, "cost_model": {"kind": "constant", "step_s": 0.1}}
    sc, res = _run([(0.0, 20, 3)], topo=topo)
    p = metrics.summarize([res], metrics.requests_frame([res], sc.client), sc)["c"]["pools"]["replica"]
    assert (p["pp"], p["micro_batches"], p["pp_layers"], p["gpus"]) == (2, 2, [16, 16], 2)
    topo["micro_batches"] = 4
    sc, res = _run([(0.0, 20, 3)], topo=topo)
    p = metrics.summarize([res], metrics.requests_frame([res], sc.client), sc)["c"]["pools"]["replica"]
    assert p["micro_batches"] == 4


def test_roofline_pool_summary_by_hand():
    # one 1024-token prompt, one output token on an H100 (datasheet: 3350 GB/s)
    hid, nh, kvh, d, f, L, V = 4096, 32, 8, 128, 14336, 32, 128256
    # Llama-3.1-8B bf16 weights: 2 B x (32 x (q, o: 2 x 4096^2; k, v: 2 x 4096 x 1024; MLP 3 x 4096 x 14336)
    # + embeddings and LM head 2 x 128256 x 4096)
    weights = 2 * (L * (2 * hid * nh * d + 2 * hid * kvh * d + 3 * hid * f) + 2 * V * hid)
    sc, res = _run([(0.0, 1024, 1)], topo={"kind": "colocated", "device": "h100-sxm", "kv_blocks": 1000},
                   bin_s=0.01)
    p = metrics.summarize([res], metrics.requests_frame([res], sc.client), sc)["c"]["pools"]["replica"]
    assert p["weights_bytes_per_gpu"] == weights
    assert p["device_source"].startswith("datasheet: NVIDIA H100 SXM5")
    # MBU: the bytes the instance moved over (run x 3350 GB/s); a prefill reads at least every weight once
    inst = res.topology.pools[0].instances[0]
    assert p["mbu"] == pytest.approx(inst.bytes / (res.sim_end_s * 3350e9), rel=1e-12)
    assert weights / (res.sim_end_s * 3350e9) <= p["mbu"] <= 1.0
    # per 10 ms bin: MBU = the bin's bytes / (10 ms x 3350 GB/s); summed back over the bins, the instance's bytes
    ts = metrics.timeseries_frame([res])
    assert ts.mbu.sum() * 0.01 * 3350e9 == pytest.approx(inst.bytes, rel=1e-9) and 0.0 < ts.mbu.max() <= 1.0
    # energy (the H100 preset: 70 W idle, 700 W max per GPU): between idle and max power over the run; the one
    # request and the one output token each cost all of it
    e = metrics.summarize([res], metrics.requests_frame([res], sc.client), sc)["c"]["energy"]
    assert 70.0 * res.sim_end_s <= e["energy_J"] <= 700.0 * res.sim_end_s
    assert e["J_per_request"] == e["energy_J"] and e["J_per_output_token"] == e["energy_J"]


def test_speculative_summary_by_hand():
    # k = 3 drafts, every one accepted, 13 output tokens: the prefill's token, then 3 verify steps of 4 tokens
    # (1 + 3 accepted each): 9 drafted, 9 accepted, 4 tokens per verify step
    spec = {"k": 3, "acceptance": 1.0, "draft_cost_fraction": 0.5}
    topo = {"kind": "colocated", "kv_blocks": 100, "cost_model": {"kind": "constant", "step_s": 0.01},
            "speculative": spec}
    sc, res = _run([(0.0, 100, 13)], topo=topo)
    s = metrics.summarize([res], metrics.requests_frame([res], sc.client), sc)["c"]
    sp = s["speculative"]["replica"]
    assert (sp["verify_request_steps"], sp["drafted_tokens"], sp["accepted_tokens"]) == (3, 9, 9)
    assert sp["tokens_per_verify_step"] == 4.0 and sp["draft_acceptance_rate"] == 1.0
    assert set(s["speculative"]) == {"replica"}
    # a pool without speculation reports none
    sc, res = _run([(0.0, 20, 3)])
    assert "speculative" not in metrics.summarize([res], metrics.requests_frame([res], sc.client), sc)["c"]


def test_autoscaled_peak_gpus_are_the_most_alive_at_once_by_hand():
    # PD, 1 + 1 instances; a second prefill instance paid 1.0-3.0, a second decode instance paid 4.0-6.0
    # (each decided 0.5 s provisioning + 0.5 s loading before it serves). Requests at 0.0 and 7.0; end 7.1
    topo = {**PD, "autoscaler": {"policy": "schedule", "provisioning_s": 0.5, "load_s": 0.5,
                                 "schedule": [{"at_s": 1.0, "prefill": 2, "decode": 1},
                                              {"at_s": 3.0, "prefill": 1, "decode": 1},
                                              {"at_s": 4.0, "prefill": 1, "decode": 2},
                                              {"at_s": 6.0, "prefill": 1, "decode": 1}]}}
    sc, res = _run([(0.0, 20, 3), (7.0, 20, 1)], topo=topo, name="pd")
    s = metrics.summarize([res], metrics.requests_frame([res], sc.client), sc)["pd"]
    # each pool peaks at 2 GPUs, but never together: at most 2 + 1 GPUs were alive at once (not 2 + 2)
    assert s["gpus"] == 3 and [p["gpus"] for p in s["pools"].values()] == [2, 2]
    # paid: 7.1 + 7.1 + 2 + 2 = 18.2 GPU-seconds; the mean over the run 18.2 / 7.1
    assert s["gpu_hours"] == pytest.approx(18.2 / 3600) and s["mean_gpus"] == pytest.approx(18.2 / 7.1)


def _slo_frame():
    """r0 exactly at both bounds (TTFT 1.0, TPOT 0.5); r1 a one-token reply (no TPOT); r2 TTFT 2.0 too late;
    r3 rejected (5 tokens asked); r4 two tokens asked, TPOT 0.2."""
    return pd.DataFrame({"status": ["finished", "finished", "finished", "rejected", "finished"],
                         "ttft_s": [1.0, 0.5, 2.0, np.nan, 0.25], "tpot_s": [0.5, np.nan, 0.2, np.nan, 0.2],
                         "output_tokens": [4, 1, 3, 5, 2]})


def test_slo_verdict_attainment_mode_by_hand():
    df = _slo_frame()
    slo = config.SLOSpec(ttft_s=1.0, tpot_s=0.5, attainment_target=0.6, ttft_percentile=25, tpot_percentile=50)
    # within TTFT (<= 1.0, finished): r0 (at the bound), r1, r4: 3 of 5; within TPOT (none or <= 0.5): r0
    # (at the bound), r1, r2, r4: 4 of 5; both: r0, r1, r4: 3 of 5 = 0.6 = the target
    assert metrics.slo_attainment(df, slo) == pytest.approx(0.6)
    # samples: TTFT of every arrival, the rejected one +inf; TPOT of those asking > 1 token (r0, r2, r3, r4),
    # the unfinished one +inf
    ttft, tpot = metrics.slo_samples(df)
    assert ttft.tolist() == [1.0, 0.5, 2.0, math.inf, 0.25] and tpot.tolist() == [0.5, 0.2, math.inf, 0.2]
    v = metrics.slo_verdict(df, slo)
    # TTFT p25 by nearest rank: ceil(0.25 x 5) = rank 2 of 0.25, 0.5, 1, 2, inf = 0.5, margin 0.5
    # TPOT p50: rank 2 of 0.2, 0.2, 0.5, inf = 0.2, margin 0.3
    assert v["bounds"]["ttft"] == {"bound_s": 1.0, "percentile": 25, "measured_s": 0.5, "unserved": False,
                                   "margin_s": 0.5, "met": True, "share_within": 0.6}
    assert v["bounds"]["tpot"] == {"bound_s": 0.5, "percentile": 50, "measured_s": 0.2, "unserved": False,
                                   "margin_s": pytest.approx(0.3), "met": True, "share_within": 0.8}
    # attainment mode: 0.6 >= 0.6 met, margin 0; TTFT binds (fewer within), though its headroom (0.5 / 1.0)
    # is larger than TPOT's (0.3 / 0.5)
    assert (v["mode"], v["met"], v["binding"], v["margin"], v["margin_unit"]) == \
        ("attainment", True, "ttft", pytest.approx(0.0), "fraction")
    assert v["attainment"] == pytest.approx(0.6) and v["attainment_target"] == 0.6
    # a measured percentile equal to its bound meets it: TPOT p75 = rank 3 of 4 = 0.5
    v = metrics.slo_verdict(df, config.SLOSpec(ttft_s=1.0, tpot_s=0.5, attainment_target=0.6, ttft_percentile=25,
                                               tpot_percentile=75))
    assert v["bounds"]["tpot"]["measured_s"] == 0.5 and v["bounds"]["tpot"]["met"] is True
    # TPOT's headroom is now 0 (< TTFT's 0.5), yet TTFT still binds: 3 of 5 within it against 4 of 5
    assert v["binding"] == "ttft"
    # an SLO object without a mode (duck-typed) is judged in attainment mode
    duck = NS(ttft_s=1.0, tpot_s=0.5, attainment_target=0.6, ttft_percentile=25, tpot_percentile=50)
    assert metrics.slo_verdict(df, duck)["mode"] == "attainment" and metrics.slo_passes(duck, 0.6, 9.0, 9.0)


def test_slo_verdict_percentile_mode_by_hand():
    df = _slo_frame()
    # TTFT p25 = 0.5 (margin 0.5, headroom 0.5 / 1.0 = 0.5); TPOT bound 0.25, p50 = 0.2: margin 0.05,
    # headroom 0.05 / 0.25 = 0.2 -> TPOT binds (by margin x bound it would be TTFT: 0.5 vs 0.0125)
    v = metrics.slo_verdict(df, config.SLOSpec(mode="percentile", ttft_s=1.0, tpot_s=0.25, ttft_percentile=25,
                                               tpot_percentile=50))
    assert (v["met"], v["binding"], v["margin_unit"]) == (True, "tpot", "s") and v["margin"] == pytest.approx(0.05)
    # TTFT bound 0.6: margin 0.1, headroom 0.1 / 0.6 = 0.167 < TPOT's 0.2 with bound 0.25: TTFT binds
    v = metrics.slo_verdict(df, config.SLOSpec(mode="percentile", ttft_s=0.6, tpot_s=0.25, ttft_percentile=25,
                                               tpot_percentile=50))
    assert v["binding"] == "ttft" and v["margin"] == pytest.approx(0.1)
    # TPOT p90: rank ceil(3.6) = 4 of 4 = +inf (the rejected request): unserved, shown as None, fails the SLO
    # and binds whatever the TTFT margin
    v = metrics.slo_verdict(df, config.SLOSpec(mode="percentile", ttft_s=1.0, tpot_s=0.5, ttft_percentile=25,
                                               tpot_percentile=90))
    t = v["bounds"]["tpot"]
    assert (t["measured_s"], t["unserved"], t["margin_s"], t["met"]) == (None, True, None, False)
    assert (v["met"], v["binding"], v["margin"]) == (False, "tpot", None)
    # TTFT p90: rank ceil(4.5) = 5 of 5 = +inf (the rejected request): unserved fails the SLO too
    v = metrics.slo_verdict(df, config.SLOSpec(mode="percentile", ttft_s=1.0, tpot_s=0.5, ttft_percentile=90,
                                               tpot_percentile=50))
    assert v["bounds"]["ttft"]["unserved"] is True and (v["met"], v["binding"]) == (False, "ttft")
    # nothing arrived: no attainment, no margin, no share; nothing to measure meets its bound
    empty = df.iloc[:0]
    v = metrics.slo_verdict(empty, config.SLOSpec(ttft_s=1.0, tpot_s=0.5))
    assert (v["attainment"], v["margin"], v["met"]) == (None, None, False)
    assert v["bounds"]["ttft"]["share_within"] is None and v["bounds"]["ttft"]["met"] is True
    assert metrics._stats(empty.ttft_s) == {"mean": None, "p50": None, "p90": None, "p99": None}


def test_releasable_and_expected_error_by_hand():
    plain = NS(requests=[_req(0, 0.0, 10, 2)], topology=NS(pools=[NS(spec=NS(prefix_on=False))]))
    timed = NS(requests=[_req(0, 0.0, 10, 2, token_s=[0.1, 0.2])], topology=plain.topology)
    prefix = NS(requests=[_req(0, 0.0, 10, 2)], topology=NS(pools=[NS(spec=NS(prefix_on=True))]))
    assert metrics.releasable([plain]) is True
    assert metrics.releasable([plain, timed]) is False and metrics.releasable([prefix]) is False
    # the stored bands (pdsim/data/validation_error.json) by engine|device; an overhead set on an engine
    # preset is not what its band was measured with
    import json
    from pathlib import Path
    bands = json.loads((Path(metrics.__file__).parent / "data" / "validation_error.json").read_text())["bands"]
    table = json.loads((Path(metrics.__file__).parent / "data" / "validation_error.json").read_text())
    roof, dense, moe = NS(kind="roofline"), NS(is_moe=False), NS(is_moe=True)
    topo = NS(pools=[NS(name="a", model=dense, spec=NS(engine="sglang", step_overhead=0.001, device="h100-sxm", tp=1,
                                                       cost_model=roof)),
                     NS(name="b", model=dense, spec=NS(engine="sglang", step_overhead=None, device="h100-sxm", tp=2,
                                                       cost_model=roof)),
                     NS(name="c", model=dense, spec=NS(engine=None, device="h100-sxm", tp=1, cost_model=roof)),
                     NS(name="d", model=dense, spec=NS(engine=None, step_overhead=0.001, device="a100-80gb-sxm",
                                                       tp=1, cost_model=roof)),
                     NS(name="e", model=moe, spec=NS(engine="sglang", step_overhead=None, device="h200", tp=8,
                                                     cost_model=roof)),
                     NS(name="f", model=moe, spec=NS(engine="vllm-v1", step_overhead=None, device="h100-sxm", tp=8,
                                                     cost_model=roof)),
                     NS(name="g", model=dense, spec=NS(engine="sglang", step_overhead=None, device="h100-sxm", tp=1,
                                                       cost_model=NS(kind="linear"))),
                     # a band measured without speculation or a power cap says nothing of pools with them
                     NS(name="h", model=dense, spec=NS(engine="sglang", step_overhead=None, device="h100-sxm", tp=1,
                                                       cost_model=roof, speculative=NS(method="draft_model"))),
                     NS(name="i", model=dense, spec=NS(engine="sglang", step_overhead=None, device="h100-sxm", tp=1,
                                                       cost_model=roof, power_cap_W=450.0))])
    e = metrics.expected_error(topo)
    assert e["a"] == ("unvalidated: step_overhead set on the sglang preset, whose band was measured with its own "
                      "(a `pdsim calibrate --from-benchmark` file states its held-out error)")
    assert e["b"]["engine"] == "sglang" and e["b"]["ttft_mape_pct"] == bands["sglang|h100-sxm"]["ttft_mape_pct"]
    assert e["c"]["engine"] == "none" and e["c"]["rows"] == bands["none|h100-sxm"]["rows"]
    assert e["d"] == "unvalidated"                # nobody measured an A100; no engine preset to override
    # an MoE model: the MoE rows' band (in sample), or unvalidated for MoE where none was measured; never the dense
    assert e["e"]["moe"] and e["e"]["in_sample"] and e["e"]["rows"] == table["moe_bands"]["sglang|h200"]["rows"]
    assert e["f"].startswith("unvalidated for MoE models") and "vllm-v1|h100-sxm" in bands
    assert e["g"] == "unvalidated: a linear cost model (a what-if, not the roofline)"
    assert e["h"] == ("unvalidated: speculative decoding (draft_model; no measured run used it, and its TPOT rests "
                      "on the acceptance rate assumed)")
    assert e["i"] == "unvalidated: power cap 450 W (no measured run was capped; the clock model under a cap is not measured)"


def test_an_autoscaled_run_that_ends_at_t0_has_no_mean_gpus(tmp_path):
    """One request rejected on arrival at t = 0 (beyond the context) in an autoscaled topology: nothing elapsed,
    nothing paid; the mean GPUs over no time is undefined (None, where a static topology reports its GPUs),
    the peak is the one replica alive at the start, and no token gives 0 per GPU (not 0 / 0 GPU-hours)."""
    from pdsim.simulation import simulate
    trace = tmp_path / "t0.csv"
    trace.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46.6805900,200000,10\n")
    sc = config.parse({"model": "llama-3.1-8b", "workload": {"arrival": "trace", "trace": {"path": str(trace)}},
                       "topologies": {"a": {"kind": "colocated", "replicas": 1, "device": "h100-sxm",
                                            "price_per_gpu_hour_usd": 2.5,
                                            "autoscaler": {"policy": "schedule",
                                                           "schedule": [{"at_s": 5.0, "replicas": 2}]}}}}, "t.yaml")
    res = simulate(sc)
    s = metrics.summarize(res, metrics.requests_frame(res, sc.client), sc)["a"]
    assert s["sim_end_s"] == 0 and s["gpu_hours"] == 0.0 and s["cost_usd"] == 0.0
    assert s["mean_gpus"] is None and s["gpus"] == 1 and s["cost_per_hour_usd"] == 0.0
    assert s["throughput"]["output_tokens_per_s_per_gpu"] == 0.0


def test_slo_samples_leave_out_a_finished_request_whose_client_saw_one_token():
    # behind a PD proxy a 2-token reply streams one token to the client: finished, TPOT NaN.  It has no TPOT,
    # as a one-token reply has none; ranked as a NaN it sat at the top of the sample (np.partition puts NaN
    # last), so the p100 TPOT of (0.1, NaN) was NaN and the bound "not met".  Left out: p100 = 0.1.
    df = pd.DataFrame({"status": ["finished", "finished", "rejected"], "ttft_s": [0.2, 0.3, np.nan],
                       "tpot_s": [0.1, np.nan, np.nan], "output_tokens": [3, 2, 2]})
    ttft, tpot = metrics.slo_samples(df)
    assert ttft.tolist() == [0.2, 0.3, math.inf] and tpot.tolist() == [0.1, math.inf]
    ok = df.iloc[:2]
    slo = config.SLOSpec(ttft_s=1.0, tpot_s=0.5, mode="percentile", ttft_percentile=100, tpot_percentile=100)
    v = metrics.slo_verdict(ok, slo)
    assert v["bounds"]["tpot"]["measured_s"] == 0.1 and v["met"]


def test_nearest_rank_of_unsorted_samples_at_every_percentile_by_hand():
    # np.partition(x, k - 1) promises only position k - 1 (the k-th smallest there); partitioning at another
    # index leaves position k - 1 to the algorithm (nearest_rank 31 partitioned at k - 2).  Permutations of
    # 0 .. n-1 (i x m mod n, m prime to n): the p-th percentile by nearest rank is the value ceil(p n / 100) - 1
    # (rank 1 for p at or below 100 / n).  Several sizes and strides, every integer p: numpy's selection
    # (generic introselect, or the SIMD one on AVX2/AVX-512) leaves a wrong value at k - 1 for some of them.
    for n, m in ((211, 37), (101, 29), (199, 53), (1000, 389)):
        x = [float(i * m % n) for i in range(n)]
        for p in range(1, 101):
            assert metrics.nearest_rank(x, p) == max(1, math.ceil(p * n / 100)) - 1, (n, m, p)
    # four values, p50: rank 2 -> 2.0 (introselect at rank 1 only moves the minimum to the front: [1, 5, 9, 2])
    assert metrics.nearest_rank([5.0, 1.0, 9.0, 2.0], 50) == 2.0


class _NumpyWithDirtyMemory:
    """numpy, except that an array np.divide allocates itself (no ``out=``) starts as NaN, not as whatever
    bytes the allocator hands out: numpy leaves the ``where=False`` places of such an output uninitialised,
    and its cache of small freed buffers makes their content depend on what was freed last (a just-freed
    zero-filled temporary reads as 0, a just-freed np.full(n, 7.0) as 7), i.e. on the tests run before."""
    def __getattr__(self, name):
        return getattr(np, name)

    @staticmethod
    def divide(x, y, out=None, where=True, **kw):
        if out is None:
            out = np.full(np.broadcast(np.asarray(x), np.asarray(y)).shape, np.nan)
        return np.divide(x, y, out=out, where=where, **kw)


def test_idle_bins_have_batch_size_zero_whatever_memory_numpy_hands_out(monkeypatch):
    # the two-request run of test_timeseries_bins_by_hand (0.25 s bins): bins 1-3 start no step, so no batch:
    # 0, not the garbage of an uninitialised buffer (timeseries_frame 62, 66 dropped out=np.zeros(n) and
    # survived or died by the allocator's history: flaky).  With the freshly divided array made NaN, a
    # division that leaves the idle bins unwritten shows NaN there every time
    monkeypatch.setattr(metrics, "np", _NumpyWithDirtyMemory())
    sc, res = _run([(0.0, 20, 3), (1.0, 30, 1)], bin_s=0.25)
    ts = metrics.timeseries_frame([res])
    assert list(ts.steps) == [3, 0, 0, 0, 1] and list(ts.batch_size) == [1.0, 0.0, 0.0, 0.0, 1.0]


def test_p99_of_51_gaps_takes_numpys_upper_form_at_gamma_one_half_by_hand():
    # 51 gaps: index (51 - 1) x 0.99 = 49.5 exactly (50 x 0.99 rounds to 49.5), gamma = 0.5, the 50th and 51st
    # smallest gaps a, b.  numpy's lerp (np.percentile, linear) takes b - (b - a)(1 - gamma) for gamma >= 0.5.
    # Tokens at 0, 0.1, 1.6, then 49 more 1/16 s apart: gaps 0.1, 1.5 (1.6 - 0.1) and 49 x 0.0625, so
    # a = 0.1, b = 1.5, b - a = 1.4, half 0.7: b - 0.7 = 0.8, whereas a + 0.7 = 0.7999999999999999 (itl_columns
    # 91, `gamma > 0.5`, took that form)
    t = [0.0, 0.1, 1.6] + [1.6 + k / 16 for k in range(1, 50)]
    mean, p99, mx = metrics.itl_columns([_tok(t)], np.zeros(1, np.int64))
    assert 0.1 + 0.7 != 0.8 and 1.5 - 0.7 == 0.8
    assert p99[0] == 0.8 and mx[0] == 1.5


def _kv_pool(total=100, watermark=0.1, block=16):
    """A pool as kv_capacity reads it: its first instance's cache (blocks of ``block`` tokens), no engine."""
    from pdsim.kvcache import KVCache
    kv = KVCache(total, block, watermark)
    return NS(instances=[NS(kv=kv)], spec=NS(engine=None, kv_blocks=None), cost=NS())


def test_kv_capacity_of_an_empty_run_and_of_a_mean_size_that_does_not_divide_by_hand():
    # (100 - 10) blocks above the watermark x 16 tokens = 1440 tokens whatever the run
    cols = {"prompt_tokens": pd.Series([], dtype="int64"), "output_tokens": pd.Series([], dtype="int64")}
    k = metrics.kv_capacity(_kv_pool(), pd.DataFrame(cols))
    # no request measured: no mean size, so no capacity in requests (None, not NaN, not 90 // 1, no exception)
    assert k == {"engine": None, "kv_blocks": 100, "kv_block_size": 16, "kv_capacity_tokens": 1440,
                 "kv_capacity_requests": None, "kv_request_tokens_mean": None}
    # requests of 20 + 10 and 60 + 10 tokens: mean 50, ceil(50 / 16) = 4 blocks a request: 90 // 4 = 22 whole
    # requests (90 / 4 = 22.5 is no count of requests)
    k = metrics.kv_capacity(_kv_pool(), pd.DataFrame({"prompt_tokens": [20, 60], "output_tokens": [10, 10]}))
    assert k["kv_request_tokens_mean"] == 50.0 and k["kv_capacity_requests"] == 22
    assert type(k["kv_capacity_requests"]) is int


def test_kv_capacity_sizing_of_fp8_weights_by_hand():
    # as test_kv_capacity_with_an_engine_shows_its_sizing_by_hand, with fp8 weights: 1 B a decoder parameter,
    # the embeddings and LM head stay bf16 (2 B): 32 x (2 x 4096^2 + 2 x 4096 x 1024 + 3 x 4096 x 14336)
    # + 2 x (2 x 128256 x 4096) bytes; SGLang's pool: 80 GiB x 0.8 - weights - 1 GiB
    gib = 1024 ** 3
    weights = 32 * (2 * 4096 * 4096 + 2 * 4096 * 1024 + 3 * 4096 * 14336) + 2 * (2 * 128256 * 4096)
    topo = {"kind": "colocated", "engine": "sglang", "device": "h100-sxm", "gpu_memory_utilization": 0.8,
            "cuda_graph_GiB": 1.0, "watermark": 0.0}
    sc, res = _run([(0.0, 20, 3)], topo=topo, weight_dtype="fp8")
    p = metrics.summarize([res], metrics.requests_frame([res], sc.client), sc)["c"]["pools"]["replica"]
    k = p["kv_sizing_bytes"]
    assert k["weights_bytes"] == weights
    assert k["kv_bytes"] == pytest.approx(80 * gib * 0.8 - weights - 1 * gib, rel=1e-12)


def test_slo_samples_leave_out_an_unserved_request_that_asked_for_one_token():
    # a request asking for one output token has no TPOT, served or not: rejected, it is a +inf TTFT sample
    # and no TPOT sample (slo_samples 17 took output_tokens >= 1 and ranked it a +inf TPOT: a p100 TPOT
    # "unserved" where every request that could have a TPOT met the bound)
    df = pd.DataFrame({"status": ["finished", "rejected"], "ttft_s": [0.2, np.nan], "tpot_s": [0.1, np.nan],
                       "output_tokens": [3, 1]})
    ttft, tpot = metrics.slo_samples(df)
    assert ttft.tolist() == [0.2, math.inf] and tpot.tolist() == [0.1]


def test_expected_error_of_pools_with_a_frontend_latency_by_hand():
    # no stored band was measured with a front-end latency: an engine pool names its preset's band, a pool
    # without an engine every band; 0 ms is no front end (the band as without the key)
    roof, dense = NS(kind="roofline"), NS(is_moe=False)
    topo = NS(pools=[NS(name="a", model=dense, spec=NS(engine="sglang", step_overhead=None, frontend_latency_ms=50.0,
                                                       device="h100-sxm", tp=1, cost_model=roof)),
                     NS(name="b", model=dense, spec=NS(engine=None, frontend_latency_ms=2.5, device="h100-sxm", tp=1,
                                                       cost_model=roof)),
                     NS(name="c", model=dense, spec=NS(engine="sglang", step_overhead=None, frontend_latency_ms=0.0,
                                                       device="h100-sxm", tp=1, cost_model=roof))])
    e = metrics.expected_error(topo)
    assert e["a"] == "unvalidated: frontend_latency_ms 50 set; the sglang preset's band was measured without one"
    assert e["b"] == "unvalidated: frontend_latency_ms 2.5 set; every stored band was measured without one"
    assert e["c"]["engine"] == "sglang"


def test_prefix_summary_says_which_pools_cache_and_why_by_hand():
    # pool p caches by its engine's default (topology.prefix_by_engine names the engine), pool d by the
    # scenario's prefix_cache key, pool x not at all (left out)
    topo = NS(instances=[], prefix_by_engine={"p": "vllm-v1"},
              pools=[NS(name="p", spec=NS(prefix_on=True)), NS(name="d", spec=NS(prefix_on=True)),
                     NS(name="x", spec=NS(prefix_on=False))])
    s = metrics.prefix_summary(NS(topology=topo, requests=[]))
    assert s["enabled_by"] == {"p": "engine default (vllm-v1)", "d": "scenario"}
    # a topology that records no engine default: every caching pool by the scenario
    del topo.prefix_by_engine
    assert metrics.prefix_summary(NS(topology=topo, requests=[]))["enabled_by"] == {"p": "scenario", "d": "scenario"}
