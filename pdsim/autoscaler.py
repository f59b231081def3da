"""Pools that grow and shrink during a run: the autoscaler in the loop (``autoscaler:`` per topology).

Each pool (``replicas``; ``prefill`` and ``decode``) is built with ``max`` instances, of which the
topology's own count start serving and the rest are ``off``.  An instance's life:

- **scale-out**: ``off -> provisioning`` at the decision; it is paid from then on (GPU-hours, idle
  power) and serves exactly ``provisioning_s + load time`` later, load time = the weights one GPU
  holds (a speculative pool's draft model or MTP layer included) / ``load_GBps`` (every GPU of a TP
  group loads its shard in parallel), or ``load_s``.
  A scale-out first takes back a draining instance (still loaded: it serves at once).
- **scale-in**: ``serving -> draining``: routers skip it (``down``, see ``Instance.set_down``), P->D
  assignment stops reserving on it, and hand-offs waiting for its blocks pick another instance.  It
  finishes its queue and batch (a prefill instance hands every prompt's KV off), then leaves
  (``off``: no longer paid, its KV cache cleared).  A scale-in first cancels provisioning instances.
  The least loaded serving instance drains first.  No request is lost or moved.

Faults (pdsim/faults.py) on an autoscaled pool: a failed instance stays ``serving`` with ``failed`` set:
paid, but not capacity (``active``, the threshold signal and the timeline's serving count leave it out),
so a policy may order a replacement; any action on the pool (``set_target``) gives its failed instances
back (``_retire``: off, not paid, the end of their outage does not bring them back).  A fault on a
provisioning instance restarts its provisioning after the repair (``restart_provisioning``); on a draining
one its requests are re-routed and it leaves at once; on an off one it does nothing.  Not with ``mix``.

Policies (plain functions of the pool state, chosen by name):

- ``threshold``: every ``interval_s``, a pool's signal per serving instance (``queue``: requests
  queued on it, plus for prefill/replicas the topology's backlog and for decode the hand-offs waiting
  for decode blocks; ``outstanding_tokens``: tokens still to compute; ``utilization``: busy fraction
  over the last interval) above ``scale_out_above`` adds ``step`` instances, below ``scale_in_below``
  drains ``step``; at most one action per ``cooldown_s`` per pool.  For ``threshold`` and ``slo`` a
  scale-in goes only down to the largest count asked for over the last ``scale_in_window_s``
  (Kubernetes HPA's scale-down stabilization), so a dip between two looks does not drain (or cancel
  the provisioning of) what the next look would add back.
- ``schedule``: the pool sizes of ``{at_s, ...}`` entries, applied at those times (no cooldown).
- ``mix`` (role switching, disaggregated pools on the same device and TP): the total stays the initial
  P + D; every ``interval_s`` the split follows the observed token mix: prefill gets
  round(total x n_p / (n_p + n_d)) instances, n_p and n_d the instance-seconds one request needs in each
  role (1 / the capacities below, at the window's mean prompt and output).  One switch at a time, at
  most one per ``cooldown_s``: the least loaded serving instance of the pool that gives drains (a
  prefill instance hands all its KV off, a decode one finishes its batch; its KV cache is empty when it
  goes), then the same GPUs serve in the other role ``switch_s`` later (engine restart, weights kept),
  under the other pool's next free instance name, paid without a break.
- ``slo`` (after NVIDIA Dynamo's SLA planner): every ``interval_s`` forecast the arrival rate from
  the arrivals of the last ``window_s`` (mean, or a least-squares trend extrapolated ``lead_s``
  ahead, by default provisioning + load time: the capacity ordered now arrives then; never below the
  mean, so a trend anticipates growth but does not cut capacity ahead of a fall), and size each
  pool as forecast / (capacity per instance x ``target_utilization``).  Capacity per instance is a
  cost-model estimate at the workload's observed means (prompt length of recent arrivals, output
  length of recent completions, as the planner reads ISL/OSL from its metrics; nothing here reads a
  request's output length before it finished): a prefill instance serves 1 / prefill_time(prompt)
  requests/s (a pool that caches prefixes: the prompt's uncached share, by the share of prompt tokens its
  recent prefills found cached, never-preempted requests only, computed over the whole context; a host-tier
  hit's copy time left out); a decode instance runs the largest batch B (<= max_running, within KV
  capacity) whose step time at the mean context stays within the TPOT bound, so B / (output x step
  time(B)) requests/s; a colocated replica 1 / (prefill_time + output x step time(B) / B).  A speculative
  pool's step is a verify step of k + 1 tokens per request plus its k draft steps (Speculator.step_time) and
  emits m = sum_j E[a^j] tokens per request on average ((1 - a^(k+1)) / (1 - a) at a constant acceptance a;
  a per-request distribution: the mean over requests), so the bound is step time(B) / m <= TPOT and a request
  takes output / m steps (an estimate: the last steps of a request draft fewer, left out).  Dynamo profiles these on the
  real engine before deployment; here the cost model is that profile.  Cooldown applies.
  ``slo.prefill_capacity: measured`` replaces the prefill estimate by what the pool measured over the
  window: prompts handed off per busy second of its instances (it sees the batching the estimate of
  one prompt per step ignores; the estimate is used until a window holds a busy second).  Decode has
  no such measure here (a continuous-batching decode instance is busy whenever it holds a request).
"""
from __future__ import annotations

import math
from collections import deque

import numpy as np

SERVING, PROVISIONING, DRAINING, OFF = "serving", "provisioning", "draining", "off"


class PoolScaler:
    """One pool's instances, bounds and paid-time record."""

    def __init__(self, name: str, pool, bounds, initial: int, load_s: float):
        self.name, self.pool, self.bounds, self.load_s = name, pool, bounds, load_s
        self.initial = initial
        self.last_action_s = -math.inf
        self.scale_outs = self.scale_ins = 0
        self.timeline: list[tuple[float, int, int]] = []     # (t_s, alive, serving) after each change
        # utilization: each instance's busy_s at the previous look (0 at t=0, so the first look sees [0, interval])
        self.busy_seen: dict[str, float] = {i.name: 0.0 for i in pool.instances}
        self.asked: deque = deque()                            # (t_s, count the policy asked for)
        self.gen: dict[str, int] = {}                          # provisioning generation (a cancel voids it)
        self.failed_retired = 0                                # failed instances given back (faults)

    def of(self, state: str) -> list:
        return [i for i in self.pool.instances if i.state == state]

    def healthy(self) -> list:
        """Serving instances that are not failed: the pool's serving capacity."""
        return [i for i in self.pool.instances if i.state == SERVING and not i.failed]

    def failed(self) -> list:
        """Failed instances (a fault): paid, serving nothing until they recover."""
        return [i for i in self.pool.instances if i.state == SERVING and i.failed]

    @property
    def active(self) -> int:
        """Instances serving (not failed) or on their way (the count the policy sets)."""
        return sum(1 for i in self.pool.instances
                   if i.state == PROVISIONING or (i.state == SERVING and not i.failed))

    def record(self, now: float) -> None:
        alive = sum(1 for i in self.pool.instances if i.state != OFF)
        serving = sum(1 for i in self.pool.instances if i.state == SERVING and not i.failed)
        if self.timeline and self.timeline[-1][0] == now:
            self.timeline[-1] = (now, alive, serving)
        else:
            self.timeline.append((now, alive, serving))
        if alive > self.pool.peak_instances:
            self.pool.peak_instances = alive


class Autoscaler:
    def peak_gpus(self, per_gpu=None):
        """The most GPUs alive at once over the whole topology (role switching moves instances between
        pools, so the pools' own peaks can add up to more than ever existed).  Changes at one instant are
        applied together before the sum is taken.  ``per_gpu`` (a function of the pool) weighs each pool's
        GPUs, e.g. by their power (energy.topology_energy's provisioned kW): the peak of the weighted sum."""
        events: dict[float, dict[str, int]] = {}
        for sc in self.scalers.values():
            for t, alive, _ in sc.timeline:
                events.setdefault(t, {})[sc.pool.name] = alive
        now = {sc.pool.name: sc.initial for sc in self.scalers.values()}
        per = {sc.pool.name: sc.pool.spec.gpus_per_instance * (per_gpu(sc.pool) if per_gpu else 1)
               for sc in self.scalers.values()}
        best = sum(now[n] * per[n] for n in now)
        for t in sorted(events):
            now.update(events[t])
            best = max(best, sum(now[n] * per[n] for n in now))
        return best

    def __init__(self, env, topo, spec, sink, tpot_s: float, last_arrival_s: float = 0.0):
        self.env, self.topo, self.spec, self.sink = env, topo, spec, sink
        self.tpot_s, self.last_arrival_s = tpot_s, last_arrival_s
        self.scalers: dict[str, PoolScaler] = {}      # by the autoscaler's key: replicas, prefill, decode
        self.by_pool: dict[str, PoolScaler] = {}      # by the pool's name: replica, prefill, decode
        for pool in topo.pools:
            key = scaler_key(pool.name)
            bounds = getattr(spec, key)
            if spec.load_s is not None:
                load_s = spec.load_s
            else:
                gbps = bounds.load_GBps or spec.load_GBps
                wb = getattr(pool.cost, "weight_bytes_per_gpu", None)
                # every weight one GPU holds: the target's shard and a speculative pool's draft model or MTP
                # layer (under pipeline parallelism the busiest stage's plus the draft, which sits on the last
                # stage: an upper bound when another stage is the busiest)
                load_s = ((wb() + getattr(pool, "draft_weight_bytes_per_gpu", 0.0)) / (gbps * 1e9)
                          if wb is not None and getattr(pool.cost, "device", None) else 0.0)
            sc = PoolScaler(key, pool, bounds, pool.initial_instances, load_s)
            self.scalers[key] = self.by_pool[pool.name] = sc
            for inst in pool.instances[pool.initial_instances:]:
                inst.state = OFF
                inst.set_down()
            sc.record(0.0)
        # slo policy: what the planner observes (arrival time and prompt; completion time and output)
        self.arrived: deque = deque()
        self.completed: deque = deque()
        self.seen_prompt = [0, 0]         # all arrivals so far: (count, tokens)
        self.seen_output = [0, 0]
        # prefix-cache hits as the prefill pool saw them: (t_s, prompt tokens, of them found cached) per request
        # prefilled without a preemption (a preempted request finds its own pages when it comes back, and in PD a
        # decode instance's recompute overwrites the hit); at hand-off in PD, at completion when colocated
        self.hits: deque = deque()
        self.seen_cached = [0, 0]         # all such requests so far: (prompt tokens, of them found cached)
        self.switches: list[dict] = []          # policy mix: role switches (t_s, from, to, KV blocks left)
        if spec.policy in ("slo", "mix"):
            route, finished = topo.route, sink.finished

            def observed_route(req, _route=route):
                self.arrived.append((env.now, req.prompt_tokens))
                self.seen_prompt[0] += 1
                self.seen_prompt[1] += req.prompt_tokens
                return _route(req)

            pd = getattr(topo, "prefill", None) is not None

            def observed_hit(req):
                if req.preemptions == 0:
                    self.hits.append((env.now, req.prompt_tokens, req.cached_tokens))
                    self.seen_cached[0] += req.prompt_tokens
                    self.seen_cached[1] += req.cached_tokens

            def observed_finished(req, _fin=finished):
                if req.status == "finished":
                    self.completed.append((env.now, req.output_tokens))
                    self.seen_output[0] += 1
                    self.seen_output[1] += req.output_tokens
                    if not pd:
                        observed_hit(req)
                return _fin(req)
            topo.route = observed_route
            sink.finished = observed_finished
            if pd:
                prefill_done = topo.prefill_done

                def observed_prefill(req, inst, _done=prefill_done):
                    self.prefilled += 1
                    observed_hit(req)
                    return _done(req, inst)
                topo.prefill_done = observed_prefill
        self.forecasts: list[tuple[float, float]] = []         # (t_s, forecast requests/s), slo policy
        self.prefilled = 0                                     # prompts a prefill pool handed off so far
        self.prefill_seen: deque = deque()                     # (t_s, prompts handed off, pool busy s) per look
        self.capacities: list[tuple[float, str, float, str]] = []   # (t_s, pool, requests/s, estimate|measured)
        if spec.policy == "schedule":
            env.process(self._schedule())
        else:
            env.process(self._loop())

    # --- acting on a pool ---------------------------------------------------------------------
    def set_target(self, sc: PoolScaler, n: int) -> None:
        """Bring the pool's serving + provisioning count to ``n`` (clamped to its bounds)."""
        n = max(sc.bounds.min, min(sc.bounds.max, n))
        now = self.env.now
        changed = False
        while sc.active < n:
            changed = True
            back = sc.of(DRAINING)
            if back:                       # still loaded: cancel its drain, it serves at once
                self._serve(sc, back[-1])
                sc.scale_outs += 1         # a scale-out all the same (as cancelling a provisioning is a scale-in)
                continue
            if not sc.of(OFF):             # every slot taken: a failed instance's slot is freed first
                self._retire(sc, sc.failed()[0])
            inst = sc.of(OFF)[0]
            inst.state = PROVISIONING
            inst.set_down()
            inst.alive_from_s = now
            g = sc.gen[inst.name] = sc.gen.get(inst.name, 0) + 1
            self.env.process(self._provision(sc, inst, g, self.spec.provisioning_s + sc.load_s))
            sc.scale_outs += 1
        while sc.active > n:
            changed = True
            prov = sc.of(PROVISIONING)
            if prov:                       # not serving yet: stop paying for it
                inst = prov[-1]
                sc.gen[inst.name] += 1
                self._leave(sc, inst)
                sc.scale_ins += 1
                continue
            serving = sc.healthy()
            for i in serving:
                i.sync()
            inst = min(reversed(serving), key=lambda i: i.load_tokens())   # ties: the newest
            inst.state, inst.draining = DRAINING, True
            inst.set_down()
            sc.scale_ins += 1
            if inst.role == "decode":
                self.topo.on_decode_freed(inst)     # hand-offs waiting for its blocks choose again
            inst.wake()                              # an idle one leaves now
        for inst in sc.failed():           # any action replaces broken instances: given back, not repaired
            changed = True
            self._retire(sc, inst)
        if changed:
            sc.last_action_s = now
            sc.record(now)

    def _retire(self, sc: PoolScaler, inst) -> None:
        self._leave(sc, inst)
        sc.failed_retired += 1

    def _provision(self, sc: PoolScaler, inst, gen: int, delay_s: float):
        yield self.env.timeout(delay_s)
        if sc.gen.get(inst.name) != gen or inst.state != PROVISIONING:
            return                          # cancelled meanwhile
        self._serve(sc, inst)
        sc.record(self.env.now)

    def _serve(self, sc: PoolScaler, inst) -> None:
        inst.state, inst.draining, inst.switched = SERVING, False, None
        self.topo.recover_instance(inst)    # down = False; the backlog (if any) is dispatched again

    def _leave(self, sc: PoolScaler, inst, switching: bool = False) -> None:
        now = self.env.now
        inst.alive_total_s += now - inst.alive_from_s
        if inst.failed:                     # the broken machine is given back: its outage ends here and
            inst.down_s += now - inst.down_since    # its fault process does not bring it back (outages)
            inst.failed = False
            inst.outages += 1
            self.topo.fault_log.append({"instance": inst.name, "at_s": now, "retired": (
                "failed while draining to switch roles: the same GPUs go on to the other pool" if switching
                else "failed instance left the pool (autoscaler)")})
        inst.state, inst.draining, inst.switched = OFF, False, None
        inst.set_down()
        inst.kv.reset()                     # its memory goes with the machine (a prefix cache too)
        if hasattr(inst.policy, "reset"):
            inst.policy.reset()             # and its engine's counts (DP balance, batch waiting)
        inst.wake()                         # (a failed one's process waits for this to idle again)

    def restart_provisioning(self, inst, down_s: float, warmup_s: float = 0.0) -> float:
        """A fault on a provisioning instance: what it loaded is lost; after the repair (``down_s``) it
        provisions and loads from the start.  A machine switching roles (already held and paid) is repaired
        and warmed up as a serving one would be (``down_s`` + ``warmup_s``, the fault's own load time), not
        before an earlier repair still pending, and never before ``switch_s`` from now.  Returns when it
        will serve."""
        sc = self.by_pool[inst.pool]
        now = self.env.now
        g = sc.gen[inst.name] = sc.gen.get(inst.name, 0) + 1      # voids the pending provisioning
        sw = inst.switched
        if sw is None:
            delay = down_s + self.spec.provisioning_s + sc.load_s
        else:
            pending = max(now, sw.get("failed_until_s", now))      # a repair still under way
            repaired = max(now + down_s + warmup_s, pending)
            delay = max(repaired, now + self.spec.switch_s) - now
            inst.down_s += repaired - pending                        # the outage's new part
            sw["failed_until_s"] = repaired
            sw["serves_at_s"] = now + delay
        self.env.process(self._provision(sc, inst, g, delay))
        return now + delay

    def drained(self, inst) -> None:
        """A draining instance holds nothing any more: it leaves (or, switching roles, joins the other pool)."""
        sc = self.by_pool[inst.pool]
        to = inst.switch_to
        inst.switch_to = None
        blocks = inst.kv.used_blocks
        # a fault while it drained to switch (faults.py): the same broken GPUs go on to the other role,
        # serving once repaired and warmed up, and never before switch_s
        repaired_s = inst.down_until if inst.failed else self.env.now
        self._leave(sc, inst, switching=to is not None)
        sc.record(self.env.now)
        if to is not None:
            # the same GPUs, weights loaded, under the other pool's next free name: paid without a break,
            # serving after switch_s (the engine restarts in the new role with an empty KV cache)
            now = self.env.now
            dst = self.scalers[to]
            new = dst.of(OFF)[0]
            new.state, new.alive_from_s = PROVISIONING, now
            new.set_down()
            g = dst.gen[new.name] = dst.gen.get(new.name, 0) + 1
            serves = max(now + self.spec.switch_s, repaired_s)
            self.env.process(self._provision(dst, new, g, serves - now))
            dst.record(now)
            self.switches.append({"decided_s": inst.switch_decided_s, "t_s": now,
                                  "from": inst.name, "to": new.name,
                                  "kv_blocks_in_use": blocks, "serves_at_s": serves})
            new.switched = self.switches[-1]      # a fault before it serves: restart_provisioning
            if repaired_s > now:
                self.switches[-1]["failed_until_s"] = repaired_s
                new.down_s += repaired_s - now       # the rest of the outage, under its new name
                self.topo.fault_log.append({"instance": new.name, "at_s": now, "serves_at_s": serves,
                                            "switch": f"{inst.name} failed while draining to switch: "
                                                      "serves in the new role after its repair"})

    # --- policies ------------------------------------------------------------------------------
    def _schedule(self):
        for e in self.spec.schedule:
            if e.at_s > self.env.now:
                yield self.env.timeout(e.at_s - self.env.now)
            for name, sc in self.scalers.items():
                n = getattr(e, name)
                if n is not None:
                    self.set_target(sc, n)

    def _loop(self):
        env, spec = self.env, self.spec
        quiet, last = 0, None
        while True:
            yield env.timeout(spec.interval_s)
            for inst in self.topo.instances:
                if inst.state != OFF:
                    inst.sync()
            # a run whose requests have all arrived and that makes no progress is stuck: stop looking,
            # so that the simulation ends and reports it (the ticks would otherwise keep it alive)
            progress = (self.sink.done, sum(i.steps for i in self.topo.instances))
            if env.now >= self.last_arrival_s and progress == last:
                quiet += 1
                if quiet >= 100:
                    return
            else:
                quiet = 0
            last = progress
            if spec.policy == "mix":
                self._mix()
                continue
            targets = self._slo_targets() if spec.policy == "slo" else \
                {name: self._threshold_target(sc) for name, sc in self.scalers.items()}
            for name, n in targets.items():
                sc = self.scalers[name]
                if n is None:
                    n = sc.active
                n = max(sc.bounds.min, min(sc.bounds.max, n))
                sc.asked.append((env.now, n))
                while sc.asked and sc.asked[0][0] < env.now - spec.scale_in_window_s:
                    sc.asked.popleft()
                if n < sc.active:          # scale in only as far as every recent look allows
                    n = max(k for _, k in sc.asked)
                if n == sc.active:
                    continue
                if env.now - sc.last_action_s < spec.cooldown_s:
                    continue
                self.set_target(sc, n)

    def signal(self, sc: PoolScaler) -> float:
        """The threshold policy's signal per serving instance (instances are synced)."""
        serving = sc.healthy()
        k = max(1, len(serving))
        metric = sc.bounds.metric
        if metric == "outstanding_tokens":
            return sum(i.load_tokens() for i in serving) / k
        if metric == "utilization":
            now, dt = self.env.now, self.spec.interval_s
            busy = 0.0
            for i in sc.pool.instances:
                prev = sc.busy_seen.get(i.name, i.busy_s)
                if i.state == SERVING and not i.failed:
                    busy += i.busy_s - prev
                sc.busy_seen[i.name] = i.busy_s
            return busy / (dt * k) if now > 0 else 0.0
        queued = sum(len(i.waiting) for i in serving)
        if sc.pool.role == "decode":
            queued += sum(len(self.topo.pending[i.name]) for i in serving) + len(self.topo.decode_up)
        else:
            queued += len(self.topo.backlog)
        return queued / k

    def _threshold_target(self, sc: PoolScaler) -> int | None:
        x = self.signal(sc)
        b = sc.bounds
        if x > b.scale_out_above:
            return sc.active + b.step
        if x < b.scale_in_below:
            return sc.active - b.step
        return None

    # --- the SLO planner -----------------------------------------------------------------------------
    def forecast_rate(self) -> float:
        """Requests/s expected ``lead_s`` from now, from the arrivals of the last ``window_s``."""
        p = self.spec.slo
        now = self.env.now
        while self.arrived and self.arrived[0][0] <= now - p.window_s:
            self.arrived.popleft()
        w = min(p.window_s, now)
        if w <= 0:
            return 0.0
        times = np.fromiter((t for t, _ in self.arrived), float, len(self.arrived))
        mean = len(times) / w
        if p.forecast == "average" or len(times) < 2 or now < p.window_s:   # a trend needs a whole window
            return mean
        # least squares over 6 sub-windows' rates, extrapolated to now + lead
        bins = 6
        edges = np.linspace(now - w, now, bins + 1)
        counts, _ = np.histogram(times, edges)
        x = (edges[:-1] + edges[1:]) / 2
        y = counts / (w / bins)
        slope, icpt = np.polyfit(x, y, 1)
        lead = p.lead_s if p.lead_s is not None else self.spec.provisioning_s + max(
            s.load_s for s in self.scalers.values())
        return max(mean, float(icpt + slope * (now + lead)))

    def _means(self) -> tuple[float, float, float] | None:
        """(mean prompt, mean output, share of prompt tokens found cached) over the last ``window_s``: prompts of
        the arrivals, outputs of the completions, cache hits of the requests prefilled without a preemption (a pool
        that caches prefixes computes only the rest), each falling back to all seen so far when the window holds
        none."""
        now, w = self.env.now, self.spec.slo.window_s
        while self.completed and self.completed[0][0] <= now - w:
            self.completed.popleft()
        while self.arrived and self.arrived[0][0] <= now - w:
            self.arrived.popleft()
        while self.hits and self.hits[0][0] <= now - w:
            self.hits.popleft()
        if self.arrived:
            prompt = sum(p for _, p in self.arrived) / len(self.arrived)
        elif self.seen_prompt[0]:
            prompt = self.seen_prompt[1] / self.seen_prompt[0]
        else:
            return None
        if self.completed:
            out = sum(c[1] for c in self.completed) / len(self.completed)
        elif self.seen_output[0]:
            out = self.seen_output[1] / self.seen_output[0]
        else:
            return None                  # nothing finished yet: no output length observed
        if self.hits:
            hit = sum(h[2] for h in self.hits) / max(1, sum(h[1] for h in self.hits))
        else:
            hit = self.seen_cached[1] / max(1, self.seen_cached[0])
        return prompt, out, hit

    def _slo_targets(self) -> dict:
        rate = self.forecast_rate()
        self.forecasts.append((self.env.now, rate))
        means = self._means()
        if means is None:
            return {}
        prompt, out, hit = means
        u = self.spec.slo.target_utilization
        targets = {}
        for name, sc in self.scalers.items():
            cap, how = capacity_per_instance(sc.pool, prompt, out, self.tpot_s, hit), "estimate"
            if name == "prefill" and self.spec.slo.prefill_capacity == "measured":
                got = self._measured_prefill_capacity(sc)
                if got is not None:
                    cap, how = got, "measured"
            self.capacities.append((self.env.now, name, cap, how))
            targets[name] = math.ceil(rate / (cap * u) - 1e-9)
        return targets

    def _measured_prefill_capacity(self, sc: PoolScaler) -> float | None:
        """Prompts the prefill pool handed off per busy second over the last ``window_s``: what one
        instance serves when busy all the time, batching as the run's prompts let it (None while the
        window holds less than one busy second)."""
        now, w = self.env.now, self.spec.slo.window_s
        busy = sum(i.busy_s for i in sc.pool.instances)
        self.prefill_seen.append((now, self.prefilled, busy))
        while len(self.prefill_seen) > 1 and self.prefill_seen[1][0] <= now - w:
            self.prefill_seen.popleft()
        t0, n0, b0 = self.prefill_seen[0]
        if busy - b0 < 1.0 or self.prefilled == n0:
            return None
        return (self.prefilled - n0) / (busy - b0)

    # --- role switching (policy mix) -----------------------------------------------------------------
    def mix_split(self) -> int | None:
        """Prefill instances of the fixed total that the observed token mix asks for: the share of an
        instance-second each request needs in prefill (1 / prefill capacity) against decode (1 / decode
        capacity), at the window's mean prompt and output lengths; None before anything finished."""
        means = self._means()
        if means is None:
            return None
        prompt, out, hit = means
        p, d = self.scalers["prefill"], self.scalers["decode"]
        need_p = 1.0 / capacity_per_instance(p.pool, prompt, out, self.tpot_s, hit)
        need_d = 1.0 / capacity_per_instance(d.pool, prompt, out, self.tpot_s, hit)
        total = p.initial + d.initial
        n = int(round(total * need_p / (need_p + need_d)))
        return max(p.bounds.min, total - d.bounds.max, min(p.bounds.max, total - d.bounds.min, n))

    def _mix(self) -> None:
        want = self.mix_split()
        p, d = self.scalers["prefill"], self.scalers["decode"]
        if want is None or any(i.switch_to for i in self.topo.instances) or p.of(PROVISIONING) or d.of(PROVISIONING):
            return                          # one switch at a time
        have = len(p.of(SERVING))           # a failed instance keeps its role: it serves in it once repaired
        if want == have or self.env.now - max(p.last_action_s, d.last_action_s) < self.spec.cooldown_s:
            return
        src, dst = (p, d) if want < have else (d, p)
        serving = src.healthy()             # a broken machine does not switch (faults.py)
        if len(serving) <= max(1, src.bounds.min):
            return
        for i in serving:
            i.sync()
        inst = min(reversed(serving), key=lambda i: i.load_tokens())
        inst.state, inst.draining, inst.switch_to = DRAINING, True, dst.name
        inst.set_down()
        inst.switch_decided_s = self.env.now
        src.last_action_s = dst.last_action_s = self.env.now
        src.scale_ins += 1
        dst.scale_outs += 1
        if inst.role == "decode":
            self.topo.on_decode_freed(inst)
        inst.wake()
        src.record(self.env.now)

    # --- results ------------------------------------------------------------------------------------
    def summary(self, end_s: float) -> dict:
        pools = {}
        for name, sc in self.scalers.items():
            p = sc.pool
            tl = sc.timeline + [(end_s, sc.timeline[-1][1], sc.timeline[-1][2])]
            alive_int = sum((b[0] - a[0]) * a[1] for a, b in zip(tl, tl[1:]))
            pools[name] = {"min": sc.bounds.min, "max": sc.bounds.max, "initial": sc.initial,
                           "peak_instances": p.peak_instances,
                           "mean_instances": alive_int / end_s if end_s > 0 else None,
                           "provisioning_s": self.spec.provisioning_s, "load_s": sc.load_s,
                           "scale_outs": sc.scale_outs, "scale_ins": sc.scale_ins,
                           "timeline": [{"t_s": t, "alive": a, "serving": s} for t, a, s in sc.timeline]}
            if sc.failed_retired:
                pools[name]["failed_retired"] = sc.failed_retired
        out = {"policy": self.spec.policy, "pools": pools}
        if self.switches:
            out["role_switches"] = self.switches
        if self.capacities:
            out["capacity_requests_per_s"] = [{"t_s": t, "pool": p, "per_instance": c, "source": how}
                                              for t, p, c, how in self.capacities]
        if self.forecasts:
            out["forecast_requests_per_s"] = [{"t_s": t, "rate": r} for t, r in self.forecasts]
        return out


def prefill_s(pool, prompt: int, cached_share: float = 0.0) -> float:
    """A lone prefill of ``prompt`` tokens on ``pool``, of which the share ``cached_share`` was found in its
    prefix cache (a pool that caches prefixes): the uncached suffix n = prompt - cached computed over the
    whole context, as ``metrics.prefix_summary`` prices it (step of n tokens, attention work n (cached + n / 2));
    a pool without a cache, or no hit, is ``prefill_time(prompt)``.  At least one token is computed.  A hit in the
    host tier is priced as a GPU hit: its copy into GPU memory (``kvcache.take_load_s``) is left out, so with a
    host tier this is optimistic."""
    cost = pool.cost
    c = int(round(prompt * cached_share)) if pool.spec.prefix_on else 0
    c = min(c, prompt - 1)
    if c <= 0:
        return cost.prefill_time(prompt)
    n = prompt - c
    return cost.step(n, n * (c + n / 2.0), prompt, 1, 1).time_s


def capacity_per_instance(pool, prompt: float, output: float, tpot_s: float, cached_share: float = 0.0) -> float:
    """Requests/s one instance of ``pool`` serves at the workload's mean prompt and output lengths, a share
    ``cached_share`` of the prompt tokens found in a prefix cache (a cost-model estimate; see the module
    docstring)."""
    cost = pool.cost
    p = max(1, int(round(prompt)))
    o = max(1.0, output)
    if pool.role == "prefill":
        return 1.0 / max(prefill_s(pool, p, cached_share), 1e-12)
    ctx = int(round(p + o / 2))
    kv = pool.instances[0].kv
    fit = max(1, kv.requests_fit(kv.blocks_for(int(p + o))))      # (whole requests per rank on a ranked pool)
    hi = max(1, min(pool.spec.max_running, fit))
    spec = getattr(pool, "spec_dec", None)
    if spec is None:                    # a decode step: one token per request
        m, step_of = 1.0, (lambda b: cost.decode_time(b, ctx))
    else:                               # a verify step + its k drafts: m tokens per request on average
        m, step_of = spec.mean_tokens(), (lambda b: spec.step_time(b, ctx))
    lo = 1
    while lo < hi:                      # the largest batch whose time per token stays within the TPOT bound
        mid = (lo + hi + 1) // 2
        if step_of(mid) / m <= tpot_s:
            lo = mid
        else:
            hi = mid - 1
    step = step_of(lo)
    steps = max(1.0, o / m)             # steps a request decodes for (o with one token a step)
    if pool.role == "decode":
        return lo / (steps * step)
    return 1.0 / (prefill_s(pool, p, cached_share) + steps * step / lo)


def scaler_key(pool_name: str) -> str:
    """The autoscaler's key of a pool: ``replicas`` for the colocated ``replica`` pool."""
    return "replicas" if pool_name == "replica" else pool_name
