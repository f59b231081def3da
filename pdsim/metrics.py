"""Records -> tables: per-request rows, per-topology summary, per-instance time series.  Pure functions."""
from __future__ import annotations

import math

import numpy as np
import pandas as pd

from .config import Scenario
from .workload import ABANDONED, FINISHED, REJECTED, UNFINISHED

REQUEST_COLUMNS = ["topology", "request_id", "arrival_s", "prompt_tokens", "output_tokens", "status",
                   "first_token_s", "finish_s", "ttft_s", "tpot_s", "e2e_s", "queue_s", "prefill_s",
                   "kv_wait_s", "kv_transfer_s", "decode_queue_s", "preemptions", "recomputed_tokens",
                   "instance", "decode_instance", "reject_reason", "fault_hits"]


def requests_frame(results) -> pd.DataFrame:
    """One row per request per topology (REQUEST_COLUMNS), built column by column with numpy:
    no per-row Python tuples, so a million requests cost arrays, not objects."""
    parts = []
    for res in results:
        rs = res.requests
        n = len(rs)

        def col(attr, dtype=np.float64):
            return np.fromiter((getattr(r, attr) for r in rs), dtype, n)

        def obj(attr):
            return np.array([getattr(r, attr) for r in rs], dtype=object)

        arrival, first, finish = col("arrival_s"), col("first_token_s"), col("finish_s")
        pstart, pend, dstart = col("prefill_start_s"), col("prefill_end_s"), col("decode_start_s")
        kv_wait, kv_xfer = col("kv_wait_s"), col("kv_transfer_s")
        prompt, output = col("prompt_tokens", np.int64), col("output_tokens", np.int64)
        status = obj("status")
        fin = status == FINISHED
        with np.errstate(invalid="ignore", divide="ignore"):
            tpot = np.where(fin & (output > 1), (finish - first) / np.maximum(output - 1, 1), np.nan)
            dq = np.where(np.isnan(dstart), np.nan, dstart - pend - kv_wait - kv_xfer)
        parts.append(pd.DataFrame({
            "topology": np.full(n, res.name, dtype=object), "request_id": col("id", np.int64),
            "arrival_s": arrival, "prompt_tokens": prompt, "output_tokens": output, "status": status,
            "first_token_s": first, "finish_s": finish, "ttft_s": first - arrival, "tpot_s": tpot,
            "e2e_s": np.where(fin, finish - arrival, np.nan), "queue_s": pstart - arrival,
            "prefill_s": pend - pstart, "kv_wait_s": kv_wait, "kv_transfer_s": kv_xfer, "decode_queue_s": dq,
            "preemptions": col("preemptions", np.int64), "recomputed_tokens": col("recomputed_tokens", np.int64),
            "instance": obj("instance"), "decode_instance": obj("decode_instance"),
            "reject_reason": obj("reject_reason"), "fault_hits": col("fault_hits", np.int64)},
            columns=REQUEST_COLUMNS))
    if not parts:
        return pd.DataFrame(columns=REQUEST_COLUMNS)
    return pd.concat(parts, ignore_index=True) if len(parts) > 1 else parts[0]


def _stats(x: pd.Series) -> dict:
    x = x.dropna()
    if len(x) == 0:
        return {"mean": None, "p50": None, "p90": None, "p99": None}
    q = np.percentile(x.to_numpy(), [50, 90, 99])
    return {"mean": float(x.mean()), "p50": float(q[0]), "p90": float(q[1]), "p99": float(q[2])}


def slo_attainment(df: pd.DataFrame, slo) -> float:
    """Share of all arrived requests that finished meeting both the TTFT and the TPOT bound.

    Rejected and unfinished requests count as misses; a one-token reply has no TPOT and
    is judged on TTFT alone.
    """
    if len(df) == 0:
        return float("nan")
    ok = (df.status == FINISHED) & (df.ttft_s <= slo.ttft_s) & (df.tpot_s.isna() | (df.tpot_s <= slo.tpot_s))
    return float(ok.mean())


def timeseries_frame(results) -> pd.DataFrame:
    frames = []
    for res in results:
        for inst in res.topology.instances:
            s = inst.series
            n = len(s.busy_s)
            if n == 0:
                continue
            dev = getattr(inst.cost, "device", None)
            peak = dev.peak_flops(inst.cost.compute_dtype) * inst.gpus if dev else math.nan
            bw = dev.mem_bw_Bps * inst.gpus if dev else math.nan
            steps = np.asarray(s.steps, float)
            frames.append(pd.DataFrame({
                "topology": res.name, "instance": inst.name, "pool": inst.pool,
                "t_s": np.arange(n) * s.bin_s,
                "busy_fraction": np.minimum(1.0, np.asarray(s.busy_s) / s.bin_s),
                "mfu": np.asarray(s.flops) / (s.bin_s * peak),
                "mbu": np.asarray(s.bytes) / (s.bin_s * bw),
                "batch_size": np.divide(s.batch_sum, steps, out=np.zeros(n), where=steps > 0),
                "steps": s.steps,
                "queued_max": s.queue_max,
                "kv_blocks_used_max": s.kv_max,
                "kv_blocks_total": inst.kv.total_blocks,
            }))
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()


def summarize(results, df: pd.DataFrame, sc: Scenario) -> dict:
    out = {}
    for res in results:
        d = df[df.topology == res.name]
        topo = res.topology
        fin = d[d.status == FINISHED]
        span = res.sim_end_s or 1.0
        counts = {"total": len(d), "finished": int((d.status == FINISHED).sum()),
                  "rejected": int((d.status == REJECTED).sum()),
                  "abandoned": int((d.status == ABANDONED).sum()),
                  "unfinished": int((d.status == UNFINISHED).sum())}
        assert counts["total"] == counts["finished"] + counts["rejected"] + counts["abandoned"] + counts["unfinished"]
        rej = d[d.status == REJECTED].reject_reason.str.split(":").str[0]
        gpus = sum(p.gpus for p in topo.pools)
        cost_per_hour = sum(p.gpus * p.price_per_gpu_hour_usd for p in topo.pools)
        out_tokens = float(fin.output_tokens.sum())
        pools = {}
        for p in topo.pools:
            busy = sum(i.busy_s for i in p.instances)
            flops = sum(i.flops for i in p.instances)
            bytes_ = sum(i.bytes for i in p.instances)
            dev = getattr(p.cost, "device", None)
            pools[p.name] = {
                "instances": len(p.instances), "tp": p.spec.tp, "gpus": p.gpus,
                "device": p.spec.device, "device_source": dev.source if dev else "n/a (constant/linear cost model)",
                "busy_fraction": busy / (span * len(p.instances)),
                "mfu": flops / (span * dev.peak_flops(p.cost.compute_dtype) * p.gpus) if dev else None,
                "mbu": bytes_ / (span * dev.mem_bw_Bps * p.gpus) if dev else None,
                "kv_peak_bytes": max(i.kv.peak_used for i in p.instances) * p.block_bytes,
                "kv_capacity_bytes": p.instances[0].kv.total_blocks * p.block_bytes,
                "weights_bytes_per_gpu": p.cost.weight_bytes_per_gpu() if dev else None,
                "price_per_gpu_hour_usd": p.price_per_gpu_hour_usd,
            }
        links = [{"name": l.name, "transfers": l.transfers, "bytes": l.bytes,
                  "busy_fraction": l.busy_s / span} for l in topo.links]
        out[res.name] = {
            "kind": topo.kind,
            "ttft_s": _stats(d.ttft_s[d.status != REJECTED]), "tpot_s": _stats(fin.tpot_s),
            "e2e_s": _stats(fin.e2e_s), "queue_s": _stats(d.queue_s),
            "kv_transfer_s": _stats(fin.kv_transfer_s) if topo.kind == "disaggregated" else None,
            "requests": counts,
            "throughput": {"requests_per_s": len(fin) / span, "output_tokens_per_s": out_tokens / span,
                           "output_tokens_per_s_per_gpu": out_tokens / span / gpus},
            "slo_attainment": slo_attainment(d, sc.slo),
            "slo_met": slo_attainment(d, sc.slo) >= sc.slo.attainment_target,
            "gpus": gpus,
            "cost_per_hour_usd": cost_per_hour,
            "cost_per_million_output_tokens_usd": (cost_per_hour / 3600 * span / out_tokens * 1e6
                                                   if out_tokens else None),
            "utilization": {name: {k: v for k, v in p.items() if k in ("busy_fraction", "mfu", "mbu")}
                            for name, p in pools.items()},
            "kv_cache": {"peak_bytes": sum(p["kv_peak_bytes"] * p["instances"] for p in pools.values()),
                         "capacity_bytes": sum(p["kv_capacity_bytes"] * p["instances"] for p in pools.values())},
            "pools": pools,
            "links": links,
            "preemptions": int(d.preemptions.sum()),
            "rejected_by_reason": {k: int(v) for k, v in rej.value_counts().items()},
            "sim_end_s": res.sim_end_s,
            "faults": fault_summary(topo, d, sc.slo, res.sim_end_s) if getattr(topo, "fault_log", None) else None,
        }
        if any(p.spec.prefix_on for p in topo.pools):
            out[res.name]["prefix_cache"] = prefix_summary(res)
    return out


def _rate(num: float, den: float):
    return num / den if den else None


def prefix_summary(res) -> dict:
    """Prefix-cache figures of one topology: hit rates per instance and tier (hit tokens / prompt
    tokens of the admissions looked up there), prompt tokens not computed, the prefill FLOPs they
    would have cost (each request's prompt alone vs its uncached suffix over the cached context,
    under its instance's cost model; None for cost models without FLOPs), and KV-transfer bytes
    not sent because the decode instance held the prefix already."""
    topo = res.topology
    per_instance = {}
    tot = {"lookup_tokens": 0, "gpu_hit_tokens": 0, "host_hit_tokens": 0}
    for inst in topo.instances:
        if not inst.kv.prefix_on:
            continue
        st = inst.kv.stats
        per_instance[inst.name] = {
            "admissions": st.admissions, "lookup_tokens": st.lookup_tokens,
            "gpu_hit_tokens": st.gpu_hit_tokens, "host_hit_tokens": st.host_hit_tokens,
            "hit_rate": _rate(st.gpu_hit_tokens + st.host_hit_tokens, st.lookup_tokens),
            "gpu_hit_rate": _rate(st.gpu_hit_tokens, st.lookup_tokens),
            "host_hit_rate": _rate(st.host_hit_tokens, st.lookup_tokens),
            "evicted_blocks": st.evicted_blocks, "host_evicted_blocks": st.host_evicted_blocks,
            "host_load_bytes": st.host_load_bytes, "transfer_hit_tokens": st.transfer_hit_tokens,
            "cached_blocks_at_end": inst.kv.cached_blocks}
        for k in tot:
            tot[k] += getattr(st, k)
    costs = {i.name: i.cost for i in topo.instances}
    flops_saved, has_flops = 0.0, True
    for r in res.requests:
        h = r.cached_tokens
        if not h:
            continue
        cost = costs.get(r.instance)
        if cost is None:
            continue
        p, n = r.prompt_tokens, r.prompt_tokens - h
        full = cost.step(p, p * p / 2.0, p, 1, 1).flops
        if full == 0.0:
            has_flops = False
            break
        flops_saved += full - cost.step(n, n * (h + n / 2.0), p, 1, 1).flops
    return {
        "hit_rate": _rate(tot["gpu_hit_tokens"] + tot["host_hit_tokens"], tot["lookup_tokens"]),
        "gpu_hit_rate": _rate(tot["gpu_hit_tokens"], tot["lookup_tokens"]),
        "host_hit_rate": _rate(tot["host_hit_tokens"], tot["lookup_tokens"]),
        "prompt_tokens_looked_up": tot["lookup_tokens"],
        "tokens_saved": tot["gpu_hit_tokens"] + tot["host_hit_tokens"],
        "prefill_flops_saved": flops_saved if has_flops else None,
        "transfer_bytes_saved": getattr(topo, "transfer_bytes_saved", 0.0),
        "instances": per_instance,
    }


def fault_summary(topo, d: pd.DataFrame, slo, end_s: float, window_s: float = 30.0) -> dict:
    """What the faults cost: requests hit, extra latency, attainment inside vs outside the fault
    windows (by arrival time), recomputed tokens, and the time to get back to steady state
    (the first moment after a fault ends from which the median TTFT of the next ``window_s``
    of arrivals is within 25% of the median TTFT of arrivals outside every fault window)."""
    from .faults import fault_windows
    wins = fault_windows(topo)
    arr = d.arrival_s.to_numpy()
    inside = np.zeros(len(d), bool)
    for a, b in wins:
        inside |= (arr >= a) & (arr < b)
    hit = d.fault_hits.to_numpy() > 0
    fin = (d.status == FINISHED).to_numpy()
    e2e = d.e2e_s.to_numpy()

    def mean(mask):
        m = mask & fin
        return float(np.nanmean(e2e[m])) if m.any() else None

    base_ttft = float(d.ttft_s[~inside].median()) if (~inside).any() else None
    recover = []
    for a, b in wins:
        t, got = b, None
        if base_ttft is not None and base_ttft == base_ttft:
            last = float(np.nanmax(arr)) if len(arr) else b
            while t <= last:
                m = (arr >= t) & (arr < t + window_s)
                if m.any() and float(np.nanmedian(d.ttft_s.to_numpy()[m])) <= 1.25 * base_ttft:
                    got = t - b
                    break
                t += window_s / 6
        recover.append({"fault_start_s": a, "fault_end_s": b, "time_to_recover_s": got})
    return {
        "events": topo.fault_log,
        "requests_affected": int(hit.sum()),
        "recomputed_tokens": int(d.recomputed_tokens.sum()),
        "extra_e2e_s_affected": (mean(hit) - mean(~hit)) if mean(hit) is not None and mean(~hit) is not None
        else None,
        "slo_attainment_inside_fault_windows": slo_attainment(d[inside], slo) if inside.any() else None,
        "slo_attainment_outside_fault_windows": slo_attainment(d[~inside], slo) if (~inside).any() else None,
        "requests_arriving_in_fault_windows": int(inside.sum()),
        "recovery": recover,
        # an outage still running at the end of the run counts up to the end
        "instance_down_s": {i.name: i.down_s + (max(0.0, end_s - i.down_since) if i.down else 0.0)
                            for i in topo.instances if i.down_s or i.down},
    }
