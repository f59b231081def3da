"""``simulate(scenario)``: the same request stream through every topology, one SimPy environment each."""
from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import simpy

from .config import Scenario
from .errors import ConfigError, SimulationInvariantError
from .models import ModelShape, get_model
from .topology import build
from .workload import ABANDONED, FINISHED, REJECTED, UNFINISHED, Request, generate  # noqa: F401 (generate: re-export)


@dataclass
class Context:
    model: ModelShape
    weight_dtype: str
    kv_dtype: str
    base_dir: Path
    bin_s: float
    fast: bool = True        # multi-step decode windows (False: one event per step, the reference)
    seed: int = 0            # the scenario's seed (speculative decoding's per-request draws)


def resolve_model(sc: Scenario) -> ModelShape:
    if isinstance(sc.model, str):
        return get_model(sc.model)
    m = sc.model
    if m.heads % m.kv_heads:
        raise ConfigError("heads must be a multiple of kv_heads", key="model.kv_heads", value=m.kv_heads)
    _check_moe_mla(m)
    _check_sliding(m)
    head_dim = m.head_dim or (m.qk_nope_head_dim + m.qk_rope_head_dim if m.kv_lora_rank else m.hidden // m.heads)
    return ModelShape(m.name, m.layers, m.hidden, m.heads, m.kv_heads, head_dim,
                      m.mlp_width, m.vocab, m.tied_embeddings, m.gated_mlp, m.max_context,
                      m.experts, m.experts_per_token, m.shared_experts, m.expert_width, m.dense_layers,
                      m.q_lora_rank, m.kv_lora_rank, m.qk_rope_head_dim, m.qk_nope_head_dim, m.v_head_dim,
                      source="inline model in the scenario", sliding_window=m.sliding_window,
                      sliding_layers=m.sliding_layers)


def _check_sliding(m) -> None:
    """Sliding-window fields of an inline model: both or neither, within the layers; one error naming the key."""
    if m.sliding_layers > m.layers:
        raise ConfigError(f"at most the {m.layers} layers of the model can use the sliding window",
                          key="model.sliding_layers", value=m.sliding_layers)
    if m.sliding_layers and m.sliding_window is None:
        raise ConfigError("sliding-window layers need sliding_window (tokens each such layer attends to)",
                          key="model.sliding_window")
    if m.sliding_window is not None and not m.sliding_layers:
        raise ConfigError("a sliding window needs sliding_layers (how many of the layers use it, >= 1)",
                          key="model.sliding_layers", value=m.sliding_layers)


def _check_moe_mla(m) -> None:
    """MoE and MLA fields of an inline model: complete and consistent, or one error naming the key."""
    if m.experts:
        if not 1 <= m.experts_per_token <= m.experts:
            raise ConfigError(f"a mixture of experts needs 1 <= experts_per_token <= experts (= {m.experts})",
                              key="model.experts_per_token", value=m.experts_per_token)
        if not m.expert_width:
            raise ConfigError("a mixture of experts needs expert_width (the expert MLP width)",
                              key="model.expert_width", value=m.expert_width)
        if m.dense_layers >= m.layers:
            raise ConfigError(f"dense_layers must leave some of the {m.layers} layers to the experts",
                              key="model.dense_layers", value=m.dense_layers)
    else:
        for k in ("experts_per_token", "shared_experts", "expert_width", "dense_layers"):
            if getattr(m, k):
                raise ConfigError("set only on a mixture-of-experts model (give experts > 0)",
                                  key=f"model.{k}", value=getattr(m, k))
    if m.kv_lora_rank:
        for k in ("qk_rope_head_dim", "qk_nope_head_dim", "v_head_dim"):
            if not getattr(m, k):
                raise ConfigError("multi-head latent attention (kv_lora_rank > 0) needs it > 0",
                                  key=f"model.{k}", value=getattr(m, k))
    else:
        for k in ("q_lora_rank", "qk_rope_head_dim", "qk_nope_head_dim", "v_head_dim"):
            if getattr(m, k):
                raise ConfigError("an MLA field on a model without multi-head latent attention "
                                  "(give kv_lora_rank > 0)", key=f"model.{k}", value=getattr(m, k))


# --- the run ----------------------------------------------------------------------------
class Sink:
    """Collects request outcomes and wakes closed-loop clients."""

    def __init__(self, env, expected: int | None = None):
        self.env = env
        self.done = 0
        self.expected = expected
        self.all_done = env.event()        # every request finished, rejected or abandoned
        self.waiters: dict[int, simpy.Event] = {}
        self._ints: dict[int, int] = {}    # one object per distinct final count (memory, see finished)

    def finished(self, req: Request) -> None:
        # a finished request's counts are its output length and its last KV position: values shared by
        # many requests, but each reached by its own additions, so each is a 32-byte int object of its own
        # (above 256); pointing them at one object per value saves 64 B a request (1 M requests: 64 MB)
        ints = self._ints
        c, g = req.computed, req.generated
        req.computed, req.generated = ints.setdefault(c, c), ints.setdefault(g, g)
        self.done += 1
        if self.done == self.expected:
            self.all_done.succeed()
        ev = self.waiters.pop(req.id, None)
        if ev is not None:
            ev.succeed()

    def rejected(self, req: Request, reason: str) -> None:
        req.status, req.reject_reason, req.finish_s = REJECTED, reason, self.env.now
        self.finished(req)


@dataclass
class TopologyResult:
    name: str
    topology: object
    requests: list
    sim_end_s: float
    events: int
    cut_by_horizon: int = 0      # requests that would have arrived at or after horizon_s: not part of the run


def _send(env, topo, r, model, timeout_s):
    if r.prompt_tokens + r.output_tokens > model.max_context:
        return topo.sink.rejected(r, f"context: prompt+output = {r.prompt_tokens + r.output_tokens} tokens "
                                  f"exceed the {model.max_context}-token context of {model.name}")
    if timeout_s is not None:
        env.timeout(timeout_s).callbacks.append(lambda _ev, r=r: topo.abandon(r))
    f = topo.frontend_s
    if f > 0:       # the engine's front end (engines.frontend_latency_s): no GPU time, then the router
        env.timeout(f).callbacks.append(lambda _ev, r=r: topo.route(r) if r.status == UNFINISHED else None)
    else:
        topo.route(r)


def _open_loop(env, topo, reqs, model, timeout_s=None):
    for r in reqs:
        if r.arrival_s > env.now:
            yield env.timeout(r.arrival_s - env.now)
        _send(env, topo, r, model, timeout_s)


def _client(env, topo, sink, queue, think_s, model=None, timeout_s=None, start_s=0.0):
    if start_s > 0:                 # client.ramp_up_s / start_jitter_s: this client starts later
        yield env.timeout(start_s)
    while queue:
        r = queue.pop()
        r.arrival_s = env.now
        ev = sink.waiters[r.id] = env.event()
        _send(env, topo, r, model, timeout_s)
        yield ev
        if think_s:
            yield env.timeout(think_s)


def _progress(env, sink, bar, span_s: float):
    """Requests settled so far on ``bar`` (pdsim.progress: a bar on a terminal, a line every 30 s in a log)."""
    step = max(span_s / 500, 1e-3)
    while sink.done < sink.expected:
        if env.peek() == float("inf"):
            return         # nothing else will ever happen (a deadlock, reported after the run): no spinning
        yield env.timeout(step)
        if sink.done > bar.done:
            bar.update(sink.done - bar.done)


def run_topology(sc: Scenario, name: str, spec, stream: list[Request], model: ModelShape,
                 bin_s: float, fast: bool = True, progress: bool = False, reuse: bool = False) -> TopologyResult:
    """One topology on the stream: on fresh copies of its requests, or on the requests themselves
    when ``reuse`` (the last topology of a run: a million requests are not held twice)."""
    env = simpy.Environment()
    horizon, closed = sc.horizon_s, sc.workload.arrival == "closed"
    # a request arriving at or after the horizon never arrives (the clock stops first): it is not part of the
    # run, only counted (TopologyResult.cut_by_horizon); the run is that of the stream cut there
    reqs = stream if horizon is None or closed else [r for r in stream if r.arrival_s < horizon]
    cut = len(stream) - len(reqs)
    if stream and not reqs:
        from .errors import ConfigError
        first = min(r.arrival_s for r in stream)
        raise ConfigError(f"every request arrives at or after the horizon (the first at {first:g} s): nothing would run",
                          key="horizon_s", value=horizon)
    sink = Sink(env, len(reqs))
    ctx = Context(model, sc.weight_dtype, sc.kv_dtype, Path(sc.base_dir), bin_s, fast, sc.seed)
    spec, by_engine = engine_defaults(spec, reqs, model)
    if by_engine and progress:
        print(f"pdsim: {name}: {', '.join(f'{p} pool caches prefixes ({e} default)' for p, e in by_engine.items())}"
              f"; prefix_cache: {{enabled: false}} turns it off", file=sys.stderr, flush=True)
    topo = build(name, spec, env, ctx, sink)
    topo.sink = sink
    topo.prefix_by_engine = by_engine
    if not reuse:
        reqs = [r.clone() for r in reqs]
    if record_itl(sc, reqs):
        for r in reqs:
            r.token_s = []
    timeout_s = sc.workload.timeout_s
    topo.client_view(sc.client, timeout_s)
    if sc.workload.arrival == "closed":
        queue = list(reversed(reqs))
        for start_s in client_starts(sc):
            env.process(_client(env, topo, sink, queue, sc.workload.think_s, model, timeout_s, start_s))
    else:
        env.process(_open_loop(env, topo, reqs, model, timeout_s))
    if spec.autoscaler is not None:
        from .autoscaler import Autoscaler
        last = max((r.arrival_s for r in reqs if r.arrival_s == r.arrival_s), default=0.0)
        topo.autoscaler = Autoscaler(env, topo, spec.autoscaler, sink, sc.slo.tpot_s, last)
    if sc.faults is not None:
        from .faults import schedule_faults
        schedule_faults(env, sc, name, topo)
    bar = None
    if progress:
        from .progress import Bar
        bar = Bar(sink.expected, name, unit="req")
        env.process(_progress(env, sink, bar, bin_s * 200))
    # stop when every request is settled (stale fast-path timers and fault processes may run on), or at the
    # horizon if that comes first: a horizon past the last settlement changes nothing
    if horizon is not None:
        sink.all_done.callbacks.append(simpy.core.StopSimulation.callback)
    try:
        env.run(until=horizon if horizon is not None else sink.all_done)
    except RuntimeError as exc:     # the queue ran dry first: a deadlock, reported by check_conservation
        if "until" not in str(exc):
            raise
    finally:
        if bar is not None:
            bar.close()
    end = env.now
    for inst in topo.instances:     # apply the steps of open fast-path windows that ended by now
        inst.sync()
    if closed and horizon is not None and queue:    # the clients stop sending at the horizon: the unsent are cut
        cut = len(queue)            # (the queue is the stream reversed, popped from its end)
        reqs = reqs[:len(reqs) - cut]
    check_conservation(name, topo, reqs, horizon is not None)
    # SimPy numbers every scheduled event; reading its counter is the cheapest exact count
    eid = getattr(env, "_eid", None)
    events = next(eid) if eid is not None and hasattr(eid, "__next__") else sum(i.steps for i in topo.instances)
    return TopologyResult(name, topo, reqs, end, events, cut)


def engine_defaults(spec, stream: list[Request], model: ModelShape):
    """(topology spec as simulated, {pool name: engine}): the engines' default prefix caching turned on where
    the request stream carries content ids (engines.with_engine_prefix_cache).  Every path that simulates a
    scenario's topology (run, plan, validate) builds from this, so a plan judges what a run will do."""
    if any(getattr(r, "hash_ids", None) is not None for r in stream):
        from .engines import with_engine_prefix_cache
        return with_engine_prefix_cache(spec, model)
    return spec, {}


def ideal_cached_tokens(stream: list[Request]) -> np.ndarray:
    """Prompt tokens each request could at most find cached: the leading ids of its hash chain that an earlier
    request (in stream order) carried, as whole units, never its last prompt token; an infinite cache with no
    concurrency.  A lower bound on what prefix caching leaves to compute (the plan's bound, plan.py)."""
    seen: set = set()
    out = np.zeros(len(stream))
    for i, r in enumerate(stream):
        ids = getattr(r, "hash_ids", None)
        if not ids:
            continue
        k = 0
        for h in ids:
            if h not in seen:
                break
            k += 1
        out[i] = min(k * r.hash_block_tokens, r.prompt_tokens - 1)
        seen.update(ids)
    return out


def record_itl(sc: Scenario, reqs: list[Request]) -> bool:
    """Whether to record every token's time (client.itl; ``auto``: at most 5 million output tokens)."""
    mode = sc.client.itl
    return mode == "on" or (mode == "auto" and sum(r.output_tokens for r in reqs) <= 5_000_000)


def client_starts(sc: Scenario) -> list[float]:
    """When each closed-loop client sends its first request: client i of n at ramp_up_s * i / n, plus
    a uniform start jitter in [0, start_jitter_s) drawn from its own seeded stream (the requests'
    lengths do not change with it).  Defaults (0, 0): every client at t=0, as ``vllm bench serve
    --max-concurrency`` launches them."""
    n, c = sc.workload.clients, sc.client
    starts = np.arange(n) * (c.ramp_up_s / n)
    if c.start_jitter_s > 0:
        starts = starts + np.random.default_rng([sc.seed, 7]).uniform(0, c.start_jitter_s, n)
    return starts.tolist()


def check_conservation(name, topo, reqs, has_horizon: bool) -> None:
    """Nothing lost: every request ends in exactly one state; KV blocks all accounted for."""
    counts = {FINISHED: 0, REJECTED: 0, ABANDONED: 0, UNFINISHED: 0}
    for r in reqs:
        if r.status == ABANDONED:
            if not r.finish_s >= r.arrival_s:
                raise SimulationInvariantError(f"{name}: request {r.id} abandoned before it arrived")
            counts[ABANDONED] += 1
        elif r.status == FINISHED:
            if r.generated != r.output_tokens:
                raise SimulationInvariantError(f"{name}: request {r.id} finished with {r.generated} of "
                                               f"{r.output_tokens} output tokens")
            counts[FINISHED] += 1
        elif r.status == REJECTED:
            counts[REJECTED] += 1
        else:
            r.status = UNFINISHED
            counts[UNFINISHED] += 1
    if sum(counts.values()) != len(reqs):
        raise SimulationInvariantError(f"{name}: {len(reqs)} requests in, {counts} out")
    if counts[UNFINISHED] and not has_horizon:
        stuck = next(r for r in reqs if r.status == UNFINISHED)
        if sc_stuck_hint := getattr(topo, "backlog", None):
            raise SimulationInvariantError(f"{name}: {len(sc_stuck_hint)} requests left waiting for an instance "
                                           "that never recovered")
        raise SimulationInvariantError(f"{name}: {counts[UNFINISHED]} requests never finished without a horizon "
                                       f"(first: id {stuck.id}); the simulation deadlocked")
    for inst in topo.instances:
        if not has_horizon and inst.kv.used_blocks != 0:
            raise SimulationInvariantError(f"{name}/{inst.name}: {inst.kv.used_blocks} KV blocks still in use")
        if inst.kv.ranked and (sum(inst.kv.rank_free) != inst.kv.free_blocks
                               or (not has_horizon and inst.kv.owner)):
            raise SimulationInvariantError(f"{name}/{inst.name}: per-rank KV free {inst.kv.rank_free} does not add up "
                                           f"to the pool's {inst.kv.free_blocks}, or {len(inst.kv.owner)} requests "
                                           "still hold blocks")


_STREAMS: dict = {}          # this process's recently generated streams (shared_stream)
STREAMS_KEPT = 8


def _stream_key(sc: Scenario, model: ModelShape) -> str:
    """Everything ``generate`` reads: the workload, the seed, the model, where relative paths point,
    and the size and modification time of every file the workload names (a trace edited in between
    is read again)."""
    import json
    import os
    w = sc.workload.model_dump(mode="json")
    files = []
    for part in (w.get("trace"), w.get("prompt_tokens"), w.get("output_tokens")):
        path = part.get("path") if isinstance(part, dict) else None
        if path:
            p = sc.resolve(path)
            try:
                st = os.stat(p)
                files.append([str(p), st.st_size, st.st_mtime_ns])
            except OSError:
                files.append([str(p), None, None])     # generate reports the missing file
    return json.dumps([w, sc.seed, repr(model), str(sc.base_dir), files], sort_keys=True, default=str)


def shared_stream(sc: Scenario, model: ModelShape) -> list[Request]:
    """``generate(sc, model)`` as fresh requests, generated once per distinct workload in this process:
    a plan's configs at the same rate and seed differ only in topology, so they share one stream (and a
    trace is read and parsed once, not once per config).  Each call gets its own clones."""
    key = _stream_key(sc, model)
    hit = _STREAMS.get(key)
    if hit is None:
        hit = generate(sc, model)
        if len(_STREAMS) >= STREAMS_KEPT:
            _STREAMS.pop(next(iter(_STREAMS)))
        _STREAMS[key] = hit
    return [r.clone() for r in hit]


def default_bin_s(sc: Scenario, stream: list[Request]) -> float:
    if sc.timeseries_bin_s:
        return sc.timeseries_bin_s
    # the span of the arrivals the run takes: up to the last one, or to the horizon if that comes first
    last = max((r.arrival_s for r in stream if r.arrival_s == r.arrival_s), default=0.0)
    span = min(sc.horizon_s or float("inf"), last or float("inf"))
    if span == float("inf"):
        span = 1.0
    return max(0.01, float(f"{span / 200:.1g}"))


def check_topologies(sc: Scenario, model: ModelShape | None = None, bin_s: float | None = None) -> None:
    """Build every topology of ``sc`` as :func:`simulate` does, simulating nothing: raises the InputError a
    run would (weights that do not fit, a bad tp...).  Cheap (no request stream: without ``bin_s`` the
    timeseries bin is a placeholder, which no build check reads), so ``pdsim sweep`` checks each point with it
    before running any."""
    model = model if model is not None else resolve_model(sc)
    bin_s = bin_s if bin_s is not None else (sc.timeseries_bin_s or 1.0)   # the bin width cannot make a build fail
    for name, spec in sc.topologies.items():
        env = simpy.Environment()
        build(name, spec, env, Context(model, sc.weight_dtype, sc.kv_dtype, Path(sc.base_dir), bin_s), Sink(env))


def simulate(sc: Scenario, progress: bool = False, fast: bool = True) -> list[TopologyResult]:
    """Every topology of ``sc`` on the same request stream.  ``fast=False``: step-by-step reference loop."""
    model = resolve_model(sc)
    stream = generate(sc, model)
    bin_s = default_bin_s(sc, stream)
    # build every topology once before simulating any, so a bad pool fails in seconds, not after a long run
    check_topologies(sc, model, bin_s)
    out = []
    names = list(sc.topologies)
    for name, spec in sc.topologies.items():
        if progress:
            print(f"pdsim: simulating {name} ({len(stream)} requests)...", file=sys.stderr, flush=True)
        out.append(run_topology(sc, name, spec, stream, model, bin_s, fast, progress, reuse=name == names[-1]))
    return out
