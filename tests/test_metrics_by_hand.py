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
    first = np.array([1.0, 2.0, 3.0])
    rs = [_tok(None, 1.5), _tok(None, float("nan")), _tok(None, 3.25)]   # r1: a one-token reply, no decode
    seen, k0 = metrics.client_first_token(rs, first, "disaggregated", config.ClientSpec())
    assert list(seen) == [1.5, 2.0, 3.25] and list(k0) == [1, 0, 1]
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
    def __init__(self, zero=False):
        self.zero = zero

    def step(self, tokens, attn_work, kv_read_tokens, sampled, batch):
        f = 0.0 if self.zero else 1e6 * tokens + 1e3 * attn_work + 10 * kv_read_tokens + 7 * sampled + 3 * batch
        return NS(time_s=0.0, flops=f, bytes=0.0)


def _stats(adm, look, gpu, host):
    return NS(admissions=adm, lookup_tokens=look, gpu_hit_tokens=gpu, host_hit_tokens=host, evicted_blocks=2,
              host_evicted_blocks=1, host_load_bytes=4096, transfer_hit_tokens=16)


def test_prefix_summary_by_hand():
    cost = _FakeCost()
    off = NS(name="x-0", kv=NS(prefix_on=False), cost=cost)               # no prefix cache: not counted
    a = NS(name="a-0", kv=NS(prefix_on=True, stats=_stats(3, 400, 100, 50), cached_blocks=5), cost=cost)
    b = NS(name="b-0", kv=NS(prefix_on=True, stats=_stats(1, 100, 20, 50), cached_blocks=0), cost=cost)
    idle = NS(name="d-0", kv=NS(prefix_on=True, stats=_stats(0, 0, 0, 0), cached_blocks=0), cost=cost)
    reqs = [NS(cached_tokens=0, instance="a-0", prompt_tokens=50),          # nothing cached: nothing saved
            NS(cached_tokens=16, instance="gone", prompt_tokens=50),        # no such instance: skipped
            NS(cached_tokens=40, instance="a-0", prompt_tokens=100),
            NS(cached_tokens=16, instance="b-0", prompt_tokens=20)]
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
    # request 2: the whole 100-token prompt, alone (attention work 100^2 / 2, reads 100, samples 1, batch 1)
    # 1e8 + 5e6 + 1000 + 7 + 3; its 60-token suffix over 40 cached: work 60 x (40 + 30) = 4200
    # 6e7 + 4.2e6 + 1000 + 7 + 3.  Saved: 105_001_010 - 64_201_010 = 40_800_000
    # request 3: 20 tokens, 16 cached: 2e7 + 2e5 + 200 + 10 = 20_200_210 less its 4-token suffix
    # (work 4 x (16 + 2) = 72): 4e6 + 72_000 + 200 + 10 = 4_072_210 -> 16_128_000; both: 56_928_000
    assert s["prefill_flops_saved"] == 56_928_000.0
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


def test_mfu_of_an_fp8_run_is_over_the_fp8_peak():
    # fp8 weights compute in fp8: the same FLOPs (the formula above) over the datasheet's 1979 TFLOP/s
    hid, nh, kvh, d, f, L, V, P = 4096, 32, 8, 128, 14336, 32, 128256, 1024
    params = hid * nh * d + 2 * hid * kvh * d + nh * d * hid + 3 * hid * f
    want = 2 * P * params * L + 2 * nh * d * L * P * P + 2 * hid * V
    sc, res = _run([(0.0, P, 1)], topo={"kind": "colocated", "device": "h100-sxm", "kv_blocks": 1000}, bin_s=0.01,
                   weight_dtype="fp8")
    ts = metrics.timeseries_frame([res])
    assert ts.mfu.sum() * 0.01 * 1979e12 == pytest.approx(want, rel=1e-9)


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
    # (arrival, TTFT, E2E, fault hits, recomputed tokens); the request at 5 was rejected
    rows = [(0, 1, 2, 0, 0), (1, 1, 2, 0, 0), (2, 1, 2, 0, 0), (3, 1, 2, 0, 0), (5, None, None, 0, 0),
            (10, 5, 6, 1, 0), (12, 5, 6, 1, 100), (15, 5, 9, 1, 50),                 # inside [10, 20)
            (20, 4, 5, 0, 0), (22, 4, 5, 0, 0), (23, 4, 5, 0, 0), (24, 4, 5, 0, 0),   # slow after it
            (30, 1, 2, 0, 0), (31, 1, 2, 0, 0), (32, 1, 2, 0, 0), (60, 1, 2, 0, 0)]
    d = pd.DataFrame({"arrival_s": [float(r[0]) for r in rows],
                      "ttft_s": [np.nan if r[1] is None else float(r[1]) for r in rows],
                      "e2e_s": [np.nan if r[2] is None else float(r[2]) for r in rows],
                      "tpot_s": np.nan, "fault_hits": [r[3] for r in rows], "recomputed_tokens": [r[4] for r in rows],
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
                         "recomputed_tokens": 0, "status": "finished"})


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
                       "topologies": {"a": {"kind": "colocated", "replicas": 2, "device": "h100-sxm"}}}, "t.yaml")
    res = simulate(sc)
    s = metrics.summarize(res, metrics.requests_frame(res, sc.client), sc)["a"]
    assert s["sim_end_s"] == 0 and s["requests"]["rejected"] == 2
    assert s["gpu_hours"] == 0.0 and s["cost_usd"] == 0.0 and s["pools"]["replica"]["gpu_hours"] == 0.0
    assert s["mean_gpus"] == 2 and s["throughput"]["requests_per_s"] == 0.0
    assert s["cost_per_million_output_tokens_usd"] is None
