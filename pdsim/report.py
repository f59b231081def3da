"""A self-contained HTML page from a run's outputs: inline CSS and PNG images, no scripts, no URLs.

``build_report(out_dir)`` reads ``requests.csv``, ``summary.json`` and ``timeseries.csv`` from
``out_dir`` and writes ``out_dir/report.html``. Every plot's numbers are also in an HTML table; the
summary table (``class="summary"``) has one ``<tr data-topology=NAME>`` per topology and cells with
``data-key="ttft_s.p90"`` etc. holding the summary.json value (``%.7g``, i.e. within 1e-6 relative).
"""
from __future__ import annotations

import base64
import io
import json
import math
import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
from jinja2 import Environment, FileSystemLoader, select_autoescape  # noqa: E402

STYLES = ["-", "--", "-.", ":"]
# Okabe-Ito palette: colour-blind safe. Combined with STYLES so lines differ without colour too.
COLORS = ["#0072B2", "#D55E00", "#009E73", "#CC79A7", "#E69F00", "#56B4E9", "#000000"]
HATCHES = ["", "//", "..", "xx"]

# The summary-table columns: (data-key, header). Values are looked up in summary.json by dotted key.
SUMMARY_KEYS = [
    ("gpus", "GPUs"),
    ("ttft_s.p50", "TTFT p50 s"), ("ttft_s.p90", "TTFT p90 s"), ("ttft_s.p99", "TTFT p99 s"),
    ("tpot_s.p50", "TPOT p50 s"), ("tpot_s.p90", "TPOT p90 s"), ("tpot_s.p99", "TPOT p99 s"),
    ("e2e_s.p50", "E2E p50 s"), ("e2e_s.p90", "E2E p90 s"), ("e2e_s.p99", "E2E p99 s"),
    ("slo_attainment", "SLO attainment"),
    ("throughput.output_tokens_per_s_per_gpu", "out tok/s/GPU"),
    ("cost_per_million_output_tokens_usd", "$ / M out tok"),
]


_QUIET = [False]


def _log(msg: str) -> None:
    if not _QUIET[0]:
        print(f"report: {msg}", file=sys.stderr, flush=True)


def _png(fig) -> str:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=80, bbox_inches="tight")
    plt.close(fig)
    return base64.b64encode(buf.getvalue()).decode()


def _get(d, dotted: str):
    for k in dotted.split("."):
        d = d.get(k) if isinstance(d, dict) else None
    return d


def _num(x):
    """A finite float, or None."""
    try:
        x = float(x)
    except (TypeError, ValueError):
        return None
    return x if math.isfinite(x) else None


def _fmt(x) -> str:
    if x is None or isinstance(x, bool):
        return "-" if x is None else str(x)
    if isinstance(x, int):
        return str(x)
    x = _num(x)
    return "-" if x is None else f"{x:.7g}"


def _table(df: pd.DataFrame, cls: str, index: bool = True) -> str:
    return df.to_html(float_format=lambda v: f"{v:.6g}", classes=cls, index=index, na_rep="-", border=0)


def _style(i: int) -> dict:
    return {"linestyle": STYLES[i % len(STYLES)], "color": COLORS[i % len(COLORS)]}


def _passes(t: dict, target) -> bool | None:
    att = _num(t.get("slo_attainment"))
    if att is not None and _num(target) is not None:
        return att >= float(target)
    return t.get("slo_met")


def _workload(first: pd.DataFrame, figures: list) -> dict:
    _log("plotting workload...")
    fig, axes = plt.subplots(1, 3, figsize=(11, 2.8))
    arr = first.arrival_s.dropna().to_numpy()
    span = float(arr.max() - arr.min()) if len(arr) > 1 else 0.0
    if len(arr):
        bins = max(1, min(100, int(len(arr) ** 0.5)))
        counts, edges = np.histogram(arr, bins=bins)
        width = (edges[1] - edges[0]) or 1.0
        axes[0].step(edges[:-1], counts / width, where="post", color=COLORS[0])
    axes[0].set_xlabel("arrival time (s)")
    axes[0].set_ylabel("requests / s")
    axes[0].set_title("arrival rate", fontsize=9)
    for ax, col, c, h in ((axes[1], "prompt_tokens", COLORS[1], ""), (axes[2], "output_tokens", COLORS[2], "//")):
        v = first[col].dropna()
        if len(v):
            ax.hist(v, bins=40, color=c, hatch=h)
        ax.set_xlabel(col.replace("_", " "))
        ax.set_ylabel("requests")
    wl = first[["prompt_tokens", "output_tokens"]].describe(percentiles=[0.5, 0.9, 0.99]).T
    figures.append({"title": "Workload: arrival rate and length distributions", "png": _png(fig),
                    "table": _table(wl, "workload")})
    return {"requests": int(len(first)), "duration_s": span,
            "rate": (len(arr) - 1) / span if span > 0 else None,
            "prompt_mean": _num(first.prompt_tokens.mean()), "output_mean": _num(first.output_tokens.mean())}


def _cdfs(df: pd.DataFrame, names: list, slo: dict, figures: list) -> None:
    _log("plotting CDFs...")
    for col, key, label in (("ttft_s", "ttft_s", "TTFT (s)"), ("tpot_s", "tpot_s", "TPOT (s)")):
        bound = _num(slo.get(key))
        fig, ax = plt.subplots(figsize=(7, 3.5))
        rows, positive = [], False
        for i, name in enumerate(names):
            x = np.sort(df.loc[df.topology == name, col].dropna().to_numpy())
            if len(x):
                positive |= bool((x > 0).any())
                ax.plot(x, np.arange(1, len(x) + 1) / len(x), label=name, **_style(i))
            q = np.percentile(x, [50, 90, 99]) if len(x) else [np.nan] * 3
            rows.append({"topology": name, "n": len(x), "p50 s": q[0], "p90 s": q[1], "p99 s": q[2],
                         "fraction ≤ SLO": (float((x <= bound).mean()) if len(x) and bound is not None else np.nan)})
        if bound is not None:
            ax.axvline(bound, color="k", linestyle=(0, (1, 3)), linewidth=1.5, label=f"SLO {bound:g} s")
            pct = _num(slo.get(f"{key.split('_')[0]}_percentile"))
            if pct is not None:
                ax.axhline(pct / 100, color="grey", linestyle=(0, (5, 5)), linewidth=0.8, label=f"p{pct:g}")
        if positive:
            ax.set_xscale("log")
        ax.set_xlabel(label)
        ax.set_ylabel("fraction of requests")
        ax.set_ylim(0, 1.02)
        ax.legend(fontsize=8)
        figures.append({"title": f"CDF of {label}", "png": _png(fig),
                        "table": _table(pd.DataFrame(rows).set_index("topology"), "cdf")})


def _components(df: pd.DataFrame, names: list, figures: list) -> None:
    _log("plotting latency components...")
    fin = df[df.status == "finished"].copy()
    if not len(fin):
        return
    for c in ("queue_s", "prefill_s", "kv_wait_s", "kv_transfer_s", "decode_queue_s"):
        fin[c] = fin[c].fillna(0).clip(lower=0)
    fin["kv_s"] = fin.kv_wait_s + fin.kv_transfer_s
    fin["decode_s"] = (fin.e2e_s - fin.queue_s - fin.prefill_s - fin.kv_s - fin.decode_queue_s).clip(lower=0)
    cols = ["queue_s", "prefill_s", "kv_s", "decode_queue_s", "decode_s"]
    labels = ["prefill queue", "prefill compute", "KV wait + transfer", "decode queue", "decode (incl. preemption)"]
    order = [n for n in names if n in set(fin.topology)]
    g = fin.groupby("topology")[cols]
    stats = {"mean": g.mean().reindex(order), "p90": g.quantile(0.9).reindex(order)}
    fig, axes = plt.subplots(1, 2, figsize=(11, 0.8 + 0.45 * max(2, len(order))), sharey=True)
    for ax, (what, comp) in zip(axes, stats.items()):
        left = np.zeros(len(comp))
        for i, (c, lab) in enumerate(zip(cols, labels)):
            ax.barh(comp.index, comp[c], left=left, color=COLORS[i], hatch=HATCHES[i % len(HATCHES)],
                    edgecolor="white", label=lab)
            left += comp[c].fillna(0).to_numpy()
        ax.set_xlabel(f"{what} seconds per finished request" + (" (each component's own p90)" if what == "p90" else ""))
        ax.grid(axis="x", alpha=0.3)
    axes[0].invert_yaxis()
    axes[1].legend(fontsize=8, loc="lower right")
    table = pd.concat({what: comp.rename(columns=dict(zip(cols, [f"{lab} s" for lab in labels])))
                       for what, comp in stats.items()}, axis=1)
    table[("mean", "E2E s")] = fin.groupby("topology").e2e_s.mean()
    table[("p90", "E2E s")] = fin.groupby("topology").e2e_s.quantile(0.9)
    figures.append({"title": "Where the time goes (E2E components: mean and p90)", "png": _png(fig),
                    "table": _table(table, "components")})


def _faults(topos: dict, figures: list) -> None:
    rows = []
    for n, t in topos.items():
        f = t.get("faults")
        if not f:
            continue
        rec = [r.get("time_to_recover_s") for r in f.get("recovery", [])]
        rows.append({"topology": n, "fault events": len(f.get("events", [])),
                     "requests affected": f.get("requests_affected"),
                     "recomputed tokens": f.get("recomputed_tokens"),
                     "extra E2E s (affected)": f.get("extra_e2e_s_affected"),
                     "SLO att. in fault windows": f.get("slo_attainment_inside_fault_windows"),
                     "SLO att. outside": f.get("slo_attainment_outside_fault_windows"),
                     "time to recover s": ", ".join("-" if x is None else f"{x:.3g}" for x in rec) or "-",
                     "abandoned": _get(t, "requests.abandoned"), "rejected": _get(t, "requests.rejected")})
    if rows:
        figures.append({"title": "Faults: what they cost", "png": "",
                        "table": _table(pd.DataFrame(rows).set_index("topology"), "faults")})


def _prefix(topos: dict, figures: list) -> None:
    """One row per topology with a prefix cache: hit rates per tier, tokens, FLOPs and bytes saved."""
    rows = []
    for n, t in topos.items():
        pc = t.get("prefix_cache")
        if not pc:
            continue
        rows.append({"topology": n, "hit rate": pc.get("hit_rate"), "GPU tier": pc.get("gpu_hit_rate"),
                     "host tier": pc.get("host_hit_rate"), "prompt tokens saved": pc.get("tokens_saved"),
                     "prefill FLOPs saved": pc.get("prefill_flops_saved"),
                     "KV transfer bytes saved": pc.get("transfer_bytes_saved")})
    if rows:
        figures.append({"title": "Prefix cache: prompt tokens found cached at admission", "png": "",
                        "table": _table(pd.DataFrame(rows).set_index("topology"), "prefix")})


def _timeseries(ts: pd.DataFrame, names: list, figures: list) -> None:
    _log("plotting time series...")
    ts = ts.copy()
    ts["kv_used_fraction"] = ts.kv_blocks_used_max / ts.kv_blocks_total.where(ts.kv_blocks_total > 0)
    cols = ["busy_fraction", "mfu", "mbu", "batch_size", "queued_max", "kv_used_fraction"]
    ylabels = ["busy fraction", "MFU", "MBU", "batch size", "queued (max)", "KV used / total"]
    g = ts.groupby(["topology", "pool", "t_s"])[cols + ["kv_blocks_used_max", "kv_blocks_total"]].mean()
    order = {n: i for i, n in enumerate(names)}
    series = sorted(g.groupby(level=[0, 1]), key=lambda kv: (order.get(kv[0][0], 1e9), kv[0][1]))
    fig, axes = plt.subplots(len(cols), 1, figsize=(8, 1.7 * len(cols)), sharex=True)
    for i, ((topo, pool), part) in enumerate(series):
        t = part.index.get_level_values("t_s")
        for ax, c in zip(axes, cols):
            ax.plot(t, part[c], label=f"{topo} / {pool}", linewidth=1.2, **_style(i))
    for ax, lab in zip(axes, ylabels):
        ax.set_ylabel(lab, fontsize=8)
    axes[0].legend(fontsize=7, ncol=2)
    axes[-1].set_xlabel("simulated time (s)")
    per_pool = ts.groupby(["topology", "pool"])[cols + ["kv_blocks_used_max", "kv_blocks_total"]].mean()
    per_pool = per_pool.reindex(sorted(per_pool.index, key=lambda k: (order.get(k[0], 1e9), k[1])))
    per_pool.columns = [f"mean {c}" for c in per_pool.columns]
    figures.append({"title": "Over time per pool (mean over instances)", "png": _png(fig),
                    "table": _table(per_pool, "utilization")})


def _kv_transfers(df: pd.DataFrame, topos: dict, figures: list) -> None:
    dis_names = [n for n, t in topos.items() if t.get("kind") == "disaggregated"]
    dis = df[df.topology.isin(dis_names) & (df.status == "finished") & df.kv_transfer_s.notna()]
    if not len(dis):
        return
    _log("plotting KV transfers...")
    fig, ax = plt.subplots(figsize=(7, 3))
    rows = []
    for i, name in enumerate(dis_names):
        x = np.sort(dis.loc[dis.topology == name, "kv_transfer_s"].to_numpy())
        if not len(x):
            continue
        ax.plot(x * 1e3, np.arange(1, len(x) + 1) / len(x), label=name, **_style(i))
        q = np.percentile(x, [50, 90, 99])
        rows.append({"topology": name, "transfers": len(x), "mean s": x.mean(), "p50 s": q[0], "p90 s": q[1],
                     "p99 s": q[2], "max s": x.max()})
    ax.set_xlabel("KV transfer time per request (ms)")
    ax.set_ylabel("fraction of requests")
    ax.legend(fontsize=8)
    table = _table(pd.DataFrame(rows).set_index("topology"), "kvtransfer")
    links = pd.DataFrame([{"topology": n, **link} for n in dis_names for link in topos[n].get("links") or []])
    if len(links):
        table += "<h3>KV links</h3>" + _table(links, "links", index=False)
    figures.append({"title": "KV-cache transfer time (disaggregated topologies)", "png": _png(fig),
                    "table": table})


def build_report(out_dir: Path, progress: bool = True) -> Path:
    """Write ``out_dir/report.html`` from the run outputs in ``out_dir``; return its path."""
    _QUIET[0] = not progress
    out_dir = Path(out_dir)
    _log(f"reading {out_dir}...")
    summary = json.loads((out_dir / "summary.json").read_text())
    df = pd.read_csv(out_dir / "requests.csv", low_memory=False,
                     dtype={"instance": str, "decode_instance": str, "reject_reason": str, "status": str})
    ts_path = out_dir / "timeseries.csv"
    ts = None
    if ts_path.exists() and ts_path.stat().st_size > 1:
        try:
            ts = pd.read_csv(ts_path)
        except pd.errors.EmptyDataError:
            ts = None
    sc, topos = summary.get("scenario") or {}, summary["topologies"]
    slo = sc.get("slo") or {}
    target = slo.get("attainment_target")
    names = list(topos)
    df["topology"] = df["topology"].astype(str)

    rows = []
    for n, t in topos.items():
        rows.append({"name": n, "kind": t.get("kind"), "passes": _passes(t, target),
                     "cells": [(k, _fmt(_get(t, k))) for k, _ in SUMMARY_KEYS],
                     "card": {"GPUs": _fmt(t.get("gpus")), "kind": t.get("kind") or "-",
                              "TTFT p50/p90/p99 s": " / ".join(_fmt(_get(t, f"ttft_s.p{p}")) for p in (50, 90, 99)),
                              "TPOT p50/p90/p99 s": " / ".join(_fmt(_get(t, f"tpot_s.p{p}")) for p in (50, 90, 99)),
                              "E2E p50/p90/p99 s": " / ".join(_fmt(_get(t, f"e2e_s.p{p}")) for p in (50, 90, 99)),
                              "SLO attainment": _fmt(t.get("slo_attainment")),
                              "out tok/s per GPU": _fmt(_get(t, "throughput.output_tokens_per_s_per_gpu")),
                              "$ per M output tokens": _fmt(t.get("cost_per_million_output_tokens_usd")),
                              "requests finished / rejected / abandoned / unfinished": " / ".join(
                                  _fmt(_get(t, f"requests.{k}"))
                                  for k in ("finished", "rejected", "abandoned", "unfinished"))}})

    def rank(n):
        att, cost = _num(topos[n].get("slo_attainment")), _num(topos[n].get("cost_per_million_output_tokens_usd"))
        return (att if att is not None else -1.0, -(cost if cost is not None else float("inf")))
    best = max(names, key=rank) if names else None

    figures: list = []
    first = df.drop_duplicates("request_id")
    wl = _workload(first, figures)
    _cdfs(df, names, slo, figures)
    _components(df, names, figures)
    if ts is not None and len(ts):
        _timeseries(ts, names, figures)
    _kv_transfers(df, topos, figures)
    _faults(topos, figures)
    _prefix(topos, figures)

    _log("rendering HTML...")
    model = sc.get("model")
    if isinstance(model, dict):
        model = model.get("name") or model.get("preset") or json.dumps(model)
    env = Environment(loader=FileSystemLoader(Path(__file__).parent / "templates"),
                      autoescape=select_autoescape(["html", "j2"]))
    html = env.get_template("report.html.j2").render(
        name=sc.get("name") or out_dir.name, description=sc.get("description") or "", model=model,
        seed=sc.get("seed"), version=summary.get("pdsim_version"), wall_s=_num(summary.get("wall_s")),
        slo=slo, target=target, wl=wl, fmt=_fmt, headers=[h for _, h in SUMMARY_KEYS],
        rows=rows, best=best, figures=figures)
    path = out_dir / "report.html"
    path.write_text(html, encoding="utf-8")
    _log(f"wrote {path} ({path.stat().st_size / 1024:.0f} KiB)")
    return path
