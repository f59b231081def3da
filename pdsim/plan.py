"""Capacity planning: the cheapest deployment that meets the SLO, found by simulation.

A plan file names a model, a workload, SLOs, a search space (devices, TP, colocated
replicas, chunked-prefill budgets, prefill/decode instance counts, KV links), a budget
and an objective.  For every configuration in the space pdsim finds its **goodput**
(DistServe's definition: the highest arrival rate whose SLO attainment stays at or above
the target), by a bracketing search over the request rate with a stated relative
tolerance, each rate simulated on several seeds (attainment pooled over them).

Before simulating anything, analytic upper bounds prune the space: a replica or pool
cannot serve more requests per second than its FLOP/s allow for the prompts (linear
layers only, at the largest batch a step can hold) plus its memory bandwidth allows for
the decodes (at the largest batch its KV cache holds), and a configuration whose lone
prefill or lone decode already misses the bounds for too many requests can never meet
the SLO.  A configuration whose bound is below the goodput of a cheaper one already
measured is dominated and skipped.

With ``goodput.error_margin`` every configuration is judged at the SLO bounds divided by pdsim's measured
error for its engine and GPU (the p90 or median of measured / simulated latency over the validation runs,
or fixed factors), so a goodput holds if the real engine is that much slower than pdsim; without one, the
long runs are also judged at the p90 error, and the winner's share there is reported.

Simulations run as independent tasks on an executor: a local process pool (default) or
a Dask distributed cluster; rounds are formed from results only, so both give the same
table.  Results are cached on disk by a hash of the exact scenario and seed.
"""
from __future__ import annotations

import hashlib
import itertools
import json
import heapq
import math
import os
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import numpy as np
from pydantic import Field, ValidationError, field_validator, model_validator

from . import __version__
from .config import PosFloat, SLOSpec, _Strict, parse, read_yaml, validation_error
from .errors import ConfigError, PdsimError
from .workload import ABANDONED, FINISHED, REJECTED

# --- the plan file -----------------------------------------------------------------------


class DeviceChoice(_Strict):
    name: str                                     # preset name or profile path (relative to the plan file)
    price_per_hour_usd: float | None = Field(None, ge=0, allow_inf_nan=False)


class ColocatedSpace(_Strict):
    tp: list[int] = [1]
    pp: list[int] = [1]                            # pipeline stages (pdsim/pipeline.py); 1 = none
    replicas: list[int] = [1]
    chunked_prefill: list[int | None] = [None]     # token budgets; null = no chunking (fcfs)


class DisaggregatedSpace(_Strict):
    prefill_tp: list[int] = [1]
    prefill_pp: list[int] = [1]
    prefill_instances: list[int] = [1]
    decode_tp: list[int] = [1]
    decode_pp: list[int] = [1]
    decode_instances: list[int] = [1]
    decode_devices: list[str | DeviceChoice] | None = None   # default: the prefill device
    kv_link: list[Literal["nvlink", "infiniband", "roce", "ethernet", "pcie"]] = ["infiniband"]


class SearchSpace(_Strict):
    devices: list[str | DeviceChoice] = Field(min_length=1)
    colocated: ColocatedSpace | None = None
    disaggregated: DisaggregatedSpace | None = None
    pool: dict[str, Any] = {}                     # extra pool keys for every pool (max_running, cost_model, ...)

    @model_validator(mode="after")
    def _some(self):
        if self.colocated is None and self.disaggregated is None:
            raise ValueError("empty search space: give colocated: and/or disaggregated:")
        # a pool key the search space sets per config would be overridden by it, or (replicas) override it:
        # a config named x1 that runs 4 replicas
        axes = sorted(k for k in self.pool if k in ("kind", "device", "tp", "pp", "replicas", "instances"))
        if axes:
            raise ValueError(f"pool.{axes[0]}: set by the search space for each config; give it as a search axis "
                             "(devices, colocated.tp/pp/replicas, disaggregated.*_tp/_pp/_instances)")
        for name in ("colocated", "disaggregated"):
            space = getattr(self, name)
            if space is None:
                continue
            for k, v in space:
                if isinstance(v, list) and not v:
                    raise ValueError(f"empty search space: {name}.{k} is an empty list")
                if isinstance(v, list) and any(isinstance(x, int) and x < 1 for x in v):
                    raise ValueError(f"{name}.{k} values must be >= 1, got {v}")
        return self


class BudgetSpec(_Strict):
    max_gpus: int | None = Field(None, gt=0)
    max_usd_per_hour: float | None = Field(None, gt=0, allow_inf_nan=False)


class TargetSpec(_Strict):
    rate: PosFloat | None = None                  # requests/s the deployment must serve; None: find goodput


class MarginSpec(_Strict):
    """Fixed error margins: each simulated latency judged as (1 + margin) x itself (0.3: 30% longer)."""
    ttft: float = Field(0.0, ge=0, le=10, allow_inf_nan=False)
    tpot: float = Field(0.0, ge=0, le=10, allow_inf_nan=False)


class GoodputSpec(_Strict):
    tolerance: float = Field(0.05, gt=0, lt=1)    # relative width of the final rate bracket
    seeds: int = Field(2, ge=1, le=32)
    # worst_seed: a rate passes only if every seed's attainment meets the target (conservative: the
    # recommendation holds on a fresh seed); pooled: attainment over all seeds' requests together
    aggregate: Literal["worst_seed", "pooled"] = "worst_seed"
    # each simulation covers at least this much arrival time (more requests at high rates), so a
    # high rate is judged in steady state rather than on the first seconds of an empty cluster
    min_duration_s: float = Field(60.0, ge=0, allow_inf_nan=False)
    max_rounds: int = Field(14, ge=2, le=60)
    # a config that only differs from a smaller one of its family in replicas (colocated) or in scale at the
    # same prefill:decode ratio (disaggregated) waits for that one's search, then starts at its goodput
    # scaled by size and steps out from there by the tolerance (Search.guess): the same bracket rule, far
    # fewer simulations at the high rates that cost most
    scale_guess: bool = True
    # steady state: the first warmup_fraction of each simulation's requests (an empty cluster filling
    # up) is simulated but not judged
    warmup_fraction: float = Field(0.2, ge=0, lt=0.9)
    # stop a simulation once its verdict is certain (its judged requests already hold enough passes,
    # or too many misses, whatever the rest do); worst_seed only: pooled sums need exact counts
    early_stop: bool = True
    # before a config is declared, the best confirm_top are re-simulated on fresh seeds (trace: fresh
    # windows) over confirm_factor x the search window, doubled until the batch-means 95% interval of
    # the attainment is within +-ci_halfwidth or confirm_max_factor; a config that fails is demoted
    confirm_top: int = Field(3, ge=0, le=20)
    confirm_seeds: int = Field(1, ge=1, le=16)
    confirm_factor: float = Field(10.0, ge=1, le=1000, allow_inf_nan=False)
    confirm_max_factor: float = Field(40.0, ge=1, le=4000, allow_inf_nan=False)
    ci_halfwidth: float = Field(0.02, gt=0, lt=0.5)
    # judge every config at SLO bounds tightened by pdsim's measured error for its engine and GPU, so its
    # goodput holds if real latencies exceed pdsim's as they did on held-out benchmark runs: p90 / median
    # (the band's measured/simulated ratio: TTFT from the entry pool, TPOT from the last), a fixed
    # {ttft: 0.3, tpot: 0.1}, or none (judge simulated latencies as they are)
    error_margin: Literal["none", "median", "p90"] | MarginSpec = "none"

    @field_validator("error_margin", mode="before")
    @classmethod
    def _margin(cls, v):
        """One line for every bad form (pydantic's union would name its own branches, or hide a mapping's error)."""
        hint = "none, median, p90, or a mapping {ttft: M, tpot: M} of fractions >= 0 (0.3: judged 30% longer)"
        if isinstance(v, MarginSpec):
            return v
        if isinstance(v, str):
            if v not in ("none", "median", "p90"):
                raise ValueError(f"{v!r} is not one of {hint}")
            return v
        if isinstance(v, dict):
            if not v:
                raise ValueError(f"an empty mapping: give {hint}")
            try:
                return MarginSpec.model_validate(v)
            except ValidationError as exc:
                e = exc.errors()[0]
                where = ".".join(str(p) for p in e["loc"])
                if e["type"] == "extra_forbidden":
                    raise ValueError(f"unknown key {where!r} (ttft, tpot)") from None
                raise ValueError(f"{where} = {e.get('input')!r}: {e['msg']}") from None
        raise ValueError(f"{v!r} is not one of {hint}")

    @model_validator(mode="after")
    def _factors(self):
        if self.confirm_max_factor < self.confirm_factor:
            raise ValueError(f"confirm_max_factor {self.confirm_max_factor} < confirm_factor {self.confirm_factor}")
        return self


class PlanSpec(_Strict):
    name: str = "plan"
    description: str = ""
    seed: int = Field(0, ge=0, le=2**31)
    model: Any = "llama-3.1-8b"
    weight_dtype: str = "bf16"
    kv_dtype: str = "bf16"
    workload: dict[str, Any]
    slo: SLOSpec = SLOSpec()
    target: TargetSpec = TargetSpec()
    objective: Literal["cheapest", "goodput_per_gpu", "goodput_per_usd"] | None = None
    search: SearchSpace
    budget: BudgetSpec = BudgetSpec()
    goodput: GoodputSpec = GoodputSpec()

    @model_validator(mode="after")
    def _objective(self):
        if self.objective is None:
            self.objective = "cheapest" if self.target.rate else "goodput_per_usd"
        if self.objective == "cheapest" and not self.target.rate:
            raise ValueError("objective: cheapest needs target: {rate: REQUESTS_PER_S}")
        return self


@dataclass
class Plan:
    spec: PlanSpec
    file: str
    base_dir: Path
    configs: list["Config"] = field(default_factory=list)
    excluded: list[dict] = field(default_factory=list)     # configs outside the budget or that cannot run


@dataclass
class Config:
    name: str
    topology: dict                # a scenario topology entry
    gpus: int
    usd_per_hour: float
    bound_rate: float = math.inf  # analytic upper bound on goodput (requests/s)
    infeasible: str = ""          # why it can never meet the SLO ("" if it might)
    # per pool, the error measured against real runs for its engine and GPU (metrics.expected_error, as
    # `pdsim run` prints it): a goodput is as uncertain as the TTFT/TPOT it is judged on
    expected_error: dict = field(default_factory=dict)
    # the SLO this config is judged at (goodput.error_margin: the bounds over the margin's factors) and those
    # factors ({ttft_factor, tpot_factor, source}; None without a margin)
    slo: SLOSpec | None = None
    margin: dict | None = None
    # pdsim's p90 measured/simulated factors for its pools (validate.margin_factors; None: no measured band):
    # its long runs are also judged at the bounds divided by them (the winner's attainment at the p90 error)
    p90_factors: tuple[float, float] | None = None
    margin_error: str = ""        # why goodput.error_margin cannot judge it (no measured band): excluded


def error_margin(mode, bands: dict, ttft_pool: str, tpot_pool: str) -> dict | None:
    """The factors a config's SLO bounds are divided by (``goodput.error_margin``): ``{ttft_factor,
    tpot_factor, source}``, or None for ``none``; a named mode (p90, median) reads the pools' stored error
    bands (:func:`pdsim.validate.margin_factors`).  Raises ConfigError for a pool without such a band."""
    if isinstance(mode, MarginSpec):
        return {"ttft_factor": 1.0 + mode.ttft, "tpot_factor": 1.0 + mode.tpot,
                "source": f"fixed: TTFT +{mode.ttft:.0%}, TPOT +{mode.tpot:.0%}"}
    if mode == "none":
        return None
    from .validate import margin_factors
    return margin_factors(bands, ttft_pool, tpot_pool, mode, key="goodput.error_margin")


def judged_slo(slo: SLOSpec, margin: dict | None) -> SLOSpec:
    """The SLO a config is judged at: its bounds divided by the margin's factors (the same SLO without one)."""
    return slo if margin is None else slo.tightened(margin["ttft_factor"], margin["tpot_factor"])


def _device(choice) -> DeviceChoice:
    return choice if isinstance(choice, DeviceChoice) else DeviceChoice(name=choice)


def load_plan(path: str | Path, overrides: list[str] | None = None) -> Plan:
    from .config import apply_overrides
    path = Path(path)
    raw = read_yaml(path)
    if not isinstance(raw, dict):
        raise ConfigError("a plan must be a YAML mapping", file=str(path))
    raw = apply_overrides(raw, overrides or [], str(path))
    return parse_plan(raw, str(path), path.parent)


def _plan_vocabulary() -> set[str]:
    from .config import _vocabulary
    names = set(_vocabulary())
    for cls in (DeviceChoice, ColocatedSpace, DisaggregatedSpace, SearchSpace, BudgetSpec, TargetSpec, GoodputSpec,
                PlanSpec):
        names.update(cls.model_fields)
    return names


def parse_plan(raw: dict, file: str = "plan.yaml", base_dir: Path | str = ".") -> Plan:
    try:
        spec = PlanSpec.model_validate(raw)
    except ValidationError as exc:
        raise validation_error(exc, file, raw, _plan_vocabulary()) from None
    plan = Plan(spec, file, Path(base_dir))
    w = spec.workload
    if w.get("arrival", "poisson") == "closed":
        raise ConfigError("a plan searches over the arrival rate: use an open-loop arrival "
                          "(poisson, gamma, constant or trace)", file=file, key="workload.arrival", value="closed")
    # the workload must validate as a scenario's would (rate is the search variable)
    probe = _scenario_dict(plan, {"probe": {"kind": "colocated", "device": _device(spec.search.devices[0]).name}},
                           1.0, spec.seed)
    parse(probe, file, base_dir=base_dir)
    _enumerate(plan)
    return plan


# --- the search space ----------------------------------------------------------------------
def _pool(plan: Plan, dev: DeviceChoice, **keys) -> dict:
    d = {**plan.spec.search.pool, "device": dev.name, **keys}
    if dev.price_per_hour_usd is not None:
        d["price_per_gpu_hour_usd"] = dev.price_per_hour_usd
    return d


def _pp(pp: int) -> dict:
    """The pool key of a pipeline depth (none at 1: such configs, names and cache keys stay as before)."""
    return {"pp": pp} if pp != 1 else {}


def _pp_name(pp: int) -> str:
    return f"pp{pp}" if pp != 1 else ""


def _enumerate(plan: Plan) -> None:
    from .simulation import resolve_model
    s = plan.spec.search
    raw_topos: list[tuple[str, dict]] = []
    for choice in s.devices:
        dev = _device(choice)
        short = Path(dev.name).stem
        if s.colocated:
            c = s.colocated
            for tp, pp, n, chunk in itertools.product(c.tp, c.pp, c.replicas, c.chunked_prefill):
                t = {"kind": "colocated", "replicas": n, **_pool(plan, dev, tp=tp, **_pp(pp))}
                if chunk:
                    t["chunked_prefill"] = {"token_budget": chunk}
                raw_topos.append((f"colo-{short}-tp{tp}{_pp_name(pp)}x{n}" + (f"-chunk{chunk}" if chunk else ""), t))
        if s.disaggregated:
            d = s.disaggregated
            decs = [_device(x) for x in d.decode_devices] if d.decode_devices else [dev]
            for ptp, ppp, pn, dec, dtp, dpp, dn, link in itertools.product(
                    d.prefill_tp, d.prefill_pp, d.prefill_instances, decs, d.decode_tp, d.decode_pp,
                    d.decode_instances, d.kv_link):
                t = {"kind": "disaggregated", "prefill": _pool(plan, dev, tp=ptp, instances=pn, **_pp(ppp)),
                     "decode": _pool(plan, dec, tp=dtp, instances=dn, **_pp(dpp)), "kv_link": {"preset": link}}
                dshort = "" if dec.name == dev.name else f"-{Path(dec.name).stem}"
                raw_topos.append((f"pd-{short}-{pn}p{ptp}{_pp_name(ppp)}-{dn}d{dtp}{_pp_name(dpp)}{dshort}-{link}", t))
    # validate each, price it, and check the budget and that it can run at all
    sc_all = parse(_scenario_dict(plan, dict(raw_topos[:1]), 1.0, plan.spec.seed), plan.file,
                   base_dir=plan.base_dir)
    model = resolve_model(sc_all)
    b = plan.spec.budget
    for name, t in raw_topos:
        try:
            sc = parse(_scenario_dict(plan, {name: t}, 1.0, plan.spec.seed), plan.file, base_dir=plan.base_dir)
            cfg = _price_and_bound(plan, sc, name, t, model)
        except PdsimError as exc:
            plan.excluded.append({"config": name, "reason": str(exc)})
            continue
        if b.max_gpus is not None and cfg.gpus > b.max_gpus:
            plan.excluded.append({"config": name, "reason": f"{cfg.gpus} GPUs > budget.max_gpus {b.max_gpus}"})
            continue
        if b.max_usd_per_hour is not None and cfg.usd_per_hour > b.max_usd_per_hour:
            plan.excluded.append({"config": name, "reason": f"${cfg.usd_per_hour:.2f}/h > budget.max_usd_per_hour "
                                                            f"{b.max_usd_per_hour}"})
            continue
        if cfg.margin_error:
            plan.excluded.append({"config": name, "reason": cfg.margin_error})
            continue
        plan.configs.append(cfg)
    if not plan.configs:
        cheapest = min((e for e in plan.excluded), key=lambda e: e["reason"], default=None)
        if plan.excluded and any("goodput.error_margin" in e["reason"] for e in plan.excluded):
            raise ConfigError("no configuration of the search space both fits the budget and the model and has a "
                              "measured error band to judge it by (e.g. "
                              + next(f"{e['config']}: {e['reason']}" for e in plan.excluded
                                     if "goodput.error_margin" in e["reason"]) + ")",
                              file=plan.file, key="goodput.error_margin")
        raise ConfigError("no configuration of the search space fits the budget and the model"
                          + (f" (e.g. {cheapest['config']}: {cheapest['reason']})" if cheapest else ""),
                          file=plan.file, key="budget")
    plan.configs.sort(key=lambda c: (c.usd_per_hour, c.gpus, c.name))
    _unique_names(plan, [name for name, _ in raw_topos])


def _unique_names(plan: Plan, names: list[str]) -> None:
    """A config is known by its name (rows, searches, the cache of long runs): two configs of one name would
    be merged into one row, the other silently lost.  That happens when two device choices share a name or a
    file stem (one preset at two prices, or a/gpu.yaml and b/gpu.yaml)."""
    seen: set[str] = set()
    for name in names:
        if name in seen:
            raise ConfigError(f"two configurations of the search space are both named {name}: device choices "
                              "must differ in name (a preset listed twice, e.g. at two prices, or two profiles "
                              "with the same file name); copy the profile to a file of another name",
                              file=plan.file, key="search.devices")
        seen.add(name)


def _scenario_dict(plan: Plan, topologies: dict, rate: float, seed: int, scale: float = 1.0) -> dict:
    """A scenario (raw dict) of the plan's workload at ``rate`` requests/s, its window ``scale`` x the
    search window (long confirmation runs).  File paths are absolute (resolved here, on the client),
    so a worker in another directory reads the same files."""
    s = plan.spec
    w = json.loads(json.dumps(s.workload))
    if "num_requests" not in w and "duration_s" not in w:
        w["num_requests"] = 1000
    if "num_requests" in w and rate:
        w["num_requests"] = max(int(w["num_requests"]), int(math.ceil(rate * s.goodput.min_duration_s)))
    if scale != 1.0:
        if "num_requests" in w:
            w["num_requests"] = int(math.ceil(w["num_requests"] * scale))
        if "duration_s" in w:
            w["duration_s"] = float(w["duration_s"]) * scale
    if w.get("arrival", "poisson") == "trace":
        w.setdefault("trace", {})
        base, span = plan_base_rate(plan, with_span=True)
        w["trace"]["rate_scale"] = rate / base if rate else 1.0
        # a trace replays the same requests whatever the seed: replicate over successive windows
        k = seed - s.seed
        if k and "num_requests" in w:
            win = w["num_requests"] / base                 # trace seconds the window needs
            room = span - win
            if room > 0:
                w["trace"]["start_s"] = w["trace"].get("start_s", 0.0) + (k * win) % room
    else:
        w["rate"] = rate
    topologies = json.loads(json.dumps(topologies))
    _absolute_paths(w, topologies, plan.base_dir)
    return {"name": s.name, "seed": seed, "model": s.model, "weight_dtype": s.weight_dtype,
            "kv_dtype": s.kv_dtype, "workload": w, "slo": s.slo.model_dump(), "topologies": topologies}


def _absolute_paths(w: dict, topologies: dict, base_dir: Path) -> None:
    """Trace, length-distribution and device-profile paths made absolute against the plan's folder."""
    from .config import _is_profile_path
    base = Path(base_dir).resolve()

    def fix(d: dict, key: str) -> None:
        v = d.get(key)
        if isinstance(v, str) and not Path(v).is_absolute():
            d[key] = str(base / v)
    if isinstance(w.get("trace"), dict):
        fix(w["trace"], "path")
    for k in ("prompt_tokens", "output_tokens"):
        if isinstance(w.get(k), dict):
            fix(w[k], "path")
    for t in topologies.values():
        for pool in (t, t.get("prefill"), t.get("decode")):
            if isinstance(pool, dict) and isinstance(pool.get("device"), str) and _is_profile_path(pool["device"]):
                fix(pool, "device")


_BASE_RATES: dict = {}


def plan_base_rate(plan: Plan, with_span: bool = False):
    """A trace workload's own request rate (what rate_scale multiplies) over the whole trace window
    after start_s/duration_s (and its span in trace seconds when ``with_span``)."""
    key = json.dumps(plan.spec.workload, sort_keys=True, default=str) + str(plan.base_dir)
    if key not in _BASE_RATES:
        from .simulation import generate, resolve_model
        w = json.loads(json.dumps(plan.spec.workload))
        w.setdefault("trace", {})["rate_scale"] = 1.0
        w.pop("num_requests", None)
        raw = {"model": plan.spec.model, "workload": w, "topologies": {"x": {"kind": "colocated"}}}
        sc = parse(raw, plan.file, base_dir=plan.base_dir)
        reqs = generate(sc, resolve_model(sc))
        t = np.array([r.arrival_s for r in reqs])
        span = float(t.max() - t.min()) if len(t) > 1 else 0.0
        if span <= 0:
            raise ConfigError("the trace window has no time span to scale", file=plan.file, key="workload.trace")
        _BASE_RATES[key] = ((len(t) - 1) / span, span)
    rate, span = _BASE_RATES[key]
    return (rate, span) if with_span else rate


# --- analytic bounds ---------------------------------------------------------------------
def prefill_bound_s_per_token(cm, spec, p_max: int) -> float:
    """Least linear-layer time per prompt token over the step sizes the scheduler can form: up to the token
    budget and max_running prompts, or one whole prompt above the budget.  A pipelined pool overlaps its
    micro-batches, so T tokens are priced spread over 1 ... micro_batches of them (a step holds as many as it
    has prompts, up to micro_batches: fewer can be cheaper per token, e.g. when a stage's time does not fall
    with its tokens); a DP-attention pool's ranks each take T / ranks (its best case: as many prompts as
    ranks), never T on one rank, which would not bound the rate."""
    t_max = max(min(spec.token_budget, spec.max_running * p_max), min(p_max, spec.max_running * p_max))
    best = math.inf
    ranks = getattr(cm, "attn_dp", 1)
    mb = getattr(cm, "micro_batches", 1)
    spreads = range(1, mb + 1) if isinstance(mb, int) and mb > 1 else \
        [max(1, ranks if isinstance(ranks, int) else 1)]
    for T in {t_max, min(spec.token_budget, t_max), min(p_max, t_max)}:
        for spread in spreads:
            best = min(best, cm.step(T, 0.0, 0, 0, spread).time_s / T)
    return best


def _price_and_bound(plan: Plan, sc, name: str, t: dict, model) -> Config:
    import simpy

    from .simulation import Context, Sink, engine_defaults, ideal_cached_tokens, shared_stream
    from .topology import build
    env = simpy.Environment()
    ctx = Context(model, sc.weight_dtype, sc.kv_dtype, Path(sc.base_dir), 1.0)
    reqs = shared_stream(sc, model)        # the same workload for every config: generated (a trace read) once
    spec, _ = engine_defaults(sc.topologies[name], reqs, model)     # as simulated (engine prefix caching)
    topo = build(name, spec, env, ctx, Sink(env))   # raises if weights do not fit, bad tp...
    gpus = sum(p.gpus for p in topo.pools)
    usd = sum(p.gpus * p.price_per_gpu_hour_usd for p in topo.pools)
    from .metrics import expected_error
    cfg = Config(name, t, gpus, usd, expected_error=expected_error(topo))
    try:
        cfg.margin = error_margin(plan.spec.goodput.error_margin, cfg.expected_error, topo.pools[0].name,
                                  topo.pools[-1].name)
    except ConfigError as exc:      # no measured band: excluded once the budget has had its say (_enumerate)
        cfg.margin_error = str(exc)
    cfg.slo = judged_slo(sc.slo, cfg.margin)
    from .validate import margin_factors
    try:
        f = margin_factors(cfg.expected_error, topo.pools[0].name, topo.pools[-1].name, "p90")
        cfg.p90_factors = (f["ttft_factor"], f["tpot_factor"])
    except ConfigError:
        cfg.p90_factors = None
    prompt = np.array([r.prompt_tokens for r in reqs], float)
    # a pool that caches prefixes computes only what no earlier request computed: the bounds below take every
    # prompt at its ideal hit (an infinite cache), so they stay optimistic (plans must not prune a config that
    # caching makes feasible)
    cached = ideal_cached_tokens(reqs) if topo.pools[0].spec.prefix_on else np.zeros(len(reqs))
    out = np.array([r.output_tokens for r in reqs], float)
    p_mean, d_mean = float((prompt - cached).mean()), float(np.maximum(out - 1, 0).mean())

    def prefill_s_per_token(pool) -> float:
        return prefill_bound_s_per_token(pool.cost, pool.spec, int(prompt.max()))

    def tokens_per_step(pool) -> int:
        """Most tokens a decode step emits per request: k + 1 with speculative decoding (a verify step
        costs at least a plain decode step), so the bounds below stay optimistic."""
        sd = getattr(pool, "spec_dec", None)
        return 1 if sd is None else sd.k + 1

    def decode_s_per_token(pool) -> float:
        """Least time per output token: the largest batch its KV cache and max_running allow."""
        cm, spec, kv = pool.cost, pool.spec, pool.instances[0].kv
        per_req_blocks = kv.blocks_for(int(p_mean) + 1)
        b = max(1, min(spec.max_running, kv.total_blocks // max(1, per_req_blocks)))
        return cm.step(b, 0.0, 0, b, b).time_s / b / tokens_per_step(pool)

    if topo.kind == "colocated":
        p = topo.pools[0]
        if p.spec.scheduler_name in ("chunked", "inflight"):
            # decodes ride in prefill steps and share their weight reads: every token costs at least
            # the cheapest per-token step, so bound the sum of both by that
            per_req = (p_mean + d_mean) * min(prefill_s_per_token(p), decode_s_per_token(p))
        else:       # fcfs: a step holds prefills or decodes, never both
            per_req = p_mean * prefill_s_per_token(p) + d_mean * decode_s_per_token(p)
        cfg.bound_rate = len(p.instances) / per_req if per_req > 0 else math.inf
    else:
        pp, dp = topo.prefill, topo.decode
        pre = p_mean * prefill_s_per_token(pp)
        dec = d_mean * decode_s_per_token(dp)
        cfg.bound_rate = min(len(pp.instances) / pre if pre > 0 else math.inf,
                             len(dp.instances) / dec if dec > 0 else math.inf)
    # SLO bounds that no rate can fix: a lone request's prefill / decode step already too slow
    slo, need = cfg.slo, cfg.slo.attainment_target          # the bounds the config is judged at
    first = topo.pools[0].cost
    last = topo.pools[-1].cost
    if getattr(first, "window", None) is None:
        # the uncached suffix n over the whole context pt (prefix_summary's pricing; n = pt without a cache)
        lone_ttft = np.array([first.step(int(pt - h), (pt - h) * (h + (pt - h) / 2.0), int(pt), 1, 1).time_s
                              for pt, h in zip(prompt[:400], cached[:400])])
    else:       # sliding-window layers: prefill_time adds their aggregates
        lone_ttft = np.array([first.prefill_time(int(pt)) for pt in prompt[:400]])
    lone_ttft = lone_ttft + topo.frontend_s      # the entry engine's front end (engines.frontend_latency_s), if any
    lone_tpot = np.array([last.decode_time(1, int(pt)) for pt in prompt[:400]]) / tokens_per_step(topo.pools[-1])
    # requests with a TPOT: more than one token reaches the client (behind a PD proxy that streams from the decode
    # instance the prefill's token is not seen: a 2-token reply has none, metrics.slo_samples)
    proxy = topo.kind == "disaggregated" and sc.client.ttft_at == "first_decode_token"
    multi = out[:400] > (2 if proxy else 1)
    ttft_in = lone_ttft <= slo.ttft_s
    tpot_in = lone_tpot <= slo.tpot_s
    if slo.mode == "percentile":
        # each percentile on its own sample (metrics.slo_samples): p% of the requests within the bound at the
        # least, while no request beats its lone latency
        share_t = float(ttft_in.mean())
        share_p = float(tpot_in[multi].mean()) if multi.any() else 1.0
        which = []
        if share_t < slo.ttft_percentile / 100:
            which.append(f"TTFT: a lone prefill is within {slo.ttft_s:.4g} s for only {share_t:.1%} of requests "
                         f"(p{slo.ttft_percentile:g} needs {slo.ttft_percentile:g}%)")
        if share_p < slo.tpot_percentile / 100:
            which.append(f"TPOT: a lone decode step is within {slo.tpot_s:.4g} s for only {share_p:.1%} of requests "
                         f"with a TPOT (p{slo.tpot_percentile:g} needs {slo.tpot_percentile:g}%)")
        cfg.infeasible = "; ".join(which)
        return cfg
    ok = ttft_in & (~multi | tpot_in)
    if ok.mean() < need:
        which = []
        if ttft_in.mean() < need:
            which.append(f"TTFT: a lone prefill exceeds {slo.ttft_s:.4g} s for {(~ttft_in).mean():.0%}")
        if multi.any() and tpot_in[multi].mean() < need:
            which.append(f"TPOT: a lone decode step exceeds {slo.tpot_s:.4g} s for {(~tpot_in[multi]).mean():.0%}"
                         + ("" if multi.all() else " of requests with a TPOT"))
        cfg.infeasible = "; ".join(which) or f"only {ok.mean():.0%} of requests can meet the SLO even alone"
    return cfg


# --- one simulation (a task: picklable, runs in any worker) ----------------------------
T975_19 = 2.093        # Student t, 97.5% quantile, 19 degrees of freedom (20 batch means)
CI_BATCHES = 20
# early stopping: how often (x the TTFT bound) a run looks for requests already past their TTFT deadline
SWEEP_FRACTION = 0.25


def _passes_needed(n: int, target: float) -> int:
    """Least k with k / n >= target, by the same float comparison the search makes."""
    k = max(0, min(n, math.ceil(target * n)))
    while k > 0 and (k - 1) / n >= target:
        k -= 1
    while k < n and k / n < target:
        k += 1
    return k


def batch_means_ci(ok: np.ndarray, batches: int = CI_BATCHES) -> tuple[float, float] | None:
    """95% interval of the attainment from ``batches`` contiguous batch means of the judged
    requests in arrival order (batches long enough to be nearly independent); None if too few."""
    k = len(ok) // batches
    if k < 2:
        return None
    means = ok[:k * batches].reshape(batches, k).mean(axis=1)
    half = T975_19 * float(means.std(ddof=1)) / math.sqrt(batches)
    mid = float(ok.mean())
    return (max(0.0, mid - half), min(1.0, mid + half))


class _JudgeSink:
    """The topology's sink for one plan simulation: counts judged requests (those after the warm-up)
    that meet / miss the SLO as they settle, and ends the run once the verdict is certain."""

    def __init__(self, env, expected: int, first_judged: int, slo, early: str | None,
                 disaggregated: bool = False, client=None):
        self.env, self.expected, self.first = env, expected, first_judged
        # the client's view, as metrics.requests_frame takes it: behind a PD proxy the first token seen
        # is the decode instance's first (client.ttft_at), and a network RTT is added to TTFT
        self.decode_first = disaggregated and (client is None or client.ttft_at == "first_decode_token")
        self.rtt = client.network_rtt_s if client is not None else 0.0
        self.done = 0
        self.all_done = env.event()
        self.waiters: dict = {}
        self.ttft_s, self.tpot_s = slo.ttft_s, slo.tpot_s
        self.judged = expected - first_judged
        self.need = _passes_needed(self.judged, slo.attainment_target)
        self.early = early                       # None, "fail" or "both"
        self.ok = self.miss = self.ttft_miss = self.tpot_miss = 0
        self.decided: str | None = None
        self.premissed: dict = {}                # judged requests counted as misses before they settled:
        self.swept = first_judged                # id -> "ttft" | "tpot"; requests before swept: TTFT looked at
        self.decoding: list = []                 # heap of (TPOT deadline, id, first token, tokens streamed)
        self.swept_misses = 0                    # misses the sweep counted before the request settled

    def finished(self, req, *_) -> None:
        self.done += 1
        if req.id >= self.first:
            fin = req.status == FINISHED
            first, streamed = req.first_token_s, req.output_tokens
            if self.decode_first and req.decode_first_s == req.decode_first_s:     # not NaN
                first, streamed = req.decode_first_s, req.output_tokens - 1
            ttft_ok = fin and first - req.arrival_s + self.rtt <= self.ttft_s
            tpot_ok = fin and (streamed <= 1 or (req.finish_s - first) / (streamed - 1) <= self.tpot_s)
            pre = self.premissed.pop(req.id, None) if self.premissed else None
            if pre is None:
                self.ttft_miss += not ttft_ok
                self.tpot_miss += not tpot_ok
                if ttft_ok and tpot_ok:
                    self.ok += 1
                else:
                    self.miss += 1
            elif pre == "ttft":                  # its miss was counted when its TTFT deadline passed
                assert not ttft_ok, (req.id, first, req.arrival_s)
                self.tpot_miss += not tpot_ok
            else:                                # ... or when its TPOT could no longer meet the bound
                assert ttft_ok and not tpot_ok, (req.id, first, req.finish_s)
            self._decide()
        if not self.all_done.triggered and (self.done == self.expected or self.decided):
            self.all_done.succeed()

    def _decide(self) -> None:
        if self.early and self.decided is None:
            if self.miss > self.judged - self.need:          # can no longer reach the target
                self.decided = "fail"
            elif self.early == "both" and self.ok >= self.need:   # can no longer miss it
                self.decided = "pass"

    def _premiss(self, rid: int, bound: str) -> None:
        """Request ``rid`` certainly misses ``bound`` ("ttft" or "tpot"): one miss now, none when it settles."""
        self.premissed[rid] = bound
        self.miss += 1
        if bound == "ttft":
            self.ttft_miss += 1
        else:
            self.tpot_miss += 1
        self.swept_misses += 1

    def sweep(self, topo, stream: list, every_s: float):
        """A process (early stopping only): every ``every_s`` it counts as misses, before they settle, the
        judged requests whose miss is already certain, which in an overloaded run can be long before they
        finish:

        - TTFT: the deadline has passed (``now - arrival + rtt > ttft_s``, the judge's expression) without a
          first token (the client's view): it comes at ``now`` or later, so TTFT misses whatever happens next;
          or the first token came late;
        - TPOT: the first token came in time but ``(now - first) / (streamed - 1) > tpot_s``: the request
          finishes at ``now`` or later, so its TPOT misses too.

        Windows are synced before a first decode token is read (steps ending before ``now`` are applied); a
        step ending at ``now`` only ends later in the judge's favour.  Requests arrive in ``stream`` order
        (ids = indices, open loop)."""
        env, n, settled = self.env, len(stream), (FINISHED, REJECTED, ABANDONED)
        ttft_s, tpot_s, rtt, heap = self.ttft_s, self.tpot_s, self.rtt, self.decoding
        while self.decided is None and (self.swept < n or heap):
            if env.peek() == math.inf:
                return              # nothing else will ever happen (a deadlock): let the run end and report it
            yield env.timeout(every_s)
            now = env.now
            synced = set()
            while self.swept < n:
                r = stream[self.swept]
                if not now - r.arrival_s + rtt > ttft_s:
                    break                       # this one's deadline (and every later arrival's) is ahead
                self.swept += 1
                if r.status in settled:
                    continue                    # judged by finished()
                streamed = r.output_tokens
                if self.decode_first and streamed > 1:
                    first, streamed = r.decode_first_s, streamed - 1   # (a one-token reply: its prefill's)
                    if first != first and r.decode_instance and r.decode_instance not in synced:
                        synced.add(r.decode_instance)
                        topo.by_name[r.decode_instance].sync()     # its first decode step may be in a window
                        first = r.decode_first_s
                else:
                    first = r.first_token_s
                if first != first or not first - r.arrival_s + rtt <= ttft_s:
                    self._premiss(r.id, "ttft")
                elif streamed > 1:
                    heapq.heappush(heap, (first + tpot_s * (streamed - 1), r.id, first, streamed))
            later = []
            while heap and heap[0][0] < now:
                item = heapq.heappop(heap)
                _, rid, first, streamed = item
                r = stream[rid]
                if r.status in settled:
                    continue
                if (now - first) / (streamed - 1) > tpot_s:
                    self._premiss(rid, "tpot")
                else:                           # its deadline rounded below now: look again next time
                    later.append(item)
            for item in later:
                heapq.heappush(heap, item)
            self._decide()
            if self.decided and not self.all_done.triggered:
                self.all_done.succeed()

    def rejected(self, req, reason: str) -> None:
        req.status, req.reject_reason, req.finish_s = REJECTED, reason, self.env.now
        self.finished(req)


def evaluate(task: dict) -> dict:
    """Simulate one scenario dict at one seed; SLO attainment over the requests after the warm-up
    (with its batch-means interval) and latency percentiles.  ``task['early']``: "both" ends the run
    once pass or fail is certain, "fail" only once fail is; counts are then bounds (``early`` says which)."""
    from types import SimpleNamespace

    import simpy

    from . import metrics
    from .simulation import (Context, _open_loop, check_conservation, default_bin_s, engine_defaults, resolve_model,
                             shared_stream)
    from .topology import build
    sc = parse(task["scenario"], task.get("file", "plan"), base_dir=task["base_dir"])
    model = resolve_model(sc)
    # request ids are their indices, in arrival order; configs at the same rate and seed share the stream
    stream = shared_stream(sc, model)
    (name, spec), = sc.topologies.items()
    first = min(int(len(stream) * task.get("warmup_fraction", 0.0)), len(stream) - 1)
    env = simpy.Environment()
    # early stopping counts requests within both bounds: that is the attainment rule; a percentile-mode
    # verdict is taken on the whole run
    early = task.get("early") if sc.slo.mode == "attainment" else None
    sink = _JudgeSink(env, len(stream), first, sc.slo, early, spec.kind == "disaggregated", sc.client)
    spec, _ = engine_defaults(spec, stream, model)        # as `pdsim run` simulates it (engine prefix caching)
    topo = build(name, spec, env, Context(model, sc.weight_dtype, sc.kv_dtype, Path(sc.base_dir),
                                          default_bin_s(sc, stream), seed=sc.seed), sink)
    topo.sink = sink
    topo.client_view(sc.client, sc.workload.timeout_s)
    env.process(_open_loop(env, topo, stream, model, sc.workload.timeout_s))
    if early:
        env.process(sink.sweep(topo, stream, SWEEP_FRACTION * sc.slo.ttft_s))
    try:
        env.run(until=sink.all_done)
    except RuntimeError as exc:     # the queue ran dry first: a deadlock, reported by check_conservation
        if "until" not in str(exc):
            raise
    for inst in topo.instances:
        inst.sync()
    if sink.decided is None:
        check_conservation(name, topo, stream, False)
    df = metrics.requests_frame([SimpleNamespace(name=name, requests=stream, topology=topo)], sc.client)
    settled_all = int(df.status.isin([FINISHED, REJECTED, ABANDONED]).sum())   # warm-up included
    df = df[df.request_id >= first]
    slo = sc.slo
    settled = df.status.isin([FINISHED, REJECTED, ABANDONED])
    fin = df[df.status == FINISHED]
    ttft_ok = (df.status == FINISHED) & (df.ttft_s <= slo.ttft_s)
    tpot_ok = (df.status == FINISHED) & (df.tpot_s.isna() | (df.tpot_s <= slo.tpot_s))

    # percentiles as the verdict takes them (metrics.slo_samples, nearest rank): a request that never got a
    # first token (rejected, abandoned) counts as +inf, one that did not finish as an infinite TPOT; of the
    # settled requests (a run stopped at a certain pass reports what had settled)
    ttft_s, tpot_s = metrics.slo_samples(df[settled])
    n = len(df)
    out = {"n": n, "ok": int((ttft_ok & tpot_ok).sum()), "ttft_ok": int(ttft_ok.sum()),
           "tpot_ok": int(tpot_ok.sum()), "finished": len(fin), "early": sink.decided,
           "settled": settled_all, "total": len(stream), "ci": None, "stopped_s": env.now if sink.decided else None,
           "ttft_p": metrics.nearest_rank(ttft_s, slo.ttft_percentile),
           "tpot_p": metrics.nearest_rank(tpot_s, slo.tpot_percentile)}
    # the verdict by the run's own SLO rule (metrics.slo_verdict: attainment or percentile mode, as
    # `pdsim run` judges); a run stopped early was stopped because that verdict was certain
    out["slo_met"] = sink.decided == "pass" if sink.decided else metrics.slo_verdict(df, slo)["met"]
    if sink.decided == "fail":       # upper bounds: every request not yet settled might still pass
        out.update(ok=n - sink.miss, ttft_ok=n - sink.ttft_miss, tpot_ok=n - sink.tpot_miss)
        # percentiles so far: of every judged request that had arrived, its latency where known, else the
        # least it can still be (TTFT: now - arrival + rtt without a first token; TPOT: (now - first) /
        # (streamed - 1) while it decodes): lower bounds of what those requests will show
        now, rtt = env.now, sc.client.network_rtt_s
        open_ = (~settled & (df.arrival_s <= now)).to_numpy()
        out_tok = df.output_tokens.to_numpy()
        k0 = (out_tok > 1) & sink.decode_first          # behind a PD proxy the client's first token is the decode
        streamed = out_tok - k0                         # instance's: tokens the client receives
        first = df.first_token_s.to_numpy(float)        # (the prefill's token until there is one)
        if sink.decode_first:
            dfs = np.array([stream[i].decode_first_s for i in df.request_id.to_numpy()], float)
            first = np.where(k0, dfs, first)
        has_first = ~np.isnan(first)
        arrival = df.arrival_s.to_numpy(float)
        done = settled.to_numpy()
        finished = (df.status == FINISHED).to_numpy()
        ttft = np.where(open_, np.where(has_first, first - arrival, now - arrival) + rtt, df.ttft_s.to_numpy(float))
        ttft = np.where(done & np.isnan(ttft), np.inf, ttft)          # rejected / abandoned: never served
        decoding = open_ & (streamed > 1)
        tpot_done = df.tpot_s.to_numpy(float)
        with np.errstate(invalid="ignore", divide="ignore"):     # no first token yet: its TPOT can still be ~0
            tpot = np.where(decoding, np.where(has_first, (now - first) / np.maximum(streamed - 1, 1), 0.0),
                            np.where(finished, tpot_done, np.inf))
        # the verdict's samples (metrics.slo_samples) of the requests that had arrived, each at the least it can
        # still be: nearest rank of lower bounds is a lower bound of the run's own
        keep_tpot = (out_tok > 1) & (decoding | (done & ~(finished & np.isnan(tpot_done))))
        out.update(ttft_p=metrics.nearest_rank(ttft[done | open_], slo.ttft_percentile),
                   tpot_p=metrics.nearest_rank(tpot[keep_tpot], slo.tpot_percentile),
                   p_so_far=True)
    elif sink.decided is None:
        ci = batch_means_ci((ttft_ok & tpot_ok).to_numpy(float))
        out["ci"] = list(ci) if ci else None
        f = task.get("error_factors")
        if f:       # the same requests judged at the bounds / pdsim's p90 measured/simulated factors
            at = slo.tightened(*f)
            out["ok_at_error"] = int(((df.status == FINISHED) & (df.ttft_s <= at.ttft_s)
                                      & (df.tpot_s.isna() | (df.tpot_s <= at.tpot_s))).sum())
    return out


_FILE_HASHES: dict = {}
_CODE_HASH: list = []


def _file_hash(path: Path) -> str:
    """sha256 of a referenced file (trace, device profile), memoised for one plan run by path, size,
    mtime and ctime (run_plan clears the memo, so an edited file is re-read by the next plan)."""
    try:
        st = path.stat()
    except OSError:
        return "missing"
    key = (str(path), st.st_size, st.st_mtime_ns, st.st_ctime_ns)
    if key not in _FILE_HASHES:
        _FILE_HASHES[key] = hashlib.sha256(path.read_bytes()).hexdigest()
    return _FILE_HASHES[key]


def code_hash() -> str:
    """sha256 of pdsim's own source and package data (built-in device and model tables): a result
    cached by another version of the code is not reused."""
    if not _CODE_HASH:
        root = Path(__file__).resolve().parent
        h = hashlib.sha256()
        for p in sorted(root.rglob("*")):
            if p.is_file() and "__pycache__" not in p.parts and p.suffix not in (".pyc", ".pyo"):
                h.update(str(p.relative_to(root)).encode() + b"\0" + p.read_bytes() + b"\0")
        _CODE_HASH.append(h.hexdigest())
    return _CODE_HASH[0]


def _referenced_files(sc: dict, base: Path) -> list[Path]:
    w = sc.get("workload", {})
    paths = [w.get("trace", {}).get("path")] + [w.get(k, {}).get("path") if isinstance(w.get(k), dict) else None
                                                 for k in ("prompt_tokens", "output_tokens")]
    for t in sc.get("topologies", {}).values():
        for pool in (t, t.get("prefill") or {}, t.get("decode") or {}):
            dev = pool.get("device", "")
            if isinstance(dev, str) and (dev.endswith((".yaml", ".yml", ".json")) or "/" in dev):
                paths.append(dev)
    return [base / p for p in paths if p]


JUDGE_KEYS = ("warmup_fraction", "early", "error_factors")


def task_key(task: dict) -> str:
    """Hash of what decides the result: the scenario, how it is judged, the contents of the files it
    reads, pdsim's version and a hash of pdsim's source and package data."""
    base = Path(task["base_dir"])
    files = {str(p): _file_hash(p) for p in _referenced_files(task["scenario"], base)}
    blob = json.dumps({"v": __version__, "code": code_hash(), "s": task["scenario"], "b": str(base), "f": files,
                       "j": {k: task.get(k) for k in JUDGE_KEYS}}, sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()[:24]


# --- executors ---------------------------------------------------------------------------
class LocalExecutor:
    """A process pool over this machine's cores (inline when jobs == 1)."""
    name = "local"

    def __init__(self, jobs: int | None = None):
        self.jobs = jobs or os.cpu_count() or 1
        self._pool = None

    def map(self, fn, tasks: list, on_done=None) -> list:
        """``fn`` over ``tasks``, results in order; ``on_done()`` after each one finishes (progress)."""
        tick = on_done or (lambda: None)
        if self.jobs == 1 or len(tasks) == 1:
            out = []
            for t in tasks:
                out.append(fn(t))
                tick()
            return out
        if self._pool is None:
            from concurrent.futures import ProcessPoolExecutor
            self._pool = ProcessPoolExecutor(max_workers=self.jobs)
        from concurrent.futures import as_completed
        futures = [self._pool.submit(fn, t) for t in tasks]
        try:
            for _ in as_completed(futures):
                tick()
            return [f.result() for f in futures]
        finally:
            for f in futures:
                f.cancel()

    def close(self):
        if self._pool is not None:
            self._pool.shutdown()


class DaskExecutor:
    """Dask distributed: ``scheduler`` is an address (tcp://HOST:8786) or a ``distributed.Client``.

    While waiting for results it checks every ``poll_s`` that the scheduler still has workers; with
    none for ``lost_workers_s`` (all killed or gone) the plan ends with an error naming the scheduler
    instead of waiting forever, as it does when the scheduler itself cannot be reached."""
    name = "dask"

    def __init__(self, scheduler, lost_workers_s: float = 60.0, poll_s: float = 1.0):
        try:
            from distributed import Client
        except ImportError:
            raise ConfigError("the dask executor needs 'distributed': pip install 'pdsim[dask]'",
                              key="--executor", value="dask") from None
        self.lost_workers_s, self.poll_s = lost_workers_s, poll_s
        if isinstance(scheduler, Client):
            self.client, self._own = scheduler, False
            self.address = getattr(scheduler.scheduler, "address", None) or "the Dask scheduler"
        else:
            if not scheduler:
                raise ConfigError("--executor dask needs --scheduler tcp://HOST:8786", key="--scheduler")
            self.address = scheduler
            try:
                self.client, self._own = Client(scheduler, timeout=20), True
            except (OSError, TimeoutError) as exc:
                raise ConfigError(f"cannot reach the Dask scheduler: {exc}", key="--scheduler",
                                  value=scheduler) from None

    def map(self, fn, tasks: list, on_done=None) -> list:
        import asyncio
        from concurrent.futures import CancelledError

        from distributed import KilledWorker, wait
        # on Python 3.10 asyncio's TimeoutError is not the builtin one; distributed raises either
        timeouts = (TimeoutError, asyncio.TimeoutError)
        futures = self.client.map(fn, tasks, pure=False)
        alone_since = None
        seen = 0

        def ticks():
            nonlocal seen
            if on_done is not None:
                done = sum(1 for f in futures if f.done())
                for _ in range(done - seen):
                    on_done()
                seen = max(seen, done)

        def check_workers():
            nonlocal alone_since
            try:
                workers = len(self.client.nthreads())
            except (OSError, *timeouts) as exc:
                raise PdsimError(f"lost the Dask scheduler {self.address}: {exc}; the plan stopped") from None
            now = time.monotonic()
            if workers:
                alone_since = None
            elif alone_since is None:
                alone_since = now
            elif now - alone_since >= self.lost_workers_s:
                # results not yet received (a task done on a worker that left is lost with it); the runner
                # caches a round's results only once the whole round is back, so this round runs again
                raise PdsimError(f"the Dask scheduler {self.address} has had no workers for "
                                 f"{self.lost_workers_s:g} s ({len(todo)} of {len(futures)} results not received); "
                                 "the plan stopped: start workers and run it again (earlier rounds' results are "
                                 "cached; this round's simulations run again)")
        results, todo = {}, list(range(len(futures)))
        try:
            # Fetch results one by one with a timeout, never with one blocking gather: a result held only by
            # a worker that dies after its task finished is recomputed, and with no worker left a plain
            # gather waits forever (seen in CI). Every wait is bounded and followed by the workers check.
            while todo:
                try:
                    wait([futures[i] for i in todo], timeout=self.poll_s)
                except timeouts:
                    ticks()
                    check_workers()
                    continue
                ticks()
                while todo:
                    f = futures[todo[0]]
                    if f.status == "error":
                        f.result()          # the task's own exception, even a TimeoutError: never 'not ready'
                    try:
                        results[todo[0]] = f.result(timeout=self.poll_s)
                    except timeouts:
                        if f.status == "error":
                            raise
                        break
                    todo.pop(0)
                if todo:
                    check_workers()
            return [results[i] for i in range(len(futures))]
        except KilledWorker as exc:
            raise PdsimError(f"a simulation killed its Dask workers on {self.address}: {exc}") from None
        except CancelledError as exc:
            # distributed's text lists every cancelled key; one line is enough: how many, and the first reason
            first = str(exc).strip().splitlines()[0][:200] if str(exc).strip() else "cancelled"
            left = sum(1 for f in futures if not f.done() or f.status == "cancelled")
            raise PdsimError(f"lost the Dask scheduler {self.address} ({left} of {len(futures)} simulations "
                             f"cancelled: {first}); the plan stopped") from None
        finally:
            pending = [f for f in futures if not f.done()]
            if pending:
                self.client.cancel(pending)

    def close(self):
        if self._own:
            self.client.close()


# --- the search ----------------------------------------------------------------------------
GUESS_STEP = 1.05    # a guided search's first step, at least: the spread of the sibling guesses on the chat plan


@dataclass
class Search:
    """Goodput bracketing for one config: lo passes (or 0), hi fails (or the bound).

    With a ``guess`` (a sibling's goodput scaled by size, :func:`_guide`) the search probes the guess,
    then steps out from it in the direction its verdict points, by one tolerance first (at least
    GUESS_STEP) and doubling the exponent each time (x f, x f^2, x f^4 ..., f = 1 / (1 - 0.999 tol); never
    wider than x 2 up or / 4 down), until a verdict flips or the next step would leave the bracket; then it
    halves the bracket geometrically (its ends f^(2^j) apart: j probes).  The bracket rule is the same: a
    pass at lo and a fail at hi within tol of hi."""
    cfg: Config
    tol: float
    lo: float = 0.0
    hi: float = math.inf
    points: dict = field(default_factory=dict)     # rate -> pooled result
    done: bool = False
    note: str = ""
    guess: float | None = None
    waiting: bool = False                          # for a smaller sibling's search (_guide)
    probes: int = 0                                # rates simulated (the target-rate pass not counted)
    stopped: bool = False                          # max_rounds probes made before it was done
    verdicts: dict = field(default_factory=dict)   # rate -> passed
    _walk: list = field(default_factory=list)      # the guided probes, in order
    _split: bool = False                           # the walk has bracketed the goodput: halving

    def next_rate(self) -> float | None:
        if self.done:
            return None
        if self.guess is not None:
            r = self._guided()
            if r is not None:
                return r
        if self.lo == 0.0 and not self.points:
            return self.cfg.bound_rate * 0.5 if math.isfinite(self.cfg.bound_rate) else 1.0
        if math.isinf(self.hi):                      # no failure seen yet: go up
            r = min(self.lo * 2, self.cfg.bound_rate) if math.isfinite(self.cfg.bound_rate) else self.lo * 2
            if r <= self.lo * (1 + self.tol):        # the bound itself passes: goodput is at the bound
                self.done, self.note = True, "reaches the analytic bound"
                return None
            return r
        if self.lo == 0.0:                           # no pass yet: go down
            r = min(self.points) / 4
            # not below a thousandth of the first (highest) rate tried, so r0 ... r0 / 256 are tried (hi follows
            # the lowest failure down: comparing with it never stopped the descent, which ran to max_rounds)
            if r < max(self.points) * 1e-3:
                self.done, self.note = True, "misses the SLO even at a trickle"
                return None
            return r
        if self.hi - self.lo <= self.tol * self.hi:
            self.done = True
            return None
        return 0.5 * (self.lo + self.hi)

    def _guided(self) -> float | None:
        """The next guided probe, or None once the walk is over (``guess`` cleared: the unguided rules)."""
        bound = self.cfg.bound_rate
        if not self._walk:
            g = min(self.guess, bound)
            if self.lo < g < self.hi:
                self._walk.append(g)
                return g
            self.guess = None                        # the guess tells nothing the bracket does not
            return None
        if not self._split:
            last = self._walk[-1]
            up = self.verdicts[last]
            if len(self._walk) == 1 or up == self.verdicts[self._walk[-2]]:
                # a pass at x and a fail at x * f close the bracket (hi - lo <= tol * hi, with room for rounding);
                # the first step is at least GUESS_STEP, the spread of the guesses, and a step is never wider
                # than the unguided search's (x 2 up, / 4 down)
                first = max(1.0 / (1.0 - 0.999 * self.tol), GUESS_STEP)
                cap = 2.0 if up else 4.0
                k = len(self._walk) - 1          # (in logs: first^(2^k) overflows a float long before k = 60)
                step = cap if k >= 60 else math.exp(min(math.log(first) * 2 ** k, math.log(cap)))
                if up:
                    r = min(last * step, bound)
                    if r <= last:                    # at the bound: as without a guess ("reaches the analytic bound")
                        self.guess = None
                        return None
                    if r < self.hi:
                        self._walk.append(r)
                        return r
                else:
                    r = last / step
                    if r < max(self.points) * 1e-3:  # at a trickle: as without a guess
                        self.guess = None
                        return None
                    if r > self.lo:
                        self._walk.append(r)
                        return r
            # the verdict flipped, or the next step would leave the bracket: halve it geometrically (a bracket
            # f^(2^j) wide takes j probes) until it is within the tolerance
            self._split = True
        if self.lo <= 0.0 or math.isinf(self.hi):
            self.guess = None
            return None
        if self.hi - self.lo <= self.tol * self.hi:
            self.done = True
            return None
        r = math.sqrt(self.lo * self.hi)
        self._walk.append(r)
        return r

    def update(self, rate: float, res: dict, target: float) -> None:
        self.points[rate] = res
        ok = bool(res.get("passes", res["pass_att"] >= target))
        self.verdicts[rate] = ok
        if ok:
            self.lo = max(self.lo, rate)
        else:
            self.hi = min(self.hi, rate)

    @property
    def goodput(self) -> float:
        return self.lo

    def rounds_left(self) -> int:
        """A guess at the rounds this search still needs (bracketing, then bisection)."""
        if self.done:
            return 0
        if self.waiting:
            return 1 + 2
        if self.guess is not None:
            return 2
        if math.isinf(self.hi) or self.lo == 0.0:
            return 1 + max(1, math.ceil(math.log2(1 / self.tol)))
        return max(1, math.ceil(math.log2(max((self.hi - self.lo) / (self.tol * self.hi), 1.0))) + 1)


def _family(cfg: Config) -> tuple[str, int] | None:
    """(family, size): configs whose topologies differ only in replicas (colocated) or in scale at one
    prefill:decode instance ratio (disaggregated) share a family; size is replicas, or the instance counts'
    common divisor.  None: a kind with no such scale."""
    t = cfg.topology
    if t.get("kind") == "colocated":
        rest = {k: v for k, v in t.items() if k != "replicas"}
        return json.dumps(rest, sort_keys=True, default=str), int(t.get("replicas", 1))
    if t.get("kind") == "disaggregated" and isinstance(t.get("prefill"), dict) and isinstance(t.get("decode"), dict):
        p, d = int(t["prefill"].get("instances", 1)), int(t["decode"].get("instances", 1))
        g = math.gcd(p, d)
        rest = dict(t, prefill={k: v for k, v in t["prefill"].items() if k != "instances"},
                    decode={k: v for k, v in t["decode"].items() if k != "instances"})
        return json.dumps([rest, p // g, d // g], sort_keys=True, default=str), g
    return None


def _guide(searches: dict, max_probes: int | None = None) -> int:
    """Hold each config's search until the smallest of its family (:func:`_family`) has finished, then start
    it from that one's goodput (the geometric middle of its final bracket) x the size ratio (``Search.guess``);
    returns how many searches were given a guess.
    A reference that found no goodput, or was dominated, gives none (its lo says nothing of the capacity); one
    stopped at ``max_probes`` before it was done lets its family go unguided."""
    fams: dict = {}
    for s in searches.values():
        key = _family(s.cfg)
        if key is not None:
            fams.setdefault(key[0], []).append((key[1], s))
    guided = 0
    for members in fams.values():
        members.sort(key=lambda m: (m[0], m[1].cfg.name))
        n0, ref = members[0]
        for n, s in members[1:]:
            if s.done or n == n0:
                s.waiting = False
                continue
            if not ref.done and not ref.stopped and (max_probes is None or ref.probes < max_probes):
                s.waiting = True
                continue
            if s.waiting:
                s.waiting = False
                if ref.done and ref.lo > 0 and not ref.note.startswith("dominated"):
                    # the middle of the reference's bracket (its goodput is in [lo, hi)), scaled by size
                    mid = math.sqrt(ref.lo * ref.hi) if math.isfinite(ref.hi) else ref.lo
                    s.guess = mid * n / n0
                    guided += 1
    return guided


def _seed_passes(r: dict, target: float) -> bool:
    """One seed's verdict: its SLO rule's (``slo_met``, metrics.slo_verdict), else attainment >= target."""
    met = r.get("slo_met")
    return bool(met) if met is not None else r["ok"] / r["n"] >= target


def _pooled(results: list[dict]) -> dict:
    out = {k: sum(r[k] for r in results) for k in ("n", "ok", "ttft_ok", "tpot_ok", "finished")}
    out["min_att"] = min(r["ok"] / r["n"] for r in results)   # a rate passes only if it passes on every seed
    out["all_met"] = all(r["slo_met"] for r in results) if all("slo_met" in r for r in results) else None
    for k in ("ttft_p", "tpot_p"):   # worst seed: a percentile bound must hold on each
        vals = [r[k] for r in results if r[k] is not None]
        out[k] = max(vals) if vals else None
    out["early"] = next((r["early"] for r in results if r.get("early")), None)
    out["p_so_far"] = any(r.get("p_so_far") for r in results)     # bounds from a run stopped early (_misses)
    return out


CONFIRM_SEED_OFFSET = 1000      # long runs use seeds the search never used


class _Runner:
    """Runs tasks through the executor with the on-disk cache; counts simulations and the ones each
    mechanism saved."""

    def __init__(self, plan: Plan, executor, cache_dir: Path | None, progress: bool):
        self.plan, self.ex, self.cache_dir, self.progress = plan, executor, cache_dir, progress
        self.simulated = self.cached = 0
        self.skipped = {"worst_seed": 0, "early_stop_pass": 0, "early_stop_fail": 0}
        self.requests_total = self.requests_settled = 0      # over simulations run (not cached)
        self.memo: dict = {}          # long runs run ahead of their turn, by task, until confirm asks for them
        self.reused = 0
        self.t0 = time.perf_counter()
        if cache_dir:
            cache_dir.mkdir(parents=True, exist_ok=True)
        g = plan.spec.goodput
        self.early = "both" if g.early_stop and g.aggregate == "worst_seed" else None

    def _task(self, cfg: Config, rate: float, seed: int, scale: float = 1.0, early: str | None = None) -> dict:
        sc = _scenario_dict(self.plan, {cfg.name: cfg.topology}, rate, seed, scale)
        if cfg.slo is not None:
            # judged at the config's bounds (goodput.error_margin).  (The scenario's SLO also sizes an `slo`
            # autoscaler: were plans to search autoscaled topologies, judge with cfg.slo apart from it.)
            sc["slo"] = cfg.slo.model_dump()
        return {"scenario": sc,
                "file": self.plan.file, "base_dir": str(Path(self.plan.base_dir).resolve()),
                "warmup_fraction": self.plan.spec.goodput.warmup_fraction, "early": early}

    def run(self, cfg_rates: list[tuple[Config, float]]) -> list[dict]:
        """Pooled results per (config, rate) over the plan's seeds.

        With ``aggregate: worst_seed`` the seeds run one after another and a (config, rate) that
        failed on one seed is not simulated on the next: it has failed already.  Which tasks run
        depends only on results, so every executor runs the same ones.
        """
        g = self.plan.spec.goodput
        worst = g.aggregate == "worst_seed"
        target = self.plan.spec.slo.attainment_target
        per: list[list[dict]] = [[] for _ in cfg_rates]
        live = list(range(len(cfg_rates)))
        for i in range(g.seeds):
            seed = self.plan.spec.seed + i
            tasks = [self._task(*cfg_rates[j], seed, early=self.early) for j in live]
            for j, r in zip(live, self._results(tasks)):
                per[j].append(r)
            if worst:
                before = len(live)
                live = [j for j in live if _seed_passes(per[j][-1], target)]
                self.skipped["worst_seed"] += (before - len(live)) * (g.seeds - 1 - i)
            if not live:
                break
        pooled = [_pooled(rs) for rs in per]
        for p in pooled:
            p["pass_att"] = p["min_att"] if worst else p["ok"] / p["n"]
            # every seed judged by metrics.slo_verdict (the rule of `pdsim run`); percentile mode has no
            # pooled form here, so it is judged seed by seed (worst seed) whatever the aggregate
            if p["all_met"] is not None and (worst or self.plan.spec.slo.mode == "percentile"):
                p["passes"] = p["all_met"]
        return pooled

    def _long_task(self, cfg: Config, rate: float, seed: int, factor: float) -> dict:
        # run to the end (no early stop): a demotion reports a real estimate and its interval
        t = self._task(cfg, rate, seed, scale=factor)
        # (attainment mode: the share at the error is what that mode judges)
        if cfg.p90_factors and cfg.margin is None and self.plan.spec.slo.mode == "attainment":
            t["error_factors"] = list(cfg.p90_factors)
        return t

    def first_long_task(self, cfg: Config, rate: float) -> dict:
        """The first task :meth:`confirm` runs for (cfg, rate): its first seed, at confirm_factor."""
        return self._long_task(cfg, rate, self.plan.spec.seed + CONFIRM_SEED_OFFSET, self.plan.spec.goodput.confirm_factor)

    def confirm(self, cfg_rates: list[tuple[Config, float]], riders: list[tuple[Config, float]] = ()) -> list[dict]:
        """Long runs on fresh seeds: each (config, rate) over confirm_factor x the search window,
        doubled while the batch-means interval is wider than +-ci_halfwidth and still holds the
        target (up to confirm_max_factor).  Passes only if every seed's attainment meets the target.
        ``riders``: (config, rate) whose first long run goes along in the first batch, on workers that batch
        would leave idle; their results are only kept (``memo``) for when confirm is asked for them."""
        g = self.plan.spec.goodput
        target = self.plan.spec.slo.attainment_target
        per: list[list[dict]] = [[] for _ in cfg_rates]
        live = list(range(len(cfg_rates)))
        extra = [self.first_long_task(c, x) for c, x in riders]
        for i in range(g.confirm_seeds):
            seed = self.plan.spec.seed + CONFIRM_SEED_OFFSET + i
            factor = {j: g.confirm_factor for j in live}
            todo = list(live)
            while todo:
                tasks = [self._long_task(*cfg_rates[j], seed, factor[j]) for j in todo]
                again = []
                done = self._results(tasks + extra, ahead=len(extra))
                extra = []
                for j, r in zip(todo, done):
                    ci = r.get("ci")
                    if ci and ci[1] - ci[0] > 2 * g.ci_halfwidth and ci[0] < target <= ci[1] \
                            and factor[j] * 2 <= g.confirm_max_factor:
                        factor[j] *= 2
                        again.append(j)
                    else:
                        per[j].append(dict(r, factor=factor[j], seed=seed))
                todo = again
            live = [j for j in live if _seed_passes(per[j][-1], target)]
        out = []
        for rs in per:
            # the seed the notes describe: the worst attainment, or in percentile mode a seed whose own verdict
            # failed; the percentiles are the worst over the seeds (a percentile bound must hold on each)
            failed = [r for r in rs if r.get("slo_met") is False]
            worst = failed[0] if failed and self.plan.spec.slo.mode == "percentile" else \
                min(rs, key=lambda r: r["ok"] / r["n"])
            worst_p = {k: max((r[k] for r in rs if r[k] is not None), default=None) for k in ("ttft_p", "tpot_p")}
            at_err = [r["ok_at_error"] / r["n"] for r in rs if r.get("ok_at_error") is not None and r["n"]]
            out.append({"passed": all(_seed_passes(r, target) for r in rs), "attainment": worst["ok"] / worst["n"],
                        "attainment_at_p90_error": min(at_err) if at_err else None,
                        "ci": worst["ci"], "early": worst["early"], "requests": sum(r["total"] for r in rs),
                        "factor": max(r["factor"] for r in rs), "seeds": [r["seed"] for r in rs],
                        "ttft_ok": worst["ttft_ok"], "tpot_ok": worst["tpot_ok"], "n": worst["n"],
                        "ok": worst["ok"], **worst_p, "p_so_far": worst.get("p_so_far", False)})
        return out

    def _results(self, tasks: list[dict], ahead: int = 0) -> list[dict]:
        """Each task's result, in the tasks' order: from ``memo`` (a long run run ahead), the disk cache, or the
        executor.  The last ``ahead`` tasks are long runs run ahead of their turn: their results go to ``memo``."""
        results: list[dict | None] = [None] * len(tasks)
        todo = []
        for i, t in enumerate(tasks):
            m = self.memo.get(json.dumps(t, sort_keys=True)) if self.memo else None
            if m is not None:                # run earlier in this plan (a long run that went along ahead)
                results[i] = m
                self.reused += 1
                continue
            hit = self._load(t)
            if hit is not None:
                results[i] = hit
                self.cached += 1
            else:
                todo.append(i)
        if todo:
            from .progress import Bar

            # the longest first (requests in the window), so a round does not end on one worker finishing a long
            # run alone; results come back in the tasks' order whatever order they ran in
            def size(i):
                w = tasks[i]["scenario"]["workload"]
                n = w.get("num_requests")
                rate = w.get("rate") or (w.get("trace") or {}).get("rate_scale") or 1.0
                return float(n) if n is not None else float(w.get("duration_s") or 0) * float(rate)
            todo.sort(key=lambda i: -size(i))
            with Bar(len(todo), "plan", unit="sim", enabled=self.progress) as bar:
                done = self.ex.map(evaluate, [tasks[i] for i in todo], on_done=bar.update)
            for i, r in zip(todo, done):
                results[i] = r
                if i >= len(tasks) - ahead:
                    self.memo[json.dumps(tasks[i], sort_keys=True)] = r
                self._store(tasks[i], r)
                if r.get("early"):
                    self.skipped[f"early_stop_{r['early']}"] += 1
                self.requests_total += r.get("total", 0)
                self.requests_settled += r.get("settled", 0)
            self.simulated += len(todo)
        return results

    def _path(self, t):
        return self.cache_dir / f"{task_key(t)}.json" if self.cache_dir else None

    def _load(self, t):
        p = self._path(t)
        if p is not None and p.is_file():
            try:
                return json.loads(p.read_text())
            except (OSError, ValueError):
                return None
        return None

    def _store(self, t, r):
        p = self._path(t)
        if p is not None:
            p.write_text(json.dumps(r))

    def log(self, msg: str) -> None:
        if self.progress:
            el = time.perf_counter() - self.t0
            print(f"pdsim plan: {msg} [{self.simulated} simulated, {self.cached} cached, {el:.0f} s]",
                  file=sys.stderr, flush=True)


def run_plan(plan: Plan, executor=None, cache_dir: Path | None = None, progress: bool = False) -> dict:
    """Search the plan's space, then confirm the best on long runs; returns the result dict
    (rows ranked best first)."""
    spec = plan.spec
    target_rate, att = spec.target.rate, spec.slo.attainment_target
    _FILE_HASHES.clear()          # files edited since the last plan in this process are re-hashed
    ex = executor or LocalExecutor()
    runner = _Runner(plan, ex, cache_dir, progress)
    rows: dict[str, dict] = {}
    for c in plan.configs:
        rows[c.name] = {"config": c.name, "kind": c.topology["kind"], "gpus": c.gpus, "usd_per_hour": c.usd_per_hour,
                        "bound_rate": c.bound_rate, "status": "", "goodput": None, "bracket": None, "points": {}, "note": "",
                        "topology": c.topology, "expected_error": c.expected_error,
                        "judged_ttft_s": (c.slo or spec.slo).ttft_s, "judged_tpot_s": (c.slo or spec.slo).tpot_s,
                        "error_margin": c.margin}
    live = []
    for c in plan.configs:
        if c.infeasible:
            rows[c.name].update(status="infeasible", goodput=0.0, note=c.infeasible)
        elif target_rate and c.bound_rate < target_rate:
            rows[c.name].update(status="below target (bound)", note=f"analytic bound {c.bound_rate:.3g} req/s "
                                f"< target {target_rate:g}")
        else:
            live.append(c)
    # not simulated: infeasible (a lone request misses the SLO) or, in target mode, below it by the analytic bound
    infeasible = sum(1 for c in plan.configs if c.infeasible)
    pruned_by_bound = len(plan.configs) - len(live) - infeasible
    # target mode: every live config at the target rate first
    if target_rate:
        runner.log(f"{len(live)} configs at the target rate {target_rate:g} req/s ({infeasible} infeasible, "
                   f"{pruned_by_bound} below it by the analytic bound)")
        res = runner.run([(c, target_rate) for c in live])
        passing = []
        for c, r in zip(live, res):
            rows[c.name]["at_target"] = r
            rows[c.name]["points"][target_rate] = r
            if r.get("passes", r["pass_att"] >= att):
                passing.append(c)
            else:
                rows[c.name].update(status="misses SLO at target", note=_misses(r, c.slo or spec.slo))
        live = passing
    searches = {c.name: Search(c, spec.goodput.tolerance) for c in live}
    if target_rate:
        for c in live:
            searches[c.name].update(target_rate, rows[c.name]["at_target"], att)
    rounds = guided = 0
    while True:
        # dominance: skip a config whose bound is below a rate that a config using no more of the
        # objective's resource ($/h, or GPUs for goodput_per_gpu) already passed; only undominated
        # configs dominate, and a search already at its bound is complete, not dominated
        # (a search that made its max_rounds probes is settled first: the unguided rules of its next rate decide
        # whether its bracket closed, as when every search stopped at the same round)
        for s in searches.values():
            if not s.done and not s.stopped and s.probes >= spec.goodput.max_rounds:
                s.stopped = True
                s.next_rate()
        per_gpu = spec.objective == "goodput_per_gpu"
        res_of = (lambda c: c.gpus) if per_gpu else (lambda c: c.usd_per_hour)
        for s in sorted(searches.values(), key=lambda x: (res_of(x.cfg), x.cfg.name)):
            if s.done or s.stopped or s.lo >= s.cfg.bound_rate:
                continue
            dom = next((f for f in searches.values() if f is not s and f.lo > 0 and not f.note.startswith("dominated")
                        and res_of(f.cfg) <= res_of(s.cfg)
                        and (s.cfg.bound_rate < f.lo or (s.cfg.bound_rate <= f.lo and res_of(f.cfg) < res_of(s.cfg)))),
                       None)
            if dom is not None:
                what = "GPUs" if per_gpu else "$/h"
                s.done, s.note = True, f"dominated: bound {s.cfg.bound_rate:.3g} <= {dom.lo:.3g} req/s passed by " \
                                       f"{dom.cfg.name} with no more {what}"
        # each search probes at most max_rounds rates; one held for its family's reference waits unprobed, and is
        # let go in the round its reference finishes (_guide before and after the references ask their next rate)
        rates: dict = {}
        for release in (False, True):
            if spec.goodput.scale_guess:
                guided += _guide(searches, spec.goodput.max_rounds)
            for s in searches.values():
                if not s.waiting and s.probes < spec.goodput.max_rounds and s.cfg.name not in rates:
                    if release and s.done:
                        continue
                    r = s.next_rate()
                    if r is not None:
                        rates[s.cfg.name] = r
        batch = [(s.cfg, rates[n]) for n, s in searches.items() if n in rates]
        if not batch:
            break
        rounds += 1
        for c, _ in batch:
            searches[c.name].probes += 1
        left = sum(1 for s in searches.values() if not s.done)
        # ETA: the open search furthest from its tolerance needs about log2(width / tol) more rounds, each
        # taking what the finished ones took on average (the target-rate pass before them not counted)
        more = max((s.rounds_left() for s in searches.values() if not s.done), default=0)
        now = time.perf_counter()
        if rounds == 1:
            rounds_t0 = now
        eta = f", ETA ~{(now - rounds_t0) / (rounds - 1) * more:.0f} s" if rounds > 1 else ""
        held = sum(1 for s in searches.values() if s.waiting and not s.done)
        runner.log(f"round {rounds}: {len(batch)} configs x up to {spec.goodput.seeds} seeds; {left} searches open"
                   + (f" ({held} held for a smaller sibling)" if held else "") + eta)
        for (c, r), res in zip(batch, runner.run(batch)):
            searches[c.name].update(r, res, att)
    for name, s in searches.items():
        row = rows[name]
        row["points"].update(s.points)
        row["goodput"] = s.goodput
        row["bracket"] = [s.lo, s.hi if math.isfinite(s.hi) else None]   # passes at lo, fails at hi
        dominated = s.note.startswith("dominated")
        row["status"] = row["status"] or ("dominated (not fully searched)" if dominated else "ok")
        row["note"] = s.note if not row["note"] else row["note"]
        if s.goodput == 0 and s.points:      # never passed: say which SLO fails at the lowest rate tried
            r0 = min(s.points)
            row["status"] = "misses SLO at every rate"
            row["note"] = f"at {r0:.3g} req/s: {_misses(s.points[r0], s.cfg.slo or spec.slo)}"
        if not s.done:
            row["note"] = (row["note"] + "; " if row["note"] else "") + "search stopped at max_rounds"
    ahead = _confirm(plan, rows, runner)
    ex_close = getattr(ex, "close", None)
    if executor is None and ex_close:
        ex_close()
    result = _rank(plan, rows, runner)
    result["skipped"] = {"infeasible": infeasible, "pruned_by_bound": pruned_by_bound,
                         "dominated": sum(1 for s in searches.values() if s.note.startswith("dominated")),
                         "guided_by_sibling": guided,
                         **ahead,
                         **runner.skipped, "cached": runner.cached,
                         "requests_not_simulated": runner.requests_total - runner.requests_settled,
                         "requests_total": runner.requests_total}
    return result


MAX_CONFIRM_STEPS = 4      # goodput mode: a goodput that fails its long run is lowered at most this often


def _confirm(plan: Plan, rows: dict, runner: _Runner) -> dict:
    """Re-simulate the best ``confirm_top`` configs on long runs with fresh seeds before any is
    declared.  Target mode: at the target rate; a config that fails is demoted and the next one
    checked.  Goodput mode: at the goodput; one that fails has its goodput lowered by the tolerance
    and is checked again (at most MAX_CONFIRM_STEPS times, then demoted)."""
    g = plan.spec.goodput
    # how many first long runs ran ahead of their turn on idle workers, and how many of those were then used
    counts = {"long_runs_ahead": 0, "long_runs_ahead_used": 0}
    if not g.confirm_top:
        return counts
    cfgs = {c.name: c for c in plan.configs}
    target_rate = plan.spec.target.rate
    for _ in range(len(rows) * (MAX_CONFIRM_STEPS + 1)):
        ranked = _order(plan, rows)
        todo = [r for r in ranked if r["meets"]][:g.confirm_top]
        todo = [r for r in todo if not (r.get("long_run") or {}).get("passed")]
        if not todo:
            return counts
        rates = [target_rate or r["goodput"] for r in todo]
        # a batch of long runs that would leave workers idle takes the next candidates' first long runs along
        # ("ahead", at most confirm_top, none longer than the longest of the batch): a long run is the same
        # whenever it runs (fixed seeds), so the table is the same, only sooner when a candidate above fails; the
        # simulation count depends on the executor's workers
        memo = getattr(runner, "memo", None)
        workers = int(getattr(getattr(runner, "ex", None), "jobs", 1) or 1)
        pairs = [(cfgs[r["config"]], x) for r, x in zip(todo, rates)]
        riders = []
        if memo is not None and workers > 1:
            def size(x):
                return _scenario_dict(plan, {}, x, 0, g.confirm_factor)["workload"].get("num_requests") or 0
            known = sum(1 for c, x in pairs if json.dumps(runner.first_long_task(c, x), sort_keys=True) in memo)
            counts["long_runs_ahead_used"] += known
            # (the runs to do now: one whose first run went ahead earlier sends nothing to a worker)
            spare = min((-(len(todo) - known)) % workers, g.confirm_top) if len(todo) > known else 0
            longest = max(size(x) for x in rates)
            for r in ranked:
                if len(riders) >= spare:
                    break
                x = target_rate or r["goodput"]
                if r["meets"] and r not in todo and not (r.get("long_run") or {}).get("passed") and size(x) <= longest \
                        and json.dumps(runner.first_long_task(cfgs[r["config"]], x), sort_keys=True) not in memo:
                    riders.append((cfgs[r["config"]], x))
            counts["long_runs_ahead"] += len(riders)
        n_req = [_scenario_dict(plan, {}, x, 0, g.confirm_factor)["workload"].get("num_requests") for x in rates]
        runner.log(f"long runs: {', '.join(r['config'] for r in todo)} ({g.confirm_factor:g}x the search window, "
                   f"{n_req} requests, fresh seeds)"
                   + (f"; ahead on idle workers: {', '.join(c.name for c, _ in riders)}" if riders else ""))
        results = runner.confirm(pairs, riders=riders) if riders else runner.confirm(pairs)
        for row, rate, res in zip(todo, rates, results):
            row["long_run"] = dict(res, rate=rate)
            if res["passed"]:
                continue
            row["long_run_failures"] = row.get("long_run_failures", 0) + 1
            what = f"long run at {rate:.3g} req/s: attainment {res['attainment']:.1%}" + \
                   (f" (95% CI {res['ci'][0]:.1%}-{res['ci'][1]:.1%})" if res["ci"] else
                    " (stopped once it could no longer pass)" if res["early"] else "")
            if target_rate or row["long_run_failures"] > MAX_CONFIRM_STEPS:
                row.update(status="fails long run",
                           note=what + " < target; " + _misses(res, cfgs[row["config"]].slo or plan.spec.slo))
            else:
                row["goodput"] = rate * (1 - g.tolerance)
                row["note"] = (row["note"] + "; " if row["note"] else "") + f"goodput lowered: {what}"
    return counts


def _misses(r: dict, slo) -> str:
    n = r["n"]
    parts = []
    if getattr(slo, "mode", "attainment") == "percentile":
        # the verdict's rule: each percentile (nearest rank, worst seed, +inf when it falls on a request never
        # served) against its bound; the shares within a bound are not what this mode judges
        for what, v, bound, pct in (("TTFT", r["ttft_p"], slo.ttft_s, slo.ttft_percentile),
                                    ("TPOT", r["tpot_p"], slo.tpot_s, slo.tpot_percentile)):
            if v is not None and v > bound:
                parts.append(f"{what} p{pct:g} " + ("inf (requests never served)" if math.isinf(v) else f"{v:.3g} s")
                             + f" > {bound:.4g} s")
        return "; ".join(parts) or "the percentile verdict failed (no percentile above its bound on the pooled " \
                                   "figures: a seed's own)"
    # a run stopped once it could no longer pass: shares within a bound are upper bounds, percentiles lower
    # bounds over the requests that had arrived (evaluate)
    at_most, so_far = ("at most ", ">= ") if r.get("p_so_far") else ("", "")
    if r["ttft_ok"] / n < slo.attainment_target:
        parts.append(f"TTFT: {at_most}{r['ttft_ok'] / n:.0%} within {slo.ttft_s:.4g} s"
                     + (f" (p{slo.ttft_percentile:g} {so_far}{r['ttft_p']:.3g} s)" if r["ttft_p"] is not None else ""))
    if r["tpot_ok"] / n < slo.attainment_target:
        parts.append(f"TPOT: {at_most}{r['tpot_ok'] / n:.0%} within {slo.tpot_s:.4g} s"
                     + (f" (p{slo.tpot_percentile:g} {so_far}{r['tpot_p']:.3g} s)" if r["tpot_p"] is not None else ""))
    if parts:
        return "; ".join(parts)
    if r.get("early") == "fail":
        return f"attainment at most {r['ok'] / n:.0%} < {slo.attainment_target:.0%} (run stopped once it could no " \
               "longer pass; TTFT and TPOT misses overlap)"
    return f"attainment {r['ok'] / n:.0%} < {slo.attainment_target:.0%} (TTFT and TPOT each pass)"


def _order(plan: Plan, rows: dict) -> list[dict]:
    """Rows ranked best first (meets, then the objective); sets each row's derived columns."""
    spec = plan.spec
    target_rate, att = spec.target.rate, spec.slo.attainment_target
    for row in rows.values():
        g = row["goodput"]
        row["goodput_per_gpu"] = g / row["gpus"] if g is not None else None
        row["goodput_per_usd_hour"] = g / row["usd_per_hour"] if g is not None and row["usd_per_hour"] > 0 else None
        row["margin"] = g / target_rate if target_rate and g is not None else None
        at = row.get("at_target")
        row["attainment_at_target"] = at["pass_att"] if at else None
        # "pass": the run stopped once it could not miss (the attainment is a lower bound); "fail":
        # once it could not pass (an upper bound)
        row["at_target_early_stop"] = at.get("early") if at else None
        row["ttft_p_at_target_s"] = at["ttft_p"] if at else None
        row["tpot_p_at_target_s"] = at["tpot_p"] if at else None
        lr = row.get("long_run")
        row["long_run_attainment"] = lr["attainment"] if lr else None
        row["long_run_ci"] = lr["ci"] if lr else None
        # the long run judged at the bounds / pdsim's p90 error (no margin set and a measured band), worst seed
        row["long_run_attainment_at_p90_error"] = lr.get("attainment_at_p90_error") if lr else None
        # a dominated config passed every rate it was tried at; its goodput is a lower bound
        row["meets"] = row["status"] in ("ok", "dominated (not fully searched)") and (row["goodput"] or 0) > 0 and \
            (not target_rate or bool(at and at.get("passes", (row["attainment_at_target"] or 0) >= att)))
    if spec.objective == "cheapest":
        key = lambda r: (not r["meets"], r["usd_per_hour"] if r["meets"] else -(r["attainment_at_target"] or 0),
                         -(r["goodput"] or 0), r["config"])
    elif spec.objective == "goodput_per_gpu":
        key = lambda r: (not r["meets"], -(r["goodput_per_gpu"] or 0), r["usd_per_hour"], r["config"])
    else:
        key = lambda r: (not r["meets"], -(r["goodput_per_usd_hour"] or 0), r["usd_per_hour"], r["config"])
    return sorted(rows.values(), key=key)


def _rank(plan: Plan, rows: dict, runner: _Runner) -> dict:
    spec = plan.spec
    target_rate = spec.target.rate
    ranked = _order(plan, rows)
    for r in ranked:
        r["points"] = {f"{x:.6g}": {"attainment": v["ok"] / v["n"], "worst_seed_attainment": v["min_att"],
                                    "ttft_p": v["ttft_p"], "tpot_p": v["tpot_p"], "early_stop": v.get("early")}
                       for x, v in sorted(r["points"].items())}
    for i, r in enumerate(ranked, 1):
        r["rank"] = i
    # Pareto frontier over ($/h down, goodput up) among measured configs
    measured = sorted((r for r in ranked if r["goodput"]), key=lambda r: (r["usd_per_hour"], -r["goodput"]))
    frontier, best = [], -1.0
    for r in measured:
        if r["goodput"] > best:
            frontier.append(r["config"])
            best = r["goodput"]
    for r in ranked:
        r["pareto"] = r["config"] in frontier
    winner = ranked[0] if ranked and ranked[0]["meets"] else None
    if winner and spec.goodput.confirm_top and not (winner.get("long_run") or {}).get("passed"):
        winner = None        # pragma: no cover - _confirm leaves no unconfirmed config on top
    return {"plan": spec.name, "pdsim_version": __version__, "objective": spec.objective, "target_rate": target_rate,
            "slo": spec.slo.model_dump(), "tolerance": spec.goodput.tolerance, "seeds": spec.goodput.seeds,
            "error_margin": (spec.goodput.error_margin if isinstance(spec.goodput.error_margin, str)
                             else spec.goodput.error_margin.model_dump()),
            "warmup_fraction": spec.goodput.warmup_fraction, "confirm_factor": spec.goodput.confirm_factor,
            "winner": winner["config"] if winner else None, "rows": ranked, "frontier": frontier,
            "excluded": plan.excluded, "simulations": runner.simulated, "cached": runner.cached,
            "wall_s": time.perf_counter() - runner.t0}


# --- outputs -------------------------------------------------------------------------------
def winner_scenario(plan: Plan, result: dict) -> dict | None:
    """The winner as a ready-to-run scenario (paths made absolute), at the target rate or its goodput."""
    if not result["winner"]:
        return None
    row = next(r for r in result["rows"] if r["config"] == result["winner"])
    rate = plan.spec.target.rate or row["goodput"]
    sc = _scenario_dict(plan, {row["config"]: row["topology"]}, rate, plan.spec.seed)
    sc["description"] = (f"Winner of plan '{plan.spec.name}' ({plan.spec.objective}): {row['gpus']} GPUs, "
                         f"${row['usd_per_hour']:.2f}/h, goodput {row['goodput']:.3g} req/s"
                         + (f" at the bounds goodput.error_margin tightened (TTFT <= {row['judged_ttft_s']:.4g} s, "
                            f"TPOT <= {row['judged_tpot_s']:.4g} s; the SLO below is the plan's own)"
                            if row.get("error_margin") else "") + "; written by pdsim plan")
    w = sc["workload"]
    if "trace" in w and "path" in w["trace"]:
        w["trace"]["path"] = str((plan.base_dir / w["trace"]["path"]).resolve())
    for t in sc["topologies"].values():
        for pool in (t, t.get("prefill"), t.get("decode")):
            if pool and "device" in pool and (pool["device"].endswith((".yaml", ".yml", ".json"))):
                pool["device"] = str((plan.base_dir / pool["device"]).resolve())
    return sc


TABLE_COLS = ["rank", "config", "gpus", "usd_per_hour", "goodput", "margin", "goodput_per_gpu",
              "goodput_per_usd_hour", "attainment_at_target", "at_target_early_stop", "long_run_attainment", "long_run_ci",
              "ttft_p_at_target_s", "tpot_p_at_target_s", "bound_rate", "pareto", "status", "note", "expected_error",
              # the bounds each config was judged at (the SLO's own, or tightened by goodput.error_margin)
              "judged_ttft_s", "judged_tpot_s", "long_run_attainment_at_p90_error"]
PLAN_OUTPUTS = ("winner.yaml", "plan.html", "plan.csv", "plan.json")


def json_safe(x):
    """``x`` with every non-finite float as the string "inf", "-inf" or "nan": strict JSON (a percentile of
    requests never served is +inf, evaluate)."""
    if isinstance(x, float) and not math.isfinite(x):
        return "nan" if x != x else ("inf" if x > 0 else "-inf")
    if isinstance(x, dict):
        return {k: json_safe(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [json_safe(v) for v in x]
    return x


def clear_plan_outputs(out: Path) -> None:
    """Remove a previous plan's outputs from ``out`` (a plan with no winner must not leave the last
    plan's winner.yaml behind); the result cache stays."""
    for name in PLAN_OUTPUTS:
        p = Path(out) / name
        if p.is_file() or p.is_symlink():
            p.unlink()


def write_plan_outputs(plan: Plan, result: dict, out: Path, progress: bool = False) -> None:
    import pandas as pd
    import yaml
    out.mkdir(parents=True, exist_ok=True)
    clear_plan_outputs(out)
    from .validate import bands_text
    pd.DataFrame([{**{k: r.get(k) for k in TABLE_COLS}, "expected_error": bands_text(r.get("expected_error") or {})}
                  for r in result["rows"]]).to_csv(out / "plan.csv", index=False)
    (out / "plan.json").write_text(json.dumps(json_safe(result), indent=2, default=str, allow_nan=False))
    win = winner_scenario(plan, result)
    if win is not None:
        (out / "winner.yaml").write_text("# Ready to run: pdsim run winner.yaml\n"
                                         + yaml.safe_dump(win, sort_keys=False))
    try:
        from .plan_report import build_plan_report
    except ImportError:  # pragma: no cover - report extras missing
        return
    if progress:
        print("pdsim plan: building plan.html...", file=sys.stderr, flush=True)
    build_plan_report(result, out)


def print_table(result: dict, out=None, limit: int = 25) -> None:
    def f(x, d=3):
        if x is None:
            return "-"
        if not isinstance(x, float):
            return str(x)
        if math.isfinite(x) and abs(x) >= 10 ** d:     # d significant digits without an exponent: 1024.0 -> 1,020
            return f"{round(x, d - len(str(int(abs(x))))):,.0f}"
        return f"{x:.{d}g}"
    def ci(r):
        if r.get("long_run_attainment") is None:
            return "-"
        c = r.get("long_run_ci")
        return f"{r['long_run_attainment']:.1%}" + (f" [{c[0]:.1%},{c[1]:.1%}]" if c else "")
    cols = ["#", "config", "GPUs", "$/h", "goodput req/s", "margin", "/GPU", "/($/h)", "att@target",
            "long run [95% CI]", "status"]
    rows = [[f(r["rank"]), r["config"] + (" *" if r["pareto"] else ""), f(r["gpus"]), f(r["usd_per_hour"], 4),
             f(r["goodput"]), "-" if r.get("margin") is None else f"{r['margin']:.2f}x",
             f(r["goodput_per_gpu"]), f(r["goodput_per_usd_hour"]),
             "-" if r["attainment_at_target"] is None else
             {"pass": ">=", "fail": "<="}.get(r.get("at_target_early_stop"), "") + f"{r['attainment_at_target']:.1%}",
             ci(r),
             r["status"] + (f": {r['note']}" if r["note"] and r["status"] != "ok" else "")]
            for r in result["rows"][:limit]]
    w = [max(len(c), *(len(r[i]) for r in rows)) if rows else len(c) for i, c in enumerate(cols)]
    print("  ".join(c.ljust(w[i]) for i, c in enumerate(cols)), file=out)
    for r in rows:
        print("  ".join(v.ljust(w[i]) for i, v in enumerate(r)), file=out)
    if len(result["rows"]) > limit:
        print(f"... {len(result['rows']) - limit} more in plan.csv", file=out)
    win = next((r for r in result["rows"] if r["config"] == result.get("winner")), None)
    if win is not None and win.get("expected_error"):
        from .validate import bands_text
        print(f"expected error of {win['config']} against measured runs (its goodput is judged on these TTFT/TPOT): "
              f"{bands_text(win['expected_error'])}", file=out)
    if win is not None and win.get("long_run_attainment_at_p90_error") is not None:
        print(f"{win['config']} at pdsim's p90 error (its long run judged at the bounds / the p90 of measured/simulated "
              f"latency over its validation runs): attainment {win['long_run_attainment_at_p90_error']:.1%}", file=out)
    if win is not None and win.get("error_margin"):
        m = win["error_margin"]
        print(f"{win['config']} judged at TTFT <= {win['judged_ttft_s']:.3g} s and TPOT <= {win['judged_tpot_s']:.3g} s: "
              f"the SLO's bounds / {m['ttft_factor']:.3g} and / {m['tpot_factor']:.3g} (goodput.error_margin, "
              f"{m['source']})", file=out)
    print("(* = on the cost/goodput Pareto frontier; margin = goodput / target rate; >= / <=: a run stopped once "
          "its verdict was certain, the attainment is a bound; long run = attainment on fresh seeds over a longer "
          "window, with its batch-means 95% interval)", file=out)
    sk = result.get("skipped")
    if sk:
        print(f"simulations saved: {sk.get('infeasible', 0)} configs infeasible alone, {sk['pruned_by_bound']} "
              f"pruned by the analytic bound, {sk['dominated']} dominated, "
              f"{sk.get('guided_by_sibling', 0)} searches started from a smaller sibling's goodput, "
              f"{sk['worst_seed']} seeds skipped after a failed seed, {sk['early_stop_pass']} + "
              f"{sk['early_stop_fail']} runs stopped early (pass + fail; "
              f"{sk['requests_not_simulated']:,} of {sk['requests_total']:,} requests not simulated), "
              f"{sk['cached']} from cache", file=out)
    if result["winner"]:
        print(f"\nrecommended: {result['winner']}", file=out)
    else:
        margin = result.get("error_margin")
        print("\nno configuration meets the SLO"
              + (f" at {result['target_rate']:g} req/s" if result["target_rate"] else "")
              + (f" at the bounds goodput.error_margin ({margin if isinstance(margin, str) else 'fixed'}) tightened "
                 "(plan.csv: judged_ttft_s, judged_tpot_s)" if margin not in (None, "none") else "")
              + " within the budget; closest above (see status for which SLO each misses)", file=out)
