"""Write a run's outputs: requests.csv, summary.json, timeseries.csv, and report.html when available."""
from __future__ import annotations

import json
import math
import sys
from pathlib import Path

from . import __version__, metrics


def _clean(x):
    if isinstance(x, float) and not math.isfinite(x):
        return None
    if isinstance(x, dict):
        return {k: _clean(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_clean(v) for v in x]
    return x


def write_outputs(results, sc, out: Path, wall_s: float = 0.0, progress: bool = False,
                  report: bool = True) -> dict:
    out.mkdir(parents=True, exist_ok=True)
    df = metrics.requests_frame(results, sc.client)
    df.to_csv(out / "requests.csv", index=False, float_format="%.9g")
    ts = metrics.timeseries_frame(results)
    ts.to_csv(out / "timeseries.csv", index=False, float_format="%.6g")
    summary = {"pdsim_version": __version__, "wall_s": wall_s,
               "topologies": metrics.summarize(results, df, sc),
               "scenario": sc.model_dump(mode="json")}
    summary = _clean(summary)
    (out / "summary.json").write_text(json.dumps(summary, indent=2))
    if not report:
        return summary
    try:
        from .report import build_report
    except ImportError:
        return summary
    if progress:
        print("pdsim: building report.html...", file=sys.stderr, flush=True)
    build_report(out, progress=progress)
    return summary
