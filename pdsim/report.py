"""report.html: a page a capacity planner acts on at a glance.  Self-contained: inline CSS, inline SVG
charts and one small inline script that sorts tables (the page reads the same without it); no URLs.

``build_report(out_dir)`` reads the requests table (``requests.csv`` or ``requests.parquet``, the one
summary.json names), ``summary.json`` and ``timeseries.csv`` from ``out_dir`` (or takes them in memory from
``write_outputs``) and writes ``out_dir/report.html``.  At the top a verdict
written from the numbers: which topologies meet the SLO, with how many GPUs at what cost, which bound binds
each one and by how much, and why a topology misses.  The summary table (``class="summary"``) has one
``<tr data-topology=NAME>`` per topology and cells with ``data-key="ttft_s.p90"`` etc. whose ``data-value``
holds the exact summary.json value; the text is for people (25.6 ms, 3 significant figures).
"""
from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import numpy as np

from .charts import CSS, SORT_JS, esc, finite, legend, line_chart, num, pct, seconds, stacked_bars, table, usd

# The summary-table columns: (data-key, header, formatter).  Values are looked up in summary.json by dotted key.
SUMMARY_KEYS = [
    ("gpus", "GPUs", num),
    ("ttft_s.p50", "TTFT p50", seconds), ("ttft_s.p90", "TTFT p90", seconds), ("ttft_s.p99", "TTFT p99", seconds),
    ("tpot_s.p50", "TPOT p50", seconds), ("tpot_s.p90", "TPOT p90", seconds), ("tpot_s.p99", "TPOT p99", seconds),
    ("e2e_s.p90", "E2E p90", seconds), ("e2e_s.p99", "E2E p99", seconds),
    ("slo_attainment", "SLO attain\u00adment", pct),
    ("throughput.output_tokens_per_s_per_gpu", "out tok/s per GPU", num),
    ("cost_per_million_output_tokens_usd", "$ per M out tok", usd),
]
MAX_CDF_POINTS = 300        # a plotted CDF needs no more; 10k-request runs stay fast and small
BATCHES = 10                # batch means over arrival order: the run-to-run noise of an attainment

_QUIET = [False]


def _log(msg: str) -> None:
    if not _QUIET[0]:
        print(f"report: {msg}", file=sys.stderr, flush=True)


def _get(d, dotted: str):
    for k in dotted.split("."):
        d = d.get(k) if isinstance(d, dict) else None
    return d


# --- the numbers behind the verdict -----------------------------------------------------------
def _quantile(x: np.ndarray, q: float) -> float:
    """The q-quantile (0..1) where +inf stands for 'never happened' (no first token): may be inf."""
    if len(x) == 0:
        return float("nan")
    v = float(np.quantile(np.minimum(x, 1e300), q))
    return float("inf") if v >= 1e299 else v


def _ecdf(x: np.ndarray, w: np.ndarray | None = None) -> tuple[list, list]:
    """Sorted values and cumulative fractions, downsampled to MAX_CDF_POINTS."""
    order = np.argsort(x, kind="stable")
    x = x[order]
    cum = np.cumsum(w[order]) / w.sum() if w is not None else np.arange(1, len(x) + 1) / len(x)
    if len(x) > MAX_CDF_POINTS:
        idx = np.unique(np.linspace(0, len(x) - 1, MAX_CDF_POINTS).round().astype(int))
        x, cum = x[idx], cum[idx]
    return x.tolist(), cum.tolist()


def analyze(topos: dict, frames: dict, slo: dict, scenario_topos: dict | None = None) -> dict:
    """Per topology: attainment and its run-to-run noise, each bound's measured percentile and margin,
    the binding bound, miss shares and a list of plain-language reasons.

    frames: topology -> dict of numpy columns (status, ttft_s, tpot_s, queue_s, prefill_s, kv_s,
    decode_queue_s, arrival_s).  A request with no first token counts as an infinite TTFT."""
    target = finite(slo.get("attainment_target"))
    out = {}
    for name, t in topos.items():
        f = frames.get(name)
        a = {"name": name, "kind": t.get("kind"), "attainment": finite(t.get("slo_attainment")), "target": target}
        # the run's own verdict when it has one (it follows slo.mode: attainment or percentile)
        a["passes"] = t["slo_met"] if isinstance(t.get("slo_met"), bool) else \
            ((a["attainment"] >= target) if a["attainment"] is not None and target is not None else None)
        semantic = t.get("slo") if isinstance(t.get("slo"), dict) else {}
        bounds = {}
        for key, label in (("ttft", "TTFT"), ("tpot", "TPOT")):
            bound = finite(slo.get(f"{key}_s"))
            p = finite(slo.get(f"{key}_percentile")) or 90.0
            measured = None
            sb = (semantic.get("bounds") or {}).get(key) if isinstance(semantic.get("bounds"), dict) else None
            if isinstance(sb, dict) and (sb.get("unserved") or finite(sb.get("measured_s")) is not None):
                # the run's own nearest-rank percentile (metrics.slo_verdict): the report shows the same number
                measured = float("inf") if sb.get("unserved") else finite(sb["measured_s"])
            elif f is not None:
                x = f["ttft_inf"] if key == "ttft" else f["tpot_s"][np.isfinite(f["tpot_s"])]
                measured = _quantile(x, p / 100) if len(x) else None
            if measured is None or measured != measured:
                measured = finite(_get(t, f"{key}_s.p{int(p)}")) if float(p).is_integer() else None
            miss = None
            if f is not None and bound is not None and len(f["status"]):
                if key == "ttft":
                    miss = float((~(f["ttft_inf"] <= bound)).mean())
                else:
                    miss = float(((f["status"] == "finished") & (f["tpot_s"] > bound)).mean())
            ratio = measured / bound if measured is not None and bound else None
            bounds[key] = {"label": label, "percentile": p, "bound_s": bound, "measured_s": measured,
                           "ratio": ratio, "miss_share": miss}
        a["bounds"] = bounds
        given = semantic.get("binding") or t.get("slo_binding")          # the semantics branch's own, if any
        if isinstance(given, str) and given.lower().removesuffix("_s") in bounds:
            a["binding"] = given.lower().removesuffix("_s")
        else:
            ranked = [k for k in bounds if bounds[k]["ratio"] is not None]
            a["binding"] = max(ranked, key=lambda k: bounds[k]["ratio"]) if ranked else None
        a["mode"] = semantic.get("mode") or slo.get("mode") or "attainment"
        # run-to-run noise of the attainment: standard error of batch means over arrival order
        a["noise"] = None
        if f is not None and len(f["ok"]) >= 2 * BATCHES:
            means = [float(b.mean()) for b in np.array_split(f["ok"][np.argsort(f["arrival_s"], kind="stable")],
                                                              BATCHES)]
            a["noise"] = float(np.std(means, ddof=1) / math.sqrt(BATCHES))
        a["reasons"] = _reasons(name, t, f, a, (scenario_topos or {}).get(name) or {}, topos)
        out[name] = a
    return out


def _pools_busy(t: dict) -> dict:
    return {p: finite(u.get("busy_fraction")) for p, u in (t.get("utilization") or {}).items()}


def _reasons(name, t, f, a, spec: dict, topos: dict) -> list[str]:
    """Why the binding bound is where it is, from the request components and the pools' utilization."""
    why = []
    b = a.get("binding")
    busy = _pools_busy(t)
    rej = t.get("rejected_by_reason") or {}
    if rej:
        why.append("rejected " + ", ".join(f"{num(v)} ({k})" for k, v in rej.items()))
    if f is None or b is None:
        return why
    fin = f["status"] == "finished"
    if b == "ttft" and fin.any():
        q90 = float(np.nanquantile(f["queue_s"][fin], 0.9))
        pf90 = float(np.nanquantile(f["prefill_s"][fin], 0.9))
        pool = "prefill" if "prefill" in busy else next(iter(busy), None)
        load = f" ({pool} pool {pct(busy[pool])} busy)" if pool and busy.get(pool) is not None else ""
        if q90 >= pf90:
            why.append(f"requests queue for prefill: p90 wait {seconds(q90)} vs p90 prefill compute "
                       f"{seconds(pf90)}{load}")
        else:
            why.append(f"prefill compute itself is long: p90 {seconds(pf90)} (long prompts; more prefill "
                       f"GPUs or TP would help){load}")
    if b == "tpot" and fin.any():
        tp = f["tpot_s"][fin & np.isfinite(f["tpot_s"])]
        lo, hi = (float(np.quantile(tp, 0.1)), float(np.quantile(tp, 0.9))) if len(tp) else (None, None)
        if lo is not None and hi > 1.3 * lo:
            if t.get("kind") == "colocated":
                chunk = (spec.get("chunked_prefill") or {}).get("token_budget") if isinstance(spec, dict) else None
                if chunk:
                    why.append(f"prefill chunks of up to {num(chunk)} tokens share decode steps: TPOT p10 "
                               f"{seconds(lo)} but p90 {seconds(hi)}")
                else:
                    why.append(f"prefills stall decodes: a colocated replica runs each new prompt's whole prefill "
                               f"between its decode steps (TPOT p10 {seconds(lo)}, p90 {seconds(hi)})")
            else:
                why.append(f"decode steps vary: TPOT p10 {seconds(lo)}, p90 {seconds(hi)} (batch size and "
                           "context grow under load)")
        elif lo is not None:
            why.append(f"every decode step itself is slow: TPOT p10 {seconds(lo)} is already near p90 "
                       f"{seconds(hi)} (no interference to remove; a faster device, more TP or smaller batches)")
        if t.get("kind") == "colocated":
            others = [(n, finite(_get(o, "tpot_s.p90"))) for n, o in topos.items()
                      if o.get("kind") == "disaggregated" and finite(_get(o, "tpot_s.p90")) is not None]
            mine = finite(_get(t, "tpot_s.p90"))
            if others and mine is not None:
                n2, v2 = min(others, key=lambda kv: kv[1])
                if v2 < mine:
                    why.append(f"{n2}, with no prefill in its decode steps, has TPOT p90 {seconds(v2)}")
        else:
            dq = f["decode_queue_s"][fin]
            kv = f["kv_s"][fin]
            if np.isfinite(dq).any() or np.isfinite(kv).any():
                why.append(f"KV transfer adds {seconds(float(np.nanmean(kv)))} and decode queueing "
                           f"{seconds(float(np.nanmean(dq)))} per request on average")
            if busy.get("decode") is not None:
                why.append(f"decode pool {pct(busy['decode'])} busy" + (" (more decode instances would shrink its "
                                                                        "batches)" if busy["decode"] > 0.9 else ""))
    if t.get("preemptions"):
        why.append(f"{num(t['preemptions'])} preemptions (KV cache full)")
    return why


def _bound_text(a: dict, key: str | None = None) -> str:
    key = key or a.get("binding")
    if key is None:
        return "no bound measured"
    b = a["bounds"][key]
    m, bound = b["measured_s"], b["bound_s"]
    head = f"{b['label']} p{num(b['percentile'])} {seconds(m) if m != float('inf') else 'never (no first token)'} " \
           f"vs {seconds(bound)} bound"
    if b["ratio"] is None or m == float("inf"):
        return head
    r = b["ratio"]
    return head + (f" ({pct(1 - r)} headroom)" if r <= 1 else f" ({num((r - 1) * 100)}% over)")


def pick_best(analysis: dict, topos: dict) -> tuple[str | None, str]:
    """The topology to recommend, or None, and why.  Only a config that passes can be best; among those
    the cheapest per hour; configs within 1% of that price are told apart only by an attainment lead
    larger than twice its run-to-run noise (batch-means standard error), else it is a tie."""
    passing = [n for n, a in analysis.items() if a["passes"]]
    if not passing:
        return None, "no topology meets the SLO, so none is marked best"
    cost = {n: finite(topos[n].get("cost_per_hour_usd")) for n in passing}
    cheapest = min(cost[n] if cost[n] is not None else math.inf for n in passing)
    tied = [n for n in passing if (cost[n] if cost[n] is not None else math.inf) <= cheapest * 1.01 + 1e-12]
    if len(tied) == 1:
        n = tied[0]
        more = len(passing) > 1
        return n, (f"{n} meets the SLO at the lowest cost ({usd(cost[n])}/h)" if more
                   else f"{n} is the only topology that meets the SLO")
    tied.sort(key=lambda n: -(analysis[n]["attainment"] or 0))
    first, second = analysis[tied[0]], analysis[tied[1]]
    lead = (first["attainment"] or 0) - (second["attainment"] or 0)
    noise = 2 * math.hypot(first["noise"] or 0, second["noise"] or 0)
    if lead > noise and lead > 0:
        return tied[0], (f"{tied[0]} has the highest attainment among equally priced passing topologies, ahead by "
                         f"{num(lead * 100)} points (run-to-run noise ±{num(noise * 100)})")
    same = (f"{', '.join(tied)} all pass at the same cost" + (f" ({usd(cheapest)}/h)" if math.isfinite(cheapest)
                                                              else ""))
    if lead == 0:
        return None, same + " with the same attainment; compare their margins below"
    return None, (same + f"; their attainments differ by {num(lead * 100)} points, within run-to-run noise "
                  f"(±{num(noise * 100)}), so none is marked best")


def _gpus(t: dict) -> str:
    g = t.get("gpus")
    return f"{num(g)} GPU{'' if g == 1 else 's'}"


def verdict(analysis: dict, topos: dict, slo: dict, wl: dict) -> tuple[str | None, str]:
    """(best topology or None, one paragraph of plain text) generated from the numbers."""
    best, why_best = pick_best(analysis, topos)
    target = finite(slo.get("attainment_target"))
    bounds = " and ".join(f"{lab} p{num(finite(slo.get(k + '_percentile')) or 90)} ≤ {seconds(slo.get(k + '_s'))}"
                          for k, lab in (("ttft", "TTFT"), ("tpot", "TPOT")) if finite(slo.get(k + "_s")))
    passing = [n for n, a in analysis.items() if a["passes"]]
    percentile = any(a.get("mode") == "percentile" for a in analysis.values())
    s = [f"At {num(wl.get('rate'))} requests/s ({num(wl.get('requests'))} requests), {len(passing)} of "
         f"{len(analysis)} topologies meet the SLO ({bounds}"
         + ("; percentile mode)." if percentile else f"; at least {pct(target)} of requests within both).")]
    for n in passing:
        a, t = analysis[n], topos[n]
        marginal = a["noise"] is not None and target is not None and a["attainment"] is not None and \
            a["attainment"] - target < 2 * a["noise"]
        s.append(f"{n} passes with {_gpus(t)} ({usd(t.get('cost_per_hour_usd'))}/h): attainment "
                 f"{pct(a['attainment'])}" + (f" (marginal: within twice its run-to-run noise, ±{num(a['noise'] * 100)}"
                                              f" points, of the target)" if marginal else "")
                 + f"; binding {_bound_text(a)}.")
    for n, a in analysis.items():
        if a["passes"]:
            continue
        t = analysis[n]
        bb = a["bounds"].get(a["binding"] or "", {})
        misses = f" — {pct(bb.get('miss_share'))} of requests miss it" if bb.get("miss_share") is not None else ""
        s.append(f"{n} fails ({_gpus(topos[n])}): "
                 + ("" if percentile else f"attainment {pct(t['attainment'])} < {pct(target)}; ")
                 + f"{_bound_text(a)} binds{misses}"
                 + (f"; why: {'; '.join(a['reasons'])}" if a["reasons"] else "") + ".")
    s.append(("Best: " if best else "No best: ") + why_best + ".")
    return best, " ".join(s)


# --- sections ---------------------------------------------------------------------------------
def _frames(df) -> dict:
    """Per topology, the numpy columns the verdict and charts use (one pass over the request table)."""
    out = {}
    for name, d in df.groupby("topology", sort=False):
        g = {c: d[c].to_numpy(dtype=float) for c in ("arrival_s", "ttft_s", "tpot_s", "queue_s", "prefill_s",
                                                     "kv_wait_s", "kv_transfer_s", "decode_queue_s", "e2e_s",
                                                     "prompt_tokens", "output_tokens")}
        g["status"] = d["status"].to_numpy(dtype=object).astype(str)
        ttft = g["ttft_s"].copy()
        ttft[~np.isfinite(ttft) | (g["status"] == "rejected")] = np.inf
        g["ttft_inf"] = ttft
        g["kv_s"] = np.nan_to_num(g["kv_wait_s"]) + np.nan_to_num(g["kv_transfer_s"])
        for col in ("itl_s", "itl"):            # the engine branch's per-token ITL column, if there is one
            if col in d.columns and d[col].dtype.kind in "fi":
                g["itl"] = d[col].to_numpy(dtype=float)
        out[str(name)] = g
    return out


def _ok_column(frames: dict, slo: dict) -> None:
    tb, pb = finite(slo.get("ttft_s")), finite(slo.get("tpot_s"))
    for g in frames.values():
        fin = g["status"] == "finished"
        ok = fin & (g["ttft_inf"] <= (tb if tb is not None else np.inf))
        if pb is not None:
            ok &= ~(g["tpot_s"] > pb)
        g["ok"] = ok.astype(float)


def _cdf_section(frames, names, col, label, slo_key, slo, note="", recorded=None) -> dict:
    """CDF chart and percentile table of one latency.  ``recorded``: per topology, summary.json's
    ``itl_s`` (quantiles of every recorded inter-token gap), drawn as is instead of an approximation."""
    bound = finite(slo.get(f"{slo_key}_s")) if slo_key else None
    pctl = finite(slo.get(f"{slo_key}_percentile")) if slo_key else None
    series, rows = [], []
    for i, n in enumerate(names):
        g = frames.get(n)
        if g is None:
            continue
        w = None
        rec = (recorded or {}).get(n)
        if col == "itl" and isinstance(rec, dict) and isinstance(rec.get("quantiles"), list) and rec["quantiles"]:
            qs = np.asarray(rec["quantiles"], dtype=float)
            levels = np.linspace(0.0, 1.0, len(qs))
            series.append({"name": n, "x": qs.tolist(), "y": levels.tolist(), "i": i})
            within = float(np.interp(bound, qs, levels, left=0.0, right=1.0)) if bound is not None else None
            rows.append([n, (num(rec.get("gaps")), rec.get("gaps"))]
                        + [(seconds(rec.get(k)), rec.get(k)) for k in ("p50", "p90", "p99")]
                        + [(pct(within), within) if within is not None else "–"])
            continue
        if col == "itl":
            if "itl" in g:
                x = g["itl"][np.isfinite(g["itl"])]
            else:       # approximation: a request's tokens at its mean gap (TPOT), weighted by their count
                m = np.isfinite(g["tpot_s"]) & (g["output_tokens"] > 1)
                x, w = g["tpot_s"][m], g["output_tokens"][m] - 1
        else:
            x = g[col][np.isfinite(g[col])]
        if not len(x):
            continue
        xs, ys = _ecdf(x, w)
        series.append({"name": n, "x": xs, "y": ys, "i": i})
        if w is None:
            q = np.percentile(x, [50, 90, 99])
            within = float((x <= bound).mean()) if bound is not None else None
        else:
            cw = np.cumsum(w[np.argsort(x)]) / w.sum()
            xsrt = np.sort(x)
            q = [xsrt[min(len(xsrt) - 1, int(np.searchsorted(cw, p)))] for p in (0.5, 0.9, 0.99)]
            within = float(w[x <= bound].sum() / w.sum()) if bound is not None else None
        rows.append([n, (num(len(x)), len(x))] + [(seconds(v), v) for v in q]
                    + [(pct(within), within) if within is not None else "–"])
    if not series:
        return {}
    xlog = all(min(s["x"]) > 0 for s in series)
    vl = [(bound, f"SLO {seconds(bound)}")] if bound is not None else []
    hl = [(pctl / 100, f"p{num(pctl)}")] if pctl is not None else []
    chart = line_chart(series, label, "fraction of requests" if col != "itl" else "fraction of tokens",
                       xlog=xlog, xfmt=seconds, yfmt=lambda v: f"{v:g}", ylim=(0, 1.0), vlines=vl, hlines=hl,
                       title=f"CDF of {label}")
    tab = table(["topology", "samples", "p50", "p90", "p99", "≤ SLO bound"], rows, "cdf")
    return {"title": f"CDF of {label}", "id": f"cdf-{col}", "chart": chart, "table": tab, "note": note}


COMPONENTS = [("queue_s", "prefill queue"), ("prefill_s", "prefill compute"), ("kv_s", "KV wait + transfer"),
              ("decode_queue_s", "decode queue"), ("decode_s", "decode (incl. preemption, fault recompute)")]


def _components_section(frames, names) -> dict:
    rows, vals_mean, vals_p90, shown = [], [], [], []
    for n in names:
        g = frames.get(n)
        if g is None:
            continue
        fin = g["status"] == "finished"
        if not fin.any():
            continue
        parts = {c: np.clip(np.nan_to_num(g[c][fin]), 0, None) for c, _ in COMPONENTS if c != "decode_s"}
        parts["decode_s"] = np.clip(g["e2e_s"][fin] - sum(parts.values()), 0, None)
        mean = [float(parts[c].mean()) for c, _ in COMPONENTS]
        p90 = [float(np.quantile(parts[c], 0.9)) for c, _ in COMPONENTS]
        shown.append(n)
        vals_mean.append(mean)
        vals_p90.append(p90)
        e2e = g["e2e_s"][fin]
        rows.append([n] + [(seconds(v), v) for v in mean] + [(seconds(float(e2e.mean())), float(e2e.mean())),
                                                             (seconds(float(np.quantile(e2e, .9))),
                                                              float(np.quantile(e2e, .9)))])
    if not shown:
        return {}
    labels = [lab for _, lab in COMPONENTS]
    chart = stacked_bars(shown, labels, vals_mean, "mean seconds per finished request")
    tab = table(["topology"] + [f"{lab} (mean)" for lab in labels] + ["E2E mean", "E2E p90"], rows, "components")
    p90rows = [[n] + [(seconds(v), v) for v in vs] for n, vs in zip(shown, vals_p90)]
    tab += "<details><summary>each component's own p90</summary>" + \
        table(["topology"] + [f"{lab} (p90)" for lab in labels], p90rows, "components-p90") + "</details>"
    return {"title": "Where the time goes (E2E components)", "id": "components", "chart": chart, "table": tab}


def _timeseries_section(ts, names) -> dict:
    ts = ts.copy()
    ts["kv_used_fraction"] = ts.kv_blocks_used_max / ts.kv_blocks_total.where(ts.kv_blocks_total > 0)
    cols = [("busy_fraction", "busy fraction", pct), ("batch_size", "batch size", num),
            ("queued_max", "queued (max)", num), ("kv_used_fraction", "KV used / total", pct)]
    extra = ["mfu", "mbu"]
    g = ts.groupby(["topology", "pool", "t_s"], sort=False)[[c for c, _, _ in cols] + extra].mean()
    order = {n: i for i, n in enumerate(names)}
    keys = sorted({k[:2] for k in g.index}, key=lambda k: (order.get(k[0], 1e9), k[1]))
    charts = []
    for c, label, fmt in cols:
        series = []
        for i, (topo, pool) in enumerate(keys):
            part = g.loc[(topo, pool)]
            x, y = part.index.to_numpy(dtype=float), part[c].to_numpy(dtype=float)
            if len(x) > MAX_CDF_POINTS:     # keep each bin's peak: a spike must not vanish by subsampling
                k = math.ceil(len(x) / MAX_CDF_POINTS)
                m = len(x) // k * k
                x, y = np.r_[x[:m:k], x[m:]], np.r_[np.nanmax(y[:m].reshape(-1, k), axis=1), y[m:]]
            series.append({"name": f"{topo} / {pool}", "x": x.tolist(), "y": y.tolist(), "i": i})
        charts.append(f"<h3>{esc(label)}</h3>" + line_chart(series, "simulated time (s)", label, yfmt=fmt,
                                                            height=230, xfmt=num, title=label))
    per = ts.groupby(["topology", "pool"], sort=False)[[c for c, _, _ in cols] + extra].mean()
    rows = [[f"{t} / {p}"] + [(f(v), v) for (_, _, f), v in zip(cols + [("mfu", "MFU", pct), ("mbu", "MBU", pct)],
                                                               per.loc[(t, p)].tolist())] for t, p in keys]
    tab = table(["topology / pool", "busy", "batch size", "queued (max)", "KV used", "MFU", "MBU"], rows,
                "utilization")
    return {"title": "Over time per pool (mean over instances)", "id": "timeseries", "chart": "".join(charts),
            "table": tab}


def _kv_section(frames, topos, names) -> dict:
    dis = [n for n in names if topos[n].get("kind") == "disaggregated" and n in frames]
    series, rows = [], []
    for i, n in enumerate(dis):
        g = frames[n]
        x = g["kv_transfer_s"][(g["status"] == "finished") & np.isfinite(g["kv_transfer_s"])]
        if not len(x):
            continue
        xs, ys = _ecdf(x)
        series.append({"name": n, "x": xs, "y": ys, "i": i})
        q = np.percentile(x, [50, 90, 99])
        rows.append([n, (num(len(x)), len(x)), (seconds(x.mean()), float(x.mean()))]
                    + [(seconds(v), float(v)) for v in q] + [(seconds(x.max()), float(x.max()))])
    if not series:
        return {}
    chart = line_chart(series, "KV transfer time per request", "fraction of requests", xfmt=seconds,
                       yfmt=lambda v: f"{v:g}", ylim=(0, 1.0), height=280)
    tab = table(["topology", "transfers", "mean", "p50", "p90", "p99", "max"], rows, "kvtransfer")
    links = [[n, str(link.get("name", "")), (num(link.get("transfers")), link.get("transfers")),
              (num((link.get("bytes") or 0) / 1e9) + " GB", link.get("bytes")),
              (pct(link.get("busy_fraction")), link.get("busy_fraction"))]
             for n in dis for link in topos[n].get("links") or []]
    if links:
        tab += "<h3>KV links</h3>" + table(["topology", "link", "transfers", "bytes", "busy"], links, "links")
    return {"title": "KV-cache transfer time (disaggregated topologies)", "id": "kv", "chart": chart, "table": tab}


def _workload_section(first_frame, wl) -> dict:
    arr = first_frame["arrival_s"]
    arr = arr[np.isfinite(arr)]
    charts = []
    if len(arr) > 1:
        bins = max(1, min(100, int(len(arr) ** 0.5)))
        counts, edges = np.histogram(arr, bins=bins)
        width = (edges[1] - edges[0]) or 1.0
        charts.append("<h3>arrival rate</h3>" + line_chart(
            [{"name": "arrivals", "x": edges.tolist(), "y": (counts / width).tolist() + [counts[-1] / width],
              "i": 0, "step": True}], "arrival time (s)", "requests / s", height=220))
    rows = []
    for i, (col, label) in enumerate((("prompt_tokens", "prompt tokens"), ("output_tokens", "output tokens"))):
        v = first_frame[col][np.isfinite(first_frame[col])]
        if not len(v):
            continue
        counts, edges = np.histogram(v, bins=40)
        charts.append(f"<h3>{label}</h3>" + line_chart(
            [{"name": label, "x": edges.tolist(), "y": counts.tolist() + [counts[-1]], "i": i + 1, "step": True}],
            label, "requests", height=220))
        q = np.percentile(v, [50, 90, 99])
        rows.append([label, (num(v.mean()), float(v.mean())), (num(q[0]), q[0]), (num(q[1]), q[1]),
                     (num(q[2]), q[2]), (num(v.max()), float(v.max()))])
    tab = table(["tokens", "mean", "p50", "p90", "p99", "max"], rows, "workload")
    return {"title": "Workload: arrival rate and length distributions", "id": "workload", "chart": "".join(charts),
            "table": tab}


def _faults_section(topos) -> dict:
    rows = []
    for n, t in topos.items():
        f = t.get("faults")
        if not f:
            continue
        rec = [r.get("time_to_recover_s") for r in f.get("recovery", [])]
        rows.append([n, (num(len(f.get("events", []))), len(f.get("events", []))),
                     (num(f.get("requests_affected")), f.get("requests_affected")),
                     (num(f.get("recomputed_tokens")), f.get("recomputed_tokens")),
                     (seconds(f.get("extra_e2e_s_affected")), f.get("extra_e2e_s_affected")),
                     (pct(f.get("slo_attainment_inside_fault_windows")), f.get("slo_attainment_inside_fault_windows")),
                     (pct(f.get("slo_attainment_outside_fault_windows")),
                      f.get("slo_attainment_outside_fault_windows")),
                     ", ".join(seconds(x) for x in rec) or "–",
                     (num(_get(t, "requests.abandoned")), _get(t, "requests.abandoned")),
                     (num(_get(t, "requests.rejected")), _get(t, "requests.rejected"))])
    if not rows:
        return {}
    return {"title": "Faults: what they cost", "id": "faults", "chart": "", "table": table(
        ["topology", "fault events", "requests affected", "recomputed tokens", "extra E2E (affected)",
         "SLO att. in fault windows", "SLO att. outside", "time to recover", "abandoned", "rejected"], rows, "faults")}


def _prefix_section(topos) -> dict:
    """One row per topology with a prefix cache: hit rates per tier, tokens, FLOPs and bytes saved."""
    rows = []
    for n, t in topos.items():
        pc = t.get("prefix_cache")
        if not isinstance(pc, dict):
            continue
        flops, xfer = pc.get("prefill_flops_saved"), pc.get("transfer_bytes_saved")
        rows.append([n, (pct(pc.get("hit_rate")), pc.get("hit_rate")),
                     (pct(pc.get("gpu_hit_rate")), pc.get("gpu_hit_rate")),
                     (pct(pc.get("host_hit_rate")), pc.get("host_hit_rate")),
                     (num(pc.get("tokens_saved")), pc.get("tokens_saved")),
                     (f"{num(flops / 1e12)} TFLOP" if finite(flops) is not None else "–", flops),
                     (f"{num(xfer / 2 ** 30)} GiB" if finite(xfer) is not None else "–", xfer)])
        by = pc.get("enabled_by") or {}
        text = ", ".join(f"{pool}: {why}" for pool, why in by.items()) or "–"
        rows[-1].append((text, text))
    if not rows:
        return {}
    return {"title": "Prefix cache: prompt tokens found cached at admission", "id": "prefix", "chart": "",
            "table": table(["topology", "hit rate", "GPU tier", "host tier", "prompt tokens saved",
                            "prefill FLOPs saved", "KV transfer saved", "cached by"], rows, "prefix")}


def _autoscale_section(topos) -> dict:
    """Instances alive per pool over time (provisioning and draining included: they are paid), and per
    topology the GPU-hours, cost and attainment that decide whether autoscaling paid off.  Shown when a
    topology has an autoscaler; static topologies appear as flat lines for comparison."""
    if not any(isinstance(t.get("autoscaling"), dict) for t in topos.values()):
        return {}
    series, rows, i = [], [], 0
    for n, t in topos.items():
        end = finite(t.get("sim_end_s")) or 0.0
        a = t.get("autoscaling") if isinstance(t.get("autoscaling"), dict) else None
        for pool, p in (t.get("pools") or {}).items():
            key = "replicas" if pool == "replica" else pool
            tl = ((a or {}).get("pools") or {}).get(key, {}).get("timeline") if a else None
            if tl:
                x = [e["t_s"] for e in tl] + [end]
                y = [e["alive"] for e in tl] + [tl[-1]["alive"]]
            else:
                x, y = [0.0, end], [p.get("instances"), p.get("instances")]
            series.append({"name": f"{n} / {pool}", "x": x, "y": y, "i": i, "step": True})
            i += 1
        scale = [f"{k}: +{v.get('scale_outs')} / -{v.get('scale_ins')}" for k, v in ((a or {}).get("pools") or {}).items()]
        rows.append([n, (a or {}).get("policy") or "static",
                     (num(t.get("gpu_hours")), t.get("gpu_hours")), (usd(t.get("cost_usd")), t.get("cost_usd")),
                     (num(t.get("mean_gpus")), t.get("mean_gpus")), (num(t.get("gpus")), t.get("gpus")),
                     (pct(t.get("slo_attainment")), t.get("slo_attainment")), "; ".join(scale) or "–"])
    chart = line_chart(series, "simulated time (s)", "instances alive", height=260, yfmt=num,
                       title="instances alive per pool")
    tab = table(["topology", "policy", "GPU-hours", "cost", "mean GPUs", "peak GPUs", "SLO attainment",
                 "scale-outs / -ins"], rows, "autoscaling")
    return {"title": "Pool sizes over time and what they cost (GPU-hours include provisioning and loading)",
            "id": "autoscaling", "chart": chart, "table": tab}


def _energy_section(topos) -> dict:
    """One row per topology whose devices have a power model: energy, mean power, J per request and
    per output token, output tokens/s per kW drawn and per provisioned kW (TDP, or the power cap where set)."""
    rows = []
    for n, t in topos.items():
        e = t.get("energy")
        if not isinstance(e, dict):
            continue
        caps = [f"{pn}: {num(p.get('power_cap_W'))} W cap, clock x{num(p.get('clock_fraction'))}"
                for pn, p in (e.get("pools") or {}).items() if p.get("power_cap_W") is not None]
        rows.append([n, (num(e.get("energy_kWh")), e.get("energy_kWh")),
                     (num(e.get("mean_power_kW")), e.get("mean_power_kW")),
                     (num(e.get("provisioned_kW")), e.get("provisioned_kW")),
                     (num(e.get("J_per_request")), e.get("J_per_request")),
                     (num(e.get("J_per_output_token")), e.get("J_per_output_token")),
                     (num(e.get("output_tokens_per_s_per_kW")), e.get("output_tokens_per_s_per_kW")),
                     (num(e.get("output_tokens_per_s_per_provisioned_kW")),
                      e.get("output_tokens_per_s_per_provisioned_kW")),
                     "; ".join(caps) or "–"])
    if not rows:
        return {}
    return {"title": "Energy (estimated: idle + (TDP or cap - idle) x max(MFU, MBU) per step; not measured)",
            "id": "energy", "chart": "", "table": table(
                ["topology", "energy kWh", "mean kW", "provisioned kW (TDP or cap)", "J / request", "J / output token",
                 "out tok/s per kW", "per provisioned kW", "power caps"], rows, "energy")}


def _speculative_section(topos) -> dict:
    """One row per speculative pool: tokens per verify step, draft acceptance, time spent drafting."""
    rows = []
    for n, t in topos.items():
        for pool, s in (t.get("speculative") or {}).items():
            p = (t.get("pools") or {}).get(pool) or {}
            busy = (p.get("busy_fraction") or 0.0) * (t.get("sim_end_s") or 0.0) * (p.get("instances") or 0)
            share = s.get("draft_time_s") / busy if busy else None
            rows.append([f"{n} / {pool}", (num(s.get("tokens_per_verify_step")), s.get("tokens_per_verify_step")),
                         (pct(s.get("draft_acceptance_rate")), s.get("draft_acceptance_rate")),
                         (num(s.get("verify_request_steps")), s.get("verify_request_steps")),
                         (pct(share), share)])
    if not rows:
        return {}
    return {"title": "Speculative decoding", "id": "speculative", "chart": "", "table": table(
        ["topology / pool", "tokens per verify step", "drafts accepted", "request verify steps",
         "busy time drafting"], rows, "speculative")}


def _energy_items(t: dict) -> list:
    """Card lines: energy per output token and output tokens/s per kW (when the devices have power models)."""
    e = t.get("energy")
    if not isinstance(e, dict):
        return []
    return [("J per output token (est.)", num(e.get("J_per_output_token"))),
            ("out tok/s per kW (est.)", num(e.get("output_tokens_per_s_per_kW")))]


def _engine_items(t: dict) -> list:
    """Card lines: each pool's engine and KV capacity per instance (tokens, requests of the run's mean
    size), the recorded ITL, and the error band measured against real benchmark runs for each pool's
    engine and GPU (or 'unvalidated')."""
    from .validate import band_notes
    out = []
    for name, p in (t.get("pools") or {}).items():
        if p.get("tp") is not None:
            par = f"{num(p.get('instances'))} x tp {num(p.get('tp'))}"
            if (p.get("pp") or 1) > 1:
                par += f" x pp {num(p.get('pp'))} ({num(p.get('micro_batches'))} micro-batches)"
            if (p.get("ep") or 1) > 1:
                par += f", ep {num(p.get('ep'))}"
            if p.get("dp_attention"):
                par += ", DP attention"
            out.append((f"{name}: instances x GPUs", f"{par} = {num(p.get('gpus'))} GPUs"))
        if p.get("kv_capacity_tokens") is not None:
            out.append((f"{name}: engine / KV capacity per instance",
                        f"{p.get('engine') or 'none (idealised)'} / {num(p.get('kv_capacity_tokens'))} tokens / "
                        f"{num(p.get('kv_capacity_requests'))} requests"
                        + (f" ({num(p['kv_blocks_per_rank'])} blocks of {num(p.get('kv_block_size'))} tokens a "
                           "rank: each attention rank has its own pool)" if p.get("kv_blocks_per_rank") else "")))
    itl = t.get("itl_s")
    if isinstance(itl, dict):
        out.append(("ITL p50 / p90 / p99", " / ".join(seconds(itl.get(f"p{q}")) for q in (50, 90, 99))))
    for name, band in (t.get("expected_error") or {}).items():
        out.append((f"{name}: expected error TTFT / TPOT", band if isinstance(band, str) else (
            f"±{num(band.get('ttft_mape_pct'))}% / ±{num(band.get('tpot_mape_pct'))}% (MAPE over "
            f"{num(band.get('rows'))} {'' if band.get('in_sample') else 'held-out '}measured "
            f"{'MoE-model ' if band.get('moe') else ''}runs"
            + (f"; mean bias {band['ttft_bias_pct']:+.0f}% / {band['tpot_bias_pct']:+.0f}%"
               if band.get("ttft_bias_pct") is not None and band.get("tpot_bias_pct") is not None else "")
            + band_notes(band) + ")")))
    e = t.get("slo_at_error") or {}
    if e.get("margin"):
        m = e["margin"]
        how = (f"TTFT p{num(e.get('ttft_percentile'))} {seconds(e.get('ttft_p_s'))}, TPOT p{num(e.get('tpot_percentile'))} "
               f"{seconds(e.get('tpot_p_s'))}" if e.get("mode") == "percentile" else f"attainment {pct(e.get('attainment'))}")
        out.append(("SLO at p90 error", f"{'met' if e.get('met') else 'missed'}: {how} "
                    f"judged at TTFT ≤ {seconds(e.get('ttft_s'))}, TPOT ≤ {seconds(e.get('tpot_s'))} (the bounds / "
                    f"{num(m['ttft_factor'])} and / {num(m['tpot_factor'])}: the p90 (at least 1) of measured/simulated TTFT and of TPOT over the "
                    f"{'in-sample MoE' if m.get('in_sample') else 'held-out'} runs of these pools' engines and GPUs"
                    + (f"; both within them on {pct(m['both_within_share'])} of those runs"
                       if m.get("both_within_share") is not None else "") + ")"))
    return out


# --- the page -----------------------------------------------------------------------------------
def build_report(out_dir: Path, progress: bool = True, df=None, summary: dict | None = None, ts=None) -> Path:
    """Write ``out_dir/report.html`` from the run outputs in ``out_dir`` (or the frames given); return its path."""
    import pandas as pd
    _QUIET[0] = not progress
    out_dir = Path(out_dir)
    if summary is None:
        summary = json.loads((out_dir / "summary.json").read_text())
    if df is None:
        _log(f"reading {out_dir}...")
        from .output import requests_path
        rp = requests_path(out_dir, summary)
        if rp.suffix == ".parquet":
            df = pd.read_parquet(rp)
        else:
            df = pd.read_csv(rp, low_memory=False,
                             dtype={"instance": str, "decode_instance": str, "reject_reason": str, "status": str})
    if ts is None:
        ts_path = out_dir / "timeseries.csv"
        if ts_path.exists() and ts_path.stat().st_size > 1:
            try:
                ts = pd.read_csv(ts_path)
            except pd.errors.EmptyDataError:
                ts = None
    sc, topos = summary.get("scenario") or {}, summary["topologies"]
    slo = dict(sc.get("slo") or {})
    names = list(topos)
    df = df.assign(topology=df["topology"].astype(str))
    frames = _frames(df)
    _ok_column(frames, slo)
    first = frames[names[0]] if names and names[0] in frames else next(iter(frames.values()), None)
    arr = first["arrival_s"][np.isfinite(first["arrival_s"])] if first is not None else np.array([])
    span = float(arr.max() - arr.min()) if len(arr) > 1 else 0.0
    wl = {"requests": int(len(first["status"])) if first is not None else 0, "duration_s": span,
          "rate": (len(arr) - 1) / span if span > 0 else None,
          "prompt_mean": float(np.nanmean(first["prompt_tokens"])) if first is not None else None,
          "output_mean": float(np.nanmean(first["output_tokens"])) if first is not None else None}
    w = sc.get("workload") or {}
    if w.get("arrival") in ("poisson", "gamma", "constant") and finite(w.get("rate")):
        wl["rate"] = float(w["rate"])                   # the offered rate, not this sample's estimate of it
    analysis = analyze(topos, frames, slo, sc.get("topologies"))
    best, text = verdict(analysis, topos, slo, wl)

    _log("charts...")
    recorded_itl = {n: t.get("itl_s") for n, t in topos.items() if isinstance(t.get("itl_s"), dict)}
    has_itl = any("itl" in g for g in frames.values()) or len(recorded_itl) == len(names)
    itl_note = "Every inter-token gap the client sees, from the recorded token times." if has_itl else ("Approximated: per-token gaps are not recorded in this run, so each request's "
                                   "output tokens are counted at its mean inter-token time (its TPOT). Real ITL "
                                   "has a wider spread (a stalled step shows up as one long gap).")
    sections = [s for s in (
        _cdf_section(frames, names, "ttft_s", "TTFT", "ttft", slo),
        _cdf_section(frames, names, "tpot_s", "TPOT", "tpot", slo),
        _cdf_section(frames, names, "itl", "ITL (inter-token latency)", "tpot", slo, itl_note, recorded_itl),
        _components_section(frames, names),
        _timeseries_section(ts, names) if ts is not None and len(ts) else {},
        _kv_section(frames, topos, names),
        _workload_section(first, wl) if first is not None else {},
        _autoscale_section(topos),
        _faults_section(topos),
        _prefix_section(topos),
        _speculative_section(topos),
        _energy_section(topos)) if s]

    keys = list(SUMMARY_KEYS)
    if any(isinstance(t.get("itl_s"), dict) for t in topos.values()):      # the engine branch's ITL stats
        keys.insert(7, ("itl_s.p99", "ITL p99", seconds))
    rows = []
    for n in names:
        t, a = topos[n], analysis[n]
        status = "–" if a["passes"] is None else ("PASS" if a["passes"] else "FAIL")
        cells = [(f"{n}{' ★' if n == best else ''}", n),
                 (status, status, f' class="{"pass" if a["passes"] else "fail"}"')]
        for k, _, f in keys:
            v = _get(t, k)
            cells.append((f(v), finite(v), f' data-key="{esc(k)}"'))
        rows.append(cells)
    summary_table = table(["topology", "SLO"] + [h for _, h, _ in keys], rows, "summary",
                          [f' data-topology="{esc(n)}"' + (' class="best"' if n == best else "") for n in names])
    slo_rows = []
    for n in names:
        a = analysis[n]
        r = [n, (("PASS" if a["passes"] else "FAIL") if a["passes"] is not None else "–", int(bool(a["passes"])),
                 f' class="{"pass" if a["passes"] else "fail"}"'),
             (pct(a["attainment"]), a["attainment"]),
             (f"±{num((a['noise'] or 0) * 100)} pts" if a["noise"] is not None else "–", a["noise"]),
             ((a["bounds"][a["binding"]]["label"] if a["binding"] else "–"), a["binding"] or "", ' data-key="binding"')]
        for k in ("ttft", "tpot"):
            b = a["bounds"][k]
            r += [(seconds(b["measured_s"]), b["measured_s"]),
                  ((f"{num((1 - b['ratio']) * 100)}%" if b["ratio"] is not None else "–"),
                   (1 - b["ratio"]) if b["ratio"] is not None else None),
                  (pct(b["miss_share"]), b["miss_share"])]
        slo_rows.append(r)
    tp, pp = (num(finite(slo.get(k)) or 90) for k in ("ttft_percentile", "tpot_percentile"))
    slo_table = table(["topology", "SLO", "attainment", "noise (1 s.e.)", "binding",
                       f"TTFT p{tp}", "TTFT margin", "miss TTFT", f"TPOT p{pp}", "TPOT margin", "miss TPOT"],
                      slo_rows, "slocheck", [f' data-topology="{esc(n)}"' for n in names])
    cards = []
    for n in names:
        t, a = topos[n], analysis[n]
        items = [("kind", t.get("kind") or "–"), ("GPUs", num(t.get("gpus"))),
                 ("cost", f"{usd(t.get('cost_per_hour_usd'))}/h"),
                 ("SLO attainment", pct(a["attainment"])),
                 ("binding", _bound_text(a))]
        for k in ("ttft_s", "tpot_s", "e2e_s"):
            items.append((f"{k[:-2].upper()} p50 / p90 / p99", " / ".join(seconds(_get(t, f"{k}.p{p}"))
                                                                         for p in (50, 90, 99))))
        items += [("out tok/s per GPU", num(_get(t, "throughput.output_tokens_per_s_per_gpu"))),
                  ("$ per M output tokens", usd(t.get("cost_per_million_output_tokens_usd"))),
                  ("finished / rejected / abandoned / unfinished",
                   " / ".join(num(_get(t, f"requests.{k}")) for k in ("finished", "rejected", "abandoned",
                                                                      "unfinished")))]
        if t.get("cut_by_horizon"):
            items.append(("cut by the horizon (not in the run)", num(t["cut_by_horizon"])))
        items += _engine_items(t)
        items += _energy_items(t)
        cards.append({"name": n, "best": n == best, "passes": a["passes"], "items": items,
                      "why": "; ".join(a["reasons"]) if a["reasons"] and not a["passes"] else ""})

    model = sc.get("model")
    if isinstance(model, dict):
        model = model.get("name") or model.get("preset") or json.dumps(model)
    from jinja2 import Environment, FileSystemLoader, select_autoescape
    env = Environment(loader=FileSystemLoader(Path(__file__).parent / "templates"),
                      autoescape=select_autoescape(["html", "j2"]))
    html = env.get_template("report.html.j2").render(
        name=sc.get("name") or out_dir.name, description=sc.get("description") or "", model=model,
        seed=sc.get("seed"), version=summary.get("pdsim_version"), wall=seconds(summary.get("wall_s")),
        slo=slo, target=pct(slo.get("attainment_target")), wl=wl, num=num, seconds=seconds, pct=pct,
        verdict=text, best=best, cards=cards, summary_table=summary_table, slo_table=slo_table,
        tp=tp, pp=pp, sections=sections, css=CSS, sort_js=SORT_JS, mode=next(iter(analysis.values()))["mode"]
        if analysis else "attainment", legend=legend)
    path = out_dir / "report.html"
    path.write_text(html, encoding="utf-8")
    _log(f"wrote {path} ({path.stat().st_size / 1024:.0f} KiB)")
    return path


# --- is this folder one complete run? ---------------------------------------------------------------------
# The columns the report reads; a folder missing any of them was not written by pdsim run (or is cut short).
REQUIRED_REQUEST_COLUMNS = ["topology", "request_id", "arrival_s", "prompt_tokens", "output_tokens", "status",
                            "ttft_s", "tpot_s", "e2e_s", "queue_s", "prefill_s", "kv_wait_s", "kv_transfer_s",
                            "decode_queue_s"]
REQUIRED_TIMESERIES_COLUMNS = ["topology", "pool", "t_s", "busy_fraction", "mfu", "mbu", "batch_size",
                               "queued_max", "kv_blocks_used_max", "kv_blocks_total"]
_RERUN = "rerun pdsim run to write a complete folder"
OPTIONAL_REQUEST_COLUMNS = ["warmup"]      # read when there: the rows client.warmup_requests left out of the SLO


def _read_csv(path: Path, required: list, **kw) -> "pd.DataFrame":
    import pandas as pd

    from .errors import ConfigError
    if not path.is_file():
        raise ConfigError(f"missing: not a complete pdsim run folder; {_RERUN}", file=str(path))
    try:
        df = pd.read_csv(path, low_memory=False, **kw)
    except pd.errors.EmptyDataError:
        raise ConfigError(f"empty file (not even a header): the run was cut short; {_RERUN}",
                          file=str(path)) from None
    except (pd.errors.ParserError, UnicodeDecodeError, ValueError) as exc:
        reason = " ".join(str(exc).split())[:200]
        raise ConfigError(f"not a readable CSV ({reason}); {_RERUN}", file=str(path)) from None
    missing = [c for c in required if c not in df.columns]
    if missing:
        raise ConfigError(f"lacks the column(s) {', '.join(missing)}; {_RERUN}", file=str(path))
    return df


def _read_parquet(path: Path, required: list) -> "pd.DataFrame":
    import pandas as pd

    from .errors import ConfigError
    if not path.is_file():
        raise ConfigError(f"missing: not a complete pdsim run folder; {_RERUN}", file=str(path))
    try:
        import pyarrow.parquet as pq
    except ImportError:
        raise ConfigError("reading Parquet needs pyarrow: pip install 'pdsim[parquet]'", file=str(path)) from None
    try:
        names = pq.read_schema(path).names
        missing = [c for c in required if c not in names]
        if missing:
            raise ConfigError(f"lacks the column(s) {', '.join(missing)}; {_RERUN}", file=str(path))
        return pd.read_parquet(path, columns=list(required) + [c for c in OPTIONAL_REQUEST_COLUMNS if c in names])
    except ConfigError:
        raise
    except Exception as exc:          # pyarrow's ArrowInvalid / OSError for a cut or foreign file
        reason = " ".join(str(exc).split())[:200]
        raise ConfigError(f"not a readable Parquet file ({reason}); {_RERUN}", file=str(path)) from None


def _check_numeric(df, cols: list, path: Path) -> None:
    """Every non-empty cell of ``cols`` a number (a cell of text: one line naming its row)."""
    import pandas as pd

    from .errors import ConfigError
    for c in cols:
        if pd.api.types.is_numeric_dtype(df[c]):
            continue
        bad = (pd.to_numeric(df[c], errors="coerce").isna() & df[c].notna()).to_numpy()
        if bad.any():
            i = int(np.flatnonzero(bad)[0])
            raise ConfigError(f"not a number; {_RERUN}", file=str(path), line=i + 2,   # +1 header, +1 counting from 1
                              key=c, value=df[c].iloc[i])


STATUSES = ("finished", "rejected", "abandoned", "unfinished")
# latencies a finished request always has (a one-token reply has no TPOT; a PD pool no decode_queue_s...)
FINISHED_HAS = ("ttft_s", "e2e_s")
DURATION_COLUMNS = ("ttft_s", "tpot_s", "e2e_s", "queue_s", "prefill_s", "kv_wait_s", "kv_transfer_s",
                    "decode_queue_s")


def _check_request_values(df, rp: Path) -> None:
    """One row per request and topology, a known status, and durations that are finite and >= 0 (present
    where a finished request must have them)."""
    from .errors import ConfigError

    def fail(mask, reason, key):
        i = int(np.flatnonzero(mask)[0])
        v = df[key].iloc[i]
        raise ConfigError(f"{reason}; {_RERUN}", file=str(rp), line=i + 2, key=key,
                          value=v.item() if isinstance(v, np.generic) else v, has_value=True)
    dup = df.duplicated(["topology", "request_id"]).to_numpy()
    if dup.any():
        fail(dup, "a second row of the same request: the file was edited or comes from different runs",
             "request_id")
    status = df["status"].astype(object)
    bad = ~status.isin(STATUSES).to_numpy()
    if bad.any():
        fail(bad, f"not a request status (one of {', '.join(STATUSES)})", "status")
    fin = (status == "finished").to_numpy()
    for c in DURATION_COLUMNS:
        v = np.asarray(df[c], np.float64)
        present = ~np.isnan(v)
        bad = present & ~(np.isfinite(v) & (v >= 0))
        if bad.any():
            fail(bad, "not a duration (finite, >= 0 seconds)", c)
        if c in FINISHED_HAS and (fin & ~present).any():
            fail(fin & ~present, "empty, but the row's request finished, so it has one", c)


def _is_number(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _check_summary_values(summary: dict, sp: Path) -> None:
    """The scenario's SLO and every figure the report shows: numbers (or null) where numbers belong."""
    from .errors import ConfigError
    sc = summary.get("scenario")
    slo = sc.get("slo") if isinstance(sc, dict) else None
    if not isinstance(slo, dict):
        raise ConfigError(f"missing: the run's scenario and its SLO; {_RERUN}", file=str(sp),
                          key="scenario" if not isinstance(sc, dict) else "scenario.slo")
    for k in ("ttft_s", "tpot_s", "attainment_target"):
        v = slo.get(k)
        if not _is_number(v) or not math.isfinite(v):
            raise ConfigError(f"not a number; {_RERUN}", file=str(sp), key=f"scenario.slo.{k}", value=v,
                              has_value=True)
    for name, t in summary["topologies"].items():
        if not isinstance(t, dict):
            raise ConfigError(f"not a topology's summary; {_RERUN}", file=str(sp), key=f"topologies.{name}")
        for k in [k for k, _, _ in SUMMARY_KEYS] + [f"requests.{s}" for s in STATUSES]:
            v = _get(t, k)
            if v is not None and not _is_number(v):
                raise ConfigError(f"not a number; {_RERUN}", file=str(sp), key=f"topologies.{name}.{k}", value=v,
                                  has_value=True)


def _check_recomputed(summary: dict, df, sp: Path, rp: Path) -> None:
    """summary.json's request counts and SLO attainment per topology as requests.csv gives them, computed by
    the code the run used (metrics.slo_attainment).  A latency within 1e-8 of a bound may sit on either side
    of it once written with 9 significant digits: the attainment may be anything between the two readings."""
    from types import SimpleNamespace

    from . import metrics
    from .errors import ConfigError
    slo = summary["scenario"]["slo"]
    topo_col = df["topology"].astype(str).to_numpy()
    for name, t in summary["topologies"].items():
        d = df[topo_col == str(name)]
        st = d["status"].to_numpy()
        for s in STATUSES:
            want = _get(t, f"requests.{s}")
            got = int((st == s).sum())
            if want is not None and want != got:
                raise ConfigError(f"summary.json counts {want} {s} requests for this topology: the files were edited "
                                  f"or come from different runs; {_RERUN}", file=str(rp),
                                  key=f"{s} rows of topology {name}", value=got, has_value=True)
        if "warmup" in d:
            d = d[~d["warmup"].astype(str).str.lower().isin(("true", "1", "1.0")).to_numpy()]
        want = t.get("slo_attainment")
        lo, hi = (metrics.slo_attainment(d, SimpleNamespace(ttft_s=slo["ttft_s"] * f, tpot_s=slo["tpot_s"] * f))
                  for f in (1 - 1e-8, 1 + 1e-8))
        if want is None:
            ok = len(d) == 0
        else:
            ok = len(d) > 0 and lo - 1e-9 <= want <= hi + 1e-9
        if not ok:
            raise ConfigError(f"not the share of requests.csv's rows meeting the SLO ({lo if lo == hi else (lo, hi)}"
                              f"): the files were edited or come from different runs; {_RERUN}", file=str(sp),
                              key=f"topologies.{name}.slo_attainment", value=want, has_value=True)


def validate_run_folder(out_dir: Path) -> dict:
    """Check that ``out_dir`` holds one complete, readable run before anything is drawn; return its summary.

    Raises ConfigError (one line naming the file and what is wrong) when the folder is missing or not a
    folder; summary.json, requests.csv (or requests.parquet) or timeseries.csv is missing, empty or unreadable; a required column
    is absent; or requests.csv's rows per topology differ from summary.json's request totals (files from
    different runs, or a run interrupted while writing). Row counts recorded under summary.json's
    ``outputs`` (pdsim run writes them) are checked too, and so is what an edit would break: one row per
    request, known statuses, finite durations >= 0 (a finished request has its TTFT and E2E), the scenario's
    SLO and the figures the report shows being numbers, each topology's status counts and SLO attainment as
    requests.csv gives them (metrics.slo_attainment), and timeseries.csv's topologies and numbers.
    """
    import pandas as pd

    from .errors import ConfigError
    out_dir = Path(out_dir)
    if not out_dir.exists():
        raise ConfigError("no such folder; give a folder written by pdsim run --out", file=str(out_dir))
    if not out_dir.is_dir():
        raise ConfigError("not a folder; give a folder written by pdsim run --out", file=str(out_dir))
    sp = out_dir / "summary.json"
    if not sp.is_file():
        what = "a run that did not finish writing" if any(
            (out_dir / n).exists() for n in ("requests.csv", "requests.parquet", "timeseries.csv", "report.html")) else \
            "not a pdsim run folder"
        raise ConfigError(f"missing: {what}; {_RERUN}", file=str(sp))
    try:
        summary = json.loads(sp.read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        raise ConfigError(f"not valid JSON ({exc.msg}); {_RERUN}", file=str(sp), line=exc.lineno) from None
    except (UnicodeDecodeError, OSError) as exc:
        raise ConfigError(f"cannot be read ({exc.__class__.__name__}); {_RERUN}", file=str(sp)) from None
    topos = summary.get("topologies") if isinstance(summary, dict) else None
    if not isinstance(topos, dict) or not topos:
        raise ConfigError(f"no topologies in it; {_RERUN}", file=str(sp), key="topologies")
    totals = {}
    for name, t in topos.items():
        total = _get(t, "requests.total")
        if isinstance(total, bool) or not isinstance(total, int) or total < 0:
            raise ConfigError(f"not a request count; {_RERUN}", file=str(sp), key=f"topologies.{name}.requests.total",
                              value=total, has_value=True)
        totals[str(name)] = total
    outputs = summary.get("outputs") if isinstance(summary.get("outputs"), dict) else {}

    from .output import requests_path
    rp = requests_path(out_dir, summary)
    if rp.suffix == ".parquet":
        df = _read_parquet(rp, REQUIRED_REQUEST_COLUMNS)
    else:
        df = _read_csv(rp, REQUIRED_REQUEST_COLUMNS, usecols=lambda c: c in REQUIRED_REQUEST_COLUMNS + OPTIONAL_REQUEST_COLUMNS,
                       dtype={"topology": str, "status": str})
    expected_rows = (outputs.get(rp.name) or {}).get("rows")
    if isinstance(expected_rows, int) and len(df) != expected_rows:
        raise ConfigError(f"summary.json says {expected_rows} rows: the run was cut short or the files come from "
                          f"different runs; {_RERUN}", file=str(rp), key="rows", value=len(df))
    counts = df["topology"].astype(str).value_counts().to_dict()
    for name in sorted(set(counts) | set(totals), key=str):
        got, want = counts.get(name, 0), totals.get(name)
        if want is None:
            raise ConfigError(f"rows of a topology that summary.json does not have: the files come from different "
                              f"runs; {_RERUN}", file=str(rp), key="topology", value=name)
        if got != want:
            raise ConfigError(f"summary.json counts {want} requests for this topology: the run was cut short or "
                              f"the files come from different runs; {_RERUN}", file=str(rp),
                              key=f"rows of topology {name}", value=got, has_value=True)
    _check_numeric(df, [c for c in REQUIRED_REQUEST_COLUMNS if c not in ("topology", "status")], rp)

    _check_request_values(df, rp)
    _check_summary_values(summary, sp)
    _check_recomputed(summary, df, sp, rp)

    tp = out_dir / "timeseries.csv"
    if tp.is_file() and tp.stat().st_size <= 1:     # no instance series at all: the report draws none
        n_ts = 0
    else:
        ts = _read_csv(tp, REQUIRED_TIMESERIES_COLUMNS, dtype={"topology": str, "pool": str})
        n_ts = len(ts)
        bad = ~ts["topology"].astype(str).isin([str(n) for n in topos]).to_numpy()
        if bad.any():
            i = int(np.flatnonzero(bad)[0])
            raise ConfigError(f"a topology that summary.json does not have: the files come from different runs; "
                              f"{_RERUN}", file=str(tp), line=i + 2, key="topology", value=ts["topology"].iloc[i])
        _check_numeric(ts, [c for c in REQUIRED_TIMESERIES_COLUMNS if c not in ("topology", "pool")], tp)
    expected_rows = (outputs.get("timeseries.csv") or {}).get("rows")
    if isinstance(expected_rows, int) and n_ts != expected_rows:
        raise ConfigError(f"summary.json says {expected_rows} rows: the run was cut short or the files come from "
                          f"different runs; {_RERUN}", file=str(tp), key="rows", value=n_ts)
    return summary
