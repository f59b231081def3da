"""Datasheet roofline vs measured kernel tables, composed op by op into step times.

For H100, H200, A100 and B200 (the datasheet presets ``h100-sxm``, ``h200``, ``a100-80gb-sxm``, ``b200`` against the
profiles imported from NVIDIA aiconfigurator-core 0.12.0, TRT-LLM backend, in calibration/profiles/),
Llama-3.1-8B, Qwen3-32B and Llama-3.1-70B at TP 1/2/4/8 (bf16 weights and KV), one step of:
prefill of one prompt of 128 ... 16384 tokens, and decode of batch 1 ... 512 at context 128 ... 32768
(configurations whose weights and KV cache do not fit in 90% of the GPU are skipped).

The reference ("tables") is the cost model on the imported profile, summed over the kernels the
tables serve: the four linear layers, attention, the all-reduces (TP > 1) and the LM head where its
shape is in the table.  A step counts only when each of those comes from a table point or between
table points (never an extrapolation).  Elementwise kernels and the per-step engine overhead have no
table in the package and are left out of both sides.

The shapes are split in two: the efficiency constants are fitted (``--refit``) on kernels of the
even-indexed prompt lengths, batches and contexts (128, 512, 2048, 8192 tokens; batch 1, 4, 16, 64,
256 x context 128, 512, 2048, 8192, 32768) and every error below is on the held-out odd-indexed ones
(256, 1024, 4096, 16384; batch 2, 8, 32, 128, 512 x context 256, 1024, 4096, 16384).

Run: .venv/bin/python benchmarks/check_kernels.py [--refit] [--speed]   (~1 minute; --speed adds ~1 min)
     .venv/bin/python benchmarks/check_kernels.py --refit-fp8 --devices H100,H200,B200   (fp8 dense GEMMs)
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from pdsim import fitting, kernels  # noqa: E402
from pdsim.costmodel import RooflineCost  # noqa: E402
from pdsim.devices import DeviceProfile, ProfileSpec, get_device, load_profile_file  # noqa: E402
from pdsim.models import get_model  # noqa: E402

PROFILES = REPO / "calibration" / "profiles"
DEVICES = {"H100": ("h100-sxm", PROFILES / "h100_sxm-trtllm-aic.yaml"),
           "H200": ("h200", PROFILES / "h200_sxm-trtllm-aic.yaml"),
           "A100": ("a100-80gb-sxm", PROFILES / "a100_sxm-trtllm-aic.yaml"),
           "B200": ("b200", PROFILES / "b200_sxm-trtllm-aic.yaml")}
MODELS = ["llama-3.1-8b", "qwen3-32b", "llama-3.1-70b"]
TPS = [1, 2, 4, 8]
PREFILL = [128, 256, 512, 1024, 2048, 4096, 8192, 16384]
BATCH = [1, 2, 4, 8, 16, 32, 64, 128, 256, 512]
CONTEXT = [128, 256, 512, 1024, 2048, 4096, 8192, 16384, 32768]
SPLIT = {"fit": (PREFILL[0::2], BATCH[0::2], CONTEXT[0::2]), "held-out": (PREFILL[1::2], BATCH[1::2], CONTEXT[1::2])}
TABLE_OK = (kernels.EXACT, kernels.INTERPOLATED)
TABLE_NAMES = ("exact", "interpolated")


def steps(split: str):
    pre, bs, cs = SPLIT[split]
    for p in pre:
        yield "prefill", p, 0, (p, p * p / 2.0, p, 1, 1)
    for b in bs:
        for c in cs:
            yield "decode", b, c, (b, float(b * c), b * (c + 1), b, b)


def fits(model, dev, tp, kv_tokens) -> bool:
    return model.weight_bytes() / tp + kv_tokens * model.kv_bytes_per_token() / tp <= 0.9 * dev.memory_bytes


def kernel_sum(cm: RooflineCost, agg, ops: list[str]) -> float:
    bd = cm.breakdown(*agg)
    return sum(bd[k]["time_s"] for k in ops)


def served_ops(cm_meas: RooflineCost, agg) -> list[str] | None:
    """The kernels of this step the tables serve, or None when a required one is not served."""
    bd = cm_meas.breakdown(*agg)
    need = [n for n, _, _, _ in cm_meas.linears] + ["attention"] + (["allreduce"] if cm_meas.tp > 1 else [])
    if any(bd[k]["source"] not in TABLE_NAMES for k in need):
        return None
    return need + (["lm_head"] if bd.get("lm_head", {}).get("source") in TABLE_NAMES else [])


def configs(dev_meas):
    for name in MODELS:
        model = get_model(name)
        for tp in TPS:
            if model.heads % tp == 0 and fits(model, dev_meas, tp, 0):
                yield model, tp


# --- kernel points of the fit split, for --refit ---------------------------------------------------
def kernel_points(dev_meas):
    g, ap, ad, ar = set(), set(), set(), set()
    for model, tp in configs(dev_meas):
        cm = RooflineCost(model, dev_meas, tp)
        for phase, x, c, agg in steps("fit"):
            if not fits(model, dev_meas, tp, x * max(c, 1)):
                continue
            T = agg[0]
            for _, n, k, _ in cm.linears:
                g.add((T, n, k))
            qh, kvh, d = cm.q_heads, cm.kv_heads_shard, model.head_dim
            (ap if phase == "prefill" else ad).add((agg, qh, kvh, d))
            if tp > 1:
                ar.add((T * model.hidden * 2.0, tp))
    G = [(m, n, k, *kernels.gemm_time(dev_meas, m, n, k, 2.0)) for m, n, k in sorted(g)]
    G = np.array([r[:4] for r in G if r[4] in TABLE_OK])

    def attn(points, prefill):
        rows = []
        for agg, qh, kvh, d in sorted(points):
            T, w, kv, b, _ = agg
            t, code = kernels.attention_time(dev_meas, T, w, kv, b, (qh, kvh, d), prefill)
            if code in TABLE_OK:
                f, by = fitting.attention_flops_bytes(T, w, kv, qh, kvh, d)
                rows.append((float(f), float(by), t))
        return np.array(rows)
    A = [(s, tp, *kernels.allreduce_time(dev_meas, s, tp)) for s, tp in sorted(ar)]
    A = np.array([r[:3] for r in A if r[3] in TABLE_OK])
    return G, attn(ap, True), attn(ad, False), A


def refit(ds: DeviceProfile, dev_meas) -> tuple[dict, dict]:
    """Efficiency constants of the datasheet profile fitted to the tables' kernels (fit split)."""
    G, AP, AD, AR = kernel_points(dev_meas)
    peak, bw = ds.peak_flops("bf16"), ds.mem_bw_Bps
    fg = fitting.fit_gemm(G[:, 0], G[:, 1], G[:, 2], G[:, 3])
    gemm_max, memory = min(fg["compute_Fps"] / peak, 1.0), min(fg["bandwidth_Bps"] / bw, 1.0)
    ov = fg["overhead_s"]
    B = bw * memory
    (c_p, floor_p), rms_p = fitting.fit_log(
        lambda p: fitting.attention_kernel_model(AP[:, 0], AP[:, 1], p[0], B, ov, p[1]), AP[:, 2],
        [0.4 * peak, 10e-6], [peak, 1.0])
    (b_d, floor_d), rms_d = fitting.fit_log(
        lambda p: fitting.attention_kernel_model(AD[:, 0], AD[:, 1], 0.5 * c_p, p[0], ov, p[1]), AD[:, 2],
        [0.7 * bw, 10e-6], [bw, 1.0])
    link = ds.interconnect_Bps
    (ar_bw, ar_base, ar_peer), rms_a = fitting.fit_log(
        lambda p: fitting.allreduce_model(AR[:, 0], AR[:, 1], p[0], p[1], p[2]), AR[:, 2], [0.7 * link, 3e-6, 1e-6],
        [link, 1.0, 1.0])
    eff = {"gemm_max": gemm_max, "gemm_m_half": fg["m_half"], "memory": memory, "kernel_overhead_us": ov * 1e6,
           "attention_prefill": c_p / peak, "attention_prefill_floor_us": floor_p * 1e6,
           "attention_decode_memory": b_d / bw, "attention_decode_floor_us": floor_d * 1e6,
           "allreduce": ar_bw / link, "allreduce_base_us": ar_base * 1e6, "allreduce_per_peer_us": ar_peer * 1e6}
    eff = {k: float(f"{v:.3g}") for k, v in eff.items()}
    rms = {"gemm": (fg["rms_log_error"], len(G)), "attn_prefill": (rms_p, len(AP)), "attn_decode": (rms_d, len(AD)),
           "allreduce": (rms_a, len(AR))}
    return eff, rms


# --- fp8 dense GEMMs (--refit-fp8) -----------------------------------------------------------------
FP8_GRID = np.round(np.arange(0.20, 1.0001, 0.01), 2)
FP8_OVERHEADS = np.arange(0.0, 20.01, 0.5)


def fp8_gemm_points(dev_meas, split: str, table: str = "fp8") -> list[tuple]:
    """(m, n, k, measured s) of the fp8 GEMM tables (``table``: fp8_block, block-scaled, or fp8, per-tensor
    with its activation quantisation) at the linear-layer shapes of the three models and TPs, M from the
    split's prefill tokens and decode batches (table points or between them)."""
    pts = set()
    for model, tp in configs(dev_meas):
        cm = RooflineCost(model, dev_meas, tp, "fp8", "bf16")
        for _phase, _x, _c, agg in steps(split):
            for _, n, k, _ in cm.linears:
                pts.add((agg[0], n, k))
    out = []
    for m, n, k in sorted(pts):
        t, code = kernels.gemm_time(dev_meas, m, n, k, 1.0, 2.0, "fp8", None, table)
        if code in TABLE_OK:
            out.append((m, n, k, t))
    return out


def fp8_log_errors(ds: DeviceProfile, pts, fc: float, fm: float, ov) -> np.ndarray:
    dev = with_eff(ds, {"fp8_gemm_compute": fc, "fp8_gemm_memory": fm, "fp8_gemm_overhead_us": ov})
    return np.array([np.log(float(kernels.gemm_roofline(dev, m, n, k, 1.0, 2.0, "fp8")) / t) for m, n, k, t in pts])


def refit_fp8(ds: DeviceProfile, dev_meas, table: str = "fp8") -> dict:
    """(fp8_gemm_compute, fp8_gemm_memory, fp8_gemm_overhead_us) by least squares in log time on the fit
    split's fp8 GEMM points: coordinate descent over grids (fractions 0.20-1.00 by 0.01, overhead 0-20 us by
    0.5) from the bf16 constants, until nothing moves."""
    pts = fp8_gemm_points(dev_meas, "fit", table)

    def sse(fc, fm, ov):
        return float(np.sum(fp8_log_errors(ds, pts, fc, fm, ov) ** 2))
    # the overhead first, from the bf16 constants (the order the MoE fit of check_moe.py uses)
    ov, fc, fm = fitting.grid_descent(lambda o, c, m: sse(c, m, o), [FP8_OVERHEADS, FP8_GRID, FP8_GRID],
                                      [ds.spec.efficiency.kernel_overhead_us, 1.0, 1.0])
    return {"fp8_gemm_compute": fc, "fp8_gemm_memory": fm, "fp8_gemm_overhead_us": ov}


def with_eff(dev: DeviceProfile, eff: dict) -> DeviceProfile:
    d = dev.spec.model_dump()
    d["efficiency"] = {**d["efficiency"], **eff}
    return DeviceProfile(ProfileSpec.model_validate(d), dev.path)


def errors(ds: DeviceProfile, dev_meas, split: str, weight_dtype: str = "bf16", gemm_table: str | None = None) -> dict:
    """APE of the datasheet's step (kernel sum) against the tables' (their ``gemm_table`` GEMMs when given:
    fp8 weights can be priced by the per-tensor ``fp8`` or the block-scaled ``fp8_block`` tables), by phase and TP."""
    out: dict[str, list[float]] = {}
    skipped = 0
    for model, tp in configs(dev_meas):
        cm_m = RooflineCost(model, dev_meas, tp, weight_dtype, "bf16")
        if gemm_table is not None:
            cm_m.gemm_table_dtype = gemm_table
        cm_d = RooflineCost(model, ds, tp, weight_dtype, "bf16")
        for phase, x, c, agg in steps(split):
            if not fits(model, dev_meas, tp, x * max(c, 1)):
                continue
            ops = served_ops(cm_m, agg)
            if ops is None:
                skipped += 1
                continue
            ref = kernel_sum(cm_m, agg, ops)
            e = 100.0 * abs(kernel_sum(cm_d, agg, ops) - ref) / ref
            for key in ("all", phase, f"{phase} tp{tp}", f"{model.name} {phase}"):
                out.setdefault(key, []).append(e)
    res = {k: fitting.summarize(v) for k, v in out.items()}
    res["skipped"] = skipped
    return res


def show(label: str, res: dict, keys) -> None:
    cells = []
    for k in keys:
        s = res.get(k)
        cells.append(f"{k} {s['median_ape']:.1f}/{s['p90_ape']:.1f}% (n={s['n']})" if s and s["n"] else f"{k} -")
    print(f"  {label:28s} " + " | ".join(cells))


def speed(dev_path: Path) -> None:
    from pdsim import config
    from pdsim.simulation import simulate
    full = REPO.parent / "shared" / "traces" / "azure-llm-2023" / "AzureLLMInferenceTrace_conv.csv"
    trace = full if full.is_file() else REPO / "scenarios" / "traces" / "azure_conv_10min.csv"
    print(f"\nsimulation speed, {trace.name}, 4 colocated Llama-3.1-8B replicas (one run each):")
    t0 = time.perf_counter()
    load_profile_file(dev_path)
    print(f"  loading {dev_path.name}: {time.perf_counter() - t0:.2f} s (once per process)")
    walls = {}
    for dev in ("h100-sxm", str(dev_path)):
        sc = config.parse({"model": "llama-3.1-8b", "workload": {"arrival": "trace", "trace": {"path": str(trace)}},
                           "topologies": {"c": {"kind": "colocated", "replicas": 4, "device": dev}}}, "bench")
        c0, t0 = time.process_time(), time.perf_counter()
        res = simulate(sc)
        w, cpu = time.perf_counter() - t0, time.process_time() - c0
        walls[dev] = cpu          # CPU time of this process: less at the mercy of other jobs than wall time
        print(f"  {Path(dev).name:36s} {w:6.2f} s wall, {cpu:6.2f} s CPU, {res[0].events} SimPy events")
    print(f"  measured / datasheet (CPU time, profile loading included): {walls[str(dev_path)] / walls['h100-sxm']:.2f}x "
          "(target <= 1.5x)")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--refit", action="store_true", help="fit the datasheet efficiencies on the fit split and "
                                                         "report held-out error before and after")
    ap.add_argument("--speed", action="store_true", help="also time a simulation with the measured profile")
    ap.add_argument("--devices", default="H100,H200,A100")
    ap.add_argument("--refit-fp8", action="store_true",
                    help="fit the fp8 dense-GEMM constants (fp8_gemm_*) on the fit split's fp8 GEMM tables and "
                         "report fp8-weight steps (bf16 KV) held out, before and after")
    ap.add_argument("--fp8-table", choices=("fp8", "fp8_block"), default="fp8",
                    help="the fp8 GEMM tables --refit-fp8 fits: per-tensor (default: what an imported profile prices "
                         "fp8 weights with; it carries a ~9 us activation-quantisation kernel) or block-scaled")
    args = ap.parse_args()
    keys = ["all", "prefill", "decode", "decode tp4"]
    if args.refit_fp8:
        for gpu in args.devices.split(","):
            preset, path = DEVICES[gpu]
            meas, ds = load_profile_file(path), get_device(preset)
            if "fp8" not in ds.spec.peak_tflops:
                print(f"\n{gpu}: no fp8 tensor cores; nothing to fit")
                continue
            base = with_eff(ds, {"fp8_gemm_compute": 1.0, "fp8_gemm_memory": 1.0, "fp8_gemm_overhead_us": None})
            eff = refit_fp8(base, meas, args.fp8_table)
            # what the presets take: the throughput fractions; the launch cost stays the bf16 GEMMs' (the
            # tables' per-GEMM extra made the end-to-end silicon rows worse: calibration/README.md)
            applied = {**eff, "fp8_gemm_overhead_us": None}
            variants = (("bf16 constants", base), ("fitted (3)", with_eff(ds, eff)), ("applied", with_eff(ds, applied)))
            print(f"\n{gpu}: {preset} fp8 GEMMs fitted to {path.name}'s {args.fp8_table} tables: {eff}; "
                  f"applied: compute {eff['fp8_gemm_compute']}, memory {eff['fp8_gemm_memory']}, launch as bf16")
            committed = ds.spec.efficiency
            print(f"  committed preset: fp8_gemm_compute {committed.fp8_gemm_compute}, fp8_gemm_memory "
                  f"{committed.fp8_gemm_memory}, fp8_gemm_overhead_us {committed.fp8_gemm_overhead_us}")
            for split, table in (("fit", args.fp8_table), ("held-out", "fp8"), ("held-out", "fp8_block")):
                pts = fp8_gemm_points(meas, split, table)
                for label, d in variants:
                    e = d.spec.efficiency
                    r = np.exp(fp8_log_errors(d, pts, e.fp8_gemm_compute, e.fp8_gemm_memory, e.fp8_gemm_overhead_us))
                    big = np.array([m >= 1024 for m, *_ in pts])
                    print(f"  GEMMs {table:9s} {split:8s} {label:15s} n={len(r):4d} median APE "
                          f"{np.median(abs(r - 1)) * 100:5.1f}% p90 {np.quantile(abs(r - 1), .9) * 100:5.1f}%  "
                          f"median datasheet/table {np.median(r):.2f} (M >= 1024: {np.median(r[big]):.2f}, "
                          f"below: {np.median(r[~big]):.2f})")
            for table in ("fp8", "fp8_block"):
                for label, d in variants:
                    show(f"steps held out vs {table}, {label}", errors(d, meas, "held-out", "fp8", table), keys)
        return
    for gpu in args.devices.split(","):
        preset, path = DEVICES[gpu]
        t0 = time.perf_counter()
        meas, ds = load_profile_file(path), get_device(preset)
        print(f"\n{gpu}: datasheet {preset} vs tables {path.name} -- held-out steps, median/p90 APE of the kernel sum")
        before = errors(ds, meas, "held-out")
        show("datasheet (committed)", before, keys)
        if args.refit:
            eff, rms = refit(ds, meas)
            after = errors(with_eff(ds, eff), meas, "held-out")
            show("datasheet refitted", after, keys)
            fit_err = errors(with_eff(ds, eff), meas, "fit")
            show("  (refitted, on the fit split)", fit_err, keys)
            print("  per TP, decode:", ", ".join(f"tp{t} {after[f'decode tp{t}']['median_ape']:.1f}/"
                                                 f"{after[f'decode tp{t}']['p90_ape']:.1f}%"
                                                 for t in TPS if f"decode tp{t}" in after))
            print("  per model:", ", ".join(f"{k} {v['median_ape']:.1f}/{v['p90_ape']:.1f}%"
                                            for k, v in after.items() if isinstance(v, dict) and k.count(" ") == 1
                                            and not k.startswith(("decode", "prefill"))))
            print("  kernel fits (RMS log error, points): " + ", ".join(f"{k} {v[0]:.3f} ({v[1]})" for k, v in rms.items()))
            print(f"  efficiency: {{{', '.join(f'{k}: {v:g}' for k, v in eff.items())}}}")
        print(f"  skipped steps (a kernel outside the tables): {before['skipped']}; {time.perf_counter() - t0:.1f} s")
    if args.speed:
        speed(DEVICES["H100"][1])


if __name__ == "__main__":
    main()
