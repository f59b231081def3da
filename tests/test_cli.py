"""The command line: outputs are never half-written, and every input is checked before any work, with one line.

Each test reproduces a defect seen from the CLI (a traceback, a second run interleaving its rows, a folder
left half-written by Ctrl-C and then rendered anyway, a negative TFLOP/s) and checks the behaviour against
what was done to the input by hand: the file that was cut, the flag that was given.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

import pdsim.simulation
from pdsim.__main__ import build_parser, main
LOCK_NAME, STAGING_PREFIX = ".pdsim.lock", ".pdsim-staging-"   # documented in pdsim/output.py

REPO = Path(__file__).resolve().parents[1]

TINY = ("model: llama-3.1-8b\n"
        "workload: {arrival: poisson, rate: 2, num_requests: 5, prompt_tokens: 100, output_tokens: 10}\n"
        "topologies:\n"
        "  a: {kind: colocated, replicas: 1, kv_blocks: 1000, cost_model: {kind: constant, step_s: 0.01}}\n"
        "  b: {kind: colocated, replicas: 2, kv_blocks: 1000, cost_model: {kind: constant, step_s: 0.01}}\n")

PLAN = ("seed: 0\nmodel: llama-3.1-8b\n"
        "workload: {arrival: poisson, num_requests: 20, prompt_tokens: 100, output_tokens: 10}\n"
        "slo: {ttft_s: 0.5, tpot_s: 0.05, attainment_target: 0.9}\n"
        "target: {rate: 2}\nobjective: cheapest\n"
        "search: {devices: [h100-sxm], colocated: {tp: [1], replicas: [1, 2]}}\n"
        "budget: {max_gpus: 2}\n")


def _write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def _one_line(err: str, *needles: str) -> None:
    assert err.startswith("pdsim: error: ") and err.count("\n") == 1 and "Traceback" not in err, err
    for n in needles:
        assert n in err, (n, err)


def _snapshot(folder: Path) -> dict:
    return {p.name: p.read_bytes() for p in folder.iterdir() if p.is_file() and p.name != LOCK_NAME}


@pytest.fixture
def no_simulation(monkeypatch):
    """Replace simulate by a recorder: a check that must happen up front leaves it uncalled."""
    calls = []
    monkeypatch.setattr(pdsim.simulation, "simulate", lambda *a, **k: calls.append(a) or [])
    return calls


# ======================================================= --out: checked before simulating, locked, atomic

def _readonly_folder(tmp_path: Path) -> Path:
    if os.geteuid() == 0:   # root writes through permission bits: use a file system that refuses everyone
        if not Path("/proc/self").is_dir():
            pytest.skip("no /proc and running as root: no read-only place to try")
        return Path("/proc/self/pdsim-out")
    ro = tmp_path / "ro"
    ro.mkdir()
    ro.chmod(0o500)
    return ro / "out"


@pytest.mark.parametrize("case", ["existing-file", "below-a-file", "read-only"])
def test_bad_out_fails_before_simulating(tmp_path: Path, capsys, no_simulation, case: str) -> None:
    scen = _write(tmp_path / "s.yaml", TINY)
    afile = _write(tmp_path / "afile", "keep me\n")
    out = {"existing-file": afile, "below-a-file": afile / "sub",
           "read-only": _readonly_folder(tmp_path)}[case]
    rc = main(["run", str(scen), "--out", str(out), "--quiet"])
    _one_line(capsys.readouterr().err, "--out", str(out))
    assert rc == 2
    assert no_simulation == [], "the simulation ran before --out was checked"
    assert afile.read_text() == "keep me\n"


def test_second_run_on_the_same_out_fails_at_once(tmp_path: Path, capsys, monkeypatch) -> None:
    """While one run simulates, a second process on the same --out exits 2 with one line; the first run's
    files are then whole (its rows only, matching its summary)."""
    scen = _write(tmp_path / "s.yaml", TINY)
    out = tmp_path / "out"
    real = pdsim.simulation.simulate
    second = {}

    def simulate_with_a_rival(sc, **kw):
        second["proc"] = subprocess.run([sys.executable, "-m", "pdsim", "run", str(scen), "--out", str(out),
                                         "--quiet", "--set", "workload.num_requests=7"],
                                        capture_output=True, text=True, timeout=300, cwd=tmp_path)
        return real(sc, **kw)

    monkeypatch.setattr(pdsim.simulation, "simulate", simulate_with_a_rival)
    assert main(["run", str(scen), "--out", str(out), "--quiet"]) == 0, capsys.readouterr().err
    proc = second["proc"]
    assert proc.returncode == 2, proc.stderr
    _one_line(proc.stderr, "--out", "another pdsim run", LOCK_NAME)
    assert proc.stdout == ""
    df = pd.read_csv(out / "requests.csv")
    summary = json.loads((out / "summary.json").read_text())
    assert len(df) == 2 * 5                                   # 5 requests x 2 topologies, not 5 + 7
    assert {n: t["requests"]["total"] for n, t in summary["topologies"].items()} == {"a": 5, "b": 5}
    from filelock import FileLock
    FileLock(str(out / LOCK_NAME)).acquire(timeout=0)   # released once the first run is done


def test_lock_held_by_another_process_refuses_without_simulating(tmp_path: Path, capsys, no_simulation) -> None:
    from filelock import FileLock
    scen = _write(tmp_path / "s.yaml", TINY)
    out = tmp_path / "out"
    out.mkdir()
    _write(out / "summary.json", "{}")
    with FileLock(str(out / LOCK_NAME)):
        rc = main(["run", str(scen), "--out", str(out), "--quiet"])
    _one_line(capsys.readouterr().err, "another pdsim run")
    assert rc == 2 and no_simulation == []
    assert (out / "summary.json").read_text() == "{}"


def test_interrupt_while_writing_keeps_the_previous_run(tmp_path: Path, capsys, monkeypatch) -> None:
    """Ctrl-C while requests.csv is being written: the folder still holds the previous run, whole, and
    pdsim report renders that one; no staging folder is left behind."""
    scen = _write(tmp_path / "s.yaml", TINY)
    out = tmp_path / "out"
    assert main(["run", str(scen), "--out", str(out), "--quiet"]) == 0, capsys.readouterr().err
    before = _snapshot(out)
    assert set(before) == {"requests.csv", "summary.json", "timeseries.csv", "report.html"}
    from pdsim import output
    real_write_csv = output.write_csv

    def cut_after_header(df, path, *a, **k):
        real_write_csv(df.head(0), path, *a, **k)     # what a Ctrl-C after the first write leaves
        raise KeyboardInterrupt

    monkeypatch.setattr(output, "write_csv", cut_after_header)
    assert main(["run", str(scen), "--out", str(out), "--quiet", "--set", "workload.num_requests=9"]) == 130
    monkeypatch.setattr(output, "write_csv", real_write_csv)
    assert _snapshot(out) == before
    assert not [p for p in out.iterdir() if p.name.startswith(STAGING_PREFIX)]
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(STAGING_PREFIX)]
    capsys.readouterr()
    assert main(["report", str(out)]) == 0, capsys.readouterr().err


def test_failed_run_leaves_no_folder_and_rerun_keeps_other_files(tmp_path: Path, capsys) -> None:
    """A run that fails once simulating (a model key found bad at run time) leaves no --out folder it made;
    a run into an existing folder replaces the run files (a stale one of an older run too) and keeps the
    user's own."""
    bad = _write(tmp_path / "bad.yaml", TINY.replace(
        "model: llama-3.1-8b", "model: {layers: 2, hidden: 256, heads: 8, kv_heads: 3, mlp_width: 512, vocab: 1000}"))
    out = tmp_path / "new" / "out"
    assert main(["run", str(bad), "--out", str(out), "--quiet"]) == 2
    _one_line(capsys.readouterr().err, "kv_heads")
    assert not (tmp_path / "new").exists(), "a failed run left the output folder it created"

    scen = _write(tmp_path / "s.yaml", TINY)
    out = tmp_path / "out"
    _write(out / "notes.txt", "mine\n")
    _write(out / "requests.csv", "topology,request_id\nold,0\n")
    assert main(["run", str(scen), "--out", str(out), "--quiet", "--set", "workload.num_requests=4"]) == 0
    assert (out / "notes.txt").read_text() == "mine\n"
    assert len(pd.read_csv(out / "requests.csv")) == 2 * 4
    s = json.loads((out / "summary.json").read_text())
    assert s["outputs"]["requests.csv"]["rows"] == 8
    assert {t["requests"]["total"] for t in s["topologies"].values()} == {4}
    assert not [p for p in out.iterdir() if p.name.startswith(STAGING_PREFIX)]


# ====================================================== pdsim report: a folder that is not one whole run

@pytest.fixture(scope="module")
def good_run(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("good")
    scen = _write(d / "s.yaml", TINY)
    assert main(["run", str(scen), "--out", str(d / "out"), "--quiet"]) == 0
    return d / "out"


def _cut_rows(p: Path, keep: int) -> None:
    lines = p.read_text().splitlines(keepends=True)
    p.write_text("".join(lines[:1 + keep]))


CORRUPTIONS = {
    # name: (what is done to a copy of a good run folder, the file the error must name)
    "header-only-requests": (lambda d: _cut_rows(d / "requests.csv", 0), "requests.csv"),
    "one-row-short": (lambda d: _cut_rows(d / "requests.csv", 9), "requests.csv"),
    "empty-requests": (lambda d: (d / "requests.csv").write_bytes(b""), "requests.csv"),
    "binary-requests": (lambda d: (d / "requests.csv").write_bytes(b"\x89PNG\r\n\x1a\n\x00\xff\xfe" * 50),
                        "requests.csv"),
    "text-in-ttft": (lambda d: (d / "requests.csv").write_text(
        (d / "requests.csv").read_text().replace("\na,0,", "\na,0,oops-", 1)), "requests.csv"),
    "no-requests": (lambda d: (d / "requests.csv").unlink(), "requests.csv"),
    "no-summary": (lambda d: (d / "summary.json").unlink(), "summary.json"),
    "truncated-summary": (lambda d: (d / "summary.json").write_text((d / "summary.json").read_text()[:200]),
                          "summary.json"),
    "summary-not-a-run": (lambda d: (d / "summary.json").write_text("[1, 2, 3]"), "summary.json"),
    "other-runs-summary": (lambda d: (d / "summary.json").write_text(
        (d / "summary.json").read_text().replace('"total": 5', '"total": 6')), "requests.csv"),
    "no-timeseries": (lambda d: (d / "timeseries.csv").unlink(), "timeseries.csv"),
    "timeseries-cut": (lambda d: _cut_rows(d / "timeseries.csv", 1), "timeseries.csv"),
}


@pytest.mark.parametrize("case", sorted(CORRUPTIONS))
def test_report_refuses_a_folder_that_is_not_one_whole_run(good_run: Path, tmp_path: Path, capsys,
                                                            case: str) -> None:
    import shutil
    d = tmp_path / "out"
    shutil.copytree(good_run, d)
    (d / "report.html").unlink()
    spoil, named = CORRUPTIONS[case]
    spoil(d)
    rc = main(["report", str(d)])
    _one_line(capsys.readouterr().err, str(d / named))
    assert rc == 2
    assert not (d / "report.html").exists(), "a report was drawn from a broken folder"


def _edit_csv(p: Path, fn) -> None:
    df = pd.read_csv(p)
    fn(df)
    df.to_csv(p, index=False)


def _edit_summary(d: Path, fn) -> None:
    s = json.loads((d / "summary.json").read_text())
    fn(s)
    (d / "summary.json").write_text(json.dumps(s))


def _set(df, row, col, v):
    df[col] = df[col].astype(object)
    df.loc[row, col] = v


_AGAIN = "rerun pdsim run to write a complete folder"
TAMPERED = {
    # name: (the edit, the file named, the rest of the one line) -- each rendered (rc 0) or crashed before
    "duplicate-row": (lambda d: _edit_csv(d / "requests.csv", lambda df: df.__setitem__(
        "request_id", df["request_id"].where(df.index != 1, df["request_id"][0]))), "requests.csv:3",
        "request_id = 0: a second row of the same request: the file was edited or comes from different runs"),
    "ttft-99": (lambda d: _edit_csv(d / "requests.csv", lambda df: _set(df, 0, "ttft_s", 99)), "summary.json",
                "topologies.a.slo_attainment = 1.0: not the share of requests.csv's rows meeting the SLO (0.8): "
                "the files were edited or come from different runs"),
    "ttft-negative": (lambda d: _edit_csv(d / "requests.csv", lambda df: _set(df, 0, "ttft_s", -5)),
                      "requests.csv:2", "ttft_s = -5.0: not a duration (finite, >= 0 seconds)"),
    "ttft-empty": (lambda d: _edit_csv(d / "requests.csv", lambda df: _set(df, 0, "ttft_s", None)),
                   "requests.csv:2", "ttft_s = nan: empty, but the row's request finished, so it has one"),
    "status-bogus": (lambda d: _edit_csv(d / "requests.csv", lambda df: _set(df, 0, "status", "bogus")),
                     "requests.csv:2",
                     "status = 'bogus': not a request status (one of finished, rejected, abandoned, unfinished)"),
    "attainment-edited": (lambda d: _edit_summary(d, lambda s: s["topologies"]["a"].update(slo_attainment=0.1)),
                          "summary.json", "topologies.a.slo_attainment = 0.1: not the share of requests.csv's rows "
                          "meeting the SLO (1.0): the files were edited or come from different runs"),
    "attainment-text": (lambda d: _edit_summary(d, lambda s: s["topologies"]["a"].update(slo_attainment="high")),
                        "summary.json", "topologies.a.slo_attainment = 'high': not a number"),
    "p90-text": (lambda d: _edit_summary(d, lambda s: s["topologies"]["a"]["ttft_s"].update(p90="x")),
                 "summary.json", "topologies.a.ttft_s.p90 = 'x': not a number"),
    "finished-count": (lambda d: _edit_summary(d, lambda s: s["topologies"]["a"]["requests"].update(
        finished=4, unfinished=1)), "requests.csv", "finished rows of topology a = 5: summary.json counts 4 "
        "finished requests for this topology: the files were edited or come from different runs"),
    "timeseries-topology": (lambda d: _edit_csv(d / "timeseries.csv", lambda df: _set(df, 0, "topology", "zzz")),
                            "timeseries.csv:2", "topology = 'zzz': a topology that summary.json does not have: "
                            "the files come from different runs"),
    "no-scenario": (lambda d: _edit_summary(d, lambda s: s.pop("scenario")), "summary.json",
                    "scenario: missing: the run's scenario and its SLO"),
    "no-slo": (lambda d: _edit_summary(d, lambda s: s["scenario"].pop("slo")), "summary.json",
               "scenario.slo: missing: the run's scenario and its SLO"),
    "busy-text": (lambda d: _edit_csv(d / "timeseries.csv", lambda df: _set(df, 0, "busy_fraction", "abc")),
                  "timeseries.csv:2", "busy_fraction = 'abc': not a number"),
}


@pytest.mark.parametrize("case", sorted(TAMPERED))
def test_report_refuses_an_edited_folder_in_one_line(good_run: Path, tmp_path: Path, capsys, case: str) -> None:
    """Files that are whole but disagree with each other or with what a run writes: one exact line, exit 2."""
    import shutil
    d = tmp_path / "out"
    shutil.copytree(good_run, d)
    (d / "report.html").unlink()
    spoil, where, what = TAMPERED[case]
    spoil(d)
    rc = main(["report", str(d)])
    assert capsys.readouterr().err == f"pdsim: error: {d}/{where}: {what}; {_AGAIN}\n"
    assert rc == 2 and not (d / "report.html").exists()


def test_report_names_the_folder_when_drawing_fails(good_run: Path, tmp_path: Path, capsys, monkeypatch) -> None:
    """What the checks did not foresee (a KeyError, ValueError, jinja2 UndefinedError while drawing): one line."""
    import shutil

    import pdsim.report
    d = tmp_path / "out"
    shutil.copytree(good_run, d)

    def broken(out_dir, **kw):
        raise KeyError("slo")
    monkeypatch.setattr(pdsim.report, "build_report", broken)
    rc = main(["report", str(d)])
    assert capsys.readouterr().err == f"pdsim: error: {d}: cannot be drawn: KeyError 'slo'; {_AGAIN}\n"
    assert rc == 2


@pytest.mark.parametrize("case", ["missing", "empty", "a-file"])
def test_report_on_a_missing_or_empty_place(tmp_path: Path, capsys, case: str) -> None:
    d = tmp_path / "d"
    if case == "empty":
        d.mkdir()
    elif case == "a-file":
        d.write_text("x")
    rc = main(["report", str(d)])
    _one_line(capsys.readouterr().err, str(d))
    assert rc == 2


def test_report_accepts_a_whole_run_with_or_without_row_counts(good_run: Path, tmp_path: Path, capsys) -> None:
    """The check is not a blanket refusal: a good folder renders, and so does one written before summary.json
    recorded its row counts (no ``outputs`` key)."""
    import shutil
    d = tmp_path / "out"
    shutil.copytree(good_run, d)
    s = json.loads((d / "summary.json").read_text())
    del s["outputs"]
    (d / "summary.json").write_text(json.dumps(s))
    (d / "report.html").unlink()
    assert main(["report", str(d)]) == 0, capsys.readouterr().err
    assert (d / "report.html").stat().st_size > 0


# ================================================================== flags: checked by argparse, one line

EST = ["estimate", "--model", "llama-3.1-8b", "--device", "h100-sxm"]


@pytest.mark.parametrize("flags,key", [
    (["--prefill", "100", "--batch", "0"], "--batch = 0"),
    (["--prefill", "100", "--batch", "-5"], "--batch = -5"),
    (["--prefill", "0"], "--prefill = 0"),
    (["--prefill", "10000000"], "--prefill = 10000000"),      # longer than the model's context
    (["--prefill", "1e3"], "--prefill = '1e3'"),
    (["--decode-batch", "0"], "--decode-batch = 0"),
    (["--decode-batch", "4", "--context", "-1"], "--context = -1"),
    (["--prefill", "100", "--tp", "0"], "--tp = 0"),
    (["--prefill", "100", "--weight-dtype", "garbage"], "--weight-dtype"),
    (["--prefill", "100", "--kv-dtype", "fp7"], "--kv-dtype"),
])
def test_estimate_rejects_bad_numbers(capsys, flags, key) -> None:
    rc = main(EST + flags)
    out, err = capsys.readouterr()
    _one_line(err, key)
    assert rc == 2 and out == "", out   # nothing printed: no negative TFLOP/s


def test_estimate_batch_scales_the_work(capsys) -> None:
    """Oracle: every FLOP of a prefill step (linear layers, attention, lm_head) is per prompt, so a batch
    of 3 identical prompts does exactly 3x the FLOPs of one, at a positive rate."""
    res = []
    for b in ("1", "3"):
        assert main(EST + ["--prefill", "512", "--batch", b, "--json"]) == 0
        res.append(json.loads(capsys.readouterr().out))
    assert res[1]["flops"] == pytest.approx(3 * res[0]["flops"], rel=1e-12)
    assert res[0]["achieved_tflops"] > 0 and res[1]["achieved_tflops"] > 0


@pytest.fixture
def no_planning(monkeypatch):
    """Replace run_plan by a recorder of the executor it was given; it stops the command with exit 2."""
    import pdsim.plan
    from pdsim.errors import PdsimError
    seen = []

    def fake(plan, ex, *a, **k):
        seen.append(ex)
        raise PdsimError("stopped by the test")

    monkeypatch.setattr(pdsim.plan, "run_plan", fake)
    return seen


@pytest.mark.parametrize("flags,key", [
    (["--jobs", "-1"], "--jobs = -1"),
    (["--jobs", "0"], "--jobs = 0"),
    (["--jobs", "two"], "--jobs = 'two'"),
    (["--executor", "dask", "--scheduler", "garbage"], "--scheduler = 'garbage'"),
    (["--executor", "dask", "--scheduler", "tcp://host:99999"], "--scheduler"),
    (["--executor", "local", "--scheduler", "tcp://10.0.0.5:8786"], "--scheduler"),   # contradicts local: say so
    (["--executor", "kubernetes"], "--executor"),
    (["--cache", "{plan}"], "--cache"),                         # a file where the cache folder should be
])
def test_plan_rejects_bad_flags_before_planning(tmp_path: Path, capsys, no_planning, flags, key) -> None:
    plan = _write(tmp_path / "p.yaml", PLAN)
    rc = main(["plan", str(plan), "--out", str(tmp_path / "o"), "--quiet"] + [f.format(plan=plan) for f in flags])
    _one_line(capsys.readouterr().err, key)
    assert rc == 2 and no_planning == []
    assert not (tmp_path / "o").exists()


def _cores() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()


def test_jobs_beyond_the_cores_are_capped_unless_forced(tmp_path: Path, capsys, no_planning) -> None:
    plan = _write(tmp_path / "p.yaml", PLAN)
    base = ["plan", str(plan), "--out", str(tmp_path / "o"), "--quiet"]
    main(base + ["--jobs", "1000"])
    err = capsys.readouterr().err
    assert no_planning[-1].jobs == _cores()
    assert "--jobs 1000 capped at" in err and "--force-jobs" in err
    main(base + ["--jobs", "1000", "--force-jobs"])
    assert no_planning[-1].jobs == 1000 and "capped" not in capsys.readouterr().err
    main(base + ["--jobs", "1"])
    assert no_planning[-1].jobs == 1 and "capped" not in capsys.readouterr().err
    main(base)                          # default: the cores this process may use
    assert no_planning[-1].jobs == _cores()


@pytest.mark.skipif(not hasattr(os, "sched_getaffinity"), reason="no CPU affinity on this platform")
def test_jobs_follow_the_cores_this_process_may_use(tmp_path: Path, capsys, monkeypatch, no_planning) -> None:
    """Under taskset or a container CPU limit os.cpu_count() overstates the cores: pinned to one core,
    the default and a larger --jobs are both one process."""
    plan = _write(tmp_path / "p.yaml", PLAN)
    base = ["plan", str(plan), "--out", str(tmp_path / "o"), "--quiet"]
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0})
    monkeypatch.setattr(os, "cpu_count", lambda: 64)
    main(base)
    assert no_planning[-1].jobs == 1
    main(base + ["--jobs", "2"])
    assert no_planning[-1].jobs == 1 and "capped at 1" in capsys.readouterr().err


def test_every_option_has_help_with_units() -> None:
    """Every option of run, estimate, plan and report says what it is; every numeric one names its unit
    in its metavar or help."""
    import argparse
    sub = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    units = ("tokens", "prompts", "requests", "gpus", "processes", "requests/s", "s)")
    for cmd in ("run", "estimate", "plan", "report"):
        for act in sub.choices[cmd]._actions:
            if isinstance(act, argparse._HelpAction):
                continue
            name = "/".join(act.option_strings) or act.dest
            assert act.help and len(act.help) > 10, f"pdsim {cmd} {name} has no help"
            if act.type is not None and getattr(act.type, "__name__", "") == "int":
                text = f"{act.metavar or ''} {act.help}".lower()
                assert any(u in text for u in units), f"pdsim {cmd} {name}: no unit in {text!r}"


# ========================================================================= scenario values found by the CLI

@pytest.mark.parametrize("edit,key", [
    (("rate: 2", "rate: 1.0e+308"), "workload.rate"),
    (("prompt_tokens: 100", "prompt_tokens: {dist: uniform, low: 50, high: 10}"), "workload.prompt_tokens"),
])
def test_scenario_values_that_crashed_after_validation(tmp_path: Path, capsys, edit, key) -> None:
    scen = _write(tmp_path / "s.yaml", TINY.replace(*edit))
    out = tmp_path / "out"
    rc = main(["run", str(scen), "--out", str(out), "--quiet"])
    _one_line(capsys.readouterr().err, str(scen), key)
    assert rc == 2 and not out.exists()


def test_trace_rate_scale_too_large_is_one_line(tmp_path: Path, capsys) -> None:
    _write(tmp_path / "t.csv", "arrived_at,num_prefill_tokens,num_decode_tokens\n0,100,5\n0.5,120,6\n")
    scen = _write(tmp_path / "s.yaml", TINY.replace(
        "{arrival: poisson, rate: 2, num_requests: 5, prompt_tokens: 100, output_tokens: 10}",
        "{arrival: trace, trace: {path: t.csv, format: vidur, rate_scale: 1.0e+308}}"))
    rc = main(["run", str(scen), "--out", str(tmp_path / "out"), "--quiet"])
    _one_line(capsys.readouterr().err, "workload.trace.rate_scale")
    assert rc == 2


def test_highest_accepted_rate_runs_and_reports(tmp_path: Path, capsys) -> None:
    """The bound is not below what works: the largest accepted rate simulates and draws its report."""
    from pdsim.config import MAX_RATE
    scen = _write(tmp_path / "s.yaml", TINY.replace("rate: 2", f"rate: {MAX_RATE:.1e}"))
    assert main(["run", str(scen), "--out", str(tmp_path / "out"), "--quiet"]) == 0, capsys.readouterr().err
    assert (tmp_path / "out" / "report.html").exists()


def test_interrupt_between_moves_leaves_a_folder_report_refuses(tmp_path: Path, capsys, monkeypatch) -> None:
    """The narrowest window: Ctrl-C after the new requests.csv is moved in but before the new summary.json.
    Same request count, another seed: only the missing summary.json can tell the mix apart, and
    pdsim report must refuse it rather than draw one run's rows under another run's summary."""
    scen = _write(tmp_path / "s.yaml", TINY)
    out = tmp_path / "out"
    assert main(["run", str(scen), "--out", str(out), "--quiet"]) == 0, capsys.readouterr().err
    old_requests = (out / "requests.csv").read_bytes()
    real_replace, moved = os.replace, []

    def replace_then_interrupt(src, dst):
        real_replace(src, dst)
        moved.append(Path(dst).name)
        if len(moved) == 1:
            raise KeyboardInterrupt

    monkeypatch.setattr(os, "replace", replace_then_interrupt)
    assert main(["run", str(scen), "--out", str(out), "--quiet", "--set", "seed=7"]) == 130
    monkeypatch.setattr(os, "replace", real_replace)
    assert moved == ["requests.csv"] and (out / "requests.csv").read_bytes() != old_requests
    capsys.readouterr()
    assert main(["report", str(out)]) == 2
    _one_line(capsys.readouterr().err, str(out / "summary.json"), "did not finish")


def test_every_cli_option_says_what_it_is():
    """Issue #16: units in every --help.  Every option of every subcommand has a help text (argparse
    prints nothing for an option without one)."""
    import argparse

    from pdsim.__main__ import build_parser
    parser = build_parser([])
    missing = []

    def walk(p, path):
        for a in p._actions:
            if isinstance(a, argparse._SubParsersAction):
                for name, sub in a.choices.items():
                    walk(sub, path + [name])
            elif a.option_strings and a.help in (None, "") and not isinstance(a, argparse._HelpAction):
                missing.append(" ".join(path + [a.option_strings[-1]]))
    walk(parser, ["pdsim"])
    assert not missing, missing


def test_run_table_numbers_have_no_exponents():
    """A planner reads 4,530 ms, not 4.53e+03 (seen on the autoscaling scenario's mean-sized topology)."""
    from pdsim.__main__ import _fmt
    assert [_fmt(x) for x in (4530.2, 18234.0, 999.4, 0.0123, None)] == ["4,530", "18,200", "999", "0.0123", "-"]
    assert _fmt(4.5302, 1e3) == "4,530" and _fmt(252.54, 1, 4) == "252.5"


# ======================================================= --requests-format parquet

def test_parquet_requests_table_round_trips_and_replaces_the_csv(tmp_path: Path, capsys) -> None:
    """`--requests-format parquet` writes requests.parquet in place of requests.csv (never both: switching the
    format in one --out removes the other file), summary.json names it with its row count, and its values are
    the CSV's: the CSV writes 9 significant digits (relative error <= 5e-9), Parquet the float64 itself."""
    pytest.importorskip("pyarrow")
    scen = _write(tmp_path / "s.yaml", TINY)
    out = tmp_path / "out"
    assert main(["run", str(scen), "--out", str(out), "--quiet", "--no-report"]) == 0
    csv = pd.read_csv(out / "requests.csv", low_memory=False)
    assert main(["run", str(scen), "--out", str(out), "--quiet", "--no-report", "--requests-format", "parquet"]) == 0
    assert "requests.parquet, summary.json" in capsys.readouterr().err
    assert (out / "requests.parquet").is_file() and not (out / "requests.csv").exists()
    pq = pd.read_parquet(out / "requests.parquet")
    outputs = json.loads((out / "summary.json").read_text())["outputs"]
    assert outputs["requests.parquet"] == {"rows": 10} and "requests.csv" not in outputs and len(pq) == 10
    assert list(pq.columns) == list(csv.columns)
    for c in csv.columns:
        if pd.api.types.is_bool_dtype(pq[c]) or not pd.api.types.is_numeric_dtype(pq[c]):
            # text: the CSV reads an empty field back as NaN, Parquet keeps the empty string
            assert pq[c].astype(object).fillna("").astype(str).tolist() == \
                csv[c].astype(object).fillna("").astype(str).tolist(), c
        else:
            a, b = pq[c].to_numpy(float), csv[c].to_numpy(float)
            assert ((a == b) | (abs(a - b) <= 5e-9 * abs(a)) | (pd.isna(a) & pd.isna(b))).all(), c
    # and back: the parquet file goes, the csv returns
    assert main(["run", str(scen), "--out", str(out), "--quiet", "--no-report"]) == 0
    assert (out / "requests.csv").is_file() and not (out / "requests.parquet").exists()


def test_report_of_a_parquet_run_equals_the_csv_runs(tmp_path: Path) -> None:
    """`pdsim report` renders a Parquet run as it renders the CSV run of the same scenario: the same page but
    for the plots' random clip ids, the wall time and the exact numbers behind sortable cells (data-value),
    which differ only below the CSV's 9 significant digits."""
    import re
    pytest.importorskip("pyarrow")
    scen = _write(tmp_path / "s.yaml", TINY)
    pages = []
    for fmt in ("csv", "parquet"):
        assert main(["run", str(scen), "--out", str(tmp_path / fmt), "--quiet", "--no-report",
                     "--requests-format", fmt]) == 0
        assert main(["report", str(tmp_path / fmt)]) == 0
        pages.append((tmp_path / fmt / "report.html").read_text(encoding="utf-8"))
    values = [re.findall(r'data-value="([^"]*)"', h) for h in pages]
    assert len(values[0]) == len(values[1]) > 10
    for x, y in zip(*values):
        try:
            fx, fy = float(x), float(y)
        except ValueError:
            assert x == y
            continue
        assert fx == fy or abs(fx - fy) <= 1e-8 * max(abs(fx), abs(fy)), (x, y)

    def norm(h):
        h = re.sub(r'data-value="[^"]*"', "", h)
        h = re.sub(r'(id="|url\(#)c\d+', r"\1c", h)
        h = re.sub(r"simulated in [\d,.]+\s(ms|s) wall", "", h)
        return h.replace(str(tmp_path / "parquet"), "OUT").replace(str(tmp_path / "csv"), "OUT") \
            .replace("parquet", "csv")
    assert norm(pages[0]) == norm(pages[1])


@pytest.mark.parametrize("damage", ["truncated", "rows-missing", "column-missing"])
def test_report_refuses_a_damaged_parquet_table_in_one_line(tmp_path: Path, capsys, damage: str) -> None:
    pytest.importorskip("pyarrow")
    scen = _write(tmp_path / "s.yaml", TINY)
    out = tmp_path / "out"
    assert main(["run", str(scen), "--out", str(out), "--quiet", "--no-report", "--requests-format", "parquet"]) == 0
    p = out / "requests.parquet"
    if damage == "truncated":                      # Ctrl-C while an older pdsim wrote it, a cut copy
        p.write_bytes(p.read_bytes()[: p.stat().st_size // 2])
        needle = "not a readable Parquet file"
    elif damage == "rows-missing":
        pd.read_parquet(p).iloc[:7].to_parquet(p, index=False)
        needle = "summary.json says 10 rows"
    else:
        pd.read_parquet(p).drop(columns=["ttft_s"]).to_parquet(p, index=False)
        needle = "lacks the column(s) ttft_s"
    capsys.readouterr()
    assert main(["report", str(out)]) == 2
    _one_line(capsys.readouterr().err, str(p), needle)
    assert not (out / "report.html").exists()


def test_parquet_without_pyarrow_fails_before_simulating(tmp_path: Path, capsys, monkeypatch, no_simulation) -> None:
    monkeypatch.setitem(sys.modules, "pyarrow", None)          # `import pyarrow` raises ImportError
    scen = _write(tmp_path / "s.yaml", TINY)
    out = tmp_path / "out"
    assert main(["run", str(scen), "--out", str(out), "--quiet", "--requests-format", "parquet"]) == 2
    _one_line(capsys.readouterr().err, "--requests-format", "parquet", "pip install 'pdsim[parquet]'")
    assert no_simulation == [] and not out.exists()


def test_report_reads_only_the_requests_table_summary_json_names(tmp_path: Path, capsys) -> None:
    """A parquet run whose requests.parquet went missing, in a folder that still holds an earlier run's
    requests.csv: the report must say the named table is missing, never draw the stale CSV."""
    pytest.importorskip("pyarrow")
    scen = _write(tmp_path / "s.yaml", TINY)
    out = tmp_path / "out"
    assert main(["run", str(scen), "--out", str(tmp_path / "old"), "--quiet", "--no-report"]) == 0
    assert main(["run", str(scen), "--out", str(out), "--quiet", "--no-report", "--requests-format", "parquet"]) == 0
    (out / "requests.parquet").unlink()
    (out / "requests.csv").write_bytes((tmp_path / "old" / "requests.csv").read_bytes())
    capsys.readouterr()
    assert main(["report", str(out)]) == 2
    _one_line(capsys.readouterr().err, str(out / "requests.parquet"))
    assert not (out / "report.html").exists()


def test_set_reaches_a_topology_whose_name_has_dots():
    """scenarios/spec-decode.yaml names topologies 'draft-a0.7': --set must reach them (the longest run of dotted
    parts that is an existing key), set keys that do not exist yet, and replace a dotted key whole."""
    from pdsim.config import apply_overrides, load
    raw = {"topologies": {"draft-a0.7": {"decode": {"x": 1}}, "a": {"b": 1}}}
    got = apply_overrides(raw, ["topologies.draft-a0.7.decode.power_cap_W=300", "topologies.a.c=2", "new.k=3"])
    assert got == {"topologies": {"draft-a0.7": {"decode": {"x": 1, "power_cap_W": 300}}, "a": {"b": 1, "c": 2}},
                   "new": {"k": 3}}
    assert apply_overrides(got, ["topologies.draft-a0.7={kind: colocated}"])["topologies"]["draft-a0.7"] == \
        {"kind": "colocated"}
    from pathlib import Path
    sc = load(str(Path(__file__).resolve().parents[1] / "scenarios" / "spec-decode.yaml"),
              ["topologies.draft-a0.7.decode.power_cap_W=300"])
    assert sc.topologies["draft-a0.7"].decode.power_cap_W == 300


# ====================================================== summary.json's vllm bench aliases and the warm-up

def test_vllm_completed_leaves_out_the_warmup_as_request_throughput_does(tmp_path: Path, capsys) -> None:
    """vllm bench serve excludes its warm-up from `completed` and from the throughputs; pdsim's
    `request_throughput` (the measured finished requests / sim_end_s) already did, `completed` counted them."""
    scen = _write(tmp_path / "s.yaml", TINY.replace("output_tokens: 10}", "output_tokens: 10}\nclient: {warmup_requests: 2}"))
    assert main(["run", str(scen), "--out", str(tmp_path / "out"), "--quiet", "--no-report"]) == 0
    capsys.readouterr()
    s = json.loads((tmp_path / "out" / "summary.json").read_text())
    df = pd.read_csv(tmp_path / "out" / "requests.csv")
    for name, t in s["topologies"].items():
        d = df[df.topology == name]
        measured = int(((d.status == "finished") & ~d.warmup.astype(bool)).sum())
        assert t["requests"]["finished"] == 5 and t["warmup_excluded"] == 2
        assert t["completed"] == measured == 3
        assert t["request_throughput"] == pytest.approx(t["completed"] / t["sim_end_s"], rel=1e-12)
