"""Speculative decoding of a decode-capable pool: draft k tokens, verify them in one target step.

A pool with ``speculative: {method, k, acceptance, draft_model | draft_cost_fraction}`` turns
each decode of a request into a *verify step*.  Per request (``left``: output tokens still to
produce) the step

- drafts ``d = min(k, left - 1)`` tokens (the last steps draft no more than they can use), with
  a draft model (``method: draft``) or the target's multi-token-prediction head (``mtp``);
- verifies them in one target step that computes ``d + 1`` query tokens for the request (its
  last token plus the drafts): the linear layers do (d + 1)x the FLOPs but read the weights
  once, attention reads the context once with d + 1 queries, the LM head has d + 1 rows;
- emits ``1 + a`` tokens, ``a`` the number of *leading* accepted drafts: each draft is accepted
  with probability ``acceptance``, i.i.d. per position (the standard rejection-sampling
  analysis), and the verify step always yields one more token (the correction or the bonus
  one).  With d = k a step emits on average (1 - p^(k+1)) / (1 - p) tokens at acceptance p.

Randomness.  Request r's i-th verify step reads row i of a table of k uniforms per step drawn
from ``numpy.random.default_rng([seed, SALT, r.id, i // CHUNK])``; a per-request acceptance
(``{dist: uniform | beta}``) is drawn once from ``[seed, SALT, r.id]``.  A draw therefore depends
on (seed, request, step number) only: not on event order, the batch, the instance, or on the
failure of a step in flight (a draw is taken when a step is applied), and the same request gets
the same draws in every topology of a scenario.

Cost of a step = the target's verify step + the drafts.  The drafts run ``max d`` sequential
small steps, draft step j holding the requests with ``d >= j`` (one token each, context c + j - 1);
priced with the draft model (or, for MTP, a one-layer model of the target's shape: one decoder
layer, the shared embedding and LM head) on the pool's device and TP without the engine's
per-step overhead (the draft passes run inside the engine's step), or as ``draft_cost_fraction``
x a plain target decode step of the same batch.  Under pipeline parallelism the verify step is a
pipeline iteration of the verify aggregates (pdsim/pipeline.py) and the drafts run after it on the
last stage's GPUs, added to the iteration: exact for a lone request and for a saturated pipeline of
uniform stages (the last stage carries the drafts), pessimistic when another stage binds.  Not
modelled: the draft model's prefill of the prompt and its catch-up on the accepted tokens (a few
tokens per step), and tree or dynamic-k speculation.  When every item of a step is a verify,
attention is priced with the decode kernel (KV read once; compute at the decode kernel's efficiency for the d + 1 queries); in a step that
also holds prefill chunks the mixed-batch rule of the cost model applies, as without speculation.

KV: before the step each verifying request holds blocks for its d lookahead slots (vLLM
allocates them the same way); if the pool is short, d shrinks to what fits (drafts never
preempt).  After the step the request's cached tokens grow by the 1 + a verified tokens only;
the slots stay held (the next step reuses them) until the request leaves.  A draft model's
weights and KV (MTP: one layer's) take pool memory: :func:`kv_blocks` shrinks the pool.

The multi-step fast path is off in speculative pools (each step's token counts depend on its
draws); see README "Speculative decoding" for the measured cost.
"""
from __future__ import annotations

import dataclasses

import numpy as np

from .costmodel import RooflineCost, StepCost, deal_ranks, request_part, splits_mla_steps
from .errors import ConfigError
from .kernels import attention_roofline
from .pipeline import PipelineCost
from .workload import FINISHED, UNFINISHED

SALT = 0x5BEC        # keeps these streams apart from the workload's and the faults' seeds
CHUNK = 64           # verify steps drawn at once per request


def mean_tokens_per_step(acceptance: float, k: int) -> float:
    """Expected tokens a verify step with k drafts emits: sum_{j=0..k} p^j = (1 - p^(k+1)) / (1 - p)."""
    p = acceptance
    return float(k + 1) if p >= 1.0 else (1.0 - p ** (k + 1)) / (1.0 - p)


def mtp_shape(model):
    """The MTP head as a model: one decoder layer of the target's shape plus its embedding and LM head.  Its MLP
    is of the kind of the target's last layer: a MoE layer for a MoE model (DeepSeek-V3's MTP module is a full
    MoE block), whatever its first dense layers."""
    return dataclasses.replace(model, name=f"{model.name}-mtp", layers=1,
                               dense_layers=0 if model.is_moe else model.dense_layers, sliding_layers=0)


def mtp_weight_bytes_per_gpu(model, weight_dtype: str, tp: int, ep: int = 1, dp_attention: bool = False) -> float:
    """The MTP layer's own weights on one GPU (the embedding and LM head are the target's, shared): one layer
    sharded as the target's (experts over ep, attention replicated under DP attention), i.e. the per-GPU
    weights of a two-layer shape less those of a one-layer one."""
    one = mtp_shape(model)
    two = dataclasses.replace(one, layers=2)
    return (two.weight_bytes_per_gpu(weight_dtype, tp, ep, 1, dp_attention)
            - one.weight_bytes_per_gpu(weight_dtype, tp, ep, 1, dp_attention))


def draft_shape(spec, target_model, key: str):
    """The draft's model shape, or None when it is priced as a fraction of a target step."""
    if spec.draft_cost_fraction is not None:
        return None
    if spec.method == "mtp":
        return mtp_shape(target_model)
    m = spec.draft_model
    if isinstance(m, str):
        from .models import get_model
        return get_model(m, key=f"{key}.draft_model")
    from .models import ModelShape
    return ModelShape(m.name, m.layers, m.hidden, m.heads, m.kv_heads, m.head_dim or m.hidden // m.heads,
                      m.mlp_width, m.vocab, m.tied_embeddings, m.gated_mlp, m.max_context)


def draft_weight_bytes_per_gpu(spec, target_model, weight_dtype: str, tp: int, ep: int = 1,
                               dp_attention: bool = False, key: str = "") -> float:
    """The draft's own weights on one GPU of the pool: a draft model's over tp, the MTP layer's
    (:func:`mtp_weight_bytes_per_gpu`; the embedding and LM head are the target's), 0 for a
    fraction-priced draft.  They come out of the KV memory (:func:`kv_blocks`) and are loaded with the
    target's when an autoscaled instance starts (autoscaler load time)."""
    shape = draft_shape(spec, target_model, f"{key}.speculative")
    if shape is None:
        return 0.0
    if spec.method == "mtp":
        return mtp_weight_bytes_per_gpu(target_model, weight_dtype, tp, ep, dp_attention)
    return shape.weight_bytes(weight_dtype) / tp


def kv_blocks(spec, target_model, blocks: int, block_bytes: float, tp: int, weight_dtype: str,
              kv_dtype: str, key: str, pp: int = 1, ep: int = 1, dp_attention: bool = False,
              stages=None) -> int:
    """The pool's KV blocks once the draft's weights and its KV per token share the memory.

    ``blocks`` x ``block_bytes`` is what the pool had for the target's KV; the draft's weights
    (per GPU) come off it, and every cached token also holds the draft's KV, so a block costs
    (1 + draft KV / target KV) x ``block_bytes``.  A fraction-priced draft takes no memory.
    Under pipeline parallelism the draft sits on the last stage, whose GPUs hold 1 / pp of the
    target's KV per token: there a token costs (1 + pp x draft KV / target KV) of its share, and
    with uniform stages that stage bounds the pool.  Uneven stages (``stages``: each stage's
    [(KV memory, bytes per block)] on one GPU, :func:`pdsim.topology.stage_kv_memory`): the
    fewest blocks any stage has room for, the draft's weights and its KV (a block's draft KV per
    GPU: the whole target's per-GPU block bytes, the stages' sum, x draft KV / target KV) on the
    last stage only."""
    shape = draft_shape(spec, target_model, f"{key}.speculative")
    if shape is None:
        return blocks
    weights = draft_weight_bytes_per_gpu(spec, target_model, weight_dtype, tp, ep, dp_attention, key)
    if stages is not None:
        draft_bb = sum(bb for _, bb in stages) * shape.kv_bytes_per_token(kv_dtype) \
            / target_model.kv_bytes_per_token(kv_dtype)
        new = min(int(free // bb) for free, bb in stages[:-1])
        free, bb = stages[-1]
        new = min(new, int((free - weights) // (bb + draft_bb)))
    else:
        ratio = pp * shape.kv_bytes_per_token(kv_dtype) / target_model.kv_bytes_per_token(kv_dtype)
        new = int((blocks * block_bytes - weights) // (block_bytes * (1.0 + ratio)))
    if new < 1:
        raise ConfigError(f"the draft ({shape.name}, {weights / 2**30:.2f} GiB per GPU) leaves no memory "
                          "for the KV cache" + (" on the last pipeline stage" if stages is not None else ""),
                          key=f"{key}.speculative", value=spec.method)
    return new


def beta_params(mean: float, std: float) -> tuple[float, float]:
    nu = mean * (1.0 - mean) / std ** 2 - 1.0
    return mean * nu, (1.0 - mean) * nu


class Speculator:
    """One pool's speculative decoding: the draws, the cost of a verify step, its application.

    ``target`` is the pool's cost model; ``draft`` a cost model of the draft (None when priced
    as ``draft_cost_fraction`` of a target step)."""

    def __init__(self, spec, target, draft, seed: int):
        self.k = spec.k
        self.acceptance = spec.acceptance
        self.fraction = spec.draft_cost_fraction
        self.target, self.draft = target, draft
        # an MLA target whose step can price a mixed step's decodes and chunks apart (not a pipelined pool)
        self._mla_split = splits_mla_steps(target)
        self.draft_overhead_s = float(getattr(getattr(draft, "device", None), "step_overhead_s", 0.0))
        self.seed = seed
        self._state: dict[int, list] = {}      # request id -> [acceptance, chunk index, leading counts, steps]
        self._draft_room = None        # this step's token budget for drafts (None: no budget binds them)
        # totals for summary.json
        self.verify_steps = 0          # request-steps that verified at least one draft
        self.drafted = 0
        self.accepted_total = 0
        self.draft_time_s = 0.0

    # --- the acceptance process --------------------------------------------------
    def rate(self, req_id: int) -> float:
        """The request's acceptance probability (a constant, or drawn once per request)."""
        a = self.acceptance
        if not hasattr(a, "dist"):
            return float(a)
        rng = np.random.default_rng([self.seed, SALT, req_id])
        if a.dist == "uniform":
            return float(rng.uniform(a.low, a.high))
        al, be = beta_params(a.mean, a.std)
        return float(rng.beta(al, be))

    def accepted(self, req_id: int) -> int:
        """Leading accepted drafts (0..k) of this request's next verify step; advances its counter."""
        st = self._state.get(req_id)
        if st is None:
            st = self._state[req_id] = [self.rate(req_id), -1, None, 0]
        p, i = st[0], st[3]
        st[3] = i + 1
        if p >= 1.0:
            return self.k
        if p <= 0.0:
            return 0
        chunk = i // CHUNK
        if chunk != st[1]:
            rng = np.random.default_rng([self.seed, SALT, req_id, chunk])
            ok = rng.random((CHUNK, self.k)) < p                       # (step, position): draft accepted
            ok = np.concatenate([ok, np.zeros((CHUNK, 1), bool)], axis=1)
            st[1], st[2] = chunk, np.argmin(ok, axis=1).tolist()      # index of the first rejection
        return st[2][i % CHUNK]

    # --- planning estimates (the autoscaler's capacity per instance) --------------------------------
    def mean_tokens(self) -> float:
        """Expected tokens a verify step of k drafts emits, over the requests: sum_{j=0..k} E[a^j] with E over
        the acceptance rate a.  A constant a gives (1 - a^(k+1)) / (1 - a); a per-request ``uniform`` or ``beta``
        rate its moments (uniform on [l, h]: (h^(j+1) - l^(j+1)) / ((j + 1)(h - l)); beta(al, be):
        prod_{r<j} (al + r) / (al + be + r)), i.e. the mean over requests of each one's own expectation, not
        the formula at the mean rate."""
        a, k = self.acceptance, self.k
        if not hasattr(a, "dist"):
            return mean_tokens_per_step(float(a), k)
        if a.dist == "uniform":
            lo, hi = float(a.low), float(a.high)
            if hi - lo <= 0.0:
                return mean_tokens_per_step(lo, k)
            return float(sum((hi ** (j + 1) - lo ** (j + 1)) / ((j + 1) * (hi - lo)) for j in range(k + 1)))
        al, be = beta_params(a.mean, a.std)
        total, moment = 1.0, 1.0
        for r in range(k):
            moment *= (al + r) / (al + be + r)
            total += moment
        return float(total)

    def step_time(self, batch: int, context: int) -> float:
        """One verify step of ``batch`` requests, each at ``context`` cached tokens drafting k (every item a verify:
        priced as :meth:`plan_step` prices it), plus its k draft steps.  An estimate for planning: a request's
        last steps draft fewer (d = min(k, tokens left - 1)), which this leaves out."""
        k, B, c = self.k, int(batch), float(context)
        T = S = B * (1 + k)
        attn = B * (1 + k) * (c + 0.5 * (1 + k))
        kvr = B * (c + 1 + k)
        t = self._verify_cost(T, attn, kvr, S, B, True).time_s
        dt, _, _ = self._draft_cost([k] * B, [int(c)] * B)
        return float(t + dt)

    # --- one step ------------------------------------------------------------------
    def reserve(self, running: list, limits, policy):
        """The limits the scheduler plans this step with: a budgeted policy (``chunked``, ``inflight``: decodes
        and prompt chunks share ``max_batched_tokens``) counts each verifying request's drafts against the
        budget before any waiting prompt gets a token, as vLLM charges a request's speculative tokens to
        the step's budget (its running requests scheduled first); drafts beyond what the budget holds after
        one token per running request are not proposed (:meth:`plan_step`).  ``fcfs`` runs prompts in steps
        of their own, its decode steps unbudgeted: unchanged."""
        from .scheduler import fcfs
        self._draft_room = None
        if policy is fcfs:
            return limits
        want = ones = 0
        k = self.k
        for r in running:
            if r.generated >= 1 and r.computed + 1 == r.prompt_tokens + r.generated:
                want += min(k, r.output_tokens - r.generated - 1)
            ones += 1
        room = max(0, min(want, limits.max_batched_tokens - ones))
        self._draft_room = room
        if not room:
            return limits
        return dataclasses.replace(limits, max_batched_tokens=limits.max_batched_tokens - room)

    def plan_step(self, plan, kv):
        """(StepCost, drafts per plan item: -1 for a prefill item, else d >= 0).  Grows the
        verifying requests' blocks for their lookahead slots."""
        k = self.k
        bs = kv.block_size
        drafts = []
        T, attn, kvr, S = plan.tokens, plan.attn_work, plan.kv_read_tokens, plan.sampled
        pure = True
        ds, cs = [], []
        room = self._draft_room          # drafts the step's token budget still holds (None: unbounded)
        for req, n in plan.items:
            c = req.computed
            if n == 1 and req.generated >= 1 and c + 1 == req.known:
                d = min(k, req.output_tokens - req.generated - 1)
                if room is not None and d > room:
                    d = room
                while d > 0 and -(-(c + 1 + d) // bs) > req.blocks and not kv.grow(req, c + 1 + d):
                    d -= 1
                if room is not None:
                    room -= max(d, 0)
                if d > 0:
                    T += d
                    S += d
                    kvr += d
                    attn += (1 + d) * (c + 0.5 * (1 + d)) - (c + 0.5)
                    ds.append(d)
                    cs.append(c)
                drafts.append(d)
            else:
                drafts.append(-1)
                pure = False
        rank = None
        decodes = None
        dp = getattr(self.target, "attn_dp", 1) > 1
        mla = self._mla_split
        if not pure and (dp or mla):    # a prompt chunk in the step: DP ranks, or MLA's two kernels
            parts = []
            for (req, n), d in zip(plan.items, drafts):
                c = req.computed
                if d > 0:          # a verify item: 1 + d query tokens, each sampled; a decode, it stays put
                    parts.append((1 + d, (1 + d) * (c + 0.5 * (1 + d)), c + 1 + d, 1 + d, True))
                else:
                    parts.append(request_part(req, n))
            if dp:
                rank = deal_ranks(parts, self.target.attn_dp)
            else:
                dec = [p for p in parts if p[4]]
                decodes = (sum(p[0] for p in dec), sum(p[1] for p in dec), sum(p[2] for p in dec), len(dec))
        tgt = self._verify_cost(T, attn, kvr, S, len(plan.items), pure and bool(ds), rank, decodes)
        if not ds:
            return tgt, drafts
        dt, df, db = self._draft_cost(ds, cs)
        self.draft_time_s += dt
        return StepCost(tgt.time_s + dt, tgt.flops + df, tgt.bytes + db), drafts

    def _verify_cost(self, T, attn, kvr, S, B, pure: bool, rank=None, decodes=None) -> StepCost:
        cost = self.target
        wrappers = []                                # engine overhead, power cap: outermost first
        inner = cost
        while getattr(type(inner), "__name__", "") in ("EngineCost", "CappedCost"):
            wrappers.append(inner)
            inner = inner.inner
        if not (pure and isinstance(inner, RooflineCost)):
            if rank is not None:
                return cost.step(T, attn, kvr, S, B, rank=rank)
            return cost.step(T, attn, kvr, S, B) if decodes is None else cost.step(T, attn, kvr, S, B, decodes=decodes)
        # (under DP attention the busiest rank's attention: RooflineCost._parts deals the batch as for any step)
        t_s, f_s, b_s, att = inner._parts(T, float(attn), float(kvr), S, B, False)
        # decode kernel: the KV is read once; the d + 1 queries' FLOPs at the decode kernel's efficiency
        t_a = max(float(inner.op_time(att)[0]), float(attention_roofline(inner.device, att.flops, 0.0, False)))
        L = att.count
        t, f, b = t_s + t_a * L, f_s + att.flops * L, b_s + att.bytes * L
        for w in reversed(wrappers):                 # as each wrapper's step() would adjust it
            if type(w).__name__ == "EngineCost":
                t += w.overhead(B, T, prefill=False) - w.replaced_s   # a verify step holds no prompt
            else:
                t *= float(w._stretch(f, b))
        return StepCost(float(t), float(f), float(b))

    def _draft_cost(self, ds: list, cs: list) -> tuple[float, float, float]:
        """Draft step j (1-based) holds the requests with d >= j, one token each at context c + j - 1."""
        model = self.target if self.draft is None else self.draft
        scale = self.fraction if self.draft is None else 1.0
        ovh = 0.0 if self.draft is None else self.draft_overhead_s
        dmax = max(ds)
        if min(ds) == dmax:        # the usual case: every request drafts k; the k steps at once
            B, c = len(ds), float(sum(cs))
            ts, fs, bs = model.decode_steps(B, c + 0.5 * B, c + B, dmax)
            return (scale * float(np.maximum(ts - ovh, 0.0).sum()), scale * float(fs.sum()),
                    scale * float(bs.sum()))
        t = f = b = 0.0
        for j in range(1, dmax + 1):
            B, ctx = 0, 0.0
            for d, c in zip(ds, cs):
                if d >= j:
                    B += 1
                    ctx += c
            ctx += B * (j - 1)                      # tokens cached before draft step j
            s = model.step(B, ctx + 0.5 * B, ctx + B, B, B)
            t += scale * max(0.0, s.time_s - ovh)
            f += scale * s.flops
            b += scale * s.bytes
        return t, f, b

    def apply(self, inst, plan, drafts, t0: float) -> None:
        """:meth:`pdsim.instance.Instance._apply` for a step with verify items: a verifying
        request gains 1 + accepted tokens (and their KV); everything else as there."""
        now = inst.env.now
        leaving = False
        kv = inst.kv
        prefix = kv.prefix_on
        role = inst.role
        for (req, n), d in zip(plan.items, drafts):
            if req.status != UNFINISHED:   # abandoned by its client while the step ran
                continue
            if req.prefill_start_s != req.prefill_start_s:
                req.prefill_start_s = t0
            req.computed += n
            inst.outstanding_tokens -= n
            if prefix:
                kv.commit(req)
            if req.computed != req.known:
                continue
            m = 1
            if d > 0:
                a = min(self.accepted(req.id), d)
                self.verify_steps += 1
                self.drafted += d
                self.accepted_total += a
                m += a
                req.computed += a            # the accepted drafts' KV stays; the rejected ones' is dropped
                inst.outstanding_tokens -= a
            req.generated += m
            inst.decode_work -= m
            if req.token_s is not None:
                req.token_s.extend([now] * m)      # a verify step streams its tokens at once
            if role == "decode" and req.decode_first_s != req.decode_first_s:
                req.decode_first_s = now
            if req.generated == m:             # generated was 0: its first token
                req.first_token_s = req.prefill_end_s = now
                inst.sink.first_token(req)
            if req.generated >= req.output_tokens:
                assert req.generated == req.output_tokens, (req.id, req.generated, req.output_tokens)
                req.status = FINISHED
                req.finish_s = now
                kv.release(req)
                self._state.pop(req.id, None)
                leaving = True
                inst.sink.finished(req, inst)
            elif role == "prefill":
                from .instance import HANDOFF
                req.status = HANDOFF
                inst.decode_work -= req.output_tokens - req.generated
                leaving = True
                inst.sink.prefill_done(req, inst)
        if leaving:
            inst.running = [r for r in inst.running if r.status == UNFINISHED]

    def summary(self) -> dict:
        """What the pool's verify steps did (summary.json ``speculative``)."""
        n = self.verify_steps
        return {"verify_request_steps": n, "drafted_tokens": self.drafted, "accepted_tokens": self.accepted_total,
                # accepted / drafted (vLLM's draft acceptance rate); below the per-position rate: drafts after a
                # rejection count as drafted, never accepted
                "draft_acceptance_rate": self.accepted_total / self.drafted if self.drafted else None,
                "tokens_per_verify_step": (n + self.accepted_total) / n if n else None,
                "draft_time_s": self.draft_time_s}


def build(spec, pool_spec, target_cost, model, weight_dtype: str, kv_dtype: str, device, seed: int,
          key: str, power=None) -> Speculator:
    """The pool's Speculator; the draft model is priced on the pool's device at its TP."""
    shape = draft_shape(spec, model, f"{key}.speculative")
    draft = None
    if shape is not None:
        if device is None or pool_spec.cost_model.kind != "roofline":
            raise ConfigError("a draft model (or MTP head) is priced on the device: with a constant or linear "
                              "cost model give draft_cost_fraction instead", key=f"{key}.speculative",
                              value=spec.method)
        shape.validate_tp(pool_spec.tp, key=f"{key}.speculative.draft_model")
        if spec.method == "mtp":
            # the MTP head is a layer of the target: sharded and priced as the target's layers are (EP, expert
            # skew, DP attention, the measured tables it uses)
            inner = target_cost
            while not isinstance(inner, RooflineCost):   # EngineCost / CappedCost / PipelineCost of a roofline pool
                inner = inner.stages if isinstance(inner, PipelineCost) else inner.inner
            # (under pipeline parallelism it sits on the last stage, one stage's tp GPUs)
            draft = dataclasses.replace(inner, model=shape, pp=1, pp_layers=None, _static_cache={})
        elif pool_spec.dp_attention:
            raise ConfigError("a separate draft model under DP attention is not modelled (each attention rank "
                              "would run its own draft): use method mtp or draft_cost_fraction",
                              key=f"{key}.speculative.draft_model", value=shape.name)
        else:
            if shape.name == model.name:
                import warnings
                warnings.warn(f"{key}.speculative.draft_model is the target model itself ({shape.name}): every "
                              f"draft step costs a whole target decode step, so speculation cannot pay off; "
                              f"name a smaller draft model", UserWarning, stacklevel=2)
            draft = RooflineCost(shape, device, pool_spec.tp, weight_dtype, kv_dtype)
        if power is not None and power.clock_fraction < 1.0:
            from .energy import CappedCost
            draft = CappedCost(draft, power)          # the draft runs on the same capped clocks
    return Speculator(spec, target_cost, draft, seed)

