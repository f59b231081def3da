"""LLM shapes: a preset table, parameter counts, KV bytes per token, FLOPs per token.

Shapes are the public Hugging Face ``config.json`` values of each model.  The
cost model needs the decoder shape: layers, hidden size, query and KV heads
(GQA), head dim, MLP width and whether the MLP is gated (3 matrices, SwiGLU) or
plain (2 matrices, OPT).  Biases and norms are ignored (< 0.1% of the weights).

Mixture of experts (``experts > 0``): every layer after the first
``dense_layers`` replaces its MLP by a router (h x E, kept in bf16 and
replicated), ``experts`` routed experts of which ``experts_per_token`` (top-k)
run per token, and ``shared_experts`` that every token runs; each expert is an
MLP of width ``expert_width``.

Multi-head latent attention (``kv_lora_rank > 0``, DeepSeek-V2/V3): queries go
through a rank-``q_lora_rank`` bottleneck (0: a direct projection), keys and
values are cached as one latent vector of ``kv_lora_rank`` plus a shared RoPE
key of ``qk_rope_head_dim`` per token per layer, and decompressed per head into
``qk_nope_head_dim`` (+ rope) keys and ``v_head_dim`` values.

Sliding-window attention (``sliding_layers > 0``, gpt-oss): that many of the layers attend only
to the last ``sliding_window`` tokens (the new token included), the others to the whole
context.  Which layers slide does not matter to the cost model, and under pipeline parallelism
they are ASSUMED spread evenly (interleaved) over the stages, as in gpt-oss, where every other
layer slides: stage j of n_j layers holds n_j x sliding_layers / layers of them (a fraction when
the split does not fall evenly; it prices stage times and per-stage KV shares).
``kv_bytes_per_token`` is the full-attention layers' KV (what grows with the context);
``sliding_kv_bytes_per_token`` the sliding layers', of which a request keeps only a window.
"""
from __future__ import annotations

from dataclasses import dataclass

from .errors import ConfigError

#: bytes per element for every dtype pdsim knows
# fp4 = NVFP4: 4-bit values plus one fp8 scale per 16 (0.5 + 1/16 bytes); int4 group scales are not counted
DTYPE_BYTES = {"fp32": 4.0, "bf16": 2.0, "fp16": 2.0, "fp8": 1.0, "int8": 1.0, "int4": 0.5, "fp4": 0.5625}


def dtype_bytes(dtype: str, key: str = "dtype") -> float:
    try:
        return DTYPE_BYTES[dtype]
    except KeyError:
        raise ConfigError(f"unknown dtype; valid: {', '.join(DTYPE_BYTES)}", key=key, value=dtype) from None


@dataclass(frozen=True)
class ModelShape:
    name: str
    layers: int
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    mlp_width: int
    vocab: int
    tied_embeddings: bool = False
    gated_mlp: bool = True
    max_context: int = 4096
    # mixture of experts (experts == 0: a dense model)
    experts: int = 0
    experts_per_token: int = 0
    shared_experts: int = 0
    expert_width: int = 0
    dense_layers: int = 0             # the first k layers keep a dense MLP of mlp_width
    # multi-head latent attention (kv_lora_rank == 0: standard multi-head / grouped-query attention)
    q_lora_rank: int = 0
    kv_lora_rank: int = 0
    qk_rope_head_dim: int = 0
    qk_nope_head_dim: int = 0
    v_head_dim: int = 0
    source: str = ""
    # sliding-window attention: ``sliding_layers`` of the layers see only the last ``sliding_window`` tokens
    sliding_window: int | None = None
    sliding_layers: int = 0
    # multi-token-prediction modules shipped with the model (Hugging Face num_nextn_predict_layers; DeepSeek-V3: 1):
    # not among ``layers``, and what ``speculative: {method: mtp}`` drafts with (0: the model has no MTP head)
    mtp_layers: int = 0

    def __post_init__(self):
        if not 0 <= self.sliding_layers <= self.layers:
            raise ConfigError(f"sliding-window layers must be between 0 and the {self.layers} layers of {self.name}",
                              key="sliding_layers", value=self.sliding_layers)
        if self.sliding_window is not None and self.sliding_window < 1:
            raise ConfigError("a sliding window must be at least 1 token", key="sliding_window",
                              value=self.sliding_window)
        if self.sliding_layers and self.sliding_window is None:
            raise ConfigError("sliding-window layers need sliding_window (tokens)", key="sliding_layers",
                              value=self.sliding_layers)

    @property
    def has_sliding(self) -> bool:
        """Some layers use sliding-window attention."""
        return self.sliding_layers > 0

    @property
    def window(self) -> int | None:
        """The sliding window in tokens when some layers use it, else None."""
        return self.sliding_window if self.sliding_layers else None

    @property
    def full_layers(self) -> int:
        """Layers with full (whole-context) attention."""
        return self.layers - self.sliding_layers

    @property
    def is_moe(self) -> bool:
        return self.experts > 0

    @property
    def is_mla(self) -> bool:
        return self.kv_lora_rank > 0

    @property
    def moe_layers(self) -> int:
        return self.layers - self.dense_layers if self.is_moe else 0

    @property
    def dense_mlp_layers(self) -> int:
        return self.layers - self.moe_layers

    # --- parameter counts ---------------------------------------------------
    @property
    def attn_params_per_layer(self) -> int:
        h, H = self.hidden, self.heads
        if self.is_mla:
            qk = self.qk_nope_head_dim + self.qk_rope_head_dim
            q = h * self.q_lora_rank + self.q_lora_rank * H * qk if self.q_lora_rank else h * H * qk
            kv_a = h * (self.kv_lora_rank + self.qk_rope_head_dim)          # latent + shared rope key
            kv_b = self.kv_lora_rank * H * (self.qk_nope_head_dim + self.v_head_dim)
            return q + kv_a + kv_b + H * self.v_head_dim * h
        d = self.head_dim
        return h * H * d + 2 * h * self.kv_heads * d + H * d * h

    @property
    def mlp_params_per_layer(self) -> int:
        return (3 if self.gated_mlp else 2) * self.hidden * self.mlp_width

    @property
    def params_per_layer(self) -> int:
        """Parameters of one dense layer (attention + dense MLP)."""
        return self.attn_params_per_layer + self.mlp_params_per_layer

    @property
    def expert_params(self) -> int:
        """One expert's MLP."""
        return (3 if self.gated_mlp else 2) * self.hidden * self.expert_width

    @property
    def router_params_per_layer(self) -> int:
        return self.hidden * self.experts

    @property
    def routed_params(self) -> int:
        """Routed experts over all MoE layers (what expert parallelism shards)."""
        return self.moe_layers * self.experts * self.expert_params

    @property
    def router_params(self) -> int:
        return self.moe_layers * self.router_params_per_layer

    @property
    def replicated_attn_params(self) -> int:
        """MLA's down-projections (q_a, kv_a): replicated on every GPU under tensor parallelism (vLLM's
        fused_qkv_a_proj is a replicated linear); 0 for other attention."""
        if not self.is_mla:
            return 0
        return self.layers * self.hidden * (self.q_lora_rank + self.kv_lora_rank + self.qk_rope_head_dim)

    @property
    def decoder_params(self) -> int:
        """Every decoder layer: attention, dense MLPs, routers, shared and routed experts."""
        per_moe = (self.experts + self.shared_experts) * self.expert_params + self.router_params_per_layer
        return (self.layers * self.attn_params_per_layer + self.dense_mlp_layers * self.mlp_params_per_layer
                + self.moe_layers * per_moe)

    @property
    def active_decoder_params(self) -> int:
        """Decoder parameters one token runs through: top-k routed experts, not all of them."""
        return self.decoder_params - self.moe_layers * (self.experts - self.experts_per_token) * self.expert_params

    def active_params(self, input_embedding: bool = True) -> int:
        """Parameters a token uses: active decoder parameters + LM head (+ the input embedding,
        which is a lookup; model cards differ on whether they count it)."""
        emb = self.vocab * self.hidden
        return self.active_decoder_params + emb + (emb if input_embedding and not self.tied_embeddings else 0)

    @property
    def embedding_params(self) -> int:
        """Input embedding plus the LM head when it is not tied."""
        return self.vocab * self.hidden * (1 if self.tied_embeddings else 2)

    @property
    def params(self) -> int:
        return self.decoder_params + self.embedding_params

    def weight_bytes(self, weight_dtype: str = "bf16") -> float:
        """Bytes of all weights; embeddings, LM head and MoE routers stay in bf16 under weight quantisation."""
        wb = dtype_bytes(weight_dtype)
        return (self.decoder_params - self.router_params) * wb + (self.embedding_params + self.router_params) * 2.0

    def stage_split(self, pp: int, pp_layers=None) -> tuple[int, ...]:
        """Decoder layers of each of ``pp`` pipeline stages: ``pp_layers`` when given (a pool's explicit
        split, checked by :meth:`validate_pp`), else :func:`pp_split` (vLLM's default rule)."""
        if pp_layers is not None:
            assert len(pp_layers) == pp and sum(pp_layers) == self.layers, (self.layers, pp, pp_layers)
            return tuple(int(n) for n in pp_layers)
        return pp_split(self.layers, pp)

    def stage_layers(self, pp: int, pp_layers=None) -> list[tuple[int, int]]:
        """(dense-MLP layers, MoE layers) of each of ``pp`` pipeline stages of :meth:`stage_split` consecutive
        layers, so the first ``dense_layers`` dense ones fall in the first stage(s)."""
        ld = self.dense_mlp_layers
        out, start = [], 0
        for n in self.stage_split(pp, pp_layers):
            dense = min(n, max(0, ld - start))
            out.append((dense, n - dense))
            start += n
        return out

    def stage_shape(self, pp: int, stage: int, pp_layers=None) -> "ModelShape":
        """The decoder layers of one pipeline stage as a shape of that stage's layers (embeddings kept in
        the shape; :meth:`weight_bytes_per_gpu` places them on the first and last stage)."""
        from dataclasses import replace
        dense, moe = self.stage_layers(pp, pp_layers)[stage]
        n = dense + moe      # sliding layers: the stage's even share, rounded down (weights do not depend on it)
        return replace(self, layers=n, dense_layers=dense if self.is_moe else 0,
                       sliding_layers=self.sliding_layers * n // self.layers)

    def stage_weight_bytes(self, weight_dtype: str = "bf16", tp: int = 1, ep: int = 1, pp: int = 1,
                           pp_layers=None) -> list[float]:
        """Weights on one GPU of each pipeline stage (see :meth:`weight_bytes_per_gpu`): the stage's
        layers, + the input embedding on the first stage, + the LM head on the last."""
        wb = dtype_bytes(weight_dtype)
        emb = self.vocab * self.hidden * 2.0 / tp         # bf16, on the first and on the last stage
        out = []
        for j in range(pp):
            s = self.stage_shape(pp, j, pp_layers)
            repl = s.replicated_attn_params
            dense = (s.decoder_params - s.routed_params - s.router_params - repl) * wb
            w = dense / tp + s.routed_params * wb / (ep * (tp // ep)) + repl * wb + s.router_params * 2.0
            out.append(w + (emb if j in (0, pp - 1) else 0.0))
        return out

    def weight_bytes_per_gpu(self, weight_dtype: str = "bf16", tp: int = 1, ep: int = 1, pp: int = 1,
                             dp_attention: bool = False, pp_layers=None) -> float:
        """Weights on one GPU of an instance of ``tp`` GPUs whose routed experts are split over ``ep`` of
        them: the dense part / tp (tensor parallel); routed experts / ep whole experts per GPU group, each
        expert split over the tp / ep GPUs of its group, i.e. / tp in all (= experts / ep when ep = tp);
        MoE routers (bf16) and MLA down-projections replicated on every GPU, as vLLM shards them.

        With ``pp`` pipeline stages each GPU holds its stage's layers (:meth:`stage_split`: L / pp each
        when pp divides L, else vLLM's uneven rule or the pool's ``pp_layers``); the input embedding lives
        on the first stage and the LM head on the last (a tied LM head is a second copy there, as vLLM
        keeps it), both vocab-parallel over tp.  Returned: the most loaded stage's GPU
        (:meth:`stage_weight_bytes` gives every stage's).

        With ``dp_attention`` (ep = tp, pp = 1) every GPU is an attention rank of its own: attention,
        dense MLPs, shared experts, embedding and LM head whole on every GPU, routed experts / ep, as
        SGLang and TensorRT-LLM place DeepSeek with DP attention."""
        assert tp % ep == 0
        if dp_attention:
            assert ep == tp and pp == 1, (tp, ep, pp)
            wb = dtype_bytes(weight_dtype)
            return ((self.decoder_params - self.routed_params - self.router_params) * wb
                    + self.embedding_params * 2.0 + self.routed_params * wb / ep + self.router_params * 2.0)
        if pp > 1:
            return max(self.stage_weight_bytes(weight_dtype, tp, ep, pp, pp_layers))
        wb = dtype_bytes(weight_dtype)
        repl = self.replicated_attn_params
        dense = (self.decoder_params - self.routed_params - self.router_params - repl) * wb + self.embedding_params * 2.0
        return dense / tp + self.routed_params * wb / (ep * (tp // ep)) + repl * wb + self.router_params * 2.0

    def kv_bytes_per_layer_token(self, kv_dtype: str = "bf16") -> float:
        """KV cache of one layer per token.  GQA: K and V, 2 * n_kv * d * bytes.  MLA: the latent plus
        the shared RoPE key, (kv_lora_rank + qk_rope_head_dim) * bytes."""
        if self.is_mla:
            return (self.kv_lora_rank + self.qk_rope_head_dim) * dtype_bytes(kv_dtype)
        return 2 * self.kv_heads * self.head_dim * dtype_bytes(kv_dtype)

    def kv_bytes_per_token(self, kv_dtype: str = "bf16") -> float:
        """KV cache per token of the full-attention layers (all layers of a model without sliding-window
        layers): GQA 2 * L * n_kv * d * bytes, MLA L * (kv_lora_rank + qk_rope_head_dim) * bytes.  What
        grows with the context; the sliding layers' KV is :meth:`sliding_kv_bytes_per_token` x the window."""
        if self.is_mla:
            return self.full_layers * (self.kv_lora_rank + self.qk_rope_head_dim) * dtype_bytes(kv_dtype)
        return 2 * self.full_layers * self.kv_heads * self.head_dim * dtype_bytes(kv_dtype)

    def sliding_kv_bytes_per_token(self, kv_dtype: str = "bf16") -> float:
        """KV cache per token of the sliding-window layers (0 without them)."""
        return self.sliding_layers * self.kv_bytes_per_layer_token(kv_dtype)

    def sliding_extra_blocks(self, block_size: int) -> int:
        """Blocks a request holds, on top of ceil(tokens / block_size), for its sliding layers' window.

        vLLM's hybrid KV manager keeps, for a sliding layer, only the blocks covering the last
        ``sliding_window`` tokens plus the block being written: ceil(W / block_size) + 1 blocks of the
        sliding layers' bytes.  A pool block is block_size tokens of the FULL layers' KV, so those blocks
        are counted in full-layer block units: ceil((ceil(W / bs) + 1) x sliding_layers / full_layers).
        The same count on every pipeline stage (both kinds spread evenly over the stages).  0 without
        sliding layers.  SIMPLIFICATION: a constant per request from its first block to its release (a
        prefill chunk longer than the window briefly needs more on the sliding layers; not modelled)."""
        if not self.sliding_layers:
            return 0
        assert self.full_layers > 0, "every layer slides: the pool has no full-layer block unit"
        window_blocks = -(-self.sliding_window // block_size) + 1
        return -(-(window_blocks * self.sliding_layers) // self.full_layers)

    def kv_bytes_per_token_per_gpu(self, kv_dtype: str = "bf16", tp: int = 1, pp: int = 1, pp_layers=None) -> float:
        """KV cache per token on one GPU of a tp instance.  GQA: KV heads split over the GPUs (one
        replicated head each when tp > kv_heads).  MLA: ASSUMPTION, as vLLM and SGLang do with tensor-
        parallel attention: the latent is shared by all heads, so every GPU keeps the whole latent.
        With ``pp`` pipeline stages a GPU keeps the KV of its stage's layers only: returned, the stage
        with the most layers (:meth:`stage_kv_bytes_per_token` gives every stage's)."""
        return max(self.stage_kv_bytes_per_token(kv_dtype, tp, pp, pp_layers))

    def stage_kv_bytes_per_token(self, kv_dtype: str = "bf16", tp: int = 1, pp: int = 1, pp_layers=None) -> list[float]:
        """KV bytes per token on one GPU of each pipeline stage: the whole model's per-GPU bytes x the
        stage's share of the layers (/ pp exactly when the stages are even)."""
        if self.is_mla:
            per = self.kv_bytes_per_token(kv_dtype)
        else:
            per = self.kv_bytes_per_token(kv_dtype) * max(1, self.kv_heads // tp) / self.kv_heads
        if pp == 1:
            return [per]
        split = self.stage_split(pp, pp_layers)
        return [per / pp if n * pp == self.layers else per * n / self.layers for n in split]

    def linear_flops_per_token(self) -> float:
        """2 FLOPs per active weight per token over the decoder layers (LM head excluded)."""
        return 2.0 * self.active_decoder_params

    def validate_tp(self, tp: int, key: str = "tp") -> None:
        if tp < 1 or self.heads % tp:
            raise ConfigError(f"tensor parallelism must divide the {self.heads} attention heads of {self.name}",
                              key=key, value=tp)

    def validate_pp(self, pp: int, key: str = "pp", pp_layers=None, layers_key: str = "pp_layers") -> None:
        """Pipeline parallelism splits the layers into pp stages of at least one layer each: vLLM's default
        split (:func:`pp_split`) or an explicit ``pp_layers`` (one count per stage, summing to the layers)."""
        if pp < 1 or pp > self.layers:
            raise ConfigError(f"pipeline parallelism needs 1 to {self.layers} stages (the {self.layers} layers "
                              f"of {self.name}, at least one a stage)", key=key, value=pp)
        if pp_layers is None:
            return
        shown = list(pp_layers)
        if pp == 1:
            raise ConfigError("an explicit layer split needs pipeline parallelism (pp > 1; pp is 1)",
                              key=layers_key, value=shown)
        if len(shown) != pp or any(not isinstance(n, int) or isinstance(n, bool) or n < 1 for n in shown) \
                or sum(shown) != self.layers:
            raise ConfigError(f"give one layer count per stage: {pp} whole numbers >= 1 summing to the "
                              f"{self.layers} layers of {self.name}", key=layers_key, value=shown)

    def validate_dp_attention(self, tp: int, ep: int, pp: int, key: str = "dp_attention") -> None:
        """DP attention: attention data-parallel over the instance's tp GPUs, experts over all of them."""
        if not self.is_moe:
            raise ConfigError(f"DP attention pairs data-parallel attention with expert-parallel MoE layers; "
                              f"{self.name} is dense", key=key, value=True)
        if tp < 2 or ep != tp:
            raise ConfigError(f"DP attention spreads attention over the tp={tp} GPUs and the experts over all of "
                              f"them: it needs tp >= 2 and ep = tp (ep is {ep})", key=key, value=True)
        if pp != 1:
            raise ConfigError(f"DP attention with pipeline parallelism (pp={pp}) is not modelled", key=key, value=True)

    def validate_ep(self, ep: int, tp: int, key: str = "ep") -> None:
        """Expert parallelism shards the routed experts over ep of the instance's tp GPUs."""
        if ep == 1:
            return
        if not self.is_moe:
            raise ConfigError(f"expert parallelism needs a mixture-of-experts model; {self.name} is dense",
                              key=key, value=ep)
        if ep < 1 or self.experts % ep:
            raise ConfigError(f"expert parallelism must divide the {self.experts} experts of {self.name}",
                              key=key, value=ep)
        if tp % ep:
            raise ConfigError(f"expert parallelism shards experts over the instance's tp={tp} GPUs, so it must "
                              f"divide tp (with dp_attention too: it needs ep = tp)", key=key, value=ep)


def pp_split(layers: int, pp: int) -> tuple[int, ...]:
    """Layers of each of ``pp`` pipeline stages under vLLM's default rule (``get_pp_indices``): L // pp
    each, and the L % pp left over one each to the stages just before the last, counting back from the
    second-to-last (the last stage also holds the final norm and the LM head).  Even when pp divides L."""
    base, extra = divmod(layers, pp)
    out = [base] * pp
    for j in range(pp - 1 - extra, pp - 1):
        out[j] += 1
    return tuple(out)


def _m(name, layers, hidden, heads, kv_heads, mlp, vocab, ctx, head_dim=None, tied=False, gated=True):
    return ModelShape(name, layers, hidden, heads, kv_heads, head_dim or hidden // heads, mlp, vocab,
                      tied, gated, ctx)


#: exact names only (no fuzzy matching); the error lists the valid ones
PRESETS: dict[str, ModelShape] = {m.name: m for m in [
    _m("llama-2-7b", 32, 4096, 32, 32, 11008, 32000, 4096),
    _m("llama-2-13b", 40, 5120, 40, 40, 13824, 32000, 4096),
    _m("llama-2-70b", 80, 8192, 64, 8, 28672, 32000, 4096),
    _m("llama-3.1-8b", 32, 4096, 32, 8, 14336, 128256, 131072),
    _m("llama-3.1-70b", 80, 8192, 64, 8, 28672, 128256, 131072),
    # small models used as speculative-decoding drafts (shapes from their public config.json)
    _m("llama-3.2-1b", 16, 2048, 32, 8, 8192, 128256, 131072, head_dim=64, tied=True),
    _m("llama-3.2-3b", 28, 3072, 24, 8, 8192, 128256, 131072, head_dim=128, tied=True),
    _m("mistral-7b", 32, 4096, 32, 8, 14336, 32000, 32768),
    _m("qwen2.5-7b", 28, 3584, 28, 4, 18944, 152064, 32768),
    _m("qwen2.5-32b", 64, 5120, 40, 8, 27648, 152064, 32768),
    _m("qwen2.5-72b", 80, 8192, 64, 8, 29568, 152064, 32768),
    _m("qwen3-8b", 36, 4096, 32, 8, 12288, 151936, 40960, head_dim=128),
    _m("qwen3-32b", 64, 5120, 64, 8, 25600, 151936, 40960, head_dim=128),
    _m("opt-13b", 40, 5120, 40, 40, 20480, 50272, 2048, tied=True, gated=False),
    _m("opt-66b", 64, 9216, 72, 72, 36864, 50272, 2048, tied=True, gated=False),
    _m("opt-175b", 96, 12288, 96, 96, 49152, 50272, 2048, tied=True, gated=False),
]}

_AIC = "transcribed from aiconfigurator-core 0.12.0 model_configs/{}_config.json (the Hugging Face config.json of {})"


def _hf(repo: str, note: str = "") -> str:
    return _AIC.format(repo.replace("/", "--"), repo) + (f"; {note}" if note else "")


def _deepseek_v3(name: str, repo: str) -> ModelShape:
    # MTP module (num_nextn_predict_layers: 1) left out of the 61 layers: 671B is the main model without it;
    # mtp_layers records it for speculative decoding with method: mtp (pdsim/speculative.py prices it)
    return ModelShape(name, 61, 7168, 128, 128, 128 + 64, 18432, 129280, max_context=163840,
                      experts=256, experts_per_token=8, shared_experts=1, expert_width=2048, dense_layers=3,
                      q_lora_rank=1536, kv_lora_rank=512, qk_rope_head_dim=64, qk_nope_head_dim=128,
                      v_head_dim=128, mtp_layers=1,
                      source=_hf(repo, "the multi-token-prediction layer is not among the 61 layers: it serves "
                                       "only as the draft of speculative: {method: mtp}"))


#: mixture-of-experts and MLA presets (head_dim of an MLA model: the q/k head dim, nope + rope)
PRESETS.update({m.name: m for m in [
    _deepseek_v3("deepseek-v3", "deepseek-ai/DeepSeek-V3"),
    _deepseek_v3("deepseek-r1", "deepseek-ai/DeepSeek-R1"),
    ModelShape("qwen3-30b-a3b", 48, 2048, 32, 4, 128, 6144, 151936, max_context=40960,
               experts=128, experts_per_token=8, expert_width=768, source=_hf("Qwen/Qwen3-30B-A3B")),
    ModelShape("qwen3-235b-a22b", 94, 4096, 64, 4, 128, 12288, 151936, max_context=40960,
               experts=128, experts_per_token=8, expert_width=1536, source=_hf("Qwen/Qwen3-235B-A22B")),
    ModelShape("mixtral-8x7b", 32, 4096, 32, 8, 128, 14336, 32000, max_context=32768,
               experts=8, experts_per_token=2, expert_width=14336, source=_hf("mistralai/Mixtral-8x7B-v0.1")),
    ModelShape("gpt-oss-120b", 36, 2880, 64, 8, 64, 2880, 201088, max_context=131072,
               experts=128, experts_per_token=4, expert_width=2880, sliding_window=128, sliding_layers=18,
               source=_hf("openai/gpt-oss-120b", "sliding-window attention modelled: sliding_window 128 and "
                          "layer_types alternating sliding_attention / full_attention (18 of the 36 layers), so "
                          "18 layers attend and read KV over min(context, 128) tokens and keep a 128-token window "
                          "of KV (ceil(128 / block) + 1 blocks per request), 18 over the whole context; under "
                          "pipeline parallelism the sliding layers are assumed spread evenly over the stages. "
                          "Not modelled: attention sinks (one learned logit per head: negligible FLOPs), biases, and "
                          "MXFP4 experts beside bf16 attention (weight_dtype applies to all decoder weights)")),
]})


def get_model(name: str, key: str = "model") -> ModelShape:
    try:
        return PRESETS[name]
    except KeyError:
        raise ConfigError(f"unknown model; valid presets: {', '.join(PRESETS)} (or give an inline shape)",
                          key=key, value=name) from None
