"""A self-contained HTML page from a run's outputs: inline CSS and PNG images, no scripts, no URLs."""
from __future__ import annotations

import base64
import io
import json
import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
from jinja2 import Environment, FileSystemLoader, select_autoescape  # noqa: E402

STYLES = ["-", "--", "-.", ":"]
COLORS = ["#0072B2", "#D55E00", "#009E73", "#CC79A7", "#E69F00", "#56B4E9"]   # Okabe-Ito, colour-blind safe


def _png(fig) -> str:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=80, bbox_inches="tight")
    plt.close(fig)
    return base64.b64encode(buf.getvalue()).decode()


def _get(d: dict, dotted: str):
    for k in dotted.split("."):
        d = d.get(k) if isinstance(d, dict) else None
    return d


def _fmt(x) -> str:
    return "-" if x is None else (f"{x:.6g}" if isinstance(x, float) else str(x))


def build_report(out_dir: Path) -> Path:
    out_dir = Path(out_dir)
    summary = json.loads((out_dir / "summary.json").read_text())
    df = pd.read_csv(out_dir / "requests.csv")
    ts = pd.read_csv(out_dir / "timeseries.csv") if (out_dir / "timeseries.csv").stat().st_size > 1 else None
    sc, topos = summary["scenario"], summary["topologies"]
    slo = sc["slo"]
    keys = ["ttft_s.p50", "ttft_s.p90", "ttft_s.p99", "tpot_s.p50", "tpot_s.p90", "tpot_s.p99", "e2e_s.p90",
            "slo_attainment", "throughput.output_tokens_per_s_per_gpu", "cost_per_million_output_tokens_usd"]
    rows = [{"name": n, "gpus": t["gpus"], "slo_met": t["slo_met"], **{k: _fmt(_get(t, k)) for k in keys}}
            for n, t in topos.items()]
    best = max(topos, key=lambda n: (topos[n]["slo_attainment"] or 0,
                                     -(topos[n]["cost_per_million_output_tokens_usd"] or float("inf"))))
    figures = []
    print("report: plotting CDFs...", file=sys.stderr)
    for col, bound, label in (("ttft_s", slo["ttft_s"], "TTFT (s)"), ("tpot_s", slo["tpot_s"], "TPOT (s)")):
        fig, ax = plt.subplots(figsize=(7, 3.5))
        for i, (name, g) in enumerate(df.groupby("topology", sort=False)):
            x = np.sort(g[col].dropna().to_numpy())
            if len(x):
                ax.plot(x, np.arange(1, len(x) + 1) / len(x), STYLES[i % 4], color=COLORS[i % 6], label=name)
        ax.axvline(bound, color="k", linestyle=":", label=f"SLO {bound} s")
        ax.set_xscale("log")
        ax.set_xlabel(label)
        ax.set_ylabel("fraction of requests")
        ax.legend(fontsize=8)
        figures.append({"title": f"CDF of {label}", "png": _png(fig), "table": None})
    print("report: plotting latency components...", file=sys.stderr)
    fin = df[df.status == "finished"].copy()
    fin["kv_s"] = fin.kv_wait_s.fillna(0) + fin.kv_transfer_s.fillna(0)
    fin["decode_s"] = fin.e2e_s - fin.queue_s - fin.prefill_s - fin.kv_s
    comp = fin.groupby("topology", sort=False)[["queue_s", "prefill_s", "kv_s", "decode_s"]].mean()
    fig, ax = plt.subplots(figsize=(7, 3))
    left = np.zeros(len(comp))
    for i, c in enumerate(comp.columns):
        ax.barh(comp.index, comp[c], left=left, color=COLORS[i], hatch=["", "//", "..", "xx"][i], label=c)
        left += comp[c].to_numpy()
    ax.set_xlabel("mean seconds per request")
    ax.legend(fontsize=8)
    figures.append({"title": "Where the time goes (mean E2E components)", "png": _png(fig),
                    "table": comp.to_html(float_format="%.6g", classes="components")})
    if ts is not None and len(ts):
        print("report: plotting time series...", file=sys.stderr)
        g = ts.groupby(["topology", "pool", "t_s"], sort=False)[["busy_fraction", "mfu", "mbu", "batch_size"]].mean()
        fig, axes = plt.subplots(4, 1, figsize=(8, 8), sharex=True)
        for i, ((topo, pool), part) in enumerate(g.groupby(level=[0, 1], sort=False)):
            t = part.index.get_level_values("t_s")
            for ax, c in zip(axes, part.columns):
                ax.plot(t, part[c], STYLES[i % 4], color=COLORS[i % 6], label=f"{topo}/{pool}")
                ax.set_ylabel(c)
        axes[0].legend(fontsize=7)
        axes[-1].set_xlabel("simulated time (s)")
        per_pool = ts.groupby(["topology", "pool"])[["busy_fraction", "mfu", "mbu", "batch_size"]].mean()
        figures.append({"title": "Utilization over time per pool (mean over instances)", "png": _png(fig),
                        "table": per_pool.to_html(float_format="%.4g", classes="utilization")})
    env = Environment(loader=FileSystemLoader(Path(__file__).parent / "templates"),
                      autoescape=select_autoescape(["html", "j2"]))
    html = env.get_template("report.html.j2").render(
        name=sc["name"], description=sc.get("description", ""), model=sc["model"] if isinstance(sc["model"], str)
        else sc["model"].get("name"), seed=sc["seed"], version=summary.get("pdsim_version"), slo=slo,
        n_requests=int(df.request_id.nunique()), rows=rows, best=best, figures=figures)
    path = out_dir / "report.html"
    path.write_text(html, encoding="utf-8")
    return path
