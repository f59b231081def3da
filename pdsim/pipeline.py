"""Pipeline parallelism: an instance of ``pp`` stages of ``tp`` GPUs each, fed by micro-batches.

What an engine does (vLLM's ``pipeline_parallel_size`` with one virtual engine per stage,
TensorRT-LLM and SGLang alike): stage j holds n_j consecutive layers (weights and the KV
cache of those layers only), the first stage also the embedding, the last the LM head.  n_j
= L / pp when pp divides the L layers; otherwise vLLM's default split
(:func:`pdsim.models.pp_split`: L // pp each, the L % pp left over one each to the stages
just before the last) or a pool's explicit ``pp_layers``.  The busiest stage sets the
pipeline's cadence; the round trip is the sum of the stages.
The running batch is split into ``m`` micro-batches (``micro_batches``, default pp) that
chase each other through the stages without a flush between iterations: while stage 2
works on micro-batch 1, stage 1 already works on micro-batch 2, and micro-batch 1 starts
its next token as soon as its previous one has left the last stage.

The model (one scheduler iteration = every request of the batch advances by its tokens, as
without PP, so the instance loop, the fast path and the KV accounting stay as they are):

- the batch's B requests go to ``m_eff = min(m, B)`` micro-batches as evenly as whole
  requests allow (sizes ceil(B / m_eff) and floor(B / m_eff)); each micro-batch of b
  requests carries b / B of every aggregate of the step (tokens, attention work, KV reads,
  sampled rows).  ASSUMPTION: balanced micro-batches; a step mixing one long prompt with
  many decodes is priced as if the prompt's tokens were spread over the micro-batches
  (optimistic for such steps; exact for a lone request, for pure decode of equal contexts,
  and for equal prompts);
- ``s_j(b)``: micro-batch b on stage j, from the per-operator cost model restricted to the
  stage's layers (:meth:`pdsim.costmodel.RooflineCost.stage_times`; all-reduces within the
  stage's TP group); ``x(b)``: its activations (tokens x hidden x 2 bytes) sent to the
  next stage over the device's interconnect (:func:`pdsim.kernels.p2p_roofline`);
  ``o(b)``: the engine's per-step CPU overhead, once per micro-batch (each virtual engine
  schedules its own micro-batch), done before stage 0;
- the steady-state period of a cyclic pipeline is bounded by its busiest resource and by the
  round trip of one micro-batch::

      iteration_s = max( max_j  sum_i s_j(b_i),                      # stage j's GPUs, all micro-batches
                         sum_i o(b_i),                               # the scheduler (CPU)
                         o(b*) + sum_j s_j(b*) + (pp - 1) x(b*) )    # b*: the largest micro-batch, once around

  Exact for identical micro-batches; with two sizes it is the larger of the two bounds.  A
  lone request (m_eff = 1) takes ``o + sum_j s_j + (pp - 1) x``: pp x the stage time with
  uniform stages (the pipeline bubble, all of it); a saturated decode batch with m >= pp
  micro-batches is bound by one stage's work on all of them, m s(B/m), i.e. the cadence of
  the slowest stage (under an uneven split, the stage with the most layers, or the first /
  last with the embedding / LM head).  Stage-to-stage sends are asynchronous: they delay a
  micro-batch (in the round trip), they do not occupy a stage.  The GPipe-style flush bound
  ((m + pp - 1) x stage time per iteration) would describe engines that drain the
  pipeline between iterations; vLLM, SGLang and TRT-LLM do not;
- FLOPs and bytes reported are per GPU (the whole model's per-TP-rank amounts over all
  micro-batches, / pp), so MFU, MBU and energy keep their per-GPU meaning.  Weights are
  read once per micro-batch per stage: that is in the bytes and in each s_j.

``constant`` and ``linear`` cost models price **one stage** of one micro-batch (at pp = 1 the
stage is the whole model, as before); they have no interconnect and no overhead, so a lone
request takes exactly pp x their step time.  Under an uneven split their step prices an
average stage of L / pp layers and stage j costs n_j / (L / pp) of it (time proportional to
its layers): a lone request still takes pp x the step, while a busy pipeline runs at the
cadence of max_j n_j / (L / pp) x the step.  pp = 1 never builds a :class:`PipelineCost`:
results without PP are unchanged.
"""
from __future__ import annotations

import numpy as np

from .costmodel import CostModel, StepCost


def _max(a, b):
    if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        return np.maximum(a, b)
    return a if a >= b else b


class UniformStages:
    """``constant`` / ``linear`` what-if models as pipeline stages: each of the pp stages costs one
    step of the inner model, scaled by its share of the layers under an uneven split (``split``: the
    layers of each stage; stage j costs n_j pp / L steps, exactly one step when the split is even);
    no interconnect, no per-step overhead."""

    def __init__(self, inner: CostModel, pp: int, split=None):
        self.inner, self.pp = inner, pp
        L = sum(split) if split is not None else pp
        # n_j pp / L is exactly 1.0 for an even split (n_j pp == L), so even splits are unchanged
        self.scale = [1.0] * pp if split is None else [n * pp / L for n in split]
        assert len(self.scale) == pp, (pp, split)

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def stage_times(self, tokens, attn_work, kv_read_tokens, sampled, batch, swa=None):
        if swa is not None:                         # sliding layers: their aggregates along, element by element
            if isinstance(attn_work, np.ndarray):
                n = attn_work.shape
                t = np.array([self.inner.step(tokens, float(a), float(k), sampled, batch,
                                              swa=(float(w), float(v))).time_s
                              for a, k, w, v in zip(attn_work, np.broadcast_to(kv_read_tokens, n),
                                                    np.broadcast_to(swa[0], n), np.broadcast_to(swa[1], n))])
            else:
                t = self.inner.step(tokens, attn_work, kv_read_tokens, sampled, batch, swa=swa).time_s
        elif isinstance(attn_work, np.ndarray):       # the k-step fast path: one step per element
            t = np.array([self.inner.step(tokens, float(a), float(k), sampled, batch).time_s
                          for a, k in zip(attn_work, np.broadcast_to(kv_read_tokens, attn_work.shape))])
        else:
            t = self.inner.step(tokens, attn_work, kv_read_tokens, sampled, batch).time_s
        return [t * w for w in self.scale], 0.0, 0.0

    def stage_transfer_s(self, tokens) -> float:
        return 0.0

    def overhead_s(self) -> float:
        return 0.0


class PipelineCost(CostModel):
    """A pipeline of ``pp`` stages over ``stages`` (a :class:`~pdsim.costmodel.RooflineCost` built with
    ``pp``, or :class:`UniformStages`), ``micro_batches`` in flight; ``overhead(b, tokens)``: the engine's
    per-step CPU overhead of a micro-batch (default: the stages' flat ``overhead_s()``).  See the module
    docstring for the model."""

    def __init__(self, stages, pp: int, micro_batches: int | None = None, overhead=None):
        assert pp >= 2, pp
        self.stages, self.pp = stages, pp
        self.micro_batches = micro_batches or pp
        self.overhead = overhead
        self._flat_overhead_s = stages.overhead_s()
        self.window = stages.window           # the sliding window of the stages' model (None: none)

    def __getattr__(self, name):          # device, tp, compute_dtype, model, ... of the stage model
        if name == "stages":
            raise AttributeError(name)
        return getattr(self.stages, name)

    def with_overhead(self, overhead) -> "PipelineCost":
        """The same pipeline with an engine's per-step overhead ``overhead(b, tokens)`` per micro-batch."""
        return PipelineCost(self.stages, self.pp, self.micro_batches, overhead)

    def _o(self, b, tokens, prefill=False):
        return self._flat_overhead_s if self.overhead is None else self.overhead(b, tokens, prefill)

    def _stage_dispatch(self, prefill: bool):
        """Each stage's prefill dispatch (its own layers, on its own worker) when the iteration holds prompt
        tokens and the overhead splits it by stage; else None (then ``_o`` carries the whole of it)."""
        o = self.overhead
        if not prefill or o is None or getattr(o, "stage_prefill_s", None) is None or not o.prefill_s:
            return None
        return o.stage_prefill_s

    def split(self, batch: int) -> list[tuple[int, int]]:
        """[(micro-batch size in requests, how many of that size)], largest first."""
        m = max(1, min(self.micro_batches, batch))
        q, r = divmod(batch, m)
        return [(q + 1, r), (q, m - r)] if r else [(q, m)]

    def iteration(self, tokens, attn_work, kv_read_tokens, sampled, batch, swa=None):
        """(iteration seconds, FLOPs per GPU, bytes per GPU, details) of one scheduler iteration; attention
        work and KV reads may be arrays over decode steps (the same arithmetic, element by element); ``swa``:
        the sliding layers' (work, KV read), shared out over the micro-batches as the other aggregates."""
        B = max(1, batch)
        parts = self.split(B)
        load = [0.0] * self.pp
        cpu = flops = bytes_ = 0.0
        trip = None
        prefill = tokens > sampled       # prompt tokens in the iteration (each micro-batch holds its share of them)
        disp = self._stage_dispatch(prefill)
        if disp is not None:
            prefill = False              # the dispatch goes to the stages below, not to the driver's overhead
        for b, n in parts:
            if swa is None:
                s, f, by = self.stages.stage_times(tokens * b / B, attn_work * b / B, kv_read_tokens * b / B,
                                                   sampled * b / B, b)
            else:
                s, f, by = self.stages.stage_times(tokens * b / B, attn_work * b / B, kv_read_tokens * b / B,
                                                   sampled * b / B, b, swa=(swa[0] * b / B, swa[1] * b / B))
            o = self._o(b, tokens * b / B, prefill)
            if disp is not None:
                s = [s[j] + disp[j] for j in range(self.pp)]
            for j in range(self.pp):
                load[j] = load[j] + n * s[j]
            cpu += n * o
            flops = flops + n * f
            bytes_ = bytes_ + n * by
            if trip is None:                # the largest micro-batch, once through every stage
                x = self.stages.stage_transfer_s(tokens * b / B)
                trip = o
                for j in range(self.pp):
                    trip = trip + s[j]
                trip = trip + (self.pp - 1) * x
                first = {"micro_batch_requests": b, "stage_s": s, "transfer_s": x, "overhead_s": o}
        t = trip
        for j in range(self.pp):
            t = _max(t, load[j])
        t = _max(t, cpu)
        return t, flops / self.pp, bytes_ / self.pp, {"micro_batches": sum(n for _, n in parts),
                                                     "round_trip_s": trip, "stage_load_s": load, **first}

    def step(self, tokens, attn_work, kv_read_tokens, sampled, batch, swa=None):
        if swa is not None:
            swa = (float(swa[0]), float(swa[1]))
        t, f, b, _ = self.iteration(tokens, float(attn_work), float(kv_read_tokens), sampled, batch, swa)
        return StepCost(float(t), float(f), float(b))

    def decode_steps(self, batch, attn0, kv0, k, swa=None):
        i = np.arange(k, dtype=np.float64)
        attn = float(attn0) + batch * i
        kv = float(kv0) + batch * i
        if swa is not None:
            swa = (np.asarray(swa[0], dtype=np.float64), np.asarray(swa[1], dtype=np.float64))
        t, f, b, _ = self.iteration(batch, attn, kv, batch, batch, swa)
        return (np.broadcast_to(np.asarray(t, float), (k,)).copy(), np.broadcast_to(np.asarray(f, float), (k,)).copy(),
                np.broadcast_to(np.asarray(b, float), (k,)).copy())

    def breakdown(self, tokens, attn_work, kv_read_tokens, sampled, batch, swa=None) -> dict:
        """The stage model's per-op breakdown of ONE micro-batch of the largest size, over all stages."""
        b = self.split(max(1, batch))[0][0]
        B = max(1, batch)
        if swa is not None:
            return self.stages.breakdown(tokens * b / B, attn_work * b / B, kv_read_tokens * b / B, sampled * b / B,
                                         b, swa=(swa[0] * b / B, swa[1] * b / B))
        return self.stages.breakdown(tokens * b / B, attn_work * b / B, kv_read_tokens * b / B, sampled * b / B, b)
