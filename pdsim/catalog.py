"""``pdsim list models|devices|links|engines|scenarios``: what pdsim knows, with the numbers that matter for sizing.

Each listing is a list of flat dicts (``--format json`` prints them as they are); units are in the keys.
A device says whether its numbers were measured here (``pdsim calibrate``) or taken from a datasheet.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

from .errors import ConfigError

KINDS = ("models", "devices", "links", "engines", "scenarios")


def models() -> list[dict]:
    from .models import PRESETS
    return [{"name": m.name, "params_B": round(m.params / 1e9, 3),
             "active_params_B": round(m.active_params() / 1e9, 3),
             "experts": f"{m.experts} top-{m.experts_per_token}" + (f" +{m.shared_experts}" if m.shared_experts else "")
             if m.is_moe else "", "attention": "MLA" if m.is_mla else "GQA" if m.kv_heads < m.heads else "MHA",
             "layers": m.layers, "hidden": m.hidden,
             "heads": m.heads, "kv_heads": m.kv_heads, "head_dim": m.head_dim,
             "kv_bytes_per_token_bf16": int(m.kv_bytes_per_token("bf16")),
             "weights_GB_bf16": round(m.weight_bytes("bf16") / 1e9, 2), "max_context_tokens": m.max_context}
            for m in PRESETS.values()]


def _device_row(prof, where: str) -> dict:
    s = prof.spec
    return {"name": s.name, "kind": s.kind, "peak_bf16_TFLOPs": prof.peak_flops("bf16") / 1e12,
            "peak_fp8_TFLOPs": s.peak_tflops.get("fp8"), "hbm_GBps": s.memory_bandwidth_GBps,
            "memory_GiB": s.memory_GiB, "interconnect_GBps": s.interconnect.bandwidth_GBps,
            "price_per_hour_usd": s.price_per_hour_usd,
            "source": "measured" if prof.is_measured else ("datasheet" if s.source.lower().startswith("datasheet")
                                                           else "other"),
            "where": where, "source_note": s.source}


def devices(extra_dirs: list[Path] = ()) -> list[dict]:
    from .devices import DATA_DIR, get_device, load_profile_file, preset_names
    rows = [_device_row(get_device(n), "preset") for n in preset_names()]
    for d in extra_dirs:
        for p in sorted(Path(d).glob("*.yaml")):
            try:
                rows.append(_device_row(load_profile_file(p), str(p)))
            except ConfigError:
                continue            # not a device profile
    assert DATA_DIR.is_dir()
    return rows


def links() -> list[dict]:
    from .config import LINK_PRESETS
    return [{"name": k, "bandwidth_GBps_per_gpu": bw, "latency_us": lat} for k, (bw, lat) in LINK_PRESETS.items()]


def _overhead_kind(source: str) -> str:
    """How an engine preset's step overhead was obtained, from its source note.

    ``fitted-cpu``: fitted to measured CPU/scheduling overheads (a quantity one can profile);
    ``fitted-residual``: fitted to end-to-end TPOT residuals, so it also absorbs cost-model error;
    ``estimate``: neither."""
    if "ESTIMATE" in source:
        return "estimate"
    if "residual" in source.lower():
        return "fitted-residual"
    return "fitted-cpu"


def engines() -> list[dict]:
    """Serving-engine presets (pdsim/engines.py): scheduler defaults, KV sizing basis and the per-step
    CPU overhead base + per running sequence; ``overhead`` says whether that was measured."""
    from .engines import PRESETS
    return [{"name": p.name, "scheduler": p.scheduler, "max_batched_tokens": p.max_batched_tokens,
             "max_running": p.max_running, "block_size_tokens": p.block_size, "memory_fraction": p.memory_fraction,
             "kv_reservation": p.kv_reservation, "overhead_base_us": p.overhead_base_us, "overhead_per_seq_us": p.overhead_per_seq_us,
             "overhead": _overhead_kind(p.source), "source_note": p.source}
            for p in PRESETS.values()]


def scenarios(folder: Path) -> list[dict]:
    from . import config
    rows = []
    for p in sorted(Path(folder).glob("*.yaml")):
        try:
            raw = config.read_yaml(p)
        except ConfigError as exc:
            rows.append({"file": str(p), "name": "", "error": str(exc)})
            continue
        if not isinstance(raw, dict) or not ("search" in raw or "topologies" in raw):
            continue                    # a device profile, a calibration or step-overhead file: not runnable
        kind = "plan" if "search" in raw else "scenario"
        w = raw.get("workload") or {}
        rows.append({"file": str(p), "kind": kind, "name": raw.get("name", p.stem),
                     "model": raw.get("model") if isinstance(raw.get("model"), str) else "inline",
                     "arrival": w.get("arrival"), "rate_req_s": w.get("rate"),
                     "topologies": len(raw.get("topologies") or {}) if kind == "scenario" else None,
                     "description": raw.get("description", "")})
    return rows


def listing(kind: str, where: str | None = None) -> list[dict]:
    if kind == "models":
        return models()
    if kind == "devices":
        dirs = [Path(where)] if where else [d for d in (Path("calibration/profiles"),) if d.is_dir()]
        return devices(dirs)
    if kind == "links":
        return links()
    if kind == "engines":
        return engines()
    if kind == "scenarios":
        folder = Path(where or "scenarios")
        if not folder.is_dir():
            raise ConfigError("no such folder", key="pdsim list scenarios", value=str(folder))
        return scenarios(folder)
    raise ConfigError(f"valid: {', '.join(KINDS)}", key="pdsim list", value=kind)


SHOWN = {"models": ["name", "params_B", "active_params_B", "experts", "attention", "layers", "hidden", "heads", "kv_heads", "kv_bytes_per_token_bf16",
                    "weights_GB_bf16", "max_context_tokens"],
         "devices": ["name", "kind", "peak_bf16_TFLOPs", "peak_fp8_TFLOPs", "hbm_GBps", "memory_GiB",
                     "interconnect_GBps", "price_per_hour_usd", "source", "where"],
         "links": ["name", "bandwidth_GBps_per_gpu", "latency_us"],
         "engines": ["name", "scheduler", "max_batched_tokens", "max_running", "block_size_tokens",
                     "memory_fraction", "kv_reservation", "overhead_base_us", "overhead_per_seq_us", "overhead"],
         "scenarios": ["file", "kind", "name", "model", "arrival", "rate_req_s", "topologies"]}


def print_listing(kind: str, rows: list[dict], fmt: str = "table", out=None) -> None:
    out = out or sys.stdout
    if fmt == "json":
        print(json.dumps(rows, indent=2), file=out)
        return
    cols = SHOWN[kind]

    def f(v):
        if v is None:
            return "-"
        if isinstance(v, float):
            return f"{v:,.4g}" if abs(v) < 1e6 else f"{v:,.0f}"
        if isinstance(v, int) and not isinstance(v, bool):
            return f"{v:,}"
        return str(v)
    cells = [[f(r.get(c)) for c in cols] for r in rows]
    w = [max([len(c)] + [len(r[i]) for r in cells]) for i, c in enumerate(cols)]
    print("  ".join(c.ljust(w[i]) for i, c in enumerate(cols)).rstrip(), file=out)
    for r in cells:
        print("  ".join(v.ljust(w[i]) for i, v in enumerate(r)).rstrip(), file=out)
