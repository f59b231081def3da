"""Kernel timings on a device: measured tables first, the datasheet roofline elsewhere.

Every function here takes numpy arrays (or numpy scalars) for the quantities
that vary between decode steps, so the cost model evaluates one step and k
steps with the same code (:mod:`pdsim.costmodel`).  Each returns
``(time_s, source)`` where ``source`` says where the time came from:

- ``"measured"``: a table point exactly;
- ``"interpolated"``: between table points (log-log, as :mod:`pdsim.profile_tables`);
- ``"extrapolated"``: outside the table's range: the roofline scaled to agree with
  the table at its nearest edge (the shape of the curve from the roofline, its
  level from the measurement);
- ``"roofline"``: no table for this kernel: datasheet peaks times efficiencies.

Roofline per kernel (``e`` = the profile's ``efficiency``)::

    GEMM        max(2MNK (M + m_half) / (M peak gemm_max), bytes / (bw memory)) + kernel_overhead
    attention   max(flops / (peak attention_prefill [x 0.5 in decode]), bytes / (bw eff_mem), floor)
    elementwise max(bytes / (bw memory), kernels * elementwise_floor)
    all-reduce  min(one-shot, two-shot): one-shot  base + (t-1) S / (link allreduce)
                                         two-shot 2 base + 2 (t-1)/t S / (link allreduce)

Weight-only int4/int8 GEMMs read ``weight_bytes`` per weight, compute in bf16 on
tensor cores with M tiled by 16 (Marlin-style kernels: small M does not pay
the full ``m_half``), and dequantise every weight once per 64 rows of M at
``DEQUANT_OPS`` CUDA-core operations per weight (fp32 peak), overlapped with
the rest (a ``max``).  These two constants are estimates, not fitted.
"""
from __future__ import annotations

import numpy as np

#: CUDA-core operations to dequantise one weight (unpack, convert, scale): an estimate
DEQUANT_OPS = {"int4": 4.0, "int8": 2.0}
#: rows of M a weight-only kernel dequantises each weight tile for (one pass per 64 rows)
DEQUANT_M_TILE = 64
#: M tile of weight-only tensor-core kernels: their small-M compute inefficiency is capped at this
WEIGHT_ONLY_M_HALF = 16.0

# source codes (arrays carry codes; names for people)
MEASURED, INTERPOLATED, EXTRAPOLATED, ROOFLINE = 0, 1, 2, 3
SOURCE_NAMES = ("measured", "interpolated", "extrapolated", "roofline")


def source_name(codes) -> str:
    """One name for a kernel's source over k steps: the least measured of them."""
    return SOURCE_NAMES[int(np.max(codes))]


def _is_arr(*xs) -> bool:
    return any(isinstance(x, np.ndarray) for x in xs)


def _max(a, b):
    """Elementwise max of scalars or arrays (Python's max for plain floats: the scalar step is hot)."""
    if _is_arr(a, b):
        return np.maximum(a, b)
    return a if a >= b else b


def _pos_max(t, floor):
    """max(t, floor) where t > 0, else 0 (no work, no kernel)."""
    if _is_arr(t):
        return np.where(t > 0, np.maximum(t, floor), 0.0)
    return (t if t >= floor else floor) if t > 0 else 0.0


# --- vectorised table lookups ---------------------------------------------------------
_ARRAYS: dict[int, tuple] = {}


def _arrays(obj, build):
    """numpy copies of a table's tuples, built once per table object."""
    hit = _ARRAYS.get(id(obj))
    if hit is None or hit[0] is not obj:
        hit = _ARRAYS[id(obj)] = (obj, build(obj))
    return hit[1]


def _bracket(xs: np.ndarray, lxs: np.ndarray, x: np.ndarray):
    """(i0, i1, w, exact index or -1, clamped x) of each x in sorted xs, clamped into [xs0, xs-1]."""
    n = len(xs)
    xc = np.minimum(np.maximum(x, xs[0]), xs[-1])
    if n == 1:
        z = np.zeros(xc.shape, dtype=np.int64)
        return z, z, np.zeros(xc.shape), z, xc
    i = np.searchsorted(xs, xc, "left")
    exact = np.where(xs[np.minimum(i, n - 1)] == xc, np.minimum(i, n - 1), -1)
    i1 = np.clip(i, 1, n - 1)
    i0 = i1 - 1
    w = (np.log(xc) - lxs[i0]) / (lxs[i1] - lxs[i0])
    return i0, i1, w, exact, xc


def curve_eval(curve, x):
    """A :class:`pdsim.profile_tables.LogCurve` at each x (clamped into its range).

    Returns (t at the clamped x, clamped x, code: measured/interpolated, or extrapolated
    where x was outside).  Exact at table points."""
    xs, lxs, ys, lys = _arrays(curve, lambda c: (np.asarray(c.x, float), np.asarray(c.lx, float),
                                                 np.asarray(c.y, float), np.asarray(c.ly, float)))
    x = np.asarray(x, dtype=float)
    i0, i1, w, exact, xc = _bracket(xs, lxs, x)
    t = np.exp(lys[i0] + (lys[i1] - lys[i0]) * w)
    t = np.where(exact >= 0, ys[np.maximum(exact, 0)], t)
    code = np.where(exact >= 0, MEASURED, INTERPOLATED)
    code = np.where(xc != x, EXTRAPOLATED, code)
    return t, xc, code


def grid_eval(grid, b: float, c):
    """A :class:`pdsim.profile_tables.LogGrid` at one batch ``b`` and contexts ``c`` (clamped)."""
    bs, lbs, cs, lcs, t, lt = _arrays(grid, lambda g: (
        np.asarray(g.batch, float), np.log(np.asarray(g.batch, float)), np.asarray(g.context, float),
        np.log(np.asarray(g.context, float)), np.asarray(g.t, float), np.asarray(g.lt, float)))
    b0, b1, wb, eb, bc = _bracket(bs, lbs, np.asarray([float(b)]))
    b0, b1, wb, eb, bc = int(b0[0]), int(b1[0]), float(wb[0]), int(eb[0]), float(bc[0])
    c = np.asarray(c, dtype=float)
    c0, c1, wc, ec, cc = _bracket(cs, lcs, c)
    top = lt[b0, c0] * (1 - wc) + lt[b0, c1] * wc
    bot = lt[b1, c0] * (1 - wc) + lt[b1, c1] * wc
    out = np.exp(top * (1 - wb) + bot * wb)
    if eb >= 0:
        out = np.where(ec >= 0, t[eb, np.maximum(ec, 0)], out)
    code = np.where((ec >= 0) & (eb >= 0), MEASURED, INTERPOLATED)
    code = np.where((cc != c) | (bc != b), EXTRAPOLATED, code)
    return out, bc, cc, code


# --- the datasheet roofline -----------------------------------------------------------------
def gemm_roofline(dev, m, n: int, k: int, weight_bytes: float, act_bytes: float = 2.0,
                  dtype: str = "bf16", weight_only: str | None = None):
    """One (m x k) @ (k x n) GEMM on the roofline (m may be an array)."""
    e = dev.spec.efficiency
    m = np.asarray(m, dtype=float)
    flops = 2.0 * m * n * k
    bytes_ = n * k * weight_bytes + (m * k + m * n) * act_bytes
    m_half = e.gemm_m_half if weight_only is None else min(e.gemm_m_half, WEIGHT_ONLY_M_HALF)
    t = np.maximum(flops * (m + m_half) / (m * dev.peak_flops(dtype) * e.gemm_max),
                   bytes_ / (dev.mem_bw_Bps * e.memory))
    if weight_only is not None:
        passes = np.ceil(m / DEQUANT_M_TILE)
        t = np.maximum(t, n * k * DEQUANT_OPS[weight_only] * passes / dev.peak_flops("fp32"))
    return t + e.kernel_overhead_us * 1e-6


def attention_roofline(dev, flops, bytes_, prefill: bool, dtype: str = "bf16"):
    e = dev.spec.efficiency
    c_eff = e.attention_prefill if prefill else e.attention_prefill * 0.5
    m_eff = e.memory if prefill else e.attention_decode_memory
    floor = (e.attention_prefill_floor_us if prefill else e.attention_decode_floor_us) * 1e-6
    t = _max(flops / (dev.peak_flops(dtype) * c_eff), bytes_ / (dev.mem_bw_Bps * m_eff))
    return _pos_max(t, floor)


def elementwise_roofline(dev, bytes_, kernels: int):
    """``kernels`` memory-bound elementwise kernels (norm, RoPE, activation) moving ``bytes_`` in all."""
    e = dev.spec.efficiency
    return _pos_max(bytes_ / (dev.mem_bw_Bps * e.memory), kernels * e.elementwise_floor_us * 1e-6)


def allreduce_datasheet(dev, bytes_: float, tp: int) -> float:
    """All-reduce of ``bytes_`` over ``tp`` GPUs without a measured table.

    Small messages go through a custom one-shot kernel (every GPU reads the other t-1
    buffers over NVLink and reduces: one launch, ~``allreduce_base_us``); large ones through
    a two-shot / ring (reduce-scatter then all-gather: 2 (t-1)/t of the message per link,
    two phases).  The faster of the two, as vLLM's custom all-reduce picks."""
    if tp <= 1:
        return 0.0
    e = dev.spec.efficiency
    bw = dev.interconnect_Bps * e.allreduce
    base = e.allreduce_base_us * 1e-6
    one_shot = base + (tp - 1) * bytes_ / bw
    two_shot = 2 * base + 2 * (tp - 1) / tp * bytes_ / bw
    return min(one_shot, two_shot)


# --- tables first --------------------------------------------------------------------------
def gemm_time(dev, m, n: int, k: int, weight_bytes: float, act_bytes: float = 2.0, dtype: str = "bf16",
              weight_only: str | None = None, table_dtype: str | None = None):
    """(time_s, code) of a GEMM: the table of ``(n, k, table_dtype)`` if the profile has one
    (anchored roofline outside its M range), else the roofline."""
    m = np.asarray(m, dtype=float)
    tabs = dev.tables
    curve = None if tabs is None else tabs.gemm.get((n, k, table_dtype or dtype))
    if curve is None:
        return gemm_roofline(dev, m, n, k, weight_bytes, act_bytes, dtype, weight_only), np.full(m.shape, ROOFLINE)
    t, mc, code = curve_eval(curve, m)
    if np.any(code == EXTRAPOLATED):
        ratio = gemm_roofline(dev, m, n, k, weight_bytes, act_bytes, dtype, weight_only) \
            / gemm_roofline(dev, mc, n, k, weight_bytes, act_bytes, dtype, weight_only)
        t = np.where(code == EXTRAPOLATED, t * ratio, t)
    return t, code


def attention_time(dev, tokens, attn_work, kv_read, batch, heads: tuple[int, int, int], prefill: bool,
                   kv_bytes: float = 2.0, dtype: str = "bf16", table_dtype: str = "bf16"):
    """(time_s, code) of one layer's attention for aggregates (arrays allowed for attn_work and
    kv_read; tokens and batch are scalars).  Prefill tables by effective prompt length
    ``2 attn_work / tokens`` scaled by ``tokens / length`` prompts; decode tables by (batch,
    ``kv_read / batch``); outside a table the roofline anchored at its edge."""
    qh, kvh, d = heads
    flops = 4.0 * qh * d * attn_work
    bytes_ = kv_read * 2 * kvh * d * kv_bytes + tokens * (qh + 2 * kvh) * d * 2.0
    roof = attention_roofline(dev, flops, bytes_, prefill, dtype)
    tabs = dev.tables
    none = ROOFLINE
    if tabs is None or tokens <= 0:
        return roof, none
    key = (qh, kvh, d, table_dtype)
    scalar = not _is_arr(attn_work, kv_read)
    attn_work = np.asarray(attn_work, dtype=float)
    kv_read = np.asarray(kv_read, dtype=float)
    if prefill:
        curve = tabs.prefill.get(key)
        if curve is None or not np.all(attn_work > 0):
            return roof, none
        seq = 2.0 * attn_work / tokens
        per_prompt, sc, code = curve_eval(curve, seq)
        if np.any(code == EXTRAPOLATED):
            def one_prompt(s):
                return attention_roofline(dev, 4.0 * qh * d * s * s / 2.0,
                                          s * 2 * kvh * d * kv_bytes + s * (qh + 2 * kvh) * d * 2.0, True, dtype)
            per_prompt = np.where(code == EXTRAPOLATED, per_prompt * one_prompt(seq) / one_prompt(sc), per_prompt)
        t = per_prompt * (tokens / seq)
        return (float(t), int(code)) if scalar else (t, code)
    grid = tabs.decode.get(key)
    if grid is None or batch <= 0 or not np.all(kv_read > 0):
        return roof, none
    t, bc, cc, code = grid_eval(grid, batch, kv_read / batch)
    if np.any(code == EXTRAPOLATED):
        f_c = 4.0 * qh * d * bc * cc
        b_c = bc * cc * 2 * kvh * d * kv_bytes + bc * (qh + 2 * kvh) * d * 2.0
        t = np.where(code == EXTRAPOLATED, t * roof / attention_roofline(dev, f_c, b_c, False, dtype), t)
    return (float(t), int(code)) if scalar else (t, code)
