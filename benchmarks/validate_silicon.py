"""pdsim vs NVIDIA's measured silicon sample (aiconfigurator-core), dense aggregated rows.

Prints, per (model, GPU, engine), the MAPE of mean TTFT and mean TPOT of pdsim with the idealised
engine (``before``: no ``engine`` key, today's default) and with the engine presets (``after``).
Every row is simulated as a closed loop at the measured concurrency, ISL/OSL, TP and precision.

The silicon sample is read from an installed aiconfigurator-core (pip install the wheel; it is
never shipped with pdsim).  ``--sample N`` simulates a seeded random sample of the usable rows
(default: all of them, about 780, ~2 x 1 min on one core).  ``--split`` reports the figures on a
held-out half (rows with an odd hash of their id), and ``--write-error-table`` stores the
``after`` MAPE per (engine, GPU) in pdsim/data/validation_error.json (the band that run
summaries print next to TTFT/TPOT).

    .venv/bin/python benchmarks/validate_silicon.py [--sample 200] [--write-error-table]
"""
from __future__ import annotations

import argparse
import json
import time
import zlib
from pathlib import Path

import numpy as np

from pdsim.validate import ERROR_TABLE, fit_step_overhead, read_measured, silicon_sample_path, validate


def held_out(rid: str) -> bool:
    return zlib.crc32(rid.encode()) % 2 == 1


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--csv", help="silicon CSV (default: the installed aiconfigurator-core's)")
    ap.add_argument("--sample", type=int)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--split", choices=["all", "train", "test"], default="all")
    ap.add_argument("--write-error-table", action="store_true")
    ap.add_argument("--client", choices=["sync", "stagger"], default="sync",
                    help="how the measured clients are assumed to send (pdsim.validate.CLIENT_MODES)")
    ap.add_argument("--requests-per-client", type=int, default=10)
    ap.add_argument("--only-after", action="store_true", help="skip the idealised-engine run")
    ap.add_argument("--fit-overhead", action="store_true",
                    help="fit each engine's step overhead on the train split, report the test split with it")
    args = ap.parse_args()
    path = Path(args.csv) if args.csv else silicon_sample_path()
    rows = read_measured(path)
    usable = [(r, w) for r, w in rows if w is None]
    reasons: dict[str, int] = {}
    for _, w in rows:
        if w:
            reasons[w.split(":")[0]] = reasons.get(w.split(":")[0], 0) + 1
    if args.fit_overhead:
        return fit_and_check(usable, args)
    if args.split != "all":
        usable = [(r, w) for r, w in usable if held_out(str(r["id"])) == (args.split == "test")]
    if args.sample and args.sample < len(usable):
        idx = np.random.default_rng(args.seed).choice(len(usable), args.sample, replace=False)
        usable = [usable[i] for i in sorted(idx.tolist())]
        sampled = f"a seeded random sample of {len(usable)} (seed {args.seed})"
    else:
        sampled = f"all {len(usable)}"
    print(f"{path.name}: {len(rows)} rows; not expressible: {reasons}; simulating {sampled} usable rows "
          f"(split {args.split}, clients {args.client}, {args.requests_per_client} requests per client)")
    res = {}
    for label, presets in (("before", False), ("after", True)):
        if label == "before" and args.only_after:
            res[label] = {"groups": [], "rows": [], "counts": {"simulated": 0}}
            continue
        t0 = time.perf_counter()
        res[label] = validate(usable, engine_presets=presets, requests_per_client=args.requests_per_client,
                              client_mode=args.client)
        print(f"  {label}: {res[label]['counts']['simulated']} simulated in {time.perf_counter() - t0:.0f} s")
    key = ("model", "device", "engine")
    before = {tuple(g[k] for k in key): g for g in res["before"]["groups"]}
    print(f"\n{'model':14s} {'GPU':9s} {'engine':8s} {'rows':>4s}  {'TTFT MAPE % before -> after':>28s}  "
          f"{'TPOT MAPE % before -> after':>28s}   bias after (TTFT, TPOT) %")
    for g in res["after"]["groups"]:
        b = before.get(tuple(g[k] for k in key), {})
        print(f"{g['model']:14s} {g['device']:9s} {g['engine']:8s} {g['rows']:4d}  "
              f"{b.get('ttft_mape', float('nan')):13.1f} -> {g['ttft_mape']:6.1f}      "
              f"{b.get('tpot_mape', float('nan')):13.1f} -> {g['tpot_mape']:6.1f}       "
              f"{g['ttft_bias']:+6.1f}, {g['tpot_bias']:+6.1f}")
    for label in ("before", "after"):
        rs = res[label]["rows"]
        if not rs:
            continue
        t = [r["ttft_ape"] for r in rs if r["ttft_ape"] is not None]
        p = [r["tpot_ape"] for r in rs if r["tpot_ape"] is not None]
        print(f"all rows {label:6s}: TTFT MAPE {np.mean(t):.1f}% (median {np.median(t):.1f}%), "
              f"TPOT MAPE {np.mean(p):.1f}% (median {np.median(p):.1f}%), n={len(t)}")
    if args.write_error_table:
        bands: dict[str, dict] = {}
        for eng_dev in {(r["engine"], r["device"]) for r in res["after"]["rows"]}:
            rs = [r for r in res["after"]["rows"] if (r["engine"], r["device"]) == eng_dev]
            bands["|".join(eng_dev)] = {
                "ttft_mape_pct": round(float(np.mean([r["ttft_ape"] for r in rs])), 1),
                "tpot_mape_pct": round(float(np.mean([r["tpot_ape"] for r in rs])), 1),
                "ttft_p90_ape_pct": round(float(np.percentile([r["ttft_ape"] for r in rs], 90)), 1),
                "tpot_p90_ape_pct": round(float(np.percentile([r["tpot_ape"] for r in rs], 90)), 1),
                "rows": len(rs)}
        ERROR_TABLE.write_text(json.dumps({
            "source": f"benchmarks/validate_silicon.py --split {args.split}: pdsim with engine presets vs "
                      "aiconfigurator-core 0.12.0 silicon_sample.csv, dense aggregated closed-loop rows "
                      "(mean TTFT/TPOT, absolute percentage error)",
            "bands": dict(sorted(bands.items()))}, indent=1) + "\n")
        print(f"wrote {ERROR_TABLE}")


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
