"""MoE/MLA end to end: pdsim against the measured MoE serving runs of aiconfigurator-core's silicon sample.

The MoE rows pdsim can express -- DeepSeek-V3/R1, Qwen3-235B-A22B, gpt-oss-120b with fp8 or bf16 weights on
H100/H200/B200, aggregated serving, no pipeline parallelism, attention TP = moe_tp x moe_ep, or DP attention
within one node (attention TP 1 on attention_dp_size GPUs, moe_tp 1, moe_ep = attention_dp_size: a pool with
``dp_attention: true``) -- each simulated as ``pdsim validate`` does (``validate.simulate_row``: closed loop at
the row's concurrency, the engine preset, the harness's length draw -- InferenceMAX rows uniform in [0.8 L, L] --
and client mode ``auto``: the unknown-harness rows' cold first wave left out), with ``ep`` = the row's
moe_ep_size.  Nothing is fitted on these rows (they did choose which MoE kernel constants the presets carry).
``pdsim validate --silicon`` simulates the same rows among the dense ones; this script adds the per-group
table, the KV-bound rows and the MoE error bands.

Needs the ``aic`` extra (aiconfigurator-core, pyarrow).  Prints MAPE of mean TTFT and TPOT per group.

    .venv/bin/python benchmarks/validate_moe_silicon.py [--sample N (default 150, about 100 s)] [--seed S]
        [--dp-attention-only] [--ep-only] [--profiles 'calibration/profiles/*-aic.yaml' [--moe-tables] [--no-mla-tables]
        [--a2a-tables]] [--split train|test] [--frontend ENGINE=US,...] [--csv OUT.csv] [--write-error-table (with --sample 0 only)]
"""
from __future__ import annotations

import argparse
import sys
import zlib
from pathlib import Path

import numpy as np
import pandas as pd

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from pdsim import validate as V  # noqa: E402
from pdsim.errors import ConfigError  # noqa: E402
from pdsim.profile_import import aic_systems_dir  # noqa: E402

MOE_MODELS = {"deepseek-v3": "deepseek-v3", "deepseek-r1": "deepseek-r1", "qwen3-235b-a22b-fp8": "qwen3-235b-a22b",
              "qwen3-235b-a22b": "qwen3-235b-a22b", "qwen3-30b-a3b": "qwen3-30b-a3b",
              "qwen3-30b-a3b-fp8": "qwen3-30b-a3b", "gpt-oss-120b": "gpt-oss-120b", "mixtral-8x7b-v0.1": "mixtral-8x7b"}


def _rows(path: Path) -> tuple[list[dict], dict]:
    d = pd.read_csv(path)
    out, skipped = [], {}

    def skip(why):
        skipped[why] = skipped.get(why, 0) + 1

    for _, x in d.iterrows():
        base = str(x.model_path).split("/")[-1].lower()
        model = MOE_MODELS.get(base)
        if model is None:
            continue
        gpu = V.GPUS.get(str(x.system).lower())
        prec = str(x.moe_quant_mode if x.moe_quant_mode == x.moe_quant_mode else x.gemm_quant_mode).lower()
        if x["mode"] != "agg":
            skip("disaggregated_row")
            continue
        tp, mtp, mep = (int(v) if v == v else 1 for v in (x.tp_size, x.moe_tp_size, x.moe_ep_size))
        adp = int(x.attention_dp_size) if x.attention_dp_size == x.attention_dp_size else 1
        dp_attention = adp > 1 and tp == 1 and mtp == 1 and mep == adp
        if dp_attention:
            tp = adp              # pdsim's pool: tp GPUs, each an attention rank, experts over all of them
        if gpu is None:
            skip("gpu_without_preset")
        elif prec not in ("fp8", "fp8_block", "bf16", "bfloat16"):
            skip("unsupported_precision")
        elif (adp > 1 and not dp_attention) or (x.pp_size == x.pp_size and x.pp_size > 1) \
                or (not dp_attention and tp != mtp * mep):
            skip("dp_attention_or_pp")
        elif tp > 8:
            skip("multi_node_tp")       # pdsim's instance is one NVLink domain of up to 8 GPUs here
        elif not (x.silicon_ttft_ms > 0 and x.silicon_tpot_ms > 0):
            skip("missing_measurement")
        else:
            src = str(x.silicon_data_source)
            conc = int(src.split("silicon_concurrency=")[1].split(";")[0].split(",")[0]) \
                if "silicon_concurrency=" in src else int(x.batch_size)
            wd = "fp8" if prec.startswith("fp8") else "bf16"
            harness, ratio = V.silicon_harness(src, int(x.isl), int(x.osl))
            out.append({"id": x.id, "source": "silicon", "harness": harness, "length_ratio": ratio, "model": model, "device": gpu, "engine": V._engine(x.backend, str(x.backend_version)),
                        "tp": tp, "ep": mep, "dp_attention": dp_attention, "isl": int(x.isl), "osl": int(x.osl), "concurrency": conc,
                        "weight_dtype": wd, "kv_dtype": wd, "ttft_ms": float(x.silicon_ttft_ms),
                        "tpot_ms": float(x.silicon_tpot_ms)})
    return out, skipped


def simulate_row(r: dict, profiles: dict | None = None, moe_tables: bool = False, mla_tables: bool = True,
                 a2a_tables: bool = False, frontend: dict | None = None) -> dict:
    """The row's closed-loop run as ``pdsim validate`` simulates it (``validate.simulate_row``'s dict: mean TTFT
    and TPOT in ms, the KV pool it ran with); ``frontend``: {engine: us per MoE layer} of a per-request
    front-end latency (``frontend_latency_ms``; benchmarks/fit_prefill_dispatch.py)."""
    fe = None
    if frontend and r["engine"] in frontend:
        from pdsim.engines import frontend_by_layers_s
        from pdsim.models import get_model
        fe = frontend_by_layers_s(get_model(r["model"]), 0.0, frontend[r["engine"]]) * 1e3
    return V.simulate_row(r, True, 10, "auto", None, profiles,
                          cost_model={"kind": "roofline", "moe_tables": moe_tables, "mla_tables": mla_tables,
                                      "a2a_tables": a2a_tables}, frontend_ms=fe)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--sample", type=int, default=150, help="seeded random sample of this many rows (0: all)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--dp-attention-only", action="store_true", help="only the rows served with DP attention")
    ap.add_argument("--ep-only", action="store_true", help="only the rows with expert parallelism (moe_ep > 1)")
    ap.add_argument("--profiles", help="price each GPU with the profile whose file name starts with it (e.g. "
                                       "'calibration/profiles/*-aic.yaml': imported kernel and MoE tables)")
    ap.add_argument("--moe-tables", action="store_true", help="with --profiles: also use their measured MoE tables")
    ap.add_argument("--mla-tables", action=argparse.BooleanOptionalAction, default=True,
                    help="with --profiles: use their measured MLA tables (the default; --no-mla-tables: roofline)")
    ap.add_argument("--a2a-tables", action="store_true",
                    help="with --profiles: also use their measured DeepEP all-to-all tables")
    ap.add_argument("--csv", help="write the per-row results here")
    ap.add_argument("--split", choices=["all", "train", "test"], default="all",
                    help="rows whose id has an even (train) or odd (test: held out) CRC32, as validate_silicon.py")
    ap.add_argument("--frontend", metavar="ENGINE=US,...",
                    help="a per-request front-end latency of US microseconds per MoE layer for that engine's rows "
                         "(the InferenceMAX TTFT floor, benchmarks/fit_prefill_dispatch.py; e.g. "
                         "sglang=3250,trtllm=1850,vllm-v1=800)")
    ap.add_argument("--write-error-table", action="store_true",
                    help="store the MoE band per engine|GPU (rows not KV-bound) in pdsim/data/validation_error.json, "
                         "which `pdsim run` shows for MoE pools (needs --sample 0, no --profiles or filters)")
    args = ap.parse_args()
    try:
        frontend = {k: float(v) for k, v in (x.split("=") for x in args.frontend.split(","))} \
            if args.frontend else None
    except ValueError:
        raise SystemExit(f"--frontend {args.frontend!r}: give ENGINE=US,... (microseconds per MoE layer)") from None
    if args.write_error_table and (args.sample or args.profiles or args.dp_attention_only or args.ep_only
                                   or frontend or args.split != "all"):
        raise SystemExit("--write-error-table stores the band of every MoE row on the datasheet presets: "
                         "use it with --sample 0 and without --profiles / --dp-attention-only / --ep-only / "
                         "--frontend / --split")
    profiles = V.parse_profiles(None, args.profiles) if args.profiles else None
    root, version = aic_systems_dir()
    rows, skipped = _rows(Path(root) / "silicon_sample.csv")
    if args.dp_attention_only:
        rows = [r for r in rows if r["dp_attention"]]
    if args.ep_only:
        rows = [r for r in rows if r["ep"] > 1]
    if args.split != "all":
        rows = [r for r in rows if (zlib.crc32(str(r["id"]).encode()) % 2 == 1) == (args.split == "test")]
    print(f"aiconfigurator-core {version} silicon sample: {len(rows)} MoE rows pdsim can express; skipped {skipped}")
    if args.sample and len(rows) > args.sample:
        idx = np.random.default_rng(args.seed).choice(len(rows), args.sample, replace=False)
        rows = [rows[i] for i in sorted(idx)]
    res = []
    for r in rows:
        try:
            sim = simulate_row(r, profiles, args.moe_tables, args.mla_tables, args.a2a_tables, frontend)
        except ConfigError as exc:
            print(f"  skip {r['id']}: {exc}")
            continue
        ttft, tpot = sim["sim_ttft_ms"], sim["sim_tpot_ms"]
        res.append({**r, "sim_ttft_ms": ttft, "sim_tpot_ms": tpot,
                    "ttft_ape": V._ape(ttft, r["ttft_ms"]), "tpot_ape": V._ape(tpot, r["tpot_ms"]),
                    "tpot_ratio": tpot / r["tpot_ms"], "ttft_ratio": ttft / r["ttft_ms"],
                    "sim_kv_tokens": sim["sim_kv_tokens"], "kv_holds_requests": sim["kv_holds_requests"]})
    if not res:
        raise SystemExit("no MoE row simulated (the filters left none, or every row was skipped)")
    df = pd.DataFrame(res)
    if args.csv:
        df.to_csv(args.csv, index=False)
    g = df.groupby(["model", "device", "engine", "tp", "ep", "dp_attention", "weight_dtype"]).agg(
        rows=("id", "size"), ttft_mape=("ttft_ape", "mean"), ttft_median_ape=("ttft_ape", "median"),
        tpot_mape=("tpot_ape", "mean"), tpot_median_ape=("tpot_ape", "median"),
        tpot_sim_over_meas=("tpot_ratio", "median"), ttft_sim_over_meas=("ttft_ratio", "median"))
    with pd.option_context("display.width", 200, "display.max_columns", 20):
        print(g.round(2).to_string())
    print(f"ALL {len(df)} rows: TTFT MAPE {df.ttft_ape.mean():.1f}% (median {df.ttft_ape.median():.1f}%), "
          f"TPOT MAPE {df.tpot_ape.mean():.1f}% (median {df.tpot_ape.median():.1f}%), "
          f"median TPOT sim/measured {df.tpot_ratio.median():.2f}")
    # rows whose simulated KV pool (the engine preset's memory setting) holds fewer full-length requests than
    # the run had clients: the run's own memory setting, which the sample does not record, decides their TTFT
    bound = df[df.kv_holds_requests < df.concurrency]
    rest = df.drop(bound.index)
    print(f"KV-bound rows (pool holds fewer full-length requests than clients): {len(bound)}; "
          f"the other {len(rest)}: TTFT MAPE {rest.ttft_ape.mean():.1f}% (median {rest.ttft_ape.median():.1f}%), "
          f"TPOT MAPE {rest.tpot_ape.mean():.1f}%")
    # per engine, GPU and harness (InferenceMAX or NVIDIA's own sweeps), not KV-bound, each measurement once
    once = rest.drop_duplicates(["model", "device", "engine", "tp", "ep", "dp_attention", "isl", "osl",
                                 "concurrency", "ttft_ms", "tpot_ms"])
    h = once.groupby(["engine", "device", "harness"]).agg(
        rows=("id", "size"), ttft_mape=("ttft_ape", "mean"), ttft_median_ape=("ttft_ape", "median"),
        ttft_bias_pct=("ttft_ratio", lambda x: (x.mean() - 1) * 100), tpot_mape=("tpot_ape", "mean"))
    print(f"per engine, GPU and harness (not KV-bound, each measurement once; split {args.split}):")
    with pd.option_context("display.width", 200, "display.max_columns", 20):
        print(h.round(1).to_string())
    for _, x in bound.iterrows():
        print(f"  {x['id'][:72]:72s} {x.engine} {x.device} tp{x.tp} c{x.concurrency}: pool holds "
              f"{x.kv_holds_requests} ({x.sim_kv_tokens} tokens); TTFT {x.ttft_ms:.0f} ms measured, "
              f"{x.sim_ttft_ms:.0f} simulated")
    if args.write_error_table:
        write_moe_bands(rest, version)
    return 0


#: what identifies one measurement: the sample lists some under several ids (46 of the 452 rows here)
MEASUREMENT = ("model", "device", "engine", "tp", "ep", "dp_attention", "weight_dtype", "isl", "osl", "concurrency",
               "ttft_ms", "tpot_ms")


def moe_bands(rows: pd.DataFrame) -> dict:
    """Per engine|GPU: ``validate.error_stats`` over the distinct measurements, their count and the models."""
    recs = rows.drop_duplicates(subset=list(MEASUREMENT)).to_dict("records")
    bands = {}
    for eng, dev in sorted({(r["engine"], r["device"]) for r in recs}):
        rs = [r for r in recs if (r["engine"], r["device"]) == (eng, dev)]
        stats = V.error_stats(rs)
        if any(v != v for v in stats.values()):
            raise SystemExit(f"{eng}|{dev}: no row with a simulated TTFT and TPOT; not writing a NaN band")
        bands[f"{eng}|{dev}"] = {**stats, "rows": len(rs), "models": sorted({r["model"] for r in rs})}
    return bands


def write_moe_bands(rows: pd.DataFrame, version: str, table_path: Path | None = None) -> None:
    """The MoE band per engine|GPU (``pdsim.validate.error_band(..., moe=True)``) into the error table, beside
    the dense bands that benchmarks/validate_silicon.py writes (it keeps these)."""
    import json
    import subprocess
    table_path = table_path or V.ERROR_TABLE
    bands = moe_bands(rows)
    if not bands:
        raise SystemExit("no MoE row left to measure a band on (all KV-bound?); the table is unchanged")
    head = subprocess.run(["git", "describe", "--always", "--dirty"], capture_output=True, text=True,
                          cwd=Path(__file__).parent).stdout.strip() or "?"
    table = json.loads(table_path.read_text())
    table["moe_source"] = (
        f"benchmarks/validate_moe_silicon.py --sample 0 --write-error-table (git {head}): pdsim (datasheet GPU "
        f"presets + engine presets) vs the MoE rows of aiconfigurator-core {version} silicon_sample.csv that "
        "pdsim expresses (DeepSeek-V3/R1, Qwen3-235B-A22B, gpt-oss-120b; fp8/bf16; aggregated), simulated as "
        "pdsim validate does; rows whose simulated KV pool holds fewer full-length requests than the run had "
        "clients (KV-bound: queueing for KV under a memory setting that may not be the run's decides them) "
        "left out, and a measurement listed under several ids counted once. NOT a held-out check: these rows "
        "chose which MoE kernel constants the presets carry (B200's were left out because they made them "
        "worse). Key: engine|device; 'models' names the rows' models (a band is pooled over them).")
    table["moe_bands"] = bands
    table_path.write_text(json.dumps(table, indent=1, allow_nan=False) + "\n")
    print(f"wrote the MoE bands of {len(bands)} engine|GPU pairs to {table_path}")


if __name__ == "__main__":
    sys.exit(main())
