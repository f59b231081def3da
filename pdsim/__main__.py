"""Command line: ``pdsim run | estimate | calibrate | report``.  Thin: parsing and printing only."""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from .errors import ConfigError, PdsimError


def _fmt(x, scale=1.0, digits=3):
    return "-" if x is None else f"{x * scale:.{digits}g}"


def print_summary(summary: dict, out=sys.stdout) -> None:
    cols = ["topology", "gpus", "done/total", "TTFT p50/p90/p99 ms", "TPOT p50/p90/p99 ms", "E2E p90 s",
            "SLO att.", "tok/s/GPU", "$/Mtok"]
    rows = []
    for name, s in summary.items():
        t, p, e, r = s["ttft_s"], s["tpot_s"], s["e2e_s"], s["requests"]
        rows.append([name, str(s["gpus"]), f"{r['finished']}/{r['total']}",
                     "/".join(_fmt(t[k], 1e3) for k in ("p50", "p90", "p99")),
                     "/".join(_fmt(p[k], 1e3) for k in ("p50", "p90", "p99")),
                     _fmt(e["p90"]), f"{s['slo_attainment']:.1%}",
                     _fmt(s["throughput"]["output_tokens_per_s_per_gpu"], 1, 4),
                     _fmt(s["cost_per_million_output_tokens_usd"])])
    w = [max(len(c), *(len(r[i]) for r in rows)) for i, c in enumerate(cols)]
    print("  ".join(c.ljust(w[i]) for i, c in enumerate(cols)), file=out)
    for r in rows:
        print("  ".join(v.ljust(w[i]) for i, v in enumerate(r)), file=out)


def cmd_run(args) -> int:
    from . import config
    from .output import write_outputs
    from .simulation import simulate
    from .errors import InputError
    sc = config.load(args.scenario, args.set)
    t0 = time.perf_counter()
    try:
        results = simulate(sc, progress=not args.quiet, fast=not args.step_by_step)
    except InputError as exc:   # a key found bad once the run started: name the scenario file
        raise exc.in_file(args.scenario) from None
    wall = time.perf_counter() - t0
    out = Path(args.out or f"reports/{Path(args.scenario).stem}")
    summary = write_outputs(results, sc, out, wall_s=wall, progress=not args.quiet)
    print_summary(summary["topologies"])
    print(f"\nwrote {out}/ (requests.csv, summary.json, timeseries.csv"
          f"{', report.html' if (out / 'report.html').exists() else ''}) in {wall:.2f} s wall", file=sys.stderr)
    return 0


def cmd_estimate(args) -> int:
    from .costmodel import RooflineCost
    from .devices import get_device
    from .models import get_model
    model, dev = get_model(args.model, "--model"), get_device(args.device, "--device")
    model.validate_tp(args.tp, "--tp")
    cm = RooflineCost(model, dev, args.tp, args.weight_dtype, args.kv_dtype)
    if args.prefill is not None:
        if args.prefill < 1:
            raise ConfigError("must be >= 1", key="--prefill", value=args.prefill)
        p, b = args.prefill, args.batch
        agg = (p * b, b * p * p / 2.0, p * b, b, b)
        what = {"phase": "prefill", "prompt_tokens": p, "batch": b}
    elif args.decode_batch is not None:
        if args.decode_batch < 1 or args.context < 0:
            raise ConfigError("must be >= 1", key="--decode-batch", value=args.decode_batch)
        b, c = args.decode_batch, args.context
        agg = (b, float(b * c), b * (c + 1), b, b)
        what = {"phase": "decode", "batch": b, "context": c}
    else:
        raise ConfigError("give --prefill TOKENS or --decode-batch N [--context C]", key="estimate")
    st = cm.step(*agg)
    ops = cm.breakdown(*agg)
    peak, bw = dev.peak_flops(cm.compute_dtype) * args.tp, dev.mem_bw_Bps * args.tp
    bound = "compute" if st.flops / peak > st.bytes / bw else "memory"
    res = {**what, "model": model.name, "device": dev.name, "device_source": dev.source, "tp": args.tp,
           "time_s": st.time_s, "flops": st.flops, "bytes": st.bytes, "bound": bound,
           "achieved_tflops": st.flops / st.time_s / 1e12, "achieved_GBps": st.bytes / st.time_s / 1e9,
           "ops": ops}
    if args.json:
        print(json.dumps(res, indent=2))
    else:
        print(f"{what['phase']} on {dev.name} x tp{args.tp}, {model.name}: {st.time_s * 1e3:.3f} ms "
              f"({bound}-bound; {res['achieved_tflops']:.1f} TFLOP/s, {res['achieved_GBps']:.0f} GB/s)")
        for k, v in ops.items():
            print(f"  {k:14s} {v['time_s'] * 1e3:9.3f} ms  {v['flops'] / 1e9:10.2f} GFLOP  {v['bytes'] / 1e6:10.2f} MB")
    return 0


def cmd_report(args) -> int:
    from .report import build_report
    path = build_report(Path(args.dir))
    print(f"wrote {path}", file=sys.stderr)
    return 0


def cmd_plan(args) -> int:
    from .plan import (DaskExecutor, LocalExecutor, clear_plan_outputs, load_plan, print_table, run_plan,
                       write_plan_outputs)
    if args.scheduler and args.executor == "local":
        raise ConfigError("--scheduler is for --executor dask (drop --executor local)", key="--scheduler",
                          value=args.scheduler)
    args.executor = args.executor or ("dask" if args.scheduler else "local")   # --scheduler implies dask
    plan = load_plan(args.plan, args.set)
    out = Path(args.out or f"reports/{Path(args.plan).stem}")
    clear_plan_outputs(out)          # a plan that ends without a winner must not leave the last one's
    if args.executor == "dask":
        ex = DaskExecutor(args.scheduler)
    else:
        ex = LocalExecutor(args.jobs)
    if not args.quiet:
        print(f"pdsim plan: {len(plan.configs)} configs in the search space ({len(plan.excluded)} excluded by "
              f"budget or fit) on the {ex.name} executor", file=sys.stderr)
    cache = None if args.no_cache else Path(args.cache or out / "cache")
    try:
        result = run_plan(plan, ex, cache, progress=not args.quiet)
    finally:
        ex.close()
    write_plan_outputs(plan, result, out, progress=not args.quiet)
    print_table(result)
    print(f"\nwrote {out}/ (plan.csv, plan.json, plan.html{', winner.yaml' if result['winner'] else ''}): "
          f"{result['simulations']} simulations, {result['cached']} cached, {result['wall_s']:.1f} s", file=sys.stderr)
    return 0 if result["winner"] else 1


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="pdsim", description="Simulate colocated and prefill/decode-"
                                 "disaggregated LLM serving.")
    sub = ap.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run", help="simulate every topology of a scenario on the same requests")
    r.add_argument("scenario")
    r.add_argument("--out", help="output folder (default reports/<scenario name>)")
    r.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="override a scenario key, e.g. --set workload.rate=8")
    r.add_argument("--quiet", action="store_true")
    r.add_argument("--step-by-step", action="store_true",
                   help="one event per engine step (the reference loop; slower, same results)")
    r.set_defaults(fn=cmd_run)
    e = sub.add_parser("estimate", help="cost-model time of one prefill or decode step")
    e.add_argument("--model", required=True)
    e.add_argument("--device", required=True)
    e.add_argument("--tp", type=int, default=1)
    e.add_argument("--prefill", type=int, metavar="TOKENS")
    e.add_argument("--batch", type=int, default=1, help="prompts in the prefill batch")
    e.add_argument("--decode-batch", type=int)
    e.add_argument("--context", type=int, default=1024)
    e.add_argument("--weight-dtype", default="bf16")
    e.add_argument("--kv-dtype", default="bf16")
    e.add_argument("--json", action="store_true")
    e.set_defaults(fn=cmd_estimate)
    pl = sub.add_parser("plan", help="find the cheapest deployment that meets the SLO (goodput search)")
    pl.add_argument("plan")
    pl.add_argument("--out", help="output folder (default reports/<plan name>)")
    pl.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    pl.add_argument("--executor", choices=["local", "dask"], help="default: local, or dask with --scheduler")
    pl.add_argument("--scheduler", help="Dask scheduler address, e.g. tcp://HOST:8786 (implies --executor dask)")
    pl.add_argument("--jobs", type=int, help="local worker processes (default: all cores)")
    pl.add_argument("--cache", help="result cache folder (default OUT/cache)")
    pl.add_argument("--no-cache", action="store_true")
    pl.add_argument("--quiet", action="store_true")
    pl.set_defaults(fn=cmd_plan)
    rp = sub.add_parser("report", help="rebuild report.html from a run's output folder")
    rp.add_argument("dir")
    rp.set_defaults(fn=cmd_report)
    try:
        from . import calibrate
        calibrate.add_parser(sub)
    except ImportError:
        pass
    return ap


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.fn(args) or 0
    except PdsimError as exc:
        print(f"pdsim: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
