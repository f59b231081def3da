"""``pdsim sweep SCENARIO --set workload.rate=2:20:2``: a scenario over a grid of values, in a local process pool.

A ``--set KEY=lo:hi:step`` (numbers, hi included) or ``--set KEY=a,b,c`` is an axis of the grid; any other
``--set`` applies to every point (a key both swept and fixed is refused).  Every point's scenario is validated,
and its topologies built (``simulation.check_topologies``), before anything is simulated; a point that fails
then or while it runs is named with the scenario file in one line.  For
each point and topology it keeps SLO attainment, TTFT/TPOT percentiles and cost, and per topology the
goodput: DistServe's highest swept value whose attainment (and every lower value's) meets the target,
with the crossing interpolated linearly between the last passing and the first failing point.  Goodput is
given over a load only (``LOAD_KEYS``: rate, rate_scale, clients); over any other numeric key (an SLO bound,
replicas, lengths) the values where the SLO is met and missed are listed instead, and a topology that a
``topologies.NAME...`` key does not set is said to be unchanged by it.

Writes ``sweep.csv`` (one row per point per topology), ``sweep.json`` and ``sweep.html``.
"""
from __future__ import annotations

import itertools
import json
import math
import os
import re
import sys
import time
from pathlib import Path

import yaml

from .errors import ConfigError

MAX_POINTS = 1000
_NUM = r"[-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?"
_RANGE = re.compile(rf"^\s*({_NUM})\s*:\s*({_NUM})\s*:\s*({_NUM})\s*$")


def parse_axes(sets: list[str]) -> tuple[list[str], list[tuple[str, list]]]:
    """Split ``--set`` items into fixed overrides and grid axes [(key, values)]."""
    fixed, axes = [], []
    for item in sets or []:
        if "=" not in item:
            raise ConfigError("--set needs KEY=VALUE", key="--set", value=item)
        key, text = (s.strip() for s in item.split("=", 1))
        m = _RANGE.match(text)
        if m:
            lo, hi, step = (float(g) for g in m.groups())
            if not (step > 0) or hi < lo or not all(math.isfinite(v) for v in (lo, hi, step)):
                raise ConfigError("a range is lo:hi:step with lo <= hi and step > 0", key=f"--set {key}", value=text)
            n = int(math.floor((hi - lo) / step + 1e-9)) + 1
            if n > MAX_POINTS:
                raise ConfigError(f"{n} values; at most {MAX_POINTS}", key=f"--set {key}", value=text)
            vals = [lo + i * step for i in range(n)]
            integral = all(float(g).is_integer() for g in (lo, step)) and "." not in text and "e" not in text.lower()
            vals = [int(round(v)) if integral else float(f"{v:.12g}") for v in vals]
            axes.append((key, vals))
        elif "," in text and not text.startswith(("[", "{")):
            vals = []
            for part in text.split(","):
                try:
                    vals.append(yaml.safe_load(part.strip()))
                except yaml.YAMLError:
                    vals.append(part.strip())
            if any(v is None for v in vals):
                raise ConfigError("empty value in a list", key=f"--set {key}", value=text)
            axes.append((key, vals))
        else:
            fixed.append(item)
    if len({k for k, _ in axes}) != len(axes):
        raise ConfigError("a key is swept twice", key="--set", value=", ".join(k for k, _ in axes))
    # a key both fixed and swept: the axis would win at every point while sweep.json's "fixed" and the page's
    # header still showed the fixed value
    both = [k for k, _ in axes if k in {f.split("=", 1)[0].strip() for f in fixed}]
    if both:
        raise ConfigError("is both swept and fixed; give it once", key=f"--set {both[0]}")
    n = math.prod(len(v) for _, v in axes) if axes else 0
    if n > MAX_POINTS:
        raise ConfigError(f"the grid has {n} points; at most {MAX_POINTS}", key="--set")
    return fixed, axes


def _is_num(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def run_point(task: dict) -> dict:
    """Simulate one grid point; the per-topology numbers a sweep keeps (runs in a worker process)."""
    import copy

    from . import config, metrics
    from .simulation import simulate
    # the scenario travels as its contents with an absolute base folder: a Dask worker need not see the file
    sc = config.parse(copy.deepcopy(task["raw"]), task["file"], task["overrides"], task["base_dir"])
    t0 = time.perf_counter()
    results = simulate(sc)
    df = metrics.requests_frame(results)
    summary = metrics.summarize(results, df, sc)
    out = []
    for name, t in summary.items():
        row = {**task["point"], "topology": name, "slo_attainment": t["slo_attainment"], "slo_met": t["slo_met"],
               "slo_mode": sc.slo.mode,       # what slo_met judges: attainment >= target, or the percentiles
               # judged at the bounds / pdsim's p90 measured/simulated ratios (None: no measured band)
               "slo_attainment_at_p90_error": (t.get("slo_at_error") or {}).get("attainment"),
               "slo_met_at_p90_error": (t.get("slo_at_error") or {}).get("met"),
               "gpus": t["gpus"], "cost_per_hour_usd": t["cost_per_hour_usd"],
               "cost_per_million_output_tokens_usd": t["cost_per_million_output_tokens_usd"],
               "requests": t["requests"]["total"], "finished": t["requests"]["finished"],
               "cut_by_horizon": t.get("cut_by_horizon", 0),      # not in the run: arriving after horizon_s
               "output_tokens_per_s": t["throughput"]["output_tokens_per_s"]}
        for m in ("ttft_s", "tpot_s", "e2e_s"):
            for p in ("p50", "p90", "p99"):
                row[f"{m[:-2]}_{p}_s"] = (t.get(m) or {}).get(p)
        out.append(row)
    return {"point": task["point"], "rows": out, "wall_s": time.perf_counter() - t0}


def goodput(xs: list[float], att: list[float], target: float, interpolate: bool = True) -> dict:
    """Highest x whose attainment, and that of every lower x, is >= target; the crossing interpolated
    between that x and the next (first failing) one (``interpolate`` False: the last passing x).
    ``status``: within / above / below the swept range."""
    pts = sorted((x, a) for x, a in zip(xs, att) if a is not None and not math.isnan(a))
    last, nxt = None, None
    for i, (x, a) in enumerate(pts):
        if a >= target:
            last = (x, a)
        else:
            nxt = (x, a)
            break
    if last is None:
        return {"status": "below the swept range", "last_pass": None, "first_fail": pts[0][0] if pts else None,
                "estimate": None}
    if nxt is None:
        return {"status": "above the swept range", "last_pass": last[0], "first_fail": None, "estimate": last[0]}
    (x0, a0), (x1, a1) = last, nxt
    est = x0 + (x1 - x0) * (a0 - target) / (a0 - a1) if a0 > a1 and interpolate else x0
    return {"status": "within the swept range", "last_pass": x0, "first_fail": x1, "estimate": est}


# the axes that raise the load: goodput (the highest value that still meets the SLO) means something on them only
LOAD_KEYS = ("workload.rate", "workload.trace.rate_scale", "workload.rate_curve.scale", "workload.clients")


def axis_topology(key: str, names) -> str | None:
    """The topology a ``topologies.NAME...`` key sets (None: a key every topology reads)."""
    if not key.startswith("topologies."):
        return None
    rest = key[len("topologies."):]
    for n in sorted(names, key=len, reverse=True):    # a name may hold dots: the longest that matches
        if rest == n or rest.startswith(n + "."):
            return n
    return rest.split(".", 1)[0]


def _margins(rs: list, error: bool = False) -> tuple[list, bool]:
    """(each row's margin, whether to interpolate): >= 0 where the run's own verdict (``slo_met``, as
    ``pdsim run`` and ``plan`` judge by ``slo.mode``) meets the SLO.  Under ``mode: attainment`` the margin
    is the attainment less its own point's target (an axis may set the target; with one target for the
    whole series the goodput's interpolation is the same as on the attainments); under ``mode:
    percentile`` it is +1 or -1 by the verdict, and the goodput is the last passing point, not
    interpolated.  ``error``: judged at pdsim's p90 error (``slo_at_error``)."""
    att_key, met_key = ("slo_attainment_at_p90_error", "slo_met_at_p90_error") if error else \
        ("slo_attainment", "slo_met")
    out, interpolate = [], True
    for r in rs:
        if r.get("slo_mode", "attainment") == "percentile":
            interpolate = False
            met = r.get(met_key)
            out.append(None if met is None else (1.0 if met else -1.0))
        else:
            out.append(None if r.get(att_key) is None else r[att_key] - r["attainment_target"])
    return out, interpolate


def _goodput_args(rs: list, error: bool = False) -> tuple:
    """goodput's (margins, target 0, interpolate) for a series' rows."""
    margins, interpolate = _margins(rs, error)
    return margins, 0.0, interpolate


def passes_and_fails(xs: list, att: list, target: float) -> dict:
    """On an axis that is not a load: the swept values where the SLO was met and where it was not, in order."""
    pts = sorted((x, a) for x, a in zip(xs, att) if a is not None and not math.isnan(a))
    return {"passes_at": [x for x, a in pts if a >= target], "fails_at": [x for x, a in pts if a < target]}


def point_label(pt: dict) -> str:
    """A grid point as its settings: ``model=llama-3.1-70b, workload.rate=4``."""
    return ", ".join(f"{k}={v}" for k, v in pt.items())


def point_error(scenario, pt: dict, exc) -> ConfigError:
    """``exc`` (an InputError found at one point) as one line naming the scenario file and the point."""
    text, prefix = str(exc), f"{scenario}: "
    if text.startswith(prefix):            # config.load names the file already: once is enough
        text = text[len(prefix):]
    return ConfigError(text, file=str(scenario), key=f"at the point {point_label(pt)}")


def run_sweep(scenario: str, sets: list[str], jobs: int | None = None, progress: bool = True,
              executor=None) -> dict:
    """The grid: in this process (jobs 1), a local process pool, or ``executor`` (a
    :class:`pdsim.plan.DaskExecutor`, as ``pdsim sweep --scheduler``)."""
    from . import config
    fixed, axes = parse_axes(sets)
    if not axes:
        raise ConfigError("nothing to sweep: give --set KEY=lo:hi:step or --set KEY=a,b,c", key="--set")
    points = [dict(zip([k for k, _ in axes], combo)) for combo in itertools.product(*[v for _, v in axes])]
    tasks = []
    raw = config.read_yaml(scenario)
    base_dir = str(Path(scenario).resolve().parent)
    targets = {}          # each point's attainment target: an axis may set it (slo.attainment_target=0.5,0.9)
    from .errors import InputError
    from .simulation import check_topologies
    for pt in points:     # validate every point before simulating any: a bad value fails in a second
        ov = fixed + [f"{k}={json.dumps(v) if not isinstance(v, str) else v}" for k, v in pt.items()]
        try:
            sc = config.load(scenario, ov)
            check_topologies(sc)        # built as simulate builds them (weights that do not fit...), nothing run
        except InputError as exc:
            raise point_error(scenario, pt, exc) from None
        targets[json.dumps(pt, sort_keys=True, default=str)] = sc.slo.attainment_target
        tasks.append({"raw": raw, "file": str(scenario), "base_dir": base_dir, "overrides": ov, "point": pt})
    jobs = max(1, min(jobs or (os.cpu_count() or 1), len(tasks)))
    if progress:
        where = f"Dask ({getattr(executor, 'address', 'cluster')})" if executor is not None else \
            f"{jobs} process{'es' if jobs > 1 else ''}"
        print(f"pdsim sweep: {len(tasks)} points x {len(sc.topologies)} topologies on {where}",
              file=sys.stderr, flush=True)
    t0 = time.perf_counter()
    from .progress import Bar
    with Bar(len(tasks), "sweep", unit="point", enabled=progress) as bar:
        if executor is not None:
            results = list(executor.map(run_point, tasks, on_done=bar.update))
        elif jobs == 1:
            results = []
            for t in tasks:
                try:
                    results.append(run_point(t))
                except InputError as exc:
                    raise point_error(scenario, t["point"], exc) from None
                bar.update(1, str(t["point"]))
        else:
            from concurrent.futures import ProcessPoolExecutor, as_completed
            with ProcessPoolExecutor(max_workers=jobs) as ex:
                futures = {ex.submit(run_point, t): t for t in tasks}
                for f in as_completed(futures):
                    exc = f.exception()
                    if exc is not None:     # the first failing point: drop the pending ones, name this one
                        for g in futures:
                            g.cancel()
                        if isinstance(exc, InputError):
                            raise point_error(scenario, futures[f]["point"], exc) from None
                        raise exc
                    bar.update(1)
                results = [f.result() for f in futures]
    rows = [row for r in results for row in r["rows"]]
    for r in results:
        for row in r["rows"]:
            row["attainment_target"] = targets[json.dumps(r["point"], sort_keys=True, default=str)]
    # x axis: the first load axis, else the first numeric one; the other axes make separate series
    keys = [k for k, _ in axes]
    # (a load axis first: over it each series gets its goodput; the other axes make the series)
    xkey = next((k for k, v in axes if k in LOAD_KEYS and all(_is_num(x) for x in v)),
                next((k for k, v in axes if all(_is_num(x) for x in v)), keys[0]))
    others = [k for k in keys if k != xkey]
    names = list(sc.topologies)
    series = {}
    for row in rows:
        # a key that sets another topology is no part of this one's series (its runs there are the same config)
        label = row["topology"] + "".join(f" · {k.split('.')[-1]}={row[k]}" for k in others
                                          if axis_topology(k, names) in (None, row["topology"]))
        rs = series.setdefault(label, [])
        if all(r[xkey] != row[xkey] for r in rs):
            rs.append(row)
    gp, gp_err, verdicts, untouched = {}, {}, {}, []
    numeric = all(_is_num(v) for v in dict(axes)[xkey])
    load = xkey in LOAD_KEYS
    only = axis_topology(xkey, list(sc.topologies))
    for label, rs in series.items():
        if only is not None and rs[0]["topology"] != only:
            untouched.append(label)         # the x axis sets another topology: nothing to judge over it here
        elif numeric and load:
            gp[label] = goodput([r[xkey] for r in rs], *_goodput_args(rs))
            # the same at pdsim's p90 error (metrics.slo_at_error): the low end of the goodput's band
            if all(m is not None for m in _margins(rs, error=True)[0]):
                gp_err[label] = goodput([r[xkey] for r in rs], *_goodput_args(rs, error=True))
        elif numeric:                       # not a load: a bigger value need not be harder, so no goodput
            verdicts[label] = passes_and_fails([r[xkey] for r in rs], _margins(rs)[0], 0.0)
    return {"scenario": str(scenario), "name": sc.name, "axes": [{"key": k, "values": v} for k, v in axes],
            "fixed": fixed, "x": xkey, "numeric_x": numeric, "load_x": load, "slo": sc.slo.model_dump(), "rows": rows,
            "series": {k: [r for r in v] for k, v in series.items()}, "goodput": gp, "goodput_at_p90_error": gp_err,
            "verdicts": verdicts, "untouched": untouched, "wall_s": time.perf_counter() - t0, "jobs": jobs}


SWEEP_FILES = ("sweep.csv", "sweep.json", "sweep.html")


def write_sweep_outputs(result: dict, out: Path) -> Path:
    """sweep.csv, sweep.json and sweep.html, written into a staging folder inside ``out`` and then moved into
    place (``os.replace``, one by one): a failure while writing leaves the previous sweep's files as they were."""
    import shutil
    import tempfile

    import pandas as pd

    from .output import STAGING_PREFIX
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=STAGING_PREFIX, dir=out))
    try:
        pd.DataFrame(result["rows"]).to_csv(staging / "sweep.csv", index=False, float_format="%.9g")
        (staging / "sweep.json").write_text(json.dumps({k: v for k, v in result.items() if k != "series"},
                                                       indent=2, default=str))
        build_sweep_report(result, staging)
        for name in SWEEP_FILES:
            os.replace(staging / name, out / name)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return out / "sweep.html"


def _estimate(g: dict) -> str:
    """A goodput as '≈ x', '≥ last passing' or '< first failing'."""
    from .charts import num
    return {"within the swept range": f"≈ {num(g['estimate'])}", "above the swept range":
            f"≥ {num(g['last_pass'])}"}.get(g["status"], f"< {num(g['first_fail'])}")


def print_goodput(result: dict, out=None) -> None:
    out = out or sys.stdout
    from .charts import num
    x = result["x"]
    for label, g in result["goodput"].items():
        est = _estimate(g)
        print(f"{label}: goodput {est} {x} ({g['status']}; last passing {num(g['last_pass'])}, "
              f"first failing {num(g['first_fail'])})", file=out)
        e = (result.get("goodput_at_p90_error") or {}).get(label)
        if e is not None:
            print(f"{label}: at pdsim's p90 error {_estimate(e)} {x} (latencies judged at the bounds / the p90 of "
                  "measured/simulated over its validation runs; summary slo_at_error)", file=out)
    for label, v in (result.get("verdicts") or {}).items():
        print(f"{label}: {x} {_passes_text(v)} (not a load axis: no goodput)", file=out)
    for label in result.get("untouched") or ():
        print(f"{label}: unchanged by {x} (the key sets another topology)", file=out)


def _passes_text(v: dict) -> str:
    from .charts import num
    p, f = v["passes_at"], v["fails_at"]
    return "; ".join(([f"meets the SLO at {', '.join(num(x) for x in p)}"] if p else []) +
                     ([f"misses it at {', '.join(num(x) for x in f)}"] if f else [])) or "no point judged"


def _rule_text(slo: dict) -> str:
    """The SLO rule every point is judged by (``slo.mode``), in words."""
    from .charts import num, pct, seconds
    if slo.get("mode", "attainment") == "percentile":
        return (f"the p{num(slo.get('ttft_percentile', 90))} TTFT ≤ {seconds(slo['ttft_s'])} and the "
                f"p{num(slo.get('tpot_percentile', 90))} TPOT ≤ {seconds(slo['tpot_s'])}")
    return (f"at least {pct(slo['attainment_target'])} of requests meet TTFT ≤ {seconds(slo['ttft_s'])} and TPOT ≤ "
            f"{seconds(slo['tpot_s'])}")


def build_sweep_report(result: dict, out: Path) -> Path:
    from .charts import CSS, SORT_JS, esc, line_chart, num, pct, seconds, table, usd
    x, slo, gp = result["x"], result["slo"], result["goodput"]
    labels = list(result["series"])
    xs_all = [v for a in result["axes"] if a["key"] == x for v in a["values"]]
    if result["numeric_x"]:
        xval, xfmt = (lambda v: float(v)), num
    else:
        pos = {str(v): i for i, v in enumerate(xs_all)}
        xval, xfmt = (lambda v: float(pos[str(v)])), \
            (lambda t: str(xs_all[int(t)]) if float(t).is_integer() and 0 <= int(t) < len(xs_all) else "")

    def chart(metric, ylabel, yfmt, hline=None, mark_y=None, ylim=None):
        series, marks = [], []
        for i, label in enumerate(labels):
            rs = sorted(result["series"][label], key=lambda r: xval(r[x]))
            series.append({"name": label, "x": [xval(r[x]) for r in rs], "y": [r.get(metric) for r in rs], "i": i,
                           "points": True})
            g = gp.get(label)
            if g and g["estimate"] is not None and mark_y is not None:
                marks.append({"x": g["estimate"], "y": mark_y(rs, g["estimate"], metric),
                              "label": f"goodput {num(g['estimate'])}", "i": i})
        return line_chart(series, x, ylabel, xfmt=xfmt, yfmt=yfmt, hlines=[hline] if hline else [], marks=marks,
                          ylim=ylim, title=ylabel)

    def interp(rs, at, metric):
        pts = [(xval(r[x]), r.get(metric)) for r in rs if r.get(metric) is not None]
        for (x0, y0), (x1, y1) in zip(pts, pts[1:]):
            if x0 <= at <= x1:
                return y0 + (y1 - y0) * ((at - x0) / (x1 - x0) if x1 > x0 else 0)
        return pts[-1][1] if pts else None

    tgt = slo["attainment_target"]
    tp, pp = num(slo.get("ttft_percentile", 90)), num(slo.get("tpot_percentile", 90))
    sections = [
        ("SLO attainment", chart("slo_attainment", "SLO attainment", pct, (tgt, f"target {pct(tgt)}"),
                                 lambda rs, at, m: tgt, (0, 1.0))),
        ("TTFT p90", chart("ttft_p90_s", "TTFT p90", seconds, (slo["ttft_s"], f"SLO {seconds(slo['ttft_s'])}"),
                           interp)),
        ("TPOT p90", chart("tpot_p90_s", "TPOT p90", seconds, (slo["tpot_s"], f"SLO {seconds(slo['tpot_s'])}"),
                           interp)),
        ("Cost per million output tokens", chart("cost_per_million_output_tokens_usd", "$ per M output tokens",
                                                 usd, None, interp)),
    ]
    verdict = []
    for label in labels:
        g = gp.get(label)
        if not g:
            continue
        if g["status"] == "within the swept range":
            verdict.append(f"{label}: goodput ≈ {num(g['estimate'])} (passes at {num(g['last_pass'])}, fails at "
                           f"{num(g['first_fail'])})")
        elif g["status"] == "above the swept range":
            verdict.append(f"{label}: passes at every swept value (goodput ≥ {num(g['last_pass'])})")
        else:
            verdict.append(f"{label}: fails already at {num(g['first_fail'])} (goodput below the swept range)")
        e = (result.get("goodput_at_p90_error") or {}).get(label)
        if e is not None:
            verdict[-1] += f"; at pdsim's p90 error {_estimate(e)}"
    if verdict:
        swept = [a["key"] for a in result["axes"] if a["key"].startswith("slo.")]
        rule = (f"each series at its own {', '.join(swept)}" if swept else _rule_text(slo))
        how = ("interpolated between grid points" if slo.get("mode", "attainment") == "attainment" or swept else
               "a percentile verdict is not interpolated: the last passing point")
        text = (f"Goodput over {x} (the highest value at which {rule}, {how}): "
                + "; ".join(verdict) + ".")
    elif result.get("verdicts"):
        text = (f"{x} is not a load (rate, rate_scale, rate_curve.scale or clients), so a larger value need not be "
                f"harder and no "
                f"goodput is computed. {_rule_text(slo)[0].upper() + _rule_text(slo)[1:]}: "
                + "; ".join(f"{label} {_passes_text(v)}" for label, v in result["verdicts"].items()) + ".")
    else:
        text = f"{x} is not numeric: no goodput is computed."
    if result.get("untouched"):
        text += f" Unchanged by {x} (it sets another topology): {', '.join(result['untouched'])}."
    cols = [a["key"] for a in result["axes"]] + ["topology", "slo_attainment", "ttft_p50_s", "ttft_p90_s",
                                                  "ttft_p99_s", "tpot_p50_s", "tpot_p90_s", "tpot_p99_s",
                                                  "e2e_p90_s", "gpus", "cost_per_million_output_tokens_usd"]
    heads = [c.split(".")[-1] for c in cols[:len(result["axes"])]] + [
        "topology", "attain\u00adment", "TTFT p50", "TTFT p90", "TTFT p99", "TPOT p50", "TPOT p90", "TPOT p99",
        "E2E p90", "GPUs", "$ per M out tok"]

    def cell(c, v):
        if c == "topology":
            return (str(v), str(v), ' class="text"')
        if v is None or isinstance(v, str):
            return ("–" if v is None else v, v)
        if c.endswith("_s"):
            return (seconds(v), v)
        if c == "slo_attainment":
            return (pct(v), v)
        if c.startswith("cost"):
            return (usd(v), v)
        return (num(v), v)
    rows = [[cell(c, r.get(c)) for c in cols] for r in result["rows"]]
    gp_rows = [[(label, label, ' class="text"'), g["status"], (num(g["last_pass"]), g["last_pass"]),
                (num(g["first_fail"]), g["first_fail"]), (num(g["estimate"]), g["estimate"])]
               for label, g in gp.items()]
    parts = [f'<!doctype html><html lang="en"><head><meta charset="utf-8"><meta name="viewport" '
             f'content="width=device-width, initial-scale=1"><title>pdsim sweep {esc(result["name"])}</title>'
             f"<style>{CSS}</style></head><body><h1>Sweep: {esc(result['name'])} over {esc(x)}</h1>",
             f'<p class="verdict" id="verdict">{esc(text)}</p>',
             f'<p class="meta">Scenario {esc(result["scenario"])}; grid '
             + "; ".join(f"{esc(a['key'])} = {esc(', '.join(str(v) for v in a['values']))}" for a in result["axes"])
             + (f"; fixed {esc(', '.join(result['fixed']))}" if result["fixed"] else "")
             + f". {num(len(result['rows']))} rows from {num(result['jobs'])} processes in {seconds(result['wall_s'])}."
             f" SLO: TTFT p{tp} ≤ {seconds(slo['ttft_s'])}, TPOT p{pp} ≤ {seconds(slo['tpot_s'])}, attainment ≥ "
             f"{pct(tgt)}.</p>"]
    if gp_rows:
        parts += ["<h2>Goodput per topology</h2>",
                  table(["series", "where", "last passing", "first failing", "goodput (interpolated)"], gp_rows,
                        "goodput", [f' data-series="{esc(label)}"' for label in gp])]
    for title, ch in sections:
        parts += [f"<h2>{esc(title)} vs {esc(x)}</h2>", ch]
    parts += ["<h2>Every point</h2>", table(heads, rows, "sweep"), SORT_JS, "</body></html>"]
    path = out / "sweep.html"
    path.write_text("\n".join(parts), encoding="utf-8")
    return path
