"""Paged KV-cache block accounting for one instance.  Pure: no SimPy.

A request holds ``ceil(tokens / block_size)`` blocks for the tokens in its
cache.  ``grow`` returns False when the pool cannot supply the blocks: the
scheduler decides what to do (wait or preempt), as vLLM's
``allocate_slots`` returning None does.
"""
from __future__ import annotations

from array import array
from collections import OrderedDict

from .workload import Request


class KVCache:
    __slots__ = ("total_blocks", "block_size", "free_blocks", "watermark_blocks", "peak_used")
    prefix_on = False      # PrefixKVCache: full blocks with known hashes stay cached for reuse
    load_s = 0.0           # host-tier loads the next step waits for (PrefixKVCache only)
    ranked = False         # RankedKVCache: one pool per attention rank

    def __init__(self, total_blocks: int, block_size: int = 16, watermark: float = 0.0):
        assert isinstance(total_blocks, int) and total_blocks > 0, total_blocks
        assert block_size > 0
        self.total_blocks = total_blocks
        self.block_size = block_size
        self.free_blocks = total_blocks
        # admission keeps this many blocks spare so running requests can grow (vLLM's watermark)
        self.watermark_blocks = int(watermark * total_blocks)
        self.peak_used = 0

    @property
    def used_blocks(self) -> int:
        return self.total_blocks - self.free_blocks

    def blocks_for(self, tokens: int) -> int:
        return -(-tokens // self.block_size)

    def fits_ever(self, tokens: int) -> bool:
        """Could a request of this many tokens be admitted by an otherwise empty pool?

        Admission keeps the watermark spare, and a preempted (or failed-over) request is
        re-admitted with all its tokens, so the bound is total minus watermark, not total.
        """
        return self.blocks_for(tokens) <= self.max_request_blocks()

    def max_request_blocks(self) -> int:
        """The most blocks one request can be admitted with (an empty pool less the watermark)."""
        return self.total_blocks - self.watermark_blocks

    def requests_fit(self, blocks_each: int) -> int:
        """Requests of ``blocks_each`` blocks an empty pool admits at once."""
        return self.max_request_blocks() // max(1, blocks_each)

    def could_admit(self, req: Request, tokens: int) -> bool:
        """Would ``grow(req, tokens, admit=True)`` succeed now?  (Nothing changes.)"""
        return self.blocks_for(tokens) - req.blocks <= self.free_blocks - self.watermark_blocks

    def grow(self, req: Request, tokens: int, admit: bool = False) -> bool:
        """Make ``req`` hold blocks for ``tokens`` cached tokens; False (nothing changed) if the pool is short.

        ``admit`` applies the watermark: a new request is not let in if it would eat the
        headroom that running requests need to decode.
        """
        need = self.blocks_for(tokens) - req.blocks
        if need <= 0:
            return True
        spare = self.free_blocks - (self.watermark_blocks if admit else 0)
        if need > spare:
            return False
        self.free_blocks -= need
        req.blocks += need
        used = self.total_blocks - self.free_blocks
        if used > self.peak_used:
            self.peak_used = used
        return True

    def reserve(self, req: Request, tokens: int) -> bool:
        """Blocks for KV that arrives from elsewhere (a prefill instance's transfer)."""
        return self.grow(req, tokens, admit=True)

    def reset(self) -> None:
        """Every block free again (the instance failed and lost its memory)."""
        self.free_blocks = self.total_blocks

    def release(self, req: Request) -> None:
        self.free_blocks += req.blocks
        req.blocks = 0
        assert self.free_blocks <= self.total_blocks, (self.free_blocks, self.total_blocks)

    def held(self, req: Request) -> int:
        """Blocks ``req`` holds in this pool."""
        return req.blocks


class RankedKVCache(KVCache):
    """A DP-attention instance whose requests keep an attention rank (``attention_dp_balance``): every rank is
    a GPU with its own KV pool, as in TensorRT-LLM, so a request takes blocks from its own rank's pool only
    (``total_blocks`` // ``ranks`` each; a remainder is unused, and the watermark applies per rank).  One
    rank running short neither borrows another's free blocks nor stops it.  ``free_blocks`` and
    ``peak_used`` stay the instance's sums.  The rank a request's blocks came from is remembered here (a
    request handed from a prefill pool to a decode pool gets a new rank on the decode side)."""
    __slots__ = ("ranks", "per_rank", "rank_free", "rank_watermark", "owner", "rank_peak")
    ranked = True

    def __init__(self, total_blocks: int, block_size: int = 16, watermark: float = 0.0, ranks: int = 2):
        assert ranks >= 2 and total_blocks >= ranks, (total_blocks, ranks)
        per = total_blocks // ranks
        super().__init__(per * ranks, block_size, watermark)
        self.ranks, self.per_rank = ranks, per
        self.rank_watermark = int(watermark * per)
        self.watermark_blocks = self.rank_watermark * ranks
        self.rank_free = [per] * ranks
        self.owner: dict[int, int] = {}     # request id -> the rank its blocks here belong to
        self.rank_peak = 0                  # the most blocks any one rank held at once

    def max_request_blocks(self) -> int:
        return self.per_rank - self.rank_watermark

    def requests_fit(self, blocks_each: int) -> int:
        return self.ranks * (self.max_request_blocks() // max(1, blocks_each))

    def could_admit(self, req: Request, tokens: int) -> bool:
        j = self.owner.get(req.id, req.rank)
        return self.blocks_for(tokens) - req.blocks <= self.rank_free[j] - self.rank_watermark

    def grow(self, req: Request, tokens: int, admit: bool = False) -> bool:
        need = self.blocks_for(tokens) - req.blocks
        if need <= 0:
            return True
        j = self.owner.get(req.id)
        if j is None:
            j = req.rank
            assert 0 <= j < self.ranks, (req.id, j)
        if need > self.rank_free[j] - (self.rank_watermark if admit else 0):
            return False
        self.owner[req.id] = j
        self.rank_free[j] -= need
        self.free_blocks -= need
        req.blocks += need
        if self.per_rank - self.rank_free[j] > self.rank_peak:
            self.rank_peak = self.per_rank - self.rank_free[j]
        used = self.total_blocks - self.free_blocks
        if used > self.peak_used:
            self.peak_used = used
        return True

    def reset(self) -> None:
        super().reset()
        self.rank_free = [self.per_rank] * self.ranks
        self.owner.clear()

    def release(self, req: Request) -> None:
        j = self.owner.pop(req.id, None)
        if j is not None:
            self.rank_free[j] += req.blocks
            assert self.rank_free[j] <= self.per_rank, (j, self.rank_free[j], self.per_rank)
        else:
            assert req.blocks == 0, (req.id, req.blocks)
        super().release(req)

    def rank_used(self) -> list[int]:
        """Blocks in use on each rank."""
        return [self.per_rank - f for f in self.rank_free]


class SlidingKVCache(KVCache):
    """The pool of a model with sliding-window layers (vLLM's hybrid KV manager, simplified).

    A block is ``block_size`` tokens of the FULL-attention layers' KV.  A request holding any KV also
    holds ``extra`` blocks (:meth:`pdsim.models.ModelShape.sliding_extra_blocks`) for its sliding layers'
    window, taken with its first blocks and returned at release.  ``req.blocks`` counts only the
    full-layer blocks, ceil(tokens / block_size), so every token -> block formula the schedulers and the
    multi-step fast path use on ``req.blocks`` stays as it is; what a request holds in all is
    :meth:`held`, and :meth:`blocks_for` (admission checks, capacity) counts the extra blocks too."""
    __slots__ = ("extra",)

    def __init__(self, total_blocks: int, block_size: int = 16, watermark: float = 0.0, extra: int = 0):
        super().__init__(total_blocks, block_size, watermark)
        assert extra >= 0
        self.extra = extra

    def blocks_for(self, tokens: int) -> int:
        return -(-tokens // self.block_size) + self.extra if tokens > 0 else 0

    def grow(self, req: Request, tokens: int, admit: bool = False) -> bool:
        need = -(-tokens // self.block_size) - req.blocks
        if need <= 0:
            return True
        take = need + (self.extra if req.blocks == 0 else 0)     # the window's blocks come with the first ones
        spare = self.free_blocks - self.watermark_blocks if admit else self.free_blocks
        if take > spare:
            return False
        self.free_blocks -= take
        req.blocks += need
        used = self.total_blocks - self.free_blocks
        if used > self.peak_used:
            self.peak_used = used
        return True

    def release(self, req: Request) -> None:
        if req.blocks:
            self.free_blocks += req.blocks + self.extra
        req.blocks = 0
        assert self.free_blocks <= self.total_blocks, (self.free_blocks, self.total_blocks)

    def held(self, req: Request) -> int:
        return req.blocks + self.extra if req.blocks else 0


# --- prefix caching ------------------------------------------------------------------------
# A request that carries ``hash_ids`` (one id per ``hash_block_tokens`` tokens of its content, a
# hash *chain* as in Mooncake's traces and vLLM's automatic prefix caching: equal id at position
# i means equal content from token 0 up to the end of block i) can reuse the KV of a prefix that
# an instance still holds.  Ids come at the trace's granularity (512 tokens in Mooncake's traces)
# and are mapped onto the engine's block size.  When the id unit is a multiple of the engine
# block (512 = 32 x 16), the cache keeps one entry per id, a *page* of unit/bs engine blocks (the
# last page of a request may be shorter): the trace says nothing finer, so pages hit or miss as a
# whole, and bookkeeping per page instead of per block keeps the simulator fast on 100k-token
# prompts.  Otherwise each engine block is its own page, keyed by the id of the trace block that
# holds its last token.  Either way a key is (id, first engine block, blocks of the page): the id
# fixes the whole content up to its end, so a hit on a page means everything before it is identical.
# Only whole engine blocks inside the span the ids cover are cacheable.

_J_BITS = 24    # engine block index inside a key (16 M blocks: far past any context length)
_S_BITS = 10    # page size (engine blocks) inside a key


def page_layout(hash_ids, unit_tokens: int, block_size: int, tokens: int) -> tuple[list[int], list[int]]:
    """(keys, ends) of the cacheable pages of the first ``tokens`` tokens: ``ends[p]`` is the
    engine block index just past page p."""
    n = min(tokens, len(hash_ids) * unit_tokens) // block_size
    assert n < 1 << _J_BITS, n
    if unit_tokens % block_size == 0 and unit_tokens // block_size < 1 << _S_BITS:
        per = unit_tokens // block_size
        ends = [min(n, (p + 1) * per) for p in range(-(-n // per))]
        # the page's size is part of its key: a short last page is not the same content as a full one
        keys = [(((h << _J_BITS) | (p * per)) << _S_BITS) | (e - p * per)
                for p, (h, e) in enumerate(zip(hash_ids, ends))]
        return keys, ends
    keys = [(hash_ids[((j + 1) * block_size - 1) // unit_tokens] << _J_BITS) | j for j in range(n)]
    return keys, list(range(1, n + 1))


class PrefixStats:
    """Counters of one instance's prefix cache (tokens; block counts times block size)."""
    __slots__ = ("lookup_tokens", "gpu_hit_tokens", "host_hit_tokens", "host_load_bytes", "evicted_blocks",
                 "host_evicted_blocks", "admissions", "transfer_hit_tokens", "hits")

    def __init__(self):
        self.lookup_tokens = self.gpu_hit_tokens = self.host_hit_tokens = 0
        self.host_load_bytes = 0.0
        self.evicted_blocks = self.host_evicted_blocks = self.admissions = 0
        self.transfer_hit_tokens = 0
        # every admission that found a prefix: (tokens it had to compute without the cache, tokens found),
        # flat; what metrics.prefix_summary prices under this instance's cost model (a re-admission after
        # a preemption counts again, as it does in gpu_hit_tokens / host_hit_tokens)
        self.hits = array("q")


class PrefixKVCache(KVCache):
    """A paged KV pool whose full blocks with a known content hash stay cached after their
    request leaves, for later requests with the same prefix (vLLM's automatic prefix caching).

    Accounting: a cached page that no running request references is *evictable*.  Its blocks
    count as free in ``free_blocks`` (an allocation may take them at any time), so every user of
    the plain pool (schedulers, the fast path, routers) sees the free count it would see without
    caching.  The cache keeps at most ``min(free_blocks, capacity_blocks)`` evictable blocks: when
    an allocation eats into them, the least recently used pages go first (``trim`` after every
    allocation; the fast path's bulk decode growth trims when it settles, which evicts the same
    pages because nothing is released or looked up inside a window).  A page referenced by
    several running requests is held once; a page a running request references is never evicted.

    A request admitted with a cached prefix computes only the rest, but always at least the
    prompt's last token: the hit stops at prompt - 1 tokens, so a wholly cached prompt recomputes
    its last block into a fresh block, as vLLM does (the cached copy of that page stays evictable).  Pages are registered (become
    shareable) when a step completes them within the prompt, and at release for pages past the
    prompt (generated tokens whose hash a later conversation turn carries).  Two requests that
    compute the same page at the same time keep two copies, as vLLM does.  Released pages enter
    the LRU tail-first, so a prefix's last pages are evicted before its first ones.

    ``host_blocks > 0`` adds a host-memory tier: pages evicted from GPU go there (an LRU of its
    own) and a hit there is copied into free GPU blocks at ``host_bandwidth_Bps``; the copy runs
    before the step that admits the request and that step waits for it (the whole batch waits: a
    pessimistic choice; engines that overlap the load with other work do better).
    """
    __slots__ = ("rc", "size", "lru", "lru_blocks", "capacity_blocks", "host", "host_used", "host_blocks",
                 "host_bandwidth_Bps", "block_bytes", "held", "stats", "load_s", "_peek")
    prefix_on = True

    def __init__(self, total_blocks: int, block_size: int = 16, watermark: float = 0.0,
                 capacity_blocks: int | None = None, host_blocks: int = 0, host_bandwidth_Bps: float = 0.0,
                 block_bytes: float = 0.0):
        super().__init__(total_blocks, block_size, watermark)
        assert capacity_blocks is None or 0 < capacity_blocks <= total_blocks, capacity_blocks
        assert host_blocks == 0 or host_bandwidth_Bps > 0
        self.capacity_blocks = total_blocks if capacity_blocks is None else capacity_blocks
        self.rc: dict[int, int] = {}                 # page key -> running requests referencing it (0: evictable)
        self.size: dict[int, int] = {}               # page key -> engine blocks (pages on the GPU)
        self.lru: OrderedDict[int, int] = OrderedDict()    # evictable pages (key -> blocks), LRU first
        self.lru_blocks = 0
        self.host: OrderedDict[int, int] = OrderedDict()   # host tier (key -> blocks), LRU first
        self.host_used = 0
        self.host_blocks, self.host_bandwidth_Bps, self.block_bytes = host_blocks, host_bandwidth_Bps, block_bytes
        # request id -> [referenced keys, blocks those map for it, pages considered for registration,
        #                engine block where the next page to register ends]
        self.held: dict[int, list] = {}
        self.stats = PrefixStats()
        self.load_s = 0.0                            # host-tier loads the next step must wait for
        self._peek = None

    # --- reading the cache -----------------------------------------------------------
    def layout(self, req: Request) -> tuple[list[int], list[int]]:
        """The request's pages (memoised on the request for this block size)."""
        memo = req.block_keys
        if memo is not None and memo[0] == self.block_size:
            return memo[1]
        lay = page_layout(req.hash_ids, req.hash_block_tokens, self.block_size,
                          req.hash_tokens or req.prompt_tokens)
        req.block_keys = (self.block_size, lay)
        return lay

    def grow(self, req: Request, tokens: int, admit: bool = False) -> bool:
        ok = KVCache.grow(self, req, tokens, admit)
        if self.lru_blocks > self.free_blocks:
            self.trim()
        return ok

    def trim(self) -> None:
        limit = min(self.free_blocks, self.capacity_blocks)
        lru = self.lru
        while self.lru_blocks > limit:
            k, n = lru.popitem(last=False)
            self.lru_blocks -= n
            del self.rc[k]
            del self.size[k]
            self.stats.evicted_blocks += n
            if self.host_blocks and n <= self.host_blocks:
                self.host[k] = n
                self.host_used += n
                while self.host_used > self.host_blocks:
                    _, m = self.host.popitem(last=False)
                    self.host_used -= m
                    self.stats.host_evicted_blocks += m

    def match(self, req: Request, max_tokens: int) -> tuple[int, int, int, int, int]:
        """(GPU pages, host pages, GPU blocks, host blocks, GPU blocks now evictable) of the
        longest cached prefix whose pages start before block ``max_tokens // block_size``.
        Read-only apart from ``trim``."""
        if req.hash_ids is None:
            return 0, 0, 0, 0, 0
        self.trim()
        keys, ends = self.layout(req)
        limit = max_tokens // self.block_size
        rc, host = self.rc, self.host
        n = len(keys)
        p = start = revive = 0
        while p < n and start < limit:
            c = rc.get(keys[p])
            if c is None:
                break
            if c == 0:
                revive += ends[p] - start
            start = ends[p]
            p += 1
        g, gb = p, start
        while p < n and start < limit and keys[p] in host:
            start = ends[p]
            p += 1
        return g, p - g, gb, start - gb, revive

    def cached_tokens(self, req: Request) -> int:
        """Tokens of ``req``'s prompt a new admission here would not compute (routers' signal)."""
        g, h, gb, hb, _ = self.match(req, req.prompt_tokens - 1)
        return min(gb + hb, (req.prompt_tokens - 1) // self.block_size) * self.block_size

    def peek(self, req: Request) -> int:
        """Cached tokens for admitting ``req`` (nothing taken yet); 0 for a request already holding KV."""
        if req.hash_ids is None or req.blocks or req.computed:
            self._peek = None
            return 0
        m = self.match(req, req.known - 1)
        self._peek = (req, m)
        return min(m[2] + m[3], (req.known - 1) // self.block_size) * self.block_size

    # --- taking and giving back ---------------------------------------------------------
    def _need(self, req: Request, m, tokens: int) -> int:
        """Free blocks an admission with match ``m`` and ``tokens`` in all takes."""
        g, h, gb, hb, revive = m
        return revive + hb + max(0, self.blocks_for(tokens) - gb - hb)

    def _take(self, req: Request, m) -> None:
        g, h, gb, hb, _ = m
        keys, ends = self.layout(req)
        rc, lru = self.rc, self.lru
        for k in keys[:g]:
            c = rc[k]
            if c == 0:
                n = lru.pop(k)
                self.lru_blocks -= n
                self.free_blocks -= n
            rc[k] = c + 1
        for k in keys[g:g + h]:              # host hits: fresh GPU blocks, copied in over PCIe
            n = self.host.pop(k)
            self.host_used -= n
            rc[k] = 1
            self.size[k] = n
            self.free_blocks -= n
        if hb:
            load = hb * self.block_bytes
            self.load_s += load / self.host_bandwidth_Bps
            self.stats.host_load_bytes += load
        req.blocks = gb + hb
        self.held[req.id] = [keys[:g + h], gb + hb, g + h, ends[g + h] if g + h < len(keys) else 1 << 62]
        used = self.total_blocks - self.free_blocks
        if used > self.peak_used:
            self.peak_used = used
        if self.lru_blocks > self.free_blocks:
            self.trim()

    def attach(self, req: Request, hit_tokens: int, tokens: int, admit: bool = True) -> bool:
        """Admit ``req`` with the prefix ``peek`` found and blocks for ``tokens`` in all; False
        (nothing changed) if the pool is short.  Counts the lookup in the stats."""
        peeked, self._peek = self._peek, None
        if not hit_tokens:
            if not self.grow(req, tokens, admit=admit):
                return False
            if not req.computed:
                self._count(req, 0, 0)
            return True
        p, m = peeked
        assert p is req and req.computed == 0
        if self._need(req, m, tokens) > self.free_blocks - (self.watermark_blocks if admit else 0):
            return False
        self._take(req, m)
        req.computed = hit_tokens
        gpu = min(m[2] * self.block_size, hit_tokens)
        self._count(req, gpu, hit_tokens - gpu)
        return self.grow(req, tokens, admit=False)

    def reserve_prefix(self, req: Request, tokens: int, total: int | None = None) -> int | None:
        """Blocks for KV arriving from a prefill instance (``tokens`` of it; blocks for ``total`` tokens
        in all, default ``tokens``), reusing the prefix this pool holds: the tokens already here (the
        transfer sends only the rest), or None if the pool is short."""
        assert req.blocks == 0
        total = tokens if total is None or total < tokens else total
        if req.hash_ids is None:
            return 0 if self.reserve(req, total) else None
        m = self.match(req, tokens)
        if self._need(req, m, total) > self.free_blocks - self.watermark_blocks:
            return None
        self._take(req, m)
        assert self.grow(req, total)
        hit = min((m[2] + m[3]) * self.block_size, tokens)
        self.stats.transfer_hit_tokens += hit
        return hit

    def _count(self, req: Request, gpu_tokens: int, host_tokens: int) -> None:
        s = self.stats
        s.admissions += 1
        s.lookup_tokens += req.prompt_tokens
        s.gpu_hit_tokens += gpu_tokens
        s.host_hit_tokens += host_tokens
        req.cached_tokens = hit = gpu_tokens + host_tokens
        if hit:
            s.hits.append(req.known)
            s.hits.append(hit)

    def take_load_s(self) -> float:
        t, self.load_s = self.load_s, 0.0
        return t

    def _register(self, req: Request, entry: list, upto_block: int, evictable: bool) -> None:
        """Pages of ``req`` between the last one considered and ``upto_block`` become cached."""
        if upto_block < entry[3]:    # the next page is not complete yet
            return
        keys, ends = self.layout(req)
        p = entry[2]
        if p >= len(keys) or ends[p] > upto_block:
            entry[3] = ends[p] if p < len(keys) else 1 << 62
            return
        rc, size, refs = self.rc, self.size, entry[0]
        new = []
        start = ends[p - 1] if p else 0
        while p < len(keys) and ends[p] <= upto_block:
            k = keys[p]
            if k not in rc:          # a page computed twice stays private (no de-duplication)
                n = ends[p] - start
                size[k] = n
                if evictable:
                    rc[k] = 0
                    new.append((k, n))
                else:
                    rc[k] = 1
                    refs.append(k)
                    entry[1] += n
                if self.host_blocks and k in self.host:     # computed again: the GPU copy wins
                    self.host_used -= self.host.pop(k)
            start = ends[p]
            p += 1
        entry[2] = p
        entry[3] = ends[p] if p < len(keys) else 1 << 62
        for k, n in reversed(new):   # tail first
            self.lru[k] = n
            self.lru_blocks += n

    def commit(self, req: Request) -> None:
        """Register ``req``'s computed prompt pages (shareable from now on)."""
        if req.hash_ids is None:
            return
        entry = self.held.get(req.id)
        if entry is None:
            entry = self.held[req.id] = [[], 0, 0, 0]
        self._register(req, entry, min(req.computed, req.prompt_tokens) // self.block_size, False)

    def release(self, req: Request) -> None:
        entry = self.held.pop(req.id, None)
        freed = req.blocks
        if entry is not None:
            refs, mapped = entry[0], entry[1]
            freed -= mapped                   # private blocks
            # pages past the prompt (generated tokens a later turn repeats) are cached as they leave
            # (private blocks turned evictable: still free, so ``freed`` does not change)
            if req.hash_ids is not None:
                self._register(req, entry, min(req.computed // self.block_size, req.blocks), True)
            rc, lru, size = self.rc, self.lru, self.size
            for k in reversed(refs):          # tail first: a prefix's last pages are evicted first
                c = rc[k] - 1
                rc[k] = c
                if c == 0:
                    n = size[k]
                    lru[k] = n
                    self.lru_blocks += n
                    freed += n
        self.free_blocks += freed
        req.blocks = 0
        if self.lru_blocks > self.capacity_blocks:
            self.trim()
        if req.status == "finished":         # the request is done: drop its memoised pages
            req.block_keys = None
        assert self.free_blocks <= self.total_blocks, (self.free_blocks, self.total_blocks)

    def reset(self) -> None:
        super().reset()
        for d in (self.rc, self.size, self.lru, self.host, self.held):
            d.clear()
        self.lru_blocks = self.host_used = 0
        self.load_s = 0.0
        self._peek = None

    @property
    def cached_blocks(self) -> int:
        """Blocks on the GPU holding a registered prefix (referenced or evictable)."""
        self.trim()
        return sum(self.size.values())


def replay_hit_fraction(hash_lists, unit_tokens: int = 512, capacity_blocks: int | None = None) -> float:
    """Share of hash blocks a :class:`PrefixKVCache` finds cached when requests come one at a time
    (each looks up its chain, takes the hit, computes the rest and leaves), at the trace's own
    block size with each id a whole block: the cache's logic without concurrency, the engine's
    last-token minimum or a partial last block.  ``capacity_blocks`` None: room for everything."""
    from .workload import FINISHED
    lists = [list(ids) for ids in hash_lists]
    total = sum(len(ids) for ids in lists)
    pool = max(1, max((len(ids) for ids in lists), default=1) + (capacity_blocks or total))
    kv = PrefixKVCache(pool, unit_tokens, 0.0, capacity_blocks=capacity_blocks)
    hits = 0
    for i, ids in enumerate(lists):
        tokens = len(ids) * unit_tokens
        req = Request(i, 0.0, tokens, 1, hash_ids=ids, hash_block_tokens=unit_tokens)
        m = kv.match(req, tokens)
        kv._take(req, m)
        hits += m[0]
        req.computed = tokens
        assert kv.grow(req, tokens)
        kv.commit(req)
        req.status = FINISHED
        kv.release(req)
    return hits / total if total else 0.0
