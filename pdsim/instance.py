"""One serving instance (a replica, or a member of a prefill or decode pool) as a SimPy process.

The loop is plan -> timeout(step cost) -> apply: one event per step, never per
token per request.  With ``fast`` on (the default), a run of pure-decode steps
over an unchanged batch is one event: the instance opens a *window* of k steps
whose times it knows in advance (contexts grow by one token a step, so the
cost model gives the k step times at once and a cumulative sum their ends),
sleeps to the window's end, and applies the k steps in bulk.  The window ends
at the first step that finishes a request or would run short of KV blocks;
an input that could change the next plan (a new request, an arriving KV
transfer, blocks reserved by a transfer) cuts it after the step in flight, and
any reader of the instance's state calls :meth:`Instance.sync` first.  Results
equal the step-by-step loop's (``fast=False``) to float rounding; see
tests/test_fastpath.py.  ``role`` says what happens when a prompt's prefill ends:
``both`` keeps decoding it here (colocated), ``prefill`` hands it off for a KV
transfer (disaggregated), ``decode`` instances receive transferred requests.
"""
from __future__ import annotations

from bisect import bisect_left
from collections import deque
from itertools import accumulate

import numpy as np

from .costmodel import CostModel, StepCost, busiest_rank, decode_part, ranked_parts, splits_mla_steps, window_sums
from .kvcache import KVCache
from .scheduler import BalancedDP, Limits, assign_rank
import simpy

from .workload import FINISHED, UNFINISHED, Request

HANDOFF = "handoff"   # prefilled, KV held here until it reaches a decode instance


class Series:
    """Per-instance time series in fixed bins: busy seconds, FLOPs, bytes, batch, queue, KV blocks."""
    __slots__ = ("bin_s", "busy_s", "flops", "bytes", "steps", "batch_sum", "queue_max", "kv_max")

    def __init__(self, bin_s: float):
        self.bin_s = bin_s
        self.busy_s, self.flops, self.bytes = [], [], []
        self.steps, self.batch_sum, self.queue_max, self.kv_max = [], [], [], []

    MAX_BINS = 20_000   # a run far longer than its arrivals (a slow CPU pool) coarsens the bins instead
    FEW_STEPS = 64      # record_many over several bins: up to this many steps in Python, more through numpy

    def _fit(self, t_end: float) -> None:
        """Double the bin width (merging pairs) until ``t_end`` falls within MAX_BINS bins."""
        while t_end / self.bin_s >= self.MAX_BINS:
            self.bin_s *= 2
            for name in ("busy_s", "flops", "bytes", "steps", "batch_sum"):
                a = getattr(self, name)
                setattr(self, name, [sum(a[i:i + 2]) for i in range(0, len(a), 2)])
            for name in ("queue_max", "kv_max"):
                a = getattr(self, name)
                setattr(self, name, [max(a[i:i + 2]) for i in range(0, len(a), 2)])

    def _grow(self, i: int) -> None:
        while len(self.busy_s) <= i:
            for a in (self.busy_s, self.flops, self.bytes, self.steps, self.batch_sum, self.queue_max, self.kv_max):
                a.append(0)

    def record(self, t0: float, dur: float, flops: float, bytes_: float, batch: int, queued: int,
               kv_used: int) -> None:
        if t0 + dur >= self.bin_s * self.MAX_BINS:
            self._fit(t0 + dur)
        b = self.bin_s
        i = int(t0 / b)
        self._grow(int((t0 + dur) / b))
        self.steps[i] += 1
        self.batch_sum[i] += batch
        if queued > self.queue_max[i]:
            self.queue_max[i] = queued
        if kv_used > self.kv_max[i]:
            self.kv_max[i] = kv_used
        # spread busy time, FLOPs and bytes over the bins the step covers
        if int((t0 + dur) / b) == i:
            self.busy_s[i] += dur
            self.flops[i] += flops
            self.bytes[i] += bytes_
        else:
            self._spread(t0, dur, flops, bytes_)


    def record_many(self, starts, durs, flops, bytes_, batch: int, queued: int, kv_used_at,
                    sums: tuple | None = None) -> None:
        """``record`` for many steps at once (numpy arrays, or for ``starts`` a list; starts ascending).

        ``kv_used_at(positions)`` gives the blocks in use during those steps (positions: an array, or one
        int for the last step when every step falls in one bin); it must be non-decreasing over the steps
        (a decode window only grows), so a bin's maximum is its last step's value and only those are asked for.
        """
        n = len(starts)
        end = starts[-1] + float(durs[-1])  # the last step's end (the whole ends array only when bins differ)
        if end >= self.bin_s * self.MAX_BINS:
            self._fit(float(end))
        b = self.bin_s
        lo, hi = int(starts[0] / b), int(end / b)
        self._grow(hi)
        if lo == hi:                        # the usual case: the whole window in one bin
            self.steps[lo] += n
            self.batch_sum[lo] += batch * n
            if queued > self.queue_max[lo]:
                self.queue_max[lo] = queued
            k = int(kv_used_at(n - 1))
            if k > self.kv_max[lo]:
                self.kv_max[lo] = k
            if sums is None:
                sums = (float(durs.sum()), float(flops.sum()), float(bytes_.sum()))
            self.busy_s[lo] += sums[0]
            self.flops[lo] += sums[1]
            self.bytes[lo] += sums[2]
            return
        if n <= self.FEW_STEPS:
            self._record_few(starts, durs, flops, bytes_, batch, queued, kv_used_at)
            return
        starts = np.asarray(starts)
        ends = starts + durs
        i0 = (starts / b).astype(np.int64)
        i1 = (ends / b).astype(np.int64)
        counts = np.bincount(i0 - lo)
        last = np.cumsum(counts) - 1                      # last step of each bin (where counts > 0)
        has = np.nonzero(counts)[0]
        if len(has) <= 8:      # a few bins (the usual window): each one's last step asked for alone, as an int
            kv = [int(kv_used_at(p)) for p in last[has].tolist()]
        else:
            kv = kv_used_at(last[has]).tolist()
        self._count_bins([lo + j for j in has.tolist()], counts[has].tolist(), kv, batch, queued)
        inside = i0 == i1
        idx = i0[inside] - lo
        m = hi - lo + 1
        for arr, v in ((self.busy_s, durs), (self.flops, flops), (self.bytes, bytes_)):
            add = np.bincount(idx, weights=v[inside], minlength=m)
            for j in np.nonzero(add)[0].tolist():
                arr[lo + j] += float(add[j])
        for j in np.nonzero(~inside)[0].tolist():   # a step across a bin edge: spread it exactly
            self._spread(float(starts[j]), float(durs[j]), float(flops[j]), float(bytes_[j]))

    def _count_bins(self, bins, counts, kv, batch: int, queued: int) -> None:
        """Each bin's step count, batch sum, and the most queued and KV blocks in use its steps saw."""
        for i, cnt, k in zip(bins, counts, kv):
            self.steps[i] += cnt
            self.batch_sum[i] += batch * cnt
            if queued > self.queue_max[i]:
                self.queue_max[i] = queued
            if k > self.kv_max[i]:
                self.kv_max[i] = k

    def _record_few(self, starts, durs, flops, bytes_, batch: int, queued: int, kv_used_at) -> None:
        """:meth:`record_many` over several bins for a few steps, in Python (numpy's per-call cost is most of
        the time at this size): the same per-bin counts and last-step KV, each bin's sums of the steps wholly
        inside it added up in step order from 0.0 (what ``bincount`` with weights does) and added where not
        0, then the steps across an edge spread in order."""
        b = self.bin_s
        st = starts.tolist() if isinstance(starts, np.ndarray) else list(starts)
        du, fl, by = durs.tolist(), flops.tolist(), bytes_.tolist()
        bins, counts, lasts, inside, cross = [], [], [], {}, []
        for j, s in enumerate(st):
            i = int(s / b)
            if bins and bins[-1] == i:
                counts[-1] += 1
                lasts[-1] = j
            else:
                bins.append(i)
                counts.append(1)
                lasts.append(j)
            if int((s + du[j]) / b) == i:
                acc = inside.get(i)
                if acc is None:
                    inside[i] = [0.0 + du[j], 0.0 + fl[j], 0.0 + by[j]]
                else:
                    acc[0] += du[j]
                    acc[1] += fl[j]
                    acc[2] += by[j]
            else:
                cross.append(j)
        kv = [int(kv_used_at(p)) for p in lasts] if len(bins) <= 8 else kv_used_at(np.array(lasts)).tolist()
        self._count_bins(bins, counts, kv, batch, queued)
        for q, arr in enumerate((self.busy_s, self.flops, self.bytes)):
            for i, acc in inside.items():
                if acc[q] != 0.0:
                    arr[i] += acc[q]
        for j in cross:        # a step across a bin edge: spread it exactly
            self._spread(st[j], du[j], fl[j], by[j])

    def _spread(self, t0: float, dur: float, flops: float, bytes_: float) -> None:
        b = self.bin_s
        t, end = t0, t0 + dur
        while t < end:
            j = int(t / b)
            seg = min(end, (j + 1) * b) - t
            if seg <= 0:  # float edge exactly on a boundary
                j += 1
                seg = min(end, (j + 1) * b) - t
                self._grow(j)
            frac = seg / dur
            self.busy_s[j] += seg
            self.flops[j] += flops * frac
            self.bytes[j] += bytes_ * frac
            t += seg


class _Window:
    """k pure-decode steps of one batch, planned at once (see the module docstring)."""
    __slots__ = ("plan", "reqs", "c0", "blk1", "k", "t0", "ends", "times", "flops", "bytes", "used",
                 "extra", "applied", "event", "gen", "grown", "need", "active")


def _growth(c0: list, blk1: list, j: int, bs: int) -> int:
    """Blocks a window's batch grows by its step j (1-based): ceil((c0 + j) / bs) beyond what each holds
    after step 1 (Python integers: exact, as numpy's were)."""
    n = 0
    for c, b in zip(c0, blk1):
        g = -(-(c + j) // bs) - b
        if g > 0:
            n += g
    return n


def _sum(a: np.ndarray) -> float:
    """``float(a.sum())`` of a 1-D float64 array, bit for bit: numpy adds fewer than 8 values one by one
    from 0.0 (its pairwise summation starts with blocks of 8), which Python does faster than numpy's call."""
    if len(a) < 8:
        s = 0.0
        for v in a.tolist():
            s += v
        return s
    return float(a.sum())


def _exact_delay(now: float, target: float) -> float:
    """A delay d with ``now + d == target`` in floats (SimPy schedules at now + delay)."""
    d = target - now
    for _ in range(4):
        got = now + d
        if got == target:
            break
        d = np.nextafter(d, np.inf if got < target else -np.inf)
    return max(0.0, float(d))


class Instance:
    spec = None         # a speculative pool's speculative.Speculator (set by the topology; fast path off)
    power = None        # (1 / peak FLOP/s, 1 / peak B/s) per GPU when the device has a power model
    active_s = 0.0      # sum over steps of min(step time, max(FLOPs / peak, bytes / bandwidth)): energy.py
    # autoscaling (pdsim/autoscaler.py): serving | provisioning (paid, loading, routers skip it) |
    # draining (routers skip it; it finishes what it holds, then leaves) | off (not paid)
    state = "serving"
    draining = False
    hold_first_decode = False   # a request's first decode step runs alone (client timeouts behind a PD proxy)
    switch_to = None    # draining to come back in the other pool's role (autoscaler policy mix)
    switched = None     # provisioning in its new role after a switch: the role_switches entry (autoscaler)
    alive_from_s = 0.0  # when the current paid period began (the scale-out decision)
    alive_total_s = 0.0  # paid time of earlier periods

    def __init__(self, env, name: str, pool: str, role: str, cost: CostModel, kv: KVCache, policy,
                 limits: Limits, gpus: int, sink, bin_s: float, fast: bool = True, max_window: int = 4096):
        self.env, self.name, self.pool, self.role = env, name, pool, role
        self.cost, self.kv, self.policy, self.limits = cost, kv, policy, limits
        self.window = limits.window        # sliding window of the model's sliding layers (None: none)
        # DP attention's ranks (1: none): a step with a prompt chunk is priced rank by rank, whole requests each
        ranks = getattr(cost, "attn_dp", 1)
        self.attn_ranks = ranks if isinstance(ranks, int) and ranks > 1 else 1
        # an MLA model's mixed step prices its decodes and its chunks on their own kernels (a roofline cost)
        self.mla = splits_mla_steps(cost)
        # TensorRT-LLM's attention-DP balance (scheduler.BalancedDP): requests keep a rank, steps are priced by it
        self.balanced = isinstance(policy, BalancedDP)
        self.gpus = gpus
        self.sink = sink                   # topology callbacks: first_token, finished, prefill_done
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []
        self.outstanding_tokens = 0        # tokens still to compute here (router's load signal)
        self.decode_work = 0               # output tokens still to produce here (P->D policy signal)
        self.busy_s = self.flops = self.bytes = 0.0
        self.steps = 0
        self.series = Series(bin_s)
        self.fast, self.max_window = fast and role != "prefill", max_window
        self._win: _Window | None = None
        self.windows = 0                   # fast-path windows opened (for the benchmark)
        # routers read ``down`` only; it is derived (set_down) from two sources: a fault (``failed``:
        # down until repaired and warmed up) and the autoscaler (``state`` not serving)
        self.down = False                  # unroutable: failed, or provisioning / draining / off
        self.failed = False                # a fault: lost its GPU, serves nothing until it recovers
        self.outages = 0                   # outages begun (a fault process ends only its own)
        self.epoch = 0                     # failures so far: KV held from an earlier epoch is gone
        self.down_s = 0.0                  # total time down (failure + warm-up), outages that ended
        self.down_since = self.down_until = 0.0
        self._fresh: list[Request] = []    # accepted (decode) requests not yet in a step
        self._wake = env.event()
        self.proc = env.process(self.run())

    # --- inputs ---------------------------------------------------------------
    def wake(self) -> None:
        if not self._wake.triggered:
            self._wake.succeed()

    def submit(self, req: Request) -> None:
        """A new request (or one re-routed) joins the queue."""
        if self._win is not None:
            # Behind a queue whose head did not fit when the window opened (or a full batch), it cannot be
            # admitted before the window ends: free blocks only shrink and the batch stays until then.  So
            # the window runs on; only the steps already ended are settled (they saw the shorter queue).
            if (self.waiting or len(self.running) >= self.limits.max_running) and not self.kv.prefix_on:
                self.sync()
            else:
                self.cut()
        req.instance = self.name
        if self.balanced:      # (on a decode instance, KV on the wire counts too: topology._reserve places it so)
            req.rank = assign_rank(req, self.running + self.inbound + list(self.awaiting.values()), self.waiting,
                                   self.policy.ranks)
        self.waiting.append(req)
        self.outstanding_tokens += (req.known - req.computed) if self.role == "prefill" else req.remaining
        self.decode_work += req.output_tokens - req.generated
        self.wake()

    def accept(self, req: Request) -> None:
        """A request whose KV has arrived (blocks already reserved) starts decoding here."""
        if self._win is not None:
            self.cut()
        req.decode_instance = self.name     # (a DP-balanced pool gave it a rank as it reserved its blocks)
        req.decode_step_s = float("nan")
        self._fresh.append(req)             # its first decode step here: the first step planned with it
        if self.kv.prefix_on:
            self.kv.commit(req)        # the transferred prompt blocks are shareable here from now on
        self.running.append(req)
        self.outstanding_tokens += req.remaining
        self.decode_work += req.output_tokens - req.generated
        self.wake()

    # --- the process ------------------------------------------------------------
    def run(self):
        while True:
            try:
                yield from self._serve()
            except simpy.Interrupt:      # failed (see fail): the step in flight is lost
                pass
            while self.failed:
                self._wake = self.env.event()
                try:
                    yield self._wake
                except simpy.Interrupt:
                    pass

    def _serve(self):
        env = self.env
        while True:
            if not (self.running or self.waiting):
                if self.draining and self.kv.used_blocks == 0 and not self.reserved_count:
                    self.sink.drained(self)          # nothing left here (KV handed off): it leaves
                self._wake = env.event()
                yield self._wake
                continue
            limits = self.limits if self.spec is None else self.spec.reserve(self.running, self.limits, self.policy)
            plan = self.policy(self.running, self.waiting, self.kv, limits)
            # preempted KV must be computed again; a cached prefix need not be
            self.outstanding_tokens += plan.lost_tokens - plan.cached_tokens
            if not plan.items:
                # nothing fits: wait for blocks to be freed (a transfer ends) or new work
                self._wake = env.event()
                yield self._wake
                continue
            if self._fresh:                 # requests whose KV arrived: their first decode step here starts now
                self._mark_fresh(plan)
            # (a host-tier prefix load pending for this step is paid by the step-by-step path: no window)
            if self.fast and plan.sampled == len(plan.items) == plan.tokens == len(self.running) \
                    and not plan.preempted and not self.kv.load_s:
                w = self._open(plan)
                if w is not None:
                    yield from self._run_window(w)
                    continue
            if self.spec is not None:       # speculative decoding: verify steps (pdsim/speculative.py)
                c, drafts = self.spec.plan_step(plan, self.kv)
            elif self.window is None:
                rank = None if self.attn_ranks == 1 else ranked_parts(plan.items, self.attn_ranks, True) if \
                    self.balanced else busiest_rank(plan.items, self.attn_ranks)
                if rank is not None:       # DP attention with a prompt chunk in the step: whole requests per rank
                    c = self.cost.step(plan.tokens, plan.attn_work, plan.kv_read_tokens, plan.sampled,
                                       len(plan.items), rank=rank)
                elif self.mla and plan.tokens > len(plan.items):   # MLA, a chunk in the step: two kernels
                    c = self.cost.step(plan.tokens, plan.attn_work, plan.kv_read_tokens, plan.sampled,
                                       len(plan.items), decodes=decode_part(plan.items))
                else:
                    c = self.cost.step(plan.tokens, plan.attn_work, plan.kv_read_tokens, plan.sampled,
                                       len(plan.items))
            else:
                c = self.cost.step(plan.tokens, plan.attn_work, plan.kv_read_tokens, plan.sampled, len(plan.items),
                                   swa=plan.swa)
            if self.kv.load_s:   # prefix blocks from the host tier are copied in before the step runs
                c = StepCost(c.time_s + self.kv.take_load_s(), c.flops, c.bytes)
            t0 = env.now
            yield env.timeout(c.time_s)
            self.busy_s += c.time_s
            self.flops += c.flops
            self.bytes += c.bytes
            if self.power is not None:
                self.active_s += min(c.time_s, max(c.flops * self.power[0], c.bytes * self.power[1]))
            self.steps += 1
            self.series.record(t0, c.time_s, c.flops, c.bytes, len(plan.items), len(self.waiting),
                               self.kv.used_blocks)
            if self.spec is not None:
                self.spec.apply(self, plan, drafts, t0)
            else:
                self._apply(plan, t0)

    # --- failure -------------------------------------------------------------------------
    def _mark_fresh(self, plan) -> None:
        """The requests whose KV arrived here that this step carries: their first decode step starts now.  One
        preempted before it (it waits here to be computed again) keeps waiting for its first step; one gone
        (dropped, or lost with the instance) is forgotten."""
        in_step = {id(r) for r, _ in plan.items}
        keep = []
        for r in self._fresh:
            if id(r) in in_step:
                r.decode_step_s = self.env.now
            elif r in self.running or r in self.waiting:
                keep.append(r)
        self._fresh = keep

    def fail(self) -> list[Request]:
        """Lose the GPU: the step in flight and every KV block.  Returns the requests to re-route
        (running ones must recompute their tokens; queued ones just move)."""
        if self._win is not None:
            self.sync()              # steps that ended before the failure happened
            self._win = None
        self._fresh.clear()
        self.failed = True
        self.set_down()
        self.epoch += 1
        if hasattr(self.policy, "reset"):
            self.policy.reset()      # the engine restarts with its counts (DP balance, batch waiting) at 0
        lost = []
        for r in self.running:
            if r.status == UNFINISHED:
                r.recomputed_tokens += r.computed
                r.fault_recomputed_tokens += r.computed
                r.computed = 0
                r.blocks = 0
                r.fault_hits += 1
                lost.append(r)
        for r in self.waiting:
            r.fault_hits += 1
            lost.append(r)
        self.running, self.waiting = [], deque()
        self.outstanding_tokens = self.decode_work = 0
        self.kv.reset()
        if self.env.active_process is not self.proc:
            self.proc.interrupt("failure")
        return lost

    def recover(self) -> None:
        self.failed = False
        self.set_down()
        self.wake()

    def set_down(self) -> None:
        """The one place ``down`` (what routers read) is derived: failed, or not serving for the autoscaler."""
        self.down = self.failed or self.state != "serving"

    def alive_s(self, end_s: float) -> float:
        """Paid seconds up to ``end_s``: provisioning, loading, serving and draining (GPU-hours, idle energy)."""
        if self.state == "off":
            return self.alive_total_s
        return self.alive_total_s + max(0.0, end_s - self.alive_from_s)

    def drop(self, req: Request) -> bool:
        """Take out a request that the client abandoned (before its first token); True if it was here."""
        if self._win is not None:
            self.cut()            # a new head of the queue may fit: the window's plan may change
        if req in self.waiting:
            self.waiting.remove(req)
            if self.draining:
                self.wake()            # that may have been the last thing a draining instance held
        elif req in self.running:
            self.running.remove(req)
            self.kv.release(req)
            self.wake()                # blocks freed: something waiting may fit now
        else:
            return False
        self.outstanding_tokens -= (req.known - req.computed) if self.role == "prefill" else req.remaining
        self.decode_work -= req.output_tokens - req.generated
        return True

    def _apply(self, plan, t0: float) -> None:
        now = self.env.now
        leaving = False
        kv = self.kv
        prefix = kv.prefix_on
        role = self.role
        decode_role = role == "decode"
        sink = self.sink
        # the load counters are summed locally and brought up to date before every callback (a callback may
        # route a new request, which reads them) and at the end
        out_d = dec_d = 0
        for req, n in plan.items:
            if req.status != UNFINISHED:   # abandoned by its client while the step ran
                continue
            if req.prefill_start_s != req.prefill_start_s:  # NaN: first compute of this request
                req.prefill_start_s = t0
            c = req.computed + n
            req.computed = c
            out_d += n
            if prefix:
                kv.commit(req)             # prompt blocks this step completed become shareable
            if c != req.prompt_tokens + req.generated:     # req.known: a prompt chunk, no token yet
                continue
            g = req.generated + 1
            req.generated = g
            dec_d += 1
            ts = req.token_s
            if ts is not None:
                ts.append(now)
            if decode_role and req.decode_first_s != req.decode_first_s:
                req.decode_first_s = now
            if g == 1:
                req.first_token_s = req.prefill_end_s = now
                self.outstanding_tokens -= out_d
                self.decode_work -= dec_d
                out_d = dec_d = 0
                sink.first_token(req)
            if g >= req.output_tokens:
                req.status = FINISHED
                req.finish_s = now
                kv.release(req)
                leaving = True
                self.outstanding_tokens -= out_d
                self.decode_work -= dec_d
                out_d = dec_d = 0
                sink.finished(req, self)
            elif role == "prefill":
                # prefill done: the request leaves the batch but keeps its KV until the transfer ends
                req.status = HANDOFF
                self.outstanding_tokens -= out_d
                self.decode_work -= dec_d + (req.output_tokens - g)
                out_d = dec_d = 0
                leaving = True
                sink.prefill_done(req, self)
        if out_d or dec_d:
            self.outstanding_tokens -= out_d
            self.decode_work -= dec_d
        if leaving:
            self.running = [r for r in self.running if r.status == UNFINISHED]

    # --- the multi-step fast path ----------------------------------------------------
    def _open(self, plan) -> _Window | None:
        """A window over this pure-decode plan and the steps after it, or None if only one step is sure.

        The plan came from the policy with nothing admitted (waiting is empty, or its head
        does not fit: it will not fit later either, as free blocks only shrink and the batch
        stays), nothing preempted, and one token for every running request.
        """
        reqs = [r for r, _ in plan.items]
        k = self.max_window
        for r in reqs:
            if r.generated < 1:      # a one-token prompt's prefill: its first token is an event
                return None
            if self.hold_first_decode and r.decode_first_s != r.decode_first_s:
                return None          # its first decode token may be abandoned for (Disaggregated.client_view)
            left = r.output_tokens - r.generated
            if left < k:
                k = left   # the step that finishes the first request ends it
        if k < 2:
            return None
        bs = self.kv.block_size
        # integers, so Python's sums are numpy's; a batch is a few to a few hundred requests, where numpy's
        # per-call cost outweighs its loops (issue 19)
        c0 = [r.computed for r in reqs]
        blk1 = [r.blocks for r in reqs]
        free1 = self.kv.free_blocks
        if self.kv.prefix_on and self.waiting:
            # The queue's head did not fit, but evicting a cached page can make it fit under a token
            # budget: a shorter cached prefix revives fewer evictable blocks while the chunk it computes
            # stays budget-sized.  So the window ends before the first growth that evicts (cached
            # blocks beyond the free ones); the next plan does that growth and retries the head.
            free1 -= self.kv.lru_blocks
        # blocks the batch needs by step j (1-based): ceil((c0 + j) / bs) beyond what it holds after step 1
        need_k = _growth(c0, blk1, k, bs)
        if need_k > free1:
            lo, hi = 1, k            # largest j with need(j) <= free1; need(1) == 0
            while lo < hi:
                mid = (lo + hi + 1) // 2
                if _growth(c0, blk1, mid, bs) <= free1:
                    lo = mid
                else:
                    hi = mid - 1
            k = lo
            if k < 2:
                return None
            need_k = _growth(c0, blk1, k, bs)
        B = len(reqs)
        if self.window is None:
            times, flops, bytes_ = self.cost.decode_steps(B, plan.attn_work, plan.kv_read_tokens, k)
        else:
            # sliding layers: step j's positions sum_i min(c0_i + 1 + j, W) (integers), the very sums the
            # step-by-step plans add up (SlidingStepPlan), so the k step costs are the loop's bit for bit
            pos = window_sums(np.array(c0, np.int64), k, self.window)
            times, flops, bytes_ = self.cost.decode_steps(B, plan.attn_work, plan.kv_read_tokens, k,
                                                          swa=(pos - 0.5 * B, pos))
        w = _Window()
        w.plan, w.reqs, w.c0, w.blk1, w.k, w.extra = plan, reqs, c0, blk1, k, 0
        w.t0 = self.env.now
        # sequential sums: the step-by-step loop's env.now values (as numpy's cumsum adds them), kept as a list:
        # it is bisected and indexed one float at a time (routers read the window's progress on every arrival)
        w.ends = list(accumulate(times.tolist(), initial=w.t0))
        w.times, w.flops, w.bytes = times, flops, bytes_
        if self.power is not None:     # each step's active seconds (energy.py), settled in slices like the rest
            w.active = np.minimum(times, np.maximum(flops * self.power[0], bytes_ * self.power[1]))
        w.applied = 0
        w.gen = 0
        w.grown = 1                      # step 1's blocks were grown by the policy
        w.need = need_k                  # blocks the window grows by its last step
        self.windows += 1
        return w

    def _run_window(self, w: _Window):
        env = self.env
        self._win = w
        w.event = env.event()
        self._arm(w)
        yield w.event
        # at the end of step k: bulk-apply steps 1..k-1, then step k as the loop would
        self._settle(w, w.k - 1)
        self._win = None
        j = w.k - 1
        t0, dur = w.ends[j], float(w.times[j])
        fj, bj = float(w.flops[j]), float(w.bytes[j])
        self.busy_s += dur
        self.flops += fj
        self.bytes += bj
        if self.power is not None:
            self.active_s += min(dur, max(fj * self.power[0], bj * self.power[1]))
        self.steps += 1
        self.series.record(t0, dur, fj, bj, len(w.reqs), len(self.waiting), self.kv.used_blocks)
        self._apply(w.plan, t0)

    def _arm(self, w: _Window) -> None:
        """Wake the process at the end of step w.k (a stale timer from before a cut is ignored)."""
        w.gen += 1
        gen = w.gen
        timer = self.env.timeout(_exact_delay(self.env.now, w.ends[w.k]))
        timer.callbacks.append(lambda _ev: gen == w.gen and not w.event.triggered and w.event.succeed())

    def _settle(self, w: _Window, j: int) -> None:
        """Apply steps up to j (of the window) and the block growth of step j + 1, in bulk."""
        d = j - w.applied
        bs = self.kv.block_size
        if d > 0:
            a = w.applied
            times = None
            decode = self.role == "decode"
            for r in w.reqs:
                r.computed += d
                r.generated += d
                if r.token_s is not None:       # client.itl: the ends of the steps applied here
                    if times is None:
                        times = w.ends[a + 1:j + 1]
                    r.token_s.extend(times)
                if decode and r.decode_first_s != r.decode_first_s:
                    r.decode_first_s = w.ends[a + 1]
            B = len(w.reqs)
            self.outstanding_tokens -= B * d
            self.decode_work -= B * d
            durs, fl, by = w.times[a:j], w.flops[a:j], w.bytes[a:j]
            sums = (_sum(durs), _sum(fl), _sum(by))
            self.busy_s += sums[0]
            self.flops += sums[1]
            self.bytes += sums[2]
            if self.power is not None:
                self.active_s += _sum(w.active[a:j])
            self.steps += d
            base = self.kv.used_blocks - w.extra
            c0, blk1 = w.c0, w.blk1

            def used_at(pos):   # KV in use during step a + 1 + pos: after that step's growth
                if not isinstance(pos, np.ndarray):
                    return base + _growth(c0, blk1, a + 1 + pos, bs)
                if len(pos) == 1:
                    return np.array([base + _growth(c0, blk1, a + 1 + int(pos[0]), bs)])
                steps = (a + 1 + pos)[None, :]
                c0a, blk1a = np.array(c0, np.int64), np.array(blk1, np.int64)
                return base + np.maximum(0, -(-(c0a[:, None] + steps) // bs) - blk1a[:, None]).sum(axis=0)

            self.series.record_many(w.ends[a:j], durs, fl, by, B, len(self.waiting), used_at, sums)
            w.applied = j
        elif w.grown == j + 1:
            return
        # the step in flight (j + 1) has grown its blocks
        w.grown = j + 1
        g = j + 1
        # each request's growth only increases with the step, so an unchanged total means unchanged blocks
        extra = _growth(w.c0, w.blk1, g, bs)
        if extra != w.extra:
            for r, c, b in zip(w.reqs, w.c0, w.blk1):
                t = -(-(c + g) // bs)
                r.blocks = b if b >= t else t
            self.kv.free_blocks -= extra - w.extra
            w.extra = extra
            if self.kv.prefix_on:
                self.kv.trim()         # cached prefixes give way to the growth, as each step's would
            used = self.kv.total_blocks - self.kv.free_blocks
            if used > self.kv.peak_used:
                self.kv.peak_used = used

    def _done_unapplied(self) -> int:
        """Steps of the open window that have ended before now but are not applied yet."""
        w = self._win
        return max(0, min(bisect_left(w.ends, self.env.now) - 1, w.k - 1) - w.applied)

    def load_tokens(self) -> int:
        """``outstanding_tokens`` as of now, without settling the window (the router's signal)."""
        if self._win is None:
            return self.outstanding_tokens
        return self.outstanding_tokens - len(self._win.reqs) * self._done_unapplied()

    def load_decode(self) -> int:
        """``decode_work`` as of now, without settling the window."""
        if self._win is None:
            return self.decode_work
        return self.decode_work - len(self._win.reqs) * self._done_unapplied()

    def sync(self) -> None:
        """Bring counters, requests and KV up to ``env.now`` (call before reading them mid-window)."""
        w = self._win
        if w is not None:
            # steps that ended strictly before now: a step ending exactly now is still in flight, as in
            # the loop, where an input scheduled for this instant before the step began is seen first
            j = min(bisect_left(w.ends, self.env.now) - 1, w.k - 1)
            if j > w.applied:
                self._settle(w, j)

    def blocks_taken(self) -> None:
        """Blocks of this pool were taken from outside (a KV reservation): cut only if the window needs them,
        or if the reservation found a prefix on the host tier: its copy (``kv.load_s``) is paid before the
        next step, as step by step, not after the window."""
        w = self._win
        if w is not None:
            self.sync()
            if w.need - w.extra > self.kv.free_blocks or (self.kv.prefix_on and (self.waiting or self.kv.load_s)):
                self.cut()      # (a reservation may have evicted cached pages: the queue's head may fit now)

    def cut(self) -> None:
        """An input arrived: sync, and end the window after the step in flight."""
        w = self._win
        if w is None:
            return
        self.sync()
        if w.applied + 1 < w.k:
            w.k = w.applied + 1
            self._arm(w)
