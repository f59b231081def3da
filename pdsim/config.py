"""The scenario tree: one typed, validated config; unknown keys are errors with a did-you-mean.

``load(path, overrides)`` reads YAML, applies ``--set a.b=c`` overrides, and
validates once.  Building a config has no side effects.  Every validation
problem becomes one :class:`~pdsim.errors.ConfigError` naming the file, the
dotted key and the value.
"""
from __future__ import annotations

import difflib
import math
from pathlib import Path
from typing import Annotated, Any, Literal, Union

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from .errors import ConfigError

PosFloat = Annotated[float, Field(gt=0, allow_inf_nan=False)]
NonNegFloat = Annotated[float, Field(ge=0, allow_inf_nan=False)]
PosInt = Annotated[int, Field(gt=0, le=10**9)]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


# --- model -------------------------------------------------------------------
class InlineModel(_Strict):
    name: str = "custom"
    layers: PosInt
    hidden: PosInt
    heads: PosInt
    kv_heads: PosInt
    head_dim: PosInt | None = None
    mlp_width: PosInt
    vocab: PosInt
    tied_embeddings: bool = False
    gated_mlp: bool = True
    max_context: PosInt = 4096


# --- cost model and pools ----------------------------------------------------------
class CostModelSpec(_Strict):
    """``roofline`` (model x device profile), or ``constant`` / ``linear`` for theory and what-if runs."""
    kind: Literal["roofline", "constant", "linear"] = "roofline"
    step_s: PosFloat | None = None
    base_s: NonNegFloat = 0.0
    per_token_s: NonNegFloat = 0.0
    per_kv_token_s: NonNegFloat = 0.0

    @model_validator(mode="after")
    def _need(self):
        if self.kind == "constant" and self.step_s is None:
            raise ValueError("kind: constant needs step_s (seconds per step)")
        if self.kind == "linear" and self.base_s == self.per_token_s == self.per_kv_token_s == 0:
            raise ValueError("kind: linear needs base_s, per_token_s or per_kv_token_s > 0")
        return self


class ChunkedPrefillSpec(_Strict):
    token_budget: PosInt = 512


class PoolSpec(_Strict):
    """One kind of serving instance: device, tensor parallelism, batching limits, memory."""
    instances: PosInt = 1
    tp: PosInt = 1
    device: str = "h100-sxm"
    scheduler: Literal["fcfs", "chunked"] = "fcfs"
    chunked_prefill: ChunkedPrefillSpec | None = None
    max_running: PosInt = 256
    max_batched_tokens: PosInt = 8192
    gpu_memory_utilization: float = Field(0.9, gt=0, le=1)
    activation_reserve_GiB: NonNegFloat = 2.0
    block_size: PosInt = 16
    kv_blocks: PosInt | None = None          # override the pool size computed from memory
    watermark: float = Field(0.01, ge=0, lt=1)
    price_per_gpu_hour_usd: NonNegFloat | None = None   # default: the device profile's
    cost_model: CostModelSpec = CostModelSpec()

    @property
    def scheduler_name(self) -> str:
        return "chunked" if self.chunked_prefill is not None else self.scheduler

    @property
    def token_budget(self) -> int:
        return self.chunked_prefill.token_budget if self.chunked_prefill else self.max_batched_tokens


class ColocatedSpec(PoolSpec):
    kind: Literal["colocated"]
    replicas: PosInt = 1
    router: Literal["round_robin", "least_outstanding"] = "least_outstanding"


#: bandwidth per GPU (GB/s, one direction) and latency of common KV links
LINK_PRESETS = {
    "nvlink": (450.0, 5.0), "infiniband": (50.0, 10.0), "roce": (25.0, 15.0),
    "ethernet": (12.5, 50.0), "pcie": (25.0, 10.0),
}


class KVLinkSpec(_Strict):
    preset: Literal["nvlink", "infiniband", "roce", "ethernet", "pcie"] | None = None
    bandwidth_GBps: PosFloat | None = None     # per GPU of the prefill instance, one direction
    latency_us: NonNegFloat | None = None
    layerwise_overlap: bool = False
    shared: bool = False                       # one link for the whole pool instead of one per prefill instance

    @model_validator(mode="after")
    def _fill(self):
        bw, lat = LINK_PRESETS.get(self.preset or "infiniband")
        if self.bandwidth_GBps is None:
            self.bandwidth_GBps = bw
        if self.latency_us is None:
            self.latency_us = lat
        return self


class DisaggregatedSpec(_Strict):
    kind: Literal["disaggregated"]
    prefill: PoolSpec
    decode: PoolSpec
    kv_link: KVLinkSpec = KVLinkSpec()
    router: Literal["round_robin", "least_outstanding"] = "least_outstanding"
    assignment: Literal["round_robin", "least_loaded", "least_decode_work"] = "least_loaded"


Topology = Annotated[Union[ColocatedSpec, DisaggregatedSpec], Field(discriminator="kind")]


# --- workload ------------------------------------------------------------------------
class TraceSpec(_Strict):
    path: str
    format: Literal["auto", "azure", "vidur", "lengths", "mooncake"] = "auto"
    rate_scale: PosFloat = 1.0          # 2 = twice the trace's request rate
    start_s: NonNegFloat = 0.0
    duration_s: PosFloat | None = None
    jitter_s: NonNegFloat = 0.0         # spread arrivals uniformly within ticks (Mooncake's 3 s ticks)


class LengthSpec(_Strict):
    """Token counts: an integer, or ``{dist: uniform|lognormal|trace, ...}``."""
    dist: Literal["fixed", "uniform", "lognormal", "trace"] = "fixed"
    value: PosInt | None = None
    low: PosInt | None = None
    high: PosInt | None = None
    mean: PosFloat | None = None
    cv: NonNegFloat | None = None
    max: PosInt | None = None
    path: str | None = None
    format: Literal["auto", "azure", "vidur", "lengths", "mooncake"] = "auto"

    @model_validator(mode="before")
    @classmethod
    def _from_int(cls, v):
        if isinstance(v, (int, float)) and not isinstance(v, bool):
            return {"dist": "fixed", "value": v}
        return v

    @model_validator(mode="after")
    def _need(self):
        need = {"fixed": ["value"], "uniform": ["low", "high"], "lognormal": ["mean", "cv"],
                "trace": ["path"]}[self.dist]
        missing = [k for k in need if getattr(self, k) is None]
        if missing:
            raise ValueError(f"dist: {self.dist} needs {', '.join(missing)}")
        if self.dist == "uniform" and self.low > self.high:
            raise ValueError(f"low (={self.low}) must be <= high (={self.high})")
        return self


class WorkloadSpec(_Strict):
    arrival: Literal["poisson", "gamma", "constant", "closed", "trace"] = "poisson"
    rate: PosFloat | None = None            # requests per second (open loop)
    cv: PosFloat = 1.0                      # gamma inter-arrival coefficient of variation
    clients: PosInt | None = None           # closed loop: concurrent users
    think_s: NonNegFloat = 0.0              # closed loop: pause between a reply and the next request
    num_requests: PosInt | None = None
    duration_s: PosFloat | None = None      # open loop: arrivals in [0, duration_s)
    prompt_tokens: LengthSpec = LengthSpec(value=512)
    output_tokens: LengthSpec = LengthSpec(value=128)
    trace: TraceSpec | None = None

    @model_validator(mode="after")
    def _need(self):
        if self.arrival in ("poisson", "gamma", "constant") and self.rate is None:
            raise ValueError(f"arrival: {self.arrival} needs rate (requests per second)")
        if self.arrival == "closed" and self.clients is None:
            raise ValueError("arrival: closed needs clients")
        if self.arrival == "trace" and self.trace is None:
            raise ValueError("arrival: trace needs trace: {path: ...}")
        if self.arrival != "trace" and self.num_requests is None and self.duration_s is None:
            raise ValueError("give num_requests or duration_s")
        if self.arrival == "closed" and self.num_requests is None:
            raise ValueError("arrival: closed needs num_requests")
        return self


class SLOSpec(_Strict):
    ttft_s: PosFloat = 1.0
    tpot_s: PosFloat = 0.1
    ttft_percentile: float = Field(90, gt=0, le=100)
    tpot_percentile: float = Field(90, gt=0, le=100)
    attainment_target: float = Field(0.9, gt=0, le=1)


class Scenario(_Strict):
    name: str = "scenario"
    description: str = ""
    seed: int = 0
    model: str | InlineModel = "llama-3.1-8b"
    weight_dtype: Literal["fp32", "bf16", "fp16", "fp8", "int8", "int4"] = "bf16"
    kv_dtype: Literal["fp32", "bf16", "fp16", "fp8", "int8"] = "bf16"
    workload: WorkloadSpec
    slo: SLOSpec = SLOSpec()
    horizon_s: PosFloat | None = None       # stop the clock here; requests still in flight are unfinished
    timeseries_bin_s: PosFloat | None = None  # default: about 200 bins over the run
    topologies: dict[str, Topology] = Field(min_length=1)

    # where relative paths in the file are resolved; not part of the YAML
    base_dir: str = Field(".", exclude=True)

    def resolve(self, path: str) -> Path:
        p = Path(path)
        return p if p.is_absolute() else Path(self.base_dir) / p


# --- loading -----------------------------------------------------------------------
def _vocabulary() -> set[str]:
    names: set[str] = set()
    for cls in (InlineModel, CostModelSpec, ChunkedPrefillSpec, PoolSpec, ColocatedSpec, KVLinkSpec,
                DisaggregatedSpec, TraceSpec, LengthSpec, WorkloadSpec, SLOSpec, Scenario):
        names.update(cls.model_fields)
    return names


_TAGS = {"colocated", "disaggregated", "str", "InlineModel", "function-after[_need(), LengthSpec]"}


def _key(loc) -> str:
    parts = [str(p) for p in loc if str(p) not in _TAGS and not str(p).startswith(("function-", "json-or-python"))]
    return ".".join(parts)


def validation_error(exc: ValidationError, file: str | None) -> ConfigError:
    """The first pydantic error as one line: file, dotted key, value, and a did-you-mean for typos."""
    errs = exc.errors()
    # prefer a concrete error over "expected str" noise from the model: str | InlineModel union
    err = next((e for e in errs if e["type"] == "extra_forbidden"), errs[0])
    key = _key(err["loc"])
    msg = err["msg"].removeprefix("Value error, ")
    if err["type"] == "extra_forbidden":
        last = str(err["loc"][-1])
        close = difflib.get_close_matches(last, sorted(_vocabulary()), n=1, cutoff=0.6)
        msg = "unknown key" + (f"; did you mean '{close[0]}'?" if close else "")
        return ConfigError(msg, file=file, key=key)
    if err["type"] == "union_tag_invalid" or err["type"] == "union_tag_not_found":
        msg = "topology kind must be 'colocated' or 'disaggregated'"
    value = err.get("input")
    if isinstance(value, dict) or value is None:
        return ConfigError(msg, file=file, key=key)
    return ConfigError(msg, file=file, key=key, value=value, has_value=True)


def apply_overrides(raw: dict, overrides: list[str], file: str | None = None) -> dict:
    """``--set a.b.c=VALUE`` (VALUE parsed as YAML) applied to the raw tree."""
    for item in overrides or []:
        if "=" not in item:
            raise ConfigError("--set needs KEY=VALUE", key="--set", value=item)
        key, text = item.split("=", 1)
        try:
            value = yaml.safe_load(text)
        except yaml.YAMLError:
            value = text
        node = raw
        parts = key.strip().split(".")
        for p in parts[:-1]:
            nxt = node.get(p) if isinstance(node, dict) else None
            if nxt is None:
                nxt = node[p] = {}
            if not isinstance(nxt, dict):
                raise ConfigError("cannot set a key below a non-mapping", file=file, key=key)
            node = nxt
        node[parts[-1]] = value
    return raw


def parse(raw: Any, file: str | None = None, overrides: list[str] | None = None,
          base_dir: str | Path = ".") -> Scenario:
    if not isinstance(raw, dict):
        raise ConfigError("a scenario must be a YAML mapping", file=file)
    raw = apply_overrides(raw, overrides or [], file)
    try:
        sc = Scenario.model_validate({**raw, "base_dir": str(base_dir)})
    except ValidationError as exc:
        raise validation_error(exc, file) from None
    _check_numbers(raw, file)
    return sc


def _check_numbers(node, file, path=""):
    """NaN/inf anywhere in the tree is a mistake, even in free-form fields."""
    if isinstance(node, dict):
        for k, v in node.items():
            _check_numbers(v, file, f"{path}.{k}" if path else str(k))
    elif isinstance(node, list):
        for i, v in enumerate(node):
            _check_numbers(v, file, f"{path}[{i}]")
    elif isinstance(node, float) and not math.isfinite(node):
        raise ConfigError("must be a finite number", file=file, key=path, value=node, has_value=True)


def read_yaml(path: str | Path) -> Any:
    path = Path(path)
    if not path.is_file():
        raise ConfigError("scenario file not found" if not path.is_dir() else "is a directory, not a file",
                          file=str(path))
    if path.stat().st_size > 16 * 1024 * 1024:
        raise ConfigError("scenario file larger than 16 MiB; is this the right file?", file=str(path))
    try:
        return yaml.safe_load(path.read_text(encoding="utf-8"))
    except UnicodeDecodeError as exc:
        raise ConfigError(f"not UTF-8 text (byte {exc.start})", file=str(path)) from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        line = mark.line + 1 if mark is not None else None
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise ConfigError(f"not valid YAML: {problem}", file=str(path), line=line) from None
    except RecursionError:
        raise ConfigError("YAML nested too deeply", file=str(path)) from None


def load(path: str | Path, overrides: list[str] | None = None) -> Scenario:
    path = Path(path)
    return parse(read_yaml(path), str(path), overrides, base_dir=path.parent)
