"""plan.html: the ranked table, SLO attainment vs request rate per config, and the cost/goodput frontier.

Self-contained like report.html (inline CSS and PNG, no scripts or URLs); every plot's numbers
are in a table below it.
"""
from __future__ import annotations

import html
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import pandas as pd  # noqa: E402

from .report import COLORS, STYLES, _png, _table  # noqa: E402

CSS = """body{font:14px/1.4 system-ui,sans-serif;margin:2em;max-width:1200px;color:#111}
table{border-collapse:collapse;margin:.5em 0 1.5em}td,th{border:1px solid #ccc;padding:2px 6px;text-align:right}
th{background:#eee}td:nth-child(2){text-align:left}.win{background:#e6f4ea}.fail{color:#a00}
img{max-width:100%}h2{margin-top:1.6em}.note{color:#555}"""


def _attainment_plot(result: dict) -> tuple[str, pd.DataFrame]:
    fig, ax = plt.subplots(figsize=(9, 4.5))
    recs = []
    shown = [r for r in result["rows"] if len(r["points"]) > 0][:12]
    for i, r in enumerate(shown):
        xs = [float(k) for k in r["points"]]
        ys = [v["attainment"] for v in r["points"].values()]
        ax.plot(xs, ys, STYLES[i % len(STYLES)], marker="o", color=COLORS[i % len(COLORS)], label=r["config"])
        recs += [{"config": r["config"], "rate_req_s": x, "slo_attainment": y,
                  # pass: stopped once it could not miss (a lower bound); fail: could not pass (upper bound)
                  "early_stop": v.get("early_stop")} for x, y, v in zip(xs, ys, r["points"].values())]
    ax.axhline(result["slo"]["attainment_target"], color="k", lw=1, ls=":", label="attainment target")
    if result["target_rate"]:
        ax.axvline(result["target_rate"], color="grey", lw=1, ls="--", label="target rate")
    ax.set_xlabel("arrival rate (requests/s)")
    ax.set_ylabel("SLO attainment")
    ax.set_ylim(-0.02, 1.02)
    ax.legend(fontsize=7, ncol=2)
    ax.grid(alpha=0.3)
    return _png(fig), pd.DataFrame(recs)


def _frontier_plot(result: dict) -> str:
    fig, ax = plt.subplots(figsize=(7, 4.5))
    rows = [r for r in result["rows"] if r["goodput"] is not None]
    ax.scatter([r["usd_per_hour"] for r in rows], [r["goodput"] for r in rows], color=COLORS[0], marker="o",
               label="configs")
    front = [r for r in sorted(rows, key=lambda r: r["usd_per_hour"]) if r["pareto"]]
    ax.plot([r["usd_per_hour"] for r in front], [r["goodput"] for r in front], "--", color=COLORS[1], marker="s",
            label="Pareto frontier")
    for r in front:
        ax.annotate(r["config"], (r["usd_per_hour"], r["goodput"]), fontsize=7, xytext=(3, 3),
                    textcoords="offset points")
    ax.set_xlabel("cost ($/hour)")
    ax.set_ylabel("goodput (requests/s)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    return _png(fig)


def _judging(result: dict) -> str:
    """How each rate was judged, and what each shortcut saved."""
    txt = []
    if result.get("warmup_fraction") is not None:
        txt.append(f"The first {result['warmup_fraction']:.0%} of each run's requests (the cluster filling up) are "
                   "simulated but not judged.")
    if result.get("confirm_factor"):
        txt.append(f"Before a configuration is recommended it is re-simulated on fresh seeds over at least "
                   f"{result['confirm_factor']:g}x the search window (<i>long_run_attainment</i>, with the 95% interval "
                   "of 20 batch means); one that fails is demoted. <i>margin</i> = goodput / target rate.")
    sk = result.get("skipped")
    if sk:
        txt.append(f"Simulations saved: {sk['pruned_by_bound']} configs pruned by analytic bounds, {sk['dominated']} "
                   f"dominated, {sk['worst_seed']} seeds skipped after a failed seed, {sk['early_stop_pass']} runs "
                   f"stopped once they could not miss and {sk['early_stop_fail']} once they could not pass "
                   f"({sk['requests_not_simulated']:,} of {sk['requests_total']:,} requests not simulated; "
                   "their attainments are bounds).")
    return f"<p class=note>{' '.join(txt)}</p>" if txt else ""


def build_plan_report(result: dict, out: Path) -> Path:
    from .plan import TABLE_COLS
    att_png, att_df = _attainment_plot(result)
    fr_png = _frontier_plot(result)
    table = pd.DataFrame([{k: r.get(k) for k in TABLE_COLS} for r in result["rows"]])
    win = result["winner"]
    head = (f"<p><b>Recommended:</b> {html.escape(win)} (see winner.yaml)</p>" if win else
            "<p class=fail><b>No configuration meets the SLO within the budget.</b> The closest are at the top of "
            "the table; <i>note</i> says which SLO each misses.</p>")
    slo = result["slo"]
    parts = [f"<!doctype html><html><head><meta charset=utf-8><title>pdsim plan {html.escape(result['plan'])}</title>"
             f"<style>{CSS}</style></head><body>",
             f"<h1>Capacity plan: {html.escape(result['plan'])}</h1>",
             f"<p>Objective <b>{result['objective']}</b>"
             + (f", target rate {result['target_rate']:g} req/s" if result["target_rate"] else "")
             + f". SLO: TTFT &le; {slo['ttft_s']} s and TPOT &le; {slo['tpot_s']} s for at least "
             f"{slo['attainment_target']:.0%} of requests. Goodput bracket tolerance {result['tolerance']:.0%}, "
             f"{result['seeds']} seeds per rate; {result['simulations']} simulations run, {result['cached']} "
             f"from cache, {result['wall_s']:.1f} s wall. pdsim {result['pdsim_version']}.</p>",
             _judging(result), head,
             "<h2>Ranked configurations</h2>", _table(table, "plan", index=False),
             "<h2>SLO attainment vs request rate</h2>", f'<img alt="attainment vs rate" src="data:image/png;base64,{att_png}">',
             _table(att_df, "points", index=False) if len(att_df) else "<p>No simulations.</p>",
             "<h2>Cost vs goodput</h2>", f'<img alt="frontier" src="data:image/png;base64,{fr_png}">']
    if result["excluded"]:
        parts += ["<h2>Excluded before simulation</h2>", _table(pd.DataFrame(result["excluded"]), "excluded", False)]
    parts.append("</body></html>")
    path = out / "plan.html"
    path.write_text("\n".join(parts))
    return path
