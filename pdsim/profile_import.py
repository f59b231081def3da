"""Import public measured kernel databases into pdsim's measured-profile format.

``pdsim profile import aiconfigurator --system h100_sxm --backend trtllm --out X.yaml`` reads
NVIDIA AIConfigurator's perf database from the *installed* ``aiconfigurator-core`` package
(``pip install 'pdsim[aic]'``; Apache-2.0), ``pdsim profile import vidur DIR --gpu a100 --out X.yaml``
Vidur's profiling CSVs (MIT).  Both write the same schema as ``pdsim calibrate`` (the
``measured:`` section of :class:`pdsim.devices.ProfileSpec`), so either profile is a ``device:``.

AIConfigurator layout (per system, op family, backend, version)::

    systems/<system>.yaml                                   peaks, memory, NVLink bandwidth
    systems/data/<system>/gemm/<backend>/<ver>/gemm_perf.parquet                 m, n, k, gemm_dtype, latency
    systems/data/<system>/attention/<backend>/<ver>/context_attention_perf.parquet    batch_size, isl, heads...
    systems/data/<system>/attention/<backend>/<ver>/generation_attention_perf.parquet batch_size, step (KV)...
    systems/data/<system>/comm/nccl/<ver>/nccl_perf.parquet                     op_name, num_gpus, message_size
    systems/data/<system>/comm/<backend>/<ver>/custom_allreduce_perf.parquet    num_gpus, message_size
    systems/data/<system>/moe/<backend>/<ver>/moe_perf.parquet        num_tokens, hidden/inter, topk, experts, moe tp/ep
    systems/data/<system>/mla/<backend>/<ver>/context_mla_perf.parquet     num_heads (per GPU), batch_size, isl
    systems/data/<system>/mla/<backend>/<ver>/generation_mla_perf.parquet  num_heads (per GPU), batch_size, step
    systems/data/<system>/comm/<backend>/<ver>/moe_a2a_perf.parquet   DeepEP dispatch/combine (latency in us)

Latencies are milliseconds per call (one layer for attention; ``moe_a2a_perf``: microseconds, its
columns say ``transmit_us``); ``message_size`` counts elements
of the collective's dtype (bf16/half: 2 bytes; checked against NVLink: 8 x H200 all-reduce of
the largest message gives ~460 GB/s bus bandwidth read as elements, ~230 GB/s read as bytes).
A ``.csv`` (or ``.txt``, as older package versions shipped) next to or instead of a ``.parquet``
is read too; parquet needs pyarrow, which the ``aic`` extra brings.
"""
from __future__ import annotations

import datetime as _dt
import importlib.metadata
import importlib.util
import json
import math
import re
import sys
import time
from pathlib import Path

import yaml

from .devices import DATA_DIR, GiB, ProfileSpec, get_device, preset_names
from .errors import ConfigError

INSTALL_HINT = "pip install 'pdsim[aic]'"
SIG_DIGITS = 4          # times are rounded to 4 significant digits (relative error <= 5e-4)
MAX_PROFILE_BYTES = 5 * 1024 * 1024

# AIConfigurator system -> the pdsim datasheet preset whose price and roofline efficiencies an
# imported profile keeps (peaks, memory and NVLink come from the package's own system file).
PRESET_FOR_SYSTEM = {"h100_sxm": "h100-sxm", "h200_sxm": "h200", "a100_sxm": "a100-80gb-sxm", "l40s": "l40s",
                     "b200_sxm": "b200"}
DTYPE_NAMES = {"bfloat16": "bf16", "float16": "fp16", "half": "fp16", "float32": "fp32"}
# pdsim cost-model ops and the package tables that serve them
OP_TABLES = {"gemm": "gemm_perf", "attention_prefill": "context_attention_perf",
             "attention_decode": "generation_attention_perf", "allreduce": "nccl_perf/custom_allreduce_perf"}


def _sig(x: float, digits: int = SIG_DIGITS) -> float:
    return float(f"{x:.{digits - 1}e}")


def _version_key(v: str):
    try:
        from packaging.version import Version
        return (0, Version(v))
    except Exception:   # not PEP 440 or packaging missing: natural order of the digit runs
        return (1, tuple(int(p) if p.isdigit() else -1 for p in re.findall(r"\d+|[a-z]+", v)))


def _sorted_versions(vs) -> list[str]:
    vs = list(vs)
    try:
        return sorted(vs, key=_version_key)
    except TypeError:
        return sorted(vs)


# --- locating the package's data ------------------------------------------------------------------
def aic_systems_dir() -> tuple[Path, str]:
    """The installed aiconfigurator-core's ``systems`` folder and the package version."""
    spec = importlib.util.find_spec("aiconfigurator_core")
    if spec is None or not spec.submodule_search_locations:
        raise ConfigError(f"aiconfigurator-core is not installed: {INSTALL_HINT}")
    root = Path(list(spec.submodule_search_locations)[0]) / "systems"
    if not root.is_dir():
        raise ConfigError(f"aiconfigurator-core has no systems/ data folder at {root}; reinstall it: {INSTALL_HINT}")
    try:
        version = importlib.metadata.version("aiconfigurator-core")
    except importlib.metadata.PackageNotFoundError:
        version = "unknown"
    return root, version


def _table_file(folder: Path, stem: str) -> Path | None:
    for ext in (".parquet", ".csv", ".txt"):
        p = folder / (stem + ext)
        if p.is_file():
            return p
    return None


def _read_table(path: Path):
    import pandas as pd
    if path.suffix == ".parquet":
        try:
            return pd.read_parquet(path)
        except ImportError:
            raise ConfigError(f"reading parquet needs pyarrow: {INSTALL_HINT}", file=str(path)) from None
    return pd.read_csv(path)


def aic_inventory(systems_dir: Path) -> dict[str, dict[str, dict[str, list[str]]]]:
    """system -> op family (gemm, attention, comm, moe) -> backend -> versions that have a table file."""
    inv: dict = {}
    data = systems_dir / "data"
    for sys_yaml in sorted(systems_dir.glob("*.yaml")):
        name = sys_yaml.stem
        if not (data / name).is_dir() and not _looks_like_system(sys_yaml):
            continue
        fams = {}
        for fam in ("gemm", "attention", "comm", "moe", "mla"):
            by_backend = {}
            for bdir in sorted((data / name / fam).glob("*")) if (data / name / fam).is_dir() else []:
                vs = [v.name for v in bdir.iterdir() if v.is_dir() and any(v.glob("*_perf.*"))]
                if vs:
                    by_backend[bdir.name] = _sorted_versions(vs)
            fams[fam] = by_backend
        inv[name] = fams
    return inv


def _looks_like_system(p: Path) -> bool:
    """A system file names its data_dir (the package's other, large YAML files are not parsed)."""
    with open(p, errors="replace") as f:
        head = f.read(4096)
    return re.search(r"^data_dir:", head, flags=re.M) is not None


def _pick_version(available: list[str], wanted: str | None) -> str | None:
    """``wanted`` if present, else the newest version not newer than it, else the newest."""
    if not available:
        return None
    if wanted is None:
        return available[-1]
    if wanted in available:
        return wanted
    try:
        older = [v for v in available if _version_key(v) < _version_key(wanted)]
    except TypeError:
        older = []
    return older[-1] if older else available[-1]


# --- conversion ------------------------------------------------------------------------------------
def _ms_to_s(x) -> float:
    return _sig(float(x) * 1e-3)


def _geo_merge(pairs):
    """Sorted unique x with the geometric mean of y where x repeats."""
    by: dict = {}
    for x, y in pairs:
        if y > 0 and math.isfinite(y):
            by.setdefault(x, []).append(y)
    xs = sorted(by)
    return xs, [math.exp(sum(map(math.log, by[x])) / len(by[x])) for x in xs]


def _grouped(df, keys: list[str], x: str, y: str = "latency"):
    """(key values, sorted xs, ys) per group of ``keys``; repeated x get the geometric mean of y.
    Vectorised: the real tables have ~10^5 rows."""
    import numpy as np
    d = df[keys + [x, y]]
    yv = d[y].astype(float)
    d = d[(yv > 0) & np.isfinite(yv)].assign(_ly=np.log(yv[(yv > 0) & np.isfinite(yv)]))
    if d.empty:
        return
    g = d.groupby(keys + [x], sort=True)["_ly"].mean().reset_index()
    kv = g[keys].to_numpy(dtype=object)
    xs, ys = g[x].to_numpy(), np.exp(g["_ly"].to_numpy())
    change = np.ones(len(g), dtype=bool)
    change[1:] = (kv[1:] != kv[:-1]).any(axis=1)
    starts = np.flatnonzero(change)
    for a, z in zip(starts, list(starts[1:]) + [len(g)]):
        yield tuple(kv[a]), xs[a:z].tolist(), ys[a:z].tolist()


def convert_gemm(df) -> tuple[list[dict], dict]:
    col = "gemm_dtype" if "gemm_dtype" in df.columns else "dtype"
    tables, dtypes = [], {}
    for (dt, n, k), ms, ts in _grouped(df, [col, "n", "k"], "m"):
        dtype = DTYPE_NAMES.get(str(dt), str(dt))
        tables.append({"op": "gemm", "n": int(n), "k": int(k), "dtype": dtype, "m": [int(m) for m in ms],
                       "time_s": [_ms_to_s(t) for t in ts]})
        dtypes[dtype] = dtypes.get(dtype, 0) + len(ms)
    return tables, {"points_by_dtype": dtypes}


# moe_perf dtypes -> the names pdsim's cost model asks for (fp8 weights of the MoE presets are
# block-scaled, as DeepSeek's and Qwen3's fp8 releases are; per-tensor fp8 is kept apart)
MOE_DTYPES = {"bfloat16": "bf16", "float16": "fp16", "fp8_block": "fp8", "fp8": "fp8_tensor",
              "w4a16_mxfp4": "mxfp4_wo", "nvfp4": "nvfp4"}


def convert_moe(df) -> tuple[list[dict], dict]:
    """``moe_perf`` rows of uniform (``balanced``) routing, one table per shape x split x dtype x gating
    (``moe_torch_flow_nongated`` kernels serve non-gated MLPs).  Skewed distributions are not imported:
    the cost model's routing is uniform (its ``expert_skew`` what-if uses the roofline)."""
    d = df
    if "distribution" in d.columns:
        d = d[d["distribution"].astype(str) == "balanced"]
    src = d["kernel_source"].astype(str) if "kernel_source" in d.columns else None
    d = d.assign(_gated=~src.str.contains("nongated") if src is not None else True)
    tables, dtypes = [], {}
    keys = ["moe_dtype", "hidden_size", "inter_size", "topk", "num_experts", "moe_tp_size", "moe_ep_size", "_gated"]
    for (dt, h, w, k, e, mtp, mep, gated), xs, ts in _grouped(d, keys, "num_tokens"):
        dtype = MOE_DTYPES.get(str(dt), str(dt))
        tables.append({"hidden": int(h), "inter": int(w), "topk": int(k), "experts": int(e), "moe_tp": int(mtp),
                       "moe_ep": int(mep), "gated": bool(gated), "dtype": dtype, "distribution": "balanced",
                       "tokens": [int(x) for x in xs], "time_s": [_ms_to_s(t) for t in ts]})
        dtypes[dtype] = dtypes.get(dtype, 0) + len(xs)
    return tables, {"points_by_dtype": dtypes, "distribution": "balanced only"}


def _attn_filter(df, dropped: dict):
    """Plain full attention only: no sliding window, beam 1."""
    keep = df
    for col, val in (("window_size", 0), ("beam_width", 1)):
        if col in keep.columns:
            n0 = len(keep)
            keep = keep[keep[col] == val]
            if len(keep) < n0:
                dropped[f"{col}!={val}"] = dropped.get(f"{col}!={val}", 0) + n0 - len(keep)
    return keep


def convert_context_attention(df) -> tuple[list[dict], dict]:
    """Prefill attention, keyed (q_heads, kv_heads, head_dim, dtype, batch); dtype is the compute
    dtype where it equals the KV-cache dtype (bf16 or fp8); mixed rows are dropped (counted)."""
    dropped: dict = {}
    df = _attn_filter(df, dropped)
    if "step" in df.columns:
        n0 = len(df)
        df = df[df["step"] == 0]          # no earlier KV: a whole prompt
        if len(df) < n0:
            dropped["step!=0 (prefix in cache)"] = n0 - len(df)
    if "kv_cache_dtype" in df.columns and "attn_dtype" in df.columns:
        same = df["attn_dtype"] == df["kv_cache_dtype"]
        if (~same).any():
            dropped["attn_dtype!=kv_cache_dtype"] = int((~same).sum())
        df = df[same]
    dcol = "attn_dtype" if "attn_dtype" in df.columns else None
    tables = []
    keys = ["num_heads", "num_key_value_heads", "head_dim", "batch_size"] + ([dcol] if dcol else [])
    for key, seqs, ts in _grouped(df, keys, "isl"):
        qh, kvh, d, b = (int(v) for v in key[:4])
        dtype = DTYPE_NAMES.get(str(key[4]), str(key[4])) if dcol else "bf16"
        if seqs:
            tables.append({"q_heads": qh, "kv_heads": kvh, "head_dim": d, "dtype": dtype, "batch": b,
                           "seq_len": [int(s) for s in seqs], "time_s": [_ms_to_s(t) for t in ts]})
    return tables, {"rows_dropped": dropped}


def convert_generation_attention(df) -> tuple[list[dict], dict]:
    """Decode attention grids (batch x context), keyed (q_heads, kv_heads, head_dim, KV-cache dtype).

    context = KV tokens each query reads = ``isl + step`` (isl is 1: one new token after ``step``
    cached ones), which is what the cost model asks for (kv_read_tokens / batch)."""
    dropped: dict = {}
    df = _attn_filter(df, dropped)
    dcol = "kv_cache_dtype" if "kv_cache_dtype" in df.columns else None
    tables = []
    keys = ["num_heads", "num_key_value_heads", "head_dim"] + ([dcol] if dcol else [])
    ctx = (df["isl"] if "isl" in df.columns else 1) + df["step"]
    df = df.assign(_ctx=ctx)
    by_key: dict = {}
    for key, ctxs, ts in _grouped(df, keys + ["batch_size"], "_ctx"):
        by_key.setdefault(key[:-1], {}).update({(int(key[-1]), int(c)): t for c, t in zip(ctxs, ts)})
    for key, cells in by_key.items():
        qh, kvh, d = (int(v) for v in key[:3])
        dtype = DTYPE_NAMES.get(str(key[3]), str(key[3])) if dcol else "bf16"
        bs = sorted({b for b, _ in cells})
        cs = sorted({c for _, c in cells})
        grid = [[_ms_to_s(cells[b, c]) if (b, c) in cells else None for c in cs] for b in bs]
        tables.append({"q_heads": qh, "kv_heads": kvh, "head_dim": d, "dtype": dtype, "batch": bs,
                       "context": cs, "time_s": grid})
    return tables, {"rows_dropped": dropped, "context": "isl + step (KV tokens read per sequence)"}


# MLA kernel tables: aiconfigurator-core times its MLA kernels with DeepSeek-V3's head dims (its sdk's
# deepseek model asks them for 128 / tp heads per GPU); ``num_heads`` is the heads on one GPU
MLA_DIMS = {"kv_lora_rank": 512, "qk_rope_head_dim": 64, "qk_nope_head_dim": 128, "v_head_dim": 128}


def _mla_filter(df, dropped: dict):
    """bf16 MLA compute (the only kind measured), beam 1; ``kv_cache_dtype`` is the key's dtype."""
    for col, ok in (("mla_dtype", ("bfloat16",)), ("beam_width", (1,))):
        if col in df.columns:
            bad = ~df[col].isin(ok)
            if bad.any():
                dropped[f"{col} not in {ok}"] = int(bad.sum())
            df = df[~bad]
    return df


def convert_context_mla(df) -> tuple[list[dict], dict]:
    """MLA prefill attention per (heads per GPU, KV-cache dtype, batch) over the prompt length."""
    dropped: dict = {}
    df = _mla_filter(df, dropped)
    if "step" in df.columns:
        n0 = len(df)
        df = df[df["step"] == 0]
        if len(df) < n0:
            dropped["step!=0 (prefix in cache)"] = n0 - len(df)
    tables = []
    for (h, dt, b), seqs, ts in _grouped(df, ["num_heads", "kv_cache_dtype", "batch_size"], "isl"):
        tables.append({"heads": int(h), **MLA_DIMS, "dtype": DTYPE_NAMES.get(str(dt), str(dt)), "batch": int(b),
                       "seq_len": [int(x) for x in seqs], "time_s": [_ms_to_s(t) for t in ts]})
    return tables, {"rows_dropped": dropped, "heads": sorted({t["heads"] for t in tables})}


def convert_generation_mla(df) -> tuple[list[dict], dict]:
    """MLA decode attention grids (batch x context = isl + step KV tokens) per (heads per GPU, KV dtype)."""
    dropped: dict = {}
    df = _mla_filter(df, dropped)
    df = df.assign(_ctx=(df["isl"] if "isl" in df.columns else 1) + df["step"])
    by_key: dict = {}
    for key, ctxs, ts in _grouped(df, ["num_heads", "kv_cache_dtype", "batch_size"], "_ctx"):
        by_key.setdefault(key[:-1], {}).update({(int(key[-1]), int(c)): t for c, t in zip(ctxs, ts)})
    tables = []
    for (h, dt), cells in by_key.items():
        bs, cs = sorted({b for b, _ in cells}), sorted({c for _, c in cells})
        tables.append({"heads": int(h), **MLA_DIMS, "dtype": DTYPE_NAMES.get(str(dt), str(dt)), "batch": bs,
                       "context": cs,
                       "time_s": [[_ms_to_s(cells[b, c]) if (b, c) in cells else None for c in cs] for b in bs]})
    return tables, {"rows_dropped": dropped, "heads": sorted({t["heads"] for t in tables}),
                    "context": "isl + step (KV tokens read per sequence)"}


A2A_BACKENDS = {"trtllm_deepep_ht": "ht", "trtllm_deepep_ll": "ll", "deepep_ht": "ht", "deepep_ll": "ll"}


def convert_moe_a2a(df) -> tuple[list[dict], dict]:
    """DeepEP dispatch / combine per (backend, phase, wire dtype, ep, hidden, top-k, experts) over the tokens
    on one GPU; one node only (the cost model's instance is one NVLink domain).  Latency in us -> s."""
    dropped: dict = {}
    d = df
    if "node_num" in d.columns:
        bad = d["node_num"] != 1
        if bad.any():
            dropped["node_num!=1"] = int(bad.sum())
        d = d[~bad]
    known = d["comm_backend"].astype(str).isin(list(A2A_BACKENDS))
    if (~known).any():
        dropped["comm_backend not DeepEP ht/ll"] = int((~known).sum())
    d = d[known]
    tables, dtypes = [], {}
    keys = ["comm_backend", "phase", "comm_dtype", "ep_size", "hidden_size", "topk", "num_experts"]
    for (be, ph, dt, ep, h, k, e), xs, ts in _grouped(d, keys, "num_tokens"):
        dtype = DTYPE_NAMES.get(str(dt), str(dt))
        tables.append({"backend": A2A_BACKENDS[str(be)], "phase": str(ph), "dtype": dtype, "ep": int(ep),
                       "hidden": int(h), "topk": int(k), "experts": int(e), "tokens": [int(x) for x in xs],
                       "time_s": [_sig(float(t) * 1e-6) for t in ts]})
        dtypes[dtype] = dtypes.get(dtype, 0) + len(xs)
    return tables, {"rows_dropped": dropped, "points_by_dtype": dtypes,
                    "units": "latency in microseconds (transmit_us); tokens = num_tokens on each GPU"}


def convert_allreduce(df, impl: str, elem_bytes_by_dtype: dict[str, float]) -> tuple[list[dict], dict]:
    if "op_name" in df.columns:
        df = df[df["op_name"] == "all_reduce"]
    dcol = next((c for c in ("allreduce_dtype", "nccl_dtype", "dtype") if c in df.columns), None)
    kept, dropped = [], set()
    if dcol is not None:
        mask = df[dcol].map(lambda v: str(v) in elem_bytes_by_dtype)
        dropped = set(map(str, df[~mask][dcol].unique()))
        df = df[mask]
    tables = []
    for tp, g in df.groupby("num_gpus", sort=True):
        eb = g[dcol].map(lambda v: elem_bytes_by_dtype[str(v)]) if dcol else 2.0
        bytes_, ts = _geo_merge(zip((g["message_size"] * eb).astype(float), g["latency"].astype(float)))
        if bytes_:
            tables.append({"kind": "allreduce", "tp": int(tp), "impl": impl, "bytes": [float(b) for b in bytes_],
                           "time_s": [_ms_to_s(t) for t in ts]})
            kept.append(int(tp))
    return tables, {"tp": kept, "dtypes_dropped": sorted(dropped)}


def _base_profile(system: str, sys_yaml: Path) -> tuple[dict, str | None]:
    """Peaks, memory and NVLink from the package's system file; price and roofline efficiencies
    from the matching pdsim preset when there is one."""
    raw = yaml.safe_load(sys_yaml.read_text()) or {}
    gpu, node = raw.get("gpu") or {}, raw.get("node") or {}
    preset = PRESET_FOR_SYSTEM.get(system)
    base = get_device(preset).spec.model_dump() if preset in preset_names() else None
    peaks = {}
    for key, name in (("bfloat16_tc_flops", "bf16"), ("fp16_tc_flops", "fp16"), ("fp8_tc_flops", "fp8"),
                      ("int8_tc_flops", "int8"), ("fp4_tc_flops", "fp4"), ("nvfp4_tc_flops", "nvfp4")):
        if gpu.get(key):
            peaks[name] = float(gpu[key]) / 1e12
    if "bf16" in peaks:
        peaks.setdefault("fp16", peaks["bf16"])
    if not peaks or not gpu.get("mem_bw") or not gpu.get("mem_capacity"):
        raise ConfigError("system file lacks gpu peaks, mem_bw or mem_capacity", file=str(sys_yaml))
    spec = {
        "name": f"{system}", "kind": "gpu",
        "memory_GiB": round(float(gpu["mem_capacity"]) / GiB, 3),
        "memory_bandwidth_GBps": float(gpu["mem_bw"]) / 1e9,
        "peak_tflops": peaks,
        "interconnect": {"name": "nvlink" if node.get("intra_node_bw", 0) > 1e11 else "pcie",
                         "bandwidth_GBps": float(node.get("intra_node_bw") or node.get("pcie_bw") or 64e9) / 1e9,
                         "latency_us": float(node.get("p2p_latency", 1e-5)) * 1e6},
        "price_per_hour_usd": base["price_per_hour_usd"] if base else 0.0,
    }
    if base:
        spec["efficiency"] = base["efficiency"]
    if gpu.get("power") and base and base.get("power"):      # energy (pdsim/energy.py): TDP from the system file
        spec["power"] = {"idle_W": base["power"]["idle_W"], "max_W": float(gpu["power"]),
                         "source": f"max_W: TDP in aiconfigurator-core's {system} system file; idle_W: pdsim preset "
                                   f"{preset}'s estimate, NOT measured"}
    return spec, preset if base else None


def _preset_note(preset: str | None) -> str:
    if preset:
        return f"price and roofline efficiencies (used where no table covers a shape) from pdsim preset {preset}"
    return ("no pdsim preset for this GPU: price_per_hour_usd is 0 (set it for cost figures) and the roofline "
            "efficiencies are pdsim's defaults")


def import_aiconfigurator(system: str, backend: str, version: str | None = None,
                          systems_dir: Path | None = None, package_version: str | None = None) -> dict:
    """The profile (a plain dict, valid :class:`ProfileSpec`) for one system x backend x version."""
    t0 = time.perf_counter()
    if systems_dir is None:
        systems_dir, package_version = aic_systems_dir()
    systems_dir = Path(systems_dir)
    inv = aic_inventory(systems_dir)
    with_data = sorted(s for s, f in inv.items() if f["gemm"] or f["attention"])
    if system not in with_data:
        raise ConfigError(f"no measured data for this system in aiconfigurator-core {package_version}; "
                          f"available: {', '.join(with_data)}", key="--system", value=system)
    fams = inv[system]
    backends = sorted(set(fams["gemm"]) | set(fams["attention"]))
    if backend not in backends:
        raise ConfigError(f"no data for this backend on {system}; available: {', '.join(backends)}",
                          key="--backend", value=backend)
    own = sorted(set(fams["gemm"].get(backend, [])) | set(fams["attention"].get(backend, [])), key=_version_key)
    if version is not None and version not in own:
        raise ConfigError(f"no {backend} data of this version on {system}; available: {', '.join(own)}",
                          key="--version", value=version)
    version = version or own[-1]
    data = systems_dir / "data" / system
    used, fallback, notes = {}, [], []
    measured: dict = {"format": 1, "device": "cuda", "tp": [1], "gemm_nk_grid": True, "gemm": [],
                      "attention_prefill": [], "attention_decode": [], "transfers": []}
    details: dict = {}

    def folder(fam, be):
        v = _pick_version(fams[fam].get(be, []), version if be == backend else None)
        return (data / fam / be / v, v) if v else (None, None)

    g_dir, g_v = folder("gemm", backend)
    f = _table_file(g_dir, "gemm_perf") if g_dir else None
    if f is not None:
        measured["gemm"], details["gemm"] = convert_gemm(_read_table(f))
        used["gemm"] = f"gemm/{backend}/{g_v}/{f.name}"
    else:
        fallback.append("gemm")
    a_dir, a_v = folder("attention", backend)
    for op, stem, conv in (("attention_prefill", "context_attention_perf", convert_context_attention),
                           ("attention_decode", "generation_attention_perf", convert_generation_attention)):
        f = _table_file(a_dir, stem) if a_dir else None
        if f is not None:
            measured[op], details[op] = conv(_read_table(f))
            used[op] = f"attention/{backend}/{a_v}/{f.name}"
        if not measured[op]:
            fallback.append(op)
    # all-reduce: NCCL (the version the system file names, else the newest) and the backend's custom kernel
    sys_raw = yaml.safe_load((systems_dir / f"{system}.yaml").read_text()) or {}
    nccl_v = _pick_version(fams["comm"].get("nccl", []), str((sys_raw.get("misc") or {}).get("nccl_version", "")) or None)
    sizes = {"bfloat16": 2.0, "half": 2.0, "float16": 2.0, "fp16": 2.0, "bf16": 2.0}
    if nccl_v:
        f = _table_file(data / "comm" / "nccl" / nccl_v, "nccl_perf")
        if f is not None:
            tabs, details["allreduce_nccl"] = convert_allreduce(_read_table(f), "nccl", sizes)
            measured["transfers"] += tabs
            used["allreduce_nccl"] = f"comm/nccl/{nccl_v}/{f.name}"
    c_v = _pick_version(fams["comm"].get(backend, []), version)
    c_file = _table_file(data / "comm" / backend / c_v, "custom_allreduce_perf") if c_v else None
    if c_file is None and c_v:    # the newest earlier version that has the table
        for v in reversed(fams["comm"].get(backend, [])):
            if _version_key(v) <= _version_key(c_v) and _table_file(data / "comm" / backend / v, "custom_allreduce_perf"):
                c_v, c_file = v, _table_file(data / "comm" / backend / v, "custom_allreduce_perf")
                break
    if c_file is not None:
        tabs, details["allreduce_custom"] = convert_allreduce(_read_table(c_file), "custom", sizes)
        measured["transfers"] += tabs
        used["allreduce_custom"] = f"comm/{backend}/{c_v}/{c_file.name}"
    if not any(t["kind"] == "allreduce" for t in measured["transfers"]):
        fallback.append("allreduce")
    m_dir, m_v = folder("moe", backend) if "moe" in fams else (None, None)
    f = _table_file(m_dir, "moe_perf") if m_dir else None
    if f is not None:
        measured["moe"], details["moe"] = convert_moe(_read_table(f))
        used["moe"] = f"moe/{backend}/{m_v}/{f.name}"
    if not measured.get("moe"):
        measured.pop("moe", None)
        fallback.append("moe")
    l_dir, l_v = folder("mla", backend) if "mla" in fams else (None, None)
    for op, stem, conv in (("mla_prefill", "context_mla_perf", convert_context_mla),
                           ("mla_decode", "generation_mla_perf", convert_generation_mla)):
        f = _table_file(l_dir, stem) if l_dir else None
        if f is not None:
            measured[op], details[op] = conv(_read_table(f))
            used[op] = f"mla/{backend}/{l_v}/{f.name}"
        if not measured.get(op):
            measured.pop(op, None)
            fallback.append(op)
    # all-to-all: the newest version of the backend's comm folder, not newer than the backend's, that has it
    x_v, x_file = None, None
    for v in reversed(fams["comm"].get(backend, [])):
        if _version_key(v) <= _version_key(version) and _table_file(data / "comm" / backend / v, "moe_a2a_perf"):
            x_v, x_file = v, _table_file(data / "comm" / backend / v, "moe_a2a_perf")
            break
    if x_file is not None:
        measured["alltoall"], details["alltoall"] = convert_moe_a2a(_read_table(x_file))
        used["alltoall"] = f"comm/{backend}/{x_v}/{x_file.name}"
    if not measured.get("alltoall"):
        measured.pop("alltoall", None)
        fallback.append("alltoall")
    fallback += ["kv_transfer (device_copy, h2d, d2h: not in the package)"]
    measured["tp"] = sorted({t["tp"] for t in measured["transfers"]} | {1})

    spec, preset = _base_profile(system, systems_dir / f"{system}.yaml")
    date = _dt.date.today().isoformat()
    spec["name"] = f"{system}-{backend}-{version}-aic"
    spec["source"] = (f"measured: NVIDIA aiconfigurator-core {package_version} perf database (Apache-2.0), "
                      f"system {system}, backend {backend} {version}; imported by pdsim profile import on {date}")
    if g_v and g_v != version or a_v and a_v != version:
        notes.append(f"tables of another version used: gemm {g_v}, attention {a_v}")
    if c_v and c_v != version:
        notes.append(f"custom all-reduce table from {backend} {c_v} (none for {version})")
    if x_v and x_v != version:
        notes.append(f"all-to-all (moe_a2a) table from {backend} {x_v} (none for {version})")
    if measured.get("mla_prefill") or measured.get("mla_decode"):
        notes.append("MLA tables: DeepSeek-V3's head dims (kv_lora_rank 512, rope 64, nope 128, v 128), as "
                     "aiconfigurator-core's sdk uses them; heads = query heads on one GPU; bf16 MLA compute")
    gemm_n = sorted({t["n"] for t in measured["gemm"]})
    gemm_k = sorted({t["k"] for t in measured["gemm"]})
    spec["measured"] = measured
    spec["meta"] = {
        "imported_from": {"package": "aiconfigurator-core", "package_version": package_version,
                          "license": "Apache-2.0", "system": system, "backend": backend, "version": version,
                          "nccl_version": nccl_v, "tables": used, "date": date},
        "fallback_to_roofline": fallback,
        "coverage": {
            "gemm": f"(n, k) grid n {gemm_n[0]}..{gemm_n[-1]}, k {gemm_k[0]}..{gemm_k[-1]}; shapes outside it "
                    "and m beyond each curve use the roofline" if gemm_n else "none",
            "attention": "full attention (window 0), beam 1; prefill from an empty cache; decode context = KV tokens read",
            "allreduce": "bytes = message_size elements x 2 (bf16/half rows only); tp values as measured",
            "mla": "context: prompts from an empty cache by batch; generation: batch x context (isl + step)",
            "alltoall": "DeepEP ht (high-throughput) and ll (low-latency) dispatch and combine, one node",
        },
        "details": details,
        "rounding": f"times rounded to {SIG_DIGITS} significant digits",
        "not_imported": _not_imported(data),
        "preset_for_price_and_roofline_efficiency": preset,
        "notes": notes + [_preset_note(preset)],
    }
    _downsample_to_fit(spec)
    spec["meta"]["import_wall_s"] = round(time.perf_counter() - t0, 2)
    ProfileSpec.model_validate(spec)    # internal invariant: what we write loads back
    return spec


def _not_imported(data: Path) -> list[str]:
    fams = sorted(p.name for p in data.iterdir() if p.is_dir()) if data.is_dir() else []
    skip = [f for f in fams if f not in ("gemm", "attention", "comm", "moe", "mla")]
    return skip + ["attention: encoder/sliding-window tables", "mla: module tables (projections included), "
                   "sglang wideep tables", "comm: all_gather, reduce_scatter, trtllm_alltoall",
                   "moe: skewed (power-law) routing distributions"]


def dump_profile(spec: dict) -> str:
    """YAML with each list of numbers on one line (a profile holds ~10^5 of them)."""
    dumper = getattr(yaml, "CSafeDumper", yaml.SafeDumper)
    head = {k: v for k, v in spec.items() if k not in ("measured", "meta")}
    text = yaml.dump(head, Dumper=dumper, sort_keys=False, default_flow_style=False, width=120)
    text += yaml.dump({"meta": spec.get("meta")}, Dumper=dumper, sort_keys=False, default_flow_style=False,
                      width=120)
    # measured: one table per line as JSON (valid YAML flow style), which loads fast
    # (pdsim.devices._load_yaml_fast) and keeps each table one diffable line
    lines = ["measured:"]
    for key, val in spec["measured"].items():
        if isinstance(val, list) and val and isinstance(val[0], dict):
            lines.append(f"  {key}:")
            lines += [f"  - {_yaml_floats(json.dumps(row, separators=(', ', ': ')))}" for row in val]
        else:
            lines.append(f"  {key}: {_yaml_floats(json.dumps(val))}")
    return text + "\n".join(lines) + "\n"


def _yaml_floats(js: str) -> str:
    """``4e-06`` -> ``4.0e-06``: both JSON, but YAML 1.1 (PyYAML) reads a float only with a dot."""
    return re.sub(r"(?<![\d.])(\d+)e([-+]\d+)", r"\1.0e\2", js)


def _downsample_to_fit(spec: dict, limit: int = MAX_PROFILE_BYTES) -> None:
    """Drop every other interior GEMM m point (and then prefill batch tables) until the YAML fits;
    say what was dropped in ``meta.downsampled``."""
    meas, dropped = spec["measured"], []
    for _ in range(6):
        size = len(dump_profile(spec).encode())
        if size <= limit:
            break
        n0 = sum(len(t["m"]) for t in meas["gemm"])
        for t in meas["gemm"]:
            if len(t["m"]) > 8:
                keep = [i for i in range(len(t["m"])) if i % 2 == 0 or i == len(t["m"]) - 1]
                t["m"] = [t["m"][i] for i in keep]
                t["time_s"] = [t["time_s"][i] for i in keep]
        n1 = sum(len(t["m"]) for t in meas["gemm"])
        dropped.append(f"{size / 1e6:.1f} MB > {limit / 1e6:.1f} MB: kept every other interior GEMM m point "
                       f"({n0} -> {n1} points)")
        if n1 == n0:
            break
    spec["meta"]["downsampled"] = dropped or "nothing dropped"


# --- Vidur -------------------------------------------------------------------------------------
VIDUR_OPS = ("attn_pre_proj", "attn_post_proj", "mlp_up_proj", "mlp_down_proj")
VIDUR_PRESETS = {"a100": "a100-80gb-sxm", "h100": "h100-sxm"}
VIDUR_NETWORK = {"a100": "a100_dgx", "h100": "h100_dgx"}


def _vidur_root(path: Path) -> Path:
    """Accept the profiling folder itself or any parent of ``data/profiling``."""
    for cand in (path, path / "profiling", path / "data" / "profiling", path / "measured" / "data" / "profiling"):
        if (cand / "compute").is_dir() or (cand / "network").is_dir():
            return cand
    raise ConfigError("not a Vidur profiling folder (expected compute/ or network/ under it)", file=str(path))


def _vidur_gemm_shapes(df, op: str):
    """Per-GPU (n, k) columns of one linear op of Vidur's one-layer model, sharded by tp."""
    h, qh, kvh = df["n_embd"].astype(int), df["n_head"].astype(int), df["n_kv_head"].astype(int)
    f, tp = df["n_expanded_embd"].astype(int), df["num_tensor_parallel_workers"].astype(int)
    d = h // qh
    gated = df["use_gated_mlp"].astype(str).str.lower().isin(["true", "1"]) if "use_gated_mlp" in df.columns \
        else True
    return {"attn_pre_proj": ((qh + 2 * kvh) * d // tp, h), "attn_post_proj": (h, qh * d // tp),
            "mlp_up_proj": ((1 + gated * 1) * f // tp, h), "mlp_down_proj": (h, f // tp)}[op]


def import_vidur(path: str | Path, gpu: str) -> dict:
    """A profile from Vidur's CSVs for one GPU SKU (``a100`` or ``h100``): per-layer linear GEMMs of
    every model's ``compute/<gpu>/**/mlp.csv``, the legacy ``<gpu>/attention.csv`` when present, and
    the single-node NCCL all-reduce of ``network/<gpu>_dgx``.  Times are medians in ms -> s."""
    import pandas as pd
    t0 = time.perf_counter()
    root = _vidur_root(Path(path))
    gpus = sorted(p.name for p in (root / "compute").iterdir() if p.is_dir()) if (root / "compute").is_dir() else []
    supported = [g for g in gpus if g in VIDUR_PRESETS]
    if gpu not in supported:
        raise ConfigError(f"no Vidur compute data for this GPU here (a pdsim preset is needed too); available: "
                          f"{', '.join(supported) or 'none'}", key="--gpu", value=gpu)
    pts: dict = {}
    models = []
    for csv in sorted((root / "compute" / gpu).glob("**/mlp.csv")) + sorted((root / gpu).glob("mlp.csv")):
        df = pd.read_csv(csv)
        models.append(str(csv.parent.relative_to(root)))
        for op in VIDUR_OPS:
            col = f"time_stats.{op}.median"
            if col not in df.columns:
                continue
            n, k = _vidur_gemm_shapes(df, op)
            for nn, kk, m, t in zip(n.tolist(), k.tolist(), df["num_tokens"].astype(int).tolist(),
                                    df[col].astype(float).tolist()):
                pts.setdefault((nn, kk), []).append((m, t))
    gemm = []
    for (n, k), p in sorted(pts.items()):
        ms, ts = _geo_merge(p)
        gemm.append({"op": "gemm", "n": n, "k": k, "dtype": "bf16", "m": ms, "time_s": [_ms_to_s(t) for t in ts]})
    pre, dec, used = [], [], {"gemm": models}
    att = root / gpu / "attention.csv"
    if att.is_file():
        pre, dec = _vidur_attention(pd.read_csv(att))
        used["attention"] = str(att.relative_to(root))
    transfers = []
    net = root / "network" / VIDUR_NETWORK[gpu] / "all_reduce.csv"
    if net.is_file():
        nd = pd.read_csv(net)
        nd = nd[nd["num_workers"] == nd["devices_per_node"]]          # one node
        tcol = next(c for c in nd.columns if c.endswith("median"))
        for tp, g in nd.groupby("num_workers"):
            bs, ts = _geo_merge(zip(g["size"].astype(float), g[tcol].astype(float)))
            transfers.append({"kind": "allreduce", "tp": int(tp), "impl": "nccl", "bytes": bs,
                              "time_s": [_ms_to_s(t) for t in ts]})
        used["allreduce"] = str(net.relative_to(root))
    base = get_device(VIDUR_PRESETS[gpu]).spec.model_dump()
    date = _dt.date.today().isoformat()
    fallback = [op for op, have in (("attention_prefill", pre), ("attention_decode", dec), ("allreduce", transfers))
                if not have] + ["gemm: shapes of other models and lm_head", "kv_transfer (device_copy, h2d, d2h)"]
    spec = {**{k: base[k] for k in ("kind", "memory_GiB", "memory_bandwidth_GBps", "peak_tflops", "interconnect",
                                    "price_per_hour_usd", "efficiency")},
            **({"power": base["power"]} if base.get("power") else {}),     # the preset's (datasheet TDP)
            "name": f"{gpu}-vidur",
            "source": (f"measured: Vidur profiling data (microsoft/vidur, MIT), GPU {gpu}, fp16, one layer, "
                       f"Sarathi-Serve kernels; peaks/memory/price from pdsim preset {VIDUR_PRESETS[gpu]} (datasheet); "
                       f"imported by pdsim profile import on {date}"),
            "measured": {"format": 1, "device": "cuda", "tp": sorted({1} | {t["tp"] for t in transfers}),
                         "gemm": gemm, "attention_prefill": pre, "attention_decode": dec, "transfers": transfers},
            "meta": {"imported_from": {"data": "Vidur profiling CSVs", "license": "MIT", "gpu": gpu, "tables": used,
                                       "date": date},
                     "fallback_to_roofline": fallback,
                     "notes": ["Vidur measured fp16; tables are stored under dtype bf16 (same tensor-core peak on "
                               "A100/H100), so a bf16 cost model uses them",
                               "GEMMs are the exact per-GPU (tp-sharded) shapes of the models listed in tables.gemm; "
                               "not a grid: other shapes use the roofline",
                               ("decode context = kv_cache_size + 1 (KV tokens read); attention is of the legacy "
                                "CodeLlama-34B/Llama-2-70B shape at TP2 (32 q / 4 kv heads, head_dim 128)") if pre or dec
                               else f"no attention table for {gpu} in this Vidur data: attention uses the roofline",
                               "GPU SKU as Vidur names it; Vidur's docs do not say SXM or PCIe for compute data"],
                     "rounding": f"times rounded to {SIG_DIGITS} significant digits"}}
    spec["meta"]["import_wall_s"] = round(time.perf_counter() - t0, 2)
    ProfileSpec.model_validate(spec)
    return spec


def _vidur_attention(df) -> tuple[list[dict], list[dict]]:
    h, qh, kvh, tp = int(df["n_embd"].iloc[0]), int(df["n_q_head"].iloc[0]), int(df["n_kv_head"].iloc[0]), \
        int(df["num_tensor_parallel_workers"].iloc[0])
    d, q, kv = h // qh, qh // tp, max(1, kvh // tp)
    p = df[(df["is_prefill"]) & (df["kv_cache_size"] == 0) & (df["batch_size"] == 1)]
    seqs, ts = _geo_merge(zip(p["prefill_chunk_size"].astype(int), p["time_stats.attn_prefill.median"].astype(float)))
    pre = [{"q_heads": q, "kv_heads": kv, "head_dim": d, "dtype": "bf16", "seq_len": seqs,
            "time_s": [_ms_to_s(t) for t in ts]}] if seqs else []
    dd = df[~df["is_prefill"].astype(bool)]
    cells: dict = {}
    for b, c, t in zip(dd["batch_size"].astype(int), dd["kv_cache_size"].astype(int) + 1,
                       dd["time_stats.attn_decode.median"].astype(float)):
        if t > 0:
            cells.setdefault((b, c), []).append(t)
    bs, cs = sorted({b for b, _ in cells}), sorted({c for _, c in cells})
    grid = [[_ms_to_s(math.exp(sum(map(math.log, cells[b, c])) / len(cells[b, c]))) if (b, c) in cells else None
             for c in cs] for b in bs]
    dec = [{"q_heads": q, "kv_heads": kv, "head_dim": d, "dtype": "bf16", "batch": bs, "context": cs,
            "time_s": grid}] if cells else []
    return pre, dec


# --- listing --------------------------------------------------------------------------------------
def list_profiles(out=None, systems_dir: Path | None = None, profiles_dir: Path | None = None) -> None:
    """Print aiconfigurator-core's systems x backends x versions, committed profiles and presets."""
    out = out or sys.stdout
    try:
        if systems_dir is None:
            systems_dir, pkg_v = aic_systems_dir()
        else:
            pkg_v = "(folder)"
        inv = aic_inventory(Path(systems_dir))
        print(f"aiconfigurator-core {pkg_v}: system  backend: versions (gemm/attention); nccl", file=out)
        for s, fams in inv.items():
            backends = sorted(set(fams["gemm"]) | set(fams["attention"]))
            if not backends:
                print(f"  {s:22s} (no measured data in this package version)", file=out)
                continue
            for b in backends:
                vs = sorted(set(fams["gemm"].get(b, [])) | set(fams["attention"].get(b, [])), key=_version_key)
                print(f"  {s:22s} {b:7s}: {', '.join(vs)}   nccl {', '.join(fams['comm'].get('nccl', [])) or '-'}",
                      file=out)
    except ConfigError as exc:
        print(f"aiconfigurator-core: {exc}", file=out)
    pdir = profiles_dir or next((d for d in (Path.cwd() / "calibration" / "profiles",
                                             Path(__file__).resolve().parents[1] / "calibration" / "profiles")
                                 if d.is_dir()), Path("calibration/profiles"))
    print(f"\nprofiles in {pdir} (device: path/to/profile.yaml):", file=out)
    for p in sorted(pdir.glob("*.yaml")) if pdir.is_dir() else []:
        # only the head of the file (before its tables): listing must not load ~10 MB of tables
        text = p.read_text(errors="replace")
        m = re.search(r"^measured:", text, flags=re.M)
        try:
            head = yaml.safe_load(text[:m.start()] if m else text) or {}
        except yaml.YAMLError:
            head = {}
        src = str(head.get("source", "(no source: not a valid profile)")) if isinstance(head, dict) else "?"
        print(f"  {p.name:42s} {'measured' if m else 'datasheet':9s} {src[:100]}", file=out)
    print("\ndatasheet presets (device: NAME):", file=out)
    for name in preset_names():
        dev = get_device(name)
        print(f"  {name:42s} {'measured' if dev.is_measured else 'datasheet':9s} {dev.source[:100]}", file=out)


# --- command line ---------------------------------------------------------------------------------
def _write(spec: dict, out: Path) -> None:
    text = dump_profile(spec)
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(text)
    except OSError as exc:
        raise ConfigError(f"cannot write the profile: {exc.strerror}", key="--out", value=str(out)) from None
    print(f"wrote {out} ({len(text.encode()) / 1e6:.2f} MB, {spec['meta']['import_wall_s']} s); "
          f"roofline fallback for: {', '.join(spec['meta']['fallback_to_roofline']) or 'nothing'}", file=sys.stderr)


def cmd_profile(args) -> int:
    if args.profile_cmd == "list":
        list_profiles(systems_dir=Path(args.data_dir) if args.data_dir else None)
        return 0
    if args.source == "aiconfigurator":
        if not args.system or not args.backend:
            raise ConfigError("give --system and --backend (see pdsim profile list)", key="profile import aiconfigurator")
        sdir = Path(args.data_dir) if args.data_dir else None
        if sdir is not None and not sdir.is_dir():
            raise ConfigError("folder not found", key="--data-dir", value=args.data_dir)
        spec = import_aiconfigurator(args.system, args.backend, args.version, sdir,
                                     package_version=None if sdir is None else f"(folder {sdir})")
    else:
        if not args.path:
            raise ConfigError("give the Vidur profiling folder", key="profile import vidur")
        spec = import_vidur(args.path, args.gpu)
    _write(spec, Path(args.out))
    return 0


def add_parser(sub) -> None:
    p = sub.add_parser("profile", help="list device profiles; import public measured kernel databases")
    ps = p.add_subparsers(dest="profile_cmd", required=True)
    ls = ps.add_parser("list", help="systems x backends x versions in aiconfigurator-core, committed profiles, presets")
    ls.add_argument("--data-dir", help="an aiconfigurator 'systems' folder instead of the installed package")
    ls.set_defaults(fn=cmd_profile)
    im = ps.add_parser("import", help="convert a public kernel database into a measured profile")
    im.add_argument("source", choices=["aiconfigurator", "vidur"])
    im.add_argument("path", nargs="?", help="vidur: the profiling folder (e.g. .../vidur/measured/data/profiling)")
    im.add_argument("--system", help="aiconfigurator system, e.g. h100_sxm (pdsim profile list)")
    im.add_argument("--backend", help="trtllm, vllm or sglang")
    im.add_argument("--version", help="backend version (default: the newest in the package)")
    im.add_argument("--gpu", default="a100", help="vidur: GPU SKU folder (a100, h100)")
    im.add_argument("--data-dir", help="an aiconfigurator 'systems' folder instead of the installed package")
    im.add_argument("--out", required=True, metavar="PROFILE.yaml", help="where to write the measured device profile")
    im.set_defaults(fn=cmd_profile)
