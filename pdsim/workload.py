"""Requests and the traffic that makes them: arrival processes, length distributions, trace replay,
and ``generate(scenario, model)``, the one place a scenario's request stream is made.

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
    decode_step_s: float = float("nan")     # the start of its first decode step after the hand-off that reached decode
    kv_transfer_s: float = 0.0              # time on the KV link, queueing on it excluded
    kv_wait_s: float = 0.0                  # held on the prefill side for link or decode blocks
    preemptions: int = 0
    recomputed_tokens: int = 0              # computed again: after a preemption or a fault
    fault_recomputed_tokens: int = 0        # of those, computed again because a fault took the KV
    fault_hits: int = 0                     # times a failure took its KV cache or its place in a queue
    instance: str = ""                      # where it prefilled / ran
    decode_instance: str = ""
    rank: int = -1                          # its attention rank under a DP-balanced pool (-1: none)
    decode_first_s: float = float("nan")    # first token streamed by a decode instance (disaggregated)
    token_s: list | None = None             # time of every output token (client.itl), None: not recorded
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
def poisson_gaps(rng: np.random.Generator, rate: float, n: int) -> np.ndarray:
    return rng.exponential(1.0 / rate, n)


def gamma_gaps(rng: np.random.Generator, rate: float, cv: float, n: int) -> np.ndarray:
    """Gamma inter-arrival times with mean 1/rate and coefficient of variation ``cv`` (cv=1: Poisson)."""
    shape = 1.0 / (cv * cv)
    return rng.gamma(shape, 1.0 / (rate * shape), n)


def poisson_arrivals(rng: np.random.Generator, rate: float, n: int) -> np.ndarray:
    return np.cumsum(poisson_gaps(rng, rate, n))


def gamma_arrivals(rng: np.random.Generator, rate: float, cv: float, n: int) -> np.ndarray:
    """Arrival times whose gaps are :func:`gamma_gaps`."""
    return np.cumsum(gamma_gaps(rng, rate, cv, n))


def constant_arrivals(rate: float, n: int) -> np.ndarray:
    return np.arange(1, n + 1, dtype=float) / rate


# --- time-varying rates (workload.rate_curve): a diurnal profile, bursts -------------------------
def rate_breakpoints(curve, duration_s: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The rate curve over [0, duration_s) of simulated time as segments on which it is linear:
    (starts, rate at each start, rate just before each segment's end), with the segment ends being
    ``starts[1:]`` and ``duration_s``.  Curve knots are mapped by ``time_scale`` and repeated every
    period; bursts multiply the segments they cover."""
    ts = curve.time_scale
    if curve.hourly is not None:
        knots = np.arange(len(curve.hourly) + 1) * 3600.0
        period = curve.period_s or knots[-1]
        knots = knots[knots <= period]
        vals = np.asarray(curve.hourly, float)

        def base(t):                       # curve time -> rate: constant within an hour
            u = np.mod(t, period)
            return vals[np.minimum((u // 3600.0).astype(np.int64), len(vals) - 1)]
    else:
        pts = np.asarray(curve.points, float)
        knots = pts[:, 0]
        period = curve.period_s

    edges = {0.0, float(duration_s)}
    span = duration_s / ts                  # curve time covered by the run
    if period:
        for k in range(int(span // period) + 1):
            edges.update(float((k * period + x) * ts) for x in knots)
            edges.add(float((k + 1) * period * ts))
    else:
        edges.update(float(x * ts) for x in knots)
    for b in curve.bursts:
        edges.update((b.at_s, b.at_s + b.duration_s))
    e = np.array(sorted(x for x in edges if 0.0 <= x <= duration_s))
    starts, ends = e[:-1], e[1:]
    keep = ends > starts
    starts, ends = starts[keep], ends[keep]
    mid = (starts + ends) / 2

    def mult(t):
        m = np.ones_like(t)
        for b in curve.bursts:
            m = np.where((t >= b.at_s) & (t < b.at_s + b.duration_s), m * b.multiplier, m)
        return m
    m = mult(mid) * curve.scale            # bursts are constant on a segment: read them at its middle
    if curve.hourly is not None:
        r0 = r1 = base(mid / ts)
    else:
        # each segment lies within one period: its ends in that period's curve time, linear in between
        k = np.floor(mid / ts / period) if period else np.zeros_like(mid)
        off = k * (period or 0.0)
        r0 = np.interp(starts / ts - off, pts[:, 0], pts[:, 1])
        r1 = np.interp(ends / ts - off, pts[:, 0], pts[:, 1])
    return starts, np.maximum(r0 * m, 0.0), np.maximum(r1 * m, 0.0)


def rate_at(curve, duration_s: float, t) -> np.ndarray:
    """The rate (requests/s) at simulated times ``t`` (the curve the arrivals are thinned to)."""
    starts, r0, r1 = rate_breakpoints(curve, duration_s)
    ends = np.append(starts[1:], duration_s)
    t = np.asarray(t, float)
    i = np.clip(np.searchsorted(starts, t, side="right") - 1, 0, len(starts) - 1)
    f = (t - starts[i]) / (ends[i] - starts[i])
    return r0[i] + (r1[i] - r0[i]) * f


def nhpp_arrivals(rng: np.random.Generator, curve, duration_s: float) -> np.ndarray:
    """Arrival times in [0, duration_s) of a non-homogeneous Poisson process with the curve's rate, by
    thinning (Lewis and Shedler): on each linear segment, a homogeneous stream at the segment's peak rate,
    each point kept with probability rate(t) / peak."""
    starts, r0, r1 = rate_breakpoints(curve, duration_s)
    ends = np.append(starts[1:], duration_s)
    out = []
    for a, b, x0, x1 in zip(starts.tolist(), ends.tolist(), r0.tolist(), r1.tolist()):
        peak = max(x0, x1)
        if peak <= 0:
            continue
        n = int(rng.poisson(peak * (b - a)))
        t = np.sort(rng.uniform(a, b, n))
        if x0 != x1:
            lam = x0 + (x1 - x0) * (t - a) / (b - a)
            t = t[rng.uniform(0.0, peak, n) < lam]
        out.append(t)
    return np.concatenate(out) if out else np.zeros(0)


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


def shared_ints(x: np.ndarray) -> list[int]:
    """``x.tolist()`` with one int object per distinct value: token counts repeat (a few thousand
    distinct lengths in a million requests), and each int above 256 is a 32-byte object of its own,
    so sharing them saves 64 B a request (prompt and output) at no cost in time."""
    a = np.asarray(x)
    if a.size and a.dtype.kind not in "iu":
        # a NaN, an infinity or a fraction would become a garbage int64 silently; callers validate lengths,
        # this is the last guard
        ok = np.isfinite(a) & (a == np.floor(a)) & (np.abs(a) < 2.0 ** 63)
        if not ok.all():
            raise ValueError(f"token counts must be whole numbers: got {a[~ok][0]!r}")
    elif a.size and a.dtype.kind == "u" and int(a.max()) > np.iinfo(np.int64).max:
        raise ValueError(f"token count {int(a.max())} does not fit in 64 bits")
    values, index = np.unique(a.astype(np.int64), return_inverse=True)
    objs = values.tolist()
    return [objs[i] for i in index.tolist()]


def make_requests(arrival_s: np.ndarray, prompt: np.ndarray, output: np.ndarray,
                  hash_ids: list | None = None, hash_block_tokens: int = 0) -> list[Request]:
    arrivals, prompts, outputs = np.asarray(arrival_s, dtype=np.float64).tolist(), shared_ints(prompt), \
        shared_ints(output)
    if hash_ids is not None:
        return [Request(i, a, p, o, hash_ids=h, hash_block_tokens=hash_block_tokens)
                for i, (a, p, o, h) in enumerate(zip(arrivals, prompts, outputs, hash_ids))]
    return [Request(i, a, p, o) for i, (a, p, o) in enumerate(zip(arrivals, prompts, outputs))]


# --- the stream a scenario produces -----------------------------------------------------
# One module owns request generation (STYLE.md habit 16): simulate, plan and sweep all call generate().
def _lengths(spec, rng: np.random.Generator, n: int, model) -> np.ndarray:
    if spec.dist == "fixed":
        return np.full(n, spec.value, dtype=np.int64)
    if spec.dist == "uniform":
        return uniform_lengths(rng, spec.low, spec.high, n)
    assert spec.dist == "lognormal", spec.dist
    return lognormal_lengths(rng, spec.mean, spec.cv, n, 1, spec.max or model.max_context)


def _trace_lengths(sc, rng: np.random.Generator, n: int) -> tuple[np.ndarray | None, np.ndarray | None]:
    """Lengths sampled from traces.  When prompt and output come from the same trace file, whole rows
    are sampled, so each request keeps a real (prompt, output) pair and the trace's correlation
    between them (long code prompts with short replies, say); otherwise each column independently."""
    from .traces import load_trace
    w = sc.workload
    p, o = w.prompt_tokens, w.output_tokens
    if p.dist == o.dist == "trace" and sc.resolve(p.path) == sc.resolve(o.path) and p.format == o.format:
        tr = load_trace(sc.resolve(p.path), p.format)
        rows = rng.integers(0, len(tr), n)
        return tr.prompt_tokens[rows], tr.output_tokens[rows]
    out = []
    for spec, col in ((p, "prompt_tokens"), (o, "output_tokens")):
        if spec.dist != "trace":
            out.append(None)
            continue
        tr = load_trace(sc.resolve(spec.path), spec.format)
        out.append(getattr(tr, col)[rng.integers(0, len(tr), n)])
    return out[0], out[1]


def generate(sc, model) -> list[Request]:
    """The request stream of scenario ``sc`` for ``model`` (a ModelShape), seeded by ``sc.seed``.

    arrival_s is NaN for closed-loop requests: set when the client sends them."""
    import math

    from .errors import ConfigError
    w = sc.workload
    rng = np.random.default_rng(sc.seed)
    if w.arrival == "trace":
        from .traces import load_trace, scale_rate, window
        t = w.trace
        tr = load_trace(sc.resolve(t.path), t.format)
        if tr.arrival_s is None:
            raise ConfigError("this trace has no timestamps; use it for lengths "
                              "(prompt_tokens: {dist: trace, path: ...}) with a synthetic arrival",
                              key="workload.trace.path", value=t.path)
        if tr.hash_ids is not None:     # each id stands for hash_block_tokens of the prompt: they must agree
            b = t.hash_block_tokens
            for i, (h, p) in enumerate(zip(tr.hash_ids, tr.prompt_tokens.tolist())):
                if len(h) != -(-p // b):
                    raise ConfigError(f"row {i + 1} by arrival (at {tr.arrival_s[i]:.3f} s): {len(h)} hash ids for "
                                      f"input_length {p}, where {b} tokens an id need {-(-p // b)}; set it to the "
                                      "trace's block size (512 in Mooncake's traces)",
                                      file=str(sc.resolve(t.path)), key="workload.trace.hash_block_tokens", value=b)
        tr = scale_rate(window(tr, t.start_s, t.duration_s), t.rate_scale)
        arrival = tr.arrival_s.copy()
        prompt, output = tr.prompt_tokens, tr.output_tokens
        hashes = tr.hash_ids      # Mooncake's prefix hash chains (None for the other formats)
        if t.jitter_s > 0:
            # each row moves with its own jittered arrival (lengths and hash chains too): a row jittered
            # past a later row is served after it, as the request it stands for
            # (in trace time, as the ticks it spreads over: scale_rate shrank those by rate_scale)
            arrival = arrival + rng.uniform(0, t.jitter_s / t.rate_scale, len(arrival))
            order = np.argsort(arrival, kind="stable")
            arrival, prompt, output = arrival[order], prompt[order], output[order]
            hashes = None if hashes is None else [hashes[i] for i in order.tolist()]
        if w.num_requests is not None:
            arrival, prompt, output = arrival[:w.num_requests], prompt[:w.num_requests], output[:w.num_requests]
            hashes = None if hashes is None else hashes[:w.num_requests]
        if len(arrival) == 0:
            raise ConfigError("no trace rows in the chosen window", key="workload.trace", value=t.path)
        return make_requests(arrival, prompt, output, hashes, t.hash_block_tokens)
    if w.arrival == "closed":
        n = w.num_requests
        arrival = np.full(n, np.nan)
    else:
        n = w.num_requests
        if w.rate_curve is not None:   # a non-homogeneous Poisson stream over [0, duration_s)
            arrival = nhpp_arrivals(rng, w.rate_curve, w.duration_s)
            if n is not None:
                arrival = arrival[:n]
            n = len(arrival)
            if n == 0:
                raise ConfigError("the rate curve gives no arrivals in duration_s", key="workload.rate_curve",
                                  value=w.duration_s)
        elif n is None:  # enough to cover duration_s, then cut
            n = int(w.rate * w.duration_s * 1.2 + 10 * math.sqrt(w.rate * w.duration_s) + 10)
        if w.rate_curve is not None:
            pass
        elif w.arrival == "poisson":
            arrival = poisson_arrivals(rng, w.rate, n)
        elif w.arrival == "gamma":
            arrival = gamma_arrivals(rng, w.rate, w.cv, n)
        else:
            arrival = constant_arrivals(w.rate, n)
        if w.num_requests is None and w.arrival != "constant" and w.rate_curve is None:
            # n was guessed for Poisson-like gaps: a bursty gamma stream (large cv) often needs more to
            # reach duration_s, and used to stop short of it; draw on (the same stream) until it does.
            # (With num_requests given, duration_s only cuts the stream.)
            while arrival[-1] < w.duration_s:
                more = poisson_gaps(rng, w.rate, n) if w.arrival == "poisson" else gamma_gaps(rng, w.rate, w.cv, n)
                arrival = np.concatenate([arrival, arrival[-1] + np.cumsum(more)])
        if w.duration_s is not None:
            arrival = arrival[arrival < w.duration_s]
            n = len(arrival)
    # synthetic lengths first, in the order they always were drawn (same seed, same stream as before)
    prompt = None if w.prompt_tokens.dist == "trace" else _lengths(w.prompt_tokens, rng, n, model)
    output = None if w.output_tokens.dist == "trace" else _lengths(w.output_tokens, rng, n, model)
    if prompt is None or output is None:
        tp, to = _trace_lengths(sc, rng, n)
        prompt = tp if prompt is None else prompt
        output = to if output is None else output
    if w.conversation is not None:   # arrivals start sessions; prompt_tokens draws each user message
        c = w.conversation
        reqs = conversations(rng, arrival, prompt, output, c.turns, c.think_s, c.system_prompts,
                             c.system_tokens, c.block_tokens, model.max_context)
        if w.duration_s is not None:
            reqs = [r for r in reqs if r.arrival_s < w.duration_s]
        return reqs
    for key, spec in (("workload.prompt_tokens", w.prompt_tokens), ("workload.output_tokens", w.output_tokens)):
        if spec.dist == "fixed" and spec.value >= model.max_context:
            raise ConfigError(f"longer than the {model.max_context}-token context of {model.name}",
                              key=key, value=spec.value)
    if w.prompt_tokens.dist == "fixed" and w.output_tokens.dist == "fixed" and \
            w.prompt_tokens.value + w.output_tokens.value > model.max_context:
        raise ConfigError(f"prompt + output exceed the {model.max_context}-token context of {model.name}",
                          key="workload.output_tokens", value=w.output_tokens.value)
    if w.shared_prefix_tokens:
        pools = [p for t in sc.topologies.values() for p in ((t.prefill, t.decode) if t.kind == "disaggregated"
                                                              else (t,))]
        from .engines import engine_prefix_cache
        entry = [t.prefill if t.kind == "disaggregated" else t for t in sc.topologies.values()]
        if not any(p.prefix_on for p in pools) and not any(engine_prefix_cache(p, model) for p in entry):
            import warnings
            off = [p for p in entry if p.prefix_cache is not None and not p.prefix_cache.enabled]
            why = ("prefix_cache: {enabled: false} on " + ", ".join(sorted({str(p.engine or 'the pool') for p in off}))
                   if off else
                   "pdsim does not model prefix caching with sliding-window layers" if model.has_sliding else
                   "no prefix_cache key, no engine that caches by default")
            warnings.warn(f"workload.shared_prefix_tokens = {w.shared_prefix_tokens}: no pool caches prefixes "
                          f"({why}), so the shared prefix is computed again for every request", UserWarning,
                          stacklevel=2)
        return make_requests(arrival, prompt, output, shared_prefix_ids(prompt, w.shared_prefix_tokens),
                             SHARED_PREFIX_UNIT)
    return make_requests(arrival, prompt, output)


#: tokens per hash id of ``workload.shared_prefix_tokens`` (the engines' usual 16-token KV block)
SHARED_PREFIX_UNIT = 16


def shared_prefix_ids(prompt, shared: int, unit: int = SHARED_PREFIX_UNIT) -> list[list[int]]:
    """Hash chains of prompts whose first ``shared`` tokens are the same for all (a shorter prompt is all
    shared): ids 0 .. k-1 for the k whole units of the shared part every prompt holds, then fresh ids, one
    per ``unit`` tokens of the rest (a unit that straddles the shared part's end is content of its own)."""
    out, fresh = [], shared // unit
    for p in np.asarray(prompt).tolist():
        k = min(shared, p) // unit
        extra = -(-(p - k * unit) // unit)
        out.append(list(range(k)) + list(range(fresh, fresh + extra)))
        fresh += extra
    return out


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
