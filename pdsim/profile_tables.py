"""Measured tables of a profile (``measured:``), interpolated in log space.

Written by ``pdsim calibrate``; read by :class:`pdsim.devices.DeviceProfile`,
which falls back to the roofline with fitted efficiency whenever a lookup here
returns ``None`` (a shape outside the measured range or never measured).

- GEMM: keyed by ``(n, k, dtype)``, not by model, so a profile measured with
  one model's shapes serves any model whose layers share an N x K; piecewise
  linear in (log M, log t), exact at the table points.
- Prefill attention: keyed by ``(q_heads, kv_heads, head_dim, dtype)``; one
  prompt of ``seq_len`` tokens interpolated in (log seq_len, log t).  A batch of
  prompts arrives as aggregates (tokens, attn_work): the effective prompt length
  is ``2 * attn_work / tokens`` and the time is scaled by ``tokens / seq_len``
  prompts.
- Decode attention: bilinear in (log batch, log context) of log t, with
  ``context = kv_read_tokens / batch``.  An imported grid may be ragged (cells
  left ``null`` where the source did not measure, e.g. batch x context beyond
  the GPU's memory): there the time is the largest measured batch at that
  context scaled by batch (decode attention reads KV linearly in batch).
- Prefill attention tables may carry a ``batch`` (prompts per kernel call,
  default 1): a batch of ``n`` prompts is bilinear in (log batch, log seq_len)
  between the measured batches, and scaled by ``n / batch`` outside them.
- GEMM tables of one dtype that form an (n, k) grid (imported databases,
  ``measured.gemm_nk_grid: true``) are interpolated bilinearly in (log n, log k) of log t between grid shapes.
- MoE (``moe``: imported, per shape, split and dtype): the routed experts of one layer by the tokens
  entering it, log-log inside; below the smallest count its time, above the largest scaled by tokens.
- MLA attention (``mla_prefill``, ``mla_decode``: imported, per heads on one GPU, head dims and KV
  dtype) is stored with the attention tables under the keys of :func:`mla_keys` (the prefill as
  multi-head attention of nope + rope dims, the decode as one shared latent "KV head" of rank + rope
  dims, a dtype tag naming MLA and its dims so no GQA shape can hit it) and looked up exactly as they are.
- All-to-all (``alltoall``: imported, per DeepEP backend, phase, wire dtype, ep, hidden, top-k, experts):
  one phase by the tokens on a GPU, log-log inside; below the smallest count its time, above the largest
  scaled by tokens.
- All-reduce (``transfers`` of kind ``allreduce``, per ``tp`` and ``impl``):
  log-log in bytes; below the smallest message the smallest message's time
  (latency floor), above the largest scaled by bytes (bandwidth-bound).

Every lookup has a ``*_lookup`` form that also says how the value was found:
``"exact"`` (a table point), ``"interpolated"`` (inside the table),
``"extrapolated"`` (outside it, by the scaling rules above) -- or ``None``
when the tables do not serve the shape and the roofline must.

Pure Python and the standard library: importing this never needs torch or numpy.
"""
from __future__ import annotations

import bisect
import math
from dataclasses import dataclass, field
from typing import NamedTuple


class Lookup(NamedTuple):
    """A time and how it was found: "exact", "interpolated" or "extrapolated"."""
    time_s: float
    how: str


def _merge(points: list[tuple[float, float]]) -> tuple[list[float], list[float]]:
    """Sorted x, and the geometric mean of y where several tables measured the same x."""
    by_x: dict[float, list[float]] = {}
    for x, y in points:
        by_x.setdefault(float(x), []).append(float(y))
    xs = sorted(by_x)
    ys = [by_x[x][0] if len(by_x[x]) == 1 else math.exp(sum(math.log(v) for v in by_x[x]) / len(by_x[x]))
          for x in xs]
    return xs, ys


@dataclass(frozen=True)
class LogCurve:
    """y(x) piecewise linear in (log x, log y); ``None`` outside [x_0, x_last]."""
    x: tuple[float, ...]
    y: tuple[float, ...]
    lx: tuple[float, ...] = field(init=False, repr=False)
    ly: tuple[float, ...] = field(init=False, repr=False)

    def __post_init__(self):
        object.__setattr__(self, "lx", tuple(math.log(v) for v in self.x))
        object.__setattr__(self, "ly", tuple(math.log(v) for v in self.y))

    def __call__(self, x: float) -> float | None:
        xs = self.x
        if not xs or x < xs[0] or x > xs[-1] or x <= 0:
            return None
        i = bisect.bisect_left(xs, x)
        if xs[i] == x:
            return self.y[i]                     # exact at table points
        lx = math.log(x)
        x0, x1, y0, y1 = self.lx[i - 1], self.lx[i], self.ly[i - 1], self.ly[i]
        return math.exp(y0 + (y1 - y0) * (lx - x0) / (x1 - x0))


def _bracket(xs: tuple[float, ...], x: float) -> tuple[int, int, float] | None:
    """Indices around x and the weight of the upper one in log x; None outside."""
    if x < xs[0] or x > xs[-1] or x <= 0:
        return None
    i = bisect.bisect_left(xs, x)
    if xs[i] == x or len(xs) == 1:
        return i, i, 0.0
    w = (math.log(x) - math.log(xs[i - 1])) / (math.log(xs[i]) - math.log(xs[i - 1]))
    return i - 1, i, w


@dataclass(frozen=True)
class LogGrid:
    """t(batch, context) bilinear in (log batch, log context) of log t; None outside the grid."""
    batch: tuple[float, ...]
    context: tuple[float, ...]
    t: tuple[tuple[float, ...], ...]         # time_s[b][c]
    lt: tuple[tuple[float, ...], ...] = field(init=False, repr=False)

    def __post_init__(self):
        object.__setattr__(self, "lt", tuple(tuple(None if v is None else math.log(v) for v in row)
                                             for row in self.t))

    def __call__(self, b: float, c: float) -> float | None:
        r = self.lookup(b, c)
        return None if r is None else r.time_s

    def _row(self, i: int, pc: tuple[int, int, float]) -> float | None:
        """log t along batch row i at the context bracket pc; None where a cell is missing."""
        c0, c1, wc = pc
        a, z = self.lt[i][c0], self.lt[i][c1]
        if a is None or z is None:
            return None
        return a * (1 - wc) + z * wc

    def lookup(self, b: float, c: float) -> Lookup | None:
        """Bilinear inside the grid; in a ragged grid's missing cells, the largest measured batch
        below ``b`` at this context scaled by ``b / batch`` ("extrapolated"); None outside."""
        pb, pc = _bracket(self.batch, b), _bracket(self.context, c)
        if pb is None or pc is None:
            return None
        b0, b1, wb = pb
        if wb == 0.0 and pc[2] == 0.0 and self.t[b0][pc[0]] is not None:
            return Lookup(self.t[b0][pc[0]], "exact")            # exact at grid points
        top, bot = self._row(b0, pc), self._row(b1, pc)
        if top is not None and bot is not None:
            return Lookup(math.exp(top * (1 - wb) + bot * wb), "interpolated")
        for i in range(b0, -1, -1):          # ragged: scale the largest measured batch below
            row = self._row(i, pc)
            if row is not None:
                return Lookup(math.exp(row) * b / self.batch[i], "extrapolated")
        return None


@dataclass(frozen=True)
class GemmGrid:
    """GEMM curves of one dtype over a grid of (n, k), each a LogCurve in m."""
    n: tuple[int, ...]
    k: tuple[int, ...]
    curves: dict[tuple[int, int], LogCurve]

    def lookup(self, m: float, n: float, k: float) -> Lookup | None:
        pn, pk = _bracket(self.n, n), _bracket(self.k, k)
        if pn is None or pk is None:
            return None
        n0, n1, wn = pn
        k0, k1, wk = pk
        corners = {}
        for i in {n0, n1}:
            for j in {k0, k1}:
                curve = self.curves.get((self.n[i], self.k[j]))
                t = None if curve is None else curve(m)
                if t is None:
                    return None
                corners[i, j] = math.log(t)
        if wn == 0.0 and wk == 0.0:
            curve = self.curves[(self.n[n0], self.k[k0])]
            i = bisect.bisect_left(curve.x, m)
            return Lookup(math.exp(corners[n0, k0]), "exact" if curve.x[i] == m else "interpolated")
        lt = (corners[n0, k0] * (1 - wk) + corners[n0, k1] * wk) * (1 - wn) \
            + (corners[n1, k0] * (1 - wk) + corners[n1, k1] * wk) * wn
        return Lookup(math.exp(lt), "interpolated")


def _token_curve_lookup(curve, tokens: float) -> Lookup | None:
    """A curve over token counts: log-log inside, the smallest count's time below (a floor), scaled by
    tokens above (throughput-bound); None without a curve or tokens."""
    if curve is None or tokens <= 0:
        return None
    xs = curve.x
    if tokens < xs[0]:
        return Lookup(curve.y[0], "extrapolated")
    if tokens > xs[-1]:
        return Lookup(curve.y[-1] * tokens / xs[-1], "extrapolated")
    return _curve_lookup(curve, tokens)


def _curve_lookup(curve: LogCurve, x: float) -> Lookup | None:
    t = curve(x)
    if t is None:
        return None
    i = bisect.bisect_left(curve.x, x)
    return Lookup(t, "exact" if curve.x[i] == x else "interpolated")


@dataclass(frozen=True)
class AllreduceCurve:
    """All-reduce time by message bytes for one (tp, impl): log-log inside, a latency floor below
    the smallest message, linear in bytes above the largest (bandwidth-bound)."""
    curve: LogCurve

    def lookup(self, bytes_: float) -> Lookup | None:
        xs = self.curve.x
        if bytes_ <= 0:
            return None
        if bytes_ < xs[0]:
            return Lookup(self.curve.y[0], "extrapolated")
        if bytes_ > xs[-1]:
            return Lookup(self.curve.y[-1] * bytes_ / xs[-1], "extrapolated")
        return _curve_lookup(self.curve, bytes_)


def mla_keys(heads: int, kv_lora_rank: int, rope: int, nope: int, v: int, dtype: str):
    """(prefill key, decode key) of an MLA table in :class:`MeasuredTables`' attention dicts:
    (q_heads, kv_heads, head_dim, tag).  The tag names MLA and all its dims (a GQA table never has it)."""
    tag = f"mla{kv_lora_rank}+{rope}/{nope}/{v}:{dtype}"
    return (heads, heads, nope + rope, tag), (heads, 1, kv_lora_rank + rope, tag)


@dataclass
class MeasuredTables:
    gemm: dict[tuple[int, int, str], LogCurve]
    prefill: dict[tuple[int, int, int, str], LogCurve]
    decode: dict[tuple[int, int, int, str], LogGrid]
    # prefill tables by batch: key -> {batch: curve in seq_len}; batch-1 curves are also in ``prefill``
    prefill_batches: dict[tuple[int, int, int, str], dict[int, LogCurve]] = field(default_factory=dict)
    gemm_grids: dict[str, GemmGrid] = field(default_factory=dict)
    allreduce: dict[tuple[int, str], AllreduceCurve] = field(default_factory=dict)   # (tp, impl)
    # (hidden, inter, topk, experts, moe_tp, moe_ep, gated, dtype) -> time of the routed experts by tokens
    moe: dict[tuple, LogCurve] = field(default_factory=dict)
    # (backend "ht"|"ll", phase, dtype, ep, hidden, topk, experts) -> one all-to-all phase by tokens per GPU
    alltoall: dict[tuple, LogCurve] = field(default_factory=dict)

    @classmethod
    def from_profile(cls, spec) -> "MeasuredTables":
        """From a validated :class:`pdsim.devices.ProfileSpec` (or its ``measured`` section)."""
        meas = getattr(spec, "measured", spec)
        if meas is None:
            return cls({}, {}, {})
        gpts: dict[tuple, list] = {}
        for t in meas.gemm:
            gpts.setdefault((t.n, t.k, t.dtype), []).extend(zip(t.m, t.time_s))
        gemm = {key: LogCurve(*map(tuple, _merge(p))) for key, p in gpts.items()}
        grids = {}
        for dtype in ({d for (_, _, d) in gemm} if getattr(meas, "gemm_nk_grid", False) else ()):
            ns = tuple(sorted({n for (n, _, d) in gemm if d == dtype}))
            ks = tuple(sorted({k for (_, k, d) in gemm if d == dtype}))
            grids[dtype] = GemmGrid(ns, ks, {(n, k): c for (n, k, d), c in gemm.items() if d == dtype})
        ppts: dict[tuple, dict[int, list]] = {}
        for t in meas.attention_prefill:
            b = getattr(t, "batch", 1)
            ppts.setdefault((t.q_heads, t.kv_heads, t.head_dim, t.dtype), {}).setdefault(b, []).extend(
                zip(t.seq_len, t.time_s))
        for t in getattr(meas, "mla_prefill", None) or ():
            pkey = mla_keys(t.heads, t.kv_lora_rank, t.qk_rope_head_dim, t.qk_nope_head_dim, t.v_head_dim,
                            t.dtype)[0]
            ppts.setdefault(pkey, {}).setdefault(t.batch, []).extend(zip(t.seq_len, t.time_s))
        batches = {key: {b: LogCurve(*map(tuple, _merge(p))) for b, p in sorted(by_b.items())}
                   for key, by_b in ppts.items()}
        prefill = {key: by_b[1] for key, by_b in batches.items() if 1 in by_b}
        decode = {}
        for t in meas.attention_decode:   # a later table of the same key replaces an earlier one
            decode[(t.q_heads, t.kv_heads, t.head_dim, t.dtype)] = LogGrid(
                tuple(map(float, t.batch)), tuple(map(float, t.context)),
                tuple(tuple(None if v is None else float(v) for v in row) for row in t.time_s))
        for t in getattr(meas, "mla_decode", None) or ():
            dkey = mla_keys(t.heads, t.kv_lora_rank, t.qk_rope_head_dim, t.qk_nope_head_dim, t.v_head_dim,
                            t.dtype)[1]
            decode[dkey] = LogGrid(tuple(map(float, t.batch)), tuple(map(float, t.context)),
                                   tuple(tuple(None if v is None else float(v) for v in row) for row in t.time_s))
        apts: dict[tuple, list] = {}
        for t in meas.transfers:
            if t.kind == "allreduce":
                apts.setdefault((t.tp, getattr(t, "impl", None) or "default"), []).extend(zip(t.bytes, t.time_s))
        allreduce = {key: AllreduceCurve(LogCurve(*map(tuple, _merge(p)))) for key, p in apts.items()}
        mpts: dict[tuple, list] = {}
        for t in getattr(meas, "moe", None) or ():
            if t.distribution == "balanced":      # uniform routing, as the cost model's expected experts
                mpts.setdefault((t.hidden, t.inter, t.topk, t.experts, t.moe_tp, t.moe_ep, t.gated, t.dtype),
                                []).extend(zip(t.tokens, t.time_s))
        moe = {key: LogCurve(*map(tuple, _merge(p))) for key, p in mpts.items()}
        xpts: dict[tuple, list] = {}
        for t in getattr(meas, "alltoall", None) or ():
            xpts.setdefault((t.backend, t.phase, t.dtype, t.ep, t.hidden, t.topk, t.experts), []).extend(
                zip(t.tokens, t.time_s))
        a2a = {key: LogCurve(*map(tuple, _merge(p))) for key, p in xpts.items()}
        return cls(gemm, prefill, decode, batches, grids, allreduce, moe, a2a)

    def alltoall_lookup(self, tokens: float, key: tuple) -> Lookup | None:
        """One all-to-all phase for ``tokens`` tokens on each GPU: log-log inside the measured range, the
        smallest count's time below it (a latency floor), scaled by tokens above it (bandwidth-bound);
        None when the shape was not measured or no token moves."""
        return _token_curve_lookup(self.alltoall.get(key), tokens)

    def moe_lookup(self, tokens: float, key: tuple) -> Lookup | None:
        """The routed experts of one MoE layer for ``tokens`` tokens: log-log inside the measured
        range; below it the smallest count's time (a launch-bound floor), above it scaled by tokens
        (compute-bound); None when the shape was not measured or no token enters."""
        return _token_curve_lookup(self.moe.get(key), tokens)

    # --- lookups used by DeviceProfile --------------------------------------
    def gemm_time(self, m: float, n: int, k: int, dtype: str = "bf16") -> float | None:
        r = self.gemm_lookup(m, n, k, dtype)
        return None if r is None else r.time_s

    def gemm_lookup(self, m: float, n: int, k: int, dtype: str = "bf16") -> Lookup | None:
        """One (m x k) @ (k x n) GEMM from the tables: the (n, k) curve in m, or bilinear in
        (log n, log k) between the four grid shapes around it; None outside."""
        curve = self.gemm.get((n, k, dtype))
        if curve is not None:
            return _curve_lookup(curve, m)
        grid = self.gemm_grids.get(dtype)
        return None if grid is None else grid.lookup(m, n, k)

    def attention_time(self, prefill: bool, shape: tuple, dtype: str = "bf16") -> float | None:
        """Seconds per layer for ``shape = (tokens, attn_work, kv_read_tokens, batch, q_heads,
        kv_heads, head_dim)``, or None where the tables do not cover it."""
        r = self.attention_lookup(prefill, shape, dtype)
        return None if r is None else r.time_s

    def attention_lookup(self, prefill: bool, shape: tuple, dtype: str = "bf16") -> Lookup | None:
        """:meth:`attention_time` with how the value was found."""
        tokens, attn_work, kv_read, batch, qh, kvh, d = shape
        key = (qh, kvh, d, dtype)
        if prefill:
            by_b = self.prefill_batches.get(key)
            if not by_b or tokens <= 0 or attn_work <= 0:
                return None
            seq = 2.0 * attn_work / tokens
            return _prefill_lookup(by_b, seq, tokens / seq)
        grid = self.decode.get(key)
        if grid is None or batch <= 0 or kv_read <= 0:
            return None
        return grid.lookup(batch, kv_read / batch)

    def allreduce_impls(self, tp: int) -> list[str]:
        return sorted(impl for (t, impl) in self.allreduce if t == tp)

    def allreduce_lookup(self, bytes_: float, tp: int, impl: str | None = None) -> tuple[Lookup, str] | None:
        """All-reduce of ``bytes_`` over ``tp`` GPUs from the table of implementation ``impl``
        (e.g. "nccl", "custom"); with ``impl=None`` the fastest measured implementation at this
        size (engines pick per message size).  Returns (lookup, impl) or None (no table for tp)."""
        impls = [impl] if impl is not None else self.allreduce_impls(tp)
        best = None
        for name in impls:
            curve = self.allreduce.get((tp, name))
            r = None if curve is None else curve.lookup(bytes_)
            if r is not None and (best is None or r.time_s < best[0].time_s):
                best = (r, name)
        return best


def _prefill_lookup(by_b: dict[int, LogCurve], seq: float, n: float) -> Lookup | None:
    """``n`` prompts of ``seq`` tokens: bilinear in (log batch, log seq) between measured batches,
    the nearest measured batch scaled by ``n / batch`` outside them (or where a batch lacks seq)."""
    bs = tuple(sorted(by_b))
    pb = _bracket(tuple(float(b) for b in bs), n)
    if pb is not None:
        b0, b1, wb = pb
        r0, r1 = _curve_lookup(by_b[bs[b0]], seq), _curve_lookup(by_b[bs[b1]], seq)
        if r0 is not None and r1 is not None:
            if wb == 0.0:
                return r0
            return Lookup(math.exp(math.log(r0.time_s) * (1 - wb) + math.log(r1.time_s) * wb), "interpolated")
    # outside the measured batches (or a ragged grid): scale the nearest batch that has this seq
    below = [b for b in bs if b <= n]
    order = sorted(below, reverse=True) + [b for b in bs if b > n]
    for b in order:
        r = by_b[b](seq)
        if r is not None:
            return Lookup(r * n / b, "extrapolated")
    return None
