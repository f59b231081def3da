"""Step time of one serving instance: what a batch of new tokens costs on a device.

A step advances some requests by some tokens (prefill chunks and decodes in
one batch, as in vLLM's unified scheduler).  Its cost depends only on four
aggregates of the batch, which keeps the event loop cheap:

- ``tokens``: new tokens in the step (T, the GEMM M dimension);
- ``attn_work``: sum over requests of new_i * mean context seen by the new tokens
  (causal prefill of s tokens from empty = s * s/2, a decode at context c = c);
- ``kv_read_tokens``: KV-cache tokens read by attention (sum of final contexts);
- ``sampled``: requests that emit a token this step (LM-head rows).

Per layer, per DESIGN.md: linear FLOPs 2*T*params_per_layer / tp, weights read
once per step; attention FLOPs 4*n_h*d*attn_work / tp, KV bytes
kv_read_tokens*2*n_kv*d*bytes / tp; two all-reduces of T*h*2 bytes per layer
when tp > 1.  Plus per-token elementwise kernels (norms, RoPE, KV write, activation,
embedding) priced by bytes, an LM head GEMM and a fixed per-step engine overhead.
:class:`RooflineCost` lists these as operator rows (:meth:`RooflineCost.ops`) and prices
them with one evaluator over :mod:`pdsim.kernels` (measured tables first).

``ConstantCost`` and ``LinearCost`` are the what-if and theory-test models.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from . import kernels
from .devices import DeviceProfile
from .models import ModelShape, dtype_bytes


@dataclass(slots=True)
class StepCost:
    time_s: float
    flops: float
    bytes: float


class CostModel:
    """Protocol: ``step(tokens, attn_work, kv_read_tokens, sampled, batch) -> StepCost``."""

    tp: int = 1

    def step(self, tokens: int, attn_work: float, kv_read_tokens: int, sampled: int,
             batch: int) -> StepCost:  # pragma: no cover - interface
        raise NotImplementedError

    def decode_steps(self, batch: int, attn0: float, kv0: int, k: int):
        """Costs of ``k`` consecutive pure-decode steps of the same ``batch`` requests.

        Step i (0-based) has ``attn_work = attn0 + batch * i`` and ``kv_read_tokens =
        kv0 + batch * i``: every context grows by one token a step.  Returns numpy arrays
        (time_s, flops, bytes), each element what :meth:`step` gives for that step (the
        multi-step fast path of :class:`pdsim.instance.Instance` relies on it).
        This generic version calls ``step``; subclasses vectorise it.
        """
        out = np.empty((3, k))
        for i in range(k):
            c = self.step(batch, attn0 + batch * i, kv0 + batch * i, batch, batch)
            out[0, i], out[1, i], out[2, i] = c.time_s, c.flops, c.bytes
        return out[0], out[1], out[2]

    def prefill_time(self, prompt_tokens: int) -> float:
        """A lone prefill of a whole prompt (TTFT of an idle instance)."""
        p = prompt_tokens
        return self.step(p, p * p / 2.0, p, 1, 1).time_s

    def decode_time(self, batch: int, context: int) -> float:
        """One decode step of ``batch`` requests that each have ``context`` tokens in cache."""
        return self.step(batch, float(batch * context), batch * (context + 1), batch, batch).time_s


@dataclass
class ConstantCost(CostModel):
    """Every step costs ``step_s`` whatever it holds (M/D/1 theory tests)."""
    step_s: float
    tp: int = 1

    def step(self, tokens, attn_work, kv_read_tokens, sampled, batch):
        return StepCost(self.step_s, 0.0, 0.0)

    def decode_steps(self, batch, attn0, kv0, k):
        return np.full(k, float(self.step_s)), np.zeros(k), np.zeros(k)


@dataclass
class LinearCost(CostModel):
    """``base_s + per_token_s * tokens + per_kv_token_s * kv_read_tokens`` per step."""
    base_s: float = 0.0
    per_token_s: float = 0.0
    per_kv_token_s: float = 0.0
    tp: int = 1

    def step(self, tokens, attn_work, kv_read_tokens, sampled, batch):
        return StepCost(self.base_s + self.per_token_s * tokens + self.per_kv_token_s * kv_read_tokens,
                        0.0, 0.0)

    def decode_steps(self, batch, attn0, kv0, k):
        kv = kv0 + batch * np.arange(k, dtype=np.float64)
        return (self.base_s + self.per_token_s * batch) + self.per_kv_token_s * kv, np.zeros(k), np.zeros(k)


@dataclass(slots=True)
class Op:
    """One operator of a step: ``count`` identical kernels, each of ``flops`` and ``bytes`` (floats, or
    arrays over k decode steps), evaluated by :meth:`RooflineCost.op_time` from ``kind`` and ``args``."""
    name: str
    kind: str            # gemm | attention | elementwise | allreduce | overhead
    count: int
    flops: object
    bytes: object
    args: tuple = ()


@dataclass
class RooflineCost(CostModel):
    """Per-operator cost of a dense decoder on a device profile with tensor parallelism ``tp``.

    One description of the operators (:meth:`ops`) evaluated by one function (:meth:`op_time`)
    gives the scalar :meth:`step`, the per-op :meth:`breakdown` and the vectorised
    :meth:`decode_steps`.  Kernel times come from :mod:`pdsim.kernels` (measured tables first)."""
    model: ModelShape
    device: DeviceProfile
    tp: int = 1
    weight_dtype: str = "bf16"
    kv_dtype: str = "bf16"
    _static_cache: dict = field(default_factory=dict, repr=False)

    def __post_init__(self):
        m, t = self.model, self.tp
        self.w_bytes = dtype_bytes(self.weight_dtype)
        self.kv_bytes = dtype_bytes(self.kv_dtype)
        # fp8 weights use fp8 tensor cores; int4/int8 weights are weight-only: dequantised, computed in bf16
        self.compute_dtype = "fp8" if self.weight_dtype == "fp8" else "bf16"
        self.weight_only = self.weight_dtype if self.weight_dtype in ("int4", "int8") else None
        self.gemm_table_dtype = "bf16" if self.weight_dtype in ("bf16", "fp16", "fp32") else self.weight_dtype
        tabs = self.device.tables
        if self.weight_only and tabs is not None and any(
                key[2] == f"{self.weight_dtype}_wo" for key in tabs.gemm):   # imported weight-only tables
            self.gemm_table_dtype = f"{self.weight_dtype}_wo"
        self.kv_table_dtype = "bf16" if self.kv_dtype in ("bf16", "fp16", "fp32") else self.kv_dtype
        h, d = m.hidden, m.head_dim
        qh, kvh = m.heads // t, max(1, m.kv_heads // t)
        self.q_heads, self.kv_heads_shard = qh, kvh
        # (name, N, K) of each sharded linear layer: column-parallel N, row-parallel K
        self.linears = [("qkv", (qh + 2 * kvh) * d, h), ("attn_out", h, qh * d)]
        if m.gated_mlp:
            self.linears += [("gate_up", 2 * m.mlp_width // t, h), ("down", h, m.mlp_width // t)]
        else:
            self.linears += [("up", m.mlp_width // t, h), ("down", h, m.mlp_width // t)]
        self.lm_head = ("lm_head", m.vocab // t, h)
        self.kv_bytes_per_token_shard = 2 * m.layers * kvh * d * self.kv_bytes
        # activation bytes per token of the per-layer elementwise kernels (bf16 activations)
        act = (3 if m.gated_mlp else 2) * (m.mlp_width // t)
        self._elementwise = [
            # two fused residual-add + RMSNorm (read x and residual, write both), replicated under TP
            ("norm", 2, 2 * 4 * h * 2.0),
            ("rope", 1, 2 * (qh + kvh) * d * 2.0),                       # read and write q and k
            ("kv_write", 1, 2 * kvh * d * (2.0 + self.kv_bytes)),       # read new K, V; write them to the cache
            ("act", 1, act * 2.0),                                       # SiLU(gate) * up: read 2f, write f
        ]

    # --- the one description of a step -------------------------------------
    def _static_ops(self, tokens: int, sampled: int) -> list[Op]:
        """Every operator but attention: they depend on the token and sampled counts only."""
        m, L, h, T = self.model, self.model.layers, self.model.hidden, tokens
        ops = [Op(name, "gemm", L, 2.0 * T * n * k, n * k * self.w_bytes + T * (n + k) * 2.0,
                  (T, n, k, self.w_bytes, self.compute_dtype, self.weight_only, self.gemm_table_dtype))
               for name, n, k in self.linears]
        ops += [Op(name, "elementwise", L, 0.0, T * per_token, (kernels,))
                for name, kernels, per_token in self._elementwise]
        # embedding gather (read, write h) and the final fused add + RMSNorm (read 2h, write h), once a step
        ops.append(Op("embed", "elementwise", 1, 0.0, T * 5 * h * 2.0, (2,)))
        if sampled:
            _, n, k = self.lm_head     # the LM head stays bf16 under weight quantisation
            ops.append(Op("lm_head", "gemm", 1, 2.0 * sampled * n * k, n * k * 2.0 + sampled * (n + k) * 2.0,
                          (sampled, n, k, 2.0, "bf16", None, "bf16")))
        if self.tp > 1:
            # two per layer (after attention and after the MLP) and one for the vocab-parallel embedding
            ops.append(Op("allreduce", "allreduce", 2 * L + 1, 0.0, 0.0, (T * h * 2.0, self.tp)))
        ops.append(Op("step_overhead", "overhead", 1, 0.0, 0.0))
        return ops

    def _attention_op(self, tokens, attn_work, kv_read_tokens, batch, prefill: bool) -> Op:
        """Attention of one layer; ``attn_work`` and ``kv_read_tokens`` may be arrays over steps."""
        m, qh, kvh = self.model, self.q_heads, self.kv_heads_shard
        d = m.head_dim
        flops = 4.0 * qh * d * attn_work
        bytes_ = kv_read_tokens * 2 * kvh * d * self.kv_bytes + tokens * (qh + 2 * kvh) * d * 2.0
        return Op("attention", "attention", m.layers, flops, bytes_,
                  (tokens, attn_work, kv_read_tokens, batch, prefill))

    def ops(self, tokens: int, attn_work, kv_read_tokens, sampled: int, batch: int) -> list[Op]:
        """The operators of one step (what :meth:`op_time` evaluates)."""
        # prefill vs decode attention only changes the kernel: the mix is judged by work
        prefill = _is_prefill(attn_work, kv_read_tokens)
        return [self._attention_op(tokens, attn_work, kv_read_tokens, batch, prefill),
                *self._static_ops(tokens, sampled)]

    def op_time(self, op: Op):
        """(seconds of ONE kernel of ``op``, source codes of :mod:`pdsim.kernels`): the one evaluator."""
        dev = self.device
        if op.kind == "gemm":
            m, n, k, w, dtype, wo, tdt = op.args
            return kernels.gemm_time(dev, m, n, k, w, 2.0, dtype, wo, tdt)
        if op.kind == "attention":
            tokens, attn_work, kv_read, batch, prefill = op.args
            return kernels.attention_time(dev, tokens, attn_work, kv_read, batch,
                                          (self.q_heads, self.kv_heads_shard, self.model.head_dim), prefill,
                                          self.kv_bytes, "bf16", self.kv_table_dtype, (op.flops, op.bytes))
        if op.kind == "elementwise":
            return kernels.elementwise_roofline(dev, op.bytes, op.args[0]), kernels.ROOFLINE
        if op.kind == "allreduce":
            return kernels.allreduce_time(dev, *op.args)
        if op.kind == "overhead":
            return dev.step_overhead_s, kernels.ROOFLINE
        raise AssertionError(op.kind)

    # --- derived: scalar step, per-op breakdown, k decode steps --------------
    def _static(self, tokens: int, sampled: int) -> tuple[float, float, float]:
        """Summed (time_s, flops, bytes) of the non-attention operators; cached by (tokens, sampled)."""
        key = (tokens, sampled)
        hit = self._static_cache.get(key)
        if hit is not None:
            return hit
        time_s = flops = bytes_ = 0.0
        for op in self._static_ops(tokens, sampled):
            time_s += float(self.op_time(op)[0]) * op.count
            flops += op.flops * op.count
            bytes_ += op.bytes * op.count
        out = (time_s, flops, bytes_)
        if len(self._static_cache) < 1 << 16:
            self._static_cache[key] = out
        return out

    def _sum(self, tokens, attn_work, kv_read_tokens, sampled, batch):
        """Step time, FLOPs and bytes: the cached static part plus attention (scalars or arrays)."""
        t_s, f_s, b_s = self._static(tokens, sampled)
        prefill = _is_prefill(attn_work, kv_read_tokens)
        att = self._attention_op(tokens, attn_work, kv_read_tokens, batch, prefill)
        t_a = self.op_time(att)[0]
        L = att.count
        return t_s + t_a * L, f_s + att.flops * L, b_s + att.bytes * L

    def step(self, tokens, attn_work, kv_read_tokens, sampled, batch):
        t, f, b = self._sum(tokens, float(attn_work), float(kv_read_tokens), sampled, batch)
        return StepCost(float(t), float(f), float(b))

    def breakdown(self, tokens: int, attn_work: float, kv_read_tokens: int, sampled: int,
                  batch: int) -> dict[str, dict]:
        """Per-op ``{op: {time_s, flops, bytes, source}}`` of one step (what ``pdsim estimate`` prints).
        ``source``: measured, interpolated, extrapolated or roofline (:mod:`pdsim.kernels`)."""
        out = {}
        for op in self.ops(tokens, float(attn_work), float(kv_read_tokens), sampled, batch):
            t, code = self.op_time(op)
            out[op.name] = {"time_s": float(t) * op.count, "flops": float(op.flops) * op.count,
                            "bytes": float(op.bytes) * op.count, "source": kernels.source_name(code)}
        return out

    def decode_steps(self, batch, attn0, kv0, k):
        """:meth:`step` for k decode steps of the same batch, on arrays: the same operators and the
        same evaluator with attention's work and KV reads as arrays over the step index (measured
        tables included: their lookups are vectorised)."""
        i = np.arange(k, dtype=np.float64)
        attn = float(attn0) + batch * i
        kv = float(kv0) + batch * i
        t, f, b = self._sum(batch, attn, kv, batch, batch)
        return np.asarray(t, float), np.asarray(f, float), np.asarray(b, float)

    # --- memory -------------------------------------------------------------
    def weight_bytes_per_gpu(self) -> float:
        return self.model.weight_bytes(self.weight_dtype) / self.tp


def _is_prefill(attn_work, kv_read_tokens) -> bool:
    """Prefill attention when the work exceeds the KV read (a decode works c and reads c + 1).
    Over k decode steps both grow by the batch each step, so the first step decides for all."""
    if isinstance(attn_work, np.ndarray):
        return bool(attn_work.flat[0] > np.asarray(kv_read_tokens).flat[0])
    return attn_work > kv_read_tokens

