"""Engine presets (KV sizing, overhead), the client view (ITL, ttft_at, ramp-up, warm-up), hand-worked."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from conftest import REPO, scenario
from pdsim import config, metrics
from pdsim.engines import PRESETS, activation_peak_bytes
from pdsim.models import get_model
from pdsim.simulation import simulate
from pdsim.topology import kv_blocks

LLAMA8 = get_model("llama-3.1-8b")
GiB = 1024 ** 3
VIDUR_CPU = REPO.parent / "shared" / "reference" / "vidur" / "measured" / "data" / "profiling" / "a100" / \
    "cpu_overheads.csv"


def _pool(**kw):
    sc = scenario({"t": {"kind": "colocated", **kw}})
    return sc.topologies["t"]


# Llama-3.1-8B by hand (HF config: 32 layers, h 4096, 32 q / 8 kv heads of 128, MLP 14336, vocab 128256):
# per layer 4096*4096 + 2*4096*1024 + 4096*4096 + 3*4096*14336 = 218,103,808 params; x32 = 6,979,321,856;
# embeddings + LM head 2*128256*4096 = 1,050,673,152; total 8,029,995,008 params = 16,059,990,016 bf16 bytes.
WEIGHTS = 16_059_990_016
BLOCK16 = 16 * 131072            # 16 tokens x 128 KiB per token


def test_kv_blocks_without_engine_are_todays():
    # 80 GiB x 0.9 - weights - 2 GiB activation reserve, in 2 MiB blocks
    free = 80 * GiB * 0.9 - WEIGHTS - 2 * GiB
    assert kv_blocks(_pool(), LLAMA8, "bf16", "bf16", ".", "k")[0] == int(free // BLOCK16) == 28182


def test_kv_blocks_vllm_v1_by_hand():
    # vLLM: 80 GiB x 0.9 - weights - profiling-run activation peak - non-torch 0.5 GiB - CUDA graphs 0.5 GiB.
    # activation peak of 8192 tokens: (2*4096 residual+norm, 6144 qkv, 3*14336 gate/up+act) x 2 bytes,
    # plus fp32 logits for max_num_seqs = 1024 rows of 128256
    act = 8192 * (8192 + 6144 + 43008) * 2 + 1024 * 128256 * 4
    assert act == 1_464_860_672
    assert activation_peak_bytes(LLAMA8, 8192, 1024, 1) == act
    free = 80 * GiB * 0.9 - WEIGHTS - act - 0.5 * GiB - 0.5 * GiB
    blocks, block_bytes = kv_blocks(_pool(engine="vllm-v1"), LLAMA8, "bf16", "bf16", ".", "k")
    assert block_bytes == BLOCK16
    assert blocks == int(free // BLOCK16) == 27995


def test_kv_blocks_sglang_and_trtllm_by_hand():
    # SGLang: mem_fraction_static 0.88 covers weights + KV; page size 1 (one token per block)
    blocks, bb = kv_blocks(_pool(engine="sglang"), LLAMA8, "bf16", "bf16", ".", "k")
    assert bb == 131072
    assert blocks == int((80 * GiB * 0.88 - WEIGHTS) // 131072) == 454_188
    # TensorRT-LLM: 0.9 of what is free after weights, activations (8192 tokens, 2048 sequences) and
    # 0.5 GiB non-torch memory; 32-token blocks
    act = 8192 * (8192 + 6144 + 43008) * 2 + 2048 * 128256 * 4
    blocks, bb = kv_blocks(_pool(engine="trtllm"), LLAMA8, "bf16", "bf16", ".", "k")
    assert bb == 32 * 131072
    assert blocks == int((80 * GiB - WEIGHTS - act - 0.5 * GiB) * 0.9 // (32 * 131072))


def test_preset_fills_only_keys_not_given():
    p = _pool(engine="vllm-v1", max_running=64, gpu_memory_utilization=0.8)
    assert (p.scheduler_name, p.token_budget, p.max_running, p.gpu_memory_utilization, p.block_size,
            p.watermark) == ("chunked", 8192, 64, 0.8, 16, 0.0)
    p = _pool(engine="vllm-v0")
    assert (p.scheduler_name, p.max_running, p.watermark) == ("fcfs", 256, 0.01)
    p = _pool(engine="vllm-v1", scheduler="fcfs")          # the user's scheduler wins
    assert p.scheduler_name == "fcfs"
    p = _pool()                                             # no engine: today's defaults
    assert (p.scheduler_name, p.max_running, p.token_budget, p.watermark) == ("fcfs", 256, 8192, 0.01)


def test_unknown_engine_is_one_line_error():
    with pytest.raises(config.ConfigError) as e:
        _pool(engine="vllm-v2")
    msg = str(e.value)
    assert "topologies.t.engine" in msg and "vllm-v2" in msg and "\n" not in msg


@pytest.mark.skipif(not VIDUR_CPU.is_file(), reason="../shared Vidur reference not present")
def test_vllm_v0_overhead_matches_vidur_measurements():
    import pandas as pd
    d = pd.read_csv(VIDUR_CPU)
    d = d[d.tensor_parallel_degree == 1]
    per_step_ms = d.schedule_median + d.sampler_e2e_median + d.prepare_inputs_e2e_median + \
        d.process_model_outputs_median
    slope, base = np.polyfit(d.batch_size, per_step_ms, 1)
    p = PRESETS["vllm-v0"]
    assert p.overhead_base_us == pytest.approx(base * 1e3, rel=0.01)
    assert p.overhead_per_seq_us == pytest.approx(slope * 1e3, rel=0.01)
    # and the preset predicts every measured row within 5%
    pred = (p.overhead_base_us + p.overhead_per_seq_us * d.batch_size) / 1e3
    assert float((abs(pred - per_step_ms) / per_step_ms).max()) < 0.05


# --- client view ------------------------------------------------------------------------------------
LIN = {"kind": "linear", "base_s": 0.01, "per_token_s": 1e-4, "per_kv_token_s": 1e-6}


@pytest.mark.parametrize("fast", [True, False])
@pytest.mark.parametrize("overhead", [None, {"base_us": 500, "per_seq_us": 10}])
def test_itl_of_lone_request_equals_its_decode_steps(fast, overhead):
    topo = {"kind": "colocated", "cost_model": LIN, "kv_blocks": 100}
    if overhead:
        topo["step_overhead"] = overhead
    sc = scenario({"c": topo}, num_requests=1, prompt_tokens=100, output_tokens=6)
    res = simulate(sc, fast=fast)
    r = res[0].requests[0]
    # by hand: decode step k (1..5) computes 1 token reading 100 + k cached tokens
    extra = 0.0005 + 0.00001 * 1 if overhead else 0.0
    gaps = [0.01 + 1e-4 + 1e-6 * (100 + k) + extra for k in range(1, 6)]
    assert np.diff(r.token_s) == pytest.approx(gaps, rel=1e-9)
    prefill = 0.01 + 1e-4 * 100 + 1e-6 * 100 + (0.0005 + 0.00001 if overhead else 0.0)
    assert r.token_s[0] - r.arrival_s == pytest.approx(prefill, rel=1e-9)
    df = metrics.requests_frame(res, sc.client)
    assert df.itl_mean_s[0] == pytest.approx(np.mean(gaps), rel=1e-9)
    assert df.itl_max_s[0] == pytest.approx(max(gaps), rel=1e-9)
    s = metrics.summarize(res, df, sc)["c"]
    assert s["itl_s"]["gaps"] == 5
    assert s["itl_s"]["p99"] == pytest.approx(np.percentile(gaps, 99), rel=1e-9)


def _disagg(client=None, rtt=0.0):
    topo = {"kind": "disaggregated", "kv_link": {"bandwidth_GBps": 10, "latency_us": 100},
            "prefill": {"cost_model": {"kind": "constant", "step_s": 0.05}, "kv_blocks": 1000},
            "decode": {"cost_model": {"kind": "constant", "step_s": 0.01}, "kv_blocks": 1000}}
    sc = scenario({"d": topo}, num_requests=1, prompt_tokens=1000, output_tokens=4)
    if client:
        sc = config.parse({**sc.model_dump(mode="json", exclude_unset=True), "client": client}, "t.yaml")
    res = simulate(sc)
    return metrics.requests_frame(res, sc.client).iloc[0]


def test_ttft_at_first_decode_token_behind_pd_proxy():
    xfer = 100e-6 + 1000 * 131072 / 10e9
    row = _disagg()
    # default: the client sees the decode instance's first token: prefill + transfer + one decode step
    assert row.ttft_s == pytest.approx(0.05 + xfer + 0.01, rel=1e-9)
    assert row.ttft_prefill_end_s == pytest.approx(0.05, rel=1e-9)
    # 3 tokens streamed by decode, 2 gaps of one decode step each
    assert row.tpot_s == pytest.approx(0.01, rel=1e-9)
    assert row.itl_mean_s == pytest.approx(0.01, rel=1e-9)
    row = _disagg({"ttft_at": "prefill_end", "network_rtt_s": 0.002})
    assert row.ttft_s == pytest.approx(0.05 + 0.002, rel=1e-9)
    assert row.e2e_s == pytest.approx(0.05 + xfer + 3 * 0.01 + 0.002, rel=1e-9)


def test_closed_loop_ramp_up_jitter_and_warmup():
    base = scenario(None, arrival="closed", clients=4, num_requests=8, prompt_tokens=10,
                    output_tokens={"dist": "uniform", "low": 20, "high": 60})
    raw = base.model_dump(mode="json", exclude_unset=True)
    sc = config.parse({**raw, "client": {"ramp_up_s": 1.0, "warmup_requests": 4}}, "t.yaml")
    res = simulate(sc)
    arrivals = [r.arrival_s for r in res[0].requests]
    for t in (0.0, 0.25, 0.5, 0.75):                                # client i of 4 starts at i/4 s
        assert min(abs(a - t) for a in arrivals) < 1e-12, (t, arrivals)
    assert min(arrivals[1:]) > 0                                    # (only client 0 at t=0)
    df = metrics.requests_frame(res, sc.client)
    assert df.warmup.sum() == 4
    assert (df[df.warmup].finish_s.max() <= df[~df.warmup].finish_s.min())
    s = metrics.summarize(res, df, sc)["c"]
    assert (s["requests"]["total"], s["warmup_excluded"]) == (8, 4)     # counted, not measured
    assert s["ttft_s"]["mean"] == pytest.approx(df[~df.warmup].ttft_s.mean())
    # jitter: first sends inside [0, 2) s, seeded, the lengths unchanged
    sc = config.parse({**raw, "client": {"start_jitter_s": 2.0}}, "t.yaml")
    a = sorted(r.arrival_s for r in simulate(sc)[0].requests)
    assert all(0 <= t for t in a) and a[0] > 0 and a[0] < 2 and len(set(a)) == 8
    assert a == sorted(r.arrival_s for r in simulate(sc)[0].requests)   # seeded
    # default (vllm bench serve --max-concurrency): every client sends at t=0
    assert [r.arrival_s for r in simulate(base)[0].requests][:4] == [0.0] * 4


def test_run_summary_shows_kv_capacity_and_error_band(tmp_path):
    sc = scenario({"v": {"kind": "colocated", "engine": "vllm-v1", "device": "h100-sxm"}},
                  num_requests=3, prompt_tokens=1000, output_tokens=24)
    res = simulate(sc)
    s = metrics.summarize(res, metrics.requests_frame(res, sc.client), sc)["v"]
    pool = s["pools"]["replica"]
    assert pool["kv_capacity_tokens"] == 27995 * 16
    assert pool["kv_capacity_requests"] == 27995 // 64          # 1024 tokens = 64 blocks per request
    assert pool["kv_sizing_bytes"]["activation_bytes"] == 1_464_860_672
    band = s["expected_error"]["replica"]
    assert band == "unvalidated" or {"ttft_mape_pct", "tpot_mape_pct"} <= set(band)


def test_warmup_is_the_first_to_finish_not_the_first_sent():
    finish = np.array([3.0, 1.0, 2.0, np.nan, 0.5])
    status = np.array(["finished", "finished", "finished", "unfinished", "rejected"], dtype=object)
    assert metrics.warmup_mask(finish, status, 2).tolist() == [False, True, True, False, False]
    assert not metrics.warmup_mask(finish, status, 0).any()


def test_estimate_prints_kv_capacity_in_tokens_and_requests(capsys):
    import json
    from pdsim.__main__ import main
    assert main(["estimate", "--model", "llama-3.1-8b", "--device", "h100-sxm", "--decode-batch", "8",
                 "--context", "2047", "--engine", "vllm-v1", "--json"]) == 0
    kv = json.loads(capsys.readouterr().out)["kv_capacity"]
    # 27995 blocks (hand-computed above, no watermark in v1); a 2048-token request holds 128 blocks
    assert (kv["tokens"], kv["requests"]) == (27995 * 16, 27995 // 128)


def test_warmup_that_leaves_nothing_is_one_line_error():
    with pytest.raises(config.ConfigError) as e:
        config.parse({"workload": {"arrival": "closed", "clients": 2, "num_requests": 4},
                      "client": {"warmup_requests": 4}, "topologies": {"c": {"kind": "colocated"}}}, "w.yaml")
    assert "w.yaml" in str(e.value) and "warmup_requests" in str(e.value) and "\n" not in str(e.value)
