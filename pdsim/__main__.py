"""Command line: ``pdsim run | estimate | calibrate | report``.  Thin: parsing and printing only."""
from __future__ import annotations

import argparse
import json
import os
import re
import sys
import time
from pathlib import Path

from .errors import ConfigError, PdsimError

MAX_TOKENS = 10**9     # the scenario's own bound on token counts (config.PosInt)


class _Parser(argparse.ArgumentParser):
    """argparse with one-line errors in pdsim's format (``pdsim: error: --batch = 0: must be ...``), exit 2."""

    def error(self, message: str):
        m = re.match(r"argument ([^:]+): (.*)", message, re.S)
        if m:
            key = m.group(1).split("/")[-1]           # "-o/--out" -> "--out"
            rest = m.group(2)
            message = f"{key} {rest}" if rest.startswith("= ") else f"{key}: {rest}"
        message = " ".join(message.split())           # one line whatever argparse wrote
        print(f"pdsim: error: {message} (pdsim {self.prog.split()[-1]} --help lists the options)"
              if self.prog != "pdsim" else f"pdsim: error: {message} (pdsim --help lists the commands)",
              file=sys.stderr)
        sys.exit(2)


def _float_in(lo: float, hi: float):
    """An argparse type: a finite number in [lo, hi]."""
    def parse(text: str) -> float:
        try:
            v = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"= {text!r}: not a number") from None
        if not lo <= v <= hi:           # NaN fails this too
            raise argparse.ArgumentTypeError(f"= {text}: must be between {lo} and {hi}")
        return v
    return parse


def _int_list(text: str) -> list[int]:
    """An argparse type: comma-separated integers (e.g. ``--pp-layers 31,30``)."""
    try:
        return [int(x) for x in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"= {text!r}: not a comma-separated list of integers") from None


def _int_in(lo: int, hi: int | None = None):
    """An argparse type: an integer in [lo, hi]; the error names the value (the key is added by argparse)."""
    def parse(text: str) -> int:
        try:
            v = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"= {text!r}: not an integer") from None
        if v < lo or (hi is not None and v > hi):
            bound = f">= {lo}" if hi is None else f"between {lo} and {hi:,}"
            raise argparse.ArgumentTypeError(f"= {v}: must be {bound}")
        return v
    parse.__name__ = "int"
    return parse


_DASK_ADDRESS = re.compile(r"^(?:(?:tcp|tls|ucx|ws|wss)://)?(?:\[[0-9a-fA-F:]+\]|[A-Za-z0-9_.-]+):(\d{1,5})$")


def _dask_address(text: str) -> str:
    """An argparse type: a Dask scheduler address, PROTOCOL://HOST:PORT (tcp:// when no protocol)."""
    m = _DASK_ADDRESS.match(text.strip())
    if not m or not 1 <= int(m.group(1)) <= 65535:
        raise argparse.ArgumentTypeError(f"= {text!r}: not a Dask scheduler address; give tcp://HOST:PORT, "
                                         "e.g. tcp://10.0.0.5:8786")
    return text.strip()


def _cores() -> int:
    """CPU cores this process may run on."""
    try:
        return len(os.sched_getaffinity(0)) or 1
    except AttributeError:          # not on Linux
        return os.cpu_count() or 1


def _fmt(x, scale=1.0, digits=3):
    """``digits`` significant figures, without exponents: 4530.2 -> "4,530", 0.0123 -> "0.0123"."""
    if x is None:
        return "-"
    v = x * scale
    if v != v or v in (float("inf"), float("-inf")):
        return str(v)
    if v != 0 and abs(v) >= 10 ** digits:
        return f"{round(v, digits - len(str(int(abs(v))))):,.0f}"
    return f"{v:.{digits}g}"


def _att(x) -> str:
    """An attainment truncated to 0.1% as the report shows it (0.8996 reads 89.9%, never a rounded-up 90.0%)."""
    import math
    return "-" if x is None else f"{math.floor(x * 1000 + 1e-9) / 10:.1f}%"


def print_summary(summary: dict, out=None) -> None:
    out = out or sys.stdout          # looked up per call: a default bound at import would keep a closed stream
    cols = ["topology", "gpus", "done/total", "TTFT p50/p90/p99 ms", "TPOT p50/p90/p99 ms", "E2E p90 s",
            "SLO att.", "tok/s/GPU", "$/Mtok"]
    rows = []
    for name, s in summary.items():
        t, p, e, r = s["ttft_s"], s["tpot_s"], s["e2e_s"], s["requests"]
        rows.append([name, str(s["gpus"]), f"{r['finished']}/{r['total']}",
                     "/".join(_fmt(t[k], 1e3) for k in ("p50", "p90", "p99")),
                     "/".join(_fmt(p[k], 1e3) for k in ("p50", "p90", "p99")),
                     _fmt(e["p90"]), _att(s["slo_attainment"]),
                     _fmt(s["throughput"]["output_tokens_per_s_per_gpu"], 1, 4),
                     _fmt(s["cost_per_million_output_tokens_usd"])])
    w = [max(len(c), *(len(r[i]) for r in rows)) for i, c in enumerate(cols)]
    print("  ".join(c.ljust(w[i]) for i, c in enumerate(cols)), file=out)
    for r in rows:
        print("  ".join(v.ljust(w[i]) for i, v in enumerate(r)), file=out)


def print_rejections(summary: dict, out=None) -> None:
    """One stderr line per topology that rejected requests (a prompt larger than any KV pool, a full queue...):
    a run whose every request was turned away must not look like a quiet success."""
    out = out or sys.stderr
    for name, s in summary.items():
        r = s["requests"]
        if r.get("rejected"):
            why = ", ".join(f"{k} {v}" for k, v in (s.get("rejected_by_reason") or {}).items())
            print(f"pdsim: {name}: {r['rejected']} of {r['total']} requests rejected"
                  f"{f' ({why})' if why else ''}; each one's reason is in the reject_reason column"
                  + (" (none was served)" if r["rejected"] == r["total"] else ""), file=out)


def print_horizon_cuts(summary: dict, horizon_s, closed: bool = False, out=None) -> None:
    """One stderr line per topology whose horizon cut requests off the stream: they are not in its results."""
    out = out or sys.stderr
    for name, s in summary.items():
        if s.get("cut_by_horizon"):
            print(f"pdsim: {name}: horizon_s = {horizon_s:g} s cut {s['cut_by_horizon']} requests "
                  f"{'its clients had not sent by then' if closed else 'arriving at or after it'}; the run has "
                  f"the other {s['requests']['total']} (summary.json cut_by_horizon)", file=out)


def print_error_bands(summary: dict, out=None) -> None:
    """The TTFT/TPOT error measured against real runs for each pool's engine and GPU (pdsim validate)."""
    from .validate import band_text
    out = out or sys.stdout          # looked up per call: a stream swapped after import is honoured
    groups: dict[str, list[str]] = {}    # one line per distinct band: the pools it applies to
    for name, s in summary.items():
        for pool, band in (s.get("expected_error") or {}).items():
            text = band_text(band)
            if isinstance(band, dict) and band.get("engine") == "none":
                text += "; no engine preset: `engine:` (vllm-v1, sglang, trtllm) gives engine-faithful serving"
            groups.setdefault(text, []).append(f"{name}/{pool}")
    for text, where in groups.items():
        print(f"expected error {', '.join(where)}: {text}", file=out)
    # each run's verdict at the p90 error, one line per distinct judged bounds (topologies of the same pools share one)
    at_error: dict[tuple, list[str]] = {}
    for name, s in summary.items():
        e = s.get("slo_at_error") or {}
        m = e.get("margin")
        if m is None:
            continue
        key = (m["ttft_factor"], m["tpot_factor"], e["ttft_s"], e["tpot_s"], bool(m.get("in_sample")),
               m.get("both_within_share"))
        if e.get("mode") == "percentile":      # that mode judges the percentiles, not a share
            att = (f"TTFT p{e['ttft_percentile']:g} {_fmt(e['ttft_p_s'], 1e3)} ms, TPOT p{e['tpot_percentile']:g} "
                   f"{_fmt(e['tpot_p_s'], 1e3)} ms")
        else:
            att = _att(e["attainment"])
        at_error.setdefault(key, []).append(f"{name} {'met' if e['met'] else 'MISSED'} ({att})")
    for (ft, fp, ttft_s, tpot_s, in_sample, both), verdicts in at_error.items():
        print(f"SLO at p90 error (TTFT <= {_fmt(ttft_s * 1e3)} ms, TPOT <= {_fmt(tpot_s * 1e3)} ms: the bounds / "
              f"{ft:.3g} and / {fp:.3g}, the p90 (at least 1) of measured/simulated TTFT and of TPOT over "
              f"{'its in-sample MoE' if in_sample else 'held-out'} runs"
              + (f"; both within them on {both:.0%} of those runs" if both is not None else "") + "): "
              + ", ".join(verdicts), file=out)


def cmd_run(args) -> int:
    from . import config
    from .output import REQUESTS_FILES, OutputFolder, check_requests_format, write_outputs
    from .simulation import simulate
    from .errors import InputError
    check_requests_format(args.requests_format)     # before a long simulation, not after it
    sc = config.load(args.scenario, args.set)
    out = Path(args.out or f"reports/{Path(args.scenario).stem}")
    # --out is checked, created and locked before simulating: a bad place or a second run fails in a second
    with OutputFolder(out):
        t0 = time.perf_counter()
        try:
            results = simulate(sc, progress=not args.quiet, fast=not args.step_by_step)
        except InputError as exc:   # a key found bad once the run started: name the scenario file
            raise exc.in_file(args.scenario) from None
        wall = time.perf_counter() - t0
        summary = write_outputs(results, sc, out, wall_s=wall, progress=not args.quiet, report=not args.no_report,
                                release=True, requests_format=args.requests_format)
    if args.format == "json":
        print(json.dumps(summary["topologies"], indent=2))
    else:
        print_summary(summary["topologies"])
        print_error_bands(summary["topologies"])
    print_rejections(summary["topologies"])
    print_horizon_cuts(summary["topologies"], sc.horizon_s, sc.workload.arrival == "closed")
    print(f"\nwrote {out}/ ({REQUESTS_FILES[args.requests_format]}, summary.json, timeseries.csv"
          f"{', report.html' if (out / 'report.html').exists() else ''}) in {wall:.2f} s wall", file=sys.stderr)
    return 0


def cmd_estimate(args) -> int:
    from .costmodel import RooflineCost, sliding_aggregates
    from .devices import get_device
    from .models import get_model
    model, dev = get_model(args.model, "--model"), get_device(args.device, "--device")
    model.validate_tp(args.tp, "--tp")
    model.validate_ep(args.ep, args.tp, "--ep")
    model.validate_pp(args.pp, "--pp", args.pp_layers, "--pp-layers")
    if args.dp_attention:
        model.validate_dp_attention(args.tp, args.ep, args.pp, "--dp-attention")
        if model.has_sliding:
            raise ConfigError("DP attention with sliding-window layers is not modelled", key="--dp-attention",
                              value=True)
    if args.micro_batches is not None and args.pp == 1:
        raise ConfigError("needs pipeline parallelism (--pp > 1)", key="--micro-batches", value=args.micro_batches)
    if args.expert_skew and not model.is_moe:
        raise ConfigError(f"needs a mixture-of-experts model; {model.name} is dense", key="--expert-skew",
                          value=args.expert_skew)
    swa = {}      # the sliding layers' aggregates, when the model has some
    cm = RooflineCost(model, dev, args.tp, args.weight_dtype, args.kv_dtype, args.ep, args.expert_skew, args.pp,
                      args.dp_attention, moe_tables=args.moe_tables,
                      mla_tables=args.mla_tables, a2a_tables=args.a2a_tables,
                      pp_layers=tuple(args.pp_layers) if args.pp_layers is not None else None)
    table_notes = list(cm.table_notes)
    if args.pp > 1:
        from .pipeline import PipelineCost
        cm = PipelineCost(cm, args.pp, args.micro_batches)
    pool = _estimate_pool(args)
    if pool.engine is not None:
        from .engines import wrap_cost
        cm = wrap_cost(cm, pool)       # the engine's per-step overhead instead of the device's flat one
    if args.prefill is not None:
        if not 1 <= args.prefill <= model.max_context:
            raise ConfigError(f"must be between 1 and {model.name}'s context of {model.max_context} tokens",
                              key="--prefill", value=args.prefill)
        if args.batch < 1:
            raise ConfigError("must be >= 1", key="--batch", value=args.batch)
        p, b = args.prefill, args.batch
        agg = (p * b, b * p * p / 2.0, p * b, b, b)
        if model.has_sliding:       # the sliding layers' work and KV reads (pdsim.costmodel.sliding_aggregates)
            w, kv = sliding_aggregates(0, p, model.window)
            swa = {"swa": (b * w, b * kv)}
        what = {"phase": "prefill", "prompt_tokens": p, "batch": b}
    elif args.decode_batch is not None:
        if args.decode_batch < 1:
            raise ConfigError("must be >= 1", key="--decode-batch", value=args.decode_batch)
        if not 0 <= args.context < model.max_context:
            raise ConfigError(f"must be >= 0 and below {model.name}'s context of {model.max_context} tokens",
                              key="--context", value=args.context)
        b, c = args.decode_batch, args.context
        agg = (b, float(b * c), b * (c + 1), b, b)
        if model.has_sliding:
            w, kv = sliding_aggregates(c, 1, model.window)
            swa = {"swa": (b * w, b * kv)}
        what = {"phase": "decode", "batch": b, "context": c}
    else:
        raise ConfigError("give --prefill TOKENS or --decode-batch N [--context C]", key="estimate")
    st = cm.step(*agg, **swa)
    ops = cm.breakdown(*agg, **swa)           # under pp: one micro-batch through all stages
    pipe = None
    if args.pp > 1:
        _, _, _, d = cm.iteration(*agg, **swa)
        pipe = {"stages": args.pp, "layers": list(model.stage_split(args.pp, args.pp_layers)), **{k: d[k] for k in ("micro_batches", "micro_batch_requests", "stage_s",
                                                         "transfer_s", "overhead_s", "round_trip_s",
                                                         "stage_load_s")}}
    peak, bw = dev.peak_flops(cm.compute_dtype) * args.tp, dev.mem_bw_Bps * args.tp
    bound = "compute" if st.flops / peak > st.bytes / bw else "memory"
    if pool.engine is not None and pipe is None:
        ops["step_overhead"] = {"time_s": st.time_s - sum(v["time_s"] for k, v in ops.items() if k != "step_overhead"),
                                "flops": 0.0, "bytes": 0.0}
    res = {**what, "model": model.name, "device": dev.name, "device_source": dev.source, "tp": args.tp, "ep": args.ep,
           "pp": args.pp, "pipeline": pipe, "dp_attention": args.dp_attention, "engine": pool.engine, "time_s": st.time_s, "flops": st.flops, "bytes": st.bytes, "bound": bound,
           "achieved_tflops": st.flops / st.time_s / 1e12, "achieved_GBps": st.bytes / st.time_s / 1e9,
           "ops": ops,   # each op's "source": exact | interpolated (measured tables), extrapolated, roofline
           "sources": {src: [k for k, v in ops.items() if v.get("source") == src]
                       for src in ("exact", "interpolated", "extrapolated", "roofline")},
           "table_notes": table_notes,   # measured tables asked for (--mla-tables, --a2a-tables) that do not serve
           "kv_capacity": _kv_capacity(pool, model, args, what.get("prompt_tokens") or what.get("context", 0) + 1)}
    # the error pdsim showed against measured serving runs of this engine and GPU (as `pdsim run` prints it)
    from .validate import error_band
    res["expected_error"] = ("unvalidated: pipeline parallel (no measured run used PP)" if args.pp > 1 else
                             error_band(pool.engine, args.device, args.tp, moe=model.is_moe))
    if args.json or args.format == "json":
        print(json.dumps(res, indent=2))
    else:
        print(f"{what['phase']} on {dev.name} x tp{args.tp}{f' pp{args.pp}' if args.pp > 1 else ''}"
              f"{f' ep{args.ep}' if args.ep > 1 else ''}{' DP attention' if args.dp_attention else ''}, "
              f"{model.name}: {st.time_s * 1e3:.3f} ms "
              f"({bound}-bound; {res['achieved_tflops']:.1f} TFLOP/s per GPU, {res['achieved_GBps']:.0f} GB/s)")
        if pipe is not None:
            print(f"  pipeline: layers {' / '.join(str(n) for n in pipe['layers'])}; "
                  f"{pipe['micro_batches']} micro-batch(es) of up to {pipe['micro_batch_requests']} "
                  f"request(s); stage times {' / '.join(f'{x * 1e3:.3f}' for x in pipe['stage_s'])} ms, "
                  f"stage-to-stage transfer {pipe['transfer_s'] * 1e3:.3f} ms, overhead {pipe['overhead_s'] * 1e3:.3f} ms,"
                  f" round trip {pipe['round_trip_s'] * 1e3:.3f} ms, busiest stage "
                  f"{max(pipe['stage_load_s']) * 1e3:.3f} ms; per-op times below are one micro-batch, all stages")
        for k, v in ops.items():
            print(f"  {k:14s} {v['time_s'] * 1e3:9.3f} ms  {v['flops'] / 1e9:10.2f} GFLOP  {v['bytes'] / 1e6:10.2f} MB"
                  f"  {v.get('source', '')}")
        for note in table_notes:
            print(f"  note: {note}")
        from .validate import band_text
        print(f"expected error of serving runs on {pool.engine or 'no engine preset'} / {args.device}: "
              f"{band_text(res['expected_error'])}")
        kv = res["kv_capacity"]
        if "error" in kv:
            print(f"KV cache: none ({kv['error']})")
            return 0
        print(f"KV cache ({pool.engine or 'no engine preset'}): {kv['blocks']} blocks of {kv['block_size']} tokens = "
              f"{kv['tokens']:,} tokens per instance = {kv['requests']:,} requests of {kv['request_tokens']} tokens")
    return 0


def _estimate_pool(args):
    from .config import PoolSpec
    from .errors import ConfigError as _CE
    from pydantic import ValidationError
    kw = {"device": args.device, "tp": args.tp, "ep": args.ep, "pp": args.pp, "pp_layers": args.pp_layers,
          "dp_attention": args.dp_attention}
    if args.engine:
        kw["engine"] = args.engine
    try:
        return PoolSpec(**kw)
    except ValidationError:
        raise _CE("unknown engine; valid: vllm-v1, vllm-v0, sglang, trtllm", key="--engine",
                  value=args.engine) from None


def _kv_capacity(pool, model, args, request_tokens: int) -> dict:
    """KV capacity of one instance in tokens and in requests of ``request_tokens`` tokens each."""
    from .topology import kv_blocks
    try:
        blocks, _ = kv_blocks(pool, model, args.weight_dtype, args.kv_dtype, None, "--device")
    except ConfigError as exc:     # the weights do not fit: the step time still stands
        return {"error": exc.reason}
    usable = blocks - int(pool.watermark * blocks)
    # + the sliding layers' window blocks a request holds (0 without sliding layers)
    per_req = -(-request_tokens // pool.block_size) + model.sliding_extra_blocks(pool.block_size)
    return {"blocks": blocks, "block_size": pool.block_size, "tokens": usable * pool.block_size,
            "requests": usable // per_req, "request_tokens": request_tokens}


def cmd_report(args) -> int:
    from .report import build_report, validate_run_folder
    validate_run_folder(Path(args.dir))     # a missing, half-written or corrupt folder: one line, exit 2
    from jinja2.exceptions import UndefinedError
    try:
        path = build_report(Path(args.dir))
    except (KeyError, ValueError, TypeError, UndefinedError) as exc:   # what the checks above did not foresee
        what = " ".join(str(exc).split())[:200]
        raise ConfigError(f"cannot be drawn: {exc.__class__.__name__} {what}; rerun pdsim run to write a complete "
                          "folder", file=str(args.dir)) from None
    print(f"wrote {path}", file=sys.stderr)
    return 0


def cmd_list(args) -> int:
    from .catalog import listing, print_listing
    print_listing(args.what, listing(args.what, args.where), args.format)
    return 0


def cmd_sweep(args) -> int:
    from .output import OutputFolder
    from .sweep import print_goodput, run_sweep, write_sweep_outputs
    out = Path(args.out or f"reports/{Path(args.scenario).stem}-sweep")
    if args.scheduler and args.jobs:
        raise ConfigError("only used without --scheduler (Dask workers are sized by the cluster)",
                          key="--jobs", value=args.jobs)
    # as pdsim run: --out checked, created and locked before any point runs, the files staged and moved in
    with OutputFolder(out):
        ex = None
        if args.scheduler:               # as plan: a Dask cluster instead of local processes
            from .plan import DaskExecutor
            ex = DaskExecutor(args.scheduler)
        try:
            result = run_sweep(args.scenario, args.set, args.jobs, progress=not args.quiet, executor=ex)
        finally:
            if ex is not None:
                ex.close()
        path = write_sweep_outputs(result, out)
    print_goodput(result)
    print(f"\nwrote {out}/ (sweep.csv, sweep.json, {path.name}): {len(result['rows'])} rows in "
          f"{result['wall_s']:.1f} s", file=sys.stderr)
    return 0


def cmd_plan(args) -> int:
    from .plan import load_plan
    from .output import OutputFolder
    if args.executor == "local" and args.scheduler:
        raise ConfigError("only used with --executor dask (drop --executor local)", key="--scheduler",
                          value=args.scheduler)
    args.executor = args.executor or ("dask" if args.scheduler else "local")   # --scheduler implies dask
    if args.executor == "dask" and args.jobs:
        raise ConfigError("only used with --executor local (Dask workers are sized by the cluster)",
                          key="--jobs", value=args.jobs)
    jobs, cores = args.jobs, _cores()
    if jobs and jobs > cores and not args.force_jobs:
        print(f"pdsim: --jobs {jobs} capped at {cores}, the cores this process may use "
              "(--force-jobs to start them all)", file=sys.stderr)
        jobs = cores
    if args.executor == "local" and not jobs:
        jobs = cores        # os.cpu_count() counts cores a container or taskset may not let us use
    plan = load_plan(args.plan, args.set)
    out = Path(args.out or f"reports/{Path(args.plan).stem}")
    with OutputFolder(out):
        return _plan(args, plan, out, jobs)


def _plan(args, plan, out: Path, jobs: int | None) -> int:
    from .plan import DaskExecutor, LocalExecutor, clear_plan_outputs, print_table, run_plan, write_plan_outputs
    clear_plan_outputs(out)          # a plan that ends without a winner must not leave the last one's
    cache = None if args.no_cache else Path(args.cache or out / "cache")
    if cache is not None and cache.exists() and not cache.is_dir():
        raise ConfigError("exists and is not a folder", key="--cache", value=str(cache))
    if args.executor == "dask":
        try:
            ex = DaskExecutor(args.scheduler)
        except ValueError as exc:     # distributed rejects an address it cannot parse
            raise ConfigError(f"not a Dask scheduler address: {exc}", key="--scheduler",
                              value=args.scheduler) from None
    else:
        ex = LocalExecutor(jobs)
    if not args.quiet:
        margin = sum(1 for e in plan.excluded if "goodput.error_margin" in e["reason"])
        print(f"pdsim plan: {len(plan.configs)} configs in the search space ({len(plan.excluded) - margin} excluded by "
              f"budget or fit" + (f", {margin} with no measured error band for goodput.error_margin" if margin else "")
              + f"; plan.json lists each) on the {ex.name} executor", file=sys.stderr)
    try:
        result = run_plan(plan, ex, cache, progress=not args.quiet)
    finally:
        ex.close()
    write_plan_outputs(plan, result, out, progress=not args.quiet)
    if args.format == "json":      # the ranked rows as plan.csv has them (units in the keys), and the winner
        from .plan import TABLE_COLS
        print(json.dumps({"winner": result["winner"], "rows": [{k: r.get(k) for k in TABLE_COLS}
                                                                for r in result["rows"]]}, indent=2, default=str))
    else:
        print_table(result)
    print(f"\nwrote {out}/ (plan.csv, plan.json, plan.html{', winner.yaml' if result['winner'] else ''}): "
          f"{result['simulations']} simulations, {result['cached']} cached, {result['wall_s']:.1f} s", file=sys.stderr)
    return 0 if result["winner"] else 1


def cmd_validate(args) -> int:
    from .validate import (bad_value_lines, check_defaults, parse_profiles, read_measured, silicon_sample_path,
                           validate, write_outputs)
    check_defaults(args.device, args.tp, args.engine)      # a bad flag is one line, not every row skipped
    files = list(args.measured)
    if args.silicon:
        files.append(silicon_sample_path())
    if not files:
        raise ConfigError("give a measured file (silicon CSV, vllm bench serve JSON, GenAI-Perf JSON) or --silicon",
                          key="validate")
    defaults = {k: v for k, v in (("device", args.device), ("tp", args.tp), ("engine", args.engine)) if v}
    rows = [r for f in files for r in read_measured(f, defaults)]
    if args.sample and args.sample < len(rows):
        import numpy as np
        keep = sorted(np.random.default_rng(args.seed).choice(len(rows), args.sample, replace=False).tolist())
        rows = [rows[i] for i in keep]
    if args.range_ratio is not None and not 0 < args.range_ratio <= 1:
        raise ConfigError("must be in (0, 1]", key="--range-ratio", value=args.range_ratio)
    profiles = parse_profiles(args.profile, args.profiles, {r.get("device") for r, why in rows if why is None})
    step_overhead = None
    if args.step_overhead:
        from .engine_fit import load_step_overheads
        step_overhead = load_step_overheads(args.step_overhead)
        if args.no_engine:
            raise ConfigError("needs the engine presets (drop --no-engine)", key="--step-overhead",
                              value=args.step_overhead)
    res = validate(rows, engine_presets=not args.no_engine, requests_per_client=args.requests_per_client,
                   client_mode=args.client, step_overhead=step_overhead,
                   profiles=profiles, length_ratio=args.range_ratio, shared_prefix=args.shared_prefix_tokens,
                   progress=None if args.quiet else
                   lambda i, n, r: print(f"pdsim validate: {i}/{n} {r['id']}", file=sys.stderr, flush=True))
    out = Path(args.out or "reports/validate")
    write_outputs(res, out)
    c = res["counts"]
    for line in bad_value_lines(res["skipped"]):          # errors in the input: printed even with --quiet
        print(f"pdsim validate: {line}", file=sys.stderr)
    print(f"{c['rows_in']} rows, {c['simulated']} simulated, {c['skipped']} skipped "
          f"{c['skipped_by_reason']}")
    from .validate import GROUP
    for g in res["groups"]:
        key = tuple(g[k] for k in GROUP)
        one_token = all(r["osl"] <= 1 for r in res["rows"] if tuple(str(r[k]) for k in GROUP) == key)
        if g["tpot_mape"] is None and one_token:      # no inter-token gap to compare
            tpot, tpot_ratio = "no TPOT: 1-token replies", ""
        else:
            tpot = f"TPOT MAPE {_fmt(g['tpot_mape'])}%"
            r = g.get("tpot_measured_over_sim_p90")
            tpot_ratio = f"  TPOT {_fmt(r)}x" if r is not None and r == r else "  TPOT -"
        print(f"  {g['model']:14s} {g['device']:9s} {g['engine']:8s} {g['mode']:4s} n={g['rows']:<4d} "
              f"TTFT MAPE {_fmt(g['ttft_mape'])}%  {tpot}  measured/simulated p90 "
              f"TTFT {_fmt(g.get('ttft_measured_over_sim_p90'))}x{tpot_ratio}")
    from .validate import kv_bound
    kvb = [r["id"] for r in res["rows"] if kv_bound(r)]
    if kvb:
        print(f"{len(kvb)} KV-bound row(s): the simulated KV pool holds fewer full-length requests than the run "
              f"had clients, so the run's memory setting decides their TTFT (kv_holds_requests in validate.csv): "
              f"{', '.join(map(str, kvb[:5]))}{' ...' if len(kvb) > 5 else ''}")
    from .validate import over_gemm_rate
    over = sorted((r for r in res["rows"] if over_gemm_rate(r)), key=lambda r: -r["implied_gemm_util"])
    if over:
        print(f"{len(over)} row(s) beyond pdsim's GEMM ceiling: the rate they were served at (measured, or by "
              f"Little's law) needs more linear-layer work per second than pdsim's cost model lets their GPUs do "
              f"(implied_gemm_util > 1 in validate.csv), so pdsim is too slow on them whatever the scheduler does: "
              f"cache hits (--shared-prefix-tokens), faster GEMMs than the profile, or an overstated rate: "
              + ", ".join(f"{r['id']} ({r['implied_gemm_util']:.2f}x)" for r in over[:5])
              + (" ..." if len(over) > 5 else ""))
    print(f"wrote {out}/ (validate.csv, skipped.csv, validate.json, validate.html)", file=sys.stderr)
    return 0 if c["simulated"] else 1


# commands whose parsers live in heavier modules: imported only when one of them may be parsed
_LAZY_COMMANDS = {"calibrate": "measure this machine with torch and write a measured device profile",
                  "profile": "list device profiles; import public measured kernel databases"}


def build_parser(argv: list[str] | None = None) -> argparse.ArgumentParser:
    """The whole CLI.  Given the arguments about to be parsed, and they start with a command other than
    calibrate or profile (or are ``--help``), those two get help-only stubs instead of importing their
    modules (a faster start for ``pdsim run`` and ``pdsim --help``; ``pdsim calibrate ...`` and ``pdsim
    profile ...`` build their own)."""
    # `pdsim --help` lists the commands only: the stubs carry the real parsers' one-line help (tested)
    stubs = bool(argv) and argv[0] not in _LAZY_COMMANDS and (not argv[0].startswith("-")
                                                               or argv[0] in ("-h", "--help"))
    ap = _Parser(prog="pdsim", description="Simulate colocated and prefill/decode-"
                                 "disaggregated LLM serving.")
    sub = ap.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run", help="simulate every topology of a scenario on the same requests")
    r.add_argument("scenario", help="scenario YAML file")
    r.add_argument("--out", metavar="FOLDER",
                   help="output folder (default reports/<scenario name>); checked and locked before simulating, "
                        "its run files replaced only once all are written; other files in it are kept")
    r.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="override a scenario key in its own units, e.g. --set workload.rate=8 (requests/s)")
    r.add_argument("--quiet", action="store_true", help="no progress output on stderr")
    r.add_argument("--step-by-step", action="store_true",
                   help="one event per engine step (the reference loop; slower, same results)")
    r.add_argument("--no-report", action="store_true", help="write the tables and summary.json, skip report.html")
    r.add_argument("--requests-format", choices=("csv", "parquet"), default="csv",
                   help="the per-request table: requests.csv (default) or requests.parquet (typed columns, "
                        "smaller and faster to write for big runs; needs pyarrow: pip install 'pdsim[parquet]')")
    r.add_argument("--format", choices=["table", "json"], default="table",
                   help="stdout: a table (latencies in ms) or summary.json's per-topology dicts (seconds)")
    r.set_defaults(fn=cmd_run)
    e = sub.add_parser("estimate", help="cost-model time of one prefill or decode step")
    e.add_argument("--model", required=True, help="model preset name, e.g. llama-3.1-8b")
    e.add_argument("--device", required=True, help="device preset name (e.g. h100-sxm) or device-profile YAML")
    e.add_argument("--tp", type=_int_in(1, 1024), default=1, metavar="GPUS",
                   help="tensor-parallel degree in GPUs (default 1; must divide the attention heads)")
    e.add_argument("--ep", type=_int_in(1, 1024), default=1, metavar="GPUS",
                   help="expert-parallel degree of an MoE model (default 1; must divide the experts and --tp)")
    e.add_argument("--pp", type=_int_in(1, 1024), default=1, metavar="STAGES",
                   help="pipeline-parallel stages (default 1; at most the layers, split as vLLM splits them: L // pp "
                        "each, the rest one each to the stages before the last); an instance has tp x pp GPUs")
    e.add_argument("--pp-layers", type=_int_list, default=None, metavar="N,N,...",
                   help="explicit layers per pipeline stage under --pp (one count per stage, summing to the layers)")
    e.add_argument("--micro-batches", type=_int_in(1, 4096), default=None, metavar="M",
                   help="micro-batches (groups of requests) in flight under --pp (default: pp)")
    e.add_argument("--dp-attention", action="store_true",
                   help="attention data-parallel over the --tp GPUs (each GPU its own requests and KV), experts "
                        "expert-parallel over all of them (MoE models; needs --ep equal to --tp)")
    e.add_argument("--expert-skew", type=_float_in(0.0, 4.0), default=0.0, metavar="S",
                   help="expert popularity skew of an MoE model: Zipf exponent, 0 (uniform, default) to 4")
    e.add_argument("--prefill", type=_int_in(1, MAX_TOKENS), metavar="TOKENS",
                   help="prompt length in tokens of each prompt in a prefill step")
    e.add_argument("--batch", type=_int_in(1, 10**6), default=1, metavar="PROMPTS",
                   help="prompts in the prefill batch (default 1)")
    e.add_argument("--decode-batch", type=_int_in(1, 10**6), metavar="REQUESTS",
                   help="requests in a decode step (one new token each)")
    e.add_argument("--context", type=_int_in(0, MAX_TOKENS), default=1024, metavar="TOKENS",
                   help="context length in tokens of each decoding request (default 1024)")
    from .models import DTYPE_BYTES
    e.add_argument("--weight-dtype", default="bf16", choices=list(DTYPE_BYTES),
                   help="weight data type (default bf16; fp4 = NVFP4, fp4 tensor cores where the device has them)")
    e.add_argument("--kv-dtype", default="bf16", choices=[d for d in DTYPE_BYTES if d not in ("int4", "fp4")],
                   help="KV-cache data type (default bf16)")
    e.add_argument("--moe-tables", action="store_true",
                   help="price routed experts from the profile's measured MoE tables (imported profiles; off by default)")
    e.add_argument("--mla-tables", action=argparse.BooleanOptionalAction, default=True,
                   help="price MLA attention from the profile's measured MLA tables where it has them (imported "
                        "profiles; on by default, --no-mla-tables: the roofline)")
    e.add_argument("--a2a-tables", action="store_true",
                   help="price the MoE all-to-all from the profile's measured DeepEP tables (imported profiles; "
                        "off by default)")
    e.add_argument("--engine", help="serving engine preset (vllm-v1, vllm-v0, sglang, trtllm): its step "
                   "overhead and KV sizing")
    e.add_argument("--json", action="store_true", help="same as --format json")
    e.add_argument("--format", choices=["table", "json"], default="table", help="stdout format (json: seconds, "
                   "FLOPs, bytes)")
    e.set_defaults(fn=cmd_estimate)
    pl = sub.add_parser("plan", help="find the cheapest deployment that meets the SLO (goodput search)")
    pl.add_argument("plan", help="plan YAML file")
    pl.add_argument("--out", metavar="FOLDER",
                    help="output folder (default reports/<plan name>); checked and locked before searching")
    pl.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                    help="override a plan key in its own units, e.g. --set target.rate=10 (requests/s)")
    pl.add_argument("--executor", choices=["local", "dask"],
                    help="where simulations run: local processes or a Dask cluster (default local; dask with "
                         "--scheduler)")
    pl.add_argument("--scheduler", type=_dask_address, metavar="ADDRESS",
                    help="Dask scheduler address tcp://HOST:PORT, e.g. tcp://10.0.0.5:8786 (implies --executor dask)")
    pl.add_argument("--jobs", type=_int_in(1, 4096), metavar="PROCESSES",
                    help="local worker processes (default: the cores this process may use; more are capped "
                         "at that unless --force-jobs)")
    pl.add_argument("--force-jobs", action="store_true",
                    help="start --jobs processes even when that is more than the cores")
    pl.add_argument("--cache", metavar="FOLDER", help="result cache folder (default OUT/cache)")
    pl.add_argument("--no-cache", action="store_true", help="simulate everything; read and write no cache")
    pl.add_argument("--quiet", action="store_true", help="no progress output on stderr")
    pl.add_argument("--format", choices=["table", "json"], default="table",
                    help="stdout: the ranked table, or {winner, rows} as JSON (rates in requests/s, costs in $/h)")
    pl.set_defaults(fn=cmd_plan)
    sw = sub.add_parser("sweep", help="run a scenario over a grid of values: attainment, TTFT/TPOT and cost vs "
                        "the swept key, and each topology's goodput")
    sw.add_argument("scenario")
    sw.add_argument("--set", action="append", default=[], metavar="KEY=VALUES",
                    help="an axis: KEY=lo:hi:step (hi included) or KEY=a,b,c, e.g. workload.rate=2:20:2 "
                    "(requests/s); any other KEY=VALUE applies to every point")
    sw.add_argument("--out", metavar="FOLDER", help="output folder (default reports/<scenario name>-sweep)")
    sw.add_argument("--jobs", type=_int_in(1, 4096), metavar="PROCESSES",
                    help="local worker processes (default: all cores)")
    sw.add_argument("--scheduler", metavar="ADDRESS",
                    help="run the points on a Dask cluster: scheduler address tcp://HOST:PORT (needs "
                         "'pdsim[dask]'; workers need pdsim and the scenario's referenced files at the same paths)")
    sw.add_argument("--quiet", action="store_true", help="no progress output on stderr")
    sw.set_defaults(fn=cmd_sweep)
    ls = sub.add_parser("list", help="models (params, KV bytes/token), devices (peak FLOP/s, HBM GB/s, memory, "
                        "measured or datasheet), KV links (GB/s, us), engines (scheduler, budgets, step overhead us), "
                        "scenarios")
    ls.add_argument("what", choices=["models", "devices", "links", "engines", "scenarios"])
    ls.add_argument("where", nargs="?", help="scenarios: folder (default ./scenarios); devices: a folder of "
                    "profile .yaml files to list beside the presets (default ./calibration/profiles)")
    ls.add_argument("--format", choices=["table", "json"], default="table",
                    help="stdout: an aligned table, or a JSON list of rows (units in the key names)")
    ls.set_defaults(fn=cmd_list)
    va = sub.add_parser("validate", help="simulate measured benchmark runs and report pdsim's error")
    va.add_argument("measured", nargs="*", help="silicon CSV, `vllm bench serve` JSON or GenAI-Perf JSON")
    va.add_argument("--silicon", action="store_true", help="add the silicon sample of an installed aiconfigurator-core")
    va.add_argument("--out", help="output folder (default reports/validate)")
    va.add_argument("--device", help="GPU of JSON results that do not name one (e.g. h100-sxm)")
    va.add_argument("--tp", type=int, help="tensor parallelism of JSON results that do not give it")
    va.add_argument("--engine", help="engine of JSON results that do not give it (vllm-v1, vllm-v0, sglang, trtllm)")
    va.add_argument("--no-engine", action="store_true", help="simulate with the idealised engine (no presets)")
    va.add_argument("--profile", action="append", metavar="DEVICE=PATH",
                    help="price this GPU's rows with a profile file (e.g. an imported measured one); repeatable")
    va.add_argument("--profiles", metavar="PATTERN", help="price each GPU's rows with the profile whose file name "
                    "starts with the GPU, from a folder or glob (e.g. 'calibration/profiles/*-aic.yaml')")
    va.add_argument("--step-overhead", metavar="FILE", help="engine step overheads fitted by `pdsim calibrate "
                    "--from-benchmark` (its YAML) instead of the presets', for the engines it names")
    va.add_argument("--range-ratio", type=float, help="the benchmark's --random-range-ratio for every row: lengths "
                    "uniform in [int(L x R), L] (default: recognised harnesses' own, else fixed lengths)")
    va.add_argument("--sample", type=_int_in(0, 10**9), metavar="ROWS",
                    help="simulate a seeded random sample of this many rows (0: all)")
    va.add_argument("--seed", type=int, default=0, help="seed of the sample and of each row's request stream")
    va.add_argument("--requests-per-client", type=_int_in(1, 10**6), default=10, metavar="REQUESTS",
                    help="closed-loop requests each client sends per row (default 10)")
    va.add_argument("--client", choices=("auto", "sync", "steady", "stagger"), default="auto",
                    help="how the measured clients sent and what they counted: sync (all start together, every "
                         "request measured, as vllm bench serve --max-concurrency), steady (the cold first wave "
                         "left out: a long run), stagger (first sends spread over one request's time); auto "
                         "(default): steady for silicon rows of an unknown harness, sync otherwise")
    va.add_argument("--shared-prefix-tokens", type=_int_in(0, 10**7), default=0, metavar="TOKENS",
                    help="the benchmark's prompts all began with the same this many tokens and the engine cached "
                         "prefixes: every row's pool caches prefixes and that many of each row's ISL are shared "
                         "(vllm bench serve --random-prefix-len P with prefix caching on: P, with ISL = "
                         "--random-input-len + P; default 0: fresh prompts, no cache)")
    va.add_argument("--quiet", action="store_true", help="no progress output on stderr")
    va.set_defaults(fn=cmd_validate)
    rp = sub.add_parser("report", help="rebuild report.html from a run's output folder")
    rp.add_argument("dir", help="a pdsim run output folder (summary.json, requests.csv or requests.parquet, "
                                "timeseries.csv); "
                                "checked before anything is drawn")
    rp.set_defaults(fn=cmd_report)
    if stubs:
        for cmd, text in _LAZY_COMMANDS.items():
            sub.add_parser(cmd, help=text)
        return ap
    try:
        from . import calibrate
        calibrate.add_parser(sub)
    except ImportError:
        pass
    from . import profile_import
    profile_import.add_parser(sub)
    return ap


def main(argv=None) -> int:
    try:
        args = build_parser(sys.argv[1:] if argv is None else list(argv)).parse_args(argv)
    except SystemExit as exc:       # --help (0) or a bad flag (2, one line already printed)
        return exc.code if isinstance(exc.code, int) else 2
    import warnings
    # pdsim's own warnings are for the user: one line each, not a source location and a code excerpt
    # (another library's keep their usual form)
    plain = warnings.formatwarning
    here = str(Path(__file__).resolve().parent)

    def one_line(msg, cat, filename, lineno, line=None):
        if str(Path(filename).resolve()).startswith(here):
            return f"pdsim: warning: {msg}\n"
        return plain(msg, cat, filename, lineno, line)
    warnings.formatwarning = one_line
    try:
        return args.fn(args) or 0
    except PdsimError as exc:
        print(f"pdsim: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
