"""Core semantics pinned by values worked out by hand (or by theory), one test per way of being wrong.

Each test names the wrong semantics it guards against; tests/MUTANTS.md lists the deliberate
breakages each one was seen to catch.  Cost models here are ConstantCost / LinearCost so that every
expected time is arithmetic on the config, never a call into the code path the simulator runs.
"""
from __future__ import annotations

import math
from collections import deque

import numpy as np
import pytest

from conftest import scenario
from pdsim import config, metrics
from pdsim import workload as wl
from pdsim.kvcache import KVCache
from pdsim.scheduler import Limits, chunked, fcfs
from pdsim.simulation import generate, resolve_model, run_topology, simulate
from pdsim.workload import Request

KV_BYTES_PER_TOKEN = 2 * 32 * 8 * 128 * 2       # llama-3.1-8b, bf16: 2 (K,V) x layers x kv_heads x head_dim x 2 B


def _one(topo, prompt, output, **workload):
    sc = scenario({"t": topo}, arrival="constant", rate=1.0, num_requests=1, prompt_tokens=prompt,
                  output_tokens=output, **workload)
    (res,) = simulate(sc)
    return res.requests[0], res


def _stream(sc, rows):
    """Run the scenario's only topology on a hand-made stream of (arrival_s, prompt, output)."""
    model = resolve_model(sc)
    reqs = [Request(i, a, p, o) for i, (a, p, o) in enumerate(rows)]
    (name, spec), = sc.topologies.items()
    return run_topology(sc, name, spec, reqs, model, 0.1)


# --- TPOT and latency statistics ----------------------------------------------------------
def test_lone_request_ttft_tpot_e2e_by_hand_linear_cost():
    # step = 10 ms + 1 ms per new token + 10 us per KV token read
    topo = {"kind": "colocated", "kv_blocks": 1000,
            "cost_model": {"kind": "linear", "base_s": 0.01, "per_token_s": 0.001, "per_kv_token_s": 1e-5}}
    r, res = _one(topo, prompt=100, output=5)
    prefill = 0.01 + 0.001 * 100 + 1e-5 * 100                  # 100 new tokens, reads its own 100
    decodes = [0.01 + 0.001 + 1e-5 * c for c in (101, 102, 103, 104)]   # 4 decodes, contexts 100..103 + 1
    assert r.first_token_s - r.arrival_s == pytest.approx(prefill, abs=1e-12)
    assert r.finish_s - r.arrival_s == pytest.approx(prefill + sum(decodes), abs=1e-12)
    df = metrics.requests_frame([res])
    assert df.ttft_s[0] == pytest.approx(prefill, abs=1e-12)
    # TPOT = decode time / (output - 1): the first token came with the prefill
    assert df.tpot_s[0] == pytest.approx(sum(decodes) / 4, abs=1e-12)
    assert df.e2e_s[0] == pytest.approx(prefill + sum(decodes), abs=1e-12)


def test_one_token_reply_has_no_tpot():
    r, res = _one({"kind": "colocated", "kv_blocks": 100, "cost_model": {"kind": "constant", "step_s": 0.02}},
                  prompt=10, output=1)
    df = metrics.requests_frame([res])
    assert r.finish_s == r.first_token_s and math.isnan(df.tpot_s[0]) and df.ttft_s[0] == pytest.approx(0.02)


def test_rejected_and_abandoned_requests_stay_out_of_latency_statistics():
    # batch-1 replica, 100 ms steps, one-token replies, clients give up after 150 ms without a token:
    # r0 is served (TTFT = E2E = 0.1 s); r1 runs from 0.1 s and is abandoned at 0.15 s; r2 waits and is
    # abandoned at 0.15 s; r3 needs 313 KV blocks of a 100-block pool: rejected at arrival.
    topo = {"kind": "colocated", "max_running": 1, "kv_blocks": 100, "watermark": 0.0,
            "cost_model": {"kind": "constant", "step_s": 0.1}}
    sc = scenario({"c": topo}, timeout_s=0.15)
    res = _stream(sc, [(0.0, 10, 1), (1e-6, 10, 1), (2e-6, 10, 1), (3e-6, 5000, 1)])
    df = metrics.requests_frame([res])
    assert list(df.status) == ["finished", "abandoned", "abandoned", "rejected"]
    # per-request latency columns hold nothing for requests that were never served
    assert df.e2e_s[1:].isna().all() and df.tpot_s.isna().all() and df.ttft_s[1:].isna().all()
    s = metrics.summarize([res], df, sc)["c"]
    assert s["requests"] == {"total": 4, "finished": 1, "rejected": 1, "abandoned": 2, "unfinished": 0}
    for key in ("ttft_s", "e2e_s"):
        assert s[key]["mean"] == pytest.approx(0.1) and s[key]["p99"] == pytest.approx(0.1), key
    assert s["tpot_s"]["mean"] is None
    assert s["slo_attainment"] == 0.25           # 1 of 4 arrived requests met the SLO
    assert s["throughput"]["requests_per_s"] == pytest.approx(1 / res.sim_end_s)


# --- KV links -----------------------------------------------------------------------------------
DIS = {"kind": "disaggregated", "prefill": {"instances": 2, "kv_blocks": 1000, "cost_model": {"kind": "constant", "step_s": 0.05}},
       "decode": {"instances": 1, "kv_blocks": 1000, "cost_model": {"kind": "constant", "step_s": 0.01}}}


def test_two_transfers_on_one_link_take_twice_as_long():
    # two 1000-token prompts prefilled at once on two prefill instances share one 10 GB/s link
    topo = {**DIS, "kv_link": {"bandwidth_GBps": 10, "latency_us": 10, "shared": True}}
    sc = scenario({"t": topo}, arrival="closed", clients=2, num_requests=2, prompt_tokens=1000, output_tokens=2)
    (res,) = simulate(sc)
    x = 10e-6 + 1000 * KV_BYTES_PER_TOKEN / 10e9          # one transfer, by hand: 13.1 ms
    starts = sorted(r.decode_start_s for r in res.requests)
    assert starts == pytest.approx([0.05 + x, 0.05 + 2 * x], abs=1e-12)
    assert sorted(r.kv_wait_s for r in res.requests) == pytest.approx([0.0, x], abs=1e-12)
    assert all(r.kv_transfer_s == pytest.approx(x, abs=1e-12) for r in res.requests)
    # one link per prefill instance: the two transfers run side by side
    topo["kv_link"]["shared"] = False
    (res,) = simulate(scenario({"t": topo}, arrival="closed", clients=2, num_requests=2, prompt_tokens=1000,
                               output_tokens=2))
    assert [r.decode_start_s for r in res.requests] == pytest.approx([0.05 + x] * 2, abs=1e-12)


def test_layerwise_overlap_hides_the_prefill_time_once():
    # 32 layers: layer l's KV leaves while layers l+1..32 compute; visible = X - compute * 31/32
    topo = {**DIS, "prefill": {**DIS["prefill"], "instances": 1},
            "kv_link": {"bandwidth_GBps": 1, "latency_us": 10, "layerwise_overlap": True}}
    r, _ = _one(topo, prompt=1000, output=2)
    x = 10e-6 + 1000 * KV_BYTES_PER_TOKEN / 1e9             # 131 ms on the wire
    assert r.kv_transfer_s == pytest.approx(x - 0.05 * 31 / 32, abs=1e-12)     # 131 ms - 48.4 ms visible
    assert r.decode_start_s - r.arrival_s == pytest.approx(0.05 + x - 0.05 * 31 / 32, abs=1e-12)
    # a transfer shorter than the prefill still shows its last layer's bytes, W / 32, and the whole latency
    # (paid once, after the prefill: never divided by the layers): 10 us + 13.1072 ms / 32 = 0.42 ms
    topo["kv_link"]["bandwidth_GBps"] = 10
    r, _ = _one(topo, prompt=1000, output=2)
    w = 1000 * KV_BYTES_PER_TOKEN / 10e9
    assert r.kv_transfer_s == pytest.approx(10e-6 + w / 32, abs=1e-12)


def test_layerwise_overlap_credits_only_a_transfer_that_leaves_as_its_prefill_ends():
    # 4 requests of 1000 + 2 at t=0 on 1P1D: one prefill step 0 - 0.05 s computes all four; one 1 GB/s link,
    # 100 us latency.  W = 1000 x 131072 B / 1e9 = 0.131072 s on the wire each.
    # r0 goes at 0.05: layers 1..31 could leave from 0.05/32 = 0.0015625 s (layer 1 ready) to 0.05 while the
    # link was idle: 0.0484375 s of its W (< W x 31/32) -> visible 0.0001 + 0.131072 - 0.0484375 = 0.0827345 s.
    # r1..r3 queue behind it: their prefill ended long before they go, nothing overlaps: 0.0001 + 0.131072
    # = 0.131172 s each, starting at 0.1327345, 0.2639065, 0.3950785.  The link carried 4 x 0.131172 s of
    # wire time (latency included) from 0.0015625 to 0.5262505: busy 0.524688 s, never above the wall time
    # (the old credit gave every queued transfer the overlap too: 524 MB in ~0.38 s on a 1 GB/s link).
    topo = {**DIS, "prefill": {**DIS["prefill"], "instances": 1},
            "kv_link": {"bandwidth_GBps": 1, "latency_us": 100, "layerwise_overlap": True}}
    res = _stream(scenario({"t": topo}), [(0.0, 1000, 2)] * 4)
    r = sorted(res.requests, key=lambda q: q.kv_wait_s)
    assert [q.prefill_end_s for q in r] == pytest.approx([0.05] * 4, abs=1e-12)
    assert [q.kv_transfer_s for q in r] == pytest.approx([0.0827345] + [0.131172] * 3, abs=1e-9)
    assert [q.kv_wait_s for q in r] == pytest.approx([0.0, 0.0827345, 0.2139065, 0.3450785], abs=1e-9)
    assert max(q.decode_start_s for q in r) == pytest.approx(0.5262505, abs=1e-9)
    (link,) = res.topology.links
    assert link.busy_s == pytest.approx(0.524688, abs=1e-9)
    assert link.busy_s <= 0.5262505 - 0.05 / 32 + 1e-12


def test_transfers_on_a_link_never_overlap_in_time():
    # 40 requests at 100/s over one shared 1 GB/s link (each transfer ~26 ms): the link is the bottleneck
    topo = {**DIS, "kv_link": {"bandwidth_GBps": 1, "latency_us": 10, "shared": True}}
    sc = scenario({"t": topo}, rate=100.0, num_requests=40, prompt_tokens=200, output_tokens=3)
    (res,) = simulate(sc)
    iv = sorted((r.prefill_end_s + r.kv_wait_s, r.prefill_end_s + r.kv_wait_s + r.kv_transfer_s)
                for r in res.requests)
    assert all(b[0] >= a[1] - 1e-12 for a, b in zip(iv, iv[1:]))
    assert sum(r.kv_wait_s > 0 for r in res.requests) > 10           # it did queue
    # the link was busy exactly the sum of its transfers, and no faster than its bandwidth
    link = res.topology.links[0]
    x = 10e-6 + 200 * KV_BYTES_PER_TOKEN / 1e9
    assert link.transfers == 40 and link.busy_s == pytest.approx(40 * x)
    assert link.bytes == 40 * 200 * KV_BYTES_PER_TOKEN


# --- batch formation ----------------------------------------------------------------------------
def test_chunked_prefill_respects_its_token_budget_each_step():
    # a 200-token prompt under a 64-token budget: chunks 64, 64, 64, 8 -> first token after 4 steps
    topo = {"kind": "colocated", "kv_blocks": 100, "chunked_prefill": {"token_budget": 64},
            "cost_model": {"kind": "constant", "step_s": 0.01}}
    r, _ = _one(topo, prompt=200, output=3)
    assert r.first_token_s - r.arrival_s == pytest.approx(0.04, abs=1e-12)
    assert r.finish_s - r.arrival_s == pytest.approx(0.06, abs=1e-12)
    # the policy itself: one running decode + a waiting 200-token prompt -> 1 + 63 tokens
    kv = KVCache(100, 16, 0.0)
    dec = Request(0, 0.0, 10, 5)
    dec.computed, dec.generated = 10, 1
    kv.grow(dec, 11)
    new = Request(1, 0.0, 200, 5)
    running, waiting = [dec], deque([new])
    plan = chunked(running, waiting, kv, Limits(max_running=8, max_batched_tokens=64))
    assert [(r.id, n) for r, n in plan.items] == [(0, 1), (1, 63)] and plan.tokens == 64


def _running(req_id, prompt, computed, kv):
    r = Request(req_id, float(req_id), prompt, 100)
    r.computed, r.generated = computed, 1
    assert kv.grow(r, computed)
    return r


def test_preemption_evicts_the_newest_running_request():
    # 6 blocks of 4 tokens: A (oldest), B, C (newest) hold 2 each at 8 cached tokens, none free.
    # A's next token needs a third block: C, the newest, loses its KV and goes back to the front of
    # the queue; its 2 blocks let A and then B grow.
    kv = KVCache(6, 4, 0.0)
    a, b, c = _running(0, 7, 8, kv), _running(1, 7, 8, kv), _running(2, 7, 8, kv)
    a.generated = b.generated = c.generated = 2            # known = 9: one token to compute each
    c.preemptions, c.recomputed_tokens = 1, 5              # preempted once before: the counts add up
    queued = Request(3, 3.0, 4, 4)
    running, waiting = [a, b, c], deque([queued])
    plan = fcfs(running, waiting, kv, Limits(max_running=8, max_batched_tokens=64))
    assert plan.preempted == [c] and list(waiting) == [c, queued] and running == [a, b]
    assert [(r.id, n) for r, n in plan.items] == [(0, 1), (1, 1)]
    assert (c.computed, c.blocks, c.preemptions, c.recomputed_tokens) == (0, 0, 2, 5 + 8)
    assert a.blocks == b.blocks == 3 and kv.free_blocks == 0
    assert plan.lost_tokens == 8                            # C's 8 cached tokens must be computed again


@pytest.mark.parametrize("policy", [fcfs, chunked])
def test_a_request_already_in_the_step_is_never_the_victim(policy):
    # A and B each hold 2 full blocks and need a third; one block is free. A (oldest) takes it;
    # B must give up its own KV, not A's: A is already in this step's plan
    kv = KVCache(5, 4, 0.0)
    a, b = _running(0, 7, 8, kv), _running(1, 7, 8, kv)
    a.generated = b.generated = 2
    running, waiting = [a, b], deque()
    plan = policy(running, waiting, kv, Limits(max_running=8, max_batched_tokens=64))
    assert [(r.id, n) for r, n in plan.items] == [(0, 1)] and plan.preempted == [b]
    assert (a.computed, a.blocks, b.blocks, kv.free_blocks) == (8, 3, 0, 2) and list(waiting) == [b]


def test_one_growth_may_evict_two_and_both_losses_are_counted():
    # A continues its prefill by 8 tokens (2 blocks of 4); B and C decode on 1 block each; none free:
    # C, then B, lose their KV, and the step's lost tokens are both of theirs
    kv = KVCache(4, 4, 0.0)
    a = Request(0, 0.0, 16, 4)
    a.computed = 8
    assert kv.grow(a, 8)
    b, c = _running(1, 4, 4, kv), _running(2, 4, 4, kv)
    plan = chunked([a, b, c], deque(), kv, Limits(max_running=8, max_batched_tokens=64))
    assert plan.preempted == [c, b] and plan.lost_tokens == 8 and [(r.id, n) for r, n in plan.items] == [(0, 8)]


def test_fcfs_runs_a_prompt_longer_than_the_budget_whole():
    # fcfs never chunks: a 200-token prompt over a 64-token step budget is one prefill step, alone
    topo = {"kind": "colocated", "kv_blocks": 100, "max_batched_tokens": 64,
            "cost_model": {"kind": "constant", "step_s": 0.01}}
    r, _ = _one(topo, prompt=200, output=2)
    assert r.first_token_s - r.arrival_s == pytest.approx(0.01, abs=1e-12)


def test_chunked_budget_smaller_than_the_running_batch():
    # 3 running decodes, a 2-token budget: the two oldest advance one token each, nobody gets 0
    kv = KVCache(100, 16, 0.0)
    reqs = [_running(i, 9, 10, kv) for i in range(3)]
    for r in reqs:
        r.generated = 2                                     # known = 11
    plan = chunked(list(reqs), deque(), kv, Limits(max_running=8, max_batched_tokens=2))
    assert [(r.id, n) for r, n in plan.items] == [(0, 1), (1, 1)] and plan.tokens == 2
    plan = chunked(list(reqs), deque(), kv, Limits(max_running=8, max_batched_tokens=1))
    assert [(r.id, n) for r, n in plan.items] == [(0, 1)]


def test_decode_side_reservation_keeps_the_watermark():
    # KV arriving from a prefill instance is admission too: it may not eat the decode pool's headroom
    kv = KVCache(100, 16, watermark=0.1)
    assert not kv.reserve(Request(0, 0.0, 91 * 16, 2), 91 * 16) and kv.free_blocks == 100
    assert kv.reserve(Request(1, 0.0, 90 * 16, 2), 90 * 16) and kv.free_blocks == 10


def test_admission_keeps_the_watermark_spare():
    kv = KVCache(100, 16, watermark=0.1)          # 10 blocks kept for running requests to grow
    assert kv.watermark_blocks == 10
    assert kv.fits_ever(90 * 16) and not kv.fits_ever(90 * 16 + 1)
    big, ok = Request(0, 0.0, 90 * 16 + 1, 2), Request(1, 0.0, 90 * 16, 2)
    plan = fcfs([], deque([big]), kv, Limits())
    assert plan.items == [] and kv.free_blocks == 100        # 91 blocks would eat the watermark
    plan = fcfs([], deque([ok]), kv, Limits())
    assert plan.items == [(ok, 90 * 16)] and kv.free_blocks == 10
    # a running request may grow into the watermark (no admit): the headroom is for it
    assert kv.grow(ok, 95 * 16) and kv.free_blocks == 5


def test_admission_counts_the_output_growth():
    # 10 blocks of 16 = 160 tokens: prompt 150 + 11 outputs needs 160 cached tokens (the last output
    # token is never cached): fits; 12 outputs need 161 -> rejected at arrival
    topo = {"kind": "colocated", "kv_blocks": 10, "block_size": 16, "watermark": 0.0,
            "cost_model": {"kind": "constant", "step_s": 0.01}}
    r, _ = _one(topo, prompt=150, output=11)
    assert r.status == "finished"
    r, _ = _one(topo, prompt=150, output=12)
    assert r.status == "rejected" and r.reject_reason.startswith("kv_capacity")
    r, _ = _one({**topo, "watermark": 0.1}, prompt=150, output=11)     # 1 block kept spare: 9 usable
    assert r.status == "rejected"


def test_max_running_caps_the_batch():
    # max_running 2, 5 requests at once, constant steps: they are served 2, 2, 1 (prefill + 1 decode each)
    topo = {"kind": "colocated", "max_running": 2, "kv_blocks": 1000,
            "cost_model": {"kind": "constant", "step_s": 0.1}}
    sc = scenario({"c": topo}, arrival="closed", clients=5, num_requests=5, prompt_tokens=10, output_tokens=2)
    rs = simulate(sc)[0].requests
    assert sorted(r.finish_s for r in rs) == pytest.approx([0.2, 0.2, 0.4, 0.4, 0.6], abs=1e-12)


def test_decode_reservations_respect_max_running():
    # decode max_running 1: the second request's KV may only leave once the first has finished decoding
    topo = {**DIS, "decode": {**DIS["decode"], "max_running": 1}, "kv_link": {"bandwidth_GBps": 10, "latency_us": 10}}
    sc = scenario({"t": topo}, arrival="closed", clients=2, num_requests=2, prompt_tokens=1000, output_tokens=4)
    rs = sorted(simulate(sc)[0].requests, key=lambda r: r.finish_s)
    x = 10e-6 + 1000 * KV_BYTES_PER_TOKEN / 10e9
    first_done = 0.05 + x + 3 * 0.01                  # prefill, transfer, 3 decode steps
    assert rs[0].finish_s == pytest.approx(first_done, abs=1e-12)
    assert rs[1].decode_start_s == pytest.approx(first_done + x, abs=1e-12)
    assert rs[1].finish_s == pytest.approx(first_done + x + 0.03, abs=1e-12)
    assert rs[1].kv_wait_s == pytest.approx(first_done - 0.05, abs=1e-12)


def test_max_queue_rejects_exactly_beyond_the_limit():
    # batch-1 replica, 1 s steps, max_queue 2: r0 runs, r1 and r2 queue, r3 and r4 are turned away
    topo = {"kind": "colocated", "max_running": 1, "max_queue": 2, "kv_blocks": 1000,
            "cost_model": {"kind": "constant", "step_s": 1.0}}
    sc = scenario({"c": topo}, arrival="constant", rate=1e6, num_requests=5, prompt_tokens=10, output_tokens=1)
    rs = simulate(sc)[0].requests
    assert [r.status for r in rs] == ["finished"] * 3 + ["rejected"] * 2
    assert all(r.reject_reason.startswith("admission") for r in rs[3:])
    assert [r.finish_s for r in rs[:3]] == pytest.approx([1 + 1e-6, 2 + 1e-6, 3 + 1e-6])


# --- cost model and memory (public API, values from the datasheet by hand) ---------------------------
def test_tensor_parallel_step_pays_two_allreduces_per_layer():
    from pdsim.costmodel import RooflineCost
    from pdsim.devices import get_device
    from pdsim.models import get_model
    dev, m = get_device("h100-sxm"), get_model("llama-3.1-8b")
    t, tokens = 4, 512
    msg = tokens * 4096 * 2                                  # T x hidden x bf16
    # by hand from the datasheet (h100-sxm.yaml: NVLink 450 GB/s at allreduce efficiency 0.58, launch
    # 2.45 us + 0.249 us per peer): the faster of one-shot (read the t-1 peers' buffers) and two-shot
    # (reduce-scatter + all-gather: 2 (t-1)/t of the message, two launches)
    bw, base = 450e9 * 0.58, (2.45 + (t - 1) * 0.249) * 1e-6
    one = min(base + (t - 1) * msg / bw, 2 * base + 2 * (t - 1) / t * msg / bw)
    assert one == pytest.approx(2 * base + 2 * (t - 1) / t * msg / bw)          # 4 MiB: two-shot wins
    assert dev.allreduce_time(msg, t) == pytest.approx(one, rel=1e-12)
    cm, cm1 = RooflineCost(m, dev, tp=t), RooflineCost(m, dev, tp=1)
    ops = cm.breakdown(tokens, tokens * tokens / 2, tokens, 1, 1)
    # two per layer (after attention, after the MLP) and one after the vocab-parallel embedding
    assert ops["allreduce"]["time_s"] == pytest.approx((2 * 32 + 1) * one, rel=1e-12)
    assert "allreduce" not in cm1.breakdown(tokens, tokens * tokens / 2, tokens, 1, 1)
    assert cm.step(tokens, tokens * tokens / 2, tokens, 1, 1).time_s == \
        pytest.approx(sum(o["time_s"] for o in ops.values()), rel=1e-9)


def test_kv_pool_size_by_hand_with_tp_sharded_weights():
    from pdsim.topology import kv_blocks
    weights = 2 * (32 * (2 * 4096 * 4096 + 2 * 4096 * 1024 + 3 * 4096 * 14336) + 2 * 128256 * 4096)   # bf16
    gib = 1024 ** 3
    for tp in (1, 2, 4):
        pool = config.ColocatedSpec(kind="colocated", tp=tp, device="h100-sxm")
        got, block_bytes = kv_blocks(pool, resolve_model(scenario()), "bf16", "bf16", ".", "k")
        kv_per_token_gpu = KV_BYTES_PER_TOKEN / tp           # 8 KV heads split over tp GPUs
        free = 80 * gib * 0.9 - weights / tp - 2 * gib       # memory x utilisation - weight shard - activations
        assert block_bytes == 16 * kv_per_token_gpu
        assert got == int(free // (16 * kv_per_token_gpu)), tp


def test_a_request_that_needs_no_new_block_is_never_refused():
    # watermark 5 of 10 blocks; a running request took 6 (free 4 < 5): growing within its blocks, even
    # through the admission path, takes nothing and must succeed; one block more is refused there
    kv = KVCache(10, 16, watermark=0.5)
    r = Request(0, 0.0, 96, 4)
    assert kv.grow(r, 96) and kv.free_blocks == 4
    assert kv.grow(r, 96, admit=True) and kv.grow(r, 90, admit=True) and r.blocks == 6
    assert not kv.grow(r, 97, admit=True) and kv.grow(r, 97) and r.blocks == 7


def test_topology_kv_totals_count_every_gpu_and_each_instance_once():
    # two TP2 replicas, one request each (prompt 100, reply 10): the last decode step holds 100 + 9 tokens,
    # ceil(109 / 16) = 7 blocks; a block is 16 tokens x 131,072 B / 2 GPUs = 1 MiB on each of the 2 GPUs
    topo = {"kind": "colocated", "replicas": 2, "tp": 2, "kv_blocks": 100,
            "cost_model": {"kind": "constant", "step_s": 0.01}}
    sc = scenario({"t": topo}, arrival="constant", rate=1000.0, num_requests=2, prompt_tokens=100, output_tokens=10)
    (res,) = simulate(sc)
    assert len({r.instance for r in res.requests}) == 2                # one request on each replica
    s = metrics.summarize([res], metrics.requests_frame([res]), sc)["t"]
    mib = 1024 ** 2
    assert s["pools"]["replica"]["kv_peak_bytes"] == 7 * mib          # per GPU, the busiest instance
    assert s["kv_cache"]["peak_bytes"] == 2 * 7 * mib * 2             # 2 instances x 7 blocks x 2 GPUs
    assert s["kv_cache"]["capacity_bytes"] == 2 * 100 * mib * 2


# --- traffic --------------------------------------------------------------------------------------
@pytest.mark.parametrize("cv", [0.5, 1.0, 3.0])
def test_gamma_interarrival_cv_and_rate(cv):
    # 50,000 gaps: the sample CV of a gamma with shape 1/cv^2 has a relative s.e. ~ sqrt((1+1.5 cv^2)/n)
    gaps = np.diff(wl.gamma_arrivals(np.random.default_rng(1), 10.0, cv, 50_000), prepend=0.0)
    assert gaps.mean() == pytest.approx(0.1, rel=0.05)
    assert gaps.std() / gaps.mean() == pytest.approx(cv, rel=0.06)


def test_gamma_duration_window_holds_every_arrival_of_the_stream():
    # arrivals: [0, duration_s) of the process.  With cv = 10 the first guess at how many gaps reach
    # duration_s falls short for ~20% of seeds; the window must still hold every arrival that the
    # same stream, drawn long (num_requests), has before duration_s
    for seed in range(25):
        long = scenario(arrival="gamma", cv=10.0, rate=5.0, num_requests=5000).model_copy(update={"seed": seed})
        win = scenario(arrival="gamma", cv=10.0, rate=5.0, num_requests=None, duration_s=20.0)
        win = win.model_copy(update={"seed": seed})
        want = [r.arrival_s for r in generate(long, resolve_model(long)) if r.arrival_s < 20.0]
        got = [r.arrival_s for r in generate(win, resolve_model(win))]
        assert got == pytest.approx(want, rel=1e-12, abs=1e-12), seed


def test_num_requests_with_duration_s_is_cut_not_filled():
    # both given: num_requests arrivals, cut at duration_s (200/s: the 25 arrive in ~0.12 s)
    sc = scenario(arrival="gamma", cv=3.0, rate=200.0, num_requests=25, duration_s=600.0)
    assert len(generate(sc, resolve_model(sc))) == 25
    sc = scenario(arrival="poisson", rate=1.0, num_requests=1000, duration_s=10.0)
    rs = generate(sc, resolve_model(sc))
    assert 0 < len(rs) < 40 and max(r.arrival_s for r in rs) < 10.0


def test_closed_loop_think_time_separates_a_clients_requests():
    # one client, 10 ms one-token requests, 0.5 s think: sends at 0, 0.51, 1.02
    topo = {"kind": "colocated", "kv_blocks": 100, "cost_model": {"kind": "constant", "step_s": 0.01}}
    sc = scenario({"c": topo}, arrival="closed", clients=1, num_requests=3, think_s=0.5, prompt_tokens=10,
                  output_tokens=1)
    rs = sorted(simulate(sc)[0].requests, key=lambda r: r.arrival_s)
    assert [r.arrival_s for r in rs] == pytest.approx([0.0, 0.51, 1.02], abs=1e-12)
    assert [r.finish_s for r in rs] == pytest.approx([0.01, 0.52, 1.03], abs=1e-12)


def test_fault_warmup_delays_service_by_exactly_warmup_s():
    # the only replica fails at 0.5 s for 1 s plus a warm-up; a request arriving at 0.6 s waits for it
    topo = {"kind": "colocated", "kv_blocks": 100, "cost_model": {"kind": "constant", "step_s": 0.01}}
    base = scenario({"c": topo})
    for warmup in (0.0, 0.3):
        sc = base.model_copy(update={"faults": config.FaultsSpec(
            instances=[{"at_s": 0.5, "instance": "replica-0", "down_s": 1.0, "warmup_s": warmup}])})
        res = _stream(sc, [(0.6, 10, 2)])
        r = res.requests[0]
        assert r.first_token_s == pytest.approx(1.5 + warmup + 0.01, abs=1e-12), warmup
        assert r.finish_s == pytest.approx(1.5 + warmup + 0.02, abs=1e-12)
        assert res.topology.instances[0].down_s == pytest.approx(1.0 + warmup, abs=1e-12)


# --- capacity planning rules ---------------------------------------------------------------------
def test_plan_bound_counts_prefill_and_decode_time():
    # fcfs replica, step = 10 ms + 1 ms per token: a prompt token costs at least (0.01 + 8.192) / 8192 s
    # (the largest step, 8192 tokens) and an output token at least (0.01 + 0.256) / 256 s (batch of
    # max_running = 256).  100-token prompts, 10 outputs (9 decode steps): no schedule beats
    # 1 / (100 x 1.00122 ms + 9 x 1.03906 ms) = 9.13 req/s; prefill alone would allow 9.99.
    from pdsim.plan import LocalExecutor, parse_plan, run_plan
    raw = {"name": "b", "model": "llama-3.1-8b", "seed": 0,
           "workload": {"arrival": "poisson", "num_requests": 200, "prompt_tokens": 100, "output_tokens": 10},
           "slo": {"ttft_s": 5.0, "tpot_s": 1.0}, "target": {"rate": 1000},
           "search": {"devices": [{"name": "h100-sxm", "price_per_hour_usd": 1.0}],
                      "colocated": {"replicas": [1]},
                      "pool": {"kv_blocks": 100000, "cost_model": {"kind": "linear", "base_s": 0.01,
                                                                   "per_token_s": 0.001}}}}
    (row,) = run_plan(parse_plan(raw), LocalExecutor(1))["rows"]
    hand = 1 / (100 * (0.01 + 8.192) / 8192 + 9 * (0.01 + 0.256) / 256)
    assert row["bound_rate"] <= hand * (1 + 1e-9)
    assert row["bound_rate"] > 0.5 * hand and row["status"] == "below target (bound)"


def test_plan_worst_seed_rule_takes_the_worst_seed():
    from pdsim.plan import _pooled
    seeds = [{"n": 100, "ok": 95, "ttft_ok": 97, "tpot_ok": 96, "finished": 100, "ttft_p": 0.2, "tpot_p": 0.01,
              "slo_met": True},
             {"n": 100, "ok": 80, "ttft_ok": 85, "tpot_ok": 90, "finished": 100, "ttft_p": 0.5, "tpot_p": 0.03,
              "slo_met": False}]
    p = _pooled(seeds)
    assert p["min_att"] == 0.8 and p["ok"] == 175 and p["n"] == 200
    assert (p["ttft_p"], p["tpot_p"]) == (0.5, 0.03) and p["all_met"] is False


def test_mbu_is_per_gpu_bandwidth_used_whatever_the_tensor_parallelism():
    """The cost model prices a TP instance's step per GPU (its shard of the weights and KV heads), so MBU
    = bytes per GPU / (time x one GPU's bandwidth).  A decode-heavy closed loop on Llama-3.1-8B: while
    busy, each GPU streams its shard at up to the profile's memory efficiency (0.804 on h100-sxm); the
    fixed per-step costs (0.8 ms engine overhead, launches, two all-reduces per layer) weigh more as the
    shard shrinks, so the busy-time MBU falls with tp but stays above 0.5, 0.35 and 0.25 at tp 1, 2, 4.
    Dividing by the bandwidth of all the instance's GPUs understates it tp-fold (0.23 at tp 2, 0.08 at
    tp 4: the bug this test was written for)."""
    floor = {1: 0.5, 2: 0.35, 4: 0.25}
    for tp in (1, 2, 4):
        topo = {"kind": "colocated", "tp": tp, "device": "h100-sxm", "max_running": 64}
        sc = scenario({"c": topo}, arrival="closed", clients=64, num_requests=128, prompt_tokens=64,
                      output_tokens=200)
        res = simulate(sc)
        summ = metrics.summarize(res, metrics.requests_frame(res, sc.client), sc)["c"]
        u = summ["utilization"]["replica"]
        assert floor[tp] < u["mbu"] / u["busy_fraction"] < 0.804, (tp, u)
        ts = metrics.timeseries_frame(res)
        busy = ts[ts.busy_fraction > 0.99]
        assert len(busy) and floor[tp] < float((busy.mbu / busy.busy_fraction).median()) < 0.804, tp
