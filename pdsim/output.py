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
    df = metrics.requests_frame(results)
    df.to_csv(out / "requests.csv", index=False, float_format="%.9g")
    ts = metrics.timeseries_frame(results)
    ts.to_csv(out / "timeseries.csv", index=False, float_format="%.6g")
    topologies = metrics.summarize(results, df, sc)
    for t in topologies.values():
        t.update(vllm_aliases(t))
    summary = {"pdsim_version": __version__, "wall_s": wall_s,
               "topologies": topologies,
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
    build_report(out, progress=progress, df=df, summary=summary, ts=ts)   # in memory: no re-reading the CSVs
    return summary


def vllm_aliases(t: dict) -> dict:
    """The names ``vllm bench serve`` gives the same quantities (milliseconds, as it reports them), so a
    result can be compared key for key with a measured run: mean/median/p90/p99 of ttft, tpot, e2el (and itl
    when the run records it), request_throughput (req/s), output_throughput (tok/s), completed.  The
    pdsim keys stay as they are; these are extra keys beside them."""
    out = {}
    thr = t.get("throughput") or {}
    if thr.get("requests_per_s") is not None:
        out["request_throughput"] = thr["requests_per_s"]
    if thr.get("output_tokens_per_s") is not None:
        out["output_throughput"] = thr["output_tokens_per_s"]
    if isinstance(t.get("requests"), dict) and "finished" in t["requests"]:
        out["completed"] = t["requests"]["finished"]
    for ours, theirs in (("ttft_s", "ttft"), ("tpot_s", "tpot"), ("itl_s", "itl"), ("e2e_s", "e2el")):
        st = t.get(ours)
        if not isinstance(st, dict):
            continue
        for k, name in (("mean", "mean"), ("p50", "median"), ("p90", "p90"), ("p99", "p99")):
            v = st.get(k)
            if isinstance(v, (int, float)) and not isinstance(v, bool):
                out[f"{name}_{theirs}_ms"] = v * 1e3
    return out
