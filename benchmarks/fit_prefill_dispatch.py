"""The TTFT floor of the silicon sample's runs: fit it on the train half, check it on the held-out half.

NVIDIA's measured serving runs (aiconfigurator-core 0.12.0's silicon sample) show a floor under the
first token that no kernel explains: DeepSeek-R1 on 8 H200 (SGLang 0.5.9, InferenceMAX, 4 clients) takes
260 ms to the first token of a 1024-token prompt and 447 ms for 8192 tokens, where pdsim (kernels, step
overheads) said 72 and 352 ms; TRT-LLM and SGLang on B200 show the same 150-230 ms at 1024 tokens, and the
floor grows with the model (gpt-oss-120b 20-30 ms, Llama-3.1-70B TP8 15-35 ms).  The same rows' TPOT is
already right (SGLang H200 DeepSeek: 9.3 / 12.3 / 17.5 / 24.9 ms simulated against 10.3 / 12.5 / 16.6 /
23.3 measured at 4-32 clients), so the floor does not stall the GPU: a cost added to every prefill step
(eager dispatch of the layers' kernels, ``step_overhead.prefill_per_layer_us``) makes those TPOTs 20-40%
too slow (``--per-step`` reproduces that: TTFT better, TPOT worse on the train half).  A per-request
front-end latency before the scheduler takes no GPU time (pool key ``frontend_latency_ms``; engine preset
terms ``frontend_per_layer_us`` x layers + ``frontend_per_moe_layer_us`` x MoE layers, pdsim/engines.py;
NVIDIA's AIConfigurator adds a per-layer constant to each request's TTFT for vLLM in the same way).

**Not adopted as a default** (the presets keep 0): the floor is a property of the InferenceMAX runs, not of
every run of an engine.  Fitted on the train half's rows with at most 8 clients, MoE layers only
(``--fit-max-concurrency 8 --moe-only``: SGLang 3250, TRT-LLM 1850, vLLM 800 us per MoE layer), then
simulated (benchmarks/validate_moe_silicon.py --split test --frontend ...), held-out InferenceMAX MoE rows
improve (SGLang H200 TTFT MAPE 55.8% -> 9.1%, TRT-LLM B200 57.7% -> 25.8%) while NVIDIA's own sweeps of the
same engines get far worse (TRT-LLM H100 Qwen3-235B / gpt-oss 38.1% -> 90.8%, vLLM H200 Qwen3-235B 59.8% ->
148.5%); with a
per-layer term for dense models too, the held-out dense rows of those sweeps go from 42.7% to 67.8% (TRT-LLM
H100) and 52.7% to 94.1% (vLLM H100), partly because a constant delay re-synchronises pdsim's closed-loop
clients into lock-stepped waves.  What the floor is physically is not known.  A user whose stack shows
one (TTFT of a lone short request minus ``pdsim estimate``'s prefill step) sets ``frontend_latency_ms``.

Default mode (``--csv``): from one ``pdsim validate --silicon`` run's validate.csv, per engine: the
per-layer value on the train half's dense rows (none with ``--moe-only``), then the per-MoE-layer value on
its MoE rows, each the grid value with the least mean |log(simulated / measured)| of mean TTFT when the
latency is added to the simulated TTFT (exact for one request; in a closed loop it moves the clients, so
the check that counts is the simulation above).  Rows are split as benchmarks/validate_silicon.py splits
them (odd CRC32 of the id: held out); the sample repeats some measurements under new ids, and each is
kept once, on its first id's side.  KV-bound rows (the pool holds fewer full-length requests than the run
had clients) are left out.  Prints each group before and after, train and held out.

    pdsim validate --silicon --out /tmp/val --quiet    # once (about 30 min on 2 busy cores)
    .venv/bin/python benchmarks/fit_prefill_dispatch.py --csv /tmp/val/validate.csv --fit-max-concurrency 8 --moe-only
    .venv/bin/python benchmarks/fit_prefill_dispatch.py --per-step [--sample 100]   # the per-step variant
"""
from __future__ import annotations

import argparse
import sys
import time
import zlib
from pathlib import Path

import numpy as np
import pandas as pd

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from pdsim.models import get_model  # noqa: E402
from pdsim.validate import MOE_MODELS, error_stats, kv_bound, read_measured, silicon_sample_path, validate  # noqa: E402

ENGINES = ("sglang", "trtllm", "vllm-v1")
KEY = ["model", "device", "engine", "tp", "isl", "osl", "concurrency", "weight_dtype", "ttft_ms", "tpot_ms"]
GRID_US = np.arange(0, 10001, 50.0)        # per layer / per MoE layer


def held_out(rid) -> bool:
    """The project's split (benchmarks/validate_silicon.py, validation_error.json): odd CRC32 of the row id."""
    return zlib.crc32(str(rid).encode()) % 2 == 1


def errors(meas, sim) -> dict:
    r = sim / meas
    return {"log": float(np.mean(np.abs(np.log(r)))), "mape": float(np.mean(np.abs(r - 1)) * 100),
            "median": float(np.median(np.abs(r - 1)) * 100), "bias": float(np.mean(r - 1) * 100)}


def posthoc(csv: str, fit_max_concurrency: int | None = None, moe_only: bool = False) -> None:
    d = pd.read_csv(csv)
    d = d[d.engine.isin(ENGINES) & (d.sim_ttft_ms > 0) & (d.kv_holds_requests >= d.concurrency)]
    d = d.drop_duplicates(KEY).copy()       # a measurement listed under several ids: once, on its first id's side
    d["held"] = [held_out(r) for r in d.id]
    shapes = {m: get_model(m) for m in d.model.unique()}
    d["layers"] = d.model.map(lambda m: shapes[m].layers)
    d["moe_layers"] = d.model.map(lambda m: shapes[m].moe_layers)
    d["moe"] = d.moe_layers > 0
    fit = {}
    for eng in ENGINES:
        tr = d[(d.engine == eng) & ~d.held]
        if fit_max_concurrency:        # fit where the floor is not mixed with queueing
            tr = tr[tr.concurrency <= fit_max_concurrency]
        den, moe = tr[~tr.moe], tr[tr.moe]
        a = min(GRID_US, key=lambda v: errors(den.ttft_ms, den.sim_ttft_ms + v * 1e-3 * den.layers)["log"]) \
            if len(den) and not moe_only else 0.0
        b = min(GRID_US, key=lambda v: errors(moe.ttft_ms, moe.sim_ttft_ms + (a * moe.layers + v * moe.moe_layers)
                                              * 1e-3)["log"]) if len(moe) else 0.0
        fit[eng] = (float(a), float(b))
        print(f"{eng:8s} fitted on the train half ({len(den)} dense, {len(moe)} MoE rows): "
              f"frontend_per_layer_us {a:g}, frontend_per_moe_layer_us {b:g}")
    print(f"\n{'split':8s} {'engine':8s} {'model':5s} {'rows':>4s}   TTFT |log| before -> after   MAPE before -> "
          f"after   median APE   bias (sim/measured - 1)")
    for held in (False, True):
        groups = [(e, m) for e in ENGINES for m in (False, True)] + [("all", None)]
        for eng, moe in groups:
            x = d[(d.held == held) & ((d.engine == eng) if eng != "all" else True)
                  & ((d.moe == moe) if moe is not None else True)]
            if not len(x):
                continue
            extra = np.array([(fit[e][0] * L + fit[e][1] * M) * 1e-3 for e, L, M in zip(x.engine, x.layers,
                                                                                       x.moe_layers)])
            e0, e1 = errors(x.ttft_ms, x.sim_ttft_ms), errors(x.ttft_ms, x.sim_ttft_ms + extra)
            kind = "all" if moe is None else ("MoE" if moe else "dense")
            print(f"{'held-out' if held else 'train':8s} {eng:8s} {kind:5s} {len(x):4d}   {e0['log']:.3f} -> "
                  f"{e1['log']:.3f}   {e0['mape']:6.1f}% -> {e1['mape']:6.1f}%   {e0['median']:5.1f}% -> "
                  f"{e1['median']:5.1f}%   {e0['bias']:+5.0f}% -> {e1['bias']:+5.0f}%")


# --- the rejected variant: the same floor as a cost of every prefill step (stalls the GPU) -----------------
def _sample(rows, n, seed):
    if n and n < len(rows):
        idx = np.random.default_rng(seed).choice(len(rows), n, replace=False)
        return [rows[i] for i in sorted(idx.tolist())]
    return rows


def _run(rows, per_layer: dict, per_moe: dict) -> list[dict]:
    ovh = {e: {"prefill_per_layer_us": per_layer.get(e, 0.0), "prefill_per_moe_layer_us": per_moe.get(e, 0.0)}
           for e in ENGINES}
    out = validate([(r, None) for r in rows], step_overhead=ovh)["rows"]
    return [r for r in out if not kv_bound(r)]


def _table(label, rs):
    for eng in sorted({r["engine"] for r in rs}) + ["all"]:
        e = [r for r in rs if eng == "all" or r["engine"] == eng]
        if e:
            s, lg = error_stats(e), errors(np.array([r["ttft_ms"] for r in e]), np.array([r["sim_ttft_ms"] for r in e]))
            print(f"  {label:30s} {eng:8s} n={len(e):3d}  TTFT |log| {lg['log']:.3f}  MAPE {s['ttft_mape_pct']:6.1f}% "
                  f"bias {s['ttft_bias_pct']:+5.0f}%   TPOT MAPE {s['tpot_mape_pct']:5.1f}% bias "
                  f"{s['tpot_bias_pct']:+4.0f}%", flush=True)


def per_step(sample: int, seed: int) -> None:
    usable, seen = [], set()
    for r, w in read_measured(silicon_sample_path()):
        k = tuple(r.get(c) for c in KEY)
        if w is None and r["engine"] in ENGINES and k not in seen:
            seen.add(k)
            usable.append(r)
    train = [r for r in usable if not held_out(r["id"])]
    dense = _sample([r for r in train if r["model"] not in MOE_MODELS.values()], sample, seed)
    moe = _sample([r for r in train if r["model"] in MOE_MODELS.values()], sample, seed)
    for v in (0.0, 250.0, 500.0, 1000.0, 2000.0):
        t0 = time.perf_counter()
        _table(f"dense, {v:g} us per layer", _run(dense, {e: v for e in ENGINES}, {}))
        _table(f"MoE, {v:g} us per MoE layer", _run(moe, {}, {e: v for e in ENGINES}))
        print(f"    ({time.perf_counter() - t0:.0f} s)", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--csv", help="validate.csv of `pdsim validate --silicon`")
    ap.add_argument("--per-step", action="store_true", help="the rejected variant: a cost of every prefill step")
    ap.add_argument("--sample", type=int, default=100, help="--per-step: train rows per kind (0: all)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--fit-max-concurrency", type=int, help="fit only on train rows with at most this many clients")
    ap.add_argument("--moe-only", action="store_true", help="no per-layer term: the MoE layers' only (dense rows get none)")
    args = ap.parse_args()
    if args.per_step:
        return per_step(args.sample, args.seed)
    if not args.csv:
        raise SystemExit("give --csv (validate.csv of `pdsim validate --silicon`) or --per-step")
    posthoc(args.csv, args.fit_max_concurrency, args.moe_only)


if __name__ == "__main__":
    main()
