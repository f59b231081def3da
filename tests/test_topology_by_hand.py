"""Hand-worked tests for pdsim/topology.py written against mutmut survivors (tests/MUTANTS.md).

Every expected value is worked out by hand in the comments (tiny constant cost models, a couple of
requests); none compares pdsim with itself.
"""
from __future__ import annotations

import numpy as np
import pytest

from conftest import scenario
from pdsim import config, metrics
from pdsim.errors import ConfigError
from pdsim.simulation import resolve_model, run_topology
from pdsim.workload import Request

KV_BYTES_PER_TOKEN = 2 * 32 * 8 * 128 * 2       # llama-3.1-8b, bf16: 2 (K,V) x 32 layers x 8 kv heads x 128 x 2 B
CONST = lambda s: {"kind": "constant", "step_s": s}   # noqa: E731


def _stream(topo, rows, faults=None, **workload):
    """The topology on a hand-made stream of (arrival_s, prompt, output); ``faults``: a faults section."""
    sc = scenario({"t": topo}, **workload)
    if faults is not None:
        sc = sc.model_copy(update={"faults": config.FaultsSpec(**faults)})
    reqs = [Request(i, a, p, o) for i, (a, p, o) in enumerate(rows)]
    (name, spec), = sc.topologies.items()
    return run_topology(sc, name, spec, reqs, resolve_model(sc), 0.1)


def _dis(prefill=None, decode=None, **extra):
    return {"kind": "disaggregated",
            "prefill": {"instances": 1, "kv_blocks": 1000, "cost_model": CONST(0.05), **(prefill or {})},
            "decode": {"instances": 1, "kv_blocks": 1000, "cost_model": CONST(0.01), **(decode or {})}, **extra}


def _lone_request_under_link_faults(links):
    """1P1D (prefill 0.05 s, decode 0.01 s steps), a 1 GB/s link without latency, ``links`` faults: the one
    request (100 + 2 at 0), finished."""
    topo = _dis(kv_link={"bandwidth_GBps": 1, "latency_us": 0})
    (r,) = _stream(topo, [(0.0, 100, 2)], faults={"links": links}).requests
    return r


def test_kv_link_speed_scales_with_the_prefill_gpus_and_counts_its_bytes():
    # prefill tp=2 x pp=2: 4 GPUs each send their shard at 1 GB/s, so 4 GB/s for the instance's KV.
    # prompt 400 tokens: 400 x 131072 B = 52,428,800 B; 100 us + 52,428,800 / 4e9 = 0.0001 + 0.0131072 s
    topo = _dis(prefill={"tp": 2, "pp": 2}, kv_link={"bandwidth_GBps": 1, "latency_us": 100})
    res = _stream(topo, [(0.0, 400, 2)])
    (r,) = res.requests
    x = 1e-4 + 400 * KV_BYTES_PER_TOKEN / 4e9
    assert r.kv_transfer_s == pytest.approx(x, abs=1e-12) and r.kv_wait_s == 0.0
    (link,) = res.topology.links
    assert link.bytes == 400 * KV_BYTES_PER_TOKEN and link.transfers == 1 and link.busy_s == pytest.approx(x)


def test_capacity_rejections_at_the_boundary_by_hand():
    # colocated: 10 blocks of 16 tokens, watermark 0.1 -> int(0.1 x 10) = 1 kept spare: 9 blocks = 144 tokens.
    # A request holds prompt + output - 1 tokens of KV at most (the last token is never cached).
    topo = {"kind": "colocated", "kv_blocks": 10, "watermark": 0.1, "cost_model": CONST(0.1)}
    res = _stream(topo, [(0.0, 100, 45), (1.0, 100, 46)])
    a, b = res.requests
    # 100 + 45 - 1 = 144 tokens = 9 blocks: admitted; 100 + 46 - 1 = 145 = 10 blocks > 9: rejected on arrival
    assert a.status == "finished" and b.status == "rejected" and b.finish_s == 1.0
    assert b.reject_reason == "kv_capacity: prompt+output needs 10 KV blocks, an instance has 9"
    # disaggregated: the prefill side holds the prompt only, the decode side the whole sequence
    topo = _dis(prefill={"kv_blocks": 10, "watermark": 0.1}, decode={"kv_blocks": 20, "watermark": 0.1})
    res = _stream(topo, [(0.0, 144, 1), (1.0, 145, 1), (2.0, 100, 189), (3.0, 100, 190)])
    r0, r1, r2, r3 = res.requests
    # prompt 144 = 9 blocks fits the prefill side (9 usable); 145 = 10 does not
    assert r0.status == "finished" and r1.status == "rejected"
    assert r1.reject_reason == "kv_capacity: prompt needs 10 KV blocks, a prefill instance has 9"
    # decode: 20 - int(0.1 x 20) = 18 usable = 288 tokens; 100 + 189 - 1 = 288 fits, 100 + 190 - 1 = 289 does not
    assert r2.status == "finished" and r3.status == "rejected"
    assert r3.reject_reason == "kv_capacity: prompt+output needs 19 KV blocks, a decode instance has 18"


def test_capacity_rejection_names_the_blocks_at_a_block_boundary_by_hand():
    # the rejection text counts the blocks of prompt + output - 1 tokens: 100 + 61 - 1 = 160 = exactly 10 blocks
    # of 16 (colocated, 9 usable); disaggregated decode: 100 + 221 - 1 = 320 = exactly 20 blocks (18 usable)
    topo = {"kind": "colocated", "kv_blocks": 10, "watermark": 0.1, "cost_model": CONST(0.1)}
    (r,) = _stream(topo, [(0.0, 100, 61)]).requests
    assert r.reject_reason == "kv_capacity: prompt+output needs 10 KV blocks, an instance has 9"
    topo = _dis(decode={"kv_blocks": 20, "watermark": 0.1})
    (r,) = _stream(topo, [(0.0, 100, 221)]).requests
    assert r.reject_reason == "kv_capacity: prompt+output needs 20 KV blocks, a decode instance has 18"


def test_admission_queue_bound_by_hand():
    # one replica (instance "replica-0"), batch 1, max_queue 1, steps of 0.1 s; requests at 0, 0.01, 0.02, 0.03 (prompt 10, output 2):
    #   r0 starts at once (waiting empty); r1 queues (waiting 0 < 1); r2 finds 1 waiting >= 1: rejected;
    #   r3 likewise at 0.03 (r0 runs until 0.2, so r1 still waits)
    topo = {"kind": "colocated", "kv_blocks": 100, "max_running": 1, "max_queue": 1, "cost_model": CONST(0.1)}
    res = _stream(topo, [(0.0, 10, 2), (0.01, 10, 2), (0.02, 10, 2), (0.03, 10, 2)])
    st = [r.status for r in res.requests]
    assert st == ["finished", "finished", "rejected", "rejected"]
    assert res.requests[2].reject_reason == "admission: replica-0 has 1 requests queued (max_queue 1)"
    # r0: prefill 0-0.1, decode 0.1-0.2; r1 then 0.2-0.4
    assert res.requests[0].finish_s == pytest.approx(0.2) and res.requests[1].finish_s == pytest.approx(0.4)


def test_uneven_pipeline_link_speed_is_set_by_the_busiest_stage():
    # prefill pp=2 split 20 + 12 of llama's 32 layers, tp 1, 1 GB/s per GPU: stage 0 sends 20/32 of the bytes
    # over its one link and finishes last, so the instance's KV moves at 1e9 x 32 / 20 = 1.6e9 B/s.
    # prompt 320 tokens: 320 x 131072 B = 41,943,040 B; 10 us + 41,943,040 / 1.6e9 = 0.00001 + 0.0262144 s
    topo = _dis(prefill={"pp": 2, "pp_layers": [20, 12]}, kv_link={"bandwidth_GBps": 1, "latency_us": 10})
    res = _stream(topo, [(0.0, 320, 2)])
    (r,) = res.requests
    assert r.kv_transfer_s == pytest.approx(1e-5 + 320 * KV_BYTES_PER_TOKEN / 1.6e9, abs=1e-12)


def test_uneven_pipeline_link_speed_counts_each_stages_tensor_parallel_links():
    # the split above at tp 2: each stage's 2 GPUs send their halves of its layers' KV in parallel, so the
    # busiest stage (20/32 of the bytes) moves them over 2 links of 1 GB/s: 1e9 x 2 x 32 / 20 = 3.2e9 B/s
    t, _, _, _ = _built(_dis(prefill={"tp": 2, "pp": 2, "pp_layers": [20, 12]}, kv_link={"bandwidth_GBps": 1}))
    (link,) = t.links
    assert t.prefill.pp_layers == [20, 12] and link.bandwidth_Bps == pytest.approx(3.2e9, rel=1e-12)


@pytest.mark.parametrize("assignment, r2_on", [("least_loaded", "decode-0"), ("least_decode_work", "decode-1"),
                                               ("round_robin", "decode-0")])
def test_decode_assignment_policies_by_hand(assignment, r2_on):
    # 1 prefill (0.05 s steps), 2 decode instances (0.01 s steps), a link so fast the hand-off is ~0 s:
    #   r0 at 0.0: prompt 16, output 200 -> decode from 0.05; both idle, ties go to the first: decode-0
    #   r1 at 0.1: prompt 320, output 50 -> decode-1 under every policy (d0 holds blocks and 190 tokens to go;
    #              round robin's second pick)
    #   r2 at 0.2: prompt 16, output 5 -> assigned at 0.25:
    #     d0 holds r0 at 16 + 20 tokens = 3 blocks, ~180 tokens to decode;
    #     d1 holds r1 at 320 + 10 tokens = 21 blocks, ~40 tokens to decode.
    #     least_loaded (fewest blocks) -> d0; least_decode_work (fewest tokens to come) -> d1; round robin -> d0
    topo = _dis(decode={"instances": 2}, assignment=assignment, kv_link={"bandwidth_GBps": 1e6, "latency_us": 0})
    res = _stream(topo, [(0.0, 16, 200), (0.1, 320, 50), (0.2, 16, 5)])
    assert [r.decode_instance for r in res.requests] == ["decode-0", "decode-1", r2_on]


def test_prefill_lost_twice_during_its_kv_transfer_by_hand():
    # 1 prefill instance, linear cost 0.05 s + 1e-4 s per token; 1 GB/s link, no latency; 1 request of 800 + 3.
    #   0 - 0.13       prefill 800 tokens (0.05 + 0.08); token 1
    #   0.13 -         KV of 800 tokens on the wire (104,857,600 B / 1e9 would end at 0.2348576); decode holds 50
    #                  blocks reserved
    #   0.2  prefill-0 fails (down 0.5 s): its copy is gone at once -> the transfer is cut off after 0.07 s, the
    #        decode reservation given back; recomputed 800, fault hit 1; no prefill up: the request waits (backlog)
    #   0.7 - 0.8301   recovered: prefill prompt + 1 generated = 801 tokens (0.05 + 0.0801); token 2
    #   0.8301 -       801 tokens on the wire (104,988,672 B: it would end at 0.935088672)
    #   0.9  prefill-0 fails again (down 0.5 s) -> cut off after 0.0699 s, lost again: recomputed 800 + 801 = 1601,
    #        fault hits 2
    #   1.4 - 1.5302   prefill 802 tokens (0.05 + 0.0802); token 3 = the last: it finishes on the prefill side
    #   No transfer completed; the link was busy 0.07 + 0.0699 s and carried what the two cut transfers sent:
    #   (0.07 + 0.0699) s x 1e9 B/s = 139,900,000 B
    topo = _dis(prefill={"cost_model": {"kind": "linear", "base_s": 0.05, "per_token_s": 1e-4}},
                kv_link={"bandwidth_GBps": 1, "latency_us": 0})
    res = _stream(topo, [(0.0, 800, 3)], faults={"instances": [
        {"at_s": 0.2, "instance": "prefill-0", "down_s": 0.5}, {"at_s": 0.9, "instance": "prefill-0", "down_s": 0.5}]})
    (r,) = res.requests
    assert r.status == "finished" and r.finish_s == pytest.approx(1.5302, abs=1e-12)
    assert r.token_s == pytest.approx([0.13, 0.8301, 1.5302], abs=1e-12)
    assert r.recomputed_tokens == 1601 and r.fault_hits == 2
    (link,) = res.topology.links
    assert link.transfers == 0 and link.bytes == pytest.approx(139_900_000, abs=1e-3)
    assert link.busy_s == pytest.approx(0.07 + 0.0699, abs=1e-12)
    # each failure logged the request it took (its KV, held for the hand-off)
    assert [e["requests_lost"] for e in res.topology.fault_log] == [1, 1]
    # both reservations were given back: nothing reserved, nothing held on the decode side
    (d,) = res.topology.decode.instances
    assert (d.reserved_count, d.kv.used_blocks) == (0, 0)


def test_decode_loss_too_long_for_prefill_waits_for_a_decode_instance_by_hand():
    # prefill: 10 blocks of 16, watermark 0 -> 160 tokens; decode 0.01 s steps; a link fast enough to be ~0 s.
    # prompt 150, output 30: prefill 0 - 0.05 (token 1), decode steps end at 0.06, ..., 0.19 (14 steps by 0.2:
    # tokens 2..15). decode-0 fails at 0.2 for 0.5 s: the request knows 150 + 15 = 165 tokens > 160, so it is
    # recomputed on decode; no decode instance is up: it waits. At 0.7 decode-0 takes it: one step prefills the
    # 165 tokens and samples token 16 (0.71), 14 more steps give tokens 17..30: finish 0.71 + 0.14 = 0.85.
    # Recomputed: the KV it had cached, 150 + 14 (token 15, just sampled, had no KV yet) = 164.
    topo = _dis(prefill={"kv_blocks": 10, "watermark": 0.0}, kv_link={"bandwidth_GBps": 1e6, "latency_us": 0})
    res = _stream(topo, [(0.0, 150, 30)], faults={"instances": [{"at_s": 0.2, "instance": "decode-0", "down_s": 0.5}]})
    (r,) = res.requests
    assert r.status == "finished" and r.finish_s == pytest.approx(0.85, abs=1e-6)
    assert r.recomputed_tokens == 164 and r.fault_hits == 1 and r.instance == "decode-0"


def _colo(**extra):
    return {"kind": "colocated", "replicas": 2, "kv_blocks": 100, "cost_model": CONST(0.1), **extra}


@pytest.mark.parametrize("router", ["kv_aware", "prefix_aware", "least_outstanding"])
def test_cache_aware_routers_break_ties_to_the_first_instance(router):
    # two idle replicas, no cached prefixes, load slack 0: every cost / key ties, so the first instance wins.
    # prefix_aware's ceiling is min load + 0 = 0: an instance at exactly the ceiling is still eligible.
    topo = _colo(router=router, prefix_routing={"load_slack_tokens": 0})
    res = _stream(topo, [(0.0, 10, 2)])
    assert res.requests[0].instance == "replica-0" and res.requests[0].status == "finished"


def test_prefix_cache_sizes_at_their_bounds_by_hand():
    # llama-3.1-8b, tp 1, block 16: one block is 16 x 131072 B = 2,097,152 B = 2/1024 GiB.
    one_block_gib = 16 * KV_BYTES_PER_TOKEN / 2**30
    pc = {"capacity_blocks": 100, "host": {"capacity_GiB": one_block_gib, "bandwidth_GBps": 10}}
    # a cache as large as the pool (100 of 100 blocks) and a host tier of exactly one block are both allowed
    res = _stream(_colo(replicas=1, prefix_cache=pc), [(0.0, 10, 2)])
    assert res.requests[0].status == "finished"
    # a host tier of half a block holds no whole block: a config error naming the key
    pc["host"]["capacity_GiB"] = one_block_gib / 2
    with pytest.raises(config.ConfigError) as e:
        _stream(_colo(replicas=1, prefix_cache=pc), [(0.0, 10, 2)])
    assert e.value.key == "topologies.t.prefix_cache.host.capacity_GiB" and e.value.value == one_block_gib / 2
    assert "smaller than one KV block (2,097,152 bytes)" in str(e.value)
    # a cache larger than the pool is refused
    with pytest.raises(config.ConfigError) as e:
        _stream(_colo(replicas=1, prefix_cache={"capacity_blocks": 101}), [(0.0, 10, 2)])
    assert e.value.key == "topologies.t.prefix_cache.capacity_blocks"


def _stream_ids(topo, rows, faults=None):
    """As ``_stream``, rows (arrival_s, prompt, output, hash ids) with 16-token hash blocks."""
    sc = scenario({"t": topo})
    if faults is not None:
        sc = sc.model_copy(update={"faults": config.FaultsSpec(**faults)})
    reqs = [Request(i, a, p, o, hash_ids=ids, hash_block_tokens=16) for i, (a, p, o, ids) in enumerate(rows)]
    (name, spec), = sc.topologies.items()
    return run_topology(sc, name, spec, reqs, resolve_model(sc), 0.1)


def test_requests_lost_in_a_failure_bypass_the_queue_bound_by_hand():
    # one replica, max_queue 2, batch up to 4, 0.1 s steps; three requests (prompt 10, output 2) at 0, 0.01, 0.02:
    #   r0 runs from 0; r1 and r2 queue (0 and 1 waiting < 2).  replica-0 fails at 0.05 for 0.5 s: all three are
    #   lost and wait in the backlog (3 > the bound of 2 x 1 instance: a lost request is not a new arrival, it is
    #   never refused); at 0.55 all three go back to replica-0 (again past its queue bound of 2), one step
    #   prefills the three (0.55 - 0.65), the next gives each its second token: all finish at 0.75
    topo = {"kind": "colocated", "kv_blocks": 100, "max_running": 4, "max_queue": 2, "cost_model": CONST(0.1)}
    res = _stream(topo, [(0.0, 10, 2), (0.01, 10, 2), (0.02, 10, 2)],
                  faults={"instances": [{"at_s": 0.05, "instance": "replica-0", "down_s": 0.5}]})
    assert [r.status for r in res.requests] == ["finished"] * 3
    assert [r.finish_s for r in res.requests] == pytest.approx([0.75] * 3, abs=1e-9)
    assert [r.fault_hits for r in res.requests] == [1, 1, 1]
    assert res.topology.fault_log == [{"instance": "replica-0", "at_s": 0.05, "until_s": 0.55, "requests_lost": 3}]


def test_arrivals_while_every_instance_is_down_wait_up_to_max_queue_per_instance_by_hand():
    # two replicas, max_queue 1, both down 0 - 1.0 s: the backlog takes 1 x 2 instances = 2 arrivals (0.1, 0.2);
    # the third (0.3) finds 2 waiting and is rejected with the reason below.  At 1.0 both come back; the two
    # backlogged requests start at once (least outstanding: one on each replica), prompt then second token in
    # two 0.1 s steps: both finish at 1.2
    topo = {"kind": "colocated", "replicas": 2, "kv_blocks": 100, "max_queue": 1, "cost_model": CONST(0.1)}
    res = _stream(topo, [(0.1, 10, 2), (0.2, 10, 2), (0.3, 10, 2)],
                  faults={"instances": [{"at_s": 0.0, "instance": "replica-0", "down_s": 1.0},
                                        {"at_s": 0.0, "instance": "replica-1", "down_s": 1.0}]})
    r0, r1, r2 = res.requests
    assert (r0.status, r1.status, r2.status) == ("finished", "finished", "rejected")
    assert r2.finish_s == 0.3
    assert r2.reject_reason == "admission: every replica instance is down and 2 requests wait (max_queue 1 per instance)"
    assert (r0.finish_s, r1.finish_s) == pytest.approx((1.2, 1.2), abs=1e-9)
    # one replica: its bound is 1 x 1; the second arrival is rejected
    topo["replicas"] = 1
    res = _stream(topo, [(0.1, 10, 2), (0.2, 10, 2)],
                  faults={"instances": [{"at_s": 0.0, "instance": "replica-0", "down_s": 1.0}]})
    assert [r.status for r in res.requests] == ["finished", "rejected"]
    assert res.requests[1].reject_reason == ("admission: every replica instance is down and 1 requests wait "
                                             "(max_queue 1 per instance)")


def test_abandonment_from_the_queue_and_from_the_backlog_by_hand():
    # one replica, batch 1, 0.1 s steps, clients give up 0.15 s after sending without a first token.
    #   r0 (10 + 5) at 0: tokens at 0.1 .. 0.5: it has its first token at 0.15, so it stays: finishes 0.5
    #   r1 (10 + 2) at 0: queued behind r0 (batch 1), no token at 0.15: abandoned then
    #   and is out of the queue: r3 (10 + 2) at 0.48 runs next, 0.5 - 0.7 (first token at 0.6, before its 0.63)
    #   replica-0 down 0.8 - 1.8; r2 (10 + 2) at 0.9 waits in the backlog: abandoned at 1.05, the backlog empty
    topo = {"kind": "colocated", "kv_blocks": 100, "max_running": 1, "cost_model": CONST(0.1)}
    res = _stream(topo, [(0.0, 10, 5), (0.0, 10, 2), (0.48, 10, 2), (0.9, 10, 2)], timeout_s=0.15,
                  faults={"instances": [{"at_s": 0.8, "instance": "replica-0", "down_s": 1.0}]})
    r0, r1, r3, r2 = res.requests
    assert (r0.status, r1.status, r2.status, r3.status) == ("finished", "abandoned", "abandoned", "finished")
    assert r3.token_s == pytest.approx([0.6, 0.7], abs=1e-9)
    assert (r0.finish_s, r1.finish_s, r2.finish_s) == pytest.approx((0.5, 0.15, 1.05), abs=1e-9)
    assert (r1.generated, r1.token_s, r0.token_s) == (0, [], pytest.approx([0.1, 0.2, 0.3, 0.4, 0.5]))
    (inst,) = res.topology.instances
    assert res.topology.backlog == [] and len(inst.waiting) == 0


def test_a_prefill_copy_lost_on_the_wire_bypasses_the_backlog_bound_by_hand():
    # prefill: linear 0.05 s + 1e-4 s per token, max_queue 1; 1 GB/s link, no latency; decode 0.01 s steps.
    #   r0 (800 + 3) at 0: prefill 0 - 0.13, its KV on the wire from 0.13 (800 x 131072 B / 1e9 to 0.2348576)
    #   r1 (100 + 2) at 0.15: prefill-0's step 0.15 - 0.21
    #   0.2: prefill-0 fails for 0.5 s: r1's step is lost (fault hit 1, nothing computed yet): the backlog;
    #        r0's copy is gone at once (recomputed 800, fault hit 1): the backlog too, past its bound (1 >= 1)
    #   0.7: both to prefill-0 (r1 then r0, past the queue bound of 1); one step prefills 100 + 801 tokens
    #        (0.05 + 0.0901 = 0.1401 s): 0.8401.  On the link r1 first: 13,107,200 B = 0.0131072 s, decode one
    #        step: 0.8632072; r0 after it: 801 x 131072 = 104,988,672 B = 0.104988672 s, one step: 0.968195872
    topo = _dis(prefill={"cost_model": {"kind": "linear", "base_s": 0.05, "per_token_s": 1e-4}, "max_queue": 1},
                kv_link={"bandwidth_GBps": 1, "latency_us": 0})
    res = _stream(topo, [(0.0, 800, 3), (0.15, 100, 2)],
                  faults={"instances": [{"at_s": 0.2, "instance": "prefill-0", "down_s": 0.5}]})
    r0, r1 = res.requests
    assert (r0.status, r1.status) == ("finished", "finished")
    assert (r0.recomputed_tokens, r0.fault_hits, r1.fault_hits) == (800, 1, 1)
    assert res.topology.fault_log[0]["requests_lost"] == 2
    assert r1.finish_s == pytest.approx(0.8632072, abs=1e-9)
    assert r0.finish_s == pytest.approx(0.968195872, abs=1e-9)


def test_overlapping_link_outages_release_the_waiting_transfer_at_the_last_end_by_hand():
    # prefill 0.05 s steps, decode 0.01 s, 1 GB/s link.  The link goes down at 0.02 for 0.5 s and again at 0.1
    # for 0.5 s (the two overlap); r0 (100 + 2) is prefilled by 0.05 and its KV waits for the link.  The link
    # is down while any outage is (faults compose by the minimum fraction): the first outage's end (0.52)
    # leaves it down, the second's (0.6) brings it back; 0.6 + 100 x 131072 / 1e9 = 0.6131072, one decode
    # step: 0.6231072
    r = _lone_request_under_link_faults([{"at_s": 0.02, "duration_s": 0.5}, {"at_s": 0.1, "duration_s": 0.5}])
    assert r.status == "finished" and r.finish_s == pytest.approx(0.6231072, abs=1e-9)
    assert r.kv_wait_s == pytest.approx(0.55, abs=1e-9)


@pytest.mark.parametrize("order", [1, -1])
def test_back_to_back_link_faults_hand_over_at_the_shared_instant_by_hand(order):
    # faults-link-down's pattern, scaled down: down 0.02 - 0.1, then 10% 0.1 - 1.1 (in either list order).
    # r0 (100 + 2) is prefilled by 0.05 and waits for the link; at 0.1 the outage ends as the 10% fault
    # begins: 100 x 131072 B at 1e8 B/s = 0.131072 s -> on decode at 0.231072, one decode step: 0.241072.
    # (A restore that set the link back to full speed ran it at 1 GB/s: 0.1131072.)
    r = _lone_request_under_link_faults([{"at_s": 0.02, "duration_s": 0.08, "bandwidth_fraction": 0.0},
                                         {"at_s": 0.1, "duration_s": 1.0, "bandwidth_fraction": 0.1}][::order])
    assert r.kv_wait_s == pytest.approx(0.05, abs=1e-9)
    assert r.kv_transfer_s == pytest.approx(0.131072, abs=1e-9)
    assert r.finish_s == pytest.approx(0.241072, abs=1e-9)


@pytest.mark.parametrize("order", [1, -1])
def test_overlapping_degraded_links_run_at_the_smallest_fraction_by_hand(order):
    # two faults over 0 - 10 s at 50% and 25%: the link runs at 25% whichever is listed last:
    # 100 x 131072 B / 2.5e8 B/s = 0.0524288 s
    r = _lone_request_under_link_faults([{"at_s": 0.0, "duration_s": 10.0, "bandwidth_fraction": 0.5},
                                         {"at_s": 0.0, "duration_s": 10.0, "bandwidth_fraction": 0.25}][::order])
    assert r.kv_transfer_s == pytest.approx(0.0524288, abs=1e-12)


def test_a_link_that_goes_down_twice_holds_each_transfer_until_it_is_back_by_hand():
    # as above; outages 0.02 - 0.12 and 1.0 - 1.2.  r0 (100 + 2) at 0: prefilled at 0.05, on the wire at 0.12,
    # 0.1331072, decode step 0.1431072.  r1 (100 + 2) at 1.0: prefilled at 1.05, waits for the link's second
    # return (1.2): 1.2131072, 1.2231072.  (A link whose "restored" event stays triggered after the first
    # outage would spin forever at 1.05: a mutant of KVLink.degrade hangs this test; mutmut times it out.)
    topo = _dis(kv_link={"bandwidth_GBps": 1, "latency_us": 0})
    res = _stream(topo, [(0.0, 100, 2), (1.0, 100, 2)], faults={"links": [{"at_s": 0.02, "duration_s": 0.1},
                                                                          {"at_s": 1.0, "duration_s": 0.2}]})
    r0, r1 = res.requests
    assert (r0.finish_s, r1.finish_s) == pytest.approx((0.1431072, 1.2231072), abs=1e-9)
    assert (r0.kv_wait_s, r1.kv_wait_s) == pytest.approx((0.07, 0.15), abs=1e-9)


@pytest.mark.parametrize("weight, b_on", [(0.0, "replica-1"), (1.0, "replica-0")])
def test_kv_aware_reads_the_configured_overlap_weight_by_hand(weight, b_on):
    # two replicas with prefix caching, 0.1 s steps.  A (64 + 20, ids 1-4) at 0 goes to replica-0 (a tie);
    # after its first step replica-0 caches its 4 pages.  B (same 64-token prompt, output 2) at 0.15:
    #   replica-0: weight x (64 - 48 cached: the hit stops below the last token, (64 - 1) // 16 = 3 blocks)
    #              + A's outstanding tokens (at most 64 + 20 - 1 - 64 = 19);  replica-1: weight x 64 + 0.
    #   weight 1 (the default): at most 16 + 19 = 35 < 64: replica-0.  weight 0: at least 1 (A still has tokens
    #   to compute) > 0: replica-1.
    ids = [1, 2, 3, 4]
    topo = _colo(router="kv_aware", prefix_cache={"enabled": True},
                 prefix_routing={"overlap_weight": weight})
    res = _stream_ids(topo, [(0.0, 64, 20, ids), (0.15, 64, 2, ids)])
    assert [r.instance for r in res.requests] == ["replica-0", b_on]


@pytest.mark.parametrize("router", ["kv_aware", "prefix_aware"])
def test_cache_aware_routers_ask_no_cache_of_a_pool_without_prefix_caching(router):
    # requests carry hash ids but the pool caches no prefixes: every cached count is 0, the first (tied) replica
    # takes the first request, the least loaded (replica-1, idle) the second at 0.05 while the first runs
    topo = _colo(router=router)
    res = _stream_ids(topo, [(0.0, 64, 2, [1, 2, 3, 4]), (0.05, 64, 2, [1, 2, 3, 4])])
    assert [r.instance for r in res.requests] == ["replica-0", "replica-1"]
    assert [r.finish_s for r in res.requests] == pytest.approx([0.2, 0.25], abs=1e-9)


def test_prefix_cache_capacity_bounds_the_cached_blocks_by_hand():
    # one replica, 100 blocks, cache capacity 2 blocks.  A request of 64 prompt tokens (ids 1-4: 4 one-block
    # pages) + 2 out leaves its 4 prompt pages to the cache when it finishes; only 2 blocks may stay cached:
    # 2 evictable blocks left, all 100 blocks free (evictable blocks count as free)
    topo = _colo(replicas=1, prefix_cache={"enabled": True, "capacity_blocks": 2})
    res = _stream_ids(topo, [(0.0, 64, 2, [1, 2, 3, 4])])
    (inst,) = res.topology.instances
    assert res.requests[0].status == "finished"
    assert (inst.kv.lru_blocks, inst.kv.free_blocks) == (2, 100)


def test_a_hand_off_waits_for_a_decode_instance_to_come_back_by_hand():
    # decode-0 is down 0 - 0.5; r0 (100 + 2) is prefilled by 0.05 and waits with its KV on the prefill side.
    # At 0.5 decode-0 is back and picked: 100 x 131072 B at 1 GB/s = 0.0131072 s, one decode step:
    # 0.5 + 0.0131072 + 0.01 = 0.5231072; held 0.45 s on the prefill side
    topo = _dis(kv_link={"bandwidth_GBps": 1, "latency_us": 0})
    res = _stream(topo, [(0.0, 100, 2)], faults={"instances": [{"at_s": 0.0, "instance": "decode-0", "down_s": 0.5}]})
    (r,) = res.requests
    assert r.status == "finished" and r.finish_s == pytest.approx(0.5231072, abs=1e-9)
    assert r.kv_wait_s == pytest.approx(0.45, abs=1e-9) and r.decode_instance == "decode-0"


def test_reservations_in_flight_count_toward_the_decode_batch_limit_by_hand():
    # decode max_running 2; three requests (100 + 3) prefilled together by 0.05 (0.05 s steps); 1 GB/s link,
    # 0.0131072 s per transfer.  r0 and r1 reserve (2 in flight = the limit), r2 waits for room:
    #   r0 on the wire 0.05 - 0.0631072, decode steps end 0.0731072, 0.0831072 (r0 done: 3 tokens)
    #   r1 on the wire to 0.0762144, joins at 0.0831072: tokens 0.0931072, 0.1031072
    #   r2 reserves when r0 leaves (0.0831072), wire to 0.0962144, joins at 0.1031072: 0.1131072, 0.1231072
    topo = _dis(decode={"max_running": 2}, kv_link={"bandwidth_GBps": 1, "latency_us": 0})
    res = _stream(topo, [(0.0, 100, 3)] * 3)
    r0, r1, r2 = res.requests
    assert [r.finish_s for r in res.requests] == pytest.approx([0.0831072, 0.1031072, 0.1231072], abs=1e-9)
    assert r2.kv_wait_s == pytest.approx(0.0831072 - 0.05, abs=1e-9)


def test_a_degraded_link_moves_kv_at_its_fraction_of_the_bandwidth_by_hand():
    # the link at half speed 0 - 1 s: 100 x 131072 B / (1e9 x 0.5) = 0.0262144 s; finish 0.05 + 0.0262144 + 0.01
    topo = _dis(kv_link={"bandwidth_GBps": 1, "latency_us": 0})
    res = _stream(topo, [(0.0, 100, 2)], faults={"links": [{"at_s": 0.0, "duration_s": 1.0,
                                                            "bandwidth_fraction": 0.5}]})
    (r,) = res.requests
    assert r.kv_transfer_s == pytest.approx(0.0262144, abs=1e-12)
    assert r.finish_s == pytest.approx(0.0862144, abs=1e-9)


def test_a_link_that_goes_down_mid_transfer_pauses_it_until_it_is_back_by_hand():
    # r0 (1000 + 2) prefilled 0 - 0.05; its KV goes at 0.05: W = 1000 x 131072 B / 1e9 = 0.131072 s + 100 us.
    # The link goes down at 0.1 for 60 s: 0.05 s of W sent, 0.081072 s left, sent from 60.1: 60.181072,
    # plus the latency: on decode at 60.181172, one decode step: 60.191172.  The link was busy 0.131172 s.
    topo = _dis(kv_link={"bandwidth_GBps": 1, "latency_us": 100})
    res = _stream(topo, [(0.0, 1000, 2)], faults={"links": [{"at_s": 0.1, "duration_s": 60.0}]})
    (r,) = res.requests
    assert r.kv_wait_s == 0.0 and r.decode_start_s == pytest.approx(60.181172, abs=1e-9)
    assert r.kv_transfer_s == pytest.approx(60.131172, abs=1e-9)
    assert r.finish_s == pytest.approx(60.191172, abs=1e-9)
    (link,) = res.topology.links
    assert link.busy_s == pytest.approx(0.131172, abs=1e-9)


@pytest.mark.parametrize("at_s, duration_s, end", [
    # half speed from 0.1 for 1 s: 0.05 s at 1e9 B/s sent 50,000,000 B; 81,072,000 B left at 5e8 B/s =
    # 0.162144 s: 0.262144, plus 100 us: 0.262244
    (0.1, 1.0, 0.262244),
    # half speed 0 - 0.1 s: 0.05 - 0.1 at 5e8 B/s sent 25,000,000 B; 106,072,000 B left at full speed from
    # 0.1: 0.106072 s: 0.206072, plus 100 us: 0.206172
    (0.0, 0.1, 0.206172)])
def test_a_link_degraded_or_restored_mid_transfer_re_rates_the_bytes_left_by_hand(at_s, duration_s, end):
    topo = _dis(kv_link={"bandwidth_GBps": 1, "latency_us": 100})
    res = _stream(topo, [(0.0, 1000, 2)], faults={"links": [{"at_s": at_s, "duration_s": duration_s,
                                                             "bandwidth_fraction": 0.5}]})
    (r,) = res.requests
    assert r.decode_start_s == pytest.approx(end, abs=1e-9)
    assert r.kv_transfer_s == pytest.approx(end - 0.05, abs=1e-9)
    (link,) = res.topology.links
    assert link.busy_s == pytest.approx(end - 0.05, abs=1e-9)     # sending all along, no pause


def test_a_decode_failure_mid_transfer_forgets_its_reservation_by_hand():
    # decode max_running 1.  r0 (800 + 2): prefill 0 - 0.05, reserves decode-0 (1 of 1) and goes on the wire
    # (800 x 131072 B = 0.1048576 s at 1 GB/s).  decode-0 fails at 0.1 (down 0.2): its reservation vanished with
    # its memory, and the transfer stops there (0.05 s sent: 50,000,000 B): r0 waits for a decode instance; at
    # 0.3 decode-0 is back, with no reservation left (1 would block it for ever), takes r0 again:
    # 0.3 + 0.1048576 + one step 0.01 = 0.4148576.  One transfer completed; 50,000,000 + 104,857,600 B moved
    topo = _dis(decode={"max_running": 1}, kv_link={"bandwidth_GBps": 1, "latency_us": 0})
    res = _stream(topo, [(0.0, 800, 2)], faults={"instances": [{"at_s": 0.1, "instance": "decode-0", "down_s": 0.2}]})
    (r,) = res.requests
    assert r.status == "finished" and r.finish_s == pytest.approx(0.4148576, abs=1e-9)
    (link,) = res.topology.links
    assert link.transfers == 1 and link.bytes == pytest.approx(154_857_600, abs=1e-3)
    assert link.busy_s == pytest.approx(0.05 + 0.1048576, abs=1e-12)
    (d,) = res.topology.decode.instances
    assert d.reserved_count == 0


def test_a_decode_failure_stops_its_transfers_at_once_and_frees_the_link_by_hand():
    # 1 prefill (0.05 s steps, batch 1), 2 decode instances (0.01 s steps); a link of 1 s per 100-token KV:
    # 100 x 131072 B = 13,107,200 B at 13.1072 MB/s, no latency.  r0 (100 + 3) at 0, r1 (100 + 3) at 0.05.
    #   0 - 0.05      prefill r0; it reserves decode-0 (least loaded, first on a tie) and goes on the wire
    #   0.05 - 0.10   prefill r1; it reserves decode-1 (decode-0 holds r0's 7 blocks) and queues for the link
    #   0.55          decode-0 fails (down 10 s): r0's transfer stops at once (half its KV sent: 6,553,600 B),
    #                 the link goes to r1 at once: 0.55 - 1.55, decode 1.56, 1.57 (r1 done).  r0 picks decode-1
    #                 (the only one up) and queues behind r1: 1.55 - 2.55, decode 2.56, 2.57.
    #   r0 held its KV from 0.05 to 1.55 on the prefill side (kv_wait 1.5, transfer 1.0); r1 from 0.10 to 0.55
    #   Link: 2 transfers completed, 2.5 x 13,107,200 B = 32,768,000 B moved, busy 2.5 s
    bw = 100 * KV_BYTES_PER_TOKEN / 1e9
    topo = _dis(prefill={"max_running": 1}, decode={"instances": 2}, kv_link={"bandwidth_GBps": bw, "latency_us": 0})
    res = _stream(topo, [(0.0, 100, 3), (0.05, 100, 3)],
                  faults={"instances": [{"at_s": 0.55, "instance": "decode-0", "down_s": 10.0}]})
    r0, r1 = res.requests
    assert (r0.decode_instance, r1.decode_instance) == ("decode-1", "decode-1")
    assert r1.decode_start_s == pytest.approx(1.55, abs=1e-9) and r1.finish_s == pytest.approx(1.57, abs=1e-9)
    assert (r1.kv_wait_s, r1.kv_transfer_s) == pytest.approx((0.45, 1.0), abs=1e-9)
    assert r0.decode_start_s == pytest.approx(2.55, abs=1e-9) and r0.finish_s == pytest.approx(2.57, abs=1e-9)
    assert (r0.kv_wait_s, r0.kv_transfer_s) == pytest.approx((1.5, 1.0), abs=1e-9)
    assert (r0.fault_hits, r1.fault_hits) == (1, 0)      # the failure took r0's decode reservation, not r1's
    (link,) = res.topology.links
    assert link.transfers == 2 and link.bytes == pytest.approx(2.5 * 100 * KV_BYTES_PER_TOKEN, abs=1e-3)
    assert link.busy_s == pytest.approx(2.5, abs=1e-9)
    assert [(d.reserved_count, d.kv.used_blocks) for d in res.topology.decode.instances] == [(0, 0), (0, 0)]


def test_decode_queue_takes_no_fault_recovery_time_by_hand():
    # 1P1D (prefill 0.05 s steps, decode 0.01 s), a link of ~0 s (x = 100 x 131072 B / 1e15 B/s = 1.31072e-8 s).
    # r0 (100 + 10): prefill 0 - 0.05 (token 1), on decode at 0.05 + x, tokens 2, 3, 4 at 0.06, 0.07, 0.08 (+ x).
    # decode-0 fails at 0.085 (down 1 s): the KV is gone, r0 is prefilled again 0.085 - 0.135 (104 tokens,
    # token 5) and its hand-off waits for decode-0 until 1.085 (kv_wait 0.95), on decode at 1.085 + x, tokens
    # 6..10: finish 1.135 + x.  Components: queue 0, prefill 0.05, KV wait 0.95, transfer x, decode queue 0
    # (the KV is taken the moment it arrives; before: 0.085, the decode work lost and the prefill done again,
    # measured from the first prefill's end), the rest (0.135) is decoding with the fault's recompute in it.
    x = 100 * KV_BYTES_PER_TOKEN / 1e15
    topo = _dis(kv_link={"bandwidth_GBps": 1e6, "latency_us": 0})
    res = _stream(topo, [(0.0, 100, 10)], faults={"instances": [{"at_s": 0.085, "instance": "decode-0",
                                                                 "down_s": 1.0}]})
    (r,) = res.requests
    assert r.finish_s == pytest.approx(1.135 + x, abs=1e-9) and r.fault_hits == 1
    assert r.decode_start_s == pytest.approx(1.085 + x, abs=1e-9)
    df = metrics.requests_frame([res])
    got = [float(df[c][0]) for c in ("queue_s", "prefill_s", "kv_wait_s", "kv_transfer_s", "decode_queue_s")]
    assert got == pytest.approx([0.0, 0.05, 0.95, x, 0.0], abs=1e-9)


def test_decode_queue_is_the_wait_for_the_step_in_flight_by_hand():
    # 1P1D, prefill 0.05 s steps (batch 1), decode 0.03 s steps, a link of ~0 s (x = 100 x 131072 B / 1e15 B/s).
    # r0 (100 + 10) at 0: prefill 0 - 0.05, on decode at 0.05 + x, decode steps from 0.05 + x every 0.03 s.
    # r1 (100 + 3) at 0.05: prefill 0.05 - 0.10, on decode at 0.10 + x, mid-step (0.08 + x - 0.11 + x): it joins
    # the next step at 0.11 + x (decode queue 0.01), tokens 2, 3 at 0.14 + x, 0.17 + x.  r0 joined an idle
    # instance: 0.  The same step by step and with the fast path's windows.
    x = 100 * KV_BYTES_PER_TOKEN / 1e15
    for fast in (True, False):
        topo = _dis(prefill={"max_running": 1}, decode={"cost_model": CONST(0.03)},
                    kv_link={"bandwidth_GBps": 1e6, "latency_us": 0})
        sc = scenario({"t": topo})
        reqs = [Request(0, 0.0, 100, 10), Request(1, 0.05, 100, 3)]
        (name, spec), = sc.topologies.items()
        res = run_topology(sc, name, spec, reqs, resolve_model(sc), 0.1, fast=fast)
        r0, r1 = res.requests
        assert r1.decode_start_s == pytest.approx(0.10 + x, abs=1e-12)
        assert r1.decode_step_s == pytest.approx(0.11 + x, abs=1e-9)
        assert r1.finish_s == pytest.approx(0.17 + x, abs=1e-9)
        df = metrics.requests_frame([res])
        assert df.decode_queue_s.tolist() == pytest.approx([0.0, 0.01], abs=1e-9)


def test_decode_queue_of_a_request_preempted_before_its_first_decode_step_by_hand():
    # Decode pool of 4 blocks (no watermark), 0.01 s steps; default link.  A (40 + 10) decodes from 0.05 + x_A.
    # B (16 + 5, at 0.01) is prefilled 0.05 - 0.10 and its KV lands mid-step; the next plan preempts it, the
    # newest, for A's growth, and it waits on the decode instance until A leaves; the step that first carries
    # it starts as A finishes: its decode queue is that wait (not NaN), with and without the fast path.
    for fast in (True, False):
        topo = _dis(decode={"kv_blocks": 4, "watermark": 0.0, "cost_model": CONST(0.01)})
        sc = scenario({"t": topo})
        (name, spec), = sc.topologies.items()
        res = run_topology(sc, name, spec, [Request(0, 0.0, 40, 10), Request(1, 0.01, 16, 5)], resolve_model(sc),
                           0.1, fast=fast)
        a, b = res.requests
        assert b.preemptions == 1 and b.status == "finished"
        assert b.decode_step_s == pytest.approx(a.finish_s, abs=1e-12)
        df = metrics.requests_frame([res])
        assert df.decode_queue_s[1] == pytest.approx(a.finish_s - b.decode_start_s, abs=1e-12)
        assert 0.03 < df.decode_queue_s[1] < 0.05


def test_requests_lost_on_decode_go_back_to_prefill_past_its_queue_bound_by_hand():
    # prefill batch 1, max_queue 1 (0.05 s steps); decode 0.01 s steps; a link of ~0 s.
    #   r0 (10 + 50) decodes from 0.05 (tokens every 0.01 s); r1 (10 + 2) at 0.2 prefills 0.2 - 0.25;
    #   r2 (10 + 2) at 0.21 queues behind it (0 < 1).  decode-0 fails at 0.22 (down 0.1): r0's KV is gone;
    #   it goes back to prefill although 1 request already waits there (a lost request is not an arrival)
    topo = _dis(prefill={"max_running": 1, "max_queue": 1}, kv_link={"bandwidth_GBps": 1e6, "latency_us": 0})
    res = _stream(topo, [(0.0, 10, 50), (0.2, 10, 2), (0.21, 10, 2)],
                  faults={"instances": [{"at_s": 0.22, "instance": "decode-0", "down_s": 0.1}]})
    assert [r.status for r in res.requests] == ["finished"] * 3
    assert res.requests[0].fault_hits == 1


def test_full_reservation_on_a_prefix_caching_decode_pool_reserves_the_whole_sequence_by_hand():
    # decode: 9 blocks, prefix caching, kv_reservation full.  Two requests (16 + 100) prefilled together by 0.05;
    # a link of ~0 s.  r0 reserves its whole sequence, 16 + 100 - 1 = 115 tokens = 8 blocks, at the hand-off;
    # r1 cannot (1 free) and waits until r0 finishes: 99 decode steps of 0.01 s each, 0.05 + 0.99 = 1.04 and
    # 1.04 + 0.99 = 2.03 (reserving only the 16 transferred tokens, 1 block each, both would decode at once)
    topo = _dis(decode={"kv_blocks": 9, "prefix_cache": {"enabled": True}, "kv_reservation": "full"},
                kv_link={"bandwidth_GBps": 1e6, "latency_us": 0})
    res = _stream(topo, [(0.0, 16, 100), (0.0, 16, 100)])
    assert [r.finish_s for r in res.requests] == pytest.approx([1.04, 2.03], abs=1e-6)
    assert [r.preemptions for r in res.requests] == [0, 0]


def test_two_prefix_hits_admitted_in_one_step_leave_no_outstanding_tokens_by_hand():
    # one replica with prefix caching, 0.1 s steps.  r0 (64 + 2, ids 1-4) runs 0 - 0.2 and caches its 4 pages.
    # r1 and r2 (the same 64-token prompt, + 2) arrive at 0.15 and 0.16 and are admitted together at 0.2, each
    # with a hit of (64 - 1) // 16 = 3 blocks = 48 tokens: the step computes 16 + 16 tokens; both finish at 0.4.
    # The instance's outstanding tokens count both hits off (48 + 48): 0 left at the end
    ids = [1, 2, 3, 4]
    topo = _colo(replicas=1, prefix_cache={"enabled": True})
    res = _stream_ids(topo, [(0.0, 64, 2, ids), (0.15, 64, 2, ids), (0.16, 64, 2, ids)])
    assert [r.finish_s for r in res.requests] == pytest.approx([0.2, 0.4, 0.4], abs=1e-9)
    (inst,) = res.topology.instances
    assert (inst.outstanding_tokens, inst.decode_work) == (0, 0)
    assert inst.kv.stats.gpu_hit_tokens == 96


def test_least_loaded_counts_reserved_blocks_once():
    # decode-0 holds 10 blocks, all reserved for KV still on the wire (a reservation takes its blocks from the
    # pool: they are in kv.used_blocks); decode-1 holds 15 for two running requests.  The least loaded is
    # decode-0 (10 < 15); adding reserved_blocks on top would count them twice (20 > 15) and pick decode-1
    from types import SimpleNamespace as NS
    from pdsim.topology import least_loaded
    d0 = NS(name="decode-0", kv=NS(used_blocks=10), reserved_blocks=10, running=[], sync=lambda: None)
    d1 = NS(name="decode-1", kv=NS(used_blocks=15), reserved_blocks=0, running=[1, 2], sync=lambda: None)
    assert least_loaded()([d1, d0], None) is d0
    # ties on blocks: the smaller batch
    d0.kv.used_blocks = 15
    assert least_loaded()([d1, d0], None) is d0


# --- construction paths (tests/MUTANTS.md, branch muttopo2): kv_blocks / _uneven_stage_blocks survivors ---------
def _build_error(topo, model=None):
    from pdsim.errors import ConfigError
    w = {"arrival": "poisson", "rate": 1.0, "num_requests": 1, "prompt_tokens": 10, "output_tokens": 2}
    with pytest.raises(ConfigError) as e:
        sc = config.parse({"seed": 0, "model": model or "llama-3.1-8b", "workload": w, "topologies": {"t": topo}},
                          "test.yaml")
        (name, spec), = sc.topologies.items()
        run_topology(sc, name, spec, [Request(0, 0.0, 10, 2)], resolve_model(sc), 0.1)
    return e.value


def test_a_constant_cost_pool_checks_expert_parallelism_when_sizing_its_kv_pool():
    # a constant / linear cost model never reads ep, so make_cost does not check it: kv_blocks is the only place
    # a dense model with ep=2 is refused, and the error must name the pool's own key, not a bare "ep"
    topo = {"kind": "colocated", "tp": 2, "ep": 2, "device": "h100-sxm", "cost_model": CONST(0.1)}
    err = _build_error(topo)
    assert err.key == "topologies.t.ep" and "dense" in str(err)


def test_a_constant_cost_pool_checks_dp_attention_when_sizing_its_kv_pool():
    # likewise DP attention: a dense model has no experts to pair it with; kv_blocks refuses it under the pool's key
    topo = {"kind": "colocated", "tp": 2, "dp_attention": True, "device": "h100-sxm", "cost_model": CONST(0.1)}
    err = _build_error(topo)
    assert err.key == "topologies.t.dp_attention" and "dense" in str(err)


def test_an_uneven_pipeline_stage_that_does_not_fit_names_the_device_memory_by_hand():
    # DeepSeek-V3 in bf16 over 3 stages of one H200 each: a stage holds ~20 of 61 layers, far above the device.
    # The message quotes the device file's memory, 131.3 GiB (pdsim/data/devices/h200.yaml), and ends with the advice
    topo = {"kind": "colocated", "pp": 3, "device": "h200", "cost_model": CONST(0.1)}
    err = _build_error(topo, model="deepseek-v3")
    msg = str(err)
    assert err.key == "topologies.t.device" and "pipeline stage 0" in msg
    assert "(131.3 GiB x " in msg and msg.endswith("raise tp or use a larger device")


def test_a_constant_cost_pool_sized_from_an_unknown_device_names_the_pools_device_key():
    # no kv_blocks given: kv_blocks loads the device to size the pool (a constant cost model never loads it)
    topo = {"kind": "colocated", "device": "no-such-gpu", "cost_model": CONST(0.1)}
    err = _build_error(topo)
    assert err.key == "topologies.t.device"


# --- construction paths, third session (branch muttopo3): check_sliding, kv_blocks' end, make_cost -------
# llama-3.1-8b by hand (HF config: 32 layers, hidden 4096, 32 heads, 8 KV heads of 128, MLP 14336, vocab
# 128256, untied embeddings): attention 4096 x 4096 x 2 (q, o) + 2 x 4096 x 1024 (k, v) = 41,943,040 and
# MLP 3 x 4096 x 14336 = 176,160,768 parameters a layer: 218,103,808; x 32 = 6,979,321,856; + 2 x 128256 x
# 4096 = 1,050,673,152 (embedding, LM head) = 8,029,995,008 parameters, 16,059,990,016 B in bf16
# = 15,316 MiB exactly (14.957 GiB).  A 16-token KV block at tp 1: 16 x 131,072 B = 2,097,152 B = 2 MiB.
LLAMA8_WEIGHT_MIB = 15316
BLOCK_MIB = 2


def _device_file(tmp_path, memory_GiB, name="tiny-gpu"):
    """An H100 SXM profile with another name and memory size, written beside the scenario (tmp_path)."""
    from pdsim.devices import DATA_DIR
    text = (DATA_DIR / "h100-sxm.yaml").read_text()
    assert "memory_GiB: 80\n" in text and "name: h100-sxm\n" in text
    text = text.replace("memory_GiB: 80\n", f"memory_GiB: {memory_GiB!r}\n").replace("name: h100-sxm\n",
                                                                                      f"name: {name}\n")
    (tmp_path / f"{name}.yaml").write_text(text)
    return f"{name}.yaml"          # a path relative to the scenario's directory, not to the working directory


def _on_device_file(tmp_path, topo, relative=False):
    """Build topology t from a scenario file in tmp_path and serve one 10-token request (output 2) on it.
    The scenario makes a relative device path absolute (config.Scenario._resolve_device_paths); ``relative``
    hands ``build`` the pool spec with the path as written, as a library caller may: the topology then finds
    it through the context's base_dir (the scenario's directory), never the working directory."""
    w = {"arrival": "poisson", "rate": 1.0, "num_requests": 1, "prompt_tokens": 10, "output_tokens": 2}
    sc = config.parse({"seed": 0, "model": "llama-3.1-8b", "workload": w, "topologies": {"t": topo}},
                      str(tmp_path / "s.yaml"), base_dir=tmp_path)
    (name, spec), = sc.topologies.items()
    if relative:
        spec = spec.model_copy(update={"device": topo["device"]})
    return run_topology(sc, name, spec, [Request(0, 0.0, 10, 2)], resolve_model(sc), 0.1)


SLIDING_REFUSALS = [
    # (model, pool fields, key, value, reason): the four things check_sliding refuses, each one line
    ({"sliding_layers": 2}, {}, "model.sliding_layers", 2,
     "a model whose every layer is sliding-window is not modelled (the KV pool counts blocks of the "
     "full-attention layers); keep at least one full layer"),
    ({}, {"prefix_cache": {"enabled": True}}, "topologies.t.prefix_cache.enabled", True,
     "prefix caching with sliding-window layers is not modelled (a cached prefix would need the sliding "
     "layers' window blocks at its end)"),
    ({"mtp_layers": 1}, {"speculative": {"method": "mtp", "k": 2, "acceptance": 0.5}},
     "topologies.t.speculative", "mtp",
     "speculative decoding with sliding-window layers is not modelled"),
    ({}, {"dp_attention": True, "tp": 2}, "topologies.t.dp_attention", True,
     "DP attention with sliding-window layers is not modelled"),
]


@pytest.mark.parametrize("model,pool,key,value,reason", SLIDING_REFUSALS)
def test_sliding_window_refusals_name_the_key_the_value_and_the_reason(model, pool, key, value, reason):
    # a 2-layer model, one layer sliding over 4 tokens (tests/test_sliding_window.py's TINY), on a constant-cost
    # pool: make_cost's check_sliding refuses each combination before anything else is sized, in one line
    # "key = repr(value): reason" (pdsim/errors.py's format)
    tiny = {"name": "tiny-swa", "layers": 2, "hidden": 256, "heads": 4, "kv_heads": 2, "mlp_width": 512,
            "vocab": 1000, "sliding_window": 4, "sliding_layers": 1, **model}
    topo = {"kind": "colocated", "kv_blocks": 100, "cost_model": CONST(0.01), **pool}
    err = _build_error(topo, model=tiny)
    assert (err.key, err.reason) == (key, reason)
    assert err.value == value and type(err.value) is type(value)
    assert str(err).endswith(f"{key} = {value!r}: {reason}")


@pytest.mark.parametrize("relative", [False, True])
@pytest.mark.parametrize("cost_model", [CONST(0.1), {"kind": "roofline"}])
def test_a_device_with_room_for_exactly_one_kv_block_keeps_it_by_hand(tmp_path, cost_model, relative):
    # utilisation 1.0, no activation reserve: free = memory - weights.  A device of 15,316 + 2 MiB
    # = 15,318 MiB = 14.958984375 GiB (exact in binary, so free is exactly 2,097,152 B) has room for
    # exactly one block: kv_blocks keeps it (free < block_bytes is the only refusal).  The device is a file
    # beside the scenario, so it is found through the scenario's directory (a constant-cost pool loads it
    # only to size the KV pool; a roofline pool also to price steps)
    dev = _device_file(tmp_path, (LLAMA8_WEIGHT_MIB + BLOCK_MIB) / 1024)
    topo = {"kind": "colocated", "device": dev, "gpu_memory_utilization": 1.0, "activation_reserve_GiB": 0,
            "watermark": 0.0, "cost_model": cost_model}
    res = _on_device_file(tmp_path, topo, relative)
    (inst,) = res.topology.instances
    assert inst.kv.total_blocks == 1 and res.requests[0].status == "finished"   # 10 + 2 - 1 = 11 tokens: 1 block
    # 1000.5 blocks of room (15,316 + 2,001 MiB = 17,317 MiB = 16.9111328125 GiB): 1000 whole blocks
    dev = _device_file(tmp_path, (LLAMA8_WEIGHT_MIB + 1000.5 * BLOCK_MIB) / 1024, name="tiny-gpu-2")
    (inst,) = _on_device_file(tmp_path, {**topo, "device": dev}, relative).topology.instances
    assert inst.kv.total_blocks == 1000 and inst.block_bytes == 2_097_152


@pytest.mark.parametrize("pp,shown", [(1, "15.0 GiB per GPU at tp=1)"), (2, "7.5 GiB per GPU at tp=1 pp=2)")])
def test_weights_that_do_not_fit_the_device_name_it_with_the_numbers_by_hand(tmp_path, pp, shown):
    # a 4 GiB device x 0.9 = 3.6 GiB, less than the weights: pp 1 holds all 14.957 GiB -> "15.0"; pp 2 holds
    # 16 layers + the embedding on stage 0 and 16 layers + the LM head on stage 1, the same on both:
    # 16 x 218,103,808 x 2 B + 128256 x 4096 x 2 B = 8,029,995,008 B = 7.4785 GiB -> "7.5", an even split
    # (the message names no stage).  Activation reserve 2.0 GiB (the default)
    dev = _device_file(tmp_path, 4.0)
    topo = {"kind": "colocated", "device": dev, "pp": pp, "cost_model": CONST(0.1)}
    with pytest.raises(ConfigError) as e:
        _on_device_file(tmp_path, topo)
    err = e.value
    assert (err.key, err.value) == ("topologies.t.device", str(tmp_path / dev))   # made absolute by the scenario
    assert err.reason == (f"llama-3.1-8b weights ({shown} plus 2.0 GiB activations do not fit tiny-gpu "
                          "(4.0 GiB x 0.9); raise tp or use a larger device")


def _lone_instance(tmp_path, model, topo: dict):
    """The one instance of a single-topology scenario after serving one 10 + 2-token request (it sizes its
    KV pool as any run would)."""
    w = {"arrival": "poisson", "rate": 1.0, "num_requests": 1, "prompt_tokens": 10, "output_tokens": 2}
    sc = config.parse({"seed": 0, "model": model, "workload": w, "topologies": {"t": topo}},
                      str(tmp_path / "s.yaml"), base_dir=tmp_path)
    (name, spec), = sc.topologies.items()
    res = run_topology(sc, name, spec, [Request(0, 0.0, 10, 2)], resolve_model(sc), 0.1)
    (inst,) = res.topology.instances
    return inst


TINY_MOE = {"name": "tiny-moe", "layers": 4, "hidden": 1024, "heads": 8, "kv_heads": 8, "head_dim": 128,
            "mlp_width": 1024, "vocab": 1000, "experts": 64, "experts_per_token": 2, "expert_width": 1024,
            "dense_layers": 3}


def test_a_two_stage_pipeline_split_unevenly_keeps_the_fewest_blocks_either_stage_fits_by_hand(tmp_path):
    # a 4-layer MoE model (hidden 1024, 8 heads = 8 KV heads of 128, vocab 1000), its first 3 layers dense
    # (MLP 1024), the last one 64 experts of width 1024; pp 2 split [3, 1]; bf16, tp 1; device 0.5 GiB
    # = 536,870,912 B, utilisation 1.0, no activation reserve.
    #   attention a layer 1024 x 1024 x 4 = 4,194,304; dense MLP = one expert = 3 x 1024 x 1024 = 3,145,728
    #   stage 0: 3 x (4,194,304 + 3,145,728) x 2 B + embedding 1000 x 1024 x 2 B = 44,040,192 + 2,048,000
    #            = 46,088,192 B
    #   stage 1: attention 8,388,608 B + 64 experts x 6,291,456 B = 402,653,184 B + router 1024 x 64 x 2 B
    #            = 131,072 B + LM head 2,048,000 B = 413,220,864 B (the heavier stage)
    #   KV a token: 2 x 4 layers x 8 x 128 x 2 B = 16,384 B; stage 0 holds 3/4: 12,288 B, a block 196,608 B
    #            (the busiest stage); stage 1 holds 1/4: 4,096 B, a block 65,536 B
    #   stage 0 fits (536,870,912 - 46,088,192) // 196,608 = 2496 blocks, stage 1 (536,870,912 - 413,220,864)
    #   // 65,536 = 1886: every stage keeps 1886.  (The heavier stage's weights with the busiest stage's block,
    #   as an even split is sized, would give 123,650,048 // 196,608 = 628.)
    moe = TINY_MOE
    dev = _device_file(tmp_path, 0.5)
    topo = {"kind": "colocated", "device": dev, "pp": 2, "pp_layers": [3, 1], "gpu_memory_utilization": 1.0,
            "activation_reserve_GiB": 0, "cost_model": CONST(0.1)}
    inst = _lone_instance(tmp_path, moe, topo)
    assert inst.kv.total_blocks == 1886 and inst.block_bytes == 196_608


ROOFLINE_REFUSALS = [
    # (pool fields, key, value, reason) for llama-3.1-8b (32 layers, 32 heads, dense) on a roofline pool:
    # make_cost checks the layout before pricing anything, each error under the pool's own key
    ({"tp": 3}, "topologies.t.tp", 3, "tensor parallelism must divide the 32 attention heads of llama-3.1-8b"),
    ({"pp": 33}, "topologies.t.pp", 33,
     "pipeline parallelism needs 1 to 32 stages (the 32 layers of llama-3.1-8b, at least one a stage)"),
    ({"pp": 2, "pp_layers": [10, 10]}, "topologies.t.pp_layers", [10, 10],      # 20 of the 32 layers
     "give one layer count per stage: 2 whole numbers >= 1 summing to the 32 layers of llama-3.1-8b"),
    ({"tp": 2, "ep": 2}, "topologies.t.ep", 2, "expert parallelism needs a mixture-of-experts model; "
     "llama-3.1-8b is dense"),
    ({"tp": 2, "dp_attention": True}, "topologies.t.dp_attention", True,
     "DP attention pairs data-parallel attention with expert-parallel MoE layers; llama-3.1-8b is dense"),
    ({"expert_skew": 1.5}, "topologies.t.expert_skew", 1.5,
     "expert popularity skew needs a mixture-of-experts model; llama-3.1-8b is dense"),
]


@pytest.mark.parametrize("pool,key,value,reason", ROOFLINE_REFUSALS)
def test_a_roofline_pool_refuses_a_layout_the_model_cannot_take_under_its_own_key(pool, key, value, reason):
    err = _build_error({"kind": "colocated", "device": "h100-sxm", **pool})
    assert (err.key, err.reason) == (key, reason)
    assert err.value == value and type(err.value) is type(value)


@pytest.mark.parametrize("kv_blocks", [None, 100])
def test_a_dp_attention_pool_sums_its_ranks_blocks_by_hand(tmp_path, kv_blocks):
    # TINY_MOE with DP attention over tp = ep = 2 (constant cost), bf16, a 0.5 GiB device at utilisation 1.0,
    # no activation reserve.  Each GPU is an attention rank holding its requests' whole KV (all 8 KV heads):
    #   KV a token 2 x 4 layers x 8 x 128 x 2 B = 16,384 B; a 16-token block 262,144 B on one GPU
    #   weights on a GPU: everything but the routed experts whole, the experts / 2:
    #     decoder 3 x (4,194,304 + 3,145,728) + 4,194,304 + 64 x 3,145,728 + 65,536 = 227,606,528 parameters,
    #     of them routed 201,326,592 and router 65,536: (26,214,400 x 2 B) + embedding and LM head
    #     2 x 1000 x 1024 x 2 B + 201,326,592 x 2 B / 2 + 65,536 x 2 B
    #     = 52,428,800 + 4,096,000 + 201,326,592 + 131,072 = 257,982,464 B
    #   a GPU fits (536,870,912 - 257,982,464) // 262,144 = 1063 blocks; the instance 2 x 1063 = 2126, each block
    #   262,144 B on one of the 2 GPUs: 131,072 B per GPU on average (what KV-link and host-tier bytes read)
    # (attention sharded over tp 2 instead would hold 4 KV heads a GPU: 131,072 B blocks, 2127 a GPU.)
    # With kv_blocks given the count is taken as is; the bytes are the same.
    dev = _device_file(tmp_path, 0.5)
    topo = {"kind": "colocated", "device": dev, "tp": 2, "ep": 2, "dp_attention": True,
            "gpu_memory_utilization": 1.0, "activation_reserve_GiB": 0, "cost_model": CONST(0.1)}
    if kv_blocks is not None:
        topo["kv_blocks"] = kv_blocks
    inst = _lone_instance(tmp_path, TINY_MOE, topo)
    assert inst.kv.total_blocks == (2126 if kv_blocks is None else 100) and type(inst.kv.total_blocks) is int
    assert inst.block_bytes == 131_072


def _tiny_moe_pp2(tmp_path, memory_GiB, **pool):
    """TINY_MOE on pp 2 split [3, 1] (constant cost) on a device file of memory_GiB, one request."""
    dev = _device_file(tmp_path, memory_GiB)
    topo = {"kind": "colocated", "device": dev, "pp": 2, "pp_layers": [3, 1], "cost_model": CONST(0.1), **pool}
    w = {"arrival": "poisson", "rate": 1.0, "num_requests": 1, "prompt_tokens": 10, "output_tokens": 2}
    sc = config.parse({"seed": 0, "model": TINY_MOE, "workload": w, "topologies": {"t": topo}},
                      str(tmp_path / "s.yaml"), base_dir=tmp_path)
    (name, spec), = sc.topologies.items()
    return run_topology(sc, name, spec, [Request(0, 0.0, 10, 2)], resolve_model(sc), 0.1)


def test_an_uneven_pipeline_stage_with_room_for_exactly_one_block_keeps_it_by_hand(tmp_path):
    # the split of test_a_two_stage_pipeline_split_unevenly_...: stage 1 holds 413,220,864 B of weights and
    # 65,536 B blocks.  A device of 413,220,864 + 65,536 = 413,286,400 B (an exact binary fraction of a GiB),
    # utilisation 1.0, no reserve: stage 1 has room for exactly one block (stage 0: (413,286,400 - 46,088,192)
    # // 196,608 = 1867), so every stage keeps 1
    res = _tiny_moe_pp2(tmp_path, 413_286_400 / 2**30, gpu_memory_utilization=1.0, activation_reserve_GiB=0)
    (inst,) = res.topology.instances
    assert inst.kv.total_blocks == 1 and res.requests[0].status == "finished"


def test_an_uneven_pipeline_stage_that_does_not_fit_names_its_weights_by_hand(tmp_path):
    # 2.3 GiB x 1.0 - 2.0 GiB activations = 0.3 GiB = 322,122,547 B free before weights: stage 0 (46,088,192 B)
    # fits, stage 1 (413,220,864 B = 0.385 GiB -> "0.4") does not; the message names stage 1 and its weights
    with pytest.raises(ConfigError) as e:
        _tiny_moe_pp2(tmp_path, 2.3, gpu_memory_utilization=1.0)
    assert e.value.key == "topologies.t.device"
    assert e.value.reason == ("tiny-moe weights (0.4 GiB per GPU of pipeline stage 1 at tp=1 pp=2) plus 2.0 GiB "
                              "activations do not fit tiny-gpu (2.3 GiB x 1.0); raise tp or use a larger device")


def test_a_roofline_pool_on_an_unknown_device_names_the_pools_device_key():
    # a roofline pool loads its device in make_cost, before the KV pool is sized: the error names the pool's key
    err = _build_error({"kind": "colocated", "device": "no-such-gpu", "kv_blocks": 100})
    assert (err.key, err.value) == ("topologies.t.device", "no-such-gpu")
    assert err.reason.startswith("unknown device; valid presets: ")


@pytest.mark.parametrize("moe_tables", [False, True])
def test_a_pools_moe_tables_choice_reaches_its_cost_model_by_hand(tmp_path, moe_tables):
    # tests/test_costmodel_by_hand.py's TINY_MOE (hidden 8, routed experts of width 8, top-2 of 4) on an H100
    # profile whose measured MoE table says the routed experts take 7 ms at 1, 2 and 4 tokens, flat.  With
    # cost_model.moe_tables the pool's step prices them at the table's 7 ms (one "experts" op); without it, the
    # roofline's grouped GEMMs (no "experts" op)
    from pdsim.topology import make_cost
    dev = _device_file(tmp_path, 80.0)
    with open(tmp_path / dev, "a") as f:
        f.write('measured: {device: cuda, moe: [{hidden: 8, inter: 8, topk: 2, experts: 4, dtype: bf16, '
                'tokens: [1, 2, 4], time_s: [0.007, 0.007, 0.007]}]}\n')
    moe = {"name": "tiny-moe", "layers": 2, "hidden": 8, "heads": 2, "kv_heads": 1, "head_dim": 4, "mlp_width": 16,
           "vocab": 32, "experts": 4, "experts_per_token": 2, "shared_experts": 1, "expert_width": 8,
           "dense_layers": 1}
    w = {"arrival": "poisson", "rate": 1.0, "num_requests": 1, "prompt_tokens": 10, "output_tokens": 2}
    topo = {"kind": "colocated", "device": dev, "kv_blocks": 100,
            "cost_model": {"kind": "roofline", "moe_tables": moe_tables}}
    sc = config.parse({"seed": 0, "model": moe, "workload": w, "topologies": {"t": topo}},
                      str(tmp_path / "s.yaml"), base_dir=tmp_path)
    cm = make_cost(sc.topologies["t"], resolve_model(sc), "bf16", "bf16", tmp_path, "topologies.t")
    ops = cm.breakdown(2, 6.0, 8, 2, 2)            # a decode of 2 at context 3
    if moe_tables:
        assert ops["experts"]["time_s"] == pytest.approx(7e-3, rel=1e-12) and ops["experts"]["source"] == "exact"
    else:
        assert "experts" not in ops and "experts_gate_up" in ops


def _roofline_cost(model, **pool):
    from pdsim.topology import make_cost
    w = {"arrival": "poisson", "rate": 1.0, "num_requests": 1, "prompt_tokens": 10, "output_tokens": 2}
    sc = config.parse({"seed": 0, "model": model, "workload": w,
                       "topologies": {"t": {"kind": "colocated", "device": "h100-sxm", "kv_blocks": 100, **pool}}},
                      "test.yaml")
    return make_cost(sc.topologies["t"], resolve_model(sc), "bf16", "bf16", None, "topologies.t")


def test_a_roofline_pool_hands_its_layout_to_the_cost_model_by_hand():
    # DP attention over tp = ep = 2 (TINY_MOE: 8 query and 8 KV heads): each GPU is an attention rank of its own,
    # attention TP 1, so a GPU runs all 8 query and 8 KV heads (tensor-parallel attention would run 4 and 4)
    cm = _roofline_cost(TINY_MOE, tp=2, ep=2, dp_attention=True)
    assert (cm.attn_dp, cm.q_heads, cm.kv_heads_shard) == (2, 8, 8)
    cm = _roofline_cost(TINY_MOE, tp=2, ep=2)
    assert (cm.attn_dp, cm.q_heads, cm.kv_heads_shard) == (1, 4, 4)
    # an explicit split [3, 1] (vLLM's default for 4 layers is [2, 2]): the roofline's stages are 3 dense layers,
    # then the one MoE layer, as (dense, MoE) layers
    cm = _roofline_cost(TINY_MOE, pp=2, pp_layers=[3, 1])
    assert cm.stages._split == (3, 1) and cm.stages._stages == [(3, 0), (0, 1)]
    # expert popularity skew 1 over 4 experts, top 2: popularity 1, 1/2, 1/3, 1/4 (sum 25/12), so a token routes to
    # expert e with probability 2 x p_e / (25/12) = 0.96, 0.48, 0.32, 0.24 (none above 1: nothing capped)
    moe4 = {"name": "moe4", "layers": 2, "hidden": 8, "heads": 2, "kv_heads": 1, "head_dim": 4, "mlp_width": 16,
            "vocab": 32, "experts": 4, "experts_per_token": 2, "expert_width": 8}
    cm = _roofline_cost(moe4, expert_skew=1.0)
    assert cm.expert_skew == 1.0 and list(cm._hot_q) == pytest.approx([0.96, 0.48, 0.32, 0.24], rel=1e-12)
    assert _roofline_cost(moe4)._hot_q is None          # no skew: uniform routing, k/E = 0.5 each


# --- construction paths, fourth session (branch muttopo4): Pool.__init__, Disaggregated.__init__, build ------
def _built(topo, model="llama-3.1-8b", tmp_path=None, bin_s=0.25, fast=True, **top):
    """``build`` called directly, as simulation.run_topology does (nothing run): (topology, env, sink, context).
    ``top``: scenario fields (seed, kv_dtype, weight_dtype); ``tmp_path``: the scenario's directory."""
    from pathlib import Path

    import simpy

    from pdsim.simulation import Context, Sink
    from pdsim.topology import build
    w = {"arrival": "poisson", "rate": 1.0, "num_requests": 1, "prompt_tokens": 10, "output_tokens": 2}
    d = {"seed": 0, "model": model, "workload": w, "topologies": {"t": topo}, **top}
    sc = config.parse(d, str(tmp_path / "s.yaml") if tmp_path else "test.yaml",
                      **({"base_dir": tmp_path} if tmp_path else {}))
    env = simpy.Environment()
    sink = Sink(env)
    ctx = Context(resolve_model(sc), sc.weight_dtype, sc.kv_dtype, Path(sc.base_dir), bin_s, fast, sc.seed)
    return build("t", sc.topologies["t"], env, ctx, sink), env, sink, ctx


def test_build_wires_every_pool_and_instance_of_a_disaggregated_topology_by_hand():
    # fp8 KV: llama-3.1-8b holds 2 x 32 layers x 8 KV heads x 128 x 1 B = 65,536 B a token; a 16-token block
    # is 1,048,576 B, split over the prefill side's tp 2 GPUs (4 KV heads each): 524,288 B a GPU.
    # Both pools constant-cost with kv_blocks given: no device is loaded, so no price but the one given
    # (3.6 $/GPU-hour on prefill, 0.0 on decode), no power model.  kv_reservation full: the decode side reserves
    # the whole sequence, the prefill side (it hands off after the prompt) only the prompt.  Decode keeps the
    # defaults: max_batched_tokens 8192, watermark 0.01 (int(0.01 x 500) = 5 blocks spare; prefill int(0.05 x 1000)
    # = 50); ctx.fast on, but a prefill instance never opens multi-step windows.
    from pdsim.scheduler import Limits
    topo = {"kind": "disaggregated",
            "prefill": {"instances": 2, "tp": 2, "kv_blocks": 1000, "cost_model": CONST(0.05), "watermark": 0.05,
                        "price_per_gpu_hour_usd": 3.6, "max_running": 8, "max_batched_tokens": 512,
                        "kv_reservation": "full"},
            "decode": {"instances": 3, "kv_blocks": 500, "cost_model": CONST(0.01), "block_size": 32,
                       "max_running": 16, "kv_reservation": "full"},
            "kv_link": {"bandwidth_GBps": 2, "latency_us": 50}}
    t, env, sink, ctx = _built(topo, kv_dtype="fp8")
    assert (t.name, t.env, t.sink, t.model) == ("t", env, sink, ctx.model) and t.kind == "disaggregated"
    p, d = t.prefill, t.decode
    assert t.pools == [p, d] and (p.name, p.role, d.name, d.role) == ("prefill", "prefill", "decode", "decode")
    assert [i.name for i in t.instances] == ["prefill-0", "prefill-1", "decode-0", "decode-1", "decode-2"]
    assert t.entry == p.instances and len(p.instances) == 2 and len(d.instances) == 3
    assert (p.initial_instances, p.peak_instances, d.initial_instances, d.peak_instances) == (2, 2, 3, 3)
    assert (p.gpus, d.gpus) == (4, 3) and p.pp_layers is None and d.pp_layers is None
    assert (p.device, p.power, p.spec_dec, d.device, d.power, d.spec_dec) == (None,) * 6
    assert p.price_per_gpu_hour_usd == 3.6
    assert d.price_per_gpu_hour_usd == 0.0 and type(d.price_per_gpu_hour_usd) is float
    assert (p.block_bytes, d.block_bytes) == (524_288, 2 * 1_048_576)          # decode: 32-token blocks at tp 1
    for pool, spec, role, gpus, limits, blocks, size, water in (
            (p, t.spec.prefill, "prefill", 2, Limits(8, 512, False, None), 1000, 16, int(0.05 * 1000)),
            (d, t.spec.decode, "decode", 1, Limits(16, 8192, True, None), 500, 32, int(0.01 * 500))):
        for inst in pool.instances:
            assert (inst.env, inst.pool, inst.role, inst.gpus, inst.sink) == (env, pool.name, role, gpus, t)
            assert inst.cost is pool.cost and inst.pool_spec is spec and inst.limits == limits
            assert (inst.kv.total_blocks, inst.kv.block_size, inst.kv.watermark_blocks) == (blocks, size, water)
            assert inst.block_bytes == pool.block_bytes and inst.reserved_count == 0
            assert inst.series.bin_s == 0.25 and inst.power is None and inst.spec is None
            assert inst.fast is (role != "prefill")     # a prefill instance hands off after one step: no windows
    assert len({id(i.kv) for i in t.instances}) == 5    # a KV pool of its own each
    # one link per prefill instance, 2 GB/s per GPU x 2 GPUs, 50 us
    assert [(l.name, l.bandwidth_Bps) for l in t.links] == [("kv-link-prefill-0", 4e9), ("kv-link-prefill-1", 4e9)]
    assert all(l.latency_s == pytest.approx(5e-5, rel=1e-12) for l in t.links)
    assert t.link_of == {"prefill-0": t.links[0], "prefill-1": t.links[1]}
    assert (t.kv_bytes_per_token, t.window, t.window_kv_bytes) == (65_536, None, 0)
    assert t.pending == {"decode-0": [], "decode-1": [], "decode-2": []}
    assert (t.decode_up, t.decode_backlog, t.xfer_hit, t.backlog) == ([], [], {}, [])
    assert t.transfer_bytes_saved == 0.0 and type(t.transfer_bytes_saved) is float


def test_build_hands_a_colocated_topology_its_name_environment_and_sink():
    t, env, sink, _ = _built({"kind": "colocated", "replicas": 2, "kv_blocks": 100, "cost_model": CONST(0.1)},
                             fast=False)
    assert (t.name, t.env, t.sink, t.kind) == ("t", env, sink, "colocated")
    assert [(i.name, i.pool, i.role, i.fast) for i in t.instances] == [("replica-0", "replica", "both", False),
                                                                      ("replica-1", "replica", "both", False)]


def test_a_shared_kv_link_is_one_link_for_every_prefill_instance_by_hand():
    # shared: one "kv-link" for the pool; its speed is still one instance's: 3 GB/s x tp 2 x pp 2 GPUs = 12 GB/s
    topo = _dis(prefill={"instances": 3, "tp": 2, "pp": 2},
                kv_link={"bandwidth_GBps": 3, "latency_us": 7, "shared": True})
    t, env, _, _ = _built(topo)
    (link,) = t.links
    assert (link.name, link.bandwidth_Bps) == ("kv-link", 12e9)
    assert link.latency_s == pytest.approx(7e-6, rel=1e-12) and link.res._env is env
    assert t.link_of == {"prefill-0": link, "prefill-1": link, "prefill-2": link}
    t, env, _, _ = _built({**topo, "kv_link": {**topo["kv_link"], "shared": False}})
    assert all(l.res._env is env for l in t.links)
    assert [l.latency_s for l in t.links] == pytest.approx([7e-6] * 3, rel=1e-12)


@pytest.mark.parametrize("side", ["prefill", "decode"])
def test_a_disaggregated_pools_errors_name_its_own_key(side):
    # each pool is built under topologies.<name>.<side>: a roofline pool of tp 3 (llama's 32 heads) is refused there
    topo = _dis(**{side: {"tp": 3, "cost_model": {"kind": "roofline"}}})
    err = _build_error(topo)
    assert (err.key, err.value) == (f"topologies.t.{side}.tp", 3)


def test_an_autoscaled_disaggregated_topology_builds_each_pool_up_to_its_max():
    # schedule 1P1D -> 3P2D at 5 s: the pools' max are the largest targets, 3 and 2; instances beyond the
    # initial count are built (off) up front
    topo = _dis(autoscaler={"policy": "schedule", "schedule": [{"at_s": 5.0, "prefill": 3, "decode": 2}]})
    t, _, _, _ = _built(topo)
    assert [i.name for i in t.instances] == ["prefill-0", "prefill-1", "prefill-2", "decode-0", "decode-1"]
    assert (t.prefill.initial_instances, t.decode.initial_instances) == (1, 1)
    assert sorted(t.link_of) == ["prefill-0", "prefill-1", "prefill-2"] and len(t.pending) == 2


@pytest.mark.parametrize("topo, device, price", [
    # a constant cost model with kv_blocks given needs no device: none loaded, no price unless given
    ({"kv_blocks": 100, "cost_model": CONST(0.1)}, None, 0.0),
    ({"kv_blocks": 100, "cost_model": CONST(0.1), "price_per_gpu_hour_usd": 3.6}, None, 3.6),
    # the KV pool sized from the device (no kv_blocks), or a roofline pool: the device file's price, 2.99 $/h
    ({"cost_model": CONST(0.1)}, "h100-sxm", 2.99),
    ({"kv_blocks": 100}, "h100-sxm", 2.99),
    ({"kv_blocks": 100, "price_per_gpu_hour_usd": 3.6}, "h100-sxm", 3.6),       # a given price wins
])
def test_a_pool_loads_its_device_only_when_it_needs_one_and_takes_its_price_by_hand(topo, device, price):
    t, _, _, _ = _built({"kind": "colocated", **topo})
    (pool,) = t.pools
    assert getattr(pool.device, "name", None) == device
    assert pool.price_per_gpu_hour_usd == price and type(pool.price_per_gpu_hour_usd) is float
    # h100-sxm.yaml: power {idle_W: 70, max_W: 700}; 989 TFLOP/s bf16, 3350 GB/s: each instance's energy
    # inputs are 1 / peak FLOP/s and 1 / peak B/s
    if device is None:
        assert pool.power is None and t.instances[0].power is None
    else:
        pm = pool.power
        assert (pm.idle_W, pm.max_W, pm.clock_fraction, pm.cap_W) == (70, 700, 1.0, None)
        (inv_flops, inv_Bps), = {i.power for i in t.instances}      # (approx's abs 1e-12 would hide these)
        assert (1 / inv_flops, 1 / inv_Bps) == pytest.approx((989e12, 3350e9), rel=1e-12)


def test_a_power_capped_pool_slows_compute_bound_steps_by_the_cube_law_by_hand():
    # fp8 weights on an H100 (1979 TFLOP/s fp8), cap 385 W: clock fraction ((385 - 70) / (700 - 70))^(1/3)
    # = 0.5^(1/3) = 0.7937; the capped peak is 1979e12 x 0.7937 FLOP/s, memory bandwidth unchanged (3350 GB/s)
    f = 0.5 ** (1 / 3)
    base = {"kind": "colocated", "replicas": 2, "kv_blocks": 100}
    free, _, _, _ = _built(base, weight_dtype="fp8")
    capped, _, _, _ = _built({**base, "power_cap_W": 385}, weight_dtype="fp8")
    pm = capped.pools[0].power
    assert (pm.cap_W, pm.max_W, pm.idle_W) == (385, 385, 70) and pm.clock_fraction == pytest.approx(f, rel=1e-12)
    assert pm.peak_flops == pytest.approx(1979e12 * f, rel=1e-12) and pm.peak_Bps == 3350e9
    for inst in capped.instances:
        assert (1 / inst.power[0], 1 / inst.power[1]) == pytest.approx((1979e12 * f, 3350e9), rel=1e-12)
        assert inst.cost is capped.pools[0].cost
    inv_flops, inv_Bps = free.instances[0].power
    assert (1 / inv_flops, 1 / inv_Bps) == pytest.approx((1979e12, 3350e9), rel=1e-12)
    # a 4096-token prefill is compute-bound (~2 x 8e9 x 4096 = 6.6e13 FLOPs: ~33 ms at full clock, against ~8 GB
    # of fp8 weights: ~2.4 ms of memory), so the whole step stretches by 1 / f = 2^(1/3); a decode of one
    # request is memory-bound (~16 GFLOPs: 8 us, 10 us capped, under ~2.4 ms of weights): unchanged
    fc, cc = free.pools[0].cost, capped.pools[0].cost
    assert cc.prefill_time(4096) == pytest.approx(fc.prefill_time(4096) * 2 ** (1 / 3), rel=1e-9)
    assert cc.decode_time(1, 100) == pytest.approx(fc.decode_time(1, 100), rel=1e-12)


def test_a_power_cap_without_a_device_or_at_idle_power_is_refused_under_the_pools_key():
    # a constant-cost pool with kv_blocks loads no device, so there is no power model to cap
    err = _build_error({"kind": "colocated", "kv_blocks": 100, "cost_model": CONST(0.1), "power_cap_W": 300})
    assert (err.key, err.value, err.reason) == ("topologies.t.power_cap_W", 300,
                                                "a power cap needs a device profile with a power model")
    # at or below the H100's 70 W idle power: no clock would do
    err = _build_error({"kind": "colocated", "kv_blocks": 100, "power_cap_W": 50})
    assert (err.key, err.value) == ("topologies.t.power_cap_W", 50) and "idle power" in err.reason


def test_speculative_decoding_on_a_prefill_pool_is_refused_under_its_key():
    spec = {"method": "draft", "draft_cost_fraction": 0.1, "k": 2}
    err = _build_error(_dis(prefill={"speculative": spec}))
    assert (err.key, err.value, err.reason) == ("topologies.t.prefill.speculative", "draft",
                                                "a prefill pool does not decode: put speculative on the decode pool")


def test_a_speculative_pool_hands_its_one_speculator_to_every_instance_by_hand():
    # a fraction-priced draft (no memory, no device): the decode pool keeps its 1000 blocks; one Speculator for
    # the pool, seeded with the scenario's seed (7), priced on the pool's cost model; no multi-step windows
    spec = {"method": "draft", "draft_cost_fraction": 0.1, "k": 2, "acceptance": 0.6}
    t, _, _, _ = _built(_dis(decode={"instances": 2, "speculative": spec}), seed=7)
    sd = t.decode.spec_dec
    assert (sd.k, sd.acceptance, sd.fraction, sd.seed, sd.draft) == (2, 0.6, 0.1, 7, None)
    assert sd.target is t.decode.cost and t.prefill.spec_dec is None
    assert all(i.spec is sd and i.fast is False and i.kv.total_blocks == 1000 for i in t.decode.instances)
    assert all(i.spec is None for i in t.prefill.instances)


# a one-layer draft (inline): attention 4 x 1024 x 1024 = 4,194,304, gated MLP 3 x 1024 x 1024 = 3,145,728,
# embedding and LM head 2 x 1000 x 1024 = 2,048,000 parameters: 9,388,032 x 2 B = 18,776,064 B in bf16;
# its KV 2 x 1 layer x 8 heads x 128 x 2 B = 4,096 B a token, 1/32 of llama-3.1-8b's 131,072
TINY_DRAFT = {"name": "tiny-draft", "layers": 1, "hidden": 1024, "heads": 8, "kv_heads": 8, "head_dim": 128,
              "mlp_width": 1024, "vocab": 1000}


@pytest.mark.parametrize("pp, blocks", [
    # pp 1: device 15,316 + 2,000 MiB (utilisation 1.0, no reserve): 1000 target blocks of 2 MiB.  With the
    # draft: (1000 x 2,097,152 - 18,776,064) // (2,097,152 x (1 + 1/32)) = 2,078,375,936 // 2,162,688 = 961
    (1, 961),
    # pp 2: each stage 7,658 MiB of weights (test_weights_that_do_not_fit...), device 7,658 + 1,000 MiB:
    # 1000 blocks of 1 MiB a GPU (half the layers).  The draft sits on the last stage, whose GPUs hold half the
    # target's KV a token, so a token there costs 1 + 2 x 1/32: (1,048,576,000 - 18,776,064) // (1,048,576 x
    # 17/16) = 1,029,799,936 // 1,114,112 = 924
    (2, 924),
])
def test_a_draft_models_weights_and_kv_come_off_the_pools_kv_blocks_by_hand(tmp_path, pp, blocks):
    dev = _device_file(tmp_path, (LLAMA8_WEIGHT_MIB // pp + 1000 * BLOCK_MIB // pp) / 1024)
    topo = {"kind": "colocated", "device": dev, "pp": pp, "gpu_memory_utilization": 1.0,
            "activation_reserve_GiB": 0, "speculative": {"method": "draft", "draft_model": TINY_DRAFT, "k": 2}}
    t, _, _, _ = _built(topo, tmp_path=tmp_path)
    (inst,) = t.instances
    assert inst.kv.total_blocks == blocks and inst.block_bytes == 2_097_152 // pp
    sd = t.pools[0].spec_dec
    assert sd.draft.model.name == "tiny-draft" and (sd.draft.weight_dtype, sd.draft.kv_dtype) == ("bf16", "bf16")


def test_a_draft_under_a_power_cap_runs_on_the_same_capped_clock(tmp_path):
    from pdsim.energy import CappedCost
    dev = _device_file(tmp_path, (LLAMA8_WEIGHT_MIB + 1000 * BLOCK_MIB) / 1024)
    topo = {"kind": "colocated", "device": dev, "power_cap_W": 385, "gpu_memory_utilization": 1.0,
            "activation_reserve_GiB": 0, "speculative": {"method": "draft", "draft_model": TINY_DRAFT, "k": 2}}
    t, _, _, _ = _built(topo, tmp_path=tmp_path)
    draft = t.pools[0].spec_dec.draft
    assert isinstance(draft, CappedCost) and draft.f == pytest.approx(0.5 ** (1 / 3), rel=1e-12)


def test_a_draft_that_leaves_no_kv_memory_is_refused_under_the_pools_key(tmp_path):
    # one 2 MiB block of room (test_a_device_with_room_for_exactly_one_kv_block...) against 18,776,064 B of draft
    # weights = 0.0175 GiB -> "0.02"
    dev = _device_file(tmp_path, (LLAMA8_WEIGHT_MIB + BLOCK_MIB) / 1024)
    topo = {"kind": "colocated", "device": dev, "gpu_memory_utilization": 1.0, "activation_reserve_GiB": 0,
            "cost_model": CONST(0.1), "speculative": {"method": "draft", "draft_model": TINY_DRAFT, "k": 2}}
    with pytest.raises(ConfigError) as e:
        _built(topo, tmp_path=tmp_path)
    assert (e.value.key, e.value.value) == ("topologies.t.speculative", "draft")
    assert e.value.reason == "the draft (tiny-draft, 0.02 GiB per GPU) leaves no memory for the KV cache"


def test_a_draft_model_on_a_constant_cost_pool_is_refused_under_the_pools_key():
    topo = {"kind": "colocated", "kv_blocks": 100, "cost_model": CONST(0.1),
            "speculative": {"method": "draft", "draft_model": TINY_DRAFT, "k": 2}}
    err = _build_error(topo)
    assert (err.key, err.value) == ("topologies.t.speculative", "draft")
    assert err.reason.startswith("a draft model (or MTP head) is priced on the device")


def test_an_mtp_head_under_dp_attention_comes_off_the_kv_blocks_by_hand(tmp_path):
    # TINY_MOE with DP attention over tp = ep = 2 on 0.5 GiB (test_a_dp_attention_pool_sums_its_ranks_blocks...):
    # 2126 blocks, 131,072 B a block per GPU.  The MTP head is one more MoE layer sharded as the target's:
    # attention whole on each GPU (DP attention) 4,194,304 x 2 B = 8,388,608 B, 64 experts over ep 2:
    # 32 x 3,145,728 x 2 B = 201,326,592 B, the router whole 1024 x 64 x 2 B = 131,072 B: 209,846,272 B a GPU.
    # Its KV: one layer of the target's 4, 1/4 more a token.
    # (2126 x 131,072 - 209,846,272) // (131,072 x 1.25) = 68,812,800 // 163,840 = 420
    dev = _device_file(tmp_path, 0.5)
    topo = {"kind": "colocated", "device": dev, "tp": 2, "ep": 2, "dp_attention": True,
            "gpu_memory_utilization": 1.0, "activation_reserve_GiB": 0,
            "speculative": {"method": "mtp", "k": 1}}
    t, _, _, _ = _built(topo, model={**TINY_MOE, "mtp_layers": 1}, tmp_path=tmp_path)
    (inst,) = t.instances
    assert inst.kv.total_blocks == 420 and inst.block_bytes == 131_072


# --- the routers and assigners on hand-made instance stand-ins (tests/MUTANTS.md, branch muttopo5) ----------------
class _Inst:
    """An instance stand-in: the load signals the routers read, a count of ``sync`` calls, and a prefix cache that
    answers ``cached`` tokens for the request it is asked about, at most its prompt's whole 16-token blocks below
    the last token, as a real cache (the routers must not ask it when prefix caching is off)."""

    def __init__(self, name, load=0, decode=0, blocks=0, running=0, cached=0, prefix_on=True, synced_blocks=None):
        from types import SimpleNamespace as NS
        self.name, self.load, self.decode, self.syncs, self.asked = name, load, decode, 0, 0
        self.synced_blocks = synced_blocks
        self.running = [None] * running

        def cached_tokens(req):
            self.asked += 1
            return min(cached, (req.prompt_tokens - 1) // 16 * 16)      # 64-token prompts: at most 48
        self.kv = NS(used_blocks=blocks, prefix_on=prefix_on, cached_tokens=cached_tokens)

    def load_tokens(self):
        return self.load

    def load_decode(self):
        return self.decode

    def sync(self):
        # a fast-path window settled: the blocks the instance really holds now (when the test says so)
        self.syncs += 1
        if self.synced_blocks is not None:
            self.kv.used_blocks = self.synced_blocks


def _req(prompt=64, hash_ids=(1, 2, 3, 4)):
    from types import SimpleNamespace as NS
    return NS(prompt_tokens=prompt, hash_ids=None if hash_ids is None else list(hash_ids))


def _names(route, insts, n, req=None):
    return [route(insts, req).name for _ in range(n)]


def test_round_robin_cycles_through_the_instances_with_its_own_counter_by_hand():
    from pdsim.topology import round_robin
    a, b, c = _Inst("a"), _Inst("b"), _Inst("c")
    rr = round_robin()
    # picks 0, 1, 2, 3 % 3 = 0, 4 % 3 = 1, 5 % 3 = 2, 6 % 3 = 0, whatever the loads
    a.load = 10**6
    assert _names(rr, [a, b, c], 7) == ["a", "b", "c", "a", "b", "c", "a"]
    # the 8th pick over two live instances: 7 % 2 = 1 -> the second
    assert rr([a, b], None) is b
    # a new router starts its own count at 0
    assert round_robin()([a, b, c], None) is a


def test_least_outstanding_and_least_decode_work_take_the_first_of_the_smallest_by_hand():
    from pdsim.topology import least_decode_work, least_outstanding
    insts = [_Inst("a", load=5, decode=40), _Inst("b", load=3, decode=12), _Inst("c", load=3, decode=12),
             _Inst("d", load=9, decode=7)]
    # outstanding tokens 5, 3, 3, 9: the smallest is 3, first held by b
    assert least_outstanding()(insts, _req()) is insts[1]
    # decode tokens to come 40, 12, 12, 7: d
    assert least_decode_work()(insts, _req()) is insts[3]
    insts[3].decode = 12
    # 40, 12, 12, 12: the first of the three 12s, b
    assert least_decode_work()(insts, _req()) is insts[1]


def test_least_loaded_settles_every_candidate_then_ranks_blocks_before_batch_by_hand():
    from pdsim.topology import least_loaded
    route = least_loaded()
    # a single candidate: returned as is, its window not settled (no sync), however loaded
    (only,) = lone = [_Inst("only", blocks=99, running=9)]
    assert route(lone, None) is only and only.syncs == 0
    # two candidates: both synced once, then read: d0 shows 3 blocks before its window settles, 8 after; d1 holds 5.
    # As of now d0 holds 8 > 5: d1 (reading before the sync would have picked d0)
    d0, d1 = _Inst("d0", blocks=3, synced_blocks=8), _Inst("d1", blocks=5)
    assert route([d0, d1], None) is d1 and (d0.syncs, d1.syncs) == (1, 1)
    # blocks before batch size: 5 blocks and 9 running beats 6 blocks and none
    e0, e1 = _Inst("e0", blocks=6, running=0), _Inst("e1", blocks=5, running=9)
    assert route([e0, e1], None) is e1
    # equal blocks: the smaller batch (2 < 3); all equal: the first
    f0, f1, f2 = _Inst("f0", blocks=4, running=3), _Inst("f1", blocks=4, running=2), _Inst("f2", blocks=4, running=2)
    assert route([f0, f1, f2], None) is f1
    assert route([f1, f2], None) is f1


def test_prefix_aware_load_ceiling_and_keys_by_hand():
    from pdsim.config import PrefixRoutingSpec
    from pdsim.topology import prefix_aware
    # the default slack is 32768 tokens: an instance at exactly min load + 32768 is still eligible
    route = prefix_aware()
    a, b = _Inst("a", load=0), _Inst("b", load=32768, cached=48)
    assert route([a, b], _req()) is b and (a.syncs, b.syncs) == (1, 1)
    b.load = 32769                                    # one token above the ceiling: passed over
    assert route([a, b], _req()) is a
    # a configured slack of 100 over a least load of 50: ceiling 150
    route = prefix_aware(PrefixRoutingSpec(load_slack_tokens=100))
    x, y, z = _Inst("x", load=50), _Inst("y", load=150, cached=16), _Inst("z", load=151, cached=32)
    # x: 0 cached; y at the ceiling: 16 cached; z above it (its 32 cached do not count): y
    assert route([x, y, z], _req()) is y
    assert z.asked == 0                               # an instance over the ceiling is not even asked
    # an instance over the ceiling listed first does not end the search: 200 > 0 + 100, then 0 vs 32 cached
    p, q, r = _Inst("p", load=200, cached=64), _Inst("q", load=0), _Inst("r", load=10, cached=32)
    assert route([p, q, r], _req()) is r
    # more cached beats less load (16 cached at 90 tokens over 0 cached at 0); equal cached: the lower load
    s, t = _Inst("s", load=0), _Inst("t", load=90, cached=16)
    assert route([s, t], _req()) is t
    u, v = _Inst("u", load=30, cached=16), _Inst("v", load=20, cached=16)
    assert route([u, v], _req()) is v
    # equal cached and equal load: the first
    w0, w1 = _Inst("w0", load=20, cached=16), _Inst("w1", load=20, cached=16)
    assert route([w0, w1], _req()) is w0


@pytest.mark.parametrize("router", ["prefix_aware", "kv_aware"])
def test_cache_aware_routers_count_no_hit_without_prefix_caching_or_hash_ids_by_hand(router):
    from pdsim import topology
    route = getattr(topology, router)()
    # a (load 20, "48 cached") and b (load 10): with the hit, a (prefix_aware: 48 cached first; kv_aware:
    # 64 - 48 + 20 = 36 < 64 + 10 = 74); without it, b (10 < 20 either way)
    a, b = _Inst("a", load=20, cached=48), _Inst("b", load=10)
    assert route([a, b], _req()) is a
    assert route([a, b], _req(hash_ids=None)) is b
    a.kv.prefix_on = b.kv.prefix_on = False
    asked = a.asked
    assert route([a, b], _req()) is b and a.asked == asked     # the cache is not asked at all


def test_kv_aware_costs_prompt_tokens_to_compute_plus_outstanding_by_hand():
    from pdsim.config import PrefixRoutingSpec
    from pdsim.topology import kv_aware
    # cost = w x (64 - cached) + load.  a: idle, nothing cached: 64 w.  b: 48 cached, load L: 16 w + L.
    # b wins when 48 w < L is false, i.e. iff 48 w > L (a tie goes to a, the first)
    route = kv_aware()                                # the default weight, 1.0
    a, b = _Inst("a"), _Inst("b", load=40, cached=48)
    assert route([a, b], _req()) is b and (a.syncs, b.syncs) == (1, 1)   # 48 > 40: b (16 + 40 = 56 < 64)
    b.load = 60
    assert route([a, b], _req()) is a                 # 48 < 60: a (64 < 16 + 60 = 76)
    b.load = 48
    assert route([a, b], _req()) is a                 # 64 = 16 + 48: the tie goes to the first
    # weight 0.5: 32 for a, 8 + 40 = 48 for b: a; weight 2: 128 for a, 32 + 60 = 92 for b: b
    b.load = 40
    assert kv_aware(PrefixRoutingSpec(overlap_weight=0.5))([a, b], _req()) is a
    b.load = 60
    assert kv_aware(PrefixRoutingSpec(overlap_weight=2.0))([a, b], _req()) is b


def test_make_router_hands_the_cache_aware_routers_their_configuration_by_hand():
    from types import SimpleNamespace as NS
    from pdsim.config import PrefixRoutingSpec
    from pdsim.topology import make_router
    # prefix_aware with slack 100: b at load 101 > 0 + 100 is passed over despite its hit (the default 32768
    # would take it)
    a, b = _Inst("a"), _Inst("b", load=101, cached=48)
    spec = NS(router="prefix_aware", prefix_routing=PrefixRoutingSpec(load_slack_tokens=100))
    assert make_router(spec)([a, b], _req()) is a
    # kv_aware with weight 0.5: a costs 32, b 8 + 40 = 48: a (the default 1.0 would take b: 64 > 16 + 40)
    b.load = 40
    spec = NS(router="kv_aware", prefix_routing=PrefixRoutingSpec(overlap_weight=0.5))
    assert make_router(spec)([a, b], _req()) is a
    # no prefix_routing section: the defaults (weight 1.0: b)
    assert make_router(NS(router="kv_aware", prefix_routing=None))([a, b], _req()) is b
    # the other two take no configuration: least_outstanding picks a (0 < 40), round robin a then b
    assert make_router(NS(router="least_outstanding", prefix_routing=None))([b, a], _req()) is a
    assert _names(make_router(NS(router="round_robin", prefix_routing=None)), [a, b], 3, _req()) == ["a", "b", "a"]


# --- client timeouts behind a PD proxy (client.ttft_at: first_decode_token) ----------------------------
def _no_kv_left(res):
    """Every KV block back in its pool, no decode reservation left, nothing in flight."""
    topo = res.topology
    assert all(i.kv.used_blocks == 0 for i in topo.instances)
    assert all(d.reserved_count == 0 for d in topo.decode.instances)
    assert not topo.handoffs and not any(topo.pending.values()) and not topo.reserved_on


def test_a_timeout_abandons_a_hand_off_waiting_for_a_link_that_is_down_by_hand():
    # r0 (1000 + 3), timeout 1 s; the link is down 0 - 10 s.  Prefill 0 - 0.05 (the prefill's token is not the
    # client's: behind a PD proxy its first token is the decode instance's); the KV waits on the prefill side
    # with 63 decode blocks reserved (1000 / 16 = 62.5).  At 1.0 no decode token has come: abandoned at 1.0,
    # the reservation and the prefill copy freed, nothing sent.  (Before: skipped as it had "generated" the
    # prefill's token, it finished at ~10.16 s with a client TTFT past 10 s.)
    topo = _dis(kv_link={"bandwidth_GBps": 1, "latency_us": 0})
    res = _stream(topo, [(0.0, 1000, 3)], faults={"links": [{"at_s": 0.0, "duration_s": 10.0}]}, timeout_s=1.0)
    (r,) = res.requests
    assert r.status == "abandoned" and r.finish_s == 1.0
    assert res.topology.links[0].transfers == 0
    _no_kv_left(res)
    df = metrics.requests_frame([res])
    assert np.isnan(df.ttft_s[0])         # the client saw no token


def test_a_timeout_cuts_off_a_transfer_in_flight_and_frees_the_link_by_hand():
    # 1 GB/s, no latency, timeout 0.1 s.  r0 (1000 + 3) at 0: prefill 0 - 0.05, its KV on the wire from 0.05
    # (0.131072 s); at 0.1 abandoned mid-transfer: the link was busy 0.05 s and is free again.  r1 (100 + 2)
    # at 0.12: prefill 0.12 - 0.17, 100 x 131072 B = 0.0131072 s: on decode at 0.1831072, one decode step:
    # first decode token (and last) at 0.1931072, 0.0731072 after it arrived: within its timeout.  The link
    # carried r0's first 0.05 s x 1e9 B/s = 50,000,000 B and r1's 13,107,200 B; one transfer completed.
    topo = _dis(kv_link={"bandwidth_GBps": 1, "latency_us": 0})
    res = _stream(topo, [(0.0, 1000, 3), (0.12, 100, 2)], timeout_s=0.1)
    r0, r1 = res.requests
    assert r0.status == "abandoned" and r0.finish_s == pytest.approx(0.1, abs=1e-12)
    assert r1.status == "finished" and r1.finish_s == pytest.approx(0.1931072, abs=1e-9)
    (link,) = res.topology.links
    assert link.transfers == 1 and link.busy_s == pytest.approx(0.05 + 0.0131072, abs=1e-9)
    assert link.bytes == pytest.approx(50_000_000 + 13_107_200, abs=1e-3)
    _no_kv_left(res)


def test_a_timeout_abandons_a_hand_off_waiting_for_decode_blocks_by_hand():
    # decode 70 blocks, watermark 0; 1 GB/s, no latency; timeout 0.3 s.  r0 (1000 + 50) and r1 (120 + 2) at 0,
    # prefilled in one step 0 - 0.05.  r0 reserves 63 blocks (1000 tokens), r1 needs 8 (120 / 16 = 7.5): 71 > 70,
    # it waits for decode blocks.  r0 is on decode at 0.05 + 0.131072 = 0.181072, first decode token 0.191072,
    # its 49th and last at 0.181072 + 0.49 = 0.671072.  At 0.3 r1 is abandoned (its prefill copy freed).
    topo = _dis(decode={"kv_blocks": 70, "watermark": 0.0}, kv_link={"bandwidth_GBps": 1, "latency_us": 0})
    res = _stream(topo, [(0.0, 1000, 50), (0.0, 120, 2)], timeout_s=0.3)
    r0, r1 = res.requests
    assert r1.status == "abandoned" and r1.finish_s == pytest.approx(0.3, abs=1e-12)
    assert r0.status == "finished" and r0.decode_first_s == pytest.approx(0.191072, abs=1e-9)
    assert r0.finish_s == pytest.approx(0.671072, abs=1e-9)
    assert res.topology.links[0].transfers == 1
    _no_kv_left(res)


@pytest.mark.parametrize("fast", [True, False])
def test_a_timeout_drops_a_request_before_its_first_decode_step_ends_by_hand(fast):
    # decode steps of 0.5 s, a link fast enough to be ~0 s; timeout 0.2 s.  r0 (100 + 3): prefill 0 - 0.05, on
    # decode at ~0.05, its first decode step runs 0.05 - 0.55: at 0.2 the client gives up, the decode instance
    # drops it (its blocks freed; the run ends there, every request settled).
    topo = _dis(decode={"cost_model": CONST(0.5)}, kv_link={"bandwidth_GBps": 1e6, "latency_us": 0})
    sc = scenario({"t": topo}, timeout_s=0.2)
    reqs = [Request(0, 0.0, 100, 3)]
    res = run_topology(sc, "t", sc.topologies["t"], reqs, resolve_model(sc), 0.1, fast=fast)
    (r,) = res.requests
    assert r.status == "abandoned" and r.finish_s == pytest.approx(0.2, abs=1e-12) and r.generated == 1
    assert r.decode_first_s != r.decode_first_s       # NaN: no decode token
    _no_kv_left(res)
    (d,) = res.topology.decode.instances
    assert not d.running and d.outstanding_tokens == 0 and d.decode_work == 0


def test_a_prefill_end_client_keeps_a_prefilled_request_past_its_timeout_by_hand():
    # client.ttft_at: prefill_end: the prefill's token (0.05) is the client's first, so the link outage
    # (0 - 10 s) no longer abandons it at 1 s: on the wire at 10 (1000 x 131072 B: 0.131072 s), decoded
    # 10.141072 and 10.151072
    topo = _dis(kv_link={"bandwidth_GBps": 1, "latency_us": 0})
    sc = scenario({"t": topo}, timeout_s=1.0)
    sc = sc.model_copy(update={"client": config.ClientSpec(ttft_at="prefill_end"),
                               "faults": config.FaultsSpec(links=[{"at_s": 0.0, "duration_s": 10.0}])})
    res = run_topology(sc, "t", sc.topologies["t"], [Request(0, 0.0, 1000, 3)], resolve_model(sc), 0.1)
    (r,) = res.requests
    assert r.status == "finished" and r.finish_s == pytest.approx(10.151072, abs=1e-9)


@pytest.mark.parametrize("fast", [True, False])
def test_a_decode_side_host_tier_hit_is_copied_before_the_next_step_by_hand(fast):
    # prefill linear 0.01 s + 1e-4 s/token; decode 0.01 s steps with a prefix cache holding 1 unreferenced GPU block
    # and a host tier (1 GiB, 1 GB/s); link 1 GB/s, 100 us.  Pages of 512 tokens (hash ids), 131072 B a token.
    #   r0 (1024 + 2, ids 1 2) at 0: prefill 0.1124, on the wire 134,217,728 B: 0.134317728 -> decode 0.246717728,
    #      done 0.256717728; its two pages leave the GPU cache (capacity 1 block) for the host tier.
    #   r1 (1024 + 300, ids 9 10) at 1: on decode at 1.246717728; decode steps end at 1.246717728 + 0.01 k.
    #   r2 (1024 + 5, ids 1 3) at 2: prefilled at 2.1124; the decode reservation finds page 1 on the host tier:
    #      its copy (67,108,864 B at 1 GB/s = 0.067108864 s) is paid by the next decode step; only page 3 goes
    #      on the wire (0.067208864 s): on decode at 2.179608864.  The step in flight ends at 2.116717728
    #      (k = 87); the next one pays the copy: 2.116717728 + 0.01 + 0.067108864 = 2.193826592; r2 joins the
    #      one after: first decode token 2.203826592, its 4 decode tokens done 2.233826592.  The fast path
    #      must cut its window there too (it paid the copy after the window: 2.263826592).
    topo = _dis(prefill={"cost_model": {"kind": "linear", "base_s": 0.01, "per_token_s": 1e-4}},
                decode={"prefix_cache": {"enabled": True, "capacity_blocks": 1,
                                         "host": {"capacity_GiB": 1, "bandwidth_GBps": 1}}},
                kv_link={"bandwidth_GBps": 1, "latency_us": 100})
    sc = scenario({"t": topo})
    reqs = [Request(0, 0.0, 1024, 2, hash_ids=[1, 2], hash_block_tokens=512),
            Request(1, 1.0, 1024, 300, hash_ids=[9, 10], hash_block_tokens=512),
            Request(2, 2.0, 1024, 5, hash_ids=[1, 3], hash_block_tokens=512)]
    res = run_topology(sc, "t", sc.topologies["t"], reqs, resolve_model(sc), 0.1, fast=fast)
    r0, r1, r2 = res.requests
    assert r0.finish_s == pytest.approx(0.256717728, abs=1e-9)
    assert r2.kv_transfer_s == pytest.approx(0.067208864, abs=1e-9)
    assert r2.decode_start_s == pytest.approx(2.179608864, abs=1e-9)
    assert r2.decode_first_s == pytest.approx(2.203826592, abs=1e-9)
    assert r2.finish_s == pytest.approx(2.233826592, abs=1e-9)
    # r1: 299 decode steps and the one that paid the copy
    assert r1.finish_s == pytest.approx(1.246717728 + 2.99 + 0.067108864, abs=1e-9)


def test_a_prefill_copy_lost_that_no_longer_fits_a_prefill_instance_recomputes_on_decode_by_hand():
    # prefill x2, 63 blocks of 16 (watermark 0): 1008 tokens, exactly r0's prompt (1008 + 5).  prefill-0
    # prefills it 0 - 0.05 (token 1); its KV goes on the wire at 0.05 (1008 x 131072 B = 0.132120576 s + 100 us:
    # until 0.182220576).  prefill-0 fails at 0.1: the copy is gone.  Prefilled again r0 would be prompt +
    # 1 token = 1009 = 64 blocks: no prefill instance can ever hold it (it deadlocked waiting on prefill-1).
    # As a request lost on decode it recomputes on decode: at 0.1 (the transfer is cut off as the copy goes)
    # one step computes 1009 tokens and samples token 2 (0.11), three more: done 0.14.
    topo = _dis(prefill={"instances": 2, "kv_blocks": 63, "watermark": 0.0},
                kv_link={"bandwidth_GBps": 1, "latency_us": 100})
    res = _stream(topo, [(0.0, 1008, 5)], faults={"instances": [{"at_s": 0.1, "instance": "prefill-0",
                                                                 "down_s": 10.0}]})
    (r,) = res.requests
    assert r.status == "finished" and r.recomputed_tokens == 1008 and r.fault_hits == 1
    assert r.instance == "decode-0"
    assert r.decode_first_s == pytest.approx(0.11, abs=1e-9)
    assert r.finish_s == pytest.approx(0.14, abs=1e-9)
    assert all(i.kv.used_blocks == 0 for i in res.topology.instances)


def test_a_hand_off_waiting_for_the_link_is_lost_the_moment_its_prefill_instance_fails_by_hand():
    # 1P1D: prefill 0.05 s steps, decode 0.01 s, 1 GB/s link with no latency, down 0 - 1.0 s.  r0 (100 + 3)
    # at 0: prefilled 0 - 0.05 (token 1), its KV waits for the link.  prefill-0 fails at 0.2 for 0.1 s: the
    # copy is gone at once (recomputed 100, logged as lost); at 0.3 it prefills 101 tokens 0.3 - 0.35 (token
    # 2) and waits for the link again; at 1.0: 101 x 131072 B = 0.013238272 s, one decode step: 1.023238272.
    # (Noticed only when the link came back at 1.0, it was prefilled 1.0 - 1.05 and done 1.073238272.)
    topo = _dis(kv_link={"bandwidth_GBps": 1, "latency_us": 0})
    res = _stream(topo, [(0.0, 100, 3)], faults={"links": [{"at_s": 0.0, "duration_s": 1.0}],
                                                 "instances": [{"at_s": 0.2, "instance": "prefill-0",
                                                                "down_s": 0.1}]})
    (r,) = res.requests
    assert r.token_s == pytest.approx([0.05, 0.35, 1.023238272], abs=1e-9)
    assert r.recomputed_tokens == 100 and r.fault_hits == 1
    assert next(e for e in res.topology.fault_log if "instance" in e)["requests_lost"] == 1


def test_a_transfer_cut_in_its_latency_counts_only_the_latency_it_waited_by_hand():
    # 1 prefill (0.05 s steps, batch 1), 2 decode instances; a link of ~0 s bandwidth time (x = 100 x 131072 B
    # / 1e15 B/s) and 1 s latency.  r0 (100 + 3) at 0: prefill 0 - 0.05, reserves decode-0, on the wire 0.05 +
    # x, then in its latency; r1 (at 0.05) prefills 0.05 - 0.10, reserves decode-1 and queues for the link.
    # decode-0 fails at 0.55: r0's transfer stops 0.5 - x into its latency (busy 0.05 -> 0.55: 0.5, not 1 + x),
    # r1 gets the link (1 + x), r0 goes again to decode-1 (1 + x): busy 2.5 + 2x, within the run's wall time.
    x = 100 * KV_BYTES_PER_TOKEN / 1e15
    topo = _dis(prefill={"max_running": 1}, decode={"instances": 2},
                kv_link={"bandwidth_GBps": 1e6, "latency_us": 1e6})
    res = _stream(topo, [(0.0, 100, 3), (0.05, 100, 3)],
                  faults={"instances": [{"at_s": 0.55, "instance": "decode-0", "down_s": 10.0}]})
    (link,) = res.topology.links
    assert link.busy_s == pytest.approx(2.5 + 2 * x, abs=1e-12)
    assert link.transfers == 2 and link.busy_s <= max(r.finish_s for r in res.requests)


# --- layer-wise KV overlap under pipeline parallelism: each stage sends its own layers over its own links,
# ready only while that stage computes.  Stage j (n_j layers, c_j before it) computes from start + c_j tau to
# start + (c_j + n_j) tau, tau = prefill / L; one layer's KV takes w on its stage's links; its last layer
# leaves at max(stage start + tau + n_j w, stage end + w) (link idle before the prefill); the transfer ends with
# the slowest stage, then the latency.  llama-3.1-8b: 32 layers, 131072 B of KV per token (4096 B per layer).

def _layerwise(prefill, bandwidth_GBps, latency_us=0):
    topo = _dis(prefill=prefill, kv_link={"bandwidth_GBps": bandwidth_GBps, "latency_us": latency_us,
                                          "layerwise_overlap": True})
    (r,) = _stream(topo, [(0.0, 400, 2)]).requests
    return r


def test_layerwise_overlap_under_pipeline_sends_each_stages_layers_during_that_stage():
    # prefill pp=2 (16 + 16 layers), 0.05 s per stage: the lone prompt's prefill is 0 - 0.1 s, tau = 0.1 / 32
    # = 3.125 ms a layer; stage 0 computes layers 1-16 in [0, 0.05], stage 1 layers 17-32 in [0.05, 0.1].
    # 400 tokens: 400 x 4096 B = 1,638,400 B per layer; each stage's one link at 0.1 GB/s: w = 16.384 ms a
    # layer (the link model's 2 x 0.1 GB/s for 52,428,800 B: 0.262144 s = 16 w).  The link is the bottleneck:
    # stage 0 sends from 0.003125 to 0.003125 + 16 w = 0.265269; stage 1's first layer is ready at 0.053125,
    # its 16 layers leave back to back until 0.053125 + 0.262144 = 0.315269 -> visible 0.315269 - 0.1
    # = 0.215269 s (not 0.165269: overlap as if layer 1 of 32 were ready at 0.003125 on both links)
    r = _layerwise({"pp": 2}, 0.1)
    assert r.prefill_end_s == pytest.approx(0.1, abs=1e-12)
    assert r.kv_transfer_s == pytest.approx(0.215269, abs=1e-12)
    assert r.decode_start_s == pytest.approx(0.315269, abs=1e-12)


def test_layerwise_overlap_under_an_uneven_pipeline_waits_for_the_last_stage():
    # pp_layers [12, 20], 0.05 s a stage: the lone prefill is 0.1 s (each stage n_j / 16 of 0.05 s: 0.0375
    # and 0.0625), tau = 3.125 ms.  The link model: 1e8 x 32 / 20 = 1.6e8 B/s, 52,428,800 B in 0.32768 s =
    # 20 w, w = 1,638,400 B / 1e8 = 16.384 ms a layer on any stage's link.  Stage 0 (layers 1-12, [0, 0.0375]):
    # 0.003125 + 12 w = 0.199733.  Stage 1 (layers 13-32, [0.0375, 0.1]): 0.0375 + 0.003125 + 20 w = 0.368305,
    # the end; + 100 us latency -> visible 0.368305 - 0.1 + 0.0001 = 0.268405 s (overlap as one link from
    # layer 1 at 0.003125 would give 0.230905)
    r = _layerwise({"pp": 2, "pp_layers": [12, 20]}, 0.1, latency_us=100)
    assert r.prefill_end_s == pytest.approx(0.1, abs=1e-12)
    assert r.kv_transfer_s == pytest.approx(0.268405, abs=1e-12)


def test_layerwise_overlap_under_pipeline_when_compute_is_the_bottleneck():
    # pp=2 as above, each stage's link at 10 GB/s: w = 1,638,400 B / 1e10 = 0.16384 ms < tau = 3.125 ms, so
    # every layer leaves as soon as it is ready: stage 1's last layer (32) is ready at 0.1 and lands at 0.1 +
    # w; stage 0's at 0.05 + w.  Visible: w + 10 us latency = 0.00017384 s (one of 32 layers on both links'
    # 20 GB/s, 52,428,800 / 2e10 / 32 = 0.08192 ms, would hide half of the last layer's time)
    r = _layerwise({"pp": 2}, 10, latency_us=10)
    assert r.kv_transfer_s == pytest.approx(0.00017384, abs=1e-12)
