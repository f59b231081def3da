"""Batch formation: which requests advance by how many tokens in the next step.  Pure: no SimPy.

Policies are plain functions chosen by name (``SCHEDULERS``):

- ``fcfs``: vLLM v0-style continuous batching.  Waiting prompts are admitted
  first-come first-served and a step holds either whole prefills or decodes,
  prefill first: new prompts stall running decodes (the interference that
  disaggregation removes).
- ``chunked``: Sarathi-Serve / vLLM v1 chunked prefill.  Every step first
  carries one token for each running decode, then fills the rest of a token
  budget with prefill chunks, so decodes never wait behind a long prompt.
- ``inflight``: TensorRT-LLM's in-flight batching with chunked prefill off (its
  default, ``enable_chunked_prefill=False``).  Every step first carries one token
  for each running decode, then admits *whole* waiting prompts first-come
  first-served while they fit the rest of the token budget (``max_num_tokens``);
  the first prompt that does not fit stops admission for this step, as the
  engine's micro-batch scheduler does.  A prompt larger than the whole budget
  runs alone in a step with nothing else in it.

A DP-attention pool with ``attention_dp_balance`` is scheduled by :class:`BalancedDP` around
``chunked`` or ``inflight``: each request keeps its rank, each rank its own token budget, and new
prompts wait as TensorRT-LLM's attention-DP balance makes them wait.

All preempt by recompute: when a running request cannot get a block to grow,
the newest running request gives up its KV and goes back to the front of the
queue, to be prefilled again from its prompt and generated tokens.
"""
from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from .kvcache import KVCache
from .workload import Request


@dataclass(slots=True)
class StepPlan:
    items: list = field(default_factory=list)      # [(request, new_tokens)]
    preempted: list = field(default_factory=list)  # requests that lost their KV this step
    tokens: int = 0
    attn_work: float = 0.0
    kv_read_tokens: int = 0
    sampled: int = 0
    lost_tokens: int = 0                            # cached tokens dropped by preemption
    cached_tokens: int = 0                          # prompt tokens admitted from the prefix cache

    def add(self, req: Request, n: int) -> None:
        c = req.computed
        self.items.append((req, n))
        self.tokens += n
        self.attn_work += n * (c + 0.5 * n)   # each new token attends to the cache before it
        self.kv_read_tokens += c + n
        if c + n == req.prompt_tokens + req.generated:     # req.known, inlined: called per request per step
            self.sampled += 1

    swa = None      # sliding layers' (work, KV read): only a SlidingStepPlan has them


@dataclass(slots=True)
class SlidingStepPlan(StepPlan):
    """A step of a model with sliding-window layers (window ``window``): also sums, as integers, the
    sliding layers' positions (sum over new tokens of min(position, W)) and KV reads
    (:func:`pdsim.costmodel.sliding_aggregates`).  Only such models build it: :class:`StepPlan`'s ``add``,
    the hottest function, is untouched for the others."""
    window: int = 0
    swa_pos: int = 0
    swa_kv: int = 0

    def add(self, req: Request, n: int) -> None:
        c = req.computed
        self.items.append((req, n))
        self.tokens += n
        self.attn_work += n * (c + 0.5 * n)
        self.kv_read_tokens += c + n
        if c + n == req.prompt_tokens + req.generated:
            self.sampled += 1
        W = self.window
        # sliding_positions(c, n, W) inlined (see its docstring for the closed form)
        a, b = c + 1, c + n
        if b <= W:
            self.swa_pos += (a + b) * n // 2
        elif a >= W:
            self.swa_pos += n * W
        else:
            self.swa_pos += (a + W) * (W - a + 1) // 2 + (b - W) * W
        self.swa_kv += b if b < n + W - 1 else n + W - 1

    @property
    def swa(self) -> tuple[float, int]:
        """(work, KV read) of the sliding layers: sum of (min(p, W) - 1/2) over new tokens, and KV tokens."""
        return self.swa_pos - 0.5 * self.tokens, self.swa_kv


@dataclass(slots=True)
class Limits:
    max_running: int = 256              # requests in the running batch
    max_batched_tokens: int = 8192      # tokens in one step (the chunked policy's token budget)
    reserve_full: bool = False          # admission takes blocks for the whole sequence (kv_reservation: full)
    window: int | None = None           # the model's sliding window (None: no sliding layers)
    # the most prompt tokens one request computes in a step (None: the budget): under DP attention a request
    # runs on one rank, whose share of the budget is budget / ranks (SGLang splits chunked_prefill_size so)
    max_chunk: int | None = None


def _preempt(victim: Request, kv: KVCache, running: list, waiting: deque, plan: StepPlan) -> None:
    running.remove(victim)
    kv.release(victim)
    victim.recomputed_tokens += victim.computed
    plan.lost_tokens += victim.computed
    victim.computed = 0
    victim.preemptions += 1
    waiting.appendleft(victim)
    plan.preempted.append(victim)


def _grow_running(req: Request, n: int, kv: KVCache, running: list, waiting: deque,
                  plan: StepPlan, scheduled: set) -> bool:
    """Blocks for ``req`` to advance by n, preempting the newest unscheduled others (on a pool per attention
    rank, :class:`~pdsim.kvcache.RankedKVCache`: of req's own rank, the only ones whose blocks it can use);
    False if req itself went."""
    while not kv.grow(req, req.computed + n):
        victim = next((r for r in reversed(running) if r is not req and id(r) not in scheduled
                       and (not kv.ranked or r.rank == req.rank)), None)
        if victim is None:
            _preempt(req, kv, running, waiting, plan)
            return False
        _preempt(victim, kv, running, waiting, plan)
    return True


def final_kv_tokens(req: Request) -> int:
    """Tokens a request's KV holds when it finishes: the prompt and every output token but the last."""
    return req.prompt_tokens + req.output_tokens - 1


def _kv_want(req: Request, tokens: int, limits: Limits) -> int:
    """Tokens of KV a request admitted to hold ``tokens`` takes blocks for: with ``limits.reserve_full``
    its whole sequence (:func:`final_kv_tokens`)."""
    if limits.reserve_full and final_kv_tokens(req) > tokens:
        return final_kv_tokens(req)
    return tokens


def _take_blocks(req: Request, hit: int, n: int, kv: KVCache, limits: Limits, plan: StepPlan) -> bool:
    """Blocks for a waiting request admitted to compute n tokens after a cached prefix of ``hit`` (with
    ``limits.reserve_full``: for its whole sequence, :func:`final_kv_tokens`); False if the pool is short."""
    want = _kv_want(req, req.computed + hit + n, limits)
    if kv.prefix_on:
        if not kv.attach(req, hit, want):
            return False
        plan.cached_tokens += hit
    elif not kv.grow(req, want, admit=True):
        return False
    return True


def _admit(waiting: deque, running: list, kv: KVCache, limits: Limits, plan: StepPlan,
           budget: int, chunk: bool) -> int:
    """Admit waiting requests FCFS while the token budget, batch size and KV pool allow.

    With ``limits.reserve_full`` a request is admitted only with blocks for its whole sequence
    (:func:`final_kv_tokens`), taken at once, so running requests never grow short of blocks."""
    while waiting and len(running) < limits.max_running and budget > 0:
        req = waiting[0]
        hit = kv.peek(req) if kv.prefix_on else 0    # tokens of a cached prefix it need not compute
        n = req.known - req.computed - hit
        if n > budget:
            if chunk:
                n = budget
            elif plan.items:   # a whole prompt larger than the budget still runs, alone
                break
        if chunk and limits.max_chunk is not None and n > limits.max_chunk:
            n = limits.max_chunk
        if not _take_blocks(req, hit, n, kv, limits, plan):
            break
        waiting.popleft()
        running.append(req)
        plan.add(req, n)
        budget -= n
    return budget


def _decode_running(running: list, waiting: deque, kv: KVCache, plan: StepPlan, budget: int | None,
                    max_chunk: int | None = None, rank_cap: list | None = None) -> int:
    """One step's tokens for every running request (a decode's one, a chunked prompt's next chunk) in batch
    order, within ``budget`` tokens (None: no budget), preempting when a request cannot grow; returns the
    budget left (``rank_cap``: a DP-balanced instance's tokens left per rank after its decodes, which caps each
    part-way prompt's chunk on its rank; ``[0]`` on a pool without ranks, whose requests' rank is -1, holds
    every part-way prompt: :class:`BatchWait`'s held step).  This loop runs for every request of every step, so a plain ``StepPlan``'s sums are kept
    in local variables (``StepPlan.add`` inlined: the same additions in the same order, so the same floats);
    a sliding plan adds through its own ``add``."""
    prefix = kv.prefix_on
    inline = type(plan) is StepPlan
    bs = kv.block_size
    items = plan.items
    scheduled: set | None = set() if prefix else None   # a prefix pool's grow runs for every request
    tokens, attn, kv_read, sampled = plan.tokens, plan.attn_work, plan.kv_read_tokens, plan.sampled
    left = budget if budget is not None else 1 << 62
    cap = max_chunk if max_chunk is not None else 1 << 62
    for req in list(running):
        if left <= 0:
            break
        if req.blocks == 0:   # preempted earlier in this loop (a running request always holds blocks)
            continue
        c = req.computed
        known = req.prompt_tokens + req.generated
        n = known - c
        if n > left:
            n = left
        if n > cap:
            n = cap
        if rank_cap is not None and n > 1:   # a DP-balanced rank's part-way prompt: what its budget has left
            if n > rank_cap[req.rank]:
                n = rank_cap[req.rank]
                if n <= 0:
                    continue
            rank_cap[req.rank] -= n
        if prefix:
            # a prefix pool's grow also trims its cache, so it always goes through
            if not _grow_running(req, n, kv, running, waiting, plan, scheduled):
                continue
            scheduled.add(id(req))
        # else a decode that stays within the blocks it holds needs no KV call (15 of 16 steps at 16-token
        # blocks); a growth that fails changes nothing, and only then are victims looked for (the unscheduled)
        elif -(-(c + n) // bs) > req.blocks and not kv.grow(req, c + n):
            if not _grow_running(req, n, kv, running, waiting, plan, {id(r) for r, _ in items}):
                continue
        if inline:
            items.append((req, n))
            tokens += n
            attn += n * (c + 0.5 * n)
            kv_read += c + n
            if c + n == known:
                sampled += 1
        else:
            plan.add(req, n)
        left -= n
    if inline:
        plan.tokens, plan.attn_work, plan.kv_read_tokens, plan.sampled = tokens, attn, kv_read, sampled
    return left if budget is not None else 0


def fcfs(running: list, waiting: deque, kv: KVCache, limits: Limits) -> StepPlan:
    plan = StepPlan() if limits.window is None else SlidingStepPlan(window=limits.window)
    if waiting:
        _admit(waiting, running, kv, limits, plan, limits.max_batched_tokens, chunk=False)
        if plan.items:
            return plan
    _decode_running(running, waiting, kv, plan, None)
    return plan


def chunked(running: list, waiting: deque, kv: KVCache, limits: Limits) -> StepPlan:
    plan = StepPlan() if limits.window is None else SlidingStepPlan(window=limits.window)
    budget = _decode_running(running, waiting, kv, plan, limits.max_batched_tokens, limits.max_chunk)
    if not plan.preempted:
        _admit(waiting, running, kv, limits, plan, budget, chunk=True)
    return plan


def inflight(running: list, waiting: deque, kv: KVCache, limits: Limits) -> StepPlan:
    """Decodes first, then whole prompts while they fit the remaining budget (no chunking).  A running request
    here is always a decode (prompts are never split), so the budget never cuts one: the engine stops at the
    first request over max_num_tokens."""
    plan = StepPlan() if limits.window is None else SlidingStepPlan(window=limits.window)
    budget = _decode_running(running, waiting, kv, plan, limits.max_batched_tokens)
    if not plan.preempted and budget > 0:
        _admit(waiting, running, kv, limits, plan, budget, chunk=False)
    return plan


SCHEDULERS = {"fcfs": fcfs, "chunked": chunked, "inflight": inflight}


def assign_rank(req: Request, running: list, waiting, ranks: int) -> int:
    """The attention rank a request arriving at a DP-balanced instance joins, as TensorRT-LLM's request
    fetcher places it: among the ranks with fewer requests (running and queued) than the even share
    max(ceil((all + 1) / ranks), the most any rank has), the one whose requests' prompts are shortest in sum
    (TensorRT-LLM sums their original prompt lengths, not the tokens generated since), then the fewest
    requests, then the lowest rank."""
    count = [0] * ranks
    toks = [0] * ranks
    for r in running:
        count[r.rank] += 1
        toks[r.rank] += r.prompt_tokens
    for r in waiting:
        if r.rank >= 0:
            count[r.rank] += 1
            toks[r.rank] += r.prompt_tokens
    share = max(-(-(sum(count) + 1) // ranks), max(count))
    return min((j for j in range(ranks) if count[j] < share), key=lambda j: (toks[j], count[j], j))


class BalancedDP:
    """A DP-attention instance's scheduler with TensorRT-LLM's attention-DP balance (one per instance: it counts
    steps).  Requests keep the rank :func:`assign_rank` gave them; a step carries every running request's next
    tokens (as ``chunked`` / ``inflight``), then, unless the balance holds new prompts, admits waiting ones
    first-come first-served per rank within that rank's token budget (``limits.max_chunk`` = budget / ranks,
    its decodes' tokens first, then its part-way prompts' chunks; ``chunk``: a prompt larger than what its rank
    has left takes what is left, else it waits for the next step, or runs alone on an otherwise empty rank)
    and batch slots (``slots`` = max_running / ranks, TensorRT-LLM's per-rank ``max_batch_size``).  The
    balance (TensorRT-LLM's ``_balance_adp_requests``): when every rank has a prompt to start and fewer
    decodes than its slots, prompts go (after up to ``batching_wait_iters`` steps while every rank also
    decodes); otherwise they are held and the step count grows, until it reaches ``timeout_iters`` or some
    rank has no decode, when they go and the count restarts.  Both counts run on every step (a step that
    preempted, one with nothing waiting) and restart when the instance fails.
    A rank "has a prompt" when its scheduler would start the head of its queue this step (its slots, tokens
    left and free KV blocks: :func:`_ranks_starting_a_prompt`), or, chunked, is part-way through one; a prompt
    already part-way is never held."""

    def __init__(self, ranks: int, chunk: bool, timeout_iters: int, batching_wait_iters: int, max_running: int):
        self.ranks, self.chunk = ranks, chunk
        self.timeout, self.batching = timeout_iters, batching_wait_iters
        self.slots = max(1, max_running // ranks)    # batch slots per rank
        self.held = 0            # steps in which prompts were held (reported)
        self.reset()

    def reset(self) -> None:
        """A fresh engine (the instance failed and came back): both counts at 0."""
        self.waited = 0          # steps held while some rank had no prompt (TensorRT-LLM's ctx waiting count)
        self.batched = 0         # steps held once every rank had one (its batching wait count)

    def _release(self, running: list, ctx: list) -> bool:
        """``ctx``: the ranks whose scheduler would start a waiting prompt (:func:`_ranks_starting_a_prompt`);
        a rank part-way through a prompt has one too."""
        R = self.ranks
        ctx = list(ctx)
        gen = [0] * R
        for r in running:
            if r.computed < r.prompt_tokens + r.generated - 1:
                ctx[r.rank] = True   # part-way through its prompt
            else:
                gen[r.rank] += 1
        all_gen = min(gen) > 0
        # (TensorRT-LLM also asks that every rank have a free slot: implied, since a rank whose slots are full
        # has no prompt to start)
        if all(ctx):
            self.waited = 0
            if all_gen:
                if self.batched < self.batching:
                    self.batched += 1
                    return False
                self.batched = 0     # (TensorRT-LLM restarts it only here)
            return True
        self.waited += 1
        if self.waited >= self.timeout or not all_gen:
            self.waited = 0
            return True
        return False

    def __call__(self, running: list, waiting: deque, kv: KVCache, limits: Limits) -> StepPlan:
        plan = StepPlan()
        per = limits.max_chunk if limits.max_chunk is not None else limits.max_batched_tokens
        R = self.ranks
        if self.chunk:
            # a rank's decodes take its budget first, its part-way prompts' chunks what is left
            cap = [per] * R
            for r in running:
                if r.prompt_tokens + r.generated - r.computed == 1:
                    cap[r.rank] -= 1
            _decode_running(running, waiting, kv, plan, limits.max_batched_tokens, None, cap)
        else:
            _decode_running(running, waiting, kv, plan, limits.max_batched_tokens)
        left = [per] * R
        busy = [False] * R
        for req, n in plan.items:
            left[req.rank] -= n
            busy[req.rank] = True
        for req in plan.preempted:     # a rank that preempted admits nothing this step; the others go on
            left[req.rank] = 0
            busy[req.rank] = True
        # the counts run on every step
        go = self._release(running, _ranks_starting_a_prompt(waiting, running, kv, limits, left, busy, self.chunk,
                                                             self.slots))
        if not waiting or (plan.preempted and not kv.ranked):
            return plan
        if not go:
            self.held += 1
            return plan
        _admit_ranked(waiting, running, kv, limits, plan, left, busy, self.chunk, self.slots)
        return plan


def _ranks_starting_a_prompt(waiting, running: list, kv: KVCache, limits: Limits, left: list, busy: list,
                             chunk: bool, slots: int) -> list:
    """For each rank, whether its scheduler would start a waiting prompt this step: the head of its queue
    (per-rank FCFS) within its slots, its tokens ``left`` (whole, or alone on an idle rank; chunked, a chunk
    of what is left) and its free KV blocks, as :func:`_admit_ranked` judges them (nothing changes here).
    TensorRT-LLM's balance counts the context requests each rank's scheduler scheduled, so a rank whose
    pool, slots or budget keep its queue waiting has none."""
    R = len(left)
    has = [False] * R
    room = limits.max_running - len(running)     # requests the instance's batch takes yet
    if room <= 0:
        return has
    seen = [False] * R
    held = [0] * R
    for r in running:
        held[r.rank] += 1
    for req in waiting:
        j = req.rank
        if seen[j]:
            continue
        seen[j] = True
        n = req.known - req.computed
        if held[j] < slots and (n <= left[j] or (chunk and left[j] > 0) or not (busy[j] or chunk)):
            has[j] = kv.could_admit(req, _kv_want(req, req.computed + (min(n, left[j]) if chunk else n), limits))
            room -= has[j]
        if all(seen) or room <= 0:
            break
    return has


def _admit_ranked(waiting: deque, running: list, kv: KVCache, limits: Limits, plan: StepPlan,
                  left: list, busy: list, chunk: bool, slots: int) -> None:
    """:func:`_admit` rank by rank: the waiting requests in order, each within its own rank's tokens ``left``
    and ``slots`` running requests (a rank stops at its first request that does not fit, as the engine's
    per-rank scheduler does; a prompt larger than a whole empty rank's budget runs alone there) and its own
    KV pool (:class:`~pdsim.kvcache.RankedKVCache`; on a shared pool one rank's shortage stops all); every
    rank stops when the instance's batch is full."""
    stopped = [False] * len(left)
    held = [0] * len(left)
    for r in running:
        held[r.rank] += 1
    taken = []
    for req in waiting:
        if len(running) >= limits.max_running:
            break
        j = req.rank
        if stopped[j]:
            continue
        if held[j] >= slots:
            stopped[j] = True
            continue
        hit = kv.peek(req) if kv.prefix_on else 0
        n = req.known - req.computed - hit
        if n > left[j]:
            if chunk and left[j] > 0:
                n = left[j]
            elif busy[j] or chunk:
                stopped[j] = True
                continue
        if not _take_blocks(req, hit, n, kv, limits, plan):
            if not kv.ranked:
                break
            stopped[j] = True      # its rank's pool is short: the other ranks go on
            continue
        taken.append(req)
        running.append(req)
        held[j] += 1
        plan.add(req, n)
        left[j] -= n
        busy[j] = True
        if left[j] <= 0:
            stopped[j] = True
    if taken:
        gone = set(map(id, taken))
        kept = [r for r in waiting if id(r) not in gone]
        waiting.clear()
        waiting.extend(kept)


class BatchWait:
    """TensorRT-LLM's batch waiting around ``chunked`` or ``inflight`` (one per instance: it counts steps), as its
    ``_waiting_requests`` does: on a step that would carry decodes and context requests -- new prompts it would
    admit, and (chunked) prompts part-way through their prefill -- the contexts go only when the step's tokens,
    one per decode plus every context counted whole (its prompt and tokens so far, as TensorRT-LLM counts
    ``get_tokens``), reach ``ratio`` x the token budget, or when ``timeout`` such steps have held them;
    otherwise the step runs its decodes only, part-way prompts held too, and the count grows (it restarts when
    contexts go, and when the instance fails or leaves the pool).  A step with no decode, or no context, is
    the base policy's.  SIMPLIFICATION: which new prompts "would be admitted" is judged on the token budget
    and batch size (FCFS; whole prompts for ``inflight``, a chunk of the first that does not fit for
    ``chunked``), not on free KV blocks."""

    def __init__(self, base, chunk: bool, timeout_iters: int, max_tokens_ratio: float):
        self.base, self.chunk = base, chunk
        self.timeout, self.ratio = timeout_iters, max_tokens_ratio
        self.held = 0            # steps in which prompts were held (reported)
        self.reset()

    def reset(self) -> None:
        """A fresh engine (the instance failed and came back, or left the pool): the count at 0."""
        self.waited = 0

    def _contexts(self, running: list, waiting, limits: Limits) -> tuple[int, int, int]:
        """(decodes, contexts, tokens the step would carry: one per decode + every context counted whole), by
        the budget and batch size alone."""
        left = limits.max_batched_tokens
        cap = limits.max_chunk if limits.max_chunk is not None else left
        gens = ctx = tokens = 0
        for r in running:
            known = r.prompt_tokens + r.generated
            n = min(known - r.computed, cap, left)
            if n <= 0:
                continue
            if r.generated >= 1 and r.computed + 1 == known:
                gens += 1
                tokens += 1
            else:                    # part-way through its prompt (or recomputing): a context
                ctx += 1
                tokens += known
            left -= n
        slots = limits.max_running - len(running)
        for r in waiting:
            if slots <= 0 or left <= 0:
                break
            n = r.prompt_tokens + r.generated - r.computed
            if n > left and not self.chunk:
                break
            tokens += r.prompt_tokens + r.generated
            left -= min(n, left, cap)
            slots -= 1
            ctx += 1
        return gens, ctx, tokens

    def __call__(self, running: list, waiting: deque, kv: KVCache, limits: Limits) -> StepPlan:
        gens, ctx, tokens = self._contexts(running, waiting, limits)
        if gens == 0 or ctx == 0:
            return self.base(running, waiting, kv, limits)      # no decode, or no context
        if self.waited >= self.timeout or tokens >= self.ratio * limits.max_batched_tokens:
            self.waited = 0
            return self.base(running, waiting, kv, limits)
        self.waited += 1
        self.held += 1
        # the decodes only: no admission (an empty queue; a request preempted meanwhile joins the real queue's
        # front) and no part-way prompt's chunk (a pool without ranks: every request's rank is -1, so the
        # one-element cap [0] holds every running request with more than one token to compute)
        held = deque()
        plan = StepPlan() if limits.window is None else SlidingStepPlan(window=limits.window)
        _decode_running(running, held, kv, plan, limits.max_batched_tokens, limits.max_chunk, [0])
        if held:
            waiting.extendleft(reversed(held))
        return plan
