"""LLM shapes: a preset table, parameter counts, KV bytes per token, FLOPs per token.

Shapes are the public Hugging Face ``config.json`` values of each model.  The
cost model only needs the dense decoder shape: layers, hidden size, query and
KV heads (GQA), head dim, MLP width and whether the MLP is gated (3 matrices,
SwiGLU) or plain (2 matrices, OPT).  Biases and norms are ignored (< 0.1% of
the weights).
"""
from __future__ import annotations

from dataclasses import dataclass

from .errors import ConfigError

#: bytes per element for every dtype pdsim knows
DTYPE_BYTES = {"fp32": 4.0, "bf16": 2.0, "fp16": 2.0, "fp8": 1.0, "int8": 1.0, "int4": 0.5}


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

    # --- parameter counts ---------------------------------------------------
    @property
    def attn_params_per_layer(self) -> int:
        h, d = self.hidden, self.head_dim
        return h * self.heads * d + 2 * h * self.kv_heads * d + self.heads * d * h

    @property
    def mlp_params_per_layer(self) -> int:
        return (3 if self.gated_mlp else 2) * self.hidden * self.mlp_width

    @property
    def params_per_layer(self) -> int:
        return self.attn_params_per_layer + self.mlp_params_per_layer

    @property
    def embedding_params(self) -> int:
        """Input embedding plus the LM head when it is not tied."""
        return self.vocab * self.hidden * (1 if self.tied_embeddings else 2)

    @property
    def params(self) -> int:
        return self.layers * self.params_per_layer + self.embedding_params

    def weight_bytes(self, weight_dtype: str = "bf16") -> float:
        """Bytes of all weights; embeddings and LM head stay in bf16 under weight quantisation."""
        wb = dtype_bytes(weight_dtype)
        return self.layers * self.params_per_layer * wb + self.embedding_params * 2.0

    def kv_bytes_per_token(self, kv_dtype: str = "bf16") -> float:
        """K and V for every layer: 2 * L * n_kv * d * bytes (GQA-aware)."""
        return 2 * self.layers * self.kv_heads * self.head_dim * dtype_bytes(kv_dtype)

    def linear_flops_per_token(self) -> float:
        """2 FLOPs per weight per token over the decoder layers (LM head excluded)."""
        return 2.0 * self.layers * self.params_per_layer

    def validate_tp(self, tp: int, key: str = "tp") -> None:
        if tp < 1 or self.heads % tp:
            raise ConfigError(f"tensor parallelism must divide the {self.heads} attention heads of {self.name}",
                              key=key, value=tp)


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


def get_model(name: str, key: str = "model") -> ModelShape:
    try:
        return PRESETS[name]
    except KeyError:
        raise ConfigError(f"unknown model; valid presets: {', '.join(PRESETS)} (or give an inline shape)",
                          key=key, value=name) from None
