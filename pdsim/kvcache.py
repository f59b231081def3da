"""Paged KV-cache block accounting for one instance.  Pure: no SimPy.

A request holds ``ceil(tokens / block_size)`` blocks for the tokens in its
cache.  ``grow`` returns False when the pool cannot supply the blocks: the
scheduler decides what to do (wait or preempt), as vLLM's
``allocate_slots`` returning None does.
"""
from __future__ import annotations

from .workload import Request


class KVCache:
    __slots__ = ("total_blocks", "block_size", "free_blocks", "watermark_blocks", "peak_used")

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
