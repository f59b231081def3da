"""horizon_s worked by hand: the clock stops at the horizon or once every request is settled, whichever comes
first; a request that would arrive at or after the horizon is not part of the run (counted as cut), one in
flight there is unfinished (DESIGN.md: "still in flight at the horizon") and a miss.

Constant cost model: every step takes 0.25 s (binary-exact), prompt 100, output 3 tokens, so a lone request
takes a prefill step (its first token) and two decode steps: 0.75 s from its arrival to its finish.
"""
from __future__ import annotations

import json

import pytest

from conftest import scenario
from pdsim import metrics
from pdsim.__main__ import main
from pdsim.simulation import simulate

POOL = {"kind": "colocated", "replicas": 1, "cost_model": {"kind": "constant", "step_s": 0.25}, "kv_blocks": 1000}


def _trace_scenario(tmp_path, arrivals, horizon_s=None):
    trace = tmp_path / "t.csv"
    trace.write_text("arrived_at,num_prefill_tokens,num_decode_tokens\n"
                     + "".join(f"{a},100,3\n" for a in arrivals))
    sc = scenario({"t": POOL}, arrival="trace", trace={"path": str(trace)})
    sc = sc.model_copy(update={"slo": sc.slo.model_copy(update={"ttft_s": 1.0, "tpot_s": 1.0})})
    return sc.model_copy(update={"horizon_s": horizon_s})


def _summary(sc):
    res = simulate(sc)
    df = metrics.requests_frame(res, sc.client)
    return res, df, metrics.summarize(res, df, sc)["t"]


def test_a_horizon_in_flight_cuts_later_arrivals_and_leaves_the_one_in_flight_unfinished(tmp_path):
    # arrivals 0, 1, 2, 3, 4; horizon 2.5. Request 0: 0 -> 0.75, request 1: 1 -> 1.75 (the replica idle in
    # between), request 2: prefill 2 -> 2.25 (first token, TTFT 0.25), decode 2.25 -> 2.5 -> 2.75: the clock
    # stops at 2.5 before its last step ends (the horizon goes before the step end at the same time): unfinished.
    # Requests 3 and 4 would arrive after 2.5: not in the run, counted as cut.
    (res,), df, s = _summary(_trace_scenario(tmp_path, [0, 1, 2, 3, 4], horizon_s=2.5))
    assert res.cut_by_horizon == 2 and s["cut_by_horizon"] == 2
    assert sorted(r.id for r in res.requests) == [0, 1, 2]
    assert df.status.tolist() == ["finished", "finished", "unfinished"]
    assert df.finish_s.tolist()[:2] == [0.75, 1.75]
    assert s["requests"] == {"total": 3, "finished": 2, "rejected": 0, "abandoned": 0, "unfinished": 1}
    # attainment: the share of the requests that arrived (README: unfinished count as misses): 2 of 3, not 2 of 5
    assert s["slo_attainment"] == pytest.approx(2 / 3)
    # the clock ran to the horizon (request 2 in flight): 6 output tokens of 2 finished requests over 2.5 s
    assert s["sim_end_s"] == 2.5
    assert s["throughput"]["output_tokens_per_s"] == pytest.approx(6 / 2.5)
    assert s["throughput"]["requests_per_s"] == pytest.approx(2 / 2.5)
    # TTFT percentiles over the arrived requests not rejected: 0.25 (x3, request 2's too: it streamed a token)
    assert s["ttft_s"]["p99"] == pytest.approx(0.25)


def test_a_horizon_after_the_last_finish_ends_the_run_at_that_finish(tmp_path):
    # the same five requests, horizon 10: all finish, the last at 4.75; nothing cut, the clock stops at 4.75
    (res,), df, s = _summary(_trace_scenario(tmp_path, [0, 1, 2, 3, 4], horizon_s=10.0))
    assert res.sim_end_s == 4.75 and s["sim_end_s"] == 4.75 and s["cut_by_horizon"] == 0
    assert s["requests"]["finished"] == 5 and s["slo_attainment"] == 1.0
    assert s["throughput"]["output_tokens_per_s"] == pytest.approx(15 / 4.75)
    # busy 5 x 0.75 s of the 4.75 s
    assert s["pools"]["replica"]["busy_fraction"] == pytest.approx(3.75 / 4.75)


def test_a_horizon_before_every_arrival_is_refused():
    # Poisson at 0.01 req/s, seed 0: the first request arrives at 68 s; a horizon at 10 s leaves nothing to run
    from pdsim.errors import ConfigError
    sc = scenario({"t": POOL}, rate=0.01).model_copy(update={"horizon_s": 10.0})
    with pytest.raises(ConfigError, match=r"every request arrives at or after the horizon \(the first at 67.99"):
        simulate(sc)


def test_a_closed_loop_stops_sending_at_the_horizon():
    # one client, no think time, 10 requests of 0.75 s each: sent at 0, 0.75, 1.5; horizon 1.9: the third
    # is in flight (prefill 1.5 -> 1.75, decode 1.75 -> 2.0), the other 7 were never sent: cut
    sc = scenario({"t": POOL}, arrival="closed", clients=1, num_requests=10, output_tokens=3)
    sc = sc.model_copy(update={"horizon_s": 1.9})
    (res,) = simulate(sc)
    assert res.cut_by_horizon == 7
    assert [(r.arrival_s, r.status) for r in sorted(res.requests, key=lambda r: r.id)] == \
        [(0.0, "finished"), (0.75, "finished"), (1.5, "unfinished")]
    df = metrics.requests_frame([res], sc.client)
    s = metrics.summarize([res], df, sc)["t"]
    assert s["requests"]["total"] == 3 and s["cut_by_horizon"] == 7 and s["sim_end_s"] == 1.9


def test_a_closed_loop_with_a_horizon_past_its_end_is_the_run_without_one():
    sc = scenario({"t": POOL}, arrival="closed", clients=2, num_requests=10, output_tokens=3)
    (a,) = simulate(sc)
    (b,) = simulate(sc.model_copy(update={"horizon_s": 100.0}))
    assert b.sim_end_s == a.sim_end_s == max(r.finish_s for r in a.requests) and b.cut_by_horizon == 0
    assert [(r.arrival_s, r.finish_s, r.status) for r in a.requests] == \
        [(r.arrival_s, r.finish_s, r.status) for r in b.requests]


SCENARIO = """
seed: 1
model: llama-3.1-8b
workload: {arrival: poisson, rate: 6, num_requests: 60, prompt_tokens: {dist: lognormal, mean: 1200, cv: 1.0},
           output_tokens: {dist: lognormal, mean: 150, cv: 1.0, max: 600}}
slo: {ttft_s: 0.3, tpot_s: 0.03}
topologies:
  colo: {kind: colocated, replicas: 1, device: h100-sxm, engine: vllm-v1}
  pd: {kind: disaggregated, prefill: {instances: 1, device: h100-sxm}, decode: {instances: 1, device: h100-sxm}}
"""


def test_a_horizon_past_the_last_finish_changes_no_output(tmp_path, capsys):
    path = tmp_path / "s.yaml"
    path.write_text(SCENARIO)
    outs = {}
    for h in (None, 1000):
        out = tmp_path / f"h{h}"
        assert main(["run", str(path), "--out", str(out), "--quiet", "--no-report"]
                    + ([] if h is None else ["--set", f"horizon_s={h}"])) == 0
        outs[h] = out
    capsys.readouterr()
    a, b = (json.loads((outs[h] / "summary.json").read_text()) for h in (None, 1000))
    assert a["topologies"] == b["topologies"]
    for t in b["topologies"].values():
        assert t["sim_end_s"] < 1000 and t["cut_by_horizon"] == 0
    for f in ("requests.csv", "timeseries.csv"):
        assert (outs[None] / f).read_bytes() == (outs[1000] / f).read_bytes(), f


def test_a_horizon_cut_is_said_on_stderr_and_in_the_summary(tmp_path, capsys):
    path = tmp_path / "s.yaml"
    path.write_text(SCENARIO)
    assert main(["run", str(path), "--out", str(tmp_path / "o"), "--quiet", "--no-report",
                 "--set", "horizon_s=2"]) == 0
    err = capsys.readouterr().err
    s = json.loads((tmp_path / "o" / "summary.json").read_text())["topologies"]
    rows = (tmp_path / "o" / "requests.csv").read_text().splitlines()
    for name, t in s.items():
        n = t["cut_by_horizon"]
        assert n > 0 and t["requests"]["total"] + n == 60
        assert f"pdsim: {name}: horizon_s = 2 s cut {n} requests" in err
    assert len(rows) - 1 == sum(t["requests"]["total"] for t in s.values())
