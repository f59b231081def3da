"""Serving-engine presets: what vLLM, SGLang and TensorRT-LLM do that an idealised engine does not.

A pool may name an ``engine`` (``vllm-v1 | vllm-v0 | sglang | trtllm``).  The preset fills,
key by key, what the pool did not set itself:

- the scheduler (``fcfs`` prefill-first, ``chunked`` unified token budget, or ``inflight``: decodes
  plus whole prompts, TensorRT-LLM with chunked prefill off; no preset uses it, see below), its token
  budget (``max_batched_tokens``) and batch cap (``max_running``);
- the KV block size and the memory share the engine gives its KV cache, and *how* it sizes
  that cache (:func:`kv_cache_bytes`: vLLM subtracts weights, the activation peak of a
  profiling run of ``max_batched_tokens`` tokens, non-torch memory and the CUDA-graph pool
  from ``gpu_memory_utilization x memory``; SGLang's ``mem_fraction_static`` covers weights
  and KV; TensorRT-LLM gives ``free_gpu_memory_fraction`` of what is free after loading);
- a per-step CPU/scheduling overhead ``base + per_seq x batch + per_token x tokens``
  (+ ``tp_extra`` when tp > 1), added to the cost model's step time by :class:`EngineCost`
  in place of the device profile's flat ``step_overhead_us``.

Without ``engine`` nothing changes: pools behave exactly as before (flat device step
overhead, KV = memory x utilisation - weights - ``activation_reserve_GiB``).

Where the numbers come from (``source`` of each preset says the same):

- vllm-v0 overhead: least-squares fit to Vidur's measured vLLM CPU overheads on A100
  (``data/profiling/a100/cpu_overheads.csv``, Vidur commit 6d98aa8, MIT; the sum of the
  median ``schedule``, ``sampler_e2e``, ``prepare_inputs_e2e`` and ``process_model_outputs``
  per step): tp=1 rows (Llama-2-7B, phi-2, batch 8..128) give 0.813 ms + 0.0423 ms per
  running sequence (MAPE 1.1% over 26 rows); tp>1 rows 1.736 ms + 0.0414 ms/seq.  Checked
  against the CSV by tests/test_engines.py when ../shared is present.
- vllm-v1, sglang, trtllm overheads (base, per_seq): not measured directly; least-squares fits
  (:func:`pdsim.validate.fit_step_overhead`) to the TPOT residuals of the train half (row-id
  CRC32 even, 385 rows) of aiconfigurator-core 0.12.0's silicon sample, checked on the held-out
  half (TPOT MAPE 16.5% -> 13.8%, benchmarks/validate_silicon.py --fit-overhead).  A residual
  fit: they also soak up what the kernel cost model misses at those engines' batch sizes, so
  they are not CPU overheads one could profile.  tp_extra stays an estimate.
- scheduler defaults: vLLM v1 on >= 70 GiB GPUs serving online (max_num_batched_tokens 8192,
  max_num_seqs 1024, block 16, gpu_memory_utilization 0.9); vLLM v0 (max_num_seqs 256,
  prefill-first; its max_num_batched_tokens default is max(max_model_len, 2048): 8192 here,
  set max_batched_tokens to your max_model_len); SGLang (chunked_prefill_size 8192, page
  size 1, mem_fraction_static ~0.88 on 80 GB GPUs at tp 1, prefill and decode batches run
  separately); TensorRT-LLM (max_num_tokens 8192, max_batch_size 2048, tokens_per_block 32,
  free_gpu_memory_fraction 0.9, in-flight batching of context and generation requests).
- activation peak and non-torch memory are estimates from the model shape (see
  :func:`activation_peak_bytes`), not measured.
"""
from __future__ import annotations

from dataclasses import dataclass

from .costmodel import CostModel, StepCost

GiB = 1024 ** 3


@dataclass(frozen=True)
class EnginePreset:
    name: str
    scheduler: str                    # "fcfs" (prefill-first), "chunked" (unified token budget) or "inflight"
    max_batched_tokens: int
    max_running: int
    block_size: int
    memory_fraction: float            # gpu_memory_utilization / mem_fraction_static / free_gpu_memory_fraction
    memory_basis: str                 # "vllm" | "static" | "free" (see kv_cache_bytes)
    overhead_base_us: float
    overhead_per_seq_us: float
    overhead_per_token_us: float
    overhead_tp_extra_us: float       # added when tp > 1 (worker communication)
    cuda_graph_GiB: float
    non_torch_GiB: float              # NCCL buffers, cuBLAS workspace, CUDA context share
    watermark: float                  # admission headroom (vLLM v0's 1%; v1, SGLang, TRT-LLM keep none)
    source: str
    kv_reservation: str = "incremental"   # "full": blocks for prompt + output at admission (TRT-LLM)
    # CPU dispatch of a step that holds prompt tokens (eager, no CUDA graph): per layer, and extra per MoE layer
    prefill_per_layer_us: float = 0.0
    prefill_per_moe_layer_us: float = 0.0
    # per-request latency before the engine schedules a request, no GPU time (frontend_latency_s).  0 in every
    # preset: the TTFT floor it would carry shows in the InferenceMAX runs of the silicon sample and not in
    # NVIDIA's other sweeps (benchmarks/fit_prefill_dispatch.py; README "A TTFT floor"), so it is a pool key
    # (frontend_latency_ms) a user sets from their own stack's runs, not a default
    frontend_per_layer_us: float = 0.0
    frontend_per_moe_layer_us: float = 0.0
    # the engine reuses cached prompt prefixes by default (vLLM v1's automatic prefix caching, SGLang's radix
    # cache, TensorRT-LLM's KV block reuse, enable_block_reuse=True; vLLM v0 had it off): a colocated or
    # prefill pool of the engine caches prefixes unless its prefix_cache key says otherwise
    # (engine_prefix_cache)
    prefix_caching: bool = False
    # under DP attention every attention rank runs its own scheduler with this token budget (TensorRT-LLM's
    # max_num_tokens, vLLM's max_num_batched_tokens per DP engine), so the instance's budget is ranks x it;
    # False: the budget is the instance's and split over the ranks (SGLang divides chunked_prefill_size by dp)
    budget_per_rank: bool = True


PRESETS: dict[str, EnginePreset] = {p.name: p for p in [
    # v1, SGLang, TRT-LLM base/per_seq overheads: fitted by validate.fit_step_overhead to the TPOT residuals
    # of the train half of aiconfigurator-core 0.12.0's silicon sample (385 rows; benchmarks/
    # validate_silicon.py --fit-overhead), checked on the held-out half (TPOT MAPE 16.5% -> 13.8%)
    EnginePreset("vllm-v1", "chunked", 8192, 1024, 16, 0.9, "vllm", 1744.9, 0.0, 0.0, 150.0, 0.5, 0.5, 0.0,
                 "vLLM v1 defaults (>=70 GiB GPU, online serving); step overhead FITTED to the TPOT residuals of "
                 "the train half of the aiconfigurator silicon sample (vLLM 0.12, H100/H200; it also absorbs "
                 "cost-model error), tp_extra an estimate", prefix_caching=True),
    EnginePreset("vllm-v0", "fcfs", 8192, 256, 16, 0.9, "vllm", 813.0, 42.3, 0.0, 923.0, 0.0, 0.5, 0.01,
                 "vLLM v0 defaults; step overhead fitted to Vidur's measured A100 CPU overheads "
                 "(cpu_overheads.csv, tp1: 0.813 ms + 0.0423 ms/seq, MAPE 1.1%)"),
    EnginePreset("sglang", "fcfs", 8192, 2048, 1, 0.88, "static", 0.0, 34.16, 0.0, 150.0, 0.0, 0.0, 0.0,
                 "SGLang defaults (page 1, mem_fraction_static 0.88); step overhead FITTED to the TPOT residuals of "
                 "the train half of the aiconfigurator silicon sample (SGLang 0.5.x, H100/H200; it also absorbs "
                 "cost-model error), tp_extra an estimate", prefix_caching=True, budget_per_rank=False),
    EnginePreset("trtllm", "chunked", 8192, 2048, 32, 0.9, "free", 620.6, 17.8, 0.0, 100.0, 0.0, 0.5, 0.0,
                 "TensorRT-LLM defaults (tokens_per_block 32, free_gpu_memory_fraction 0.9); step overhead FITTED "
                 "to the TPOT residuals of the train half of the aiconfigurator silicon sample (TRT-LLM 1.0, "
                 "H100/H200; it also absorbs cost-model error), tp_extra an estimate; KV reserved for the whole "
                 "sequence at admission (capacity_scheduler_policy GUARANTEED_NO_EVICT, the default)",
                 kv_reservation="full", prefix_caching=True),
]}


def apply_preset(pool) -> None:
    """Fill the pool's engine-related keys that the user did not set from its engine's preset.

    Called once by config validation on a PoolSpec with ``engine`` set; keys given in the
    file (``pool.model_fields_set``) always win, one by one.
    """
    p = PRESETS[pool.engine]
    given = pool.model_fields_set
    if "max_batched_tokens" not in given:
        pool.max_batched_tokens = p.max_batched_tokens
        if pool.dp_attention and p.budget_per_rank:     # each attention rank schedules its own budget
            pool.max_batched_tokens *= pool.tp
    if "max_running" not in given:
        pool.max_running = p.max_running
    if "block_size" not in given:
        pool.block_size = p.block_size
    if "watermark" not in given:
        pool.watermark = p.watermark
    if "kv_reservation" not in given:
        pool.kv_reservation = p.kv_reservation
    if "gpu_memory_utilization" not in given:
        pool.gpu_memory_utilization = p.memory_fraction
    if "scheduler" not in given and "chunked_prefill" not in given:
        pool.scheduler = p.scheduler
        if p.scheduler == "chunked":
            from .config import ChunkedPrefillSpec
            pool.chunked_prefill = ChunkedPrefillSpec(token_budget=pool.max_batched_tokens)


def engine_prefix_cache(pool, model) -> bool:
    """Whether ``pool`` caches prefixes only because its engine does by default: an engine preset with
    ``prefix_caching``, no ``prefix_cache`` set (``enabled: false`` turns it off, as ``--no-enable-prefix-caching``
    does; ``prefix_cache: null``, as summary.json writes a pool's scenario, is the default), and a model pdsim
    can cache for (no sliding-window layers)."""
    if pool.engine is None or pool.prefix_cache is not None:
        return False
    if getattr(pool, "attention_dp_balance", None) is not None:
        return False        # per-rank caches are not modelled (config refuses an explicit cache there)
    return PRESETS[pool.engine].prefix_caching and not model.has_sliding


def with_engine_prefix_cache(spec, model):
    """(topology spec, {pool name: engine}) with the engines' default prefix caching turned on in its colocated
    pool or its prefill pool (:func:`engine_prefix_cache`).  A decode pool stays as its key says (uncached by
    default, whatever the engine: SGLang turns its radix cache off on a decode server; whether vLLM's decode side
    skips pulling prefix blocks it holds depends on its KV connector, not modelled).  Called only
    for a request stream that carries content ids; without them a cache finds nothing (the results are the
    same) and the plain pool is faster."""
    from .config import PrefixCacheSpec
    if spec.kind == "colocated":
        if engine_prefix_cache(spec, model):
            return spec.model_copy(update={"prefix_cache": PrefixCacheSpec(enabled=True)}), {"replica": spec.engine}
        return spec, {}
    if engine_prefix_cache(spec.prefill, model):
        pre = spec.prefill.model_copy(update={"prefix_cache": PrefixCacheSpec(enabled=True)})
        return spec.model_copy(update={"prefill": pre}), {"prefill": spec.prefill.engine}
    return spec, {}


# --- memory ------------------------------------------------------------------------
def activation_peak_bytes(model, tokens: int, seqs: int, tp: int) -> float:
    """Peak activation memory of a profiling forward of ``tokens`` tokens and ``seqs`` sampled rows.

    ESTIMATE from the shape (what is live at the MLP, the widest point, in bf16): the residual
    stream and its normed copy (2h), the sharded QKV output, the gate/up output (2f/tp) and the
    activated product (f/tp); plus fp32 logits over the full vocabulary for every sampled row.
    """
    m = model
    qkv = (m.heads + 2 * m.kv_heads) * m.head_dim // tp
    mlp = (3 if m.gated_mlp else 2) * m.mlp_width // tp
    per_token = 2 * m.hidden + qkv + mlp
    return tokens * per_token * 2.0 + seqs * m.vocab * 4.0


def kv_cache_bytes(pool, model, weight_dtype: str, device_memory_bytes: float, weights: float | None = None) -> dict:
    """Bytes per GPU the engine gives its KV cache, with the terms it subtracts (all per GPU).

    - ``vllm``: memory x gpu_memory_utilization - weights - activation peak(max_batched_tokens,
      max_running) - non-torch - CUDA-graph pool;
    - ``static`` (SGLang): memory x mem_fraction_static - weights (activations live outside it);
    - ``free`` (TensorRT-LLM): (memory - weights - activation peak - non-torch) x
      free_gpu_memory_fraction.

    ``weights``: one GPU's weights when not the model's busiest (one pipeline stage of an uneven split).
    """
    p = PRESETS[pool.engine]
    mem = float(device_memory_bytes)
    if weights is None:
        weights = model.weight_bytes_per_gpu(weight_dtype, pool.tp, pool.ep, pool.pp, pool.dp_attention,
                                             pool.pp_layers)
    if pool.dp_attention:       # a GPU is one attention rank: its share of the step's tokens, unsharded layers
        act = activation_peak_bytes(model, -(-pool.token_budget // pool.tp), -(-pool.max_running // pool.tp), 1)
    else:
        act = activation_peak_bytes(model, pool.max_batched_tokens, pool.max_running, pool.tp)
    graph = (pool.cuda_graph_GiB if pool.cuda_graph_GiB is not None else p.cuda_graph_GiB) * GiB
    non_torch = p.non_torch_GiB * GiB
    frac = pool.gpu_memory_utilization
    if p.memory_basis == "vllm":
        kv = mem * frac - weights - act - non_torch - graph
    elif p.memory_basis == "static":
        kv = mem * frac - weights - graph
        act = non_torch = 0.0
    else:
        kv = (mem - weights - act - non_torch - graph) * frac
    return {"kv_bytes": kv, "memory_bytes": mem, "fraction": frac, "weights_bytes": weights,
            "activation_bytes": act, "non_torch_bytes": non_torch, "cuda_graph_bytes": graph,
            "basis": p.memory_basis}


# --- per-step overhead -----------------------------------------------------------------------
@dataclass(frozen=True)
class StepOverhead:
    """``base + per_seq x batch + per_token x tokens``, plus ``prefill_s`` when ``prefill``: a step the caller
    counts as a prefill (more new tokens than sampled ones: :class:`EngineCost`, :class:`PipelineCost`; so a
    1-token prompt or a 1-token last chunk counts as decode; a speculative verify step never).  Engines run
    such steps eagerly (decode steps replay CUDA graphs), so the CPU dispatches every layer's kernels."""
    base_s: float
    per_seq_s: float
    per_token_s: float
    prefill_s: float = 0.0
    # under pipeline parallelism: each stage's share of prefill_s (its own layers), which that stage's worker
    # dispatches itself (pdsim.pipeline.PipelineCost adds it to the stage, not to the driver's serial time)
    stage_prefill_s: tuple | None = None

    def __call__(self, batch, tokens, prefill: bool):
        t = self.base_s + self.per_seq_s * batch + self.per_token_s * tokens
        if self.prefill_s and prefill:
            t += self.prefill_s
        return t


def step_overhead(pool, model=None) -> StepOverhead | None:
    """The pool's per-step engine overhead: its ``step_overhead`` keys over its engine's preset.

    ``model`` (a :class:`pdsim.models.ModelShape`): prices the prefill dispatch term, ``prefill_per_layer_us``
    x layers + ``prefill_per_moe_layer_us`` x MoE layers (none without a model: constant/linear what-ifs)."""
    if pool.engine is None and pool.step_overhead is None:
        return None
    p = PRESETS[pool.engine] if pool.engine is not None else None
    o = pool.step_overhead

    def pick(key, default):
        v = getattr(o, key) if o is not None else None
        return v if v is not None else default

    base = pick("base_us", p.overhead_base_us if p else 0.0)
    tp_extra = pick("tp_extra_us", p.overhead_tp_extra_us if p else 0.0)
    prefill, stages = 0.0, None
    if model is not None:
        a = pick("prefill_per_layer_us", p.prefill_per_layer_us if p else 0.0)
        b = pick("prefill_per_moe_layer_us", p.prefill_per_moe_layer_us if p else 0.0)
        prefill = a * model.layers + b * model.moe_layers
        if pool.pp > 1:
            stages = tuple((a * (d + m) + b * m) * 1e-6 for d, m in model.stage_layers(pool.pp, pool.pp_layers))
    return StepOverhead((base + (tp_extra if pool.tp > 1 else 0.0)) * 1e-6,
                        pick("per_seq_us", p.overhead_per_seq_us if p else 0.0) * 1e-6,
                        pick("per_token_us", p.overhead_per_token_us if p else 0.0) * 1e-6,
                        prefill * 1e-6, stages)


class EngineCost:
    """A cost model plus an engine's per-step overhead, replacing the device's flat one.

    The hook between engines and :mod:`pdsim.costmodel`: the inner model's ``step`` and
    ``decode_steps`` results get ``overhead(batch, tokens) - replaced_s`` added to their time
    (``replaced_s``: the flat ``step_overhead_s`` of the device profile that the inner roofline
    already counts; 0 for constant and linear models).  Everything else is the inner model's.
    """

    def __init__(self, inner, overhead: StepOverhead):
        self.inner = inner
        self.overhead = overhead
        dev = getattr(inner, "device", None)
        self.replaced_s = float(getattr(dev, "step_overhead_s", 0.0)) if dev is not None else 0.0

    def __getattr__(self, name):          # device, tp, compute_dtype, weight_bytes_per_gpu, ...
        return getattr(self.inner, name)

    def step(self, tokens, attn_work, kv_read_tokens, sampled, batch, swa=None, rank=None, decodes=None):
        if rank is not None:            # DP attention's ranks, whole requests each (costmodel.busiest_rank)
            c = self.inner.step(tokens, attn_work, kv_read_tokens, sampled, batch, rank=rank)
        elif decodes is not None:       # a mixed MLA step's decodes (costmodel.decode_part)
            c = self.inner.step(tokens, attn_work, kv_read_tokens, sampled, batch, decodes=decodes)
        elif swa is None:
            c = self.inner.step(tokens, attn_work, kv_read_tokens, sampled, batch)
        else:
            c = self.inner.step(tokens, attn_work, kv_read_tokens, sampled, batch, swa=swa)
        # prompt tokens in the step: more new tokens than sampled ones (a decode or verify step samples each)
        return StepCost(c.time_s + self.overhead(batch, tokens, tokens > sampled) - self.replaced_s, c.flops, c.bytes)

    def decode_steps(self, batch, attn0, kv0, k, swa=None):
        t, f, b = self.inner.decode_steps(batch, attn0, kv0, k) if swa is None else \
            self.inner.decode_steps(batch, attn0, kv0, k, swa=swa)
        return t + (self.overhead(batch, batch, False) - self.replaced_s), f, b

    def prefill_time(self, prompt_tokens: int) -> float:
        return CostModel.prefill_time(self, prompt_tokens)      # this step (sliding layers' aggregates too)

    def decode_time(self, batch: int, context: int) -> float:
        return CostModel.decode_time(self, batch, context)


def frontend_latency_s(pool, model) -> float:
    """Seconds from a request's send to the engine's scheduler seeing it, during which it takes no GPU
    time: the pool's ``frontend_latency_ms`` if given, else its engine preset's
    ``frontend_per_layer_us`` x layers + ``frontend_per_moe_layer_us`` x MoE layers for a roofline
    pool (0 for constant / linear what-if models and without an engine).  Every preset's is 0 (README "A TTFT
    floor in the InferenceMAX runs": the floor fitted there is a property of those runs, not of the engines)."""
    if pool.frontend_latency_ms is not None:
        return pool.frontend_latency_ms * 1e-3
    if pool.engine is None or pool.cost_model.kind != "roofline" or model is None:
        return 0.0
    p = PRESETS[pool.engine]
    return frontend_by_layers_s(model, p.frontend_per_layer_us, p.frontend_per_moe_layer_us)


def frontend_by_layers_s(model, per_layer_us: float, per_moe_layer_us: float) -> float:
    """A front-end latency of ``per_layer_us`` x layers + ``per_moe_layer_us`` x MoE layers, in seconds."""
    return (per_layer_us * model.layers + per_moe_layer_us * model.moe_layers) * 1e-6


def wrap_cost(cost, pool, model=None):
    """``cost`` with the pool's engine overhead, or ``cost`` unchanged when it has none.  ``model``: the shape
    the prefill dispatch counts layers of (default: the cost model's own; constant / linear models have none,
    so a pool of one passes it for an explicit ``step_overhead.prefill_per_layer_us`` to count)."""
    if model is None:
        m = getattr(cost, "model", None)         # a roofline (or a pipeline of roofline stages) prices one
        model = m if hasattr(m, "moe_layers") else None
    ovh = step_overhead(pool, model)
    if ovh is None:
        return cost
    if pool.step_overhead is None and getattr(cost, "device", None) is None:
        return cost      # constant / linear what-if models stay as given unless overhead is explicit
    from .pipeline import PipelineCost
    if isinstance(cost, PipelineCost):
        return cost.with_overhead(ovh)     # once per micro-batch, in place of the device's flat one
    return EngineCost(cost, ovh)

