"""Capacity planning: the recommendation holds on a fresh seed and the next-cheaper config does not,
goodput matches M/D/1 theory, Dask gives the local executor's table, the cache is reused, bad plans fail clearly."""
from __future__ import annotations

import json
import math

import pytest
import yaml

from pdsim.__main__ import main
from pdsim.errors import ConfigError
from pdsim.plan import LocalExecutor, parse_plan, run_plan

LINEAR = {"kind": "linear", "base_s": 0.01, "per_token_s": 1e-4, "per_kv_token_s": 1e-6}


def small_plan(**over) -> dict:
    raw = {"name": "small", "model": "llama-3.1-8b", "seed": 0,
           "workload": {"arrival": "poisson", "num_requests": 400,
                        "prompt_tokens": {"dist": "uniform", "low": 50, "high": 400},
                        "output_tokens": {"dist": "uniform", "low": 5, "high": 40}},
           "slo": {"ttft_s": 0.5, "tpot_s": 0.03, "attainment_target": 0.9},
           "target": {"rate": 20},
           "search": {"devices": [{"name": "h100-sxm", "price_per_hour_usd": 2.0}],
                      "colocated": {"replicas": [1, 2, 3, 4]},
                      "pool": {"kv_blocks": 2000, "cost_model": LINEAR}},
           "goodput": {"tolerance": 0.05, "seeds": 2, "confirm_factor": 3}}
    raw.update(over)
    return raw


def _summary(out):
    return json.loads((out / "summary.json").read_text())["topologies"]


def test_recommended_config_meets_slo_on_fresh_seed_next_cheaper_does_not(tmp_path, capsys):
    path = tmp_path / "plan.yaml"
    path.write_text(yaml.safe_dump(small_plan()))
    out = tmp_path / "out"
    assert main(["plan", str(path), "--out", str(out), "--jobs", "2", "--quiet", "--format", "json"]) == 0
    result = json.loads((out / "plan.json").read_text())
    assert result["winner"] == "colo-h100-sxm-tp1x2"
    printed = json.loads(capsys.readouterr().out)            # --format json: the same ranking as plan.json
    assert printed["winner"] == result["winner"]
    assert [r["config"] for r in printed["rows"]] == [r["config"] for r in result["rows"]]
    assert [r["goodput"] for r in printed["rows"]] == [r["goodput"] for r in result["rows"]]
    winner = yaml.safe_load((out / "winner.yaml").read_text())
    name = next(iter(winner["topologies"]))
    assert winner["workload"]["rate"] == 20
    # a fresh seed: the recommendation still meets the SLO ...
    assert main(["run", str(out / "winner.yaml"), "--set", "seed=12345", "--out", str(tmp_path / "w"),
                 "--quiet"]) == 0
    assert _summary(tmp_path / "w")[name]["slo_met"] is True
    # ... and the next-cheaper config of the space (one replica) does not
    assert main(["run", str(out / "winner.yaml"), "--set", "seed=12345", "--set", f"topologies.{name}.replicas=1",
                 "--out", str(tmp_path / "c"), "--quiet"]) == 0
    assert _summary(tmp_path / "c")[name]["slo_met"] is False
    for f in ("plan.csv", "plan.html"):
        assert (out / f).stat().st_size > 0
    html = (out / "plan.html").read_text()
    assert "http://" not in html and "https://" not in html
    assert html.count("<script") == 1 and "<script src" not in html      # only the inline table sorter
    from conftest import chromium_render
    dom, log, img = chromium_render(out / "plan.html", tmp_path)
    assert "Capacity plan: small" in dom and "colo-h100-sxm-tp1x2" in dom
    assert not [ln for ln in log.splitlines() if "CONSOLE" in ln or "Uncaught" in ln] and "net::ERR" not in log
    assert img is not None and img[..., :3].std() > 0.01


def _md1_wait_cdf(t: float, lam: float, D: float) -> float:
    """P(W <= t) in an M/D/1 queue (Erlang's formula)."""
    s = sum((lam * (k * D - t)) ** k / math.factorial(k) * math.exp(-lam * (k * D - t))
            for k in range(int(math.floor(t / D)) + 1))
    return (1 - lam * D) * s


def test_goodput_of_constant_cost_server_matches_md1_quantile():
    D, bound, target = 0.1, 0.5, 0.9          # TTFT = wait + D <= 0.5 s for 90% of requests
    lo, hi = 1e-3, 1 / D - 1e-9
    for _ in range(100):
        mid = 0.5 * (lo + hi)
        lo, hi = (mid, hi) if _md1_wait_cdf(bound - D, mid, D) >= target else (lo, mid)
    analytic = lo                                # ~7.58 req/s
    raw = small_plan(target={}, objective="goodput_per_usd",
                     workload={"arrival": "poisson", "num_requests": 10000, "prompt_tokens": 8, "output_tokens": 1},
                     slo={"ttft_s": bound, "tpot_s": 10.0, "attainment_target": target},
                     search={"devices": [{"name": "h100-sxm", "price_per_hour_usd": 1.0}],
                             "colocated": {"replicas": [1]},
                             "pool": {"max_running": 1, "kv_blocks": 1000,
                                      "cost_model": {"kind": "constant", "step_s": D}}},
                     goodput={"tolerance": 0.03, "seeds": 4, "aggregate": "pooled"})
    row = run_plan(parse_plan(raw), LocalExecutor(2))["rows"][0]
    assert row["bound_rate"] == pytest.approx(1 / D)       # the analytic bound: one request per D
    g_lo, g_hi = row["bracket"]
    assert g_hi - g_lo <= 0.03 * g_hi
    # the analytic rate lies in the final bracket, widened by 3% for sampling error (40k requests)
    assert 0.97 * g_lo <= analytic <= 1.03 * g_hi, (row["bracket"], analytic)


def test_dask_executor_gives_the_local_table():
    distributed = pytest.importorskip("distributed")
    from pdsim.plan import DaskExecutor
    raw = small_plan(search={"devices": [{"name": "h100-sxm", "price_per_hour_usd": 2.0}],
                             "colocated": {"replicas": [1, 2]},
                             "disaggregated": {"prefill_instances": [1], "decode_instances": [1]},
                             "pool": {"kv_blocks": 2000, "cost_model": LINEAR}},
                     workload={"arrival": "poisson", "num_requests": 200,
                               "prompt_tokens": {"dist": "uniform", "low": 50, "high": 400},
                               "output_tokens": {"dist": "uniform", "low": 5, "high": 40}},
                     goodput={"tolerance": 0.05, "seeds": 2, "min_duration_s": 0, "confirm_factor": 3})
    local = run_plan(parse_plan(raw), LocalExecutor(1))
    with distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=False,
                                  dashboard_address=None) as cluster, distributed.Client(cluster) as client:
        dask = run_plan(parse_plan(raw), DaskExecutor(client))
    keep = ("config", "goodput", "bracket", "status", "attainment_at_target", "rank")
    assert [{k: r[k] for k in keep} for r in local["rows"]] == [{k: r[k] for k in keep} for r in dask["rows"]]
    assert local["winner"] == dask["winner"] and local["simulations"] == dask["simulations"]


def test_dask_executor_ends_when_a_finished_result_is_lost_with_the_last_worker(monkeypatch):
    """The race seen in CI: every task reports done, then the only worker dies holding the results, so
    fetching them would wait for a recompute that never comes. The executor must fetch with a timeout,
    notice the scheduler has no workers and stop with an error naming it, never block in one gather."""
    import time
    distributed = pytest.importorskip("distributed")
    from pdsim.errors import PdsimError
    from pdsim.plan import DaskExecutor

    class LostResult:                         # done, but its data went with the dead worker
        status = "lost"

        def done(self):
            return True

        def result(self, timeout=None):
            assert timeout is not None, "an unbounded wait for a result can hang forever"
            time.sleep(min(timeout, 0.01))
            raise TimeoutError

    class NoWorkers:
        def map(self, fn, tasks, pure=True):
            return [LostResult() for _ in tasks]

        def gather(self, futures):
            raise AssertionError("a blocking gather hangs when the last worker died")

        def nthreads(self):
            return {}

        def cancel(self, futures):
            pass
    monkeypatch.setattr(distributed, "wait", lambda futures, timeout=None: None)
    ex = object.__new__(DaskExecutor)
    ex.client, ex._own, ex.address, ex.lost_workers_s, ex.poll_s = NoWorkers(), False, "tcp://x:1", 0.05, 0.01
    t0 = time.monotonic()
    with pytest.raises(PdsimError, match="tcp://x:1 has had no workers"):
        ex.map(abs, [1, 2, 3])
    assert time.monotonic() - t0 < 5


def _times_out(x):
    raise TimeoutError(f"the task's own timeout on {x}")


def test_dask_executor_raises_a_task_timeout_instead_of_waiting_on_it():
    """A simulation that itself raises TimeoutError must end the map with that error, not be taken
    for a result that is not ready yet (which polled forever)."""
    import time
    distributed = pytest.importorskip("distributed")
    from pdsim.plan import DaskExecutor
    import threading
    with distributed.LocalCluster(n_workers=1, threads_per_worker=1, processes=False,
                                  dashboard_address=None) as cluster, distributed.Client(cluster) as client:
        ex = DaskExecutor(client, lost_workers_s=60, poll_s=0.05)
        raised = []

        def run():                    # in a thread: a map that never returns fails the test, not hangs it
            try:
                ex.map(_times_out, [2, 3])
            except TimeoutError as exc:
                raised.append(str(exc))
        t = threading.Thread(target=run, daemon=True)
        t0 = time.monotonic()
        t.start()
        t.join(timeout=30)
        assert not t.is_alive(), "the map is still polling a task that raised TimeoutError"
        assert raised == ["the task's own timeout on 2"] and time.monotonic() - t0 < 30


def test_each_config_carries_the_error_band_of_its_engine_and_gpu(tmp_path, capsys):
    """A goodput is judged on TTFT/TPOT, so it is as uncertain as they are: each config row carries its pools'
    band as `pdsim run` shows it (the stored SGLang H100 band for an SGLang pool; a linear cost model is
    unvalidated), plan.csv and the printed table state it, and the page names the winner's."""
    import io

    import pandas as pd

    from pdsim.plan import print_table, write_plan_outputs
    from pdsim.validate import ERROR_TABLE
    band = json.loads(ERROR_TABLE.read_text())["bands"]["sglang|h100-sxm"]
    raw = small_plan(search={"devices": [{"name": "h100-sxm", "price_per_hour_usd": 2.0}],
                             "colocated": {"replicas": [1]}, "pool": {"engine": "sglang"}},
                     workload={"arrival": "poisson", "num_requests": 120, "prompt_tokens": 200, "output_tokens": 20},
                     target={"rate": 2}, goodput={"tolerance": 0.2, "seeds": 1, "confirm_factor": 2})
    plan = parse_plan(raw)
    result = run_plan(plan, LocalExecutor(1))
    (row,) = result["rows"]
    got = row["expected_error"]["replica"]
    assert (got["ttft_mape_pct"], got["tpot_mape_pct"], got["rows"]) == \
        (band["ttft_mape_pct"], band["tpot_mape_pct"], band["rows"])
    assert result["winner"] == row["config"]
    text = io.StringIO()
    print_table(result, out=text)
    assert f"expected error of {row['config']} against measured runs" in text.getvalue()
    assert f"replica: TTFT ±{band['ttft_mape_pct']}%, TPOT ±{band['tpot_mape_pct']}%" in text.getvalue()
    write_plan_outputs(plan, result, tmp_path / "out")
    csv_rows = pd.read_csv(tmp_path / "out" / "plan.csv")
    assert csv_rows.expected_error[0].startswith(f"replica: TTFT ±{band['ttft_mape_pct']}%")
    assert "Its expected error against measured runs, which its goodput inherits: replica: TTFT" in \
        (tmp_path / "out" / "plan.html").read_text()
    lin = run_plan(parse_plan(small_plan(search={"devices": [{"name": "h100-sxm", "price_per_hour_usd": 2.0}],
                                                 "colocated": {"replicas": [1]},
                                                 "pool": {"kv_blocks": 2000, "cost_model": LINEAR}},
                                         target={"rate": 2}, goodput={"tolerance": 0.2, "seeds": 1})),
                   LocalExecutor(1))
    assert lin["rows"][0]["expected_error"] == {"replica": "unvalidated: a linear cost model (a what-if, not the "
                                                           "roofline)"}


def test_cache_reuses_results(tmp_path):
    plan = parse_plan(small_plan(search={"devices": [{"name": "h100-sxm", "price_per_hour_usd": 2.0}],
                                         "colocated": {"replicas": [1, 2]},
                                         "pool": {"kv_blocks": 2000, "cost_model": LINEAR}}))
    first = run_plan(plan, LocalExecutor(1), cache_dir=tmp_path)
    again = run_plan(plan, LocalExecutor(1), cache_dir=tmp_path)
    assert first["simulations"] > 0 and again["simulations"] == 0 and again["cached"] == first["simulations"]
    assert [r["goodput"] for r in first["rows"]] == [r["goodput"] for r in again["rows"]]


def test_nothing_meets_the_slo_says_which_slo_each_misses(tmp_path):
    raw = small_plan(slo={"ttft_s": 0.5, "tpot_s": 0.011, "attainment_target": 0.9})   # decode step >= 10 ms
    result = run_plan(parse_plan(raw), LocalExecutor(1))
    assert result["winner"] is None
    assert all("TPOT" in r["note"] for r in result["rows"]), [r["note"] for r in result["rows"]]


def test_bounds_prune_configs_that_cannot_reach_the_target():
    result = run_plan(parse_plan(small_plan(target={"rate": 60})), LocalExecutor(1))
    one = next(r for r in result["rows"] if r["config"] == "colo-h100-sxm-tp1x1")
    assert one["status"] == "below target (bound)" and not one["points"]


@pytest.mark.parametrize("over, key", [
    ({"search": {"devices": ["h100-sxm"], "colocated": {"replicas": []}}}, "search"),
    ({"search": {"devices": ["h100-sxm"]}}, "search"),
    ({"slo": {"ttft_s": 1, "tpot_s": 0.1, "ttft_percentile": 0}}, "slo.ttft_percentile"),
    ({"slo": {"ttft_s": 1, "tpot_s": 0.1, "tpot_percentile": 150}}, "slo.tpot_percentile"),
    ({"budget": {"max_usd_per_hour": 0.5}}, "budget"),
    ({"budget": {"max_gpus": 0}}, "budget.max_gpus"),
    ({"target": {"rate": -3}}, "target.rate"),
    ({"objective": "fastest"}, "objective"),
    ({"workload": {"arrival": "closed", "clients": 2, "num_requests": 5}}, "workload.arrival"),
    # 'disaggregated' is a key here (a tag in a scenario's topologies), and the suggestion is a plan key
    ({"search": {"devices": ["h100-sxm"], "disaggregated": {"prefill": [1]}}},
     "search.disaggregated.prefill: not a key at this level (it is one at another: check the indentation); "
     "or did you mean 'prefill_tp'?"),
    ({"search": {"devices": ["h100-sxm"], "colocated": {"replica": [1]}}},
     "search.colocated.replica: unknown key; did you mean 'replicas'?"),
])
def test_bad_plans_fail_clearly(over, key):
    with pytest.raises(ConfigError) as e:
        parse_plan(small_plan(**over), "p.yaml")
    assert str(e.value).startswith("p.yaml") and key in str(e.value), str(e.value)


def test_cli_bad_plan_exit_2(tmp_path, capsys):
    path = tmp_path / "p.yaml"
    path.write_text(yaml.safe_dump(small_plan(budget={"max_gpus": 1, "max_usd_per_hour": 0.1})))
    assert main(["plan", str(path), "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err
    assert "budget" in err and "Traceback" not in err


def test_equal_configs_do_not_prune_each_other_and_per_gpu_dominance_counts_gpus():
    # two configs differing only in the KV link (same price, same bound) both reach the bound: one wins
    base = {"name": "d", "model": "llama-3.1-8b",
            "workload": {"arrival": "poisson", "num_requests": 100, "prompt_tokens": 500, "output_tokens": 20},
            "slo": {"ttft_s": 5.0, "tpot_s": 0.5, "attainment_target": 0.9}, "objective": "goodput_per_usd",
            "search": {"devices": ["h100-sxm"], "disaggregated": {"kv_link": ["infiniband", "nvlink"]}},
            # about dominance, not the long-run check (a goodput at the analytic bound fails a long run)
            "goodput": {"min_duration_s": 0, "seeds": 1, "tolerance": 0.1, "confirm_top": 0}}
    res = run_plan(parse_plan(base), LocalExecutor(1))
    assert res["winner"] is not None and all(r["meets"] for r in res["rows"])
    # goodput per GPU: a pricier 1-GPU config must not be pruned by a cheaper 4-GPU one
    per_gpu = dict(base, objective="goodput_per_gpu",
                   workload={"arrival": "poisson", "num_requests": 150, "prompt_tokens": 500, "output_tokens": 50},
                   slo={"ttft_s": 2.0, "tpot_s": 0.2, "attainment_target": 0.9},
                   search={"devices": [{"name": "h100-sxm", "price_per_hour_usd": 10.0},
                                       {"name": "a100-80gb-sxm", "price_per_hour_usd": 1.0}],
                           "colocated": {"replicas": [1, 4]}})
    res = run_plan(parse_plan(per_gpu), LocalExecutor(1))
    assert res["winner"] == "colo-h100-sxm-tp1x1"
    for r in res["rows"]:
        if r["status"].startswith("dominated"):
            assert "GPUs" in r["note"]


def test_shipped_plans_parse():
    from conftest import REPO
    from pdsim.plan import load_plan
    plans = sorted((REPO / "scenarios").glob("plan-*.yaml"))
    assert plans
    for p in plans:
        plan = load_plan(p)
        assert plan.configs, p
        assert all(math.isfinite(c.bound_rate) and c.bound_rate > 0 for c in plan.configs), p


def test_goodput_mode_nothing_meets_names_the_slo():
    raw = small_plan(target={}, objective="goodput_per_usd",
                     slo={"ttft_s": 0.5, "tpot_s": 0.009, "attainment_target": 0.9},   # a decode step >= 10 ms
                     search={"devices": [{"name": "h100-sxm", "price_per_hour_usd": 2.0}],
                             "colocated": {"replicas": [1, 2]},
                             "pool": {"kv_blocks": 2000, "cost_model": LINEAR}})
    result = run_plan(parse_plan(raw), LocalExecutor(1))
    assert result["winner"] is None and result["simulations"] == 0     # known without simulating
    for r in result["rows"]:
        assert r["goodput"] == 0 and r["status"] == "infeasible" and "TPOT" in r["note"] and not r["meets"], r


# --- plans that hold (issue #18) ------------------------------------------------------------------
def md1_plan(**goodput) -> dict:
    """One or two batch-1 replicas with a constant 0.1 s step (M/D/1 each) at 9 req/s, TTFT <= 0.6 s."""
    return small_plan(name="md1", target={"rate": 9.0},
                      workload={"arrival": "poisson", "num_requests": 60, "prompt_tokens": 8, "output_tokens": 1},
                      slo={"ttft_s": 0.6, "tpot_s": 10.0, "attainment_target": 0.9},
                      search={"devices": [{"name": "h100-sxm", "price_per_hour_usd": 1.0}],
                              "colocated": {"replicas": [1, 2]},
                              "pool": {"max_running": 1, "kv_blocks": 1000,
                                       "cost_model": {"kind": "constant", "step_s": 0.1}}},
                      goodput={"min_duration_s": 0, "seeds": 2, **goodput})


def test_long_run_demotes_a_config_that_passes_only_on_a_short_window():
    # one replica at 9 req/s is an M/D/1 queue at load 0.9: in steady state only P(W <= 0.5 s) = 67%
    # of requests meet TTFT <= 0.6 s (Erlang), below the 90% target, though a 60-request window that
    # starts empty passes; two replicas (load 0.45 each) pass in steady state.
    steady = _md1_wait_cdf(0.5, 9.0, 0.1)
    assert steady == pytest.approx(0.669, abs=0.001)
    res = run_plan(parse_plan(md1_plan(confirm_factor=40, confirm_max_factor=40)), LocalExecutor(1))
    rows = {r["config"]: r for r in res["rows"]}
    one, two = rows["colo-h100-sxm-tp1x1"], rows["colo-h100-sxm-tp1x2"]
    assert one["attainment_at_target"] >= 0.9            # the short window passes ...
    assert one["status"] == "fails long run" and not one["meets"]     # ... the long run does not
    assert one["long_run_attainment"] < 0.9
    # 40 windows (2,400 requests, ~270 s): close to the steady state (the run starts empty, so above it)
    assert steady - 0.05 <= one["long_run_attainment"] <= steady + 0.15, one["long_run_attainment"]
    assert res["winner"] == "colo-h100-sxm-tp1x2" and two["long_run_attainment"] >= 0.9
    lo, hi = two["long_run_ci"]
    assert lo <= two["long_run_attainment"] <= hi and two["margin"] >= 1.0
    # without the long-run check the short window would have declared the one-replica config
    short = run_plan(parse_plan(md1_plan(confirm_top=0)), LocalExecutor(1))
    assert short["winner"] == "colo-h100-sxm-tp1x1"


def test_early_stop_gives_the_full_simulations_verdict():
    from pdsim.plan import _Runner, evaluate
    raw = small_plan(search={"devices": [{"name": "h100-sxm", "price_per_hour_usd": 2.0}],
                             "colocated": {"replicas": [1, 2]}, "pool": {"kv_blocks": 2000, "cost_model": LINEAR}},
                     workload={"arrival": "poisson", "num_requests": 200,
                               "prompt_tokens": {"dist": "uniform", "low": 50, "high": 400},
                               "output_tokens": {"dist": "uniform", "low": 5, "high": 40}})
    raw["goodput"] = {"tolerance": 0.05, "seeds": 2, "min_duration_s": 0, "confirm_top": 1, "confirm_factor": 3}
    plan = parse_plan(raw)
    runner = _Runner(plan, LocalExecutor(1), None, False)
    target = plan.spec.slo.attainment_target
    seen = set()
    for cfg in plan.configs:
        for rate in (5.0, 15.0, 30.0, 60.0):
            full = evaluate(runner._task(cfg, rate, 0, early=None))
            early = evaluate(runner._task(cfg, rate, 0, early="both"))
            assert full["early"] is None and full["settled"] == full["total"] == 200
            assert (early["ok"] / early["n"] >= target) == (full["ok"] / full["n"] >= target), (cfg.name, rate)
            if early["early"] == "pass":      # a lower bound on the passes ...
                assert early["ok"] <= full["ok"] and early["settled"] < early["total"]
            elif early["early"] == "fail":    # ... or an upper bound
                assert early["ok"] >= full["ok"] and early["settled"] < early["total"]
            seen.add(early["early"])
    assert {"pass", "fail"} <= seen           # both kinds of early stop happened
    # the whole plan: same table with and without early stopping, fewer requests simulated with it
    on = run_plan(parse_plan(raw), LocalExecutor(1))
    off = run_plan(parse_plan(dict(raw, goodput=dict(raw["goodput"], early_stop=False))), LocalExecutor(1))
    keep = ("config", "goodput", "bracket", "status", "rank", "long_run_attainment")
    assert [{k: r[k] for k in keep} for r in on["rows"]] == [{k: r[k] for k in keep} for r in off["rows"]]
    assert on["skipped"]["requests_not_simulated"] > 0 == off["skipped"]["requests_not_simulated"]


def _profile(path, slow: int = 1):
    """h100-sxm's datasheet profile, its peaks divided by ``slow`` (numbers kept the same length)."""
    from pdsim.devices import DATA_DIR
    text = (DATA_DIR / "h100-sxm.yaml").read_text()
    if slow == 3:
        text = text.replace("memory_bandwidth_GBps: 3350", "memory_bandwidth_GBps: 1117")
        text = text.replace("bf16: 989, fp16: 989", "bf16: 330, fp16: 330")
    path.write_text(text)


def test_cache_is_invalidated_when_a_device_profile_or_pdsim_changes(tmp_path, monkeypatch):
    import os

    import pdsim.plan as plan_mod
    prof = tmp_path / "gpu.yaml"
    _profile(prof)
    # 30 req/s: the profile serves ~97 req/s within the SLO, the 3x slower one ~14 (bound 53: simulated)
    raw = small_plan(target={"rate": 30}, objective="cheapest",
                     workload={"arrival": "poisson", "num_requests": 150, "prompt_tokens": 300, "output_tokens": 10},
                     slo={"ttft_s": 0.2, "tpot_s": 0.05, "attainment_target": 0.9},
                     search={"devices": [{"name": "gpu.yaml", "price_per_hour_usd": 2.0}],
                             "colocated": {"replicas": [1]}},
                     goodput={"tolerance": 0.2, "seeds": 1, "min_duration_s": 0, "confirm_top": 0})
    cache = tmp_path / "cache"
    fast = run_plan(parse_plan(raw, str(tmp_path / "p.yaml"), tmp_path), LocalExecutor(1), cache_dir=cache)
    # the same profile 3x slower, same size, and its modification time put back (as cp -p or a
    # checkout may leave it): the cached results must not be reused
    st = prof.stat()
    _profile(prof, slow=3)
    assert prof.stat().st_size == st.st_size
    os.utime(prof, ns=(st.st_atime_ns, st.st_mtime_ns))
    slow = run_plan(parse_plan(raw, str(tmp_path / "p.yaml"), tmp_path), LocalExecutor(1), cache_dir=cache)
    assert slow["simulations"] > 0 and slow["cached"] == 0
    assert fast["winner"] == "colo-gpu-tp1x1" and slow["winner"] is None
    assert slow["rows"][0]["status"] == "misses SLO at target"
    again = run_plan(parse_plan(raw, str(tmp_path / "p.yaml"), tmp_path), LocalExecutor(1), cache_dir=cache)
    assert again["simulations"] == 0
    # another pdsim (source or built-in tables): nothing reused either
    monkeypatch.setattr(plan_mod, "_CODE_HASH", ["another pdsim"])
    other = run_plan(parse_plan(raw, str(tmp_path / "p.yaml"), tmp_path), LocalExecutor(1), cache_dir=cache)
    assert other["cached"] == 0 and other["simulations"] == slow["simulations"]


def test_a_plan_without_winner_removes_the_previous_winner(tmp_path):
    out = tmp_path / "out"
    ok = tmp_path / "ok.yaml"
    ok.write_text(yaml.safe_dump(small_plan(search={"devices": [{"name": "h100-sxm", "price_per_hour_usd": 2.0}],
                                                    "colocated": {"replicas": [2]},
                                                    "pool": {"kv_blocks": 2000, "cost_model": LINEAR}},
                                            goodput={"seeds": 1, "confirm_top": 1, "confirm_factor": 2})))
    assert main(["plan", str(ok), "--out", str(out), "--quiet", "--jobs", "1"]) == 0
    assert (out / "winner.yaml").is_file()
    none = tmp_path / "none.yaml"     # a decode step takes >= 10 ms: nothing meets TPOT <= 9 ms
    none.write_text(yaml.safe_dump(small_plan(slo={"ttft_s": 0.5, "tpot_s": 0.009, "attainment_target": 0.9})))
    assert main(["plan", str(none), "--out", str(out), "--quiet", "--jobs", "1"]) == 1
    assert not (out / "winner.yaml").exists()
    assert json.loads((out / "plan.json").read_text())["winner"] is None


class _ElsewhereExecutor:
    """Runs each task from another working directory, as a Dask worker on another machine would."""
    name = "elsewhere"

    def __init__(self, cwd):
        self.cwd = cwd

    def map(self, fn, tasks, on_done=None):
        import os
        here = os.getcwd()
        os.chdir(self.cwd)
        try:
            return [fn(t) for t in tasks]
        finally:
            os.chdir(here)


def test_relative_trace_path_is_resolved_on_the_client(tmp_path, monkeypatch):
    import shutil

    from conftest import REPO
    from pdsim.plan import load_plan
    (tmp_path / "plans" / "traces").mkdir(parents=True)
    (tmp_path / "worker").mkdir()
    shutil.copy(REPO / "scenarios" / "traces" / "azure_code_10min.csv", tmp_path / "plans" / "traces" / "code.csv")
    raw = small_plan(workload={"arrival": "trace", "trace": {"path": "traces/code.csv"}, "num_requests": 100},
                     search={"devices": [{"name": "h100-sxm", "price_per_hour_usd": 2.0}],
                             "colocated": {"replicas": [1]}, "pool": {"kv_blocks": 4000, "cost_model": LINEAR}},
                     target={}, objective="goodput_per_usd", slo={"ttft_s": 5.0, "tpot_s": 0.1},
                     goodput={"seeds": 1, "tolerance": 0.3, "min_duration_s": 0, "confirm_top": 0})
    (tmp_path / "plans" / "plan.yaml").write_text(yaml.safe_dump(raw))
    monkeypatch.chdir(tmp_path)
    plan = load_plan("plans/plan.yaml")          # a relative plan path: base_dir is relative too
    res = run_plan(plan, _ElsewhereExecutor(tmp_path / "worker"))
    assert res["simulations"] > 0 and res["rows"][0]["goodput"] > 0


def test_scheduler_with_the_local_executor_is_an_error(tmp_path, capsys):
    path = tmp_path / "p.yaml"
    path.write_text(yaml.safe_dump(small_plan()))
    assert main(["plan", str(path), "--executor", "local", "--scheduler", "tcp://127.0.0.1:9",
                 "--out", str(tmp_path / "o"), "--quiet"]) == 2
    err = capsys.readouterr().err
    assert "--scheduler" in err and "Traceback" not in err and len(err.strip().splitlines()) == 1


def _free_port() -> int:
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_real_dask_scheduler_and_workers_on_loopback(tmp_path):
    """A `dask scheduler` and a `dask worker` process on 127.0.0.1 (the worker in another folder):
    --scheduler alone selects Dask, relative trace paths work, and losing the last worker ends the
    plan with an error naming the scheduler within a bound instead of hanging."""
    import os
    import shutil
    import signal
    import subprocess
    import sys
    import threading
    import time
    from pathlib import Path

    distributed = pytest.importorskip("distributed")
    from conftest import REPO
    from pdsim.errors import PdsimError
    from pdsim.plan import DaskExecutor
    dask = Path(sys.executable).parent / "dask"
    if not dask.is_file():
        pytest.skip("no dask command in this environment")
    addr = f"tcp://127.0.0.1:{_free_port()}"
    (tmp_path / "plans" / "traces").mkdir(parents=True)
    (tmp_path / "worker").mkdir()
    shutil.copy(REPO / "scenarios" / "traces" / "azure_code_10min.csv", tmp_path / "plans" / "traces" / "code.csv")
    logs = open(tmp_path / "dask.log", "w")
    procs = []

    def start(*args, cwd):
        procs.append(subprocess.Popen([str(dask), *args], cwd=cwd, stdout=logs, stderr=subprocess.STDOUT,
                                      start_new_session=True))
        return procs[-1]

    def stop(p):
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait(10)
    try:
        start("scheduler", "--host", "127.0.0.1", "--port", addr.rsplit(":", 1)[1], "--no-dashboard",
              "--no-show", cwd=tmp_path)
        worker = start("worker", addr, "--host", "127.0.0.1", "--nthreads", "1", "--nworkers", "1",
                       "--no-dashboard", "--local-directory", str(tmp_path / "worker"), cwd=tmp_path / "worker")
        with distributed.Client(addr, timeout=60) as client:
            client.wait_for_workers(1, timeout=90)
        raw = small_plan(workload={"arrival": "trace", "trace": {"path": "traces/code.csv"}, "num_requests": 100},
                         search={"devices": [{"name": "h100-sxm", "price_per_hour_usd": 2.0}],
                                 "colocated": {"replicas": [1, 2]},
                                 "pool": {"kv_blocks": 4000, "cost_model": LINEAR}},
                         target={}, objective="goodput_per_usd", slo={"ttft_s": 5.0, "tpot_s": 0.1},
                         goodput={"seeds": 1, "tolerance": 0.3, "min_duration_s": 0, "confirm_top": 1,
                                  "confirm_factor": 2})
        plan_file = tmp_path / "plans" / "plan.yaml"
        plan_file.write_text(yaml.safe_dump(raw))
        out = tmp_path / "out"
        assert main(["plan", str(plan_file), "--scheduler", addr, "--out", str(out), "--no-cache", "--quiet"]) == 0
        dask_res = json.loads((out / "plan.json").read_text())
        local = run_plan(parse_plan(raw, str(plan_file), plan_file.parent), LocalExecutor(1))
        assert dask_res["simulations"] == local["simulations"] > 0 and dask_res["winner"] == local["winner"]
        # lose the last worker while a plan runs: the plan ends with an error, not a hang
        errors = []
        big = dict(raw, goodput=dict(raw["goodput"], tolerance=0.01, seeds=4))

        def plan_thread():
            ex = DaskExecutor(addr, lost_workers_s=3, poll_s=0.5)
            try:
                run_plan(parse_plan(big, str(plan_file), plan_file.parent), ex)
            except PdsimError as exc:
                errors.append(str(exc))
            finally:
                ex.close()
        th = threading.Thread(target=plan_thread, daemon=True)
        th.start()
        time.sleep(2)
        stop(worker)
        t0 = time.monotonic()
        th.join(90)
        assert not th.is_alive(), "the plan hung after its last worker died"
        assert errors and addr in errors[0] and "no workers" in errors[0], errors
        print(f"plan ended {time.monotonic() - t0:.1f} s after the last worker died")
    finally:
        for p in reversed(procs):
            stop(p)
        logs.close()
