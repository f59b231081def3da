"""Hand-worked tests of pdsim/kvcache.py written against mutmut survivors (tests/MUTANTS.md section 2).

Every expected value is worked out by hand in the test's comments (block counts, free counts,
evictions, hits, host-tier loads), never by running pdsim a second way.  Pools are tiny: blocks of
16 tokens, one hash id per block unless a test says otherwise.
"""
from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
from test_prefix import _serve  # noqa: E402  (admit, compute, finish, leave: the same helper)

from pdsim.kvcache import KVCache, PrefixKVCache, SlidingKVCache, page_layout  # noqa: E402
from pdsim.workload import FINISHED, UNFINISHED, Request  # noqa: E402


def _req(i, prompt, out, ids, unit=16):
    return Request(i, 0.0, prompt, out, hash_ids=list(ids), hash_block_tokens=unit)



# --- the plain pool -------------------------------------------------------------------------------
def test_pool_sizes_at_their_bounds_and_the_defaults():
    """The smallest pool is one block; 0 blocks, a fractional pool or 0-token blocks are refused;
    1-token blocks are allowed.  Without arguments a pool has vLLM's 16-token blocks and no
    watermark, and a fresh pool has used nothing."""
    kv = KVCache(1)
    assert (kv.block_size, kv.watermark_blocks, kv.free_blocks, kv.used_blocks, kv.peak_used) == (16, 0, 1, 0, 0)
    assert kv.blocks_for(17) == 2                         # ceil(17 / 16)
    assert KVCache(10, 1).blocks_for(17) == 17
    for bad in ((0,), (2.5,), (10, 0)):
        with pytest.raises(AssertionError):
            KVCache(*bad)
    s = SlidingKVCache(1)
    assert (s.block_size, s.watermark_blocks, s.extra, s.peak_used) == (16, 0, 0, 0)
    p = PrefixKVCache(1)
    assert (p.block_size, p.watermark_blocks, p.capacity_blocks, p.host_blocks, p.peak_used) == (16, 0, 1, 0, 0)
    assert PrefixKVCache(10, 16, capacity_blocks=10).capacity_blocks == 10     # the cache may be the whole pool
    with pytest.raises(AssertionError):
        PrefixKVCache(10, 16, capacity_blocks=11)
    with pytest.raises(AssertionError):
        PrefixKVCache(10, 16, host_blocks=1)              # a host tier needs a bandwidth (default 0)


def test_fits_ever_and_reserve_keep_the_watermark_exactly():
    """10 blocks, watermark 0.2 -> int(0.2 x 10) = 2 blocks spare: 8 blocks = 128 tokens fit, 129 tokens
    (9 blocks) never do; a decode-side reservation is an admission and keeps the same 2 spare."""
    kv = KVCache(10, 16, 0.2)
    assert kv.watermark_blocks == 2
    assert kv.fits_ever(128) and not kv.fits_ever(129)
    r = Request(0, 0.0, 129, 1)
    assert kv.reserve(r, 129) is False and (r.blocks, kv.free_blocks) == (0, 10)
    assert kv.reserve(r, 128) is True and (r.blocks, kv.free_blocks, kv.used_blocks, kv.peak_used) == (8, 2, 8, 8)
    kv.release(r)
    assert (r.blocks, kv.free_blocks, kv.used_blocks, kv.peak_used) == (0, 10, 0, 8)   # the peak stays


def test_a_released_request_holds_nothing_in_a_sliding_pool():
    """Window of 2 extra blocks: 17 tokens take ceil(17 / 16) = 2 + 2 = 4 blocks; release gives back all 4."""
    kv = SlidingKVCache(10, 16, 0.0, extra=2)
    r = Request(0, 0.0, 17, 1)
    assert kv.grow(r, 17) and (r.blocks, kv.held(r), kv.free_blocks) == (2, 4, 6)
    kv.release(r)
    assert (r.blocks, kv.held(r), kv.free_blocks) == (0, 0, 10)


# --- page layout --------------------------------------------------------------------------------------
def test_page_layout_refuses_a_context_of_two_to_the_24_blocks():
    """A key keeps the engine block index in 24 bits: a context of 2^24 blocks is refused, one block less is
    laid out.  Ids of 1023 x 16 tokens (1023-block pages, the largest page the 10-bit size field takes):
    2^24 - 1 = 16,777,215 blocks = 16,400 full pages (16,777,200 blocks) + a last page of 15 blocks."""
    ids = [1] * 16401                                    # 16,401 x 16,368 tokens >= 2^28 = 2^24 blocks of 16
    with pytest.raises(AssertionError):
        page_layout(ids, 1023 * 16, 16, 1 << 28)
    keys, ends = page_layout(ids, 1023 * 16, 16, (1 << 28) - 16)
    assert len(keys) == len(ends) == 16401
    assert ends[-2:] == [16400 * 1023, (1 << 24) - 1]
    assert keys[-1] == (((1 << 24) | 16777200) << 10) | 15


# --- prefix cache: lookups, host tier, admission -------------------------------------------------------
def test_a_host_page_at_the_hit_limit_is_not_copied_in():
    """GPU cache of 2 blocks, host tier of 4.  A 48-token chain [1, 2, 3] served: its pages enter the LRU tail
    first (2, 1, 0), so page 2 goes to the host and pages 0, 1 stay on the GPU.  The same 48-token prompt
    again: the hit stops at (48 - 1) // 16 = 2 blocks, reached on the GPU; page 2 is recomputed into a fresh
    block, so nothing is copied from the host (no load, page 2 stays there).  10 blocks - 3 = 7 free."""
    kv = PrefixKVCache(10, 16, capacity_blocks=2, host_blocks=4, host_bandwidth_Bps=1e6, block_bytes=1000.0)
    _serve(kv, _req(0, 48, 1, [1, 2, 3]))
    assert (kv.lru_blocks, kv.host_used, kv.stats.evicted_blocks) == (2, 1, 1)
    b = _req(1, 48, 1, [1, 2, 3])
    assert kv.peek(b) == 32 and kv.attach(b, 32, 48)
    assert (b.blocks, kv.free_blocks, kv.lru_blocks, kv.host_used, b.cached_tokens) == (3, 7, 0, 1, 32)
    assert (kv.load_s, kv.stats.host_load_bytes, kv.stats.host_hit_tokens) == (0.0, 0.0, 0)


def test_a_host_hit_admission_counts_its_copied_blocks_and_gives_them_back():
    """10 blocks, GPU cache 2 blocks, host tier 4 blocks at 1 MB/s, 1000 B a block.

    Chain [1, 2, 3] served (48 tokens): pages 0, 1 stay on the GPU (evictable, counted free), page 2 on the
    host.  A prompt [1, 2, 3, 4] (64 tokens, 4 blocks) then hits 2 GPU pages and 1 host page (48 tokens) and
    needs 2 revived + 1 copied + 1 fresh = 4 free blocks.
    - a running request without ids holds 7 blocks: 3 free, one short: refused, nothing changes;
    - it holds 6 instead: 4 free, an exact fit: 0 free after, the host page's copy is 1000 B = 1 ms,
      the host tier is empty, 32 GPU + 16 host tokens hit.
    Computed and released: its 4 pages enter the LRU 3, 2, 1, 0; the cache keeps 2 blocks, so pages 3 and 2
    go to the host (2 blocks there), 1 + 2 = 3 evicted in all, and 10 - 6 = 4 blocks are free again.
    A third identical prompt finds pages 0, 1 on the GPU and page 2 on the host: again 4 blocks, an exact fit;
    the counters add up over the three admissions: 32 + 32 GPU and 16 + 16 host tokens, 2 ms of loads."""
    kv = PrefixKVCache(10, 16, capacity_blocks=2, host_blocks=4, host_bandwidth_Bps=1e6, block_bytes=1000.0)
    _serve(kv, _req(0, 48, 1, [1, 2, 3]))
    assert (kv.free_blocks, kv.lru_blocks, kv.host_used) == (10, 2, 1)
    filler = Request(9, 0.0, 112, 1)
    assert kv.grow(filler, 7 * 16) and kv.free_blocks == 3
    b = _req(1, 64, 1, [1, 2, 3, 4])
    assert kv.peek(b) == 48
    assert kv.attach(b, 48, 64) is False
    assert (b.blocks, b.computed, kv.free_blocks, kv.lru_blocks, kv.host_used, kv.load_s) == (0, 0, 3, 2, 1, 0.0)
    kv.release(filler)
    filler = Request(10, 0.0, 96, 1)
    assert kv.grow(filler, 6 * 16) and kv.free_blocks == 4
    assert kv.peek(b) == 48 and kv.attach(b, 48, 64)
    assert (b.blocks, b.computed, b.cached_tokens, kv.free_blocks, kv.lru_blocks, kv.host_used) == (4, 48, 48, 0, 0, 0)
    assert kv.load_s == pytest.approx(0.001) and kv.stats.host_load_bytes == 1000.0
    assert (kv.stats.gpu_hit_tokens, kv.stats.host_hit_tokens, kv.peak_used) == (32, 16, 10)
    b.computed = 64
    kv.commit(b)
    b.status = FINISHED
    kv.release(b)
    assert (b.blocks, kv.free_blocks, kv.lru_blocks, kv.host_used) == (0, 4, 2, 2)
    assert (kv.stats.evicted_blocks, kv.stats.host_evicted_blocks) == (3, 0)
    c = _req(2, 64, 1, [1, 2, 3, 4])
    assert kv.peek(c) == 48 and kv.attach(c, 48, 64) and (c.blocks, kv.free_blocks) == (4, 0)
    st = kv.stats
    assert (st.admissions, st.lookup_tokens, st.gpu_hit_tokens, st.host_hit_tokens) == (3, 48 + 64 + 64, 64, 32)
    assert kv.take_load_s() == pytest.approx(0.002) and st.host_load_bytes == 2000.0
    # the admissions that found a prefix, as (tokens to compute without the cache, tokens found): b and c
    assert list(st.hits) == [64, 48, 64, 48]


def test_a_readmission_after_preemption_logs_its_known_tokens_and_its_new_hit():
    """A 48-token chain [1, 2, 3] served, then a request of the same prompt that had generated 5 tokens before
    a preemption is admitted again: it must recompute 48 + 5 = 53 tokens, finds (53 - 1) // 16 = 3 pages
    (48 tokens) cached, and the stats log (53, 48); its first admission's hit (none: it was the first) is not
    overwritten in the log, only in ``cached_tokens``, which keeps the last admission's."""
    kv = PrefixKVCache(20, 16)
    a = _req(0, 48, 10, [1, 2, 3])
    assert kv.peek(a) == 0 and kv.attach(a, 0, 48)
    a.computed = 48
    kv.commit(a)
    b = _req(1, 48, 10, [1, 2, 3])
    assert kv.peek(b) == 32 and kv.attach(b, 32, 48)        # (48 - 1) // 16 = 2 pages while a holds them
    b.computed, b.generated = 53, 5
    kv.release(b)                                           # preempted: its blocks go back
    b.computed, b.status = 0, UNFINISHED
    assert kv.peek(b) == 48 and kv.attach(b, 48, 53)
    assert (kv.stats.admissions, b.cached_tokens) == (3, 48)
    assert list(kv.stats.hits) == [48, 32, 53, 48]


def test_peek_is_zero_for_a_request_already_holding_kv():
    """peek's contract: a request that already holds blocks or has computed tokens gets 0 (it is not a new
    admission), even when its prefix is cached (here 16 tokens of [1, 2])."""
    kv = PrefixKVCache(10, 16)
    _serve(kv, _req(0, 32, 1, [1, 2]))
    fresh = _req(1, 32, 1, [1, 2])
    assert kv.peek(fresh) == 16
    holding = _req(2, 32, 1, [1, 2])
    assert kv.grow(holding, 32) and holding.computed == 0
    assert kv.peek(holding) == 0
    computed = _req(3, 32, 1, [1, 2])
    computed.computed = 8
    assert kv.peek(computed) == 0


# --- prefix cache: registering pages ----------------------------------------------------------------
def test_a_prompt_shorter_than_one_block_registers_nothing_and_leaves_cleanly():
    """Ids for a 10-token prompt: no whole block, no page (an empty layout).  Its 1 block (2 after one
    output token: 11 tokens is still 1 block) is private; commit and release cache nothing and give it back."""
    kv = PrefixKVCache(4, 16)
    r = _req(0, 10, 2, [1])
    assert kv.layout(r) == ([], [])
    assert kv.peek(r) == 0 and kv.attach(r, 0, 10) and r.blocks == 1
    r.computed = 10
    kv.commit(r)
    assert kv.grow(r, 11) and r.blocks == 1
    r.computed, r.status = 11, FINISHED
    kv.commit(r)
    kv.release(r)
    assert (r.blocks, kv.free_blocks, kv.lru_blocks, kv.cached_blocks) == (0, 4, 0, 0)


def test_pages_registered_chunk_by_chunk_have_their_own_sizes():
    """A 48-token prompt [1, 2, 3] computed in two chunks, 16 then 48 tokens: page 0 is registered after the
    first, pages 1 and 2 after the second, one block each: 3 cached blocks (not 2 + 1 + 1 or a negative one).
    Released, the 3 blocks are evictable and free: 10 free, 3 in the LRU."""
    kv = PrefixKVCache(10, 16)
    r = _req(0, 48, 1, [1, 2, 3])
    assert kv.attach(r, kv.peek(r), 16)
    r.computed = 16
    kv.commit(r)
    assert kv.cached_blocks == 1
    assert kv.grow(r, 48)
    r.computed = 48
    kv.commit(r)
    assert kv.cached_blocks == 3 and sorted(kv.size.values()) == [1, 1, 1]
    r.status = FINISHED
    kv.release(r)
    assert (kv.free_blocks, kv.lru_blocks, kv.cached_blocks) == (10, 3, 3)


def test_reply_pages_cached_at_release_are_evictable_and_revived_by_the_next_turn():
    """20 blocks.  An unrelated 17-token request leaves 1 evictable page.  A chat turn: ids [1, 2, 3, 4]
    describe prompt + reply (64 tokens), the prompt is 32 tokens (pages 0, 1 registered at commit).  It
    leaves with 63 tokens (4 blocks): page 2 (blocks up to 3) is complete and is cached as it leaves, page 3
    is not (its last token is missing).  LRU now 1 + 3 = 4 blocks, all 20 free.
    The next turn [1, 2, 3, 4, 5] (80 tokens) finds pages 0-2 = 48 tokens, revives all three (evictable)
    and takes 2 fresh blocks: 20 - 3 - 2 = 15 free, the unrelated page the only one left in the LRU."""
    kv = PrefixKVCache(20, 16)
    _serve(kv, _req(7, 17, 1, [90, 91]))
    assert kv.lru_blocks == 1
    r = Request(0, 0.0, 32, 32, hash_ids=[1, 2, 3, 4], hash_block_tokens=16, hash_tokens=64)
    assert kv.attach(r, kv.peek(r), 32)
    r.computed = 32
    kv.commit(r)
    assert kv.grow(r, 63) and (r.blocks, kv.free_blocks) == (4, 16)
    r.computed, r.status = 63, FINISHED
    kv.release(r)
    assert (kv.free_blocks, kv.lru_blocks, kv.cached_blocks) == (20, 4, 4)
    nxt = _req(1, 80, 1, [1, 2, 3, 4, 5])
    assert kv.peek(nxt) == 48 and kv.attach(nxt, 48, 80)
    assert (nxt.blocks, nxt.cached_tokens, kv.free_blocks, kv.lru_blocks) == (5, 48, 15, 1)


def test_a_prefix_found_only_on_the_host_becomes_shareable_as_its_chunks_complete():
    """Ids of 32 tokens on 16-token blocks: pages of 2 blocks.  A GPU cache of 1 block keeps no page, so the
    served chain [5, 6] (64 tokens, 2 pages) goes wholly to the 4-block host tier.  A 192-token prompt
    [5, ..., 10] (6 pages, ends 2, 4, ..., 12) then hits 0 GPU + 2 host pages = 64 tokens (4 blocks copied).
    Its first step runs to 96 tokens (6 blocks): 20 - 6 = 14 free, and page 2 (blocks 4-5) is complete, so a
    probe with the same ids finds pages 0-2 = 96 tokens; after the whole prompt, all 6 pages = 192 tokens."""
    kv = PrefixKVCache(20, 16, capacity_blocks=1, host_blocks=4, host_bandwidth_Bps=1e6, block_bytes=1000.0)
    _serve(kv, _req(0, 64, 1, [5, 6], unit=32))
    assert (kv.lru_blocks, kv.host_used, kv.stats.evicted_blocks) == (0, 4, 4)
    b = _req(1, 192, 1, range(5, 11), unit=32)
    assert kv.peek(b) == 64 and kv.attach(b, 64, 96)
    assert (b.blocks, kv.free_blocks, kv.host_used) == (6, 14, 0)
    assert kv.take_load_s() == pytest.approx(4 * 1000 / 1e6)
    probe = _req(2, 224, 1, range(5, 12), unit=32)
    b.computed = 96
    kv.commit(b)
    assert kv.cached_tokens(probe) == 96
    assert kv.grow(b, 192) and kv.free_blocks == 8
    b.computed = 192
    kv.commit(b)
    assert kv.cached_tokens(probe) == 192


def test_a_page_larger_than_the_host_tier_is_dropped_without_flushing_the_tier():
    """GPU cache of 1 block, host tier of 2 blocks.  Chain X = [7, 8] (32 tokens, two 1-block pages) served:
    page X1 goes to the host, X0 stays on the GPU.  Then A: ids of 64 tokens (4-block pages), an 80-token
    prompt = 5 blocks -> pages A0 (4 blocks) and A1 (1 block).  A's release makes the LRU X0, A1, A0 (6 blocks)
    and trims it to 1: X0 -> host (2 used), A1 -> host (3 > 2: X1, the host's LRU, goes), A0 is larger than the
    whole host tier and is simply dropped.  Host: X0, A1 = 2 blocks; 1 + 6 = 7 evicted from the GPU, 1 from the
    host; X's first page is still found (16 tokens)."""
    kv = PrefixKVCache(10, 16, capacity_blocks=1, host_blocks=2, host_bandwidth_Bps=1e6, block_bytes=1.0)
    _serve(kv, _req(0, 32, 1, [7, 8]))
    assert (kv.lru_blocks, kv.host_used, kv.stats.evicted_blocks) == (1, 1, 1)
    a = _req(1, 80, 1, [1, 2], unit=64)
    assert kv.layout(a)[1] == [4, 5]
    _serve(kv, a)
    assert (kv.free_blocks, kv.lru_blocks, kv.host_used, len(kv.host)) == (10, 0, 2, 2)
    assert (kv.stats.evicted_blocks, kv.stats.host_evicted_blocks) == (7, 1)
    assert kv.cached_tokens(_req(2, 32, 1, [7, 8])) == 16


def test_a_page_computed_twice_stays_private_after_the_shared_copy_is_evicted():
    """20 blocks, GPU cache of 1 block.  R ([1, 2, 3], 48 tokens, chunks of 16 then 48) and S ([1], 17 tokens)
    run together.  S completes page (1, 0) first and registers it; R completes its own copy next: the page is
    already cached, so R's block stays private (vLLM keeps the first copy).  S leaves (its page evictable),
    then T ([9], 17 tokens) is served and its page pushes S's copy out (cache of 1 block).  R's second chunk
    registers its pages 1 and 2 only: its page 0 stays private, so a probe [1, 2, 3, 4] misses at page 0 and
    finds 0 tokens; cached on the GPU: R's 2 pages + T's 1 = 3 blocks; 20 - 3 (R) = 17 free."""
    kv = PrefixKVCache(20, 16, capacity_blocks=1)
    r, s = _req(0, 48, 1, [1, 2, 3]), _req(1, 17, 1, [1])
    assert kv.attach(r, kv.peek(r), 16) and kv.attach(s, kv.peek(s), 17) and kv.free_blocks == 17
    s.computed = 17
    kv.commit(s)
    r.computed = 16
    kv.commit(r)
    assert kv.cached_blocks == 1                            # one copy of page (1, 0): S's
    s.status = FINISHED
    kv.release(s)
    _serve(kv, _req(2, 17, 1, [9]))
    assert (kv.stats.evicted_blocks, kv.lru_blocks, kv.free_blocks) == (1, 1, 19)
    assert kv.grow(r, 48) and r.blocks == 3
    r.computed = 48
    kv.commit(r)
    assert kv.cached_tokens(_req(3, 64, 1, [1, 2, 3, 4])) == 0
    assert (kv.cached_blocks, kv.free_blocks) == (3, 17)
