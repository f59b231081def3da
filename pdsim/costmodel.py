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
when tp > 1.  Plus an LM head GEMM and a fixed per-step engine overhead.

``ConstantCost`` and ``LinearCost`` are the what-if and theory-test models.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

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


@dataclass
class RooflineCost(CostModel):
    """Per-operator cost of a dense decoder on a device profile with tensor parallelism ``tp``."""
    model: ModelShape
    device: DeviceProfile
    tp: int = 1
    weight_dtype: str = "bf16"
    kv_dtype: str = "bf16"
    _linear_cache: dict = field(default_factory=dict, repr=False)
    _decode_cache: dict = field(default_factory=dict, repr=False)

    def __post_init__(self):
        m, t = self.model, self.tp
        self.w_bytes = dtype_bytes(self.weight_dtype)
        self.kv_bytes = dtype_bytes(self.kv_dtype)
        # weight-only quantisation (int4/int8 weights) still computes in bf16; fp8 uses fp8 tensor cores
        self.compute_dtype = "fp8" if self.weight_dtype == "fp8" else "bf16"
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

    # --- the pieces ---------------------------------------------------------
    def _linear(self, tokens: int) -> tuple[float, float, float]:
        """(time_s, flops, bytes) of all decoder linear layers for T tokens; cached by T."""
        hit = self._linear_cache.get(tokens)
        if hit is not None:
            return hit
        dev, L = self.device, self.model.layers
        time_s = flops = bytes_ = 0.0
        for _, n, k in self.linears:
            time_s += dev.gemm_time(tokens, n, k, self.w_bytes, 2.0, self.compute_dtype)
            flops += 2.0 * tokens * n * k
            bytes_ += n * k * self.w_bytes + tokens * (n + k) * 2.0
        out = (time_s * L, flops * L, bytes_ * L)
        if len(self._linear_cache) < 1 << 16:
            self._linear_cache[tokens] = out
        return out

    def _attention(self, tokens: int, attn_work: float, kv_read_tokens: int, batch: int,
                   prefill: bool) -> tuple[float, float, float]:
        m = self.model
        flops = 4.0 * self.q_heads * m.head_dim * attn_work
        bytes_ = kv_read_tokens * 2 * self.kv_heads_shard * m.head_dim * self.kv_bytes \
            + tokens * (self.q_heads + 2 * self.kv_heads_shard) * m.head_dim * 2.0
        shape = (tokens, attn_work, kv_read_tokens, batch, self.q_heads, self.kv_heads_shard, m.head_dim)
        t = self.device.attention_time(flops, bytes_, prefill, self.compute_dtype, shape)
        return t * m.layers, flops * m.layers, bytes_ * m.layers

    def breakdown(self, tokens: int, attn_work: float, kv_read_tokens: int, sampled: int,
                  batch: int) -> dict[str, dict[str, float]]:
        """Per-op ``{op: {time_s, flops, bytes}}`` of one step (what ``pdsim estimate`` prints)."""
        dev, L, h = self.device, self.model.layers, self.model.hidden
        ops: dict[str, dict[str, float]] = {}
        for name, n, k in self.linears:
            ops[name] = {"time_s": dev.gemm_time(tokens, n, k, self.w_bytes, 2.0, self.compute_dtype) * L,
                         "flops": 2.0 * tokens * n * k * L,
                         "bytes": (n * k * self.w_bytes + tokens * (n + k) * 2.0) * L}
        # prefill vs decode attention only changes the kernel's efficiency: the mix is judged by work
        prefill = attn_work > kv_read_tokens  # a decode reads c and works c; a prefill works ~s^2/2
        t, f, b = self._attention(tokens, attn_work, kv_read_tokens, batch, prefill)
        ops["attention"] = {"time_s": t, "flops": f, "bytes": b}
        if sampled:
            _, n, k = self.lm_head
            ops["lm_head"] = {"time_s": dev.gemm_time(sampled, n, k, 2.0, 2.0, self.compute_dtype),
                              "flops": 2.0 * sampled * n * k, "bytes": n * k * 2.0 + sampled * (n + k) * 2.0}
        if self.tp > 1:
            msg = tokens * h * 2.0
            ops["allreduce"] = {"time_s": 2 * L * dev.allreduce_time(msg, self.tp), "flops": 0.0,
                                "bytes": 0.0}
        ops["step_overhead"] = {"time_s": dev.step_overhead_s, "flops": 0.0, "bytes": 0.0}
        return ops

    def step(self, tokens, attn_work, kv_read_tokens, sampled, batch):
        t_lin, f_lin, b_lin = self._linear(tokens)
        t_att, f_att, b_att = self._attention(tokens, attn_work, kv_read_tokens, batch,
                                              attn_work > kv_read_tokens)
        time_s = t_lin + t_att + self.device.step_overhead_s
        flops, bytes_ = f_lin + f_att, b_lin + b_att
        if sampled:
            _, n, k = self.lm_head
            time_s += self.device.gemm_time(sampled, n, k, 2.0, 2.0, self.compute_dtype)
            flops += 2.0 * sampled * n * k
            bytes_ += n * k * 2.0
        if self.tp > 1:
            time_s += 2 * self.model.layers * self.device.allreduce_time(tokens * self.model.hidden * 2.0, self.tp)
        return StepCost(time_s, flops, bytes_)

    def _decode_consts(self, batch: int):
        """Per batch size: the step's constant (time, flops, bytes) and attention coefficients."""
        hit = self._decode_cache.get(batch)
        if hit is not None:
            return hit
        dev, m, L = self.device, self.model, self.model.layers
        t_lin, f_lin, b_lin = self._linear(batch)
        _, n, kk = self.lm_head
        t_c = t_lin + dev.step_overhead_s + dev.gemm_time(batch, n, kk, 2.0, 2.0, self.compute_dtype)
        if self.tp > 1:
            t_c += 2 * L * dev.allreduce_time(batch * m.hidden * 2.0, self.tp)
        e = dev.spec.efficiency
        f_per_work = 4.0 * self.q_heads * m.head_dim            # attention FLOPs per unit of attn_work
        b_per_kv = 2 * self.kv_heads_shard * m.head_dim * self.kv_bytes
        b_fixed = batch * (self.q_heads + 2 * self.kv_heads_shard) * m.head_dim * 2.0
        hit = (t_c, f_lin + 2.0 * batch * n * kk, b_lin + n * kk * 2.0, f_per_work, b_per_kv, b_fixed,
               1.0 / (dev.peak_flops(self.compute_dtype) * e.attention_prefill * 0.5),
               1.0 / (dev.mem_bw_Bps * e.attention_decode_memory), e.kernel_overhead_us * 1e-6)
        if len(self._decode_cache) < 4096:
            self._decode_cache[batch] = hit
        return hit

    def decode_steps(self, batch, attn0, kv0, k):
        """:meth:`step` for decode steps on arrays: attention is affine in the step index, so a
        few numpy operations give all k steps (equal to ``step`` to ~1e-15 relative)."""
        if self.device.tables is not None:      # measured tables interpolate per call
            return CostModel.decode_steps(self, batch, attn0, kv0, k)
        t_c, f_c, b_c, f_w, b_kv, b_fixed, inv_c, inv_m, ovh = self._decode_consts(batch)
        L = self.model.layers
        i = np.arange(k, dtype=np.float64)
        fa0, fa1 = f_w * attn0, f_w * batch          # attention FLOPs of step i: fa0 + fa1 * i
        ba0, ba1 = b_kv * kv0 + b_fixed, b_kv * batch
        t_att = np.maximum(fa0 * inv_c + (fa1 * inv_c) * i, ba0 * inv_m + (ba1 * inv_m) * i)
        time_s = t_att * L + (t_c + ovh * L)
        flops = (f_c + fa0 * L) + (fa1 * L) * i
        bytes_ = (b_c + ba0 * L) + (ba1 * L) * i
        return time_s, flops, bytes_

    # --- memory -------------------------------------------------------------
    def weight_bytes_per_gpu(self) -> float:
        return self.model.weight_bytes(self.weight_dtype) / self.tp
