"""pdsim vs NVIDIA's measured silicon sample (aiconfigurator-core), dense aggregated rows.

Simulates the same rows under four variants and prints, per variant, engine and GPU, the mean
and median absolute percentage error of mean TTFT and mean TPOT and the bias (mean of
simulated/measured - 1):

- ``datasheet (no engine)``: the GPU's datasheet preset (pdsim/data/devices), no ``engine`` key;
- ``datasheet+presets``: the same with the row's engine preset (pdsim/engines.py);
- ``measured (no engine)`` / ``measured+presets``: the GPU priced with the imported measured
  kernel profile (``--profiles``, default calibration/profiles/*-aic.yaml: TRT-LLM kernels).

Every row is simulated as a closed loop at the measured concurrency, ISL/OSL, TP and precision.
The silicon sample is read from an installed aiconfigurator-core (pip install the wheel; it is
never shipped with pdsim).  ``--split test`` keeps the held-out half (rows whose id has an odd
CRC32), ``--split train`` the other half; ``--sample N`` a seeded random sample of those rows.
``--write-error-table`` (with ``--split test``) stores every variant's held-out figures per
(engine, GPU) in pdsim/data/validation_error.json, the band run summaries print next to TTFT/TPOT.

    .venv/bin/python benchmarks/validate_silicon.py --split test --sample 150 [--write-error-table]
"""
from __future__ import annotations

import argparse
import json
import time
import zlib
from pathlib import Path

import numpy as np

from pdsim.validate import (CLIENT_MODES, ERROR_TABLE, error_stats, fit_step_overhead, kv_bound, parse_profiles,
                            read_measured, silicon_sample_path, validate)


def held_out(rid: str) -> bool:
    return zlib.crc32(rid.encode()) % 2 == 1


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--csv", help="silicon CSV (default: the installed aiconfigurator-core's)")
    ap.add_argument("--sample", type=int)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--gpus", help="only rows of these pdsim devices, comma-separated (e.g. b200)")
    ap.add_argument("--split", choices=["all", "train", "test"], default="all")
    ap.add_argument("--write-error-table", action="store_true")
    ap.add_argument("--client", choices=list(CLIENT_MODES), default="auto",
                    help="how the measured clients are assumed to send and what they count "
                         "(pdsim.validate.CLIENT_MODES; auto: steady for the unknown-harness rows)")
    ap.add_argument("--requests-per-client", type=int, default=10)
    ap.add_argument("--only-after", action="store_true", help="skip the idealised-engine (no presets) variants")
    ap.add_argument("--range-ratio", type=float,
                    help="force every row's length range ratio (1: fixed lengths, the pre-harness behaviour)")
    ap.add_argument("--only-before", action="store_true", help="only the idealised-engine (no presets) variants")
    ap.add_argument("--profiles", default=str(Path(__file__).parent.parent / "calibration/profiles/*-aic.yaml"),
                    help="measured profiles per GPU (pdsim validate --profiles); '' for the datasheet only")
    ap.add_argument("--frontend", metavar="ENGINE=US[:US],...",
                    help="each engine's rows with a per-request front-end latency of US per layer [and US per MoE "
                         "layer] (benchmarks/fit_prefill_dispatch.py); not with --write-error-table")
    ap.add_argument("--fit-overhead", action="store_true",
                    help="fit each engine's step overhead on the train split, report the test split with it")
    args = ap.parse_args()
    path = Path(args.csv) if args.csv else silicon_sample_path()
    rows = read_measured(path)
    # dense rows only (MoE rows, which pdsim validate now also expresses: benchmarks/validate_moe_silicon.py)
    from pdsim.validate import MOE_MODELS
    usable = [(r, w) for r, w in rows if w is None and r.get("model") not in MOE_MODELS.values()]
    reasons: dict[str, int] = {}
    for _, w in rows:
        if w:
            reasons[w.split(":")[0]] = reasons.get(w.split(":")[0], 0) + 1
    if args.fit_overhead:
        return fit_and_check(usable, args)
    if args.split != "all":
        usable = [(r, w) for r, w in usable if held_out(str(r["id"])) == (args.split == "test")]
    if args.gpus:
        usable = [(r, w) for r, w in usable if r["device"] in args.gpus.split(",")]
    if args.sample and args.sample < len(usable):
        idx = np.random.default_rng(args.seed).choice(len(usable), args.sample, replace=False)
        usable = [usable[i] for i in sorted(idx.tolist())]
        sampled = f"a seeded random sample of {len(usable)} (seed {args.seed})"
    else:
        sampled = f"all {len(usable)}"
    print(f"{path.name}: {len(rows)} rows; not expressible: {reasons}; simulating {sampled} usable rows "
          f"(split {args.split}, clients {args.client}, {args.requests_per_client} requests per client)")
    frontend = None
    if args.frontend:
        try:
            frontend = {}
            for item in args.frontend.split(","):
                eng, us = item.split("=")
                a, _, b = us.partition(":")
                frontend[eng] = (float(a), float(b or 0.0))
        except ValueError:
            raise SystemExit(f"--frontend {args.frontend!r}: give ENGINE=US[:US],...") from None
        if args.write_error_table:
            raise SystemExit("--write-error-table stores the presets' figures: drop --frontend")
    profiles = parse_profiles(None, args.profiles) if args.profiles else {}
    variants = [("datasheet", False, None), ("datasheet", True, None), ("measured", False, profiles),
                ("measured", True, profiles)]
    if args.only_after:
        variants = [v for v in variants if v[1]]
    if args.only_before:
        variants = [v for v in variants if not v[1]]
    if not profiles:
        variants = [v for v in variants if v[2] is None]
    res = {}
    for cost, presets, prof in variants:
        label = f"{cost}{'+presets' if presets else ' (no engine)'}"
        t0 = time.perf_counter()
        res[label] = (presets, prof, validate(usable, engine_presets=presets, requests_per_client=args.requests_per_client,
                                              client_mode=args.client, profiles=prof,
                                              length_ratio=args.range_ratio, frontend=frontend))
        bound = [x["id"] for x in res[label][2]["rows"] if kv_bound(x)]
        print(f"  {label}: {res[label][2]['counts']['simulated']} simulated in {time.perf_counter() - t0:.0f} s; "
              f"{len(bound)} KV-bound (the pool holds fewer full-length requests than the run had clients)")
    if profiles:
        print("  measured = " + ", ".join(f"{d}: {Path(p).name}" for d, p in sorted(profiles.items())))
    print(f"\n{'variant':26s} {'engine':8s} {'GPU':9s} {'rows':>4s}  {'TTFT MAPE':>9s} {'median':>7s} {'bias':>6s}  "
          f"{'TPOT MAPE':>9s} {'median':>7s} {'bias':>6s}   (APE %, bias = mean of sim/measured - 1, %)")
    for label, (_, _, r) in res.items():
        rows_ = r["rows"]
        keys = sorted({(x["engine"], x["device"]) for x in rows_}) + [("all", "all")]
        for eng, dev in keys:
            rs = [x for x in rows_ if (eng, dev) == ("all", "all") or (x["engine"], x["device"]) == (eng, dev)]
            s_ = error_stats(rs)
            print(f"{label:26s} {eng:8s} {dev:9s} {len(rs):4d}  {s_['ttft_mape_pct']:9.1f} {s_['ttft_median_ape_pct']:7.1f} "
                  f"{s_['ttft_bias_pct']:+6.0f}  {s_['tpot_mape_pct']:9.1f} {s_['tpot_median_ape_pct']:7.1f} "
                  f"{s_['tpot_bias_pct']:+6.0f}")
    if args.write_error_table:
        if args.range_ratio is not None:
            raise SystemExit("--write-error-table stores the harness-aware figures: drop --range-ratio")
        if args.split != "test":
            raise SystemExit("--write-error-table stores held-out figures: use it with --split test")
        # variants run separately (--only-after / --only-before) add their keys to the stored table
        try:
            old = json.loads(ERROR_TABLE.read_text())
        except (OSError, ValueError):
            old = {}
        bands = {}
        for label, (presets, prof, r) in res.items():
            for eng, dev in {(x["engine"] if presets else "none", x["device"]) for x in r["rows"]}:
                rs = [x for x in r["rows"] if (x["engine"] if presets else "none", x["device"]) == (eng, dev)]
                key = f"{eng}|{Path(prof[dev]).stem if prof and dev in prof else dev}"
                bands[key] = {**error_stats(rs), "rows": len(rs)}
        ERROR_TABLE.write_text(json.dumps(merged_table(old, bands, source=(
            f"benchmarks/validate_silicon.py --split test{' --sample %d' % args.sample if args.sample else ''}"
            f" --client {args.client} [--only-after | --only-before] (git {git_head()}): pdsim vs "
                      "aiconfigurator-core 0.12.0 "
                      "silicon_sample.csv, dense aggregated closed-loop rows (mean TTFT/TPOT per row, absolute "
                      "percentage error; bias = mean of simulated/measured - 1). Rows are split by the CRC32 of "
                      "their id: odd = held-out (these figures), even = train. Nothing in pdsim was fitted on the "
                      "held-out rows: the vllm-v1/sglang/trtllm step overheads were fitted on the train half "
                      "(--fit-overhead), the datasheet GPU presets to aiconfigurator's kernel tables; InferenceMAX "
                      "rows use its published length draw (validate.silicon_harness); with --client auto the "
                      "unknown-harness rows leave their cold first wave out (validate.CLIENT_MODES, steady). "
                      "The '-aic' keys use the "
                      "imported measured profiles of calibration/profiles. Key: engine|device (engine 'none' = "
                      "no engine preset).")), indent=1, allow_nan=False) + "\n")
        print(f"wrote {ERROR_TABLE}")


SPLIT = {"by": "zlib.crc32(id) % 2", "held_out": 1, "train": 0}


def merged_table(old: dict, bands: dict, source: str) -> dict:
    """The error table with these dense ``bands`` written over the old ones: variants run separately
    (--only-after / --only-before) keep each other's keys while the split is the same, and the MoE bands
    of benchmarks/validate_moe_silicon.py (``moe_source``, ``moe_bands``) are kept as they are."""
    kept = old.get("bands", {}) if old.get("split", {}).get("by") == SPLIT["by"] else {}
    return {"source": source, "split": SPLIT, "bands": dict(sorted({**kept, **bands}.items())),
            **{k: old[k] for k in ("moe_source", "moe_bands") if k in old}}


def git_head() -> str:
    import subprocess
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                              cwd=Path(__file__).parent).stdout.strip() or "?"
    except OSError:
        return "?"


def _sample(rows, n, seed):
    if n and n < len(rows):
        idx = np.random.default_rng(seed).choice(len(rows), n, replace=False)
        return [rows[i] for i in sorted(idx.tolist())]
    return rows


def fit_and_check(usable, args) -> None:
    """Calibration: fit the engine overheads on the train half, check them on the held-out half."""
    train = _sample([x for x in usable if not held_out(str(x[0]["id"]))], args.sample, args.seed)
    test = _sample([x for x in usable if held_out(str(x[0]["id"]))], args.sample, args.seed)
    kw = {"requests_per_client": args.requests_per_client, "client_mode": args.client}
    fitted = fit_step_overhead(validate(train, **kw)["rows"])
    print(f"fitted on {len(train)} train rows: {fitted}")
    for label, ovh in (("presets", None), ("fitted", fitted)):
        rs = validate(test, step_overhead=ovh, **kw)["rows"]
        for eng in sorted({r["engine"] for r in rs}):
            e = [r for r in rs if r["engine"] == eng]
            print(f"  test {label:7s} {eng:8s} n={len(e):3d} TPOT MAPE {np.mean([r['tpot_ape'] for r in e]):5.1f}%  "
                  f"TTFT MAPE {np.mean([r['ttft_ape'] for r in e]):5.1f}%")
        print(f"  test {label:7s} all      n={len(rs):3d} TPOT MAPE {np.mean([r['tpot_ape'] for r in rs]):5.1f}%  "
              f"TTFT MAPE {np.mean([r['ttft_ape'] for r in rs]):5.1f}%")


if __name__ == "__main__":
    main()
