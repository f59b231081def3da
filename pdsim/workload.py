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
    decode_first_s: float = float("nan")    # first token streamed by a decode instance (disaggregated)
    token_s: list | None = None             # time of every output token (client.itl), None: not recorded

    @property
    def known(self) -> int:
        return self.prompt_tokens + self.generated

    @property
    def remaining(self) -> int:
        """Tokens still to compute before the request finishes (its share of outstanding work)."""
        return self.prompt_tokens + self.output_tokens - 1 - self.computed

    def clone(self) -> "Request":
        """A fresh copy with no progress (each topology replays the identical stream)."""
        return Request(self.id, self.arrival_s, self.prompt_tokens, self.output_tokens)


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


def make_requests(arrival_s: np.ndarray, prompt: np.ndarray, output: np.ndarray) -> list[Request]:
    return [Request(i, float(a), int(p), int(o))
            for i, (a, p, o) in enumerate(zip(arrival_s.tolist(), prompt.tolist(), output.tolist()))]
