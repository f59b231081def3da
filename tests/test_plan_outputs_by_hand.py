"""The plan's outputs worked by hand: the printed table (`print_table`), the files `pdsim plan` writes
(`write_plan_outputs`, `clear_plan_outputs`, `json_safe`), the hash of pdsim's own code that keys the result
cache (`code_hash`) and the local executor (tests/MUTANTS.md, branch mutout).

No simulation runs here: each `result` is written by hand in the shape `run_plan` returns (its rows after
`_rank`), so every cell of the table, every CSV field and JSON value below is worked out in the comments from
the format strings' rules (a float to 3 significant digits, $/h to 4, a share to one decimal of a percent).
"""
from __future__ import annotations

import csv
import hashlib
import io
import json
import math
import os
import time

import pytest
import yaml

import pdsim.plan as plan_mod
from pdsim.plan import (PLAN_OUTPUTS, TABLE_COLS, LocalExecutor, clear_plan_outputs, parse_plan, print_table,
                        winner_scenario, write_plan_outputs)

FOOTER = ("(* = on the cost/goodput Pareto frontier; margin = goodput / target rate; >= / <=: a run stopped once its "
          "verdict was certain, the attainment is a bound; long run = attainment on fresh seeds over a longer window, "
          "with its batch-means 95% interval)")
NO_WINNER = " within the budget; closest above (see status for which SLO each misses)"


def _row(rank, config, gpus, usd, goodput=None, margin=None, per_gpu=None, per_usd=None, att=None, early=None,
         long_run=None, ci=None, status="ok", note="", pareto=False, expected_error=None):
    """A ranked row with the keys print_table reads (the derived columns as `_order` sets them)."""
    return {"rank": rank, "config": config, "gpus": gpus, "usd_per_hour": usd, "goodput": goodput, "margin": margin,
            "goodput_per_gpu": per_gpu, "goodput_per_usd_hour": per_usd, "attainment_at_target": att,
            "at_target_early_stop": early, "long_run_attainment": long_run, "long_run_ci": ci, "status": status,
            "note": note, "pareto": pareto, "expected_error": expected_error}


# target 10 req/s.  A: 2 GPUs at $3.14159/h, goodput 12.3456 (margin 1.23456; per GPU 6.1728; per $/h
# 12.3456 / 3.14159 = 3.9297), 95% at the target, long run 94.12% in [90%, 97.5%], on the frontier; its note
# is not shown (status ok).  B: the target run stopped once it could not miss (a lower bound, ">="), a long
# run without an interval.  C: missed at the target, the run stopped once it could not pass ("<="); never
# searched (no goodput).  D: infeasible, goodput 0.0.
ROWS = [_row(1, "A", 2, 3.14159, 12.3456, 1.23456, 6.1728, 12.3456 / 3.14159, 0.95, None, 0.9412, [0.9, 0.975],
             "ok", "search stopped at max_rounds", True, {"prefill": "unvalidated", "decode": "unvalidated"}),
        _row(2, "disagg-b", 4, 8.0, 20.0, 2.0, 5.0, 2.5, 0.9, "pass", 0.875, None, "ok", "", False,
             {"replica": "a band of B"}),
        _row(3, "C", 1, 1.5, None, None, None, None, 0.6, "fail", None, None, "misses SLO at target",
             "TTFT: 60% within 0.5 s"),
        _row(4, "D", 1, 0.75, 0.0, 0.0, 0.0, 0.0, None, None, None, None, "infeasible",
             "TTFT: a lone prefill exceeds 0.5 s")]
SKIPPED = {"infeasible": 1, "pruned_by_bound": 2, "dominated": 3, "worst_seed": 4, "early_stop_pass": 5,
           "early_stop_fail": 6, "cached": 7, "requests_not_simulated": 12345, "requests_total": 1234567,
           "guided_by_sibling": 8}


def _table(result, **kw) -> list[str]:
    out = io.StringIO()
    print_table(result, out=out, **kw)
    return out.getvalue().split("\n")


def test_table_cells_widths_and_summary_lines_by_hand():
    lines = _table({"winner": "A", "target_rate": 10, "rows": ROWS, "skipped": SKIPPED})
    # each column as wide as its widest cell or its header: # 1, config 8 ("disagg-b"; "A *" is 3), GPUs 4,
    # $/h 5 ("3.142": $/h to 4 significant digits), goodput 13 (the header), margin 6, /GPU 4, /($/h) 6,
    # att@target 10, long run 19 ("94.1% [90.0%,97.5%]", wider than its header's 17), status 46 (D's
    # "infeasible: " 12 + its note 34; C's is 22 + 22 = 44); two spaces between columns: 122 + 20 = 142 a
    # line, the last column padded too
    width = 1 + 8 + 4 + 5 + 13 + 6 + 4 + 6 + 10 + 19 + 46 + 2 * 10
    assert width == 142
    assert lines[:5] == [s.ljust(width) for s in [
        "#  config    GPUs  $/h    goodput req/s  margin  /GPU  /($/h)  att@target  long run [95% CI]    status",
        # A: 12.3456 -> 12.3 (3 digits), margin 1.23x, 6.17, 3.93; 95.0% with no bound sign; A's note hidden
        "1  A *       2     3.142  12.3           1.23x   6.17  3.93    95.0%       94.1% [90.0%,97.5%]  ok",
        # B: $8.0 -> "8", goodput 20.0 -> "20", 2.00x, 5, 2.5; ">=" the early "pass"; no interval
        "2  disagg-b  4     8      20             2.00x   5     2.5     >=90.0%     87.5%                ok",
        # C: no goodput, so "-" for it and the three derived columns; "<=" the early "fail"; its note shown
        "3  C         1     1.5    -              -       -     -       <=60.0%     -                    "
        "misses SLO at target: TTFT: 60% within 0.5 s",
        # D: goodput 0.0 -> "0", margin 0.00x; never run at the target: "-"
        "4  D         1     0.75   0              0.00x   0     0       -           -                    "
        "infeasible: TTFT: a lone prefill exceeds 0.5 s"]]
    # the winner's (A's, not the first other row's) expected error, its two pools named together
    assert lines[5:] == [
        "expected error of A against measured runs (its goodput is judged on these TTFT/TPOT): "
        "prefill/decode: unvalidated",
        FOOTER,
        "simulations saved: 1 configs infeasible alone, 2 pruned by the analytic bound, 3 dominated, 8 searches "
        "started from a smaller sibling's goodput, 4 seeds "
        "skipped after a failed seed, 5 + 6 runs stopped early (pass + fail; 12,345 of 1,234,567 requests not "
        "simulated), 7 from cache",
        "", "recommended: A", ""]


def test_table_when_no_config_meets_the_slo():
    # C alone (header, its row, then the footer).  No winner: no expected-error line and the closing line names the
    # target rate as %g (2.5, not 2.50); no "skipped" in the result (or an empty one): no savings line
    rows = [ROWS[2]]
    for skipped in ({}, None):
        result = {"winner": None, "target_rate": 2.5, "rows": rows, "skipped": skipped}
        lines = _table(result)
        assert lines[2:] == [FOOTER, "", "no configuration meets the SLO at 2.5 req/s" + NO_WINNER, ""]
    # goodput mode (no target rate): no rate named
    assert _table({"winner": None, "target_rate": None, "rows": rows})[2:] == [
        FOOTER, "", "no configuration meets the SLO" + NO_WINNER, ""]
    # a savings line without "infeasible" (a result from before that count): 0 infeasible
    sk = {k: v for k, v in SKIPPED.items() if k != "infeasible"}
    assert _table({"winner": None, "target_rate": None, "rows": rows, "skipped": sk})[3].startswith(
        "simulations saved: 0 configs infeasible alone, 2 pruned by the analytic bound")


def test_the_winners_error_margin_lines():
    # A judged at bounds tightened by a fixed margin of +25% / +10%: 0.5 / 1.25 = 0.4 s and 0.05 / 1.1 = 0.04545
    # (3 digits: 0.0455) s; its long run's attainment at pdsim's p90 error 87.5%.  B (not the winner) has other
    # values, which must not show
    margin = {"ttft_factor": 1.25, "tpot_factor": 1.1, "source": "fixed: TTFT +25%, TPOT +10%"}
    a = {**_row(1, "A", 1, 1.0, 2.0), "judged_ttft_s": 0.4, "judged_tpot_s": 0.05 / 1.1, "error_margin": margin,
         "long_run_attainment_at_p90_error": 0.875}
    b = {**_row(2, "B", 1, 2.0, 1.0), "judged_ttft_s": 0.3, "judged_tpot_s": 0.03, "error_margin": None,
         "long_run_attainment_at_p90_error": 0.5}
    assert _table({"winner": "A", "target_rate": None, "rows": [a, b]})[3:6] == [
        "A at pdsim's p90 error (its long run judged at the bounds / the p90 of measured/simulated latency over its "
        "validation runs): attainment 87.5%",
        "A judged at TTFT <= 0.4 s and TPOT <= 0.0455 s: the SLO's bounds / 1.25 and / 1.1 (goodput.error_margin, "
        "fixed: TTFT +25%, TPOT +10%)",
        FOOTER]
    # no margin and no p90 judgement (None): neither line; an attainment of 0.0 at the p90 error is still said
    for err in (None, {}):
        a.update(error_margin=err, long_run_attainment_at_p90_error=None)
        assert _table({"winner": "A", "target_rate": None, "rows": [a, b]})[3] == FOOTER
    a.update(long_run_attainment_at_p90_error=0.0)
    assert _table({"winner": "A", "target_rate": None, "rows": [a, b]})[3].endswith("): attainment 0.0%")


def test_no_winner_at_bounds_a_margin_tightened():
    # a named margin is named, a fixed one ({ttft, tpot}) is "fixed"; "none" or no margin: not mentioned
    rows = [ROWS[2]]
    said = " at the bounds goodput.error_margin ({}) tightened (plan.csv: judged_ttft_s, judged_tpot_s)"
    for margin, text in (("p90", said.format("p90")), ("median", said.format("median")),
                         ({"ttft": 0.3, "tpot": 0.1}, said.format("fixed")), ("none", ""), (None, "")):
        lines = _table({"winner": None, "target_rate": 2.5, "rows": rows, "error_margin": margin})
        assert lines[4] == "no configuration meets the SLO at 2.5 req/s" + text + NO_WINNER


def test_a_winner_without_an_expected_error_has_no_line_for_it():
    for err in (None, {}):
        row = _row(1, "A", 1, 1.0, 2.0, status="ok", expected_error=err)
        assert _table({"winner": "A", "target_rate": None, "rows": [row]})[2:] == [FOOTER, "", "recommended: A", ""]


def test_whole_numbers_are_printed_whole():
    # the rank and the GPUs are ints: printed as they are (1000, 1024), not to 3 significant digits as a float
    # is (1e+03, 1.02e+03); a float goodput 1024.0 to 3 significant digits without an exponent ("1,020"), its $/h
    # to 4 digits ("2048")
    row = _row(1000, "big", 1024, 2048.0, 1024.0, status="ok")
    assert _table({"winner": None, "target_rate": None, "rows": [row]})[1].split() == [
        "1000", "big", "1024", "2048", "1,020", "-", "-", "-", "-", "-", "ok"]
    # 12345.6 req/s to 3 digits: 12,300; $/h 98765.4 to 4: 98,770
    row = _row(1, "huge", 1, 98765.4, 12345.6, status="ok")
    assert _table({"winner": None, "target_rate": None, "rows": [row]})[1].split()[3:5] == ["98,770", "12,300"]


def test_table_with_no_rows_is_its_header():
    # every column as wide as its header
    assert _table({"winner": None, "target_rate": None, "rows": []}) == [
        "#  config  GPUs  $/h  goodput req/s  margin  /GPU  /($/h)  att@target  long run [95% CI]  status",
        FOOTER, "", "no configuration meets the SLO" + NO_WINNER, ""]


def _many(n, last="c"):
    """n rows named c00, c01, ... (the last one ``last``), each 1 GPU at $1/h."""
    return [_row(i + 1, f"c{i:02d}" if i < n - 1 else last, 1, 1.0, 1.0, status="ok") for i in range(n)]


def test_the_table_stops_at_its_limit_and_says_how_many_more():
    long = "a-much-longer-config-name"       # 25 characters, in the row past the limit
    # 26 rows: 25 printed (the default limit), "1 more"; the config column only as wide as the printed rows'
    # names ("config", 6), not the 26th's
    lines = _table({"winner": None, "target_rate": None, "rows": _many(26, long)})
    assert len(lines) == 1 + 25 + 5
    assert lines[1].startswith("1   c00     1     1    1              -") and long not in "".join(lines)
    assert lines[25].startswith("25  c24     1") and lines[26] == "... 1 more in plan.csv"
    # 25 rows: all printed, nothing more
    lines = _table({"winner": None, "target_rate": None, "rows": _many(25)})
    assert len(lines) == 1 + 25 + 4 and lines[26] == FOOTER
    # a limit of 2 over 4 rows: 2 more
    lines = _table({"winner": None, "target_rate": None, "rows": _many(4)}, limit=2)
    assert [s.split()[1] for s in lines[1:3]] == ["c00", "c01"] and lines[3] == "... 2 more in plan.csv"


def test_the_table_goes_to_stdout_by_default(capsys):
    print_table({"winner": None, "target_rate": None, "rows": []})
    assert capsys.readouterr().out.startswith("#  config  GPUs  $/h  goodput req/s")


# --- the files -----------------------------------------------------------------------------------
SEARCH = {"devices": [{"name": "h100-sxm", "price_per_hour_usd": 1.0}], "colocated": {"replicas": [1]},
          "pool": {"max_running": 1, "kv_blocks": 1000, "cost_model": {"kind": "constant", "step_s": 0.1}}}


@pytest.fixture(scope="module")
def plan():
    raw = {"name": "outs", "model": "llama-3.1-8b", "seed": 7,
           "workload": {"arrival": "poisson", "num_requests": 100, "prompt_tokens": 8, "output_tokens": 1},
           "slo": {"ttft_s": 0.5, "tpot_s": 0.05, "attainment_target": 0.9}, "search": SEARCH,
           "goodput": {"min_duration_s": 0, "seeds": 1, "tolerance": 0.25, "confirm_top": 0}}
    return parse_plan(raw)


@pytest.fixture
def report(monkeypatch):
    """build_plan_report replaced by a recorder (the page has its own tests, test_plan_report)."""
    import pdsim.plan_report
    calls = []
    monkeypatch.setattr(pdsim.plan_report, "build_plan_report", lambda result, out: calls.append((result, out)))
    return calls


def _result(plan, winner=True):
    """The plan's one config as a result: goodput 2.5 req/s on 1 GPU at $1/h, its TTFT p90 at the (never
    reached) target +inf, the extra columns a ranked row has (points, bracket, topology) beside the table's."""
    (cfg,) = plan.configs
    row = {**_row(1, cfg.name, 1, 1.0, 2.5, None, 2.5, 2.5, None, None, 0.95, (0.9, 1.0), "ok", "", True,
                  {"replica": "unvalidated"}),
           "kind": "colocated", "bound_rate": 12.0, "bracket": [2.5, None], "points": {"2.5": {"ttft_p": math.inf}},
           "ttft_p_at_target_s": -math.inf, "tpot_p_at_target_s": float("nan"), "meets": winner,
           "topology": cfg.topology, "judged_ttft_s": 0.4, "judged_tpot_s": 0.05,
           "long_run_attainment_at_p90_error": None}
    return {"plan": "outs", "objective": "goodput_per_dollar", "target_rate": None, "winner": cfg.name if winner
            else None, "rows": [row], "frontier": [cfg.name], "excluded": [], "simulations": 3, "cached": 0,
            "wall_s": 1.5}


def test_plan_files_by_hand(plan, report, tmp_path, capsys):
    out = tmp_path / "a" / "b"                 # parents made
    result = _result(plan)
    write_plan_outputs(plan, result, out)
    assert sorted(p.name for p in out.iterdir()) == ["plan.csv", "plan.json", "winner.yaml"]
    assert report == [(result, out)] and capsys.readouterr().err == ""    # the page: plan_report's (recorded)
    # plan.csv: the table's columns in TABLE_COLS' order, None empty, the long-run interval as its list, the
    # expected error as one line ("replica: unvalidated"), -inf / nan as pandas writes them; the bounds it was
    # judged at (TTFT tightened to 0.4 s here, TPOT as the SLO's)
    with open(out / "plan.csv", newline="") as fh:
        header, line, *more = list(csv.reader(fh))
    assert header == TABLE_COLS and more == []
    got = dict(zip(header, line))
    assert got == {"rank": "1", "config": plan.configs[0].name, "gpus": "1", "usd_per_hour": "1.0", "goodput": "2.5",
                   "margin": "", "goodput_per_gpu": "2.5", "goodput_per_usd_hour": "2.5", "attainment_at_target": "",
                   "at_target_early_stop": "", "long_run_attainment": "0.95", "long_run_ci": "(0.9, 1.0)",
                   "ttft_p_at_target_s": "-inf", "tpot_p_at_target_s": "", "bound_rate": "12.0", "pareto": "True",
                   "status": "ok", "note": "", "expected_error": "replica: unvalidated", "judged_ttft_s": "0.4",
                   "judged_tpot_s": "0.05", "long_run_attainment_at_p90_error": ""}
    # plan.json: strict JSON (no Infinity / NaN tokens), two-space indent, every non-finite float a string,
    # the tuple a list
    text = (out / "plan.json").read_text()
    assert text.startswith('{\n  "plan": "outs",\n  "objective"')
    assert "Infinity" not in text and "NaN" not in text
    back = json.loads(text)
    (r,) = back["rows"]
    assert (r["points"], r["ttft_p_at_target_s"], r["tpot_p_at_target_s"], r["long_run_ci"]) == (
        {"2.5": {"ttft_p": "inf"}}, "-inf", "nan", [0.9, 1.0])
    assert {k: v for k, v in back.items() if k != "rows"} == {k: v for k, v in result.items() if k != "rows"}
    # winner.yaml: its comment line, then the winner's scenario in winner_scenario's own key order
    win = (out / "winner.yaml").read_text()
    assert win.startswith("# Ready to run: pdsim run winner.yaml\n")
    sc = winner_scenario(plan, result)
    assert yaml.safe_load(win) == sc and sc["workload"]["rate"] == 2.5      # at the goodput (no target)
    keys = [s.split(":")[0] for s in win.splitlines()[1:] if s and not s.startswith(" ")]
    assert keys == list(sc) and keys != sorted(keys)


def test_plan_files_replace_the_last_plans(plan, report, tmp_path, capsys):
    # the folder exists, with the last plan's four outputs and its cache: a plan with no winner leaves no
    # winner.yaml; the cache stays; progress announces the page on stderr
    for name in PLAN_OUTPUTS:
        (tmp_path / name).write_text("old")
    (tmp_path / "cache").mkdir()
    (tmp_path / "cache" / "k.json").write_text("{}")
    write_plan_outputs(plan, _result(plan, winner=False), tmp_path, progress=True)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cache", "plan.csv", "plan.json"]
    assert (tmp_path / "cache" / "k.json").read_text() == "{}"
    assert json.loads((tmp_path / "plan.json").read_text())["winner"] is None
    assert capsys.readouterr().err == "pdsim plan: building plan.html...\n" and len(report) == 1


def test_plan_json_writes_what_json_cannot_as_text(plan, report, tmp_path):
    # a value json has no type for (a path) is written as its str, not refused
    result = {**_result(plan), "plan_file": tmp_path / "p.yaml"}
    write_plan_outputs(plan, result, tmp_path)
    assert json.loads((tmp_path / "plan.json").read_text())["plan_file"] == str(tmp_path / "p.yaml")


def test_clear_removes_only_the_four_outputs(tmp_path):
    # the four outputs go, a dangling link named like one too (is_file is False for it); a folder named
    # like one, the cache and any other file stay; the folder may be given as a str
    (tmp_path / "winner.yaml").write_text("w")
    (tmp_path / "plan.csv").write_text("c")
    (tmp_path / "plan.html").symlink_to(tmp_path / "gone.html")
    (tmp_path / "plan.json").mkdir()
    (tmp_path / "cache").mkdir()
    (tmp_path / "notes.txt").write_text("n")
    clear_plan_outputs(str(tmp_path))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cache", "notes.txt", "plan.json"]
    clear_plan_outputs(tmp_path / "missing")            # nothing there: nothing to do


def test_json_safe_by_hand():
    got = plan_mod.json_safe({"a": [1.5, math.inf, (-math.inf, float("nan"))], "b": {"c": 2, "d": None},
                              "e": "inf", "f": 0.0, "g": True})
    assert got == {"a": [1.5, "inf", ["-inf", "nan"]], "b": {"c": 2, "d": None}, "e": "inf", "f": 0.0, "g": True}
    assert type(got["a"][2]) is list and plan_mod.json_safe(-1e308 * 10) == "-inf"


# --- the code hash -------------------------------------------------------------------------------
def test_code_hash_is_the_sources_and_data_by_name_and_bytes(tmp_path, monkeypatch):
    # pdsim's folder replaced by a small one: a.txt, sub/b.json and z.py count; compiled files (.pyc, .pyo)
    # and anything under __pycache__ do not; each file enters as "name\0bytes\0" in sorted order
    root = tmp_path / "pkg"
    (root / "sub").mkdir(parents=True)
    (root / "__pycache__").mkdir()
    (root / "a.txt").write_bytes(b"A")
    (root / "sub" / "b.json").write_bytes(b"{}")
    (root / "z.py").write_bytes(b"x = 1\n")
    (root / "old.pyc").write_bytes(b"c")
    (root / "old.pyo").write_bytes(b"o")
    (root / "__pycache__" / "notes.txt").write_bytes(b"n")
    monkeypatch.setattr(plan_mod, "__file__", str(root / "z.py"))
    monkeypatch.setattr(plan_mod, "_CODE_HASH", [])
    want = hashlib.sha256(b"a.txt\0A\0sub/b.json\0{}\0z.py\0x = 1\n\0").hexdigest()
    assert plan_mod.code_hash() == want
    # memoised for the process: an edit is not seen until the memo is cleared
    (root / "sub" / "b.json").write_bytes(b"[]")
    assert plan_mod.code_hash() == want
    plan_mod._CODE_HASH.clear()
    assert plan_mod.code_hash() == hashlib.sha256(b"a.txt\0A\0sub/b.json\0[]\0z.py\0x = 1\n\0").hexdigest()
    # a compiled file or a __pycache__ entry edited: the same hash
    plan_mod._CODE_HASH.clear()
    (root / "old.pyc").write_bytes(b"cc")
    (root / "__pycache__" / "notes.txt").write_bytes(b"nn")
    assert plan_mod.code_hash() == hashlib.sha256(b"a.txt\0A\0sub/b.json\0[]\0z.py\0x = 1\n\0").hexdigest()


# --- the local executor --------------------------------------------------------------------------
def _pid(x):
    return x, os.getpid()


def _nap_and_mark(path):
    time.sleep(0.1)
    open(path, "w").close()
    return path


def test_local_executor_jobs(monkeypatch):
    assert LocalExecutor(3).jobs == 3
    monkeypatch.setattr(os, "cpu_count", lambda: 5)
    assert LocalExecutor().jobs == 5 and LocalExecutor(0).jobs == 5
    monkeypatch.setattr(os, "cpu_count", lambda: None)       # unknown: one
    assert LocalExecutor().jobs == 1


def test_local_executor_runs_inline_with_one_job_or_one_task():
    ticks = []
    me = os.getpid()
    # one job: in this process, in order, one tick each; no pool made (close has nothing to shut down)
    ex = LocalExecutor(1)
    assert ex.map(_pid, [3, 1, 2], on_done=lambda: ticks.append(1)) == [(3, me), (1, me), (2, me)]
    assert ticks == [1, 1, 1] and ex._pool is None
    ex.close()
    # one task on many jobs: inline too; no on_done is fine
    ex = LocalExecutor(4)
    assert ex.map(_pid, [7]) == [(7, me)] and ex._pool is None
    assert ex.map(_pid, []) == []


def test_local_executor_pool_keeps_order_ticks_each_and_closes():
    ticks = []
    ex = LocalExecutor(3)
    got = ex.map(_pid, [5, 6, 7], on_done=lambda: ticks.append(1))
    assert [x for x, _ in got] == [5, 6, 7] and all(pid != os.getpid() for _, pid in got) and ticks == [1, 1, 1]
    pool = ex._pool
    assert pool._max_workers == 3        # the jobs asked for, not the machine's cores (2 on the machine measured)
    assert ex.map(_pid, [8, 9])[1][0] == 9 and ex._pool is pool          # the pool is kept between maps
    ex.close()
    with pytest.raises(RuntimeError):                # shut down: takes no more work
        pool.submit(_pid, 1)


def test_a_failed_tick_cancels_the_tasks_not_started(tmp_path):
    # on_done raises on the first result: the map ends, and the tasks still waiting in the pool's queue are
    # cancelled, so fewer than all 20 ever run (2 workers; at most the 2 running and the few already handed
    # to the pool's call queue start after the first result: 5 or 6 here; all 20 without the cancel, and they take
    # 1 s, so a main thread held up for most of a second by a busy machine still sees fewer)
    ex = LocalExecutor(2)

    def boom():
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        ex.map(_nap_and_mark, [tmp_path / f"{i}" for i in range(20)], on_done=boom)
    ex.close()                                      # waits for those that started
    assert len(list(tmp_path.iterdir())) < 20
