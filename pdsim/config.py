"""The scenario tree: one typed, validated config; unknown keys are errors with a did-you-mean.

``load(path, overrides)`` reads YAML, applies ``--set a.b=c`` overrides, and
validates once.  Building a config has no side effects.  Every validation
problem becomes one :class:`~pdsim.errors.ConfigError` naming the file, the
dotted key and the value.
"""
from __future__ import annotations

import difflib
import math
import re
from pathlib import Path
from typing import Annotated, Any, Literal, Union

import yaml
from pydantic import BaseModel, ConfigDict, Discriminator, Field, StrictInt, Tag, ValidationError, model_validator

from .errors import ConfigError

PosFloat = Annotated[float, Field(gt=0, allow_inf_nan=False)]
NonNegFloat = Annotated[float, Field(ge=0, allow_inf_nan=False)]
PosInt = Annotated[int, Field(gt=0, le=10**9)]

#: bounds that keep a run inside memory and floating point: beyond them a value is a typo
MAX_REQUESTS = 10_000_000        # Request objects in memory; a 10M-request run is hours of wall time
MAX_RATE = 1e6                   # requests/s, far above any cluster modelled; beyond it arrivals collapse onto t=0
MAX_INSTANCES = 4096             # replicas / instances per pool
Requests = Annotated[int, Field(gt=0, le=MAX_REQUESTS)]
Instances = Annotated[int, Field(gt=0, le=MAX_INSTANCES)]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class KeyProblem(ValueError):
    """A check of a whole mapping that blames one key below it: ``validation_error`` names that key
    (``path``, relative to the mapping) and the value the input gave it, not just the mapping."""

    def __init__(self, path: str | tuple, message: str):
        self.path = (path,) if isinstance(path, str) else tuple(path)
        self.message = message
        super().__init__(message)


# --- model -------------------------------------------------------------------
class InlineModel(_Strict):
    name: str = "custom"
    layers: PosInt
    hidden: PosInt
    heads: PosInt
    kv_heads: PosInt
    head_dim: PosInt | None = None
    mlp_width: PosInt
    vocab: PosInt
    tied_embeddings: bool = False
    gated_mlp: bool = True
    max_context: PosInt = 4096
    # mixture of experts (pdsim/models.py): routed experts, top-k, shared experts, expert MLP width,
    # the first dense_layers layers keep a dense MLP of mlp_width
    experts: Annotated[int, Field(ge=0, le=10**6)] = 0
    experts_per_token: Annotated[int, Field(ge=0, le=10**6)] = 0
    shared_experts: Annotated[int, Field(ge=0, le=10**6)] = 0
    expert_width: Annotated[int, Field(ge=0, le=10**9)] = 0
    dense_layers: Annotated[int, Field(ge=0, le=10**9)] = 0
    # multi-head latent attention: KV cache = kv_lora_rank + qk_rope_head_dim per token per layer
    q_lora_rank: Annotated[int, Field(ge=0, le=10**9)] = 0
    kv_lora_rank: Annotated[int, Field(ge=0, le=10**9)] = 0
    qk_rope_head_dim: Annotated[int, Field(ge=0, le=10**9)] = 0
    qk_nope_head_dim: Annotated[int, Field(ge=0, le=10**9)] = 0
    v_head_dim: Annotated[int, Field(ge=0, le=10**9)] = 0
    # sliding-window attention: sliding_layers of the layers attend to the last sliding_window tokens only
    sliding_window: Annotated[int, Field(ge=1, le=10**9)] | None = None
    sliding_layers: Annotated[int, Field(ge=0, le=10**9)] = 0
    # multi-token-prediction modules (Hugging Face num_nextn_predict_layers): needed by speculative method: mtp
    mtp_layers: Annotated[int, Field(ge=0, le=1024)] = 0


# --- cost model and pools ----------------------------------------------------------
class CostModelSpec(_Strict):
    """``roofline`` (model x device profile), or ``constant`` / ``linear`` for theory and what-if runs."""
    kind: Literal["roofline", "constant", "linear"] = "roofline"
    step_s: PosFloat | None = None
    base_s: NonNegFloat = 0.0
    per_token_s: NonNegFloat = 0.0
    per_kv_token_s: NonNegFloat = 0.0
    # roofline: take routed-expert times from the device profile's measured MoE tables (imported profiles)
    # where they have the layer's shape; off by default (README, "Measured MoE tables": end to end they
    # make DeepSeek fp8 serving too slow)
    moe_tables: bool = False
    # roofline: MLA attention and the MoE all-to-all from the profile's measured MLA / DeepEP tables where they
    # have the pool's shape (README, "Mixture of experts and MLA": MLA on by default, the all-to-all opt-in
    # because end to end it makes DeepSeek EP serving too slow)
    mla_tables: bool = True
    a2a_tables: bool = False

    @model_validator(mode="after")
    def _need(self):
        if self.kind == "constant" and self.step_s is None:
            raise ValueError("kind: constant needs step_s (seconds per step)")
        if self.kind == "linear" and self.base_s == self.per_token_s == self.per_kv_token_s == 0:
            raise ValueError("kind: linear needs base_s, per_token_s or per_kv_token_s > 0")
        return self


class ChunkedPrefillSpec(_Strict):
    token_budget: PosInt = 512


class AttentionDPBalanceSpec(_Strict):
    """TensorRT-LLM's attention-DP balance (``attention_dp_config: {enable_balance: true, ...}``): new prompts wait
    until every attention rank has one to start, or ``timeout_iters`` steps have passed without that (the count
    runs on every step, prompts waiting or not, and restarts when it lets prompts through); once every rank
    has one, up to ``batching_wait_iters`` more steps while every rank also decodes.  Defaults: TensorRT-LLM's."""
    timeout_iters: Annotated[int, Field(ge=0, le=1_000_000)] = 50
    batching_wait_iters: Annotated[int, Field(ge=0, le=1_000_000)] = 10


class BatchWaitSpec(_Strict):
    """TensorRT-LLM's batch waiting (``batch_wait_timeout_iters``, ``batch_wait_max_tokens_ratio``; TP pools only):
    while decodes run, new prompts wait until the step would carry at least ``max_tokens_ratio`` x the token
    budget (decodes plus the waiting prompts that fit, each prompt counted whole) or ``timeout_iters`` such
    steps have passed.  Defaults 0 (TensorRT-LLM's: off)."""
    timeout_iters: Annotated[int, Field(ge=0, le=1_000_000)] = 0
    max_tokens_ratio: float = Field(0.0, ge=0, le=1, allow_inf_nan=False)


class StepOverheadSpec(_Strict):
    """Per-step engine CPU/scheduling overhead: base + per_seq x batch + per_token x tokens (+ tp_extra if tp > 1),
    plus, for a step holding prompt tokens, prefill_per_layer x layers + prefill_per_moe_layer x MoE layers.
    Each key left out comes from the pool's ``engine`` preset (0 without one)."""
    base_us: NonNegFloat | None = None
    per_seq_us: NonNegFloat | None = None
    per_token_us: NonNegFloat | None = None
    tp_extra_us: NonNegFloat | None = None
    # CPU dispatch of a step holding prompt tokens (eager prefill): per layer, and extra per MoE layer
    prefill_per_layer_us: NonNegFloat | None = None
    prefill_per_moe_layer_us: NonNegFloat | None = None

class HostTierSpec(_Strict):
    """A host-memory KV tier per instance: blocks evicted from GPU wait here, hits load back over PCIe."""
    capacity_GiB: PosFloat
    bandwidth_GBps: PosFloat            # per GPU of the instance, host -> GPU


class PrefixCacheSpec(_Strict):
    """Automatic prefix caching on KV blocks (kvcache.PrefixKVCache)."""
    enabled: bool = True
    capacity_blocks: PosInt | None = None    # GPU blocks that may hold unreferenced cached prefixes (default: all free)
    host: HostTierSpec | None = None


class AcceptanceDistSpec(_Strict):
    """Per-request acceptance rate drawn once per request: ``uniform`` in [low, high], or ``beta``
    with the given mean and std (std**2 < mean*(1-mean))."""
    dist: Literal["uniform", "beta"]
    low: float | None = Field(None, ge=0, le=1)
    high: float | None = Field(None, ge=0, le=1)
    mean: float | None = Field(None, gt=0, lt=1)
    std: float | None = Field(None, gt=0, lt=0.5)

    @model_validator(mode="after")
    def _need(self):
        if self.dist == "uniform":
            if self.low is None or self.high is None or self.high < self.low:
                raise ValueError(f"dist: uniform needs 0 <= low <= high <= 1 (got low={self.low}, high={self.high})")
        elif self.mean is None or self.std is None or self.std ** 2 >= self.mean * (1 - self.mean):
            raise ValueError(f"dist: beta needs mean in (0, 1) and std**2 < mean*(1-mean) "
                             f"(got mean={self.mean}, std={self.std})")
        return self


#: an acceptance rate or a distribution of them: a mapping is a distribution, anything else a number, so each
#: reports its own error (a plain union answered "Input should be a valid number" to a bad distribution)
Acceptance = Annotated[
    Union[Annotated[Annotated[float, Field(ge=0, le=1, allow_inf_nan=False)], Tag("acceptance-rate")],
          Annotated[AcceptanceDistSpec, Tag("acceptance-dist")]],
    Discriminator(lambda v: "acceptance-dist" if isinstance(v, (dict, AcceptanceDistSpec)) else "acceptance-rate")]


class SpeculativeSpec(_Strict):
    """Speculative decoding of a decode-capable pool (pdsim/speculative.py): each decode step drafts
    ``k`` tokens and verifies them in one (k+1)-token-per-request step of the target model."""
    method: Literal["draft", "mtp"] = "draft"
    k: Annotated[int, Field(ge=1, le=32)] = 3
    # probability that each drafted token is accepted, i.i.d. per position (a constant, or per request)
    acceptance: Acceptance = 0.7
    draft_model: str | InlineModel | None = None    # a model preset or an inline shape (method: draft)
    # one draft step costs this fraction of a plain target decode step of the same batch
    # (instead of pricing the draft model / MTP head on the device)
    draft_cost_fraction: Annotated[float, Field(gt=0, le=10, allow_inf_nan=False)] | None = None

    @model_validator(mode="after")
    def _need(self):
        if self.method == "draft" and self.draft_model is None and self.draft_cost_fraction is None:
            raise ValueError("method: draft needs draft_model (a model preset) or draft_cost_fraction")
        if self.method == "mtp" and self.draft_model is not None:
            raise ValueError("method: mtp drafts with the target's own MTP head: leave draft_model out")
        return self


class PoolSpec(_Strict):
    """One kind of serving instance: device, tensor parallelism, batching limits, memory."""
    instances: Instances = 1
    tp: PosInt = 1
    device: str = "h100-sxm"
    scheduler: Literal["fcfs", "chunked", "inflight"] = "fcfs"
    chunked_prefill: ChunkedPrefillSpec | None = None
    max_running: PosInt = 256
    max_batched_tokens: PosInt = 8192
    gpu_memory_utilization: float = Field(0.9, gt=0, le=1)
    activation_reserve_GiB: NonNegFloat = 2.0
    block_size: PosInt = 16
    kv_blocks: PosInt | None = None          # override the pool size computed from memory
    ep: PosInt = 1                           # expert parallelism: routed experts sharded over ep of the tp GPUs
    # pipeline parallelism (pdsim/pipeline.py): pp stages of tp GPUs each (an instance has tp x pp GPUs),
    # each holding L / pp layers (uneven L: vLLM's default split, models.pp_split, or pp_layers: one count per
    # stage, checked against the model in models.validate_pp); micro_batches in flight (default pp, as vLLM's
    # virtual engines)
    pp: Annotated[int, Field(ge=1, le=1024)] = 1
    pp_layers: list[StrictInt] | None = None     # (strict: `true` or 16.0 is not a layer count)
    micro_batches: Annotated[int, Field(ge=1, le=4096)] | None = None
    # DP attention (MoE, ep = tp): each GPU an attention rank with its own requests' KV, experts over all
    dp_attention: bool = False
    # with DP attention: each request keeps one rank (the one with fewest requests when it arrives), each rank
    # its own token budget, and new prompts held as TensorRT-LLM's balance holds them (pdsim/scheduler.py)
    attention_dp_balance: AttentionDPBalanceSpec | None = None
    # TensorRT-LLM's batch waiting (scheduler.BatchWait): prompts held beside decodes until a step is full enough
    batch_wait: BatchWaitSpec | None = None
    # expert popularity: Zipf exponent (0 = uniform routing); fewer distinct experts, a hotter EP rank
    expert_skew: float = Field(0.0, ge=0, le=4, allow_inf_nan=False)
    watermark: float = Field(0.01, ge=0, lt=1)
    # KV blocks at admission: ``incremental`` (grow a block at a time, preempt when short: vLLM, SGLang)
    # or ``full`` (blocks for the whole sequence, prompt + output - 1, taken at admission, so nothing is
    # ever preempted: TensorRT-LLM's GUARANTEED_NO_EVICT capacity scheduler)
    kv_reservation: Literal["incremental", "full"] = "incremental"
    price_per_gpu_hour_usd: NonNegFloat | None = None   # default: the device profile's
    cost_model: CostModelSpec = CostModelSpec()
    # admission control: a request routed to an instance with this many queued is rejected
    max_queue: PosInt | None = None
    # serving engine (pdsim/engines.py): fills the keys above that are not given, sizes the KV
    # cache as the engine does and adds its per-step overhead; absent: the idealised engine
    engine: Literal["vllm-v1", "vllm-v0", "sglang", "trtllm"] | None = None
    step_overhead: StepOverheadSpec | None = None
    # per-request latency before the engine schedules a request (no GPU time; adds to TTFT, E2E and queue_s):
    # default the engine preset's (engines.frontend_latency_s: 0 in every preset today), 0 without one; the
    # entry pool's (colocated, or a disaggregated topology's prefill pool) counts
    frontend_latency_ms: NonNegFloat | None = None
    cuda_graph_GiB: NonNegFloat | None = None
    prefix_cache: PrefixCacheSpec | None = None
    speculative: SpeculativeSpec | None = None     # decode-capable pools only
    # per-GPU power limit (W): SM clocks, hence compute throughput, scale down (pdsim/energy.py)
    power_cap_W: PosFloat | None = None

    @model_validator(mode="after")
    def _engine_preset(self):
        if self.engine is not None:
            from .engines import apply_preset
            apply_preset(self)
        return self

    @model_validator(mode="after")
    def _dp_balance(self):
        if self.attention_dp_balance is not None:
            if not self.dp_attention:
                raise ValueError("attention_dp_balance needs dp_attention: true")
            if self.scheduler_name == "fcfs":
                raise ValueError("attention_dp_balance holds prompts beside decodes: use scheduler chunked or "
                                 "inflight (TensorRT-LLM's), not fcfs")
            if self.prefix_on:
                raise ValueError("prefix caching on a DP-balanced pool is not modelled (each attention rank caches "
                                 "its own requests' prefixes); set prefix_cache.enabled: false")
        if self.batch_wait is not None:
            if not (self.batch_wait.timeout_iters > 0 and self.batch_wait.max_tokens_ratio > 0):
                raise ValueError("batch_wait needs timeout_iters > 0 and max_tokens_ratio > 0: with either at 0 "
                                 "TensorRT-LLM's rule never holds a prompt (it lets them go when the count reaches "
                                 "0 or the step holds 0 tokens)")
            if self.dp_attention:
                raise ValueError("batch_wait is TensorRT-LLM's batch waiting, which it applies only without attention "
                                 "DP (use attention_dp_balance there)")
            if self.scheduler_name == "fcfs":
                raise ValueError("batch_wait holds prompts beside decodes: use scheduler chunked or inflight "
                                 "(TensorRT-LLM's), not fcfs")
        return self

    @model_validator(mode="after")
    def _pipeline(self):
        if self.micro_batches is not None and self.pp == 1:
            raise ValueError(f"micro_batches (={self.micro_batches}) needs pipeline parallelism (pp > 1)")
        return self

    @property
    def gpus_per_instance(self) -> int:
        return self.tp * self.pp

    @property
    def prefix_on(self) -> bool:
        return self.prefix_cache is not None and self.prefix_cache.enabled

    @property
    def scheduler_name(self) -> str:
        return "chunked" if self.chunked_prefill is not None else self.scheduler

    @property
    def token_budget(self) -> int:
        return self.chunked_prefill.token_budget if self.chunked_prefill else self.max_batched_tokens


# --- autoscaling (pdsim/autoscaler.py) -------------------------------------------------------
#: model-load bandwidth per GPU when nothing else is given: an ESTIMATE (safetensors from local NVMe or a
#: warm network cache reach a few GB/s per GPU; cold object storage is slower), not measured here
DEFAULT_LOAD_GBPS = 2.0


class ScalePoolSpec(_Strict):
    """Bounds and threshold rule of one autoscaled pool (``replicas``, ``prefill`` or ``decode``)."""
    min: Annotated[int, Field(ge=1, le=MAX_INSTANCES)] = 1
    max: Instances | None = None              # default (schedule only): the largest target
    load_GBps: PosFloat | None = None         # per GPU; default: the autoscaler's
    # policy threshold: the signal per serving instance and its bounds
    metric: Literal["queue", "outstanding_tokens", "utilization"] = "queue"
    scale_out_above: NonNegFloat | None = None
    scale_in_below: NonNegFloat | None = None
    step: Instances = 1                        # instances added or drained per threshold action


class ScheduleTargetSpec(_Strict):
    """From ``at_s`` on, the pool sizes given (``replicas`` for colocated; ``prefill`` / ``decode``)."""
    at_s: NonNegFloat
    replicas: Instances | None = None
    prefill: Instances | None = None
    decode: Instances | None = None


class SLOPlannerSpec(_Strict):
    """Policy ``slo``: forecast the arrival rate from the last ``window_s`` (``average``: its mean rate;
    ``trend``: a least-squares line extrapolated ``lead_s`` ahead, default provisioning + load time, but
    never below the mean: the trend anticipates growth, it does not cut ahead of a fall) and size each pool
    as forecast / (per-instance capacity x target_utilization)."""
    window_s: PosFloat = 60.0
    forecast: Literal["average", "trend"] = "trend"
    lead_s: NonNegFloat | None = None
    target_utilization: float = Field(0.7, gt=0, le=1)
    # prefill capacity per instance: the cost model's estimate, or prompts handed off per busy second
    prefill_capacity: Literal["estimate", "measured"] = "estimate"


class AutoscalerSpec(_Strict):
    """Pools that grow and shrink during the run: a scale-out serves ``provisioning_s`` + weights /
    ``load_GBps`` after the decision; a scale-in drains (no new requests, finishes what it holds)."""
    policy: Literal["threshold", "schedule", "slo", "mix"]
    interval_s: PosFloat = 10.0                 # how often threshold / slo look
    cooldown_s: NonNegFloat = 60.0              # no action on a pool within this of its last one (not schedule)
    # scale in only to the largest count the policy asked for over this window (Kubernetes HPA's
    # scale-down stabilization): a dip in the signal does not drain what the next look adds back
    scale_in_window_s: NonNegFloat = 120.0
    provisioning_s: NonNegFloat = 60.0          # VM / GPU allocation, paid
    load_GBps: PosFloat = DEFAULT_LOAD_GBPS     # model load per GPU (an estimate, see DEFAULT_LOAD_GBPS)
    load_s: NonNegFloat | None = None           # the load time itself (overrides weights / load_GBps)
    # policy mix: a drained instance serves in the other role this long after (engine restart, KV cache
    # re-allocated, weights kept): an ESTIMATE
    switch_s: NonNegFloat = 30.0
    replicas: ScalePoolSpec | None = None
    prefill: ScalePoolSpec | None = None
    decode: ScalePoolSpec | None = None
    schedule: list[ScheduleTargetSpec] = []
    slo: SLOPlannerSpec = SLOPlannerSpec()


def check_autoscaler(a: AutoscalerSpec, initial: dict[str, int]) -> None:
    """Pool keys, bounds, rules and schedule against the topology's pools (``initial``: name -> count).
    Fills each pool's bounds.  Raises ValueError naming the key and value."""
    names = list(initial)
    for other in ("replicas", "prefill", "decode"):
        if other not in names and getattr(a, other) is not None:
            raise ValueError(f"autoscaler.{other}: this topology has no {other} pool (pools: {', '.join(names)})")
    if a.policy == "mix" and names != ["prefill", "decode"]:
        raise ValueError("autoscaler.policy: mix switches instances between prefill and decode: it needs a "
                         "disaggregated topology")
    if a.policy != "schedule" and a.schedule:
        raise ValueError(f"autoscaler.schedule is read only by policy: schedule (policy is {a.policy})")
    if a.policy == "schedule":
        if not a.schedule:
            raise ValueError("autoscaler.schedule: policy schedule needs a list of {at_s, ...} targets")
        last = -1.0
        for i, e in enumerate(a.schedule):
            if e.at_s <= last:
                raise ValueError(f"autoscaler.schedule[{i}].at_s (={e.at_s}) must be after the previous "
                                 f"entry's (={last}): sort the entries by time")
            last = e.at_s
            for other in ("replicas", "prefill", "decode"):
                if other not in names and getattr(e, other) is not None:
                    raise ValueError(f"autoscaler.schedule[{i}].{other}: this topology has no {other} pool "
                                     f"(pools: {', '.join(names)})")
            if all(getattr(e, n) is None for n in names):
                raise ValueError(f"autoscaler.schedule[{i}]: give a target for {' or '.join(names)}")
    for n in names:
        b = getattr(a, n)
        if b is None:
            b = ScalePoolSpec()
            setattr(a, n, b)
        targets = [getattr(e, n) for e in a.schedule if getattr(e, n) is not None]
        if b.max is None and a.policy == "mix":      # the total stays the initial one
            other = [m for m in names if m != n][0]
            b.max = sum(initial.values()) - (getattr(a, other).min if getattr(a, other) is not None else 1)
        if b.max is None:
            if a.policy != "schedule":
                raise ValueError(f"autoscaler.{n}.max: policy {a.policy} needs the most instances it may run")
            b.max = max([initial[n]] + targets)
        if not b.min <= initial[n] <= b.max:
            raise ValueError(f"autoscaler.{n}: the initial count (={initial[n]}) must lie within "
                             f"min (={b.min}) and max (={b.max})")
        for i, e in enumerate(a.schedule):
            t = getattr(e, n)
            if t is not None and not b.min <= t <= b.max:
                raise ValueError(f"autoscaler.schedule[{i}].{n} (={t}) is outside min (={b.min}) and max (={b.max})")
        if a.policy == "threshold":
            if b.scale_out_above is None or b.scale_in_below is None:
                raise ValueError(f"autoscaler.{n}: policy threshold needs scale_out_above and scale_in_below "
                                 f"(of {b.metric} per serving instance)")
            if b.scale_in_below >= b.scale_out_above:
                raise ValueError(f"autoscaler.{n}.scale_in_below (={b.scale_in_below}) must be below "
                                 f"scale_out_above (={b.scale_out_above})")
            if b.metric == "utilization" and b.scale_out_above > 1:
                raise ValueError(f"autoscaler.{n}.scale_out_above (={b.scale_out_above}): utilization is a "
                                 "busy fraction in [0, 1]")


ROUTER_NAMES = Literal["round_robin", "least_outstanding", "prefix_aware", "kv_aware"]


class PrefixRoutingSpec(_Strict):
    """Parameters of the cache-aware routers (``prefix_aware``, ``kv_aware``)."""
    # prefix_aware: instances with more outstanding tokens than the least loaded plus this are skipped
    load_slack_tokens: Annotated[int, Field(ge=0, le=10**12)] = 32768
    # kv_aware: cost = overlap_weight x prompt tokens to compute + outstanding tokens
    overlap_weight: NonNegFloat = 1.0


class ColocatedSpec(PoolSpec):
    kind: Literal["colocated"]
    replicas: Instances = 1
    router: ROUTER_NAMES = "least_outstanding"
    prefix_routing: PrefixRoutingSpec | None = None
    autoscaler: AutoscalerSpec | None = None

    @model_validator(mode="after")
    def _check_autoscaler(self):
        if self.autoscaler is not None:
            check_autoscaler(self.autoscaler, {"replicas": self.replicas})
        return self


#: bandwidth per GPU (GB/s, one direction) and latency of common KV links
LINK_PRESETS = {
    "nvlink": (450.0, 5.0), "infiniband": (50.0, 10.0), "roce": (25.0, 15.0),
    "ethernet": (12.5, 50.0), "pcie": (25.0, 10.0),
}


class KVLinkSpec(_Strict):
    preset: Literal["nvlink", "infiniband", "roce", "ethernet", "pcie"] | None = None
    # per GPU of the prefill instance, one direction; >= 1 MB/s (5e-324 made transfer times overflow)
    bandwidth_GBps: Annotated[float, Field(ge=1e-3, allow_inf_nan=False)] | None = None
    latency_us: NonNegFloat | None = None
    layerwise_overlap: bool = False
    shared: bool = False                       # one link for the whole pool instead of one per prefill instance

    @model_validator(mode="after")
    def _fill(self):
        bw, lat = LINK_PRESETS.get(self.preset or "infiniband")
        if self.bandwidth_GBps is None:
            self.bandwidth_GBps = bw
        if self.latency_us is None:
            self.latency_us = lat
        return self


class DisaggregatedSpec(_Strict):
    kind: Literal["disaggregated"]
    prefill: PoolSpec
    decode: PoolSpec
    kv_link: KVLinkSpec = KVLinkSpec()
    router: ROUTER_NAMES = "least_outstanding"           # picks the prefill instance
    prefix_routing: PrefixRoutingSpec | None = None
    assignment: Literal["round_robin", "least_loaded", "least_decode_work"] = "least_loaded"
    autoscaler: AutoscalerSpec | None = None

    @model_validator(mode="after")
    def _check_autoscaler(self):
        if self.autoscaler is not None:
            check_autoscaler(self.autoscaler, {"prefill": self.prefill.instances, "decode": self.decode.instances})
            if self.autoscaler.policy == "mix":
                for k in ("device", "tp", "pp", "pp_layers", "ep", "dp_attention"):   # the same GPUs and layout
                    if getattr(self.prefill, k) != getattr(self.decode, k):
                        raise ValueError(f"autoscaler.policy: mix switches GPUs between the pools: prefill.{k} "
                                         f"(={getattr(self.prefill, k)}) must equal decode.{k} "
                                         f"(={getattr(self.decode, k)})")
        return self


Topology = Annotated[Union[ColocatedSpec, DisaggregatedSpec], Field(discriminator="kind")]


# --- workload ------------------------------------------------------------------------
class TraceSpec(_Strict):
    path: str
    format: Literal["auto", "azure", "vidur", "lengths", "mooncake"] = "auto"
    rate_scale: Annotated[float, Field(gt=0, le=MAX_RATE, allow_inf_nan=False)] = 1.0  # 2 = twice the trace's rate
    start_s: NonNegFloat = 0.0
    duration_s: PosFloat | None = None
    jitter_s: NonNegFloat = 0.0         # spread arrivals uniformly within ticks (Mooncake's 3 s ticks)
    hash_block_tokens: PosInt = 512     # tokens per Mooncake hash id (512 in the FAST'25 traces)


class LengthSpec(_Strict):
    """Token counts: an integer, or ``{dist: uniform|lognormal|trace, ...}``."""
    dist: Literal["fixed", "uniform", "lognormal", "trace"] = "fixed"
    value: PosInt | None = None
    low: PosInt | None = None
    high: PosInt | None = None
    mean: PosFloat | None = None
    cv: NonNegFloat | None = None
    max: PosInt | None = None
    path: str | None = None
    format: Literal["auto", "azure", "vidur", "lengths", "mooncake"] = "auto"

    @model_validator(mode="before")
    @classmethod
    def _from_int(cls, v):
        if isinstance(v, (int, float)) and not isinstance(v, bool):
            return {"dist": "fixed", "value": v}
        return v

    @model_validator(mode="after")
    def _need(self):
        need = {"fixed": ["value"], "uniform": ["low", "high"], "lognormal": ["mean", "cv"],
                "trace": ["path"]}[self.dist]
        missing = [k for k in need if getattr(self, k) is None]
        if missing:
            raise ValueError(f"dist: {self.dist} needs {', '.join(missing)}")
        if self.dist == "uniform" and self.low > self.high:
            raise ValueError(f"low (={self.low}) must be <= high (={self.high})")
        return self


class ConversationSpec(_Strict):
    """Synthetic multi-turn chat with shared system prompts (workload.conversations): the arrival
    process starts sessions; prompt_tokens draws each new user message, output_tokens each reply."""
    turns: Annotated[float, Field(ge=1, le=1e6, allow_inf_nan=False)] = 1.0   # mean turns per session
    think_s: NonNegFloat = 0.0          # mean time between a session's turns (exponential)
    system_prompts: Annotated[int, Field(ge=0, le=10**6)] = 0   # distinct shared system prompts
    system_tokens: Annotated[int, Field(ge=0, le=10**7)] = 0    # length of each
    block_tokens: PosInt = 16           # tokens per generated hash id

    @model_validator(mode="after")
    def _need(self):
        if (self.system_prompts > 0) != (self.system_tokens > 0):
            zero, other = ("system_prompts", "system_tokens") if self.system_tokens else \
                ("system_tokens", "system_prompts")
            if zero in self.model_fields_set:      # both given, one of them 0
                what = "distinct shared system prompts" if zero == "system_prompts" else "tokens in each system prompt"
                raise KeyProblem(zero, f"must be at least 1 ({what}) with {other}: {getattr(self, other)}; "
                                       f"for no shared system prompt leave both out or set both to 0")
            raise KeyProblem(other, f"needs {zero} too (give both system_prompts and system_tokens, or neither)")
        return self


class BurstSpec(_Strict):
    """The rate times ``multiplier`` from ``at_s`` for ``duration_s`` (simulated seconds)."""
    at_s: NonNegFloat
    duration_s: PosFloat
    multiplier: Annotated[float, Field(ge=0, le=1e6, allow_inf_nan=False)]


class RateCurveSpec(_Strict):
    """A time-varying Poisson rate (workload.generate thins a Poisson stream of the curve's peak).

    ``hourly``: requests/s for each hour of the curve (constant within the hour; 24 values = a day), or
    ``points``: ``[[t_s, rate], ...]`` in curve time, linear between points, constant outside them.
    The curve repeats every ``period_s`` (default: the hours' length, or no repeat for points), is
    multiplied by ``scale`` and compressed in time by ``time_scale`` (0.01: a 24 h day in 864 simulated
    seconds, at the curve's rates).  ``bursts`` multiply the rate over windows of simulated time."""
    hourly: list[Annotated[float, Field(allow_inf_nan=False)]] | None = None
    points: list[list[Annotated[float, Field(allow_inf_nan=False)]]] | None = None
    scale: Annotated[float, Field(gt=0, le=MAX_RATE, allow_inf_nan=False)] = 1.0
    time_scale: Annotated[float, Field(gt=0, le=1e6, allow_inf_nan=False)] = 1.0
    period_s: PosFloat | None = None
    bursts: list[BurstSpec] = []

    @model_validator(mode="after")
    def _need(self):
        if (self.hourly is None) == (self.points is None):
            raise ValueError("rate_curve needs hourly: [rates] or points: [[t_s, rate], ...] (one of them)")
        if self.hourly is not None:
            if not self.hourly:
                raise ValueError("rate_curve.hourly is empty")
            for i, r in enumerate(self.hourly):
                if r < 0:
                    raise ValueError(f"rate_curve.hourly[{i}] (={r}) is a negative rate")
            rates = self.hourly
        else:
            if not self.points:
                raise ValueError("rate_curve.points is empty")
            last = None
            for i, pt in enumerate(self.points):
                if len(pt) != 2:
                    raise ValueError(f"rate_curve.points[{i}] (={pt}) must be [t_s, rate]")
                if pt[0] < 0:
                    raise ValueError(f"rate_curve.points[{i}] time (={pt[0]}) is negative")
                if pt[1] < 0:
                    raise ValueError(f"rate_curve.points[{i}] rate (={pt[1]}) is negative")
                if last is not None and pt[0] <= last:
                    raise ValueError(f"rate_curve.points[{i}] time (={pt[0]}) is not after the previous "
                                     f"point's (={last}): sort the points by time")
                last = pt[0]
            rates = [pt[1] for pt in self.points]
            if self.period_s is not None and self.points[-1][0] > self.period_s:
                raise ValueError(f"rate_curve.period_s (={self.period_s}) ends before the last point "
                                 f"(t_s={self.points[-1][0]})")
        if max(rates) <= 0:
            raise ValueError("rate_curve: every rate is zero")
        if max(rates) * self.scale > MAX_RATE:
            raise ValueError(f"rate_curve: peak rate x scale = {max(rates) * self.scale:.3g} requests/s, "
                             f"more than {MAX_RATE:.0g}")
        return self


class WorkloadSpec(_Strict):
    arrival: Literal["poisson", "gamma", "constant", "closed", "trace"] = "poisson"
    # requests per second (open loop); >= 1e-9 so that 1/rate stays finite; <= MAX_RATE (1e308 made the gaps
    # between arrivals subnormal floats and the report's arrival histogram crash)
    rate: Annotated[float, Field(ge=1e-9, le=MAX_RATE, allow_inf_nan=False)] | None = None
    # gamma inter-arrival coefficient of variation; the shape 1/cv^2 must stay finite and nonzero
    cv: Annotated[float, Field(ge=1e-3, le=1e3, allow_inf_nan=False)] = 1.0
    clients: Requests | None = None         # closed loop: concurrent users
    think_s: NonNegFloat = 0.0              # closed loop: pause between a reply and the next request
    num_requests: Requests | None = None
    duration_s: PosFloat | None = None      # open loop: arrivals in [0, duration_s)
    prompt_tokens: LengthSpec = LengthSpec(value=512)
    output_tokens: LengthSpec = LengthSpec(value=128)
    trace: TraceSpec | None = None
    # a client abandons a request that has no first token this long after it was sent
    timeout_s: PosFloat | None = None
    conversation: ConversationSpec | None = None
    # a time-varying rate (diurnal profile, bursts) for arrival: poisson, instead of rate
    rate_curve: RateCurveSpec | None = None
    # every synthetic prompt starts with the same this many tokens (a shared system prompt; vllm bench serve's
    # --random-prefix-len); a pool with prefix_cache reuses them.  Part of prompt_tokens, not added to it (so
    # vllm bench serve's run is prompt_tokens = --random-input-len + --random-prefix-len)
    shared_prefix_tokens: Annotated[int, Field(ge=0, le=10**7)] = 0

    @model_validator(mode="after")
    def _need(self):
        self._check_unused()
        if self.shared_prefix_tokens and (self.arrival == "trace" or self.conversation is not None):
            raise ValueError("shared_prefix_tokens shares the start of synthetic prompts; not with "
                             + ("arrival: trace (a trace's rows carry their own content)" if self.arrival == "trace"
                                else "conversation (its system_prompts / system_tokens share prefixes)"))
        if self.rate_curve is not None:
            if self.arrival != "poisson":
                raise ValueError(f"rate_curve makes a non-homogeneous Poisson stream: it needs arrival: poisson "
                                 f"(not {self.arrival})")
            if self.rate is not None:
                raise ValueError(f"give rate (={self.rate}) or rate_curve, not both")
            if self.duration_s is None:
                raise ValueError("rate_curve needs duration_s (the simulated span the curve covers)")
            for i, b in enumerate(self.rate_curve.bursts):
                if b.at_s >= self.duration_s:      # it would never fire: say so rather than run without it
                    raise KeyProblem(("rate_curve", "bursts", i, "at_s"),
                                     f"starts at or after the end of the run (duration_s {self.duration_s:g} s)")
            return self
        if self.conversation is not None and self.arrival in ("trace", "closed"):
            raise ValueError(f"conversation needs an open-loop arrival process (it starts sessions), "
                             f"not arrival: {self.arrival}")
        if self.arrival in ("poisson", "gamma", "constant") and self.rate is None:
            raise ValueError(f"arrival: {self.arrival} needs rate (requests per second)")
        if self.arrival == "closed" and self.clients is None:
            raise ValueError("arrival: closed needs clients")
        if self.arrival == "trace" and self.trace is None:
            raise ValueError("arrival: trace needs trace: {path: ...}")
        if self.arrival != "trace" and self.num_requests is None and self.duration_s is None:
            raise ValueError("give num_requests or duration_s")
        if self.arrival == "closed" and self.num_requests is None:
            raise ValueError("arrival: closed needs num_requests")
        if self.rate is not None and self.num_requests is None and self.duration_s is not None \
                and self.arrival != "trace" and self.rate * self.duration_s > MAX_REQUESTS:
            raise ValueError(f"rate x duration_s = {self.rate * self.duration_s:.3g} requests, more than "
                             f"{MAX_REQUESTS:,}; give num_requests or a shorter duration_s")
        return self

    def _check_unused(self) -> None:
        """A key the user set that this arrival process never reads is an error: ignored, it would make a
        sweep over it report the same run under different labels.  Defaults (keys left out, or given their
        default value, as a summary.json's full dump of the scenario does) do not count, nor an explicit null."""
        fields = type(self).model_fields
        given = [k for k in self.model_fields_set if getattr(self, k) is not None
                 and getattr(self, k) != fields[k].get_default(call_default_factory=True)]
        unused = _UNUSED_BY_ARRIVAL[self.arrival]
        for k in sorted(given, key=list(type(self).model_fields).index):
            if k in unused:
                raise KeyProblem(k, f"not used with arrival: {self.arrival} ({unused[k]})")


_CLOSED_ONLY = "closed-loop clients: use arrival: closed"
_THINK = ("the closed-loop clients' pause: use arrival: closed, or conversation.think_s between the turns "
          "of a multi-turn session")
_GAMMA_ONLY = "the spread of arrival: gamma's gaps: use arrival: gamma"
_NOT_A_TRACE = ("to replay a trace use arrival: trace; to draw lengths from one, "
                "prompt_tokens / output_tokens: {dist: trace, path: ...}")
_TRACE_LENGTHS = ("a trace's rows carry their own lengths; for synthetic arrivals with a trace's lengths use "
                  "arrival: poisson with prompt_tokens / output_tokens: {dist: trace, path: ...}")
#: per arrival process, the workload keys it never reads (pdsim/workload.py generate, simulation.py), and
#: what to use instead.  conversation and rate_curve have their own checks; timeout_s, num_requests and
#: shared_prefix_tokens are read by every arrival that allows them.
_UNUSED_BY_ARRIVAL: dict[str, dict[str, str]] = {
    "trace": {"rate": "scale a trace with workload.trace.rate_scale",
              "duration_s": "cut a trace with workload.trace.duration_s (trace seconds, before rate_scale) "
                            "or workload.num_requests",
              "prompt_tokens": _TRACE_LENGTHS, "output_tokens": _TRACE_LENGTHS,
              "cv": _GAMMA_ONLY, "clients": _CLOSED_ONLY, "think_s": _THINK},
    "poisson": {"cv": _GAMMA_ONLY, "clients": _CLOSED_ONLY, "think_s": _THINK, "trace": _NOT_A_TRACE},
    "gamma": {"clients": _CLOSED_ONLY, "think_s": _THINK, "trace": _NOT_A_TRACE},
    "constant": {"cv": _GAMMA_ONLY, "clients": _CLOSED_ONLY, "think_s": _THINK, "trace": _NOT_A_TRACE},
    "closed": {"rate": "a closed loop sends as fast as workload.clients and workload.think_s allow",
               "duration_s": "a closed loop sends num_requests requests; stop the clock earlier with horizon_s",
               "cv": _GAMMA_ONLY, "trace": _NOT_A_TRACE},
}


class ClientSpec(_Strict):
    """How the benchmark client sends requests and measures them (defaults: ``vllm bench serve``).

    ``ttft_at``: in disaggregated serving, the first token the client sees is the first one
    streamed by the decode instance (a PD proxy discards the prefill's token), so TTFT ends
    there by default; ``prefill_end`` gives the server-side TTFT.  ``network_rtt_s`` is added
    to every TTFT and E2E.  Closed loop: clients start at t=0 (``start_jitter_s`` spreads their
    first sends uniformly, ``ramp_up_s`` starts them one by one over that span) and
    ``warmup_requests`` (the first requests to finish) are left out of the metrics.
    ``itl``: record every token's time for inter-token latency (``auto``: when the run emits
    at most 5 million tokens).
    """
    ttft_at: Literal["first_decode_token", "prefill_end"] = "first_decode_token"
    network_rtt_s: NonNegFloat = 0.0
    start_jitter_s: NonNegFloat = 0.0
    ramp_up_s: NonNegFloat = 0.0
    warmup_requests: Annotated[int, Field(ge=0, le=MAX_REQUESTS)] = 0
    itl: Literal["auto", "on", "off"] = "auto"


class SLOSpec(_Strict):
    """Latency targets and how a run is judged against them (``metrics.slo_verdict``).

    ``mode: attainment`` (default): the share of requests meeting *both* ``ttft_s`` and ``tpot_s``
    must be >= ``attainment_target`` (DistServe's SLO attainment).  ``mode: percentile``: the
    ``ttft_percentile``-th percentile of TTFT must be <= ``ttft_s`` and the ``tpot_percentile``-th
    percentile of TPOT <= ``tpot_s`` (MLPerf server, DistServe's P90 form).  In both modes a request
    that never finished (rejected, abandoned, unfinished) counts as a miss / an infinite latency.
    """
    mode: Literal["attainment", "percentile"] = "attainment"
    ttft_s: PosFloat = 1.0
    tpot_s: PosFloat = 0.1
    ttft_percentile: float = Field(90, gt=0, le=100)
    tpot_percentile: float = Field(90, gt=0, le=100)
    attainment_target: float = Field(0.9, gt=0, le=1)

    def tightened(self, ttft_factor: float, tpot_factor: float) -> "SLOSpec":
        """This SLO with its bounds divided by the factors (an error margin: ``pdsim plan``'s
        goodput.error_margin, the summary's ``slo_at_error``); mode, percentiles and target unchanged."""
        return self.model_copy(update={"ttft_s": self.ttft_s / ttft_factor, "tpot_s": self.tpot_s / tpot_factor})


# --- faults ---------------------------------------------------------------------------
class InstanceFaultSpec(_Strict):
    """One instance down at ``at_s`` for ``down_s``, then ``warmup_s`` loading weights before it serves."""
    at_s: NonNegFloat
    instance: str                       # e.g. replica-0, prefill-1, decode-0
    down_s: PosFloat
    warmup_s: NonNegFloat = 0.0
    topology: str | None = None         # default: every topology that has this instance


class RandomFaultsSpec(_Strict):
    """Failures mtbf_s apart on average per instance (mean time between failures, failure to failure): an
    exponential up time of mean mtbf_s - mttr_s - warmup_s, then a repair (exponential, mean mttr_s) and the
    warm-up."""
    mtbf_s: PosFloat
    mttr_s: PosFloat
    warmup_s: NonNegFloat = 0.0
    pools: list[Literal["replica", "prefill", "decode"]] | None = None   # default: all pools

    @model_validator(mode="after")
    def _up_time(self):
        if self.mtbf_s <= self.mttr_s + self.warmup_s:
            raise ValueError(f"mtbf_s (={self.mtbf_s:g}) is the mean time from one failure to the next, repair "
                             f"and warm-up included: it must exceed mttr_s + warmup_s (={self.mttr_s + self.warmup_s:g})")
        return self


class LinkFaultSpec(_Strict):
    """KV links at ``bandwidth_fraction`` of their bandwidth (0: down) from at_s for duration_s."""
    at_s: NonNegFloat
    duration_s: PosFloat
    bandwidth_fraction: float = Field(0.0, ge=0, le=1)
    topology: str | None = None


class FaultsSpec(_Strict):
    instances: list[InstanceFaultSpec] = []
    random: RandomFaultsSpec | None = None
    links: list[LinkFaultSpec] = []

    @model_validator(mode="before")
    @classmethod
    def _from_list(cls, v):
        return {"instances": v} if isinstance(v, list) else v


class Scenario(_Strict):
    name: str = "scenario"
    description: str = ""
    seed: int = Field(0, ge=0, le=2**63 - 1)   # numpy seeds are non-negative
    model: str | InlineModel = "llama-3.1-8b"
    weight_dtype: Literal["fp32", "bf16", "fp16", "fp8", "int8", "int4", "fp4"] = "bf16"
    kv_dtype: Literal["fp32", "bf16", "fp16", "fp8", "int8"] = "bf16"
    workload: WorkloadSpec
    slo: SLOSpec = SLOSpec()
    client: ClientSpec = ClientSpec()
    # stop the clock here, or once every request is settled if that comes first; requests in flight are unfinished,
    # those arriving at or after it are not in the run (cut_by_horizon)
    horizon_s: PosFloat | None = None
    timeseries_bin_s: PosFloat | None = None  # default: about 200 bins over the run
    topologies: dict[str, Topology] = Field(min_length=1)
    faults: FaultsSpec | None = None

    # where relative paths in the file are resolved; not part of the YAML
    base_dir: str = Field(".", exclude=True)

    def resolve(self, path: str) -> Path:
        p = Path(path)
        return p if p.is_absolute() else Path(self.base_dir) / p

    @model_validator(mode="after")
    def _check_warmup(self):
        n = self.workload.num_requests
        if n is not None and self.client.warmup_requests >= n:
            raise ValueError(f"client.warmup_requests (={self.client.warmup_requests}) leaves none of the "
                             f"{n} requests (workload.num_requests) to measure")
        return self

    @model_validator(mode="after")
    def _resolve_device_paths(self):
        """A pool's ``device: profiles/x.yaml`` is relative to the scenario file, as trace paths are,
        never to the working directory (``devices.get_device`` would look there first)."""
        for topo in self.topologies.values():
            for pool in (topo,) if isinstance(topo, ColocatedSpec) else (topo.prefill, topo.decode):
                if _is_profile_path(pool.device) and not Path(pool.device).is_absolute():
                    pool.device = str(self.resolve(pool.device))
        return self

    def instance_names(self, topology: str) -> list[str]:
        """Every instance slot the topology can run: an autoscaled pool is built with its ``max`` bound
        (filled by check_autoscaler: given, or a schedule's largest target, or for ``mix`` the total less the
        other pool's min) and those beyond its initial count start off, so a fault may name them."""
        t = self.topologies[topology]
        a = t.autoscaler

        def slots(n: int, key: str) -> int:
            b = getattr(a, key, None) if a is not None else None
            return max(n, b.max) if b is not None and b.max is not None else n
        if isinstance(t, ColocatedSpec):
            return [f"replica-{i}" for i in range(slots(t.replicas, "replicas"))]
        return [f"prefill-{i}" for i in range(slots(t.prefill.instances, "prefill"))] + \
            [f"decode-{i}" for i in range(slots(t.decode.instances, "decode"))]

    @model_validator(mode="after")
    def _check_mtp(self):
        """``speculative: {method: mtp}`` drafts with the model's own multi-token-prediction head: a model
        without one (llama, qwen...) would get MTP's speed-up from nothing."""
        from .models import PRESETS
        with_mtp = ", ".join(n for n, m in PRESETS.items() if m.mtp_layers)
        for name, topo in self.topologies.items():
            pools = [((), topo)] if isinstance(topo, ColocatedSpec) else \
                [(("prefill",), topo.prefill), (("decode",), topo.decode)]
            for sub, pool in pools:
                if pool.speculative is None or pool.speculative.method != "mtp":
                    continue
                if isinstance(self.model, InlineModel):
                    if not self.model.mtp_layers:
                        raise KeyProblem(("topologies", name, *sub, "speculative", "method"),
                                         f"needs a model with a multi-token-prediction head: the inline model "
                                         f"'{self.model.name}' has none (give it mtp_layers: 1 if it has one, as "
                                         f"DeepSeek-V3's num_nextn_predict_layers; presets with one: {with_mtp}); "
                                         f"or use method: draft")
                elif self.model in PRESETS and not PRESETS[self.model].mtp_layers:   # (an unknown name: later)
                    raise KeyProblem(("topologies", name, *sub, "speculative", "method"),
                                     f"needs a model with a multi-token-prediction head: {self.model} has none "
                                     f"(presets with one: {with_mtp}); use method: draft with a draft_model "
                                     f"or draft_cost_fraction")
        return self

    @model_validator(mode="after")
    def _check_faults(self):
        """Every scheduled fault names an instance (and topology) that exists: none is dropped silently."""
        if self.faults is None:
            return self
        for i, f in enumerate(self.faults.instances):
            if f.topology is not None and f.topology not in self.topologies:
                raise ValueError(f"faults.instances[{i}].topology: no topology '{f.topology}' "
                                 f"(have {', '.join(self.topologies)})")
            names = [f.topology] if f.topology else list(self.topologies)
            if not any(f.instance in self.instance_names(n) for n in names):
                raise ValueError(f"faults.instances[{i}].instance: no instance '{f.instance}' in "
                                 f"{'topology ' + f.topology if f.topology else 'any topology'} "
                                 "(names are replica-N, prefill-N, decode-N, N from 0 to the pool's instances "
                                 "less one, or to its autoscaler max less one)")
        for i, f in enumerate(self.faults.links):
            if f.topology is not None and f.topology not in self.topologies:
                raise ValueError(f"faults.links[{i}].topology: no topology '{f.topology}'")
        return self


def _is_profile_path(device: str) -> bool:
    """The rule of ``devices.get_device``: a preset name has no '/' and no file suffix."""
    return device.endswith((".yaml", ".yml", ".json")) or "/" in device


# --- loading -----------------------------------------------------------------------
def _vocabulary() -> set[str]:
    names: set[str] = set()
    for cls in (InlineModel, CostModelSpec, ChunkedPrefillSpec, StepOverheadSpec, ClientSpec, PoolSpec,
                ColocatedSpec, KVLinkSpec, DisaggregatedSpec, TraceSpec, LengthSpec, HostTierSpec, PrefixCacheSpec,
                PrefixRoutingSpec, SpeculativeSpec, AutoscalerSpec, ScalePoolSpec, ScheduleTargetSpec,
                SLOPlannerSpec, RateCurveSpec, BurstSpec, AcceptanceDistSpec, ConversationSpec, WorkloadSpec, SLOSpec, Scenario, InstanceFaultSpec,
                RandomFaultsSpec, LinkFaultSpec, FaultsSpec):
        names.update(cls.model_fields)
    return names


_TAGS = {"colocated", "disaggregated", "str", "InlineModel", "function-after[_need(), LengthSpec]",
         "constrained-float", "AcceptanceDistSpec", "acceptance-rate", "acceptance-dist"}


def _is_tag(p) -> bool:
    return str(p) in _TAGS or str(p) == "[key]" or str(p).startswith(("function-", "json-or-python"))


def _key(loc, raw=None) -> str:
    """The dotted key of an error's location: pydantic's own parts (a union's tag, a validator's name) left
    out.  With the input (``raw``) a part the input holds is always a key ('disaggregated' is a tag in a
    scenario's topology and a key in a plan's search space)."""
    parts, node = [], raw
    for p in loc:
        if isinstance(node, dict) and p in node:
            parts.append(str(p))
            node = node[p]
        elif isinstance(node, list) and isinstance(p, int) and 0 <= p < len(node):
            parts.append(str(p))
            node = node[p]
        elif not _is_tag(p):
            parts.append(str(p))          # (a required key the input lacks)
            node = None if raw is not None else node
    return ".".join(parts)


def _raw_at(raw, loc) -> tuple[bool, Any]:
    """(found, value): the input's value at an error location, pydantic's own parts (tags) skipped."""
    node = raw
    for p in loc:
        if isinstance(node, dict) and p in node:
            node = node[p]
        elif isinstance(node, list) and isinstance(p, int) and 0 <= p < len(node):
            node = node[p]
        elif not _is_tag(p):
            return False, None
    return True, node


def validation_error(exc: ValidationError, file: str | None, raw=None, vocabulary=None) -> ConfigError:
    """The first pydantic error as one line: file, dotted key, value, and a did-you-mean for typos
    (among ``vocabulary``, default the scenario's keys; never the unknown key itself)."""
    errs = exc.errors()
    # an inline model (a mapping) with a bad field: its field's error, not the union's "should be a valid string"
    deep = [e for e in errs if "InlineModel" in [str(p) for p in e["loc"][:-1]]]
    if deep:
        errs = deep + [e for e in errs if e not in deep]
    # prefer a concrete error over "expected str" noise from the model: str | InlineModel union
    err = next((e for e in errs if e["type"] in ("extra_forbidden", "invalid_key")
                or (e["type"] == "string_type" and e["loc"][-1:] == ("[key]",))), errs[0])
    key = _key(err["loc"], raw) or (repr(str(err["loc"][-1])) if err["loc"] else "")   # '' is a key too
    msg = err["msg"].removeprefix("Value error, ")
    cause = (err.get("ctx") or {}).get("error")
    if isinstance(cause, KeyProblem):        # a mapping's check that blames one key below it
        key = ".".join([key, *map(str, cause.path)] if key else map(str, cause.path))
        found, value = _raw_at(raw, [*err["loc"], *cause.path])
        scalar = found and not isinstance(value, (dict, list)) and value is not None
        return ConfigError(cause.message, file=file, key=key, value=value if scalar else None, has_value=scalar)
    if not err["loc"]:      # a whole-scenario check ("faults.instances[0].topology: no topology ..."): its key leads
        m = re.match(r"([A-Za-z_][\w.\[\]-]*): (.+)", msg, re.S)
        if m:
            return ConfigError(m.group(2), file=file, key=m.group(1))
    if err["type"] == "invalid_key" or err["loc"][-1:] == ("[key]",):   # {1: ...}, {true: ...}, {null: ...}
        return ConfigError(f"a key must be a string, not {type(err['input']).__name__}", file=file, key=key)
    if err["type"] == "extra_forbidden":
        last = str(err["loc"][-1])
        vocab = vocabulary or _vocabulary()
        if last in vocab:          # a real key, at the wrong level ('tp' at the top instead of in a topology)
            close = difflib.get_close_matches(last, sorted(vocab - {last}), n=1, cutoff=0.75)
            msg = "not a key at this level (it is one at another: check the indentation)" + (
                f"; or did you mean '{close[0]}'?" if close else "")
            return ConfigError(msg, file=file, key=key)
        close = difflib.get_close_matches(last, sorted(vocab), n=1, cutoff=0.6)
        msg = "unknown key" + (f"; did you mean '{close[0]}'?" if close else "")
        return ConfigError(msg, file=file, key=key)
    if err["type"] == "union_tag_invalid" or err["type"] == "union_tag_not_found":
        msg = "topology kind must be 'colocated' or 'disaggregated'"
    value = err.get("input")
    if isinstance(value, dict) or value is None:
        return ConfigError(msg, file=file, key=key)
    return ConfigError(msg, file=file, key=key, value=value, has_value=True)


def apply_overrides(raw: dict, overrides: list[str], file: str | None = None) -> dict:
    """``--set a.b.c=VALUE`` (VALUE parsed as YAML) applied to the raw tree."""
    for item in overrides or []:
        if "=" not in item:
            raise ConfigError("--set needs KEY=VALUE", key="--set", value=item)
        key, text = item.split("=", 1)
        try:
            value = yaml.safe_load(text)
        except yaml.YAMLError:
            value = text
        node = raw
        parts = key.strip().split(".")
        i = 0
        while i < len(parts) - 1 and ".".join(parts[i:]) not in node:
            # a name with dots in it (a topology 'draft-a0.7'): the longest run of parts that is an existing key
            j = next((j for j in range(len(parts) - 1, i + 1, -1) if ".".join(parts[i:j]) in node), i + 1)
            p = ".".join(parts[i:j])
            i = j
            nxt = node.get(p) if isinstance(node, dict) else None
            if nxt is None:
                nxt = node[p] = {}
            if not isinstance(nxt, dict):
                raise ConfigError("cannot set a key below a non-mapping", file=file, key=key)
            node = nxt
        last = ".".join(parts[i:])
        node[last] = value
    return raw


def parse(raw: Any, file: str | None = None, overrides: list[str] | None = None,
          base_dir: str | Path = ".") -> Scenario:
    if not isinstance(raw, dict):
        raise ConfigError("a scenario must be a YAML mapping", file=file)
    raw = apply_overrides(raw, overrides or [], file)
    _check_file_kind(raw, file)
    if "base_dir" in raw:   # set from the file's location below, never from the file
        raise ConfigError("unknown key", file=file, key="base_dir")
    try:
        sc = Scenario.model_validate({**raw, "base_dir": str(base_dir)})
    except ValidationError as exc:
        raise validation_error(exc, file, raw) from None
    _check_numbers(raw, file)
    return sc


def _check_file_kind(raw: dict, file: str | None) -> None:
    """A device profile or a plan given where a scenario belongs: say what the file is, not that its first
    key ('kind', 'search') is out of place.  A file with topologies is a scenario, whatever else it holds."""
    if "topologies" in raw:
        return
    if raw.get("kind") in ("gpu", "cpu") or {"peak_tflops", "memory_bandwidth_GBps"} & set(raw):
        raise ConfigError("this file is a device profile, not a scenario; in a scenario, use its path as a pool's "
                          "device (topologies.NAME.device: PATH)", file=file)
    if "search" in raw:
        raise ConfigError("this file is a plan, not a scenario; run it with pdsim plan", file=file)


def _check_numbers(node, file, path=""):
    """NaN/inf anywhere in the tree is a mistake, even in free-form fields."""
    if isinstance(node, dict):
        for k, v in node.items():
            _check_numbers(v, file, f"{path}.{k}" if path else str(k))
    elif isinstance(node, list):
        for i, v in enumerate(node):
            _check_numbers(v, file, f"{path}[{i}]")
    elif isinstance(node, float) and not math.isfinite(node):
        raise ConfigError("must be a finite number", file=file, key=path, value=node, has_value=True)


#: a scenario is a few hundred nodes, six levels deep; these bounds stop alias bombs
#: ("billion laughs") and deep nesting before anything walks the tree
MAX_YAML_NODES = 1_000_000      # counting every alias as a copy of what it names
MAX_YAML_DEPTH = 64
MAX_YAML_BYTES = 16 * 1024 * 1024


def _check_tree(root, file: str) -> None:
    """Reject a composed YAML graph whose expanded size or depth is out of bounds, or that refers to itself."""
    sizes: dict[int, int] = {}      # id(node) -> expanded node count (memo: shared aliases counted once each)
    active: set[int] = set()        # nodes on the current path (a cycle is an alias to an ancestor)

    def size(node, depth: int) -> int:
        if depth > MAX_YAML_DEPTH:
            raise ConfigError(f"YAML nested more than {MAX_YAML_DEPTH} levels deep", file=file,
                              line=node.start_mark.line + 1)
        k = id(node)
        if k in sizes:
            return sizes[k]
        if k in active:
            raise ConfigError("YAML alias refers to a node that contains it", file=file,
                              line=node.start_mark.line + 1)
        n = 1
        if isinstance(node, yaml.MappingNode):   # PyYAML would keep the last of two equal keys silently
            seen: dict[tuple[str, str], int] = {}
            for key, _ in node.value:
                if isinstance(key, yaml.ScalarNode) and key.tag != "tag:yaml.org,2002:merge":
                    if (key.tag, key.value) in seen:
                        raise ConfigError(f"duplicate key (first on line {seen[key.tag, key.value]})",
                                          file=file, key=str(key.value), line=key.start_mark.line + 1)
                    seen[key.tag, key.value] = key.start_mark.line + 1
        if isinstance(node, (yaml.SequenceNode, yaml.MappingNode)):
            active.add(k)
            children = node.value if isinstance(node, yaml.SequenceNode) else \
                [c for pair in node.value for c in pair]
            for c in children:
                n += size(c, depth + 1)
                if n > MAX_YAML_NODES:
                    raise ConfigError(f"YAML expands to more than {MAX_YAML_NODES:,} nodes "
                                      "(aliases nested in aliases?)", file=file, line=node.start_mark.line + 1)
            active.discard(k)
        sizes[k] = n
        return n

    size(root, 0)


class _ValueErrorsAsYAML:
    """Value errors while building (a 5000-digit int, month 13, a bad !!timestamp) become YAML errors with a line."""

    def construct_object(self, node, deep=False):
        try:
            return super().construct_object(node, deep)
        except (ValueError, TypeError, AttributeError, OverflowError, LookupError) as exc:
            raise yaml.constructor.ConstructorError(
                None, None, f"cannot read value {node.value!r:.60}: {str(exc) or type(exc).__name__}"
                if isinstance(node, yaml.ScalarNode) else f"cannot read value: {exc}", node.start_mark) from None


class _PyLoader(_ValueErrorsAsYAML, yaml.SafeLoader):
    """The pure-Python parser: used where PyYAML was built without libyaml."""


#: libyaml's parser when PyYAML has it: ~30x faster on a large file, and it caps nesting itself
_Loader = type("_Loader", (_ValueErrorsAsYAML, yaml.CSafeLoader), {}) if getattr(yaml, "CSafeLoader", None) \
    else _PyLoader


def read_yaml(path: str | Path) -> Any:
    path = Path(path)
    try:
        if not path.is_file():
            why = ("is a directory, not a file" if path.is_dir() else
                   "not a regular file" if path.exists() else "scenario file not found")
            raise ConfigError(why, file=str(path))
        if path.stat().st_size > MAX_YAML_BYTES:
            raise ConfigError(f"scenario file larger than {MAX_YAML_BYTES >> 20} MiB; is this the right file?",
                              file=str(path))
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise ConfigError(f"not UTF-8 text (byte {exc.start})", file=str(path)) from None
    except (OSError, ValueError) as exc:   # permissions, a NUL in the path...
        raise ConfigError(f"cannot read: {getattr(exc, 'strerror', None) or exc}", file=str(path)) from None
    loader = None
    try:
        loader = _Loader(text)
        node = loader.get_single_node()
        if node is None:
            return None
        _check_tree(node, str(path))
        return loader.construct_document(node)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        line = mark.line + 1 if mark is not None else None
        if isinstance(exc, yaml.reader.ReaderError):   # a control character: it has a position, not a mark
            line = text.count("\n", 0, exc.position) + 1
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise ConfigError(f"not valid YAML: {problem}", file=str(path), line=line) from None
    except RecursionError:
        raise ConfigError("YAML nested too deeply", file=str(path)) from None
    finally:
        if loader is not None:
            loader.dispose()


def load(path: str | Path, overrides: list[str] | None = None) -> Scenario:
    path = Path(path)
    return parse(read_yaml(path), str(path), overrides, base_dir=path.parent)
