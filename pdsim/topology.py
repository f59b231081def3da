"""Deployments as SimPy wiring: colocated replicas behind a router, or prefill and decode pools joined by KV links.

``build(name, spec, env, ctx, sink)`` returns a topology with ``route(request)``.
Routing, P->D assignment and link queueing are plain policies chosen by name.
"""
from __future__ import annotations

import itertools

import simpy

from .config import ColocatedSpec, DisaggregatedSpec, PoolSpec, PrefixRoutingSpec
from .costmodel import ConstantCost, LinearCost, RooflineCost
from .devices import GiB, get_device
from .errors import ConfigError
from .instance import HANDOFF, Instance
from .kvcache import KVCache, PrefixKVCache, RankedKVCache, SlidingKVCache
from .scheduler import SCHEDULERS, Limits, assign_rank, final_kv_tokens
from .workload import ABANDONED, UNFINISHED, Request


# --- routing policies: (instances, request) -> instance ------------------------------------
# Policies that read instance state sync the instances first (a fast-path window may be open).
def round_robin():
    counter = itertools.count()
    return lambda insts, req: insts[next(counter) % len(insts)]


def _synced(insts):
    for i in insts:
        i.sync()
    return insts


def least_outstanding():
    return lambda insts, req: min(insts, key=lambda i: i.load_tokens())


def least_loaded():
    # the fewest KV blocks in use, those reserved for KV still on the wire included (a reservation takes its
    # blocks from the pool: kv.used_blocks counts them already), then the smallest batch.  One candidate (a
    # single decode instance): nothing to compare, so no window is settled for it
    return lambda insts, req: insts[0] if len(insts) == 1 else min(
        _synced(insts), key=lambda i: (i.kv.used_blocks, len(i.running)))


def least_decode_work():
    # an oracle that knows output lengths, as a simulator can: balances the decode tokens to come
    return lambda insts, req: min(insts, key=lambda i: i.load_decode())


def prefix_aware(routing=None):
    """The live instance holding the longest cached prefix of the prompt (GPU or host tier), least
    outstanding tokens as the tie-break; an instance more than ``load_slack_tokens`` above the least
    loaded one is passed over (the load ceiling: one hot prefix must not pile on one instance)."""
    slack = routing.load_slack_tokens if routing is not None else PrefixRoutingSpec().load_slack_tokens

    def route(insts, req):
        loads = [i.load_tokens() for i in _synced(insts)]
        ceiling = min(loads) + slack
        best, best_key = None, None
        for inst, load in zip(insts, loads):
            if load > ceiling:
                continue
            cached = inst.kv.cached_tokens(req) if inst.kv.prefix_on and req.hash_ids is not None else 0
            key = (-cached, load)
            if best_key is None or key < best_key:
                best, best_key = inst, key
        return best
    return route


def kv_aware(routing=None):
    """Dynamo-style: the least ``overlap_weight x prompt tokens still to compute + outstanding tokens``."""
    w = routing.overlap_weight if routing is not None else PrefixRoutingSpec().overlap_weight

    def route(insts, req):
        best, best_cost = None, None
        for inst in _synced(insts):
            cached = inst.kv.cached_tokens(req) if inst.kv.prefix_on and req.hash_ids is not None else 0
            cost = w * (req.prompt_tokens - cached) + inst.load_tokens()
            if best_cost is None or cost < best_cost:
                best, best_cost = inst, cost
        return best
    return route


ROUTERS = {"round_robin": round_robin, "least_outstanding": least_outstanding, "prefix_aware": prefix_aware,
           "kv_aware": kv_aware}


def make_router(spec, entry=None, key: str = ""):
    """The router of a topology; ``entry``: the pool it routes into (a cache-aware router over a pool that
    caches nothing degrades to least-outstanding, which is said once as a warning)."""
    if spec.router in ("prefix_aware", "kv_aware"):
        from .engines import engine_prefix_cache
        if entry is not None and not entry.spec.prefix_on and not engine_prefix_cache(entry.spec, entry.model):
            import warnings
            warnings.warn(f"{key}.router = {spec.router}: the pool it routes into caches no prefixes (no prefix_cache "
                          "and no engine default), so it routes as least_outstanding would", UserWarning, stacklevel=2)
        return ROUTERS[spec.router](spec.prefix_routing)
    return ROUTERS[spec.router]()
ASSIGNERS = {"round_robin": round_robin, "least_loaded": least_loaded, "least_decode_work": least_decode_work}


# --- building instances ----------------------------------------------------------------
def make_cost(pool: PoolSpec, model, weight_dtype: str, kv_dtype: str, base_dir, key: str):
    """The pool's cost model; with pp > 1 a :class:`~pdsim.pipeline.PipelineCost` over its stages
    (``constant`` / ``linear`` then price one stage of one micro-batch)."""
    cm = pool.cost_model
    model.validate_pp(pool.pp, key=f"{key}.pp", pp_layers=pool.pp_layers, layers_key=f"{key}.pp_layers")
    check_sliding(pool, model, key)
    if cm.kind == "constant":
        cost = ConstantCost(cm.step_s, pool.tp, model.window)
    elif cm.kind == "linear":
        cost = LinearCost(cm.base_s, cm.per_token_s, cm.per_kv_token_s, pool.tp)
        if model.has_sliding:
            cost.window, cost.sliding_share = model.window, model.sliding_layers / model.layers
    else:
        device = get_device(pool.device, key=f"{key}.device", base_dir=base_dir)
        model.validate_tp(pool.tp, key=f"{key}.tp")
        model.validate_ep(pool.ep, pool.tp, key=f"{key}.ep")
        if pool.dp_attention:
            model.validate_dp_attention(pool.tp, pool.ep, pool.pp, key=f"{key}.dp_attention")
        if pool.expert_skew and not model.is_moe:
            raise ConfigError(f"expert popularity skew needs a mixture-of-experts model; {model.name} is dense",
                              key=f"{key}.expert_skew", value=pool.expert_skew)
        cost = RooflineCost(model, device, pool.tp, weight_dtype, kv_dtype, pool.ep, pool.expert_skew, pool.pp,
                            pool.dp_attention, moe_tables=cm.moe_tables,
                            mla_tables=cm.mla_tables, a2a_tables=cm.a2a_tables,
                            pp_layers=tuple(pool.pp_layers) if pool.pp_layers is not None else None)
    if pool.pp == 1:
        return cost
    from .pipeline import PipelineCost, UniformStages
    stages = cost if cm.kind == "roofline" else UniformStages(cost, pool.pp, model.stage_split(pool.pp, pool.pp_layers))
    return PipelineCost(stages, pool.pp, pool.micro_batches)


def check_sliding(pool: PoolSpec, model, key: str) -> None:
    """Sliding-window layers with what is not modelled for them: one error line naming the key."""
    if not model.has_sliding:
        return
    if model.full_layers == 0:
        raise ConfigError("a model whose every layer is sliding-window is not modelled (the KV pool counts blocks "
                          "of the full-attention layers); keep at least one full layer",
                          key="model.sliding_layers", value=model.sliding_layers)
    if pool.prefix_on:
        raise ConfigError("prefix caching with sliding-window layers is not modelled (a cached prefix would need "
                          "the sliding layers' window blocks at its end)", key=f"{key}.prefix_cache.enabled",
                          value=True)
    if pool.speculative is not None:
        raise ConfigError("speculative decoding with sliding-window layers is not modelled",
                          key=f"{key}.speculative", value=pool.speculative.method)
    if pool.dp_attention:
        raise ConfigError("DP attention with sliding-window layers is not modelled", key=f"{key}.dp_attention",
                          value=True)


def kv_blocks(pool: PoolSpec, model, weight_dtype: str, kv_dtype: str, base_dir, key: str) -> tuple[int, float]:
    """(blocks, bytes per block per GPU): device memory x utilisation - weights/tp - activation reserve.
    Under pipeline parallelism a GPU holds its stage's layers' weights and KV: every stage keeps the
    same number of blocks, the fewest any stage's GPU has room for (each stage's free memory over its
    own bytes per block), as vLLM takes the smallest block count over its workers.  With an even split
    that is the stage with the embedding or the LM head; ``block_bytes`` is the busiest stage's (the
    stage with the most layers)."""
    # KV heads split across the tp GPUs; with tp > kv_heads each GPU keeps one (replicated) head; MLA: the whole latent
    # sliding-window layers: a block is block_size tokens of the full layers' KV (SlidingKVCache adds the window's)
    model.validate_ep(pool.ep, pool.tp, key=f"{key}.ep")
    check_sliding(pool, model, key)
    model.validate_pp(pool.pp, key=f"{key}.pp", pp_layers=pool.pp_layers, layers_key=f"{key}.pp_layers")
    ranks = 1
    if pool.dp_attention:
        # each GPU is an attention rank keeping its own requests' whole KV (attention TP 1): the instance's
        # pool is the sum of the ranks' pools (ASSUMPTION without attention_dp_balance: requests spread evenly
        # over the ranks; with it each rank has its own pool, RankedKVCache);
        # block_bytes stays per GPU (a block lives on one of the tp GPUs)
        model.validate_dp_attention(pool.tp, pool.ep, pool.pp, key=f"{key}.dp_attention")
        ranks = pool.tp
        kv_tok_shard = model.kv_bytes_per_token_per_gpu(kv_dtype, 1)
    else:
        kv_tok_shard = model.kv_bytes_per_token_per_gpu(kv_dtype, pool.tp, pool.pp, pool.pp_layers)
    block_bytes = pool.block_size * kv_tok_shard
    if pool.kv_blocks is not None:
        return pool.kv_blocks, block_bytes / ranks
    device = get_device(pool.device, key=f"{key}.device", base_dir=base_dir)
    weights = model.weight_bytes_per_gpu(weight_dtype, pool.tp, pool.ep, pool.pp, pool.dp_attention, pool.pp_layers)
    free = device.memory_bytes * pool.gpu_memory_utilization - weights - pool.activation_reserve_GiB * GiB
    if pool.engine is not None:       # sized as the engine sizes it (pdsim/engines.py)
        from .engines import kv_cache_bytes
        free = kv_cache_bytes(pool, model, weight_dtype, device.memory_bytes)["kv_bytes"]
    if pool.pp > 1 and not pool.dp_attention and len(set(model.stage_split(pool.pp, pool.pp_layers))) > 1:
        # uneven stages: each stage's GPU fits its own free memory / its own block bytes; all keep the fewest
        return _uneven_stage_blocks(pool, model, weight_dtype, kv_dtype, device, block_bytes, key)
    if free < block_bytes:
        raise ConfigError(
            f"{model.name} weights ({weights / GiB:.1f} GiB per GPU at tp={pool.tp}"
            f"{f' pp={pool.pp}' if pool.pp > 1 else ''}) plus "
            f"{pool.activation_reserve_GiB} GiB activations do not fit {device.name} "
            f"({device.memory_bytes / GiB:.1f} GiB x {pool.gpu_memory_utilization}); raise tp or use a larger device",
            key=f"{key}.device", value=pool.device)
    return int(free // block_bytes) * ranks, block_bytes / ranks


def _cap(kv) -> str:
    """What a kv_capacity rejection names: the blocks one request can get (per attention rank on a ranked pool)."""
    return f"{kv.max_request_blocks()}" + (f" per attention rank ({kv.ranks} ranks)" if kv.ranked else "")


def stage_kv_memory(pool: PoolSpec, model, weight_dtype: str, kv_dtype: str, device) -> list[tuple[float, float]]:
    """[(KV memory, bytes per block)] of one GPU of each pipeline stage: its free memory as :func:`kv_blocks`
    (or the engine) sizes it with the stage's own weights, and block_size tokens of its own layers' KV."""
    stage_w = model.stage_weight_bytes(weight_dtype, pool.tp, pool.ep, pool.pp, pool.pp_layers)
    stage_kv = model.stage_kv_bytes_per_token(kv_dtype, pool.tp, pool.pp, pool.pp_layers)
    out = []
    for w, kv in zip(stage_w, stage_kv):
        free = device.memory_bytes * pool.gpu_memory_utilization - w - pool.activation_reserve_GiB * GiB
        if pool.engine is not None:
            from .engines import kv_cache_bytes
            free = kv_cache_bytes(pool, model, weight_dtype, device.memory_bytes, weights=w)["kv_bytes"]
        out.append((free, pool.block_size * kv))
    return out


def _uneven_stage_blocks(pool: PoolSpec, model, weight_dtype: str, kv_dtype: str, device, block_bytes: float,
                         key: str) -> tuple[int, float]:
    """:func:`kv_blocks` of a pipeline whose stages hold different numbers of layers: min over the stages
    of (stage j's free memory // its block bytes), free memory as :func:`kv_blocks` (or the engine) sizes
    it with stage j's weights."""
    stage_w = model.stage_weight_bytes(weight_dtype, pool.tp, pool.ep, pool.pp, pool.pp_layers)
    blocks = None
    for j, (w, (free, bb)) in enumerate(zip(stage_w, stage_kv_memory(pool, model, weight_dtype, kv_dtype, device))):
        if free < bb:
            raise ConfigError(
                f"{model.name} weights ({w / GiB:.1f} GiB per GPU of pipeline stage {j} at tp={pool.tp} "
                f"pp={pool.pp}) plus {pool.activation_reserve_GiB} GiB activations do not fit {device.name} "
                f"({device.memory_bytes / GiB:.1f} GiB x {pool.gpu_memory_utilization}); raise tp or use a larger "
                "device", key=f"{key}.device", value=pool.device)
        n = int(free // bb)
        blocks = n if blocks is None else min(blocks, n)
    return blocks, block_bytes


class Pool:
    """Instances of one PoolSpec; keeps what metrics need (GPUs, price, peaks)."""

    @property
    def instance_block_bytes(self) -> float:
        """Bytes of one KV block over all the GPUs of an instance.  ``block_bytes`` is one GPU's share on the
        busiest stage; under an uneven pipeline split stage j's tp GPUs hold n_j / max n of that."""
        split = self.pp_layers
        if split is not None and len(set(split)) > 1:
            return self.block_bytes * self.spec.tp * sum(split) / max(split)
        return self.block_bytes * self.spec.gpus_per_instance

    def __init__(self, env, topo: str, name: str, role: str, spec: PoolSpec, count: int, ctx, sink, key: str,
                 max_count: int | None = None):
        self.name, self.spec, self.role = name, spec, role
        # autoscaled pools are built with max_count instances; those beyond count start off (autoscaler.py)
        self.initial_instances = self.peak_instances = count
        self.model = model = ctx.model
        self.cost = make_cost(spec, model, ctx.weight_dtype, ctx.kv_dtype, ctx.base_dir, key)
        # layers of each pipeline stage (vLLM's split or the pool's pp_layers); None without PP
        self.pp_layers = list(model.stage_split(spec.pp, spec.pp_layers)) if spec.pp > 1 else None
        from .engines import wrap_cost
        self.cost = wrap_cost(self.cost, spec, model)      # the engine's per-step overhead, if any
        from .engines import frontend_latency_s
        self.frontend_s = frontend_latency_s(spec, model)    # before a request reaches the scheduler
        blocks, self.block_bytes = kv_blocks(spec, model, ctx.weight_dtype, ctx.kv_dtype, ctx.base_dir, key)
        self.device = get_device(spec.device, key=f"{key}.device", base_dir=ctx.base_dir) \
            if spec.cost_model.kind == "roofline" or spec.kv_blocks is None else None
        price = spec.price_per_gpu_hour_usd
        if price is None:
            price = self.device.price_per_hour_usd if self.device else 0.0
        self.price_per_gpu_hour_usd = price
        # energy (pdsim/energy.py): the device's power model; a power cap slows compute-bound steps
        from . import energy
        self.power = energy.power_model(self.device, self.cost, spec.power_cap_W, key) \
            if self.device is not None else None
        if self.power is None and spec.power_cap_W is not None:
            raise ConfigError("a power cap needs a device profile with a power model",
                              key=f"{key}.power_cap_W", value=spec.power_cap_W)
        if self.power is not None and self.power.clock_fraction < 1.0:
            self.cost = energy.CappedCost(self.cost, self.power)
        self.spec_dec = None               # speculative decoding (pdsim/speculative.py)
        self.draft_weight_bytes_per_gpu = 0.0     # its draft model's / MTP layer's weights on one GPU
        if spec.speculative is not None:
            if role == "prefill":
                raise ConfigError("a prefill pool does not decode: put speculative on the decode pool",
                                  key=f"{key}.speculative", value=spec.speculative.method)
            from . import speculative
            if spec.kv_blocks is None:
                # uneven stages: the draft lives on the last stage only, each stage's own memory bounds the pool
                stages = stage_kv_memory(spec, model, ctx.weight_dtype, ctx.kv_dtype, self.device) \
                    if self.pp_layers is not None and len(set(self.pp_layers)) > 1 and not spec.dp_attention else None
                blocks = speculative.kv_blocks(spec.speculative, model, blocks, self.block_bytes, spec.tp,
                                               ctx.weight_dtype, ctx.kv_dtype, key, spec.pp, spec.ep,
                                               spec.dp_attention, stages)
            self.draft_weight_bytes_per_gpu = speculative.draft_weight_bytes_per_gpu(
                spec.speculative, model, ctx.weight_dtype, spec.tp, spec.ep, spec.dp_attention, key)
            self.spec_dec = speculative.build(spec.speculative, spec, self.cost, model, ctx.weight_dtype,
                                              ctx.kv_dtype, self.device, getattr(ctx, "seed", 0), key,
                                              self.power)
        # full reservation covers the sequence an instance will hold: a prefill instance hands off after the
        # prompt (TRT-LLM's context servers run with max_tokens 1), so it reserves the prompt only
        limits = Limits(spec.max_running, spec.token_budget, spec.kv_reservation == "full" and role != "prefill",
                        model.window,
                        # DP attention: a request runs on one of tp ranks, each with budget / tp of the step's tokens
                        -(-spec.token_budget // spec.tp) if spec.dp_attention and spec.tp > 1 else None)
        policy = SCHEDULERS[spec.scheduler_name]
        if model.has_sliding:      # each request also holds its sliding layers' window (check_sliding: no prefix)
            extra = model.sliding_extra_blocks(spec.block_size)
            make_kv = lambda: SlidingKVCache(blocks, spec.block_size, spec.watermark, extra)   # noqa: E731
        else:
            make_kv = self._prefix_kv(spec, blocks, key) if spec.prefix_on else \
                (lambda: KVCache(blocks, spec.block_size, spec.watermark))
        bal = spec.attention_dp_balance
        if bal is not None and spec.tp >= 2 and not spec.prefix_on and not model.has_sliding:
            if blocks < spec.tp:
                raise ConfigError(f"attention_dp_balance gives each of the {spec.tp} attention ranks its own KV pool: "
                                  f"{blocks} blocks leave a rank none", key=f"{key}.kv_blocks", value=blocks)
            # requests keep a rank, and each rank (a GPU) has its own pool, as TensorRT-LLM's
            make_kv = lambda: RankedKVCache(blocks, spec.block_size, spec.watermark, spec.tp)   # noqa: E731
        if bal is not None:
            if spec.speculative is not None:
                raise ConfigError("attention_dp_balance with speculative decoding is not modelled",
                                  key=f"{key}.attention_dp_balance", value=bal.model_dump())
            if spec.tp < 2:
                raise ConfigError("attention_dp_balance needs two or more attention ranks (tp >= 2)",
                                  key=f"{key}.attention_dp_balance", value=bal.model_dump())
            from .scheduler import BalancedDP
            # one per instance (it counts steps); no multi-step windows: the count runs on every step
            policies = [BalancedDP(spec.tp, spec.scheduler_name == "chunked", bal.timeout_iters,
                                   bal.batching_wait_iters, spec.max_running)
                        for _ in range(max(count, max_count or 0))]
        bw = spec.batch_wait
        if bw is not None:
            if role != "both":
                raise ConfigError("batch_wait holds new prompts beside decodes: a prefill pool never decodes and a "
                                  "decode pool admits no new prompts, so it would do nothing there",
                                  key=f"{key}.batch_wait", value=bw.model_dump())
            if spec.speculative is not None:
                raise ConfigError("batch_wait with speculative decoding is not modelled",
                                  key=f"{key}.batch_wait", value=bw.model_dump())
            from .scheduler import BatchWait
            # one per instance (it counts steps); no multi-step windows: a held prompt may go at any step
            policies = [BatchWait(policy, spec.scheduler_name == "chunked", bw.timeout_iters, bw.max_tokens_ratio)
                        for _ in range(max(count, max_count or 0))]
        stateful = bal is not None or bw is not None
        self.instances = [
            Instance(env, f"{name}-{i}", name, role, self.cost,
                     make_kv(), policies[i] if stateful else policy, limits, spec.gpus_per_instance, sink,
                     ctx.bin_s, fast=ctx.fast and not stateful)
            for i in range(max(count, max_count or 0))]
        for inst in self.instances:
            inst.reserved_count = 0        # decode side: reservations for KV still on the wire
            inst.inbound = []              # (a DP-balanced decode instance: those requests, for rank placement)
            inst.awaiting = {}             # (and hand-offs placed on one of its ranks, waiting for its blocks)
            inst.block_bytes = self.block_bytes
            inst.pool_spec = spec
            if self.power is not None:
                inst.power = (1.0 / self.power.peak_flops, 1.0 / self.power.peak_Bps)
            if self.spec_dec is not None:
                inst.spec = self.spec_dec       # one Speculator per pool: draws are per request, not per instance
                inst.fast = False               # token counts depend on each step's draws: no multi-step windows

    @property
    def gpus(self) -> int:
        """GPUs of the most instances alive at once (a static pool: all of them)."""
        return self.spec.gpus_per_instance * self.peak_instances

    def alive_s(self, end_s: float) -> float:
        """Instance-seconds paid up to ``end_s`` (a static pool: instances x end_s)."""
        return sum(i.alive_s(end_s) for i in self.instances)

    def _prefix_kv(self, spec: PoolSpec, blocks: int, key: str):
        """A factory of prefix-caching KV pools for this pool's instances (checks the sizes once)."""
        pc = spec.prefix_cache
        if pc.capacity_blocks is not None and pc.capacity_blocks > blocks:
            raise ConfigError(f"larger than the KV pool ({blocks} blocks per instance)",
                              key=f"{key}.prefix_cache.capacity_blocks", value=pc.capacity_blocks)
        host_blocks, host_bw = 0, 0.0
        if pc.host is not None:
            # the host tier holds whole blocks (every GPU's shard); each GPU copies its shard over its own link
            host_blocks = int(pc.host.capacity_GiB * GiB // self.instance_block_bytes)
            if host_blocks < 1:
                raise ConfigError(f"smaller than one KV block ({self.instance_block_bytes:,.0f} bytes)",
                                  key=f"{key}.prefix_cache.host.capacity_GiB", value=pc.host.capacity_GiB)
            host_bw = pc.host.bandwidth_GBps * 1e9
        return lambda: PrefixKVCache(blocks, spec.block_size, spec.watermark, pc.capacity_blocks, host_blocks,
                                     host_bw, self.block_bytes)


class _Serving:
    """What both topologies share: dispatch to live instances, failures and recovery, abandonment."""

    autoscaler = None

    def _setup_common(self):
        self.by_name = {i.name: i for i in self.instances}
        self.backlog: list[Request] = []      # arrived while every entry instance was down
        self.fault_log: list[dict] = []

    def _dispatch(self, req: Request, admit: bool = True) -> None:
        live = [i for i in self.entry if not i.down]
        if not live:
            q = self.entry[0].pool_spec.max_queue
            if admit and q is not None and len(self.backlog) >= q * len(self.entry):
                return self.sink.rejected(req, f"admission: every {self.entry[0].pool} instance is down and "
                                          f"{len(self.backlog)} requests wait (max_queue {q} per instance)")
            self.backlog.append(req)
            return
        inst = self.router(live, req)
        q = inst.pool_spec.max_queue
        if admit and q is not None and len(inst.waiting) >= q:
            return self.sink.rejected(req, f"admission: {inst.name} has {len(inst.waiting)} requests queued "
                                      f"(max_queue {q})")
        inst.submit(req)

    def drained(self, inst) -> None:
        """A draining instance finished everything it held (autoscaler.py): it leaves."""
        self.autoscaler.drained(inst)

    def fail_instance(self, inst, until_s: float) -> None:
        handing_off = len(self._in_handoff(inst))     # prefilled, KV held here for a hand-off: lost too
        lost = inst.fail()
        self.fault_log.append({"instance": inst.name, "at_s": self.env.now, "until_s": until_s,
                               "requests_lost": len(lost) + handing_off})
        self._after_failure(inst, lost)
        if inst.draining:        # scaled in and now holding nothing: the drain is complete, it leaves
            self.autoscaler.drained(inst)
        elif self.autoscaler is not None:       # the pool's timeline: one fewer serving
            self.autoscaler.by_pool[inst.pool].record(self.env.now)

    def _in_handoff(self, inst) -> list:
        return []

    def _after_failure(self, inst, lost) -> None:
        for r in lost:
            self._dispatch(r, admit=False)

    def recover_instance(self, inst) -> None:
        inst.recover()
        if self.autoscaler is not None:
            self.autoscaler.by_pool[inst.pool].record(self.env.now)
        backlog, self.backlog = self.backlog, []
        for r in backlog:
            self._dispatch(r, admit=False)

    def client_view(self, client, timeout_s) -> None:
        """What the client counts as its first token (``client.ttft_at``; None: the default client)."""

    def has_first_token(self, req: Request) -> bool:
        """Whether the client has seen its first token (then a timeout no longer abandons the request)."""
        return req.generated > 0

    def abandon(self, req: Request) -> None:
        """The client gave up (no first token by workload.timeout_s)."""
        if req.status != UNFINISHED or self.has_first_token(req):
            return
        if req in self.backlog:
            self.backlog.remove(req)
        elif req in getattr(self, "decode_backlog", ()):
            self.decode_backlog.remove(req)
        elif not req.instance:
            pass                                        # still in the engine's front end: never routed
        else:
            # where it is queued or running: a decode instance that took its KV, or the instance it was sent to
            here = [i for i in (self.by_name.get(req.decode_instance), self.by_name.get(req.instance))
                    if i is not None and (req in i.running or req in i.waiting)]
            if not here or not here[0].drop(req):
                return
            self._dropped(here[0])
        req.status, req.finish_s = ABANDONED, self.env.now
        self.sink.finished(req)

    def _dropped(self, inst) -> None:
        """An abandoned request left ``inst`` (its blocks are free again)."""


class Colocated(_Serving):
    kind = "colocated"

    def __init__(self, env, name: str, spec: ColocatedSpec, ctx, sink):
        self.env, self.name, self.spec, self.sink = env, name, spec, sink
        a = spec.autoscaler
        self.pools = [Pool(env, name, "replica", "both", spec, spec.replicas, ctx, self, f"topologies.{name}",
                           a.replicas.max if a is not None else None)]
        self.instances = self.pools[0].instances
        self.entry = self.instances
        self.frontend_s = self.pools[0].frontend_s
        self.router = make_router(spec, self.pools[0], f"topologies.{name}")
        self.links = []
        self._setup_common()

    def route(self, req: Request) -> None:
        kv = self.instances[0].kv
        if not kv.fits_ever(req.prompt_tokens + req.output_tokens - 1):
            return self.sink.rejected(req, "kv_capacity: prompt+output needs "
                                      f"{kv.blocks_for(req.prompt_tokens + req.output_tokens - 1)} KV blocks, "
                                      f"an instance has {_cap(kv)}")
        self._dispatch(req)

    # instance callbacks
    def first_token(self, req):
        pass

    def finished(self, req, inst):
        self.sink.finished(req)

    def prefill_done(self, req, inst):  # pragma: no cover - colocated instances never hand off
        raise AssertionError("colocated instance handed off a request")


class KVLink:
    """A FIFO link (one transfer at a time at full bandwidth): contention shows up as queueing."""

    def __init__(self, env, name: str, bandwidth_Bps: float, latency_s: float):
        self.name, self.bandwidth_Bps, self.latency_s = name, bandwidth_Bps, latency_s
        self.res = simpy.Resource(env, capacity=1)
        self.busy_s = 0.0
        self.bytes = 0.0
        self.transfers = 0
        self.free_at = 0.0                 # when the last transfer left the link (layer-wise overlap)
        self.factor = 1.0                  # bandwidth fraction (faults.links); 0 = down
        self.restored = env.event()        # fires when a down link comes back
        self.changed = env.event()         # fires when the speed changes (transfers in flight re-rate)

    def degrade(self, env, fraction: float) -> None:
        """Run at ``fraction`` of the bandwidth (faults.link_factor: the worst active link fault's)."""
        if fraction == self.factor:
            return
        self.factor = fraction
        changed, self.changed = self.changed, env.event()
        changed.succeed()
        if fraction > 0 and not self.restored.triggered:
            self.restored.succeed()
        elif fraction == 0 and self.restored.triggered:
            self.restored = env.event()


class Disaggregated(_Serving):
    kind = "disaggregated"

    def __init__(self, env, name: str, spec: DisaggregatedSpec, ctx, sink):
        self.env, self.name, self.spec, self.sink = env, name, spec, sink
        key = f"topologies.{name}"
        self.model = ctx.model
        a = spec.autoscaler
        self.prefill = Pool(env, name, "prefill", "prefill", spec.prefill, spec.prefill.instances, ctx, self,
                            f"{key}.prefill", a.prefill.max if a is not None else None)
        self.decode = Pool(env, name, "decode", "decode", spec.decode, spec.decode.instances, ctx, self,
                           f"{key}.decode", a.decode.max if a is not None else None)
        self.pools = [self.prefill, self.decode]
        self.instances = self.prefill.instances + self.decode.instances
        self.frontend_s = self.prefill.frontend_s      # the engine that receives a request first
        if spec.decode.frontend_latency_ms:
            raise ConfigError("a decode pool never receives a request from a client: set frontend_latency_ms "
                              "on the prefill pool", key=f"{key}.decode.frontend_latency_ms",
                              value=spec.decode.frontend_latency_ms)
        self.router = make_router(spec, self.prefill, key)
        self.assign = ASSIGNERS[spec.assignment]()
        link = spec.kv_link
        # every GPU of a prefill instance sends its own KV shard in parallel: under pipeline parallelism
        # each stage's tp GPUs send their stage's layers, so tp x pp links at once (bytes unchanged)
        bw = link.bandwidth_GBps * 1e9 * spec.prefill.gpus_per_instance
        split = self.prefill.pp_layers
        if split is not None and len(set(split)) > 1:
            # uneven stages: the stage with the most layers sends the largest share (max n_j / L of the bytes
            # over its tp links) and finishes last, i.e. tp x L / max n_j links' worth (tp x pp when even)
            bw = link.bandwidth_GBps * 1e9 * spec.prefill.tp * sum(split) / max(split)
        if link.shared:
            shared = KVLink(env, "kv-link", bw, link.latency_us * 1e-6)
            self.links = [shared]
            self.link_of = {i.name: shared for i in self.prefill.instances}
        else:
            self.links = [KVLink(env, f"kv-link-{i.name}", bw, link.latency_us * 1e-6) for i in self.prefill.instances]
            self.link_of = {i.name: l for i, l in zip(self.prefill.instances, self.links)}
        self.kv_bytes_per_token = ctx.model.kv_bytes_per_token(ctx.kv_dtype)
        # sliding-window layers send only their window: min(tokens, W) tokens of their KV
        self.window, self.window_kv_bytes = ctx.model.window, ctx.model.sliding_kv_bytes_per_token(ctx.kv_dtype)
        self.pending = {d.name: [] for d in self.decode.instances}   # reservations waiting for blocks
        self.entry = self.prefill.instances
        self.decode_up: list = []          # hand-offs waiting for any decode instance to come back
        self.decode_backlog: list = []     # failed-over requests to recompute on decode, none up
        self.xfer_hit: dict[int, int] = {}  # request id -> tokens the chosen decode instance holds already
        # request id -> (its hand-off process, the prefill instance holding its KV): interrupted when the client
        # abandons it or when that instance fails (its copy is gone at once)
        self.handoffs: dict[int, tuple] = {}
        self.placed: dict = {}              # request id -> the DP-balanced decode instance it waits on a rank of
        # request id -> the decode instance holding a reservation for its KV (from the reservation until the
        # KV is in place): its hand-off is interrupted the moment that instance fails
        self.reserved_on: dict[int, Instance] = {}
        self.decode_first = True           # client.ttft_at: first_decode_token (client_view)
        self.transfer_bytes_saved = 0.0
        self._setup_common()

    def route(self, req: Request) -> None:
        pkv, dkv = self.prefill.instances[0].kv, self.decode.instances[0].kv
        if not pkv.fits_ever(req.prompt_tokens):
            return self.sink.rejected(req, f"kv_capacity: prompt needs {pkv.blocks_for(req.prompt_tokens)} "
                                      f"KV blocks, a prefill instance has {_cap(pkv)}")
        if not dkv.fits_ever(req.prompt_tokens + req.output_tokens - 1):
            return self.sink.rejected(req, "kv_capacity: prompt+output needs "
                                      f"{dkv.blocks_for(req.prompt_tokens + req.output_tokens - 1)} KV blocks, "
                                      f"a decode instance has {_cap(dkv)}")
        self._dispatch(req)

    def first_token(self, req):
        pass

    def client_view(self, client, timeout_s) -> None:
        """Behind a PD proxy (``ttft_at: first_decode_token``, the default) the client's first token is the
        decode instance's first: a request prefilled but not yet decoded by ``timeout_s`` is abandoned, its
        hand-off given up (decode reservation and prefill copy freed) or its decode slot dropped.  So that a
        timeout lands between steps as it does step by step, a decode instance then runs a request's first
        decode step on its own (no fast-path window holds a request that has no decode token yet)."""
        self.decode_first = client is None or client.ttft_at == "first_decode_token"
        if self.decode_first and timeout_s is not None:
            for d in self.decode.instances:
                d.hold_first_decode = True

    def has_first_token(self, req: Request) -> bool:
        if self.decode_first and req.output_tokens > 1:
            return req.decode_first_s == req.decode_first_s        # not NaN: the decode side streamed one
        return req.generated > 0

    def abandon(self, req: Request) -> None:
        if req.status == HANDOFF:
            if self.has_first_token(req):
                return
            h = self.handoffs.get(req.id)
            if h is None:         # its hand-off process was created at this instant and starts first
                self.env.timeout(0).callbacks.append(lambda _ev: self.abandon(req))
            else:
                h[0].interrupt("abandoned")
            return
        super().abandon(req)

    def _dropped(self, inst) -> None:
        if inst.role == "decode":
            self.on_decode_freed(inst)

    def finished(self, req, inst):
        if inst.role == "decode":
            self.on_decode_freed(inst)
        self.sink.finished(req)

    def prefill_done(self, req, inst):
        self.env.process(self._handoff(req, inst))

    def _reserve(self, dec, req):
        """Blocks on the decode side for the arriving KV; FIFO per decode instance."""
        if dec.down:
            return False
        if dec.balanced and req.id not in dec.awaiting:
            # its rank there, fixed from its first try on this instance (TensorRT-LLM places a generation
            # request as it fetches it, then waits for that rank's blocks); KV on the wire and hand-offs
            # already waiting there count.  The KV lands in that rank's pool.
            self._unplace(req)
            req.rank = assign_rank(req, dec.running + dec.inbound + list(dec.awaiting.values()), dec.waiting,
                                   dec.policy.ranks)
            dec.awaiting[req.id] = req
            self.placed[req.id] = dec
        if len(dec.running) + dec.reserved_count >= dec.limits.max_running:
            return False
        dec.sync()
        # kv_reservation full: the decode side takes blocks for the whole sequence as it reserves
        total = max(req.computed, final_kv_tokens(req)) if dec.limits.reserve_full else req.computed
        if dec.kv.prefix_on:     # cache-aware transfer: blocks the decode instance holds are not sent
            hit = dec.kv.reserve_prefix(req, req.computed, total)
            if hit is None:
                return False
            self.xfer_hit[req.id] = hit
        elif not dec.kv.reserve(req, total):
            return False
        if dec.balanced:
            self._unplace(req)
            dec.inbound.append(req)
        dec.blocks_taken()   # fewer free blocks: the decode window may not grow as planned
        return True

    def _unplace(self, req) -> None:
        """A hand-off no longer waiting on the rank a DP-balanced decode instance placed it on."""
        d = self.placed.pop(req.id, None)
        if d is not None:
            d.awaiting.pop(req.id, None)

    def _pick_decode(self, req):
        live = [d for d in self.decode.instances if not d.down]
        return self.assign(live, req) if live else None

    def _handoff(self, req: Request, src: Instance):
        env = self.env
        self.handoffs[req.id] = (env.active_process, src)
        t_ready = env.now
        src_epoch = src.epoch
        src_blocks = req.blocks
        req.blocks = 0                     # the decode side's allocation starts from zero
        link = self.link_of[src.name]
        kv_tokens = req.computed
        dec, dec_epoch, reserved, sending, sent = None, -1, False, False, [0.0]
        try:
            while True:
                # back-pressure: wait for decode blocks while the prefill side keeps holding this KV
                dec = self._pick_decode(req)
                while dec is None or not self._reserve(dec, req):
                    ev = env.event()
                    (self.decode_up if dec is None else self.pending[dec.name]).append(ev)
                    yield ev
                    if src.epoch != src_epoch:
                        return self._lost_on_prefill(req)
                    if dec is None or dec.down:
                        dec = self._pick_decode(req)
                dec_epoch = dec.epoch
                dec.reserved_count += 1
                reserved = True
                self.reserved_on[req.id] = dec
                sent = [0.0]               # bytes this transfer put on the wire (a cut one counts them too)
                try:
                    with link.res.request() as slot:
                        yield slot
                        while link.factor == 0.0 and src.epoch == src_epoch:   # link down: KV waits on the P side
                            yield link.restored
                        if src.epoch != src_epoch:    # the prefill copy died while it waited: nothing to send
                            reserved = False
                            self._unreserve(dec, dec_epoch, req)
                            return self._lost_on_prefill(req)
                        t_start = env.now
                        hit = self.xfer_hit.pop(req.id, 0)
                        bytes_ = (kv_tokens - hit) * self.kv_bytes_per_token    # only the missing blocks' tokens
                        if self.window is not None:     # (no prefix cache with sliding layers: hit is 0)
                            bytes_ += min(kv_tokens, self.window) * self.window_kv_bytes
                        rate = link.bandwidth_Bps * link.factor
                        early_s = self._overlap_s(req, link, bytes_ / rate, t_start, t_ready)
                        # the overlapped layers were on the wire during the prefill, while the link was idle
                        link.busy_s += early_s
                        sent[0] = early_s * rate
                        sending = True
                        yield from self._send(link, bytes_ - early_s * rate, sent)
                        sending = False
                        link.free_at = env.now
                        xfer_s = env.now - t_start
                        link.bytes += bytes_
                        link.transfers += 1
                        if hit:
                            self.transfer_bytes_saved += hit * self.kv_bytes_per_token
                except simpy.Interrupt as stop:
                    if stop.cause != "decode lost":
                        raise
                    # the decode instance failed (_after_failure): its reservation went with its memory.  The
                    # hand-off stops now, wherever it was (queued for the link, waiting for it to come back, on
                    # the wire: cut off, the link free at once) and sends the KV, still held here, elsewhere
                    if sending:
                        sending = False
                        link.free_at = env.now
                        link.bytes += sent[0]
                    self.xfer_hit.pop(req.id, None)
                    req.fault_hits += 1              # a failure took its decode reservation: it is delayed
                    del self.reserved_on[req.id]    # (until it reserves again: a failure now concerns others)
                    reserved = False
                    self._unreserve(dec, dec_epoch, req)
                    continue
                del self.reserved_on[req.id]
                req.kv_transfer_s = xfer_s
                req.kv_wait_s = t_start - t_ready
                if src.epoch != src_epoch:     # the prefill instance failed: its copy is gone
                    reserved = False
                    self._unreserve(dec, dec_epoch, req)
                    return self._lost_on_prefill(req)
                break
        except simpy.Interrupt as stop:
            # the client gave up before its first decode token (abandon), or the prefill instance holding the
            # KV failed (_after_failure): nothing of this hand-off stays
            if sending:                      # a transfer cut off mid-way: the link is free from now
                link.free_at = env.now
                link.bytes += sent[0]        # what it had sent crossed the link
            self.xfer_hit.pop(req.id, None)
            if reserved:
                self._unreserve(dec, dec_epoch, req)
            if stop.cause == "lost":          # the copy went with the instance's memory: prefill again
                req.blocks = 0
                return self._lost_on_prefill(req)
            if src.epoch == src_epoch:       # the prefill side frees its copy
                req.blocks = src_blocks
                src.kv.release(req)
                src.wake()
            req.blocks = 0
            req.status, req.finish_s = ABANDONED, env.now
            self.sink.finished(req)
            return
        finally:
            self.handoffs.pop(req.id, None)
            self.reserved_on.pop(req.id, None)
            self._unplace(req)
        # the prefill side frees its copy; the decode side starts
        held = req.blocks
        req.blocks = src_blocks
        src.kv.release(req)
        src.wake()
        req.blocks = held
        dec.reserved_count -= 1
        if dec.balanced:
            dec.inbound.remove(req)
        req.status = UNFINISHED
        req.decode_start_s = env.now
        dec.accept(req)

    def _send(self, link, left: float, sent: list):
        """Put ``left`` bytes on the link at its current speed, then its latency (both count in the link's
        busy time).  A fault that changes the speed mid-transfer applies at once to the bytes still to send
        (bytes left / new rate); a link that goes down pauses the transfer until it is back.  ``sent[0]``
        grows by the bytes put on the wire as they go (a transfer cut off mid-way counts what it sent)."""
        env = self.env
        while left > 0.0:
            if link.factor == 0.0:
                yield link.restored
                continue
            rate = link.bandwidth_Bps * link.factor
            t0 = env.now
            done = env.timeout(left / rate)
            try:
                yield done | link.changed
            finally:                 # (an abandoned hand-off is interrupted here: what it sent counts)
                link.busy_s += env.now - t0
                moved = left if done.processed else min(left, rate * (env.now - t0))
                sent[0] += moved
            left -= moved
        t0 = env.now
        try:
            yield env.timeout(link.latency_s)
        finally:                     # (a transfer cut off in its latency counts the part it waited)
            link.busy_s += env.now - t0

    def _overlap_s(self, req: Request, link, wire_s: float, t_start: float, t_ready: float) -> float:
        """``kv_link.layerwise_overlap``: the wire seconds of this transfer sent while its prefill still ran.

        Layer l's KV is ready at prefill start + compute x l / L, so layers 1..L-1 may leave during the
        prefill (under pipeline parallelism each stage's own layers over its own links, see below), and only
        while the link was idle (since ``link.free_at``, its previous transfer's end).  A
        transfer that does not start the moment its prefill ends (it queued behind the link, waited for
        decode blocks or for a link that was down) overlaps nothing, nor does a prefill done again after
        a failure (its compute window is not the first prefill's).  The latency is never overlapped."""
        if not self.spec.kv_link.layerwise_overlap or t_start != t_ready or req.prefill_end_s != t_ready:
            return 0.0
        L = self.model.layers
        compute_s = req.prefill_end_s - req.prefill_start_s
        split = self.prefill.pp_layers
        if split is None:
            idle_s = req.prefill_end_s - max(req.prefill_start_s + compute_s / L, link.free_at)
            return min(wire_s * (L - 1) / L, max(0.0, idle_s))
        # Pipeline: stage j's GPUs hold and send only its n_j layers, over its own tp links, and compute them
        # only during its part of the prefill.  ASSUMPTION (as at pp = 1): the layers take compute / L each,
        # so stage j computes from start + c_j tau (c_j: the layers before it) to start + (c_j + n_j) tau
        # (exact for constant / linear stages, which cost n_j / L of a lone prefill each).  Every layer's KV
        # is bytes / L and the link's speed is the busiest stage's (n_max layers on its tp links), so one
        # layer takes w = wire_s / n_max on any stage's links.  Stage j's k-th layer is ready at a_j + k tau and
        # leaves after its (k-1)-th, from link.free_at on (the previous transfer's end); its last one lands at
        #     max(free_at + n_j w, a_j + tau + n_j w, a_j + n_j tau + w)
        # (the k = 1 and k = n_j terms of max_k a_j + k tau + (n_j - k + 1) w, linear in k).  The transfer ends
        # with its slowest stage (the latency after it, never overlapped); the rest is what was sent early.
        tau = compute_s / L
        w = wire_s / max(split)
        done = req.prefill_end_s + w          # the last stage's last layer leaves once the prefill ends
        c = 0
        for n in split:
            a = req.prefill_start_s + c * tau
            c += n
            end = req.prefill_end_s if c == L else req.prefill_start_s + c * tau
            done = max(done, link.free_at + n * w, a + tau + n * w, end + w)
        return max(0.0, wire_s - (done - req.prefill_end_s))

    def _unreserve(self, dec, dec_epoch: int, req: Request) -> None:
        """Give back a decode reservation (unless the decode instance lost it in a failure)."""
        if dec.epoch == dec_epoch:
            dec.cut()                  # blocks come back: the next plan may change (sync first)
            dec.reserved_count -= 1
            if dec.balanced:
                dec.inbound.remove(req)
            dec.kv.release(req)
            dec.wake()
            self.on_decode_freed(dec)
        req.blocks = 0

    def _lost_on_prefill(self, req: Request) -> None:
        """KV lost with a failed instance before it reached decode: prefill again (recompute) the prompt
        and the token it generated; as for a request lost on decode, one too long for a prefill instance
        now (the prompt filled its pool to the last block: prompt + 1 needs one more) recomputes on decode."""
        self._unplace(req)                 # (no longer waiting on a decode rank: it must not count itself there)
        req.recomputed_tokens += req.computed
        req.fault_recomputed_tokens += req.computed
        req.computed = 0
        req.blocks = 0
        req.fault_hits += 1
        req.status = UNFINISHED
        if not self.prefill.instances[0].kv.fits_ever(req.known):
            self._recompute_on_decode(req)
        else:
            self._dispatch(req, admit=False)

    def _in_handoff(self, inst) -> list:
        """Requests whose KV ``inst`` holds for a hand-off (waiting for decode blocks or the link, or on
        the wire)."""
        return [rid for rid, (_, src) in self.handoffs.items() if src is inst]

    def _after_failure(self, inst, lost) -> None:
        if inst.role == "decode":
            inst.reserved_count = 0          # reservations vanished with its memory
            inst.inbound = []
            inst.awaiting = {}               # (hand-offs waiting there are placed again wherever they go)
            # hand-offs holding one stop now (queued for the link or on the wire) and pick another instance
            for rid in [rid for rid, d in self.reserved_on.items() if d is inst]:
                self.handoffs[rid][0].interrupt("decode lost")
            self.on_decode_freed(inst)                       # waiting hand-offs pick another instance
        else:
            # hand-offs from this instance lost their KV: they stop now (a transfer in flight is cut off,
            # a decode reservation given back) and prefill again (_lost_on_prefill)
            for rid in self._in_handoff(inst):
                self.handoffs[rid][0].interrupt("lost")
        pkv = self.prefill.instances[0].kv
        for r in lost:   # prefill: restart; decode: its KV is gone, prefill prompt + generated again
            if inst.role == "decode" and not pkv.fits_ever(r.known):
                self._recompute_on_decode(r)   # too long for a prefill instance now: recompute on decode
            else:
                self._dispatch(r, admit=False)

    def _recompute_on_decode(self, req: Request) -> None:
        live = [d for d in self.decode.instances if not d.down]
        if not live:
            self.decode_backlog.append(req)
            return
        self.assign(live, req).submit(req)

    def recover_instance(self, inst) -> None:
        super().recover_instance(inst)
        if inst.role == "decode":
            backlog, self.decode_backlog = self.decode_backlog, []
            for r in backlog:
                inst.submit(r)
            waiters, self.decode_up = self.decode_up, []
            for ev in waiters:
                ev.succeed()

    def on_decode_freed(self, dec):
        waiters, self.pending[dec.name] = self.pending[dec.name], []
        for ev in waiters:
            ev.succeed()


def build(name: str, spec, env, ctx, sink):
    if isinstance(spec, ColocatedSpec):
        return Colocated(env, name, spec, ctx, sink)
    return Disaggregated(env, name, spec, ctx, sink)
