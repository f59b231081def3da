"""plan.html presentation, on a hand-made plan result (no simulation): status first, cost/GPUs vs goodput
with the target and the winner marked, attainment curves only for the Pareto front and the winner."""
from __future__ import annotations

import re

import pytest

from pdsim.plan_report import build_plan_report


def _row(name, gpus, usd_h, goodput, pareto, meets, status="ok"):
    pts = {f"{r:g}": {"attainment": max(0.0, min(1.0, 1.2 - r / (goodput or 1) * 0.3)), "worst_seed_attainment": 0.9,
                      "ttft_p": 0.1 * r, "tpot_p": 0.01} for r in (2.0, 4.0, 8.0)}
    return {"config": name, "gpus": gpus, "usd_per_hour": usd_h, "goodput": goodput, "pareto": pareto,
            "meets": meets, "status": status, "note": "" if meets else "TTFT: 40% within 0.5 s", "points": pts,
            "rank": 0, "goodput_per_gpu": goodput / gpus, "goodput_per_usd_hour": goodput / usd_h,
            "attainment_at_target": 0.95 if meets else 0.4, "ttft_p_at_target_s": 0.2, "tpot_p_at_target_s": 0.02,
            "bound_rate": 40.0}


@pytest.fixture
def result():
    rows = [_row("colo-1", 1, 3.0, 4.0, True, False, "misses SLO at target"),
            _row("colo-2", 2, 6.0, 9.0, True, True),          # the winner: cheapest meeting the target of 6
            _row("disagg-1p1d", 2, 6.0, 7.5, False, True),
            _row("colo-4", 4, 12.0, 19.0, True, True)]
    rows += [_row(f"other-{i}", 4 + i, 12.0 + 3 * i, 10.0 + i, False, True) for i in range(8)]
    for i, r in enumerate(rows, 1):
        r["rank"] = i
    return {"plan": "hand", "pdsim_version": "x", "objective": "cheapest", "target_rate": 6.0,
            "slo": {"ttft_s": 0.5, "tpot_s": 0.05, "ttft_percentile": 90, "tpot_percentile": 90,
                    "attainment_target": 0.9},
            "tolerance": 0.05, "seeds": 2, "winner": "colo-2", "rows": rows, "frontier": ["colo-1", "colo-2", "colo-4"],
            "excluded": [], "simulations": 10, "cached": 0, "wall_s": 1.0}


def _section(html: str, title: str) -> str:
    start = html.index(title)
    end = html.find("<h2>", start + 1)
    return html[start:end if end > 0 else None]


def test_status_column_first_and_winner_marked(result, tmp_path):
    html = build_plan_report(result, tmp_path).read_text()
    heads = re.findall(r"<th>(.*?)</th>", re.search(r'<table class="sortable plan">.*?</thead>', html, re.S).group(0))
    assert heads[0] == "status" and "config" in heads
    assert re.search(r'<tr data-config="colo-2" class="best"><td data-value="ok" class="pass">ok ★ winner</td>', html)
    assert "Recommended (cheapest): colo-2 with 2 GPUs at $6/h, goodput 9 requests/s (1.5× the target)" in html


def test_cost_and_gpu_charts_mark_target_and_winner(result, tmp_path):
    html = build_plan_report(result, tmp_path).read_text()
    sec = _section(html, "<h2>Cost and GPUs vs goodput</h2>")
    assert sec.count('<svg class="chart"') == 2                 # $/hour and GPUs
    assert sec.count(">target 6 req/s</text>") == 2             # the target rate line on both
    assert sec.count(">winner: colo-2</text>") == 2             # the winner marked on both
    assert "every config" in sec and "Pareto front" in sec


def test_attainment_curves_only_for_pareto_front_and_winner(result, tmp_path):
    html = build_plan_report(result, tmp_path).read_text()
    sec = _section(html, "SLO attainment vs request rate")
    chart, rest = sec.split("<details>", 1)
    legend = re.findall(r'<span class="key">.*?</svg>(.*?)</span>', chart)
    assert sorted(legend) == ["colo-1", "colo-2 (winner)", "colo-4"]      # 3 curves, not 12
    assert "disagg-1p1d" not in chart and "other-3" not in chart
    for name in ("disagg-1p1d", "other-0", "other-7"):                    # the rest is in the table
        assert f'<td data-value="{name}" class="text">{name}</td>' in rest


def test_plan_page_fits_1024_px(result, tmp_path):
    from test_report import _overflows
    path = build_plan_report(result, tmp_path)
    assert _overflows(path, tmp_path, 1024) == []


def test_slo_stated_as_its_mode_judges_it(result, tmp_path):
    html = build_plan_report(result, tmp_path).read_text()
    assert "TTFT ≤ 500\u00a0ms and TPOT ≤ 50\u00a0ms for at least 90.0% of requests" in html
    result["slo"].update(mode="percentile", ttft_percentile=99, tpot_percentile=90)
    html = build_plan_report(result, tmp_path).read_text()
    assert "for at least" not in html
    assert "TTFT p99 ≤ 500\u00a0ms and TPOT p90 ≤ 50\u00a0ms (percentile mode)" in html


def test_early_stop_bound_and_long_run_interval_shown_in_their_cells(result, tmp_path):
    r = next(x for x in result["rows"] if x["config"] == "colo-1")
    r.update(attainment_at_target=0.8, at_target_early_stop="fail", long_run_attainment=0.95,
             long_run_ci=[0.94, 0.96])
    html = build_plan_report(result, tmp_path).read_text()
    row = re.search(r'<tr data-config="colo-1".*?</tr>', html, re.S).group(0)
    assert '<td data-value="0.8">≤80.0%</td>' in row             # stopped once it could not pass: an upper bound
    assert '<td data-value="0.95">95.0% [94.0%, 96.0%]</td>' in row


def test_a_margin_plan_page_says_what_each_config_was_judged_at(result, tmp_path):
    # goodput.error_margin: the verdict says the bounds were tightened, one column gives each config's bounds, the
    # long run's cell its share at the p90 error; the page still fits 1024 px
    result["error_margin"] = "p90"
    for r in result["rows"]:
        r.update(judged_ttft_s=0.379, judged_tpot_s=0.0312)
    w = next(r for r in result["rows"] if r["config"] == "colo-2")
    w.update(long_run_attainment=0.95, long_run_ci=[0.94, 0.96], long_run_attainment_at_p90_error=0.7)
    path = build_plan_report(result, tmp_path)
    html = path.read_text()
    assert "each judged at these bounds tightened by goodput.error_margin (p90" in html
    row = re.search(r'<tr data-config="colo-2".*?</tr>', html, re.S).group(0)
    assert "colo-2 (judged at TTFT ≤ 379\u00a0ms, TPOT ≤ 31.2\u00a0ms)" in row
    assert "95.0% [94.0%, 96.0%]; at p90 error 70.0%" in row
    from test_report import _overflows
    assert _overflows(path, tmp_path, 1024) == []
    # without a margin: no judged column
    result["error_margin"] = "none"
    assert "(judged at TTFT" not in build_plan_report(result, tmp_path).read_text()
