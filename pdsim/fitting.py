"""Fit the roofline-with-efficiency model of :mod:`pdsim.devices` to measured timings.

The GEMM model (per kernel, exactly as ``DeviceProfile.gemm_time``)::

    t = max(2 m n k (m + m_half) / (m * C),  bytes / B) + overhead
    C = peak * gemm_max  (effective compute rate),  B = bw * memory  (effective bandwidth)

is fitted by least squares in log-time (every shape counts by its relative
error, so a 10 us matvec weighs as much as a 1 s GEMM) with a small
Nelder-Mead written here (no scipy), restarted until it stops improving, in
log-parameter space so every parameter stays positive.  Attention efficiencies
are then fitted one at a time with the GEMM's bandwidth and overhead fixed.

Efficiencies above 1 (a peak in the datasheet lower than what was measured)
are not clipped here: :func:`to_efficiency` raises the peak instead and says so.
"""
from __future__ import annotations

import math
from typing import Callable, Sequence

import numpy as np


# --- the model -----------------------------------------------------------------
def gemm_model(m, n, k, C, B, m_half, overhead_s, w_bytes=2.0, act_bytes=2.0):
    """Roofline GEMM time (vectorised over numpy arrays)."""
    m, n, k = (np.asarray(v, dtype=float) for v in (m, n, k))
    flops = 2.0 * m * n * k
    bytes_ = n * k * w_bytes + (m * k + m * n) * act_bytes
    return np.maximum(flops * (m + m_half) / (m * C), bytes_ / B) + overhead_s


def attention_flops_bytes(tokens, attn_work, kv_read, qh, kvh, d, kv_bytes=2.0):
    """Per-layer attention FLOPs and bytes as :class:`pdsim.costmodel.RooflineCost` counts them."""
    tokens, attn_work, kv_read, qh, kvh, d = (np.asarray(v, dtype=float) for v in
                                              (tokens, attn_work, kv_read, qh, kvh, d))
    flops = 4.0 * qh * d * attn_work
    bytes_ = kv_read * 2 * kvh * d * kv_bytes + tokens * (qh + 2 * kvh) * d * 2.0
    return flops, bytes_


def attention_model(flops, bytes_, C, B, overhead_s):
    return np.maximum(np.asarray(flops, float) / C, np.asarray(bytes_, float) / B) + overhead_s


# --- a small Nelder-Mead ---------------------------------------------------------
def nelder_mead(f: Callable[[np.ndarray], float], x0: Sequence[float], step: float = 0.5,
                xtol: float = 1e-10, ftol: float = 1e-16, max_iter: int = 4000) -> tuple[np.ndarray, float]:
    """Minimise f from x0 (standard reflection/expansion/contraction/shrink)."""
    x0 = np.asarray(x0, dtype=float)
    n = len(x0)
    simplex = [x0] + [x0 + step * np.eye(n)[i] for i in range(n)]
    vals = [f(x) for x in simplex]
    for _ in range(max_iter):
        order = np.argsort(vals)
        simplex = [simplex[i] for i in order]
        vals = [vals[i] for i in order]
        if (max(np.max(np.abs(s - simplex[0])) for s in simplex[1:]) < xtol
                or abs(vals[-1] - vals[0]) < ftol):
            break
        centroid = np.mean(simplex[:-1], axis=0)
        worst = simplex[-1]
        xr = centroid + (centroid - worst)
        fr = f(xr)
        if fr < vals[0]:
            xe = centroid + 2.0 * (centroid - worst)
            fe = f(xe)
            simplex[-1], vals[-1] = (xe, fe) if fe < fr else (xr, fr)
        elif fr < vals[-2]:
            simplex[-1], vals[-1] = xr, fr
        else:
            xc = centroid + 0.5 * ((xr if fr < vals[-1] else worst) - centroid)
            fc = f(xc)
            if fc < min(fr, vals[-1]):
                simplex[-1], vals[-1] = xc, fc
            else:
                best = simplex[0]
                simplex = [best] + [best + 0.5 * (s - best) for s in simplex[1:]]
                vals = [vals[0]] + [f(s) for s in simplex[1:]]
    i = int(np.argmin(vals))
    return simplex[i], vals[i]


def grid_descent(f: Callable[..., float], grids: Sequence[Sequence[float]], start: Sequence[float],
                 max_rounds: int = 20) -> tuple[float, ...]:
    """Minimise ``f(*x)`` over a product of grids by coordinate descent: each coordinate in turn set to its
    grid's best value with the others held, rounds repeated until nothing moves (or ``max_rounds``).
    Deterministic and derivative-free: for a few bounded constants fitted on a grid of sensible values.  It
    stops at a coordinate-wise minimum of the grid, which a narrow diagonal valley can keep from the global one
    (tests/test_calibration.py), so start it from sensible values."""
    x = [float(v) for v in start]
    for _ in range(max_rounds):
        last = list(x)
        for i, grid in enumerate(grids):
            x[i] = float(min(grid, key=lambda v: f(*x[:i], v, *x[i + 1:])))
        if x == last:
            break
    return tuple(x)


def minimise(f, x0, restarts: int = 8) -> tuple[np.ndarray, float]:
    """Nelder-Mead restarted from its own optimum with a shrinking simplex until it stops improving."""
    x, fx = nelder_mead(f, x0)
    step = 0.5
    for _ in range(restarts):
        step *= 0.5
        x2, f2 = nelder_mead(f, x, step=max(step, 1e-3))
        if f2 >= fx - 1e-18:
            break
        x, fx = x2, f2
    return x, fx


def _log_loss(pred: np.ndarray, meas: np.ndarray) -> float:
    if not np.all(np.isfinite(pred)) or np.any(pred <= 0):
        return 1e30
    r = np.log(pred) - np.log(meas)
    return float(np.mean(r * r))


# --- fits -------------------------------------------------------------------------
def fit_gemm(m, n, k, t, w_bytes: float = 2.0, act_bytes: float = 2.0) -> dict:
    """Fit C (FLOP/s), B (B/s), m_half, overhead_s to GEMM timings.  Returns the parameters and the
    RMS log error.  Starts from a small grid over (m_half, overhead) so the optimum found is global."""
    m, n, k, t = (np.asarray(v, dtype=float) for v in (m, n, k, t))
    flops = 2.0 * m * n * k
    bytes_ = n * k * w_bytes + (m * k + m * n) * act_bytes
    c0, b0 = float(np.max(flops / t)) * 1.2, float(np.max(bytes_ / t)) * 1.2

    def loss(x):
        C, B, mh, ov = np.exp(x)
        return _log_loss(gemm_model(m, n, k, C, B, mh, ov, w_bytes, act_bytes), t)

    tmin = float(np.min(t))
    starts = [np.log([c0, b0, mh, ov]) for mh in (1.0, 16.0, 256.0) for ov in (tmin * 0.05, tmin * 0.5)]
    scored = sorted(((loss(s), i) for i, s in enumerate(starts)))
    best = None
    for _, i in scored[:3]:
        x, fx = minimise(loss, starts[i])
        if best is None or fx < best[1]:
            best = (x, fx)
    C, B, mh, ov = np.exp(best[0])
    return {"compute_Fps": float(C), "bandwidth_Bps": float(B), "m_half": float(mh),
            "overhead_s": float(ov), "rms_log_error": math.sqrt(best[1]), "points": int(len(t))}


def fit_rate(flops, bytes_, t, overhead_s: float, *, C: float | None = None, B: float | None = None,
             C_max: float = math.inf, B_max: float = math.inf) -> dict:
    """Fit whichever of C (compute rate) and B (bandwidth) is None in
    ``t = max(flops/C, bytes/B) + overhead`` (overhead fixed), each at most its cap."""
    flops, bytes_, t = (np.asarray(v, dtype=float) for v in (flops, bytes_, t))
    free = [name for name, v in (("C", C), ("B", B)) if v is None]
    guess = {"C": float(np.max(flops / t)) * 1.2 if np.any(flops > 0) else 1e12,
             "B": float(np.max(bytes_ / t)) * 1.2}

    def unpack(x):
        vals = {"C": C, "B": B}
        for name, v in zip(free, np.exp(np.minimum(x, 700.0))):
            vals[name] = min(v, C_max if name == "C" else B_max)
        return vals["C"], vals["B"]

    def loss(x):
        c, b = unpack(x)
        return _log_loss(attention_model(flops, bytes_, c, b, overhead_s), t)

    caps = {"C": C_max, "B": B_max}
    x, fx = minimise(loss, np.log([min(guess[name], caps[name]) for name in free]))
    c, b = unpack(x)
    return {"compute_Fps": float(c), "bandwidth_Bps": float(b), "rms_log_error": math.sqrt(fx),
            "points": int(len(t))}


def to_efficiency(rates: dict[str, float], peak_flops: float, peak_bw: float) -> tuple[dict, float, float, list[str]]:
    """Efficiencies from effective rates, raising a peak that the measurement exceeded.

    ``rates`` holds ``gemm_C, gemm_B, attn_prefill_C, attn_decode_B`` (decode compute is tied to
    half of prefill's by the cost model); attention efficiencies are clipped to 1.
    Returns (efficiencies, peak_flops, peak_bw, notes)."""
    notes = []
    need_f, need_b = rates["gemm_C"], rates["gemm_B"]   # only the GEMM fit (most points) may raise a peak
    if need_f > peak_flops:
        notes.append(f"peak raised from {peak_flops / 1e12:.4g} to {need_f / 1e12:.4g} TFLOP/s: measured above datasheet")
        peak_flops = need_f
    if need_b > peak_bw:
        notes.append(f"memory bandwidth raised from {peak_bw / 1e9:.4g} to {need_b / 1e9:.4g} GB/s: measured above datasheet")
        peak_bw = need_b

    def eff(v, peak):
        return float(min(1.0, max(1e-4, v / peak)))

    return ({"gemm_max": eff(rates["gemm_C"], peak_flops), "memory": eff(rates["gemm_B"], peak_bw),
             "attention_prefill": eff(rates["attn_prefill_C"], peak_flops),
             "attention_decode_memory": eff(rates["attn_decode_B"], peak_bw)}, peak_flops, peak_bw, notes)


# --- error summaries ----------------------------------------------------------------
def ape(pred, meas) -> np.ndarray:
    """Absolute percentage error of each prediction."""
    pred, meas = np.asarray(pred, float), np.asarray(meas, float)
    return 100.0 * np.abs(pred - meas) / meas


def summarize(errors) -> dict:
    e = np.asarray(errors, float)
    if e.size == 0:
        return {"n": 0, "median_ape": None, "p90_ape": None}
    return {"n": int(e.size), "median_ape": round(float(np.median(e)), 2),
            "p90_ape": round(float(np.percentile(e, 90)), 2)}


# --- fits of the cost model's efficiency constants to measured kernel tables ---------------------------
def fit_log(pred, t, x0: Sequence[float], caps: Sequence[float] | None = None) -> tuple[np.ndarray, float]:
    """Positive parameters p minimising the mean squared log error of ``pred(p)`` against ``t``;
    searched in log space from ``x0`` (each at most its cap).  Returns (p, RMS log error)."""
    t = np.asarray(t, float)
    caps_a = np.full(len(x0), np.inf) if caps is None else np.asarray(caps, float)

    def unpack(x):
        return np.minimum(np.exp(np.minimum(x, 700.0)), caps_a)

    x, fx = minimise(lambda x: _log_loss(np.asarray(pred(unpack(x)), float), t), np.log(np.asarray(x0, float)))
    return unpack(x), math.sqrt(fx)


def attention_kernel_model(flops, bytes_, C, B, overhead_s, floor_s):
    """:func:`pdsim.kernels.attention_roofline` with explicit rates: max(f/C, b/B) + max(overhead, floor)."""
    return np.maximum(np.asarray(flops, float) / C, np.asarray(bytes_, float) / B) + max(overhead_s, floor_s)


def allreduce_model(bytes_, tp, bw_Bps, base_s, per_peer_s=0.0):
    """:func:`pdsim.kernels.allreduce_datasheet` on arrays: the faster of one-shot and two-shot."""
    s, t = np.asarray(bytes_, float), np.asarray(tp, float)
    b = base_s + (t - 1) * per_peer_s
    return np.minimum(b + (t - 1) * s / bw_Bps, 2 * b + 2 * (t - 1) / t * s / bw_Bps)
