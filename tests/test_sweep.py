"""pdsim sweep: grid parsing, the goodput rule, and an M/D/1 sweep whose goodput mark lands where queueing
theory puts it (Erlang's M/D/1 waiting-time distribution, the inverse of the Pollaczek-Khinchine transform)."""
from __future__ import annotations

import json
import math

import pytest

from pdsim.__main__ import main
from pdsim.errors import ConfigError
from pdsim.sweep import goodput, parse_axes


def test_parse_axes_ranges_lists_and_fixed():
    fixed, axes = parse_axes(["workload.rate=2:20:2", "seed=3", "topologies.c.replicas=1,2,4",
                              "slo.ttft_s=0.1:0.3:0.1", "workload.prompt_tokens={dist: fixed, value: 8}"])
    assert fixed == ["seed=3", "workload.prompt_tokens={dist: fixed, value: 8}"]
    assert axes[0] == ("workload.rate", [2, 4, 6, 8, 10, 12, 14, 16, 18, 20])
    assert axes[1] == ("topologies.c.replicas", [1, 2, 4])
    assert axes[2] == ("slo.ttft_s", [0.1, 0.2, 0.3])


@pytest.mark.parametrize("bad", ["workload.rate=5:1:1", "workload.rate=1:5:0", "workload.rate=1:1e9:1",
                                 "workload.rate=1,,2"])
def test_parse_axes_rejects_bad_grids(bad):
    with pytest.raises(ConfigError) as e:
        parse_axes([bad])
    assert "\n" not in str(e.value) and bad.split("=")[1] in str(e.value)


def test_goodput_rule_by_hand():
    # DistServe: highest value whose attainment, and every lower value's, meets the target
    g = goodput([1, 2, 3, 4], [0.99, 0.95, 0.85, 0.5], 0.9)
    assert (g["last_pass"], g["first_fail"]) == (2, 3)
    assert g["estimate"] == pytest.approx(2 + (0.95 - 0.9) / (0.95 - 0.85))       # 2.5
    assert goodput([1, 2, 3], [0.95, 0.8, 0.95], 0.9)["last_pass"] == 1          # a later pass does not count
    assert goodput([1, 2], [0.5, 0.4], 0.9)["status"] == "below the swept range"
    assert goodput([1, 2], [0.95, 0.91], 0.9)["status"] == "above the swept range"


def _md1_wait_cdf(t: float, lam: float, D: float) -> float:
    """P(W <= t) for M/D/1 (Erlang 1909): sum over k <= t/D of (lam (kD - t))^k / k! e^{-lam (kD - t)}, times 1 - rho."""
    return (1 - lam * D) * sum((lam * (k * D - t)) ** k / math.factorial(k) * math.exp(-lam * (k * D - t))
                               for k in range(int(math.floor(t / D)) + 1))


def test_md1_sweep_marks_goodput_where_theory_says(tmp_path):
    D, bound, target = 0.01, 0.03, 0.9          # TTFT = wait + D <= 30 ms for 90% of requests
    lo, hi = 1e-3, 1 / D - 1e-9
    for _ in range(100):
        mid = 0.5 * (lo + hi)
        lo, hi = (mid, hi) if _md1_wait_cdf(bound - D, mid, D) >= target else (lo, mid)
    analytic = lo                               # 58.7 req/s
    sc = tmp_path / "md1.yaml"
    sc.write_text(f"""name: md1
seed: 3
model: llama-3.1-8b
workload: {{arrival: poisson, rate: 10, num_requests: 30000, prompt_tokens: 8, output_tokens: 1}}
slo: {{ttft_s: {bound}, tpot_s: 10.0, attainment_target: {target}}}
topologies:
  batch1: {{kind: colocated, replicas: 1, max_running: 1, kv_blocks: 100000,
           cost_model: {{kind: constant, step_s: {D}}}}}
""")
    out = tmp_path / "out"
    assert main(["sweep", str(sc), "--set", "workload.rate=50:65:5", "--out", str(out), "--jobs", "2",
                 "--quiet"]) == 0
    res = json.loads((out / "sweep.json").read_text())
    for row in res["rows"]:                     # every point's attainment is Erlang's P(W <= bound - D)
        assert row["slo_attainment"] == pytest.approx(_md1_wait_cdf(bound - D, row["workload.rate"], D), abs=0.02)
    g = res["goodput"]["batch1"]
    assert (g["last_pass"], g["first_fail"]) == (55, 60)
    assert g["estimate"] == pytest.approx(analytic, rel=0.04)
    html = (out / "sweep.html").read_text()
    from pdsim.charts import num
    assert html.count(f">goodput {num(g['estimate'])}</text>") >= 2       # marked on attainment and TTFT charts
    assert "target 90.0%" in html and "SLO 30\u00a0ms" in html                  # the SLO lines
    assert (out / "sweep.csv").read_text().count("\n") == 1 + 4


def test_sweep_bad_value_is_one_line_before_simulating(tmp_path, capsys):
    sc = tmp_path / "s.yaml"
    sc.write_text("model: llama-3.1-8b\nworkload: {arrival: poisson, rate: 1, num_requests: 5}\n"
                  "topologies: {c: {kind: colocated}}\n")
    assert main(["sweep", str(sc), "--set", "workload.rate=1,-2", "--out", str(tmp_path / "o"), "--quiet"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "workload.rate" in err and "-2" in err
    assert not (tmp_path / "o").exists()


def test_sweep_page_fits_1024_px(tmp_path):
    """Two topologies over a swept rate, rendered and probed in Chromium (no simulation needed)."""
    from pdsim.sweep import build_sweep_report
    from test_report import _overflows
    rows = [{"workload.rate": r, "topology": t, "slo_attainment": max(0.0, 1 - r / (40 if t == "a" else 60)),
             "ttft_p90_s": 0.01 * r, "tpot_p90_s": 0.001 * r, "cost_per_million_output_tokens_usd": 1.0 + r / 100,
             "gpus": 2} for t in ("a", "colocated-4-chunked-with-a-long-name") for r in range(2, 22, 2)]
    series = {}
    for row in rows:
        series.setdefault(row["topology"], []).append(row)
    gp = {k: goodput([r["workload.rate"] for r in v], [r["slo_attainment"] for r in v], 0.9) for k, v in series.items()}
    result = {"scenario": "x.yaml", "name": "x", "axes": [{"key": "workload.rate", "values": list(range(2, 22, 2))}],
              "fixed": [], "x": "workload.rate", "numeric_x": True,
              "slo": {"ttft_s": 0.1, "tpot_s": 0.01, "attainment_target": 0.9}, "rows": rows, "series": series,
              "goodput": gp, "wall_s": 1.0, "jobs": 2}
    path = build_sweep_report(result, tmp_path)
    assert _overflows(path, tmp_path, 1024) == []



def test_sweep_on_a_dask_cluster_gives_the_local_rows(tmp_path):
    """Issue #16: the grid runs on a local pool or on Dask, like plan, with the same rows."""
    distributed = pytest.importorskip("distributed")
    from pdsim.plan import DaskExecutor
    from pdsim.sweep import run_sweep
    sc = tmp_path / "s.yaml"
    sc.write_text("name: s\nseed: 1\nmodel: llama-3.1-8b\n"
                  "workload: {arrival: poisson, rate: 5, num_requests: 60, prompt_tokens: 64, output_tokens: 8}\n"
                  "slo: {ttft_s: 0.05, tpot_s: 0.05}\n"
                  "topologies:\n  a: {kind: colocated, max_running: 1, kv_blocks: 1000,"
                  " cost_model: {kind: constant, step_s: 0.01}}\n")
    local = run_sweep(str(sc), ["workload.rate=5,300"], jobs=1, progress=False)
    with distributed.LocalCluster(n_workers=1, threads_per_worker=1, processes=False,
                                  dashboard_address=None) as cluster, distributed.Client(cluster) as client:
        class Counting(DaskExecutor):            # the points must really go through the cluster
            sent = 0

            def map(self, fn, tasks, on_done=None):
                Counting.sent += len(tasks)
                return super().map(fn, tasks, on_done)
        dask = run_sweep(str(sc), ["workload.rate=5,300"], progress=False, executor=Counting(client))
    assert Counting.sent == 2
    assert [r["slo_attainment"] for r in local["rows"]] == [r["slo_attainment"] for r in dask["rows"]]
    assert local["rows"] == dask["rows"] and local["rows"][0]["slo_attainment"] > local["rows"][1]["slo_attainment"]


def test_a_sweep_point_runs_from_the_scenario_contents_alone(tmp_path):
    """A worker on another machine gets the scenario's contents and an absolute base folder, not its file."""
    from pdsim.sweep import run_point
    raw = {"name": "s", "seed": 1, "model": "llama-3.1-8b",
           "workload": {"arrival": "poisson", "rate": 5, "num_requests": 20, "prompt_tokens": 64, "output_tokens": 8},
           "topologies": {"a": {"kind": "colocated", "kv_blocks": 1000, "cost_model": {"kind": "constant", "step_s": 0.01}}}}
    task = {"raw": raw, "file": str(tmp_path / "gone.yaml"), "base_dir": str(tmp_path), "point": {"workload.rate": 5},
            "overrides": ["workload.rate=5"]}
    out = run_point(task)
    assert out["rows"][0]["finished"] == 20 and raw["workload"]["rate"] == 5      # the shared contents untouched


def test_goodput_only_over_a_load_and_only_for_the_topology_an_axis_sets(tmp_path, capsys):
    """A TTFT bound is no load: a tighter bound fails where a looser one passes, so 'goodput < 0.005 ttft_s'
    would be nonsense; the sweep lists where the SLO is met and missed instead.  Every step costs 10 ms and
    each request is one step to its first token, so TTFT is 10 ms at 1 req/s (no queueing): a 5 ms bound
    misses, 0.3 s and 0.5 s meet.  A key under topologies.a leaves topology b unchanged: b gets no verdict."""
    from pdsim.sweep import print_goodput, run_sweep
    sc = tmp_path / "s.yaml"
    sc.write_text("name: s\nseed: 1\nmodel: llama-3.1-8b\n"
                  "workload: {arrival: constant, rate: 1, num_requests: 10, prompt_tokens: 16, output_tokens: 2}\n"
                  "slo: {ttft_s: 1.0, tpot_s: 1.0}\n"
                  "topologies:\n  a: {kind: colocated, kv_blocks: 1000, cost_model: {kind: constant, step_s: 0.01}}\n"
                  "  b: {kind: colocated, kv_blocks: 1000, cost_model: {kind: constant, step_s: 0.01}}\n")
    res = run_sweep(str(sc), ["slo.ttft_s=0.005,0.3,0.5"], jobs=1, progress=False)
    assert res["goodput"] == {} and res["load_x"] is False and res["untouched"] == []
    assert res["verdicts"] == {"a": {"passes_at": [0.3, 0.5], "fails_at": [0.005]},
                               "b": {"passes_at": [0.3, 0.5], "fails_at": [0.005]}}
    print_goodput(res)
    out = capsys.readouterr().out
    assert "a: slo.ttft_s meets the SLO at 0.3, 0.5; misses it at 0.005 (not a load axis: no goodput)" in out
    assert "goodput <" not in out and "goodput ≥" not in out
    # replicas of a only: b is unchanged by the axis
    res = run_sweep(str(sc), ["topologies.a.replicas=1,2"], jobs=1, progress=False)
    assert res["untouched"] == ["b"] and list(res["verdicts"]) == ["a"] and res["goodput"] == {}
    assert res["verdicts"]["a"] == {"passes_at": [1, 2], "fails_at": []}
    # a rate is a load: goodput as before (10 ms steps, one request each: meets up to 100 req/s at most)
    res = run_sweep(str(sc), ["workload.rate=1,2"], jobs=1, progress=False)
    assert set(res["goodput"]) == {"a", "b"} and res["verdicts"] == {} and res["load_x"] is True
    assert res["goodput"]["a"]["status"] == "above the swept range"
    # a load axis given after another one is still the x axis: each replicas series of a gets its goodput over
    # rate; b, which the replicas key does not set, is one series (not two labelled with a's replicas)
    res = run_sweep(str(sc), ["topologies.a.replicas=1,2", "workload.rate=1,2"], jobs=1, progress=False)
    assert res["x"] == "workload.rate" and res["load_x"] is True
    assert set(res["goodput"]) == {"a · replicas=1", "a · replicas=2", "b"}
    assert [r["workload.rate"] for r in res["series"]["b"]] == [1, 2]
    # each series is judged at its own point's attainment target, not all at the last point's: one batch-1
    # replica (two 10 ms steps a request: 50 req/s at most) at 1 and 100 req/s meets a 50 ms TTFT for every
    # request at 1 req/s and for a share a of them at 100; a target below a passes both rates, one above a
    # passes only the first
    one = tmp_path / "one.yaml"
    one.write_text("name: one\nseed: 1\nmodel: llama-3.1-8b\n"
                   "workload: {arrival: constant, rate: 1, num_requests: 40, prompt_tokens: 16, output_tokens: 2}\n"
                   "slo: {ttft_s: 0.05, tpot_s: 1.0}\n"
                   "topologies:\n  a: {kind: colocated, max_running: 1, kv_blocks: 1000, "
                   "cost_model: {kind: constant, step_s: 0.01}}\n")
    a = {r["workload.rate"]: r["slo_attainment"] for r in run_sweep(str(one), ["workload.rate=1,100"], jobs=1,
                                                                       progress=False)["rows"]}
    assert a[1] == 1.0 and 0.05 < a[100] < 0.95
    lo, hi = round(a[100] / 2, 3), round((a[100] + 1) / 2, 3)
    res = run_sweep(str(one), [f"slo.attainment_target={lo},{hi}", "workload.rate=1,100"], jobs=1, progress=False)
    gp = res["goodput"]
    assert gp[f"a · attainment_target={lo}"]["status"] == "above the swept range"
    assert gp[f"a · attainment_target={hi}"]["last_pass"] == 1 and gp[f"a · attainment_target={hi}"]["first_fail"] == 100


def test_percentile_mode_goodput_follows_each_runs_own_verdict_by_hand(tmp_path):
    """slo.mode percentile: a point passes when the run's own verdict (slo_met) does, not its attainment.
    One replica, one request at a time, every request one 10 ms step (prompt 100, output 1), 20 requests at
    a constant rate R.  Request k arrives at k/R (+ a shift), starts when k-1 ends: TTFT_k = 0.01 + k (0.01 - 1/R)
    while 1/R < 0.01, 0.01 otherwise.
      R = 50: every TTFT 10 ms: p90 10 ms <= 30 ms, attainment 100%: passes either way.
      R = 120: TTFT_k = 0.01 + k / 600: within 30 ms for k <= 12, 13 of 20 = 65% >= the 50% target (attainment
      passes), but the p90 (nearest rank: the 18th smallest, k = 17) is 0.01 + 17 / 600 = 38.3 ms > 30 ms.
    Judged by the run's verdict the goodput is 50 (the last passing point: a percentile verdict is not
    interpolated); judged by attainment it was "above the swept range" at 120."""
    from pdsim.sweep import run_sweep
    sc = tmp_path / "p.yaml"
    sc.write_text("name: p\nseed: 1\nmodel: llama-3.1-8b\n"
                  "workload: {arrival: constant, rate: 1, num_requests: 20, prompt_tokens: 100, output_tokens: 1}\n"
                  "slo: {ttft_s: 0.03, tpot_s: 1.0, attainment_target: 0.5, mode: percentile, ttft_percentile: 90}\n"
                  "topologies:\n  c: {kind: colocated, kv_blocks: 1000, max_running: 1, scheduler: fcfs,\n"
                  "      cost_model: {kind: constant, step_s: 0.01}}\n")
    res = run_sweep(str(sc), ["workload.rate=50,120"], jobs=1, progress=False)
    rows = {r["workload.rate"]: r for r in res["rows"]}
    assert rows[50]["slo_met"] is True and rows[50]["slo_attainment"] == 1.0
    assert rows[120]["slo_met"] is False and rows[120]["slo_attainment"] == pytest.approx(0.65)
    # (the row's ttft_p90_s is the summary's, numpy's linear p90: index 0.9 x 19 = 17.1 -> 0.01 + 17.1 / 600)
    assert rows[120]["ttft_p90_s"] == pytest.approx(0.01 + 17.1 / 600, abs=1e-9)
    g = res["goodput"]["c"]
    assert g == {"status": "within the swept range", "last_pass": 50, "first_fail": 120, "estimate": 50}
    # the same scenario judged by attainment: 65% >= 50% at 120
    res = run_sweep(str(sc), ["workload.rate=50,120", "slo.mode=attainment"], jobs=1, progress=False)
    assert res["goodput"]["c"]["status"] == "above the swept range"


TINY_SWEEP = ("model: llama-3.1-8b\nworkload: {arrival: poisson, rate: 1, num_requests: 5, prompt_tokens: 100, "
              "output_tokens: 10}\ntopologies: {c: {kind: colocated, device: h100-sxm}}\n")


@pytest.fixture
def no_points(monkeypatch):
    """run_point replaced by a recorder: a check that must happen before any point runs leaves it uncalled."""
    import pdsim.sweep
    calls = []
    monkeypatch.setattr(pdsim.sweep, "run_point", lambda t: calls.append(t) or {"point": t["point"], "rows": []})
    return calls


def test_a_point_that_cannot_be_built_fails_before_any_runs_naming_file_and_point(tmp_path, capsys, no_points):
    """llama-3.1-70b's weights do not fit one H100: found while validating, not after the other points ran."""
    sc = tmp_path / "s.yaml"
    sc.write_text(TINY_SWEEP)
    rc = main(["sweep", str(sc), "--set", "model=llama-3.1-8b,llama-3.1-70b", "--out", str(tmp_path / "o"),
               "--jobs", "1", "--quiet"])
    err = capsys.readouterr().err
    assert rc == 2 and err.count("\n") == 1 and "Traceback" not in err, err
    assert err.startswith(f"pdsim: error: {sc}: at the point model=llama-3.1-70b: ") and "do not fit" in err, err
    assert no_points == [] and not (tmp_path / "o").exists()


def test_a_point_failing_while_it_runs_is_named(tmp_path, capsys, monkeypatch):
    import pdsim.sweep
    from pdsim.errors import InputError

    def fails_at_4(task):
        if task["point"]["workload.rate"] == 4:
            raise InputError("found bad at run time", key="workload.trace.path")
        return {"point": task["point"], "rows": []}
    monkeypatch.setattr(pdsim.sweep, "run_point", fails_at_4)
    sc = tmp_path / "s.yaml"
    sc.write_text(TINY_SWEEP)
    rc = main(["sweep", str(sc), "--set", "workload.rate=2,4", "--out", str(tmp_path / "o"), "--jobs", "1", "--quiet"])
    err = capsys.readouterr().err
    assert rc == 2 and err == (f"pdsim: error: {sc}: at the point workload.rate=4: workload.trace.path: "
                               "found bad at run time\n"), err


def test_sweep_out_that_is_a_file_fails_before_any_point_runs(tmp_path, capsys, no_points):
    sc = tmp_path / "s.yaml"
    sc.write_text(TINY_SWEEP)
    f = tmp_path / "afile"
    f.write_text("keep me")
    rc = main(["sweep", str(sc), "--set", "workload.rate=1,2", "--out", str(f), "--quiet"])
    err = capsys.readouterr().err
    assert rc == 2 and err == f"pdsim: error: --out = '{f}': exists and is not a folder; give a folder path\n", err
    assert no_points == [] and f.read_text() == "keep me"


def test_sweep_out_locked_by_another_run_fails_at_once(tmp_path, capsys, no_points):
    from filelock import FileLock
    sc = tmp_path / "s.yaml"
    sc.write_text(TINY_SWEEP)
    out = tmp_path / "o"
    out.mkdir()
    with FileLock(str(out / ".pdsim.lock")):
        rc = main(["sweep", str(sc), "--set", "workload.rate=1,2", "--out", str(out), "--quiet"])
    err = capsys.readouterr().err
    assert rc == 2 and err.count("\n") == 1 and "another pdsim run is writing to this folder" in err, err
    assert no_points == []


def test_a_key_both_swept_and_fixed_is_refused(tmp_path, capsys, no_points):
    """The axis would win at every point while sweep.json's "fixed" and the page's header showed rate=50."""
    sc = tmp_path / "s.yaml"
    sc.write_text(TINY_SWEEP)
    rc = main(["sweep", str(sc), "--set", "workload.rate=22:34:4", "--set", "workload.rate=50", "--out",
               str(tmp_path / "o"), "--quiet"])
    err = capsys.readouterr().err
    assert rc == 2 and err == "pdsim: error: --set workload.rate: is both swept and fixed; give it once\n", err
    assert no_points == [] and not (tmp_path / "o").exists()
