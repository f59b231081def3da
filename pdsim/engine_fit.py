"""``pdsim calibrate --from-benchmark MEASURED``: fit an engine's per-step overhead to measured serving runs.

The measured files are the ones ``pdsim validate`` reads (the aiconfigurator silicon CSV, ``vllm bench
serve`` JSON, GenAI-Perf exports); every usable row becomes the same closed-loop run
(:func:`pdsim.validate.simulate_row`).  The rows are split once, by a stable hash, into a **fit** part
and a **held-out** part (``--holdout``: the held-out share; ``--split-by row | model``: hash of the row
id, or of the model name so that whole models stay out of the fit); nothing is fitted on the held-out
rows, and the error reported for them is the calibration's honest error.

What is fitted, per engine found in the fit rows (at least ``MIN_ROWS``), starting from the preset:

- ``base_us`` and ``per_seq_us`` (the step overhead's constant and per running request): every decode
  step pays them, so the TPOT residual (measured - simulated) of a row is about ``d_base + d_per_seq x
  concurrency``; a weighted least-squares step (:func:`pdsim.validate.fit_step_overhead`, relative errors
  weigh equally) moves both, each kept >= 0.
- ``per_token_us`` (per token in the step): it weighs on steps with many tokens, i.e. on prefill, so it
  is chosen by a bounded golden-section search minimising the fit rows' mean TTFT APE (with base and
  per_seq held), then base and per_seq are refitted (a decode step's tokens are its requests, so
  per_token also moves TPOT).  ``--fit tpot`` leaves per_token at the preset's.

The loop runs ``rounds`` times.  Each fitted value is a **residual fit**: it also absorbs whatever the
kernel cost model and the client model miss on those rows, so it is valid for the engine, GPU, model
and load range it was fitted on; the written file says so in its ``source``.

Output (``--out``, YAML): per engine the fitted ``step_overhead`` (pool keys: ``engine: E`` plus
``step_overhead: {...}`` in a scenario, or ``pdsim validate --step-overhead FILE``), the rows used, and
TTFT/TPOT MAPE of the preset and of the fit on the fit rows and on the held-out rows.
"""
from __future__ import annotations

import datetime as _dt
import math
import sys
import zlib
from pathlib import Path

import numpy as np
import yaml

from .errors import ConfigError

MIN_ROWS = 3                 # fit rows an engine needs (two parameters by least squares, and a check)
PER_TOKEN_MAX_US = 50.0      # golden-section bracket of per_token_us (0 .. this)
GOLDEN_STEPS = 12            # evaluations of the golden-section search (the bracket shrinks by 0.618 each: 50 us -> 0.4 us)
SPLITS = ("row", "model")


def holdout_key(r: dict, by: str) -> str:
    return str(r["model"] if by == "model" else r["id"])


def is_held_out(r: dict, fraction: float, by: str) -> bool:
    """Stable: CRC32 of the row id (or model name) mapped to [0, 1) below ``fraction``."""
    return zlib.crc32(holdout_key(r, by).encode()) / 2.0 ** 32 < fraction


def split_rows(rows: list[tuple[dict, str | None]], fraction: float, by: str):
    """(fit, held_out) lists of usable (row, None) pairs."""
    if by not in SPLITS:
        raise ConfigError(f"must be one of {', '.join(SPLITS)}", key="--split-by", value=by)
    if not 0.0 <= fraction < 1.0:
        raise ConfigError("must be in [0, 1): the held-out share of the rows", key="--holdout", value=fraction)
    usable = [(r, why) for r, why in rows if why is None]
    held = [x for x in usable if is_held_out(x[0], fraction, by)]
    fit = [x for x in usable if not is_held_out(x[0], fraction, by)]
    return fit, held


def _params(engine: str, fitted: dict | None = None) -> dict:
    from .engines import PRESETS
    p = PRESETS[engine]
    out = {"base_us": p.overhead_base_us, "per_seq_us": p.overhead_per_seq_us,
           "per_token_us": p.overhead_per_token_us}
    if fitted:
        out.update(fitted)
    return out


def _errors(rows: list[dict]) -> dict:
    def m(key):
        v = [r[key] for r in rows if r.get(key) is not None]
        return round(float(np.mean(v)), 2) if v else None

    def bias(sim, meas):
        v = [r[sim] / r[meas] - 1 for r in rows if r.get(sim) == r.get(sim) and r.get(meas)]
        return round(float(np.mean(v)) * 100, 2) if v else None
    return {"rows": len(rows), "ttft_mape_pct": m("ttft_ape"), "tpot_mape_pct": m("tpot_ape"),
            "ttft_bias_pct": bias("sim_ttft_ms", "ttft_ms"), "tpot_bias_pct": bias("sim_tpot_ms", "tpot_ms")}


class _Fitter:
    def __init__(self, engine: str, rows: list, requests_per_client: int, profiles, progress):
        self.engine, self.rows = engine, rows
        self.kw = {"requests_per_client": requests_per_client, "profiles": profiles}
        self.progress = progress
        self.evaluations = 0

    def simulate(self, params: dict, rows=None) -> list[dict]:
        from .validate import validate
        self.evaluations += 1
        if self.progress:
            self.progress(f"{self.engine}: pass {self.evaluations} over {len(rows or self.rows)} rows "
                          f"(base {params['base_us']:.1f} us, per_seq {params['per_seq_us']:.2f} us, "
                          f"per_token {params['per_token_us']:.3f} us)")
        return validate(rows or self.rows, step_overhead={self.engine: dict(params)}, **self.kw)["rows"]

    def refit_tpot(self, params: dict, sim_rows: list[dict]) -> dict:
        from .validate import fit_step_overhead
        got = fit_step_overhead(sim_rows, start={self.engine: params}).get(self.engine)
        return {**params, **got} if got else params

    def ttft_error(self, params: dict) -> tuple[float, list[dict]]:
        rows = self.simulate(params)
        v = [r["ttft_ape"] for r in rows if r["ttft_ape"] is not None]
        return (float(np.mean(v)) if v else math.inf), rows

    def search_per_token(self, params: dict) -> tuple[dict, list[dict]]:
        """Golden-section search of per_token_us in [0, PER_TOKEN_MAX_US] on the fit rows' TTFT MAPE."""
        g = (math.sqrt(5) - 1) / 2
        lo, hi = 0.0, PER_TOKEN_MAX_US
        x1, x2 = hi - g * (hi - lo), lo + g * (hi - lo)
        f1, r1 = self.ttft_error({**params, "per_token_us": x1})
        f2, r2 = self.ttft_error({**params, "per_token_us": x2})
        for _ in range(GOLDEN_STEPS - 2):
            if f1 <= f2:
                hi, x2, f2, r2 = x2, x1, f1, r1
                x1 = hi - g * (hi - lo)
                f1, r1 = self.ttft_error({**params, "per_token_us": x1})
            else:
                lo, x1, f1, r1 = x1, x2, f2, r2
                x2 = lo + g * (hi - lo)
                f2, r2 = self.ttft_error({**params, "per_token_us": x2})
        # the bracket's ends were never evaluated: 0 (no per-token cost) is a common answer, so try it too
        f0, r0 = self.ttft_error({**params, "per_token_us": 0.0})
        best = min(((f0, 0.0, r0), (f1, x1, r1), (f2, x2, r2)), key=lambda t: t[0])
        return {**params, "per_token_us": round(best[1], 3)}, best[2]

    def fit(self, rounds: int, fit_ttft: bool) -> tuple[dict, list[dict], list[dict]]:
        start = _params(self.engine)
        preset_rows = sim = self.simulate(start)
        params = self.refit_tpot(start, sim)
        for _ in range(rounds):
            if fit_ttft:
                params, _ = self.search_per_token(params)
            sim = self.simulate(params)
            params = self.refit_tpot(params, sim)
        final = self.simulate(params)
        return params, preset_rows, final


def calibrate_from_benchmark(files: list[str], defaults: dict | None = None, out: str | Path | None = None,
                             holdout: float = 0.5, split_by: str = "row", rounds: int = 2, fit: str = "both",
                             requests_per_client: int = 10, sample: int | None = None, seed: int = 0,
                             profiles: dict | None = None, progress: bool = True,
                             keep_beyond_ceiling: bool = False) -> dict:
    """Fit each engine's step overhead on the fit rows, report the error on the held-out rows, write ``out``."""
    from .validate import read_measured
    if not files:
        raise ConfigError("give at least one measured file (silicon CSV, vllm bench serve JSON, GenAI-Perf JSON)",
                          key="--from-benchmark")
    if fit not in ("both", "tpot"):
        raise ConfigError("must be both or tpot", key="--fit", value=fit)
    for key, v, lo in (("--rounds", rounds, 1), ("--requests-per-client", requests_per_client, 1),
                       ("--sample", sample if sample is not None else 0, 0)):
        if not isinstance(v, int) or v < lo:
            raise ConfigError(f"must be an integer >= {lo}", key=key, value=v)
    if out is not None and Path(out).is_dir():      # said before minutes of fitting, not after
        raise ConfigError("is a folder; give a file path (e.g. engines-fitted.yaml)", key="--out", value=str(out))
    rows = [r for f in files for r in read_measured(f, defaults or {})]
    if sample and sample < len(rows):
        keep = sorted(np.random.default_rng(seed).choice(len(rows), sample, replace=False).tolist())
        rows = [rows[i] for i in keep]
    result = calibrate_rows(rows, ", ".join(Path(f).name for f in files), holdout, split_by, rounds, fit,
                            requests_per_client, profiles, progress, keep_beyond_ceiling)
    result["files"] = [str(f) for f in files]
    if out is not None:
        write_result(result, out)
    return result


def calibrate_rows(rows: list[tuple[dict, str | None]], label: str, holdout: float = 0.5, split_by: str = "row",
                   rounds: int = 2, fit: str = "both", requests_per_client: int = 10, profiles: dict | None = None,
                   progress: bool = True, keep_beyond_ceiling: bool = False) -> dict:
    """:func:`calibrate_from_benchmark` on rows already read (``label`` names where they came from)."""
    skipped: dict[str, int] = {}
    for _, why in rows:
        if why:
            k = why.split(":")[0]
            skipped[k] = skipped.get(k, 0) + 1
    fit_rows, held_rows = split_rows(rows, holdout, split_by)
    # a row served faster than pdsim's kernels can go (validate.implied_gemm_util > 1: cache hits, faster
    # GEMMs than the profile, or a rate Little's law overstates) asks for a negative overhead: left out of the
    # fit unless keep_beyond_ceiling; held-out ones stay in the held-out error and are listed
    from .validate import implied_gemm_util, over_gemm_rate

    def beyond_ceiling(part):
        return [x for x in part if over_gemm_rate({"implied_gemm_util": implied_gemm_util(
            x[0], device=(profiles or {}).get(x[0].get("device")))})]
    beyond, beyond_held = beyond_ceiling(fit_rows), beyond_ceiling(held_rows)
    if beyond and not keep_beyond_ceiling:
        drop = {id(x) for x in beyond}
        fit_rows = [x for x in fit_rows if id(x) not in drop]

    def say(msg):
        if progress:
            print(f"pdsim calibrate: {msg}", file=sys.stderr, flush=True)

    say(f"{len(rows)} rows: {len(fit_rows)} to fit, {len(held_rows)} held out, "
        f"{sum(skipped.values())} not expressible {skipped or ''}".rstrip())
    if beyond or beyond_held:
        ids = [str(r["id"]) for r, _ in beyond + beyond_held]
        say(f"{len(beyond) + len(beyond_held)} row(s) beyond pdsim's GEMM ceiling (pdsim validate's "
            f"implied_gemm_util > 1): {len(beyond)} fit row(s) "
            f"{'kept (--keep-beyond-ceiling)' if keep_beyond_ceiling else 'left out of the fit'}, "
            f"{len(beyond_held)} held out (kept in the held-out error): {', '.join(ids[:5])}"
            f"{' ...' if len(ids) > 5 else ''}")
    engines: dict[str, dict] = {}
    not_fitted: dict[str, str] = {}
    for eng in sorted({r["engine"] for r, _ in fit_rows} | {r["engine"] for r, _ in held_rows}):
        mine = [x for x in fit_rows if x[0]["engine"] == eng]
        held = [x for x in held_rows if x[0]["engine"] == eng]
        if len(mine) < MIN_ROWS:
            not_fitted[eng] = f"{len(mine)} fit rows (needs {MIN_ROWS})"
            continue
        f = _Fitter(eng, mine, requests_per_client, profiles, say if progress else None)
        params, preset_rows, final_rows = f.fit(rounds, fit == "both")
        entry = {"step_overhead": {k: round(float(v), 3) for k, v in params.items()},
                 "preset_step_overhead": _params(eng),
                 "fit": {"preset": _errors(preset_rows), "fitted": _errors(final_rows)},
                 "simulation_passes": f.evaluations}
        if held:
            entry["held_out"] = {"preset": _errors(f.simulate(_params(eng), held)),
                                 "fitted": _errors(f.simulate(params, held))}
        else:
            entry["held_out"] = None
        entry["rows"] = {"fit": len(mine), "held_out": len(held),
                         "devices": sorted({r["device"] for r, _ in mine}),
                         "models": sorted({r["model"] for r, _ in mine}),
                         "concurrency": [min(r["concurrency"] for r, _ in mine),
                                         max(r["concurrency"] for r, _ in mine)]}
        engines[eng] = entry
    result = {
        "source": (f"FITTED by pdsim calibrate --from-benchmark to {len(fit_rows)} rows of "
                   f"{label} (split by {split_by}, {holdout:.0%} held out by a "
                   "CRC32 hash); a residual fit of the engine step overhead: it also absorbs what the kernel cost "
                   "model and the client model miss on those rows, so it holds for the engines, GPUs, models "
                   "and concurrencies it was fitted on"),
        "created": _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "split_by": split_by, "holdout": holdout, "rounds": rounds, "fit": fit,
        "requests_per_client": requests_per_client,
        "usage": "in a scenario pool: engine: <name> and step_overhead: <its step_overhead>; or "
                 "pdsim validate MEASURED --step-overhead THIS_FILE",
        "engines": engines, "not_fitted": not_fitted, "skipped_by_reason": skipped,
        "beyond_gemm_ceiling": {"fit": [r["id"] for r, _ in beyond], "held_out": [r["id"] for r, _ in beyond_held],
                                "fit_rows_kept": keep_beyond_ceiling},
    }
    return result


def write_result(result: dict, out: str | Path) -> None:
    """The calibration as YAML (what ``pdsim validate --step-overhead`` and :func:`load_step_overheads` read)."""
    out = Path(out)
    if out.is_dir():
        raise ConfigError("is a folder; give a file path (e.g. engines-fitted.yaml)", key="--out", value=str(out))
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text("# pdsim engine calibration (pdsim calibrate --from-benchmark); times in microseconds\n"
                       + yaml.safe_dump(result, sort_keys=False), encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"cannot write: {exc.strerror}", key="--out", value=str(out)) from None


def load_step_overheads(path: str | Path) -> dict:
    """``{engine: {base_us, per_seq_us, per_token_us}}`` of a file written by :func:`calibrate_from_benchmark`."""
    from .engines import PRESETS
    p = Path(path)
    if not p.is_file():
        raise ConfigError("file not found", key="--step-overhead", value=str(path))
    try:
        data = yaml.safe_load(p.read_text(encoding="utf-8"))
    except (yaml.YAMLError, UnicodeDecodeError) as exc:
        raise ConfigError(f"not valid YAML: {str(exc).splitlines()[0]}", file=str(path)) from None
    engines = data.get("engines") if isinstance(data, dict) else None
    if not isinstance(engines, dict) or not engines:
        raise ConfigError("no `engines:` section (write one with pdsim calibrate --from-benchmark)", file=str(path))
    out = {}
    for eng, entry in engines.items():
        if eng not in PRESETS:
            raise ConfigError(f"unknown engine (one of {', '.join(PRESETS)})", file=str(path), key="engines",
                              value=eng)
        so = entry.get("step_overhead") if isinstance(entry, dict) else None
        keys = ("base_us", "per_seq_us", "per_token_us")
        if not isinstance(so, dict) or any(not isinstance(so.get(k), (int, float)) or so[k] < 0 or so[k] != so[k]
                                           for k in keys):
            raise ConfigError("step_overhead needs base_us, per_seq_us and per_token_us >= 0", file=str(path),
                              key=f"engines.{eng}.step_overhead", value=so)
        out[eng] = {k: float(so[k]) for k in keys}
    return out


def print_result(result: dict) -> None:
    def e(d, k):
        v = d.get(k) if d else None
        return "   n/a" if v is None else f"{v:5.1f}%"
    for eng, entry in result["engines"].items():
        so = entry["step_overhead"]
        print(f"{eng}: base {so['base_us']:.1f} us, per_seq {so['per_seq_us']:.2f} us, "
              f"per_token {so['per_token_us']:.3f} us  ({entry['rows']['fit']} fit rows, "
              f"{entry['rows']['held_out']} held out)")
        for part in ("fit", "held_out"):
            d = entry.get(part)
            if not d:
                print(f"  {part:8s} (no rows)")
                continue
            for which in ("preset", "fitted"):
                x = d[which]
                print(f"  {part:8s} {which:6s} n={x['rows']:<4d} TTFT MAPE {e(x, 'ttft_mape_pct')} "
                      f"(bias {e(x, 'ttft_bias_pct')})  TPOT MAPE {e(x, 'tpot_mape_pct')} "
                      f"(bias {e(x, 'tpot_bias_pct')})")
    for eng, why in result["not_fitted"].items():
        print(f"{eng}: not fitted: {why}")
    b = result.get("beyond_gemm_ceiling") or {}
    if b.get("fit") or b.get("held_out"):
        print(f"beyond pdsim's GEMM ceiling (implied_gemm_util > 1): {len(b['fit'])} fit row(s) "
              f"{'kept' if b.get('fit_rows_kept') else 'left out of the fit'}, {len(b['held_out'])} held out "
              f"(in the held-out error): {', '.join(map(str, (b['fit'] + b['held_out'])[:5]))}")
