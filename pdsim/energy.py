"""Energy: a per-device power model, optional power caps, and the energy of pools over a run.

Power of one GPU (the device profile's ``power: {idle_W, max_W, source}``; the shipped presets
carry their datasheet TDP as ``max_W`` and an idle estimate, not measured):

- ``idle_W`` whenever it runs no step (queues empty, waiting for KV, failed or warming up: a
  provisioned GPU draws idle power; so does each GPU of a TP group);
- during a step ``idle_W + (max_W - idle_W) x u``, with ``u = min(1, max(MFU, MBU))`` of that
  step: MFU = the step's FLOPs per GPU / (step time x peak FLOP/s), MBU = its bytes per GPU /
  (step time x memory bandwidth).  **Assumption**: dynamic power is linear in the utilisation of
  whichever unit (tensor cores or HBM) the step keeps busier.  Not fitted to measurements:
  real boards draw more than this for memory-bound decode at low MBU (clocks stay high) and
  a compute-bound GEMM rarely reaches TDP.  Treat energies as estimates (about +-30%).

So an instance of ``gpus`` GPUs over a run of ``span_s`` uses exactly
``gpus x (idle_W x span_s + (max_W - idle_W) x active_s)`` joules, ``active_s`` = the sum over
its steps of ``step time x u`` (:attr:`pdsim.instance.Instance.active_s`, accumulated per step,
fast-path windows included).

Power cap (``power_cap_W`` per pool, per GPU, like ``nvidia-smi -pl``).  **Law**: dynamic
power scales with the cube of the SM clock (P ~ f V^2, V ~ f in the DVFS range), so a cap gives
the clock fraction ``f = ((cap - idle_W) / (max_W - idle_W)) ** (1/3)`` (1 at cap = max_W; caps below
2/7 of max_W, the lowest H100/H200 boards accept, or above max_W are refused).
Compute slows by f, HBM bandwidth does not: a step whose roofline times at full clock are
``c = FLOPs / peak`` and ``m = bytes / bandwidth`` takes ``max(c / f, m) / max(c, m)`` times
as long (a memory-bound decode step barely changes, a compute-bound prefill slows by 1/f).
During a step the GPU draws ``idle_W + (min(max_W, cap) - idle_W) x u``, u measured against the
capped peak.  The cube law is a textbook approximation, not measured here.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .costmodel import CostModel, StepCost
from .errors import ConfigError


# the lowest power limit a board accepts, as a fraction of its maximum: NVIDIA's H100/H200 SXM boards report
# an allowable minimum of 200 W against 700 W (nvidia-smi -q "Min Power Limit", DGX Redfish AllowableMin);
# other boards are assumed to allow the same fraction
MIN_CAP_FRACTION = 200.0 / 700.0


@dataclass(frozen=True)
class PowerModel:
    idle_W: float
    max_W: float               # active power at u = 1 (the cap when it is below the board's max)
    source: str
    peak_flops: float          # per GPU, compute dtype, at the (capped) clock
    peak_Bps: float            # per GPU memory bandwidth
    clock_fraction: float = 1.0
    cap_W: float | None = None


def clock_fraction(idle_W: float, max_W: float, cap_W: float) -> float:
    """SM clock fraction under a power cap (the cube law of the module docstring)."""
    if cap_W >= max_W:
        return 1.0
    return ((cap_W - idle_W) / (max_W - idle_W)) ** (1.0 / 3.0)


def power_model(device, cost, cap_W: float | None, key: str) -> PowerModel | None:
    """The pool's power model, or None when its device profile has no ``power`` (energy: n/a)."""
    p = getattr(getattr(device, "spec", None), "power", None)
    if p is None:
        if cap_W is not None:
            raise ConfigError(f"device {getattr(device, 'name', None)!r} has no power model (a profile's "
                              "power: {idle_W, max_W, source}), so a power cap cannot be applied",
                              key=f"{key}.power_cap_W", value=cap_W)
        return None
    peak = device.peak_flops(getattr(cost, "compute_dtype", "bf16"))
    if cap_W is None:
        return PowerModel(p.idle_W, p.max_W, p.source, peak, device.mem_bw_Bps)
    if cap_W <= p.idle_W:
        raise ConfigError(f"a power cap must be above the device's idle power ({p.idle_W} W)",
                          key=f"{key}.power_cap_W", value=cap_W)
    lowest = MIN_CAP_FRACTION * p.max_W
    if cap_W < lowest:
        raise ConfigError(f"below the lowest cap a board accepts, {lowest:.0f} W (2/7 of its {p.max_W:g} W, as H100 "
                          "and H200 SXM boards allow 200 of 700 W); the clock law is not meant for deeper caps",
                          key=f"{key}.power_cap_W", value=cap_W)
    if cap_W > p.max_W:
        raise ConfigError(f"above the device's maximum power ({p.max_W:g} W): such a cap changes nothing; leave it out",
                          key=f"{key}.power_cap_W", value=cap_W)
    f = clock_fraction(p.idle_W, p.max_W, cap_W)
    return PowerModel(p.idle_W, min(p.max_W, cap_W), p.source, peak * f, device.mem_bw_Bps, f, cap_W)


class CappedCost:
    """A cost model under a power cap: each step's time x max(c / f, m) / max(c, m) (see above)."""

    def __init__(self, inner, pm: PowerModel):
        self.inner = inner
        self.f = pm.clock_fraction
        self.inv_c = 1.0 / (pm.peak_flops / pm.clock_fraction)      # full-clock peak
        self.inv_m = 1.0 / pm.peak_Bps

    def __getattr__(self, name):          # device, tp, compute_dtype, weight_bytes_per_gpu, ...
        return getattr(self.inner, name)

    def _stretch(self, flops, bytes_):
        c, m = flops * self.inv_c, bytes_ * self.inv_m
        full = np.maximum(c, m)
        return np.where(full > 0, np.maximum(c / self.f, m) / np.where(full > 0, full, 1.0), 1.0)

    def step(self, tokens, attn_work, kv_read_tokens, sampled, batch, swa=None, rank=None, decodes=None):
        if rank is not None:            # DP attention's ranks, whole requests each (costmodel.busiest_rank)
            s = self.inner.step(tokens, attn_work, kv_read_tokens, sampled, batch, rank=rank)
            # the step waits for its slowest rank under the cap: each rank slows by its own compute/memory mix
            # (the step's FLOPs and bytes are the ranks' mean, which an idle rank would make look memory-bound)
            ranks = self.inner.rank_costs(tokens, sampled, rank)
            raw = max(t for t, _, _ in ranks)
            capped = max(t * float(self._stretch(f, b)) for t, f, b in ranks)
            return StepCost(s.time_s * (capped / raw if raw > 0 else 1.0), s.flops, s.bytes)
        elif decodes is not None:       # a mixed MLA step's decodes (costmodel.decode_part)
            s = self.inner.step(tokens, attn_work, kv_read_tokens, sampled, batch, decodes=decodes)
        else:
            s = self.inner.step(tokens, attn_work, kv_read_tokens, sampled, batch) if swa is None else \
                self.inner.step(tokens, attn_work, kv_read_tokens, sampled, batch, swa=swa)
        return StepCost(s.time_s * float(self._stretch(s.flops, s.bytes)), s.flops, s.bytes)

    def decode_steps(self, batch, attn0, kv0, k, swa=None):
        t, f, b = self.inner.decode_steps(batch, attn0, kv0, k) if swa is None else \
            self.inner.decode_steps(batch, attn0, kv0, k, swa=swa)
        return t * self._stretch(f, b), f, b

    def prefill_time(self, prompt_tokens: int) -> float:
        return CostModel.prefill_time(self, prompt_tokens)      # this step (sliding layers' aggregates too)

    def decode_time(self, batch: int, context: int) -> float:
        return CostModel.decode_time(self, batch, context)


def instance_energy_J(inst, pm: PowerModel, span_s: float) -> float:
    """Joules of one instance over ``span_s`` (every GPU of its TP group) while it is alive: an autoscaled
    instance draws idle power from its scale-out decision (provisioning and loading included) until it
    leaves, and nothing while off; a static one is alive the whole span."""
    return inst.gpus * (pm.idle_W * inst.alive_s(span_s) + (pm.max_W - pm.idle_W) * inst.active_s)


def pool_energy(pool, span_s: float) -> dict | None:
    pm = getattr(pool, "power", None)
    if pm is None:
        return None
    joules = sum(instance_energy_J(i, pm, span_s) for i in pool.instances)
    idle = pool.spec.gpus_per_instance * pm.idle_W * pool.alive_s(span_s)
    return {"energy_J": joules, "idle_energy_J": idle, "active_energy_J": joules - idle,
            "mean_power_W": joules / span_s if span_s > 0 else None,
            "idle_W_per_gpu": pm.idle_W, "max_W_per_gpu": pm.max_W, "power_cap_W": pm.cap_W,
            "clock_fraction": pm.clock_fraction, "power_source": pm.source}


def topology_energy(topo, span_s: float, finished: int, output_tokens: float) -> dict | None:
    """Energy per pool and in all, per finished request and per output token, tokens/s per kW.
    None when any pool lacks a power model (a partial total would mislead)."""
    pools = {p.name: pool_energy(p, span_s) for p in topo.pools}
    if not pools or any(v is None for v in pools.values()):
        return None
    joules = sum(v["energy_J"] for v in pools.values())
    kw = joules / span_s / 1e3 if span_s > 0 else None
    # each GPU at its TDP, or at its power cap where one is set (PowerModel.max_W); an autoscaled topology: the
    # most GPUs alive at once (as metrics' ``gpus``), not each pool's own peak summed (role switching moves
    # instances between pools, so those peaks need not coincide)
    scaler = getattr(topo, "autoscaler", None)
    provisioned_kw = (scaler.peak_gpus(lambda p: p.power.max_W) if scaler is not None
                      else sum(p.gpus * p.power.max_W for p in topo.pools)) / 1e3
    tps = output_tokens / span_s if span_s > 0 else 0.0
    return {
        "energy_J": joules,
        "energy_kWh": joules / 3.6e6,
        "mean_power_kW": kw,
        "provisioned_kW": provisioned_kw,
        "J_per_request": joules / finished if finished else None,
        "J_per_output_token": joules / output_tokens if output_tokens else None,
        "output_tokens_per_s_per_kW": tps / kw if kw else None,
        "output_tokens_per_s_per_provisioned_kW": tps / provisioned_kw if provisioned_kw else None,
        "pools": pools,
        "model": "P = idle_W + (max_W - idle_W) x max(MFU, MBU) per step, idle_W between steps "
                 "(an assumption, not measured; see pdsim/energy.py)",
    }
