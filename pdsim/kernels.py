"""Kernel timings on a device: measured tables first, the datasheet roofline elsewhere.

Every function here takes numpy arrays (or numpy scalars) for the quantities
that vary between decode steps, so the cost model evaluates one step and k
steps with the same code (:mod:`pdsim.costmodel`).  Each returns
``(time_s, source)`` where ``source`` says where the time came from:

- ``"exact"``: a measured table point;
- ``"interpolated"``: between table points (log-log, as :mod:`pdsim.profile_tables`);
- ``"extrapolated"``: outside the table's range: the roofline scaled to agree with
  the table at its nearest edge (the shape of the curve from the roofline, its
  level from the measurement);
- ``"roofline"``: no table for this kernel: datasheet peaks times efficiencies.

Roofline per kernel (``e`` = the profile's ``efficiency``)::

    GEMM        max(2MNK (M + m_half) / (M peak gemm_max), bytes / (bw memory)) + kernel_overhead
    attention   max(flops / (peak attention_prefill [x 0.5 in decode]), bytes / (bw eff_mem))
                    + max(kernel_overhead, attention_{prefill,decode}_floor)
    elementwise max(bytes / (bw memory), kernels * elementwise_floor)
    all-reduce  min(one-shot, two-shot): one-shot  base + (t-1) S / (link allreduce)
                                         two-shot 2 base + 2 (t-1)/t S / (link allreduce)
                base = allreduce_base_us + (t-1) allreduce_per_peer_us

Weight-only int4/int8 GEMMs read ``weight_bytes`` per weight, compute in bf16 on
tensor cores with M tiled by 16 (Marlin-style kernels: small M does not pay
the full ``m_half``), and dequantise every weight once per 64 rows of M at
``DEQUANT_OPS`` CUDA-core operations per weight (fp32 peak), overlapped with
the rest (a ``max``).  These two constants are estimates, not fitted.
"""
from __future__ import annotations

import bisect
import math

import numpy as np

#: CUDA-core operations to dequantise one weight (unpack, convert, scale): an estimate
DEQUANT_OPS = {"int4": 4.0, "int8": 2.0, "fp4": 4.0}
#: rows of M a weight-only kernel dequantises each weight tile for (one pass per 64 rows)
DEQUANT_M_TILE = 64
#: M tile of weight-only tensor-core kernels: their small-M compute inefficiency is capped at this
WEIGHT_ONLY_M_HALF = 16.0

# source codes (arrays carry codes; names for people)
EXACT, INTERPOLATED, EXTRAPOLATED, ROOFLINE = 0, 1, 2, 3
SOURCE_NAMES = ("exact", "interpolated", "extrapolated", "roofline")


def source_name(codes) -> str:
    """One name for a kernel's source over k steps: the least measured of them."""
    return SOURCE_NAMES[int(np.max(codes))]


def _is_arr(a, b=None) -> bool:
    return isinstance(a, np.ndarray) or isinstance(b, np.ndarray)


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


# --- the datasheet roofline -----------------------------------------------------------------
_GEMM_CONSTS: dict = {}


def _gemm_consts(dev, dtype: str, weight_only: str | None) -> tuple:
    """(peak FLOP/s, gemm_max, compute fraction, memory rate, m_half, fixed seconds) of a GEMM kernel: the
    profile's constants, looked up once per (profile, dtype, weight-only) instead of once per GEMM (a prefill
    step that misses the cost model's cache prices a dozen of them)."""
    key = (id(dev), dtype, weight_only)
    hit = _GEMM_CONSTS.get(key)
    if hit is not None and hit[0] is dev:
        return hit[1]
    e = dev.spec.efficiency
    # fp8 weights on fp8 tensor cores: their own fractions of the compute / memory efficiency and launch cost
    fc, fm, ov = (e.fp8_gemm_compute, e.fp8_gemm_memory, e.fp8_gemm_overhead_us) if dtype == "fp8" \
        else (1.0, 1.0, None)
    ov_s = (e.kernel_overhead_us if ov is None else ov) * 1e-6
    m_half = e.gemm_m_half if weight_only is None else min(e.gemm_m_half, WEIGHT_ONLY_M_HALF)
    consts = (dev.peak_flops(dtype), e.gemm_max, fc, dev.mem_bw_Bps * e.memory * fm, m_half, ov_s)
    if len(_GEMM_CONSTS) > 4096:
        _GEMM_CONSTS.clear()
    _GEMM_CONSTS[key] = (dev, consts)
    return consts


def gemm_roofline(dev, m, n: int, k: int, weight_bytes: float, act_bytes: float = 2.0,
                  dtype: str = "bf16", weight_only: str | None = None):
    """One (m x k) @ (k x n) GEMM on the roofline (m may be an array).  No rows (m <= 0): no kernel, 0 s
    (as a grouped GEMM with no pairs; the formula's m / m would be 0 / 0 there)."""
    if not isinstance(m, np.ndarray):
        if m <= 0:
            return 0.0
        peak, gemm_max, fc, mem, m_half, ov_s = _gemm_consts(dev, dtype, weight_only)
        # one GEMM: the same arithmetic on Python floats (a prefill step misses the cost model's
        # cache, and numpy's per-call overhead on 0-d arrays was most of its time)
        m = float(m)
        flops = 2.0 * m * n * k
        bytes_ = n * k * weight_bytes + (m * k + m * n) * act_bytes
        comp = flops * (m + m_half) / (m * peak * gemm_max * fc)
        t = bytes_ / mem
        if comp >= t:
            t = comp
        if weight_only is not None:
            t = _max(t, n * k * DEQUANT_OPS[weight_only] * float(math.ceil(m / DEQUANT_M_TILE))
                     / dev.peak_flops("fp32"))
        return t + ov_s
    peak, gemm_max, fc, mem, m_half, ov_s = _gemm_consts(dev, dtype, weight_only)
    m = np.asarray(m, dtype=float)
    flops = 2.0 * m * n * k
    bytes_ = n * k * weight_bytes + (m * k + m * n) * act_bytes
    with np.errstate(invalid="ignore", divide="ignore"):     # m = 0 rows: masked to 0 below
        t = np.maximum(flops * (m + m_half) / (m * peak * gemm_max * fc), bytes_ / mem)
    if weight_only is not None:
        passes = np.ceil(m / DEQUANT_M_TILE)
        t = np.maximum(t, n * k * DEQUANT_OPS[weight_only] * passes / dev.peak_flops("fp32"))
    return np.where(m > 0, t + ov_s, 0.0)


def grouped_gemm_roofline(dev, pairs: float, groups: float, n: int, k: int, weight_bytes: float,
                          dtype: str = "bf16", weight_only: str | None = None, act_bytes: float = 2.0) -> float:
    """One grouped GEMM (an MoE layer's routed experts on one GPU): ``groups`` experts hit, each an
    (m x k) @ (k x n) GEMM, ``pairs`` token-expert rows in all (m = pairs / groups per expert; both may
    be expected values, not integers).  Each hit expert's weights are read once; one launch."""
    if pairs <= 0 or groups <= 0:
        return 0.0
    e = dev.spec.efficiency
    m = pairs / groups
    flops = 2.0 * pairs * n * k
    bytes_ = groups * n * k * weight_bytes + pairs * (n + k) * act_bytes
    m_half = e.gemm_m_half if weight_only is None else min(e.gemm_m_half, WEIGHT_ONLY_M_HALF)
    fc, fm, ov = (e.grouped_fp8_compute, e.grouped_fp8_memory, e.grouped_fp8_overhead_us) if dtype == "fp8" \
        else (1.0, 1.0, None)
    t = max(flops * (m + m_half) / (m * dev.peak_flops(dtype) * e.gemm_max * fc),
            bytes_ / (dev.mem_bw_Bps * e.memory * fm))
    if weight_only is not None:
        t = max(t, groups * n * k * DEQUANT_OPS[weight_only] * math.ceil(m / DEQUANT_M_TILE) / dev.peak_flops("fp32"))
    return t + (e.kernel_overhead_us if ov is None else ov) * 1e-6


def alltoall_roofline(dev, bytes_: float, ep: int) -> float:
    """An all-to-all over ``ep`` GPUs in which each GPU sends ``bytes_`` (and receives as much): the
    all-reduce's per-launch and per-peer latencies and link efficiency (an estimate; a profile's measured
    DeepEP tables replace it where ``a2a_tables`` is on)."""
    if ep <= 1:
        return 0.0
    e = dev.spec.efficiency
    base = (e.allreduce_base_us + (ep - 1) * e.allreduce_per_peer_us) * 1e-6
    return base + bytes_ / (dev.interconnect_Bps * e.allreduce)


def p2p_roofline(dev, bytes_: float) -> float:
    """A point-to-point send of ``bytes_`` between two GPUs (pipeline stages): the interconnect's
    latency plus the bytes at its bandwidth times the collectives' link efficiency."""
    if bytes_ <= 0:
        return 0.0
    return dev.interconnect_latency_s + bytes_ / (dev.interconnect_Bps * dev.spec.efficiency.allreduce)


_ATTN_CONSTS: dict = {}


def _attention_consts(dev, prefill: bool, dtype: str) -> tuple[float, float, float]:
    """(1 / compute rate, 1 / bandwidth, fixed seconds) of an attention kernel; memoised per profile."""
    key = (id(dev), prefill, dtype)
    hit = _ATTN_CONSTS.get(key)
    if hit is not None and hit[0] is dev:
        return hit[1]
    e = dev.spec.efficiency
    c_eff = e.attention_prefill if prefill else e.attention_prefill * 0.5
    m_eff = e.memory if prefill else e.attention_decode_memory
    fixed = max((e.attention_prefill_floor_us if prefill else e.attention_decode_floor_us), e.kernel_overhead_us) * 1e-6
    consts = (1.0 / (dev.peak_flops(dtype) * c_eff), 1.0 / (dev.mem_bw_Bps * m_eff), fixed)
    if len(_ATTN_CONSTS) > 4096:
        _ATTN_CONSTS.clear()
    _ATTN_CONSTS[key] = (dev, consts)
    return consts


def attention_roofline(dev, flops, bytes_, prefill: bool, dtype: str = "bf16"):
    """max(compute, memory) plus the kernel's fixed cost: its floor (launch, split-K reduction,
    tail; ~10 us for decode attention on Hopper) where the profile has one, else kernel_overhead."""
    inv_c, inv_m, fixed = _attention_consts(dev, prefill, dtype)
    if isinstance(flops, np.ndarray) or isinstance(bytes_, np.ndarray):
        base = np.maximum(flops * inv_c, bytes_ * inv_m)
        return np.where(base > 0.0, base + fixed, 0.0)
    base, mem = flops * inv_c, bytes_ * inv_m      # (_max and _is_arr inlined: every step prices one)
    if mem > base:
        base = mem
    return base + fixed if base > 0 else 0.0


_ELEMENTWISE_CONSTS: dict = {}


def elementwise_roofline(dev, bytes_, kernels: int):
    """``kernels`` memory-bound elementwise kernels (norm, RoPE, activation) moving ``bytes_`` in all."""
    hit = _ELEMENTWISE_CONSTS.get(id(dev))
    if hit is None or hit[0] is not dev:       # (the profile's rate and floor, looked up once per profile)
        e = dev.spec.efficiency
        if len(_ELEMENTWISE_CONSTS) > 4096:
            _ELEMENTWISE_CONSTS.clear()
        hit = _ELEMENTWISE_CONSTS[id(dev)] = (dev, dev.mem_bw_Bps * e.memory, e.elementwise_floor_us)
    _, rate, floor_us = hit
    return _pos_max(bytes_ / rate, kernels * floor_us * 1e-6)


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
    base = (e.allreduce_base_us + (tp - 1) * e.allreduce_per_peer_us) * 1e-6
    one_shot = base + (tp - 1) * bytes_ / bw
    two_shot = 2 * base + 2 * (tp - 1) / tp * bytes_ / bw
    return min(one_shot, two_shot)


def allreduce_time(dev, bytes_: float, tp: int) -> tuple[float, int]:
    """(time_s, code): the profile's all-reduce table for ``tp`` through ``DeviceProfile``, else
    :func:`allreduce_datasheet`."""
    if tp <= 1:
        return 0.0, EXACT
    tabs = dev.tables
    if tabs is not None and any(key[0] == tp for key in getattr(tabs, "allreduce", {})):
        lookup = getattr(dev, "allreduce_lookup", None)
        if lookup is not None:
            r = lookup(bytes_, tp)
            return r.time_s, _how(r.source)
        return dev.allreduce_time(bytes_, tp), INTERPOLATED
    return allreduce_datasheet(dev, bytes_, tp), ROOFLINE


# --- tables first ---------------------------------------------------------------------------
# The tables' own scalar lookups (pdsim.profile_tables) are used for every point they serve; the
# k-step decode path calls them only at the grid's context points and interpolates between those in
# log-log, which is what the bilinear lookup does inside a cell, so one step and k steps agree.
def _how(r) -> int:
    return SOURCE_NAMES.index(r) if r in SOURCE_NAMES else INTERPOLATED


def _gemm_lookup(tabs, m, n, k, dtype):
    """(time_s, code) from the tables or None."""
    f = getattr(tabs, "gemm_lookup", None)
    if f is not None:
        r = f(m, n, k, dtype)
        return None if r is None else (r.time_s, _how(r.how))
    t = tabs.gemm_time(m, n, k, dtype)
    if t is None:
        return None
    return t, EXACT if m in tabs.gemm[(n, k, dtype)].x else INTERPOLATED


def _attention_lookup(tabs, prefill, shape, dtype):
    f = getattr(tabs, "attention_lookup", None)
    if f is not None:
        r = f(prefill, shape, dtype)
        return None if r is None else (r.time_s, _how(r.how))
    t = tabs.attention_time(prefill, shape, dtype)
    if t is None:
        return None
    tokens, attn_work, kv_read, batch, qh, kvh, d = shape
    if prefill:
        exact = tokens * tokens == 2.0 * attn_work and tokens in tabs.prefill[(qh, kvh, d, dtype)].x
    else:
        grid = tabs.decode[(qh, kvh, d, dtype)]
        exact = batch in grid.batch and kv_read / batch in grid.context
    return t, EXACT if exact else INTERPOLATED


def gemm_time(dev, m: float, n: int, k: int, weight_bytes: float, act_bytes: float = 2.0, dtype: str = "bf16",
              weight_only: str | None = None, table_dtype: str | None = None) -> tuple[float, int]:
    """(time_s, code) of one GEMM: the profile's table of ``(n, k, table_dtype)`` (outside its M range
    the roofline anchored at the nearest measured M), else the roofline."""
    tabs, tdt = dev.tables, table_dtype or dtype
    if tabs is not None:
        hit = _gemm_lookup(tabs, m, n, k, tdt)
        if hit is not None:
            return hit
        curve = tabs.gemm.get((n, k, tdt))
        if curve is not None and m > 0:
            mc = min(max(m, curve.x[0]), curve.x[-1])
            hit = _gemm_lookup(tabs, mc, n, k, tdt)
            if hit is not None:
                ratio = gemm_roofline(dev, m, n, k, weight_bytes, act_bytes, dtype, weight_only) \
                    / gemm_roofline(dev, mc, n, k, weight_bytes, act_bytes, dtype, weight_only)
                return float(hit[0] * ratio), EXTRAPOLATED
    return float(gemm_roofline(dev, m, n, k, weight_bytes, act_bytes, dtype, weight_only)), ROOFLINE


def moe_time(dev, tokens: float, key: tuple) -> tuple[float, int] | None:
    """(time_s, code) of one MoE layer's routed experts from the profile's ``moe`` table for ``key``
    (see :meth:`pdsim.profile_tables.MeasuredTables.moe_lookup`), or None where it has none."""
    tabs = dev.tables
    f = getattr(tabs, "moe_lookup", None) if tabs is not None else None
    r = f(tokens, key) if f is not None else None
    return None if r is None else (r.time_s, _how(r.how))


def _attn_fb(qh, kvh, d, kv_bytes, tokens, attn_work, kv_read):
    return 4.0 * qh * d * attn_work, kv_read * 2 * kvh * d * kv_bytes + tokens * (qh + 2 * kvh) * d * 2.0


def attention_time(dev, tokens, attn_work, kv_read, batch, heads: tuple[int, int, int], prefill: bool,
                   kv_bytes: float = 2.0, dtype: str = "bf16", table_dtype: str = "bf16", flops_bytes=None,
                   fb=None):
    """(time_s, code) of one layer's attention for the step aggregates.  ``attn_work`` and
    ``kv_read`` may be arrays over decode steps (``tokens`` and ``batch`` fixed); then time and code
    are arrays.  Outside a table the roofline anchored at the table's edge.  ``fb``: the kernel's
    (flops, bytes) of (tokens, attn_work, kv_read) for that roofline (default: GQA of ``heads``; MLA
    passes its own)."""
    qh, kvh, d = heads
    if fb is None:
        flops, bytes_ = flops_bytes or _attn_fb(qh, kvh, d, kv_bytes, tokens, attn_work, kv_read)
    else:
        flops, bytes_ = flops_bytes or fb(tokens, attn_work, kv_read)
    roof = attention_roofline(dev, flops, bytes_, prefill, dtype)
    tabs = dev.tables
    arr = _is_arr(attn_work, kv_read)
    if tabs is None or tokens <= 0:
        return roof, ROOFLINE           # one code for every step
    key = (qh, kvh, d, table_dtype)
    if prefill:
        assert not arr, "k-step evaluation is for decode steps"
        if attn_work <= 0:
            return roof, ROOFLINE
        hit = _attention_lookup(tabs, True, (tokens, attn_work, kv_read, batch, qh, kvh, d), table_dtype)
        if hit is not None:
            return hit
        curve = tabs.prefill.get(key)
        if curve is None:
            return roof, ROOFLINE
        seq = 2.0 * attn_work / tokens
        sc = min(max(seq, curve.x[0]), curve.x[-1])
        one = _attention_lookup(tabs, True, (sc, sc * sc / 2.0, sc, 1, qh, kvh, d), table_dtype)
        if one is None:
            return roof, ROOFLINE

        def one_prompt(s):
            f_b = _attn_fb(qh, kvh, d, kv_bytes, s, s * s / 2.0, s) if fb is None else fb(s, s * s / 2.0, s)
            return attention_roofline(dev, *f_b, True, dtype)
        return float(one[0] * one_prompt(seq) / one_prompt(sc) * (tokens / seq)), EXTRAPOLATED
    grid = tabs.decode.get(key)
    if grid is None or batch <= 0:
        return roof, (np.full(np.shape(roof), ROOFLINE) if arr else ROOFLINE)
    return _decode_from_grid(dev, tabs, grid, batch, kv_read / batch, heads, kv_bytes, dtype, table_dtype, fb)


_GRID_POINTS: dict = {}


def _grid_point(tabs, grid, b, j, heads, table_dtype):
    """The table's own lookup at (batch b, the grid's j-th context): (time, code) or None; memoised."""
    key = (id(grid), b, j)
    hit = _GRID_POINTS.get(key)
    if hit is not None and hit[0] is grid:
        return hit[1]
    c = grid.context[j]
    qh, kvh, d = heads
    val = _attention_lookup(tabs, False, (b, b * c, b * c, b, qh, kvh, d), table_dtype)
    if len(_GRID_POINTS) > 1 << 16:
        _GRID_POINTS.clear()
    _GRID_POINTS[key] = (grid, val)
    return val


_GRID_ARRAYS: dict = {}


def _grid_arrays(grid):
    hit = _GRID_ARRAYS.get(id(grid))
    if hit is None or hit[0] is not grid:
        cs = tuple(float(x) for x in grid.context)
        hit = _GRID_ARRAYS[id(grid)] = (grid, cs, np.asarray(cs), np.log(np.asarray(cs)),
                                        tuple(math.log(x) for x in cs))
    return hit[1:]


def _cell(tabs, grid, bc, a, z, heads, table_dtype):
    """(log t at context a, log t at context z, code) of the cell between two grid contexts, or None."""
    pa = _grid_point(tabs, grid, bc, a, heads, table_dtype)
    pz = pa if z == a else _grid_point(tabs, grid, bc, z, heads, table_dtype)
    if pa is None or pz is None:
        return None
    return math.log(pa[0]), math.log(pz[0]), max(pa[1], pz[1], INTERPOLATED if z != a else pa[1]), pa[0]


def _decode_from_grid(dev, tabs, grid, b, c, heads, kv_bytes, dtype, table_dtype, fb=None):
    """Decode attention at batch ``b`` and contexts ``c`` (a float or an ascending array): log-log between the
    table's values at the grid contexts around c; outside the grid (batch or context) the roofline
    anchored at the clamped point; where the table has no value, the roofline (``fb``: its flops and bytes
    of (tokens, attn_work, kv_read); default GQA of ``heads``)."""
    qh, kvh, d = heads
    if fb is None:
        def fb(t, w, r):
            return _attn_fb(qh, kvh, d, kv_bytes, t, w, r)
    cs, cs_np, lcs_np, lcs = _grid_arrays(grid)
    bs = grid.batch
    bc = min(max(float(b), bs[0]), bs[-1])
    n = len(cs)

    def anchored(t, c_, cc_):
        f1, b1 = fb(b, b * c_, b * c_)
        f0, b0 = fb(bc, bc * cc_, bc * cc_)
        return t * attention_roofline(dev, f1, b1, False, dtype) / attention_roofline(dev, f0, b0, False, dtype)

    if not isinstance(c, np.ndarray):        # one step: the same arithmetic on floats
        cc = min(max(c, cs[0]), cs[-1])
        i = bisect.bisect_left(cs, cc)
        if i < n and cs[i] == cc:
            a = z = i
        else:
            z = min(max(i, 1), n - 1)
            a = z - 1
        cell = _cell(tabs, grid, bc, a, z, heads, table_dtype)
        if cell is None:
            return attention_roofline(dev, *fb(b, b * c, b * c), False, dtype), ROOFLINE
        la, lz, code, va = cell
        t = va if z == a else math.exp(la + (lz - la) * ((math.log(cc) - lcs[a]) / (lcs[z] - lcs[a])))
        if cc != c or bc != b:
            return anchored(t, c, cc), EXTRAPOLATED
        return t, code
    # k decode steps: contexts grow by one a step, so they are sorted and span a few cells
    outside = bc != b or c[0] < cs[0] or c[-1] > cs[-1]
    cc = np.minimum(np.maximum(c, cs[0]), cs[-1]) if outside else c
    i = np.searchsorted(cs_np, cc, "left")
    exact_c = cs_np[np.minimum(i, n - 1)] == cc
    z_ = np.minimum(np.maximum(i, 1), n - 1)
    a_ = np.where(exact_c, np.minimum(i, n - 1), np.maximum(z_ - 1, 0))
    z_ = np.where(exact_c, a_, z_)
    key = a_ * n + z_
    cells = [int(key[0])] if key[0] == key[-1] and not exact_c.any() else np.unique(key).tolist()
    t = np.empty(c.shape)
    code = np.empty(c.shape, dtype=np.int64)
    for kk in cells:
        a, z = divmod(kk, n)
        sel = slice(None) if len(cells) == 1 else key == kk
        cell = _cell(tabs, grid, bc, a, z, heads, table_dtype)
        if cell is None:
            t[sel] = attention_roofline(dev, *fb(b, b * c[sel], b * c[sel]), False, dtype)
            code[sel] = ROOFLINE
            continue
        la, lz, code[sel], va = cell
        t[sel] = va if z == a else np.exp(la + (lz - la) * ((np.log(cc[sel]) - lcs[a]) / (lcs[z] - lcs[a])))
    if outside:
        out = ((cc != c) | (bc != b)) & (code != ROOFLINE)
        t = np.where(out, anchored(t, c, cc), t)
        code = np.where(out, EXTRAPOLATED, code)
    return t, code


def alltoall_time(dev, tokens: float, keys: tuple, bytes_: float, ep: int) -> tuple[float, int]:
    """(time_s, code) of ONE all-to-all kernel of an MoE layer, whose dispatch and combine are priced as
    two kernels of the mean time: ``keys`` = (dispatch key, combine key) of the profile's ``alltoall``
    tables (:meth:`pdsim.profile_tables.MeasuredTables.alltoall_lookup`) for ``tokens`` tokens on each GPU;
    the roofline of ``bytes_`` over ``ep`` GPUs where a phase has no table."""
    tabs = dev.tables
    f = getattr(tabs, "alltoall_lookup", None) if tabs is not None else None
    if f is not None and keys is not None and tokens > 0:
        rd, rc = f(tokens, keys[0]), f(tokens, keys[1])
        if rd is not None and rc is not None:
            return 0.5 * (rd.time_s + rc.time_s), max(_how(rd.how), _how(rc.how))
    return alltoall_roofline(dev, bytes_, ep), ROOFLINE
