"""Requests and the traffic that makes them: arrival processes, length distributions, trace replay.

Everything takes an explicit ``numpy.random.Generator``: same seed, same requests.
A :class:`Request` carries its own progress (vLLM's one request model): tokens
*known* (prompt + generated) and tokens *computed* (in the KV cache).  A step
computes some of the known tokens; when computed catches up with known, the
request emits a token.  Prefill and decode are the same step at different sizes.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

FINISHED, REJECTED, UNFINISHED = "finished", "rejected", "unfinished"
ABANDONED = "abandoned"     # the client gave up waiting for a first token (workload.timeout_s)


@dataclass(slots=True, eq=False)
class Request:
    id: int
    arrival_s: float
    prompt_tokens: int
    output_tokens: int
    # --- progress -----------------------------------------------------------
    computed: int = 0            # tokens whose KV is in the cache of the instance that holds it
    generated: int = 0           # output tokens emitted so far
    blocks: int = 0              # KV blocks held on the current instance
    # --- record -------------------------------------------------------------
    status: str = UNFINISHED
    reject_reason: str = ""
    first_token_s: float = float("nan")
    finish_s: float = float("nan")
    prefill_start_s: float = float("nan")   # first step that computed one of its tokens
    prefill_end_s: float = float("nan")     # prefill done (first token out) on the prefill side
    decode_start_s: float = float("nan")    # KV in place on the decode instance (disaggregated)
    kv_transfer_s: float = 0.0              # time on the KV link, queueing on it excluded
    kv_wait_s: float = 0.0                  # held on the prefill side for link or decode blocks
    preemptions: int = 0
    recomputed_tokens: int = 0
    fault_hits: int = 0                     # times a failure took its KV cache or its place in a queue
    instance: str = ""                      # where it prefilled / ran
    decode_instance: str = ""
    # --- prefix (kvcache.PrefixKVCache) -------------------------------------
    hash_ids: list | None = None            # hash chain of the content, one id per hash_block_tokens
    hash_block_tokens: int = 0
    hash_tokens: int = 0                    # tokens the ids describe (0: the prompt; a chat turn: prompt + reply)
    cached_tokens: int = 0                  # prompt tokens found cached at its (last) admission
    block_keys: tuple | None = None         # memo: (engine block size, keys)

    @property
    def known(self) -> int:
        return self.prompt_tokens + self.generated

    @property
    def remaining(self) -> int:
        """Tokens still to compute before the request finishes (its share of outstanding work)."""
        return self.prompt_tokens + self.output_tokens - 1 - self.computed

    def clone(self) -> "Request":
        """A fresh copy with no progress (each topology replays the identical stream)."""
        if self.hash_ids is None:
            return Request(self.id, self.arrival_s, self.prompt_tokens, self.output_tokens)
        return Request(self.id, self.arrival_s, self.prompt_tokens, self.output_tokens,
                       hash_ids=self.hash_ids, hash_block_tokens=self.hash_block_tokens,
                       hash_tokens=self.hash_tokens)


# --- arrival processes -------------------------------------------------------
def poisson_arrivals(rng: np.random.Generator, rate: float, n: int) -> np.ndarray:
    return np.cumsum(rng.exponential(1.0 / rate, n))


def gamma_arrivals(rng: np.random.Generator, rate: float, cv: float, n: int) -> np.ndarray:
    """Gamma inter-arrival times with mean 1/rate and coefficient of variation ``cv`` (cv=1: Poisson)."""
    shape = 1.0 / (cv * cv)
    return np.cumsum(rng.gamma(shape, 1.0 / (rate * shape), n))


def constant_arrivals(rate: float, n: int) -> np.ndarray:
    return np.arange(1, n + 1, dtype=float) / rate


# --- lengths -------------------------------------------------------------------
def lognormal_lengths(rng: np.random.Generator, mean: float, cv: float, n: int,
                      low: int = 1, high: int | None = None) -> np.ndarray:
    """Lognormal token counts with the given mean and coefficient of variation, rounded, clipped to [low, high]."""
    sigma2 = np.log1p(cv * cv)
    mu = np.log(mean) - sigma2 / 2
    x = np.rint(rng.lognormal(mu, np.sqrt(sigma2), n)).astype(np.int64)
    return np.clip(x, low, high if high is not None else np.iinfo(np.int64).max)


def uniform_lengths(rng: np.random.Generator, low: int, high: int, n: int) -> np.ndarray:
    return rng.integers(low, high + 1, n, dtype=np.int64)


def make_requests(arrival_s: np.ndarray, prompt: np.ndarray, output: np.ndarray,
                  hash_ids: list | None = None, hash_block_tokens: int = 0) -> list[Request]:
    if hash_ids is not None:
        return [Request(i, float(a), int(p), int(o), hash_ids=h, hash_block_tokens=hash_block_tokens)
                for i, (a, p, o, h) in enumerate(zip(arrival_s.tolist(), prompt.tolist(), output.tolist(),
                                                     hash_ids))]
    return [Request(i, float(a), int(p), int(o))
            for i, (a, p, o) in enumerate(zip(arrival_s.tolist(), prompt.tolist(), output.tolist()))]


# --- prefix-carrying synthetic traffic ---------------------------------------------------
class _Chain:
    """Hash ids of a growing content at ``unit`` tokens per id: ids of whole units, plus the
    tokens of a partial last unit (whose id changes when it is extended: its content changes)."""
    __slots__ = ("ids", "tail", "unit")

    def __init__(self, unit: int, ids=(), tail: int = 0):
        self.unit, self.ids, self.tail = unit, list(ids), tail

    def copy(self) -> "_Chain":
        return _Chain(self.unit, self.ids, self.tail)

    def extend(self, tokens: int, fresh) -> None:
        total = self.tail + tokens
        self.ids.extend(next(fresh) for _ in range(total // self.unit))
        self.tail = total % self.unit

    def snapshot(self, fresh) -> list[int]:
        return self.ids + [next(fresh)] if self.tail else list(self.ids)


def conversations(rng: np.random.Generator, session_start_s: np.ndarray, user_tokens: np.ndarray,
                  output_tokens: np.ndarray, turns_mean: float = 1.0, think_s: float = 0.0,
                  system_prompts: int = 0, system_tokens: int = 0, unit_tokens: int = 16,
                  max_context: int | None = None) -> list[Request]:
    """Multi-turn chat sessions with shared system prompts, as requests that carry hash ids.

    Session s starts at ``session_start_s[s]`` and has a geometric number of turns (mean
    ``turns_mean``); turn k+1 is sent an exponential time (mean ``think_s``) after turn k was sent
    (open loop: reply time is taken to be inside the think time).  Every prompt is the session's
    system prompt (one of ``system_prompts``, uniform, ``system_tokens`` long, shared by every
    session that uses it), then the whole history (earlier user messages and replies), then a new
    user message; lengths of messages and replies are drawn in order from ``user_tokens`` and
    ``output_tokens``.  A turn whose prompt + reply would pass ``max_context`` ends its session.
    Each request's ``hash_ids`` cover its prompt and its reply (the next turn repeats both),
    one id per ``unit_tokens``.  At most ``len(user_tokens)`` requests, renumbered in arrival order.
    """
    n = len(user_tokens)
    fresh = iter(range(1, 1 << 62))
    systems = []
    for _ in range(system_prompts):
        c = _Chain(unit_tokens)
        c.extend(system_tokens, fresh)
        systems.append(c)
    rows = []          # (arrival_s, prompt, output, hash_ids)
    i = 0
    p_next = 1.0 / turns_mean
    for start in session_start_s.tolist():
        if i >= n:
            break
        turns = int(rng.geometric(p_next))
        chain = systems[int(rng.integers(system_prompts))].copy() if systems else _Chain(unit_tokens)
        history = system_tokens if systems else 0
        t = start
        for k in range(turns):
            if i >= n:
                break
            user, out = int(user_tokens[i]), int(output_tokens[i])
            prompt = history + user
            if max_context is not None and prompt + out > max_context:
                break
            i += 1
            chain.extend(user, fresh)
            turn = chain.copy()
            turn.extend(out, fresh)
            rows.append((t, prompt, out, turn.snapshot(fresh)))
            chain = turn
            history = prompt + out
            if think_s > 0:
                t += float(rng.exponential(think_s))
    rows.sort(key=lambda r: r[0])
    return [Request(j, a, p, o, hash_ids=h, hash_block_tokens=unit_tokens, hash_tokens=p + o)
            for j, (a, p, o, h) in enumerate(rows)]
