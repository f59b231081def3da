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

Mixture of experts (MoE layers): a router GEMM (replicated), shared experts as a dense
MLP, and the routed experts as one grouped GEMM over the experts a step actually hits:
under uniform routing ``T`` tokens of top-k out of ``E`` experts hit
``E (1 - (1 - k/E)^T)`` distinct experts in expectation (:func:`expected_distinct_experts`),
whose weights are read once; FLOPs are those of the ``T k`` token-expert pairs.  With
expert parallelism ``ep`` each GPU holds ``E / ep`` experts (each split over ``tp / ep``
GPUs) and gets ``T k / ep`` pairs.  Under TP attention every GPU already holds every token:
no dispatch, and the MoE layer's all-reduce sums the experts' partial outputs as a dense
MLP's would.  Under DP attention (below) the ranks hold different tokens and the MoE layer
exchanges them by an all-to-all dispatch and combine of ``T h 2 (ep - 1) / ep`` bytes per
GPU each way.
With ``expert_skew`` > 0 (Zipf popularity) the experts hit and the pairs are those of
the hottest rank (experts placed round robin in popularity order); at 0, the mean rank
(the random imbalance of uniform routing over a finite batch is not modelled).

MLA attention: prefill in the decompressed form (per-head keys of nope + rope dims,
values of v dims); decode in the absorbed form (queries projected into the latent: every
head reads the shared latent of kv_lora_rank + rope dims per context token).  The
decompression ``kv_b`` is priced as a linear over the step's new tokens, which is exact
for the absorbed decode (W_UK and W_UV on the new tokens) and for a prefill from empty;
re-decompressing a cached prefix in a chunked prefill is not priced.

Pipeline parallelism: :meth:`RooflineCost.stage_times` prices one micro-batch on each of ``pp``
stages (each its own layers: L / pp when pp divides L, else vLLM's uneven split or the pool's
``pp_layers``; embedding on the first, LM head on the last, all-reduces within a stage's TP group, no
per-step overhead); :class:`pdsim.pipeline.PipelineCost` turns those into the period of a
micro-batched pipeline.  ``step`` itself never depends on ``pp``.

DP attention (``dp_attention``, ep = tp): every op but the routed experts runs on the busiest attention
rank's share of the batch with whole (unsharded) weights; the routed experts on all the step's tokens / ep;
no all-reduce; the all-to-all sends a rank's own tokens, each to every other rank holding one of its
experts (:func:`alltoall_fanout`).  A request's tokens are never split over ranks:
a step's decodes stay spread evenly over the ranks (their KV lives there), its prompt chunks go whole,
largest first, each onto the rank with the fewest tokens, and the step takes as long as its slowest rank,
each rank's attention on its own kernel (:func:`busiest_rank`, which the simulator's steps use); a step of
decodes only (every decode step, the fast path's windows) gives the busiest rank ceil(batch / tp) of them,
each carrying the batch's mean context (ASSUMPTION: requests placed evenly at admission).

Sliding-window attention (a model with ``sliding_layers`` > 0 and window W): a sliding layer's
new token at position p (it attends to p tokens, itself included, on a full layer) attends to
min(p, W).  The step then carries two more aggregates, ``swa = (swa_work, swa_kv)``, the sliding
layers' counterparts of ``attn_work`` and ``kv_read_tokens`` (:func:`sliding_aggregates`); the
full layers price attention on (attn_work, kv_read_tokens), the sliding layers on swa, each on its
own layer count.  Callers without sliding layers pass no ``swa`` and run the code they always ran.

``ConstantCost`` and ``LinearCost`` are the what-if and theory-test models.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import math

import numpy as np

from . import kernels
from .devices import DeviceProfile
from .models import ModelShape, dtype_bytes


def expert_hit_probs(k: int, experts: int, skew: float = 0.0) -> np.ndarray:
    """Probability that one token routes to each expert, most popular first: popularity p_e
    proportional to (e + 1)^-skew (Zipf; 0: uniform, k/E each), q_e = k p_e with any q_e above 1 capped
    and the excess spread over the others in proportion (so sum q = k).  For top-1 this is exact; for
    top-k it approximates the choice of k distinct experts by k times the popularity."""
    p = np.arange(1, experts + 1, dtype=np.float64) ** -float(skew)
    q = k * p / p.sum()
    while (q > 1.0 + 1e-12).any():
        full = q >= 1.0
        q[full] = 1.0
        rest = k - full.sum()
        q[~full] *= rest / q[~full].sum()
    return q


def alltoall_fanout(k: int, experts: int, ep: int, skew: float = 0.0) -> float:
    """Expected copies of one token an expert-parallel all-to-all sends off its GPU: one to each other rank
    that holds at least one of its top-k experts (DeepEP's and pplx's dispatch send a token once per
    destination rank; the combine returns as many).  Uniform routing over ``experts`` experts, ``experts / ep``
    on each rank: a given rank holds none of a token's k distinct experts with probability
    C(E - E/ep, k) / C(E, k), so (ep - 1) x (1 - that) copies (DeepSeek-V3, 256 experts, top 8, ep 8: 4.63).
    With a popularity ``skew`` (experts placed round robin in popularity order, :func:`expert_hit_probs`'s
    q_e / k the popularity) rank r, holding a share P_r of the popularity, is missed by a token's k picks
    with probability (1 - P_r)^k (picks with replacement: at skew 0+ that gives 4.60 for DeepSeek-V3, the
    exact 4.63 at 0), and a token's own rank is any of the ep alike: (ep - 1) / ep x the ranks hit."""
    if ep <= 1:
        return 0.0
    if not skew:
        per = experts // ep
        return (ep - 1) * (1.0 - math.comb(experts - per, k) / math.comb(experts, k))
    share = expert_hit_probs(k, experts, skew) / k
    hit = sum(1.0 - (1.0 - float(share[r::ep].sum())) ** k for r in range(ep))
    return (ep - 1) / ep * hit


def expected_distinct_experts(tokens, k: int, experts: int, skew: float = 0.0):
    """Expected distinct experts hit by ``tokens`` tokens that each pick ``k`` distinct experts of
    ``experts``: uniform routing, each expert is missed by one token with probability 1 - k/E;
    with a popularity ``skew``, sum over experts of 1 - (1 - q_e)^tokens (:func:`expert_hit_probs`)."""
    if not skew:
        return experts * (1.0 - (1.0 - k / experts) ** tokens)
    return float(np.sum(1.0 - (1.0 - expert_hit_probs(k, experts, skew)) ** tokens))


def sliding_positions(c: int, n: int, W: int) -> int:
    """sum over the new tokens' positions p = c + 1 .. c + n of min(p, W): what a chunk of n tokens after c
    cached ones attends to on a sliding layer of window W (an integer, exact).

    Closed form: with a = c + 1 and b = c + n the first and last position,
      b <= W (the window covers the chunk):  sum_{p=a}^{b} p = (a + b) n / 2
      a >= W (every token sees a full window): n W
      a < W < b:  sum_{p=a}^{W} p + (b - W) W = (a + W)(W - a + 1) / 2 + (b - W) W
    ((a + b) and (b - a + 1) differ in parity, so the products are even and // 2 is exact.)"""
    if n <= 0:
        return 0
    a, b = c + 1, c + n
    if b <= W:
        return (a + b) * n // 2
    if a >= W:
        return n * W
    return (a + W) * (W - a + 1) // 2 + (b - W) * W


def sliding_aggregates(c: int, n: int, W: int) -> tuple[float, int]:
    """(work, KV tokens read) of a chunk of n tokens after c cached ones on one sliding layer of window W.

    Work: sum over the tokens of (min(p, W) - 1/2), the full layers' convention (their ``attn_work`` adds
    n (c + n / 2) = sum_{p=c+1}^{c+n} (p - 1/2), the causal mean), so a window covering the whole context
    prices exactly as a full layer.  A decode at context c: min(c + 1, W) - 1/2.  KV read: the distinct
    cached tokens the chunk's queries touch, min(c + n, n + W - 1) (the chunk and the W - 1 before it; a
    decode: min(c + 1, W))."""
    return sliding_positions(c, n, W) - 0.5 * n, min(c + n, n + W - 1)


def window_sums(c0: np.ndarray, k: int, W: int) -> np.ndarray:
    """sum_i min(c0_i + 1 + j, W) for j = 0 .. k - 1 (int64): the sliding layers' positions of k decode steps
    of a batch whose request i has c0_i cached tokens before step 0.  O(B log B + k log B): sort the
    contexts once; at step j the requests with c0_i + 1 + j < W (c0_i < W - 1 - j: the first m of the
    sorted contexts, found by binary search) contribute c0_i + 1 + j, the rest W."""
    cs = np.sort(np.asarray(c0, dtype=np.int64))
    B = len(cs)
    pre = np.zeros(B + 1, dtype=np.int64)
    np.cumsum(cs, out=pre[1:])
    j = np.arange(k, dtype=np.int64)
    m = np.searchsorted(cs, W - 1 - j, side="left")
    return pre[m] + m * (1 + j) + (B - m) * W


@dataclass(slots=True)
class StepCost:
    time_s: float
    flops: float
    bytes: float


class CostModel:
    """Protocol: ``step(tokens, attn_work, kv_read_tokens, sampled, batch) -> StepCost``."""

    tp: int = 1
    window = None       # sliding window (tokens) of the model's sliding layers; None: no sliding layers

    def step(self, tokens: int, attn_work: float, kv_read_tokens: int, sampled: int,
             batch: int, swa=None) -> StepCost:  # pragma: no cover - interface
        raise NotImplementedError

    def decode_steps(self, batch: int, attn0: float, kv0: int, k: int, swa=None):
        """Costs of ``k`` consecutive pure-decode steps of the same ``batch`` requests.

        Step i (0-based) has ``attn_work = attn0 + batch * i`` and ``kv_read_tokens =
        kv0 + batch * i``: every context grows by one token a step.  Returns numpy arrays
        (time_s, flops, bytes), each element what :meth:`step` gives for that step (the
        multi-step fast path of :class:`pdsim.instance.Instance` relies on it).
        With sliding layers ``swa`` = (work, KV read) arrays of the k steps' sliding aggregates.
        This generic version calls ``step``; subclasses vectorise it.
        """
        out = np.empty((3, k))
        for i in range(k):
            if swa is None:
                c = self.step(batch, attn0 + batch * i, kv0 + batch * i, batch, batch)
            else:
                c = self.step(batch, attn0 + batch * i, kv0 + batch * i, batch, batch,
                              swa=(float(swa[0][i]), float(swa[1][i])))
            out[0, i], out[1, i], out[2, i] = c.time_s, c.flops, c.bytes
        return out[0], out[1], out[2]

    def prefill_time(self, prompt_tokens: int) -> float:
        """A lone prefill of a whole prompt (TTFT of an idle instance)."""
        p = prompt_tokens
        W = self.window
        if W is None:
            return self.step(p, p * p / 2.0, p, 1, 1).time_s
        return self.step(p, p * p / 2.0, p, 1, 1, swa=sliding_aggregates(0, p, W)).time_s

    def decode_time(self, batch: int, context: int) -> float:
        """One decode step of ``batch`` requests that each have ``context`` tokens in cache."""
        W = self.window
        if W is None:
            return self.step(batch, float(batch * context), batch * (context + 1), batch, batch).time_s
        w, kv = sliding_aggregates(context, 1, W)
        return self.step(batch, float(batch * context), batch * (context + 1), batch, batch,
                         swa=(batch * w, batch * kv)).time_s


def busiest_rank(items, ranks: int):
    """The attention ranks of a DP-attention step whose requests are ``items`` = [(request, new tokens)]
    (before the step: ``computed`` tokens in cache), as :func:`deal_ranks` places them; a one-token item is a
    decode (its KV stays on its rank), a longer one a prompt chunk.  None when every item is one token."""
    return deal_ranks([request_part(req, n) for req, n in items], ranks)


def request_part(req, n: int) -> tuple:
    """One request's part of a step it advances by ``n`` tokens (before the step): (new tokens, attention
    work, KV read, sampled tokens, is a decode), as :func:`deal_ranks` takes them."""
    c = req.computed
    return n, n * (c + 0.5 * n), c + n, 1 if c + n == req.prompt_tokens + req.generated else 0, n == 1


def splits_mla_steps(cost) -> bool:
    """Whether ``cost`` prices a mixed MLA step's decodes and chunks apart (:meth:`RooflineCost.step`'s
    ``decodes``, through any engine / power-cap wrapper; a pipelined pool's stages do not)."""
    import inspect
    if not getattr(getattr(cost, "model", None), "is_mla", False):
        return False
    # every layer must take ``decodes``: a wrapper that passes it on (a power cap) over one that does not (a
    # pipelined pool's stages) would hand it to a step that cannot take it
    c = cost
    while c is not None:
        if "decodes" not in inspect.signature(c.step).parameters:
            return False
        c = c.__dict__.get("inner") if hasattr(c, "__dict__") else None
    return True


def decode_part(items):
    """(tokens, attn_work, kv_read_tokens, requests) of a step's one-token items (its decodes), from
    ``items`` = [(request, new tokens)] before the step."""
    t = a = k = 0
    for req, n in items:
        if n == 1:
            c = req.computed
            t += 1
            a += c + 0.5
            k += c + 1
    return t, a, k, t


def deal_ranks(parts, ranks: int):
    """Each attention rank's share of a DP-attention step, from per-request parts (new tokens, attention work,
    KV read, sampled tokens, is a decode).  A decode's KV lives on one rank, where it stays: the decodes are
    spread evenly (floor(d / ranks) each, one more on the lowest ranks, each carrying the decodes' mean work),
    as an even placement at admission keeps them; the prompt chunks, whole, largest first, each onto the rank
    with the fewest tokens so far (ties: the lowest rank).  Returns [(tokens, attn_work, kv_read_tokens,
    sampled, requests, decodes)] of the ranks that hold work (``decodes``: the (tokens, attn_work,
    kv_read_tokens, requests) of its decodes) (the step takes as long as the slowest:
    :meth:`RooflineCost.step` prices each), or None when there is no chunk (a decode-only step: the
    proportional share of :meth:`RooflineCost._rank` is the same placement)."""
    chunks = [p for p in parts if not p[4]]
    if not chunks:
        return None
    d = len(parts) - len(chunks)
    dt = da = dk = ds = 0
    for p in parts:
        if p[4]:
            dt += p[0]
            da += p[1]
            dk += p[2]
            ds += p[3]
    base, extra = divmod(d, ranks)
    load, dec = [], []
    for j in range(ranks):              # tokens, attention work, KV read, sampled, requests
        k = base + (1 if j < extra else 0)
        f = k / d if d else 0.0
        load.append([f * dt, f * da, f * dk, f * ds, k])
        dec.append((f * dt, f * da, f * dk, k))
    chunks.sort(key=lambda x: -x[0])    # stable: equal chunks keep the step's order
    for n, a, kv, s, _ in chunks:
        x = min(load, key=lambda y: y[0])
        x[0] += n
        x[1] += a
        x[2] += kv
        x[3] += s
        x[4] += 1
    # each rank's decode part last: an MLA rank prices its decodes and its chunks as two kernels
    return [(*x, dp) for x, dp in zip(load, dec) if x[4]]


def ranked_parts(items, ranks: int, decode_steps: bool = False):
    """:func:`deal_ranks`' per-rank shares when every request has its own rank (``req.rank``, a DP-balanced
    pool: :class:`~pdsim.scheduler.BalancedDP`): each request's part on its rank.  A decode-only step gives
    None (the proportional share prices it) unless ``decode_steps``: a balanced instance passes it, since its
    decodes' ranks are known and the step waits for the slowest rank."""
    if not decode_steps and all(n == 1 for _, n in items):
        return None
    load = [[0, 0.0, 0, 0, 0] for _ in range(ranks)]
    dec = [[0, 0.0, 0, 0] for _ in range(ranks)]
    for req, n in items:
        t, a, k, s, is_decode = request_part(req, n)
        x = load[req.rank]
        x[0] += t
        x[1] += a
        x[2] += k
        x[3] += s
        x[4] += 1
        if is_decode:
            d = dec[req.rank]
            d[0] += t
            d[1] += a
            d[2] += k
            d[3] += 1
    return [(*x, tuple(d)) for x, d in zip(load, dec) if x[4]]


@dataclass
class ConstantCost(CostModel):
    """Every step costs ``step_s`` whatever it holds (M/D/1 theory tests)."""
    step_s: float
    tp: int = 1
    window: int | None = None

    def step(self, tokens, attn_work, kv_read_tokens, sampled, batch, swa=None):
        return StepCost(self.step_s, 0.0, 0.0)

    def decode_steps(self, batch, attn0, kv0, k, swa=None):
        return np.full(k, float(self.step_s)), np.zeros(k), np.zeros(k)


@dataclass
class LinearCost(CostModel):
    """``base_s + per_token_s * tokens + per_kv_token_s * kv_read_tokens`` per step.

    With sliding layers (``window``, ``sliding_share`` = sliding layers / layers) ``per_kv_token_s`` is per
    KV token read on every layer, so the KV term is ``per_kv_token_s * ((1 - s) kv_read_tokens + s swa_kv)``:
    the full layers read the whole context, the sliding ones their window."""
    base_s: float = 0.0
    per_token_s: float = 0.0
    per_kv_token_s: float = 0.0
    tp: int = 1
    window: int | None = None
    sliding_share: float = 0.0

    def step(self, tokens, attn_work, kv_read_tokens, sampled, batch, swa=None):
        if swa is None:
            return StepCost(self.base_s + self.per_token_s * tokens + self.per_kv_token_s * kv_read_tokens,
                            0.0, 0.0)
        s = self.sliding_share
        kv = (1.0 - s) * kv_read_tokens + s * swa[1]
        return StepCost(self.base_s + self.per_token_s * tokens + self.per_kv_token_s * kv, 0.0, 0.0)

    def decode_steps(self, batch, attn0, kv0, k, swa=None):
        kv = kv0 + batch * np.arange(k, dtype=np.float64)
        if swa is not None:
            s = self.sliding_share
            kv = (1.0 - s) * kv + s * np.asarray(swa[1], dtype=np.float64)
        return (self.base_s + self.per_token_s * batch) + self.per_kv_token_s * kv, np.zeros(k), np.zeros(k)


@dataclass(slots=True)
class Op:
    """One operator of a step: ``count`` identical kernels, each of ``flops`` and ``bytes`` (floats, or
    arrays over k decode steps), evaluated by :meth:`RooflineCost.op_time` from ``kind`` and ``args``."""
    name: str
    kind: str            # gemm | grouped_gemm | attention | elementwise | allreduce | alltoall | overhead
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
    ep: int = 1
    expert_skew: float = 0.0
    pp: int = 1          # pipeline stages: only :meth:`stage_times` splits by them (pdsim/pipeline.py)
    dp_attention: bool = False   # attention data-parallel over the tp GPUs, experts expert-parallel (ep = tp)
    # price routed experts from a measured profile's MoE tables where it has the shape (opt-in: on the silicon
    # sample the tables make DeepSeek fp8 serving 30-80% too slow end to end; README "Measured MoE tables")
    moe_tables: bool = False
    # price MLA attention and the MoE all-to-all from a measured profile's MLA / DeepEP tables where it has the
    # pool's shape (imported profiles; README "Mixture of experts and MLA"): MLA on by default (on the MoE silicon
    # sample it lowers DeepSeek TPOT error a little), the all-to-all opt-in (it raises it)
    mla_tables: bool = True
    a2a_tables: bool = False
    # explicit layers per pipeline stage (None: pdsim.models.pp_split, vLLM's default rule)
    pp_layers: tuple | None = None
    _static_cache: dict = field(default_factory=dict, repr=False)

    def __post_init__(self):
        m, t = self.model, self.tp
        assert t % self.ep == 0 and (self.ep == 1 or m.experts % self.ep == 0), (t, self.ep)
        self._split = m.stage_split(self.pp, self.pp_layers)      # layers of each pipeline stage
        self._stages = m.stage_layers(self.pp, self.pp_layers)    # (dense, MoE) layers of each stage
        self.w_bytes = dtype_bytes(self.weight_dtype)
        self.kv_bytes = dtype_bytes(self.kv_dtype)
        # fp8 weights use fp8 tensor cores; fp4 (NVFP4) weights fp4 tensor cores where the device has them
        # (Blackwell); int4/int8 weights, and fp4 elsewhere (W4A16, as Hopper serves MXFP4), are weight-only:
        # dequantised, computed in bf16
        wd = self.weight_dtype
        fp4_native = wd == "fp4" and "fp4" in self.device.spec.peak_tflops
        self.compute_dtype = "fp8" if wd == "fp8" else "fp4" if fp4_native else "bf16"
        self.weight_only = wd if wd in ("int4", "int8") or (wd == "fp4" and not fp4_native) else None
        # imported tables name fp4 GEMMs nvfp4 (fp4 x fp4) and mxfp4_wo (fp4 weights x bf16)
        self.gemm_table_dtype = "bf16" if wd in ("bf16", "fp16", "fp32") else "nvfp4" if fp4_native else wd
        tabs = self.device.tables
        wo_name = "mxfp4_wo" if wd == "fp4" else f"{wd}_wo"
        if self.weight_only and tabs is not None and any(key[2] == wo_name for key in tabs.gemm):
            self.gemm_table_dtype = wo_name          # imported weight-only tables
        self.kv_table_dtype = "bf16" if self.kv_dtype in ("bf16", "fp16", "fp32") else self.kv_dtype
        h, d, L = m.hidden, m.head_dim, m.layers
        # DP attention: each of the tp GPUs is an attention rank of its own (attention TP 1) with whole
        # attention, dense-MLP, shared-expert, embedding and LM-head weights; routed experts stay / ep
        assert not self.dp_attention or (self.ep == t and self.pp == 1 and m.is_moe), (t, self.ep, self.pp)
        self.attn_dp = t if self.dp_attention else 1
        ta = t // self.attn_dp          # tensor parallelism of attention and the dense parts
        qh, kvh = m.heads // ta, max(1, m.kv_heads // ta)
        self.q_heads, self.kv_heads_shard = qh, kvh
        # the integer factors of the attention and layer products as floats: the same products (an int times a
        # float is that float product), and numpy multiplies an array by a float scalar faster than by an int
        self._kvh_f, self._d_f, self._layers_f = float(kvh), float(m.head_dim), float(m.layers)
        # (name, N, K, layers) of each sharded linear layer: column-parallel N, row-parallel K
        if m.is_mla:
            r, dr, dn, dv, qr = m.kv_lora_rank, m.qk_rope_head_dim, m.qk_nope_head_dim, m.v_head_dim, m.q_lora_rank
            # q_a and kv_a fused and replicated (vLLM's fused_qkv_a_proj); q_b, kv_b column-, o row-parallel
            self.linears = [("qkv_a", qr + r + dr, h, "L"), ("q_b", qh * (dn + dr), qr, "L")] if qr else \
                [("q", qh * (dn + dr), h, "L"), ("kv_a", r + dr, h, "L")]
            self.linears += [("kv_b", qh * (dn + dv), r, "L"), ("attn_out", h, qh * dv, "L")]
            rope = 2 * (qh + 1) * dr * 2.0                               # q's and the shared key's rope dims
            kv_write = (r + dr) * (2.0 + self.kv_bytes)                  # the latent and rope key
            norm = 2 * 4 * h * 2.0 + 2 * (qr + r) * 2.0                  # + the q_a and kv_a RMSNorms
        else:
            self.linears = [("qkv", (qh + 2 * kvh) * d, h, "L"), ("attn_out", h, qh * d, "L")]
            rope = 2 * (qh + kvh) * d * 2.0                              # read and write q and k
            kv_write = 2 * kvh * d * (2.0 + self.kv_bytes)               # read new K, V; write them to the cache
            norm = 2 * 4 * h * 2.0
        Ld, f = m.dense_mlp_layers, m.mlp_width
        if Ld:
            if m.gated_mlp:
                self.linears += [("gate_up", 2 * f // ta, h, "Ld"), ("down", h, f // ta, "Ld")]
            else:
                self.linears += [("up", f // ta, h, "Ld"), ("down", h, f // ta, "Ld")]
        self.lm_head = ("lm_head", m.vocab // ta, h)
        self.kv_bytes_per_token_shard = m.kv_bytes_per_token_per_gpu(self.kv_dtype, ta)
        # sliding-window layers (None: none): attention priced on (attn_work, kv_read) for the full layers
        # and on the step's sliding aggregates ``swa`` for the sliding ones (DP attention with them is refused)
        self.window = m.window
        assert self.window is None or not self.dp_attention
        # activation bytes per token of the per-layer elementwise kernels (bf16 activations)
        gates = 3 if m.gated_mlp else 2
        self._elementwise = [
            # two fused residual-add + RMSNorm (read x and residual, write both), replicated under TP
            ("norm", 2, "L", norm),
            ("rope", 1, "L", rope),
            ("kv_write", 1, "L", kv_write),
        ]
        if Ld:
            self._elementwise.append(("act", 1, "Ld", gates * (f // ta) * 2.0))   # SiLU(gate) * up: read 2f, write f
        self.moe_layers = Lm = m.moe_layers
        if Lm:
            E, k, w, S = m.experts, m.experts_per_token, m.expert_width, m.shared_experts
            self.moe_tp = t // self.ep
            self.local_experts = E // self.ep
            # under a popularity skew the step waits for the hottest EP rank; experts are placed round
            # robin in popularity order (rank 0 holds the 1st, (ep+1)th, ... most popular), as a balancer
            # would place them without replicating experts
            self._hot_q = expert_hit_probs(k, E, self.expert_skew)[::self.ep] if self.expert_skew else None
            self.a2a_fanout = alltoall_fanout(k, E, self.ep, self.expert_skew)
            # bytes of a token on the wire per all-to-all kernel: dispatch in fp8 for fp8 / fp4 weights (DeepEP's
            # low-latency kernels, aiconfigurator's serving rule), bf16 otherwise; combine in bf16; the op
            # prices the mean of the two
            wire = 1.0 if self.weight_dtype in ("fp8", "fp4") else 2.0
            self.a2a_token_bytes = h * (wire + 2.0) / 2.0
            if S:
                sw = S * w // ta
                self.linears += [("shared_gate_up", 2 * sw, h, "Lm"), ("shared_down", h, sw, "Lm")] if m.gated_mlp \
                    else [("shared_up", sw, h, "Lm"), ("shared_down", h, sw, "Lm")]
                self._elementwise.append(("shared_act", 1, "Lm", gates * sw * 2.0))
            ew = w // self.moe_tp
            # (name, N, K) of the routed experts' grouped GEMMs on one GPU
            self.expert_gemms = [("experts_gate_up", 2 * ew, h), ("experts_down", h, ew)] if m.gated_mlp \
                else [("experts_up", ew, h), ("experts_down", h, ew)]
            # per token: SiLU(gate) * up of its k experts (each GPU gets k/ep of them, width w/moe_tp);
            # top-k over E scores (fp32 read, ids written); permute the token to its experts and unpermute
            # the results (read and write k/ep copies of h, twice; under DP attention a rank's token goes to
            # its k experts: k copies per rank token)
            self._elementwise += [("experts_act", 1, "Lm", k * gates * w / t * 2.0),
                                  ("moe_route", 3, "Lm", E * 4.0 + k * 8.0
                                   + 2 * 2 * (k * self.attn_dp / self.ep) * h * 2.0)]
            # a measured table of this very MoE layer (imported profiles) replaces the routed experts'
            # grouped GEMMs, activation and routing; uniform routing only (a skew is a roofline what-if), and
            # not under DP attention (the tables time one TP-attention instance's tokens)
            self.moe_table_key = None
            moe_tabs = getattr(tabs, "moe", None) if tabs is not None else None
            if moe_tabs and self.moe_tables and not self.expert_skew and not self.dp_attention:
                wdt = "bf16" if self.weight_dtype in ("bf16", "fp16", "fp32") else self.weight_dtype
                if wdt == "fp4":
                    wdt = "nvfp4" if self.compute_dtype == "fp4" else "mxfp4_wo"
                for dt in ((wdt, "fp8_tensor") if wdt == "fp8" else (wdt,)):
                    key = (h, w, k, E, self.moe_tp, self.ep, m.gated_mlp, dt)
                    if key in moe_tabs:
                        self.moe_table_key = key
                        break
        self._table_keys(tabs)

    def _table_keys(self, tabs) -> None:
        """Which measured MLA and all-to-all tables serve this pool (``mla_tables`` / ``a2a_tables``), and, on a
        measured profile, a line for each that falls back to the roofline (``table_notes``; ``pdsim estimate``
        prints them; on a datasheet preset every op is the roofline and its ``source`` says so)."""
        m, self.table_notes = self.model, []
        self.mla_table_keys = self.a2a_keys = None
        # MLA attention's (flops, bytes) functions of one layer, prefill and decode (built once: steps are hot)
        self._mla_fbs = {p: self._mla_fb(p, self.q_heads) for p in (True, False)} if m.is_mla else None
        if self.mla_tables and m.is_mla:
            from .profile_tables import mla_keys
            dims = (m.kv_lora_rank, m.qk_rope_head_dim, m.qk_nope_head_dim, m.v_head_dim)
            pre, dec = mla_keys(self.q_heads, *dims, self.kv_table_dtype)
            have = tabs is not None and (pre in tabs.prefill_batches, dec in tabs.decode)
            if have and any(have):
                self.mla_table_keys = {True: pre, False: dec}
            if not have or not all(have):
                what = "MLA prefill and decode" if not have or not any(have) else \
                    "MLA prefill" if not have[0] else "MLA decode"
                self.table_notes.append(f"{what} attention: roofline (no measured table for {self.q_heads} heads per "
                                        f"GPU, dims {'/'.join(map(str, dims))}, KV {self.kv_table_dtype})")
        if self.a2a_tables and m.is_moe and self.ep > 1 and self.dp_attention:   # the only all-to-all
            a2a = getattr(tabs, "alltoall", None) or {} if tabs is not None else {}
            # wire dtypes as aiconfigurator's serving rule: DeepEP high-throughput sends bf16 for bf16 and fp8
            # models (nvfp4 for nvfp4), low-latency sends fp8 for fp8 models (nvfp4 / fp4 combine off Hopper)
            wd = self.weight_dtype
            ht_dt = ("nvfp4", "nvfp4") if self.compute_dtype == "fp4" else ("bf16", "bf16")
            ll_dt = ("fp8", "fp8") if wd == "fp8" else ("nvfp4", "fp4") if self.compute_dtype == "fp4" \
                else ("bf16", "bf16")
            shape = (self.ep, m.hidden, m.experts_per_token, m.experts)
            keys = {}
            for be, (dd, cd) in (("ll", ll_dt), ("ht", ht_dt)):
                pair = ((be, "dispatch", dd, *shape), (be, "combine", cd, *shape))
                if pair[0] in a2a and pair[1] in a2a:
                    keys[be] = (pair, a2a[pair[0]].x[-1])        # and the most tokens measured
            if keys:
                self.a2a_keys = keys
            else:
                self.table_notes.append(f"alltoall: roofline (no measured DeepEP table for ep {self.ep}, hidden "
                                        f"{m.hidden}, top-{m.experts_per_token} of {m.experts}, {wd} weights)")
        if tabs is None:
            # (MLA tables are on by default: only the opt-in ones are worth a note)
            asked = [n for n, on in (("moe", self.moe_tables), ("a2a", self.a2a_tables)) if on]
            self.table_notes = [f"{'/'.join(asked)} tables asked for, but {getattr(self.device, 'name', 'this device')} "
                                "is a profile without measured tables (a datasheet preset): every op is the roofline"
                                ] if asked else []

    # --- the one description of a step -------------------------------------
    def _layer_counts(self, stage: int | None):
        """(layers, dense-MLP layers, MoE layers, holds the embedding, holds the LM head) of pipeline
        stage ``stage``, or of the whole model (None)."""
        m = self.model
        if stage is None:
            return m.layers, m.dense_mlp_layers, m.moe_layers, True, True
        dense, moe = self._stages[stage]
        return dense + moe, dense, moe, stage == 0, stage == self.pp - 1

    def _static_ops(self, tokens: int, sampled: int, stage: int | None = None, rank=None) -> list[Op]:
        """Every operator but attention: they depend on the token and sampled counts only.  ``stage``:
        only the layers (and embedding / LM head) of that pipeline stage, without the per-step overhead
        (:class:`pdsim.pipeline.PipelineCost` prices it once per micro-batch).  ``rank``: under DP
        attention the (tokens, sampled rows) of the busiest attention rank, which every op but the
        routed experts (all the instance's tokens, / ep) runs on."""
        m, h, T = self.model, self.model.hidden, tokens
        Ta, Sa = rank if rank is not None else (T, sampled)
        L, Ld, Lm, first, last = self._layer_counts(stage)
        n_of = {"L": L, "Ld": Ld, "Lm": Lm}
        ops = [Op(name, "gemm", n_of[g], 2.0 * Ta * n * k, n * k * self.w_bytes + Ta * (n + k) * 2.0,
                  (Ta, n, k, self.w_bytes, self.compute_dtype, self.weight_only, self.gemm_table_dtype))
               for name, n, k, g in self.linears]
        if self.moe_layers:
            E, top_k = m.experts, m.experts_per_token
            # the router stays bf16 and is replicated: every GPU scores every token
            ops.append(Op("router", "gemm", Lm, 2.0 * Ta * E * h, E * h * 2.0 + Ta * (E + h) * 2.0,
                          (Ta, E, h, 2.0, "bf16", None, "bf16")))
            if self._hot_q is None:
                pairs = T * top_k / self.ep                    # token-expert pairs on one GPU
                groups = self.local_experts * (1.0 - (1.0 - top_k / E) ** T) if T > 0 else 0.0
            else:                                              # on the hottest GPU
                pairs = T * float(self._hot_q.sum())
                groups = float(np.sum(1.0 - (1.0 - self._hot_q) ** T)) if T > 0 else 0.0
            gg = [Op(name, "grouped_gemm", Lm, 2.0 * pairs * n * k,
                     groups * n * k * self.w_bytes + pairs * (n + k) * 2.0,
                     (pairs, groups, n, k, self.w_bytes, self.compute_dtype, self.weight_only))
                  for name, n, k in self.expert_gemms]
            if self.moe_table_key is None:
                ops += gg
        ew = [Op(name, "elementwise", n_of[g], 0.0, (T if name == "experts_act" else Ta) * per_token, (kernels,))
              for name, kernels, g, per_token in self._elementwise]
        if self.moe_layers and self.moe_table_key is not None:
            # one measured op in place of the routed experts' kernels (FLOPs and bytes kept)
            part = [o for o in ew if o.name in ("experts_act", "moe_route")]
            ew = [o for o in ew if o.name not in ("experts_act", "moe_route")]
            ops.append(Op("experts", "moe", Lm, sum(o.flops for o in gg), sum(o.bytes for o in gg + part),
                          (T, self.moe_table_key)))
        ops += ew
        # embedding gather (read, write h) and the final fused add + RMSNorm (read 2h, write h), once a step
        # (under pipeline parallelism both are priced on the first stage: a few microseconds)
        if first:
            ops.append(Op("embed", "elementwise", 1, 0.0, Ta * 5 * h * 2.0, (2,)))
        if sampled and last:
            ops.append(self._lm_head_op(Sa))
        ep, ta = self.ep, self.tp // self.attn_dp
        if ta > 1:
            # two per layer (after attention and after the MLP) and one for the vocab-parallel embedding
            # (under pipeline parallelism: within the stage's TP group only; none under DP attention).  Under
            # TP attention every GPU holds every token, so expert parallelism needs no dispatch: each GPU runs
            # its own experts on the tokens routed to them and the MoE layer's all-reduce sums the partial
            # outputs, as its dense MLP's would (vLLM, SGLang and TensorRT-LLM use all-to-all only with DP
            # attention, where the ranks hold different tokens)
            n_ar = 2 * L + (1 if first else 0)
            ops.append(Op("allreduce", "allreduce", n_ar, 0.0, 0.0, (Ta * h * 2.0, ta)))
        if ep > 1 and self.moe_layers and self.attn_dp > 1:
            # dispatch and combine per MoE layer, under DP attention of the busiest rank's own tokens: each goes
            # to every other rank holding one of its top-k experts (alltoall_fanout copies), fp8 or bf16 on
            # the wire going, bf16 coming back (a2a_token_bytes: the mean of the two kernels)
            ops.append(Op("alltoall", "alltoall", 2 * Lm, 0.0, 0.0,
                          (Ta * self.a2a_token_bytes * self.a2a_fanout, ep, Ta)))
        if stage is None:
            ops.append(Op("step_overhead", "overhead", 1, 0.0, 0.0))
        return ops

    def _lm_head_op(self, sampled) -> Op:
        """The LM head over ``sampled`` rows (the only operator that depends on the sampled count)."""
        _, n, k = self.lm_head     # the LM head stays bf16 under weight quantisation
        return Op("lm_head", "gemm", 1, 2.0 * sampled * n * k, n * k * 2.0 + sampled * (n + k) * 2.0,
                  (sampled, n, k, 2.0, "bf16", None, "bf16"))

    def _stage_counts(self) -> list[dict[str, int]]:
        """Kernels of each operator on each pipeline stage (what :meth:`_stage_static` weighs by)."""
        got = getattr(self, "_stage_counts_memo", None)
        if got is None:
            got = self._stage_counts_memo = [
                {op.name: op.count for op in self._static_ops(1, 1, j)} for j in range(self.pp)]
        return got

    def _attention_op(self, tokens, attn_work, kv_read_tokens, batch, prefill: bool, layers=None,
                      name: str = "attention") -> Op:
        """Attention of one layer; ``attn_work`` and ``kv_read_tokens`` may be arrays over steps.  ``layers``:
        the op's count (default all layers; with sliding layers the full and the sliding ones apart)."""
        m = self.model
        if layers is None:
            layers = m.layers
        if m.is_mla:
            flops, bytes_ = self._mla_fbs[prefill](tokens, attn_work, kv_read_tokens)
            return Op(name, "attention", layers, flops, bytes_,
                      (tokens, attn_work, kv_read_tokens, batch, prefill))
        flops, bytes_ = self._gqa_fb(tokens, attn_work, kv_read_tokens)
        return Op(name, "attention", layers, flops, bytes_,
                  (tokens, attn_work, kv_read_tokens, batch, prefill))

    def _gqa_fb(self, tokens, attn_work, kv_read_tokens):
        """(flops, bytes) of one layer's GQA attention (scalars, or arrays over steps)."""
        qh, kvh, d = self.q_heads, self.kv_heads_shard, self.model.head_dim
        return (4.0 * qh * d * attn_work,
                kv_read_tokens * 2.0 * self._kvh_f * self._d_f * self.kv_bytes + tokens * (qh + 2 * kvh) * d * 2.0)

    def _mla_fb(self, prefill: bool, qh: int):
        """(flops, bytes) of one layer's MLA attention as a function of (tokens, attn_work, kv_read)."""
        m = self.model
        r, dr, dn, dv = m.kv_lora_rank, m.qk_rope_head_dim, m.qk_nope_head_dim, m.v_head_dim
        if prefill:      # decompressed: per-head keys (dn + dr) and values (dv) in bf16
            def fb(tokens, attn_work, kv_read_tokens):
                return 2.0 * qh * (dn + dr + dv) * attn_work, (kv_read_tokens + tokens) * qh * (dn + dr + dv) * 2.0
        else:            # absorbed: scores over latent + rope, values are the latent
            kvb = self.kv_bytes

            def fb(tokens, attn_work, kv_read_tokens):
                return (2.0 * qh * (2 * r + dr) * attn_work,
                        kv_read_tokens * (r + dr) * kvb + tokens * qh * (2 * r + dr) * 2.0)
        return fb

    def _attention_ops(self, tokens, attn_work, kv_read_tokens, batch, prefill: bool, swa) -> list[Op]:
        """Attention of a model with sliding layers: the full layers on the step's aggregates, the sliding
        layers (op ``attention_sliding``) on ``swa`` = (work, KV read) (scalars, or arrays over steps)."""
        m = self.model
        return [self._attention_op(tokens, attn_work, kv_read_tokens, batch, prefill, m.full_layers),
                self._attention_op(tokens, swa[0], swa[1], batch, prefill, m.sliding_layers, "attention_sliding")]

    def _rank(self, tokens, attn_work, kv_read_tokens, sampled, batch):
        """Under DP attention, the busiest attention rank's share of the step: the batch's requests are
        dealt over the ranks as evenly as whole requests allow (ceil(batch / ranks) on the busiest), each
        carrying its share of the aggregates (ASSUMPTION: balanced ranks; a lone request runs on one
        rank while the others idle in the all-to-alls).  (tokens, attn, kv, sampled, requests)."""
        b = max(1, batch)
        rb = -(-b // self.attn_dp)
        return tokens * rb / b, attn_work * rb / b, kv_read_tokens * rb / b, sampled * rb / b, rb

    def ops(self, tokens: int, attn_work, kv_read_tokens, sampled: int, batch: int, swa=None) -> list[Op]:
        """The operators of one step (what :meth:`op_time` evaluates)."""
        # prefill vs decode attention only changes the kernel: the mix is judged by work
        prefill = _is_prefill(attn_work, kv_read_tokens)
        if swa is not None:
            return [*self._attention_ops(tokens, attn_work, kv_read_tokens, batch, prefill, swa),
                    *self._static_ops(tokens, sampled)]
        if self.attn_dp > 1:
            Ta, aw, kv, Sa, rb = self._rank(tokens, attn_work, kv_read_tokens, sampled, batch)
            return [self._attention_op(Ta, aw, kv, rb, prefill), *self._static_ops(tokens, sampled, rank=(Ta, Sa))]
        return [self._attention_op(tokens, attn_work, kv_read_tokens, batch, prefill),
                *self._static_ops(tokens, sampled)]

    def op_time(self, op: Op):
        """(seconds of ONE kernel of ``op``, source codes of :mod:`pdsim.kernels`): the one evaluator."""
        dev = self.device
        if op.kind == "gemm":
            m, n, k, w, dtype, wo, tdt = op.args
            return kernels.gemm_time(dev, m, n, k, w, 2.0, dtype, wo, tdt)
        if op.kind == "grouped_gemm":
            return kernels.grouped_gemm_roofline(dev, *op.args), kernels.ROOFLINE
        if op.kind == "moe":
            hit = kernels.moe_time(dev, *op.args)
            return hit if hit is not None else (0.0, kernels.EXACT)     # no token enters: no kernel
        if op.kind == "attention":
            tokens, attn_work, kv_read, batch, prefill = op.args
            if self.model.is_mla:
                keys = self.mla_table_keys
                if keys is not None:   # the profile's MLA table (roofline where it has none for this phase)
                    key = keys[prefill]
                    return kernels.attention_time(dev, tokens, attn_work, kv_read, batch, key[:3], prefill,
                                                  self.kv_bytes, "bf16", key[3], (op.flops, op.bytes),
                                                  self._mla_fbs[prefill])
                t = kernels.attention_roofline(dev, op.flops, op.bytes, prefill, "bf16")
                return t, (np.full(np.shape(t), kernels.ROOFLINE) if isinstance(t, np.ndarray) else kernels.ROOFLINE)
            return kernels.attention_time(dev, tokens, attn_work, kv_read, batch,
                                          (self.q_heads, self.kv_heads_shard, self.model.head_dim), prefill,
                                          self.kv_bytes, "bf16", self.kv_table_dtype, (op.flops, op.bytes))
        if op.kind == "elementwise":
            return kernels.elementwise_roofline(dev, op.bytes, op.args[0]), kernels.ROOFLINE
        if op.kind == "allreduce":
            return kernels.allreduce_time(dev, *op.args)
        if op.kind == "alltoall":
            keys = self.a2a_keys
            if keys is not None:
                # the DeepEP tables by tokens on a GPU: low-latency kernels up to the most tokens they were
                # measured at, high-throughput beyond
                bytes_, ep, tokens = op.args
                ll, ht = keys.get("ll"), keys.get("ht")
                pick = ll if ll is not None and (tokens <= ll[1] or ht is None) else ht
                return kernels.alltoall_time(dev, tokens, pick[0], bytes_, ep)
            return kernels.alltoall_roofline(dev, *op.args[:2]), kernels.ROOFLINE
        if op.kind == "overhead":
            return dev.step_overhead_s, kernels.ROOFLINE
        raise AssertionError(op.kind)

    # --- derived: scalar step, per-op breakdown, k decode steps --------------
    def _static(self, tokens: int, sampled: int, rank=None) -> tuple[float, float, float]:
        """Summed (time_s, flops, bytes) of the non-attention operators; cached by (tokens, sampled).

        On a miss the sum is made of per-operator terms (seconds, FLOPs, bytes, each x its count) in the
        operators' order: those of every operator but the LM head, which depend on the tokens alone (and the
        rank's tokens), are kept by tokens, and the LM head's by its sampled rows, so a step size seen before
        with another sampled count prices no operator again (a prefill pool's steps: the same sums)."""
        key = (tokens, sampled) if rank is None else (tokens, sampled, rank)
        cache = self._static_cache
        hit = cache.get(key)
        if hit is not None:
            return hit
        Sa = sampled if rank is None else rank[1]
        skey = ("split", tokens, None if rank is None else rank[0])
        split = cache.get(skey)
        if split is None:
            # (built with one sampled row at least, so the LM head is there to split out; every other operator
            # ignores the sampled count)
            ops = self._static_ops(tokens, sampled or 1, rank=rank if sampled or rank is None else (rank[0], 1))
            terms = [self._term(op) for op in ops]
            i = next(j for j, op in enumerate(ops) if op.name == "lm_head")
            split = (terms[:i], terms[i + 1:])
            if sampled and len(cache) < 1 << 16:
                cache[("lm_head", Sa)] = terms[i]
            if len(cache) < 1 << 16:
                cache[skey] = split
        head, tail = split
        if sampled:
            lm = cache.get(("lm_head", Sa))
            if lm is None:
                lm = self._term(self._lm_head_op(Sa))
                if len(cache) < 1 << 16:
                    cache[("lm_head", Sa)] = lm
            terms = (*head, lm, *tail)
        else:
            terms = (*head, *tail)
        time_s = flops = bytes_ = 0.0
        for t, f, b in terms:
            time_s += t
            flops += f
            bytes_ += b
        out = (time_s, flops, bytes_)
        if len(cache) < 1 << 16:
            cache[key] = out
        return out

    def _term(self, op: Op) -> tuple[float, float, float]:
        """(seconds, FLOPs, bytes) of an operator's ``count`` kernels: what :meth:`_static` adds up."""
        return float(self.op_time(op)[0]) * op.count, op.flops * op.count, op.bytes * op.count

    def _sum(self, tokens, attn_work, kv_read_tokens, sampled, batch, swa=None, rank=None, decodes=None,
             prefill=None):
        """Step time, FLOPs and bytes: the cached static part plus attention (scalars or arrays).  A caller
        that passes no ``swa`` for a model with sliding layers gets every layer priced as full attention
        (an overestimate; the simulator's steps, the fast path, prefill_time, decode_time and ``pdsim
        estimate`` all pass it).  ``prefill``: :func:`_is_prefill` of the aggregates, if the caller knows it."""
        if prefill is None:
            prefill = _is_prefill(attn_work, kv_read_tokens)
        if swa is not None:       # sliding layers: full and sliding attention apart (no DP attention)
            t_s, f_s, b_s = self._static(tokens, sampled)
            full, sl = self._attention_ops(tokens, attn_work, kv_read_tokens, batch, prefill, swa)
            t_f, t_w = self.op_time(full)[0], self.op_time(sl)[0]
            # attention summed first: with equal full and sliding ops this is the full-attention sum, bit for bit
            return (t_s + (t_f * full.count + t_w * sl.count), f_s + (full.flops * full.count + sl.flops * sl.count),
                    b_s + (full.bytes * full.count + sl.bytes * sl.count))
        if rank is not None:     # DP attention, whole requests per rank: the slowest rank, each with its own kernel
            # time: the slowest rank's; FLOPs and bytes: the mean over the ranks (per GPU, as for TP), a rank with
            # no request of its own still running the experts (static part at zero tokens)
            t_max = f_sum = b_sum = 0.0
            for t, f, b in self.rank_costs(tokens, sampled, rank):
                t_max = max(t_max, t)
                f_sum += f
                b_sum += b
            idle = self.attn_dp - len(rank)
            if idle > 0:
                _, f0, b0 = self._static(tokens, sampled, (0, 0))
                f_sum += idle * f0
                b_sum += idle * b0
            return t_max, f_sum / self.attn_dp, b_sum / self.attn_dp
        if decodes is not None and self.attn_dp == 1 and self.model.is_mla and 0 < decodes[0] < tokens:
            t_s, f_s, b_s = self._static(tokens, sampled)      # a mixed MLA step: two attention kernels
            t_a, f_a, b_a = self._attention_sum(tokens, attn_work, kv_read_tokens, batch, decodes)
            return t_s + t_a, f_s + f_a, b_s + b_a
        dev = self.device
        if self.attn_dp == 1 and dev.tables is None and not self.model.is_mla:
            # the usual step (GQA attention on a datasheet profile): what op_time gives the attention op -- the
            # roofline of its FLOPs and bytes -- without building the op and dispatching it (every step comes here)
            t_s, f_s, b_s = self._static(tokens, sampled)
            flops, bytes_ = self._gqa_fb(tokens, attn_work, kv_read_tokens)
            t_a = kernels.attention_roofline(dev, flops, bytes_, prefill, "bf16")
            L = self._layers_f
            return t_s + t_a * L, f_s + flops * L, b_s + bytes_ * L
        t_s, f_s, b_s, att = self._parts(tokens, attn_work, kv_read_tokens, sampled, batch, prefill)
        t_a = self.op_time(att)[0]
        L = att.count
        return t_s + t_a * L, f_s + att.flops * L, b_s + att.bytes * L

    def rank_costs(self, tokens, sampled, rank) -> list:
        """(time_s, flops, bytes) of each DP-attention rank in ``rank`` (:func:`busiest_rank`): its static part
        (the experts on all ``tokens``, the rest on its own) and its attention on its own kernel."""
        out = []
        for Ta, aw, kv, Sa, rb, *dec in rank:
            t_s, f_s, b_s = self._static(tokens, sampled, (Ta, Sa))
            t_a, f_a, b_a = self._attention_sum(Ta, aw, kv, rb, dec[0] if dec else None)
            out.append((t_s + t_a, f_s + f_a, b_s + b_a))
        return out

    def _attention_sum(self, tokens, attn_work, kv_read_tokens, batch, decodes=None):
        """(time_s, flops, bytes) of a step's attention over all layers, on one kernel chosen by its work; for an
        MLA model whose step mixes decodes (``decodes`` = their (tokens, attn_work, kv_read_tokens, requests))
        with prompt chunks, two kernels: the decodes in the absorbed form over the latent, the chunks
        decompressed, as engines run decode and context attention apart (one decompressed kernel would read
        every decode's context at ~140x the latent's bytes)."""
        if decodes is not None and self.model.is_mla and 0 < decodes[0] < tokens:
            Td, Ad, Kd, Bd = decodes
            ops = (self._attention_op(Td, Ad, Kd, Bd, False),
                   self._attention_op(tokens - Td, attn_work - Ad, kv_read_tokens - Kd, batch - Bd, True))
        else:
            ops = (self._attention_op(tokens, attn_work, kv_read_tokens, batch, _is_prefill(attn_work, kv_read_tokens)),)
        t = f = b = 0.0
        for op in ops:
            t += self.op_time(op)[0] * op.count
            f += op.flops * op.count
            b += op.bytes * op.count
        return t, f, b

    def _parts(self, tokens, attn_work, kv_read_tokens, sampled, batch, prefill: bool):
        """A step without sliding layers in two parts: the cached static sum (time_s, flops, bytes) and the
        attention op, under DP attention the busiest rank's (:meth:`_rank`)."""
        if self.attn_dp > 1:
            Ta, aw, kv, Sa, rb = self._rank(tokens, attn_work, kv_read_tokens, sampled, batch)
            return (*self._static(tokens, sampled, (Ta, Sa)), self._attention_op(Ta, aw, kv, rb, prefill))
        return (*self._static(tokens, sampled), self._attention_op(tokens, attn_work, kv_read_tokens, batch, prefill))

    def step(self, tokens, attn_work, kv_read_tokens, sampled, batch, swa=None, rank=None, decodes=None):
        """One step from its aggregates; under DP attention ``rank`` (:func:`busiest_rank` of the step's
        requests: each rank's share) replaces the proportional share: the step takes the slowest rank's time
        and reports the ranks' mean FLOPs and bytes (per GPU).  ``decodes``: the (tokens, attn_work,
        kv_read_tokens, requests) of the step's decodes (:func:`decode_part`), with which an MLA step that
        mixes them with prompt chunks prices the two on their own kernels."""
        if swa is not None:
            swa = (float(swa[0]), float(swa[1]))
        t, f, b = self._sum(tokens, float(attn_work), float(kv_read_tokens), sampled, batch, swa, rank, decodes)
        return StepCost(float(t), float(f), float(b))

    # --- pipeline stages (pdsim/pipeline.py combines them) ----------------------
    def _stage_static(self, tokens, sampled) -> tuple[list[float], float, float]:
        """Per-stage seconds of the non-attention operators (per-step overhead excluded) and their summed
        FLOPs and bytes over all stages; cached by (tokens, sampled)."""
        key = ("stages", tokens, sampled)
        hit = self._static_cache.get(key)
        if hit is not None:
            return hit
        counts = self._stage_counts()
        times = [0.0] * self.pp
        flops = bytes_ = 0.0
        for op in self._static_ops(tokens, sampled):
            if op.kind == "overhead":
                continue
            t = float(self.op_time(op)[0])
            for j in range(self.pp):
                times[j] += t * counts[j].get(op.name, 0)
            flops += op.flops * op.count
            bytes_ += op.bytes * op.count
        out = (times, flops, bytes_)
        if len(self._static_cache) < 1 << 16:
            self._static_cache[key] = out
        return out

    def stage_times(self, tokens, attn_work, kv_read_tokens, sampled, batch, swa=None):
        """One micro-batch through each pipeline stage: (seconds per stage, FLOPs, bytes over all stages),
        without the per-step overhead.  ``attn_work`` and ``kv_read_tokens`` may be arrays over decode
        steps (then the stage times are arrays).  Stage j holds its own layers (L / pp each when the split
        is even), hence as many attention kernels; the embedding sits on the first stage, the LM head on the
        last, and each stage's TP group all-reduces its own layers' activations.  With sliding layers
        (``swa``) stage j of n_j layers holds n_j x full / L full and n_j x sliding / L sliding ones
        (ASSUMPTION: the two kinds interleaved evenly over the stages, as gpt-oss alternates them)."""
        t_s, f_s, b_s = self._stage_static(tokens, sampled)
        prefill = _is_prefill(attn_work, kv_read_tokens)
        if swa is not None:
            full, sl = self._attention_ops(tokens, attn_work, kv_read_tokens, batch, prefill, swa)
            t_f, t_w = self.op_time(full)[0], self.op_time(sl)[0]
            L = self.model.layers
            per_layer = (t_f * full.count + t_w * sl.count) / L     # a stage's mean attention time per layer
            return ([t + per_layer * n for t, n in zip(t_s, self._split)],
                    f_s + (full.flops * full.count + sl.flops * sl.count),
                    b_s + (full.bytes * full.count + sl.bytes * sl.count))
        att = self._attention_op(tokens, attn_work, kv_read_tokens, batch, prefill)
        t_a = self.op_time(att)[0]
        L = att.count
        return [t + t_a * n for t, n in zip(t_s, self._split)], f_s + att.flops * L, b_s + att.bytes * L

    def stage_transfer_s(self, tokens) -> float:
        """Activations of ``tokens`` tokens from one stage to the next: the hidden states and the residual
        (vLLM's IntermediateTensors between pipeline ranks), hidden x bf16 each, point to point over the
        device's interconnect (its latency, and its bandwidth at the collectives' link efficiency)."""
        if tokens <= 0:
            return 0.0
        return kernels.p2p_roofline(self.device, tokens * self.model.hidden * 2.0 * 2)

    def overhead_s(self) -> float:
        """The device's flat per-step engine overhead (once per micro-batch under pipeline parallelism)."""
        return self.device.step_overhead_s

    def breakdown(self, tokens: int, attn_work: float, kv_read_tokens: int, sampled: int,
                  batch: int, swa=None) -> dict[str, dict]:
        """Per-op ``{op: {time_s, flops, bytes, source}}`` of one step (what ``pdsim estimate`` prints).
        ``source``: measured, interpolated, extrapolated or roofline (:mod:`pdsim.kernels`)."""
        out = {}
        if swa is not None:
            swa = (float(swa[0]), float(swa[1]))
        for op in self.ops(tokens, float(attn_work), float(kv_read_tokens), sampled, batch, swa):
            t, code = self.op_time(op)
            out[op.name] = {"time_s": float(t) * op.count, "flops": float(op.flops) * op.count,
                            "bytes": float(op.bytes) * op.count, "source": kernels.source_name(code)}
        return out

    def decode_steps(self, batch, attn0, kv0, k, swa=None):
        """:meth:`step` for k decode steps of the same batch, on arrays: the same operators and the
        same evaluator with attention's work and KV reads as arrays over the step index (measured
        tables included: their lookups are vectorised); ``swa``: the sliding aggregates' arrays."""
        grow = float(batch) * (_STEPS[:k] if k <= len(_STEPS) else np.arange(k, dtype=np.float64))   # one token a step
        a0, k0 = float(attn0), float(kv0)
        attn = a0 + grow
        kv = k0 + grow
        if swa is not None:
            swa = (np.asarray(swa[0], dtype=np.float64), np.asarray(swa[1], dtype=np.float64))
        # (_is_prefill of the arrays: their first elements, a0 + 0.0 and k0 + 0.0)
        t, f, b = self._sum(batch, attn, kv, batch, batch, swa, prefill=a0 > k0)
        return np.asarray(t, float), np.asarray(f, float), np.asarray(b, float)

    # --- memory -------------------------------------------------------------
    def weight_bytes_per_gpu(self) -> float:
        return self.model.weight_bytes_per_gpu(self.weight_dtype, self.tp, self.ep, self.pp, self.dp_attention,
                                               self.pp_layers)


_STEPS = np.arange(4096, dtype=np.float64)      # 0, 1, 2, ...: a window's step indices (sliced, never written)
_STEPS.flags.writeable = False


def _is_prefill(attn_work, kv_read_tokens) -> bool:
    """Prefill attention when the work exceeds the KV read (a decode works c and reads c + 1).
    Over k decode steps both grow by the batch each step, so the first step decides for all."""
    if isinstance(attn_work, np.ndarray):
        return bool(attn_work.flat[0] > np.asarray(kv_read_tokens).flat[0])
    return attn_work > kv_read_tokens

