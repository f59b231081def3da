"""pdsim.faults by hand: outage spans, overlapping faults, link degradation, random faults' seeding.

Written to kill mutmut survivors in faults.py (tests/MUTANTS.md section 2). Runs use ConstantCost
(every step 0.1 s), so each expected time is arithmetic on the fault schedule.
"""
from __future__ import annotations

from types import SimpleNamespace as NS

from pdsim import faults


def test_fault_windows_are_the_logged_spans():
    # an extension entry of an instance already down has a span too; a log entry without one does not
    log = [{"instance": "r-0", "at_s": 1.0, "until_s": 3.0}, {"note": "x", "at_s": 2.0},
           {"link": "all", "at_s": 4.0, "until_s": 4.5, "bandwidth_fraction": 0.5}]
    assert faults.fault_windows(NS(fault_log=log)) == [(1.0, 3.0), (4.0, 4.5)]


import numpy as np
import pytest
import simpy


class _Topo:
    """What the fault processes act on, recording each failure and recovery (time, instance)."""
    def __init__(self, env, links=()):
        self.env, self.fault_log, self.links, self.events = env, [], list(links), []

    def fail_instance(self, inst, until_s):
        inst.down = inst.failed = True
        self.fault_log.append({"instance": inst.name, "at_s": self.env.now, "until_s": until_s})
        self.events.append(("fail", self.env.now, inst.name))

    def recover_instance(self, inst):
        inst.down = inst.failed = False
        self.events.append(("up", self.env.now, inst.name))


def _inst(name="r-0", pool="replica"):
    return NS(name=name, pool=pool, down=False, failed=False, state="serving", outages=0, down_until=0.0,
              down_since=0.0, down_s=0.0)


def test_one_fault_down_for_down_plus_warmup():
    # at 1.5 s, down 1.0 s plus 0.25 s warm-up: down 1.5 -> 2.75
    env = simpy.Environment()
    topo, inst = _Topo(env), _inst()
    env.process(faults._instance_fault(env, topo, inst, 1.5, 1.0, 0.25))
    env.run(until=10)
    assert topo.events == [("fail", 1.5, "r-0"), ("up", 2.75, "r-0")]
    assert inst.down_s == 1.25 and faults.fault_windows(topo) == [(1.5, 2.75)]
    # a fault scheduled at 0 when the run is already at 0 starts at once
    env = simpy.Environment()
    topo, inst = _Topo(env), _inst()
    env.process(faults._instance_fault(env, topo, inst, 0.0, 2.0, 0.0))
    env.run(until=10)
    assert topo.events == [("fail", 0.0, "r-0"), ("up", 2.0, "r-0")]
    # at_s is an absolute time: a fault process started at 1 s for a fault at 5 s fails it at 5 s
    env = simpy.Environment()
    topo, inst = _Topo(env), _inst()
    env.run(until=1.0)
    env.process(faults._instance_fault(env, topo, inst, 5.0, 1.0, 0.0))
    env.run(until=10)
    assert topo.events == [("fail", 5.0, "r-0"), ("up", 6.0, "r-0")]


def test_overlapping_faults_extend_to_the_later_end_only():
    # A: 1.0 -> 3.0; B at 2.0 for 2.0 -> 4.0 extends it; C at 2.5 for 0.1 (-> 2.6) inside it changes nothing
    env = simpy.Environment()
    topo, inst = _Topo(env), _inst()
    for at, down in ((1.0, 2.0), (2.0, 2.0), (2.5, 0.1)):
        env.process(faults._instance_fault(env, topo, inst, at, down, 0.0))
    env.run(until=10)
    assert topo.events == [("fail", 1.0, "r-0"), ("up", 4.0, "r-0")]
    assert inst.down_s == 3.0
    ext = [e for e in topo.fault_log if "overlaps" in e]
    assert [(e["instance"], e["at_s"], e["until_s"]) for e in ext] == [("r-0", 2.0, 4.0), ("r-0", 2.5, 4.0)]
    assert all(e["overlaps"].startswith("already down") for e in ext)
    assert faults.fault_windows(topo) == [(1.0, 3.0), (2.0, 4.0), (2.5, 4.0)]
    # a fault inside an outage does not shorten it: A 1.0 -> 5.0, B at 2.0 for 1.0
    env = simpy.Environment()
    topo, inst = _Topo(env), _inst()
    for at, down in ((1.0, 4.0), (2.0, 1.0)):
        env.process(faults._instance_fault(env, topo, inst, at, down, 0.0))
    env.run(until=10)
    assert topo.events == [("fail", 1.0, "r-0"), ("up", 5.0, "r-0")] and inst.down_s == 4.0


class _MeanRng:
    """An 'exponential' that always returns its mean: the random-fault timeline becomes arithmetic."""
    def exponential(self, mean):
        return mean


def test_random_faults_timeline_with_fixed_draws():
    # MTBF 10 is failure to failure: MTTR 2 and warm-up 1 leave an up time of 10 - 2 - 1 = 7 (the MTTF).
    # Fail at 7, up at 10, fail at 17, up at 20, ...: a failure every 10 s (before: every 13 s, up time 10)
    env = simpy.Environment()
    topo, inst = _Topo(env), _inst()
    env.process(faults._random_faults(env, topo, inst, _MeanRng(), 10.0, 2.0, 1.0))
    env.run(until=50)
    assert topo.events == [("fail", 7, "r-0"), ("up", 10, "r-0"), ("fail", 17, "r-0"), ("up", 20, "r-0"),
                           ("fail", 27, "r-0"), ("up", 30, "r-0"), ("fail", 37, "r-0"), ("up", 40, "r-0"),
                           ("fail", 47, "r-0")]
    assert inst.down_s == 12.0


def test_random_fault_during_a_scheduled_outage_waits_for_its_end():
    # scheduled: down 5 -> 20. The random failure due at 7 (up time 10 - 2 - 1) finds it down (extends to
    # max(10, 20) = 20); the next random failure comes an up time after the recovery: 20 + 7 = 27, up at 30
    env = simpy.Environment()
    topo, inst = _Topo(env), _inst()
    env.process(faults._instance_fault(env, topo, inst, 5.0, 15.0, 0.0))
    env.process(faults._random_faults(env, topo, inst, _MeanRng(), 10.0, 2.0, 1.0))
    env.run(until=32)
    assert [(k, t) for k, t, _ in topo.events] == [("fail", 5.0), ("up", 20.0), ("fail", pytest.approx(27.0)),
                                                   ("up", pytest.approx(30.0))]


def test_random_fault_that_extends_a_scheduled_outage_fails_again_mtbf_after_the_end():
    # MTBF 25, MTTR 14, warm-up 1: up times of 10.  Scheduled: down 5 -> 20. The random failure due at 10
    # (repair 14 + warm-up 1) extends the outage to 25; both processes wake at 25, the random one first (its
    # wait was set at 10): it waits for the recovery (a nanosecond), and fails it again an up time later: 35,
    # up at 35 + 15 = 50
    env = simpy.Environment()
    topo, inst = _Topo(env), _inst()
    env.process(faults._instance_fault(env, topo, inst, 5.0, 15.0, 0.0))
    env.process(faults._random_faults(env, topo, inst, _MeanRng(), 25.0, 14.0, 1.0))
    env.run(until=55)
    assert [(k, t) for k, t, _ in topo.events] == [("fail", 5.0), ("up", 25.0), ("fail", pytest.approx(35.0)),
                                                   ("up", pytest.approx(50.0))]


class _Link:
    def __init__(self):
        self.factors = []

    def degrade(self, env, fraction):
        self.factors.append((env.now, fraction))


def test_link_fault_degrades_every_link_for_its_window():
    env = simpy.Environment()
    links = [_Link(), _Link()]
    topo = _Topo(env, links)
    env.process(faults._link_fault(env, topo, 2.0, 3.0, 0.25))
    env.run(until=10)
    assert all(lk.factors == [(2.0, 0.25), (5.0, 1.0)] for lk in links)
    assert topo.fault_log == [{"link": "all", "at_s": 2.0, "until_s": 5.0, "bandwidth_fraction": 0.25}]
    env = simpy.Environment()
    topo = _Topo(env, [_Link()])
    env.process(faults._link_fault(env, topo, 0.0, 1.0, 0.0))
    env.run(until=10)
    assert topo.links[0].factors == [(0.0, 0.0), (1.0, 1.0)]
    # at_s is an absolute time here too: started at 1 s, the fault at 4 s runs 4 -> 6
    env = simpy.Environment()
    topo = _Topo(env, [_Link()])
    env.run(until=1.0)
    env.process(faults._link_fault(env, topo, 4.0, 2.0, 0.5))
    env.run(until=10)
    assert topo.links[0].factors == [(4.0, 0.5), (6.0, 1.0)]


@pytest.mark.parametrize("order", [1, -1])
def test_back_to_back_link_faults_compose_whatever_their_order(order):
    # scenarios/faults-link-down.yaml: down 40 - 60, then 10% 60 - 100.  At 60 the first fault's end and the
    # second's start both set the link to the smallest active fraction, 0.1 (never a blind 1.0 restore);
    # at 100 nothing is active: 1.0
    lk = _Link()
    f = _fspec(links=[{"topology": None, "at_s": 40.0, "duration_s": 20.0, "bandwidth_fraction": 0.0},
                      {"topology": None, "at_s": 60.0, "duration_s": 40.0, "bandwidth_fraction": 0.1}][::order])
    _schedule("t", f, [], [lk], until=200.0)
    assert lk.factors == [(40.0, 0.0), (60.0, 0.1), (60.0, 0.1), (100.0, 1.0)]


def _fspec(instances=(), random=None, links=()):
    inst = [NS(**{"topology": None, "warmup_s": 0.0, **d}) for d in instances]
    return NS(instances=inst, random=random, links=[NS(**d) for d in links])


def _schedule(name, f, instances, links=(), seed=0, until=100.0):
    env = simpy.Environment()
    topo = _Topo(env, links)
    topo.instances = instances
    faults.schedule_faults(env, NS(seed=seed, faults=f), name, topo)
    env.run(until=until)
    return topo


def test_schedule_faults_applies_only_this_topologys_faults():
    f = _fspec(instances=[{"instance": "r-0", "at_s": 1.0, "down_s": 1.0},
                          {"instance": "r-0", "at_s": 5.0, "down_s": 1.0, "topology": "other"},
                          {"instance": "r-1", "at_s": 3.0, "down_s": 1.0, "topology": "t"},
                          {"instance": "zz", "at_s": 4.0, "down_s": 1.0}],
               links=[{"topology": None, "at_s": 1.0, "duration_s": 2.0, "bandwidth_fraction": 0.5},
                      {"topology": "other", "at_s": 6.0, "duration_s": 1.0, "bandwidth_fraction": 0.0},
                      {"topology": "t", "at_s": 7.0, "duration_s": 1.0, "bandwidth_fraction": 0.1}])
    lk = _Link()
    topo = _schedule("t", f, [_inst("r-0"), _inst("r-1")], [lk])
    assert [(k, t, n) for k, t, n in topo.events if k == "fail"] == [("fail", 1.0, "r-0"), ("fail", 3.0, "r-1")]
    assert lk.factors == [(1.0, 0.5), (3.0, 1.0), (7.0, 0.1), (8.0, 1.0)]
    # no links: link faults have nothing to act on and log nothing
    topo = _schedule("t", f, [_inst("r-0"), _inst("r-1")])
    assert all("link" not in e for e in topo.fault_log)


def _first_failures(name, seed, pools=None, until=60.0):
    r = NS(pools=pools, mtbf_s=10.0, mttr_s=1.0, warmup_s=0.0)
    insts = [_inst("r-0", "prefill"), _inst("d-0", "decode"), _inst("d-1", "decode")]
    topo = _schedule(name, _fspec(random=r), insts, seed=seed, until=until)
    first = {}
    for k, t, n in topo.events:
        if k == "fail":
            first.setdefault(n, t)
    return first


def test_random_faults_are_per_instance_per_topology_and_seeded():
    a = _first_failures("t", 0)
    assert set(a) == {"r-0", "d-0", "d-1"}                        # 60 s at MTBF 10: P(no failure) = e^-6 each
    assert len(set(a.values())) == 3                               # each instance its own stream
    assert _first_failures("t", 0) == a                            # same seed, same faults
    assert _first_failures("u", 0) != a and _first_failures("t", 1) != a
    d = _first_failures("t", 0, pools=["decode"])
    assert set(d) == {"d-0", "d-1"} and d == {k: a[k] for k in ("d-0", "d-1")}   # filtering does not reshuffle


def test_random_fault_counts_follow_mtbf_and_mttr():
    # MTBF is failure to failure (renewal theory): up ~ Exp(mean 10 - 2 - 1 = 7), down ~ Exp(mean 2) + 1 warm-up:
    # a cycle of 10 s on average, so about 10,000 / 10 = 1,000 failures in 10,000 s (sd ~ sqrt(1000) x cycle CV
    # sqrt(49 + 4) / 10 = 0.73 = 23; 5 sd allowed: the old MTTF reading, 10,000 / 13 = 769, is 10 sd away) and a
    # down fraction of 3 / 10 (the old reading: 3 / 13 = 0.23)
    env = simpy.Environment()
    topo, inst = _Topo(env), _inst()
    env.process(faults._random_faults(env, topo, inst, np.random.default_rng(7), 10.0, 2.0, 1.0))
    env.run(until=10_000)
    n = sum(1 for k, _, _ in topo.events if k == "fail")
    assert abs(n - 10_000 / 10) < 5 * 23
    assert abs(inst.down_s / 10_000 - 3 / 10) < 0.03
