"""Fault injection: instances failing and recovering (a schedule, or random with MTBF/MTTR: MTBF = up time +
repair + warm-up on average), KV links
degraded or down.  Each fault is a small SimPy process acting on a built topology.

A failed instance loses its step in flight and its whole KV cache: running requests are re-routed
and recompute their tokens (a decode instance's requests are prefilled again, prompt and generated
tokens), queued requests move to live instances (or wait in the topology's backlog while none is
up).  After ``down_s`` plus ``warmup_s`` (weight loading) it serves again with an empty cache.

With an autoscaler (README, "Faults and autoscaling"): a fault on an ``off`` instance does nothing; on
a ``provisioning`` one it restarts provisioning and loading after the repair
(``Autoscaler.restart_provisioning``); on a ``draining`` one its requests are re-routed as above and,
holding nothing any more, it leaves at once; a failed instance that the autoscaler retires meanwhile
is not brought back by the end of its outage.
"""
from __future__ import annotations

import zlib

import numpy as np


def _instance_fault(env, topo, inst, at_s: float, down_s: float, warmup_s: float):
    if at_s > env.now:
        yield env.timeout(at_s - env.now)
    until = env.now + down_s + warmup_s
    if inst.state == "off":       # not paid, holds nothing: nothing to break
        topo.fault_log.append({"instance": inst.name, "at_s": env.now, "skipped": "off (autoscaler)"})
        return
    if inst.state == "provisioning":    # what it loaded is lost: provisioning starts again after repair
        serves = topo.autoscaler.restart_provisioning(inst, down_s, warmup_s)
        topo.fault_log.append({"instance": inst.name, "at_s": env.now, "until_s": serves,
                               "provisioning": "restarted after the repair"})
        return
    if inst.failed:               # already down: a longer overlapping fault extends the outage
        topo.fault_log.append({"instance": inst.name, "at_s": env.now, "until_s": max(until, inst.down_until),
                               "overlaps": "already down: outage extended to the later end"})
        inst.down_until = max(inst.down_until, until)
        return
    inst.down_until, inst.down_since = until, env.now
    inst.outages += 1
    outage = inst.outages
    topo.fail_instance(inst, until)          # (a draining instance leaves at once: outages moves on)
    while inst.outages == outage and env.now < inst.down_until:
        yield env.timeout(inst.down_until - env.now)
    if inst.outages != outage:    # the autoscaler retired it meanwhile: it stays off
        return
    inst.down_s += env.now - inst.down_since
    topo.recover_instance(inst)


def _random_faults(env, topo, inst, rng, mtbf_s: float, mttr_s: float, warmup_s: float):
    """Failures ``mtbf_s`` apart on average, from one failure to the next (the mean time BETWEEN failures):
    each cycle is an up time, exponential with mean ``mtbf_s - mttr_s - warmup_s`` (the MTTF) drawn at the
    recovery, then a repair, exponential with mean ``mttr_s``, then the warm-up (config: mtbf_s > mttr_s +
    warmup_s)."""
    mttf_s = mtbf_s - mttr_s - warmup_s
    while True:
        yield env.timeout(rng.exponential(mttf_s))
        repair = rng.exponential(mttr_s)
        yield from _instance_fault(env, topo, inst, env.now, repair, warmup_s)
        while inst.failed:        # a scheduled fault kept it down longer: the next failure follows recovery
            yield env.timeout(max(inst.down_until - env.now, 1e-9))


def link_factor(topo, now: float) -> float:
    """The links' bandwidth fraction at ``now``: the smallest fraction of the link faults whose window
    [start, end) holds ``now`` (1.0 when none does).  Overlapping and back-to-back faults compose by the
    minimum (the worst fault active sets the speed), and since this reads the windows, not the order in
    which faults started and ended, a fault ending at the instant another begins hands over directly."""
    # [start, end, fraction, started, ended]: a fault's own start and end count whatever the float rounding
    return min((w[2] for w in getattr(topo, "link_windows", ())
                if (w[3] or w[0] <= now) and not (w[4] or w[1] <= now)), default=1.0)


def _link_window(env, topo, at_s: float, duration_s: float, fraction: float) -> list:
    """Register a link fault's window [start, end) with the topology (``link_windows``) and return it."""
    start = at_s if at_s > env.now else env.now
    window = [start, start + duration_s, fraction, False, False]
    if getattr(topo, "link_windows", None) is None:
        topo.link_windows = []
    topo.link_windows.append(window)
    return window


def _link_fault(env, topo, at_s: float, duration_s: float, fraction: float, window=None):
    """One link fault: at its start and its end every link takes :func:`link_factor` (``window``: its
    span, registered up front by :func:`schedule_faults`, so that every fault's window is known at any
    instant; a fault run on its own registers itself)."""
    if window is None:
        window = _link_window(env, topo, at_s, duration_s, fraction)
    if at_s > env.now:
        yield env.timeout(at_s - env.now)
    topo.fault_log.append({"link": "all", "at_s": env.now, "until_s": env.now + duration_s,
                           "bandwidth_fraction": fraction})
    window[3] = True
    for link in topo.links:
        link.degrade(env, link_factor(topo, env.now))
    yield env.timeout(duration_s)
    window[4] = True
    for link in topo.links:
        link.degrade(env, link_factor(topo, env.now))


def schedule_faults(env, sc, name: str, topo) -> None:
    f = sc.faults
    by_name = {i.name: i for i in topo.instances}
    for spec in f.instances:
        if spec.topology not in (None, name) or spec.instance not in by_name:
            continue       # validated: it exists in some topology of the scenario
        env.process(_instance_fault(env, topo, by_name[spec.instance], spec.at_s, spec.down_s, spec.warmup_s))
    if f.random is not None:
        r = f.random
        for idx, inst in enumerate(topo.instances):
            if r.pools is None or inst.pool in r.pools:
                rng = np.random.default_rng([sc.seed, zlib.crc32(name.encode()), idx])
                env.process(_random_faults(env, topo, inst, rng, r.mtbf_s, r.mttr_s, r.warmup_s))
    if topo.links:
        mine = [spec for spec in f.links if spec.topology in (None, name)]
        windows = [_link_window(env, topo, s.at_s, s.duration_s, s.bandwidth_fraction) for s in mine]
        for spec, window in zip(mine, windows):
            env.process(_link_fault(env, topo, spec.at_s, spec.duration_s, spec.bandwidth_fraction, window))


def fault_windows(topo) -> list[tuple[float, float]]:
    """[start, end) of every fault that happened in this topology's run."""
    return [(e["at_s"], e["until_s"]) for e in topo.fault_log if "until_s" in e]
