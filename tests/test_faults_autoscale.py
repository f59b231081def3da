"""Faults on an autoscaled cluster (README "Faults and autoscaling"): timings by hand, invariants under
random faults + autoscaling, the fast path against step by step."""
from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from conftest import REPO, scenario
from pdsim import config, metrics
from pdsim.errors import ConfigError
from pdsim.simulation import simulate
from test_fastpath import _assert_same
from test_faults import fault_schedules

CONST = {"cost_model": {"kind": "constant", "step_s": 0.01}}


def _timeline(res, pool="replicas"):
    return [(e["t_s"], e["alive"], e["serving"])
            for e in res.topology.autoscaler.summary(res.sim_end_s)["pools"][pool]["timeline"]]


def _faulted(sc, *faults):
    return sc.model_copy(update={"faults": config.FaultsSpec(instances=list(faults))})


def test_fault_on_an_autoscaled_pool_reroutes_recomputes_and_is_replaced_by_hand():
    # 2 replicas (max 3), constant 10 ms steps, one request at t=1 (100 prompt + 50 output) on replica-0
    # (round robin).  replica-0 fails at 1.105: 10 steps done (100 + 9 tokens in KV), the 11th lost; the
    # request is re-routed to replica-1 and prefilled again (109 + 1 tokens, one step), then 39 decode
    # steps: it finishes at 1.105 + 40 x 0.01.  At 1.2 the schedule asks for 2 replicas: one serves (the
    # failed one is no capacity), so replica-2 is ordered (serves at 1.2 + 0.3 + 0.2 = 1.7) and the failed
    # replica-0 is given back at 1.2; its repair would end at 2.105 + 0.1 but it stays off.  A second request
    # at t=2 (50 steps on a serving replica) keeps the run going to 2 + 0.5 = 2.5: the clock stops there, once
    # every request is settled, before the horizon at 3.0.
    topo = {"kind": "colocated", "replicas": 2, "router": "round_robin", "kv_blocks": 100, **CONST,
            "autoscaler": {"policy": "schedule", "provisioning_s": 0.3, "load_s": 0.2,
                           "schedule": [{"at_s": 1.2, "replicas": 2}], "replicas": {"max": 3}}}
    sc = scenario({"c": topo}, arrival="constant", rate=1.0, num_requests=2, prompt_tokens=100, output_tokens=50)
    sc = _faulted(sc, {"at_s": 1.105, "instance": "replica-0", "down_s": 1.0, "warmup_s": 0.1})
    sc = sc.model_copy(update={"horizon_s": 3.0})
    (res,) = simulate(sc)
    r = res.requests[0]
    assert r.status == "finished" and r.instance == "replica-1"
    assert r.recomputed_tokens == 109 and r.fault_hits == 1
    assert r.finish_s == pytest.approx(1.105 + 0.01 * 40, abs=1e-9)
    assert _timeline(res) == [(0.0, 2, 2), (1.105, 2, 1), (1.2, 2, 1), (pytest.approx(1.7, abs=1e-12), 2, 2)]
    r0 = res.topology.by_name["replica-0"]
    # recovery after the scale-in decision: still off at the end (2.5 > 2.205), not routable
    assert r0.state == "off" and r0.down and not r0.failed
    assert r0.down_s == pytest.approx(1.2 - 1.105, abs=1e-12)       # its outage ended when it was given back
    assert res.topology.autoscaler.summary(res.sim_end_s)["pools"]["replicas"]["failed_retired"] == 1
    # GPU-hours by hand: replica-0 paid 0..1.2 (failed from 1.105, still paid), replica-1 0..2.5, replica-2 1.2..2.5
    s = metrics.summarize([res], metrics.requests_frame([res]), sc)["c"]
    assert res.sim_end_s == pytest.approx(2.5, abs=1e-9) == res.requests[1].finish_s
    assert s["gpu_hours"] == pytest.approx((1.2 + 2.5 + 1.3) / 3600, rel=1e-9)


def test_a_failed_instance_stays_paid_and_serves_again_after_its_repair_without_an_action():
    # no autoscaler action during the outage: replica-0 is paid all along, out of the serving count from
    # 1.105 to 1.105 + 0.5 + 0.1, then back (1 request at t=1 as above; the schedule's look at 2.5 has
    # nothing to change and nothing failed to give back).  200 output tokens: 10 steps before the fault, then
    # 1 + 189 on replica-1 would end at 1.105 + 1.9 = 3.005, so the request is still in flight at the horizon
    # (3.0, unfinished) and the clock runs to it
    topo = {"kind": "colocated", "replicas": 2, "router": "round_robin", "kv_blocks": 100, **CONST,
            "autoscaler": {"policy": "schedule", "schedule": [{"at_s": 2.5, "replicas": 2}], "replicas": {"max": 3}}}
    sc = scenario({"c": topo}, arrival="constant", rate=1.0, num_requests=1, prompt_tokens=100, output_tokens=200)
    # replica-1 fails at 2.8 and is still broken at the end (3.0): paid all the same
    sc = _faulted(sc, {"at_s": 1.105, "instance": "replica-0", "down_s": 0.5, "warmup_s": 0.1},
                  {"at_s": 2.8, "instance": "replica-1", "down_s": 5.0})
    sc = sc.model_copy(update={"horizon_s": 3.0})
    (res,) = simulate(sc)
    assert res.sim_end_s == 3.0 and res.requests[0].status == "unfinished"
    assert _timeline(res) == [(0.0, 2, 2), (1.105, 2, 1), (pytest.approx(1.705, abs=1e-12), 2, 2), (2.8, 2, 1)]
    r0, r1 = res.topology.by_name["replica-0"], res.topology.by_name["replica-1"]
    assert r0.state == "serving" and not r0.down and r0.alive_s(3.0) == 3.0
    assert r1.failed and r1.down and r1.alive_s(3.0) == 3.0
    s = metrics.summarize([res], metrics.requests_frame([res]), sc)["c"]
    assert s["gpu_hours"] == pytest.approx(2 * 3.0 / 3600, rel=1e-12)


def test_a_fault_while_provisioning_restarts_provisioning_after_the_repair():
    # 1 replica; at t=1 the schedule asks for 2: replica-1 would serve at 1 + 2 + 1 = 4.  It fails at 2.0
    # for 0.5 s: what it loaded is lost, it provisions and loads again after the repair, serving at
    # 2.0 + 0.5 + 2 + 1 = 5.5 (the fault's warmup_s is the load time the autoscaler already counts).
    topo = {"kind": "colocated", "replicas": 1, "router": "round_robin", "kv_blocks": 100, **CONST,
            "autoscaler": {"policy": "schedule", "provisioning_s": 2.0, "load_s": 1.0,
                           "schedule": [{"at_s": 1.0, "replicas": 2}], "replicas": {"max": 2}}}
    sc = scenario({"c": topo}, arrival="constant", rate=2.0, num_requests=20, prompt_tokens=100, output_tokens=5)
    faulted = _faulted(sc, {"at_s": 2.0, "instance": "replica-1", "down_s": 0.5, "warmup_s": 0.3})
    (base,), (res,) = simulate(sc), simulate(faulted)
    assert _timeline(base) == [(0.0, 1, 1), (1.0, 2, 1), (4.0, 2, 2)]
    assert _timeline(res) == [(0.0, 1, 1), (1.0, 2, 1), (5.5, 2, 2)]
    got = [r for r in res.requests if r.instance == "replica-1"]
    assert got and min(r.arrival_s for r in got) >= 5.5           # nothing reached it before it served
    assert all(r.status == "finished" and not r.fault_hits for r in res.requests)
    assert res.topology.by_name["replica-1"].alive_s(res.sim_end_s) == pytest.approx(res.sim_end_s - 1.0)


def test_a_scenario_file_may_fault_an_instance_slot_the_schedule_scales_out_to():
    """``replicas: 1`` with a schedule to 2: replica-1 exists from the start as an off slot, so a fault on it is
    accepted from the file (it was refused: only the initial count was named).  By hand: the schedule decides at
    5 s (provisioning 4 + load 6: serving at 15); replica-1 fails at 8 s while provisioning, for 3 s, so it
    provisions and loads again after the repair: serving at 8 + 3 + 4 + 6 = 21 s.  replica-2 can never exist
    (max 2, the schedule's largest target): still a one-line error naming it."""
    raw = {"seed": 0, "model": "llama-3.1-8b",
           "workload": {"arrival": "constant", "rate": 2.0, "num_requests": 100, "prompt_tokens": 100,
                        "output_tokens": 10},
           "faults": [{"at_s": 8, "instance": "replica-1", "down_s": 3, "warmup_s": 2}],
           "topologies": {"c": {"kind": "colocated", "replicas": 1, "kv_blocks": 10000, **CONST,
                                "autoscaler": {"policy": "schedule", "provisioning_s": 4, "load_s": 6,
                                               "schedule": [{"at_s": 5, "replicas": 2}]}}}}
    sc = config.parse(raw, "f.yaml")
    assert sc.instance_names("c") == ["replica-0", "replica-1"]
    (res,) = simulate(sc)
    assert _timeline(res) == [(0.0, 1, 1), (5.0, 2, 1), (21.0, 2, 2)]
    bad = {**raw, "faults": [{"at_s": 8, "instance": "replica-2", "down_s": 3}]}
    with pytest.raises(ConfigError, match="no instance 'replica-2'"):
        config.parse(bad, "f.yaml")


def test_a_fault_on_a_draining_instance_reroutes_its_request_and_the_drain_ends_at_once():
    # 2 replicas, requests at t=1 (replica-0) and t=2 (replica-1), 100 prompt + 300 output each.  At 2.05
    # the schedule asks for 1: replica-0 (190 tokens still to go, fewer than replica-1's) drains.  It
    # fails at 2.105: 110 steps done (100 + 109 tokens in KV), the request moves to replica-1, whose step in
    # flight ends at 2.11; then one step prefills 209 + 1 tokens (token 111) and 189 decode steps follow:
    # it finishes at 2.11 + 190 x 0.01 = 4.01.  replica-0 holds nothing: it leaves at 2.105 (paid until
    # then), and its repair (until 3.105) does not bring it back.  The default scheduler runs a prefill step
    # alone (prefill first): replica-1's own request loses that one step, 2.0 + 300 x 0.01 + 0.01.
    topo = {"kind": "colocated", "replicas": 2, "router": "round_robin", "kv_blocks": 200, **CONST,
            "autoscaler": {"policy": "schedule", "schedule": [{"at_s": 2.05, "replicas": 1}]}}
    sc = scenario({"c": topo}, arrival="constant", rate=1.0, num_requests=2, prompt_tokens=100, output_tokens=300)
    sc = _faulted(sc, {"at_s": 2.105, "instance": "replica-0", "down_s": 1.0})
    (res,) = simulate(sc)
    r1, r2 = res.requests
    assert r1.instance == "replica-1" and r1.recomputed_tokens == 209 and r1.fault_hits == 1
    assert r1.finish_s == pytest.approx(4.01, abs=1e-9)
    assert r2.finish_s == pytest.approx(2.0 + 300 * 0.01 + 0.01, abs=1e-9) and not r2.fault_hits
    r0 = res.topology.by_name["replica-0"]
    assert r0.state == "off" and not r0.failed and r0.alive_s(res.sim_end_s) == pytest.approx(2.105, abs=1e-12)
    assert _timeline(res) == [(0.0, 2, 2), (2.05, 2, 1), (2.105, 1, 1)]


def test_a_fault_on_an_off_instance_does_nothing():
    topo = {"kind": "colocated", "replicas": 1, "kv_blocks": 100, **CONST,
            "autoscaler": {"policy": "schedule", "schedule": [{"at_s": 5.0, "replicas": 2}], "replicas": {"max": 2}}}
    sc = scenario({"c": topo}, arrival="constant", rate=1.0, num_requests=3, prompt_tokens=100, output_tokens=5)
    (base,), (res,) = simulate(sc), simulate(_faulted(sc, {"at_s": 1.0, "instance": "replica-1", "down_s": 10.0}))
    assert [r.finish_s for r in res.requests] == [r.finish_s for r in base.requests]
    assert _timeline(res) == _timeline(base)
    inst = res.topology.by_name["replica-1"]
    assert inst.down_s == 0.0 and not inst.failed and inst.alive_s(res.sim_end_s) == base.topology.by_name[
        "replica-1"].alive_s(base.sim_end_s)


# --- role switching (policy mix) under faults -------------------------------------------------------------
def _mix_faulted(*faults):
    # 1P3D, linear steps, 2000-token prompts and 100-token replies at 8/s: one request needs 0.105
    # instance-seconds of prefill and ~0.057 of decode (batch 16 at ~9 ms a step), so the mix wants
    # round(4 x 0.65) = 3 prefill instances and the look at t=1.0 (the first after a completion) makes a decode
    # instance drain to switch.  Without a fault that is decode-2, the least loaded, and it leaves at ~1.146.
    lin = {"cost_model": {"kind": "linear", "base_s": 0.005, "per_token_s": 5e-5, "per_kv_token_s": 1e-7}}
    topo = {"kind": "disaggregated", "prefill": {"instances": 1, "kv_blocks": 1000, **lin},
            "decode": {"instances": 3, "kv_blocks": 1000, "max_running": 16, **lin},
            "kv_link": {"bandwidth_GBps": 1000},
            "autoscaler": {"policy": "mix", "interval_s": 1.0, "cooldown_s": 0.0, "switch_s": 0.5}}
    sc = scenario({"t": topo}, arrival="constant", rate=8.0, num_requests=40, prompt_tokens=2000, output_tokens=100)
    if faults:
        sc = _faulted(sc, *faults)
    (res,) = simulate(sc)
    assert all(r.status == "finished" for r in res.requests)        # (and check_conservation ran)
    return sc, res


def test_a_fault_on_an_instance_draining_to_switch_roles_delays_its_new_role_until_the_repair():
    _, base = _mix_faulted()
    (sw,) = base.topology.autoscaler.switches
    assert (sw["decided_s"], sw["from"], sw["to"]) == (1.0, "decode-2", "prefill-1")
    assert 1.1 < sw["t_s"] < 1.2 and sw["serves_at_s"] == pytest.approx(sw["t_s"] + 0.5, abs=1e-12)
    # decode-2 fails at 1.1 while it drains (down 2.0 s, warm-up 0.5 s): its request is re-routed and
    # recomputed, the drain completes at once, and the same GPUs serve as prefill-1 after the repair, at
    # 1.1 + 2.0 + 0.5 = 3.6, not at 1.1 + switch_s = 1.6
    sc, res = _mix_faulted({"at_s": 1.1, "instance": "decode-2", "down_s": 2.0, "warmup_s": 0.5})
    a = res.topology.autoscaler
    (sw,) = a.switches
    assert (sw["decided_s"], sw["t_s"], sw["from"], sw["to"]) == (1.0, 1.1, "decode-2", "prefill-1")
    assert sw["serves_at_s"] == pytest.approx(3.6, abs=1e-12) and sw["failed_until_s"] == sw["serves_at_s"]
    assert _timeline(res, "prefill") == [(0.0, 1, 1), (1.1, 2, 1), (pytest.approx(3.6, abs=1e-12), 2, 2)]
    assert _timeline(res, "decode") == [(0.0, 3, 3), (1.0, 3, 2), (1.1, 2, 2)]
    hit = [r for r in res.requests if r.fault_hits]
    assert len(hit) == 1 and hit[0].decode_instance != "decode-2" and hit[0].recomputed_tokens > 0
    assert not any(r.instance == "prefill-1" and r.prefill_start_s < 3.6 for r in res.requests)
    d2 = res.topology.by_name["decode-2"]
    assert d2.state == "off" and not d2.failed and d2.alive_s(res.sim_end_s) == pytest.approx(1.1, abs=1e-12)
    # the broken GPUs stay paid through the repair: 4 instances x 1 GPU without a break
    s = metrics.summarize([res], metrics.requests_frame([res]), sc)["t"]
    assert s["gpu_hours"] == pytest.approx(4 * res.sim_end_s / 3600, rel=1e-12)


def test_a_fault_on_the_switched_gpus_while_they_wait_for_the_new_role_never_brings_them_back_early():
    # as above, decode-2 fails at 1.1 while draining (repaired and warmed up at 3.6) and goes on as prefill-1;
    # the same GPUs fail again at 1.2 for 0.1 s: still broken until 3.6, they serve at 3.6 (a restart from
    # the second fault alone would give 1.2 + 0.1 + switch_s 0.5 = 1.8)
    _, res = _mix_faulted({"at_s": 1.1, "instance": "decode-2", "down_s": 2.0, "warmup_s": 0.5},
                          {"at_s": 1.2, "instance": "prefill-1", "down_s": 0.1})
    (sw,) = res.topology.autoscaler.switches
    assert sw["serves_at_s"] == pytest.approx(3.6, abs=1e-12) and sw["failed_until_s"] == pytest.approx(3.6)
    assert _timeline(res, "prefill")[-1] == (pytest.approx(3.6, abs=1e-12), 2, 2)
    assert not any(r.instance == "prefill-1" and r.prefill_start_s < 3.6 for r in res.requests)
    # the outage is counted: under decode-2 until it left (at once: 0 s), under prefill-1 the rest (2.5 s)
    by = res.topology.by_name
    assert by["decode-2"].down_s == 0.0
    assert by["prefill-1"].down_s == pytest.approx(3.6 - 1.1, abs=1e-12)
    log = [e for e in res.topology.fault_log if e["instance"] == "decode-2" and "retired" in e]
    assert log and "switch" in log[0]["retired"]


def test_a_fault_during_a_healthy_switch_costs_the_repair_not_a_new_provisioning():
    # no fault before: decode-2 leaves at ~1.146 and would serve as prefill-1 0.5 s later.  prefill-1 (those
    # GPUs, held and paid) fails at 1.2 for 0.1 s with a 0.3 s warm-up: it serves at max(1.2 + 0.1 + 0.3,
    # 1.2 + switch_s 0.5) = 1.7, not after a new provisioning (60 s by default)
    _, res = _mix_faulted({"at_s": 1.2, "instance": "prefill-1", "down_s": 0.1, "warmup_s": 0.3})
    (sw,) = res.topology.autoscaler.switches
    assert sw["serves_at_s"] == pytest.approx(1.7, abs=1e-12) and sw["failed_until_s"] == pytest.approx(1.6)
    assert _timeline(res, "prefill")[-1] == (pytest.approx(1.7, abs=1e-12), 2, 2)
    assert res.topology.by_name["prefill-1"].down_s == pytest.approx(0.4, abs=1e-12)


def test_a_failed_instance_is_not_switched_and_serves_again_in_its_role():
    # decode-2 fails at 0.9 for 3 s (until 3.9): at the look at 1.0 the mix wants the same switch, but only
    # decode-0 and decode-1 are healthy: the less loaded of the two drains (decode-1), decode-2 keeps its
    # role and serves as decode again from 3.9.  (Picking by load alone would take the broken one: it holds
    # nothing.)
    _, res = _mix_faulted({"at_s": 0.9, "instance": "decode-2", "down_s": 3.0})
    (sw,) = res.topology.autoscaler.switches
    assert (sw["decided_s"], sw["from"], sw["to"]) == (1.0, "decode-1", "prefill-1") and "failed_until_s" not in sw
    assert sw["serves_at_s"] == pytest.approx(sw["t_s"] + 0.5, abs=1e-12)
    tl = _timeline(res, "decode")
    assert tl[:3] == [(0.0, 3, 3), (0.9, 3, 2), (1.0, 3, 1)] and tl[-1] == (pytest.approx(3.9, abs=1e-12), 2, 2)
    d2 = res.topology.by_name["decode-2"]
    assert d2.state == "serving" and not d2.failed and d2.down_s == pytest.approx(3.0, abs=1e-12)
    assert any(r.decode_instance == "decode-2" and r.decode_start_s >= 3.9 for r in res.requests)


LIN = {"cost_model": {"kind": "linear", "base_s": 0.005, "per_token_s": 5e-5, "per_kv_token_s": 1e-7}}
TOPOS = [
    {"kind": "colocated", "replicas": 2, "kv_blocks": 60, **LIN,
     "autoscaler": {"policy": "schedule", "provisioning_s": 0.2, "load_s": 0.1, "replicas": {"max": 4},
                    "schedule": [{"at_s": 0.5, "replicas": 1}, {"at_s": 1.0, "replicas": 4}, {"at_s": 2.0, "replicas": 2}]}},
    {"kind": "colocated", "replicas": 1, "kv_blocks": 60, **LIN,
     "autoscaler": {"policy": "threshold", "interval_s": 0.1, "cooldown_s": 0.2, "provisioning_s": 0.1, "load_s": 0.1,
                    "scale_in_window_s": 0.2,
                    "replicas": {"max": 3, "metric": "queue", "scale_out_above": 1, "scale_in_below": 0.5}}},
    {"kind": "disaggregated", "prefill": {"instances": 2, "kv_blocks": 40, **LIN},
     "decode": {"instances": 2, "kv_blocks": 50, "max_running": 6, **LIN}, "kv_link": {"bandwidth_GBps": 1},
     "autoscaler": {"policy": "schedule", "provisioning_s": 0.2, "load_s": 0.1, "prefill": {"max": 3},
                    "decode": {"max": 3},
                    "schedule": [{"at_s": 0.4, "prefill": 1, "decode": 1}, {"at_s": 1.2, "prefill": 3, "decode": 3},
                                 {"at_s": 2.2, "decode": 1}]}},
    {"kind": "disaggregated", "prefill": {"instances": 1, "device": "h100-sxm"},
     "decode": {"instances": 1, "device": "h100-sxm", "kv_blocks": 400},
     "autoscaler": {"policy": "slo", "interval_s": 0.25, "cooldown_s": 0.25, "provisioning_s": 0.2, "load_s": 0.2,
                    "scale_in_window_s": 0.5, "slo": {"window_s": 1.0}, "prefill": {"max": 3}, "decode": {"max": 3}}},
    {"kind": "disaggregated", "prefill": {"instances": 1, "kv_blocks": 200, **LIN},
     "decode": {"instances": 3, "kv_blocks": 200, "max_running": 8, **LIN}, "kv_link": {"bandwidth_GBps": 1},
     "autoscaler": {"policy": "mix", "interval_s": 0.2, "cooldown_s": 0.2, "switch_s": 0.3}},
]
SCALED = st.sampled_from(TOPOS)


def _all_names(sc):
    t = sc.topologies["t"]
    if t.kind == "colocated":
        return [f"replica-{i}" for i in range(t.autoscaler.replicas.max)]
    return [f"prefill-{i}" for i in range(t.autoscaler.prefill.max)] + \
        [f"decode-{i}" for i in range(t.autoscaler.decode.max)]


@settings(deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(topo=SCALED, seed=st.integers(0, 10**6), n=st.integers(1, 6) | st.integers(20, 60), rate=st.floats(2, 60),
       data=st.data(), fast=st.booleans())
def test_nothing_lost_and_kv_conserved_under_random_faults_and_autoscaling(topo, seed, n, rate, data, fast):
    sc = scenario({"t": topo}, rate=rate, num_requests=n,
                  prompt_tokens={"dist": "uniform", "low": 1, "high": 200},
                  output_tokens={"dist": "uniform", "low": 1, "high": 60})
    names = sorted(set(sc.instance_names("t")) | set(_all_names(sc)))
    sched = data.draw(fault_schedules(names))
    sched["instances"] = [f for f in sched["instances"] if f["instance"] in sc.instance_names("t")]
    sc = sc.model_copy(update={"seed": seed, "faults": config.FaultsSpec(**sched)})
    (res,) = simulate(sc, fast=fast)        # check_conservation raises on lost requests or leaked blocks
    assert {r.status for r in res.requests} <= {"finished", "rejected"}
    for r in res.requests:
        if r.status == "finished":
            assert r.generated == r.output_tokens and r.finish_s >= r.arrival_s
    for inst in res.topology.instances:
        assert inst.down == (inst.failed or inst.state != "serving")
        if inst.state == "off":
            assert not inst.failed and inst.kv.free_blocks == inst.kv.total_blocks
        if not inst.down:
            assert inst.kv.free_blocks == inst.kv.total_blocks
        # paid time never exceeds the run, and an off instance accrues nothing after it left
        assert 0.0 <= inst.alive_s(res.sim_end_s) <= res.sim_end_s + 1e-9


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("which", [0, 2, 3, 4])
def test_fast_path_equals_step_by_step_with_faults_and_autoscaling(which, seed):
    topo = TOPOS[which]
    sc = scenario({"t": topo}, rate=None, num_requests=None, duration_s=3,
                  rate_curve={"points": [[0, 5], [1.0, 40], [3, 5]]},
                  prompt_tokens={"dist": "uniform", "low": 10, "high": 200},
                  output_tokens={"dist": "uniform", "low": 2, "high": 150})
    first = sc.instance_names("t")[0]
    last = sc.instance_names("t")[-1]
    sc = sc.model_copy(update={"seed": seed, "faults": config.FaultsSpec(
        instances=[{"at_s": 0.3, "instance": first, "down_s": 0.4, "warmup_s": 0.1},
                   {"at_s": 1.25, "instance": last, "down_s": 0.3},
                   {"at_s": 2.1, "instance": first, "down_s": 0.2}],
        random={"mtbf_s": 2.0, "mttr_s": 0.3})})
    fast, slow = simulate(sc), simulate(sc, fast=False)
    _assert_same(fast, slow)
    pools = [p.name.replace("replica", "replicas") for p in fast[0].topology.pools]
    for p in pools:
        assert _timeline(fast[0], p) == _timeline(slow[0], p)
    assert fast[0].topology.autoscaler.switches == slow[0].topology.autoscaler.switches   # (mix: TOPOS[4])
    assert len(fast[0].topology.fault_log) >= 3


def test_faults_autoscale_scenario_runs_at_tiny_scale():
    sc = config.load(REPO / "scenarios" / "faults-autoscale.yaml")
    sc = sc.model_copy(update={"workload": sc.workload.model_copy(update={"duration_s": 90.0})})
    results = simulate(sc)
    for res in results:
        assert all(r.status in ("finished", "rejected") for r in res.requests)
    scaled = [r for r in results if r.topology.autoscaler is not None]
    assert scaled and any(e.get("requests_lost") is not None for r in scaled for e in r.topology.fault_log)
