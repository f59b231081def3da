"""One serving instance (a replica, or a member of a prefill or decode pool) as a SimPy process.

The loop is plan -> timeout(step cost) -> apply: one event per step, never per
token per request.  ``role`` says what happens when a prompt's prefill ends:
``both`` keeps decoding it here (colocated), ``prefill`` hands it off for a KV
transfer (disaggregated), ``decode`` instances receive transferred requests.
"""
from __future__ import annotations

from collections import deque

from .costmodel import CostModel
from .kvcache import KVCache
from .scheduler import Limits
from .workload import FINISHED, UNFINISHED, Request

HANDOFF = "handoff"   # prefilled, KV held here until it reaches a decode instance


class Series:
    """Per-instance time series in fixed bins: busy seconds, FLOPs, bytes, batch, queue, KV blocks."""
    __slots__ = ("bin_s", "busy_s", "flops", "bytes", "steps", "batch_sum", "queue_max", "kv_max")

    def __init__(self, bin_s: float):
        self.bin_s = bin_s
        self.busy_s, self.flops, self.bytes = [], [], []
        self.steps, self.batch_sum, self.queue_max, self.kv_max = [], [], [], []

    def _grow(self, i: int) -> None:
        while len(self.busy_s) <= i:
            for a in (self.busy_s, self.flops, self.bytes, self.steps, self.batch_sum, self.queue_max, self.kv_max):
                a.append(0)

    def record(self, t0: float, dur: float, flops: float, bytes_: float, batch: int, queued: int,
               kv_used: int) -> None:
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


class Instance:
    def __init__(self, env, name: str, pool: str, role: str, cost: CostModel, kv: KVCache, policy,
                 limits: Limits, gpus: int, sink, bin_s: float):
        self.env, self.name, self.pool, self.role = env, name, pool, role
        self.cost, self.kv, self.policy, self.limits = cost, kv, policy, limits
        self.gpus = gpus
        self.sink = sink                   # topology callbacks: first_token, finished, prefill_done
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []
        self.outstanding_tokens = 0        # tokens still to compute here (router's load signal)
        self.decode_work = 0               # output tokens still to produce here (P->D policy signal)
        self.busy_s = self.flops = self.bytes = 0.0
        self.steps = 0
        self.series = Series(bin_s)
        self._wake = env.event()
        self.proc = env.process(self.run())

    # --- inputs ---------------------------------------------------------------
    def wake(self) -> None:
        if not self._wake.triggered:
            self._wake.succeed()

    def submit(self, req: Request) -> None:
        """A new request (or one re-routed) joins the queue."""
        req.instance = self.name
        self.waiting.append(req)
        self.outstanding_tokens += (req.known - req.computed) if self.role == "prefill" else req.remaining
        self.decode_work += req.output_tokens - req.generated
        self.wake()

    def accept(self, req: Request) -> None:
        """A request whose KV has arrived (blocks already reserved) starts decoding here."""
        req.decode_instance = self.name
        self.running.append(req)
        self.outstanding_tokens += req.remaining
        self.decode_work += req.output_tokens - req.generated
        self.wake()

    # --- the process ------------------------------------------------------------
    def run(self):
        env = self.env
        while True:
            if not (self.running or self.waiting):
                self._wake = env.event()
                yield self._wake
                continue
            plan = self.policy(self.running, self.waiting, self.kv, self.limits)
            self.outstanding_tokens += plan.lost_tokens   # preempted KV must be computed again
            if not plan.items:
                # nothing fits: wait for blocks to be freed (a transfer ends) or new work
                self._wake = env.event()
                yield self._wake
                continue
            c = self.cost.step(plan.tokens, plan.attn_work, plan.kv_read_tokens, plan.sampled, len(plan.items))
            t0 = env.now
            yield env.timeout(c.time_s)
            self.busy_s += c.time_s
            self.flops += c.flops
            self.bytes += c.bytes
            self.steps += 1
            self.series.record(t0, c.time_s, c.flops, c.bytes, len(plan.items), len(self.waiting),
                               self.kv.used_blocks)
            self._apply(plan, t0)

    def _apply(self, plan, t0: float) -> None:
        now = self.env.now
        leaving = False
        for req, n in plan.items:
            if req.prefill_start_s != req.prefill_start_s:  # NaN: first compute of this request
                req.prefill_start_s = t0
            req.computed += n
            self.outstanding_tokens -= n
            if req.computed != req.known:
                continue
            req.generated += 1
            self.decode_work -= 1
            if req.generated == 1:
                req.first_token_s = req.prefill_end_s = now
                self.sink.first_token(req)
            if req.generated >= req.output_tokens:
                req.status = FINISHED
                req.finish_s = now
                self.kv.release(req)
                leaving = True
                self.sink.finished(req, self)
            elif self.role == "prefill":
                # prefill done: the request leaves the batch but keeps its KV until the transfer ends
                req.status = HANDOFF
                self.decode_work -= req.output_tokens - req.generated
                leaving = True
                self.sink.prefill_done(req, self)
        if leaving:
            self.running = [r for r in self.running if r.status == UNFINISHED]
