"""Device profiles: peaks, memory, interconnect, price and the efficiency curves of the cost model.

A profile is a versioned YAML file (``schema_version: 1``).  Datasheet
profiles ship in ``pdsim/data/devices/`` and say in ``source`` that they are
not measured; measured profiles written by ``pdsim calibrate`` carry a
``measured`` section of raw tables that :mod:`pdsim.profile_tables` turns
into interpolated timings.  A measured table always wins over the roofline
where it covers the shape.

Roofline with efficiency, per kernel::

    t = max(flops / (peak * eff_c(M)), bytes / (bw * eff_mem)) + kernel_overhead
    eff_c(M) = gemm_max * M / (M + gemm_m_half)       # small GEMMs run far below peak
"""
from __future__ import annotations

import json
import re
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any, Literal, NamedTuple

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from .errors import ConfigError

DATA_DIR = Path(__file__).parent / "data" / "devices"
GiB = 1024 ** 3


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class InterconnectSpec(_Strict):
    name: str = "custom"
    bandwidth_GBps: float = Field(gt=0, allow_inf_nan=False)
    latency_us: float = Field(ge=0, allow_inf_nan=False)


class EfficiencySpec(_Strict):
    gemm_max: float = Field(0.75, gt=0, le=1)
    gemm_m_half: float = Field(64, ge=0, allow_inf_nan=False)
    memory: float = Field(0.85, gt=0, le=1)
    attention_prefill: float = Field(0.5, gt=0, le=1)
    attention_decode_memory: float = Field(0.7, gt=0, le=1)
    kernel_overhead_us: float = Field(4, ge=0, allow_inf_nan=False)
    step_overhead_us: float = Field(800, ge=0, allow_inf_nan=False)
    allreduce: float = Field(0.75, gt=0, le=1)
    # floors and launch costs of pdsim.kernels (the cost model's formulas); 0 = none, as older profiles
    attention_decode_floor_us: float = Field(0, ge=0, allow_inf_nan=False)
    attention_prefill_floor_us: float = Field(0, ge=0, allow_inf_nan=False)
    elementwise_floor_us: float = Field(0, ge=0, allow_inf_nan=False)
    allreduce_base_us: float = Field(3, ge=0, allow_inf_nan=False)   # custom one-shot all-reduce launch
    allreduce_per_peer_us: float = Field(0, ge=0, allow_inf_nan=False)  # and its growth per extra GPU
    # dense GEMMs with fp8 weights (fp8 tensor cores) reach this fraction of the bf16-fitted roofline's compute
    # (gemm_max, at the fp8 peak) and memory (memory) efficiency, and launch at this cost (None:
    # kernel_overhead_us; the measured per-tensor fp8 GEMMs carry their activation quantisation); 1 / 1 / None
    # = as bf16 GEMMs (older profiles)
    fp8_gemm_compute: float = Field(1.0, gt=0, le=1)
    fp8_gemm_memory: float = Field(1.0, gt=0, le=1)
    fp8_gemm_overhead_us: float | None = Field(None, ge=0, allow_inf_nan=False)
    # fp8 grouped GEMMs (an MoE layer's routed experts with fp8 weights) reach this fraction of the dense
    # GEMM roofline's compute (gemm_max) and memory (memory) efficiency; 1 = as dense GEMMs (older profiles)
    grouped_fp8_compute: float = Field(1.0, gt=0, le=1)
    grouped_fp8_memory: float = Field(1.0, gt=0, le=1)
    # and the launch and setup cost of one fp8 grouped GEMM (a fused MoE kernel's expert offsets and
    # scheduling); None: kernel_overhead_us, as any GEMM
    grouped_fp8_overhead_us: float | None = Field(None, ge=0, allow_inf_nan=False)


# --- the measured section written by ``pdsim calibrate`` --------------------
# Lists of raw tables; pdsim.profile_tables interpolates them.  Every time is
# the median of the repeats in ``samples_s`` (kept so a profile can be re-fitted).
def _check_grid(t) -> None:
    """A batch x context table: increasing axes, a full grid of positive finite times (null: not measured)."""
    _check_increasing("batch", t.batch)
    _check_increasing("context", t.context)
    if len(t.time_s) != len(t.batch) or any(len(r) != len(t.context) for r in t.time_s):
        raise ValueError(f"time_s must be a {len(t.batch)} x {len(t.context)} grid (batch x context)")
    if any(not (x > 0 and x < float("inf")) for r in t.time_s for x in r if x is not None):
        raise ValueError("time_s must be positive and finite (or null where not measured)")
    if all(x is None for r in t.time_s for x in r):
        raise ValueError("time_s has no measured cell")


def _check_curve(name: str, xs: list, times: list, min_x: int | None = 1) -> None:
    """A curve over ``xs`` (increasing, each >= min_x unless None) with one positive finite time per point."""
    _check_increasing(name, xs)
    if min_x is not None and xs[0] < min_x:
        raise ValueError(f"{name} must be >= {min_x}, got {xs[0]}")
    if len(times) != len(xs):
        raise ValueError(f"time_s has {len(times)} values for {len(xs)} {name} values")
    if any(not (x > 0 and x < float("inf")) for x in times):
        raise ValueError(f"time_s must be positive and finite, got {times}")


def _check_increasing(name: str, xs: list) -> None:
    if any(b <= a for a, b in zip(xs, xs[1:])):
        raise ValueError(f"{name} must be strictly increasing, got {xs}")


class GemmTableSpec(_Strict):
    """One (M x K) @ (K x N) GEMM shape timed over a grid of M (tokens or batch rows)."""
    op: str = "gemm"
    n: int = Field(gt=0)
    k: int = Field(gt=0)
    tp: int = Field(1, ge=1)
    dtype: str = "bf16"
    m: list[int] = Field(min_length=1)
    time_s: list[float] = Field(min_length=1)
    samples_s: list[list[float]] | None = None

    @model_validator(mode="after")
    def _shape(self):
        _check_curve("m", self.m, self.time_s)
        return self


class AttentionPrefillTableSpec(_Strict):
    """Causal attention of ``batch`` prompts (default 1) of ``seq_len`` tokens each, one layer."""
    q_heads: int = Field(gt=0)
    kv_heads: int = Field(gt=0)
    head_dim: int = Field(gt=0)
    tp: int = Field(1, ge=1)
    dtype: str = "bf16"
    batch: int = Field(1, ge=1)
    seq_len: list[int] = Field(min_length=1)
    time_s: list[float] = Field(min_length=1)
    samples_s: list[list[float]] | None = None

    @model_validator(mode="after")
    def _shape(self):
        _check_curve("seq_len", self.seq_len, self.time_s, min_x=None)
        return self


class AttentionDecodeTableSpec(_Strict):
    """One query token per sequence over ``batch`` x ``context`` KV tokens, one layer; time_s[b][c].

    An imported grid may be ragged: ``null`` where the source measured nothing (the lookup then
    scales the largest measured batch at that context)."""
    q_heads: int = Field(gt=0)
    kv_heads: int = Field(gt=0)
    head_dim: int = Field(gt=0)
    tp: int = Field(1, ge=1)
    dtype: str = "bf16"
    batch: list[int] = Field(min_length=1)
    context: list[int] = Field(min_length=1)
    time_s: list[list[float | None]] = Field(min_length=1)
    samples_s: list[list[list[float]]] | None = None

    @model_validator(mode="after")
    def _shape(self):
        _check_grid(self)
        return self


class TransferTableSpec(_Strict):
    """Bytes moved by one copy (device, host->device, device->host) or all-reduce, and its time."""
    kind: Literal["device_copy", "h2d", "d2h", "allreduce"]
    tp: int = Field(1, ge=1)
    impl: str | None = None        # all-reduce implementation, e.g. "nccl" or "custom" (imported tables)
    bytes: list[float] = Field(min_length=1)
    time_s: list[float] = Field(min_length=1)
    samples_s: list[list[float]] | None = None

    @model_validator(mode="after")
    def _shape(self):
        _check_increasing("bytes", self.bytes)
        if len(self.time_s) != len(self.bytes):
            raise ValueError(f"time_s has {len(self.time_s)} values for {len(self.bytes)} bytes values")
        if any(not (t > 0 and t < float("inf")) for t in self.time_s):
            raise ValueError(f"time_s must be positive and finite, got {self.time_s}")
        return self


class MoeTableSpec(_Strict):
    """One MoE layer's routed experts (routing, permutation, grouped GEMMs, activation: one fused
    kernel flow) for a shape, timed over the tokens entering the layer on one GPU (imported databases).
    ``inter`` is one expert's MLP width; ``moe_tp`` x ``moe_ep`` is how the experts are split."""
    hidden: int = Field(gt=0)
    inter: int = Field(gt=0)
    topk: int = Field(gt=0)
    experts: int = Field(gt=0)
    moe_tp: int = Field(1, ge=1)
    moe_ep: int = Field(1, ge=1)
    gated: bool = True
    dtype: str = "bf16"
    distribution: str = "balanced"
    tokens: list[int] = Field(min_length=1)
    time_s: list[float] = Field(min_length=1)

    @model_validator(mode="after")
    def _shape(self):
        _check_curve("tokens", self.tokens, self.time_s)
        return self


class _MlaDims(_Strict):
    """The MLA head dims a kernel table was measured with (aiconfigurator's MLA tables: DeepSeek-V3's)."""
    heads: int = Field(gt=0)                 # query heads on one GPU (after tensor parallelism)
    kv_lora_rank: int = Field(512, gt=0)
    qk_rope_head_dim: int = Field(64, ge=0)
    qk_nope_head_dim: int = Field(128, gt=0)
    v_head_dim: int = Field(128, gt=0)
    dtype: str = "bf16"                      # KV-cache dtype


class MlaPrefillTableSpec(_MlaDims):
    """MLA context attention (decompressed form, no prefix in cache) of ``batch`` prompts of ``seq_len``
    tokens each, one layer (imported databases)."""
    batch: int = Field(1, ge=1)
    seq_len: list[int] = Field(min_length=1)
    time_s: list[float] = Field(min_length=1)

    @model_validator(mode="after")
    def _shape(self):
        _check_curve("seq_len", self.seq_len, self.time_s, min_x=None)
        return self


class MlaDecodeTableSpec(_MlaDims):
    """MLA generation attention (absorbed form: every head reads the shared latent), one query token per
    sequence over ``batch`` x ``context`` KV tokens, one layer; time_s[b][c], ragged like
    :class:`AttentionDecodeTableSpec`."""
    batch: list[int] = Field(min_length=1)
    context: list[int] = Field(min_length=1)
    time_s: list[list[float | None]] = Field(min_length=1)

    @model_validator(mode="after")
    def _shape(self):
        _check_grid(self)
        return self


class AlltoallTableSpec(_Strict):
    """One phase (dispatch or combine) of an MoE all-to-all over ``ep`` GPUs of one node, by the tokens on
    each GPU (imported databases: DeepEP high-throughput ``ht`` or low-latency ``ll`` kernels)."""
    backend: Literal["ht", "ll"]
    phase: Literal["dispatch", "combine"]
    dtype: str = "bf16"                      # what goes over the wire
    ep: int = Field(gt=1)
    hidden: int = Field(gt=0)
    topk: int = Field(gt=0)
    experts: int = Field(gt=0)
    tokens: list[int] = Field(min_length=1)
    time_s: list[float] = Field(min_length=1)

    @model_validator(mode="after")
    def _shape(self):
        _check_curve("tokens", self.tokens, self.time_s)
        return self


class HoldoutSpec(_Strict):
    """Shapes measured in the same run but kept out of the tables and the fit (the leave-out split)."""
    gemm: list[GemmTableSpec] = []
    attention_prefill: list[AttentionPrefillTableSpec] = []
    attention_decode: list[AttentionDecodeTableSpec] = []


class MeasuredSpec(_Strict):
    """The raw tables of a measured profile (``measured:``)."""
    format: Literal[1] = 1
    device: Literal["cpu", "cuda"] = "cuda"
    model: str | None = None
    tp: list[int] = [1]
    # True when the GEMM tables of a dtype are a sweep over a grid of (n, k) (imported databases):
    # shapes between grid points are then interpolated in (log n, log k) instead of the roofline.
    gemm_nk_grid: bool = False
    gemm: list[GemmTableSpec] = []
    attention_prefill: list[AttentionPrefillTableSpec] = []
    attention_decode: list[AttentionDecodeTableSpec] = []
    transfers: list[TransferTableSpec] = []
    moe: list[MoeTableSpec] = []
    mla_prefill: list[MlaPrefillTableSpec] = []
    mla_decode: list[MlaDecodeTableSpec] = []
    alltoall: list[AlltoallTableSpec] = []
    holdout: HoldoutSpec | None = None


class PowerSpec(_Strict):
    """Power draw of one device (pdsim/energy.py): ``idle_W`` with no step running, ``max_W`` at full
    utilisation; ``source`` says where the numbers come from (datasheet TDP, measured, estimate)."""
    idle_W: float = Field(ge=0, allow_inf_nan=False)
    max_W: float = Field(gt=0, allow_inf_nan=False)
    source: str = Field(min_length=3)

    @model_validator(mode="after")
    def _order(self):
        if self.max_W <= self.idle_W:
            raise ValueError(f"max_W (={self.max_W}) must exceed idle_W (={self.idle_W})")
        return self


class ProfileSpec(_Strict):
    """The on-disk schema of a device profile."""
    schema_version: Literal[1] = 1
    name: str
    kind: Literal["gpu", "cpu"] = "gpu"
    source: str = Field(min_length=3)
    memory_GiB: float = Field(gt=0, allow_inf_nan=False)
    memory_bandwidth_GBps: float = Field(gt=0, allow_inf_nan=False)
    peak_tflops: dict[str, float]
    interconnect: InterconnectSpec
    price_per_hour_usd: float = Field(0.0, ge=0, allow_inf_nan=False)
    efficiency: EfficiencySpec = EfficiencySpec()
    measured: MeasuredSpec | None = None
    power: PowerSpec | None = None
    fitted: dict[str, Any] | None = None
    meta: dict[str, Any] | None = None


@dataclass(frozen=True)
class DeviceProfile:
    spec: ProfileSpec
    path: str | None = None

    # --- plain attributes in SI units --------------------------------------
    @property
    def name(self) -> str:
        return self.spec.name

    @property
    def source(self) -> str:
        return self.spec.source

    @property
    def is_measured(self) -> bool:
        return self.spec.measured is not None

    @property
    def memory_bytes(self) -> float:
        return self.spec.memory_GiB * GiB

    @property
    def mem_bw_Bps(self) -> float:
        return self.spec.memory_bandwidth_GBps * 1e9

    @property
    def price_per_hour_usd(self) -> float:
        return self.spec.price_per_hour_usd

    @property
    def interconnect_Bps(self) -> float:
        return self.spec.interconnect.bandwidth_GBps * 1e9

    @property
    def interconnect_latency_s(self) -> float:
        return self.spec.interconnect.latency_us * 1e-6

    @property
    def step_overhead_s(self) -> float:
        return self.spec.efficiency.step_overhead_us * 1e-6

    def peak_flops(self, dtype: str) -> float:
        """Peak FLOP/s for a compute dtype; falls back to bf16 (e.g. fp8 on an A100 runs as bf16)."""
        p = self.spec.peak_tflops
        v = p.get(dtype)        # (the fallbacks only when needed: this is called for every GEMM priced)
        if v is None:
            v = p.get("bf16", p.get("fp16", max(p.values())))
        return 1e12 * v

    @cached_property
    def tables(self):
        """Interpolated measured tables, or None for a datasheet profile."""
        if self.spec.measured is None:
            return None
        from .profile_tables import MeasuredTables  # only measured profiles need it
        return MeasuredTables.from_profile(self.spec)

    # --- kernel timings -----------------------------------------------------
    # Each ``*_lookup`` returns Timing(time_s, source) with source "exact" | "interpolated" |
    # "extrapolated" (measured tables, see pdsim.profile_tables) or "roofline"; the plain
    # ``*_time`` methods return the time alone.
    def gemm_lookup(self, m: int, n: int, k: int, weight_bytes: float, act_bytes: float = 2.0,
                    dtype: str = "bf16") -> "Timing":
        """One (m x k) @ (k x n) GEMM: measured table if it covers the shape, else the roofline."""
        if self.tables is not None:
            r = self.tables.gemm_lookup(m, n, k, dtype)
            if r is not None:
                return Timing(r.time_s, r.how)
        from .kernels import gemm_roofline      # the cost model's one formula (fp8's own fractions included)
        return Timing(gemm_roofline(self, m, n, k, weight_bytes, act_bytes, dtype), "roofline")

    def gemm_time(self, m: int, n: int, k: int, weight_bytes: float, act_bytes: float = 2.0,
                  dtype: str = "bf16") -> float:
        return self.gemm_lookup(m, n, k, weight_bytes, act_bytes, dtype).time_s

    def attention_lookup(self, flops: float, bytes_: float, prefill: bool, dtype: str = "bf16",
                         shape: tuple | None = None) -> "Timing":
        """Attention kernel: compute-bound in prefill, KV-read-bound in decode."""
        if self.tables is not None and shape is not None:
            r = self.tables.attention_lookup(prefill, shape, dtype)
            if r is not None:
                return Timing(r.time_s, r.how)
        if flops <= 0 and bytes_ <= 0:
            return Timing(0.0, "roofline")
        e = self.spec.efficiency
        c_eff = e.attention_prefill if prefill else e.attention_prefill * 0.5
        m_eff = e.memory if prefill else e.attention_decode_memory
        return Timing(max(flops / (self.peak_flops(dtype) * c_eff), bytes_ / (self.mem_bw_Bps * m_eff))
                      + e.kernel_overhead_us * 1e-6, "roofline")

    def attention_time(self, flops: float, bytes_: float, prefill: bool, dtype: str = "bf16",
                       shape: tuple | None = None) -> float:
        return self.attention_lookup(flops, bytes_, prefill, dtype, shape).time_s

    def allreduce_lookup(self, bytes_: float, tp: int, impl: str | None = None) -> "Timing":
        """All-reduce of ``bytes_`` over ``tp`` GPUs: the measured table of ``impl`` ("nccl",
        "custom", ...; None = the fastest measured at this size) when the profile has one for
        this tp, else the datasheet model of :func:`pdsim.kernels.allreduce_datasheet` (the faster of a
        one-shot and a two-shot all-reduce over the interconnect)."""
        if tp <= 1:
            return Timing(0.0, "exact")
        if self.tables is not None:
            hit = self.tables.allreduce_lookup(bytes_, tp, impl)
            if hit is not None:
                return Timing(hit[0].time_s, hit[0].how, hit[1])
        from .kernels import allreduce_datasheet      # one datasheet model for the cost model and this lookup
        return Timing(allreduce_datasheet(self, bytes_, tp), "roofline")

    def allreduce_time(self, bytes_: float, tp: int, impl: str | None = None) -> float:
        return self.allreduce_lookup(bytes_, tp, impl).time_s


class Timing(NamedTuple):
    """A kernel time and where it came from: "exact", "interpolated", "extrapolated" (measured
    tables) or "roofline"; ``impl`` names the all-reduce implementation whose table was used."""
    time_s: float
    source: str
    impl: str | None = None


def preset_names() -> list[str]:
    return sorted(p.stem for p in DATA_DIR.glob("*.yaml"))


def _shown(value: object, limit: int = 120) -> object:
    """The offending value for an error message; a whole measured table is cut to its start."""
    if isinstance(value, (dict, list)) and len(repr(value)) > limit:
        return repr(value)[:limit] + "..."
    return value


# An imported profile holds ~10^5 numbers, which PyYAML needs many seconds to build (json: a
# fraction of one).  In the ``measured:`` section, table rows written one per line as JSON
# (``- {"n": 32, ...}``) and one-line flow lists of numbers are valid JSON: they are parsed with
# json and put back into the YAML tree by placeholder.  Anything json rejects is left to YAML.
_JSON_ROW = re.compile(r"^(\s*- )(\{.*\})[ \t]*$", flags=re.M)
_NUM_LIST = re.compile(r"(?<=[:\-,\[] )\[[-+0-9.eEnul, ]*\]|(?<=\[)\[[-+0-9.eEnul, ]*\]")
_PLACEHOLDER = "__pdsim_json_{}"


def _load_yaml_fast(text: str):
    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    m = re.search(r"^measured:", text, flags=re.M)
    if m is None or len(text) < 100_000:
        return yaml.load(text, Loader=loader)
    parsed: list = []

    def stash(match, group=0, keep=""):
        try:
            parsed.append(json.loads(match.group(group)))
        except ValueError:
            return match.group(0)                  # not JSON (e.g. .inf): YAML reads it
        return (match.group(1) if keep else "") + _PLACEHOLDER.format(len(parsed) - 1)

    tail = _JSON_ROW.sub(lambda mm: stash(mm, 2, "keep"), text[m.start():])
    tail = _NUM_LIST.sub(stash, tail)
    raw = yaml.load(text[:m.start()] + tail, Loader=loader)
    by_name = {_PLACEHOLDER.format(i): v for i, v in enumerate(parsed)}

    def put_back(x):
        if isinstance(x, str) and x in by_name:
            return by_name[x]
        if isinstance(x, list):
            return [put_back(v) for v in x]
        if isinstance(x, dict):
            return {k: put_back(v) for k, v in x.items()}
        return x
    return put_back(raw)


# Files re-read only when they change: an imported profile takes about a second to load and a
# scenario may name it in several topologies.  A DeviceProfile is immutable, so sharing it is safe.
# The key has the change time (st_ctime_ns): any write moves it, and unlike the modification time
# it cannot be put back (cp -p, a checkout, os.utime), so a same-size edit is never served stale.
_FILE_CACHE: dict[tuple, DeviceProfile] = {}


def _file_key(path: Path) -> tuple:
    st = path.stat()
    return (str(path.resolve()), st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)


def load_profile_file(path: str | Path) -> DeviceProfile:
    path = Path(path)
    if not path.is_file():
        raise ConfigError("device profile file not found", file=str(path))
    key = _file_key(path)
    if key not in _FILE_CACHE:
        if len(_FILE_CACHE) > 32:
            _FILE_CACHE.clear()
        _FILE_CACHE[key] = _load_profile_file(path)
    return _FILE_CACHE[key]


def _load_profile_file(path: Path) -> DeviceProfile:
    try:
        raw = _load_yaml_fast(path.read_text())
    except (yaml.YAMLError, UnicodeDecodeError) as exc:
        raise ConfigError(f"not valid YAML: {exc}".splitlines()[0], file=str(path)) from None
    if not isinstance(raw, dict):
        raise ConfigError("a device profile must be a mapping", file=str(path))
    try:
        spec = ProfileSpec.model_validate(raw)
    except ValidationError as exc:
        err = exc.errors()[0]
        key = ".".join(str(x) for x in err["loc"])
        if err["type"] == "missing":   # the input of a missing key is its parent mapping: do not show it
            raise ConfigError("required key is missing", file=str(path), key=key) from None
        raise ConfigError(err["msg"], file=str(path), key=key, value=_shown(err.get("input")),
                          has_value=True) from None
    return DeviceProfile(spec, str(path))


# Presets are immutable package data, so caching them by name is safe; files are re-read when they change.
_PRESET_CACHE: dict[str, DeviceProfile] = {}


def get_device(name_or_path: str, key: str = "device", base_dir: Path | None = None) -> DeviceProfile:
    """A preset by exact name, or a profile file by path (relative to base_dir)."""
    if name_or_path in _PRESET_CACHE:
        return _PRESET_CACHE[name_or_path]
    preset = DATA_DIR / f"{name_or_path}.yaml"
    looks_like_path = name_or_path.endswith((".yaml", ".yml", ".json")) or "/" in name_or_path
    if preset.is_file() and not looks_like_path:
        prof = _PRESET_CACHE[name_or_path] = load_profile_file(preset)
    elif looks_like_path:
        p = Path(name_or_path)
        if not p.is_absolute() and base_dir is not None and not p.exists():
            p = base_dir / p
        if not p.is_file():
            raise ConfigError("device profile file not found", key=key, value=name_or_path)
        # a measured profile is megabytes of tables: read once per process while the file is unchanged
        prof = load_profile_file(p)
    else:
        raise ConfigError(f"unknown device; valid presets: {', '.join(preset_names())} "
                          "(or a path to a profile .yaml)", key=key, value=name_or_path)
    return prof
