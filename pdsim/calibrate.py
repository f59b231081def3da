"""``pdsim calibrate``: time the kernels a model runs with torch and write a measured device profile.

What is measured (bf16, the dtype the cost model computes in):

- GEMMs ``(M x K) @ (K x N)`` at each sharded linear layer of the model (qkv,
  attn_out, gate_up/up, down, lm_head) for every TP degree asked, over a log
  grid of M that spans decode batches (1 ... 512) and prefill token counts;
- causal prefill attention (``scaled_dot_product_attention(is_causal=True)``)
  of one prompt over a grid of prompt lengths, KV heads repeated to the query
  heads (GQA) outside the timed region;
- decode attention (one query token per sequence) over batch x context, GQA
  as the query heads of a KV head grouped onto that head (KV read once);
- device copy bandwidth; host<->device over pinned memory on CUDA.  All-reduce
  is not measured (one process; the profile keeps its datasheet interconnect).

Method: warm-up calls, then timed calls, each after a cache flush (a write of a
buffer twice the last-level cache, so weights come from memory as in a real
forward pass); CUDA events on a GPU, ``perf_counter`` on CPU.  A point takes at
least ``repeats`` samples and more, up to ``max_repeats`` or its time budget,
until the distribution-free 95% confidence interval of its median is within
+-3% (``rel_ci``); the median is the table value and every sample is kept.
Points that never get there make the run refuse to write the profile (unless
``--force``), and make ``--check`` say "machine too noisy to judge" instead of
reporting the load as prediction error.

A leave-out split (interior M values and prompt lengths, decode points between
the grid points, and the model's shapes at twice the largest TP, which the
tables never see) is measured too, kept out of the tables and the fit, and
predicted through :class:`pdsim.devices.DeviceProfile` exactly as a simulation
would; the per-op median and p90 absolute percentage error are printed and
stored under ``fitted.holdout_error``.  ``--check PROFILE`` re-measures that
split on the current machine and prints the same table.

torch is imported lazily: pdsim itself never needs it.
"""
from __future__ import annotations

import argparse
import datetime as _dt
import math
import os
import platform
import socket
import statistics
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import yaml

from .errors import ConfigError

TORCH_HINT = "pip install torch==2.13.0"
DTYPE = "bf16"


# --- plans ---------------------------------------------------------------------------
def _geo(lo: int, hi: int, per_octave: int = 2) -> list[int]:
    """Integers on a log grid from lo to hi (both included), ``per_octave`` points per doubling."""
    n = round(math.log2(hi / lo) * per_octave)
    return sorted({int(round(lo * 2 ** (i / per_octave))) for i in range(n + 1)} | {hi})


@dataclass
class Plan:
    gemm_m: list[int]
    prefill_seq: list[int]
    decode_batch: list[int]
    decode_context: list[int]
    copy_bytes: list[int]
    repeats: int = 5                  # samples at least (fewer, >= 3, only when one call outlasts the budget)
    warmup: int = 1
    point_budget_s: float = 1.5       # stop adding samples to a point after this much time
    max_repeats: int = 40             # samples at most, while the median's CI is wider than +-rel_ci
    rel_ci: float = 0.03              # a point is stable when its median's 95% CI is within +-3%
    unseen_m: int = 3                 # M values of the unseen-shape holdout (model at 2 x max tp)
    holdout_every: int = 3            # every 3rd interior grid point is held out

    @staticmethod
    def for_device(device: str, quick: bool) -> "Plan":
        if device == "cuda":
            if quick:
                return Plan(_geo(1, 4096, 1), _geo(256, 8192, 1), [1, 4, 16, 64], [256, 1024, 4096, 16384],
                            [2 ** i for i in (20, 24, 28)], repeats=10, warmup=3)
            return Plan(_geo(1, 16384), _geo(128, 32768), _geo(1, 128, 1), _geo(128, 16384, 1),
                        [2 ** i for i in range(20, 31, 2)], repeats=20, warmup=5)
        if quick:
            return Plan(_geo(1, 64), [64, 128, 256, 512, 1024], [1, 2, 4, 8], [256, 512, 1024, 2048],
                        [2 ** 20, 2 ** 24], repeats=3, warmup=1, point_budget_s=0.3, unseen_m=2)
        return Plan(_geo(1, 512), _geo(64, 4096), _geo(1, 32, 1), _geo(128, 4096, 1),
                    [2 ** i for i in (20, 22, 24, 26, 28)], repeats=5, warmup=1)


def _split(grid: list[int], every: int) -> tuple[list[int], list[int]]:
    """(kept, held out): every ``every``-th interior point is held out; the ends always stay."""
    keep, held = [], []
    for i, v in enumerate(grid):
        (held if 0 < i < len(grid) - 1 and i % every == 1 else keep).append(v)
    return keep, held


def _mids(grid: list[int]) -> list[int]:
    """Rounded geometric midpoints of consecutive grid values that are not grid values themselves."""
    out = set()
    for a, b in zip(grid, grid[1:]):
        m = int(round(math.sqrt(a * b)))
        if a < m < b:
            out.add(m)
    return sorted(out)


# --- torch, lazily -----------------------------------------------------------------------
def _torch(device: str):
    try:
        import torch
    except ImportError:
        raise ConfigError(f"calibration needs torch; install it with: {TORCH_HINT}", key="calibrate") from None
    if device == "cuda" and not torch.cuda.is_available():
        raise ConfigError(f"no CUDA GPU is visible to torch {torch.__version__} (torch.cuda.is_available() is "
                          f"False, built with CUDA {torch.version.cuda}); run on a GPU machine or use --device cpu",
                          key="--device", value="cuda")
    return torch


def _cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _busy_cores(window_s: float = 0.5) -> float | None:
    """CPU cores busy with other work just now (from /proc/stat; None where there is none)."""
    def sample():
        with open("/proc/stat") as f:
            v = [int(x) for x in f.readline().split()[1:]]
        return sum(v[:3]) + sum(v[5:8]), v[3] + v[4]
    try:
        (b0, i0), _ = sample(), time.sleep(window_s)
        b1, i1 = sample()
    except (OSError, ValueError, IndexError):
        return None
    busy, idle = b1 - b0, i1 - i0
    return round((os.cpu_count() or 1) * busy / max(busy + idle, 1), 2)


def _Progress(total: int, enabled: bool):
    """The measurement's progress: a bar on a terminal, a line every 30 s in a log (pdsim.progress)."""
    from .progress import Bar
    return Bar(total, "calibrate", unit="shapes", enabled=enabled)


class _Bench:
    """Timing harness: warm-up, flush, synchronised samples (CUDA events or perf_counter)."""

    def __init__(self, torch, device: str, plan: Plan, timer=None):
        self.torch, self.device, self.plan = torch, device, plan
        self.timer = timer or _default_timer      # (bench, fn) -> seconds of one call; tests inject noise
        self.noise: list[float] = []              # the median CI half-width of every point measured
        self.dev = torch.device(device)
        self.dtype = torch.bfloat16
        llc = 64 << 20 if device == "cpu" else 128 << 20
        self._flush = torch.empty(2 * llc // 4, dtype=torch.float32, device=self.dev)
        self._seed = torch.randn(1 << 16, dtype=self.dtype, device=self.dev) * 0.05

    def sync(self):
        if self.device == "cuda":
            self.torch.cuda.synchronize()

    def rand(self, numel: int):
        """A bf16 buffer of small pseudo-random values, filled at copy speed (normal_ is slow on CPU)."""
        c = self._seed.numel()
        buf = self.torch.empty(((numel + c - 1) // c) * c, dtype=self.dtype, device=self.dev)
        buf.view(-1, c).copy_(self._seed.expand(buf.numel() // c, c))
        return buf[:numel]

    def one(self, fn) -> float:
        """Seconds of one call after a cache flush (CUDA events on a GPU, perf_counter on CPU)."""
        self._flush.zero_()
        if self.device == "cuda":
            a, b = self.torch.cuda.Event(enable_timing=True), self.torch.cuda.Event(enable_timing=True)
            a.record()
            fn()
            b.record()
            b.synchronize()
            return a.elapsed_time(b) / 1e3
        s = time.perf_counter()
        fn()
        return time.perf_counter() - s

    def time(self, fn) -> list[float]:
        p = self.plan
        for _ in range(p.warmup):
            fn()
        self.sync()
        samples, ci = sample_until_stable(lambda: self.timer(self, fn), p.repeats, p.max_repeats,
                                          p.point_budget_s, p.rel_ci)
        self.noise.append(ci)
        return samples


def median_ci(samples: list[float], z: float = 1.96) -> tuple[float, float]:
    """Distribution-free ~95% confidence interval of the median: the order statistics at ranks
    n/2 -+ z sqrt(n)/2 (binomial, normal approximation); the whole range when n is small."""
    x = sorted(samples)
    n = len(x)
    half = z * math.sqrt(n) / 2.0
    lo = max(int(math.floor(n / 2.0 - half)), 1)
    hi = min(int(math.ceil(1 + n / 2.0 + half)), n)
    return x[lo - 1], x[hi - 1]


def ci_rel(samples: list[float]) -> float:
    """Half-width of the median's CI relative to the median (the larger side)."""
    med = statistics.median(samples)
    lo, hi = median_ci(samples)
    return max(med - lo, hi - med) / med if med > 0 else math.inf


def sample_until_stable(measure, min_n: int, max_n: int, budget_s: float, rel: float = 0.03,
                        clock=time.perf_counter) -> tuple[list[float], float]:
    """Call ``measure()`` (seconds of one run) until the median's CI is within +-``rel``, or
    ``max_n`` samples, or ``budget_s`` of wall time; at least ``min_n`` samples (at least
    min(min_n, 3) when a single call outlasts the budget).  Returns (samples, CI half-width)."""
    t0 = clock()
    out: list[float] = []
    floor_n = min(min_n, 3)
    while True:
        out.append(measure())
        n, spent = len(out), clock() - t0
        if n >= max(min_n, 2) and ci_rel(out) <= rel:
            break
        if n >= max_n or (spent >= budget_s and n >= (min_n if spent / n * min_n <= budget_s else floor_n)):
            break
    return out, (ci_rel(out) if len(out) > 1 else math.inf)


def noise_summary(cis: list[float], rel: float) -> dict:
    """How many points reached a median CI within +-rel, and the spread of the CIs."""
    ok = [c for c in cis if c <= rel]
    finite = sorted(c for c in cis if math.isfinite(c))
    return {"points": len(cis), "stable": len(ok), "rel_ci_target": rel,
            "median_rel_ci": _rnd(statistics.median(finite)) if finite else None,
            "worst_rel_ci": _rnd(finite[-1]) if finite else None}


def _noise_line(noise: dict) -> str:
    return (f"noise: {noise['stable']} of {noise['points']} points reached a median 95% CI within "
            f"+-{noise['rel_ci_target']:.0%} (median +-{100 * (noise['median_rel_ci'] or 0):.1f}%, worst "
            f"+-{100 * (noise['worst_rel_ci'] or 0):.1f}%)")


def _default_timer(bench, fn) -> float:
    return bench.one(fn)


def _rnd(x: float) -> float:
    return float(f"{x:.5g}")


def _med(samples: list[float]) -> float:
    return statistics.median(samples)


# --- shapes -----------------------------------------------------------------------------
def linear_shapes(model, tp: int) -> list[tuple[str, int, int]]:
    """(name, N, K) of each sharded linear layer plus the LM head, as RooflineCost builds them."""
    from .costmodel import RooflineCost
    from .devices import get_device
    cm = RooflineCost(model, get_device("cpu-epyc-2c"), tp)
    return [*((name, n, k) for name, n, k, _ in cm.linears), cm.lm_head]


def attn_heads(model, tp: int) -> tuple[int, int, int]:
    return model.heads // tp, max(1, model.kv_heads // tp), model.head_dim


# --- measuring ----------------------------------------------------------------------------
class _Measurer:
    def __init__(self, bench: _Bench, peak_flops: float, peak_bw: float, out, progress: _Progress):
        self.b, self.peak, self.bw, self.out, self.prog = bench, peak_flops, peak_bw, out, progress
        self.torch = bench.torch

    def row(self, op: str, shape: str, t: float, flops: float, bytes_: float):
        self.prog.clear()
        tf, gb = flops / t / 1e12, bytes_ / t / 1e9
        print(f"{op:16s} {shape:>26s} {t * 1e6:11.1f} {tf:9.3f} {100 * flops / t / self.peak:6.1f}% "
              f"{gb:9.1f} {100 * bytes_ / t / self.bw:6.1f}%", file=self.out)

    def header(self):
        print(f"{'op':16s} {'shape':>26s} {'time_us':>11s} {'TFLOP/s':>9s} {'%peak':>7s} {'GB/s':>9s} {'%bw':>7s}",
              file=self.out)

    def gemm(self, op: str, n: int, k: int, ms: list[int]) -> dict:
        torch, b = self.torch, self.b
        w = b.rand(n * k).view(n, k)
        wT = w.t()
        a_buf = b.rand(max(ms) * k)
        o_buf = torch.empty(max(ms) * n, dtype=b.dtype, device=b.dev)
        times, samples = [], []
        for m in ms:
            a, o = a_buf[:m * k].view(m, k), o_buf[:m * n].view(m, n)
            s = b.time(lambda: torch.mm(a, wT, out=o))
            t = _med(s)
            times.append(_rnd(t))
            samples.append([_rnd(x) for x in s])
            self.row(op, f"M={m} N={n} K={k}", t, 2.0 * m * n * k, n * k * 2.0 + (m * k + m * n) * 2.0)
            self.prog.update(1, f"gemm {op} M={m}")
        del w, wT, a_buf, o_buf
        return {"n": n, "k": k, "m": list(ms), "time_s": times, "samples_s": samples}

    def prefill(self, qh: int, kvh: int, d: int, seqs: list[int], op="attn_prefill") -> dict:
        torch, b = self.torch, self.b
        F = torch.nn.functional
        times, samples = [], []
        for s in seqs:
            q = b.rand(qh * s * d).view(1, qh, s, d)
            k = b.rand(kvh * s * d).view(1, kvh, s, d).repeat_interleave(qh // kvh, dim=1)
            v = k.clone()
            st = b.time(lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True))
            t = _med(st)
            times.append(_rnd(t))
            samples.append([_rnd(x) for x in st])
            fl = 4.0 * qh * d * s * s / 2.0
            by = s * 2 * kvh * d * 2.0 + s * (qh + 2 * kvh) * d * 2.0
            self.row(op, f"seq={s} h={qh}/{kvh} d={d}", t, fl, by)
            self.prog.update(1, f"prefill attn seq={s}")
            del q, k, v
        return {"q_heads": qh, "kv_heads": kvh, "head_dim": d, "seq_len": list(seqs), "time_s": times,
                "samples_s": samples}

    def decode(self, qh: int, kvh: int, d: int, batches: list[int], contexts: list[int], op="attn_decode") -> dict:
        torch, b = self.torch, self.b
        F = torch.nn.functional
        g = qh // kvh
        grid, samples = [], []
        for bs in batches:
            row, srow = [], []
            for c in contexts:
                # GQA: the g query heads of one KV head ride as g query rows against that head's KV, read once
                q = b.rand(bs * kvh * g * d).view(bs, kvh, g, d)
                k = b.rand(bs * kvh * c * d).view(bs, kvh, c, d)
                v = b.rand(bs * kvh * c * d).view(bs, kvh, c, d)
                st = b.time(lambda: F.scaled_dot_product_attention(q, k, v))
                t = _med(st)
                row.append(_rnd(t))
                srow.append([_rnd(x) for x in st])
                fl = 4.0 * qh * d * bs * c
                by = bs * c * 2 * kvh * d * 2.0 + bs * (qh + 2 * kvh) * d * 2.0
                self.row(op, f"b={bs} ctx={c} h={qh}/{kvh}", t, fl, by)
                self.prog.update(1, f"decode attn b={bs} ctx={c}")
                del q, k, v
            grid.append(row)
            samples.append(srow)
        return {"q_heads": qh, "kv_heads": kvh, "head_dim": d, "batch": list(batches), "context": list(contexts),
                "time_s": grid, "samples_s": samples}

    def transfer(self, kind: str, sizes: list[int]) -> dict:
        torch, b = self.torch, self.b
        times, samples = [], []
        for nbytes in sizes:
            n = nbytes // 2
            if kind == "device_copy":
                src, dst = b.rand(n), torch.empty(n, dtype=b.dtype, device=b.dev)
            elif kind == "h2d":
                src = torch.empty(n, dtype=b.dtype, pin_memory=True).fill_(1)
                dst = torch.empty(n, dtype=b.dtype, device=b.dev)
            else:
                src = b.rand(n)
                dst = torch.empty(n, dtype=b.dtype, pin_memory=True)
            st = b.time(lambda: dst.copy_(src, non_blocking=kind != "device_copy"))
            t = _med(st)
            times.append(_rnd(t))
            samples.append([_rnd(x) for x in st])
            moved = 2.0 * nbytes if kind == "device_copy" else float(nbytes)   # a device copy reads and writes
            self.row(kind, f"{nbytes / 2 ** 20:.0f} MiB", t, 0.0, moved)
            self.prog.update(1, f"{kind} {nbytes >> 20} MiB")
            del src, dst
        return {"kind": kind, "bytes": [float(x) for x in sizes], "time_s": times, "samples_s": samples}


# --- prediction and error -----------------------------------------------------------------
def holdout_errors(profile, holdout) -> dict:
    """Per-op APE of the profile's predictions (tables + fitted roofline) on a holdout section."""
    from .fitting import ape, summarize
    errs: dict[str, list[float]] = {}

    def add(op, pred, meas):
        errs.setdefault(op, []).extend(ape([pred], [meas]).tolist())

    for t in holdout.gemm:
        for m, meas in zip(t.m, t.time_s):
            add(t.op, profile.gemm_time(m, t.n, t.k, 2.0, 2.0, t.dtype), meas)
    for t in holdout.attention_prefill:
        for s, meas in zip(t.seq_len, t.time_s):
            fl = 4.0 * t.q_heads * t.head_dim * s * s / 2.0
            by = s * 2 * t.kv_heads * t.head_dim * 2.0 + s * (t.q_heads + 2 * t.kv_heads) * t.head_dim * 2.0
            add("attn_prefill", profile.attention_time(fl, by, True, t.dtype,
                                                       (s, s * s / 2.0, s, 1, t.q_heads, t.kv_heads, t.head_dim)), meas)
    for t in holdout.attention_decode:
        for bs, row in zip(t.batch, t.time_s):
            for c, meas in zip(t.context, row):
                fl = 4.0 * t.q_heads * t.head_dim * bs * c
                by = bs * c * 2 * t.kv_heads * t.head_dim * 2.0 + bs * (t.q_heads + 2 * t.kv_heads) * t.head_dim * 2.0
                add("attn_decode", profile.attention_time(fl, by, False, t.dtype,
                                                          (bs, float(bs * c), bs * c, bs, t.q_heads, t.kv_heads,
                                                           t.head_dim)), meas)
    out = {op: summarize(v) for op, v in errs.items()}
    allv = [x for v in errs.values() for x in v]
    out["all"] = summarize(allv)
    return out


def print_errors(errors: dict, title: str, out=None) -> None:
    print(f"\n{title}", file=out)
    print(f"  {'op':24s} {'n':>4s} {'median APE':>11s} {'p90 APE':>9s}", file=out)
    for op, s in errors.items():
        if isinstance(s, dict) and s.get("n"):
            print(f"  {op:24s} {s['n']:4d} {s['median_ape']:10.1f}% {s['p90_ape']:8.1f}%", file=out)


# --- the run ------------------------------------------------------------------------------------
def default_base(device: str, torch=None) -> str:
    if device == "cpu":
        return "cpu-epyc-2c"
    name = torch.cuda.get_device_name(0) if torch is not None else ""
    for key, preset in (("H200", "h200"), ("H100", "h100-sxm"), ("A100", "a100-80gb-sxm"), ("L40S", "l40s")):
        if key in name:
            return preset
    raise ConfigError(f"no datasheet profile for GPU {name!r}; give --base PRESET_OR_FILE for its peaks, price and "
                      "interconnect", key="--base")


def run(device: str = "cpu", model="llama-3.1-8b", tp: list[int] | None = None, quick: bool = False,
        out: str | Path | None = None, base: str | None = None, plan: Plan | None = None,
        progress: bool = True, stream=None, name: str | None = None, force: bool = False, timer=None) -> dict:
    """Measure, fit, print the roofline and holdout tables; write the profile to ``out`` if given.
    Returns the profile as a dict (validated by :class:`pdsim.devices.ProfileSpec`).

    Every point is sampled until its median's 95% CI is within +-``plan.rel_ci`` (or its budget runs
    out); a profile with points that never got there is not written unless ``force``: on a busy
    machine the tables would hold the load, not the kernels.  ``timer(bench, fn)`` replaces the
    timing of one call (tests inject noise)."""
    from . import fitting
    from .devices import DeviceProfile, HoldoutSpec, ProfileSpec, get_device
    from .models import ModelShape, get_model

    stream = stream or sys.stdout
    if device not in ("cpu", "cuda"):
        raise ConfigError("must be cpu or cuda", key="--device", value=device)
    torch = _torch(device)
    wall0 = time.perf_counter()
    load0 = round(os.getloadavg()[0], 2) if hasattr(os, "getloadavg") else None
    shape = model if isinstance(model, ModelShape) else get_model(model, "--model")
    tps = list(tp or [1])
    for t in tps:
        shape.validate_tp(t, "--tp")
    base_prof = get_device(base or default_base(device, torch), "--base")
    plan = plan or Plan.for_device(device, quick)
    peak0, bw0 = base_prof.peak_flops(DTYPE), base_prof.mem_bw_Bps

    # the work list
    m_keep, m_held = _split(plan.gemm_m, plan.holdout_every)
    s_keep, s_held = _split(plan.prefill_seq, plan.holdout_every)
    db_mid, dc_mid = _mids(plan.decode_batch)[::2], _mids(plan.decode_context)[::2]
    unseen_tp = 2 * max(tps)
    unseen: list[tuple[str, int, int]] = []
    if shape.heads % unseen_tp == 0:
        seen = {(n, k) for t in tps for _, n, k in linear_shapes(shape, t)}
        unseen = [("unseen_gemm", n, k) for _, n, k in linear_shapes(shape, unseen_tp) if (n, k) not in seen]
    unseen_m = [m_held[i] for i in sorted({round(j * (len(m_held) - 1) / max(plan.unseen_m - 1, 1))
                                           for j in range(plan.unseen_m)})] if m_held else []
    n_lin = len(linear_shapes(shape, tps[0]))
    total = (len(tps) * (n_lin * len(plan.gemm_m) + len(plan.prefill_seq)
                         + len(plan.decode_batch) * len(plan.decode_context) + len(db_mid) * len(dc_mid))
             + len(unseen) * len(unseen_m) + len(plan.copy_bytes) * (3 if device == "cuda" else 1))
    prog = _Progress(total, progress)
    bench = _Bench(torch, device, plan, timer)
    meas = _Measurer(bench, peak0, bw0, stream, prog)
    busy0 = _busy_cores() if device == "cpu" else None
    if busy0 is not None and busy0 > 0.5:
        print(f"pdsim calibrate: warning: {busy0:.1f} CPU cores busy before starting: other processes share the "
              "CPU and will inflate the timings", file=sys.stderr)
    host = socket.gethostname()
    hw = torch.cuda.get_device_name(0) if device == "cuda" else _cpu_name()
    print(f"pdsim calibrate: {hw} ({device}), {shape.name} tp={tps}, torch {torch.__version__}, "
          f"{torch.get_num_threads()} threads; peaks from {base_prof.name}: {peak0 / 1e12:.4g} TFLOP/s {DTYPE}, "
          f"{bw0 / 1e9:.4g} GB/s", file=stream)
    meas.header()

    gemm, gemm_hold, pre, pre_hold, dec, dec_hold, transfers = [], [], [], [], [], [], []
    for t in tps:
        for op, n, k in linear_shapes(shape, t):
            r = meas.gemm(op, n, k, plan.gemm_m)
            keep = [i for i, m in enumerate(r["m"]) if m in m_keep]
            held = [i for i, m in enumerate(r["m"]) if m in m_held]
            pick = lambda idx: {"op": op, "n": n, "k": k, "tp": t, "dtype": DTYPE, "m": [r["m"][i] for i in idx],
                                "time_s": [r["time_s"][i] for i in idx],
                                "samples_s": [r["samples_s"][i] for i in idx]}
            gemm.append(pick(keep))
            if held:
                gemm_hold.append(pick(held))
        qh, kvh, d = attn_heads(shape, t)
        r = meas.prefill(qh, kvh, d, plan.prefill_seq)
        for seqs, dest in ((s_keep, pre), (s_held, pre_hold)):
            idx = [i for i, s in enumerate(r["seq_len"]) if s in seqs]
            if idx:
                dest.append({**{x: r[x] for x in ("q_heads", "kv_heads", "head_dim")}, "tp": t, "dtype": DTYPE,
                             "seq_len": [r["seq_len"][i] for i in idx], "time_s": [r["time_s"][i] for i in idx],
                             "samples_s": [r["samples_s"][i] for i in idx]})
        dec.append({**meas.decode(qh, kvh, d, plan.decode_batch, plan.decode_context), "tp": t, "dtype": DTYPE})
        if db_mid and dc_mid:
            dec_hold.append({**meas.decode(qh, kvh, d, db_mid, dc_mid, "attn_decode(ho)"), "tp": t, "dtype": DTYPE})
    for op, n, k in unseen:
        r = meas.gemm(f"unseen@tp{unseen_tp}", n, k, unseen_m)
        gemm_hold.append({"op": op, "n": n, "k": k, "tp": unseen_tp, "dtype": DTYPE, **{x: r[x] for x in
                                                                                        ("m", "time_s", "samples_s")}})
    transfers.append(meas.transfer("device_copy", plan.copy_bytes))
    if device == "cuda":
        transfers.append(meas.transfer("h2d", plan.copy_bytes))
        transfers.append(meas.transfer("d2h", plan.copy_bytes))
    prog.close()
    n_gpu = torch.cuda.device_count() if device == "cuda" else 0
    ar_note = (f"all-reduce not measured: {n_gpu} GPU visible" if n_gpu <= 1 else
               f"all-reduce not measured: {n_gpu} GPUs visible but the multi-process torch.distributed "
               "benchmark is not implemented; interconnect and efficiency.allreduce are the datasheet's")
    print(ar_note, file=stream)

    # --- fit ----------------------------------------------------------------------
    M = [m for g in gemm for m in g["m"]]
    N = [g["n"] for g in gemm for _ in g["m"]]
    K = [g["k"] for g in gemm for _ in g["m"]]
    T = [x for g in gemm for x in g["time_s"]]
    fg = fitting.fit_gemm(M, N, K, T)
    ov = fg["overhead_s"]
    toks, work, kvr, qhs, kvhs, ds, tp_ = [], [], [], [], [], [], []
    for p in pre:
        for s, x in zip(p["seq_len"], p["time_s"]):
            toks.append(s); work.append(s * s / 2.0); kvr.append(s)
            qhs.append(p["q_heads"]); kvhs.append(p["kv_heads"]); ds.append(p["head_dim"]); tp_.append(x)
    fl, by = fitting.attention_flops_bytes(toks, work, kvr, qhs, kvhs, ds)
    # attention rates are capped at the GEMM-raised peaks: where overhead dominates they are not identifiable
    cap_f, cap_b = max(peak0, fg["compute_Fps"]), max(bw0, fg["bandwidth_Bps"])
    fp = fitting.fit_rate(fl, by, tp_, ov, B=fg["bandwidth_Bps"], C_max=cap_f)
    fl2, by2, td = [], [], []
    for p in dec:
        for bs, row in zip(p["batch"], p["time_s"]):
            for c, x in zip(p["context"], row):
                f_, b_ = fitting.attention_flops_bytes(bs, bs * c, bs * c, p["q_heads"], p["kv_heads"], p["head_dim"])
                fl2.append(float(f_)); by2.append(float(b_)); td.append(x)
    fd = fitting.fit_rate(fl2, by2, td, ov, C=0.5 * fp["compute_Fps"], B_max=cap_b)
    rates = {"gemm_C": fg["compute_Fps"], "gemm_B": fg["bandwidth_Bps"], "attn_prefill_C": fp["compute_Fps"],
             "attn_decode_B": fd["bandwidth_Bps"]}
    eff, peak, bw, notes = fitting.to_efficiency(rates, peak0, bw0)
    tr_fit = {}
    for tr in transfers:
        moved = [b * (2.0 if tr["kind"] == "device_copy" else 1.0) for b in tr["bytes"]]
        # the largest size streams through memory; smaller ones may sit in a cache
        tr_fit[f"{tr['kind']}_GBps"] = _rnd(moved[-1] / tr["time_s"][-1] / 1e9)

    b = base_prof.spec
    efficiency = {**b.efficiency.model_dump(), **{k: _rnd(v) for k, v in eff.items()},
                  "gemm_m_half": _rnd(fg["m_half"]), "kernel_overhead_us": _rnd(ov * 1e6)}
    # the fp8 constants (dense fp8_gemm_*, MoE grouped_fp8_*) say how much of the bf16 GEMM efficiency fp8 kernels
    # reach; this run times bf16 only, so they come from the base preset (fitted to NVIDIA's TRT-LLM tables of the
    # same architecture) rather than 1, which prices fp8 prefill ~1.35x too fast: said in the profile's notes
    carried = [k for k in ("fp8_gemm_compute", "fp8_gemm_memory", "fp8_gemm_overhead_us", "grouped_fp8_compute",
                           "grouped_fp8_memory", "grouped_fp8_overhead_us")
               if efficiency.get(k) not in (1.0, None)]
    carried_note = (f"not measured here, carried from {b.name}: " + ", ".join(f"{k} {efficiency[k]}" for k in carried)
                    if carried else None)
    peaks = dict(b.peak_tflops)
    if peak > peak0:   # efficiencies above are already relative to the raised peak
        for dt in {DTYPE, "fp16"} & set(peaks) | {DTYPE}:
            peaks[dt] = _rnd(peak / 1e12)
    profile = {
        "schema_version": 1,
        "name": name or f"{b.name}-measured",
        "kind": b.kind,
        "source": (f"measured by pdsim calibrate on {hw} ({host}, {device}) with torch {torch.__version__}, "
                   f"{shape.name} shapes at tp={tps}; peaks, memory size, interconnect and price from {b.name}"),
        "memory_GiB": b.memory_GiB,
        "memory_bandwidth_GBps": _rnd(bw / 1e9),
        "peak_tflops": peaks,
        "interconnect": b.interconnect.model_dump(),
        "price_per_hour_usd": b.price_per_hour_usd,
        "efficiency": efficiency,
        "measured": {"format": 1, "device": device, "model": shape.name, "tp": tps, "gemm": gemm,
                     "attention_prefill": pre, "attention_decode": dec, "transfers": transfers,
                     "holdout": {"gemm": gemm_hold, "attention_prefill": pre_hold, "attention_decode": dec_hold}},
        "fitted": {
            "method": "least squares in log-time, Nelder-Mead (pdsim.fitting)",
            "gemm": {"compute_TFLOPs": _rnd(fg["compute_Fps"] / 1e12), "bandwidth_GBps": _rnd(fg["bandwidth_Bps"] / 1e9),
                     "m_half": _rnd(fg["m_half"]), "kernel_overhead_us": _rnd(ov * 1e6),
                     "rms_log_error": _rnd(fg["rms_log_error"]), "points": fg["points"]},
            "attention_prefill": {"compute_TFLOPs": _rnd(fp["compute_Fps"] / 1e12),
                                  "rms_log_error": _rnd(fp["rms_log_error"]), "points": fp["points"]},
            "attention_decode": {"bandwidth_GBps": _rnd(fd["bandwidth_Bps"] / 1e9),
                                 "rms_log_error": _rnd(fd["rms_log_error"]), "points": fd["points"]},
            **tr_fit,
            "notes": notes + [ar_note] + ([carried_note] if carried_note else []),
        },
        "meta": {"torch": str(torch.__version__), "cuda": None if torch.version.cuda is None else str(torch.version.cuda), "date": _dt.datetime.now(
            _dt.timezone.utc).isoformat(timespec="seconds"), "host": host, "hardware": hw,
            "threads": torch.get_num_threads(), "python": platform.python_version(),
            "plan": asdict(plan), "quick": quick, "loadavg_1min_at_start": load0,
            "cpu_busy_cores_at_start": busy0},
    }
    noise = noise_summary(bench.noise, plan.rel_ci)
    profile["fitted"]["noise"] = noise
    print(_noise_line(noise), file=stream)
    spec = ProfileSpec.model_validate(profile)
    errs = holdout_errors(DeviceProfile(spec), spec.measured.holdout)
    print_errors(errs, "holdout (not in the tables or the fit): prediction vs measured", stream)
    print(f"fitted: gemm {fg['compute_Fps'] / 1e12:.3g} TFLOP/s, {fg['bandwidth_Bps'] / 1e9:.3g} GB/s, "
          f"m_half {fg['m_half']:.3g}, overhead {ov * 1e6:.3g} us; attention prefill {fp['compute_Fps'] / 1e12:.3g} "
          f"TFLOP/s, decode {fd['bandwidth_Bps'] / 1e9:.3g} GB/s" + "".join(f"; {n}" for n in notes), file=stream)
    profile["fitted"]["holdout_error"] = errs
    # how far the datasheet profile is from every point measured here (tables and holdout), op by op
    allpts = HoldoutSpec.model_validate({"gemm": spec.measured.gemm + spec.measured.holdout.gemm,
                                         "attention_prefill": spec.measured.attention_prefill
                                         + spec.measured.holdout.attention_prefill,
                                         "attention_decode": spec.measured.attention_decode
                                         + spec.measured.holdout.attention_decode})
    ds_errs = holdout_errors(base_prof, allpts)
    print_errors(ds_errs, f"datasheet profile {b.name} vs every point measured here", stream)
    profile["fitted"]["datasheet_error"] = {"profile": b.name, **ds_errs}
    profile["meta"]["wall_s"] = round(time.perf_counter() - wall0, 1)
    ProfileSpec.model_validate(profile)
    if out and noise["stable"] < noise["points"] and not force:
        raise ConfigError(f"{noise['points'] - noise['stable']} of {noise['points']} points never reached a median "
                          f"within +-{plan.rel_ci:.0%} (worst +-{noise['worst_rel_ci']:.0%}): the machine is too noisy, "
                          "profile not written (rerun on a quiet machine, or --force to write it anyway)",
                          key="--out", value=str(out))
    if out:
        write_profile(profile, out)
        print(f"wrote {out} in {profile['meta']['wall_s']:.1f} s", file=sys.stderr)
    return profile


def write_profile(profile: dict, out: str | Path) -> None:
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    head = ("# Measured device profile written by `pdsim calibrate` (pdsim/calibrate.py).\n"
            "# measured: raw tables (median time_s, every sample in samples_s); fitted: the roofline fit;\n"
            "# efficiency: the fitted values the cost model uses outside the tables.\n")
    out.write_text(head + yaml.safe_dump(profile, sort_keys=False, default_flow_style=None, width=150))


def check(path: str | Path, plan: Plan | None = None, progress: bool = True, stream=None, timer=None,
          min_stable: float = 0.8) -> dict:
    """Re-measure the holdout shapes of a measured profile here and print the prediction error per op.

    When fewer than ``min_stable`` of the re-measured points reach a median within +-``plan.rel_ci``,
    the machine is too noisy for the errors to mean anything: the result's ``verdict`` says so and
    no error table is printed as a judgement."""
    from .devices import HoldoutSpec, load_profile_file
    stream = stream or sys.stdout
    prof = load_profile_file(path)
    ms = prof.spec.measured
    if ms is None or ms.holdout is None:
        raise ConfigError("not a measured profile with a holdout section (write one with pdsim calibrate)",
                          file=str(path), key="measured.holdout")
    torch = _torch(ms.device)
    meta_plan = (prof.spec.meta or {}).get("plan") or {}
    plan = plan or Plan(**{k: v for k, v in meta_plan.items() if k in Plan.__dataclass_fields__}) \
        if meta_plan else plan or Plan.for_device(ms.device, True)
    h = ms.holdout
    total = (sum(len(t.m) for t in h.gemm) + sum(len(t.seq_len) for t in h.attention_prefill)
             + sum(len(t.batch) * len(t.context) for t in h.attention_decode))
    prog = _Progress(total, progress)
    bench = _Bench(torch, ms.device, plan, timer)
    meas = _Measurer(bench, prof.peak_flops(DTYPE), prof.mem_bw_Bps, stream, prog)
    print(f"pdsim calibrate --check {path}: re-measuring {total} held-out points on "
          f"{torch.cuda.get_device_name(0) if ms.device == 'cuda' else _cpu_name()}", file=stream)
    meas.header()
    new = {"gemm": [], "attention_prefill": [], "attention_decode": []}
    for t in h.gemm:
        r = meas.gemm(t.op, t.n, t.k, t.m)
        new["gemm"].append({"op": t.op, "n": t.n, "k": t.k, "tp": t.tp, "dtype": t.dtype, "m": r["m"],
                            "time_s": r["time_s"]})
    for t in h.attention_prefill:
        r = meas.prefill(t.q_heads, t.kv_heads, t.head_dim, t.seq_len)
        new["attention_prefill"].append({**{x: r[x] for x in ("q_heads", "kv_heads", "head_dim", "seq_len", "time_s")},
                                         "tp": t.tp, "dtype": t.dtype})
    for t in h.attention_decode:
        r = meas.decode(t.q_heads, t.kv_heads, t.head_dim, t.batch, t.context)
        new["attention_decode"].append({**{x: r[x] for x in ("q_heads", "kv_heads", "head_dim", "batch", "context",
                                                             "time_s")}, "tp": t.tp, "dtype": t.dtype})
    prog.close()
    errs = holdout_errors(prof, HoldoutSpec.model_validate(new))
    noise = noise_summary(bench.noise, plan.rel_ci)
    errs["noise"] = noise
    print(_noise_line(noise), file=stream)
    if noise["stable"] < min_stable * noise["points"]:
        errs["verdict"] = "machine too noisy to judge"
        print(f"--check {path}: machine too noisy to judge: only {noise['stable']} of {noise['points']} re-measured "
              f"points reached a median within +-{plan.rel_ci:.0%}; the prediction errors would measure the load, "
              "not the profile (for the record, the median error over all points: "
              f"{errs['all']['median_ape']}%)", file=stream)
        return errs
    errs["verdict"] = "judged"
    print_errors(errs, f"--check {path}: prediction of the profile vs re-measured held-out shapes", stream)
    return errs


# --- CLI ----------------------------------------------------------------------------------------
def _tp_list(text: str) -> list[int]:
    try:
        vals = [int(x) for x in text.replace(",", " ").split()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a list of integers: {text!r}") from None
    if not vals or any(v < 1 for v in vals):
        raise argparse.ArgumentTypeError(f"TP degrees must be >= 1: {text!r}")
    return vals


def cmd_calibrate(args) -> int:
    if args.from_benchmark or args.silicon:
        return cmd_from_benchmark(args)
    for flag, val in (("--gpu", args.gpu), ("--engine", args.engine), ("--holdout", args.holdout),
                      ("--split-by", args.split_by), ("--step-overhead-fit", args.step_overhead_fit),
                      ("--keep-beyond-ceiling", args.keep_beyond_ceiling or None)):
        if val is not None:
            raise ConfigError("only with --from-benchmark or --silicon", key=flag, value=val)
    if args.check:
        errs = check(args.check, progress=not args.quiet)
        return 3 if errs.get("verdict") == "machine too noisy to judge" else 0
    tps = [t for group in (args.tp or [[1]]) for t in group]
    run(device=args.device, model=args.model, tp=tps, quick=args.quick, out=args.out, base=args.base,
        progress=not args.quiet, force=args.force)
    return 0


def cmd_from_benchmark(args) -> int:
    """Fit engine step overheads to measured serving runs (pdsim/engine_fit.py)."""
    from .engine_fit import calibrate_from_benchmark, print_result, write_result
    from .validate import check_defaults, parse_profiles, silicon_sample_path
    tps = [t for group in (args.tp or []) for t in group]
    if len(tps) > 1:
        raise ConfigError("with --from-benchmark: one TP degree, the one of JSON results that do not give it",
                          key="--tp", value=",".join(map(str, tps)))
    check_defaults(args.gpu, tps[0] if tps else None, args.engine, ("--gpu", "--tp", "--engine"))  # before reading
    files = list(args.from_benchmark or [])
    if args.silicon:
        files.append(str(silicon_sample_path()))
    defaults = {k: v for k, v in (("device", args.gpu), ("tp", tps[0] if tps else None), ("engine", args.engine))
                if v}
    profiles = parse_profiles(args.profile, args.profiles) if (args.profile or args.profiles) else None
    out = args.out or "reports/calibrate/engines-fitted.yaml"
    if Path(out).is_dir():      # said before minutes of fitting, not after
        raise ConfigError("is a folder; give a file path (e.g. engines-fitted.yaml)", key="--out", value=str(out))
    # written below only when an engine was fitted: a file with `engines: {}` is no calibration
    res = calibrate_from_benchmark(files, defaults, None, holdout=0.5 if args.holdout is None else args.holdout,
                                   split_by=args.split_by or "row", rounds=args.rounds,
                                   fit=args.step_overhead_fit or "both",
                                   requests_per_client=args.requests_per_client, sample=args.sample, seed=args.seed,
                                   profiles=profiles, progress=not args.quiet,
                                   keep_beyond_ceiling=args.keep_beyond_ceiling)
    print_result(res)
    if not res["engines"]:      # an error, so never quiet: why nothing was fitted, on one line
        why = [f"{eng}: {w}" for eng, w in res["not_fitted"].items()]
        skipped = ", ".join(f"{k}: {n}" for k, n in sorted(res["skipped_by_reason"].items()))
        print(f"pdsim calibrate: nothing fitted, {out} not written: "
              + "; ".join(why + ([f"rows skipped by reason {{{skipped}}}"] if skipped else []) or ["no rows"])
              + (" (pdsim validate lists each skipped row in skipped.csv)" if skipped else ""), file=sys.stderr)
        return 1
    write_result(res, out)
    print(f"wrote {out}", file=sys.stderr)
    return 0


def add_parser(sub) -> None:
    c = sub.add_parser("calibrate", help="measure this machine with torch and write a measured device profile",
                       description="Time the GEMMs, attention and copies of a model's shapes with torch, fit the "
                                   "roofline, and write a measured profile (needs torch: " + TORCH_HINT + ").")
    c.add_argument("--device", choices=["cpu", "cuda"], default="cpu",
                   help="where to time the kernels: this CPU (default) or the first CUDA GPU")
    c.add_argument("--model", default="llama-3.1-8b", help="model whose layer shapes are measured")
    c.add_argument("--tp", type=_tp_list, action="append", metavar="N[,N...]",
                   help="TP degrees whose sharded shapes are measured (default 1); repeatable or comma-separated")
    c.add_argument("--quick", action="store_true", help="a small grid and few repeats (well under a minute on CPU)")
    c.add_argument("--out", metavar="PATH", help="write the profile here (YAML)")
    c.add_argument("--check", metavar="PROFILE", help="re-measure PROFILE's held-out shapes and print the error")
    c.add_argument("--base", metavar="PRESET_OR_FILE",
                   help="datasheet profile for peaks, memory, price and interconnect (default: cpu-epyc-2c on cpu, "
                        "the preset matching the GPU name on cuda)")
    c.add_argument("--quiet", action="store_true", help="no progress bar")
    c.add_argument("--force", action="store_true",
                   help="write the profile even when some points never reached a median within +-3%% (noisy machine)")
    b = c.add_argument_group("engine calibration from measured serving runs (no torch needed)")
    b.add_argument("--from-benchmark", nargs="+", metavar="MEASURED",
                   help="fit each engine's step overhead (base, per running request, per token; microseconds) to "
                        "measured runs: aiconfigurator silicon CSV, `vllm bench serve` JSON, GenAI-Perf JSON; "
                        "writes --out (YAML, default reports/calibrate/engines-fitted.yaml)")
    b.add_argument("--silicon", action="store_true",
                   help="add the silicon sample of an installed aiconfigurator-core to --from-benchmark")
    b.add_argument("--gpu", metavar="DEVICE", help="GPU of JSON results that do not name one (e.g. h100-sxm)")
    b.add_argument("--engine", help="engine of JSON results that do not name one (vllm-v1, vllm-v0, sglang, trtllm)")
    b.add_argument("--holdout", type=float, metavar="FRACTION",
                   help="share of the rows held out of the fit and used to report its error (default 0.5)")
    b.add_argument("--split-by", choices=["row", "model"],
                   help="hold out by a hash of the row id (default) or of the model name (whole models held out)")
    b.add_argument("--step-overhead-fit", choices=["both", "tpot"],
                   help="both (default): base and per-request from TPOT, per-token from TTFT; tpot: per-token "
                        "stays the preset's")
    b.add_argument("--rounds", type=int, default=2, help="alternations of the TTFT and TPOT fits (default 2)")
    b.add_argument("--requests-per-client", type=int, default=10,
                   help="closed-loop requests each client sends per row (default 10)")
    b.add_argument("--sample", type=int, metavar="ROWS", help="a seeded random sample of this many rows")
    b.add_argument("--seed", type=int, default=0, help="seed of --sample and of each row's request stream")
    b.add_argument("--profile", action="append", metavar="DEVICE=PATH",
                   help="price this GPU's rows with a profile file; repeatable")
    b.add_argument("--profiles", metavar="PATTERN",
                   help="price each GPU's rows with the profile whose file name starts with the GPU")
    b.add_argument("--keep-beyond-ceiling", action="store_true",
                   help="fit on rows served faster than pdsim's GEMM ceiling too (pdsim validate's "
                        "implied_gemm_util > 1; left out by default: an overhead cannot be negative)")
    c.set_defaults(fn=cmd_calibrate)
