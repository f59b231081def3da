"""Prefix caching (kvcache.PrefixKVCache), cache-aware routing and transfer, prefix-carrying workloads.

Oracles: timings worked out by hand under a LinearCost, LRU order worked out by hand, block
conservation with sharing (hypothesis), and the Mooncake trace's share of repeated block hashes
counted here with plain Python over the raw JSON.
"""
from __future__ import annotations

import json

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from pdsim import config, metrics
from pdsim.errors import ConfigError, TraceError
from pdsim.kvcache import PrefixKVCache, replay_hit_fraction
from pdsim.simulation import generate, resolve_model, run_topology, simulate
from pdsim.traces import load_trace
from pdsim.workload import FINISHED, Request

from conftest import SHARED_TRACES, scenario

KV_TOKEN_BYTES = 2 * 32 * 8 * 128 * 2      # Llama-3.1-8B, bf16: 2 (K,V) x layers x kv heads x head dim x 2 B
LIN = {"kind": "linear", "base_s": 0.01, "per_token_s": 1e-4, "per_kv_token_s": 1e-6}


def _run(topo: dict, reqs: list[Request]):
    sc = scenario({"t": topo})
    return run_topology(sc, "t", sc.topologies["t"], reqs, resolve_model(sc), 1.0)


def _req(i, t, prompt, out, ids, unit=16):
    return Request(i, t, prompt, out, hash_ids=list(ids), hash_block_tokens=unit)


# --- the timing of a cached prompt ------------------------------------------------------------
def test_whole_prompt_cached_prefills_one_block_and_ttft_drops():
    topo = {"kind": "colocated", "replicas": 1, "kv_blocks": 100, "block_size": 16, "cost_model": LIN,
            "prefix_cache": {"enabled": True}}
    ids = range(1, 11)                                     # 160 tokens = 10 blocks of 16
    res = _run(topo, [_req(0, 0.0, 160, 2, ids), _req(1, 10.0, 160, 2, ids)])
    a, b = res.requests
    # a: the whole prompt: 0.01 + 160 x 1e-4 + 160 x 1e-6 (attention reads 160 tokens)
    assert a.first_token_s - a.arrival_s == pytest.approx(0.01 + 160e-4 + 160e-6, abs=1e-12)
    # b: 9 blocks cached (the last token must be computed, so the last block is), 16 new tokens,
    # attention still over the whole 160-token context
    assert b.cached_tokens == 144
    assert b.first_token_s - b.arrival_s == pytest.approx(0.01 + 16e-4 + 160e-6, abs=1e-12)
    # off: both take the full prefill (and nothing else changes)
    off = _run({**topo, "prefix_cache": {"enabled": False}}, [_req(0, 0.0, 160, 2, ids), _req(1, 10.0, 160, 2, ids)])
    assert off.requests[1].first_token_s - 10.0 == pytest.approx(0.01 + 160e-4 + 160e-6, abs=1e-12)


def test_host_tier_hit_waits_for_the_copy():
    """GPU pool of 12 blocks: b's prefill pushes a's blocks 9..1 (tail first) to the host tier;
    a again finds block 0 on GPU, blocks 1..8 on the host, and waits 8 blocks x 2 MiB / 1 GB/s."""
    topo = {"kind": "colocated", "replicas": 1, "kv_blocks": 12, "watermark": 0.0, "block_size": 16,
            "cost_model": LIN, "prefix_cache": {"host": {"capacity_GiB": 1, "bandwidth_GBps": 1}}}
    res = _run(topo, [_req(0, 0.0, 160, 2, range(1, 11)), _req(1, 1.0, 160, 2, range(100, 110)),
                      _req(2, 2.0, 160, 2, range(1, 11))])
    a2 = res.requests[2]
    st_ = res.topology.instances[0].kv.stats
    assert (st_.gpu_hit_tokens, st_.host_hit_tokens) == (16, 128)
    load_s = 8 * 16 * KV_TOKEN_BYTES / 1e9
    assert a2.first_token_s - 2.0 == pytest.approx(0.01 + 16e-4 + 160e-6 + load_s, abs=1e-12)


# --- LRU and references -----------------------------------------------------------------------
def _serve(kv: PrefixKVCache, req: Request) -> int:
    """Admit, compute the whole prompt, finish and leave; returns the cached tokens found."""
    hit = kv.peek(req)
    assert kv.attach(req, hit, req.known)
    req.computed = req.known
    kv.commit(req)
    req.status = FINISHED
    kv.release(req)
    return hit


def test_lru_evicts_least_recently_used_unreferenced_block_first():
    kv = PrefixKVCache(4, 16)
    a, b, c = ([i * 10] for i in (1, 2, 3))
    for i, ids in enumerate((a, b, c)):             # 17 tokens: one whole cacheable block each
        assert _serve(kv, _req(i, 0, 17, 1, ids + [99 + i])) == 0
    assert _serve(kv, _req(3, 0, 17, 1, a + [7])) == 16      # a used again: now the most recent
    # a 40-token request takes 3 of the 4 blocks: two cached blocks must go, b then c, never a
    big = _req(4, 0, 40, 1, [500, 501, 502])
    assert kv.peek(big) == 0 and kv.attach(big, 0, 40)
    assert kv.free_blocks == 1 and kv.stats.evicted_blocks == 2
    assert [kv.cached_tokens(_req(9, 0, 17, 1, ids + [1])) for ids in (a, b, c)] == [16, 0, 0]


def test_blocks_of_running_requests_are_never_evicted():
    kv = PrefixKVCache(6, 16)
    run = _req(0, 0, 33, 5, [1, 2, 3])
    assert kv.attach(run, kv.peek(run), 33)
    run.computed = 33
    kv.commit(run)                                   # its two whole blocks are registered, in use
    other = _req(1, 0, 48, 1, [7, 8, 9])
    assert kv.attach(other, kv.peek(other), 48)      # takes every free block
    assert kv.free_blocks == 0
    assert not kv.grow(_req(2, 0, 16, 1, [5]), 16)   # nothing to evict: the cached blocks are referenced
    assert kv.cached_tokens(_req(3, 0, 40, 1, [1, 2, 4])) == 32   # still there, shareable


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(ops=st.lists(st.tuples(st.integers(0, 3), st.integers(1, 4), st.integers(1, 80), st.integers(0, 2)),
                    min_size=1, max_size=40),
       total=st.integers(4, 24), cap=st.sampled_from([None, 2, 5]), host=st.sampled_from([0, 3]),
       unit=st.sampled_from([4, 8, 12, 6]))
def test_block_conservation_with_sharing(ops, total, cap, host, unit):
    """Random admissions (prefixes from a small family, so they share), steps and departures:
    free + private blocks + distinct referenced blocks = the pool, every reference is counted,
    no referenced block is ever evicted, the cache never keeps more evictable blocks than allowed."""
    kv = PrefixKVCache(total, 4, 0.0, capacity_blocks=None if cap is None else min(cap, total),
                       host_blocks=host, host_bandwidth_Bps=1e9 if host else 0.0, block_bytes=1.0)
    running: list[Request] = []
    for n, (fam, depth, prompt, act) in enumerate(ops):
        if act == 0 and running:                       # the oldest leaves
            r = running.pop(0)
            r.status = FINISHED
            kv.release(r)
        elif act == 1 and running:                     # the newest advances by a step
            r = running[-1]
            if kv.grow(r, r.computed + 5):
                r.computed += 5
                kv.commit(r)
        else:                                          # a new request with a shared prefix
            ids = [fam * 100 + j for j in range(depth)] + [10_000 + n]
            r = _req(n, 0, prompt, 3, ids, unit=unit)     # pages of unit/4 blocks (6: one block each)
            hit = kv.peek(r)
            if kv.attach(r, hit, r.known):
                r.computed = r.known
                kv.commit(r)
                running.append(r)
        refs = {}
        private = 0
        for r in running:
            held, mapped = kv.held.get(r.id, [[], 0])[:2]
            assert mapped == sum(kv.size[k] for k in held)
            private += r.blocks - mapped
            for k in held:
                refs[k] = refs.get(k, 0) + 1
        assert all(kv.rc[k] == c for k, c in refs.items())
        assert all(c == 0 for k, c in kv.rc.items() if k not in refs)
        # shared pages counted once: free (evictable included) + private + distinct referenced = pool
        assert kv.free_blocks + private + sum(kv.size[k] for k in refs) == total
        assert kv.lru_blocks == sum(kv.lru.values()) <= min(kv.free_blocks, kv.capacity_blocks)
        assert set(kv.lru) == {k for k, c in kv.rc.items() if c == 0}
        assert kv.host_used == sum(kv.host.values()) <= host and not (set(kv.host) & set(kv.rc))
    for r in running:
        r.status = FINISHED
        kv.release(r)
    assert kv.free_blocks == total and kv.used_blocks == 0


# --- routing ------------------------------------------------------------------------------------
@pytest.mark.parametrize("router", ["prefix_aware", "kv_aware"])
def test_cache_aware_router_sends_a_repeat_to_the_instance_holding_its_prefix(router):
    topo = {"kind": "colocated", "replicas": 4, "kv_blocks": 200, "block_size": 16, "cost_model": LIN,
            "router": router, "prefix_cache": {}}
    first = [_req(i, 0.0, 320, 4, range(100 * i, 100 * i + 20)) for i in range(4)]   # spread by load
    repeat = [_req(4 + k, 5.0 + k, 400, 4, list(range(100 * i, 100 * i + 20)) + [9000 + i] * 5)
              for k, i in enumerate((2, 0, 3, 1))]
    res = _run(topo, first + repeat)
    served = {r.id: r.instance for r in res.requests}
    assert len({served[i] for i in range(4)}) == 4
    for i, r in zip((2, 0, 3, 1), res.requests[4:]):
        assert served[r.id] == served[i] and r.cached_tokens == 320
    # the baseline router sends every idle-time repeat to replica-0
    base = _run({**topo, "router": "least_outstanding"}, [r.clone() for r in first + repeat])
    assert [r.instance for r in base.requests[4:]] == ["replica-0"] * 4


@pytest.mark.parametrize("slack, third", [(100, "replica-1"), (10**6, "replica-0")])
def test_prefix_aware_load_ceiling_passes_over_a_busy_instance(slack, third):
    topo = {"kind": "colocated", "replicas": 2, "kv_blocks": 400, "block_size": 16, "cost_model": LIN,
            "router": "prefix_aware", "prefix_routing": {"load_slack_tokens": slack}, "prefix_cache": {}}
    # r0 fills replica-0's cache; r1 (no shared prefix) lands on idle replica-1; r2 and r3 repeat r0's
    # prefix: r2 goes to replica-0; r3 arrives while replica-0 holds r2's ~2000 outstanding tokens: within
    # a large slack the longer prefix wins over the lower load, past a small one it goes to replica-1
    reqs = [_req(0, 0.0, 320, 2, range(20)), _req(1, 0.0, 64, 2, range(500, 504)),
            _req(2, 1.0, 1600, 400, list(range(20)) + list(range(600, 680))),
            _req(3, 1.0, 1600, 400, list(range(20)) + list(range(700, 780)))]
    res = _run(topo, reqs)
    assert [r.instance for r in res.requests] == ["replica-0", "replica-1", "replica-0", third]


# --- cache-aware KV transfer ---------------------------------------------------------------------
def test_cache_aware_transfer_sends_only_missing_blocks():
    pool = {"kv_blocks": 200, "block_size": 16, "cost_model": LIN, "prefix_cache": {}}
    topo = {"kind": "disaggregated", "prefill": pool, "decode": pool,
            "kv_link": {"bandwidth_GBps": 10, "latency_us": 0}}
    a = _req(0, 0.0, 160, 2, range(1, 11))                                  # 10 blocks
    b = _req(1, 5.0, 224, 2, list(range(1, 11)) + [50, 51, 52, 53])        # a's 10 blocks + 4 new
    res = _run(topo, [a, b])
    a, b = res.requests
    block_bytes = 16 * KV_TOKEN_BYTES
    assert a.kv_transfer_s == pytest.approx(10 * block_bytes / 10e9, rel=1e-12)
    assert b.kv_transfer_s == pytest.approx(4 * block_bytes / 10e9, rel=1e-12)     # the 4 missing
    assert res.topology.links[0].bytes == 14 * block_bytes
    assert res.topology.transfer_bytes_saved == 10 * block_bytes
    off = _run({**topo, "decode": {**pool, "prefix_cache": None}}, [r.clone() for r in (a, b)])
    assert off.requests[1].kv_transfer_s == pytest.approx(14 * block_bytes / 10e9, rel=1e-12)
    # a third request sharing b's first 12 blocks (a's 10 + 2 of b's new ones) sends its 4 others: the saved
    # bytes add up over the transfers, 10 + 12 blocks
    c = _req(2, 10.0, 256, 2, list(range(1, 11)) + [50, 51, 60, 61, 62, 63])
    res = _run(topo, [r.clone() for r in (a, b)] + [c])
    assert res.requests[2].kv_transfer_s == pytest.approx(4 * block_bytes / 10e9, rel=1e-12)
    assert res.topology.transfer_bytes_saved == 22 * block_bytes


# --- workloads -------------------------------------------------------------------------------------
def _mooncake_lists():
    with open(SHARED_TRACES / "mooncake-fast25" / "conversation_trace.jsonl") as f:
        return [json.loads(line)["hash_ids"] for line in f if line.strip()]


def test_mooncake_unlimited_cache_hit_rate_equals_repeated_block_share():
    lists = _mooncake_lists()
    seen, repeated, total = set(), 0, 0              # the oracle: ids seen in any earlier row
    for ids in lists:
        repeated += sum(1 for h in ids if h in seen)
        total += len(ids)
        seen.update(ids)
    tr = load_trace(SHARED_TRACES / "mooncake-fast25" / "conversation_trace.jsonl")
    assert tr.hash_ids is not None and len(tr.hash_ids) == len(lists)
    got = replay_hit_fraction(tr.hash_ids)
    assert got == pytest.approx(repeated / total, abs=1e-12)
    assert 0.36 < got < 0.37                          # the trace README: 36.6 %
    assert replay_hit_fraction(tr.hash_ids, capacity_blocks=2000) < got   # LRU at 1 M tokens loses some


def test_mooncake_scenario_replays_hash_ids(tmp_path):
    rows = [{"timestamp": 0, "input_length": 1100, "output_length": 4, "hash_ids": [5, 6, 7]},
            {"timestamp": 2000, "input_length": 1100, "output_length": 4, "hash_ids": [5, 6, 8]}]
    p = tmp_path / "m.jsonl"
    p.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    sc = config.parse({"model": "llama-3.1-8b", "workload": {"arrival": "trace", "trace": {"path": str(p)}},
                       "topologies": {"t": {"kind": "colocated", "kv_blocks": 500, "cost_model": LIN,
                                            "prefix_cache": {}}}}, "s.yaml")
    reqs = generate(sc, resolve_model(sc))
    assert [r.hash_ids for r in reqs] == [[5, 6, 7], [5, 6, 8]] and reqs[0].hash_block_tokens == 512
    res = simulate(sc)[0]
    # two shared 512-token trace blocks = 64 blocks of 16 tokens
    assert res.requests[1].cached_tokens == 1024


def test_conversation_turns_repeat_their_history_and_system_prompt():
    sc = scenario({"t": {"kind": "colocated", "kv_blocks": 5000, "cost_model": LIN, "prefix_cache": {}}},
                  rate=0.5, num_requests=60, prompt_tokens={"dist": "uniform", "low": 20, "high": 200},
                  output_tokens={"dist": "uniform", "low": 5, "high": 100},
                  conversation={"turns": 4, "think_s": 20, "system_prompts": 2, "system_tokens": 64})
    reqs = generate(sc, resolve_model(sc))
    assert len(reqs) == 60
    sys_ids = {tuple(r.hash_ids[:4]) for r in reqs}
    assert len(sys_ids) == 2                       # every prompt starts with one of two system prompts
    by_prefix = {}
    later = 0
    for r in reqs:                                 # a later turn extends an earlier request's ids (prompt + reply)
        whole = (r.prompt_tokens + r.output_tokens) // 16
        for q in by_prefix.values():
            n = (q.prompt_tokens + q.output_tokens) // 16
            if n > 4 and r.hash_ids[:n] == q.hash_ids[:n] and q.arrival_s <= r.arrival_s:
                assert r.prompt_tokens > q.prompt_tokens + q.output_tokens
                later += 1
                break
        by_prefix[r.id] = r
        assert len(r.hash_ids) == -(-(r.prompt_tokens + r.output_tokens) // 16) and whole <= len(r.hash_ids)
    assert later > 10
    s = metrics.summarize(simulate(sc), metrics.requests_frame(simulate(sc)), sc)["t"]["prefix_cache"]
    assert s["hit_rate"] > 0.3


# --- bad input ---------------------------------------------------------------------------------
def test_bad_input_is_one_line_naming_the_key(tmp_path):
    p = tmp_path / "bad.jsonl"
    p.write_text('{"timestamp": 0, "input_length": 10, "output_length": 2, "hash_ids": [1, "x"]}\n')
    with pytest.raises(TraceError) as e:
        load_trace(p)
    assert "hash_ids" in str(e.value) and "'x'" in str(e.value) and "\n" not in str(e.value)
    p.write_text('{"timestamp": 0, "input_length": 10, "output_length": 2, "hash_ids": [1, 2.5]}\n')
    with pytest.raises(TraceError, match="hash_ids"):
        load_trace(p)
    big = scenario({"t": {"kind": "colocated", "kv_blocks": 100, "cost_model": LIN,
                          "prefix_cache": {"capacity_blocks": 101}}})
    with pytest.raises(ConfigError) as e:
        simulate(big)
    assert "topologies.t.prefix_cache.capacity_blocks = 101" in str(e.value) and "\n" not in str(e.value)
    with pytest.raises(ConfigError) as e:
        scenario({"t": {"kind": "colocated", "prefix_cache": {"host": {"capacity_GiB": 8, "bandwidth_GBps": 0}}}})
    assert "topologies.t.prefix_cache.host.bandwidth_GBps = 0" in str(e.value) and "\n" not in str(e.value)


# --- the fast path with caching on -------------------------------------------------------------
from test_fastpath import _assert_same  # noqa: E402  (the request-by-request comparison)

ROOF = {"device": "h100-sxm"}
PREFIX_TOPOS = st.sampled_from([
    {"kind": "colocated", "replicas": 2, **ROOF, "router": "prefix_aware", "kv_blocks": 60, "prefix_cache": {}},
    {"kind": "colocated", "replicas": 2, **ROOF, "router": "kv_aware", "kv_blocks": 80, "max_running": 4,
     "prefix_cache": {"capacity_blocks": 20, "host": {"capacity_GiB": 0.05, "bandwidth_GBps": 5}}},
    {"kind": "colocated", "replicas": 1, **ROOF, "kv_blocks": 40, "chunked_prefill": {"token_budget": 64},
     "prefix_cache": {}},
    {"kind": "disaggregated", "prefill": {"instances": 2, "kv_blocks": 40, "prefix_cache": {}, **ROOF},
     "decode": {"instances": 2, "kv_blocks": 50, "max_running": 6, "prefix_cache": {}, **ROOF},
     "router": "prefix_aware", "kv_link": {"bandwidth_GBps": 1}},
])


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(topo=PREFIX_TOPOS, seed=st.integers(0, 10**6), n=st.integers(1, 40), rate=st.floats(0.5, 50),
       out=st.integers(1, 200), turns=st.floats(1, 5), horizon=st.sampled_from([None, None, 3.0]))
def test_fast_path_equals_step_by_step_with_caching_on(topo, seed, n, rate, out, turns, horizon):
    sc = scenario({"t": topo}, rate=rate, num_requests=n,
                  prompt_tokens={"dist": "uniform", "low": 1, "high": 200},
                  output_tokens={"dist": "uniform", "low": 1, "high": out},
                  conversation={"turns": turns, "think_s": 0.5, "system_prompts": 2, "system_tokens": 48})
    sc = sc.model_copy(update={"seed": seed, "horizon_s": horizon})
    fast, slow = simulate(sc), simulate(sc, fast=False)
    _assert_same(fast, slow)
    for fi, si in zip(fast[0].topology.instances, slow[0].topology.instances):
        a, b = fi.kv.stats, si.kv.stats
        assert [getattr(a, k) for k in a.__slots__] == [getattr(b, k) for k in b.__slots__], fi.name
        assert list(fi.kv.lru) == list(si.kv.lru) and list(fi.kv.host) == list(si.kv.host)
    assert [r.cached_tokens for r in fast[0].requests] == [r.cached_tokens for r in slow[0].requests]


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(topo=PREFIX_TOPOS, seed=st.integers(0, 10**6), n=st.integers(1, 30), rate=st.floats(1, 40),
       at=st.floats(0.05, 1.5), down=st.floats(0.01, 1), timeout=st.sampled_from([None, 0.3]))
def test_fast_path_equals_step_by_step_with_caching_and_faults(topo, seed, n, rate, at, down, timeout):
    """A failure loses the instance's cache with its KV (both tiers); everything else as without caching."""
    from pdsim.config import FaultsSpec
    sc = scenario({"t": topo}, rate=rate, num_requests=n, timeout_s=timeout,
                  prompt_tokens={"dist": "uniform", "low": 1, "high": 200},
                  output_tokens={"dist": "uniform", "low": 1, "high": 150},
                  conversation={"turns": 3, "think_s": 0.3, "system_prompts": 2, "system_tokens": 48})
    victim = sc.instance_names("t")[-1]
    sc = sc.model_copy(update={"seed": seed, "faults": FaultsSpec.model_validate(
        {"instances": [{"at_s": at, "instance": victim, "down_s": down}]})})
    _assert_same(simulate(sc), simulate(sc, fast=False))


def test_fast_path_equals_step_by_step_known_counterexample_chunked_prefix_fault():
    """Found by hypothesis: the window assumed a queue head that does not fit never fits before the
    window ends; with a token budget an eviction that breaks its cached chain can let it in
    (see test_an_eviction_that_breaks_a_cached_chain_lets_the_queue_head_in_under_a_budget)."""
    from pdsim.config import FaultsSpec
    topo = {"kind": "colocated", "replicas": 1, **ROOF, "kv_blocks": 40, "chunked_prefill": {"token_budget": 64},
            "prefix_cache": {}}
    sc = scenario({"t": topo}, rate=8.0, num_requests=19, timeout_s=None,
                  prompt_tokens={"dist": "uniform", "low": 1, "high": 200},
                  output_tokens={"dist": "uniform", "low": 1, "high": 150},
                  conversation={"turns": 3, "think_s": 0.3, "system_prompts": 2, "system_tokens": 48})
    sc = sc.model_copy(update={"seed": 131071, "faults": FaultsSpec.model_validate(
        {"instances": [{"at_s": 1.0, "instance": sc.instance_names("t")[-1], "down_s": 1.0}]})})
    _assert_same(simulate(sc), simulate(sc, fast=False))


def test_fast_path_pays_a_pending_host_tier_load_like_step_by_step():
    """Found in review: a request re-admitted with all but its last token cached, part of it from the
    host tier, gives a pure-decode plan; the window priced its first step without the host copy the loop
    adds to it (token times 5 ms early, ITL columns differ)."""
    topo = {"kind": "colocated", "replicas": 1, "device": "h100-sxm", "kv_blocks": 40,
            "chunked_prefill": {"token_budget": 64},
            "prefix_cache": {"capacity_blocks": 10, "host": {"capacity_GiB": 0.05, "bandwidth_GBps": 5}}}
    sc = scenario({"t": topo}, rate=35.13036232736373, num_requests=16,
                  prompt_tokens={"dist": "uniform", "low": 1, "high": 200},
                  output_tokens={"dist": "uniform", "low": 1, "high": 187},
                  conversation={"turns": 3, "think_s": 0.3, "system_prompts": 2, "system_tokens": 48})
    sc = sc.model_copy(update={"seed": 550708})
    fast, slow = simulate(sc), simulate(sc, fast=False)
    assert sum(i.kv.stats.host_load_bytes for i in slow[0].topology.instances) > 0     # the case is exercised
    _assert_same(fast, slow)


def test_an_eviction_that_breaks_a_cached_chain_lets_the_queue_head_in_under_a_budget():
    """Worked by hand.  20 blocks of 16 tokens; R runs holding 10 blocks (160 tokens), the other 10 are
    a cached, evictable 10-page chain whose page 2 is least recently used.  B (400 tokens, the same
    first 10 pages) under a 64-token budget (R's decode takes 1, B's chunk 63):
      before R crosses a block: hit 10 pages, revive 10, blocks for 160 + 63 = 14 -> need 10 + 14 - 10 = 14 > 10 free;
      R grows to 11 blocks: 9 free < 10 cached, page 2 (LRU) evicted: hit 2 pages (32 tokens), revive 2,
      blocks for 32 + 63 = 6 -> need 2 + 6 - 2 = 6 <= 9: B is admitted with a 63-token chunk."""
    from collections import deque

    from pdsim.kvcache import page_layout
    from pdsim.scheduler import Limits, chunked
    kv = PrefixKVCache(20, 16)
    _serve(kv, _req(0, 0.0, 160, 1, range(1, 11)))         # a cached 10-page chain, finished
    kv.lru.move_to_end(page_layout(list(range(1, 11)), 16, 16, 160)[0][2], last=False)   # page 2 least recent
    r = Request(1, 0.0, 100, 200)
    r.computed, r.generated = 159, 60         # 159 cached tokens in 10 blocks; its next token is the 160th
    assert kv.grow(r, 159) and kv.free_blocks == 10 and kv.lru_blocks == 10
    b = _req(2, 0.0, 400, 5, list(range(1, 11)) + list(range(100, 115)))
    limits = Limits(max_running=8, max_batched_tokens=64)
    running, waiting = [r], deque([b])
    plan = chunked(running, waiting, kv, limits)       # R: 159 -> 160 stays in 10 blocks, no eviction
    assert [(q.id, n) for q, n in plan.items] == [(1, 1)] and list(waiting) == [b]
    r.computed += 1
    r.generated += 1
    plan = chunked(running, waiting, kv, limits)       # R: 160 -> 161 takes an 11th block, page 2 goes
    assert [(q.id, n) for q, n in plan.items] == [(1, 1), (2, 63)]
    assert b.cached_tokens == 32 and b.blocks == 6 and kv.free_blocks == 3


def test_prefill_flops_saved_match_the_design_formulas():
    """Per DESIGN.md, per layer: linear FLOPs 2 T x params, attention 4 n_h d x attn_work.  A prompt of
    P tokens with h cached saves 2 h params L (linear) + 4 n_h d L (P^2/2 - (P-h)(P+h)/2) = ... + 2 n_h d L h^2."""
    hid, nh, kvh, d, f, L = 4096, 32, 8, 128, 14336, 32            # Llama-3.1-8B
    params = hid * nh * d + 2 * hid * kvh * d + nh * d * hid + 3 * hid * f
    topo = {"kind": "colocated", "replicas": 1, "device": "h100-sxm", "kv_blocks": 500, "prefix_cache": {}}
    sc = scenario({"t": topo})
    res = run_topology(sc, "t", sc.topologies["t"], [_req(0, 0.0, 1024, 2, range(64)), _req(1, 5.0, 1024, 2, range(64))],
                       resolve_model(sc), 1.0)
    h = res.requests[1].cached_tokens
    assert h == 1008
    want = 2 * h * params * L + 2 * nh * d * L * h * h
    got = metrics.prefix_summary(res)["prefill_flops_saved"]
    assert got == pytest.approx(want, rel=1e-9)


def test_cli_reports_an_oversized_cache_in_one_line(tmp_path, capsys):
    from pdsim.__main__ import main
    p = tmp_path / "s.yaml"
    p.write_text("model: llama-3.1-8b\nworkload: {arrival: poisson, rate: 2, num_requests: 5}\n"
                 "topologies:\n  a: {kind: colocated, kv_blocks: 50, prefix_cache: {capacity_blocks: 60}}\n")
    assert main(["run", str(p), "--out", str(tmp_path / "o"), "--quiet"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err
    assert str(p) in err and "topologies.a.prefix_cache.capacity_blocks = 60" in err


# --- page layout and decode-side reservation, by hand (gaps found by mutmut) ---------------------------
def test_page_layout_keys_and_ends_by_hand():
    from pdsim.kvcache import page_layout
    J, S = 24, 10                               # key layout: id << 24 | first block, then << 10 | page size
    # ids of 32 tokens on 16-token blocks: a page is 2 blocks; 80 tokens = 5 whole blocks, the last page short
    keys, ends = page_layout([7, 8, 9], 32, 16, 80)
    assert ends == [2, 4, 5]
    assert keys == [(((7 << J) | 0) << S) | 2, (((8 << J) | 2) << S) | 2, (((9 << J) | 4) << S) | 1]
    # ids of 24 tokens on 16-token blocks (not a multiple): a page per block, keyed by the id holding its
    # last token: blocks end at tokens 15, 31, 47, 63 -> ids 0, 1, 1, 2
    keys, ends = page_layout([5, 6, 7], 24, 16, 64)
    assert ends == [1, 2, 3, 4] and keys == [(5 << J) | 0, (6 << J) | 1, (6 << J) | 2, (7 << J) | 3]
    # an id unit of 1024 blocks or more no longer fits the page-size field: a page per block
    keys, ends = page_layout([3], 16 * 1024, 16, 32)
    assert ends == [1, 2] and keys == [(3 << J) | 0, (3 << J) | 1]
    # ids of 15 tokens: block 0's last token (15) is the first of id 1, block 1's (31) is in id 2
    keys, ends = page_layout([5, 6, 7], 15, 16, 45)
    assert ends == [1, 2] and keys == [(6 << J) | 0, (7 << J) | 1]
    # only whole blocks inside the span the ids cover
    assert page_layout([1, 2], 16, 16, 100) == ([(((1 << J) | 0) << S) | 1, (((2 << J) | 1) << S) | 1], [1, 2])


def test_decode_side_reservation_by_hand():
    """reserve_prefix: a request without ids reserves blocks for ``total`` tokens (default: the tokens
    sent) and hits nothing; with ids it reuses the cached pages, counts the hit, and keeps the watermark."""
    kv = PrefixKVCache(20, 16)
    plain = Request(0, 0.0, 64, 10)
    assert kv.reserve_prefix(plain, 64, 73) == 0 and plain.blocks == 5          # ceil(73 / 16)
    other = Request(1, 0.0, 64, 10)
    assert kv.reserve_prefix(other, 64) == 0 and other.blocks == 4              # total defaults to the tokens
    big = Request(2, 0.0, 200, 10)
    assert kv.reserve_prefix(big, 200) is None and big.blocks == 0 and kv.free_blocks == 11   # 13 > 11 free
    # a cached 4-page prefix (finished request), then two transfers that share it
    kv = PrefixKVCache(40, 16, watermark=0.1)                                    # 4 blocks kept spare
    _serve(kv, _req(0, 0.0, 64, 1, range(1, 5)))
    a, b = _req(1, 0.0, 96, 4, range(1, 7)), _req(2, 0.0, 96, 4, range(1, 7))
    assert kv.reserve_prefix(a, 96) == 64 and kv.stats.transfer_hit_tokens == 64
    assert kv.reserve_prefix(b, 96) == 64 and kv.stats.transfer_hit_tokens == 128  # counts add up
    assert a.blocks == b.blocks == 6 and kv.free_blocks == 40 - 4 - 2 - 2
    # the watermark: exactly free - watermark blocks fit, one more does not
    c = _req(3, 0.0, 16 * 28, 1, range(100, 128))     # 28 fresh blocks; 32 free, 4 kept spare
    assert kv.reserve_prefix(c, 16 * 28) == 0 and c.blocks == 28
    d = _req(4, 0.0, 16, 1, range(200, 201))          # 4 free, all of them the watermark
    assert kv.reserve_prefix(d, 16) is None


def test_host_tier_evictions_and_loads_by_hand():
    """10 GPU blocks of 16 tokens, at most 2 cached on the GPU, a 4-block host tier at 1 MB/s, 1000 B per
    block.  Two finished 4-page chains: each release trims the GPU cache to 2 blocks (LRU, a chain's last
    pages first), the evicted pages go to the host, and the host keeps its 4 most recent (2 evicted).
    Then two prompts hit host pages: 2 + 2 blocks copied in, 0.002 s each, summed for the next step."""
    kv = PrefixKVCache(10, 16, capacity_blocks=2, host_blocks=4, host_bandwidth_Bps=1e6, block_bytes=1000.0)
    for i, ids in enumerate(([1, 2, 3, 4], [11, 12, 13, 14])):
        _serve(kv, _req(i, 0.0, 64, 1, ids))
    # host after both releases: chain 1 pages 0, 1 and chain 2 pages 2, 3 (chain 1's pages 2, 3 pushed out)
    assert (kv.stats.evicted_blocks, kv.stats.host_evicted_blocks, kv.host_used, kv.lru_blocks) == (6, 2, 4, 2)
    b1, b2 = _req(2, 0.0, 80, 2, [1, 2, 3, 4, 9]), _req(3, 0.0, 80, 2, [11, 12, 13, 14, 19])
    assert kv.attach(b1, kv.peek(b1), 80) and b1.cached_tokens == 32     # pages 0, 1 from the host
    assert kv.attach(b2, kv.peek(b2), 80) and b2.cached_tokens == 64     # 0, 1 on the GPU, 2, 3 from the host
    assert kv.stats.host_load_bytes == 4000 and kv.stats.host_hit_tokens == 32 + 32
    assert kv.take_load_s() == pytest.approx(0.004) and kv.load_s == 0.0


def test_replay_hit_fraction_by_hand():
    """Three chains one after another, each id a whole block: [1, 2, 3], [1, 2, 4], [5] -> 7 blocks.
    Unlimited cache: the second finds 1, 2 -> 2 / 7.  Room for one cached block: after the first leaves its
    pages enter the LRU tail first (3, 2, 1), so 3 and 2 are evicted and 1 stays: the second finds only 1,
    then leaves 4, 2, 1 and again keeps 1 -> 1 / 7."""
    lists = [[1, 2, 3], [1, 2, 4], [5]]
    assert replay_hit_fraction(lists) == pytest.approx(2 / 7)
    assert replay_hit_fraction(lists, capacity_blocks=1) == pytest.approx(1 / 7)
    assert replay_hit_fraction([]) == 0.0
    # a chain repeated whole hits every block; half a chain shared hits half
    assert replay_hit_fraction([[7, 8], [7, 8]]) == pytest.approx(2 / 4)
    assert replay_hit_fraction([[7, 8], [7, 9]]) == pytest.approx(1 / 4)


# --- PrefixKVCache unit cases worked by hand (each kills a mutmut survivor; tests/MUTANTS.md) ----------------
def test_a_wholly_cached_prompt_recomputes_its_last_block_into_a_fresh_block():
    """vLLM stops a hit at prompt - 1 tokens (the last token's logits are needed): a 160-token prompt whose
    10 pages are all cached maps 9 of them and computes block 9 into a fresh block; the cached page 9 stays
    evictable.  30 blocks: 9 mapped + 1 fresh in use -> 20 free (the evictable page counts as free)."""
    kv = PrefixKVCache(30, 16)
    _serve(kv, _req(0, 0.0, 160, 2, range(1, 11)))
    assert (kv.free_blocks, kv.lru_blocks) == (30, 10)
    b = _req(1, 0.0, 160, 2, range(1, 11))
    assert kv.peek(b) == 144 and kv.attach(b, 144, 160)
    assert (b.blocks, kv.free_blocks, kv.lru_blocks, kv.peak_used) == (10, 20, 1, 10)
    # two admissions looked up 2 x 160 prompt tokens and found 144 on the GPU
    st_ = kv.stats
    assert (st_.admissions, st_.lookup_tokens, st_.gpu_hit_tokens, st_.host_hit_tokens) == (2, 320, 144, 0)


def test_a_transfer_whose_kv_is_all_cached_takes_no_block_from_a_full_pool():
    """Decode side: 4 blocks, all held by a running request's 4 registered pages.  A transfer of the same
    64 tokens (4 whole pages) needs 0 new blocks and fits a pool with 0 free; one more token needs a block."""
    kv = PrefixKVCache(4, 16)
    run = _req(0, 0.0, 64, 8, range(1, 5))
    assert kv.attach(run, kv.peek(run), 64)
    run.computed = 64
    kv.commit(run)
    assert kv.free_blocks == 0
    same = _req(1, 0.0, 64, 8, range(1, 5))
    assert kv.reserve_prefix(same, 64) == 64 and same.blocks == 4 and kv.free_blocks == 0
    longer = _req(2, 0.0, 65, 8, range(1, 5))
    assert kv.reserve_prefix(longer, 65) is None and longer.blocks == 0


def test_ids_shorter_than_the_prompt_match_every_page_without_running_off_the_end():
    """Ids for 64 tokens of an 80-token prompt: all 4 pages cached (2 on the GPU, 2 on the host tier) is a
    hit of 64 tokens; the lookup stops at the last id.  Host: 2 blocks x 1000 B at 1 MB/s = 2 ms."""
    kv = PrefixKVCache(10, 16, capacity_blocks=2, host_blocks=4, host_bandwidth_Bps=1e6, block_bytes=1000.0)
    _serve(kv, _req(0, 0.0, 64, 1, [1, 2, 3, 4]))
    # the release left 4 evictable blocks; the GPU cache keeps 2 (pages 0, 1: tail first out), host 2, 3
    assert (kv.lru_blocks, kv.host_used) == (2, 2)
    b = _req(1, 0.0, 80, 2, [1, 2, 3, 4])
    assert kv.cached_tokens(b) == 64
    assert kv.peek(b) == 64 and kv.attach(b, 64, 80) and b.cached_tokens == 64
    assert kv.take_load_s() == pytest.approx(0.002)
    c = _req(2, 0.0, 80, 2, [1, 2, 3, 4])                   # the decode side: a transfer of the 80 tokens
    assert kv.reserve_prefix(c, 80) == 64


def test_cached_tokens_is_whole_blocks_below_the_last_token():
    """The routers' signal: a 64-token prompt on one 64-token page (4 blocks) cached: the hit stops before
    the last token, so 3 whole blocks = 48 tokens; a request without ids has none; host pages count."""
    kv = PrefixKVCache(20, 16)
    _serve(kv, _req(0, 0.0, 64, 1, [7], unit=64))
    assert kv.cached_tokens(_req(1, 0.0, 64, 1, [7], unit=64)) == 48
    assert kv.peek(_req(1, 0.0, 64, 1, [7], unit=64)) == 48          # admission sees the same
    assert kv.cached_tokens(Request(2, 0.0, 64, 1)) == 0
    host = PrefixKVCache(10, 16, capacity_blocks=1, host_blocks=4, host_bandwidth_Bps=1e6, block_bytes=1.0)
    _serve(host, _req(0, 0.0, 48, 1, [1, 2, 3]))            # page 0 stays on the GPU, pages 1, 2 on the host
    assert (host.lru_blocks, host.host_used) == (1, 2)
    assert host.cached_tokens(_req(1, 0.0, 64, 1, [1, 2, 3, 4])) == 48          # (1 GPU + 2 host) x 16


def test_a_decode_side_transfer_counts_host_pages_in_its_hit():
    kv = PrefixKVCache(10, 16, capacity_blocks=1, host_blocks=4, host_bandwidth_Bps=1e6, block_bytes=1.0)
    _serve(kv, _req(0, 0.0, 48, 1, [1, 2, 3]))
    r = _req(1, 0.0, 64, 2, [1, 2, 3, 4])
    assert kv.reserve_prefix(r, 64) == 48 and kv.stats.transfer_hit_tokens == 48 and r.blocks == 4


def test_a_page_as_large_as_the_host_tier_moves_there():
    """A host tier of 2 blocks takes an evicted 2-block page (32-token ids on 16-token blocks)."""
    kv = PrefixKVCache(8, 16, capacity_blocks=1, host_blocks=2, host_bandwidth_Bps=1e6, block_bytes=1.0)
    _serve(kv, _req(0, 0.0, 64, 1, [5, 6], unit=32))          # 2 pages of 2 blocks; the GPU keeps none
    assert (kv.lru_blocks, kv.host_used, kv.stats.evicted_blocks) == (0, 2, 4)


def test_admission_into_a_prefix_pool_keeps_the_watermark():
    kv = PrefixKVCache(20, 16, watermark=0.2)                  # 4 blocks spare for running requests
    r = Request(0, 0.0, 16 * 17, 1)
    assert not kv.grow(r, 16 * 17, admit=True) and r.blocks == 0      # 17 > 20 - 4
    assert kv.grow(r, 16 * 16, admit=True) and r.blocks == 16
    assert kv.grow(r, 16 * 17) and r.blocks == 17              # a running request may use the spare


def test_requests_without_ids_leave_a_prefix_pool_cleanly():
    kv = PrefixKVCache(10, 16)
    r = Request(0, 0.0, 40, 2)
    assert kv.peek(r) == 0
    assert kv.attach(r, kv.peek(r), 40) and r.blocks == 3
    assert (kv.stats.admissions, kv.stats.lookup_tokens) == (1, 40)
    r.status = FINISHED
    kv.release(r)
    assert (kv.free_blocks, r.blocks, kv.lru_blocks) == (10, 0, 0)


def test_pages_generated_past_the_prompt_are_cached_when_the_request_leaves():
    """A chat turn: ids describe prompt + reply (64 tokens), the prompt is 32.  While it runs only the
    prompt's 2 pages are shared; when it leaves with 32 + 31 = 63 tokens in cache, page 2 (tokens 32-47)
    is complete and cached too, page 3 (48-63, last token missing) is not: the next turn finds 48 tokens."""
    kv = PrefixKVCache(20, 16)
    r = Request(0, 0.0, 32, 32, hash_ids=[1, 2, 3, 4], hash_block_tokens=16, hash_tokens=64)
    assert kv.attach(r, kv.peek(r), 32)
    r.computed = 32
    kv.commit(r)
    assert kv.grow(r, 63)
    r.computed, r.status = 63, FINISHED
    kv.release(r)
    nxt = Request(1, 0.0, 100, 1, hash_ids=[1, 2, 3, 4, 5], hash_block_tokens=16)
    assert kv.cached_tokens(nxt) == 48


def test_layout_is_per_block_size():
    """A request laid out by a 16-token-block pool, then by a 32-token one (a decode pool of another block
    size): each pool sees its own pages (the memo is keyed on the block size)."""
    from pdsim.kvcache import page_layout
    r = _req(0, 0.0, 64, 1, [1, 2, 3, 4])
    assert PrefixKVCache(10, 16).layout(r) == page_layout([1, 2, 3, 4], 16, 16, 64)
    assert PrefixKVCache(10, 32).layout(r) == page_layout([1, 2, 3, 4], 16, 32, 64)
    assert len(PrefixKVCache(10, 32).layout(r)[0]) == 2


def test_a_reset_forgets_pending_host_loads_and_bad_sizes_are_refused():
    kv = PrefixKVCache(10, 16, capacity_blocks=1, host_blocks=4, host_bandwidth_Bps=1e6, block_bytes=1000.0)
    _serve(kv, _req(0, 0.0, 48, 1, [1, 2, 3]))
    b = _req(1, 0.0, 64, 1, [1, 2, 3, 4])
    assert kv.attach(b, kv.peek(b), 64) and kv.load_s > 0
    kv.reset()                                                 # the instance failed: its memory is gone
    assert (kv.load_s, kv.free_blocks, kv.lru_blocks, kv.host_used) == (0.0, 10, 0, 0)
    PrefixKVCache(10, 16, capacity_blocks=1)                   # the smallest cache: one block
    PrefixKVCache(10, 16, host_blocks=1, host_bandwidth_Bps=0.5)
    with pytest.raises(AssertionError):
        PrefixKVCache(10, 16, capacity_blocks=0)
    with pytest.raises(AssertionError):
        PrefixKVCache(10, 16, host_blocks=1, host_bandwidth_Bps=0.0)


def test_prompt_pages_become_shareable_as_chunks_complete_them():
    """Chunked prefill of a 48-token prompt (3 pages) in chunks ending at 8, 16 and 32 tokens: after each
    commit another request with the same ids finds 0, 16 and 32 tokens (a page exactly completed counts)."""
    kv = PrefixKVCache(20, 16)
    r = _req(0, 0.0, 48, 2, [1, 2, 3])
    assert kv.attach(r, kv.peek(r), 8)
    probe = _req(1, 0.0, 64, 1, [1, 2, 3, 4])
    for computed, want in ((8, 0), (16, 16), (32, 32)):
        assert kv.grow(r, computed)
        r.computed = computed
        kv.commit(r)
        assert kv.cached_tokens(probe) == want, computed


def test_a_hit_admission_keeps_the_watermark_unless_the_request_was_running():
    """20 blocks, watermark 4; a cached 4-page prefix (evictable, so free).  A new 17-block prompt with that
    prefix needs 4 revived + 13 fresh = 17 > 20 - 4: refused.  Without the watermark (admit=False, e.g. a
    request that was running) a 20-block prompt needs 4 + 16 = 20 blocks: exactly the 20 free, it fits."""
    kv = PrefixKVCache(20, 16, watermark=0.2)
    _serve(kv, _req(0, 0.0, 64, 1, [1, 2, 3, 4]))
    new = _req(1, 0.0, 16 * 17, 1, range(1, 18))
    assert kv.attach(new, kv.peek(new), 16 * 17) is False and new.blocks == 0 and kv.free_blocks == 20
    again = _req(2, 0.0, 16 * 20, 1, range(1, 21))
    assert kv.attach(again, kv.peek(again), 16 * 20, admit=False) and again.blocks == 20 and kv.free_blocks == 0
    plain = Request(3, 0.0, 16 * 17, 1)                       # no ids: the same rule through grow
    kv2 = PrefixKVCache(20, 16, watermark=0.2)
    assert kv2.attach(plain, kv2.peek(plain), 16 * 17) is False
    assert kv2.attach(plain, kv2.peek(plain), 16 * 17, admit=False) and plain.blocks == 17


def test_a_page_computed_again_replaces_its_host_copy():
    """GPU cache 1 block, host tier 1 block.  Chain [1, 2] served: page (1, 0) stays on the GPU, page (2, 1)
    goes to the host.  A prompt [9, 2] misses at page 0, so it computes page (2, 1) again: the GPU copy wins
    and the host's copy is dropped (host empty)."""
    kv = PrefixKVCache(10, 16, capacity_blocks=1, host_blocks=1, host_bandwidth_Bps=1e6, block_bytes=1.0)
    _serve(kv, _req(0, 0.0, 32, 1, [1, 2]))
    assert (kv.lru_blocks, kv.host_used, len(kv.host)) == (1, 1, 1)
    r = _req(1, 0.0, 32, 2, [9, 2])
    assert kv.peek(r) == 0 and kv.attach(r, 0, 32)
    r.computed = 32
    kv.commit(r)
    assert (kv.host_used, len(kv.host)) == (0, 0)
