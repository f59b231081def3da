"""Paged KV-cache block accounting for one instance.  Pure: no SimPy.

A request holds ``ceil(tokens / block_size)`` blocks for the tokens in its
cache.  ``grow`` returns False when the pool cannot supply the blocks: the
scheduler decides what to do (wait or preempt), as vLLM's
``allocate_slots`` returning None does.
"""
from __future__ import annotations

from collections import OrderedDict

from .workload import Request


class KVCache:
    __slots__ = ("total_blocks", "block_size", "free_blocks", "watermark_blocks", "peak_used")
    prefix_on = False      # PrefixKVCache: full blocks with known hashes stay cached for reuse
    load_s = 0.0           # host-tier loads the next step waits for (PrefixKVCache only)

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
        return self.blocks_for(tokens) <= self.total_blocks - self.watermark_blocks

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


# --- prefix caching ------------------------------------------------------------------------
# A request that carries ``hash_ids`` (one id per ``hash_block_tokens`` tokens of its content, a
# hash *chain* as in Mooncake's traces and vLLM's automatic prefix caching: equal id at position
# i means equal content from token 0 up to the end of block i) can reuse the KV of a prefix that
# an instance still holds.  Ids are given at the trace's granularity (512 tokens in Mooncake's
# traces) and mapped onto the engine's block size: engine block j (tokens [j*bs, (j+1)*bs)) is
# identified by the id of the trace block that holds its last token, plus j.  That id fixes the
# whole content up to the end of its trace block, so (id, j) fixes the content of engine blocks
# 0..j: a hit on engine block j means blocks 0..j are identical.  Only whole engine blocks inside
# the span the ids cover are cacheable.

_J_BITS = 24    # engine block index inside a key (16 M blocks: far past any context length)


def block_keys(hash_ids, unit_tokens: int, block_size: int, tokens: int) -> list[int]:
    """Keys of the whole engine blocks of the first ``tokens`` tokens that ``hash_ids`` covers."""
    n = min(tokens, len(hash_ids) * unit_tokens) // block_size
    assert n < 1 << _J_BITS, n
    if unit_tokens % block_size == 0:
        per = unit_tokens // block_size
        return [(hash_ids[j // per] << _J_BITS) | j for j in range(n)]
    return [(hash_ids[((j + 1) * block_size - 1) // unit_tokens] << _J_BITS) | j for j in range(n)]


class PrefixStats:
    """Counters of one instance's prefix cache (tokens; block counts times block size)."""
    __slots__ = ("lookup_tokens", "gpu_hit_tokens", "host_hit_tokens", "host_load_bytes", "evicted_blocks",
                 "host_evicted_blocks", "admissions",
                 "transfer_hit_tokens")

    def __init__(self):
        self.lookup_tokens = self.gpu_hit_tokens = self.host_hit_tokens = 0
        self.host_load_bytes = 0.0
        self.evicted_blocks = self.host_evicted_blocks = self.admissions = 0
        self.transfer_hit_tokens = 0


class PrefixKVCache(KVCache):
    """A paged KV pool whose full blocks with a known content hash stay cached after their
    request leaves, for later requests with the same prefix (vLLM's automatic prefix caching).

    Accounting: a cached block that no running request references is *evictable*.  It counts as
    free in ``free_blocks`` (an allocation may take it at any time), so every user of the plain
    pool (schedulers, the fast path, routers) sees the same free count as without caching.  The
    cache keeps at most ``min(free_blocks, capacity_blocks)`` evictable blocks: when allocations
    eat into them, the least recently used go first (``trim`` after every allocation; the fast
    path's bulk decode growth trims when it settles, which evicts the same blocks because nothing
    is released or looked up inside a window).  A block referenced by several running requests is held once; a block a
    running request references is never evicted.

    Blocks are registered (become shareable) when a step completes a prompt block with a known
    hash, and at release for blocks past the prompt (generated tokens whose hash a later turn of
    the conversation carries).  Two requests that compute the same block at the same time keep
    two copies, as vLLM does.  Released blocks enter the LRU tail-first, so a prefix's last
    blocks are evicted before its first ones.

    ``host_blocks > 0`` adds a host-memory tier: blocks evicted from GPU go there (LRU of its own)
    and a hit there is copied back into a free GPU block at ``host_bandwidth_Bps``; the copy runs
    before the step that admits the request (the whole batch waits: a pessimistic choice, engines
    that overlap the load with other work do better).
    """
    __slots__ = ("rc", "lru", "capacity_blocks", "host", "host_blocks", "host_bandwidth_Bps", "block_bytes",
                 "held", "stats", "load_s", "_peek")
    prefix_on = True

    def __init__(self, total_blocks: int, block_size: int = 16, watermark: float = 0.0,
                 capacity_blocks: int | None = None, host_blocks: int = 0, host_bandwidth_Bps: float = 0.0,
                 block_bytes: float = 0.0):
        super().__init__(total_blocks, block_size, watermark)
        assert capacity_blocks is None or 0 < capacity_blocks <= total_blocks, capacity_blocks
        assert host_blocks == 0 or host_bandwidth_Bps > 0
        self.capacity_blocks = total_blocks if capacity_blocks is None else capacity_blocks
        self.rc: dict[int, int] = {}                 # key -> running requests referencing it (0: evictable)
        self.lru: OrderedDict[int, None] = OrderedDict()   # evictable keys, least recently used first
        self.host: OrderedDict[int, None] = OrderedDict()  # host tier, least recently used first
        self.host_blocks, self.host_bandwidth_Bps, self.block_bytes = host_blocks, host_bandwidth_Bps, block_bytes
        self.held: dict[int, list] = {}              # request id -> [referenced keys, blocks considered]
        self.stats = PrefixStats()
        self.load_s = 0.0                            # host-tier loads the next step must wait for
        self._peek = None

    def grow(self, req: Request, tokens: int, admit: bool = False) -> bool:
        ok = KVCache.grow(self, req, tokens, admit)
        if len(self.lru) > self.free_blocks:
            self.trim()
        return ok

    # --- reading the cache -----------------------------------------------------------
    def keys(self, req: Request) -> list[int]:
        """The request's engine-block keys (memoised on the request for this block size)."""
        memo = req.block_keys
        if memo is not None and memo[0] == self.block_size:
            return memo[1]
        ks = block_keys(req.hash_ids, req.hash_block_tokens, self.block_size,
                        req.prompt_tokens + req.output_tokens)
        req.block_keys = (self.block_size, ks)
        return ks

    def trim(self) -> None:
        limit = min(self.free_blocks, self.capacity_blocks)
        lru, rc = self.lru, self.rc
        while len(lru) > limit:
            k, _ = lru.popitem(last=False)
            del rc[k]
            self.stats.evicted_blocks += 1
            if self.host_blocks:
                self.host[k] = None
                if len(self.host) > self.host_blocks:
                    self.host.popitem(last=False)
                    self.stats.host_evicted_blocks += 1

    def match(self, req: Request, max_tokens: int) -> tuple[int, int]:
        """(GPU-tier blocks, host-tier blocks) of the longest cached prefix within ``max_tokens``.
        Read-only apart from the lazy LRU trim."""
        if req.hash_ids is None:
            return 0, 0
        self.trim()
        ks = self.keys(req)
        n = min(len(ks), max_tokens // self.block_size)
        rc, host = self.rc, self.host
        j = 0
        while j < n and ks[j] in rc:
            j += 1
        g = j
        while j < n and ks[j] in host:
            j += 1
        return g, j - g

    def cached_tokens(self, req: Request) -> int:
        """Tokens of ``req``'s prompt a new admission here would not compute (routers' signal).
        The engine always computes at least the prompt's last token (it emits the first token)."""
        g, h = self.match(req, req.prompt_tokens - 1)
        return (g + h) * self.block_size

    def peek(self, req: Request) -> int:
        """Cached tokens for admitting ``req`` (nothing taken yet); 0 for a request already holding KV."""
        if req.hash_ids is None or req.blocks or req.computed:
            self._peek = None
            return 0
        g, h = self.match(req, req.known - 1)
        self._peek = (req, g, h)
        return (g + h) * self.block_size

    # --- taking and giving back ---------------------------------------------------------
    def _take(self, req: Request, g: int, h: int) -> list:
        ks = self.keys(req)
        rc, lru = self.rc, self.lru
        for k in ks[:g]:
            if rc[k] == 0:
                del lru[k]
                self.free_blocks -= 1
            rc[k] += 1
        for k in ks[g:g + h]:                 # host hits: a fresh GPU block each, loaded over PCIe
            del self.host[k]
            rc[k] = 1
            self.free_blocks -= 1
        if h:
            load = h * self.block_bytes
            self.load_s += load / self.host_bandwidth_Bps
            self.stats.host_load_bytes += load
        req.blocks = g + h
        if h:
            self.trim()
        entry = [ks[:g + h], g + h]
        self.held[req.id] = entry
        return entry

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
        p, g, h = peeked
        assert p is req and (g + h) * self.block_size == hit_tokens and req.computed == 0
        revive = sum(1 for k in self.keys(req)[:g] if self.rc[k] == 0)
        need = revive + h + self.blocks_for(tokens) - (g + h)
        if need > self.free_blocks - (self.watermark_blocks if admit else 0):
            return False
        self._take(req, g, h)
        req.computed = hit_tokens
        self._count(req, g, h)
        return self.grow(req, tokens, admit=False)

    def reserve_prefix(self, req: Request, tokens: int) -> int | None:
        """Blocks for KV arriving from a prefill instance, reusing the prefix this pool holds:
        the tokens already here (the transfer sends only the rest), or None if the pool is short."""
        assert req.blocks == 0
        if req.hash_ids is None:
            return 0 if self.reserve(req, tokens) else None
        g, h = self.match(req, tokens)
        ks = self.keys(req)
        revive = sum(1 for k in ks[:g] if self.rc[k] == 0)
        if revive + h + self.blocks_for(tokens) - (g + h) > self.free_blocks - self.watermark_blocks:
            return None
        self._take(req, g, h)
        assert self.grow(req, tokens)
        self.stats.transfer_hit_tokens += (g + h) * self.block_size
        return (g + h) * self.block_size

    def _count(self, req: Request, g: int, h: int) -> None:
        s = self.stats
        s.admissions += 1
        s.lookup_tokens += req.prompt_tokens
        s.gpu_hit_tokens += g * self.block_size
        s.host_hit_tokens += h * self.block_size
        req.cached_tokens = (g + h) * self.block_size

    def take_load_s(self) -> float:
        t, self.load_s = self.load_s, 0.0
        return t

    def commit(self, req: Request, upto_tokens: int | None = None) -> None:
        """Register ``req``'s computed prompt blocks (shareable from now on)."""
        if req.hash_ids is None:
            return
        limit = min(req.computed, req.prompt_tokens if upto_tokens is None else upto_tokens) // self.block_size
        entry = self.held.get(req.id)
        if entry is None:
            entry = self.held[req.id] = [[], 0]
        if limit <= entry[1]:
            return
        ks = self.keys(req)
        rc, refs = self.rc, entry[0]
        for j in range(entry[1], min(limit, len(ks))):
            k = ks[j]
            if k not in rc:          # a copy computed twice stays private (no de-duplication)
                rc[k] = 1
                refs.append(k)
                if self.host_blocks:
                    self.host.pop(k, None)   # computed again: the GPU copy supersedes the host one
        entry[1] = limit

    def release(self, req: Request) -> None:
        entry = self.held.pop(req.id, None)
        if entry is None:
            refs, done = (), 0
        else:
            refs, done = entry
        freed = req.blocks - len(refs)       # private blocks
        rc, lru = self.rc, self.lru
        if req.hash_ids is not None and req.computed // self.block_size > done:
            ks = self.keys(req)
            # blocks past the prompt (generated tokens a later turn repeats): cached as they leave
            for j in range(min(req.computed // self.block_size, len(ks), req.blocks) - 1, done - 1, -1):
                k = ks[j]
                if k not in rc:
                    rc[k] = 0
                    lru[k] = None
                    if self.host_blocks:
                        self.host.pop(k, None)
        for k in reversed(refs):             # tail first: a prefix's last blocks are evicted first
            c = rc[k] - 1
            rc[k] = c
            if c == 0:
                lru[k] = None
                freed += 1
        self.free_blocks += freed
        req.blocks = 0
        if len(lru) > self.capacity_blocks:
            self.trim()
        if req.status == "finished":         # the request is done: drop its memoised keys
            req.block_keys = None
        assert self.free_blocks <= self.total_blocks, (self.free_blocks, self.total_blocks)

    def reset(self) -> None:
        super().reset()
        self.rc.clear()
        self.lru.clear()
        self.host.clear()             # the host tier is lost with the instance as well
        self.held.clear()
        self.load_s = 0.0
        self._peek = None

    @property
    def cached_blocks(self) -> int:
        """Blocks on the GPU holding a registered prefix (referenced or evictable)."""
        self.trim()
        return len(self.rc)


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
        g, h = kv.match(req, tokens)
        kv._take(req, g, h)
        hits += g
        req.computed = tokens
        assert kv.grow(req, tokens)
        kv.commit(req)
        req.status = FINISHED
        kv.release(req)
    return hits / total if total else 0.0
