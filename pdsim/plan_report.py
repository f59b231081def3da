"""plan.html: the verdict first, then the ranked table (status first), cost and GPUs against goodput with
the target rate and the winner marked, and SLO attainment vs request rate for the Pareto front and the
winner only (every other config's points are in a table).

Self-contained like report.html: inline CSS and SVG, one small inline script that sorts tables.
"""
from __future__ import annotations

from pathlib import Path

from .charts import CSS, SORT_JS, esc, finite, line_chart, num, pct, seconds, table, usd


def _cell(col: str, v):
    """Human text for a plan.csv column, with the exact value kept for sorting."""
    if isinstance(v, bool):
        return ("yes" if v else "", int(v))
    x = finite(v)
    if x is None:
        return ("–" if v is None or v == "" else str(v), None if not isinstance(v, str) else v)
    if col.endswith("_s"):
        return (seconds(x), x)
    if col.startswith("attainment") or col.endswith("attainment"):
        return (pct(x), x)
    if col == "usd_per_hour":
        return (usd(x), x)
    return (num(x), x)


HEADERS = {"rank": "#", "config": "config", "gpus": "GPUs", "usd_per_hour": "$/hour", "goodput": "goodput req/s",
           "goodput_per_gpu": "req/s per GPU", "goodput_per_usd_hour": "req/s per $/h",
           "attainment_at_target": "attainment at target", "ttft_p_at_target_s": "TTFT pXX at target",
           "tpot_p_at_target_s": "TPOT pXX at target", "bound_rate": "analytic bound req/s", "pareto": "Pareto",
           "status": "status", "note": "note", "margin": "margin ×",
           "long_run_attainment": "long run [95% CI]"}


# shown inside another cell on the page (plan.csv keeps them as columns): the early-stop kind as a
# >= / <= before the attainment at target, the long run's 95% interval after its attainment
FOLDED = ("at_target_early_stop", "long_run_ci", "judged_ttft_s", "judged_tpot_s", "long_run_attainment_at_p90_error")


def _ranked_table(result: dict, cols: list[str]) -> str:
    cols = ["status"] + [c for c in cols if c not in ("status",) + FOLDED]   # status first: what to act on
    # with goodput.error_margin each config's own bounds go under its name (every config's differ)
    tight = result.get("error_margin") not in (None, "none")
    slo = result["slo"]
    heads = [HEADERS.get(c, c.replace("_", " ")).replace("TTFT pXX", f"TTFT p{num(slo.get('ttft_percentile', 90))}")
             .replace("TPOT pXX", f"TPOT p{num(slo.get('tpot_percentile', 90))}") for c in cols]
    rows, attrs = [], []
    for r in result["rows"]:
        cells = []
        for c in cols:
            v = r.get(c)
            if c == "status":
                ok = r.get("meets")
                cells.append((str(v or "–") + (" ★ winner" if r["config"] == result["winner"] else ""), str(v or ""),
                              f' class="{"pass" if ok else "fail"}"'))
            elif c == "config" and tight and r.get("judged_ttft_s") is not None:
                cells.append((f"{v} (judged at TTFT ≤ {seconds(r['judged_ttft_s'])}, TPOT ≤ "
                              f"{seconds(r.get('judged_tpot_s'))})", str(v), ' class="text"'))
            elif c in ("config", "note"):
                cells.append((str(v or ""), str(v or ""), ' class="text"'))
            elif c == "attainment_at_target" and r.get("at_target_early_stop") in ("pass", "fail"):
                # the run stopped once its verdict was certain: the attainment is a bound
                text, value = _cell(c, v)
                cells.append(({"pass": "≥", "fail": "≤"}[r["at_target_early_stop"]] + text, value))
            elif c == "long_run_attainment" and isinstance(r.get("long_run_ci"), (list, tuple)) and \
                    len(r["long_run_ci"]) == 2:
                text, value = _cell(c, v)
                lo, hi = r["long_run_ci"]
                e = r.get("long_run_attainment_at_p90_error")
                cells.append((f"{text} [{pct(lo)}, {pct(hi)}]" + (f"; at p90 error {pct(e)}" if e is not None else ""),
                              value))
            else:
                cells.append(_cell(c, v))
        rows.append(cells)
        attrs.append(f' data-config="{esc(r["config"])}"' + (' class="best"' if r["config"] == result["winner"] else ""))
    return table(heads, rows, "plan", attrs)


def _cost_charts(result: dict) -> str:
    rows = [r for r in result["rows"] if finite(r.get("goodput")) and r["goodput"] > 0]
    if not rows:
        return '<p class="note">No config reached a positive goodput: nothing to plot.</p>'
    target = finite(result.get("target_rate"))
    win = next((r for r in rows if r["config"] == result["winner"]), None)
    out = []
    for ykey, ylabel, yfmt in (("usd_per_hour", "cost ($ per hour)", usd), ("gpus", "GPUs", num)):
        front = sorted((r for r in rows if r.get("pareto")), key=lambda r: r["goodput"])
        series = [{"name": "every config", "x": [r["goodput"] for r in rows], "y": [r[ykey] for r in rows],
                   "i": 0, "points": True, "line": False}]
        if front:
            series.append({"name": "Pareto front (most goodput per $/h)", "x": [r["goodput"] for r in front],
                           "y": [r[ykey] for r in front], "i": 1, "points": True})
        marks = [{"x": win["goodput"], "y": win[ykey], "label": f"winner: {win['config']}", "i": 2}] if win else []
        vl = [(target, f"target {num(target)} req/s")] if target else []
        out.append(f"<h3>{esc(ylabel)} vs goodput</h3>" + line_chart(
            series, "goodput (requests/s meeting the SLO)", ylabel, yfmt=yfmt, vlines=vl, marks=marks,
            xlim=(0.0, max(max(r["goodput"] for r in rows), target or 0) * 1.05),
            height=320, title=f"{ylabel} vs goodput"))
    return "".join(out)


def _attainment_chart(result: dict) -> tuple[str, str]:
    """Curves for the Pareto front and the winner; every point of every config in a table."""
    shown = [r for r in result["rows"] if r["points"] and (r.get("pareto") or r["config"] == result["winner"])]
    series = []
    for i, r in enumerate(shown):
        xs = sorted(float(k) for k in r["points"])
        pts = {float(k): v for k, v in r["points"].items()}
        series.append({"name": r["config"] + (" (winner)" if r["config"] == result["winner"] else ""),
                       "x": xs, "y": [pts[x]["attainment"] for x in xs], "i": i, "points": True})
    slo = result["slo"]
    target = finite(result.get("target_rate"))
    chart = line_chart(series, "arrival rate (requests/s)", "SLO attainment", yfmt=pct, ylim=(0, 1.0),
                       hlines=[(slo["attainment_target"], f"target {pct(slo['attainment_target'])}")],
                       vlines=[(target, f"target {num(target)} req/s")] if target else [],
                       title="SLO attainment vs rate") if series else '<p class="note">No simulations.</p>'
    recs = []
    for r in result["rows"]:
        for k, v in sorted(r["points"].items(), key=lambda kv: float(kv[0])):
            recs.append([(r["config"], r["config"], ' class="text"'), (num(float(k)), float(k)), (pct(v.get("attainment")), v.get("attainment")),
                         (pct(v.get("worst_seed_attainment")), v.get("worst_seed_attainment")),
                         (seconds(v.get("ttft_p")), v.get("ttft_p")), (seconds(v.get("tpot_p")), v.get("tpot_p")),
                         # pass: stopped once it could not miss (a lower bound); fail: could not pass (upper bound)
                         (str(v.get("early_stop") or ""), str(v.get("early_stop") or ""))])
    tab = table(["config", "rate req/s", "attainment", "worst seed", "TTFT pXX", "TPOT pXX", "early stop"], recs,
                "points") \
        if recs else ""
    return chart, tab


def _slo_text(slo: dict) -> str:
    """The SLO as its mode judges it (metrics.slo_verdict): a share of requests, or two percentiles."""
    if slo.get("mode") == "percentile":
        return (f"TTFT p{num(slo.get('ttft_percentile', 90))} ≤ {seconds(slo['ttft_s'])} and "
                f"TPOT p{num(slo.get('tpot_percentile', 90))} ≤ {seconds(slo['tpot_s'])} (percentile mode)")
    return (f"TTFT ≤ {seconds(slo['ttft_s'])} and TPOT ≤ {seconds(slo['tpot_s'])} for at least "
            f"{pct(slo['attainment_target'])} of requests")


def _verdict(result: dict) -> str:
    slo = result["slo"]
    target = finite(result.get("target_rate"))
    rows = result["rows"]
    bounds = _slo_text(slo)
    meets = [r for r in rows if r.get("meets")]
    margin = result.get("error_margin")
    tight = margin not in (None, "none")
    s = [f"{len(meets)} of {len(rows)} configurations meet the SLO ({bounds})"
         + (f" at {num(target)} requests/s" if target else "")
         + (f", each judged at these bounds tightened by goodput.error_margin "
            f"({esc(margin if isinstance(margin, str) else 'fixed')}: the table's judged TTFT/TPOT columns)"
            if tight else "") + "."]
    if result["winner"]:
        w = next(r for r in rows if r["config"] == result["winner"])
        s.append(f"Recommended ({result['objective']}): {w['config']} with {num(w['gpus'])} GPUs at "
                 f"{usd(w['usd_per_hour'])}/h, goodput {num(w['goodput'])} requests/s"
                 + (f" ({num(w['goodput'] / target)}× the target)" if target and w.get("goodput") else "")
                 + ". Ready to run: winner.yaml.")
        if w.get("expected_error"):
            from .validate import bands_text
            s.append(f"Its expected error against measured runs, which its goodput inherits: "
                     f"{esc(bands_text(w['expected_error']))}.")
        if w.get("long_run_attainment_at_p90_error") is not None:
            s.append(f"Its long run judged at the bounds divided by pdsim's p90 measured/simulated latency over "
                     f"its validation runs: attainment {pct(w['long_run_attainment_at_p90_error'])} (target "
                     f"{pct(result['slo']['attainment_target'])}; goodput.error_margin: p90 sizes for that).")
        if w.get("error_margin"):
            m = w["error_margin"]
            s.append(f"It was judged at TTFT ≤ {seconds(w['judged_ttft_s'])} and TPOT ≤ {seconds(w['judged_tpot_s'])}: "
                     f"the SLO's bounds divided by {num(m['ttft_factor'])} and {num(m['tpot_factor'])} "
                     f"(goodput.error_margin, {esc(m['source'])}), so its goodput holds if real latencies exceed "
                     "pdsim's by that much.")
        nxt = next((r for r in rows if r is not w and r.get("meets")), None)
        if nxt is not None:
            s.append(f"Runner-up: {nxt['config']} ({num(nxt['gpus'])} GPUs, {usd(nxt['usd_per_hour'])}/h, goodput "
                     f"{num(nxt['goodput'])} requests/s).")
    else:
        s.append("No configuration meets the SLO within the budget; the closest are at the top of the table and "
                 "the note says which SLO each misses.")
    return " ".join(s)


def _judging(result: dict) -> str:
    """How each rate was judged, and what each shortcut saved."""
    txt = []
    if result.get("warmup_fraction") is not None:
        txt.append(f"The first {result['warmup_fraction']:.0%} of each run's requests (the cluster filling up) are "
                   "simulated but not judged.")
    if result.get("confirm_factor"):
        txt.append(f"Before a configuration is recommended it is re-simulated on fresh seeds over at least "
                   f"{result['confirm_factor']:g}x the search window (<i>long run</i>: its attainment, with the 95% interval "
                   "of 20 batch means); one that fails is demoted. <i>margin</i> = goodput / target rate.")
    sk = result.get("skipped")
    if sk:
        txt.append(f"Simulations saved: {sk.get('infeasible', 0)} configs infeasible alone (a lone request misses the "
                   f"SLO), {sk['pruned_by_bound']} pruned by the analytic bound, {sk['dominated']} "
                   f"dominated, {sk['worst_seed']} seeds skipped after a failed seed, {sk['early_stop_pass']} runs "
                   f"stopped once they could not miss and {sk['early_stop_fail']} once they could not pass "
                   f"({sk['requests_not_simulated']:,} of {sk['requests_total']:,} requests not simulated; "
                   "their attainments are bounds).")
    return f"<p class=note>{' '.join(txt)}</p>" if txt else ""


def build_plan_report(result: dict, out: Path) -> Path:
    from .plan import TABLE_COLS
    slo = result["slo"]
    att_chart, att_table = _attainment_chart(result)
    parts = [f'<!doctype html><html lang="en"><head><meta charset="utf-8"><meta name="viewport" '
             f'content="width=device-width, initial-scale=1"><title>pdsim plan {esc(result["plan"])}</title>'
             f"<style>{CSS}</style></head><body>",
             f"<h1>Capacity plan: {esc(result['plan'])}</h1>",
             f'<p class="verdict" id="verdict">{esc(_verdict(result))}</p>',
             f'<p class="meta">Objective <b>{esc(result["objective"])}</b>'
             + (f", target rate {num(result['target_rate'])} requests/s" if result["target_rate"] else "")
             + f". SLO: {_slo_text(slo)}. Goodput bracket tolerance {pct(result['tolerance'])}, "
             f"{num(result['seeds'])} seeds per rate; {num(result['simulations'])} simulations run, "
             f"{num(result['cached'])} from cache, {seconds(result['wall_s'])} wall. pdsim "
             f"{esc(result['pdsim_version'])}.</p>",
             _judging(result),
             "<h2>Ranked configurations</h2>", _ranked_table(result, [c for c in TABLE_COLS if c != "expected_error"]),
             '<p class="note">Click a header to sort. Status first: <i>ok</i> configs meet the SLO; the others say '
             "what they miss.</p>",
             "<h2>Cost and GPUs vs goodput</h2>", _cost_charts(result),
             "<h2>SLO attainment vs request rate (Pareto front and winner)</h2>", att_chart,
             '<details><summary>every simulated point of every config</summary>' + att_table + "</details>"]
    if result["excluded"]:
        ex = result["excluded"]
        keys = list(ex[0].keys()) if isinstance(ex[0], dict) else ["excluded"]
        parts += ["<h2>Excluded before simulation</h2>",
                  table(keys, [[str(e.get(k, "")) if isinstance(e, dict) else str(e) for k in keys] for e in ex],
                        "excluded")]
    parts += [SORT_JS, "</body></html>"]
    path = out / "plan.html"
    path.write_text("\n".join(parts), encoding="utf-8")
    return path
