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
  ``context = kv_read_tokens / batch``.

Pure Python and the standard library: importing this never needs torch or numpy.
"""
from __future__ import annotations

import bisect
import math
from dataclasses import dataclass, field


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
        object.__setattr__(self, "lt", tuple(tuple(math.log(v) for v in row) for row in self.t))

    def __call__(self, b: float, c: float) -> float | None:
        pb, pc = _bracket(self.batch, b), _bracket(self.context, c)
        if pb is None or pc is None:
            return None
        b0, b1, wb = pb
        c0, c1, wc = pc
        if wb == 0.0 and wc == 0.0:
            return self.t[b0][c0]                # exact at grid points
        g = self.lt
        top = g[b0][c0] * (1 - wc) + g[b0][c1] * wc
        bot = g[b1][c0] * (1 - wc) + g[b1][c1] * wc
        return math.exp(top * (1 - wb) + bot * wb)


@dataclass
class MeasuredTables:
    gemm: dict[tuple[int, int, str], LogCurve]
    prefill: dict[tuple[int, int, int, str], LogCurve]
    decode: dict[tuple[int, int, int, str], LogGrid]

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
        ppts: dict[tuple, list] = {}
        for t in meas.attention_prefill:
            ppts.setdefault((t.q_heads, t.kv_heads, t.head_dim, t.dtype), []).extend(zip(t.seq_len, t.time_s))
        prefill = {key: LogCurve(*map(tuple, _merge(p))) for key, p in ppts.items()}
        decode = {}
        for t in meas.attention_decode:   # a later table of the same key replaces an earlier one
            decode[(t.q_heads, t.kv_heads, t.head_dim, t.dtype)] = LogGrid(
                tuple(map(float, t.batch)), tuple(map(float, t.context)),
                tuple(tuple(float(v) for v in row) for row in t.time_s))
        return cls(gemm, prefill, decode)

    # --- lookups used by DeviceProfile --------------------------------------
    def gemm_time(self, m: float, n: int, k: int, dtype: str = "bf16") -> float | None:
        curve = self.gemm.get((n, k, dtype))
        return None if curve is None else curve(m)

    def attention_time(self, prefill: bool, shape: tuple, dtype: str = "bf16") -> float | None:
        """Seconds per layer for ``shape = (tokens, attn_work, kv_read_tokens, batch, q_heads,
        kv_heads, head_dim)``, or None where the tables do not cover it."""
        tokens, attn_work, kv_read, batch, qh, kvh, d = shape
        key = (qh, kvh, d, dtype)
        if prefill:
            curve = self.prefill.get(key)
            if curve is None or tokens <= 0 or attn_work <= 0:
                return None
            seq = 2.0 * attn_work / tokens
            t = curve(seq)
            return None if t is None else t * tokens / seq
        grid = self.decode.get(key)
        if grid is None or batch <= 0 or kv_read <= 0:
            return None
        return grid(batch, kv_read / batch)
